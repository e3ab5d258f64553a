//! Kubernetes Events on the daemon's Node, so that `kubectl describe node`
//! says what the device plugin knows first: a NIC went down or came back,
//! a config reload added or removed a resource, registration keeps
//! failing, a leaked link was removed, an Allocate was refused, a mount of
//! the host's is missing (what that leaves undone), something planted where
//! the daemon keeps its record was removed, auto-discovery leaves NICs out
//! (why, and how to serve them).
//!
//! Events are posted by `kube::runtime::events::Recorder` (events.k8s.io/v1,
//! in namespace `default` as for every Node event), which aggregates a
//! repeat of the same type, reason and action into the first Event's
//! `series` (a PATCH), as client-go's recorder does. The daemon never waits
//! for the API server: [`EventSink::post`] queues, a task publishes. Without
//! API access (no `NODE_NAME`, no service account, RBAC refusing) it says
//! once that Events are off and drops them.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use std::collections::HashMap;
use std::fmt;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// The `reportingController` of our Events.
pub const CONTROLLER: &str = "macvtap.network.kubevirt.io/device-plugin";
/// Event reason: a resource's NIC went down or vanished.
pub(crate) const NIC_DOWN: &str = "MacvtapNICDown";
/// Event reason: a master took a resource's NIC, or another port is in
/// the way of its mode; the name predates the second case and is kept for
/// compatibility.
pub(crate) const NIC_ENSLAVED: &str = "MacvtapNICEnslaved";
/// Event reason: a resource's NIC is up again.
pub(crate) const NIC_UP: &str = "MacvtapNICUp";
/// Event reason: a config reload added a resource.
pub(crate) const RESOURCE_ADDED: &str = "MacvtapResourceAdded";
/// Event reason: a config reload removed a resource.
pub(crate) const RESOURCE_REMOVED: &str = "MacvtapResourceRemoved";
/// Event reason: registration keeps failing.
pub(crate) const REGISTRATION_FAILING: &str = "MacvtapRegistrationFailing";
/// Event reason: a leaked macvtap was deleted.
pub(crate) const LEAKED_LINK_REMOVED: &str = "MacvtapLeakedLinkRemoved";
/// Event reason: an Allocate was refused.
pub(crate) const ALLOCATE_FAILED: &str = "MacvtapAllocateFailed";
/// Event reason: the host's `/dev` is not mounted (tap nodes never show).
pub(crate) const HOST_DEV_MISSING: &str = "MacvtapHostDevMissing";
/// Event reason: the kubelet's PodResources API cannot be read.
pub(crate) const POD_RESOURCES_UNREADABLE: &str = "MacvtapPodResourcesUnreadable";
/// Event reason: something else on the node had put a link, FIFO, device
/// node, directory or hard link where the record keeps a file, and it was
/// removed.
pub(crate) const RECORD_FILE_PLANTED: &str = "MacvtapRecordFilePlanted";
/// Event reason: an uninstall's clean-up left things on the node that are
/// still in use (devices pods hold, links just handed out).
pub(crate) const UNINSTALL_KEPT: &str = "MacvtapUninstallKept";
/// Event reason: what auto-discovery leaves out changed (the NICs, why,
/// and how to serve each).
pub(crate) const NICS_LEFT_OUT: &str = "MacvtapNICsLeftOut";
/// Every reason of our Events, in [`NodeEvent`]'s order.
pub const REASONS: &[&str] = &[
    NIC_DOWN,
    NIC_ENSLAVED,
    NIC_UP,
    RESOURCE_ADDED,
    RESOURCE_REMOVED,
    REGISTRATION_FAILING,
    LEAKED_LINK_REMOVED,
    ALLOCATE_FAILED,
    HOST_DEV_MISSING,
    POD_RESOURCES_UNREADABLE,
    RECORD_FILE_PLANTED,
    UNINSTALL_KEPT,
    NICS_LEFT_OUT,
];
/// How many Events may wait for the publisher before new ones are dropped.
const QUEUE: usize = 256;
/// The API server refuses a longer `note`.
const NOTE_MAX: usize = 1024;

