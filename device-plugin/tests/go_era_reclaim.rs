//! Leaked-link reclaim also removes the links the Go device plugin v0.13.1
//! made (named after the device ID, `<resource>Mvp<i>`, on the resource's
//! NIC) once no pod holds their device. CNI DEL gives such a link back under
//! that name, so nothing else would ever remove it. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{DEADLINE, Node, wait_log};
use std::time::{Duration, Instant};
use test_kubelet::TestPodResources;

const DP: &str = "macvtap.network.kubevirt.io/dp";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_era_links_are_reclaimed_when_no_pod_holds_their_device() {
    let mut node = Node::new("goreclaim");
    node.start_kubelet().await;
    let pr = TestPodResources::start(&node.dir.path().join("pod-resources/kubelet.sock"))
        .await
        .unwrap();
    pr.set_allocated(DP, &["dpMvp3"]);
    node.ns
        .ip(&[
            "link", "add", "veth9", "type", "veth", "peer", "name", "veth9p",
        ])
        .unwrap();
    for (name, lower) in [
        ("dpMvp2", "eth1"),    // leaked: no pod holds dpMvp2
        ("dpMvp3", "eth1"),    // held by a pod, not yet taken by its CNI ADD
        ("otherMvp0", "eth1"), // not a device of a configured resource
        ("dpMvp4", "veth9"),   // not on the resource's NIC
    ] {
        node.ns
            .ip(&[
                "link", "add", "link", lower, "name", name, "type", "macvtap",
            ])
            .unwrap();
    }
    node.start_daemon(
        &[
            "--resource=name=dp,lowerDevice=eth1,capacity=4",
            "--reclaim-interval=100ms",
            "--reclaim-grace=1s",
        ],
        &[],
    );

    let end = Instant::now() + DEADLINE;
    while node.ns.link("dpMvp2").unwrap().is_some() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        node.ns.link("dpMvp2").unwrap().is_none(),
        "the leaked Go-era link was removed"
    );
    // All four were first seen in the same round: anything the reclaimer
    // took for leaked would have gone in the round that removed dpMvp2.
    // Two more rounds make sure.
    let log = wait_log(&mut node, "the deletion", |l| {
        l.contains("deleted a leaked macvtap")
    })
    .await;
    let rounds = log.matches("reclaim round done").count();
    let log = wait_log(&mut node, "two more reclaim rounds", |l| {
        l.matches("reclaim round done").count() >= rounds + 2
    })
    .await;
    for kept in ["dpMvp3", "otherMvp0", "dpMvp4"] {
        assert!(
            node.ns.link(kept).unwrap().is_some(),
            "{kept} was kept:\n{log}"
        );
    }
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("deleted a leaked macvtap"))
            .count(),
        1,
        "{log}"
    );
}
