//! ADD without a `deviceID`: the device the pod holds through Dynamic
//! Resource Allocation.
//!
//! On a node where the device plugin serves a resource through DRA, the
//! kubelet prepares the pod's claim (our driver creates each device's
//! macvtap on the host, as Allocate does) and lists the devices in
//! PodResources under the pod's `dynamic_resources`, not under `devices`.
//! Released Multus (v4.2.2) looks the NAD's resource up in `devices` only,
//! finds nothing and runs this plugin without `deviceID`. So ADD asks the
//! kubelet itself, with the same single `List` the ownership check makes
//! (`crate::podresources`), for the DRA devices of our driver that the pod
//! named in `CNI_ARGS` holds, and takes one of them ([`candidates`], then
//! [`pick`]):
//!
//! - only the calling pod's own devices are candidates, so another pod's
//!   device is never taken;
//! - the NetConf's optional `resourceName` (the NAD's
//!   `k8s.v1.cni.cncf.io/resourceName`) keeps those of that resource; the
//!   candidates of more than one resource without it are refused, saying
//!   what to add;
//! - among one resource's devices, by index, the first whose link is still
//!   in the host namespace: earlier ADDs of the same pod moved theirs into
//!   the pod, so a pod with two networks on one resource gets two devices,
//!   and the same ones again after a sandbox re-creation, as DEL gives the
//!   links back.
//!
//! The rest of ADD is the `deviceID` path's, and the link's host name goes
//! into its alias as there, so DEL and CHECK need no `deviceID`.
//!
//! `podResourcesCheck` does not soften a failed look-up: without a
//! `deviceID` there is no device to go on with, so an unreachable kubelet
//! fails ADD in `warn` too (code 11, the runtime retries).

use crate::config::NetConf;
use crate::env::CniEnv;
use crate::error::{Error, Result};
use crate::podresources::{self, HeldDevice, PodDevices};
use crate::settings::NodeSettings;
use macvtap_link::{Links, RESOURCE_PREFIX, link_name_for_device, parse_device_id};
use std::collections::BTreeMap;
use tracing::{debug, info};

/// The devices one network of the pod may take: the pod's DRA devices of
/// one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidates {
    /// `namespace/name` of the pod.
    pub(crate) pod: String,
    /// The resource, `macvtap.network.kubevirt.io/<name>`.
    pub(crate) resource: String,
    /// Their device IDs, by device index.
    pub(crate) ids: Vec<String>,
}

/// What the kubelet says one pod holds of ours.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Held<'a> {
    /// Device IDs of our DRA driver's devices.
    pub(crate) dra: Vec<&'a str>,
    /// The device plugin's devices of `macvtap.network.kubevirt.io/…`
    /// resources (only named in messages).
    pub(crate) plugin: Vec<&'a HeldDevice>,
}

/// What pod `namespace/name` holds of ours, or `None` when the kubelet
/// lists no such pod.
pub(crate) fn held_by<'a>(pods: &'a [PodDevices], namespace: &str, name: &str) -> Option<Held<'a>> {
    let prefix = format!("{RESOURCE_PREFIX}/");
    let mut found: Option<Held<'a>> = None;
    for p in pods
        .iter()
        .filter(|p| p.name == name && p.namespace == namespace)
    {
        let held = found.get_or_insert_with(Held::default);
        for id in &p.dra_devices {
            if !held.dra.contains(&id.as_str()) {
                held.dra.push(id);
            }
        }
        held.plugin
            .extend(p.devices.iter().filter(|d| d.resource.starts_with(&prefix)));
    }
    found
}

