//! The `DevicePlugin` gRPC service of one resource, served on its unix socket.
//!
//! The service only forwards: options and ListAndWatch answers come from the
//! resource's snapshot in a `watch` channel (every message is the full list),
//! Allocate is answered by [`allocate::answer`]. Each
//! ListAndWatch stream that opens or ends is reported to the daemon as a
//! [`StreamEvent`], and each Allocate restarts its devices' leak clocks.

use crate::config::ResourceConfig;
use crate::core::reclaim::Holding;
use crate::error::{Error, Result};
use crate::kubelet::allocate;
use crate::kubelet::context::{ServerContext, StreamEvent};
use kubelet_proto::transport::{Connections, bind_unix, error_chain, serve_unix};
use kubelet_proto::v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use kubelet_proto::v1beta1::{
    AllocateRequest, AllocateResponse, Device, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, UNHEALTHY,
};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

static NEXT_SERVER_ID: AtomicU64 = AtomicU64::new(1);

/// What the kubelet sees of one resource, kept current by the daemon.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ResourceState {
    /// The resource's configuration (Allocate reads mode, NIC and capacity here).
    pub config: ResourceConfig,
    /// The device list ListAndWatch sends.
    pub devices: Vec<Device>,
}

/// The options this plugin registers with and answers: neither
/// PreStartContainer nor GetPreferredAllocation is needed.
pub(crate) fn plugin_options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: false,
    }
}

/// The ListAndWatch message for a snapshot, in which every device that
/// `holding` says a pod holds through DRA is unhealthy.
pub(crate) fn list_and_watch_response(
    state: &ResourceState,
    holding: &Holding,
) -> ListAndWatchResponse {
    let dra_held = match holding {
        Holding::Known(held) => held.dra_ids(std::slice::from_ref(&state.config)),
        Holding::Unknown | Holding::Unreadable => Default::default(),
    };
    let mut devices = state.devices.clone();
    for d in &mut devices {
        if dra_held.contains(&d.id) {
            d.health = UNHEALTHY.to_string();
        }
    }
    ListAndWatchResponse { devices }
}

/// The gRPC service of one resource.
#[derive(Debug, Clone)]
pub(crate) struct PluginService {
    id: u64,
    state: watch::Receiver<ResourceState>,
    stop: watch::Receiver<bool>,
    ctx: ServerContext,
}

impl PluginService {
    /// A service of server `id` answering from `state`; its streams end
    /// when `stop` turns true.
    pub(crate) fn new(
        id: u64,
        state: watch::Receiver<ResourceState>,
        stop: watch::Receiver<bool>,
        ctx: ServerContext,
    ) -> Self {
        Self {
            id,
            state,
            stop,
            ctx,
        }
    }
}

