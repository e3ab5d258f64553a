//! One resource's plugin: what the kubelet sees of it (published by the
//! daemon's resources), the server of its socket, and its registration.

use super::registration::Registration;
use crate::config::ResourceConfig;
use crate::kubelet::context::ServerContext;
use crate::kubelet::server::{PluginServer, ResourceState};
use std::path::Path;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::error;

/// How long a replaced server's connections get to finish.
pub(super) const RESTART_WAIT: Duration = Duration::from_secs(2);

/// One resource's plugin, owned by the daemon's kubelet registrations.
pub(super) struct Plugin {
    /// Devices and config as ListAndWatch streams them, kept current by
    /// the daemon's resources.
    pub(super) state: watch::Receiver<ResourceState>,
    /// The server of the plugin's socket; `None` while it cannot serve.
    pub(super) server: Option<PluginServer>,
    /// Stops of replaced servers; the next Register waits for them.
    pub(super) stopping: Vec<JoinHandle<()>>,
    /// Where its registration with the kubelet stands.
    pub(super) registration: Registration,
}

impl Plugin {
    /// A new resource's plugin of `state`, not served yet, to register
    /// at `now`.
    pub(super) fn new(state: watch::Receiver<ResourceState>, now: Instant) -> Self {
        Self {
            state,
            server: None,
            stopping: Vec::new(),
            registration: Registration::new(now),
        }
    }

    /// The resource's configuration.
    pub(super) fn config(&self) -> ResourceConfig {
        self.state.borrow().config.clone()
    }

    /// Serves the plugin anew on its socket in `dir`. The old server (if
    /// any) stops in the background; the next Register waits for it.
    pub(super) fn serve_anew(&mut self, dir: &Path, ctx: &ServerContext) {
        let cfg = self.config();
        let path = dir.join(cfg.socket_name());
        if let Some(old) = self.server.take() {
            self.stopping
                .push(tokio::spawn(old.stop(false, RESTART_WAIT)));
        }
        self.registration.server_replaced();
        match PluginServer::start(&path, self.state.clone(), ctx.clone()) {
            Ok(s) => self.server = Some(s),
            Err(e) => {
                error!(resource = %cfg.resource_name(), error = %e, "cannot serve the plugin socket; trying again later")
            }
        }
    }
}
