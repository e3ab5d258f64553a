//! A test kubelet: the kubelet's side of the device plugin API, for tests.
//!
//! [`TestKubelet`] serves `Registration` on `kubelet.sock` in a directory of
//! the test's choosing and records every registration; like the real kubelet
//! it dials the plugin back (`GetDevicePluginOptions`) before it answers.
//! Then it acts as the kubelet's client of a plugin ([`PluginClient`]):
//! options, ListAndWatch, Allocate. [`TestPodResources`] serves the
//! PodResources API with whatever allocations the test sets.
//!
//! It lives in the library behind the `testkubelet` feature (not in
//! `tests/`) so that the e2e crate can use the same kubelet.

use crate::grpc::{bind_unix, connect_unix};
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
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// Errors of the test helpers.
pub type TestError = Box<dyn std::error::Error + Send + Sync>;
/// Result of the test helpers.
pub type TestResult<T> = std::result::Result<T, TestError>;

#[derive(Clone)]
struct RegistrationService {
    dir: PathBuf,
    log: watch::Sender<Vec<RegisterRequest>>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let req = request.into_inner();
        if req.version != VERSION {
            return Err(Status::invalid_argument(format!(
                "unsupported version {:?}",
                req.version
            )));
        }
        // Like the kubelet: dial the plugin's endpoint before accepting.
        let socket = self.dir.join(&req.endpoint);
        let channel = connect_unix(&socket, Duration::from_secs(5))
            .await
            .map_err(|e| Status::failed_precondition(format!("dialing the plugin: {e}")))?;
        DevicePluginClient::new(channel)
            .get_device_plugin_options(Empty {})
            .await
            .map_err(|e| Status::failed_precondition(format!("GetDevicePluginOptions: {e}")))?;
        self.log.send_modify(|l| l.push(req));
        Ok(Response::new(Empty {}))
    }
}

/// A kubelet's registration endpoint in a directory.
#[derive(Debug)]
pub struct TestKubelet {
    dir: PathBuf,
    log: watch::Sender<Vec<RegisterRequest>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestKubelet {
    /// Creates `dir` if needed and serves `Registration` on `dir/kubelet.sock`.
    pub async fn start(dir: &Path) -> TestResult<Self> {
        std::fs::create_dir_all(dir)?;
        let listener = bind_unix(&dir.join(KUBELET_SOCKET))?;
        let (log, _) = watch::channel(Vec::new());
        let service = RegistrationService {
            dir: dir.to_path_buf(),
            log: log.clone(),
        };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .serve_with_incoming_shutdown(
                    RegistrationServer::new(service),
                    UnixListenerStream::new(listener),
                    async move {
                        let _ = stop_rx.await;
                    },
                )
                .await;
        });
        Ok(Self {
            dir: dir.to_path_buf(),
            log,
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
        self.log.borrow().clone()
    }

    /// Waits until more than `seen` registrations of `resource_name` have
    /// been accepted, and returns the newest.
    pub async fn wait_for_registration(
        &self,
        resource_name: &str,
        seen: usize,
        timeout: Duration,
    ) -> TestResult<RegisterRequest> {
        let mut rx = self.log.subscribe();
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
        self.log
            .borrow()
            .iter()
            .filter(|r| r.resource_name == resource_name)
            .count()
    }

    /// Stops serving and removes `kubelet.sock`, as a stopped kubelet would.
    pub async fn stop(mut self) {
        self.shutdown().await;
    }

    async fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            // A server that does not stop in time is dropped with the runtime.
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
        let _ = std::fs::remove_file(self.dir.join(KUBELET_SOCKET));
    }

    /// Restarts like the kubelet does: stops, deletes every socket in the
    /// directory (plugin sockets included), and serves a new `kubelet.sock`.
    /// The new instance has an empty registration log.
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

    /// Dials the plugin that registered with `endpoint`.
    pub async fn connect(&self, endpoint: &str) -> TestResult<PluginClient> {
        let channel = connect_unix(&self.dir.join(endpoint), Duration::from_secs(5)).await?;
        Ok(PluginClient {
            client: DevicePluginClient::new(channel),
        })
    }
}

/// The kubelet's client of one plugin.
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
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "test-pod".into(),
                namespace: "default".into(),
                containers: vec![ContainerResources {
                    name: "compute".into(),
                    devices,
                    ..Default::default()
                }],
            }],
        }))
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
        Err(Status::unimplemented("not needed by the tests"))
    }
}

/// A PodResources API server reporting allocations the test sets.
#[derive(Debug)]
pub struct TestPodResources {
    allocated: Arc<Mutex<Vec<ContainerDevices>>>,
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
        let service = PodResourcesService {
            allocated: allocated.clone(),
        };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .serve_with_incoming_shutdown(
                    PodResourcesListerServer::new(service),
                    UnixListenerStream::new(listener),
                    async move {
                        let _ = stop_rx.await;
                    },
                )
                .await;
        });
        Ok(Self {
            allocated,
            stop: Some(stop_tx),
        })
    }

    /// Reports `ids` of `resource_name` as allocated to the test pod.
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
    }
}

/// The lock file that [`tap_node_lock`] takes.
pub const TAP_NODE_LOCK: &str = "/tmp/macvtap-tap-nodes.lock";

/// Serializes tests that create macvtaps in fresh namespaces.
///
/// `/dev/tapN` is named after the link's ifindex, and every fresh namespace
/// numbers its links from 1 again, so two tests running at once both make
/// a macvtap with, say, ifindex 4, and only one of them gets `/dev/tap4`
/// (on a real node all macvtaps are created in the host namespace, so this
/// does not happen there). Tests hold this lock (an exclusive `flock`, across
/// processes and threads) while they may have such a macvtap.
pub fn tap_node_lock() -> TestResult<nix::fcntl::Flock<std::fs::File>> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(TAP_NODE_LOCK)?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("locking {TAP_NODE_LOCK}: {e}").into())
}
