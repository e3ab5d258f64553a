//! Links and configuration → plugins: the table of the node's links kept
//! current, and what [`wanted::changes`] decides (which resources are
//! wanted, which changed) carried out: for each resource its devices,
//! health and NUMA node published; health changes are logged, counted and
//! posted as Events.

use super::plugin::Plugin;
use super::{Daemon, RESTART_WAIT};
use crate::config::ResourceConfig;
use crate::core::link_table::{LinkDelta, LinkTable, LinkUpdate};
use crate::core::nic::health::NicHealth;
use crate::core::nic::topology::numa_node;
use crate::core::wanted::{self, Change, Node, Published, Wanted};
use crate::kubelet::devices::device_list;
use crate::kubelet::server::ResourceState;
use crate::operator::events::NodeEvent;
use macvtap_link::Link;
use tokio::time::Instant;
use tracing::{debug, info};

impl Daemon {
    /// Links changed: the daemon's table (the one table of the node's
    /// links) takes the events in, and health, NUMA and auto-discovered
    /// resources follow, for the resources a real change touches (all of
    /// them after a resync).
    pub(super) fn on_links(&mut self, update: LinkUpdate) {
        match update {
            LinkUpdate::Resync(links) => {
                self.links = LinkTable::new(links);
                self.reconcile();
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
                    return;
                }
                let changed: Vec<&Link> = deltas.iter().flat_map(|d| d.states()).collect();
                self.reconcile_changed(Some(&changed));
            }
        }
    }

    /// Brings the plugins in line with the configuration and the links.
    pub(super) fn reconcile(&mut self) {
        self.reconcile_changed(None);
    }

    /// Brings the plugins in line with the configuration and the links;
    /// with `changed` (links that changed), revisits only the resources
    /// that it touches, that are new or whose configuration differs
    /// ([`wanted::changes`]).
    fn reconcile_changed(&mut self, changed: Option<&[&Link]>) {
        let served: Vec<Wanted> = self
            .plugins
            .values()
            .map(|p| Wanted {
                config: p.config(),
                discovered: p.discovered,
            })
            .collect();
        let node = Node {
            resources: &self.resolved.resources,
            discovery: &self.discovery,
            links: &self.links,
        };
        let now = Instant::now();
        for change in wanted::changes(node, &served, changed) {
            match change {
                Change::Removed(name) => self.remove_plugin(&name),
                Change::Added(p) | Change::Updated(p) => self.apply_resource(p, now),
            }
        }
        let configs: Vec<ResourceConfig> = self.plugins.values().map(|p| p.config()).collect();
        self.configs_tx.send_if_modified(|cur| {
            if *cur == configs {
                false
            } else {
                *cur = configs;
                true
            }
        });
    }

    /// Stops serving a resource that is no longer wanted.
    fn remove_plugin(&mut self, name: &str) {
        let Some(p) = self.plugins.remove(name) else {
            return;
        };
        let resource = p.config().resource_name();
        info!(%resource, "resource removed");
        p.registration.abandon();
        if let Some(s) = p.server {
            // Forget stops already done: a long-lived daemon whose config
            // keeps changing must not collect their handles for ever.
            self.background.retain(|h| !h.is_finished());
            self.background
                .push(tokio::spawn(s.stop(true, RESTART_WAIT)));
        }
        self.metrics.resource_removed(&resource);
        self.health.forget(&resource);
    }

    /// Publishes a wanted resource's devices, health and NUMA node, adding
    /// its plugin if it is new.
    fn apply_resource(&mut self, published: Published, now: Instant) {
        let Published {
            wanted: Wanted {
                config: cfg,
                discovered,
            },
            health,
        } = published;
        let lower = self.links.by_name(&cfg.lower_device);
        let healthy = health.is_healthy();
        let numa = lower.and_then(|_| numa_node(&self.opts.sysfs, &cfg.lower_device));
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
        match self.plugins.get_mut(&cfg.name) {
            Some(p) => {
                p.discovered = discovered;
                let old_cfg = p.config();
                let changed = p.state.send_if_modified(|cur| {
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
            }
            None => {
                let numa = numa.map_or_else(|| "none".to_string(), |n| n.to_string());
                info!(%resource, lower = %cfg.lower_device, mode = %cfg.mode, capacity = cfg.capacity, healthy, %numa, "resource added");
                self.plugins
                    .insert(cfg.name.clone(), Plugin::new(state, discovered, now));
            }
        }
    }

    /// Logs, counts and posts an Event for a change of a resource's NIC health.
    fn health_changed(&mut self, cfg: &ResourceConfig, health: &NicHealth) {
        let resource = cfg.resource_name();
        if !self.health.update(&resource, health, &self.observer) {
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
