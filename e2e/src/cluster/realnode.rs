//! What the real-node tests (`tests/cluster.rs`) and the DRA bench set up on
//! the cluster: the node's NIC (a veth whose peer sits in a namespace of the
//! caller, with TEST-NET-2 addresses), our DaemonSet installed with
//! kustomize on the device plugin front or the DRA front, the example
//! DeviceClass and NAD, and VM pods in KubeVirt's shape.

use super::{Cluster, last_lines, vm_rootfs};
use crate::multus::kubevirt_pod_ifname;
use crate::runtime::repo_root;
use crate::sandbox::{TestNs, ip};
use anyhow::Result;
use serde_json::{Value, json};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Our namespace.
pub const NS: &str = "macvtap-system";
/// Our DaemonSet.
pub const DS: &str = "macvtap-cni";
/// Our daemon's container.
pub const DAEMON: &str = "macvtap-deviceplugin";
/// What every resource name of ours starts with.
pub const RESOURCE_PREFIX: &str = "macvtap.network.kubevirt.io/";
/// The node's NIC (a veth in the host's namespace).
pub const NIC: &str = "mvtclnic0";
/// The NIC's peer, in the caller's namespace.
pub const PEER_IF: &str = "peer0";
/// The peer's address: TEST-NET-2, outside the cluster's ranges (pods .0/25,
/// node .129, services .224/27).
pub const PEER_IP: &str = "198.51.100.161";
/// The prefix length of the peer's and the guests' addresses.
pub const PREFIX: u8 = 28;
/// Where our image is imported.
pub const IMAGE_REPO: &str = "localhost/macvtap-rs";
/// The VM pod's image.
pub const VM_IMAGE: &str = "localhost/macvtap-rs/vm-e2e:1";
/// How long a step on the cluster may take.
pub const WAIT: Duration = Duration::from_secs(180);
/// The resource the DRA scenarios serve: one NIC's devices.
pub const NAME: &str = "dradata";
/// The runtime's CDI directory.
pub const CDI_DIR: &str = "/var/run/cdi";
/// Our DRA driver.
pub const DRIVER: &str = "macvtap.network.kubevirt.io";

/// The host NIC of the node: deleted (with its peer) on drop.
pub struct HostNic;

impl HostNic {
    /// Adds [`NIC`] with its peer [`PEER_IF`] in `peer`, both up, the peer
    /// at [`PEER_IP`]; an earlier run's NIC is deleted first.
    pub fn add(peer: &TestNs) -> Result<Self> {
        let _ = ip(&["link", "del", NIC]);
        ip(&[
            "link", "add", NIC, "type", "veth", "peer", "name", PEER_IF, "netns", &peer.name,
        ])?;
        let nic = HostNic;
        ip(&["link", "set", NIC, "up"])?;
        peer.ip(&["link", "set", PEER_IF, "up"])?;
        peer.ip(&[
            "addr",
            "add",
            &format!("{PEER_IP}/{PREFIX}"),
            "dev",
            PEER_IF,
        ])?;
        Ok(nic)
    }
}

impl Drop for HostNic {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", NIC]);
    }
}

/// Builds the test guest and imports the VM pod's image ([`VM_IMAGE`]):
/// Debian's QEMU and the guest.
pub fn import_vm_image(c: &Cluster) -> Result<()> {
    let guest = crate::guest::build(&repo_root().join("target/e2e-guest"))?;
    let rootfs = tempfile::tempdir()?;
    vm_rootfs(&guest, rootfs.path())?;
    c.import_rootfs(VM_IMAGE, &["/vm/start"], "107:107", rootfs.path())
}

/// The macvtaps on [`NIC`] in the host's namespace.
pub fn macvtaps_on_nic() -> Result<Vec<String>> {
    let out = ip(&["-j", "-d", "link", "show", "type", "macvtap"])?;
    let links: Vec<Value> = serde_json::from_str(if out.trim().is_empty() { "[]" } else { &out })?;
    Ok(links
        .iter()
        .filter(|l| l["link"] == NIC)
        .filter_map(|l| l["ifname"].as_str().map(str::to_string))
        .collect())
}

