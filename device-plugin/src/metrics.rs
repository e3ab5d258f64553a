//! Counters, gauges and a histogram, rendered in the Prometheus text
//! exposition format (0.0.4), with the standard `process_*` metrics and a
//! build-info gauge, as the Go client renders them.

use crate::procstat::ProcessStats;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the Allocate latency buckets, in seconds. Allocate
/// creates one macvtap and waits for its tap node: a few milliseconds when
/// all is well, up to the node wait's seconds when it is not.
pub const ALLOCATE_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A Prometheus histogram with the [`ALLOCATE_BUCKETS`] bounds.
#[derive(Debug, Default, Clone, PartialEq)]
struct Histogram {
    /// Observations per bucket (not cumulative), one per bound.
    buckets: [u64; ALLOCATE_BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, v: f64) {
        if let Some(i) = ALLOCATE_BUCKETS.iter().position(|b| v <= *b) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum += v;
    }
}

/// Per-resource numbers.
#[derive(Debug, Default, Clone, PartialEq)]
struct ResourceMetrics {
    healthy: u64,
    unhealthy: u64,
    allocations: u64,
    allocation_errors: u64,
    allocate_seconds: Histogram,
    registrations: u64,
    registration_errors: u64,
    /// Times the devices became Unhealthy (or changed reason), by reason.
    unhealthy_reasons: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Default)]
struct Inner {
    resources: BTreeMap<String, ResourceMetrics>,
    leaked_links_removed: u64,
    links_healed: u64,
    reclaim_rounds: [u64; 3],
    config_reloads: u64,
    config_reload_errors: u64,
}