/// How long Events are dropped after the API server refused one (401 or
/// 403); the next Event after that is tried again, so RBAC granted later
/// (or a refusal while a new binding propagates) needs no restart.
pub const REFUSED_PAUSE: Duration = Duration::from_secs(300);

/// Something an operator should see on the Node.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeEvent {
    /// A resource's NIC went down or vanished: its devices are Unhealthy.
    NicDown {
        /// The resource name.
        resource: String,
        /// The lower NIC.
        nic: String,
        /// How many devices changed health.
        devices: u32,
    },
    /// A master (bridge, bond, OVS) took a resource's NIC, or another port
    /// on it is in the way of the resource's mode: its devices are Unhealthy
    /// until that is undone. Posted with reason `NIC_ENSLAVED`
    /// (`MacvtapNICEnslaved`), kept for compatibility with what clusters
    /// already match on.
    NicUnusable {
        /// The resource name.
        resource: String,
        /// How many devices changed health.
        devices: u32,
        /// Why, with the master or the port in the way, and the fix.
        why: String,
    },
    /// A resource's NIC is up again: its devices are Healthy.
    NicUp {
        /// The resource name.
        resource: String,
        /// The lower NIC.
        nic: String,
        /// How many devices changed health.
        devices: u32,
    },
    /// A config reload added a resource.
    ResourceAdded {
        /// The resource name.
        resource: String,
        /// The lower NIC.
        nic: String,
        /// Its device count.
        devices: u32,
    },
    /// A config reload removed a resource.
    ResourceRemoved {
        /// The resource name.
        resource: String,
    },
    /// Registration with the kubelet failed several times in a row.
    RegistrationFailing {
        /// The resource name.
        resource: String,
        /// Failed attempts in a row so far.
        failures: u32,
        /// The last error.
        error: String,
    },
    /// A macvtap that no pod holds was deleted.
    LeakedLinkRemoved {
        /// The link's name.
        link: String,
        /// Its ifindex (its tap was `/dev/tap<ifindex>`).
        ifindex: u32,
    },
    /// An Allocate was refused.
    AllocateRefused {
        /// The resource name.
        resource: String,
        /// Why.
        error: String,
    },
    /// The host's `/dev` is not mounted: what that leaves undone, and the
    /// mount (`crate::core::degraded::Degraded`'s sentence).
    HostDevMissing {
        /// The sentence.
        what: String,
    },
    /// The kubelet's PodResources API cannot be read: what that leaves
    /// undone, and the mount.
    PodResourcesUnreadable {
        /// The sentence.
        what: String,
    },
    /// Something else on the node had put a link, FIFO, device node,
    /// directory or hard link where the record of handed-out devices keeps
    /// a file (in the device-plugins directory, which every device plugin
    /// mounts), and the daemon removed it.
    RecordFilePlanted {
        /// Where it was.
        path: String,
        /// What it was, e.g. `a symbolic link to "/host/cni-bin/multus-shim"`.
        what: String,
    },
    /// An uninstall's clean-up kept what is still in use, and why.
    UninstallKept {
        /// What was kept and why, as the log line says it.
        kept: String,
    },
    /// What auto-discovery leaves out changed: posted as a new Event each
    /// time (never folded into the last one's series, whose note would
    /// then say the old list).
    NicsLeftOut {
        /// The links it serves.
        served: Vec<String>,
        /// The NICs it leaves out, each with why and how to serve it (a
        /// sentence that starts with the NIC's name).
        left_out: Vec<String>,
    },
}

impl From<&crate::core::degraded::Degraded> for NodeEvent {
    /// The Event that says `gap`.
    fn from(gap: &crate::core::degraded::Degraded) -> Self {
        use crate::core::degraded::Degraded;
        let what = gap.to_string();
        match gap {
            Degraded::NoHostDev { .. } => Self::HostDevMissing { what },
            Degraded::NoPodResources { .. } => Self::PodResourcesUnreadable { what },
        }
    }
}