/// Our CDI spec files on the node.
pub fn cdi_specs() -> Result<Vec<String>> {
    let mut out: Vec<String> = match std::fs::read_dir(CDI_DIR) {
        Ok(rd) => rd
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with("macvtap.network.kubevirt.io-tap_"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    out.sort();
    Ok(out)
}

/// The node's ResourceSlices of our driver.
pub fn slices(c: &Cluster) -> Result<Vec<Value>> {
    let list = c.get_json(&[
        "resourceslices",
        "--field-selector",
        &format!("spec.driver={DRIVER}"),
    ])?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

/// The path of `to` relative to the directory `from` (kustomize wants
/// relative resource paths).
pub fn pathdiff(to: &Path, from: &Path) -> String {
    let from = from.canonicalize().unwrap_or_else(|_| from.to_path_buf());
    let a: Vec<_> = to.components().collect();
    let b: Vec<_> = from.components().collect();
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &a[common..] {
        out.push(c);
    }
    out.to_string_lossy().into_owned()
}

/// Whether the DaemonSet `macvtap-cni` of namespace `ns` has its one pod
/// Ready and up to date.
pub fn ds_ready_in(c: &Cluster, ns: &str) -> Result<Option<()>> {
    let ds = c.get_json(&["-n", ns, "ds", DS])?;
    let st = &ds["status"];
    let gen_ok = st["observedGeneration"] == ds["metadata"]["generation"];
    let want = st["desiredNumberScheduled"].as_i64().unwrap_or(0);
    Ok((gen_ok
        && want == 1
        && st["numberReady"].as_i64() == Some(want)
        && st["updatedNumberScheduled"].as_i64() == Some(want)
        && st["numberUnavailable"].as_i64().unwrap_or(0) == 0)
        .then_some(()))
}

/// Waits until our DaemonSet (of [`NS`]) is Ready and up to date.
pub fn wait_ds_ready(c: &Cluster) -> Result<()> {
    c.wait("the DaemonSet Ready and up to date", WAIT, || {
        ds_ready_in(c, NS)
    })
}

/// All our daemon's container logged (of the DaemonSet's pod).
pub fn daemon_logs(c: &Cluster) -> Result<String> {
    c.kubectl(&[
        "-n",
        NS,
        "logs",
        &format!("ds/{DS}"),
        "-c",
        DAEMON,
        "--tail=-1",
    ])
}

/// The pod a VM as KubeVirt renders it runs in (virt-launcher's, as it looks
/// to us) on the network `dataplane` and `resource`, with the labels
/// `kubevirt.io: virt-launcher` and `e2e: cluster`; not waited for.
pub fn apply_vm_pod(
    c: &Cluster,
    resource: &str,
    name: &str,
    mac: &str,
    guest_ip: Ipv4Addr,
) -> Result<()> {
    let ifname = kubevirt_pod_ifname("dataplane");
    let networks = json!([{"name": "dataplane", "namespace": "default",
                           "mac": mac, "interface": ifname}]);
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default",
                     "labels": {"kubevirt.io": "virt-launcher", "e2e": "cluster"},
                     "annotations": {"k8s.v1.cni.cncf.io/networks": networks.to_string()}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsUser": 107, "runAsGroup": 107, "fsGroup": 107,
                                "runAsNonRoot": true},
            "containers": [{
                "name": "compute", "image": VM_IMAGE, "imagePullPolicy": "Never",
                "command": ["/vm/start"],
                "env": [{"name": "VM_MAC", "value": mac},
                        {"name": "VM_IP", "value": format!("{guest_ip}/{PREFIX}")},
                        {"name": "VM_PEER", "value": PEER_IP}],
                // KubeVirt counts the network's resource in both (its
                // renderresources.go requestResource).
                "resources": {"requests": {resource: "1", "memory": "300Mi"},
                              "limits": {resource: "1"}},
                "securityContext": {"allowPrivilegeEscalation": false,
                                    "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}
            }]
        }
    });
    c.apply(&pod)
}

/// Deletes the VM pods `names` of namespace `default` and waits until
/// they are gone (their DEL has run).
pub fn delete_vm_pods(c: &Cluster, names: &[&str]) -> Result<()> {
    let mut args = vec!["-n", "default", "delete", "pod"];
    args.extend_from_slice(names);
    args.extend_from_slice(&["--wait=true", "--timeout=120s"]);
    c.kubectl(&args)?;
    Ok(())
}

/// Deletes every pod the real-node tests and bench make (label `e2e=cluster`,
/// namespace `default`, as [`apply_vm_pod`] labels them) and waits until they
/// are gone.
pub fn delete_e2e_pods(c: &Cluster) -> Result<()> {
    c.kubectl(&[
        "delete",
        "pods",
        "-n",
        "default",
        "-l",
        "e2e=cluster",
        "--wait=true",
        "--timeout=120s",
    ])?;
    Ok(())
}

