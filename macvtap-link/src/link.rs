//! What the kernel says about a link ([`Link`], decoded from its netlink
//! message), what to change on one ([`LinkChange`]), macvtap modes and MACs.

use netlink_packet_route::link::{
    InfoData, InfoMacVlan, InfoMacVtap, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
    MacVtapMode, State,
};
use std::fmt;
use std::str::FromStr;

/// The macvtap modes the kernel offers, spelled as in the device plugin config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MacvtapMode {
    /// Frames between macvtaps of one NIC are switched in the kernel.
    #[default]
    Bridge,
    /// Frames go out to the switch even between siblings.
    Vepa,
    /// Siblings cannot talk to each other at all.
    Private,
    /// The macvtap takes over the whole NIC.
    Passthru,
}

impl MacvtapMode {
    pub(crate) fn to_netlink(self) -> MacVtapMode {
        match self {
            MacvtapMode::Bridge => MacVtapMode::Bridge,
            MacvtapMode::Vepa => MacVtapMode::Vepa,
            MacvtapMode::Private => MacVtapMode::Private,
            MacvtapMode::Passthru => MacVtapMode::Passthrough,
        }
    }

    fn from_netlink(mode: &MacVtapMode) -> Option<Self> {
        match mode {
            MacVtapMode::Bridge => Some(MacvtapMode::Bridge),
            MacVtapMode::Vepa => Some(MacvtapMode::Vepa),
            MacVtapMode::Private => Some(MacvtapMode::Private),
            MacVtapMode::Passthrough => Some(MacvtapMode::Passthru),
            _ => None,
        }
    }

    /// The name used in configs: `bridge`, `vepa`, `private` or `passthru`.
    pub fn as_str(self) -> &'static str {
        match self {
            MacvtapMode::Bridge => "bridge",
            MacvtapMode::Vepa => "vepa",
            MacvtapMode::Private => "private",
            MacvtapMode::Passthru => "passthru",
        }
    }
}

impl fmt::Display for MacvtapMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MacvtapMode {
    type Err = String;

    /// Parses a config mode; the empty string means `bridge`, as in the Go project.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "" | "bridge" => Ok(MacvtapMode::Bridge),
            "vepa" => Ok(MacvtapMode::Vepa),
            "private" => Ok(MacvtapMode::Private),
            "passthru" => Ok(MacvtapMode::Passthru),
            other => Err(format!(
                "unknown macvtap mode {other:?} (expected bridge, vepa, private or passthru)"
            )),
        }
    }
}

/// What the kernel says about one link.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Link {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// `IFLA_INFO_KIND`, e.g. `macvtap`, `veth`; `None` for physical NICs.
    pub kind: Option<String>,
    /// Hardware address.
    pub mac: Option<[u8; 6]>,
    /// MTU.
    pub mtu: u32,
    /// Interface flags (`IFF_*`).
    pub flags: u32,
    /// Operational state as `ip` prints it: `up`, `down`, `unknown`, ...
    pub oper_state: String,
    /// Index of the lower device (`IFLA_LINK`), e.g. the NIC of a macvtap.
    pub lower_index: Option<u32>,
    /// Whether the lower device lives in another namespace (`IFLA_LINK_NETNSID`).
    pub lower_in_other_netns: bool,
    /// The macvtap mode, for macvtap links, and the mode of a macvlan link
    /// (the kernel's macvlan and macvtap share their modes).
    pub macvtap_mode: Option<MacvtapMode>,
    /// Transmit queue length.
    pub txqueuelen: u32,
    /// Promiscuity counter.
    pub promiscuity: u32,
    /// `IFLA_IFALIAS`, the free-text alias (`ip link set ... alias`).
    pub alias: Option<String>,
    /// Index of the link's master (`IFLA_MASTER`), e.g. the bridge of a
    /// bridge port or the bond of a bond slave.
    pub master: Option<u32>,
}

impl Link {
    /// Whether the link is administratively up.
    pub fn is_up(&self) -> bool {
        self.flags & LinkFlags::Up.bits() != 0
    }

    /// Whether `IFF_PROMISC` is set.
    pub fn is_promisc(&self) -> bool {
        self.flags & LinkFlags::Promisc.bits() != 0
    }

    /// Whether this is a macvtap link.
    pub fn is_macvtap(&self) -> bool {
        self.kind.as_deref() == Some("macvtap")
    }

    /// The MAC address as `aa:bb:cc:dd:ee:ff`, or an empty string.
    pub fn mac_string(&self) -> String {
        self.mac.map(|m| format_mac(&m)).unwrap_or_default()
    }

