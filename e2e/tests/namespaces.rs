//! Nothing we apply touches a namespace we do not own. Every way README
//! tells an operator to install us is rendered as it would be applied (the
//! real kustomize, `kubectl kustomize` of kubectl 1.37, and the real `helm`
//! v4.3.2): each kustomization under `manifests/`, each kustomization README
//! shows (the monitoring component beside the base or an overlay), each
//! `kustomize edit set namespace` README suggests, run with the namespaces
//! the Go project's DaemonSet lives in, and each `--set` README gives the
//! chart. No rendering may create or label a Namespace other than the one
//! our objects live in, put an object anywhere else, or carry a service
//! account of another namespace in an OpenShift SCC's `users:` or an RBAC
//! binding (a stale grant). `kubectl delete -k` and `helm uninstall` delete
//! what was rendered, so a Namespace rendered under a name that already
//! existed would be deleted with everything in it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use macvtap_e2e::manifests::{
    copy_tree, parse_docs, readme_kustomizations, render, render_chart_in, split_fences,
};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Namespaces a cluster has before we are installed, so never ours:
/// Kubernetes' own, and those the Go project's DaemonSet runs in (its
/// `manifests/macvtap.yaml`: `default`, as `e2e/fixtures/go-macvtap.yaml`;
/// cluster-network-addons-operator: its own namespace, which the real-node
/// e2e names `cluster-network-addons` and OpenShift Virtualization
/// `openshift-cnv`; HyperConverged upstream: `kubevirt-hyperconverged`),
/// and KubeVirt's.
const NOT_OURS: &[&str] = &[
    "default",
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "cluster-network-addons",
    "openshift-cnv",
    "kubevirt-hyperconverged",
    "kubevirt",
];

/// What a placeholder namespace in a README command (`<ns>`) is replaced
/// with: the namespaces the Go DaemonSet is found in.
const GO_NAMESPACES: &[&str] = &["default", "cluster-network-addons", "openshift-cnv"];

/// Kinds without a namespace; every other kind is namespaced.
const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "SecurityContextConstraints",
    "DeviceClass",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).unwrap()
}

/// What in `docs` (one rendering, named `what`) would touch a namespace
/// that is not ours, one sentence each; empty when nothing would. Ours is
/// the namespace of our DaemonSet `macvtap-cni`.
fn trespasses(what: &str, docs: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    let Some(ds) = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == "macvtap-cni")
    else {
        return vec![format!("{what}: renders no DaemonSet macvtap-cni")];
    };
    let Some(ours) = ds["metadata"]["namespace"].as_str() else {
        return vec![format!(
            "{what}: the DaemonSet has no namespace, so it goes wherever kubectl's context points"
        )];
    };
    if NOT_OURS.contains(&ours) {
        out.push(format!(
            "{what}: our objects go into namespace {ours}, which exists before we are installed and is not ours"
        ));
    }
    for d in docs {
        let kind = d["kind"].as_str().unwrap_or("?");
        let name = d["metadata"]["name"].as_str().unwrap_or("?");
        if kind == "Namespace" && name != ours {
            out.push(format!(
                "{what}: creates or labels Namespace {name}, not ours ({ours})"
            ));
        }
        if kind == "Namespace" && NOT_OURS.contains(&name) {
            let labels = d["metadata"]["labels"].to_string();
            out.push(format!(
                "{what}: renders Namespace {name}, which exists before we are installed: applying it labels it {labels}, and `kubectl delete -k` or `helm uninstall` deletes it with everything in it"
            ));
        }
        if !CLUSTER_SCOPED.contains(&kind) {
            let ns = d["metadata"]["namespace"].as_str();
            if ns != Some(ours) {
                out.push(format!(
                    "{what}: puts {kind} {name} into namespace {}, not ours ({ours})",
                    ns.unwrap_or("(none: kubectl's context)")
                ));
            }
        }
        if kind == "SecurityContextConstraints" {
            for user in d["users"].as_array().into_iter().flatten() {
                let user = user.as_str().unwrap_or("");
                if let Some(rest) = user.strip_prefix("system:serviceaccount:") {
                    let ns = rest.split(':').next().unwrap_or("");
                    if ns != ours {
                        out.push(format!(
                            "{what}: SCC {name} lets {user} in, a service account of namespace {ns}, not ours ({ours})"
                        ));
                    }
                }
            }
            for group in d["groups"].as_array().into_iter().flatten() {
                let group = group.as_str().unwrap_or("");
                if let Some(ns) = group.strip_prefix("system:serviceaccounts:") {
                    if ns != ours {
                        out.push(format!(
                            "{what}: SCC {name} lets group {group} in, the service accounts of namespace {ns}"
                        ));
                    }
                }
            }
        }
        if kind == "ClusterRoleBinding" || kind == "RoleBinding" {
            for s in d["subjects"].as_array().into_iter().flatten() {
                if s["kind"] == "ServiceAccount" && s["namespace"].as_str() != Some(ours) {
                    out.push(format!(
                        "{what}: {kind} {name} grants to service account {}/{}, not ours ({ours})",
                        s["namespace"].as_str().unwrap_or("(none)"),
                        s["name"].as_str().unwrap_or("?")
                    ));
                }
            }
        }
    }
    out
}

