//! The DRA front's part of the daemon (`--front dra`): in place of the
//! kubelet registrations, it takes the resources that came and went from
//! the resources part, follows each one's state (its configuration and its
//! NIC's health), and hands the DRA front what it serves (for prepare) and
//! offers (for the ResourceSlices). It starts the front's two servers and
//! its slice publisher, and a registration the kubelet confirms syncs the
//! slices at once (a restarted kubelet deleted them).

use super::resources::Served;
use crate::config::ResourceConfig;
use crate::core::reclaim::Holding;
use crate::dra::cdi::CdiDir;
use crate::dra::health::HealthService;
use crate::dra::publish::{Publisher, publish_loop};
use crate::dra::server::{Claims, DraContext, DraServers, Registered};
use crate::dra::slices::Offered;
use crate::error::{Error, Result};
use crate::kubelet::context::ServerContext;
use crate::kubelet::server::ResourceState;
use crate::options::Options;
use kubelet_proto::v1beta1::UNHEALTHY;
use macvtap_link::device_id;
use macvtap_link::dra::dra_name_problem;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::StreamMap;
use tokio_stream::wrappers::WatchStream;
use tracing::{info, warn};

/// The taint value on the devices of a resource whose NIC is unhealthy
/// (the reason is in the daemon's log, metrics and Events).
const UNHEALTHY_REASON: &str = "nic_unhealthy";

/// The DRA front, running.
pub(super) struct DraPart {
    servers: DraServers,
    changes: mpsc::UnboundedSender<Vec<Served>>,
    tasks: Vec<JoinHandle<()>>,
}

impl DraPart {
    /// Starts the front on the daemon's shared state `ctx`: the CDI
    /// directory opened, the servers bound, the publisher and the
    /// resources' follower started. Needs the node's name and API access,
    /// without which no claim can be read and no slice published.
    pub(super) async fn start(opts: &Options, ctx: &ServerContext) -> Result<Self> {
        let node = opts
            .node_name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| Error::Config {
                source_name: "--front dra".into(),
                msg: "the DRA front needs the node's name (NODE_NAME, which the DaemonSet sets from spec.nodeName)".into(),
            })?;
        let client = api_client().await?;
        let cdi = CdiDir::open(&opts.cdi_dir)?;
        let (served_tx, served_rx) = watch::channel(Vec::new());
        let (offered_tx, offered_rx) = watch::channel(Vec::new());
        let (resync_tx, resync_rx) = mpsc::unbounded_channel();
        let (status_tx, mut status_rx) = mpsc::unbounded_channel::<Registered>();
        let dra_ctx = DraContext {
            host: ctx.host.clone(),
            served: served_rx,
            clock: ctx.clock.clone(),
            assignments: ctx.assignments.clone(),
            cdi: Arc::new(cdi),
            node: node.clone(),
            serial: Arc::new(Mutex::new(())),
            claims: Claims::new(client.clone()),
            observer: ctx.observer.clone(),
            inflight: ctx.inflight.clone(),
            holding: ctx.holding.clone(),
        };
        let health = HealthService::new(offered_rx.clone(), &node);
        let servers = DraServers::start(&opts.kubelet_dir, dra_ctx, health, status_tx)?;
        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(async move {
            while let Some(s) = status_rx.recv().await {
                if s.ok {
                    let _ = resync_tx.send(());
                }
            }
        }));
        tasks.push(tokio::spawn(publish_loop(
            Publisher::new(client, &node),
            offered_rx,
            resync_rx,
        )));
        let (changes, changes_rx) = mpsc::unbounded_channel();
        tasks.push(tokio::spawn(follow(
            changes_rx,
            ctx.holding.clone(),
            served_tx,
            offered_tx,
        )));
        info!(node = %node, "serving the macvtap resources through DRA");
        Ok(Self {
            servers,
            changes,
            tasks,
        })
    }

    /// The resources that came and went.
    pub(super) fn serve(&self, changes: Vec<Served>) {
        let _ = self.changes.send(changes);
    }

    /// Stops the follower and the publisher (the slices stay: a restarted
    /// daemon serves them again, and the kubelet deletes them 30 s after a
    /// driver is gone) and the servers, removing their sockets.
    pub(super) async fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        self.servers.stop().await;
    }
}

