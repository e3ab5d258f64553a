//! The seam between the binaries and the kernel: the few operations both use,
//! behind two small traits, so that every failure path can be driven by a
//! fake ([`crate::fake`]) in unit tests without root.
//!
//! [`Kernel`] is the node: namespaces, sysctls and tap nodes. [`Links`] is one
//! namespace's rtnetlink socket: the real one is [`Handle`]. The real
//! implementation ([`Linux`]) only forwards to the functions the root tests
//! prove against the kernel. (youki's netlink `LinkClient` over
//! `ClientWrapper::Fake` is the model.)

use crate::error::{Error, Result};
use crate::link::{Link, LinkChange, MacvtapMode};
use crate::netlink::Handle;
use crate::netns::Netns;
use crate::tapdev::{self, TapNode};
use nix::errno::Errno;
use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

/// One kind of kernel operation: errors carry it, so callers decide by kind
/// (never by message text), and the fake fails calls by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Opening a network namespace file.
    OpenNetns,
    /// Opening a netlink socket inside a namespace.
    OpenSocket,
    /// Looking one link up, by name or by index.
    GetLink,
    /// Listing every link of a namespace.
    ListLinks,
    /// Creating a macvtap.
    AddMacvtap,
    /// Deleting a link.
    DelLink,
    /// Moving a link into another namespace (and renaming it).
    MoveLink,
    /// Changing MTU, MAC, state, promiscuity, name or alias of a link.
    SetLink,
    /// Adding an address.
    AddAddr,
    /// Listing addresses.
    ListAddrs,
    /// Adding a route.
    AddRoute,
    /// Writing a sysctl inside a namespace.
    Sysctl,
    /// Reading a macvtap's char device number from sysfs.
    TapDevice,
    /// Opening `/dev/tapN` and checking it is the macvtap's char device.
    OpenTapNode,
    /// Giving `/dev/tapN` to a user.
    ChownTapNode,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::OpenNetns => "opening a network namespace",
            Op::OpenSocket => "opening a netlink socket",
            Op::GetLink => "looking up a link",
            Op::ListLinks => "listing links",
            Op::AddMacvtap => "creating a macvtap",
            Op::DelLink => "deleting a link",
            Op::MoveLink => "moving a link to another namespace",
            Op::SetLink => "changing a link",
            Op::AddAddr => "adding an address",
            Op::ListAddrs => "listing addresses",
            Op::AddRoute => "adding a route",
            Op::Sysctl => "writing a sysctl",
            Op::TapDevice => "reading a tap device from sysfs",
            Op::OpenTapNode => "opening a tap node",
            Op::ChownTapNode => "giving a tap node to a user",
        })
    }
}

/// The errno's C name, e.g. `EADDRINUSE`, as people search for it.
pub fn errno_name(errno: Errno) -> String {
    // nix's Debug of an Errno is exactly its C name.
    format!("{errno:?}")
}

/// What `errno` usually means for `op`, as a phrase ending in the errno's C
/// name: `another macvtap on the same NIC already uses this MAC (EADDRINUSE)`.
pub fn explain(op: Op, errno: Errno) -> String {
    let cause = match (op, errno) {
        (Op::SetLink, Errno::EADDRINUSE) => {
            "another macvtap on the same lower NIC already uses this MAC"
        }
        (Op::SetLink, Errno::EINVAL) => {
            "the kernel refused a value (an MTU outside the link's range, or a multicast MAC)"
        }
        (Op::SetLink | Op::MoveLink | Op::AddMacvtap, Errno::EEXIST) => {
            "a link of that name already exists there"
        }
        (Op::MoveLink, Errno::EBUSY) => {
            "the link's ifindex is already taken in the target namespace"
        }
        (Op::AddMacvtap, Errno::EBUSY) => {
            "the requested ifindex is taken, or the lower NIC is a port of a bridge, bond or OVS"
        }
        (Op::MoveLink, Errno::EINVAL) => {
            "the link cannot change namespace (a physical NIC of some drivers) or the namespace is gone"
        }
        (Op::AddAddr, Errno::EEXIST) => "the address is already on the link",
        (Op::AddAddr, Errno::EACCES) => "IPv6 is disabled on the link",
        (Op::AddRoute, Errno::EEXIST) => "the route already exists",
        (Op::AddRoute, Errno::ENETUNREACH) => {
            "the gateway is not reachable through the link's addresses"
        }
        (_, Errno::ENODEV) => "the link does not exist (any more)",
        (_, Errno::EPERM) => "not permitted: the process lacks CAP_NET_ADMIN in that namespace",
        (_, Errno::ENOBUFS | Errno::ENOMEM) => "the kernel is short of memory; a retry may work",
        _ => "",
    };
    if cause.is_empty() {
        format!("{} ({})", errno.desc(), errno_name(errno))
    } else {
        format!("{cause} ({})", errno_name(errno))
    }
}

