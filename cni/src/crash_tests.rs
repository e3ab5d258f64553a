//! Crash consistency of ADD and DEL on the fake kernel (`test_support::fake`):
//! the plugin's process dies right after each kernel call of a run (the
//! call took effect, nothing after it runs: no rollback, no destructor that
//! touches the kernel), then the runtime takes its next steps on the same
//! kernel state, and each must succeed without losing or leaking a link.
//!
//! The next steps are containerd's (`internal/cri/server/sandbox_run.go`):
//! a sandbox whose network set-up failed is torn down with CNI DEL (same
//! container ID, namespace and interface), its namespace is removed, and
//! the kubelet's retried `RunPodSandbox` makes a new sandbox with a new
//! namespace and container ID, whose ADD gets the same device (the kubelet
//! allocated it to the pod once and hands the same `/dev/tapN` to every
//! sandbox of the pod). A DEL that dies is retried the same way
//! (`StopPodSandbox` again) before the namespace goes.
//!
//! Calls are numbered per operation as `rollback_tests` numbers them.

use crate::rollback_tests::{DEVICE, MAC, Node, POD, conf};
use macvtap_link::{Kernel, MacvtapMode, Op, link_name_for_device};
use nix::errno::Errno;
use serde_json::Value;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use test_support::fake::{Call, Crashed, HOST};

/// The new sandbox's namespace.
const NEW_POD: &str = "/run/netns/pod-b";

/// Every call in `calls` from index `from` on, as (operation, its number
/// among all calls of that operation).
fn numbered(calls: &[Call], from: usize) -> Vec<(Op, usize)> {
    let mut seen: HashMap<Op, usize> = HashMap::new();
    calls
        .iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let n = seen.entry(c.op).or_insert(0);
            *n += 1;
            (i >= from).then_some((c.op, *n))
        })
        .collect()
}

/// Runs `command` in a process that dies right after call `point`; asserts
/// that it died there and tried no kernel call afterwards, then lets the
/// next process run.
fn dies(node: &Node, command: &str, conf: &str, point: (Op, usize), context: &str) {
    node.kernel.crash_after(point.0, point.1);
    match catch_unwind(AssertUnwindSafe(|| node.cni(command, conf))) {
        Ok(out) => panic!("{context}: {command} ended ({out:?}) before its crash point"),
        Err(payload) => assert!(
            payload.downcast_ref::<Crashed>().is_some(),
            "{context}: {command} panicked: {:?}",
            payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or(payload.downcast_ref::<&str>().copied())
        ),
    }
    assert!(node.kernel.crashed(), "{context}");
    assert_eq!(
        node.kernel.calls_after_death(),
        0,
        "{context}: a kernel call after the crash (a destructor?)"
    );
    node.kernel.restart();
}

/// Asserts that `out` is a success.
fn ok(out: (i32, Option<Value>), what: &str) {
    assert_eq!(out.0, 0, "{what} failed: {:?}", out.1);
}

/// The runtime's steps after a failed sandbox: DEL with the same arguments,
/// the namespace removed (the kernel destroys a macvtap left in it), ADD in
/// a new namespace; then asserts what [`assert_recovered`] asserts.
fn runtime_recovers(node: &Node, conf: &str, context: &str) {
    ok(node.cni("DEL", conf), &format!("{context}: DEL"));
    assert_host_side_clean(node, context);
    // Nothing may stay in a namespace that goes: the kernel destroys a
    // macvtap there, and with it the /dev/tapN the pod holds.
    assert_eq!(
        node.kernel.links_of(POD),
        vec![],
        "{context}: left in the namespace about to be removed"
    );
    node.kernel.remove_netns(POD);
    node.kernel.add_netns(NEW_POD);
    ok(
        node.cni_in("ADD", conf, NEW_POD, "c2"),
        &format!("{context}: ADD in the new sandbox"),
    );
    assert_recovered(node, conf, context);
}

