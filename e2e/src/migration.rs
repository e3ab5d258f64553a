//! A KubeVirt live migration of a VM on our macvtap, between two sandbox
//! nodes on one L2 segment ([`crate::switch::Segment`]), with a peer host
//! pinging the VM every 10 ms throughout. Used by `tests/migration.rs` (one
//! migration per variant, asserting what can fail) and by the benchmark
//! (`bench/migration.rs`, several migrations per variant, reporting loss).
//!
//! What each node does is what a real node does for the source and the
//! target virt-launcher pods: the kubelet allocates a device of the same
//! resource (our real device plugin makes the macvtap), the runtime runs
//! Multus, which runs our CNI with the `deviceID` and, because the VM sets
//! `macAddress`, `MAC=` in `CNI_ARGS` on ADD (Multus v4.2.2
//! `pkg/multus/multus.go` `getRuntimeConfig`/`cmdAdd`; DEL from its cache
//! with `prevResult`); our CNI binary is run here directly in that shape,
//! because Multus reads PodResources from one fixed host path and two
//! nodes live in this one host. The PodResources check is enforced against
//! each node's own test kubelet. QEMU runs as uid 107 on the pod's
//! `/dev/tapN` (see [`crate::vm`]); the target QEMU waits with `-incoming`
//! and the source migrates to it through QMP, as libvirt drives QEMU for a
//! KubeVirt migration (`migrate` with a `unix:` URI, then `query-migrate`
//! until `completed`). In KubeVirt each QEMU also talks to a unix socket,
//! and virt-handler's migration proxy joins the two over the network
//! (`pkg/virt-handler/migration-proxy/migration-proxy.go`); here both ends
//! share one socket, since the nodes share one host. QEMU's own
//! announcement after the switchover (RARP, the `announce-*` defaults)
//! stays on.

use crate::guest::{self, Guest, SERVING};
use crate::icmp::{Figures, Pinger};
use crate::node::{
    Allocation, CniCall, FAST_RECLAIM, GUEST_IP, Node, PEER_IP, binary, run_cni, tap_nodes,
};
use crate::qmp::Qmp;
use crate::sandbox::TestNs;
use crate::switch::Segment;
use crate::vm::{GuestNet, Netdev, Qemu, QemuExtras, give_to_qemu};
use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use test_kubelet::PluginClient;
use test_support::capture::{Capture, Frame};

/// The VM's MAC, set in its spec (`macAddress`), as a migratable macvtap VM
/// needs.
pub const VM_MAC: &str = "02:00:c0:00:02:02";
/// The resource both nodes advertise.
pub const RESOURCE: &str = "dataplane";
/// The network name in the VM spec, hence KubeVirt's pod interface name.
const NETWORK: &str = "dataplane";
/// The NAD.
const NAD: &str = r#"{"cniVersion":"1.0.0","name":"dataplane","type":"macvtap","mtu":1500}"#;
/// The device plugin's configuration on both nodes.
const CONF: &str = r#"[{"name":"dataplane","lowerDevice":"lower0","mode":"bridge","capacity":20}]"#;
/// How often the peer pings the VM.
pub const PING_INTERVAL: Duration = Duration::from_millis(10);
/// How long a request may wait for its reply before it counts as lost.
const REPLY_GRACE: Duration = Duration::from_secs(1);
/// Guest RAM: small, so that a migration under TCG is quick.
const GUEST_MIB: u32 = 128;
/// The scenario's lead: the migration starts this long after the target
/// pod's CNI ADD. In KubeVirt the target virt-launcher pod runs for seconds
/// before the migration starts (virt-launcher starts, virt-handler prepares
/// the domain, libvirt starts QEMU with `-incoming`); 2 s is a low
/// estimate. It is part of the scenario measured, the same in both
/// variants, not a wait for an event.
pub const TARGET_LEAD: Duration = Duration::from_secs(2);
/// Deadlines (never latency targets).
const BOOT: Duration = Duration::from_secs(180);
const MIGRATE: Duration = Duration::from_secs(120);
const AFTER: Duration = Duration::from_secs(30);
/// Replies from the target that end the measurement.
const REPLIES_AFTER: usize = 20;

/// How the target pod's link behaves between its CNI ADD and the VM's
/// arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Our CNI as it is: no IPv6 on the pod-side link, so it sends nothing.
    Silent,
    /// IPv6 re-enabled on the pod-side link right after ADD, so the kernel
    /// sends MLD reports, a DAD probe and router solicitations from the
    /// VM's MAC, as the Go project's CNI leaves it.
    Chatty,
}

