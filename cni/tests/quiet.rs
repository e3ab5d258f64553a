//! The pod-side macvtap sends nothing of its own: without IPAM, no frame
//! with the VM's MAC leaves before the guest's (no IPv6 DAD, router
//! solicitation or MLD report). During a live migration such frames would
//! teach the switches that the VM lives on the target while it still runs on
//! the source. With IPAM the link keeps IPv6. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Sandbox, netconf};
use serde_json::json;
use std::time::Duration;
use test_support::capture::{Capture, Frame};
use test_support::{TestNs, sh, unique_ifindex};

fn mac(s: &str) -> [u8; 6] {
    test_support::capture::mac(s).unwrap()
}

/// `disable_ipv6` of `net1`, read inside the pod namespace.
fn pod_disable_ipv6(sb: &Sandbox) -> String {
    let path = "/proc/sys/net/ipv6/conf/net1/disable_ipv6";
    let out = sh(&["ip", "netns", "exec", &sb.pod.name, "cat", path]).unwrap();
    out.trim().to_string()
}

#[test]
fn without_ipam_the_pod_link_sends_nothing_with_the_vms_mac() {
    let sb = Sandbox::new();
    let capture = Capture::start(&sb.peer, "peer0").unwrap();
    let vm_mac = "02:00:00:00:16:01";
    sb.allocate("eth0Mvp1");
    sb.cni(
        "ADD",
        &netconf("1.0.0", "eth0Mvp1"),
        &[("CNI_ARGS", &format!("IgnoreUnknown=true;MAC={vm_mac}"))],
    )
    .ok();
    assert_eq!(pod_disable_ipv6(&sb), "1");

    // A control brought up after ours, the way a plain `ip link set up`
    // leaves a link: its first router solicitation comes after its DAD (at
    // least a second after it came up), and by then a chatty link that came
    // up earlier has sent its MLD report and DAD probe (within a second).
    let control_ns = TestNs::new("ctl").unwrap();
    let control_mac = "02:00:00:00:16:02";
    sb.add_macvtap("ctl0", unique_ifindex());
    sb.node
        .ip(&[
            "link",
            "set",
            "ctl0",
            "address",
            control_mac,
            "netns",
            &control_ns.name,
        ])
        .unwrap();
    control_ns.ip(&["link", "set", "ctl0", "up"]).unwrap();
    assert!(
        capture.wait_for(Duration::from_secs(15), |f| {
            f.src == mac(control_mac) && f.is_router_solicitation()
        }),
        "no router solicitation from the control link within 15 s"
    );

    let ours: Vec<Frame> = capture
        .frames()
        .into_iter()
        .filter(|f| f.src == mac(vm_mac))
        .collect();
    assert!(
        ours.is_empty(),
        "{} frames left with the VM's MAC before any guest ran: {:x?}",
        ours.len(),
        ours.first().map(|f| &f.bytes)
    );
    control_ns.ip(&["link", "del", "ctl0"]).unwrap();
    sb.pod.ip(&["link", "del", "net1"]).unwrap();
}

#[test]
fn with_ipam_the_pod_link_keeps_ipv6() {
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp2");
    let mut conf = netconf("1.0.0", "eth0Mvp2");
    conf["ipam"] = json!({
        "type": "static",
        "addresses": [{"address": "2001:db8::16/64"}]
    });
    sb.cni("ADD", &conf, &[]).ok();
    assert_eq!(pod_disable_ipv6(&sb), "0");
    let addrs = sb.pod.ip(&["-6", "addr", "show", "dev", "net1"]).unwrap();
    assert!(addrs.contains("2001:db8::16/64"), "{addrs}");
    sb.pod.ip(&["link", "del", "net1"]).unwrap();
}
