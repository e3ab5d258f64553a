//! The daemon: keeps one served and registered plugin per resource, in step
//! with the configuration, the node's NICs and the kubelet.
//!
//! One loop ([`run`]) owns all plugin state (the `Daemon` struct) and never
//! waits on the kubelet. It takes one input at a time (`Inputs::next`) and
//! hands it to that kind's handler (`on_signal`, `on_links`,
//! `on_fs_events`, `on_stream_event`, `on_registration_done`, `on_timer`).
//! It reacts to:
//! - link changes from `crate::core::link_table` (health, NUMA, auto-discovery of
//!   the resources they touch: `reconcile.rs`);
//! - inotify events on one `DirWatcher`: in the device-plugins directory
//!   (a new `kubelet.sock` means a restarted kubelet: re-serve where our
//!   socket was deleted, and register again: `registration_effects.rs`),
//!   in the config file's directory (live reload: `reload.rs`) and in
//!   `/dev` (a deleted tap node starts a reclaim round at once);
//! - ListAndWatch streams opening and ending (`StreamEvent`s from the
//!   servers): a registered resource whose stream ended, or that got none
//!   within `registration::STREAM_WAIT` of registering, registers again (the kubelet
//!   never reopens a stream itself);
//! - results of Register calls, each running in its own task (at most one
//!   per resource), so a hung kubelet delays nothing else;
//! - timers (registration retries with backoff, stream deadlines, a socket
//!   existence check);
//! - SIGTERM/SIGINT (abort registrations, stop serving, remove our sockets,
//!   return).
//!
//! The loop beats its [`Liveness`] after each input (timers included, so an
//! idle loop beats at least every `SOCKET_CHECK`); `/healthz`, served on
//! a thread of its own, reports a loop that stopped beating.
//!
//! Each resource's registration is a state machine of plain transitions
//! (`registration.rs`); `registration_effects.rs` carries out what it
//! decides.
//!
//! A replaced server is stopped in the background, and the next Register
//! of its resource waits for that stop: kubelets up to 1.36 disconnect the
//! newest client of a resource when an older stream ends, so the old stream
//! must be over before the new registration exists.

mod plugin;
mod reconcile;
mod registration;
mod registration_effects;
mod reload;
mod uninstall;

use crate::config::{Resolved, ResourceConfig};
use crate::core::degraded::Degraded;
use crate::core::host::{HostPaths, SharedHost};
use crate::core::inflight::InFlight;
use crate::core::ledger::AllocationClock;
use crate::core::ledger::Assignments;
use crate::core::link_table::{LinkTable, LinkUpdate, spawn_link_watcher};
use crate::core::nic::discovery::Discovery;
use crate::core::nic::health::HealthLog;
use crate::core::reclaim::{Reclaimer, reclaim_loop, tap_node_deleted, watch_tap_nodes};
use crate::core::report::Observer;
use crate::error::{Error, Result};
use crate::fswatch::{DirWatcher, FsEvent};
use crate::kubelet::context::{ServerContext, StreamEvent};
use crate::operator::events::{EventSink, NodeEvent};
use crate::operator::liveness::Liveness;
use crate::operator::metrics::Metrics;
use crate::operator::observer::MetricsAndEvents;
use crate::operator::owner::Uninstall;
use crate::options::{Options, load_config};
use nix::sys::inotify::WatchDescriptor;
use plugin::Plugin;
use registration_effects::{RegistrationDone, rewatch};
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// The kernel the daemon works on: Allocate, reclaim and heal.
const KERNEL: &macvtap_link::Linux = &macvtap_link::Linux;

/// How often the plugin checks that its sockets still exist, in case an
/// inotify event was missed.
const SOCKET_CHECK: Duration = Duration::from_secs(5);
/// How long a replaced server's connections get to finish.
const RESTART_WAIT: Duration = Duration::from_secs(2);
/// How long the servers' connections get to finish at shutdown.
const SHUTDOWN_WAIT: Duration = Duration::from_millis(300);

