//! Device plugin figures, all through the real binary and the real gRPC
//! sockets of the test kubelet: Allocate against the in-process cost of the
//! same link creation, the first ListAndWatch of a large node, health and
//! re-registration latency, registration under a misbehaving kubelet
//! (stream ends, hung Register), memory and idle CPU.

use super::report::{Report, Row};
use super::stats::Samples;
use crate::node::{Node, WAIT};
use anyhow::{Context, Result, anyhow};
use macvtap_deviceplugin::config::ResourceConfig;
use macvtap_deviceplugin::core::host::Host;
use macvtap_deviceplugin::core::link::create_device;
use macvtap_link::{Handle, LinkChange, Links, Linux, MacvtapMode, Netns};
use prost::Message;
use std::path::Path;
use std::time::{Duration, Instant};

/// A link group no other link uses: marks links to delete in one batch.
const SCRAP_GROUP: &str = "77";

fn conf(resources: usize, capacity: u32) -> String {
    let entries: Vec<String> = (0..resources)
        .map(|i| {
            let name = if resources == 1 { "dataplane".to_string() } else { format!("r{i}") };
            format!(r#"{{"name":"{name}","lowerDevice":"lower0","mode":"bridge","capacity":{capacity}}}"#)
        })
        .collect();
    format!("[{}]", entries.join(","))
}

/// Deletes every macvtap on the node in one kernel batch (one RCU wait
/// instead of one per link); not measured.
pub(super) fn scrap_macvtaps(node: &Node) -> Result<()> {
    let ns = Netns::open(node.ns.path())?;
    let h = Handle::in_netns(&ns)?;
    let mut any = false;
    for l in h.list_links()?.iter().filter(|l| l.is_macvtap()) {
        node.ns
            .ip(&["link", "set", &l.name, "group", SCRAP_GROUP])?;
        any = true;
    }
    if any {
        node.ns.ip(&["link", "del", "group", SCRAP_GROUP])?;
    }
    Ok(())
}

/// VmRSS of process `pid` in KiB.
pub(super) fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")
}

/// User and system CPU time of process `pid`, in clock ticks (1/100 s).
pub(super) fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of stat (indexes 11, 12 after the comm).
    Ok(fields.get(11).context("utime")?.parse::<u64>()?
        + fields.get(12).context("stime")?.parse::<u64>()?)
}

/// Runs every device plugin figure with the daemon at `bin`.
pub async fn all(
    bin: &Path,
    n: usize,
    idle_secs: u64,
    report: &mut Report,
) -> Result<Vec<(String, Vec<Samples>)>> {
    let mut panels = Vec::new();
    panels.push(allocate(bin, n, report).await?);
    first_list(bin, report).await?;
    panels.push(lifecycle(bin, report).await?);
    panels.push(misbehaving_kubelet(bin, report).await?);
    footprint(bin, idle_secs, report).await?;
    Ok(panels)
}

async fn allocate(bin: &Path, n: usize, report: &mut Report) -> Result<(String, Vec<Samples>)> {
    let mut node = Node::new()?;
    node.start_kubelet().await?;
    node.start_device_plugin_bin(bin, &conf(1, 1000), &[])?;
    let mut client = node.plugin("dataplane", 1000).await?;
    let mut grpc = Samples::new("Allocate via gRPC");
    let mut rpc = Samples::new("GetDevicePluginOptions via gRPC (RPC alone)");
    let mut floor = Samples::new("in-process create_device");
    let ns_path = node.ns.path();
    let cfg = ResourceConfig {
        name: "bench".into(),
        lower_device: "lower0".into(),
        mode: MacvtapMode::Bridge,
        capacity: 1000,
        placement: None,
    };
    let mut next = 0u32;
    let batch = 200usize;
    let mut done = 0usize;
    while done < n {
        for _ in 0..batch.min(n - done) {
            let id = format!("dataplaneMvp{next}");
            let floor_id = format!("benchMvp{next}");
            next += 1;
            let swap = done % 2 == 1;
            for k in 0..2 {
                if (k == 0) != swap {
                    let t = Instant::now();
                    client
                        .allocate(&[&id])
                        .await
                        .map_err(|s| anyhow!("Allocate {id}: {s}"))?;
                    grpc.push(t.elapsed());
                    let t = Instant::now();
                    client.options().await?;
                    rpc.push(t.elapsed());
                } else {
                    // Like the daemon under `ip netns exec`: inside the node
                    // namespace, with its sysfs on /sys.
                    let took = tokio::task::block_in_place(|| -> Result<Duration> {
                        let ns = Netns::open(&ns_path)?;
                        let took = ns.run_with_sysfs(|| {
                            let host = Host::current(&Linux)?;
                            let lower = host.link_ops().get_link("lower0")?.ok_or(
                                macvtap_link::Error::Netlink {
                                    op: macvtap_link::Op::GetLink,
                                    what: "looking up lower0".into(),
                                    source: nix::errno::Errno::ENODEV,
                                },
                            )?;
                            let t = Instant::now();
                            let made = create_device(&host, &cfg, &lower, &floor_id);
                            let took = t.elapsed();
                            made.map_err(|e| macvtap_link::Error::Decode {
                                op: "create_device".into(),
                                msg: e.to_string(),
                            })?;
                            Ok(took)
                        })?;
                        Ok(took)
                    })?;
                    floor.push(took);
                }
            }
            done += 1;
        }
        tokio::task::block_in_place(|| scrap_macvtaps(&node))?;
        next = 0;
    }
    report.section(
        "Device plugin: Allocate",
        &format!(
            "Latency of one Allocate for one device through the real gRPC socket (the test kubelet's client), against \
             `core::link::create_device` called in-process in the node namespace (lookup, create the macvtap, check \
             /dev/tapN). {n} of each, interleaved; links are removed in batches between rounds."
        ),
    );
    let fp = floor.p50();
    report.latency_table(&[
        Row {
            series: floor.clone(),
            reference: None,
        },
        Row {
            series: grpc.clone(),
            reference: Some(("in-process".into(), fp)),
        },
        Row {
            series: rpc.clone(),
            reference: Some(("in-process".into(), fp)),
        },
    ]);
    Ok(("Device plugin Allocate".into(), vec![grpc, floor]))
}

