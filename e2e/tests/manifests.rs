//! The manifests in `manifests/`: base and overlays render (with the real
//! kustomize, `kubectl kustomize` of kubectl 1.37), every object parses into its typed or
//! dynamic Kubernetes type, and the fields that matter agree with the
//! binaries: configs parse with the binaries' own parsers, resource names
//! match, one image everywhere, host paths match flags and defaults.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use kube::api::DynamicObject;
use macvtap_deviceplugin::config::{DiscoveryPolicy, Resources, Source, parse_json};
use macvtap_e2e::manifests::{copy_tree, parse_docs, render, render_kustomize_v4};
use serde_json::Value;
use std::path::{Path, PathBuf};

const RESOURCE_PREFIX: &str = "macvtap.network.kubevirt.io/";

fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests")
}

fn renderings() -> Vec<(&'static str, Vec<Value>)> {
    ["base", "overlays/openshift", "overlays/kubelet-dir"]
        .into_iter()
        .map(|d| {
            (
                d,
                render(&manifests().join(d)).unwrap_or_else(|e| panic!("{d}: {e:#}")),
            )
        })
        .collect()
}

fn example(name: &str) -> Vec<Value> {
    parse_docs(&std::fs::read_to_string(manifests().join("examples").join(name)).unwrap()).unwrap()
}

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<_> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "exactly one {kind}");
    found[0]
}

/// The ConfigMap's `DP_MACVTAP_CONF`, through the device plugin's own parser.
fn dp_config(json: &str) -> Resources {
    parse_json(&Source::Env, json)
        .unwrap_or_else(|e| panic!("the device plugin refuses {json:?}: {e}"))
}

fn daemonset(docs: &[Value]) -> DaemonSet {
    typed("DaemonSet", one(docs, "DaemonSet"))
}

/// `v` as the typed object `T`, which must write back exactly `v`.
/// k8s-openapi ignores keys it does not know, so a misspelt field parses;
/// the API server's strict field validation refuses it. Comparing the
/// round trip with the input catches it, with the field's path.
fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(what: &str, v: &Value) -> T {
    let t: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let back = serde_json::to_value(&t).unwrap();
    if let Some(diff) = difference(v, &back, "") {
        panic!("{what}: {diff}, so the API server would refuse it:\n{v:#}");
    }
    t
}

/// The first place where `written` (a typed round trip) differs from
/// `input`, as a sentence naming the field's path.
fn difference(input: &Value, written: &Value, path: &str) -> Option<String> {
    match (input, written) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let here = format!("{path}.{k}");
                match b.get(k) {
                    None => return Some(format!("{here} is not a field of the type")),
                    Some(w) => {
                        if let Some(d) = difference(v, w, &here) {
                            return Some(d);
                        }
                    }
                }
            }
            b.keys()
                .find(|k| !a.contains_key(*k))
                .map(|k| format!("{path}.{k} appeared in the round trip"))
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (v, w))| difference(v, w, &format!("{path}[{i}]"))),
        _ if input == written => None,
        _ => Some(format!("{path} is {input} but reads back as {written}")),
    }
}

