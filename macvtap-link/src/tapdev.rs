//! `/dev/tapN`: finding a macvtap's char device and checking a node is it.
//!
//! The kernel names the node `tap<ifindex>`, but two macvtaps in different
//! namespaces can share an ifindex, and then `/dev/tapN` belongs to only one
//! of them. So a node is trusted only after its major:minor matches the
//! link's own char device, read from sysfs inside the link's namespace.

use crate::error::{Error, Result};
use crate::netns::Netns;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, major, minor};
use std::fs::File;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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

/// The char device (major, minor) at `path` now, without following a
/// symlink; `None` when nothing is there, an error when it is not a char
/// device.
pub(crate) fn tap_node_dev(path: &Path) -> Result<Option<(u64, u64)>> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::TapNode {
                path: path.to_path_buf(),
                msg: e.to_string(),
            });
        }
    };
    if !meta.file_type().is_char_device() {
        return Err(Error::TapNode {
            path: path.to_path_buf(),
            msg: "is not a character device".into(),
        });
    }
    Ok(Some((major(meta.rdev()), minor(meta.rdev()))))
}

fn check_node_meta(path: &Path, meta: &std::fs::Metadata, dev: (u64, u64)) -> Result<()> {
    let err = |msg: String| Error::TapNode {
        path: path.to_path_buf(),
        msg,
    };
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

/// Opens `path` without following a symlink (`O_PATH | O_NOFOLLOW`) and
/// checks that the inode opened is the char device `dev`, retrying for up to
/// `wait` while devtmpfs creates the node (it does so as the link registers).
/// Acting through the returned descriptor (see `chown_tap_node`) acts on
/// exactly the inode that was checked.
pub fn open_tap_node(path: &Path, dev: (u64, u64), wait: Duration) -> Result<File> {
    let once = || -> Result<File> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::TapNode {
            path: path.to_path_buf(),
            msg: e.desc().to_string(),
        })?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| Error::TapNode {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        check_node_meta(path, &meta, dev)?;
        Ok(file)
    };
    let deadline = Instant::now() + wait;
    loop {
        let last = once();
        if last.is_ok() || Instant::now() >= deadline {
            return last;
        }
        std::thread::sleep(TAP_NODE_POLL);
    }
}

/// How often [`open_tap_node`] looks again for a node devtmpfs has not made yet.
const TAP_NODE_POLL: Duration = Duration::from_millis(10);

/// A `/dev/tapN` node checked to be a macvtap's char device, held open
/// (`O_PATH`) so that what is done next acts on the inode that was checked.
#[derive(Debug)]
pub struct TapNode {
    path: PathBuf,
    file: File,
}

impl TapNode {
    /// A node opened by [`open_tap_node`] (or, by a [`crate::Kernel`] that
    /// is not the real one, any descriptor standing for it).
    pub fn opened(path: &Path, file: File) -> Self {
        Self {
            path: path.to_path_buf(),
            file,
        }
    }

    /// The node's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Gives the node to `owner:group` through its descriptor.
    pub(crate) fn chown(&self, owner: u32, group: u32) -> Result<()> {
        chown_tap_node(&self.file, &self.path, owner, group)
    }
}

/// Gives the node opened by [`open_tap_node`] to `owner:group`, through its
/// descriptor (`fchownat` with `AT_EMPTY_PATH`), never by path again.
pub(crate) fn chown_tap_node(node: &File, path: &Path, owner: u32, group: u32) -> Result<()> {
    nix::unistd::fchownat(
        node,
        "",
        Some(nix::unistd::Uid::from_raw(owner)),
        Some(nix::unistd::Gid::from_raw(group)),
        AtFlags::AT_EMPTY_PATH,
    )
    .map_err(|e| Error::TapNode {
        path: path.to_path_buf(),
        msg: format!("giving it to {owner}:{group}: {}", e.desc()),
    })
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
    fn a_node_is_its_char_device_or_nothing() {
        let null = std::fs::metadata("/dev/null").unwrap().rdev();
        assert_eq!(
            tap_node_dev(Path::new("/dev/null")).unwrap(),
            Some((major(null), minor(null)))
        );
        let dir = std::env::temp_dir().join(format!("tap-stat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(tap_node_dev(&dir.join("tap7")).unwrap(), None);
        let link = dir.join("tap8");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        let stat = tap_node_dev(&link);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(stat.is_err(), "a symlink is no node");
    }

    #[test]
    fn a_regular_file_is_not_a_tap_node() {
        let f = std::env::temp_dir().join(format!("not-a-tap-{}", std::process::id()));
        std::fs::write(&f, b"x").unwrap();
        let e = open_tap_node(&f, (1, 2), Duration::ZERO)
            .unwrap_err()
            .to_string();
        std::fs::remove_file(&f).unwrap();
        assert!(e.contains("not a character device"), "{e}");
    }

    #[test]
    fn a_symlink_to_a_char_device_is_not_followed() {
        let dir = std::env::temp_dir().join(format!("tap-link-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("tap1");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        let null = std::fs::metadata("/dev/null").unwrap().rdev();
        let dev = (major(null), minor(null));
        let followed = std::fs::metadata(&link).unwrap();
        assert!(
            followed.file_type().is_char_device() && followed.rdev() == null,
            "by path it is followed"
        );
        let e = open_tap_node(&link, dev, Duration::ZERO)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a character device"), "{e}");
        let opened = open_tap_node(Path::new("/dev/null"), dev, Duration::ZERO).unwrap();
        assert!(opened.metadata().unwrap().file_type().is_char_device());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