async fn first_list(bin: &Path, report: &mut Report) -> Result<()> {
    let mut node = Node::new()?;
    node.start_kubelet().await?;
    node.start_device_plugin_bin(bin, &conf(32, 1000), &[])?;
    let kubelet = node.kubelet.as_ref().context("kubelet")?;
    let mut times = Samples::new("first ListAndWatch message");
    let mut bytes = Vec::new();
    for i in 0..32 {
        let full = format!("{}/r{i}", macvtap_link::RESOURCE_PREFIX);
        let reg = kubelet
            .wait_for_registration(&full, 0, WAIT)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let mut client = kubelet
            .connect(&reg.endpoint)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let t = Instant::now();
        let mut stream = client
            .client
            .list_and_watch(kubelet_proto::v1beta1::Empty {})
            .await?
            .into_inner();
        let msg = stream.message().await?.context("no first message")?;
        times.push(t.elapsed());
        anyhow::ensure!(
            msg.devices.len() == 1000,
            "resource r{i} sent {} devices",
            msg.devices.len()
        );
        bytes.push(msg.encoded_len());
    }
    report.section(
        "Device plugin: first ListAndWatch, 32 resources x 1000 devices",
        "Time from opening ListAndWatch to the first message (the full device list), for each of 32 resources of 1000 devices on one daemon, and the message size.",
    );
    report.latency_table(&[Row {
        series: times,
        reference: None,
    }]);
    let total: usize = bytes.iter().sum();
    report.text(&format!(
        "Message size: {} bytes per resource (1000 devices), {} bytes for all 32.\n",
        bytes.first().copied().unwrap_or(0),
        total
    ));
    Ok(())
}

async fn lifecycle(bin: &Path, report: &mut Report) -> Result<(String, Vec<Samples>)> {
    let mut node = Node::new()?;
    node.start_kubelet().await?;
    node.start_device_plugin_bin(bin, &conf(1, 50), &[])?;
    node.plugin("dataplane", 50).await?;
    let full = format!("{}/dataplane", macvtap_link::RESOURCE_PREFIX);
    let ns = Netns::open(node.ns.path())?;
    let h = Handle::in_netns(&ns)?;
    let lower = h.get_link("lower0")?.context("lower0")?;
    let mut down = Samples::new("NIC down -> Unhealthy");
    let mut up = Samples::new("NIC up -> Healthy");
    for _ in 0..20 {
        for (want_up, series) in [(false, &mut down), (true, &mut up)] {
            let state = if want_up { "Healthy" } else { "Unhealthy" };
            let t = Instant::now();
            h.set_link(
                lower.index,
                "lower0",
                &LinkChange {
                    up: Some(want_up),
                    ..Default::default()
                },
            )?;
            node.kubelet
                .as_ref()
                .context("kubelet")?
                .wait_resource(&full, WAIT, |v| {
                    !v.devices.is_empty() && v.devices.iter().all(|d| d.health == state)
                })
                .await
                .map_err(|e| anyhow!("{e}"))?;
            series.push(t.elapsed());
        }
    }
    let mut rereg = Samples::new("kubelet.sock recreated -> registered");
    for _ in 0..20 {
        let kubelet = node.kubelet.take().context("kubelet")?;
        let kubelet = kubelet.restart().await.map_err(|e| anyhow!("{e}"))?;
        let t = Instant::now();
        kubelet
            .wait_for_registration(&full, 0, WAIT)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        rereg.push(t.elapsed());
        node.kubelet = Some(kubelet);
    }
    report.section(
        "Device plugin: health and kubelet restarts",
        "Time from setting the NIC down (up) with netlink to the test kubelet (through the ListAndWatch stream it opened itself) having every device Unhealthy (Healthy); time from a kubelet restart (sockets deleted, kubelet.sock served anew) to the plugin's new registration. 20 tries each; target under 1 s at p99.",
    );
    report.latency_table(&[
        Row {
            series: down.clone(),
            reference: None,
        },
        Row {
            series: up.clone(),
            reference: None,
        },
        Row {
            series: rereg.clone(),
            reference: None,
        },
    ]);
    Ok((
        "Device plugin health and re-registration".into(),
        vec![down, up, rereg],
    ))
}

