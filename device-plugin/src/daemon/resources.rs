//! The daemon's resources, one of its three parts: the configuration in
//! force, the table of the node's links kept current, what the node uses
//! of them itself (its addresses and default routes, its Node's
//! InternalIP), and each served resource's state as the kubelet sees it.
//! What [`wanted::changes`]
//! decides (which resources are wanted, which changed) is carried out
//! here: for each resource its devices, health and NUMA node published;
//! health changes logged, counted and posted as Events. Which resources
//! came and went is handed on as [`Served`] changes, for the kubelet
//! registrations.

use crate::config::{Resolved, ResourceConfig};
use crate::core::link_table::{LinkDelta, LinkTable, LinkUpdate};
use crate::core::nic::discovery::Discovery;
use crate::core::nic::health::{HealthLog, NicHealth};
use crate::core::nic::select::{Labels, Placements};
use crate::core::nic::topology::numa_node;
use crate::core::nic::usage::{Addressing, NodeNet};
use crate::core::report::Observer;
use crate::core::wanted::{self, Change, Node, Published, Wanted};
use crate::kubelet::devices::device_list;
use crate::kubelet::server::ResourceState;
use crate::operator::events::{EventSink, NodeEvent};
use crate::operator::metrics::Metrics;
use crate::operator::node::NodeView;
use macvtap_link::Link;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::watch;
use tracing::{debug, info};

/// A change of which resources are served, for the kubelet registrations.
#[derive(Debug)]
pub(super) enum Served {
    /// A new resource: serve it from `state` (what ListAndWatch streams)
    /// and register it.
    New {
        /// The resource's name.
        name: String,
        /// Its devices and configuration, kept current.
        state: watch::Receiver<ResourceState>,
    },
    /// A resource no longer wanted: stop serving it.
    Gone {
        /// The resource's name.
        name: String,
    },
}

/// One served resource.
struct Resource {
    /// Devices and config as ListAndWatch streams them.
    state: watch::Sender<ResourceState>,
    /// Made by auto-discovery (kept, unhealthy, when its NIC vanishes).
    discovered: bool,
}

impl Resource {
    /// The resource's configuration.
    fn config(&self) -> ResourceConfig {
        self.state.borrow().config.clone()
    }
}

/// The configuration, the node's links and the served resources' states.
pub(super) struct Resources {
    /// The configuration in force.
    pub(super) resolved: Resolved,
    /// The config file's text as last read, if there is a config file.
    pub(super) file_text: Option<String>,
    /// The node's links, as the link events left them: the one table,
    /// which the link event thread only feeds.
    links: LinkTable,
    /// Auto-discovery, which logs each link it leaves out once.
    discovery: Discovery,
    /// What the node uses of its links itself, kept current.
    net: NodeNet,
    /// What is known of our Node (its labels, for node selectors).
    node: NodeView,
    /// Placement of configured entries, which logs each once.
    placements: Placements,
    /// Each resource's last NIC health, to log and count its changes.
    health: HealthLog,
    /// Each served resource, by name.
    served: BTreeMap<String, Resource>,
    /// The served resources' configurations, for the reclaim loop.
    configs: watch::Sender<Vec<ResourceConfig>>,
    /// Where sysfs is (NUMA nodes).
    sysfs: PathBuf,
    /// Counters: devices per resource, config reloads.
    pub(super) metrics: Arc<Metrics>,
    /// Kubernetes Events on the Node: NIC health, resources added and removed.
    pub(super) events: EventSink,
    /// Where health changes are reported (metrics).
    observer: Arc<dyn Observer>,
}

/// What [`Resources::new`] starts from.
pub(super) struct Start {
    /// The configuration as first read.
    pub(super) resolved: Resolved,
    /// The config file's text, if there is a config file.
    pub(super) file_text: Option<String>,
    /// The node's links, as first read.
    pub(super) links: LinkTable,
    /// Auto-discovery.
    pub(super) discovery: Discovery,
    /// The node's addresses and default routes, as first read.
    pub(super) addressing: Addressing,
    /// Where the served resources' configurations are published.
    pub(super) configs: watch::Sender<Vec<ResourceConfig>>,
    /// Where sysfs is.
    pub(super) sysfs: PathBuf,
}

