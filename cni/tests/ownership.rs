//! ADD hands over only a device the kubelet allocated to the pod: the
//! plugin asks the PodResources API (a test kubelet here) before it touches
//! anything. Needs root (each test runs the real plugin in a fresh node
//! namespace).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::kubelet::{PodResourcesKubelet, settings_file};
use common::{Sandbox, netconf};
use macvtap_cni::podresources::RETRY_BUDGET;
use std::time::Instant;
use test_kubelet::{Code, TokenBucket};

const DP: &str = "macvtap.network.kubevirt.io/dataplane";

fn pod_args(ns: &str, name: &str) -> String {
    format!(
        "IgnoreUnknown=true;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};\
         K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=0b5f6e8e-1111-2222-3333-444455556666"
    )
}

/// The device's link reached the pod: `net1` there, a macvtap with the
/// ifindex Allocate gave it (so its `/dev/tapN`), and gone from the node.
fn assert_handed_over(sb: &Sandbox, device_id: &str, index: u32) {
    let link = sb.link(&sb.pod, "net1").expect("net1 is in the pod");
    assert_eq!(link["ifindex"].as_u64(), Some(u64::from(index)), "{link}");
    assert_eq!(link["linkinfo"]["info_kind"], "macvtap", "{link}");
    let name = macvtap_link::link_name_for_device(device_id);
    assert!(sb.link(&sb.node, &name).is_none(), "{name} left the node");
}

#[test]
fn a_device_allocated_to_the_pod_is_handed_over() {
    let sb = Sandbox::new();
    let kubelet = PodResourcesKubelet::start();
    kubelet.add_pod("tenant-a", "virt-launcher-a", &[(DP, &["dataplaneMvp1"])]);
    let index = sb.allocate("dataplaneMvp1");
    let settings = kubelet.settings("enforce");
    let run = sb.cni(
        "ADD",
        &netconf("1.0.0", "dataplaneMvp1"),
        &[
            ("CNI_ARGS", &pod_args("tenant-a", "virt-launcher-a")),
            ("MACVTAP_CNI_SETTINGS", settings.to_str().unwrap()),
        ],
    );
    run.ok();
    assert_handed_over(&sb, "dataplaneMvp1", index);
}

#[test]
fn another_pods_device_is_refused_and_stays_where_it_is() {
    let sb = Sandbox::new();
    let kubelet = PodResourcesKubelet::start();
    kubelet.add_pod("tenant-a", "virt-launcher-a", &[(DP, &["dataplaneMvp1"])]);
    kubelet.add_pod(
        "tenant-b",
        "thief",
        &[
            (DP, &["dataplaneMvp2"]),
            ("nvidia.com/gpu", &["dataplaneMvp1"]),
        ],
    );
    sb.allocate("dataplaneMvp1");
    let before = sb.node_links();
    // Both modes refuse once the kubelet has answered.
    for check in ["warn", "enforce"] {
        let settings = kubelet.settings(check);
        let run = sb.cni(
            "ADD",
            &netconf("1.0.0", "dataplaneMvp1"),
            &[
                ("CNI_ARGS", &pod_args("tenant-b", "thief")),
                ("MACVTAP_CNI_SETTINGS", settings.to_str().unwrap()),
            ],
        );
        let msg = run.fails_with(109);
        assert!(msg.contains("tenant-b/thief"), "{msg}");
        assert!(msg.contains("dataplaneMvp1"), "{msg}");
        assert!(
            msg.contains("dataplaneMvp2 (macvtap.network.kubevirt.io/dataplane)"),
            "names what the pod holds, and only macvtap devices: {msg}"
        );
        assert_eq!(sb.node_links(), before, "{check}: the host is untouched");
        assert!(sb.link(&sb.pod, "net1").is_none());
    }
}

#[test]
fn a_device_allocated_to_no_pod_is_refused() {
    let sb = Sandbox::new();
    let kubelet = PodResourcesKubelet::start();
    sb.allocate("dataplaneMvp4");
    let before = sb.node_links();
    let settings = kubelet.settings("warn");
    let run = sb.cni(
        "ADD",
        &netconf("1.0.0", "dataplaneMvp4"),
        &[
            ("CNI_ARGS", &pod_args("tenant-c", "unknown")),
            ("MACVTAP_CNI_SETTINGS", settings.to_str().unwrap()),
        ],
    );
    let msg = run.fails_with(109);
    assert!(msg.contains("lists no such pod"), "{msg}");
    assert_eq!(sb.node_links(), before);
}

