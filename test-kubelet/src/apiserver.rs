//! A plain-HTTP stand-in for the Kubernetes API server, inside a test
//! namespace: it answers a create or patch with the object sent, refuses an
//! Event the real server's validation refuses, and records every request.

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::time::Duration;
use test_support::TestNs;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// How long [`FakeApiServer::next`] waits for a request.
const WAIT: Duration = Duration::from_secs(10);

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
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(serve_api_connection(stream, tx));
            }
        });
        Ok(Self {
            kubeconfig,
            requests,
            _dir: dir,
            task,
        })
    }

    /// The next request, within 10 s.
    pub async fn next(&mut self) -> Result<ApiRequest> {
        tokio::time::timeout(WAIT, self.requests.recv())
            .await
            .context("the API server got no request in time")?
            .context("the API server stopped")
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers HTTP/1.1 requests on one (keep-alive) connection, until the
/// client closes it or sends something that is not HTTP.
async fn serve_api_connection(
    stream: tokio::net::TcpStream,
    tx: tokio::sync::mpsc::UnboundedSender<ApiRequest>,
) {
    let mut stream = BufReader::new(stream);
    while let Ok(Some(req)) = answer_one(&mut stream).await {
        let _ = tx.send(req);
    }
}

/// Reads one request from `stream`, answers it, and returns it; `None` when
/// the client closed the connection.
async fn answer_one(
    stream: &mut BufReader<tokio::net::TcpStream>,
) -> std::io::Result<Option<ApiRequest>> {
    let mut request_line = String::new();
    if stream.read_line(&mut request_line).await? == 0 {
        return Ok(None);
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default().to_string();
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
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
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
        ("422 Unprocessable Entity", answer.to_string().into_bytes())
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        answer.len()
    );
    stream.get_mut().write_all(head.as_bytes()).await?;
    stream.get_mut().write_all(&answer).await?;
    Ok(Some(ApiRequest {
        method,
        path,
        content_type,
        body: json,
        invalid,
    }))
}