impl Resources {
    /// No resource served yet; reports go to `metrics`, `events` and
    /// `observer`.
    pub(super) fn new(
        start: Start,
        metrics: Arc<Metrics>,
        events: EventSink,
        observer: Arc<dyn Observer>,
    ) -> Self {
        Self {
            resolved: start.resolved,
            file_text: start.file_text,
            links: start.links,
            discovery: start.discovery,
            net: NodeNet {
                addressing: start.addressing,
                internal_ips: None,
            },
            node: NodeView::NotAsked,
            placements: Placements::default(),
            health: HealthLog::default(),
            served: BTreeMap::new(),
            configs: start.configs,
            sysfs: start.sysfs,
            metrics,
            events,
            observer,
        }
    }

    /// The served resources' configurations.
    pub(super) fn configs(&self) -> Vec<ResourceConfig> {
        self.configs.borrow().clone()
    }

    /// The names of the served resources, in order.
    pub(super) fn names(&self) -> Vec<String> {
        self.served.keys().cloned().collect()
    }

    /// Served resource `name`'s configuration.
    pub(super) fn config_of(&self, name: &str) -> Option<ResourceConfig> {
        self.served.get(name).map(Resource::config)
    }

    /// Links changed: the table (the one table of the node's links) takes
    /// the events in, and health, NUMA and auto-discovered resources
    /// follow, for the resources a real change touches (all of them after
    /// a resync).
    pub(super) fn on_links(&mut self, update: LinkUpdate) -> Vec<Served> {
        match update {
            LinkUpdate::Resync(links) => {
                self.links = LinkTable::new(links);
                self.reconcile()
            }
            LinkUpdate::Events(events) => {
                let deltas: Vec<LinkDelta> =
                    events.iter().filter_map(|e| self.links.apply(e)).collect();
                for d in &deltas {
                    match (&d.before, &d.after) {
                        (_, Some(l)) => debug!(ifname = %l.name, flags = l.flags, "link changed"),
                        (Some(l), None) => debug!(ifname = %l.name, "link removed"),
                        (None, None) => {}
                    }
                }
                if deltas.is_empty() {
                    return Vec::new();
                }
                let changed: Vec<&Link> = deltas.iter().flat_map(|d| d.states()).collect();
                self.reconcile_changed(Some(&changed))
            }
        }
    }

    /// Brings the served resources in line with the configuration and the
    /// links.
    pub(super) fn reconcile(&mut self) -> Vec<Served> {
        self.reconcile_changed(None)
    }

    /// The node's global addresses or default routes changed: what
    /// auto-discovery offers follows.
    pub(super) fn on_addressing(&mut self, addressing: Addressing) -> Vec<Served> {
        if self.net.addressing == addressing {
            return Vec::new();
        }
        debug!("the node's addresses or default routes changed");
        self.net.addressing = addressing;
        self.reconcile()
    }

    /// What is known of our Node changed: what auto-discovery offers
    /// follows its InternalIP, and which entries this node serves its
    /// labels.
    pub(super) fn on_node(&mut self, view: &NodeView) -> Vec<Served> {
        let internal_ips = view.internal_ips();
        if self.node == *view {
            return Vec::new();
        }
        self.node = view.clone();
        if self.net.internal_ips == internal_ips {
            debug!("our Node's labels changed");
            return self.reconcile();
        }
        match (&internal_ips, view) {
            (Some(ips), _) => info!(internal_ips = ?ips, "our Node's InternalIP is known"),
            (None, NodeView::Unknown(why)) => {
                info!(%why, "our Node's InternalIP is unknown: auto-discovery leaves out NICs by their addresses and default routes only")
            }
            (None, _) => {}
        }
        self.net.internal_ips = internal_ips;
        self.reconcile()
    }

