//! The daemon: keeps one served and registered plugin per resource, in step
//! with the configuration, the node's NICs and the kubelet.
//!
//! One loop owns all plugin state (the `Daemon` struct) and never waits on
//! the kubelet. It takes one input at a time and hands it to that kind's
//! handler (`on_signal`, `on_links`, `on_fs_events`, `on_stream_event`,
//! `on_registration_done`, `on_timer`). It reacts to:
//! - link snapshots from [`crate::links`] (health, NUMA, auto-discovery);
//! - inotify events in the device-plugins directory (a new `kubelet.sock`
//!   means a restarted kubelet: re-serve where our socket was deleted, and
//!   register again) and in the config file's directory (live reload);
//! - ListAndWatch streams opening and ending ([`StreamEvent`]s from the
//!   servers): a registered resource whose stream ended, or that got none
//!   within [`STREAM_WAIT`] of registering, registers again (the kubelet
//!   never reopens a stream itself);
//! - results of Register calls, each running in its own task (at most one
//!   per resource), so a hung kubelet delays nothing else;
//! - timers (registration retries with backoff, stream deadlines, a socket
//!   existence check);
//! - SIGTERM/SIGINT (abort registrations, stop serving, remove our sockets,
//!   return).
//!
//! A replaced server is stopped in the background, and the next Register
//! of its resource waits for that stop: kubelets up to 1.36 disconnect the
//! newest client of a resource when an older stream ends, so the old stream
//! must be over before the new registration exists.

use crate::config::{self, Resolved, ResourceConfig, Resources, Source, Sources};
use crate::devices::device_list;
use crate::discovery::Discovery;
use crate::error::{Error, Result};
use crate::events::{EventSink, NodeEvent};
use crate::fswatch::{DirWatcher, FsEvent};
use crate::health::{HealthLog, NicHealth, nic_health};
use crate::links::{Links, spawn_link_watcher};
use crate::metrics::Metrics;
use crate::reclaim::{AllocationClock, Assignments, Reclaimer, reclaim_loop};
use crate::registration::register;
use crate::server::{PluginServer, ResourceState, ServerContext, StreamEvent};
use crate::topology::numa_node;
use kubelet_proto::v1beta1::KUBELET_SOCKET;
use nix::sys::inotify::WatchDescriptor;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

/// How often the plugin checks that its sockets still exist, in case an
/// inotify event was missed.
const SOCKET_CHECK: Duration = Duration::from_secs(5);
/// First and longest wait between registration attempts.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How long the kubelet has, after Register returned, to open ListAndWatch
/// (real kubelets open it before Register returns).
pub const STREAM_WAIT: Duration = Duration::from_secs(2);
/// Failed registrations in a row that make a `RegistrationFailing` Event.
const REGISTRATION_EVENT_AFTER: u32 = 3;
/// While registration keeps failing, how often a failure is logged as a
/// warning (and, from the third failure on, posted as an Event); the rest
/// are debug lines.
const REGISTRATION_WARN_EVERY: Duration = Duration::from_secs(60);
/// A stream that lived this long ends the backoff of quick stream losses.
const STABLE_STREAM: Duration = Duration::from_secs(1);
/// How long a replaced server's connections get to finish.
const RESTART_WAIT: Duration = Duration::from_secs(2);
/// How long the servers' connections get to finish at shutdown.
const SHUTDOWN_WAIT: Duration = Duration::from_millis(300);

/// Everything the daemon needs, from flags and environment.
#[derive(Debug, Clone)]
pub struct Options {
    /// The kubelet's root directory (`/var/lib/kubelet`).
    pub kubelet_dir: PathBuf,
    /// `--config FILE`.
    pub config_file: Option<PathBuf>,
    /// `--resource` flags.
    pub resource_flags: Vec<String>,
    /// The value of `DP_MACVTAP_CONF`.
    pub env_config: Option<String>,
    /// Link kinds that auto-discovery treats as NICs besides physical NICs and bonds.
    pub discover_kinds: Vec<String>,
    /// Where to serve `/metrics` and `/healthz`, if anywhere.
    pub metrics_addr: Option<SocketAddr>,
    /// How often to look for leaked links.
    pub reclaim_interval: Duration,
    /// How long a link must look leaked before it is deleted.
    pub reclaim_grace: Duration,
    /// Where sysfs is mounted (`/sys`).
    pub sysfs: PathBuf,
    /// How long one Register call (connect and call) may take.
    pub register_timeout: Duration,
    /// The node's name, for Events on its Node; `None` turns Events off.
    pub node_name: Option<String>,
}

