//! A port in the way: another macvlan/macvtap on a resource's NIC that the
//! resource's mode cannot share the NIC with, as every message says it.
//! Health finds it (`health::port_in_the_way`), Allocate refuses with it
//! (`error::Error::PortInTheWay`); it depends on neither.

use macvtap_link::{Link, MacvtapMode};
use std::fmt;

/// Whether `port` is a macvlan/macvtap on `nic` (by `IFLA_LINK`, in this
/// namespace) that can be in the way of a resource in `mode`: any port
/// beside a passthru resource, a passthru port beside any. The one place of
/// the rule: health judges by it and the daemon picks the link changes that
/// touch a resource by it.
pub(crate) fn can_be_in_the_way(port: &Link, nic: &Link, mode: MacvtapMode) -> bool {
    matches!(port.kind.as_deref(), Some("macvtap" | "macvlan"))
        && !port.lower_in_other_netns
        && port.lower_index == Some(nic.index)
        && (mode == MacvtapMode::Passthru || port.macvtap_mode == Some(MacvtapMode::Passthru))
}

/// What every message about a passthru conflict says (the words of the
/// Allocate refusal [`crate::error::PORT_IN_THE_WAY`]).
pub(crate) const PASSTHRU_ALONE: &str =
    "the kernel allows a passthru macvtap only alone on its NIC";

/// Another macvlan/macvtap port on a resource's NIC that the resource's mode
/// cannot share the NIC with: any port beside a passthru resource's macvtap,
/// or a passthru port beside a bridge, vepa or private resource's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInTheWay {
    /// The NIC.
    pub lower: String,
    /// The port's link name and kind (`macvtap`, `macvlan`); `None` when the
    /// kernel refused the macvtap with `EINVAL` (its answer to a port beside
    /// a passthru one) but no such link is in this namespace (a pod holds it).
    pub link: Option<(String, String)>,
    /// Whether the resource is the passthru one (else the port is).
    pub ours_passthru: bool,
}

impl fmt::Display for PortInTheWay {
    /// `NIC eth1 already carries macvtap mvt…; the kernel allows … so delete …`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lower = &self.lower;
        let (what, name) = match (&self.link, self.ours_passthru) {
            (Some((name, kind)), true) => (format!("already carries {kind} {name}"), name.as_str()),
            (Some((name, kind)), false) => (
                format!("carries passthru {kind} {name}, which takes the whole NIC"),
                name.as_str(),
            ),
            (None, true) => (
                "already carries another macvlan/macvtap port (the kernel refused the passthru \
                 macvtap with EINVAL, and no such port is in the node's namespace, so a pod \
                 holds it)"
                    .to_string(),
                "it",
            ),
            (None, false) => (
                "carries a passthru macvlan/macvtap port (the kernel refused the macvtap with \
                 EINVAL, and no such port is in the node's namespace, so a pod holds it)"
                    .to_string(),
                "it",
            ),
        };
        let instead = if self.ours_passthru {
            "give the passthru resource a NIC of its own"
        } else {
            "use another NIC for this resource"
        };
        write!(
            f,
            "NIC {lower} {what}; {PASSTHRU_ALONE}, so delete {name} or {instead}"
        )
    }
}
