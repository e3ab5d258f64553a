//! Leaked links: macvtaps the plugin made that no pod will ever take.
//!
//! The kubelet calls Allocate before the pod's sandbox exists; if the pod
//! then goes away before the CNI moves the link, the link stays in the host
//! namespace. Every interval, the `mvt…` macvtaps on our NICs are listed,
//! then compared with the device IDs the PodResources API says are allocated
//! (in that order: a link listed before the question existed before the
//! answer). A link that has belonged to no allocated device for longer than
//! a grace period is deleted, unless its device was allocated within the
//! grace period: a pod just admitted is not in PodResources yet, and its
//! container starts only after the CNI took the link. The clock is kept per
//! link identity (name and ifindex), so a recreated link starts over.
//!
//! A round decides ([`Reclaimer::plan`]) from what it listed and was told,
//! and acts later ([`RoundWork::carry_out`]): meanwhile an Allocate may
//! reuse a link the round found leaked, and the pod's CNI ADD move it. So a
//! link is deleted only while the [`AllocationClock`] is held, if no
//! Allocate handed it out since, and if it is still the link the round saw.
//!
//! The same round first heals the opposite case, a device a pod holds whose
//! macvtap is gone everywhere ([`crate::core::heal`]), where tap nodes show
//! (without the host's `/dev` a link in a pod looks lost, so nothing is
//! healed). When PodResources cannot be read, a round deletes and heals
//! nothing, and says so once per outage, with the mount that would enable
//! it (`crate::core::degraded`): a warning and an Event. Every kernel
//! operation goes through the reclaimer's kernel (the real one in the
//! daemon, the fake in unit tests), on a blocking thread: the links are
//! listed on one, the kubelet is asked, and the rest of the round (the
//! record pruned, heal, the deletions) runs on one more.
//!
//! The rules are plain functions (`rules`: what the kubelet holds, what
//! looks leaked, what the record forgets); the kubelet is asked through
//! `pod_resources`; a tap node's deletion starts a round at once
//! (`tap_watch`); [`Reclaimer`] is the one round runner.

mod pod_resources;
mod rules;
mod tap_watch;

pub(crate) use pod_resources::list_allocated;
pub use rules::Held;

pub(crate) use rules::{forget_unconfigured, go_era_leaked_links, leaked_links};
pub(crate) use tap_watch::{tap_node_deleted, watch_tap_nodes};

use crate::config::ResourceConfig;
use crate::core::degraded::Degraded;
use crate::core::heal::{Healed, Lost, heal, lost_devices};
use crate::core::host::{Host, HostPaths};
use crate::core::inflight::InFlight;
use crate::core::ledger::{AllocationClock, Assignments};
use crate::core::report::{Observer, RoundOutcome, Silent};
use crate::error::{Error, Result};
use macvtap_link::tapdev::tap_node_path;
use macvtap_link::{Kernel, Link, Links};
use nix::errno::Errno;
use rules::{LinkIdentity, identity};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// The kernel a reclaimer works on, shared with its blocking tasks.
pub type SharedKernel = Arc<dyn Kernel + Send + Sync>;

/// How long one PodResources `List` may take.
const POD_RESOURCES_WAIT: Duration = Duration::from_secs(5);
/// How long an Allocate is remembered at the least (the reclaim grace when
/// that is longer); older ones are forgotten so the map stays small.
const MIN_CLOCK_MEMORY: Duration = Duration::from_secs(1);

/// What the daemon knows of the devices pods hold, as the last reclaim
/// round was told by PodResources; the fronts read it to leave alone what
/// the other front handed out (a node switched between them with pods
/// running).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Holding {
    /// No round has asked the kubelet yet.
    #[default]
    Unknown,
    /// What the last round was told.
    Known(Held),
    /// The last round could not ask the kubelet.
    Unreadable,
}

/// Remembers since when each link has looked leaked.
pub struct Reclaimer {
    kernel: SharedKernel,
    socket: PathBuf,
    grace: Duration,
    first_seen: HashMap<LinkIdentity, Instant>,
    clock: AllocationClock,
    assignments: Assignments,
    paths: HostPaths,
    /// PodResources could not be read at the last round (said once).
    unreadable: bool,
    observer: Arc<dyn Observer>,
    /// The gate a round passes for its whole length, its blocking half
    /// included, so a clean exit waits for it.
    inflight: InFlight,
    /// Where each round says what pods hold.
    holding: tokio::sync::watch::Sender<Holding>,
}

