//! The daemon killed (SIGKILL, the real binary) in the middle of its work,
//! then started again as the DaemonSet restarts its pod: during an Allocate
//! after the link is made and before the answer, during a reclaim round,
//! during a heal, and after it handed out devices. Each kill lands at a
//! chosen point without any hook in the daemon: strace's fault injection
//! (`inject=openat:signal=SIGKILL`, path-filtered with `-P`) at the first
//! system call that only happens at that point, or the test PodResources
//! server holding the round's `List`. Needs root and strace; without them
//! every test here fails with "NOT RUN" or strace's error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{DEADLINE, Node, TestNs, daemon_bin, wait_log};
use macvtap_deviceplugin::core::ledger::record_file;
use macvtap_link::tapdev::{open_tap_node, tap_dev_in_netns};
use macvtap_link::{Link, Netns, link_name_for_device};
use nix::sys::signal::Signal;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};
use test_kubelet::{Daemon, ResourceView, TestPodResources};

const DP: &str = "macvtap.network.kubevirt.io/dp";

/// The kubelet is connected to the resource and counts `n` healthy devices.
fn serving(v: &ResourceView, n: usize) -> bool {
    v.connected && v.devices.len() == n && v.allocatable() == n
}

/// The daemon's flags: `dp` (4 devices) on `eth1`, with a reclaim interval
/// and grace.
fn flags(interval: &str, grace: &str) -> Vec<String> {
    vec![
        "--resource=name=dp,lowerDevice=eth1,capacity=4".into(),
        format!("--reclaim-interval={interval}"),
        format!("--reclaim-grace={grace}"),
    ]
}

/// A node with a kubelet and a PodResources server listing `held` of `dp`;
/// no daemon yet.
async fn node(tag: &str, held: &[&str]) -> (Node, TestPodResources) {
    let mut node = Node::new(tag);
    node.start_kubelet().await;
    let pr = TestPodResources::start(&node.dir.path().join("pod-resources/kubelet.sock"))
        .await
        .unwrap();
    pr.set_allocated(DP, held);
    (node, pr)
}

/// The full argument list: `--kubelet-dir`, metrics off, then `flags`.
fn all_args(node: &Node, flags: &[String]) -> Vec<String> {
    let mut all = vec![
        "--kubelet-dir".to_string(),
        node.dir.path().to_str().unwrap().to_string(),
        "--metrics-addr".into(),
        "off".into(),
    ];
    all.extend_from_slice(flags);
    all
}

/// Starts the daemon (under strace with `strace` when given) and waits
/// until the kubelet has one more registration of `dp` and counts its 4
/// devices healthy.
async fn start(node: &mut Node, flags: &[String], strace: Option<&[&str]>) {
    let seen = node.kubelet().registration_count(DP);
    let args = all_args(node, flags);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let log_dir = node.dir.path().to_path_buf();
    let d = match strace {
        None => Daemon::start(daemon_bin(), &node.ns, &log_dir, &args, &[]),
        Some(s) => Daemon::start_traced(s, daemon_bin(), &node.ns, &log_dir, &args, &[]),
    }
    .unwrap();
    node.daemon = Some(d);
    node.kubelet()
        .wait_for_registration(DP, seen, DEADLINE)
        .await
        .unwrap();
    node.kubelet()
        .wait_resource(DP, DEADLINE, |v| serving(v, 4))
        .await
        .unwrap();
}

/// Waits for the daemon (or the strace running it) to die of SIGKILL.
fn wait_killed(node: &mut Node) {
    let status = node.daemon().wait_exit(DEADLINE).unwrap();
    assert_eq!(
        status.signal(),
        Some(Signal::SIGKILL as i32),
        "the daemon was to die of SIGKILL: {status:?}\n{}",
        node.daemon().log()
    );
}

/// strace arguments that kill the daemon at its first `openat` or `mkdir`
/// of any of `paths`.
fn kill_at_open(paths: &[String]) -> Vec<String> {
    let found = std::process::Command::new("strace")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "NOT RUN: strace is missing (hack/setup.sh installs it); these tests kill the daemon with it"
    );
    let mut a: Vec<String> = vec!["-e".into(), "trace=openat,mkdir".into()];
    for p in paths {
        a.extend(["-P".to_string(), p.clone()]);
    }
    a.extend([
        "-e".to_string(),
        "inject=openat,mkdir:signal=SIGKILL:when=1".to_string(),
    ]);
    a
}

