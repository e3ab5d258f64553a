//! Links and configuration → plugins: which resources are wanted (the
//! configured ones, or what auto-discovery finds), and for each its
//! devices, health and NUMA node; health changes are logged, counted and
//! posted as Events.

use super::plugin::Plugin;
use super::{Daemon, RESTART_WAIT};
use crate::config::{ResourceConfig, Resources};
use crate::devices::device_list;
use crate::events::NodeEvent;
use crate::health::{NicHealth, resource_health};
use crate::links::LinkSnapshot;
use crate::server::ResourceState;
use crate::topology::numa_node;
use tokio::time::Instant;
use tracing::info;

impl Daemon {
    /// A new link snapshot: health, NUMA and auto-discovered resources follow it.
    pub(super) fn on_links(&mut self, links: LinkSnapshot) {
        self.links = links;
        self.reconcile();
    }

    /// The resources wanted now, each with whether auto-discovery made it.
    fn wanted(&self) -> Vec<(ResourceConfig, bool)> {
        match &self.resolved.resources {
            Resources::Static(list) => list.iter().cloned().map(|c| (c, false)).collect(),
            Resources::AutoDiscover => {
                let mut found: Vec<(ResourceConfig, bool)> = self
                    .discovery
                    .discover(&self.links)
                    .into_iter()
                    .map(|c| (c, true))
                    .collect();
                // A discovered NIC that vanished keeps its resource, unhealthy.
                for (name, p) in &self.plugins {
                    if p.discovered && !found.iter().any(|(c, _)| &c.name == name) {
                        found.push((p.config(), true));
                    }
                }
                found
            }
        }
    }

    /// Brings the plugins in line with the configuration and the links.
    pub(super) fn reconcile(&mut self) {
        let wanted = self.wanted();
        let gone: Vec<String> = self
            .plugins
            .keys()
            .filter(|n| !wanted.iter().any(|(c, _)| &c.name == *n))
            .cloned()
            .collect();
        for name in gone {
            self.remove_plugin(&name);
        }
        let now = Instant::now();
        for (cfg, discovered) in wanted {
            self.apply_resource(cfg, discovered, now);
        }
        let configs: Vec<ResourceConfig> = self.plugins.values().map(|p| p.config()).collect();
        self.configs_tx.send_replace(configs);
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
        self.ctx.metrics.resource_removed(&resource);
        self.health.forget(&resource);
    }

    /// Publishes a wanted resource's devices, health and NUMA node, adding
    /// its plugin if it is new.
    fn apply_resource(&mut self, cfg: ResourceConfig, discovered: bool, now: Instant) {
        let links = self.links.clone();
        let lower = links.iter().find(|l| l.name == cfg.lower_device);
        let health = resource_health(&cfg, &links);
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
        self.ctx.metrics.set_devices(&resource, nh, nu);
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
        if !self.health.update(&resource, health, &self.ctx.metrics) {
            return;
        }
        let (nic, devices) = (cfg.lower_device.clone(), cfg.capacity);
        self.ctx.events.post(match health {
            NicHealth::Healthy => NodeEvent::NicUp {
                resource,
                nic,
                devices,
            },
            // The NicEnslaved Event carries the reason, naming the port in the way.
            NicHealth::Enslaved(_) | NicHealth::PortInTheWay(_) => NodeEvent::NicEnslaved {
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
