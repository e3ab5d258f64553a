//! The give-back rule that ADD and DEL share: a pod's macvtap goes back to
//! the host under the name it had there, which ADD writes into the pod
//! link's alias ([`host_name_alias`]) and DEL reads back ([`host_name`]),
//! and with the ifindex it had, since the kubelet handed the pod
//! `/dev/tap<ifindex>`; a link that comes back with another ifindex is
//! deleted ([`back_with_index`]). DEL gives a pod's link back this way, and
//! so does ADD's rollback.

use crate::error::{Error, Result};
use macvtap_link::{Link, Links, link_name_for_device, parse_link_name};
use nix::errno::Errno;
use tracing::warn;

/// What ADD writes in the pod link's alias before the name it had on the
/// host, so that DEL can give it back even when its config has no `deviceID`.
const ALIAS_PREFIX: &str = "macvtap-cni:";

/// The alias ADD gives a link that was `host_name` on the host.
pub(crate) fn host_name_alias(host_name: &str) -> String {
    format!("{ALIAS_PREFIX}{host_name}")
}

/// The name the link had on the host: from its alias when that agrees with
/// `device_id` (or when there is no `device_id`, if it is a name the device
/// plugin gives), else the name `device_id` maps to.
pub(crate) fn host_name(link: &Link, device_id: &str) -> Option<String> {
    let from_alias = link
        .alias
        .as_deref()
        .and_then(|a| a.strip_prefix(ALIAS_PREFIX))
        // The alias lives in the pod, whose processes may change it: only a
        // name the device plugin gives a device is ever given back to the host.
        .filter(|n| parse_link_name(n).is_some())
        .map(str::to_string);
    if device_id.is_empty() {
        return from_alias;
    }
    let ours = link_name_for_device(device_id);
    match from_alias {
        // The Go project's v0.13.1 named the link after the device ID.
        Some(n) if n == ours || n == device_id => Some(n),
        _ => Some(ours),
    }
}

/// The link just moved back to the host as `host_name` from `from`, asking
/// for ifindex `index`. Kernels before 5.13 ignore the index asked for: a
/// link that came back with another one is deleted, since `/dev/tap<index>`
/// no longer names it (the device plugin re-creates it while its pod holds
/// the device), and `None` is returned. ADD's rollback and DEL share this.
pub(crate) fn back_with_index(
    host: &dyn Links,
    host_name: &str,
    index: u32,
    from: &str,
) -> Result<Option<Link>> {
    let back = host.get_link(host_name)?.ok_or_else(|| {
        Error::IfindexChanged(format!(
            "link {host_name} vanished while moving back to the host from {from}"
        ))
    })?;
    if back.index == index {
        return Ok(Some(back));
    }
    warn!(
        host_name,
        was = index,
        now = back.index,
        "the link came back with another ifindex, so /dev/tap{index} no longer names it: \
         deleting it (the device plugin re-creates it while its pod holds the device)"
    );
    match host.del_link(back.index, &back.name) {
        Ok(()) => Ok(None),
        Err(e) if e.errno() == Some(Errno::ENODEV) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_alias(alias: Option<&str>) -> Link {
        Link {
            alias: alias.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn the_host_name_comes_from_the_alias_or_the_device_id() {
        let ours = link_name_for_device("dpMvp3");
        let alias = host_name_alias(&ours);
        assert_eq!(host_name(&with_alias(Some(&alias)), ""), Some(ours.clone()));
        assert_eq!(host_name(&with_alias(None), "dpMvp3"), Some(ours.clone()));
        assert_eq!(host_name(&with_alias(None), ""), None);
        // A Go-era link keeps its Go-era name.
        let go = host_name_alias("dpMvp3");
        assert_eq!(
            host_name(&with_alias(Some(&go)), "dpMvp3"),
            Some("dpMvp3".to_string())
        );
    }

    #[test]
    fn an_alias_the_pod_changed_names_nothing_else() {
        // The pod may rewrite its link's alias: it never picks a host name.
        let forged = host_name_alias("eth0");
        assert_eq!(host_name(&with_alias(Some(&forged)), ""), None);
        let other = host_name_alias(&link_name_for_device("otherMvp1"));
        assert_eq!(
            host_name(&with_alias(Some(&other)), "dpMvp3"),
            Some(link_name_for_device("dpMvp3"))
        );
        assert_eq!(host_name(&with_alias(Some("eth0")), ""), None);
    }
}
