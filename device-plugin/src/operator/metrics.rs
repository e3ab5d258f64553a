//! The daemon's metrics: counters, gauges and the Allocate latency
//! histogram as `prometheus-client` families, with the standard `process_*`
//! metrics (`crate::operator::procstat`) and a build-info gauge, rendered in the
//! OpenMetrics text format that Prometheus scrapes.
//!
//! Counters are OpenMetrics families named without `_total` (`# TYPE
//! macvtap_dp_allocations counter`); their one sample, and the series
//! Prometheus stores, is `macvtap_dp_allocations_total`.

use crate::config::ResourceConfig;
use crate::core::report::RoundOutcome;
use crate::operator::procstat::ProcessCollector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Upper bounds of the Allocate latency buckets, in seconds. Allocate
/// creates one macvtap and waits for its tap node: a few milliseconds when
/// all is well, up to the node wait's seconds when it is not.
pub const ALLOCATE_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The `reason` label values of `macvtap_dp_unhealthy_total`.
pub(crate) const UNHEALTHY_REASONS: [&str; 4] = [
    "nic_missing",
    "nic_down",
    "nic_enslaved",
    "nic_port_in_the_way",
];

/// The `state` label values of `macvtap_dp_devices`.
const DEVICE_STATES: [&str; 2] = ["healthy", "unhealthy"];

// How a reclaim round ended (the core's), counted in
// `macvtap_dp_reclaim_rounds_total`.
impl RoundOutcome {
    /// Every outcome, in the order the page lists them.
    const ALL: [RoundOutcome; 3] = [
        RoundOutcome::Done,
        RoundOutcome::Skipped,
        RoundOutcome::Failed,
    ];

