//! Stand-ins for the programs around our binaries, for the workspace's tests
//! only (`publish = false`; no shipped crate depends on it, and it depends
//! on neither binary's crate nor on kube).
//!
//! - [`registration`]: the kubelet's device manager ([`TestKubelet`]):
//!   Registration, then the plugin driven as the real kubelet drives it.
//! - [`plugin_client`]: a test's own client of a plugin socket
//!   ([`PluginClient`], [`DeviceWatch`]).
//! - [`pod_resources`]: the kubelet's PodResources API
//!   ([`TestPodResources`]), behind the kubelet's rate limit
//!   ([`rate_limit`]).
//! - [`daemon`]: the device plugin daemon as a process in a test namespace.
//! - [`apiserver`]: a plain-HTTP Kubernetes API server: Events for the
//!   device plugin, Pods and NetworkAttachmentDefinitions for Multus; it
//!   records requests.
//! - [`http`]: one HTTP GET from inside a namespace.
//! - [`tools`]: the outside test tools of `hack/setup.sh`'s virtual
//!   environment.
//!
//! The gRPC transport is the one the device plugin uses
//! (`kubelet_proto::transport`); the namespace fixtures and the tap-node
//! lock are `test_support`'s. Errors are `anyhow` errors, as there.

pub mod apiserver;
pub mod daemon;
pub mod http;
pub mod plugin_client;
pub mod pod_resources;
pub mod rate_limit;
pub mod registration;
pub mod tools;

pub use apiserver::{ApiRequest, FakeApiServer, validate_event_v1};
pub use daemon::Daemon;
pub use http::{http_get, http_get_here};
pub use plugin_client::{DeviceWatch, PluginClient, summary};
pub use pod_resources::{
    PreparedClaim, PreparedDevice, TEST_POD, TestPodResources, dynamic_resources,
};
pub use rate_limit::TokenBucket;
pub use registration::{Disconnect, Refusal, ResourceView, TestKubelet, is_extended_resource_name};
/// The gRPC status codes [`TestPodResources::fail`] answers with.
pub use tonic::Code;

/// Locks `m`, also when a panicking test thread poisoned it.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
