//! The daemon's kubelet registrations, one of its three parts: each
//! served resource's plugin (its server and its registration), and what
//! the daemon does about the kubelet: its restarts (a new
//! `kubelet.sock`), our sockets going missing, Register tasks and their
//! outcomes, and the ListAndWatch streams it opens and ends. The decisions
//! are the [`Registration`](super::registration::Registration) state
//! machine's; here they are logged, counted, posted and carried out.

use super::plugin::{Plugin, RESTART_WAIT};
use super::registration::{Done, Lost, Opened, RETRY_MAX, STREAM_WAIT};
use super::resources::Served;
use crate::config::ResourceConfig;
use crate::error::Result;
use crate::fswatch::FsEvent;
use crate::kubelet::context::{ServerContext, StreamEvent};
use crate::kubelet::register::register;
use crate::operator::events::{EventSink, NodeEvent};
use crate::operator::metrics::Metrics;
use kubelet_proto::v1beta1::KUBELET_SOCKET;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How long the servers' connections get to finish at shutdown.
const SHUTDOWN_WAIT: Duration = Duration::from_millis(300);

/// The outcome of one Register task.
pub(super) struct RegistrationDone {
    name: String,
    attempt: u64,
    result: Result<()>,
}

/// Each served resource's plugin with the kubelet: its server and its
/// registration, and the Register tasks under way.
pub(super) struct Registrations {
    /// Each served resource's plugin, by name.
    plugins: BTreeMap<String, Plugin>,
    /// What the servers share with the rest of the daemon.
    ctx: ServerContext,
    /// The device-plugins directory: our sockets and `kubelet.sock`.
    plugin_dir: PathBuf,
    /// How long a Register call may take.
    register_timeout: Duration,
    /// Where Register tasks report.
    done: mpsc::UnboundedSender<RegistrationDone>,
    /// The last Register attempt's number.
    next_attempt: u64,
    /// Stops of removed resources' servers, awaited (briefly) at shutdown.
    background: Vec<JoinHandle<()>>,
    /// Counters: registrations, and whether each resource is registered.
    metrics: Arc<Metrics>,
    /// Kubernetes Events on the Node: registrations failing.
    events: EventSink,
}

impl Registrations {
    /// No plugin yet; servers share `ctx` and serve in `plugin_dir`,
    /// Register calls last at most `register_timeout` and report to
    /// `done`; registrations are counted in `metrics` and their repeated
    /// failures posted on `events`.
    pub(super) fn new(
        ctx: ServerContext,
        plugin_dir: PathBuf,
        register_timeout: Duration,
        done: mpsc::UnboundedSender<RegistrationDone>,
        metrics: Arc<Metrics>,
        events: EventSink,
    ) -> Self {
        Self {
            plugins: BTreeMap::new(),
            ctx,
            plugin_dir,
            register_timeout,
            done,
            next_attempt: 0,
            background: Vec::new(),
            metrics,
            events,
        }
    }

    /// Follows a change of the served resources: a new one gets its
    /// plugin (served and registered when due), a removed one's is
    /// abandoned and its server stopped in the background.
    pub(super) fn serve(&mut self, changes: Vec<Served>) {
        let now = Instant::now();
        for change in changes {
            match change {
                Served::New { name, state } => {
                    self.plugins.insert(name, Plugin::new(state, now));
                }
                Served::Gone { name } => self.remove(&name),
            }
        }
    }

    /// Stops serving and registering resource `name`.
    fn remove(&mut self, name: &str) {
        let Some(p) = self.plugins.remove(name) else {
            return;
        };
        p.registration.abandon();
        if let Some(s) = p.server {
            // Forget stops already done: a long-lived daemon whose config
            // keeps changing must not collect their handles for ever.
            self.background.retain(|h| !h.is_finished());
            self.background
                .push(tokio::spawn(s.stop(true, RESTART_WAIT)));
        }
    }

    /// When the loop must wake for the registrations at the latest: the
    /// earliest registration retry or stream deadline.
    pub(super) fn wake_at(&self) -> Option<Instant> {
        self.plugins
            .values()
            .filter_map(|p| p.registration.wake_at())
            .min()
    }

    /// At shutdown: every registration abandoned and every server stopped
    /// at once, its socket removed; the stops to await, each bounded by
    /// [`SHUTDOWN_WAIT`] (plus the socket's removal).
    pub(super) fn stop_all(self) -> Vec<JoinHandle<()>> {
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
        stops
    }

    /// Whatever is due at `now`: stream deadlines and registrations; then
    /// each resource's registration gauge.
    pub(super) fn on_timer(&mut self, now: Instant) {
        self.check_stream_deadlines(now);
        self.start_due_registrations();
        // Every registration change happens in a handler or a timer, so
        // the gauge is right after each turn of the loop.
        for p in self.plugins.values() {
            self.metrics
                .set_registered(&p.config().resource_name(), p.registration.is_registered());
        }
    }