/// Whether process `pid` has exited (gone, or a zombie not reaped yet).
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .is_none_or(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

/// A node with resources `a` on `lower0` and `b` on `lower1`, both served
/// by the daemon at `bin`, and the kubelet hanging in a Register of `a`.
async fn node_with_a_hung_registration(bin: &Path) -> Result<(Node, u32)> {
    let mut node = Node::new()?;
    node.ns.ip(&[
        "link", "add", "lower1", "type", "veth", "peer", "name", "lower1p",
    ])?;
    node.ns.ip(&["link", "set", "lower1p", "up"])?;
    node.ns.ip(&["link", "set", "lower1", "up"])?;
    node.start_kubelet().await?;
    let conf = r#"[{"name":"a","lowerDevice":"lower0","capacity":50},{"name":"b","lowerDevice":"lower1","capacity":50}]"#;
    let pid = node.start_device_plugin_bin(bin, conf, &[])?;
    node.plugin("a", 50).await?;
    node.plugin("b", 50).await?;
    let k = node.kubelet.as_ref().context("kubelet")?;
    k.hang_register(true);
    k.break_stream(&format!("{}/a", macvtap_link::RESOURCE_PREFIX))
        .map_err(|e| anyhow!("{e}"))?;
    k.wait_hung(1, WAIT).await.map_err(|e| anyhow!("{e}"))?;
    Ok((node, pid))
}

async fn misbehaving_kubelet(bin: &Path, report: &mut Report) -> Result<(String, Vec<Samples>)> {
    let tries = 20;
    // Stream end: the kubelet's ListAndWatch stream breaks; the plugin must
    // notice and register again (the kubelet never reopens it).
    let mut node = Node::new()?;
    node.start_kubelet().await?;
    node.start_device_plugin_bin(bin, &conf(1, 50), &[])?;
    node.plugin("dataplane", 50).await?;
    let full = format!("{}/dataplane", macvtap_link::RESOURCE_PREFIX);
    let mut stream_end = Samples::new("stream end -> re-registered");
    {
        let k = node.kubelet.as_ref().context("kubelet")?;
        for _ in 0..tries {
            let seen = k.registration_count(&full);
            // A stream that lived under a second counts as a quick loss and
            // backs off; measure the first loss after a stable stream.
            tokio::time::sleep(Duration::from_millis(1100)).await;
            let t = Instant::now();
            k.break_stream(&full).map_err(|e| anyhow!("{e}"))?;
            k.wait_for_registration(&full, seen, WAIT)
                .await
                .map_err(|e| anyhow!("{e}"))?;
            stream_end.push(t.elapsed());
            k.wait_resource(&full, WAIT, |v| v.connected && v.live_streams == 1)
                .await
                .map_err(|e| anyhow!("{e}"))?;
        }
    }
    drop(node);

    // Health of another resource while a Register hangs.
    let (node, _) = node_with_a_hung_registration(bin).await?;
    let b = format!("{}/b", macvtap_link::RESOURCE_PREFIX);
    let mut hung_down = Samples::new("NIC down -> Unhealthy while Register hangs");
    {
        let k = node.kubelet.as_ref().context("kubelet")?;
        let h = Handle::in_netns(&Netns::open(node.ns.path())?)?;
        let lower1 = h.get_link("lower1")?.context("lower1")?;
        for _ in 0..tries {
            for (up, state) in [(false, "Unhealthy"), (true, "Healthy")] {
                let t = Instant::now();
                h.set_link(
                    lower1.index,
                    "lower1",
                    &LinkChange {
                        up: Some(up),
                        ..Default::default()
                    },
                )?;
                k.wait_resource(&b, WAIT, |v| {
                    !v.devices.is_empty() && v.devices.iter().all(|d| d.health == state)
                })
                .await
                .map_err(|e| anyhow!("{e}"))?;
                if !up {
                    hung_down.push(t.elapsed());
                }
            }
            anyhow::ensure!(k.hung() >= 1, "the Register of a stopped hanging");
        }
        k.hang_register(false);
    }
    drop(node);

    // SIGTERM while a Register hangs.
    let mut term = Samples::new("SIGTERM -> exit while Register hangs");
    for _ in 0..tries {
        let (mut node, pid) = node_with_a_hung_registration(bin).await?;
        let t = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid)?),
            nix::sys::signal::Signal::SIGTERM,
        )?;
        while !exited(pid) {
            anyhow::ensure!(
                t.elapsed() < WAIT,
                "the daemon did not exit within {WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        term.push(t.elapsed());
        let k = node.kubelet.as_ref().context("kubelet")?;
        anyhow::ensure!(
            k.hung() >= 1,
            "the Register stopped hanging before the exit"
        );
        k.hang_register(false);
        // Reaps the daemon and checks it exited 0.
        node.stop_device_plugin()?;
    }
    report.section(
        "Device plugin: a misbehaving kubelet",
        "Time from the test kubelet's ListAndWatch stream breaking (the kubelet then counts no devices and never reopens it) to the plugin's \
         new registration; with the kubelet hanging in a Register of one resource, time from setting the other resource's NIC down to the \
         kubelet having its devices Unhealthy, and time from SIGTERM to the daemon's exit. 20 tries each; targets: under 1 s at p99.",
    );
    report.latency_table(&[
        Row {
            series: stream_end.clone(),
            reference: None,
        },
        Row {
            series: hung_down.clone(),
            reference: None,
        },
        Row {
            series: term.clone(),
            reference: None,
        },
    ]);
    Ok((
        "Device plugin under a misbehaving kubelet".into(),
        vec![stream_end, hung_down, term],
    ))
}

