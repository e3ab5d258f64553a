//! The error type of the device plugin.

use std::path::PathBuf;

/// Result of the device plugin library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One kind of Allocate refusal as the kubelet gets it: the gRPC code, and
/// words that only its message holds (the message itself begins with the
/// resource or device it is about).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The status code.
    pub code: tonic::Code,
    /// Words of the message that tell this refusal from the others; empty
    /// for `INTERNAL`, which takes every other failure.
    pub words: &'static str,
}

/// Refused: the kubelet asked for a device ID the resource does not have.
pub(crate) const UNKNOWN_DEVICE: Refusal = Refusal {
    code: tonic::Code::InvalidArgument,
    words: "has no device",
};
/// Refused: the resource's NIC does not exist.
pub(crate) const LOWER_DEVICE_MISSING: Refusal = Refusal {
    code: tonic::Code::FailedPrecondition,
    words: "cannot get a macvtap: its NIC",
};
/// Refused: a bridge, bond, team or OVS owns the resource's NIC.
pub(crate) const LOWER_DEVICE_ENSLAVED: Refusal = Refusal {
    code: tonic::Code::FailedPrecondition,
    words: crate::core::nic::master::NEEDS_FREE_NIC,
};
/// Refused: another device (ipvlan, macsec) holds the NIC's receive path.
pub(crate) const LOWER_DEVICE_BUSY: Refusal = Refusal {
    code: tonic::Code::FailedPrecondition,
    words: "another device holds its receive path (EBUSY)",
};
/// Refused: another macvlan/macvtap port on the NIC rules out the
/// resource's mode (a passthru macvtap must be alone on its NIC).
pub(crate) const PORT_IN_THE_WAY: Refusal = Refusal {
    code: tonic::Code::FailedPrecondition,
    words: crate::core::nic::port::PASSTHRU_ALONE,
};
/// Refused: the device's `/dev/tapN` never appeared, for a reason found on
/// the node (its `/dev` is not devtmpfs).
pub(crate) const TAP_NODE_MISSING: Refusal = Refusal {
    code: tonic::Code::FailedPrecondition,
    words: "did not appear",
};
/// Failed: any other error (the kernel refused an operation on the link).
pub(crate) const INTERNAL: Refusal = Refusal {
    code: tonic::Code::Internal,
    words: "",
};
/// Every kind of Allocate refusal, with the words of its message.
pub const ALLOCATE_REFUSALS: &[Refusal] = &[
    UNKNOWN_DEVICE,
    LOWER_DEVICE_MISSING,
    LOWER_DEVICE_ENSLAVED,
    LOWER_DEVICE_BUSY,
    PORT_IN_THE_WAY,
    TAP_NODE_MISSING,
    INTERNAL,
];

