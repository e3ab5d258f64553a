//! Which resources the node should serve, and what a new configuration or
//! a change of the links changes of the ones it serves: plain functions of
//! the configuration, the link table, auto-discovery and the Node's labels
//! that return [`Change`]s, which the daemon carries out (serving, logging,
//! counting, posting). Nothing here serves or waits; the one thing read is
//! a selected NIC's driver and PCI IDs, under the sysfs root given
//! ([`crate::core::nic::select`]).
//!
//! A change of some links revisits only the resources it touches (their
//! NIC, the NIC's master, or a port on the NIC that can be in the way of
//! their mode: [`touches_nic`]), and runs discovery again only when it
//! concerns a NIC or a master above one.

use crate::config::{ResourceConfig, Resources};
use crate::core::link_table::LinkTable;
use crate::core::nic::discovery::Discovery;
use crate::core::nic::health::{NicHealth, resource_health};
use crate::core::nic::port::can_be_in_the_way;
use crate::core::nic::select::{Labels, Placed, Placements, place_all};
use crate::core::nic::usage::NodeNet;
use macvtap_link::{Link, MacvtapMode};
use std::path::Path;

/// A resource the node should serve (or serves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wanted {
    /// Its configuration.
    pub config: ResourceConfig,
    /// Made by auto-discovery (kept, unhealthy, when its NIC vanishes).
    pub discovered: bool,
}

/// What the node's resources are decided from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Node<'a> {
    /// The configuration in force: these resources, or auto-discovery.
    pub resources: &'a Resources,
    /// Auto-discovery (which logs each link it leaves out once).
    pub discovery: &'a Discovery,
    /// The node's links.
    pub links: &'a LinkTable,
    /// What the node uses of them itself (its addresses, default routes
    /// and InternalIP), which `spare` auto-discovery leaves out.
    pub net: &'a NodeNet,
    /// The Node's labels, which node selectors match.
    pub labels: Labels<'a>,
    /// Placement (which logs where each selected entry goes once).
    pub placements: &'a Placements,
    /// Where sysfs is: a selected NIC's driver and PCI IDs.
    pub sysfs: &'a Path,
}

/// A wanted resource with its NIC's health now: what is published of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Published {
    /// The resource.
    pub wanted: Wanted,
    /// Its lower NIC's health among the links now ([`resource_health`]).
    pub health: NicHealth,
}

/// One change to the served resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// A served resource, by name, that is no longer wanted.
    Removed(String),
    /// A wanted resource that is not served yet.
    Added(Published),
    /// A served resource to publish again: its configuration or origin
    /// changed, or a change of the links touched its NIC (or everything is
    /// looked at anew).
    Updated(Published),
}

/// The resources wanted now on `node`, given the resources `served`: the
/// configured ones this node serves, each on its NIC ([`place_all`]: a
/// node selector may leave one out, a NIC selector picks the NIC; an entry
/// whose selected NIC vanished keeps it, unhealthy, as a named NIC does),
/// or what auto-discovery finds plus the discovered ones served whose NIC
/// vanished (kept, unhealthy).
pub(crate) fn wanted(node: Node<'_>, served: &[Wanted]) -> Vec<Wanted> {
    match node.resources {
        Resources::Static(list) => {
            let links = node.links.links();
            let placed = place_all(
                list,
                links,
                node.discovery.extra_kinds(),
                node.labels,
                node.sysfs,
                node.placements,
            );
            node.placements.log(list, &placed);
            list.iter()
                .zip(placed)
                .filter_map(|(cfg, p)| match p {
                    Placed::Here(config, _) => Some(config),
                    Placed::NotHere(_) => None,
                    // Served on a NIC that is gone now: kept, unhealthy.
                    Placed::NoNic(_) => served
                        .iter()
                        .find(|s| {
                            !s.discovered
                                && s.config.name == cfg.name
                                && s.config.placement == cfg.placement
                                && node.links.by_name(&s.config.lower_device).is_none()
                        })
                        .map(|s| s.config.clone()),
                })
                .map(|config| Wanted {
                    config,
                    discovered: false,
                })
                .collect()
        }
        Resources::AutoDiscover(policy) => {
            let discovered = node
                .discovery
                .discover(node.links.links(), *policy, node.net);
            let mut found: Vec<Wanted> = discovered
                .resources
                .into_iter()
                .map(|config| Wanted {
                    config,
                    discovered: true,
                })
                .collect();
            // A discovered NIC that vanished (or a master took) keeps its
            // resource, unhealthy; one the node now uses itself is withdrawn.
            for s in served.iter().filter(|s| s.discovered) {
                let withdrawn = discovered.node_uses.contains(&s.config.name);
                if !withdrawn && !found.iter().any(|w| w.config.name == s.config.name) {
                    found.push(Wanted {
                        config: s.config.clone(),
                        discovered: true,
                    });
                }
            }
            found
        }
    }
}

