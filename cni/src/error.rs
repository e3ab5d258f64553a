//! The CNI plugin's error type and its mapping to the spec's error codes.

use macvtap_link::Error as LinkError;
use macvtap_link::Op;
use macvtap_link::PodResourcesCheck;
use macvtap_link::error::io_cause;
use nix::errno::Errno;

/// Spec code 1: the config's version is not supported.
pub(crate) const CODE_INCOMPATIBLE_VERSION: u32 = 1;
/// Spec code 3: the container (its network namespace) does not exist.
pub(crate) const CODE_CONTAINER_UNKNOWN: u32 = 3;
/// Spec code 4: an environment variable is missing or invalid.
pub(crate) const CODE_INVALID_ENV: u32 = 4;
/// Spec code 5: an I/O failure.
pub(crate) const CODE_IO: u32 = 5;
/// Spec code 6: the config cannot be decoded.
pub(crate) const CODE_DECODE: u32 = 6;
/// Spec code 7: the config is invalid.
pub(crate) const CODE_INVALID_CONFIG: u32 = 7;
/// Spec code 11: try again later.
pub(crate) const CODE_TRY_AGAIN: u32 = 11;
/// Spec code 50 (STATUS): the plugin cannot serve ADD requests.
pub(crate) const CODE_NOT_AVAILABLE: u32 = 50;
/// Ours: the config has no `deviceID`, and the pod holds no device through
/// Dynamic Resource Allocation that could stand in.
pub(crate) const CODE_NO_DEVICE_ID: u32 = 100;
/// Ours: the device's link is not in the host namespace (without
/// `deviceID`: no DRA device of the pod's has its link there).
pub(crate) const CODE_DEVICE_LINK_MISSING: u32 = 101;
/// Ours: the device's link is not a macvtap.
pub(crate) const CODE_NOT_MACVTAP: u32 = 102;
/// Ours: the MTU asked for exceeds the lower NIC's.
pub(crate) const CODE_MTU_TOO_LARGE: u32 = 103;
/// Ours: a netlink, namespace or tap node operation failed.
pub(crate) const CODE_LINK: u32 = 104;
/// Ours: the link's ifindex would change (or did), orphaning `/dev/tapN`.
pub(crate) const CODE_IFINDEX_CHANGED: u32 = 105;
/// Ours: CHECK found the link changed.
pub(crate) const CODE_CHECK_FAILED: u32 = 106;
/// Ours: a failure, and undoing it failed too.
pub(crate) const CODE_ROLLBACK_FAILED: u32 = 107;
/// Ours: an IPAM plugin failed without error JSON.
pub(crate) const CODE_IPAM_NO_ERROR_JSON: u32 = 108;
/// Ours: the kubelet says the pod does not hold the device.
pub(crate) const CODE_DEVICE_NOT_ALLOCATED: u32 = 109;

/// Every code the plugin answers with itself, in order: those of
/// `Error::code`, with 108 for an IPAM plugin that failed without error
/// JSON (an IPAM plugin's own code is passed on besides).
pub const CODES: &[u32] = &[
    CODE_INCOMPATIBLE_VERSION,
    CODE_CONTAINER_UNKNOWN,
    CODE_INVALID_ENV,
    CODE_IO,
    CODE_DECODE,
    CODE_INVALID_CONFIG,
    CODE_TRY_AGAIN,
    CODE_NOT_AVAILABLE,
    CODE_NO_DEVICE_ID,
    CODE_DEVICE_LINK_MISSING,
    CODE_NOT_MACVTAP,
    CODE_MTU_TOO_LARGE,
    CODE_LINK,
    CODE_IFINDEX_CHANGED,
    CODE_CHECK_FAILED,
    CODE_ROLLBACK_FAILED,
    CODE_IPAM_NO_ERROR_JSON,
    CODE_DEVICE_NOT_ALLOCATED,
];

