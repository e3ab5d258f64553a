//! NodePrepareResources and NodeUnprepareResources of one claim as plain
//! functions on the core: the same `hand_out` as Allocate makes or reuses
//! each device's macvtap, and the claim's CDI spec ([`super::cdi`]) records
//! what was prepared, so both calls are idempotent per claim UID, also
//! across a daemon restart.
//!
//! The kubelet calls prepare before it creates the pod's sandbox and
//! unprepare after the sandbox is stopped (kubernetes
//! `pkg/kubelet/kuberuntime/kuberuntime_manager.go`, `pkg/kubelet/kubelet.go`
//! `SyncTerminatingPod`), so by unprepare the CNI's DEL has given the link
//! back to the host: unprepare deletes it there, unless another prepared
//! claim holds the same device (the scheduler may allocate it again before
//! the kubelet has unprepared the old claim).

use super::cdi::{CdiDir, Prepared, cdi_device_id, check_claim_uid, prepared, spec};
use super::claims::{Allocated, allocated};
use crate::config::ResourceConfig;
use crate::core::host::SharedHost;
use crate::core::ledger::{AllocationClock, Assignments};
use crate::core::link::{PreparedDevice, hand_out};
use crate::error::{Error, Result};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kubelet_proto::dra::v1::Device;
use macvtap_link::link_name_for_device;
use nix::errno::Errno;
use std::collections::HashSet;
use std::sync::Mutex;
use tracing::{info, warn};

/// What prepare and unprepare work with: the node's host, the served
/// resources, the ledger, the CDI directory and this node's pool.
#[derive(Debug)]
pub struct Front<'a, 'k> {
    /// The host the macvtaps are made on.
    pub host: &'a SharedHost<'k>,
    /// The resources this node serves through DRA now.
    pub served: &'a [ResourceConfig],
    /// The leak clock `hand_out` restarts.
    pub clock: &'a AllocationClock,
    /// Which `/dev/tapN` each device was handed out as (for healing).
    pub assignments: &'a Assignments,
    /// The runtime's CDI directory.
    pub cdi: &'a CdiDir,
    /// This node's pool, its name.
    pub pool: &'a str,
    /// Held across each prepare and unprepare, so that an unprepare never
    /// decides from a set of prepared claims that a prepare is changing.
    pub serial: &'a Mutex<()>,
    /// The device IDs pods hold through the device plugin front (the node
    /// switched fronts with them running), as the last reclaim round was
    /// told: never prepared for a claim.
    pub plugin_held: &'a HashSet<String>,
}

/// The kubelet's answer for claim `uid` of pool `pool` whose devices are
/// `devices`: each with its requests and its one CDI device ID.
pub fn answer(uid: &str, pool: &str, devices: &[Prepared]) -> Vec<Device> {
    devices
        .iter()
        .map(|d| Device {
            request_names: d.request_names.clone(),
            pool_name: pool.to_string(),
            device_name: d.device_name.clone(),
            cdi_device_ids: vec![cdi_device_id(uid, &d.device_id)],
            share_id: None,
        })
        .collect()
}

impl Front<'_, '_> {
    /// What claim `uid` was prepared as, if its spec is ours and whole.
    fn recorded(&self, uid: &str) -> Result<Option<Vec<Prepared>>> {
        Ok(self.cdi.read(uid)?.as_ref().and_then(prepared))
    }

    /// Prepares claim `uid`: answered from its spec when it was prepared
    /// before; else `fetch` reads the claim, its devices of this node are
    /// handed out (made or reused, as Allocate does) resource by resource,
    /// and the spec is written. On a failure, every link this call made is
    /// deleted again and no spec is written.
    pub fn prepare(
        &self,
        uid: &str,
        fetch: impl FnOnce() -> Result<ResourceClaim>,
    ) -> Result<Vec<Prepared>> {
        check_claim_uid(uid)?;
        let _serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(devices) = self.recorded(uid)? {
            info!(
                claim_uid = uid,
                "claim prepared before: answered from its CDI spec"
            );
            return Ok(devices);
        }
        let claim = fetch()?;
        let wanted = allocated(&claim, uid, self.pool, self.served)?;
        if let Some(a) = wanted
            .iter()
            .find(|a| self.plugin_held.contains(&a.device_id))
        {
            return Err(Error::Claim {
                claim: format!(
                    "{}/{}",
                    claim.metadata.namespace.as_deref().unwrap_or(""),
                    claim.metadata.name.as_deref().unwrap_or("")
                ),
                why: format!(
                    "its device {} ({}) is held by a pod through the device plugin front \
                     (this node switched to DRA with that pod running); it is offered again once that pod is gone",
                    a.device_name, a.device_id
                ),
            });
        }
        let mut made: Vec<PreparedDevice> = Vec::new();
        let result = self.hand_out_all(&wanted, &mut made).and_then(|devices| {
            self.cdi.write(uid, &spec(uid, &devices))?;
            Ok(devices)
        });
        match result {
            Ok(devices) => Ok(devices),
            Err(e) => {
                self.delete_made(&made);
                Err(e)
            }
        }
    }