impl Reclaimer {
    /// A reclaimer of the host namespace on `kernel`, asking the
    /// PodResources API on `socket`, deleting links that have looked leaked
    /// for longer than `grace` and whose device was not allocated (per
    /// `clock`) within `grace` either.
    pub fn new(
        kernel: SharedKernel,
        socket: PathBuf,
        grace: Duration,
        clock: AllocationClock,
    ) -> Self {
        Self {
            kernel,
            socket,
            grace,
            first_seen: HashMap::new(),
            clock,
            assignments: Assignments::default(),
            paths: HostPaths::default(),
            unreadable: false,
            observer: Arc::new(Silent),
            inflight: InFlight::default(),
            holding: tokio::sync::watch::Sender::new(Holding::Unknown),
        }
    }

    /// Says what pods hold, as each round is told, on `holding`: known
    /// after the first round that could ask the kubelet.
    pub(crate) fn with_holding(mut self, holding: tokio::sync::watch::Sender<Holding>) -> Self {
        self.holding = holding;
        self
    }

    /// Says what pods hold, when that changed.
    fn tell_holding(&self, now: Holding) {
        self.holding.send_if_modified(|cur| {
            let changed = *cur != now;
            *cur = now;
            changed
        });
    }

    /// Runs each round through `gate` (the daemon's, which a clean exit
    /// closes): a round holds a pass until its blocking half is done, and
    /// none starts once it is closed.
    pub(crate) fn with_inflight(mut self, gate: InFlight) -> Self {
        self.inflight = gate;
        self
    }

    /// Heals lost devices from `assignments` (what Allocate handed out),
    /// checking tap nodes in `dev_dir`.
    pub fn with_healing(mut self, assignments: Assignments, paths: HostPaths) -> Self {
        self.assignments = assignments;
        self.paths = paths;
        self
    }

    /// PodResources cannot be read (`why`): said once per outage, as a
    /// warning and an Event naming what is left undone and the mount that
    /// would enable it; later rounds of the same outage log at debug level.
    fn cannot_read(&mut self, why: String) {
        let gap = Degraded::pod_resources(&self.socket, why);
        if std::mem::replace(&mut self.unreadable, true) {
            debug!(reason = %gap, "reclaim round skipped: PodResources still cannot be read");
            return;
        }
        warn!(reason = %gap, "leaked-link reclaim and heal are off");
        self.observer.degraded(&gap);
    }

