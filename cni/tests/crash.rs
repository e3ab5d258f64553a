//! The real plugin killed with SIGKILL right after a link change, on real
//! netlink with real namespaces, then the runtime's next steps: DEL with the
//! same arguments, the old namespace removed, ADD into a new namespace (as
//! containerd takes them after a failed sandbox; `cni/src/crash_tests.rs`
//! covers every kernel call on the fake kernel, this confirms a sample).
//! strace lands the kill (`common::kill`): a dry run counts the plugin's
//! netlink answers up to the chosen change, the killed run is checked to
//! have stopped right there, and the kernel state shows that change as the
//! last that took effect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::dhcp::wait_until;
use common::kill::run_traced;
use common::*;
use serde_json::{Value, json};
use test_support::{TestNs, sh};

const DEVICE: &str = "lower0Mvp3";
const MAC: &str = "02:23:45:67:89:0a";

fn conf() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "dataplane",
        "type": "macvtap",
        "deviceID": DEVICE,
        "mac": MAC,
        "mtu": 1400,
        "promiscMode": true,
    })
}

/// Where the plugin dies: after the `setlink`-th link change of `command`.
struct Point {
    command: &'static str,
    setlink: usize,
    what: &'static str,
}

/// What a link looks like, from `ip -d -j link show`.
struct Seen {
    index: u64,
    up: bool,
    promisc: bool,
    mac: String,
    alias: Option<String>,
}

fn seen(link: &Value) -> Seen {
    let flags = link["flags"].as_array().unwrap();
    Seen {
        index: link["ifindex"].as_u64().unwrap(),
        up: flags.iter().any(|f| f == "UP"),
        promisc: link["promiscuity"].as_u64().unwrap_or(0) > 0,
        mac: link["address"].as_str().unwrap().to_string(),
        alias: link["ifalias"].as_str().map(str::to_string),
    }
}

/// Owner of `/dev/tap<index>`.
fn tap_owner(index: u32) -> Option<(u32, u32)> {
    node_owner(&format!("/dev/tap{index}"))
}

/// Asserts the kernel state right after `point`'s change, and that the
/// step after it did not happen.
fn assert_state_after(sb: &Sandbox, point: &Point, index: u32) {
    let host_name = macvtap_link::link_name_for_device(DEVICE);
    let ctx = point.what;
    let in_pod = sb.link(&sb.pod, "net1").map(|l| seen(&l));
    let on_host = sb.link(&sb.node, &host_name).map(|l| seen(&l));
    match (point.command, point.setlink) {
        ("ADD", 1) => {
            // Moved and renamed (one request), nothing configured yet.
            let l = in_pod.expect(ctx);
            assert!(on_host.is_none(), "{ctx}");
            assert_eq!(l.index, u64::from(index), "{ctx}");
            assert!(!l.up && !l.promisc, "{ctx}");
            assert_ne!(l.mac, MAC, "{ctx}");
            assert_eq!(l.alias, None, "{ctx}");
            // The next step, silencing IPv6, did not run.
            let v6 = sh(&[
                "ip",
                "netns",
                "exec",
                &sb.pod.name,
                "cat",
                "/proc/sys/net/ipv6/conf/net1/disable_ipv6",
            ])
            .unwrap();
            assert_eq!(v6.trim(), "0", "{ctx}");
        }
        ("ADD", 2) => {
            let l = in_pod.expect(ctx);
            assert!(l.up && l.promisc, "{ctx}");
            assert_eq!(l.mac, MAC, "{ctx}");
            assert_eq!(
                l.alias.as_deref(),
                Some(format!("macvtap-cni:{host_name}").as_str()),
                "{ctx}"
            );
            // The next step, giving /dev/tapN to the VM user, did not run.
            assert_eq!(tap_owner(index), Some((0, 0)), "{ctx}");
        }
        ("DEL", 1) => {
            let l = in_pod.expect(ctx);
            assert!(!l.up && !l.promisc, "{ctx}");
            assert_eq!(l.mac, MAC, "{ctx}: the next step, a fresh MAC, ran");
        }
        ("DEL", 2) => {
            let l = in_pod.expect(ctx);
            assert!(!l.up, "{ctx}");
            assert_ne!(l.mac, MAC, "{ctx}");
            assert!(on_host.is_none(), "{ctx}: the next step, the move, ran");
        }
        ("DEL", 3) => {
            assert!(in_pod.is_none(), "{ctx}");
            let l = on_host.expect(ctx);
            assert_eq!(l.index, u64::from(index), "{ctx}");
            assert!(!l.up && !l.promisc, "{ctx}");
            assert_ne!(l.mac, MAC, "{ctx}");
        }
        _ => unreachable!(),
    }
}

