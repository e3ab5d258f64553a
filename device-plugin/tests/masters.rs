//! NICs that a master owns (issue 17): auto-discovery, health and Allocate
//! for every layout this kernel can build, each on a fresh node namespace
//! with veth pairs as NICs. Needs root; without it every test here fails
//! with "NOT RUN".
//!
//! This kernel builds Linux bridges only (`CONFIG_BONDING`, `CONFIG_NET_TEAM`,
//! `CONFIG_NET_VRF` and `CONFIG_OPENVSWITCH` are off and modules are not
//! supported), so bonds, teams, VRFs and OVS are covered by the unit tests
//! of `discovery.rs` and `health.rs` on link lists as the kernel reports them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{DEADLINE, Node, TestNs, metrics_get, require_root, wait_log};
use kubelet_proto::v1beta1::Device;
use macvtap_deviceplugin::config::ResourceConfig;
use macvtap_deviceplugin::core::host::Host;
use macvtap_deviceplugin::core::link::create_device;
use macvtap_link::{Links, Linux, Netns, link_name_for_device};
use std::collections::BTreeSet;
use test_kubelet::ResourceView;

const PREFIX: &str = "macvtap.network.kubevirt.io/";
const DP: &str = "macvtap.network.kubevirt.io/dp";
const DP_SOCKET: &str = "macvtap.network.kubevirt.io_dp";
const ENSLAVED_ETH1: &str = "eth1 is a port of bridge br0, and a macvtap needs a NIC that no \
                             bridge, bond or OVS owns; use br0 as lowerDevice";

fn res(name: &str) -> String {
    format!("{PREFIX}{name}")
}

fn all_healthy(d: &[Device]) -> bool {
    !d.is_empty() && d.iter().all(|d| d.health == "Healthy")
}

fn all_unhealthy(d: &[Device]) -> bool {
    !d.is_empty() && d.iter().all(|d| d.health == "Unhealthy")
}

fn serving_healthy(v: &ResourceView) -> bool {
    v.connected && all_healthy(&v.devices)
}

/// Adds bridge `name`, up.
fn add_bridge(ns: &TestNs, name: &str) {
    ns.ip(&["link", "add", name, "type", "bridge"]).unwrap();
    ns.ip(&["link", "set", name, "up"]).unwrap();
}

fn lines_with(log: &str, what: &str) -> usize {
    log.lines().filter(|l| l.contains(what)).count()
}

