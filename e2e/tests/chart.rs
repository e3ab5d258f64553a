//! The Helm chart in `charts/macvtap-rs/` against the kustomizations in
//! `manifests/`: the real `helm` (v4.3.2, built from `hack/peers/helm/`)
//! lints it and renders it, the real kustomize renders the base, the
//! overlays and the monitoring component, and the objects must be the same
//! for the same values: every field, labels and annotations included (the
//! chart adds no label of its own, so none is ignored). Beyond that: the
//! values schema refuses each mistake with Helm's message, the release's
//! namespace is honoured, the NOTES and the `helm test` pod say and run
//! what the daemon takes, and README's table of values is the schema's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Pod;
use macvtap_deviceplugin::cli::{Command, parse_from};
use macvtap_deviceplugin::config::{DiscoveryPolicy, Resources, Source, parse_json};
use macvtap_e2e::manifests::{
    copy_tree, first_difference, parse_docs, render, render_chart, render_chart_in,
    rendering_difference, run_helm,
};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart_dir() -> PathBuf {
    root().join("charts/macvtap-rs")
}

fn kustomize(dir: &str) -> Vec<Value> {
    render(&root().join("manifests").join(dir)).unwrap_or_else(|e| panic!("{dir}: {e:#}"))
}

/// The values that install the chart as the kustomize base is laid out:
/// the release anywhere (here `default`), our objects in the namespace
/// `macvtap-system`, which the chart makes.
const AS_THE_BASE: [&str; 2] = ["namespace.name=macvtap-system", "namespace.create=true"];

/// `helm template` as the base is laid out ([`AS_THE_BASE`]), release in
/// `default`, with `sets` after.
fn helm_template(sets: &[&str]) -> Vec<Value> {
    let all: Vec<&str> = AS_THE_BASE.iter().chain(sets).copied().collect();
    helm_template_in("default", &all)
}

/// `helm template --namespace ns` with only `sets`.
fn helm_template_in(ns: &str, sets: &[&str]) -> Vec<Value> {
    render_chart_in(&chart_dir(), ns, sets)
        .unwrap_or_else(|e| panic!("helm template -n {ns} {sets:?}: {e:#}"))
}

/// `helm template` (release namespace `default`, test hooks skipped) with
/// each of `sets` a `--set-json key=json`.
fn render_chart_json(sets: &[&str]) -> Vec<Value> {
    let dir = chart_dir();
    let mut args = vec![
        "template",
        "macvtap-rs",
        dir.to_str().unwrap(),
        "--skip-tests",
    ];
    for s in sets {
        args.extend(["--set-json", s]);
    }
    parse_docs(&run_helm(&args).unwrap_or_else(|e| panic!("{e:#}"))).unwrap()
}

