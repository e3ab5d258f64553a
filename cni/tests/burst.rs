//! A burst of VM starts on one node through the kubelet's PodResources rate
//! limit (one bucket for all callers, 100 a second, burst 10): every ADD's
//! ownership check still gets its answer on the first invocation, while
//! Multus asks the same bucket for every pod. Needs root (each ADD runs the
//! real plugin in its own sandbox).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::kubelet::PodResourcesKubelet;
use common::{Sandbox, netconf};
use grpc_unary::{self as grpc, CallError};
use macvtap_cni::podresources::{LIST, TIMEOUT};
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Instant;

const DP: &str = "macvtap.network.kubevirt.io/dataplane";
/// VM pods starting at once.
const PODS: usize = 32;

/// What Multus does at ADD: one `List`, never tried again. `Ok(true)` when
/// answered, `Ok(false)` when the rate limit refused it.
fn multus_list(socket: &Path) -> Result<bool, CallError> {
    match grpc::unary(socket, LIST, &[], TIMEOUT) {
        Ok(_) => Ok(true),
        Err(CallError::Status { code, .. }) if code == grpc::code::RESOURCE_EXHAUSTED => Ok(false),
        Err(e) => Err(e),
    }
}

fn socket(kubelet: &PodResourcesKubelet) -> std::path::PathBuf {
    kubelet.kubelet_dir().join("pod-resources/kubelet.sock")
}

/// Without trying again, the same burst of `List`s (one per ADD, one per
/// Multus) is partly refused: the limiter the burst test meets is real.
#[test]
fn a_burst_of_single_lists_is_partly_refused_by_the_kubelets_limiter() {
    let kubelet = PodResourcesKubelet::start();
    let socket = socket(&kubelet);
    let start = Arc::new(Barrier::new(2 * PODS));
    let calls: Vec<_> = (0..2 * PODS)
        .map(|_| {
            let (socket, start) = (socket.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                multus_list(&socket).unwrap()
            })
        })
        .collect();
    let answered = calls
        .into_iter()
        .map(|c| c.join().unwrap())
        .filter(|&ok| ok)
        .count();
    assert!(
        answered < 2 * PODS,
        "{answered} of {} single Lists were answered",
        2 * PODS
    );
}

/// 32 VM pods start at once, each its own sandbox and device, enforce mode;
/// Multus makes one `List` per pod at the same time from other threads.
/// Every ADD succeeds on its first invocation.
#[test]
fn every_add_of_a_burst_succeeds_first_time_through_the_kubelets_limiter() {
    let kubelet = PodResourcesKubelet::start();
    let socket = socket(&kubelet);
    let settings = kubelet.settings("enforce");
    let sandboxes: Vec<(Sandbox, String, u32)> = (0..PODS)
        .map(|i| {
            let sb = Sandbox::new();
            let device = format!("dataplaneMvp{i}");
            kubelet.add_pod("burst", &format!("vm-{i}"), &[(DP, &[device.as_str()])]);
            let index = sb.allocate(&device);
            (sb, device, index)
        })
        .collect();
    let start = Barrier::new(2 * PODS);
    let began = Instant::now();
    let (adds, multus) = std::thread::scope(|s| {
        let adds: Vec<_> = sandboxes
            .iter()
            .enumerate()
            .map(|(i, (sb, device, _))| {
                let (start, settings) = (&start, &settings);
                s.spawn(move || {
                    let args =
                        format!("IgnoreUnknown=true;K8S_POD_NAMESPACE=burst;K8S_POD_NAME=vm-{i}");
                    start.wait();
                    sb.cni(
                        "ADD",
                        &netconf("1.0.0", device),
                        &[
                            ("CNI_ARGS", &args),
                            ("MACVTAP_CNI_SETTINGS", settings.to_str().unwrap()),
                        ],
                    )
                })
            })
            .collect();
        let multus: Vec<_> = (0..PODS)
            .map(|_| {
                let (start, socket) = (&start, &socket);
                s.spawn(move || {
                    start.wait();
                    multus_list(socket).unwrap()
                })
            })
            .collect();
        (
            adds.into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>(),
            multus
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>(),
        )
    });
    let wall = began.elapsed();
    let refused = multus.iter().filter(|&&ok| !ok).count();
    eprintln!("{PODS} ADDs and {PODS} Multus Lists in {wall:?}; {refused} Multus Lists refused");
    let failed: Vec<_> = adds.iter().filter(|run| run.code != 0).collect();
    assert!(
        failed.is_empty(),
        "{} of {PODS} ADDs failed, the first: {}",
        failed.len(),
        failed[0].stdout
    );
    for (run, (sb, device, index)) in adds.iter().zip(&sandboxes) {
        run.ok();
        let link = sb.link(&sb.pod, "net1").expect("net1 is in the pod");
        assert_eq!(link["ifindex"].as_u64(), Some(u64::from(*index)), "{link}");
        let name = macvtap_link::link_name_for_device(device);
        assert!(sb.link(&sb.node, &name).is_none(), "{name} left the node");
    }
}
