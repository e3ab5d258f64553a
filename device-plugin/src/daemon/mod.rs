//! The daemon: keeps one served and registered plugin per resource, in step
//! with the configuration, the node's NICs and the kubelet.
//!
//! One loop ([`run`]) owns all plugin state, in three parts, and never
//! waits on the kubelet. It takes one input at a time (`Inputs::next`) and
//! `Daemon::handle` routes it to the part it is for, and what that part
//! answers to the part it concerns:
//! - the resources (`resources.rs`: the configuration, the node's links,
//!   what the node uses of them itself, each served resource's state as
//!   the kubelet sees it) take link changes from `crate::core::link_table`
//!   (health, NUMA, auto-discovery of the resources they touch, as
//!   `crate::core::wanted` decides), changes of the node's global
//!   addresses and default routes from `crate::core::addressing` and of
//!   its Node's InternalIP from the Node watch
//!   (`operator::node`, started once the configuration needs
//!   it), and config reloads (`reload.rs`), and answer which resources
//!   came and went;
//! - the watches (`watches.rs`: one `DirWatcher` and the socket check's
//!   timer) take inotify events and say what each concerns: the
//!   device-plugins directory (a new `kubelet.sock` means a restarted
//!   kubelet: re-serve where our socket was deleted, and register again),
//!   the config file's directory (live reload) or `/dev` (a deleted tap
//!   node starts a reclaim round at once);
//! - the kubelet registrations (`registrations.rs`: each resource's server
//!   and registration) take the resources that came and went, kubelet
//!   restarts, ListAndWatch streams opening and ending (`StreamEvent`s from
//!   the servers: a registered resource whose stream ended, or that got
//!   none within `registration::STREAM_WAIT` of registering, registers
//!   again, since the kubelet never reopens a stream itself), results of
//!   Register calls (each in its own task, at most one per resource, so a
//!   hung kubelet delays nothing else) and timers (registration retries
//!   with backoff, stream deadlines);
//! - SIGTERM/SIGINT ends the loop (abort registrations, stop serving,
//!   remove our sockets, return).
//!
//! The loop beats its [`Liveness`] after each input (timers included, so an
//! idle loop beats at least every `watches::SOCKET_CHECK`); `/healthz`, served on
//! a thread of its own, reports a loop that stopped beating.
//!
//! Each resource's registration is a state machine of plain transitions
//! (`registration.rs`); `registrations.rs` carries out what it decides.
//!
//! A replaced server is stopped in the background, and the next Register
//! of its resource waits for that stop: kubelets up to 1.36 disconnect the
//! newest client of a resource when an older stream ends, so the old stream
//! must be over before the new registration exists.

mod dra;
mod node_lock;
mod plugin;
mod registration;
mod registrations;
mod reload;
mod resources;
mod uninstall;
mod watches;

use crate::config::ResourceConfig;
use crate::core::addressing::spawn_addressing_watcher;
use crate::core::degraded::Degraded;
use crate::core::host::{HostPaths, SharedHost};
use crate::core::inflight::InFlight;
use crate::core::ledger::AllocationClock;
use crate::core::ledger::Assignments;
use crate::core::link_table::{LinkUpdate, spawn_link_watcher};
use crate::core::nic::discovery::Discovery;
use crate::core::nic::usage::Addressing;
use crate::core::reclaim::{Holding, Reclaimer, reclaim_loop, watch_tap_nodes};
use crate::core::report::Observer;
use crate::error::{Error, Result};
use crate::fswatch::{DirWatcher, FsEvent};
use crate::kubelet::context::{ServerContext, StreamEvent};
use crate::operator::events::{EventSink, NodeEvent};
use crate::operator::liveness::Liveness;
use crate::operator::metrics::Metrics;
use crate::operator::node::{NodeView, NodeWatch};
use crate::operator::observer::MetricsAndEvents;
use crate::operator::owner::Uninstall;
use crate::options::{Front, Options, load_config};
use nix::sys::inotify::WatchDescriptor;
use registrations::{RegistrationDone, Registrations};
use resources::Resources;
use std::ops::ControlFlow;
use std::sync::Arc;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};
use watches::Watches;

/// The kernel the daemon works on: Allocate, reclaim and heal.
const KERNEL: &macvtap_link::Linux = &macvtap_link::Linux;

/// Where the daemon's inputs arrive; [`Inputs::next`] waits for one.
struct Inputs {
    signals: Signals,
    links: mpsc::UnboundedReceiver<LinkUpdate>,
    addressing: mpsc::UnboundedReceiver<Addressing>,
    node: mpsc::UnboundedReceiver<NodeView>,
    fs: mpsc::UnboundedReceiver<Vec<FsEvent>>,
    streams: mpsc::UnboundedReceiver<StreamEvent>,
    registrations: mpsc::UnboundedReceiver<RegistrationDone>,
}

