//! Side by side with the Go project we replace, kubevirt/macvtap-cni
//! v0.13.1, built from its pinned module
//! (`test_support::gopeers::GO_MACVTAP_V0_13_1`, `hack/peers/`):
//! its CNI against ours on host macvtaps handed over as in production, and
//! its device plugin against ours under test kubelets (start to Register,
//! Allocate of new and of held devices, memory, idle CPU). Every pair runs
//! interleaved in one run.

use super::cni::Plugins;
use super::dp::{cpu_ticks, rss_kib, scrap_macvtaps};
use super::exec;
use super::report::{Report, Row};
use super::stats::Samples;
use crate::host_kubelet::HostDevicePlugins;
use crate::kubelet_socket::LenientUnary;
use crate::node::Node;
use crate::sandbox::TestNs;
use anyhow::{Context, Result, anyhow, ensure};
use macvtap_link::{Handle, Links, MacvtapMode, link_name_for_device};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use test_kubelet::{Daemon, PluginClient, TestKubelet};

/// The Go project's two binaries, as `go build` made them (CGO off).
#[derive(Debug, Clone)]
pub struct GoProject {
    /// Its CNI (`type: macvtap`).
    pub cni: PathBuf,
    /// Its device plugin.
    pub deviceplugin: PathBuf,
}

impl GoProject {
    /// Builds the Go project once (cached, see `test_support::gopeers`)
    /// and returns its binaries.
    pub fn build() -> Result<Self> {
        let bins = test_support::gopeers::build(&test_support::gopeers::GO_MACVTAP_V0_13_1)?;
        match bins.as_slice() {
            [cni, dp] => Ok(Self {
                cni: cni.clone(),
                deviceplugin: dp.clone(),
            }),
            _ => Err(anyhow!("the Go build gave {bins:?}")),
        }
    }
}

/// The Go project's name in tables.
const GO: &str = "Go v0.13.1";
// Siblings on one NIC may not share a MAC.
const OURS_MAC: &str = "02:00:c0:00:02:b1";
const GO_MAC: &str = "02:00:c0:00:02:b2";
/// The device (and, for the Go CNI, host link) names of the CNI rounds.
const OURS_DEVICE: &str = "sbsMvp0";
const GO_DEVICE: &str = "gosbsMvp0";

/// The NetConf both CNIs get: the same keys, only the device differs.
fn cni_conf(device: &str) -> String {
    json!({"cniVersion": "0.4.0", "name": "sbs", "type": "macvtap", "deviceID": device,
           "mtu": 1500, "owner": 107, "group": 107})
    .to_string()
}