impl Variant {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Silent => "silent link",
            Variant::Chatty => "chatty link",
        }
    }
}

/// The binaries a node runs.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// Our `macvtap` CNI plugin.
    pub cni: PathBuf,
    /// Our `macvtap-deviceplugin`.
    pub device_plugin: PathBuf,
}

impl Binaries {
    /// The workspace's builds next to the running executable.
    pub fn workspace() -> Result<Self> {
        Ok(Binaries {
            cni: binary("macvtap-cni", "macvtap")?,
            device_plugin: binary("macvtap-deviceplugin", "macvtap-deviceplugin")?,
        })
    }
}

/// One node: the sandbox node, its plugin client and its CNI settings.
pub struct Host {
    /// The sandbox node.
    pub node: Node,
    client: PluginClient,
    settings: PathBuf,
    next_device: u32,
}

/// A virt-launcher pod: its namespace, device and CNI result.
pub struct Pod {
    /// Which host (0 or 1) it runs on.
    pub host: usize,
    /// Its network namespace.
    pub ns: TestNs,
    /// Its name (`virt-launcher-…`).
    pub name: String,
    /// KubeVirt's pod interface name for the network.
    pub ifname: String,
    /// The device the kubelet allocated.
    pub alloc: Allocation,
    add_result: String,
    /// Its QEMU's work dir (console, QMP socket).
    pub work: tempfile::TempDir,
}

/// A VM running (or waiting for a migration) in a pod.
pub struct Vm {
    /// The pod.
    pub pod: Pod,
    /// The QEMU process.
    pub qemu: Qemu,
    qmp: Qmp,
}

/// What one migration measured and saw.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The variant.
    pub variant: Variant,
    /// Ping loss, longest gap and time from switchover to the first reply.
    pub figures: Figures,
    /// QEMU's own downtime estimate (`query-migrate` `downtime`, ms).
    pub downtime_ms: Option<u64>,
    /// From the `migrate` command to `completed` being seen.
    pub migration: Duration,
    /// The switch port that had the VM's MAC just before `migrate`.
    pub port_before: Option<String>,
    /// Frames from the VM's MAC that the target node sent into the switch
    /// (captured on its switch port) from before the target pod's CNI ADD
    /// until `migrate`: what its link said while the VM still ran on the
    /// source.
    pub target_frames: Vec<Frame>,
    /// The switch port that has the VM's MAC once the target answers.
    pub port_after: Option<String>,
    /// The target's run state once it answered.
    pub target_status: String,
}

/// `d` in milliseconds, as people write it.
pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

impl Outcome {
    /// One sentence saying what the migration measured.
    pub fn describe(&self) -> String {
        let f = &self.figures;
        let port = |p: &Option<String>| p.clone().unwrap_or_else(|| "no port".into());
        format!(
            "{}: migration took {}, QEMU's downtime {}; {} of {} pings lost, longest gap {}, \
             longest round trip {}, first reply {} after the switchover; the target node sent \
             {} frames from the VM's MAC before the migration; the switch had the VM's MAC on \
             {} before the migration and on {} after",
            self.variant.name(),
            ms(self.migration),
            self.downtime_ms
                .map_or_else(|| "unknown".to_string(), |d| format!("{d} ms")),
            f.lost,
            f.sent,
            ms(f.longest_gap),
            ms(f.max_rtt),
            f.to_first_reply
                .map_or_else(|| "never came".to_string(), ms),
            self.target_frames.len(),
            port(&self.port_before),
            port(&self.port_after),
        )
    }
}

/// The two nodes on their segment, the guest and a socket dir both QEMUs
/// reach.
pub struct Cluster {
    /// Node A (index 0) and node B (index 1).
    pub hosts: Vec<Host>,
    /// The segment; dropped after the hosts.
    pub segment: Segment,
    bins: Binaries,
    guest: Guest,
    shared: tempfile::TempDir,
    taps_before: Vec<String>,
    namespaces: Vec<String>,
}

/// The switch port of node `i`.
pub fn port(i: usize) -> String {
    format!("node{}", ["a", "b"].get(i).copied().unwrap_or("x"))
}

