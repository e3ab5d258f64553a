//! The kubelet's PodResources API: [`TestPodResources`] lists the
//! allocations the test sets, behind the kubelet's rate limit
//! ([`crate::rate_limit`]), and can be made to fail or hang.

use crate::lock;
use crate::rate_limit::{LIMIT_EXCEEDED, TokenBucket};
use anyhow::Result;
use kubelet_proto::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use kubelet_proto::podresources::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, CdiDevice, ClaimResource,
    ContainerDevices, ContainerResources, DynamicResource, GetPodResourcesRequest,
    GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};
use kubelet_proto::transport::{Connections, bind_unix, serve_unix};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{oneshot, watch};
use tonic::{Code, Request, Response, Status};

/// What a test can make every call meet before it is answered.
#[derive(Debug)]
struct Switches {
    /// The kubelet's token bucket; `None` only when a test turned it off.
    limiter: Mutex<Option<TokenBucket>>,
    /// The status every call fails with, when set.
    failing: Mutex<Option<Code>>,
    /// While true, every call waits.
    hang: watch::Sender<bool>,
    /// How many calls have been held by the hang switch so far.
    held: watch::Sender<usize>,
    /// The time the limiter sees instead of now, when set (this module's
    /// tests freeze it so that counts do not depend on the machine's speed).
    frozen: Mutex<Option<Instant>>,
    /// Calls that reached the server, of any method, refused ones included.
    calls: AtomicUsize,
    /// Calls the rate limit refused.
    refused: AtomicUsize,
}

impl Switches {
    fn new() -> Self {
        Self {
            limiter: Mutex::new(Some(TokenBucket::kubelet())),
            failing: Mutex::new(None),
            hang: watch::channel(false).0,
            held: watch::channel(0).0,
            frozen: Mutex::new(None),
            calls: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
        }
    }

    /// `LimiterUnaryServerInterceptor` (before the handler, for every
    /// unary method), then the test's failure and hang switches.
    async fn gate(&self) -> Result<(), Status> {
        let now = lock(&self.frozen).unwrap_or_else(Instant::now);
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let Some(bucket) = lock(&self.limiter).as_mut()
            && !bucket.allow(now)
        {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(LIMIT_EXCEEDED));
        }
        if *self.hang.borrow() {
            self.held.send_modify(|n| *n += 1);
            let mut rx = self.hang.subscribe();
            let _ = rx.wait_for(|h| !*h).await;
        }
        if let Some(code) = *lock(&self.failing) {
            return Err(Status::new(code, "the test made the PodResources API fail"));
        }
        Ok(())
    }
}

#[derive(Clone)]
struct PodResourcesService {
    allocated: Arc<Mutex<Vec<ContainerDevices>>>,
    others: Arc<Mutex<Vec<PodResources>>>,
    pod: Arc<Mutex<(String, String)>>,
    switches: Arc<Switches>,
}

impl PodResourcesService {
    fn new() -> Self {
        Self {
            allocated: Arc::new(Mutex::new(Vec::new())),
            others: Arc::new(Mutex::new(Vec::new())),
            pod: Arc::new(Mutex::new((TEST_POD.0.to_string(), TEST_POD.1.to_string()))),
            switches: Arc::new(Switches::new()),
        }
    }
}

#[tonic::async_trait]
impl PodResourcesLister for PodResourcesService {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.switches.gate().await?;
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
        self.switches.gate().await?;
        Ok(Response::new(AllocatableResourcesResponse::default()))
    }

    async fn get(
        &self,
        _: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        self.switches.gate().await?;
        // What kubelets without the KubeletPodResourcesGet feature gate
        // answer (pkg/kubelet/apis/podresources/server_v1.go).
        Err(Status::unknown(
            "PodResources API Get method disabled via feature gate",
        ))
    }
}