/// CNI ADD, DEL and the ADD+DEL cycle of ours against the Go project's, `n`
/// interleaved rounds on one node: each round the device plugin's part (a
/// host macvtap per CNI, not measured), then both ADDs, then both DELs, the
/// order alternating.
pub fn cni(
    plugins: &Plugins,
    go: &GoProject,
    n: usize,
    report: &mut Report,
) -> Result<Vec<(String, Vec<Samples>)>> {
    let _lock = test_support::tap_node_lock()?;
    let node = TestNs::new("sn")?;
    let peer = TestNs::new("sp")?;
    node.add_nic_to("lower0", &peer, "peer0")?;
    let pods = [TestNs::new("so")?, TestNs::new("sg")?];
    let names = ["ours", GO];
    let mut add: Vec<Samples> = names
        .iter()
        .map(|w| Samples::new(format!("{w} ADD")))
        .collect();
    let mut del: Vec<Samples> = names
        .iter()
        .map(|w| Samples::new(format!("{w} DEL")))
        .collect();
    let mut cycle: Vec<Samples> = names
        .iter()
        .map(|w| Samples::new(format!("{w} ADD+DEL")))
        .collect();
    let ours_link = link_name_for_device(OURS_DEVICE);
    let bins = [&plugins.ours, &go.cni];
    let confs = [cni_conf(OURS_DEVICE), cni_conf(GO_DEVICE)];
    let args = [
        format!("IgnoreUnknown=true;MAC={OURS_MAC}"),
        format!("IgnoreUnknown=true;MAC={GO_MAC}"),
    ];
    let mut gave_back = 0usize;
    node.run(|| {
        let host = Handle::current()?;
        let lower = host.get_link("lower0")?.context("lower0 missing")?;
        for round in 0..n {
            for name in [&ours_link, GO_DEVICE] {
                host.add_macvtap_at(
                    name,
                    lower.index,
                    MacvtapMode::Bridge,
                    Some(lower.txqueuelen),
                    None,
                )?;
            }
            let mut took = [Duration::ZERO; 2];
            for (cmd, series) in [("ADD", &mut add), ("DEL", &mut del)] {
                for k in 0..2 {
                    let who = (round + k) % 2;
                    let r = exec::cni(
                        bins[who],
                        cmd,
                        &pods[who].path(),
                        "net1",
                        &args[who],
                        &confs[who],
                    )?;
                    ensure!(r.ok, "{} {cmd} failed: {}", names[who], r.stdout);
                    series[who].push(r.took);
                    took[who] += r.took;
                }
            }
            for (who, t) in took.iter().enumerate() {
                cycle[who].push(*t);
            }
            // Ours gave its macvtap back to the host (the device plugin's
            // reclaim removes it once the pod is gone); Go's deleted its.
            let back = host
                .get_link(&ours_link)?
                .context("our DEL did not give the link back")?;
            gave_back += 1;
            host.del_link(back.index, &ours_link)?;
            ensure!(
                host.get_link(GO_DEVICE)?.is_none(),
                "the Go CNI's DEL left its link on the host"
            );
        }
        Ok(())
    })?;
    for p in &pods {
        let left: Vec<String> = p.links()?.into_iter().filter(|l| l != "lo").collect();
        ensure!(left.is_empty(), "links left in {}: {left:?}", p.name);
    }
    report.section(
        &format!("Side by side: CNI, ours against {GO}"),
        &format!(
            "Wall time of each command of our CNI (the static build that ships) and of the Go \
             project's CNI (kubevirt/macvtap-cni v0.13.1, built from its source with Go 1.23, CGO \
             off), {n} interleaved rounds on one node. Each round the device plugin's part is done \
             first and not measured: a bridge-mode macvtap on the node's NIC for each CNI (ours \
             named `mvt…` after the device ID, Go's named exactly its device ID, as each project's \
             device plugin names it). Both get the same NetConf keys (`mtu` 1500, `owner`/`group` \
             107) and a MAC in `CNI_ARGS`; the order alternates each round. ADD moves the host \
             macvtap into the pod, renames it, sets MAC and MTU and brings it up in both. **DEL \
             differs on purpose:** ours gives the link back to the host (down, fresh MAC, moved \
             back under its host name and ifindex, so a sandbox retry of the same pod finds its \
             device and `/dev/tapN` again; {gave_back} of {n} links came back), Go's deletes the \
             link in the pod, so a retried sandbox finds no device until the kubelet allocates \
             again. ADD+DEL is the sum of one round's two commands."
        ),
    );
    let mut panels = Vec::new();
    for (what, s) in [("ADD", &add), ("DEL", &del), ("ADD+DEL", &cycle)] {
        report.latency_table(&[
            Row {
                series: s[1].clone(),
                reference: None,
            },
            Row {
                series: s[0].clone(),
                reference: Some((GO.into(), s[1].p50())),
            },
        ]);
        panels.push((format!("CNI {what}: ours vs {GO}"), s.to_vec()));
    }
    Ok(panels)
}

/// What the device plugin side by side measures of one daemon.
struct Side {
    name: &'static str,
    client: PluginClient,
    pid: u32,
    prefix: &'static str,
}

/// The Go daemon in its node namespace, served by the test kubelet in the
/// kubelet's default directory (the only one it knows).
struct GoDaemon {
    daemon: Daemon,
    kubelet: TestKubelet,
    _registration: LenientUnary,
    _claim: HostDevicePlugins,
}

