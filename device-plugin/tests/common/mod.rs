//! Helpers for the device plugin's kernel tests: a `test_support` namespace
//! as the node (a veth pair as its NIC), a temp kubelet directory, and the
//! real daemon binary running inside the namespace (`test_kubelet`'s
//! harness, started from this crate's binary).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use test_kubelet::{Daemon, TestKubelet, TestPodResources};
use test_support::tap_node_lock;
pub use test_support::{TestNs, require_root};

/// The generous deadline every wait uses.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// The port of the daemon's metrics server in the tests that serve it.
pub const METRICS_PORT: u16 = 9402;

/// The daemon binary under test.
pub fn daemon_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_macvtap-deviceplugin"))
}

/// A node: namespace with NIC `eth1`, a kubelet directory, a test kubelet
/// and the daemon.
pub struct Node {
    /// The daemon (dropped first).
    pub daemon: Option<Daemon>,
    /// The kubelet's registration endpoint.
    pub kubelet: Option<TestKubelet>,
    /// The kubelet's PodResources API, when started.
    pub pod_resources: Option<TestPodResources>,
    /// The node namespace.
    pub ns: TestNs,
    /// The kubelet directory.
    pub dir: tempfile::TempDir,
    /// Held for the node's life: see [`tap_node_lock`].
    _tap_lock: nix::fcntl::Flock<File>,
}

impl Node {
    /// A node with NIC `eth1` and no daemon or kubelet yet.
    pub fn new(tag: &str) -> Self {
        require_root().unwrap();
        let tap_lock = tap_node_lock().unwrap();
        let ns = TestNs::new(tag).unwrap();
        ns.add_nic("eth1").unwrap();
        Self {
            daemon: None,
            kubelet: None,
            pod_resources: None,
            ns,
            dir: tempfile::tempdir().unwrap(),
            _tap_lock: tap_lock,
        }
    }

    /// `<dir>/device-plugins`.
    pub fn plugin_dir(&self) -> PathBuf {
        self.dir.path().join("device-plugins")
    }

    /// Starts the test kubelet.
    pub async fn start_kubelet(&mut self) {
        self.kubelet = Some(TestKubelet::start(&self.plugin_dir()).await.unwrap());
    }

    /// Starts the kubelet's PodResources API at
    /// `<dir>/pod-resources/kubelet.sock`, reporting no devices held, so a
    /// daemon started next has every mount it asks for.
    pub async fn start_pod_resources(&mut self) {
        let socket = self.dir.path().join("pod-resources/kubelet.sock");
        self.pod_resources = Some(TestPodResources::start(&socket).await.unwrap());
    }

    /// The test kubelet.
    pub fn kubelet(&self) -> &TestKubelet {
        self.kubelet.as_ref().expect("kubelet started")
    }

    /// Starts the daemon with `--kubelet-dir`, metrics off, and `args`.
    pub fn start_daemon(&mut self, args: &[&str], env: &[(&str, &str)]) {
        self.start_daemon_under(&[], args, env);
    }

    /// Starts the daemon as [`Node::start_daemon`] does, run by `wrapper`
    /// (see [`Daemon::start_under`]).
    pub fn start_daemon_under(&mut self, wrapper: &[&str], args: &[&str], env: &[(&str, &str)]) {
        let kdir = self.dir.path().to_str().unwrap().to_string();
        let mut all = vec!["--kubelet-dir", kdir.as_str()];
        if !args.iter().any(|a| a.starts_with("--metrics-addr")) {
            all.extend(["--metrics-addr", "off"]);
        }
        all.extend_from_slice(args);
        let d = Daemon::start_under(wrapper, daemon_bin(), &self.ns, self.dir.path(), &all, env)
            .unwrap();
        self.daemon = Some(d);
    }

    /// The daemon.
    pub fn daemon(&mut self) -> &mut Daemon {
        self.daemon.as_mut().expect("daemon started")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Stop the daemon before the namespace goes.
        self.daemon.take();
        // Namespaces die asynchronously, and their macvtaps' /dev/tapN nodes
        // with them: delete the macvtaps now, while the tap-node lock is
        // held, so the next test cannot meet a stale node of the same index.
        let _ = self.ns.delete_macvtaps();
    }
}

/// The Events as `kubectl describe node` lists them (its `DescribeEvents`:
/// Age is "<last> (x<count> over <first>)" for a series, From is
/// `reportingController, reportingInstance`).
pub fn describe_events(objects: &[serde_json::Value]) -> String {
    let now = objects
        .iter()
        .filter_map(|o| {
            o["series"]["lastObservedTime"]
                .as_str()
                .or(o["eventTime"].as_str())
        })
        .max()
        .unwrap()
        .to_string();
    let secs = |t: &str| -> f64 {
        let p = |s: &str| -> f64 {
            let hms = &s[11..s.len() - 1];
            let mut it = hms.split(':');
            let h: f64 = it.next().unwrap().parse().unwrap();
            let m: f64 = it.next().unwrap().parse().unwrap();
            let s: f64 = it.next().unwrap().parse().unwrap();
            h * 3600.0 + m * 60.0 + s
        };
        (p(&now) - p(t)).max(0.0)
    };
    let mut out = String::from(
        "Events:\n  Type     Reason          Age               From                                                               Message\n  ----     ------          ----              ----                                                               -------\n",
    );
    for o in objects {
        let first = secs(o["eventTime"].as_str().unwrap());
        let age = match o["series"]["count"].as_i64() {
            Some(n) => format!(
                "{:.0}s (x{n} over {:.0}s)",
                secs(o["series"]["lastObservedTime"].as_str().unwrap()),
                first
            ),
            None => format!("{first:.0}s"),
        };
        out.push_str(&format!(
            "  {:<8} {:<15} {:<17} {:<66} {}\n",
            o["type"].as_str().unwrap(),
            o["reason"].as_str().unwrap(),
            age,
            format!(
                "{}, {}",
                o["reportingController"].as_str().unwrap(),
                o["reportingInstance"].as_str().unwrap()
            ),
            o["note"].as_str().unwrap()
        ));
    }
    out
}

/// Fetches `path` from the daemon's metrics server (`--metrics-addr`
/// 127.0.0.1:[`METRICS_PORT`] in these tests) inside `ns`, and returns the
/// response.
pub fn metrics_get(ns: &TestNs, path: &str) -> String {
    test_kubelet::http_get(ns, METRICS_PORT, path).unwrap()
}

/// Waits until the daemon's log satisfies `pred`, and returns it.
pub async fn wait_log(node: &mut Node, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let end = Instant::now() + DEADLINE;
    loop {
        let log = node.daemon().log();
        if pred(&log) {
            return log;
        }
        assert!(Instant::now() < end, "no {what} in the daemon log:\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
