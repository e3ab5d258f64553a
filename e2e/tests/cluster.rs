//! The product on a real node: `hack/cluster.sh` (etcd, kube-apiserver,
//! controller-manager, scheduler, kube-proxy, containerd with Debian's runc,
//! the kubelet, Multus thick) runs our DaemonSet installed as the README
//! says (`kubectl apply -k` of a kustomization that only overrides the
//! image; as shipped, the node's own NIC left out (a `MacvtapNICsLeftOut`
//! Event); a first VM with the README's defaults, no ConfigMap, on the
//! resource auto-discovery names after the NIC, with `--discover-kinds=veth`
//! as README says for veth NICs; then the ConfigMap of explicit resources
//! naming the node's NIC, applied live), and VM pods as KubeVirt renders them run QEMU on the `/dev/tapN` that
//! containerd made from our DeviceSpec. The node's NIC is a veth whose peer
//! sits in a namespace of this test, with TEST-NET-2 addresses; the test
//! pings the guests from there and counts every lost reply.
//!
//! Checked, in order: the DaemonSet Ready and the node's allocatable; a VM
//! pod (uid 107, the resource in requests and limits, the Multus selection
//! with interface `pod` + 11 hex and a MAC) whose guest answers pings; a
//! pod over capacity Pending with the scheduler's `Insufficient`; the
//! kubelet killed and started again (re-registration, allocatable back, not
//! one ping lost, a new VM pod starts); our daemon's container killed (the
//! kubelet restarts it, not one ping lost, nothing leaks); a rollout to
//! another image tag with not one ping lost; the DaemonSet deleted with
//! `--cascade=orphan`, applied again (adopting the pod) and restarted
//! with `kubectl rollout restart`, which is not an uninstall (issue 44:
//! not one ping lost; links, tap nodes, the record, the CNI and its
//! settings unchanged; the old pod logs `not an uninstall` and removes
//! nothing); `/metrics` from the node;
//! `doctor` in our pod, then with the NIC down (Events on the Node, the
//! problem named); RBAC enough (no Forbidden in our logs) and no more (a
//! verb removed shows); the VM pods deleted and nothing of them left;
//! uninstall with `kubectl delete -k` while one VM pod's sandbox is being
//! re-created and another pod sits between Allocate and ADD (issue 44:
//! the NAD deleted holds both windows open; the uninstall keeps both links
//! and the CNI with its settings, says so in its log and in a
//! `MacvtapUninstallKept` Event on the Node, or says the API server
//! refused that Event, and both pods start once the NAD is back; deleted,
//! then README's manual clean-up, nothing of ours is left), then an
//! install with the chart (`helm test`'s doctor passing, a VM pinging on
//! it) and `helm uninstall` (a
//! leaked link of ours deleted, the CNI and its settings removed, the VM's
//! link just handed out kept until README's manual step), leaving nothing
//! of ours (the CNI, its settings, the record, device plugin sockets,
//! macvtaps, RBAC, the namespace). A second test runs DRA mode on the same
//! cluster (`cluster/dra.rs`), a third a resource served by a node
//! selector as the Node is labelled and unlabelled (`cluster/labels.rs`),
//! a fourth the Go project's and cluster-network-addons-operator's
//! DaemonSets with our image, each then replaced by ours with a VM pinging
//! (`cluster/migrations.rs`), a fifth the chart's upgrades under a pinging
//! VM (`cluster/helm_upgrades.rs`).
//!
//! The cluster uses the node's fixed paths (`/var/lib/kubelet`,
//! `/opt/cni/bin`, `/dev`), so this test holds the locks every test that
//! uses them takes, and `hack/test.sh` runs it after the rest of the suite.
//! It brings the cluster up (reusing one that runs) and down again when it
//! brought it up (`MACVTAP_CLUSTER_KEEP=1` keeps it, to look around).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "cluster/dra.rs"]
mod dra;
#[path = "cluster/dra_faults.rs"]
mod dra_faults;
#[path = "cluster/dra_switch.rs"]
mod dra_switch;
#[path = "cluster/helm_upgrades.rs"]
mod helm_upgrades;
#[path = "cluster/labels.rs"]
mod labels;
#[path = "cluster/migrations.rs"]
mod migrations;
#[path = "cluster/namespace_move.rs"]
mod namespace_move;

use anyhow::{Context, Result, bail, ensure};
use macvtap_e2e::cluster::realnode::{
    DAEMON, DS, HostNic, IMAGE_REPO, NIC, NS, RESOURCE_PREFIX, VM_IMAGE, WAIT, macvtaps_on_nic,
};
use macvtap_e2e::cluster::{Cluster, NODE, last_lines, realnode, vm_rootfs};
use macvtap_e2e::icmp::Pinger;
use macvtap_e2e::sandbox::{TestNs, ip, require_root};
use macvtap_e2e::steps::Steps;
use macvtap_e2e::{guest, node_locks};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The Helm release the chart step installs.
const HELM_RELEASE: &str = "macvtap-e2e";
/// cluster-network-addons-operator's namespace.
const CNAO_NS: &str = "cluster-network-addons";
const RESOURCE: &str = "macvtap.network.kubevirt.io/dataplane";
/// The devices auto-discovery gives each NIC (README, "A first VM").
const DISCOVERED_CAPACITY: i64 = 100;
const CAPACITY: i64 = 2;
/// Our daemon's record on the node.
const RECORD_DIR: &str = "/var/lib/kubelet/device-plugins/macvtap-deviceplugin";
const PING_EVERY: Duration = Duration::from_millis(200);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// This machine's physical NICs that auto-discovery looks at as shipped:
/// links with a device behind them (`/sys/class/net/<name>/device`), up
/// or down, that no master holds (it offers those the node does not use,
/// [`node_uses`]).
fn physical_nics() -> Result<Vec<String>> {
    let mut nics = Vec::new();
    for e in std::fs::read_dir("/sys/class/net")? {
        let e = e?;
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        let dir = e.path();
        if dir.join("device").exists() && !dir.join("master").exists() {
            nics.push(name);
        }
    }
    nics.sort();
    Ok(nics)
}

/// Whether the node uses `nic` itself, as `ip` shows it: a global
/// address on it, or a default route (IPv4 or IPv6, any table) leaving
/// through it.
fn node_uses(nic: &str) -> Result<bool> {
    let addrs: Vec<Value> = serde_json::from_str(&ip(&[
        "-j", "address", "show", "dev", nic, "scope", "global",
    ])?)?;
    let has_address = addrs
        .iter()
        .any(|a| a["addr_info"].as_array().is_some_and(|i| !i.is_empty()));
    let mut routes = false;
    for family in ["-4", "-6"] {
        let out = ip(&[family, "-j", "route", "show", "table", "all", "default"])?;
        let list: Vec<Value> =
            serde_json::from_str(if out.trim().is_empty() { "[]" } else { &out })?;
        routes |= list.iter().any(|r| {
            r["dev"] == nic
                || r["nexthops"]
                    .as_array()
                    .is_some_and(|h| h.iter().any(|h| h["dev"] == nic))
        });
    }
    Ok(has_address || routes)
}

fn tap_nodes() -> BTreeSet<String> {
    std::fs::read_dir("/dev")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with("tap") && n[3..].chars().all(|c| c.is_ascii_digit()))
                .collect()
        })
        .unwrap_or_default()
}

struct Run<'a> {
    c: &'a Cluster,
    steps: Steps,
}