async fn footprint(bin: &Path, idle_secs: u64, report: &mut Report) -> Result<()> {
    let mut node = Node::new()?;
    node.start_kubelet().await?;
    let pid = node.start_device_plugin_bin(bin, &conf(1, 1000), &["--log-format", "json"])?;
    let mut client = node.plugin("dataplane", 1000).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let daemon = daemon_pid(pid)?;
    let idle_rss = rss_kib(daemon)?;
    let ticks0 = cpu_ticks(daemon)?;
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let idle_cpu = (cpu_ticks(daemon)? - ticks0) as f64 / 100.0;
    let total = 10_000usize;
    let t = Instant::now();
    let mut rss_rounds = Vec::new();
    for round in 0..total / 1000 {
        for i in 0..1000 {
            let id = format!("dataplaneMvp{i}");
            client
                .allocate(&[&id])
                .await
                .map_err(|s| anyhow!("Allocate {id} (round {round}): {s}"))?;
        }
        tokio::task::block_in_place(|| scrap_macvtaps(&node))?;
        rss_rounds.push(format!("{:.1}", rss_kib(daemon)? as f64 / 1024.0));
    }
    let spent = t.elapsed();
    let busy_rss = rss_kib(daemon)?;
    report.section(
        "Device plugin: footprint",
        &format!(
            "VmRSS of the daemon (one resource of 1000 devices, JSON logs) when idle after start, CPU time it used in {idle_secs} s idle, \
             and VmRSS after {total} Allocates (in rounds of 1000, links removed in batches between rounds; {:.1} s in all). Target: idle RSS under 8 MiB.",
            spent.as_secs_f64()
        ),
    );
    report.text(&format!(
        "| measure | value |\n| --- | ---: |\n| idle RSS | {:.1} MiB |\n| CPU in {idle_secs} s idle | {idle_cpu:.2} s |\n| RSS after {total} Allocates | {:.1} MiB |\n",
        idle_rss as f64 / 1024.0,
        busy_rss as f64 / 1024.0
    ));
    report.text(&format!(
        "RSS in MiB after each round of 1000 Allocates: {}\n",
        rss_rounds.join(", ")
    ));
    Ok(())
}

/// `ip netns exec` execs the daemon in place, so the child's pid is the daemon's.
fn daemon_pid(pid: u32) -> Result<u32> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))?;
    anyhow::ensure!(
        comm.trim().starts_with("macvtap-device"),
        "pid {pid} is {comm:?}, not the daemon"
    );
    Ok(pid)
}
