//! Helpers for the device plugin's kernel tests: a fresh network namespace
//! as the node (a veth pair as its NIC), a temp kubelet directory, and the
//! real daemon binary running inside the namespace.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use macvtap_deviceplugin::testkubelet::{TestKubelet, tap_node_lock};
use macvtap_link::{Handle, Link, Netns};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The generous deadline every wait uses.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Fails the test loudly when it cannot run: these tests need root.
pub fn require_root() {
    if !nix::unistd::geteuid().is_root() {
        panic!(
            "NOT RUN: this test needs root (it creates network namespaces and macvtap links); \
             run the suite as root"
        );
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A network namespace made by the test, deleted on drop.
pub struct TestNs {
    /// Its name under /run/netns.
    pub name: String,
}

impl TestNs {
    /// Creates a namespace with loopback up.
    pub fn new(tag: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("dpt-{tag}-{}-{n}", std::process::id());
        sh("ip", &["netns", "add", &name]);
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// Runs `ip -n <ns> ARGS` and panics on failure.
    pub fn ip(&self, args: &[&str]) {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        sh("ip", &all);
    }

    /// The namespace file.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// A netlink handle inside the namespace.
    pub fn handle(&self) -> Handle {
        Handle::in_netns(&Netns::open(self.path()).unwrap()).unwrap()
    }

    /// A link of the namespace by name.
    pub fn link(&self, name: &str) -> Option<Link> {
        self.handle().get_link(name).unwrap()
    }

    /// Adds a veth pair `name` / `<name>p` (the fake NIC and its peer), both up.
    pub fn add_nic(&self, name: &str) {
        let peer = format!("{name}p");
        self.ip(&["link", "add", name, "type", "veth", "peer", "name", &peer]);
        self.ip(&["link", "set", &peer, "up"]);
        self.ip(&["link", "set", name, "up"]);
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Runs a command and panics with its output on failure.
pub fn sh(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The daemon binary running inside a namespace.
pub struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// Starts `macvtap-deviceplugin ARGS` inside `ns` with `env` (and no
    /// inherited `DP_MACVTAP_CONF`), logging at debug level to a file.
    pub fn start(ns: &TestNs, log_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let log = log_dir.join(format!(
            "daemon-{}.log",
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &ns.name,
            env!("CARGO_BIN_EXE_macvtap-deviceplugin"),
        ])
        .args(args)
        .env_remove("DP_MACVTAP_CONF")
        .env("RUST_LOG", "macvtap_deviceplugin=debug,info")
        .stdin(Stdio::null())
        .stdout(File::create(&log).unwrap())
        .stderr(File::create(log.with_extension("err")).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self {
            child: cmd.spawn().unwrap(),
            log,
        }
    }

    /// The daemon's process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.with_extension("err")).unwrap_or_default()
    }

    /// Sends a signal.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// Waits up to `timeout` for the daemon to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The daemon's resident memory in KiB (VmRSS).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("----- daemon log -----\n{}\n----- end -----", self.log());
        }
    }
}

/// A node: namespace with NIC `eth1`, a kubelet directory, a test kubelet
/// and the daemon.
pub struct Node {
    /// The daemon (dropped first).
    pub daemon: Option<Daemon>,
    /// The kubelet's registration endpoint.
    pub kubelet: Option<TestKubelet>,
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
        require_root();
        let tap_lock = tap_node_lock().unwrap();
        let ns = TestNs::new(tag);
        ns.add_nic("eth1");
        Self {
            daemon: None,
            kubelet: None,
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

    /// The test kubelet.
    pub fn kubelet(&self) -> &TestKubelet {
        self.kubelet.as_ref().expect("kubelet started")
    }

    /// Starts the daemon with `--kubelet-dir`, metrics off, and `args`.
    pub fn start_daemon(&mut self, args: &[&str], env: &[(&str, &str)]) {
        let kdir = self.dir.path().to_str().unwrap().to_string();
        let mut all = vec!["--kubelet-dir", kdir.as_str()];
        if !args.iter().any(|a| a.starts_with("--metrics-addr")) {
            all.extend(["--metrics-addr", "off"]);
        }
        all.extend_from_slice(args);
        let d = Daemon::start(&self.ns, self.dir.path(), &all, env);
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
        if let Ok(links) = self.ns.handle().list_links() {
            for l in links.iter().filter(|l| l.is_macvtap()) {
                let _ = self.ns.handle().del_link(l.index, &l.name);
            }
        }
    }
}
