//! Kubernetes Events on the Node: a real `kube::Client` and the real
//! `kube::runtime::events::Recorder` over an in-process API server that
//! records every request, so the tests see the exact objects and verbs a
//! cluster would get.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::describe_events as describe;

use macvtap_deviceplugin::operator::events::{CONTROLLER, EventSink, NodeEvent, REFUSED_PAUSE};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

const DEADLINE: Duration = Duration::from_secs(10);
const NODE: &str = "node-a";
const R: &str = "macvtap.network.kubevirt.io/dataplane";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

/// One request the API server got.
#[derive(Debug)]
struct Request {
    method: String,
    path: String,
    content_type: String,
    body: Value,
}

/// A client whose API server records requests and answers `status`
/// (201/200 echoing the object, as the API server returns the stored
/// object, or an RBAC refusal for 403). Like the real one it patches only
/// an Event it created: a PATCH of another name is 404.
fn api_server(status: u16) -> (kube::Client, mpsc::UnboundedReceiver<Request>) {
    let (client, rx, _) = switchable_api_server(status);
    (client, rx)
}

/// [`api_server`] whose answer the test switches (403 to refuse, else
/// store) through the returned cell.
fn switchable_api_server(
    status: u16,
) -> (
    kube::Client,
    mpsc::UnboundedReceiver<Request>,
    Arc<AtomicU16>,
) {
    let status = Arc::new(AtomicU16::new(status));
    let answer_with = status.clone();
    let (tx, rx) = mpsc::unbounded_channel();
    let created = Arc::new(Mutex::new(HashSet::new()));
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (tx, created) = (tx.clone(), created.clone());
        let status = answer_with.load(Ordering::SeqCst);
        async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let method = parts.method.to_string();
            // What the API server checks before storing the (patched) Event.
            let invalid = test_kubelet::validate_event_v1("default", &body);
            assert!(invalid.is_empty(), "{invalid:?}: {body}");
            let (code, answer) = match (status, method.as_str()) {
                (403, _) => (
                    403,
                    json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "reason": "Forbidden", "code": 403,
                        "message": "events.events.k8s.io is forbidden: User \"system:serviceaccount:macvtap-system:macvtap-cni\" cannot create resource \"events\" in API group \"events.k8s.io\" in the namespace \"default\"",
                    }),
                ),
                (_, "POST") => {
                    let name = body["metadata"]["name"].as_str().unwrap_or_default();
                    created.lock().unwrap().insert(name.to_string());
                    (201, body.clone())
                }
                _ => {
                    let name = parts.uri.path().rsplit('/').next().unwrap_or_default();
                    if created.lock().unwrap().contains(name) {
                        (200, body.clone())
                    } else {
                        (
                            404,
                            json!({
                                "kind": "Status", "apiVersion": "v1", "metadata": {},
                                "status": "Failure", "reason": "NotFound", "code": 404,
                                "message": format!("events.events.k8s.io \"{name}\" not found"),
                            }),
                        )
                    }
                }
            };
            tx.send(Request {
                method,
                path: parts.uri.path().to_string(),
                content_type: parts
                    .headers
                    .get("content-type")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default(),
                body,
            })
            .unwrap();
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(
                        serde_json::to_vec(&answer).unwrap(),
                    ))
                    .unwrap(),
            )
        }
    });
    (kube::Client::new(svc, "default"), rx, status)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Request>) -> Request {
    tokio::time::timeout(DEADLINE, rx.recv())
        .await
        .expect("the API server got no request in time")
        .expect("the client is gone")
}

fn down() -> NodeEvent {
    NodeEvent::NicDown {
        resource: R.into(),
        nic: "eth1".into(),
        devices: 100,
    }
}

fn up() -> NodeEvent {
    NodeEvent::NicUp {
        resource: R.into(),
        nic: "eth1".into(),
        devices: 100,
    }
}

/// The fields of a new Event that do not depend on the time.
fn assert_new_event(req: &Request, type_: &str, reason: &str, action: &str, note: &str) {
    assert_eq!((req.method.as_str(), req.path.as_str()), ("POST", EVENTS));
    assert_eq!(req.content_type, "application/json");
    let b = &req.body;
    assert_eq!(b["apiVersion"], "events.k8s.io/v1");
    assert_eq!(b["kind"], "Event");
    assert_eq!(b["type"], type_);
    assert_eq!(b["reason"], reason);
    assert_eq!(b["action"], action);
    assert_eq!(b["note"], note);
    assert_eq!(
        b["regarding"],
        json!({"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE})
    );
    assert_eq!(b["reportingController"], CONTROLLER);
    assert_eq!(
        b["reportingInstance"],
        format!("macvtap-deviceplugin-{NODE}")
    );
    assert!(b["eventTime"].is_string(), "{b}");
    assert!(b.get("series").is_none(), "{b}");
    assert!(
        b["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{NODE}.")),
        "{b}"
    );
    // Exactly these keys: nothing the API server would reject or we did not mean.
    let mut keys: Vec<&str> = b.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "action",
            "apiVersion",
            "eventTime",
            "kind",
            "metadata",
            "note",
            "reason",
            "regarding",
            "reportingController",
            "reportingInstance",
            "type"
        ]
    );
}