/// Result of the CNI plugin.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every way a CNI command can fail. `Error::code` maps each to the CNI
/// spec's error code, so the mapping lives in one place.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config's `cniVersion` is not one we speak, or the command does not
    /// exist in that version.
    #[error("{msg}")]
    IncompatibleVersion {
        /// What is incompatible.
        msg: String,
    },
    /// The pod's network namespace does not exist.
    #[error("network namespace {netns} of container {container_id} does not exist: {source}")]
    ContainerUnknown {
        /// `CNI_NETNS`.
        netns: String,
        /// `CNI_CONTAINERID`.
        container_id: String,
        /// Why it could not be opened.
        source: LinkError,
    },
    /// A required environment variable is missing or malformed.
    #[error("invalid environment variable {var}: {msg}")]
    InvalidEnv {
        /// Variable name.
        var: &'static str,
        /// What is wrong.
        msg: String,
    },
    /// Reading stdin, or starting a delegated plugin, failed.
    #[error("{what}: {}", io_cause(source))]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// stdin is not valid JSON.
    #[error("cannot decode the network configuration: {0}")]
    Decode(String),
    /// The network configuration is valid JSON but not a valid config.
    #[error("invalid network configuration: {0}")]
    InvalidConfig(String),
    /// `deviceID` is empty, and no device the pod holds through Dynamic
    /// Resource Allocation stands in for it.
    #[error(
        "the network configuration has no deviceID, and {why}: the pod probably does not \
         request the resource named in the NetworkAttachmentDefinition's \
         k8s.v1.cni.cncf.io/resourceName annotation (macvtap.network.kubevirt.io/<name>), \
         or the annotation is missing"
    )]
    NoDeviceId {
        /// Why no DRA device was found, as a phrase (e.g. `pod tenant-a/vm
        /// holds no device of driver macvtap.network.kubevirt.io`).
        why: String,
    },
    /// No `deviceID`, and the pod holds DRA devices of more than one of our
    /// resources, so the config must say which one this network uses.
    #[error(
        "the network configuration has no deviceID, and pod {pod} holds devices of more than \
         one macvtap resource through Dynamic Resource Allocation ({resources}), so this \
         network must say which one it uses: add {add} to the config of the \
         NetworkAttachmentDefinition of network {network:?}, the resource its \
         k8s.v1.cni.cncf.io/resourceName annotation names"
    )]
    DraResourceAmbiguous {
        /// `namespace/name` of the pod.
        pod: String,
        /// The resources, comma-separated.
        resources: String,
        /// What to add, e.g. `"resourceName": "macvtap.network.kubevirt.io/eth1"
        /// or "resourceName": "macvtap.network.kubevirt.io/eth2"`.
        add: String,
        /// The NetConf's `name`.
        network: String,
    },
    /// No `deviceID`, and every DRA device of the resource that the pod holds
    /// has its link outside the host namespace.
    #[error(
        "the network configuration has no deviceID, and none of the links of the devices of \
         {resource} that pod {pod} holds through Dynamic Resource Allocation ({devices}) is in \
         the host network namespace: each is in use by another network of this pod (a pod \
         needs one device of the resource per network), or was lost (the device plugin \
         re-creates a lost link while the pod holds its device; a retry then succeeds)"
    )]
    DraDevicesInUse {
        /// `namespace/name` of the pod.
        pod: String,
        /// The resource, `macvtap.network.kubevirt.io/<name>`.
        resource: String,
        /// The devices with their link names, e.g. `eth1Mvp0 (mvt…)`.
        devices: String,
    },
    /// No `deviceID`, and the kubelet's PodResources API could not be asked
    /// for the pod's DRA devices: whatever `podResourcesCheck` says, there is
    /// no device to go on with.
    #[error(
        "the network configuration has no deviceID, and the devices pod {pod} holds through \
         Dynamic Resource Allocation cannot be looked up: the kubelet's PodResources API at \
         {socket} {msg}; {}",
        match check {
            PodResourcesCheck::Enforce => "podResourcesCheck is enforce",
            PodResourcesCheck::Warn =>
                "podResourcesCheck is warn, but without a deviceID there is no device to go on with",
        }
    )]
    DraLookupUnavailable {
        /// `namespace/name` of the pod.
        pod: String,
        /// The socket asked.
        socket: String,
        /// What went wrong (`podresources::ListFailure`'s phrase).
        msg: String,
        /// The node's `podResourcesCheck`.
        check: PodResourcesCheck,
    },
    /// No link exists for the device ID.
    #[error(
        "device {device_id}: link {link} does not exist in the host network namespace (was the \
         device allocated by the macvtap device plugin on this node?)"
    )]
    DeviceLinkMissing {
        /// The device ID.
        device_id: String,
        /// The link name it maps to.
        link: String,
    },
    /// The link for the device ID is not a macvtap.
    #[error("device {device_id}: link {link} is a {kind}, not a macvtap; refusing to touch it")]
    NotMacvtap {
        /// The device ID.
        device_id: String,
        /// The link name it maps to.
        link: String,
        /// What the link is.
        kind: String,
    },
    /// The requested MTU is larger than the lower NIC's.
    #[error("mtu {mtu} is larger than the MTU {lower_mtu} of {lower}, the NIC under {link}")]
    MtuTooLarge {
        /// Requested MTU.
        mtu: u32,
        /// The lower NIC's MTU.
        lower_mtu: u32,
        /// The lower NIC's name.
        lower: String,
        /// The macvtap's name.
        link: String,
    },
    /// The link's ifindex changed, so `/dev/tapN` no longer names it.
    #[error("{0}")]
    IfindexChanged(String),
    /// Setting the pod link's MAC failed: another macvtap on the same lower
    /// NIC has it.
    #[error(
        "setting MAC {mac} on {ifname}: another macvtap on {lower} already uses this MAC \
         (EADDRINUSE); each VM on a NIC needs its own MAC"
    )]
    MacInUse {
        /// The MAC asked for, as `02:23:45:67:89:01`.
        mac: String,
        /// `CNI_IFNAME`.
        ifname: String,
        /// The lower NIC's name.
        lower: String,
    },
    /// A netlink or namespace operation failed.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// CHECK found the link not as ADD left it.
    #[error("check failed: {0}")]
    CheckFailed(String),
    /// A delegated IPAM plugin failed.
    #[error("IPAM plugin {plugin}: {msg}")]
    Ipam {
        /// Plugin type.
        plugin: String,
        /// The plugin's code, passed on unchanged.
        code: u32,
        /// The plugin's message (and details).
        msg: String,
    },
    /// An operation failed and undoing it failed too.
    #[error("{cause}; rolling back also failed: {rollback}")]
    RollbackFailed {
        /// The original failure.
        cause: Box<Error>,
        /// What went wrong while undoing.
        rollback: String,
    },
    /// The NetConf's `logFile` is not used; only ever logged as a warning.
    #[error(
        "logFile {path:?} is not used: {reason} (log files must be inside {dir}, which the \
         node's administrator sets with MACVTAP_CNI_LOG_DIR); logging to stderr only"
    )]
    LogFileRefused {
        /// The `logFile` as the NetConf wrote it.
        path: String,
        /// The log directory.
        dir: String,
        /// Why it was refused.
        reason: String,
    },
    /// The node settings file exists but cannot be used.
    #[error("{0}")]
    NodeSettings(String),
    /// STATUS: the node settings file cannot be used, so every ADD would fail.
    #[error("{0}; every ADD fails until it is fixed")]
    NotAvailable(String),
    /// The kubelet says the pod does not hold the device.
    #[error(
        "device {device_id} is not allocated to pod {pod}: {held}; refusing to hand over \
         another pod's device (is the NetworkAttachmentDefinition missing its \
         k8s.v1.cni.cncf.io/resourceName annotation, or does its config carry a deviceID?)"
    )]
    DeviceNotAllocated {
        /// The device ID from the config.
        device_id: String,
        /// `namespace/name` of the pod.
        pod: String,
        /// What the pod holds, as a phrase.
        held: String,
    },
    /// The kubelet's PodResources API could not be asked, and the node
    /// settings say to refuse then.
    #[error(
        "cannot check that device {device_id} is allocated to pod {pod}: the kubelet's \
         PodResources API at {socket} {msg}; podResourcesCheck is enforce"
    )]
    PodResourcesUnavailable {
        /// The device ID from the config.
        device_id: String,
        /// `namespace/name` of the pod.
        pod: String,
        /// The socket asked.
        socket: String,
        /// What went wrong, as a phrase that follows the socket
        /// (`podresources::ListFailure`), e.g. `did not answer within the 5 s wait`.
        msg: String,
    },
    /// A failure that left nothing behind and may go away on a retry.
    #[error("{0} (everything was rolled back; a retry may succeed)")]
    TryAgain(Box<Error>),
}

