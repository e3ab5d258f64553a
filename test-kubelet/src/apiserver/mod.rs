//! A plain-HTTP stand-in for the Kubernetes API server, inside a test
//! namespace, serving what our binaries and Multus ask of it: events.k8s.io
//! Events (created, patched while they exist, validated as the real server
//! validates them) and a list and watch of Nodes by name (each change
//! [`FakeApiServer::put_node`] makes streamed to the watches open, as
//! `MODIFIED` events in the real server's chunked JSON lines) for the
//! device plugin; GET of a Pod and of a
//! NetworkAttachmentDefinition, PUT of a Pod's status and POST of core
//! Events for Multus' thin plugin (multus-cni `pkg/multus/multus.go`
//! `GetPod`, `pkg/k8sclient/k8sclient.go` `getKubernetesDelegate` and
//! `SetPodNetworkStatusAnnotation`). It records every request.
//!
//! - [`validation`]: what the real server checks of an Event.
//! - `store`: the stored objects and the answer to each request.
//! - [`protobuf`]: the annotations of a Pod client-go sent as protobuf.

pub mod protobuf;
mod store;
pub mod validation;

use crate::lock;
use anyhow::{Context, Result};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use store::{Store, key_of, query_value, selected_name};
use test_support::TestNs;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
pub use validation::validate_event_v1;

/// How long [`FakeApiServer::next`] waits for a request.
const WAIT: Duration = Duration::from_secs(10);

/// One request the [`FakeApiServer`] got.
#[derive(Debug, Clone)]
pub struct ApiRequest {
    /// `GET`, `POST`, `PUT`, `PATCH`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The `Content-Type` header.
    pub content_type: String,
    /// The JSON body (null when it is not JSON, as a protobuf Pod).
    pub body: Value,
    /// The validation rules the Event broke (then the answer was 422).
    pub invalid: Vec<String>,
    /// The HTTP status answered.
    pub status: u16,
}