/// Asks the kubelet (one PodResources `List`) which devices of our DRA
/// driver the pod in `CNI_ARGS` holds, and keeps those this network may
/// take ([`choose_resource`]). The NetConf's `resourceName` is checked
/// first, so a bad one is refused without asking.
pub(crate) fn candidates(
    env: &CniEnv,
    conf: &NetConf,
    settings: &NodeSettings,
) -> Result<Candidates> {
    let wanted = conf
        .resource_name
        .as_deref()
        .map(|full| {
            macvtap_link::resource_short_name(full).map_err(|why| {
                Error::InvalidConfig(format!(
                    "resourceName {} is not a macvtap resource: {why}; give the resource the \
                     NetworkAttachmentDefinition's k8s.v1.cni.cncf.io/resourceName annotation \
                     names, {RESOURCE_PREFIX}/<name>",
                    quoted(full)
                ))
            })
        })
        .transpose()?;
    let (Some(namespace), Some(name)) = (&env.args.pod_namespace, &env.args.pod_name) else {
        return Err(Error::NoDeviceId {
            why: "CNI_ARGS names no pod (K8S_POD_NAMESPACE, K8S_POD_NAME) whose devices \
                  allocated through Dynamic Resource Allocation could stand in"
                .into(),
        });
    };
    let pod = format!("{namespace}/{name}");
    let socket = settings.pod_resources_socket();
    let pods = podresources::list(&socket).map_err(|failure| Error::DraLookupUnavailable {
        pod: pod.clone(),
        socket: socket.display().to_string(),
        msg: failure.to_string(),
        check: settings.pod_resources_check,
    })?;
    let Some(held) = held_by(&pods, namespace, name) else {
        return Err(Error::NoDeviceId {
            why: format!("the kubelet lists no pod {pod}"),
        });
    };
    choose_resource(&pod, &conf.name, &held, wanted)
}

/// The pod's DRA devices this network may take: those of `wanted` (the
/// short name of the NetConf's `resourceName`), else those of the one
/// resource the pod holds any of. `network` is the NetConf's `name`, for
/// the message that asks for a `resourceName`.
pub(crate) fn choose_resource(
    pod: &str,
    network: &str,
    held: &Held<'_>,
    wanted: Option<&str>,
) -> Result<Candidates> {
    let mut by_resource: BTreeMap<&str, Vec<(u32, &str)>> = BTreeMap::new();
    for id in &held.dra {
        if let Some((name, index)) = parse_device_id(id) {
            by_resource.entry(name).or_default().push((index, id));
        }
    }
    for devices in by_resource.values_mut() {
        devices.sort_unstable();
    }
    let full = |name: &str| format!("{RESOURCE_PREFIX}/{name}");
    let (name, devices) = match wanted {
        Some(w) => match by_resource.remove_entry(w) {
            Some(found) => found,
            None => {
                return Err(Error::NoDeviceId {
                    why: format!(
                        "pod {pod} holds no device of {}, the config's resourceName, through \
                         Dynamic Resource Allocation ({})",
                        full(w),
                        holdings(held, &by_resource)
                    ),
                });
            }
        },
        None if by_resource.len() > 1 => {
            let names: Vec<String> = by_resource.keys().map(|n| full(n)).collect();
            return Err(Error::DraResourceAmbiguous {
                pod: pod.to_string(),
                resources: names.join(", "),
                add: names
                    .iter()
                    .map(|n| format!("\"resourceName\": \"{n}\""))
                    .collect::<Vec<_>>()
                    .join(" or "),
                network: network.to_string(),
            });
        }
        None => match by_resource.pop_first() {
            Some(found) => found,
            None => {
                return Err(Error::NoDeviceId {
                    why: format!(
                        "pod {pod} holds no device of driver {} through Dynamic Resource \
                         Allocation ({})",
                        macvtap_link::dra::DRIVER,
                        holdings(held, &by_resource)
                    ),
                });
            }
        },
    };
    Ok(Candidates {
        pod: pod.to_string(),
        resource: full(name),
        ids: devices.into_iter().map(|(_, id)| id.to_string()).collect(),
    })
}

