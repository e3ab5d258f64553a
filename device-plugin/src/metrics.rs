//! Counters and gauges, rendered in the Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// Per-resource numbers.
#[derive(Debug, Default, Clone, PartialEq)]
struct ResourceMetrics {
    healthy: u64,
    unhealthy: u64,
    allocations: u64,
    allocation_errors: u64,
    allocate_seconds_sum: f64,
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
    /// (`nic_missing`, `nic_down`, `nic_enslaved`).
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
            r.allocate_seconds_sum += took.as_secs_f64();
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
        self.with(|m| {
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
            family(
                &mut out,
                "macvtap_dp_allocate_seconds_sum",
                "counter",
                "Total time spent in Allocate.",
                rs,
                |r| vec![("", r.allocate_seconds_sum)],
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
                 (nic_missing, nic_down, nic_enslaved).\n# TYPE {name} counter"
            );
            for (resource, r) in rs {
                for (reason, v) in &r.unhealthy_reasons {
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
            out
        })
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
        let t = m.render();
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
    }
}
