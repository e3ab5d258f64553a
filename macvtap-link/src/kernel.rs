//! The seam between the binaries and the kernel: the few operations both use,
//! behind two small traits, so that every failure path can be driven by a
//! fake (the `test-support` crate's) in unit tests without root.
//!
//! [`Kernel`] is the node: namespaces, sysctls and tap nodes; the real one
//! is [`crate::Linux`]. [`Links`] is one namespace's rtnetlink socket: the
//! real one is [`crate::Handle`]. (youki's netlink `LinkClient` over
//! `ClientWrapper::Fake` is the model.)

use crate::error::Result;
use crate::link::{Link, LinkChange, MacvtapMode};
use crate::netns::Netns;
use crate::tapdev::TapNode;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

/// The link operations of one network namespace, named after iproute2's
/// verbs; [`crate::Handle`] is the real one.
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
/// namespace, sysctls and tap nodes. [`crate::Linux`] is the real one; it is
/// shared between threads, and a namespace's [`Links`] may move to another.
pub trait Kernel: Send + Sync {
    /// The calling thread's network namespace.
    fn current_netns(&self) -> Result<Netns>;
    /// Opens the network namespace at `path`.
    fn open_netns(&self, path: &Path) -> Result<Netns>;
    /// The links of `netns`, or of the calling thread's namespace for `None`.
    fn links<'a>(&'a self, netns: Option<&Netns>) -> Result<Box<dyn Links + Send + 'a>>;
    /// Writes `value` to `/proc/sys/<key>` inside `netns`; a missing key is
    /// an error whose errno is `ENOENT`.
    fn write_sysctl(&self, netns: &Netns, key: &str, value: &str) -> Result<()>;
    /// The major:minor of macvtap `ifname`'s char device, seen from `netns`.
    fn tap_device(&self, netns: &Netns, ifname: &str) -> Result<(u64, u64)>;
    /// Opens `path` without following symlinks and checks it is char device
    /// `dev`, retrying for up to `wait` while devtmpfs creates it.
    fn open_tap_node(&self, path: &Path, dev: (u64, u64), wait: Duration) -> Result<TapNode>;
    /// The char device (major, minor) tap node `path` is now, without
    /// following a symlink; `None` when there is no node. A macvtap's node
    /// is gone for a moment while the macvtap moves to another namespace,
    /// and belongs to the first of two macvtaps that share an ifindex.
    fn tap_node(&self, path: &Path) -> Result<Option<(u64, u64)>>;
    /// Gives the opened node to `owner:group` through its descriptor.
    fn chown_tap_node(&self, node: &TapNode, owner: u32, group: u32) -> Result<()>;
}