/// The device's link, when it is on the host, is down, not promiscuous,
/// with its ifindex and without the pod's MAC (a later pod given the device
/// must not inherit it), and nothing else but the NIC is there.
fn assert_host_side_clean(node: &Node, context: &str) {
    for l in node.kernel.links_of(HOST) {
        if l.name == "lower0" {
            continue;
        }
        assert_eq!(
            l.name, node.orig.name,
            "{context}: a stray link on the node"
        );
        assert_eq!(l.index, node.orig.index, "{context}");
        assert!(!l.is_up() && !l.is_promisc(), "{context}: {l:?}");
        assert_ne!(
            l.mac_string(),
            MAC,
            "{context}: the pod's MAC is on the node"
        );
    }
}

/// The new sandbox holds the device's link with the ifindex the kubelet
/// handed out, configured; the host holds nothing but its NIC (no link up,
/// none lost or leaked).
fn assert_recovered(node: &Node, conf: &str, context: &str) {
    let link = node
        .kernel
        .link(NEW_POD, "net1")
        .unwrap_or_else(|| panic!("{context}: net1 is not in the new sandbox"));
    assert_eq!(
        link.index, node.orig.index,
        "{context}: /dev/tap{} no longer names the device",
        node.orig.index
    );
    assert!(link.is_macvtap(), "{context}");
    assert_eq!(
        (link.is_up(), link.mac_string(), link.mtu),
        (true, MAC.to_string(), 1400),
        "{context}"
    );
    assert_eq!(
        node.kernel.links_of(NEW_POD).len(),
        1,
        "{context}: only net1 in the new sandbox"
    );
    let host: Vec<String> = node
        .kernel
        .links_of(HOST)
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert_eq!(host, ["lower0"], "{context}: on the node");
    assert_eq!(
        node.kernel
            .owner_of(&format!("/dev/tap{}", node.orig.index)),
        Some((107, 107)),
        "{context}"
    );
    if conf.contains("\"ipam\"") {
        assert_eq!(
            node.kernel.addrs_of(NEW_POD, "net1"),
            vec![("192.0.2.10".parse().unwrap(), 24)],
            "{context}"
        );
        assert_eq!(
            node.ipam_calls().last().map(String::as_str),
            Some("ADD"),
            "{context}: IPAM"
        );
    }
}

/// The calls of a successful ADD (with IPAM wrapper `ipam`), from the first.
fn add_calls(ipam: Option<&str>) -> Vec<(Op, usize)> {
    let probe = Node::new();
    let before = probe.kernel.calls().len();
    ok(probe.cni("ADD", &conf(ipam)), "probe ADD");
    numbered(&probe.kernel.calls(), before)
}

#[test]
fn add_killed_after_any_kernel_call_is_cleared_by_del_and_a_new_add() {
    for ipam in [None, Some("static-logged")] {
        let points = add_calls(ipam);
        assert!(points.len() >= 12, "{points:?}");
        assert!(points.contains(&(Op::MoveLink, 1)), "{points:?}");
        for point in points {
            let context = format!(
                "ADD killed after {:?} call {} (IPAM {ipam:?})",
                point.0, point.1
            );
            let node = Node::new();
            dies(&node, "ADD", &conf(ipam), point, &context);
            assert_host_side_clean(&node, &context);
            runtime_recovers(&node, &conf(ipam), &context);
        }
    }
}

/// ADD's rollback runs kernel calls too: it fails at each call after the
/// move, and dies after each call of the rollback that follows.
#[test]
fn add_killed_during_its_rollback_is_cleared_by_del_and_a_new_add() {
    let mut runs = 0;
    for ipam in [None, Some("static-logged")] {
        let all = add_calls(ipam);
        let first_move = all.iter().position(|p| *p == (Op::MoveLink, 1)).unwrap();
        for failing in &all[first_move..] {
            // What the failing run calls after the failure: its rollback.
            let probe = Node::new();
            probe.kernel.fail(failing.0, failing.1, Errno::EIO);
            let before = probe.kernel.calls().len();
            assert_eq!(probe.cni("ADD", &conf(ipam)).0, 1);
            let calls = probe.kernel.calls();
            let at = before
                + calls[before..]
                    .iter()
                    .position(|c| c.failed == Some(Errno::EIO))
                    .unwrap();
            for point in numbered(&calls, at + 1) {
                let context = format!(
                    "ADD failing at {:?} call {}, killed after {:?} call {} of its rollback \
                     (IPAM {ipam:?})",
                    failing.0, failing.1, point.0, point.1
                );
                let node = Node::new();
                node.kernel.fail(failing.0, failing.1, Errno::EIO);
                dies(&node, "ADD", &conf(ipam), point, &context);
                assert_host_side_clean(&node, &context);
                runtime_recovers(&node, &conf(ipam), &context);
                runs += 1;
            }
        }
    }
    assert!(runs >= 20, "only {runs} rollback calls");
}

