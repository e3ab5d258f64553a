//! What the fake API server stores (Pods, NetworkAttachmentDefinitions,
//! events.k8s.io Events, Nodes) and how it answers each request it serves,
//! as the real one does (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/`
//! `get.go`, `create.go`, `update.go`, `patch.go`).

use super::protobuf::annotations_of_protobuf_pod;
use super::validation::validate_event_v1;
use serde_json::{Value, json};
use std::collections::HashMap;

/// The objects the server holds, keyed `namespace/name`, and the answer it
/// forces on every request, if any.
#[derive(Default)]
pub(super) struct Store {
    pub(super) pods: HashMap<String, Value>,
    pub(super) nads: HashMap<String, Value>,
    pub(super) events: HashMap<String, Value>,
    /// Nodes by name, each with its `metadata.resourceVersion`.
    pub(super) nodes: HashMap<String, Value>,
    /// The last resourceVersion given out.
    pub(super) version: u64,
    pub(super) fail: Option<u16>,
}

/// The value of `key` in a request's query string, percent-decoded as far
/// as field selectors need (`%3D` is `=`, `%2F` is `/`).
pub(super) fn query_value(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| {
            v.replace("%3D", "=")
                .replace("%3d", "=")
                .replace("%2F", "/")
                .replace("%2f", "/")
        })
    })
}

/// The node name a field selector `metadata.name=NAME` asks for.
pub(super) fn selected_name(query: &str) -> Option<String> {
    query_value(query, "fieldSelector")?
        .strip_prefix("metadata.name=")
        .map(str::to_string)
}

/// One answer: the HTTP status, the JSON body, and the validation rules an
/// Event broke (then the status is 422).
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) body: Value,
    pub(super) invalid: Vec<String>,
}

impl Answer {
    fn ok(status: u16, body: Value) -> Self {
        Self {
            status,
            body,
            invalid: Vec::new(),
        }
    }

    /// A Kubernetes `Status` error object.
    fn failure(status: u16, reason: &str, message: &str) -> Self {
        Self::ok(
            status,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": message, "reason": reason, "code": status}),
        )
    }

    fn not_found(resource: &str, name: &str) -> Self {
        Self::failure(404, "NotFound", &format!("{resource} \"{name}\" not found"))
    }

    fn invalid(errs: Vec<String>) -> Self {
        let mut a = Self::failure(
            422,
            "Invalid",
            &format!("Event is invalid: {}", errs.join(", ")),
        );
        a.invalid = errs;
        a
    }
}

