//! The daemon on a node whose other links churn (a veth added, set up and
//! deleted per pod start and stop): the link events cost what they change.
//! `strace` on the real binary counts what it does: no `RTM_GETLINK` dump
//! and no sysfs read of a resource whose NIC the churn does not touch, while
//! the watched NIC's health still reaches ListAndWatch. Needs root and
//! `strace` (hack/setup.sh installs it); without either the test fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{DEADLINE, Node};
use kubelet_proto::v1beta1::Device;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Instant;
use test_kubelet::ResourceView;

const DP: &str = "macvtap.network.kubevirt.io/dp";
const OTHER: &str = "macvtap.network.kubevirt.io/other";
/// Links on the node besides the NICs: a few hundred, as on a busy node.
const OTHER_LINKS: usize = 300;
/// Churn cycles at least (the churn goes on until the NIC flap is seen).
const MIN_CYCLES: usize = 20;

fn all(v: &ResourceView, health: &str) -> bool {
    v.connected && !v.devices.is_empty() && v.devices.iter().all(|d: &Device| d.health == health)
}

/// `strace` attached to every thread of `pid`, writing to `out`.
struct Strace {
    child: Child,
    out: tempfile::NamedTempFile,
}

impl Strace {
    /// Attaches and returns once every thread of `pid` is traced.
    fn attach(pid: u32) -> Self {
        let out = tempfile::NamedTempFile::new().unwrap();
        let mut child = Command::new("strace")
            .args(["-f", "-e", "trace=sendto,sendmsg,openat", "-s", "256", "-o"])
            .arg(out.path())
            .args(["-p", &pid.to_string()])
            .stderr(Stdio::piped())
            .spawn()
            .expect("strace runs (hack/setup.sh installs it)");
        // strace says "Process N attached with T threads" once it traces
        // every thread of N.
        let attached = format!("strace: Process {pid} attached");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        loop {
            let line = lines.next().expect("strace attaches").unwrap();
            if line.starts_with(&attached) {
                break;
            }
        }
        // Keep draining stderr so strace never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Self { child, out }
    }

    /// Detaches and returns the trace.
    fn finish(mut self) -> String {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGINT).unwrap();
        self.child.wait().unwrap();
        std::fs::read_to_string(self.out.path()).unwrap()
    }
}

/// Sets NIC `eth1` down or up and waits until ListAndWatch says so.
async fn flap(node: &Node, up: bool) {
    node.ns
        .ip(&["link", "set", "eth1", if up { "up" } else { "down" }])
        .unwrap();
    let want = if up { "Healthy" } else { "Unhealthy" };
    node.kubelet()
        .wait_resource(DP, DEADLINE, |v| all(v, want))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_of_other_links_makes_no_dump_and_leaves_other_resources_alone() {
    let mut node = Node::new("churn");
    node.ns.add_nic("eth2").unwrap();
    let mut batch = tempfile::NamedTempFile::new().unwrap();
    for i in 0..OTHER_LINKS / 2 {
        writeln!(batch, "link add o{i} type veth peer name q{i}").unwrap();
    }
    node.ns
        .ip(&["-batch", batch.path().to_str().unwrap()])
        .unwrap();
    node.start_kubelet().await;
    node.start_daemon(
        &[
            "--resource=name=dp,lowerDevice=eth1,capacity=3",
            "--resource=name=other,lowerDevice=eth2,capacity=3",
            // No reclaim round (which lists links) during the trace.
            "--reclaim-interval=1h",
        ],
        &[],
    );
    for r in [DP, OTHER] {
        node.kubelet()
            .wait_resource(r, DEADLINE, |v| all(v, "Healthy"))
            .await
            .unwrap();
    }
    let strace = Strace::attach(node.daemon().pid());

    // Churn in the node namespace until told to stop, at least MIN_CYCLES.
    let stop = Arc::new(AtomicBool::new(false));
    let (cycled_tx, cycled) = mpsc::channel();
    let ns_name = node.ns.name.clone();
    let churn = std::thread::spawn({
        let stop = stop.clone();
        move || {
            let mut n = 0;
            while n < MIN_CYCLES || !stop.load(Ordering::SeqCst) {
                for args in [
                    vec!["link", "add", "c0", "type", "veth", "peer", "name", "c1"],
                    vec!["link", "set", "c0", "up"],
                    vec!["link", "del", "c0"],
                ] {
                    let mut all = vec!["-n", ns_name.as_str()];
                    all.extend(args);
                    test_support::ip(&all).unwrap();
                }
                n += 1;
                let _ = cycled_tx.send(n);
            }
            n
        }
    });
    cycled.recv().unwrap();
    // The NIC's state still reaches ListAndWatch while the others churn.
    let t = Instant::now();
    flap(&node, false).await;
    println!(
        "MEASURE health propagation during churn (down): {:?}",
        t.elapsed()
    );
    flap(&node, true).await;
    stop.store(true, Ordering::SeqCst);
    let cycles = tokio::task::spawn_blocking(move || churn.join().unwrap())
        .await
        .unwrap();
    // Events arrive in order: once this flap is seen, the churn's were handled.
    flap(&node, false).await;
    flap(&node, true).await;
    let trace = strace.finish();

    let lines = |what: &[&[&str]]| {
        trace
            .lines()
            .filter(|l| what.iter().all(|any| any.iter().any(|w| l.contains(w))))
            .count()
    };
    // strace names the netlink type and flags only for a socket of its own
    // namespace; for the daemon's it prints the numbers (RTM_GETLINK is
    // 0x12, NLM_F_DUMP 0x300).
    let dumps = lines(&[
        &["nlmsg_type=RTM_GETLINK", "nlmsg_type=0x12 "],
        &["NLM_F_DUMP", "|0x300"],
    ]);
    let eth1_reads = lines(&[&["openat"], &["/eth1/device/numa_node"]]);
    let eth2_reads = lines(&[&["openat"], &["/eth2/device/numa_node"]]);
    println!(
        "{cycles} churn cycles among {OTHER_LINKS} other links: {dumps} link dumps, \
         {eth1_reads} sysfs reads for eth1, {eth2_reads} for eth2"
    );
    assert_eq!(dumps, 0, "a full link dump during the churn");
    assert_eq!(
        eth2_reads, 0,
        "resource other (eth2) revisited though nothing touched eth2"
    );
    // The probe sees what it looks for: each of the four flaps revisits dp.
    assert!(eth1_reads >= 4, "{eth1_reads} sysfs reads for eth1");
    node.kubelet()
        .wait_resource(OTHER, DEADLINE, |v| all(v, "Healthy"))
        .await
        .unwrap();
}
