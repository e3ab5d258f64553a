//! Link events: a netlink socket subscribed to `RTNLGRP_LINK`; and address
//! and default route events: one subscribed to the IPv4 and IPv6 address
//! and route groups.
//!
//! The kernel sends a message on the first socket whenever a link of the
//! namespace appears, changes (up/down, carrier, rename, master) or
//! vanishes. Each message carries the link's whole state, decoded here into
//! the same [`Link`] a dump gives, so readers apply events to what they know
//! and re-read every link only after [`LinkEvent::Overrun`] (lost messages).
//! The second says when an address is added or removed and when a default
//! route comes or goes ([`AddressRouteEvent`]); every other route's
//! notification (a node adds one per pod with some network plugins) is
//! read and dropped here.

use crate::addr::Address;
use crate::error::{Error, Result};
use crate::link::Link;
use crate::netlink::open_socket;
use crate::netns::Netns;
use crate::route::DefaultRoute;
use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{Socket, SocketAddr};
use nix::errno::Errno;
use std::path::{Path, PathBuf};

/// The rtnetlink multicast group of link notifications (`RTNLGRP_LINK`).
const RTNLGRP_LINK: u32 = 1;
/// The rtnetlink multicast groups of address and route notifications
/// (`RTNLGRP_IPV4_IFADDR`, `RTNLGRP_IPV4_ROUTE`, `RTNLGRP_IPV6_IFADDR`,
/// `RTNLGRP_IPV6_ROUTE`).
const ADDRESS_ROUTE_GROUPS: [u32; 4] = [5, 7, 9, 11];

/// How many datagrams one [`LinkMonitor::recv`] takes at most, so a
/// lasting storm still yields batches to act on.
pub const MAX_BATCH: usize = 256;

/// One link notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// A link appeared or changed (`RTM_NEWLINK`): its whole state after the change.
    Changed(Link),
    /// A link vanished (`RTM_DELLINK`): its last state.
    Removed(Link),
    /// The socket overflowed and events were lost; re-read everything.
    Overrun,
}

/// A socket that receives the link notifications of one network namespace.
#[derive(Debug)]
pub struct LinkMonitor {
    socket: Socket,
    netns: PathBuf,
}

impl LinkMonitor {
    /// Subscribes to link events of the calling thread's network namespace.
    pub fn current() -> Result<Self> {
        let (socket, netns) = open_socket(None, Self::setup)?;
        Ok(Self { socket, netns })
    }

    /// Subscribes to link events of `netns` (the socket is opened from a helper
    /// thread; the caller's namespace is not changed).
    pub fn in_netns(netns: &Netns) -> Result<Self> {
        let (socket, netns) = open_socket(Some(netns), Self::setup)?;
        Ok(Self { socket, netns })
    }

    fn setup(socket: &mut Socket) -> std::io::Result<()> {
        socket.bind(&SocketAddr::new(0, 0))?;
        socket.add_membership(RTNLGRP_LINK)?;
        // A bigger buffer makes overruns rare when many links change at once;
        // failing to get it is harmless because overruns are handled.
        let _ = socket.set_rx_buf_sz(1024 * 1024);
        Ok(())
    }

    /// The namespace this monitor watches, for messages.
    pub fn netns(&self) -> &Path {
        &self.netns
    }

    /// Blocks until the kernel sends notifications and returns them, with
    /// every further one already queued (at most [`MAX_BATCH`] messages), so
    /// a burst is handled as one batch. At least one event per call; a batch
    /// that lost messages ends with [`LinkEvent::Overrun`].
    pub fn recv(&self) -> Result<Vec<LinkEvent>> {
        receive(
            &self.socket,
            &self.netns,
            "link",
            LinkEvent::Overrun,
            |msg| match msg {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)) => {
                    Some(LinkEvent::Changed(Link::from_message(&l)))
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(l)) => {
                    Some(LinkEvent::Removed(Link::from_message(&l)))
                }
                NetlinkPayload::Overrun(_) => Some(LinkEvent::Overrun),
                _ => None,
            },
        )
    }
}

/// One address or default route notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressRouteEvent {
    /// An address was added (`RTM_NEWADDR`; also sent when one changes).
    AddressAdded(Address),
    /// An address was removed (`RTM_DELADDR`).
    AddressRemoved(Address),
    /// A default route was added or replaced (`RTM_NEWROUTE`).
    DefaultRouteAdded(DefaultRoute),
    /// A default route was removed (`RTM_DELROUTE`).
    DefaultRouteRemoved(DefaultRoute),
    /// The socket overflowed and events were lost; re-read everything.
    Overrun,
}

