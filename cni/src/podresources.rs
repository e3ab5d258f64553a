//! Whether a device is the pod's own: the kubelet's PodResources API.
//!
//! A NetworkAttachmentDefinition without a `resourceName` annotation can
//! carry any `"deviceID"`, and so name the macvtap that the kubelet allocated
//! to another pod. Before ADD touches anything it asks the kubelet (`List` on
//! `<kubelet dir>/pod-resources/kubelet.sock`, the call Multus itself makes
//! at ADD to find the device IDs it injects; `Get` is behind a feature gate
//! in most kubelets) which devices of `macvtap.network.kubevirt.io/…`
//! resources the pod named by `K8S_POD_NAMESPACE`/`K8S_POD_NAME` holds.
//!
//! The kubelet limits this API to 100 calls a second with a burst of 10 for
//! all callers together (Multus asks too, for every pod), so a burst of pod
//! starts meets `ResourceExhausted`; that, and `Unavailable`, are tried again
//! after a jittered back-off (`crate::backoff`) for at most
//! [`RETRY_BUDGET`], well inside the whole wait ([`TIMEOUT`]).
//!
//! The same answer serves ADD without a `deviceID` (`crate::dra`: the
//! devices of our DRA driver the pod holds, [`dra_device_ids`]) and DEL
//! without one (`pod_holds_link`: whether the pod holds the device of the
//! host name in its link's alias).
//!
//! The call is the CNI's own unary gRPC client ([`grpc_unary`]); the
//! answer is decoded by prost with `kubelet-proto`'s messages (built
//! without tonic), the same messages the device plugin and the test kubelet
//! use, and only each pod's name, namespace and devices are kept.

use crate::backoff::Backoff;
use crate::config::NetConf;
use crate::env::CniEnv;
use crate::error::{Error, Result};
use crate::settings::NodeSettings;
use grpc_unary::{self as grpc, CallError};
use kubelet_proto::podresources::v1::{ContainerResources, ListPodResourcesResponse};
use macvtap_link::PodResourcesCheck;
use macvtap_link::dra::{DRIVER, device_id_of_cdi};
use macvtap_link::{RESOURCE_PREFIX, link_name_for_device};
use prost::Message;
use std::fmt;
use std::io::ErrorKind;
use std::path::Path;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// The PodResources `List` method.
pub const LIST: &str = "/v1.PodResourcesLister/List";

/// How long the kubelet may take to answer (it answers from memory), all
/// tries together.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// How long after the first try a refused `List` (rate limit, unavailable)
/// is still tried again: 200 tokens of the kubelet's bucket, and well under
/// [`TIMEOUT`], so the last try still has seconds to be answered.
pub const RETRY_BUDGET: Duration = Duration::from_secs(2);

/// The first back-off step: the time the kubelet's bucket takes to gain a
/// token (100 a second).
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(10);

/// The longest back-off step.
pub(crate) const MAX_PAUSE: Duration = Duration::from_millis(250);

/// Why [`list`] brought no pod list; its `Display` is a phrase that follows
/// "the kubelet's PodResources API at `<socket>`".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListFailure {
    /// The kubelet refused every try with a status worth retrying
    /// ([`grpc::code::RESOURCE_EXHAUSTED`], [`grpc::code::UNAVAILABLE`])
    /// until the retry budget ran out.
    Refused {
        /// The last status code.
        code: u32,
        /// The last status message.
        message: String,
        /// How many tries were made.
        tries: u32,
        /// From the first try to giving up.
        over: Duration,
    },
    /// The call failed in a way a retry would not mend (no socket, nothing
    /// listening, no answer within [`TIMEOUT`], another status, a broken
    /// answer).
    Call(CallError),
    /// The answer is no `ListPodResourcesResponse`.
    Undecodable(String),
}

