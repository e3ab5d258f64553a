//! Allocate: create the macvtap of each requested device and hand the pod
//! its `/dev/tapN`.
//!
//! These are plain blocking functions (netlink requests and a sysfs read in
//! a helper thread); the gRPC service runs them with `spawn_blocking`.

use crate::config::ResourceConfig;
use crate::devices::device_index;
use crate::error::{Error, Result};
use kubelet_proto::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, DeviceSpec,
};
use macvtap_link::tapdev::{parse_major_minor, tap_dev_in_netns, tap_node_path, wait_for_tap_node};
use macvtap_link::{Handle, Link, Netns, link_name_for_device};
use nix::errno::Errno;
use std::path::Path;
use tracing::{info, warn};

/// Where the kernel's tap nodes live, on the host and in the container.
pub const DEV_DIR: &str = "/dev";

/// Where sysfs is mounted; in the daemon's mount namespace it shows the
/// daemon's network namespace (the host's, or the node namespace of a test).
const SYSFS: &str = "/sys";

/// How many 10 ms tries to give devtmpfs to create `/dev/tapN`.
const TAP_NODE_TRIES: u32 = 200;

/// Checks that every ID of the request belongs to `cfg`, before anything is
/// created, so that a bad request changes nothing.
pub fn check_request(req: &AllocateRequest, cfg: &ResourceConfig) -> Result<()> {
    for c in &req.container_requests {
        for id in &c.devices_ids {
            if device_index(&cfg.name, cfg.capacity, id).is_none() {
                return Err(Error::UnknownDevice {
                    device_id: id.clone(),
                    resource: cfg.resource_name(),
                    capacity: cfg.capacity,
                });
            }
        }
    }
    Ok(())
}

/// Serves an `AllocateRequest` in the calling thread's network namespace:
/// (re)creates each device's macvtap on the lower NIC and answers with its
/// tap node. On any failure every link made for this request is deleted.
pub fn allocate(req: &AllocateRequest, cfg: &ResourceConfig) -> Result<AllocateResponse> {
    check_request(req, cfg)?;
    NETLINK.with(|cell| {
        let (handle, netns) = match cell.borrow_mut().take() {
            Some(cached) => cached,
            None => (Handle::current()?, Netns::current()?),
        };
        let result = allocate_with(req, cfg, &handle, &netns);
        // A socket that saw an error is not reused.
        if result.is_ok() {
            *cell.borrow_mut() = Some((handle, netns));
        }
        result
    })
}

thread_local! {
    /// The blocking pool's threads keep their netlink socket between
    /// Allocates (the daemon never leaves the host namespace), saving a
    /// socket set-up per request.
    static NETLINK: std::cell::RefCell<Option<(Handle, Netns)>> = const { std::cell::RefCell::new(None) };
}

fn allocate_with(
    req: &AllocateRequest,
    cfg: &ResourceConfig,
    handle: &Handle,
    netns: &Netns,
) -> Result<AllocateResponse> {
    let lower = handle
        .get_link(&cfg.lower_device)?
        .ok_or_else(|| Error::LowerDeviceMissing {
            resource: cfg.resource_name(),
            lower: cfg.lower_device.clone(),
        })?;
    let mut created: Vec<Link> = Vec::new();
    let mut out = AllocateResponse::default();
    for c in &req.container_requests {
        let mut resp = ContainerAllocateResponse::default();
        for id in &c.devices_ids {
            match create_device(handle, netns, cfg, &lower, id, Path::new(DEV_DIR)) {
                Ok((link, spec)) => {
                    created.push(link);
                    resp.devices.push(spec);
                }
                Err(e) => {
                    for l in &created {
                        delete_quietly(handle, l);
                    }
                    return Err(e);
                }
            }
        }
        out.container_responses.push(resp);
    }
    Ok(out)
}

