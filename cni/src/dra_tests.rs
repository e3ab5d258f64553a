//! ADD without `deviceID` (the device the pod holds through DRA,
//! `crate::dra`), driven without root: the whole plugin (`run_on`) against
//! the fake kernel (`test_support::fake`) and the test kubelet's
//! PodResources server (`test_kubelet::TestPodResources`), which lists a
//! pod's prepared claims as the 1.37 kubelet does
//! (`test_kubelet::dynamic_resources`).

use crate::run_on;
use crate::settings::NodeSettings;
use macvtap_link::dra::{DRIVER, cdi_device_id, dra_device_name};
use macvtap_link::{Kernel, Link, MacvtapMode, PodResourcesCheck, link_name_for_device};
use serde_json::Value;
use std::collections::HashMap;
use test_kubelet::{PreparedClaim, PreparedDevice, TestPodResources};
use test_support::fake::{FakeKernel, HOST};

const POD_A: &str = "/run/netns/pod-a";
const POD_B: &str = "/run/netns/pod-b";
const ETH1: &str = "macvtap.network.kubevirt.io/eth1";
const ETH2: &str = "macvtap.network.kubevirt.io/eth2";

/// A node: a fake kernel with NICs `eth1` and `eth2` and two pod
/// namespaces, and a PodResources server in its own kubelet dir.
struct Node {
    kernel: FakeKernel,
    kubelet: Option<TestPodResources>,
    runtime: Option<tokio::runtime::Runtime>,
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Self {
        let kernel = FakeKernel::new();
        kernel.add_netns(POD_A);
        kernel.add_netns(POD_B);
        kernel.add_nic(HOST, "eth1");
        kernel.add_nic(HOST, "eth2");
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let socket = dir.path().join("pod-resources/kubelet.sock");
        let kubelet = runtime.block_on(TestPodResources::start(&socket)).unwrap();
        kubelet.set_rate_limit(None);
        Node {
            kernel,
            kubelet: Some(kubelet),
            runtime: Some(runtime),
            dir,
        }
    }

    fn kubelet(&self) -> &TestPodResources {
        self.kubelet.as_ref().unwrap()
    }

    /// What the device plugin's DRA prepare does for `device_id`: its
    /// macvtap on the host, on the NIC its resource is named after.
    fn prepare(&self, device_id: &str) -> Link {
        let (nic, _) = macvtap_link::parse_device_id(device_id).unwrap();
        let lower = self.kernel.link(HOST, nic).unwrap();
        let host = self.kernel.links(None).unwrap();
        host.add_macvtap_at(
            &link_name_for_device(device_id),
            lower.index,
            MacvtapMode::Bridge,
            None,
            None,
        )
        .unwrap()
    }

    /// Lists pod `namespace/name` holding one claim with `device_ids`
    /// (prepared on the host first), as the kubelet lists it.
    fn pod_with_claim(&self, namespace: &str, name: &str, device_ids: &[&str]) -> Vec<Link> {
        let links = device_ids.iter().map(|id| self.prepare(id)).collect();
        self.kubelet().add_pod_with_claims(
            namespace,
            name,
            &[],
            &[claim(namespace, name, device_ids)],
        );
        links
    }

    fn settings(&self, check: PodResourcesCheck) -> NodeSettings {
        NodeSettings {
            kubelet_dir: self.dir.path().to_path_buf(),
            pod_resources_check: check,
            log_dir: self.dir.path().to_path_buf(),
            source: "test".into(),
            problem: None,
        }
    }

    /// Runs `command` for pod `tenant-a/vm` in `netns` as `ifname`.
    fn cni(&self, command: &str, netns: &str, ifname: &str, conf: &str) -> (i32, Value) {
        self.cni_as(command, netns, ifname, conf, PodResourcesCheck::Enforce)
    }

    fn cni_as(
        &self,
        command: &str,
        netns: &str,
        ifname: &str,
        conf: &str,
        check: PodResourcesCheck,
    ) -> (i32, Value) {
        let vars: HashMap<String, String> = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", netns.rsplit('/').next().unwrap()),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", ifname),
            (
                "CNI_ARGS",
                "IgnoreUnknown=true;K8S_POD_NAMESPACE=tenant-a;K8S_POD_NAME=vm",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let out = run_on(&self.kernel, &self.settings(check), &vars, conf.as_bytes());
        let v = out
            .stdout
            .map(|s| serde_json::from_str(&s).unwrap())
            .unwrap_or(Value::Null);
        (out.exit_code, v)
    }

    /// ADD that must succeed; returns the pod link.
    fn add(&self, netns: &str, ifname: &str, conf: &str) -> Link {
        let (exit, out) = self.cni("ADD", netns, ifname, conf);
        assert_eq!(exit, 0, "{out}");
        self.kernel.link(netns, ifname).unwrap()
    }

