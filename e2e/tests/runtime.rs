//! The DaemonSet run by a real container runtime, exactly as a node runs it:
//! each kustomization (base and both overlays) is rendered by `kubectl
//! kustomize`, its pod spec is
//! translated into OCI configs the way the kubelet and containerd translate
//! it (`macvtap_e2e::runtime`), and Debian's `runc` runs the init container
//! and then the daemon from the image that `hack/build-image.sh --prebuilt`
//! builds out of the static binaries. The node is a network namespace with
//! a veth as its NIC, a temp dir stands for the host's file system (with
//! the kubelet and CNI dirs of the distribution the variant is for), `/dev`
//! is the real `/dev`, and the test kubelet plays the kubelet.
//!
//! Checked: the init container installs the CNI binary (identical bytes);
//! the daemon registers, lists healthy devices, Allocates a device whose
//! `/dev/tapN` exists, answers the manifest's probes, runs with exactly the
//! capabilities the manifest declares, and on SIGTERM exits 0 within the
//! pod's termination grace period (the time it took is printed, not judged)
//! with its socket removed. Every failure names the manifest field at fault.
//!
//! And the Go project's own DaemonSet (as cluster-network-addons-operator
//! renders it) with only its image replaced by ours: privileged, so the
//! daemon's `/dev` is the runtime's tmpfs copy of the host's devices, with
//! no `pod-resources`; its `cp` installs our CNI, Allocate answers the
//! host's `/dev/tapN` of the new link, and each missing mount is said once.
//!
//! `oom_score_adj` is not set: the kubelet would give this
//! `system-node-critical` pod -997, but lowering it needs
//! `CAP_SYS_RESOURCE`, which this sandbox's bounding set does not have.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use anyhow::{Context, Result, anyhow, bail, ensure};
use kubelet_proto::v1beta1::DeviceSpec;
use macvtap_e2e::manifests::render;
use macvtap_e2e::runtime::{
    Image, PodSandbox, RuncContainer, cap_mask, cap_names, capabilities, process_caps, repo_root,
    unique_id,
};
use macvtap_e2e::sandbox::{TestNs, require_root};
use macvtap_e2e::steps::Steps;
use serde_json::{Value, json};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use test_kubelet::http_get;
use test_kubelet::{TestKubelet, TestPodResources};
use test_support::tap_node_lock;

/// What users put in the ConfigMap (README, "Choose the resources"), naming
/// this node's NIC: auto-discovery would skip a veth.
const CONF: &str = r#"[{"name":"dataplane","lowerDevice":"lower0","mode":"bridge","capacity":4}]"#;
const RESOURCE: &str = "macvtap.network.kubevirt.io/dataplane";
/// The ConfigMap after an operator's edit: a second resource.
const CONF_EDITED: &str = r#"[{"name":"dataplane","lowerDevice":"lower0","mode":"bridge","capacity":4},
 {"name":"dataplane2","lowerDevice":"lower0","capacity":2}]"#;
const RESOURCE_ADDED: &str = "macvtap.network.kubevirt.io/dataplane2";
const CAPACITY: usize = 4;
/// Deadline for a container to finish or the daemon to answer (not a
/// latency target: the cold start is measured and printed).
const WAIT: Duration = Duration::from_secs(20);
/// How long the kubelet waits after SIGTERM before it kills a container
/// when the pod spec sets no `terminationGracePeriodSeconds` (the API's
/// default, 30 s).
const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// Where a distribution keeps the kubelet's dir and the CNI binaries.
#[derive(Debug, Clone, Copy)]
struct Layout {
    kubelet_root: &'static str,
    cni_bin: &'static str,
}

/// The node: its network namespace with NIC `lower0`, a temp dir standing
/// for the host's `/`, the test kubelet and PodResources API. Dropping it
/// removes every macvtap made on it, the namespace and the dirs.
struct TestNode {
    kubelet: Option<TestKubelet>,
    pod_resources: Option<TestPodResources>,
    ns: TestNs,
    host: tempfile::TempDir,
    layout: Layout,
    _tap_lock: nix::fcntl::Flock<std::fs::File>,
}

