//! The error type of the device plugin.

use std::path::PathBuf;

/// Result of the device plugin library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

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
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
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
    #[error("device ID {device_id:?} does not belong to resource {resource} (capacity {capacity})")]
    UnknownDevice {
        /// The requested device ID.
        device_id: String,
        /// The resource asked.
        resource: String,
        /// Its current capacity.
        capacity: u32,
    },
    /// The resource's lower NIC is not there.
    #[error("lower device {lower} of resource {resource} does not exist")]
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
        owner: crate::discovery::Owner,
    },
    /// The kernel refused a macvtap on the lower NIC as busy, and no master
    /// owns it (an ipvlan or macsec link on it takes its receive path too).
    #[error(
        "resource {resource} cannot get a macvtap: the kernel refuses one on {lower} because \
         another device holds its receive path (EBUSY), such as an ipvlan or macsec link on it; \
         use a NIC that nothing else owns"
    )]
    LowerDeviceBusy {
        /// The resource.
        resource: String,
        /// The NIC name.
        lower: String,
    },
    /// Creating or checking the macvtap of a device failed.
    #[error("device {device_id} (link {link}): {source}")]
    Device {
        /// The device ID.
        device_id: String,
        /// The macvtap link name.
        link: String,
        /// What failed underneath.
        source: macvtap_link::Error,
    },
    /// A device's tap node never appeared, for a reason found on the node.
    #[error("device {device_id} (link {link}): {node} did not appear: {cause}")]
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
    #[error("{op}: {status}")]
    Grpc {
        /// What was being done, e.g. `registering macvtap.network.kubevirt.io/eth0`.
        op: String,
        /// The gRPC status.
        status: Box<tonic::Status>,
    },
    /// Connecting to a unix socket or serving on it failed.
    #[error("{op} {path}: {msg}")]
    Transport {
        /// What was being done.
        op: String,
        /// The socket path.
        path: PathBuf,
        /// The transport's message.
        msg: String,
    },
    /// A helper task died.
    #[error("background task failed: {0}")]
    Task(String),
}

impl Error {
    /// The gRPC code this error is reported to the kubelet with.
    pub fn grpc_code(&self) -> tonic::Code {
        match self {
            Error::UnknownDevice { .. } => tonic::Code::InvalidArgument,
            Error::LowerDeviceMissing { .. }
            | Error::LowerDeviceEnslaved { .. }
            | Error::LowerDeviceBusy { .. } => tonic::Code::FailedPrecondition,
            Error::TapNodeMissing { .. } => tonic::Code::FailedPrecondition,
            Error::Config { .. } => tonic::Code::InvalidArgument,
            _ => tonic::Code::Internal,
        }
    }

    /// This error as a gRPC status with its full message.
    pub fn to_status(&self) -> tonic::Status {
        tonic::Status::new(self.grpc_code(), self.to_string())
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }
}
