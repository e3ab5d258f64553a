//! The soak: many pod lifecycles on one sandbox node while the kubelet
//! restarts, the NIC flaps, the device plugin restarts (SIGTERM or SIGKILL)
//! and CNI runs are killed at a netlink send chosen by the seed. Each pod is
//! what KubeVirt's virt-launcher pod is to us: the kubelet's Allocate, the
//! pod listed in PodResources, CNI ADD in a new sandbox namespace, later CNI
//! DEL and the namespace removed. After a killed ADD the runtime does what
//! containerd does when `RunPodSandbox` fails (`StopPodSandbox`: CNI DEL
//! with the same arguments, the namespace removed; then a new sandbox and
//! ADD), and a killed DEL is simply run again, as the kubelet retries
//! `StopPodSandbox`.
//!
//! After every step the soak checks that each live pod's link is in its
//! namespace at the ifindex of the `/dev/tapN` the kubelet handed out; at
//! the end, that no link and no tap node is left, and that the last
//! daemon's file descriptors and memory stayed flat. Every choice comes
//! from the seed, so a failing run is replayed by its seed.

use crate::node::{CniCall, FAST_RECLAIM, Node, WAIT, binary, run_cni_output, tap_nodes};
use crate::sandbox::TestNs;
use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use test_kubelet::PluginClient;

pub mod fds;
pub mod flat;
pub mod kill;
pub mod trace;

pub use flat::{Sample, check_flat};
use kill::Sends;
use trace::Trace;

/// The resource the soak's device plugin serves on `lower0`.
pub const RESOURCE: &str = "soak";
/// Its devices: more than the soak keeps live, so freed devices rest and
/// get reclaimed between uses.
pub const CAPACITY: usize = 8;
const CONF: &str = r#"[{"name":"soak","lowerDevice":"lower0","mode":"bridge","capacity":8}]"#;
const NAD: &str = r#"{"cniVersion":"1.0.0","name":"soaknet","type":"macvtap","mtu":1500}"#;
const IFNAME: &str = "net1";
/// The highest netlink send a killed CNI run dies at (a DEL or ADD makes
/// fewer; a run that makes fewer than its number ends normally).
const MAX_KILL_AT: u64 = 10;
/// How often (percent) a pod given a device whose link an earlier pod left
/// on the node waits for the reclaim to delete it before the Allocate; the
/// others take it at once (Allocate reuses it, unless the reclaim's grace
/// ends just then: timing, printed in the trace).
const RECLAIM_FIRST: u64 = 15;
/// How many of the failing device's steps a failure prints.
const TRACE_EVENTS: usize = 40;
/// How many daemon log lines a failure prints.
const LOG_LINES: usize = 80;

/// What a soak run does.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Every random choice comes from this.
    pub seed: u64,
    /// Pod lifecycles to complete.
    pub lifecycles: usize,
    /// Pods alive at the same time at most.
    pub max_live: usize,
}

/// What happened in a run.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// The run's seed.
    pub seed: u64,
    /// Pod lifecycles completed.
    pub lifecycles: usize,
    /// Kubelet restarts (every socket in its directory removed).
    pub kubelet_restarts: usize,
    /// NIC down/up cycles, each waited through Unhealthy and back.
    pub nic_flaps: usize,
    /// Device plugin stops with SIGTERM, each followed by a start.
    pub plugin_stops: usize,
    /// Device plugin kills with SIGKILL, each followed by a start.
    pub plugin_kills: usize,
    /// CNI ADDs killed part way (then DEL and ADD in a new sandbox).
    pub add_kills: usize,
    /// CNI DELs killed part way (then DEL again).
    pub del_kills: usize,
    /// The daemon's descriptors and memory, one sample per lifecycle.
    pub samples: Vec<Sample>,
    /// The last daemon's descriptors at its first sample.
    pub fds_first: Vec<fds::Fd>,
    /// The last daemon's descriptors at the end, before it stops.
    pub fds_last: Vec<fds::Fd>,
    /// Wall time of the run.
    pub took: Duration,
}