/// An API client from the environment (the pod's service account, else a
/// kubeconfig).
async fn api_client() -> Result<kube::Client> {
    let refuse = |msg: String| Error::Config {
        source_name: "--front dra".into(),
        msg,
    };
    let config = kube::Config::infer().await.map_err(|e| {
        refuse(format!(
            "the DRA front needs API access, and none is found: {e}"
        ))
    })?;
    kube::Client::try_from(config)
        .map_err(|e| refuse(format!("the DRA front's API client cannot be built: {e}")))
}

/// What `states` offer: each resource DRA can name (one it cannot is said
/// once, via `refused`), its NIC's health read from its devices, without
/// the devices that `plugin_held` (device IDs) says pods hold through the
/// device plugin front.
fn offered(
    states: &BTreeMap<String, ResourceState>,
    plugin_held: &HashSet<String>,
    refused: &mut BTreeSet<String>,
) -> Vec<Offered> {
    let mut out = Vec::new();
    for (name, st) in states {
        if let Some(why) = dra_name_problem(name) {
            if refused.insert(name.clone()) {
                warn!(resource = %name, reason = %why, "not served through DRA");
            }
            continue;
        }
        let unhealthy = st.devices.iter().any(|d| d.health == UNHEALTHY);
        let withheld = (0..st.config.capacity)
            .filter(|&i| plugin_held.contains(&device_id(name, i)))
            .collect();
        out.push(Offered {
            cfg: st.config.clone(),
            unhealthy: unhealthy.then_some(UNHEALTHY_REASON),
            withheld,
        });
    }
    out
}

