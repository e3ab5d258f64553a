//! Links and configuration → plugins: which resources are wanted (the
//! configured ones, or what auto-discovery finds), and for each its
//! devices, health and NUMA node; health changes are logged, counted and
//! posted as Events. A change of some links revisits only the resources
//! it touches (their NIC or the NIC's master), and runs discovery again
//! only when it concerns a NIC or a master above one.

use super::plugin::Plugin;
use super::{Daemon, RESTART_WAIT};
use crate::config::{ResourceConfig, Resources};
use crate::core::link_table::{LinkDelta, LinkTable, LinkUpdate};
use crate::core::nic::health::{NicHealth, resource_health};
use crate::core::nic::port::can_be_in_the_way;
use crate::core::nic::topology::numa_node;
use crate::kubelet::devices::device_list;
use crate::kubelet::server::ResourceState;
use crate::operator::events::NodeEvent;
use macvtap_link::{Link, MacvtapMode};
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

    /// The resources wanted now, each with whether auto-discovery made it.
    fn wanted(&self) -> Vec<(ResourceConfig, bool)> {
        match &self.resolved.resources {
            Resources::Static(list) => list.iter().cloned().map(|c| (c, false)).collect(),
            Resources::AutoDiscover => {
                let mut found: Vec<(ResourceConfig, bool)> = self
                    .discovery
                    .discover(self.links.links())
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

    /// The resources wanted after the links `changed` did: the plugins as
    /// they are when auto-discovery cannot find anything new in that change.
    fn wanted_after(&self, changed: &[&Link]) -> Vec<(ResourceConfig, bool)> {
        if matches!(self.resolved.resources, Resources::AutoDiscover)
            && !self.discovery.concerned_by(changed, self.links.links())
        {
            return self
                .plugins
                .values()
                .map(|p| (p.config(), p.discovered))
                .collect();
        }
        self.wanted()
    }

    /// Brings the plugins in line with the configuration and the links.
    pub(super) fn reconcile(&mut self) {
        self.reconcile_changed(None);
    }

    /// Brings the plugins in line with the configuration and the links;
    /// with `changed` (links that changed), revisits only the resources
    /// that it touches, that are new or whose configuration differs.
    fn reconcile_changed(&mut self, changed: Option<&[&Link]>) {
        let wanted = match changed {
            Some(c) => self.wanted_after(c),
            None => self.wanted(),
        };
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
            let revisit = match (changed, self.plugins.get(&cfg.name)) {
                (Some(c), Some(p)) => {
                    p.discovered != discovered
                        || p.config() != cfg
                        || touches_nic(&self.links, &cfg.lower_device, cfg.mode, c)
                }
                _ => true,
            };
            if revisit {
                self.apply_resource(cfg, discovered, now);
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
        self.ctx.metrics.resource_removed(&resource);
        self.health.forget(&resource);
    }

    /// Publishes a wanted resource's devices, health and NUMA node, adding
    /// its plugin if it is new.
    fn apply_resource(&mut self, cfg: ResourceConfig, discovered: bool, now: Instant) {
        let links = self.links.links();
        let lower = self.links.by_name(&cfg.lower_device);
        let health = resource_health(&cfg, links);
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
        if !self.health.update(&resource, health, &self.observer) {
            return;
        }
        let (nic, devices) = (cfg.lower_device.clone(), cfg.capacity);
        self.ctx.events.post(match health {
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

/// Whether a change of the links `changed` (their old and new states)
/// touches the NIC `lower` of a resource in `mode` among `links` (the state
/// after): the NIC is one of them, or its master is, or a macvlan/macvtap
/// port on it that can be in the way of the mode ([`can_be_in_the_way`]:
/// any port beside a passthru resource, a passthru port beside any). So the
/// resource's own bridge-mode macvtaps, made by every Allocate, do not make
/// it revisit its devices.
fn touches_nic(links: &LinkTable, lower: &str, mode: MacvtapMode, changed: &[&Link]) -> bool {
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
}