    /// The `outcome` label value.
    pub(crate) fn label(self) -> &'static str {
        match self {
            RoundOutcome::Done => "done",
            RoundOutcome::Skipped => "skipped",
            RoundOutcome::Failed => "failed",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabels {
    resource: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UnhealthyLabels {
    resource: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

/// Which devices of one resource are in use, for the free and in-use
/// gauges: those the kubelet's PodResources listed as allocated at the last
/// reclaim round, and those Allocate handed out within the reclaim grace
/// (a pod is not listed until its container starts).
#[derive(Debug, Default)]
struct Usage {
    /// Devices advertised, healthy or not.
    advertised: u64,
    /// Device IDs the kubelet listed as allocated.
    listed: HashSet<String>,
    /// Device IDs Allocate handed out, and when.
    handed_out: HashMap<String, Instant>,
}

impl Usage {
    /// Devices in use: listed by the kubelet or handed out lately.
    fn in_use(&self) -> u64 {
        let extra = self
            .handed_out
            .keys()
            .filter(|id| !self.listed.contains(*id))
            .count();
        (self.listed.len() + extra) as u64
    }
}

/// A histogram with the [`ALLOCATE_BUCKETS`] bounds.
fn allocate_histogram() -> Histogram {
    Histogram::new(ALLOCATE_BUCKETS)
}

/// The daemon's metrics, shared by its tasks and the HTTP server.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    devices: Family<DeviceLabels, Gauge>,
    devices_in_use: Family<ResourceLabels, Gauge>,
    devices_free: Family<ResourceLabels, Gauge>,
    registered: Family<ResourceLabels, Gauge>,
    unhealthy: Family<UnhealthyLabels, Counter>,
    allocations: Family<ResourceLabels, Counter>,
    allocation_errors: Family<ResourceLabels, Counter>,
    allocate_seconds: Family<ResourceLabels, Histogram, fn() -> Histogram>,
    registrations: Family<ResourceLabels, Counter>,
    registration_errors: Family<ResourceLabels, Counter>,
    leaked_links_removed: Counter,
    links_healed: Counter,
    heal_errors: Counter,
    reclaim_rounds: Family<OutcomeLabels, Counter>,
    config_reloads: Counter,
    config_reload_errors: Counter,
    config_last_reload_successful: Gauge,
    /// Resources whose series exist: each gets all of them, at 0, the
    /// first time it is named, since a series that appears only on its
    /// first increment breaks `rate()`.
    resources: Mutex<HashSet<String>>,
    /// Per resource, which devices are in use.
    usage: Mutex<HashMap<String, Usage>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            devices: Family::default(),
            devices_in_use: Family::default(),
            devices_free: Family::default(),
            registered: Family::default(),
            unhealthy: Family::default(),
            allocations: Family::default(),
            allocation_errors: Family::default(),
            allocate_seconds: Family::new_with_constructor(allocate_histogram),
            registrations: Family::default(),
            registration_errors: Family::default(),
            leaked_links_removed: Counter::default(),
            links_healed: Counter::default(),
            heal_errors: Counter::default(),
            reclaim_rounds: Family::default(),
            config_reloads: Counter::default(),
            config_reload_errors: Counter::default(),
            config_last_reload_successful: Gauge::default(),
            resources: Mutex::default(),
            usage: Mutex::default(),
            registry: Registry::default(),
        };
        // The registry appends the full stop to each help text.
        registry.register(
            "macvtap_dp_devices",
            "Devices advertised, by health",
            m.devices.clone(),
        );
        registry.register(
            "macvtap_dp_devices_in_use",
            "Devices in use: allocated to a pod per the kubelet, or handed out by Allocate within the reclaim grace",
            m.devices_in_use.clone(),
        );
        registry.register(
            "macvtap_dp_devices_free",
            "Devices advertised and not in use, healthy or not",
            m.devices_free.clone(),
        );
        registry.register(
            "macvtap_dp_registered",
            "Whether the resource is registered with the kubelet (1) or not (0)",
            m.registered.clone(),
        );
        registry.register(
            "macvtap_dp_unhealthy",
            "Times a resource's devices became Unhealthy, by reason (nic_missing, nic_down, nic_enslaved, nic_port_in_the_way)",
            m.unhealthy.clone(),
        );
        registry.register(
            "macvtap_dp_allocations",
            "Successful Allocate calls",
            m.allocations.clone(),
        );
        registry.register(
            "macvtap_dp_allocation_errors",
            "Failed Allocate calls",
            m.allocation_errors.clone(),
        );
        registry.register(
            "macvtap_dp_allocate_seconds",
            "Time Allocate took, successful or not, in seconds",
            m.allocate_seconds.clone(),
        );
        registry.register(
            "macvtap_dp_registrations",
            "Successful registrations with the kubelet",
            m.registrations.clone(),
        );
        registry.register(
            "macvtap_dp_registration_errors",
            "Failed registration attempts",
            m.registration_errors.clone(),
        );
        registry.register(
            "macvtap_dp_leaked_links_removed",
            "Leaked macvtap links removed",
            m.leaked_links_removed.clone(),
        );
        registry.register(
            "macvtap_dp_links_healed",
            "Lost macvtaps re-created for the pods that still hold their devices",
            m.links_healed.clone(),
        );
        registry.register(
            "macvtap_dp_heal_errors",
            "Lost macvtaps a reclaim round could not re-create (each round that tries again counts again)",
            m.heal_errors.clone(),
        );
        registry.register(
            "macvtap_dp_reclaim_rounds",
            "Reclaim rounds, by outcome (done, skipped without a PodResources socket, failed)",
            m.reclaim_rounds.clone(),
        );
        for outcome in RoundOutcome::ALL {
            let _ = m.reclaim_rounds.get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            });
        }
        registry.register(
            "macvtap_dp_config_reloads",
            "Config file changes applied",
            m.config_reloads.clone(),
        );
        registry.register(
            "macvtap_dp_config_reload_errors",
            "Config file changes rejected",
            m.config_reload_errors.clone(),
        );
        // Until a change is refused, what runs is what the file says: a
        // config the daemon refuses at start stops it.
        m.config_last_reload_successful.set(1);
        registry.register(
            "macvtap_dp_config_last_reload_successful",
            "Whether the last config file change was applied (1; also before any change) or refused (0)",
            m.config_last_reload_successful.clone(),
        );
        let build_info = Family::<VersionLabels, Gauge>::default();
        build_info
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register(
            "macvtap_dp_build_info",
            "The running build: its version as a label, value always 1",
            build_info,
        );
        registry.register_collector(Box::new(ProcessCollector));
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// Creates every series of `resource` at 0 the first time it is named.
    fn touch(&self, resource: &str) {
        // A panic while holding the lock cannot leave the set inconsistent
        // in a way that matters, so a poisoned lock is used as is.
        let mut known = self.resources.lock().unwrap_or_else(|e| e.into_inner());
        if known.contains(resource) {
            return;
        }
        known.insert(resource.to_string());
        let r = ResourceLabels {
            resource: resource.to_string(),
        };
        for state in DEVICE_STATES {
            let _ = self.devices.get_or_create(&DeviceLabels {
                resource: resource.to_string(),
                state,
            });
        }
        for reason in UNHEALTHY_REASONS {
            let _ = self.unhealthy.get_or_create(&UnhealthyLabels {
                resource: resource.to_string(),
                reason,
            });
        }
        let _ = self.devices_in_use.get_or_create(&r);
        let _ = self.devices_free.get_or_create(&r);
        let _ = self.registered.get_or_create(&r);
        let _ = self.allocations.get_or_create(&r);
        let _ = self.allocation_errors.get_or_create(&r);
        let _ = self.allocate_seconds.get_or_create(&r);
        let _ = self.registrations.get_or_create(&r);
        let _ = self.registration_errors.get_or_create(&r);
    }

