//! The node's ResourceSlices (`resource.k8s.io/v1`) as plain values: the
//! devices each served resource offers, cut into slices, and what must
//! change in the API server for the published slices to say that.
//!
//! One pool per node, named after the node. Every device of resource
//! `<name>` is an exclusive device named by
//! [`macvtap_link::dra::dra_device_name`] with the attributes the fronts
//! share (the extended resource name, the device ID, the NIC, the mode). A
//! device whose NIC is unhealthy carries the taint [`UNHEALTHY_TAINT`] with
//! effect `NoSchedule`: the scheduler allocates it to no new claim, and a
//! pod already holding it keeps it (`resource.k8s.io/v1` `DeviceTaint`,
//! kubernetes/api `resource/v1/types.go`). Since any tainted device in a
//! slice lowers the slice's limit from 128 devices to 64, every slice holds
//! at most [`MAX_DEVICES`], so a NIC going down never has to re-cut the pool.
//!
//! A change is published as the API asks of a pool (kubernetes/api
//! `resource/v1/types.go`, `ResourcePool`): every slice of the new state
//! carries one generation, higher than any published before, and the number
//! of slices in the pool; consumers ignore slices of an older generation.

use crate::config::ResourceConfig;
use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use macvtap_link::device_id;
use macvtap_link::dra::{
    ATTR_DEVICE_ID, ATTR_MODE, ATTR_NIC, ATTR_RESOURCE_NAME, DRIVER, dra_device_name,
};
use std::collections::{BTreeMap, BTreeSet};
use xxhash_rust::xxh64::xxh64;

/// Most devices in one slice: the API's limit for a slice in which any
/// device has a taint.
pub const MAX_DEVICES: usize = 64;

/// The taint key on the devices of a resource whose NIC is unhealthy; its
/// value is the reason (`nic_down`, `nic_missing`, `nic_enslaved`,
/// `nic_port_in_the_way`).
pub const UNHEALTHY_TAINT: &str = "macvtap.network.kubevirt.io/nic-unhealthy";

/// One served resource as the slices show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Offered {
    /// The resource.
    pub cfg: ResourceConfig,
    /// Why its NIC is unhealthy (a `NicHealth` reason), or `None`.
    pub unhealthy: Option<&'static str>,
    /// The indices of its devices that pods hold through the device plugin
    /// front (the node switched fronts with them running): not offered
    /// until given back.
    pub withheld: BTreeSet<u32>,
}

impl Offered {
    /// The indices of the devices offered, in order.
    pub fn indices(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.cfg.capacity).filter(|i| !self.withheld.contains(i))
    }
}

/// A string attribute.
fn text(value: String) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(value),
        ..Default::default()
    }
}

/// The devices `offered` publish, resource after resource, each in index
/// order.
pub fn devices(offered: &[Offered]) -> Vec<Device> {
    let mut out = Vec::new();
    for o in offered {
        let cfg = &o.cfg;
        let taints = o.unhealthy.map(|reason| {
            vec![DeviceTaint {
                key: UNHEALTHY_TAINT.to_string(),
                value: Some(reason.to_string()),
                effect: "NoSchedule".to_string(),
                time_added: None,
            }]
        });
        for i in o.indices() {
            let attributes = BTreeMap::from([
                (ATTR_RESOURCE_NAME.to_string(), text(cfg.resource_name())),
                (ATTR_DEVICE_ID.to_string(), text(device_id(&cfg.name, i))),
                (ATTR_NIC.to_string(), text(cfg.lower_device.clone())),
                (ATTR_MODE.to_string(), text(cfg.mode.to_string())),
            ]);
            out.push(Device {
                name: dra_device_name(&cfg.name, i),
                attributes: Some(attributes),
                taints: taints.clone(),
                ..Default::default()
            });
        }
    }
    out
}

/// The name of slice `k` of `node`'s pool: `<node>-macvtap-<k>`, the node's
/// name cut and hashed when it would not fit a DNS subdomain.
pub fn slice_name(node: &str, k: usize) -> String {
    const KEEP: usize = 253 - "-macvtap-".len() - 20;
    if node.len() <= KEEP {
        format!("{node}-macvtap-{k}")
    } else {
        let hash = xxh64(node.as_bytes(), 0) & 0xffff_ffff;
        let cut = node[..KEEP - 9].trim_end_matches(['-', '.']);
        format!("{cut}-{hash:08x}-macvtap-{k}")
    }
}