/// The resources wanted after the links `changed` (their old and new
/// states) did: the ones `served` as they are when auto-discovery cannot
/// find anything new in that change, else [`wanted`].
pub(crate) fn wanted_after(node: Node<'_>, served: &[Wanted], changed: &[&Link]) -> Vec<Wanted> {
    if matches!(node.resources, Resources::AutoDiscover(_))
        && !node.discovery.concerned_by(changed, node.links.links())
    {
        return served.to_vec();
    }
    wanted(node, served)
}

/// What to change of the resources `served` (in the order they are
/// served) for `node`: first the ones no longer wanted, in that order,
/// then each wanted one that is new or, with `changed` (links that
/// changed), whose configuration or origin differs or whose NIC the change
/// touches ([`touches_nic`]); without `changed`, every wanted one.
pub(crate) fn changes(node: Node<'_>, served: &[Wanted], changed: Option<&[&Link]>) -> Vec<Change> {
    let wanted = match changed {
        Some(c) => wanted_after(node, served, c),
        None => wanted(node, served),
    };
    let mut out: Vec<Change> = served
        .iter()
        .filter(|s| !wanted.iter().any(|w| w.config.name == s.config.name))
        .map(|s| Change::Removed(s.config.name.clone()))
        .collect();
    for w in wanted {
        let now = served.iter().find(|s| s.config.name == w.config.name);
        let revisit = match (changed, now) {
            (Some(c), Some(s)) => {
                *s != w || touches_nic(node.links, &w.config.lower_device, w.config.mode, c)
            }
            _ => true,
        };
        if !revisit {
            continue;
        }
        let health = resource_health(&w.config, node.links.links());
        let published = Published { wanted: w, health };
        out.push(match now {
            Some(_) => Change::Updated(published),
            None => Change::Added(published),
        });
    }
    out
}