    pub(crate) fn from_message(msg: &LinkMessage) -> Self {
        let mut link = Link {
            index: msg.header.index,
            flags: msg.header.flags.bits(),
            ..Default::default()
        };
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => link.name = n.clone(),
                LinkAttribute::Mtu(m) => link.mtu = *m,
                LinkAttribute::Address(a) if a.len() == 6 => {
                    let mut mac = [0u8; 6];
                    mac.copy_from_slice(a);
                    link.mac = Some(mac);
                }
                LinkAttribute::Link(l) => link.lower_index = Some(*l),
                LinkAttribute::Controller(m) if *m != 0 => link.master = Some(*m),
                LinkAttribute::LinkNetNsId(_) => link.lower_in_other_netns = true,
                LinkAttribute::TxQueueLen(q) => link.txqueuelen = *q,
                LinkAttribute::Promiscuity(p) => link.promiscuity = *p,
                LinkAttribute::OperState(s) => link.oper_state = state_name(s),
                LinkAttribute::IfAlias(a) if !a.is_empty() => link.alias = Some(a.clone()),
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        match info {
                            LinkInfo::Kind(k) => link.kind = Some(k.to_string()),
                            LinkInfo::Data(InfoData::MacVtap(data)) => {
                                for d in data {
                                    if let InfoMacVtap::Mode(m) = d {
                                        link.macvtap_mode = MacvtapMode::from_netlink(m);
                                    }
                                }
                            }
                            // A macvlan shares the modes, and a passthru one
                            // rules out macvtaps on its NIC as well.
                            LinkInfo::Data(InfoData::MacVlan(data)) => {
                                for d in data {
                                    if let InfoMacVlan::Mode(m) = d {
                                        link.macvtap_mode = MacvtapMode::from_netlink(m);
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        link
    }
}

fn state_name(s: &State) -> String {
    match s {
        State::Up => "up".into(),
        State::Down => "down".into(),
        State::LowerLayerDown => "lowerlayerdown".into(),
        State::Dormant => "dormant".into(),
        State::NotPresent => "notpresent".into(),
        State::Testing => "testing".into(),
        _ => "unknown".into(),
    }
}

/// Formats a MAC address as lower-case colon-separated hex.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff` (or with dashes) into bytes.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (byte, part) in mac.iter_mut().zip(parts) {
        if part.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    Some(mac)
}

/// Changes to apply to a link in one request; `None` leaves a field alone.
/// It displays as a phrase: `setting MTU 1400, MAC 02:23:45:67:89:01 and
/// state up`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkChange {
    /// New MTU.
    pub mtu: Option<u32>,
    /// New MAC address.
    pub mac: Option<[u8; 6]>,
    /// Set or clear `IFF_UP`.
    pub up: Option<bool>,
    /// Set or clear `IFF_PROMISC`.
    pub promisc: Option<bool>,
    /// New name.
    pub name: Option<String>,
    /// New alias (`IFLA_IFALIAS`); an empty string removes it.
    pub alias: Option<String>,
}

impl fmt::Display for LinkChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on_off = |on: bool| if on { "on" } else { "off" };
        let mut parts = Vec::new();
        if let Some(n) = &self.name {
            parts.push(format!("name {n}"));
        }
        if let Some(m) = self.mtu {
            parts.push(format!("MTU {m}"));
        }
        if let Some(m) = &self.mac {
            parts.push(format!("MAC {}", format_mac(m)));
        }
        if let Some(p) = self.promisc {
            parts.push(format!("promiscuous mode {}", on_off(p)));
        }
        if let Some(a) = &self.alias {
            parts.push(format!("alias {a}"));
        }
        if let Some(up) = self.up {
            parts.push(format!("state {}", if up { "up" } else { "down" }));
        }
        match parts.len() {
            0 => f.write_str("changing nothing"),
            1 => write!(f, "setting {}", parts[0]),
            n => write!(
                f,
                "setting {} and {}",
                parts[..n - 1].join(", "),
                parts[n - 1]
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_round_trip() {
        let mac = parse_mac("02:AB:cd:00:11:ff").unwrap();
        assert_eq!(format_mac(&mac), "02:ab:cd:00:11:ff");
        assert_eq!(parse_mac("02-ab-cd-00-11-ff"), Some(mac));
        assert_eq!(parse_mac("02:ab:cd:00:11"), None);
        assert_eq!(parse_mac("02:ab:cd:00:11:fff"), None);
        assert_eq!(parse_mac("zz:ab:cd:00:11:ff"), None);
    }

    #[test]
    fn a_change_reads_as_a_phrase() {
        let change = LinkChange {
            mtu: Some(1400),
            mac: parse_mac("02:23:45:67:89:01"),
            up: Some(true),
            ..Default::default()
        };
        assert_eq!(
            change.to_string(),
            "setting MTU 1400, MAC 02:23:45:67:89:01 and state up"
        );
        let mac_only = LinkChange {
            mac: parse_mac("02:23:45:67:89:01"),
            ..Default::default()
        };
        assert_eq!(mac_only.to_string(), "setting MAC 02:23:45:67:89:01");
    }

    #[test]
    fn modes_parse_like_the_go_project() {
        assert_eq!("".parse::<MacvtapMode>().unwrap(), MacvtapMode::Bridge);
        assert_eq!(
            "passthru".parse::<MacvtapMode>().unwrap(),
            MacvtapMode::Passthru
        );
        assert!("source".parse::<MacvtapMode>().is_err());
    }
}
