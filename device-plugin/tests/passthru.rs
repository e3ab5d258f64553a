//! Passthru mode against the real kernel (issue 27): one device per passthru
//! resource, its NIC its own, and Unhealthy devices and Allocate refusals
//! that name the macvlan/macvtap in the way. Each test runs the real daemon
//! against a test kubelet on a fresh node namespace with a veth pair as the
//! NIC. Needs root; without it every test here fails with "NOT RUN".

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{DEADLINE, Node, TestNs, wait_log};
use kubelet_proto::v1beta1::Device;
use macvtap_link::tapdev::{open_tap_node, tap_dev_in_netns};
use macvtap_link::{MacvtapMode, Netns, link_name_for_device};
use std::path::Path;
use std::time::Duration;
use test_kubelet::ResourceView;

const PT: &str = "macvtap.network.kubevirt.io/pt";
const DP: &str = "macvtap.network.kubevirt.io/dp";
/// The words every passthru conflict message holds.
const ALONE: &str = "the kernel allows a passthru macvtap only alone on its NIC";

fn all_healthy(d: &[Device]) -> bool {
    !d.is_empty() && d.iter().all(|d| d.health == "Healthy")
}

fn all_unhealthy(d: &[Device]) -> bool {
    !d.is_empty() && d.iter().all(|d| d.health == "Unhealthy")
}

/// The kubelet is connected and counts `n` healthy devices.
fn serving(v: &ResourceView, n: usize) -> bool {
    v.connected && v.devices.len() == n && v.allocatable() == n
}

/// A node with a test kubelet and the daemon started with `args` and `env`,
/// registered for each of `resources`.
async fn node_with(tag: &str, args: &[&str], env: &[(&str, &str)], resources: &[&str]) -> Node {
    let mut node = Node::new(tag);
    node.start_kubelet().await;
    node.start_daemon(args, env);
    for r in resources {
        node.kubelet()
            .wait_for_registration(r, 0, DEADLINE)
            .await
            .unwrap();
    }
    node
}

