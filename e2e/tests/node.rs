//! Node end-to-end: a real VM on a macvtap made by our binaries, driven the
//! way kubelet, Multus and KubeVirt drive them. Each test builds a sandbox
//! node (network namespaces, a veth as the NIC, a temp kubelet dir), runs the
//! real device plugin against the test kubelet, allocates a device, runs the
//! real Multus (v4.2.2, with a fake API server and the test kubelet's
//! PodResources) as the runtime runs it, which runs our CNI, boots the guest
//! on the macvtap as virt-launcher does (QEMU as uid 107 on the tap fd, or
//! libvirtd in the pod namespace), and tears down as a pod deletion does,
//! checking nothing is left behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use anyhow::{Context, Result, ensure};
use macvtap_e2e::guest::{self, Guest};
use macvtap_e2e::multus::{Multus, MultusRun, Pod, kubevirt_pod_ifname};
use macvtap_e2e::node::{self, Allocation, FAST_RECLAIM, GUEST_IP, Node, PEER_IP};
use macvtap_e2e::sandbox::TestNs;
use macvtap_e2e::steps::Steps;
use macvtap_e2e::vm::{GuestNet, Libvirtd, QEMU_UID, VmIface, VmRun, run_qemu};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use test_kubelet::PluginClient;

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

fn nad(version: &str, name: &str) -> String {
    format!(r#"{{"cniVersion":"{version}","name":"{name}","type":"macvtap","mtu":1500}}"#)
}

/// The full name of resource `name`.
fn resource(name: &str) -> String {
    format!("{}/{name}", macvtap_link::RESOURCE_PREFIX)
}

/// A virt-launcher pod for a VM with one macvtap network `network` (whose
/// NAD has the same name), as virt-controller templates it: the selection
/// names the pod interface (`pod` + hash) and carries the VM's
/// `macAddress` only when the VM sets one.
fn vm_pod(vm: &str, network: &str, mac: Option<&str>) -> Pod {
    let mut sel = json!({"name": network, "namespace": "default",
                         "interface": kubevirt_pod_ifname(network)});
    if let Some(m) = mac {
        sel["mac"] = Value::from(m);
    }
    Pod {
        namespace: "default".into(),
        name: format!("virt-launcher-{vm}-x7k2p"),
        uid: format!("0b5e{:08x}-5c1d-4c39-9d55-3f0d2a7e61aa", vm.len()),
        networks: json!([sel]),
    }
}

/// What Multus did on ADD, checked against what the real one is known to
/// do: ran our plugin once as the selection's interface, with `deviceID`
/// and `pciBusID` injected, the pod's `K8S_*` pairs in `CNI_ARGS` (twice),
/// `MAC=` exactly when the selection has a MAC, and the node's settings
/// reaching the plugin; it asked the API server only what it serves; the
/// pod link exists under that name; the pod's network-status annotation
/// (PUT as protobuf) names it.
fn check_multus_add(
    multus: &Multus,
    add: &MultusRun,
    pod: &Pod,
    netns: &TestNs,
    alloc: &Allocation,
    mac: Option<&str>,
) -> Result<String> {
    ensure!(
        add.ok,
        "Multus ADD failed: {} {}\nMultus log:\n{}",
        add.json,
        add.stderr,
        multus.log()
    );
    let ifname = pod.networks[0]["interface"].as_str().unwrap().to_string();
    let calls = add.calls_of("macvtap");
    ensure!(calls.len() == 1, "Multus ran macvtap {} times", calls.len());
    let c = calls[0];
    ensure!(c.command == "ADD" && c.ifname == ifname, "{c:?}");
    ensure!(
        c.config["deviceID"] == alloc.device_id.as_str(),
        "{}",
        c.config
    );
    ensure!(
        c.config["pciBusID"] == alloc.device_id.as_str(),
        "{}",
        c.config
    );
    for pair in [
        format!("K8S_POD_NAMESPACE={}", pod.namespace),
        format!("K8S_POD_NAME={}", pod.name),
        format!("K8S_POD_UID={}", pod.uid),
        "K8S_POD_INFRA_CONTAINER_ID=".to_string(),
    ] {
        ensure!(c.args.contains(&pair), "CNI_ARGS {} lacks {pair}", c.args);
    }
    match mac {
        Some(m) => ensure!(
            c.args.contains(&format!("MAC={m}")),
            "no MAC= in {}",
            c.args
        ),
        None => ensure!(
            !c.args.contains("MAC="),
            "MAC= without a selection MAC: {}",
            c.args
        ),
    }
    // Multus appends its own K8S_* pairs to the runtime's CNI_ARGS.
    ensure!(
        c.args
            .matches(&format!("K8S_POD_NAME={};", pod.name))
            .count()
            == 2,
        "CNI_ARGS does not repeat the pod's pairs as Multus does: {}",
        c.args
    );
    ensure!(
        c.settings_env,
        "MACVTAP_CNI_SETTINGS did not reach the plugin"
    );
    let unserved: Vec<String> = multus
        .api
        .log()
        .into_iter()
        .filter(|r| !(200..300).contains(&r.status))
        .map(|r| format!("{} {} -> {}", r.method, r.path, r.status))
        .collect();
    ensure!(
        unserved.is_empty(),
        "Multus asked the API server for what it does not serve: {unserved:?}"
    );
    ensure!(
        netns.links()?.contains(&ifname),
        "{ifname} is not in the pod"
    );
    let status = multus.network_status(pod)?;
    let ours = status
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|s| s["name"] == "default/dataplane" || s["interface"] == ifname.as_str())
        })
        .cloned()
        .unwrap_or(Value::Null);
    ensure!(
        ours["interface"] == ifname.as_str(),
        "network-status does not list {ifname}: {status}"
    );
    if let Some(m) = mac {
        ensure!(ours["mac"] == m, "network-status MAC: {status}");
    }
    Ok(ifname)
}

