//! The device plugin daemon as a process inside a test namespace: started
//! from the binary its caller names (a test's
//! `env!("CARGO_BIN_EXE_macvtap-deviceplugin")`, or the e2e's build),
//! logging to a file, and stopped when dropped.

use anyhow::{Context, Result, bail};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use test_support::TestNs;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The daemon binary running inside a namespace.
pub struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// Starts `bin ARGS` inside `ns` with `env` (and no inherited
    /// `DP_MACVTAP_CONF`, `NODE_NAME` or `KUBECONFIG`), logging (stdout and
    /// stderr) to a file in `log_dir`, at debug level unless `env` sets
    /// `RUST_LOG`.
    pub fn start(
        bin: &Path,
        ns: &TestNs,
        log_dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        Self::start_under(&[], bin, ns, log_dir, args, env)
    }

    /// Starts like [`Daemon::start`], under `strace` with `strace_args`
    /// (with `-f`, trace output discarded), e.g. a fault injection that
    /// kills the daemon with SIGKILL at a chosen system call: a real kill at
    /// a chosen point, with no hook in the daemon. [`Daemon::pid`] is then
    /// strace's, which exits when the daemon dies.
    pub fn start_traced(
        strace_args: &[&str],
        bin: &Path,
        ns: &TestNs,
        log_dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let mut wrapper = vec!["strace", "-f", "-qq", "-o", "/dev/null"];
        wrapper.extend_from_slice(strace_args);
        wrapper.push("--");
        Self::start_under(&wrapper, bin, ns, log_dir, args, env)
    }

    /// Starts like [`Daemon::start`], as the last arguments of `wrapper`
    /// (a command that runs its arguments, e.g. one that first mounts a
    /// tmpfs on the daemon's `/dev` in a mount namespace of its own);
    /// [`Daemon::pid`] is then the wrapper's.
    pub fn start_under(
        wrapper: &[&str],
        bin: &Path,
        ns: &TestNs,
        log_dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let log = log_dir.join(format!(
            "daemon-{}.log",
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.name])
            .args(wrapper)
            .arg(bin)
            .args(args)
            .env_remove("DP_MACVTAP_CONF")
            // The discovery policy only where a test says it.
            .env_remove("MACVTAP_DISCOVERY")
            .env_remove("MACVTAP_DISCOVER_INCLUDE")
            // Events only where a test asks for them (with its own API server).
            .env_remove("NODE_NAME")
            .env_remove("KUBECONFIG")
            .env("RUST_LOG", "macvtap_deviceplugin=debug,info")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {} in {}", bin.display(), ns.name))?;
        Ok(Self { child, log })
    }

    /// The daemon's process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The file the daemon logs to (it stays after the daemon is dropped).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Sends a signal.
    pub fn signal(&self, sig: nix::sys::signal::Signal) -> Result<()> {
        let pid = i32::try_from(self.child.id())?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)
            .with_context(|| format!("sending {sig} to the daemon"))
    }

    /// Waits up to `timeout` for the daemon to exit, and returns its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(s) = self.child.try_wait()? {
                return Ok(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("the daemon did not exit within {timeout:?}")
    }

    /// The daemon's resident memory in KiB (VmRSS).
    pub fn rss_kib(&self) -> Result<u64> {
        let path = format!("/proc/{}/status", self.pid());
        let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("{path} has no VmRSS"))
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
