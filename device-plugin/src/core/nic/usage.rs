//! What the node uses of its links itself: the links its default routes
//! leave through, the one holding its Node's InternalIP, and every link
//! with a global address. Auto-discovery's `spare` policy offers none of
//! them ([`crate::core::nic::discovery`]): a VM there would sit on the
//! node's own network (often the management network), with a MAC its pod
//! chooses.
//!
//! A use counts for the links beneath it too: an address or route on a
//! VLAN, macvlan, ipvlan or macvtap counts for its lower link, and one on
//! a port for its master (the bridge or bond auto-discovery offers in the
//! port's place), so it reaches the link discovery would offer.

use macvtap_link::{Address, DefaultRoute, Link};
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

/// Link kinds whose frames leave through their lower link (`IFLA_LINK`),
/// so a use of one is a use of that link.
const STACKED_KINDS: &[&str] = &["vlan", "macvlan", "macvtap", "ipvlan", "ipvtap"];

/// How many links a use is followed through (lower links and masters);
/// more means a loop in what the kernel said.
const MAX_DEPTH: usize = 8;

/// The node's addresses and default routes, as the kernel says them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Addressing {
    /// Every address of every link.
    pub addresses: Vec<Address>,
    /// Every default route, in every routing table.
    pub default_routes: Vec<DefaultRoute>,
}

impl Addressing {
    /// The same addressing without what no use depends on (addresses that
    /// are not global, such as the link-local ones the kernel gives every
    /// link), in a fixed order, so two readings compare equal when they
    /// say the same.
    pub(crate) fn relevant(mut self) -> Self {
        self.addresses.retain(|a| a.global);
        self.addresses.sort();
        self.addresses.dedup();
        self.default_routes.sort();
        self.default_routes.dedup();
        self
    }
}

/// What is known of how the node uses its links.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NodeNet {
    /// The kernel's addresses and default routes.
    pub addressing: Addressing,
    /// The Node's InternalIP addresses (its `status.addresses`); `None`
    /// when the Node cannot be read.
    pub internal_ips: Option<Vec<IpAddr>>,
}

/// How the node itself uses a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Use {
    /// A default route leaves through it.
    DefaultRoute(DefaultRoute),
    /// It holds the Node's InternalIP.
    InternalIp(IpAddr),
    /// It has a global address.
    GlobalAddress(Address),
}

impl Use {
    /// The order of strength: a default route, then the InternalIP, then
    /// any global address.
    fn rank(&self) -> u8 {
        match self {
            Use::DefaultRoute(_) => 0,
            Use::InternalIp(_) => 1,
            Use::GlobalAddress(_) => 2,
        }
    }
}

/// A use of a link, and the link it was found on when that is another:
/// one stacked on it (a VLAN), or one of its ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Used {
    /// The use.
    pub what: Use,
    /// The link that has it, when not the link itself.
    pub on: Option<String>,
}

impl Used {
    /// Whether only a configured resource may put VMs on the link: it
    /// carries a default route or the Node's InternalIP, which
    /// `--discover-include` cannot override (a global address alone, it can).
    pub(crate) fn only_by_configuration(&self) -> bool {
        !matches!(self.what, Use::GlobalAddress(_))
    }
}

impl fmt::Display for Used {
    /// `carries the IPv4 default route (on eth0.100)`, `holds the Node's
    /// InternalIP 192.0.2.10`, `has the global address 192.0.2.5/24`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.what {
            Use::DefaultRoute(r) => write!(f, "carries {r}")?,
            Use::InternalIp(ip) => write!(f, "holds the Node's InternalIP {ip}")?,
            Use::GlobalAddress(a) => write!(f, "has the global address {a}")?,
        }
        if let Some(on) = &self.on {
            write!(f, " (on {on})")?;
        }
        Ok(())
    }
}

/// The links `net` says the node uses, by index, each with its strongest
/// use (a default route before the InternalIP before a global address; the
/// first found among equals), found on the link itself or on a link
/// stacked on it or one of its ports.
pub(crate) fn uses(links: &[Link], net: &NodeNet) -> BTreeMap<u32, Used> {
    let mut seeds: Vec<(u32, Use)> = Vec::new();
    for r in &net.addressing.default_routes {
        seeds.extend(r.oifs.iter().map(|&i| (i, Use::DefaultRoute(r.clone()))));
    }
    for ip in net.internal_ips.iter().flatten() {
        seeds.extend(
            net.addressing
                .addresses
                .iter()
                .filter(|a| a.ip == *ip)
                .map(|a| (a.index, Use::InternalIp(*ip))),
        );
    }
    seeds.extend(
        net.addressing
            .addresses
            .iter()
            .filter(|a| a.global)
            .map(|a| (a.index, Use::GlobalAddress(a.clone()))),
    );
    let mut out: BTreeMap<u32, Used> = BTreeMap::new();
    for (index, what) in seeds {
        let Some(origin) = links.iter().find(|l| l.index == index) else {
            continue;
        };
        for carrier in carriers(origin, links) {
            let used = Used {
                what: what.clone(),
                on: (carrier.index != origin.index).then(|| origin.name.clone()),
            };
            match out.get(&carrier.index) {
                Some(had) if had.what.rank() <= used.what.rank() => {}
                _ => {
                    out.insert(carrier.index, used);
                }
            }
        }
    }
    out
}