    /// An inotify event in the device-plugins directory: a new
    /// `kubelet.sock` is a restarted kubelet; a deleted socket of ours may
    /// need serving again.
    pub(super) fn plugin_dir_event(&mut self, ev: &FsEvent) {
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
    pub(super) fn kubelet_restarted(&mut self) {
        let now = Instant::now();
        self.check_sockets();
        for p in self.plugins.values_mut() {
            p.registration.kubelet_restarted(now);
        }
    }

    /// Restarts servers whose socket file is missing or replaced.
    pub(super) fn check_sockets(&mut self) {
        let now = Instant::now();
        let dir = self.plugin_dir.clone();
        for p in self.plugins.values_mut() {
            let lost = p.server.as_ref().is_some_and(|s| !s.socket_is_ours());
            if lost {
                info!(resource = %p.config().resource_name(), "the plugin's socket was deleted or replaced (a kubelet restart removes plugin sockets); serving again");
                p.serve_anew(&dir, &self.ctx);
                p.registration.want(now);
            }
        }
    }

    /// Starts a Register task for every plugin whose registration is due
    /// (serving it first if it is not served). The task first waits for
    /// replaced servers of the resource to stop.
    pub(super) fn start_due_registrations(&mut self) {
        let now = Instant::now();
        let dir = self.plugin_dir.clone();
        let kubelet_sock = dir.join(KUBELET_SOCKET);
        for (name, p) in self.plugins.iter_mut() {
            if !p.registration.is_due(now) {
                continue;
            }
            let cfg = p.config();
            let resource = cfg.resource_name();
            if p.server.is_none() {
                p.serve_anew(&dir, &self.ctx);
                if p.server.is_none() {
                    p.registration.postpone(now + RETRY_MAX);
                    continue;
                }
            }
            if !kubelet_sock.exists() {
                if p.registration.wait_for_kubelet(now + RETRY_MAX) {
                    info!(%resource, socket = %kubelet_sock.display(), "kubelet is not there yet; will register when kubelet.sock appears");
                }
                continue;
            }
            self.next_attempt += 1;
            let attempt = self.next_attempt;
            debug!(%resource, attempt, "registering");
            let stopping = &mut p.stopping;
            p.registration.start(attempt, || {
                spawn_register(
                    std::mem::take(stopping),
                    cfg,
                    name.clone(),
                    attempt,
                    kubelet_sock.clone(),
                    self.register_timeout,
                    self.done.clone(),
                )
            });
        }
    }

    /// Applies the outcome of a Register task, unless it was abandoned.
    pub(super) fn on_registration_done(&mut self, done: RegistrationDone) {
        let Some(p) = self.plugins.get_mut(&done.name) else {
            return;
        };
        let ok = done.result.is_ok();
        let outcome = p
            .registration
            .done(done.attempt, done.result, Instant::now());
        if matches!(outcome, Done::Stale) {
            return;
        }
        let cfg = p.config();
        let resource = cfg.resource_name();
        self.metrics.registration(&resource, ok);
        let Done::Failed {
            error: e,
            delay,
            failures,
            warn,
            event,
        } = outcome
        else {
            info!(%resource, endpoint = %cfg.socket_name(), "registered with the kubelet");
            return;
        };
        let retry_in_ms = delay.as_millis() as u64;
        if warn {
            warn!(%resource, error = %e, retry_in_ms, failures, "registration failed");
        } else {
            debug!(%resource, error = %e, retry_in_ms, failures, "registration failed again");
        }
        if event {
            self.events.post(NodeEvent::RegistrationFailing {
                resource,
                failures,
                error: e.to_string(),
            });
        }
    }

    /// Counts the live ListAndWatch streams of each current server and
    /// registers again when a registered resource has none left.
    pub(super) fn on_stream_event(&mut self, ev: StreamEvent) {
        let now = Instant::now();
        let dir = self.plugin_dir.clone();
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
            match p.registration.stream_opened(now) {
                Opened::Live(streams) => {
                    debug!(%resource, streams, "ListAndWatch stream opened");
                }
                Opened::LateRegistration(streams) => {
                    debug!(%resource, streams, "ListAndWatch stream opened");
                    warn!(%resource, streams, "a second ListAndWatch stream: a registration that timed out was completed late by the kubelet; serving anew and registering once more");
                    p.serve_anew(&dir, &self.ctx);
                }
            }
            return;
        }
        let (streams, lost) = p.registration.stream_ended(now);
        debug!(%resource, streams, "ListAndWatch stream ended");
        if let Some(Lost { lived, retry_in }) = lost {
            info!(%resource, lived_ms = lived.as_millis() as u64, retry_in_ms = retry_in.as_millis() as u64, "the kubelet's ListAndWatch stream ended, so the kubelet counts no devices until the plugin registers again; registering again");
        }
    }

    /// Registers again where the kubelet opened no stream in time.
    pub(super) fn check_stream_deadlines(&mut self, now: Instant) {
        for p in self.plugins.values_mut() {
            if let Some(delay) = p.registration.check_stream_deadline(now) {
                warn!(resource = %p.config().resource_name(), wait_ms = STREAM_WAIT.as_millis() as u64, retry_in_ms = delay.as_millis() as u64, "the kubelet opened no ListAndWatch stream after the registration; registering again");
            }
        }
    }
}

/// Starts Register call `attempt` for `cfg` (resource `name`), which first
/// waits for the resource's replaced servers (`stopping`) to stop, then
/// reports to `done`.
fn spawn_register(
    stopping: Vec<JoinHandle<()>>,
    cfg: ResourceConfig,
    name: String,
    attempt: u64,
    kubelet_sock: PathBuf,
    timeout: Duration,
    done: mpsc::UnboundedSender<RegistrationDone>,
) -> JoinHandle<()> {
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
