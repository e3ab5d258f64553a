//! Multus set up on a sandbox node and run as a container runtime runs it.
//!
//! [`Multus`] writes the runtime's Multus config (the cluster default
//! network a `loopback` delegate), a kubeconfig, the CNI's node settings
//! (`podResourcesCheck: enforce` against the same PodResources server), and
//! runs ADD and DEL as containerd does: `CNI_IFNAME=eth0`,
//! `CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE;K8S_POD_NAME;
//! K8S_POD_INFRA_CONTAINER_ID;K8S_POD_UID`. Each delegate Multus runs
//! through its bin dir is recorded ([`DelegateCall`]) and then executed
//! unchanged.

use super::host_pod_resources::HostPodResources;
use super::{NETWORK_STATUS_ANNOTATION, NETWORKS_ANNOTATION, RESOURCE_NAME_ANNOTATION, build};
use crate::node::{Node, binary};
use crate::sandbox::TestNs;
use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use test_kubelet::FakeApiServer;

/// A pod as the API server knows it and the runtime names it.
#[derive(Debug, Clone)]
pub struct Pod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.uid` (also `K8S_POD_UID`).
    pub uid: String,
    /// The `k8s.v1.cni.cncf.io/networks` selections (a JSON list).
    pub networks: Value,
}

impl Pod {
    /// The object the API server serves.
    pub fn object(&self) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": self.name, "namespace": self.namespace, "uid": self.uid,
                "annotations": {NETWORKS_ANNOTATION: self.networks.to_string()}
            },
            "spec": {"containers": [{"name": "compute", "image": "virt-launcher"}]},
            "status": {"phase": "Pending"}
        })
    }
}

/// What Multus passed to one delegate it ran from its bin dir.
#[derive(Debug, Clone)]
pub struct DelegateCall {
    /// The plugin (`macvtap`, `tuning`).
    pub plugin: String,
    /// `CNI_COMMAND`.
    pub command: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS`.
    pub args: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// The config on stdin.
    pub config: Value,
    /// `MACVTAP_CNI_SETTINGS` reached the plugin.
    pub settings_env: bool,
}

/// What one Multus run did.
#[derive(Debug)]
pub struct MultusRun {
    /// Exit status 0.
    pub ok: bool,
    /// stdout parsed as JSON (the CNI result or error).
    pub json: Value,
    /// stderr.
    pub stderr: String,
    /// Wall time.
    pub took: Duration,
    /// The delegates Multus ran from its bin dir in this run, in order.
    pub calls: Vec<DelegateCall>,
}

/// The real Multus on a sandbox node, with its API server, config,
/// kubeconfig, the CNI's node settings and the host PodResources path.
pub struct Multus {
    bin: PathBuf,
    node_ns: String,
    work: tempfile::TempDir,
    /// The fake API server Multus talks to.
    pub api: FakeApiServer,
    /// The CNI's node settings file (passed as `MACVTAP_CNI_SETTINGS`).
    pub settings: PathBuf,
    runs: Mutex<usize>,
    _pod_resources: HostPodResources,
}

/// The plugins Multus finds in its bin dir: each is recorded, then run.
const RECORDED: [&str; 2] = ["macvtap", "tuning"];