    /// Whether the configuration needs our Node read: `spare`
    /// auto-discovery never offers the NIC holding its InternalIP, and a
    /// node selector matches its labels.
    pub(super) fn needs_node(&self) -> bool {
        match &self.resolved.resources {
            crate::config::Resources::AutoDiscover(p) => {
                *p == crate::config::DiscoveryPolicy::Spare
            }
            crate::config::Resources::Static(list) => {
                list.iter().any(ResourceConfig::has_node_selector)
            }
        }
    }

    /// Brings the served resources in line with the configuration and the
    /// links; with `changed` (links that changed), revisits only the
    /// resources that it touches, that are new or whose configuration
    /// differs ([`wanted::changes`]).
    fn reconcile_changed(&mut self, changed: Option<&[&Link]>) -> Vec<Served> {
        let served: Vec<Wanted> = self
            .served
            .values()
            .map(|r| Wanted {
                config: r.config(),
                discovered: r.discovered,
            })
            .collect();
        let labels = match &self.node {
            NodeView::Known(f) => Labels::Known(&f.labels),
            NodeView::Unknown(why) => Labels::Unknown(why),
            NodeView::NotAsked => Labels::Unknown("not read yet"),
        };
        let node = Node {
            resources: &self.resolved.resources,
            discovery: &self.discovery,
            links: &self.links,
            net: &self.net,
            labels,
            placements: &self.placements,
            sysfs: &self.sysfs,
        };
        let mut out = Vec::new();
        for change in wanted::changes(node, &served, changed) {
            match change {
                Change::Removed(name) => out.extend(self.remove(&name)),
                Change::Added(p) | Change::Updated(p) => out.extend(self.apply(p)),
            }
        }
        if let Some(report) = self.discovery.take_report() {
            self.events.post(NodeEvent::NicsLeftOut {
                served: report.advertise,
                left_out: report.left_out.into_values().collect(),
            });
        }
        let configs: Vec<ResourceConfig> = self.served.values().map(Resource::config).collect();
        self.configs.send_if_modified(|cur| {
            if *cur == configs {
                false
            } else {
                *cur = configs;
                true
            }
        });
        out
    }

    /// Stops serving a resource that is no longer wanted.
    fn remove(&mut self, name: &str) -> Option<Served> {
        let r = self.served.remove(name)?;
        let resource = r.config().resource_name();
        info!(%resource, "resource removed");
        self.metrics.resource_removed(&resource);
        self.health.forget(&resource);
        Some(Served::Gone {
            name: name.to_string(),
        })
    }

    /// Publishes a wanted resource's devices, health and NUMA node; a new
    /// one is served from now on.
    fn apply(&mut self, published: Published) -> Option<Served> {
        let Published {
            wanted: Wanted {
                config: cfg,
                discovered,
            },
            health,
        } = published;
        let lower = self.links.by_name(&cfg.lower_device);
        let healthy = health.is_healthy();
        let numa = lower.and_then(|_| numa_node(&self.sysfs, &cfg.lower_device));
        let state = ResourceState {
            devices: device_list(&cfg.name, cfg.capacity, healthy, numa),
            config: cfg.clone(),
        };
        let resource = cfg.resource_name();
        self.health_changed(&cfg, &health);
        let (nh, nu) = if healthy {
            (cfg.capacity as u64, 0)
        } else {
            (0, cfg.capacity as u64)
        };
        self.metrics.set_devices(&resource, nh, nu);
        match self.served.get_mut(&cfg.name) {
            Some(r) => {
                r.discovered = discovered;
                let old_cfg = r.config();
                let changed = r.state.send_if_modified(|cur| {
                    if *cur == state {
                        false
                    } else {
                        *cur = state;
                        true
                    }
                });
                if changed && old_cfg != cfg {
                    info!(%resource, old = %old_cfg, new = %cfg, "resource configuration changed");
                }
                None
            }
            None => {
                let numa = numa.map_or_else(|| "none".to_string(), |n| n.to_string());
                info!(%resource, lower = %cfg.lower_device, mode = %cfg.mode, capacity = cfg.capacity, healthy, %numa, "resource added");
                let (tx, rx) = watch::channel(state);
                self.served.insert(
                    cfg.name.clone(),
                    Resource {
                        state: tx,
                        discovered,
                    },
                );
                Some(Served::New {
                    name: cfg.name,
                    state: rx,
                })
            }
        }
    }