impl Run<'_> {
    fn allocatable(&self) -> Result<Option<i64>> {
        self.allocatable_of(RESOURCE)
    }

    /// The node's allocatable count of `resource`, if it lists it.
    fn allocatable_of(&self, resource: &str) -> Result<Option<i64>> {
        let node = self.c.get_json(&["node", NODE])?;
        Ok(node["status"]["allocatable"][resource]
            .as_str()
            .and_then(|v| v.parse().ok()))
    }

    fn wait_allocatable(&self, want: i64) -> Result<()> {
        self.wait_allocatable_of(RESOURCE, want)
    }

    fn wait_allocatable_of(&self, resource: &str, want: i64) -> Result<()> {
        self.c
            .wait(&format!("allocatable {resource} = {want}"), WAIT, || {
                Ok((self.allocatable_of(resource)? == Some(want)).then_some(()))
            })
    }

    fn daemon_pod(&self) -> Result<Value> {
        let pods = self
            .c
            .get_json(&["-n", NS, "pods", "-l", "name=macvtap-cni"])?;
        let items = pods["items"].as_array().cloned().unwrap_or_default();
        let live: Vec<Value> = items
            .into_iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .collect();
        ensure!(
            live.len() == 1,
            "{} live pods of the DaemonSet, not 1",
            live.len()
        );
        Ok(live[0].clone())
    }

    fn ds_ready(&self) -> Result<Option<()>> {
        self.ds_ready_in(NS)
    }

    /// Whether the DaemonSet `macvtap-cni` of namespace `ns` has its one pod
    /// Ready and up to date.
    fn ds_ready_in(&self, ns: &str) -> Result<Option<()>> {
        realnode::ds_ready_in(self.c, ns)
    }

    fn wait_ds_ready(&self) -> Result<()> {
        realnode::wait_ds_ready(self.c)
    }

    /// Waits for the DaemonSet's rollout (`kubectl rollout status`), then
    /// for it Ready and up to date.
    fn rollout_done(&self) -> Result<()> {
        self.c.kubectl(&[
            "-n",
            NS,
            "rollout",
            "status",
            &format!("ds/{DS}"),
            "--timeout=180s",
        ])?;
        self.wait_ds_ready()
    }

    /// Follows the log of our daemon's container in pod `pod` until the
    /// container ends ([`Cluster::log_to_end`]).
    fn follow_daemon_log(&self, pod: &str) -> Result<macvtap_e2e::cluster::LogFollower> {
        self.c.follow_logs(
            &format!("the daemon pod {pod}"),
            &["-n", NS, pod, "-c", DAEMON],
        )
    }

    fn daemon_logs(&self) -> Result<String> {
        realnode::daemon_logs(self.c)
    }

    fn pod_phase(&self, name: &str) -> Result<String> {
        let p = self.c.get_json(&["-n", "default", "pod", name])?;
        Ok(p["status"]["phase"].as_str().unwrap_or("").to_string())
    }

    /// The tap node (`tapN`) the VM pod `name`'s QEMU opened, from its
    /// `VMPOD tap=/dev/tapN` log line.
    fn vm_tap_node(&self, name: &str) -> Result<String> {
        let log = self.c.kubectl(&["-n", "default", "logs", name])?;
        log.lines()
            .find_map(|l| l.strip_prefix("VMPOD tap=/dev/"))
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_string)
            .with_context(|| {
                format!(
                    "{name} logged no VMPOD tap= line:\n{}",
                    last_lines(&log, 15)
                )
            })
    }

    /// The uid of the pod `name` of namespace `default` (a pod of an
    /// earlier run with that name is another object, with its own Events).
    fn pod_uid(&self, name: &str) -> Result<String> {
        let p = self.c.get_json(&["-n", "default", "pod", name])?;
        p["metadata"]["uid"]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("pod {name} has no uid"))
    }

    /// The container ID of the VM pod `name`'s container when it runs.
    fn vm_container_running(&self, name: &str) -> Result<Option<String>> {
        let p = self.c.get_json(&["-n", "default", "pod", name])?;
        let st = &p["status"]["containerStatuses"][0];
        Ok(st["state"]["running"]
            .is_object()
            .then(|| st["containerID"].as_str().unwrap_or("").to_string()))
    }

    /// Starts a VM pod as KubeVirt's virt-launcher pod looks to us, on the
    /// network `dataplane` and its [`RESOURCE`], and waits for its guest to
    /// serve.
    fn start_vm(&self, name: &str, mac: &str, guest_ip: Ipv4Addr) -> Result<()> {
        self.start_vm_on(RESOURCE, name, mac, guest_ip)
    }

    /// Deletes the VM pods `names` of namespace `default` and waits until
    /// they are gone (their DEL has run).
    fn delete_vm_pods(&self, names: &[&str]) -> Result<()> {
        realnode::delete_vm_pods(self.c, names)
    }

    /// Waits (up to the reclaim's grace and interval) until no macvtap is
    /// on the NIC and `/dev` has no tap node beyond `taps_before`.
    fn wait_reclaimed(&self, what: &str, taps_before: &BTreeSet<String>) -> Result<()> {
        self.c.wait(what, Duration::from_secs(300), || {
            Ok((macvtaps_on_nic()?.is_empty()
                && tap_nodes().difference(taps_before).next().is_none())
            .then_some(()))
        })
    }

    /// A VM pod on `resource` whose guest answers a ping from `peer`, then
    /// deleted: returns the macvtaps on the NIC once DEL gave its link back
    /// (none of ours may be there before).
    fn vm_pings_then_goes(
        &self,
        peer: &TestNs,
        resource: &str,
        (name, mac, ip): (&str, &str, Ipv4Addr),
    ) -> Result<Vec<String>> {
        self.start_vm_on(resource, name, mac, ip)?;
        guest_answers(peer, name, ip)?;
        self.delete_vm_pods(&[name])?;
        self.c
            .wait(&format!("the CNI giving {name}'s link back"), WAIT, || {
                let links = macvtaps_on_nic()?;
                Ok((!links.is_empty()).then_some(links))
            })
    }

    /// [`Self::start_vm`] with the NAD `dataplane` on `resource`.
    fn start_vm_on(&self, resource: &str, name: &str, mac: &str, guest_ip: Ipv4Addr) -> Result<()> {
        self.apply_vm_pod(resource, name, mac, guest_ip)?;
        self.wait_vm_serving(name)
    }

    /// `kubectl delete -k` of the kustomization in `dir`, waiting for what
    /// it deletes, then for our namespace to be gone.
    fn delete_kustomization(&self, dir: &Path) -> Result<()> {
        self.c.kubectl(&[
            "delete",
            "-k",
            &dir.to_string_lossy(),
            "--wait=true",
            "--timeout=180s",
        ])?;
        self.wait_our_namespace_gone()
    }

    /// `helm install` of the test's release (namespace `default`) from the
    /// repository's chart, laid out as the kustomize base (our objects in
    /// macvtap-system, which the chart makes and `helm uninstall` deletes),
    /// with our image `tag` and the [`resource_list`] of `capacity`.
    fn helm_install_as_base(&self, tag: &str, capacity: i64) -> Result<()> {
        let chart = repo().join("charts/macvtap-rs");
        self.c.helm(&[
            "install",
            HELM_RELEASE,
            &chart.to_string_lossy(),
            "--namespace",
            "default",
            "--set",
            &format!("namespace.name={NS}"),
            "--set",
            "namespace.create=true",
            "--set",
            &format!("image.repository={IMAGE_REPO}"),
            "--set",
            &format!("image.tag={tag}"),
            "--set-json",
            &format!("macvtapResources={}", resource_list(capacity)),
        ])?;
        Ok(())
    }

    /// `helm uninstall` of the test's release, waiting for what it deletes,
    /// then for our namespace (the release's `namespace.create`) to be gone.
    fn helm_uninstall(&self) -> Result<()> {
        self.c.helm(&[
            "uninstall",
            HELM_RELEASE,
            "--namespace",
            "default",
            "--wait",
            "--timeout",
            "180s",
        ])?;
        self.wait_our_namespace_gone()
    }

    /// Waits until our namespace is gone.
    fn wait_our_namespace_gone(&self) -> Result<()> {
        self.c.wait(&format!("namespace {NS} gone"), WAIT, || {
            let out = self
                .c
                .kubectl(&["get", "namespace", NS, "--ignore-not-found"])?;
            Ok(out.trim().is_empty().then_some(()))
        })
    }

    /// Creates the VM pod of [`Self::start_vm_on`] without waiting for it.
    fn apply_vm_pod(
        &self,
        resource: &str,
        name: &str,
        mac: &str,
        guest_ip: Ipv4Addr,
    ) -> Result<()> {
        realnode::apply_vm_pod(self.c, resource, name, mac, guest_ip)
    }

    /// Waits until the VM pod `name` is Running and its guest serves.
    fn wait_vm_serving(&self, name: &str) -> Result<()> {
        self.c.wait(&format!("VM pod {name} Running"), WAIT, || {
            let phase = self.pod_phase(name)?;
            ensure!(phase != "Failed", "pod {name} failed");
            Ok((phase == "Running").then_some(()))
        })?;
        self.c
            .wait(&format!("the guest of {name} serving"), WAIT, || {
                let log = self.c.kubectl(&["-n", "default", "logs", name])?;
                ensure!(!log.contains("VMPOD no /dev/tap"), "{log}");
                if log.contains(guest::SERVING) {
                    return Ok(Some(()));
                }
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                bail!("its console so far ends:\n{}", tail.join("\n"))
            })?;
        Ok(())
    }
}

/// Starts the VM pod `name` (MAC `mac`, guest `ip`), then pings its guest
/// from `peer` every [`PING_EVERY`] until it has answered 5 pings, within a
/// minute: returns the pinger, still pinging.
fn start_pinged_vm(
    run: &Run,
    peer: &TestNs,
    (name, mac, ip): (&str, &str, Ipv4Addr),
) -> Result<Pinger> {
    run.start_vm(name, mac, ip)?;
    let t0 = Instant::now();
    let pinger = Pinger::start(peer, ip, PING_EVERY)?;
    ensure!(
        pinger.wait_for(Duration::from_secs(60), |l| l.replies_after(t0) >= 5),
        "the guest of {name} ({ip}) did not answer 5 pings from the peer within 60 s"
    );
    Ok(pinger)
}

/// Whether the guest at `ip` of the VM pod `name` answers a ping from
/// `peer` within a minute.
fn guest_answers(peer: &TestNs, name: &str, ip: Ipv4Addr) -> Result<()> {
    let pinger = Pinger::start(peer, ip, PING_EVERY)?;
    ensure!(
        pinger.wait_for(Duration::from_secs(60), |l| l.first_reply().is_some()),
        "the guest of {name} ({ip}) should answer a ping from the peer; none answered in 60 s"
    );
    Ok(())
}

