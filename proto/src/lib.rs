//! The kubelet's gRPC APIs that the macvtap device plugin speaks.
//!
//! - [`v1beta1`]: the device plugin API. The kubelet serves `Registration`
//!   on `<kubelet dir>/device-plugins/kubelet.sock`; each plugin serves
//!   `DevicePlugin` on its own socket in that directory.
//! - [`podresources::v1`]: the PodResources API, which says which device IDs
//!   the kubelet has handed to which pod.
//!
//! The `.proto` files in `proto/` were written for this project from the
//! published field names and numbers; the Rust code is generated into
//! `OUT_DIR` at build time and only `include!`d here.
//!
//! The default feature `grpc` adds the tonic clients and servers (the
//! device plugin, the test kubelet); without it the crate is only the prost
//! messages, which the CNI uses to decode PodResources `List` answers
//! without tonic, hyper or tokio.

/// The kubelet device plugin API, package `v1beta1`.
#[allow(missing_docs, clippy::all, clippy::unwrap_used, clippy::expect_used)]
pub mod v1beta1 {
    include!(concat!(env!("OUT_DIR"), "/v1beta1.rs"));

    /// The API version a plugin sends in `RegisterRequest.version`.
    pub const VERSION: &str = "v1beta1";
    /// `Device.health` of a usable device.
    pub const HEALTHY: &str = "Healthy";
    /// `Device.health` of a device the kubelet must not hand out.
    pub const UNHEALTHY: &str = "Unhealthy";
    /// File name of the kubelet's registration socket in the device-plugins directory.
    pub const KUBELET_SOCKET: &str = "kubelet.sock";
}

#[cfg(feature = "grpc")]
pub mod transport;

/// The kubelet PodResources API.
pub mod podresources {
    /// PodResources API, package `v1`.
    #[allow(missing_docs, clippy::all, clippy::unwrap_used, clippy::expect_used)]
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/v1.rs"));
    }
}

#[cfg(test)]
mod tests {
    use super::v1beta1::*;
    use prost::Message;

    #[test]
    fn field_numbers_match_the_published_api() {
        // ContainerAllocateResponse.cdi_devices is field 5, length-delimited:
        // tag byte (5 << 3) | 2 = 0x2a.
        let resp = ContainerAllocateResponse {
            cdi_devices: vec![CdiDevice { name: "a".into() }],
            ..Default::default()
        };
        assert_eq!(resp.encode_to_vec(), vec![0x2a, 3, 0x0a, 1, b'a']);
        // RegisterRequest.resource_name is field 3: tag 0x1a.
        let reg = RegisterRequest {
            resource_name: "r".into(),
            ..Default::default()
        };
        assert_eq!(reg.encode_to_vec(), vec![0x1a, 1, b'r']);
        // Device.topology is field 3, NUMANode.ID field 1 (varint).
        let dev = Device {
            topology: Some(TopologyInfo {
                nodes: vec![NumaNode { id: 1 }],
            }),
            ..Default::default()
        };
        assert_eq!(dev.encode_to_vec(), vec![0x1a, 4, 0x0a, 2, 0x08, 1]);
    }

    #[cfg(feature = "grpc")]
    #[test]
    fn grpc_paths_use_the_v1beta1_package() {
        assert_eq!(
            <registration_server::RegistrationServer<()> as tonic::server::NamedService>::NAME,
            "v1beta1.Registration"
        );
    }
}
