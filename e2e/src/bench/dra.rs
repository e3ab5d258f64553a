//! The DRA front against the device plugin front on the real node of
//! `hack/cluster.sh` (issue 47), side by side in one run: a VM pod's start
//! to its guest's first ping reply, and the kubelet's call into our daemon
//! for the pod's device (NodePrepareResources against Allocate), as the
//! kubelet and our daemon time it. The node switches fronts between blocks
//! of rounds (device plugin, DRA, device plugin, DRA, ...), as README's
//! *DRA mode* switches a node: the same kustomization with or without
//! `components/dra`.

use super::report::{Report, Row};
use super::stats::Samples;
use crate::cluster::realnode::{
    HostNic, IMAGE_REPO, NAME, RESOURCE_PREFIX, WAIT, apply_vm_pod, cdi_specs, delete_e2e_pods,
    delete_vm_pods, examples, import_vm_image, install_with, macvtaps_on_nic, slices,
};
use crate::cluster::{Cluster, NODE, last_lines};
use crate::icmp::Pinger;
use crate::node_locks;
use crate::runtime::repo_root;
use crate::sandbox::TestNs;
use anyhow::{Context, Result, anyhow, bail};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// The guest's MAC and address, the same in every round (each round's pod
/// is gone before the next starts).
const MAC: &str = "02:00:c6:33:64:b0";
const GUEST: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 170);
/// How often the peer pings the guest: the resolution of the start figure.
const PING_EVERY: Duration = Duration::from_millis(20);
/// Our image's tag for the bench.
const TAG: &str = "bench-dra";
/// The reclaimer's grace in the bench's install: a link the CNI's DEL gave
/// back is deleted a few seconds later, so that every round starts with no
/// macvtap on the NIC and both fronts create the pod's link.
const RECLAIM_GRACE: Duration = Duration::from_secs(5);
/// Our daemon's `/metrics` port (the DaemonSet's, on the host network).
const METRICS_PORT: u16 = 9402;

/// A front of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Front {
    DevicePlugin,
    Dra,
}

impl Front {
    fn label(self) -> &'static str {
        match self {
            Front::DevicePlugin => "dp",
            Front::Dra => "dra",
        }
    }
}

/// One histogram's sum (seconds) and count, over the series a filter picks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Histogram {
    sum: f64,
    count: f64,
}

/// The sum and count of histogram `name` in the Prometheus text `text`, over
/// every series whose labels hold each of `labels` (`key="value"`, or a
/// part of one); zero when no series matches.
fn histogram(text: &str, name: &str, labels: &[&str]) -> Histogram {
    let mut h = Histogram::default();
    for line in text.lines() {
        let (field, rest) = if let Some(r) = line.strip_prefix(&format!("{name}_sum")) {
            (0, r)
        } else if let Some(r) = line.strip_prefix(&format!("{name}_count")) {
            (1, r)
        } else {
            continue;
        };
        let (series, value) = match rest.strip_prefix('{') {
            Some(r) => match r.rsplit_once('}') {
                Some((l, v)) => (l, v),
                None => continue,
            },
            None if rest.starts_with(' ') => ("", rest),
            None => continue,
        };
        if !labels.iter().all(|l| series.contains(l)) {
            continue;
        }
        let Some(v) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        if field == 0 {
            h.sum += v;
        } else {
            h.count += v;
        }
    }
    h
}

/// What the kubelet and our daemon had measured, read before and after a
/// pod's start.
#[derive(Debug, Clone, Copy, Default)]
struct Timings {
    /// The kubelet's Allocate calls to our device plugin
    /// (`kubelet_device_plugin_alloc_duration_seconds`).
    kubelet_allocate: Histogram,
    /// The kubelet's NodePrepareResources calls to our driver
    /// (`dra_grpc_operations_duration_seconds`).
    kubelet_prepare_rpc: Histogram,
    /// The kubelet's whole prepare of a pod's claims
    /// (`dra_operations_duration_seconds`, `PrepareResources`).
    kubelet_prepare: Histogram,
    /// Our daemon's handler, either front (`macvtap_dp_allocate_seconds`).
    daemon: Histogram,
}