impl Report {
    /// One paragraph: the seed, the counts, the time and the last daemon's
    /// descriptors and memory at its first and last sample.
    pub fn summary(&self) -> String {
        let last = self.samples.last();
        let first = last.and_then(|l| self.samples.iter().find(|s| s.pid == l.pid));
        let fmt = |s: Option<&Sample>| {
            s.map(|s| format!("{} fds, {} KiB", s.fds, s.rss_kib))
                .unwrap_or_default()
        };
        format!(
            "seed {}: {} lifecycles in {:.1} s; {} kubelet restarts, {} NIC flaps, {} plugin \
             stops, {} plugin kills, {} killed ADDs, {} killed DELs; last daemon from {} to {}",
            self.seed,
            self.lifecycles,
            self.took.as_secs_f64(),
            self.kubelet_restarts,
            self.nic_flaps,
            self.plugin_stops,
            self.plugin_kills,
            self.add_kills,
            self.del_kills,
            fmt(first),
            fmt(last)
        )
    }
}

impl Report {
    /// The last daemon's descriptors at its first sample and at the end,
    /// one a line with its target, and how many of each kind came or went.
    pub fn descriptors(&self) -> String {
        let (first, last) = (fds::kinds(&self.fds_first), fds::kinds(&self.fds_last));
        let mut changed = Vec::new();
        for kind in first.keys().chain(last.keys()) {
            let (a, b) = (
                first.get(kind).copied().unwrap_or(0),
                last.get(kind).copied().unwrap_or(0),
            );
            if a != b
                && !changed
                    .iter()
                    .any(|c: &String| c.starts_with(&format!("{kind}:")))
            {
                changed.push(format!("{kind}: {a} -> {b}"));
            }
        }
        format!(
            "the last daemon's descriptors at its first sample:\n{}at the end:\n{}changed: {}",
            fds::render(&self.fds_first),
            fds::render(&self.fds_last),
            if changed.is_empty() {
                "none".to_string()
            } else {
                changed.join(", ")
            }
        )
    }
}

/// splitmix64: small, and the same sequence for a seed everywhere.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A live pod: its sandbox namespace and the device it holds.
struct Pod {
    name: String,
    device: String,
    ifindex: u32,
    ns: TestNs,
}

struct Soak {
    node: Node,
    client: PluginClient,
    cni: PathBuf,
    settings_file: PathBuf,
    rng: Rng,
    cfg: Settings,
    report: Report,
    live: Vec<Pod>,
    next_pod: usize,
    trace: Trace,
    /// Where each device's link last was on the node: its ifindex, as
    /// the soak last saw it.
    last_index: std::collections::HashMap<String, u32>,
}

/// How a CNI run ended: its output and, for a run meant to be killed,
/// what its trace says it sent.
struct CniRun {
    out: std::process::Output,
    sends: Option<Sends>,
}

impl CniRun {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).trim().to_string()
    }

    /// The plugin's log lines (its stderr), indented, for the trace.
    fn log(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr)
            .lines()
            .map(|l| format!("\n    cni: {l}"))
            .collect()
    }
}

fn full_resource() -> String {
    format!("{}/{RESOURCE}", macvtap_link::RESOURCE_PREFIX)
}

