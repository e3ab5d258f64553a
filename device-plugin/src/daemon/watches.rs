//! The daemon's watches, one of its three parts: the one inotify instance
//! and its watches of the device-plugins directory (kubelet restarts, our
//! sockets deleted), the config file's directory (live reload) and `/dev`
//! (a deleted tap node starts a reclaim round at once), and the timer of
//! the socket check. It says what each event concerns ([`Watches::see`]);
//! the daemon hands that to the part it is for.

use crate::core::reclaim::tap_node_deleted;
use crate::fswatch::{DirWatcher, FsEvent};
use nix::sys::inotify::WatchDescriptor;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How often the plugin checks that its sockets still exist, in case an
/// inotify event was missed.
const SOCKET_CHECK: Duration = Duration::from_secs(5);

/// The daemon's inotify watches and the socket check's timer.
pub(super) struct Watches {
    /// The inotify instance of the device-plugins, config and `/dev`
    /// directories.
    fs: DirWatcher,
    /// The device-plugins directory.
    plugin_dir: PathBuf,
    /// The device-plugins directory's watch; `None` while it is gone.
    plugin_wd: Option<WatchDescriptor>,
    /// The config file directory's watch, if there is a config file.
    config_wd: Option<WatchDescriptor>,
    /// The watch of `/dev` for deleted tap nodes, and where the reclaim
    /// loop hears of them; `None` when `/dev` cannot be watched.
    tap_nodes: Option<(WatchDescriptor, mpsc::UnboundedSender<()>)>,
    /// Whether a tap node was deleted in the events seen since the last
    /// [`Watches::tell_reclaim`].
    tap_gone: bool,
    /// When the sockets are next checked.
    next_socket_check: Instant,
}

/// What one inotify event concerns beyond the watches themselves.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Seen {
    /// The kernel's queue overflowed: events of every watch may be lost.
    pub(super) overflow: bool,
    /// It is an event in the device-plugins directory.
    pub(super) plugin_dir: bool,
    /// Something changed in the config file's directory.
    pub(super) config: bool,
}

impl Watches {
    /// The watches on `fs`: of `plugin_dir` (`plugin_wd`), the config
    /// file's directory (`config_wd`) and tap nodes (`tap_nodes`, with
    /// where the reclaim loop hears of a deleted one); the first socket
    /// check is one [`SOCKET_CHECK`] away.
    pub(super) fn new(
        fs: DirWatcher,
        plugin_dir: PathBuf,
        plugin_wd: Option<WatchDescriptor>,
        config_wd: Option<WatchDescriptor>,
        tap_nodes: Option<(WatchDescriptor, mpsc::UnboundedSender<()>)>,
    ) -> Self {
        Self {
            fs,
            plugin_dir,
            plugin_wd,
            config_wd,
            tap_nodes,
            tap_gone: false,
            next_socket_check: Instant::now() + SOCKET_CHECK,
        }
    }

    /// Takes in one inotify event: a watch that ended is forgotten (and
    /// said), a deleted tap node noted for [`Watches::tell_reclaim`]; the
    /// answer is what else it concerns. A queue overflow stands for every
    /// watch's lost events.
    pub(super) fn see(&mut self, ev: &FsEvent) -> Seen {
        let to = Concerns::of(
            ev,
            self.plugin_wd,
            self.config_wd,
            self.tap_nodes.as_ref().map(|(wd, _)| *wd),
        );
        if to.overflow {
            warn!(
                "inotify queue overflowed: events were lost; checking sockets, registering again, \
                 re-reading the config and looking for lost links"
            );
        }
        if to.plugin_dir && ev.watch_ended() {
            warn!(dir = %self.plugin_dir.display(), "the device-plugins directory went away; waiting for it to come back");
            self.plugin_wd = None;
        }
        let mut config = false;
        if to.config {
            if ev.watch_ended() {
                warn!("the config file's directory went away; live reload stops");
                self.config_wd = None;
            } else {
                config = true;
            }
        }
        if to.tap_nodes {
            if ev.watch_ended() {
                debug!(
                    "the watch of tap nodes ended; lost links are healed at each reclaim interval only"
                );
                self.tap_nodes = None;
            } else {
                self.tap_gone |= to.overflow || tap_node_deleted(ev);
            }
        }
        Seen {
            overflow: to.overflow,
            plugin_dir: to.plugin_dir,
            config,
        }
    }

    /// Starts a reclaim round at once if a tap node was deleted in the
    /// events seen since the last call (once per batch of events).
    pub(super) fn tell_reclaim(&mut self) {
        if std::mem::take(&mut self.tap_gone)
            && let Some((_, reclaim)) = &self.tap_nodes
            && reclaim.send(()).is_err()
        {
            self.tap_nodes = None;
        }
    }

