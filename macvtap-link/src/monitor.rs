//! Link events: a netlink socket subscribed to `RTNLGRP_LINK`.
//!
//! The kernel sends a message on this socket whenever a link of the
//! namespace appears, changes (up/down, carrier, rename) or vanishes. Readers
//! use the events as a trigger and re-read the links they care about, so a
//! lost event (socket overrun) only costs one extra re-read.

use crate::error::{Error, Result};
use crate::netlink::open_socket;
use crate::netns::Netns;
use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_sys::{Socket, SocketAddr};
use nix::errno::Errno;
use std::path::{Path, PathBuf};

/// The rtnetlink multicast group of link notifications (`RTNLGRP_LINK`).
const RTNLGRP_LINK: u32 = 1;

/// One link notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// A link appeared or changed (`RTM_NEWLINK`).
    Changed {
        /// Interface index.
        index: u32,
        /// Interface name (empty if the kernel did not say).
        name: String,
        /// Interface flags (`IFF_*`) after the change.
        flags: u32,
    },
    /// A link vanished (`RTM_DELLINK`).
    Removed {
        /// Interface index.
        index: u32,
        /// Interface name (empty if the kernel did not say).
        name: String,
    },
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

    /// Blocks until the kernel sends notifications and returns them (at least
    /// one event per call).
    pub fn recv(&self) -> Result<Vec<LinkEvent>> {
        let mut rx = Vec::with_capacity(64 * 1024);
        loop {
            rx.clear();
            match self.socket.recv(&mut rx, 0) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(Errno::ENOBUFS as i32) => {
                    return Ok(vec![LinkEvent::Overrun]);
                }
                Err(e) if e.raw_os_error() == Some(Errno::EINTR as i32) => continue,
                Err(e) => return Err(Error::Socket(e)),
            }
            let events = parse_events(&rx, &self.netns)?;
            if !events.is_empty() {
                return Ok(events);
            }
        }
    }
}

fn parse_events(buf: &[u8], netns: &Path) -> Result<Vec<LinkEvent>> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < buf.len() {
        let msg =
            NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[offset..]).map_err(|e| {
                Error::Decode {
                    op: format!("reading link events in {}", netns.display()),
                    msg: e.to_string(),
                }
            })?;
        let len = msg.header.length as usize;
        if len == 0 {
            break;
        }
        offset += (len + 3) & !3;
        match msg.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)) => {
                out.push(LinkEvent::Changed {
                    index: l.header.index,
                    name: link_name(&l),
                    flags: l.header.flags.bits(),
                });
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(l)) => {
                out.push(LinkEvent::Removed {
                    index: l.header.index,
                    name: link_name(&l),
                });
            }
            NetlinkPayload::Overrun(_) => out.push(LinkEvent::Overrun),
            _ => {}
        }
    }
    Ok(out)
}

fn link_name(l: &LinkMessage) -> String {
    l.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        })
        .unwrap_or_default()
}
