//! A test kubelet: the kubelet's device manager side of the device plugin
//! API, for tests, behaving as the real one does.
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
//! `devicesToReuse`). [`TestPodResources`] serves the PodResources API with
//! whatever allocations the test sets.
//!
//! It lives in the library behind the `testkubelet` feature (not in
//! `tests/`) so that the e2e crate can use the same kubelet.

use crate::grpc::{bind_unix, connect_unix, serve_unix};
use kubelet_proto::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use kubelet_proto::podresources::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use kubelet_proto::v1beta1::device_plugin_client::DevicePluginClient;
use kubelet_proto::v1beta1::registration_server::{Registration, RegistrationServer};
use kubelet_proto::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateRequest, Device, DevicePluginOptions,
    Empty, KUBELET_SOCKET, ListAndWatchResponse, RegisterRequest, VERSION,
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

/// Errors of the test helpers.
pub type TestError = Box<dyn std::error::Error + Send + Sync>;
/// Result of the test helpers.
pub type TestResult<T> = std::result::Result<T, TestError>;

/// How long the kubelet's `dial` waits for the plugin socket (client.go).
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the kubelet's server gets to stop before it is dropped.
const STOP_WAIT: Duration = Duration::from_secs(2);

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
    clients: Mutex<HashMap<String, Arc<PluginConn>>>,
    views: watch::Sender<BTreeMap<String, ResourceView>>,
    disconnects: watch::Sender<Vec<Disconnect>>,
    hang: watch::Sender<bool>,
    hung: watch::Sender<usize>,
    next_client: AtomicU64,
    tasks: Mutex<Vec<AbortHandle>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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

    /// server.go `Register` and handler.go `connectClient`.
    async fn register(self: Arc<Self>, req: RegisterRequest) -> Result<(), Status> {
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
    pub async fn start(dir: &Path) -> TestResult<Self> {
        std::fs::create_dir_all(dir)?;
        let listener = bind_unix(&dir.join(KUBELET_SOCKET))?;
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            log: watch::channel(Vec::new()).0,
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
        let task = tokio::spawn(serve_unix(server, listener, async move {
            let _ = stop_rx.await;
        }));
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

    /// Waits until more than `seen` registrations of `resource_name` have
    /// been accepted, and returns the newest.
    pub async fn wait_for_registration(
        &self,
        resource_name: &str,
        seen: usize,
        timeout: Duration,
    ) -> TestResult<RegisterRequest> {
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
                .ok_or_else(|| "registration vanished".into()),
            _ => Err(format!(
                "no registration #{} of {resource_name} within {timeout:?}; got {:?}",
                seen + 1,
                self.registrations()
            )
            .into()),
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
    ) -> TestResult<ResourceView> {
        let mut rx = self.shared.views.subscribe();
        let view =
            |m: &BTreeMap<String, ResourceView>| m.get(resource_name).cloned().unwrap_or_default();
        let res = tokio::time::timeout(timeout, rx.wait_for(|m| pred(&view(m)))).await;
        match res {
            Ok(Ok(m)) => Ok(view(&m)),
            _ => Err(format!(
                "{resource_name} did not reach the awaited state within {timeout:?}; it is {:?}",
                summary_view(&self.resource(resource_name))
            )
            .into()),
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
    ) -> TestResult<Vec<Disconnect>> {
        let mut rx = self.shared.disconnects.subscribe();
        match tokio::time::timeout(timeout, rx.wait_for(|l| pred(l))).await {
            Ok(Ok(l)) => Ok(l.clone()),
            _ => Err(format!(
                "disconnects did not reach the awaited state within {timeout:?}: {:?}",
                self.disconnects()
            )
            .into()),
        }
    }

    /// Makes every Register call from now on hang (`true`) until called
    /// with `false`, when the hung calls go on as if nothing happened.
    pub fn hang_register(&self, hang: bool) {
        self.shared.hang.send_replace(hang);
    }

    /// Waits until at least `n` Register calls hang.
    pub async fn wait_hung(&self, n: usize, timeout: Duration) -> TestResult<()> {
        let mut rx = self.shared.hung.subscribe();
        match tokio::time::timeout(timeout, rx.wait_for(|h| *h >= n)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(format!("fewer than {n} Register calls hang after {timeout:?}").into()),
        }
    }

    /// How many Register calls hang now.
    pub fn hung(&self) -> usize {
        *self.shared.hung.borrow()
    }

    /// Breaks the connection of the current client of `resource_name`, as
    /// a failed transport would: its ListAndWatch stream ends, and the
    /// kubelet disconnects the resource.
    pub fn break_stream(&self, resource_name: &str) -> TestResult<()> {
        let conn = self
            .shared
            .current(resource_name)
            .ok_or_else(|| format!("no client for {resource_name}"))?;
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

    /// Restarts like the kubelet does: stops, deletes every socket in the
    /// directory (plugin sockets included), and serves a new `kubelet.sock`.
    /// The new instance knows nothing of the old one's registrations.
    pub async fn restart(mut self) -> TestResult<Self> {
        self.shutdown().await;
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            if std::os::unix::fs::FileTypeExt::is_socket(&entry.file_type()?) {
                std::fs::remove_file(entry.path())?;
            }
        }
        Self::start(&self.dir).await
    }

    /// Dials the plugin socket `endpoint` as a separate client (the test's
    /// own, not the kubelet's registered one), for raw calls.
    pub async fn connect(&self, endpoint: &str) -> TestResult<PluginClient> {
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

/// A client of one plugin socket, for raw calls.
#[derive(Debug, Clone)]
pub struct PluginClient {
    /// The raw gRPC client, for calls not wrapped here.
    pub client: DevicePluginClient<Channel>,
}

impl PluginClient {
    /// `GetDevicePluginOptions`.
    pub async fn options(&mut self) -> Result<DevicePluginOptions, Status> {
        Ok(self
            .client
            .get_device_plugin_options(Empty {})
            .await?
            .into_inner())
    }

    /// Opens `ListAndWatch`.
    pub async fn list_and_watch(&mut self) -> Result<DeviceWatch, Status> {
        let stream = self.client.list_and_watch(Empty {}).await?.into_inner();
        Ok(DeviceWatch {
            stream,
            latest: Vec::new(),
        })
    }

    /// `Allocate` for one container with these device IDs.
    pub async fn allocate(&mut self, ids: &[&str]) -> Result<AllocateResponse, Status> {
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
        };
        Ok(self.client.allocate(req).await?.into_inner())
    }
}

/// An open ListAndWatch stream.
#[derive(Debug)]
pub struct DeviceWatch {
    stream: tonic::Streaming<ListAndWatchResponse>,
    /// The last device list received.
    pub latest: Vec<Device>,
}

impl DeviceWatch {
    /// The next device list, within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> TestResult<Vec<Device>> {
        match tokio::time::timeout(timeout, self.stream.message()).await {
            Ok(Ok(Some(m))) => {
                self.latest = m.devices.clone();
                Ok(m.devices)
            }
            Ok(Ok(None)) => Err("ListAndWatch stream ended".into()),
            Ok(Err(s)) => Err(format!("ListAndWatch: {s}").into()),
            Err(_) => Err(format!("no ListAndWatch message within {timeout:?}").into()),
        }
    }

    /// Reads messages until one satisfies `pred` (the latest one already
    /// received counts), failing after `timeout` overall.
    pub async fn wait_until(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&[Device]) -> bool,
    ) -> TestResult<Vec<Device>> {
        if !self.latest.is_empty() && pred(&self.latest) {
            return Ok(self.latest.clone());
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let devices = self
                .next(left)
                .await
                .map_err(|e| format!("{e}; last devices: {:?}", summary(&self.latest)))?;
            if pred(&devices) {
                return Ok(devices);
            }
        }
    }
}

/// `ID=health` pairs, for messages.
pub fn summary(devices: &[Device]) -> Vec<String> {
    devices
        .iter()
        .map(|d| format!("{}={}", d.id, d.health))
        .collect()
}

#[derive(Clone)]
struct PodResourcesService {
    allocated: Arc<Mutex<Vec<ContainerDevices>>>,
    others: Arc<Mutex<Vec<PodResources>>>,
    pod: Arc<Mutex<(String, String)>>,
}

#[tonic::async_trait]
impl PodResourcesLister for PodResourcesService {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let devices = self
            .allocated
            .lock()
            .map_err(|_| Status::internal("poisoned"))?
            .clone();
        let (namespace, name) = self
            .pod
            .lock()
            .map_err(|_| Status::internal("poisoned"))?
            .clone();
        let mut pod_resources = vec![PodResources {
            name,
            namespace,
            containers: vec![ContainerResources {
                name: "compute".into(),
                devices,
                ..Default::default()
            }],
        }];
        pod_resources.extend(
            self.others
                .lock()
                .map_err(|_| Status::internal("poisoned"))?
                .iter()
                .cloned(),
        );
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Ok(Response::new(AllocatableResourcesResponse::default()))
    }

    async fn get(
        &self,
        _: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        // What kubelets without the KubeletPodResourcesGet feature gate
        // answer (pkg/kubelet/apis/podresources/server_v1.go).
        Err(Status::unknown(
            "PodResources API Get method disabled via feature gate",
        ))
    }
}

