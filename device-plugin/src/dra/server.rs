//! The DRA front's two gRPC servers, which only translate: the kubelet
//! plugin registration service on `<kubelet dir>/plugins_registry/
//! macvtap.network.kubevirt.io-reg.sock`, and the `v1.DRAPlugin` service on
//! `<kubelet dir>/plugins/macvtap.network.kubevirt.io/dra.sock`, whose
//! prepare and unprepare forward to [`super::prepare::Front`] on a blocking
//! thread, one claim after another.
//!
//! The socket names and the answer to `GetInfo` are those of the kubelet's
//! own helper (kubernetes/dynamic-resource-allocation
//! `kubeletplugin/draplugin.go`, `registrationserver.go`): the kubelet's
//! plugin watcher finds the registration socket, asks what it is, dials the
//! endpoint it names and calls the first service version it supports
//! (kubernetes `pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go`).
//! The plugin watcher sends the socket's path as `:authority`, which
//! hyper refuses: both servers take their connections through
//! `kubelet_proto::authority` (found on the real 1.37 kubelet: `GetInfo`
//! reset with `PROTOCOL_ERROR`, the driver never registered).

use super::cdi::{CdiDir, Prepared};
use super::health::HealthService;
use super::prepare::{Front, answer};
use crate::config::ResourceConfig;
use crate::core::host::SharedHost;
use crate::core::inflight::InFlight;
use crate::core::ledger::{AllocationClock, Assignments};
use crate::core::reclaim::Holding;
use crate::core::report::Observer;
use crate::error::{Error, Result};
pub use crate::options::{dra_socket, registration_socket};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kubelet_proto::authority::serve_unix_any_authority;
use kubelet_proto::dra::health::v1::dra_resource_health_server::DraResourceHealthServer;
use kubelet_proto::dra::v1::dra_plugin_server::{DraPlugin, DraPluginServer};
use kubelet_proto::dra::v1::{
    Claim, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use kubelet_proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use kubelet_proto::pluginregistration::{
    DRA_PLUGIN, InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use kubelet_proto::routes::Pair;
use kubelet_proto::transport::{Connections, bind_unix, error_chain};
use macvtap_link::dra::DRIVER;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

/// What the kubelet said of our registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// Whether it registered the plugin.
    pub ok: bool,
    /// Its error when it did not.
    pub error: String,
}

/// Reads a ResourceClaim from the API server.
#[derive(Clone)]
pub struct Claims {
    client: kube::Client,
}

impl std::fmt::Debug for Claims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Claims")
    }
}

impl Claims {
    /// Claims read with `client`.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    /// The claim `namespace/name`.
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim> {
        let api: kube::Api<ResourceClaim> = kube::Api::namespaced(self.client.clone(), namespace);
        api.get(name).await.map_err(|e| Error::Api {
            op: format!("getting ResourceClaim {namespace}/{name}"),
            msg: e.to_string(),
        })
    }
}

/// What the DRA service works with, shared with the daemon.
#[derive(Debug, Clone)]
pub(crate) struct DraContext {
    /// The host the macvtaps are made on.
    pub host: Arc<SharedHost<'static>>,
    /// The resources this node serves through DRA now.
    pub served: watch::Receiver<Vec<ResourceConfig>>,
    /// The leak clock prepare restarts.
    pub clock: AllocationClock,
    /// Which `/dev/tapN` each device was handed out as.
    pub assignments: Assignments,
    /// The runtime's CDI directory, the record of prepared claims.
    pub cdi: Arc<CdiDir>,
    /// This node's name, its pool's.
    pub node: String,
    /// Serialises prepares and unprepares.
    pub serial: Arc<Mutex<()>>,
    /// Where claims are read.
    pub claims: Claims,
    /// Where each prepare's outcome is reported.
    pub observer: Arc<dyn Observer>,
    /// The gate each prepare and unprepare passes, closed by a clean exit.
    pub inflight: InFlight,
    /// What pods hold, as the reclaim rounds are told.
    pub holding: watch::Receiver<Holding>,
}

