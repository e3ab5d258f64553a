//! Whether a resource's lower NIC can carry macvtaps, and the log and
//! metric of each change.

use crate::config::ResourceConfig;
use crate::core::nic::master::{Owner, receive_path_owner};
use crate::core::nic::port::{PortInTheWay, can_be_in_the_way};
use crate::core::report::Observer;
use macvtap_link::{Link, MacvtapMode, is_link_of_resource};
use std::collections::BTreeMap;
use std::fmt;
use tracing::{info, warn};

/// What a resource's lower NIC is like, as far as its devices go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NicHealth {
    /// It exists, is up, and no master owns it.
    Healthy,
    /// There is no link of that name.
    Missing {
        /// The NIC's name.
        lower: String,
    },
    /// A master owns its receive path, so the kernel refuses a macvtap on it.
    Enslaved(Owner),
    /// Another macvlan/macvtap port on the NIC rules out the resource's
    /// macvtaps: the kernel allows a passthru macvtap only alone on its NIC.
    PortInTheWay(PortInTheWay),
    /// It is not operationally up.
    Down {
        /// The NIC's name.
        lower: String,
        /// Its operational state, as `ip` prints it.
        oper_state: String,
    },
}

impl NicHealth {
    /// Whether the resource's devices are `Healthy`.
    pub(crate) fn is_healthy(&self) -> bool {
        matches!(self, NicHealth::Healthy)
    }

    /// The metric label of an unhealthy state: `nic_missing`, `nic_enslaved`,
    /// `nic_port_in_the_way` or `nic_down` (`healthy` for [`NicHealth::Healthy`]).
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            NicHealth::Healthy => "healthy",
            NicHealth::Missing { .. } => "nic_missing",
            NicHealth::Enslaved(_) => "nic_enslaved",
            NicHealth::PortInTheWay(_) => "nic_port_in_the_way",
            NicHealth::Down { .. } => "nic_down",
        }
    }
}

impl fmt::Display for NicHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NicHealth::Healthy => f.write_str("the lower NIC can carry macvtaps"),
            NicHealth::Missing { lower } => write!(f, "lower NIC {lower} does not exist"),
            NicHealth::Enslaved(owner) => owner.fmt(f),
            NicHealth::PortInTheWay(port) => port.fmt(f),
            NicHealth::Down { lower, oper_state } => {
                write!(
                    f,
                    "lower NIC {lower} is down (operational state {oper_state})"
                )
            }
        }
    }
}

/// The health of NIC `lower` among `links`: missing, enslaved (checked
/// before down, as it is what the operator must change), down, or healthy.
/// `unknown` (what drivers without carrier reporting say) counts as up when
/// the link is administratively up.
pub(crate) fn nic_health(lower: &str, links: &[Link]) -> NicHealth {
    let Some(l) = links.iter().find(|l| l.name == lower) else {
        return NicHealth::Missing {
            lower: lower.to_string(),
        };
    };
    if let Some(owner) = receive_path_owner(l, links) {
        return NicHealth::Enslaved(owner);
    }
    if l.oper_state == "up" || (l.oper_state == "unknown" && l.is_up()) {
        NicHealth::Healthy
    } else {
        NicHealth::Down {
            lower: lower.to_string(),
            oper_state: l.oper_state.clone(),
        }
    }
}

/// The first macvlan/macvtap link on `cfg`'s NIC among `links` (`IFLA_LINK`
/// of each) that rules out `cfg`'s macvtaps: for a passthru resource any one
/// but its own device's link, for another mode a passthru one that is not
/// one of the resource's device links. `None` when the NIC is not among
/// `links` or nothing is in the way.
pub(crate) fn port_in_the_way(cfg: &ResourceConfig, links: &[Link]) -> Option<PortInTheWay> {
    let lower = links.iter().find(|l| l.name == cfg.lower_device)?;
    let ours_passthru = cfg.mode == MacvtapMode::Passthru;
    // A device's own link (the hashed name, or a Go-era one named as the ID)
    // is never in its way.
    let port = links.iter().find(|l| {
        can_be_in_the_way(l, lower, cfg.mode)
            && !is_link_of_resource(&l.name, &cfg.name, cfg.capacity)
    })?;
    Some(PortInTheWay {
        lower: lower.name.clone(),
        link: Some((port.name.clone(), port.kind.clone().unwrap_or_default())),
        ours_passthru,
    })
}

/// The health of resource `cfg` among `links`: [`nic_health`] of its NIC,
/// and when the NIC exists and no master owns it, unhealthy as well when
/// another port is in the way of its mode ([`port_in_the_way`]), which is
/// checked before down as it is what the operator must change.
pub(crate) fn resource_health(cfg: &ResourceConfig, links: &[Link]) -> NicHealth {
    let health = nic_health(&cfg.lower_device, links);
    if matches!(health, NicHealth::Missing { .. } | NicHealth::Enslaved(_)) {
        return health;
    }
    match port_in_the_way(cfg, links) {
        Some(port) => NicHealth::PortInTheWay(port),
        None => health,
    }
}

