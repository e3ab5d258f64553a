//! The kubelet's device manager side of the device plugin API, behaving as
//! the real one does: [`TestKubelet`] serves `Registration` and drives each
//! registered plugin as its client.
//!
//! Read from the kubelet's source, `pkg/kubelet/cm/devicemanager/` in
//! kubernetes/kubernetes: `plugin/v1beta1/server.go` (`Register`: version
//! check, `IsExtendedResourceName`, then `connectClient`),
//! `plugin/v1beta1/handler.go` (`connectClient` stores the client under the
//! resource name, replacing any earlier one, dials, and runs it in a
//! goroutine; `runClient`, when `Run` returns, disconnects whatever client
//! is *now* stored under that name), `plugin/v1beta1/client.go` (`dial`
//! with `grpc.WithAuthority("localhost")`; `Run` opens ListAndWatch once
//! and returns when the stream ends, never reopening it), `manager.go`
//! (`PluginConnected` calls `GetDevicePluginOptions`; `PluginDisconnected`
//! marks every device of the resource unhealthy and stops the endpoint)
//! and `endpoint.go` (`allocate` sends one `ContainerAllocateRequest` and
//! fails on a stopped endpoint). Kubelets up to 1.36 keep one client per
//! resource name, so the end of an old client's stream disconnects the
//! client that replaced it; this kubelet does the same.
//!
//! So [`TestKubelet`] serves `Registration` on `kubelet.sock` and, for each
//! accepted registration, dials the plugin (`:authority localhost`, via
//! [`connect_unix`]), asks its options, and opens ListAndWatch itself; what
//! it learns is a [`ResourceView`] per resource. Register handlers run to
//! the end even when the caller gave up, as Go's do, and can be made to
//! hang. Allocate goes through the current client, one container per call;
//! [`TestKubelet::allocate_init_and_app`] allocates an init container's
//! devices again for the app container (the device manager's
//! `devicesToReuse`).

use crate::lock;
use crate::plugin_client::{PluginClient, summary};
use anyhow::{Result, anyhow};
use kubelet_proto::transport::{Connections, bind_unix, connect_unix, serve_unix};
use kubelet_proto::v1beta1::device_plugin_client::DevicePluginClient;
use kubelet_proto::v1beta1::registration_server::{Registration, RegistrationServer};
use kubelet_proto::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateRequest, Device, Empty, KUBELET_SOCKET,
    RegisterRequest, VERSION,
};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tokio::task::{AbortHandle, JoinHandle};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// How long the kubelet's `dial` waits for the plugin socket (client.go).
pub(crate) const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the kubelet's server gets to stop before it is dropped.
const STOP_WAIT: Duration = Duration::from_secs(2);
/// The device manager's checkpoint in the device-plugins directory, which
/// a restart keeps.
const CHECKPOINT: &str = "kubelet_internal_checkpoint";

/// What the kubelet knows of one resource.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResourceView {
    /// The last device list received; every device Unhealthy after a disconnect.
    pub devices: Vec<Device>,
    /// Whether the resource has an endpoint that is not stopped.
    pub connected: bool,
    /// The number of the client stored for the resource (0: none yet).
    pub client: u64,
    /// ListAndWatch streams open now, of any client of the resource.
    pub live_streams: usize,
    /// ListAndWatch streams opened so far.
    pub streams_opened: u64,
}

impl ResourceView {
    /// Devices the node could allocate now (the kubelet's allocatable).
    pub fn allocatable(&self) -> usize {
        if !self.connected {
            return 0;
        }
        self.devices
            .iter()
            .filter(|d| d.health == "Healthy")
            .count()
    }
}

/// The end of one client's ListAndWatch stream and the client the kubelet
/// disconnected because of it (in kubelets up to 1.36 it can be a newer one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disconnect {
    /// The resource.
    pub resource: String,
    /// The client whose stream ended.
    pub stream_of: u64,
    /// The client that was disconnected.
    pub disconnected: u64,
}

