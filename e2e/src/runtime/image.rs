//! The runtime image: built by `hack/build-image.sh --prebuilt` with podman
//! in a private store, its config read, its file system exported once and
//! unpacked for each container (as containerd gives each a snapshot).

use super::{repo_root, strings};
use anyhow::{Context, Result, ensure};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// The parts of an image config that shape a container's process.
#[derive(Debug, Clone, Default)]
pub struct ImageConfig {
    /// `ENTRYPOINT`.
    pub entrypoint: Vec<String>,
    /// `CMD`.
    pub cmd: Vec<String>,
    /// `ENV`, as `KEY=value`.
    pub env: Vec<String>,
    /// `USER` (`uid` or `uid:gid`).
    pub user: String,
    /// `WORKDIR`.
    pub working_dir: String,
}

/// The runtime image, built by `hack/build-image.sh --prebuilt` with podman
/// from the static binaries, and exported as a file system tar (each
/// container gets its own unpacked copy, as containerd gives each a snapshot).
#[derive(Debug)]
pub struct Image {
    dir: tempfile::TempDir,
    /// The image's config.
    pub config: ImageConfig,
}

/// Runs `podman` on the private store `store` (cgroupfs manager: there is
/// no systemd here) and returns its stdout.
fn podman(store: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("podman")
        .env("CONTAINERS_STORAGE_CONF", store.join("storage.conf"))
        .args(["--cgroup-manager", "cgroupfs"])
        .args(args)
        .output()
        .context("running podman (hack/setup.sh installs it)")?;
    ensure!(
        out.status.success(),
        "podman {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Image {
    /// Builds the image from the static binaries in `static_dir` with the
    /// project's Containerfile, exports its file system and removes the
    /// image and the container used for the export.
    pub fn build(static_dir: &Path) -> Result<Self> {
        // A private image store (vfs: plain directories, no mounts) inside
        // the temp dir: nothing is left in the machine's podman storage,
        // not even the intermediate stage images a build keeps.
        let dir = tempfile::tempdir()?;
        let store = dir.path().join("store");
        std::fs::create_dir_all(&store)?;
        std::fs::write(
            store.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"vfs\"\nrunroot = \"{0}/run\"\ngraphroot = \"{0}/graph\"\n",
                store.display()
            ),
        )?;
        let tag = "localhost/macvtap-rs-runtime-test:latest";
        let out = Command::new(repo_root().join("hack/build-image.sh"))
            .env("CONTAINERS_STORAGE_CONF", store.join("storage.conf"))
            .arg("--prebuilt")
            .arg(static_dir)
            .arg(tag)
            .output()
            .context("running hack/build-image.sh")?;
        ensure!(
            out.status.success(),
            "hack/build-image.sh --prebuilt {} {tag} failed:\n{}{}",
            static_dir.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let inspect: Value = serde_json::from_str(&podman(&store, &["image", "inspect", tag])?)
            .context("podman image inspect printed no JSON")?;
        let c = &inspect[0]["Config"];
        let config = ImageConfig {
            entrypoint: strings(&c["Entrypoint"]),
            cmd: strings(&c["Cmd"]),
            env: strings(&c["Env"]),
            user: c["User"].as_str().unwrap_or_default().to_string(),
            working_dir: c["WorkingDir"].as_str().unwrap_or_default().to_string(),
        };
        let id = podman(&store, &["create", tag])?.trim().to_string();
        let tar = dir.path().join("rootfs.tar");
        podman(&store, &["export", "-o", &tar.to_string_lossy(), &id])?;
        podman(&store, &["rm", &id])?;
        Ok(Self { dir, config })
    }

    /// Unpacks the image's file system into `dest`.
    pub fn unpack(&self, dest: &Path) -> Result<()> {
        std::fs::create_dir_all(dest)?;
        let status = Command::new("tar")
            .arg("-xf")
            .arg(self.dir.path().join("rootfs.tar"))
            .arg("-C")
            .arg(dest)
            .status()
            .context("running tar")?;
        ensure!(
            status.success(),
            "unpacking the image into {}",
            dest.display()
        );
        Ok(())
    }
}
