//! The daemon against a test kubelet, each test on a fresh node namespace
//! with a veth pair as the NIC. Needs root; without it every test here fails
//! with "NOT RUN".

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{DEADLINE, Node, TestNs, describe_events, metrics_get, require_root, wait_log};
use kubelet_proto::v1beta1::Device;
use macvtap_link::tapdev::{open_tap_node, tap_dev_in_netns};
use macvtap_link::{Links, MacvtapMode, Netns, link_name_for_device};
use nix::sys::signal::Signal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use test_kubelet::{FakeApiServer, ResourceView, TestPodResources, summary, tools};

const DP: &str = "macvtap.network.kubevirt.io/dp";
const DP_SOCKET: &str = "macvtap.network.kubevirt.io_dp";

fn all_healthy(d: &[Device]) -> bool {
    !d.is_empty() && d.iter().all(|d| d.health == "Healthy")
}

fn all_unhealthy(d: &[Device]) -> bool {
    !d.is_empty() && d.iter().all(|d| d.health == "Unhealthy")
}

/// The kubelet is connected to the resource and counts `n` healthy devices.
fn serving(v: &ResourceView, n: usize) -> bool {
    v.connected && v.devices.len() == n && v.allocatable() == n
}

/// Waits for the kubelet's registration of `dp` after the `seen` before,
/// and then for it to serve `n` healthy devices.
async fn registered_and_serving(node: &Node, seen: usize, n: usize) {
    node.kubelet()
        .wait_for_registration(DP, seen, DEADLINE)
        .await
        .unwrap();
    node.kubelet()
        .wait_resource(DP, DEADLINE, |v| serving(v, n))
        .await
        .unwrap();
}

