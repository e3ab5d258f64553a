//! The real Multus (thin plugin, v4.2.2) on the sandbox node, run as a
//! container runtime runs it, with what it needs around it.
//!
//! - [`build`] compiles Multus once from `../shared/peers/multus-v4.2.2.tar.gz`
//!   (outside the repository; see that directory's README) with Go 1.23
//!   into `target/e2e-multus/` and caches it.
//! - [`ApiServer`] is a small fake Kubernetes API server: exactly the calls
//!   the thin plugin makes (multus-cni `pkg/multus/multus.go` `GetPod`,
//!   `pkg/k8sclient/k8sclient.go` `getKubernetesDelegate` and
//!   `SetPodNetworkStatusAnnotation`, the NAD client's `setPodNetworkStatus`
//!   in `network-attachment-definition-client/pkg/utils/net-attach-def.go`,
//!   and client-go's event sink): GET the pod, GET the
//!   NetworkAttachmentDefinition, PUT the pod's status, POST events. Plain
//!   HTTP on 127.0.0.1 inside the node namespace.
//! - [`HostPodResources`] serves the node's PodResources at the one path
//!   Multus reads (`pkg/kubeletclient/kubeletclient.go`:
//!   `/var/lib/kubelet/pod-resources/kubelet.sock`, no setting).
//! - [`Multus`] writes the runtime's Multus config (the cluster default
//!   network a `loopback` delegate), a kubeconfig, the CNI's node settings
//!   (`podResourcesCheck: enforce` against the same PodResources server),
//!   and runs ADD and DEL as containerd does: `CNI_IFNAME=eth0`,
//!   `CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE;K8S_POD_NAME;
//!   K8S_POD_INFRA_CONTAINER_ID;K8S_POD_UID`. Each delegate Multus runs
//!   through its bin dir is recorded ([`DelegateCall`]) and then executed
//!   unchanged.

use crate::kubelet_socket::LenientPodResources;
use crate::node::{Node, binary};
use crate::sandbox::TestNs;
use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The Multus release the e2e runs.
pub const VERSION: &str = "v4.2.2";
/// The path where Multus reads the kubelet's PodResources API (fixed).
pub const HOST_POD_RESOURCES: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// The Go 1.23 compiler from Debian's bookworm-backports (`hack/setup.sh`).
pub const GO: &str = "/usr/lib/go-1.23/bin/go";
/// The annotation that selects a pod's networks.
pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";
/// The annotation Multus writes with what each network got.
pub const NETWORK_STATUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/network-status";
/// The NAD annotation naming the device plugin resource.
pub const RESOURCE_NAME_ANNOTATION: &str = "k8s.v1.cni.cncf.io/resourceName";
const HOST_POD_RESOURCES_LOCK: &str = "/tmp/macvtap-host-pod-resources.lock";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where the peer sources live on this machine when the checkout is not
/// beside them (a clone elsewhere, as CI makes one).
const MACHINE_PEERS: &str = "/work/shared/peers";

/// The environment variable naming the peers directory explicitly.
pub const PEERS_ENV: &str = "MACVTAP_PEERS_DIR";

/// The source tarball: in `$MACVTAP_PEERS_DIR`, else in `shared/peers/`
/// beside the repository or beside any directory above it, else in this
/// machine's `/work/shared/peers`. The first candidate is returned (for the
/// error message) when none exists.
pub fn tarball() -> PathBuf {
    let name = format!("multus-{VERSION}.tar.gz");
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(d) = std::env::var(PEERS_ENV) {
        candidates.push(PathBuf::from(d).join(&name));
    }
    let root = workspace().canonicalize().unwrap_or_else(|_| workspace());
    for dir in root.ancestors().skip(1) {
        candidates.push(dir.join("shared/peers").join(&name));
    }
    candidates.push(Path::new(MACHINE_PEERS).join(&name));
    candidates
        .iter()
        .find(|p| p.exists())
        .or(candidates.first())
        .cloned()
        .unwrap_or_else(|| Path::new(MACHINE_PEERS).join(&name))
}