/// A registration the kubelet refused, and the error it answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The request as the plugin sent it.
    pub request: RegisterRequest,
    /// The gRPC status message the plugin got back.
    pub reason: String,
}

/// One registered client of a plugin (client.go's `client`).
#[derive(Debug)]
struct PluginConn {
    id: u64,
    resource: String,
    /// Taken on Disconnect, so the connection closes once `Run` ends.
    api: Mutex<Option<DevicePluginClient<Channel>>>,
    /// Closing the connection ends `Run`.
    close: Mutex<Option<oneshot::Sender<()>>>,
}

#[derive(Debug)]
struct Shared {
    dir: PathBuf,
    log: watch::Sender<Vec<RegisterRequest>>,
    refused: Mutex<Vec<Refusal>>,
    clients: Mutex<HashMap<String, Arc<PluginConn>>>,
    views: watch::Sender<BTreeMap<String, ResourceView>>,
    disconnects: watch::Sender<Vec<Disconnect>>,
    hang: watch::Sender<bool>,
    hung: watch::Sender<usize>,
    next_client: AtomicU64,
    tasks: Mutex<Vec<AbortHandle>>,
}

/// Whether `name` is an extended resource name, as the kubelet's
/// `v1helper.IsExtendedResourceName` decides: `domain/name`, not in the
/// `kubernetes.io` namespace, not starting with `requests.`, and
/// `requests.<name>` a valid qualified name.
pub fn is_extended_resource_name(name: &str) -> bool {
    if !name.contains('/') || name.contains("kubernetes.io/") || name.starts_with("requests.") {
        return false;
    }
    let quota = format!("requests.{name}");
    let Some((prefix, short)) = quota.split_once('/') else {
        return false;
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let prefix_ok = prefix.len() <= 253 && prefix.split('.').all(label_ok);
    let sb = short.as_bytes();
    let short_ok = !sb.is_empty()
        && sb.len() <= 63
        && sb[0].is_ascii_alphanumeric()
        && sb[sb.len() - 1].is_ascii_alphanumeric()
        && sb
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    prefix_ok && short_ok
}

impl Shared {
    fn update(&self, resource: &str, f: impl FnOnce(&mut ResourceView)) {
        self.views
            .send_modify(|m| f(m.entry(resource.to_string()).or_default()));
    }

    fn current(&self, resource: &str) -> Option<Arc<PluginConn>> {
        lock(&self.clients).get(resource).cloned()
    }

    /// [`Shared::try_register`], recording a refusal with its reason.
    async fn register(self: Arc<Self>, req: RegisterRequest) -> Result<(), Status> {
        let answer = self.clone().try_register(req.clone()).await;
        if let Err(e) = &answer {
            lock(&self.refused).push(Refusal {
                request: req,
                reason: e.message().to_string(),
            });
        }
        answer
    }

    /// server.go `Register` and handler.go `connectClient`.
    async fn try_register(self: Arc<Self>, req: RegisterRequest) -> Result<(), Status> {
        if *self.hang.borrow() {
            self.hung.send_modify(|n| *n += 1);
            let mut rx = self.hang.subscribe();
            let _ = rx.wait_for(|h| !*h).await;
            self.hung.send_modify(|n| *n -= 1);
        }
        if req.version != VERSION {
            return Err(Status::unknown(format!(
                "requested device plugin version {:?} is not supported; supported versions are [\"{VERSION}\"]",
                req.version
            )));
        }
        if !is_extended_resource_name(&req.resource_name) {
            return Err(Status::unknown(format!(
                "the ResourceName {:?} is invalid",
                req.resource_name
            )));
        }
        let resource = req.resource_name.clone();
        let id = self.next_client.fetch_add(1, Ordering::SeqCst);
        let (close_tx, close_rx) = oneshot::channel();
        let conn = Arc::new(PluginConn {
            id,
            resource: resource.clone(),
            api: Mutex::new(None),
            close: Mutex::new(Some(close_tx)),
        });
        // registerClient: the new client replaces the old one under the name.
        lock(&self.clients).insert(resource.clone(), conn.clone());
        let connected = async {
            let channel = connect_unix(&self.dir.join(&req.endpoint), DIAL_TIMEOUT)
                .await
                .map_err(|e| Status::unknown(format!("failed to dial device plugin: {e}")))?;
            let mut api = DevicePluginClient::new(channel);
            // PluginConnected.
            api.get_device_plugin_options(Empty {}).await.map_err(|e| {
                Status::unknown(format!("failed to get device plugin options: {e}"))
            })?;
            Ok::<_, Status>(api)
        }
        .await;
        let api = match connected {
            Ok(api) => api,
            Err(e) => {
                // deregisterClient (by name, as kubelets up to 1.36 do).
                lock(&self.clients).remove(&resource);
                return Err(e);
            }
        };
        *lock(&conn.api) = Some(api.clone());
        self.update(&resource, |v| {
            v.connected = true;
            v.client = id;
        });
        let me = self.clone();
        let task = tokio::spawn(me.run_client(conn, api, close_rx));
        lock(&self.tasks).push(task.abort_handle());
        self.log.send_modify(|l| l.push(req));
        Ok(())
    }

    /// handler.go `runClient`: `Run`, then disconnect the client stored
    /// under the name now.
    async fn run_client(
        self: Arc<Self>,
        conn: Arc<PluginConn>,
        api: DevicePluginClient<Channel>,
        close: oneshot::Receiver<()>,
    ) {
        let resource = conn.resource.clone();
        tokio::select! {
            _ = self.clone().run(&resource, api) => {}
            _ = close => {}
        }
        let Some(current) = self.current(&resource) else {
            return;
        };
        self.disconnect(&current, conn.id);
    }

    /// client.go `Run`: one ListAndWatch, read until it ends.
    async fn run(self: Arc<Self>, resource: &str, mut api: DevicePluginClient<Channel>) {
        let Ok(resp) = api.list_and_watch(Empty {}).await else {
            return;
        };
        let mut stream = resp.into_inner();
        let _open = StreamCount::open(&self, resource);
        while let Ok(Some(m)) = stream.message().await {
            self.update(resource, |v| v.devices = m.devices);
        }
    }

    /// handler.go `disconnectClient` and manager.go `PluginDisconnected`.
    fn disconnect(&self, conn: &Arc<PluginConn>, stream_of: u64) {
        {
            let mut clients = lock(&self.clients);
            if clients.get(&conn.resource).is_some_and(|c| c.id == conn.id) {
                clients.remove(&conn.resource);
            }
        }
        lock(&conn.api).take();
        if let Some(c) = lock(&conn.close).take() {
            let _ = c.send(());
        }
        self.update(&conn.resource, |v| {
            if v.connected {
                for d in &mut v.devices {
                    d.health = "Unhealthy".into();
                }
            }
            v.connected = false;
        });
        self.disconnects.send_modify(|l| {
            l.push(Disconnect {
                resource: conn.resource.clone(),
                stream_of,
                disconnected: conn.id,
            })
        });
    }
}

/// Counts an open ListAndWatch stream while it lives.
struct StreamCount {
    shared: Arc<Shared>,
    resource: String,
}

impl StreamCount {
    fn open(shared: &Arc<Shared>, resource: &str) -> Self {
        shared.update(resource, |v| {
            v.live_streams += 1;
            v.streams_opened += 1;
        });
        Self {
            shared: shared.clone(),
            resource: resource.to_string(),
        }
    }
}

impl Drop for StreamCount {
    fn drop(&mut self) {
        self.shared.update(&self.resource, |v| {
            v.live_streams = v.live_streams.saturating_sub(1)
        });
    }
}

#[derive(Clone)]
struct RegistrationService {
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        // A Go handler runs to the end even when its caller gave up.
        let shared = self.shared.clone();
        tokio::spawn(shared.register(request.into_inner()))
            .await
            .map_err(|e| Status::internal(format!("register handler: {e}")))??;
        Ok(Response::new(Empty {}))
    }
}

