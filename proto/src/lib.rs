//! The kubelet's gRPC APIs that the macvtap device plugin speaks.
//!
//! - [`v1beta1`]: the device plugin API. The kubelet serves `Registration`
//!   on `<kubelet dir>/device-plugins/kubelet.sock`; each plugin serves
//!   `DevicePlugin` on its own socket in that directory.
//! - [`podresources::v1`]: the PodResources API, which says which device IDs
//!   (and which DRA-prepared devices) the kubelet has handed to which pod.
//! - [`dra::v1`]: the Dynamic Resource Allocation plugin API, which the
//!   kubelet calls to prepare and unprepare a claim's devices.
//! - [`dra::health::v1`]: the DRA device health API, through which the
//!   kubelet follows the health of a driver's devices (KEP-4680).
//! - [`pluginregistration`]: the kubelet's plugin watcher API, through which
//!   a DRA plugin registers: the kubelet dials the plugin's socket in
//!   `<kubelet dir>/plugins_registry/` and asks it what it is.
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

/// The kubelet's DRA plugin API.
pub mod dra {
    /// DRA plugin API, package `k8s.io.kubelet.pkg.apis.dra.v1`.
    #[allow(missing_docs, clippy::all, clippy::unwrap_used, clippy::expect_used)]
    pub mod v1 {
        include!(concat!(
            env!("OUT_DIR"),
            "/k8s.io.kubelet.pkg.apis.dra.v1.rs"
        ));

        /// The service name a DRA plugin lists in `PluginInfo.supported_versions`.
        pub const SERVICE: &str = "v1.DRAPlugin";
    }

    /// The kubelet's DRA device health API, `v1.DRAResourceHealth`
    /// (KEP-4680), served beside the DRA plugin service.
    pub mod health {
        #[allow(missing_docs, clippy::all, clippy::unwrap_used, clippy::expect_used)]
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/dra_health/v1.rs"));

            /// The service's name in a registration's supported versions.
            pub const SERVICE: &str = "v1.DRAResourceHealth";
        }
    }
}

/// The kubelet's plugin registration API (package `pluginregistration`).
#[allow(missing_docs, clippy::all, clippy::unwrap_used, clippy::expect_used)]
pub mod pluginregistration {
    include!(concat!(env!("OUT_DIR"), "/pluginregistration.rs"));

    /// `PluginInfo.type` of a DRA plugin.
    pub const DRA_PLUGIN: &str = "DRAPlugin";
}

#[cfg(feature = "grpc")]
pub mod transport;

#[cfg(feature = "grpc")]
pub mod authority;

#[cfg(feature = "grpc")]
pub mod routes;

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

    #[test]
    fn dra_field_numbers_match_the_published_api() {
        use crate::dra::v1 as dra;
        // Device.cdi_device_ids is field 4 (tag 0x22), share_id field 5 (0x2a).
        let dev = dra::Device {
            cdi_device_ids: vec!["a".into()],
            share_id: Some("s".into()),
            ..Default::default()
        };
        assert_eq!(dev.encode_to_vec(), vec![0x22, 1, b'a', 0x2a, 1, b's']);
        // Claim: namespace 1, uid 2, name 3.
        let claim = dra::Claim {
            namespace: "n".into(),
            uid: "u".into(),
            name: "c".into(),
        };
        assert_eq!(
            claim.encode_to_vec(),
            vec![0x0a, 1, b'n', 0x12, 1, b'u', 0x1a, 1, b'c']
        );
        // PluginInfo.supported_versions is field 4 (tag 0x22).
        let info = crate::pluginregistration::PluginInfo {
            supported_versions: vec!["v".into()],
            ..Default::default()
        };
        assert_eq!(info.encode_to_vec(), vec![0x22, 1, b'v']);
        // PodResources ClaimResource: driver_name 2, pool_name 3, device_name 4.
        let res = crate::podresources::v1::ClaimResource {
            driver_name: "d".into(),
            pool_name: "p".into(),
            device_name: "x".into(),
            ..Default::default()
        };
        assert_eq!(
            res.encode_to_vec(),
            vec![0x12, 1, b'd', 0x1a, 1, b'p', 0x22, 1, b'x']
        );
    }

    #[test]
    fn dra_health_field_numbers_match_the_published_api() {
        use crate::dra::health::v1 as h;
        let d = h::DeviceHealth {
            device: Some(h::DeviceIdentifier {
                pool_name: "p".into(),
                device_name: "d".into(),
            }),
            health: h::HealthStatus::Unhealthy as i32,
            last_updated_time: 1,
            health_check_timeout_seconds: 2,
            message: "m".into(),
        };
        assert_eq!(
            d.encode_to_vec(),
            vec![
                0x0a, 6, 0x0a, 1, b'p', 0x12, 1, b'd', 0x10, 2, 0x18, 1, 0x20, 2, 0x2a, 1, b'm'
            ]
        );
        let r = h::NodeWatchResourcesResponse { devices: vec![d] };
        assert_eq!(r.encode_to_vec()[0], 0x0a);
    }

    #[cfg(feature = "grpc")]
    #[test]
    fn dra_health_grpc_path_uses_the_published_package() {
        assert_eq!(
            <crate::dra::health::v1::dra_resource_health_server::DraResourceHealthServer<()> as tonic::server::NamedService>::NAME,
            "v1.DRAResourceHealth"
        );
    }

    #[cfg(feature = "grpc")]
    #[test]
    fn dra_and_registration_grpc_paths_use_the_published_packages() {
        assert_eq!(
            <crate::dra::v1::dra_plugin_server::DraPluginServer<()> as tonic::server::NamedService>::NAME,
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
        );
        assert_eq!(
            <crate::pluginregistration::registration_server::RegistrationServer<()> as tonic::server::NamedService>::NAME,
            "pluginregistration.Registration"
        );
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
