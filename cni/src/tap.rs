//! Giving the pod's VM user the macvtap's `/dev/tapN`.

use crate::error::{Error, Result};
use macvtap_link::Netns;
use macvtap_link::tapdev::{tap_dev_in_netns, tap_node_path, wait_for_tap_node};
use std::path::{Path, PathBuf};

/// Where devtmpfs puts the tap nodes.
pub const DEV_DIR: &str = "/dev";

/// Checks that `/dev/tap<ifindex>` is the char device of `ifname` (as seen
/// from sysfs inside `netns`) and gives it to `owner:group`; returns its path.
pub fn hand_over(
    netns: &Netns,
    ifname: &str,
    ifindex: u32,
    owner: u32,
    group: u32,
) -> Result<PathBuf> {
    let dev = tap_dev_in_netns(netns, ifname)?;
    let node = tap_node_path(Path::new(DEV_DIR), ifindex);
    wait_for_tap_node(&node, dev, 50)?;
    std::os::unix::fs::chown(&node, Some(owner), Some(group)).map_err(|source| Error::Io {
        what: format!("giving {} to {owner}:{group}", node.display()),
        source,
    })?;
    Ok(node)
}
