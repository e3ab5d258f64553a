//! What the daemon leaves undone when a mount of the host's is missing, as
//! the Go project's DaemonSets run it (privileged, no `/dev`, no
//! `pod-resources`): one sentence per gap, saying what cannot be done and
//! which mount would enable it. The warning in the log, the Node Event and
//! `doctor`'s finding all say that sentence.
//!
//! - Without the host's `/dev` (the tap node directory is not devtmpfs, see
//!   [`TapNodes`]), Allocate answers each device's host `/dev/tapN` from
//!   sysfs, unchecked, and lost links are never re-created: a link moved
//!   into a pod and a lost one look the same when no tap node shows.
//! - Without the kubelet's PodResources API, which devices pods hold is
//!   unknown: no leaked link is deleted and no lost one re-created.

use crate::core::host::{HostPaths, TapNodes};
use std::fmt;
use std::path::{Path, PathBuf};

/// A mount whose absence leaves part of the daemon's work undone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Degraded {
    /// No tap node shows in the tap node directory.
    NoHostDev {
        /// The tap node directory.
        dev: PathBuf,
        /// The file system type it is instead of devtmpfs, e.g. `tmpfs`.
        fstype: String,
    },
    /// The kubelet's PodResources API cannot be read.
    NoPodResources {
        /// Its socket, as the daemon sees it.
        socket: PathBuf,
        /// Why not (the socket does not exist, the call failed).
        why: String,
    },
}

impl Degraded {
    /// The gap of `paths`' tap node directory, if tap nodes do not show
    /// there.
    pub(crate) fn of_dev(paths: &HostPaths) -> Option<Self> {
        match &paths.tap_nodes {
            TapNodes::Shown => None,
            TapNodes::Unseen { fstype } => Some(Self::NoHostDev {
                dev: paths.dev.clone(),
                fstype: fstype.clone(),
            }),
        }
    }

    /// The gap of a PodResources socket at `socket` that cannot be read
    /// because of `why`.
    pub(crate) fn pod_resources(socket: &Path, why: impl Into<String>) -> Self {
        Self::NoPodResources {
            socket: socket.to_path_buf(),
            why: why.into(),
        }
    }

    /// The mount that would close the gap, as the DaemonSet names its
    /// hostPath: the host's `/dev`, or the kubelet's `pod-resources`
    /// directory.
    pub(crate) fn mount(&self) -> PathBuf {
        match self {
            Self::NoHostDev { .. } => PathBuf::from("/dev"),
            Self::NoPodResources { socket, .. } => socket
                .parent()
                .map_or_else(|| socket.clone(), Path::to_path_buf),
        }
    }
}

impl fmt::Display for Degraded {
    /// The one sentence: what is missing, what is left undone, which mount
    /// would enable it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoHostDev { dev, fstype } => write!(
                f,
                "the host's /dev is not mounted at {} (a {fstype} mount, not devtmpfs, where no \
                 tap node made after the container started shows), so Allocate answers each \
                 device's host /dev/tapN from sysfs without seeing the node, and lost macvtaps \
                 are never re-created (without tap nodes a macvtap moved into a pod cannot be \
                 told from a lost one); mount the host's /dev (hostPath /dev, read-only) at {} \
                 to enable both",
                dev.display(),
                dev.display()
            ),
            Self::NoPodResources { socket, why } => {
                let dir = self.mount();
                let mounted = if dir.is_dir() {
                    "the kubelet does not serve it there, or --kubelet-dir is not its root dir"
                } else {
                    "its directory is not mounted in this container"
                };
                write!(
                    f,
                    "the kubelet's PodResources API at {} cannot be read ({why}; {mounted}), so \
                     which devices pods hold is unknown: leaked macvtaps are never deleted and \
                     lost ones never re-created until it can; mount the host's {} (hostPath) at \
                     {} to enable both",
                    socket.display(),
                    dir.display(),
                    dir.display()
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_gap_names_what_is_left_undone_and_the_mount_that_enables_it() {
        let paths = HostPaths {
            tap_nodes: TapNodes::Unseen {
                fstype: "tmpfs".into(),
            },
            ..HostPaths::default()
        };
        let dev = Degraded::of_dev(&paths).unwrap();
        let text = dev.to_string();
        for want in [
            "the host's /dev is not mounted at /dev (a tmpfs mount, not devtmpfs",
            "Allocate answers each device's host /dev/tapN from sysfs",
            "lost macvtaps are never re-created",
            "mount the host's /dev (hostPath /dev, read-only) at /dev",
        ] {
            assert!(text.contains(want), "want {want:?} in: {text}");
        }
        assert_eq!(dev.mount(), Path::new("/dev"));
        assert_eq!(Degraded::of_dev(&HostPaths::default()), None);

        // The daemon's default socket, in a directory this test never makes.
        let socket = Path::new("/nonexistent/var/lib/kubelet/pod-resources/kubelet.sock");
        let pr = Degraded::pod_resources(socket, "it does not exist");
        let text = pr.to_string();
        for want in [
            "/nonexistent/var/lib/kubelet/pod-resources/kubelet.sock cannot be read (it does not exist; its directory is not mounted in this container)",
            "leaked macvtaps are never deleted and lost ones never re-created",
            "mount the host's /nonexistent/var/lib/kubelet/pod-resources (hostPath)",
        ] {
            assert!(text.contains(want), "want {want:?} in: {text}");
        }
        assert_eq!(
            pr.mount(),
            Path::new("/nonexistent/var/lib/kubelet/pod-resources")
        );
        // Mounted, but nothing answers there.
        let dir = tempfile::tempdir().unwrap();
        let text = Degraded::pod_resources(&dir.path().join("kubelet.sock"), "refused").to_string();
        assert!(
            text.contains("(refused; the kubelet does not serve it there"),
            "{text}"
        );
    }
}
