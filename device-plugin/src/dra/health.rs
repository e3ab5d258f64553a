//! The DRA front's device health for the kubelet (KEP-4680): the
//! `v1.DRAResourceHealth` service's `NodeWatchResources` stream, served on
//! the DRA socket beside the DRAPlugin service.
//!
//! Each message is the whole list of the pool's devices, as the API asks
//! (kubernetes/kubelet `pkg/apis/dra-health/v1/api.proto`): a device of a
//! resource whose NIC is unhealthy is `UNHEALTHY` with the reason, every
//! other one `HEALTHY`. The kubelet takes a device it has not heard of for
//! [`TIMEOUT_SECS`] as `UNKNOWN` (kubernetes `pkg/kubelet/cm/dra/
//! healthinfo.go`), so the list is sent again every [`RESEND`] as well as
//! on each change. The kubelet shows the health in the status of containers
//! whose claims name our devices (`allocatedResourcesStatus`); a container
//! that got them through an extended resource request has no claims of its
//! own and shows none (kubernetes `pkg/kubelet/cm/dra/manager.go`,
//! `UpdateAllocatedResourcesStatus`).

use super::slices::Offered;
use kubelet_proto::dra::health::v1::dra_resource_health_server::DraResourceHealth;
use kubelet_proto::dra::health::v1::{
    DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesRequest,
    NodeWatchResourcesResponse,
};
use macvtap_link::dra::dra_device_name;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// How long the kubelet trusts a device's health without a new report.
pub const TIMEOUT_SECS: i64 = 90;

/// How often the whole list is sent again when nothing changed: a third of
/// [`TIMEOUT_SECS`], so two reports can be lost before the kubelet says
/// `UNKNOWN`.
pub const RESEND: Duration = Duration::from_secs(30);

/// The health of every device `offers` publish in pool `pool`, as of Unix
/// time `now`.
pub fn report(offers: &[Offered], pool: &str, now: i64) -> NodeWatchResourcesResponse {
    let mut devices = Vec::new();
    for o in offers {
        let (health, message) = match o.unhealthy {
            None => (HealthStatus::Healthy, String::new()),
            Some(reason) => (
                HealthStatus::Unhealthy,
                format!(
                    "{reason}: NIC {} of macvtap resource {} is down, missing or has a master; \
                     no new claim is given its devices",
                    o.cfg.lower_device, o.cfg.name
                ),
            ),
        };
        for i in o.indices() {
            devices.push(DeviceHealth {
                device: Some(DeviceIdentifier {
                    pool_name: pool.to_string(),
                    device_name: dra_device_name(&o.cfg.name, i),
                }),
                health: health as i32,
                last_updated_time: now,
                health_check_timeout_seconds: TIMEOUT_SECS,
                message: message.clone(),
            });
        }
    }
    NodeWatchResourcesResponse { devices }
}

/// Seconds since the Unix epoch.
fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The `v1.DRAResourceHealth` service over what the front offers.
#[derive(Debug, Clone)]
pub struct HealthService {
    offers: watch::Receiver<Vec<Offered>>,
    pool: String,
}

impl HealthService {
    /// The service for pool `pool`, following `offers`.
    pub fn new(offers: watch::Receiver<Vec<Offered>>, pool: &str) -> Self {
        Self {
            offers,
            pool: pool.to_string(),
        }
    }
}

/// Sends the report to `tx` now, on every change of `offers` and every
/// [`RESEND`], until the kubelet hangs up or `offers` ends.
async fn stream_reports(
    mut offers: watch::Receiver<Vec<Offered>>,
    pool: String,
    tx: mpsc::Sender<Result<NodeWatchResourcesResponse, Status>>,
) {
    let mut tick = tokio::time::interval(RESEND);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is at once: the loop sends then
    loop {
        let r = report(&offers.borrow_and_update(), &pool, unix_now());
        if tx.send(Ok(r)).await.is_err() {
            return;
        }
        tokio::select! {
            changed = offers.changed() => if changed.is_err() { return },
            _ = tick.tick() => {}
            () = tx.closed() => return,
        }
    }
}

#[tonic::async_trait]
impl DraResourceHealth for HealthService {
    type NodeWatchResourcesStream =
        Pin<Box<dyn Stream<Item = Result<NodeWatchResourcesResponse, Status>> + Send + 'static>>;

    async fn node_watch_resources(
        &self,
        _: Request<NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(stream_reports(self.offers.clone(), self.pool.clone(), tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ResourceConfig;

    fn offer(nic: &str, capacity: u32, unhealthy: Option<&'static str>) -> Offered {
        Offered {
            cfg: ResourceConfig {
                capacity,
                ..ResourceConfig::for_nic(nic)
            },
            unhealthy,
            withheld: Default::default(),
        }
    }

    fn names_and_health(r: &NodeWatchResourcesResponse) -> Vec<(String, String, i32)> {
        r.devices
            .iter()
            .map(|d| {
                let id = d.device.clone().unwrap();
                (id.pool_name, id.device_name, d.health)
            })
            .collect()
    }

    #[test]
    fn every_device_is_reported_with_its_nic_health() {
        let r = report(
            &[offer("eth1", 2, None), offer("eth2", 1, Some("nic_down"))],
            "node-1",
            1_700_000_000,
        );
        assert_eq!(
            names_and_health(&r),
            vec![
                (
                    "node-1".into(),
                    "eth1-mvp-0".into(),
                    HealthStatus::Healthy as i32
                ),
                (
                    "node-1".into(),
                    "eth1-mvp-1".into(),
                    HealthStatus::Healthy as i32
                ),
                (
                    "node-1".into(),
                    "eth2-mvp-0".into(),
                    HealthStatus::Unhealthy as i32
                ),
            ]
        );
        assert!(
            r.devices
                .iter()
                .all(|d| d.last_updated_time == 1_700_000_000
                    && d.health_check_timeout_seconds == TIMEOUT_SECS)
        );
        assert_eq!(r.devices[0].message, "");
        assert!(
            r.devices[2].message.starts_with("nic_down: NIC eth2 ")
                && r.devices[2].message.len() <= 1024,
            "{}",
            r.devices[2].message
        );
    }

    /// The stream sends the list at once and again on a change, and ends
    /// when the kubelet stops reading.
    #[tokio::test]
    async fn the_stream_follows_the_offers() {
        let (offers_tx, offers) = watch::channel(vec![offer("eth1", 1, None)]);
        let svc = HealthService::new(offers, "node-1");
        let mut stream = svc
            .node_watch_resources(Request::new(NodeWatchResourcesRequest {}))
            .await
            .unwrap()
            .into_inner();
        use tokio_stream::StreamExt;
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(first.devices[0].health, HealthStatus::Healthy as i32);
        offers_tx
            .send(vec![offer("eth1", 1, Some("nic_down"))])
            .unwrap();
        let second = stream.next().await.unwrap().unwrap();
        assert_eq!(second.devices[0].health, HealthStatus::Unhealthy as i32);
        drop(stream);
        drop(svc);
        offers_tx.closed().await;
    }
}
