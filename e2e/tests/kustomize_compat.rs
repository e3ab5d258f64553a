//! Our kustomizations render the same objects with the kustomize of the
//! oldest kubectl we support and with a recent one: kustomize v4.5.7, which
//! kubectl 1.26 bundles (the kubelet minimum is 1.26; built from
//! `hack/peers/kustomize-v4/`), and kubectl 1.37's (`kubectl kustomize`,
//! kustomize v5.8.1). Rendered: the base and every overlay, each alone and
//! with each component, and every kustomization README shows. GitOps tools
//! bundle their own, often older, kustomize; a field only a newer one
//! reads (`sourceValue` in a replacement: v5.7.0, kubectl 1.34, and newer)
//! fails this test instead of an operator's install.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use macvtap_e2e::manifests::{
    copy_tree, kustomize_v4, readme_kustomizations, render, render_kustomize_v4,
    rendering_difference,
};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The names of the directories in `dir`, sorted.
fn subdirs(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| {
            e.file_type().unwrap().is_dir() && !e.file_name().to_string_lossy().starts_with('.')
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// Every kustomization to compare, named, as a directory to render: in a
/// copy of the repository's `manifests/` under `tmp` (beside a checkout
/// named `macvtap-rs`, as README's kustomizations expect), the base and
/// every overlay, each alone and with each component (a kustomization of
/// the operator's beside ours), and every kustomization README shows.
fn kustomizations(tmp: &Path) -> Vec<(String, PathBuf)> {
    let manifests = root().join("manifests");
    let copy = tmp.join("macvtap-rs/manifests");
    copy_tree(&manifests, &copy).unwrap();
    let mut tops = vec!["base".to_string()];
    tops.extend(
        subdirs(&manifests.join("overlays"))
            .into_iter()
            .map(|o| format!("overlays/{o}")),
    );
    let components = subdirs(&manifests.join("components"));
    let mut out = Vec::new();
    for (i, top) in tops.iter().enumerate() {
        out.push((format!("manifests/{top}"), copy.join(top)));
        for c in &components {
            let mine = tmp.join(format!("mine-{i}-{c}"));
            std::fs::create_dir_all(&mine).unwrap();
            std::fs::write(
                mine.join("kustomization.yaml"),
                format!(
                    "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
                     resources:\n  - ../macvtap-rs/manifests/{top}\n\
                     components:\n  - ../macvtap-rs/manifests/components/{c}\n"
                ),
            )
            .unwrap();
            out.push((format!("manifests/{top} with components/{c}"), mine));
        }
    }
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    for (i, k) in readme_kustomizations(&readme).into_iter().enumerate() {
        let mine = tmp.join(format!("readme-{i}"));
        std::fs::create_dir_all(&mine).unwrap();
        std::fs::write(mine.join("kustomization.yaml"), &k).unwrap();
        out.push((format!("README's kustomization:\n{k}"), mine));
    }
    out
}

/// The objects' identities in the order kustomize printed them, the order
/// `kubectl apply -k` applies them in (the Namespace first).
fn order(docs: &[Value]) -> Vec<String> {
    docs.iter()
        .map(|d| {
            format!(
                "{} {}",
                d["kind"].as_str().unwrap_or("?"),
                d["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

/// What differs between kustomize v4.5.7's and kubectl 1.37's rendering of
/// each kustomization, one sentence each; empty when they agree.
fn differences(kustomizations: &[(String, PathBuf)]) -> Vec<String> {
    let mut out = Vec::new();
    for (what, dir) in kustomizations {
        let new = render(dir).unwrap_or_else(|e| panic!("kubectl 1.37: {what}: {e:#}"));
        let old = match render_kustomize_v4(dir) {
            Ok(docs) => docs,
            Err(e) => {
                out.push(format!("{what}\n  {e:#}"));
                continue;
            }
        };
        assert!(!new.is_empty(), "{what}: renders no object");
        if let Some(d) = rendering_difference(&new, &old).unwrap() {
            out.push(format!(
                "{what}\n  kustomize v4.5.7 (here) renders it otherwise than kubectl 1.37 (there): {d}"
            ));
        } else if order(&new) != order(&old) {
            out.push(format!(
                "{what}\n  the same objects in another order: kubectl 1.37 {:?}, kustomize v4.5.7 {:?}",
                order(&new),
                order(&old)
            ));
        }
    }
    out
}

#[test]
fn every_kustomization_renders_the_same_with_kubectl_1_26s_kustomize_and_1_37s() {
    let tmp = tempfile::tempdir().unwrap();
    let all = kustomizations(tmp.path());
    let names: Vec<&str> = all.iter().map(|(w, _)| w.as_str()).collect();
    for needed in [
        "manifests/base",
        "manifests/overlays/kubelet-dir",
        "manifests/overlays/openshift",
        "manifests/base with components/monitoring",
        "manifests/base with components/dra",
        "README's kustomization",
    ] {
        assert!(
            names.iter().any(|n| n.starts_with(needed)),
            "{needed} is among the renderings: {names:?}"
        );
    }
    let wrong = differences(&all);
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

/// The binary is the pinned release: `kustomize version` prints the
/// version stamp its release build sets.
#[test]
fn the_old_kustomize_is_v4_5_7() {
    let out = Command::new(kustomize_v4().unwrap())
        .arg("version")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("Version:kustomize/v4.5.7"), "{text}");
}

/// The comparison can fail: a replacement with a `sourceValue` (our
/// overlays had one, which kubectl 1.32's kustomize v5.5.0 refused)
/// renders with kubectl 1.37 and not with kustomize v4.5.7, and the check
/// names the kustomization and kustomize's error; a changed object is
/// named with its field.
#[test]
fn a_field_only_newer_kustomize_reads_is_caught() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("macvtap-rs/manifests");
    copy_tree(&root().join("manifests"), &copy).unwrap();
    let mine = tmp.path().join("mine");
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::write(
        mine.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         resources:\n  - ../macvtap-rs/manifests/base\n\
         replacements:\n  - sourceValue: /var/lib/cni/bin\n    targets:\n\
         \x20     - select: {kind: DaemonSet, name: macvtap-cni}\n        fieldPaths:\n\
         \x20         - spec.template.spec.volumes.[name=cni-bin].hostPath.path\n",
    )
    .unwrap();
    let new = render(&mine).unwrap();
    let ds = new.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let volumes = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap();
    assert!(
        volumes
            .iter()
            .any(|v| v["hostPath"]["path"] == "/var/lib/cni/bin"),
        "kubectl 1.37 applies the sourceValue"
    );
    let wrong = differences(&[("a sourceValue".to_string(), mine)]);
    assert_eq!(wrong.len(), 1, "{wrong:?}");
    assert!(
        wrong[0].contains("kustomize v4.5.7 build") && wrong[0].contains("sourceValue"),
        "{}",
        wrong[0]
    );

    let base = render(&copy.join("base")).unwrap();
    let mut changed = base.clone();
    let ds = changed
        .iter_mut()
        .find(|d| d["kind"] == "DaemonSet")
        .unwrap();
    ds["spec"]["template"]["spec"]["hostNetwork"] = Value::from(false);
    let d = rendering_difference(&base, &changed).unwrap().unwrap();
    assert!(
        d.contains("DaemonSet macvtap-system/macvtap-cni") && d.contains("hostNetwork"),
        "{d}"
    );
}