/// The daemon's metrics, shared by its tasks.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        // A panic while holding the lock cannot leave the numbers inconsistent
        // in a way that matters, so a poisoned lock is used as is.
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g)
    }

    /// Sets the device gauges of `resource`.
    pub fn set_devices(&self, resource: &str, healthy: u64, unhealthy: u64) {
        self.with(|m| {
            let r = m.resources.entry(resource.to_string()).or_default();
            r.healthy = healthy;
            r.unhealthy = unhealthy;
        });
    }

    /// Zeroes the device gauges of a resource that is no longer served.
    pub fn resource_removed(&self, resource: &str) {
        self.set_devices(resource, 0, 0);
    }

    /// Counts the devices of `resource` becoming Unhealthy for `reason`
    /// (`nic_missing`, `nic_down`, `nic_enslaved`, `nic_port_in_the_way`).
    pub fn unhealthy(&self, resource: &str, reason: &'static str) {
        self.with(|m| {
            let r = m.resources.entry(resource.to_string()).or_default();
            *r.unhealthy_reasons.entry(reason).or_default() += 1;
        });
    }

    /// Counts one Allocate call.
    pub fn allocation(&self, resource: &str, ok: bool, took: Duration) {
        self.with(|m| {
            let r = m.resources.entry(resource.to_string()).or_default();
            if ok {
                r.allocations += 1;
            } else {
                r.allocation_errors += 1;
            }
            r.allocate_seconds.observe(took.as_secs_f64());
        });
    }

    /// Counts one registration attempt with the kubelet.
    pub fn registration(&self, resource: &str, ok: bool) {
        self.with(|m| {
            let r = m.resources.entry(resource.to_string()).or_default();
            if ok {
                r.registrations += 1;
            } else {
                r.registration_errors += 1;
            }
        });
    }

    /// Counts leaked links removed.
    pub fn leaked_links_removed(&self, n: u64) {
        self.with(|m| m.leaked_links_removed += n);
    }

    /// Counts lost macvtaps re-created for the pods that hold their devices.
    pub fn links_healed(&self, n: u64) {
        self.with(|m| m.links_healed += n);
    }

    /// Counts one reclaim round by how it ended.
    pub fn reclaim_round(&self, outcome: RoundOutcome) {
        self.with(|m| m.reclaim_rounds[round_slot(outcome)] += 1);
    }

    /// Counts a config file reload attempt.
    pub fn config_reload(&self, ok: bool) {
        self.with(|m| {
            if ok {
                m.config_reloads += 1;
            } else {
                m.config_reload_errors += 1;
            }
        });
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = self.with(|m| {
            let mut out = String::new();
            let rs = &m.resources;
            family(
                &mut out,
                "macvtap_dp_devices",
                "gauge",
                "Devices advertised, by health.",
                rs,
                |r| {
                    vec![
                        ("state=\"healthy\"", r.healthy as f64),
                        ("state=\"unhealthy\"", r.unhealthy as f64),
                    ]
                },
            );
            family(
                &mut out,
                "macvtap_dp_allocations_total",
                "counter",
                "Successful Allocate calls.",
                rs,
                |r| vec![("", r.allocations as f64)],
            );
            family(
                &mut out,
                "macvtap_dp_allocation_errors_total",
                "counter",
                "Failed Allocate calls.",
                rs,
                |r| vec![("", r.allocation_errors as f64)],
            );
            histogram(
                &mut out,
                "macvtap_dp_allocate_seconds",
                "Time Allocate took, successful or not, in seconds.",
                rs,
            );
            family(
                &mut out,
                "macvtap_dp_registrations_total",
                "counter",
                "Successful registrations with the kubelet.",
                rs,
                |r| vec![("", r.registrations as f64)],
            );
            family(
                &mut out,
                "macvtap_dp_registration_errors_total",
                "counter",
                "Failed registration attempts.",
                rs,
                |r| vec![("", r.registration_errors as f64)],
            );
            let name = "macvtap_dp_unhealthy_total";
            let _ = writeln!(
                out,
                "# HELP {name} Times a resource's devices became Unhealthy, by reason \
                 (nic_missing, nic_down, nic_enslaved, nic_port_in_the_way).\n# TYPE {name} counter"
            );
            // Every reason of every resource, 0 until it happens: a series
            // that appears only on its first increment breaks rate().
            for (resource, r) in rs {
                let resource = escape_label(resource);
                for reason in UNHEALTHY_REASONS {
                    let v = r.unhealthy_reasons.get(reason).copied().unwrap_or(0);
                    let _ = writeln!(
                        out,
                        "{name}{{resource=\"{resource}\",reason=\"{reason}\"}} {v}"
                    );
                }
            }
            for (name, help, v) in [
                (
                    "macvtap_dp_leaked_links_removed_total",
                    "Leaked macvtap links removed.",
                    m.leaked_links_removed,
                ),
                (
                    "macvtap_dp_links_healed_total",
                    "Lost macvtaps re-created for the pods that still hold their devices.",
                    m.links_healed,
                ),
                (
                    "macvtap_dp_config_reloads_total",
                    "Config file changes applied.",
                    m.config_reloads,
                ),
                (
                    "macvtap_dp_config_reload_errors_total",
                    "Config file changes rejected.",
                    m.config_reload_errors,
                ),
            ] {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
                );
            }
            let name = "macvtap_dp_reclaim_rounds_total";
            let _ = writeln!(
                out,
                "# HELP {name} Reclaim rounds, by outcome (done, skipped without a PodResources socket, failed).\n# TYPE {name} counter"
            );
            for outcome in [RoundOutcome::Done, RoundOutcome::Skipped, RoundOutcome::Failed] {
                let v = m.reclaim_rounds[round_slot(outcome)];
                let _ = writeln!(out, "{name}{{outcome=\"{}\"}} {v}", outcome.label());
            }
            let _ = writeln!(
                out,
                "# HELP macvtap_dp_build_info The running build: its version as a label, value always 1.\n\
                 # TYPE macvtap_dp_build_info gauge\n\
                 macvtap_dp_build_info{{version=\"{}\"}} 1",
                escape_label(env!("CARGO_PKG_VERSION"))
            );
            out
        });
        // Without /proc (never the case on a node) the page just lacks them.
        if let Ok(p) = ProcessStats::read_self() {
            process_metrics(&mut out, &p);
        }
        out
    }
}

/// Appends the Go client's standard process metrics.
fn process_metrics(out: &mut String, p: &ProcessStats) {
    let mut one = |name: &str, kind: &str, help: &str, v: f64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
        );
    };
    one(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        p.cpu_seconds,
    );
    one(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        p.resident_memory_bytes as f64,
    );
    one(
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
        p.virtual_memory_bytes as f64,
    );
    one(
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        p.open_fds as f64,
    );
    if let Some(max) = p.max_fds {
        one(
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            max as f64,
        );
    }
    one(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        p.start_time_seconds,
    );
}

/// How a reclaim round ended, counted in `macvtap_dp_reclaim_rounds_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundOutcome {
    /// The round asked the kubelet and acted on its answer.
    Done,
    /// There was no PodResources socket, so the round did nothing.
    Skipped,
    /// The round failed (a netlink or PodResources error, logged).
    Failed,
}

impl RoundOutcome {
    /// The `outcome` label value.
    pub fn label(self) -> &'static str {
        match self {
            RoundOutcome::Done => "done",
            RoundOutcome::Skipped => "skipped",
            RoundOutcome::Failed => "failed",
        }
    }
}

/// Where `outcome` is counted in `Inner::reclaim_rounds`.
fn round_slot(outcome: RoundOutcome) -> usize {
    match outcome {
        RoundOutcome::Done => 0,
        RoundOutcome::Skipped => 1,
        RoundOutcome::Failed => 2,
    }
}

