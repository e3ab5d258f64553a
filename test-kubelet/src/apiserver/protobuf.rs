//! The annotations of a Pod that client-go sent as protobuf (Multus' PUT of
//! the pod status), decoded by prost from the few messages needed.

use prost::Message;
use std::collections::HashMap;

/// The prefix of every object client-go sends as
/// `application/vnd.kubernetes.protobuf` (apimachinery
/// `pkg/runtime/serializer/protobuf/protobuf.go`, `protoEncodingPrefix`).
pub const PROTOBUF_PREFIX: &[u8] = b"k8s\0";

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

/// The annotations of a pod client-go sent as protobuf; `None` when the
/// body is not such a pod or the pod has no metadata.
pub fn annotations_of_protobuf_pod(body: &[u8]) -> Option<HashMap<String, String>> {
    let envelope = Unknown::decode(body.strip_prefix(PROTOBUF_PREFIX)?).ok()?;
    let pod = ProtobufPod::decode(envelope.raw.as_slice()).ok()?;
    Some(pod.metadata?.annotations)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "k8s.v1.cni.cncf.io/network-status";

    fn encoded(pod: &ProtobufPod) -> Vec<u8> {
        let mut body = PROTOBUF_PREFIX.to_vec();
        body.extend(
            Unknown {
                raw: pod.encode_to_vec(),
            }
            .encode_to_vec(),
        );
        body
    }

    #[test]
    fn the_annotations_are_read_from_a_protobuf_pod() {
        let mut meta = ObjectMeta::default();
        meta.annotations.insert("other".into(), "x".into());
        meta.annotations.insert(STATUS.into(), "[{}]".into());
        let body = encoded(&ProtobufPod {
            metadata: Some(meta),
        });
        let got = annotations_of_protobuf_pod(&body).unwrap();
        assert_eq!(got.get(STATUS).map(String::as_str), Some("[{}]"));
        assert_eq!(got.get("other").map(String::as_str), Some("x"));
        // No prefix, a cut body, no metadata: nothing.
        assert_eq!(annotations_of_protobuf_pod(&body[4..]), None);
        assert_eq!(annotations_of_protobuf_pod(&body[..body.len() - 2]), None);
        assert_eq!(
            annotations_of_protobuf_pod(&encoded(&ProtobufPod::default())),
            None
        );
    }
}