/// Whether a change of the links `changed` (their old and new states)
/// touches the NIC `lower` of a resource in `mode` among `links` (the state
/// after): the NIC is one of them, or its master is, or a macvlan/macvtap
/// port on it that can be in the way of the mode ([`can_be_in_the_way`]:
/// any port beside a passthru resource, a passthru port beside any). So the
/// resource's own bridge-mode macvtaps, made by every Allocate, do not make
/// it revisit its devices.
pub(crate) fn touches_nic(
    links: &LinkTable,
    lower: &str,
    mode: MacvtapMode,
    changed: &[&Link],
) -> bool {
    let nic = links.by_name(lower);
    let is_port_on_nic = |l: &Link| nic.is_some_and(|n| can_be_in_the_way(l, n, mode));
    changed.iter().any(|l| l.name == lower || is_port_on_nic(l))
        || nic
            .and_then(|nic| nic.master)
            .is_some_and(|m| changed.iter().any(|l| l.index == m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, name: &str, master: Option<u32>) -> Link {
        Link {
            index,
            name: name.into(),
            master,
            ..Default::default()
        }
    }

    /// A NIC that is up: what health calls healthy.
    fn nic(index: u32, name: &str) -> Link {
        test_support::fake::nic(index, name, true)
    }

    fn served(names: &[&str], discovered: bool) -> Vec<Wanted> {
        names
            .iter()
            .map(|n| Wanted {
                config: ResourceConfig::for_nic(n),
                discovered,
            })
            .collect()
    }

    fn names(changes: &[Change]) -> Vec<String> {
        changes
            .iter()
            .map(|c| match c {
                Change::Removed(n) => format!("-{n}"),
                Change::Added(p) => format!("+{}", p.wanted.config.name),
                Change::Updated(p) => format!("~{}", p.wanted.config.name),
            })
            .collect()
    }

    #[test]
    fn a_change_touches_the_nic_and_its_master_only() {
        let links = LinkTable::new(vec![
            link(2, "eth1", Some(5)),
            link(3, "eth2", None),
            link(5, "br0", None),
            link(9, "veth9", Some(5)),
        ]);
        let touches_in = |mode: MacvtapMode, l: &Link| {
            ["eth1", "eth2", "gone"]
                .into_iter()
                .filter(|n| touches_nic(&links, n, mode, &[l]))
                .collect::<Vec<_>>()
        };
        let touches = |l: &Link| touches_in(MacvtapMode::Passthru, l);
        assert_eq!(touches(&link(2, "eth1", None)), ["eth1"]);
        assert_eq!(touches(&link(5, "br0", None)), ["eth1"], "eth1's master");
        assert!(
            touches(&link(9, "veth9", Some(5))).is_empty(),
            "a sibling port"
        );
        assert!(touches(&link(11, "veth11", None)).is_empty());
        // A NIC that is gone is touched by its own name (its old state).
        assert_eq!(touches(&link(7, "gone", None)), ["gone"]);
        // A macvlan or macvtap port on eth2 (in the way of a passthru one),
        // not a veth whose peer index happens to be eth2's.
        let port = |kind: &str| Link {
            kind: Some(kind.into()),
            lower_index: Some(3),
            ..link(12, "port12", None)
        };
        assert_eq!(touches(&port("macvlan")), ["eth2"]);
        assert_eq!(touches(&port("macvtap")), ["eth2"]);
        assert!(touches(&port("veth")).is_empty());
        // Beside a bridge-mode resource only a passthru port is in the way;
        // its own bridge macvtaps (one per Allocate) are not.
        assert!(touches_in(MacvtapMode::Bridge, &port("macvtap")).is_empty());
        let passthru = Link {
            macvtap_mode: Some(MacvtapMode::Passthru),
            ..port("macvtap")
        };
        assert_eq!(touches_in(MacvtapMode::Bridge, &passthru), ["eth2"]);
        let elsewhere = Link {
            lower_in_other_netns: true,
            ..port("macvtap")
        };
        assert!(
            touches(&elsewhere).is_empty(),
            "a lower in another namespace"
        );
    }

    #[test]
    fn configured_resources_are_wanted_as_configured() {
        let resources = Resources::Static(vec![
            ResourceConfig::for_nic("eth2"),
            ResourceConfig::for_nic("eth1"),
        ]);
        let links = LinkTable::new(vec![nic(2, "eth1"), nic(3, "eth3")]);
        let node = Node {
            resources: &resources,
            discovery: &Discovery::default(),
            links: &links,
            net: &NodeNet::default(),
            labels: Labels::Unknown("not read"),
            placements: &Placements::default(),
            sysfs: Path::new("/nonexistent"),
        };
        // In the configuration's order; neither discovered, nor kept.
        assert_eq!(
            wanted(node, &served(&["eth3"], true)),
            [
                Wanted {
                    config: ResourceConfig::for_nic("eth2"),
                    discovered: false
                },
                Wanted {
                    config: ResourceConfig::for_nic("eth1"),
                    discovered: false
                },
            ]
        );
    }

    #[test]
    fn discovery_keeps_a_discovered_resource_whose_nic_vanished() {
        let links = LinkTable::new(vec![nic(2, "eth1")]);
        let node = Node {
            resources: &Resources::AutoDiscover(crate::config::DiscoveryPolicy::All),
            discovery: &Discovery::default(),
            links: &links,
            net: &NodeNet::default(),
            labels: Labels::Unknown("not read"),
            placements: &Placements::default(),
            sysfs: Path::new("/nonexistent"),
        };
        let mut now = served(&["eth0"], true);
        now.extend(served(&["dp"], false));
        assert_eq!(
            wanted(node, &now),
            served(&["eth1", "eth0"], true),
            "found first, then the vanished one; a configured one is not kept"
        );
    }

    #[test]
    fn a_discovered_nic_the_node_starts_to_use_is_withdrawn_not_kept() {
        use crate::config::DiscoveryPolicy;
        use crate::core::nic::usage::Addressing;
        let links = LinkTable::new(vec![nic(2, "eth1"), nic(3, "eth2")]);
        let now = served(&["eth1", "eth2"], true);
        let net = NodeNet {
            addressing: Addressing {
                addresses: vec![macvtap_link::Address {
                    index: 2,
                    ip: "192.0.2.1".parse().unwrap(),
                    prefix_len: 24,
                    global: true,
                }],
                default_routes: vec![],
            },
            internal_ips: None,
        };
        let node = Node {
            resources: &Resources::AutoDiscover(DiscoveryPolicy::Spare),
            discovery: &Discovery::default(),
            links: &links,
            net: &net,
            labels: Labels::Unknown("not read"),
            placements: &Placements::default(),
            sysfs: Path::new("/nonexistent"),
        };
        assert_eq!(
            names(&changes(node, &now, None)),
            ["-eth1", "~eth2"],
            "eth1 got an address of the node's"
        );
        // Under the Go project's policy it stays.
        let node = Node {
            resources: &Resources::AutoDiscover(DiscoveryPolicy::All),
            ..node
        };
        assert_eq!(names(&changes(node, &now, None)), ["~eth1", "~eth2"]);
    }

    #[test]
    fn each_node_serves_an_entry_on_the_nic_it_picks_where_its_labels_say() {
        use crate::placement::{NicSelector, Placement};
        use std::collections::BTreeMap;
        let entry = ResourceConfig {
            lower_device: String::new(),
            placement: Some(Placement {
                nic: Some(NicSelector {
                    names: vec!["ens5f0".into(), "eth1".into()],
                    ..Default::default()
                }),
                nodes: BTreeMap::from([("role".to_string(), "dp".to_string())]),
            }),
            ..ResourceConfig::for_nic("dp")
        };
        let resources = Resources::Static(vec![entry.clone()]);
        let links = LinkTable::new(vec![nic(2, "eth1"), nic(3, "eth2")]);
        let dp = BTreeMap::from([("role".to_string(), "dp".to_string())]);
        let placements = Placements::default();
        let (discovery, net) = (Discovery::default(), NodeNet::default());
        let node = |labels| Node {
            resources: &resources,
            discovery: &discovery,
            links: &links,
            net: &net,
            labels,
            placements: &placements,
            sysfs: Path::new("/nonexistent"),
        };
        let got = wanted(node(Labels::Known(&dp)), &[]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].config.lower_device, "eth1", "ens5f0 is not here");
        assert!(!got[0].discovered);
        // Labels unknown or other: not served here.
        assert!(wanted(node(Labels::Unknown("x")), &[]).is_empty());
        let web = BTreeMap::from([("role".to_string(), "web".to_string())]);
        assert!(wanted(node(Labels::Known(&web)), &got).is_empty());
        // The NIC it picked vanished: kept, unhealthy, as a named one.
        let gone = LinkTable::new(vec![nic(3, "eth2")]);
        let node = Node {
            links: &gone,
            ..node(Labels::Known(&dp))
        };
        let kept = wanted(node, &got);
        assert_eq!(kept, got);
        assert_eq!(
            changes(node, &got, None)
                .into_iter()
                .map(|c| match c {
                    Change::Updated(p) => p.health.reason(),
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<_>>(),
            ["nic_missing"]
        );
        // Never served here: nothing to keep.
        assert!(wanted(node, &[]).is_empty());
    }

    #[test]
    fn a_change_discovery_is_not_concerned_by_keeps_what_is_served() {
        let veth = Link {
            kind: Some("veth".into()),
            ..link(9, "veth9", None)
        };
        let links = LinkTable::new(vec![nic(2, "eth1"), veth.clone()]);
        let node = Node {
            resources: &Resources::AutoDiscover(crate::config::DiscoveryPolicy::All),
            discovery: &Discovery::default(),
            links: &links,
            net: &NodeNet::default(),
            labels: Labels::Unknown("not read"),
            placements: &Placements::default(),
            sysfs: Path::new("/nonexistent"),
        };
        let now = served(&["eth0"], true);
        assert_eq!(wanted_after(node, &now, &[&veth]), now, "nothing new found");
        assert_eq!(
            wanted_after(node, &now, &[&nic(2, "eth1")]),
            served(&["eth1", "eth0"], true)
        );
    }

    #[test]
    fn without_a_change_of_links_every_wanted_resource_is_published() {
        let resources = Resources::Static(vec![
            ResourceConfig::for_nic("eth1"),
            ResourceConfig::for_nic("eth2"),
        ]);
        let links = LinkTable::new(vec![nic(2, "eth1")]);
        let node = Node {
            resources: &resources,
            discovery: &Discovery::default(),
            links: &links,
            net: &NodeNet::default(),
            labels: Labels::Unknown("not read"),
            placements: &Placements::default(),
            sysfs: Path::new("/nonexistent"),
        };
        let got = changes(node, &served(&["eth0", "eth1"], false), None);
        assert_eq!(names(&got), ["-eth0", "~eth1", "+eth2"]);
        let Change::Updated(eth1) = &got[1] else {
            panic!("{got:?}")
        };
        assert_eq!(eth1.health, NicHealth::Healthy);
        let Change::Added(eth2) = &got[2] else {
            panic!("{got:?}")
        };
        assert_eq!(
            eth2.health,
            NicHealth::Missing {
                lower: "eth2".into()
            }
        );
    }

    #[test]
    fn a_change_of_links_revisits_only_what_it_touches_or_changed() {
        let other = ResourceConfig {
            capacity: 4,
            ..ResourceConfig::for_nic("eth2")
        };
        let resources = Resources::Static(vec![
            ResourceConfig::for_nic("eth1"),
            other.clone(),
            ResourceConfig::for_nic("eth3"),
        ]);
        let links = LinkTable::new(vec![nic(2, "eth1"), nic(3, "eth2"), nic(4, "eth3")]);
        let node = Node {
            resources: &resources,
            discovery: &Discovery::default(),
            links: &links,
            net: &NodeNet::default(),
            labels: Labels::Unknown("not read"),
            placements: &Placements::default(),
            sysfs: Path::new("/nonexistent"),
        };
        let now = served(&["eth1", "eth2", "eth3"], false);
        let eth1 = nic(2, "eth1");
        // eth1 touched, eth2's capacity changed, eth3 left alone.
        assert_eq!(
            names(&changes(node, &now, Some(&[&eth1]))),
            ["~eth1", "~eth2"]
        );
        // A link that touches nothing changes nothing that is served as wanted.
        let unrelated = link(9, "veth9", None);
        let want = vec![
            Wanted {
                config: ResourceConfig::for_nic("eth1"),
                discovered: false,
            },
            Wanted {
                config: other,
                discovered: false,
            },
            Wanted {
                config: ResourceConfig::for_nic("eth3"),
                discovered: false,
            },
        ];
        assert!(changes(node, &want, Some(&[&unrelated])).is_empty());
        // The same configuration, discovered before: its origin changed.
        let mut was_discovered = want.clone();
        was_discovered[2].discovered = true;
        assert_eq!(
            names(&changes(node, &was_discovered, Some(&[&unrelated]))),
            ["~eth3"]
        );
    }
}
