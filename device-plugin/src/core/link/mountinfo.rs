//! The mount table (`/proc/self/mountinfo`), read for one question: is the
//! tap node directory devtmpfs, where the kernel makes `/dev/tapN`?
//! (`doctor` asks it too.)

use std::path::Path;

/// Why tap nodes cannot appear in `dev_dir`, judged from `mountinfo` (the
/// text of `/proc/self/mountinfo`): the kernel creates `/dev/tapN` only on
/// devtmpfs, and a kind node's `/dev` is a plain tmpfs unless the host's
/// `/dev` is mounted into it (kubevirt/macvtap-cni#39). `None` when
/// `dev_dir` is devtmpfs or its mount cannot be told.
pub(crate) fn missing_tap_node_cause(dev_dir: &Path, mountinfo: &str) -> Option<String> {
    let fstype = not_devtmpfs(dev_dir, mountinfo)?;
    Some(format!(
        "{} is a {fstype} mount, not devtmpfs, so the kernel never creates tap nodes in it; \
         mount the host's /dev (devtmpfs) there, as a kind node needs (kubevirt/macvtap-cni#39)",
        dev_dir.display()
    ))
}

/// The file system type of the mount that holds `dev_dir`, from
/// `mountinfo`, when it is not devtmpfs; `None` when it is or its mount
/// cannot be told.
pub(crate) fn not_devtmpfs(dev_dir: &Path, mountinfo: &str) -> Option<String> {
    let dir = dev_dir
        .canonicalize()
        .unwrap_or_else(|_| dev_dir.to_path_buf());
    mount_fstype(mountinfo, &dir).filter(|t| t != "devtmpfs")
}

/// The file system type of the mount that holds `path` (the mount point
/// that is the longest prefix of it), from mountinfo text.
fn mount_fstype(mountinfo: &str, path: &Path) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(point) = left.split_whitespace().nth(4) else {
            continue;
        };
        let point = unescape_mountinfo(point);
        let Some(fstype) = right.split_whitespace().next() else {
            continue;
        };
        if path.starts_with(&point) {
            let depth = Path::new(&point).components().count();
            // Later lines of the same mount point are mounts on top.
            if best.as_ref().is_none_or(|(d, _)| depth >= *d) {
                best = Some((depth, fstype.to_string()));
            }
        }
    }
    best.map(|(_, t)| t)
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
23 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs udev rw,size=4030216k,mode=755
40 22 0:33 / /kind/node\\040dev rw shared:20 - tmpfs tmpfs rw
41 22 0:34 / /var/dev rw shared:21 - tmpfs tmpfs rw
42 41 0:5 / /var/dev rw shared:2 - devtmpfs udev rw
";

    #[test]
    fn a_dev_that_is_not_devtmpfs_is_named_as_the_cause() {
        assert_eq!(missing_tap_node_cause(Path::new("/dev"), MOUNTINFO), None);
        let cause = missing_tap_node_cause(Path::new("/kind/node dev"), MOUNTINFO).unwrap();
        assert!(cause.contains("tmpfs mount, not devtmpfs"), "{cause}");
        assert!(cause.contains("kubevirt/macvtap-cni#39"), "{cause}");
        // The top mount of a mount point counts.
        assert_eq!(
            missing_tap_node_cause(Path::new("/var/dev"), MOUNTINFO),
            None
        );
        // Below / only: the root file system, not devtmpfs.
        assert!(
            missing_tap_node_cause(Path::new("/srv/dev"), MOUNTINFO)
                .unwrap()
                .contains("ext4")
        );
    }
}
