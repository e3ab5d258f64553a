//! Throwaway network namespaces for tests, the sandbox node and the
//! benchmarks: each is named after the process that made it (so a later run
//! can sweep the ones a killed run left, see [`crate::tapnode`]) and deleted
//! on drop. Veth pairs play the node's NICs, as there is no `dummy` link
//! type on these machines.

use anyhow::{Context, Result, bail};
use macvtap_link::{Handle, Link, Links, Netns};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Fails with a "NOT RUN" message when not root: namespaces and macvtaps
/// need it, and a test that cannot run must never pass.
pub fn require_root() -> Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!(
            "NOT RUN: this needs root (network namespaces, macvtap links); \
             run it as root, as .ci/run does"
        );
    }
    Ok(())
}

/// Runs `args[0]` with the other arguments and returns its stdout; when it
/// fails, the error carries the command line and its stderr.
pub fn sh(args: &[&str]) -> Result<String> {
    let (program, rest) = args.split_first().context("no command given to run")?;
    let out = Command::new(program).args(rest).output().with_context(|| {
        format!("running {program} (is it installed? hack/setup.sh installs it)")
    })?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `ip ARGS` (iproute2) as [`sh`] does.
pub fn ip(args: &[&str]) -> Result<String> {
    let mut all = vec!["ip"];
    all.extend_from_slice(args);
    sh(&all)
}

/// A named network namespace with `lo` up, deleted on drop.
#[derive(Debug)]
pub struct TestNs {
    /// Its name under `/run/netns`: `mvt-<pid>-<n>-<tag>`.
    pub name: String,
}

impl TestNs {
    /// Creates `mvt-<pid>-<n>-<tag>` with `lo` up; fails with "NOT RUN"
    /// without root.
    pub fn new(tag: &str) -> Result<Self> {
        require_root()?;
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("mvt-{}-{n}-{tag}", std::process::id());
        ip(&["netns", "add", &name])?;
        let ns = TestNs { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `/run/netns/<name>`.
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// Runs `ip -n <name> ARGS`.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// The namespace, opened.
    pub fn netns(&self) -> Result<Netns> {
        Ok(Netns::open(self.path())?)
    }

    /// A netlink handle inside the namespace.
    pub fn handle(&self) -> Result<Handle> {
        Ok(Handle::in_netns(&self.netns()?)?)
    }

    /// A link of the namespace by name, as netlink reports it.
    pub fn link(&self, name: &str) -> Result<Option<Link>> {
        Ok(self.handle()?.get_link(name)?)
    }

    /// Runs `f` on a thread inside this namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
        self.netns()?.run(|| Ok(f()))?
    }

    /// `ip -d -j link show` of every link in the namespace.
    pub fn links_json(&self) -> Result<Vec<Value>> {
        let out = self.ip(&["-d", "-j", "link", "show"])?;
        let v: Value = serde_json::from_str(&out)
            .with_context(|| format!("`ip -j link show` in {} printed no JSON", self.name))?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// Names of the links in this namespace.
    pub fn links(&self) -> Result<Vec<String>> {
        Ok(self
            .links_json()?
            .iter()
            .filter_map(|l| l["ifname"].as_str().map(str::to_string))
            .collect())
    }

    /// `ip -d -j link show dev NAME` of one link, or `None` when `ip` finds
    /// no such link.
    pub fn link_json(&self, name: &str) -> Result<Option<Value>> {
        let Ok(out) = self.ip(&["-d", "-j", "link", "show", "dev", name]) else {
            return Ok(None);
        };
        let v: Value = serde_json::from_str(&out)
            .with_context(|| format!("`ip -j link show dev {name}` printed no JSON"))?;
        Ok(v.as_array().and_then(|a| a.first()).cloned())
    }

    /// Adds a veth pair `name` / `<name>p` (a fake NIC and its peer), both
    /// up, in this namespace.
    pub fn add_nic(&self, name: &str) -> Result<()> {
        let peer = format!("{name}p");
        self.ip(&["link", "add", name, "type", "veth", "peer", "name", &peer])?;
        self.ip(&["link", "set", &peer, "up"])?;
        self.ip(&["link", "set", name, "up"])?;
        Ok(())
    }

    /// Adds a veth pair whose end `name` (the fake NIC) is here and whose end
    /// `peer_name` is in `peer` (the host across the wire), both up.
    pub fn add_nic_to(&self, name: &str, peer: &TestNs, peer_name: &str) -> Result<()> {
        self.ip(&[
            "link", "add", name, "type", "veth", "peer", "name", peer_name, "netns", &peer.name,
        ])?;
        self.ip(&["link", "set", name, "up"])?;
        peer.ip(&["link", "set", peer_name, "up"])?;
        Ok(())
    }

    /// Deletes every macvtap in the namespace now: a namespace dies
    /// asynchronously, and its macvtaps' `/dev/tapN` nodes with it, so a
    /// fixture that holds the tap-node lock deletes them before letting go.
    pub fn delete_macvtaps(&self) -> Result<()> {
        delete_macvtaps_in(Path::new(&self.path()))
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Deletes every macvtap in the namespace at `path`; best effort past the
/// look-up, as teardown is.
pub(crate) fn delete_macvtaps_in(path: &Path) -> Result<()> {
    let handle = Handle::in_netns(&Netns::open(path)?)?;
    for l in handle.list_links()?.iter().filter(|l| l.is_macvtap()) {
        let _ = handle.del_link(l.index, &l.name);
    }
    Ok(())
}
