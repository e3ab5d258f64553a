//! ADD without `deviceID`, as released Multus runs it for a resource the
//! device plugin serves through Dynamic Resource Allocation: the plugin
//! asks the kubelet's PodResources (a test kubelet here, listing the pod's
//! prepared claim as the 1.37 kubelet does) for the pod's devices of our
//! driver and takes one whose link is on the host. Needs root (each test
//! runs the real plugin in a fresh node namespace).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::kubelet::{PodResourcesKubelet, settings_file};
use common::{CniRun, Sandbox};
use macvtap_link::link_name_for_device;
use serde_json::{Value, json};
use std::path::Path;
use test_support::TestNs;

const DP: &str = "macvtap.network.kubevirt.io/dataplane";
const STORAGE: &str = "macvtap.network.kubevirt.io/storage";

fn pod_args(ns: &str, name: &str) -> String {
    format!(
        "IgnoreUnknown=true;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};\
         K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=0b5f6e8e-1111-2222-3333-444455556666"
    )
}

/// A NetConf as Multus passes it for a DRA-served resource: no `deviceID`;
/// `resourceName` when given.
fn conf(resource_name: Option<&str>) -> Value {
    let mut c = json!({"cniVersion": "1.0.0", "name": "dataplane", "type": "macvtap"});
    if let Some(r) = resource_name {
        c["resourceName"] = Value::from(r);
    }
    c
}

/// Runs `command` for pod `tenant-a/vm` as `ifname` in `netns`, with the
/// node settings `settings`.
fn run(
    sb: &Sandbox,
    command: &str,
    netns: &TestNs,
    ifname: &str,
    conf: &Value,
    settings: &Path,
) -> CniRun {
    sb.cni(
        command,
        conf,
        &[
            ("CNI_ARGS", &pod_args("tenant-a", "vm")),
            ("CNI_NETNS", &netns.path()),
            ("CNI_IFNAME", ifname),
            ("CNI_CONTAINERID", &format!("ctr-{}", netns.name)),
            ("MACVTAP_CNI_SETTINGS", settings.to_str().unwrap()),
        ],
    )
}

/// The ifindex of `ifname` in `ns`, a macvtap.
fn index_in(sb: &Sandbox, ns: &TestNs, ifname: &str) -> u32 {
    let link = sb
        .link(ns, ifname)
        .unwrap_or_else(|| panic!("{ifname} is in {}", ns.name));
    assert_eq!(link["linkinfo"]["info_kind"], "macvtap", "{link}");
    u32::try_from(link["ifindex"].as_u64().unwrap()).unwrap()
}

#[test]
fn the_pods_dra_device_is_handed_over_and_del_gives_it_back() {
    let sb = Sandbox::new();
    let kubelet = PodResourcesKubelet::start();
    let index = sb.allocate("dataplaneMvp0");
    kubelet.add_dra_pod("tenant-a", "vm", &["dataplaneMvp0"]);
    let settings = kubelet.settings("enforce");
    run(&sb, "ADD", &sb.pod, "net1", &conf(None), &settings).ok();
    assert_eq!(index_in(&sb, &sb.pod, "net1"), index);
    let name = link_name_for_device("dataplaneMvp0");
    assert!(sb.link(&sb.node, &name).is_none(), "{name} left the node");
    // Multus' DEL has no deviceID either.
    run(&sb, "DEL", &sb.pod, "net1", &conf(None), &settings).ok();
    let back = sb.link(&sb.node, &name).expect("DEL gave the link back");
    assert_eq!(back["ifindex"].as_u64(), Some(u64::from(index)));
}