/// The node's slices for `devices` at `generation`: cut at [`MAX_DEVICES`],
/// one slice with no devices when there are none (so consumers see the pool
/// is empty rather than unpublished).
pub fn slices(node: &str, devices: Vec<Device>, generation: i64) -> Vec<ResourceSlice> {
    let mut chunks: Vec<Vec<Device>> = devices
        .chunks(MAX_DEVICES)
        .map(<[Device]>::to_vec)
        .collect();
    if chunks.is_empty() {
        chunks.push(Vec::new());
    }
    let count = chunks.len() as i64;
    chunks
        .into_iter()
        .enumerate()
        .map(|(k, devices)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(node, k)),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: DRIVER.to_string(),
                node_name: Some(node.to_string()),
                pool: ResourcePool {
                    name: node.to_string(),
                    generation,
                    resource_slice_count: count,
                },
                devices: Some(devices),
                ..Default::default()
            },
        })
        .collect()
}

/// One write to the API server.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Create this slice.
    Create(ResourceSlice),
    /// Replace the slice of this name (its `resourceVersion` set, so a
    /// concurrent writer makes the replace fail rather than be lost).
    Replace(ResourceSlice),
    /// Delete the slice of this name.
    Delete(String),
}

/// A published device as we would write it: the API server fills in a
/// taint's `timeAdded`, which is not ours to compare.
fn as_written(d: &Device) -> Device {
    let mut d = d.clone();
    if let Some(taints) = d.taints.as_mut() {
        for t in taints {
            t.time_added = None;
        }
    }
    d
}

/// Whether `published` (the node's slices of our driver, as listed) already
/// say exactly `devices`: one complete pool of one generation, cut as
/// [`slices`] cuts it, under the names it gives.
fn up_to_date(node: &str, published: &[ResourceSlice], devices: &[Device]) -> bool {
    let Some(first) = published.first() else {
        return false;
    };
    let generation = first.spec.pool.generation;
    let mut want = slices(node, devices.to_vec(), generation);
    let mut have: Vec<ResourceSlice> = published
        .iter()
        .map(|s| ResourceSlice {
            metadata: ObjectMeta {
                name: s.metadata.name.clone(),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                devices: s
                    .spec
                    .devices
                    .as_ref()
                    .map(|ds| ds.iter().map(as_written).collect()),
                ..s.spec.clone()
            },
        })
        .collect();
    let by_name = |s: &ResourceSlice| s.metadata.name.clone();
    want.sort_by_key(by_name);
    have.sort_by_key(by_name);
    want == have
}

