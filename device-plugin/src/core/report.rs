//! What the core, and a front serving devices, tell the people who run the
//! node as they work: one small trait, [`Observer`], that the operator's
//! front implements (its metrics and Events, in the daemon), so neither the
//! core nor the kubelet's front imports it. [`Silent`] tells no one.

use crate::config::ResourceConfig;
use crate::core::degraded::Degraded;
use crate::error::Error;
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Something that was where a file of the record belongs and was not one
/// the daemon made (a symbolic link, a FIFO, a device node, a directory, a
/// hard link), which the daemon removed (from the
/// record's directory; `core::ledger::record_file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Planted {
    /// Where it was.
    pub path: PathBuf,
    /// What it was, as a phrase: `a symbolic link to "/host/cni-bin/multus-shim"`.
    pub what: String,
}

/// How a reclaim round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RoundOutcome {
    /// The round asked the kubelet and acted on its answer.
    Done,
    /// There was no PodResources socket, so the round did nothing.
    Skipped,
    /// The round failed (a netlink or PodResources error, logged).
    Failed,
}

/// Where the core and the fronts report what they did and what they found:
/// devices handed out and requests refused, health changes, reclaim rounds,
/// links healed (or not) and removed, what a missing mount leaves undone, and what
/// was planted where the record keeps its files.
pub(crate) trait Observer: Send + Sync + std::fmt::Debug {
    /// A front handed out `device_ids` of `resource` at `now` (the kubelet's
    /// Allocate), `took` after the request came.
    fn handed_out(&self, resource: &str, device_ids: &[String], took: Duration, now: Instant);

    /// A front refused a request for devices of `resource` with `error`,
    /// `took` after it came.
    fn refused(&self, resource: &str, took: Duration, error: &Error);

    /// A resource's devices turned Unhealthy for `reason` (a
    /// [`NicHealth::reason`](crate::core::nic::health::NicHealth::reason)).
    fn unhealthy(&self, resource: &str, reason: &'static str);

    /// A reclaim round read PodResources at `now`: `allocated` are the
    /// device IDs pods hold, of `resources`, whose hand-outs count as in
    /// use for `grace` before PodResources lists them.
    fn pod_resources_listed(
        &self,
        resources: &[ResourceConfig],
        allocated: &HashSet<String>,
        grace: Duration,
        now: Instant,
    );

    /// A round re-created `n` lost links for the pods that hold their
    /// devices.
    fn links_healed(&self, n: u64);

    /// A round could not re-create `n` lost links (each logged with why).
    fn heal_failed(&self, n: u64);

    /// A round deleted leaked link `link`, which was at `ifindex`.
    fn leaked_link_removed(&self, link: &str, ifindex: u32);

    /// A reclaim round ended with `outcome`.
    fn reclaim_round(&self, outcome: RoundOutcome);

    /// A mount of the host's is missing and `gap` is what that leaves
    /// undone (said once per outage).
    fn degraded(&self, gap: &Degraded);

    /// Something else on the node had put `planted` where the record of
    /// handed-out devices keeps a file, and it was removed (said once per
    /// removal).
    fn planted_removed(&self, planted: &Planted);
}

/// An observer that tells no one (the default of a reclaimer).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Silent;

impl Observer for Silent {
    fn handed_out(&self, _: &str, _: &[String], _: Duration, _: Instant) {}
    fn refused(&self, _: &str, _: Duration, _: &Error) {}
    fn unhealthy(&self, _: &str, _: &'static str) {}
    fn pod_resources_listed(
        &self,
        _: &[ResourceConfig],
        _: &HashSet<String>,
        _: Duration,
        _: Instant,
    ) {
    }
    fn links_healed(&self, _: u64) {}
    fn heal_failed(&self, _: u64) {}
    fn leaked_link_removed(&self, _: &str, _: u32) {}
    fn reclaim_round(&self, _: RoundOutcome) {}
    fn degraded(&self, _: &Degraded) {}
    fn planted_removed(&self, _: &Planted) {}
}

/// An observer that records what it was told, for unit tests.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    /// Each call, as a line such as `unhealthy dp nic_down`.
    pub(crate) said: std::sync::Mutex<Vec<String>>,
    /// The gaps [`Observer::degraded`] was told of.
    pub(crate) gaps: std::sync::Mutex<Vec<Degraded>>,
}

#[cfg(test)]
impl Recorder {
    fn say(&self, line: String) {
        self.said.lock().unwrap().push(line);
    }

    /// The lines said so far.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.said.lock().unwrap().clone()
    }
}

#[cfg(test)]
impl Observer for Recorder {
    fn handed_out(&self, resource: &str, device_ids: &[String], _: Duration, _: Instant) {
        self.say(format!("handed out {resource} {}", device_ids.join(",")));
    }
    fn refused(&self, resource: &str, _: Duration, error: &Error) {
        self.say(format!("refused {resource} {error}"));
    }
    fn unhealthy(&self, resource: &str, reason: &'static str) {
        self.say(format!("unhealthy {resource} {reason}"));
    }
    fn pod_resources_listed(
        &self,
        _: &[ResourceConfig],
        allocated: &HashSet<String>,
        _: Duration,
        _: Instant,
    ) {
        self.say(format!("listed {}", allocated.len()));
    }
    fn links_healed(&self, n: u64) {
        self.say(format!("healed {n}"));
    }
    fn heal_failed(&self, n: u64) {
        self.say(format!("heal failed {n}"));
    }
    fn leaked_link_removed(&self, link: &str, ifindex: u32) {
        self.say(format!("removed {link} {ifindex}"));
    }
    fn reclaim_round(&self, outcome: RoundOutcome) {
        self.say(format!("round {outcome:?}"));
    }
    fn degraded(&self, gap: &Degraded) {
        self.say(format!("degraded {gap}"));
        self.gaps.lock().unwrap().push(gap.clone());
    }
    fn planted_removed(&self, planted: &Planted) {
        self.say(format!(
            "planted {} {}",
            planted.path.display(),
            planted.what
        ));
    }
}