#[test]
fn two_networks_get_two_devices_and_the_same_ones_in_a_new_sandbox() {
    let sb = Sandbox::new();
    let kubelet = PodResourcesKubelet::start();
    let first = sb.allocate("dataplaneMvp1");
    let second = sb.allocate("dataplaneMvp4");
    kubelet.add_dra_pod("tenant-a", "vm", &["dataplaneMvp4", "dataplaneMvp1"]);
    let settings = kubelet.settings("enforce");
    for ifname in ["net1", "net2"] {
        run(&sb, "ADD", &sb.pod, ifname, &conf(None), &settings).ok();
    }
    assert_eq!(index_in(&sb, &sb.pod, "net1"), first);
    assert_eq!(index_in(&sb, &sb.pod, "net2"), second);
    // The runtime re-creates the sandbox: DEL both, then ADD both in a new
    // network namespace.
    for ifname in ["net1", "net2"] {
        run(&sb, "DEL", &sb.pod, ifname, &conf(None), &settings).ok();
    }
    let again = TestNs::new("pod2").unwrap();
    for ifname in ["net1", "net2"] {
        run(&sb, "ADD", &again, ifname, &conf(None), &settings).ok();
    }
    assert_eq!(index_in(&sb, &again, "net1"), first);
    assert_eq!(index_in(&sb, &again, "net2"), second);
    // A third network finds no device left.
    let msg = run(&sb, "ADD", &again, "net3", &conf(None), &settings).fails_with(101);
    assert!(
        msg.contains("in use by another network of this pod"),
        "{msg}"
    );
    for ifname in ["net1", "net2"] {
        run(&sb, "DEL", &again, ifname, &conf(None), &settings).ok();
    }
}

#[test]
fn two_resources_need_resource_name_and_then_each_gets_its_own() {
    let sb = Sandbox::new();
    let kubelet = PodResourcesKubelet::start();
    let dp = sb.allocate("dataplaneMvp0");
    let storage = sb.allocate("storageMvp0");
    kubelet.add_dra_pod("tenant-a", "vm", &["storageMvp0", "dataplaneMvp0"]);
    let settings = kubelet.settings("enforce");
    let before = sb.node_links();
    let msg = run(&sb, "ADD", &sb.pod, "net1", &conf(None), &settings).fails_with(7);
    assert!(
        msg.contains(&format!(
            "add \"resourceName\": \"{DP}\" or \"resourceName\": \"{STORAGE}\" to the config of \
             the NetworkAttachmentDefinition of network \"dataplane\""
        )),
        "{msg}"
    );
    assert_eq!(sb.node_links(), before, "the host is untouched");
    assert!(sb.link(&sb.pod, "net1").is_none());
    run(&sb, "ADD", &sb.pod, "net1", &conf(Some(STORAGE)), &settings).ok();
    run(&sb, "ADD", &sb.pod, "net2", &conf(Some(DP)), &settings).ok();
    assert_eq!(index_in(&sb, &sb.pod, "net1"), storage);
    assert_eq!(index_in(&sb, &sb.pod, "net2"), dp);
}

