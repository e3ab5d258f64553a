//! The burst figure: many VM pods start on one node at once, each CNI ADD
//! asking the kubelet's PodResources API (behind the kubelet's rate limit)
//! whether its pod holds the device, while Multus makes its own `List` per
//! pod from the same bucket. Gives the burst's wall time, the ADD times and
//! the `List` tries the ADDs made beyond their first, counted by the server.

use super::exec;
use super::report::{Report, Row};
use super::stats::Samples;
use crate::sandbox::TestNs;
use anyhow::{Context, Result, bail, ensure};
use grpc_unary::{self as grpc, CallError};
use macvtap_cni::podresources::{LIST, TIMEOUT};
use macvtap_link::{Links, MacvtapMode, RESOURCE_PREFIX, link_name_for_device};
use serde_json::json;
use std::path::Path;
use std::sync::Barrier;
use std::time::Instant;
use test_kubelet::{TestPodResources, TokenBucket};

/// VM pods that start at once in one burst (the figure).
pub const PODS: usize = 32;
const RESOURCE: &str = "burst";
const NAMESPACE: &str = "burst";

/// What one burst measured.
struct Burst {
    wall_ms: f64,
    adds: Samples,
    add_failures: Vec<String>,
    /// `List` calls the ADDs made beyond one each (server count less one
    /// per ADD and one per Multus `List`).
    add_retries: usize,
    /// Calls the rate limit refused, ADDs' and Multus' together.
    refused: usize,
    multus_refused: usize,
}

/// What each variant gathered over its bursts.
#[derive(Default)]
struct Variant {
    walls: Vec<f64>,
    adds: Vec<f64>,
    failures: Vec<String>,
    retries: Vec<usize>,
    add_refused: Vec<usize>,
    multus_refused: Vec<usize>,
}

fn device(i: usize) -> String {
    format!("{RESOURCE}Mvp{i}")
}

/// Runs `rounds` bursts of [`PODS`] concurrent ADDs of `plugin` with the
/// kubelet's limiter, interleaved with as many without any limit (the
/// reference), each beside one Multus-like `List` per pod; writes the
/// section and returns the ADD times' panel.
pub async fn compare(
    plugin: &Path,
    rounds: usize,
    report: &mut Report,
) -> Result<(String, Vec<Samples>)> {
    let kubelet_dir = tempfile::tempdir()?;
    let socket = kubelet_dir.path().join("pod-resources/kubelet.sock");
    let pod_resources = TestPodResources::start(&socket)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let resource = format!("{RESOURCE_PREFIX}/{RESOURCE}");
    for i in 0..PODS {
        let id = device(i);
        pod_resources.add_pod(
            NAMESPACE,
            &format!("vm-{i}"),
            &[(&resource, &[id.as_str()])],
        );
    }
    let settings = kubelet_dir.path().join("macvtap.settings.json");
    std::fs::write(
        &settings,
        json!({"kubeletDir": kubelet_dir.path(), "podResourcesCheck": "enforce"}).to_string(),
    )?;
    // The ADDs are processes and blocking threads; the server's tasks go on
    // on the runtime's other worker.
    let (limited, free) = tokio::task::block_in_place(|| {
        run_rounds(plugin, &pod_resources, &socket, &settings, rounds)
    })?;
    let title = format!("{PODS} concurrent ADDs through the kubelet's PodResources limit");
    report.section(
        &title,
        &format!(
            "{PODS} VM pods start at once on one node: {PODS} CNI ADDs of our release plugin (each in its own pod namespace, its device's macvtap made beforehand, `podResourcesCheck: enforce`), and beside them one Multus-like `List` per pod that is never tried again, all released together. The PodResources server is the test kubelet's with the kubelet's limiter (one token bucket for all callers, 100 calls a second, burst 10, `ResourceExhausted` \"rejected by rate limit\" over it), reset to a full bucket before each burst; the reference bursts run with no limit. {rounds} bursts of each, interleaved. Wall time runs from releasing all {} callers to the last ADD's exit. `List` tries beyond the first are counted by the server: every call it received in the burst, less one per ADD and one per Multus `List`. The ADD times are of every ADD of every burst (spawn to exit).",
            2 * PODS
        ),
    );
    let mut md = String::from(
        "| PodResources limit | bursts | burst wall ms, median | max | ADD failures | ADD `List` tries beyond the first, per burst, median | max | refused ADD `List`s, median | Multus `List`s refused, median | max |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for (name, v) in [("kubelet's (100/s, burst 10)", &limited), ("none", &free)] {
        md.push_str(&format!(
            "| {name} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} |\n",
            v.walls.len(),
            median(&v.walls),
            max(&v.walls),
            v.failures.len(),
            median_usize(&v.retries),
            v.retries.iter().max().copied().unwrap_or(0),
            median_usize(&v.add_refused),
            median_usize(&v.multus_refused),
            v.multus_refused.iter().max().copied().unwrap_or(0),
        ));
    }
    report.text(&md);
    let with_limit = Samples {
        name: "ours ADD, kubelet's limit".into(),
        ms: limited.adds.clone(),
    };
    let without = Samples {
        name: "ours ADD, no limit".into(),
        ms: free.adds.clone(),
    };
    report.latency_table(&[
        Row {
            series: without.clone(),
            reference: None,
        },
        Row {
            series: with_limit.clone(),
            reference: Some(("no limit".into(), without.p50())),
        },
    ]);
    report.text(&format!(
        "ADD max: {:.1} ms with the kubelet's limit, {:.1} ms without.\n",
        max(&limited.adds),
        max(&free.adds)
    ));
    if let Some(first) = limited.failures.first().or(free.failures.first()) {
        report.text(&format!("First failed ADD printed: `{first}`\n"));
    }
    Ok((
        format!("{PODS} ADDs at once, PodResources limit"),
        vec![with_limit, without],
    ))
}

