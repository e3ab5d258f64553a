//! The kinds of kernel operation, which errors carry so callers decide by
//! kind (never by message text), and the usual cause of an errno for each.

use nix::errno::Errno;
use std::fmt;

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
    /// Listing routes.
    ListRoutes,
    /// Writing a sysctl inside a namespace.
    Sysctl,
    /// Reading a macvtap's char device number from sysfs.
    TapDevice,
    /// Opening `/dev/tapN` and checking it is the macvtap's char device.
    OpenTapNode,
    /// Looking at which char device `/dev/tapN` is, if any.
    StatTapNode,
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
            Op::ListRoutes => "listing routes",
            Op::Sysctl => "writing a sysctl",
            Op::TapDevice => "reading a tap device from sysfs",
            Op::OpenTapNode => "opening a tap node",
            Op::StatTapNode => "looking at a tap node",
            Op::ChownTapNode => "giving a tap node to a user",
        })
    }
}

impl Op {
    /// Whether the operation changes links (and so, in the kernel, takes
    /// the RTNL lock that a move holds): a create, delete, set or move, or
    /// an address or route added.
    pub fn changes_links(self) -> bool {
        matches!(
            self,
            Op::AddMacvtap | Op::DelLink | Op::MoveLink | Op::SetLink | Op::AddAddr | Op::AddRoute
        )
    }
}

/// The errno's C name, e.g. `EADDRINUSE`, as people search for it.
pub(crate) fn errno_name(errno: Errno) -> String {
    // nix's Debug of an Errno is exactly its C name.
    format!("{errno:?}")
}

/// What `errno` usually means for `op`, as a phrase ending in the errno's C
/// name: `another macvtap on the same NIC already uses this MAC (EADDRINUSE)`.
pub(crate) fn explain(op: Op, errno: Errno) -> String {
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