    /// Logs, counts and posts an Event for a change of a resource's NIC health.
    fn health_changed(&mut self, cfg: &ResourceConfig, health: &NicHealth) {
        let resource = cfg.resource_name();
        if !self
            .health
            .update(&resource, health, self.observer.as_ref())
        {
            return;
        }
        let (nic, devices) = (cfg.lower_device.clone(), cfg.capacity);
        self.events.post(match health {
            NicHealth::Healthy => NodeEvent::NicUp {
                resource,
                nic,
                devices,
            },
            // The NicUnusable Event carries the reason, naming the port in the way.
            NicHealth::Enslaved(_) | NicHealth::PortInTheWay(_) => NodeEvent::NicUnusable {
                resource,
                devices,
                why: health.to_string(),
            },
            _ => NodeEvent::NicDown {
                resource,
                nic,
                devices,
            },
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Resources as Configured, Source};
    use crate::core::report::Recorder;
    use kubelet_proto::v1beta1::{HEALTHY, UNHEALTHY};
    use macvtap_link::monitor::LinkEvent;
    use tokio::sync::mpsc;

    use test_support::fake::nic;

    /// Resources serving `list` among `links`, with the Events they post,
    /// the configurations they publish and what they tell the observer.
    fn resources(
        list: &[&str],
        links: Vec<Link>,
    ) -> (
        Resources,
        mpsc::Receiver<NodeEvent>,
        watch::Receiver<Vec<ResourceConfig>>,
        Arc<Recorder>,
    ) {
        let (events, posted) = EventSink::queue();
        let (configs, published) = watch::channel(Vec::new());
        let observer = Arc::new(Recorder::default());
        let r = Resources::new(
            Start {
                resolved: Resolved {
                    resources: Configured::Static(
                        list.iter().map(|n| ResourceConfig::for_nic(n)).collect(),
                    ),
                    source: Source::Flags,
                },
                file_text: None,
                links: LinkTable::new(links),
                discovery: Discovery::default(),
                addressing: Addressing::default(),
                configs,
                sysfs: PathBuf::from("/nonexistent"),
            },
            Arc::new(Metrics::default()),
            events,
            observer.clone(),
        );
        (r, posted, published, observer)
    }

    /// The served resource changes as `+name` and `-name`, and the states
    /// of the new ones by name.
    fn handed_on(
        served: Vec<Served>,
    ) -> (
        Vec<String>,
        BTreeMap<String, watch::Receiver<ResourceState>>,
    ) {
        let mut said = Vec::new();
        let mut states = BTreeMap::new();
        for s in served {
            match s {
                Served::New { name, state } => {
                    said.push(format!("+{name}"));
                    states.insert(name, state);
                }
                Served::Gone { name } => said.push(format!("-{name}")),
            }
        }
        (said, states)
    }

    fn health(state: &watch::Receiver<ResourceState>) -> String {
        state.borrow().devices[0].health.clone()
    }

    #[test]
    fn resources_that_come_and_go_are_handed_on_and_published() {
        let (mut r, mut posted, published, observer) =
            resources(&["eth1", "eth2"], vec![nic(2, "eth1", true)]);
        let (said, states) = handed_on(r.reconcile());
        assert_eq!(said, ["+eth1", "+eth2"]);
        assert_eq!(health(&states["eth1"]), HEALTHY);
        assert_eq!(health(&states["eth2"]), UNHEALTHY, "its NIC is missing");
        let names: Vec<String> = published.borrow().iter().map(|c| c.name.clone()).collect();
        assert_eq!(names, ["eth1", "eth2"]);
        // A new resource that starts unhealthy is a change: counted, posted.
        assert_eq!(
            observer.lines(),
            ["unhealthy macvtap.network.kubevirt.io/eth2 nic_missing"]
        );
        assert!(matches!(posted.try_recv(), Ok(NodeEvent::NicDown { .. })));
        assert!(posted.try_recv().is_err());

        r.resolved.resources = Configured::Static(vec![ResourceConfig::for_nic("eth1")]);
        let (said, _) = handed_on(r.reconcile());
        assert_eq!(said, ["-eth2"]);
        assert_eq!(r.names(), ["eth1"]);
        assert_eq!(published.borrow().len(), 1);
        // Still served: published anew, the same state, so no change.
        assert!(!states["eth1"].has_changed().unwrap());
        assert!(
            states["eth2"].has_changed().is_err(),
            "a removed resource's state is closed, ending its streams"
        );
    }

    #[test]
    fn what_discovery_leaves_out_is_posted_once_per_change_and_follows_addresses() {
        use crate::config::DiscoveryPolicy;
        let (mut r, mut posted, _, _) =
            resources(&[], vec![nic(2, "eth0", true), nic(3, "eth1", true)]);
        r.resolved.resources = Configured::AutoDiscover(DiscoveryPolicy::Spare);
        let address = |index: u32, ip: &str| macvtap_link::Address {
            index,
            ip: ip.parse().unwrap(),
            prefix_len: 24,
            global: true,
        };
        let mut addressing = Addressing {
            addresses: vec![address(2, "192.0.2.10")],
            default_routes: vec![],
        };
        let (said, _) = handed_on(r.on_addressing(addressing.clone()));
        assert_eq!(said, ["+eth1"]);
        let Ok(NodeEvent::NicsLeftOut { served, left_out }) = posted.try_recv() else {
            panic!("a NicsLeftOut Event")
        };
        assert_eq!(served, ["eth1"]);
        assert_eq!(left_out.len(), 1);
        assert!(left_out[0].starts_with("eth0 has the global address 192.0.2.10/24"));
        // The same again: nothing new to say.
        assert!(r.reconcile().is_empty());
        assert!(posted.try_recv().is_err());
        // eth1 gets an address too: withdrawn, and said.
        addressing.addresses.push(address(3, "198.51.100.1"));
        let (said, _) = handed_on(r.on_addressing(addressing));
        assert_eq!(said, ["-eth1"]);
        let Ok(NodeEvent::NicsLeftOut { served, left_out }) = posted.try_recv() else {
            panic!("a second NicsLeftOut Event")
        };
        assert!(served.is_empty());
        assert_eq!(left_out.len(), 2);
        // Its InternalIP known: nothing changes here (eth0 is out already),
        // but the reason does, and is said.
        let view = crate::operator::node::NodeView::Known(crate::operator::node::NodeFacts {
            internal_ips: vec!["192.0.2.10".parse().unwrap()],
            ..Default::default()
        });
        assert!(r.on_node(&view).is_empty());
        let Ok(NodeEvent::NicsLeftOut { left_out, .. }) = posted.try_recv() else {
            panic!("a third NicsLeftOut Event")
        };
        assert!(left_out[0].starts_with("eth0 holds the Node's InternalIP 192.0.2.10"));
        assert!(r.needs_node());
    }

    #[test]
    fn a_link_event_publishes_the_resources_it_touches_only() {
        let (mut r, mut posted, _, _) = resources(
            &["eth1", "eth2"],
            vec![nic(2, "eth1", true), nic(3, "eth2", true)],
        );
        let (_, mut states) = handed_on(r.reconcile());
        for s in states.values_mut() {
            s.borrow_and_update();
        }
        let served = r.on_links(LinkUpdate::Events(vec![LinkEvent::Changed(nic(
            2, "eth1", false,
        ))]));
        assert!(served.is_empty(), "no resource came or went");
        assert!(states["eth1"].has_changed().unwrap());
        assert_eq!(health(&states["eth1"]), UNHEALTHY);
        assert!(!states["eth2"].has_changed().unwrap(), "not touched");
        assert!(matches!(
            posted.try_recv(),
            Ok(NodeEvent::NicDown { resource, .. }) if resource.ends_with("/eth1")
        ));
        // An event that changes nothing is no change at all.
        let again = r.on_links(LinkUpdate::Events(vec![LinkEvent::Changed(nic(
            2, "eth1", false,
        ))]));
        assert!(again.is_empty());
        assert!(posted.try_recv().is_err());
    }
}
