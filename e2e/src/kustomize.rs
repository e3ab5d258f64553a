//! Renders this project's kustomizations without network access, for the
//! manifest tests. It implements the subset `manifests/` uses: `resources`
//! (files and directories), `namespace`, `images` and JSON 6902 `patches`
//! with a `target` of kind and name. Anything else is an error, so a new
//! kustomize feature in `manifests/` cannot be silently ignored.

use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::path::Path;

/// Kinds that live outside namespaces, which `namespace:` leaves alone.
const CLUSTER_SCOPED: [&str; 6] = [
    "Namespace",
    "SecurityContextConstraints",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PriorityClass",
];

const KNOWN_KEYS: [&str; 6] = [
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "images",
    "patches",
];

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

/// Renders the kustomization in `dir` into its objects.
pub fn render(dir: &Path) -> Result<Vec<Value>> {
    let kfile = dir.join("kustomization.yaml");
    let text =
        std::fs::read_to_string(&kfile).with_context(|| format!("reading {}", kfile.display()))?;
    let k: Value =
        serde_norway::from_str(&text).with_context(|| format!("parsing {}", kfile.display()))?;
    let obj = k.as_object().context("kustomization is not a mapping")?;
    for key in obj.keys() {
        if !KNOWN_KEYS.contains(&key.as_str()) {
            bail!(
                "{}: field {key:?} is not supported by the test renderer",
                kfile.display()
            );
        }
    }
    let mut out = Vec::new();
    for r in obj
        .get("resources")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let rel = r.as_str().context("resource is not a string")?;
        let path = dir.join(rel);
        if path.is_dir() {
            out.extend(render(&path)?);
        } else {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            out.extend(parse_docs(&text).with_context(|| format!("parsing {}", path.display()))?);
        }
    }
    for p in obj
        .get("patches")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        apply_patch(&mut out, p, dir)?;
    }
    if let Some(ns) = obj.get("namespace").and_then(Value::as_str) {
        for doc in &mut out {
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            if !CLUSTER_SCOPED.contains(&kind.as_str()) {
                doc["metadata"]["namespace"] = Value::from(ns);
            }
        }
    }
    for img in obj
        .get("images")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = img["name"].as_str().context("images[].name missing")?;
        for doc in &mut out {
            for c in containers_mut(doc) {
                let Some(image) = c["image"].as_str() else {
                    continue;
                };
                let (base, tag) = split_image(image);
                if base != name {
                    continue;
                }
                let base = img["newName"].as_str().unwrap_or(base);
                let tag = img["newTag"].as_str().map(str::to_string).or(tag);
                c["image"] = Value::from(match tag {
                    Some(t) => format!("{base}:{t}"),
                    None => base.to_string(),
                });
            }
        }
    }
    Ok(out)
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

fn apply_patch(docs: &mut [Value], patch: &Value, dir: &Path) -> Result<()> {
    let kind = patch["target"]["kind"]
        .as_str()
        .context("patch without target.kind")?;
    let name = patch["target"]["name"]
        .as_str()
        .context("patch without target.name")?;
    let text = match (patch["patch"].as_str(), patch["path"].as_str()) {
        (Some(t), _) => t.to_string(),
        (None, Some(p)) => std::fs::read_to_string(dir.join(p))?,
        _ => bail!("patch needs patch or path"),
    };
    let ops: Value = serde_norway::from_str(&text)?;
    let ops = ops
        .as_array()
        .context("only JSON 6902 patches (a list of ops) are supported")?;
    let mut matched = false;
    for doc in docs
        .iter_mut()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
    {
        matched = true;
        for op in ops {
            apply_op(doc, op).with_context(|| format!("patching {kind}/{name} with {op}"))?;
        }
    }
    if !matched {
        bail!("patch target {kind}/{name} matches nothing");
    }
    Ok(())
}

fn apply_op(doc: &mut Value, op: &Value) -> Result<()> {
    let path = op["path"].as_str().context("op without path")?;
    let (parent_path, last) = path.rsplit_once('/').context("path must start with /")?;
    let last = last.replace("~1", "/").replace("~0", "~");
    let parent = doc
        .pointer_mut(parent_path)
        .with_context(|| format!("{parent_path} does not exist"))?;
    match op["op"].as_str() {
        Some("replace") => {
            let slot = child(parent, &last).with_context(|| format!("{path} does not exist"))?;
            *slot = op["value"].clone();
        }
        Some("add") => match parent {
            Value::Array(a) if last == "-" => a.push(op["value"].clone()),
            Value::Array(a) => a.insert(last.parse()?, op["value"].clone()),
            Value::Object(o) => {
                o.insert(last, op["value"].clone());
            }
            _ => bail!("{parent_path} is not a container"),
        },
        Some("remove") => match parent {
            Value::Array(a) => {
                a.remove(last.parse()?);
            }
            Value::Object(o) => {
                o.remove(&last)
                    .with_context(|| format!("{path} does not exist"))?;
            }
            _ => bail!("{parent_path} is not a container"),
        },
        other => bail!("op {other:?} is not supported"),
    }
    Ok(())
}

fn child<'a>(parent: &'a mut Value, key: &str) -> Option<&'a mut Value> {
    match parent {
        Value::Array(a) => a.get_mut(key.parse::<usize>().ok()?),
        Value::Object(o) => o.get_mut(key),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json6902_ops_apply() {
        let mut d = json!({"a": {"b": [1, 2, 3]}});
        apply_op(
            &mut d,
            &json!({"op": "replace", "path": "/a/b/1", "value": 9}),
        )
        .unwrap();
        apply_op(&mut d, &json!({"op": "add", "path": "/a/b/-", "value": 4})).unwrap();
        apply_op(&mut d, &json!({"op": "remove", "path": "/a/b/0"})).unwrap();
        apply_op(&mut d, &json!({"op": "add", "path": "/a/c", "value": "x"})).unwrap();
        assert_eq!(d, json!({"a": {"b": [9, 3, 4], "c": "x"}}));
        assert!(
            apply_op(
                &mut d,
                &json!({"op": "replace", "path": "/a/zz", "value": 1})
            )
            .is_err()
        );
    }

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
}
