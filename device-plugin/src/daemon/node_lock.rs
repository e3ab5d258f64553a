//! One daemon of ours serves a node at a time.
//!
//! Two of our DaemonSets can put two daemons on one node: the same
//! manifests applied in a second namespace, or a second Helm release. By
//! default the metrics host port keeps them apart (the scheduler holds the
//! second pod Pending), but nothing does with metrics off. Two daemons
//! would both register the same resources with the kubelet, each reclaim
//! the links the other handed out, and one's uninstall clean-up would run
//! under the other's pods.
//!
//! So the daemon takes an exclusive `flock` on the kubelet's
//! device-plugins directory before it reads or serves anything, and holds
//! it until the process exits, uninstall clean-up included. A second daemon
//! waits for the lock and says why in its log; SIGTERM or SIGINT ends the
//! wait, and that daemon exits having touched nothing.
//!
//! The directory itself is locked, not a file in it: the kubelet deletes
//! every file there when it starts (which would let a second daemon lock a
//! new file beside the first), and a lock file would be one more thing on
//! the node for the uninstall to remove. The lock is on the directory's
//! inode, so every pod that mounts it shares the lock, whatever its mount
//! namespace. The Go project's daemon takes no lock; README's migration
//! waits for its pod to go instead.

use super::Signals;
use crate::error::{Error, Result};
use crate::install::try_lock;
use nix::fcntl::Flock;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;
use tracing::{info, warn};

/// How often a waiting daemon tries the lock again.
const RETRY: Duration = Duration::from_millis(100);

/// How often a waiting daemon says again that it waits.
const SAY_AGAIN: Duration = Duration::from_secs(300);

/// The node's lock, held until dropped (at the process's exit).
#[derive(Debug)]
pub(super) struct NodeLock {
    _lock: Flock<OwnedFd>,
}

/// How [`take`] ended.
#[derive(Debug)]
pub(super) enum Taken {
    /// The lock is ours.
    Held(NodeLock),
    /// A signal, named, ended the wait before the lock was free.
    Stopped(&'static str),
}

/// Takes the lock on `plugin_dir` (made when missing, as the daemon makes
/// it anyway), waiting while another daemon holds it, until `signals`
/// ends the wait.
pub(super) async fn take(plugin_dir: &Path, signals: &mut Signals) -> Result<Taken> {
    std::fs::create_dir_all(plugin_dir).map_err(Error::io(
        "creating the device-plugins directory",
        plugin_dir,
    ))?;
    let mut fd = OwnedFd::from(File::open(plugin_dir).map_err(Error::io(
        "opening the device-plugins directory to lock it",
        plugin_dir,
    ))?);
    let mut said = None;
    loop {
        match try_lock(fd).map_err(Error::io(
            "locking the device-plugins directory",
            plugin_dir,
        ))? {
            Ok(lock) => {
                if said.is_some() {
                    info!(dir = %plugin_dir.display(), "the other daemon exited: this one serves the node now");
                }
                return Ok(Taken::Held(NodeLock { _lock: lock }));
            }
            Err(back) => fd = back,
        }
        let now = tokio::time::Instant::now();
        if said.is_none_or(|at| now >= at + SAY_AGAIN) {
            warn!(
                dir = %plugin_dir.display(),
                "another macvtap daemon serves this node (it holds the lock on the kubelet's device-plugins directory): waiting for it to exit before serving; two of our DaemonSets (or Helm releases) on one node? see README, Uninstall"
            );
            said = Some(now);
        }
        tokio::select! {
            sig = signals.recv() => return Ok(Taken::Stopped(sig)),
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::errno::Errno;
    use nix::fcntl::FlockArg;

    /// A runtime with signals, as the daemon's.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_second_taker_waits_until_the_first_lock_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("device-plugins");
        runtime().block_on(async {
            let mut signals = Signals::new().unwrap();
            let first = take(&plugins, &mut signals).await.unwrap();
            assert!(matches!(first, Taken::Held(_)), "{first:?}");
            assert!(plugins.is_dir(), "the directory is made");
            let second = {
                let plugins = plugins.clone();
                tokio::spawn(async move {
                    let mut signals = Signals::new().unwrap();
                    take(&plugins, &mut signals).await.unwrap()
                })
            };
            // The second is still waiting once it has tried more than once.
            tokio::time::sleep(RETRY * 3).await;
            assert!(!second.is_finished(), "took a lock another holds");
            drop(first);
            let second = second.await.unwrap();
            assert!(matches!(second, Taken::Held(_)), "{second:?}");
        });
    }

    #[test]
    fn a_lock_taken_elsewhere_is_seen_on_the_directory_itself() {
        let dir = tempfile::tempdir().unwrap();
        runtime().block_on(async {
            let mut signals = Signals::new().unwrap();
            let Taken::Held(_held) = take(dir.path(), &mut signals).await.unwrap() else {
                panic!("not taken");
            };
            // Another open of the same directory (another pod's mount of
            // it) cannot lock it.
            let other = OwnedFd::from(File::open(dir.path()).unwrap());
            let refused = Flock::lock(other, FlockArg::LockExclusiveNonblock).unwrap_err();
            assert_eq!(refused.1, Errno::EWOULDBLOCK);
        });
    }

    #[test]
    fn a_file_where_the_directory_belongs_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("device-plugins");
        std::fs::write(&file, "").unwrap();
        runtime().block_on(async {
            let mut signals = Signals::new().unwrap();
            let e = take(&file, &mut signals).await.unwrap_err().to_string();
            assert!(e.contains("device-plugins"), "{e}");
        });
    }
}