/// Builds Multus once into `target/e2e-multus/<version>/multus` and returns
/// its path; later calls (any process) reuse it. Fails, saying what is
/// missing, when the source or Go 1.23 is not there.
pub fn build() -> Result<PathBuf> {
    let dir = workspace().join("target/e2e-multus").join(VERSION);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let bin = dir.join("multus");
    let lock = std::fs::File::create(dir.join(".lock"))?;
    let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("locking the Multus build: {e}"))?;
    if bin.exists() {
        return Ok(bin);
    }
    let src_tar = tarball();
    if !src_tar.exists() {
        bail!(
            "the Multus {VERSION} source is missing at {} (also looked in shared/peers/ above \
             the repository and in {MACHINE_PEERS}; set {PEERS_ENV} to its directory): the node \
             e2e runs the real Multus and builds it from that tarball (see \
             ../shared/peers/README.md)",
            src_tar.display()
        );
    }
    if !Path::new(GO).exists() {
        bail!(
            "{GO} is missing: the node e2e builds the real Multus {VERSION} with Go 1.23; \
             run hack/setup.sh (it installs golang-1.23-go from bookworm-backports)"
        );
    }
    let src = dir.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src)?;
    let t = Instant::now();
    let out = Command::new("tar")
        .arg("-xzf")
        .arg(&src_tar)
        .arg("-C")
        .arg(&src)
        .output()
        .context("running tar")?;
    ensure!(
        out.status.success(),
        "unpacking {}: {}",
        src_tar.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let tmp = dir.join("multus.tmp");
    let out = Command::new(GO)
        .args(["build", "-mod=vendor", "-o"])
        .arg(&tmp)
        .arg("./cmd/multus")
        .current_dir(&src)
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", "")
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .output()
        .context("running go build")?;
    ensure!(
        out.status.success(),
        "building Multus {VERSION} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &bin)?;
    // The build cache and the source are not needed again.
    let _ = std::fs::remove_dir_all(&src);
    let _ = std::fs::remove_dir_all(dir.join("gocache"));
    let _ = Command::new("chmod")
        .args(["-R", "u+w"])
        .arg(dir.join("gopath"))
        .status();
    let _ = std::fs::remove_dir_all(dir.join("gopath"));
    eprintln!(
        "built Multus {VERSION} in {:.1} s into {}",
        t.elapsed().as_secs_f64(),
        bin.display()
    );
    Ok(bin)
}

/// One request the fake API server answered.
#[derive(Debug, Clone)]
pub struct ApiRequest {
    /// `GET`, `PUT`, `POST`, ...
    pub method: String,
    /// The path without the query.
    pub path: String,
    /// The request's `Content-Type`.
    pub content_type: String,
    /// The HTTP status answered.
    pub status: u16,
}

#[derive(Default)]
struct ApiState {
    /// `namespace/name` → Pod object.
    pods: HashMap<String, Value>,
    /// `namespace/name` → NetworkAttachmentDefinition object.
    nads: HashMap<String, Value>,
    requests: Vec<ApiRequest>,
}

/// A fake Kubernetes API server serving exactly what Multus' thin plugin
/// asks for, on 127.0.0.1 inside a network namespace; stops on drop.
pub struct ApiServer {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    state: Arc<Mutex<ApiState>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    port: u16,
    ns: String,
}

fn lock(state: &Mutex<ApiState>) -> std::sync::MutexGuard<'_, ApiState> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl ApiServer {
    /// Listens on 127.0.0.1 (a free port) inside `ns`.
    pub fn start(ns: &TestNs) -> Result<Self> {
        let listener = ns.run(|| Ok(TcpListener::bind("127.0.0.1:0")?))?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(Mutex::new(ApiState::default()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if sp.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                std::thread::spawn(move || {
                    let _ = serve_connection(conn, &st);
                });
            }
        });
        Ok(ApiServer {
            url: format!("http://127.0.0.1:{port}"),
            state,
            stop,
            port,
            ns: ns.name.clone(),
        })
    }

    /// Adds (or replaces) a pod object.
    pub fn put_pod(&self, pod: Value) {
        let key = format!(
            "{}/{}",
            pod["metadata"]["namespace"].as_str().unwrap_or_default(),
            pod["metadata"]["name"].as_str().unwrap_or_default()
        );
        lock(&self.state).pods.insert(key, pod);
    }

    /// Adds (or replaces) a NetworkAttachmentDefinition object.
    pub fn put_nad(&self, nad: Value) {
        let key = format!(
            "{}/{}",
            nad["metadata"]["namespace"].as_str().unwrap_or_default(),
            nad["metadata"]["name"].as_str().unwrap_or_default()
        );
        lock(&self.state).nads.insert(key, nad);
    }

    /// The pod object as it is now (with what Multus wrote into it).
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        lock(&self.state)
            .pods
            .get(&format!("{namespace}/{name}"))
            .cloned()
    }

    /// Every request answered so far.
    pub fn requests(&self) -> Vec<ApiRequest> {
        lock(&self.state).requests.clone()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wake the accept loop.
        let port = self.port;
        let ns = self.ns.clone();
        if let Ok(n) = macvtap_link::Netns::open(format!("/run/netns/{ns}")) {
            let _ = n.run(|| Ok(TcpStream::connect(("127.0.0.1", port)).map(drop)));
        }
    }
}