/// The message of an Event of `reason` about the pod whose uid is `uid`
/// (namespace `default`), if there is one.
fn pod_event(c: &Cluster, uid: &str, reason: &str) -> Result<Option<String>> {
    let evs = c.get_json(&["-n", "default", "events"])?;
    let items = evs["items"].as_array().cloned().unwrap_or_default();
    Ok(items
        .iter()
        .find(|e| e["reason"] == reason && e["involvedObject"]["uid"] == uid)
        .map(|e| e["message"].as_str().unwrap_or("").to_string()))
}

/// Our daemon's record on the node (`assignments.json` and its journal),
/// as text; empty where a file is missing.
fn record_text() -> String {
    let dir = Path::new(RECORD_DIR);
    ["assignments.json", "assignments.journal"]
        .iter()
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap_or_default())
        .collect()
}

/// The CNI binary and its settings as the init container installs them
/// on the node.
const CNI_FILES: [&str; 2] = ["/opt/cni/bin/macvtap", "/opt/cni/bin/macvtap.settings.json"];

/// The bytes of [`CNI_FILES`], in that order; fails naming a missing one.
fn cni_files() -> Result<Vec<Vec<u8>>> {
    CNI_FILES
        .iter()
        .map(|f| std::fs::read(f).with_context(|| format!("reading {f}")))
        .collect()
}

/// The pid of the sandbox (the `pause` process) of the pod whose uid is
/// `uid`: the process whose `comm` is `pause` in that pod's cgroup. The
/// cluster's kubelet uses cgroupfs on cgroup v1, whose path holds
/// `pod<uid>`; the systemd driver writes the uid with underscores.
fn pause_pid_of(uid: &str) -> Result<u32> {
    let dashed = format!("pod{uid}");
    let underscored = format!("pod{}", uid.replace('-', "_"));
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cg) = std::fs::read_to_string(e.path().join("cgroup")) else {
            continue;
        };
        if !cg.contains(&dashed) && !cg.contains(&underscored) {
            continue;
        }
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == "pause" {
            found.push(pid);
        }
    }
    match found.as_slice() {
        [one] => Ok(*one),
        other => bail!(
            "the pod with uid {uid} should have 1 pause process in its cgroup, found {}: {other:?}",
            other.len()
        ),
    }
}

/// README's manual clean-up (*Uninstall*) of what an uninstall kept because
/// pods still held our devices, run once those pods are deleted: the `sh`
/// block README gives, taken from README itself and run with bash (it
/// removes `/opt/cni/bin/macvtap` and its settings and deletes every
/// macvtap named `mvt` and 12 lower-case hex digits). Returns the
/// macvtaps that were on the NIC before it ran.
fn manual_leftover_cleanup() -> Result<Vec<String>> {
    let script = readme_sh_block("Once the pods that held devices are gone")?;
    ensure!(
        script.contains("/opt/cni/bin/macvtap"),
        "README's manual step changed shape:\n{script}"
    );
    let before = macvtaps_on_nic()?;
    run_readme_sh(None, &script, "README's manual step")?;
    Ok(before)
}

