//! A small synchronous rtnetlink client bound to one network namespace, and
//! the real [`Links`]: the link, address and route operations of a
//! [`Handle`], named after iproute2's verbs (messages are built and read in
//! [`crate::link`], [`crate::addr`] and [`crate::route`]).
//!
//! Both binaries issue a handful of requests per operation and wait for each
//! answer, so a blocking socket is all that is needed: no runtime, no
//! background task, and the socket's namespace is fixed when it is opened.

use crate::addr::{self, Address};
use crate::error::{Error, Result};
use crate::kernel::Links;
use crate::link::{Link, LinkChange, MacvtapMode};
use crate::netns::Netns;
use crate::op::Op;
use crate::route::{self, DefaultRoute};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_ECHO, NLM_F_EXCL, NLM_F_REQUEST, NetlinkHeader,
    NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::AddressMessage;
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoMacVtap, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::RouteMessage;
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use nix::errno::Errno;
use std::cell::Cell;
use std::fmt;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};
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
    pub(crate) fn netns(&self) -> &Path {
        &self.netns
    }

    /// Sends a request that changes something (or gets one object) and waits
    /// for the kernel's acknowledgement. Returns any messages sent before it.
    /// `op` and `what` name the operation in errors.
    pub(crate) fn request(
        &self,
        msg: RouteNetlinkMessage,
        flags: u16,
        op: Op,
        what: impl Fn() -> String,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        self.exchange(msg, NLM_F_REQUEST | NLM_F_ACK | flags, op, what)
    }

    /// Sends a dump request and collects every message until the end marker.
    pub(crate) fn dump(
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

impl Handle {
    /// Every address of every link in the namespace (`ip address show`).
    pub fn list_addresses(&self) -> Result<Vec<Address>> {
        let replies = self.dump(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            Op::ListAddrs,
            || format!("listing addresses in {}", self.netns().display()),
        )?;
        Ok(addr::addresses(&replies))
    }

    /// Every default route of the namespace, IPv4 and IPv6, in every
    /// routing table (`ip route show table all default`, unicast only).
    pub fn list_default_routes(&self) -> Result<Vec<DefaultRoute>> {
        let replies = self.dump(
            RouteNetlinkMessage::GetRoute(RouteMessage::default()),
            Op::ListRoutes,
            || format!("listing routes in {}", self.netns().display()),
        )?;
        Ok(route::default_routes(&replies))
    }

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
        // With NLM_F_ECHO (kernel 6.3 and later) the kernel answers the
        // creation with the new link's own RTM_NEWLINK before the ACK, so the
        // link is known without a second round trip; older kernels ignore
        // the flag and the link is read back.
        let echoed = self.request(
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ECHO,
            Op::AddMacvtap,
            what,
        )?;
        if let Some(link) = created_link(&echoed, name) {
            return Ok(link);
        }
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

/// The link `name` among the messages a creation echoed (the last one, the
/// newest state), if the kernel echoed it.
fn created_link(replies: &[RouteNetlinkMessage], name: &str) -> Option<Link> {
    replies
        .iter()
        .filter_map(|r| match r {
            RouteNetlinkMessage::NewLink(l) => Some(Link::from_message(l)),
            _ => None,
        })
        .rfind(|l| l.name == name && l.index != 0)
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

    #[test]
    fn a_creation_echo_gives_the_named_link() {
        let msg = |index: u32, name: &str| {
            let mut m = LinkMessage::default();
            m.header.index = index;
            m.attributes.push(LinkAttribute::IfName(name.into()));
            RouteNetlinkMessage::NewLink(m)
        };
        assert_eq!(created_link(&[], "mvt1"), None);
        assert_eq!(created_link(&[msg(4, "other")], "mvt1"), None);
        let echoed = [msg(4, "other"), msg(9, "mvt1"), msg(5, "other")];
        assert_eq!(created_link(&echoed, "mvt1").map(|l| l.index), Some(9));
    }

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