/// The inline code spans of `text` (outside fenced blocks), a span may
/// run over a line break.
fn inline_code(text: &str) -> Vec<String> {
    let (prose, _) = split_fences(text);
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// Every namespace README has `kustomize edit set namespace` set, a
/// placeholder (`<ns>`) replaced by each of [`GO_NAMESPACES`].
fn readme_namespace_edits(readme: &str) -> Vec<String> {
    let (_, blocks) = split_fences(readme);
    let mut out = Vec::new();
    for text in inline_code(readme).iter().chain(&blocks) {
        let words: Vec<&str> = text.split_whitespace().collect();
        for w in words.windows(5) {
            if w[..4] == ["kustomize", "edit", "set", "namespace"] {
                let ns = w[4].trim_end_matches(';');
                if ns.starts_with('<') || ns.starts_with('$') {
                    out.extend(GO_NAMESPACES.iter().map(|n| n.to_string()));
                } else {
                    out.push(ns.to_string());
                }
            }
        }
    }
    out
}

/// The namespace and `--set` values of every chart command README gives,
/// one per command (Helm's `default` when a command names none; a
/// fragment's, and a shell variable's, is that of README's first `helm
/// install`); values with a placeholder (`<key>`, `*`) are left out.
fn readme_helm_sets(readme: &str) -> Vec<(String, Vec<String>)> {
    let (_, blocks) = split_fences(readme);
    let mut commands: Vec<String> = inline_code(readme)
        .into_iter()
        .filter(|s| s.contains("--set "))
        .collect();
    for b in &blocks {
        commands.extend(
            b.replace("\\\n", " ")
                .lines()
                .filter(|l| l.contains("helm install") || l.contains("helm upgrade"))
                .map(str::to_string),
        );
    }
    let first_install_namespace = commands
        .iter()
        .filter(|c| c.trim_start().starts_with("helm install"))
        .find_map(|c| {
            let words: Vec<&str> = c.split_whitespace().collect();
            words
                .windows(2)
                .find(|w| w[0] == "--namespace" || w[0] == "-n")
                .map(|w| w[1].to_string())
        })
        .unwrap_or_else(|| "default".to_string());
    let first_install_namespace = first_install_namespace.as_str();
    commands
        .iter()
        .map(|c| {
            let words: Vec<&str> = c.split_whitespace().collect();
            // Helm's namespace: `--namespace`/`-n`, else `default`; a
            // fragment (`--set ...` alone) adds to README's first install
            // command, so it has that command's.
            let own = words
                .windows(2)
                .find(|w| w[0] == "--namespace" || w[0] == "-n")
                .map(|w| w[1]);
            let namespace = match (own, words.first()) {
                // A recipe's shell variable (`"$RELEASE_NAMESPACE"`) is
                // set to README's own namespace.
                (Some(ns), _) if ns.trim_matches('"').starts_with('$') => first_install_namespace,
                (Some(ns), _) => ns,
                (None, Some(&"helm")) => "default",
                (None, _) => first_install_namespace,
            }
            .to_string();
            let sets = words
                .windows(2)
                .filter(|w| w[0] == "--set")
                .map(|w| w[1].to_string())
                .filter(|s| !s.contains('<') && !s.contains('*'))
                .collect();
            (namespace, sets)
        })
        .collect()
}

/// Every kustomize rendering README documents, named.
fn kustomize_variants(readme: &str) -> Vec<(String, Vec<Value>)> {
    let manifests = root().join("manifests");
    let mut out = Vec::new();
    let mut dirs = vec!["base".to_string()];
    for e in std::fs::read_dir(manifests.join("overlays")).unwrap() {
        let e = e.unwrap();
        dirs.push(format!("overlays/{}", e.file_name().to_string_lossy()));
    }
    for d in &dirs {
        let docs = render(&manifests.join(d)).unwrap_or_else(|e| panic!("{d}: {e:#}"));
        out.push((format!("manifests/{d}"), docs));
    }

    let tmp = tempfile::tempdir().unwrap();
    let checkout = tmp.path().join("macvtap-rs");
    copy_tree(&manifests, &checkout.join("manifests")).unwrap();
    for (i, k) in readme_kustomizations(readme).into_iter().enumerate() {
        let mine = tmp.path().join(format!("mine-{i}"));
        std::fs::create_dir_all(&mine).unwrap();
        std::fs::write(mine.join("kustomization.yaml"), &k).unwrap();
        let docs = render(&mine).unwrap_or_else(|e| panic!("README's kustomization:\n{k}\n{e:#}"));
        out.push((format!("README's kustomization:\n{k}"), docs));
    }

    for ns in readme_namespace_edits(readme) {
        for d in &dirs {
            let (what, docs) = with_namespace_edit(&ns, d);
            out.push((what, docs));
        }
    }
    out
}

/// `manifests/<dir>` rendered after `cd manifests/base && kustomize edit
/// set namespace <ns>`, which sets the base kustomization's `namespace:`.
fn with_namespace_edit(ns: &str, dir: &str) -> (String, Vec<Value>) {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("manifests");
    copy_tree(&root().join("manifests"), &copy).unwrap();
    let file = copy.join("base/kustomization.yaml");
    let mut k = parse_docs(&std::fs::read_to_string(&file).unwrap())
        .unwrap()
        .remove(0);
    k["namespace"] = Value::from(ns);
    std::fs::write(&file, serde_json::to_string_pretty(&k).unwrap()).unwrap();
    let docs = render(&copy.join(dir)).unwrap_or_else(|e| panic!("{dir}: {e:#}"));
    (
        format!("manifests/{dir} after `kustomize edit set namespace {ns}` in manifests/base"),
        docs,
    )
}

/// Every Helm rendering README documents, named: the defaults, and each
/// command's `--set` values.
fn helm_variants(readme: &str) -> Vec<(String, Vec<Value>)> {
    let chart = root().join("charts/macvtap-rs");
    let mut sets = vec![("macvtap-system".to_string(), Vec::new())];
    sets.extend(readme_helm_sets(readme));
    sets.into_iter()
        .map(|(ns, s)| {
            let refs: Vec<&str> = s.iter().map(String::as_str).collect();
            let docs = render_chart_in(&chart, &ns, &refs)
                .unwrap_or_else(|e| panic!("helm template -n {ns} {s:?}: {e:#}"));
            (format!("the chart in namespace {ns} with {s:?}"), docs)
        })
        .collect()
}

#[test]
fn no_documented_kustomize_rendering_touches_a_namespace_not_ours() {
    let readme = readme();
    let variants = kustomize_variants(&readme);
    assert!(
        variants
            .iter()
            .any(|(w, _)| w.contains("components/monitoring")),
        "README shows a kustomization with the monitoring component"
    );
    let wrong: Vec<String> = variants
        .iter()
        .flat_map(|(what, docs)| trespasses(what, docs))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn no_documented_helm_rendering_touches_a_namespace_not_ours() {
    let readme = readme();
    let variants = helm_variants(&readme);
    let all: Vec<&str> = variants.iter().map(|(w, _)| w.as_str()).collect();
    for needed in [
        "openshift.scc=true",
        "monitoring.podMonitor.enabled=true",
        "namespace.name=",
    ] {
        assert!(
            all.iter().any(|w| w.contains(needed)),
            "README gives the chart {needed}: {all:?}"
        );
    }
    let wrong: Vec<String> = variants
        .iter()
        .flat_map(|(what, docs)| trespasses(what, docs))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The check can fail: the migration README once gave (`cd manifests/base
/// && kustomize edit set namespace <ns>` with the Go DaemonSet's
/// namespace) renames our Namespace onto `default`, labelled privileged,
/// and leaves the SCC to the old namespace's account; the chart told to
/// make `default` would create it.
#[test]
fn renaming_our_namespace_onto_the_go_projects_is_caught() {
    let (what, docs) = with_namespace_edit("default", "overlays/openshift");
    let wrong = trespasses(&what, &docs).join("\n");
    for needle in [
        "our objects go into namespace default",
        "renders Namespace default",
        "\"pod-security.kubernetes.io/enforce\":\"privileged\"",
        "lets system:serviceaccount:macvtap-system:macvtap-cni in",
    ] {
        assert!(wrong.contains(needle), "{needle:?} not in:\n{wrong}");
    }
    // The chart refuses to make a namespace onto one that exists.
    let refused = render_chart_in(
        &root().join("charts/macvtap-rs"),
        "macvtap-system",
        &["namespace.name=default", "namespace.create=true"],
    )
    .unwrap_err()
    .to_string();
    assert!(refused.contains("default"), "{refused}");
    // And put in the release's namespace `default`, its objects trespass.
    let chart = render_chart_in(&root().join("charts/macvtap-rs"), "default", &[]).unwrap();
    let wrong = trespasses("the chart", &chart).join("\n");
    assert!(
        wrong.contains("our objects go into namespace default"),
        "{wrong}"
    );
    // An SCC left to another namespace's account and a binding to one.
    let mut docs = render(&root().join("manifests/overlays/openshift")).unwrap();
    for d in &mut docs {
        if d["kind"] == "SecurityContextConstraints" {
            d["users"][0] = Value::from("system:serviceaccount:default:macvtap-cni");
        }
        if d["kind"] == "ClusterRoleBinding" {
            d["subjects"][0]["namespace"] = Value::from("default");
        }
    }
    let wrong = trespasses("edited", &docs).join("\n");
    assert!(
        wrong.contains("SCC macvtap-cni lets system:serviceaccount:default"),
        "{wrong}"
    );
    assert!(
        wrong.contains("grants to service account default/macvtap-cni"),
        "{wrong}"
    );
}

#[test]
fn readme_commands_are_read_as_written() {
    let text = "Run `cd manifests/base && kustomize edit set namespace <ns>`, or\n\
                `--set a=1 --set\nb=2`, not `--set labels.<key>=<v>`.\n\
                ```sh\nhelm install r charts/x -n ns1 --set c=3 \\\n    --set d=4\n```\n\
                ```yaml\nkind: Kustomization\nresources:\n  - ../macvtap-rs/manifests/overlays/openshift   # or manifests/base\n```\n";
    assert_eq!(readme_namespace_edits(text), GO_NAMESPACES);
    assert_eq!(
        readme_helm_sets(text),
        [
            ("ns1", vec!["a=1", "b=2"]),
            ("ns1", vec![]),
            ("ns1", vec!["c=3", "d=4"])
        ]
        .map(|(ns, sets)| (
            ns.to_string(),
            sets.into_iter().map(str::to_string).collect::<Vec<_>>()
        ))
    );
    let ks = readme_kustomizations(text);
    assert_eq!(ks.len(), 2, "{ks:?}");
    assert!(
        ks[1].contains("- ../macvtap-rs/manifests/base"),
        "{}",
        ks[1]
    );
}
