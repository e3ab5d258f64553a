//! Why the kernel refused a device's macvtap, in words an operator can act
//! on: the master that owns the NIC, the port in the way of the mode, or
//! the busy NIC, rather than the kernel's bare `EBUSY` or `EINVAL`.

use crate::config::ResourceConfig;
use crate::core::nic::health::port_in_the_way;
use crate::core::nic::master::{Owner, receive_path_owner};
use crate::core::nic::port::PortInTheWay;
use crate::error::{Error, Result};
use macvtap_link::{Link, Links, MacvtapMode};
use nix::errno::Errno;

/// The master that owns `lower`'s receive path, read from the kernel now.
pub(super) fn owner_of(handle: &dyn Links, lower: &Link) -> Result<Option<Owner>> {
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
pub(super) fn port_refusal(
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
pub(super) fn busy_lower(handle: &dyn Links, cfg: &ResourceConfig, lower: &Link) -> Error {
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