/// A node with the daemon serving resource `dp` on `eth1` with `extra` flags.
async fn node_with_dp(tag: &str, spec: &str, extra: &[&str]) -> Node {
    let mut node = Node::new(tag);
    node.start_kubelet().await;
    let resource = format!("--resource={spec}");
    let mut args = vec![resource.as_str()];
    args.extend_from_slice(extra);
    node.start_daemon(&args, &[]);
    node.kubelet()
        .wait_for_registration(DP, 0, DEADLINE)
        .await
        .unwrap();
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_with_the_kubelet_fields_and_advertises_capacity_devices() {
    let mut node = node_with_dp("reg", "name=dp,lowerDevice=eth1,capacity=5", &[]).await;
    let reg = &node.kubelet().registrations()[0];
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.endpoint, DP_SOCKET);
    assert_eq!(reg.resource_name, DP);
    assert!(node.plugin_dir().join(DP_SOCKET).exists());

    let mut client = node.kubelet().connect(DP_SOCKET).await.unwrap();
    let opts = client.options().await.unwrap();
    assert!(!opts.pre_start_required && !opts.get_preferred_allocation_available);
    // The kubelet opened ListAndWatch itself, once.
    let view = node
        .kubelet()
        .wait_resource(DP, DEADLINE, |v| serving(v, 5))
        .await
        .unwrap();
    assert_eq!(view.streams_opened, 1);
    let devices = view.devices;
    let ids: Vec<_> = devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["dpMvp0", "dpMvp1", "dpMvp2", "dpMvp3", "dpMvp4"]);
    assert!(all_healthy(&devices));
    // A veth has no NUMA node in sysfs, so no topology.
    assert!(devices.iter().all(|d| d.topology.is_none()));

    // Idle memory, for the record.
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!(
        "MEASURE idle VmRSS: {} KiB",
        node.daemon().rss_kib().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_creates_a_macvtap_on_the_lower_nic_with_a_matching_tap_node() {
    let mut node = Node::new("alloc");
    node.ns
        .ip(&["link", "set", "eth1", "txqueuelen", "1234"])
        .unwrap();
    node.start_kubelet().await;
    node.start_daemon(
        &["--resource=name=dp,lowerDevice=eth1,mode=vepa,capacity=4"],
        &[],
    );
    registered_and_serving(&node, 0, 4).await;
    let name = link_name_for_device("dpMvp3");
    let started = Instant::now();
    let resp = node.kubelet().allocate(DP, &["dpMvp3"]).await.unwrap();
    println!("MEASURE Allocate: {:?}", started.elapsed());
    assert_eq!(resp.container_responses.len(), 1);
    let spec = &resp.container_responses[0].devices[0];
    let link = node.ns.link(&name).unwrap().expect("macvtap exists");
    let lower = node.ns.link("eth1").unwrap().unwrap();
    assert!(link.is_macvtap());
    assert_eq!(link.macvtap_mode, Some(MacvtapMode::Vepa));
    assert_eq!(link.lower_index, Some(lower.index));
    assert_eq!(link.txqueuelen, 1234);
    let tap = format!("/dev/tap{}", link.index);
    assert_eq!(spec.host_path, tap);
    assert_eq!(spec.container_path, tap);
    assert_eq!(spec.permissions, "rw");
    let dev = tap_dev_in_netns(&Netns::open(node.ns.path()).unwrap(), &name).unwrap();
    open_tap_node(Path::new(&tap), dev, Duration::ZERO).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_id_allocated_twice_keeps_its_link_and_tap_node() {
    let node = node_with_dp(
        "again",
        "name=dp,lowerDevice=eth1,mode=vepa,capacity=4",
        &[],
    )
    .await;
    node.kubelet()
        .wait_resource(DP, DEADLINE, |v| serving(v, 4))
        .await
        .unwrap();
    let name = link_name_for_device("dpMvp2");
    // An init container and the app container of one pod: the kubelet
    // allocates the init container's device again for the app container.
    let (init, app) = node
        .kubelet()
        .allocate_init_and_app(DP, &["dpMvp2"])
        .await
        .unwrap();
    let first = &init.container_responses[0].devices[0];
    let second = &app.container_responses[0].devices[0];
    assert_eq!(
        first, second,
        "the app container gets the init container's node"
    );
    let link = node.ns.link(&name).unwrap().expect("macvtap exists");
    assert_eq!(first.host_path, format!("/dev/tap{}", link.index));
    let dev = tap_dev_in_netns(&Netns::open(node.ns.path()).unwrap(), &name).unwrap();
    open_tap_node(Path::new(&first.host_path), dev, Duration::ZERO).unwrap();
    let macvtaps = node
        .ns
        .handle()
        .unwrap()
        .list_links()
        .unwrap()
        .into_iter()
        .filter(|l| l.is_macvtap())
        .count();
    assert_eq!(macvtaps, 1, "a repeated Allocate leaves one link");

    // A link of the device's name that is wrong (here: bridge mode, not
    // vepa) is replaced.
    node.ns.ip(&["link", "del", &name]).unwrap();
    node.ns
        .ip(&[
            "link", "add", "link", "eth1", "name", &name, "type", "macvtap", "mode", "bridge",
        ])
        .unwrap();
    let wrong = node.ns.link(&name).unwrap().unwrap();
    let resp = node.kubelet().allocate(DP, &["dpMvp2"]).await.unwrap();
    let link = node.ns.link(&name).unwrap().expect("macvtap exists");
    assert_ne!(link.index, wrong.index, "the wrong link was replaced");
    assert_eq!(link.macvtap_mode, Some(MacvtapMode::Vepa));
    assert_eq!(
        resp.container_responses[0].devices[0].host_path,
        format!("/dev/tap{}", link.index)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_node_that_never_appears_names_a_dev_that_is_not_devtmpfs() {
    use macvtap_deviceplugin::config::ResourceConfig;
    use macvtap_deviceplugin::core::host::{Host, HostPaths};
    use macvtap_deviceplugin::core::link::create_device;
    use macvtap_link::Linux;
    let node = Node::new("tmpfsdev");
    // A private "/dev" that is a plain tmpfs, as a kind node's /dev is.
    let dev = tempfile::tempdir().unwrap();
    test_support::sh(&[
        "mount",
        "-t",
        "tmpfs",
        "tmpfs",
        dev.path().to_str().unwrap(),
    ])
    .unwrap();
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(dev.path());
    let host = Host::in_netns(&Linux, Netns::open(node.ns.path()).unwrap())
        .unwrap()
        .with_paths(HostPaths::with_dev(dev.path()));
    let lower = node.ns.link("eth1").unwrap().unwrap();
    let cfg = ResourceConfig::for_nic("eth1");
    let e = create_device(&host, &cfg, &lower, "eth1Mvp0").unwrap_err();
    let msg = e.to_string();
    assert_eq!(e.grpc_code(), tonic::Code::FailedPrecondition, "{msg}");
    for want in [
        "did not appear",
        "tmpfs",
        "not devtmpfs",
        "kubevirt/macvtap-cni#39",
    ] {
        assert!(msg.contains(want), "want {want:?} in: {msg}");
    }
    // The link made for the failed Allocate is gone again.
    assert!(
        node.ns
            .link(&link_name_for_device("eth1Mvp0"))
            .unwrap()
            .is_none()
    );
}

/// As the Go project's DaemonSets run the daemon: privileged, with no
/// host `/dev` (the container's own `/dev` is a tmpfs made at its start,
/// where no new tap node ever shows; here a tmpfs mounted on `/dev` in a
/// mount namespace of the daemon's own) and no `pod-resources` mounted.
/// Allocate answers the host's `/dev/tapN` of the new link, and each gap
/// is said once, naming the mount that would close it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_hosts_dev_or_pod_resources_allocate_answers_the_hosts_tap_node() {
    let mut node = Node::new("nodev");
    node.start_kubelet().await;
    node.start_daemon_under(
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t tmpfs tmpfs /dev && exec \"$@\"",
            "sh",
        ],
        &["--resource=name=dp,lowerDevice=eth1,capacity=2"],
        &[],
    );
    registered_and_serving(&node, 0, 2).await;
    let resp = node.kubelet().allocate(DP, &["dpMvp0"]).await.unwrap();
    let spec = &resp.container_responses[0].devices[0];
    let name = link_name_for_device("dpMvp0");
    let link = node.ns.link(&name).unwrap().expect("macvtap exists");
    assert_eq!(spec.host_path, format!("/dev/tap{}", link.index));
    assert_eq!(spec.container_path, spec.host_path);
    assert_eq!(spec.permissions, "rw");
    // The host's node (this test sees the host's /dev) is the link's.
    let dev = tap_dev_in_netns(&Netns::open(node.ns.path()).unwrap(), &name).unwrap();
    open_tap_node(Path::new(&spec.host_path), dev, DEADLINE).unwrap();
    // Each gap said once: the /dev at start, PodResources at the first
    // reclaim round (at start too).
    let log = wait_log(&mut node, "the PodResources warning", |l| {
        l.contains("leaked-link reclaim and heal are off")
    })
    .await;
    assert_eq!(
        log.matches("serving without the host's /dev").count(),
        1,
        "{log}"
    );
    assert!(
        log.contains("mount the host's /dev (hostPath /dev, read-only) at /dev"),
        "{log}"
    );
    let pod_resources = node.dir.path().join("pod-resources");
    assert!(
        log.contains(&format!(
            "mount the host's {} (hostPath)",
            pod_resources.display()
        )),
        "{log}"
    );
    assert!(!log.contains("did not appear"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_of_an_unknown_id_fails_and_leaves_no_link() {
    let node = node_with_dp("unknown", "name=dp,lowerDevice=eth1,capacity=2", &[]).await;
    let mut client = node.kubelet().connect(DP_SOCKET).await.unwrap();
    let macvtaps = || -> Vec<String> {
        let links = node.ns.handle().unwrap().list_links().unwrap();
        links
            .into_iter()
            .filter(|l| l.is_macvtap())
            .map(|l| l.name)
            .collect()
    };
    for ids in [vec!["dpMvp2"], vec!["otherMvp0"], vec!["dpMvp0", "dpMvp7"]] {
        let e = client.allocate(&ids).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{ids:?}: {e}");
        // Checked before eth1 goes below: deleting a NIC deletes its macvtaps.
        assert_eq!(macvtaps(), Vec::<String>::new(), "{ids:?} left a link");
    }
    // A failure after the checks (the NIC is gone) is a clear error, too.
    node.ns.ip(&["link", "del", "eth1"]).unwrap();
    let e = client.allocate(&["dpMvp0"]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    assert!(e.message().contains("eth1"), "{e}");
    let links = node.ns.handle().unwrap().list_links().unwrap();
    assert!(links.iter().all(|l| !l.is_macvtap()), "{links:?}");
}

/// A NIC that flaps (down, up, down, up, down) makes two Events on the
/// Node, posted by the real daemon to an API server (a plain-HTTP stand-in
/// in the node's namespace, named by `KUBECONFIG`): the first down and the
/// first up are created, every repeat patches its series count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_nic_posts_events_on_the_node() {
    require_root().unwrap();
    let mut node = Node::new("events");
    let mut api = FakeApiServer::start(&node.ns).unwrap();
    node.start_kubelet().await;
    // Every mount there: no Event but the NIC's.
    node.start_pod_resources().await;
    let kubeconfig = api.kubeconfig.to_str().unwrap().to_string();
    node.start_daemon(
        &["--resource=name=dp,lowerDevice=eth1,capacity=3"],
        &[("NODE_NAME", "node-flap"), ("KUBECONFIG", &kubeconfig)],
    );
    let k = node.kubelet();
    k.wait_resource(DP, DEADLINE, |v| serving(v, 3))
        .await
        .unwrap();
    for i in 0..5 {
        if i % 2 == 0 {
            node.ns.ip(&["link", "set", "eth1", "down"]).unwrap();
            k.wait_resource(DP, DEADLINE, |v| all_unhealthy(&v.devices))
                .await
                .unwrap();
        } else {
            node.ns.ip(&["link", "set", "eth1", "up"]).unwrap();
            k.wait_resource(DP, DEADLINE, |v| all_healthy(&v.devices))
                .await
                .unwrap();
        }
    }
    let events = "/apis/events.k8s.io/v1/namespaces/default/events";
    let mut got = Vec::new();
    for _ in 0..5 {
        let req = api.next().await.unwrap();
        assert!(req.invalid.is_empty(), "{:?}: {}", req.invalid, req.body);
        got.push(req);
    }
    let (down, up) = (&got[0], &got[1]);
    for (req, reason, note) in [
        (
            down,
            "MacvtapNICDown",
            "NIC eth1 is down or gone: 3 devices of macvtap.network.kubevirt.io/dp are Unhealthy",
        ),
        (
            up,
            "MacvtapNICUp",
            "NIC eth1 is up: 3 devices of macvtap.network.kubevirt.io/dp are Healthy again",
        ),
    ] {
        assert_eq!((req.method.as_str(), req.path.as_str()), ("POST", events));
        assert_eq!(req.body["reason"], reason);
        assert_eq!(req.body["note"], note);
        assert_eq!(req.body["regarding"]["kind"], "Node");
        assert_eq!(req.body["regarding"]["name"], "node-flap");
        assert_eq!(
            req.body["reportingInstance"],
            "macvtap-deviceplugin-node-flap"
        );
    }
    for (req, first, count) in [(&got[2], down, 2), (&got[3], up, 2), (&got[4], down, 3)] {
        let name = first.body["metadata"]["name"].as_str().unwrap();
        assert_eq!(req.method, "PATCH");
        assert_eq!(req.path, format!("{events}/{name}"));
        assert_eq!(req.content_type, "application/merge-patch+json");
        assert_eq!(req.body["series"]["count"], count);
    }
    println!(
        "{}",
        describe_events(&[got[4].body.clone(), got[3].body.clone()])
    );
}

/// Sets eth1 down or up and waits until the kubelet sees the devices follow.
async fn set_eth1(node: &Node, up: bool) {
    let k = node.kubelet();
    if up {
        node.ns.ip(&["link", "set", "eth1", "up"]).unwrap();
        k.wait_resource(DP, DEADLINE, |v| all_healthy(&v.devices))
            .await
            .unwrap();
    } else {
        node.ns.ip(&["link", "set", "eth1", "down"]).unwrap();
        k.wait_resource(DP, DEADLINE, |v| all_unhealthy(&v.devices))
            .await
            .unwrap();
    }
}

/// A node with an API server in its namespace and a daemon posting Events
/// about Node `node_name` to it, serving `dp` (eth1) with 3 devices.
async fn node_with_events(tag: &str, node_name: &str) -> (Node, FakeApiServer) {
    let mut node = Node::new(tag);
    let api = FakeApiServer::start(&node.ns).unwrap();
    node.start_kubelet().await;
    // Every mount there: no Event but the NIC's.
    node.start_pod_resources().await;
    let kubeconfig = api.kubeconfig.to_str().unwrap().to_string();
    node.start_daemon(
        &["--resource=name=dp,lowerDevice=eth1,capacity=3"],
        &[("NODE_NAME", node_name), ("KUBECONFIG", &kubeconfig)],
    );
    node.kubelet()
        .wait_resource(DP, DEADLINE, |v| serving(v, 3))
        .await
        .unwrap();
    (node, api)
}

const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

/// An Event deleted between two flaps (its TTL ran out, or a user deleted
/// it): the repeat's PATCH gets 404, as from the real API server, and the
/// daemon creates the Event anew, whose repeats it then patches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_deleted_between_flaps_is_created_anew() {
    require_root().unwrap();
    let (node, mut api) = node_with_events("events-gone", "node-gone").await;
    set_eth1(&node, false).await;
    let first_down = api.next().await.unwrap();
    assert_eq!(
        (first_down.method.as_str(), first_down.status),
        ("POST", 201)
    );
    assert_eq!(first_down.body["reason"], "MacvtapNICDown");
    set_eth1(&node, true).await;
    let up = api.next().await.unwrap();
    assert_eq!((up.method.as_str(), up.status), ("POST", 201));
    assert_eq!(up.body["reason"], "MacvtapNICUp");
    let gone = first_down.body["metadata"]["name"].as_str().unwrap();
    assert!(api.delete_event("default", gone));

    set_eth1(&node, false).await;
    let patch = api.next().await.unwrap();
    assert_eq!(patch.method, "PATCH");
    assert_eq!(patch.path, format!("{EVENTS}/{gone}"));
    assert_eq!(patch.status, 404);
    let again = api.next().await.unwrap();
    assert_eq!(
        (again.method.as_str(), again.path.as_str()),
        ("POST", EVENTS)
    );
    assert_eq!(again.status, 201, "{:?}", again.invalid);
    assert_eq!(again.body["reason"], "MacvtapNICDown");
    assert!(again.body.get("series").is_none(), "{}", again.body);
    let name = again.body["metadata"]["name"].as_str().unwrap();
    assert_ne!(name, gone);
    assert!(api.event("default", name).is_some());

    // Its repeat patches the new Event.
    set_eth1(&node, true).await;
    set_eth1(&node, false).await;
    let mut patched = Vec::new();
    for _ in 0..2 {
        let r = api.next().await.unwrap();
        assert_eq!((r.method.as_str(), r.status), ("PATCH", 200), "{r:?}");
        patched.push(r);
    }
    let last = patched
        .iter()
        .find(|r| r.body["reason"] == "MacvtapNICDown")
        .unwrap();
    assert_eq!(last.path, format!("{EVENTS}/{name}"));
    assert_eq!(api.event("default", name).unwrap()["series"]["count"], 2);
}

/// An API server failing (500) loses that Event, logged, and nothing else:
/// the next Events are created once it answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_error_loses_one_event_and_the_next_go_through() {
    require_root().unwrap();
    let (mut node, mut api) = node_with_events("events-500", "node-500").await;
    api.fail_with(Some(500));
    set_eth1(&node, false).await;
    let failed = api.next().await.unwrap();
    assert_eq!((failed.method.as_str(), failed.status), ("POST", 500));
    assert_eq!(failed.body["reason"], "MacvtapNICDown");
    wait_log(&mut node, "failed post", |l| {
        l.contains("posting a Kubernetes Event failed; the daemon carries on")
    })
    .await;
    api.fail_with(None);
    set_eth1(&node, true).await;
    set_eth1(&node, false).await;
    for reason in ["MacvtapNICUp", "MacvtapNICDown"] {
        let r = api.next().await.unwrap();
        // The lost Event was never stored, so its repeat is created.
        assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", EVENTS));
        assert_eq!(r.status, 201, "{:?}", r.invalid);
        assert_eq!(r.body["reason"], reason);
        let name = r.body["metadata"]["name"].as_str().unwrap();
        assert!(api.event("default", name).is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_follow_the_lower_nic_down_and_up() {
    let node = node_with_dp("health", "name=dp,lowerDevice=eth1,capacity=3", &[]).await;
    let k = node.kubelet();
    k.wait_resource(DP, DEADLINE, |v| serving(v, 3))
        .await
        .unwrap();

    let t = Instant::now();
    node.ns.ip(&["link", "set", "eth1", "down"]).unwrap();
    k.wait_resource(DP, DEADLINE, |v| all_unhealthy(&v.devices))
        .await
        .unwrap();
    println!("MEASURE health propagation (down): {:?}", t.elapsed());

    let t = Instant::now();
    node.ns.ip(&["link", "set", "eth1", "up"]).unwrap();
    k.wait_resource(DP, DEADLINE, |v| all_healthy(&v.devices))
        .await
        .unwrap();
    println!("MEASURE health propagation (up): {:?}", t.elapsed());

    // Vanishing and coming back works the same way.
    node.ns.ip(&["link", "del", "eth1"]).unwrap();
    k.wait_resource(DP, DEADLINE, |v| all_unhealthy(&v.devices))
        .await
        .unwrap();
    node.ns.add_nic("eth1").unwrap();
    let v = k
        .wait_resource(DP, DEADLINE, |v| all_healthy(&v.devices))
        .await
        .unwrap();
    assert_eq!(v.devices.len(), 3, "{:?}", summary(&v.devices));
    // One registration and one stream all along.
    assert_eq!(k.registration_count(DP), 1);
    assert_eq!(v.streams_opened, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_leads_to_re_registration() {
    let mut node = node_with_dp("restart", "name=dp,lowerDevice=eth1,capacity=2", &[]).await;
    for round in 0..2 {
        let kubelet = node.kubelet.take().unwrap();
        let t = Instant::now();
        let kubelet = kubelet.restart().await.unwrap();
        let reg = kubelet
            .wait_for_registration(DP, 0, DEADLINE)
            .await
            .unwrap();
        println!(
            "MEASURE re-registration after kubelet restart (round {round}): {:?}",
            t.elapsed()
        );
        assert_eq!(reg.endpoint, DP_SOCKET);
        // The plugin serves again on a fresh socket.
        kubelet
            .wait_resource(DP, DEADLINE, |v| serving(v, 2))
            .await
            .unwrap();
        node.kubelet = Some(kubelet);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_own_socket_is_served_again_and_re_registered_after_the_old_stream_ended() {
    let node = node_with_dp("sockdel", "name=dp,lowerDevice=eth1,capacity=2", &[]).await;
    let k = node.kubelet();
    let first = k
        .wait_resource(DP, DEADLINE, |v| serving(v, 2))
        .await
        .unwrap()
        .client;
    let sock = node.plugin_dir().join(DP_SOCKET);
    std::fs::remove_file(&sock).unwrap();
    k.wait_for_registration(DP, 1, DEADLINE).await.unwrap();
    assert!(sock.exists());
    // The old server's stream ends; a kubelet up to 1.36 then disconnects
    // whichever client it holds for the resource. That must be the old one:
    // the plugin registers again only after its old server stopped.
    let d = k
        .wait_disconnects(DEADLINE, |l| l.iter().any(|d| d.stream_of == first))
        .await
        .unwrap();
    let d = d.iter().find(|d| d.stream_of == first).unwrap();
    assert_eq!(
        d.disconnected, first,
        "the end of the old stream disconnected the new registration: {d:?}"
    );
    let v = k
        .wait_resource(DP, DEADLINE, |v| serving(v, 2) && v.client != first)
        .await
        .unwrap();
    assert_eq!(v.live_streams, 1, "{v:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_stream_leads_to_re_registration() {
    let mut node = node_with_dp("streamend", "name=dp,lowerDevice=eth1,capacity=2", &[]).await;
    let k = node.kubelet.take().unwrap();
    for round in 0..2 {
        let before = k
            .wait_resource(DP, DEADLINE, |v| serving(v, 2) && v.live_streams == 1)
            .await
            .unwrap();
        let t = Instant::now();
        k.break_stream(DP).unwrap();
        // The kubelet counts no devices until the plugin registers again.
        k.wait_for_registration(DP, round + 1, DEADLINE)
            .await
            .unwrap();
        let after = k
            .wait_resource(DP, DEADLINE, |v| serving(v, 2) && v.client != before.client)
            .await
            .unwrap();
        println!(
            "MEASURE stream end -> serving again (round {round}): {:?}",
            t.elapsed()
        );
        assert_eq!(after.live_streams, 1, "{after:?}");
    }
    let log = node.daemon().log();
    assert!(log.contains("ListAndWatch stream ended"), "{log}");
    node.kubelet = Some(k);
}

/// A node with resources `a` on eth1 and `b` on eth2, both served, and the
/// kubelet hanging in a Register of `a` (its stream broken, so the plugin
/// registers `a` again).
async fn node_with_a_hung_registration(tag: &str, extra: &[&str]) -> Node {
    let mut node = Node::new(tag);
    node.ns.add_nic("eth2").unwrap();
    node.start_kubelet().await;
    let mut args = vec![
        "--resource=name=a,lowerDevice=eth1,capacity=2",
        "--resource=name=b,lowerDevice=eth2,capacity=2",
    ];
    args.extend_from_slice(extra);
    node.start_daemon(&args, &[]);
    let k = node.kubelet();
    for r in [A, B] {
        k.wait_resource(r, DEADLINE, |v| serving(v, 2))
            .await
            .unwrap();
    }
    k.hang_register(true);
    k.break_stream(A).unwrap();
    k.wait_hung(1, DEADLINE).await.unwrap();
    node
}

const A: &str = "macvtap.network.kubevirt.io/a";
const B: &str = "macvtap.network.kubevirt.io/b";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nic_down_shows_on_another_resource_while_a_register_hangs() {
    // A Register timeout far beyond the test's deadline: if the hung call
    // held up the loop, the health change would not show in time.
    let node = node_with_a_hung_registration("hanghealth", &["--register-timeout=60s"]).await;
    let k = node.kubelet();
    let t = Instant::now();
    node.ns.ip(&["link", "set", "eth2", "down"]).unwrap();
    k.wait_resource(B, DEADLINE, |v| v.connected && all_unhealthy(&v.devices))
        .await
        .unwrap();
    println!(
        "MEASURE NIC down -> Unhealthy while Register hangs: {:?}",
        t.elapsed()
    );
    assert!(k.hung() >= 1, "the Register of a still hangs");
    assert_eq!(k.registration_count(A), 1);
    // And back up.
    node.ns.ip(&["link", "set", "eth2", "up"]).unwrap();
    k.wait_resource(B, DEADLINE, |v| serving(v, 2))
        .await
        .unwrap();
    assert!(k.hung() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_a_register_hangs_exits_and_removes_sockets() {
    // As above: a blocked loop would exit only after the 60 s timeout.
    let mut node = node_with_a_hung_registration("hangterm", &["--register-timeout=60s"]).await;
    let t = Instant::now();
    node.daemon().signal(Signal::SIGTERM).unwrap();
    let status = node.daemon().wait_exit(DEADLINE).expect("exits");
    println!(
        "MEASURE SIGTERM -> exit while Register hangs: {:?}",
        t.elapsed()
    );
    assert!(status.success(), "{status:?}");
    for s in [
        "macvtap.network.kubevirt.io_a",
        "macvtap.network.kubevirt.io_b",
    ] {
        assert!(!node.plugin_dir().join(s).exists(), "{s} removed");
    }
    assert!(node.kubelet().hung() >= 1, "it exited while Register hung");
    node.kubelet().hang_register(false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_completes_after_the_hang_ends_with_one_live_stream() {
    let node = node_with_a_hung_registration("hangend", &["--register-timeout=1s"]).await;
    let k = node.kubelet();
    // The first Register timed out and the retry hangs too.
    k.wait_hung(2, DEADLINE).await.unwrap();
    let before = k.registration_count(A);
    let hung = k.hung();
    // The kubelet comes back: every hung Register goes on, including those
    // the plugin gave up on; the plugin ends up with one registration.
    k.hang_register(false);
    k.wait_for_registration(A, before + hung, DEADLINE)
        .await
        .unwrap();
    let v = k
        .wait_resource(A, DEADLINE, |v| serving(v, 2) && v.live_streams == 1)
        .await
        .unwrap();
    assert!(v.connected, "{v:?}");
    let log = node.daemon.as_ref().unwrap().log();
    assert!(log.contains("registration failed"), "{log}");
    assert!(log.contains("a second ListAndWatch stream"), "{log}");
    // b was never disturbed.
    assert_eq!(k.registration_count(B), 1);
    assert!(serving(&k.resource(B), 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_kubelet_gets_registered_when_it_appears() {
    let mut node = Node::new("late");
    node.start_daemon(&["--resource=name=dp,lowerDevice=eth1,capacity=2"], &[]);
    // Let the daemon come up and find no kubelet.
    let sock = node.plugin_dir().join(DP_SOCKET);
    let end = Instant::now() + DEADLINE;
    while !sock.exists() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        sock.exists(),
        "the plugin serves before the kubelet is there"
    );
    node.start_kubelet().await;
    let t = Instant::now();
    node.kubelet()
        .wait_for_registration(DP, 0, DEADLINE)
        .await
        .unwrap();
    println!(
        "MEASURE registration after a late kubelet: {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_discovery_follows_nics_appearing_and_vanishing() {
    let mut node = Node::new("auto");
    node.start_kubelet().await;
    node.start_daemon(&["--discover-kinds", "veth"], &[]);
    let eth1 = "macvtap.network.kubevirt.io/eth1";
    let eth2 = "macvtap.network.kubevirt.io/eth2";
    node.kubelet()
        .wait_for_registration(eth1, 0, DEADLINE)
        .await
        .unwrap();
    assert_eq!(node.kubelet().registration_count(eth2), 0);

    node.ns.add_nic("eth2").unwrap();
    let reg = node
        .kubelet()
        .wait_for_registration(eth2, 0, DEADLINE)
        .await
        .unwrap();
    assert_eq!(reg.endpoint, "macvtap.network.kubevirt.io_eth2");
    let v = node
        .kubelet()
        .wait_resource(eth2, DEADLINE, |v| all_healthy(&v.devices))
        .await
        .unwrap();
    assert_eq!(
        v.devices.len(),
        100,
        "auto-discovered resources have capacity 100"
    );
    assert_eq!(v.devices[0].id, "eth2Mvp0");

    node.ns.ip(&["link", "del", "eth2"]).unwrap();
    node.kubelet()
        .wait_resource(eth2, DEADLINE, |v| v.connected && all_unhealthy(&v.devices))
        .await
        .unwrap();
    // Loopback is never a resource.
    assert_eq!(
        node.kubelet()
            .registration_count("macvtap.network.kubevirt.io/lo"),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_precedence_is_flags_then_file_then_env() {
    let mut node = Node::new("prec");
    node.start_kubelet().await;
    let file = node.dir.path().join("conf.json");
    std::fs::write(
        &file,
        r#"[{"name":"fromfile","lowerDevice":"eth1","capacity":2}]"#,
    )
    .unwrap();
    let env = [(
        "DP_MACVTAP_CONF",
        r#"[{"name":"fromenv","lowerDevice":"eth1"}]"#,
    )];
    let file_arg = format!("--config={}", file.display());

    // File over env.
    node.start_daemon(&[&file_arg], &env);
    let k = node.kubelet();
    k.wait_for_registration("macvtap.network.kubevirt.io/fromfile", 0, DEADLINE)
        .await
        .unwrap();
    node.daemon().signal(Signal::SIGTERM).unwrap();
    assert!(node.daemon().wait_exit(DEADLINE).unwrap().success());

    // Flags over file (and env).
    node.start_daemon(
        &[&file_arg, "--resource=name=fromflag,lowerDevice=eth1"],
        &env,
    );
    node.kubelet()
        .wait_for_registration("macvtap.network.kubevirt.io/fromflag", 0, DEADLINE)
        .await
        .unwrap();
    node.daemon().signal(Signal::SIGTERM).unwrap();
    assert!(node.daemon().wait_exit(DEADLINE).unwrap().success());

    // Env alone.
    node.start_daemon(&[], &env);
    node.kubelet()
        .wait_for_registration("macvtap.network.kubevirt.io/fromenv", 0, DEADLINE)
        .await
        .unwrap();
    let regs: Vec<_> = node
        .kubelet()
        .registrations()
        .into_iter()
        .map(|r| r.resource_name)
        .collect();
    assert_eq!(
        regs,
        [
            "macvtap.network.kubevirt.io/fromfile",
            "macvtap.network.kubevirt.io/fromflag",
            "macvtap.network.kubevirt.io/fromenv"
        ]
    );
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A node with the daemon started on config file `conf.json` (resource
/// `dp` on eth1, 2 devices) with `env`, once `dp` registered.
async fn node_with_config_file(tag: &str, env: &[(&str, &str)]) -> (Node, PathBuf) {
    let mut node = Node::new(tag);
    node.start_kubelet().await;
    let file = node.dir.path().join("conf.json");
    write_atomically(
        &file,
        r#"[{"name":"dp","lowerDevice":"eth1","capacity":2}]"#,
    );
    node.start_daemon(&[&format!("--config={}", file.display())], env);
    node.kubelet()
        .wait_for_registration(DP, 0, DEADLINE)
        .await
        .unwrap();
    (node, file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_file_changes_are_applied_without_restart() {
    let (mut node, file) = node_with_config_file("reload", &[]).await;
    node.kubelet()
        .wait_resource(DP, DEADLINE, |v| serving(v, 2))
        .await
        .unwrap();

    // Capacity changed and a resource added.
    write_atomically(
        &file,
        r#"[{"name":"dp","lowerDevice":"eth1","capacity":4},{"name":"dp2","lowerDevice":"eth1"}]"#,
    );
    node.kubelet()
        .wait_resource(DP, DEADLINE, |v| serving(v, 4))
        .await
        .unwrap();
    node.kubelet()
        .wait_for_registration("macvtap.network.kubevirt.io/dp2", 0, DEADLINE)
        .await
        .unwrap();

    // An invalid change is rejected and the running configuration stays.
    write_atomically(&file, r#"[{"name":"dp","mode":"nope"}]"#);
    let log = wait_log(&mut node, "the refusal of the invalid config", |l| {
        l.contains("config file changed but is invalid")
    })
    .await;
    assert!(
        log.contains("entry 0 (\"dp\")") && log.contains("\"nope\""),
        "the refusal names the entry and the bad mode: {log}"
    );
    assert!(node.plugin_dir().join(DP_SOCKET).exists());
    // The running configuration is what serves: dp still has 4 devices, in
    // the kubelet's view and to an Allocate of its last one.
    let v = node.kubelet().resource(DP);
    assert!(
        serving(&v, 4),
        "after the invalid change dp is {:?}, connected {}",
        summary(&v.devices),
        v.connected
    );
    node.kubelet()
        .allocate(DP, &["dpMvp3"])
        .await
        .unwrap_or_else(|e| panic!("dpMvp3 after the invalid change: {e}"));
    assert!(serving(&node.kubelet().resource(DP), 4));
    // Resource removed (written in place this time, as an editor would).
    std::fs::write(&file, r#"[{"name":"dp2","lowerDevice":"eth1"}]"#).unwrap();
    let gone = node.plugin_dir().join(DP_SOCKET);
    let end = Instant::now() + DEADLINE;
    while gone.exists() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!gone.exists(), "the removed resource's socket is gone");
    assert!(
        node.plugin_dir()
            .join("macvtap.network.kubevirt.io_dp2")
            .exists()
    );
}

fn log_lines_with(log: &str, a: &str, b: &str) -> usize {
    log.lines()
        .filter(|l| l.contains(a) && l.contains(b))
        .count()
}

/// A node whose kubelet serves PodResources listing `held` of `dp`, and the
/// daemon serving `dp` (4 devices) with the given reclaim interval and grace.
async fn node_with_pod_resources(
    tag: &str,
    held: &[&str],
    interval: &str,
    grace: &str,
) -> (Node, TestPodResources) {
    let mut node = Node::new(tag);
    node.start_kubelet().await;
    let pr = TestPodResources::start(&node.dir.path().join("pod-resources/kubelet.sock"))
        .await
        .unwrap();
    pr.set_allocated(DP, held);
    let interval = format!("--reclaim-interval={interval}");
    let grace = format!("--reclaim-grace={grace}");
    node.start_daemon(
        &[
            "--resource=name=dp,lowerDevice=eth1,capacity=4",
            &interval,
            &grace,
        ],
        &[],
    );
    node.kubelet()
        .wait_resource(DP, DEADLINE, |v| serving(v, 4))
        .await
        .unwrap();
    (node, pr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaked_links_are_reclaimed_and_allocated_ones_kept() {
    let (mut node, _pr) = node_with_pod_resources("reclaim", &["dpMvp0"], "100ms", "3s").await;
    let k = node.kubelet.take().unwrap();
    k.allocate(DP, &["dpMvp0"]).await.unwrap();
    k.allocate(DP, &["dpMvp1"]).await.unwrap();
    // A macvtap on the NIC that is not ours by name is never touched.
    node.ns
        .ip(&[
            "link", "add", "link", "eth1", "name", "mytap", "type", "macvtap",
        ])
        .unwrap();

    // dpMvp1 looks leaked; after two more reclaim rounds it is allocated
    // again (a new pod, not yet in PodResources). Its clock restarts: at
    // the end of the grace counted from when it first looked leaked, it is
    // kept, not deleted.
    let re = link_name_for_device("dpMvp1");
    let first = node.ns.link(&re).unwrap().unwrap();
    let log = wait_log(&mut node, "first sight of the leaked link", |l| {
        log_lines_with(l, "looks leaked", &re) > 0
    })
    .await;
    let rounds = log.matches("reclaim round done").count();
    wait_log(&mut node, "two more reclaim rounds", |l| {
        l.matches("reclaim round done").count() >= rounds + 2
    })
    .await;
    let resp = k.allocate(DP, &["dpMvp1"]).await.unwrap();
    assert_eq!(
        resp.container_responses[0].devices[0].host_path,
        format!("/dev/tap{}", first.index),
        "the link was reused"
    );
    wait_log(&mut node, "a kept link", |l| {
        log_lines_with(l, "keeping a link that looks leaked", &re) > 0
    })
    .await;
    let kept = node
        .ns
        .link(&re)
        .unwrap()
        .expect("kept within the grace of its Allocate");
    assert_eq!(kept.index, first.index);

    // Then, leaked for the whole grace since its last Allocate, it goes.
    let end = Instant::now() + DEADLINE;
    while node.ns.link(&re).unwrap().is_some() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        node.ns.link(&re).unwrap().is_none(),
        "the leaked link was removed"
    );
    assert!(
        node.ns
            .link(&link_name_for_device("dpMvp0"))
            .unwrap()
            .is_some(),
        "the link PodResources lists stays"
    );
    assert!(node.ns.link("mytap").unwrap().is_some());
    let log = wait_log(&mut node, "the deletion", |l| {
        l.contains("deleted a leaked macvtap")
    })
    .await;
    assert!(
        log_lines_with(&log, "deleted a leaked macvtap", &re) == 1,
        "{log}"
    );
    node.kubelet = Some(k);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_without_pod_resources_socket_is_skipped_with_one_message() {
    let mut node = node_with_dp(
        "noprs",
        "name=dp,lowerDevice=eth1,capacity=2",
        &[
            "--reclaim-interval=100ms",
            "--reclaim-grace=0s",
            "--metrics-addr=127.0.0.1:9402",
        ],
    )
    .await;
    node.kubelet()
        .wait_resource(DP, DEADLINE, |v| serving(v, 2))
        .await
        .unwrap();
    node.kubelet().allocate(DP, &["dpMvp0"]).await.unwrap();
    // Several skipped rounds, counted by the daemon itself.
    let end = Instant::now() + DEADLINE;
    let skipped = |m: &str| {
        m.lines()
            .find_map(|l| l.strip_prefix("macvtap_dp_reclaim_rounds_total{outcome=\"skipped\"} "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let mut metrics = metrics_get(&node.ns, "/metrics");
    while skipped(&metrics) < 4 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
        metrics = metrics_get(&node.ns, "/metrics");
    }
    assert!(skipped(&metrics) >= 4, "{metrics}");
    // Still one message, and the link is untouched.
    let log = node.daemon().log();
    assert_eq!(
        log.matches("leaked-link reclaim and heal are off").count(),
        1,
        "{log}"
    );
    assert!(
        node.ns
            .link(&link_name_for_device("dpMvp0"))
            .unwrap()
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_serving_and_removes_own_sockets() {
    let mut node = node_with_dp("term", "name=dp,lowerDevice=eth1,capacity=2", &[]).await;
    let sock = node.plugin_dir().join(DP_SOCKET);
    assert!(sock.exists());
    node.daemon().signal(Signal::SIGTERM).unwrap();
    let status = node.daemon().wait_exit(DEADLINE).expect("exits");
    assert!(status.success(), "{status:?}");
    assert!(!sock.exists(), "own socket removed");
    assert!(
        node.plugin_dir().join("kubelet.sock").exists(),
        "kubelet's socket untouched"
    );

    // SIGINT does the same.
    node.start_daemon(&["--resource=name=dp,lowerDevice=eth1,capacity=2"], &[]);
    node.kubelet()
        .wait_for_registration(DP, 1, DEADLINE)
        .await
        .unwrap();
    node.daemon().signal(Signal::SIGINT).unwrap();
    assert!(node.daemon().wait_exit(DEADLINE).expect("exits").success());
    assert!(!sock.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_healthz_are_served() {
    require_root().unwrap();
    let node = node_with_dp(
        "metrics",
        "name=dp,lowerDevice=eth1,capacity=3",
        &["--metrics-addr=127.0.0.1:9402", "--log-format=json"],
    )
    .await;
    let mut client = node.kubelet().connect(DP_SOCKET).await.unwrap();
    client.allocate(&["dpMvp0"]).await.unwrap();
    client.allocate(&["dpMvp9"]).await.unwrap_err();
    let health = metrics_get(&node.ns, "/healthz");
    assert!(health.starts_with("HTTP/1.1 200 OK"), "{health}");
    let m = metrics_get(&node.ns, "/metrics");
    for want in [
        "macvtap_dp_devices{resource=\"macvtap.network.kubevirt.io/dp\",state=\"healthy\"} 3",
        "macvtap_dp_allocations_total{resource=\"macvtap.network.kubevirt.io/dp\"} 1",
        "macvtap_dp_allocation_errors_total{resource=\"macvtap.network.kubevirt.io/dp\"} 1",
        "macvtap_dp_registrations_total{resource=\"macvtap.network.kubevirt.io/dp\"} 1",
        "macvtap_dp_leaked_links_removed_total 0",
        "macvtap_dp_allocate_seconds_bucket{le=\"+Inf\",resource=\"macvtap.network.kubevirt.io/dp\"} 2",
        "macvtap_dp_allocate_seconds_count{resource=\"macvtap.network.kubevirt.io/dp\"} 2",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_start_time_seconds gauge",
    ] {
        assert!(m.contains(want), "want {want:?} in:\n{m}");
    }
    assert!(
        m.starts_with("HTTP/1.1 200 OK\r\n")
            && m.contains(
                "\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"
            ),
        "{m}"
    );
    let body = &m[m.find("\r\n\r\n").unwrap() + 4..];
    let parsed = tools::parse_openmetrics(body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    // The daemon's own process: it has the plugin socket, the kubelet's
    // connection and the metrics listener open.
    let fds = parsed
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "process_open_fds")
        .unwrap()["samples"][0]["value"]
        .as_f64()
        .unwrap();
    assert!(fds >= 3.0, "{body}");
    println!("{body}");
    // --log-format=json: every log line is a JSON object.
    let mut node = node;
    let log = node.daemon().log();
    let first = log.lines().next().unwrap();
    assert!(
        first.starts_with('{') && first.contains("\"level\""),
        "{first}"
    );
    // No NODE_NAME here: Events are off, said once, and all else works.
    assert_eq!(log.matches("Kubernetes Events are off").count(), 1, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_socket_is_root_only_even_with_umask_000() {
    require_root().unwrap();
    // nextest runs each test in its own process: the daemon inherits this.
    nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    let node = node_with_dp("umask", "name=dp,lowerDevice=eth1,capacity=1", &[]).await;
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(node.plugin_dir().join(DP_SOCKET))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o7777,
        0o600,
        "plugin socket mode is {:o}: anyone who can connect can Allocate",
        mode & 0o7777
    );
}

/// A pod's namespace destroyed without CNI DEL takes its macvtap with it;
/// the kubelet keeps handing the pod's containers the same `/dev/tapN`. The
/// daemon re-creates the link with that ifindex as soon as the tap node
/// goes (a reclaim interval of an hour proves it does not wait for one),
/// but only for a device a pod still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_link_of_a_held_device_comes_back_with_its_ifindex() {
    let (mut node, _pr) = node_with_pod_resources("heal", &["dpMvp0"], "1h", "1h").await;
    let held = node.kubelet().allocate(DP, &["dpMvp0"]).await.unwrap();
    let free = node.kubelet().allocate(DP, &["dpMvp1"]).await.unwrap();
    let held_tap = held.container_responses[0].devices[0].host_path.clone();
    let free_tap = free.container_responses[0].devices[0].host_path.clone();
    let held_name = link_name_for_device("dpMvp0");
    let free_name = link_name_for_device("dpMvp1");
    let held_index = node.ns.link(&held_name).unwrap().unwrap().index;

    // Each link goes into a pod namespace (as CNI ADD moves it), and the
    // namespace is destroyed without DEL. The unheld one first: once the
    // held one is healed, the round that healed it saw both losses.
    for (name, tap, tag) in [(&free_name, &free_tap, "pa"), (&held_name, &held_tap, "pb")] {
        let pod = TestNs::new(tag).unwrap();
        node.ns
            .ip(&["link", "set", name, "netns", &pod.name])
            .unwrap();
        drop(pod);
        // The namespace takes the link and its tap node with it (unless the
        // daemon was quicker and the link is already back on the node).
        let end = Instant::now() + DEADLINE;
        while Path::new(tap).exists() && node.ns.link(name).unwrap().is_none() {
            assert!(
                Instant::now() < end,
                "{tap} of {name} was still there {DEADLINE:?} after its pod namespace {tag} \
                 was deleted, and the link is not back on the node"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let end = Instant::now() + DEADLINE;
    let healed = loop {
        if let Some(l) = node.ns.link(&held_name).unwrap() {
            break l;
        }
        assert!(
            Instant::now() < end,
            "the held device's link was not re-created: {}",
            node.daemon().log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        healed.index, held_index,
        "the same ifindex, so the same /dev/tapN"
    );
    assert!(healed.is_macvtap());
    let dev = tap_dev_in_netns(&Netns::open(node.ns.path()).unwrap(), &held_name).unwrap();
    open_tap_node(Path::new(&held_tap), dev, Duration::ZERO).unwrap();
    assert!(
        node.ns.link(&free_name).unwrap().is_none() && !Path::new(&free_tap).exists(),
        "a device no pod holds is not re-created"
    );
    let log = wait_log(&mut node, "the healing log line", |l| {
        l.contains("re-created the macvtap of a device a pod still holds")
    })
    .await;
    assert_eq!(
        log_lines_with(&log, "re-created the macvtap", "dpMvp0"),
        1,
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_on_the_node_waits_for_the_first_and_then_serves() {
    const WAITING: &str = "another macvtap daemon serves this node";
    let spec = "--resource=name=dp,lowerDevice=eth1,capacity=2";
    let mut node = node_with_dp("second", &spec["--resource=".len()..], &[]).await;
    let resp = node.kubelet().allocate(DP, &["dpMvp0"]).await.unwrap();
    assert_eq!(resp.container_responses.len(), 1);
    let held = link_name_for_device("dpMvp0");
    assert!(node.ns.link(&held).unwrap().is_some());
    let first = node.daemon.take().unwrap();

    // A second daemon (another DaemonSet of ours, metrics off) waits,
    // having done nothing: no registration, no socket replaced, and
    // SIGTERM ends its wait.
    node.start_daemon(&[spec], &[]);
    let log = wait_log(&mut node, "the wait", |l| l.contains(WAITING)).await;
    assert!(!log.contains("configuration loaded"), "{log}");
    assert_eq!(node.kubelet().registration_count(DP), 1);
    node.daemon().signal(Signal::SIGTERM).unwrap();
    assert!(node.daemon().wait_exit(DEADLINE).unwrap().success());
    let log = node.daemon().log();
    assert!(log.contains("stopped while waiting"), "{log}");
    assert_eq!(node.kubelet().registration_count(DP), 1);
    assert!(
        node.plugin_dir().join(DP_SOCKET).exists(),
        "the first's socket stays"
    );
    assert!(
        node.ns.link(&held).unwrap().is_some(),
        "the handed-out link stays"
    );
    assert!(
        node.kubelet().resource(DP).connected,
        "the first still serves"
    );

    // Started again, it serves once the first has exited.
    node.start_daemon(&[spec], &[]);
    wait_log(&mut node, "the wait", |l| l.contains(WAITING)).await;
    let mut first = first;
    first.signal(Signal::SIGTERM).unwrap();
    assert!(first.wait_exit(DEADLINE).unwrap().success());
    wait_log(&mut node, "the take-over", |l| {
        l.contains("the other daemon exited: this one serves the node now")
    })
    .await;
    registered_and_serving(&node, 1, 2).await;
    assert!(
        node.ns.link(&held).unwrap().is_some(),
        "the handed-out link stays"
    );
}
