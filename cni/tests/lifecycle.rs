//! ADD, CHECK and DEL through the real binary, for every spec version.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use serde_json::json;
use test_support::{TestNs, sh};

#[test]
fn add_check_del_work_for_every_version() {
    for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let sb = Sandbox::new();
        let index = sb.allocate("dataplaneMvp42");
        let conf = netconf(version, "dataplaneMvp42");
        let result = sb.cni("ADD", &conf, &[]).ok().json();
        assert_eq!(result["cniVersion"], version);
        let iface = &result["interfaces"][0];
        assert_eq!(iface["name"], "net1");
        assert_eq!(iface["sandbox"], sb.pod.path());
        let link = sb.link(&sb.pod, "net1").expect("net1 is in the pod");
        assert_eq!(link["ifindex"].as_u64(), Some(index as u64), "ifindex kept");
        assert_eq!(iface["mac"], link["address"]);
        if version.starts_with("1.") {
            assert_eq!(iface["mtu"].as_u64(), link["mtu"].as_u64());
        } else {
            assert!(iface.get("mtu").is_none(), "{version} results carry no mtu");
        }
        assert!(link["flags"].as_array().unwrap().iter().any(|f| f == "UP"));
        assert!(
            sb.link(&sb.node, "mvt1d9e32f0b2c5").is_none(),
            "the link left the host"
        );

        let mut check = conf.clone();
        check["prevResult"] = result.clone();
        if version.starts_with("0.3") {
            sb.cni("CHECK", &check, &[]).fails_with(1);
        } else {
            sb.cni("CHECK", &check, &[]).ok();
        }

        sb.cni("DEL", &conf, &[]).ok();
        assert!(
            sb.link(&sb.pod, "net1").is_none(),
            "{version}: DEL took the link out of the pod"
        );
        let back = sb
            .link(&sb.node, "mvt1d9e32f0b2c5")
            .expect("DEL gave the link back to the host");
        assert_eq!(back["ifindex"].as_u64(), Some(index as u64), "{version}");
        assert!(
            std::path::Path::new(&format!("/dev/tap{index}")).exists(),
            "{version}: /dev/tap{index} still names the device"
        );
    }
}

#[test]
fn ifindex_and_tap_node_are_kept_across_the_move() {
    let sb = Sandbox::new();
    let index = sb.allocate("eth0Mvp7");
    let node = format!("/dev/tap{index}");
    assert!(std::path::Path::new(&node).exists());
    sb.cni("ADD", &netconf("1.0.0", "eth0Mvp7"), &[]).ok();
    assert_eq!(
        sb.link(&sb.pod, "net1").unwrap()["ifindex"].as_u64(),
        Some(index as u64)
    );
    assert!(
        std::path::Path::new(&node).exists(),
        "{node} exists after the move"
    );
    assert!(
        sb.link(&sb.node, "mvted95a7da7eb8").is_none(),
        "the link left the host"
    );
}

#[test]
fn del_twice_succeeds() {
    let sb = Sandbox::new();
    let index = sb.allocate("eth0Mvp0");
    let name = macvtap_link::link_name_for_device("eth0Mvp0");
    let conf = netconf("1.1.0", "eth0Mvp0");
    sb.cni("ADD", &conf, &[]).ok();
    sb.cni("DEL", &conf, &[]).ok();
    let back = sb.node_links();
    assert!(
        back.iter().any(|l| l.0 == index as u64 && l.1 == name),
        "the first DEL gave {name} back as ifindex {index}: {back:?}"
    );
    // The second DEL finds nothing to do: the given-back link stays as it is.
    sb.cni("DEL", &conf, &[]).ok();
    assert_eq!(sb.node_links(), back, "the second DEL changed the host");
    assert!(sb.link(&sb.pod, "net1").is_none());
}