impl TestNode {
    fn new(layout: Layout) -> Result<Self> {
        require_root()?;
        // Fresh namespaces number links from 1; see `tap_node_lock`.
        let lock = tap_node_lock()?;
        let ns = TestNs::new("rtnode")?;
        ns.ip(&[
            "link", "add", "lower0", "type", "veth", "peer", "name", "peer0",
        ])?;
        ns.ip(&["link", "set", "lower0", "up"])?;
        ns.ip(&["link", "set", "peer0", "up"])?;
        let host = tempfile::tempdir()?;
        let node = Self {
            kubelet: None,
            pod_resources: None,
            ns,
            host,
            layout,
            _tap_lock: lock,
        };
        // What the kubelet and the CNI installation make on a real node.
        for dir in [
            format!("{}/device-plugins", layout.kubelet_root),
            format!("{}/pod-resources", layout.kubelet_root),
            layout.cni_bin.to_string(),
        ] {
            std::fs::create_dir_all(node.host_path(&dir))?;
        }
        Ok(node)
    }

    /// A host path of this node (under the temp dir; `/dev` is not used here).
    fn host_path(&self, path: &str) -> PathBuf {
        self.host.path().join(path.trim_start_matches('/'))
    }

    fn plugin_dir(&self) -> PathBuf {
        self.host_path(&format!("{}/device-plugins", self.layout.kubelet_root))
    }

    async fn start_kubelet(&mut self) -> Result<()> {
        self.kubelet = Some(
            TestKubelet::start(&self.plugin_dir())
                .await
                .map_err(|e| anyhow!("{e}"))?,
        );
        let sock = self.host_path(&format!(
            "{}/pod-resources/kubelet.sock",
            self.layout.kubelet_root
        ));
        self.pod_resources = Some(
            TestPodResources::start(&sock)
                .await
                .map_err(|e| anyhow!("{e}"))?,
        );
        Ok(())
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        // Delete our macvtaps while the tap-node lock is held, so the next
        // test cannot meet a stale /dev/tapN.
        let _ = self.ns.delete_macvtaps();
    }
}

/// The static binaries, built as `tests/image.rs` builds them.
fn build_static(out: &Path) -> Result<()> {
    let status = Command::new(repo_root().join("hack/build-static.sh"))
        .arg("")
        .arg(out)
        .status()
        .context("running hack/build-static.sh")?;
    ensure!(status.success(), "hack/build-static.sh failed");
    Ok(())
}