/// The first `sh` block of README after the text `after`.
fn readme_sh_block(after: &str) -> Result<String> {
    let readme = std::fs::read_to_string(repo().join("README.md"))?;
    let script = readme
        .split_once(after)
        .and_then(|(_, rest)| rest.split_once("```sh\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .with_context(|| format!("README has no sh block after {after:?}"))?
        .0;
    Ok(script.to_string())
}

/// Runs `script` (`what`, a block of README) with bash as a user would:
/// `-euo pipefail`, from the repository. Given the cluster `c`, with the
/// test's kubectl and helm first on the `PATH` and the cluster's admin
/// kubeconfig as `KUBECONFIG`.
fn run_readme_sh(c: Option<&Cluster>, script: &str, what: &str) -> Result<()> {
    let mut cmd = std::process::Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", script])
        .current_dir(repo());
    if let Some(c) = c {
        let mut path = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .collect::<Vec<_>>();
        for tool in [
            macvtap_e2e::manifests::helm()?,
            test_kubelet::tools::venv_tool("kubectl"),
        ] {
            path.insert(
                0,
                tool.parent().context("a tool without a dir")?.to_path_buf(),
            );
        }
        cmd.env("PATH", std::env::join_paths(path)?)
            .env("KUBECONFIG", &c.env().kubeconfig);
    }
    let out = cmd.output()?;
    ensure!(
        out.status.success(),
        "{what} failed ({}):\n{script}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Requests sent from `from` to `to` and how many of them got no reply,
/// read once every request of the window had a second for its reply (the
/// pinger has sent one more than a second after `to`).
fn lost_between(pinger: &Pinger, from: Instant, to: Instant) -> Result<(usize, usize)> {
    let settled = to + Duration::from_secs(1);
    ensure!(
        pinger.wait_for(Duration::from_secs(30), |l| l
            .sent
            .last()
            .is_some_and(|s| *s > settled)),
        "the pinger stopped sending"
    );
    let log = pinger.log();
    let mut sent = 0;
    let mut lost = 0;
    for (s, r) in log.sent.iter().zip(&log.replied) {
        if *s >= from && *s <= to {
            sent += 1;
            if r.is_none() {
                lost += 1;
            }
        }
    }
    Ok((sent, lost))
}

/// Runs `scenario` on the real node: root, the node's locks, the cluster
/// up (what an earlier run left on a cluster found running removed first),
/// then the scenario, the clean-up whatever its outcome, and the steps'
/// summary.
fn on_the_real_node(scenario: impl FnOnce(&mut Run) -> Result<()>) -> Result<()> {
    require_root()?;
    // The node's fixed paths are shared with other tests: tap nodes first,
    // then the kubelet's dirs, in the order every holder takes them.
    let _tap_lock = test_support::tap_node_lock()?;
    let _dirs = node_locks::lock_node_dirs()?;
    let cluster = Cluster::up()?;
    let mut run = Run {
        c: &cluster,
        steps: Steps::new(),
    };
    // A cluster found running may hold what an earlier run of a test here
    // left (MACVTAP_CLUSTER_KEEP, or a run that was killed): removed first.
    if !cluster.started_here() {
        run.steps
            .step("the cluster was running: what an earlier run left, removed");
        clean_up(&run)?;
    }
    let outcome = scenario(&mut run);
    let cleanup = clean_up(&run);
    run.steps.finish();
    println!("{}", run.steps.summary());
    outcome.and(cleanup)
}

/// The resource list of the tests' ConfigMaps and chart values:
/// `dataplane` on the test's NIC, bridge mode, with `capacity` devices.
fn resource_list(capacity: i64) -> Value {
    json!([{"name": "dataplane", "lowerDevice": NIC, "mode": "bridge", "capacity": capacity}])
}

/// What a test of VM pods sets up first: the node's NIC and the peer host
/// beyond it (its namespace named `peer`), our image as `tag` (of
/// `IMAGE_REPO`) and the VM pod's image. Returns the peer and the NIC, in
/// the order they are to be dropped in.
fn vm_setup(run: &mut Run, peer: &str, tag: &str) -> Result<(TestNs, HostNic)> {
    run.steps.step("the node's NIC and the peer host");
    let peer = TestNs::new(peer)?;
    let nic = HostNic::add(&peer)?;
    run.steps
        .step("our image (hack/cluster.sh image) and the VM pod's image");
    run.c.import_our_image(&format!("{IMAGE_REPO}:{tag}"))?;
    realnode::import_vm_image(run.c)?;
    Ok((peer, nic))
}

#[test]
fn the_daemonset_and_vm_pods_on_a_real_node() -> Result<()> {
    on_the_real_node(scenario)
}

/// DRA mode on the real node (`cluster/dra.rs`), on the cluster the test
/// above leaves or brings up, holding the same locks.
#[test]
fn dra_mode_on_a_real_node() -> Result<()> {
    on_the_real_node(|run| {
        let tag = "e2e-dra";
        let (peer, _nic) = vm_setup(run, "clpeerd", tag)?;
        dra::dra_mode(run, &peer, tag)
    })
}

/// Upgrades with the chart under a pinging VM on the real node
/// (`cluster/helm_upgrades.rs`): another tag, `macvtapResources` changed
/// and unset, a ConfigMap made by hand adopted, a namespace change
/// refused, a rollback; not one ping lost. Same cluster and locks.
#[test]
fn helm_upgrades_keep_the_node_on_a_real_node() -> Result<()> {
    on_the_real_node(|run| {
        let tags = ("e2e-up-a", "e2e-up-b");
        let (peer, _nic) = vm_setup(run, "clpeeru", tags.0)?;
        run.steps.step("our image's second tag");
        run.c
            .import_our_image(&format!("{IMAGE_REPO}:{}", tags.1))?;
        helm_upgrades::upgrades_keep_the_node(run, &peer, tags)
    })
}

/// A resource with a node selector on the real node (`cluster/labels.rs`):
/// the Node labelled, it appears; the label removed, it goes, live. On the
/// cluster the tests above leave or bring up, holding the same locks.
#[test]
fn node_selected_resource_follows_the_node_label_on_a_real_node() -> Result<()> {
    on_the_real_node(|run| {
        run.steps.step("the node's NIC and the peer host");
        let peer = TestNs::new("clpeerl")?;
        let _nic = HostNic::add(&peer)?;
        run.steps.step("our image (hack/cluster.sh image)");
        let tag = "e2e-labels";
        run.c.import_our_image(&format!("{IMAGE_REPO}:{tag}"))?;
        labels::labelled_resource(run, tag)
    })
}

/// The migrations from the Go project's DaemonSets (upstream's manifests,
/// cluster-network-addons-operator's rendering) to ours on the real node
/// (`cluster/migrations.rs`), on the cluster the tests above leave or bring
/// up, holding the same locks.
#[test]
fn migrations_from_the_go_daemonsets_on_a_real_node() -> Result<()> {
    on_the_real_node(|run| {
        let tag = "e2e-migrations";
        let (peer, _nic) = vm_setup(run, "clpeerm", tag)?;
        migrations::go_daemonsets_to_ours(run, &peer, tag)
    })
}

/// Ours moved to another namespace as a GitOps sync moves it, under a
/// pinging VM (`cluster/namespace_move.rs`): the old install's uninstall
/// leaves the CNI files to the new one. Same cluster and locks.
#[test]
fn ours_moved_to_another_namespace_on_a_real_node() -> Result<()> {
    on_the_real_node(|run| {
        let tag = "e2e-moved";
        let (peer, _nic) = vm_setup(run, "clpeerv", tag)?;
        namespace_move::moved_as_gitops_moves_it(run, &peer, tag)
    })
}

fn clean_up(run: &Run) -> Result<()> {
    let c = run.c;
    // What cluster/labels.rs sets on the Node.
    let _ = c.kubectl(&["label", "node", NODE, &format!("{}-", labels::LABEL)]);
    let _ = c.helm(&[
        "uninstall",
        HELM_RELEASE,
        "--namespace",
        "default",
        "--ignore-not-found",
    ]);
    let _ = realnode::delete_e2e_pods(c);
    let _ = c.kubectl(&[
        "delete",
        "-f",
        &repo().join("manifests/examples/nad.yaml").to_string_lossy(),
        "--ignore-not-found",
    ]);
    let _ = c.kubectl(&[
        "-n",
        "default",
        "delete",
        "ds",
        DS,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=120s",
    ]);
    let _ = c.kubectl(&[
        "-n",
        "default",
        "delete",
        "configmap",
        "macvtap-deviceplugin-config",
        "--ignore-not-found",
    ]);
    let _ = c.kubectl(&[
        "delete",
        "namespace",
        namespace_move::MOVED,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=120s",
    ]);
    let _ = c.kubectl(&[
        "delete",
        "namespace",
        CNAO_NS,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=120s",
    ]);
    let _ = c.kubectl(&[
        "delete",
        "-k",
        &repo().join("manifests/base").to_string_lossy(),
        "--ignore-not-found",
        "--wait=true",
        "--timeout=120s",
    ]);
    // What DRA mode adds (dra.rs).
    let _ = c.kubectl(&[
        "delete",
        "clusterrolebinding/macvtap-cni-dra",
        "clusterrole/macvtap-cni-dra",
        "deviceclass/macvtap-dradata",
        "--ignore-not-found",
    ]);
    let _ = c.kubectl(&[
        "-n",
        "default",
        "delete",
        "resourceclaimtemplate/macvtap-dradata",
        "--ignore-not-found",
    ]);
    Ok(())
}

fn scenario(run: &mut Run) -> Result<()> {
    let c = run.c;
    let taps_before = tap_nodes();

    run.steps.step("the node's NIC and the peer host");
    let peer = TestNs::new("clpeer")?;
    let _nic = HostNic::add(&peer)?;

    run.steps
        .step("our image (hack/cluster.sh image), two tags");
    let tag_a = format!("{IMAGE_REPO}:e2e-a");
    let tag_b = format!("{IMAGE_REPO}:e2e-b");
    c.import_our_image(&tag_a)?;
    c.import_our_image(&tag_b)?;

    run.steps
        .step("the VM pod's image: Debian's QEMU and the test guest");
    let guest = guest::build(&repo().join("target/e2e-guest"))?;
    let rootfs = tempfile::tempdir()?;
    vm_rootfs(&guest, rootfs.path())?;
    c.import_rootfs(VM_IMAGE, &["/vm/start"], "107:107", rootfs.path())?;

    run.steps
        .step("install: kubectl apply -k with the image overridden; no ConfigMap yet");
    let kdir = tempfile::tempdir()?;
    // A kustomization of the base that overrides the image and, given
    // `args`, the daemon container's args.
    let kustomization = |tag: &str, args: Option<&[String]>| {
        realnode::write_kustomization(kdir.path(), tag, &[], args)
    };
    kustomization("e2e-a", None)?;
    c.kubectl(&["apply", "-k", &kdir.path().to_string_lossy()])?;
    run.wait_ds_ready()?;
    // Without a ConfigMap nothing names the test's veth (auto-discovery
    // takes physical NICs): the resource is absent, or 0 where an earlier
    // run's plugin left it in the node's status.
    c.wait(&format!("{RESOURCE} not advertised"), WAIT, || {
        Ok(run.allocatable()?.is_none_or(|n| n == 0).then_some(()))
    })?;
    // README, "A first VM" and "Resources": as shipped, each NIC the node
    // does not use itself is a resource named after it with 100 devices
    // (no link is made on them: nothing here allocates one); a NIC the
    // node uses (a default route leaves through it, or it has a global
    // address: this machine's eth0) is left out, and the Event
    // MacvtapNICsLeftOut on the Node names it (issue 46).
    let (used, spare): (Vec<String>, Vec<String>) = physical_nics()?
        .into_iter()
        .partition(|nic| node_uses(nic).unwrap_or(true));
    for nic in &spare {
        run.wait_allocatable_of(&format!("{RESOURCE_PREFIX}{nic}"), DISCOVERED_CAPACITY)?;
    }
    for nic in &used {
        c.wait(
            &format!("a MacvtapNICsLeftOut Event naming {nic}"),
            WAIT,
            || node_event_naming(c, "MacvtapNICsLeftOut", &format!("{nic} ")),
        )?;
        ensure!(
            run.allocatable_of(&format!("{RESOURCE_PREFIX}{nic}"))?
                .is_none_or(|n| n == 0),
            "as shipped, the node's own NIC {nic} is advertised"
        );
    }
    ensure!(
        run.allocatable_of(&format!("{RESOURCE_PREFIX}{NIC}"))?
            .is_none_or(|n| n == 0),
        "the test's veth {NIC} is advertised without --discover-kinds"
    );
    run.steps.say(format!(
        "as shipped: the physical NICs {spare:?} are resources named after them ({DISCOVERED_CAPACITY} devices), the node's own {used:?} are left out (MacvtapNICsLeftOut), the veth {NIC} is not advertised"
    ));

    run.steps.step(
        "a first VM with the README's defaults: no ConfigMap, the example NAD on the NIC's resource",
    );
    // The one change to the install as shipped, the one README gives for
    // nodes whose NICs are veths: this machine's only physical NIC is its
    // eth0, on which tests must not send.
    let base_ds = macvtap_e2e::manifests::render(&repo().join("manifests/base"))?
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .context("manifests/base renders no DaemonSet")?;
    let mut veth_args: Vec<String> = base_ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == DAEMON))
        .and_then(|c| c["args"].as_array())
        .context("the base's daemon container has no args")?
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    veth_args.push("--discover-kinds=veth".into());
    // And the test's own, for speed: links given back are reclaimed after
    // 30 to 35 s instead of the default's 2 to 4 minutes (cli.rs's unit
    // test asserts the default). That is still more than the 5 s
    // between two VM pods' DELs, and the uninstall scenario's links stay
    // held: kubelet 1.37 lists an admitted pod's devices in PodResources.
    veth_args.extend(["--reclaim-grace=30s".into(), "--reclaim-interval=2s".into()]);
    kustomization("e2e-a", Some(&veth_args))?;
    c.kubectl(&["apply", "-k", &kdir.path().to_string_lossy()])?;
    run.wait_ds_ready()?;
    let nic_resource = format!("{RESOURCE_PREFIX}{NIC}");
    run.wait_allocatable_of(&nic_resource, DISCOVERED_CAPACITY)?;
    // README: `sed 's|kubevirt.io/eth1$|kubevirt.io/<NIC>|' nad.yaml`.
    let example_nad = std::fs::read_to_string(repo().join("manifests/examples/nad.yaml"))?;
    let nad = example_nad.replace(
        &format!("{RESOURCE_PREFIX}eth1\n"),
        &format!("{nic_resource}\n"),
    );
    ensure!(nad != example_nad, "nad.yaml changed shape:\n{example_nad}");
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&nad))?;
    let vm0_ip = Ipv4Addr::new(198, 51, 100, 166);
    // DEL gives the link back; reclaim removes it after its grace, which
    // the next step waits for (its ConfigMap sync overlaps that grace).
    let vm0_links = run.vm_pings_then_goes(
        &peer,
        &nic_resource,
        ("virt-launcher-vm0", "02:00:c6:33:64:a6", vm0_ip),
    )?;
    run.wait_allocatable_of(&nic_resource, DISCOVERED_CAPACITY)?;
    run.steps.say(format!(
        "virt-launcher-vm0 on {nic_resource}: Running, its guest answers the peer's pings; deleted, its link given back: {vm0_links:?}"
    ));
    let first = run.daemon_pod()?;

    run.steps
        .step("configure live: the explicit ConfigMap applied, no restart");
    // README, "Configuration": the explicit ConfigMap, naming this node's NIC.
    let explicit =
        std::fs::read_to_string(repo().join("manifests/examples/configmap-explicit.yaml"))?;
    let conf = explicit
        .replace(
            "\"lowerDevice\": \"eth1\"",
            &format!("\"lowerDevice\": \"{NIC}\""),
        )
        .replace("\"capacity\": 50", &format!("\"capacity\": {CAPACITY}"));
    ensure!(
        conf.contains(NIC) && conf.contains(&format!("\"capacity\": {CAPACITY}")),
        "configmap-explicit.yaml changed shape:\n{explicit}"
    );
    let t = Instant::now();
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&conf))?;
    run.wait_allocatable(CAPACITY)?;
    let daemon = run.daemon_pod()?;
    ensure!(
        daemon["metadata"]["uid"] == first["metadata"]["uid"]
            && daemon["status"]["containerStatuses"][0]["restartCount"]
                == first["status"]["containerStatuses"][0]["restartCount"],
        "the config edit restarted the daemon"
    );
    run.steps.say(format!(
        "applied by the running daemon {:.0} s after kubectl apply (the kubelet's ConfigMap volume sync)",
        t.elapsed().as_secs_f64()
    ));
    c.wait(
        &format!("{nic_resource} gone with the explicit ConfigMap"),
        WAIT,
        || {
            Ok(run
                .allocatable_of(&nic_resource)?
                .is_none_or(|n| n == 0)
                .then_some(()))
        },
    )?;
    let daemon = run.daemon_pod()?;
    run.steps.say(format!(
        "DaemonSet Ready; {} advertises {RESOURCE}: {CAPACITY}, and {nic_resource} no more",
        daemon["metadata"]["name"].as_str().unwrap_or("?")
    ));
    // vm0's link is on the NIC of the new resource: reclaim removes it.
    run.wait_reclaimed("reclaim removing vm0's link given back", &taps_before)?;
    run.steps.say(format!(
        "reclaim removed vm0's link {vm0_links:?} after its grace"
    ));

    run.steps.step("a VM pod as KubeVirt makes it");
    // README, "Configuration": with the explicit ConfigMap the NAD names
    // its resource.
    let nad = example_nad.replace(
        &format!("{RESOURCE_PREFIX}eth1\n"),
        &format!("{RESOURCE}\n"),
    );
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&nad))?;
    run.start_vm(
        "virt-launcher-vm1",
        "02:00:c6:33:64:a2",
        Ipv4Addr::new(198, 51, 100, 162),
    )?;
    let log = c.kubectl(&["-n", "default", "logs", "virt-launcher-vm1"])?;
    let tap_line = log
        .lines()
        .find(|l| l.starts_with("VMPOD tap="))
        .context("no VMPOD line")?
        .to_string();
    run.steps.say(&tap_line);
    ensure!(
        tap_line.contains("107"),
        "QEMU does not run as 107: {tap_line}"
    );
    let pinger = Pinger::start(&peer, Ipv4Addr::new(198, 51, 100, 162), PING_EVERY)?;
    ensure!(
        pinger.wait_for(Duration::from_secs(60), |l| l.first_reply().is_some()),
        "the guest of virt-launcher-vm1 never answered a ping from the peer"
    );
    ensure!(
        macvtaps_on_nic()?.is_empty(),
        "a macvtap of the pod stayed in the host namespace: {:?}",
        macvtaps_on_nic()?
    );
    run.steps
        .say("the guest answers the peer's pings through the macvtap");
    run.wait_allocatable(CAPACITY)?;

    run.steps.step("a pod over capacity stays Pending");
    let over = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "over-capacity", "namespace": "default", "labels": {"e2e": "cluster"},
                     "annotations": {"k8s.v1.cni.cncf.io/networks": "dataplane"}},
        "spec": {"containers": [{"name": "c", "image": VM_IMAGE, "imagePullPolicy": "Never",
                                 "command": ["/bin/sleep", "3600"],
                                 "resources": {"limits": {RESOURCE: CAPACITY.to_string()}}}]}
    });
    c.apply(&over)?;
    let msg = c.wait(
        "the scheduler's FailedScheduling on over-capacity",
        WAIT,
        || {
            let p = c.get_json(&["-n", "default", "pod", "over-capacity"])?;
            let cond = p["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            Ok(cond
                .iter()
                .find(|c| c["type"] == "PodScheduled" && c["status"] == "False")
                .and_then(|c| c["message"].as_str().map(str::to_string)))
        },
    )?;
    ensure!(
        msg.contains(&format!("Insufficient {RESOURCE}")),
        "the pod is Pending for another reason: {msg}"
    );
    ensure!(run.pod_phase("over-capacity")? == "Pending");
    run.steps.say(format!("Pending: {msg}"));
    c.kubectl(&[
        "-n",
        "default",
        "delete",
        "pod",
        "over-capacity",
        "--wait=true",
    ])?;

    run.steps.step("the kubelet killed and started again");
    let t = Instant::now();
    let registrations = || -> Result<usize> {
        Ok(run
            .daemon_logs()?
            .lines()
            .filter(|l| l.contains("registered with the kubelet"))
            .count())
    };
    let registered_before = registrations()?;
    let kubelet = c.pid_of("kubelet")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(kubelet as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    c.ensure_up()?;
    c.wait("our plugin registered with the new kubelet", WAIT, || {
        Ok((registrations()? > registered_before).then_some(()))
    })?;
    run.wait_allocatable(CAPACITY)?;
    // The real kubelet's CleanupPluginDirectory (1.37) removes only sockets
    // at start: our record (assignments.json and its journal), in a
    // directory of its own there, is kept.
    let record = record_text();
    ensure!(
        record.contains("dataplaneMvp"),
        "the record in {RECORD_DIR} lost the VM pod's device over the kubelet's restart: {record:?}"
    );
    run.start_vm(
        "virt-launcher-vm2",
        "02:00:c6:33:64:a3",
        Ipv4Addr::new(198, 51, 100, 163),
    )?;
    let now = Instant::now();
    let (sent, lost) = lost_between(&pinger, t, now)?;
    ensure!(
        sent > 0 && lost == 0,
        "the VM lost {lost} of {sent} pings while the kubelet restarted"
    );
    run.steps.say(format!(
        "allocatable back, a new VM pod started, 0 of {sent} pings lost"
    ));

    run.steps.step("our daemon's container killed");
    let t = Instant::now();
    let pod = run.daemon_pod()?;
    let restarts = |p: &Value| {
        p["status"]["containerStatuses"][0]["restartCount"]
            .as_i64()
            .unwrap_or(0)
    };
    let before = restarts(&pod);
    let pid = daemon_pid()?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    c.wait("the kubelet restarted our container", WAIT, || {
        let p = run.daemon_pod()?;
        let ready = p["status"]["containerStatuses"][0]["ready"] == true;
        Ok((restarts(&p) > before && ready).then_some(()))
    })?;
    run.wait_allocatable(CAPACITY)?;
    let (sent, lost) = lost_between(&pinger, t, Instant::now())?;
    ensure!(
        sent > 0 && lost == 0,
        "the VM lost {lost} of {sent} pings while our daemon restarted"
    );
    ensure!(
        macvtaps_on_nic()?.is_empty(),
        "a macvtap leaked on {NIC}: {:?}",
        macvtaps_on_nic()?
    );
    let new_taps: Vec<_> = tap_nodes().difference(&taps_before).cloned().collect();
    ensure!(
        new_taps.len() == 2,
        "the two VM pods should hold 2 tap nodes, /dev has new {new_taps:?}"
    );
    run.steps.say(format!(
        "restarted by the kubelet, 0 of {sent} pings lost, no link leaked"
    ));

    run.steps
        .step("an upgrade: kubectl apply -k with the next tag keeps the operator's ConfigMap");
    let cm_before = c.get_json(&["-n", NS, "configmap", "macvtap-deviceplugin-config"])?;
    let t = Instant::now();
    kustomization("e2e-b", Some(&veth_args))?;
    c.kubectl(&["apply", "-k", &kdir.path().to_string_lossy()])?;
    run.rollout_done()?;
    let image = run.daemon_pod()?["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or("")
        .to_string();
    ensure!(
        image == tag_b,
        "the rolled-out pod runs {image}, not {tag_b}"
    );
    run.wait_allocatable(CAPACITY)?;
    let cm_after = c.get_json(&["-n", NS, "configmap", "macvtap-deviceplugin-config"])?;
    ensure!(
        cm_after["data"] == cm_before["data"],
        "the upgrade changed the operator's ConfigMap: {} -> {}",
        cm_before["data"],
        cm_after["data"]
    );
    let (sent, lost) = lost_between(&pinger, t, Instant::now())?;
    ensure!(
        sent > 0 && lost == 0,
        "the VM lost {lost} of {sent} pings during the upgrade"
    );
    run.steps.say(format!(
        "upgraded to {tag_b}, the ConfigMap as the operator left it, 0 of {sent} pings lost"
    ));

    run.steps
        .step("orphan delete, re-apply, rollout restart: not an uninstall, nothing removed");
    // Issue 44: the DaemonSet deleted with --cascade=orphan and applied
    // again is the same install; the pod that saw the deletion must not
    // clean the node when the rollout restart stops it.
    let t = Instant::now();
    // The VM pods' own tap nodes (other programs on the machine may make
    // and remove tap nodes of their own meanwhile).
    let taps: BTreeSet<String> = ["virt-launcher-vm1", "virt-launcher-vm2"]
        .iter()
        .map(|vm| run.vm_tap_node(vm))
        .collect::<Result<_>>()?;
    let mut links = macvtaps_on_nic()?;
    links.sort();
    let record = record_text();
    ensure!(
        record.contains("dataplaneMvp"),
        "before the orphan delete the record in {RECORD_DIR} should name the VM pods' devices (dataplaneMvp...): {record:?}"
    );
    let cni = cni_files()?;
    let orphan = run.daemon_pod()?;
    let orphan_uid = orphan["metadata"]["uid"].clone();
    let orphan_name = orphan["metadata"]["name"]
        .as_str()
        .context("our daemon's pod has no name")?
        .to_string();
    c.kubectl(&[
        "-n",
        NS,
        "delete",
        "ds",
        DS,
        "--cascade=orphan",
        "--wait=true",
        "--timeout=120s",
    ])?;
    c.wait("the DaemonSet gone, its pod orphaned", WAIT, || {
        let out = c.kubectl(&["-n", NS, "get", "ds", DS, "--ignore-not-found"])?;
        Ok(out.trim().is_empty().then_some(()))
    })?;
    let pod = run.daemon_pod()?;
    ensure!(
        pod["metadata"]["uid"] == orphan_uid && pod["status"]["phase"] == "Running",
        "the orphan delete should leave {orphan_name} running; the pod now is {} in phase {}",
        pod["metadata"]["name"],
        pod["status"]["phase"]
    );
    // The same kustomization (tag e2e-b, the veth args) as the upgrade.
    c.kubectl(&["apply", "-k", &kdir.path().to_string_lossy()])?;
    run.wait_ds_ready()?;
    let adopted = run.daemon_pod()?;
    ensure!(
        adopted["metadata"]["uid"] == orphan_uid,
        "the re-applied DaemonSet should adopt the orphaned pod {orphan_name}; it runs {} instead",
        adopted["metadata"]["name"]
    );
    let followed = run.follow_daemon_log(&orphan_name)?;
    c.kubectl(&["-n", NS, "rollout", "restart", &format!("ds/{DS}")])?;
    run.rollout_done()?;
    run.wait_allocatable(CAPACITY)?;
    let old_log = c.log_to_end(followed, WAIT)?;
    let restarted = run.daemon_pod()?;
    ensure!(
        restarted["metadata"]["uid"] != orphan_uid,
        "the rollout restart should replace {orphan_name}; it still runs"
    );
    let (sent, lost) = lost_between(&pinger, t, Instant::now())?;
    ensure!(
        sent > 0 && lost == 0,
        "the VM should lose no ping over the orphan delete, re-apply and restart; it lost {lost} of {sent}"
    );
    ensure!(
        taps.is_subset(&tap_nodes()),
        "the VM pods' tap nodes {taps:?} should still be in /dev; it has {:?}",
        tap_nodes()
    );
    let mut links_after = macvtaps_on_nic()?;
    links_after.sort();
    ensure!(
        links_after == links,
        "the macvtaps on {NIC} should be unchanged: {links:?} before, {links_after:?} after"
    );
    let record = record_text();
    ensure!(
        record.contains("dataplaneMvp"),
        "the record in {RECORD_DIR} should still name the VM pods' devices (dataplaneMvp...): {record:?}"
    );
    for (f, before) in CNI_FILES.iter().zip(&cni) {
        let after = std::fs::read(f).with_context(|| format!("{f} should still be there"))?;
        ensure!(
            after == *before,
            "{f} should be unchanged: {} bytes before, {} bytes after, different",
            before.len(),
            after.len()
        );
    }
    let removed: Vec<&str> = old_log
        .lines()
        .filter(|l| l.contains("uninstall: removed"))
        .collect();
    ensure!(
        removed.is_empty(),
        "{orphan_name} should not clean the node; it logged: {removed:?}"
    );
    let not_uninstall: Vec<&str> = old_log
        .lines()
        .filter(|l| l.contains("not an uninstall"))
        .collect();
    ensure!(
        !not_uninstall.is_empty(),
        "{orphan_name} should log `not an uninstall` when it stops; its log ends:\n{}",
        last_lines(&old_log, 20)
    );
    for l in &not_uninstall {
        run.steps.say(format!("{orphan_name}: {l}"));
    }
    run.steps.say(format!(
        "adopted by the re-applied DaemonSet, then replaced by the restart; 0 of {sent} pings lost; links, tap nodes, record, CNI binary and settings unchanged"
    ));

    run.steps.step("/metrics from the node");
    let metrics = test_kubelet::http_get_here(9402, "/metrics")?;
    ensure!(
        metrics.starts_with("HTTP/1.1 200"),
        "GET /metrics: {}",
        metrics.lines().next().unwrap_or("")
    );
    ensure!(
        metrics.contains(&format!("resource=\"{RESOURCE}\"")),
        "/metrics names no series of {RESOURCE}:\n{metrics}"
    );
    run.steps
        .say(format!("{} lines of metrics", metrics.lines().count()));

    run.steps.step("doctor in our pod");
    let doctor = |args: &[&str]| -> Result<(bool, String)> {
        let mut a = vec![
            "-n",
            NS,
            "exec",
            "ds/macvtap-cni",
            "-c",
            DAEMON,
            "--",
            "/macvtap-deviceplugin",
            "doctor",
        ];
        a.extend_from_slice(args);
        let out = c.kubectl_output(&a, None)?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ))
    };
    let (ok, text) = doctor(&[])?;
    ensure!(ok, "doctor found a problem on a healthy node:\n{text}");
    ensure!(
        text.contains("the CNI is installed at /host/cni-bin/macvtap"),
        "doctor did not find the CNI at the DaemonSet's mount by itself:\n{text}"
    );
    ensure!(
        text.contains(&format!("NIC {NIC} is up")),
        "doctor did not check {NIC}:\n{text}"
    );
    ensure!(
        text.contains("pods hold 2 of them"),
        "doctor does not see the two VM pods' devices:\n{text}"
    );
    run.steps.say(format!("exit 0:\n{text}"));
    // The VM pods go first: with the NIC down they would only lose pings.
    let pings = pinger.stop(Duration::from_secs(1))?;
    let f = pings.figures(Instant::now());
    ensure!(
        f.lost == 0,
        "the VM lost {} of {} pings over the whole run",
        f.lost,
        f.sent
    );
    run.steps.say(format!(
        "the first VM answered all {} pings of the run",
        f.sent
    ));

    run.steps.step("the VM pods deleted");
    run.delete_vm_pods(&["virt-launcher-vm1", "virt-launcher-vm2"])?;
    // Multus' DEL ran our CNI, which gave each link back to the host's
    // namespace under its device's name (the reclaimer waits
    // --reclaim-grace before it deletes a link no pod holds).
    let given_back = c.wait("the CNI giving both links back", WAIT, || {
        let links = macvtaps_on_nic()?;
        Ok((links.len() == 2).then_some(links))
    })?;
    run.steps.say(format!(
        "given back to the host's namespace: {given_back:?}"
    ));
    run.wait_allocatable(CAPACITY)?;
    run.wait_reclaimed("reclaim removing the links given back", &taps_before)?;
    // One Event per kind and Node: the second removal is a repeat in its
    // series (kube's recorder keys a series by reason and object, not note),
    // so the note names the first link removed.
    c.wait(
        "a MacvtapLeakedLinkRemoved Event for a link given back",
        WAIT,
        || {
            for link in &given_back {
                if node_event_naming(c, "MacvtapLeakedLinkRemoved", link)?.is_some() {
                    return Ok(Some(()));
                }
            }
            Ok(None)
        },
    )?;
    run.steps
        .say("no macvtap on the NIC and no tap node of the pods left");

    run.steps.step("the NIC down: Events, allocatable, doctor");
    ip(&["link", "set", NIC, "down"])?;
    run.wait_allocatable(0)?;
    c.wait("a MacvtapNICDown Event on the Node", WAIT, || {
        node_event(c, "MacvtapNICDown")
    })?;
    let (ok, text) = doctor(&[])?;
    ensure!(!ok, "doctor exited 0 with the NIC down:\n{text}");
    ensure!(
        text.contains(&format!("lower NIC {NIC} is down")),
        "doctor does not name the NIC down:\n{text}"
    );
    run.steps.say(format!("doctor exit 1:\n{text}"));
    ip(&["link", "set", NIC, "up"])?;
    run.wait_allocatable(CAPACITY)?;
    c.wait("a MacvtapNICUp Event on the Node", WAIT, || {
        node_event(c, "MacvtapNICUp")
    })?;

    run.steps.step("RBAC: enough, and no more");
    let logs = all_daemon_logs(c)?;
    ensure!(
        !logs.to_lowercase().contains("forbidden"),
        "our daemon was refused something:\n{logs}"
    );
    set_event_verbs(c, &["create"])?;
    ip(&["link", "set", NIC, "down"])?;
    let refused = c.wait("our daemon saying it was refused an Event", WAIT, || {
        let logs = run.daemon_logs()?;
        Ok(logs
            .lines()
            .find(|l| l.contains("Events are off") && l.to_lowercase().contains("forbidden"))
            .map(str::to_string))
    });
    ip(&["link", "set", NIC, "up"])?;
    set_event_verbs(c, &["create", "patch"])?;
    let refused = refused?;
    run.steps.say(format!(
        "without patch on events (a repeat of an Event is a patch): {refused}"
    ));

    run.steps.step(
        "uninstall with a pod between Allocate and ADD and one whose sandbox is being re-created: both still start",
    );
    // Issue 44: an uninstall keeps what pods still hold (their links in the
    // host's namespace, the CNI binary and its settings), so that their
    // ADD still works.
    let vm6 = (
        "virt-launcher-vm6",
        "02:00:c6:33:64:a8",
        Ipv4Addr::new(198, 51, 100, 168),
    );
    let vm7 = (
        "virt-launcher-vm7",
        "02:00:c6:33:64:a9",
        Ipv4Addr::new(198, 51, 100, 169),
    );
    let before = macvtaps_on_nic()?;
    ensure!(
        before.is_empty(),
        "no macvtap should be on {NIC} before vm6 starts; there are {before:?}"
    );
    run.start_vm(vm6.0, vm6.1, vm6.2)?;
    guest_answers(&peer, vm6.0, vm6.2)?;
    // Multus thick reads the NAD on ADD but takes DEL from its cache:
    // without the NAD every DEL works and every ADD fails, which holds both
    // windows open for as long as the uninstall takes.
    c.kubectl_stdin(&["delete", "-f", "-"], Some(&nad))?;
    let vm6_uid = run.pod_uid(vm6.0)?;
    let vm6_container = run
        .vm_container_running(vm6.0)?
        .with_context(|| format!("{} should run its container", vm6.0))?;
    let pause = pause_pid_of(&vm6_uid)?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pause as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    let (vm6_link, failed) = c.wait(
        "vm6's sandbox killed: DEL giving its link back and the new sandbox's ADD failing",
        WAIT,
        || {
            let links = macvtaps_on_nic()?;
            ensure!(!links.is_empty(), "no link back on {NIC} yet");
            match pod_event(c, &vm6_uid, "FailedCreatePodSandBox")? {
                Some(m) => Ok(Some((links, m))),
                None => bail!("{links:?} back on {NIC}, no FailedCreatePodSandBox Event yet"),
            }
        },
    )?;
    run.steps.say(format!(
        "{}'s sandbox (pause, pid {pause}) killed: its link {vm6_link:?} back on {NIC}, the new sandbox's ADD fails: {failed}",
        vm6.0
    ));
    run.apply_vm_pod(RESOURCE, vm7.0, vm7.1, vm7.2)?;
    let held = c.wait(
        "vm7's device allocated: a second link on the NIC",
        WAIT,
        || {
            let mut links = macvtaps_on_nic()?;
            links.sort();
            ensure!(links.len() == 2, "the links on {NIC}: {links:?}");
            Ok(Some(links))
        },
    )?;
    let vm7_uid = run.pod_uid(vm7.0)?;
    let failed = c.wait("vm7's ADD failing", WAIT, || {
        pod_event(c, &vm7_uid, "FailedCreatePodSandBox")
    })?;
    run.steps.say(format!(
        "{}: its device allocated (the links on {NIC} are {held:?}), its ADD fails: {failed}",
        vm7.0
    ));

    let daemon = run.daemon_pod()?;
    let daemon_name = daemon["metadata"]["name"]
        .as_str()
        .context("our daemon's pod has no name")?
        .to_string();
    let followed = run.follow_daemon_log(&daemon_name)?;
    let kept_events_before = node_event_keys(c, "MacvtapUninstallKept")?;
    c.kubectl(&[
        "delete",
        "-k",
        &kdir.path().to_string_lossy(),
        "--wait=true",
        "--timeout=180s",
    ])?;
    run.wait_allocatable(0)?;
    let daemon_log = c.log_to_end(followed, WAIT)?;
    let mut links_after = macvtaps_on_nic()?;
    links_after.sort();
    ensure!(
        links_after == held,
        "the uninstall should keep the links pods hold on {NIC}: {held:?} before, {links_after:?} after"
    );
    for f in CNI_FILES {
        ensure!(
            Path::new(f).exists(),
            "the uninstall should keep {f} while pods hold our devices; it is gone"
        );
    }
    let kept = daemon_log
        .lines()
        .find(|l| {
            l.contains("uninstall: kept on this node") && held.iter().all(|h| l.contains(h.as_str()))
        })
        .with_context(|| {
            let uninstall: Vec<&str> = daemon_log
                .lines()
                .filter(|l| l.contains("uninstall"))
                .collect();
            format!(
                "{daemon_name} should log `uninstall: kept on this node` naming {held:?}; its lines about the uninstall: {uninstall:?}"
            )
        })?
        .to_string();
    for l in daemon_log
        .lines()
        .filter(|l| l.contains("uninstall: cleaning this node"))
    {
        run.steps.say(format!("{daemon_name}: {l}"));
    }
    run.steps.say(format!("{daemon_name}: {kept}"));
    // The same in an Event on the Node, which `kubectl delete -k` often
    // cannot get: it deletes our service account and RBAC before the
    // DaemonSet, and the daemon then says the API server refused it.
    match daemon_log
        .lines()
        .find(|l| l.contains("the API server refused the exit's last Event"))
    {
        Some(refused) => run.steps.say(format!(
            "the Event could not be posted, and {daemon_name} said so: {refused}"
        )),
        None => {
            let event = c.wait("a MacvtapUninstallKept Event on the Node", WAIT, || {
                new_node_event(c, "MacvtapUninstallKept", &kept_events_before)
            })?;
            run.steps
                .say(format!("Event MacvtapUninstallKept: {event}"));
        }
    }

    c.kubectl_stdin(&["apply", "-f", "-"], Some(&nad))?;
    // The kubelet starts a container of a device plugin's resource only
    // while it keeps the plugin's endpoint, 5 minutes after the plugin went
    // away (its endpointStopGracePeriod): one wait for both, well inside.
    c.wait(
        "vm6 (a new container) and vm7 running with the NAD back",
        WAIT,
        || {
            let six = run.vm_container_running(vm6.0)?;
            let seven = run.vm_container_running(vm7.0)?;
            let six_new = six.as_ref().is_some_and(|id| *id != vm6_container);
            ensure!(
                six_new && seven.is_some(),
                "vm6 runs {} (before the kill: {vm6_container}), vm7 runs {}",
                six.as_deref().unwrap_or("no container"),
                seven.as_deref().unwrap_or("no container")
            );
            Ok(Some(()))
        },
    )?;
    for (name, _, ip) in [vm6, vm7] {
        run.wait_vm_serving(name)?;
        guest_answers(&peer, name, ip)?;
    }
    run.steps.say(format!(
        "with the NAD back, {} (sandbox re-created) and {} (first ADD) run and their guests answer the peer's pings",
        vm6.0, vm7.0
    ));

    run.delete_vm_pods(&[vm6.0, vm7.0])?;
    c.wait("DEL giving vm6's and vm7's links back", WAIT, || {
        let links = macvtaps_on_nic()?;
        ensure!(links.len() == 2, "the links on {NIC}: {links:?}");
        Ok(Some(()))
    })?;
    let deleted = manual_leftover_cleanup()?;
    assert_uninstalled(c)?;
    run.steps.say(format!(
        "after README's manual clean-up (the CNI binary and settings removed, links {deleted:?} deleted): no CNI binary, settings, record or macvtap of ours on the node; no RBAC, namespace or DaemonSet of ours in the cluster"
    ));

    run.steps
        .step("install with the chart (helm install, helm test), then helm uninstall: the leaked link deleted, the just-handed-out one kept, then nothing of ours left");
    run.helm_install_as_base("e2e-a", CAPACITY)?;
    run.wait_ds_ready()?;
    run.wait_allocatable(CAPACITY)?;
    run.steps.say(format!(
        "{}: Ready; allocatable {RESOURCE}: {CAPACITY} from the chart's macvtapResources",
        run.daemon_pod()?["metadata"]["name"]
            .as_str()
            .unwrap_or("?")
    ));
    // helm test: the chart's doctor pod on the node (README, "With the
    // Helm chart") passes, and its findings say the daemon serves the
    // resource. The release is in `default` and the pod in our namespace,
    // where `helm test --logs` does not look (Helm v4.3.2 reads the
    // release's namespace: "pods not found"): its log is read there.
    c.helm(&[
        "test",
        HELM_RELEASE,
        "--namespace",
        "default",
        "--timeout",
        "180s",
    ])?;
    let tested = c.kubectl(&["-n", NS, "logs", "macvtap-cni-doctor"])?;
    ensure!(
        tested.contains(&format!("the daemon serves {RESOURCE}")),
        "helm test passed without doctor saying the daemon serves {RESOURCE}:\n{tested}"
    );
    run.steps.say(format!(
        "helm test: the doctor pod passed:\n{}",
        last_lines(&tested, 20)
    ));
    let vm5_ip = Ipv4Addr::new(198, 51, 100, 167);
    // Its link, given back by DEL just now, was handed out within the
    // chart's reclaim grace (120 s by default): the uninstall keeps it and
    // says why. A link of ours that no Allocate of this daemon handed out
    // (as a crashed daemon can leave one) is deleted by it.
    let vm5_links = run.vm_pings_then_goes(
        &peer,
        RESOURCE,
        ("virt-launcher-vm5", "02:00:c6:33:64:a7", vm5_ip),
    )?;
    run.steps.say(format!(
        "virt-launcher-vm5's guest answers pings; deleted, its link given back: {vm5_links:?}"
    ));
    let leaked = ["dataplaneMvp0", "dataplaneMvp1"]
        .map(macvtap_link::link_name_for_device)
        .into_iter()
        .find(|l| !vm5_links.contains(l))
        .context("vm5 gave back both devices' links")?;
    ip(&[
        "link", "add", &leaked, "link", NIC, "type", "macvtap", "mode", "bridge",
    ])?;
    let daemon_name = run.daemon_pod()?["metadata"]["name"]
        .as_str()
        .context("our daemon's pod has no name")?
        .to_string();
    let followed = run.follow_daemon_log(&daemon_name)?;
    run.helm_uninstall()?;
    run.wait_allocatable(0)?;
    let daemon_log = c.log_to_end(followed, WAIT)?;
    let line = |what: &str, with: &[&str]| -> Result<String> {
        daemon_log
            .lines()
            .find(|l| l.contains(what) && with.iter().all(|w| l.contains(w)))
            .map(str::to_string)
            .with_context(|| {
                format!(
                    "{daemon_name} should log `{what}` with {with:?}; its log ends:\n{}",
                    last_lines(&daemon_log, 20)
                )
            })
    };
    let removed = line("uninstall: removed what is ours", &[&leaked])?;
    let kept = line(
        "uninstall: kept on this node",
        &[&vm5_links[0], "within the reclaim grace"],
    )?;
    run.steps.say(format!("{daemon_name}: {removed}"));
    run.steps.say(format!("{daemon_name}: {kept}"));
    ensure!(
        macvtaps_on_nic()? == vm5_links,
        "the uninstall should delete {leaked} and keep vm5's {vm5_links:?}; the NIC has {:?}",
        macvtaps_on_nic()?
    );
    for f in CNI_FILES {
        ensure!(
            !Path::new(f).exists(),
            "no pod held a device, so the uninstall should remove {f} (it is the image's own)"
        );
    }
    let deleted = manual_leftover_cleanup()?;
    assert_uninstalled(c)?;
    run.steps.say(format!(
        "helm uninstall: the leaked {leaked} deleted, the CNI binary and settings removed, vm5's {deleted:?} kept (handed out within the grace) until README's manual step; then nothing of ours on the node or in the cluster"
    ));

    Ok(())
}

