//! A macvtap's tap node: `/dev/tap<ifindex>` checked to be the link's char
//! device (read from sysfs when it shows the link, else from inside its
//! namespace), and when it never appears, why ([`super::mountinfo`]). Where
//! tap nodes never show ([`TapNodes::Unseen`]: a privileged container
//! without the host's `/dev`), the link's char device in sysfs is the
//! check, and the answer is the host's `/dev/tap<ifindex>`, as the Go
//! plugin answered.

use super::mountinfo::missing_tap_node_cause;
use crate::core::host::{Host, HostPaths, TapNodes};
use crate::error::Error;
use macvtap_link::tapdev::{parse_major_minor, tap_node_path};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long devtmpfs gets to create `/dev/tapN` after the macvtap appears.
const TAP_NODE_WAIT: Duration = Duration::from_secs(2);

/// Where the host's kernel makes tap nodes, as the kubelet and the
/// container runtime name them.
const HOST_DEV: &str = "/dev";

/// The tap node of the link with `ifindex` that Allocate answers: in the
/// tap node directory where tap nodes show there (the host's `/dev`,
/// mounted), else the host's own `/dev/tap<ifindex>`.
pub(super) fn answer_path(paths: &HostPaths, ifindex: u32) -> PathBuf {
    match paths.tap_nodes {
        TapNodes::Shown => tap_node_path(paths.dev(), ifindex),
        TapNodes::Unseen { .. } => tap_node_path(Path::new(HOST_DEV), ifindex),
    }
}

/// A failed tap node check, before it is tied to a device.
pub(super) enum NodeError {
    Link(macvtap_link::Error),
    /// The node never appeared, and `cause` says why.
    Missing {
        node: PathBuf,
        cause: String,
    },
}

impl NodeError {
    pub(super) fn for_device(self, id: &str, name: &str) -> Error {
        match self {
            NodeError::Link(source) => Error::device(id, name)(source),
            NodeError::Missing { node, cause } => Error::TapNodeMissing {
                device_id: id.to_string(),
                link: name.to_string(),
                node,
                cause,
            },
        }
    }
}

/// Waits for the link's tap node to be its char device. When it never
/// appears and the host's tap node directory is not devtmpfs, the error says so.
/// Where tap nodes never show, the link's char device (its
/// `class/net/<name>/macvtap/tap<ifindex>/dev` in sysfs, or read from
/// inside its namespace) is all that is checked.
pub(super) fn check_node(
    host: &Host,
    name: &str,
    ifindex: u32,
    node: &Path,
) -> std::result::Result<(), NodeError> {
    let dev = match tap_dev_from_sysfs(&host.paths().sysfs, name, ifindex) {
        Some(dev) => dev,
        None => host
            .kernel()
            .tap_device(host.netns(), name)
            .map_err(NodeError::Link)?,
    };
    if !host.paths().tap_nodes_shown() {
        return Ok(());
    }
    match host.kernel().open_tap_node(node, dev, TAP_NODE_WAIT) {
        Ok(_) => Ok(()),
        Err(e) if node.symlink_metadata().is_err() => {
            let mountinfo = std::fs::read_to_string(host.paths().mountinfo()).unwrap_or_default();
            match missing_tap_node_cause(host.paths().dev(), &mountinfo) {
                Some(cause) => Err(NodeError::Missing {
                    node: node.to_path_buf(),
                    cause,
                }),
                None => Err(NodeError::Link(e)),
            }
        }
        Err(e) => Err(NodeError::Link(e)),
    }
}

/// `major:minor` of macvtap `name`'s char device from `sysfs`, when it shows
/// this link (same name and ifindex there): the common case, which needs no
/// helper thread. One read does both: the kernel names a macvtap's char
/// device `tap<ifindex>` under its link, so
/// `class/net/<name>/macvtap/tap<ifindex>/dev` exists only when sysfs shows
/// a link of this name with this ifindex. (A fresh sysfs mount cannot be
/// used when `sysfs` already shows the namespace: the kernel refuses to
/// mount the same sysfs on `/sys` twice, with `EBUSY`.)
fn tap_dev_from_sysfs(sysfs: &Path, name: &str, ifindex: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(tap_dev_file(sysfs, name, ifindex)).ok()?;
    parse_major_minor(text.trim())
}

/// Where sysfs shows the char device of macvtap `name` with `ifindex`.
fn tap_dev_file(sysfs: &Path, name: &str, ifindex: u32) -> PathBuf {
    sysfs
        .join("class/net")
        .join(name)
        .join("macvtap")
        .join(format!("tap{ifindex}"))
        .join("dev")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_gives_the_tap_device_only_for_the_links_ifindex() {
        let sysfs = tempfile::tempdir().unwrap();
        let file = tap_dev_file(sysfs.path(), "mvt0", 7);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "240:3\n").unwrap();
        assert_eq!(tap_dev_from_sysfs(sysfs.path(), "mvt0", 7), Some((240, 3)));
        // Another link of that name (another namespace's) has another ifindex.
        assert_eq!(tap_dev_from_sysfs(sysfs.path(), "mvt0", 8), None);
        assert_eq!(tap_dev_from_sysfs(sysfs.path(), "mvt1", 7), None);
    }
}