/// What `helm install --dry-run=client -o json` says it would install in
/// namespace `ns` with `args` (`--set ...`): the release as JSON, with
/// `manifest`, `hooks` and `info.notes`. No cluster is asked.
fn dry_run_install(ns: &str, args: &[&str]) -> Value {
    let dir = chart_dir();
    let mut a = vec![
        "install",
        "macvtap-rs",
        dir.to_str().unwrap(),
        "--namespace",
        ns,
        "--dry-run=client",
        "--output",
        "json",
    ];
    a.extend_from_slice(args);
    let out = run_helm(&a).unwrap_or_else(|e| panic!("{e:#}"));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Fails unless `chart` (rendered with `sets`) and `kustomized` (from
/// `what`) hold the same objects, naming the first object and field that
/// differ.
fn assert_same_objects(what: &str, kustomized: &[Value], sets: &[&str], chart: &[Value]) {
    if let Some(d) = rendering_difference(kustomized, chart).unwrap() {
        panic!("the chart with {sets:?} differs from {what}: {d}");
    }
}

#[test]
fn helm_lint_passes_with_the_defaults_and_every_option() {
    let dir = chart_dir();
    let chart = dir.to_str().unwrap();
    for sets in [
        vec![],
        vec![
            "namespace.name=macvtap-system",
            "namespace.create=true",
            "monitoring.podMonitor.enabled=true",
            "monitoring.prometheusRule.enabled=true",
            "openshift.scc=true",
            "kubeletDir=/var/lib/k0s/kubelet",
            "cniBinDir=/var/lib/cni/bin",
            "nodeSelector.macvtap=yes",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=macvtap",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
            "tolerations[0].key=dedicated",
            "tolerations[0].operator=Equal",
            "tolerations[0].value=vms",
            "tolerations[0].effect=NoExecute",
            "tolerations[0].tolerationSeconds=30",
            "priorityClassName=",
            "imagePullSecrets[0].name=registry-creds",
            "extraArgs[0]=--discover-kinds=veth",
            "macvtapResources[0].name=dataplane",
            "macvtapResources[0].lowerDevice=eth1",
            "macvtapResources[0].mode=passthru",
            "macvtapResources[0].capacity=1",
            "metrics.bindAddress=::",
            "test.enabled=false",
        ],
        vec!["metrics.enabled=false", "namespace.name=other"],
        vec![
            "front=dra",
            "kubeletDir=/var/lib/k0s/kubelet",
            "macvtapResources[0].name=dataplane",
            "macvtapResources[0].lowerDevice=eth1",
        ],
    ] {
        let mut args = vec!["lint", "--strict", chart];
        for s in &sets {
            args.extend(["--set", s]);
        }
        let out = run_helm(&args).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(out.contains("0 chart(s) failed"), "{sets:?}: {out}");
    }
    // Lint can fail: a chart without a version is refused.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("macvtap-rs");
    copy_tree(Path::new(chart), &broken).unwrap();
    let meta = std::fs::read_to_string(broken.join("Chart.yaml")).unwrap();
    let meta: String = meta
        .lines()
        .filter(|l| !l.starts_with("version:"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(broken.join("Chart.yaml"), meta).unwrap();
    let err = run_helm(&["lint", "--strict", broken.to_str().unwrap()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("version"), "{err}");
    // A PodMonitor without the metrics port it scrapes is refused.
    let err = render_chart(
        &chart_dir(),
        &[
            "monitoring.podMonitor.enabled=true",
            "metrics.enabled=false",
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("needs metrics.enabled"), "{err}");
}

#[test]
fn the_chart_renders_the_kustomize_base() {
    let base = kustomize("base");
    // Laid out as the base: the chart makes the namespace macvtap-system.
    let chart = helm_template(&[]);
    assert_same_objects("manifests/base", &base, &AS_THE_BASE, &chart);
    // Helm's way, `helm install --namespace macvtap-system
    // --create-namespace` with the defaults: the same objects but the
    // Namespace, which Helm makes.
    let helms = helm_template_in("macvtap-system", &[]);
    let without_ns: Vec<Value> = base
        .iter()
        .filter(|d| d["kind"] != "Namespace")
        .cloned()
        .collect();
    assert_eq!(without_ns.len(), base.len() - 1, "the base has a Namespace");
    assert_same_objects(
        "manifests/base without its Namespace",
        &without_ns,
        &["--namespace macvtap-system"],
        &helms,
    );
    // The comparison can fail: one changed value is one named difference.
    let other = helm_template(&["image.tag=v9.9.9"]);
    let d = rendering_difference(&base, &other)
        .unwrap()
        .expect("a changed tag differs");
    assert!(
        d.contains("DaemonSet macvtap-system/macvtap-cni") && d.contains("v9.9.9"),
        "{d}"
    );
}

#[test]
fn the_kubelet_dir_renders_the_kubelet_dir_overlay() {
    let sets = ["kubeletDir=/var/lib/k0s/kubelet"];
    assert_same_objects(
        "manifests/overlays/kubelet-dir",
        &kustomize("overlays/kubelet-dir"),
        &sets,
        &helm_template(&sets),
    );
}

#[test]
fn the_cni_bin_dir_and_the_scc_render_the_openshift_overlay() {
    let sets = ["cniBinDir=/var/lib/cni/bin", "openshift.scc=true"];
    assert_same_objects(
        "manifests/overlays/openshift",
        &kustomize("overlays/openshift"),
        &sets,
        &helm_template(&sets),
    );
}

#[test]
fn the_monitoring_values_render_the_base_with_the_monitoring_component() {
    // A kustomization of the user's beside the base (kustomize takes no
    // absolute paths): the base plus the component.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("manifests");
    copy_tree(&root().join("manifests"), &copy).unwrap();
    let mine = copy.join("overlays/mine");
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::write(
        mine.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         resources:\n  - ../../base\ncomponents:\n  - ../../components/monitoring\n",
    )
    .unwrap();
    let kustomized = render(&mine).unwrap_or_else(|e| panic!("{e:#}"));
    for kind in ["PodMonitor", "PrometheusRule"] {
        assert_eq!(
            kustomized.iter().filter(|d| d["kind"] == kind).count(),
            1,
            "the component adds one {kind}"
        );
    }
    let sets = [
        "monitoring.podMonitor.enabled=true",
        "monitoring.prometheusRule.enabled=true",
    ];
    assert_same_objects(
        "manifests/base with manifests/components/monitoring",
        &kustomized,
        &sets,
        &helm_template(&sets),
    );
    // Off by default, and the labels a Prometheus selects by are added.
    let plain = helm_template(&[]);
    assert!(
        !plain
            .iter()
            .any(|d| d["apiVersion"] == "monitoring.coreos.com/v1")
    );
    let labelled = helm_template(&[
        "monitoring.podMonitor.enabled=true",
        "monitoring.podMonitor.labels.release=prometheus",
        "monitoring.podMonitor.interval=10s",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.prometheusRule.labels.release=prometheus",
    ]);
    for kind in ["PodMonitor", "PrometheusRule"] {
        let o = labelled.iter().find(|d| d["kind"] == kind).unwrap();
        assert_eq!(o["metadata"]["labels"]["release"], "prometheus", "{kind}");
        assert_eq!(
            o["metadata"]["labels"]["app.kubernetes.io/name"], "macvtap-cni",
            "{kind}"
        );
    }
    let pm = labelled.iter().find(|d| d["kind"] == "PodMonitor").unwrap();
    assert_eq!(pm["spec"]["podMetricsEndpoints"][0]["interval"], "10s");
}

/// `manifests/base` with `manifests/components/<component>`, rendered
/// from a kustomization in a temporary dir under `manifests/` (kustomize
/// takes no absolute paths), as a user's kustomization beside ours would.
fn kustomize_with_component(component: &str) -> Vec<Value> {
    let dir = tempfile::Builder::new()
        .prefix(".render-")
        .tempdir_in(root().join("manifests"))
        .unwrap();
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../base\ncomponents:\n  - ../components/{component}\n"
        ),
    )
    .unwrap();
    render(dir.path()).unwrap_or_else(|e| panic!("base with components/{component}: {e:#}"))
}

/// `front=dra` is `manifests/components/dra` on the base: the daemon's
/// MACVTAP_FRONT, the kubelet's plugin dirs and /var/run/cdi, the
/// ClusterRole macvtap-cni-dra and its binding; `front=device-plugin`
/// (the default) is the base.
#[test]
fn the_dra_front_renders_the_base_with_the_dra_component() {
    let kustomized = kustomize_with_component("dra");
    assert!(
        kustomized
            .iter()
            .any(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "macvtap-cni-dra"),
        "the component adds its ClusterRole"
    );
    let sets = ["front=dra"];
    assert_same_objects(
        "manifests/base with manifests/components/dra",
        &kustomized,
        &sets,
        &helm_template(&sets),
    );
    // Helm's way: the release's namespace, which the binding names.
    let without_ns: Vec<Value> = kustomized
        .iter()
        .filter(|d| d["kind"] != "Namespace")
        .cloned()
        .collect();
    assert_same_objects(
        "manifests/base with manifests/components/dra, without its Namespace",
        &without_ns,
        &["--namespace macvtap-system", "front=dra"],
        &helm_template_in("macvtap-system", &sets),
    );
    let sets = ["front=device-plugin"];
    assert_same_objects(
        "manifests/base",
        &kustomize("base"),
        &sets,
        &helm_template(&sets),
    );
}

/// In DRA mode the daemon's sockets (under `<kubeletDir>/plugins` and
/// `plugins_registry`, as the daemon derives them from `--kubelet-dir`)
/// and its CDI specs (`--cdi-dir`) land in mounts of the host's own paths,
/// with `kubeletDir` honoured; the front is one the binary takes.
#[test]
fn the_dra_front_mounts_where_the_daemon_serves_and_writes() {
    use macvtap_deviceplugin::dra::server::{dra_socket, registration_socket};
    use macvtap_deviceplugin::options::Front;
    let docs = helm_template(&["front=dra", "kubeletDir=/var/lib/k0s/kubelet"]);
    let spec = &daemonset(&docs)["spec"]["template"]["spec"];
    let main = container(&docs, "containers", "macvtap-deviceplugin");
    let front = main["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "MACVTAP_FRONT")
        .expect("MACVTAP_FRONT");
    let a = args(main);
    let with_front = format!("--front={}", front["value"].as_str().unwrap());
    let line = parse_from(
        std::iter::once("/macvtap-deviceplugin")
            .chain(a.iter().copied())
            .chain([with_front.as_str()]),
    )
    .unwrap_or_else(|e| panic!("the daemon refuses {a:?} {with_front}: {e}"));
    assert_eq!(line.args.front, Front::Dra);
    let kubelet = line.args.kubelet_dir.clone();
    assert_eq!(kubelet, Path::new("/var/lib/k0s/kubelet"));
    let mounts = main["volumeMounts"].as_array().unwrap();
    let volumes = spec["volumes"].as_array().unwrap();
    for (what, path, host) in [
        (
            "the DRA socket",
            dra_socket(&kubelet),
            "/var/lib/k0s/kubelet/plugins",
        ),
        (
            "the registration socket",
            registration_socket(&kubelet),
            "/var/lib/k0s/kubelet/plugins_registry",
        ),
        (
            "the CDI specs",
            line.args.cdi_dir.join("x.json"),
            "/var/run/cdi",
        ),
    ] {
        let m = mounts
            .iter()
            .filter(|m| path.starts_with(m["mountPath"].as_str().unwrap()))
            .max_by_key(|m| m["mountPath"].as_str().unwrap().len())
            .unwrap_or_else(|| panic!("{what} ({}) is in no mount", path.display()));
        assert_eq!(m["mountPath"], host, "{what}");
        let v = volumes.iter().find(|v| v["name"] == m["name"]).unwrap();
        assert_eq!(
            v["hostPath"],
            serde_json::json!({"path": host, "type": "DirectoryOrCreate"}),
            "{what}: the host's own path"
        );
        assert!(m.get("readOnly").is_none(), "{what}: written");
    }
    // No helm test pod: doctor checks the device plugin's sockets.
    assert!(test_pod("macvtap-system", &["front=dra"]).is_none());
    assert!(test_pod("macvtap-system", &["front=device-plugin"]).is_some());
}

/// A resource's name is a DRA device attribute's value in DRA mode: the
/// chart refuses, with the daemon's advice, exactly the names the daemon
/// would not serve through DRA (macvtap-link's `dra_name_problem`), and
/// only in DRA mode.
#[test]
fn dra_mode_refuses_a_resource_name_no_device_attribute_holds() {
    for len in [36, 37] {
        let name = format!("d{}", "a".repeat(len - 1));
        let entry = [
            format!("macvtapResources[0].name={name}"),
            "macvtapResources[0].lowerDevice=eth0".to_string(),
        ];
        let entry: Vec<&str> = entry.iter().map(String::as_str).collect();
        let dra: Vec<&str> = entry.iter().copied().chain(["front=dra"]).collect();
        let rendered = render_chart(&chart_dir(), &dra);
        match macvtap_link::dra::dra_name_problem(&name) {
            None => {
                rendered.unwrap_or_else(|e| panic!("{len} characters: {e:#}"));
            }
            Some(why) => {
                let err = rendered.expect_err("refused").to_string();
                let advice = why.rsplit(": ").next().unwrap();
                assert!(
                    err.contains(advice)
                        && err.contains(&format!("entry 0, {}/{name}", macvtap_link::dra::DRIVER)),
                    "{len} characters: the chart should say {advice:?}: {err}"
                );
            }
        }
        render_chart(&chart_dir(), &entry)
            .unwrap_or_else(|e| panic!("the device plugin serves {len} characters: {e:#}"));
    }
    assert!(macvtap_link::dra::dra_name_problem(&"a".repeat(37)).is_some());
}

/// The DeviceClasses of a rendering, by name.
fn device_classes(docs: &[Value]) -> std::collections::BTreeMap<String, Value> {
    docs.iter()
        .filter(|d| d["kind"] == "DeviceClass")
        .map(|d| {
            (
                d["metadata"]["name"].as_str().unwrap().to_string(),
                d.clone(),
            )
        })
        .collect()
}

/// Whether `name` is a DNS subdomain, as the API requires of a
/// DeviceClass's name.
fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// In DRA mode the chart makes a DeviceClass per `macvtapResources`
/// entry: for `eth1` exactly `manifests/examples/deviceclass.yaml`; for
/// every name one of a valid object name, whose `extendedResourceName` is
/// the resource's and whose CEL selector picks our driver's devices by the
/// attribute the daemon publishes (macvtap-link's `DRIVER` and
/// `ATTR_RESOURCE_NAME`); names spelled alike get classes of their own.
/// None with `deviceClasses=false`, in device-plugin mode, or without
/// named resources.
#[test]
fn dra_mode_renders_a_device_class_per_resource() {
    use macvtap_link::dra::{ATTR_RESOURCE_NAME, DRIVER};
    let sets = [
        "front=dra",
        "macvtapResources[0].name=eth1",
        "macvtapResources[1].name=Data_Plane.x",
        "macvtapResources[1].lowerDevice=eth2",
        "macvtapResources[2].name=eth_1",
        "macvtapResources[2].lowerDevice=eth3",
        "macvtapResources[3].name=eth-1",
        "macvtapResources[3].lowerDevice=eth4",
        "macvtapResources[4].name=ETH-1",
        "macvtapResources[4].lowerDevice=eth5",
        "macvtapResources[5].name=v1.2",
        "macvtapResources[5].lowerDevice=eth6",
    ];
    let docs = helm_template(&sets);
    let classes = device_classes(&docs);
    let example = &parse_docs(
        &std::fs::read_to_string(root().join("manifests/examples/deviceclass.yaml")).unwrap(),
    )
    .unwrap()[0];
    assert_eq!(
        first_difference(example, &classes["macvtap-eth1"], ""),
        None,
        "the class of eth1 is manifests/examples/deviceclass.yaml"
    );
    let (domain, attribute) = ATTR_RESOURCE_NAME.split_once('/').unwrap();
    let want: Vec<(&str, &str)> = vec![
        ("eth1", "macvtap-eth1"),
        ("Data_Plane.x", "macvtap-data-plane-x-6aa30310"),
        ("eth_1", "macvtap-eth-1-c8485302"),
        ("eth-1", "macvtap-eth-1"),
        ("ETH-1", "macvtap-eth-1-24ebc4f8"),
        ("v1.2", "macvtap-v1.2"),
    ];
    assert_eq!(classes.len(), want.len(), "{:?}", classes.keys());
    for (resource, name) in want {
        assert!(is_dns_subdomain(name), "{name}");
        let class = classes.get(name).unwrap_or_else(|| {
            panic!("no DeviceClass {name} for {resource}: {:?}", classes.keys())
        });
        let extended = format!("{DRIVER}/{resource}");
        let expected = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {
                "extendedResourceName": extended,
                "selectors": [{"cel": {"expression": format!(
                    "device.driver == \"{DRIVER}\" && device.attributes[\"{domain}\"].{attribute} == \"{extended}\""
                )}}],
            },
        });
        assert_eq!(
            first_difference(&expected, class, ""),
            None,
            "the DeviceClass of {resource}"
        );
        let typed: k8s_openapi::api::resource::v1::DeviceClass =
            serde_json::from_value(class.clone()).unwrap();
        assert_eq!(
            first_difference(class, &serde_json::to_value(&typed).unwrap(), ""),
            None,
            "{name} has a field DeviceClass does not"
        );
    }
    // Only in DRA mode, when asked, for named resources.
    let off: Vec<&str> = sets
        .iter()
        .copied()
        .chain(["deviceClasses=false"])
        .collect();
    assert!(device_classes(&helm_template(&off)).is_empty());
    let dp: Vec<&str> = sets[1..].to_vec();
    assert!(device_classes(&helm_template(&dp)).is_empty());
    assert!(device_classes(&helm_template(&["front=dra"])).is_empty());
    assert!(
        device_classes(&render_chart_json(&[
            "front=\"dra\"",
            "macvtapResources=[]"
        ]))
        .is_empty()
    );
}

fn daemonset(docs: &[Value]) -> &Value {
    docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap()
}

fn container<'a>(docs: &'a [Value], list: &str, name: &str) -> &'a Value {
    daemonset(docs)["spec"]["template"]["spec"][list]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {list} {name}"))
}

fn args(c: &Value) -> Vec<&str> {
    c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect()
}

/// The ConfigMap's `DP_MACVTAP_CONF` as the daemon reads it: the mounted
/// file (`MACVTAP_CONFIG`), where one bad entry refuses the whole list.
fn as_the_daemon_reads(docs: &[Value]) -> Resources {
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let json = cm["data"]["DP_MACVTAP_CONF"].as_str().unwrap();
    let file = Source::File("/etc/macvtap-deviceplugin/DP_MACVTAP_CONF".into());
    parse_json(&file, json).unwrap_or_else(|e| panic!("the device plugin refuses {json}: {e}"))
}

/// The values no overlay sets: each lands where the daemon reads it.
#[test]
fn the_other_values_reach_the_objects() {
    let docs = helm_template(&[
        "image.repository=registry.example.com/macvtap-rs",
        "image.tag=v0.2.0",
        "image.pullPolicy=Always",
        "macvtapResources[0].name=dataplane",
        "macvtapResources[0].lowerDevice=eth0",
        "macvtapResources[0].mode=vepa",
        "macvtapResources[0].capacity=50",
        "nodeSelector.macvtap=yes",
        "priorityClassName=",
        "metrics.port=9500",
        "metrics.bindAddress=127.0.0.1",
        "podResourcesCheck=warn",
        "daemon.resources.limits.memory=128Mi",
        "discovery.policy=all",
        "discovery.include[0]=eth2",
        "discovery.include[1]=eth3",
    ]);
    let spec = &daemonset(&docs)["spec"]["template"]["spec"];
    let main = container(&docs, "containers", "macvtap-deviceplugin");
    let init = container(&docs, "initContainers", "install-cni");
    for c in [main, init] {
        assert_eq!(c["image"], "registry.example.com/macvtap-rs:v0.2.0");
        assert_eq!(c["imagePullPolicy"], "Always");
    }
    assert_eq!(spec["nodeSelector"]["macvtap"], "yes");
    assert!(spec.get("priorityClassName").is_none(), "{spec}");
    assert!(args(main).contains(&"--metrics-addr=127.0.0.1:9500"));
    assert_eq!(main["ports"][0]["containerPort"], 9500);
    assert!(args(init).contains(&"--pod-resources-check=warn"));
    assert_eq!(main["resources"]["limits"]["memory"], "128Mi");
    // Auto-discovery's settings, as the daemon reads them (clap's
    // `value_enum` and `value_delimiter = ','` of --discovery and
    // --discover-include, from their environment variables).
    let env = |name: &str| {
        main["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
    };
    assert_eq!(env("MACVTAP_DISCOVERY"), Some(json!("all")));
    assert_eq!(env("MACVTAP_DISCOVER_INCLUDE"), Some(json!("eth2,eth3")));
    let line = parse_from(["p", "--discovery=all", "--discover-include=eth2,eth3"]).unwrap();
    assert_eq!(line.args.discovery, Some(DiscoveryPolicy::All));
    assert_eq!(line.args.discover_include, ["eth2", "eth3"]);
    let plain = helm_template(&[]);
    let main_plain = container(&plain, "containers", "macvtap-deviceplugin");
    assert!(
        !main_plain["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "MACVTAP_DISCOVER_INCLUDE"),
        "no include, no variable: {main_plain}"
    );
    // The resources reach the ConfigMap as the device plugin reads it.
    let Resources::Static(list) = as_the_daemon_reads(&docs) else {
        panic!("the device plugin auto-discovers")
    };
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(
        (
            list[0].name.as_str(),
            list[0].lower_device.as_str(),
            list[0].capacity
        ),
        ("dataplane", "eth0", 50)
    );
    assert_eq!(list[0].mode.to_string(), "vepa");

    // The ConfigMap only when the values set resources: `[]` is one for
    // auto-discovery that the release owns; unset, the chart makes none.
    let discover = render_chart_json(&["macvtapResources=[]"]);
    let cm = discover.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    assert_eq!(cm["data"]["DP_MACVTAP_CONF"], "[]");
    assert_eq!(cm["metadata"]["name"], "macvtap-deviceplugin-config");
    // macvtapResources unset later (or helm uninstall, or a rollback to a
    // revision without it): Helm keeps the ConfigMap, so the nodes keep
    // serving what it says (README, "Changing it live"; the real-node
    // cluster/helm_upgrades.rs unsets it under a pinging VM).
    assert_eq!(
        cm["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    assert!(matches!(
        as_the_daemon_reads(&discover),
        Resources::AutoDiscover(DiscoveryPolicy::Spare)
    ));
    assert!(!helm_template(&[]).iter().any(|d| d["kind"] == "ConfigMap"));

    // Metrics off: the daemon serves nothing, so no port and no probes.
    let off = helm_template_in("macvtap-system", &["metrics.enabled=false"]);
    let main = container(&off, "containers", "macvtap-deviceplugin");
    assert!(args(main).contains(&"--metrics-addr=off"));
    for field in ["ports", "readinessProbe", "livenessProbe"] {
        assert!(main.get(field).is_none(), "{field}: {main}");
    }
    assert!(!off.iter().any(|d| d["kind"] == "Namespace"));
}

/// An entry's NIC and node selectors (issue 46, item 4) reach the
/// ConfigMap as the daemon reads them, and the chart's passthru check
/// leaves such entries to each node.
#[test]
fn selectors_reach_the_configmap_as_the_daemon_reads_them() {
    let docs = helm_template(&[
        "macvtapResources[0].name=dataplane",
        "macvtapResources[0].nicSelector.names[0]=ens5f0",
        "macvtapResources[0].nicSelector.names[1]=eth1",
        "macvtapResources[0].nicSelector.driver=ixgbe",
        "macvtapResources[0].nicSelector.vendor=0x8086",
        "macvtapResources[0].nicSelector.device=10fb",
        "macvtapResources[0].nodeSelector.macvtap\\.example\\.com/dataplane=yes",
        "macvtapResources[1].name=pt",
        "macvtapResources[1].lowerDevice=ens5f0",
        "macvtapResources[1].mode=passthru",
        "macvtapResources[1].capacity=1",
        "macvtapResources[1].nodeSelector.role=pt",
    ]);
    let Resources::Static(list) = as_the_daemon_reads(&docs) else {
        panic!("the device plugin auto-discovers")
    };
    assert_eq!(list.len(), 2, "{list:?}");
    let p = list[0].placement.as_ref().unwrap();
    let nic = p.nic.as_ref().unwrap();
    assert_eq!(nic.names, ["ens5f0", "eth1"]);
    assert_eq!(nic.driver.as_deref(), Some("ixgbe"));
    assert_eq!(nic.vendor.as_deref(), Some("8086"));
    assert_eq!(nic.device.as_deref(), Some("10fb"));
    assert_eq!(p.nodes["macvtap.example.com/dataplane"], "yes");
    assert_eq!(list[1].lower_device, "ens5f0");
    assert_eq!(list[1].placement.as_ref().unwrap().nodes["role"], "pt");
}

/// `extraArgs`, `imagePullSecrets`, `nodeSelector`, `affinity`,
/// `tolerations` and `priorityClassName` land in the pod, and the
/// daemon's command line, extra flags included, is one the daemon's own
/// parser takes.
#[test]
fn the_pod_values_reach_the_daemonset() {
    let docs = helm_template(&[
        "extraArgs[0]=--discover-kinds=veth",
        "extraArgs[1]=--reclaim-grace",
        "extraArgs[2]=5m",
        "imagePullSecrets[0].name=registry-creds",
        "nodeSelector.macvtap=yes",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=nic",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        "tolerations[0].key=dedicated",
        "tolerations[0].operator=Equal",
        "tolerations[0].value=vms",
        "tolerations[0].effect=NoExecute",
        "priorityClassName=vm-infra",
        "metrics.bindAddress=::",
    ]);
    let spec = &daemonset(&docs)["spec"]["template"]["spec"];
    assert_eq!(
        spec["imagePullSecrets"],
        serde_json::json!([{"name": "registry-creds"}])
    );
    assert_eq!(spec["nodeSelector"], serde_json::json!({"macvtap": "yes"}));
    assert_eq!(
        spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0],
        serde_json::json!({"key": "nic", "operator": "Exists"})
    );
    assert_eq!(
        spec["tolerations"],
        serde_json::json!([{"key": "dedicated", "operator": "Equal", "value": "vms", "effect": "NoExecute"}])
    );
    assert_eq!(spec["priorityClassName"], "vm-infra");
    let main = container(&docs, "containers", "macvtap-deviceplugin");
    let a = args(main);
    assert_eq!(
        &a[a.len() - 3..],
        ["--discover-kinds=veth", "--reclaim-grace", "5m"],
        "extra flags come last: {a:?}"
    );
    assert!(a.contains(&"--metrics-addr=[::]:9402"), "{a:?}");
    let line = parse_from(std::iter::once("/macvtap-deviceplugin").chain(a.iter().copied()))
        .unwrap_or_else(|e| panic!("the daemon refuses {a:?}: {e}"));
    assert!(line.args.command.is_none(), "{a:?} runs a subcommand");
    assert_eq!(line.args.discover_kinds, ["veth"]);
    assert_eq!(line.args.reclaim_grace.as_secs(), 300);
    // The defaults: no secrets, the base's toleration and priority.
    let plain = helm_template(&[]);
    let spec = &daemonset(&plain)["spec"]["template"]["spec"];
    assert!(spec.get("imagePullSecrets").is_none(), "{spec}");
    assert_eq!(
        spec["tolerations"],
        serde_json::json!([{"operator": "Exists", "effect": "NoSchedule"}])
    );
    assert_eq!(spec["priorityClassName"], "system-node-critical");
}

/// The namespaced objects of a rendering and where they go.
fn namespaces_of(docs: &[Value]) -> Vec<(String, String)> {
    docs.iter()
        .filter_map(|d| {
            let ns = d["metadata"]["namespace"].as_str()?;
            let what = format!(
                "{} {}",
                d["kind"].as_str()?,
                d["metadata"]["name"].as_str()?
            );
            Some((what, ns.to_string()))
        })
        .collect()
}

/// Where the service account is named (the ClusterRoleBinding's and
/// RoleBinding's subjects, the SCC's users): all in `ns`.
fn assert_account_named_in(docs: &[Value], ns: &str) {
    for d in docs {
        for s in d["subjects"].as_array().into_iter().flatten() {
            assert_eq!(s["namespace"], ns, "{}: {s}", d["kind"]);
        }
        for u in d["users"].as_array().into_iter().flatten() {
            assert_eq!(
                u.as_str().unwrap(),
                format!("system:serviceaccount:{ns}:macvtap-cni")
            );
        }
    }
}

/// `helm install --namespace X --create-namespace` puts every object in X
/// and makes no Namespace of ours; `namespace.name` moves them elsewhere;
/// `namespace.create` makes ours, only as a namespace of its own.
#[test]
fn the_release_namespace_is_honoured() {
    let every = [
        "openshift.scc=true",
        "monitoring.podMonitor.enabled=true",
        "monitoring.prometheusRule.enabled=true",
        "macvtapResources[0].name=eth1",
    ];
    let docs = helm_template_in("team-a", &every);
    let placed = namespaces_of(&docs);
    assert_eq!(placed.len(), 7, "{placed:?}");
    for (what, ns) in &placed {
        assert_eq!(ns, "team-a", "{what}");
    }
    assert!(!docs.iter().any(|d| d["kind"] == "Namespace"));
    assert_account_named_in(&docs, "team-a");
    // namespace.name: our objects there, the release elsewhere; no
    // Namespace unless asked.
    let sets: Vec<&str> = every
        .iter()
        .copied()
        .chain(["namespace.name=vms"])
        .collect();
    let docs = helm_template_in("team-a", &sets);
    for (what, ns) in namespaces_of(&docs) {
        assert_eq!(ns, "vms", "{what}");
    }
    assert!(!docs.iter().any(|d| d["kind"] == "Namespace"));
    assert_account_named_in(&docs, "vms");
    // namespace.create: ours, labelled for the DaemonSet, never the
    // release's namespace (refusals: mistakes_are_refused_with_a_message).
    let docs = helm_template(&every);
    let ns: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Namespace").collect();
    assert_eq!(ns.len(), 1);
    assert_eq!(ns[0]["metadata"]["name"], "macvtap-system");
    assert_eq!(
        ns[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "privileged"
    );
    for (what, ns) in namespaces_of(&docs) {
        assert_eq!(ns, "macvtap-system", "{what}");
    }
    assert_account_named_in(&docs, "macvtap-system");
}

/// A mistake and the sentence that must be in Helm's refusal.
struct Mistake {
    /// `--set` (or, with a `json:` prefix, `--set-json`) arguments.
    sets: &'static [&'static str],
    /// The release's namespace.
    ns: &'static str,
    /// Part of Helm's message.
    says: &'static str,
}

const fn bad(sets: &'static [&'static str], says: &'static str) -> Mistake {
    Mistake {
        sets,
        ns: "default",
        says,
    }
}

/// Each mistake an operator makes with the values, and what Helm says.
const MISTAKES: &[Mistake] = &[
    // Issue 46's two: a typo in an enum, a list given as a string.
    bad(
        &["podResourcesCheck=enfore"],
        "at '/podResourcesCheck': value must be one of 'enforce', 'warn'",
    ),
    bad(
        &["macvtapResources=[]"],
        "at '/macvtapResources': got string, want null or array",
    ),
    // The old names, renamed: refused, naming the new one.
    bad(
        &["config.resources=[]"],
        "config.resources was renamed macvtapResources",
    ),
    bad(
        &["json:config.resources=[]"],
        "config.resources was renamed macvtapResources",
    ),
    bad(
        &["placement.nodeSelector.a=b"],
        "placement.nodeSelector moved to the top level: set nodeSelector instead",
    ),
    bad(
        &["nodeSelecter.a=b"],
        "additional properties 'nodeSelecter' not allowed",
    ),
    bad(
        &["image.pullPolicy=always"],
        "at '/image/pullPolicy': value must be one of '', 'Always', 'IfNotPresent', 'Never'",
    ),
    bad(
        &["image.tag=123"],
        "at '/image/tag': got number, want string",
    ),
    bad(&["image.tag=null"], "at '/image': missing property 'tag'"),
    bad(
        &["image.repository=ghcr.io/kubevirt/macvtap-rs:v0.1.0"],
        "at '/image/repository'",
    ),
    bad(
        &["imagePullSecrets[0]=registry-creds"],
        "at '/imagePullSecrets/0': got string, want object",
    ),
    bad(
        &["extraArgs=--discover-kinds=veth"],
        "at '/extraArgs': got string, want array",
    ),
    bad(
        &["extraArgs[0]=--kubelet-dir=/var/lib/k0s/kubelet"],
        "extraArgs: --kubelet-dir is set by the chart (value: kubeletDir)",
    ),
    bad(
        &["extraArgs[0]=--metrics-addr", "extraArgs[1]=off"],
        "extraArgs: --metrics-addr is set by the chart",
    ),
    bad(
        &["extraArgs[0]=--front=dra"],
        "extraArgs: --front is set by the chart (value: front,",
    ),
    bad(
        &["extraArgs[0]=--cdi-dir=/etc/cdi"],
        "extraArgs: --cdi-dir is set by the chart",
    ),
    bad(
        &[
            "macvtapResources[0].name=dp",
            "macvtapResources[0].lowerDevice=eth1",
            "macvtapResources[0].nicSelector.driver=ixgbe",
        ],
        "at '/macvtapResources/0'",
    ),
    bad(
        &[
            "macvtapResources[0].name=dp",
            "macvtapResources[0].nicSelector.drvier=ixgbe",
        ],
        "additional properties 'drvier' not allowed",
    ),
    bad(
        &[
            "macvtapResources[0].name=dp",
            "macvtapResources[0].nicSelector.vendor=intel",
        ],
        "at '/macvtapResources/0/nicSelector/vendor'",
    ),
    bad(
        &[
            "macvtapResources[0].name=dp",
            "json:macvtapResources[0].nicSelector={}",
        ],
        "at '/macvtapResources/0/nicSelector'",
    ),
    bad(
        &["extraArgs[0]=--discovery=all"],
        "extraArgs: --discovery is set by the chart (value: discovery.policy)",
    ),
    bad(
        &["extraArgs[0]=--discover-include", "extraArgs[1]=eth2"],
        "extraArgs: --discover-include is set by the chart (value: discovery.include)",
    ),
    bad(
        &["discovery.policy=Go"],
        "at '/discovery/policy': value must be one of 'spare', 'all'",
    ),
    bad(
        &["discovery.include=eth2"],
        "at '/discovery/include': got string, want array",
    ),
    bad(
        &["discovery.include[0]=a-name-too-long-for-a-nic"],
        "at '/discovery/include/0'",
    ),
    bad(
        &["front=DRA"],
        "at '/front': value must be one of 'device-plugin', 'dra'",
    ),
    bad(
        &["deviceClasses=yes"],
        "at '/deviceClasses': got string, want boolean",
    ),
    bad(
        &[
            "front=dra",
            "macvtapResources[0].name=dataplane-of-the-east-wing-rack-seven",
            "macvtapResources[0].lowerDevice=eth1",
        ],
        "macvtapResources: entry 0, macvtap.network.kubevirt.io/dataplane-of-the-east-wing-rack-seven, is 65 characters, and with front=dra it is a DRA device attribute's value, which holds at most 64: give the resource a name of at most 36 characters",
    ),
    bad(
        &["kubeletDir=var/lib/kubelet"],
        "at '/kubeletDir': 'var/lib/kubelet' does not match pattern",
    ),
    bad(&["cniBinDir="], "at '/cniBinDir'"),
    bad(
        &["tolerations[0].operator=Exist"],
        "at '/tolerations/0/operator': value must be one of 'Exists', 'Equal'",
    ),
    bad(
        &["affinity.nodeAfinity.a=b"],
        "at '/affinity': additional properties 'nodeAfinity' not allowed",
    ),
    bad(
        &["priorityClassName=System-Node-Critical"],
        "at '/priorityClassName'",
    ),
    bad(
        &["metrics.port=0"],
        "at '/metrics/port': minimum: got 0, want 1",
    ),
    bad(
        &["metrics.bindAddress=localhost"],
        "'localhost' is not valid ipv4",
    ),
    bad(
        &["metrics.enabled=yes"],
        "at '/metrics/enabled': got string, want boolean",
    ),
    bad(
        &["monitoring.podMonitor.interval=30"],
        "at '/monitoring/podMonitor/interval': got number, want string",
    ),
    bad(
        &["monitoring.podMonitor.interval=30sec"],
        "at '/monitoring/podMonitor/interval'",
    ),
    bad(
        &["daemon.resources.limits.memory=64MB"],
        "at '/daemon/resources/limits/memory'",
    ),
    bad(
        &["daemon.resources.limit.memory=64Mi"],
        "at '/daemon/resources': additional properties 'limit' not allowed",
    ),
    bad(
        &["openshift.scc=yes"],
        "at '/openshift/scc': got string, want boolean",
    ),
    bad(
        &["test.enabled=null"],
        "at '/test': missing property 'enabled'",
    ),
    // The resources: what the daemon would refuse, refused before.
    bad(
        &[
            "macvtapResources[0].name=dataplane",
            "macvtapResources[0].mode=brigde",
        ],
        "at '/macvtapResources/0/mode': value must be one of 'bridge', 'vepa', 'private', 'passthru'",
    ),
    bad(
        &["macvtapResources[0].lowerDevice=eth0"],
        "at '/macvtapResources/0': missing property 'name'",
    ),
    bad(
        &[
            "macvtapResources[0].name=data plane",
            "macvtapResources[0].lowerDevice=eth0",
        ],
        "at '/macvtapResources/0/name'",
    ),
    bad(
        &["macvtapResources[0].name=a-very-long-nic-name"],
        "at '/macvtapResources/0/name': 'a-very-long-nic-name' does not match pattern",
    ),
    bad(
        &[
            "macvtapResources[0].name=dp",
            "macvtapResources[0].lowerDevice=eth0:1",
        ],
        "at '/macvtapResources/0/lowerDevice'",
    ),
    bad(
        &[
            "macvtapResources[0].name=dp",
            "macvtapResources[0].lowerdevice=eth0",
        ],
        "at '/macvtapResources/0': additional properties 'lowerdevice' not allowed",
    ),
    bad(
        &[
            "macvtapResources[0].name=dp",
            "macvtapResources[0].capacity=0",
        ],
        "at '/macvtapResources/0/capacity': minimum: got 0, want 1",
    ),
    bad(
        &[
            "macvtapResources[0].name=dp",
            "macvtapResources[0].capacity=50000",
        ],
        "at '/macvtapResources/0/capacity': maximum: got 50,000, want 10,000",
    ),
    bad(
        &[
            "macvtapResources[0].name=dp",
            "macvtapResources[0].mode=passthru",
            "macvtapResources[0].capacity=4",
        ],
        "at '/macvtapResources/0/capacity': value must be 1",
    ),
    bad(
        &[
            "macvtapResources[0].name=dp",
            "macvtapResources[0].lowerDevice=eth0",
            "macvtapResources[1].name=dp",
            "macvtapResources[1].lowerDevice=eth1",
        ],
        "macvtapResources: entries 0 and 1 are both named dp",
    ),
    bad(
        &[
            "macvtapResources[0].name=a",
            "macvtapResources[0].lowerDevice=eth0",
            "macvtapResources[0].mode=passthru",
            "macvtapResources[0].capacity=1",
            "macvtapResources[1].name=b",
            "macvtapResources[1].lowerDevice=eth0",
        ],
        "macvtapResources: entries 0 and 1 both use NIC eth0 and one is in passthru mode",
    ),
    // Our Namespace: only one of its own, never one that exists.
    bad(
        &["namespace.create=true"],
        "at '/namespace/name': minLength: got 0, want 1",
    ),
    bad(
        &["namespace.name=Macvtap"],
        "at '/namespace/name': 'Macvtap' does not match pattern",
    ),
    bad(
        &["namespace.name=kube-system", "namespace.create=true"],
        "namespace.create makes the Namespace kube-system, which every cluster has",
    ),
    Mistake {
        sets: &["namespace.name=macvtap-system", "namespace.create=true"],
        ns: "macvtap-system",
        says: "namespace.create makes the Namespace macvtap-system, but the release lives there",
    },
    Mistake {
        sets: &["namespace.create=true"],
        ns: "macvtap-system",
        says: "minLength: got 0, want 1",
    },
];

/// `helm template` and `helm install` (client-side dry run: the same
/// checks before anything is sent) refuse each mistake with the message,
/// and `helm lint --strict` each one the schema refuses.
#[test]
fn mistakes_are_refused_with_a_message() {
    let dir = chart_dir();
    let chart = dir.to_str().unwrap();
    for m in MISTAKES {
        let mut values = Vec::new();
        for s in m.sets {
            match s.strip_prefix("json:") {
                Some(j) => values.extend(["--set-json", j]),
                None => values.extend(["--set", s]),
            }
        }
        let mut runs = vec![
            vec!["template", "macvtap-rs", chart, "--namespace", m.ns],
            vec![
                "install",
                "macvtap-rs",
                chart,
                "--namespace",
                m.ns,
                "--dry-run=client",
            ],
        ];
        // Lint checks the schema; a template's `fail` (the checks the
        // schema cannot express) is only an INFO line to it, by Helm's
        // design, so that a chart with required values can be linted.
        if m.says.starts_with("at '") {
            runs.push(vec!["lint", "--strict", chart, "--namespace", m.ns]);
        }
        for mut run in runs {
            run.extend(&values);
            match run_helm(&run) {
                Ok(out) => panic!("helm {} accepted it:\n{out}", run.join(" ")),
                Err(e) => {
                    let e = e.to_string();
                    assert!(
                        e.contains(m.says),
                        "helm {} should say {:?}; it said: {e}",
                        run.join(" "),
                        m.says
                    );
                }
            }
        }
    }
    // A kubelet older than 1.26 is refused by Chart.yaml's kubeVersion.
    let err = run_helm(&["template", "macvtap-rs", chart, "--kube-version", "1.25.9"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "chart requires kubeVersion: >=1.26.0-0 which is incompatible with Kubernetes v1.25.9"
        ),
        "{err}"
    );
    run_helm(&["template", "macvtap-rs", chart, "--kube-version", "1.26.0"]).unwrap();
    // DRA mode needs 1.37 (a DeviceClass's extendedResourceName).
    let err = run_helm(&[
        "template",
        "macvtap-rs",
        chart,
        "--kube-version",
        "1.36.4",
        "--set",
        "front=dra",
    ])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("front=dra needs Kubernetes 1.37 or newer")
            && err.contains("the cluster is v1.36.4: keep front=device-plugin"),
        "{err}"
    );
    for v in ["1.37.0", "1.37.1-eks-4a2b"] {
        run_helm(&[
            "template",
            "macvtap-rs",
            chart,
            "--kube-version",
            v,
            "--set",
            "front=dra",
        ])
        .unwrap_or_else(|e| panic!("{v}: {e:#}"));
    }
}

