//! A small fake Kubernetes API server: exactly the calls Multus' thin
//! plugin makes (multus-cni `pkg/multus/multus.go` `GetPod`,
//! `pkg/k8sclient/k8sclient.go` `getKubernetesDelegate` and
//! `SetPodNetworkStatusAnnotation`, the NAD client's `setPodNetworkStatus`
//! in `network-attachment-definition-client/pkg/utils/net-attach-def.go`,
//! and client-go's event sink): GET the pod, GET the
//! NetworkAttachmentDefinition, PUT the pod's status, POST events. Plain
//! HTTP on 127.0.0.1 inside the node namespace.

use super::NETWORK_STATUS_ANNOTATION;
use crate::sandbox::TestNs;
use anyhow::Result;
use prost::Message;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
                network_status_of_protobuf_pod(body)
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

/// The prefix of every object client-go sends as
/// `application/vnd.kubernetes.protobuf` (apimachinery
/// `pkg/runtime/serializer/protobuf/protobuf.go`, `protoEncodingPrefix`).
const PROTOBUF_PREFIX: &[u8] = b"k8s\0";

/// `runtime.Unknown` (apimachinery `pkg/runtime/generated.proto`), the
/// envelope after the prefix; only `raw`, the encoded object, is read.
#[derive(Clone, PartialEq, prost::Message)]
struct Unknown {
    #[prost(bytes = "vec", tag = "2")]
    raw: Vec<u8>,
}

/// `core/v1.Pod` (k8s.io/api `core/v1/generated.proto`); only `metadata`.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtobufPod {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
}

/// `meta/v1.ObjectMeta` (apimachinery `pkg/apis/meta/v1/generated.proto`);
/// only `annotations`.
#[derive(Clone, PartialEq, prost::Message)]
struct ObjectMeta {
    #[prost(map = "string, string", tag = "12")]
    annotations: HashMap<String, String>,
}

/// The network-status annotation of a pod client-go sent as protobuf,
/// decoded by prost; `None` when the body is not such a pod or has none.
fn network_status_of_protobuf_pod(body: &[u8]) -> Option<String> {
    let envelope = Unknown::decode(body.strip_prefix(PROTOBUF_PREFIX)?).ok()?;
    let pod = ProtobufPod::decode(envelope.raw.as_slice()).ok()?;
    pod.metadata?.annotations.remove(NETWORK_STATUS_ANNOTATION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_status_is_read_from_a_protobuf_pod() {
        let mut meta = ObjectMeta::default();
        meta.annotations.insert("other".into(), "x".into());
        meta.annotations
            .insert(NETWORK_STATUS_ANNOTATION.into(), "[{}]".into());
        let pod = ProtobufPod {
            metadata: Some(meta),
        };
        let mut body = PROTOBUF_PREFIX.to_vec();
        body.extend(
            Unknown {
                raw: pod.encode_to_vec(),
            }
            .encode_to_vec(),
        );
        assert_eq!(
            network_status_of_protobuf_pod(&body).as_deref(),
            Some("[{}]")
        );
        // No prefix, a cut body, no annotation: nothing.
        assert_eq!(network_status_of_protobuf_pod(&body[4..]), None);
        assert_eq!(
            network_status_of_protobuf_pod(&body[..body.len() - 2]),
            None
        );
        let bare = Unknown {
            raw: ProtobufPod::default().encode_to_vec(),
        };
        let mut body = PROTOBUF_PREFIX.to_vec();
        body.extend(bare.encode_to_vec());
        assert_eq!(network_status_of_protobuf_pod(&body), None);
    }
}
