//! Link churn: what a node's pod churn (a veth added, set up and deleted
//! per pod start and stop) costs the device plugin that watches one NIC,
//! against the number of other links on the node. Ours and the Go
//! project's device plugin run in turn, each alone in a fresh network
//! namespace of the bench's own (the Go plugin reads the links of the
//! namespace it runs in), registered with a test kubelet in the kubelet's
//! default directory (the only one the Go plugin knows).

use super::report::Report;
use crate::host_kubelet::HostDevicePlugins;
use crate::kubelet_socket::LenientUnary;
use crate::node::WAIT;
use crate::sandbox::TestNs;
use anyhow::{Context, Result, anyhow};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};
use test_kubelet::{Daemon, TestKubelet};

/// Link operations per churn cycle: add a veth pair, set it up, delete it.
const OPS_PER_CYCLE: usize = 3;
const RESOURCE: &str = "macvtap.network.kubevirt.io/dataplane";
const CONF: &str = r#"[{"name":"dataplane","lowerDevice":"lower0","mode":"bridge","capacity":10}]"#;
/// The kubelet's Registration method, relayed for the Go plugin.
const REGISTER: &str = "/v1beta1.Registration/Register";
/// How often the settle check reads the CPU time.
const SETTLE_STEP: Duration = Duration::from_millis(250);

/// One plugin's run at one link count.
struct Run {
    cpu: Duration,
    churn_wall: Duration,
    /// CPU time over the same wall time with no churn, right after.
    idle: Duration,
}

/// Clock ticks per second of `/proc/<pid>/stat` (`getconf CLK_TCK`; 100 on
/// every Linux this runs on if that fails).
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of every thread of `pid` so far.
fn cpu_time(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 (indexes 11 and 12 after the comm).
    let ticks = fields.get(11).context("utime")?.parse::<u64>()?
        + fields.get(12).context("stime")?.parse::<u64>()?;
    Ok(Duration::from_secs_f64(ticks as f64 / ticks_per_second()))
}