#[test]
fn every_object_parses_into_its_kubernetes_type() {
    for (dir, docs) in renderings() {
        for d in &docs {
            let v = d.clone();
            let kind = d["kind"].as_str().unwrap();
            let what = format!("{dir}: {kind} {}", d["metadata"]["name"]);
            match kind {
                "DaemonSet" => drop(typed::<DaemonSet>(&what, &v)),
                "ConfigMap" => drop(typed::<ConfigMap>(&what, &v)),
                "Namespace" => drop(typed::<Namespace>(&what, &v)),
                "ServiceAccount" => drop(typed::<ServiceAccount>(&what, &v)),
                "ClusterRole" => drop(typed::<ClusterRole>(&what, &v)),
                "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(&what, &v)),
                "Role" => drop(typed::<Role>(&what, &v)),
                "RoleBinding" => drop(typed::<RoleBinding>(&what, &v)),
                "SecurityContextConstraints" => {
                    let scc: DynamicObject = serde_json::from_value(v).unwrap();
                    assert_eq!(scc.data["allowHostNetwork"], true);
                    let users = scc.data["users"].as_array().unwrap();
                    assert!(
                        users
                            .iter()
                            .any(|u| u == "system:serviceaccount:macvtap-system:macvtap-cni")
                    );
                }
                other => panic!("{dir}: unexpected kind {other}"),
            }
        }
        for d in docs.iter().filter(|d| {
            ![
                "Namespace",
                "SecurityContextConstraints",
                "ClusterRole",
                "ClusterRoleBinding",
            ]
            .contains(&d["kind"].as_str().unwrap())
        }) {
            assert_eq!(
                d["metadata"]["namespace"], "macvtap-system",
                "{dir}: {}",
                d["kind"]
            );
        }
    }
    let pod: Pod = typed("examples/pod.yaml", &example("pod.yaml")[0]);
    let limits = pod.spec.unwrap().containers[0]
        .resources
        .clone()
        .unwrap()
        .limits
        .unwrap();
    let nad = &example("nad.yaml")[0];
    let resource = nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"]
        .as_str()
        .unwrap();
    assert!(
        limits.contains_key(resource),
        "examples/pod.yaml asks for the NAD's resource {resource}: {limits:?}"
    );
    let cm: ConfigMap = typed(
        "examples/configmap-explicit.yaml",
        &example("configmap-explicit.yaml")[0],
    );
    assert!(cm.data.unwrap().contains_key("DP_MACVTAP_CONF"));
}

/// The example of selectors (issue 46, item 4) is a ConfigMap the daemon
/// reads as its comment says: from the mounted file, where one bad entry
/// would refuse the whole list.
#[test]
fn the_selectors_example_is_what_its_comment_says() {
    let doc = &example("configmap-selectors.yaml")[0];
    let cm: ConfigMap = typed("examples/configmap-selectors.yaml", doc);
    assert_eq!(
        cm.metadata.name.as_deref(),
        Some("macvtap-deviceplugin-config")
    );
    let text = &cm.data.unwrap()["DP_MACVTAP_CONF"];
    let file = Source::File("/etc/macvtap-deviceplugin/DP_MACVTAP_CONF".into());
    let Resources::Static(list) = parse_json(&file, text).unwrap() else {
        panic!("an explicit list")
    };
    let dataplane = list[0].placement.as_ref().unwrap();
    let nic = dataplane.nic.as_ref().unwrap();
    assert_eq!(
        (nic.names.as_slice(), nic.driver.as_deref()),
        (
            &["ens5f0".to_string(), "eth1".to_string()][..],
            Some("ixgbe")
        )
    );
    assert!(dataplane.nodes.is_empty());
    let fast = list[1].placement.as_ref().unwrap();
    let nic = fast.nic.as_ref().unwrap();
    assert_eq!(nic.pattern.as_deref(), Some("enp*"));
    assert_eq!(
        (nic.vendor.as_deref(), nic.device.as_deref()),
        (Some("15b3"), Some("1017"))
    );
    assert_eq!(fast.nodes["macvtap.example.com/fast"], "yes");
    let comment =
        std::fs::read_to_string(manifests().join("examples/configmap-selectors.yaml")).unwrap();
    assert!(comment.contains("macvtap.example.com/fast=yes"));
}

