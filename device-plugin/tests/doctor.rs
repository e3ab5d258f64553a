//! `macvtap-deviceplugin doctor` on sandbox nodes: a namespace with NIC
//! `eth1`, a test kubelet (registration and PodResources sockets), the
//! daemon, and a CNI bin dir; each test breaks one thing and checks the
//! finding that names it, and the exit status. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{DEADLINE, Node, daemon_bin};
use macvtap_link::{CNI_SETTINGS_FILE, link_name_for_device};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use test_kubelet::TestPodResources;

const DP: &str = "macvtap.network.kubevirt.io/dp";
const RESOURCE: &str = "--resource=name=dp,lowerDevice=eth1,capacity=4";
const VERSION: &str = env!("CARGO_PKG_VERSION");
const METRICS: &str = "--metrics-addr=127.0.0.1:9402";

/// A sandbox node: kubelet, PodResources and a CNI bin dir holding a CNI
/// that says `version` and a valid settings file; no daemon yet.
struct Sandbox {
    node: Node,
    pr: Option<TestPodResources>,
    cni_dir: tempfile::TempDir,
}

impl Sandbox {
    async fn new(tag: &str) -> Self {
        let mut node = Node::new(tag);
        node.start_kubelet().await;
        let pr = TestPodResources::start(&node.dir.path().join("pod-resources/kubelet.sock"))
            .await
            .unwrap();
        let cni_dir = tempfile::tempdir().unwrap();
        let s = Sandbox {
            node,
            pr: Some(pr),
            cni_dir,
        };
        s.install_cni(VERSION);
        s.write_settings(&format!(
            r#"{{"kubeletDir":"{}","podResourcesCheck":"warn"}}"#,
            s.node.dir.path().display()
        ));
        s
    }

    /// A CNI binary that says it is `version` when run by hand, as ours does.
    fn install_cni(&self, version: &str) {
        let p = self.cni_dir.path().join("macvtap");
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\n[ -z \"$CNI_COMMAND\" ] || exit 1\necho 'CNI macvtap plugin \
                 v{version}' >&2\necho 'CNI protocol versions supported: 1.1.0' >&2\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn write_settings(&self, text: &str) {
        let p = self.cni_dir.path().join(CNI_SETTINGS_FILE);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }

    /// Starts the daemon with `RESOURCE`, serving `/healthz` on [`METRICS`],
    /// and waits for its registration.
    async fn start_daemon(&mut self) {
        self.node.start_daemon(&[RESOURCE, METRICS], &[]);
        self.node
            .kubelet()
            .wait_for_registration(DP, 0, DEADLINE)
            .await
            .unwrap();
    }

    /// Runs `doctor` inside the node with `args` (daemon flags; the node's
    /// kubelet dir unless they give one) and `--output format`; returns the
    /// exit code and stdout.
    async fn doctor_as(&self, args: &[&str], format: &str) -> (i32, String) {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.node.ns.name])
            .arg(daemon_bin());
        if !args.contains(&"--kubelet-dir") {
            cmd.arg("--kubelet-dir").arg(self.node.dir.path());
        }
        if !args.iter().any(|a| a.starts_with("--metrics-addr")) {
            cmd.args(["--metrics-addr", "off"]);
        }
        cmd.args(args)
            .arg("doctor")
            .arg("--cni-bin-dir")
            .arg(self.cni_dir.path())
            .args(["--output", format])
            .env_remove("DP_MACVTAP_CONF")
            .env_remove("MACVTAP_DISCOVERY")
            .env_remove("MACVTAP_DISCOVER_INCLUDE")
            .env_remove("NODE_NAME")
            .env_remove("KUBECONFIG");
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        println!("doctor {args:?}:\n{stdout}");
        (out.status.code().unwrap(), stdout)
    }

    /// `doctor --output json` with `RESOURCE`: the exit code and findings.
    async fn doctor(&self) -> (i32, Vec<Value>) {
        self.doctor_with(&[RESOURCE]).await
    }

    async fn doctor_with(&self, args: &[&str]) -> (i32, Vec<Value>) {
        let (code, out) = self.doctor_as(args, "json").await;
        let v: Value = serde_json::from_str(&out).unwrap();
        (code, v.as_array().unwrap().clone())
    }
}