/// A pod deletion as a node does it: Multus DEL (our plugin gets the cached
/// config, with `deviceID` and without `MAC=`; the macvtap goes back to the
/// node namespace with its ifindex), the pod namespace removed, the kubelet
/// frees the device (PodResources no longer lists it), and the device
/// plugin's reclaim removes the link after its grace.
fn delete_pod(
    node: &Node,
    multus: &Multus,
    pod: &Pod,
    netns: TestNs,
    alloc: &Allocation,
    resource_name: &str,
) -> Result<()> {
    let del = multus.run("DEL", pod, &netns)?;
    ensure!(del.ok, "Multus DEL failed: {} {}", del.json, del.stderr);
    let calls = del.calls_of("macvtap");
    ensure!(
        calls.len() == 1,
        "Multus DEL ran macvtap {} times",
        calls.len()
    );
    ensure!(
        calls[0].config["deviceID"] == alloc.device_id.as_str(),
        "DEL config: {}",
        calls[0].config
    );
    ensure!(
        !calls[0].args.contains("MAC="),
        "DEL carries MAC=: {}",
        calls[0].args
    );
    node.returned_link(&alloc.device_id, alloc.ifindex()?)?;
    drop(netns);
    node.hold(&resource(resource_name), &[])?;
    node.wait_for_reclaim()
}

