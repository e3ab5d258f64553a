//! Helpers for the device plugin's kernel tests: a `test_support` namespace
//! as the node (a veth pair as its NIC), a temp kubelet directory, and the
//! real daemon binary running inside the namespace.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use macvtap_deviceplugin::testkubelet::TestKubelet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use test_support::tap_node_lock;
pub use test_support::{TestNs, require_root};

/// The generous deadline every wait uses.
pub const DEADLINE: Duration = Duration::from_secs(10);

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The daemon binary running inside a namespace.
pub struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// Starts `macvtap-deviceplugin ARGS` inside `ns` with `env` (and no
    /// inherited `DP_MACVTAP_CONF`), logging at debug level to a file.
    pub fn start(ns: &TestNs, log_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let log = log_dir.join(format!(
            "daemon-{}.log",
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &ns.name,
            env!("CARGO_BIN_EXE_macvtap-deviceplugin"),
        ])
        .args(args)
        .env_remove("DP_MACVTAP_CONF")
        // Events only where a test asks for them (with its own API server).
        .env_remove("NODE_NAME")
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "macvtap_deviceplugin=debug,info")
        .stdin(Stdio::null())
        .stdout(File::create(&log).unwrap())
        .stderr(File::create(log.with_extension("err")).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self {
            child: cmd.spawn().unwrap(),
            log,
        }
    }

    /// The daemon's process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.with_extension("err")).unwrap_or_default()
    }

    /// Sends a signal.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// Waits up to `timeout` for the daemon to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The daemon's resident memory in KiB (VmRSS).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("----- daemon log -----\n{}\n----- end -----", self.log());
        }
    }
}

/// A node: namespace with NIC `eth1`, a kubelet directory, a test kubelet
/// and the daemon.
pub struct Node {
    /// The daemon (dropped first).
    pub daemon: Option<Daemon>,
    /// The kubelet's registration endpoint.
    pub kubelet: Option<TestKubelet>,
    /// The node namespace.
    pub ns: TestNs,
    /// The kubelet directory.
    pub dir: tempfile::TempDir,
    /// Held for the node's life: see [`tap_node_lock`].
    _tap_lock: nix::fcntl::Flock<File>,
}

impl Node {
    /// A node with NIC `eth1` and no daemon or kubelet yet.
    pub fn new(tag: &str) -> Self {
        require_root().unwrap();
        let tap_lock = tap_node_lock().unwrap();
        let ns = TestNs::new(tag).unwrap();
        ns.add_nic("eth1").unwrap();
        Self {
            daemon: None,
            kubelet: None,
            ns,
            dir: tempfile::tempdir().unwrap(),
            _tap_lock: tap_lock,
        }
    }

    /// `<dir>/device-plugins`.
    pub fn plugin_dir(&self) -> PathBuf {
        self.dir.path().join("device-plugins")
    }

    /// Starts the test kubelet.
    pub async fn start_kubelet(&mut self) {
        self.kubelet = Some(TestKubelet::start(&self.plugin_dir()).await.unwrap());
    }

    /// The test kubelet.
    pub fn kubelet(&self) -> &TestKubelet {
        self.kubelet.as_ref().expect("kubelet started")
    }

    /// Starts the daemon with `--kubelet-dir`, metrics off, and `args`.
    pub fn start_daemon(&mut self, args: &[&str], env: &[(&str, &str)]) {
        let kdir = self.dir.path().to_str().unwrap().to_string();
        let mut all = vec!["--kubelet-dir", kdir.as_str()];
        if !args.iter().any(|a| a.starts_with("--metrics-addr")) {
            all.extend(["--metrics-addr", "off"]);
        }
        all.extend_from_slice(args);
        let d = Daemon::start(&self.ns, self.dir.path(), &all, env);
        self.daemon = Some(d);
    }

    /// The daemon.
    pub fn daemon(&mut self) -> &mut Daemon {
        self.daemon.as_mut().expect("daemon started")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Stop the daemon before the namespace goes.
        self.daemon.take();
        // Namespaces die asynchronously, and their macvtaps' /dev/tapN nodes
        // with them: delete the macvtaps now, while the tap-node lock is
        // held, so the next test cannot meet a stale node of the same index.
        let _ = self.ns.delete_macvtaps();
    }
}