/// Checks that the allocated passthru macvtap of `id` is on `lower`, in
/// passthru mode, with the NIC's MAC, and that its tap node opens.
fn check_passthru_link(node: &Node, id: &str, lower: &str, host_path: &str) {
    let name = link_name_for_device(id);
    let link = node.ns.link(&name).unwrap().expect("macvtap exists");
    let nic = node.ns.link(lower).unwrap().unwrap();
    assert!(link.is_macvtap());
    assert_eq!(link.macvtap_mode, Some(MacvtapMode::Passthru));
    assert_eq!(link.lower_index, Some(nic.index));
    // A passthru macvtap takes the NIC's MAC.
    assert_eq!(link.mac, nic.mac);
    assert_eq!(host_path, format!("/dev/tap{}", link.index));
    let dev = tap_dev_in_netns(&Netns::open(node.ns.path()).unwrap(), &name).unwrap();
    open_tap_node(Path::new(host_path), dev, Duration::ZERO).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passthru_resource_from_the_env_advertises_one_device_whatever_its_capacity() {
    let conf = r#"[{"name":"pt","lowerDevice":"eth1","mode":"passthru","capacity":4}]"#;
    let mut node = node_with("ptcap", &[], &[("DP_MACVTAP_CONF", conf)], &[PT]).await;
    let view = node
        .kubelet()
        .wait_resource(PT, DEADLINE, |v| serving(v, 1))
        .await
        .unwrap();
    let ids: Vec<_> = view.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["ptMvp0"]);
    let log = node.daemon().log();
    assert!(
        log.contains(
            "DP_MACVTAP_CONF: entry 0 (\"pt\"): capacity 4 is impossible in passthru mode: \
             the kernel allows one passthru macvtap per NIC, so a passthru resource has exactly \
             one device; advertising 1"
        ),
        "{log}"
    );
    // The one device allocates a passthru macvtap on the NIC.
    let resp = node.kubelet().allocate(PT, &["ptMvp0"]).await.unwrap();
    let spec = &resp.container_responses[0].devices[0];
    check_passthru_link(&node, "ptMvp0", "eth1", &spec.host_path);
    // The kernel's rule the resource follows: nothing else fits beside it.
    let e = node
        .ns
        .ip(&["link", "add", "mv9", "link", "eth1", "type", "macvlan"])
        .unwrap_err();
    assert!(e.to_string().contains("Invalid argument"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_passthru_entries_from_flags_or_a_file_stop_the_daemon_naming_them() {
    let mut node = Node::new("ptflags");
    node.start_kubelet().await;
    node.start_daemon(
        &["--resource=name=pt,lowerDevice=eth1,mode=passthru,capacity=2"],
        &[],
    );
    let status = node.daemon().wait_exit(DEADLINE).unwrap();
    assert!(!status.success(), "{status:?}");
    let log = node.daemon().log();
    assert!(
        log.contains(
            "invalid configuration from --resource flags: entry 0 (\"pt\"): capacity 2 is \
             impossible in passthru mode"
        ),
        "{log}"
    );
    // Two resources on one NIC, one of them passthru, from a file.
    let file = node.dir.path().join("conf.json");
    std::fs::write(
        &file,
        r#"[{"name":"dp","lowerDevice":"eth1"},{"name":"pt","lowerDevice":"eth1","mode":"passthru"}]"#,
    )
    .unwrap();
    let arg = format!("--config={}", file.display());
    node.start_daemon(&[&arg], &[]);
    let status = node.daemon().wait_exit(DEADLINE).unwrap();
    assert!(!status.success(), "{status:?}");
    let log = node.daemon().log();
    assert!(
        log.contains(
            "entry 0 (\"dp\") and entry 1 (\"pt\") both use NIC eth1, and \"pt\" is \
             in passthru mode"
        ) && log.contains("give the passthru resource a NIC of its own"),
        "{log}"
    );
    assert!(node.kubelet().registrations().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_the_env_the_passthru_entry_sharing_a_nic_is_left_out_and_the_other_served() {
    let conf = r#"[{"name":"pt","lowerDevice":"eth1","mode":"passthru"},
                   {"name":"dp","lowerDevice":"eth1","capacity":2}]"#;
    let mut node = node_with("ptshare", &[], &[("DP_MACVTAP_CONF", conf)], &[DP]).await;
    node.kubelet()
        .wait_resource(DP, DEADLINE, |v| serving(v, 2))
        .await
        .unwrap();
    // The configuration is resolved before any resource registers.
    let log = node.daemon().log();
    assert!(
        log.contains(
            "entry 0 (\"pt\") and entry 1 (\"dp\") both use NIC eth1, and \"pt\" is \
             in passthru mode"
        ) && log.contains("entry 0 (\"pt\") is left out and \"dp\" is served"),
        "{log}"
    );
    assert!(
        node.kubelet()
            .registrations()
            .iter()
            .all(|r| r.resource_name == DP)
    );
    node.kubelet().allocate(DP, &["dpMvp1"]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passthru_resource_beside_a_macvlan_is_unhealthy_and_refused_naming_it() {
    let mut node = Node::new("ptbeside");
    node.ns
        .ip(&["link", "add", "mv0", "link", "eth1", "type", "macvlan"])
        .unwrap();
    node.start_kubelet().await;
    node.start_daemon(&["--resource=name=pt,lowerDevice=eth1,mode=passthru"], &[]);
    let k = node.kubelet();
    k.wait_for_registration(PT, 0, DEADLINE).await.unwrap();
    k.wait_resource(PT, DEADLINE, |v| {
        v.devices.len() == 1 && all_unhealthy(&v.devices)
    })
    .await
    .unwrap();
    let why = format!(
        "NIC eth1 already carries macvlan mv0; {ALONE}, so delete mv0 or give the passthru \
         resource a NIC of its own"
    );
    wait_log(&mut node, "the Unhealthy reason", |l| {
        l.contains(&format!("devices Unhealthy: {why}"))
    })
    .await;
    // The kubelet allocates what it was told is there (a device it saw
    // Healthy before): the refusal names the macvlan and the fix.
    let e = node.kubelet().allocate(PT, &["ptMvp0"]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert_eq!(
        e.message(),
        format!("resource {PT} cannot get a macvtap: {why}")
    );
    assert!(
        node.ns
            .link(&link_name_for_device("ptMvp0"))
            .unwrap()
            .is_none(),
        "nothing was made"
    );
    // The macvlan goes: the device is Healthy and allocates.
    node.ns.ip(&["link", "del", "mv0"]).unwrap();
    node.kubelet()
        .wait_resource(PT, DEADLINE, |v| all_healthy(&v.devices))
        .await
        .unwrap();
    let resp = node.kubelet().allocate(PT, &["ptMvp0"]).await.unwrap();
    check_passthru_link(
        &node,
        "ptMvp0",
        "eth1",
        &resp.container_responses[0].devices[0].host_path,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_resource_beside_a_passthru_port_is_unhealthy_and_refused_naming_it() {
    let mut node = Node::new("ptbridge");
    node.start_kubelet().await;
    node.start_daemon(
        &["--resource=name=dp,lowerDevice=eth1,mode=vepa,capacity=3"],
        &[],
    );
    let k = node.kubelet();
    k.wait_for_registration(DP, 0, DEADLINE).await.unwrap();
    k.wait_resource(DP, DEADLINE, |v| serving(v, 3))
        .await
        .unwrap();
    // A passthru macvtap, then a passthru macvlan, appear on the NIC.
    for (name, kind) in [("mvtpt", "macvtap"), ("mvlpt", "macvlan")] {
        node.ns
            .ip(&[
                "link", "add", name, "link", "eth1", "type", kind, "mode", "passthru",
            ])
            .unwrap();
        node.kubelet()
            .wait_resource(DP, DEADLINE, |v| {
                v.devices.len() == 3 && all_unhealthy(&v.devices)
            })
            .await
            .unwrap();
        let why = format!(
            "NIC eth1 carries passthru {kind} {name}, which takes the whole NIC; {ALONE}, so \
             delete {name} or use another NIC for this resource"
        );
        wait_log(&mut node, "the Unhealthy reason", |l| {
            l.contains(&format!("devices Unhealthy: {why}"))
        })
        .await;
        let e = node.kubelet().allocate(DP, &["dpMvp2"]).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert_eq!(
            e.message(),
            format!("resource {DP} cannot get a macvtap: {why}")
        );
        node.ns.ip(&["link", "del", name]).unwrap();
        node.kubelet()
            .wait_resource(DP, DEADLINE, |v| serving(v, 3))
            .await
            .unwrap();
    }
    node.kubelet().allocate(DP, &["dpMvp2"]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_in_a_pods_namespace_turns_the_kernels_einval_into_the_sentence() {
    // Ports the node's namespace cannot show (they sit in a pod's): a
    // passthru macvlan on eth1 and a bridge macvlan on eth2. Health cannot
    // see them; the kernel refuses the create with EINVAL.
    let mut node = Node::new("ptpod");
    node.ns.add_nic("eth2").unwrap();
    let pod = TestNs::new("ptpodns").unwrap();
    for (name, lower, mode) in [("pmv1", "eth1", "passthru"), ("pmv2", "eth2", "bridge")] {
        node.ns
            .ip(&[
                "link", "add", name, "link", lower, "type", "macvlan", "mode", mode,
            ])
            .unwrap();
        node.ns
            .ip(&["link", "set", name, "netns", &pod.name])
            .unwrap();
    }
    node.start_kubelet().await;
    node.start_daemon(
        &[
            "--resource=name=dp,lowerDevice=eth1,capacity=2",
            "--resource=name=pt,lowerDevice=eth2,mode=passthru",
        ],
        &[],
    );
    let k = node.kubelet();
    k.wait_for_registration(DP, 0, DEADLINE).await.unwrap();
    k.wait_for_registration(PT, 0, DEADLINE).await.unwrap();
    k.wait_resource(DP, DEADLINE, |v| serving(v, 2))
        .await
        .unwrap();
    k.wait_resource(PT, DEADLINE, |v| serving(v, 1))
        .await
        .unwrap();
    let e = k.allocate(DP, &["dpMvp0"]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert_eq!(
        e.message(),
        format!(
            "resource {DP} cannot get a macvtap: NIC eth1 carries a passthru macvlan/macvtap \
             port (the kernel refused the macvtap with EINVAL, and no such port is in the node's \
             namespace, so a pod holds it); {ALONE}, so delete it or use another NIC for this \
             resource"
        )
    );
    let e = k.allocate(PT, &["ptMvp0"]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert_eq!(
        e.message(),
        format!(
            "resource {PT} cannot get a macvtap: NIC eth2 already carries another \
             macvlan/macvtap port (the kernel refused the passthru macvtap with EINVAL, and no \
             such port is in the node's namespace, so a pod holds it); {ALONE}, so delete it or \
             give the passthru resource a NIC of its own"
        )
    );
    for id in ["dpMvp0", "ptMvp0"] {
        assert!(node.ns.link(&link_name_for_device(id)).unwrap().is_none());
    }
    // The pod goes: both allocate.
    drop(pod);
    allocate_once_free(&node, DP, "dpMvp0").await;
    allocate_once_free(&node, PT, "ptMvp0").await;
}

/// Allocates `id` of `resource` as soon as the kernel takes it: a deleted
/// namespace's ports die asynchronously, so the kernel's answer is the
/// condition waited for.
async fn allocate_once_free(node: &Node, resource: &str, id: &str) {
    let end = std::time::Instant::now() + DEADLINE;
    loop {
        match node.kubelet().allocate(resource, &[id]).await {
            Ok(_) => return,
            Err(e) => assert!(std::time::Instant::now() < end, "{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
