//! What the front's servers share with the daemon: the [`ServerContext`]
//! each resource's server and its Allocate work with, and the
//! [`StreamEvent`]s a server reports back. Its own module, so that Allocate
//! and the server both read it without importing each other.

use crate::core::host::SharedHost;
use crate::core::inflight::InFlight;
use crate::core::ledger::AllocationClock;
use crate::core::ledger::Assignments;
use crate::operator::events::EventSink;
use crate::operator::metrics::Metrics;
use std::sync::Arc;
use tokio::sync::mpsc;

/// A ListAndWatch stream of one server that opened or ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamEvent {
    /// The [`PluginServer::id`](crate::kubelet::server::PluginServer::id) of the server.
    pub server: u64,
    /// True when the stream opened, false when it ended.
    pub opened: bool,
}

/// What a server shares with the rest of the daemon.
#[derive(Debug, Clone)]
pub(crate) struct ServerContext {
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Kubernetes Events on the Node.
    pub events: EventSink,
    /// Where ListAndWatch streams opening and ending are reported.
    pub streams: mpsc::UnboundedSender<StreamEvent>,
    /// The leak clock Allocate restarts.
    pub clock: AllocationClock,
    /// Which `/dev/tapN` each device was handed out as (for healing).
    pub assignments: Assignments,
    /// The host Allocate works on: its kernel (the real one in the daemon)
    /// and where its sysfs, tap nodes and procfs are.
    pub host: Arc<SharedHost<'static>>,
    /// The gate each Allocate passes for its whole length (its blocking
    /// half included), which a clean exit closes.
    pub inflight: InFlight,
}