/// Where the daemon's inputs arrive; [`Inputs::next`] waits for one.
struct Inputs {
    sigterm: Signal,
    sigint: Signal,
    links: mpsc::UnboundedReceiver<LinkUpdate>,
    fs: mpsc::UnboundedReceiver<Vec<FsEvent>>,
    streams: mpsc::UnboundedReceiver<StreamEvent>,
    registrations: mpsc::UnboundedReceiver<RegistrationDone>,
}

/// One input of the daemon loop; each kind has its handler on [`Daemon`].
enum Input {
    /// SIGTERM or SIGINT, by name.
    Signal(&'static str),
    /// Links that changed, or all of them read again.
    Links(LinkUpdate),
    /// A batch of inotify events.
    Fs(Vec<FsEvent>),
    /// A ListAndWatch stream opened or ended.
    Stream(StreamEvent),
    /// A Register task finished.
    Registered(RegistrationDone),
    /// The earliest timer is due.
    Timer,
}

impl Inputs {
    /// Waits for the next input, or for `wake`. Fails when a helper thread
    /// that feeds the loop has stopped.
    async fn next(&mut self, wake: Instant) -> Result<Input> {
        tokio::select! {
            _ = self.sigterm.recv() => Ok(Input::Signal("SIGTERM")),
            _ = self.sigint.recv() => Ok(Input::Signal("SIGINT")),
            update = self.links.recv() => update.map(Input::Links).ok_or_else(|| {
                Error::Task("the thread reading link events stopped, so NIC health would go stale".into())
            }),
            batch = self.fs.recv() => batch
                .map(Input::Fs)
                .ok_or_else(|| {
                    Error::Task("the inotify thread stopped, so kubelet restarts would go unseen".into())
                }),
            Some(ev) = self.streams.recv() => Ok(Input::Stream(ev)),
            Some(done) = self.registrations.recv() => Ok(Input::Registered(done)),
            _ = tokio::time::sleep_until(wake) => Ok(Input::Timer),
        }
    }
}

/// All plugin state, owned by the loop of [`run`].
struct Daemon {
    opts: Options,
    ctx: ServerContext,
    plugins: BTreeMap<String, Plugin>,
    resolved: Resolved,
    file_text: Option<String>,
    /// The node's links, as the link events left them: the one table,
    /// which the link event thread only feeds.
    links: LinkTable,
    configs_tx: watch::Sender<Vec<ResourceConfig>>,
    registrations: mpsc::UnboundedSender<RegistrationDone>,
    next_attempt: u64,
    /// Stops of removed resources' servers, awaited (briefly) at shutdown.
    background: Vec<JoinHandle<()>>,
    /// Auto-discovery, which logs each link it leaves out once.
    discovery: Discovery,
    /// Each resource's last NIC health, to log and count its changes.
    health: HealthLog,
    /// Where health changes are reported (metrics).
    observer: MetricsAndEvents,
    /// The inotify instance of the device-plugins, config and `/dev`
    /// directories.
    fs: DirWatcher,
    /// The device-plugins directory's watch; `None` while it is gone.
    plugin_wd: Option<WatchDescriptor>,
    /// The config file directory's watch, if there is a config file.
    config_wd: Option<WatchDescriptor>,
    /// The watch of `/dev` for deleted tap nodes, and where the reclaim
    /// loop hears of them; `None` when `/dev` cannot be watched.
    tap_nodes: Option<(WatchDescriptor, mpsc::UnboundedSender<()>)>,
    /// When the sockets are next checked.
    next_socket_check: Instant,
    /// The reclaim loop, aborted at shutdown.
    tasks: Vec<JoinHandle<()>>,
    /// The loop's heartbeat, which `/healthz` reads.
    liveness: Arc<Liveness>,
    /// The `/metrics` and `/healthz` server, stopped when dropped.
    _http: Option<crate::operator::http::Server>,
    /// Whether our DaemonSet was deleted: an exit then cleans the node.
    uninstall: Uninstall,
}

/// Runs the daemon until SIGTERM or SIGINT. Errors are startup errors
/// (invalid configuration, unusable directories or sockets), or a helper
/// thread that stopped.
pub async fn run(opts: Options) -> Result<()> {
    let (mut d, mut inputs) = Daemon::start(opts).await?;
    loop {
        let input = inputs.next(d.next_wake()).await?;
        if d.handle(input).is_break() {
            break;
        }
        d.liveness.beat(std::time::Instant::now());
    }
    let exit = uninstall::Exit {
        opts: d.opts.clone(),
        uninstall: d.uninstall.clone(),
        inflight: d.ctx.inflight.clone(),
        clock: d.ctx.clock.clone(),
        assignments: d.ctx.assignments.clone(),
        resources: d.configs_tx.borrow().clone(),
        events: d.ctx.events.clone(),
    };
    d.shutdown().await;
    uninstall::clean_if_uninstalled(exit).await;
    Ok(())
}

impl Daemon {
    /// Sets everything up: the config watch (before the config is read, so
    /// no edit is lost), the configuration, the device-plugins directory,
    /// metrics, Events, signals, link events, the reclaim loop; then
    /// reconciles the plugins with the links and starts registering.
    async fn start(opts: Options) -> Result<(Self, Inputs)> {
        let (fs, fs_events) = DirWatcher::new()?;
        let loaded = reload::watch_then_read(&fs, &opts, load_config)?;
        info!(source = %loaded.resolved.source, resources = %loaded.resolved.resources, "configuration loaded");
        if let (Some(file), None) = (&opts.config_file, &loaded.file_text) {
            info!(file = %file.display(), "the config file does not exist (yet); it is applied when it appears");
        }
        let plugin_dir = opts.plugin_dir();
        std::fs::create_dir_all(&plugin_dir).map_err(Error::io(
            "creating the device-plugins directory",
            &plugin_dir,
        ))?;
        let metrics = Arc::new(Metrics::default());
        let events = EventSink::from_environment(opts.node_name.as_deref()).await;
        let uninstall = crate::operator::owner::from_environment(opts.owner.clone()).await;
        let mut tasks = Vec::new();
        let liveness = Arc::new(Liveness::new(std::time::Instant::now()));
        let http = match opts.metrics_addr {
            Some(addr) => Some(crate::operator::http::spawn(
                addr,
                crate::operator::http::Endpoints {
                    metrics: metrics.clone(),
                    liveness: liveness.clone(),
                },
            )?),
            None => None,
        };
        let sigterm = signal(SignalKind::terminate())
            .map_err(|e| Error::Task(format!("cannot handle SIGTERM: {e}")))?;
        let sigint = signal(SignalKind::interrupt())
            .map_err(|e| Error::Task(format!("cannot handle SIGINT: {e}")))?;
        let (links, links_rx) = spawn_link_watcher()?;
        let plugin_wd = Some(fs.watch_dir(&plugin_dir)?);

        let (configs_tx, configs_rx) = watch::channel(Vec::new());
        let (streams_tx, streams_rx) = mpsc::unbounded_channel();
        // The host's file systems: sysfs as the options say, and whether
        // tap nodes show in /dev (the host's devtmpfs mounted there) or
        // not (the Go project's DaemonSets mount no /dev), decided once.
        let paths = HostPaths {
            sysfs: opts.sysfs.clone(),
            ..HostPaths::default()
        }
        .judged();
        let observer = MetricsAndEvents::new(metrics.clone(), events.clone());
        let ctx = ServerContext {
            host: Arc::new(SharedHost::new(KERNEL, paths.clone())),
            metrics,
            events,
            streams: streams_tx,
            clock: AllocationClock::default(),
            assignments: Assignments::persisted(&plugin_dir, Arc::new(observer.clone())),
            inflight: InFlight::default(),
        };
        let (tap_gone_tx, tap_gone) = mpsc::unbounded_channel();
        let tap_nodes = watch_or_say(&fs, &paths, &ctx.events, tap_gone_tx);
        tasks.push(spawn_reclaim(
            &opts,
            &ctx,
            Arc::new(observer.clone()),
            configs_rx,
            paths,
            tap_gone,
        ));
        let (reg_tx, reg_rx) = mpsc::unbounded_channel();
        let discovery = Discovery::new(opts.discover_kinds.clone());
        let mut d = Daemon {
            opts,
            ctx,
            plugins: BTreeMap::new(),
            resolved: loaded.resolved,
            file_text: loaded.file_text,
            links,
            configs_tx,
            registrations: reg_tx,
            next_attempt: 0,
            background: Vec::new(),
            discovery,
            health: HealthLog::default(),
            observer,
            fs,
            plugin_wd,
            config_wd: loaded.config_wd,
            tap_nodes,
            next_socket_check: Instant::now() + SOCKET_CHECK,
            tasks,
            liveness,
            _http: http,
            uninstall,
        };
        d.reconcile();
        d.start_due_registrations();
        let inputs = Inputs {
            sigterm,
            sigint,
            links: links_rx,
            fs: fs_events,
            streams: streams_rx,
            registrations: reg_rx,
        };
        Ok((d, inputs))
    }