/// `link` and every link a use of it counts for: its lower link when it is
/// stacked on one in this namespace, its master, and theirs in turn.
fn carriers<'a>(link: &'a Link, links: &'a [Link]) -> Vec<&'a Link> {
    let by_index = |i: u32| links.iter().find(|l| l.index == i);
    let mut out = vec![link];
    let mut frontier = vec![link];
    for _ in 0..MAX_DEPTH {
        let mut next = Vec::new();
        for l in frontier {
            let stacked = l
                .kind
                .as_deref()
                .is_some_and(|k| STACKED_KINDS.contains(&k))
                && !l.lower_in_other_netns;
            let lower = l.lower_index.filter(|_| stacked).and_then(by_index);
            let master = l.master.and_then(by_index);
            for c in lower.into_iter().chain(master) {
                if !out.iter().any(|o| o.index == c.index) {
                    out.push(c);
                    next.push(c);
                }
            }
        }
        if next.is_empty() {
            break;
        }
        frontier = next;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_support::fake::{link, nic};

    fn addr(index: u32, ip: &str, prefix_len: u8, global: bool) -> Address {
        Address {
            index,
            ip: ip.parse().unwrap(),
            prefix_len,
            global,
        }
    }

    fn default_via(oifs: &[u32]) -> DefaultRoute {
        DefaultRoute {
            ipv6: false,
            table: DefaultRoute::MAIN_TABLE,
            oifs: oifs.to_vec(),
            nexthop_id: None,
        }
    }

    fn said(uses: &BTreeMap<u32, Used>, links: &[Link]) -> Vec<String> {
        uses.iter()
            .map(|(i, u)| {
                let name = &links.iter().find(|l| l.index == *i).unwrap().name;
                format!("{name} {u}")
            })
            .collect()
    }

    #[test]
    fn a_default_route_an_internal_ip_and_global_addresses_are_uses() {
        let links = vec![
            nic(1, "lo", true),
            nic(2, "eth0", true),
            nic(3, "eth1", true),
            nic(4, "eth2", true),
            nic(5, "eth3", true),
        ];
        let net = NodeNet {
            addressing: Addressing {
                addresses: vec![
                    addr(1, "127.0.0.1", 8, false),
                    addr(2, "192.0.2.10", 24, true),
                    addr(3, "fe80::1", 64, false),
                    addr(4, "198.51.100.7", 24, true),
                    addr(5, "203.0.113.9", 24, true),
                ],
                default_routes: vec![default_via(&[2])],
            },
            internal_ips: Some(vec!["203.0.113.9".parse().unwrap()]),
        };
        assert_eq!(
            said(&uses(&links, &net), &links),
            [
                "eth0 carries the IPv4 default route",
                "eth2 has the global address 198.51.100.7/24",
                "eth3 holds the Node's InternalIP 203.0.113.9",
            ],
            "a link-local address is no use; the strongest use is said"
        );
        let u = uses(&links, &net);
        assert!(u[&2].only_by_configuration());
        assert!(u[&5].only_by_configuration());
        assert!(!u[&4].only_by_configuration());
    }

    #[test]
    fn a_use_counts_for_the_lower_link_and_the_master() {
        // eth0.100, a VLAN on eth0, carries the route; a macvlan on eth1
        // has an address; eth2 is a bond slave with an address (odd, but
        // the bond is what discovery offers); a veth's peer is no lower link.
        let mut links = vec![
            nic(2, "eth0", true),
            link(3, "eth0.100", "vlan", Some(2)),
            nic(4, "eth1", true),
            link(5, "mvl0", "macvlan", Some(4)),
            nic(6, "eth2", true),
            link(7, "bond0", "bond", None),
            nic(8, "eth3", true),
            link(9, "veth0", "veth", Some(8)),
        ];
        links[4].master = Some(7);
        let net = NodeNet {
            addressing: Addressing {
                addresses: vec![
                    addr(5, "192.0.2.5", 24, true),
                    addr(6, "198.51.100.6", 24, true),
                    addr(9, "203.0.113.1", 24, true),
                ],
                default_routes: vec![default_via(&[3])],
            },
            internal_ips: None,
        };
        assert_eq!(
            said(&uses(&links, &net), &links),
            [
                "eth0 carries the IPv4 default route (on eth0.100)",
                "eth0.100 carries the IPv4 default route",
                "eth1 has the global address 192.0.2.5/24 (on mvl0)",
                "mvl0 has the global address 192.0.2.5/24",
                "eth2 has the global address 198.51.100.6/24",
                "bond0 has the global address 198.51.100.6/24 (on eth2)",
                "veth0 has the global address 203.0.113.1/24",
            ]
        );
        // A lower link in another namespace is not this namespace's link.
        links[3].lower_in_other_netns = true;
        assert!(
            !said(&uses(&links, &net), &links)
                .iter()
                .any(|s| s.starts_with("eth1 "))
        );
    }

    #[test]
    fn a_multipath_route_uses_every_link_and_a_loop_ends() {
        let mut links = vec![
            link(2, "a", "bridge", None),
            link(3, "b", "bridge", None),
            nic(4, "eth1", true),
        ];
        links[0].master = Some(3);
        links[1].master = Some(2);
        let net = NodeNet {
            addressing: Addressing {
                addresses: vec![],
                default_routes: vec![default_via(&[2, 4])],
            },
            internal_ips: None,
        };
        let u = uses(&links, &net);
        assert_eq!(u.keys().copied().collect::<Vec<_>>(), [2, 3, 4]);
    }

    #[test]
    fn only_global_addresses_and_default_routes_are_relevant() {
        let a = Addressing {
            addresses: vec![
                addr(3, "fe80::1", 64, false),
                addr(2, "192.0.2.1", 24, true),
                addr(2, "192.0.2.1", 24, true),
            ],
            default_routes: vec![default_via(&[2]), default_via(&[2])],
        };
        let r = a.relevant();
        assert_eq!(r.addresses, [addr(2, "192.0.2.1", 24, true)]);
        assert_eq!(r.default_routes.len(), 1);
    }
}
