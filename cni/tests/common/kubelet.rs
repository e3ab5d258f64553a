//! A test stand-in for the kubelet's PodResources server
//! (kubernetes `pkg/kubelet/apis/podresources/server_v1.go`): `List` returns
//! every pod the kubelet knows with each container's devices, as recorded at
//! admission (so a pod whose sandbox is being set up is listed, which is
//! what Multus relies on when it reads this API at ADD); `Get` answers with
//! an error, as kubelets without the `KubeletPodResourcesGet` feature gate
//! do. Served on `<dir>/pod-resources/kubelet.sock` from a runtime thread,
//! so the synchronous CNI tests can use it.

use kubelet_proto::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use kubelet_proto::podresources::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};

/// The pods the test kubelet reports: (namespace, name, [(resource, ids)]).
type Pods = Arc<Mutex<Vec<PodResources>>>;

struct Service {
    pods: Pods,
}

#[tonic::async_trait]
impl PodResourcesLister for Service {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let pods = self.pods.lock().unwrap().clone();
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: pods,
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
        Err(Status::unknown(
            "PodResources API Get method disabled via feature gate",
        ))
    }
}

/// A running test PodResources server.
pub struct PodResourcesKubelet {
    pub dir: tempfile::TempDir,
    pods: Pods,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PodResourcesKubelet {
    /// Serves on `<new temp dir>/pod-resources/kubelet.sock` and returns
    /// once the socket accepts connections.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("pod-resources/kubelet.sock");
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let pods: Pods = Arc::default();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let service = Service { pods: pods.clone() };
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&socket).unwrap();
                ready_tx.send(()).unwrap();
                let _ = tonic::transport::Server::builder()
                    .serve_with_incoming_shutdown(
                        PodResourcesListerServer::new(service),
                        tokio_stream::wrappers::UnixListenerStream::new(listener),
                        async move {
                            let _ = stop_rx.await;
                        },
                    )
                    .await;
            });
        });
        ready_rx.recv().unwrap();
        Self {
            dir,
            pods,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// The kubelet dir (what the node settings' `kubeletDir` names).
    pub fn kubelet_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Adds a pod holding `devices` (resource, device IDs) in its compute
    /// container, after an init container without devices.
    pub fn add_pod(&self, namespace: &str, name: &str, devices: &[(&str, &[&str])]) {
        self.pods.lock().unwrap().push(PodResources {
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

    /// Writes a node settings file naming this kubelet dir with `check`
    /// (`warn` or `enforce`); returns its path for `MACVTAP_CNI_SETTINGS`.
    pub fn settings(&self, check: &str) -> PathBuf {
        settings_file(self.dir.path(), self.kubelet_dir(), check)
    }
}

/// Writes `<dir>/macvtap.settings.json` with `kubelet_dir` and `check`.
pub fn settings_file(dir: &Path, kubelet_dir: &Path, check: &str) -> PathBuf {
    let path = dir.join("macvtap.settings.json");
    std::fs::write(
        &path,
        serde_json::json!({"kubeletDir": kubelet_dir, "podResourcesCheck": check}).to_string(),
    )
    .unwrap();
    path
}

impl Drop for PodResourcesKubelet {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
