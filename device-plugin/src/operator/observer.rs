//! The operator's side of the core's [`Observer`]: what the core and the
//! kubelet's front report becomes Prometheus series and Kubernetes Events
//! on the Node.

use crate::config::ResourceConfig;
use crate::core::degraded::Degraded;
use crate::core::report::{Observer, Planted, RoundOutcome};
use crate::error::Error;
use crate::operator::events::{EventSink, NodeEvent};
use crate::operator::metrics::Metrics;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The core's and the kubelet front's reports as the daemon's metrics and
/// Events.
#[derive(Debug, Clone)]
pub(crate) struct MetricsAndEvents {
    metrics: Arc<Metrics>,
    events: EventSink,
}

impl MetricsAndEvents {
    /// Reports counted in `metrics` and posted on `events`.
    pub(crate) fn new(metrics: Arc<Metrics>, events: EventSink) -> Self {
        Self { metrics, events }
    }
}

impl Observer for MetricsAndEvents {
    fn handed_out(&self, resource: &str, device_ids: &[String], took: Duration, now: Instant) {
        self.metrics.allocation(resource, true, took);
        self.metrics.handed_out(resource, device_ids, now);
    }

    fn refused(&self, resource: &str, took: Duration, error: &Error) {
        self.metrics.allocation(resource, false, took);
        self.events.post(NodeEvent::AllocateRefused {
            resource: resource.to_string(),
            error: error.to_string(),
        });
    }

    fn unhealthy(&self, resource: &str, reason: &'static str) {
        self.metrics.unhealthy(resource, reason);
    }

    fn pod_resources_listed(
        &self,
        resources: &[ResourceConfig],
        allocated: &HashSet<String>,
        grace: Duration,
        now: Instant,
    ) {
        self.metrics
            .pod_resources_listed(resources, allocated, grace, now);
    }

    fn links_healed(&self, n: u64) {
        self.metrics.links_healed(n);
    }

    fn heal_failed(&self, n: u64) {
        self.metrics.heal_errors(n);
    }

    fn leaked_link_removed(&self, link: &str, ifindex: u32) {
        self.events.post(NodeEvent::LeakedLinkRemoved {
            link: link.to_string(),
            ifindex,
        });
        self.metrics.leaked_links_removed(1);
    }

    fn reclaim_round(&self, outcome: RoundOutcome) {
        self.metrics.reclaim_round(outcome);
    }

    fn degraded(&self, gap: &Degraded) {
        self.events.post(NodeEvent::from(gap));
    }

    fn planted_removed(&self, planted: &Planted) {
        self.events.post(NodeEvent::RecordFilePlanted {
            path: planted.path.display().to_string(),
            what: planted.what.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_become_series_and_events() {
        let metrics = Arc::new(Metrics::default());
        let (events, mut posted) = EventSink::queue();
        let o = MetricsAndEvents::new(metrics.clone(), events);
        let r = "macvtap.network.kubevirt.io/dp";
        o.unhealthy(r, "nic_port_in_the_way");
        o.leaked_link_removed("mvt0123456789ab", 40);
        o.leaked_link_removed("mvt0123456789ac", 41);
        o.links_healed(1);
        o.heal_failed(2);
        o.heal_failed(1);
        let t = metrics.render();
        for want in [
            "macvtap_dp_links_healed_total 1\n",
            "macvtap_dp_heal_errors_total 3\n",
        ] {
            assert!(t.contains(want), "want {want:?} in:\n{t}");
        }
        assert!(
            t.contains(&format!(
                "macvtap_dp_unhealthy_total{{resource=\"{r}\",reason=\"nic_port_in_the_way\"}} 1\n"
            )),
            "{t}"
        );
        assert!(
            t.contains("macvtap_dp_leaked_links_removed_total 2\n"),
            "{t}"
        );
        assert_eq!(
            posted.try_recv().unwrap(),
            NodeEvent::LeakedLinkRemoved {
                link: "mvt0123456789ab".into(),
                ifindex: 40
            }
        );
        let gap = Degraded::pod_resources(std::path::Path::new("/x/kubelet.sock"), "gone");
        o.degraded(&gap);
        posted.try_recv().unwrap();
        assert_eq!(
            posted.try_recv().unwrap(),
            NodeEvent::from(&gap),
            "the gap's Event"
        );
        o.planted_removed(&Planted {
            path: "/var/lib/kubelet/device-plugins/macvtap-deviceplugin/assignments.journal".into(),
            what: "a FIFO".into(),
        });
        assert_eq!(
            posted.try_recv().unwrap(),
            NodeEvent::RecordFilePlanted {
                path: "/var/lib/kubelet/device-plugins/macvtap-deviceplugin/assignments.journal"
                    .into(),
                what: "a FIFO".into()
            }
        );
    }

    #[test]
    fn an_allocate_is_counted_and_a_refusal_posted() {
        let metrics = Arc::new(Metrics::default());
        let (events, mut posted) = EventSink::queue();
        let o = MetricsAndEvents::new(metrics.clone(), events);
        let r = "macvtap.network.kubevirt.io/dp";
        let ms = Duration::from_millis(3);
        o.handed_out(r, &["dpMvp0".into()], ms, Instant::now());
        let refusal = Error::UnknownDevice {
            device_id: "dpMvp9".into(),
            resource: r.into(),
            capacity: 2,
        };
        o.refused(r, ms, &refusal);
        let t = metrics.render();
        for want in [
            format!("macvtap_dp_allocations_total{{resource=\"{r}\"}} 1\n"),
            format!("macvtap_dp_allocation_errors_total{{resource=\"{r}\"}} 1\n"),
            format!("macvtap_dp_allocate_seconds_count{{resource=\"{r}\"}} 2\n"),
        ] {
            assert!(t.contains(&want), "want {want:?} in:\n{t}");
        }
        assert_eq!(
            posted.try_recv().unwrap(),
            NodeEvent::AllocateRefused {
                resource: r.into(),
                error: refusal.to_string(),
            }
        );
        assert!(posted.try_recv().is_err(), "one Event");
    }
}