/// Runs the soak on a fresh sandbox node and returns what happened; fails
/// at the first broken promise, naming the seed and the step.
pub async fn run(cfg: Settings) -> Result<Report> {
    ensure!(cfg.max_live < CAPACITY, "max_live must leave free devices");
    let t = Instant::now();
    // The node holds the tap-node lock: the tap nodes are read once it is
    // held, so that another test's macvtap, made or removed while this run
    // waited for the lock, is not taken for the soak's.
    let mut node = Node::new()?;
    let taps_before = tap_nodes();
    node.start_kubelet().await?;
    node.start_pod_resources().await?;
    node.start_device_plugin(CONF, &FAST_RECLAIM)?;
    let client = node.plugin(RESOURCE, CAPACITY).await?;
    let settings_file = node.kubelet_dir.path().join("macvtap.settings.json");
    std::fs::write(
        &settings_file,
        json!({"kubeletDir": node.kubelet_dir.path(), "podResourcesCheck": "enforce"}).to_string(),
    )?;
    let mut soak = Soak {
        node,
        client,
        cni: binary("macvtap-cni", "macvtap")?,
        settings_file,
        rng: Rng(cfg.seed),
        report: Report {
            seed: cfg.seed,
            ..Report::default()
        },
        cfg,
        live: Vec::new(),
        next_pod: 0,
        trace: Trace::default(),
        last_index: Default::default(),
    };
    let mut step = 0usize;
    while soak.report.lifecycles < soak.cfg.lifecycles {
        step += 1;
        soak.trace.begin(step);
        let done = soak.step().await.and_then(|()| soak.check_live());
        if let Err(e) = done {
            return Err(e.context(soak.failure_report(step)));
        }
    }
    while let Some(pod) = soak.live.pop() {
        step += 1;
        soak.trace.begin(step);
        if let Err(e) = soak.stop_pod(pod) {
            return Err(e.context(soak.failure_report(step)));
        }
    }
    let (seed, lifecycles) = (soak.cfg.seed, soak.report.lifecycles);
    soak.end_checks(&taps_before).with_context(|| {
        format!(
            "soak seed {seed}, at the end after {lifecycles} lifecycles (replay: SOAK_SEED={seed})"
        )
    })?;
    soak.report.took = t.elapsed();
    Ok(soak.report)
}

impl Soak {
    /// What the end of a run checks: every link reclaimed and every tap
    /// node gone, nothing else left on the node, and the last daemon flat
    /// after its warm-up; then the daemon stops cleanly.
    fn end_checks(&mut self, taps_before: &[String]) -> Result<()> {
        self.node.wait_for_reclaim()?;
        let mut taps_now = Vec::new();
        wait_until("every tap node of the soak to go", || {
            taps_now = tap_nodes();
            Ok(taps_now == taps_before)
        })
        .with_context(|| format!("/dev tap nodes before: {taps_before:?}, now: {taps_now:?}"))?;
        let left: Vec<String> = self
            .node
            .ns
            .links()?
            .into_iter()
            .filter(|l| l != "lo" && l != "lower0")
            .collect();
        ensure!(left.is_empty(), "links left on the node: {left:?}");
        if let Some(pid) = self.node.device_plugin_pid() {
            self.report.fds_last = self.at_rest(pid)?;
        }
        check_flat(&self.report.samples).with_context(|| self.report.descriptors())?;
        self.node.stop_device_plugin()
    }

    async fn step(&mut self) -> Result<()> {
        let first_half = self.report.lifecycles < self.cfg.lifecycles / 2;
        match self.rng.below(100) {
            0..=2 => self.restart_kubelet().await,
            3..=5 => self.flap_nic().await,
            // Plugin restarts only in the first half: the second measures
            // one daemon's descriptors and memory.
            6..=8 if first_half => self.restart_plugin().await,
            _ => {
                let start = self.live.len() < self.cfg.max_live
                    && (self.live.is_empty() || self.rng.chance(55));
                if start {
                    self.start_pod().await
                } else {
                    let i = self.rng.below(self.live.len() as u64) as usize;
                    let pod = self.live.swap_remove(i);
                    self.stop_pod(pod)
                }
            }
        }
    }