/// The pod of `helm test`, from `helm template` with the tests.
fn test_pod(ns: &str, sets: &[&str]) -> Option<Value> {
    let dir = chart_dir();
    let mut args = vec![
        "template",
        "macvtap-rs",
        dir.to_str().unwrap(),
        "--namespace",
        ns,
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    let docs = parse_docs(&run_helm(&args).unwrap_or_else(|e| panic!("{e:#}"))).unwrap();
    let mut tests: Vec<Value> = docs
        .into_iter()
        .filter(|d| d["metadata"]["annotations"]["helm.sh/hook"] == "test")
        .collect();
    assert!(tests.len() <= 1, "one test pod: {tests:?}");
    tests.pop()
}

/// `helm test` runs `doctor` on a node of the DaemonSet's, as the daemon
/// there runs: our image, the daemon's flags (the extra ones too) and
/// configuration, the same host paths read-only, the same placement; it
/// is a test hook only (`helm install` does not create it), and it
/// cannot be adopted by the DaemonSet. The pod's run on a cluster is the
/// real-node e2e's (`helm test` after the chart's install, cluster.rs).
#[test]
fn helm_test_runs_doctor_on_a_node_of_the_daemonset() {
    let sets = [
        "extraArgs[0]=--discover-kinds=veth",
        "imagePullSecrets[0].name=registry-creds",
        "nodeSelector.macvtap=yes",
        "kubeletDir=/var/lib/k0s/kubelet",
        "cniBinDir=/var/lib/cni/bin",
        "image.pullPolicy=Never",
        "metrics.port=9500",
    ];
    let pod = test_pod("macvtap-system", &sets).expect("a test pod");
    let typed: Pod = serde_json::from_value(pod.clone()).unwrap();
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(
        first_difference(&pod, &back, ""),
        None,
        "the test pod has a field Pod does not"
    );
    let meta = &pod["metadata"];
    assert_eq!(meta["namespace"], "macvtap-system");
    assert_eq!(
        meta["annotations"]["helm.sh/hook-delete-policy"],
        "before-hook-creation"
    );
    let installed = helm_template_in("macvtap-system", &sets);
    let ds = daemonset(&installed);
    for (k, _) in ds["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert!(
            meta["labels"].get(k).is_none(),
            "the DaemonSet would adopt a pod labelled {k}"
        );
    }
    let spec = &pod["spec"];
    let ds_spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["restartPolicy"], "Never");
    assert_eq!(spec["hostNetwork"], true);
    // Its token, to read the Node's InternalIP as the daemon does.
    assert_eq!(spec["automountServiceAccountToken"], true);
    for field in [
        "serviceAccountName",
        "nodeSelector",
        "tolerations",
        "imagePullSecrets",
        "securityContext",
    ] {
        assert_eq!(spec[field], ds_spec[field], "{field}");
    }
    let main = container(&installed, "containers", "macvtap-deviceplugin");
    let doctor = &spec["containers"][0];
    assert_eq!(spec["containers"].as_array().unwrap().len(), 1);
    for field in ["image", "imagePullPolicy", "command", "resources"] {
        assert_eq!(doctor[field], main[field], "{field}");
    }
    // The daemon's environment for its configuration, and its flags that
    // say what it serves, then `doctor`.
    let env = |c: &Value, name: &str| {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .cloned()
    };
    for name in ["MACVTAP_CONFIG", "MACVTAP_DISCOVERY", "NODE_NAME"] {
        assert!(env(main, name).is_some(), "{name}");
        assert_eq!(env(doctor, name), env(main, name), "{name}");
    }
    let a = args(doctor);
    assert_eq!(
        a,
        [
            "--kubelet-dir=/var/lib/k0s/kubelet",
            "--metrics-addr=0.0.0.0:9500",
            "--discover-kinds=veth",
            "doctor"
        ]
    );
    for flag in &a[..a.len() - 1] {
        assert!(args(main).contains(flag), "the daemon runs without {flag}");
    }
    let line = parse_from(std::iter::once("/macvtap-deviceplugin").chain(a.iter().copied()))
        .unwrap_or_else(|e| panic!("the binary refuses {a:?}: {e}"));
    let Some(Command::Doctor(d)) = line.args.command else {
        panic!("{a:?} does not run doctor")
    };
    assert!(
        d.cni_bin_dir.is_none(),
        "doctor finds the CNI at /host/cni-bin"
    );
    assert_eq!(line.args.kubelet_dir, Path::new("/var/lib/k0s/kubelet"));
    // Every mount read-only, each the daemon's host path at the daemon's
    // mount point.
    let host_path = |spec: &Value, volume: &str| {
        spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == volume)
            .map(|v| {
                if v.get("configMap").is_some() {
                    v["configMap"].clone()
                } else {
                    v["hostPath"].clone()
                }
            })
            .unwrap_or_else(|| panic!("no volume {volume}"))
    };
    let mounts = doctor["volumeMounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 5, "{mounts:?}");
    for m in mounts {
        assert_eq!(m["readOnly"], true, "{m}");
        let name = m["name"].as_str().unwrap();
        let theirs = main["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("the daemon has no mount {name}"));
        assert_eq!(m["mountPath"], theirs["mountPath"], "{name}");
        assert_eq!(host_path(spec, name), host_path(ds_spec, name), "{name}");
    }
    let caps = &doctor["securityContext"]["capabilities"];
    assert_eq!(caps["drop"], serde_json::json!(["ALL"]));
    assert!(caps.get("add").is_none(), "doctor only reads: {caps}");

    // A hook of `helm test` only: Helm lists it as such, `helm install`
    // does not create it, and test.enabled=false drops it.
    let release = dry_run_install("macvtap-system", &[]);
    let hooks = release["hooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 1, "{hooks:?}");
    assert_eq!(hooks[0]["events"], serde_json::json!(["test"]));
    assert_eq!(hooks[0]["kind"], "Pod");
    assert_eq!(hooks[0]["name"], "macvtap-cni-doctor");
    let manifest = parse_docs(release["manifest"].as_str().unwrap()).unwrap();
    assert!(!manifest.iter().any(|d| d["kind"] == "Pod"));
    assert!(test_pod("macvtap-system", &["test.enabled=false"]).is_none());
}

/// The NOTES `helm install` prints, for a release in `ns` with `sets`.
fn notes(ns: &str, sets: &[&str]) -> String {
    let mut args = Vec::new();
    for s in sets {
        args.extend(["--set", s]);
    }
    let release = dry_run_install(ns, &args);
    release["info"]["notes"].as_str().unwrap().to_string()
}

/// The lines of `notes` after the line holding `from`, up to the line
/// holding `to`, without their common indentation.
fn block(notes: &str, from: &str, to: &str) -> String {
    let lines: Vec<&str> = notes
        .lines()
        .skip_while(|l| !l.contains(from))
        .skip(1)
        .take_while(|l| !l.contains(to))
        .collect();
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    lines
        .iter()
        .map(|l| format!("{}\n", l.get(indent..).unwrap_or("")))
        .collect()
}

/// The NOTES' next steps work as written: the binding patch is
/// manifests/examples/kubevirt-cr-patch.yaml's, the NAD is one the CNI and
/// the device plugin take, for a resource the release advertises, and the
/// doctor command selects our pods on a chosen node and runs the binary
/// where the image has it.
#[test]
fn the_notes_give_the_next_steps() {
    let text = notes(
        "macvtap-system",
        &[
            "macvtapResources[0].name=dataplane",
            "macvtapResources[0].lowerDevice=eth1",
        ],
    );
    // The binding registration: the example's patch, as one merge patch.
    let patch_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("-p '"))
        .unwrap_or_else(|| panic!("no patch in:\n{text}"));
    let patch: Value = serde_json::from_str(
        patch_line
            .trim()
            .trim_start_matches("-p '")
            .trim_end_matches('\''),
    )
    .unwrap();
    let example = &parse_docs(
        &std::fs::read_to_string(root().join("manifests/examples/kubevirt-cr-patch.yaml")).unwrap(),
    )
    .unwrap()[0];
    assert_eq!(patch["spec"], example["spec"]);
    assert!(text.contains("kubectl -n kubevirt patch kubevirt kubevirt --type merge"));
    // The NAD: for the resource the values name.
    let nad = &parse_docs(&block(&text, "kubectl apply -f - <<'END'", "END")).unwrap()[0];
    assert_eq!(nad["kind"], "NetworkAttachmentDefinition");
    assert_eq!(
        nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"],
        "macvtap.network.kubevirt.io/dataplane"
    );
    let conf: Value = serde_json::from_str(nad["spec"]["config"].as_str().unwrap()).unwrap();
    assert_eq!(conf["type"], "macvtap");
    assert_eq!(conf["name"], nad["metadata"]["name"]);
    let example_nad =
        &parse_docs(&std::fs::read_to_string(root().join("manifests/examples/nad.yaml")).unwrap())
            .unwrap()[0];
    let example_conf: Value =
        serde_json::from_str(example_nad["spec"]["config"].as_str().unwrap()).unwrap();
    assert_eq!(conf["cniVersion"], example_conf["cniVersion"]);
    // doctor on a chosen node: our pods by the DaemonSet's selector, the
    // daemon's container, the binary's path in the image.
    let installed = helm_template_in(
        "macvtap-system",
        &[
            "macvtapResources[0].name=dataplane",
            "macvtapResources[0].lowerDevice=eth1",
        ],
    );
    let ds = daemonset(&installed);
    let selector: Vec<String> = ds["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
        .collect();
    let main = container(&installed, "containers", "macvtap-deviceplugin");
    let want = format!(
        "kubectl -n macvtap-system exec $(kubectl -n macvtap-system get pod -l {} --field-selector spec.nodeName=NODE -o name) \\\n       -c {} -- {} doctor",
        selector.join(","),
        main["name"].as_str().unwrap(),
        main["command"][0].as_str().unwrap()
    );
    assert!(text.contains(&want), "no {want:?} in:\n{text}");
    assert!(text.contains("helm test macvtap-rs -n macvtap-system --logs"));
    assert!(text.contains("kubectl -n macvtap-system rollout status ds/macvtap-cni"));
    assert!(text.contains("It lists macvtap.network.kubevirt.io/dataplane (macvtapResources)."));
    // Not made by the chart: how to label it for the DaemonSet.
    assert!(text.contains(
        "kubectl label namespace macvtap-system pod-security.kubernetes.io/enforce=privileged"
    ));

    // Auto-discovery: the NIC is the user's to fill in; the chart's own
    // namespace needs no label; no helm test line without the test.
    let text = notes(
        "default",
        &[&AS_THE_BASE[..], &["test.enabled=false"]].concat(),
    );
    let nad = &parse_docs(&block(&text, "kubectl apply -f - <<'END'", "END")).unwrap()[0];
    assert_eq!(
        nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"],
        "macvtap.network.kubevirt.io/NIC"
    );
    assert!(text.contains("(NIC: one that step 1 lists)"));
    assert!(text.contains("kubectl -n macvtap-system exec $(kubectl -n macvtap-system get pod"));
    assert!(!text.contains("kubectl label namespace"));
    assert!(!text.contains("helm test"));
}

/// In DRA mode the NOTES say where a node's devices are now (its
/// ResourceSlices, looked up as the daemon lists them; no longer its
/// allocatable) and name each DeviceClass the chart made with its
/// resource, or say to make them; no helm test.
#[test]
fn the_notes_in_dra_mode_name_the_device_classes() {
    use macvtap_link::dra::DRIVER;
    let sets = [
        "front=dra",
        "macvtapResources[0].name=dataplane",
        "macvtapResources[0].lowerDevice=eth1",
        "macvtapResources[1].name=Eth_2",
    ];
    let text = notes("macvtap-system", &sets);
    assert!(
        text.contains("the node's allocatable no longer lists the macvtap resources"),
        "{text}"
    );
    assert!(text.contains(&format!(
        "kubectl get resourceslices --field-selector spec.nodeName=NODE,spec.driver={DRIVER}"
    )));
    assert!(!text.contains("{.status.allocatable}"), "{text}");
    let classes = device_classes(&helm_template_in("macvtap-system", &sets));
    assert_eq!(classes.len(), 2);
    for (name, class) in &classes {
        let line = format!(
            "{name} for {}",
            class["spec"]["extendedResourceName"].as_str().unwrap()
        );
        assert!(text.contains(&line), "no {line:?} in:\n{text}");
    }
    assert!(!text.contains("helm test macvtap-rs"), "{text}");
    // None made: the user is told to make them, and why there are none.
    for (more, why) in [
        (&["deviceClasses=false"][..], "deviceClasses is false"),
        (&[][..], "macvtapResources names no resource"),
    ] {
        let sets: Vec<&str> = if more.is_empty() {
            vec!["front=dra"]
        } else {
            sets.iter().chain(more).copied().collect()
        };
        let text = notes("macvtap-system", &sets);
        assert!(
            text.contains(&format!("The chart made none ({why})"))
                && text.contains("manifests/examples/deviceclass.yaml"),
            "{sets:?}: {text}"
        );
    }
    // The device plugin's NOTES say nothing of DRA.
    let text = notes("macvtap-system", &sets[1..]);
    assert!(
        !text.contains("DeviceClass") && !text.contains("DRA"),
        "{text}"
    );
}

/// A schema node with `$ref` resolved against the schema's definitions.
fn resolve<'a>(schema: &'a Value, node: &'a Value) -> &'a Value {
    match node["$ref"].as_str() {
        Some(r) => {
            let name = r.strip_prefix("#/definitions/").unwrap();
            &schema["definitions"][name]
        }
        None => node,
    }
}

/// The type column of README's table for a schema node: its enum, or
/// its type(s).
fn type_cell(schema: &Value, node: &Value) -> String {
    let node_types = &node["type"];
    let node = if node_types.is_null() {
        resolve(schema, node)
    } else {
        node
    };
    if let Some(e) = node["enum"].as_array() {
        let e: Vec<String> = e
            .iter()
            .map(|v| match v.as_str().unwrap() {
                "" => "`\"\"`".to_string(),
                v => format!("`{v}`"),
            })
            .collect();
        return format!("{}: {}", node["type"].as_str().unwrap(), e.join(", "));
    }
    match &node["type"] {
        Value::String(t) => t.clone(),
        Value::Array(ts) => ts
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect::<Vec<_>>()
            .join(" or "),
        other => panic!("no type: {other}"),
    }
}

/// The default column of README's table for a default from values.yaml:
/// a scalar or an empty list or map as written in code; `None` for a
/// list or map with content, which the row may describe in words.
fn default_cell(default: &Value) -> Option<String> {
    let text = match default {
        Value::String(s) if s.is_empty() => "\"\"".to_string(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "[]".to_string(),
        Value::Object(m) if m.is_empty() => "{}".to_string(),
        Value::Array(_) | Value::Object(_) => return None,
        other => other.to_string(),
    };
    Some(format!("`{text}`"))
}

/// The values a user sets, as README's table lists them: a schema
/// property is a row unless it has properties of its own and values.yaml
/// gives it a map with keys (then each key is), or it is a removed or
/// Helm's own key.
fn value_rows(
    schema: &Value,
    node: &Value,
    defaults: &Value,
    prefix: &str,
    out: &mut Vec<(String, String, Option<String>)>,
) {
    for (k, v) in node["properties"].as_object().unwrap() {
        let path = format!("{prefix}{k}");
        let description = v["description"].as_str().unwrap_or("");
        if description.starts_with("Removed:") || path == "global" {
            assert!(defaults.get(k).is_none(), "values.yaml sets {path}");
            continue;
        }
        let default = defaults
            .get(k)
            .unwrap_or_else(|| panic!("values.yaml has no {path}"));
        let nested =
            v.get("properties").is_some() && default.as_object().is_some_and(|m| !m.is_empty());
        if nested {
            value_rows(schema, v, default, &format!("{path}."), out);
        } else {
            out.push((path, type_cell(schema, v), default_cell(default)));
        }
    }
    for k in defaults.as_object().unwrap().keys() {
        assert!(
            node["properties"].get(k).is_some(),
            "values.yaml's {prefix}{k} is not in the schema"
        );
    }
}

/// values.yaml and the schema hold the same values (the other tests
/// render the defaults, so they pass the schema), and README's table of
/// values lists each with the schema's type and values.yaml's default.
#[test]
fn readme_lists_every_value_with_its_schema_type() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let defaults =
        &parse_docs(&std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap()).unwrap()[0];
    let mut rows = Vec::new();
    value_rows(&schema, &schema, defaults, "", &mut rows);
    assert!(rows.len() > 25, "{rows:?}");
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let table: Vec<(String, String, String)> = readme
        .lines()
        .skip_while(|l| !l.starts_with("| value | type | default |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            assert!(cells.len() >= 4, "README's row {l:?}");
            (
                cells[0]
                    .trim_start_matches("| ")
                    .trim_matches('`')
                    .to_string(),
                cells[1].to_string(),
                cells[2].to_string(),
            )
        })
        .collect();
    // In README's order (values.yaml's), each once.
    let mut names: Vec<&str> = table.iter().map(|r| r.0.as_str()).collect();
    names.sort_unstable();
    let want: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        names, want,
        "README's table of values lists other values than values.schema.json"
    );
    for (name, ty, default) in &table {
        let (_, want_ty, want_default) = rows.iter().find(|r| &r.0 == name).unwrap();
        assert_eq!(ty, want_ty, "README's type of {name}");
        match want_default {
            Some(d) => assert_eq!(default, d, "README's default of {name}"),
            None => assert!(!default.is_empty(), "README gives no default of {name}"),
        }
    }
}