/// A Kubernetes `Status` error object.
fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn serve_connection(conn: TcpStream, state: &Mutex<ApiState>) -> Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut out = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let target = parts.next().unwrap_or_default().to_string();
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h)?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let len: usize = headers
            .get("content-length")
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        reader.read_exact(&mut body)?;
        let path = target.split('?').next().unwrap_or_default().to_string();
        let (code, answer) = answer(state, &method, &path, &body);
        lock(state).requests.push(ApiRequest {
            method,
            path,
            content_type: headers.get("content-type").cloned().unwrap_or_default(),
            status: code,
        });
        let text = answer.to_string();
        write!(
            out,
            "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
            text.len()
        )?;
        out.flush()?;
    }
}

/// What the API server answers to one request.
fn answer(state: &Mutex<ApiState>, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let seg: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let mut st = lock(state);
    match (method, seg.as_slice()) {
        ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => {
            match st.pods.get(&format!("{ns}/{name}")) {
                Some(p) => (200, p.clone()),
                None => (
                    404,
                    status(404, "NotFound", &format!("pods \"{name}\" not found")),
                ),
            }
        }
        ("PUT", ["api", "v1", "namespaces", ns, "pods", name, "status"]) => {
            let Some(pod) = st.pods.get_mut(&format!("{ns}/{name}")) else {
                return (
                    404,
                    status(404, "NotFound", &format!("pods \"{name}\" not found")),
                );
            };
            // client-go sends the pod as protobuf; Multus changes only the
            // network-status annotation, so that is what is taken from it.
            let value = if body.first() == Some(&b'{') {
                serde_json::from_slice::<Value>(body).ok().and_then(|v| {
                    v["metadata"]["annotations"][NETWORK_STATUS_ANNOTATION]
                        .as_str()
                        .map(str::to_string)
                })
            } else {
                proto_string_after(body, NETWORK_STATUS_ANNOTATION.as_bytes())
            };
            match value {
                Some(v) => {
                    pod["metadata"]["annotations"][NETWORK_STATUS_ANNOTATION] = Value::from(v);
                    (200, pod.clone())
                }
                None => (
                    400,
                    status(
                        400,
                        "BadRequest",
                        "no network-status annotation in the body",
                    ),
                ),
            }
        }
        (
            "GET",
            [
                "apis",
                "k8s.cni.cncf.io",
                "v1",
                "namespaces",
                ns,
                "network-attachment-definitions",
                name,
            ],
        ) => match st.nads.get(&format!("{ns}/{name}")) {
            Some(n) => (200, n.clone()),
            None => (
                404,
                status(
                    404,
                    "NotFound",
                    &format!("network-attachment-definitions.k8s.cni.cncf.io \"{name}\" not found"),
                ),
            ),
        },
        ("POST", ["api", "v1", "namespaces", ns, "events"]) => (
            201,
            json!({"kind": "Event", "apiVersion": "v1",
                   "metadata": {"name": "multus-event", "namespace": ns}}),
        ),
        _ => (
            404,
            status(404, "NotFound", &format!("{method} {path} is not served")),
        ),
    }
}