    /// Reports rounds, links healed and removed, and an unreadable
    /// PodResources to `observer` (the operator's metrics and Events in the
    /// daemon).
    pub(crate) fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = observer;
        self
    }

    /// Records the links that look leaked now and returns those that have
    /// looked leaked for longer than the grace period and were not
    /// allocated within it.
    pub(crate) fn due(&mut self, leaked: &[Link], now: Instant) -> Vec<Link> {
        let ids: HashSet<LinkIdentity> = leaked.iter().map(identity).collect();
        self.first_seen.retain(|k, _| ids.contains(k));
        let mut due = Vec::new();
        for l in leaked {
            let since = *self.first_seen.entry(identity(l)).or_insert_with(|| {
                debug!(ifname = %l.name, ifindex = l.index, "a link looks leaked; it is deleted when it still does after the grace period");
                now
            });
            if now.duration_since(since) < self.grace {
                continue;
            }
            if let Some(at) = self.clock.last_allocated(&l.name) {
                let ago = now.saturating_duration_since(at);
                if ago < self.grace {
                    debug!(ifname = %l.name, ifindex = l.index, allocated_ms_ago = ago.as_millis() as u64,
                        "keeping a link that looks leaked: its device was allocated within the grace period");
                    continue;
                }
            }
            due.push(l.clone());
        }
        due
    }

    /// One round: list links, ask the kubelet, decide ([`Reclaimer::plan`]),
    /// carry it out on a blocking thread ([`RoundWork::carry_out`]). Without
    /// a PodResources socket (skipped), or when the kubelet does not answer
    /// there (failed), it deletes and heals nothing and says so once
    /// ([`Reclaimer::cannot_read`]).
    pub(crate) async fn run_once(&mut self, resources: &[ResourceConfig]) -> Result<RoundOutcome> {
        let Some(pass) = self.inflight.enter().await else {
            return Ok(RoundOutcome::Skipped);
        };
        if !self.socket.exists() {
            self.cannot_read("it does not exist".into());
            self.tell_holding(Holding::Unreadable);
            self.first_seen.clear();
            return Ok(RoundOutcome::Skipped);
        }
        // Links first: every link listed existed before PodResources answers.
        let kernel = self.kernel.clone();
        let links = tokio::task::spawn_blocking(move || kernel.links(None)?.list_links())
            .await
            .map_err(|e| Error::Task(format!("the task listing links failed: {e}")))??;
        let allocated = match list_allocated(&self.socket, POD_RESOURCES_WAIT).await {
            Ok(held) => {
                let ids = held.ids(resources);
                self.tell_holding(Holding::Known(held));
                ids
            }
            Err(e) => {
                self.cannot_read(e.to_string());
                self.tell_holding(Holding::Unreadable);
                return Ok(RoundOutcome::Failed);
            }
        };
        if std::mem::take(&mut self.unreadable) {
            info!(socket = %self.socket.display(), "the kubelet's PodResources API answers again; leaked macvtaps are reclaimed and lost ones healed again");
        }
        let plan = self.plan(&links, &allocated, resources, Instant::now());
        self.observer
            .pod_resources_listed(resources, &allocated, self.grace, Instant::now());
        let work = self.work();
        let assignments = self.assignments.clone();
        let current = resources.to_vec();
        // The rest of the round on one blocking thread.
        let done = tokio::task::spawn_blocking(move || {
            let _pass = pass;
            forget_unconfigured(&assignments, &allocated, &current);
            work.carry_out(&plan, &current)
        })
        .await
        .map_err(|e| Error::Task(format!("the task healing and reclaiming links failed: {e}")))??;
        self.observer.links_healed(done.healed);
        if done.heal_failed > 0 {
            self.observer.heal_failed(done.heal_failed);
        }
        let removed = self.finish(&done);
        debug!(
            healed = done.healed,
            heal_failed = done.heal_failed,
            removed,
            "reclaim round done"
        );
        Ok(RoundOutcome::Done)
    }

    /// What a round does, decided from `links` (the host's, listed first)
    /// and `allocated` (the kubelet's answer, asked after) at `now`: the
    /// held devices whose link looks gone everywhere, and the links that
    /// have looked leaked past the grace period.
    pub fn plan(
        &mut self,
        links: &[Link],
        allocated: &HashSet<String>,
        resources: &[ResourceConfig],
        now: Instant,
    ) -> Plan {
        let kernel = self.kernel.clone();
        let dev_dir = self.paths.dev.clone();
        // Without tap nodes a link in a pod looks lost: nothing is (the
        // daemon said so at start).
        let lost = if self.paths.tap_nodes_shown() {
            lost_devices(allocated, &self.assignments, links, |i| {
                !matches!(kernel.tap_node(&tap_node_path(&dev_dir, i)), Ok(None))
            })
        } else {
            Vec::new()
        };
        let lowers: HashSet<String> = resources.iter().map(|r| r.lower_device.clone()).collect();
        self.clock
            .forget_older_than(self.grace.max(MIN_CLOCK_MEMORY), now);
        let mut leaked = leaked_links(links, &lowers, allocated);
        leaked.extend(go_era_leaked_links(links, resources, allocated));
        let due = self.due(&leaked, now);
        debug!(
            leaked = leaked.len(),
            due = due.len(),
            lost = lost.len(),
            "reclaim round planned"
        );
        Plan { lost, due }
    }

    /// The kernel half of a round, to run on a blocking thread.
    pub fn work(&self) -> RoundWork {
        RoundWork {
            kernel: self.kernel.clone(),
            paths: self.paths.clone(),
            clock: self.clock.clone(),
            grace: self.grace,
        }
    }

    /// Takes in what a round did: the links it deleted are no longer
    /// watched, and each is told to the observer. Returns how many went.
    pub fn finish(&mut self, done: &Done) -> u64 {
        for id in &done.deleted {
            self.first_seen.remove(id);
            self.observer.leaked_link_removed(&id.0, id.1);
        }
        done.deleted.len() as u64
    }
}

