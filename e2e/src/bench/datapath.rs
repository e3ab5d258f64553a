//! The data path users choose macvtap for: the macvtap our binaries make
//! against the path KubeVirt's bridge binding builds (a tap in a bridge in
//! the pod namespace, a veth to the node, a bridge on the node's NIC), in
//! the same run, interleaved. With the guest (iperf3 in the initramfs): TCP
//! both ways, ping RTT, and host CPU outside the vCPU thread and softirq
//! time per Gbit; without a guest: the same two paths ending in the pod
//! namespace (an address on the macvtap vs on the pod's bridge).

use super::report::Report;
use crate::guest::{self, Guest};
use crate::node::{CniCall, Node, binary, run_cni};
use crate::sandbox::TestNs;
use crate::vm::{GuestNet, Netdev, Qemu, Reaped};
use anyhow::{Context, Result, anyhow, ensure};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const MACVTAP_MAC: &str = "52:54:00:aa:00:01";
const BRIDGE_MAC: &str = "52:54:00:bb:00:01";
const CLK_TCK: f64 = 100.0;

/// One path's measurements in one run.
#[derive(Debug, Default, Clone)]
struct Sample {
    tx_mbps: f64,
    rx_mbps: f64,
    rtt_ms: f64,
    /// CPU ms per Gbit outside the vCPU thread (QEMU's other threads).
    qemu_other_ms_per_gbit: f64,
    /// System-wide softirq ms per Gbit.
    softirq_ms_per_gbit: f64,
}

/// Both paths, built once.
struct Paths {
    // Held for its namespaces, daemon and kubelet.
    _node: Node,
    pod_m: TestNs,
    pod_b: TestNs,
    tap_node: PathBuf,
    _iperf: Reaped,
}

fn softirq_ticks() -> Result<u64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let cpu = stat.lines().next().context("empty /proc/stat")?;
    cpu.split_whitespace()
        .nth(7)
        .context("no softirq field")?
        .parse()
        .map_err(Into::into)
}

