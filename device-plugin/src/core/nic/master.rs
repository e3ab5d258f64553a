//! The master that owns a link's receive path: the one check that
//! discovery (which NIC to advertise), health (an enslaved NIC is
//! unhealthy) and Allocate (refuse, naming the master and the fix) share.
//!
//! The kernel refuses a macvtap (`EBUSY`) on a link whose receive path
//! another device already took: a bridge port, a bond or team slave, an
//! Open vSwitch port.

use macvtap_link::Link;
use std::fmt;

/// The master that owns a link's receive path, so that the kernel refuses a
/// macvtap on the link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The link that is owned, e.g. `eth0`.
    pub link: String,
    /// The master's name, e.g. `br0`.
    pub master: String,
    /// The master's `IFLA_INFO_KIND` (`bridge`, `bond`, `team`,
    /// `openvswitch`), `None` when it has none (e.g. a virtio failover master).
    pub kind: Option<String>,
}

impl Owner {
    /// Whether a macvtap on the master itself works, so that the master can
    /// take the NIC's place: a Linux bridge, a bond or a team hands every
    /// frame of its ports up to itself, where a macvtap sees it.
    pub(crate) fn master_carries_macvtap(&self) -> bool {
        matches!(self.kind.as_deref(), Some("bridge" | "bond" | "team"))
    }

    /// What to do instead, e.g. `use br0 as lowerDevice`.
    pub(crate) fn fix(&self) -> String {
        if self.master_carries_macvtap() {
            format!("use {} as lowerDevice", self.master)
        } else if self.kind.as_deref() == Some("openvswitch") {
            "use a NIC that Open vSwitch does not own".to_string()
        } else {
            format!(
                "use a NIC without a master, or release {} from {}",
                self.link, self.master
            )
        }
    }

    /// `eth0 is a port of bridge br0`, and the like.
    pub(crate) fn relation(&self) -> String {
        let (link, master) = (&self.link, &self.master);
        match self.kind.as_deref() {
            Some("bridge") => format!("{link} is a port of bridge {master}"),
            Some("bond") => format!("{link} is a slave of bond {master}"),
            Some("team") => format!("{link} is a port of team {master}"),
            Some("openvswitch") => {
                format!("{link} is a port of Open vSwitch (datapath {master})")
            }
            Some(kind) => format!("{link} is enslaved to {kind} link {master}"),
            None => format!("{link} is enslaved to {master}"),
        }
    }
}

/// Why a NIC with a master cannot carry a macvtap, as every message about
/// one says it.
pub(crate) const NEEDS_FREE_NIC: &str = "a macvtap needs a NIC that no bridge, bond or OVS owns";

impl fmt::Display for Owner {
    /// The whole story, e.g. `nicA is a port of bridge br0, and a macvtap
    /// needs a NIC that no bridge, bond or OVS owns; use br0 as lowerDevice`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, and {NEEDS_FREE_NIC}; {}",
            self.relation(),
            self.fix()
        )
    }
}

/// Who owns `link`'s receive path, judged from its master in `links` (the
/// same namespace's links: a master is always in its port's namespace).
/// Every master takes its ports' receive path except a VRF, which leaves it
/// alone in current kernels (`drivers/net/vrf.c` `do_vrf_add_slave` only
/// links the master; the first VRF driver registered an rx_handler);
/// `None` also when the link has no master.
pub(crate) fn receive_path_owner(link: &Link, links: &[Link]) -> Option<Owner> {
    let index = link.master?;
    let master = links.iter().find(|l| l.index == index);
    let kind = master.and_then(|m| m.kind.clone());
    if kind.as_deref() == Some("vrf") {
        return None;
    }
    Some(Owner {
        link: link.name.clone(),
        master: master.map_or_else(|| format!("link {index}"), |m| m.name.clone()),
        kind,
    })
}
