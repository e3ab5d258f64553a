//! Address operations on a link, named after iproute2's verbs.

use crate::error::Result;
use crate::kernel::Op;
use crate::netlink::Handle;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::address::{
    AddressAttribute, AddressHeaderFlags, AddressMessage, AddressScope,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::net::IpAddr;

impl Handle {
    /// Adds `addr/prefix_len` to link `index` (IPv6 without duplicate address
    /// detection, so it is usable at once).
    pub fn add_addr(&self, index: u32, addr: IpAddr, prefix_len: u8) -> Result<()> {
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
        self.request(
            RouteNetlinkMessage::NewAddress(msg),
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

    /// Lists the addresses (with prefix length) on link `index`.
    pub fn list_addrs(&self, index: u32) -> Result<Vec<(IpAddr, u8)>> {
        let replies = self.dump(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            Op::ListAddrs,
            || self.link_op("listing addresses of link index", index),
        )?;
        let mut out = Vec::new();
        for r in &replies {
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
        Ok(out)
    }
}