/// One device a DRA driver prepared for a claim, as the kubelet's DRA
/// manager keeps it in the claim's state (`NodePrepareResources`' answer:
/// pool, device and CDI device IDs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    /// The driver's name.
    pub driver: String,
    /// The device's pool.
    pub pool: String,
    /// The device's name in its pool.
    pub device: String,
    /// The CDI device IDs the driver answered for it.
    pub cdi_ids: Vec<String>,
}

/// A ResourceClaim the kubelet prepared for a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedClaim {
    /// The claim's name (for an extended resource request the scheduler's
    /// generated `<pod>-extended-resources-…`).
    pub name: String,
    /// The claim's namespace, the pod's.
    pub namespace: String,
    /// Its devices, in the driver's order.
    pub devices: Vec<PreparedDevice>,
}

/// The `dynamic_resources` the kubelet lists for a container using
/// `claims`, built as Kubernetes 1.37 builds them
/// (`pkg/kubelet/cm/container_manager_linux.go` `GetDynamicResources`,
/// served by `pkg/kubelet/apis/podresources/server_v1.go` `List`, from the
/// claim infos of `pkg/kubelet/cm/dra/manager.go`
/// `GetContainerClaimInfos`): one entry per claim; per driver, one
/// `ClaimResource` per device, whose `cdi_devices` list is the driver's
/// list so far, as the kubelet appends each device's CDI IDs to one list it
/// does not reset between the devices of a driver (so the second device's
/// entry repeats the first one's IDs). The kubelet walks the drivers of a
/// claim in Go's map order; here they come in order of first appearance.
pub fn dynamic_resources(claims: &[PreparedClaim]) -> Vec<DynamicResource> {
    claims
        .iter()
        .map(|claim| {
            let mut drivers: Vec<&str> = Vec::new();
            for d in &claim.devices {
                if !drivers.contains(&d.driver.as_str()) {
                    drivers.push(&d.driver);
                }
            }
            let mut claim_resources = Vec::new();
            for driver in drivers {
                let mut cdi_devices: Vec<CdiDevice> = Vec::new();
                for d in claim.devices.iter().filter(|d| d.driver == driver) {
                    cdi_devices.extend(d.cdi_ids.iter().map(|id| CdiDevice { name: id.clone() }));
                    claim_resources.push(ClaimResource {
                        cdi_devices: cdi_devices.clone(),
                        driver_name: d.driver.clone(),
                        pool_name: d.pool.clone(),
                        device_name: d.device.clone(),
                        share_id: None,
                    });
                }
            }
            DynamicResource {
                claim_name: claim.name.clone(),
                claim_namespace: claim.namespace.clone(),
                claim_resources,
            }
        })
        .collect()
}

/// The pod [`TestPodResources::set_allocated`] reports devices for:
/// (namespace, name), unless [`TestPodResources::set_pod`] names another.
pub const TEST_POD: (&str, &str) = ("default", "test-pod");

/// A PodResources API server reporting allocations the test sets, as the
/// kubelet's `List` does (kubernetes `pkg/kubelet/apis/podresources/
/// server_v1.go`): every pod the kubelet knows, each container with the
/// devices recorded for it at admission, so a pod whose sandbox is still
/// being set up is listed already (Multus relies on that at CNI ADD).
///
/// Every call first meets the kubelet's rate limit, on from the start as in
/// the kubelet (`pkg/kubelet/apis/podresources/grpc/ratelimit.go`: one token
/// bucket for all callers, 100 a second, burst 10; over it gRPC
/// `ResourceExhausted` "rejected by rate limit"); then the test's switches:
/// [`TestPodResources::fail`] and [`TestPodResources::hang`].
#[derive(Debug)]
pub struct TestPodResources {
    allocated: Arc<Mutex<Vec<ContainerDevices>>>,
    others: Arc<Mutex<Vec<PodResources>>>,
    pod: Arc<Mutex<(String, String)>>,
    switches: Arc<Switches>,
    stop: Option<oneshot::Sender<()>>,
}

