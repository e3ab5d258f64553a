//! A device's macvtap made or reused: created first (one round trip, the
//! kernel echoing the new link), and only when the kernel answers that the
//! name is taken (`EEXIST`) read and reused or replaced; a lost link made
//! again at its ifindex for heal. A link made by a failed call is deleted.

use super::devfs::{answer_path, check_node};
use super::refusal::{busy_lower, port_refusal};
use crate::config::ResourceConfig;
use crate::core::host::Host;
use crate::error::{Error, Result};
use macvtap_link::tapdev::tap_node_path;
use macvtap_link::{Link, Links, MacvtapMode, link_name_for_device};
use nix::errno::Errno;
use std::path::PathBuf;
use tracing::{info, warn};

/// What [`recreate_device`] came to.
#[derive(Debug)]
pub(crate) enum Recreated {
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
pub(crate) fn recreate_device(
    host: &Host,
    cfg: &ResourceConfig,
    lower: &Link,
    id: &str,
    index: u32,
) -> Result<Recreated> {
    let name = link_name_for_device(id);
    let wrap = Error::device(id, &name);
    let link = host
        .link_ops()
        .add_macvtap_at(
            &name,
            lower.index,
            cfg.mode,
            Some(lower.txqueuelen),
            Some(index),
        )
        .map_err(wrap)?;
    // devtmpfs made (or did not make) the node before the create returned.
    let node = tap_node_path(host.paths().dev(), link.index);
    if let Ok(Some(found)) = host.kernel().tap_node(&node) {
        let ours = host
            .kernel()
            .tap_device(host.netns(), &name)
            .map_err(wrap)?;
        if found != ours {
            delete_quietly(host.link_ops(), &link);
            return Ok(Recreated::NodeElsewhere);
        }
    }
    checked_or_deleted(host, id, &link)?;
    Ok(Recreated::Made(link))
}

/// Checks the tap node of `link`, just made for device `id`, and returns its
/// path; deletes the link when the check fails.
fn checked_or_deleted(host: &Host, id: &str, link: &Link) -> Result<PathBuf> {
    let node = answer_path(host.paths(), link.index);
    match check_node(host, &link.name, link.index, &node) {
        Ok(()) => Ok(node),
        Err(e) => {
            delete_quietly(host.link_ops(), link);
            Err(e.for_device(id, &link.name))
        }
    }
}

/// The macvtap of one device, ready to hand out.
#[derive(Debug, Clone)]
pub struct PreparedDevice {
    /// The link in the host namespace.
    pub link: Link,
    /// Its tap node as the kubelet is told it, `/dev/tap<ifindex>`: checked
    /// to be its char device where tap nodes show, else the host's path of
    /// the char device sysfs shows.
    pub node: PathBuf,
    /// Whether this call created the link (false: an existing one was reused).
    pub created: bool,
}

/// Why an existing link of a device cannot be reused, or `None` if it is a
/// macvtap on `lower` in `mode` and can be.
pub(crate) fn unusable_reason(link: &Link, lower: &Link, mode: MacvtapMode) -> Option<String> {
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
) -> Result<PreparedDevice> {
    let handle = host.link_ops();
    let name = link_name_for_device(id);
    let wrap = Error::device(id, &name);
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
            if let Some(reused) = reuse_or_remove(host, cfg, lower, id, &name)? {
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
    let node = checked_or_deleted(host, id, &link)?;
    info!(
        device_id = id,
        ifname = %name,
        lower = %lower.name,
        mode = %cfg.mode,
        tap = %node.display(),
        "created macvtap"
    );
    Ok(PreparedDevice {
        link,
        node,
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
) -> Result<Option<PreparedDevice>> {
    let handle = host.link_ops();
    let wrap = Error::device(id, name);
    let Some(old) = handle.get_link(name).map_err(wrap)? else {
        return Ok(None);
    };
    match unusable_reason(&old, lower, cfg.mode) {
        None => {
            let node = answer_path(host.paths(), old.index);
            check_node(host, name, old.index, &node).map_err(|e| e.for_device(id, name))?;
            info!(device_id = id, ifname = %name, tap = %node.display(), "reusing the device's existing macvtap");
            Ok(Some(PreparedDevice {
                link: old,
                node,
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

pub(super) fn delete_quietly(handle: &dyn Links, link: &Link) {
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
