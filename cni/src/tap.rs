//! Giving the pod's VM user the macvtap's `/dev/tapN`.

use crate::error::Result;
use macvtap_link::tapdev::tap_node_path;
use macvtap_link::{Kernel, Netns};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long devtmpfs gets to create `/dev/tapN` (the device plugin made the
/// link earlier, so the node is normally there already).
const TAP_NODE_WAIT: Duration = Duration::from_millis(500);

/// Where devtmpfs puts the tap nodes.
pub(crate) const DEV_DIR: &str = "/dev";

/// Checks that `/dev/tap<ifindex>` is the char device of `ifname` (as seen
/// from sysfs inside `netns`) and gives it to `owner:group`; returns its path.
/// The check and the chown act on one descriptor opened without following
/// symlinks, so `owner`/`group` (from the NetConf) reach only the pod's own
/// tap node.
pub(crate) fn hand_over(
    kernel: &dyn Kernel,
    netns: &Netns,
    ifname: &str,
    ifindex: u32,
    owner: u32,
    group: u32,
) -> Result<PathBuf> {
    let dev = kernel.tap_device(netns, ifname)?;
    let node = tap_node_path(Path::new(DEV_DIR), ifindex);
    let opened = kernel.open_tap_node(&node, dev, TAP_NODE_WAIT)?;
    kernel.chown_tap_node(&opened, owner, group)?;
    Ok(node)
}