impl NodeEvent {
    /// The Event's reason, one of [`REASONS`].
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::NicDown { .. } => NIC_DOWN,
            Self::NicUnusable { .. } => NIC_ENSLAVED,
            Self::NicUp { .. } => NIC_UP,
            Self::ResourceAdded { .. } => RESOURCE_ADDED,
            Self::ResourceRemoved { .. } => RESOURCE_REMOVED,
            Self::RegistrationFailing { .. } => REGISTRATION_FAILING,
            Self::LeakedLinkRemoved { .. } => LEAKED_LINK_REMOVED,
            Self::AllocateRefused { .. } => ALLOCATE_FAILED,
            Self::HostDevMissing { .. } => HOST_DEV_MISSING,
            Self::PodResourcesUnreadable { .. } => POD_RESOURCES_UNREADABLE,
            Self::RecordFilePlanted { .. } => RECORD_FILE_PLANTED,
            Self::UninstallKept { .. } => UNINSTALL_KEPT,
            Self::NicsLeftOut { .. } => NICS_LEFT_OUT,
        }
    }

    /// Whether a repeat of this kind of Event is folded into the first
    /// one's series (keeping its note); one that says a whole state anew
    /// each time is posted as a new Event instead.
    pub(crate) fn folds_repeats(&self) -> bool {
        !matches!(self, Self::NicsLeftOut { .. })
    }

    /// The Event as the recorder posts it: type, reason, action and note.
    pub(crate) fn to_event(&self) -> Event {
        let (type_, action, note) = match self {
            Self::NicDown {
                resource,
                nic,
                devices,
            } => (
                EventType::Warning,
                "MarkUnhealthy",
                format!("NIC {nic} is down or gone: {devices} devices of {resource} are Unhealthy"),
            ),
            Self::NicUnusable {
                resource,
                devices,
                why,
            } => (
                EventType::Warning,
                "MarkUnhealthy",
                format!("{devices} devices of {resource} are Unhealthy: {why}"),
            ),
            Self::NicUp {
                resource,
                nic,
                devices,
            } => (
                EventType::Normal,
                "MarkHealthy",
                format!("NIC {nic} is up: {devices} devices of {resource} are Healthy again"),
            ),
            Self::ResourceAdded {
                resource,
                nic,
                devices,
            } => (
                EventType::Normal,
                "Reload",
                format!("Config reload added {resource}: {devices} devices on NIC {nic}"),
            ),
            Self::ResourceRemoved { resource } => (
                EventType::Normal,
                "Reload",
                format!("Config reload removed {resource}"),
            ),
            Self::RegistrationFailing {
                resource,
                failures,
                error,
            } => (
                EventType::Warning,
                "Register",
                format!(
                    "Registering {resource} with the kubelet failed {failures} times in a row: {error}"
                ),
            ),
            Self::LeakedLinkRemoved { link, ifindex } => (
                EventType::Normal,
                "Reclaim",
                format!("Removed macvtap {link} (/dev/tap{ifindex}): no pod holds its device"),
            ),
            Self::AllocateRefused { resource, error } => (
                EventType::Warning,
                "Allocate",
                format!("Allocate of {resource} refused: {error}"),
            ),
            Self::HostDevMissing { what } => (EventType::Warning, "Start", capital(what)),
            Self::PodResourcesUnreadable { what } => (EventType::Warning, "Reclaim", capital(what)),
            Self::RecordFilePlanted { path, what } => (
                EventType::Warning,
                "Record",
                format!(
                    "Removed {what} at {path}, where the device plugin keeps its record: something \
                     else on the node put it there (a pod that mounts the device-plugins directory); \
                     the record is written afresh"
                ),
            ),
            Self::UninstallKept { kept } => (
                EventType::Warning,
                "Uninstall",
                format!("Uninstall kept on this node what is still in use: {kept}"),
            ),
            Self::NicsLeftOut { served, left_out } => {
                // What it leaves out first: a long list of what it serves
                // is what the API's length limit cuts.
                let serves = if served.is_empty() {
                    "It serves no NIC on this node.".to_string()
                } else {
                    format!("It serves {}.", served.join(", "))
                };
                let names: Vec<&str> = left_out
                    .iter()
                    .filter_map(|r| r.split_whitespace().next())
                    .collect();
                let note = if left_out.is_empty() {
                    format!("Auto-discovery leaves out no NIC the node uses now. {serves}")
                } else {
                    format!(
                        "Auto-discovery leaves out {}, which the node uses itself. {}. {serves}",
                        names.join(", "),
                        left_out.join(". ")
                    )
                };
                (EventType::Normal, "Discover", note)
            }
        };
        Event {
            type_,
            reason: self.reason().into(),
            note: Some(truncate(note, NOTE_MAX)),
            action: action.into(),
            secondary: None,
        }
    }
}

