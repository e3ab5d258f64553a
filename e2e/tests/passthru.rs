//! A VM on a passthru macvtap, end to end (issue 27): the real device plugin
//! serves a passthru resource (one device whatever its capacity says), the
//! kubelet allocates it, the real Multus runs our CNI with the VM's MAC,
//! QEMU (as uid 107, on the Allocate response's `/dev/tapN`) boots the
//! guest, and the peer host across the veth sees the guest's MAC, which a
//! passthru macvtap makes the NIC's own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use anyhow::{Context, Result, ensure};
use macvtap_e2e::guest::{self, Guest};
use macvtap_e2e::multus::{Multus, Pod, kubevirt_pod_ifname};
use macvtap_e2e::node::{self, FAST_RECLAIM, GUEST_IP, Node, PEER_IP};
use macvtap_e2e::sandbox::TestNs;
use macvtap_e2e::steps::Steps;
use macvtap_e2e::vm::{GuestNet, QEMU_UID, run_qemu};
use macvtap_link::link::format_mac;
use macvtap_link::{MacvtapMode, link_name_for_device};
use serde_json::json;
use std::path::Path;

const VM_MAC: &str = "52:54:00:c0:ff:ee";
/// The configuration a new user writes: capacity 4 on a passthru NIC.
const CONF: &str = r#"[{"name":"pt","lowerDevice":"lower0","mode":"passthru","capacity":4}]"#;
const RESOURCE: &str = "macvtap.network.kubevirt.io/pt";

fn guest() -> Guest {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-guest");
    guest::build(&cache)
        .expect("building the guest (apt-get install busybox-static; apt-get update)")
}

/// The MAC of `ifname` in `ns`, as `ip` prints it.
fn mac_of(ns: &TestNs, ifname: &str) -> Result<String> {
    let v = ns
        .link_json(ifname)?
        .with_context(|| format!("no link {ifname}"))?;
    Ok(v["address"].as_str().unwrap_or_default().to_string())
}