/// The last health of each resource, so that each change is logged once and
/// told once to the observer (counted in `macvtap_dp_unhealthy_total{reason}`
/// in the daemon).
#[derive(Debug, Default)]
pub(crate) struct HealthLog {
    last: BTreeMap<String, NicHealth>,
}

impl HealthLog {
    /// Records `health` for `resource`; logs and counts it when its reason
    /// differs from the last one's (a new resource counts when it starts
    /// unhealthy). Returns whether it was such a change. A detail that
    /// changes within one reason (a NIC seen administratively down first,
    /// then operationally down) is no new change.
    pub(crate) fn update(
        &mut self,
        resource: &str,
        health: &NicHealth,
        observer: &dyn Observer,
    ) -> bool {
        let before = self.last.get(resource);
        let same_reason = before.is_some_and(|b| b.reason() == health.reason());
        if same_reason || (before.is_none() && health.is_healthy()) {
            self.last.insert(resource.to_string(), health.clone());
            return false;
        }
        if health.is_healthy() {
            info!(%resource, "lower NIC usable again: devices Healthy");
        } else {
            warn!(%resource, reason = health.reason(), "devices Unhealthy: {health}");
            observer.unhealthy(resource, health.reason());
        }
        self.last.insert(resource.to_string(), health.clone());
        true
    }