/// What to write so that `published` (the node's slices of our driver)
/// become the pool of `devices`: nothing when they already say it; else
/// every slice of the new state at a generation above every published one
/// (created, or replaced at its `resourceVersion`), and every other slice
/// deleted.
pub fn plan(node: &str, published: &[ResourceSlice], devices: Vec<Device>) -> Vec<Change> {
    if up_to_date(node, published, &devices) {
        return Vec::new();
    }
    let generation = published
        .iter()
        .map(|s| s.spec.pool.generation)
        .max()
        .map_or(1, |g| g + 1);
    let wanted = slices(node, devices, generation);
    let mut changes = Vec::new();
    for mut s in wanted.iter().cloned() {
        match published
            .iter()
            .find(|p| p.metadata.name == s.metadata.name)
        {
            Some(p) => {
                s.metadata.resource_version = p.metadata.resource_version.clone();
                changes.push(Change::Replace(s));
            }
            None => changes.push(Change::Create(s)),
        }
    }
    for p in published {
        let Some(name) = &p.metadata.name else {
            continue;
        };
        if !wanted
            .iter()
            .any(|w| w.metadata.name.as_ref() == Some(name))
        {
            changes.push(Change::Delete(name.clone()));
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use macvtap_link::MacvtapMode;

    fn cfg(name: &str, nic: &str, capacity: u32) -> ResourceConfig {
        ResourceConfig {
            name: name.into(),
            lower_device: nic.into(),
            mode: MacvtapMode::Bridge,
            capacity,
            placement: None,
        }
    }

    /// `changes` applied to `published` as the API server would apply them,
    /// with a new `resourceVersion` on each write and `timeAdded` filled in.
    fn apply(published: &mut Vec<ResourceSlice>, changes: &[Change], rv: &mut u64) {
        let stamp = |mut s: ResourceSlice, rv: &mut u64| {
            *rv += 1;
            s.metadata.resource_version = Some(rv.to_string());
            for d in s.spec.devices.iter_mut().flatten() {
                for t in d.taints.iter_mut().flatten() {
                    t.time_added.get_or_insert_with(|| {
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default())
                    });
                }
            }
            s
        };
        for c in changes {
            match c {
                Change::Create(s) => {
                    assert!(!published.iter().any(|p| p.metadata.name == s.metadata.name));
                    published.push(stamp(s.clone(), rv));
                }
                Change::Replace(s) => {
                    let p = published
                        .iter_mut()
                        .find(|p| p.metadata.name == s.metadata.name)
                        .expect("replaced slice exists");
                    assert_eq!(p.metadata.resource_version, s.metadata.resource_version);
                    *p = stamp(s.clone(), rv);
                }
                Change::Delete(name) => {
                    published.retain(|p| p.metadata.name.as_ref() != Some(name))
                }
            }
        }
    }

    #[test]
    fn each_device_carries_the_names_multus_and_the_cni_read() {
        let eth1 = cfg("eth1", "eth1", 2);
        let ds = devices(&[Offered {
            cfg: eth1.clone(),
            unhealthy: None,
            withheld: Default::default(),
        }]);
        assert_eq!(ds.len(), 2);
        assert_eq!(ds[1].name, "eth1-mvp-1");
        let attr = |k: &str| {
            ds[1].attributes.as_ref().unwrap()[k]
                .string
                .clone()
                .unwrap()
        };
        assert_eq!(attr(ATTR_RESOURCE_NAME), "macvtap.network.kubevirt.io/eth1");
        assert_eq!(attr(ATTR_DEVICE_ID), "eth1Mvp1");
        assert_eq!(attr(ATTR_NIC), "eth1");
        assert_eq!(attr(ATTR_MODE), "bridge");
        assert_eq!(ds[1].taints, None);
    }

    #[test]
    fn an_unhealthy_nics_devices_are_tainted_no_schedule_with_the_reason() {
        let eth1 = cfg("eth1", "eth1", 1);
        let ds = devices(&[Offered {
            cfg: eth1.clone(),
            unhealthy: Some("nic_down"),
            withheld: Default::default(),
        }]);
        let t = &ds[0].taints.as_ref().unwrap()[0];
        assert_eq!(
            (t.key.as_str(), t.value.as_deref(), t.effect.as_str()),
            (UNHEALTHY_TAINT, Some("nic_down"), "NoSchedule")
        );
    }

    #[test]
    fn a_pool_is_cut_at_64_devices_with_its_count_and_one_generation() {
        let (a, b) = (cfg("eth1", "eth1", 100), cfg("eth2", "eth2", 30));
        let ds = devices(&[
            Offered {
                cfg: a.clone(),
                unhealthy: None,
                withheld: Default::default(),
            },
            Offered {
                cfg: b.clone(),
                unhealthy: None,
                withheld: Default::default(),
            },
        ]);
        let s = slices("node-1", ds, 7);
        assert_eq!(
            s.iter()
                .map(|s| s.spec.devices.as_ref().unwrap().len())
                .collect::<Vec<_>>(),
            [64, 64, 2]
        );
        for (k, s) in s.iter().enumerate() {
            assert_eq!(
                s.metadata.name.as_deref(),
                Some(format!("node-1-macvtap-{k}").as_str())
            );
            assert_eq!(
                s.spec.pool,
                ResourcePool {
                    name: "node-1".into(),
                    generation: 7,
                    resource_slice_count: 3
                }
            );
            assert_eq!(s.spec.node_name.as_deref(), Some("node-1"));
            assert_eq!(s.spec.driver, DRIVER);
        }
        let names: std::collections::BTreeSet<_> = s
            .iter()
            .flat_map(|s| s.spec.devices.clone().unwrap())
            .map(|d| d.name)
            .collect();
        assert_eq!(names.len(), 130, "device names are unique in the pool");
    }

    #[test]
    fn no_device_is_one_empty_slice() {
        let s = slices("n", Vec::new(), 1);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].spec.devices, Some(Vec::new()));
        assert_eq!(s[0].spec.pool.resource_slice_count, 1);
    }

    #[test]
    fn slice_names_fit_a_dns_subdomain_for_the_longest_node_names() {
        let long = format!("{}.example", "a".repeat(240));
        let n = slice_name(&long, 12);
        assert!(n.len() <= 253, "{}", n.len());
        assert!(n.ends_with("-macvtap-12"));
        assert_ne!(slice_name(&format!("{long}x"), 12), n);
    }

    #[test]
    fn nothing_is_written_while_the_published_pool_says_the_same() {
        let (mut published, mut rv) = (Vec::new(), 0);
        let eth1 = cfg("eth1", "eth1", 70);
        let offered = [Offered {
            cfg: eth1.clone(),
            unhealthy: Some("nic_down"),
            withheld: Default::default(),
        }];
        let first = plan("n", &published, devices(&offered));
        assert!(
            matches!(first.as_slice(), [Change::Create(_), Change::Create(_)]),
            "{first:?}"
        );
        apply(&mut published, &first, &mut rv);
        assert_eq!(plan("n", &published, devices(&offered)), Vec::new());
    }

    #[test]
    fn a_change_bumps_the_generation_everywhere_and_deletes_what_is_left_over() {
        let (mut published, mut rv) = (Vec::new(), 0);
        let (big, small) = (cfg("eth1", "eth1", 100), cfg("eth1", "eth1", 10));
        let first = plan(
            "n",
            &published,
            devices(&[Offered {
                cfg: big.clone(),
                unhealthy: None,
                withheld: Default::default(),
            }]),
        );
        apply(&mut published, &first, &mut rv);
        assert_eq!(published.len(), 2);
        let changes = plan(
            "n",
            &published,
            devices(&[Offered {
                cfg: small.clone(),
                unhealthy: None,
                withheld: Default::default(),
            }]),
        );
        assert!(
            matches!(changes.as_slice(), [Change::Replace(_), Change::Delete(name)] if name == "n-macvtap-1"),
            "{changes:?}"
        );
        apply(&mut published, &changes, &mut rv);
        assert_eq!(published.len(), 1);
        assert_eq!(published[0].spec.pool.generation, 2);
        assert_eq!(published[0].spec.pool.resource_slice_count, 1);
        // Health changes are changes too.
        let down = plan(
            "n",
            &published,
            devices(&[Offered {
                cfg: small.clone(),
                unhealthy: Some("nic_down"),
                withheld: Default::default(),
            }]),
        );
        assert!(matches!(down.as_slice(), [Change::Replace(s)] if s.spec.pool.generation == 3));
    }

    #[test]
    fn a_pool_left_half_written_is_rewritten_above_its_highest_generation() {
        // A daemon killed between two writes leaves slices of two generations.
        let eth1 = cfg("eth1", "eth1", 100);
        let mut published = slices(
            "n",
            devices(&[Offered {
                cfg: eth1.clone(),
                unhealthy: None,
                withheld: Default::default(),
            }]),
            4,
        );
        published[1].spec.pool.generation = 5;
        for (i, p) in published.iter_mut().enumerate() {
            p.metadata.resource_version = Some(i.to_string());
        }
        let changes = plan(
            "n",
            &published,
            devices(&[Offered {
                cfg: eth1.clone(),
                unhealthy: None,
                withheld: Default::default(),
            }]),
        );
        assert_eq!(changes.len(), 2);
        for c in changes {
            let Change::Replace(s) = c else {
                panic!("{c:?}")
            };
            assert_eq!(s.spec.pool.generation, 6);
        }
    }

    #[test]
    fn a_slice_of_another_shape_is_deleted() {
        let eth1 = cfg("eth1", "eth1", 1);
        let mut stray = slices("n", Vec::new(), 1).remove(0);
        stray.metadata.name = Some("n-macvtap-9".into());
        let changes = plan(
            "n",
            &[stray],
            devices(&[Offered {
                cfg: eth1.clone(),
                unhealthy: None,
                withheld: Default::default(),
            }]),
        );
        assert!(
            matches!(changes.as_slice(), [Change::Create(s), Change::Delete(d)]
            if s.spec.pool.generation == 2 && d == "n-macvtap-9"),
            "{changes:?}"
        );
    }
}