/// The CPU time of `pid` once it stops rising (two equal reads a step apart).
async fn settled_cpu(pid: u32) -> Result<Duration> {
    let mut last = cpu_time(pid)?;
    for _ in 0..40 {
        tokio::time::sleep(SETTLE_STEP).await;
        let now = cpu_time(pid)?;
        if now == last {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

/// A namespace with NIC `lower0` and `others` other links (veth pairs).
fn node_with_links(others: usize) -> Result<TestNs> {
    let ns = TestNs::new("churn")?;
    ns.add_nic("lower0")?;
    let mut batch = tempfile::NamedTempFile::new()?;
    for i in 0..others.div_ceil(2) {
        writeln!(batch, "link add o{i} type veth peer name q{i}")?;
    }
    batch.flush()?;
    ns.ip(&["-batch", &batch.path().to_string_lossy()])?;
    Ok(ns)
}

/// Starts `bin` in a fresh node with `others` links, waits for it to serve,
/// runs `cycles` churn cycles, and measures its CPU time over them.
async fn run_one(
    bin: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    kubelet: &TestKubelet,
    others: usize,
    cycles: usize,
    log_dir: &Path,
) -> Result<Run> {
    let ns = node_with_links(others)?;
    let attempt = kubelet.registration_count(RESOURCE);
    let mut daemon = Daemon::start(bin, &ns, log_dir, args, env)?;
    let started = async {
        kubelet
            .wait_for_registration(RESOURCE, attempt, WAIT * 3)
            .await?;
        kubelet
            .wait_resource(RESOURCE, WAIT, |v| {
                v.connected
                    && !v.devices.is_empty()
                    && v.devices.iter().all(|d| d.health == "Healthy")
            })
            .await
    }
    .await;
    started.map_err(|e| {
        anyhow!(
            "{} did not serve: {e}; log:\n{}",
            bin.display(),
            daemon.log()
        )
    })?;
    let pid = daemon.pid();
    let before = settled_cpu(pid).await?;
    let t = Instant::now();
    for _ in 0..cycles {
        ns.ip(&["link", "add", "c0", "type", "veth", "peer", "name", "c1"])?;
        ns.ip(&["link", "set", "c0", "up"])?;
        ns.ip(&["link", "del", "c0"])?;
    }
    let after = settled_cpu(pid).await?;
    let churn_wall = t.elapsed();
    let quiet = cpu_time(pid)?;
    tokio::time::sleep(churn_wall).await;
    let idle = cpu_time(pid)?.saturating_sub(quiet);
    daemon.signal(nix::sys::signal::Signal::SIGTERM)?;
    let _ = daemon.wait_exit(WAIT);
    Ok(Run {
        cpu: after.saturating_sub(before),
        churn_wall,
        idle,
    })
}

/// Runs the churn comparison at each of `link_counts`, `cycles` cycles
/// each, with our daemon at `ours` and the Go project's at `go` (ours alone
/// when it could not be built: its columns then say so), and adds its
/// section to `report`.
pub async fn compare(
    ours: &Path,
    go: Option<&Path>,
    link_counts: &[usize],
    cycles: usize,
    report: &mut Report,
) -> Result<()> {
    let host = HostDevicePlugins::claim()?;
    let kubelet = TestKubelet::start(host.dir())
        .await
        .map_err(|e| anyhow!("{e}"))?;
    // The Go plugin's grpc-go sends the socket path as `:authority`, which
    // the test kubelet (tonic) refuses: `kubelet.sock` relays Register
    // whatever the authority, for both plugins alike.
    let sock = host.dir().join("kubelet.sock");
    let upstream = host.dir().join(".test-kubelet.sock");
    std::fs::rename(&sock, &upstream)?;
    let _relay = LenientUnary::serve(&sock, &upstream, &[REGISTER])?;
    let kubelet_dir = host
        .dir()
        .parent()
        .context("the device-plugins dir has a parent")?
        .to_string_lossy()
        .into_owned();
    let logs = tempfile::tempdir()?;
    let our_args = [
        "--kubelet-dir",
        kubelet_dir.as_str(),
        "--metrics-addr",
        "off",
    ];
    // The daemon's default level, as it runs in the DaemonSet.
    let our_env = [("DP_MACVTAP_CONF", CONF), ("RUST_LOG", "info")];
    let go_env = [("DP_MACVTAP_CONF", CONF)];
    // As the Go project's DaemonSet runs it.
    let go_args = ["-v", "3", "-logtostderr"];
    report.section(
        &format!("Link churn: {cycles} veth add/up/del cycles beside one watched NIC"),
        &format!(
            "Each device plugin serves one resource on NIC `lower0` in a fresh network namespace \
             that also holds the given number of other links (veth pairs), registered with a test \
             kubelet in `/var/lib/kubelet/device-plugins` (through a relay of Register, as the Go \
             plugin's client sends an `:authority` the test kubelet refuses). Ours runs at its \
             DaemonSet log level (info), the Go plugin with its DaemonSet's `-v 3 -logtostderr`. Once it serves and its CPU time has \
             settled, {cycles} cycles of `ip link add c0 type veth peer name c1`, `ip link set c0 \
             up`, `ip link del c0` run (one `ip` process each, as pods start and stop one by one); \
             the CPU time is the plugin's utime+stime from `/proc/<pid>/stat` (clock ticks, \
             {:.0} ms) from before the churn until it settles again (two equal reads {} ms apart); idle is \
             its CPU time over the same wall time right after, with no churn. \
             Per event is per link operation ({OPS_PER_CYCLE} per cycle). Ours and the Go \
             project's (kubevirt/macvtap-cni v0.13.1) run in turn at each link count.",
            1000.0 / ticks_per_second(),
            SETTLE_STEP.as_millis()
        ),
    );
    let mut table = String::from(
        "| other links | ours CPU s | ours µs/event | ours idle s | Go CPU s | Go µs/event | Go idle s | ours/Go | wall s (churn, settle) |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let events = (cycles * OPS_PER_CYCLE) as f64;
    for &n in link_counts {
        let o = run_one(ours, &our_args, &our_env, &kubelet, n, cycles, logs.path()).await?;
        let g = match go {
            Some(go) => {
                Some(run_one(go, &go_args, &go_env, &kubelet, n, cycles, logs.path()).await?)
            }
            None => None,
        };
        let go_cols = match &g {
            Some(g) if g.cpu.is_zero() => format!(
                "{:.2} | {:.0} | {:.2} | n/a",
                0.0,
                0.0,
                g.idle.as_secs_f64()
            ),
            Some(g) => format!(
                "{:.2} | {:.0} | {:.2} | {:.2}",
                g.cpu.as_secs_f64(),
                g.cpu.as_secs_f64() * 1e6 / events,
                g.idle.as_secs_f64(),
                o.cpu.as_secs_f64() / g.cpu.as_secs_f64()
            ),
            None => "not run | not run | not run | n/a".to_string(),
        };
        let wall = g
            .as_ref()
            .map_or(o.churn_wall, |g| o.churn_wall.max(g.churn_wall));
        let line = format!(
            "| {n} | {:.2} | {:.0} | {:.2} | {go_cols} | {:.1} |\n",
            o.cpu.as_secs_f64(),
            o.cpu.as_secs_f64() * 1e6 / events,
            o.idle.as_secs_f64(),
            wall.as_secs_f64(),
        );
        print!("{line}");
        table.push_str(&line);
    }
    report.text(&table);
    report.text(&format!(
        "One clock tick is {:.0} ms, so each CPU figure is good to a tick. The daemon applies each \
         link event's own message and revisits only the resources whose NIC (or its master) it \
         touches; `device-plugin/tests/churn.rs` checks with `strace` that such a churn makes it \
         dump no links and read no sysfs file of an untouched resource.\n",
        1000.0 / ticks_per_second()
    ));
    Ok(())
}
