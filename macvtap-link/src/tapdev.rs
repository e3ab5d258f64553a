//! `/dev/tapN`: finding a macvtap's char device and checking a node is it.
//!
//! The kernel names the node `tap<ifindex>`, but two macvtaps in different
//! namespaces can share an ifindex, and then `/dev/tapN` belongs to only one
//! of them. So a node is trusted only after its major:minor matches the
//! link's own char device, read from sysfs inside the link's namespace.

use crate::error::{Error, Result};
use crate::netns::Netns;
use nix::sys::stat::{major, minor};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The path of the node the kernel creates for a macvtap with this ifindex.
pub fn tap_node_path(dev_dir: &Path, ifindex: u32) -> PathBuf {
    dev_dir.join(format!("tap{ifindex}"))
}

/// Reads `major:minor` of macvtap `ifname`'s char device from sysfs as seen
/// inside `netns`.
pub fn tap_dev_in_netns(netns: &Netns, ifname: &str) -> Result<(u64, u64)> {
    let err = |msg: String| Error::Sysfs {
        ifname: ifname.to_string(),
        netns: netns.path().to_path_buf(),
        msg,
    };
    netns.run_with_sysfs(|| {
        let dir = Path::new("/sys/class/net").join(ifname).join("macvtap");
        let mut entries =
            std::fs::read_dir(&dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
        let entry = entries
            .next()
            .ok_or_else(|| err(format!("{} is empty", dir.display())))?
            .map_err(|e| err(format!("{}: {e}", dir.display())))?;
        let dev_file = entry.path().join("dev");
        let text = std::fs::read_to_string(&dev_file)
            .map_err(|e| err(format!("{}: {e}", dev_file.display())))?;
        parse_major_minor(text.trim()).ok_or_else(|| {
            err(format!(
                "{}: unexpected content {text:?}",
                dev_file.display()
            ))
        })
    })
}

/// Parses `"246:3"`.
pub fn parse_major_minor(s: &str) -> Option<(u64, u64)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Checks that `path` is a char device with exactly `dev` as major:minor.
pub fn check_tap_node(path: &Path, dev: (u64, u64)) -> Result<()> {
    let err = |msg: String| Error::TapNode {
        path: path.to_path_buf(),
        msg,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
    if !meta.file_type().is_char_device() {
        return Err(err("is not a character device".into()));
    }
    let found = (major(meta.rdev()), minor(meta.rdev()));
    if found != dev {
        return Err(err(format!(
            "is char device {}:{} but the link's tap device is {}:{}; it belongs to another link \
             (another namespace has a macvtap with the same ifindex)",
            found.0, found.1, dev.0, dev.1
        )));
    }
    Ok(())
}

/// Waits briefly for `path` to be the char device `dev` (devtmpfs creates the
/// node as the link registers) and returns the last error after `tries`.
pub fn wait_for_tap_node(path: &Path, dev: (u64, u64), tries: u32) -> Result<()> {
    let mut last = check_tap_node(path, dev);
    for _ in 1..tries {
        if last.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        last = check_tap_node(path, dev);
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn major_minor_parses() {
        assert_eq!(parse_major_minor("246:3"), Some((246, 3)));
        assert_eq!(parse_major_minor("246"), None);
        assert_eq!(parse_major_minor("a:3"), None);
    }

    #[test]
    fn a_regular_file_is_not_a_tap_node() {
        let f = std::env::temp_dir().join(format!("not-a-tap-{}", std::process::id()));
        std::fs::write(&f, b"x").unwrap();
        let e = check_tap_node(&f, (1, 2)).unwrap_err().to_string();
        std::fs::remove_file(&f).unwrap();
        assert!(e.contains("not a character device"), "{e}");
    }
}