/// A kubelet's device manager in a directory.
#[derive(Debug)]
pub struct TestKubelet {
    dir: PathBuf,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl TestKubelet {
    /// Creates `dir` if needed and serves `Registration` on `dir/kubelet.sock`.
    pub async fn start(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let listener = bind_unix(&dir.join(KUBELET_SOCKET))?;
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            log: watch::channel(Vec::new()).0,
            refused: Mutex::new(Vec::new()),
            clients: Mutex::new(HashMap::new()),
            views: watch::channel(BTreeMap::new()).0,
            disconnects: watch::channel(Vec::new()).0,
            hang: watch::channel(false).0,
            hung: watch::channel(0).0,
            next_client: AtomicU64::new(1),
            tasks: Mutex::new(Vec::new()),
        });
        let service = RegistrationService {
            shared: shared.clone(),
        };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let server = RegistrationServer::new(service);
        let task = tokio::spawn(serve_unix(
            server,
            listener,
            async move {
                let _ = stop_rx.await;
            },
            Connections::default(),
        ));
        Ok(Self {
            dir: dir.to_path_buf(),
            shared,
            stop: Some(stop_tx),
            task: Some(task),
        })
    }

    /// The device-plugins directory this kubelet serves in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every registration accepted so far, in order.
    pub fn registrations(&self) -> Vec<RegisterRequest> {
        self.shared.log.borrow().clone()
    }

    /// Every registration refused so far, in order, with the reason the
    /// plugin was given.
    pub fn refusals(&self) -> Vec<Refusal> {
        lock(&self.shared.refused).clone()
    }

    /// Waits until more than `seen` registrations of `resource_name` have
    /// been accepted, and returns the newest.
    pub async fn wait_for_registration(
        &self,
        resource_name: &str,
        seen: usize,
        timeout: Duration,
    ) -> Result<RegisterRequest> {
        let mut rx = self.shared.log.subscribe();
        let count = |l: &Vec<RegisterRequest>| {
            l.iter()
                .filter(|r| r.resource_name == resource_name)
                .count()
        };
        let res = tokio::time::timeout(timeout, rx.wait_for(|l| count(l) > seen)).await;
        match res {
            Ok(Ok(l)) => l
                .iter()
                .rev()
                .find(|r| r.resource_name == resource_name)
                .cloned()
                .ok_or_else(|| anyhow!("registration vanished")),
            _ => Err(anyhow!(
                "no registration #{} of {resource_name} within {timeout:?}; got {:?}",
                seen + 1,
                self.registrations()
            )),
        }
    }

    /// How many registrations of `resource_name` were accepted so far.
    pub fn registration_count(&self, resource_name: &str) -> usize {
        self.shared
            .log
            .borrow()
            .iter()
            .filter(|r| r.resource_name == resource_name)
            .count()
    }

    /// What the kubelet knows of `resource_name` now.
    pub fn resource(&self, resource_name: &str) -> ResourceView {
        self.shared
            .views
            .borrow()
            .get(resource_name)
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until what the kubelet knows of `resource_name` satisfies
    /// `pred`, and returns it.
    pub async fn wait_resource(
        &self,
        resource_name: &str,
        timeout: Duration,
        pred: impl Fn(&ResourceView) -> bool,
    ) -> Result<ResourceView> {
        let mut rx = self.shared.views.subscribe();
        let view =
            |m: &BTreeMap<String, ResourceView>| m.get(resource_name).cloned().unwrap_or_default();
        let res = tokio::time::timeout(timeout, rx.wait_for(|m| pred(&view(m)))).await;
        match res {
            Ok(Ok(m)) => Ok(view(&m)),
            _ => Err(anyhow!(
                "{resource_name} did not reach the awaited state within {timeout:?}; it is {:?}",
                summary_view(&self.resource(resource_name))
            )),
        }
    }

    /// Every disconnect so far, in order.
    pub fn disconnects(&self) -> Vec<Disconnect> {
        self.shared.disconnects.borrow().clone()
    }

    /// Waits until `pred` holds for the disconnects so far.
    pub async fn wait_disconnects(
        &self,
        timeout: Duration,
        pred: impl Fn(&[Disconnect]) -> bool,
    ) -> Result<Vec<Disconnect>> {
        let mut rx = self.shared.disconnects.subscribe();
        match tokio::time::timeout(timeout, rx.wait_for(|l| pred(l))).await {
            Ok(Ok(l)) => Ok(l.clone()),
            _ => Err(anyhow!(
                "disconnects did not reach the awaited state within {timeout:?}: {:?}",
                self.disconnects()
            )),
        }
    }

    /// Makes every Register call from now on hang (`true`) until called
    /// with `false`, when the hung calls go on as if nothing happened.
    pub fn hang_register(&self, hang: bool) {
        self.shared.hang.send_replace(hang);
    }

    /// Waits until at least `n` Register calls hang.
    pub async fn wait_hung(&self, n: usize, timeout: Duration) -> Result<()> {
        let mut rx = self.shared.hung.subscribe();
        match tokio::time::timeout(timeout, rx.wait_for(|h| *h >= n)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(anyhow!(
                "fewer than {n} Register calls hang after {timeout:?}"
            )),
        }
    }

    /// How many Register calls hang now.
    pub fn hung(&self) -> usize {
        *self.shared.hung.borrow()
    }

    /// Breaks the connection of the current client of `resource_name`, as
    /// a failed transport would: its ListAndWatch stream ends, and the
    /// kubelet disconnects the resource.
    pub fn break_stream(&self, resource_name: &str) -> Result<()> {
        let conn = self
            .shared
            .current(resource_name)
            .ok_or_else(|| anyhow!("no client for {resource_name}"))?;
        if let Some(c) = lock(&conn.close).take() {
            let _ = c.send(());
        }
        Ok(())
    }

    /// `Allocate` of `ids` for one container, through the current client
    /// of `resource_name` (endpoint.go `allocate`: a stopped endpoint fails).
    pub async fn allocate(
        &self,
        resource_name: &str,
        ids: &[&str],
    ) -> Result<AllocateResponse, Status> {
        let api = self
            .shared
            .current(resource_name)
            .and_then(|c| lock(&c.api).clone())
            .filter(|_| self.resource(resource_name).connected);
        let Some(mut api) = api else {
            return Err(Status::unavailable(format!(
                "endpoint of {resource_name} is stopped; no registered plugin"
            )));
        };
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
        };
        Ok(api.allocate(req).await?.into_inner())
    }

    /// A pod whose init container and app container each request `ids`:
    /// the device manager allocates them for the init container, then
    /// again for the app container (`devicesToReuse`), one Allocate each.
    pub async fn allocate_init_and_app(
        &self,
        resource_name: &str,
        ids: &[&str],
    ) -> Result<(AllocateResponse, AllocateResponse), Status> {
        let init = self.allocate(resource_name, ids).await?;
        let app = self.allocate(resource_name, ids).await?;
        Ok((init, app))
    }

    /// Stops serving and removes `kubelet.sock`, as a stopped kubelet would
    /// (every connection to a plugin closes).
    pub async fn stop(mut self) {
        self.shutdown().await;
    }

    async fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        for t in lock(&self.shared.tasks).drain(..) {
            t.abort();
        }
        lock(&self.shared.clients).clear();
        if let Some(t) = self.task.take() {
            // A server that does not stop in time is dropped with the runtime.
            let _ = tokio::time::timeout(STOP_WAIT, t).await;
        }
        let _ = std::fs::remove_file(self.dir.join(KUBELET_SOCKET));
    }

    /// Restarts like the kubelet does: stops, deletes every entry of the
    /// directory but its checkpoint and subdirectories (plugin sockets
    /// included), and serves a new `kubelet.sock`. That is the device
    /// manager's `CleanupPluginDirectory` of the releases that delete every
    /// such file; newer ones delete only sockets (kubernetes v1.37.2
    /// `pkg/kubelet/cm/devicemanager/manager.go`: `stat.IsDir() ||
    /// stat.Mode()&os.ModeSocket == 0` is kept, which the real-node e2e
    /// sees keep our record). This plays the harsher of the two.
    /// The new instance knows nothing of the old one's registrations.
    pub async fn restart(mut self) -> Result<Self> {
        self.shutdown().await;
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            if entry.file_name() != CHECKPOINT && !entry.file_type()?.is_dir() {
                std::fs::remove_file(entry.path())?;
            }
        }
        Self::start(&self.dir).await
    }

    /// Dials the plugin socket `endpoint` as a separate client (the test's
    /// own, not the kubelet's registered one), for raw calls.
    pub async fn connect(&self, endpoint: &str) -> Result<PluginClient> {
        let channel = connect_unix(&self.dir.join(endpoint), DIAL_TIMEOUT).await?;
        Ok(PluginClient {
            client: DevicePluginClient::new(channel),
        })
    }
}

