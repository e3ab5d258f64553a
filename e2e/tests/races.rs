//! The CNI and the device plugin's Allocate, reclaim and heal acting on one
//! node at once, played in order on the fake kernel (`test_support::fake`),
//! without root: each run is one ordering of what the soak met (issue 37).
//!
//! A device's link was handed out, given back by DEL and left on the node
//! long enough to look leaked; then the kubelet allocates the device to a
//! new pod (Allocate reuses the link), the pod's ADD is killed after each
//! kernel call in turn (or not at all), and containerd recovers as
//! `cni/src/crash_tests.rs` describes (DEL with the same arguments, the
//! namespace removed, ADD in a new namespace). A reclaim round runs beside
//! it: it lists the node's links and asks PodResources at one point of that
//! sequence (its plan) and acts on the kernel at the same or a later point
//! (its work), the way its awaits let the runtime's processes run between
//! the two; every point is a kernel call of the runtime's steps or the
//! middle of one of its moves. Whatever the ordering, the pod's new sandbox
//! must get the link at the ifindex the kubelet handed out, and nothing may
//! be left on the node.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kubelet_proto::v1beta1::{AllocateRequest, ContainerAllocateRequest};
use macvtap_cni::settings::NodeSettings;
use macvtap_deviceplugin::config::ResourceConfig;
use macvtap_deviceplugin::core::host::{HostPaths, SharedHost};
use macvtap_deviceplugin::core::ledger::AllocationClock;
use macvtap_deviceplugin::core::ledger::Assignments;
use macvtap_deviceplugin::core::reclaim::{Plan, Reclaimer};
use macvtap_deviceplugin::kubelet::allocate;
use macvtap_link::{Kernel, Op, link_name_for_device};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use test_support::fake::{FakeKernel, HOST};

const DEVICE: &str = "lower0Mvp1";
const OLD_POD: &str = "/run/netns/old-pod";
const POD: &str = "/run/netns/pod-a";
const NEW_POD: &str = "/run/netns/pod-b";
const GRACE: Duration = Duration::from_secs(60);

/// Where in the runtime's steps something happens: right before its
/// `nth` call of `op`, amid its `nth` move, or after everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Point {
    Before(Op, usize),
    AmidMove(usize),
    End,
}

/// The node: the fake kernel, PodResources as the kubelet answers it, and
/// the device plugin's state.
struct Node {
    kernel: Arc<FakeKernel>,
    held: Arc<Mutex<HashSet<String>>>,
    clock: AllocationClock,
    assignments: Assignments,
    reclaimer: Arc<Mutex<Reclaimer>>,
    resources: Vec<ResourceConfig>,
    /// The ifindex the kubelet handed out, `/dev/tap<index>`.
    index: Mutex<u32>,
    settings: NodeSettings,
}

fn resources() -> Vec<ResourceConfig> {
    vec![ResourceConfig {
        capacity: 4,
        ..ResourceConfig::for_nic("lower0")
    }]
}

impl Node {
    /// A node whose device's link was handed out, used by a pod and given
    /// back by its DEL; the pod is gone, and the link has looked leaked for
    /// longer than the grace period.
    fn with_returned_link() -> Self {
        let kernel = Arc::new(FakeKernel::new());
        kernel.add_nic(HOST, "lower0");
        let clock = AllocationClock::default();
        let assignments = Assignments::default();
        let reclaimer = Reclaimer::new(
            kernel.clone(),
            PathBuf::from("/nonexistent"),
            GRACE,
            clock.clone(),
        )
        .with_healing(assignments.clone(), HostPaths::default());
        // No PodResources socket: ADD's ownership check warns and goes on.
        let vars = HashMap::new();
        let settings = NodeSettings {
            kubelet_dir: PathBuf::from("/nonexistent/kubelet"),
            ..NodeSettings::defaults(&vars)
        };
        let node = Node {
            kernel,
            held: Arc::default(),
            clock,
            assignments,
            reclaimer: Arc::new(Mutex::new(reclaimer)),
            resources: resources(),
            index: Mutex::new(0),
            settings,
        };
        *node.index.lock().unwrap() = node.allocate();
        node.kernel.add_netns(OLD_POD);
        node.held.lock().unwrap().insert(DEVICE.into());
        assert_eq!(node.cni("ADD", OLD_POD, "c0"), 0);
        assert_eq!(node.cni("DEL", OLD_POD, "c0"), 0);
        node.kernel.remove_netns(OLD_POD);
        node.held.lock().unwrap().clear();
        // Allocated and first seen leaked longer ago than the grace.
        let long_ago = Instant::now() - GRACE - Duration::from_secs(1);
        node.clock.allocated(&link_name(), long_ago);
        let plan = node.plan(long_ago);
        assert_eq!(plan, Plan::default());
        node
    }