    async fn start_pod(&mut self) -> Result<()> {
        let free: Vec<String> = (0..CAPACITY as u32)
            .map(|i| macvtap_link::device_id(RESOURCE, i))
            .filter(|d| !self.live.iter().any(|p| &p.device == d))
            .collect();
        let device = free[self.rng.below(free.len() as u64) as usize].clone();
        let link = macvtap_link::link_name_for_device(&device);
        // Drawn whatever the node holds, so that the seed's later choices
        // never depend on timing.
        let reclaim_first = self.rng.chance(RECLAIM_FIRST);
        if reclaim_first && self.node.ns.link(&link)?.is_some() {
            self.trace.note(
                Some(&device),
                "its link from an earlier pod is on the node: waiting for the reclaim to delete it (the seed's choice)",
            );
            wait_until("the reclaim of the device's link", || {
                Ok(self.node.ns.link(&link)?.is_none())
            })?;
        }
        let before = self.node.ns.link(&link)?.map(|l| l.index);
        let alloc = Node::allocate(&mut self.client, &device).await?;
        let ifindex = alloc.ifindex()?;
        self.last_index.insert(device.clone(), ifindex);
        // Whether the link was still on the node is timing (the reclaim's
        // grace), not the seed: say what it was.
        let met = match before {
            Some(i) if i == ifindex => format!("reused the link on the node at /dev/tap{i}"),
            Some(i) => {
                format!("the node had the link at ifindex {i}, Allocate answered /dev/tap{ifindex}")
            }
            None => format!("a new link at /dev/tap{ifindex}"),
        };
        self.next_pod += 1;
        let name = format!("virt-launcher-soak-{}", self.next_pod);
        self.trace
            .note(Some(&device), format!("Allocate for {name}: {met}"));
        self.node
            .pod_resources
            .as_ref()
            .context("PodResources not started")?
            .add_pod("default", &name, &[(&full_resource(), &[&device])]);
        let mut ns = TestNs::new("pod")?;
        let kill_at = self.rng.chance(25).then(|| 1 + self.rng.below(MAX_KILL_AT));
        let run = self.cni("ADD", &name, &device, &ns, kill_at)?;
        let killed = self.judge("ADD", &name, &device, &ns, kill_at, &run)?;
        if killed {
            self.report.add_kills += 1;
            // containerd's RunPodSandbox failure path: DEL with the same
            // arguments, the sandbox gone, then a new sandbox and ADD.
            self.cni_ok("DEL", &name, &device, &ns)
                .context("the runtime's DEL after a killed ADD")?;
            ns = TestNs::new("pod")?;
            self.cni_ok("ADD", &name, &device, &ns)
                .context("ADD in a new sandbox after a killed ADD")?;
        }
        self.live.push(Pod {
            name,
            device,
            ifindex,
            ns,
        });
        Ok(())
    }

    /// Says how a run meant to be killed at `kill_at` (or not) ended, and
    /// whether it was killed: a failure that was no kill is an error.
    fn judge(
        &mut self,
        command: &str,
        pod: &str,
        device: &str,
        ns: &TestNs,
        kill_at: Option<u64>,
        run: &CniRun,
    ) -> Result<bool> {
        let how = match (&run.sends, run.out.status.success()) {
            (Some(s), _) => format!("{s}"),
            (None, true) => "succeeded".to_string(),
            (None, false) => "failed".to_string(),
        };
        self.trace.note(
            Some(device),
            format!(
                "{command} for {pod} in {}{}: {how}{}",
                ns.name,
                kill_at
                    .map(|k| format!(", to be killed at netlink send {k}"))
                    .unwrap_or_default(),
                run.log()
            ),
        );
        if run.out.status.success() {
            return Ok(false);
        }
        ensure!(
            run.sends.as_ref().is_some_and(|s| s.killed),
            "{command} of {device} for {pod} failed ({how}): {}",
            run.stdout()
        );
        Ok(true)
    }

    fn stop_pod(&mut self, pod: Pod) -> Result<()> {
        let kill_at = self.rng.chance(20).then(|| 1 + self.rng.below(MAX_KILL_AT));
        let run = self.cni("DEL", &pod.name, &pod.device, &pod.ns, kill_at)?;
        if self.judge("DEL", &pod.name, &pod.device, &pod.ns, kill_at, &run)? {
            self.report.del_kills += 1;
            self.cni_ok("DEL", &pod.name, &pod.device, &pod.ns)
                .context("DEL again after a killed DEL")?;
        }
        self.node
            .returned_link(&pod.device, pod.ifindex)
            .with_context(|| format!("after DEL of {} for {}", pod.device, pod.name))?;
        drop(pod.ns);
        self.node
            .pod_resources
            .as_ref()
            .context("PodResources not started")?
            .remove_pod("default", &pod.name);
        self.trace.note(
            Some(&pod.device),
            format!("{} gone from PodResources", pod.name),
        );
        self.report.lifecycles += 1;
        self.sample()
    }