/// The pod link's flags contain `flag`.
fn has_flag(netns: &TestNs, ifname: &str, flag: &str) -> Result<bool> {
    let v = netns.link_json(ifname)?.unwrap_or_default();
    Ok(v["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == flag)))
}

/// What every test here starts from: a sandbox node with the test kubelet
/// and its PodResources, the real device plugin registered with the
/// kubelet, the kubelet's client for its resource, and the real Multus.
struct Setup {
    node: Node,
    /// The `/dev/tap*` nodes before the device plugin ran.
    taps_before: Vec<String>,
    /// The device plugin's process.
    dp: u32,
    /// The kubelet's client for the plugin's resource.
    client: PluginClient,
    multus: Multus,
}

impl Setup {
    /// Starts the device plugin with `DP_MACVTAP_CONF` = `conf` and `args`,
    /// and waits until it registered `resource_name` with `capacity` devices.
    async fn start(
        conf: &str,
        args: &[&str],
        resource_name: &str,
        capacity: usize,
    ) -> Result<Self> {
        let mut node = Node::new()?;
        let taps_before = node::tap_nodes();
        node.start_kubelet().await?;
        node.start_pod_resources().await?;
        let dp = node.start_device_plugin(conf, args)?;
        let client = node.plugin(resource_name, capacity).await?;
        let multus = Multus::start(&node)?;
        Ok(Self {
            node,
            taps_before,
            dp,
            client,
            multus,
        })
    }

    /// The kubelet's Allocate of `device_id` of resource `resource_name`
    /// for pod `namespace/name`, which PodResources then lists as its.
    async fn allocate_for(
        &mut self,
        namespace: &str,
        name: &str,
        resource_name: &str,
        device_id: &str,
    ) -> Result<Allocation> {
        let alloc = Node::allocate(&mut self.client, device_id).await?;
        self.node
            .hold_pod(namespace, name, &resource(resource_name), &[device_id])?;
        Ok(alloc)
    }

    /// The NAD of `pod`'s network (named as the network, annotated with the
    /// resource of the same name, config `nad_config`), then a successful
    /// Multus ADD in a new pod namespace, checked with [`check_multus_add`].
    /// Returns the namespace, the run and the pod interface's name.
    fn add_pod(
        &self,
        steps: &Steps,
        pod: &Pod,
        nad_config: &str,
        alloc: &Allocation,
        mac: Option<&str>,
    ) -> Result<(TestNs, MultusRun, String)> {
        let network = pod.networks[0]["name"].as_str().context("network name")?;
        self.multus
            .add_nad("default", network, Some(&resource(network)), nad_config);
        self.multus.add_pod(pod);
        let netns = TestNs::new("pod")?;
        let add = self.multus.run("ADD", pod, &netns)?;
        let ifname = check_multus_add(&self.multus, &add, pod, &netns, alloc, mac)?;
        for l in add.describe() {
            steps.say(l);
        }
        Ok((netns, add, ifname))
    }

    /// The end of a test: `pod` deleted as a node does it ([`delete_pod`]),
    /// the device plugin stopped, and [`nothing_left`] (none of `pids` nor
    /// the device plugin alive).
    fn finish(
        mut self,
        steps: &mut Steps,
        pod: &Pod,
        netns: TestNs,
        alloc: &Allocation,
        resource_name: &str,
        pids: &[u32],
    ) -> Result<()> {
        delete_pod(&self.node, &self.multus, pod, netns, alloc, resource_name)?;
        self.node.stop_device_plugin()?;
        let mut all = vec![self.dp];
        all.extend_from_slice(pids);
        node::nothing_left(&self.node, &self.taps_before, &all)?;
        println!("\n{}", steps.summary());
        Ok(())
    }
}

/// QEMU as uid 107 in `netns` on the Allocate response's `/dev/tapN`, as
/// virt-launcher runs it, with the guest's MAC `mac` and `tries` pings.
fn boot_qemu(
    steps: &Steps,
    netns: &TestNs,
    alloc: &Allocation,
    guest: &Guest,
    mac: &str,
    tries: u32,
    work: &Path,
) -> Result<VmRun> {
    let run = tokio::task::block_in_place(|| {
        run_qemu(&netns.name, &alloc.host_path, guest, &net(mac, tries), work)
    })?;
    steps.say(run.markers());
    Ok(run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_vm_pings_through_the_macvtap_and_a_wrong_mac_does_not() -> Result<()> {
    let mut steps = Steps::new();
    steps.step("sandbox node, test kubelet, device plugin with the Go README's DP_MACVTAP_CONF");
    let mut setup = Setup::start(GO_README_CONF, &FAST_RECLAIM, "dataplane", 50).await?;
    let guest = guest();

    steps.step("kubelet Allocate for the VM pod (its VM sets macAddress)");
    let pod = vm_pod("vm-1", "dataplane", Some(VM_MAC));
    let alloc = setup
        .allocate_for(&pod.namespace, &pod.name, "dataplane", "dataplaneMvp0")
        .await?;
    steps.say(format!(
        "{} -> {} ({:.1} ms)",
        alloc.device_id,
        alloc.host_path.display(),
        alloc.took.as_secs_f64() * 1e3
    ));
    let link = macvtap_link::link_name_for_device("dataplaneMvp0");
    ensure!(
        setup.node.ns.links()?.contains(&link),
        "Allocate made {link}"
    );

    steps.step("Multus ADD (NAD cniVersion 0.3.1, resourceName annotation)");
    let (netns, _, ifname) = setup.add_pod(
        &steps,
        &pod,
        &nad("0.3.1", "dataplane"),
        &alloc,
        Some(VM_MAC),
    )?;
    ensure!(
        ifname == "pod9d32cad27e2",
        "KubeVirt's name for dataplane: {ifname}"
    );
    ensure!(
        !setup.node.ns.links()?.contains(&link),
        "the link left the node namespace"
    );
    ensure!(
        alloc.host_path.exists(),
        "{} still names the link",
        alloc.host_path.display()
    );

    steps.step("QEMU as uid 107 in the pod namespace on the Allocate response's tap");
    let work = tempfile::tempdir()?;
    let run = boot_qemu(&steps, &netns, &alloc, &guest, VM_MAC, 20, work.path())?;
    steps.say(format!("held the tap: {:?}", run.tap_holders));
    ensure!(
        run.ping_ok,
        "the guest could not ping {PEER_IP}:\n{}",
        run.console
    );
    ensure!(
        !run.tap_holders.is_empty()
            && run
                .tap_holders
                .iter()
                .all(|h| h.uid == QEMU_UID && h.gid == QEMU_UID),
        "the tap was not held by uid/gid {QEMU_UID}: {:?}",
        run.tap_holders
    );

    steps.step("negative: a guest MAC other than the one given to the CNI gets no connectivity");
    let wrong = boot_qemu(
        &steps,
        &netns,
        &alloc,
        &guest,
        "52:54:00:00:00:99",
        3,
        work.path(),
    )?;
    ensure!(
        !wrong.ping_ok && wrong.console.contains(guest::PING_FAIL),
        "ping worked with the wrong MAC"
    );

    steps.step(
        "teardown as a pod deletion: Multus DEL gives the link back, pod namespace removed, \
         device freed, link reclaimed, daemon stopped",
    );
    setup.finish(&mut steps, &pod, netns, &alloc, "dataplane", &[])
}

/// virt-launcher's libvirt, as KubeVirt runs it, for a VM without
/// `macAddress`, with multiqueue (two queues) and a NAD MTU below the NIC's:
/// libvirtd and QEMU run as uid 107, libvirt opens the tap once per queue,
/// the domain takes the link's own MAC and MTU, and the guest sees both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virt_launcher_libvirt_runs_a_multiqueue_vm_with_the_links_mac_and_mtu() -> Result<()> {
    let mut steps = Steps::new();
    steps.step("sandbox node, test kubelet, device plugin, Multus");
    let mut setup = Setup::start(GO_README_CONF, &FAST_RECLAIM, "dataplane", 50).await?;
    let guest = guest();

    steps.step("Allocate, Multus ADD (NAD cniVersion 1.0.0, mtu 1400; the VM sets no MAC)");
    let pod = vm_pod("vm-2", "dataplane", None);
    let alloc = setup
        .allocate_for(&pod.namespace, &pod.name, "dataplane", "dataplaneMvp7")
        .await?;
    let link = macvtap_link::link_name_for_device("dataplaneMvp7");
    let before = setup
        .node
        .ns
        .link_json(&link)?
        .context("the allocated link")?;
    let own_mac = before["address"].as_str().unwrap().to_string();
    let (netns, _, ifname) = setup.add_pod(
        &steps,
        &pod,
        r#"{"cniVersion":"1.0.0","name":"dataplane","type":"macvtap","mtu":1400}"#,
        &alloc,
        None,
    )?;

    steps.step("libvirtd in the pod namespace as virt-launcher runs it (uid 107, session)");
    let lv_dir = tempfile::tempdir()?;
    let libvirtd = tokio::task::block_in_place(|| Libvirtd::start(&netns.name, lv_dir.path()))?;
    let lv_pid = libvirtd.pid();

    steps.step("domain: unmanaged ethernet interface, the link's MAC and MTU, two queues");
    let vm = VmIface {
        mac_address: None,
        queues: 2,
    };
    let (run, xml) = tokio::task::block_in_place(|| {
        libvirtd.run_vm(
            "vm-macvtap",
            &netns.name,
            &ifname,
            &vm,
            &guest,
            &net(&own_mac, 20),
        )
    })?;
    steps.say(run.markers());
    // The QEMUs to check for later are those seen holding the tap while the
    // domain ran: libvirtd's children sampled now, after the domain ended,
    // could never show one.
    let qemus: Vec<u32> = run
        .tap_holders
        .iter()
        .filter(|h| h.comm.starts_with("qemu"))
        .map(|h| h.pid)
        .collect();
    ensure!(!qemus.is_empty(), "no QEMU was seen holding the tap");
    ensure!(
        run.ping_ok,
        "the guest could not ping {PEER_IP}:\n{}",
        run.console
    );
    ensure!(
        xml.contains(&format!("<mac address='{own_mac}'/>")),
        "{xml}"
    );
    ensure!(xml.contains("<mtu size='1400'/>"), "{xml}");
    ensure!(
        xml.contains(&format!("<target dev='{ifname}' managed='no'/>")),
        "{xml}"
    );
    ensure!(
        run.console
            .contains(&format!("mac={own_mac} mtu=1400 queues=2")),
        "the guest did not see the link's MAC, MTU 1400 and two queues:\n{}",
        run.markers()
    );
    let holders = &run.tap_holders;
    steps.say(format!("held the tap: {holders:?}"));
    let lv_uid = std::fs::read_to_string(format!("/proc/{lv_pid}/status"))?
        .lines()
        .find_map(|l| {
            l.strip_prefix("Uid:")
                .map(|r| r.split_whitespace().next().unwrap_or("").to_string())
        })
        .unwrap_or_default();
    ensure!(
        lv_uid == QEMU_UID.to_string(),
        "libvirtd runs as uid {lv_uid}"
    );
    ensure!(
        holders.len() == 1
            && holders[0].comm.starts_with("qemu")
            && holders[0].uid == QEMU_UID
            && holders[0].gid == QEMU_UID
            && holders[0].fds == 2,
        "expected QEMU as {QEMU_UID} holding the tap once per queue: {holders:?}"
    );
    let pod_link = netns.link_json(&ifname)?.context("the pod link")?;
    ensure!(
        pod_link["address"] == own_mac.as_str(),
        "the link's MAC changed: {}",
        pod_link["address"]
    );

    steps.step("teardown: libvirtd stopped, Multus DEL, pod namespace removed, link reclaimed");
    drop(libvirtd);
    let mut pids = vec![lv_pid];
    pids.extend(qemus);
    setup.finish(&mut steps, &pod, netns, &alloc, "dataplane", &pids)
}

/// Auto-discovery, with a conflist NAD (ours, then the reference `tuning`
/// plugin): Multus injects `deviceID` into both, tuning acts on the link our
/// plugin moved, and a VM pings through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_discovery_resource_with_a_conflist_nad_carries_a_vm() -> Result<()> {
    let mut steps = Steps::new();
    steps.step("device plugin with DP_MACVTAP_CONF=[] (auto-discovery; veth counts as a NIC here)");
    let mut setup = Setup::start(
        "[]",
        &[
            "--discover-kinds",
            "veth",
            FAST_RECLAIM[0],
            FAST_RECLAIM[1],
            FAST_RECLAIM[2],
            FAST_RECLAIM[3],
        ],
        "lower0",
        100,
    )
    .await?;
    let guest = guest();

    steps.step("Allocate lower0Mvp3, Multus ADD with a conflist NAD (macvtap, then tuning)");
    let pod = vm_pod("vm-3", "lower0", Some(VM_MAC));
    let alloc = setup
        .allocate_for(&pod.namespace, &pod.name, "lower0", "lower0Mvp3")
        .await?;
    // tuning keeps what it changed in its data dir: a temp dir, not /run.
    let tuning_dir = tempfile::tempdir()?;
    let conflist = json!({"cniVersion": "1.0.0", "name": "lower0", "plugins": [
        {"type": "macvtap", "mtu": 1500},
        {"type": "tuning", "allmulti": true, "dataDir": tuning_dir.path()}]});
    let (netns, add, ifname) =
        setup.add_pod(&steps, &pod, &conflist.to_string(), &alloc, Some(VM_MAC))?;
    let tuning = add.calls_of("tuning");
    ensure!(
        tuning.len() == 1,
        "Multus ran tuning {} times",
        tuning.len()
    );
    ensure!(
        tuning[0].config["deviceID"] == "lower0Mvp3" && tuning[0].ifname == ifname,
        "tuning got {} as {}",
        tuning[0].config,
        tuning[0].ifname
    );
    ensure!(
        tuning[0].config["prevResult"]["interfaces"][0]["name"] == ifname.as_str(),
        "tuning's prevResult is not our result: {}",
        tuning[0].config
    );
    ensure!(
        has_flag(&netns, &ifname, "ALLMULTI")?,
        "tuning did not set allmulti on {ifname}"
    );

    steps.step("QEMU on the tap");
    let work = tempfile::tempdir()?;
    let run = boot_qemu(&steps, &netns, &alloc, &guest, VM_MAC, 20, work.path())?;
    ensure!(
        run.ping_ok,
        "the guest could not ping {PEER_IP}:\n{}",
        run.console
    );

    steps.step("teardown");
    setup.finish(&mut steps, &pod, netns, &alloc, "lower0", &[])
}

/// A sandbox whose second network fails after our CNI ran (the real Multus
/// rolls back with DEL, the runtime calls DEL while the namespace lives and
/// removes it) is created again with a new namespace; the kubelet never
/// Allocates again and hands the same `/dev/tapN` to the containers. The
/// retried ADD gets the same link, and a VM on that `/dev/tapN` pings. Then
/// that sandbox dies without DEL (its namespace takes the macvtap along): the
/// device plugin re-creates the link with its ifindex, and the next retried
/// ADD works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_sandbox_gets_the_same_device_and_its_vm_pings() -> Result<()> {
    let mut steps = Steps::new();
    steps.step("sandbox node, test kubelet with PodResources, device plugin, Multus");
    let mut setup = Setup::start(GO_README_CONF, &FAST_RECLAIM, "dataplane", 50).await?;
    let guest = guest();

    steps.step("kubelet Allocate, once for the pod's whole life");
    let mut pod = vm_pod("vm-retry", "dataplane", Some(VM_MAC));
    // A second network whose plugin fails its first ADD (as one does while
    // a node's network is still starting) and works afterwards.
    pod.networks
        .as_array_mut()
        .context("networks")?
        .push(json!({"name": "flaky", "namespace": "default", "interface": "net2"}));
    let flaky_state = tempfile::tempdir()?;
    setup.multus.add_plugin(
        "flaky",
        &format!(
            "#!/bin/sh\ncat >/dev/null\nstate={}/failed-once\n\
             case \"$CNI_COMMAND\" in\n\
             ADD) if [ ! -e \"$state\" ]; then touch \"$state\"; \
             echo '{{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"not ready yet\"}}'; exit 1; fi\n\
             echo '{{\"cniVersion\":\"1.0.0\"}}';;\n\
             VERSION) echo '{{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"1.0.0\"]}}';;\n\
             esac\n",
            flaky_state.path().display()
        ),
    )?;
    setup.multus.add_nad(
        "default",
        "flaky",
        None,
        r#"{"cniVersion":"1.0.0","name":"flaky","type":"flaky"}"#,
    );
    let alloc = setup
        .allocate_for(&pod.namespace, &pod.name, "dataplane", "dataplaneMvp2")
        .await?;
    let index = alloc.ifindex()?;
    steps.say(format!(
        "{} -> {}",
        alloc.device_id,
        alloc.host_path.display()
    ));
    setup.multus.add_nad(
        "default",
        "dataplane",
        Some(&resource("dataplane")),
        &nad("1.0.0", "dataplane"),
    );
    setup.multus.add_pod(&pod);

    steps.step(
        "first sandbox: Multus ADD runs our network, then the second network fails: \
         Multus rolls back, the runtime calls DEL and removes the namespace",
    );
    let first = TestNs::new("sandbox-a")?;
    let add = setup.multus.run("ADD", &pod, &first)?;
    ensure!(
        !add.ok,
        "the first ADD should fail on the flaky network: {}",
        add.json
    );
    let ours: Vec<&str> = add
        .calls_of("macvtap")
        .iter()
        .map(|c| c.command.as_str())
        .collect();
    ensure!(
        ours == ["ADD", "DEL"],
        "Multus ran our plugin {ours:?} (expected ADD, then DEL on the rollback)"
    );
    steps.say(format!("Multus: {}", add.json["msg"]));
    setup.node.returned_link(&alloc.device_id, index)?;
    let del = setup.multus.run("DEL", &pod, &first)?;
    ensure!(del.ok, "Multus DEL failed: {} {}", del.json, del.stderr);
    setup.node.returned_link(&alloc.device_id, index)?;
    drop(first);
    let ifname = pod.networks[0]["interface"]
        .as_str()
        .context("interface")?
        .to_string();
    ensure!(
        alloc.host_path.exists(),
        "{} vanished with the first sandbox",
        alloc.host_path.display()
    );

    steps.step("second sandbox, new namespace: the retried Multus ADD, both networks work");
    let second = TestNs::new("sandbox-b")?;
    let add = setup.multus.run("ADD", &pod, &second)?;
    check_multus_add(&setup.multus, &add, &pod, &second, &alloc, Some(VM_MAC))?;
    let moved = second.link_json(&ifname)?.unwrap_or_default();
    ensure!(
        moved["ifindex"].as_u64() == Some(u64::from(index)),
        "the retried ADD got ifindex {} instead of {index}",
        moved["ifindex"]
    );

    steps.step("QEMU in the new sandbox on the original DeviceSpec's /dev/tapN");
    let work = tempfile::tempdir()?;
    let run = boot_qemu(&steps, &second, &alloc, &guest, VM_MAC, 20, work.path())?;
    ensure!(
        run.ping_ok,
        "the guest in the re-created sandbox could not ping {PEER_IP}:\n{}",
        run.console
    );

    steps.step("the second sandbox dies without CNI DEL: its namespace takes the macvtap along");
    drop(second);
    let healed = Instant::now();
    let deadline = healed + node::WAIT;
    while setup.node.returned_link(&alloc.device_id, index).is_err() {
        ensure!(
            Instant::now() < deadline,
            "the device plugin did not re-create the lost link; daemon log:\n{}",
            setup.node.daemon_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    steps.say(format!(
        "the device plugin re-created it with ifindex {index} ({:.0} ms after the namespace went)",
        healed.elapsed().as_secs_f64() * 1e3
    ));

    steps.step("third sandbox: the retried Multus ADD works on the healed link");
    let third = TestNs::new("sandbox-c")?;
    let add = setup.multus.run("ADD", &pod, &third)?;
    check_multus_add(&setup.multus, &add, &pod, &third, &alloc, Some(VM_MAC))?;
    let moved = third.link_json(&ifname)?.unwrap_or_default();
    ensure!(
        moved["ifindex"].as_u64() == Some(u64::from(index)),
        "the healed link has ifindex {} instead of {index}",
        moved["ifindex"]
    );
    ensure!(
        alloc.host_path.exists(),
        "{} is missing",
        alloc.host_path.display()
    );

    steps.step("teardown as a pod deletion");
    setup.finish(&mut steps, &pod, third, &alloc, "dataplane", &[])
}

/// A pod whose network names the macvtap NAD but that holds no device:
/// Multus finds none in PodResources and injects no `deviceID`; our plugin's
/// error reaches the runtime through Multus, Multus rolls back with DEL,
/// and no link moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_without_the_resource_gets_the_cnis_error_and_no_link_moves() -> Result<()> {
    let mut setup = Setup::start(GO_README_CONF, &FAST_RECLAIM, "dataplane", 50).await?;
    // Another pod holds a device: its link must stay where it is.
    setup
        .allocate_for("default", "other-pod", "dataplane", "dataplaneMvp1")
        .await?;
    let (node, multus) = (&mut setup.node, &setup.multus);
    let before = node.ns.links()?;
    multus.add_nad(
        "default",
        "dataplane",
        Some(&resource("dataplane")),
        &nad("1.0.0", "dataplane"),
    );
    let pod = vm_pod("no-resource", "dataplane", Some(VM_MAC));
    multus.add_pod(&pod);
    let netns = TestNs::new("pod")?;
    let add = multus.run("ADD", &pod, &netns)?;
    ensure!(!add.ok, "ADD without a device succeeded: {}", add.json);
    // Multus ran our ADD without a device, and after its failure our DEL
    // (it tears down what it tried, `delPlugins` in pkg/multus/multus.go).
    let calls: Vec<(&str, bool)> = add
        .calls_of("macvtap")
        .iter()
        .map(|c| (c.command.as_str(), c.config.get("deviceID").is_some()))
        .collect();
    ensure!(
        calls == [("ADD", false), ("DEL", false)],
        "Multus ran (command, with deviceID): {calls:?}"
    );
    let msg = add.json["msg"].as_str().unwrap_or_default().to_string()
        + add.json["details"].as_str().unwrap_or_default();
    ensure!(
        msg.contains("k8s.v1.cni.cncf.io/resourceName"),
        "the error that reaches the runtime says what to fix: {}",
        add.json
    );
    ensure!(node.ns.links()? == before, "links on the node changed");
    ensure!(
        netns.links()? == vec!["lo".to_string()],
        "something moved into the pod"
    );
    node.stop_device_plugin()?;
    Ok(())
}