    /// Allocate as the kubelet calls it; returns the ifindex of `/dev/tapN`.
    fn allocate(&self) -> u32 {
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![DEVICE.into()],
            }],
        };
        let host = SharedHost::new(&*self.kernel, HostPaths::default());
        let resp = allocate::serve(
            &host,
            &req,
            &self.resources[0],
            &self.clock,
            &self.assignments,
        )
        .unwrap();
        let path = &resp.container_responses[0].devices[0].host_path;
        path.strip_prefix("/dev/tap").unwrap().parse().unwrap()
    }

    /// A round's plan now: the node's links, then PodResources.
    fn plan(&self, now: Instant) -> Plan {
        plan_on(
            &self.kernel,
            &self.held,
            &self.reclaimer,
            &self.resources,
            now,
        )
    }

    /// Runs the CNI's `command` for the pod in `netns`; returns its exit code.
    fn cni(&self, command: &str, netns: &str, container: &str) -> i32 {
        let vars: HashMap<String, String> = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", container),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "net1"),
            ("CNI_PATH", "/usr/lib/cni"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let conf = format!(
            r#"{{"cniVersion":"1.0.0","name":"n","type":"macvtap","deviceID":"{DEVICE}"}}"#
        );
        macvtap_cni::run_on(&*self.kernel, &self.settings, &vars, conf.as_bytes()).exit_code
    }

    /// Makes another process run `act` at `point` (`End`: left to the
    /// caller, after the runtime's steps).
    fn at(&self, point: Point, act: impl FnOnce() + Send + 'static) {
        match point {
            Point::Before(op, nth) => self.kernel.before(op, nth, act),
            Point::AmidMove(nth) => self.kernel.amid_move(nth, act),
            Point::End => {}
        }
    }
}

fn link_name() -> String {
    link_name_for_device(DEVICE)
}

fn plan_on(
    kernel: &FakeKernel,
    held: &Mutex<HashSet<String>>,
    reclaimer: &Mutex<Reclaimer>,
    resources: &[ResourceConfig],
    now: Instant,
) -> Plan {
    let links = kernel.links(None).unwrap().list_links().unwrap();
    let allocated = held.lock().unwrap().clone();
    reclaimer
        .lock()
        .unwrap()
        .plan(&links, &allocated, resources, now)
}

/// How the pod's first ADD ends: killed right after its own `nth` call of
/// `op`, or not at all.
type Kill = Option<(Op, usize)>;

/// The runtime's steps for a new pod given the device: Allocate, the pod
/// in PodResources, ADD (killed at `kill`; then DEL, the namespace removed,
/// ADD in a new one), then what the kubelet checks: the pod's link where it
/// belongs. Returns the namespace the pod's link is in.
fn runtime(node: &Node, kill: Kill) -> &'static str {
    admit(node);
    let Some((op, nth)) = kill else {
        assert_eq!(node.cni("ADD", POD, "c1"), 0, "ADD");
        return POD;
    };
    node.kernel.crash_after(op, node.kernel.count(op) + nth);
    let died =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| node.cni("ADD", POD, "c1")));
    assert!(died.is_err(), "ADD ran past its kill point");
    node.kernel.restart();
    assert_eq!(node.cni("DEL", POD, "c1"), 0, "the runtime's DEL");
    node.kernel.remove_netns(POD);
    node.kernel.add_netns(NEW_POD);
    assert_eq!(node.cni("ADD", NEW_POD, "c2"), 0, "ADD in a new sandbox");
    NEW_POD
}

/// The kubelet admits the pod: Allocate (which reuses the link, unless a
/// round deleted it first), then the pod in PodResources and its sandbox's
/// namespace.
fn admit(node: &Node) {
    *node.index.lock().unwrap() = node.allocate();
    node.held.lock().unwrap().insert(DEVICE.into());
    node.kernel.add_netns(POD);
}

/// The points of the runtime's steps with `kill`, from a run without a
/// round: before each kernel call and amid each move.
fn points(kill: Kill) -> Vec<Point> {
    let node = Node::with_returned_link();
    let from = node.kernel.calls().len();
    runtime(&node, kill);
    let mut seen: HashMap<Op, usize> = HashMap::new();
    for c in &node.kernel.calls()[..from] {
        *seen.entry(c.op).or_insert(0) += 1;
    }
    let mut out = Vec::new();
    for c in &node.kernel.calls()[from..] {
        let n = seen.entry(c.op).or_insert(0);
        *n += 1;
        out.push(Point::Before(c.op, *n));
        if c.op == Op::MoveLink && c.failed.is_none() {
            out.push(Point::AmidMove(*n));
        }
    }
    out.push(Point::End);
    out
}

/// Every kill point of ADD, and none.
fn kills() -> Vec<Kill> {
    let node = Node::with_returned_link();
    admit(&node);
    let from = node.kernel.calls().len();
    assert_eq!(node.cni("ADD", POD, "c1"), 0, "ADD");
    let mut seen: HashMap<Op, usize> = HashMap::new();
    let mut out = vec![None];
    for c in &node.kernel.calls()[from..] {
        let n = seen.entry(c.op).or_insert(0);
        *n += 1;
        out.push(Some((c.op, *n)));
    }
    out
}