impl Multus {
    /// Builds (or reuses) Multus and sets it up on `node`, whose
    /// PodResources server must be running: the host path points at it, and
    /// the CNI checks device ownership against it (`enforce`).
    pub fn start(node: &Node) -> Result<Self> {
        ensure!(
            node.pod_resources.is_some(),
            "start the node's PodResources server before Multus"
        );
        let bin = build()?;
        let socket = node.kubelet_dir.path().join("pod-resources/kubelet.sock");
        let pod_resources = HostPodResources::serve(&socket)?;
        let work = tempfile::tempdir()?;
        let w = work.path();
        let api = FakeApiServer::start(&node.ns)?;
        let kubeconfig = w.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: sandbox\n  cluster:\n    server: {}\n\
                 users:\n- name: multus\n  user:\n    token: sandbox-token\ncontexts:\n- name: sandbox\n  \
                 context:\n    cluster: sandbox\n    user: multus\ncurrent-context: sandbox\n",
                api.url
            ),
        )?;
        let settings = w.join("macvtap.settings.json");
        std::fs::write(
            &settings,
            json!({"kubeletDir": node.kubelet_dir.path(), "podResourcesCheck": "enforce"})
                .to_string(),
        )?;
        std::fs::set_permissions(&settings, std::fs::Permissions::from_mode(0o644))?;
        let bindir = w.join("bin");
        let records = w.join("records");
        std::fs::create_dir_all(&bindir)?;
        std::fs::create_dir_all(&records)?;
        let ours = binary("macvtap-cni", "macvtap")?;
        let reference = test_support::gopeers::cni_plugins_dir()?;
        for plugin in RECORDED {
            let real = if plugin == "macvtap" {
                ours.clone()
            } else {
                reference.join(plugin)
            };
            ensure!(
                real.exists(),
                "{} is missing (the reference plugins are built from hack/peers/cni-plugins)",
                real.display()
            );
            write_recorder(&bindir, &records, plugin, &real)?;
        }
        Ok(Multus {
            bin,
            node_ns: node.ns.name.clone(),
            work,
            api,
            settings,
            runs: Mutex::new(0),
            _pod_resources: pod_resources,
        })
    }

    /// The Multus binary.
    pub fn binary(&self) -> &Path {
        &self.bin
    }

    /// Adds a NetworkAttachmentDefinition `namespace/name` with `config`
    /// as its `spec.config`, annotated with `resource` (full name) if given.
    pub fn add_nad(&self, namespace: &str, name: &str, resource: Option<&str>, config: &str) {
        let mut annotations = serde_json::Map::new();
        if let Some(r) = resource {
            annotations.insert(RESOURCE_NAME_ANNOTATION.into(), Value::from(r));
        }
        self.api.put_nad(json!({
            "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": namespace, "uid": format!("nad-{name}"),
                         "annotations": annotations},
            "spec": {"config": config}
        }));
    }

    /// Puts another plugin `name` (a shell `script`) in Multus' bin dir, for a
    /// NAD whose `type` names it.
    pub fn add_plugin(&self, name: &str, script: &str) -> Result<()> {
        let path = self.work.path().join("bin").join(name);
        std::fs::write(&path, script)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(())
    }

    /// Installs `real` as the `macvtap` plugin in Multus' bin dir (still
    /// recorded), replacing the file at once as an install step does: the
    /// upgrade e2e swaps the Go project's CNI and ours.
    pub fn set_macvtap(&self, real: &Path) -> Result<()> {
        let w = self.work.path();
        write_recorder(&w.join("bin"), &w.join("records"), "macvtap", real)
    }

    /// Adds the pod object.
    pub fn add_pod(&self, pod: &Pod) {
        self.api.put_pod(pod.object());
    }

    /// The Multus config the runtime reads from the CNI conf dir (what the
    /// thin plugin's entrypoint writes), with the cluster default network a
    /// `loopback` delegate.
    pub fn config(&self) -> Value {
        let w = self.work.path();
        json!({
            "cniVersion": "1.0.0",
            "name": "multus-cni-network",
            "type": "multus",
            "kubeconfig": w.join("kubeconfig"),
            "cniDir": w.join("cache"),
            "binDir": w.join("bin"),
            "logFile": w.join("multus.log"),
            "logLevel": "verbose",
            "logToStderr": false,
            "delegates": [{"cniVersion": "1.0.0", "name": "cluster", "type": "loopback"}]
        })
    }

    /// Multus' log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.work.path().join("multus.log")).unwrap_or_default()
    }

    /// Runs Multus for `command` (`ADD` or `DEL`) on the sandbox `netns` of
    /// `pod`, as containerd runs the CNI: from the node namespace,
    /// `CNI_IFNAME=eth0`, the container ID the sandbox's, `CNI_ARGS` with
    /// the pod's namespace, name, sandbox ID and UID.
    pub fn run(&self, command: &str, pod: &Pod, netns: &TestNs) -> Result<MultusRun> {
        let records = self.work.path().join("records");
        let before: Vec<PathBuf> = list(&records)?;
        let sandbox_id = format!("sandbox-{}", netns.name);
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={sandbox_id};K8S_POD_UID={}",
            pod.namespace, pod.name, pod.uid
        );
        let t = Instant::now();
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.node_ns])
            .arg(&self.bin)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &sandbox_id)
            .env("CNI_NETNS", netns.path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", test_support::gopeers::cni_plugins_dir()?)
            .env("CNI_ARGS", args)
            .env("MACVTAP_CNI_SETTINGS", &self.settings)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting multus")?;
        child
            .stdin
            .take()
            .context("stdin")?
            .write_all(self.config().to_string().as_bytes())?;
        let out = child.wait_with_output()?;
        let took = t.elapsed();
        *self.runs.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let mut calls = Vec::new();
        for env in list(&records)?
            .into_iter()
            .filter(|p| !before.contains(p) && p.extension().is_some_and(|e| e == "env"))
        {
            let text = std::fs::read_to_string(&env)?;
            let l: Vec<&str> = text.lines().collect();
            let stdin = std::fs::read_to_string(env.with_extension("stdin"))?;
            calls.push(DelegateCall {
                plugin: l.first().copied().unwrap_or_default().into(),
                command: l.get(1).copied().unwrap_or_default().into(),
                ifname: l.get(2).copied().unwrap_or_default().into(),
                args: l.get(3).copied().unwrap_or_default().into(),
                container_id: l.get(4).copied().unwrap_or_default().into(),
                settings_env: l.get(5).copied() == Some("set"),
                config: serde_json::from_str(&stdin)
                    .with_context(|| format!("{} passed no JSON: {stdin}", env.display()))?,
            });
        }
        Ok(MultusRun {
            ok: out.status.success(),
            json: if stdout.trim().is_empty() {
                Value::Null
            } else {
                serde_json::from_str(&stdout)
                    .with_context(|| format!("multus printed no JSON: {stdout}"))?
            },
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            took,
            calls,
        })
    }

    /// The network-status annotation Multus wrote into the pod, parsed.
    pub fn network_status(&self, pod: &Pod) -> Result<Value> {
        let obj = self
            .api
            .pod(&pod.namespace, &pod.name)
            .context("the pod is gone from the API server")?;
        let s = obj["metadata"]["annotations"][NETWORK_STATUS_ANNOTATION]
            .as_str()
            .context("Multus wrote no network-status annotation")?;
        Ok(serde_json::from_str(s)?)
    }
}