/// The example NAD works with the defaults as shipped (no ConfigMap: each
/// NIC is the resource named after it) on the NIC that the explicit
/// ConfigMap names, and the explicit ConfigMap's resource is the one its
/// comment and README tell the NAD to name instead.
#[test]
fn the_nad_config_is_accepted_by_the_cni_and_names_a_nic_resource() {
    let nad: DynamicObject = serde_json::from_value(example("nad.yaml")[0].clone()).unwrap();
    assert_eq!(
        nad.types.as_ref().unwrap().kind,
        "NetworkAttachmentDefinition"
    );
    let config = nad.data["spec"]["config"].as_str().unwrap();
    let conf = macvtap_cni::config::NetConf::parse(config.as_bytes())
        .expect("the CNI accepts the NAD config");
    assert_eq!(conf.plugin_type, "macvtap");
    let resource =
        nad.metadata.annotations.as_ref().unwrap()["k8s.v1.cni.cncf.io/resourceName"].clone();
    let nic = resource
        .strip_prefix(RESOURCE_PREFIX)
        .expect("a macvtap resource");

    let cm = &example("configmap-explicit.yaml")[0];
    let parsed = dp_config(cm["data"]["DP_MACVTAP_CONF"].as_str().unwrap());
    let Resources::Static(list) = parsed else {
        panic!("the example is an explicit list")
    };
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(
        list[0].lower_device, nic,
        "the explicit ConfigMap puts its resource on the NIC the NAD names"
    );
    assert_eq!(
        list[0].resource_name(),
        format!("{RESOURCE_PREFIX}dataplane")
    );
    let comment = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/examples/configmap-explicit.yaml"),
    )
    .unwrap();
    assert!(comment.contains(&list[0].resource_name()));
    for file in ["nad.yaml", "configmap-explicit.yaml"] {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../manifests/examples")
                .join(file),
        )
        .unwrap();
        assert!(
            !text.contains("eth0"),
            "examples/{file} names eth0, usually the node's primary NIC"
        );
    }

    let vm: DynamicObject = serde_json::from_value(example("vm.yaml")[0].clone()).unwrap();
    let spec = &vm.data["spec"]["template"]["spec"];
    let iface = spec["domain"]["devices"]["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["binding"]["name"] == "macvtap")
        .expect("an interface with the macvtap binding");
    let net = spec["networks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == iface["name"])
        .expect("its network");
    assert_eq!(
        net["multus"]["networkName"],
        nad.metadata.name.clone().unwrap()
    );

    let pod = &example("pod.yaml")[0];
    assert_eq!(
        pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"],
        "dataplane"
    );
    // The binding the VM names is registered by the patches that
    // tests/kubevirt_binding.rs checks.
}

#[test]
fn one_image_everywhere() {
    let mut images = std::collections::BTreeSet::new();
    for (_, mut docs) in renderings() {
        for d in &mut docs {
            for c in macvtap_e2e::manifests::containers_mut(d) {
                images.insert(c["image"].as_str().unwrap().to_string());
            }
        }
    }
    assert_eq!(images.len(), 1, "{images:?}");
    let image = images.into_iter().next().unwrap();
    let containerfile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Containerfile"))
            .unwrap();
    let (name, tag) = macvtap_e2e::manifests::split_image(&image);
    let build = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/build-image.sh"),
    )
    .unwrap();
    assert!(
        build.contains(name) && build.contains(tag.as_deref().unwrap()),
        "hack/build-image.sh builds {image}"
    );
    assert!(containerfile.contains("org.opencontainers.image.source"));
}

fn flag(args: &[String], name: &str) -> Option<String> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix(&format!("{name}=")) {
            return Some(v.to_string());
        }
        if a == name {
            return it.next().cloned();
        }
    }
    None
}

/// The container (or init container) named `name` of a pod spec.
fn named<'a>(
    containers: &'a [k8s_openapi::api::core::v1::Container],
    name: &str,
) -> &'a k8s_openapi::api::core::v1::Container {
    containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The host paths of rendering `dir` (`docs`) agree with the binaries'