/// The pod [`TestPodResources::set_allocated`] reports devices for:
/// (namespace, name), unless [`TestPodResources::set_pod`] names another.
pub const TEST_POD: (&str, &str) = ("default", "test-pod");

/// A PodResources API server reporting allocations the test sets, as the
/// kubelet's `List` does (kubernetes `pkg/kubelet/apis/podresources/
/// server_v1.go`): every pod the kubelet knows, each container with the
/// devices recorded for it at admission, so a pod whose sandbox is still
/// being set up is listed already (Multus relies on that at CNI ADD).
#[derive(Debug)]
pub struct TestPodResources {
    allocated: Arc<Mutex<Vec<ContainerDevices>>>,
    others: Arc<Mutex<Vec<PodResources>>>,
    pod: Arc<Mutex<(String, String)>>,
    stop: Option<oneshot::Sender<()>>,
}

impl TestPodResources {
    /// Serves on `socket` (usually `<kubelet dir>/pod-resources/kubelet.sock`).
    pub async fn start(socket: &Path) -> TestResult<Self> {
        if let Some(d) = socket.parent() {
            std::fs::create_dir_all(d)?;
        }
        let listener = bind_unix(socket)?;
        let allocated = Arc::new(Mutex::new(Vec::new()));
        let others = Arc::new(Mutex::new(Vec::new()));
        let pod = Arc::new(Mutex::new((TEST_POD.0.to_string(), TEST_POD.1.to_string())));
        let service = PodResourcesService {
            allocated: allocated.clone(),
            others: others.clone(),
            pod: pod.clone(),
        };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let server = PodResourcesListerServer::new(service);
        tokio::spawn(serve_unix(server, listener, async move {
            let _ = stop_rx.await;
        }));
        Ok(Self {
            allocated,
            others,
            pod,
            stop: Some(stop_tx),
        })
    }

