//! Entries with a NIC or node selector (issue 46, item 4) on the real
//! daemon: a node namespace with veth pairs as NICs and an API server
//! stand-in serving its Node (a list and a watch by name), whose labels
//! the test changes. The selectors' reads of drivers and PCI IDs are the
//! unit tests' (`core::nic::select`, on a fake sysfs): a veth has none.
//! Needs root; without it every test here fails with "NOT RUN".

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{DEADLINE, Node, require_root, wait_log};
use serde_json::json;
use std::time::{Duration, Instant};
use test_kubelet::{FakeApiServer, ResourceView};

const DP: &str = "macvtap.network.kubevirt.io/dp";
const PLAIN: &str = "macvtap.network.kubevirt.io/plain";
const LABEL: &str = "macvtap.example.com/dataplane";

fn serving(v: &ResourceView, n: usize) -> bool {
    v.connected && v.devices.len() == n && v.allocatable() == n
}

/// Node `node-l` with `labels`.
fn node_object(labels: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": "node-l", "labels": labels},
           "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.10"}]}})
}

async fn wait_socket(node: &Node, name: &str, there: bool) {
    let path = node
        .plugin_dir()
        .join(format!("macvtap.network.kubevirt.io_{name}"));
    let end = Instant::now() + DEADLINE;
    while path.exists() != there {
        assert!(
            Instant::now() < end,
            "{} still {}",
            path.display(),
            if there { "missing" } else { "there" }
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A resource whose node selector the Node does not match is not served;
/// labelling the Node serves it at once, on the first NIC its selector
/// names that exists, and removing the label withdraws it, live (the
/// daemon watches its Node). A plain entry beside it is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_labelled_resource_comes_and_goes_with_the_nodes_label() {
    require_root().unwrap();
    let mut node = Node::new("labels");
    let api = FakeApiServer::start(&node.ns).unwrap();
    api.put_node(node_object(json!({"kubernetes.io/hostname": "node-l"})));
    node.start_kubelet().await;
    let kubeconfig = api.kubeconfig.to_str().unwrap().to_string();
    node.start_daemon(
        &[
            &format!("--resource=name=dp,names=eth9|eth1,capacity=3,node={LABEL}:yes"),
            "--resource=name=plain,lowerDevice=eth1,capacity=2",
        ],
        &[("NODE_NAME", "node-l"), ("KUBECONFIG", &kubeconfig)],
    );
    let k = node.kubelet();
    k.wait_resource(PLAIN, DEADLINE, |v| serving(v, 2))
        .await
        .unwrap();
    wait_log(&mut node, "dp not served", |l| {
        l.contains(&format!(
            "not served here: this node is not one its nodeSelector {LABEL}=yes selects: it has \
             no label {LABEL}"
        ))
    })
    .await;
    wait_socket(&node, "dp", false).await;
    assert_eq!(node.kubelet().registration_count(DP), 0);

    // Labelled: served at once, on eth1 (eth9 does not exist).
    api.put_node(node_object(json!({LABEL: "yes"})));
    node.kubelet()
        .wait_resource(DP, DEADLINE, |v| serving(v, 3))
        .await
        .unwrap();
    let log = wait_log(&mut node, "dp served", |l| l.contains("dp: served")).await;
    assert!(
        log.contains(&format!(
            "served this node has the labels {LABEL}=yes its nodeSelector asks; on NIC eth1, the \
             first NIC named eth9 or eth1; passed over eth9 (there is no such link)"
        )),
        "{log}"
    );
    // The device is made on the NIC picked.
    let resp = node.kubelet().allocate(DP, &["dpMvp0"]).await.unwrap();
    let link = node
        .ns
        .link(&macvtap_link::link_name_for_device("dpMvp0"))
        .unwrap()
        .expect("the device's macvtap");
    assert_eq!(
        link.lower_index,
        Some(node.ns.link("eth1").unwrap().unwrap().index)
    );
    assert_eq!(
        resp.container_responses[0].devices[0].host_path,
        format!("/dev/tap{}", link.index)
    );

    // Another value, then no label: withdrawn.
    api.put_node(node_object(json!({LABEL: "no"})));
    wait_socket(&node, "dp", false).await;
    api.put_node(node_object(json!({LABEL: "yes"})));
    wait_socket(&node, "dp", true).await;
    api.put_node(node_object(json!({})));
    wait_socket(&node, "dp", false).await;
    assert!(
        serving(&node.kubelet().resource(PLAIN), 2),
        "the plain entry is served throughout"
    );
    // The daemon read the Node by name only: a list and a watch.
    let reads: Vec<_> = api
        .log()
        .into_iter()
        .filter(|r| r.path == "/api/v1/nodes")
        .collect();
    assert!(!reads.is_empty() && reads.iter().all(|r| r.method == "GET"));
}

/// Without `NODE_NAME` the Node cannot be read: an entry with a node
/// selector is not served, and the log says why; a NIC selector alone
/// needs no Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_node_a_labelled_entry_is_not_served() {
    require_root().unwrap();
    let mut node = Node::new("nolabels");
    node.start_kubelet().await;
    node.start_daemon(
        &[
            &format!("--resource=name=dp,lowerDevice=eth1,node={LABEL}:yes"),
            "--resource=name=plain,pattern=eth?,capacity=2",
        ],
        &[],
    );
    node.kubelet()
        .wait_resource(PLAIN, DEADLINE, |v| serving(v, 2))
        .await
        .unwrap();
    let log = wait_log(&mut node, "dp not served", |l| {
        l.contains("the Node's labels are unknown (NODE_NAME is not set)")
    })
    .await;
    assert!(
        log.contains("plain: served on NIC eth1, the first NIC whose name matches eth?"),
        "{log}"
    );
    wait_socket(&node, "dp", false).await;
}
