//! Unit tests only (`#[cfg(test)]`): PodResources answers as the 1.37
//! kubelet gives them, for the tests of what pods hold.

use kubelet_proto::podresources::v1::{
    ClaimResource, ContainerResources, DynamicResource, ListPodResourcesResponse, PodResources,
};

/// One pod whose container holds, through claims of `driver`, the DRA
/// devices `devices`, each in a claim of its own.
pub(crate) fn pod_with_claims(driver: &str, devices: &[&str]) -> ListPodResourcesResponse {
    ListPodResourcesResponse {
        pod_resources: vec![PodResources {
            name: "vm".into(),
            namespace: "default".into(),
            containers: vec![ContainerResources {
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
            }],
        }],
    }
}