impl Error {
    /// The CNI spec error code: 1-99 are the spec's own, 100 and up ours.
    pub(crate) fn code(&self) -> u32 {
        match self {
            Error::IncompatibleVersion { .. } => CODE_INCOMPATIBLE_VERSION,
            Error::ContainerUnknown { .. } => CODE_CONTAINER_UNKNOWN,
            Error::InvalidEnv { .. } => CODE_INVALID_ENV,
            Error::Io { .. } | Error::LogFileRefused { .. } => CODE_IO,
            // Writing a sysctl is file I/O below /proc.
            Error::Link(e) if e.op() == Some(Op::Sysctl) => CODE_IO,
            Error::Decode(_) => CODE_DECODE,
            Error::InvalidConfig(_)
            | Error::NodeSettings(_)
            | Error::DraResourceAmbiguous { .. } => CODE_INVALID_CONFIG,
            Error::PodResourcesUnavailable { .. }
            | Error::DraLookupUnavailable { .. }
            | Error::TryAgain(_) => CODE_TRY_AGAIN,
            Error::NotAvailable(_) => CODE_NOT_AVAILABLE,
            Error::DeviceNotAllocated { .. } => CODE_DEVICE_NOT_ALLOCATED,
            Error::NoDeviceId { .. } => CODE_NO_DEVICE_ID,
            Error::DeviceLinkMissing { .. } | Error::DraDevicesInUse { .. } => {
                CODE_DEVICE_LINK_MISSING
            }
            Error::NotMacvtap { .. } => CODE_NOT_MACVTAP,
            Error::MtuTooLarge { .. } => CODE_MTU_TOO_LARGE,
            Error::Link(_) | Error::MacInUse { .. } => CODE_LINK,
            Error::IfindexChanged(_) => CODE_IFINDEX_CHANGED,
            Error::CheckFailed(_) => CODE_CHECK_FAILED,
            Error::Ipam { code, .. } => *code,
            Error::RollbackFailed { .. } => CODE_ROLLBACK_FAILED,
        }
    }