/// The number of the `recvfrom` to kill `command` at, right after its
/// `setlink`-th link change: from a dry run of `command`, traced, in a fresh
/// sandbox that `prepare` brought to the state the killed run starts from.
fn kill_point(prepare: &dyn Fn(&Sandbox) -> u32, command: &str, setlink: usize) -> usize {
    let dry = Sandbox::new();
    prepare(&dry);
    let traced = run_traced(
        &dry.node.name,
        &dry.cni_env(command, &[]),
        conf().to_string().as_bytes(),
        None,
    );
    traced.run.ok();
    assert!(traced.setlinks() >= setlink, "{command}:\n{}", traced.log);
    traced.recv_after_setlink(setlink)
}

/// Runs `command` in `sb`, killed on entry of its `kill_at`-th `recvfrom`,
/// and asserts that it died right after its `setlink`-th link change.
fn run_killed(sb: &Sandbox, command: &str, kill_at: usize, setlink: usize) {
    let traced = run_traced(
        &sb.node.name,
        &sb.cni_env(command, &[]),
        conf().to_string().as_bytes(),
        Some(kill_at),
    );
    traced.assert_killed_after_setlink(setlink);
}

/// The device's link made as the device plugin's Allocate makes it.
fn allocated(sb: &Sandbox) -> u32 {
    sb.allocate(DEVICE)
}

/// The device's link allocated and handed to the pod by a good ADD.
fn added(sb: &Sandbox) -> u32 {
    let index = sb.allocate(DEVICE);
    sb.cni("ADD", &conf(), &[]).ok();
    index
}

/// Runs ADD in a new sandbox (new namespace and container ID) and asserts
/// it has the device's link with the ifindex the kubelet handed out, and
/// that only `lo` and the NIC are on the node, both up as before.
fn add_in_a_new_sandbox(sb: &Sandbox, index: u32, ctx: &str) -> TestNs {
    let pod2 = TestNs::new("pod2").unwrap();
    let path = pod2.path();
    let result = sb
        .cni(
            "ADD",
            &conf(),
            &[("CNI_NETNS", &path), ("CNI_CONTAINERID", "ctr-new")],
        )
        .ok()
        .json();
    assert_eq!(result["interfaces"][0]["sandbox"], path.as_str(), "{ctx}");
    let link = seen(&pod2.link_json("net1").unwrap().expect(ctx));
    assert_eq!(link.index, u64::from(index), "{ctx}: /dev/tapN changed");
    assert!(link.up && link.promisc, "{ctx}");
    assert_eq!(link.mac, MAC, "{ctx}");
    assert_eq!(tap_owner(index), Some((107, 107)), "{ctx}");
    // Nothing is left on the node: no macvtap, nothing up but its NIC.
    let node: Vec<(String, bool)> = sb
        .node
        .links_json()
        .unwrap()
        .iter()
        .map(|l| (l["ifname"].as_str().unwrap().to_string(), seen(l).up))
        .collect();
    assert_eq!(
        node,
        [("lo".to_string(), true), ("lower0".to_string(), true)],
        "{ctx}: the node's links"
    );
    pod2
}