/// SIGTERM and SIGINT, which stop the daemon; taken before anything
/// else, so none is missed from the start.
struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    /// Handles SIGTERM and SIGINT from now on.
    fn new() -> Result<Self> {
        let handle = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| Error::Task(format!("cannot handle {name}: {e}")))
        };
        Ok(Self {
            term: handle(SignalKind::terminate(), "SIGTERM")?,
            int: handle(SignalKind::interrupt(), "SIGINT")?,
        })
    }

    /// Waits for either, and names it.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// One input of the daemon loop; `Daemon::handle` routes each to the part it is for.
enum Input {
    /// SIGTERM or SIGINT, by name.
    Signal(&'static str),
    /// Links that changed, or all of them read again.
    Links(LinkUpdate),
    /// The node's global addresses and default routes, as they are now.
    Addressing(Addressing),
    /// What is known of our Node now.
    Node(NodeView),
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
            sig = self.signals.recv() => Ok(Input::Signal(sig)),
            update = self.links.recv() => update.map(Input::Links).ok_or_else(|| {
                Error::Task("the thread reading link events stopped, so NIC health would go stale".into())
            }),
            addressing = self.addressing.recv() => addressing.map(Input::Addressing).ok_or_else(|| {
                Error::Task("the thread reading address events stopped, so auto-discovery would go stale".into())
            }),
            Some(view) = self.node.recv() => Ok(Input::Node(view)),
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

/// All plugin state, owned by the loop of [`run`]: three parts, and what
/// the loop itself needs.
struct Daemon {
    opts: Options,
    /// What the servers share with the rest of the daemon (the exit needs
    /// its gate, clock and record).
    ctx: ServerContext,
    /// Kubernetes Events on the Node (the exit's).
    events: EventSink,
    /// The configuration, the node's links and the served resources' states.
    resources: Resources,
    /// The inotify watches and the socket check's timer.
    watches: Watches,
    /// Each served resource's server and registration with the kubelet
    /// (the device plugin front).
    registrations: Registrations,
    /// The DRA front, which serves the resources instead under `--front dra`.
    dra: Option<dra::DraPart>,
    /// The reclaim loop, aborted at shutdown.
    tasks: Vec<JoinHandle<()>>,
    /// The loop's heartbeat, which `/healthz` reads.
    liveness: Arc<Liveness>,
    /// The `/metrics` and `/healthz` server, stopped when dropped.
    _http: Option<crate::operator::http::Server>,
    /// Whether our DaemonSet was deleted: an exit then cleans the node.
    uninstall: Uninstall,
    /// The watch of our Node, started once the configuration needs it.
    node_watch: NodeWatch,
}

/// Runs the daemon until SIGTERM or SIGINT, once no other daemon of ours
/// serves the node (`node_lock`). Errors are startup errors (invalid
/// configuration, unusable directories or sockets), or a helper thread
/// that stopped.
pub async fn run(opts: Options) -> Result<()> {
    let mut signals = Signals::new()?;
    // Held to the end of this function: the uninstall clean-up included.
    let _node = match node_lock::take(&opts.plugin_dir(), &mut signals).await? {
        node_lock::Taken::Held(lock) => lock,
        node_lock::Taken::Stopped(sig) => {
            info!(
                signal = sig,
                "stopped while waiting for the other daemon; nothing was served or changed"
            );
            return Ok(());
        }
    };
    let cni_found = uninstall::cni_at_start(&opts);
    let (mut d, mut inputs) = Daemon::start(opts, signals).await?;
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
        resources: d.resources.configs(),
        events: d.events.clone(),
        cni_found,
    };
    d.shutdown().await;
    uninstall::clean_if_uninstalled(exit).await;
    Ok(())
}

impl Daemon {
    /// Sets everything up once the node is ours (`node_lock::take` made
    /// the device-plugins directory): the config watch (before the config
    /// is read, so no edit is lost), the configuration, metrics, Events,
    /// link events, the reclaim loop; then reconciles the plugins with the
    /// links and starts registering.
    async fn start(opts: Options, signals: Signals) -> Result<(Self, Inputs)> {
        let (fs, fs_events) = DirWatcher::new()?;
        let loaded = reload::watch_then_read(&fs, &opts, load_config)?;
        info!(source = %loaded.resolved.source, resources = %loaded.resolved.resources, "configuration loaded");
        if let (Some(file), None) = (&opts.config_file, &loaded.file_text) {
            info!(file = %file.display(), "the config file does not exist (yet); it is applied when it appears");
        }
        let plugin_dir = opts.plugin_dir();
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
        let (links, links_rx) = spawn_link_watcher()?;
        let (addressing, addressing_rx) = spawn_addressing_watcher()?;
        let (node_watch, node_rx) = NodeWatch::new(opts.node_name.clone());
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
        let observer: Arc<dyn Observer> =
            Arc::new(MetricsAndEvents::new(metrics.clone(), events.clone()));
        let (holding_tx, holding) = watch::channel(Holding::Unknown);
        let ctx = ServerContext {
            host: Arc::new(SharedHost::new(KERNEL, paths.clone())),
            observer: observer.clone(),
            streams: streams_tx,
            clock: AllocationClock::default(),
            assignments: Assignments::persisted(&plugin_dir, observer.clone()),
            inflight: InFlight::default(),
            holding,
        };
        let (tap_gone_tx, tap_gone) = mpsc::unbounded_channel();
        let tap_nodes = watch_or_say(&fs, &paths, &events, tap_gone_tx);
        tasks.push(spawn_reclaim(
            &opts,
            &ctx,
            observer.clone(),
            configs_rx,
            paths,
            tap_gone,
            holding_tx,
        ));
        let (reg_tx, reg_rx) = mpsc::unbounded_channel();
        let resources = Resources::new(
            resources::Start {
                resolved: loaded.resolved,
                file_text: loaded.file_text,
                links,
                discovery: Discovery::new(
                    opts.discover_kinds.clone(),
                    opts.discover_include.clone(),
                ),
                addressing,
                configs: configs_tx,
                sysfs: opts.sysfs.clone(),
            },
            metrics.clone(),
            events.clone(),
            observer,
        );
        let watches = Watches::new(
            fs,
            plugin_dir.clone(),
            plugin_wd,
            loaded.config_wd,
            tap_nodes,
        );
        let registrations = Registrations::new(
            ctx.clone(),
            plugin_dir,
            opts.register_timeout,
            reg_tx,
            metrics,
            events.clone(),
        );
        let dra = match opts.front {
            Front::Dra => Some(dra::DraPart::start(&opts, &ctx).await?),
            Front::DevicePlugin => {
                tasks.push(tokio::spawn(say_dra_claims(ctx.holding.clone())));
                None
            }
        };
        let mut d = Daemon {
            opts,
            ctx,
            events,
            resources,
            watches,
            registrations,
            dra,
            tasks,
            liveness,
            _http: http,
            uninstall,
            node_watch,
        };
        let served = d.resources.reconcile();
        d.serve(served);
        d.watch_node_if_needed();
        d.registrations.start_due_registrations();
        let inputs = Inputs {
            signals,
            links: links_rx,
            addressing: addressing_rx,
            node: node_rx,
            fs: fs_events,
            streams: streams_rx,
            registrations: reg_rx,
        };
        Ok((d, inputs))
    }