impl TestPodResources {
    /// Serves on `socket` (usually `<kubelet dir>/pod-resources/kubelet.sock`).
    pub async fn start(socket: &Path) -> Result<Self> {
        if let Some(d) = socket.parent() {
            std::fs::create_dir_all(d)?;
        }
        let listener = bind_unix(socket)?;
        let service = PodResourcesService::new();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let this = Self {
            allocated: service.allocated.clone(),
            others: service.others.clone(),
            pod: service.pod.clone(),
            switches: service.switches.clone(),
            stop: Some(stop_tx),
        };
        let server = PodResourcesListerServer::new(service);
        tokio::spawn(serve_unix(
            server,
            listener,
            async move {
                let _ = stop_rx.await;
            },
            Connections::default(),
        ));
        Ok(this)
    }

    /// Replaces the rate limit with a full bucket of `burst` tokens refilled
    /// at `qps` a second (`TokenBucket::new(0.0, 0)` refuses every call);
    /// `None` turns it off. The kubelet's is [`TokenBucket::kubelet`].
    pub fn set_rate_limit(&self, bucket: Option<TokenBucket>) {
        *lock(&self.switches.limiter) = bucket;
    }

    /// Makes every call that passes the rate limit fail with `code` (a
    /// kubelet in trouble); `None` answers again.
    pub fn fail(&self, code: Option<Code>) {
        *lock(&self.switches.failing) = code;
    }

    /// While `hang` is true, every call that passes the rate limit waits
    /// without an answer (a stuck kubelet); false lets the waiting ones go on.
    pub fn hang(&self, hang: bool) {
        self.switches.hang.send_replace(hang);
    }

    /// How many calls the hang switch has held so far (also those whose
    /// caller has given up since).
    pub fn held(&self) -> usize {
        *self.switches.held.borrow()
    }

    /// How many calls have reached the server so far, of any method, those
    /// the rate limit refused included (a client's tries, counted where the
    /// kubelet would see them).
    pub fn calls(&self) -> usize {
        self.switches.calls.load(Ordering::Relaxed)
    }

    /// How many calls the rate limit has refused so far.
    pub fn refused(&self) -> usize {
        self.switches.refused.load(Ordering::Relaxed)
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
        self.add_pod_with_claims(namespace, name, devices, &[]);
    }