impl Cluster {
    /// Makes the segment, two nodes on it (each with its test kubelet,
    /// PodResources and our device plugin on `lower0`, resource
    /// [`RESOURCE`]) and builds the guest.
    pub async fn start(bins: Binaries) -> Result<Self> {
        let segment = Segment::new()?;
        let taps_before = tap_nodes();
        let mut hosts = Vec::new();
        for i in 0..2 {
            // Node B's macvtaps get indices from 100 on, node A's from 3:
            // see `Segment::node`.
            let mut node = segment.node(&port(i), if i == 0 { 0 } else { 96 })?;
            node.start_kubelet().await?;
            node.start_pod_resources().await?;
            node.start_device_plugin_bin(&bins.device_plugin, CONF, &FAST_RECLAIM)?;
            let client = node.plugin(RESOURCE, 20).await?;
            let settings = node.kubelet_dir.path().join("macvtap.settings.json");
            std::fs::write(
                &settings,
                json!({"kubeletDir": node.kubelet_dir.path(), "podResourcesCheck": "enforce"})
                    .to_string(),
            )?;
            hosts.push(Host {
                node,
                client,
                settings,
                next_device: 0,
            });
        }
        let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-guest");
        let guest = tokio::task::block_in_place(|| guest::build(&cache))?;
        let shared = tempfile::tempdir()?;
        give_to_qemu(shared.path())?;
        let mut namespaces = vec![segment.switch.name.clone(), segment.peer.name.clone()];
        namespaces.extend(hosts.iter().map(|h| h.node.ns.name.clone()));
        Ok(Cluster {
            hosts,
            segment,
            bins,
            guest,
            shared,
            taps_before,
            namespaces,
        })
    }

    /// A new virt-launcher pod on host `host`: the kubelet allocates a
    /// device, PodResources lists it for the pod, our CNI's ADD runs as
    /// Multus runs it (with `MAC=`); [`Variant::Chatty`] then re-enables
    /// IPv6 on the pod-side link.
    pub async fn pod(&mut self, host: usize, variant: Variant) -> Result<Pod> {
        let h = self.hosts.get_mut(host).context("no such host")?;
        let device = format!("{RESOURCE}Mvp{}", h.next_device);
        h.next_device += 1;
        let name = format!("virt-launcher-vm-migrate-{}{}", port(host), h.next_device);
        let alloc = Node::allocate(&mut h.client, &device).await?;
        h.node.hold_pod(
            "default",
            &name,
            &format!("{}/{RESOURCE}", macvtap_link::RESOURCE_PREFIX),
            &[&device],
        )?;
        let ns = TestNs::new("pod")?;
        let ifname = crate::multus::kubevirt_pod_ifname(NETWORK);
        let mut conf: Value = serde_json::from_str(NAD)?;
        conf["deviceID"] = Value::from(device.as_str());
        let args = format!(
            "IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name};\
             K8S_POD_INFRA_CONTAINER_ID=sandbox-{};MAC={VM_MAC}",
            ns.name
        );
        let (cni, node_ns, settings) = (
            self.bins.cni.clone(),
            h.node.ns.name.clone(),
            h.settings.clone(),
        );
        let ns_path = ns.path();
        let add_result = tokio::task::block_in_place(|| {
            run_cni(&CniCall {
                cni: &cni,
                node_ns: &node_ns,
                command: "ADD",
                netns: &ns_path,
                ifname: &ifname,
                args: &args,
                conf: &conf.to_string(),
                settings: Some(&settings),
            })
        })
        .with_context(|| format!("CNI ADD of {device} for pod {name}"))?;
        if variant == Variant::Chatty {
            crate::sandbox::sh(&[
                "ip",
                "netns",
                "exec",
                &ns.name,
                "sysctl",
                "-q",
                "-w",
                &format!("net.ipv6.conf.{ifname}.disable_ipv6=0"),
            ])?;
        }
        let work = tempfile::tempdir()?;
        Ok(Pod {
            host,
            ns,
            name,
            ifname,
            alloc,
            add_result,
            work,
        })
    }

    fn spawn_qemu(&self, pod: &Pod, incoming: Option<String>) -> Result<(Qemu, PathBuf)> {
        let qmp = pod.work.path().join("qmp.sock");
        let net = GuestNet {
            mac: VM_MAC.into(),
            ip: GUEST_IP.into(),
            peer: PEER_IP.into(),
            tries: 1,
        };
        let qemu = Qemu::spawn_with(
            &pod.ns.name,
            &Netdev::TapNode(&pod.alloc.host_path),
            &self.guest,
            &net,
            "vmtest.mode=serve",
            pod.work.path(),
            &QemuExtras {
                memory_mib: GUEST_MIB,
                qmp: Some(qmp.clone()),
                incoming,
            },
        )?;
        Ok((qemu, qmp))
    }