/// What an uninstall must leave: no CNI binary, settings, record or
/// macvtap of ours on the node (our daemon saw its DaemonSet deleted, not
/// rolled out, and removed them as it exited), and no RBAC, namespace or
/// DaemonSet of ours in the cluster.
fn assert_uninstalled(c: &Cluster) -> Result<()> {
    let left: Vec<String> = [CNI_FILES[0], CNI_FILES[1], RECORD_DIR]
        .into_iter()
        .filter(|p| Path::new(p).exists())
        .map(str::to_string)
        .collect();
    ensure!(left.is_empty(), "the uninstall left {left:?} on the node");
    let sockets: Vec<String> = std::fs::read_dir("/var/lib/kubelet/device-plugins")?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("macvtap.network.kubevirt.io_"))
        .collect();
    ensure!(
        sockets.is_empty(),
        "the uninstall left device plugin sockets: {sockets:?}"
    );
    ensure!(
        macvtaps_on_nic()?.is_empty(),
        "the uninstall left macvtaps: {:?}",
        macvtaps_on_nic()?
    );
    for (kind, name) in [
        ("clusterrole", "macvtap-cni-events"),
        ("clusterrolebinding", "macvtap-cni-events"),
        ("clusterrole", "macvtap-cni-node"),
        ("clusterrolebinding", "macvtap-cni-node"),
        ("namespace", NS),
    ] {
        let out = c.kubectl(&["get", kind, name, "--ignore-not-found"])?;
        ensure!(out.trim().is_empty(), "the uninstall left {kind} {name}");
    }
    Ok(())
}

