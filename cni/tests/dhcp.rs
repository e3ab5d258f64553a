//! `dhcp` IPAM through the real binary: the reference plugin's daemon
//! (started and stopped by the test) leases an address from dnsmasq on the
//! peer side of the node's NIC, on TEST-NET-1 only; DEL releases it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::dhcp::{DhcpDaemon, Dnsmasq, dhcp_plugin, lock, wait_until};
use common::*;
use serde_json::{Value, json};
use std::net::Ipv4Addr;

fn dhcp_conf(device_id: &str) -> Value {
    let mut conf = netconf("1.0.0", device_id);
    conf["ipam"] = json!({"type": "dhcp"});
    conf
}

#[test]
fn dhcp_leases_an_address_onto_the_macvtap_and_del_releases_it() {
    let lock = lock();
    let sb = Sandbox::new();
    sb.peer
        .ip(&["addr", "add", "192.0.2.1/24", "dev", "peer0"])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = Dnsmasq::start(&sb.peer, "peer0", "192.0.2.50", "192.0.2.60", dir.path());
    let daemon = DhcpDaemon::start(&lock, dir.path());
    let index = sb.allocate("eth0Mvp0");
    let conf = dhcp_conf("eth0Mvp0");

    let add = sb.cni("ADD", &conf, &[]);
    assert_eq!(
        add.code,
        0,
        "ADD failed: {} / {} / daemon: {} / dnsmasq: {}",
        add.stdout,
        add.stderr,
        daemon.log(),
        server.log()
    );
    let r = add.json();
    let address = r["ips"][0]["address"].as_str().unwrap().to_string();
    let (ip, prefix) = address.split_once('/').unwrap();
    let ip: Ipv4Addr = ip.parse().unwrap();
    assert!(
        (Ipv4Addr::new(192, 0, 2, 50)..=Ipv4Addr::new(192, 0, 2, 60)).contains(&ip),
        "{r}"
    );
    assert_eq!(prefix, "24", "{r}");
    assert_eq!(r["ips"][0]["interface"], 0, "{r}");
    assert_eq!(
        r["ips"][0]["gateway"], "192.0.2.1",
        "dnsmasq's router option: {r}"
    );
    assert!(sb.pod_addrs().contains(&address), "{:?}", sb.pod_addrs());
    let mac = r["interfaces"][0]["mac"].as_str().unwrap().to_string();
    let leases = server.leases();
    assert!(
        leases
            .lines()
            .any(|l| l.contains(&mac) && l.contains(&ip.to_string())),
        "dnsmasq leased {ip} to {mac}: {leases:?}"
    );
    let link = sb.link(&sb.pod, "net1").unwrap();
    assert_eq!(link["ifindex"].as_u64(), Some(index as u64));

    sb.cni("DEL", &conf, &[]).ok();
    wait_until("dnsmasq to drop the released lease", || {
        !server.leases().contains(&mac)
    });
    assert!(
        server
            .log()
            .contains(&format!("DHCPRELEASE(peer0) {ip} {mac}")),
        "{}",
        server.log()
    );
    assert!(
        sb.link(&sb.node, &macvtap_link::link_name_for_device("eth0Mvp0"))
            .is_some(),
        "the link is back on the host"
    );
}

#[test]
fn add_without_the_dhcp_daemon_names_the_fix_and_rolls_back() {
    // Held so that no daemon (ours or another test's) serves the socket.
    let _lock = lock();
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    let before = sb.node_links();
    let run = sb.cni("ADD", &dhcp_conf("eth0Mvp0"), &[]);
    assert_eq!(run.code, 1, "{} / {}", run.stdout, run.stderr);
    let msg = run.json()["msg"].as_str().unwrap().to_string();
    assert!(
        msg.contains(&format!("start `{} daemon`", dhcp_plugin().display())),
        "the error names the fix: {msg}"
    );
    assert_eq!(sb.node_links(), before, "rolled back");
    assert_eq!(links_summary(&sb.pod).len(), 1, "only lo in the pod");
}
