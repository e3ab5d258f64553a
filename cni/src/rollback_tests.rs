//! ADD's and DEL's failure paths, driven without root against the fake
//! kernel (`test_support::fake`): every kernel call of a successful ADD or
//! DEL is failed in turn, and each test asserts what is left and the code.
//!
//! IPAM is the real `static` plugin of the reference plugins
//! (containernetworking/plugins `plugins/ipam/static`, from
//! `containernetworking-plugins`, which `hack/setup.sh` installs), run
//! through a small shell wrapper that logs each command and can fail ADD or
//! DEL with the spec's error JSON (CNI `SPEC.md`, "Error"), as a failing
//! plugin answers.

use crate::run_on;
use crate::settings::NodeSettings;
use macvtap_link::link::parse_mac;
use macvtap_link::{Kernel, Link, LinkChange, MacvtapMode, Op, link_name_for_device};
use nix::errno::Errno;
use serde_json::Value;
use std::collections::HashMap;
use test_support::fake::{FakeKernel, HOST};

pub(crate) const POD: &str = "/run/netns/pod-a";
pub(crate) const DEVICE: &str = "lower0Mvp0";
pub(crate) const MAC: &str = "02:23:45:67:89:01";

/// A node with NIC `lower0`, the device plugin's macvtap for [`DEVICE`] on
/// it, and an empty pod namespace.
pub(crate) struct Node {
    pub(crate) kernel: FakeKernel,
    /// The macvtap as the device plugin made it.
    pub(crate) orig: Link,
    ipam_dir: tempfile::TempDir,
    /// The reference plugins' directory, after `ipam_dir` in `CNI_PATH`.
    plugins: std::path::PathBuf,
}