fn node_event(c: &Cluster, reason: &str) -> Result<Option<()>> {
    node_event_naming(c, reason, NIC)
}

/// Whether an Event of `reason` on the Node has `what` in its note.
fn node_event_naming(c: &Cluster, reason: &str, what: &str) -> Result<Option<()>> {
    Ok(node_events(c, reason)?
        .iter()
        .any(|e| e["note"].as_str().is_some_and(|n| n.contains(what)))
        .then_some(()))
}

/// The Events of `reason` on the Node.
fn node_events(c: &Cluster, reason: &str) -> Result<Vec<Value>> {
    let evs = c.get_json(&["events.v1.events.k8s.io", "-A"])?;
    let items = evs["items"].as_array().cloned().unwrap_or_default();
    Ok(items
        .into_iter()
        .filter(|e| {
            e["reason"] == reason
                && e["regarding"]["kind"] == "Node"
                && e["regarding"]["name"] == NODE
        })
        .collect())
}

/// An Event's uid and resourceVersion: a repeat of an Event in its series
/// updates the object, so a new key is a new or repeated Event.
fn event_key(e: &Value) -> String {
    format!(
        "{}@{}",
        e["metadata"]["uid"].as_str().unwrap_or(""),
        e["metadata"]["resourceVersion"].as_str().unwrap_or("")
    )
}

