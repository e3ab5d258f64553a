//! Running a CNI plugin binary the way a runtime does, timed.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The reference plugins' directory (`CNI_PATH` for IPAM and chained
/// plugins), built on first use from hack/peers/cni-plugins.
fn cni_path() -> Result<std::path::PathBuf> {
    test_support::gopeers::cni_plugins_dir()
}

/// One timed plugin run.
#[derive(Debug)]
pub struct Exec {
    /// Spawn to exit.
    pub took: Duration,
    /// Exit status was success.
    pub ok: bool,
    /// stdout.
    pub stdout: String,
}

/// Runs `plugin` with the CNI environment and `stdin`, timing spawn to exit.
pub fn cni(
    plugin: &Path,
    command: &str,
    netns: &str,
    ifname: &str,
    args: &str,
    stdin: &str,
) -> Result<Exec> {
    cni_with_env(plugin, command, netns, ifname, args, stdin, &[])
}

/// [`cni`] with `env` added to the plugin's environment.
pub fn cni_with_env(
    plugin: &Path,
    command: &str,
    netns: &str,
    ifname: &str,
    args: &str,
    stdin: &str,
    env: &[(&str, &str)],
) -> Result<Exec> {
    let start = Instant::now();
    let mut child = Command::new(plugin)
        .env_clear()
        .env("CNI_COMMAND", command)
        .env(
            "CNI_CONTAINERID",
            format!("bench-{}", netns.rsplit('/').next().unwrap_or("x")),
        )
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", ifname)
        .env("CNI_PATH", cni_path()?)
        .env("CNI_ARGS", args)
        .env("MACVTAP_CNI_LOG_LEVEL", "warn")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", plugin.display()))?;
    if let Some(mut i) = child.stdin.take() {
        i.write_all(stdin.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    Ok(Exec {
        took: start.elapsed(),
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    })
}

/// Times a plain command (e.g. `/bin/true`).
pub fn plain(program: &Path) -> Result<Duration> {
    let start = Instant::now();
    let status = Command::new(program)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "{} failed", program.display());
    Ok(start.elapsed())
}
