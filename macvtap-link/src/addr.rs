//! Address messages: what [`crate::Links::add_addr`] sends, how
//! [`crate::Links::list_addrs`] reads the kernel's answer, and every
//! address of a namespace as [`crate::Handle::list_addresses`] and the
//! [`crate::monitor::AddressRouteMonitor`] give them ([`Address`]).

use netlink_packet_route::AddressFamily;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{
    AddressAttribute, AddressHeaderFlags, AddressMessage, AddressScope,
};
use std::fmt;
use std::net::IpAddr;

/// One address of a link, as an address dump or notification says it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Address {
    /// The index of the link that holds it.
    pub index: u32,
    /// The address (`IFA_LOCAL`, else `IFA_ADDRESS`: on a point-to-point
    /// link the latter is the peer's).
    pub ip: IpAddr,
    /// Its prefix length.
    pub prefix_len: u8,
    /// Whether its scope is global (`RT_SCOPE_UNIVERSE`): an address the
    /// node is reached at beyond the link, unlike `127.0.0.1` or `fe80::/10`.
    pub global: bool,
}

impl Address {
    /// The address an address message carries; `None` for a message
    /// without one.
    pub(crate) fn from_message(msg: &AddressMessage) -> Option<Self> {
        let local = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(ip) => Some(*ip),
            _ => None,
        });
        let address = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        });
        Some(Self {
            index: msg.header.index,
            ip: local.or(address)?,
            prefix_len: msg.header.prefix_len,
            global: msg.header.scope == AddressScope::Universe,
        })
    }
}

impl fmt::Display for Address {
    /// `192.0.2.1/24`, as `ip address` shows it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.ip, self.prefix_len)
    }
}

/// The request that adds `addr/prefix_len` to link `index` (IPv6 without
/// duplicate address detection, so it is usable at once).
pub(crate) fn new_address(index: u32, addr: IpAddr, prefix_len: u8) -> AddressMessage {
    let mut msg = AddressMessage::default();
    msg.header.index = index;
    msg.header.prefix_len = prefix_len;
    msg.header.scope = AddressScope::Universe;
    match addr {
        IpAddr::V4(_) => {
            msg.header.family = AddressFamily::Inet;
            msg.attributes.push(AddressAttribute::Local(addr));
        }
        IpAddr::V6(_) => {
            msg.header.family = AddressFamily::Inet6;
            msg.header.flags = AddressHeaderFlags::Nodad;
        }
    }
    msg.attributes.push(AddressAttribute::Address(addr));
    msg
}

/// Every address in an address dump.
pub(crate) fn addresses(replies: &[RouteNetlinkMessage]) -> Vec<Address> {
    replies
        .iter()
        .filter_map(|r| match r {
            RouteNetlinkMessage::NewAddress(a) => Address::from_message(a),
            _ => None,
        })
        .collect()
}

/// The addresses (with prefix length) on link `index`, from an address dump.
pub(crate) fn addresses_of(replies: &[RouteNetlinkMessage], index: u32) -> Vec<(IpAddr, u8)> {
    let mut out = Vec::new();
    for r in replies {
        if let RouteNetlinkMessage::NewAddress(a) = r {
            if a.header.index != index {
                continue;
            }
            if let Some(ip) = a.attributes.iter().find_map(|at| match at {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            }) {
                out.push((ip, a.header.prefix_len));
            }
        }
    }
    out
}