    /// When the loop must wake at the latest: the earliest registration
    /// retry, stream deadline or socket check.
    fn next_wake(&self) -> Instant {
        self.plugins
            .values()
            .filter_map(|p| p.registration.wake_at())
            .fold(self.next_socket_check, Instant::min)
    }

    /// Hands `input` to its handler, then runs the timers (an input can
    /// make a registration due at once). Breaks on a signal.
    fn handle(&mut self, input: Input) -> ControlFlow<()> {
        match input {
            Input::Signal(name) => return self.on_signal(name),
            Input::Links(links) => self.on_links(links),
            Input::Fs(batch) => self.on_fs_events(&batch),
            Input::Stream(ev) => self.on_stream_event(ev),
            Input::Registered(done) => self.on_registration_done(done),
            Input::Timer => {}
        }
        self.on_timer(Instant::now());
        ControlFlow::Continue(())
    }

    /// SIGTERM or SIGINT: the loop ends and [`Daemon::shutdown`] follows.
    fn on_signal(&mut self, name: &str) -> ControlFlow<()> {
        info!(signal = name, "shutting down");
        ControlFlow::Break(())
    }

    /// Inotify events: the device-plugins directory's go to
    /// [`Daemon::plugin_dir_event`]; any in the config file's directory
    /// reloads the configuration (once per batch); a tap node deleted in
    /// `/dev` starts a reclaim round (once per batch). A queue overflow
    /// stands for every watch's lost events.
    fn on_fs_events(&mut self, batch: &[FsEvent]) {
        let mut config_touched = false;
        let mut tap_gone = false;
        for ev in batch {
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
                self.kubelet_restarted();
            }
            if to.plugin_dir {
                self.plugin_dir_event(ev);
                if ev.watch_ended() {
                    warn!(dir = %self.opts.plugin_dir().display(), "the device-plugins directory went away; waiting for it to come back");
                    self.plugin_wd = None;
                }
            }
            if to.config {
                if ev.watch_ended() {
                    warn!("the config file's directory went away; live reload stops");
                    self.config_wd = None;
                } else {
                    config_touched = true;
                }
            }
            if to.tap_nodes {
                if ev.watch_ended() {
                    debug!(
                        "the watch of tap nodes ended; lost links are healed at each reclaim interval only"
                    );
                    self.tap_nodes = None;
                } else {
                    tap_gone |= to.overflow || tap_node_deleted(ev);
                }
            }
        }
        if config_touched {
            self.reload_config();
        }
        if tap_gone
            && let Some((_, reclaim)) = &self.tap_nodes
            && reclaim.send(()).is_err()
        {
            self.tap_nodes = None;
        }
    }