impl Options {
    /// `<kubelet dir>/device-plugins`.
    pub fn plugin_dir(&self) -> PathBuf {
        self.kubelet_dir.join("device-plugins")
    }

    /// `<kubelet dir>/pod-resources/kubelet.sock`.
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.kubelet_dir.join("pod-resources").join(KUBELET_SOCKET)
    }
}

impl Options {
    /// The configuration sources: the flags, the config file's `text` (when
    /// a file is configured) and the environment.
    fn sources(&self, file_text: Option<String>) -> Sources {
        Sources {
            flags: self.resource_flags.clone(),
            file: self.config_file.clone().zip(file_text),
            env: self.env_config.clone().filter(|s| !s.trim().is_empty()),
        }
    }

    /// The directory holding the config file, which is watched for edits.
    fn config_dir(&self) -> Option<PathBuf> {
        self.config_file.as_ref().map(|f| match f.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        })
    }
}

/// Reads the configuration sources named by `opts` and resolves them.
pub fn load_config(opts: &Options) -> Result<(Resolved, Option<String>)> {
    let file_text = match &opts.config_file {
        Some(p) => {
            Some(std::fs::read_to_string(p).map_err(Error::io("reading the config file", p))?)
        }
        None => None,
    };
    let resolved = config::resolve(&opts.sources(file_text.clone()))?;
    Ok((resolved, file_text))
}

/// One resource's plugin: what the kubelet sees of it, its server, and
/// where its registration stands.
struct Plugin {
    state: watch::Sender<ResourceState>,
    server: Option<PluginServer>,
    /// Stops of replaced servers; the next Register waits for them.
    stopping: Vec<JoinHandle<()>>,
    registered: bool,
    /// Made by auto-discovery (kept, unhealthy, when its NIC vanishes).
    discovered: bool,
    retry_at: Option<Instant>,
    backoff: Duration,
    said_waiting: bool,
    /// Failed registration attempts since the last success.
    failures: u32,
    /// When a failed registration was last logged as a warning.
    warned_at: Option<Instant>,
    /// The Register call in flight: its attempt number and task.
    registering: Option<(u64, JoinHandle<()>)>,
    /// Live ListAndWatch streams on the current server.
    streams: usize,
    /// Since when the current server has had a live stream.
    stream_since: Option<Instant>,
    /// After a Register: by when a stream must have opened.
    stream_deadline: Option<Instant>,
    /// Registrations lost in a row soon after they were made.
    losses: u32,
    /// A Register timed out or was abandoned, so the kubelet may still
    /// complete it: a second stream on one server is then a second
    /// registration.
    suspect_duplicates: bool,
}

impl Plugin {
    fn new(state: ResourceState, discovered: bool) -> Self {
        let (tx, _) = watch::channel(state);
        Self {
            state: tx,
            server: None,
            stopping: Vec::new(),
            registered: false,
            discovered,
            retry_at: None,
            backoff: RETRY_MIN,
            said_waiting: false,
            failures: 0,
            warned_at: None,
            registering: None,
            streams: 0,
            stream_since: None,
            stream_deadline: None,
            losses: 0,
            suspect_duplicates: false,
        }
    }

    fn config(&self) -> ResourceConfig {
        self.state.borrow().config.clone()
    }

    /// Registers again as soon as possible, abandoning a Register in flight.
    fn want_registration(&mut self, now: Instant) {
        self.abandon_registration();
        self.registered = false;
        self.stream_deadline = None;
        self.retry_at = Some(now);
        self.backoff = RETRY_MIN;
    }

    fn abandon_registration(&mut self) {
        if let Some((_, task)) = self.registering.take() {
            task.abort();
            self.suspect_duplicates = true;
        }
    }

    /// A Register call returned: registered, waiting for the kubelet's
    /// ListAndWatch stream unless it is already open.
    fn registered(&mut self, now: Instant) {
        self.registered = true;
        self.retry_at = None;
        self.backoff = RETRY_MIN;
        self.said_waiting = false;
        self.failures = 0;
        self.warned_at = None;
        if self.streams == 0 {
            self.stream_deadline = Some(now + STREAM_WAIT);
        }
    }

