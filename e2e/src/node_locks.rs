//! The locks that serialise the tests and benchmarks using the node's
//! fixed kubelet paths: the device-plugins directory
//! ([`crate::host_kubelet::HostDevicePlugins`]) and the PodResources socket
//! ([`crate::multus::HostPodResources`]), each alone or both at once for
//! what uses the whole of the node's `/var/lib/kubelet` (the real cluster's
//! kubelet).

use anyhow::Result;
use std::path::Path;
use test_support::flock;

/// The lock file that serialises the users of
/// [`crate::host_kubelet::HOST_DEVICE_PLUGINS`].
pub(crate) const HOST_DEVICE_PLUGINS_LOCK: &str = "/tmp/macvtap-host-device-plugins.lock";
/// The lock file that serialises the users of
/// [`crate::multus::host_pod_resources::HOST_POD_RESOURCES`].
pub(crate) const HOST_POD_RESOURCES_LOCK: &str = "/tmp/macvtap-host-pod-resources.lock";

/// Both node-path locks, held together by what uses the whole of the
/// node's `/var/lib/kubelet`.
pub struct NodeDirsLock {
    _locks: [nix::fcntl::Flock<std::fs::File>; 2],
}

/// Waits for and takes both locks, device plugins first (as every holder
/// of both takes them).
pub fn lock_node_dirs() -> Result<NodeDirsLock> {
    let dp = flock(Path::new(HOST_DEVICE_PLUGINS_LOCK))?;
    let pr = flock(Path::new(HOST_POD_RESOURCES_LOCK))?;
    Ok(NodeDirsLock { _locks: [dp, pr] })
}
