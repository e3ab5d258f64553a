//! The error type of the shared link library.

use crate::op::{Op, errno_name, explain};
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
    #[error("opening network namespace {}: {}", path.display(), io_cause(source))]
    OpenNetns {
        /// Path of the namespace file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `setns` or a mount inside a helper thread failed.
    #[error(
        "entering network namespace {}: {} ({})",
        path.display(),
        source.desc(),
        errno_name(*source)
    )]
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
    #[error("opening or using a netlink socket: {}", io_cause(.0))]
    Socket(std::io::Error),
    /// The kernel refused a netlink request.
    #[error("{what}: {}", explain(*op, *source))]
    Netlink {
        /// Which operation it was, for callers that act on the kind.
        op: Op,
        /// What was being done, as a phrase with names and namespaces.
        what: String,
        /// The kernel's errno.
        source: Errno,
    },
    /// The kernel's reply broke the netlink protocol (another request's
    /// sequence number, an overrun, a truncated message); nothing in it is
    /// trusted.
    #[error("{what}: the kernel's netlink reply {problem}")]
    Protocol {
        /// What was being done.
        what: String,
        /// What was wrong with the reply, as a phrase.
        problem: String,
    },
    /// Writing a sysctl inside a namespace failed.
    #[error("writing /proc/sys/{key} in {}: {}", netns.display(), io_cause(source))]
    Sysctl {
        /// The key below `/proc/sys`, e.g. `net/ipv6/conf/net1/disable_ipv6`.
        key: String,
        /// Namespace path.
        netns: PathBuf,
        /// The OS error.
        source: std::io::Error,
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
    /// A name the kernel would refuse, or that names a namespace-wide
    /// setting, was given as an interface name.
    #[error("{name:?} is not a valid interface name ({reason})")]
    InvalidIfname {
        /// The name as given.
        name: String,
        /// The rule it breaks, e.g. `1 to 15 bytes`.
        reason: &'static str,
    },
    /// The CNI's node settings file does not parse, or holds a value that
    /// cannot work.
    #[error("{problem}")]
    NodeSettings {
        /// What is wrong, as a phrase (the parser's message, or the key).
        problem: String,
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

/// An OS error as `Input/output error (EIO)`: the words, then the errno's
/// C name people search for.
pub fn io_cause(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(raw) => {
            let errno = Errno::from_raw(raw);
            format!("{} ({})", errno.desc(), errno_name(errno))
        }
        None => e.to_string(),
    }
}

impl Error {
    /// The kernel errno behind this error, if there is one.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Error::Netlink { source, .. } | Error::EnterNetns { source, .. } => Some(*source),
            Error::OpenNetns { source, .. }
            | Error::Socket(source)
            | Error::Sysctl { source, .. } => source.raw_os_error().map(Errno::from_raw),
            _ => None,
        }
    }

    /// Which kernel operation failed, when the kernel refused one.
    pub fn op(&self) -> Option<Op> {
        match self {
            Error::Netlink { op, .. } => Some(*op),
            Error::Sysctl { .. } => Some(Op::Sysctl),
            Error::Sysfs { .. } => Some(Op::TapDevice),
            Error::OpenNetns { .. } => Some(Op::OpenNetns),
            _ => None,
        }
    }
}
