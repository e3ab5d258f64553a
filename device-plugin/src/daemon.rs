//! The daemon: keeps one served and registered plugin per resource, in step
//! with the configuration, the node's NICs and the kubelet.
//!
//! One loop owns all plugin state and reacts to:
//! - link snapshots from [`crate::links`] (health, NUMA, auto-discovery);
//! - inotify events in the device-plugins directory (a new `kubelet.sock`
//!   means a restarted kubelet: re-serve where our socket was deleted, and
//!   register again) and in the config file's directory (live reload);
//! - timers (registration retries with backoff, a socket existence check);
//! - SIGTERM/SIGINT (stop serving, remove our sockets, return).

use crate::config::{self, Resolved, ResourceConfig, Resources, Source, Sources};
use crate::devices::device_list;
use crate::discovery::discover;
use crate::error::{Error, Result};
use crate::fswatch::{DirWatcher, FsEvent};
use crate::health::nic_is_healthy;
use crate::links::{Links, spawn_link_watcher};
use crate::metrics::Metrics;
use crate::reclaim::{Reclaimer, reclaim_loop};
use crate::registration::register;
use crate::server::{PluginServer, ResourceState};
use crate::topology::numa_node;
use kubelet_proto::v1beta1::{HEALTHY, KUBELET_SOCKET};
use nix::sys::inotify::WatchDescriptor;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

/// How often the plugin checks that its sockets still exist, in case an
/// inotify event was missed.
const SOCKET_CHECK: Duration = Duration::from_secs(5);
/// First and longest wait between registration attempts.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How long one Register call may take.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Reads the configuration sources named by `opts` and resolves them.
pub fn load_config(opts: &Options) -> Result<(Resolved, Option<String>)> {
    let file = match &opts.config_file {
        Some(p) => Some((p.clone(), std::fs::read_to_string(p).map_err(Error::io(p))?)),
        None => None,
    };
    let file_text = file.as_ref().map(|(_, t)| t.clone());
    let sources = Sources {
        flags: opts.resource_flags.clone(),
        file,
        env: opts.env_config.clone().filter(|s| !s.trim().is_empty()),
    };
    Ok((config::resolve(&sources)?, file_text))
}

struct Plugin {
    state: watch::Sender<ResourceState>,
    server: Option<PluginServer>,
    registered: bool,
    /// Made by auto-discovery (kept, unhealthy, when its NIC vanishes).
    discovered: bool,
    retry_at: Option<Instant>,
    backoff: Duration,
    said_waiting: bool,
    /// Failed registration attempts since the last success.
    failures: u32,
}

impl Plugin {
    fn config(&self) -> ResourceConfig {
        self.state.borrow().config.clone()
    }

    fn want_registration(&mut self, now: Instant) {
        self.registered = false;
        self.retry_at = Some(now);
        self.backoff = RETRY_MIN;
    }
}

struct Daemon {
    opts: Options,
    metrics: Arc<Metrics>,
    plugins: BTreeMap<String, Plugin>,
    resolved: Resolved,
    file_text: Option<String>,
    configs_tx: watch::Sender<Vec<ResourceConfig>>,
}