/// Polls `f` until it gives a value, failing with `what` after the deadline.
async fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "{what} within {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Moves device `id`'s link into a new pod namespace (as CNI ADD does) and
/// destroys the namespace without DEL; returns once its tap node is gone
/// (or the link is already back on the node).
async fn lose_link(node: &Node, id: &str, tag: &str) {
    let name = link_name_for_device(id);
    let index = node.ns.link(&name).unwrap().unwrap().index;
    let tap = format!("/dev/tap{index}");
    let pod = TestNs::new(tag).unwrap();
    node.ns
        .ip(&["link", "set", &name, "netns", &pod.name])
        .unwrap();
    drop(pod);
    wait_for(&format!("{tap} gone with its pod namespace"), || {
        (!Path::new(&tap).exists() || node.ns.link(&name).unwrap().is_some()).then_some(())
    })
    .await;
}

/// The link of device `id` on the node, when there is one.
fn link_of(node: &Node, id: &str) -> Option<Link> {
    node.ns.link(&link_name_for_device(id)).unwrap()
}

/// `host_path` is the char device of device `id`'s macvtap on the node.
fn assert_valid_tap(node: &Node, id: &str, host_path: &str) {
    let name = link_name_for_device(id);
    let link = link_of(node, id).expect("the device's macvtap is on the node");
    assert_eq!(host_path, format!("/dev/tap{}", link.index));
    let dev = tap_dev_in_netns(&Netns::open(node.ns.path()).unwrap(), &name).unwrap();
    open_tap_node(Path::new(host_path), dev, Duration::ZERO).unwrap();
}

/// The tap node path Allocate answered for its one device.
fn tap_of(resp: &kubelet_proto::v1beta1::AllocateResponse) -> String {
    resp.container_responses[0].devices[0].host_path.clone()
}

/// Killed after the macvtap is made and before the answer: the kubelet gets no answer
/// (it does not retry; the pod that replaces the refused one asks again),
/// and the restarted daemon answers that later Allocate of the same device
/// with the left-over link and a valid `/dev/tapN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_the_link_and_the_answer_a_later_allocate_works() {
    let (mut node, _pr) = node("crasha", &[]).await;
    let name = link_name_for_device("dpMvp1");
    // Its sysfs read follows the link's creation; the record's write (the
    // journal's `openat` through the record directory's descriptor, which
    // strace's -P matches by that descriptor's path; the directory itself
    // is made and opened relative to the device-plugins directory's) comes
    // after the link too, and still before the answer.
    let record_dir = record_file::path_in(&node.plugin_dir())
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let strace = kill_at_open(&[format!("/sys/class/net/{name}/ifindex"), record_dir]);
    let strace: Vec<&str> = strace.iter().map(String::as_str).collect();
    start(&mut node, &flags("1h", "1h"), Some(&strace)).await;

    let refused = node.kubelet().allocate(DP, &["dpMvp1"]).await;
    assert!(
        refused.is_err(),
        "the kill was to land before the answer: {refused:?}"
    );
    wait_killed(&mut node);
    let left = link_of(&node, "dpMvp1").expect("the link was made before the kill");

    start(&mut node, &flags("1h", "1h"), None).await;
    let resp = node.kubelet().allocate(DP, &["dpMvp1"]).await.unwrap();
    assert_eq!(
        tap_of(&resp),
        format!("/dev/tap{}", left.index),
        "the left-over link is reused"
    );
    assert_valid_tap(&node, "dpMvp1", &tap_of(&resp));
}