impl Node {
    pub(crate) fn new() -> Self {
        let kernel = FakeKernel::new();
        kernel.add_netns(POD);
        let nic = kernel.add_nic(HOST, "lower0");
        let host = kernel.links(None).unwrap();
        let orig = host
            .add_macvtap_at(
                &link_name_for_device(DEVICE),
                nic.index,
                MacvtapMode::Bridge,
                None,
                None,
            )
            .unwrap();
        drop(host);
        // The reference static IPAM plugin, built from hack/peers/cni-plugins.
        let plugins = test_support::gopeers::cni_plugins_dir().unwrap();
        let static_plugin = plugins.join("static");
        let ipam_dir = tempfile::tempdir().unwrap();
        for name in ["static-logged", "static-add-fails", "static-del-fails"] {
            let path = ipam_dir.path().join(name);
            std::fs::write(
                &path,
                WRAPPER.replace("@STATIC@", &static_plugin.display().to_string()),
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Node {
            kernel,
            orig,
            ipam_dir,
            plugins,
        }
    }

    fn vars(&self, command: &str, netns: &str, container: &str) -> HashMap<String, String> {
        [
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", container.to_string()),
            ("CNI_NETNS", netns.to_string()),
            ("CNI_IFNAME", "net1".to_string()),
            (
                "CNI_PATH",
                format!(
                    "{}:{}",
                    self.ipam_dir.path().display(),
                    self.plugins.display()
                ),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Runs `command` with `conf`; returns the exit code and the parsed stdout.
    pub(crate) fn cni(&self, command: &str, conf: &str) -> (i32, Option<Value>) {
        self.cni_in(command, conf, POD, "c1")
    }

    /// [`Node::cni`] for the sandbox `container` whose namespace is `netns`.
    pub(crate) fn cni_in(
        &self,
        command: &str,
        conf: &str,
        netns: &str,
        container: &str,
    ) -> (i32, Option<Value>) {
        let vars = self.vars(command, netns, container);
        let out = run_on(
            &self.kernel,
            &NodeSettings::defaults(&vars),
            &vars,
            conf.as_bytes(),
        );
        let parsed = out
            .stdout
            .map(|s| serde_json::from_str(&s).unwrap_or_else(|e| panic!("{e}: {s}")));
        (out.exit_code, parsed)
    }

    /// Runs `command`, which must fail; returns its code and message.
    fn fails(&self, command: &str, conf: &str) -> (u64, String) {
        let (exit, out) = self.cni(command, conf);
        let out = out.expect("an error prints JSON");
        assert_eq!(exit, 1, "{command} should fail: {out}");
        (
            out["code"].as_u64().unwrap(),
            out["msg"].as_str().unwrap().to_string(),
        )
    }

    /// The IPAM commands the wrapper saw, in order.
    pub(crate) fn ipam_calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.ipam_dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Asserts ADD's rollback promise: the macvtap is in the host under its
    /// name with its ifindex, MAC and MTU, down, and nothing is in the pod.
    fn assert_rolled_back(&self, context: &str) {
        let back = self
            .kernel
            .link(HOST, &self.orig.name)
            .unwrap_or_else(|| panic!("{context}: the link is not back on the host"));
        assert_eq!(back.index, self.orig.index, "{context}: ifindex");
        assert_eq!(back.mac, self.orig.mac, "{context}: MAC");
        assert_eq!(back.mtu, self.orig.mtu, "{context}: MTU");
        assert!(!back.is_up(), "{context}: the link is up");
        assert!(!back.is_promisc(), "{context}: the link is promiscuous");
        assert_eq!(
            self.kernel.links_of(POD),
            vec![],
            "{context}: something is left in the pod"
        );
    }
}

/// Logs each command beside itself and passes it to the real `static`
/// plugin, unless its name says to fail that command with an error JSON.
const WRAPPER: &str = r#"#!/bin/sh
dir=$(dirname "$0")
echo "$CNI_COMMAND" >> "$dir/calls"
case "$(basename "$0"):$CNI_COMMAND" in
  static-add-fails:ADD|static-del-fails:DEL)
    echo '{"cniVersion":"1.0.0","code":11,"msg":"injected failure","details":"the store is busy"}'
    exit 1;;
esac
exec @STATIC@
"#;

/// The NetConf of the tests: [`DEVICE`], MTU 1400, [`MAC`], promiscuous,
/// and the `static` IPAM plugin behind wrapper `ipam` when given.
pub(crate) fn conf(ipam: Option<&str>) -> String {
    let ipam = match ipam {
        Some(t) => format!(
            r#","ipam":{{"type":"{t}","addresses":[{{"address":"192.0.2.10/24","gateway":"192.0.2.1"}}],"routes":[{{"dst":"198.51.100.0/24"}}]}}"#
        ),
        None => String::new(),
    };
    format!(
        r#"{{"cniVersion":"1.0.0","name":"n","type":"macvtap","deviceID":"{DEVICE}","mtu":1400,"mac":"{MAC}","promiscMode":true{ipam}}}"#
    )
}

/// The kernel calls of a successful ADD (with or without IPAM), from the
/// move on, each as (operation, its call number).
fn calls_from_the_move(ipam: Option<&str>) -> Vec<(Op, usize)> {
    let node = Node::new();
    let (exit, out) = node.cni("ADD", &conf(ipam));
    assert_eq!(exit, 0, "{out:?}");
    let mut seen: HashMap<Op, usize> = HashMap::new();
    let numbered: Vec<(Op, usize)> = node
        .kernel
        .calls()
        .into_iter()
        .map(|c| {
            let n = seen.entry(c.op).or_insert(0);
            *n += 1;
            (c.op, *n)
        })
        .collect();
    let first_move = numbered
        .iter()
        .position(|(op, _)| *op == Op::MoveLink)
        .expect("ADD moves the link");
    numbered[first_move..].to_vec()
}

#[test]
fn a_successful_add_configures_the_link_in_the_pod() {
    let node = Node::new();
    let (exit, out) = node.cni("ADD", &conf(Some("static-logged")));
    assert_eq!(exit, 0, "{out:?}");
    let link = node.kernel.link(POD, "net1").expect("net1 in the pod");
    assert_eq!(link.index, node.orig.index);
    assert_eq!(link.mac_string(), MAC);
    assert_eq!(
        (link.mtu, link.is_up(), link.is_promisc()),
        (1400, true, true)
    );
    assert_eq!(
        node.kernel.addrs_of(POD, "net1"),
        vec![("192.0.2.10".parse().unwrap(), 24)]
    );
    assert_eq!(
        node.kernel
            .owner_of(&format!("/dev/tap{}", node.orig.index)),
        Some((107, 107))
    );
    assert_eq!(out.unwrap()["interfaces"][0]["mac"], MAC);
}

#[test]
fn every_failure_after_the_move_rolls_add_back() {
    for ipam in [None, Some("static-logged")] {
        let steps = calls_from_the_move(ipam);
        assert!(steps.len() >= 6, "{steps:?}");
        for (op, nth) in steps {
            let node = Node::new();
            node.kernel.fail(op, nth, Errno::EIO);
            let context = format!("{op:?} call {nth} failing (IPAM {ipam:?})");
            let (code, msg) = node.fails("ADD", &conf(ipam));
            let want = if op == Op::Sysctl { 5 } else { 104 };
            assert_eq!(code, want, "{context}: {msg}");
            assert!(
                msg.contains("(EIO)") || msg.contains("I/O error"),
                "{context}: {msg}"
            );
            node.assert_rolled_back(&context);
            // IPAM is released exactly when its ADD had succeeded.
            let calls = node.ipam_calls();
            if calls.first().map(String::as_str) == Some("ADD") {
                assert_eq!(calls, ["ADD", "DEL"], "{context}");
            } else {
                assert_eq!(calls, Vec::<String>::new(), "{context}");
            }
        }
    }
}

#[test]
fn a_failed_move_leaves_the_link_on_the_host() {
    let node = Node::new();
    node.kernel.fail(Op::MoveLink, 1, Errno::EIO);
    let (code, _) = node.fails("ADD", &conf(None));
    assert_eq!(code, 104);
    node.assert_rolled_back("move failed");
    assert_eq!(node.kernel.count(Op::MoveLink), 1, "nothing to move back");
}

#[test]
fn a_taken_ifindex_in_the_pod_is_refused_with_code_105() {
    let node = Node::new();
    node.kernel.insert_link(
        POD,
        Link {
            index: node.orig.index,
            name: "blk0".into(),
            kind: Some("veth".into()),
            ..Default::default()
        },
    );
    let (code, msg) = node.fails("ADD", &conf(None));
    assert_eq!(code, 105, "{msg}");
    assert!(
        msg.contains(&format!("/dev/tap{}", node.orig.index)),
        "{msg}"
    );
    assert!(node.kernel.link(HOST, &node.orig.name).is_some());
}

/// Kernels before 5.13 ignore `IFLA_NEW_IFINDEX`: the macvtap gets a new
/// index in the pod, ADD notices and rolls back. The rollback must act on
/// the macvtap, not on the pod's link that owns the original index.
#[test]
fn a_stale_ifindex_rollback_leaves_the_pods_other_link_alone() {
    let node = Node::new();
    node.kernel.ignore_new_ifindex();
    let blocker = node.kernel.insert_link(
        POD,
        Link {
            index: node.orig.index,
            name: "blk0".into(),
            kind: Some("veth".into()),
            mac: parse_mac("02:00:00:00:bb:01"),
            mtu: 9000,
            flags: nix::libc::IFF_UP as u32,
            ..Default::default()
        },
    );
    let (code, msg) = node.fails("ADD", &conf(None));
    assert_eq!(code, 105, "{msg}");
    assert!(msg.contains("no longer names it"), "{msg}");
    // The pod's own link is exactly as it was, and still in the pod.
    assert_eq!(node.kernel.links_of(POD), vec![blocker]);
    // The macvtap came back with another index (this kernel ignores the one
    // asked for), so /dev/tapN no longer names it: it is deleted.
    assert_eq!(node.kernel.link(HOST, &node.orig.name), None);
    assert_eq!(node.kernel.links_of(HOST).len(), 1, "only lower0 is left");
}

#[test]
fn a_half_done_move_is_moved_back() {
    let node = Node::new();
    node.kernel.move_then_rename();
    let other = node.kernel.insert_link(
        POD,
        Link {
            name: "net1".into(),
            kind: Some("veth".into()),
            ..Default::default()
        },
    );
    let (code, msg) = node.fails("ADD", &conf(None));
    assert_eq!(code, 7, "{msg}");
    assert!(
        msg.contains("an interface named net1 already exists"),
        "{msg}"
    );
    assert!(node.kernel.link(HOST, &node.orig.name).is_some());
    assert_eq!(node.kernel.links_of(POD), vec![other]);
    assert_eq!(node.kernel.count(Op::MoveLink), 2, "moved in, then back");
}

#[test]
fn a_mac_another_macvtap_uses_is_named_as_such() {
    let node = Node::new();
    let host = node.kernel.links(None).unwrap();
    let sibling = host
        .add_macvtap_at(
            "mvtsibling0000",
            node.orig.lower_index.unwrap(),
            MacvtapMode::Bridge,
            None,
            None,
        )
        .unwrap();
    let taken = LinkChange {
        mac: parse_mac(MAC),
        ..Default::default()
    };
    host.set_link(sibling.index, &sibling.name, &taken).unwrap();
    drop(host);
    let (code, msg) = node.fails("ADD", &conf(None));
    assert_eq!(code, 104);
    assert!(
        msg.starts_with(&format!(
            "setting MAC {MAC} on net1: another macvtap on lower0 already uses this MAC \
             (EADDRINUSE)"
        )),
        "{msg}"
    );
    assert!(
        !msg.contains("LinkChange") && !msg.contains("Some("),
        "{msg}"
    );
    node.assert_rolled_back("MAC taken");
}

#[test]
fn a_failing_rollback_says_both_and_gets_code_107() {
    let node = Node::new();
    node.kernel.fail(Op::ChownTapNode, 1, Errno::EPERM);
    node.kernel.fail(Op::MoveLink, 2, Errno::ENOMEM);
    let (code, msg) = node.fails("ADD", &conf(None));
    assert_eq!(code, 107, "{msg}");
    assert!(msg.contains("giving it to 107:107"), "{msg}");
    assert!(
        msg.contains("rolling back also failed: moving link net1"),
        "{msg}"
    );
}

#[test]
fn a_failing_ipam_add_is_rolled_back_with_its_code() {
    let node = Node::new();
    let (code, msg) = node.fails("ADD", &conf(Some("static-add-fails")));
    // The plugin's own code 11 (try again) is passed on.
    assert_eq!(code, 11, "{msg}");
    assert!(msg.contains("injected failure: the store is busy"), "{msg}");
    node.assert_rolled_back("IPAM ADD failed");
    assert_eq!(node.ipam_calls(), ["ADD"]);
}

#[test]
fn a_failing_ipam_del_in_the_rollback_is_reported() {
    let node = Node::new();
    node.kernel.fail(Op::AddRoute, 1, Errno::ENETUNREACH);
    let (code, msg) = node.fails("ADD", &conf(Some("static-del-fails")));
    assert_eq!(code, 107, "{msg}");
    assert!(
        msg.contains("the gateway is not reachable through the link's addresses (ENETUNREACH)"),
        "{msg}"
    );
    assert!(msg.contains("releasing IPAM"), "{msg}");
    node.assert_rolled_back("IPAM DEL failed");
}

#[test]
fn a_transient_failure_is_try_again_after_a_clean_rollback() {
    let node = Node::new();
    node.kernel.fail(Op::SetLink, 1, Errno::ENOBUFS);
    let (code, _) = node.fails("ADD", &conf(None));
    assert_eq!(code, 11);
    node.assert_rolled_back("ENOBUFS");
}

/// What DEL promises: the link is back on the host under its name and
/// index, down, or it is gone; never half-way.
fn assert_del_outcome(node: &Node, context: &str, succeeded: bool) {
    let in_pod = node.kernel.link(POD, "net1");
    let on_host = node.kernel.link(HOST, &node.orig.name);
    if let Some(back) = &on_host {
        assert_eq!(back.index, node.orig.index, "{context}");
        assert!(!back.is_up() && !back.is_promisc(), "{context}");
        assert_ne!(back.mac_string(), MAC, "{context}: the pod's MAC stays");
    }
    assert!(
        node.kernel
            .links_of(HOST)
            .iter()
            .all(|l| l.name == "lower0" || l.name == node.orig.name),
        "{context}: a stray link on the host"
    );
    if succeeded {
        assert_eq!(in_pod, None, "{context}");
    } else {
        assert!(
            in_pod.is_none() || on_host.is_none(),
            "{context}: in two places"
        );
    }
}

#[test]
fn del_gives_the_link_back_with_its_index() {
    let node = Node::new();
    assert_eq!(node.cni("ADD", &conf(None)).0, 0);
    assert_eq!(node.cni("DEL", &conf(None)), (0, None));
    assert_del_outcome(&node, "DEL", true);
    let back = node.kernel.link(HOST, &node.orig.name).expect("given back");
    assert_eq!(node.cni("DEL", &conf(None)), (0, None), "twice");
    // The second DEL leaves the given-back link as it is.
    assert_eq!(
        node.kernel.link(HOST, &node.orig.name),
        Some(back.clone()),
        "twice"
    );
    assert_del_outcome(&node, "DEL twice", true);
    node.kernel.remove_netns(POD);
    assert_eq!(node.cni("DEL", &conf(None)), (0, None), "namespace gone");
    assert_eq!(
        node.kernel.link(HOST, &node.orig.name),
        Some(back),
        "namespace gone"
    );
}

#[test]
fn every_failure_in_del_keeps_its_promise() {
    let probe = Node::new();
    assert_eq!(probe.cni("ADD", &conf(None)).0, 0);
    let before = probe.kernel.calls().len();
    assert_eq!(probe.cni("DEL", &conf(None)).0, 0);
    let mut seen: HashMap<Op, usize> = HashMap::new();
    let steps: Vec<(Op, usize)> = probe
        .kernel
        .calls()
        .into_iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let n = seen.entry(c.op).or_insert(0);
            *n += 1;
            (i >= before).then_some((c.op, *n))
        })
        .collect();
    assert!(steps.len() >= 5, "{steps:?}");
    for (op, nth) in steps {
        let node = Node::new();
        assert_eq!(node.cni("ADD", &conf(None)).0, 0);
        node.kernel.fail(op, nth, Errno::EIO);
        let context = format!("DEL with {op:?} call {nth} failing");
        let (exit, out) = node.cni("DEL", &conf(None));
        if exit != 0 {
            let out = out.unwrap();
            assert_eq!(out["code"], 104, "{context}: {out}");
        }
        assert_del_outcome(&node, &context, exit == 0);
    }
}

#[test]
fn del_deletes_the_link_when_its_ifindex_is_taken_on_the_host() {
    let node = Node::new();
    assert_eq!(node.cni("ADD", &conf(None)).0, 0);
    let squatter = node.kernel.insert_link(
        HOST,
        Link {
            index: node.orig.index,
            name: "squat0".into(),
            kind: Some("veth".into()),
            ..Default::default()
        },
    );
    assert_eq!(node.cni("DEL", &conf(None)), (0, None));
    assert_eq!(node.kernel.links_of(POD), vec![]);
    assert_eq!(node.kernel.link(HOST, "squat0"), Some(squatter));
    assert_eq!(node.kernel.link(HOST, &node.orig.name), None);
}

#[test]
fn link_messages_carry_no_debug_dumps() {
    for (op, errno) in [
        (Op::SetLink, Errno::EINVAL),
        (Op::MoveLink, Errno::EPERM),
        (Op::TapDevice, Errno::ENOENT),
        (Op::OpenTapNode, Errno::ENOENT),
    ] {
        let node = Node::new();
        node.kernel.fail(op, 1, errno);
        let (_, msg) = node.fails("ADD", &conf(None));
        for dump in ["LinkChange", "Some(", "None", "{ ", "[2, "] {
            assert!(!msg.contains(dump), "{op:?}: {msg}");
        }
    }
    let node = Node::new();
    node.kernel.fail(Op::SetLink, 1, Errno::EINVAL);
    let (code, msg) = node.fails("ADD", &conf(None));
    assert_eq!(code, 104);
    assert!(
        msg.starts_with(&format!(
            "setting MTU 1400, MAC {MAC}, promiscuous mode on, alias macvtap-cni:{} and state \
             up on net1 in {POD}: the kernel refused a value",
            link_name_for_device(DEVICE)
        )),
        "{msg}"
    );
}
