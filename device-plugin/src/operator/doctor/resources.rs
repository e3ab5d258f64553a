//! Each resource the daemon serves: its lower NIC (present, up, free), its
//! mode and capacity, the devices pods hold per the kubelet's PodResources
//! API, and the macvtap links on the node that no pod holds; under
//! auto-discovery, the NICs it leaves out, why and how to serve them; for
//! an entry with a NIC or node selector, whether this node serves it, on
//! which NIC, and why the NICs passed over did not match.

use super::{Finding, TIMEOUT};
use crate::config::{DiscoveryPolicy, ResourceConfig, Resources};
use crate::core::nic::discovery::Discovery;
use crate::core::nic::health::{NicHealth, resource_health};
use crate::core::nic::select::{Labels, Placed, Placements, place_all};
use crate::core::nic::usage::{Addressing, NodeNet};
use crate::core::reclaim::{Held, go_era_leaked_links, leaked_links};
use crate::operator::node::{NodeView, read_once};
use crate::options::{Options, load_config};
use macvtap_link::device::parse_device_id;
use macvtap_link::{Handle, Link, Links};
use std::collections::{BTreeMap, HashSet};

/// The resources found and what was said of them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Gathered {
    /// The resources the daemon serves with these options on this node.
    pub configs: Vec<ResourceConfig>,
    /// The findings.
    pub findings: Vec<Finding>,
}

/// Loads the configuration `opts` names, lists the links of the calling
/// thread's namespace and checks every resource; `held` is what pods hold,
/// when the kubelet could be asked. Under `spare` auto-discovery it reads
/// the node's addresses and default routes, and its Node's InternalIP
/// from the API server (`NODE_NAME`, the pod's service account).
pub(crate) async fn gather(opts: &Options, held: Option<&Held>) -> Gathered {
    let resolved = match load_config(opts) {
        Ok((r, _)) => r,
        Err(e) => {
            return Gathered {
                configs: Vec::new(),
                findings: vec![Finding::problem(
                    "config",
                    format!("the configuration is invalid, so the daemon serves nothing: {e}"),
                )],
            };
        }
    };
    let read = Handle::current().and_then(|h| {
        let links = h.list_links()?;
        let spare = matches!(
            resolved.resources,
            Resources::AutoDiscover(DiscoveryPolicy::Spare)
        );
        let addressing = if spare {
            Addressing {
                addresses: h.list_addresses()?,
                default_routes: h.list_default_routes()?,
            }
            .relevant()
        } else {
            Addressing::default()
        };
        Ok((links, spare, addressing))
    });
    let (links, spare, addressing) = match read {
        Ok(r) => r,
        Err(e) => {
            return Gathered {
                configs: Vec::new(),
                findings: vec![Finding::problem(
                    "links",
                    format!("the node's links, addresses or routes cannot be listed: {e}"),
                )],
            };
        }
    };
    let mut findings = vec![Finding::ok(
        "config",
        format!(
            "the configuration comes from {}: {}",
            resolved.source, resolved.resources
        ),
    )];
    let mut net = NodeNet {
        addressing,
        internal_ips: None,
    };
    let labelled = matches!(&resolved.resources, Resources::Static(list)
        if list.iter().any(ResourceConfig::has_node_selector));
    let view = if spare || labelled {
        read_once(opts.node_name.as_deref(), TIMEOUT).await
    } else {
        NodeView::NotAsked
    };
    match &view {
        NodeView::Known(f) => net.internal_ips = Some(f.internal_ips.clone()),
        NodeView::Unknown(why) if spare => findings.push(Finding::warning(
            "discovery",
            format!(
                "our Node's InternalIP is unknown ({why}), so auto-discovery cannot tell which \
                 NIC holds it; NICs with a global address or a default route are left out all \
                 the same"
            ),
        )),
        NodeView::Unknown(_) | NodeView::NotAsked => {}
    }
    let labels = match &view {
        NodeView::Known(f) => Labels::Known(&f.labels),
        NodeView::Unknown(why) => Labels::Unknown(why),
        NodeView::NotAsked => Labels::Unknown("not read"),
    };
    let discovery = Discovery::new(opts.discover_kinds.clone(), opts.discover_include.clone());
    let configs = configured(
        &resolved.resources,
        &Seen {
            links: &links,
            net: &net,
            labels,
            sysfs: &opts.sysfs,
        },
        &discovery,
        &opts.discover_include,
        &mut findings,
    );
    let allocated = held.map(|h| h.ids(&configs));
    let allocated = allocated.as_ref();
    findings.extend(check_resources(&configs, &links, allocated));
    if let Some(allocated) = allocated {
        findings.extend(check_leaked(
            &configs,
            &links,
            allocated,
            opts.reclaim_grace,
        ));
    }
    Gathered { configs, findings }
}