    /// Boots the VM in `pod` (the guest configures [`GUEST_IP`] and keeps
    /// running) and waits until it says so on its console.
    pub fn boot(&self, pod: Pod) -> Result<Vm> {
        let (mut qemu, qmp_path) = self.spawn_qemu(&pod, None)?;
        let deadline = Instant::now() + BOOT;
        loop {
            if let Some(status) = qemu.process.child.try_wait()? {
                bail!(
                    "QEMU exited with {status} while the guest booted; console:\n{}",
                    qemu.console_text()
                );
            }
            if qemu.console_text().contains(SERVING) {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "the guest did not come up within {BOOT:?}; console:\n{}",
                qemu.console_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let qmp = Qmp::connect(&qmp_path, Duration::from_secs(10))?;
        Ok(Vm { pod, qemu, qmp })
    }

    /// Migrates `vm` to host `to` while the peer pings it every 10 ms: a
    /// new pod there (its Allocate and CNI ADD, link behaving as `variant`,
    /// every frame it sends into the switch captured on `to`'s port),
    /// QEMU with `-incoming` on a unix socket, `migrate` once
    /// [`TARGET_LEAD`] has passed since that ADD, `query-migrate` until
    /// `completed`; then waits for `REPLIES_AFTER` replies after the
    /// switchover, stops the source QEMU and deletes the source pod (CNI
    /// DEL, device freed). Returns the VM on its new pod and what was seen.
    pub async fn migrate(
        &mut self,
        mut vm: Vm,
        to: usize,
        variant: Variant,
    ) -> Result<(Vm, Outcome)> {
        let vm_ip: Ipv4Addr = GUEST_IP
            .split('/')
            .next()
            .unwrap_or_default()
            .parse()
            .context("the guest's address")?;
        let pinger = Pinger::start(&self.segment.peer, vm_ip, PING_INTERVAL)?;
        ensure!(
            tokio::task::block_in_place(
                || pinger.wait_for(Duration::from_secs(30), |l| l.first_reply().is_some())
            ),
            "the VM on {} never answered the peer's pings; console:\n{}",
            port(vm.pod.host),
            vm.qemu.console_text()
        );
        // From before the target pod's link exists until `migrate`.
        let capture = Capture::start(&self.segment.switch, &port(to))?;
        let target = self.pod(to, variant).await?;
        let added = Instant::now();
        let uri = format!("unix:{}", self.shared.path().join("migrate.sock").display());
        let _ = std::fs::remove_file(self.shared.path().join("migrate.sock"));
        let (target_qemu, target_qmp) = self.spawn_qemu(&target, Some(uri.clone()))?;
        let mut target_vm = Vm {
            pod: target,
            qemu: target_qemu,
            qmp: Qmp::connect(&target_qmp, Duration::from_secs(30))?,
        };
        let status = target_vm.qmp.status()?;
        ensure!(
            status == "inmigrate",
            "the target QEMU is {status}, not waiting for a migration"
        );
        let outcome = tokio::task::block_in_place(|| -> Result<Outcome> {
            if let Some(wait) = (added + TARGET_LEAD).checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let vm_mac = test_support::capture::mac(VM_MAC)?;
            let target_frames: Vec<Frame> = capture
                .stop()?
                .into_iter()
                .filter(|f| !f.outgoing && f.src == vm_mac)
                .collect();
            let port_before = self.segment.port_of(VM_MAC)?;
            let started = Instant::now();
            vm.qmp
                .execute("migrate", Some(json!({ "uri": uri })))
                .context("starting the migration on the source QEMU")?;
            let (completed, info) = loop {
                let info = vm
                    .qmp
                    .execute("query-migrate", None)
                    .context("asking the source QEMU how the migration goes")?;
                match info["status"].as_str() {
                    Some("completed") => break (Instant::now(), info),
                    Some("failed") | Some("cancelled") => bail!(
                        "the migration {}: {}",
                        info["status"].as_str().unwrap_or_default(),
                        info["error-desc"].as_str().unwrap_or("QEMU gave no reason")
                    ),
                    _ => {}
                }
                ensure!(
                    started.elapsed() < MIGRATE,
                    "the migration did not complete within {MIGRATE:?}: {info}"
                );
                std::thread::sleep(Duration::from_millis(5));
            };
            let answered = pinger.wait_for(AFTER, |l| l.replies_after(completed) >= REPLIES_AFTER);
            let target_status = match target_vm.qmp.status() {
                Ok(s) => s,
                Err(e) => {
                    // Seen twice under a cold build's load: the target QEMU
                    // gone after `completed`; say how it ended.
                    let exit = target_vm.qemu.process.child.try_wait();
                    let mut stderr = String::new();
                    // Read only from a QEMU that exited: a live one's
                    // stderr would block.
                    if let (Ok(Some(_)), Some(err)) =
                        (&exit, target_vm.qemu.process.child.stderr.as_mut())
                    {
                        use std::io::Read;
                        let _ = err.read_to_string(&mut stderr);
                    }
                    return Err(e.context(format!(
                        "asking the target QEMU after the migration completed ({}); its exit: {exit:?}; its stderr:\n{stderr}\nits console:\n{}",
                        info["status"],
                        target_vm.qemu.console_text()
                    )));
                }
            };
            let port_after = self.segment.port_of(VM_MAC)?;
            let log = pinger.stop(REPLY_GRACE)?;
            ensure!(
                answered,
                "the VM did not answer {REPLIES_AFTER} pings within {AFTER:?} of the switchover \
                 (it answered {}); target {target_status}, MAC on switch port {port_after:?}; \
                 target console:\n{}",
                log.replies_after(completed),
                target_vm.qemu.console_text()
            );
            Ok(Outcome {
                variant,
                figures: log.figures(completed),
                downtime_ms: info["downtime"].as_u64(),
                migration: completed.duration_since(started),
                port_before,
                target_frames,
                port_after,
                target_status,
            })
        })?;
        // libvirt destroys the source domain after a completed migration;
        // then the source pod goes.
        vm.qemu.process.stop();
        self.delete_pod(vm.pod)?;
        Ok((target_vm, outcome))
    }

    /// Stops `vm`'s QEMU and deletes its pod.
    pub fn stop(&self, mut vm: Vm) -> Result<()> {
        vm.qemu.process.stop();
        self.delete_pod(vm.pod)
    }

    /// The pod's deletion: CNI DEL as Multus runs it (from its cache, with
    /// `prevResult`), the namespace removed, the device no longer held.
    pub fn delete_pod(&self, pod: Pod) -> Result<()> {
        let h = self.hosts.get(pod.host).context("no such host")?;
        let mut conf: Value = serde_json::from_str(NAD)?;
        conf["deviceID"] = Value::from(pod.alloc.device_id.as_str());
        conf["prevResult"] =
            serde_json::from_str(&pod.add_result).context("the CNI ADD result is not JSON")?;
        let args = format!(
            "IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME={};\
             K8S_POD_INFRA_CONTAINER_ID=sandbox-{}",
            pod.name, pod.ns.name
        );
        tokio::task::block_in_place(|| {
            run_cni(&CniCall {
                cni: &self.bins.cni,
                node_ns: &h.node.ns.name,
                command: "DEL",
                netns: &pod.ns.path(),
                ifname: &pod.ifname,
                args: &args,
                conf: &conf.to_string(),
                settings: Some(&h.settings),
            })
        })
        .with_context(|| format!("CNI DEL of pod {}", pod.name))?;
        drop(pod.ns);
        h.node.hold(
            &format!("{}/{RESOURCE}", macvtap_link::RESOURCE_PREFIX),
            &[],
        )?;
        Ok(())
    }

    /// After every pod is deleted: waits for each device plugin to reclaim
    /// its links, stops it (exit 0), and checks that no macvtap is left on
    /// either node and no `/dev/tapN` of ours; then removes every namespace
    /// and checks they are gone.
    pub fn finish(mut self) -> Result<()> {
        for h in &mut self.hosts {
            tokio::task::block_in_place(|| h.node.wait_for_reclaim())?;
            h.node.stop_device_plugin()?;
            let left: Vec<String> = h
                .node
                .ns
                .links()?
                .into_iter()
                .filter(|l| l.starts_with("mvt"))
                .collect();
            ensure!(
                left.is_empty(),
                "macvtaps left on {}: {left:?}",
                h.node.ns.name
            );
        }
        let extra: Vec<String> = tap_nodes()
            .into_iter()
            .filter(|t| !self.taps_before.contains(t))
            .collect();
        ensure!(extra.is_empty(), "tap nodes left behind: {extra:?}");
        let namespaces = std::mem::take(&mut self.namespaces);
        drop(self);
        let left: Vec<&String> = namespaces
            .iter()
            .filter(|n| Path::new("/run/netns").join(n).exists())
            .collect();
        ensure!(left.is_empty(), "namespaces left behind: {left:?}");
        Ok(())
    }
}