/// The peer's neighbour entry for the guest's address: its MAC, if any.
fn peer_neighbour(node: &Node) -> Result<Option<String>> {
    let guest_ip = GUEST_IP.split('/').next().unwrap_or(GUEST_IP);
    let out = node
        .peer
        .ip(&["-j", "neigh", "show", "to", guest_ip, "dev", "peer0"])?;
    let v: serde_json::Value =
        serde_json::from_str(if out.trim().is_empty() { "[]" } else { &out })?;
    Ok(v.as_array()
        .and_then(|a| a.first())
        .and_then(|n| n["lladdr"].as_str())
        .map(String::from))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_on_a_passthru_macvtap_gives_the_nic_its_mac_and_pings_the_peer() -> Result<()> {
    let mut steps = Steps::new();
    steps.step("sandbox node, test kubelet, device plugin with a passthru resource of capacity 4");
    let mut node = Node::new()?;
    let taps_before = node::tap_nodes();
    node.start_kubelet().await?;
    node.start_pod_resources().await?;
    let dp = node.start_device_plugin(CONF, &FAST_RECLAIM)?;
    // One device, whatever the capacity says (Node::plugin waits for exactly 1).
    let mut client = node.plugin("pt", 1).await?;
    let log = node.daemon_log();
    ensure!(
        log.contains("capacity 4 is impossible in passthru mode") && log.contains("advertising 1"),
        "no warning naming the entry:\n{log}"
    );
    let multus = Multus::start(&node)?;
    let guest = guest();
    let nic_mac = mac_of(&node.ns, "lower0")?;

    steps.step("kubelet Allocate of the one device for the VM pod (its VM sets macAddress)");
    let pod = Pod {
        namespace: "default".into(),
        name: "virt-launcher-vm-pt-x7k2p".into(),
        uid: "0b5e0000-5c1d-4c39-9d55-3f0d2a7e61ab".into(),
        networks: json!([{"name": "pt", "namespace": "default",
                          "interface": kubevirt_pod_ifname("pt"), "mac": VM_MAC}]),
    };
    let alloc = Node::allocate(&mut client, "ptMvp0").await?;
    node.hold_pod(&pod.namespace, &pod.name, RESOURCE, &["ptMvp0"])?;
    let link_name = link_name_for_device("ptMvp0");
    let link = node
        .ns
        .link(&link_name)?
        .context("Allocate made no macvtap")?;
    ensure!(
        link.macvtap_mode == Some(MacvtapMode::Passthru),
        "mode {:?}",
        link.macvtap_mode
    );
    // A passthru macvtap starts with the NIC's MAC.
    ensure!(
        link.mac.map(|m| format_mac(&m)).as_deref() == Some(nic_mac.as_str()),
        "macvtap MAC {:?}, NIC MAC {nic_mac}",
        link.mac
    );
    steps.say(format!(
        "{} -> {}, NIC MAC {nic_mac}",
        alloc.device_id,
        alloc.host_path.display()
    ));

    steps.step("Multus ADD with the VM's MAC: the passthru macvtap gives it to the NIC");
    multus.add_nad(
        "default",
        "pt",
        Some(RESOURCE),
        r#"{"cniVersion":"0.3.1","name":"pt","type":"macvtap","mtu":1500}"#,
    );
    multus.add_pod(&pod);
    let netns = TestNs::new("pod")?;
    let add = multus.run("ADD", &pod, &netns)?;
    ensure!(
        add.ok,
        "Multus ADD failed: {} {}\n{}",
        add.json,
        add.stderr,
        multus.log()
    );
    let ifname = kubevirt_pod_ifname("pt");
    ensure!(
        mac_of(&netns, &ifname)? == VM_MAC,
        "pod link MAC is not the VM's"
    );
    let nic_now = mac_of(&node.ns, "lower0")?;
    ensure!(
        nic_now == VM_MAC,
        "the NIC's MAC is {nic_now}, not the VM's {VM_MAC}"
    );
    steps.say(format!("lower0 MAC now {nic_now}"));

    steps.step("QEMU as uid 107 on the tap: the guest pings the peer, the peer sees the VM's MAC");
    ensure!(
        peer_neighbour(&node)?.is_none(),
        "the peer knew the guest before it ran"
    );
    let work = tempfile::tempdir()?;
    let net = GuestNet {
        mac: VM_MAC.into(),
        ip: GUEST_IP.into(),
        peer: PEER_IP.into(),
        tries: 20,
    };
    let run = tokio::task::block_in_place(|| {
        run_qemu(&netns.name, &alloc.host_path, &guest, &net, work.path())
    })?;
    steps.say(run.markers());
    ensure!(
        run.ping_ok,
        "the guest could not ping {PEER_IP}:\n{}",
        run.console
    );
    ensure!(
        run.tap_holders
            .iter()
            .any(|h| h.uid == QEMU_UID && h.gid == QEMU_UID),
        "the tap was not held by uid {QEMU_UID}: {:?}",
        run.tap_holders
    );
    // The peer answered the guest's ARP and echo requests: it learned the
    // guest's address at the VM's MAC from frames the guest sent.
    let seen = peer_neighbour(&node)?;
    ensure!(
        seen.as_deref() == Some(VM_MAC),
        "the peer's neighbour entry for the guest is {seen:?}, not {VM_MAC}"
    );
    steps.say(format!("peer0 neighbour of the guest: lladdr {VM_MAC}"));

    steps.step("teardown: Multus DEL, pod gone, device freed, link reclaimed, daemon stopped");
    let del = multus.run("DEL", &pod, &netns)?;
    ensure!(del.ok, "Multus DEL failed: {} {}", del.json, del.stderr);
    node.returned_link("ptMvp0", alloc.ifindex()?)?;
    drop(netns);
    node.hold(RESOURCE, &[])?;
    node.wait_for_reclaim()?;
    node.stop_device_plugin()?;
    node::nothing_left(&node, &taps_before, &[dp])?;
    println!("\n{}", steps.summary());
    Ok(())
}