/// Everything that can go wrong in the device plugin. Variants name the
/// resource, device ID, link or path they are about.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is invalid; `source_name` says where it came from
    /// (`--resource`, the config file, `DP_MACVTAP_CONF`).
    #[error("invalid configuration from {source_name}: {msg}")]
    Config {
        /// Where the configuration came from.
        source_name: String,
        /// What is wrong, naming the offending entry.
        msg: String,
    },
    /// A file could not be read or written.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done, e.g. `reading the config file`.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The record directory in the device-plugins directory is refused: it
    /// is not a directory the daemon made (a symbolic link, another kind of
    /// file, another user's directory), so nothing is written through it.
    #[error("the record directory {} {why}", path.display())]
    RecordDir {
        /// The directory.
        path: PathBuf,
        /// What it is, and what to do.
        why: String,
    },
    /// Installing the CNI binary was refused or failed.
    #[error("installing the CNI binary into {target_dir}: {msg}")]
    Install {
        /// The target directory.
        target_dir: PathBuf,
        /// What went wrong.
        msg: String,
    },
    /// A device ID that this resource does not own.
    #[error(
        "resource {resource} {} {device_id:?} (its {capacity} devices are {}): the kubelet may \
         hold an allocation made before the resource's capacity was lowered or its name changed",
        UNKNOWN_DEVICE.words,
        device_range(resource, *capacity)
    )]
    UnknownDevice {
        /// The requested device ID.
        device_id: String,
        /// The resource asked.
        resource: String,
        /// Its current capacity.
        capacity: u32,
    },
    /// The resource's lower NIC is not there.
    #[error(
        "resource {resource} {} {lower} does not exist on this node (it was renamed or removed, \
         or lowerDevice is misspelled in the configuration)",
        LOWER_DEVICE_MISSING.words
    )]
    LowerDeviceMissing {
        /// The resource.
        resource: String,
        /// The NIC name.
        lower: String,
    },
    /// A master owns the resource's lower NIC, so the kernel refuses a
    /// macvtap on it; the message names the master and the fix.
    #[error("resource {resource} cannot get a macvtap: {owner}")]
    LowerDeviceEnslaved {
        /// The resource.
        resource: String,
        /// The NIC's master.
        owner: crate::core::nic::master::Owner,
    },
    /// The kernel refused a macvtap on the lower NIC as busy, and no master
    /// owns it (an ipvlan or macsec link on it takes its receive path too).
    #[error(
        "resource {resource} cannot get a macvtap: the kernel refuses one on {lower} because {}, \
         such as an ipvlan or macsec link on it; use a NIC that nothing else owns",
        LOWER_DEVICE_BUSY.words
    )]
    LowerDeviceBusy {
        /// The resource.
        resource: String,
        /// The NIC name.
        lower: String,
    },
    /// Another macvlan/macvtap port on the NIC rules out the resource's
    /// mode; the message names the port and what to do.
    #[error("resource {resource} cannot get a macvtap: {port}")]
    PortInTheWay {
        /// The resource.
        resource: String,
        /// The port in the way.
        port: crate::core::nic::port::PortInTheWay,
    },
    /// Creating or checking the macvtap of a device failed.
    #[error("device {device_id} (macvtap {link}): {source}")]
    Device {
        /// The device ID.
        device_id: String,
        /// The macvtap link name.
        link: String,
        /// What failed underneath.
        source: macvtap_link::Error,
    },
    /// A device's tap node never appeared, for a reason found on the node.
    #[error("device {device_id} (macvtap {link}): {node} {}: {cause}", TAP_NODE_MISSING.words)]
    TapNodeMissing {
        /// The device ID.
        device_id: String,
        /// The macvtap link name.
        link: String,
        /// The node that was expected, e.g. `/dev/tap7`.
        node: PathBuf,
        /// Why it cannot appear.
        cause: String,
    },
    /// A netlink or namespace operation of the shared link library failed.
    #[error(transparent)]
    Link(#[from] macvtap_link::Error),
    /// A gRPC call to the kubelet failed.
    #[error("{op}: {}", kubelet_status_text(status))]
    Grpc {
        /// What was being done, e.g. `registering macvtap.network.kubevirt.io/eth0`.
        op: String,
        /// The gRPC status.
        status: Box<tonic::Status>,
    },
    /// Binding or dialing a unix socket failed (the kubelet's, ours).
    #[error(transparent)]
    Socket(#[from] kubelet_proto::transport::Error),
    /// A TCP listener (the metrics server's) could not be bound.
    #[error("{op} {path}: {msg}")]
    Transport {
        /// What was being done.
        op: String,
        /// The socket path.
        path: PathBuf,
        /// The transport's message.
        msg: String,
    },
    /// Watching a directory with inotify failed.
    #[error("watching {dir} with inotify: {}", watch_cause(*errno))]
    Watch {
        /// The directory.
        dir: PathBuf,
        /// The kernel's error.
        errno: nix::errno::Errno,
    },
    /// A helper task or thread of the daemon died or could not start.
    #[error("{0}")]
    Task(String),
    /// A ResourceClaim the kubelet asked the DRA front to prepare that it
    /// cannot prepare as allocated.
    #[error("ResourceClaim {claim} cannot be prepared on this node: {why}")]
    Claim {
        /// The claim, `namespace/name`.
        claim: String,
        /// Why.
        why: String,
    },
    /// A call to the Kubernetes API server failed.
    #[error("{op}: {msg}")]
    Api {
        /// What was asked, e.g. `getting ResourceClaim default/vm-1`.
        op: String,
        /// The API server's or the client's answer.
        msg: String,
    },
}

/// `resource`'s device IDs as a range, e.g. `dpMvp0 to dpMvp3`.
fn device_range(resource: &str, capacity: u32) -> String {
    let name = resource.rsplit('/').next().unwrap_or(resource);
    match capacity {
        0 => "none".into(),
        1 => macvtap_link::device_id(name, 0),
        n => format!(
            "{} to {}",
            macvtap_link::device_id(name, 0),
            macvtap_link::device_id(name, n - 1)
        ),
    }
}

/// A gRPC status from the kubelet as a sentence: what the code means, the
/// kubelet's message and underlying causes, and the usual reason for codes
/// that have one. (tonic's own `Display` includes a `Debug` dump of the cause.)
pub(crate) fn kubelet_status_text(status: &tonic::Status) -> String {
    // A Go kubelet's refusal (`fmt.Errorf`) arrives as Unknown: its own
    // words are the message.
    let mut text = if status.code() == tonic::Code::Unknown && !status.message().is_empty() {
        status.message().to_string()
    } else if status.message().is_empty() {
        lower_first(status.code().description())
    } else {
        format!(
            "{}: {}",
            lower_first(status.code().description()),
            status.message()
        )
    };
    if let Some(cause) = std::error::Error::source(status) {
        let chain = kubelet_proto::transport::error_chain(cause);
        if !text.contains(&chain) {
            text.push_str(": ");
            text.push_str(&chain);
        }
    }
    let hint = match status.code() {
        tonic::Code::Unavailable => {
            Some("the kubelet is not serving on its socket (stopped or restarting)")
        }
        tonic::Code::DeadlineExceeded => Some("the kubelet is overloaded or hung"),
        tonic::Code::Unimplemented => Some("this kubelet does not serve that call"),
        _ => None,
    };
    if let Some(h) = hint {
        text.push_str("; ");
        text.push_str(h);
    }
    text
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => String::new(),
    }
}

