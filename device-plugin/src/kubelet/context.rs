//! What the front's servers share with the daemon: the [`ServerContext`]
//! each resource's server and its Allocate work with, and the
//! [`StreamEvent`]s a server reports back. Its own module, so that Allocate
//! and the server both read it without importing each other.

use crate::core::host::SharedHost;
use crate::core::inflight::InFlight;
use crate::core::ledger::AllocationClock;
use crate::core::ledger::Assignments;
use crate::core::reclaim::Holding;
use crate::core::report::Observer;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

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
    /// Where each Allocate's outcome is reported (the operator's metrics
    /// and Events, in the daemon).
    pub observer: Arc<dyn Observer>,
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
    /// What pods hold, as the reclaim rounds are told: ListAndWatch says
    /// the devices held through DRA are unhealthy, so the kubelet hands
    /// none of them out (a node switched back from DRA with pods running).
    pub holding: watch::Receiver<Holding>,
}
