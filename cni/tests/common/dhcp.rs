//! The reference `dhcp` IPAM plugin's daemon and Debian's dnsmasq as the
//! DHCP server, for the tests that lease addresses over a macvtap.
//!
//! The daemon's socket, `/run/cni/dhcp.sock`, is one per machine: every test
//! that uses it holds [`DhcpLock`] (an exclusive `flock`, across processes,
//! worktrees and engineers), and refuses to run while a daemon it did not
//! start serves that socket.

use nix::fcntl::Flock;
use std::fs::File;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use test_support::{TestNs, require_root};

/// The reference dhcp plugin (also its daemon, with the `daemon` argument),
/// built from hack/peers/cni-plugins.
pub fn dhcp_plugin() -> PathBuf {
    test_support::gopeers::cni_plugin("dhcp").unwrap()
}
/// The daemon's socket, where the plugin looks for it.
pub const DHCP_SOCKET: &str = "/run/cni/dhcp.sock";
/// The lock every test holds while it uses [`DHCP_SOCKET`].
pub const DHCP_LOCK: &str = "/run/macvtap-test-dhcp.lock";
const DEADLINE: Duration = Duration::from_secs(10);

/// Exclusive use of [`DHCP_SOCKET`], with no daemon serving it.
pub struct DhcpLock {
    _lock: Flock<File>,
}

/// Takes the lock, then makes sure no daemon serves the socket: a live one
/// that this test did not start fails the test loudly; a stale socket is
/// removed.
pub fn lock() -> DhcpLock {
    require_root().unwrap();
    dhcp_plugin();
    let dnsmasq = "/usr/sbin/dnsmasq";
    assert!(
        Path::new(dnsmasq).exists(),
        "NOT RUN: {dnsmasq} is missing; install dnsmasq-base (hack/setup.sh does)"
    );
    let lock = test_support::flock(Path::new(DHCP_LOCK)).unwrap();
    if Path::new(DHCP_SOCKET).exists() {
        if UnixStream::connect(DHCP_SOCKET).is_ok() {
            panic!(
                "NOT RUN: a dhcp daemon that this test did not start already serves {DHCP_SOCKET}; \
                 the test starts and stops its own. Stop that daemon (or wait for the test that \
                 owns it) and run the test again."
            );
        }
        std::fs::remove_file(DHCP_SOCKET).unwrap();
    }
    DhcpLock { _lock: lock }
}

/// `dhcp daemon` (the reference plugin), stopped (and its socket removed) on drop.
pub struct DhcpDaemon {
    child: Child,
    log: PathBuf,
}

impl DhcpDaemon {
    /// Starts the daemon and waits until its socket accepts connections.
    pub fn start(_lock: &DhcpLock, log_dir: &Path) -> Self {
        std::fs::create_dir_all("/run/cni").unwrap();
        let log = log_dir.join("dhcp-daemon.log");
        let child = Command::new(dhcp_plugin())
            .args(["daemon", "-socketpath", DHCP_SOCKET])
            .stdin(Stdio::null())
            .stdout(File::create(&log).unwrap())
            .stderr(File::create(log.with_extension("err")).unwrap())
            .spawn()
            .unwrap();
        let mut d = DhcpDaemon { child, log };
        let end = Instant::now() + DEADLINE;
        while UnixStream::connect(DHCP_SOCKET).is_err() {
            if let Some(status) = d.child.try_wait().unwrap() {
                panic!("the dhcp daemon exited with {status}: {}", d.log());
            }
            assert!(
                Instant::now() < end,
                "the dhcp daemon did not serve {DHCP_SOCKET}: {}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    /// What the daemon printed.
    pub fn log(&self) -> String {
        let out = std::fs::read_to_string(&self.log).unwrap_or_default();
        let err = std::fs::read_to_string(self.log.with_extension("err")).unwrap_or_default();
        format!("{out}{err}")
    }
}

impl Drop for DhcpDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(DHCP_SOCKET);
    }
}

/// dnsmasq serving DHCP (no DNS) on one interface of a test namespace,
/// stopped on drop.
pub struct Dnsmasq {
    child: Child,
    dir: PathBuf,
}

impl Dnsmasq {
    /// Serves `first`..`last` of 192.0.2.0/24 on `iface` in `ns` (which must
    /// have an address in that subnet), keeping its files in `dir`; waits
    /// until its DHCP socket is bound.
    pub fn start(ns: &TestNs, iface: &str, first: &str, last: &str, dir: &Path) -> Self {
        let arg = |k: &str, v: &str| format!("--{k}={v}");
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns.name,
                "/usr/sbin/dnsmasq",
                "--keep-in-foreground",
            ])
            .args([
                arg("conf-file", "/dev/null"),
                // DHCP only: no DNS server.
                arg("port", "0"),
                arg("interface", iface),
                "--bind-interfaces".into(),
                arg("dhcp-range", &format!("{first},{last},255.255.255.0,5m")),
                arg("dhcp-leasefile", dir.join("leases").to_str().unwrap()),
                arg("pid-file", dir.join("dnsmasq.pid").to_str().unwrap()),
                arg("log-facility", dir.join("dnsmasq.log").to_str().unwrap()),
                "--log-dhcp".into(),
                // Stay root: the lease file lives in the test's directory.
                arg("user", "root"),
                arg("group", "root"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(dir.join("dnsmasq.err")).unwrap())
            .spawn()
            .unwrap();
        let mut d = Dnsmasq {
            child,
            dir: dir.to_path_buf(),
        };
        let end = Instant::now() + DEADLINE;
        while !d.log().contains("DHCP, sockets bound exclusively") {
            if let Some(status) = d.child.try_wait().unwrap() {
                panic!(
                    "dnsmasq exited with {status}: {} {}",
                    d.log(),
                    std::fs::read_to_string(dir.join("dnsmasq.err")).unwrap_or_default()
                );
            }
            assert!(Instant::now() < end, "dnsmasq did not start: {}", d.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    /// dnsmasq's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("dnsmasq.log")).unwrap_or_default()
    }

    /// dnsmasq's lease file: one line per lease, `expiry mac ip name client-id`.
    pub fn leases(&self) -> String {
        std::fs::read_to_string(self.dir.join("leases")).unwrap_or_default()
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `pred` holds, panicking with `what` after the deadline.
pub fn wait_until(what: &str, pred: impl Fn() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !pred() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
