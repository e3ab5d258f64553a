//! The daemon's network namespace on one kernel, and where the host's file
//! systems are: the one handle that link creation, reclaim and heal do
//! their kernel work through, and [`SharedHost`], the one such handle that
//! every Allocate shares. The daemon passes the real kernel
//! ([`macvtap_link::Linux`]) and the real paths; unit tests pass the fake
//! kernel (and temporary directories), so every decision runs without root.

use crate::core::link::not_devtmpfs;
use macvtap_link::{Kernel, Links, Netns, Result};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Whether the kernel's tap nodes show in the tap node directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TapNodes {
    /// It is the host's devtmpfs: every macvtap's `/dev/tapN` appears there.
    #[default]
    Shown,
    /// It is not devtmpfs (a privileged container's own `/dev`, copied at its
    /// start; a kind node's tmpfs), so no new tap node ever shows there.
    Unseen {
        /// The file system type it is instead, e.g. `tmpfs`.
        fstype: String,
    },
}

/// Where the host's sysfs, devtmpfs and procfs are, as the daemon sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    /// sysfs (`/sys`); in the daemon's mount namespace it shows the daemon's
    /// network namespace (the host's, or the node namespace of a test).
    pub sysfs: PathBuf,
    /// Where the kernel's tap nodes appear (`/dev`).
    pub dev: PathBuf,
    /// procfs (`/proc`), for the mount table.
    pub proc: PathBuf,
    /// Whether tap nodes show in `dev` (`HostPaths::judged` reads it from
    /// the mount table; shown unless judged otherwise).
    pub tap_nodes: TapNodes,
}

impl Default for HostPaths {
    /// `/sys`, `/dev` and `/proc`.
    fn default() -> Self {
        Self {
            sysfs: PathBuf::from("/sys"),
            dev: PathBuf::from("/dev"),
            proc: PathBuf::from("/proc"),
            tap_nodes: TapNodes::Shown,
        }
    }
}

impl HostPaths {
    /// The default paths with tap nodes in `dev` instead.
    pub fn with_dev(dev: impl Into<PathBuf>) -> Self {
        Self {
            dev: dev.into(),
            ..Self::default()
        }
    }

    /// The mount table of this process (`<proc>/self/mountinfo`).
    pub(crate) fn mountinfo(&self) -> PathBuf {
        self.proc.join("self/mountinfo")
    }

    /// The tap node directory.
    pub(crate) fn dev(&self) -> &Path {
        &self.dev
    }

    /// The same paths with [`HostPaths::tap_nodes`] read from the mount
    /// table: unseen when `dev` is a mount other than devtmpfs, shown when
    /// it is devtmpfs or its mount cannot be told (as before this was asked).
    pub(crate) fn judged(mut self) -> Self {
        let mountinfo = std::fs::read_to_string(self.mountinfo()).unwrap_or_default();
        self.tap_nodes = match not_devtmpfs(&self.dev, &mountinfo) {
            Some(fstype) => TapNodes::Unseen { fstype },
            None => TapNodes::Shown,
        };
        self
    }

    /// Whether the kernel's tap nodes show in the tap node directory.
    pub(crate) fn tap_nodes_shown(&self) -> bool {
        self.tap_nodes == TapNodes::Shown
    }
}

/// The host's network namespace on `kernel` (in tests, the namespace that
/// stands for the node): its link operations, and the namespace itself for
/// what is read from inside it (a macvtap's char device in sysfs) and the
/// tap nodes of its macvtaps.
pub struct Host<'k> {
    kernel: &'k dyn Kernel,
    netns: Netns,
    link_ops: Box<dyn Links + Send + 'k>,
    paths: HostPaths,
}

impl<'k> Host<'k> {
    /// The calling thread's namespace on `kernel`: the host's, since the
    /// daemon never changes namespace.
    pub fn current(kernel: &'k dyn Kernel) -> Result<Self> {
        Ok(Self {
            kernel,
            netns: kernel.current_netns()?,
            // A socket of the calling thread's own: no helper thread.
            link_ops: kernel.links(None)?,
            paths: HostPaths::default(),
        })
    }