    /// [`TestPodResources::add_pod`], the `compute` container also using
    /// the prepared `claims`, listed as the kubelet lists them
    /// ([`dynamic_resources`]).
    pub fn add_pod_with_claims(
        &self,
        namespace: &str,
        name: &str,
        devices: &[(&str, &[&str])],
        claims: &[PreparedClaim],
    ) {
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
                    dynamic_resources: dynamic_resources(claims),
                    ..Default::default()
                },
            ],
        });
    }

    /// Removes pod `namespace/name` added by [`TestPodResources::add_pod`],
    /// as the kubelet forgets a deleted pod; whether it was there.
    pub fn remove_pod(&self, namespace: &str, name: &str) -> bool {
        let mut others = self.others.lock().unwrap_or_else(|e| e.into_inner());
        let before = others.len();
        others.retain(|p| !(p.namespace == namespace && p.name == name));
        others.len() != before
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
        // Held calls go on, so the server's graceful stop does not wait on them.
        self.switches.hang.send_replace(false);
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate_limit::TokenBucket;
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
        let service = PodResourcesService::new();
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

    async fn client(path: &Path) -> PodResourcesListerClient<tonic::transport::Channel> {
        PodResourcesListerClient::new(connect_unix(path, DIAL_TIMEOUT).await.unwrap())
    }

    /// The kubelet's limiter is on from the start: ten calls at once pass,
    /// the eleventh is refused as the kubelet refuses it, for any method;
    /// 10 ms later one more passes.
    #[tokio::test]
    async fn the_eleventh_call_at_once_is_rejected_by_rate_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.sock");
        let pr = TestPodResources::start(&path).await.unwrap();
        let t0 = Instant::now();
        *lock(&pr.switches.frozen) = Some(t0);
        let mut c = client(&path).await;
        for i in 0..5 {
            c.list(ListPodResourcesRequest {})
                .await
                .unwrap_or_else(|e| panic!("{i}: {e}"));
            c.get_allocatable_resources(AllocatableResourcesRequest {})
                .await
                .unwrap_or_else(|e| panic!("{i}: {e}"));
        }
        let err = c.list(ListPodResourcesRequest {}).await.unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
        assert_eq!(err.message(), "rejected by rate limit");
        let err = c.get(GetPodResourcesRequest::default()).await.unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
        *lock(&pr.switches.frozen) = Some(t0 + std::time::Duration::from_millis(10));
        c.list(ListPodResourcesRequest {}).await.unwrap();
        let err = c.list(ListPodResourcesRequest {}).await.unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
        // Every call counted where it arrived: 11 answered, 3 refused.
        assert_eq!((pr.calls(), pr.refused()), (14, 3));
    }

    #[test]
    fn dynamic_resources_repeat_a_drivers_earlier_cdi_ids_as_the_kubelet_does() {
        let device = |driver: &str, device: &str| PreparedDevice {
            driver: driver.into(),
            pool: "node-1".into(),
            device: device.into(),
            cdi_ids: vec![format!("{driver}/x={device}")],
        };
        let claims = [PreparedClaim {
            name: "vm-extended-resources-abcde".into(),
            namespace: "tenant-a".into(),
            devices: vec![device("a", "a0"), device("b", "b0"), device("a", "a1")],
        }];
        let listed = dynamic_resources(&claims);
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].claim_name, "vm-extended-resources-abcde");
        assert_eq!(listed[0].claim_namespace, "tenant-a");
        let seen: Vec<(&str, &str, Vec<&str>)> = listed[0]
            .claim_resources
            .iter()
            .map(|r| {
                (
                    r.driver_name.as_str(),
                    r.device_name.as_str(),
                    r.cdi_devices.iter().map(|c| c.name.as_str()).collect(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("a", "a0", vec!["a/x=a0"]),
                ("a", "a1", vec!["a/x=a0", "a/x=a1"]),
                ("b", "b0", vec!["b/x=b0"]),
            ]
        );
    }

    #[tokio::test]
    async fn a_bucket_without_tokens_refuses_and_none_lets_all_through() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.sock");
        let pr = TestPodResources::start(&path).await.unwrap();
        let mut c = client(&path).await;
        pr.set_rate_limit(Some(TokenBucket::new(0.0, 0)));
        let err = c.list(ListPodResourcesRequest {}).await.unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
        pr.set_rate_limit(None);
        for _ in 0..20 {
            c.list(ListPodResourcesRequest {}).await.unwrap();
        }
    }

    #[tokio::test]
    async fn the_failure_switch_fails_every_call_with_its_code() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.sock");
        let pr = TestPodResources::start(&path).await.unwrap();
        let mut c = client(&path).await;
        pr.fail(Some(Code::Internal));
        let err = c.list(ListPodResourcesRequest {}).await.unwrap_err();
        assert_eq!(err.code(), Code::Internal, "{err}");
        pr.fail(None);
        c.list(ListPodResourcesRequest {}).await.unwrap();
        // A failure that is not the rate limit's is a call, not a refusal.
        assert_eq!((pr.calls(), pr.refused()), (2, 0));
    }

    #[tokio::test]
    async fn the_hang_switch_holds_calls_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.sock");
        let pr = TestPodResources::start(&path).await.unwrap();
        let mut c = client(&path).await;
        pr.hang(true);
        let call = tokio::spawn(async move { c.list(ListPodResourcesRequest {}).await });
        let mut held = pr.switches.held.subscribe();
        tokio::time::timeout(DIAL_TIMEOUT, held.wait_for(|n| *n == 1))
            .await
            .unwrap()
            .unwrap();
        assert!(!call.is_finished(), "a held call has no answer");
        pr.hang(false);
        let answer = tokio::time::timeout(DIAL_TIMEOUT, call)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer.unwrap().into_inner().pod_resources.len(), 1);
        assert_eq!(pr.held(), 1);
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