/// A plain-HTTP stand-in for the API server, on 127.0.0.1 inside a test
/// namespace, with a kubeconfig that points at it. Like the real one it
/// answers a create with 201 (409 for a name taken), a patch of a stored
/// Event with 200 and the patched object (404 for an Event it does not
/// hold), and an Event the validation of [`validate_event_v1`] refuses
/// with 422; it records every request.
pub struct FakeApiServer {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// A kubeconfig for it (for `KUBECONFIG`).
    pub kubeconfig: PathBuf,
    /// The requests, in arrival order, for [`FakeApiServer::next`].
    pub requests: tokio::sync::mpsc::UnboundedReceiver<ApiRequest>,
    store: Arc<Mutex<Store>>,
    log: Arc<Mutex<Vec<ApiRequest>>>,
    /// Each Node stored, to the watches open.
    nodes: tokio::sync::broadcast::Sender<Value>,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl FakeApiServer {
    /// Listens on a free port of 127.0.0.1 in `ns`.
    pub fn start(ns: &TestNs) -> Result<Self> {
        let std_listener = ns.run(|| Ok(std::net::TcpListener::bind("127.0.0.1:0")?))?;
        std_listener.set_nonblocking(true)?;
        let port = std_listener.local_addr()?.port();
        let listener = tokio::net::TcpListener::from_std(std_listener)?;
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
            ),
        )
        .with_context(|| format!("writing {}", kubeconfig.display()))?;
        let (tx, requests) = tokio::sync::mpsc::unbounded_channel();
        let store = Arc::new(Mutex::new(Store::default()));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (nodes, _) = tokio::sync::broadcast::channel(64);
        let (st, lg, nd) = (store.clone(), log.clone(), nodes.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let server = Server {
                    tx: tx.clone(),
                    store: st.clone(),
                    log: lg.clone(),
                    nodes: nd.clone(),
                };
                tokio::spawn(server.serve(stream));
            }
        });
        Ok(Self {
            url: format!("http://127.0.0.1:{port}"),
            kubeconfig,
            requests,
            store,
            log,
            nodes,
            _dir: dir,
            task,
        })
    }

    /// Adds or replaces a Node object (the next resourceVersion), and
    /// sends it to every watch of it that is open.
    pub fn put_node(&self, node: Value) {
        let stored = lock(&self.store).put_node(node);
        let _ = self.nodes.send(stored);
    }

    /// The next request, within 10 s.
    pub async fn next(&mut self) -> Result<ApiRequest> {
        tokio::time::timeout(WAIT, self.requests.recv())
            .await
            .context("the API server got no request in time")?
            .context("the API server stopped")
    }

    /// Every request answered so far, in order.
    pub fn log(&self) -> Vec<ApiRequest> {
        lock(&self.log).clone()
    }

    /// Adds (or replaces) a Pod object.
    pub fn put_pod(&self, pod: Value) {
        lock(&self.store).pods.insert(key_of(&pod), pod);
    }

    /// Adds (or replaces) a NetworkAttachmentDefinition object.
    pub fn put_nad(&self, nad: Value) {
        lock(&self.store).nads.insert(key_of(&nad), nad);
    }

    /// The Pod `namespace/name` as it is now (with what clients wrote).
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        lock(&self.store)
            .pods
            .get(&format!("{namespace}/{name}"))
            .cloned()
    }

    /// The events.k8s.io Event `namespace/name` as stored now.
    pub fn event(&self, namespace: &str, name: &str) -> Option<Value> {
        lock(&self.store)
            .events
            .get(&format!("{namespace}/{name}"))
            .cloned()
    }

    /// Deletes the Event `namespace/name`, as its TTL or a user does;
    /// whether it was there.
    pub fn delete_event(&self, namespace: &str, name: &str) -> bool {
        lock(&self.store)
            .events
            .remove(&format!("{namespace}/{name}"))
            .is_some()
    }

    /// Answers every request with `status` (a `Status` failure, nothing
    /// stored) from now on, or normally again with `None`.
    pub fn fail_with(&self, status: Option<u16>) {
        lock(&self.store).fail = status;
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What each connection task shares with the [`FakeApiServer`].
struct Server {
    tx: tokio::sync::mpsc::UnboundedSender<ApiRequest>,
    store: Arc<Mutex<Store>>,
    log: Arc<Mutex<Vec<ApiRequest>>>,
    nodes: tokio::sync::broadcast::Sender<Value>,
}

impl Server {
    /// Answers HTTP/1.1 requests on one (keep-alive) connection, until the
    /// client closes it or sends something that is not HTTP; a watch of
    /// Nodes streams until the client goes.
    async fn serve(self, stream: tokio::net::TcpStream) {
        let mut stream = BufReader::new(stream);
        // Subscribed before each request is read, so no change made while
        // a watch is set up is missed (the watch sends what is newer than
        // the version it asks from first).
        while let Ok(Some((req, watch))) =
            answer_one(&mut stream, &self.store, self.nodes.subscribe()).await
        {
            lock(&self.log).push(req.clone());
            let _ = self.tx.send(req);
            if let Some(w) = watch {
                let _ = w.stream(stream.get_mut()).await;
                return;
            }
        }
    }
}

/// A watch of one Node (or all) from a resourceVersion on: what to send.
struct NodeWatch {
    name: Option<String>,
    from: u64,
    current: Vec<Value>,
    changes: tokio::sync::broadcast::Receiver<Value>,
}

impl NodeWatch {
    /// Sends the chunked response: the Nodes newer than `from`, then each
    /// change, as `MODIFIED` events, until the client goes.
    async fn stream(mut self, out: &mut tokio::net::TcpStream) -> std::io::Result<()> {
        out.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .await?;
        let version = |n: &Value| {
            n["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let name = self.name.clone();
        let wanted = |n: &Value| {
            name.as_deref()
                .is_none_or(|want| n["metadata"]["name"] == want)
        };
        let mut sent = self.from;
        let current = std::mem::take(&mut self.current);
        for n in &current {
            if wanted(n) && version(n) > self.from {
                sent = sent.max(version(n));
                send_event(out, n).await?;
            }
        }
        loop {
            let node = match self.changes.recv().await {
                Ok(n) => n,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return Ok(()),
            };
            if wanted(&node) && version(&node) > sent {
                sent = version(&node);
                send_event(out, &node).await?;
            }
        }
    }
}

/// One watch event line, as one chunk.
async fn send_event(out: &mut tokio::net::TcpStream, node: &Value) -> std::io::Result<()> {
    let line = format!(
        "{}\n",
        serde_json::json!({"type": "MODIFIED", "object": node})
    );
    out.write_all(format!("{:x}\r\n{line}\r\n", line.len()).as_bytes())
        .await?;
    out.flush().await
}

/// Reads one request from `stream`, answers it, and returns it, with the
/// watch to stream when it asks for one (`changes` are the Nodes stored
/// from now on); `None` when the client closed the connection.
async fn answer_one(
    stream: &mut BufReader<tokio::net::TcpStream>,
    store: &Mutex<Store>,
    changes: tokio::sync::broadcast::Receiver<Value>,
) -> std::io::Result<Option<(ApiRequest, Option<NodeWatch>)>> {
    let mut request_line = String::new();
    if stream.read_line(&mut request_line).await? == 0 {
        return Ok(None);
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let (path, query) = (path.to_string(), query.to_string());
    let (mut length, mut content_type) = (0usize, String::new());
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).await? == 0 {
            return Ok(None);
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            match k.to_ascii_lowercase().as_str() {
                "content-length" => {
                    length = v
                        .trim()
                        .parse()
                        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?
                }
                "content-type" => content_type = v.trim().to_string(),
                _ => {}
            }
        }
    }
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await?;
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let watching = matches!(
        query_value(&query, "watch").as_deref(),
        Some("true") | Some("1")
    );
    if method == "GET" && path == "/api/v1/nodes" && watching {
        let name = selected_name(&query);
        let from = query_value(&query, "resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let current = lock(store).nodes.values().cloned().collect();
        let req = ApiRequest {
            method,
            path,
            content_type,
            body: json,
            invalid: Vec::new(),
            status: 200,
        };
        let watch = NodeWatch {
            name,
            from,
            current,
            changes,
        };
        return Ok(Some((req, Some(watch))));
    }
    let answer = lock(store).answer(&method, &path, &query, &body);
    let text = answer.body.to_string();
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        answer.status,
        reason_phrase(answer.status),
        text.len()
    );
    stream.get_mut().write_all(head.as_bytes()).await?;
    stream.get_mut().write_all(text.as_bytes()).await?;
    Ok(Some((
        ApiRequest {
            method,
            path,
            content_type,
            body: json,
            invalid: answer.invalid,
            status: answer.status,
        },
        None,
    )))
}

/// The reason phrase of the statuses the server answers.
fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        404 => "Not Found",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        500 => "Internal Server Error",
        _ => "Status",
    }
}