#[test]
fn a_hostile_resource_name_is_refused_and_logged_on_one_line() {
    let sb = Sandbox::new();
    let kubelet = PodResourcesKubelet::start();
    sb.allocate("dataplaneMvp0");
    kubelet.add_dra_pod("tenant-a", "vm", &["dataplaneMvp0"]);
    let settings = kubelet.settings("enforce");
    let before = sb.node_links();
    let hostile = "macvtap.network.kubevirt.io/dataplane\n[forged] root logged in";
    let add = run(&sb, "ADD", &sb.pod, "net1", &conf(Some(hostile)), &settings);
    let msg = add.fails_with(7);
    assert!(msg.contains("is not a macvtap resource"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
    assert!(
        !add.stderr.lines().any(|l| l.starts_with("[forged]")),
        "{}",
        add.stderr
    );
    assert_eq!(sb.node_links(), before);
}

#[test]
fn a_device_id_still_wins() {
    let sb = Sandbox::new();
    let kubelet = PodResourcesKubelet::start();
    sb.allocate("dataplaneMvp0");
    let plugin = sb.allocate("storageMvp2");
    kubelet.add_dra_pod("tenant-a", "vm", &["dataplaneMvp0"]);
    kubelet.add_pod("tenant-a", "vm", &[(STORAGE, &["storageMvp2"])]);
    let settings = kubelet.settings("enforce");
    let mut c = conf(Some(DP));
    c["deviceID"] = Value::from("storageMvp2");
    run(&sb, "ADD", &sb.pod, "net1", &c, &settings).ok();
    assert_eq!(index_in(&sb, &sb.pod, "net1"), plugin);
    let dra = link_name_for_device("dataplaneMvp0");
    assert!(
        sb.link(&sb.node, &dra).is_some(),
        "{dra} stayed on the node"
    );
}

#[test]
fn another_pods_device_is_never_taken() {
    let sb = Sandbox::new();
    let kubelet = PodResourcesKubelet::start();
    sb.allocate("dataplaneMvp0");
    sb.allocate("dataplaneMvp1");
    kubelet.add_dra_pod("tenant-b", "other", &["dataplaneMvp0"]);
    // The same pod name in another namespace is another pod.
    kubelet.add_dra_pod("tenant-b", "vm", &["dataplaneMvp1"]);
    let settings = kubelet.settings("enforce");
    let before = sb.node_links();
    let msg = run(&sb, "ADD", &sb.pod, "net1", &conf(None), &settings).fails_with(100);
    assert!(
        msg.contains("the kubelet lists no pod tenant-a/vm"),
        "{msg}"
    );
    // Listed, but holding only the device plugin's devices.
    kubelet.add_pod("tenant-a", "vm", &[(DP, &["dataplaneMvp7"])]);
    let msg = run(&sb, "ADD", &sb.pod, "net1", &conf(None), &settings).fails_with(100);
    assert!(
        msg.contains("holds no device of driver macvtap.network.kubevirt.io"),
        "{msg}"
    );
    assert!(msg.contains("the device plugin's dataplaneMvp7"), "{msg}");
    assert_eq!(sb.node_links(), before, "the host is untouched");
    assert!(sb.link(&sb.pod, "net1").is_none());
}

#[test]
fn an_unreachable_kubelet_fails_add_in_both_modes() {
    let sb = Sandbox::new();
    sb.allocate("dataplaneMvp0");
    let dir = tempfile::tempdir().unwrap();
    let no_kubelet = dir.path().join("no-kubelet");
    let before = sb.node_links();
    for (check, says) in [
        ("enforce", "podResourcesCheck is enforce"),
        (
            "warn",
            "podResourcesCheck is warn, but without a deviceID there is no device to go on with",
        ),
    ] {
        let settings = settings_file(dir.path(), &no_kubelet, check);
        let msg = run(&sb, "ADD", &sb.pod, "net1", &conf(None), &settings).fails_with(11);
        for part in [
            "the network configuration has no deviceID, and the devices pod tenant-a/vm holds \
             through Dynamic Resource Allocation cannot be looked up",
            "pod-resources/kubelet.sock cannot be reached: the socket does not exist",
            says,
        ] {
            assert!(msg.contains(part), "{check}: {part:?} in {msg}");
        }
        assert_eq!(sb.node_links(), before, "{check}: the host is untouched");
    }
}

/// The pod rewrites its link's alias (any process in it with
/// `CAP_NET_ADMIN` can) to the name of another pod's device: DEL, which has
/// no `deviceID` to hold the alias to, asks the kubelet, and deletes the
/// link instead of giving it back under that name.
#[test]
fn del_does_not_give_a_link_back_under_a_name_the_pod_rewrote() {
    let sb = Sandbox::new();
    let kubelet = PodResourcesKubelet::start();
    sb.allocate("dataplaneMvp0");
    kubelet.add_dra_pod("tenant-a", "vm", &["dataplaneMvp0"]);
    kubelet.add_dra_pod("tenant-b", "other", &["dataplaneMvp1"]);
    let settings = kubelet.settings("enforce");
    run(&sb, "ADD", &sb.pod, "net1", &conf(None), &settings).ok();
    let theirs = link_name_for_device("dataplaneMvp1");
    sb.pod
        .ip(&[
            "link",
            "set",
            "net1",
            "alias",
            &format!("macvtap-cni:{theirs}"),
        ])
        .unwrap();
    let del = run(&sb, "DEL", &sb.pod, "net1", &conf(None), &settings);
    del.ok();
    assert!(
        del.stderr.contains("holds no device whose link is"),
        "{}",
        del.stderr
    );
    assert!(sb.link(&sb.pod, "net1").is_none());
    assert!(
        sb.link(&sb.node, &theirs).is_none(),
        "{theirs} was not made"
    );
    let ours = link_name_for_device("dataplaneMvp0");
    assert!(
        sb.link(&sb.node, &ours).is_none(),
        "deleted, not given back"
    );
}
