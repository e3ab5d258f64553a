//! The Helm chart in `charts/macvtap-rs/` against the kustomizations in
//! `manifests/`: the real `helm` (v4.3.2, built from `hack/peers/helm/`)
//! lints it and renders it, the real kustomize renders the base, the
//! overlays and the monitoring component, and the objects must be the same
//! for the same values: every field, labels and annotations included (the
//! chart adds no label of its own, so none is ignored).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use macvtap_deviceplugin::config::{Resources, Source, parse_json};
use macvtap_e2e::manifests::{
    by_identity, first_difference, parse_docs, render, render_chart, run_helm,
};
use serde_json::Value;
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

fn helm_template(sets: &[&str]) -> Vec<Value> {
    render_chart(&chart_dir(), sets).unwrap_or_else(|e| panic!("helm template {sets:?}: {e:#}"))
}

/// `helm template` with each of `sets` a `--set-json key=json`.
fn render_chart_json(sets: &[&str]) -> Vec<Value> {
    let dir = chart_dir();
    let mut args = vec!["template", "macvtap-rs", dir.to_str().unwrap()];
    for s in sets {
        args.extend(["--set-json", s]);
    }
    parse_docs(&run_helm(&args).unwrap_or_else(|e| panic!("{e:#}"))).unwrap()
}

/// Fails unless `chart` (rendered with `sets`) and `kustomized` (from
/// `what`) hold the same objects, naming the first object and field that
/// differ.
fn assert_same_objects(what: &str, kustomized: &[Value], sets: &[&str], chart: &[Value]) {
    if let Some(d) = difference(kustomized, chart) {
        panic!("the chart with {sets:?} differs from {what}: {d}");
    }
}

/// The first difference between two renderings, as a sentence.
fn difference(a: &[Value], b: &[Value]) -> Option<String> {
    let (a, b) = (by_identity(a).unwrap(), by_identity(b).unwrap());
    for (id, obj) in &a {
        match b.get(id) {
            None => return Some(format!("{id} is missing")),
            Some(other) => {
                if let Some(d) = first_difference(obj, other, "") {
                    return Some(format!("{id}: {d}"));
                }
            }
        }
    }
    b.keys()
        .find(|id| !a.contains_key(*id))
        .map(|id| format!("{id} is extra"))
}

#[test]
fn helm_lint_passes_with_the_defaults_and_every_option() {
    let dir = chart_dir();
    let chart = dir.to_str().unwrap();
    for sets in [
        vec![],
        vec![
            "monitoring.podMonitor.enabled=true",
            "monitoring.prometheusRule.enabled=true",
            "openshift.scc=true",
            "kubeletDir=/var/lib/k0s/kubelet",
            "cniBinDir=/var/lib/cni/bin",
            "placement.nodeSelector.macvtap=yes",
        ],
        vec!["metrics.enabled=false", "namespace.create=false"],
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
    copy_tree(Path::new(chart), &broken);
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
fn the_default_values_render_the_kustomize_base() {
    let base = kustomize("base");
    let chart = helm_template(&[]);
    assert_same_objects("manifests/base", &base, &[], &chart);
    // The comparison can fail: one changed value is one named difference.
    let other = helm_template(&["image.tag=v9.9.9"]);
    let d = difference(&base, &other).expect("a changed tag differs");
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
    copy_tree(&root().join("manifests"), &copy);
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

/// Copies `from` into `to`, directories and files.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
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

/// The values no overlay sets: each lands where the daemon reads it.
#[test]
fn the_other_values_reach_the_objects() {
    let docs = helm_template(&[
        "image.repository=registry.example.com/macvtap-rs",
        "image.tag=v0.2.0",
        "image.pullPolicy=Always",
        "config.resources[0].name=dataplane",
        "config.resources[0].lowerDevice=eth0",
        "config.resources[0].mode=vepa",
        "config.resources[0].capacity=50",
        "placement.nodeSelector.macvtap=yes",
        "placement.priorityClassName=",
        "metrics.port=9500",
        "metrics.bindAddress=127.0.0.1",
        "podResourcesCheck=warn",
        "daemon.resources.limits.memory=128Mi",
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
    // The resources reach the ConfigMap as the device plugin reads it.
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let json = cm["data"]["DP_MACVTAP_CONF"].as_str().unwrap();
    let Ok(Resources::Static(list)) = parse_json(&Source::Env, json) else {
        panic!("the device plugin refuses or auto-discovers {json}")
    };
    assert_eq!(list.len(), 1, "{json}");
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
    let discover = render_chart_json(&["config.resources=[]"]);
    let cm = discover.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    assert_eq!(cm["data"]["DP_MACVTAP_CONF"], "[]");
    assert_eq!(cm["metadata"]["name"], "macvtap-deviceplugin-config");
    assert!(!helm_template(&[]).iter().any(|d| d["kind"] == "ConfigMap"));

    // Metrics off: the daemon serves nothing, so no port and no probes.
    let off = helm_template(&["metrics.enabled=false", "namespace.create=false"]);
    let main = container(&off, "containers", "macvtap-deviceplugin");
    assert!(args(main).contains(&"--metrics-addr=off"));
    for field in ["ports", "readinessProbe", "livenessProbe"] {
        assert!(main.get(field).is_none(), "{field}: {main}");
    }
    assert!(!off.iter().any(|d| d["kind"] == "Namespace"));
}