/// The config both daemons get, each for its own resource name.
fn dp_conf(name: &str, capacity: u32) -> String {
    format!(r#"[{{"name":"{name}","lowerDevice":"lower0","mode":"bridge","capacity":{capacity}}}]"#)
}

/// How long a daemon gets to register (the Go one takes about 10 s).
const REGISTER_WAIT: Duration = Duration::from_secs(60);
const OURS_RES: &str = "sbs";
const GO_RES: &str = "gosbs";
const CAPACITY: u32 = 1000;
/// The kubelet's Registration method, relayed for the Go plugin.
const REGISTER: &str = "/v1beta1.Registration/Register";

async fn start_go(go: &GoProject, node: &Node) -> Result<(GoDaemon, Duration)> {
    let claim = HostDevicePlugins::claim()?;
    let kubelet = TestKubelet::start(claim.dir())
        .await
        .map_err(|e| anyhow!("{e}"))?;
    // The Go plugin's grpc-go sends the socket path as `:authority`, which
    // the real kubelet (grpc-go) takes and the test kubelet (tonic) refuses:
    // `kubelet.sock` relays Register whatever the authority.
    let sock = claim.dir().join("kubelet.sock");
    let upstream = claim.dir().join(".test-kubelet.sock");
    std::fs::rename(&sock, &upstream)?;
    let registration = LenientUnary::serve(&sock, &upstream, &[REGISTER])?;
    let full = format!("{}/{GO_RES}", macvtap_link::RESOURCE_PREFIX);
    let t = Instant::now();
    // As the Go project's DaemonSet runs it.
    let daemon = Daemon::start(
        &go.deviceplugin,
        &node.ns,
        node.kubelet_dir.path(),
        &["-v", "3", "-logtostderr"],
        &[("DP_MACVTAP_CONF", &dp_conf(GO_RES, CAPACITY))],
    )?;
    kubelet
        .wait_for_registration(&full, 0, REGISTER_WAIT)
        .await
        .map_err(|e| anyhow!("{e}; Go daemon log:\n{}", daemon.log()))?;
    let took = t.elapsed();
    Ok((
        GoDaemon {
            daemon,
            kubelet,
            _registration: registration,
            _claim: claim,
        },
        took,
    ))
}

/// Waits for the Go daemon's devices at the kubelet and connects to it.
async fn go_client(go: &GoDaemon) -> Result<PluginClient> {
    let full = format!("{}/{GO_RES}", macvtap_link::RESOURCE_PREFIX);
    let reg = go
        .kubelet
        .wait_for_registration(&full, 0, REGISTER_WAIT)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    go.kubelet
        .wait_resource(&full, REGISTER_WAIT, |v| {
            v.connected && v.devices.len() == CAPACITY as usize
        })
        .await
        .map_err(|e| anyhow!("{e}; Go daemon log:\n{}", go.daemon.log()))?;
    go.kubelet
        .connect(&reg.endpoint)
        .await
        .map_err(|e| anyhow!("{e}"))
}

/// Starts our daemon on `node` and returns the time to its Register.
async fn start_ours(bin: &Path, node: &mut Node) -> Result<(u32, Duration)> {
    let full = format!("{}/{OURS_RES}", macvtap_link::RESOURCE_PREFIX);
    let t = Instant::now();
    let pid = node.start_device_plugin_bin(bin, &dp_conf(OURS_RES, CAPACITY), &[])?;
    node.kubelet
        .as_ref()
        .context("kubelet")?
        .wait_for_registration(&full, 0, REGISTER_WAIT)
        .await
        .map_err(|e| anyhow!("{e}; daemon log:\n{}", node.daemon_log()))?;
    Ok((pid, t.elapsed()))
}

/// The device plugins side by side: start to Register (`tries` of each),
/// idle RSS and CPU over `idle_secs`, then Allocate of new devices (`n`
/// each, at least 1,000 so the RSS after 1,000 Allocates is read) and of
/// held devices, interleaved, through the test kubelets' gRPC clients.
pub async fn device_plugins(
    ours_bin: &Path,
    go: &GoProject,
    n: usize,
    tries: usize,
    idle_secs: u64,
    report: &mut Report,
) -> Result<Vec<(String, Vec<Samples>)>> {
    // One node namespace for both, so their macvtaps get distinct ifindexes
    // (two namespaces would number both from the same start, and each
    // /dev/tapN can be only one of them).
    let mut ours_node = Node::new()?;
    ours_node.start_kubelet().await?;

    // Start -> Register, `tries` times each (the last start stays up).
    let mut reg_ours = Samples::new("ours start -> Register");
    let mut reg_go = Samples::new(format!("{GO} start -> Register"));
    let mut ours_pid = 0;
    let mut go_daemon = None;
    for i in 0..tries.max(1) {
        if i > 0 {
            ours_node.stop_device_plugin()?;
            scrap_macvtaps(&ours_node)?;
            ours_node.kubelet.take().context("kubelet")?.stop().await;
            ours_node.start_kubelet().await?;
        }
        let (pid, took) = start_ours(ours_bin, &mut ours_node).await?;
        ours_pid = pid;
        reg_ours.push(took);
        // The Go daemon and its kubelet go before the next claim.
        if let Some(old) = go_daemon.take() {
            let GoDaemon {
                daemon, kubelet, ..
            } = old;
            drop(daemon);
            kubelet.stop().await;
        }
        let (g, took) = start_go(go, &ours_node).await?;
        reg_go.push(took);
        go_daemon = Some(g);
    }
    let go_daemon = go_daemon.context("no Go daemon")?;
    let ours_client = ours_node.plugin(OURS_RES, CAPACITY as usize).await?;
    let go_client = go_client(&go_daemon).await?;
    let go_pid = go_daemon.daemon.pid();

    // Idle: both daemons in the same window.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss = [rss_kib(ours_pid)?, rss_kib(go_pid)?];
    let ticks0 = [cpu_ticks(ours_pid)?, cpu_ticks(go_pid)?];
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let idle_cpu = [
        (cpu_ticks(ours_pid)? - ticks0[0]) as f64 / 100.0,
        (cpu_ticks(go_pid)? - ticks0[1]) as f64 / 100.0,
    ];

    let mut sides = [
        Side {
            name: "ours",
            client: ours_client,
            pid: ours_pid,
            prefix: OURS_RES,
        },
        Side {
            name: GO,
            client: go_client,
            pid: go_pid,
            prefix: GO_RES,
        },
    ];
    let mut fresh: Vec<Samples> = sides
        .iter()
        .map(|s| Samples::new(format!("{} Allocate, new device", s.name)))
        .collect();
    let mut held: Vec<Samples> = sides
        .iter()
        .map(|s| Samples::new(format!("{} Allocate, held device again", s.name)))
        .collect();
    let total = n.max(1000);
    let batch = 200usize;
    let mut done = 0usize;
    let mut rss_after_1000 = None;
    while done < total {
        let this = batch.min(total - done);
        for i in 0..this {
            for k in 0..2 {
                let who = (done + i + k) % 2;
                let s = &mut sides[who];
                let id = format!("{}Mvp{i}", s.prefix);
                let t = Instant::now();
                s.client
                    .allocate(&[&id])
                    .await
                    .map_err(|e| anyhow!("{} Allocate {id}: {e}", s.name))?;
                fresh[who].push(t.elapsed());
            }
        }
        // A device its pod already holds, asked again (an init container's
        // device for the app container): ours reuses the link, Go's
        // deletes and re-creates it.
        for i in 0..this.min(20) {
            for k in 0..2 {
                let who = (i + k) % 2;
                let s = &mut sides[who];
                let id = format!("{}Mvp{i}", s.prefix);
                let t = Instant::now();
                s.client
                    .allocate(&[&id])
                    .await
                    .map_err(|e| anyhow!("{} Allocate {id} again: {e}", s.name))?;
                held[who].push(t.elapsed());
            }
        }
        done += this;
        if done >= 1000 && rss_after_1000.is_none() {
            rss_after_1000 = Some([rss_kib(sides[0].pid)?, rss_kib(sides[1].pid)?]);
        }
        tokio::task::block_in_place(|| scrap_macvtaps(&ours_node))?;
    }
    let rss_after = rss_after_1000.context("fewer than 1000 Allocates")?;

    report.section(
        &format!("Side by side: device plugins, ours against {GO}"),
        &format!(
            "Our device plugin (static build) and the Go project's (built from its source, CGO \
             off, run with `-v 3 -logtostderr` as its DaemonSet runs it), both in one node \
             namespace (so their macvtaps' ifindexes, and so their `/dev/tapN`, never clash) \
             on its veth NIC `lower0`, one resource of {CAPACITY} devices each, each registering with a test kubelet (the Go one in `/var/lib/kubelet/device-plugins/`, \
             the only directory it knows). Start -> Register: from starting the process to the \
             test kubelet accepting its Register, {} starts each. Allocate: one device per call \
             through the plugin's unix socket with the test kubelet's gRPC client, as the kubelet \
             calls it; {total} distinct new devices each, the two daemons alternating call by \
             call, links removed in batches of {batch} (not measured). Ours checks what Go's does \
             not: the device ID, the NIC's master, `/dev/tapN` against sysfs, and deletes what a \
             failed request made; Go's also brings the link up, which ours leaves to the CNI. \
             \"Held device again\" asks for a device whose link exists (the kubelet does so for an \
             app container after its init container): ours reuses the link, Go's deletes and \
             re-creates it (a new ifindex, so a new `/dev/tapN`).",
            tries.max(1)
        ),
    );
    report.latency_table(&[
        Row {
            series: reg_go.clone(),
            reference: None,
        },
        Row {
            series: reg_ours.clone(),
            reference: Some((GO.into(), reg_go.p50())),
        },
    ]);
    report.text(&format!(
        "Ours registers {:.0} times sooner than Go's (p50 {:.1} ms against {:.1} s).\n",
        reg_go.p50() / reg_ours.p50(),
        reg_ours.p50(),
        reg_go.p50() / 1000.0
    ));
    report.latency_table(&[
        Row {
            series: fresh[1].clone(),
            reference: None,
        },
        Row {
            series: fresh[0].clone(),
            reference: Some((GO.into(), fresh[1].p50())),
        },
        Row {
            series: held[1].clone(),
            reference: None,
        },
        Row {
            series: held[0].clone(),
            reference: Some((GO.into(), held[1].p50())),
        },
    ]);
    let mib = |k: u64| k as f64 / 1024.0;
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.2}x", a / b)
        } else if a == 0.0 {
            "both under one clock tick (0.01 s)".into()
        } else {
            "n/a (Go: 0)".into()
        }
    };
    report.text(&format!(
        "| measure | ours | {GO} | ours / Go |\n| --- | ---: | ---: | ---: |\n\
         | idle RSS after start, MiB | {:.1} | {:.1} | {} |\n\
         | CPU in {idle_secs} s idle, s | {:.2} | {:.2} | {} |\n\
         | RSS after 1,000 Allocates, MiB | {:.1} | {:.1} | {} |\n",
        mib(idle_rss[0]),
        mib(idle_rss[1]),
        ratio(mib(idle_rss[0]), mib(idle_rss[1])),
        idle_cpu[0],
        idle_cpu[1],
        ratio(idle_cpu[0], idle_cpu[1]),
        mib(rss_after[0]),
        mib(rss_after[1]),
        ratio(mib(rss_after[0]), mib(rss_after[1])),
    ));
    let GoDaemon {
        daemon, kubelet, ..
    } = go_daemon;
    drop(daemon);
    kubelet.stop().await;
    tokio::task::block_in_place(|| scrap_macvtaps(&ours_node))?;
    Ok(vec![
        (
            format!("Allocate of a new device: ours vs {GO}"),
            vec![fresh[0].clone(), fresh[1].clone()],
        ),
        (
            format!("Allocate of a held device: ours vs {GO}"),
            vec![held[0].clone(), held[1].clone()],
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_cnis_get_the_same_netconf_but_for_the_device() {
        let mut ours: serde_json::Value = serde_json::from_str(&cni_conf(OURS_DEVICE)).unwrap();
        let mut go: serde_json::Value = serde_json::from_str(&cni_conf(GO_DEVICE)).unwrap();
        assert_eq!(ours["deviceID"], OURS_DEVICE);
        assert_eq!(go["deviceID"], GO_DEVICE);
        ours["deviceID"] = json!(null);
        go["deviceID"] = json!(null);
        assert_eq!(ours, go);
        assert_eq!(ours["type"], "macvtap");
    }
}