    fn cni(
        &self,
        command: &str,
        pod: &str,
        device: &str,
        ns: &TestNs,
        kill_at: Option<u64>,
    ) -> Result<CniRun> {
        let mut conf: Value = serde_json::from_str(NAD)?;
        conf["deviceID"] = Value::from(device);
        let args = format!(
            "IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};\
             K8S_POD_INFRA_CONTAINER_ID=sandbox-{}",
            ns.name
        );
        let trace_file = tempfile::NamedTempFile::new()?;
        let trace_path = trace_file.path().to_string_lossy().into_owned();
        // Killed on entry to its k-th netlink send: the sends before it
        // took effect, nothing after them runs.
        let wrapper = kill_at
            .map(|k| kill::strace_args(k, &trace_path))
            .unwrap_or_default();
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        let ns_path = ns.path();
        let conf = conf.to_string();
        let call = CniCall {
            cni: &self.cni,
            node_ns: &self.node.ns.name,
            command,
            netns: &ns_path,
            ifname: IFNAME,
            args: &args,
            conf: &conf,
            settings: Some(&self.settings_file),
        };
        let out = tokio::task::block_in_place(|| run_cni_output(&call, &wrapper))?;
        let sends = match kill_at {
            Some(_) => Some(Sends::parse(&std::fs::read_to_string(trace_file.path())?)),
            None => None,
        };
        Ok(CniRun { out, sends })
    }

    fn cni_ok(&mut self, command: &str, pod: &str, device: &str, ns: &TestNs) -> Result<()> {
        let run = self.cni(command, pod, device, ns, None)?;
        self.judge(command, pod, device, ns, None, &run)?;
        Ok(())
    }

    /// What a failure at `step` prints: the seed and the step, the steps
    /// about the device it concerns, and the daemon log cut to that device.
    /// The daemon is stopped first, so its log holds whatever it did up to
    /// the failure (a line is written after the call it reports).
    fn failure_report(&mut self, step: usize) -> String {
        let stopped = match self.node.stop_device_plugin() {
            Ok(()) => String::new(),
            Err(e) => format!(" (stopping the daemon: {e:#})"),
        };
        let device = self.trace.current_device();
        let log = self.node.daemon_log();
        let log = match device {
            Some(d) => trace::log_about(
                &log,
                d,
                &macvtap_link::link_name_for_device(d),
                self.last_index.get(d).copied(),
                LOG_LINES,
            ),
            None => {
                let lines: Vec<&str> = log.lines().collect();
                lines[lines.len().saturating_sub(LOG_LINES)..].join("\n")
            }
        };
        format!(
            "soak seed {}, step {step}, after {} lifecycles (replay: SOAK_SEED={}){}; its steps:\n{}\n\
             daemon log{}{stopped}:\n{log}",
            self.cfg.seed,
            self.report.lifecycles,
            self.cfg.seed,
            device.map(|d| format!(", about {d}")).unwrap_or_default(),
            self.trace.about(device, TRACE_EVENTS),
            device
                .map(|d| format!(" (the lines about {d}, its link, its tap node, and warnings)"))
                .unwrap_or_default()
        )
    }

    /// Every live pod's link is in its namespace, at the ifindex of the
    /// `/dev/tapN` the kubelet handed out.
    fn check_live(&self) -> Result<()> {
        for p in &self.live {
            let link =
                p.ns.link(IFNAME)?
                    .with_context(|| format!("pod {} lost its link ({})", p.name, p.device))?;
            ensure!(
                link.index == p.ifindex,
                "pod {}'s link has ifindex {} but the kubelet handed out /dev/tap{}",
                p.name,
                link.index,
                p.ifindex
            );
        }
        Ok(())
    }

