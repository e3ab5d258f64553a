//! The daemon's own Node, read from the API server: its InternalIP, whose
//! NIC `spare` auto-discovery never offers (`crate::core::nic::usage`),
//! and its labels, which configured resources' node selectors match
//! (`crate::core::nic::select`), live: a label set or removed serves or
//! withdraws a resource at once.
//!
//! A watch of the one Node (a field selector on its name) runs from the
//! moment the configuration first needs it ([`NodeWatch::ensure`]), so a
//! configuration that never does (explicit resources, the Go project's
//! auto-discovery) never reads a Node. Each change of what is known is
//! sent to the daemon loop as a [`NodeView`]. Without `NODE_NAME` or API
//! access, or while the API server refuses (the RBAC of
//! `manifests/base/rbac.yaml` grants `list` and `watch` of Nodes), the view
//! says why the Node is unknown, and the refusal is logged once; once
//! read, what was read stays while the watch reconnects.

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tracing::{info, warn};

/// What the daemon uses of its Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NodeFacts {
    /// The addresses of type `InternalIP` in its `status.addresses`.
    pub internal_ips: Vec<IpAddr>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// What is known of the Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeView {
    /// Nothing asked for it yet.
    NotAsked,
    /// It cannot be read, and why (a phrase).
    Unknown(String),
    /// As last read.
    Known(NodeFacts),
}

impl NodeView {
    /// The Node's InternalIPs, when known.
    pub(crate) fn internal_ips(&self) -> Option<Vec<IpAddr>> {
        match self {
            NodeView::Known(f) => Some(f.internal_ips.clone()),
            NodeView::NotAsked | NodeView::Unknown(_) => None,
        }
    }
}

/// What the daemon uses of `node`.
pub(crate) fn facts(node: &Node) -> NodeFacts {
    let internal_ips = node
        .status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect();
    NodeFacts {
        internal_ips,
        labels: node.metadata.labels.clone().unwrap_or_default(),
    }
}

/// The watch of the daemon's Node, started on demand; its views arrive on
/// the receiver [`NodeWatch::new`] returns.
#[derive(Debug)]
pub(crate) struct NodeWatch {
    node_name: Option<String>,
    tx: mpsc::UnboundedSender<NodeView>,
    started: bool,
}

impl NodeWatch {
    /// A watch of Node `node_name` (`NODE_NAME`), not started yet.
    pub(crate) fn new(node_name: Option<String>) -> (Self, mpsc::UnboundedReceiver<NodeView>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Self {
                node_name: node_name.filter(|n| !n.is_empty()),
                tx,
                started: false,
            },
            rx,
        )
    }

    /// Starts the watch, once: a task that finds the API credentials and
    /// watches the Node, sending each change of what is known (at first
    /// why it is unknown, when it cannot be read).
    pub(crate) fn ensure(&mut self) {
        if self.started {
            return;
        }
        self.started = true;
        let tx = self.tx.clone();
        let Some(name) = self.node_name.clone() else {
            warn!(
                "the Node cannot be read: NODE_NAME is not set (the DaemonSet sets it from spec.nodeName)"
            );
            let _ = tx.send(NodeView::Unknown("NODE_NAME is not set".into()));
            return;
        };
        tokio::spawn(async move {
            let client = match kube::Config::infer()
                .await
                .map_err(|e| e.to_string())
                .and_then(|c| kube::Client::try_from(c).map_err(|e| e.to_string()))
            {
                Ok(c) => c,
                Err(e) => {
                    warn!(error = %e, "the Node cannot be read: no API access");
                    let _ = tx.send(NodeView::Unknown(format!("no API access: {e}")));
                    return;
                }
            };
            info!(node = %name, "watching our Node");
            run(client, &name, tx).await;
        });
    }
}

