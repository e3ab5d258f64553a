//! The daemon's exit: whether it is an uninstall ([`Uninstall::decide`]:
//! the watch of our DaemonSet saw it deleted, and a GET at exit still
//! finds it gone or going), and if so the node cleaned ([`clean_node`])
//! once the work under way has finished, with what was removed and what
//! was kept logged, and what was kept posted as an Event.

use crate::config::ResourceConfig;
use crate::core::cleanup::{Cleaned, CniFiles, Held, InUse, clean_node};
use crate::core::host::Host;
use crate::core::inflight::{Closed, InFlight};
use crate::core::ledger::{AllocationClock, Assignments};
use crate::core::reclaim::list_allocated;
use crate::dra::cdi::CdiDir;
use crate::install::CniStamps;
use crate::operator::events::{EventSink, NodeEvent};
use crate::operator::owner::{Uninstall, Verdict};
use crate::options::{Front, Options};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How long an exit waits for the watch to report the DaemonSet's
/// deletion: the SIGTERM of an uninstall can come a moment before it.
const WATCH_LAG: Duration = Duration::from_secs(2);
/// How long the kubelet gets to say which devices pods hold.
const ASK_KUBELET: Duration = Duration::from_secs(3);
/// How long the clean-up waits for Allocates and a reclaim round under way
/// (an Allocate waits up to 2 s for its tap node; a round's `List` up to
/// 5 s).
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(10);
/// How long the last Events get to be posted.
const EVENTS_WAIT: Duration = Duration::from_secs(2);
/// The CNI binary's name in the CNI bin dir (install-cni's default).
const CNI_NAME: &str = "macvtap";

/// What the exit needs of the stopped daemon.
pub(super) struct Exit {
    /// The daemon's options.
    pub opts: Options,
    /// The watch of our DaemonSet.
    pub uninstall: Uninstall,
    /// The gate of Allocates and reclaim rounds.
    pub inflight: InFlight,
    /// When each link was last handed out.
    pub clock: AllocationClock,
    /// The record's keeper, closed before the record is removed.
    pub assignments: Assignments,
    /// The resources served at exit.
    pub resources: Vec<ResourceConfig>,
    /// Where the Event of what was kept goes.
    pub events: EventSink,
    /// The CNI files' stamps as the daemon found them at start.
    pub cni_found: CniStamps,
}

/// The stamps of the CNI files in `--uninstall-cni-dir` now (none without
/// it): read as the daemon starts, after its pod's install-cni ran.
pub(super) fn cni_at_start(opts: &Options) -> CniStamps {
    opts.uninstall_cni_dir
        .as_deref()
        .map(|dir| CniStamps::read(dir, CNI_NAME))
        .unwrap_or_default()
}

/// Cleans the node when this exit is an uninstall; otherwise (a rollout, a
/// restart, the DaemonSet replaced) leaves everything to the next pod,
/// saying why.
pub(super) async fn clean_if_uninstalled(exit: Exit) {
    match exit.uninstall.decide(WATCH_LAG).await {
        None => {}
        Some(Verdict::Keep(why)) => {
            info!(%why, "not an uninstall: nothing of ours is removed from this node")
        }
        Some(Verdict::Clean(why)) => {
            info!(%why, "uninstall: cleaning this node of what nobody holds");
            clean(exit).await;
        }
    }
}

/// The clean-up itself: the gate closed (waiting for what is under way),
/// the record closed, PodResources asked, then [`clean_node`] on a
/// blocking thread.
async fn clean(exit: Exit) {
    if exit.inflight.close(IN_FLIGHT_WAIT).await == Closed::TimedOut {
        warn!(
            wait_s = IN_FLIGHT_WAIT.as_secs(),
            "uninstall: an Allocate or reclaim round was still under way after the wait; cleaning anyway (a link it makes now is left, and a reinstall's reclaim removes it)"
        );
    }
    exit.assignments.close();
    let held = match list_allocated(&exit.opts.pod_resources_socket(), ASK_KUBELET).await {
        Ok(held) => Held::Devices(held.ids(&exit.resources)),
        Err(e) => Held::Unknown(e.to_string()),
    };
    if let (Front::Dra, Held::Devices(ids)) = (exit.opts.front, &held) {
        remove_unheld_specs(&exit.opts.cdi_dir, ids);
    }
    let Exit {
        opts,
        clock,
        resources,
        events,
        cni_found,
        ..
    } = exit;
    let cleaned = tokio::task::spawn_blocking(move || {
        Host::current(super::KERNEL).map(|host| {
            let in_use = InUse {
                resources: &resources,
                held: &held,
                clock: &clock,
                grace: opts.reclaim_grace,
                now: Instant::now(),
            };
            let cni = opts.uninstall_cni_dir.as_deref().map(|dir| CniFiles {
                dir,
                name: CNI_NAME,
                shipped: &opts.uninstall_cni_source,
                found: cni_found,
            });
            clean_node(host.link_ops(), in_use, cni, &opts.plugin_dir())
        })
    })
    .await;
    match cleaned {
        Ok(Ok(c)) => report(&c, &events).await,
        Ok(Err(e)) => {
            warn!(error = %e, "uninstall: the host's namespace could not be opened; nothing was cleaned")
        }
        Err(e) => warn!(error = %e, "uninstall: the clean-up task failed"),
    }
}

/// DRA mode: removes the CDI specs of claims whose devices no pod holds
/// (no daemon is left to unprepare them), saying which.
fn remove_unheld_specs(dir: &std::path::Path, held: &std::collections::HashSet<String>) {
    let removed = CdiDir::open(dir).and_then(|cdi| cdi.remove_unheld(held));
    match removed {
        Ok(uids) if uids.is_empty() => {}
        Ok(uids) => {
            info!(claims = %uids.join(", "), "uninstall: removed the CDI specs of claims no pod holds")
        }
        Err(e) => {
            warn!(error = %e, "uninstall: the CDI specs of claims no pod holds could not be removed")
        }
    }
}

/// Logs what the clean-up removed, what failed, and (one line, and an
/// Event) what it kept.
async fn report(c: &Cleaned, events: &EventSink) {
    let removed: Vec<String> = c.removed.iter().map(|p| p.display().to_string()).collect();
    info!(
        links = %c.links.join(", "),
        removed = %removed.join(", "),
        "uninstall: removed what is ours from this node"
    );
    for (link, e) in &c.links_failed {
        warn!(link = %link, error = %e, "uninstall: a link of ours could not be deleted");
    }
    if !c.kept.is_empty() {
        let kept = c.kept.join("; ");
        warn!(%kept, "uninstall: kept on this node what is still in use or not provably ours");
        events
            .post_last(NodeEvent::UninstallKept { kept }, EVENTS_WAIT)
            .await;
    }
}