impl DraContext {
    /// Runs `f` on a front over this context, on a blocking thread.
    async fn on_front<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Front<'_, '_>) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let ctx = self.clone();
        tokio::task::spawn_blocking(move || {
            let served = ctx.served.borrow().clone();
            let plugin_held = match &*ctx.holding.borrow() {
                Holding::Known(held) => held.plugin_ids().clone(),
                Holding::Unknown | Holding::Unreadable => Default::default(),
            };
            let front = Front {
                host: &ctx.host,
                served: &served,
                clock: &ctx.clock,
                assignments: &ctx.assignments,
                cdi: &ctx.cdi,
                pool: &ctx.node,
                serial: &ctx.serial,
                plugin_held: &plugin_held,
            };
            f(&front)
        })
        .await
        .map_err(|e| Error::Task(format!("a DRA task failed: {e}")))?
    }

    /// Prepares one claim: from its spec if it was prepared before, else
    /// read from the API server and handed out.
    async fn prepare_one(&self, claim: &Claim) -> Result<Vec<Prepared>> {
        let uid = claim.uid.clone();
        let recorded = {
            let uid = uid.clone();
            self.on_front(move |f| Ok(f.cdi.read(&uid)?.is_some()))
                .await?
        };
        let fetched = if recorded {
            None
        } else {
            Some(self.claims.get(&claim.namespace, &claim.name).await?)
        };
        self.on_front(move |f| {
            f.prepare(&uid, || {
                fetched
                    .ok_or_else(|| Error::Task("a claim's spec went away between two reads".into()))
            })
        })
        .await
    }

    /// Reports a prepare's outcome per resource.
    fn report(&self, took: std::time::Duration, result: &Result<Vec<Prepared>>) {
        match result {
            Ok(devices) => {
                let mut by_resource: BTreeMap<&str, Vec<String>> = BTreeMap::new();
                for d in devices {
                    by_resource
                        .entry(d.resource.as_str())
                        .or_default()
                        .push(d.device_id.clone());
                }
                for (resource, ids) in by_resource {
                    let full = format!("{}/{resource}", macvtap_link::RESOURCE_PREFIX);
                    self.observer.handed_out(&full, &ids, took, Instant::now());
                }
            }
            Err(e) => self.observer.refused(DRIVER, took, e),
        }
    }
}

