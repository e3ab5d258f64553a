//! Bad input and failures: a clear error, and the host exactly as it was.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use serde_json::json;
use test_support::{TestNs, unique_ifindex};

#[test]
fn add_refuses_an_empty_device_id() {
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    let before = sb.node_links();
    let msg = sb.cni("ADD", &netconf("1.0.0", ""), &[]).fails_with(100);
    assert!(msg.contains("k8s.v1.cni.cncf.io/resourceName"), "{msg}");
    let mut no_key = netconf("1.0.0", "");
    no_key.as_object_mut().unwrap().remove("deviceID");
    sb.cni("ADD", &no_key, &[]).fails_with(100);
    assert_eq!(sb.node_links(), before);
}

#[test]
fn add_refuses_an_unknown_device_id() {
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    let before = sb.node_links();
    let msg = sb
        .cni("ADD", &netconf("1.0.0", "eth0Mvp9"), &[])
        .fails_with(101);
    assert!(
        msg.contains("eth0Mvp9") && msg.contains(&macvtap_link::link_name_for_device("eth0Mvp9")),
        "{msg}"
    );
    assert_eq!(sb.node_links(), before);
}

#[test]
fn add_refuses_a_veth() {
    let sb = Sandbox::new();
    let name = macvtap_link::link_name_for_device("eth0Mvp0");
    sb.node
        .ip(&["link", "add", &name, "type", "veth", "peer", "name", "vx"])
        .unwrap();
    let before = sb.node_links();
    let msg = sb
        .cni("ADD", &netconf("1.0.0", "eth0Mvp0"), &[])
        .fails_with(102);
    assert!(
        msg.contains(&format!("link {name} is a veth, not a macvtap")),
        "{msg}"
    );
    assert_eq!(sb.node_links(), before);
    assert_eq!(links_summary(&sb.pod).len(), 1, "only lo in the pod");
}

#[test]
fn add_refuses_a_host_nic() {
    let sb = Sandbox::new();
    // A device ID that names the NIC itself maps to an mvt… name, never to the NIC.
    let before = sb.node_links();
    sb.cni("ADD", &netconf("1.0.0", "lower0"), &[])
        .fails_with(101);
    assert_eq!(sb.node_links(), before, "the NIC is left alone");
    // A macvlan (not a macvtap) under a device's name is refused too.
    let name = macvtap_link::link_name_for_device("eth0Mvp0");
    sb.node
        .ip(&["link", "add", &name, "link", "lower0", "type", "macvlan"])
        .unwrap();
    let with_macvlan = sb.node_links();
    let msg = sb
        .cni("ADD", &netconf("1.0.0", "eth0Mvp0"), &[])
        .fails_with(102);
    assert!(
        msg.contains(&format!("link {name} is a macvlan, not a macvtap")),
        "{msg}"
    );
    assert_eq!(sb.node_links(), with_macvlan);
    assert!(before.iter().any(|l| l.1 == "lower0"));
    assert!(
        sb.link(&sb.node, "lower0").unwrap()["flags"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "UP")
    );
}

#[test]
fn rename_failure_leaves_the_link_on_the_host_under_its_name() {
    let sb = Sandbox::new();
    let index = sb.allocate("eth0Mvp0");
    sb.pod
        .ip(&["link", "add", "net1", "type", "veth", "peer", "name", "x1"])
        .unwrap();
    let before = sb.node_links();
    let msg = sb
        .cni("ADD", &netconf("1.0.0", "eth0Mvp0"), &[])
        .fails_with(7);
    assert!(
        links_summary(&sb.pod).iter().all(|l| l.2 != "macvtap"),
        "nothing left in the pod"
    );
    assert!(msg.contains("already exists"), "{msg}");
    assert_eq!(sb.node_links(), before);
    let link = sb
        .link(&sb.node, "mvtf2644cc3624e")
        .expect("link back on the host");
    assert_eq!(link["ifindex"].as_u64(), Some(index as u64));
    // A retry after the pod is fixed works.
    sb.pod.ip(&["link", "del", "net1"]).unwrap();
    sb.cni("ADD", &netconf("1.0.0", "eth0Mvp0"), &[]).ok();
}

