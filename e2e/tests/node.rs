//! Node end-to-end: a real VM on a macvtap made by our binaries, driven the
//! way kubelet, Multus and KubeVirt drive them. Each test builds a sandbox
//! node (network namespaces, a veth as the NIC, a temp kubelet dir), runs the
//! real device plugin against the test kubelet, allocates a device, runs the
//! real CNI as Multus does, boots the guest on the macvtap (QEMU given the
//! tap fd, or libvirtd in the pod namespace as virt-launcher runs it), and
//! tears down as a pod deletion does, checking nothing is left behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use anyhow::{Result, ensure};
use macvtap_e2e::guest::{self, Guest};
use macvtap_e2e::node::{self, Allocation, FAST_RECLAIM, GUEST_IP, Multus, Node, PEER_IP};
use macvtap_e2e::sandbox::TestNs;
use macvtap_e2e::steps::Steps;
use macvtap_e2e::vm::{GuestNet, Libvirtd, run_qemu};
use std::path::Path;
use std::time::{Duration, Instant};

/// The Go project's README configuration.
const GO_README_CONF: &str =
    r#"[{"name":"dataplane","lowerDevice":"lower0","mode":"bridge","capacity":50}]"#;
const VM_MAC: &str = "52:54:00:c0:ff:ee";

fn guest() -> Guest {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-guest");
    guest::build(&cache)
        .expect("building the guest (apt-get install busybox-static; apt-get update)")
}

fn net(mac: &str, tries: u32) -> GuestNet {
    GuestNet {
        mac: mac.into(),
        ip: GUEST_IP.into(),
        peer: PEER_IP.into(),
        tries,
    }
}