    /// Hands out `wanted`, one `hand_out` per resource; every device it
    /// created is pushed to `made`, for the caller's rollback.
    fn hand_out_all(
        &self,
        wanted: &[Allocated],
        made: &mut Vec<PreparedDevice>,
    ) -> Result<Vec<Prepared>> {
        let mut out: Vec<Option<Prepared>> = vec![None; wanted.len()];
        for cfg in self.served {
            let mine: Vec<usize> = (0..wanted.len())
                .filter(|&i| wanted[i].resource == cfg.name)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let ids: Vec<&str> = mine.iter().map(|&i| wanted[i].device_id.as_str()).collect();
            let got = hand_out(self.host, cfg, &ids, self.clock, self.assignments)?;
            for (&i, d) in mine.iter().zip(got) {
                let a = &wanted[i];
                out[i] = Some(Prepared {
                    request_names: a.request_names.clone(),
                    resource: a.resource.clone(),
                    device_id: a.device_id.clone(),
                    device_name: a.device_name.clone(),
                    node: d.node.clone(),
                });
                if d.created {
                    made.push(d);
                }
            }
        }
        out.into_iter()
            .map(|p| p.ok_or_else(|| Error::Task("a claim's device was not handed out".into())))
            .collect()
    }

    /// Deletes the links in `made` (a failed prepare's), quietly.
    fn delete_made(&self, made: &[PreparedDevice]) {
        for d in made {
            let deleted = self
                .host
                .run(|h| h.link_ops().del_link(d.link.index, &d.link.name));
            match deleted {
                Ok(()) => info!(ifname = %d.link.name, "deleted the link of a failed prepare"),
                Err(e) if e.errno() == Some(Errno::ENODEV) => {}
                Err(e) => {
                    warn!(ifname = %d.link.name, error = %e, "could not delete the link of a failed prepare")
                }
            }
        }
    }

    /// Unprepares claim `uid`: each of its devices that no other prepared
    /// claim holds gets its host link deleted (if it is back in the host's
    /// namespace) and leaves the ledger, then the spec goes. A claim with
    /// no spec was never prepared here, or is already unprepared: done.
    pub fn unprepare(&self, uid: &str) -> Result<()> {
        check_claim_uid(uid)?;
        let _serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        let Some(devices) = self.recorded(uid)? else {
            if self.cdi.read(uid)?.is_some() {
                warn!(
                    claim_uid = uid,
                    "the claim's CDI spec is not in our shape; removing it"
                );
                self.cdi.remove(uid)?;
            }
            return Ok(());
        };
        let mut held_elsewhere = Vec::new();
        for other in self.cdi.claims()? {
            if other != uid {
                if let Some(ds) = self.recorded(&other)? {
                    held_elsewhere.extend(ds.into_iter().map(|d| d.device_id));
                }
            }
        }
        for d in &devices {
            if held_elsewhere.contains(&d.device_id) {
                info!(claim_uid = uid, device_id = %d.device_id, "kept: another prepared claim holds the device");
                continue;
            }
            self.give_back(d)?;
        }
        self.cdi.remove(uid)
    }

