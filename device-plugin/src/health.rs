//! Whether a resource's lower NIC can carry macvtaps, and the log and
//! metric of each change.

use crate::master::{Owner, receive_path_owner};
use crate::metrics::Metrics;
use macvtap_link::Link;
use std::collections::BTreeMap;
use std::fmt;
use tracing::{info, warn};

/// What a resource's lower NIC is like, as far as its devices go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NicHealth {
    /// It exists, is up, and no master owns it.
    Healthy,
    /// There is no link of that name.
    Missing {
        /// The NIC's name.
        lower: String,
    },
    /// A master owns its receive path, so the kernel refuses a macvtap on it.
    Enslaved(Owner),
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
    pub fn is_healthy(&self) -> bool {
        matches!(self, NicHealth::Healthy)
    }

    /// The metric label of an unhealthy state: `nic_missing`, `nic_enslaved`
    /// or `nic_down` (`healthy` for [`NicHealth::Healthy`]).
    pub fn reason(&self) -> &'static str {
        match self {
            NicHealth::Healthy => "healthy",
            NicHealth::Missing { .. } => "nic_missing",
            NicHealth::Enslaved(_) => "nic_enslaved",
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
pub fn nic_health(lower: &str, links: &[Link]) -> NicHealth {
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

/// The last health of each resource, so that each change is logged once and
/// counted in `macvtap_dp_unhealthy_total{reason}`.
#[derive(Debug, Default)]
pub struct HealthLog {
    last: BTreeMap<String, NicHealth>,
}

impl HealthLog {
    /// Records `health` for `resource`; logs and counts it when its reason
    /// differs from the last one's (a new resource counts when it starts
    /// unhealthy). Returns whether it was such a change. A detail that
    /// changes within one reason (a NIC seen administratively down first,
    /// then operationally down) is no new change.
    pub fn update(&mut self, resource: &str, health: &NicHealth, metrics: &Metrics) -> bool {
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
            metrics.unhealthy(resource, health.reason());
        }
        self.last.insert(resource.to_string(), health.clone());
        true
    }

    /// Forgets a resource that is no longer served.
    pub fn forget(&mut self, resource: &str) {
        self.last.remove(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn each_change_is_logged_and_counted_once() {
        let m = Metrics::default();
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
        let t = m.render();
        assert!(
            t.contains(&format!(
                "macvtap_dp_unhealthy_total{{resource=\"{r}\",reason=\"nic_enslaved\"}} 2\n"
            )),
            "{t}"
        );
        assert!(
            t.contains(&format!(
                "macvtap_dp_unhealthy_total{{resource=\"{r}\",reason=\"nic_down\"}} 1\n"
            )),
            "{t}"
        );
        // A resource that starts unhealthy counts at once.
        log.forget(r);
        assert!(log.update(r, &down, &m));
    }
}