    /// A Register call failed: retry after the backoff, which doubles up to
    /// [`RETRY_MAX`]. Returns the wait before the retry, and whether this
    /// failure is worth a warning (the first, then one per
    /// [`REGISTRATION_WARN_EVERY`] while it goes on).
    fn registration_failed(&mut self, now: Instant) -> (Duration, bool) {
        self.failures += 1;
        let warn = self
            .warned_at
            .is_none_or(|t| now.duration_since(t) >= REGISTRATION_WARN_EVERY);
        if warn {
            self.warned_at = Some(now);
        }
        let delay = self.backoff;
        self.retry_at = Some(now + delay);
        self.backoff = (self.backoff * 2).min(RETRY_MAX);
        (delay, warn)
    }

    /// The registration is gone (its stream ended, or never opened):
    /// register again, at once the first time, with backoff when it keeps
    /// happening soon after registering.
    fn registration_lost(&mut self, now: Instant) -> Duration {
        if self
            .stream_since
            .is_some_and(|t| now.duration_since(t) >= STABLE_STREAM)
        {
            self.losses = 0;
        }
        let delay = if self.losses == 0 {
            Duration::ZERO
        } else {
            (RETRY_MIN * 2u32.saturating_pow(self.losses - 1)).min(RETRY_MAX)
        };
        self.losses = self.losses.saturating_add(1);
        self.registered = false;
        self.stream_since = None;
        self.stream_deadline = None;
        self.retry_at = Some(now + delay);
        self.backoff = RETRY_MIN;
        delay
    }
}

/// The outcome of one Register task.
struct RegistrationDone {
    name: String,
    attempt: u64,
    result: Result<()>,
}

/// Where the daemon's inputs arrive; [`Inputs::next`] waits for one.
struct Inputs {
    sigterm: Signal,
    sigint: Signal,
    links: watch::Receiver<Links>,
    fs: mpsc::UnboundedReceiver<Vec<FsEvent>>,
    streams: mpsc::UnboundedReceiver<StreamEvent>,
    registrations: mpsc::UnboundedReceiver<RegistrationDone>,
}

/// One input of the daemon loop; each kind has its handler on [`Daemon`].
enum Input {
    /// SIGTERM or SIGINT, by name.
    Signal(&'static str),
    /// A new snapshot of the node's links.
    Links(Links),
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
            changed = self.links.changed() => match changed {
                Ok(()) => Ok(Input::Links(self.links.borrow_and_update().clone())),
                Err(_) => Err(Error::Task(
                    "the thread reading link events stopped, so NIC health would go stale".into(),
                )),
            },
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
    /// The latest snapshot of the node's links.
    links: Links,
    configs_tx: watch::Sender<Vec<ResourceConfig>>,
    registrations: mpsc::UnboundedSender<RegistrationDone>,
    next_attempt: u64,
    /// Stops of removed resources' servers, awaited (briefly) at shutdown.
    background: Vec<JoinHandle<()>>,
    /// Auto-discovery, which logs each link it leaves out once.
    discovery: Discovery,
    /// Each resource's last NIC health, to log and count its changes.
    health: HealthLog,
    /// The inotify instance of the device-plugins and config directories.
    fs: DirWatcher,
    /// The device-plugins directory's watch; `None` while it is gone.
    plugin_wd: Option<WatchDescriptor>,
    /// The config file directory's watch, if there is a config file.
    config_wd: Option<WatchDescriptor>,
    /// When the sockets are next checked.
    next_socket_check: Instant,
    /// The reclaim loop and the metrics server, aborted at shutdown.
    tasks: Vec<JoinHandle<()>>,
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
    }
    d.shutdown().await;
    Ok(())
}

