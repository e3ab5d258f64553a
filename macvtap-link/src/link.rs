//! What the kernel says about a link, and the real [`Links`]: the link,
//! address and route operations of a [`Handle`], named after iproute2's
//! verbs (address and route messages are built in [`crate::addr`] and
//! [`crate::route`]).

use crate::error::{Error, Result};
use crate::kernel::{Links, Op};
use crate::netlink::Handle;
use crate::netns::Netns;
use crate::{addr, route};
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::AddressMessage;
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoMacVtap, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, MacVtapMode,
    State,
};
use nix::errno::Errno;
use std::fmt;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
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
    fn to_netlink(self) -> MacVtapMode {
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
    /// The macvtap mode, for macvtap links.
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

    fn from_message(msg: &LinkMessage) -> Self {
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

impl Handle {
    /// `"<what> <target> in <namespace>"`, the phrase errors start with.
    fn link_op(&self, what: &str, target: impl fmt::Display) -> String {
        format!("{what} {target} in {}", self.netns().display())
    }

    fn get_link_msg(&self, msg: LinkMessage, op: impl Fn() -> String) -> Result<Option<Link>> {
        match self.request(RouteNetlinkMessage::GetLink(msg), 0, Op::GetLink, op) {
            Ok(replies) => Ok(replies.iter().find_map(|r| match r {
                RouteNetlinkMessage::NewLink(l) => Some(Link::from_message(l)),
                _ => None,
            })),
            Err(e) if e.errno() == Some(Errno::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The real kernel's link, address and route operations: each one request
/// on the handle's socket, answered and checked before it returns.
impl Links for Handle {
    fn netns(&self) -> &Path {
        Handle::netns(self)
    }

    fn get_link(&self, name: &str) -> Result<Option<Link>> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.get_link_msg(msg, || self.link_op("looking up link", name))
    }

    fn get_link_by_index(&self, index: u32) -> Result<Option<Link>> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.get_link_msg(msg, || self.link_op("looking up link index", index))
    }

    fn list_links(&self) -> Result<Vec<Link>> {
        let replies = self.dump(
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            Op::ListLinks,
            || format!("listing links in {}", self.netns().display()),
        )?;
        Ok(replies
            .iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewLink(l) => Some(Link::from_message(l)),
                _ => None,
            })
            .collect())
    }

    fn add_macvtap_at(
        &self,
        name: &str,
        lower_index: u32,
        mode: MacvtapMode,
        txqueuelen: Option<u32>,
        index: Option<u32>,
    ) -> Result<Link> {
        let mut msg = LinkMessage::default();
        if let Some(i) = index {
            msg.header.index = i;
        }
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.push(LinkAttribute::Link(lower_index));
        if let Some(q) = txqueuelen {
            msg.attributes.push(LinkAttribute::TxQueueLen(q));
        }
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::MacVtap),
            LinkInfo::Data(InfoData::MacVtap(vec![InfoMacVtap::Mode(
                mode.to_netlink(),
            )])),
        ]));
        let what = || {
            let at = index
                .map(|i| format!(" at ifindex {i}"))
                .unwrap_or_default();
            self.link_op(&format!("creating {mode} macvtap"), format!("{name}{at}"))
        };
        self.request(
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            Op::AddMacvtap,
            what,
        )?;
        // Never leave a link behind that the caller does not know about.
        match self.get_link(name) {
            Ok(Some(link)) => Ok(link),
            Ok(None) => Err(Error::Netlink {
                op: Op::AddMacvtap,
                what: format!("{}, then reading it back", what()),
                source: Errno::ENODEV,
            }),
            Err(e) => {
                let mut del = LinkMessage::default();
                del.attributes.push(LinkAttribute::IfName(name.to_string()));
                let _ = self.request(RouteNetlinkMessage::DelLink(del), 0, Op::DelLink, what);
                Err(e)
            }
        }
    }

    fn del_link(&self, index: u32, name: &str) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.request(RouteNetlinkMessage::DelLink(msg), 0, Op::DelLink, || {
            self.link_op("deleting link", format!("{name} (index {index})"))
        })?;
        Ok(())
    }

    fn set_link_ns_at(
        &self,
        index: u32,
        name: &str,
        target: &Netns,
        new_name: &str,
        new_index: u32,
    ) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes
            .push(LinkAttribute::NetNsFd(target.as_fd().as_raw_fd()));
        msg.attributes
            .push(LinkAttribute::IfName(new_name.to_string()));
        msg.attributes
            .push(LinkAttribute::NewIfIndex(new_index as i32));
        self.request(RouteNetlinkMessage::SetLink(msg), 0, Op::MoveLink, || {
            format!(
                "moving link {name} (index {index}) from {} into {} as {new_name} with ifindex \
                 {new_index}",
                self.netns().display(),
                target.path().display()
            )
        })?;
        Ok(())
    }

    fn set_link(&self, index: u32, name: &str, change: &LinkChange) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        for (want, flag) in [
            (change.up, LinkFlags::Up),
            (change.promisc, LinkFlags::Promisc),
        ] {
            if let Some(on) = want {
                msg.header.change_mask |= flag;
                if on {
                    msg.header.flags |= flag;
                }
            }
        }
        if let Some(mtu) = change.mtu {
            msg.attributes.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(mac) = change.mac {
            msg.attributes.push(LinkAttribute::Address(mac.to_vec()));
        }
        if let Some(n) = &change.name {
            msg.attributes.push(LinkAttribute::IfName(n.clone()));
        }
        if let Some(a) = &change.alias {
            msg.attributes.push(LinkAttribute::IfAlias(a.clone()));
        }
        self.request(RouteNetlinkMessage::SetLink(msg), 0, Op::SetLink, || {
            format!("{change} on {name} in {}", self.netns().display())
        })?;
        Ok(())
    }

    fn add_addr(&self, index: u32, addr: IpAddr, prefix_len: u8) -> Result<()> {
        self.request(
            RouteNetlinkMessage::NewAddress(addr::new_address(index, addr, prefix_len)),
            NLM_F_CREATE | NLM_F_EXCL,
            Op::AddAddr,
            || {
                self.link_op(
                    &format!("adding address {addr}/{prefix_len} to link index"),
                    index,
                )
            },
        )?;
        Ok(())
    }

    fn list_addrs(&self, index: u32) -> Result<Vec<(IpAddr, u8)>> {
        let replies = self.dump(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            Op::ListAddrs,
            || self.link_op("listing addresses of link index", index),
        )?;
        Ok(addr::addresses_of(&replies, index))
    }

    fn add_route(
        &self,
        index: u32,
        dst: IpAddr,
        prefix_len: u8,
        gateway: Option<IpAddr>,
    ) -> Result<()> {
        self.request(
            RouteNetlinkMessage::NewRoute(route::new_route(index, dst, prefix_len, gateway)),
            NLM_F_CREATE | NLM_F_EXCL,
            Op::AddRoute,
            || {
                let via = gateway.map(|g| format!(" via {g}")).unwrap_or_default();
                self.link_op(
                    &format!("adding route {dst}/{prefix_len}{via} on link index"),
                    index,
                )
            },
        )?;
        Ok(())
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
