//! The error type of the shared link library.

use nix::errno::Errno;
use std::path::PathBuf;

/// Result of the shared link library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while working with namespaces, links and tap
/// devices. Kernel errors keep their errno so callers can act on `ENODEV`,
/// `EEXIST` or `EBUSY` on purpose.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A network namespace file could not be opened.
    #[error("opening network namespace {path}: {source}")]
    OpenNetns {
        /// Path of the namespace file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `setns` or a mount inside a helper thread failed.
    #[error("entering network namespace {path}: {source}")]
    EnterNetns {
        /// Path of the namespace file.
        path: PathBuf,
        /// The kernel's errno.
        source: Errno,
    },
    /// A helper thread that ran inside a namespace panicked.
    #[error("a thread working inside network namespace {path} panicked")]
    ThreadPanicked {
        /// Path of the namespace file.
        path: PathBuf,
    },
    /// Opening or using the netlink socket itself failed.
    #[error("netlink socket: {0}")]
    Socket(std::io::Error),
    /// The kernel refused a netlink request.
    #[error("{op}: {source}")]
    Netlink {
        /// What was being done, with names and namespaces.
        op: String,
        /// The kernel's errno.
        source: Errno,
    },
    /// A netlink reply could not be decoded.
    #[error("{op}: undecodable netlink reply: {msg}")]
    Decode {
        /// What was being done.
        op: String,
        /// The decoder's message.
        msg: String,
    },
    /// Reading the macvtap's char device from sysfs failed.
    #[error("reading the tap device of {ifname} in {netns} from sysfs: {msg}")]
    Sysfs {
        /// Interface name.
        ifname: String,
        /// Namespace path.
        netns: PathBuf,
        /// What went wrong.
        msg: String,
    },
    /// `/dev/tapN` does not exist or belongs to another link.
    #[error("{path}: {msg}")]
    TapNode {
        /// Path of the device node.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
}

impl Error {
    /// The kernel errno behind this error, if there is one.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Error::Netlink { source, .. } | Error::EnterNetns { source, .. } => Some(*source),
            Error::OpenNetns { source, .. } | Error::Socket(source) => {
                source.raw_os_error().map(Errno::from_raw)
            }
            _ => None,
        }
    }
}