fn read_timings(c: &Cluster, resource: &str) -> Result<Timings> {
    let kubelet = c.kubectl(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{NODE}/proxy/metrics"),
    ])?;
    let ours = test_kubelet::http_get_here(METRICS_PORT, "/metrics")
        .map_err(|e| anyhow!("GET our daemon's /metrics: {e}"))?;
    let res = format!("=\"{resource}\"");
    let driver = format!("driver_name=\"{}\"", crate::cluster::realnode::DRIVER);
    Ok(Timings {
        kubelet_allocate: histogram(
            &kubelet,
            "kubelet_device_plugin_alloc_duration_seconds",
            &[&format!("resource_name{res}")],
        ),
        kubelet_prepare_rpc: histogram(
            &kubelet,
            "dra_grpc_operations_duration_seconds",
            &[&driver, "NodePrepareResources\"", "grpc_status_code=\"OK\""],
        ),
        kubelet_prepare: histogram(
            &kubelet,
            "dra_operations_duration_seconds",
            &["operation_name=\"PrepareResources\"", "is_error=\"false\""],
        ),
        daemon: histogram(
            &ours,
            "macvtap_dp_allocate_seconds",
            &[&format!("resource{res}")],
        ),
    })
}

/// The series of one front.
struct Series {
    start: Samples,
    daemon: Samples,
    kubelet_rpc: Samples,
    kubelet_prepare: Samples,
    /// Rounds whose kubelet or daemon count moved by other than one call.
    skipped: usize,
}

impl Series {
    fn new(front: Front) -> Self {
        let (path, call) = match front {
            Front::DevicePlugin => ("device plugin", "Allocate"),
            Front::Dra => ("DRA", "NodePrepareResources"),
        };
        Series {
            start: Samples::new(format!("{path}: apply to first ping reply")),
            daemon: Samples::new(format!("{path}: {call}, our daemon's handler")),
            kubelet_rpc: Samples::new(format!("{path}: {call}, the kubelet's gRPC call")),
            kubelet_prepare: Samples::new(format!(
                "{path}: the kubelet's PrepareResources (all of the pod's claims)"
            )),
            skipped: 0,
        }
    }
}

/// Pushes the one call `before`..`after` holds into `into`; false when the
/// count moved by other than one.
fn one_call(before: Histogram, after: Histogram, into: &mut Samples) -> bool {
    if (after.count - before.count - 1.0).abs() > 0.5 || after.sum < before.sum {
        return false;
    }
    into.push(Duration::from_secs_f64(after.sum - before.sum));
    true
}

/// Waits until nothing of an earlier round is left: no VM pod, no claim,
/// no CDI spec of ours, no macvtap on the NIC.
fn wait_settled(c: &Cluster) -> Result<()> {
    c.wait(
        "the node settled (no pod, claim, CDI spec or macvtap of a round)",
        WAIT,
        || {
            let pods = c.get_json(&["-n", "default", "pods", "-l", "e2e=cluster"])?;
            let claims = c.get_json(&["-n", "default", "resourceclaims"])?;
            let empty = |v: &serde_json::Value| v["items"].as_array().is_none_or(|a| a.is_empty());
            Ok((empty(&pods)
                && empty(&claims)
                && cdi_specs()?.is_empty()
                && macvtaps_on_nic()?.is_empty())
            .then_some(()))
        },
    )
}

/// Installs `front` and waits until the node serves the resource through
/// it, then until through it alone: returns both times from the apply
/// (the same for DRA, which serves only once the device plugin is gone;
/// back to the device plugin, the DRA front's slices outlive it).
fn switch_to(c: &Cluster, kdir: &std::path::Path, front: Front) -> Result<(Duration, Duration)> {
    let resource = format!("{RESOURCE_PREFIX}{NAME}");
    let t = Instant::now();
    install_with(c, TAG, kdir, front == Front::Dra, 1, RECLAIM_GRACE)?;
    let allocatable = || -> Result<Option<i64>> {
        let node = c.get_json(&["node", NODE])?;
        Ok(node["status"]["allocatable"][resource.as_str()]
            .as_str()
            .and_then(|v| v.parse().ok()))
    };
    match front {
        Front::DevicePlugin => {
            c.wait("the device plugin serving the resource", WAIT, || {
                Ok((allocatable()? == Some(1)).then_some(()))
            })?;
            let serving = t.elapsed();
            c.wait("the DRA front's slices gone", WAIT, || {
                Ok(slices(c)?.is_empty().then_some(()))
            })?;
            Ok((serving, t.elapsed()))
        }
        Front::Dra => {
            c.wait("the DRA front serving the resource alone", WAIT, || {
                let devices: usize = slices(c)?
                    .iter()
                    .map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len))
                    .sum();
                Ok((devices == 1 && allocatable()?.is_none_or(|n| n == 0)).then_some(()))
            })?;
            Ok((t.elapsed(), t.elapsed()))
        }
    }
}

