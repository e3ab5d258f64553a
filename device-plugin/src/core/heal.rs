//! Lost links: a device that PodResources says a pod holds, but whose
//! macvtap exists nowhere. A pod's network namespace destroyed without CNI
//! DEL takes the macvtap with it, and the kubelet keeps handing the pod's
//! containers the `/dev/tap<N>` of the first Allocate. When no link of the
//! device's name is in the host namespace and `/dev/tap<N>` is gone
//! (devtmpfs keeps a tap node as long as its macvtap exists in any
//! namespace, but for the moment the macvtap moves between two: CNI ADD and
//! DEL move it, so each device is looked at again once moves in flight have
//! ended), the macvtap is created again on the resource's NIC with ifindex
//! N, so the sandbox's retried CNI ADD works and the kubelet's DeviceSpec
//! is right again. Each reclaim round ([`crate::core::reclaim`]) heals first; a
//! tap node's deletion in `/dev` starts a round at once.

use crate::config::ResourceConfig;
use crate::core::host::Host;
use crate::core::ledger::{Assigned, Assignments};
use crate::core::link::{Recreated, recreate_device};
use crate::error::Result;
use macvtap_link::tapdev::tap_node_path;
use macvtap_link::{Link, LinkChange, Links, link_name_for_device};
use std::collections::HashSet;
use std::path::Path;
use tracing::{debug, info, warn};

/// A device to heal: held by a pod, its macvtap gone everywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// The device ID.
    pub device_id: String,
    /// Where it was handed out.
    pub at: Assigned,
}

/// The devices that a pod holds (`allocated`) and that were handed out by
/// this daemon (`assignments`), whose link is not in the host namespace
/// (`links`) and whose tap node no longer exists (`node_exists`).
pub(crate) fn lost_devices(
    allocated: &HashSet<String>,
    assignments: &Assignments,
    links: &[Link],
    node_exists: impl Fn(u32) -> bool,
) -> Vec<Lost> {
    let host_names: HashSet<&str> = links.iter().map(|l| l.name.as_str()).collect();
    let mut lost: Vec<Lost> = allocated
        .iter()
        .filter_map(|id| Some((id, assignments.get(id)?)))
        .filter(|(id, _)| !host_names.contains(link_name_for_device(id).as_str()))
        .filter(|(_, at)| !node_exists(at.ifindex))
        .map(|(id, at)| Lost {
            device_id: id.clone(),
            at,
        })
        .collect();
    lost.sort_by(|a, b| a.device_id.cmp(&b.device_id));
    lost
}

/// What one `heal` did: how many lost devices came back, and how many
/// could not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Healed {
    /// Lost macvtaps made again.
    pub made: u64,
    /// Lost macvtaps not made again (logged with the reason): the resource
    /// or its NIC is gone, another link holds the ifindex, or making it
    /// failed. The next round tries each again.
    pub failed: u64,
}

/// Re-creates each lost device's macvtap with its old ifindex; returns how
/// many came back and how many could not. A device whose ifindex is taken
/// on the host by another link, or whose resource or NIC is gone, is logged
/// and left.
///
/// `lost` was judged from links listed before the kubelet answered and a
/// tap node looked at after, and a macvtap moving between namespaces is in
/// neither and has no node for that moment (devtmpfs deletes it and makes
/// it again): so each device is looked at again first, after every move in
/// flight has ended ([`settle`]), and one whose link is on the host or whose
/// node exists is not lost. A link made while the device's own moved into a
/// pod gets no node (the name is the other's) and is deleted at once.
///
/// Where tap nodes do not show (no host `/dev`), nothing is made: a link in
/// a pod cannot be told from a lost one there.
pub(crate) fn heal(host: &Host, lost: &[Lost], resources: &[ResourceConfig]) -> Result<Healed> {
    let mut healed = Healed::default();
    if !host.paths().tap_nodes_shown() {
        debug!(
            lost = lost.len(),
            "not healing: no tap node shows without the host's /dev"
        );
        return Ok(healed);
    }
    let handle = host.link_ops();
    for l in lost {
        let Some(cfg) = resources.iter().find(|r| r.name == l.at.resource) else {
            warn!(device_id = %l.device_id, resource = %l.at.resource,
                "a pod holds this device but its macvtap is gone, and its resource is no longer configured: not re-created");
            healed.failed += 1;
            continue;
        };
        let Some(lower) = handle.get_link(&cfg.lower_device)? else {
            warn!(device_id = %l.device_id, lower = %cfg.lower_device,
                "a pod holds this device but its macvtap is gone, and so is its NIC: not re-created");
            healed.failed += 1;
            continue;
        };
        let name = link_name_for_device(&l.device_id);
        let node = tap_node_path(host.paths().dev(), l.at.ifindex);
        if let Err(e) = settle(handle, &lower) {
            warn!(device_id = %l.device_id, error = %e,
                "cannot wait for link changes in flight, so cannot tell whether the device's macvtap is lost: not re-created now");
            healed.failed += 1;
            continue;
        }
        match look_again(host, &name, l.at.ifindex, &node)? {
            Look::Lost => {}
            Look::NotLost(why) => {
                debug!(device_id = %l.device_id, ifname = %name, ifindex = l.at.ifindex, why,
                    "not lost after all: its link was moving between namespaces when the round looked");
                continue;
            }
            Look::IndexTaken => {
                healed.failed += 1;
                continue;
            }
        }
        match recreate_device(host, cfg, &lower, &l.device_id, l.at.ifindex) {
            Ok(Recreated::Made(link)) => {
                healed.made += 1;
                info!(device_id = %l.device_id, ifname = %link.name, ifindex = link.index,
                    "re-created the macvtap of a device a pod still holds (its namespace went without CNI DEL), so the sandbox's retried ADD finds it");
            }
            Ok(Recreated::NodeElsewhere) => {
                debug!(device_id = %l.device_id, ifname = %name, ifindex = l.at.ifindex,
                    "not lost after all: its link moved into a pod meanwhile and has /dev/tap{}; the link made for it is deleted again", l.at.ifindex);
            }
            Err(e) => {
                warn!(device_id = %l.device_id, error = %e, "could not re-create a lost macvtap");
                healed.failed += 1;
            }
        }
    }
    Ok(healed)
}