/// flags and defaults, every container and volume found by name.
fn check_host_paths(dir: &str, docs: &[Value]) {
    let ds = daemonset(docs);
    let spec = ds.spec.template.spec.unwrap();
    let volumes = spec.volumes.clone().unwrap();
    let host_path = |vol: &str| {
        volumes
            .iter()
            .find(|v| v.name == vol)
            .unwrap()
            .host_path
            .clone()
            .unwrap()
            .path
    };
    let main = named(&spec.containers, "macvtap-deviceplugin");
    let args = main.args.clone().unwrap_or_default();
    let kubelet_dir = flag(&args, "--kubelet-dir").unwrap_or_else(|| "/var/lib/kubelet".into());
    let mounts = main.volume_mounts.clone().unwrap();
    let mount = |vol: &str| {
        mounts
            .iter()
            .find(|m| m.name == vol)
            .unwrap()
            .mount_path
            .clone()
    };
    for (vol, sub) in [
        ("device-plugins", "device-plugins"),
        ("pod-resources", "pod-resources"),
    ] {
        assert_eq!(
            mount(vol),
            format!("{kubelet_dir}/{sub}"),
            "{dir}: {vol} mounted where the daemon looks"
        );
        assert_eq!(
            host_path(vol),
            mount(vol),
            "{dir}: {vol} is the host's own path"
        );
    }
    let expected_kubelet = if dir.ends_with("kubelet-dir") {
        "/var/lib/k0s/kubelet"
    } else {
        "/var/lib/kubelet"
    };
    assert_eq!(kubelet_dir, expected_kubelet, "{dir}");
    assert_eq!(host_path("dev"), "/dev");
    assert_eq!(mount("dev"), "/dev", "{dir}: the daemon checks /dev/tapN");

    let inits = spec.init_containers.clone().unwrap();
    let init = named(&inits, "install-cni");
    let init_args = init.args.clone().unwrap();
    let target = flag(&init_args, "--target-dir").expect("install-cni --target-dir");
    assert_eq!(
        flag(&init_args, "--kubelet-dir").as_deref(),
        Some(kubelet_dir.as_str()),
        "{dir}: the CNI's settings name the daemon's kubelet dir"
    );
    assert_eq!(
        flag(&init_args, "--pod-resources-check").as_deref(),
        Some("enforce"),
        "{dir}: the CNI checks device ownership"
    );
    let init_mount = init
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .find(|m| m.name == "cni-bin")
        .expect("install-cni mounts cni-bin");
    assert_eq!(
        init_mount.mount_path, target,
        "{dir}: installs into the mounted host dir"
    );
    let cni_dir = if dir.ends_with("openshift") {
        "/var/lib/cni/bin"
    } else {
        "/opt/cni/bin"
    };
    assert_eq!(host_path("cni-bin"), cni_dir, "{dir}");
}

#[test]
fn host_paths_match_the_binaries_flags_and_defaults() {
    for (dir, docs) in renderings() {
        check_host_paths(dir, &docs);
    }
}

/// A kustomize: the path of a kustomization in, its objects out.
type Renderer = fn(&Path) -> anyhow::Result<Vec<Value>>;

/// The overlays patch by name: rendered over a base whose DaemonSet has
/// every list reversed (containers, volumes, mounts, args) and a decoy
/// container and init container first (copies of the real ones under other
/// names), they still patch the real containers and only them, with
/// kubectl 1.37's kustomize and with kustomize v4.5.7 (kubectl 1.26's), whose
/// field paths (`[name=...]`, `[=value]`) must find the same fields.
#[test]
fn overlays_patch_a_reordered_base_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("manifests");
    copy_tree(&manifests(), &copy).unwrap();
    let ds_file = copy.join("base/daemonset.yaml");
    let mut ds = parse_docs(&std::fs::read_to_string(&ds_file).unwrap())
        .unwrap()
        .remove(0);
    let spec = &mut ds["spec"]["template"]["spec"];
    for list in ["containers", "initContainers"] {
        let containers = spec[list].as_array_mut().unwrap();
        for c in containers.iter_mut() {
            for field in ["args", "volumeMounts"] {
                if let Some(a) = c[field].as_array_mut() {
                    a.reverse();
                }
            }
        }
        let mut decoy = containers[0].clone();
        decoy["name"] = Value::from(format!("decoy-{list}").to_lowercase());
        containers.insert(0, decoy);
    }
    spec["volumes"].as_array_mut().unwrap().reverse();
    // JSON is YAML.
    std::fs::write(&ds_file, serde_json::to_string_pretty(&ds).unwrap()).unwrap();

    let renderers: [(&str, Renderer); 2] = [
        ("kubectl 1.37", render),
        ("kustomize v4.5.7", render_kustomize_v4),
    ];
    for ((kustomize, render), dir) in renderers
        .into_iter()
        .flat_map(|r| ["overlays/openshift", "overlays/kubelet-dir"].map(|d| (r, d)))
    {
        let docs = render(&copy.join(dir)).unwrap_or_else(|e| panic!("{kustomize}: {dir}: {e:#}"));
        check_host_paths(dir, &docs);
        let spec = daemonset(&docs).spec.template.spec.unwrap();
        let decoy = named(&spec.containers, "decoy-containers");
        let decoy_args = decoy.args.clone().unwrap();
        assert_eq!(
            flag(&decoy_args, "--kubelet-dir").as_deref(),
            Some("/var/lib/kubelet"),
            "{kustomize}: {dir}: the decoy is left alone"
        );
        let decoy_init = named(
            spec.init_containers.as_ref().unwrap(),
            "decoy-initcontainers",
        );
        assert_eq!(
            flag(decoy_init.args.as_ref().unwrap(), "--kubelet-dir").as_deref(),
            Some("/var/lib/kubelet"),
            "{kustomize}: {dir}: the decoy init container is left alone"
        );
    }
}

