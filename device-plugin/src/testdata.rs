//! Unit tests only (`#[cfg(test)]`): PodResources answers as the 1.37
//! kubelet gives them, for the tests of what pods hold.

use kubelet_proto::podresources::v1::{
    ClaimResource, ContainerDevices, ContainerResources, DynamicResource, ListPodResourcesResponse,
    PodResources,
};

/// One pod whose container holds, through device plugins, each
/// `(resource, device ID)` of `devices`.
pub(crate) fn pod_with_devices(devices: &[(&str, &str)]) -> ListPodResourcesResponse {
    one_pod(ContainerResources {
        name: "compute".into(),
        devices: devices
            .iter()
            .map(|(resource, id)| ContainerDevices {
                resource_name: (*resource).into(),
                device_ids: vec![(*id).into()],
                topology: None,
            })
            .collect(),
        ..Default::default()
    })
}

/// One pod whose container holds, through claims of `driver`, the DRA
/// devices `devices`, each in a claim of its own.
pub(crate) fn pod_with_claims(driver: &str, devices: &[&str]) -> ListPodResourcesResponse {
    one_pod(ContainerResources {
        name: "compute".into(),
        dynamic_resources: devices
            .iter()
            .map(|d| DynamicResource {
                claim_name: "vm-extended-resources-x".into(),
                claim_namespace: "default".into(),
                claim_resources: vec![ClaimResource {
                    driver_name: driver.into(),
                    pool_name: "node-1".into(),
                    device_name: (*d).into(),
                    ..Default::default()
                }],
            })
            .collect(),
        ..Default::default()
    })
}

/// The answer listing one pod, `vm` of namespace `default`, with
/// `container`.
fn one_pod(container: ContainerResources) -> ListPodResourcesResponse {
    ListPodResourcesResponse {
        pod_resources: vec![PodResources {
            name: "vm".into(),
            namespace: "default".into(),
            containers: vec![container],
        }],
    }
}