    /// When the sockets are next checked.
    pub(super) fn next_socket_check(&self) -> Instant {
        self.next_socket_check
    }

    /// Whether the socket check is due at `now` (the next one is then one
    /// [`SOCKET_CHECK`] later), and if so whether the device-plugins
    /// directory, gone before, is watched again now: `None` when not due.
    pub(super) fn socket_check(&mut self, now: Instant) -> Option<SocketCheck> {
        if now < self.next_socket_check {
            return None;
        }
        self.next_socket_check = now + SOCKET_CHECK;
        let mut plugin_dir_back = false;
        if self.plugin_wd.is_none() {
            self.plugin_wd = rewatch(&self.fs, &self.plugin_dir);
            plugin_dir_back = self.plugin_wd.is_some();
        }
        Some(SocketCheck { plugin_dir_back })
    }

    /// Stops watching the device-plugins directory (at shutdown).
    pub(super) fn unwatch_plugin_dir(&mut self) {
        if let Some(wd) = self.plugin_wd.take() {
            self.fs.unwatch(wd);
        }
    }
}

/// A socket check that is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SocketCheck {
    /// The device-plugins directory came back and is watched again: the
    /// kubelet may have restarted meanwhile.
    pub(super) plugin_dir_back: bool,
}

/// Watches the device-plugins directory `dir` again once it exists.
fn rewatch(fs: &DirWatcher, dir: &Path) -> Option<WatchDescriptor> {
    if !dir.is_dir() {
        return None;
    }
    match fs.watch_dir(dir) {
        Ok(wd) => {
            info!(dir = %dir.display(), "watching the device-plugins directory again");
            Some(wd)
        }
        Err(e) => {
            debug!(error = %e, "device-plugins directory not watchable yet");
            None
        }
    }
}

/// Which of the daemon's watches one inotify event concerns.
#[derive(Debug, Default, PartialEq, Eq)]
struct Concerns {
    /// The kernel's queue overflowed: the event belongs to no watch and
    /// every watch may have lost events, so it concerns them all.
    overflow: bool,
    /// The device-plugins directory.
    plugin_dir: bool,
    /// The config file's directory.
    config: bool,
    /// `/dev`, for deleted tap nodes.
    tap_nodes: bool,
}