/// What a round decided ([`Reclaimer::plan`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Held devices whose link looked gone everywhere.
    pub lost: Vec<Lost>,
    /// Links that have looked leaked for longer than the grace period.
    pub due: Vec<Link>,
}

/// What a round did ([`RoundWork::carry_out`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Done {
    /// Lost links made again.
    pub healed: u64,
    /// Lost links that could not be made again (each is tried again next
    /// round).
    pub heal_failed: u64,
    /// Leaked links deleted, as (name, ifindex).
    pub deleted: Vec<(String, u32)>,
}

/// The kernel half of a round ([`Reclaimer::work`]): it heals, then deletes.
#[derive(Clone)]
pub struct RoundWork {
    kernel: SharedKernel,
    paths: HostPaths,
    clock: AllocationClock,
    grace: Duration,
}

impl RoundWork {
    /// Carries out `plan` with the current `resources`: re-creates the lost
    /// links, then deletes the leaked ones that are still what the plan saw
    /// and whose device no Allocate has handed out since (the plan is as
    /// old as the kubelet's answer: an Allocate may have reused the link
    /// meanwhile, and a pod's CNI ADD moved it).
    pub fn carry_out(&self, plan: &Plan, resources: &[ResourceConfig]) -> Result<Done> {
        let healed = if plan.lost.is_empty() {
            Healed::default()
        } else {
            heal(
                &Host::current(&*self.kernel)?.with_paths(self.paths.clone()),
                &plan.lost,
                resources,
            )?
        };
        let deleted = if plan.due.is_empty() {
            Vec::new()
        } else {
            delete_unallocated(
                self.kernel.links(None)?.as_ref(),
                &self.clock,
                self.grace,
                &plan.due,
            )?
        };
        Ok(Done {
            healed: healed.made,
            heal_failed: healed.failed,
            deleted,
        })
    }
}

impl fmt::Debug for Reclaimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reclaimer")
            .field("socket", &self.socket)
            .field("grace", &self.grace)
            .field("looking_leaked", &self.first_seen.len())
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

/// Deletes each of `links` from `handle`'s namespace that no Allocate has
/// handed out within `grace` and that is still the link it was (its name at
/// its ifindex, a macvtap), holding `clock` meanwhile so that no Allocate
/// starts on one in between; returns those it deleted (one gone by now is
/// neither deleted nor an error).
fn delete_unallocated(
    handle: &dyn Links,
    clock: &AllocationClock,
    grace: Duration,
    links: &[Link],
) -> Result<Vec<LinkIdentity>> {
    let held = clock.hold();
    let now = Instant::now();
    let mut deleted = Vec::new();
    for l in links {
        if held.allocated_within(&l.name, grace, now) {
            debug!(ifname = %l.name, ifindex = l.index,
                "keeping a link that looked leaked: its device was allocated since the round asked the kubelet");
            continue;
        }
        match handle.get_link_by_index(l.index) {
            Ok(Some(current)) if current.name == l.name && current.is_macvtap() => {}
            Ok(_) => {
                debug!(ifname = %l.name, ifindex = l.index,
                    "not deleting a link that looked leaked: it is no longer on the node as it was");
                continue;
            }
            Err(e) => {
                warn!(ifname = %l.name, error = %e, "could not look at a leaked macvtap before deleting it");
                continue;
            }
        }
        match handle.del_link(l.index, &l.name) {
            Ok(()) => {
                info!(ifname = %l.name, ifindex = l.index, "deleted a leaked macvtap (allocated to no pod)");
                deleted.push(identity(l));
            }
            Err(e) if e.errno() == Some(Errno::ENODEV) => {}
            Err(e) => warn!(ifname = %l.name, error = %e, "could not delete a leaked macvtap"),
        }
    }
    Ok(deleted)
}

