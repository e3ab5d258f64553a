//! Link events: a netlink socket subscribed to `RTNLGRP_LINK`.
//!
//! The kernel sends a message on this socket whenever a link of the
//! namespace appears, changes (up/down, carrier, rename, master) or
//! vanishes. Each message carries the link's whole state, decoded here into
//! the same [`Link`] a dump gives, so readers apply events to what they know
//! and re-read every link only after [`LinkEvent::Overrun`] (lost messages).

use crate::error::{Error, Result};
use crate::link::Link;
use crate::netlink::open_socket;
use crate::netns::Netns;
use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{Socket, SocketAddr};
use nix::errno::Errno;
use std::path::{Path, PathBuf};

/// The rtnetlink multicast group of link notifications (`RTNLGRP_LINK`).
const RTNLGRP_LINK: u32 = 1;

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
            match self.socket.recv(&mut rx, flags) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(Errno::ENOBUFS as i32) => {
                    events.push(LinkEvent::Overrun);
                    return Ok(events);
                }
                Err(e) if e.raw_os_error() == Some(Errno::EINTR as i32) => continue,
                Err(e) if e.raw_os_error() == Some(Errno::EAGAIN as i32) => break,
                Err(e) => return Err(Error::Socket(e)),
            }
            received += 1;
            events.extend(parse_events(&rx, &self.netns)?);
        }
        Ok(events)
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
                out.push(LinkEvent::Changed(Link::from_message(&l)));
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(l)) => {
                out.push(LinkEvent::Removed(Link::from_message(&l)));
            }
            NetlinkPayload::Overrun(_) => out.push(LinkEvent::Overrun),
            _ => {}
        }
    }
    Ok(out)
}
