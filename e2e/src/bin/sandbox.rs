//! `macvtap-sandbox`: the main job on one machine. A throwaway sandbox node
//! where the real device plugin registers with a test kubelet, a device is
//! allocated as for an admitted VM pod, the real CNI runs as Multus runs it,
//! a VM boots on the macvtap and pings a peer host, and everything is
//! cleaned up. Each step is printed in plain words. Run by `hack/sandbox.sh`.

use anyhow::{Context, Result, ensure};
use macvtap_e2e::guest;
use macvtap_e2e::node::{self, FAST_RECLAIM, GUEST_IP, Multus, Node, PEER_IP};
use macvtap_e2e::sandbox::{TestNs, require_root};
use macvtap_e2e::steps::Steps;
use macvtap_e2e::vm::{GuestNet, run_qemu};
use std::path::Path;

const CONF: &str = r#"[{"name":"dataplane","lowerDevice":"lower0","mode":"bridge","capacity":50}]"#;
const NAD: &str = r#"{"cniVersion":"1.0.0","name":"dataplane","type":"macvtap","mtu":1500}"#;
const VM_MAC: &str = "52:54:00:c0:ff:ee";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
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

    s.step("the kubelet admits a VM pod: Allocate one device");
    let alloc = Node::allocate(&mut client, "dataplaneMvp0").await?;
    let resource = format!("{}/dataplane", macvtap_link::RESOURCE_PREFIX);
    n.hold(&resource, &[&alloc.device_id])?;
    let link = macvtap_link::link_name_for_device(&alloc.device_id);
    s.say(format!(
        "device {} -> macvtap {link} on lower0 in the node namespace, {} for the pod ({:.1} ms)",
        alloc.device_id,
        alloc.host_path.display(),
        alloc.took.as_secs_f64() * 1e3
    ));

    s.step("Multus runs the macvtap CNI (ADD) with the deviceID");
    let pod = TestNs::new("pod")?;
    let multus = Multus {
        node: &n.ns,
        nad_config: NAD,
        pod: ("default", "virt-launcher-vm-demo"),
        mac: VM_MAC,
    };
    let add = multus.run("ADD", &pod, "net1", Some(&alloc.device_id))?;
    ensure!(add.ok, "CNI ADD failed: {} {}", add.json, add.stderr);
    s.say(format!(
        "pod netns {}: {link} is now net1, MAC {VM_MAC}, up ({:.1} ms)",
        pod.name,
        add.took.as_secs_f64() * 1e3
    ));
    s.say(format!("result: {}", add.json));

    s.step("virt-launcher's part: QEMU (TCG) in the pod namespace on the tap fd");
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

    s.step("the pod is deleted: CNI DEL gives the macvtap back to the node");
    let del = multus.run("DEL", &pod, "net1", Some(&alloc.device_id))?;
    ensure!(del.ok, "CNI DEL failed: {}", del.json);
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
    drop(n);

    println!("\nsandbox done\n\n{}", s.summary());
    Ok(())
}