/// `s` with its first letter upper-cased, as a note begins.
fn capital(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map_or_else(String::new, |c| {
        c.to_uppercase().chain(chars).collect::<String>()
    })
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max - 3;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// The reference to a Node that Events are about. The kubelet sets the
/// UID of its own Node events to the node name
/// (kubernetes/kubernetes `pkg/kubelet/kubelet.go`, `nodeRef`), and
/// `kubectl describe node` looks Events up by that UID as well as by the
/// Node's (`staging/src/k8s.io/kubectl/pkg/describe/describe.go`,
/// `NodeDescriber`), so no read access to Nodes is needed to learn it.
pub(crate) fn node_reference(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        uid: Some(node.into()),
        namespace: None,
        ..Default::default()
    }
}

/// A last Event (or none) and where to say that it and every Event queued
/// before it were handled.
type LastEvent = (Option<NodeEvent>, oneshot::Sender<()>);

/// Where the daemon posts Events; a cheap handle that never blocks.
#[derive(Clone, Default)]
pub struct EventSink {
    tx: Option<mpsc::Sender<NodeEvent>>,
    /// Where [`EventSink::post_last`] hands the publisher a last Event and
    /// asks it to say when it has handled it and every Event queued before.
    flush: Option<mpsc::Sender<LastEvent>>,
}

impl fmt::Debug for EventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.tx.is_some() {
            "EventSink(on)"
        } else {
            "EventSink(off)"
        })
    }
}

impl EventSink {
    /// A sink that drops every Event.
    pub(crate) fn off() -> Self {
        Self::default()
    }

    /// A sink whose Events the unit tests take from the queue.
    #[cfg(test)]
    pub(crate) fn queue() -> (Self, mpsc::Receiver<NodeEvent>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (
            Self {
                tx: Some(tx),
                flush: None,
            },
            rx,
        )
    }

    /// Queues `ev` for the publisher; dropped when Events are off or the
    /// queue is full.
    pub fn post(&self, ev: NodeEvent) {
        if let Some(tx) = &self.tx
            && let Err(mpsc::error::TrySendError::Full(ev)) = tx.try_send(ev)
        {
            debug!(
                reason = ev.reason(),
                "the Event queue is full; dropping an Event"
            );
        }
    }

    /// Starts publishing Events about Node `node` with `client`; returns
    /// the sink and the publisher task, which ends when every sink is
    /// dropped. After a refusal (401 or 403) it drops Events for `pause`
    /// (the daemon's is [`REFUSED_PAUSE`]), then tries again.
    pub fn start(
        client: kube::Client,
        node: &str,
        pause: Duration,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let reporter = Reporter {
            controller: CONTROLLER.into(),
            instance: Some(truncate(format!("macvtap-deviceplugin-{node}"), 128)),
        };
        let reference = node_reference(node);
        let (tx, rx) = mpsc::channel(QUEUE);
        let (flush, flushes) = mpsc::channel(1);
        let task = tokio::spawn(publish(client, reporter, reference, (rx, flushes), pause));
        (
            Self {
                tx: Some(tx),
                flush: Some(flush),
            },
            task,
        )
    }