    /// Names the pod whose devices [`TestPodResources::set_allocated`] sets
    /// (the kubelet lists each pod by namespace and name; Multus and the CNI
    /// look theirs up so).
    pub fn set_pod(&self, namespace: &str, name: &str) {
        *self.pod.lock().unwrap_or_else(|e| e.into_inner()) =
            (namespace.to_string(), name.to_string());
    }

    /// Adds another pod, `namespace/name`, holding `devices` (resource,
    /// device IDs) in its `compute` container, after a sidecar without any.
    pub fn add_pod(&self, namespace: &str, name: &str, devices: &[(&str, &[&str])]) {
        let mut others = self.others.lock().unwrap_or_else(|e| e.into_inner());
        others.push(PodResources {
            name: name.into(),
            namespace: namespace.into(),
            containers: vec![
                ContainerResources {
                    name: "istio-proxy".into(),
                    ..Default::default()
                },
                ContainerResources {
                    name: "compute".into(),
                    devices: devices
                        .iter()
                        .map(|(r, ids)| ContainerDevices {
                            resource_name: r.to_string(),
                            device_ids: ids.iter().map(|s| s.to_string()).collect(),
                            topology: None,
                        })
                        .collect(),
                    ..Default::default()
                },
            ],
        });
    }

    /// Reports `ids` of `resource_name` as allocated to the test pod
    /// ([`TEST_POD`] or the one [`TestPodResources::set_pod`] named).
    pub fn set_allocated(&self, resource_name: &str, ids: &[&str]) {
        let mut a = self.allocated.lock().unwrap_or_else(|e| e.into_inner());
        a.retain(|d| d.resource_name != resource_name);
        a.push(ContainerDevices {
            resource_name: resource_name.to_string(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
            topology: None,
        });
    }
}

impl Drop for TestPodResources {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
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

// The tap-node lock lives with the other test fixtures; re-exported here for
// the e2e harness, which has always taken it from the test kubelet.
pub use test_support::tapnode::{TAP_NODE_LOCK, tap_node_lock, test_namespace_owner};

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;

    /// Real kubelets (1.26 and later) dial plugins with `:authority
    /// localhost`; so does every dial of this kubelet ([`connect_unix`]).
    #[tokio::test]
    async fn dials_send_authority_localhost() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.sock");
        let listener = bind_unix(&path).unwrap();
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let service = PodResourcesService {
            allocated: Arc::new(Mutex::new(Vec::new())),
            others: Arc::new(Mutex::new(Vec::new())),
            pod: Arc::new(Mutex::new((TEST_POD.0.into(), TEST_POD.1.into()))),
        };
        let record = Recorder {
            seen: seen.clone(),
            inner: PodResourcesListerServer::new(service),
        };
        tokio::spawn(tonic::transport::Server::builder().serve_with_incoming(
            record,
            tokio_stream::wrappers::UnixListenerStream::new(listener),
        ));
        let channel = connect_unix(&path, DIAL_TIMEOUT).await.unwrap();
        PodResourcesListerClient::new(channel)
            .list(ListPodResourcesRequest {})
            .await
            .unwrap();
        assert_eq!(*lock(&seen), ["localhost"]);
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

    /// Records the `:authority` of every request, then serves it.
    #[derive(Clone)]
    struct Recorder<S> {
        seen: Arc<Mutex<Vec<String>>>,
        inner: S,
    }

    impl<S: tonic::server::NamedService> tonic::server::NamedService for Recorder<S> {
        const NAME: &'static str = S::NAME;
    }

    impl<S, B> tower::Service<tonic::codegen::http::Request<B>> for Recorder<S>
    where
        S: tower::Service<tonic::codegen::http::Request<B>>,
    {
        type Response = S::Response;
        type Error = S::Error;
        type Future = S::Future;

        fn poll_ready(
            &mut self,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
            let authority = req.uri().authority().map(|a| a.to_string());
            lock(&self.seen).push(authority.unwrap_or_default());
            self.inner.call(req)
        }
    }
}