fn summary_view(v: &ResourceView) -> String {
    format!(
        "connected={} client={} live_streams={} streams_opened={} devices={:?}",
        v.connected,
        v.client,
        v.live_streams,
        v.streams_opened,
        summary(&v.devices)
    )
}

impl Drop for TestKubelet {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        for t in lock(&self.shared.tasks).drain(..) {
            t.abort();
        }
        lock(&self.shared.clients).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_proto::v1beta1::registration_client::RegistrationClient;

    /// A refused registration is kept with the reason the plugin got; an
    /// accepted one is not among the refusals.
    #[tokio::test]
    async fn refused_registrations_are_recorded_with_their_reason() {
        let dir = tempfile::tempdir().unwrap();
        let k = TestKubelet::start(dir.path()).await.unwrap();
        let channel = connect_unix(&dir.path().join(KUBELET_SOCKET), DIAL_TIMEOUT)
            .await
            .unwrap();
        let mut c = RegistrationClient::new(channel);
        let request = |version: &str, name: &str| RegisterRequest {
            version: version.into(),
            endpoint: "nowhere.sock".into(),
            resource_name: name.into(),
            options: None,
        };
        let bad_name = request(VERSION, "macvtap.network.kubevirt.io/x/y");
        let err = c.register(bad_name.clone()).await.unwrap_err();
        let old = request("v1alpha", "macvtap.network.kubevirt.io/a");
        c.register(old.clone()).await.unwrap_err();
        assert_eq!(
            k.refusals(),
            [
                Refusal {
                    request: bad_name,
                    reason: err.message().to_string(),
                },
                Refusal {
                    request: old,
                    reason: "requested device plugin version \"v1alpha\" is not supported; \
                             supported versions are [\"v1beta1\"]"
                        .into(),
                },
            ]
        );
        assert_eq!(
            err.message(),
            "the ResourceName \"macvtap.network.kubevirt.io/x/y\" is invalid"
        );
        assert!(k.registrations().is_empty());
    }

    #[test]
    fn extended_resource_names_are_told_as_the_kubelet_does() {
        for ok in [
            "macvtap.network.kubevirt.io/eth0",
            "example.com/a_b.c-d",
            "nvidia.com/gpu",
        ] {
            assert!(is_extended_resource_name(ok), "{ok}");
        }
        for bad in [
            "eth0",
            "kubernetes.io/eth0",
            "requests.example.com/x",
            "macvtap.network.kubevirt.io/eth0/x",
            "macvtap.network.kubevirt.io/-eth0",
            "Macvtap.io/eth0",
            "macvtap.network.kubevirt.io/",
        ] {
            assert!(!is_extended_resource_name(bad), "{bad}");
        }
    }
}
