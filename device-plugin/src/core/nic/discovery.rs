//! Which links can carry a macvtap: auto-discovery of the node's NICs.
//!
//! The kernel refuses a macvtap (`EBUSY`) on a link whose receive path
//! another device already took ([`crate::core::nic::master`]). So auto-discovery leaves
//! such a NIC out and, where a macvtap on the master works (a Linux bridge,
//! a bond), advertises the master instead. It never chooses passthru mode:
//! a passthru macvtap takes the whole NIC, which only a configuration may ask.
//!
//! Under the `spare` policy ([`DiscoveryPolicy`]) it also leaves out what
//! the node uses itself ([`crate::core::nic::usage`]): a NIC that a default
//! route leaves through or that holds the Node's InternalIP always (only a
//! configured resource may put VMs there), one with a global address
//! unless `--discover-include` names it. Each left-out NIC's reason says
//! how to serve it after all.

use crate::config::{DiscoveryPolicy, ResourceConfig, check_resource_name};
use crate::core::nic::master::receive_path_owner;
use crate::core::nic::usage::{NodeNet, uses};
use macvtap_link::Link;
use std::collections::BTreeMap;
use std::sync::Mutex;
use tracing::info;

/// `IFF_LOOPBACK`.
const IFF_LOOPBACK: u32 = 0x8;

/// How many masters above a NIC discovery follows (a NIC in a bond in a
/// bridge is two); more means a loop in what the kernel said.
const MAX_MASTER_DEPTH: usize = 8;

/// Whether `link` is a NIC to advertise: not loopback, and either without
/// `IFLA_INFO_KIND` (a physical NIC), a bond, or of one of `extra_kinds`
/// (e.g. `veth` on test nodes). Whether a macvtap fits on it is
/// [`crate::core::nic::master::receive_path_owner`]'s question.
pub(crate) fn is_nic(link: &Link, extra_kinds: &[String]) -> bool {
    if link.flags & IFF_LOOPBACK != 0 {
        return false;
    }
    match link.kind.as_deref() {
        None => true,
        Some("bond") => true,
        Some(k) => extra_kinds.iter().any(|e| e == k),
    }
}

/// What auto-discovery found: the links to advertise, and the NICs left
/// out with the reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Names of links that get a resource, in the kernel's order.
    pub advertise: Vec<String>,
    /// NICs left out, with why (a sentence).
    pub left_out: BTreeMap<String, String>,
    /// Advertised NICs with a global address that `--discover-include`
    /// names, with the address (a phrase).
    pub included: BTreeMap<String, String>,
    /// The left-out links the node uses itself (the `spare` policy's).
    pub node_uses: Vec<String>,
}

/// Decides which links auto-discovery advertises: every NIC ([`is_nic`])
/// that no master owns; for a NIC that a bridge or bond owns, that master
/// instead (following masters upwards, so a NIC in a bond in a bridge gives
/// the bridge); nothing for a NIC that Open vSwitch or another master owns.
/// A link whose name is not a valid resource name is left out too.
pub(crate) fn plan(links: &[Link], extra_kinds: &[String]) -> Plan {
    let mut p = Plan::default();
    for nic in links.iter().filter(|l| is_nic(l, extra_kinds)) {
        let mut cur = nic;
        for _ in 0..MAX_MASTER_DEPTH {
            let Some(owner) = receive_path_owner(cur, links) else {
                if let Err(e) = check_resource_name(&cur.name) {
                    p.left_out.insert(
                        cur.name.clone(),
                        format!("its name is not a valid resource name: {e}"),
                    );
                } else if !p.advertise.contains(&cur.name) {
                    p.advertise.push(cur.name.clone());
                }
                break;
            };
            let master = cur
                .master
                .and_then(|m| links.iter().find(|l| l.index == m))
                .filter(|_| owner.master_carries_macvtap());
            match master {
                Some(m) => {
                    p.left_out.insert(
                        cur.name.clone(),
                        format!(
                            "{}, which takes its frames; {} is advertised in its place",
                            owner.relation(),
                            m.name
                        ),
                    );
                    cur = m;
                }
                None => {
                    p.left_out.insert(cur.name.clone(), owner.to_string());
                    break;
                }
            }
        }
    }
    p
}