#[test]
fn del_after_the_netns_is_gone_succeeds() {
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    let conf = netconf("0.4.0", "eth0Mvp0");
    sb.cni("ADD", &conf, &[]).ok();
    sh(&["ip", "netns", "del", &sb.pod.name]).unwrap();
    let host = sb.node_links();
    sb.cni("DEL", &conf, &[]).ok();
    sb.cni("DEL", &conf, &[("CNI_NETNS", "")]).ok();
    assert_eq!(sb.node_links(), host, "DEL without a pod changed the host");
}

#[test]
fn del_leaves_a_non_macvtap_alone() {
    let sb = Sandbox::new();
    sb.pod
        .ip(&["link", "add", "net1", "type", "veth", "peer", "name", "x1"])
        .unwrap();
    sb.cni("DEL", &netconf("1.0.0", "eth0Mvp0"), &[]).ok();
    assert!(sb.link(&sb.pod, "net1").is_some());
}

#[test]
fn check_detects_changes_made_after_add() {
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    let mut conf = netconf("1.1.0", "eth0Mvp0");
    conf["mtu"] = json!(1400);
    let result = sb.cni("ADD", &conf, &[]).ok().json();
    conf["prevResult"] = result;
    sb.cni("CHECK", &conf, &[]).ok();

    sb.pod.ip(&["link", "set", "net1", "mtu", "1300"]).unwrap();
    let msg = sb.cni("CHECK", &conf, &[]).fails_with(106);
    assert!(msg.contains("has MTU 1300 but 1400 was set"), "{msg}");
    sb.pod.ip(&["link", "set", "net1", "mtu", "1400"]).unwrap();

    sb.pod
        .ip(&["link", "set", "net1", "address", "02:00:00:00:99:99"])
        .unwrap();
    let mac = conf["prevResult"]["interfaces"][0]["mac"]
        .as_str()
        .unwrap()
        .to_string();
    let msg = sb.cni("CHECK", &conf, &[]).fails_with(106);
    assert!(
        msg.contains(&format!("has MAC 02:00:00:00:99:99 but {mac} was set")),
        "{msg}"
    );
    sb.pod
        .ip(&["link", "set", "net1", "address", &mac])
        .unwrap();

    sb.pod.ip(&["link", "set", "net1", "down"]).unwrap();
    let msg = sb.cni("CHECK", &conf, &[]).fails_with(106);
    assert!(
        msg.contains("net1 in ") && msg.ends_with(" is down"),
        "{msg}"
    );

    sb.pod.ip(&["link", "del", "net1"]).unwrap();
    let msg = sb.cni("CHECK", &conf, &[]).fails_with(106);
    assert!(
        msg.contains(&format!("link net1 in {} does not exist", sb.pod.path())),
        "{msg}"
    );
}

#[test]
fn check_without_prev_result_is_invalid_config() {
    let sb = Sandbox::new();
    sb.cni("CHECK", &netconf("1.0.0", "eth0Mvp0"), &[])
        .fails_with(7);
}

#[test]
fn add_keeps_the_prev_result() {
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    let mut conf = netconf("1.0.0", "eth0Mvp0");
    conf["prevResult"] = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": sb.pod.path()}],
        "ips": [{"address": "198.51.100.7/24", "interface": 0}],
        "dns": {"nameservers": ["198.51.100.53"]}
    });
    let r = sb.cni("ADD", &conf, &[]).ok().json();
    assert_eq!(r["interfaces"][0]["name"], "eth0");
    assert_eq!(r["interfaces"][1]["name"], "net1");
    assert_eq!(r["ips"][0]["address"], "198.51.100.7/24");
    assert_eq!(r["dns"]["nameservers"][0], "198.51.100.53");
}