    /// Posts `last` as an exiting daemon's last Event: the publisher first
    /// handles every Event queued before, then tries `last` even during the
    /// pause after a refusal (once: the process is about to end), logging
    /// a warning when it cannot be posted; waits up to `bound` for all of
    /// it, so what an exit posts is not lost with the process.
    pub async fn post_last(&self, last: NodeEvent, bound: Duration) {
        let Some(flush) = &self.flush else { return };
        let (done, handled) = oneshot::channel();
        let asked = async {
            if flush.send((Some(last), done)).await.is_ok() {
                let _ = handled.await;
            }
        };
        if tokio::time::timeout(bound, asked).await.is_err() {
            warn!(bound = ?bound, "the exit's last Event was not handled within the wait; it may be lost");
        }
    }

    /// Events from the environment: on when `node_name` is set and API
    /// credentials are found (a kubeconfig named by `KUBECONFIG`, else the
    /// pod's service account), otherwise off, which is logged once.
    pub(crate) async fn from_environment(node_name: Option<&str>) -> Self {
        let Some(node) = node_name.filter(|n| !n.is_empty()) else {
            info!(
                "Kubernetes Events are off: NODE_NAME is not set (the DaemonSet sets it from spec.nodeName)"
            );
            return Self::off();
        };
        let config = match kube::Config::infer().await {
            Ok(c) => c,
            Err(e) => {
                info!(error = %e, "Kubernetes Events are off: no API access (no kubeconfig, and no service account token or KUBERNETES_SERVICE_HOST)");
                return Self::off();
            }
        };
        match kube::Client::try_from(config) {
            Ok(client) => {
                info!(node, "posting Kubernetes Events on the Node");
                Self::start(client, node, REFUSED_PAUSE).0
            }
            Err(e) => {
                info!(error = %e, "Kubernetes Events are off: the API client cannot be built");
                Self::off()
            }
        }
    }
}

/// The publisher's state: one recorder per kind of Event, and whether
/// posting fails or was refused.
struct Publisher {
    client: kube::Client,
    reporter: Reporter,
    reference: ObjectReference,
    pause: Duration,
    // One recorder per kind of Event, so that one can be started afresh
    // without forgetting the others' series. The reason names the kind: each
    // reason has one type and one action (see `NodeEvent::to_event`).
    recorders: HashMap<&'static str, Recorder>,
    failing: bool,
    // Until when Events are dropped after a refusal; still set (and
    // passed) when the next try is refused again.
    refused_until: Option<Instant>,
}

async fn publish(
    client: kube::Client,
    reporter: Reporter,
    reference: ObjectReference,
    (mut rx, mut flushes): (mpsc::Receiver<NodeEvent>, mpsc::Receiver<LastEvent>),
    pause: Duration,
) {
    let mut p = Publisher {
        client,
        reporter,
        reference,
        pause,
        recorders: HashMap::new(),
        failing: false,
        refused_until: None,
    };
    loop {
        // Events before flushes: a flush is answered once every Event queued
        // before it is handled.
        tokio::select! {
            biased;
            ev = rx.recv() => match ev {
                Some(ev) => p.handle(ev).await,
                None => break,
            },
            Some((last, done)) = flushes.recv() => {
                while let Ok(ev) = rx.try_recv() {
                    p.handle(ev).await;
                }
                if let Some(last) = last {
                    p.last(last).await;
                }
                let _ = done.send(());
            }
        }
    }
}

impl Publisher {
    /// Tries `ev` whatever the pause, as the last Event of an exit, and
    /// says when it cannot be posted.
    async fn last(&mut self, ev: NodeEvent) {
        let reason = ev.reason();
        match self.post(&ev).await {
            Ok(()) => {}
            Err(kube::Error::Api(status)) if status.code == 401 || status.code == 403 => warn!(
                reason,
                code = status.code,
                error = %status.message,
                "the API server refused the exit's last Event (an uninstall removes our service account and RBAC first); the log line before it says the same"
            ),
            Err(e) => warn!(reason, error = %e, "the exit's last Event could not be posted"),
        }
    }

