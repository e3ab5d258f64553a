//! What ADD sets on the link: MAC from each source, MTU, promiscuity, and
//! the owner of `/dev/tapN`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use serde_json::json;

#[test]
fn mac_comes_from_each_source_by_precedence() {
    // (runtimeConfig.mac, CNI_ARGS MAC, netconf mac) -> expected
    let cases = [
        (
            Some("02:00:00:00:00:01"),
            Some("02:00:00:00:00:02"),
            Some("02:00:00:00:00:03"),
            "02:00:00:00:00:01",
        ),
        (
            None,
            Some("02:00:00:00:00:02"),
            Some("02:00:00:00:00:03"),
            "02:00:00:00:00:02",
        ),
        (None, None, Some("02:00:00:00:00:03"), "02:00:00:00:00:03"),
    ];
    for (rt, args, conf_mac, want) in cases {
        let sb = Sandbox::new();
        sb.allocate("eth0Mvp0");
        let mut conf = netconf("1.0.0", "eth0Mvp0");
        if let Some(m) = rt {
            conf["runtimeConfig"] = json!({ "mac": m });
        }
        if let Some(m) = conf_mac {
            conf["mac"] = json!(m);
        }
        let cni_args = args
            .map(|m| format!("IgnoreUnknown=true;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=vm;MAC={m}"))
            .unwrap_or_default();
        let r = sb.cni("ADD", &conf, &[("CNI_ARGS", &cni_args)]).ok().json();
        assert_eq!(r["interfaces"][0]["mac"], want);
        assert_eq!(sb.link(&sb.pod, "net1").unwrap()["address"], want);
    }
}

#[test]
fn without_a_mac_the_kernels_is_kept() {
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    let before = sb.link(&sb.node, "mvtf2644cc3624e").unwrap()["address"].clone();
    let r = sb
        .cni("ADD", &netconf("1.0.0", "eth0Mvp0"), &[])
        .ok()
        .json();
    assert_eq!(r["interfaces"][0]["mac"], before);
}

#[test]
fn mtu_is_set_and_zero_leaves_it() {
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    sb.allocate("eth0Mvp1");
    let mut conf = netconf("1.0.0", "eth0Mvp0");
    conf["mtu"] = json!(1280);
    let r = sb.cni("ADD", &conf, &[]).ok().json();
    assert_eq!(r["interfaces"][0]["mtu"], 1280);
    assert_eq!(sb.link(&sb.pod, "net1").unwrap()["mtu"], 1280);

    let mut zero = netconf("1.0.0", "eth0Mvp1");
    zero["mtu"] = json!(0);
    sb.cni("ADD", &zero, &[("CNI_IFNAME", "net2")]).ok();
    assert_eq!(sb.link(&sb.pod, "net2").unwrap()["mtu"], 1500);
}

#[test]
fn mtu_above_the_nics_is_refused_and_the_host_untouched() {
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    let before = sb.node_links();
    let mut conf = netconf("1.0.0", "eth0Mvp0");
    conf["mtu"] = json!(9000);
    let msg = sb.cni("ADD", &conf, &[]).fails_with(103);
    assert!(msg.contains("lower0") && msg.contains("1500"), "{msg}");
    assert_eq!(sb.node_links(), before);
}

#[test]
fn promisc_mode_makes_the_link_promiscuous() {
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    let mut conf = netconf("0.4.0", "eth0Mvp0");
    conf["promiscMode"] = json!(true);
    let r = sb.cni("ADD", &conf, &[]).ok().json();
    let link = sb.link(&sb.pod, "net1").unwrap();
    assert!(
        link["flags"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "PROMISC"),
        "{link}"
    );
    conf["prevResult"] = r;
    sb.cni("CHECK", &conf, &[]).ok();
}

#[test]
fn tap_node_goes_to_qemu_by_default_and_to_owner_group_when_set() {
    let sb = Sandbox::new();
    let a = sb.allocate("eth0Mvp0");
    let b = sb.allocate("eth0Mvp1");
    sb.cni("ADD", &netconf("1.0.0", "eth0Mvp0"), &[]).ok();
    assert_eq!(node_owner(&format!("/dev/tap{a}")), Some((107, 107)));

    let mut conf = netconf("1.0.0", "eth0Mvp1");
    conf["owner"] = json!(4242);
    conf["group"] = json!(4343);
    sb.cni("ADD", &conf, &[("CNI_IFNAME", "net2")]).ok();
    assert_eq!(node_owner(&format!("/dev/tap{b}")), Some((4242, 4343)));
}

#[test]
fn log_file_gets_the_logs_and_stdout_only_the_result() {
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("macvtap.log");
    let mut conf = netconf("1.0.0", "eth0Mvp0");
    conf["logFile"] = json!(log);
    let run = sb.cni(
        "ADD",
        &conf,
        &[("MACVTAP_CNI_LOG_DIR", dir.path().to_str().unwrap())],
    );
    run.ok().json();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("moved macvtap into the pod"), "{text}");
    assert!(
        !run.stdout.contains("moved macvtap"),
        "logs never reach stdout"
    );
}

/// The kernel refuses a MAC another macvtap on the same NIC has
/// (`EADDRINUSE`); the error says so in words and the second link goes back.
#[test]
fn a_mac_another_macvtap_on_the_nic_uses_is_refused_in_words() {
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    let second = sb.allocate("eth0Mvp1");
    let mac = "02:23:45:67:89:01";
    let mut conf = netconf("1.0.0", "eth0Mvp0");
    conf["mac"] = json!(mac);
    sb.cni("ADD", &conf, &[]).ok();
    let mut conf = netconf("1.0.0", "eth0Mvp1");
    conf["mac"] = json!(mac);
    let msg = sb
        .cni("ADD", &conf, &[("CNI_IFNAME", "net2")])
        .fails_with(104);
    assert!(
        msg.starts_with(&format!(
            "setting MAC {mac} on net2: another macvtap on lower0 already uses this MAC \
             (EADDRINUSE)"
        )),
        "{msg}"
    );
    let back = sb
        .link(&sb.node, &macvtap_link::link_name_for_device("eth0Mvp1"))
        .expect("the second link is back on the node");
    assert_eq!(back["ifindex"].as_u64(), Some(second as u64));
    assert!(sb.link(&sb.pod, "net2").is_none());
}
