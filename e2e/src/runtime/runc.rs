//! The runc lifecycle of one container: a bundle with a fresh copy of the
//! image, `runc run` in the foreground from the test's mount namespace (as a
//! node's runtime runs it), `state`, `kill`, and on drop a kill and
//! `delete --force` (its state and cgroups).

use super::COUNTER;
use super::image::Image;
use anyhow::{Context, Result, ensure};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// One container run by `runc run` in the foreground, as a child of the
/// test: `runc` exits with the container's exit status. Dropping it kills
/// the container and deletes it, its cgroup and its bundle.
#[derive(Debug)]
pub struct RuncContainer {
    /// The container ID.
    pub id: String,
    /// The bundle: `config.json` and `rootfs/`.
    pub bundle: tempfile::TempDir,
    state: tempfile::TempDir,
    log: PathBuf,
    child: Option<Child>,
}

impl RuncContainer {
    /// Writes a bundle for `config` with a fresh copy of `image`'s file
    /// system; the container's stdout and stderr go to `log`.
    pub fn create(id: &str, config: &Value, image: &Image, log: &Path) -> Result<Self> {
        let bundle = tempfile::tempdir()?;
        image.unpack(&bundle.path().join("rootfs"))?;
        std::fs::write(
            bundle.path().join("config.json"),
            serde_json::to_vec_pretty(config)?,
        )?;
        Ok(Self {
            id: id.to_string(),
            bundle,
            state: tempfile::tempdir()?,
            log: log.to_path_buf(),
            child: None,
        })
    }

    fn runc(&self) -> Command {
        let mut cmd = Command::new("runc");
        cmd.arg("--root").arg(self.state.path());
        cmd
    }

    /// Starts `runc run` (from the test's own mount namespace, as a node's
    /// runtime runs it).
    pub fn start(&mut self) -> Result<()> {
        let log = std::fs::File::create(&self.log)?;
        let child = self
            .runc()
            .arg("run")
            .arg("--bundle")
            .arg(self.bundle.path())
            .arg(&self.id)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("running runc (hack/setup.sh installs it)")?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits up to `timeout` for the container to exit; `None` if it still
    /// runs.
    pub fn wait(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let child = self
            .child
            .as_mut()
            .context("the container was not started")?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The exit status if the container has exited, without waiting.
    pub fn exited(&mut self) -> Result<Option<ExitStatus>> {
        let child = self
            .child
            .as_mut()
            .context("the container was not started")?;
        Ok(child.try_wait()?)
    }

    /// What the container (and runc) printed.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The container's init process as the host sees it (`runc state`).
    pub fn pid(&self) -> Result<u32> {
        let out = self.runc().arg("state").arg(&self.id).output()?;
        ensure!(
            out.status.success(),
            "runc state {}: {}",
            self.id,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let state: Value = serde_json::from_slice(&out.stdout)?;
        ensure!(
            state["status"] == "running",
            "container {} is {}",
            self.id,
            state["status"]
        );
        let pid = state["pid"].as_u64().context("runc state has no pid")?;
        Ok(u32::try_from(pid)?)
    }

    /// `runc kill ID SIGNAL`, as the runtime stops a container.
    pub fn kill(&self, signal: &str) -> Result<()> {
        let out = self.runc().arg("kill").arg(&self.id).arg(signal).output()?;
        ensure!(
            out.status.success(),
            "runc kill {} {signal}: {}",
            self.id,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    }
}

impl Drop for RuncContainer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = self.kill("KILL");
                let deadline = Instant::now() + Duration::from_secs(5);
                while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        // Removes the container's state and its cgroups.
        let _ = self
            .runc()
            .args(["delete", "--force", &self.id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A unique name for a runc container or cgroup of this test process.
pub fn unique_id(tag: &str) -> String {
    format!(
        "mvt-{}-{}-{tag}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}
