//! Keeps the node's published ResourceSlices saying what the node offers:
//! after every change of the offered resources (their set or a NIC's
//! health), after the kubelet registers the driver (a restarted kubelet
//! deletes the node's slices, kubernetes `pkg/kubelet/cm/dra/manager.go`),
//! and every [`RESYNC`] in case a write was lost, the slices of our
//! driver and node are listed and [`super::slices::plan`]'s writes made.
//! A failed sync is tried again with a back-off of up to [`MAX_BACKOFF`].

use super::slices::{Change, Offered, devices, plan};
use crate::error::{Error, Result};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use macvtap_link::dra::DRIVER;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

/// How often the slices are checked without a reason.
pub const RESYNC: Duration = Duration::from_secs(300);

/// The longest pause between two failed syncs.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Writes the node's slices through the API server.
#[derive(Clone)]
pub struct Publisher {
    api: Api<ResourceSlice>,
    node: String,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

fn api_error(op: String) -> impl FnOnce(kube::Error) -> Error {
    move |e| Error::Api {
        op,
        msg: e.to_string(),
    }
}

impl Publisher {
    /// A publisher of `node`'s slices through `client`.
    pub fn new(client: kube::Client, node: &str) -> Self {
        Self {
            api: Api::all(client),
            node: node.to_string(),
        }
    }

    /// Makes the published slices say `offered`; returns how many writes
    /// that took (0 when they already did).
    pub async fn sync(&self, offered: &[Offered]) -> Result<usize> {
        let node = &self.node;
        let lp =
            ListParams::default().fields(&format!("spec.nodeName={node},spec.driver={DRIVER}"));
        let published = self
            .api
            .list(&lp)
            .await
            .map_err(api_error(format!(
                "listing the ResourceSlices of node {node}"
            )))?
            .items;
        let changes = plan(node, &published, devices(offered));
        let pp = PostParams::default();
        for c in &changes {
            match c {
                Change::Create(s) => {
                    let name = s.metadata.name.clone().unwrap_or_default();
                    self.api
                        .create(&pp, s)
                        .await
                        .map_err(api_error(format!("creating ResourceSlice {name}")))?;
                }
                Change::Replace(s) => {
                    let name = s.metadata.name.clone().unwrap_or_default();
                    self.api
                        .replace(&name, &pp, s)
                        .await
                        .map_err(api_error(format!("replacing ResourceSlice {name}")))?;
                }
                Change::Delete(name) => match self.api.delete(name, &DeleteParams::default()).await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(api_error(format!("deleting ResourceSlice {name}"))(e)),
                },
            }
        }
        Ok(changes.len())
    }

    /// Removes every slice of our driver and node (a clean exit's, so the
    /// scheduler stops offering devices nobody prepares).
    pub async fn withdraw(&self) -> Result<()> {
        let node = &self.node;
        let lp =
            ListParams::default().fields(&format!("spec.nodeName={node},spec.driver={DRIVER}"));
        let published = self.api.list(&lp).await.map_err(api_error(format!(
            "listing the ResourceSlices of node {node}"
        )))?;
        for s in published {
            if let Some(name) = s.metadata.name {
                match self.api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(api_error(format!("deleting ResourceSlice {name}"))(e)),
                }
            }
        }
        Ok(())
    }
}

/// Keeps `publisher`'s slices saying what `offered` holds, until `offered`'s
/// sender is dropped; a message on `resync` syncs at once.
pub async fn publish_loop(
    publisher: Publisher,
    mut offered: watch::Receiver<Vec<Offered>>,
    mut resync: mpsc::UnboundedReceiver<()>,
) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let current = offered.borrow_and_update().clone();
        let wait = match publisher.sync(&current).await {
            Ok(0) => {
                debug!("the ResourceSlices say what the node offers");
                backoff = Duration::from_secs(1);
                RESYNC
            }
            Ok(n) => {
                info!(
                    writes = n,
                    resources = current.len(),
                    "published the node's ResourceSlices"
                );
                backoff = Duration::from_secs(1);
                RESYNC
            }
            Err(e) => {
                warn!(error = %e, retry_s = backoff.as_secs(), "cannot publish the node's ResourceSlices");
                let w = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                w
            }
        };
        tokio::select! {
            changed = offered.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            Some(()) = resync.recv() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