/// The `v1.DRAPlugin` service.
#[derive(Debug, Clone)]
pub(crate) struct DraService {
    ctx: DraContext,
}

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> std::result::Result<Response<NodePrepareResourcesResponse>, Status> {
        let Some(_pass) = self.ctx.inflight.enter().await else {
            return Err(Status::unavailable(
                "the macvtap DRA driver is exiting; no device is prepared",
            ));
        };
        let mut claims = std::collections::HashMap::new();
        for claim in request.into_inner().claims {
            let started = Instant::now();
            let result = self.ctx.prepare_one(&claim).await;
            self.ctx.report(started.elapsed(), &result);
            let answer = match result {
                Ok(devices) => {
                    info!(claim = %format!("{}/{}", claim.namespace, claim.name), claim_uid = %claim.uid, devices = devices.len(), "claim prepared");
                    NodePrepareResourceResponse {
                        devices: answer(&claim.uid, &self.ctx.node, &devices),
                        error: String::new(),
                    }
                }
                Err(e) => {
                    warn!(claim = %format!("{}/{}", claim.namespace, claim.name), claim_uid = %claim.uid, error = %e, "claim not prepared");
                    NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: e.to_string(),
                    }
                }
            };
            claims.insert(claim.uid, answer);
        }
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> std::result::Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let Some(_pass) = self.ctx.inflight.enter().await else {
            return Err(Status::unavailable(
                "the macvtap DRA driver is exiting; no device is unprepared",
            ));
        };
        let mut claims = std::collections::HashMap::new();
        for claim in request.into_inner().claims {
            let uid = claim.uid.clone();
            let result = self.ctx.on_front(move |f| f.unprepare(&uid)).await;
            let error = match result {
                Ok(()) => {
                    info!(claim = %format!("{}/{}", claim.namespace, claim.name), claim_uid = %claim.uid, "claim unprepared");
                    String::new()
                }
                Err(e) => {
                    warn!(claim = %format!("{}/{}", claim.namespace, claim.name), claim_uid = %claim.uid, error = %e, "claim not unprepared");
                    e.to_string()
                }
            };
            claims.insert(claim.uid, NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

/// The plugin registration service.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    endpoint: PathBuf,
    status: mpsc::UnboundedSender<Registered>,
}

/// The kubelet's `GetInfo` answer for a DRA driver serving on `endpoint`.
pub fn plugin_info(endpoint: &Path) -> PluginInfo {
    PluginInfo {
        r#type: DRA_PLUGIN.to_string(),
        name: DRIVER.to_string(),
        endpoint: endpoint.to_string_lossy().into_owned(),
        supported_versions: vec![
            kubelet_proto::dra::v1::SERVICE.to_string(),
            kubelet_proto::dra::health::v1::SERVICE.to_string(),
        ],
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(
        &self,
        _: Request<InfoRequest>,
    ) -> std::result::Result<Response<PluginInfo>, Status> {
        Ok(Response::new(plugin_info(&self.endpoint)))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> std::result::Result<Response<RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        if s.plugin_registered {
            info!(driver = DRIVER, "the kubelet registered the DRA driver");
        } else {
            warn!(driver = DRIVER, error = %s.error, "the kubelet refused the DRA driver's registration");
        }
        let _ = self.status.send(Registered {
            ok: s.plugin_registered,
            error: s.error,
        });
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// The two servers, running.
#[derive(Debug)]
pub(crate) struct DraServers {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    sockets: Vec<PathBuf>,
}

impl DraServers {
    /// Binds and serves the DRA service and the device health service
    /// `health` on [`dra_socket`] and then the registration service on
    /// [`registration_socket`] (last, so the kubelet never finds a
    /// registration whose endpoint is not served yet); what the kubelet
    /// says of the registration goes to `status`.
    pub fn start(
        kubelet_dir: &Path,
        ctx: DraContext,
        health: HealthService,
        status: mpsc::UnboundedSender<Registered>,
    ) -> Result<Self> {
        let dra = dra_socket(kubelet_dir);
        let reg = registration_socket(kubelet_dir);
        for socket in [&dra, &reg] {
            if let Some(dir) = socket.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(Error::io("making the socket directory", dir))?;
            }
        }
        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();
        let wait = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let listener = bind_unix(&dra)?;
        let svc = Pair::new(
            DraResourceHealthServer::new(health),
            DraPluginServer::new(DraService { ctx }),
        );
        let (path, until) = (dra.clone(), wait(stopped.clone()));
        tasks.push(tokio::spawn(async move {
            if let Err(e) = serve_unix_any_authority(svc, listener, until, Connections::default()).await {
                warn!(socket = %path.display(), error = %error_chain(&e), "the DRA server ended with an error");
            }
        }));
        let listener = bind_unix(&reg)?;
        let svc = RegistrationServer::new(RegistrationService {
            endpoint: dra.clone(),
            status,
        });
        let (path, until) = (reg.clone(), wait(stopped));
        tasks.push(tokio::spawn(async move {
            if let Err(e) = serve_unix_any_authority(svc, listener, until, Connections::default()).await {
                warn!(socket = %path.display(), error = %error_chain(&e), "the DRA registration server ended with an error");
            }
        }));
        info!(dra = %dra.display(), registration = %reg.display(), "serving the DRA driver");
        Ok(Self {
            stop,
            tasks,
            sockets: vec![reg, dra],
        })
    }

    /// Stops serving and removes the sockets, the registration's first.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        for s in &self.sockets {
            let _ = std::fs::remove_file(s);
        }
        info!("stopped serving the DRA driver");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::host::HostPaths;
    use crate::core::report::Silent;
    use kubelet_proto::dra::health::v1::dra_resource_health_client::DraResourceHealthClient;
    use kubelet_proto::dra::health::v1::{HealthStatus, NodeWatchResourcesRequest};
    use kubelet_proto::dra::v1::dra_plugin_client::DraPluginClient;
    use kubelet_proto::pluginregistration::registration_client::RegistrationClient;
    use kubelet_proto::transport::connect_unix;
    use std::time::Duration;
    use test_support::fake::FakeKernel;

    fn claim(uid: &str) -> Claim {
        Claim {
            namespace: "default".into(),
            uid: uid.into(),
            name: format!("claim-{uid}"),
        }
    }

    /// The two servers on real unix sockets, called as the kubelet calls
    /// them: registration, then prepare and unprepare. The claim `u-1` was
    /// prepared before (its spec is there), so it is answered without the
    /// API server; `u-2` was not, and the API server (none listens at the
    /// client's address) cannot be asked: its error is in the answer, as
    /// the kubelet expects per claim, and nothing else fails.
    #[tokio::test]
    async fn the_kubelet_registers_the_driver_and_prepares_and_unprepares_over_its_sockets() {
        let tmp = tempfile::tempdir().unwrap();
        let kubelet_dir = tmp.path().join("kubelet");
        let cdi = CdiDir::open(&tmp.path().join("cdi")).unwrap();
        let recorded = Prepared {
            request_names: vec!["container-0-request-0".into()],
            resource: "eth1".into(),
            device_id: "eth1Mvp2".into(),
            device_name: "eth1-mvp-2".into(),
            node: PathBuf::from("/dev/tap17"),
        };
        cdi.write("u-1", &super::super::cdi::spec("u-1", &[recorded]))
            .unwrap();
        let kernel: &'static FakeKernel = Box::leak(Box::new(FakeKernel::new()));
        let nowhere = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let (_served_tx, served) = watch::channel(vec![ResourceConfig {
            capacity: 4,
            ..ResourceConfig::for_nic("eth1")
        }]);
        let ctx = DraContext {
            host: Arc::new(SharedHost::new(kernel, HostPaths::default())),
            served,
            clock: AllocationClock::default(),
            assignments: Assignments::default(),
            cdi: Arc::new(cdi),
            node: "node-1".into(),
            serial: Arc::new(Mutex::new(())),
            claims: Claims::new(kube::Client::try_from(nowhere).unwrap()),
            observer: Arc::new(Silent),
            inflight: InFlight::default(),
            holding: watch::channel(Holding::Unknown).1,
        };
        let cdi = ctx.cdi.clone();
        let (status_tx, mut status) = mpsc::unbounded_channel();
        let (_offers_tx, offers) = watch::channel(vec![super::super::slices::Offered {
            cfg: ResourceConfig {
                capacity: 4,
                ..ResourceConfig::for_nic("eth1")
            },
            unhealthy: Some("nic_down"),
            withheld: Default::default(),
        }]);
        let health = HealthService::new(offers, "node-1");
        let servers = DraServers::start(&kubelet_dir, ctx, health, status_tx).unwrap();

        let wait = Duration::from_secs(10);
        let channel = connect_unix(&registration_socket(&kubelet_dir), wait)
            .await
            .unwrap();
        let mut reg = RegistrationClient::new(channel);
        let info = reg.get_info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info, plugin_info(&dra_socket(&kubelet_dir)));
        reg.notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
        assert_eq!(
            status.recv().await,
            Some(Registered {
                ok: true,
                error: String::new()
            })
        );

        let channel = connect_unix(Path::new(&info.endpoint), wait).await.unwrap();
        let mut watch = DraResourceHealthClient::new(channel.clone())
            .node_watch_resources(NodeWatchResourcesRequest {})
            .await
            .unwrap()
            .into_inner();
        let first = watch.message().await.unwrap().unwrap();
        assert_eq!(first.devices.len(), 4, "{first:?}");
        assert!(
            first
                .devices
                .iter()
                .all(|d| d.health == HealthStatus::Unhealthy as i32),
            "{first:?}"
        );
        drop(watch);
        let mut dra = DraPluginClient::new(channel);
        let prepared = dra
            .node_prepare_resources(NodePrepareResourcesRequest {
                claims: vec![claim("u-1"), claim("u-2")],
            })
            .await
            .unwrap()
            .into_inner();
        let one = &prepared.claims["u-1"];
        assert_eq!(one.error, "");
        assert_eq!(one.devices.len(), 1);
        assert_eq!(one.devices[0].pool_name, "node-1");
        assert_eq!(one.devices[0].device_name, "eth1-mvp-2");
        assert_eq!(
            one.devices[0].cdi_device_ids,
            ["macvtap.network.kubevirt.io/tap=u-1_eth1Mvp2"]
        );
        let two = &prepared.claims["u-2"];
        assert!(two.devices.is_empty());
        assert!(
            two.error
                .contains("getting ResourceClaim default/claim-u-2"),
            "{}",
            two.error
        );

        let unprepared = dra
            .node_unprepare_resources(NodeUnprepareResourcesRequest {
                claims: vec![claim("u-1")],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(unprepared.claims["u-1"].error, "");
        assert!(cdi.claims().unwrap().is_empty());

        servers.stop().await;
        assert!(!registration_socket(&kubelet_dir).exists());
        assert!(!dra_socket(&kubelet_dir).exists());
    }

    #[test]
    fn the_sockets_and_the_info_are_the_kubelet_helpers() {
        let dir = Path::new("/var/lib/kubelet");
        assert_eq!(
            dra_socket(dir),
            Path::new("/var/lib/kubelet/plugins/macvtap.network.kubevirt.io/dra.sock")
        );
        assert_eq!(
            registration_socket(dir),
            Path::new("/var/lib/kubelet/plugins_registry/macvtap.network.kubevirt.io-reg.sock")
        );
        let info = plugin_info(&dra_socket(dir));
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, "macvtap.network.kubevirt.io");
        assert_eq!(
            info.endpoint,
            "/var/lib/kubelet/plugins/macvtap.network.kubevirt.io/dra.sock"
        );
        assert_eq!(
            info.supported_versions,
            ["v1.DRAPlugin", "v1.DRAResourceHealth"]
        );
    }
}