/// Allocates `<name>Mvp0` through the kubelet and checks that its macvtap
/// sits on link `lower`.
async fn allocate_on(node: &Node, name: &str, lower: &str) {
    let id = format!("{name}Mvp0");
    let resp = node
        .kubelet()
        .allocate(&res(name), &[&id])
        .await
        .unwrap_or_else(|e| panic!("Allocate of {id}: {e}"));
    let link = node
        .ns
        .link(&link_name_for_device(&id))
        .unwrap()
        .expect("the device's macvtap exists");
    assert!(link.is_macvtap());
    assert_eq!(
        link.lower_index,
        Some(node.ns.link(lower).unwrap().unwrap().index)
    );
    assert_eq!(
        resp.container_responses[0].devices[0].host_path,
        format!("/dev/tap{}", link.index)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_advertises_a_bridge_in_place_of_its_port_and_every_advertised_device_allocates()
{
    // Layout: eth1 a plain NIC; eth2 a port of bridge br0; brempty a bridge
    // without ports. veth counts as a NIC here, so the peers eth1p and
    // eth2p (plain NICs too) are advertised as well.
    let mut node = Node::new("brdisc");
    node.ns.add_nic("eth2").unwrap();
    add_bridge(&node.ns, "br0");
    add_bridge(&node.ns, "brempty");
    node.ns
        .ip(&["link", "set", "eth2", "master", "br0"])
        .unwrap();
    node.start_kubelet().await;
    node.start_daemon(&["--discover-kinds", "veth"], &[]);

    let advertised = ["eth1", "eth1p", "eth2p", "br0"];
    for name in advertised {
        node.kubelet()
            .wait_resource(&res(name), DEADLINE, serving_healthy)
            .await
            .unwrap();
    }
    let log = wait_log(&mut node, "left-out message for eth2", |l| {
        l.contains("auto-discovery leaves eth2 out: eth2 is a port of bridge br0")
    })
    .await;
    assert!(
        log.contains("br0 is advertised in its place"),
        "the message says what replaces eth2:\n{log}"
    );
    // Discovery decides all of this from one link list: by the time the
    // advertised resources are registered and eth2's exclusion is logged,
    // nothing else is coming.
    let registered: BTreeSet<String> = node
        .kubelet()
        .registrations()
        .into_iter()
        .map(|r| r.resource_name)
        .collect();
    let want: BTreeSet<String> = advertised.iter().map(|n| res(n)).collect();
    assert_eq!(registered, want);

    // Every advertised device can be allocated, br0's on the bridge.
    for (name, lower) in [
        ("eth1", "eth1"),
        ("eth1p", "eth1p"),
        ("eth2p", "eth2p"),
        ("br0", "br0"),
    ] {
        allocate_on(&node, name, lower).await;
    }

    // Link events that change nothing about eth2 do not repeat its message:
    // eth1 down and up again, awaited through its devices' health.
    node.ns.ip(&["link", "set", "eth1", "down"]).unwrap();
    node.kubelet()
        .wait_resource(&res("eth1"), DEADLINE, |v| all_unhealthy(&v.devices))
        .await
        .unwrap();
    node.ns.ip(&["link", "set", "eth1", "up"]).unwrap();
    node.kubelet()
        .wait_resource(&res("eth1"), DEADLINE, serving_healthy)
        .await
        .unwrap();
    let log = node.daemon().log();
    assert_eq!(
        lines_with(&log, "auto-discovery leaves eth2 out"),
        1,
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_follows_a_nic_into_a_bridge_and_out_again() {
    let mut node = Node::new("brfollow");
    node.start_kubelet().await;
    node.start_daemon(&["--discover-kinds", "veth"], &[]);
    let eth1 = res("eth1");
    let br0 = res("br0");
    let k = node.kubelet();
    k.wait_resource(&eth1, DEADLINE, serving_healthy)
        .await
        .unwrap();

    add_bridge(&node.ns, "br0");
    node.ns
        .ip(&["link", "set", "eth1", "master", "br0"])
        .unwrap();
    // eth1 keeps its resource (pods may hold its devices), Unhealthy; the
    // bridge is advertised in its place and its devices allocate.
    k.wait_resource(&eth1, DEADLINE, |v| {
        v.connected && all_unhealthy(&v.devices)
    })
    .await
    .unwrap();
    k.wait_resource(&br0, DEADLINE, serving_healthy)
        .await
        .unwrap();
    allocate_on(&node, "br0", "br0").await;
    let log = wait_log(&mut node, "the reason eth1 is Unhealthy", |l| {
        l.contains(ENSLAVED_ETH1)
    })
    .await;
    assert!(
        log.contains("auto-discovery leaves eth1 out: eth1 is a port of bridge br0"),
        "{log}"
    );

    // Released (the macvtap on br0 does not stop that): eth1 is usable
    // again; br0 holds no NIC and, like a vanished NIC, keeps its resource,
    // Unhealthy (a bridge whose last port left has no carrier).
    node.ns.ip(&["link", "set", "eth1", "nomaster"]).unwrap();
    let k = node.kubelet();
    k.wait_resource(&eth1, DEADLINE, serving_healthy)
        .await
        .unwrap();
    k.wait_resource(&br0, DEADLINE, |v| v.connected && all_unhealthy(&v.devices))
        .await
        .unwrap();
    allocate_on(&node, "eth1", "eth1").await;
    assert_eq!(node.kubelet().registration_count(&eth1), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_lower_device_is_unhealthy_while_enslaved_and_allocate_names_the_master() {
    // eth1 is already a port of br0 when the daemon starts.
    let mut node = Node::new("brcfg");
    add_bridge(&node.ns, "br0");
    node.ns
        .ip(&["link", "set", "eth1", "master", "br0"])
        .unwrap();
    node.start_kubelet().await;
    node.start_daemon(
        &[
            "--resource=name=dp,lowerDevice=eth1,capacity=3",
            "--metrics-addr=127.0.0.1:9402",
        ],
        &[],
    );
    let k = node.kubelet();
    k.wait_resource(DP, DEADLINE, |v| v.connected && all_unhealthy(&v.devices))
        .await
        .unwrap();
    let m = metrics_get(&node.ns, "/metrics");
    for want in [
        "macvtap_dp_unhealthy_total{resource=\"macvtap.network.kubevirt.io/dp\",reason=\"nic_enslaved\"} 1\n",
        "macvtap_dp_devices{resource=\"macvtap.network.kubevirt.io/dp\",state=\"unhealthy\"} 3\n",
    ] {
        assert!(m.contains(want), "want {want:?} in:\n{m}");
    }

    // Allocate says what is wrong and what to do, and leaves nothing behind.
    let mut client = node.kubelet().connect(DP_SOCKET).await.unwrap();
    let e = client.allocate(&["dpMvp0"]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert_eq!(
        e.message(),
        format!("resource {DP} cannot get a macvtap: {ENSLAVED_ETH1}")
    );
    assert!(
        node.ns
            .link(&link_name_for_device("dpMvp0"))
            .unwrap()
            .is_none()
    );

    // Released: Healthy, and Allocate works.
    node.ns.ip(&["link", "set", "eth1", "nomaster"]).unwrap();
    let k = node.kubelet();
    k.wait_resource(DP, DEADLINE, serving_healthy)
        .await
        .unwrap();
    allocate_on(&node, "dp", "eth1").await;
    // (A NIC that carries a macvtap cannot be enslaved: the kernel says EBUSY.)
    node.ns
        .handle()
        .unwrap()
        .del_link(
            node.ns
                .link(&link_name_for_device("dpMvp0"))
                .unwrap()
                .unwrap()
                .index,
            &link_name_for_device("dpMvp0"),
        )
        .unwrap();

    // Enslaved at run time: Unhealthy again, the reason logged and counted.
    node.ns
        .ip(&["link", "set", "eth1", "master", "br0"])
        .unwrap();
    node.kubelet()
        .wait_resource(DP, DEADLINE, |v| all_unhealthy(&v.devices))
        .await
        .unwrap();
    let unhealthy = format!("devices Unhealthy: {ENSLAVED_ETH1}");
    let log = wait_log(&mut node, "the second Unhealthy message", |l| {
        lines_with(l, &unhealthy) >= 2
    })
    .await;
    assert_eq!(lines_with(&log, &unhealthy), 2, "{log}");
    let m = metrics_get(&node.ns, "/metrics");
    let want = "macvtap_dp_unhealthy_total{resource=\"macvtap.network.kubevirt.io/dp\",reason=\"nic_enslaved\"} 2\n";
    assert!(m.contains(want), "want {want:?} in:\n{m}");
    // One registration and one stream all along.
    assert_eq!(node.kubelet().registration_count(DP), 1);
    assert_eq!(node.kubelet().resource(DP).streams_opened, 1);
}

#[test]
fn a_macvtap_the_kernel_refuses_as_busy_names_the_master() {
    // The NIC is read before it is enslaved, as when the bridge takes it
    // between Allocate's check and the kernel call: the kernel's EBUSY is
    // turned into the master and the fix.
    require_root().unwrap();
    let ns = TestNs::new("brbusy").unwrap();
    ns.add_nic("eth1").unwrap();
    add_bridge(&ns, "br0");
    let lower = ns.link("eth1").unwrap().unwrap();
    ns.ip(&["link", "set", "eth1", "master", "br0"]).unwrap();
    let netns = Netns::open(ns.path()).unwrap();
    let cfg = ResourceConfig {
        name: "dp".into(),
        ..ResourceConfig::for_nic("eth1")
    };
    let e = netns
        .run(move || {
            Ok(create_device(
                &Host::current(&Linux)?,
                &cfg,
                &lower,
                "dpMvp0",
            ))
        })
        .unwrap()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("resource {DP} cannot get a macvtap: {ENSLAVED_ETH1}")
    );
    assert_eq!(e.grpc_code(), tonic::Code::FailedPrecondition);
    assert!(ns.link(&link_name_for_device("dpMvp0")).unwrap().is_none());
}

/// An ARP request for `target` from `mac`/`ip`, as written to a macvtap's
/// tap node: a zeroed `virtio_net_hdr` (macvtap sets `IFF_VNET_HDR` by
/// default) and the Ethernet frame.
fn arp_request(mac: [u8; 6], ip: [u8; 4], target: [u8; 4]) -> Vec<u8> {
    let mut f = vec![0u8; 10];
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ip);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target);
    f
}

/// Whether a frame read from a tap node (after its `virtio_net_hdr`) is an
/// ARP reply from `from` to `to`.
fn is_arp_reply(frame: &[u8], from: [u8; 4], to: [u8; 4]) -> bool {
    let Some(eth) = frame.get(10..) else {
        return false;
    };
    eth.len() >= 42
        && eth[12..14] == [0x08, 0x06]
        && eth[20..22] == [0, 2]
        && eth[28..32] == from
        && eth[38..42] == to
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_macvtap_on_an_advertised_bridge_reaches_a_host_behind_the_bridge() {
    use std::io::{Read, Write};
    // Layout: eth2 is a port of br0; its peer is a host in its own
    // namespace at 192.0.2.2. Auto-discovery advertises br0 in eth2's place.
    let mut node = Node::new("brpath");
    let peer = TestNs::new("brpath-peer").unwrap();
    node.ns.add_nic("eth2").unwrap();
    add_bridge(&node.ns, "br0");
    node.ns
        .ip(&["link", "set", "eth2", "master", "br0"])
        .unwrap();
    node.ns
        .ip(&["link", "set", "eth2p", "netns", &peer.name])
        .unwrap();
    peer.ip(&["addr", "add", "192.0.2.2/24", "dev", "eth2p"])
        .unwrap();
    peer.ip(&["link", "set", "eth2p", "up"]).unwrap();
    node.start_kubelet().await;
    node.start_daemon(&["--discover-kinds", "veth"], &[]);
    node.kubelet()
        .wait_resource(&res("br0"), DEADLINE, serving_healthy)
        .await
        .unwrap();
    allocate_on(&node, "br0", "br0").await;

    // The VM's side: the macvtap up, frames through its tap node.
    let name = link_name_for_device("br0Mvp0");
    node.ns.ip(&["link", "set", &name, "up"]).unwrap();
    let link = node.ns.link(&name).unwrap().unwrap();
    let mac = link.mac.unwrap();
    let mut tap = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/dev/tap{}", link.index))
        .unwrap();
    let mut reader = tap.try_clone().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while let Ok(n) = reader.read(&mut buf) {
            if is_arp_reply(&buf[..n], [192, 0, 2, 2], [192, 0, 2, 10]) {
                let _ = tx.send(());
                return;
            }
        }
    });
    tap.write_all(&arp_request(mac, [192, 0, 2, 10], [192, 0, 2, 2]))
        .unwrap();
    let answered = tokio::task::spawn_blocking(move || rx.recv_timeout(DEADLINE))
        .await
        .unwrap();
    assert!(
        answered.is_ok(),
        "no ARP reply from 192.0.2.2 through the macvtap on br0 within {DEADLINE:?}"
    );
}