/// The Events as `kubectl describe node` lists them (its `DescribeEvents`:
/// Age is "<last> (x<count> over <first>)" for a series, From is
/// `reportingController, reportingInstance`).
pub fn describe_events(objects: &[serde_json::Value]) -> String {
    let now = objects
        .iter()
        .filter_map(|o| {
            o["series"]["lastObservedTime"]
                .as_str()
                .or(o["eventTime"].as_str())
        })
        .max()
        .unwrap()
        .to_string();
    let secs = |t: &str| -> f64 {
        let p = |s: &str| -> f64 {
            let hms = &s[11..s.len() - 1];
            let mut it = hms.split(':');
            let h: f64 = it.next().unwrap().parse().unwrap();
            let m: f64 = it.next().unwrap().parse().unwrap();
            let s: f64 = it.next().unwrap().parse().unwrap();
            h * 3600.0 + m * 60.0 + s
        };
        (p(&now) - p(t)).max(0.0)
    };
    let mut out = String::from(
        "Events:\n  Type     Reason          Age               From                                                               Message\n  ----     ------          ----              ----                                                               -------\n",
    );
    for o in objects {
        let first = secs(o["eventTime"].as_str().unwrap());
        let age = match o["series"]["count"].as_i64() {
            Some(n) => format!(
                "{:.0}s (x{n} over {:.0}s)",
                secs(o["series"]["lastObservedTime"].as_str().unwrap()),
                first
            ),
            None => format!("{first:.0}s"),
        };
        out.push_str(&format!(
            "  {:<8} {:<15} {:<17} {:<66} {}\n",
            o["type"].as_str().unwrap(),
            o["reason"].as_str().unwrap(),
            age,
            format!(
                "{}, {}",
                o["reportingController"].as_str().unwrap(),
                o["reportingInstance"].as_str().unwrap()
            ),
            o["note"].as_str().unwrap()
        ));
    }
    out
}