fn run_rounds(
    plugin: &Path,
    pod_resources: &TestPodResources,
    socket: &Path,
    settings: &Path,
    rounds: usize,
) -> Result<(Variant, Variant)> {
    // Fresh namespaces number links from 1: hold the tests' tap-node lock so
    // no test makes a macvtap with the same ifindex meanwhile.
    let _tap_lock = test_support::tap_node_lock()?;
    let node = TestNs::new("un")?;
    let peer = TestNs::new("up")?;
    node.add_nic_to("lower0", &peer, "peer0")?;
    let pods: Vec<TestNs> = (0..PODS)
        .map(|i| TestNs::new(&format!("u{i}")))
        .collect::<Result<_>>()?;
    let host = node.handle()?;
    let lower = host.get_link("lower0")?.context("lower0 missing")?;
    for i in 0..PODS {
        host.add_macvtap_at(
            &link_name_for_device(&device(i)),
            lower.index,
            MacvtapMode::Bridge,
            None,
            None,
        )?;
    }
    let (mut limited, mut free) = (Variant::default(), Variant::default());
    let outcome = (|| -> Result<()> {
        for round in 0..2 * rounds {
            let with_limit = round % 2 == 0;
            pod_resources.set_rate_limit(with_limit.then(TokenBucket::kubelet));
            let b = node.run(|| burst(plugin, pod_resources, socket, settings, &pods))?;
            let v = if with_limit { &mut limited } else { &mut free };
            v.walls.push(b.wall_ms);
            v.adds.extend(b.adds.ms);
            v.retries.push(b.add_retries);
            v.add_refused
                .push(b.refused.saturating_sub(b.multus_refused));
            v.multus_refused.push(b.multus_refused);
            v.failures.extend(b.add_failures);
            give_back(plugin, &node, &pods)?;
        }
        Ok(())
    })();
    // Macvtaps go before the lock does (a namespace dies asynchronously).
    for ns in pods.iter().chain([&node]) {
        let _ = ns.delete_macvtaps();
    }
    outcome?;
    Ok((limited, free))
}