/// One round: a VM pod on the resource through `front`, from `kubectl
/// apply` to the first reply the peer gets from its guest, and the
/// kubelet's and our daemon's timing of the call that gave it its device;
/// then the pod deleted.
fn round(c: &Cluster, peer: &TestNs, front: Front, name: &str, s: &mut Series) -> Result<()> {
    let resource = format!("{RESOURCE_PREFIX}{NAME}");
    wait_settled(c)?;
    let before = read_timings(c, &resource)?;
    let pinger = Pinger::start(peer, GUEST, PING_EVERY)?;
    let t0 = Instant::now();
    apply_vm_pod(c, &resource, name, MAC, GUEST)?;
    if !pinger.wait_for(WAIT, |l| l.first_reply_after(t0).is_some()) {
        let log = c
            .kubectl(&["-n", "default", "logs", name])
            .unwrap_or_default();
        let pod = c
            .kubectl(&["-n", "default", "get", "pod", name, "-o", "wide"])
            .unwrap_or_default();
        bail!(
            "the guest of {name} answered no ping in {WAIT:?}:\n{pod}\nits console ends:\n{}",
            last_lines(&log, 15)
        );
    }
    let first = pinger
        .log()
        .first_reply_after(t0)
        .context("the first reply went away")?;
    drop(pinger);
    s.start.push(first - t0);
    let pod = c.get_json(&["-n", "default", "pod", name])?;
    let claimed = !pod["status"]["extendedResourceClaimStatus"].is_null();
    if claimed != (front == Front::Dra) {
        bail!(
            "{name} was served by the other front (extended resource claim: {claimed}): {}",
            pod["status"]
        );
    }
    let after = read_timings(c, &resource)?;
    let counted = match front {
        Front::DevicePlugin => {
            one_call(before.daemon, after.daemon, &mut s.daemon)
                & one_call(
                    before.kubelet_allocate,
                    after.kubelet_allocate,
                    &mut s.kubelet_rpc,
                )
        }
        Front::Dra => {
            one_call(before.daemon, after.daemon, &mut s.daemon)
                & one_call(
                    before.kubelet_prepare_rpc,
                    after.kubelet_prepare_rpc,
                    &mut s.kubelet_rpc,
                )
                & one_call(
                    before.kubelet_prepare,
                    after.kubelet_prepare,
                    &mut s.kubelet_prepare,
                )
        }
    };
    if !counted {
        s.skipped += 1;
        eprintln!("{name}: a count moved by other than one call: {before:?} -> {after:?}");
    }
    println!(
        "{name}: first reply after {:.0} ms",
        (first - t0).as_secs_f64() * 1000.0
    );
    delete_vm_pods(c, &[name])
}

/// Removes what the bench puts on the cluster: its pods, our DaemonSet and
/// everything of the base and `components/dra`, the DeviceClass and the
/// NAD; then waits until no slice, CDI spec or macvtap of ours is left.
fn clean_up(c: &Cluster) -> Result<()> {
    let _ = delete_e2e_pods(c);
    let (class, nad) = examples()?;
    let _ = c.kubectl_stdin(&["delete", "-f", "-", "--ignore-not-found"], Some(&class));
    let _ = c.kubectl_stdin(&["delete", "-f", "-", "--ignore-not-found"], Some(&nad));
    c.kubectl(&[
        "delete",
        "-k",
        &repo_root().join("manifests/base").to_string_lossy(),
        "--ignore-not-found",
        "--wait=true",
        "--timeout=180s",
    ])?;
    c.kubectl(&[
        "delete",
        "clusterrolebinding/macvtap-cni-dra",
        "clusterrole/macvtap-cni-dra",
        "--ignore-not-found",
    ])?;
    c.wait(
        "no ResourceSlice, CDI spec or macvtap of ours",
        WAIT,
        || {
            Ok(
                (slices(c)?.is_empty() && cdi_specs()?.is_empty() && macvtaps_on_nic()?.is_empty())
                    .then_some(()),
            )
        },
    )
}

/// Runs `blocks` blocks of `per_block` rounds, the fronts alternating
/// (device plugin first), on the real node; holds the node's locks, brings
/// the cluster up (and down again when it brought it up) and leaves
/// nothing of its own behind.
pub fn compare(per_block: usize, blocks: usize, report: &mut Report) -> Result<()> {
    println!("the real node: waiting for its locks (a real-node test may hold them)");
    let waited = Instant::now();
    // In the order every holder takes them: tap nodes, then the kubelet's dirs.
    let _tap_lock = test_support::tap_node_lock()?;
    let _dirs = node_locks::lock_node_dirs()?;
    println!("locks taken after {:.0} s", waited.elapsed().as_secs_f64());
    let cluster = Cluster::up()?;
    if !cluster.started_here() {
        clean_up(&cluster).context("removing what an earlier run left")?;
    }
    let began = Instant::now();
    let outcome = measure(&cluster, per_block, blocks);
    let cleaned = clean_up(&cluster);
    let (dp, dra, switches) = outcome?;
    cleaned?;
    write(
        report,
        &dp,
        &dra,
        &switches,
        per_block,
        blocks,
        began.elapsed(),
    );
    Ok(())
}