/// Runs the daemon until SIGTERM or SIGINT. Errors are startup errors
/// (invalid configuration, unusable directories or sockets).
pub async fn run(opts: Options) -> Result<()> {
    let (resolved, file_text) = load_config(&opts)?;
    info!(source = %resolved.source, resources = ?resolved.resources, "configuration loaded");
    let plugin_dir = opts.plugin_dir();
    std::fs::create_dir_all(&plugin_dir).map_err(Error::io(&plugin_dir))?;
    let metrics = Arc::new(Metrics::default());
    let http = match opts.metrics_addr {
        Some(addr) => Some(crate::http::serve(addr, metrics.clone()).await?),
        None => None,
    };
    let mut sigterm = signal(SignalKind::terminate())
        .map_err(|e| Error::Task(format!("SIGTERM handler: {e}")))?;
    let mut sigint =
        signal(SignalKind::interrupt()).map_err(|e| Error::Task(format!("SIGINT handler: {e}")))?;
    let mut links_rx = spawn_link_watcher()?;
    let (fs, mut fs_events) = DirWatcher::new()?;
    let mut plugin_wd = Some(fs.watch_dir(&plugin_dir)?);
    let config_dir = opts.config_file.as_ref().map(|f| match f.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    });
    let config_wd = match &config_dir {
        Some(d) => Some(fs.watch_dir(d)?),
        None => None,
    };

    let (configs_tx, configs_rx) = watch::channel(Vec::new());
    let reclaim = tokio::spawn(reclaim_loop(
        Reclaimer::new(opts.pod_resources_socket(), opts.reclaim_grace),
        opts.reclaim_interval,
        configs_rx,
        metrics.clone(),
    ));
    let mut d = Daemon {
        opts,
        metrics,
        plugins: BTreeMap::new(),
        resolved,
        file_text,
        configs_tx,
    };
    let links = links_rx.borrow_and_update().clone();
    d.reconcile(&links).await;
    d.register_due().await;
    let mut next_socket_check = Instant::now() + SOCKET_CHECK;

    loop {
        let wake = d
            .next_retry()
            .unwrap_or(next_socket_check)
            .min(next_socket_check);
        tokio::select! {
            _ = sigterm.recv() => { info!("SIGTERM: shutting down"); break; }
            _ = sigint.recv() => { info!("SIGINT: shutting down"); break; }
            changed = links_rx.changed() => {
                if changed.is_err() {
                    return Err(Error::Task("the link event thread stopped".into()));
                }
                let links = links_rx.borrow_and_update().clone();
                d.reconcile(&links).await;
            }
            events = fs_events.recv() => {
                let Some(events) = events else {
                    return Err(Error::Task("the inotify thread stopped".into()));
                };
                for ev in events {
                    if Some(ev.wd) == plugin_wd {
                        d.plugin_dir_event(&ev);
                        if ev.watch_ended() {
                            warn!(dir = %d.opts.plugin_dir().display(), "device-plugins directory went away; waiting for it");
                            plugin_wd = None;
                        }
                    } else if Some(ev.wd) == config_wd {
                        if ev.watch_ended() {
                            warn!("the config file's directory went away; live reload stops");
                        } else {
                            let links = links_rx.borrow().clone();
                            d.reload_config(&links).await;
                        }
                    }
                }
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
        let now = Instant::now();
        if now >= next_socket_check {
            next_socket_check = now + SOCKET_CHECK;
            if plugin_wd.is_none() {
                plugin_wd = rewatch(&fs, &d.opts.plugin_dir());
                if plugin_wd.is_some() {
                    d.kubelet_restarted();
                }
            }
            d.check_sockets();
        }
        d.register_due().await;
    }

    reclaim.abort();
    if let Some(h) = http {
        h.abort();
    }
    if let Some(wd) = plugin_wd {
        fs.unwatch(wd);
    }
    d.shutdown().await;
    Ok(())
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
    fn wanted(&self, links: &Links) -> Vec<(ResourceConfig, bool)> {
        match &self.resolved.resources {
            Resources::Static(list) => list.iter().cloned().map(|c| (c, false)).collect(),
            Resources::AutoDiscover => {
                let mut found: Vec<(ResourceConfig, bool)> =
                    discover(links, &self.opts.discover_kinds)
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
    async fn reconcile(&mut self, links: &Links) {
        let wanted = self.wanted(links);
        let gone: Vec<String> = self
            .plugins
            .keys()
            .filter(|n| !wanted.iter().any(|(c, _)| &c.name == *n))
            .cloned()
            .collect();
        for name in gone {
            if let Some(p) = self.plugins.remove(&name) {
                let resource = p.config().resource_name();
                info!(%resource, "resource removed");
                if let Some(s) = p.server {
                    s.stop(true).await;
                }
                self.metrics.resource_removed(&resource);
            }
        }
        let now = Instant::now();
        for (cfg, discovered) in wanted {
            let lower = links.iter().find(|l| l.name == cfg.lower_device);
            let healthy = nic_is_healthy(lower);
            let numa = lower.and_then(|_| numa_node(&self.opts.sysfs, &cfg.lower_device));
            let state = ResourceState {
                devices: device_list(&cfg.name, cfg.capacity, healthy, numa),
                config: cfg.clone(),
            };
            let resource = cfg.resource_name();
            let (nh, nu) = if healthy {
                (cfg.capacity as u64, 0)
            } else {
                (0, cfg.capacity as u64)
            };
            self.metrics.set_devices(&resource, nh, nu);
            match self.plugins.get_mut(&cfg.name) {
                Some(p) => {
                    p.discovered = discovered;
                    let was_healthy = p
                        .state
                        .borrow()
                        .devices
                        .first()
                        .is_some_and(|d| d.health == HEALTHY);
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
                        info!(%resource, old = ?old_cfg, new = ?cfg, "resource configuration changed");
                    }
                    if changed && was_healthy != healthy {
                        let lower = cfg.lower_device.as_str();
                        if healthy {
                            info!(%resource, lower, "lower NIC is up: devices Healthy");
                        } else {
                            warn!(%resource, lower, "lower NIC is down or gone: devices Unhealthy");
                        }
                    }
                }
                None => {
                    info!(%resource, lower = %cfg.lower_device, mode = %cfg.mode, capacity = cfg.capacity, healthy, ?numa, "resource added");
                    let (tx, _) = watch::channel(state);
                    let mut p = Plugin {
                        state: tx,
                        server: None,
                        registered: false,
                        discovered,
                        retry_at: None,
                        backoff: RETRY_MIN,
                        said_waiting: false,
                        failures: 0,
                    };
                    p.want_registration(now);
                    self.plugins.insert(cfg.name.clone(), p);
                }
            }
        }
        let configs: Vec<ResourceConfig> = self.plugins.values().map(|p| p.config()).collect();
        self.configs_tx.send_replace(configs);
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
        } else if ev.is_delete() {
            let now = Instant::now();
            let metrics = self.metrics.clone();
            let dir = self.opts.plugin_dir();
            for p in self.plugins.values_mut() {
                let cfg = p.config();
                if name == OsStr::new(&cfg.socket_name())
                    && p.server.as_ref().is_some_and(|s| !s.socket_is_ours())
                {
                    info!(resource = %cfg.resource_name(), "our socket was deleted; serving again");
                    restart_server(p, &dir, &metrics);
                    p.want_registration(now);
                }
            }
        }
    }

    /// A new kubelet forgot every registration: serve again where our socket
    /// is gone, and register everything.
    fn kubelet_restarted(&mut self) {
        let now = Instant::now();
        self.check_sockets();
        for p in self.plugins.values_mut() {
            p.want_registration(now);
        }
    }

    /// Restarts servers whose socket file is missing or replaced.
    fn check_sockets(&mut self) {
        let now = Instant::now();
        let dir = self.opts.plugin_dir();
        for p in self.plugins.values_mut() {
            let lost = p.server.as_ref().is_some_and(|s| !s.socket_is_ours());
            if lost {
                info!(resource = %p.config().resource_name(), "our socket is gone; serving again");
                restart_server(p, &dir, &self.metrics);
                p.want_registration(now);
            }
        }
    }

    fn next_retry(&self) -> Option<Instant> {
        self.plugins.values().filter_map(|p| p.retry_at).min()
    }

    /// Serves and registers every plugin whose retry time has come.
    async fn register_due(&mut self) {
        let now = Instant::now();
        let dir = self.opts.plugin_dir();
        let kubelet_sock = dir.join(KUBELET_SOCKET);
        for p in self.plugins.values_mut() {
            if p.retry_at.is_none_or(|t| t > now) {
                continue;
            }
            let cfg = p.config();
            let resource = cfg.resource_name();
            if p.server.is_none() {
                restart_server(p, &dir, &self.metrics);
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
            match register(&kubelet_sock, &cfg, REGISTER_TIMEOUT).await {
                Ok(()) => {
                    info!(%resource, endpoint = %cfg.socket_name(), "registered with the kubelet");
                    self.metrics.registration(&resource, true);
                    p.registered = true;
                    p.retry_at = None;
                    p.backoff = RETRY_MIN;
                    p.said_waiting = false;
                    p.failures = 0;
                }
                Err(e) => {
                    self.metrics.registration(&resource, false);
                    let retry_in_ms = p.backoff.as_millis() as u64;
                    // Say it at once, then about once a minute while it goes on.
                    if p.failures % 12 == 0 {
                        warn!(%resource, error = %e, retry_in_ms, failures = p.failures + 1, "registration failed");
                    } else {
                        debug!(%resource, error = %e, retry_in_ms, "registration failed again");
                    }
                    p.failures += 1;
                    p.retry_at = Some(Instant::now() + p.backoff);
                    p.backoff = (p.backoff * 2).min(RETRY_MAX);
                }
            }
        }
    }

    async fn reload_config(&mut self, links: &Links) {
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
        let sources = Sources {
            flags: self.opts.resource_flags.clone(),
            file: Some((path.clone(), text)),
            env: self.opts.env_config.clone(),
        };
        match config::resolve(&sources) {
            Ok(r) if r.source == Source::Flags => {
                info!(file = %path.display(), "config file changed, but --resource flags take precedence; nothing to apply");
            }
            Ok(r) => {
                let before: Vec<String> = self.plugins.keys().cloned().collect();
                info!(file = %path.display(), resources = ?r.resources, "config file changed; applying");
                self.resolved = r;
                self.reconcile(links).await;
                let after: Vec<String> = self.plugins.keys().cloned().collect();
                let added: Vec<_> = after.iter().filter(|n| !before.contains(n)).collect();
                let removed: Vec<_> = before.iter().filter(|n| !after.contains(n)).collect();
                info!(?added, ?removed, "config change applied");
                self.metrics.config_reload(true);
                self.register_due().await;
            }
            Err(e) => {
                error!(error = %e, "config file changed but is invalid; keeping the current configuration");
                self.metrics.config_reload(false);
            }
        }
    }

    async fn shutdown(self) {
        for (_, p) in self.plugins {
            if let Some(s) = p.server {
                s.stop(true).await;
            }
        }
        info!("stopped");
    }
}

fn restart_server(p: &mut Plugin, dir: &Path, metrics: &Arc<Metrics>) {
    let cfg = p.config();
    let path = dir.join(cfg.socket_name());
    // The old server's socket is gone; dropping the handle without stop()
    // would leave its task running, so stop it in the background.
    if let Some(old) = p.server.take() {
        tokio::spawn(old.stop(false));
    }
    match PluginServer::start(&path, p.state.subscribe(), metrics.clone()) {
        Ok(s) => p.server = Some(s),
        Err(e) => error!(resource = %cfg.resource_name(), error = %e, "cannot serve"),
    }
}