/// The link operations of one network namespace, named after iproute2's
/// verbs; [`Handle`] is the real one (in [`crate::link`]).
pub trait Links {
    /// The namespace path these links live in, for messages.
    fn netns(&self) -> &Path;
    /// Looks a link up by name; `Ok(None)` when there is no such link.
    fn get_link(&self, name: &str) -> Result<Option<Link>>;
    /// Looks a link up by index; `Ok(None)` when there is no such link.
    fn get_link_by_index(&self, index: u32) -> Result<Option<Link>>;
    /// Lists every link of the namespace.
    fn list_links(&self) -> Result<Vec<Link>>;
    /// Creates macvtap `name` on `lower_index` with `mode` and transmit queue
    /// length `txqueuelen` (the kernel's default for `None`), and returns it
    /// as the kernel sees it. With `index` it asks for that ifindex (`ip link
    /// add ... index N`), so a lost link comes back under the `/dev/tap<N>`
    /// the kubelet handed out; `EEXIST`/`EBUSY` when that index is taken.
    fn add_macvtap_at(
        &self,
        name: &str,
        lower_index: u32,
        mode: MacvtapMode,
        txqueuelen: Option<u32>,
        index: Option<u32>,
    ) -> Result<Link>;
    /// Deletes link `index` (`name` is for messages).
    fn del_link(&self, index: u32, name: &str) -> Result<()>;
    /// Moves link `index` into `target`, renamed to `new_name` in the same
    /// message, asking for ifindex `new_index` there (`IFLA_NEW_IFINDEX`; a
    /// rollback asks for the index the link had before it moved). Kernels
    /// before 5.13 ignore the request and keep the link's index when it is
    /// free in `target`, else give it a new one: callers re-read the link.
    fn set_link_ns_at(
        &self,
        index: u32,
        name: &str,
        target: &Netns,
        new_name: &str,
        new_index: u32,
    ) -> Result<()>;
    /// Moves link `index` into `target` as `new_name`, keeping its ifindex:
    /// if that index is taken in `target` the kernel refuses and nothing moves.
    fn set_link_ns(&self, index: u32, name: &str, target: &Netns, new_name: &str) -> Result<()> {
        self.set_link_ns_at(index, name, target, new_name, index)
    }
    /// Applies `change` to link `index` in one request.
    fn set_link(&self, index: u32, name: &str, change: &LinkChange) -> Result<()>;
    /// Adds `addr/prefix_len` to link `index` (IPv6 without duplicate address
    /// detection, so it is usable at once).
    fn add_addr(&self, index: u32, addr: IpAddr, prefix_len: u8) -> Result<()>;
    /// Lists the addresses (with prefix length) on link `index`.
    fn list_addrs(&self, index: u32) -> Result<Vec<(IpAddr, u8)>>;
    /// Adds a route to `dst/prefix_len` through link `index`, via `gw` when
    /// given (otherwise a link-scope route).
    fn add_route(&self, index: u32, dst: IpAddr, prefix_len: u8, gw: Option<IpAddr>) -> Result<()>;
}

/// The node's kernel as the binaries use it: namespaces, one [`Links`] per
/// namespace, sysctls and tap nodes. [`Linux`] is the real one.
pub trait Kernel {
    /// The calling thread's network namespace.
    fn current_netns(&self) -> Result<Netns>;
    /// Opens the network namespace at `path`.
    fn open_netns(&self, path: &Path) -> Result<Netns>;
    /// The links of `netns`, or of the calling thread's namespace for `None`.
    fn links<'a>(&'a self, netns: Option<&Netns>) -> Result<Box<dyn Links + 'a>>;
    /// Writes `value` to `/proc/sys/<key>` inside `netns`; a missing key is
    /// an error whose errno is `ENOENT`.
    fn write_sysctl(&self, netns: &Netns, key: &str, value: &str) -> Result<()>;
    /// The major:minor of macvtap `ifname`'s char device, seen from `netns`.
    fn tap_device(&self, netns: &Netns, ifname: &str) -> Result<(u64, u64)>;
    /// Opens `path` without following symlinks and checks it is char device
    /// `dev`, retrying for up to `wait` while devtmpfs creates it.
    fn open_tap_node(&self, path: &Path, dev: (u64, u64), wait: Duration) -> Result<TapNode>;
    /// Gives the opened node to `owner:group` through its descriptor.
    fn chown_tap_node(&self, node: &TapNode, owner: u32, group: u32) -> Result<()>;
}

/// The real kernel: every method forwards to [`Handle`], [`Netns`] and
/// [`tapdev`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Linux;

impl Kernel for Linux {
    fn current_netns(&self) -> Result<Netns> {
        Netns::current()
    }

    fn open_netns(&self, path: &Path) -> Result<Netns> {
        Netns::open(path)
    }

    fn links<'a>(&'a self, netns: Option<&Netns>) -> Result<Box<dyn Links + 'a>> {
        Ok(Box::new(match netns {
            None => Handle::current()?,
            Some(ns) => Handle::in_netns(ns)?,
        }))
    }

    fn write_sysctl(&self, netns: &Netns, key: &str, value: &str) -> Result<()> {
        let path = Path::new("/proc/sys").join(key);
        let written = netns.run(|| Ok(std::fs::write(&path, value)))?;
        written.map_err(|source| Error::Sysctl {
            key: key.to_string(),
            netns: netns.path().to_path_buf(),
            source,
        })
    }

    fn tap_device(&self, netns: &Netns, ifname: &str) -> Result<(u64, u64)> {
        tapdev::tap_dev_in_netns(netns, ifname)
    }

    fn open_tap_node(&self, path: &Path, dev: (u64, u64), wait: Duration) -> Result<TapNode> {
        tapdev::open_tap_node(path, dev, wait).map(|file| TapNode::opened(path, file))
    }

    fn chown_tap_node(&self, node: &TapNode, owner: u32, group: u32) -> Result<()> {
        node.chown(owner, group)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_mac_is_explained() {
        assert_eq!(
            explain(Op::SetLink, Errno::EADDRINUSE),
            "another macvtap on the same lower NIC already uses this MAC (EADDRINUSE)"
        );
        assert_eq!(
            explain(Op::GetLink, Errno::EIO),
            "I/O error (EIO)",
            "an errno without a usual cause keeps the kernel's words"
        );
    }
}