/// In a protobuf message, the length-delimited string (field 2) that
/// follows `key`: how a `map<string,string>` entry stores a value.
fn proto_string_after(body: &[u8], key: &[u8]) -> Option<String> {
    let at = body.windows(key.len()).position(|w| w == key)? + key.len();
    if body.get(at) != Some(&0x12) {
        return None;
    }
    let (mut len, mut shift, mut i) = (0usize, 0, at + 1);
    loop {
        let b = *body.get(i)?;
        len |= usize::from(b & 0x7f) << shift;
        i += 1;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    let v = body.get(i..i + len)?;
    String::from_utf8(v.to_vec()).ok()
}

/// The node's PodResources API, also served at [`HOST_POD_RESOURCES`] for
/// as long as this lives (see [`crate::kubelet_socket`]); tests that use
/// that path are serialised by an exclusive `flock`.
pub struct HostPodResources {
    created_dirs: Vec<PathBuf>,
    server: Option<LenientPodResources>,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl HostPodResources {
    /// Serves [`HOST_POD_RESOURCES`] with what the node's socket `upstream`
    /// answers, creating only the missing directories. Refuses when a live
    /// socket or anything else is there (a real kubelet's: these tests must
    /// not run on a real node).
    pub fn serve(upstream: &Path) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(HOST_POD_RESOURCES_LOCK)?;
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| anyhow::anyhow!("locking {HOST_POD_RESOURCES_LOCK}: {e}"))?;
        let path = Path::new(HOST_POD_RESOURCES);
        claim_socket_path(path)?;
        let mut me = HostPodResources {
            created_dirs: Vec::new(),
            server: None,
            _lock: lock,
        };
        let mut missing = Vec::new();
        let mut d = path.parent();
        while let Some(dir) = d.filter(|d| !d.exists()) {
            missing.push(dir.to_path_buf());
            d = dir.parent();
        }
        for dir in missing.into_iter().rev() {
            std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
            me.created_dirs.push(dir);
        }
        me.server = Some(LenientPodResources::serve(path, upstream)?);
        Ok(me)
    }
}

/// Makes `path` free for a socket: nothing there is fine; a socket nobody
/// listens on (what a killed run of these tests leaves) is removed; a live
/// socket or anything else is refused.
fn claim_socket_path(path: &Path) -> Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    let stale = std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type())
        && std::os::unix::net::UnixStream::connect(path).is_err();
    if !stale {
        bail!(
            "refusing to run: {} already exists and is not a dead socket (a real kubelet's \
             PodResources socket?). The node e2e serves its test kubelet's PodResources there \
             for Multus; run it on a machine that is not a Kubernetes node",
            path.display()
        );
    }
    std::fs::remove_file(path)?;
    Ok(())
}

impl Drop for HostPodResources {
    fn drop(&mut self) {
        // Removes the socket it created.
        self.server.take();
        for d in self.created_dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

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
    pub api: ApiServer,
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
        let api = ApiServer::start(&node.ns)?;
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
        for plugin in RECORDED {
            let real = if plugin == "macvtap" {
                ours.clone()
            } else {
                PathBuf::from("/usr/lib/cni").join(plugin)
            };
            ensure!(
                real.exists(),
                "{} is missing (apt-get install containernetworking-plugins)",
                real.display()
            );
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
            std::fs::write(&path, script)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
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
            .env("CNI_PATH", "/usr/lib/cni")
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

/// KubeVirt's pod interface name for a secondary network: `pod` followed by
/// the first 11 hex digits of sha256(network name) (kubevirt
/// `pkg/network/namescheme/networknamescheme.go`, hashed scheme).
pub fn kubevirt_pod_ifname(network: &str) -> String {
    let out = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            if let Some(mut i) = c.stdin.take() {
                i.write_all(network.as_bytes())?;
            }
            c.wait_with_output()
        });
    let hex: String = out
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .chars()
                .take(11)
                .collect()
        })
        .unwrap_or_default();
    format!("pod{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_socket_is_refused_and_a_dead_one_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet.sock");
        claim_socket_path(&path).unwrap();
        let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let err = claim_socket_path(&path).unwrap_err().to_string();
        assert!(err.contains("refusing to run"), "{err}");
        assert!(path.exists());
        drop(live);
        claim_socket_path(&path).unwrap();
        assert!(!path.exists());
        std::fs::write(&path, "").unwrap();
        assert!(claim_socket_path(&path).is_err());
    }

    #[test]
    fn kubevirt_names_the_dataplane_interface_as_it_does() {
        assert_eq!(kubevirt_pod_ifname("dataplane"), "pod9d32cad27e2");
    }

    #[test]
    fn a_protobuf_map_value_is_found_after_its_key() {
        let mut body = b"\x0a\x05other".to_vec();
        body.extend_from_slice(NETWORK_STATUS_ANNOTATION.as_bytes());
        body.push(0x12);
        body.push(4);
        body.extend_from_slice(b"[{}]");
        assert_eq!(
            proto_string_after(&body, NETWORK_STATUS_ANNOTATION.as_bytes()).as_deref(),
            Some("[{}]")
        );
    }
}