    /// Whatever is due at `now`: the socket check (and a new watch of a
    /// device-plugins directory that came back), stream deadlines, and
    /// registrations.
    fn on_timer(&mut self, now: Instant) {
        if now >= self.next_socket_check {
            self.next_socket_check = now + SOCKET_CHECK;
            if self.plugin_wd.is_none() {
                self.plugin_wd = rewatch(&self.fs, &self.opts.plugin_dir());
                if self.plugin_wd.is_some() {
                    self.kubelet_restarted();
                }
            }
            self.check_sockets();
        }
        self.check_stream_deadlines(now);
        self.start_due_registrations();
        // Every registration change happens in a handler or a timer, so
        // the gauge is right after each turn of the loop.
        for p in self.plugins.values() {
            self.ctx
                .metrics
                .set_registered(&p.config().resource_name(), p.registration.is_registered());
        }
    }

    /// Abandons registrations and stops every server at once, removing
    /// our sockets; bounded by [`SHUTDOWN_WAIT`] (plus the socket removals).
    async fn shutdown(self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(wd) = self.plugin_wd {
            self.fs.unwatch(wd);
        }
        let mut stops = Vec::new();
        for (_, p) in self.plugins {
            p.registration.abandon();
            for old in p.stopping {
                old.abort();
            }
            if let Some(s) = p.server {
                stops.push(tokio::spawn(s.stop(true, SHUTDOWN_WAIT)));
            }
        }
        for b in self.background {
            b.abort();
        }
        for s in stops {
            let _ = s.await;
        }
        info!("stopped");
    }
}

