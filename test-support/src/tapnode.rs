//! How tests that run at once keep their macvtaps' `/dev/tapN` nodes apart.
//!
//! `/dev/tapN` is named after the link's ifindex, and every fresh namespace
//! numbers its links from 1 again, so two tests running at once can both
//! make a macvtap with, say, ifindex 4, and only one of them gets
//! `/dev/tap4` (on a real node all macvtaps are created in the host
//! namespace, so this does not happen there). The rule:
//!
//! - a test whose macvtaps get an ifindex the kernel chooses (the device
//!   plugin's Allocate, a runtime) holds [`tap_node_lock`] while it may have
//!   one;
//! - a test that creates its macvtaps itself gives each an ifindex from
//!   [`unique_ifindex`], far above what the kernel hands out in a fresh
//!   namespace, and so needs no lock and runs in parallel.

use crate::lockfile::flock;
use crate::netns::delete_macvtaps_in;
use anyhow::Result;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

/// The lock file that [`tap_node_lock`] takes.
pub const TAP_NODE_LOCK: &str = "/tmp/macvtap-tap-nodes.lock";

/// Serializes tests whose macvtaps get kernel-chosen ifindexes in fresh
/// namespaces: an exclusive `flock` on [`TAP_NODE_LOCK`], across processes
/// and threads. Taking it also sweeps the namespaces that test processes no
/// longer running left behind.
pub fn tap_node_lock() -> Result<nix::fcntl::Flock<std::fs::File>> {
    let lock = flock(Path::new(TAP_NODE_LOCK))?;
    sweep_stale_test_namespaces();
    Ok(lock)
}

/// The lowest ifindex [`unique_ifindex`] hands out; kernel-chosen indexes
/// in test namespaces stay far below it.
pub const UNIQUE_IFINDEX_BASE: u32 = 100_000;

/// An ifindex that no other test will pick, for a macvtap a test creates
/// itself, so that its `/dev/tapN` never collides (see the module docs).
/// Such tests do not take [`tap_node_lock`], so their `/dev/tapN` (at or
/// above [`UNIQUE_IFINDEX_BASE`]) can come and go while a locked test runs.
pub fn unique_ifindex() -> u32 {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let seed = t
        ^ std::process::id().wrapping_mul(2_654_435_761)
        ^ COUNTER.fetch_add(1, Ordering::SeqCst).wrapping_mul(40503);
    UNIQUE_IFINDEX_BASE + seed % 900_000_000
}

/// The process that created a test namespace, from its name:
/// `mvt-<pid>-<n>-<tag>` ([`crate::TestNs`]) or `dpt-<tag>-<pid>-<n>` (the
/// device plugin tests' names before this crate, still made by older
/// checkouts on the same machine).
pub fn test_namespace_owner(name: &str) -> Option<u32> {
    let parts: Vec<&str> = name.split('-').collect();
    match *parts.first()? {
        "dpt" if parts.len() >= 4 => parts[parts.len() - 2].parse().ok(),
        "mvt" if parts.len() >= 4 => parts[1].parse().ok(),
        _ => None,
    }
}

/// Removes the test namespaces of test processes that no longer run (a run
/// killed before its clean-up, such as one stopped mid-way): their macvtaps
/// would hold `/dev/tapN` nodes that fresh tests need. The macvtaps are
/// deleted first, so their nodes are gone when this returns (a namespace
/// dies asynchronously). Called with the tap-node lock held; best effort.
fn sweep_stale_test_namespaces() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = test_namespace_owner(&name) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = delete_macvtaps_in(&entry.path());
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &name])
            .status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_namespace_names_say_their_process() {
        assert_eq!(test_namespace_owner("dpt-heal-1577-0"), Some(1577));
        assert_eq!(test_namespace_owner("dpt-a-b-42-3"), Some(42));
        assert_eq!(test_namespace_owner("mvt-1490-2-node"), Some(1490));
        assert_eq!(test_namespace_owner("mvt-7-0-sandbox-b"), Some(7));
        assert_eq!(test_namespace_owner("node"), None);
        assert_eq!(test_namespace_owner("dpt-x"), None);
        assert_eq!(test_namespace_owner("mvt-x-0-y"), None);
    }

    #[test]
    fn unique_ifindexes_stay_above_what_fresh_namespaces_hand_out() {
        let a = unique_ifindex();
        let b = unique_ifindex();
        assert!(a >= 100_000 && b >= 100_000, "{a} {b}");
        assert_ne!(a, b);
    }
}