    fn resource(resource: &str) -> ResourceLabels {
        ResourceLabels {
            resource: resource.to_string(),
        }
    }

    /// Sets the device gauges of `resource`.
    pub fn set_devices(&self, resource: &str, healthy: u64, unhealthy: u64) {
        self.touch(resource);
        for (state, n) in [("healthy", healthy), ("unhealthy", unhealthy)] {
            self.devices
                .get_or_create(&DeviceLabels {
                    resource: resource.to_string(),
                    state,
                })
                .set(gauge_value(n));
        }
        self.with_usage(resource, |u| {
            u.advertised = healthy.saturating_add(unhealthy)
        });
    }

    /// Zeroes the gauges of a resource that is no longer served.
    pub(crate) fn resource_removed(&self, resource: &str) {
        self.set_devices(resource, 0, 0);
        self.with_usage(resource, |u| *u = Usage::default());
        self.set_registered(resource, false);
    }

    /// Sets whether `resource` is registered with the kubelet.
    pub fn set_registered(&self, resource: &str, registered: bool) {
        self.touch(resource);
        self.registered
            .get_or_create(&Self::resource(resource))
            .set(i64::from(registered));
    }

    /// Records that Allocate handed out `device_ids` of `resource` at `now`:
    /// they are in use until a reclaim round after the grace finds the
    /// kubelet no longer lists them.
    pub fn handed_out(&self, resource: &str, device_ids: &[String], now: Instant) {
        self.with_usage(resource, |u| {
            for id in device_ids {
                u.handed_out.insert(id.clone(), now);
            }
        });
    }

    /// Takes in a reclaim round's answer from the kubelet: `allocated` (the
    /// device IDs PodResources lists) for each resource of `resources`;
    /// devices handed out longer than `grace` before `now` and not listed
    /// are no longer in use.
    pub(crate) fn pod_resources_listed(
        &self,
        resources: &[ResourceConfig],
        allocated: &HashSet<String>,
        grace: Duration,
        now: Instant,
    ) {
        for cfg in resources {
            let listed: HashSet<String> = allocated
                .iter()
                .filter(|id| {
                    macvtap_link::parse_device_id(id).is_some_and(|(name, _)| name == cfg.name)
                })
                .cloned()
                .collect();
            self.with_usage(&cfg.resource_name(), |u| {
                u.handed_out
                    .retain(|_, at| now.saturating_duration_since(*at) < grace);
                u.listed = listed;
            });
        }
    }