/// Returns once every link change in flight on the node has ended: a move
/// between namespaces holds the kernel's RTNL lock from start to end, and a
/// change request (here one that changes nothing on `lower`) waits for it.
fn settle(handle: &dyn Links, lower: &Link) -> Result<()> {
    handle.set_link(lower.index, &lower.name, &LinkChange::default())?;
    Ok(())
}

/// What a second look at a device a round judged lost finds.
enum Look {
    /// It is not lost after all, for the reason given: its link is on the
    /// host, or its node exists (its link is in a pod's namespace).
    NotLost(&'static str),
    /// Another link holds its ifindex on the host (logged): it cannot come
    /// back.
    IndexTaken,
    /// It is lost.
    Lost,
}

/// Looks again, now, at the device whose link is `name` with ifindex
/// `index` (tap node `node`).
fn look_again(host: &Host, name: &str, index: u32, node: &Path) -> Result<Look> {
    let handle = host.link_ops();
    if handle.get_link(name)?.is_some() {
        return Ok(Look::NotLost("its link is on the node"));
    }
    if !matches!(host.kernel().tap_node(node), Ok(None)) {
        return Ok(Look::NotLost(
            "its tap node exists: the link is in a pod's namespace",
        ));
    }
    match handle.get_link_by_index(index)? {
        Some(other) if other.name == name => Ok(Look::NotLost("its link is on the node")),
        Some(other) => {
            warn!(ifname = %name, ifindex = index, other = %other.name,
                "a pod holds this device but its macvtap is gone, and its ifindex is now taken on the host by another link, so /dev/tap{} cannot come back: the pod needs to be re-created", index);
            Ok(Look::IndexTaken)
        }
        None => Ok(Look::Lost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use macvtap_link::{Kernel, MacvtapMode, Op};
    use test_support::fake::{FakeKernel, HOST, link};

    #[test]
    fn lost_devices_are_held_handed_out_and_gone_everywhere() {
        let a = Assignments::default();
        a.assigned("dpMvp1", "dp", 40);
        a.assigned("dpMvp2", "dp", 41);
        a.assigned("dpMvp3", "dp", 42);
        a.assigned("dpMvp4", "dp", 43);
        let allocated: HashSet<String> = ["dpMvp1", "dpMvp2", "dpMvp3", "dpMvp5"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        // dpMvp1: its link is on the host (returned by DEL, or not yet moved).
        let links = vec![link(
            40,
            &link_name_for_device("dpMvp1"),
            "macvtap",
            Some(2),
        )];
        // dpMvp2: its tap node exists, so the link lives in some pod.
        let lost = lost_devices(&allocated, &a, &links, |i| i == 41);
        // dpMvp3 is lost; dpMvp4 is held by no pod; dpMvp5 was never handed out here.
        assert_eq!(
            lost,
            vec![Lost {
                device_id: "dpMvp3".into(),
                at: Assigned {
                    resource: "dp".into(),
                    ifindex: 42
                }
            }]
        );
    }

    /// The host's file systems with an empty `/dev` at `dev`.
    fn dev_at(dev: &tempfile::TempDir) -> crate::core::host::HostPaths {
        crate::core::host::HostPaths {
            dev: dev.path().to_path_buf(),
            ..Default::default()
        }
    }

    /// A node whose pod holds `dpMvp1` of resource `dp` on `lower0`, handed
    /// out as `/dev/tap40`, with an empty `/dev`.
    fn held_device() -> (
        FakeKernel,
        Vec<Lost>,
        Vec<ResourceConfig>,
        tempfile::TempDir,
    ) {
        let kernel = FakeKernel::new();
        kernel.add_nic(HOST, "lower0");
        let lost = vec![Lost {
            device_id: "dpMvp1".into(),
            at: Assigned {
                resource: "dp".into(),
                ifindex: 40,
            },
        }];
        let resources = vec![ResourceConfig {
            name: "dp".into(),
            ..ResourceConfig::for_nic("lower0")
        }];
        (kernel, lost, resources, tempfile::tempdir().unwrap())
    }

    #[test]
    fn a_held_devices_lost_link_comes_back_with_its_ifindex() {
        let (kernel, lost, resources, dev) = held_device();
        let host = Host::current(&kernel).unwrap().with_paths(dev_at(&dev));
        assert_eq!(
            heal(&host, &lost, &resources).unwrap(),
            Healed { made: 1, failed: 0 }
        );
        let link = kernel
            .link(HOST, &link_name_for_device("dpMvp1"))
            .expect("re-created");
        assert_eq!(link.index, 40, "the /dev/tap40 the kubelet hands out");
        assert!(link.is_macvtap());
        assert_eq!(link.macvtap_mode, Some(MacvtapMode::Bridge));
        let lower = kernel.link(HOST, "lower0").unwrap();
        assert_eq!(link.lower_index, Some(lower.index));
        assert_eq!(link.txqueuelen, lower.txqueuelen);
    }

    #[test]
    fn nothing_is_made_when_the_link_or_its_node_is_still_there() {
        let (kernel, _, _, dev) = held_device();
        let a = Assignments::default();
        a.assigned("dpMvp1", "dp", 40);
        let allocated = HashSet::from(["dpMvp1".to_string()]);
        // The link is on the host (given back by DEL, or not yet moved).
        let host = Host::current(&kernel).unwrap();
        let lower = kernel.link(HOST, "lower0").unwrap();
        host.link_ops()
            .add_macvtap_at(
                &link_name_for_device("dpMvp1"),
                lower.index,
                MacvtapMode::Bridge,
                None,
                Some(40),
            )
            .unwrap();
        let links = host.link_ops().list_links().unwrap();
        let node_exists = |i: u32| dev.path().join(format!("tap{i}")).exists();
        assert_eq!(lost_devices(&allocated, &a, &links, node_exists), []);
        // The link is in some pod's namespace: its tap node still exists.
        kernel.add_netns("/run/netns/pod");
        let pod = kernel.open_netns(Path::new("/run/netns/pod")).unwrap();
        host.link_ops()
            .set_link_ns(40, &link_name_for_device("dpMvp1"), &pod, "net1")
            .unwrap();
        std::fs::write(dev.path().join("tap40"), "").unwrap();
        let links = host.link_ops().list_links().unwrap();
        assert_eq!(lost_devices(&allocated, &a, &links, node_exists), []);
        assert_eq!(kernel.count(Op::AddMacvtap), 1, "only the set-up's");
    }

    /// Issue 37, seed 1796164578509130593: the round listed the links while
    /// the device's was in a pod and looked at `/dev/tapN` while DEL moved
    /// it back; by the time heal runs, the link is on the host at its
    /// ifindex. Heal took the device's own link for another holding the
    /// index and warned that the pod must be re-created.
    #[test]
    fn a_link_back_on_the_host_is_not_lost_and_not_another_link_in_the_way() {
        let (kernel, lost, resources, dev) = held_device();
        let lower = kernel.link(HOST, "lower0").unwrap();
        let host = Host::current(&kernel).unwrap().with_paths(dev_at(&dev));
        host.link_ops()
            .add_macvtap_at(
                &link_name_for_device("dpMvp1"),
                lower.index,
                MacvtapMode::Bridge,
                None,
                Some(40),
            )
            .unwrap();
        let log = crate::testlog::logged(|| {
            assert_eq!(heal(&host, &lost, &resources).unwrap(), Healed::default());
        });
        assert!(!log.contains("taken on the host"), "{log}");
        assert!(log.contains("not lost after all"), "{log}");
        assert_eq!(
            kernel.count(Op::AddMacvtap),
            1,
            "only the one back from the pod"
        );
    }

    /// The round looked while the device's link moved into a pod (no node
    /// for that moment), and heal runs once it is there: nothing is made,
    /// since a second link with its ifindex on the host would get no node
    /// and make CNI DEL delete the pod's link as in the way.
    #[test]
    fn a_link_that_moved_into_a_pod_is_not_made_again_on_the_host() {
        let (kernel, lost, resources, dev) = held_device();
        let lower = kernel.link(HOST, "lower0").unwrap();
        let host = Host::current(&kernel).unwrap().with_paths(dev_at(&dev));
        let name = link_name_for_device("dpMvp1");
        host.link_ops()
            .add_macvtap_at(&name, lower.index, MacvtapMode::Bridge, None, Some(40))
            .unwrap();
        kernel.add_netns("/run/netns/pod");
        let pod = kernel.open_netns(Path::new("/run/netns/pod")).unwrap();
        host.link_ops()
            .set_link_ns(40, &name, &pod, "net1")
            .unwrap();
        assert_eq!(heal(&host, &lost, &resources).unwrap(), Healed::default());
        assert_eq!(kernel.links_of(HOST).len(), 1, "only the NIC on the host");
        assert_eq!(kernel.count(Op::AddMacvtap), 1);
    }

    #[test]
    fn a_device_is_left_when_moves_in_flight_cannot_be_waited_for() {
        let (kernel, lost, resources, dev) = held_device();
        kernel.fail(Op::SetLink, 1, nix::errno::Errno::EIO);
        let host = Host::current(&kernel).unwrap().with_paths(dev_at(&dev));
        assert_eq!(
            heal(&host, &lost, &resources).unwrap(),
            Healed { made: 0, failed: 1 }
        );
        assert_eq!(kernel.count(Op::AddMacvtap), 0);
        // The next round waits, looks again and heals it.
        assert_eq!(
            heal(&host, &lost, &resources).unwrap(),
            Healed { made: 1, failed: 0 }
        );
    }

    #[test]
    fn a_taken_ifindex_a_gone_nic_or_resource_leave_the_device_alone() {
        // Another link has the ifindex now.
        let (kernel, lost, resources, dev) = held_device();
        kernel.insert_link(
            HOST,
            Link {
                index: 40,
                name: "veth9".into(),
                ..Default::default()
            },
        );
        let host = Host::current(&kernel).unwrap().with_paths(dev_at(&dev));
        let failed = Healed { made: 0, failed: 1 };
        assert_eq!(heal(&host, &lost, &resources).unwrap(), failed);
        // The NIC is gone.
        let (kernel, lost, _, dev) = held_device();
        let host = Host::current(&kernel).unwrap().with_paths(dev_at(&dev));
        let elsewhere = vec![ResourceConfig {
            name: "dp".into(),
            ..ResourceConfig::for_nic("lower9")
        }];
        assert_eq!(heal(&host, &lost, &elsewhere).unwrap(), failed);
        // The resource is no longer configured.
        assert_eq!(heal(&host, &lost, &[]).unwrap(), failed);
        assert_eq!(kernel.count(Op::AddMacvtap), 0);
    }

    #[test]
    fn a_recreated_link_whose_node_fails_the_check_is_deleted_again() {
        let (kernel, lost, resources, dev) = held_device();
        kernel.fail(Op::OpenTapNode, 1, nix::errno::Errno::ENOENT);
        let host = Host::current(&kernel).unwrap().with_paths(dev_at(&dev));
        assert_eq!(
            heal(&host, &lost, &resources).unwrap(),
            Healed { made: 0, failed: 1 }
        );
        assert_eq!(kernel.count(Op::AddMacvtap), 1);
        assert_eq!(kernel.link(HOST, &link_name_for_device("dpMvp1")), None);
    }

    #[test]
    fn without_the_hosts_dev_a_lost_looking_device_is_never_made_again() {
        // No tap node shows: the device's link may well be in its pod.
        let (kernel, lost, resources, dev) = held_device();
        let paths = crate::core::host::HostPaths {
            tap_nodes: crate::core::host::TapNodes::Unseen {
                fstype: "tmpfs".into(),
            },
            ..dev_at(&dev)
        };
        let host = Host::current(&kernel).unwrap().with_paths(paths);
        assert_eq!(heal(&host, &lost, &resources).unwrap(), Healed::default());
        assert_eq!(kernel.count(Op::AddMacvtap), 0);
        assert_eq!(kernel.count(Op::DelLink), 0);
    }
}
