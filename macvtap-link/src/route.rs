//! Route messages: what [`crate::Links::add_route`] sends, and the
//! namespace's default routes as [`crate::Handle::list_default_routes`] and
//! the [`crate::monitor::AddressRouteMonitor`] give them ([`DefaultRoute`]).

use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::fmt;
use std::net::IpAddr;

/// A default route (a unicast route to `0.0.0.0/0` or `::/0`, in any
/// table), as a route dump or notification says it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DefaultRoute {
    /// Whether it is IPv6's (`::/0`) rather than IPv4's.
    pub ipv6: bool,
    /// Its routing table (254 is `main`).
    pub table: u32,
    /// The links it leaves through: its `RTA_OIF`, or each next hop's of a
    /// multipath route.
    pub oifs: Vec<u32>,
    /// The nexthop object it uses (`RTA_NH_ID`), whose links the route
    /// names only in the kernel's compatibility mode
    /// (`net.ipv4.nexthop_compat_mode`, on by default).
    pub nexthop_id: Option<u32>,
}

impl DefaultRoute {
    /// The main routing table's number.
    pub const MAIN_TABLE: u32 = RouteHeader::RT_TABLE_MAIN as u32;

    /// The default route a route message carries; `None` for any other
    /// route (another destination, or not unicast: `unreachable`,
    /// `blackhole`, `local` and the like lead nowhere on a link).
    pub(crate) fn from_message(msg: &RouteMessage) -> Option<Self> {
        let h = &msg.header;
        if h.destination_prefix_length != 0 || h.kind != RouteType::Unicast {
            return None;
        }
        let ipv6 = match h.address_family {
            AddressFamily::Inet => false,
            AddressFamily::Inet6 => true,
            _ => return None,
        };
        let mut route = Self {
            ipv6,
            table: u32::from(h.table),
            oifs: Vec::new(),
            nexthop_id: None,
        };
        for a in &msg.attributes {
            match a {
                RouteAttribute::Table(t) => route.table = *t,
                RouteAttribute::Oif(i) => route.oifs.push(*i),
                RouteAttribute::MultiPath(hops) => {
                    route.oifs.extend(hops.iter().map(|h| h.interface_index))
                }
                RouteAttribute::NhId(id) => route.nexthop_id = Some(*id),
                _ => {}
            }
        }
        route.oifs.sort_unstable();
        route.oifs.dedup();
        Some(route)
    }
}

impl fmt::Display for DefaultRoute {
    /// `the IPv4 default route`, with its table when not `main`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the {} default route",
            if self.ipv6 { "IPv6" } else { "IPv4" }
        )?;
        if self.table != Self::MAIN_TABLE {
            write!(f, " of routing table {}", self.table)?;
        }
        Ok(())
    }
}

/// Every default route in a route dump.
pub(crate) fn default_routes(replies: &[RouteNetlinkMessage]) -> Vec<DefaultRoute> {
    replies
        .iter()
        .filter_map(|r| match r {
            RouteNetlinkMessage::NewRoute(m) => DefaultRoute::from_message(m),
            _ => None,
        })
        .collect()
}

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