    /// When the loop must wake at the latest: the earliest registration
    /// retry, stream deadline or socket check.
    fn next_wake(&self) -> Instant {
        let check = self.watches.next_socket_check();
        self.registrations
            .wake_at()
            .map_or(check, |at| at.min(check))
    }

    /// Hands the resources that came and went to the front that serves
    /// them: the DRA front, or the kubelet registrations.
    fn serve(&mut self, served: Vec<resources::Served>) {
        match &self.dra {
            Some(dra) => dra.serve(served),
            None => self.registrations.serve(served),
        }
    }

    /// Routes `input` to the part it is for, and what that part answers to
    /// the part it concerns; then runs the timers (an input can make a
    /// registration due at once). Breaks on a signal.
    fn handle(&mut self, input: Input) -> ControlFlow<()> {
        match input {
            Input::Signal(name) => {
                info!(signal = name, "shutting down");
                return ControlFlow::Break(());
            }
            Input::Links(update) => {
                let served = self.resources.on_links(update);
                self.serve(served);
            }
            Input::Addressing(addressing) => {
                let served = self.resources.on_addressing(addressing);
                self.serve(served);
            }
            Input::Node(view) => {
                let served = self.resources.on_node(&view);
                self.serve(served);
            }
            Input::Fs(batch) => self.on_fs_events(&batch),
            Input::Stream(ev) => self.registrations.on_stream_event(ev),
            Input::Registered(done) => self.registrations.on_registration_done(done),
            Input::Timer => {}
        }
        self.on_timer(Instant::now());
        ControlFlow::Continue(())
    }

