//! The reclaim rules as plain functions: which device IDs of ours the
//! kubelet says are allocated (to the device plugin or through DRA), and which links look leaked (this plugin's
//! `mvt…` macvtaps and the Go plugin's v0.13.1 `<name>Mvp<i>` ones). The
//! round ([`super::Reclaimer`]) applies them; `doctor` reports by them.

use crate::config::ResourceConfig;
use crate::core::ledger::Assignments;
use kubelet_proto::podresources::v1::ListPodResourcesResponse;
use macvtap_link::dra::{DRIVER, dra_device_index};
use macvtap_link::{
    DeviceLinkName, Link, RESOURCE_PREFIX, device_id, link_name_for_device, parse_link_name,
};
use std::collections::{HashMap, HashSet};

/// A link as the reclaimer tells links apart: a link deleted and created
/// again under the same name has another ifindex, and starts over.
pub(crate) type LinkIdentity = (String, u32);

/// What pods hold of ours, as the kubelet's PodResources `List` says it:
/// device plugin IDs, and devices of our DRA driver by DRA device name (a
/// pod's `dynamic_resources`), which [`Held::ids`] turns into device IDs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    ids: HashSet<String>,
    dra_devices: HashSet<String>,
}

impl Held {
    /// What `resp` says pods hold of ours.
    pub(crate) fn from_response(resp: &ListPodResourcesResponse) -> Self {
        let prefix = format!("{RESOURCE_PREFIX}/");
        let containers = || resp.pod_resources.iter().flat_map(|p| &p.containers);
        Self {
            ids: containers()
                .flat_map(|c| &c.devices)
                .filter(|d| d.resource_name.starts_with(&prefix))
                .flat_map(|d| d.device_ids.iter().cloned())
                .collect(),
            dra_devices: containers()
                .flat_map(|c| &c.dynamic_resources)
                .flat_map(|d| &d.claim_resources)
                .filter(|r| r.driver_name == DRIVER)
                .map(|r| r.device_name.clone())
                .collect(),
        }
    }

    /// The device IDs the kubelet handed out through the device plugin
    /// front (of ours, by their resource name's prefix).
    pub fn plugin_ids(&self) -> &HashSet<String> {
        &self.ids
    }

    /// The device IDs held: the device plugin's as listed, and each DRA
    /// device of one of `resources` as its device ID (a DRA device of a
    /// resource not among them cannot be named, and no link of such a
    /// resource is reclaimed or healed either).
    pub fn ids(&self, resources: &[ResourceConfig]) -> HashSet<String> {
        let mut ids = self.ids.clone();
        ids.extend(self.dra_ids(resources));
        ids
    }

    /// The DRA device names of our driver that pods hold.
    pub fn dra_device_names(&self) -> &HashSet<String> {
        &self.dra_devices
    }

    /// The device IDs of `resources` that pods hold through DRA.
    pub fn dra_ids(&self, resources: &[ResourceConfig]) -> HashSet<String> {
        self.dra_devices
            .iter()
            .filter_map(|name| {
                resources.iter().find_map(|cfg| {
                    dra_device_index(&cfg.name, cfg.capacity, name).map(|i| device_id(&cfg.name, i))
                })
            })
            .collect()
    }
}

/// The links that look leaked: macvtaps named like device links, on one of
/// the `lowers` (NIC names), whose name is not that of an allocated device.
pub(crate) fn leaked_links(
    links: &[Link],
    lowers: &HashSet<String>,
    allocated: &HashSet<String>,
) -> Vec<Link> {
    let lower_index: HashSet<u32> = links
        .iter()
        .filter(|l| lowers.contains(&l.name))
        .map(|l| l.index)
        .collect();
    let in_use: HashSet<String> = allocated
        .iter()
        .map(|id| link_name_for_device(id))
        .collect();
    links
        .iter()
        .filter(|l| l.is_macvtap() && parse_link_name(&l.name) == Some(DeviceLinkName::Hashed))
        .filter(|l| l.lower_index.is_some_and(|i| lower_index.contains(&i)))
        .filter(|l| !in_use.contains(&l.name))
        .cloned()
        .collect()
}

/// The links the Go device plugin v0.13.1 made that look leaked: macvtaps
/// named after a device ID of one of `resources` (`<name>Mvp<i>`) on that
/// resource's NIC, whose device is not allocated. CNI DEL gives such a link
/// back under that name, so nothing else would ever remove it.
pub(crate) fn go_era_leaked_links(
    links: &[Link],
    resources: &[ResourceConfig],
    allocated: &HashSet<String>,
) -> Vec<Link> {
    let names: HashMap<u32, &str> = links.iter().map(|l| (l.index, l.name.as_str())).collect();
    links
        .iter()
        .filter(|l| l.is_macvtap() && !l.lower_in_other_netns && !allocated.contains(&l.name))
        .filter(|l| {
            let Some(DeviceLinkName::GoEra { resource, .. }) = parse_link_name(&l.name) else {
                return false;
            };
            let lower = l.lower_index.and_then(|i| names.get(&i).copied());
            resources
                .iter()
                .any(|r| r.name == resource && lower == Some(r.lower_device.as_str()))
        })
        .cloned()
        .collect()
}