impl Concerns {
    /// Routes `ev` by its watch. Not either-or: inotify gives a directory
    /// one watch descriptor per instance, so a config file kept in the
    /// device-plugins directory shares that directory's watch.
    fn of(
        ev: &FsEvent,
        plugin_dir: Option<WatchDescriptor>,
        config: Option<WatchDescriptor>,
        tap_nodes: Option<WatchDescriptor>,
    ) -> Self {
        if ev.overflowed() {
            // IN_Q_OVERFLOW comes with watch descriptor -1, which is no watch.
            return Concerns {
                overflow: true,
                plugin_dir: false,
                config: config.is_some(),
                tap_nodes: tap_nodes.is_some(),
            };
        }
        let is = |wd: Option<WatchDescriptor>| wd == Some(ev.wd);
        Concerns {
            overflow: false,
            plugin_dir: is(plugin_dir),
            config: is(config),
            tap_nodes: is(tap_nodes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::inotify::AddWatchFlags;

    fn event(wd: WatchDescriptor, mask: AddWatchFlags) -> FsEvent {
        FsEvent {
            wd,
            name: Some("x".into()),
            mask,
        }
    }

    /// Three real watches (and a fourth that none of the daemon's is).
    fn watches() -> (tempfile::TempDir, [WatchDescriptor; 4]) {
        let dir = tempfile::tempdir().unwrap();
        let (fs, _rx) = DirWatcher::new().unwrap();
        let wds = ["plugins", "config", "dev", "other"].map(|d| {
            std::fs::create_dir(dir.path().join(d)).unwrap();
            fs.watch_dir(&dir.path().join(d)).unwrap()
        });
        (dir, wds)
    }

    #[test]
    fn each_watch_routes_its_own_events() {
        let (_dir, [p, c, t, _]) = watches();
        let of = |wd| {
            Concerns::of(
                &event(wd, AddWatchFlags::IN_CREATE),
                Some(p),
                Some(c),
                Some(t),
            )
        };
        assert_eq!(
            of(p),
            Concerns {
                plugin_dir: true,
                ..Default::default()
            }
        );
        assert_eq!(
            of(c),
            Concerns {
                config: true,
                ..Default::default()
            }
        );
        assert_eq!(
            of(t),
            Concerns {
                tap_nodes: true,
                ..Default::default()
            }
        );
    }

    #[test]
    fn a_config_file_in_the_device_plugins_directory_is_reloaded() {
        let (_dir, [p, _, t, _]) = watches();
        let to = Concerns::of(
            &event(p, AddWatchFlags::IN_MOVED_TO),
            Some(p),
            Some(p),
            Some(t),
        );
        assert!(to.plugin_dir && to.config, "{to:?}");
    }

    #[test]
    fn an_overflow_concerns_every_watch_though_it_names_none() {
        let (_dir, [p, c, t, other]) = watches();
        let to = Concerns::of(
            &event(other, AddWatchFlags::IN_Q_OVERFLOW),
            Some(p),
            Some(c),
            Some(t),
        );
        assert_eq!(
            to,
            Concerns {
                overflow: true,
                plugin_dir: false,
                config: true,
                tap_nodes: true
            }
        );
        let none = Concerns::of(
            &event(other, AddWatchFlags::IN_Q_OVERFLOW),
            Some(p),
            None,
            None,
        );
        assert_eq!(
            none,
            Concerns {
                overflow: true,
                ..Default::default()
            }
        );
    }

    /// Watches of a device-plugins, a config and a tap node directory made
    /// under one temporary directory, the reclaim loop's end of the tap
    /// node channel, and the watch descriptors.
    fn daemon_watches() -> (
        tempfile::TempDir,
        Watches,
        mpsc::UnboundedReceiver<()>,
        [WatchDescriptor; 3],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (fs, _rx) = DirWatcher::new().unwrap();
        let wds = ["plugins", "config", "dev"].map(|d| {
            std::fs::create_dir(dir.path().join(d)).unwrap();
            fs.watch_dir(&dir.path().join(d)).unwrap()
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let w = Watches::new(
            fs,
            dir.path().join("plugins"),
            Some(wds[0]),
            Some(wds[1]),
            Some((wds[2], tx)),
        );
        (dir, w, rx, wds)
    }

    #[test]
    fn deleted_tap_nodes_start_one_reclaim_round_per_batch() {
        let (_dir, mut w, mut reclaim, [p, c, t]) = daemon_watches();
        let gone = |name: &str| FsEvent {
            wd: t,
            name: Some(name.into()),
            mask: AddWatchFlags::IN_DELETE,
        };
        assert_eq!(w.see(&gone("tap40")), Seen::default());
        assert_eq!(w.see(&gone("tap41")), Seen::default());
        w.tell_reclaim();
        assert!(reclaim.try_recv().is_ok());
        assert!(reclaim.try_recv().is_err(), "one round for the batch");
        // Not a tap node, or not a deletion: nothing to tell.
        w.see(&gone("null"));
        w.see(&event(t, AddWatchFlags::IN_CREATE));
        w.tell_reclaim();
        assert!(reclaim.try_recv().is_err());
        // An overflow may have hidden one; it concerns the others too.
        let overflow = w.see(&event(p, AddWatchFlags::IN_Q_OVERFLOW));
        assert_eq!(
            overflow,
            Seen {
                overflow: true,
                plugin_dir: false,
                config: true
            }
        );
        w.tell_reclaim();
        assert!(reclaim.try_recv().is_ok());
        // Config and device-plugins events are said as such.
        assert_eq!(
            w.see(&event(c, AddWatchFlags::IN_CLOSE_WRITE)),
            Seen {
                config: true,
                ..Default::default()
            }
        );
        assert_eq!(
            w.see(&event(p, AddWatchFlags::IN_CREATE)),
            Seen {
                plugin_dir: true,
                ..Default::default()
            }
        );
    }

    #[test]
    fn an_ended_watch_is_forgotten_and_the_device_plugins_directory_watched_again() {
        let (dir, mut w, _reclaim, [p, c, _]) = daemon_watches();
        let ended = |wd| FsEvent {
            wd,
            name: None,
            mask: AddWatchFlags::IN_IGNORED,
        };
        assert!(w.see(&ended(p)).plugin_dir);
        assert!(!w.see(&event(p, AddWatchFlags::IN_CREATE)).plugin_dir);
        assert!(!w.see(&ended(c)).config, "no reload for a watch that ended");
        assert!(!w.see(&event(c, AddWatchFlags::IN_CREATE)).config);
        // Not due yet; once due, the directory (still there) is watched again.
        let now = Instant::now();
        assert_eq!(w.socket_check(now), None);
        let due = w.next_socket_check();
        assert_eq!(
            w.socket_check(due),
            Some(SocketCheck {
                plugin_dir_back: true
            })
        );
        assert_eq!(w.next_socket_check(), due + SOCKET_CHECK);
        assert_eq!(
            w.socket_check(due + SOCKET_CHECK),
            Some(SocketCheck {
                plugin_dir_back: false
            }),
            "watched already"
        );
        drop(dir);
    }
}