/// The port a probe's `httpGet.port` names: a number, or a `ports[].name`.
fn probe_port(c: &Value, probe: &str, field: &str) -> Result<(u16, String)> {
    let get = &c[probe]["httpGet"];
    let path = get["path"].as_str().unwrap_or("/").to_string();
    let port = match &get["port"] {
        Value::Number(n) => n.as_u64().context("port")?,
        Value::String(name) => c["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == name.as_str())
            .and_then(|p| p["containerPort"].as_u64())
            .with_context(|| {
                format!("{field}.{probe}.httpGet.port names port {name:?}, which {field}.ports does not have")
            })?,
        other => bail!("{field}.{probe}.httpGet.port: {other} is not a port"),
    };
    Ok((u16::try_from(port)?, path))
}

/// The kubelet's first calls on the registration at `endpoint`, as for an
/// admitted pod: ListAndWatch until [`CAPACITY`] healthy devices, then
/// Allocate of `dataplaneMvp0`; returns its DeviceSpec. A failure names
/// `field` and carries the daemon container `dp`'s output.
async fn allocate_first_device(
    kubelet: &TestKubelet,
    endpoint: &str,
    field: &str,
    dp: &RuncContainer,
) -> Result<DeviceSpec> {
    let mut client = kubelet
        .connect(endpoint)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let mut watch = client.list_and_watch().await?;
    watch
        .wait_until(WAIT, |d| {
            d.len() == CAPACITY && d.iter().all(|d| d.health == "Healthy")
        })
        .await
        .map_err(|e| anyhow!("{field}: no {CAPACITY} healthy devices: {e}\n{}", dp.log()))?;
    let resp = client
        .allocate(&["dataplaneMvp0"])
        .await
        .map_err(|e| anyhow!("{field}: Allocate failed: {e}\n{}", dp.log()))?;
    resp.container_responses
        .first()
        .and_then(|r| r.devices.first())
        .cloned()
        .context("Allocate returned no DeviceSpec")
}

/// `manifests/examples/configmap-explicit.yaml` with `DP_MACVTAP_CONF` set
/// to `conf`, as an operator applies it.
fn example_config_map(conf: &str) -> Result<Value> {
    let path = repo_root().join("manifests/examples/configmap-explicit.yaml");
    let text = std::fs::read_to_string(&path)?;
    let mut cm = macvtap_e2e::manifests::parse_docs(&text)?
        .into_iter()
        .next()
        .with_context(|| format!("{}: no object", path.display()))?;
    ensure!(
        cm["metadata"]["name"] == "macvtap-deviceplugin-config"
            && cm["data"]["DP_MACVTAP_CONF"].is_string(),
        "{}: not the ConfigMap macvtap-deviceplugin-config with DP_MACVTAP_CONF",
        path.display()
    );
    cm["data"]["DP_MACVTAP_CONF"] = Value::from(conf);
    Ok(cm)
}

async fn daemonset_runs_under_runc(variant: &str, layout: Layout) -> Result<()> {
    require_root()?;
    let mut steps = Steps::new();
    steps.step("static binaries (hack/build-static.sh), image (hack/build-image.sh --prebuilt)");
    let bins = tempfile::tempdir()?;
    tokio::task::block_in_place(|| build_static(bins.path()))?;
    let image = tokio::task::block_in_place(|| Image::build(bins.path()))?;
    steps.say(format!(
        "image: ENTRYPOINT {:?}, USER {:?}",
        image.config.entrypoint, image.config.user
    ));

    steps.step(&format!(
        "render manifests/{variant}; the operator's ConfigMap (examples/configmap-explicit.yaml) names the node's NIC lower0"
    ));
    let docs = render(&repo_root().join("manifests").join(variant))?;
    ensure!(
        !docs.iter().any(|d| d["kind"] == "ConfigMap"),
        "{variant}: the rendering holds a ConfigMap, which an upgrade would reset"
    );
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .context("no DaemonSet in the rendering")?;
    let pod = ds["spec"]["template"]["spec"].clone();
    for c in ["initContainers", "containers"]
        .iter()
        .flat_map(|k| pod[*k].as_array().cloned().unwrap_or_default())
    {
        ensure!(
            c["securityContext"]["privileged"] != true,
            "containers[{}].securityContext.privileged: our DaemonSet must not be privileged",
            c["name"]
        );
    }
    let config_maps = vec![example_config_map(CONF)?];
    let pod_namespace = ds["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_string();

    steps.step(&format!(
        "node: netns with NIC lower0, kubelet dir {}, CNI dir {}, test kubelet",
        layout.kubelet_root, layout.cni_bin
    ));
    let mut node = TestNode::new(layout)?;
    let pod_dir = node.host.path().join("pod");
    let mut sandbox = PodSandbox::new(
        Path::new(&node.ns.path()),
        node.host.path(),
        &pod_dir,
        config_maps,
    )?;
    sandbox.namespace = pod_namespace;
    node.start_kubelet().await?;

    for c in pod["initContainers"].as_array().into_iter().flatten() {
        let name = c["name"].as_str().context("initContainers[].name")?;
        let field = format!("spec.template.spec.initContainers[{name}]");
        steps.step(&format!("init container {name} under runc"));
        let id = unique_id(name);
        let config = sandbox.oci_config(&pod, c, &field, &image.config, &format!("/{id}"))?;
        let mut ctr =
            RuncContainer::create(&id, &config, &image, &pod_dir.join(format!("{name}.log")))?;
        ctr.start()?;
        let status = tokio::task::block_in_place(|| ctr.wait(WAIT))?;
        ensure!(
            status.is_some_and(|s| s.success()),
            "{field} did not exit 0 ({}); check its command, args, securityContext and \
             volumeMounts. Its output:\n{}",
            status.map_or("still running".to_string(), |s| s.to_string()),
            ctr.log()
        );
    }
    let installed = node.host_path(&format!("{}/macvtap", layout.cni_bin));
    let want = std::fs::read(bins.path().join("macvtap"))?;
    ensure!(
        std::fs::read(&installed).ok().as_ref() == Some(&want),
        "the init container did not install the CNI binary as {}/macvtap: check \
         initContainers[].args --target-dir, its volumeMounts and volumes[cni-bin].hostPath.path",
        layout.cni_bin
    );
    steps.say(format!(
        "{}/macvtap: {} bytes, identical to the image's",
        layout.cni_bin,
        want.len()
    ));
    let settings_path = node.host_path(&format!("{}/macvtap.settings.json", layout.cni_bin));
    let settings: serde_json::Value = std::fs::read(&settings_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .with_context(|| {
            format!(
                "the init container did not write the CNI's node settings {}/macvtap.settings.json: \
                 check initContainers[].args --kubelet-dir and --pod-resources-check",
                layout.cni_bin
            )
        })?;
    ensure!(
        settings["podResourcesCheck"] == "enforce" && settings["kubeletDir"].is_string(),
        "the CNI's node settings are {settings}: check initContainers[].args"
    );
    steps.say(format!(
        "{}/macvtap.settings.json: {settings}",
        layout.cni_bin
    ));

    let c = pod["containers"]
        .as_array()
        .and_then(|a| a.first())
        .context("spec.template.spec.containers is empty")?;
    let name = c["name"].as_str().context("containers[].name")?;
    let field = format!("spec.template.spec.containers[{name}]");
    steps.step(&format!(
        "daemon container {name} under runc, until it registers"
    ));
    let id = unique_id(name);
    let config = sandbox.oci_config(&pod, c, &field, &image.config, &format!("/{id}"))?;
    let mut dp = RuncContainer::create(&id, &config, &image, &pod_dir.join(format!("{name}.log")))?;
    let kubelet = node.kubelet.as_ref().context("kubelet")?;
    let t0 = Instant::now();
    dp.start()?;
    let hint = format!(
        "Check its args (--kubelet-dir), volumeMounts (device-plugins), envFrom and \
         terminationMessagePath (kubelet dir {})",
        layout.kubelet_root
    );
    let registered = kubelet.wait_for_registration(RESOURCE, 0, WAIT);
    tokio::pin!(registered);
    let reg = loop {
        tokio::select! {
            r = &mut registered => break r.map_err(|e| anyhow!(
                "{field} did not register {RESOURCE} with the kubelet: {e}. {hint}. \
                 runc and daemon output:\n{}",
                dp.log()
            ))?,
            // Fail at once, not at the deadline, when the container is gone.
            () = tokio::time::sleep(Duration::from_millis(20)) => {
                if let Some(status) = dp.exited()? {
                    bail!(
                        "{field} exited ({status}) before it registered {RESOURCE}. {hint}. \
                         runc and daemon output:\n{}",
                        dp.log()
                    );
                }
            }
        }
    };
    let cold = t0.elapsed();
    steps.say(format!(
        "cold start ({variant}), runc run to registration: {:.0} ms",
        cold.as_secs_f64() * 1e3
    ));

    steps.step("kubelet: ListAndWatch, Allocate one device");
    let spec = &allocate_first_device(kubelet, &reg.endpoint, &field, &dp).await?;
    node.pod_resources
        .as_ref()
        .context("pod resources")?
        .set_allocated(RESOURCE, &["dataplaneMvp0"]);
    let tap = Path::new(&spec.host_path);
    ensure!(
        std::fs::metadata(tap).is_ok_and(|m| m.file_type().is_char_device()),
        "{} is not a char device after Allocate: the daemon must see the host's /dev \
         (volumes[dev].hostPath and {field}.volumeMounts[dev])",
        tap.display()
    );
    steps.say(format!("dataplaneMvp0 -> {} (char device)", tap.display()));

    steps.step("the ConfigMap edited (a second resource), projected as the kubelet does: applied without a restart");
    sandbox.update_config_map(
        &pod,
        "macvtap-deviceplugin-config",
        Some(example_config_map(CONF_EDITED)?),
    )?;
    kubelet
        .wait_for_registration(RESOURCE_ADDED, 0, WAIT)
        .await
        .map_err(|e| {
            anyhow!(
                "{field}: the edited ConfigMap's {RESOURCE_ADDED} did not register: {e}. \
                 Check env MACVTAP_CONFIG and the config volume. Daemon output:\n{}",
                dp.log()
            )
        })?;
    ensure!(
        dp.exited()?.is_none(),
        "{field} exited on a config edit:\n{}",
        dp.log()
    );
    steps.say(format!("{RESOURCE_ADDED} registered by the same process"));

    steps.step("probes: GET on the manifest's probe ports, inside the node namespace");
    for probe in ["readinessProbe", "livenessProbe"] {
        let (port, path) = probe_port(c, probe, &field)?;
        let deadline = Instant::now() + WAIT;
        let line = loop {
            // The status line of the answer.
            let r = tokio::task::block_in_place(|| http_get(&node.ns, port, &path))
                .map(|a| a.lines().next().unwrap_or_default().to_string());
            match r {
                Ok(l) if l.contains(" 200 ") || Instant::now() >= deadline => break l,
                Err(e) if Instant::now() >= deadline => break format!("{e:#}"),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        ensure!(
            line.contains(" 200 "),
            "{field}.{probe}: GET {path} on port {port} answered {line:?}: check args \
             --metrics-addr and ports"
        );
        steps.say(format!("{probe}: GET :{port}{path} -> {line}"));
    }

    steps.step("capabilities of the running daemon (/proc/PID/status)");
    let declared = capabilities(&c["securityContext"], &format!("{field}.securityContext"))?;
    let want_mask = cap_mask(&declared)?;
    let pid = dp.pid()?;
    for (key, mask) in process_caps(pid)? {
        ensure!(
            mask == want_mask,
            "{field}.securityContext.capabilities declares {declared:?}, but the daemon's {key} is {:?}",
            cap_names(mask)
        );
    }
    steps.say(format!("CapEff = CapPrm = CapBnd = {declared:?}"));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let want_nnp = if c["securityContext"]["allowPrivilegeEscalation"] == false {
        "1"
    } else {
        "0"
    };
    ensure!(
        line("NoNewPrivs:") == [want_nnp],
        "{field}.securityContext.allowPrivilegeEscalation: the daemon's NoNewPrivs is {:?}",
        line("NoNewPrivs:")
    );
    // The image names no USER: root unless the pod says otherwise.
    let want_uid = c["securityContext"]["runAsUser"]
        .as_u64()
        .unwrap_or(0)
        .to_string();
    ensure!(
        line("Uid:").first() == Some(&want_uid.as_str()),
        "{field}.securityContext.runAsUser: the daemon runs as uid {:?}",
        line("Uid:")
    );
    steps.say(format!("uid {want_uid}, NoNewPrivs {want_nnp}"));

    steps.step("SIGTERM (runc kill): exit 0 and sockets removed");
    let socket = node.plugin_dir().join(&reg.endpoint);
    ensure!(socket.exists(), "{} exists while serving", socket.display());
    // What the kubelet allows before it sends SIGKILL.
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .map_or(DEFAULT_GRACE, Duration::from_secs);
    let t = Instant::now();
    dp.kill("TERM")?;
    let status = tokio::task::block_in_place(|| dp.wait(grace))?;
    let stopped = t.elapsed();
    ensure!(
        status.is_some_and(|s| s.success()),
        "{field} did not exit 0 within its grace period of {grace:?} after SIGTERM ({}), \
         so the kubelet would kill it:\n{}",
        status.map_or("still running".to_string(), |s| s.to_string()),
        dp.log()
    );
    steps.say(format!(
        "exited 0 after {:.0} ms",
        stopped.as_secs_f64() * 1e3
    ));
    ensure!(
        !socket.exists(),
        "{field} left its socket {} behind",
        socket.display()
    );
    println!(
        "COLD START {variant}: runc run to registration {:.0} ms",
        cold.as_secs_f64() * 1e3
    );
    println!(
        "STOP {variant}: SIGTERM to exit {:.0} ms (grace period {grace:?})",
        stopped.as_secs_f64() * 1e3
    );
    Ok(())
}

/// The Go project's DaemonSet as cluster-network-addons-operator renders it
/// (`e2e/fixtures/cnao-macvtap.yaml`) with our image, and its ConfigMap
/// naming this node's NIC: privileged, `hostNetwork` and `hostPID`, no
/// user, and only the device-plugins and CNI dirs mounted.
fn go_project_daemonset(image: &str) -> (Value, Value) {
    let (cm, ds) = macvtap_e2e::manifests::cnao_macvtap("cluster-network-addons", image, CONF)
        .expect("the fixture");
    (cm, ds["spec"]["template"]["spec"].clone())
}

/// An image swap is enough: the Go project's DaemonSet (as
/// cluster-network-addons-operator renders it) runs our image under runc.
/// The init container's `cp` installs our CNI; the daemon, privileged with
/// its own `/dev` (a tmpfs holding the host's devices of its start, never a
/// tap node made later) and no `pod-resources`, registers, and Allocate
/// answers the host's `/dev/tapN` of the new link (the host's node is that
/// link's char device), saying once what it leaves undone and which mount
/// would enable it; SIGTERM ends it with exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_projects_daemonset_runs_our_image_under_runc() -> Result<()> {
    require_root()?;
    let mut steps = Steps::new();
    steps.step("static binaries (hack/build-static.sh), image (hack/build-image.sh --prebuilt)");
    let bins = tempfile::tempdir()?;
    tokio::task::block_in_place(|| build_static(bins.path()))?;
    let image = tokio::task::block_in_place(|| Image::build(bins.path()))?;
    let (cm, pod) = go_project_daemonset("ghcr.io/kubevirt/macvtap-rs:v0.1.0");

    steps.step("node: netns with NIC lower0, kubelet dir /var/lib/kubelet, test kubelet");
    let mut node = TestNode::new(Layout {
        kubelet_root: "/var/lib/kubelet",
        cni_bin: "/opt/cni/bin",
    })?;
    let pod_dir = node.host.path().join("pod");
    let sandbox = PodSandbox::new(
        Path::new(&node.ns.path()),
        node.host.path(),
        &pod_dir,
        vec![cm],
    )?;
    node.start_kubelet().await?;

    steps.step("init container install-cni (cp) under runc");
    let init = &pod["initContainers"][0];
    let field = "spec.template.spec.initContainers[install-cni]";
    let id = unique_id("install-cni");
    let config = sandbox.oci_config(&pod, init, field, &image.config, &format!("/{id}"))?;
    let mut ctr = RuncContainer::create(&id, &config, &image, &pod_dir.join("install-cni.log"))?;
    ctr.start()?;
    let status = tokio::task::block_in_place(|| ctr.wait(WAIT))?;
    ensure!(
        status.is_some_and(|s| s.success()),
        "{field} did not exit 0 ({status:?}):\n{}",
        ctr.log()
    );
    let installed = node.host_path("/opt/cni/bin/macvtap");
    ensure!(
        std::fs::read(&installed)? == std::fs::read(bins.path().join("macvtap"))?,
        "the Go project's cp did not install our CNI as /opt/cni/bin/macvtap"
    );

    steps.step("daemon container macvtap-cni (privileged) under runc, until it registers");
    let c = &pod["containers"][0];
    let field = "spec.template.spec.containers[macvtap-cni]";
    let id = unique_id("macvtap-cni");
    let config = sandbox.oci_config(&pod, c, field, &image.config, &format!("/{id}"))?;
    let mut dp = RuncContainer::create(&id, &config, &image, &pod_dir.join("macvtap-cni.log"))?;
    let kubelet = node.kubelet.as_ref().context("kubelet")?;
    dp.start()?;
    let reg = kubelet
        .wait_for_registration(RESOURCE, 0, WAIT)
        .await
        .map_err(|e| anyhow!("{field} did not register {RESOURCE}: {e}\n{}", dp.log()))?;

    steps.step("kubelet: ListAndWatch, Allocate one device");
    let spec = &allocate_first_device(kubelet, &reg.endpoint, field, &dp).await?;
    let name = macvtap_link::link_name_for_device("dataplaneMvp0");
    let link = node
        .ns
        .link(&name)?
        .context("no macvtap for dataplaneMvp0 on the node")?;
    ensure!(
        spec.host_path == format!("/dev/tap{}", link.index)
            && spec.container_path == spec.host_path,
        "Allocate answered {spec:?} for {name} (ifindex {})",
        link.index
    );
    let netns = macvtap_link::Netns::open(Path::new(&node.ns.path()))?;
    let dev = macvtap_link::tapdev::tap_dev_in_netns(&netns, &name)?;
    macvtap_link::tapdev::open_tap_node(Path::new(&spec.host_path), dev, WAIT)?;
    steps.say(format!(
        "dataplaneMvp0 -> {} (the host's node of {name})",
        spec.host_path
    ));

    steps.step("each gap said once, naming its mount");
    let deadline = Instant::now() + WAIT;
    let log = loop {
        let log = dp.log();
        if log.contains("leaked-link reclaim and heal are off") || Instant::now() >= deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for (what, count) in [
        ("serving without the host's /dev", 1),
        (
            "mount the host's /dev (hostPath /dev, read-only) at /dev",
            1,
        ),
        ("leaked-link reclaim and heal are off", 1),
        (
            "mount the host's /var/lib/kubelet/pod-resources (hostPath)",
            1,
        ),
    ] {
        ensure!(
            log.matches(what).count() == count,
            "{field}: want {what:?} {count} time(s) in its log:\n{log}"
        );
    }

    steps.step("SIGTERM (runc kill): exit 0 and socket removed");
    let socket = node.plugin_dir().join(&reg.endpoint);
    dp.kill("TERM")?;
    let status = tokio::task::block_in_place(|| dp.wait(DEFAULT_GRACE))?;
    ensure!(
        status.is_some_and(|s| s.success()),
        "{field} did not exit 0 after SIGTERM ({status:?}):\n{}",
        dp.log()
    );
    ensure!(!socket.exists(), "{field} left {} behind", socket.display());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base_daemonset_runs_under_runc() -> Result<()> {
    daemonset_runs_under_runc(
        "base",
        Layout {
            kubelet_root: "/var/lib/kubelet",
            cni_bin: "/opt/cni/bin",
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openshift_overlay_runs_under_runc() -> Result<()> {
    daemonset_runs_under_runc(
        "overlays/openshift",
        Layout {
            kubelet_root: "/var/lib/kubelet",
            cni_bin: "/var/lib/cni/bin",
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_dir_overlay_runs_under_runc() -> Result<()> {
    daemonset_runs_under_runc(
        "overlays/kubelet-dir",
        Layout {
            kubelet_root: "/var/lib/k0s/kubelet",
            cni_bin: "/opt/cni/bin",
        },
    )
    .await
}

/// The translation itself, without root: the base DaemonSet's containers
/// become the OCI configs containerd would write.
#[test]
fn the_base_daemonset_translates_as_containerd_translates_it() {
    let docs = render(&repo_root().join("manifests/base")).unwrap();
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let pod = ds["spec"]["template"]["spec"].clone();
    let host = tempfile::tempdir().unwrap();
    for d in [
        "var/lib/kubelet/device-plugins",
        "var/lib/kubelet/pod-resources",
        "opt/cni/bin",
    ] {
        std::fs::create_dir_all(host.path().join(d)).unwrap();
    }
    let cms: Vec<Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .cloned()
        .collect();
    let sb = PodSandbox::new(
        Path::new("/run/netns/node"),
        host.path(),
        &host.path().join("pod"),
        cms,
    )
    .unwrap();
    let image = macvtap_e2e::runtime::ImageConfig {
        entrypoint: vec!["/macvtap-deviceplugin".into()],
        user: "65532:65532".into(),
        ..Default::default()
    };
    let dests = |v: &Value| -> Vec<String> {
        v["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].as_str().unwrap().to_string())
            .collect()
    };

    let init = sb
        .oci_config(&pod, &pod["initContainers"][0], "init", &image, "/cg")
        .unwrap();
    let d = dests(&init);
    assert_eq!(
        init["mounts"][1]["type"], "tmpfs",
        "no volume at /dev: a tmpfs"
    );
    assert!(d.contains(&"/dev/termination-log".to_string()), "{d:?}");
    assert_eq!(init["process"]["capabilities"]["effective"], json!([]));
    assert_eq!(init["process"]["args"][1], "install-cni");

    let dp = sb
        .oci_config(&pod, &pod["containers"][0], "dp", &image, "/cg")
        .unwrap();
    assert_eq!(
        dests(&dp),
        [
            "/proc",
            "/sys",
            "/sys/fs/cgroup",
            "/dev",
            "/etc/macvtap-deviceplugin",
            "/host/cni-bin",
            "/etc/hosts",
            "/tmp/termination-log",
            "/etc/hostname",
            "/etc/resolv.conf",
            "/dev/shm",
            "/var/lib/kubelet/device-plugins",
            "/var/lib/kubelet/pod-resources",
        ],
        "defaults without /dev/*, then the supplied mounts by depth"
    );
    let dev = &dp["mounts"][3];
    assert_eq!(dev["source"], "/dev", "the real /dev");
    assert_eq!(dev["options"], json!(["rbind", "rprivate", "ro"]));
    let config = &dp["mounts"][4];
    assert_eq!(
        config["options"],
        json!(["rbind", "rprivate", "ro"]),
        "a configMap volume"
    );
    assert!(
        config["source"]
            .as_str()
            .unwrap()
            .ends_with("volumes/kubernetes.io~configmap/config"),
        "{config}"
    );
    let cni_bin = &dp["mounts"][5];
    assert_eq!(
        cni_bin["options"],
        json!(["rbind", "rprivate", "rw"]),
        "the installed CNI, for doctor and for the uninstall's removal"
    );
    let caps = json!(["CAP_NET_ADMIN"]);
    for set in ["bounding", "effective", "permitted"] {
        assert_eq!(dp["process"]["capabilities"][set], caps, "{set}");
    }
    assert_eq!(dp["process"]["noNewPrivileges"], true);
    assert_eq!(dp["process"]["user"]["uid"], 0, "runAsUser over USER");
    assert!(dp["process"].get("oomScoreAdj").is_none());
    assert_eq!(dp["root"]["readonly"], true);
    assert_eq!(
        dp["linux"]["namespaces"][3],
        json!({"type": "network", "path": "/run/netns/node"})
    );
    assert_eq!(dp["linux"]["resources"]["memory"]["limit"], 64 << 20);
    assert_eq!(dp["linux"]["resources"]["cpu"]["quota"], 20_000);
    assert!(
        !dp["process"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().unwrap().starts_with("DP_MACVTAP_CONF=")),
        "the ConfigMap is a watched file, not the environment"
    );
}
