//! Allocate: create the macvtap of each requested device and hand the pod
//! its `/dev/tapN`.
//!
//! These are plain blocking functions (netlink requests and a sysfs read in
//! a helper thread) on one [`Host`], the daemon's namespace on the real
//! kernel or the fake one of the unit tests; the gRPC service runs them
//! with `spawn_blocking`.

use crate::config::ResourceConfig;
use crate::error::{Error, Result};
use crate::heal::Assignments;
use crate::health::port_in_the_way;
use crate::host::Host;
use crate::master::{Owner, receive_path_owner};
use crate::port::PortInTheWay;
use crate::reclaim::AllocationClock;
use kubelet_proto::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, DeviceSpec,
};
use macvtap_link::tapdev::{parse_major_minor, tap_node_path};
use macvtap_link::{Link, Links, Linux, MacvtapMode, device_index, link_name_for_device};
use nix::errno::Errno;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Where the kernel's tap nodes live, on the host and in the container.
pub const DEV_DIR: &str = "/dev";

/// Where sysfs is mounted; in the daemon's mount namespace it shows the
/// daemon's network namespace (the host's, or the node namespace of a test).
const SYSFS: &str = "/sys";

/// How long devtmpfs gets to create `/dev/tapN` after the macvtap appears.
const TAP_NODE_WAIT: Duration = Duration::from_secs(2);

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
    // The spare is the host namespace's; a thread elsewhere (only in
    // tests: the daemon never leaves it) opens its own.
    let spare = SPARE_HOST
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take_if(|h| h.netns().is_current());
    let host = match spare {
        Some(host) => host,
        None => Host::current(&Linux)?,
    };
    let result = allocate_on(&host, req, cfg);
    // A socket that saw an error is not reused; of two Allocates at once,
    // the second to finish closes its own.
    if result.is_ok() {
        SPARE_HOST
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(host);
    }
    result
}

/// The host handle (the namespace's descriptor and a netlink socket) that
/// Allocates share, saving a socket set-up per request (the daemon never
/// leaves the host namespace). One, whatever thread of the blocking pool
/// serves the next Allocate: a handle per thread would hold a pair of
/// descriptors for every thread the pool ever ran an Allocate on.
static SPARE_HOST: std::sync::Mutex<Option<Host<'static>>> = std::sync::Mutex::new(None);

/// An Allocate as the plugin server serves it, on `host` (the real
/// kernel's through [`allocate`] when `None`): the devices' leak clocks
/// restarted before their links are touched and once they are ready, the
/// links made or reused, and what was handed out recorded for healing
/// before the answer leaves.
pub fn serve(
    host: Option<&Host>,
    req: &AllocateRequest,
    cfg: &ResourceConfig,
    clock: &AllocationClock,
    assignments: &Assignments,
) -> Result<AllocateResponse> {
    let ids: Vec<String> = req
        .container_requests
        .iter()
        .flat_map(|c| c.devices_ids.iter().cloned())
        .collect();
    let links: Vec<String> = ids.iter().map(|id| link_name_for_device(id)).collect();
    for l in &links {
        clock.allocated(l, Instant::now());
    }
    let resp = match host {
        Some(host) => {
            check_request(req, cfg)?;
            allocate_on(host, req, cfg)
        }
        None => allocate(req, cfg),
    }?;
    assignments.handed_out(&cfg.name, &ids, &resp);
    for l in &links {
        clock.allocated(l, Instant::now());
    }
    Ok(resp)
}