/// Under the `spare` policy, moves every advertised link of `plan` that the
/// node uses itself (`net`, among `links`) to its left-out ones, saying why
/// and how to serve it: one with a global address stays advertised when
/// `include` names it (noted in `included`), one that a default route
/// leaves through or that holds the Node's InternalIP never does.
pub(crate) fn leave_out_used(plan: &mut Plan, links: &[Link], net: &NodeNet, include: &[String]) {
    let used = uses(links, net);
    let mut kept = Vec::new();
    for name in std::mem::take(&mut plan.advertise) {
        let named = include.contains(&name);
        let Some(u) = links
            .iter()
            .find(|l| l.name == name)
            .and_then(|l| used.get(&l.index))
        else {
            kept.push(name);
            continue;
        };
        if u.only_by_configuration() || !named {
            plan.node_uses.push(name.clone());
        }
        if u.only_by_configuration() {
            let include_note = if named {
                " (--discover-include names it, but cannot serve such a NIC)"
            } else {
                ""
            };
            plan.left_out.insert(
                name.clone(),
                format!(
                    "{name} {u}, so VMs on it would sit on the node's own network with MACs of their \
                     choosing; to serve it anyway, name it in the configuration (an entry \
                     {{\"name\":\"{name}\"}} in the ConfigMap){include_note}"
                ),
            );
        } else if named {
            plan.included.insert(name.clone(), u.to_string());
            kept.push(name);
        } else {
            plan.left_out.insert(
                name.clone(),
                format!(
                    "{name} {u}, so the node itself is on its network; to serve it, name it in \
                     --discover-include (MACVTAP_DISCOVER_INCLUDE) or in the configuration"
                ),
            );
        }
    }
    plan.advertise = kept;
}

/// The resources auto-discovery makes, and the links it leaves out because
/// the node uses them (a resource served on one is withdrawn, not kept).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Discovered {
    /// One resource per advertised link.
    pub resources: Vec<ResourceConfig>,
    /// The left-out links the node uses itself.
    pub node_uses: Vec<String>,
}

/// What auto-discovery decided of the NICs the node uses itself, as the
/// Event about it says it: those it leaves out, with why, and the links it
/// advertises. (A NIC a master owns is only logged: with `--discover-kinds
/// veth` every pod's veth is one, and would make an Event per pod.)
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Report {
    /// The advertised links, in the kernel's order.
    pub advertise: Vec<String>,
    /// The NICs left out because the node uses them, with why and how to
    /// serve them.
    pub left_out: BTreeMap<String, String>,
}

/// Auto-discovery with memory: it logs each left-out link once, and again
/// only when the reason changes or after the link was advertised or gone;
/// and it keeps a [`Report`] for an Event each time the NICs it leaves out
/// because the node uses them (or their reasons) change.
#[derive(Debug, Default)]
pub(crate) struct Discovery {
    extra_kinds: Vec<String>,
    include: Vec<String>,
    logged: Mutex<BTreeMap<String, String>>,
    /// The left-out NICs last reported, and a report not taken yet.
    reported: Mutex<(BTreeMap<String, String>, Option<Report>)>,
}

impl Discovery {
    /// Discovery that also counts links of `extra_kinds` as NICs, and
    /// under the `spare` policy offers the NICs `include` names despite a
    /// global address.
    pub(crate) fn new(extra_kinds: Vec<String>, include: Vec<String>) -> Self {
        Self {
            extra_kinds,
            include,
            ..Self::default()
        }
    }

    /// The link kinds counted as NICs besides physical NICs and bonds.
    pub(crate) fn extra_kinds(&self) -> &[String] {
        &self.extra_kinds
    }

