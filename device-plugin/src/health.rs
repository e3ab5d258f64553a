//! Whether a resource's lower NIC can carry traffic.

use macvtap_link::Link;

/// A NIC is healthy when it exists and is operationally up. `unknown` (what
/// drivers without carrier reporting say) counts as up when the link is
/// administratively up.
pub fn nic_is_healthy(link: Option<&Link>) -> bool {
    match link {
        None => false,
        Some(l) => l.oper_state == "up" || (l.oper_state == "unknown" && l.is_up()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(oper: &str, up: bool) -> Link {
        Link {
            oper_state: oper.into(),
            flags: if up { 1 } else { 0 },
            ..Default::default()
        }
    }

    #[test]
    fn health_follows_the_operational_state() {
        assert!(nic_is_healthy(Some(&link("up", true))));
        assert!(nic_is_healthy(Some(&link("unknown", true))));
        assert!(!nic_is_healthy(Some(&link("unknown", false))));
        assert!(!nic_is_healthy(Some(&link("down", false))));
        assert!(!nic_is_healthy(Some(&link("lowerlayerdown", true))));
        assert!(!nic_is_healthy(None));
    }
}