/// A socket that receives the address and default route notifications of
/// one network namespace.
#[derive(Debug)]
pub struct AddressRouteMonitor {
    socket: Socket,
    netns: PathBuf,
}

impl AddressRouteMonitor {
    /// Subscribes to address and route events of the calling thread's
    /// network namespace.
    pub fn current() -> Result<Self> {
        let (socket, netns) = open_socket(None, Self::setup)?;
        Ok(Self { socket, netns })
    }

    /// Subscribes to address and route events of `netns` (the socket is
    /// opened from a helper thread; the caller's namespace is not changed).
    pub fn in_netns(netns: &Netns) -> Result<Self> {
        let (socket, netns) = open_socket(Some(netns), Self::setup)?;
        Ok(Self { socket, netns })
    }

    fn setup(socket: &mut Socket) -> std::io::Result<()> {
        socket.bind(&SocketAddr::new(0, 0))?;
        for group in ADDRESS_ROUTE_GROUPS {
            socket.add_membership(group)?;
        }
        // Routes come and go with pods on some nodes: a bigger buffer
        // makes overruns rare, and they are handled anyway.
        let _ = socket.set_rx_buf_sz(1024 * 1024);
        Ok(())
    }

    /// The namespace this monitor watches, for messages.
    pub fn netns(&self) -> &Path {
        &self.netns
    }

    /// Blocks until the kernel sends an address notification or one of a
    /// default route, and returns it with every further one already queued
    /// (as [`LinkMonitor::recv`] batches); notifications of other routes
    /// are dropped without waking the caller. A batch that lost messages
    /// ends with [`AddressRouteEvent::Overrun`].
    pub fn recv(&self) -> Result<Vec<AddressRouteEvent>> {
        receive(
            &self.socket,
            &self.netns,
            "address and route",
            AddressRouteEvent::Overrun,
            |msg| match msg {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewAddress(a)) => {
                    Address::from_message(&a).map(AddressRouteEvent::AddressAdded)
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelAddress(a)) => {
                    Address::from_message(&a).map(AddressRouteEvent::AddressRemoved)
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(r)) => {
                    DefaultRoute::from_message(&r).map(AddressRouteEvent::DefaultRouteAdded)
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelRoute(r)) => {
                    DefaultRoute::from_message(&r).map(AddressRouteEvent::DefaultRouteRemoved)
                }
                NetlinkPayload::Overrun(_) => Some(AddressRouteEvent::Overrun),
                _ => None,
            },
        )
    }
}

/// Blocks on `socket` until at least one notification decodes to an event
/// (`decode`; `None` drops it), then takes every further one queued, up to
/// [`MAX_BATCH`] datagrams; a lost batch (`ENOBUFS`) ends with `overrun`.
/// `what` names the events in errors (`link`).
fn receive<E>(
    socket: &Socket,
    netns: &Path,
    what: &str,
    overrun: E,
    decode: impl Fn(NetlinkPayload<RouteNetlinkMessage>) -> Option<E>,
) -> Result<Vec<E>> {
    let mut rx = Vec::with_capacity(64 * 1024);
    let mut events = Vec::new();
    let mut received = 0;
    while events.is_empty() || received < MAX_BATCH {
        // Block only while nothing is in hand.
        let flags = if events.is_empty() {
            0
        } else {
            nix::libc::MSG_DONTWAIT
        };
        rx.clear();
        match socket.recv(&mut rx, flags) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(Errno::ENOBUFS as i32) => {
                events.push(overrun);
                return Ok(events);
            }
            Err(e) if e.raw_os_error() == Some(Errno::EINTR as i32) => continue,
            Err(e) if e.raw_os_error() == Some(Errno::EAGAIN as i32) => break,
            Err(e) => return Err(Error::Socket(e)),
        }
        received += 1;
        for msg in parse_messages(&rx, netns, what)? {
            events.extend(decode(msg));
        }
    }
    Ok(events)
}

/// The netlink messages of one datagram.
fn parse_messages(
    buf: &[u8],
    netns: &Path,
    what: &str,
) -> Result<Vec<NetlinkPayload<RouteNetlinkMessage>>> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < buf.len() {
        let msg =
            NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[offset..]).map_err(|e| {
                Error::Decode {
                    op: format!("reading {what} events in {}", netns.display()),
                    msg: e.to_string(),
                }
            })?;
        let len = msg.header.length as usize;
        if len == 0 {
            break;
        }
        offset += (len + 3) & !3;
        out.push(msg.payload);
    }
    Ok(out)
}