#[test]
fn an_unreachable_kubelet_refuses_in_enforce_and_warns_in_warn() {
    let sb = Sandbox::new();
    let index = sb.allocate("dataplaneMvp5");
    let dir = tempfile::tempdir().unwrap();
    let no_kubelet = dir.path().join("no-kubelet");
    let before = sb.node_links();

    let enforce = settings_file(dir.path(), &no_kubelet, "enforce");
    let run = sb.cni(
        "ADD",
        &netconf("1.0.0", "dataplaneMvp5"),
        &[
            ("CNI_ARGS", &pod_args("tenant-a", "vm")),
            ("MACVTAP_CNI_SETTINGS", enforce.to_str().unwrap()),
        ],
    );
    let msg = run.fails_with(11);
    assert!(
        msg.contains("pod-resources/kubelet.sock cannot be reached: the socket does not exist"),
        "{msg}"
    );
    assert!(msg.contains("enforce"), "{msg}");
    assert_eq!(sb.node_links(), before);

    let warn = settings_file(dir.path(), &no_kubelet, "warn");
    let run = sb.cni(
        "ADD",
        &netconf("1.0.0", "dataplaneMvp5"),
        &[
            ("CNI_ARGS", &pod_args("tenant-a", "vm")),
            ("MACVTAP_CNI_SETTINGS", warn.to_str().unwrap()),
        ],
    );
    run.ok();
    assert!(
        run.stderr
            .contains("pod-resources/kubelet.sock cannot be reached: the socket does not exist")
            && run.stderr.contains("podResourcesCheck is warn"),
        "{}",
        run.stderr
    );
    assert_handed_over(&sb, "dataplaneMvp5", index);
}

/// ADD of a device the kubelet allocated to the pod, while the kubelet
/// cannot answer as `why` says (each part follows the socket's path in
/// the message): enforce refuses with code 11 (try again later) naming the
/// socket, `why` and the mode, and leaves the host as it was; warn warns
/// with `why` and hands the link over.
fn enforce_refuses_and_warn_goes_on(kubelet: &PodResourcesKubelet, why: &[&str]) {
    let sb = Sandbox::new();
    kubelet.add_pod("tenant-a", "vm", &[(DP, &["dataplaneMvp6"])]);
    let index = sb.allocate("dataplaneMvp6");
    let before = sb.node_links();
    let add = |check: &str| {
        let settings = kubelet.settings(check);
        sb.cni(
            "ADD",
            &netconf("1.0.0", "dataplaneMvp6"),
            &[
                ("CNI_ARGS", &pod_args("tenant-a", "vm")),
                ("MACVTAP_CNI_SETTINGS", settings.to_str().unwrap()),
            ],
        )
    };

    let msg = add("enforce").fails_with(11);
    for part in [
        "cannot check that device dataplaneMvp6 is allocated to pod tenant-a/vm",
        "podResourcesCheck is enforce",
    ]
    .iter()
    .chain(why)
    {
        assert!(msg.contains(part), "{part:?} in {msg}");
    }
    assert_eq!(sb.node_links(), before, "the host is untouched");
    assert!(sb.link(&sb.pod, "net1").is_none());

    let run = add("warn");
    run.ok();
    for part in ["podResourcesCheck is warn"].iter().chain(why) {
        assert!(run.stderr.contains(part), "{part:?} in {}", run.stderr);
    }
    assert_handed_over(&sb, "dataplaneMvp6", index);
}

