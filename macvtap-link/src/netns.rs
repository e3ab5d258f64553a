//! Network namespaces held as file descriptors, and running code inside one.
//!
//! A process never switches its own threads between namespaces: work that
//! must happen inside a namespace (opening a netlink socket, reading that
//! namespace's sysfs) runs on a short-lived thread that enters it and exits.

use crate::error::{Error, Result};
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, setns, unshare};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// How messages name the calling thread's namespace ([`Netns::current`]): a
/// `/proc/thread-self` path would name a thread that is gone by then.
pub const CURRENT_NETNS: &str = "the current network namespace";

/// An open network namespace, with the path it was opened from for messages.
#[derive(Debug)]
pub struct Netns {
    fd: OwnedFd,
    path: PathBuf,
}

impl Netns {
    /// Opens the network namespace at `path` (e.g. `/var/run/netns/pod-1` or
    /// `/proc/1234/ns/net`).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|source| Error::OpenNetns {
            path: path.clone(),
            source,
        })?;
        Ok(Self {
            fd: file.into(),
            path,
        })
    }

    /// Opens the network namespace of the calling thread; messages call it
    /// [`CURRENT_NETNS`].
    pub fn current() -> Result<Self> {
        let mut netns = Self::open("/proc/thread-self/ns/net")?;
        netns.path = PathBuf::from(CURRENT_NETNS);
        Ok(netns)
    }

    /// Holds a namespace descriptor opened elsewhere (e.g. through a pidfd,
    /// or received over a unix socket), named `path` in messages. That it is
    /// a network namespace is checked when a thread enters it.
    pub fn from_fd(fd: OwnedFd, path: impl Into<PathBuf>) -> Self {
        Self {
            fd,
            path: path.into(),
        }
    }

    /// Whether this is the calling thread's namespace now (the same
    /// namespace inode); false when either cannot be looked at.
    pub fn is_current(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let held = nix::sys::stat::fstat(self.fd.as_fd());
        let now = std::fs::metadata("/proc/thread-self/ns/net");
        match (held, now) {
            (Ok(h), Ok(n)) => h.st_dev == n.dev() && h.st_ino == n.ino(),
            _ => false,
        }
    }

    /// The path this namespace was opened from ([`CURRENT_NETNS`] for
    /// [`Netns::current`]), for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on a new thread that has entered this namespace, and returns
    /// its result. The calling thread never changes namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    self.enter_current_thread()?;
                    f()
                })
                .join()
                .map_err(|_| Error::ThreadPanicked {
                    path: self.path.clone(),
                })?
        })
    }

    /// Like [`Netns::run`], but the thread also gets a private mount namespace
    /// with a fresh sysfs on `/sys`, so `/sys/class/net` shows this network
    /// namespace's links (if `/sys` already shows them, it is used as is).
    /// The mounts vanish with the thread.
    pub fn run_with_sysfs<T: Send>(&self, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
        self.run(|| {
            let enter_err = |source| Error::EnterNetns {
                path: self.path.clone(),
                source,
            };
            unshare(CloneFlags::CLONE_NEWNS).map_err(enter_err)?;
            mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .map_err(enter_err)?;
            match mount(
                Some("sysfs"),
                "/sys",
                Some("sysfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None::<&str>,
            ) {
                // EBUSY: this namespace's sysfs is already what /sys shows
                // (e.g. under `ip netns exec` or in a hostNetwork pod).
                Ok(()) | Err(nix::errno::Errno::EBUSY) => {}
                Err(e) => return Err(enter_err(e)),
            }
            f()
        })
    }

    fn enter_current_thread(&self) -> Result<()> {
        setns(&self.fd, CloneFlags::CLONE_NEWNET).map_err(|source| Error::EnterNetns {
            path: self.path.clone(),
            source,
        })
    }
}

impl AsFd for Netns {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