    /// Posts `ev`, or drops it during the pause after a refusal.
    async fn handle(&mut self, ev: NodeEvent) {
        if self.refused_until.is_some_and(|t| Instant::now() < t) {
            debug!(
                reason = ev.reason(),
                "dropping an Event: the API server refused the last one"
            );
            return;
        }
        let result = self.post(&ev).await;
        self.judge(result);
    }

    /// Publishes `ev` with its kind's recorder (a new recorder when the
    /// Event a repeat would patch is gone).
    async fn post(&mut self, ev: &NodeEvent) -> Result<(), kube::Error> {
        let event = ev.to_event();
        let recorder = self
            .recorders
            .entry(ev.reason())
            .or_insert_with(|| Recorder::new(self.client.clone(), self.reporter.clone()));
        if !ev.folds_repeats() {
            // A new recorder has no Event to fold this one into.
            *recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        }
        let mut result = recorder.publish(&event, &self.reference).await;
        if let Err(kube::Error::Api(status)) = &result
            && status.code == 404
        {
            // The Event this repeat patches is gone (expired or deleted).
            // client-go's recorder then creates it anew
            // (`tools/events/event_broadcaster.go`, `recordToSink`); kube's
            // keeps patching the one in its cache, so a new recorder, with
            // an empty cache, creates it.
            debug!(reason = %event.reason, "the Event to patch is gone; creating it anew");
            *recorder = Recorder::new(self.client.clone(), self.reporter.clone());
            result = recorder.publish(&event, &self.reference).await;
        }
        result
    }