/// Runs [`Reclaimer::run_once`] every `interval` with the current resources.
/// Also runs a round as soon as `tap_gone` reports a tap node deleted. Each
/// round's outcome goes to the reclaimer's observer.
pub(crate) async fn reclaim_loop(
    mut reclaimer: Reclaimer,
    interval: Duration,
    resources: tokio::sync::watch::Receiver<Vec<ResourceConfig>>,
    mut tap_gone: tokio::sync::mpsc::UnboundedReceiver<()>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watching = true;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            got = tap_gone.recv(), if watching => {
                if got.is_none() {
                    watching = false;
                    continue;
                }
                // One round for a burst of deletions.
                while tap_gone.try_recv().is_ok() {}
            }
        }
        let current = resources.borrow().clone();
        let outcome = match reclaimer.run_once(&current).await {
            Ok(outcome) => outcome,
            Err(e) => {
                warn!(error = %e, "leaked-link reclaim round failed");
                RoundOutcome::Failed
            }
        };
        reclaimer.observer.reclaim_round(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use macvtap_link::{MacvtapMode, Op, link_name_for_device};
    use test_support::fake::{FakeKernel, HOST, link};

    /// A reclaimer of `kernel` with a 60 s grace period and no PodResources
    /// socket.
    fn reclaimer_of(kernel: SharedKernel, clock: AllocationClock) -> Reclaimer {
        Reclaimer::new(
            kernel,
            "/nonexistent".into(),
            Duration::from_secs(60),
            clock,
        )
    }

    fn reclaimer(clock: AllocationClock) -> Reclaimer {
        reclaimer_of(Arc::new(FakeKernel::new()), clock)
    }

    /// A node on the fake kernel: resource `dp` on `lower0`, another NIC
    /// `eth9`, and macvtaps for `dpMvp0` and `dpMvp1` (`mvt…`), the Go
    /// plugin's `dpMvp7` and `dpMvp8`, and `eth9Mvp0` on `eth9`.
    fn node() -> (Arc<FakeKernel>, Vec<ResourceConfig>) {
        let kernel = Arc::new(FakeKernel::new());
        let lower = kernel.add_nic(HOST, "lower0");
        let eth9 = kernel.add_nic(HOST, "eth9");
        let host = kernel.links(None).unwrap();
        for (name, on) in [
            (link_name_for_device("dpMvp0"), &lower),
            (link_name_for_device("dpMvp1"), &lower),
            ("dpMvp7".to_string(), &lower),
            ("dpMvp8".to_string(), &lower),
            (link_name_for_device("eth9Mvp0"), &eth9),
        ] {
            host.add_macvtap_at(&name, on.index, MacvtapMode::Bridge, None, None)
                .unwrap();
        }
        drop(host);
        let resources = vec![ResourceConfig {
            name: "dp".into(),
            ..ResourceConfig::for_nic("lower0")
        }];
        (kernel, resources)
    }

    /// The names of the host's macvtaps, sorted.
    fn macvtaps(kernel: &FakeKernel) -> Vec<String> {
        let mut names: Vec<String> = kernel
            .links_of(HOST)
            .into_iter()
            .filter(Link::is_macvtap)
            .map(|l| l.name)
            .collect();
        names.sort();
        names
    }

    fn sorted(mut names: Vec<String>) -> Vec<String> {
        names.sort();
        names
    }

    /// One round at `at`: the host's links listed, then `allocated` as the
    /// kubelet's answer, the plan carried out at once.
    fn round_done(
        r: &mut Reclaimer,
        kernel: &FakeKernel,
        allocated: &[&str],
        resources: &[ResourceConfig],
        at: Instant,
    ) -> Done {
        let links = kernel.links(None).unwrap().list_links().unwrap();
        let allocated: HashSet<String> = allocated.iter().map(|s| s.to_string()).collect();
        let plan = r.plan(&links, &allocated, resources, at);
        let done = r.work().carry_out(&plan, resources).unwrap();
        r.finish(&done);
        done
    }

    /// How many links one round at `at` deleted (see [`round_done`]).
    async fn round(
        r: &mut Reclaimer,
        kernel: &FakeKernel,
        allocated: &[&str],
        resources: &[ResourceConfig],
        at: Instant,
    ) -> u64 {
        round_done(r, kernel, allocated, resources, at)
            .deleted
            .len() as u64
    }

    #[tokio::test]
    async fn leaked_and_go_era_links_go_after_the_grace_and_held_ones_never() {
        let (kernel, resources) = node();
        let mut r = reclaimer_of(kernel.clone(), AllocationClock::default());
        let held = ["dpMvp0", "dpMvp7"];
        let t0 = Instant::now();
        assert_eq!(round(&mut r, &kernel, &held, &resources, t0).await, 0);
        assert_eq!(kernel.count(Op::DelLink), 0, "nothing within the grace");
        let after = t0 + Duration::from_secs(61);
        assert_eq!(round(&mut r, &kernel, &held, &resources, after).await, 2);
        // Our NIC's unheld mvt… link and the Go plugin's unheld link went;
        // the held ones and the other NIC's stay.
        assert_eq!(
            macvtaps(&kernel),
            sorted(vec![
                link_name_for_device("dpMvp0"),
                "dpMvp7".into(),
                link_name_for_device("eth9Mvp0"),
            ])
        );
        let much_later = t0 + Duration::from_secs(3600);
        assert_eq!(
            round(&mut r, &kernel, &held, &resources, much_later).await,
            0
        );
        assert_eq!(kernel.count(Op::DelLink), 2, "a held link is never deleted");
    }

    #[tokio::test]
    async fn the_grace_is_counted_per_link_identity() {
        let (kernel, resources) = node();
        let mut r = reclaimer_of(kernel.clone(), AllocationClock::default());
        let t0 = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(round(&mut r, &kernel, &[], &resources, t0).await, 0);
        // dpMvp1's link is deleted and made again: same name, new ifindex.
        let name = link_name_for_device("dpMvp1");
        let old = kernel.link(HOST, &name).unwrap();
        let host = kernel.links(None).unwrap();
        host.del_link(old.index, &name).unwrap();
        let lower = kernel.link(HOST, "lower0").unwrap();
        let new = host
            .add_macvtap_at(&name, lower.index, MacvtapMode::Bridge, None, None)
            .unwrap();
        assert_ne!(new.index, old.index);
        assert_eq!(round(&mut r, &kernel, &[], &resources, t0 + s(30)).await, 0);
        // The others have looked leaked for 61 s, the new link for 31 s.
        assert_eq!(round(&mut r, &kernel, &[], &resources, t0 + s(61)).await, 3);
        assert_eq!(kernel.link(HOST, &name), Some(new));
        assert_eq!(round(&mut r, &kernel, &[], &resources, t0 + s(91)).await, 1);
        assert_eq!(macvtaps(&kernel), [link_name_for_device("eth9Mvp0")]);
    }

    #[tokio::test]
    async fn a_link_allocated_within_the_grace_is_kept_and_a_failed_delete_retried() {
        let (kernel, resources) = node();
        let clock = AllocationClock::default();
        let mut r = reclaimer_of(kernel.clone(), clock.clone());
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let held = ["dpMvp7", "dpMvp8"];
        assert_eq!(round(&mut r, &kernel, &held, &resources, t0).await, 0);
        // dpMvp0 was allocated again 11 s before the grace ends (its pod is
        // not in PodResources yet); deleting dpMvp1 fails once.
        clock.allocated(&link_name_for_device("dpMvp0"), t0 + s(50));
        kernel.fail(Op::DelLink, 1, Errno::EIO);
        assert_eq!(
            round(&mut r, &kernel, &held, &resources, t0 + s(61)).await,
            0
        );
        assert_eq!(
            macvtaps(&kernel).len(),
            5,
            "kept: allocated within the grace; failed: still there"
        );
        assert_eq!(
            round(&mut r, &kernel, &held, &resources, t0 + s(62)).await,
            1
        );
        assert!(kernel.link(HOST, &link_name_for_device("dpMvp1")).is_none());
        assert_eq!(
            round(&mut r, &kernel, &held, &resources, t0 + s(111)).await,
            1
        );
        assert!(kernel.link(HOST, &link_name_for_device("dpMvp0")).is_none());
    }

    #[tokio::test]
    async fn devices_neither_held_nor_of_a_configured_resource_are_forgotten() {
        let (_, resources) = node();
        let assignments = Assignments::default();
        assignments.assigned("dpMvp3", "dp", 40);
        assignments.assigned("oldMvp0", "old", 41);
        assignments.assigned("oldMvp1", "old", 42);
        let allocated: HashSet<String> = ["oldMvp1".to_string()].into();
        forget_unconfigured(&assignments, &allocated, &resources);
        assert!(assignments.get("dpMvp3").is_some(), "configured");
        assert!(
            assignments.get("oldMvp0").is_none(),
            "gone with its resource"
        );
        assert!(assignments.get("oldMvp1").is_some(), "still held");
    }

    #[tokio::test]
    async fn a_round_heals_a_lost_link_and_never_takes_it_for_leaked() {
        let (kernel, resources) = node();
        let assignments = Assignments::default();
        assignments.assigned("dpMvp3", "dp", 40);
        let dev = tempfile::tempdir().unwrap();
        let mut r = reclaimer_of(kernel.clone(), AllocationClock::default())
            .with_healing(assignments, HostPaths::with_dev(dev.path()));
        // dpMvp3's link is gone from the host, and its tap node with it.
        let t0 = Instant::now();
        let held = ["dpMvp3"];
        assert_eq!(round_done(&mut r, &kernel, &held, &resources, t0).healed, 1);
        let healed = kernel.link(HOST, &link_name_for_device("dpMvp3")).unwrap();
        assert_eq!(healed.index, 40);
        assert!(kernel.tap_node(40).is_some(), "the kernel made its node");
        for at in [t0, t0 + Duration::from_secs(61)] {
            assert_eq!(round_done(&mut r, &kernel, &held, &resources, at).healed, 0);
        }
        assert_eq!(kernel.link(HOST, &healed.name), Some(healed));
        assert_eq!(
            kernel.count(Op::AddMacvtap),
            6,
            "five for the node, one healed"
        );
    }

    #[tokio::test]
    async fn a_round_counts_the_lost_links_it_cannot_make_again() {
        let (kernel, _) = node();
        let assignments = Assignments::default();
        assignments.assigned("dpMvp3", "dp", 40);
        let dev = tempfile::tempdir().unwrap();
        let mut r = reclaimer_of(kernel.clone(), AllocationClock::default())
            .with_healing(assignments, HostPaths::with_dev(dev.path()));
        // dpMvp3 is held and its link gone, and its resource's NIC too.
        let gone = vec![ResourceConfig {
            name: "dp".into(),
            ..ResourceConfig::for_nic("gone0")
        }];
        let t0 = Instant::now();
        for at in [t0, t0 + Duration::from_secs(1)] {
            let done = round_done(&mut r, &kernel, &["dpMvp3"], &gone, at);
            assert_eq!(
                (done.healed, done.heal_failed),
                (0, 1),
                "each round tries again"
            );
        }
        assert_eq!(kernel.count(Op::AddMacvtap), 5, "only the node's");
    }

    #[test]
    fn links_are_due_only_after_the_grace_period() {
        let mut r = reclaimer(AllocationClock::default());
        let l = vec![link(11, "mvt000000000001", "macvtap", Some(2))];
        let t0 = Instant::now();
        assert!(r.due(&l, t0).is_empty());
        assert!(r.due(&l, t0 + Duration::from_secs(30)).is_empty());
        assert_eq!(r.due(&l, t0 + Duration::from_secs(61)).len(), 1);
        // A link that stops looking leaked starts over.
        assert!(r.due(&[], t0 + Duration::from_secs(62)).is_empty());
        assert!(r.due(&l, t0 + Duration::from_secs(63)).is_empty());
    }

    #[test]
    fn a_recreated_link_starts_over() {
        let mut r = reclaimer(AllocationClock::default());
        let t0 = Instant::now();
        assert!(
            r.due(&[link(11, "mvt000000000001", "macvtap", Some(2))], t0)
                .is_empty()
        );
        // Same name, new ifindex: a new link, whose clock starts now.
        let again = vec![link(12, "mvt000000000001", "macvtap", Some(2))];
        assert!(r.due(&again, t0 + Duration::from_secs(61)).is_empty());
        assert_eq!(r.due(&again, t0 + Duration::from_secs(122)).len(), 1);
    }

    #[test]
    fn a_link_allocated_within_the_grace_period_is_kept() {
        let clock = AllocationClock::default();
        let mut r = reclaimer(clock.clone());
        let l = vec![link(11, "mvt000000000001", "macvtap", Some(2))];
        let t0 = Instant::now();
        assert!(r.due(&l, t0).is_empty());
        // Looked leaked for 100 s, but allocated again 10 s ago.
        clock.allocated("mvt000000000001", t0 + Duration::from_secs(90));
        assert!(r.due(&l, t0 + Duration::from_secs(100)).is_empty());
        assert!(r.due(&l, t0 + Duration::from_secs(149)).is_empty());
        assert_eq!(r.due(&l, t0 + Duration::from_secs(151)).len(), 1);
    }

    #[tokio::test]
    async fn unreadable_pod_resources_delete_and_heal_nothing_and_say_so_once() {
        use test_kubelet::pod_resources::TestPodResources;
        let (kernel, resources) = node();
        // dpMvp3 is held and its link gone (it would be healed); every
        // other macvtap of dp is held by no pod (it would be deleted: no grace).
        let assignments = Assignments::default();
        assignments.assigned("dpMvp3", "dp", 40);
        let kubelet_dir = tempfile::tempdir().unwrap();
        let socket = kubelet_dir.path().join("pod-resources/kubelet.sock");
        let dev = tempfile::tempdir().unwrap();
        let observer = Arc::new(crate::core::report::Recorder::default());
        let mut r = Reclaimer::new(
            kernel.clone(),
            socket.clone(),
            Duration::ZERO,
            AllocationClock::default(),
        )
        .with_healing(assignments, HostPaths::with_dev(dev.path()))
        .with_observer(observer.clone());
        let (guard, log) = crate::testlog::capture();
        // Not mounted: no socket, twice.
        for _ in 0..2 {
            let outcome = r.run_once(&resources).await.unwrap();
            assert_eq!(outcome, RoundOutcome::Skipped);
        }
        // Mounted, but the kubelet does not answer.
        let server = TestPodResources::start(&socket).await.unwrap();
        server.fail(Some(tonic::Code::Unavailable));
        let outcome = r.run_once(&resources).await.unwrap();
        assert_eq!(outcome, RoundOutcome::Failed);
        assert_eq!(kernel.count(Op::DelLink), 0, "nothing deleted");
        assert_eq!(kernel.count(Op::AddMacvtap), 5, "nothing healed");
        let said = log.text();
        assert_eq!(
            said.matches("leaked-link reclaim and heal are off").count(),
            1,
            "said once: {said}"
        );
        let dir = socket.parent().unwrap().display().to_string();
        assert!(
            said.contains(&format!("mount the host's {dir} (hostPath)")),
            "{said}"
        );
        // Told once for the outage, in the words of that moment.
        let gaps = observer.gaps.lock().unwrap().clone();
        assert!(
            matches!(&gaps[..], [Degraded::NoPodResources { .. }]),
            "{gaps:?}"
        );
        let told: Vec<String> = observer
            .lines()
            .into_iter()
            .filter(|l| l.starts_with("degraded "))
            .collect();
        assert!(
            matches!(&told[..], [what]
                if what.contains("its directory is not mounted in this container")
                    && what.contains(&format!("mount the host's {dir} (hostPath)"))),
            "{told:?}"
        );
        // It answers: the round works again, and says so.
        server.fail(None);
        server.set_allocated("macvtap.network.kubevirt.io/dp", &["dpMvp3"]);
        let outcome = r.run_once(&resources).await.unwrap();
        drop(guard);
        assert_eq!(outcome, RoundOutcome::Done);
        assert!(log.text().contains("answers again"), "{}", log.text());
        assert_eq!(
            kernel.count(Op::DelLink),
            4,
            "dpMvp0, dpMvp1, dpMvp7, dpMvp8"
        );
        assert!(kernel.link(HOST, &link_name_for_device("dpMvp3")).is_some());
    }

    #[tokio::test]
    async fn without_the_hosts_dev_a_round_heals_nothing() {
        let (kernel, resources) = node();
        let assignments = Assignments::default();
        assignments.assigned("dpMvp3", "dp", 40);
        let dev = tempfile::tempdir().unwrap();
        let paths = HostPaths {
            tap_nodes: crate::core::host::TapNodes::Unseen {
                fstype: "tmpfs".into(),
            },
            ..HostPaths::with_dev(dev.path())
        };
        let mut r = reclaimer_of(kernel.clone(), AllocationClock::default())
            .with_healing(assignments, paths);
        // dpMvp3's link and node are not seen: it may be in its pod.
        let done = round_done(&mut r, &kernel, &["dpMvp3"], &resources, Instant::now());
        assert_eq!(done.healed, 0);
        assert!(kernel.link(HOST, &link_name_for_device("dpMvp3")).is_none());
        assert_eq!(kernel.count(Op::AddMacvtap), 5, "only the node's");
    }
}