/// A repeat: a merge PATCH of the first Event with its series.
fn assert_repeat(req: &Request, first: &Request, count: i64) {
    let name = first.body["metadata"]["name"].as_str().unwrap();
    assert_eq!(req.method, "PATCH");
    assert_eq!(req.path, format!("{EVENTS}/{name}"));
    assert_eq!(req.content_type, "application/merge-patch+json");
    assert_eq!(req.body["series"]["count"], count, "{}", req.body);
    assert!(req.body["series"]["lastObservedTime"].is_string());
    for k in ["reason", "note", "type", "action", "regarding", "eventTime"] {
        assert_eq!(req.body[k], first.body[k], "{k} stays the first one's");
    }
}

#[tokio::test]
async fn a_flapping_nic_makes_two_events_whose_series_count_the_flaps() {
    let (client, mut rx) = api_server(201);
    let (sink, _task) = EventSink::start(client, NODE, REFUSED_PAUSE);
    for ev in [down(), up(), down(), up(), down()] {
        sink.post(ev);
    }
    let d1 = next(&mut rx).await;
    assert_new_event(
        &d1,
        "Warning",
        "MacvtapNICDown",
        "MarkUnhealthy",
        &format!("NIC eth1 is down or gone: 100 devices of {R} are Unhealthy"),
    );
    let u1 = next(&mut rx).await;
    assert_new_event(
        &u1,
        "Normal",
        "MacvtapNICUp",
        "MarkHealthy",
        &format!("NIC eth1 is up: 100 devices of {R} are Healthy again"),
    );
    assert_ne!(d1.body["metadata"]["name"], u1.body["metadata"]["name"]);
    let d2 = next(&mut rx).await;
    assert_repeat(&d2, &d1, 2);
    let u2 = next(&mut rx).await;
    assert_repeat(&u2, &u1, 2);
    let d3 = next(&mut rx).await;
    assert_repeat(&d3, &d1, 3);
    assert!(rx.try_recv().is_err(), "five posts, five requests");
    println!("{}", describe(&[d3.body, u2.body]));
}

#[tokio::test]
async fn every_event_reads_as_kubectl_describe_node_shows_it() {
    let (client, mut rx) = api_server(201);
    let (sink, _task) = EventSink::start(client, NODE, REFUSED_PAUSE);
    let cases = [
        (
            NodeEvent::ResourceAdded {
                resource: R.into(),
                nic: "eth1".into(),
                devices: 4,
            },
            "Normal",
            "MacvtapResourceAdded",
            "Reload",
            format!("Config reload added {R}: 4 devices on NIC eth1"),
        ),
        (
            NodeEvent::ResourceRemoved { resource: R.into() },
            "Normal",
            "MacvtapResourceRemoved",
            "Reload",
            format!("Config reload removed {R}"),
        ),
        (
            NodeEvent::RegistrationFailing {
                resource: R.into(),
                failures: 3,
                error: "connecting to /var/lib/kubelet/device-plugins/kubelet.sock: nothing listens on the socket (a stale socket file of a server that stopped)".into(),
            },
            "Warning",
            "MacvtapRegistrationFailing",
            "Register",
            format!("Registering {R} with the kubelet failed 3 times in a row: connecting to /var/lib/kubelet/device-plugins/kubelet.sock: nothing listens on the socket (a stale socket file of a server that stopped)"),
        ),
        (
            NodeEvent::LeakedLinkRemoved {
                link: "mvt1a2b3c4d5e6f".into(),
                ifindex: 7,
            },
            "Normal",
            "MacvtapLeakedLinkRemoved",
            "Reclaim",
            "Removed macvtap mvt1a2b3c4d5e6f (/dev/tap7): no pod holds its device".into(),
        ),
        (
            NodeEvent::AllocateRefused {
                resource: R.into(),
                error: format!("resource {R} cannot get a macvtap: its NIC eth1 does not exist on this node"),
            },
            "Warning",
            "MacvtapAllocateFailed",
            "Allocate",
            format!("Allocate of {R} refused: resource {R} cannot get a macvtap: its NIC eth1 does not exist on this node"),
        ),
    ];
    for (ev, ..) in &cases {
        sink.post(ev.clone());
    }
    let mut objects = Vec::new();
    for (_, type_, reason, action, note) in &cases {
        let req = next(&mut rx).await;
        assert_new_event(&req, type_, reason, action, note);
        objects.push(req.body);
    }
    println!("{}", describe(&objects));
}