/// Writes `bindir/plugin`: a script that records what Multus passed
/// (config, `CNI_*`, whether the node settings reached it) under `records`
/// and runs `real` unchanged; written beside and renamed into place.
fn write_recorder(bindir: &Path, records: &Path, plugin: &str, real: &Path) -> Result<()> {
    let script = format!(
        "#!/bin/sh\n# Records what Multus passed to {plugin}, then runs it unchanged.\n\
         r={records}/$(date +%s%N)-$$\ncat > \"$r.stdin\"\n\
         printf '%s\\n' {plugin} \"$CNI_COMMAND\" \"$CNI_IFNAME\" \"$CNI_ARGS\" \
         \"$CNI_CONTAINERID\" \"${{MACVTAP_CNI_SETTINGS:+set}}\" > \"$r.env\"\n\
         exec {real} < \"$r.stdin\"\n",
        records = records.display(),
        real = real.display()
    );
    let path = bindir.join(plugin);
    let tmp = bindir.join(format!(".{plugin}.new"));
    std::fs::write(&tmp, script)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, &path)?;
    Ok(())
}

/// The files in `dir`, sorted (record names start with a timestamp).
fn list(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    v.sort();
    Ok(v)
}

impl MultusRun {
    /// The calls of `plugin`.
    pub fn calls_of(&self, plugin: &str) -> Vec<&DelegateCall> {
        self.calls.iter().filter(|c| c.plugin == plugin).collect()
    }

    /// One line per delegate call: plugin, ifname, args and the keys
    /// Multus injected (for printing what Multus did).
    pub fn describe(&self) -> Vec<String> {
        self.calls
            .iter()
            .map(|c| {
                let conf = &c.config;
                format!(
                    "{} {} CNI_IFNAME={} CNI_ARGS={} deviceID={} pciBusID={} prevResult={}",
                    c.command,
                    c.plugin,
                    c.ifname,
                    c.args,
                    conf["deviceID"],
                    conf["pciBusID"],
                    if conf["prevResult"].is_null() {
                        "no"
                    } else {
                        "yes"
                    }
                )
            })
            .collect()
    }
}
