//! `Link::master` (`IFLA_MASTER`) as the kernel reports it, in a fresh
//! network namespace. Needs root; without it the test fails with "NOT RUN".

#![allow(clippy::unwrap_used, clippy::expect_used)]

use macvtap_link::{Handle, Netns};

mod common;
use common::{Ns, ip};

#[test]
fn a_bridge_port_names_its_bridge_as_master_until_released() {
    let ns = Ns::new("master");
    let n = ns.0.as_str();
    ip(&[
        "-n", n, "link", "add", "p0", "type", "veth", "peer", "name", "p1",
    ]);
    ip(&["-n", n, "link", "add", "br0", "type", "bridge"]);
    ip(&["-n", n, "link", "set", "p0", "master", "br0"]);
    let h = Handle::in_netns(&Netns::open(format!("/run/netns/{n}")).unwrap()).unwrap();
    let br = h.get_link("br0").unwrap().unwrap();
    assert_eq!(h.get_link("p0").unwrap().unwrap().master, Some(br.index));
    assert_eq!(br.master, None);
    let listed = h.list_links().unwrap();
    let p0 = listed.iter().find(|l| l.name == "p0").unwrap();
    assert_eq!(p0.master, Some(br.index));
    ip(&["-n", n, "link", "set", "p0", "nomaster"]);
    assert_eq!(h.get_link("p0").unwrap().unwrap().master, None);
}