    /// Whether retrying the same command may succeed once the rollback is done.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Error::Link(e) => {
                matches!(
                    e.errno(),
                    Some(Errno::EAGAIN | Errno::EBUSY | Errno::ENOBUFS | Errno::EINTR)
                ) && e.op() != Some(Op::MoveLink)
            }
            Error::Ipam { code, .. } => *code == CODE_TRY_AGAIN,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// One error of each variant; the `match` fails to compile when a
    /// variant is added, so that its code is checked against [`CODES`].
    fn one_of_each() -> Vec<Error> {
        let link = || LinkError::Socket(std::io::Error::from_raw_os_error(1));
        let sysctl = LinkError::Sysctl {
            key: "net/ipv6/conf/net1/disable_ipv6".into(),
            netns: "/run/netns/pod".into(),
            source: std::io::Error::from_raw_os_error(13),
        };
        let all = vec![
            Error::IncompatibleVersion { msg: "m".into() },
            Error::ContainerUnknown {
                netns: "n".into(),
                container_id: "c".into(),
                source: link(),
            },
            Error::InvalidEnv {
                var: "CNI_IFNAME",
                msg: "m".into(),
            },
            Error::Io {
                what: "w".into(),
                source: std::io::Error::from_raw_os_error(5),
            },
            Error::Decode("m".into()),
            Error::InvalidConfig("m".into()),
            Error::NoDeviceId { why: "w".into() },
            Error::DraResourceAmbiguous {
                pod: "ns/p".into(),
                resources: "r".into(),
                add: "a".into(),
                network: "n".into(),
            },
            Error::DraDevicesInUse {
                pod: "ns/p".into(),
                resource: "r".into(),
                devices: "d".into(),
            },
            Error::DraLookupUnavailable {
                pod: "ns/p".into(),
                socket: "s".into(),
                msg: "m".into(),
                check: PodResourcesCheck::Warn,
            },
            Error::DeviceLinkMissing {
                device_id: "d".into(),
                link: "l".into(),
            },
            Error::NotMacvtap {
                device_id: "d".into(),
                link: "l".into(),
                kind: "veth".into(),
            },
            Error::MtuTooLarge {
                mtu: 9000,
                lower_mtu: 1500,
                lower: "eth0".into(),
                link: "l".into(),
            },
            Error::IfindexChanged("m".into()),
            Error::MacInUse {
                mac: "02:00:00:00:00:01".into(),
                ifname: "net1".into(),
                lower: "eth0".into(),
            },
            Error::Link(link()),
            Error::Link(sysctl),
            Error::CheckFailed("m".into()),
            Error::Ipam {
                plugin: "host-local".into(),
                code: CODE_IPAM_NO_ERROR_JSON,
                msg: "m".into(),
            },
            Error::RollbackFailed {
                cause: Box::new(Error::Decode("m".into())),
                rollback: "r".into(),
            },
            Error::LogFileRefused {
                path: "p".into(),
                dir: "d".into(),
                reason: "r".into(),
            },
            Error::NodeSettings("m".into()),
            Error::NotAvailable("m".into()),
            Error::DeviceNotAllocated {
                device_id: "d".into(),
                pod: "ns/p".into(),
                held: "h".into(),
            },
            Error::PodResourcesUnavailable {
                device_id: "d".into(),
                pod: "ns/p".into(),
                socket: "s".into(),
                msg: "m".into(),
            },
            Error::TryAgain(Box::new(Error::Decode("m".into()))),
        ];
        for e in &all {
            match e {
                Error::IncompatibleVersion { .. }
                | Error::ContainerUnknown { .. }
                | Error::InvalidEnv { .. }
                | Error::Io { .. }
                | Error::Decode(_)
                | Error::InvalidConfig(_)
                | Error::NoDeviceId { .. }
                | Error::DraResourceAmbiguous { .. }
                | Error::DraDevicesInUse { .. }
                | Error::DraLookupUnavailable { .. }
                | Error::DeviceLinkMissing { .. }
                | Error::NotMacvtap { .. }
                | Error::MtuTooLarge { .. }
                | Error::IfindexChanged(_)
                | Error::MacInUse { .. }
                | Error::Link(_)
                | Error::CheckFailed(_)
                | Error::Ipam { .. }
                | Error::RollbackFailed { .. }
                | Error::LogFileRefused { .. }
                | Error::NodeSettings(_)
                | Error::NotAvailable(_)
                | Error::DeviceNotAllocated { .. }
                | Error::PodResourcesUnavailable { .. }
                | Error::TryAgain(_) => {}
            }
        }
        all
    }

    #[test]
    fn codes_lists_every_code_the_errors_map_to() {
        let made: BTreeSet<u32> = one_of_each().iter().map(Error::code).collect();
        let listed: BTreeSet<u32> = CODES.iter().copied().collect();
        assert_eq!(made, listed);
        assert_eq!(listed.len(), CODES.len(), "a code is listed twice");
    }
}