/// The `reason` label values of `macvtap_dp_unhealthy_total`.
pub const UNHEALTHY_REASONS: [&str; 4] = [
    "nic_missing",
    "nic_down",
    "nic_enslaved",
    "nic_port_in_the_way",
];

/// A label value with `\`, `"` and newlines escaped, as the format requires.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A histogram family per resource: cumulative `_bucket{le}` series ending
/// in `+Inf`, then `_sum` and `_count`.
fn histogram(
    out: &mut String,
    name: &str,
    help: &str,
    resources: &BTreeMap<String, ResourceMetrics>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (resource, r) in resources {
        let resource = escape_label(resource);
        let h = &r.allocate_seconds;
        let mut cumulative = 0;
        for (bound, n) in ALLOCATE_BUCKETS.iter().zip(h.buckets) {
            cumulative += n;
            let _ = writeln!(
                out,
                "{name}_bucket{{resource=\"{resource}\",le=\"{bound}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{resource=\"{resource}\",le=\"+Inf\"}} {}\n\
             {name}_sum{{resource=\"{resource}\"}} {}\n\
             {name}_count{{resource=\"{resource}\"}} {}",
            h.count, h.sum, h.count
        );
    }
}

fn family(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    resources: &BTreeMap<String, ResourceMetrics>,
    values: impl Fn(&ResourceMetrics) -> Vec<(&'static str, f64)>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (resource, r) in resources {
        let resource = escape_label(resource);
        for (extra, v) in values(r) {
            let sep = if extra.is_empty() { "" } else { "," };
            let _ = writeln!(out, "{name}{{resource=\"{resource}\"{sep}{extra}}} {v}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
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
        let t = m.render();
        for want in [
            "macvtap_dp_reclaim_rounds_total{outcome=\"done\"} 0\n",
            "macvtap_dp_reclaim_rounds_total{outcome=\"skipped\"} 2\n",
            "macvtap_dp_reclaim_rounds_total{outcome=\"failed\"} 1\n",
        ] {
            assert!(t.contains(want), "{want} in {t}");
        }
        assert!(t.contains("macvtap_dp_devices{resource=\"macvtap.network.kubevirt.io/eth0\",state=\"healthy\"} 3\n"), "{t}");
        assert!(
            t.contains(
                "macvtap_dp_allocations_total{resource=\"macvtap.network.kubevirt.io/eth0\"} 1\n"
            ),
            "{t}"
        );
        assert!(t.contains("macvtap_dp_allocation_errors_total{resource=\"macvtap.network.kubevirt.io/eth0\"} 1\n"), "{t}");
        assert!(
            t.contains(
                "macvtap_dp_registrations_total{resource=\"macvtap.network.kubevirt.io/eth0\"} 1\n"
            ),
            "{t}"
        );
        assert!(
            t.contains("macvtap_dp_leaked_links_removed_total 2\n"),
            "{t}"
        );
        assert!(t.contains("# TYPE macvtap_dp_devices gauge"), "{t}");
        // 5 ms and 0 s: both in the 0.005 bucket, one in 0.001.
        let e = "resource=\"macvtap.network.kubevirt.io/eth0\"";
        for want in [
            "# TYPE macvtap_dp_allocate_seconds histogram\n".to_string(),
            format!("macvtap_dp_allocate_seconds_bucket{{{e},le=\"0.001\"}} 1\n"),
            format!("macvtap_dp_allocate_seconds_bucket{{{e},le=\"0.0025\"}} 1\n"),
            format!("macvtap_dp_allocate_seconds_bucket{{{e},le=\"0.005\"}} 2\n"),
            format!("macvtap_dp_allocate_seconds_bucket{{{e},le=\"10\"}} 2\n"),
            format!("macvtap_dp_allocate_seconds_bucket{{{e},le=\"+Inf\"}} 2\n"),
            format!("macvtap_dp_allocate_seconds_sum{{{e}}} 0.005\n"),
            format!("macvtap_dp_allocate_seconds_count{{{e}}} 2\n"),
            format!(
                "macvtap_dp_build_info{{version=\"{}\"}} 1\n",
                env!("CARGO_PKG_VERSION")
            ),
            "# TYPE process_cpu_seconds_total counter\n".to_string(),
            "# TYPE process_resident_memory_bytes gauge\n".to_string(),
            "# TYPE process_open_fds gauge\n".to_string(),
            "# TYPE process_start_time_seconds gauge\n".to_string(),
        ] {
            assert!(t.contains(&want), "want {want:?} in:\n{t}");
        }
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
}