/// The findings of `check`, as `(level, message)`.
fn of(findings: &[Value], check: &str) -> Vec<(String, String)> {
    findings
        .iter()
        .filter(|f| f["check"] == check)
        .map(|f| {
            (
                f["level"].as_str().unwrap().to_string(),
                f["message"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The one finding of `check`, asserting its level.
fn one(findings: &[Value], check: &str, level: &str) -> String {
    let f = of(findings, check);
    assert_eq!(f.len(), 1, "{check}: {findings:#?}");
    assert_eq!(f[0].0, level, "{check}: {}", f[0].1);
    f[0].1.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_node_is_all_ok() {
    let mut s = Sandbox::new("dochealthy").await;
    s.pr.as_ref()
        .unwrap()
        .add_pod("default", "vm-a", &[(DP, &["dpMvp1"])]);
    s.start_daemon().await;
    let (code, findings) = s.doctor().await;
    assert_eq!(code, 0, "{findings:#?}");
    for f in &findings {
        assert_eq!(f["level"], "ok", "{findings:#?}");
    }
    let nic = one(&findings, "nic", "ok");
    assert_eq!(
        nic,
        format!(
            "{DP} on NIC eth1 (bridge mode, 4 devices), pods hold 1 of them: NIC eth1 is up and \
             no master owns it"
        )
    );
    one(&findings, "kubelet-socket", "ok");
    one(&findings, "pod-resources-socket", "ok");
    assert!(one(&findings, "plugin-socket", "ok").contains("the daemon serves"));
    assert!(one(&findings, "cni-version", "ok").contains(VERSION));
    one(&findings, "cni-binary", "ok");
    one(&findings, "cni-settings", "ok");
    one(&findings, "leaked-links", "ok");
    one(&findings, "kernel-module", "ok");
    one(&findings, "dev", "ok");
    one(&findings, "record-dir", "ok");
    // With --metrics-addr it asks the daemon's /healthz too.
    let (code, findings) = s.doctor_with(&[RESOURCE, METRICS]).await;
    assert_eq!(code, 0, "{findings:#?}");
    let m = one(&findings, "daemon", "ok");
    assert_eq!(m, "the daemon answers http://127.0.0.1:9402/healthz");
    // The text form says the same, one line each.
    let (code, text) = s.doctor_as(&[RESOURCE, METRICS], "text").await;
    assert_eq!(code, 0);
    assert_eq!(text.lines().count(), findings.len(), "{text}");
    assert!(text.lines().all(|l| l.starts_with("ok ")), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_nic_is_a_problem() {
    let s = Sandbox::new("docdown").await;
    s.node.ns.ip(&["link", "set", "eth1", "down"]).unwrap();
    let (code, findings) = s.doctor().await;
    assert_eq!(code, 1);
    let nic = one(&findings, "nic", "problem");
    assert!(nic.contains("lower NIC eth1 is down"), "{nic}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enslaved_nic_is_a_problem() {
    let s = Sandbox::new("docslave").await;
    s.node
        .ns
        .ip(&["link", "add", "br0", "type", "bridge"])
        .unwrap();
    s.node.ns.ip(&["link", "set", "br0", "up"]).unwrap();
    s.node
        .ns
        .ip(&["link", "set", "eth1", "master", "br0"])
        .unwrap();
    let (code, findings) = s.doctor().await;
    assert_eq!(code, 1);
    let nic = one(&findings, "nic", "problem");
    assert!(
        nic.contains("eth1 is a port of bridge br0") && nic.contains("use br0 as lowerDevice"),
        "{nic}"
    );
    // Auto-discovery advertises the bridge instead, and says so.
    let (_, findings) = s.doctor_with(&["--discover-kinds=veth"]).await;
    let left_out = of(&findings, "discovery");
    assert!(
        left_out
            .iter()
            .any(|(l, m)| l == "ok" && m.starts_with("auto-discovery leaves eth1 out")),
        "{findings:#?}"
    );
}

/// Without a configuration (our manifests without a ConfigMap), doctor
/// says which NIC auto-discovery leaves out because the node uses it, and
/// how to serve it; that the Node's InternalIP is unknown without
/// `NODE_NAME`; and which NICs it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_says_which_nics_the_node_uses_and_how_to_serve_them() {
    let s = Sandbox::new("docspare").await;
    let ns = &s.node.ns;
    ns.add_nic("eth0").unwrap();
    ns.ip(&["addr", "add", "192.0.2.10/24", "dev", "eth0"])
        .unwrap();
    ns.ip(&["route", "add", "default", "via", "192.0.2.1", "dev", "eth0"])
        .unwrap();
    let (_, findings) = s.doctor_with(&["--discover-kinds=veth"]).await;
    let config = one(&findings, "config", "ok");
    assert!(
        config.ends_with(
            "auto-discovery of spare NICs (one resource per NIC the node does not use itself)"
        ),
        "{config}"
    );
    let discovery = of(&findings, "discovery");
    assert!(
        discovery.iter().any(|(l, m)| l == "ok"
            && m.starts_with(
                "auto-discovery leaves eth0 out: eth0 carries the IPv4 default route, so VMs on \
                 it would sit on the node's own network"
            )
            && m.contains("name it in the configuration")),
        "{findings:#?}"
    );
    assert!(
        discovery.iter().any(|(l, m)| l == "warning"
            && m.starts_with("our Node's InternalIP is unknown (NODE_NAME is not set)")),
        "{findings:#?}"
    );
    let served: Vec<String> = of(&findings, "nic").into_iter().map(|(_, m)| m).collect();
    assert!(
        served
            .iter()
            .any(|m| m.starts_with("macvtap.network.kubevirt.io/eth1 on NIC eth1")),
        "{served:?}"
    );
    assert!(
        !served.iter().any(|m| m.contains("NIC eth0 ")),
        "{served:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_nic_is_a_problem() {
    let s = Sandbox::new("docmissing").await;
    let (code, findings) = s
        .doctor_with(&["--resource=name=dp,lowerDevice=eth9"])
        .await;
    assert_eq!(code, 1);
    let nic = one(&findings, "nic", "problem");
    assert!(nic.contains("lower NIC eth9 does not exist"), "{nic}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_cni_binary_is_a_problem() {
    let s = Sandbox::new("docnocni").await;
    std::fs::remove_file(s.cni_dir.path().join("macvtap")).unwrap();
    let (code, findings) = s.doctor().await;
    assert_eq!(code, 1);
    let m = one(&findings, "cni-binary", "problem");
    assert!(m.starts_with("no CNI binary at"), "{m}");
    assert!(of(&findings, "cni-version").is_empty(), "nothing to run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cni_of_another_version_is_a_problem() {
    let s = Sandbox::new("docversion").await;
    s.install_cni("0.0.1");
    let (code, findings) = s.doctor().await;
    assert_eq!(code, 1);
    let m = one(&findings, "cni-version", "problem");
    assert!(
        m.contains("the installed CNI is v0.0.1 but this daemon is v"),
        "{m}"
    );
    // A CNI from before the about line fails when run by hand.
    let p = s.cni_dir.path().join("macvtap");
    std::fs::write(&p, "#!/bin/sh\necho '{\"code\":4}'\nexit 1\n").unwrap();
    let (code, findings) = s.doctor().await;
    assert_eq!(code, 1);
    let m = one(&findings, "cni-version", "problem");
    assert!(m.contains("does not say its version"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_settings_file_is_a_problem() {
    let s = Sandbox::new("docsettings").await;
    s.write_settings(r#"{"kubeletDir":"/var/lib/kubelet","colour":"blue"}"#);
    let (code, findings) = s.doctor().await;
    assert_eq!(code, 1);
    let m = one(&findings, "cni-settings", "problem");
    assert!(m.contains("is not valid"), "{m}");
    s.write_settings("{}");
    let p = s.cni_dir.path().join(CNI_SETTINGS_FILE);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (code, findings) = s.doctor().await;
    assert_eq!(code, 1);
    let m = one(&findings, "cni-settings", "problem");
    assert!(m.contains("others may write it"), "{m}");
    std::fs::remove_file(&p).unwrap();
    let (_, findings) = s.doctor().await;
    one(&findings, "cni-settings", "warning");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaked_link_is_a_warning() {
    let s = Sandbox::new("docleak").await;
    s.pr.as_ref()
        .unwrap()
        .add_pod("default", "vm-a", &[(DP, &["dpMvp1"])]);
    let held = link_name_for_device("dpMvp1");
    let leaked = link_name_for_device("dpMvp2");
    for name in [&held, &leaked] {
        s.node
            .ns
            .ip(&[
                "link", "add", "link", "eth1", "name", name, "type", "macvtap",
            ])
            .unwrap();
    }
    let (_, findings) = s.doctor().await;
    let m = one(&findings, "leaked-links", "warning");
    assert!(
        m.starts_with(&format!("macvtap {leaked} on eth1 is held by no pod")),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_kubelet_socket_is_a_problem() {
    let mut s = Sandbox::new("docnokubelet").await;
    s.node.kubelet.take().unwrap().stop().await;
    s.pr.take();
    let _ = std::fs::remove_file(s.node.plugin_dir().join("kubelet.sock"));
    let (code, findings) = s.doctor().await;
    assert_eq!(code, 1);
    let m = one(&findings, "kubelet-socket", "problem");
    assert!(m.contains("kubelet.sock"), "{m}");
    one(&findings, "pod-resources-socket", "problem");
    one(&findings, "pod-resources", "warning");
    let (_, findings) = s.doctor_with(&[RESOURCE, METRICS]).await;
    assert!(one(&findings, "daemon", "problem").contains("does not answer"));
    // A kubelet dir that is not there says that first.
    let (code, findings) = s
        .doctor_with(&[RESOURCE, "--kubelet-dir", "/nonexistent/kubelet"])
        .await;
    assert_eq!(code, 1);
    assert!(one(&findings, "kubelet", "problem").contains("does not exist"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_node_says_everything_wrong() {
    let mut s = Sandbox::new("docbroken").await;
    s.node.ns.add_nic("eth2").unwrap();
    s.node
        .ns
        .ip(&["link", "add", "br0", "type", "bridge"])
        .unwrap();
    s.node
        .ns
        .ip(&["link", "set", "eth2", "master", "br0"])
        .unwrap();
    s.node.ns.ip(&["link", "set", "eth1", "down"]).unwrap();
    std::fs::remove_file(s.cni_dir.path().join("macvtap")).unwrap();
    let args = [
        "--resource=name=dp,lowerDevice=eth1",
        "--resource=name=uplink,lowerDevice=eth2",
    ];
    // The daemon serves both, their devices Unhealthy.
    s.node.start_daemon(&args, &[]);
    for r in [DP, "macvtap.network.kubevirt.io/uplink"] {
        s.node
            .kubelet()
            .wait_for_registration(r, 0, DEADLINE)
            .await
            .unwrap();
    }
    let (code, text) = s.doctor_as(&args, "text").await;
    assert_eq!(code, 1);
    let problems: Vec<&str> = text.lines().filter(|l| l.starts_with("problem")).collect();
    assert!(
        problems
            .iter()
            .any(|l| l.contains("lower NIC eth1 is down")),
        "{text}"
    );
    assert!(
        problems
            .iter()
            .any(|l| l.contains("eth2 is a port of bridge br0")),
        "{text}"
    );
    assert!(
        problems.iter().any(|l| l.contains("no CNI binary")),
        "{text}"
    );
    assert_eq!(problems.len(), 3, "nothing else is wrong: {text}");
    assert!(Path::new(&s.node.dir.path()).is_dir());
}
