//! What auto-discovery offers by default (issue 46): the real daemon on a
//! node namespace whose `eth0` is the node's own (its default route and an
//! address), with veth pairs as NICs. Needs root; without it every test
//! here fails with "NOT RUN".

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{DEADLINE, Node, require_root, wait_log};
use std::time::{Duration, Instant};
use test_kubelet::ResourceView;

const PREFIX: &str = "macvtap.network.kubevirt.io/";

fn res(name: &str) -> String {
    format!("{PREFIX}{name}")
}

fn socket(node: &Node, name: &str) -> std::path::PathBuf {
    node.plugin_dir()
        .join(format!("macvtap.network.kubevirt.io_{name}"))
}

fn serving(v: &ResourceView) -> bool {
    v.connected && v.devices.len() == 100 && v.allocatable() == 100
}

/// A node whose `eth0` carries its default route and address
/// 192.0.2.10/24, beside the NIC `eth1` without an address; the test
/// kubelet started.
async fn node_with_its_own_nic(tag: &str) -> Node {
    require_root().unwrap();
    let mut node = Node::new(tag);
    node.ns.add_nic("eth0").unwrap();
    node.ns
        .ip(&["addr", "add", "192.0.2.10/24", "dev", "eth0"])
        .unwrap();
    node.ns
        .ip(&["route", "add", "default", "via", "192.0.2.1", "dev", "eth0"])
        .unwrap();
    node.start_kubelet().await;
    node
}

/// Waits until `path` exists (`there`) or not.
async fn wait_path(path: &std::path::Path, there: bool) {
    let end = Instant::now() + DEADLINE;
    while path.exists() != there {
        assert!(
            Instant::now() < end,
            "{} exists: {}",
            path.display(),
            !there
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Without any configuration (our manifests without a ConfigMap), the NIC
/// of the node's default route is never offered, and a NIC that gets a
/// global address is withdrawn, live, and offered again once it is gone;
/// the log says what is left out and how to serve it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_the_nodes_own_nics_are_left_out_and_followed_live() {
    let mut node = node_with_its_own_nic("spare").await;
    node.start_daemon(&["--discover-kinds", "veth"], &[]);
    node.kubelet()
        .wait_resource(&res("eth1"), DEADLINE, serving)
        .await
        .unwrap();
    let log = wait_log(&mut node, "eth0 left out", |l| {
        l.contains("auto-discovery leaves eth0 out: eth0 carries the IPv4 default route")
    })
    .await;
    assert!(
        log.contains("to serve it anyway, name it in the configuration"),
        "{log}"
    );
    assert!(!socket(&node, "eth0").exists(), "eth0 is never served");
    assert_eq!(node.kubelet().registration_count(&res("eth0")), 0);

    // eth1 gets an address of the node's: withdrawn at once.
    node.ns
        .ip(&["addr", "add", "198.51.100.5/24", "dev", "eth1"])
        .unwrap();
    wait_path(&socket(&node, "eth1"), false).await;
    wait_log(&mut node, "eth1 left out", |l| {
        l.contains(
            "auto-discovery leaves eth1 out: eth1 has the global address 198.51.100.5/24, so the \
             node itself is on its network; to serve it, name it in --discover-include",
        )
    })
    .await;
    // And back when the address goes.
    let before = node.kubelet().registration_count(&res("eth1"));
    node.ns
        .ip(&["addr", "del", "198.51.100.5/24", "dev", "eth1"])
        .unwrap();
    wait_path(&socket(&node, "eth1"), true).await;
    node.kubelet()
        .wait_for_registration(&res("eth1"), before, DEADLINE)
        .await
        .unwrap();
    assert!(!socket(&node, "eth0").exists());
}

/// `--discover-include` serves a NIC with a global address, never the NIC
/// of the default route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_include_serves_an_addressed_nic_but_not_the_nodes_own() {
    let mut node = node_with_its_own_nic("include").await;
    node.ns
        .ip(&["addr", "add", "198.51.100.5/24", "dev", "eth1"])
        .unwrap();
    node.start_daemon(
        &[
            "--discover-kinds",
            "veth",
            "--discover-include",
            "eth1,eth0",
        ],
        &[],
    );
    node.kubelet()
        .wait_resource(&res("eth1"), DEADLINE, serving)
        .await
        .unwrap();
    let log = wait_log(&mut node, "eth0 left out", |l| {
        l.contains("auto-discovery leaves eth0 out")
    })
    .await;
    assert!(
        log.contains("(--discover-include names it, but cannot serve such a NIC)"),
        "{log}"
    );
    assert!(
        log.contains(
            "auto-discovery serves eth1 though it has the global address 198.51.100.5/24: \
             --discover-include names it"
        ),
        "{log}"
    );
    assert!(!socket(&node, "eth0").exists());
}

/// The Go project's DaemonSets ask for auto-discovery with
/// `DP_MACVTAP_CONF=[]` in the environment: their image swapped for ours,
/// every NIC is offered as before, the node's own included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_daemonsets_empty_list_offers_every_nic_as_before() {
    let mut node = node_with_its_own_nic("godisc").await;
    node.start_daemon(&["--discover-kinds", "veth"], &[("DP_MACVTAP_CONF", "[]")]);
    for nic in ["eth0", "eth1"] {
        node.kubelet()
            .wait_resource(&res(nic), DEADLINE, serving)
            .await
            .unwrap();
    }
    let log = node.daemon().log();
    assert!(
        log.contains("auto-discovery of every NIC"),
        "the log says which policy: {log}"
    );
    assert!(!log.contains("auto-discovery leaves eth0 out"), "{log}");
}