/// What an inotify watch error usually means.
fn watch_cause(errno: nix::errno::Errno) -> String {
    use nix::errno::Errno;
    match errno {
        Errno::ENOENT => "the directory does not exist".into(),
        Errno::ENOTDIR => "it is not a directory".into(),
        Errno::EACCES => "permission denied".into(),
        Errno::ENOSPC => "the node's inotify watch limit is reached (ENOSPC); raise the sysctl \
                          fs.inotify.max_user_watches"
            .into(),
        e => format!("{} ({e})", e.desc()),
    }
}

impl Error {
    /// The gRPC code this error is reported to the kubelet with.
    pub fn grpc_code(&self) -> tonic::Code {
        match self {
            Error::Config { .. } => tonic::Code::InvalidArgument,
            _ => self.refusal().code,
        }
    }

    /// The kind of Allocate refusal this error is, one of
    /// [`ALLOCATE_REFUSALS`].
    pub(crate) fn refusal(&self) -> Refusal {
        match self {
            Error::UnknownDevice { .. } => UNKNOWN_DEVICE,
            Error::LowerDeviceMissing { .. } => LOWER_DEVICE_MISSING,
            Error::LowerDeviceEnslaved { .. } => LOWER_DEVICE_ENSLAVED,
            Error::LowerDeviceBusy { .. } => LOWER_DEVICE_BUSY,
            Error::PortInTheWay { .. } => PORT_IN_THE_WAY,
            Error::TapNodeMissing { .. } => TAP_NODE_MISSING,
            _ => INTERNAL,
        }
    }

    /// This error as a gRPC status with its full message.
    pub(crate) fn to_status(&self) -> tonic::Status {
        tonic::Status::new(self.grpc_code(), self.to_string())
    }