    /// Deletes device `d`'s link if it is in the host's namespace and a
    /// macvtap (a link of another kind under the name is not ours: left
    /// alone), and forgets its tap node.
    fn give_back(&self, d: &Prepared) -> Result<()> {
        let name = link_name_for_device(&d.device_id);
        self.host.run(|h| -> Result<()> {
            let ops = h.link_ops();
            match ops.get_link(&name)? {
                Some(link) if link.is_macvtap() => match ops.del_link(link.index, &link.name) {
                    Ok(()) => {
                        info!(ifname = %name, device_id = %d.device_id, "unprepared: deleted the device's link");
                        Ok(())
                    }
                    Err(e) if e.errno() == Some(Errno::ENODEV) => Ok(()),
                    Err(e) => Err(Error::device(&d.device_id, &name)(e)),
                },
                Some(_) | None => Ok(()),
            }
        })?;
        self.assignments.retain(|id, _| id != d.device_id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::host::HostPaths;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use macvtap_link::dra::DRIVER;
    use macvtap_link::{MacvtapMode, Op};
    use test_support::fake::{FakeKernel, HOST};

    fn served() -> Vec<ResourceConfig> {
        ["eth1", "eth2"]
            .iter()
            .map(|n| ResourceConfig {
                name: n.to_string(),
                lower_device: n.to_string(),
                mode: MacvtapMode::Bridge,
                capacity: 4,
                placement: None,
            })
            .collect()
    }

    /// A claim of UID `uid` allocated `devices` of our driver from pool `n`.
    fn claim(uid: &str, devices: &[&str]) -> ResourceClaim {
        let results = devices
            .iter()
            .enumerate()
            .map(|(i, d)| DeviceRequestAllocationResult {
                request: format!("container-0-request-{i}"),
                driver: DRIVER.into(),
                pool: "n".into(),
                device: d.to_string(),
                ..Default::default()
            })
            .collect();
        ResourceClaim {
            metadata: ObjectMeta {
                name: Some(format!("claim-{uid}")),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(results),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    struct Node {
        kernel: FakeKernel,
        served: Vec<ResourceConfig>,
        clock: AllocationClock,
        assignments: Assignments,
        cdi_root: tempfile::TempDir,
        serial: Mutex<()>,
        plugin_held: HashSet<String>,
    }

    impl Node {
        fn new() -> Self {
            let kernel = FakeKernel::new();
            kernel.add_nic(HOST, "eth1");
            kernel.add_nic(HOST, "eth2");
            Self {
                kernel,
                served: served(),
                clock: AllocationClock::default(),
                assignments: Assignments::default(),
                cdi_root: tempfile::tempdir().unwrap(),
                serial: Mutex::new(()),
                plugin_held: HashSet::new(),
            }
        }

        /// Runs `f` with a front on this node, as a freshly started daemon
        /// would make it (the CDI directory opened again).
        fn with<T>(&self, f: impl FnOnce(&Front<'_, '_>) -> T) -> T {
            let host = SharedHost::new(&self.kernel, HostPaths::default());
            let cdi = CdiDir::open(&self.cdi_root.path().join("cdi")).unwrap();
            f(&Front {
                host: &host,
                served: &self.served,
                clock: &self.clock,
                assignments: &self.assignments,
                cdi: &cdi,
                pool: "n",
                serial: &self.serial,
                plugin_held: &self.plugin_held,
            })
        }

        fn host_links(&self) -> Vec<String> {
            let mut v: Vec<String> = self
                .kernel
                .links_of(HOST)
                .into_iter()
                .map(|l| l.name)
                .collect();
            v.sort();
            v
        }

        fn specs(&self) -> Vec<String> {
            self.with(|f| f.cdi.claims().unwrap())
        }
    }

    #[test]
    fn a_prepare_makes_the_links_writes_the_spec_and_answers_cdi_ids() {
        let node = Node::new();
        let got = node
            .with(|f| f.prepare("u-1", || Ok(claim("u-1", &["eth1-mvp-2", "eth2-mvp-0"]))))
            .unwrap();
        let got = answer("u-1", "n", &got);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].pool_name, "n");
        assert_eq!(got[0].device_name, "eth1-mvp-2");
        assert_eq!(got[0].request_names, ["container-0-request-0"]);
        assert_eq!(
            got[0].cdi_device_ids,
            ["macvtap.network.kubevirt.io/tap=u-1_eth1Mvp2"]
        );
        assert_eq!(got[1].device_name, "eth2-mvp-0");
        let link = node
            .kernel
            .link(HOST, &link_name_for_device("eth1Mvp2"))
            .unwrap();
        assert_eq!(
            link.lower_index,
            node.kernel.link(HOST, "eth1").map(|l| l.index)
        );
        assert!(
            node.kernel
                .link(HOST, &link_name_for_device("eth2Mvp0"))
                .is_some()
        );
        assert_eq!(node.specs(), ["u-1"]);
        let spec = node.with(|f| f.cdi.read("u-1").unwrap().unwrap());
        let node_path = &spec.devices[0].container_edits.device_nodes[0].path;
        assert_eq!(node_path, &format!("/dev/tap{}", link.index));
        assert_eq!(
            node.assignments.get("eth1Mvp2").map(|a| a.ifindex),
            Some(link.index)
        );
    }

    /// A device a pod holds through the device plugin front (the node
    /// switched to DRA with it running) is refused, and nothing is made.
    #[test]
    fn a_device_held_through_the_device_plugin_is_not_prepared() {
        let mut node = Node::new();
        node.plugin_held.insert("eth1Mvp1".into());
        let err = node
            .with(|f| f.prepare("u-1", || Ok(claim("u-1", &["eth2-mvp-0", "eth1-mvp-1"]))))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("eth1-mvp-1 (eth1Mvp1) is held by a pod through the device plugin front"),
            "{err}"
        );
        assert_eq!(node.host_links(), ["eth1", "eth2"]);
        assert!(node.specs().is_empty());
        node.with(|f| f.prepare("u-2", || Ok(claim("u-2", &["eth1-mvp-0"]))))
            .unwrap();
    }

    #[test]
    fn a_prepared_claim_is_answered_again_from_its_spec_also_after_a_restart() {
        let node = Node::new();
        let first = node
            .with(|f| f.prepare("u-1", || Ok(claim("u-1", &["eth1-mvp-1"]))))
            .unwrap();
        let calls = node.kernel.calls().len();
        // A new front on the same directory, as after a daemon restart: the
        // claim is not fetched again, nothing is asked of the kernel.
        let again = node
            .with(|f| f.prepare("u-1", || panic!("a prepared claim is fetched again")))
            .unwrap();
        assert_eq!(again, first);
        assert_eq!(node.kernel.calls().len(), calls);
    }

    #[test]
    fn an_unprepare_deletes_the_links_and_the_spec_and_is_idempotent() {
        let node = Node::new();
        node.with(|f| f.prepare("u-1", || Ok(claim("u-1", &["eth1-mvp-1", "eth2-mvp-3"]))))
            .unwrap();
        node.with(|f| f.unprepare("u-1")).unwrap();
        assert_eq!(node.host_links(), ["eth1", "eth2"]);
        assert!(node.specs().is_empty());
        assert!(node.assignments.get("eth1Mvp1").is_none());
        node.with(|f| f.unprepare("u-1")).unwrap();
        node.with(|f| f.unprepare("never-prepared")).unwrap();
    }

    #[test]
    fn a_device_another_prepared_claim_holds_keeps_its_link_on_unprepare() {
        let node = Node::new();
        node.with(|f| f.prepare("u-old", || Ok(claim("u-old", &["eth1-mvp-1"]))))
            .unwrap();
        // The scheduler gave the device to a new claim before the kubelet
        // unprepared the old one.
        node.with(|f| f.prepare("u-new", || Ok(claim("u-new", &["eth1-mvp-1"]))))
            .unwrap();
        node.with(|f| f.unprepare("u-old")).unwrap();
        assert!(
            node.kernel
                .link(HOST, &link_name_for_device("eth1Mvp1"))
                .is_some()
        );
        assert_eq!(node.specs(), ["u-new"]);
    }

    #[test]
    fn a_failed_prepare_deletes_every_link_it_made_and_writes_no_spec() {
        let node = Node::new();
        // eth1's device is made, eth2's creation fails.
        node.kernel.fail(Op::AddMacvtap, 2, Errno::EIO);
        let e = node
            .with(|f| f.prepare("u-1", || Ok(claim("u-1", &["eth1-mvp-0", "eth2-mvp-0"]))))
            .unwrap_err();
        assert!(e.to_string().contains("eth2Mvp0"), "{e}");
        assert_eq!(node.host_links(), ["eth1", "eth2"]);
        assert!(node.specs().is_empty());
    }

    #[test]
    fn a_claim_not_for_this_node_changes_nothing() {
        let node = Node::new();
        let e = node
            .with(|f| f.prepare("u-1", || Ok(claim("u-1", &["eth9-mvp-0"]))))
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("eth9-mvp-0 is not one this node serves"),
            "{e}"
        );
        let e = node
            .with(|f| f.prepare("u-1", || Ok(claim("u-2", &["eth1-mvp-0"]))))
            .unwrap_err();
        assert!(e.to_string().contains("not u-1"), "{e}");
        assert_eq!(node.host_links(), ["eth1", "eth2"]);
        assert!(node.specs().is_empty());
        assert!(node.kernel.calls().iter().all(|c| c.op != Op::AddMacvtap));
    }

    #[test]
    fn a_link_of_another_kind_under_the_devices_name_is_left_alone_on_unprepare() {
        let node = Node::new();
        node.with(|f| f.prepare("u-1", || Ok(claim("u-1", &["eth1-mvp-1"]))))
            .unwrap();
        let name = link_name_for_device("eth1Mvp1");
        let link = node.kernel.link(HOST, &name).unwrap();
        node.with(|f| f.host.run(|h| h.link_ops().del_link(link.index, &name)))
            .unwrap();
        node.kernel.add_nic(HOST, &name);
        node.with(|f| f.unprepare("u-1")).unwrap();
        assert!(node.kernel.link(HOST, &name).is_some());
        assert!(node.specs().is_empty());
    }
}