/// Reads Node `node_name` once, within `timeout` (a list by name, which the
/// watch's RBAC allows): `doctor`'s look at it.
pub(crate) async fn read_once(node_name: Option<&str>, timeout: Duration) -> NodeView {
    let Some(name) = node_name.filter(|n| !n.is_empty()) else {
        return NodeView::Unknown("NODE_NAME is not set".into());
    };
    let ask = async {
        let config = kube::Config::infer()
            .await
            .map_err(|e| format!("no API access: {e}"))?;
        let client = kube::Client::try_from(config).map_err(|e| format!("no API access: {e}"))?;
        let api: Api<Node> = Api::all(client);
        let params = kube::api::ListParams::default().fields(&format!("metadata.name={name}"));
        let list = api
            .list(&params)
            .await
            .map_err(|e| format!("reading Node {name} failed: {e}"))?;
        list.items
            .first()
            .map(facts)
            .ok_or_else(|| format!("there is no Node {name}"))
    };
    match tokio::time::timeout(timeout, ask).await {
        Err(_) => NodeView::Unknown(format!(
            "the API server did not answer within {} s",
            timeout.as_secs()
        )),
        Ok(Err(why)) => NodeView::Unknown(why),
        Ok(Ok(f)) => NodeView::Known(f),
    }
}

/// Watches Node `name`, sending each change of what is known on `tx`,
/// until the daemon is gone.
async fn run(client: kube::Client, name: &str, tx: mpsc::UnboundedSender<NodeView>) {
    let api: Api<Node> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = std::pin::pin!(watcher::watcher(api, cfg).default_backoff());
    let mut last = NodeView::NotAsked;
    let mut listed = false;
    let mut failing = false;
    let send = |view: NodeView, last: &mut NodeView| -> bool {
        if *last == view {
            return true;
        }
        *last = view.clone();
        tx.send(view).is_ok()
    };
    while let Some(ev) = stream.next().await {
        let view = match ev {
            Ok(Event::Apply(n) | Event::InitApply(n)) => {
                listed = true;
                failing = false;
                NodeView::Known(facts(&n))
            }
            Ok(Event::Delete(_)) => NodeView::Unknown(format!("Node {name} was deleted")),
            Ok(Event::Init) => {
                listed = false;
                continue;
            }
            Ok(Event::InitDone) if !listed => NodeView::Unknown(format!("there is no Node {name}")),
            Ok(Event::InitDone) => continue,
            Err(e) => {
                if !failing {
                    warn!(error = %e, node = %name, "reading our Node failed (the service account needs list and watch on nodes); retrying");
                }
                failing = true;
                // What was read stays true while the watch reconnects.
                if matches!(last, NodeView::Known(_)) {
                    continue;
                }
                NodeView::Unknown(format!("reading Node {name} failed: {e}"))
            }
        };
        if !send(view, &mut last) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};

    #[test]
    fn the_internal_ips_are_the_nodes_addresses_of_that_type() {
        let address = |type_: &str, address: &str| NodeAddress {
            type_: type_.into(),
            address: address.into(),
        };
        let node = Node {
            status: Some(NodeStatus {
                addresses: Some(vec![
                    address("Hostname", "node-1"),
                    address("InternalIP", "192.0.2.10"),
                    address("ExternalIP", "203.0.113.10"),
                    address("InternalIP", "2001:db8::10"),
                    address("InternalIP", "not-an-address"),
                ]),
                ..Default::default()
            }),
            metadata: kube::api::ObjectMeta {
                labels: Some(BTreeMap::from([("role".to_string(), "dp".to_string())])),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(facts(&node).labels["role"], "dp");
        assert_eq!(
            facts(&node).internal_ips,
            [
                "192.0.2.10".parse::<IpAddr>().unwrap(),
                "2001:db8::10".parse().unwrap()
            ]
        );
        assert_eq!(facts(&Node::default()), NodeFacts::default());
        assert_eq!(
            NodeView::Known(facts(&node))
                .internal_ips()
                .map(|v| v.len()),
            Some(2)
        );
        assert_eq!(NodeView::Unknown("x".into()).internal_ips(), None);
    }
}
