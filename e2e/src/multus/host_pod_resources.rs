//! The node's PodResources API at the one path Multus reads
//! (`pkg/kubeletclient/kubeletclient.go`:
//! `/var/lib/kubelet/pod-resources/kubelet.sock`, no setting), for as long
//! as a test needs it.

use crate::kubelet_socket::LenientPodResources;
use crate::node_locks::HOST_POD_RESOURCES_LOCK;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use test_support::flock;

/// The path where Multus reads the kubelet's PodResources API (fixed).
pub const HOST_POD_RESOURCES: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The node's PodResources API, also served at [`HOST_POD_RESOURCES`] for
/// as long as this lives (see [`crate::kubelet_socket`]); tests that use
/// that path are serialised by an exclusive `flock`.
pub struct HostPodResources {
    created_dirs: Vec<PathBuf>,
    server: Option<LenientPodResources>,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl HostPodResources {
    /// Serves [`HOST_POD_RESOURCES`] with what the node's socket `upstream`
    /// answers, creating only the missing directories. Refuses when a live
    /// socket or anything else is there (a real kubelet's: these tests must
    /// not run on a real node).
    pub fn serve(upstream: &Path) -> Result<Self> {
        let lock = flock(Path::new(HOST_POD_RESOURCES_LOCK))?;
        let path = Path::new(HOST_POD_RESOURCES);
        claim_socket_path(path)?;
        let mut me = HostPodResources {
            created_dirs: Vec::new(),
            server: None,
            _lock: lock,
        };
        let mut missing = Vec::new();
        let mut d = path.parent();
        while let Some(dir) = d.filter(|d| !d.exists()) {
            missing.push(dir.to_path_buf());
            d = dir.parent();
        }
        for dir in missing.into_iter().rev() {
            std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
            me.created_dirs.push(dir);
        }
        me.server = Some(LenientPodResources::serve(path, upstream)?);
        Ok(me)
    }
}

/// Makes `path` free for a socket: nothing there is fine; a socket nobody
/// listens on (what a killed run of these tests leaves) is removed; a live
/// socket or anything else is refused.
fn claim_socket_path(path: &Path) -> Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    let stale = std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type())
        && std::os::unix::net::UnixStream::connect(path).is_err();
    if !stale {
        bail!(
            "refusing to run: {} already exists and is not a dead socket (a real kubelet's \
             PodResources socket?). The node e2e serves its test kubelet's PodResources there \
             for Multus; run it on a machine that is not a Kubernetes node",
            path.display()
        );
    }
    std::fs::remove_file(path)?;
    Ok(())
}

impl Drop for HostPodResources {
    fn drop(&mut self) {
        // Removes the socket it created.
        self.server.take();
        for d in self.created_dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_socket_is_refused_and_a_dead_one_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet.sock");
        claim_socket_path(&path).unwrap();
        let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let err = claim_socket_path(&path).unwrap_err().to_string();
        assert!(err.contains("refusing to run"), "{err}");
        assert!(path.exists());
        drop(live);
        claim_socket_path(&path).unwrap();
        assert!(!path.exists());
        std::fs::write(&path, "").unwrap();
        assert!(claim_socket_path(&path).is_err());
    }
}