#[test]
fn taken_ifindex_in_the_pod_is_refused_before_moving() {
    let sb = Sandbox::new();
    let index = sb.allocate("eth0Mvp0");
    let index_arg = index.to_string();
    sb.pod
        .ip(&[
            "link", "add", "blk0", "index", &index_arg, "type", "veth", "peer", "name", "blk1",
        ])
        .unwrap();
    let before = sb.node_links();
    let msg = sb
        .cni("ADD", &netconf("1.0.0", "eth0Mvp0"), &[])
        .fails_with(105);
    assert!(msg.contains(&format!("/dev/tap{index}")), "{msg}");
    assert_eq!(sb.node_links(), before);
}

#[test]
fn a_tap_node_of_another_link_is_refused_and_rolled_back() {
    let sb = Sandbox::new();
    let other = TestNs::new("other").unwrap();
    let index = unique_ifindex();
    // Another namespace's macvtap takes /dev/tap<index> first...
    sb.node
        .ip(&[
            "link",
            "add",
            "lowx",
            "type",
            "veth",
            "peer",
            "name",
            "lowy",
            "netns",
            &other.name,
        ])
        .unwrap();
    other
        .ip(&[
            "link",
            "add",
            "mvtother",
            "index",
            &index.to_string(),
            "link",
            "lowy",
            "type",
            "macvtap",
        ])
        .unwrap();
    // ...then the device's macvtap gets the same ifindex on the node.
    sb.allocate_at("eth0Mvp0", index);
    let before = sb.node_links();
    let msg = sb
        .cni("ADD", &netconf("1.0.0", "eth0Mvp0"), &[])
        .fails_with(104);
    assert!(
        msg.contains(&format!("/dev/tap{index}: is char device"))
            && msg.contains("it belongs to another link"),
        "{msg}"
    );
    assert_eq!(sb.node_links(), before, "the link is back, as it was");
    assert_eq!(links_summary(&sb.pod).len(), 1);
}

#[test]
fn a_failure_after_the_move_rolls_back_the_link_and_ipam() {
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    let data = tempfile::tempdir().unwrap();
    let before = sb.node_links();
    let mut conf = netconf("1.0.0", "eth0Mvp0");
    conf["mtu"] = json!(1400);
    conf["ipam"] = json!({
        "type": "host-local",
        "dataDir": data.path(),
        "ranges": [[{"subnet": "192.0.2.0/24", "rangeStart": "192.0.2.10", "rangeEnd": "192.0.2.20"}]],
        // The gateway is off-link: adding this route fails after the move.
        "routes": [{"dst": "198.51.100.0/24", "gw": "203.0.113.1"}]
    });
    let run = sb.cni(
        "ADD",
        &conf,
        &[("CNI_ARGS", "IgnoreUnknown=true;MAC=02:00:00:00:00:77")],
    );
    let msg = run.fails_with(104);
    assert!(msg.contains("198.51.100.0/24"), "{msg}");
    assert_eq!(
        sb.node_links(),
        before,
        "link back on the host with its MAC and MTU"
    );
    let link = sb.link(&sb.node, "mvtf2644cc3624e").unwrap();
    assert!(!link["flags"].as_array().unwrap().iter().any(|f| f == "UP"));
    let leases: Vec<_> = std::fs::read_dir(data.path().join("dataplane"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("192.0.2."))
        .collect();
    assert!(leases.is_empty(), "IPAM released its address: {leases:?}");
}

/// Run by hand (no `CNI_COMMAND`, or `--help`/`--version`), the plugin says
/// its name, version and spec versions on stderr and exits 0 without reading
/// stdin, as the reference plugins do; stdout (a runtime's result) stays empty.
#[test]
fn a_run_by_hand_prints_what_the_plugin_is_and_exits_0() {
    use std::process::{Command, Stdio};
    let cases: [(&[&str], Option<&str>); 4] = [
        (&[], None),
        (&["--help"], None),
        (&["--version"], None),
        (&["--help"], Some("ADD")),
    ];
    for (args, command) in cases {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_macvtap"));
        cmd.args(args)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(c) = command {
            cmd.env("CNI_COMMAND", c);
        }
        // stdin stays open and empty: a plugin that read it would never end.
        let mut child = cmd.spawn().unwrap();
        let _stdin = child.stdin.take();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                panic!("{args:?}: the plugin waited for stdin");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(status.success(), "{args:?}: {status} {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: stdout {:?}", out.stdout);
        assert_eq!(
            stderr,
            format!(
                "CNI macvtap plugin v{}\nCNI protocol versions supported: 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0\n",
                env!("CARGO_PKG_VERSION")
            ),
            "{args:?}"
        );
    }
}