#[test]
fn a_kubelet_rate_limit_refusal_refuses_in_enforce_and_warns_in_warn() {
    let kubelet = PodResourcesKubelet::start();
    // The kubelet's bucket (100/s, burst 10) spent by other callers.
    kubelet.set_rate_limit(TokenBucket::new(0.0, 0));
    let started = Instant::now();
    enforce_refuses_and_warn_goes_on(
        &kubelet,
        &[
            "pod-resources/kubelet.sock refused the List by its rate limit on each of",
            "(gRPC status 8 (resource exhausted): rejected by rate limit)",
        ],
    );
    // Both ADDs tried again for the whole budget before they gave up.
    assert!(
        started.elapsed() >= 2 * RETRY_BUDGET.mul_f64(0.9),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn an_unavailable_kubelet_is_tried_again_then_refuses_in_enforce_and_warns_in_warn() {
    let kubelet = PodResourcesKubelet::start();
    kubelet.fail(Code::Unavailable);
    enforce_refuses_and_warn_goes_on(
        &kubelet,
        &[
            "pod-resources/kubelet.sock was unavailable on each of",
            "(gRPC status 14 (unavailable): the test made the PodResources API fail)",
        ],
    );
}

#[test]
fn a_failing_kubelet_refuses_in_enforce_and_warns_in_warn() {
    let kubelet = PodResourcesKubelet::start();
    kubelet.fail(Code::Internal);
    // Not a refusal for now: not tried again.
    enforce_refuses_and_warn_goes_on(
        &kubelet,
        &["pod-resources/kubelet.sock failed the List (gRPC status 13 (internal)"],
    );
}

#[test]
fn a_hanging_kubelet_refuses_in_enforce_and_warns_in_warn() {
    let kubelet = PodResourcesKubelet::start();
    kubelet.hang();
    enforce_refuses_and_warn_goes_on(
        &kubelet,
        &["pod-resources/kubelet.sock did not answer within the 5 s wait"],
    );
    assert_eq!(
        kubelet.held(),
        2,
        "both ADDs reached the kubelet and waited"
    );
}

#[test]
fn a_pod_missing_from_cni_args_is_refused_in_enforce_and_warned_in_warn() {
    let sb = Sandbox::new();
    let kubelet = PodResourcesKubelet::start();
    kubelet.add_pod("tenant-a", "vm", &[(DP, &["dataplaneMvp6"])]);
    let index = sb.allocate("dataplaneMvp6");
    let before = sb.node_links();
    let enforce = kubelet.settings("enforce");
    let run = sb.cni(
        "ADD",
        &netconf("1.0.0", "dataplaneMvp6"),
        &[
            ("CNI_ARGS", "IgnoreUnknown=true;K8S_POD_NAMESPACE=tenant-a"),
            ("MACVTAP_CNI_SETTINGS", enforce.to_str().unwrap()),
        ],
    );
    let msg = run.fails_with(4);
    assert!(msg.contains("K8S_POD_NAME"), "{msg}");
    assert_eq!(sb.node_links(), before, "enforce: the host is untouched");
    assert!(sb.link(&sb.pod, "net1").is_none());
    let warn = kubelet.settings("warn");
    let run = sb.cni(
        "ADD",
        &netconf("1.0.0", "dataplaneMvp6"),
        &[("MACVTAP_CNI_SETTINGS", warn.to_str().unwrap())],
    );
    run.ok();
    assert!(run.stderr.contains("names no pod"), "{}", run.stderr);
    assert_handed_over(&sb, "dataplaneMvp6", index);
}

#[test]
fn a_broken_settings_file_refuses_add_but_not_del() {
    let sb = Sandbox::new();
    let index = sb.allocate("dataplaneMvp7");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("macvtap.settings.json");
    std::fs::write(&path, r#"{"podResourcesCheck":"enforced"}"#).unwrap();
    let conf = netconf("1.0.0", "dataplaneMvp7");
    let env = [("MACVTAP_CNI_SETTINGS", path.to_str().unwrap())];
    let before = sb.node_links();
    let msg = sb.cni("ADD", &conf, &env).fails_with(7);
    assert!(msg.contains("macvtap.settings.json"), "{msg}");
    assert_eq!(
        sb.node_links(),
        before,
        "the refused ADD left the host alone"
    );
    // A link an earlier ADD handed over (with working settings) still goes
    // back to the host on a DEL that reads the broken file.
    sb.cni("ADD", &conf, &[]).ok();
    assert_handed_over(&sb, "dataplaneMvp7", index);
    sb.cni("DEL", &conf, &env).ok();
    assert!(sb.link(&sb.pod, "net1").is_none(), "DEL took net1 out");
    let name = macvtap_link::link_name_for_device("dataplaneMvp7");
    let back = sb.link(&sb.node, &name).expect("DEL gave the link back");
    assert_eq!(back["ifindex"].as_u64(), Some(u64::from(index)));
}

/// A busy node's List answer spans many HTTP/2 frames and more than the
/// default flow-control window: it is read whole.
#[test]
fn a_large_pod_list_is_read_whole() {
    let sb = Sandbox::new();
    let kubelet = PodResourcesKubelet::start();
    let ids: Vec<String> = (0..100).map(|i| format!("otherMvp{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    for i in 0..1500 {
        kubelet.add_pod("busy", &format!("pod-{i}"), &[(DP, &ids[..20])]);
    }
    kubelet.add_pod("tenant-a", "last", &[(DP, &["dataplaneMvp8"])]);
    let index = sb.allocate("dataplaneMvp8");
    let settings = kubelet.settings("enforce");
    sb.cni(
        "ADD",
        &netconf("1.0.0", "dataplaneMvp8"),
        &[
            ("CNI_ARGS", &pod_args("tenant-a", "last")),
            ("MACVTAP_CNI_SETTINGS", settings.to_str().unwrap()),
        ],
    )
    .ok();
    assert_handed_over(&sb, "dataplaneMvp8", index);
}