/// One burst: every ADD and every Multus `List` released at once.
fn burst(
    plugin: &Path,
    pod_resources: &TestPodResources,
    socket: &Path,
    settings: &Path,
    pods: &[TestNs],
) -> Result<Burst> {
    let settings = settings.to_str().context("settings path is not UTF-8")?;
    let (calls0, refused0) = (pod_resources.calls(), pod_resources.refused());
    let start = Barrier::new(2 * pods.len() + 1);
    // Threads spawned here inherit this thread's (the node's) netns.
    let (wall_ms, adds, multus) = std::thread::scope(|s| {
        let adds: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let start = &start;
                s.spawn(move || {
                    let args = format!(
                        "IgnoreUnknown=true;K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME=vm-{i};K8S_POD_INFRA_CONTAINER_ID=burst-{i}"
                    );
                    let conf = json!({"cniVersion": "1.0.0", "name": "burst", "type": "macvtap",
                                      "deviceID": device(i)})
                    .to_string();
                    start.wait();
                    exec::cni_with_env(
                        plugin,
                        "ADD",
                        &pod.path(),
                        "net1",
                        &args,
                        &conf,
                        &[("MACVTAP_CNI_SETTINGS", settings)],
                    )
                })
            })
            .collect();
        let multus: Vec<_> = (0..pods.len())
            .map(|_| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    grpc::unary(socket, LIST, &[], TIMEOUT)
                })
            })
            .collect();
        start.wait();
        let began = Instant::now();
        let adds: Vec<_> = adds
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("ADD thread panicked")))
            })
            .collect();
        let wall_ms = began.elapsed().as_secs_f64() * 1000.0;
        let multus: Vec<_> = multus
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("List thread panicked"))
            })
            .collect();
        (wall_ms, adds, multus)
    });
    let mut samples = Samples::new("ADD");
    let mut add_failures = Vec::new();
    for add in adds {
        let add = add?;
        samples.push(add.took);
        if !add.ok {
            add_failures.push(add.stdout.trim().to_string());
        }
    }
    let mut multus_refused = 0;
    for list in multus {
        match list? {
            Ok(_) => {}
            Err(CallError::Status { code, .. }) if code == grpc::code::RESOURCE_EXHAUSTED => {
                multus_refused += 1
            }
            Err(e) => bail!("a Multus-like List failed other than by the rate limit: {e}"),
        }
    }
    let calls = pod_resources.calls() - calls0;
    let refused = pod_resources.refused() - refused0;
    ensure!(
        calls >= 2 * pods.len(),
        "the server saw {calls} calls, fewer than one per ADD and one per Multus List"
    );
    Ok(Burst {
        wall_ms,
        adds: samples,
        add_failures,
        add_retries: calls - 2 * pods.len(),
        refused,
        multus_refused,
    })
}

/// DEL of every pod (not timed): our DEL gives each macvtap back to the
/// node, ready for the next burst.
fn give_back(plugin: &Path, node: &TestNs, pods: &[TestNs]) -> Result<()> {
    node.run(|| {
        for (i, pod) in pods.iter().enumerate() {
            let conf = json!({"cniVersion": "1.0.0", "name": "burst", "type": "macvtap",
                              "deviceID": device(i)});
            let args =
                format!("IgnoreUnknown=true;K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME=vm-{i}");
            let del = exec::cni(plugin, "DEL", &pod.path(), "net1", &args, &conf.to_string())?;
            ensure!(del.ok, "DEL of vm-{i} failed: {}", del.stdout);
        }
        Ok(())
    })?;
    let back = node
        .links()?
        .iter()
        .filter(|l| l.starts_with("mvt"))
        .count();
    ensure!(
        back == pods.len(),
        "{back} of {} macvtaps back on the node",
        pods.len()
    );
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    Samples {
        name: String::new(),
        ms: v.to_vec(),
    }
    .p50()
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

fn median_usize(v: &[usize]) -> usize {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_take_the_lower_middle() {
        assert_eq!(median_usize(&[5, 1, 3, 2]), 2);
        assert_eq!(median_usize(&[4, 1, 9]), 4);
        assert_eq!(median_usize(&[]), 0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(max(&[3.0, 7.0, 2.0]), 7.0);
    }
}