/// Follows the served resources: their set from `changes`, each one's
/// state from its watch, and what pods hold from `holding`; after each
/// change, what is served goes to `served` and what is offered to
/// `offers`. Nothing is offered before the first reclaim round has asked
/// the kubelet what pods hold (a device the device plugin front handed out
/// before the node switched fronts is never offered). When the kubelet
/// cannot be asked, what it last said stands; if it never could be,
/// everything is offered, and that is said once. Ends when `changes`
/// closes.
async fn follow(
    mut changes: mpsc::UnboundedReceiver<Vec<Served>>,
    mut holding: watch::Receiver<Holding>,
    served: watch::Sender<Vec<ResourceConfig>>,
    offers: watch::Sender<Vec<Offered>>,
) {
    let mut streams: StreamMap<String, WatchStream<ResourceState>> = StreamMap::new();
    let mut states: BTreeMap<String, ResourceState> = BTreeMap::new();
    let mut refused = BTreeSet::new();
    let mut plugin_held: Option<HashSet<String>> = None;
    let mut holding_open = true;
    let mut said_unreadable = false;
    loop {
        tokio::select! {
            batch = changes.recv() => {
                let Some(batch) = batch else { return };
                for c in batch {
                    match c {
                        Served::New { name, state } => {
                            states.insert(name.clone(), state.borrow().clone());
                            streams.insert(name, WatchStream::from_changes(state));
                        }
                        Served::Gone { name } => {
                            streams.remove(&name);
                            states.remove(&name);
                            refused.remove(&name);
                        }
                    }
                }
            }
            Some((name, st)) = streams.next(), if !streams.is_empty() => {
                states.insert(name, st);
            }
            changed = holding.changed(), if holding_open => {
                if changed.is_err() {
                    holding_open = false;
                }
            }
        }
        match &*holding.borrow_and_update() {
            Holding::Unknown => {}
            Holding::Known(held) => {
                said_unreadable = false;
                plugin_held = Some(held.plugin_ids().clone());
            }
            Holding::Unreadable => {
                if !std::mem::replace(&mut said_unreadable, true) {
                    warn!(
                        "PodResources cannot be read: devices the device plugin front handed out before this node switched to DRA cannot be left out of the ResourceSlices"
                    );
                }
                plugin_held.get_or_insert_with(HashSet::new);
            }
        }
        let Some(plugin_held) = &plugin_held else {
            continue;
        };
        let now = offered(&states, plugin_held, &mut refused);
        let configs: Vec<ResourceConfig> = now.iter().map(|o| o.cfg.clone()).collect();
        served.send_if_modified(|cur| {
            let changed = *cur != configs;
            *cur = configs;
            changed
        });
        offers.send_if_modified(|cur| {
            let changed = *cur != now;
            *cur = now;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::reclaim::Held;
    use kubelet_proto::v1beta1::{Device, HEALTHY};

    fn state(name: &str, health: &str) -> ResourceState {
        ResourceState {
            config: ResourceConfig::for_nic(name),
            devices: vec![Device {
                id: format!("{name}Mvp0"),
                health: health.into(),
                ..Default::default()
            }],
        }
    }

    #[tokio::test]
    async fn what_is_offered_follows_the_resources_and_their_health() {
        let (tx, rx) = mpsc::unbounded_channel();
        let (served_tx, mut served) = watch::channel(Vec::new());
        let (offers_tx, mut offers) = watch::channel(Vec::new());
        let (holding_tx, holding) = watch::channel(Holding::Unknown);
        let task = tokio::spawn(follow(rx, holding, served_tx, offers_tx));
        let (eth1_tx, eth1_rx) = watch::channel(state("eth1", HEALTHY));
        let long = "a".repeat(40);
        let (_long_tx, long_rx) = watch::channel(state(&long, HEALTHY));
        tx.send(vec![
            Served::New {
                name: "eth1".into(),
                state: eth1_rx,
            },
            Served::New {
                name: long.clone(),
                state: long_rx,
            },
        ])
        .unwrap();
        // Nothing before the kubelet was asked what pods hold.
        tokio::task::yield_now().await;
        assert!(offers.borrow().is_empty());
        assert!(served.borrow().is_empty());
        holding_tx.send(Holding::Known(Held::default())).unwrap();
        let first = offers.wait_for(|o| !o.is_empty()).await.unwrap().clone();
        assert_eq!(first.len(), 1, "a name DRA cannot carry is not offered");
        assert_eq!(first[0].cfg.name, "eth1");
        assert_eq!(first[0].unhealthy, None);
        assert_eq!(
            served.wait_for(|s| s.len() == 1).await.unwrap()[0].name,
            "eth1"
        );
        eth1_tx.send(state("eth1", UNHEALTHY)).unwrap();
        let down = offers
            .wait_for(|o| o.first().is_some_and(|o| o.unhealthy.is_some()))
            .await
            .unwrap()
            .clone();
        assert_eq!(down[0].unhealthy, Some(UNHEALTHY_REASON));
        // A device a pod holds through the device plugin front is withheld.
        let resp =
            crate::testdata::pod_with_devices(&[("macvtap.network.kubevirt.io/eth1", "eth1Mvp0")]);
        holding_tx
            .send(Holding::Known(Held::from_response(&resp)))
            .unwrap();
        let withheld = offers
            .wait_for(|o| o.first().is_some_and(|o| !o.withheld.is_empty()))
            .await
            .unwrap()
            .clone();
        assert_eq!(withheld[0].withheld, BTreeSet::from([0]));
        assert_eq!(withheld[0].indices().next(), Some(1));
        tx.send(vec![Served::Gone {
            name: "eth1".into(),
        }])
        .unwrap();
        offers.wait_for(|o| o.is_empty()).await.unwrap();
        drop(tx);
        task.await.unwrap();
    }
}
