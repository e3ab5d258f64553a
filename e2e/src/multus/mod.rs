//! The real Multus (thin plugin, v4.2.2) on the sandbox node, run as a
//! container runtime runs it, with what it needs around it; one file per
//! job:
//!
//! - [`build`] builds Multus once from its pinned module
//!   (`hack/peers/multus`, fetched from the Go module proxy) and caches it
//!   (`test_support::gopeers`, which builds the other Go peers too).
//! - the fake Kubernetes API server the thin plugin talks to is
//!   `test_kubelet::FakeApiServer` (GET pod, GET NAD, PUT pod status, POST
//!   events).
//! - [`host_pod_resources`]: [`HostPodResources`] serves the node's
//!   PodResources at the one path Multus reads.
//! - [`runner`]: [`Multus`] sets Multus up on a node and runs ADD and DEL
//!   as containerd does, recording each delegate it runs
//!   ([`DelegateCall`]).

pub mod host_pod_resources;
pub mod runner;

pub use host_pod_resources::{HOST_POD_RESOURCES, HostPodResources};
pub use runner::{DelegateCall, Multus, MultusRun, Pod};

use std::io::Write;
use std::process::{Command, Stdio};

/// Builds Multus once (cached outside the checkout, see
/// `test_support::gopeers`) and returns the path of its thin plugin.
pub fn build() -> anyhow::Result<std::path::PathBuf> {
    let mut bins = test_support::gopeers::build(&test_support::gopeers::MULTUS)?;
    bins.pop()
        .ok_or_else(|| anyhow::anyhow!("the Multus build named no binary"))
}

/// The Multus release the e2e runs.
pub const VERSION: &str = "v4.2.2";
/// The annotation that selects a pod's networks.
pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";
/// The annotation Multus writes with what each network got.
pub const NETWORK_STATUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/network-status";
/// The NAD annotation naming the device plugin resource.
pub const RESOURCE_NAME_ANNOTATION: &str = "k8s.v1.cni.cncf.io/resourceName";

/// KubeVirt's pod interface name for a secondary network: `pod` followed by
/// the first 11 hex digits of sha256(network name) (kubevirt
/// `pkg/network/namescheme/networknamescheme.go`, hashed scheme).
pub fn kubevirt_pod_ifname(network: &str) -> String {
    let out = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            if let Some(mut i) = c.stdin.take() {
                i.write_all(network.as_bytes())?;
            }
            c.wait_with_output()
        });
    let hex: String = out
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .chars()
                .take(11)
                .collect()
        })
        .unwrap_or_default();
    format!("pod{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubevirt_names_the_dataplane_interface_as_it_does() {
        assert_eq!(kubevirt_pod_ifname("dataplane"), "pod9d32cad27e2");
    }
}