/// The stored key of `obj`: `namespace/name`.
pub(super) fn key_of(obj: &Value) -> String {
    format!(
        "{}/{}",
        obj["metadata"]["namespace"].as_str().unwrap_or_default(),
        obj["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// Applies a JSON merge patch (RFC 7386), as the API server applies a
/// `Patch::Merge`.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Some(t) = target.as_object_mut() {
        for (k, v) in fields {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

impl Store {
    /// Stores `node` (a Node object) with the next resourceVersion, and
    /// returns it as stored.
    pub(super) fn put_node(&mut self, mut node: Value) -> Value {
        self.version += 1;
        node["metadata"]["resourceVersion"] = Value::from(self.version.to_string());
        let name = node["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        self.nodes.insert(name, node.clone());
        node
    }

    /// Answers `method path?query` with `body` (JSON, or a protobuf Pod),
    /// and changes what is stored as the real server would.
    pub(super) fn answer(&mut self, method: &str, path: &str, query: &str, body: &[u8]) -> Answer {
        if let Some(status) = self.fail {
            return Answer::failure(
                status,
                "InternalError",
                "the fake API server fails on purpose",
            );
        }
        let json: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let seg: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (method, seg.as_slice()) {
            // A list of Nodes, by a field selector on the name (kube's
            // watcher and `doctor` ask so); a watch is streamed instead.
            ("GET", ["api", "v1", "nodes"]) => {
                let items: Vec<Value> = self
                    .nodes
                    .values()
                    .filter(|n| {
                        selected_name(query)
                            .is_none_or(|want| n["metadata"]["name"] == want.as_str())
                    })
                    .cloned()
                    .collect();
                Answer::ok(
                    200,
                    json!({"apiVersion": "v1", "kind": "NodeList",
                           "metadata": {"resourceVersion": self.version.to_string()},
                           "items": items}),
                )
            }
            ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => {
                match self.pods.get(&format!("{ns}/{name}")) {
                    Some(p) => Answer::ok(200, p.clone()),
                    None => Answer::not_found("pods", name),
                }
            }
            ("PUT", ["api", "v1", "namespaces", ns, "pods", name, "status"]) => {
                self.put_pod_status(ns, name, body, &json)
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
            ) => match self.nads.get(&format!("{ns}/{name}")) {
                Some(n) => Answer::ok(200, n.clone()),
                None => Answer::not_found("network-attachment-definitions.k8s.cni.cncf.io", name),
            },
            // client-go's core/v1 event sink (Multus): accepted, not kept.
            ("POST", ["api", "v1", "namespaces", ns, "events"]) => Answer::ok(
                201,
                json!({"kind": "Event", "apiVersion": "v1",
                       "metadata": {"name": "multus-event", "namespace": ns}}),
            ),
            ("POST", ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"]) => {
                let invalid = validate_event_v1(ns, &json);
                if !invalid.is_empty() {
                    return Answer::invalid(invalid);
                }
                let name = json["metadata"]["name"].as_str().unwrap_or_default();
                let key = format!("{ns}/{name}");
                if self.events.contains_key(&key) {
                    return Answer::failure(
                        409,
                        "AlreadyExists",
                        &format!("events.events.k8s.io \"{name}\" already exists"),
                    );
                }
                self.events.insert(key, json.clone());
                Answer::ok(201, json)
            }
            (
                "PATCH",
                [
                    "apis",
                    "events.k8s.io",
                    "v1",
                    "namespaces",
                    ns,
                    "events",
                    name,
                ],
            ) => {
                let key = format!("{ns}/{name}");
                let Some(stored) = self.events.get(&key) else {
                    return Answer::not_found("events.events.k8s.io", name);
                };
                let mut patched = stored.clone();
                merge_patch(&mut patched, &json);
                let invalid = validate_event_v1(ns, &patched);
                if !invalid.is_empty() {
                    return Answer::invalid(invalid);
                }
                self.events.insert(key, patched.clone());
                Answer::ok(200, patched)
            }
            _ => Answer::not_found(method, path),
        }
    }

    /// `PUT .../pods/NAME/status`: the annotations of the pod sent (JSON, or
    /// protobuf as client-go sends it) replace the stored pod's, the only
    /// change Multus makes (its network-status annotation).
    fn put_pod_status(&mut self, ns: &str, name: &str, body: &[u8], json: &Value) -> Answer {
        let Some(pod) = self.pods.get_mut(&format!("{ns}/{name}")) else {
            return Answer::not_found("pods", name);
        };
        let annotations: Option<serde_json::Map<String, Value>> = if body.first() == Some(&b'{') {
            json["metadata"]["annotations"].as_object().cloned()
        } else {
            annotations_of_protobuf_pod(body)
                .map(|a| a.into_iter().map(|(k, v)| (k, Value::from(v))).collect())
        };
        let Some(annotations) = annotations else {
            return Answer::failure(400, "BadRequest", "the body is not a pod with metadata");
        };
        for (k, v) in annotations {
            pod["metadata"]["annotations"][k] = v;
        }
        Answer::ok(200, pod.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str) -> Value {
        json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "default"},
            "eventTime": "2026-01-01T00:00:00.000000Z", "type": "Normal",
            "reason": "R", "action": "A", "note": "n",
            "reportingController": "x.io/c", "reportingInstance": "i",
            "regarding": {"kind": "Node", "name": "n"},
        })
    }

    const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

    #[test]
    fn events_are_stored_and_only_a_stored_one_is_patched() {
        let mut s = Store::default();
        let body = event("n.1").to_string();
        let patch =
            json!({"series": {"count": 2, "lastObservedTime": "2026-01-01T00:00:01.000000Z"}})
                .to_string();
        let path = format!("{EVENTS}/n.1");
        assert_eq!(s.answer("PATCH", &path, "", patch.as_bytes()).status, 404);
        assert_eq!(s.answer("POST", EVENTS, "", body.as_bytes()).status, 201);
        assert_eq!(s.answer("POST", EVENTS, "", body.as_bytes()).status, 409);
        let a = s.answer("PATCH", &path, "", patch.as_bytes());
        assert_eq!(a.status, 200);
        assert_eq!(a.body["series"]["count"], 2);
        assert_eq!(a.body["reason"], "R");
        // A patch that breaks the validation is refused and not stored.
        let bad = json!({"series": {"count": 1}}).to_string();
        assert_eq!(s.answer("PATCH", &path, "", bad.as_bytes()).status, 422);
        assert_eq!(s.events["default/n.1"]["series"]["count"], 2);
        s.events.clear();
        assert_eq!(s.answer("PATCH", &path, "", patch.as_bytes()).status, 404);
        s.fail = Some(500);
        assert_eq!(s.answer("POST", EVENTS, "", body.as_bytes()).status, 500);
        assert!(s.events.is_empty());
    }

    #[test]
    fn a_pod_status_put_takes_the_annotations_sent() {
        let mut s = Store::default();
        let pod = json!({"metadata": {"name": "p", "namespace": "d", "annotations": {"a": "1"}}});
        s.pods.insert(key_of(&pod), pod);
        let path = "/api/v1/namespaces/d/pods/p/status";
        let put = json!({"metadata": {"annotations": {"b": "2"}}}).to_string();
        let a = s.answer("PUT", path, "", put.as_bytes());
        assert_eq!(a.status, 200);
        assert_eq!(
            a.body["metadata"]["annotations"],
            json!({"a": "1", "b": "2"})
        );
        assert_eq!(s.answer("PUT", path, "", b"not a pod").status, 400);
        let missing = "/api/v1/namespaces/d/pods/q/status";
        assert_eq!(s.answer("PUT", missing, "", put.as_bytes()).status, 404);
    }

    #[test]
    fn nodes_are_listed_by_name_with_their_versions() {
        let mut s = Store::default();
        s.put_node(json!({"metadata": {"name": "a"}}));
        s.put_node(json!({"metadata": {"name": "b", "labels": {"role": "dp"}}}));
        let a = s.answer(
            "GET",
            "/api/v1/nodes",
            "fieldSelector=metadata.name%3Db&limit=500",
            b"",
        );
        assert_eq!(a.status, 200);
        assert_eq!(a.body["metadata"]["resourceVersion"], "2");
        let items = a.body["items"].as_array().unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0]["metadata"]["labels"]["role"], "dp");
        assert_eq!(items[0]["metadata"]["resourceVersion"], "2");
        let all = s.answer("GET", "/api/v1/nodes", "", b"");
        assert_eq!(all.body["items"].as_array().unwrap().len(), 2);
        assert_eq!(
            query_value("a=1&watch=true", "watch").as_deref(),
            Some("true")
        );
    }
}
