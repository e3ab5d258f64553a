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
//! The response is decoded by a few lines of protobuf wire format that read
//! only the fields needed (pod name and namespace, each container's device
//! resource names and IDs) and skip everything else.

use crate::config::NetConf;
use crate::env::CniEnv;
use crate::error::{Error, Result};
use crate::grpc;
use crate::settings::NodeSettings;
use macvtap_link::PodResourcesCheck;
use macvtap_link::RESOURCE_PREFIX;
use std::path::Path;
use std::time::Duration;
use tracing::{debug, warn};

/// The PodResources `List` method.
pub const LIST: &str = "/v1.PodResourcesLister/List";

/// How long the kubelet may take to answer (it answers from memory).
pub const TIMEOUT: Duration = Duration::from_secs(5);

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
}

/// Checks, before ADD touches anything, that the kubelet allocated the
/// config's `deviceID` to the pod in `CNI_ARGS` (`K8S_POD_NAMESPACE`,
/// `K8S_POD_NAME`; PodResources has no pod UID to compare). A device the
/// kubelet says the pod does not hold is always refused; when the kubelet
/// cannot be asked, or the pod is not named, the node settings decide
/// between refusing and a warning.
pub fn check_ownership(env: &CniEnv, conf: &NetConf, settings: &NodeSettings) -> Result<()> {
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
        Err(msg) => {
            return match settings.pod_resources_check {
                PodResourcesCheck::Enforce => Err(Error::PodResourcesUnavailable {
                    device_id: device_id.clone(),
                    pod,
                    socket: socket.display().to_string(),
                    msg,
                }),
                PodResourcesCheck::Warn => {
                    warn!(
                        socket = %socket.display(),
                        "cannot check that device {device_id} is allocated to pod {pod}: the \
                         kubelet's PodResources API did not answer ({msg}); going on \
                         (podResourcesCheck is warn)"
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

/// Asks the kubelet at `socket` for every pod's devices.
pub fn list(socket: &Path) -> std::result::Result<Vec<PodDevices>, String> {
    // ListPodResourcesRequest has no fields: its encoding is empty.
    let answer = grpc::unary(socket, LIST, &[], TIMEOUT)?;
    decode_list(&answer).map_err(|e| format!("undecodable List answer: {e}"))
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

/// Decodes a `ListPodResourcesResponse`.
pub fn decode_list(buf: &[u8]) -> std::result::Result<Vec<PodDevices>, String> {
    let mut pods = Vec::new();
    for field in Fields(buf) {
        if let (1, Value::Bytes(pod)) = field? {
            pods.push(decode_pod(pod)?);
        }
    }
    Ok(pods)
}

fn decode_pod(buf: &[u8]) -> std::result::Result<PodDevices, String> {
    let mut pod = PodDevices::default();
    for field in Fields(buf) {
        match field? {
            (1, Value::Bytes(b)) => pod.name = text(b)?,
            (2, Value::Bytes(b)) => pod.namespace = text(b)?,
            (3, Value::Bytes(container)) => {
                for field in Fields(container) {
                    if let (2, Value::Bytes(devices)) = field? {
                        decode_devices(devices, &mut pod.devices)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(pod)
}

fn decode_devices(buf: &[u8], out: &mut Vec<HeldDevice>) -> std::result::Result<(), String> {
    let mut resource = String::new();
    let mut ids = Vec::new();
    for field in Fields(buf) {
        match field? {
            (1, Value::Bytes(b)) => resource = text(b)?,
            (2, Value::Bytes(b)) => ids.push(text(b)?),
            _ => {}
        }
    }
    out.extend(ids.into_iter().map(|id| HeldDevice {
        resource: resource.clone(),
        id,
    }));
    Ok(())
}

fn text(b: &[u8]) -> std::result::Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "a string field is not UTF-8".to_string())
}

/// A field's value in the protobuf wire format.
enum Value<'a> {
    Varint,
    Fixed,
    Bytes(&'a [u8]),
}

/// The fields of one message, in order.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = std::result::Result<(u64, Value<'a>), String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        Some(self.field())
    }
}

impl<'a> Fields<'a> {
    fn field(&mut self) -> std::result::Result<(u64, Value<'a>), String> {
        let key = self.varint()?;
        let number = key >> 3;
        let value = match key & 7 {
            0 => {
                self.varint()?;
                Value::Varint
            }
            1 => {
                self.take(8)?;
                Value::Fixed
            }
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| "a length overflows")?;
                Value::Bytes(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                Value::Fixed
            }
            other => return Err(format!("wire type {other} is not used by this API")),
        };
        if number == 0 {
            return Err("field number 0".into());
        }
        Ok((number, value))
    }

    fn varint(&mut self) -> std::result::Result<u64, String> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&b, rest) = self.0.split_first().ok_or("a truncated varint")?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a varint longer than 10 bytes".into())
    }

    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("a field runs past the end of its message".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
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
    fn malformed_answers_are_errors_not_panics() {
        let good = pr::ListPodResourcesResponse {
            pod_resources: vec![pod("p", "n", &[("r/x", &["id"])])],
        }
        .encode_to_vec();
        for cut in 1..good.len() {
            let _ = decode_list(&good[..cut]);
        }
        assert!(decode_list(&[0x0b]).is_err(), "group wire type");
        assert!(
            decode_list(&[0x0a, 0x05, 1]).is_err(),
            "length past the end"
        );
        assert!(decode_list(&[0xff; 11]).is_err(), "endless varint");
        assert_eq!(decode_list(&[]).unwrap(), vec![]);
    }
}