/// A refusal (RBAC without the verb, or a binding not yet propagated)
/// pauses Events for the given time, without a request for those posted
/// meanwhile, and the first one after it is tried: RBAC granted later
/// needs no restart.
#[tokio::test]
async fn an_rbac_refusal_pauses_events_then_they_are_tried_again() {
    let pause = Duration::from_secs(2);
    let (client, mut rx, status) = switchable_api_server(403);
    let (sink, task) = EventSink::start(client, NODE, pause);
    sink.post(down());
    let first = next(&mut rx).await;
    assert_eq!(first.method, "POST");
    // Taken once the refused request is in: the publisher's pause starts
    // after this, when it reads the answer.
    let refused = std::time::Instant::now();
    status.store(201, Ordering::SeqCst);
    sink.post(up());
    sink.post(down());
    let req = loop {
        sink.post(up());
        match tokio::time::timeout(Duration::from_millis(100), rx.recv()).await {
            Ok(req) => break req.expect("the client is gone"),
            Err(_) => assert!(
                refused.elapsed() < pause + DEADLINE,
                "no Event was tried again after the pause"
            ),
        }
    };
    assert!(
        refused.elapsed() >= pause,
        "an Event was sent {:?} after the refusal, within the pause of {pause:?}",
        refused.elapsed()
    );
    assert_eq!(req.method, "POST");
    assert!(!task.is_finished(), "the publisher stopped on the refusal");
    drop(sink);
    tokio::time::timeout(DEADLINE, task)
        .await
        .expect("the publisher ends with its last sink")
        .unwrap();
}

#[test]
fn the_api_servers_event_validation_refuses_what_it_should() {
    // Proves the stand-in's checks can fail: the core/v1-era fields, no
    // eventTime, a series of one, a cluster-scoped object's Event outside
    // namespace default.
    let bad = json!({
        "metadata": {"name": "Node_A"}, "type": "Info", "reason": "", "action": "x",
        "reportingController": "plain", "reportingInstance": "i",
        "deprecatedCount": 3, "series": {"count": 1},
        "regarding": {"kind": "Node", "name": "a"},
    });
    let errs = test_kubelet::validate_event_v1("kube-system", &bad);
    for want in [
        "metadata.name",
        "eventTime",
        "type",
        "reason",
        "deprecatedCount",
        "reportingController",
        "series.count",
        "series.lastObservedTime",
        "namespace kube-system",
    ] {
        assert!(errs.iter().any(|e| e.starts_with(want)), "{want}: {errs:?}");
    }
}

/// An exit's last Event (an uninstall's `MacvtapUninstallKept`) is tried
/// even during the pause after a refusal, after every Event queued before
/// it, and `post_last` returns once it was handled: it is not lost with the
/// process.
#[tokio::test]
async fn an_exits_last_event_is_tried_in_a_refusal_pause_and_waited_for() {
    let pause = Duration::from_secs(3600);
    let (client, mut rx, status) = switchable_api_server(403);
    let (sink, _task) = EventSink::start(client, NODE, pause);
    sink.post(down());
    assert_eq!(next(&mut rx).await.method, "POST");
    // The refusal's pause now drops what is queued; the last Event is
    // still tried.
    status.store(201, Ordering::SeqCst);
    sink.post(up());
    let kept = NodeEvent::UninstallKept {
        kept: "macvtap mvt0123456789ab on eth1 (device dataplaneMvp0, held by a pod)".into(),
    };
    tokio::time::timeout(DEADLINE, sink.post_last(kept, DEADLINE))
        .await
        .expect("post_last waits no longer than its bound");
    let req = rx
        .try_recv()
        .expect("the last Event was sent before post_last returned");
    assert_new_event(
        &req,
        "Warning",
        "MacvtapUninstallKept",
        "Uninstall",
        "Uninstall kept on this node what is still in use: macvtap mvt0123456789ab on eth1 (device dataplaneMvp0, held by a pod)",
    );
    assert!(
        rx.try_recv().is_err(),
        "the Event queued in the pause was sent too"
    );
}