    /// Keeps track of whether posting works, from one post's `result`.
    fn judge(&mut self, result: Result<(), kube::Error>) {
        match result {
            Ok(()) => {
                if self.failing || self.refused_until.is_some() {
                    info!("posting Kubernetes Events works again");
                }
                self.failing = false;
                self.refused_until = None;
            }
            Err(kube::Error::Api(status)) if status.code == 401 || status.code == 403 => {
                if self.refused_until.is_none() {
                    warn!(error = %status.message, pause = ?self.pause, "Kubernetes Events are off: the API server refused to create an Event (the service account needs create and patch on events.k8s.io events); Events are dropped for the pause, then tried again");
                } else {
                    debug!(error = %status.message, "the API server refused an Event again");
                }
                self.refused_until = Some(Instant::now() + self.pause);
            }
            Err(e) => {
                if !self.failing {
                    warn!(error = %e, "posting a Kubernetes Event failed; the daemon carries on");
                } else {
                    debug!(error = %e, "posting a Kubernetes Event failed again");
                }
                self.failing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_at_the_api_limit_on_a_char_boundary() {
        let long = "é".repeat(600);
        let ev = NodeEvent::AllocateRefused {
            resource: "r".into(),
            error: long,
        }
        .to_event();
        let note = ev.note.unwrap();
        assert!(
            note.len() <= NOTE_MAX && note.ends_with("..."),
            "{}",
            note.len()
        );
    }

    /// One Event of each variant; the `match` fails to compile when a
    /// variant is added, so that its reason is checked against [`REASONS`].
    fn one_of_each() -> Vec<NodeEvent> {
        let (resource, nic) = (String::from("r"), String::from("eth1"));
        let all = vec![
            NodeEvent::NicDown {
                resource: resource.clone(),
                nic: nic.clone(),
                devices: 1,
            },
            NodeEvent::NicUnusable {
                resource: resource.clone(),
                devices: 1,
                why: "w".into(),
            },
            NodeEvent::NicUp {
                resource: resource.clone(),
                nic: nic.clone(),
                devices: 1,
            },
            NodeEvent::ResourceAdded {
                resource: resource.clone(),
                nic,
                devices: 1,
            },
            NodeEvent::ResourceRemoved {
                resource: resource.clone(),
            },
            NodeEvent::RegistrationFailing {
                resource: resource.clone(),
                failures: 3,
                error: "e".into(),
            },
            NodeEvent::LeakedLinkRemoved {
                link: "mvt0".into(),
                ifindex: 7,
            },
            NodeEvent::AllocateRefused {
                resource,
                error: "e".into(),
            },
            NodeEvent::HostDevMissing { what: "w".into() },
            NodeEvent::PodResourcesUnreadable { what: "w".into() },
            NodeEvent::RecordFilePlanted {
                path: "/p".into(),
                what: "a FIFO".into(),
            },
            NodeEvent::UninstallKept { kept: "k".into() },
            NodeEvent::NicsLeftOut {
                served: vec!["eth1".into()],
                left_out: vec!["eth0 carries a route".into()],
            },
        ];
        for ev in &all {
            match ev {
                NodeEvent::NicDown { .. }
                | NodeEvent::NicUnusable { .. }
                | NodeEvent::NicUp { .. }
                | NodeEvent::ResourceAdded { .. }
                | NodeEvent::ResourceRemoved { .. }
                | NodeEvent::RegistrationFailing { .. }
                | NodeEvent::LeakedLinkRemoved { .. }
                | NodeEvent::AllocateRefused { .. }
                | NodeEvent::HostDevMissing { .. }
                | NodeEvent::PodResourcesUnreadable { .. }
                | NodeEvent::RecordFilePlanted { .. }
                | NodeEvent::UninstallKept { .. }
                | NodeEvent::NicsLeftOut { .. } => {}
            }
        }
        all
    }

    #[test]
    fn reasons_lists_the_reason_of_every_event_once() {
        let posted: Vec<String> = one_of_each()
            .iter()
            .map(|ev| ev.to_event().reason)
            .collect();
        assert_eq!(posted, REASONS);
    }

    #[test]
    fn the_left_out_nics_are_said_with_what_is_served() {
        let note = |served: &[&str], left_out: &[&str]| {
            NodeEvent::NicsLeftOut {
                served: served.iter().map(|s| s.to_string()).collect(),
                left_out: left_out.iter().map(|s| s.to_string()).collect(),
            }
            .to_event()
            .note
            .unwrap()
        };
        assert_eq!(
            note(
                &["eth1"],
                &[
                    "eth0 carries the IPv4 default route; name it",
                    "eth2 has the global address 192.0.2.2/24; name it"
                ]
            ),
            "Auto-discovery leaves out eth0, eth2, which the node uses itself. eth0 carries the \
             IPv4 default route; name it. eth2 has the global address 192.0.2.2/24; name it. It \
             serves eth1."
        );
        assert_eq!(
            note(&[], &["eth0 carries it"]),
            "Auto-discovery leaves out eth0, which the node uses itself. eth0 carries it. It \
             serves no NIC on this node."
        );
        assert_eq!(
            note(&["eth1"], &[]),
            "Auto-discovery leaves out no NIC the node uses now. It serves eth1."
        );
        let ev = NodeEvent::NicsLeftOut {
            served: vec![],
            left_out: vec![],
        };
        assert!(!ev.folds_repeats(), "each says the whole list anew");
        assert!(removed().folds_repeats());
        assert_eq!(ev.to_event().type_, EventType::Normal);
    }

    fn removed() -> NodeEvent {
        NodeEvent::ResourceRemoved {
            resource: "r".into(),
        }
    }

    /// Events `sink` queued for a publisher and no publisher took yet.
    fn queued(sink: &EventSink) -> usize {
        sink.tx
            .as_ref()
            .map_or(0, |tx| tx.max_capacity() - tx.capacity())
    }

    #[tokio::test]
    async fn an_off_sink_drops_events() {
        // The measure sees a post: a sink with a publisher's queue holds it.
        let (tx, mut rx) = mpsc::channel(QUEUE);
        let on = EventSink {
            tx: Some(tx),
            flush: None,
        };
        on.post(removed());
        assert_eq!(queued(&on), 1);
        assert_eq!(rx.try_recv().ok(), Some(removed()));

        // An off sink, and its clones, send nothing, however much is posted.
        let s = EventSink::off();
        let clone = s.clone();
        for _ in 0..=QUEUE {
            s.post(removed());
            clone.post(removed());
        }
        assert_eq!(queued(&s) + queued(&clone), 0, "an off sink queued Events");
        assert_eq!(format!("{s:?}"), "EventSink(off)");
    }
}