#[test]
fn the_daemonset_is_what_a_node_critical_daemon_needs() {
    let docs = &renderings()[0].1;
    let ds = daemonset(docs);
    assert_eq!(
        ds.metadata.name.as_deref(),
        Some("macvtap-cni"),
        "the Go project's name"
    );
    let dspec = ds.spec;
    assert_eq!(
        dspec.update_strategy.unwrap().type_.as_deref(),
        Some("RollingUpdate")
    );
    let spec = dspec.template.spec.unwrap();
    assert_eq!(spec.host_network, Some(true));
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let c = &spec.containers[0];
    let args = c.args.clone().unwrap();
    // The Go project's ConfigMap, as a file the daemon watches (a live
    // edit), optional (no ConfigMap: auto-discovery) and not in the
    // rendering (an upgrade never resets it).
    assert!(
        c.env_from.is_none(),
        "the config is a watched file, not envFrom"
    );
    assert_eq!(
        flag(&args, "--config"),
        None,
        "MACVTAP_CONFIG, which doctor inherits"
    );
    let config = c
        .env
        .as_ref()
        .unwrap()
        .iter()
        .find(|e| e.name == "MACVTAP_CONFIG")
        .and_then(|e| e.value.clone())
        .expect("MACVTAP_CONFIG");
    let config = std::path::Path::new(&config);
    assert_eq!(
        config.file_name().unwrap(),
        "DP_MACVTAP_CONF",
        "the ConfigMap's key"
    );
    let mount = c
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| std::path::Path::new(&m.mount_path) == config.parent().unwrap())
        .expect("the config file's directory is a volume mount");
    assert_eq!(mount.read_only, Some(true));
    let volume = spec
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == mount.name)
        .unwrap();
    let cm_vol = volume.config_map.as_ref().expect("a configMap volume");
    assert_eq!(
        cm_vol.name, "macvtap-deviceplugin-config",
        "the Go project's ConfigMap"
    );
    assert_eq!(cm_vol.optional, Some(true), "the daemon starts without it");
    assert!(
        !docs.iter().any(|d| d["kind"] == "ConfigMap"),
        "the base ships no ConfigMap: applying it again must not reset the operator's"
    );

    let metrics = flag(&args, "--metrics-addr").unwrap();
    let port: i32 = metrics.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(c.ports.clone().unwrap()[0].container_port, port);
    for probe in [
        c.readiness_probe.clone().unwrap(),
        c.liveness_probe.clone().unwrap(),
    ] {
        let get = probe.http_get.unwrap();
        assert_eq!(get.path.as_deref(), Some("/healthz"));
    }
    let res = c.resources.clone().unwrap();
    assert!(res.requests.unwrap().contains_key("memory"));
    assert!(res.limits.unwrap().contains_key("memory"));
    let sc = c.security_context.clone().unwrap();
    assert_ne!(sc.privileged, Some(true), "not privileged");
    let caps = sc.capabilities.unwrap();
    assert_eq!(caps.add.unwrap(), vec!["NET_ADMIN".to_string()]);
    assert_eq!(caps.drop.unwrap(), vec!["ALL".to_string()]);
    let seccomp = spec
        .security_context
        .clone()
        .and_then(|p| p.seccomp_profile)
        .expect("a pod seccompProfile");
    assert_eq!(seccomp.type_, "RuntimeDefault");
}