/// CPU ticks of every QEMU thread except the vCPU threads (`CPU n/TCG`).
fn qemu_other_ticks(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter(|s| !s.contains("(CPU "))
        .filter_map(|s| {
            let f: Vec<&str> = s.rsplit(')').next()?.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .sum()
}

fn run_in(ns: &TestNs, args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "{args:?} in {}: {}",
        ns.name,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn iperf_mbps(ns: &TestNs, server: &str, reverse: bool, secs: u32) -> Result<(f64, f64)> {
    let mut args = vec!["iperf3", "-c", server, "-t", &secs.to_string(), "-J"]
        .into_iter()
        .map(str::to_string)
        .collect::<Vec<_>>();
    if reverse {
        args.push("-R".into());
    }
    let s0 = softirq_ticks()?;
    let t = Instant::now();
    let out = run_in(ns, &args.iter().map(String::as_str).collect::<Vec<_>>())?;
    let wall = t.elapsed().as_secs_f64();
    let soft = (softirq_ticks()? - s0) as f64 / CLK_TCK;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("iperf3 JSON without sum_received")?;
    let gbit = bps / 1e9 * wall;
    Ok((bps / 1e6, soft * 1000.0 / gbit.max(1e-9)))
}

fn ping_avg_ms(text: &str) -> Option<f64> {
    // iputils: "rtt min/avg/max/mdev = a/b/c/d ms"; busybox: "round-trip min/avg/max = a/b/c ms"
    let tail = text.lines().rev().find(|l| l.contains("min/avg/max"))?;
    tail.split('=')
        .nth(1)?
        .trim()
        .split('/')
        .nth(1)?
        .parse()
        .ok()
}

impl Paths {
    async fn build(dp_bin: &Path) -> Result<Self> {
        let mut node = Node::new()?;
        // The bridge binding's NIC: a second veth to the peer host, on 198.51.100.0/24.
        node.ns.ip(&[
            "link",
            "add",
            "lowb",
            "type",
            "veth",
            "peer",
            "name",
            "peerb",
            "netns",
            &node.peer.name,
        ])?;
        node.peer
            .ip(&["addr", "add", "198.51.100.1/24", "dev", "peerb"])?;
        node.peer.ip(&["link", "set", "peerb", "up"])?;
        node.ns.ip(&["link", "add", "br0", "type", "bridge"])?;
        node.ns.ip(&["link", "set", "lowb", "master", "br0"])?;
        for l in ["br0", "lowb"] {
            node.ns.ip(&["link", "set", l, "up"])?;
        }
        // The macvtap path, made by our binaries.
        node.start_kubelet().await?;
        node.start_device_plugin_bin(
            dp_bin,
            r#"[{"name":"dataplane","lowerDevice":"lower0","capacity":10}]"#,
            &[],
        )?;
        let mut client = node.plugin("dataplane", 10).await?;
        let alloc = Node::allocate(&mut client, "dataplaneMvp0").await?;
        let pod_m = TestNs::new("pm")?;
        let nad = r#"{"cniVersion":"1.0.0","name":"dataplane","type":"macvtap"}"#;
        cni_add(&node, nad, &pod_m, "dataplaneMvp0")?;
        // The bridge binding: veth node<->pod, a bridge and a tap in the pod.
        let pod_b = TestNs::new("pb")?;
        node.ns.ip(&[
            "link",
            "add",
            "vethb",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &pod_b.name,
        ])?;
        node.ns.ip(&["link", "set", "vethb", "master", "br0"])?;
        node.ns.ip(&["link", "set", "vethb", "up"])?;
        pod_b.ip(&["link", "add", "k6t-net1", "type", "bridge"])?;
        pod_b.ip(&["link", "set", "eth0", "master", "k6t-net1"])?;
        pod_b.ip(&["tuntap", "add", "tap0", "mode", "tap"])?;
        pod_b.ip(&["link", "set", "tap0", "master", "k6t-net1"])?;
        for l in ["k6t-net1", "eth0", "tap0"] {
            pod_b.ip(&["link", "set", l, "up"])?;
        }
        let iperf = Command::new("ip")
            .args(["netns", "exec", &node.peer.name, "iperf3", "-s"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting iperf3 -s (apt-get install iperf3)")?;
        std::thread::sleep(std::time::Duration::from_millis(300));
        Ok(Paths {
            _node: node,
            pod_m,
            pod_b,
            tap_node: alloc.host_path,
            _iperf: Reaped {
                child: iperf,
                what: "iperf3 -s".into(),
            },
        })
    }

    fn without_guest(&self, macvtap: bool) -> Result<Sample> {
        let (ns, dev, addr, peer) = if macvtap {
            (&self.pod_m, "net1", "192.0.2.2/24", "192.0.2.1")
        } else {
            (&self.pod_b, "k6t-net1", "198.51.100.2/24", "198.51.100.1")
        };
        ns.ip(&["addr", "add", addr, "dev", dev])?;
        let r = (|| -> Result<Sample> {
            run_in(ns, &["ping", "-c", "3", "-W", "2", peer])?;
            let (tx, stx) = iperf_mbps(ns, peer, false, 3)?;
            let (rx, srx) = iperf_mbps(ns, peer, true, 3)?;
            let ping = run_in(ns, &["ping", "-c", "20", "-i", "0.05", peer])?;
            Ok(Sample {
                tx_mbps: tx,
                rx_mbps: rx,
                rtt_ms: ping_avg_ms(&ping).context("ping summary")?,
                qemu_other_ms_per_gbit: 0.0,
                softirq_ms_per_gbit: (stx + srx) / 2.0,
            })
        })();
        ns.ip(&["addr", "del", addr, "dev", dev])?;
        r
    }

    fn with_guest(&self, guest: &Guest, macvtap: bool, work: &Path) -> Result<Sample> {
        let (ns, netdev, net) = if macvtap {
            (
                &self.pod_m,
                Netdev::TapNode(&self.tap_node),
                GuestNet {
                    mac: MACVTAP_MAC.into(),
                    ip: "192.0.2.2/24".into(),
                    peer: "192.0.2.1".into(),
                    tries: 20,
                },
            )
        } else {
            (
                &self.pod_b,
                Netdev::TapIfname("tap0"),
                GuestNet {
                    mac: BRIDGE_MAC.into(),
                    ip: "198.51.100.2/24".into(),
                    peer: "198.51.100.1".into(),
                    tries: 20,
                },
            )
        };
        let qemu = Qemu::spawn(
            &ns.name,
            &netdev,
            guest,
            &net,
            "vmtest.mode=iperf vmtest.dur=5",
            work,
        )?;
        let pid = qemu.process.pid();
        // (wall, qemu-other ticks, softirq ticks) at START, MID and END.
        let mut marks: Vec<(Instant, u64, u64)> = Vec::new();
        let run = qemu.wait(|text| {
            let seen = ["VMTEST-IPERF-START", "VMTEST-IPERF-MID", "VMTEST-IPERF-END"]
                .iter()
                .filter(|m| text.contains(*m))
                .count();
            while marks.len() < seen {
                marks.push((
                    Instant::now(),
                    qemu_other_ticks(pid),
                    softirq_ticks().unwrap_or(0),
                ));
            }
        })?;
        ensure!(run.ping_ok, "guest ping failed:\n{}", run.console);
        ensure!(marks.len() == 3, "no iperf markers:\n{}", run.console);
        let value = |key: &str| -> Result<f64> {
            let line = run
                .console
                .lines()
                .find(|l| l.starts_with(key))
                .with_context(|| format!("no {key}:\n{}", run.console))?;
            line[key.len()..]
                .trim()
                .parse()
                .map_err(|e| anyhow!("{key}: {e}: {line}; guest console:\n{}", run.console))
        };
        let tx = value("VMTEST-IPERF-TX")?;
        let rx = value("VMTEST-IPERF-RX")?;
        let rtt = run
            .console
            .lines()
            .find(|l| l.starts_with("VMTEST-RTT"))
            .and_then(ping_avg_ms)
            .context("no VMTEST-RTT")?;
        let window = |a: usize, b: usize, mbps: f64| {
            let secs = marks[b].0.duration_since(marks[a].0).as_secs_f64();
            let gbit = mbps / 1000.0 * secs;
            let other = (marks[b].1 - marks[a].1) as f64 / CLK_TCK * 1000.0 / gbit.max(1e-9);
            let soft = (marks[b].2 - marks[a].2) as f64 / CLK_TCK * 1000.0 / gbit.max(1e-9);
            (other, soft)
        };
        let (o1, s1) = window(0, 1, tx);
        let (o2, s2) = window(1, 2, rx);
        Ok(Sample {
            tx_mbps: tx,
            rx_mbps: rx,
            rtt_ms: rtt,
            qemu_other_ms_per_gbit: (o1 + o2) / 2.0,
            softirq_ms_per_gbit: (s1 + s2) / 2.0,
        })
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn table(title: &str, m: &[Sample], b: &[Sample], with_guest: bool) -> String {
    let mut s = format!(
        "{title}\n\n| measure (mean of {} runs) | macvtap (ours) | bridge binding | bridge / macvtap |\n| --- | ---: | ---: | ---: |\n",
        m.len()
    );
    let mut row = |name: &str, f: &dyn Fn(&Sample) -> f64| {
        let a = mean(&m.iter().map(f).collect::<Vec<_>>());
        let c = mean(&b.iter().map(f).collect::<Vec<_>>());
        s.push_str(&format!("| {name} | {a:.2} | {c:.2} | {:.2} |\n", c / a));
    };
    row("TCP out of the pod/guest, Mbit/s", &|x| x.tx_mbps);
    row("TCP into the pod/guest, Mbit/s", &|x| x.rx_mbps);
    row("ping RTT, ms", &|x| x.rtt_ms);
    row("softirq CPU ms per Gbit", &|x| x.softirq_ms_per_gbit);
    if with_guest {
        row("QEMU CPU outside the vCPU thread, ms per Gbit", &|x| {
            x.qemu_other_ms_per_gbit
        });
    }
    s
}

/// Runs both paths `runs` times each, interleaved, with and without a guest.
pub async fn compare(dp_bin: &Path, runs: usize, report: &mut Report) -> Result<()> {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-guest");
    let guest = tokio::task::block_in_place(|| guest::build_with_iperf(&cache))?;
    let paths = Paths::build(dp_bin).await?;
    let work = tempfile::tempdir()?;
    let (mut nm, mut nb, mut gm, mut gb) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    tokio::task::block_in_place(|| -> Result<()> {
        for run in 0..runs {
            for k in 0..2 {
                let macvtap = (run + k) % 2 == 0;
                let s = paths.without_guest(macvtap)?;
                if macvtap { nm.push(s) } else { nb.push(s) }
            }
            for k in 0..2 {
                let macvtap = (run + k) % 2 == 0;
                let s = paths.with_guest(&guest, macvtap, work.path())?;
                if macvtap { gm.push(s) } else { gb.push(s) }
            }
        }
        Ok(())
    })?;
    report.section(
        "Data path: macvtap vs KubeVirt's bridge binding",
        "Our device plugin and CNI make the macvtap on NIC lower0 and move it into pod A; pod B gets what KubeVirt's \
         bridge binding builds: a bridge on NIC lowb in the node, a veth into the pod, a bridge k6t-net1 in the pod with \
         a tap for the VM. Both NICs are veths to the same peer host running `iperf3 -s`. Runs alternate between the \
         paths. With the guest (QEMU TCG, 1 vCPU, iperf3 in its initramfs) the emulated CPU caps throughput for both, \
         so the host CPU spent per Gbit is what separates them: softirq time of the whole host and the CPU of QEMU's \
         threads other than the vCPU thread, over the iperf windows. Without a guest, the client runs in the pod \
         namespace on an address of the macvtap, or of the pod's bridge.",
    );
    report.text(&table("**With the guest**", &gm, &gb, true));
    report.text(&table("**Without a guest**", &nm, &nb, false));
    drop(paths);
    Ok(())
}

/// CNI ADD of our plugin for `device_id` as `net1` in `pod`, run directly
/// (the data path benchmark measures the link, not how it got there; the
/// node e2e runs the real Multus).
fn cni_add(node: &Node, nad: &str, pod: &TestNs, device_id: &str) -> Result<()> {
    let mut conf: serde_json::Value = serde_json::from_str(nad)?;
    conf["deviceID"] = serde_json::Value::from(device_id);
    run_cni(&CniCall {
        cni: &binary("macvtap-cni", "macvtap")?,
        node_ns: &node.ns.name,
        command: "ADD",
        netns: &pod.path(),
        ifname: "net1",
        args: &format!(
            "IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME=bench-m;MAC={MACVTAP_MAC}"
        ),
        conf: &conf.to_string(),
        settings: None,
    })?;
    Ok(())
}
