//! Directory watches with inotify.
//!
//! Used for the kubelet's device-plugins directory (a new `kubelet.sock`
//! means a restarted kubelet; a deleted plugin socket means we must serve
//! again), for the config file's directory (live reload; a ConfigMap
//! volume swaps a symlink there instead of writing the file) and for `/dev`
//! (a deleted tap node is a lost link to heal), all on one instance.
//!
//! A small thread blocks reading the inotify descriptor and forwards event
//! batches to an async channel, so no unsafe fd registration is needed.

use crate::error::{Error, Result};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::mpsc;
use tracing::error;

/// One inotify event.
#[derive(Debug, Clone)]
pub(crate) struct FsEvent {
    /// The watch it belongs to.
    pub wd: WatchDescriptor,
    /// The entry's name inside the watched directory, if any.
    pub name: Option<OsString>,
    /// What happened.
    pub mask: AddWatchFlags,
}

impl FsEvent {
    /// Whether the entry was created or moved in.
    pub(crate) fn is_create(&self) -> bool {
        self.mask
            .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
    }

    /// Whether the entry was deleted or moved out.
    pub(crate) fn is_delete(&self) -> bool {
        self.mask
            .intersects(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM)
    }

    /// Whether the watch itself ended (directory deleted or moved).
    pub(crate) fn watch_ended(&self) -> bool {
        self.mask.intersects(
            AddWatchFlags::IN_IGNORED | AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF,
        )
    }

    /// Whether the kernel's event queue overflowed (events were lost).
    pub(crate) fn overflowed(&self) -> bool {
        self.mask.contains(AddWatchFlags::IN_Q_OVERFLOW)
    }
}

/// An inotify instance; its events arrive on the receiver [`DirWatcher::new`] returns.
#[derive(Debug, Clone)]
pub(crate) struct DirWatcher {
    inotify: Arc<Inotify>,
}

impl DirWatcher {
    /// Creates an inotify instance and the thread that reads it. The thread
    /// ends when the receiver is dropped and the next event arrives.
    pub(crate) fn new() -> Result<(Self, mpsc::UnboundedReceiver<Vec<FsEvent>>)> {
        let inotify = Arc::new(Inotify::init(InitFlags::IN_CLOEXEC).map_err(|e| {
            Error::Task(format!(
                "cannot create an inotify instance: {}",
                if e == nix::errno::Errno::EMFILE {
                    "the node's inotify instance limit is reached (EMFILE); raise the \
                             sysctl fs.inotify.max_user_instances"
                        .to_string()
                } else {
                    format!("{} ({e})", e.desc())
                }
            ))
        })?);
        let (tx, rx) = mpsc::unbounded_channel();
        let reader = inotify.clone();
        std::thread::Builder::new()
            .name("inotify".into())
            .spawn(move || {
                loop {
                    match reader.read_events() {
                        Ok(events) => {
                            let batch = events
                                .into_iter()
                                .map(|e| FsEvent {
                                    wd: e.wd,
                                    name: e.name,
                                    mask: e.mask,
                                })
                                .collect();
                            if tx.send(batch).is_err() {
                                return;
                            }
                        }
                        Err(nix::errno::Errno::EINTR) => {}
                        Err(e) => {
                            error!(error = %e, "reading inotify events; directory watches stop");
                            return;
                        }
                    }
                }
            })
            .map_err(|e| Error::Task(format!("cannot start the inotify thread: {e}")))?;
        Ok((Self { inotify }, rx))
    }

    /// Watches the entries of directory `dir` being created, deleted, moved
    /// or written.
    pub(crate) fn watch_dir(&self, dir: &Path) -> Result<WatchDescriptor> {
        self.add_watch(
            dir,
            AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_MOVED_FROM
                | AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_DELETE_SELF
                | AddWatchFlags::IN_MOVE_SELF,
        )
    }

    /// Watches only the entries of directory `dir` being deleted: for a
    /// busy directory such as `/dev`, where every close of `/dev/null`
    /// after a write would otherwise be an event.
    pub(crate) fn watch_deletions(&self, dir: &Path) -> Result<WatchDescriptor> {
        self.add_watch(dir, AddWatchFlags::IN_DELETE)
    }

    fn add_watch(&self, dir: &Path, mask: AddWatchFlags) -> Result<WatchDescriptor> {
        self.inotify
            .add_watch(dir, mask | AddWatchFlags::IN_ONLYDIR)
            .map_err(|errno| Error::Watch {
                dir: dir.to_path_buf(),
                errno,
            })
    }

    /// Stops watching `wd` (ignores a watch the kernel already dropped).
    pub(crate) fn unwatch(&self, wd: WatchDescriptor) {
        let _ = self.inotify.rm_watch(wd);
    }
}