/// The watch of `paths`' tap node directory for deleted tap nodes, reported
/// on `tap_gone`; `None` without it (the sender goes, and the reclaim loop
/// runs on its interval only). Where no tap node shows there is nothing to
/// watch, and what that leaves undone, with the mount that would enable it,
/// is said once, here: a warning and an Event on `events`.
fn watch_or_say(
    fs: &DirWatcher,
    paths: &HostPaths,
    events: &EventSink,
    tap_gone: mpsc::UnboundedSender<()>,
) -> Option<(WatchDescriptor, mpsc::UnboundedSender<()>)> {
    match Degraded::of_dev(paths) {
        None => watch_tap_nodes(fs, paths.dev()).map(|wd| (wd, tap_gone)),
        Some(gap) => {
            warn!(reason = %gap, "serving without the host's /dev");
            events.post(NodeEvent::from(&gap));
            None
        }
    }
}

/// Starts the reclaim loop (leaked links, lost links healed, on a tap
/// node's deletion in `paths`' tap node directory at once, as `tap_gone`
/// reports) over the
/// resources published on `configs`, reporting to `observer`.
fn spawn_reclaim(
    opts: &Options,
    ctx: &ServerContext,
    observer: Arc<dyn Observer>,
    configs: watch::Receiver<Vec<ResourceConfig>>,
    paths: HostPaths,
    tap_gone: mpsc::UnboundedReceiver<()>,
) -> JoinHandle<()> {
    let reclaimer = Reclaimer::new(
        Arc::new(*KERNEL),
        opts.pod_resources_socket(),
        opts.reclaim_grace,
        ctx.clock.clone(),
    )
    .with_healing(ctx.assignments.clone(), paths)
    .with_observer(observer)
    .with_inflight(ctx.inflight.clone());
    tokio::spawn(reclaim_loop(
        reclaimer,
        opts.reclaim_interval,
        configs,
        tap_gone,
    ))
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

    #[test]
    fn without_the_hosts_dev_the_start_says_so_once_and_watches_nothing() {
        let (fs, _rx) = DirWatcher::new().unwrap();
        let dev = tempfile::tempdir().unwrap();
        let (tx, _gone) = mpsc::unbounded_channel();
        let (events, mut posted) = EventSink::queue();
        let shown = HostPaths::with_dev(dev.path());
        assert!(watch_or_say(&fs, &shown, &events, tx.clone()).is_some());
        assert!(posted.try_recv().is_err(), "nothing to say");
        let unseen = HostPaths {
            tap_nodes: crate::core::host::TapNodes::Unseen {
                fstype: "tmpfs".into(),
            },
            ..shown
        };
        let (watch, log) = {
            let (guard, log) = crate::testlog::capture();
            let watch = watch_or_say(&fs, &unseen, &events, tx);
            drop(guard);
            (watch, log.text())
        };
        assert!(watch.is_none());
        assert_eq!(
            log.matches("serving without the host's /dev").count(),
            1,
            "{log}"
        );
        let want = format!(
            "mount the host's /dev (hostPath /dev, read-only) at {}",
            dev.path().display()
        );
        assert!(log.contains(&want), "{log}");
        let event = posted.try_recv().expect("an Event");
        assert_eq!(event.reason(), crate::operator::events::HOST_DEV_MISSING);
        let note = event.to_event().note.unwrap();
        assert!(
            note.starts_with("The host's /dev is not mounted at"),
            "{note}"
        );
        assert!(note.contains(&want), "{note}");
        assert!(posted.try_recv().is_err(), "one Event");
    }
}