#[test]
fn del_killed_after_any_kernel_call_is_cleared_by_the_next_del_and_a_new_add() {
    for ipam in [None, Some("static-logged")] {
        let probe = Node::new();
        ok(probe.cni("ADD", &conf(ipam)), "probe ADD");
        let before = probe.kernel.calls().len();
        ok(probe.cni("DEL", &conf(ipam)), "probe DEL");
        let points = numbered(&probe.kernel.calls(), before);
        assert!(points.len() >= 8, "{points:?}");
        assert!(points.iter().any(|p| p.0 == Op::MoveLink), "{points:?}");
        for point in points {
            let context = format!(
                "DEL killed after {:?} call {} (IPAM {ipam:?})",
                point.0, point.1
            );
            let node = Node::new();
            ok(
                node.cni("ADD", &conf(ipam)),
                &format!("{context}: first ADD"),
            );
            dies(&node, "DEL", &conf(ipam), point, &context);
            // The old sandbox's link is in the pod or back on the host,
            // never on the host with the pod's MAC, promiscuous or up.
            assert_host_side_clean(&node, &context);
            runtime_recovers(&node, &conf(ipam), &context);
        }
    }
}

/// A namespace removed with the macvtap still in it takes the macvtap with
/// it, and the `/dev/tapN` the pod holds. containerd does that when the DEL
/// of a sandbox whose ADD failed fails too (it then ignores the DEL's error
/// and removes the namespace), so a DEL killed before its move back after
/// an ADD killed after its move loses the link. The new sandbox's ADD then
/// fails with 101 naming the device, until the device plugin's heal makes
/// the link again at the same ifindex; then it succeeds.
#[test]
fn a_namespace_removed_with_the_link_in_it_loses_it_until_the_device_plugin_heals() {
    let node = Node::new();
    dies(&node, "ADD", &conf(None), (Op::MoveLink, 1), "ADD");
    // Killed right before its move back: after the second of its resets.
    let set_links = node.kernel.count(Op::SetLink) + 2;
    dies(&node, "DEL", &conf(None), (Op::SetLink, set_links), "DEL");
    assert_eq!(
        node.kernel.count(Op::MoveLink),
        1,
        "DEL did not move it back"
    );
    assert!(node.kernel.link(POD, "net1").is_some());
    node.kernel.remove_netns(POD);
    let host: Vec<String> = node
        .kernel
        .links_of(HOST)
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert_eq!(host, ["lower0"], "the link is gone, not on the node");
    node.kernel.add_netns(NEW_POD);
    let (exit, out) = node.cni_in("ADD", &conf(None), NEW_POD, "c2");
    let out = out.unwrap();
    assert_eq!((exit, out["code"].as_u64()), (1, Some(101)), "{out}");
    assert!(out["msg"].as_str().unwrap().contains(DEVICE), "{out}");
    // The device plugin's heal: the link again, at the ifindex handed out.
    let host = node.kernel.links(None).unwrap();
    host.add_macvtap_at(
        &link_name_for_device(DEVICE),
        node.orig.lower_index.unwrap(),
        MacvtapMode::Bridge,
        None,
        Some(node.orig.index),
    )
    .unwrap();
    drop(host);
    ok(
        node.cni_in("ADD", &conf(None), NEW_POD, "c2"),
        "ADD after the heal",
    );
    assert_recovered(&node, &conf(None), "after the heal");
}