    /// Forgets a resource that is no longer served.
    pub(crate) fn forget(&mut self, resource: &str) {
        self.last.remove(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::report::Recorder;
    use macvtap_link::link_name_for_device;

    fn link(oper: &str, up: bool) -> Link {
        Link {
            index: 1,
            name: "eth0".into(),
            oper_state: oper.into(),
            flags: if up { 1 } else { 0 },
            ..Default::default()
        }
    }

    fn healthy(l: Link) -> bool {
        nic_health("eth0", &[l]).is_healthy()
    }

    #[test]
    fn health_follows_the_operational_state() {
        assert!(healthy(link("up", true)));
        assert!(healthy(link("unknown", true)));
        assert!(!healthy(link("unknown", false)));
        assert!(!healthy(link("down", false)));
        assert!(!healthy(link("lowerlayerdown", true)));
        assert_eq!(
            nic_health("eth0", &[]),
            NicHealth::Missing {
                lower: "eth0".into()
            }
        );
        assert_eq!(
            nic_health("eth0", &[link("down", false)]).to_string(),
            "lower NIC eth0 is down (operational state down)"
        );
    }

    #[test]
    fn an_enslaved_nic_is_unhealthy_and_says_why() {
        let br = Link {
            index: 2,
            name: "br0".into(),
            kind: Some("bridge".into()),
            ..link("up", true)
        };
        let port = Link {
            master: Some(2),
            ..link("up", true)
        };
        let h = nic_health("eth0", &[port.clone(), br.clone()]);
        assert_eq!(h.reason(), "nic_enslaved");
        assert_eq!(
            h.to_string(),
            "eth0 is a port of bridge br0, and a macvtap needs a NIC that no bridge, bond or OVS \
             owns; use br0 as lowerDevice"
        );
        // Enslaved wins over down: it is what must change.
        let down_port = Link {
            oper_state: "down".into(),
            ..port
        };
        assert_eq!(
            nic_health("eth0", &[down_port, br.clone()]).reason(),
            "nic_enslaved"
        );
        // A VRF keeps the receive path.
        let vrf = Link {
            kind: Some("vrf".into()),
            ..br
        };
        let vrf_port = Link {
            master: Some(2),
            ..link("up", true)
        };
        assert!(nic_health("eth0", &[vrf_port, vrf]).is_healthy());
    }

    /// NIC eth0 (index 1, up) and eth1 (index 2), and `ports`: (name, kind,
    /// lower index, mode).
    fn nic_with(ports: &[(&str, &str, u32, MacvtapMode)]) -> Vec<Link> {
        let mut links = vec![
            link("up", true),
            Link {
                index: 2,
                name: "eth1".into(),
                ..link("up", true)
            },
        ];
        for (i, (name, kind, lower, mode)) in ports.iter().enumerate() {
            links.push(Link {
                index: 10 + i as u32,
                name: name.to_string(),
                kind: Some(kind.to_string()),
                lower_index: Some(*lower),
                macvtap_mode: Some(*mode),
                ..link("up", true)
            });
        }
        links
    }

    fn resource(name: &str, mode: MacvtapMode, capacity: u32) -> ResourceConfig {
        ResourceConfig {
            name: name.into(),
            lower_device: "eth0".into(),
            mode,
            capacity,
            placement: None,
        }
    }

    #[test]
    fn a_passthru_resource_beside_another_port_is_unhealthy_naming_it() {
        use MacvtapMode::{Bridge, Passthru};
        let pt = resource("pt", Passthru, 1);
        let own = link_name_for_device("ptMvp0");
        // Its own device's link (hashed or Go-era name) is no conflict, nor
        // ports on other NICs.
        for links in [
            nic_with(&[(&own, "macvtap", 1, Passthru)]),
            nic_with(&[("ptMvp0", "macvtap", 1, Passthru)]),
            nic_with(&[
                ("mv1", "macvlan", 2, Bridge),
                ("mvt1", "macvtap", 2, Bridge),
            ]),
        ] {
            assert!(resource_health(&pt, &links).is_healthy(), "{links:?}");
        }
        for (name, kind) in [("mv0", "macvlan"), ("mvt0", "macvtap")] {
            let h = resource_health(&pt, &nic_with(&[(name, kind, 1, Bridge)]));
            assert_eq!(h.reason(), "nic_port_in_the_way");
            assert_eq!(
                h.to_string(),
                format!(
                    "NIC eth0 already carries {kind} {name}; the kernel allows a passthru macvtap \
                     only alone on its NIC, so delete {name} or give the passthru resource a NIC \
                     of its own"
                )
            );
        }
        // A port whose lower is in another namespace has another NIC of that index.
        let mut links = nic_with(&[("mv0", "macvlan", 1, Bridge)]);
        links[2].lower_in_other_netns = true;
        assert!(resource_health(&pt, &links).is_healthy());
    }

    #[test]
    fn a_bridge_resource_beside_a_passthru_port_is_unhealthy_naming_it() {
        use MacvtapMode::{Bridge, Passthru, Private, Vepa};
        for (name, kind) in [("mvtpt", "macvtap"), ("mvlpt", "macvlan")] {
            let links = nic_with(&[(name, kind, 1, Passthru)]);
            for mode in [Bridge, Vepa, Private] {
                let h = resource_health(&resource("dp", mode, 4), &links);
                assert_eq!(
                    h.to_string(),
                    format!(
                        "NIC eth0 carries passthru {kind} {name}, which takes the whole NIC; the \
                         kernel allows a passthru macvtap only alone on its NIC, so delete {name} \
                         or use another NIC for this resource"
                    ),
                    "{mode}"
                );
            }
        }
        let links = nic_with(&[("mvtpt", "macvtap", 1, Passthru)]);
        // Other bridge-mode ports are fine, and so is a device link of its own.
        let dp = resource("dp", Bridge, 4);
        let ok = nic_with(&[
            ("mv0", "macvlan", 1, Bridge),
            ("mvt0", "macvtap", 1, Vepa),
            (&link_name_for_device("dpMvp3"), "macvtap", 1, Passthru),
        ]);
        assert!(resource_health(&dp, &ok).is_healthy());
        // Missing and enslaved come first; a port in the way before down.
        assert_eq!(resource_health(&dp, &links[1..]).reason(), "nic_missing");
        let mut down = links.clone();
        down[0].oper_state = "down".into();
        assert_eq!(resource_health(&dp, &down).reason(), "nic_port_in_the_way");
        assert_eq!(nic_health("eth0", &down).reason(), "nic_down");
        let mut enslaved = links.clone();
        enslaved[0].master = Some(2);
        enslaved[1].kind = Some("bridge".into());
        assert_eq!(resource_health(&dp, &enslaved).reason(), "nic_enslaved");
        // The change is told to the observer, with its reason.
        let m = Recorder::default();
        let mut log = HealthLog::default();
        let r = "macvtap.network.kubevirt.io/dp";
        assert!(log.update(r, &resource_health(&dp, &links), &m));
        assert_eq!(m.lines(), [format!("unhealthy {r} nic_port_in_the_way")]);
    }

    #[test]
    fn each_change_is_logged_and_counted_once() {
        let m = Recorder::default();
        let mut log = HealthLog::default();
        let r = "macvtap.network.kubevirt.io/eth0";
        let enslaved = NicHealth::Enslaved(Owner {
            link: "eth0".into(),
            master: "br0".into(),
            kind: Some("bridge".into()),
        });
        assert!(!log.update(r, &NicHealth::Healthy, &m));
        assert!(log.update(r, &enslaved, &m));
        assert!(!log.update(r, &enslaved, &m));
        assert!(log.update(r, &NicHealth::Healthy, &m));
        assert!(log.update(r, &enslaved, &m));
        let down = NicHealth::Down {
            lower: "eth0".into(),
            oper_state: "down".into(),
        };
        assert!(log.update(r, &down, &m));
        // Seen administratively down first, then operationally down: one change.
        let down_later = NicHealth::Down {
            lower: "eth0".into(),
            oper_state: "lowerlayerdown".into(),
        };
        assert!(!log.update(r, &down_later, &m));
        assert_eq!(
            m.lines(),
            [
                format!("unhealthy {r} nic_enslaved"),
                format!("unhealthy {r} nic_enslaved"),
                format!("unhealthy {r} nic_down"),
            ]
        );
        // A resource that starts unhealthy counts at once.
        log.forget(r);
        assert!(log.update(r, &down, &m));
    }
}