#[test]
fn a_cni_killed_after_a_link_change_is_cleared_by_del_and_a_new_add() {
    let points = [
        Point {
            command: "ADD",
            setlink: 1,
            what: "ADD killed after the move into the pod (and rename, one request)",
        },
        Point {
            command: "ADD",
            setlink: 2,
            what: "ADD killed after setting MAC, MTU, state and alias",
        },
        Point {
            command: "DEL",
            setlink: 1,
            what: "DEL killed after taking the link down",
        },
        Point {
            command: "DEL",
            setlink: 2,
            what: "DEL killed after the fresh MAC",
        },
        Point {
            command: "DEL",
            setlink: 3,
            what: "DEL killed after the move back to the host",
        },
    ];
    for point in &points {
        let ctx = point.what;
        let prepare: &dyn Fn(&Sandbox) -> u32 = match point.command {
            "ADD" => &allocated,
            _ => &added,
        };
        let kill_at = kill_point(prepare, point.command, point.setlink);
        let sb = Sandbox::new();
        let index = prepare(&sb);
        run_killed(&sb, point.command, kill_at, point.setlink);
        assert_state_after(&sb, point, index);

        // The runtime's next steps. DEL with the same arguments (a killed
        // DEL is retried by the next StopPodSandbox).
        sb.cni("DEL", &conf(), &[]).ok();
        let left: Vec<String> = sb.pod.links().unwrap();
        assert_eq!(left, ["lo"], "{ctx}: left in the namespace about to go");
        sh(&["ip", "netns", "del", &sb.pod.name]).unwrap();
        let pod2 = add_in_a_new_sandbox(&sb, index, ctx);
        pod2.delete_macvtaps().unwrap();
    }
}

/// What the fake kernel models, on the real one: a namespace removed with
/// the macvtap in it destroys the macvtap and its `/dev/tapN`. containerd
/// does that after a failed ADD whose DEL failed too, here an ADD killed
/// after its move and a DEL killed before its move back. The pod still
/// holds the device: its new sandbox's ADD fails with 101 naming it, until
/// the device plugin makes the link again at the ifindex handed out.
#[test]
fn a_namespace_removed_with_the_link_in_it_loses_it_until_the_device_plugin_heals() {
    let add_kill = kill_point(&allocated, "ADD", 1);
    let killed_add = move |sb: &Sandbox| {
        let index = allocated(sb);
        run_killed(sb, "ADD", add_kill, 1);
        index
    };
    // After DEL's second link change (the fresh MAC), before its move back.
    let del_kill = kill_point(&killed_add, "DEL", 2);
    let sb = Sandbox::new();
    let index = killed_add(&sb);
    run_killed(&sb, "DEL", del_kill, 2);
    assert!(sb.link(&sb.pod, "net1").is_some(), "the link is in the pod");
    let tap = format!("/dev/tap{index}");
    assert!(std::path::Path::new(&tap).exists());

    sh(&["ip", "netns", "del", &sb.pod.name]).unwrap();
    // The kernel destroys a dead namespace's links in the background.
    wait_until(&format!("{tap} to vanish with the namespace"), || {
        !std::path::Path::new(&tap).exists()
    });
    let name = macvtap_link::link_name_for_device(DEVICE);
    assert!(
        sb.link(&sb.node, &name).is_none(),
        "not given back to the host"
    );

    let pod2 = TestNs::new("pod2").unwrap();
    let path = pod2.path();
    let msg = sb
        .cni(
            "ADD",
            &conf(),
            &[("CNI_NETNS", &path), ("CNI_CONTAINERID", "ctr-new")],
        )
        .fails_with(101);
    assert!(msg.contains(DEVICE), "{msg}");
    drop(pod2);

    // The device plugin's heal: the link again, at the ifindex handed out.
    sb.allocate_at(DEVICE, index);
    let pod2 = add_in_a_new_sandbox(&sb, index, "after the heal");
    pod2.delete_macvtaps().unwrap();
}