impl fmt::Display for ListFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListFailure::Refused {
                code,
                message,
                tries,
                over,
            } => {
                let what = if *code == grpc::code::RESOURCE_EXHAUSTED {
                    "refused the List by its rate limit"
                } else {
                    "was unavailable"
                };
                let status = grpc::status_text(*code, message);
                if *tries == 1 {
                    return write!(f, "{what} on its only try ({status})");
                }
                write!(
                    f,
                    "{what} on each of {tries} tries over {:.1} s ({status})",
                    over.as_secs_f64()
                )
            }
            ListFailure::Call(CallError::Connect { kind, detail }) => match kind {
                ErrorKind::NotFound => {
                    write!(f, "cannot be reached: the socket does not exist ({detail})")
                }
                ErrorKind::ConnectionRefused => write!(
                    f,
                    "cannot be reached: nothing listens on the socket ({detail})"
                ),
                _ => write!(f, "cannot be reached ({detail})"),
            },
            ListFailure::Call(CallError::Timeout) => {
                write!(f, "did not answer within the {} s wait", TIMEOUT.as_secs())
            }
            ListFailure::Call(CallError::Status { code, message }) => {
                write!(f, "failed the List ({})", grpc::status_text(*code, message))
            }
            ListFailure::Call(CallError::Other(msg)) => {
                write!(f, "gave no usable answer ({msg})")
            }
            ListFailure::Undecodable(e) => {
                write!(f, "gave no usable answer (undecodable List answer: {e})")
            }
        }
    }
}

/// One device a pod holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldDevice {
    /// The resource, e.g. `macvtap.network.kubevirt.io/dataplane`.
    pub resource: String,
    /// The device ID, e.g. `dataplaneMvp3`.
    pub id: String,
}

/// What the kubelet says about one pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDevices {
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Every device of every container of the pod.
    pub devices: Vec<HeldDevice>,
    /// The device IDs of the devices our DRA driver prepared for the pod,
    /// read from the CDI device IDs of its `dynamic_resources` (see
    /// [`dra_device_ids`]), each once, in the order listed.
    pub dra_devices: Vec<String>,
}