/// What `doctor` read of the node for [`configured`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen<'a> {
    /// The node's links.
    pub links: &'a [Link],
    /// What the node uses of them itself.
    pub net: &'a NodeNet,
    /// The Node's labels.
    pub labels: Labels<'a>,
    /// Where sysfs is.
    pub sysfs: &'a std::path::Path,
}

/// The resources `resources` makes on the node `seen`: the configured ones
/// this node serves, each on its NIC (an entry with a NIC or node selector
/// said as a `placement` finding: on which NIC and what was passed over,
/// or why this node does not serve it: `ok` for its node selector, a
/// warning when no NIC matches or the labels are unknown); or what
/// `discovery` advertises given what the node uses itself; each NIC it
/// leaves out, and each it serves only because `include`
/// (`--discover-include`) names it, is said as an `ok` finding into
/// `findings`, and a name in `include` that auto-discovery does not find
/// as a warning.
pub(crate) fn configured(
    resources: &Resources,
    seen: &Seen<'_>,
    discovery: &Discovery,
    include: &[String],
    findings: &mut Vec<Finding>,
) -> Vec<ResourceConfig> {
    let (links, net) = (seen.links, seen.net);
    match resources {
        Resources::Static(list) => {
            let placed = place_all(
                list,
                links,
                discovery.extra_kinds(),
                seen.labels,
                seen.sysfs,
                &Placements::default(),
            );
            let mut out = Vec::new();
            for (cfg, p) in list.iter().zip(placed) {
                let resource = cfg.resource_name();
                match p {
                    Placed::Here(c, why) => {
                        if cfg.placement.is_some() {
                            findings.push(Finding::ok(
                                "placement",
                                format!("{resource} is served on this node {why}"),
                            ));
                        }
                        out.push(c);
                    }
                    Placed::NotHere(why) => {
                        let level = if matches!(seen.labels, Labels::Unknown(_)) {
                            super::Level::Warning
                        } else {
                            super::Level::Ok
                        };
                        findings.push(Finding::new(
                            level,
                            "placement",
                            format!("{resource} is not served on this node: {why}"),
                        ));
                    }
                    Placed::NoNic(why) => findings.push(Finding::warning(
                        "placement",
                        format!("{resource} is not served on this node: {why}"),
                    )),
                }
            }
            out
        }
        Resources::AutoDiscover(policy) => {
            let plan = discovery.plan(links, *policy, net);
            for (nic, why) in &plan.left_out {
                findings.push(Finding::ok(
                    "discovery",
                    format!("auto-discovery leaves {nic} out: {why}"),
                ));
            }
            for (nic, address) in &plan.included {
                findings.push(Finding::ok(
                    "discovery",
                    format!(
                        "auto-discovery serves {nic} though it {address}: --discover-include names it"
                    ),
                ));
            }
            if *policy == DiscoveryPolicy::Spare {
                for name in include.iter().filter(|n| {
                    !plan.advertise.contains(n) && !plan.left_out.contains_key(n.as_str())
                }) {
                    findings.push(Finding::warning(
                        "discovery",
                        format!(
                            "--discover-include names {name}, which auto-discovery does not find \
                             (no NIC of that name, or one --discover-kinds does not count)"
                        ),
                    ));
                }
            }
            plan.advertise
                .iter()
                .map(|n| ResourceConfig::for_nic(n))
                .collect()
        }
    }
}

/// One finding per resource: its NIC's health (a problem unless healthy),
/// and how many of its devices pods hold when `allocated` is known; a
/// problem when there is no resource at all.
pub(crate) fn check_resources(
    configs: &[ResourceConfig],
    links: &[Link],
    allocated: Option<&HashSet<String>>,
) -> Vec<Finding> {
    if configs.is_empty() {
        return vec![Finding::problem(
            "nic",
            "no resource to serve: configure one (--resource, --config or DP_MACVTAP_CONF) or \
             give the node a NIC that auto-discovery finds (the discovery findings above say \
             which NICs it leaves out and how to serve them)",
        )];
    }
    let held = allocated.map(held_per_resource).unwrap_or_default();
    let mut out = Vec::new();
    for cfg in configs {
        let health = resource_health(cfg, links);
        let pods = match allocated {
            Some(_) => {
                let n = held.get(cfg.name.as_str()).copied().unwrap_or(0);
                format!(", pods hold {n} of them")
            }
            None => String::new(),
        };
        out.push(match &health {
            NicHealth::Healthy => Finding::ok(
                "nic",
                format!(
                    "{cfg}{pods}: NIC {} is up and no master owns it",
                    cfg.lower_device
                ),
            ),
            unhealthy => Finding::problem(
                "nic",
                format!("{cfg}{pods}: its devices are Unhealthy because {unhealthy}"),
            ),
        });
        if let Some(&n) = held.get(cfg.name.as_str()).filter(|&&n| n > cfg.capacity) {
            out.push(Finding::warning(
                "capacity",
                format!(
                    "pods hold {n} devices of {} but it advertises only {}",
                    cfg.resource_name(),
                    cfg.capacity
                ),
            ));
        }
    }
    out
}

