//! A small synchronous rtnetlink client bound to one network namespace.
//!
//! Both binaries issue a handful of requests per operation and wait for each
//! answer, so a blocking socket is all that is needed: no runtime, no
//! background task, and the socket's namespace is fixed when it is opened.

use crate::error::{Error, Result};
use crate::kernel::Op;
use crate::netns::Netns;
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use nix::errno::Errno;
use std::cell::Cell;
use std::path::{Path, PathBuf};

/// Opens a route netlink socket in the calling thread's namespace (`None`) or
/// inside `netns` (from a helper thread), prepared by `setup`; returns it with
/// the namespace's path for messages. Both [`Handle`] and
/// [`crate::monitor::LinkMonitor`] open their sockets here.
pub(crate) fn open_socket(
    netns: Option<&Netns>,
    setup: fn(&mut Socket) -> std::io::Result<()>,
) -> Result<(Socket, PathBuf)> {
    let open = || -> Result<Socket> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(Error::Socket)?;
        setup(&mut socket).map_err(Error::Socket)?;
        Ok(socket)
    };
    match netns {
        None => Ok((open()?, PathBuf::from(crate::netns::CURRENT_NETNS))),
        Some(ns) => Ok((ns.run(open)?, ns.path().to_path_buf())),
    }
}

/// A route netlink socket opened inside one network namespace.
#[derive(Debug)]
pub struct Handle {
    socket: Socket,
    seq: Cell<u32>,
    netns: PathBuf,
}

impl Handle {
    /// Opens a socket in the calling thread's network namespace.
    pub fn current() -> Result<Self> {
        Self::from_socket(open_socket(None, Self::setup)?)
    }

    /// Opens a socket inside `netns` (from a helper thread; the caller's
    /// namespace is not changed).
    pub fn in_netns(netns: &Netns) -> Result<Self> {
        Self::from_socket(open_socket(Some(netns), Self::setup)?)
    }

    fn setup(socket: &mut Socket) -> std::io::Result<()> {
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        // Ask for strict checking so dump filters are honoured where supported.
        let _ = socket.set_netlink_get_strict_chk(true);
        Ok(())
    }

    fn from_socket((socket, netns): (Socket, PathBuf)) -> Result<Self> {
        Ok(Self {
            socket,
            seq: Cell::new(1),
            netns,
        })
    }

    /// The namespace path this handle works in, for messages.
    pub fn netns(&self) -> &Path {
        &self.netns
    }

    /// Sends a request that changes something (or gets one object) and waits
    /// for the kernel's acknowledgement. Returns any messages sent before it.
    /// `op` and `what` name the operation in errors.
    pub fn request(
        &self,
        msg: RouteNetlinkMessage,
        flags: u16,
        op: Op,
        what: impl Fn() -> String,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        self.exchange(msg, NLM_F_REQUEST | NLM_F_ACK | flags, op, what)
    }

    /// Sends a dump request and collects every message until the end marker.
    pub fn dump(
        &self,
        msg: RouteNetlinkMessage,
        op: Op,
        what: impl Fn() -> String,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        self.exchange(msg, NLM_F_REQUEST | NLM_F_DUMP, op, what)
    }

    /// One request and its whole answer, checked strictly as netavark's
    /// `src/network/netlink.rs` does: every reply must carry this request's
    /// sequence number (the socket has no multicast groups, so anything else
    /// is a stale answer to an abandoned request), an overrun or a truncated
    /// datagram is an error, and an error message keeps its errno.
    fn exchange(
        &self,
        msg: RouteNetlinkMessage,
        flags: u16,
        op: Op,
        what: impl Fn() -> String,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        let seq = self.seq.get().wrapping_add(1);
        self.seq.set(seq);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        packet.finalize();
        let mut buf = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket.send(&buf, 0).map_err(Error::Socket)?;

        let protocol = |problem: String| Error::Protocol {
            what: what(),
            problem,
        };
        let mut out = Vec::new();
        let mut rx = Vec::with_capacity(RECV_BUFFER);
        loop {
            rx.clear();
            // With MSG_TRUNC the kernel reports a datagram's full length even
            // when it did not fit.
            let len = self
                .socket
                .recv(&mut rx, nix::libc::MSG_TRUNC)
                .map_err(Error::Socket)?;
            if len > rx.len() {
                return Err(protocol(format!(
                    "was truncated ({len} bytes did not fit a {}-byte buffer)",
                    rx.len()
                )));
            }
            for reply in parse(&rx).map_err(&protocol)? {
                if reply.header.sequence_number != seq {
                    return Err(protocol(format!(
                        "answered request {} while request {seq} was waiting",
                        reply.header.sequence_number
                    )));
                }
                match reply.payload {
                    NetlinkPayload::InnerMessage(inner) => out.push(inner),
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(err) => {
                        return match err.code {
                            None => Ok(out),
                            Some(code) => Err(Error::Netlink {
                                op,
                                what: what(),
                                source: Errno::from_raw(-code.get()),
                            }),
                        };
                    }
                    NetlinkPayload::Overrun(_) => {
                        return Err(protocol("reported an overrun (messages were lost)".into()));
                    }
                    NetlinkPayload::Noop => {}
                    _ => {
                        return Err(protocol(
                            "has a message type this client does not know".into(),
                        ));
                    }
                }
            }
        }
    }
}

/// Room for one datagram: the kernel sends at most 32 KiB per dump datagram
/// (`NLMSG_GOODSIZE` on large pages), so 64 KiB never truncates in practice.
const RECV_BUFFER: usize = 64 * 1024;

/// Splits one datagram into its netlink messages.
fn parse(buf: &[u8]) -> std::result::Result<Vec<NetlinkMessage<RouteNetlinkMessage>>, String> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < buf.len() {
        let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[offset..])
            .map_err(|e| format!("cannot be decoded: {e}"))?;
        let len = reply.header.length as usize;
        if len == 0 {
            return Err("has a message of length 0".into());
        }
        offset += (len + 3) & !3;
        out.push(reply);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Links;
    use netlink_packet_route::link::{LinkAttribute, LinkMessage};

    #[test]
    fn a_zero_length_message_is_refused() {
        let e = parse(&[0u8; 16]).unwrap_err();
        assert!(e.contains("length 0") || e.contains("decoded"), "{e}");
    }

    /// A reply to another request (here one sent behind the handle's back
    /// and never read) is an error, not silently skipped. Needs no root: a
    /// route netlink socket may look links up unprivileged.
    #[test]
    fn a_reply_to_another_request_is_an_error() {
        let handle = Handle::current().unwrap();
        assert!(handle.get_link("lo").unwrap().is_some());
        let mut stray = LinkMessage::default();
        stray.attributes.push(LinkAttribute::IfName("lo".into()));
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK;
        header.sequence_number = 999;
        let mut packet = NetlinkMessage::new(
            header,
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::GetLink(stray)),
        );
        packet.finalize();
        let mut buf = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buf);
        handle.socket.send(&buf, 0).unwrap();
        let e = handle.get_link("lo").unwrap_err();
        assert!(
            e.to_string()
                .contains("the kernel's netlink reply answered request 999"),
            "{e}"
        );
    }
}
