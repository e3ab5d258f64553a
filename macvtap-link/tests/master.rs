//! `Link::master` (`IFLA_MASTER`) as the kernel reports it, in a fresh
//! network namespace. Needs root; without it the test fails with "NOT RUN".

#![allow(clippy::unwrap_used, clippy::expect_used)]

use macvtap_link::Links;
use test_support::TestNs;

#[test]
fn a_bridge_port_names_its_bridge_as_master_until_released() {
    let ns = TestNs::new("master").unwrap();
    ns.ip(&["link", "add", "p0", "type", "veth", "peer", "name", "p1"])
        .unwrap();
    ns.ip(&["link", "add", "br0", "type", "bridge"]).unwrap();
    ns.ip(&["link", "set", "p0", "master", "br0"]).unwrap();
    let h = ns.handle().unwrap();
    let br = h.get_link("br0").unwrap().unwrap();
    assert_eq!(h.get_link("p0").unwrap().unwrap().master, Some(br.index));
    assert_eq!(br.master, None);
    let listed = h.list_links().unwrap();
    let p0 = listed.iter().find(|l| l.name == "p0").unwrap();
    assert_eq!(p0.master, Some(br.index));
    ns.ip(&["link", "set", "p0", "nomaster"]).unwrap();
    assert_eq!(h.get_link("p0").unwrap().unwrap().master, None);
}
