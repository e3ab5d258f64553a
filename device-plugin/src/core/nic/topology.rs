//! NUMA topology of a NIC, read from sysfs.

use std::path::Path;

/// The NUMA node of NIC `ifname` from `<sysfs>/class/net/<ifname>/device/numa_node`;
/// `None` for virtual NICs (no `device`), for `-1` (no NUMA) or when unreadable.
pub(crate) fn numa_node(sysfs: &Path, ifname: &str) -> Option<i64> {
    let path = sysfs
        .join("class/net")
        .join(ifname)
        .join("device/numa_node");
    let text = std::fs::read_to_string(path).ok()?;
    let node: i64 = text.trim().parse().ok()?;
    (node >= 0).then_some(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_node_is_read_and_minus_one_means_none() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("class/net/eth0/device");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("numa_node"), "1\n").unwrap();
        assert_eq!(numa_node(dir.path(), "eth0"), Some(1));
        std::fs::write(dev.join("numa_node"), "-1\n").unwrap();
        assert_eq!(numa_node(dir.path(), "eth0"), None);
        assert_eq!(numa_node(dir.path(), "veth0"), None);
    }
}
