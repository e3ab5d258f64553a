//! The kubelet's default device-plugins directory,
//! `/var/lib/kubelet/device-plugins/`, claimed for as long as a test or
//! benchmark needs it: the Go project's device plugin (kubevirt/macvtap-cni
//! v0.13.1) knows no other directory, so the side-by-side benchmarks and the
//! upgrade e2e serve their test kubelet there.

use crate::node_locks::HOST_DEVICE_PLUGINS_LOCK;
use anyhow::{Context, Result, bail};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use test_support::flock;

/// The kubelet's default device-plugins directory (fixed in the Go project).
pub const HOST_DEVICE_PLUGINS: &str = "/var/lib/kubelet/device-plugins";

/// [`HOST_DEVICE_PLUGINS`], claimed: an exclusive `flock` serialises the
/// tests and benchmarks that use it, a live `kubelet.sock` there (a real
/// kubelet's) is refused, and the directories it had to create and the
/// sockets left in it are removed when this is dropped.
pub struct HostDevicePlugins {
    dir: PathBuf,
    created_dirs: Vec<PathBuf>,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl HostDevicePlugins {
    /// Claims [`HOST_DEVICE_PLUGINS`], waiting for another claim to end.
    pub fn claim() -> Result<Self> {
        Self::claim_at(
            Path::new(HOST_DEVICE_PLUGINS),
            Path::new(HOST_DEVICE_PLUGINS_LOCK),
        )
    }

    fn claim_at(dir: &Path, lock_path: &Path) -> Result<Self> {
        let lock = flock(lock_path)?;
        let kubelet_sock = dir.join("kubelet.sock");
        if std::os::unix::net::UnixStream::connect(&kubelet_sock).is_ok() {
            bail!(
                "refusing to run: {} is a live socket (a real kubelet's?). The Go project's \
                 device plugin knows only this directory, so these tests serve a test kubelet \
                 there; run them on a machine that is not a Kubernetes node",
                kubelet_sock.display()
            );
        }
        let mut me = HostDevicePlugins {
            dir: dir.to_path_buf(),
            created_dirs: Vec::new(),
            _lock: lock,
        };
        let mut missing = Vec::new();
        let mut d = Some(dir);
        while let Some(p) = d.filter(|p| !p.exists()) {
            missing.push(p.to_path_buf());
            d = p.parent();
        }
        for p in missing.into_iter().rev() {
            std::fs::create_dir(&p).with_context(|| format!("creating {}", p.display()))?;
            me.created_dirs.push(p);
        }
        // What a killed earlier run left: dead sockets only.
        me.remove_sockets();
        Ok(me)
    }

    /// The claimed directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn remove_sockets(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_socket()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

impl Drop for HostDevicePlugins {
    fn drop(&mut self) {
        self.remove_sockets();
        for d in self.created_dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_kubelet_socket_is_refused_and_what_was_made_is_removed() {
        let root = tempfile::tempdir().unwrap();
        let lock = root.path().join("lock");
        let dir = root.path().join("var/lib/kubelet/device-plugins");
        let claim = HostDevicePlugins::claim_at(&dir, &lock).unwrap();
        assert!(dir.is_dir());
        let sock = dir.join("plugin.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        drop(claim);
        assert!(!root.path().join("var").exists(), "created dirs left");
        drop(listener);

        std::fs::create_dir_all(&dir).unwrap();
        let live = std::os::unix::net::UnixListener::bind(dir.join("kubelet.sock")).unwrap();
        let err = HostDevicePlugins::claim_at(&dir, &lock)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("refusing to run"), "{err}");
        drop(live);
        // A dead kubelet.sock (a killed run's) is cleared, the directory kept.
        let claim = HostDevicePlugins::claim_at(&dir, &lock).unwrap();
        assert!(!dir.join("kubelet.sock").exists());
        drop(claim);
        assert!(dir.is_dir());
    }
}