impl Daemon {
    /// Sets everything up: the config watch (before the config is read, so
    /// no edit is lost), the configuration, the device-plugins directory,
    /// metrics, Events, signals, link events, the reclaim loop; then
    /// reconciles the plugins with the links and starts registering.
    async fn start(opts: Options) -> Result<(Self, Inputs)> {
        let (fs, fs_events) = DirWatcher::new()?;
        let config_wd = match opts.config_dir() {
            Some(d) => Some(fs.watch_dir(&d)?),
            None => None,
        };
        let (resolved, file_text) = load_config(&opts)?;
        info!(source = %resolved.source, resources = %resolved.resources, "configuration loaded");
        let plugin_dir = opts.plugin_dir();
        std::fs::create_dir_all(&plugin_dir).map_err(Error::io(
            "creating the device-plugins directory",
            &plugin_dir,
        ))?;
        let metrics = Arc::new(Metrics::default());
        let events = EventSink::from_environment(opts.node_name.as_deref()).await;
        let mut tasks = Vec::new();
        if let Some(addr) = opts.metrics_addr {
            tasks.push(crate::http::serve(addr, metrics.clone()).await?);
        }
        let sigterm = signal(SignalKind::terminate())
            .map_err(|e| Error::Task(format!("cannot handle SIGTERM: {e}")))?;
        let sigint = signal(SignalKind::interrupt())
            .map_err(|e| Error::Task(format!("cannot handle SIGINT: {e}")))?;
        let mut links_rx = spawn_link_watcher()?;
        let plugin_wd = Some(fs.watch_dir(&plugin_dir)?);

        let (configs_tx, configs_rx) = watch::channel(Vec::new());
        let clock = AllocationClock::default();
        let assignments = Assignments::default();
        tasks.push(spawn_reclaim(
            &opts,
            &clock,
            &assignments,
            &events,
            &metrics,
            configs_rx,
        ));
        let (streams_tx, streams_rx) = mpsc::unbounded_channel();
        let (reg_tx, reg_rx) = mpsc::unbounded_channel();
        let links = links_rx.borrow_and_update().clone();
        let discovery = Discovery::new(opts.discover_kinds.clone());
        let mut d = Daemon {
            opts,
            ctx: ServerContext {
                metrics,
                events,
                streams: streams_tx,
                clock,
                assignments,
            },
            plugins: BTreeMap::new(),
            resolved,
            file_text,
            links,
            configs_tx,
            registrations: reg_tx,
            next_attempt: 0,
            background: Vec::new(),
            discovery,
            health: HealthLog::default(),
            fs,
            plugin_wd,
            config_wd,
            next_socket_check: Instant::now() + SOCKET_CHECK,
            tasks,
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
            .flat_map(|p| [p.retry_at, p.stream_deadline])
            .flatten()
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

    /// A new link snapshot: health, NUMA and auto-discovered resources follow it.
    fn on_links(&mut self, links: Links) {
        self.links = links;
        self.reconcile();
    }

    /// Inotify events: the device-plugins directory's go to
    /// [`Daemon::plugin_dir_event`]; any in the config file's directory
    /// reloads the configuration (once per batch).
    fn on_fs_events(&mut self, batch: &[FsEvent]) {
        let mut config_touched = false;
        for ev in batch {
            if self.plugin_wd.is_some_and(|wd| wd == ev.wd) {
                self.plugin_dir_event(ev);
                if ev.watch_ended() {
                    warn!(dir = %self.opts.plugin_dir().display(), "the device-plugins directory went away; waiting for it to come back");
                    self.plugin_wd = None;
                }
            } else if self.config_wd.is_some_and(|wd| wd == ev.wd) {
                if ev.watch_ended() {
                    warn!("the config file's directory went away; live reload stops");
                    self.config_wd = None;
                } else {
                    config_touched = true;
                }
            }
        }
        if config_touched {
            self.reload_config();
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
    }
}

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

impl Daemon {
    /// The resources wanted now, each with whether auto-discovery made it.
    fn wanted(&self) -> Vec<(ResourceConfig, bool)> {
        match &self.resolved.resources {
            Resources::Static(list) => list.iter().cloned().map(|c| (c, false)).collect(),
            Resources::AutoDiscover => {
                let mut found: Vec<(ResourceConfig, bool)> = self
                    .discovery
                    .discover(&self.links)
                    .into_iter()
                    .map(|c| (c, true))
                    .collect();
                // A discovered NIC that vanished keeps its resource, unhealthy.
                for (name, p) in &self.plugins {
                    if p.discovered && !found.iter().any(|(c, _)| &c.name == name) {
                        found.push((p.config(), true));
                    }
                }
                found
            }
        }
    }

    /// Brings the plugins in line with the configuration and the links.
    fn reconcile(&mut self) {
        let wanted = self.wanted();
        let gone: Vec<String> = self
            .plugins
            .keys()
            .filter(|n| !wanted.iter().any(|(c, _)| &c.name == *n))
            .cloned()
            .collect();
        for name in gone {
            self.remove_plugin(&name);
        }
        let now = Instant::now();
        for (cfg, discovered) in wanted {
            self.apply_resource(cfg, discovered, now);
        }
        let configs: Vec<ResourceConfig> = self.plugins.values().map(|p| p.config()).collect();
        self.configs_tx.send_replace(configs);
    }

    /// Stops serving a resource that is no longer wanted.
    fn remove_plugin(&mut self, name: &str) {
        let Some(mut p) = self.plugins.remove(name) else {
            return;
        };
        let resource = p.config().resource_name();
        info!(%resource, "resource removed");
        p.abandon_registration();
        if let Some(s) = p.server.take() {
            // Forget stops already done: a long-lived daemon whose config
            // keeps changing must not collect their handles for ever.
            self.background.retain(|h| !h.is_finished());
            self.background
                .push(tokio::spawn(s.stop(true, RESTART_WAIT)));
        }
        self.ctx.metrics.resource_removed(&resource);
        self.health.forget(&resource);
    }

    /// Publishes a wanted resource's devices, health and NUMA node, adding
    /// its plugin if it is new.
    fn apply_resource(&mut self, cfg: ResourceConfig, discovered: bool, now: Instant) {
        let links = self.links.clone();
        let lower = links.iter().find(|l| l.name == cfg.lower_device);
        let health = nic_health(&cfg.lower_device, &links);
        let healthy = health.is_healthy();
        let numa = lower.and_then(|_| numa_node(&self.opts.sysfs, &cfg.lower_device));
        let state = ResourceState {
            devices: device_list(&cfg.name, cfg.capacity, healthy, numa),
            config: cfg.clone(),
        };
        let resource = cfg.resource_name();
        self.health_changed(&cfg, &health);
        let (nh, nu) = if healthy {
            (cfg.capacity as u64, 0)
        } else {
            (0, cfg.capacity as u64)
        };
        self.ctx.metrics.set_devices(&resource, nh, nu);
        match self.plugins.get_mut(&cfg.name) {
            Some(p) => {
                p.discovered = discovered;
                let old_cfg = p.config();
                let changed = p.state.send_if_modified(|cur| {
                    if *cur == state {
                        false
                    } else {
                        *cur = state;
                        true
                    }
                });
                if changed && old_cfg != cfg {
                    info!(%resource, old = %old_cfg, new = %cfg, "resource configuration changed");
                }
            }
            None => {
                let numa = numa.map_or_else(|| "none".to_string(), |n| n.to_string());
                info!(%resource, lower = %cfg.lower_device, mode = %cfg.mode, capacity = cfg.capacity, healthy, %numa, "resource added");
                let mut p = Plugin::new(state, discovered);
                p.want_registration(now);
                self.plugins.insert(cfg.name.clone(), p);
            }
        }
    }

    /// Logs, counts and posts an Event for a change of a resource's NIC health.
    fn health_changed(&mut self, cfg: &ResourceConfig, health: &NicHealth) {
        let resource = cfg.resource_name();
        if !self.health.update(&resource, health, &self.ctx.metrics) {
            return;
        }
        let (nic, devices) = (cfg.lower_device.clone(), cfg.capacity);
        self.ctx.events.post(match health {
            NicHealth::Healthy => NodeEvent::NicUp {
                resource,
                nic,
                devices,
            },
            NicHealth::Enslaved(_) => NodeEvent::NicEnslaved {
                resource,
                devices,
                why: health.to_string(),
            },
            _ => NodeEvent::NicDown {
                resource,
                nic,
                devices,
            },
        });
    }

    fn plugin_dir_event(&mut self, ev: &FsEvent) {
        if ev.overflowed() {
            warn!("inotify queue overflowed; checking sockets and registering again");
            self.kubelet_restarted();
            return;
        }
        let Some(name) = ev.name.as_deref() else {
            return;
        };
        if name == OsStr::new(KUBELET_SOCKET) && ev.is_create() {
            info!("kubelet.sock created: the kubelet (re)started; registering again");
            self.kubelet_restarted();
        } else if ev.is_delete()
            && self
                .plugins
                .values()
                .any(|p| name == OsStr::new(&p.config().socket_name()))
        {
            self.check_sockets();
        }
    }

    /// A new kubelet forgot every registration: serve again where our socket
    /// is gone, and register everything.
    fn kubelet_restarted(&mut self) {
        let now = Instant::now();
        self.check_sockets();
        for p in self.plugins.values_mut() {
            p.want_registration(now);
            // The old kubelet's pending registrations died with it.
            p.suspect_duplicates = false;
        }
    }

    /// Restarts servers whose socket file is missing or replaced.
    fn check_sockets(&mut self) {
        let now = Instant::now();
        let dir = self.opts.plugin_dir();
        for p in self.plugins.values_mut() {
            let lost = p.server.as_ref().is_some_and(|s| !s.socket_is_ours());
            if lost {
                info!(resource = %p.config().resource_name(), "the plugin's socket was deleted or replaced (a kubelet restart removes plugin sockets); serving again");
                restart_server(p, &dir, &self.ctx);
                p.want_registration(now);
            }
        }
    }

    /// Starts a Register task for every plugin whose retry time has come and
    /// that has none in flight. The task first waits for replaced servers
    /// of the resource to stop.
    fn start_due_registrations(&mut self) {
        let now = Instant::now();
        let dir = self.opts.plugin_dir();
        let kubelet_sock = dir.join(KUBELET_SOCKET);
        for (name, p) in self.plugins.iter_mut() {
            if p.registering.is_some() || p.retry_at.is_none_or(|t| t > now) {
                continue;
            }
            let cfg = p.config();
            let resource = cfg.resource_name();
            if p.server.is_none() {
                restart_server(p, &dir, &self.ctx);
                if p.server.is_none() {
                    p.retry_at = Some(now + RETRY_MAX);
                    continue;
                }
            }
            if !kubelet_sock.exists() {
                if !p.said_waiting {
                    info!(%resource, socket = %kubelet_sock.display(), "kubelet is not there yet; will register when kubelet.sock appears");
                    p.said_waiting = true;
                }
                p.retry_at = Some(now + RETRY_MAX);
                continue;
            }
            p.retry_at = None;
            self.next_attempt += 1;
            let attempt = self.next_attempt;
            debug!(%resource, attempt, "registering");
            let task = spawn_register(
                p,
                name.clone(),
                attempt,
                kubelet_sock.clone(),
                self.opts.register_timeout,
                self.registrations.clone(),
            );
            p.registering = Some((attempt, task));
        }
    }

    /// Applies the outcome of a Register task, unless it was abandoned.
    fn on_registration_done(&mut self, done: RegistrationDone) {
        let Some(p) = self.plugins.get_mut(&done.name) else {
            return;
        };
        if p.registering.as_ref().map(|(a, _)| *a) != Some(done.attempt) {
            return;
        }
        p.registering = None;
        let cfg = p.config();
        let resource = cfg.resource_name();
        let now = Instant::now();
        self.ctx
            .metrics
            .registration(&resource, done.result.is_ok());
        let e = match done.result {
            Ok(()) => {
                info!(%resource, endpoint = %cfg.socket_name(), "registered with the kubelet");
                p.registered(now);
                return;
            }
            Err(e) => e,
        };
        if matches!(&e, Error::Grpc { status, .. } if status.code() == tonic::Code::DeadlineExceeded)
        {
            // The kubelet may still complete this one.
            p.suspect_duplicates = true;
        }
        let (delay, warn) = p.registration_failed(now);
        let (failures, retry_in_ms) = (p.failures, delay.as_millis() as u64);
        if warn {
            warn!(%resource, error = %e, retry_in_ms, failures, "registration failed");
        } else {
            debug!(%resource, error = %e, retry_in_ms, failures, "registration failed again");
        }
        // Repeatedly failing: an Event at the third failure in a row, then
        // with each warning.
        if failures == REGISTRATION_EVENT_AFTER || (warn && failures > REGISTRATION_EVENT_AFTER) {
            self.ctx.events.post(NodeEvent::RegistrationFailing {
                resource,
                failures,
                error: e.to_string(),
            });
        }
    }

    /// Counts the live ListAndWatch streams of each current server and
    /// registers again when a registered resource has none left.
    fn on_stream_event(&mut self, ev: StreamEvent) {
        let now = Instant::now();
        let dir = self.opts.plugin_dir();
        let Some(p) = self
            .plugins
            .values_mut()
            .find(|p| p.server.as_ref().is_some_and(|s| s.id() == ev.server))
        else {
            // A replaced or removed server.
            return;
        };
        let resource = p.config().resource_name();
        if ev.opened {
            p.streams += 1;
            p.stream_deadline = None;
            if p.streams == 1 {
                p.stream_since = Some(now);
            }
            debug!(%resource, streams = p.streams, "ListAndWatch stream opened");
            if p.streams > 1 && p.suspect_duplicates {
                warn!(%resource, streams = p.streams, "a second ListAndWatch stream: a registration that timed out was completed late by the kubelet; serving anew and registering once more");
                restart_server(p, &dir, &self.ctx);
                // Wanting a registration abandons the pending one, which
                // marks duplicates as suspect again: clear it after.
                p.want_registration(now);
                p.suspect_duplicates = false;
            }
            return;
        }
        p.streams = p.streams.saturating_sub(1);
        debug!(%resource, streams = p.streams, "ListAndWatch stream ended");
        if p.streams == 0 && p.registered && p.registering.is_none() {
            let lived_ms = p
                .stream_since
                .map_or(0, |t| now.duration_since(t).as_millis() as u64);
            let delay = p.registration_lost(now);
            info!(%resource, lived_ms, retry_in_ms = delay.as_millis() as u64, "the kubelet's ListAndWatch stream ended, so the kubelet counts no devices until the plugin registers again; registering again");
        }
    }

    /// Registers again where the kubelet opened no stream in time.
    fn check_stream_deadlines(&mut self, now: Instant) {
        for p in self.plugins.values_mut() {
            if p.stream_deadline.is_some_and(|t| t <= now) && p.streams == 0 {
                let delay = p.registration_lost(now);
                warn!(resource = %p.config().resource_name(), wait_ms = STREAM_WAIT.as_millis() as u64, retry_in_ms = delay.as_millis() as u64, "the kubelet opened no ListAndWatch stream after the registration; registering again");
            }
        }
    }

    fn reload_config(&mut self) {
        let Some(path) = self.opts.config_file.clone() else {
            return;
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                debug!(file = %path.display(), error = %e, "config file not readable right now; keeping the current configuration");
                return;
            }
        };
        if self.file_text.as_deref() == Some(text.as_str()) {
            return;
        }
        self.file_text = Some(text.clone());
        match config::resolve(&self.opts.sources(Some(text))) {
            Ok(r) if r.source == Source::Flags => {
                info!(file = %path.display(), "config file changed, but --resource flags take precedence; nothing to apply");
            }
            Ok(r) => {
                info!(file = %path.display(), resources = %r.resources, "config file changed; applying");
                self.apply_config(r);
                self.ctx.metrics.config_reload(true);
            }
            Err(e) => {
                error!(error = %e, "config file changed but is invalid; keeping the current configuration");
                self.ctx.metrics.config_reload(false);
            }
        }
    }

    /// Serves what `resolved` asks for now, and logs and posts Events for
    /// the resources that came and went.
    fn apply_config(&mut self, resolved: Resolved) {
        let before: Vec<String> = self.plugins.keys().cloned().collect();
        self.resolved = resolved;
        self.reconcile();
        let after: Vec<String> = self.plugins.keys().cloned().collect();
        let added: Vec<_> = after.iter().filter(|n| !before.contains(n)).collect();
        let removed: Vec<_> = before.iter().filter(|n| !after.contains(n)).collect();
        info!(
            added = %names(&added),
            removed = %names(&removed),
            "config change applied"
        );
        for (_, p) in self.plugins.iter().filter(|(n, _)| added.contains(n)) {
            let cfg = p.config();
            self.ctx.events.post(NodeEvent::ResourceAdded {
                resource: cfg.resource_name(),
                nic: cfg.lower_device.clone(),
                devices: cfg.capacity,
            });
        }
        for name in removed {
            self.ctx.events.post(NodeEvent::ResourceRemoved {
                resource: format!("{}/{name}", macvtap_link::RESOURCE_PREFIX),
            });
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
        for (_, mut p) in self.plugins {
            p.abandon_registration();
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

/// Starts the reclaim loop (leaked links, lost links healed, on a tap
/// node's deletion at once) over the resources published on `configs`.
fn spawn_reclaim(
    opts: &Options,
    clock: &AllocationClock,
    assignments: &Assignments,
    events: &EventSink,
    metrics: &Arc<Metrics>,
    configs: watch::Receiver<Vec<ResourceConfig>>,
) -> JoinHandle<()> {
    let dev_dir = PathBuf::from(crate::allocate::DEV_DIR);
    let tap_gone = watch_tap_nodes(&dev_dir);
    let reclaimer = Reclaimer::new(
        opts.pod_resources_socket(),
        opts.reclaim_grace,
        clock.clone(),
    )
    .with_healing(assignments.clone(), dev_dir)
    .with_events(events.clone());
    tokio::spawn(reclaim_loop(
        reclaimer,
        opts.reclaim_interval,
        configs,
        metrics.clone(),
        tap_gone,
    ))
}

/// Starts a Register task for `p` (resource `name`), which first waits for
/// the resource's replaced servers to stop, then reports to `done`.
fn spawn_register(
    p: &mut Plugin,
    name: String,
    attempt: u64,
    kubelet_sock: PathBuf,
    timeout: Duration,
    done: mpsc::UnboundedSender<RegistrationDone>,
) -> JoinHandle<()> {
    let stopping = std::mem::take(&mut p.stopping);
    let cfg = p.config();
    tokio::spawn(async move {
        for old in stopping {
            let _ = old.await;
        }
        let result = register(&kubelet_sock, &cfg, timeout).await;
        let _ = done.send(RegistrationDone {
            name,
            attempt,
            result,
        });
    })
}

/// Resource names for a log line: `a, b`, or `none`.
fn names(list: &[&String]) -> String {
    if list.is_empty() {
        "none".into()
    } else {
        list.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Serves the plugin anew on its socket. The old server (if any) stops in
/// the background; the next Register waits for it.
fn restart_server(p: &mut Plugin, dir: &Path, ctx: &ServerContext) {
    let cfg = p.config();
    let path = dir.join(cfg.socket_name());
    if let Some(old) = p.server.take() {
        p.stopping.push(tokio::spawn(old.stop(false, RESTART_WAIT)));
    }
    p.streams = 0;
    p.stream_since = None;
    p.stream_deadline = None;
    match PluginServer::start(&path, p.state.subscribe(), ctx.clone()) {
        Ok(s) => p.server = Some(s),
        Err(e) => {
            error!(resource = %cfg.resource_name(), error = %e, "cannot serve the plugin socket; trying again later")
        }
    }
}

/// Reports each deletion of a `tap*` node in `dev_dir` (a macvtap destroyed
/// in any namespace), so that a lost link is healed at once rather than at
/// the next reclaim interval. Without the watch, healing still runs every
/// interval; that is logged once.
fn watch_tap_nodes(dev_dir: &Path) -> mpsc::UnboundedReceiver<()> {
    let (tx, rx) = mpsc::unbounded_channel();
    let watcher = DirWatcher::new().and_then(|(w, events)| {
        let wd = w.watch_dir(dev_dir)?;
        Ok((w, wd, events))
    });
    match watcher {
        Ok((w, _wd, mut events)) => {
            tokio::spawn(async move {
                // The watcher lives as long as this task.
                let _w = w;
                while let Some(batch) = events.recv().await {
                    let gone = batch.iter().any(|e| {
                        e.mask.contains(nix::sys::inotify::AddWatchFlags::IN_DELETE)
                            && e.name
                                .as_ref()
                                .and_then(|n| n.to_str())
                                .is_some_and(|n| n.starts_with("tap"))
                    });
                    if gone && tx.send(()).is_err() {
                        return;
                    }
                }
            });
        }
        Err(e) => {
            warn!(dir = %dev_dir.display(), error = %e,
                "cannot watch tap nodes; lost links are healed at each reclaim interval only");
        }
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin() -> Plugin {
        let config = ResourceConfig::for_nic("eth0");
        Plugin::new(
            ResourceState {
                devices: Vec::new(),
                config,
            },
            false,
        )
    }

    #[test]
    fn a_failing_registration_warns_at_once_then_once_a_period_with_backoff() {
        let mut p = plugin();
        let t0 = Instant::now();
        assert_eq!(p.registration_failed(t0), (RETRY_MIN, true));
        assert_eq!(
            p.registration_failed(t0 + RETRY_MIN),
            (RETRY_MIN * 2, false)
        );
        // Failures every RETRY_MAX until just before the period is over.
        let mut now = t0 + RETRY_MIN;
        let mut last = Duration::ZERO;
        while now + RETRY_MAX < t0 + REGISTRATION_WARN_EVERY {
            now += RETRY_MAX;
            let (delay, warned) = p.registration_failed(now);
            assert!(!warned);
            last = delay;
        }
        assert_eq!(last, RETRY_MAX, "the backoff stops at RETRY_MAX");
        let (_, warned) = p.registration_failed(t0 + REGISTRATION_WARN_EVERY);
        assert!(warned, "a warning again after REGISTRATION_WARN_EVERY");
        assert!(!p.registration_failed(t0 + REGISTRATION_WARN_EVERY).1);
        // A success starts over: the next failure warns at once.
        p.registered(t0 + REGISTRATION_WARN_EVERY);
        assert_eq!(p.failures, 0);
        assert_eq!(
            p.registration_failed(t0 + REGISTRATION_WARN_EVERY),
            (RETRY_MIN, true)
        );
    }

    #[test]
    fn quick_losses_back_off_and_a_stable_stream_resets_them() {
        let mut p = plugin();
        let t0 = Instant::now();
        assert_eq!(p.registration_lost(t0), Duration::ZERO);
        assert_eq!(p.registration_lost(t0), RETRY_MIN);
        assert_eq!(p.registration_lost(t0), RETRY_MIN * 2);
        p.stream_since = Some(t0);
        assert_eq!(p.registration_lost(t0 + STABLE_STREAM), Duration::ZERO);
    }
}