#[test]
fn version_and_bad_input_give_spec_codes() {
    let sb = Sandbox::new();
    let v = run_plugin(
        &sb.node.name,
        &[("CNI_COMMAND", "VERSION".into())],
        b"{\"cniVersion\":\"1.0.0\"}",
    );
    assert_eq!(v.code, 0);
    assert_eq!(
        v.json()["supportedVersions"],
        json!([
            "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"
        ])
    );

    let env = |cmd: &str| {
        vec![
            ("CNI_COMMAND", cmd.to_string()),
            ("CNI_CONTAINERID", "c".to_string()),
            ("CNI_IFNAME", "net1".to_string()),
            ("CNI_NETNS", sb.pod.path()),
        ]
    };
    run_plugin(&sb.node.name, &env("ADD"), b"{nope").fails_with(6);
    run_plugin(
        &sb.node.name,
        &env("ADD"),
        br#"{"cniVersion":"1.0.0","mtu":"x"}"#,
    )
    .fails_with(7);
    run_plugin(&sb.node.name, &env("ADD"), br#"{"cniVersion":"0.0.9"}"#).fails_with(1);
    let mut no_netns = env("ADD");
    no_netns.retain(|(k, _)| *k != "CNI_NETNS");
    run_plugin(&sb.node.name, &no_netns, br#"{"cniVersion":"1.0.0"}"#).fails_with(4);
    let mut bad_args = env("ADD");
    bad_args.push(("CNI_ARGS", "FOO=1".into()));
    run_plugin(
        &sb.node.name,
        &bad_args,
        br#"{"cniVersion":"1.0.0","deviceID":"x"}"#,
    )
    .fails_with(4);
    let mut missing_ns = env("ADD");
    missing_ns.retain(|(k, _)| *k != "CNI_NETNS");
    missing_ns.push(("CNI_NETNS", "/run/netns/does-not-exist".into()));
    sb.allocate("eth0Mvp0");
    run_plugin(
        &sb.node.name,
        &missing_ns,
        netconf("1.0.0", "eth0Mvp0").to_string().as_bytes(),
    )
    .fails_with(3);
    assert!(
        sb.link(&sb.node, "mvtf2644cc3624e").is_some(),
        "the link stayed on the host"
    );
}

/// The runtime re-creates a failed sandbox: DEL while the old namespace
/// lives, then ADD into a new one with the same device (the kubelet never
/// Allocates again). The retried ADD gets the same link and `/dev/tapN`.
#[test]
fn del_gives_the_link_back_so_a_new_sandbox_gets_it() {
    let sb = Sandbox::new();
    let index = sb.allocate("eth0Mvp5");
    let mut conf = netconf("1.0.0", "eth0Mvp5");
    conf["promiscMode"] = json!(true);
    let args = [("CNI_ARGS", "IgnoreUnknown=true;MAC=02:00:00:00:05:01")];
    sb.cni("ADD", &conf, &args).ok();
    sb.cni("DEL", &conf, &[]).ok();

    let host_name = macvtap_link::link_name_for_device("eth0Mvp5");
    let back = sb.link(&sb.node, &host_name).expect("back on the host");
    assert_eq!(back["ifindex"].as_u64(), Some(index as u64));
    let flags = back["flags"].as_array().unwrap();
    assert!(!flags.iter().any(|f| f == "UP"), "down: {back}");
    assert_eq!(back["promiscuity"].as_u64(), Some(0), "{back}");
    assert_ne!(
        back["address"], "02:00:00:00:05:01",
        "the next pod must not inherit this pod's MAC"
    );
    assert_eq!(
        back["ifalias"].as_str(),
        Some(format!("macvtap-cni:{host_name}").as_str())
    );

    let second = TestNs::new("pod2").unwrap();
    let result = sb
        .cni("ADD", &conf, &[("CNI_NETNS", &second.path()), args[0]])
        .ok()
        .json();
    assert_eq!(result["interfaces"][0]["sandbox"], second.path());
    let link = second
        .link_json("net1")
        .unwrap()
        .expect("net1 in the new sandbox");
    assert_eq!(link["ifindex"].as_u64(), Some(index as u64));
    assert_eq!(link["address"], "02:00:00:00:05:01");
    assert!(std::path::Path::new(&format!("/dev/tap{index}")).exists());
    assert_eq!(
        common::node_owner(&format!("/dev/tap{index}")),
        Some((107, 107))
    );
    // Delete before the namespace goes (namespaces die asynchronously).
    second.ip(&["link", "del", "net1"]).unwrap();
}

/// Multus sends DEL from its cache, but a runtime may send one without
/// `deviceID`: the name recorded at ADD is enough.
#[test]
fn del_without_device_id_still_gives_the_link_back() {
    let sb = Sandbox::new();
    let index = sb.allocate("eth0Mvp6");
    sb.cni("ADD", &netconf("1.1.0", "eth0Mvp6"), &[]).ok();
    sb.cni("DEL", &netconf("1.1.0", ""), &[]).ok();
    let back = sb
        .link(&sb.node, &macvtap_link::link_name_for_device("eth0Mvp6"))
        .expect("back on the host under its name");
    assert_eq!(back["ifindex"].as_u64(), Some(index as u64));
    sb.cni("DEL", &netconf("1.1.0", ""), &[]).ok();
}

/// Without a recorded name and without `deviceID`, DEL cannot know the host
/// name: it deletes the link rather than guess.
#[test]
fn del_without_any_name_deletes_the_link() {
    let sb = Sandbox::new();
    let index = sb.allocate("eth0Mvp8");
    sb.cni("ADD", &netconf("1.1.0", "eth0Mvp8"), &[]).ok();
    sb.pod
        .ip(&["link", "set", "net1", "alias", "eth0"])
        .unwrap();
    sb.cni("DEL", &netconf("1.1.0", ""), &[]).ok();
    assert!(sb.link(&sb.pod, "net1").is_none());
    assert!(
        !common::links_summary(&sb.node)
            .iter()
            .any(|l| l.0 == index as u64 || l.1 == "eth0" && l.2 == "macvtap"),
        "nothing named by the pod's alias reached the host"
    );
}

/// The ifindex is taken on the host (by a link made meanwhile): moving back
/// would orphan `/dev/tapN`, so DEL deletes the link and says so.
#[test]
fn del_deletes_when_the_ifindex_is_taken_on_the_host() {
    let sb = Sandbox::new();
    let index = sb.allocate("eth0Mvp9");
    let conf = netconf("1.1.0", "eth0Mvp9");
    sb.cni("ADD", &conf, &[]).ok();
    let index_arg = index.to_string();
    sb.node
        .ip(&[
            "link", "add", "squat0", "index", &index_arg, "type", "veth", "peer", "name", "squat1",
        ])
        .unwrap();
    let run = sb.cni("DEL", &conf, &[]);
    run.ok();
    assert!(run.stderr.contains("ifindex is taken"), "{}", run.stderr);
    assert!(sb.link(&sb.pod, "net1").is_none());
    let host_name = macvtap_link::link_name_for_device("eth0Mvp9");
    assert!(sb.link(&sb.node, &host_name).is_none());
    assert_eq!(
        sb.link(&sb.node, "squat0").unwrap()["ifindex"].as_u64(),
        Some(index as u64),
        "the host's link is untouched"
    );
}

/// A link of the same name exists on the host again: DEL leaves it alone and
/// deletes the pod's.
#[test]
fn del_deletes_when_the_name_is_taken_on_the_host() {
    let sb = Sandbox::new();
    let index = sb.allocate("eth0Mvp10");
    let conf = netconf("1.1.0", "eth0Mvp10");
    sb.cni("ADD", &conf, &[]).ok();
    let other = sb.allocate("eth0Mvp10");
    sb.cni("DEL", &conf, &[]).ok();
    assert!(sb.link(&sb.pod, "net1").is_none());
    let host = sb
        .link(&sb.node, &macvtap_link::link_name_for_device("eth0Mvp10"))
        .unwrap();
    assert_eq!(host["ifindex"].as_u64(), Some(other as u64));
    assert!(
        !common::links_summary(&sb.node)
            .iter()
            .any(|l| l.0 == index as u64)
    );
}
