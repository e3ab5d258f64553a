//! Allocate as the kubelet's device plugin API asks it: the request's
//! device IDs handed to the core ([`crate::core::link`]) and its prepared
//! devices answered as `DeviceSpec`s, one `ContainerAllocateResponse` per
//! container asked for, the outcome timed, logged and reported to the
//! daemon's `core::report::Observer`. Nothing here
//! decides: it translates.

use crate::config::ResourceConfig;
use crate::core::host::SharedHost;
use crate::core::ledger::Assignments;
use crate::core::ledger::clock::AllocationClock;
use crate::core::link::{PreparedDevice, hand_out};
use crate::error::{Error, Result};
use crate::kubelet::context::ServerContext;
use kubelet_proto::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, DeviceSpec,
};
use std::path::Path;
use std::time::Instant;
use tracing::{info, warn};

/// The request's device IDs, container after container.
fn ids(req: &AllocateRequest) -> Vec<&str> {
    req.container_requests
        .iter()
        .flat_map(|c| c.devices_ids.iter().map(String::as_str))
        .collect()
}

/// An Allocate as the plugin server serves it, on `host` (the daemon's
/// shared handle on its kernel): `hand_out` (leak clocks, links, the
/// record), answered.
pub fn serve(
    host: &SharedHost,
    req: &AllocateRequest,
    cfg: &ResourceConfig,
    clock: &AllocationClock,
    assignments: &Assignments,
) -> Result<AllocateResponse> {
    let prepared = hand_out(host, cfg, &ids(req), clock, assignments)?;
    Ok(response(req, &prepared))
}

/// An Allocate of resource `cfg` as the plugin server answers it: [`serve`]
/// on a blocking thread with the daemon's shared state `ctx`, timed,
/// logged and reported to `ctx`'s observer (devices handed out, or the
/// refusal), and a refusal turned into the gRPC status the kubelet reads.
pub(crate) async fn answer(
    ctx: &ServerContext,
    cfg: ResourceConfig,
    req: AllocateRequest,
) -> std::result::Result<AllocateResponse, tonic::Status> {
    let resource = cfg.resource_name();
    let started = Instant::now();
    let device_ids: Vec<String> = ids(&req).into_iter().map(str::to_string).collect();
    let (clock, assignments) = (ctx.clock.clone(), ctx.assignments.clone());
    let host = ctx.host.clone();
    let Some(pass) = ctx.inflight.enter().await else {
        warn!(%resource, "Allocate refused: the daemon is exiting");
        return Err(tonic::Status::unavailable(format!(
            "the macvtap device plugin for {resource} is exiting; no device is made"
        )));
    };
    let res = tokio::task::spawn_blocking(move || {
        let _pass = pass;
        serve(&host, &req, &cfg, &clock, &assignments)
    })
    .await
    .map_err(|e| Error::Task(format!("the Allocate task failed: {e}")))
    .and_then(|r| r);
    let took = started.elapsed();
    match res {
        Ok(resp) => {
            ctx.observer
                .handed_out(&resource, &device_ids, took, Instant::now());
            info!(%resource, elapsed_ms = started.elapsed().as_millis() as u64, "Allocate done");
            Ok(resp)
        }
        Err(e) => {
            warn!(%resource, error = %e, "Allocate failed");
            ctx.observer.refused(&resource, took, &e);
            Err(e.to_status())
        }
    }
}

/// The answer to `req` whose devices, in its order, are `prepared`.
fn response(req: &AllocateRequest, prepared: &[PreparedDevice]) -> AllocateResponse {
    let mut devices = prepared.iter();
    AllocateResponse {
        container_responses: req
            .container_requests
            .iter()
            .map(|c| ContainerAllocateResponse {
                devices: devices
                    .by_ref()
                    .take(c.devices_ids.len())
                    .map(|d| device_spec(&d.node))
                    .collect(),
                ..Default::default()
            })
            .collect(),
    }
}

/// The kubelet's view of a tap node: the same path in the container, `rw`.
fn device_spec(node: &Path) -> DeviceSpec {
    let path = node.to_string_lossy().into_owned();
    DeviceSpec {
        container_path: path.clone(),
        host_path: path,
        permissions: "rw".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_proto::v1beta1::ContainerAllocateRequest;
    use macvtap_link::{Link, Op, link_name_for_device};
    use test_support::fake::{FakeKernel, HOST};

    #[test]
    fn serve_hands_out_on_the_shared_hosts_kernel() {
        let kernel = FakeKernel::new();
        kernel.add_nic(HOST, "lower0");
        let host = SharedHost::new(&kernel, crate::core::host::HostPaths::default());
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["lower0Mvp0".into()],
            }],
        };
        let cfg = ResourceConfig::for_nic("lower0");
        let (clock, assignments) = (AllocationClock::default(), Assignments::default());
        let resp = serve(&host, &req, &cfg, &clock, &assignments).unwrap();
        let link = kernel
            .link(HOST, &link_name_for_device("lower0Mvp0"))
            .unwrap();
        assert_eq!(
            resp.container_responses[0].devices[0].host_path,
            format!("/dev/tap{}", link.index)
        );
        assert_eq!(kernel.count(Op::AddMacvtap), 1);
    }

    /// Each container gets its own devices, in the request's order, each
    /// as its tap node at the same path in the container, `rw`.
    #[test]
    fn each_container_is_answered_its_devices_tap_nodes() {
        let req = AllocateRequest {
            container_requests: vec![
                ContainerAllocateRequest {
                    devices_ids: vec!["dpMvp0".into()],
                },
                ContainerAllocateRequest {
                    devices_ids: vec!["dpMvp1".into(), "dpMvp2".into()],
                },
            ],
        };
        let prepared: Vec<PreparedDevice> = [40, 41, 42]
            .map(|i| PreparedDevice {
                link: Link::default(),
                node: format!("/dev/tap{i}").into(),
                created: true,
            })
            .into();
        let resp = response(&req, &prepared);
        let paths: Vec<Vec<(&str, &str, &str)>> = resp
            .container_responses
            .iter()
            .map(|c| {
                c.devices
                    .iter()
                    .map(|d| {
                        (
                            d.host_path.as_str(),
                            d.container_path.as_str(),
                            d.permissions.as_str(),
                        )
                    })
                    .collect()
            })
            .collect();
        assert_eq!(
            paths,
            [
                vec![("/dev/tap40", "/dev/tap40", "rw")],
                vec![
                    ("/dev/tap41", "/dev/tap41", "rw"),
                    ("/dev/tap42", "/dev/tap42", "rw")
                ],
            ]
        );
    }
}