/// The keys ([`event_key`]) of the Events of `reason` on the Node now.
fn node_event_keys(c: &Cluster, reason: &str) -> Result<BTreeSet<String>> {
    Ok(node_events(c, reason)?.iter().map(event_key).collect())
}

/// The note of an Event of `reason` on the Node that is not in `before`
/// (made or repeated since), if there is one.
fn new_node_event(c: &Cluster, reason: &str, before: &BTreeSet<String>) -> Result<Option<String>> {
    Ok(node_events(c, reason)?
        .iter()
        .find(|e| !before.contains(&event_key(e)))
        .map(|e| e["note"].as_str().unwrap_or("").to_string()))
}

/// Sets the verbs our ClusterRole `macvtap-cni-events` grants on Events.
fn set_event_verbs(c: &Cluster, verbs: &[&str]) -> Result<()> {
    let patch = json!([{"op": "replace", "path": "/rules/0/verbs", "value": verbs}]);
    c.kubectl(&[
        "patch",
        "clusterrole",
        "macvtap-cni-events",
        "--type=json",
        "-p",
        &patch.to_string(),
    ])
    .map(|_| ())
}

fn all_daemon_logs(c: &Cluster) -> Result<String> {
    let mut all = String::new();
    for prev in [true, false] {
        let mut a = vec![
            "-n",
            NS,
            "logs",
            "ds/macvtap-cni",
            "-c",
            DAEMON,
            "--tail=-1",
        ];
        if prev {
            a.push("--previous");
        }
        if let Ok(t) = c.kubectl(&a) {
            all.push_str(&t);
        }
    }
    Ok(all)
}

/// The pid of our daemon in its container (the one process of the node
/// running `/macvtap-deviceplugin` in a kubepods cgroup).
fn daemon_pid() -> Result<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let argv0 = cmd.split(|b| *b == 0).next().unwrap_or_default();
        if argv0 != b"/macvtap-deviceplugin" {
            continue;
        }
        let cg = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
        if cg.contains("kubepods") {
            found.push(pid);
        }
    }
    match found.as_slice() {
        [one] => Ok(*one),
        other => bail!(
            "{} processes of our daemon in pods, not 1: {other:?}",
            other.len()
        ),
    }
}
