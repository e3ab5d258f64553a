//! Throwaway network namespaces for the e2e tests, the sandbox node and the
//! benchmarks; each is deleted on drop.

use anyhow::{Context, Result, bail};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Fails with a clear message when not root.
pub fn require_root() -> Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!(
            "NOT RUN: needs root (network namespaces, macvtap links); run as root as .ci/run does"
        );
    }
    Ok(())
}

/// Runs `ip` with `args`; an error carries its stderr.
pub fn ip(args: &[&str]) -> Result<String> {
    let mut all = vec!["ip"];
    all.extend_from_slice(args);
    run(&all)
}

/// Runs the program `args[0]` with the rest as arguments and returns its
/// stdout; an error carries its stderr.
pub fn run(args: &[&str]) -> Result<String> {
    let (program, rest) = args.split_first().context("no program to run")?;
    let out = Command::new(program)
        .args(rest)
        .output()
        .with_context(|| format!("running {program} (hack/setup.sh installs it)"))?;
    if !out.status.success() {
        bail!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A named network namespace, deleted on drop.
#[derive(Debug)]
pub struct TestNs {
    /// Its name under `/run/netns`.
    pub name: String,
}

impl TestNs {
    /// Creates `mvt-<pid>-<n>-<tag>` with `lo` up.
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

    /// Runs `ip -n <name> args`.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Runs `f` on a thread inside this namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
        let ns = macvtap_link::Netns::open(self.path())?;
        ns.run(|| Ok(f()))?
    }

    /// Names of the links in this namespace.
    pub fn links(&self) -> Result<Vec<String>> {
        let out = self.ip(&["-j", "link", "show"])?;
        let v: serde_json::Value = serde_json::from_str(&out)?;
        Ok(v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|l| l["ifname"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}
