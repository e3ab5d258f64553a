//! The kubelet's PodResources API: [`TestPodResources`] lists the
//! allocations the test sets.

use anyhow::Result;
use kubelet_proto::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use kubelet_proto::podresources::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use kubelet_proto::transport::{bind_unix, serve_unix};
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

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
    pub async fn start(socket: &Path) -> Result<Self> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock;
    use crate::registration::DIAL_TIMEOUT;
    use kubelet_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
    use kubelet_proto::transport::connect_unix;

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
