//! `macvtap-sandbox`: the main job on one machine. A throwaway sandbox node
//! where the real device plugin registers with a test kubelet, a device is
//! allocated as for an admitted VM pod, the real Multus (v4.2.2, built once
//! from its pinned module, `hack/peers/multus`) runs our CNI as a runtime runs Multus, a VM boots on the
//! macvtap (QEMU as uid 107, as virt-launcher) and pings a peer host, and
//! everything is cleaned up. Each step is printed in plain words. Run by `hack/sandbox.sh`.

use anyhow::{Context, Result, ensure};
use macvtap_e2e::guest;
use macvtap_e2e::multus::{self, Multus, Pod, kubevirt_pod_ifname};
use macvtap_e2e::node::{self, FAST_RECLAIM, GUEST_IP, Node, PEER_IP};
use macvtap_e2e::sandbox::{TestNs, require_root};
use macvtap_e2e::steps::Steps;
use macvtap_e2e::vm::{GuestNet, run_qemu};
use std::path::Path;

const CONF: &str = r#"[{"name":"dataplane","lowerDevice":"lower0","mode":"bridge","capacity":50}]"#;
const NAD: &str = r#"{"cniVersion":"1.0.0","name":"dataplane","type":"macvtap","mtu":1500}"#;
const POD: &str = "virt-launcher-vm-demo-x7k2p";
const VM_MAC: &str = "52:54:00:c0:ff:ee";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    macvtap_e2e::exit::report(run().await)
}

async fn run() -> Result<()> {
    require_root()?;
    let mut s = Steps::new();

    s.step("building the test guest (Debian cloud kernel + busybox initramfs; cached)");
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-guest");
    let guest = tokio::task::block_in_place(|| guest::build(&cache))?;
    s.say(format!(
        "kernel {} ({}), initramfs {}",
        guest.kernel.display(),
        guest.release,
        guest.initrd.display()
    ));

    s.step("a sandbox node in network namespaces");
    let mut n = Node::new()?;
    s.say(format!(
        "node netns {} with NIC lower0 (one end of a veth)",
        n.ns.name
    ));
    s.say(format!(
        "peer host netns {} at {PEER_IP}/24 on the other end",
        n.peer.name
    ));
    s.say(format!("kubelet dir {}", n.kubelet_dir.path().display()));

    s.step("test kubelet and the macvtap device plugin");
    n.start_kubelet().await?;
    n.start_pod_resources().await?;
    let pid = n.start_device_plugin(CONF, &FAST_RECLAIM)?;
    s.say(format!(
        "macvtap-deviceplugin (pid {pid}) with DP_MACVTAP_CONF={CONF} {}",
        FAST_RECLAIM.join(" ")
    ));
    let mut client = n.plugin("dataplane", 50).await?;
    s.say(
        "registered macvtap.network.kubevirt.io/dataplane; ListAndWatch shows 50 healthy devices",
    );

    s.step(
        "the real Multus (built once from hack/peers/multus through the Go module proxy, cached)",
    );
    let multus = tokio::task::block_in_place(|| Multus::start(&n))?;
    s.say(format!(
        "{} {}, a fake API server at {} in the node namespace, {} -> the test kubelet's PodResources",
        multus.binary().display(),
        multus::VERSION,
        multus.api.url,
        multus::HOST_POD_RESOURCES
    ));
    let resource = format!("{}/dataplane", macvtap_link::RESOURCE_PREFIX);
    multus.add_nad("default", "dataplane", Some(&resource), NAD);
    let pod_obj = Pod {
        namespace: "default".into(),
        name: POD.into(),
        uid: "5d1f3c2e-8a4b-4e0f-9c7d-2b6a1e9f0c11".into(),
        networks: serde_json::json!([{"name": "dataplane", "namespace": "default",
            "interface": kubevirt_pod_ifname("dataplane"), "mac": VM_MAC}]),
    };
    multus.add_pod(&pod_obj);
    s.say(format!(
        "NAD default/dataplane ({NAD}, resourceName {resource}); pod default/{POD} with networks {}",
        pod_obj.networks
    ));

    s.step("the kubelet admits the VM pod: Allocate one device");
    let alloc = Node::allocate(&mut client, "dataplaneMvp0").await?;
    n.hold_pod("default", POD, &resource, &[&alloc.device_id])?;
    let link = macvtap_link::link_name_for_device(&alloc.device_id);
    s.say(format!(
        "device {} -> macvtap {link} on lower0 in the node namespace, {} for the pod ({:.1} ms)",
        alloc.device_id,
        alloc.host_path.display(),
        alloc.took.as_secs_f64() * 1e3
    ));

    s.step("the runtime runs Multus (ADD, CNI_IFNAME=eth0); Multus runs loopback, then macvtap");
    let pod = TestNs::new("pod")?;
    let add = multus.run("ADD", &pod_obj, &pod)?;
    ensure!(
        add.ok,
        "Multus ADD failed: {} {}\n{}",
        add.json,
        add.stderr,
        multus.log()
    );
    for line in add.describe() {
        s.say(format!("Multus ran: {line}"));
    }
    let ifname = kubevirt_pod_ifname("dataplane");
    s.say(format!(
        "pod netns {}: {link} is now {ifname}, MAC {VM_MAC}, up ({:.1} ms for Multus and its delegates)",
        pod.name,
        add.took.as_secs_f64() * 1e3
    ));
    s.say(format!(
        "network-status: {}",
        multus.network_status(&pod_obj)?
    ));

    s.step("virt-launcher's part: QEMU (TCG) as uid 107 in the pod namespace on the tap fd");
    let work = tempfile::tempdir()?;
    let net = GuestNet {
        mac: VM_MAC.into(),
        ip: GUEST_IP.into(),
        peer: PEER_IP.into(),
        tries: 20,
    };
    let run = tokio::task::block_in_place(|| {
        run_qemu(&pod.name, &alloc.host_path, &guest, &net, work.path())
    })?;
    for line in run.markers().lines() {
        s.say(format!("guest: {line}"));
    }
    ensure!(
        run.ping_ok,
        "the VM could not ping the peer:\n{}",
        run.console
    );
    s.say(format!(
        "the VM at {GUEST_IP} pinged {PEER_IP} through the macvtap ({:.1} s from start)",
        run.total.as_secs_f64()
    ));

    s.step("the pod is deleted: Multus DEL (from its cache) gives the macvtap back to the node");
    let del = multus.run("DEL", &pod_obj, &pod)?;
    ensure!(del.ok, "Multus DEL failed: {} {}", del.json, del.stderr);
    for line in del.describe() {
        s.say(format!("Multus ran: {line}"));
    }
    n.returned_link(&alloc.device_id, alloc.ifindex()?)?;
    s.say(format!(
        "{link} is back in the node namespace, down, still {} (a re-created sandbox would get it again)",
        alloc.host_path.display()
    ));
    drop(pod);

    s.step("the kubelet frees the device; the device plugin reclaims the link after its grace");
    n.hold(&resource, &[])?;
    n.wait_for_reclaim()?;
    s.say(format!("{link} removed by the device plugin"));

    s.step("the device plugin stops");
    n.stop_device_plugin()
        .context("stopping the device plugin")?;
    ensure!(!node::alive(pid), "the device plugin is still running");
    s.say("no macvtap left, the device plugin exited cleanly; the namespaces go next");
    drop(multus);
    drop(n);

    println!("\nsandbox done\n\n{}", s.summary());
    Ok(())
}