/// What the pod holds of ours, as a phrase for a message.
fn holdings(held: &Held<'_>, dra: &BTreeMap<&str, Vec<(u32, &str)>>) -> String {
    let mut parts: Vec<String> = dra
        .iter()
        .map(|(name, devices)| {
            let ids: Vec<&str> = devices.iter().map(|(_, id)| *id).collect();
            format!("{} of {RESOURCE_PREFIX}/{name}", ids.join(", "))
        })
        .collect();
    if !held.plugin.is_empty() {
        parts.push(format!(
            "the device plugin's {}",
            held.plugin
                .iter()
                .map(|d| format!("{} ({})", d.id, d.resource))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if parts.is_empty() {
        "it holds no macvtap device".into()
    } else {
        format!("it holds {}", parts.join("; "))
    }
}

/// The first of `candidates` whose link is in the host namespace (`host`).
pub(crate) fn pick(candidates: &Candidates, host: &dyn Links, network: &str) -> Result<String> {
    for id in &candidates.ids {
        let link = link_name_for_device(id);
        if host.get_link(&link)?.is_some() {
            info!(
                pod = %candidates.pod,
                network,
                resource = %candidates.resource,
                device_id = %id,
                link = %link,
                "no deviceID: taking the pod's DRA device whose link is on the host"
            );
            return Ok(id.clone());
        }
        debug!(device_id = %id, link = %link, "the DRA device's link is not on the host; next");
    }
    Err(Error::DraDevicesInUse {
        pod: candidates.pod.clone(),
        resource: candidates.resource.clone(),
        devices: candidates
            .ids
            .iter()
            .map(|id| format!("{id} ({})", link_name_for_device(id)))
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// `s` quoted and escaped as Rust writes a string, cut to 100 characters:
/// a hostile value stays short and on one line in a message.
fn quoted(s: &str) -> String {
    const KEEP: usize = 100;
    match s.char_indices().nth(KEEP) {
        Some((cut, _)) => format!("{:?}…", &s[..cut]),
        None => format!("{s:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use macvtap_link::{Kernel, MacvtapMode};
    use test_support::fake::{FakeKernel, HOST};

    fn held<'a>(dra: &[&'a str], plugin: &'a [HeldDevice]) -> Held<'a> {
        Held {
            dra: dra.to_vec(),
            plugin: plugin.iter().collect(),
        }
    }

    #[test]
    fn one_resource_needs_no_resource_name_and_is_sorted_by_index() {
        let c = choose_resource(
            "t/vm",
            "n",
            &held(&["eth1Mvp10", "eth1Mvp2", "eth1Mvp0"], &[]),
            None,
        )
        .unwrap();
        assert_eq!(c.resource, "macvtap.network.kubevirt.io/eth1");
        assert_eq!(c.ids, ["eth1Mvp0", "eth1Mvp2", "eth1Mvp10"]);
        assert_eq!(c.pod, "t/vm");
    }

    #[test]
    fn two_resources_without_resource_name_are_refused_saying_what_to_add() {
        let e = choose_resource(
            "t/vm",
            "dataplane",
            &held(&["eth2Mvp0", "eth1Mvp0"], &[]),
            None,
        )
        .unwrap_err();
        assert_eq!(e.code(), 7, "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains(
                "add \"resourceName\": \"macvtap.network.kubevirt.io/eth1\" or \
                 \"resourceName\": \"macvtap.network.kubevirt.io/eth2\" to the config of the \
                 NetworkAttachmentDefinition of network \"dataplane\""
            ),
            "{msg}"
        );
        assert!(msg.contains("pod t/vm"), "{msg}");
    }

    #[test]
    fn resource_name_keeps_its_own_devices() {
        let h = held(&["eth2Mvp1", "eth1Mvp0", "eth2Mvp0"], &[]);
        let c = choose_resource("t/vm", "n", &h, Some("eth2")).unwrap();
        assert_eq!(c.ids, ["eth2Mvp0", "eth2Mvp1"]);
        assert_eq!(c.resource, "macvtap.network.kubevirt.io/eth2");
        let e = choose_resource("t/vm", "n", &h, Some("eth3")).unwrap_err();
        assert_eq!(e.code(), 100, "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("holds no device of macvtap.network.kubevirt.io/eth3"),
            "{msg}"
        );
        assert!(
            msg.contains("it holds eth1Mvp0 of macvtap.network.kubevirt.io/eth1; eth2Mvp0, eth2Mvp1 of macvtap.network.kubevirt.io/eth2"),
            "{msg}"
        );
    }

    #[test]
    fn no_dra_device_is_code_100_naming_what_the_pod_holds() {
        let plugin = [HeldDevice {
            resource: "macvtap.network.kubevirt.io/dp".into(),
            id: "dpMvp1".into(),
        }];
        let e = choose_resource("t/vm", "n", &held(&[], &plugin), None).unwrap_err();
        assert_eq!(e.code(), 100);
        let msg = e.to_string();
        assert!(
            msg.starts_with("the network configuration has no deviceID, and pod t/vm holds no device of driver macvtap.network.kubevirt.io"),
            "{msg}"
        );
        assert!(
            msg.contains("the device plugin's dpMvp1 (macvtap.network.kubevirt.io/dp)"),
            "{msg}"
        );
        let e = choose_resource("t/vm", "n", &held(&[], &[]), None).unwrap_err();
        assert!(e.to_string().contains("it holds no macvtap device"), "{e}");
    }

    /// A host with NIC `lower0` and the macvtaps of `ids` on it.
    fn host_with(ids: &[&str]) -> FakeKernel {
        let kernel = FakeKernel::new();
        let nic = kernel.add_nic(HOST, "lower0");
        let host = kernel.links(None).unwrap();
        for id in ids {
            host.add_macvtap_at(
                &link_name_for_device(id),
                nic.index,
                MacvtapMode::Bridge,
                None,
                None,
            )
            .unwrap();
        }
        drop(host);
        kernel
    }

    fn candidates_of(ids: &[&str]) -> Candidates {
        Candidates {
            pod: "t/vm".into(),
            resource: "macvtap.network.kubevirt.io/eth1".into(),
            ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn pick_takes_the_first_device_whose_link_is_on_the_host() {
        let c = candidates_of(&["eth1Mvp0", "eth1Mvp1", "eth1Mvp2"]);
        let kernel = host_with(&["eth1Mvp1", "eth1Mvp2"]);
        let host = kernel.links(None).unwrap();
        assert_eq!(pick(&c, host.as_ref(), "n").unwrap(), "eth1Mvp1");
        let kernel = host_with(&["eth1Mvp0", "eth1Mvp2"]);
        let host = kernel.links(None).unwrap();
        assert_eq!(pick(&c, host.as_ref(), "n").unwrap(), "eth1Mvp0");
    }

    #[test]
    fn pick_with_no_link_on_the_host_is_code_101_naming_each_link() {
        let c = candidates_of(&["eth1Mvp0", "eth1Mvp1"]);
        let kernel = host_with(&["otherMvp0"]);
        let host = kernel.links(None).unwrap();
        let e = pick(&c, host.as_ref(), "n").unwrap_err();
        assert_eq!(e.code(), 101);
        let msg = e.to_string();
        for id in ["eth1Mvp0", "eth1Mvp1"] {
            assert!(
                msg.contains(&format!("{id} ({})", link_name_for_device(id))),
                "{msg}"
            );
        }
        assert!(msg.contains("pod t/vm"), "{msg}");
    }

    #[test]
    fn a_pods_devices_are_its_own_and_listed_once() {
        let pod = |ns: &str, name: &str, dra: &[&str]| PodDevices {
            name: name.into(),
            namespace: ns.into(),
            devices: vec![HeldDevice {
                resource: "nvidia.com/gpu".into(),
                id: "GPU-1".into(),
            }],
            dra_devices: dra.iter().map(|s| s.to_string()).collect(),
        };
        let pods = [
            pod("t", "vm", &["eth1Mvp0"]),
            pod("t", "other", &["eth1Mvp1"]),
            pod("u", "vm", &["eth1Mvp2"]),
            // The kubelet may list a pod twice (a re-created pod of the
            // same name); both entries are the pod's.
            pod("t", "vm", &["eth1Mvp0", "eth1Mvp3"]),
        ];
        let h = held_by(&pods, "t", "vm").unwrap();
        assert_eq!(h.dra, ["eth1Mvp0", "eth1Mvp3"]);
        assert!(h.plugin.is_empty(), "not ours: {h:?}");
        assert_eq!(held_by(&pods, "t", "nobody"), None);
    }

    #[test]
    fn a_hostile_value_is_quoted_short_and_on_one_line() {
        assert_eq!(quoted("a\nb"), "\"a\\nb\"");
        let long = "x".repeat(500);
        let q = quoted(&long);
        assert!(q.len() < 110, "{q}");
        assert!(q.ends_with('…'));
        assert_eq!(quoted(&"é".repeat(101)).chars().count(), 103);
    }
}
