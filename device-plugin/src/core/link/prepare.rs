//! The devices of one request, all or none: every ID checked before
//! anything is made, the NIC's master and (for passthru) a port in the way
//! named before the kernel is asked, each device's macvtap made or reused,
//! and on any failure every link this request made deleted again (never a
//! reused one: a pod may hold it). [`hand_out`] adds the ledger's part.

use super::create::{PreparedDevice, create_device, delete_quietly};
use super::refusal::owner_of;
use crate::config::ResourceConfig;
use crate::core::host::{Host, SharedHost};
use crate::core::ledger::Assignments;
use crate::core::ledger::clock::AllocationClock;
use crate::core::nic::health::port_in_the_way;
use crate::error::{Error, Result};
use macvtap_link::{Link, MacvtapMode, device_index, link_name_for_device};
use std::time::Instant;

/// Checks that every one of `ids` is a device of `cfg`, before anything is
/// created, so that a bad request changes nothing.
pub(crate) fn check_ids<'a>(
    cfg: &ResourceConfig,
    ids: impl IntoIterator<Item = &'a str>,
) -> Result<()> {
    for id in ids {
        if device_index(&cfg.name, cfg.capacity, id).is_none() {
            return Err(Error::UnknownDevice {
                device_id: id.to_string(),
                resource: cfg.resource_name(),
                capacity: cfg.capacity,
            });
        }
    }
    Ok(())
}

/// Makes or reuses the macvtap of each of `ids` (checked by [`check_ids`])
/// on `host`, in order; on any failure deletes every link made here.
pub(crate) fn prepare(
    host: &Host,
    cfg: &ResourceConfig,
    ids: &[&str],
) -> Result<Vec<PreparedDevice>> {
    let handle = host.link_ops();
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
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        match create_device(host, cfg, &lower, id) {
            Ok(made) => {
                if made.created {
                    created.push(made.link.clone());
                }
                out.push(made);
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
    Ok(out)
}

/// Hands out `ids` of `cfg` as a front serves a request: the devices' leak
/// clocks restarted before their links are touched and once they are
/// ready, the links made or reused ([`prepare`], on `host`'s handle of the
/// calling thread's namespace on its kernel), and each device's ifindex
/// recorded for healing before the answer leaves.
pub(crate) fn hand_out(
    host: &SharedHost,
    cfg: &ResourceConfig,
    ids: &[&str],
    clock: &AllocationClock,
    assignments: &Assignments,
) -> Result<Vec<PreparedDevice>> {
    check_ids(cfg, ids.iter().copied())?;
    let links: Vec<String> = ids.iter().map(|id| link_name_for_device(id)).collect();
    for l in &links {
        clock.allocated(l, Instant::now());
    }
    let prepared = host.run(|host| prepare(host, cfg, ids))?;
    let got: Vec<(&str, u32)> = ids
        .iter()
        .zip(&prepared)
        .map(|(id, p)| (*id, p.link.index))
        .collect();
    assignments.handed_out(&cfg.name, &got);
    for l in &links {
        clock.allocated(l, Instant::now());
    }
    Ok(prepared)
}