/// The image names no user (root unless the pod says otherwise, as the Go
/// project's image), so our own DaemonSet says it for every container, in
/// every rendering: root (the kubelet's dirs and the CNI bin dir are
/// root's), no privilege escalation, a read-only root, every capability
/// dropped but what the container needs; and the runtime's seccomp filter
/// and the log as the termination message when a container fails.
#[test]
fn every_container_says_its_user_capabilities_and_termination_message() {
    for (dir, docs) in renderings() {
        let spec = daemonset(&docs).spec.template.spec.unwrap();
        let psc = spec.security_context.clone().unwrap_or_default();
        assert_eq!(
            psc.seccomp_profile.map(|p| p.type_).as_deref(),
            Some("RuntimeDefault"),
            "{dir}"
        );
        let all = spec
            .init_containers
            .clone()
            .unwrap_or_default()
            .into_iter()
            .chain(spec.containers.clone());
        for c in all {
            let what = format!("{dir}: container {}", c.name);
            let sc = c.security_context.clone().expect(&what);
            assert_eq!(sc.run_as_user, Some(0), "{what}: runAsUser");
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{what}");
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{what}");
            assert_ne!(sc.privileged, Some(true), "{what}");
            let caps = sc.capabilities.expect(&what);
            assert_eq!(caps.drop, Some(vec!["ALL".to_string()]), "{what}");
            let want_add = if c.name == "macvtap-deviceplugin" {
                Some(vec!["NET_ADMIN".to_string()])
            } else {
                None
            };
            assert_eq!(caps.add, want_add, "{what}");
            assert_eq!(
                c.termination_message_policy.as_deref(),
                Some("FallbackToLogsOnError"),
                "{what}"
            );
        }
        if dir.ends_with("openshift") {
            let scc = one(&docs, "SecurityContextConstraints");
            assert_eq!(
                scc["seccompProfiles"],
                serde_json::json!(["runtime/default"]),
                "the SCC admits the pod's seccompProfile"
            );
        }
    }
}

/// Whether `path` is `dir` or lies below it.
fn is_at_or_under(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    path == dir || path.starts_with(&format!("{dir}/"))
}

#[test]
fn no_termination_log_lies_in_a_read_only_mount() {
    // The kubelet bind-mounts every container's termination message file at
    // `terminationMessagePath` (default `/dev/termination-log`); a runtime
    // cannot create that mount point inside a read-only volume, and the
    // container then never starts. `tests/runtime.rs` proves it under runc.
    for (dir, docs) in renderings() {
        let spec = daemonset(&docs).spec.template.spec.unwrap();
        let all = spec
            .init_containers
            .clone()
            .unwrap_or_default()
            .into_iter()
            .chain(spec.containers.clone());
        for c in all {
            let path = c
                .termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".into());
            for m in c.volume_mounts.clone().unwrap_or_default() {
                assert!(
                    !(m.read_only == Some(true) && is_at_or_under(&path, &m.mount_path)),
                    "{dir}: container {}: terminationMessagePath {path} lies in the read-only \
                     volumeMount {} at {}; set terminationMessagePath outside it",
                    c.name,
                    m.name,
                    m.mount_path
                );
            }
        }
    }
    assert!(is_at_or_under("/dev/termination-log", "/dev"));
    assert!(!is_at_or_under("/devices/x", "/dev"));
}