/// Plays one ordering: the round plans at `plan_at` and works at `work_at`
/// (the same point or a later one) while the runtime takes its steps with
/// `kill`; then checks the pod's link and the node.
fn play(kill: Kill, plan_at: Point, work_at: Point) -> Result<(), String> {
    let node = Node::with_returned_link();
    let planned: Arc<Mutex<Option<Plan>>> = Arc::default();
    let worked = Arc::new(Mutex::new(false));
    let round = {
        let (kernel, held, reclaimer) = (
            node.kernel.clone(),
            node.held.clone(),
            node.reclaimer.clone(),
        );
        let (planned, worked, resources) =
            (planned.clone(), worked.clone(), node.resources.clone());
        move |plan: bool, work: bool| {
            if plan {
                let p = plan_on(&kernel, &held, &reclaimer, &resources, Instant::now());
                *planned.lock().unwrap() = Some(p);
            }
            if work {
                let Some(p) = planned.lock().unwrap().take() else {
                    return;
                };
                let job = reclaimer.lock().unwrap().work();
                let done = job.carry_out(&p, &resources).unwrap();
                reclaimer.lock().unwrap().finish(&done);
                *worked.lock().unwrap() = true;
            }
        }
    };
    if plan_at == work_at {
        let r = round.clone();
        node.at(plan_at, move || r(true, true));
    } else {
        let r = round.clone();
        node.at(plan_at, move || r(true, false));
        let r = round.clone();
        node.at(work_at, move || r(false, true));
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime(&node, kill)));
    // A point the runtime never reached (a round changed its path): what
    // the round has not done yet, it does at the end.
    node.kernel.drop_hooks();
    if !*worked.lock().unwrap() {
        let never_planned = planned.lock().unwrap().is_none();
        round(never_planned, true);
    }
    let ns = outcome.map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "the runtime's step failed".into())
    })?;
    let index = *node.index.lock().unwrap();
    let link = node
        .kernel
        .link(ns, "net1")
        .ok_or_else(|| format!("net1 is not in the pod's namespace {ns}"))?;
    if link.index != index {
        return Err(format!(
            "net1 has ifindex {} but the kubelet handed out /dev/tap{index}",
            link.index
        ));
    }
    let dev = node
        .kernel
        .tap_device(
            &node.kernel.open_netns(std::path::Path::new(ns)).unwrap(),
            "net1",
        )
        .unwrap();
    if node.kernel.tap_node(index) != Some(dev) {
        return Err(format!("/dev/tap{index} is not the pod's link's"));
    }
    let host: Vec<String> = node
        .kernel
        .links_of(HOST)
        .into_iter()
        .map(|l| l.name)
        .collect();
    if host != ["lower0"] {
        return Err(format!("on the node: {host:?}"));
    }
    // The link was never lost (every DEL ran to its end): healing it would
    // have made a second link with its ifindex while it was in a pod.
    let made: Vec<String> = node
        .kernel
        .other_calls()
        .into_iter()
        .filter(|c| c.op == Op::AddMacvtap && c.failed.is_none())
        .map(|c| c.target)
        .collect();
    if !made.is_empty() {
        return Err(format!(
            "the device plugin made {made:?} for a link never lost"
        ));
    }
    Ok(())
}

/// Runs every ordering from `orderings` for every kill point; fails with
/// each ordering that broke.
fn every(orderings: impl Fn(&[Point]) -> Vec<(Point, Point)>) {
    let mut broke = Vec::new();
    let mut runs = 0;
    for kill in kills() {
        let points = points(kill);
        for (plan_at, work_at) in orderings(&points) {
            runs += 1;
            if let Err(e) = play(kill, plan_at, work_at) {
                broke.push(format!(
                    "ADD killed after {kill:?}, round planned {plan_at:?}, worked {work_at:?}: {e}"
                ));
            }
        }
    }
    assert!(runs > 100, "only {runs} orderings");
    assert!(
        broke.is_empty(),
        "{} of {runs} orderings broke:\n{}",
        broke.len(),
        broke.join("\n")
    );
}

/// A round that planned before the Allocate (the link looked leaked, no
/// pod held its device) acts at any later point.
#[test]
fn a_round_planned_before_allocate_reused_the_link_never_deletes_it() {
    every(|points| points.iter().map(|w| (points[0], *w)).collect());
}

/// A round that lists and asks at any point, amid a move included, acts
/// then, at the next point, amid each later move, or at the end: a link
/// moving between namespaces is on no list and has no tap node for that
/// moment, and must not be taken for lost.
#[test]
fn a_round_at_any_point_of_a_killed_add_and_its_recovery_loses_no_link() {
    every(|points| {
        let mut out = Vec::new();
        for (i, p) in points.iter().enumerate() {
            let later = points[i + 1..]
                .iter()
                .enumerate()
                .filter(|(j, w)| *j == 0 || matches!(w, Point::AmidMove(_) | Point::End));
            out.push((*p, *p));
            out.extend(later.map(|(_, w)| (*p, *w)));
        }
        out
    });
}