/// What the API server checks of an events.k8s.io/v1 Event before storing
/// it (kubernetes/kubernetes `pkg/apis/core/validation/events.go`,
/// `ValidateEventCreate` for `events/v1`, and `validateV1EventSeries`), as
/// a list of the rules broken; in `namespace`, for a Node (cluster-scoped).
pub fn validate_event_v1(namespace: &str, e: &serde_json::Value) -> Vec<String> {
    let mut errs = Vec::new();
    let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
    let name = e["metadata"]["name"].as_str().unwrap_or_default();
    let dns_subdomain = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !dns_subdomain {
        errs.push(format!("metadata.name {name:?} is not a DNS subdomain"));
    }
    if s("eventTime").is_empty() {
        errs.push("eventTime: Required value".into());
    }
    if !["Normal", "Warning"].contains(&s("type").as_str()) {
        errs.push(format!(
            "type {:?} is neither Normal nor Warning",
            s("type")
        ));
    }
    for k in [
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
        "deprecatedSource",
    ] {
        if e.get(k).is_some_and(|v| !v.is_null()) {
            errs.push(format!("{k}: needs to be unset"));
        }
    }
    if e["deprecatedCount"].as_i64().unwrap_or(0) != 0 {
        errs.push("deprecatedCount: needs to be unset".into());
    }
    let controller = s("reportingController");
    if controller.is_empty() || controller.len() > 316 || !controller.contains('/') {
        errs.push(format!(
            "reportingController {controller:?} is not a qualified name"
        ));
    }
    for (k, max) in [
        ("reportingInstance", 128),
        ("action", 128),
        ("reason", 128),
        ("note", 1024),
    ] {
        let v = s(k);
        if (v.is_empty() && k != "note") || v.len() > max {
            errs.push(format!("{k}: required, at most {max} characters"));
        }
    }
    // A cluster-scoped object's Events live in namespace default.
    if e["regarding"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
        && namespace != "default"
    {
        errs.push(format!(
            "namespace {namespace} does not match the regarding object's"
        ));
    }
    if let Some(series) = e.get("series").filter(|v| !v.is_null()) {
        if series["count"].as_i64().unwrap_or(0) < 2 {
            errs.push("series.count: should be at least 2".into());
        }
        if series["lastObservedTime"]
            .as_str()
            .unwrap_or_default()
            .is_empty()
        {
            errs.push("series.lastObservedTime: Required value".into());
        }
    }
    errs
}

/// One request the [`FakeApiServer`] got.
#[derive(Debug, Clone)]
pub struct ApiRequest {
    /// `POST`, `PATCH`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The `Content-Type` header.
    pub content_type: String,
    /// The JSON body.
    pub body: serde_json::Value,
    /// The validation rules the body broke (then the answer was 422).
    pub invalid: Vec<String>,
}

/// A plain-HTTP stand-in for the API server, on 127.0.0.1 inside a test
/// namespace, with a kubeconfig that points at it. Like the real one
/// (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go` and
/// `patch.go`) it answers a create with 201 and a patch with 200 and the
/// stored object, and an Event the validation of [`validate_event_v1`]
/// refuses with 422; it records every request.
pub struct FakeApiServer {
    /// A kubeconfig for it (for `KUBECONFIG`).
    pub kubeconfig: PathBuf,
    /// The requests, in arrival order.
    pub requests: tokio::sync::mpsc::UnboundedReceiver<ApiRequest>,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl FakeApiServer {
    /// Listens on a free port of 127.0.0.1 in `ns`.
    pub fn start(ns: &TestNs) -> Self {
        let std_listener = ns
            .run(|| Ok(std::net::TcpListener::bind("127.0.0.1:0")?))
            .unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let port = std_listener.local_addr().unwrap().port();
        let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
            ),
        )
        .unwrap();
        let (tx, requests) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(serve_api_connection(stream, tx));
            }
        });
        Self {
            kubeconfig,
            requests,
            _dir: dir,
            task,
        }
    }

    /// The next request, within [`DEADLINE`].
    pub async fn next(&mut self) -> ApiRequest {
        tokio::time::timeout(DEADLINE, self.requests.recv())
            .await
            .expect("the API server got no request in time")
            .expect("the API server stopped")
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers HTTP/1.1 requests on one (keep-alive) connection.
async fn serve_api_connection(
    stream: tokio::net::TcpStream,
    tx: tokio::sync::mpsc::UnboundedSender<ApiRequest>,
) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let mut stream = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if stream.read_line(&mut request_line).await.unwrap_or(0) == 0 {
            return;
        }
        let mut parts = request_line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let target = parts.next().unwrap_or_default();
        let path = target.split('?').next().unwrap_or_default().to_string();
        let (mut length, mut content_type) = (0usize, String::new());
        loop {
            let mut line = String::new();
            if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                match k.to_ascii_lowercase().as_str() {
                    "content-length" => length = v.trim().parse().unwrap(),
                    "content-type" => content_type = v.trim().to_string(),
                    _ => {}
                }
            }
        }
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await.unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
        let namespace = path
            .split("/namespaces/")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .unwrap_or_default()
            .to_string();
        let invalid = validate_event_v1(&namespace, &json);
        let (status, answer) = if invalid.is_empty() {
            let status = if method == "POST" {
                "201 Created"
            } else {
                "200 OK"
            };
            (status, body)
        } else {
            let message = format!("Event is invalid: {}", invalid.join(", "));
            let answer = serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "reason": "Invalid", "code": 422, "message": message,
            });
            (
                "422 Unprocessable Entity",
                serde_json::to_vec(&answer).unwrap(),
            )
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            answer.len()
        );
        stream.get_mut().write_all(head.as_bytes()).await.unwrap();
        stream.get_mut().write_all(&answer).await.unwrap();
        let _ = tx.send(ApiRequest {
            method,
            path,
            content_type,
            body: json,
            invalid,
        });
    }
}

/// Fetches `path` from the metrics server at `127.0.0.1:9402` inside `ns`
/// (the daemon's `--metrics-addr` in these tests) and returns the response.
pub fn http_get(ns: &TestNs, path: &str) -> String {
    use std::io::{Read, Write};
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    ns.run(move || {
        let mut s = std::net::TcpStream::connect("127.0.0.1:9402")?;
        s.write_all(req.as_bytes())?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
    .unwrap()
}

/// Waits until the daemon's log satisfies `pred`, and returns it.
pub async fn wait_log(node: &mut Node, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let end = Instant::now() + DEADLINE;
    loop {
        let log = node.daemon().log();
        if pred(&log) {
            return log;
        }
        assert!(Instant::now() < end, "no {what} in the daemon log:\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