    /// What auto-discovery under `policy` finds among `links`, given what
    /// the node uses itself (`net`), without logging.
    pub(crate) fn plan(&self, links: &[Link], policy: DiscoveryPolicy, net: &NodeNet) -> Plan {
        let mut p = plan(links, &self.extra_kinds);
        if policy == DiscoveryPolicy::Spare {
            leave_out_used(&mut p, links, net, &self.include);
        }
        p
    }

    /// The resources auto-discovery under `policy` makes for `links`: one
    /// per advertised link, named after it, bridge mode, capacity 100; and
    /// the links it leaves out because the node uses them. Logs what it
    /// left out that it had not logged yet, and keeps a report when what it
    /// leaves out changed ([`Discovery::take_report`]).
    pub(crate) fn discover(
        &self,
        links: &[Link],
        policy: DiscoveryPolicy,
        net: &NodeNet,
    ) -> Discovered {
        let plan = self.plan(links, policy, net);
        for (ifname, reason) in self.newly_left_out(&plan) {
            info!(%ifname, "auto-discovery leaves {ifname} out: {reason}");
        }
        for (ifname, address) in &plan.included {
            info!(%ifname, "auto-discovery serves {ifname} though it {address}: --discover-include names it");
        }
        self.note(&plan);
        Discovered {
            resources: plan
                .advertise
                .iter()
                .map(|n| ResourceConfig::for_nic(n))
                .collect(),
            node_uses: plan.node_uses,
        }
    }

    /// Keeps a report of `plan` when the NICs it leaves out because the
    /// node uses them, or why, differ from the last report's.
    fn note(&self, plan: &Plan) {
        let used: BTreeMap<String, String> = plan
            .left_out
            .iter()
            .filter(|(n, _)| plan.node_uses.contains(n))
            .map(|(n, w)| (n.clone(), w.clone()))
            .collect();
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        if reported.0 != used {
            reported.0 = used.clone();
            reported.1 = Some(Report {
                advertise: plan.advertise.clone(),
                left_out: used,
            });
        }
    }

    /// The report kept since the last call, if the NICs auto-discovery
    /// leaves out changed meanwhile.
    pub(crate) fn take_report(&self) -> Option<Report> {
        self.reported
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .take()
    }

    /// Whether a change of the links `changed` (their old and new states)
    /// can change what discovery finds among `links` (the state after): one
    /// of them is or was a NIC, or is a master above a NIC.
    pub(crate) fn concerned_by(&self, changed: &[&Link], links: &[Link]) -> bool {
        if changed.iter().any(|l| is_nic(l, &self.extra_kinds)) {
            return true;
        }
        let is_changed = |index: u32| changed.iter().any(|c| c.index == index);
        links
            .iter()
            .filter(|l| is_nic(l, &self.extra_kinds))
            .any(|nic| {
                let mut master = nic.master;
                for _ in 0..MAX_MASTER_DEPTH {
                    let Some(m) = master else {
                        return false;
                    };
                    if is_changed(m) {
                        return true;
                    }
                    master = links.iter().find(|l| l.index == m).and_then(|l| l.master);
                }
                false
            })
    }

    /// The left-out links of `plan` not yet logged with this reason; forgets
    /// links no longer left out.
    fn newly_left_out(&self, plan: &Plan) -> Vec<(String, String)> {
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        logged.retain(|name, _| plan.left_out.contains_key(name));
        let mut new = Vec::new();
        for (name, reason) in &plan.left_out {
            if logged.get(name) != Some(reason) {
                logged.insert(name.clone(), reason.clone());
                new.push((name.clone(), reason.clone()));
            }
        }
        new
    }
}