/// [`install_with`] with the reclaimer's grace the real-node tests use
/// (30 s).
pub fn install(c: &Cluster, tag: &str, kdir: &Path, dra: bool, capacity: u32) -> Result<()> {
    install_with(c, tag, kdir, dra, capacity, Duration::from_secs(30))
}

/// The install: the base with the DRA component (without it when `dra`
/// is false: the device plugin front), our image's `tag`, the tests' daemon
/// flags (the reclaimer every 2 s with `reclaim_grace`), and the ConfigMap
/// of one resource [`NAME`] of `capacity` on the NIC; the kustomization is
/// written to `kdir`. The DaemonSet's pods and its log are said when it
/// does not get Ready.
pub fn install_with(
    c: &Cluster,
    tag: &str,
    kdir: &Path,
    dra: bool,
    capacity: u32,
    reclaim_grace: Duration,
) -> Result<()> {
    let mut args = test_daemon_args(reclaim_grace);
    args.push("--discover-kinds=veth".into());
    let components: &[&str] = if dra { &["components/dra"] } else { &[] };
    write_kustomization(kdir, tag, components, Some(&args))?;
    let conf = format!(r#"[{{"name":"{NAME}","lowerDevice":"{NIC}","capacity":{capacity}}}]"#);
    c.kubectl(&["apply", "-k", &kdir.to_string_lossy()])?;
    c.apply(&json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "macvtap-deviceplugin-config", "namespace": NS},
        "data": {"DP_MACVTAP_CONF": conf}
    }))?;
    wait_ds_ready(c).map_err(|e| {
        let pods = c
            .kubectl(&["-n", NS, "get", "pods", "-o", "wide"])
            .unwrap_or_default();
        let log = daemon_logs(c).unwrap_or_default();
        e.context(format!(
            "our pods:\n{pods}\nthe daemon's log:\n{}",
            last_lines(&log, 30)
        ))
    })
}

/// The daemon's flags in the real-node tests: the base's (kubelet dir,
/// metrics, JSON logs, its owner DaemonSet, the CNI dir to clean at an
/// uninstall) and the reclaimer every 2 s with `reclaim_grace`.
pub fn test_daemon_args(reclaim_grace: Duration) -> Vec<String> {
    [
        "--kubelet-dir=/var/lib/kubelet",
        "--metrics-addr=0.0.0.0:9402",
        "--log-format=json",
        "--owner-daemonset=macvtap-cni",
        "--uninstall-cni-dir=/host/cni-bin",
    ]
    .into_iter()
    .map(str::to_string)
    .chain([
        format!("--reclaim-grace={}s", reclaim_grace.as_secs()),
        "--reclaim-interval=2s".to_string(),
    ])
    .collect()
}

/// Writes to `kdir` a kustomization of `manifests/base` with `components`
/// (paths under `manifests/`), our image's `tag` and, given `args`, the
/// daemon container's args (a strategic merge patch keyed by the
/// container's name, in `args.yaml`).
pub fn write_kustomization(
    kdir: &Path,
    tag: &str,
    components: &[&str],
    args: Option<&[String]>,
) -> Result<()> {
    let manifests = repo_root().join("manifests").canonicalize()?;
    let rel = |p: &str| pathdiff(&manifests.join(p), kdir);
    let mut text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\n",
        rel("base")
    );
    if !components.is_empty() {
        text.push_str("components:\n");
        for c in components {
            text.push_str(&format!("  - {}\n", rel(c)));
        }
    }
    text.push_str(&format!(
        "images:\n  - name: ghcr.io/kubevirt/macvtap-rs\n    newName: {IMAGE_REPO}\n    newTag: {tag}\n"
    ));
    if let Some(args) = args {
        let patch = json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": DS, "namespace": NS},
            "spec": {"template": {"spec": {"containers": [{"name": DAEMON, "args": args}]}}}
        });
        std::fs::write(kdir.join("args.yaml"), patch.to_string())?;
        text.push_str("patches:\n  - path: args.yaml\n");
    }
    std::fs::write(kdir.join("kustomization.yaml"), text)?;
    Ok(())
}

/// The example DeviceClass and NAD, for [`NAME`] instead of `eth1`.
pub fn examples() -> Result<(String, String)> {
    let class = std::fs::read_to_string(repo_root().join("manifests/examples/deviceclass.yaml"))?
        .replace("eth1", NAME);
    let nad = std::fs::read_to_string(repo_root().join("manifests/examples/nad.yaml"))?.replace(
        &format!("{RESOURCE_PREFIX}eth1\n"),
        &format!("{RESOURCE_PREFIX}{NAME}\n"),
    );
    Ok((class, nad))
}
