//! Address messages: what [`crate::Links::add_addr`] sends and how
//! [`crate::Links::list_addrs`] reads the kernel's answer.

use netlink_packet_route::AddressFamily;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{
    AddressAttribute, AddressHeaderFlags, AddressMessage, AddressScope,
};
use std::net::IpAddr;

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
