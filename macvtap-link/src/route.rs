//! Route messages: what [`crate::Links::add_route`] sends.

use netlink_packet_route::AddressFamily;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use std::net::IpAddr;

/// The request that adds a route to `dst/prefix_len` through link `index`,
/// via `gateway` when given (otherwise a link-scope route).
pub(crate) fn new_route(
    index: u32,
    dst: IpAddr,
    prefix_len: u8,
    gateway: Option<IpAddr>,
) -> RouteMessage {
    let mut msg = RouteMessage::default();
    msg.header = route_header(dst, prefix_len, gateway.is_some());
    if prefix_len > 0 {
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(dst)));
    }
    if let Some(gw) = gateway {
        msg.attributes
            .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
    }
    msg.attributes.push(RouteAttribute::Oif(index));
    msg
}

#[allow(clippy::field_reassign_with_default)] // RouteHeader is non_exhaustive
fn route_header(dst: IpAddr, prefix_len: u8, has_gateway: bool) -> RouteHeader {
    let mut h = RouteHeader::default();
    h.address_family = match dst {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    h.destination_prefix_length = prefix_len;
    h.table = RouteHeader::RT_TABLE_MAIN;
    h.protocol = RouteProtocol::Boot;
    h.scope = if has_gateway {
        RouteScope::Universe
    } else {
        RouteScope::Link
    };
    h.kind = RouteType::Unicast;
    h
}