/// How many devices pods hold, per resource name suffix.
fn held_per_resource(allocated: &HashSet<String>) -> BTreeMap<&str, u32> {
    let mut held = BTreeMap::new();
    for (resource, _) in allocated.iter().filter_map(|id| parse_device_id(id)) {
        *held.entry(resource).or_insert(0) += 1;
    }
    held
}

/// A warning for each macvtap on the node that looks leaked by the
/// reclaimer's rules (held by no pod, per `allocated`), or one `ok`.
pub(crate) fn check_leaked(
    configs: &[ResourceConfig],
    links: &[Link],
    allocated: &HashSet<String>,
    grace: std::time::Duration,
) -> Vec<Finding> {
    let lowers: HashSet<String> = configs.iter().map(|c| c.lower_device.clone()).collect();
    let mut leaked = leaked_links(links, &lowers, allocated);
    for l in go_era_leaked_links(links, configs, allocated) {
        if !leaked.iter().any(|k| k.index == l.index) {
            leaked.push(l);
        }
    }
    if leaked.is_empty() {
        return vec![Finding::ok(
            "leaked-links",
            "every macvtap of ours on the node is held by a pod",
        )];
    }
    leaked
        .iter()
        .map(|l| {
            let lower = l
                .lower_index
                .and_then(|i| links.iter().find(|n| n.index == i))
                .map_or_else(|| "an unknown NIC".to_string(), |n| n.name.clone());
            Finding::warning(
                "leaked-links",
                format!(
                    "macvtap {} on {lower} is held by no pod; the running daemon deletes it \
                     once it has looked so for {} s (--reclaim-grace)",
                    l.name,
                    grace.as_secs()
                ),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::doctor::Level;

    use test_support::fake::nic;

    #[test]
    fn each_nic_state_is_one_sentence() {
        let cfg = [ResourceConfig::for_nic("eth1")];
        let allocated: HashSet<String> = ["eth1Mvp0".to_string(), "eth1Mvp3".to_string()].into();
        let f = check_resources(&cfg, &[nic(2, "eth1", true)], Some(&allocated));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].level, Level::Ok);
        assert_eq!(
            f[0].message,
            "macvtap.network.kubevirt.io/eth1 on NIC eth1 (bridge mode, 100 devices), pods hold \
             2 of them: NIC eth1 is up and no master owns it"
        );
        let f = check_resources(&cfg, &[nic(2, "eth1", false)], None);
        assert_eq!(f[0].level, Level::Problem);
        assert!(f[0].message.contains("lower NIC eth1 is down"), "{f:?}");
        let f = check_resources(&cfg, &[], None);
        assert!(
            f[0].message.contains("lower NIC eth1 does not exist"),
            "{f:?}"
        );
        let br = Link {
            kind: Some("bridge".into()),
            ..nic(3, "br0", true)
        };
        let port = Link {
            master: Some(3),
            ..nic(2, "eth1", true)
        };
        let f = check_resources(&cfg, &[port, br], None);
        assert_eq!(f[0].level, Level::Problem);
        assert!(f[0].message.contains("use br0 as lowerDevice"), "{f:?}");
        assert_eq!(check_resources(&[], &[], None)[0].level, Level::Problem);
    }

    #[test]
    fn discovery_says_what_it_leaves_out_what_it_includes_and_a_name_it_does_not_find() {
        use crate::core::nic::usage::Addressing;
        let links = [
            nic(2, "eth0", true),
            nic(3, "eth1", true),
            nic(4, "eth2", true),
        ];
        let net = NodeNet {
            addressing: Addressing {
                addresses: vec![macvtap_link::Address {
                    index: 4,
                    ip: "198.51.100.2".parse().unwrap(),
                    prefix_len: 24,
                    global: true,
                }],
                default_routes: vec![macvtap_link::DefaultRoute {
                    ipv6: false,
                    table: macvtap_link::DefaultRoute::MAIN_TABLE,
                    oifs: vec![2],
                    nexthop_id: None,
                }],
            },
            internal_ips: None,
        };
        let include = ["eth2".to_string(), "eth9".to_string()];
        let d = Discovery::new(Vec::new(), include.to_vec());
        let seen = Seen {
            links: &links,
            net: &net,
            labels: Labels::Unknown("not read"),
            sysfs: std::path::Path::new("/nonexistent"),
        };
        let mut findings = Vec::new();
        let configs = configured(
            &Resources::AutoDiscover(DiscoveryPolicy::Spare),
            &seen,
            &d,
            &include,
            &mut findings,
        );
        let names: Vec<&str> = configs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["eth1", "eth2"]);
        let said: Vec<(Level, &str)> = findings
            .iter()
            .map(|f| (f.level, f.message.as_str()))
            .collect();
        assert_eq!(said.len(), 3, "{said:?}");
        assert_eq!(said[0].0, Level::Ok);
        assert!(
            said[0]
                .1
                .starts_with("auto-discovery leaves eth0 out: eth0 carries the IPv4 default route"),
            "{said:?}"
        );
        assert_eq!(
            said[1],
            (
                Level::Ok,
                "auto-discovery serves eth2 though it has the global address 198.51.100.2/24: \
                 --discover-include names it"
            )
        );
        assert_eq!(said[2].0, Level::Warning);
        assert!(
            said[2]
                .1
                .starts_with("--discover-include names eth9, which auto-discovery does not find"),
            "{said:?}"
        );
        // The Go project's policy offers all three and says nothing.
        let mut findings = Vec::new();
        let configs = configured(
            &Resources::AutoDiscover(DiscoveryPolicy::All),
            &seen,
            &d,
            &include,
            &mut findings,
        );
        assert_eq!(configs.len(), 3);
        assert!(findings.is_empty(), "{findings:?}");
    }

    #[test]
    fn placement_says_which_nic_each_selected_entry_took_and_why_not_elsewhere() {
        use crate::placement::{NicSelector, Placement};
        use std::collections::BTreeMap;
        let sysfs = tempfile::tempdir().unwrap();
        for (name, driver) in [("eth0", "e1000e"), ("ens5f0", "ixgbe")] {
            let dev = sysfs.path().join("class/net").join(name).join("device");
            std::fs::create_dir_all(&dev).unwrap();
            let d = sysfs.path().join("bus/pci/drivers").join(driver);
            std::fs::create_dir_all(&d).unwrap();
            std::os::unix::fs::symlink(&d, dev.join("driver")).unwrap();
        }
        let links = [nic(2, "eth0", true), nic(3, "ens5f0", true)];
        let selected = |name: &str, driver: &str, nodes: &[(&str, &str)]| ResourceConfig {
            lower_device: String::new(),
            placement: Some(Placement {
                nic: Some(NicSelector {
                    driver: Some(driver.into()),
                    ..Default::default()
                }),
                nodes: nodes
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }),
            ..ResourceConfig::for_nic(name)
        };
        let list = vec![
            selected("dp", "ixgbe", &[]),
            selected("other", "ice", &[]),
            selected("web", "ixgbe", &[("role", "web")]),
            ResourceConfig::for_nic("eth0"),
        ];
        let labels = BTreeMap::from([("role".to_string(), "dp".to_string())]);
        let net = NodeNet::default();
        let seen = Seen {
            links: &links,
            net: &net,
            labels: Labels::Known(&labels),
            sysfs: sysfs.path(),
        };
        let mut findings = Vec::new();
        let configs = configured(
            &Resources::Static(list),
            &seen,
            &Discovery::default(),
            &[],
            &mut findings,
        );
        let on: Vec<(&str, &str)> = configs
            .iter()
            .map(|c| (c.name.as_str(), c.lower_device.as_str()))
            .collect();
        assert_eq!(on, [("dp", "ens5f0"), ("eth0", "eth0")]);
        let said: Vec<(Level, &str)> = findings
            .iter()
            .map(|f| (f.level, f.message.as_str()))
            .collect();
        assert_eq!(
            said,
            [
                (
                    Level::Ok,
                    "macvtap.network.kubevirt.io/dp is served on this node on NIC ens5f0, the \
                     first NIC with driver ixgbe; passed over eth0 (its driver is e1000e, not \
                     ixgbe)"
                ),
                (
                    Level::Warning,
                    "macvtap.network.kubevirt.io/other is not served on this node: no NIC on \
                     this node is the first NIC with driver ice: eth0 (its driver is e1000e, not \
                     ice), ens5f0 (its driver is ixgbe, not ice)"
                ),
                (
                    Level::Ok,
                    "macvtap.network.kubevirt.io/web is not served on this node: this node is \
                     not one its nodeSelector role=web selects: its label role is \"dp\", not \
                     \"web\""
                ),
            ]
        );
    }

    #[test]
    fn more_held_than_advertised_is_a_warning() {
        let cfg = [ResourceConfig {
            capacity: 1,
            ..ResourceConfig::for_nic("eth1")
        }];
        let allocated: HashSet<String> = ["eth1Mvp0".to_string(), "eth1Mvp1".to_string()].into();
        let f = check_resources(&cfg, &[nic(2, "eth1", true)], Some(&allocated));
        assert_eq!(f[1].level, Level::Warning, "{f:?}");
    }
}