    /// The host's namespace held as `netns` (a test node's, when the caller
    /// is elsewhere), with a netlink socket opened inside it from a helper
    /// thread.
    pub fn in_netns(kernel: &'k dyn Kernel, netns: Netns) -> Result<Self> {
        let link_ops = kernel.links(Some(&netns))?;
        Ok(Self {
            kernel,
            netns,
            link_ops,
            paths: HostPaths::default(),
        })
    }

    /// The same namespace with the host's file systems at `paths`.
    pub fn with_paths(mut self, paths: HostPaths) -> Self {
        self.paths = paths;
        self
    }

    /// Where the host's sysfs, tap nodes and procfs are.
    pub(crate) fn paths(&self) -> &HostPaths {
        &self.paths
    }

    /// The kernel, for sysfs reads and tap nodes.
    pub(crate) fn kernel(&self) -> &'k dyn Kernel {
        self.kernel
    }

    /// The namespace.
    pub(crate) fn netns(&self) -> &Netns {
        &self.netns
    }

    /// The link, address and route operations, on a netlink socket inside
    /// the namespace (the fake kernel's in unit tests).
    pub fn link_ops(&self) -> &dyn Links {
        self.link_ops.as_ref()
    }
}

/// The host handle (the namespace's descriptor and a netlink socket) that
/// every request of a front shares, saving a socket set-up per request (the
/// daemon never leaves the host namespace). One, whatever thread of the
/// blocking pool serves the next request: a handle per thread would hold a
/// pair of descriptors for every thread the pool ever ran one on.
pub struct SharedHost<'k> {
    kernel: &'k dyn Kernel,
    paths: HostPaths,
    spare: Mutex<Option<Host<'k>>>,
}

impl<'k> SharedHost<'k> {
    /// The calling thread's namespace on `kernel` (the real one in the
    /// daemon, the fake in unit tests), with the host's file systems at
    /// `paths`; no handle is opened before the first `SharedHost::run`.
    pub fn new(kernel: &'k dyn Kernel, paths: HostPaths) -> Self {
        Self {
            kernel,
            paths,
            spare: Mutex::new(None),
        }
    }

    /// Runs `f` on the calling thread's namespace, through the spare handle
    /// when it is that namespace's (a thread elsewhere, only in tests, opens
    /// its own). A handle whose run failed is not kept; of two runs at
    /// once, the second to finish closes its own.
    pub(crate) fn run<T, E: From<macvtap_link::Error>>(
        &self,
        f: impl FnOnce(&Host<'k>) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let spare = self
            .spare
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take_if(|h| h.netns().is_current());
        let host = match spare {
            Some(host) => host,
            None => Host::current(self.kernel)?.with_paths(self.paths.clone()),
        };
        let result = f(&host);
        if result.is_ok() {
            self.spare
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(host);
        }
        result
    }
}

impl fmt::Debug for SharedHost<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedHost")
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Host<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Host")
            .field("netns", &self.netns.path())
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/dev` judged from a mount table whose `/dev` line is `line` (none
    /// when empty).
    fn judged_with(line: &str) -> TapNodes {
        let proc = tempfile::tempdir().unwrap();
        std::fs::create_dir(proc.path().join("self")).unwrap();
        if !line.is_empty() {
            let root = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n";
            std::fs::write(
                proc.path().join("self/mountinfo"),
                format!("{root}{line}\n"),
            )
            .unwrap();
        }
        HostPaths {
            proc: proc.path().to_path_buf(),
            ..HostPaths::default()
        }
        .judged()
        .tap_nodes
    }

    #[test]
    fn tap_nodes_are_unseen_only_where_dev_is_a_mount_other_than_devtmpfs() {
        assert_eq!(
            judged_with("23 22 0:5 / /dev rw,nosuid - devtmpfs udev rw"),
            TapNodes::Shown
        );
        // A privileged container's own /dev.
        assert_eq!(
            judged_with("23 22 0:40 / /dev rw,nosuid - tmpfs tmpfs rw,mode=755"),
            TapNodes::Unseen {
                fstype: "tmpfs".into()
            }
        );
        // No mount table to read: as before it was asked.
        assert_eq!(judged_with(""), TapNodes::Shown);
    }
}
