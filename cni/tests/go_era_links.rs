//! Links the Go device plugin's last release (v0.13.1) made, named after the
//! device ID itself (`eth0Mvp3`): during a rolling replacement a pod it
//! allocated reaches this CNI, which must hand such a link over and give it
//! back under the same name.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use test_support::unique_ifindex;

/// Does what the Go device plugin v0.13.1's Allocate did: a macvtap named
/// after the device ID on the NIC. Returns its ifindex.
fn go_allocate(sb: &Sandbox, device_id: &str) -> u32 {
    let index = unique_ifindex();
    sb.add_macvtap(device_id, index);
    index
}

#[test]
fn add_del_add_with_a_go_era_link_keeps_its_name_and_ifindex() {
    let sb = Sandbox::new();
    let index = go_allocate(&sb, "eth0Mvp3");
    let conf = netconf("1.0.0", "eth0Mvp3");
    let ours = macvtap_link::link_name_for_device("eth0Mvp3");
    for round in 0..2 {
        let r = sb.cni("ADD", &conf, &[]).ok().json();
        assert_eq!(r["interfaces"][0]["name"], "net1");
        let link = sb.link(&sb.pod, "net1").expect("net1 is in the pod");
        assert_eq!(
            link["ifindex"].as_u64(),
            Some(index as u64),
            "round {round}"
        );
        assert_eq!(
            link["ifalias"], "macvtap-cni:eth0Mvp3",
            "ADD records the Go-era name"
        );
        assert!(
            sb.link(&sb.node, "eth0Mvp3").is_none(),
            "the link left the host"
        );
        // The second DEL has no deviceID: the alias alone names the link.
        let mut del_conf = conf.clone();
        if round == 1 {
            del_conf.as_object_mut().unwrap().remove("deviceID");
        }
        sb.cni("DEL", &del_conf, &[]).ok();
        assert!(sb.link(&sb.pod, "net1").is_none());
        let back = sb
            .link(&sb.node, "eth0Mvp3")
            .expect("DEL gave the link back under its Go-era name");
        assert_eq!(
            back["ifindex"].as_u64(),
            Some(index as u64),
            "round {round}"
        );
        assert!(sb.link(&sb.node, &ours).is_none(), "no mvt… link appeared");
    }
}

#[test]
fn the_mvt_link_is_taken_when_both_exist() {
    let sb = Sandbox::new();
    let go_index = go_allocate(&sb, "eth0Mvp4");
    let index = sb.allocate("eth0Mvp4");
    let run = sb.cni("ADD", &netconf("1.0.0", "eth0Mvp4"), &[]);
    run.ok();
    let link = sb.link(&sb.pod, "net1").unwrap();
    assert_eq!(link["ifindex"].as_u64(), Some(index as u64));
    let left = sb
        .link(&sb.node, "eth0Mvp4")
        .expect("the Go-era link stays");
    assert_eq!(left["ifindex"].as_u64(), Some(go_index as u64));
    assert!(
        run.stderr.contains("leaving eth0Mvp4 on the host"),
        "the choice is logged: {}",
        run.stderr
    );
}

#[test]
fn a_go_era_name_that_is_not_a_macvtap_is_refused() {
    let sb = Sandbox::new();
    sb.node
        .ip(&[
            "link", "add", "eth0Mvp5", "type", "veth", "peer", "name", "vx5",
        ])
        .unwrap();
    let before = sb.node_links();
    let msg = sb
        .cni("ADD", &netconf("1.0.0", "eth0Mvp5"), &[])
        .fails_with(102);
    assert!(msg.contains("eth0Mvp5") && msg.contains("veth"), "{msg}");
    assert_eq!(sb.node_links(), before);
    // A macvlan under the Go-era name is refused the same way.
    sb.node
        .ip(&[
            "link", "add", "eth0Mvp6", "link", "lower0", "type", "macvlan",
        ])
        .unwrap();
    let msg = sb
        .cni("ADD", &netconf("1.0.0", "eth0Mvp6"), &[])
        .fails_with(102);
    assert!(msg.contains("macvlan"), "{msg}");
    assert_eq!(links_summary(&sb.pod).len(), 1, "only lo in the pod");
}

#[test]
fn a_missing_device_names_both_link_names() {
    let sb = Sandbox::new();
    let msg = sb
        .cni("ADD", &netconf("1.0.0", "eth0Mvp7"), &[])
        .fails_with(101);
    let ours = macvtap_link::link_name_for_device("eth0Mvp7");
    assert!(msg.contains(&ours) && msg.contains("or eth0Mvp7"), "{msg}");
    // A device ID that is no device plugin's shape never names a host link.
    let msg = sb
        .cni("ADD", &netconf("1.0.0", "lower0"), &[])
        .fails_with(101);
    assert!(!msg.contains("or lower0"), "{msg}");
}