    /// ADD that must fail; returns its code and message.
    fn add_fails(&self, netns: &str, conf: &str, check: PodResourcesCheck) -> (u64, String) {
        let (exit, out) = self.cni_as("ADD", netns, "net1", conf, check);
        assert_eq!(exit, 1, "{out}");
        (
            out["code"].as_u64().unwrap(),
            out["msg"].as_str().unwrap().to_string(),
        )
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kubelet.take();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// The claim our driver prepared for pod `namespace/name` with `device_ids`.
fn claim(namespace: &str, name: &str, device_ids: &[&str]) -> PreparedClaim {
    let uid = format!("0b5f6e8e-{:04x}-4222-8333-444455556666", name.len());
    PreparedClaim {
        name: format!("{name}-extended-resources-x7k2p"),
        namespace: namespace.into(),
        devices: device_ids
            .iter()
            .map(|id| {
                let (nic, index) = macvtap_link::parse_device_id(id).unwrap();
                PreparedDevice {
                    driver: DRIVER.into(),
                    pool: "node-1".into(),
                    device: dra_device_name(nic, index),
                    cdi_ids: vec![cdi_device_id(&uid, id)],
                }
            })
            .collect(),
    }
}

/// A NetConf without `deviceID`, with `extra` keys (`,"k":v` or empty).
fn conf(extra: &str) -> String {
    format!(r#"{{"cniVersion":"1.0.0","name":"dataplane","type":"macvtap"{extra}}}"#)
}

fn resource(name: &str) -> String {
    format!(r#","resourceName":"{name}""#)
}

#[test]
fn the_pods_one_dra_device_is_handed_over_and_del_gives_it_back() {
    let node = Node::new();
    let links = node.pod_with_claim("tenant-a", "vm", &["eth1Mvp0"]);
    let link = node.add(POD_A, "net1", &conf(""));
    assert_eq!(link.index, links[0].index, "its /dev/tapN");
    assert_eq!(
        link.alias.as_deref(),
        Some(format!("macvtap-cni:{}", links[0].name).as_str()),
        "the host name is recorded for DEL"
    );
    assert!(node.kernel.link(HOST, &links[0].name).is_none());
    assert_eq!(
        node.kernel.owner_of(&format!("/dev/tap{}", link.index)),
        Some((107, 107))
    );
    // DEL has no deviceID either (Multus ran ADD without one).
    let (exit, out) = node.cni("DEL", POD_A, "net1", &conf(""));
    assert_eq!(exit, 0, "{out}");
    let back = node.kernel.link(HOST, &links[0].name).unwrap();
    assert_eq!(back.index, links[0].index);
    assert_eq!(node.kernel.links_of(POD_A), vec![]);
}

#[test]
fn two_networks_on_one_resource_get_two_devices_and_the_same_again_after_del_and_add() {
    let node = Node::new();
    let links = node.pod_with_claim("tenant-a", "vm", &["eth1Mvp3", "eth1Mvp1"]);
    let by_index = |l: &Link| l.index;
    // By device index: eth1Mvp1, then eth1Mvp3.
    let net1 = node.add(POD_A, "net1", &conf(""));
    let net2 = node.add(POD_A, "net2", &conf(""));
    assert_eq!(net1.index, by_index(&links[1]));
    assert_eq!(net2.index, by_index(&links[0]));
    // The sandbox re-created: DEL both, ADD both in a new namespace.
    for ifname in ["net1", "net2"] {
        let (exit, out) = node.cni("DEL", POD_A, ifname, &conf(""));
        assert_eq!(exit, 0, "{out}");
    }
    node.kernel.remove_netns(POD_A);
    assert_eq!(node.add(POD_B, "net1", &conf("")).index, net1.index);
    assert_eq!(node.add(POD_B, "net2", &conf("")).index, net2.index);
    // A third network finds both links in use.
    let (code, msg) = node.add_fails(POD_B, &conf(""), PodResourcesCheck::Enforce);
    assert_eq!(code, 101, "{msg}");
    assert!(
        msg.contains("in use by another network of this pod"),
        "{msg}"
    );
}

#[test]
fn two_resources_need_resource_name_and_each_network_gets_its_own() {
    let node = Node::new();
    let links = node.pod_with_claim("tenant-a", "vm", &["eth1Mvp0", "eth2Mvp0"]);
    let before = node.kernel.links_of(HOST);
    let (code, msg) = node.add_fails(POD_A, &conf(""), PodResourcesCheck::Enforce);
    assert_eq!(code, 7, "{msg}");
    assert!(
        msg.contains(&format!(
            r#"add "resourceName": "{ETH1}" or "resourceName": "{ETH2}" to the config"#
        )),
        "{msg}"
    );
    assert_eq!(node.kernel.links_of(HOST), before, "the host is untouched");
    let net1 = node.add(POD_A, "net1", &conf(&resource(ETH2)));
    let net2 = node.add(POD_A, "net2", &conf(&resource(ETH1)));
    assert_eq!((net1.index, net2.index), (links[1].index, links[0].index));
}

#[test]
fn a_bad_resource_name_is_refused_before_the_kubelet_is_asked() {
    let node = Node::new();
    node.pod_with_claim("tenant-a", "vm", &["eth1Mvp0"]);
    let before = node.kubelet().calls();
    for bad in [
        "eth1",
        "intel.com/sriov",
        "macvtap.network.kubevirt.io/../eth1",
        "macvtap.network.kubevirt.io/eth1\n[fake] log line",
    ] {
        let c = conf(&format!(r#","resourceName":{}"#, Value::from(bad)));
        let (code, msg) = node.add_fails(POD_A, &c, PodResourcesCheck::Enforce);
        assert_eq!(code, 7, "{bad:?}: {msg}");
        assert!(!msg.contains('\n'), "{msg}");
        assert!(msg.contains("is not a macvtap resource"), "{msg}");
    }
    assert_eq!(node.kubelet().calls(), before);
    assert_eq!(node.kernel.links_of(POD_A), vec![]);
}

#[test]
fn a_device_id_still_wins() {
    let node = Node::new();
    node.pod_with_claim("tenant-a", "vm", &["eth1Mvp0"]);
    let plugin = node.prepare("eth2Mvp5");
    node.kubelet()
        .add_pod("tenant-a", "vm", &[(ETH2, &["eth2Mvp5"])]);
    let link = node.add(
        POD_A,
        "net1",
        &conf(&format!(r#","deviceID":"eth2Mvp5"{}"#, resource(ETH1))),
    );
    assert_eq!(link.index, plugin.index);
    assert!(
        node.kernel
            .link(HOST, &link_name_for_device("eth1Mvp0"))
            .is_some()
    );
}

#[test]
fn another_pods_device_is_never_taken() {
    let node = Node::new();
    let theirs = node.pod_with_claim("tenant-b", "other", &["eth1Mvp0", "eth1Mvp1"]);
    // The pod holds no DRA device of ours: its namesake in another
    // namespace and the other pod do.
    node.pod_with_claim("tenant-b", "vm", &["eth1Mvp2"]);
    let (code, msg) = node.add_fails(POD_A, &conf(""), PodResourcesCheck::Enforce);
    assert_eq!(code, 100, "{msg}");
    assert!(
        msg.contains("the kubelet lists no pod tenant-a/vm"),
        "{msg}"
    );
    // The pod holds one, already in use: the others' links stay put.
    let mine = node.pod_with_claim("tenant-a", "vm", &["eth1Mvp3"]);
    node.add(POD_A, "net1", &conf(""));
    let (code, msg) = node.add_fails(POD_A, &conf(""), PodResourcesCheck::Enforce);
    assert_eq!(code, 101, "{msg}");
    assert!(msg.contains("(eth1Mvp3 ("), "{msg}");
    for l in &theirs {
        assert_eq!(node.kernel.link(HOST, &l.name).unwrap().index, l.index);
    }
    assert_eq!(
        node.kernel.link(POD_A, "net1").unwrap().index,
        mine[0].index
    );
}

#[test]
fn an_unreachable_kubelet_fails_add_in_both_modes_saying_why() {
    let node = Node::new();
    node.pod_with_claim("tenant-a", "vm", &["eth1Mvp0"]);
    let before = node.kernel.links_of(HOST);
    // The kubelet is gone: its socket with it.
    std::fs::remove_file(node.dir.path().join("pod-resources/kubelet.sock")).unwrap();
    for (check, says) in [
        (PodResourcesCheck::Enforce, "podResourcesCheck is enforce"),
        (
            PodResourcesCheck::Warn,
            "podResourcesCheck is warn, but without a deviceID there is no device to go on with",
        ),
    ] {
        let (code, msg) = node.add_fails(POD_A, &conf(""), check);
        assert_eq!(code, 11, "{msg}");
        for part in [
            "the devices pod tenant-a/vm holds through Dynamic Resource Allocation cannot be \
             looked up",
            "pod-resources/kubelet.sock cannot be reached: the socket does not exist",
            says,
        ] {
            assert!(msg.contains(part), "{part:?} in {msg}");
        }
    }
    assert_eq!(node.kernel.links_of(HOST), before);
}

#[test]
fn a_kubelet_failing_the_list_fails_add_in_warn_too() {
    let node = Node::new();
    node.pod_with_claim("tenant-a", "vm", &["eth1Mvp0"]);
    node.kubelet().fail(Some(test_kubelet::Code::Internal));
    let (code, msg) = node.add_fails(POD_A, &conf(""), PodResourcesCheck::Warn);
    assert_eq!(code, 11, "{msg}");
    assert!(msg.contains("failed the List (gRPC status 13"), "{msg}");
}

/// Rewrites the alias of `ifname` in `netns`, as a process in the pod with
/// `CAP_NET_ADMIN` can.
fn rewrite_alias(node: &Node, netns: &str, ifname: &str, alias: &str) {
    let ns = node.kernel.open_netns(std::path::Path::new(netns)).unwrap();
    let pod = node.kernel.links(Some(&ns)).unwrap();
    let link = pod.get_link(ifname).unwrap().unwrap();
    let change = macvtap_link::LinkChange {
        alias: Some(alias.to_string()),
        ..Default::default()
    };
    pod.set_link(link.index, ifname, &change).unwrap();
}

#[test]
fn del_deletes_a_link_whose_alias_names_a_device_the_pod_does_not_hold() {
    let node = Node::new();
    node.pod_with_claim("tenant-a", "vm", &["eth1Mvp0"]);
    // Another pod's device, in use in its pod (not on the host).
    let theirs = link_name_for_device("eth1Mvp1");
    node.add(POD_A, "net1", &conf(""));
    rewrite_alias(&node, POD_A, "net1", &format!("macvtap-cni:{theirs}"));
    let (exit, out) = node.cni("DEL", POD_A, "net1", &conf(""));
    assert_eq!(exit, 0, "{out}");
    assert_eq!(node.kernel.links_of(POD_A), vec![]);
    assert!(
        node.kernel.link(HOST, &theirs).is_none(),
        "not given back under the other device's name"
    );
    assert!(
        node.kernel
            .link(HOST, &link_name_for_device("eth1Mvp0"))
            .is_none(),
        "deleted: the device plugin re-creates it while the pod holds it"
    );
}

#[test]
fn del_of_a_pod_the_kubelet_no_longer_lists_deletes_the_link() {
    let node = Node::new();
    node.pod_with_claim("tenant-a", "vm", &["eth1Mvp0"]);
    node.add(POD_A, "net1", &conf(""));
    assert!(node.kubelet().remove_pod("tenant-a", "vm"));
    let (exit, out) = node.cni("DEL", POD_A, "net1", &conf(""));
    assert_eq!(exit, 0, "{out}");
    assert_eq!(node.kernel.links_of(POD_A), vec![]);
    assert!(
        node.kernel
            .link(HOST, &link_name_for_device("eth1Mvp0"))
            .is_none()
    );
}

#[test]
fn del_without_a_kubelet_deletes_in_enforce_and_gives_back_in_warn() {
    for (check, given_back) in [
        (PodResourcesCheck::Enforce, false),
        (PodResourcesCheck::Warn, true),
    ] {
        let node = Node::new();
        node.pod_with_claim("tenant-a", "vm", &["eth1Mvp0"]);
        node.add(POD_A, "net1", &conf(""));
        std::fs::remove_file(node.dir.path().join("pod-resources/kubelet.sock")).unwrap();
        let (exit, out) = node.cni_as("DEL", POD_A, "net1", &conf(""), check);
        assert_eq!(exit, 0, "{check:?}: {out}");
        assert_eq!(node.kernel.links_of(POD_A), vec![], "{check:?}");
        assert_eq!(
            node.kernel
                .link(HOST, &link_name_for_device("eth1Mvp0"))
                .is_some(),
            given_back,
            "{check:?}"
        );
    }
}

#[test]
fn check_finds_the_dra_link_without_a_device_id() {
    let node = Node::new();
    node.pod_with_claim("tenant-a", "vm", &["eth1Mvp0"]);
    let (exit, result) = node.cni("ADD", POD_A, "net1", &conf(r#","mac":"02:00:00:00:00:07""#));
    assert_eq!(exit, 0, "{result}");
    let check = conf(&format!(
        r#","mac":"02:00:00:00:00:07","prevResult":{result}"#
    ));
    let (exit, out) = node.cni("CHECK", POD_A, "net1", &check);
    assert_eq!(exit, 0, "{out}");
    // And what ADD set is what CHECK holds it to.
    node.kernel
        .links(Some(
            &node.kernel.open_netns(std::path::Path::new(POD_A)).unwrap(),
        ))
        .unwrap()
        .set_link(
            node.kernel.link(POD_A, "net1").unwrap().index,
            "net1",
            &macvtap_link::LinkChange {
                up: Some(false),
                ..Default::default()
            },
        )
        .unwrap();
    let (exit, out) = node.cni("CHECK", POD_A, "net1", &check);
    assert_eq!((exit, out["code"].as_u64()), (1, Some(106)), "{out}");
}