/// A switch of fronts: to which, and the times from the apply to the node
/// serving the resource through it, and through it alone.
type Switch = (Front, Duration, Duration);

/// The set-up and the rounds; returns each front's series and the
/// switches of fronts.
fn measure(c: &Cluster, per_block: usize, blocks: usize) -> Result<(Series, Series, Vec<Switch>)> {
    let peer = TestNs::new("clpeerbench")?;
    let _nic = HostNic::add(&peer)?;
    println!("our image (hack/cluster.sh image) and the VM pod's image");
    c.import_our_image(&format!("{IMAGE_REPO}:{TAG}"))?;
    import_vm_image(c)?;
    let (class, nad) = examples()?;
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&class))?;
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&nad))?;
    let kdir = tempfile::tempdir()?;
    let mut dp = Series::new(Front::DevicePlugin);
    let mut dra = Series::new(Front::Dra);
    let mut switches = Vec::new();
    for b in 0..blocks {
        let front = if b % 2 == 0 {
            Front::DevicePlugin
        } else {
            Front::Dra
        };
        wait_settled(c)?;
        let (serving, alone) = switch_to(c, kdir.path(), front)?;
        println!(
            "block {} of {blocks}: {front:?}, serving {:.1} s after the apply, alone {:.1} s after",
            b + 1,
            serving.as_secs_f64(),
            alone.as_secs_f64()
        );
        if b > 0 {
            // The first block's install is no switch.
            switches.push((front, serving, alone));
        }
        for i in 0..per_block {
            let name = format!("virt-launcher-bench-{}-{}-{}", front.label(), b + 1, i + 1);
            let series = if front == Front::Dra {
                &mut dra
            } else {
                &mut dp
            };
            round(c, &peer, front, &name, series)?;
        }
    }
    Ok((dp, dra, switches))
}

/// The switches to `front`, as `serving/alone s` each.
fn switch_times(switches: &[Switch], front: Front) -> String {
    let times: Vec<String> = switches
        .iter()
        .filter(|s| s.0 == front)
        .map(|(_, serving, alone)| {
            let (a, b) = (
                format!("{:.1}", serving.as_secs_f64()),
                format!("{:.1}", alone.as_secs_f64()),
            );
            if a == b {
                format!("{a} s")
            } else {
                format!("{a} s / {b} s")
            }
        })
        .collect();
    times.join(", ")
}