    /// Changes the usage of `resource` with `f`, then sets its free and
    /// in-use gauges from it.
    fn with_usage(&self, resource: &str, f: impl FnOnce(&mut Usage)) {
        self.touch(resource);
        // As in `touch`, a poisoned lock is used as is.
        let mut all = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let u = all.entry(resource.to_string()).or_default();
        f(u);
        let in_use = u.in_use();
        let r = Self::resource(resource);
        self.devices_in_use
            .get_or_create(&r)
            .set(gauge_value(in_use));
        self.devices_free
            .get_or_create(&r)
            .set(gauge_value(u.advertised.saturating_sub(in_use)));
    }

    /// Counts the devices of `resource` becoming Unhealthy for `reason`
    /// (`nic_missing`, `nic_down`, `nic_enslaved`, `nic_port_in_the_way`).
    pub fn unhealthy(&self, resource: &str, reason: &'static str) {
        self.touch(resource);
        self.unhealthy
            .get_or_create(&UnhealthyLabels {
                resource: resource.to_string(),
                reason,
            })
            .inc();
    }

    /// Counts one Allocate call.
    pub fn allocation(&self, resource: &str, ok: bool, took: Duration) {
        self.touch(resource);
        let r = Self::resource(resource);
        if ok {
            self.allocations.get_or_create(&r).inc();
        } else {
            self.allocation_errors.get_or_create(&r).inc();
        }
        self.allocate_seconds
            .get_or_create(&r)
            .observe(took.as_secs_f64());
    }

    /// Counts one registration attempt with the kubelet.
    pub fn registration(&self, resource: &str, ok: bool) {
        self.touch(resource);
        let r = Self::resource(resource);
        if ok {
            self.registrations.get_or_create(&r).inc();
        } else {
            self.registration_errors.get_or_create(&r).inc();
        }
    }

    /// Counts leaked links removed.
    pub fn leaked_links_removed(&self, n: u64) {
        self.leaked_links_removed.inc_by(n);
    }

    /// Counts lost macvtaps re-created for the pods that hold their devices.
    pub fn links_healed(&self, n: u64) {
        self.links_healed.inc_by(n);
    }

    /// Counts lost macvtaps a round could not re-create.
    pub fn heal_errors(&self, n: u64) {
        self.heal_errors.inc_by(n);
    }

    /// Counts one reclaim round by how it ended.
    pub(crate) fn reclaim_round(&self, outcome: RoundOutcome) {
        self.reclaim_rounds
            .get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            })
            .inc();
    }

    /// Counts a config file reload attempt, and remembers whether it was
    /// applied until the next one.
    pub fn config_reload(&self, ok: bool) {
        if ok {
            self.config_reloads.inc();
        } else {
            self.config_reload_errors.inc();
        }
        self.config_last_reload_successful.set(i64::from(ok));
    }

    /// The OpenMetrics text exposition of every metric, ending in `# EOF`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; a collector that could not read
        // /proc writes nothing rather than an error.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// A count as a gauge's value.
fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_openmetrics_text() {
        let m = Metrics::default();
        m.set_devices("macvtap.network.kubevirt.io/eth0", 3, 0);
        m.allocation(
            "macvtap.network.kubevirt.io/eth0",
            true,
            Duration::from_millis(5),
        );
        m.allocation("macvtap.network.kubevirt.io/eth0", false, Duration::ZERO);
        m.registration("macvtap.network.kubevirt.io/eth0", true);
        m.leaked_links_removed(2);
        m.reclaim_round(RoundOutcome::Skipped);
        m.reclaim_round(RoundOutcome::Skipped);
        m.reclaim_round(RoundOutcome::Failed);
        m.heal_errors(2);
        let t = m.render();
        let e = "resource=\"macvtap.network.kubevirt.io/eth0\"";
        // 5 ms and 0 s: both in the 0.005 bucket, one in 0.001. The
        // encoder writes `le` first in bucket samples.
        for want in [
            "macvtap_dp_reclaim_rounds_total{outcome=\"done\"} 0\n".to_string(),
            "macvtap_dp_reclaim_rounds_total{outcome=\"skipped\"} 2\n".to_string(),
            "macvtap_dp_reclaim_rounds_total{outcome=\"failed\"} 1\n".to_string(),
            format!("macvtap_dp_devices{{{e},state=\"healthy\"}} 3\n"),
            format!("macvtap_dp_allocations_total{{{e}}} 1\n"),
            format!("macvtap_dp_allocation_errors_total{{{e}}} 1\n"),
            format!("macvtap_dp_registrations_total{{{e}}} 1\n"),
            format!("macvtap_dp_unhealthy_total{{{e},reason=\"nic_down\"}} 0\n"),
            "macvtap_dp_leaked_links_removed_total 2\n".to_string(),
            "macvtap_dp_links_healed_total 0\n".to_string(),
            "macvtap_dp_heal_errors_total 2\n".to_string(),
            "macvtap_dp_config_last_reload_successful 1\n".to_string(),
            "# TYPE macvtap_dp_config_last_reload_successful gauge\n".to_string(),
            "# TYPE macvtap_dp_devices gauge\n".to_string(),
            "# HELP macvtap_dp_allocations Successful Allocate calls.\n".to_string(),
            "# TYPE macvtap_dp_allocations counter\n".to_string(),
            "# TYPE macvtap_dp_allocate_seconds histogram\n".to_string(),
            format!("macvtap_dp_allocate_seconds_bucket{{le=\"0.001\",{e}}} 1\n"),
            format!("macvtap_dp_allocate_seconds_bucket{{le=\"0.0025\",{e}}} 1\n"),
            format!("macvtap_dp_allocate_seconds_bucket{{le=\"0.005\",{e}}} 2\n"),
            format!("macvtap_dp_allocate_seconds_bucket{{le=\"10.0\",{e}}} 2\n"),
            format!("macvtap_dp_allocate_seconds_bucket{{le=\"+Inf\",{e}}} 2\n"),
            format!("macvtap_dp_allocate_seconds_sum{{{e}}} 0.005\n"),
            format!("macvtap_dp_allocate_seconds_count{{{e}}} 2\n"),
            format!(
                "macvtap_dp_build_info{{version=\"{}\"}} 1\n",
                env!("CARGO_PKG_VERSION")
            ),
            "# TYPE process_cpu_seconds counter\n".to_string(),
            "# TYPE process_resident_memory_bytes gauge\n".to_string(),
            "# TYPE process_open_fds gauge\n".to_string(),
            "# TYPE process_start_time_seconds gauge\n".to_string(),
        ] {
            assert!(t.contains(&want), "want {want:?} in:\n{t}");
        }
        assert!(t.ends_with("# EOF\n"), "{t}");
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::default();
        m.set_devices("a\"b\\c\nd", 1, 0);
        let t = m.render();
        assert!(
            t.contains("macvtap_dp_devices{resource=\"a\\\"b\\\\c\\nd\",state=\"healthy\"} 1\n"),
            "{t}"
        );
    }

    /// The value of the sample `name{resource="R"}` on the page.
    fn sample(m: &Metrics, name: &str, resource: &str) -> Option<String> {
        let head = format!("{name}{{resource=\"{resource}\"}} ");
        m.render()
            .lines()
            .find_map(|l| l.strip_prefix(&head).map(str::to_string))
    }

    fn dp(capacity: u32) -> ResourceConfig {
        ResourceConfig {
            capacity,
            ..ResourceConfig::for_nic("dp")
        }
    }

    const DP: &str = "macvtap.network.kubevirt.io/dp";

    #[test]
    fn devices_in_use_follow_allocate_and_the_kubelets_answer() {
        let m = Metrics::default();
        let t0 = Instant::now();
        let grace = Duration::from_secs(120);
        let gauges = |m: &Metrics| {
            (
                sample(m, "macvtap_dp_devices_in_use", DP),
                sample(m, "macvtap_dp_devices_free", DP),
            )
        };
        let want = |used: &str, free: &str| (Some(used.to_string()), Some(free.to_string()));
        m.set_devices(DP, 3, 0);
        assert_eq!(gauges(&m), want("0", "3"));
        m.handed_out(DP, &["dpMvp0".into(), "dpMvp1".into()], t0);
        assert_eq!(gauges(&m), want("2", "1"));
        // Allocated again (an init container, then the app): no double count.
        m.handed_out(DP, &["dpMvp1".into()], t0);
        assert_eq!(gauges(&m), want("2", "1"));
        // The kubelet lists only dpMvp0 yet (dpMvp1's pod has not started),
        // and another resource's device, which is not dp's.
        let listed: HashSet<String> = ["dpMvp0", "otherMvp2"].map(String::from).into();
        m.pod_resources_listed(&[dp(3)], &listed, grace, t0 + Duration::from_secs(1));
        assert_eq!(gauges(&m), want("2", "1"));
        // Past the grace, what the kubelet does not list is free again.
        m.pod_resources_listed(&[dp(3)], &listed, grace, t0 + grace);
        assert_eq!(gauges(&m), want("1", "2"));
        // Every device held: none free; Unhealthy devices count as advertised.
        let all: HashSet<String> = ["dpMvp0", "dpMvp1", "dpMvp2"].map(String::from).into();
        m.pod_resources_listed(&[dp(3)], &all, grace, t0 + grace);
        m.set_devices(DP, 0, 3);
        assert_eq!(gauges(&m), want("3", "0"));
        // The pods gone, their devices are free.
        m.pod_resources_listed(&[dp(3)], &HashSet::new(), grace, t0 + grace);
        assert_eq!(gauges(&m), want("0", "3"));
        // A capacity cut below what is held frees nothing below zero.
        m.pod_resources_listed(&[dp(1)], &all, grace, t0 + grace);
        m.set_devices(DP, 1, 0);
        assert_eq!(gauges(&m), want("3", "0"));
        m.resource_removed(DP);
        assert_eq!(gauges(&m), want("0", "0"));
    }

    #[test]
    fn the_config_gauge_says_whether_the_last_change_was_applied() {
        let m = Metrics::default();
        let gauge = |m: &Metrics| {
            m.render()
                .lines()
                .find_map(|l| l.strip_prefix("macvtap_dp_config_last_reload_successful "))
                .map(str::to_string)
        };
        assert_eq!(gauge(&m).as_deref(), Some("1"), "before any change");
        m.config_reload(false);
        assert_eq!(gauge(&m).as_deref(), Some("0"));
        m.config_reload(false);
        assert_eq!(gauge(&m).as_deref(), Some("0"));
        m.config_reload(true);
        assert_eq!(gauge(&m).as_deref(), Some("1"));
        let t = m.render();
        assert!(t.contains("macvtap_dp_config_reloads_total 1\n"), "{t}");
        assert!(
            t.contains("macvtap_dp_config_reload_errors_total 2\n"),
            "{t}"
        );
    }

    #[test]
    fn the_registration_gauge_is_one_only_while_registered() {
        let m = Metrics::default();
        m.set_devices(DP, 1, 0);
        assert_eq!(
            sample(&m, "macvtap_dp_registered", DP).as_deref(),
            Some("0")
        );
        m.set_registered(DP, true);
        assert_eq!(
            sample(&m, "macvtap_dp_registered", DP).as_deref(),
            Some("1")
        );
        m.set_registered(DP, false);
        assert_eq!(
            sample(&m, "macvtap_dp_registered", DP).as_deref(),
            Some("0")
        );
        m.set_registered(DP, true);
        m.resource_removed(DP);
        assert_eq!(
            sample(&m, "macvtap_dp_registered", DP).as_deref(),
            Some("0")
        );
    }
}