    /// A closure making an [`Error::Device`] for device `id`'s link `name`
    /// from a kernel error, for `map_err`.
    pub(crate) fn device<'a>(
        id: &'a str,
        name: &'a str,
    ) -> impl Fn(macvtap_link::Error) -> Error + Copy + 'a {
        move |source| Error::Device {
            device_id: id.to_string(),
            link: name.to_string(),
            source,
        }
    }

    /// A closure making an [`Error::Io`] for `op` on `path`, for `map_err`.
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { op, path, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_refusals_name_the_resource_the_object_and_the_cause() {
        let e = Error::UnknownDevice {
            device_id: "dpMvp7".into(),
            resource: "macvtap.network.kubevirt.io/dp".into(),
            capacity: 4,
        };
        assert_eq!(
            e.to_string(),
            "resource macvtap.network.kubevirt.io/dp has no device \"dpMvp7\" (its 4 devices are \
             dpMvp0 to dpMvp3): the kubelet may hold an allocation made before the resource's \
             capacity was lowered or its name changed"
        );
        let e = Error::LowerDeviceMissing {
            resource: "macvtap.network.kubevirt.io/dp".into(),
            lower: "eth1".into(),
        };
        assert_eq!(
            e.to_string(),
            "resource macvtap.network.kubevirt.io/dp cannot get a macvtap: its NIC eth1 does not \
             exist on this node (it was renamed or removed, or lowerDevice is misspelled in the \
             configuration)"
        );
        assert_eq!(e.grpc_code(), tonic::Code::FailedPrecondition);
        let e = Error::LowerDeviceBusy {
            resource: "macvtap.network.kubevirt.io/dp".into(),
            lower: "eth1".into(),
        };
        assert!(
            e.to_string()
                .contains("another device holds its receive path (EBUSY)")
        );
        // The status the kubelet gets carries the same sentence.
        assert_eq!(e.to_status().message(), e.to_string());
    }

    #[test]
    fn every_refusal_has_its_code_and_only_its_own_words() {
        let resource = String::from("macvtap.network.kubevirt.io/dp");
        let refused = [
            Error::UnknownDevice {
                device_id: "dpMvp7".into(),
                resource: resource.clone(),
                capacity: 4,
            },
            Error::LowerDeviceMissing {
                resource: resource.clone(),
                lower: "eth1".into(),
            },
            Error::LowerDeviceEnslaved {
                resource: resource.clone(),
                owner: crate::core::nic::master::Owner {
                    link: "eth1".into(),
                    master: "br0".into(),
                    kind: Some("bridge".into()),
                },
            },
            Error::LowerDeviceBusy {
                resource: resource.clone(),
                lower: "eth1".into(),
            },
            Error::PortInTheWay {
                resource,
                port: crate::core::nic::port::PortInTheWay {
                    lower: "eth1".into(),
                    link: Some(("mvt0123456789ab".into(), "macvtap".into())),
                    ours_passthru: true,
                },
            },
            Error::TapNodeMissing {
                device_id: "dpMvp0".into(),
                link: "dpMvp0".into(),
                node: "/dev/tap7".into(),
                cause: "/dev is a tmpfs mount".into(),
            },
            Error::Task("the Allocate task failed: cancelled".into()),
        ];
        let kinds: Vec<Refusal> = refused.iter().map(Error::refusal).collect();
        assert_eq!(kinds, ALLOCATE_REFUSALS);
        for e in &refused {
            let status = e.to_status();
            assert_eq!(status.code(), e.refusal().code, "{e}");
            for other in ALLOCATE_REFUSALS {
                if other.words.is_empty() {
                    continue;
                }
                assert_eq!(
                    status.message().contains(other.words),
                    *other == e.refusal(),
                    "{e} / {:?}",
                    other.words
                );
            }
        }
    }

    #[test]
    fn kubelet_statuses_read_as_sentences_without_debug_dumps() {
        let op = "registering macvtap.network.kubevirt.io/dp with the kubelet".to_string();
        let e = Error::Grpc {
            op: op.clone(),
            status: Box::new(tonic::Status::unknown("the ResourceName \"x\" is invalid")),
        };
        assert_eq!(
            e.to_string(),
            format!("{op}: the ResourceName \"x\" is invalid")
        );
        let e = Error::Grpc {
            op: op.clone(),
            status: Box::new(tonic::Status::deadline_exceeded("no answer within 5000 ms")),
        };
        assert_eq!(
            e.to_string(),
            format!(
                "{op}: deadline expired before operation could complete: no answer within 5000 \
                 ms; the kubelet is overloaded or hung"
            )
        );
        let e = Error::Grpc {
            op,
            status: Box::new(tonic::Status::unavailable("")),
        };
        let text = e.to_string();
        assert!(
            text.ends_with(
                "the service is currently unavailable; the kubelet is not serving on its \
                 socket (stopped or restarting)"
            ),
            "{text}"
        );
        assert!(
            !text.contains("code:") && !text.contains("MetadataMap"),
            "{text}"
        );
    }

    #[test]
    fn a_full_inotify_watch_table_is_not_called_a_full_disk() {
        let e = Error::Watch {
            dir: "/etc/macvtap".into(),
            errno: nix::errno::Errno::ENOSPC,
        };
        assert_eq!(
            e.to_string(),
            "watching /etc/macvtap with inotify: the node's inotify watch limit is reached \
             (ENOSPC); raise the sysctl fs.inotify.max_user_watches"
        );
        let e = Error::Watch {
            dir: "/etc/macvtap".into(),
            errno: nix::errno::Errno::ENOENT,
        };
        assert_eq!(
            e.to_string(),
            "watching /etc/macvtap with inotify: the directory does not exist"
        );
    }

    #[test]
    fn io_errors_say_what_was_being_done() {
        let e = Error::io("reading the config file", "/etc/macvtap/conf.json")(
            std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        assert_eq!(
            e.to_string(),
            "reading the config file /etc/macvtap/conf.json: entity not found"
        );
    }
}