    async fn restart_kubelet(&mut self) -> Result<()> {
        let k = self.node.kubelet.take().context("kubelet not started")?;
        self.node.kubelet = Some(k.restart().await?);
        self.trace.note(None, "kubelet restarted");
        self.client = self.node.plugin(RESOURCE, CAPACITY).await?;
        self.report.kubelet_restarts += 1;
        Ok(())
    }

    async fn flap_nic(&mut self) -> Result<()> {
        let kubelet = self.node.kubelet.as_ref().context("kubelet not started")?;
        let full = full_resource();
        self.trace.note(None, "NIC down, then up");
        self.node.ns.ip(&["link", "set", "lower0", "down"])?;
        kubelet
            .wait_resource(&full, WAIT, |v| {
                v.devices.len() == CAPACITY && v.devices.iter().all(|d| d.health == "Unhealthy")
            })
            .await
            .context("the devices did not turn Unhealthy with the NIC down")?;
        self.node.ns.ip(&["link", "set", "lower0", "up"])?;
        kubelet
            .wait_resource(&full, WAIT, |v| {
                v.devices.len() == CAPACITY && v.devices.iter().all(|d| d.health == "Healthy")
            })
            .await
            .context("the devices did not turn Healthy with the NIC up")?;
        self.report.nic_flaps += 1;
        Ok(())
    }

    async fn restart_plugin(&mut self) -> Result<()> {
        let full = full_resource();
        let seen = self
            .node
            .kubelet
            .as_ref()
            .context("kubelet not started")?
            .registration_count(&full);
        let kill = self.rng.chance(50);
        self.trace.note(
            None,
            if kill {
                "device plugin killed (SIGKILL) and started"
            } else {
                "device plugin stopped (SIGTERM) and started"
            },
        );
        if kill {
            self.node.kill_device_plugin()?;
            self.report.plugin_kills += 1;
        } else {
            self.node.stop_device_plugin()?;
            self.report.plugin_stops += 1;
        }
        self.node.start_device_plugin(CONF, &FAST_RECLAIM)?;
        self.node
            .kubelet
            .as_ref()
            .context("kubelet not started")?
            .wait_for_registration(&full, seen, WAIT)
            .await?;
        self.client = self.node.plugin(RESOURCE, CAPACITY).await?;
        Ok(())
    }

    /// The daemon's descriptors once no more are open than at its last
    /// samples (the median of the last window: a reclaim round in flight
    /// holds a socket or two for a moment); the last listing if they never
    /// are within [`WAIT`].
    fn at_rest(&self, pid: u32) -> Result<Vec<fds::Fd>> {
        let mut level: Vec<usize> = self
            .report
            .samples
            .iter()
            .rev()
            .take_while(|s| s.pid == pid)
            .take(flat::WINDOW)
            .map(|s| s.fds)
            .collect();
        level.sort_unstable();
        let level = level.get(level.len() / 2).copied().unwrap_or(usize::MAX);
        let mut listed = fds::list(pid)?;
        let deadline = Instant::now() + WAIT;
        while listed.len() > level && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            listed = fds::list(pid)?;
        }
        Ok(listed)
    }

    fn sample(&mut self) -> Result<()> {
        let pid = self
            .node
            .device_plugin_pid()
            .context("the device plugin is not running")?;
        if self.report.samples.last().is_none_or(|s| s.pid != pid) {
            self.report.fds_first = fds::list(pid)?;
        }
        self.report
            .samples
            .push(flat::sample(pid, self.report.lifecycles)?);
        Ok(())
    }
}

/// Polls `cond` until it holds, failing after [`WAIT`] with `what`.
fn wait_until(what: &str, mut cond: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        if cond()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("waited {WAIT:?} for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_choices() {
        let a: Vec<u64> = {
            let mut r = Rng(7);
            (0..8).map(|_| r.below(100)).collect()
        };
        let mut r = Rng(7);
        let b: Vec<u64> = (0..8).map(|_| r.below(100)).collect();
        assert_eq!(a, b);
        let mut r = Rng(8);
        let c: Vec<u64> = (0..8).map(|_| r.below(100)).collect();
        assert_ne!(a, c);
    }
}
