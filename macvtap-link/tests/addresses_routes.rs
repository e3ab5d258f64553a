//! Addresses and default routes as the kernel reports them, dumped and as
//! notifications, in a fresh network namespace. Needs root; without it the
//! tests fail with "NOT RUN".

#![allow(clippy::unwrap_used, clippy::expect_used)]

use macvtap_link::monitor::{AddressRouteEvent, AddressRouteMonitor};
use macvtap_link::{Address, DefaultRoute, Links};
use std::net::IpAddr;
use std::sync::mpsc;
use std::time::Duration;
use test_support::TestNs;

/// A namespace with veth pair `a0`/`a1`, both up.
fn ns_with_pair(tag: &str) -> TestNs {
    let ns = TestNs::new(tag).unwrap();
    ns.ip(&["link", "add", "a0", "type", "veth", "peer", "name", "a1"])
        .unwrap();
    ns.ip(&["link", "set", "a0", "up"]).unwrap();
    ns.ip(&["link", "set", "a1", "up"]).unwrap();
    ns
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn every_address_is_listed_with_its_link_and_scope() {
    let ns = ns_with_pair("addrs");
    ns.ip(&["addr", "add", "192.0.2.1/24", "dev", "a0"])
        .unwrap();
    ns.ip(&["addr", "add", "2001:db8::1/64", "dev", "a0", "nodad"])
        .unwrap();
    ns.ip(&["addr", "add", "fe80::aa/64", "dev", "a1", "nodad"])
        .unwrap();
    // A point-to-point address: the local one is the link's, not the peer.
    ns.ip(&[
        "addr",
        "add",
        "198.51.100.1",
        "peer",
        "198.51.100.2/32",
        "dev",
        "a1",
    ])
    .unwrap();
    let h = ns.handle().unwrap();
    let a0 = h.get_link("a0").unwrap().unwrap().index;
    let a1 = h.get_link("a1").unwrap().unwrap().index;
    let lo = h.get_link("lo").unwrap().unwrap().index;
    let all = h.list_addresses().unwrap();
    let has = |index: u32, addr: &str, prefix_len: u8, global: bool| {
        let want = Address {
            index,
            ip: ip(addr),
            prefix_len,
            global,
        };
        assert!(all.contains(&want), "{want:?} not in {all:?}");
    };
    has(a0, "192.0.2.1", 24, true);
    has(a0, "2001:db8::1", 64, true);
    has(a1, "fe80::aa", 64, false);
    has(a1, "198.51.100.1", 32, true);
    has(lo, "127.0.0.1", 8, false);
    assert!(
        !all.iter().any(|a| a.ip == ip("198.51.100.2")),
        "the peer's address is not the link's: {all:?}"
    );
    assert_eq!(
        all.iter()
            .find(|a| a.ip == ip("192.0.2.1"))
            .unwrap()
            .to_string(),
        "192.0.2.1/24"
    );
}

#[test]
fn default_routes_are_listed_with_their_links_in_every_table() {
    let ns = ns_with_pair("routes");
    ns.ip(&["addr", "add", "192.0.2.1/24", "dev", "a0"])
        .unwrap();
    ns.ip(&["addr", "add", "2001:db8::1/64", "dev", "a1", "nodad"])
        .unwrap();
    let h = ns.handle().unwrap();
    assert!(h.list_default_routes().unwrap().is_empty(), "none yet");
    ns.ip(&["route", "add", "default", "via", "192.0.2.254", "dev", "a0"])
        .unwrap();
    ns.ip(&[
        "-6",
        "route",
        "add",
        "default",
        "via",
        "2001:db8::fe",
        "dev",
        "a1",
    ])
    .unwrap();
    ns.ip(&["route", "add", "default", "dev", "a1", "table", "100"])
        .unwrap();
    ns.ip(&[
        "route", "add", "default", "table", "1000", "nexthop", "dev", "a0", "nexthop", "dev", "a1",
    ])
    .unwrap();
    // Not default routes, or leading nowhere: none of them is listed.
    ns.ip(&["route", "add", "198.51.100.0/24", "dev", "a1"])
        .unwrap();
    ns.ip(&["route", "add", "unreachable", "default", "table", "102"])
        .unwrap();
    let a0 = h.get_link("a0").unwrap().unwrap().index;
    let a1 = h.get_link("a1").unwrap().unwrap().index;
    let mut got = h.list_default_routes().unwrap();
    got.sort();
    let route = |ipv6: bool, table: u32, oifs: Vec<u32>| DefaultRoute {
        ipv6,
        table,
        oifs,
        nexthop_id: None,
    };
    let mut want = vec![
        route(false, DefaultRoute::MAIN_TABLE, vec![a0]),
        route(true, DefaultRoute::MAIN_TABLE, vec![a1]),
        route(false, 100, vec![a1]),
        route(false, 1000, vec![a0.min(a1), a0.max(a1)]),
    ];
    want.sort();
    assert_eq!(got, want);
    let main = got.iter().find(|r| r.table == 254 && !r.ipv6).unwrap();
    assert_eq!(main.to_string(), "the IPv4 default route");
    let other = got.iter().find(|r| r.table == 100).unwrap();
    assert_eq!(
        other.to_string(),
        "the IPv4 default route of routing table 100"
    );
}

#[test]
fn the_monitor_reports_addresses_and_default_routes_and_no_other_route() {
    let ns = ns_with_pair("arevents");
    let netns = ns.netns().unwrap();
    let monitor = AddressRouteMonitor::in_netns(&netns).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        while let Ok(events) = monitor.recv() {
            for e in events {
                if tx.send(e).is_err() {
                    return;
                }
            }
        }
    });
    // The next event but those of link-local addresses, which the kernel
    // adds (and updates when duplicate address detection ends) on its own.
    let next = || loop {
        let e = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("an event within 10 s");
        match &e {
            AddressRouteEvent::AddressAdded(a) | AddressRouteEvent::AddressRemoved(a)
                if !a.global => {}
            _ => return e,
        }
    };
    let h = ns.handle().unwrap();
    let a0 = h.get_link("a0").unwrap().unwrap().index;
    ns.ip(&["addr", "add", "192.0.2.1/24", "dev", "a0"])
        .unwrap();
    let added = Address {
        index: a0,
        ip: ip("192.0.2.1"),
        prefix_len: 24,
        global: true,
    };
    assert_eq!(next(), AddressRouteEvent::AddressAdded(added.clone()));
    // The address's own prefix route and a route to another network come
    // and are dropped: the next event is the default route's.
    ns.ip(&["route", "add", "198.51.100.0/24", "dev", "a0"])
        .unwrap();
    ns.ip(&["route", "add", "default", "via", "192.0.2.254", "dev", "a0"])
        .unwrap();
    let default = DefaultRoute {
        ipv6: false,
        table: DefaultRoute::MAIN_TABLE,
        oifs: vec![a0],
        nexthop_id: None,
    };
    assert_eq!(
        next(),
        AddressRouteEvent::DefaultRouteAdded(default.clone())
    );
    ns.ip(&["route", "del", "default"]).unwrap();
    assert_eq!(next(), AddressRouteEvent::DefaultRouteRemoved(default));
    ns.ip(&["addr", "del", "192.0.2.1/24", "dev", "a0"])
        .unwrap();
    assert_eq!(next(), AddressRouteEvent::AddressRemoved(added));
}