/// Forgets the handed-out devices that no pod holds (per `allocated`) of
/// resources no longer configured, so the record (and its file) stays
/// within the configured capacity plus what pods hold.
pub(crate) fn forget_unconfigured(
    assignments: &Assignments,
    allocated: &HashSet<String>,
    resources: &[ResourceConfig],
) {
    let names: HashSet<&str> = resources.iter().map(|r| r.name.as_str()).collect();
    assignments.retain(|id, at| allocated.contains(id) || names.contains(at.resource.as_str()));
}

/// A link's identity: its name and ifindex.
pub(crate) fn identity(l: &Link) -> LinkIdentity {
    (l.name.clone(), l.index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_proto::podresources::v1::{ContainerResources, PodResources};
    use test_support::fake::link;

    #[test]
    fn dra_devices_of_our_driver_are_held_as_their_device_ids() {
        use kubelet_proto::podresources::v1::{ClaimResource, DynamicResource};
        let claim = |driver: &str, device: &str| DynamicResource {
            claim_name: "vm-extended-resources-x".into(),
            claim_namespace: "default".into(),
            claim_resources: vec![ClaimResource {
                driver_name: driver.into(),
                pool_name: "node-1".into(),
                device_name: device.into(),
                ..Default::default()
            }],
        };
        let resp = ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "vm".into(),
                namespace: "default".into(),
                containers: vec![ContainerResources {
                    name: "compute".into(),
                    dynamic_resources: vec![
                        claim(DRIVER, "eth1-mvp-2"),
                        claim("gpu.example.com", "eth1-mvp-3"),
                        claim(DRIVER, "eth9-mvp-0"),
                    ],
                    ..Default::default()
                }],
            }],
        };
        let eth1 = ResourceConfig {
            capacity: 4,
            ..ResourceConfig::for_nic("eth1")
        };
        let held = Held::from_response(&resp);
        assert_eq!(held.ids(&[eth1]), HashSet::from(["eth1Mvp2".to_string()]));
        assert!(
            held.ids(&[]).is_empty(),
            "an unserved resource's device is not named"
        );
    }

    #[test]
    fn allocated_ids_are_ours_only() {
        let resp = crate::testdata::pod_with_devices(&[
            ("macvtap.network.kubevirt.io/eth0", "eth0Mvp1"),
            ("nvidia.com/gpu", "GPU-1"),
        ]);
        assert_eq!(
            Held::from_response(&resp).ids(&[]),
            HashSet::from(["eth0Mvp1".to_string()])
        );
    }

    #[test]
    fn only_unallocated_device_macvtaps_on_our_nics_are_leaked() {
        let used = link_name_for_device("eth0Mvp1");
        let free = link_name_for_device("eth0Mvp2");
        let links = vec![
            link(2, "eth0", "veth", None),
            link(3, "eth9", "veth", None),
            link(10, &used, "macvtap", Some(2)),
            link(11, &free, "macvtap", Some(2)),
            link(12, &link_name_for_device("eth9Mvp0"), "macvtap", Some(3)),
            link(13, "macvtap0", "macvtap", Some(2)),
            link(14, &link_name_for_device("eth0Mvp3"), "macvlan", Some(2)),
        ];
        let lowers = HashSet::from(["eth0".to_string()]);
        let allocated = HashSet::from(["eth0Mvp1".to_string()]);
        let leaked = leaked_links(&links, &lowers, &allocated);
        assert_eq!(leaked.iter().map(|l| l.index).collect::<Vec<_>>(), [11]);
    }

    #[test]
    fn go_era_links_of_our_resources_on_their_nics_are_leaked_when_unallocated() {
        let links = vec![
            link(2, "eth0", "veth", None),
            link(3, "eth9", "veth", None),
            link(10, "dpMvp1", "macvtap", Some(2)),
            link(11, "dpMvp2", "macvtap", Some(2)),
            // Another resource's name, the wrong NIC, not a macvtap, no shape.
            link(12, "otherMvp0", "macvtap", Some(2)),
            link(13, "dpMvp3", "macvtap", Some(3)),
            link(14, "dpMvp4", "macvlan", Some(2)),
            link(15, "dpMvpx", "macvtap", Some(2)),
            Link {
                lower_in_other_netns: true,
                ..link(16, "dpMvp5", "macvtap", Some(2))
            },
        ];
        let resources = vec![ResourceConfig {
            name: "dp".into(),
            lower_device: "eth0".into(),
            mode: macvtap_link::MacvtapMode::Bridge,
            capacity: 10,
            placement: None,
        }];
        let allocated = HashSet::from(["dpMvp1".to_string()]);
        let leaked = go_era_leaked_links(&links, &resources, &allocated);
        assert_eq!(leaked.iter().map(|l| l.index).collect::<Vec<_>>(), [11]);
        // The mvt… scan never picks them up itself.
        let lowers = HashSet::from(["eth0".to_string()]);
        assert!(leaked_links(&links, &lowers, &HashSet::new()).is_empty());
    }
}