fn write(
    report: &mut Report,
    dp: &Series,
    dra: &Series,
    switches: &[Switch],
    per_block: usize,
    blocks: usize,
    took: Duration,
) {
    report.section(
        "DRA against the device plugin on the real node",
        &format!(
            "The real single-node cluster of `hack/cluster.sh` (Kubernetes 1.37, containerd, \
             Multus thick v4.2.2), our DaemonSet installed with kustomize as README says (with \
             the real-node tests' daemon flags) with one resource of one device on a veth NIC, and a VM pod as KubeVirt renders it (the resource in \
             requests and limits, the NAD's network; QEMU TCG on the pod's `/dev/tapN`, the \
             test guest). The node switches fronts between blocks of {per_block} rounds \
             (device plugin, DRA, device plugin, ...; {blocks} blocks, {:.1} min in all) by \
             applying the same kustomization with or without `components/dra`: under DRA the \
             example DeviceClass (`extendedResourceName`) serves the same resource name. Each \
             round starts on a settled node (no pod, claim, CDI spec or macvtap left; the \
             reclaimer's grace is {} s here, so both fronts create the pod's link), and the same \
             guest MAC and address. **Start to first ping**: from `kubectl apply` of the pod \
             to the first echo reply the peer host gets from the guest (it pings every {} ms), \
             which spans scheduling, the kubelet's Allocate or prepare, the sandbox and our \
             CNI through Multus, the container, QEMU and the guest's boot. **The call for the \
             device**: for each pod, the one call the kubelet makes into our daemon for it, \
             as the kubelet times it (the delta of its histograms' sums: \
             `kubelet_device_plugin_alloc_duration_seconds`, \
             `pkg/kubelet/cm/devicemanager/manager.go`, around its Allocate call; \
             `dra_grpc_operations_duration_seconds`, `pkg/kubelet/cm/dra/plugin/dra_plugin.go`, \
             around its NodePrepareResources gRPC call) and as our daemon times its handler \
             (`macvtap_dp_allocate_seconds`, the same histogram for both fronts: an Allocate's \
             link and `/dev/tapN`; a prepare's claim read from the API server, link, \
             `/dev/tapN` and CDI spec), and the kubelet's whole PrepareResources of the pod's \
             claims (`dra_operations_duration_seconds`: its claim reads and checkpoint around \
             the gRPC call), which the device plugin path has no counterpart of. p99 of {} \
             rounds is their maximum. **Switches** (from the apply to the new front serving \
             the resource, and serving it alone): to DRA {}; back to the device plugin {}, \
             where the DRA front's ResourceSlices outlive it by the kubelet's 30 s \
             (`defaultWipingDelay`, `pkg/kubelet/cm/dra/manager.go`): the bench waits for \
             that, new pods need not (the scheduler serves a name from the device plugin \
             wherever the node's allocatable lists some of it; README, *DRA mode*).",
            took.as_secs_f64() / 60.0,
            RECLAIM_GRACE.as_secs(),
            PING_EVERY.as_millis(),
            dp.start.n().min(dra.start.n()),
            switch_times(switches, Front::Dra),
            switch_times(switches, Front::DevicePlugin),
        ),
    );
    let reference = |s: &Samples| Some(("device plugin".to_string(), s.p50()));
    report.latency_table(&[
        Row {
            series: dp.start.clone(),
            reference: None,
        },
        Row {
            series: dra.start.clone(),
            reference: reference(&dp.start),
        },
    ]);
    report.latency_table(&[
        Row {
            series: dp.kubelet_rpc.clone(),
            reference: None,
        },
        Row {
            series: dra.kubelet_rpc.clone(),
            reference: reference(&dp.kubelet_rpc),
        },
        Row {
            series: dra.kubelet_prepare.clone(),
            reference: reference(&dp.kubelet_rpc),
        },
        Row {
            series: dp.daemon.clone(),
            reference: None,
        },
        Row {
            series: dra.daemon.clone(),
            reference: reference(&dp.daemon),
        },
    ]);
    if dp.skipped + dra.skipped > 0 {
        report.text(&format!(
            "Rounds whose kubelet or daemon count moved by other than one call, left out of the \
             call table: {} device plugin, {} DRA.\n",
            dp.skipped, dra.skipped
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_summed_over_the_series_picked() {
        let text = "# TYPE x histogram\n\
            x_bucket{le=\"0.1\",r=\"a\"} 1\n\
            x_sum{r=\"a\",m=\"/s/NodePrepareResources\"} 0.25\n\
            x_count{r=\"a\",m=\"/s/NodePrepareResources\"} 2\n\
            x_sum{r=\"b\",m=\"/s/NodePrepareResources\"} 1.5\n\
            x_count{r=\"b\",m=\"/s/NodePrepareResources\"} 1\n\
            x_sum{r=\"a\",m=\"/s/NodeUnprepareResources\"} 9\n\
            x_count{r=\"a\",m=\"/s/NodeUnprepareResources\"} 9\n\
            xy_sum{r=\"a\"} 7\n\
            y_sum 3\n\
            y_count 4\n";
        let h = histogram(text, "x", &["r=\"a\"", "NodePrepareResources\""]);
        assert_eq!(
            h,
            Histogram {
                sum: 0.25,
                count: 2.0
            }
        );
        let all = histogram(text, "x", &["NodePrepareResources\""]);
        assert_eq!(
            all,
            Histogram {
                sum: 1.75,
                count: 3.0
            }
        );
        assert_eq!(
            histogram(text, "y", &[]),
            Histogram {
                sum: 3.0,
                count: 4.0
            }
        );
        assert_eq!(histogram(text, "z", &[]), Histogram::default());
    }

    #[test]
    fn one_call_takes_only_a_single_call() {
        let mut s = Samples::new("s");
        let h = |sum, count| Histogram { sum, count };
        assert!(one_call(h(1.0, 3.0), h(1.004, 4.0), &mut s));
        assert!((s.ms[0] - 4.0).abs() < 1e-6, "{:?}", s.ms);
        assert!(!one_call(h(1.0, 3.0), h(1.5, 5.0), &mut s));
        assert!(!one_call(h(1.0, 3.0), h(1.0, 3.0), &mut s));
        assert_eq!(s.n(), 1);
    }
}
