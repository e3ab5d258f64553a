//! Which of this node's devices a ResourceClaim was allocated, read from
//! its `status.allocation.devices.results` as the kubelet's reference
//! driver reads them (kubernetes `test/e2e/dra/test-driver/app/
//! kubeletplugin.go`): only results of our driver and of this node's pool
//! are ours, and each must name a device this node serves.

use crate::config::ResourceConfig;
use crate::error::{Error, Result};
use k8s_openapi::api::resource::v1::ResourceClaim;
use macvtap_link::device_id;
use macvtap_link::dra::{DRIVER, dra_device_index};

/// One device of ours a claim was allocated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocated {
    /// The claim's requests this device serves (usually one).
    pub request_names: Vec<String>,
    /// The resource the device belongs to.
    pub resource: String,
    /// The device plugin's ID of the device, `<name>Mvp<i>`.
    pub device_id: String,
    /// The DRA device name, as published.
    pub device_name: String,
}

/// The devices `claim` (whose UID must be `uid`) was allocated from pool
/// `pool` of our driver, resolved against the resources this node serves;
/// in the order of the claim's results, a device named by two requests
/// listed once with both. A claim with no result of ours is an error: the
/// kubelet asks us only for claims with one.
pub fn allocated(
    claim: &ResourceClaim,
    uid: &str,
    pool: &str,
    served: &[ResourceConfig],
) -> Result<Vec<Allocated>> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let refuse = |why: String| Error::Claim {
        claim: format!("{namespace}/{name}"),
        why,
    };
    if claim.metadata.uid.as_deref() != Some(uid) {
        return Err(refuse(format!(
            "it has UID {}, not {uid}: the claim was deleted and made again",
            claim.metadata.uid.as_deref().unwrap_or("(none)")
        )));
    }
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .ok_or_else(|| refuse("it is not allocated".to_string()))?;
    let mut out: Vec<Allocated> = Vec::new();
    for r in results.iter().filter(|r| r.driver == DRIVER) {
        if r.pool != pool {
            return Err(refuse(format!(
                "device {} is allocated from pool {}, and this node's pool is {pool}",
                r.device, r.pool
            )));
        }
        let found = served
            .iter()
            .find_map(|cfg| dra_device_index(&cfg.name, cfg.capacity, &r.device).map(|i| (cfg, i)));
        let Some((cfg, i)) = found else {
            return Err(refuse(format!(
                "device {} is not one this node serves now",
                r.device
            )));
        };
        if let Some(a) = out.iter_mut().find(|a| a.device_name == r.device) {
            a.request_names.push(r.request.clone());
            continue;
        }
        out.push(Allocated {
            request_names: vec![r.request.clone()],
            resource: cfg.name.clone(),
            device_id: device_id(&cfg.name, i),
            device_name: r.device.clone(),
        });
    }
    if out.is_empty() {
        return Err(refuse(format!(
            "no device of driver {DRIVER} is allocated to it"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use macvtap_link::MacvtapMode;

    fn served() -> Vec<ResourceConfig> {
        vec![ResourceConfig {
            name: "eth1".into(),
            lower_device: "eth1".into(),
            mode: MacvtapMode::Bridge,
            capacity: 4,
            placement: None,
        }]
    }

    fn claim(results: &[(&str, &str, &str, &str)]) -> ResourceClaim {
        ResourceClaim {
            metadata: ObjectMeta {
                name: Some("vm-1-extended-resources-abcde".into()),
                namespace: Some("default".into()),
                uid: Some("u-1".into()),
                ..Default::default()
            },
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(
                            results
                                .iter()
                                .map(|(request, driver, pool, device)| {
                                    DeviceRequestAllocationResult {
                                        request: request.to_string(),
                                        driver: driver.to_string(),
                                        pool: pool.to_string(),
                                        device: device.to_string(),
                                        ..Default::default()
                                    }
                                })
                                .collect(),
                        ),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn our_results_resolve_to_device_ids_and_others_are_skipped() {
        let c = claim(&[
            ("container-0-request-0", DRIVER, "node-1", "eth1-mvp-2"),
            ("gpu", "gpu.example.com", "node-1", "gpu-0"),
            ("container-0-request-1", DRIVER, "node-1", "eth1-mvp-0"),
        ]);
        let got = allocated(&c, "u-1", "node-1", &served()).unwrap();
        assert_eq!(
            got,
            vec![
                Allocated {
                    request_names: vec!["container-0-request-0".into()],
                    resource: "eth1".into(),
                    device_id: "eth1Mvp2".into(),
                    device_name: "eth1-mvp-2".into(),
                },
                Allocated {
                    request_names: vec!["container-0-request-1".into()],
                    resource: "eth1".into(),
                    device_id: "eth1Mvp0".into(),
                    device_name: "eth1-mvp-0".into(),
                },
            ]
        );
    }

    #[test]
    fn one_device_of_two_requests_is_listed_once_with_both() {
        let c = claim(&[
            ("a", DRIVER, "n", "eth1-mvp-1"),
            ("b", DRIVER, "n", "eth1-mvp-1"),
        ]);
        let got = allocated(&c, "u-1", "n", &served()).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].request_names, ["a", "b"]);
    }

    #[test]
    fn a_claim_that_is_not_ours_to_prepare_is_refused_with_the_reason() {
        let cases: [(ResourceClaim, &str, &str); 5] = [
            (claim(&[("a", DRIVER, "n", "eth1-mvp-1")]), "u-2", "not u-2"),
            (
                claim(&[("a", DRIVER, "other", "eth1-mvp-1")]),
                "u-1",
                "pool other",
            ),
            (
                claim(&[("a", DRIVER, "n", "eth1-mvp-4")]),
                "u-1",
                "eth1-mvp-4 is not one this node serves",
            ),
            (
                claim(&[("a", "gpu.example.com", "n", "g")]),
                "u-1",
                "no device of driver",
            ),
            (
                ResourceClaim {
                    status: None,
                    ..claim(&[])
                },
                "u-1",
                "not allocated",
            ),
        ];
        for (c, uid, why) in cases {
            let e = allocated(&c, uid, "n", &served()).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
            assert!(e.contains("default/vm-1-extended-resources-abcde"), "{e}");
        }
    }
}