/// The resources auto-discovery makes for `links`, without logging: see
/// [`plan`] and [`Discovery::discover`].
#[cfg(test)]
pub(crate) fn discover(links: &[Link], extra_kinds: &[String]) -> Vec<ResourceConfig> {
    plan(links, extra_kinds)
        .advertise
        .iter()
        .map(|n| ResourceConfig::for_nic(n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, kind: Option<&str>, flags: u32) -> Link {
        Link {
            name: name.into(),
            kind: kind.map(String::from),
            flags,
            ..Default::default()
        }
    }

    /// Links with indexes 1.. in order, and `(port, master)` pairs.
    fn layout(links: &[(&str, Option<&str>)], masters: &[(&str, &str)]) -> Vec<Link> {
        let mut out: Vec<Link> = links
            .iter()
            .enumerate()
            .map(|(i, (name, kind))| Link {
                index: i as u32 + 1,
                ..link(name, *kind, 0)
            })
            .collect();
        for (port, master) in masters {
            let m = out.iter().find(|l| l.name == *master).unwrap().index;
            out.iter_mut().find(|l| l.name == *port).unwrap().master = Some(m);
        }
        out
    }

    fn advertised(links: &[Link], extra: &[&str]) -> Vec<String> {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        plan(links, &extra).advertise
    }

    #[test]
    fn physical_nics_and_bonds_are_found_others_not() {
        let links = [
            link("lo", None, IFF_LOOPBACK),
            link("eth0", None, 0),
            link("bond0", Some("bond"), 0),
            link("veth1", Some("veth"), 0),
            link("mvt000000000000", Some("macvtap"), 0),
            link("br0", Some("bridge"), 0),
        ];
        let names: Vec<_> = discover(&links, &[]).into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["eth0", "bond0"]);
        let names: Vec<_> = discover(&links, &["veth".into()])
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["eth0", "bond0", "veth1"]);
        assert_eq!(discover(&links, &[])[0], ResourceConfig::for_nic("eth0"));
    }

    #[test]
    fn auto_discovery_never_chooses_passthru() {
        use macvtap_link::MacvtapMode;
        // Not even for a NIC that carries a passthru macvtap already (health
        // then calls the bridge-mode resource Unhealthy, naming it).
        let mut links = layout(&[("eth0", None), ("mvtpt", Some("macvtap"))], &[]);
        links[1].lower_index = Some(1);
        links[1].macvtap_mode = Some(MacvtapMode::Passthru);
        let found = discover(&links, &[]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].mode, MacvtapMode::Bridge);
        assert_eq!(found[0].capacity, crate::config::DEFAULT_CAPACITY);
        assert_eq!(
            crate::core::nic::health::resource_health(&found[0], &links).reason(),
            "nic_port_in_the_way"
        );
    }

    #[test]
    fn a_bridge_port_gives_way_to_its_bridge() {
        let links = layout(
            &[
                ("eth0", None),
                ("eth1", None),
                ("br0", Some("bridge")),
                ("docker0", Some("bridge")),
                ("vethA", Some("veth")),
            ],
            &[("eth0", "br0"), ("vethA", "docker0")],
        );
        assert_eq!(advertised(&links, &[]), ["br0", "eth1"]);
        let p = plan(&links, &[]);
        assert_eq!(
            p.left_out["eth0"],
            "eth0 is a port of bridge br0, which takes its frames; br0 is advertised in its place"
        );
        // A bridge that holds no NIC is not an uplink (docker0, virbr0).
        assert!(!p.advertise.contains(&"docker0".to_string()));
        // With veth counted as NICs, docker0 holds one.
        assert_eq!(advertised(&links, &["veth"]), ["br0", "eth1", "docker0"]);
    }

    #[test]
    fn bond_slaves_give_way_to_the_bond_and_a_bond_to_its_bridge() {
        let links = layout(
            &[
                ("eth0", None),
                ("eth1", None),
                ("bond0", Some("bond")),
                ("eth2", None),
                ("eth3", None),
                ("bond1", Some("bond")),
                ("br1", Some("bridge")),
            ],
            &[
                ("eth0", "bond0"),
                ("eth1", "bond0"),
                ("eth2", "bond1"),
                ("eth3", "bond1"),
                ("bond1", "br1"),
            ],
        );
        assert_eq!(advertised(&links, &[]), ["bond0", "br1"]);
        let p = plan(&links, &[]);
        assert!(p.left_out["eth0"].starts_with("eth0 is a slave of bond bond0"));
        assert!(p.left_out["bond1"].starts_with("bond1 is a port of bridge br1"));
        assert_eq!(p.left_out.len(), 5, "{p:?}");
    }

    #[test]
    fn team_ports_give_way_to_the_team() {
        let links = layout(
            &[("eth0", None), ("team0", Some("team"))],
            &[("eth0", "team0")],
        );
        // A team is not a NIC by itself (the Go rule), but one holding a
        // NIC is advertised like a bond.
        assert_eq!(advertised(&links, &[]), ["team0"]);
        let links = layout(&[("team0", Some("team"))], &[]);
        assert!(advertised(&links, &[]).is_empty());
    }

    #[test]
    fn ovs_ports_are_left_out_and_nothing_takes_their_place() {
        let links = layout(
            &[
                ("eth0", None),
                ("ovs-system", Some("openvswitch")),
                ("br-ex", Some("openvswitch")),
                ("eth1", None),
            ],
            &[("eth0", "ovs-system")],
        );
        assert_eq!(advertised(&links, &[]), ["eth1"]);
        let p = plan(&links, &[]);
        assert_eq!(
            p.left_out["eth0"],
            "eth0 is a port of Open vSwitch (datapath ovs-system), and a macvtap needs a NIC \
             that no bridge, bond or OVS owns; use a NIC that Open vSwitch does not own"
        );
    }

    #[test]
    fn a_bridge_that_is_an_ovs_port_is_not_advertised_either() {
        let links = layout(
            &[
                ("eth0", None),
                ("br0", Some("bridge")),
                ("ovs-system", Some("openvswitch")),
            ],
            &[("eth0", "br0"), ("br0", "ovs-system")],
        );
        assert!(advertised(&links, &[]).is_empty());
        let p = plan(&links, &[]);
        assert!(p.left_out["br0"].contains("Open vSwitch"), "{p:?}");
    }

    #[test]
    fn vrf_ports_keep_their_receive_path() {
        let links = layout(
            &[("eth0", None), ("blue", Some("vrf"))],
            &[("eth0", "blue")],
        );
        assert_eq!(advertised(&links, &[]), ["eth0"]);
        assert_eq!(receive_path_owner(&links[0], &links), None);
    }

    #[test]
    fn a_master_without_kind_owns_its_port() {
        // virtio's net_failover: the standby NIC's master has no kind, and
        // is a NIC itself.
        let links = layout(
            &[("ens3", None), ("ens3nsby", None)],
            &[("ens3nsby", "ens3")],
        );
        assert_eq!(advertised(&links, &[]), ["ens3"]);
        let p = plan(&links, &[]);
        assert_eq!(
            p.left_out["ens3nsby"],
            "ens3nsby is enslaved to ens3, and a macvtap needs a NIC that no bridge, bond or OVS \
             owns; use a NIC without a master, or release ens3nsby from ens3"
        );
    }

    #[test]
    fn the_allocate_message_names_master_and_fix() {
        let links = layout(
            &[("nicA", None), ("br0", Some("bridge"))],
            &[("nicA", "br0")],
        );
        let owner = receive_path_owner(&links[0], &links).unwrap();
        assert_eq!(
            owner.to_string(),
            "nicA is a port of bridge br0, and a macvtap needs a NIC that no bridge, bond or OVS \
             owns; use br0 as lowerDevice"
        );
    }

    #[test]
    fn a_master_loop_ends() {
        let links = layout(
            &[("a", Some("bridge")), ("b", Some("bridge")), ("eth0", None)],
            &[("eth0", "a"), ("a", "b"), ("b", "a")],
        );
        assert!(advertised(&links, &[]).is_empty());
    }

    #[test]
    fn discovery_is_concerned_by_nics_and_masters_above_them_only() {
        let links = layout(
            &[
                ("eth0", None),
                ("bond0", Some("bond")),
                ("br0", Some("bridge")),
                ("cni0", Some("bridge")),
                ("veth1", Some("veth")),
            ],
            &[("eth0", "bond0"), ("bond0", "br0"), ("veth1", "cni0")],
        );
        let d = Discovery::new(Vec::new(), Vec::new());
        let by = |name: &str| links.iter().find(|l| l.name == name).unwrap();
        assert!(d.concerned_by(&[by("eth0")], &links));
        assert!(d.concerned_by(&[by("br0")], &links), "two masters up");
        assert!(!d.concerned_by(&[by("veth1")], &links));
        assert!(!d.concerned_by(&[by("cni0")], &links), "holds no NIC");
        // With veth counted as NICs, both are.
        let d = Discovery::new(vec!["veth".into()], Vec::new());
        assert!(d.concerned_by(&[by("veth1")], &links));
        assert!(d.concerned_by(&[by("cni0")], &links));
    }

    #[test]
    fn left_out_links_are_logged_once_per_reason() {
        let d = Discovery::new(Vec::new(), Vec::new());
        let mut links = layout(
            &[("eth0", None), ("br0", Some("bridge"))],
            &[("eth0", "br0")],
        );
        let first = d.newly_left_out(&plan(&links, &[]));
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].0, "eth0");
        assert!(d.newly_left_out(&plan(&links, &[])).is_empty());
        // Released and enslaved again: said again.
        links[0].master = None;
        assert!(d.newly_left_out(&plan(&links, &[])).is_empty());
        links[0].master = Some(2);
        assert_eq!(d.newly_left_out(&plan(&links, &[])).len(), 1);
        // A different reason is said too.
        links[1].kind = Some("openvswitch".into());
        let again = d.newly_left_out(&plan(&links, &[]));
        assert!(again[0].1.contains("Open vSwitch"), "{again:?}");
    }

    fn global(index: u32, ip: &str) -> macvtap_link::Address {
        macvtap_link::Address {
            index,
            ip: ip.parse().unwrap(),
            prefix_len: 24,
            global: true,
        }
    }

    fn default_route(oif: u32) -> macvtap_link::DefaultRoute {
        macvtap_link::DefaultRoute {
            ipv6: false,
            table: macvtap_link::DefaultRoute::MAIN_TABLE,
            oifs: vec![oif],
            nexthop_id: None,
        }
    }

    /// A node as most are: eth0 is its own (the default route, the
    /// InternalIP), eth1 has no address, eth2 an address of a storage
    /// network, eth3 in br3, which holds an address.
    fn a_usual_node() -> (Vec<Link>, NodeNet) {
        let mut links = layout(
            &[
                ("eth0", None),
                ("eth1", None),
                ("eth2", None),
                ("eth3", None),
                ("br3", Some("bridge")),
            ],
            &[("eth3", "br3")],
        );
        links.iter_mut().for_each(|l| l.oper_state = "up".into());
        let net = NodeNet {
            addressing: crate::core::nic::usage::Addressing {
                addresses: vec![
                    global(1, "192.0.2.10"),
                    global(3, "198.51.100.3"),
                    global(5, "203.0.113.5"),
                ],
                default_routes: vec![default_route(1)],
            },
            internal_ips: Some(vec!["192.0.2.10".parse().unwrap()]),
        };
        (links, net)
    }

    #[test]
    fn spare_discovery_offers_only_nics_the_node_does_not_use() {
        let (links, net) = a_usual_node();
        let d = Discovery::new(Vec::new(), Vec::new());
        let p = d.plan(&links, DiscoveryPolicy::Spare, &net);
        assert_eq!(p.advertise, ["eth1"]);
        assert_eq!(
            p.left_out["eth0"],
            "eth0 carries the IPv4 default route, so VMs on it would sit on the node's own \
             network with MACs of their choosing; to serve it anyway, name it in the \
             configuration (an entry {\"name\":\"eth0\"} in the ConfigMap)"
        );
        assert_eq!(
            p.left_out["eth2"],
            "eth2 has the global address 198.51.100.3/24, so the node itself is on its network; \
             to serve it, name it in --discover-include (MACVTAP_DISCOVER_INCLUDE) or in the \
             configuration"
        );
        assert!(
            p.left_out["br3"].starts_with("br3 has the global address 203.0.113.5/24"),
            "{p:?}"
        );
        assert!(
            p.left_out["eth3"].contains("br3 is advertised in its place"),
            "{p:?}"
        );
        // The Go project's policy offers them all.
        let all = d.plan(&links, DiscoveryPolicy::All, &net);
        assert_eq!(all.advertise, ["eth0", "eth1", "eth2", "br3"]);
        assert_eq!(all.left_out.len(), 1, "only the bridge port: {all:?}");
    }

    #[test]
    fn include_serves_a_nic_with_an_address_but_never_the_nodes_own() {
        let (links, net) = a_usual_node();
        let d = Discovery::new(Vec::new(), vec!["eth2".into(), "eth0".into()]);
        let p = d.plan(&links, DiscoveryPolicy::Spare, &net);
        assert_eq!(p.advertise, ["eth1", "eth2"]);
        assert_eq!(p.included["eth2"], "has the global address 198.51.100.3/24");
        assert!(
            p.left_out["eth0"]
                .ends_with("(--discover-include names it, but cannot serve such a NIC)"),
            "{p:?}"
        );
        // The InternalIP alone is as binding as a default route.
        let mut net = net;
        net.addressing.default_routes.clear();
        let d = Discovery::new(Vec::new(), vec!["eth0".into()]);
        let p = d.plan(&links, DiscoveryPolicy::Spare, &net);
        assert!(
            p.left_out["eth0"].starts_with("eth0 holds the Node's InternalIP 192.0.2.10, so VMs"),
            "{p:?}"
        );
        // Not knowing the InternalIP, its address still keeps eth0 out,
        // but now --discover-include can serve it.
        net.internal_ips = None;
        let p = d.plan(&links, DiscoveryPolicy::Spare, &net);
        assert!(p.advertise.contains(&"eth0".to_string()), "{p:?}");
    }

    #[test]
    fn a_default_route_on_a_vlan_keeps_its_nic_out() {
        let mut links = layout(
            &[("eth0", None), ("eth0.100", Some("vlan")), ("eth1", None)],
            &[],
        );
        links[1].lower_index = Some(1);
        let net = NodeNet {
            addressing: crate::core::nic::usage::Addressing {
                addresses: vec![],
                default_routes: vec![default_route(2)],
            },
            internal_ips: None,
        };
        let d = Discovery::new(Vec::new(), Vec::new());
        let p = d.plan(&links, DiscoveryPolicy::Spare, &net);
        assert_eq!(p.advertise, ["eth1"]);
        assert!(
            p.left_out["eth0"].starts_with("eth0 carries the IPv4 default route (on eth0.100), so"),
            "{p:?}"
        );
    }

    #[test]
    fn a_report_is_kept_when_what_is_left_out_changes() {
        let (links, mut net) = a_usual_node();
        let d = Discovery::new(Vec::new(), Vec::new());
        d.discover(&links, DiscoveryPolicy::Spare, &net);
        let first = d.take_report().expect("a first report");
        assert_eq!(first.advertise, ["eth1"]);
        assert_eq!(
            first.left_out.keys().collect::<Vec<_>>(),
            ["br3", "eth0", "eth2"],
            "not eth3, which its bridge owns"
        );
        assert_eq!(d.take_report(), None, "taken");
        d.discover(&links, DiscoveryPolicy::Spare, &net);
        assert_eq!(d.take_report(), None, "nothing changed");
        // eth1 gets an address: it is left out too.
        net.addressing.addresses.push(global(2, "192.0.2.99"));
        d.discover(&links, DiscoveryPolicy::Spare, &net);
        let second = d.take_report().expect("a second report");
        assert!(second.advertise.is_empty());
        assert!(second.left_out.contains_key("eth1"));
    }
}
