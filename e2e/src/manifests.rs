//! Renders this project's kustomizations with the real kustomize
//! (`kubectl kustomize`, kubectl 1.37 from `hack/setup.sh`'s virtual
//! environment), so the tests see exactly what `kubectl apply -k` would
//! send, and reads the objects.

use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// Parses every YAML document in `text`, skipping empty ones.
pub fn parse_docs(text: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for doc in serde_norway::Deserializer::from_str(text) {
        let v = <Value as serde::Deserialize>::deserialize(doc)?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

/// Renders the kustomization in `dir` with `kubectl kustomize` into its
/// objects; panics when kubectl is not installed (run `hack/setup.sh`).
pub fn render(dir: &Path) -> Result<Vec<Value>> {
    let kubectl = test_kubelet::tools::venv_tool("kubectl");
    let out = Command::new(&kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .with_context(|| format!("running {} kustomize", kubectl.display()))?;
    if !out.status.success() {
        bail!(
            "kubectl kustomize {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8(out.stdout).context("kubectl kustomize printed non-UTF-8")?;
    parse_docs(&text).with_context(|| format!("parsing the rendering of {}", dir.display()))
}

/// Splits `registry/name:tag` into name and tag (a port is not a tag).
pub fn split_image(image: &str) -> (&str, Option<String>) {
    match image.rfind(':') {
        Some(i) if !image[i..].contains('/') => (&image[..i], Some(image[i + 1..].to_string())),
        _ => (image, None),
    }
}

/// The containers and init containers of a Pod or of a workload's template.
pub fn containers_mut(doc: &mut Value) -> Vec<&mut Value> {
    let spec = if doc["kind"] == "Pod" {
        doc.get_mut("spec")
    } else {
        doc.get_mut("spec")
            .and_then(|s| s.get_mut("template"))
            .and_then(|t| t.get_mut("spec"))
    };
    let Some(spec) = spec.and_then(Value::as_object_mut) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (k, v) in spec.iter_mut() {
        if k == "containers" || k == "initContainers" {
            if let Some(list) = v.as_array_mut() {
                out.extend(list.iter_mut());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_split_without_mistaking_ports() {
        assert_eq!(
            split_image("ghcr.io/a/b:v1"),
            ("ghcr.io/a/b", Some("v1".into()))
        );
        assert_eq!(
            split_image("localhost:5000/a/b"),
            ("localhost:5000/a/b", None)
        );
    }

    #[test]
    fn a_broken_kustomization_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("kustomization.yaml"),
            "resources:\n  - missing.yaml\n",
        )
        .unwrap();
        let err = render(dir.path()).unwrap_err().to_string();
        assert!(err.contains("missing.yaml"), "{err}");
    }
}