/// Killed during a reclaim round (its links listed, its PodResources `List`
/// held by the test) that would delete an unheld link at once: after the
/// restart, the unheld link is reclaimed after the grace, the held one is
/// kept with its ifindex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_during_a_reclaim_round_the_next_daemon_reclaims_only_the_unheld_link() {
    let (mut node, pr) = node("crashb", &["dpMvp0"]).await;
    // An interval of an hour: rounds run at start and when a tap node goes.
    start(&mut node, &flags("1h", "0s"), None).await;
    wait_log(&mut node, "the start's reclaim round", |l| {
        l.contains("reclaim round done")
    })
    .await;
    let held = node.kubelet().allocate(DP, &["dpMvp0"]).await.unwrap();
    node.kubelet().allocate(DP, &["dpMvp1"]).await.unwrap();
    node.kubelet().allocate(DP, &["dpMvp2"]).await.unwrap();
    // Hold the next List; a tap node deleted starts a round, which lists
    // the links (dpMvp1's, unheld, due at once) and asks.
    pr.hang(true);
    let before = pr.held();
    node.ns
        .ip(&["link", "del", &link_name_for_device("dpMvp2")])
        .unwrap();
    wait_for("a round held in its List", || {
        (pr.held() > before).then_some(())
    })
    .await;
    node.daemon().signal(Signal::SIGKILL).unwrap();
    wait_killed(&mut node);
    pr.hang(false);
    assert!(
        link_of(&node, "dpMvp1").is_some(),
        "killed before the round deleted anything"
    );

    start(&mut node, &flags("100ms", "1s"), None).await;
    wait_for("the unheld link reclaimed", || {
        link_of(&node, "dpMvp1").is_none().then_some(())
    })
    .await;
    assert_valid_tap(&node, "dpMvp0", &tap_of(&held));
    let log = wait_log(&mut node, "the deletion's log line", |l| {
        l.contains("deleted a leaked macvtap")
    })
    .await;
    let deleted: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("deleted a leaked macvtap"))
        .collect();
    assert_eq!(deleted.len(), 1, "{log}");
    assert!(
        deleted[0].contains(&link_name_for_device("dpMvp1")),
        "{log}"
    );
}

/// Killed during a heal (after the lost link is made again, at its tap
/// node's check): the re-made link stays with its ifindex, and the next
/// daemon keeps it and reclaims only the unheld link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_during_a_heal_the_held_link_stays_and_only_the_unheld_one_goes() {
    let (mut node, _pr) = node("crashc", &["dpMvp0"]).await;
    start(&mut node, &flags("1h", "1h"), None).await;
    let held = node.kubelet().allocate(DP, &["dpMvp0"]).await.unwrap();
    node.kubelet().allocate(DP, &["dpMvp1"]).await.unwrap();
    let tap = tap_of(&held);
    let index = link_of(&node, "dpMvp0").unwrap().index;
    node.daemon().signal(Signal::SIGKILL).unwrap();
    wait_killed(&mut node);

    // The next daemon heals from the record, and is killed at the re-made
    // link's first check.
    let name = link_name_for_device("dpMvp0");
    let strace = kill_at_open(&[format!("/sys/class/net/{name}/ifindex"), tap.clone()]);
    let strace: Vec<&str> = strace.iter().map(String::as_str).collect();
    start(&mut node, &flags("1h", "1h"), Some(&strace)).await;
    lose_link(&node, "dpMvp0", "crashcpod").await;
    wait_killed(&mut node);
    let remade = link_of(&node, "dpMvp0").expect("the heal re-made the link before the kill");
    assert_eq!(remade.index, index);

    start(&mut node, &flags("100ms", "1s"), None).await;
    wait_for("the unheld link reclaimed", || {
        link_of(&node, "dpMvp1").is_none().then_some(())
    })
    .await;
    assert_eq!(
        link_of(&node, "dpMvp0"),
        Some(remade),
        "the held link is kept"
    );
    assert_valid_tap(&node, "dpMvp0", &tap);
}

/// A daemon restarted (SIGKILL, then a new process) after it handed out a
/// device still heals that device's lost link at its ifindex, from the
/// record the previous process left, which a kubelet restart in between
/// (deleting what it deletes in the device-plugins directory) leaves alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_daemon_heals_a_lost_link_it_handed_out_before() {
    let (mut node, _pr) = node("crashd", &["dpMvp0"]).await;
    start(&mut node, &flags("1h", "1h"), None).await;
    let held = node.kubelet().allocate(DP, &["dpMvp0"]).await.unwrap();
    let tap = tap_of(&held);
    let index = link_of(&node, "dpMvp0").unwrap().index;
    node.daemon().signal(Signal::SIGKILL).unwrap();
    wait_killed(&mut node);
    let kubelet = node.kubelet.take().unwrap();
    node.kubelet = Some(kubelet.restart().await.unwrap());

    start(&mut node, &flags("1h", "1h"), None).await;
    lose_link(&node, "dpMvp0", "crashdpod").await;
    let healed = wait_for("the held device's link re-created", || {
        link_of(&node, "dpMvp0")
    })
    .await;
    assert_eq!(healed.index, index, "the same ifindex, so the same {tap}");
    assert_valid_tap(&node, "dpMvp0", &tap);
}