/// The daemon's API access: creating and patching events.k8s.io Events
/// (what `kube::runtime::events::Recorder` does), watching its own
/// DaemonSet by name (an uninstall) and listing and watching Nodes (its
/// own, by a field selector: auto-discovery's InternalIP), for the
/// DaemonSet's service account only, and nothing else in any rendering.
#[test]
fn rbac_grants_only_events_its_daemonset_and_nodes() {
    for (dir, docs) in renderings() {
        let roles: Vec<ClusterRole> = docs
            .iter()
            .filter(|d| d["kind"] == "ClusterRole")
            .map(|d| typed(&format!("{dir}: ClusterRole"), d))
            .collect();
        let rules_of = |name: &str| {
            let found: Vec<&ClusterRole> = roles
                .iter()
                .filter(|r| r.metadata.name.as_deref() == Some(name))
                .collect();
            assert_eq!(found.len(), 1, "{dir}: one ClusterRole {name}");
            assert!(found[0].aggregation_rule.is_none());
            found[0].rules.clone().unwrap()
        };
        assert_eq!(roles.len(), 2, "{dir}: two ClusterRoles");
        assert_eq!(
            rules_of("macvtap-cni-events"),
            vec![PolicyRule {
                api_groups: Some(vec!["events.k8s.io".into()]),
                resources: Some(vec!["events".into()]),
                verbs: vec!["create".into(), "patch".into()],
                ..Default::default()
            }],
            "{dir}: events create and patch, nothing more"
        );
        assert_eq!(
            rules_of("macvtap-cni-node"),
            vec![PolicyRule {
                api_groups: Some(vec!["".into()]),
                resources: Some(vec!["nodes".into()]),
                verbs: vec!["list".into(), "watch".into()],
                ..Default::default()
            }],
            "{dir}: nodes list and watch, nothing more"
        );
        let ds = daemonset(&docs);
        let local: Vec<Role> = docs
            .iter()
            .filter(|d| d["kind"] == "Role")
            .map(|d| typed(&format!("{dir}: Role"), d))
            .collect();
        assert_eq!(local.len(), 1, "{dir}: one Role");
        assert_eq!(
            local[0].rules.clone().unwrap(),
            vec![PolicyRule {
                api_groups: Some(vec!["apps".into()]),
                resources: Some(vec!["daemonsets".into()]),
                resource_names: Some(vec![ds.metadata.name.clone().unwrap()]),
                verbs: vec!["get".into(), "list".into(), "watch".into()],
                ..Default::default()
            }],
            "{dir}: reading its own DaemonSet, nothing more"
        );
        let args = ds.spec.clone().template.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap();
        assert_eq!(
            flag(&args, "--owner-daemonset").as_ref(),
            ds.metadata.name.as_ref(),
            "{dir}: the Role's resourceNames are the DaemonSet the daemon watches"
        );
        let local_bindings: Vec<RoleBinding> = docs
            .iter()
            .filter(|d| d["kind"] == "RoleBinding")
            .map(|d| typed(&format!("{dir}: RoleBinding"), d))
            .collect();
        assert_eq!(local_bindings.len(), 1, "{dir}: one RoleBinding");
        assert_eq!(
            local_bindings[0].role_ref.name,
            local[0].metadata.name.clone().unwrap()
        );
        assert_eq!(
            local_bindings[0].subjects.clone().unwrap()[0].name,
            "macvtap-cni",
            "{dir}: the DaemonSet's account"
        );
        let bindings: Vec<ClusterRoleBinding> = docs
            .iter()
            .filter(|d| d["kind"] == "ClusterRoleBinding")
            .map(|d| typed(&format!("{dir}: ClusterRoleBinding"), d))
            .collect();
        assert_eq!(bindings.len(), 2, "{dir}: two ClusterRoleBindings");
        let ds = daemonset(&docs);
        let spec = ds.spec.template.spec.clone().unwrap();
        for role in &roles {
            let bound: Vec<&ClusterRoleBinding> = bindings
                .iter()
                .filter(|b| Some(&b.role_ref.name) == role.metadata.name.as_ref())
                .collect();
            assert_eq!(
                bound.len(),
                1,
                "{dir}: one binding of {:?}",
                role.metadata.name
            );
            let b = bound[0];
            assert_eq!(b.role_ref.kind, "ClusterRole");
            let subjects = b.subjects.clone().unwrap();
            assert_eq!(subjects.len(), 1, "{dir}: one subject");
            assert_eq!(subjects[0].kind, "ServiceAccount");
            assert_eq!(
                Some(&subjects[0].name),
                spec.service_account_name.as_ref(),
                "{dir}: bound to the DaemonSet's account"
            );
            assert_eq!(
                subjects[0].namespace.as_deref(),
                ds.metadata.namespace.as_deref(),
                "{dir}: in the DaemonSet's namespace"
            );
        }
        assert_eq!(spec.automount_service_account_token, Some(true), "{dir}");
        let sa: ServiceAccount = typed(
            &format!("{dir}: ServiceAccount"),
            one(&docs, "ServiceAccount"),
        );
        assert_eq!(sa.automount_service_account_token, Some(true), "{dir}");
        let env = spec.containers[0].env.clone().unwrap();
        let node = env
            .iter()
            .find(|e| e.name == "NODE_NAME")
            .expect("NODE_NAME");
        assert_eq!(
            node.value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "spec.nodeName",
            "{dir}: the downward API names the node"
        );
    }
}