/// Checks, before ADD touches anything, that the kubelet allocated the
/// config's `deviceID` to the pod in `CNI_ARGS` (`K8S_POD_NAMESPACE`,
/// `K8S_POD_NAME`; PodResources has no pod UID to compare). A device the
/// kubelet says the pod does not hold is always refused; when the kubelet
/// cannot be asked, or the pod is not named, the node settings decide
/// between refusing and a warning.
pub(crate) fn check_ownership(env: &CniEnv, conf: &NetConf, settings: &NodeSettings) -> Result<()> {
    let device_id = &conf.device_id;
    let (Some(namespace), Some(name)) = (&env.args.pod_namespace, &env.args.pod_name) else {
        let msg = format!(
            "CNI_ARGS names no pod (K8S_POD_NAMESPACE, K8S_POD_NAME), so device {device_id} \
             cannot be checked against the kubelet's allocation"
        );
        return match settings.pod_resources_check {
            PodResourcesCheck::Enforce => Err(Error::InvalidEnv {
                var: "CNI_ARGS",
                msg: format!("{msg}; podResourcesCheck is enforce"),
            }),
            PodResourcesCheck::Warn => {
                warn!("{msg}; going on (podResourcesCheck is warn)");
                Ok(())
            }
        };
    };
    let pod = format!("{namespace}/{name}");
    let socket = settings.pod_resources_socket();
    let pods = match list(&socket) {
        Ok(p) => p,
        Err(failure) => {
            let msg = failure.to_string();
            return match settings.pod_resources_check {
                PodResourcesCheck::Enforce => Err(Error::PodResourcesUnavailable {
                    device_id: device_id.clone(),
                    pod,
                    socket: socket.display().to_string(),
                    msg,
                }),
                PodResourcesCheck::Warn => {
                    warn!(
                        "cannot check that device {device_id} is allocated to pod {pod}: the \
                         kubelet's PodResources API at {} {msg}; going on \
                         (podResourcesCheck is warn)",
                        socket.display()
                    );
                    Ok(())
                }
            };
        }
    };
    let prefix = format!("{RESOURCE_PREFIX}/");
    let Some(held) = devices_of(&pods, namespace, name) else {
        return Err(Error::DeviceNotAllocated {
            device_id: device_id.clone(),
            pod,
            held: "the kubelet lists no such pod".into(),
        });
    };
    let ours: Vec<&HeldDevice> = held
        .into_iter()
        .filter(|d| d.resource.starts_with(&prefix))
        .collect();
    if ours.iter().any(|d| &d.id == device_id) {
        debug!(device_id = %device_id, pod = %pod, "the kubelet allocated the device to this pod");
        return Ok(());
    }
    let held = if ours.is_empty() {
        "the pod holds no macvtap device".to_string()
    } else {
        format!(
            "the pod holds {}",
            ours.iter()
                .map(|d| format!("{} ({})", d.id, d.resource))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    Err(Error::DeviceNotAllocated {
        device_id: device_id.clone(),
        pod,
        held,
    })
}

/// Whether the kubelet says the pod in `CNI_ARGS` holds the device whose
/// link is `host_name` on the host ([`pod_holds_link`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LinkHolding {
    /// The pod holds it (a device plugin device or a DRA device of ours).
    Held,
    /// The kubelet answered, and the pod does not hold it; why, as a phrase.
    NotHeld(String),
    /// The kubelet could not be asked, or `CNI_ARGS` names no pod; why.
    Unknown(String),
}

/// Asks the kubelet whether the pod in `CNI_ARGS` holds a device of ours
/// whose host link is `host_name` (the name a DEL without `deviceID` reads
/// from the pod link's alias, which the pod can rewrite): one of its
/// device plugin devices (`mvt…` of the ID, or the ID itself for a Go-era
/// link) or of its DRA devices.
pub(crate) fn pod_holds_link(
    env: &CniEnv,
    settings: &NodeSettings,
    host_name: &str,
) -> LinkHolding {
    let (Some(namespace), Some(name)) = (&env.args.pod_namespace, &env.args.pod_name) else {
        return LinkHolding::Unknown(
            "CNI_ARGS names no pod (K8S_POD_NAMESPACE, K8S_POD_NAME)".into(),
        );
    };
    let socket = settings.pod_resources_socket();
    let pods = match list(&socket) {
        Ok(p) => p,
        Err(failure) => {
            return LinkHolding::Unknown(format!(
                "the kubelet's PodResources API at {} {failure}",
                socket.display()
            ));
        }
    };
    let prefix = format!("{RESOURCE_PREFIX}/");
    let mut found = false;
    for p in pods
        .iter()
        .filter(|p| &p.name == name && &p.namespace == namespace)
    {
        found = true;
        let plugin = p
            .devices
            .iter()
            .filter(|d| d.resource.starts_with(&prefix))
            .any(|d| d.id == host_name || link_name_for_device(&d.id) == host_name);
        let dra = p
            .dra_devices
            .iter()
            .any(|id| link_name_for_device(id) == host_name);
        if plugin || dra {
            return LinkHolding::Held;
        }
    }
    LinkHolding::NotHeld(if found {
        format!("pod {namespace}/{name} holds no device whose link is {host_name}")
    } else {
        format!("the kubelet lists no pod {namespace}/{name}")
    })
}

/// Asks the kubelet at `socket` for every pod's devices, within [`TIMEOUT`];
/// a refusal worth retrying is tried again for up to [`RETRY_BUDGET`].
pub fn list(socket: &Path) -> std::result::Result<Vec<PodDevices>, ListFailure> {
    let start = Instant::now();
    let deadline = start + TIMEOUT;
    let mut backoff = Backoff::seeded_by_process(FIRST_PAUSE, MAX_PAUSE);
    let mut tries = 0;
    loop {
        tries += 1;
        let left = deadline.saturating_duration_since(Instant::now());
        // ListPodResourcesRequest has no fields: its encoding is empty.
        match grpc::unary(socket, LIST, &[], left) {
            Ok(answer) => {
                if tries > 1 {
                    debug!(tries, waited = ?start.elapsed(), "the kubelet answered List after refusals");
                }
                return decode_list(&answer).map_err(ListFailure::Undecodable);
            }
            Err(CallError::Status { code, message }) if worth_retrying(code) => {
                let pause = backoff.next_pause();
                let over = start.elapsed();
                if over + pause > RETRY_BUDGET {
                    return Err(ListFailure::Refused {
                        code,
                        message,
                        tries,
                        over,
                    });
                }
                debug!(
                    code,
                    tries,
                    ?pause,
                    "the kubelet refused List for now; trying again"
                );
                std::thread::sleep(pause);
            }
            Err(e) => return Err(ListFailure::Call(e)),
        }
    }
}

/// Whether a `List` refused with gRPC status `code` may succeed a moment
/// later: the kubelet's rate limit (`ResourceExhausted`) or `Unavailable`.
pub(crate) fn worth_retrying(code: u32) -> bool {
    code == grpc::code::RESOURCE_EXHAUSTED || code == grpc::code::UNAVAILABLE
}

/// The devices of `namespace/name`, or `None` when the kubelet lists no
/// such pod.
pub fn devices_of<'a>(
    pods: &'a [PodDevices],
    namespace: &str,
    name: &str,
) -> Option<Vec<&'a HeldDevice>> {
    let mut found = None;
    for p in pods
        .iter()
        .filter(|p| p.name == name && p.namespace == namespace)
    {
        found.get_or_insert_with(Vec::new).extend(p.devices.iter());
    }
    found
}