    /// Inotify events, each as the watches say: a queue overflow is taken
    /// for a kubelet restart, an event in the device-plugins directory
    /// goes to the registrations; any in the config file's directory
    /// reloads the configuration (once per batch); a tap node deleted in
    /// `/dev` starts a reclaim round (once per batch).
    fn on_fs_events(&mut self, batch: &[FsEvent]) {
        let mut config_touched = false;
        for ev in batch {
            let seen = self.watches.see(ev);
            if seen.overflow {
                self.registrations.kubelet_restarted();
            }
            if seen.plugin_dir {
                self.registrations.plugin_dir_event(ev);
            }
            config_touched |= seen.config;
        }
        if config_touched {
            let served = self.resources.reload_config(&self.opts);
            self.serve(served);
            self.watch_node_if_needed();
        }
        self.watches.tell_reclaim();
    }

    /// Starts the watch of our Node when the configuration needs it (and
    /// it is not started yet).
    fn watch_node_if_needed(&mut self) {
        if self.resources.needs_node() {
            self.node_watch.ensure();
        }
    }

    /// Whatever is due at `now`: the socket check (and a device-plugins
    /// directory that came back taken for a kubelet restart), then the
    /// registrations' timers.
    fn on_timer(&mut self, now: Instant) {
        if let Some(check) = self.watches.socket_check(now) {
            if check.plugin_dir_back {
                self.registrations.kubelet_restarted();
            }
            self.registrations.check_sockets();
        }
        self.registrations.on_timer(now);
    }

    /// Abandons registrations and stops every server at once, removing
    /// our sockets; bounded by `registrations::SHUTDOWN_WAIT` (plus the
    /// socket removals).
    async fn shutdown(self) {
        for t in &self.tasks {
            t.abort();
        }
        let Daemon {
            mut watches,
            registrations,
            resources,
            dra,
            ..
        } = self;
        watches.unwatch_plugin_dir();
        if let Some(dra) = dra {
            dra.stop().await;
        }
        let stops = registrations.stop_all();
        drop(resources);
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

/// Under the device plugin front: says, whenever the set changes, which
/// devices of ours pods still hold through DRA (claims the DRA front
/// prepared before the node switched back), and when none are left. The
/// kubelet unprepares a pod's claims before it finishes the pod, so such a
/// pod stays Terminating once deleted until the DRA front is back.
async fn say_dra_claims(mut holding: watch::Receiver<Holding>) {
    let mut said: std::collections::BTreeSet<String> = Default::default();
    loop {
        let now: std::collections::BTreeSet<String> = match &*holding.borrow_and_update() {
            Holding::Known(held) => held.dra_device_names().iter().cloned().collect(),
            Holding::Unknown | Holding::Unreadable => said.clone(),
        };
        if now != said {
            if now.is_empty() {
                info!("no pod holds a device of ours through DRA any more");
            } else {
                let devices = now.iter().cloned().collect::<Vec<_>>().join(", ");
                warn!(%devices, "pods hold devices of ours through DRA, prepared before this node switched to the device plugin front: \
                    they are listed Unhealthy, and the kubelet cannot unprepare their claims without the DRA front, \
                    so these pods stay Terminating once deleted until DRA mode is back (move them off the node first)");
            }
            said = now;
        }
        if holding.changed().await.is_err() {
            return;
        }
    }
}

/// Starts the reclaim loop (leaked links, lost links healed, on a tap
/// node's deletion in `paths`' tap node directory at once, as `tap_gone`
/// reports) over the resources published on `configs`, reporting to
/// `observer`, saying on `holding` what its rounds learn pods hold.
fn spawn_reclaim(
    opts: &Options,
    ctx: &ServerContext,
    observer: Arc<dyn Observer>,
    configs: watch::Receiver<Vec<ResourceConfig>>,
    paths: HostPaths,
    tap_gone: mpsc::UnboundedReceiver<()>,
    holding: watch::Sender<Holding>,
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
        reclaimer.with_holding(holding),
        opts.reclaim_interval,
        configs,
        tap_gone,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under the device plugin front, devices pods still hold through DRA
    /// are said, and so is the moment none are left.
    #[tokio::test]
    async fn devices_held_through_dra_are_said_until_none_are_left() {
        use crate::core::reclaim::Held;
        let resp = crate::testdata::pod_with_claims(macvtap_link::dra::DRIVER, &["eth1-mvp-1"]);
        let (tx, rx) = watch::channel(Holding::Known(Held::from_response(&resp)));
        let (guard, log) = crate::testlog::capture();
        let drive = async {
            tokio::task::yield_now().await;
            tx.send(Holding::Unreadable).unwrap();
            tokio::task::yield_now().await;
            tx.send(Holding::Known(Held::default())).unwrap();
            drop(tx);
        };
        tokio::join!(say_dra_claims(rx), drive);
        drop(guard);
        let log = log.text();
        assert_eq!(
            log.matches("pods hold devices of ours through DRA").count(),
            1,
            "{log}"
        );
        assert!(log.contains("eth1-mvp-1"), "{log}");
        assert!(
            log.contains("no pod holds a device of ours through DRA any more"),
            "{log}"
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