/// [`allocate`] on `host` (the real kernel's in the daemon, the fake's in
/// unit tests), after [`check_request`].
fn allocate_on(
    host: &Host,
    req: &AllocateRequest,
    cfg: &ResourceConfig,
) -> Result<AllocateResponse> {
    let handle = host.links();
    let lower = handle
        .get_link(&cfg.lower_device)?
        .ok_or_else(|| Error::LowerDeviceMissing {
            resource: cfg.resource_name(),
            lower: cfg.lower_device.clone(),
        })?;
    // A NIC that a bridge, bond or OVS owns cannot carry a macvtap: say so
    // and name the fix, rather than the kernel's bare EBUSY.
    if let Some(owner) = owner_of(handle, &lower)? {
        return Err(Error::LowerDeviceEnslaved {
            resource: cfg.resource_name(),
            owner,
        });
    }
    // A passthru macvtap must be alone on its NIC: name the port in the way
    // rather than the kernel's bare EINVAL. One link dump, read now as the
    // master above is, and only in passthru mode (whose resource has one
    // device); other modes look only when the kernel refuses.
    if cfg.mode == MacvtapMode::Passthru {
        if let Some(port) = port_in_the_way(cfg, &handle.list_links()?) {
            return Err(Error::PortInTheWay {
                resource: cfg.resource_name(),
                port,
            });
        }
    }
    let mut created: Vec<Link> = Vec::new();
    let mut out = AllocateResponse::default();
    for c in &req.container_requests {
        let mut resp = ContainerAllocateResponse::default();
        for id in &c.devices_ids {
            match create_device(host, cfg, &lower, id, Path::new(DEV_DIR)) {
                Ok(made) => {
                    if made.created {
                        created.push(made.link);
                    }
                    resp.devices.push(made.spec);
                }
                Err(e) => {
                    // Only links made by this request go; a reused link may
                    // already be in a container's hands.
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

/// Wraps a kernel error about device `id`'s link `name`.
fn device_error<'a>(
    id: &'a str,
    name: &'a str,
) -> impl Fn(macvtap_link::Error) -> Error + Copy + 'a {
    move |source| Error::Device {
        device_id: id.to_string(),
        link: name.to_string(),
        source,
    }
}

/// What [`recreate_device`] came to.
#[derive(Debug)]
pub enum Recreated {
    /// The link is back, its tap node checked.
    Made(Link),
    /// `/dev/tap<index>` is another macvtap's (the device's own, in a pod's
    /// namespace by now): the link made was deleted again.
    NodeElsewhere,
}

/// Re-creates the lost macvtap of device `id` on `lower` with ifindex
/// `index`, the one whose `/dev/tap<index>` the kubelet keeps handing to the
/// device's pod, and checks that node. Deletes what it made on failure, and
/// at once when the node is another macvtap's: devtmpfs makes a node only
/// for the first of two macvtaps that share an ifindex in different
/// namespaces, so the new link would never get one.
pub fn recreate_device(
    host: &Host,
    cfg: &ResourceConfig,
    lower: &Link,
    id: &str,
    index: u32,
    dev_dir: &Path,
) -> Result<Recreated> {
    let name = link_name_for_device(id);
    let wrap = device_error(id, &name);
    let link = host
        .links()
        .add_macvtap_at(
            &name,
            lower.index,
            cfg.mode,
            Some(lower.txqueuelen),
            Some(index),
        )
        .map_err(wrap)?;
    // devtmpfs made (or did not make) the node before the create returned.
    let node = tap_node_path(dev_dir, link.index);
    if let Ok(Some(found)) = host.kernel().tap_node(&node) {
        let ours = host
            .kernel()
            .tap_device(host.netns(), &name)
            .map_err(wrap)?;
        if found != ours {
            delete_quietly(host.links(), &link);
            return Ok(Recreated::NodeElsewhere);
        }
    }
    checked_or_deleted(host, id, &link, dev_dir)?;
    Ok(Recreated::Made(link))
}

/// Checks the tap node of `link`, just made for device `id`, and returns its
/// path; deletes the link when the check fails.
fn checked_or_deleted(host: &Host, id: &str, link: &Link, dev_dir: &Path) -> Result<PathBuf> {
    let node = tap_node_path(dev_dir, link.index);
    match check_node(host, &link.name, link.index, &node, dev_dir) {
        Ok(()) => Ok(node),
        Err(e) => {
            delete_quietly(host.links(), link);
            Err(e.for_device(id, &link.name))
        }
    }
}

/// The macvtap of one device, ready to hand out.
#[derive(Debug, Clone)]
pub struct PreparedDevice {
    /// The link in the host namespace.
    pub link: Link,
    /// What the kubelet passes to the container.
    pub spec: DeviceSpec,
    /// Whether this call created the link (false: an existing one was reused).
    pub created: bool,
}

/// Why an existing link of a device cannot be reused, or `None` if it is a
/// macvtap on `lower` in `mode` and can be.
pub fn unusable_reason(link: &Link, lower: &Link, mode: MacvtapMode) -> Option<String> {
    if !link.is_macvtap() {
        return Some(format!(
            "it is a {} link, not a macvtap",
            link.kind.as_deref().unwrap_or("plain")
        ));
    }
    if link.lower_in_other_netns || link.lower_index != Some(lower.index) {
        return Some(format!("its lower device is not {}", lower.name));
    }
    if link.macvtap_mode != Some(mode) {
        return Some(format!(
            "its mode is {}, not {mode}",
            link.macvtap_mode.map_or("unknown", |m| m.as_str())
        ));
    }
    None
}

/// Makes sure the macvtap for device `id` exists and checks its tap node.
///
/// Allocate is idempotent per device: the kubelet allocates an init
/// container's devices again for the app container, and may repeat an
/// Allocate around restarts, while the first container already holds
/// `/dev/tapN`. So a link of the device's name that is a macvtap on `lower`
/// in the configured mode is reused and answered with its current tap node;
/// only a missing or wrong link is (re)created. If the node check fails
/// after creating a link, that link is deleted again.
///
/// A new device is the common case, so the macvtap is created first (one
/// round trip, the kernel echoing the new link); only when the kernel
/// answers that the name is taken (`EEXIST`) is the existing link read and
/// reused or replaced.
pub fn create_device(
    host: &Host,
    cfg: &ResourceConfig,
    lower: &Link,
    id: &str,
    dev_dir: &Path,
) -> Result<PreparedDevice> {
    let handle = host.links();
    let name = link_name_for_device(id);
    let wrap = device_error(id, &name);
    // The kernel's EINVAL to a second port beside a passthru one names it.
    let refused = |e: macvtap_link::Error| match e.errno() {
        Some(Errno::EINVAL) => {
            port_refusal(handle, cfg, lower, e.errno()).unwrap_or_else(|| wrap(e))
        }
        _ => wrap(e),
    };
    let link = match add_macvtap(handle, cfg, lower, &name).map_err(refused)? {
        Added::Made(link) => link,
        Added::Busy => return Err(busy_lower(handle, cfg, lower)),
        Added::NameTaken => {
            if let Some(reused) = reuse_or_remove(host, cfg, lower, id, &name, dev_dir)? {
                return Ok(reused);
            }
            match add_macvtap(handle, cfg, lower, &name).map_err(refused)? {
                Added::Made(link) => link,
                Added::Busy => return Err(busy_lower(handle, cfg, lower)),
                // Made again by someone else meanwhile: the kernel's word.
                Added::NameTaken => {
                    return Err(wrap(macvtap_link::Error::Netlink {
                        op: macvtap_link::Op::AddMacvtap,
                        what: format!(
                            "creating {} macvtap {name} in {}",
                            cfg.mode,
                            handle.netns().display()
                        ),
                        source: Errno::EEXIST,
                    }));
                }
            }
        }
    };
    let node = checked_or_deleted(host, id, &link, dev_dir)?;
    let path = node.to_string_lossy().into_owned();
    info!(
        device_id = id,
        ifname = %name,
        lower = %lower.name,
        mode = %cfg.mode,
        tap = %path,
        "created macvtap"
    );
    Ok(PreparedDevice {
        link,
        spec: device_spec(path),
        created: true,
    })
}

/// What creating a device's macvtap came to.
enum Added {
    /// The kernel made it.
    Made(Link),
    /// A link of that name exists (`EEXIST`).
    NameTaken,
    /// The NIC cannot carry it (`EBUSY`).
    Busy,
}

/// Creates macvtap `name` on `lower` in the configured mode, with the NIC's
/// transmit queue length.
fn add_macvtap(
    handle: &dyn Links,
    cfg: &ResourceConfig,
    lower: &Link,
    name: &str,
) -> macvtap_link::Result<Added> {
    match handle.add_macvtap_at(name, lower.index, cfg.mode, Some(lower.txqueuelen), None) {
        Ok(link) => Ok(Added::Made(link)),
        Err(e) if e.errno() == Some(Errno::EEXIST) => Ok(Added::NameTaken),
        Err(e) if e.errno() == Some(Errno::EBUSY) => Ok(Added::Busy),
        Err(e) => Err(e),
    }
}

/// The existing link `name` of device `id`: reused (its tap node checked)
/// when it is a macvtap on `lower` in the configured mode, else deleted so
/// it can be made anew (`None`, also when it is gone by now).
fn reuse_or_remove(
    host: &Host,
    cfg: &ResourceConfig,
    lower: &Link,
    id: &str,
    name: &str,
    dev_dir: &Path,
) -> Result<Option<PreparedDevice>> {
    let handle = host.links();
    let wrap = device_error(id, name);
    let Some(old) = handle.get_link(name).map_err(wrap)? else {
        return Ok(None);
    };
    match unusable_reason(&old, lower, cfg.mode) {
        None => {
            let node = tap_node_path(dev_dir, old.index);
            check_node(host, name, old.index, &node, dev_dir)
                .map_err(|e| e.for_device(id, name))?;
            let path = node.to_string_lossy().into_owned();
            info!(device_id = id, ifname = %name, tap = %path, "reusing the device's existing macvtap");
            Ok(Some(PreparedDevice {
                link: old,
                spec: device_spec(path),
                created: false,
            }))
        }
        Some(why) => {
            info!(device_id = id, ifname = %name, reason = %why, "replacing the device's existing link");
            match handle.del_link(old.index, name) {
                Err(e) if e.errno() != Some(Errno::ENODEV) => Err(wrap(e)),
                _ => Ok(None),
            }
        }
    }
}

/// The master that owns `lower`'s receive path, read from the kernel now.
fn owner_of(handle: &dyn Links, lower: &Link) -> Result<Option<Owner>> {
    let Some(index) = lower.master else {
        return Ok(None);
    };
    let master: Vec<Link> = handle.get_link_by_index(index)?.into_iter().collect();
    Ok(receive_path_owner(lower, &master))
}

/// The refusal for a macvtap the kernel refused with `errno` (`EINVAL` or
/// `EBUSY`) because of another port on the NIC, which appeared since the
/// check or sits in a pod's namespace: the port that is in the way when the
/// node's namespace shows one, else for `EINVAL` the same sentence without
/// its name (on a NIC that can carry a macvtap, a port beside a passthru
/// one is the kernel's only reason for `EINVAL` on this request). `None`
/// when no port explains the refusal.
fn port_refusal(
    handle: &dyn Links,
    cfg: &ResourceConfig,
    lower: &Link,
    errno: Option<Errno>,
) -> Option<Error> {
    let port = match handle.list_links() {
        Ok(links) => port_in_the_way(cfg, &links),
        Err(_) => None,
    };
    let port = port.or_else(|| {
        (errno == Some(Errno::EINVAL)).then(|| PortInTheWay {
            lower: lower.name.clone(),
            link: None,
            ours_passthru: cfg.mode == MacvtapMode::Passthru,
        })
    })?;
    Some(Error::PortInTheWay {
        resource: cfg.resource_name(),
        port,
    })
}

/// The error for a macvtap the kernel refused with `EBUSY`: the NIC's
/// master when it has one by now (it may have been enslaved since the
/// check), else a port in the way of the mode, else the busy NIC.
fn busy_lower(handle: &dyn Links, cfg: &ResourceConfig, lower: &Link) -> Error {
    let owner = match handle.get_link(&lower.name) {
        Ok(Some(now)) => owner_of(handle, &now).ok().flatten(),
        _ => None,
    };
    if let Some(refusal) = owner
        .is_none()
        .then(|| port_refusal(handle, cfg, lower, Some(Errno::EBUSY)))
        .flatten()
    {
        return refusal;
    }
    match owner {
        Some(owner) => Error::LowerDeviceEnslaved {
            resource: cfg.resource_name(),
            owner,
        },
        None => Error::LowerDeviceBusy {
            resource: cfg.resource_name(),
            lower: lower.name.clone(),
        },
    }
}

fn device_spec(path: String) -> DeviceSpec {
    DeviceSpec {
        container_path: path.clone(),
        host_path: path,
        permissions: "rw".into(),
    }
}

/// A failed tap node check, before it is tied to a device.
enum NodeError {
    Link(macvtap_link::Error),
    /// The node never appeared, and `cause` says why.
    Missing {
        node: PathBuf,
        cause: String,
    },
}

impl NodeError {
    fn for_device(self, id: &str, name: &str) -> Error {
        match self {
            NodeError::Link(source) => device_error(id, name)(source),
            NodeError::Missing { node, cause } => Error::TapNodeMissing {
                device_id: id.to_string(),
                link: name.to_string(),
                node,
                cause,
            },
        }
    }
}

/// Waits for the link's tap node to be its char device. When it never
/// appears and `dev_dir` is not devtmpfs, the error says so.
fn check_node(
    host: &Host,
    name: &str,
    ifindex: u32,
    node: &Path,
    dev_dir: &Path,
) -> std::result::Result<(), NodeError> {
    let dev = match tap_dev_from_sysfs(Path::new(SYSFS), name, ifindex) {
        Some(dev) => dev,
        None => host
            .kernel()
            .tap_device(host.netns(), name)
            .map_err(NodeError::Link)?,
    };
    match host.kernel().open_tap_node(node, dev, TAP_NODE_WAIT) {
        Ok(_) => Ok(()),
        Err(e) if node.symlink_metadata().is_err() => {
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            match missing_tap_node_cause(dev_dir, &mountinfo) {
                Some(cause) => Err(NodeError::Missing {
                    node: node.to_path_buf(),
                    cause,
                }),
                None => Err(NodeError::Link(e)),
            }
        }
        Err(e) => Err(NodeError::Link(e)),
    }
}

/// Why tap nodes cannot appear in `dev_dir`, judged from `mountinfo` (the
/// text of `/proc/self/mountinfo`): the kernel creates `/dev/tapN` only on
/// devtmpfs, and a kind node's `/dev` is a plain tmpfs unless the host's
/// `/dev` is mounted into it (kubevirt/macvtap-cni#39). `None` when
/// `dev_dir` is devtmpfs or its mount cannot be told.
pub fn missing_tap_node_cause(dev_dir: &Path, mountinfo: &str) -> Option<String> {
    let dir = dev_dir
        .canonicalize()
        .unwrap_or_else(|_| dev_dir.to_path_buf());
    let fstype = mount_fstype(mountinfo, &dir)?;
    if fstype == "devtmpfs" {
        return None;
    }
    Some(format!(
        "{} is a {fstype} mount, not devtmpfs, so the kernel never creates tap nodes in it; \
         mount the host's /dev (devtmpfs) there, as a kind node needs (kubevirt/macvtap-cni#39)",
        dev_dir.display()
    ))
}

/// The file system type of the mount that holds `path` (the mount point
/// that is the longest prefix of it), from mountinfo text.
fn mount_fstype(mountinfo: &str, path: &Path) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(point) = left.split_whitespace().nth(4) else {
            continue;
        };
        let point = unescape_mountinfo(point);
        let Some(fstype) = right.split_whitespace().next() else {
            continue;
        };
        if path.starts_with(&point) {
            let depth = Path::new(&point).components().count();
            // Later lines of the same mount point are mounts on top.
            if best.as_ref().is_none_or(|(d, _)| depth >= *d) {
                best = Some((depth, fstype.to_string()));
            }
        }
    }
    best.map(|(_, t)| t)
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `major:minor` of macvtap `name`'s char device from `sysfs`, when it shows
/// this link (same name and ifindex there): the common case, which needs no
/// helper thread. One read does both: the kernel names a macvtap's char
/// device `tap<ifindex>` under its link, so
/// `class/net/<name>/macvtap/tap<ifindex>/dev` exists only when sysfs shows
/// a link of this name with this ifindex. (A fresh sysfs mount cannot be
/// used when `sysfs` already shows the namespace: the kernel refuses to
/// mount the same sysfs on `/sys` twice, with `EBUSY`.)
fn tap_dev_from_sysfs(sysfs: &Path, name: &str, ifindex: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(tap_dev_file(sysfs, name, ifindex)).ok()?;
    parse_major_minor(text.trim())
}

/// Where sysfs shows the char device of macvtap `name` with `ifindex`.
fn tap_dev_file(sysfs: &Path, name: &str, ifindex: u32) -> PathBuf {
    sysfs
        .join("class/net")
        .join(name)
        .join("macvtap")
        .join(format!("tap{ifindex}"))
        .join("dev")
}

fn delete_quietly(handle: &dyn Links, link: &Link) {
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

    /// Issue 37's first failure: the soak's daemon held two descriptors
    /// more (its namespace and a netlink socket) for every thread of the
    /// blocking pool that had served an Allocate. Allocates on many threads
    /// in one namespace (as the daemon's, the host's) now keep one handle.
    #[test]
    fn allocates_on_many_threads_keep_one_host_handle_between_them() {
        use std::os::fd::AsFd;
        use std::os::unix::fs::MetadataExt;
        use std::sync::{Arc, Barrier};
        use test_support::netns::{TestNs, require_root};
        require_root().unwrap();
        let _lock = test_support::tapnode::tap_node_lock().unwrap();
        let ns = TestNs::new("spare").unwrap();
        ns.add_nic("lower0").unwrap();
        let netns = ns.netns().unwrap();
        let id = |m: std::fs::Metadata| (m.dev(), m.ino());
        let target = id(std::fs::metadata(ns.path()).unwrap());
        // Descriptors of this process on the test's namespace.
        let held = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| std::fs::metadata(e.ok()?.path()).ok())
                .filter(|m| id(m.clone()) == target)
                .count()
        };
        let before = held();
        const THREADS: usize = 4;
        let cfg = ResourceConfig {
            capacity: THREADS as u32,
            ..ResourceConfig::for_nic("lower0")
        };
        let (allocated, done) = (
            Arc::new(Barrier::new(THREADS + 1)),
            Arc::new(Barrier::new(THREADS + 1)),
        );
        let threads: Vec<_> = (0..THREADS)
            .map(|i| {
                let fd = netns.as_fd().try_clone_to_owned().unwrap();
                let (cfg, allocated, done) = (cfg.clone(), allocated.clone(), done.clone());
                std::thread::spawn(move || {
                    nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                    let req = AllocateRequest {
                        container_requests: vec![ContainerAllocateRequest {
                            devices_ids: vec![format!("lower0Mvp{i}")],
                        }],
                    };
                    let got = allocate(&req, &cfg);
                    // Alive until counted: a thread's own handle would
                    // live as long as the thread.
                    allocated.wait();
                    done.wait();
                    got.map(|_| ())
                })
            })
            .collect();
        allocated.wait();
        let kept = held() - before;
        done.wait();
        for t in threads {
            t.join().unwrap().unwrap();
        }
        // The spare holds the namespace (and its macvtaps): let it go.
        drop(SPARE_HOST.lock().unwrap().take());
        assert_eq!(held(), before);
        assert_eq!(kept, 1, "{THREADS} threads served an Allocate each");
    }

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

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
23 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs udev rw,size=4030216k,mode=755
40 22 0:33 / /kind/node\\040dev rw shared:20 - tmpfs tmpfs rw
41 22 0:34 / /var/dev rw shared:21 - tmpfs tmpfs rw
42 41 0:5 / /var/dev rw shared:2 - devtmpfs udev rw
";

    #[test]
    fn a_dev_that_is_not_devtmpfs_is_named_as_the_cause() {
        assert_eq!(missing_tap_node_cause(Path::new("/dev"), MOUNTINFO), None);
        let cause = missing_tap_node_cause(Path::new("/kind/node dev"), MOUNTINFO).unwrap();
        assert!(cause.contains("tmpfs mount, not devtmpfs"), "{cause}");
        assert!(cause.contains("kubevirt/macvtap-cni#39"), "{cause}");
        // The top mount of a mount point counts.
        assert_eq!(
            missing_tap_node_cause(Path::new("/var/dev"), MOUNTINFO),
            None
        );
        // Below / only: the root file system, not devtmpfs.
        assert!(
            missing_tap_node_cause(Path::new("/srv/dev"), MOUNTINFO)
                .unwrap()
                .contains("ext4")
        );
    }

    use macvtap_link::Op;
    use test_support::fake::{FakeKernel, HOST};

    /// Runs Allocate for `ids` (one container) on the fake kernel.
    fn allocate_fake(kernel: &FakeKernel, ids: &[&str]) -> Result<AllocateResponse> {
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
        };
        let cfg = ResourceConfig::for_nic("lower0");
        check_request(&req, &cfg)?;
        allocate_on(&Host::current(kernel).unwrap(), &req, &cfg)
    }

    fn fake_node() -> FakeKernel {
        let kernel = FakeKernel::new();
        kernel.add_nic(HOST, "lower0");
        kernel
    }

    fn host_link_names(kernel: &FakeKernel) -> Vec<String> {
        kernel.links_of(HOST).into_iter().map(|l| l.name).collect()
    }

    #[test]
    fn allocate_creates_each_macvtap_and_answers_its_tap_node() {
        let kernel = fake_node();
        let resp = allocate_fake(&kernel, &["lower0Mvp0", "lower0Mvp1"]).unwrap();
        let specs = &resp.container_responses[0].devices;
        assert_eq!(specs.len(), 2);
        for (spec, id) in specs.iter().zip(["lower0Mvp0", "lower0Mvp1"]) {
            let link = kernel.link(HOST, &link_name_for_device(id)).unwrap();
            assert_eq!(spec.host_path, format!("/dev/tap{}", link.index));
            assert_eq!(spec.permissions, "rw");
        }
    }

    #[test]
    fn every_failure_after_creation_deletes_what_the_request_made() {
        // (operation, call number): the first device's checks, the second
        // device's creation, the second device's checks.
        for (op, nth) in [
            (Op::TapDevice, 1),
            (Op::OpenTapNode, 1),
            (Op::AddMacvtap, 2),
            (Op::TapDevice, 2),
            (Op::OpenTapNode, 2),
        ] {
            let kernel = fake_node();
            kernel.fail(op, nth, Errno::EIO);
            let e = allocate_fake(&kernel, &["lower0Mvp0", "lower0Mvp1"]).unwrap_err();
            assert!(e.to_string().contains("lower0Mvp"), "{op:?} {nth}: {e}");
            assert_eq!(
                host_link_names(&kernel),
                ["lower0"],
                "{op:?} call {nth} failing left a link"
            );
        }
    }

    #[test]
    fn a_reused_macvtap_is_kept_when_a_later_device_fails() {
        let kernel = fake_node();
        allocate_fake(&kernel, &["lower0Mvp0"]).unwrap();
        let held = kernel
            .link(HOST, &link_name_for_device("lower0Mvp0"))
            .unwrap();
        // The init container's device again (its creation is refused,
        // EEXIST, call 2), plus one whose creation fails (call 3).
        kernel.fail(Op::AddMacvtap, 3, Errno::ENOMEM);
        let e = allocate_fake(&kernel, &["lower0Mvp0", "lower0Mvp1"]).unwrap_err();
        assert!(e.to_string().contains("(ENOMEM)"), "{e}");
        assert!(e.to_string().contains("lower0Mvp1"), "{e}");
        assert_eq!(kernel.count(Op::AddMacvtap), 3);
        assert_eq!(
            kernel.link(HOST, &held.name),
            Some(held),
            "a pod may already hold it"
        );
        assert_eq!(kernel.count(Op::DelLink), 0);
    }

    /// Runs Allocate of `ids` (one container) of `cfg` on the fake kernel.
    fn allocate_cfg(
        kernel: &FakeKernel,
        cfg: &ResourceConfig,
        ids: &[&str],
    ) -> Result<AllocateResponse> {
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
        };
        check_request(&req, cfg)?;
        allocate_on(&Host::current(kernel).unwrap(), &req, cfg)
    }

    fn on_lower0(name: &str, mode: MacvtapMode, capacity: u32) -> ResourceConfig {
        ResourceConfig {
            name: name.into(),
            lower_device: "lower0".into(),
            mode,
            capacity,
        }
    }

    /// A foreign `kind` link on the fake node's lower0 in `mode`.
    fn foreign_port(kernel: &FakeKernel, name: &str, kind: &str, mode: MacvtapMode) {
        let lower = kernel.link(HOST, "lower0").unwrap().index;
        kernel.insert_link(
            HOST,
            Link {
                macvtap_mode: (kind == "macvtap").then_some(mode),
                ..test_support::fake::link(0, name, kind, Some(lower))
            },
        );
    }

    #[test]
    fn a_passthru_allocate_beside_another_port_is_refused_naming_it() {
        let kernel = fake_node();
        let pt = on_lower0("pt", MacvtapMode::Passthru, 1);
        foreign_port(&kernel, "mv0", "macvlan", MacvtapMode::Bridge);
        let e = allocate_cfg(&kernel, &pt, &["ptMvp0"]).unwrap_err();
        assert_eq!(e.grpc_code(), tonic::Code::FailedPrecondition);
        assert_eq!(e.refusal(), crate::error::PORT_IN_THE_WAY);
        assert_eq!(
            e.to_string(),
            "resource macvtap.network.kubevirt.io/pt cannot get a macvtap: NIC lower0 already \
             carries macvlan mv0; the kernel allows a passthru macvtap only alone on its NIC, so \
             delete mv0 or give the passthru resource a NIC of its own"
        );
        assert_eq!(kernel.count(Op::AddMacvtap), 0, "nothing was tried");
        // Its own device's link is no port in the way: a repeated Allocate reuses it.
        // (A repeated Allocate tries the create, meets the name and reuses
        // the link: same answer, nothing deleted.)
        let kernel = fake_node();
        let first = allocate_cfg(&kernel, &pt, &["ptMvp0"]).unwrap();
        let again = allocate_cfg(&kernel, &pt, &["ptMvp0"]).unwrap();
        assert_eq!(first, again);
        assert_eq!(kernel.count(Op::DelLink), 0);
    }

    #[test]
    fn the_kernels_einval_or_ebusy_becomes_the_port_in_the_way() {
        // A passthru port that appeared after the check (the fake refuses as
        // the kernel does): a bridge-mode Allocate names it, whatever the errno.
        for errno in [Errno::EINVAL, Errno::EBUSY] {
            let kernel = fake_node();
            foreign_port(&kernel, "mvtpt", "macvtap", MacvtapMode::Passthru);
            kernel.fail(Op::AddMacvtap, 1, errno);
            let e = allocate_fake(&kernel, &["lower0Mvp0"]).unwrap_err();
            assert_eq!(e.refusal(), crate::error::PORT_IN_THE_WAY, "{errno}: {e}");
            assert!(
                e.to_string().contains("carries passthru macvtap mvtpt"),
                "{errno}: {e}"
            );
        }
        // A passthru create refused with EINVAL when the node's namespace
        // shows no port: one in a pod's namespace.
        let kernel = fake_node();
        kernel.fail(Op::AddMacvtap, 1, Errno::EINVAL);
        let e = allocate_cfg(
            &kernel,
            &on_lower0("pt", MacvtapMode::Passthru, 1),
            &["ptMvp0"],
        )
        .unwrap_err();
        assert_eq!(e.refusal(), crate::error::PORT_IN_THE_WAY, "{e}");
        assert!(
            e.to_string().contains(
                "NIC lower0 already carries another macvlan/macvtap port (the kernel refused the \
                 passthru macvtap with EINVAL, and no such port is in the node's namespace, so a \
                 pod holds it)"
            ),
            "{e}"
        );
        // Likewise a bridge-mode EINVAL: a passthru port in a pod's namespace.
        let kernel = fake_node();
        kernel.fail(Op::AddMacvtap, 1, Errno::EINVAL);
        let e = allocate_fake(&kernel, &["lower0Mvp0"]).unwrap_err();
        assert_eq!(e.refusal(), crate::error::PORT_IN_THE_WAY, "{e}");
        assert!(
            e.to_string().contains(
                "NIC lower0 carries a passthru macvlan/macvtap port (the kernel refused the \
                 macvtap with EINVAL, and no such port is in the node's namespace, so a pod \
                 holds it)"
            ),
            "{e}"
        );
        // Without any port EBUSY stays the busy NIC, and other errnos the kernel's.
        let kernel = fake_node();
        kernel.fail(Op::AddMacvtap, 1, Errno::EPERM);
        let e = allocate_fake(&kernel, &["lower0Mvp0"]).unwrap_err();
        assert_eq!(e.refusal(), crate::error::INTERNAL, "{e}");
        let kernel = fake_node();
        kernel.fail(Op::AddMacvtap, 1, Errno::EBUSY);
        let e = allocate_fake(&kernel, &["lower0Mvp0"]).unwrap_err();
        assert_eq!(e.refusal(), crate::error::LOWER_DEVICE_BUSY, "{e}");
    }

    #[test]
    fn a_new_device_is_created_without_looking_it_up_first() {
        let kernel = fake_node();
        allocate_fake(&kernel, &["lower0Mvp0"]).unwrap();
        // The lower NIC's look-up only; the creation answers with the link.
        assert_eq!(kernel.count(Op::GetLink), 1, "{:?}", kernel.calls());
        assert_eq!(kernel.count(Op::AddMacvtap), 1);
    }

    #[test]
    fn a_taken_name_is_reused_when_right_and_replaced_when_wrong() {
        let kernel = fake_node();
        let name = link_name_for_device("lower0Mvp0");
        let lower = kernel.link(HOST, "lower0").unwrap();
        let wrong = kernel.insert_link(
            HOST,
            test_support::fake::link(40, &name, "macvlan", Some(lower.index)),
        );
        let resp = allocate_fake(&kernel, &["lower0Mvp0"]).unwrap();
        let made = kernel.link(HOST, &name).unwrap();
        assert!(made.is_macvtap(), "{made:?}");
        assert_ne!(made.index, wrong.index);
        assert_eq!(kernel.count(Op::DelLink), 1);
        assert_eq!(
            resp.container_responses[0].devices[0].host_path,
            format!("/dev/tap{}", made.index)
        );
        // Asked again: the right macvtap is kept, not made anew.
        let again = allocate_fake(&kernel, &["lower0Mvp0"]).unwrap();
        assert_eq!(kernel.link(HOST, &name), Some(made.clone()));
        assert_eq!(kernel.count(Op::DelLink), 1);
        assert_eq!(
            again.container_responses[0].devices[0].host_path,
            format!("/dev/tap{}", made.index)
        );
    }

    #[test]
    fn sysfs_gives_the_tap_device_only_for_the_links_ifindex() {
        let sysfs = tempfile::tempdir().unwrap();
        let file = tap_dev_file(sysfs.path(), "mvt0", 7);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "240:3\n").unwrap();
        assert_eq!(tap_dev_from_sysfs(sysfs.path(), "mvt0", 7), Some((240, 3)));
        // Another link of that name (another namespace's) has another ifindex.
        assert_eq!(tap_dev_from_sysfs(sysfs.path(), "mvt0", 8), None);
        assert_eq!(tap_dev_from_sysfs(sysfs.path(), "mvt1", 7), None);
    }

    #[test]
    fn only_a_macvtap_on_the_lower_nic_in_the_mode_is_reused() {
        let lower = Link {
            index: 2,
            name: "eth0".into(),
            ..Default::default()
        };
        let good = Link {
            index: 9,
            name: "mvt0".into(),
            kind: Some("macvtap".into()),
            lower_index: Some(2),
            macvtap_mode: Some(MacvtapMode::Bridge),
            ..Default::default()
        };
        assert_eq!(unusable_reason(&good, &lower, MacvtapMode::Bridge), None);
        let e = unusable_reason(&good, &lower, MacvtapMode::Vepa).unwrap();
        assert!(e.contains("mode is bridge, not vepa"), "{e}");
        let other = Link {
            lower_index: Some(3),
            ..good.clone()
        };
        assert!(unusable_reason(&other, &lower, MacvtapMode::Bridge).is_some());
        let macvlan = Link {
            kind: Some("macvlan".into()),
            ..good
        };
        assert!(
            unusable_reason(&macvlan, &lower, MacvtapMode::Bridge)
                .unwrap()
                .contains("macvlan")
        );
    }
}