/// Which auto-discovery each DaemonSet gets (issue 46): ours say `spare`
/// (`MACVTAP_DISCOVERY`), so that without a ConfigMap no NIC the node uses
/// itself is offered; the Go project's DaemonSets, our image swapped in,
/// ask for auto-discovery with `DP_MACVTAP_CONF=[]` from their ConfigMap and
/// set no policy, which the daemon reads as the Go project's (`all`).
#[test]
fn ours_discover_spare_nics_and_the_go_daemonsets_every_nic() {
    let env_of = |ds: &Value, name: &str| -> Option<String> {
        ds["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| c["env"].as_array().into_iter().flatten())
            .find(|e| e["name"] == name)
            .map(|e| e["value"].as_str().unwrap().to_string())
    };
    let flags_of = |ds: &Value| -> Vec<String> {
        ds["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| c["args"].as_array().into_iter().flatten())
            .map(|a| a.as_str().unwrap().to_string())
            .collect()
    };
    for (dir, docs) in renderings() {
        let ds = one(&docs, "DaemonSet");
        assert_eq!(
            env_of(ds, "MACVTAP_DISCOVERY").as_deref(),
            Some("spare"),
            "{dir}"
        );
        assert_eq!(env_of(ds, "DP_MACVTAP_CONF"), None, "{dir}");
        let line = macvtap_deviceplugin::cli::parse_from(["p", "--discovery=spare"]).unwrap();
        assert_eq!(line.args.discovery, Some(DiscoveryPolicy::Spare));
    }
    for (name, ns) in [("go-macvtap.yaml", "default"), ("cnao-macvtap.yaml", "x")] {
        let (cm, ds) = if name.starts_with("go") {
            macvtap_e2e::manifests::go_macvtap("img", "[]").unwrap()
        } else {
            macvtap_e2e::manifests::cnao_macvtap(ns, "img", "[]").unwrap()
        };
        // The fixture as written holds [] (the helper sets it anew).
        let raw = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures")
                .join(name),
        )
        .unwrap();
        assert!(raw.contains("DP_MACVTAP_CONF: \"[]\""), "{name}");
        let container = &ds["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            container["envFrom"][0]["configMapRef"]["name"], cm["metadata"]["name"],
            "{name}: DP_MACVTAP_CONF reaches the environment"
        );
        assert_eq!(env_of(&ds, "MACVTAP_DISCOVERY"), None, "{name}");
        assert!(
            !flags_of(&ds).iter().any(|f| f.starts_with("--discovery")),
            "{name}"
        );
        let conf = cm["data"]["DP_MACVTAP_CONF"].as_str().unwrap();
        assert_eq!(
            parse_json(&Source::Env, conf).unwrap(),
            Resources::AutoDiscover(DiscoveryPolicy::All),
            "{name}: the Go project's discovery"
        );
    }
}

/// README's *A first VM* shows the example NAD and VM whole; they must be
/// the files in `manifests/examples/`, so the front door never drifts from
/// what the tests render and parse.
#[test]
fn readme_shows_the_example_nad_and_vm_as_they_are() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let section = readme
        .split("\n## A first VM\n")
        .nth(1)
        .expect("README has a section 'A first VM'");
    let section = section.split("\n## ").next().unwrap();
    let blocks: Vec<&str> = section
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    for (i, file) in ["nad.yaml", "vm.yaml"].into_iter().enumerate() {
        let want = std::fs::read_to_string(root.join("manifests/examples").join(file)).unwrap();
        assert_eq!(
            blocks.get(i).copied(),
            Some(want.as_str()),
            "README's yaml block {i} is not manifests/examples/{file}"
        );
    }
}