#[tonic::async_trait]
impl DevicePlugin for PluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(plugin_options()))
    }

    type ListAndWatchStream = ReceiverStream<Result<ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut state = self.state.clone();
        let mut holding = self.ctx.holding.clone();
        let mut stop = self.stop.clone();
        let events = self.ctx.streams.clone();
        let server = self.id;
        let _ = events.send(StreamEvent {
            server,
            opened: true,
        });
        tokio::spawn(async move {
            let mut last =
                list_and_watch_response(&state.borrow_and_update(), &holding.borrow_and_update());
            let resource = state.borrow().config.resource_name();
            debug!(%resource, "ListAndWatch started");
            let mut ok = tx.send(Ok(last.clone())).await.is_ok();
            let mut holding_open = true;
            while ok {
                tokio::select! {
                    changed = state.changed() => {
                        if changed.is_err() { break; }
                    }
                    changed = holding.changed(), if holding_open => {
                        holding_open = changed.is_ok();
                    }
                    // The kubelet closed the stream or its connection.
                    _ = tx.closed() => break,
                    _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
                }
                // A change of the configuration alone, or of what pods
                // hold of other devices, is no message.
                let now = list_and_watch_response(
                    &state.borrow_and_update(),
                    &holding.borrow_and_update(),
                );
                if now == last {
                    continue;
                }
                last = now;
                ok = tx.send(Ok(last.clone())).await.is_ok();
            }
            debug!(%resource, "ListAndWatch ended");
            let _ = events.send(StreamEvent {
                server,
                opened: false,
            });
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented(
            "GetPreferredAllocation is not advertised by this plugin",
        ))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let cfg = self.state.borrow().config.clone();
        allocate::answer(&self.ctx, cfg, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// A running server on one socket.
#[derive(Debug)]
pub(crate) struct PluginServer {
    id: u64,
    path: PathBuf,
    identity: FileIdentity,
    /// Ends the ListAndWatch streams.
    end_streams: watch::Sender<bool>,
    /// Stops serving.
    stop: watch::Sender<bool>,
    connections: Connections,
    task: JoinHandle<()>,
}

impl PluginServer {
    /// Binds `path` (replacing a stale file) and serves `state` on it.
    pub(crate) fn start(
        path: &Path,
        state: watch::Receiver<ResourceState>,
        ctx: ServerContext,
    ) -> Result<Self> {
        let listener = bind_unix(path)?;
        let identity =
            FileIdentity::of(path).map_err(Error::io("reading the socket just bound", path))?;
        let (stop_tx, mut stop_serving) = watch::channel(false);
        let (end_streams, end_rx) = watch::channel(false);
        let id = NEXT_SERVER_ID.fetch_add(1, Ordering::Relaxed);
        let service = PluginService::new(id, state, end_rx, ctx);
        let socket = path.to_path_buf();
        let connections = Connections::default();
        let counted = connections.clone();
        let task = tokio::spawn(async move {
            let stopped = async move {
                let _ = stop_serving.wait_for(|s| *s).await;
            };
            let svc = DevicePluginServer::new(service);
            if let Err(e) = serve_unix(svc, listener, stopped, counted).await {
                warn!(socket = %socket.display(), error = %error_chain(&e), "the plugin server ended with an error");
            }
        });
        info!(socket = %path.display(), "serving");
        Ok(Self {
            id,
            path: path.to_path_buf(),
            identity,
            end_streams,
            stop: stop_tx,
            connections,
            task,
        })
    }

    /// This server's number, unique in the process: [`StreamEvent`]s carry it.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Whether the socket file is still the one this server bound (the
    /// kubelet deletes plugin sockets when it restarts).
    pub(crate) fn socket_is_ours(&self) -> bool {
        FileIdentity::of(&self.path).is_ok_and(|i| i == self.identity)
    }

    /// Ends the open ListAndWatch streams, waits up to `wait` in all for
    /// the clients to close their connections and for the server to stop
    /// (then drops what is left), and, if `remove_socket`, removes the
    /// socket file if it is still ours.
    ///
    /// The kubelet closes its connection only after it has handled the
    /// stream's end (`disconnectClient`, then `Disconnect` closes the
    /// connection), and kubelets up to 1.36 disconnect whichever client
    /// holds the resource at that moment. So the stop, and the next
    /// Register that waits for it, come after the kubelet has handled the
    /// old stream, however slowly it runs.
    pub(crate) async fn stop(self, remove_socket: bool, wait: Duration) {
        let PluginServer {
            path,
            identity,
            end_streams,
            stop,
            connections,
            mut task,
            ..
        } = self;
        let deadline = tokio::time::Instant::now() + wait;
        let _ = end_streams.send(true);
        let closed = tokio::time::timeout_at(deadline, connections.all_closed()).await;
        if closed.is_err() {
            debug!(socket = %path.display(), open = connections.open(), "a client kept its connection past the stop's wait");
        }
        let _ = stop.send(true);
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            task.abort();
        }
        if remove_socket && FileIdentity::of(&path).is_ok_and(|i| i == identity) {
            let _ = std::fs::remove_file(&path);
        }
        info!(socket = %path.display(), "stopped serving");
    }
}

/// Tells our socket file from another at the same path by device and inode.
/// The change time is not compared: a chmod or an SELinux relabel of the
/// socket changes it, and the socket is still ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileIdentity {
    dev: u64,
    ino: u64,
}

impl FileIdentity {
    fn of(path: &Path) -> std::io::Result<Self> {
        let m = std::fs::symlink_metadata(path)?;
        Ok(Self {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::reclaim::Held;
    use std::os::unix::fs::PermissionsExt;

    /// A device a pod holds through DRA (the node switched back to the
    /// device plugin with it running) is listed unhealthy, so the kubelet
    /// hands it to no pod; the others keep their health.
    #[test]
    fn devices_held_through_dra_are_listed_unhealthy() {
        let config = ResourceConfig {
            capacity: 3,
            ..ResourceConfig::for_nic("eth1")
        };
        let state = ResourceState {
            devices: crate::kubelet::devices::device_list("eth1", 3, true, None),
            config,
        };
        let resp = crate::testdata::pod_with_claims(macvtap_link::dra::DRIVER, &["eth1-mvp-1"]);
        let health = |holding: &Holding| -> Vec<String> {
            list_and_watch_response(&state, holding)
                .devices
                .into_iter()
                .map(|d| d.health)
                .collect()
        };
        assert_eq!(
            health(&Holding::Known(Held::from_response(&resp))),
            ["Healthy", "Unhealthy", "Healthy"]
        );
        assert_eq!(health(&Holding::Unknown), ["Healthy"; 3]);
        assert_eq!(health(&Holding::Unreadable), ["Healthy"; 3]);
    }

    #[test]
    fn a_chmod_keeps_the_socket_ours() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let _l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let before = FileIdentity::of(&path).unwrap();
        // A chmod changes the change time, not the file.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(FileIdentity::of(&path).unwrap(), before);
    }
}