/// Creates the macvtap for device `id` and checks its tap node. Any link of
/// the same name is replaced (the kubelet retries Allocate); if a check
/// fails after creation the new link is deleted again.
pub fn create_device(
    handle: &Handle,
    netns: &Netns,
    cfg: &ResourceConfig,
    lower: &Link,
    id: &str,
    dev_dir: &Path,
) -> Result<(Link, DeviceSpec)> {
    let name = link_name_for_device(id);
    let wrap = |source| Error::Device {
        device_id: id.to_string(),
        link: name.clone(),
        source,
    };
    if let Some(old) = handle.get_link(&name).map_err(wrap)? {
        info!(device_id = id, ifname = %name, "replacing an existing link for a repeated Allocate");
        match handle.del_link(old.index, &name) {
            Err(e) if e.errno() != Some(Errno::ENODEV) => return Err(wrap(e)),
            _ => {}
        }
    }
    let link = handle
        .add_macvtap(&name, lower.index, cfg.mode, Some(lower.txqueuelen))
        .map_err(wrap)?;
    let node = tap_node_path(dev_dir, link.index);
    let checked = tap_dev(netns, &name, link.index, Path::new(SYSFS))
        .and_then(|dev| wait_for_tap_node(&node, dev, TAP_NODE_TRIES));
    if let Err(e) = checked {
        delete_quietly(handle, &link);
        return Err(wrap(e));
    }
    let path = node.to_string_lossy().into_owned();
    info!(
        device_id = id,
        ifname = %name,
        lower = %lower.name,
        mode = %cfg.mode,
        tap = %path,
        "created macvtap"
    );
    Ok((
        link,
        DeviceSpec {
            container_path: path.clone(),
            host_path: path,
            permissions: "rw".into(),
        },
    ))
}

/// `major:minor` of macvtap `name`'s char device. Read from `sysfs` when it
/// shows this link (same name and ifindex there), which is the common case
/// and needs no helper thread; otherwise from a fresh sysfs inside `netns`.
/// (The fresh mount cannot be used when `sysfs` already shows `netns`: the
/// kernel refuses to mount the same sysfs on `/sys` twice, with `EBUSY`.)
pub fn tap_dev(
    netns: &Netns,
    name: &str,
    ifindex: u32,
    sysfs: &Path,
) -> macvtap_link::Result<(u64, u64)> {
    match tap_dev_from_sysfs(sysfs, name, ifindex) {
        Some(dev) => Ok(dev),
        None => tap_dev_in_netns(netns, name),
    }
}

fn tap_dev_from_sysfs(sysfs: &Path, name: &str, ifindex: u32) -> Option<(u64, u64)> {
    let dir = sysfs.join("class/net").join(name);
    let index: u32 = std::fs::read_to_string(dir.join("ifindex"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    if index != ifindex {
        return None;
    }
    let text = std::fs::read_to_string(
        dir.join("macvtap")
            .join(format!("tap{ifindex}"))
            .join("dev"),
    )
    .ok()?;
    parse_major_minor(text.trim())
}

fn delete_quietly(handle: &Handle, link: &Link) {
    match handle.del_link(link.index, &link.name) {
        Ok(()) => info!(ifname = %link.name, "deleted the link of a failed Allocate"),
        Err(e) if e.errno() == Some(Errno::ENODEV) => {}
        Err(e) => {
            warn!(ifname = %link.name, error = %e, "could not delete the link of a failed Allocate")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_proto::v1beta1::ContainerAllocateRequest;

    #[test]
    fn unknown_ids_are_invalid_arguments() {
        let cfg = ResourceConfig {
            capacity: 2,
            ..ResourceConfig::for_nic("eth0")
        };
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["eth0Mvp1".into(), "eth0Mvp2".into()],
            }],
        };
        let e = check_request(&req, &cfg).unwrap_err();
        assert_eq!(e.grpc_code(), tonic::Code::InvalidArgument);
        assert!(e.to_string().contains("\"eth0Mvp2\""), "{e}");
        let e = allocate(&req, &cfg).unwrap_err();
        assert_eq!(e.grpc_code(), tonic::Code::InvalidArgument);
    }
}