fn nad(version: &str) -> String {
    format!(r#"{{"cniVersion":"{version}","name":"dataplane","type":"macvtap","mtu":1500}}"#)
}

/// The full name of resource `name`.
fn resource(name: &str) -> String {
    format!("{}/{name}", macvtap_link::RESOURCE_PREFIX)
}

/// A pod deletion as a node does it: CNI DEL (the macvtap goes back to the
/// node namespace with its ifindex), the pod namespace removed, the kubelet
/// frees the device (PodResources no longer lists it), and the device
/// plugin's reclaim removes the link after its grace.
fn delete_pod(
    node: &Node,
    multus: &Multus,
    pod: TestNs,
    alloc: &Allocation,
    resource_name: &str,
) -> Result<()> {
    let del = multus.run("DEL", &pod, "net1", Some(&alloc.device_id))?;
    ensure!(del.ok, "CNI DEL failed: {}", del.json);
    node.returned_link(&alloc.device_id, alloc.ifindex()?)?;
    drop(pod);
    node.hold(&resource(resource_name), &[])?;
    node.wait_for_reclaim()
}

/// Checks after teardown: no `mvt…` link on the node, the same `/dev/tap*`
/// nodes as before, and none of the given processes alive.
fn nothing_left(node: &Node, taps_before: &[String], pids: &[u32]) -> Result<()> {
    let leftover: Vec<String> = node
        .ns
        .links()?
        .into_iter()
        .filter(|l| l.starts_with("mvt"))
        .collect();
    ensure!(leftover.is_empty(), "links left on the node: {leftover:?}");
    let extra: Vec<String> = node::tap_nodes()
        .into_iter()
        .filter(|t| !taps_before.contains(t))
        .collect();
    ensure!(extra.is_empty(), "tap nodes left behind: {extra:?}");
    for pid in pids {
        ensure!(!node::alive(*pid), "process {pid} is still running");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_vm_pings_through_the_macvtap_and_a_wrong_mac_does_not() -> Result<()> {
    let mut steps = Steps::new();
    steps.step("sandbox node, test kubelet, device plugin with the Go README's DP_MACVTAP_CONF");
    let mut node = Node::new()?;
    let taps_before = node::tap_nodes();
    node.start_kubelet().await?;
    node.start_pod_resources().await?;
    let dp = node.start_device_plugin(GO_README_CONF, &FAST_RECLAIM)?;
    let mut client = node.plugin("dataplane", 50).await?;
    let guest = guest();

    steps.step("kubelet Allocate for one device");
    let alloc = Node::allocate(&mut client, "dataplaneMvp0").await?;
    node.hold(&resource("dataplane"), &["dataplaneMvp0"])?;
    steps.say(format!(
        "{} -> {} ({:.1} ms)",
        alloc.device_id,
        alloc.host_path.display(),
        alloc.took.as_secs_f64() * 1e3
    ));
    let link = macvtap_link::link_name_for_device("dataplaneMvp0");
    ensure!(node.ns.links()?.contains(&link), "Allocate made {link}");

    steps.step("Multus: NAD config (0.3.1) + deviceID, CNI ADD into the pod");
    let pod = TestNs::new("pod")?;
    let nad = nad("0.3.1");
    let multus = Multus {
        node: &node.ns,
        nad_config: &nad,
        pod: ("default", "virt-launcher-vm-1"),
        mac: VM_MAC,
    };
    let add = multus.run("ADD", &pod, "net1", Some("dataplaneMvp0"))?;
    ensure!(add.ok, "CNI ADD failed: {} {}", add.json, add.stderr);
    ensure!(add.json["interfaces"][0]["mac"] == VM_MAC, "{}", add.json);
    ensure!(
        pod.links()?.contains(&"net1".to_string()),
        "net1 in the pod"
    );
    ensure!(
        !node.ns.links()?.contains(&link),
        "the link left the node namespace"
    );
    ensure!(
        alloc.host_path.exists(),
        "{} still names the link",
        alloc.host_path.display()
    );

    steps.step("QEMU in the pod namespace on the Allocate response's tap fd");
    let work = tempfile::tempdir()?;
    let run = tokio::task::block_in_place(|| {
        run_qemu(
            &pod.name,
            &alloc.host_path,
            &guest,
            &net(VM_MAC, 20),
            work.path(),
        )
    })?;
    steps.say(run.markers());
    ensure!(
        run.ping_ok,
        "the guest could not ping {PEER_IP}:\n{}",
        run.console
    );

    steps.step("negative: a guest MAC other than the one given to the CNI gets no connectivity");
    let wrong = tokio::task::block_in_place(|| {
        run_qemu(
            &pod.name,
            &alloc.host_path,
            &guest,
            &net("52:54:00:00:00:99", 3),
            work.path(),
        )
    })?;
    steps.say(wrong.markers());
    ensure!(
        !wrong.ping_ok && wrong.console.contains(guest::PING_FAIL),
        "ping worked with the wrong MAC"
    );

    steps.step(
        "teardown as a pod deletion: CNI DEL gives the link back, pod namespace removed, \
         device freed, link reclaimed, daemon stopped",
    );
    delete_pod(&node, &multus, pod, &alloc, "dataplane")?;
    node.stop_device_plugin()?;
    nothing_left(&node, &taps_before, &[dp])?;
    println!("\n{}", steps.summary());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libvirt_domain_with_an_unmanaged_ethernet_interface_pings() -> Result<()> {
    let mut steps = Steps::new();
    steps.step("sandbox node, test kubelet, device plugin");
    let mut node = Node::new()?;
    let taps_before = node::tap_nodes();
    node.start_kubelet().await?;
    node.start_pod_resources().await?;
    let dp = node.start_device_plugin(GO_README_CONF, &FAST_RECLAIM)?;
    let mut client = node.plugin("dataplane", 50).await?;
    let guest = guest();

    steps.step("Allocate and CNI ADD (NAD cniVersion 1.0.0)");
    let alloc = Node::allocate(&mut client, "dataplaneMvp7").await?;
    node.hold(&resource("dataplane"), &["dataplaneMvp7"])?;
    let pod = TestNs::new("pod")?;
    let nad = nad("1.0.0");
    let multus = Multus {
        node: &node.ns,
        nad_config: &nad,
        pod: ("default", "virt-launcher-vm-2"),
        mac: VM_MAC,
    };
    let add = multus.run("ADD", &pod, "net1", Some(&alloc.device_id))?;
    ensure!(add.ok, "CNI ADD failed: {} {}", add.json, add.stderr);
    ensure!(add.json["interfaces"][0]["mtu"] == 1500, "{}", add.json);

    steps.step("libvirtd in the pod namespace (as virt-launcher runs it)");
    let lv_dir = tempfile::tempdir()?;
    let libvirtd = tokio::task::block_in_place(|| Libvirtd::start(&pod.name, lv_dir.path()))?;
    let lv_pid = libvirtd.pid();

    steps.step("transient domain: <interface type='ethernet'><target dev='net1' managed='no'/>");
    let run = tokio::task::block_in_place(|| {
        libvirtd.run_domain("vm-macvtap", "net1", &guest, &net(VM_MAC, 20))
    })?;
    steps.say(run.markers());
    let qemus = node::children(lv_pid);
    ensure!(
        run.ping_ok,
        "the guest could not ping {PEER_IP}:\n{}",
        run.console
    );

    steps.step(
        "teardown: libvirtd stopped, CNI DEL, pod namespace removed, link reclaimed, daemon stopped",
    );
    drop(libvirtd);
    delete_pod(&node, &multus, pod, &alloc, "dataplane")?;
    node.stop_device_plugin()?;
    let mut pids = vec![dp, lv_pid];
    pids.extend(qemus);
    nothing_left(&node, &taps_before, &pids)?;
    println!("\n{}", steps.summary());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_discovery_resource_carries_a_vm() -> Result<()> {
    let mut steps = Steps::new();
    steps.step("device plugin with DP_MACVTAP_CONF=[] (auto-discovery; veth counts as a NIC here)");
    let mut node = Node::new()?;
    let taps_before = node::tap_nodes();
    node.start_kubelet().await?;
    node.start_pod_resources().await?;
    let dp = node.start_device_plugin(
        "[]",
        &[
            "--discover-kinds",
            "veth",
            FAST_RECLAIM[0],
            FAST_RECLAIM[1],
            FAST_RECLAIM[2],
            FAST_RECLAIM[3],
        ],
    )?;
    let mut client = node.plugin("lower0", 100).await?;
    let guest = guest();

    steps.step("Allocate lower0Mvp3, CNI ADD, QEMU");
    let alloc = Node::allocate(&mut client, "lower0Mvp3").await?;
    node.hold(&resource("lower0"), &["lower0Mvp3"])?;
    let pod = TestNs::new("pod")?;
    let nad = nad("1.0.0").replace("dataplane", "lower0");
    let multus = Multus {
        node: &node.ns,
        nad_config: &nad,
        pod: ("default", "virt-launcher-vm-3"),
        mac: VM_MAC,
    };
    let add = multus.run("ADD", &pod, "net1", Some(&alloc.device_id))?;
    ensure!(add.ok, "CNI ADD failed: {} {}", add.json, add.stderr);
    let work = tempfile::tempdir()?;
    let run = tokio::task::block_in_place(|| {
        run_qemu(
            &pod.name,
            &alloc.host_path,
            &guest,
            &net(VM_MAC, 20),
            work.path(),
        )
    })?;
    steps.say(run.markers());
    ensure!(
        run.ping_ok,
        "the guest could not ping {PEER_IP}:\n{}",
        run.console
    );

    steps.step("teardown");
    delete_pod(&node, &multus, pod, &alloc, "lower0")?;
    node.stop_device_plugin()?;
    nothing_left(&node, &taps_before, &[dp])?;
    println!("\n{}", steps.summary());
    Ok(())
}

/// A sandbox that fails after our CNI ran is torn down (CNI DEL while its
/// namespace lives) and created again with a new namespace; the kubelet never
/// Allocates again and hands the same `/dev/tapN` to the containers. The
/// retried ADD gets the same link, and a VM on that `/dev/tapN` pings. Then
/// that sandbox dies without DEL (its namespace takes the macvtap along): the
/// device plugin re-creates the link with its ifindex, and the next retried
/// ADD works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_sandbox_gets_the_same_device_and_its_vm_pings() -> Result<()> {
    let mut steps = Steps::new();
    steps.step("sandbox node, test kubelet with PodResources, device plugin");
    let mut node = Node::new()?;
    let taps_before = node::tap_nodes();
    node.start_kubelet().await?;
    node.start_pod_resources().await?;
    let dp = node.start_device_plugin(GO_README_CONF, &FAST_RECLAIM)?;
    let mut client = node.plugin("dataplane", 50).await?;
    let guest = guest();

    steps.step("kubelet Allocate, once for the pod's whole life");
    let alloc = Node::allocate(&mut client, "dataplaneMvp2").await?;
    node.hold(&resource("dataplane"), &["dataplaneMvp2"])?;
    let index = alloc.ifindex()?;
    steps.say(format!(
        "{} -> {}",
        alloc.device_id,
        alloc.host_path.display()
    ));

    steps.step("first sandbox: CNI ADD, then a later network fails, so the runtime calls DEL");
    let nad = nad("1.0.0");
    let multus = Multus {
        node: &node.ns,
        nad_config: &nad,
        pod: ("default", "virt-launcher-vm-retry"),
        mac: VM_MAC,
    };
    let first = TestNs::new("sandbox-a")?;
    let add = multus.run("ADD", &first, "net1", Some(&alloc.device_id))?;
    ensure!(add.ok, "first CNI ADD failed: {} {}", add.json, add.stderr);
    let del = multus.run("DEL", &first, "net1", Some(&alloc.device_id))?;
    ensure!(del.ok, "CNI DEL failed: {}", del.json);
    node.returned_link(&alloc.device_id, index)?;
    drop(first);
    ensure!(
        alloc.host_path.exists(),
        "{} vanished with the first sandbox",
        alloc.host_path.display()
    );

    steps.step("second sandbox, new namespace: the retried CNI ADD");
    let second = TestNs::new("sandbox-b")?;
    let add = multus.run("ADD", &second, "net1", Some(&alloc.device_id))?;
    ensure!(
        add.ok,
        "retried CNI ADD failed: {} {}",
        add.json,
        add.stderr
    );
    let moved: serde_json::Value =
        serde_json::from_str(&second.ip(&["-j", "link", "show", "dev", "net1"])?)?;
    ensure!(
        moved[0]["ifindex"].as_u64() == Some(u64::from(index)),
        "the retried ADD got ifindex {} instead of {index}",
        moved[0]["ifindex"]
    );

    steps.step("QEMU in the new sandbox on the original DeviceSpec's /dev/tapN");
    let work = tempfile::tempdir()?;
    let run = tokio::task::block_in_place(|| {
        run_qemu(
            &second.name,
            &alloc.host_path,
            &guest,
            &net(VM_MAC, 20),
            work.path(),
        )
    })?;
    steps.say(run.markers());
    ensure!(
        run.ping_ok,
        "the guest in the re-created sandbox could not ping {PEER_IP}:\n{}",
        run.console
    );

    steps.step("the second sandbox dies without CNI DEL: its namespace takes the macvtap along");
    drop(second);
    let healed = Instant::now();
    let deadline = healed + node::WAIT;
    while node.returned_link(&alloc.device_id, index).is_err() {
        ensure!(
            Instant::now() < deadline,
            "the device plugin did not re-create the lost link; daemon log:\n{}",
            node.daemon_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    steps.say(format!(
        "the device plugin re-created it with ifindex {index} ({:.0} ms after the namespace went)",
        healed.elapsed().as_secs_f64() * 1e3
    ));

    steps.step("third sandbox: the retried CNI ADD works on the healed link");
    let third = TestNs::new("sandbox-c")?;
    let add = multus.run("ADD", &third, "net1", Some(&alloc.device_id))?;
    ensure!(
        add.ok,
        "CNI ADD after healing failed: {} {}",
        add.json,
        add.stderr
    );
    let moved: serde_json::Value =
        serde_json::from_str(&third.ip(&["-j", "link", "show", "dev", "net1"])?)?;
    ensure!(
        moved[0]["ifindex"].as_u64() == Some(u64::from(index)),
        "the healed link has ifindex {} instead of {index}",
        moved[0]["ifindex"]
    );
    ensure!(
        alloc.host_path.exists(),
        "{} is missing",
        alloc.host_path.display()
    );

    steps.step("teardown as a pod deletion");
    delete_pod(&node, &multus, third, &alloc, "dataplane")?;
    node.stop_device_plugin()?;
    nothing_left(&node, &taps_before, &[dp])?;
    println!("\n{}", steps.summary());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_without_the_resource_gets_the_cnis_error_and_no_link_moves() -> Result<()> {
    let mut node = Node::new()?;
    node.start_kubelet().await?;
    node.start_pod_resources().await?;
    node.start_device_plugin(GO_README_CONF, &FAST_RECLAIM)?;
    let mut client = node.plugin("dataplane", 50).await?;
    // Another pod holds a device: its link must stay where it is.
    Node::allocate(&mut client, "dataplaneMvp1").await?;
    node.hold(&resource("dataplane"), &["dataplaneMvp1"])?;
    let before = node.ns.links()?;
    let pod = TestNs::new("pod")?;
    let nad = nad("1.0.0");
    let multus = Multus {
        node: &node.ns,
        nad_config: &nad,
        pod: ("default", "no-resource"),
        mac: VM_MAC,
    };
    // Multus injects nothing: the pod did not request the resource.
    let add = multus.run("ADD", &pod, "net1", None)?;
    ensure!(!add.ok, "ADD without deviceID succeeded");
    ensure!(add.json["code"] == 100, "{}", add.json);
    let msg = add.json["msg"].as_str().unwrap_or_default();
    ensure!(
        msg.contains("k8s.v1.cni.cncf.io/resourceName"),
        "the error says what to fix: {msg}"
    );
    ensure!(node.ns.links()? == before, "links on the node changed");
    ensure!(
        pod.links()? == vec!["lo".to_string()],
        "something moved into the pod"
    );
    node.stop_device_plugin()?;
    Ok(())
}
