//! Whether the daemon's own DaemonSet is being deleted: an uninstall
//! (`kubectl delete -k`, `helm uninstall`), after which the daemon cleans
//! the node as it exits (`crate::core::cleanup`), as opposed to a
//! rollout or a restart, after which the next pod takes over what is there.
//!
//! A watch of the one DaemonSet (a field selector on its name, which RBAC
//! can grant by `resourceNames`) runs from the start, so it is in place
//! before an uninstall removes our RBAC and service account: the API
//! server authorizes a watch when it opens, and an open watch keeps
//! delivering. The DaemonSet's deletion (or a `deletionTimestamp` on it)
//! marks the uninstall. Without API access, or when the DaemonSet is not
//! found, it says so once and an exit never cleans.

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_stream::StreamExt;
use tracing::{info, warn};

/// The DaemonSet that runs this daemon: its namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The namespace (the pod's, from the downward API).
    pub namespace: String,
    /// The DaemonSet's name.
    pub name: String,
}

/// What the watch knows: set once when the DaemonSet is going away. The
/// default has no watch behind it and never marks.
#[derive(Debug, Clone, Default)]
pub(crate) struct Uninstall {
    going: Arc<AtomicBool>,
    changed: Arc<Notify>,
    /// Whether a watch runs (or ran) to mark it.
    watched: bool,
}

impl Uninstall {
    /// Whether the DaemonSet was deleted.
    pub(crate) fn is_going(&self) -> bool {
        self.going.load(Ordering::SeqCst)
    }

    /// Whether the DaemonSet was deleted, waiting up to `wait` for the
    /// watch to say so: a SIGTERM of an uninstall can come a moment before
    /// the watch's event.
    pub(crate) async fn going_within(&self, wait: Duration) -> bool {
        let notified = self.changed.notified();
        if self.is_going() || !self.watched {
            return self.is_going();
        }
        let _ = tokio::time::timeout(wait, notified).await;
        self.is_going()
    }

    fn mark(&self, why: &str) {
        if !self.going.swap(true, Ordering::SeqCst) {
            info!(
                why,
                "our DaemonSet is being deleted: this node is cleaned when the daemon exits"
            );
        }
        self.changed.notify_waiters();
    }

    /// Watches `owner` with `client` in a task, marking the uninstall when
    /// it is deleted; the task ends when the watch cannot go on.
    pub(crate) fn watch(client: kube::Client, owner: Owner) -> (Self, tokio::task::JoinHandle<()>) {
        let me = Self {
            watched: true,
            ..Self::default()
        };
        let task = tokio::spawn(run(client, owner, me.clone()));
        (me, task)
    }
}

async fn run(client: kube::Client, owner: Owner, state: Uninstall) {
    let api: Api<DaemonSet> = Api::namespaced(client, &owner.namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", owner.name));
    let mut stream = std::pin::pin!(watcher::watcher(api, cfg).default_backoff());
    let mut seen = false;
    let mut failing = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Delete(_)) => state.mark("deleted"),
            Ok(Event::Apply(ds) | Event::InitApply(ds)) => {
                seen = true;
                failing = false;
                if ds.metadata.deletion_timestamp.is_some() {
                    state.mark("deletionTimestamp set");
                }
            }
            Ok(Event::InitDone) if !seen => {
                warn!(
                    namespace = %owner.namespace,
                    daemonset = %owner.name,
                    "our DaemonSet is not there: an exit never cleans this node (check --owner-daemonset and POD_NAMESPACE)"
                );
                return;
            }
            Ok(Event::Init | Event::InitDone) => {}
            Err(e) if !failing => {
                failing = true;
                warn!(error = %e, "watching our DaemonSet failed; retrying (until it works, an exit never cleans this node)");
            }
            Err(_) => {}
        }
    }
}

/// The uninstall watch from the environment: on when `owner` is set and API
/// credentials are found, otherwise off (a default [`Uninstall`] never
/// marks), which is logged once.
pub(crate) async fn from_environment(owner: Option<Owner>) -> Uninstall {
    let Some(owner) = owner else {
        info!("cleaning the node at an uninstall is off: no --owner-daemonset and POD_NAMESPACE");
        return Uninstall::default();
    };
    let client = match kube::Config::infer()
        .await
        .map_err(|e| e.to_string())
        .and_then(|c| kube::Client::try_from(c).map_err(|e| e.to_string()))
    {
        Ok(c) => c,
        Err(e) => {
            info!(error = %e, "cleaning the node at an uninstall is off: no API access");
            return Uninstall::default();
        }
    };
    info!(namespace = %owner.namespace, daemonset = %owner.name, "watching our DaemonSet, to clean this node if it is deleted");
    Uninstall::watch(client, owner).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_mark_wakes_a_waiter_and_stays() {
        let u = Uninstall {
            watched: true,
            ..Uninstall::default()
        };
        assert!(!u.going_within(Duration::from_millis(1)).await);
        let waiter = {
            let u = u.clone();
            tokio::spawn(async move { u.going_within(Duration::from_secs(30)).await })
        };
        // The waiter may not wait yet: mark until it returns.
        while !waiter.is_finished() {
            u.mark("test");
            tokio::task::yield_now().await;
        }
        assert!(waiter.await.unwrap());
        assert!(u.is_going());
    }

    /// Without a watch nothing can mark it: an exit does not wait.
    #[tokio::test]
    async fn without_a_watch_an_exit_does_not_wait() {
        let u = Uninstall::default();
        let answer = tokio::time::timeout(
            Duration::from_secs(60),
            u.going_within(Duration::from_secs(3600)),
        )
        .await;
        assert_eq!(answer, Ok(false), "it waited for a watch that is not there");
    }
}