/// Decodes a `ListPodResourcesResponse`; a truncated or malformed one is an
/// error.
pub(crate) fn decode_list(buf: &[u8]) -> std::result::Result<Vec<PodDevices>, String> {
    let list = ListPodResourcesResponse::decode(buf).map_err(|e| e.to_string())?;
    Ok(list
        .pod_resources
        .into_iter()
        .map(|pod| PodDevices {
            name: pod.name,
            namespace: pod.namespace,
            dra_devices: dra_device_ids(&pod.containers),
            devices: pod
                .containers
                .into_iter()
                .flat_map(|c| c.devices)
                .flat_map(|d| {
                    let resource = d.resource_name;
                    d.device_ids.into_iter().map(move |id| HeldDevice {
                        resource: resource.clone(),
                        id,
                    })
                })
                .collect(),
        })
        .collect())
}

/// The device IDs our DRA driver ([`DRIVER`]) prepared for the pod whose
/// containers are `containers`, each once: the kubelet lists a prepared
/// claim under the `dynamic_resources` of each container that uses it, one
/// `claim_resources` entry per device, whose `cdi_devices` carry our CDI
/// device IDs (`macvtap.network.kubevirt.io/tap=<claim UID>_<device ID>`,
/// `macvtap_link::dra::cdi_device_id`). The 1.37 kubelet
/// (`pkg/kubelet/cm/container_manager_linux.go` `GetDynamicResources`)
/// gathers the CDI IDs of a driver's devices in one list it does not reset
/// between devices, so an entry may repeat those of the entries before it;
/// taking every ID once gives the same set either way. Entries of other
/// drivers, and CDI IDs that are not ours, are skipped.
pub fn dra_device_ids(containers: &[ContainerResources]) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    let ours = containers
        .iter()
        .flat_map(|c| &c.dynamic_resources)
        .flat_map(|d| &d.claim_resources)
        .filter(|r| r.driver_name == DRIVER)
        .flat_map(|r| &r.cdi_devices)
        .filter_map(|cdi| device_id_of_cdi(&cdi.name));
    for id in ours {
        if !ids.iter().any(|have| have == id) {
            ids.push(id.to_string());
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_proto::podresources::v1 as pr;
    use prost::Message;

    fn pod(name: &str, ns: &str, devices: &[(&str, &[&str])]) -> pr::PodResources {
        pr::PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: vec![
                pr::ContainerResources {
                    name: "init".into(),
                    cpu_ids: vec![1, 2],
                    ..Default::default()
                },
                pr::ContainerResources {
                    name: "compute".into(),
                    devices: devices
                        .iter()
                        .map(|(r, ids)| pr::ContainerDevices {
                            resource_name: r.to_string(),
                            device_ids: ids.iter().map(|s| s.to_string()).collect(),
                            topology: Some(pr::TopologyInfo {
                                nodes: vec![pr::NumaNode { id: 1 }],
                            }),
                        })
                        .collect(),
                    memory: vec![pr::ContainerMemory {
                        memory_type: "memory".into(),
                        size: 1 << 30,
                        topology: None,
                    }],
                    ..Default::default()
                },
            ],
        }
    }

    #[test]
    fn a_list_made_by_prost_decodes() {
        let list = pr::ListPodResourcesResponse {
            pod_resources: vec![
                pod(
                    "vm-a",
                    "tenant-a",
                    &[
                        ("macvtap.network.kubevirt.io/dataplane", &["dataplaneMvp1"]),
                        ("nvidia.com/gpu", &["GPU-1"]),
                    ],
                ),
                pod(
                    "vm-b",
                    "tenant-b",
                    &[(
                        "macvtap.network.kubevirt.io/dataplane",
                        &["dataplaneMvp2", "dataplaneMvp3"],
                    )],
                ),
                pod("empty", "tenant-b", &[]),
            ],
        };
        let pods = decode_list(&list.encode_to_vec()).unwrap();
        assert_eq!(pods.len(), 3);
        let a = devices_of(&pods, "tenant-a", "vm-a").unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].id, "dataplaneMvp1");
        assert_eq!(a[1].resource, "nvidia.com/gpu");
        let b = devices_of(&pods, "tenant-b", "vm-b").unwrap();
        assert_eq!(
            b.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
            ["dataplaneMvp2", "dataplaneMvp3"]
        );
        assert_eq!(devices_of(&pods, "tenant-b", "empty"), Some(vec![]));
        assert_eq!(devices_of(&pods, "tenant-a", "vm-b"), None);
    }

    #[test]
    fn our_dra_devices_are_read_from_the_cdi_ids_each_once() {
        use macvtap_link::dra::cdi_device_id;
        use test_kubelet::{PreparedClaim, PreparedDevice, dynamic_resources};
        let device = |driver: &str, name: &str, cdi: &[String]| PreparedDevice {
            driver: driver.into(),
            pool: "node-1".into(),
            device: name.into(),
            cdi_ids: cdi.to_vec(),
        };
        let uid = "0b5f6e8e-1111-4222-8333-444455556666";
        let claim = PreparedClaim {
            name: "vm-extended-resources-x7k2p".into(),
            namespace: "tenant-a".into(),
            devices: vec![
                device(DRIVER, "eth1-mvp-2", &[cdi_device_id(uid, "eth1Mvp2")]),
                device(
                    "gpu.example.com",
                    "gpu-0",
                    &["gpu.example.com/gpu=0".into()],
                ),
                // The kubelet repeats the first device's ID in this entry.
                device(DRIVER, "eth1-mvp-0", &[cdi_device_id(uid, "eth1Mvp0")]),
                // Not a CDI ID of ours, or not a device ID: skipped.
                device(
                    DRIVER,
                    "odd",
                    &[
                        "other.example.com/tap=u_eth1Mvp7".into(),
                        "macvtap.network.kubevirt.io/tap=u_eth0".into(),
                    ],
                ),
            ],
        };
        let mut listed = pod("vm", "tenant-a", &[("r/x", &["id"])]);
        listed.containers[1].dynamic_resources = dynamic_resources(std::slice::from_ref(&claim));
        // A second container using the same claim lists it again.
        listed.containers[0].dynamic_resources = dynamic_resources(&[claim]);
        let pods = decode_list(
            &pr::ListPodResourcesResponse {
                pod_resources: vec![listed],
            }
            .encode_to_vec(),
        )
        .unwrap();
        assert_eq!(pods[0].dra_devices, ["eth1Mvp2", "eth1Mvp0"]);
        assert_eq!(pods[0].devices.len(), 1);
    }

    #[test]
    fn malformed_answers_are_errors_not_panics() {
        let good = pr::ListPodResourcesResponse {
            pod_resources: vec![pod("p", "n", &[("r/x", &["id"])])],
        }
        .encode_to_vec();
        // One pod: every cut falls inside its length-delimited field.
        for cut in 1..good.len() {
            assert!(decode_list(&good[..cut]).is_err(), "cut at {cut}");
        }
        assert!(decode_list(&good).is_ok());
        assert!(decode_list(&[0x0b]).is_err(), "group wire type");
        assert!(
            decode_list(&[0x0a, 0x05, 1]).is_err(),
            "length past the end"
        );
        assert!(decode_list(&[0xff; 11]).is_err(), "endless varint");
        assert!(decode_list(&[0x02, 0x00]).is_err(), "field number 0");
        assert!(decode_list(&[0x08, 0x01]).is_err(), "a pod as a varint");
        assert!(
            decode_list(&[0x0a, 0x03, 0x0a, 0x01, 0xff]).is_err(),
            "a pod name that is not UTF-8"
        );
        assert_eq!(decode_list(&[]).unwrap(), vec![]);
    }

    /// What the stand-in answers one call with.
    enum Answer {
        /// `message` and gRPC status 0.
        Message(Vec<u8>),
        /// A trailers-only response with this status and message.
        Status(u32, &'static str),
    }

    /// A kubelet stand-in on `socket` that answers one call with `message`
    /// and gRPC status 0, framed by [`grpc_unary::frame`].
    fn answer_once(socket: &Path, message: Vec<u8>) -> std::thread::JoinHandle<()> {
        answer_in_turn(socket, vec![Answer::Message(message)])
    }

    /// A kubelet stand-in on `socket` that answers one call per connection
    /// with each of `answers` in turn, then stops listening.
    fn answer_in_turn(socket: &Path, answers: Vec<Answer>) -> std::thread::JoinHandle<()> {
        use grpc_unary::frame::{self, encode_headers, flag, kind, put_frame, put_message};
        use std::io::{Read, Write};
        let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
        let socket = socket.to_path_buf();
        std::thread::spawn(move || {
            for answer in answers {
                let (mut conn, _) = listener.accept().unwrap();
                let mut preface = [0u8; 24];
                conn.read_exact(&mut preface).unwrap();
                // The request ends with its DATA frame.
                loop {
                    let f = frame::read_frame(&mut conn, frame::MAX_FRAME)
                        .unwrap()
                        .unwrap();
                    if f.kind == kind::DATA && f.flags & flag::END_STREAM != 0 {
                        break;
                    }
                }
                let mut out = Vec::new();
                put_frame(&mut out, kind::SETTINGS, 0, 0, &[]);
                let end = flag::END_HEADERS | flag::END_STREAM;
                match answer {
                    Answer::Message(message) => {
                        let head = encode_headers(&[
                            (":status", "200"),
                            ("content-type", "application/grpc"),
                        ]);
                        put_frame(&mut out, kind::HEADERS, flag::END_HEADERS, 1, &head);
                        let mut body = Vec::new();
                        put_message(&mut body, &message).unwrap();
                        put_frame(&mut out, kind::DATA, 0, 1, &body);
                        let trailers = encode_headers(&[("grpc-status", "0")]);
                        put_frame(&mut out, kind::HEADERS, end, 1, &trailers);
                    }
                    Answer::Status(code, message) => {
                        let code = code.to_string();
                        let only = encode_headers(&[
                            (":status", "200"),
                            ("content-type", "application/grpc"),
                            ("grpc-status", &code),
                            ("grpc-message", message),
                        ]);
                        put_frame(&mut out, kind::HEADERS, end, 1, &only);
                    }
                }
                conn.write_all(&out).unwrap();
                // Until the client hangs up (it acknowledges our SETTINGS).
                let _ = conn.read_to_end(&mut Vec::new());
            }
            // A call past the answers finds nothing listening.
            drop(listener);
            let _ = std::fs::remove_file(&socket);
        })
    }

    #[test]
    fn a_list_refused_for_now_is_tried_again_until_answered() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kubelet.sock");
        let good = pr::ListPodResourcesResponse {
            pod_resources: vec![pod("p", "n", &[("r/x", &["id"])])],
        }
        .encode_to_vec();
        let kubelet = answer_in_turn(
            &socket,
            vec![
                Answer::Status(8, "rejected by rate limit"),
                Answer::Status(14, "starting"),
                Answer::Status(8, "rejected by rate limit"),
                Answer::Message(good),
            ],
        );
        let started = Instant::now();
        let pods = list(&socket).unwrap();
        kubelet.join().unwrap();
        assert_eq!(pods.len(), 1);
        assert!(started.elapsed() < RETRY_BUDGET, "{:?}", started.elapsed());
    }

    #[test]
    fn another_status_is_not_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kubelet.sock");
        let kubelet = answer_in_turn(&socket, vec![Answer::Status(13, "broken")]);
        let failure = list(&socket).unwrap_err();
        kubelet.join().unwrap();
        assert_eq!(
            failure,
            ListFailure::Call(CallError::Status {
                code: 13,
                message: "broken".into()
            })
        );
        assert_eq!(
            failure.to_string(),
            "failed the List (gRPC status 13 (internal): broken)"
        );
    }

    #[test]
    fn each_failure_reads_as_what_happened() {
        let refused = |code, tries| ListFailure::Refused {
            code,
            message: "rejected by rate limit".into(),
            tries,
            over: Duration::from_millis(1950),
        };
        assert_eq!(
            refused(8, 12).to_string(),
            "refused the List by its rate limit on each of 12 tries over 1.9 s \
             (gRPC status 8 (resource exhausted): rejected by rate limit)"
        );
        assert_eq!(
            refused(8, 1).to_string(),
            "refused the List by its rate limit on its only try \
             (gRPC status 8 (resource exhausted): rejected by rate limit)"
        );
        assert!(
            refused(14, 3)
                .to_string()
                .starts_with("was unavailable on each of 3 tries")
        );
        assert_eq!(
            ListFailure::Call(CallError::Timeout).to_string(),
            "did not answer within the 5 s wait"
        );
        let connect = |kind| {
            ListFailure::Call(CallError::Connect {
                kind,
                detail: "os error".into(),
            })
            .to_string()
        };
        assert_eq!(
            connect(ErrorKind::NotFound),
            "cannot be reached: the socket does not exist (os error)"
        );
        assert_eq!(
            connect(ErrorKind::ConnectionRefused),
            "cannot be reached: nothing listens on the socket (os error)"
        );
    }

    #[test]
    fn a_missing_socket_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let failure = list(&dir.path().join("kubelet.sock")).unwrap_err();
        assert!(
            failure
                .to_string()
                .starts_with("cannot be reached: the socket does not exist"),
            "{failure}"
        );
    }

    /// [`check_ownership`] of device `dataplaneMvp1` for pod
    /// `default/test-pod` against a kubelet that answers `message`.
    fn check_against(message: Vec<u8>, check: PodResourcesCheck) -> Result<()> {
        let dir = tempfile::tempdir().unwrap();
        let settings = NodeSettings {
            kubelet_dir: dir.path().to_path_buf(),
            pod_resources_check: check,
            log_dir: dir.path().to_path_buf(),
            source: "test".into(),
            problem: None,
        };
        let socket = settings.pod_resources_socket();
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let kubelet = answer_once(&socket, message);
        let vars: std::collections::HashMap<String, String> = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "sandbox-1"),
            ("CNI_NETNS", "/run/netns/pod-1"),
            ("CNI_IFNAME", "net1"),
            (
                "CNI_ARGS",
                "K8S_POD_NAMESPACE=default;K8S_POD_NAME=test-pod",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let env = CniEnv::from_vars(&vars).unwrap();
        let conf = NetConf::parse(
            br#"{"cniVersion":"1.0.0","name":"n","type":"macvtap","deviceID":"dataplaneMvp1"}"#,
        )
        .unwrap();
        let result = check_ownership(&env, &conf, &settings);
        kubelet.join().unwrap();
        result
    }

    #[test]
    fn a_truncated_or_malformed_answer_refuses_add_in_enforce_and_warns_in_warn() {
        let good = pr::ListPodResourcesResponse {
            pod_resources: vec![pod(
                "test-pod",
                "default",
                &[("macvtap.network.kubevirt.io/dataplane", &["dataplaneMvp1"])],
            )],
        }
        .encode_to_vec();
        check_against(good.clone(), PodResourcesCheck::Enforce).unwrap();
        let answers = [
            ("truncated", good[..good.len() - 3].to_vec()),
            ("cut inside a length", good[..2].to_vec()),
            ("a group wire type", vec![0x0b]),
            ("a pod as a varint", vec![0x08, 0x01]),
        ];
        for (what, answer) in answers {
            let err = check_against(answer.clone(), PodResourcesCheck::Enforce).unwrap_err();
            assert!(
                matches!(err, Error::PodResourcesUnavailable { .. }),
                "{what}: {err}"
            );
            assert_eq!(err.code(), crate::error::CODE_TRY_AGAIN, "{what}: {err}");
            assert!(
                err.to_string().contains("undecodable List answer"),
                "{what}: {err}"
            );
            check_against(answer, PodResourcesCheck::Warn).unwrap();
        }
    }
}
