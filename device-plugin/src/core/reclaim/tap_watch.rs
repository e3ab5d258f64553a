//! The watch on the tap node directory that starts a reclaim round at once
//! when a tap node is deleted (a macvtap destroyed in any namespace).

use std::path::Path;
use tracing::warn;

/// Watches `dev_dir` on the daemon's `fs` for deleted tap nodes (see
/// [`tap_node_deleted`]), so that a lost link is healed at once rather
/// than at the next reclaim interval. Without the watch, healing still
/// runs every interval; that is logged once.
pub(crate) fn watch_tap_nodes(
    fs: &crate::fswatch::DirWatcher,
    dev_dir: &Path,
) -> Option<nix::sys::inotify::WatchDescriptor> {
    match fs.watch_deletions(dev_dir) {
        Ok(wd) => Some(wd),
        Err(e) => {
            warn!(dir = %dev_dir.display(), error = %e,
                "cannot watch tap nodes; lost links are healed at each reclaim interval only");
            None
        }
    }
}

/// Whether `ev` (of the watch [`watch_tap_nodes`] made) is the deletion of
/// a `tap*` node: a macvtap destroyed in any namespace.
pub(crate) fn tap_node_deleted(ev: &crate::fswatch::FsEvent) -> bool {
    ev.mask
        .contains(nix::sys::inotify::AddWatchFlags::IN_DELETE)
        && ev
            .name
            .as_ref()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("tap"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fswatch::DirWatcher;
    use std::time::Duration;

    #[tokio::test]
    async fn only_deleted_tap_nodes_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (fs, mut events) = DirWatcher::new().unwrap();
        let wd = watch_tap_nodes(&fs, dir.path()).unwrap();
        for name in ["tap4242", "null", "tapx"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        std::fs::remove_file(dir.path().join("null")).unwrap();
        std::fs::remove_file(dir.path().join("tap4242")).unwrap();
        std::fs::rename(dir.path().join("tapx"), dir.path().join("tapy")).unwrap();
        std::fs::remove_file(dir.path().join("tapy")).unwrap();
        let mut seen = Vec::new();
        while seen.len() < 3 {
            let batch = tokio::time::timeout(Duration::from_secs(10), events.recv())
                .await
                .expect("the deletions are reported")
                .unwrap();
            seen.extend(batch.into_iter().inspect(|e| assert_eq!(e.wd, wd)));
        }
        let reported: Vec<_> = seen
            .iter()
            .map(|e| (e.name.clone().unwrap(), tap_node_deleted(e)))
            .collect();
        assert_eq!(
            reported,
            [
                ("null".into(), false),
                ("tap4242".into(), true),
                ("tapy".into(), true)
            ],
            "deletions only (no creation, write or rename), tap nodes told apart"
        );
    }

    #[test]
    fn a_dev_that_cannot_be_watched_is_no_error() {
        let (fs, _events) = DirWatcher::new().unwrap();
        assert!(watch_tap_nodes(&fs, Path::new("/nonexistent-dev")).is_none());
    }
}
