//! Renders this project's kustomizations with the real kustomize
//! (`kubectl kustomize`, kubectl 1.37 from `hack/setup.sh`'s virtual
//! environment, and kustomize v4.5.7, kubectl 1.26's, built from its module
//! by `test_support::gopeers`) and its Helm chart with the real `helm`
//! (v4.3.2, built the same way), so the tests see exactly what `kubectl
//! apply -k` and `helm install` would send, and reads the objects.

use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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

/// Renders the kustomization in `dir` with `kubectl kustomize` (kubectl
/// 1.37's kustomize) into its objects; panics when kubectl is not installed
/// (run `hack/setup.sh`).
pub fn render(dir: &Path) -> Result<Vec<Value>> {
    let kubectl = test_kubelet::tools::venv_tool("kubectl");
    let mut cmd = Command::new(&kubectl);
    cmd.arg("kustomize").arg(dir);
    run_kustomize(cmd, "kubectl kustomize", dir)
}

/// kustomize v4.5.7, the one kubectl 1.26 (our oldest supported kubectl)
/// bundles, built on first use from `hack/peers/kustomize-v4/`.
pub fn kustomize_v4() -> Result<PathBuf> {
    let bins = test_support::gopeers::build(&test_support::gopeers::KUSTOMIZE_V4)?;
    bins.into_iter()
        .next()
        .context("the kustomize-v4 module built no binary")
}

/// Renders the kustomization in `dir` with `kustomize build` of kustomize
/// v4.5.7 ([`kustomize_v4`]), as `kubectl apply -k` of kubectl 1.26 would.
pub fn render_kustomize_v4(dir: &Path) -> Result<Vec<Value>> {
    let mut cmd = Command::new(kustomize_v4()?);
    cmd.arg("build").arg(dir);
    run_kustomize(cmd, "kustomize v4.5.7 build", dir)
}

/// Runs a kustomize command (`what`) on `dir` and parses what it printed,
/// failing with its stderr.
fn run_kustomize(mut cmd: Command, what: &str, dir: &Path) -> Result<Vec<Value>> {
    let out = cmd.output().with_context(|| {
        format!(
            "running {what} ({})",
            Path::new(cmd.get_program()).display()
        )
    })?;
    if !out.status.success() {
        bail!(
            "{what} {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text =
        String::from_utf8(out.stdout).with_context(|| format!("{what} printed non-UTF-8"))?;
    parse_docs(&text).with_context(|| format!("parsing the rendering of {}", dir.display()))
}

/// The ConfigMap name cluster-network-addons-operator gives
/// `spec.macvtap.devicePluginConfig` when the admin names none
/// (`pkg/network/macvtap.go` `fillMacvtapDefaults`), the name its own
/// rendered ConfigMap always has.
pub const CNAO_DEFAULT_CONFIG: &str = "macvtap-deviceplugin-config";

/// Every object cluster-network-addons-operator renders for `spec.macvtap`
/// (`e2e/fixtures/cnao-macvtap.yaml`: its ConfigMap of `[]`, the DaemonSet,
/// the ServiceAccount), in its order, its template's variables filled in as
/// its `renderMacvtapCni` fills them on Kubernetes: namespace `namespace`,
/// image `image` (`IfNotPresent`), the CNI dir `/opt/cni/bin`, the
/// DaemonSet reading the ConfigMap `device_plugin_config`, the default
/// workload placement.
pub fn cnao_rendering(
    namespace: &str,
    image: &str,
    device_plugin_config: &str,
) -> Result<Vec<Value>> {
    let text = fill(
        "cnao-macvtap.yaml",
        &[
            ("{{ .Namespace }}", namespace),
            ("{{ .MacvtapImage }}", image),
            ("{{ .ImagePullPolicy }}", "IfNotPresent"),
            ("{{ .CniMountPath }}", "/opt/cni/bin"),
            ("{{ .DevicePluginConfigName }}", device_plugin_config),
            // toYaml of CNAO's default workload placement, nindent 8.
            (
                "{{ toYaml .Placement.Affinity | nindent 8 }}",
                "\n        {}",
            ),
            (
                "{{ toYaml .Placement.NodeSelector | nindent 8 }}",
                "\n        kubernetes.io/os: linux",
            ),
            (
                "{{ toYaml .Placement.Tolerations | nindent 8 }}",
                "\n        - effect: NoSchedule\n          key: node.kubernetes.io/unschedulable\n          operator: Exists",
            ),
        ],
    )?;
    parse_docs(&text).context("parsing the filled cnao-macvtap.yaml")
}

/// The Go project's ConfigMap and DaemonSet as cluster-network-addons-operator
/// deploys them with no `devicePluginConfig` ([`cnao_rendering`] with
/// [`CNAO_DEFAULT_CONFIG`]), the ConfigMap's `DP_MACVTAP_CONF` set to
/// `conf`. Returns the ConfigMap and the DaemonSet.
pub fn cnao_macvtap(namespace: &str, image: &str, conf: &str) -> Result<(Value, Value)> {
    pick(
        "cnao-macvtap.yaml",
        &cnao_rendering(namespace, image, CNAO_DEFAULT_CONFIG)?,
        conf,
    )
}

/// The Go project's own DaemonSet and its README's ConfigMap
/// (`e2e/fixtures/go-macvtap.yaml`, namespace `default`) with image
/// `image`, pulled `IfNotPresent` (upstream's `Always` needs a registry),
/// and `DP_MACVTAP_CONF` set to `conf`. Returns the ConfigMap and the
/// DaemonSet.
pub fn go_macvtap(image: &str, conf: &str) -> Result<(Value, Value)> {
    let (cm, mut ds) = fixture("go-macvtap.yaml", &[("{{ .MacvtapImage }}", image)], conf)?;
    for c in containers_mut(&mut ds) {
        c["imagePullPolicy"] = Value::from("IfNotPresent");
    }
    Ok((cm, ds))
}

/// The ConfigMap and DaemonSet of the fixture `name` with its variables
/// replaced by `vars` and the ConfigMap's `DP_MACVTAP_CONF` set to `conf`.
fn fixture(name: &str, vars: &[(&str, &str)], conf: &str) -> Result<(Value, Value)> {
    let text = fill(name, vars)?;
    let docs = parse_docs(&text).with_context(|| format!("parsing the filled {name}"))?;
    pick(name, &docs, conf)
}

/// The text of the fixture `name` with its variables replaced by `vars`;
/// fails when a variable is left.
fn fill(name: &str, vars: &[(&str, &str)]) -> Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name);
    let mut text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    for (var, value) in vars {
        text = text.replace(var, value);
    }
    if text.contains("{{") {
        bail!("{}: a template variable is left", path.display());
    }
    Ok(text)
}

/// The ConfigMap (its `DP_MACVTAP_CONF` set to `conf`) and the DaemonSet
/// among `docs`, the objects of the fixture `name`.
fn pick(name: &str, docs: &[Value], conf: &str) -> Result<(Value, Value)> {
    let mut cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .cloned()
        .with_context(|| format!("no ConfigMap in {name}"))?;
    cm["data"]["DP_MACVTAP_CONF"] = Value::from(conf);
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .cloned()
        .with_context(|| format!("no DaemonSet in {name}"))?;
    Ok((cm, ds))
}

/// The real `helm` (v4.3.2), built on first use from `hack/peers/helm/`.
pub fn helm() -> Result<PathBuf> {
    let bins = test_support::gopeers::build(&test_support::gopeers::HELM)?;
    bins.into_iter()
        .next()
        .context("the helm module built no binary")
}

/// Runs `helm` with `args`, failing with its stderr.
pub fn run_helm(args: &[&str]) -> Result<String> {
    let helm = helm()?;
    let out = Command::new(&helm)
        .args(args)
        .output()
        .with_context(|| format!("running {}", helm.display()))?;
    if !out.status.success() {
        bail!(
            "helm {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).context("helm printed non-UTF-8")
}

/// Renders the chart in `chart` as `helm install` would (`helm template
/// --skip-tests`, release `macvtap-rs` in namespace `default`), each of
/// `sets` a `--set key=value`, into its objects.
pub fn render_chart(chart: &Path, sets: &[&str]) -> Result<Vec<Value>> {
    render_chart_in(chart, "default", sets)
}

/// Renders the chart in `chart` into the objects `helm install --namespace
/// namespace` would install (`helm template --skip-tests`, release
/// `macvtap-rs`: no test hooks, which only `helm test` creates), each of
/// `sets` a `--set key=value`.
pub fn render_chart_in(chart: &Path, namespace: &str, sets: &[&str]) -> Result<Vec<Value>> {
    let chart = chart.to_string_lossy();
    let mut args = vec![
        "template",
        "macvtap-rs",
        chart.as_ref(),
        "--namespace",
        namespace,
        "--skip-tests",
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    let text = run_helm(&args)?;
    parse_docs(&text).with_context(|| format!("parsing helm's rendering of {chart}"))
}

/// Objects by what identifies them to the API server: `apiVersion`, kind,
/// namespace and name; two objects with one identity are an error.
pub fn by_identity(docs: &[Value]) -> Result<BTreeMap<String, Value>> {
    let mut out = BTreeMap::new();
    for d in docs {
        let id = format!(
            "{} {} {}/{}",
            d["apiVersion"].as_str().unwrap_or("?"),
            d["kind"].as_str().unwrap_or("?"),
            d["metadata"]["namespace"].as_str().unwrap_or(""),
            d["metadata"]["name"].as_str().unwrap_or("?")
        );
        if out.insert(id.clone(), d.clone()).is_some() {
            bail!("two objects are {id}");
        }
    }
    Ok(out)
}

/// The first difference between two renderings, as a sentence naming the
/// object (its identity, [`by_identity`]) and the field, or `None` when
/// they hold the same objects; the order of the objects is not compared.
pub fn rendering_difference(a: &[Value], b: &[Value]) -> Result<Option<String>> {
    let (a, b) = (by_identity(a)?, by_identity(b)?);
    for (id, obj) in &a {
        match b.get(id) {
            None => return Ok(Some(format!("{id} is missing"))),
            Some(other) => {
                if let Some(d) = first_difference(obj, other, "") {
                    return Ok(Some(format!("{id}: {d}")));
                }
            }
        }
    }
    Ok(b.keys()
        .find(|id| !a.contains_key(*id))
        .map(|id| format!("{id} is extra")))
}

/// The first place where `b` differs from `a`, as a sentence naming the
/// field's path (`.spec.template.spec.volumes[3].hostPath.path`), or `None`
/// when they are equal.
pub fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                let here = format!("{path}.{k}");
                match y.get(k) {
                    None => return Some(format!("{here} is missing")),
                    Some(w) => {
                        if let Some(d) = first_difference(v, w, &here) {
                            return Some(d);
                        }
                    }
                }
            }
            y.keys()
                .find(|k| !x.contains_key(*k))
                .map(|k| format!("{path}.{k} is extra ({})", y[k]))
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (v, w))| first_difference(v, w, &format!("{path}[{i}]"))),
        _ if a == b => None,
        _ => Some(format!("{path} is {a} there but {b} here")),
    }
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

/// Copies `from` into `to`, directories and files, but hidden ones: the
/// temporary kustomizations tests write into `manifests/` (a `.render-*`
/// dir) may be gone before they are read.
pub fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for e in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if e.file_type()?.is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()))?;
        } else {
            std::fs::copy(e.path(), to.join(e.file_name()))
                .with_context(|| format!("copying {}", e.path().display()))?;
        }
    }
    Ok(())
}

/// Markdown `text` without its fenced code blocks, and those blocks.
pub fn split_fences(text: &str) -> (String, Vec<String>) {
    let mut prose = String::new();
    let mut blocks = Vec::new();
    let mut block: Option<String> = None;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            match block.take() {
                Some(b) => blocks.push(b),
                None => block = Some(String::new()),
            }
            continue;
        }
        match block.as_mut() {
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
            None => {
                prose.push_str(line);
                prose.push('\n');
            }
        }
    }
    (prose, blocks)
}

/// Every kustomization README (`readme`) shows in a code block, as the
/// operator's own beside a checkout named `macvtap-rs`
/// (`../macvtap-rs/manifests/...`), and again with each alternative its
/// comments name (`# or manifests/base`).
pub fn readme_kustomizations(readme: &str) -> Vec<String> {
    let (_, blocks) = split_fences(readme);
    let mut out = Vec::new();
    for b in blocks.iter().filter(|b| b.contains("kind: Kustomization")) {
        out.push(b.clone());
        for line in b.lines() {
            let Some((code, comment)) = line.split_once('#') else {
                continue;
            };
            let Some(alt) = comment.trim().strip_prefix("or ") else {
                continue;
            };
            let Some(path) = code.trim().strip_prefix("- ") else {
                continue;
            };
            let alt = alt.trim();
            let Some(i) = path.find("manifests/") else {
                continue;
            };
            out.push(b.replace(path, &format!("{}{alt}", &path[..i])));
        }
    }
    out
}

/// `text` split into words as sh would for the quoting README uses
/// (single and double quotes; `$(...)` kept as one word), for the tests
/// that run README's commands.
pub fn shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut depth = 0;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if depth > 0 {
            word.push(c);
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            continue;
        }
        match (quote, c) {
            (_, '$') if chars.peek() == Some(&'(') => {
                word.push(c);
                // The `(` just peeked.
                chars.next();
                word.push('(');
                depth = 1;
                in_word = true;
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
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
    fn differences_name_the_field() {
        let a = serde_json::json!({"s": {"v": [{"p": "/a"}, 1]}, "k": 1});
        assert_eq!(first_difference(&a, &a, ""), None);
        let b = serde_json::json!({"s": {"v": [{"p": "/b"}, 1]}, "k": 1});
        assert_eq!(
            first_difference(&a, &b, "").as_deref(),
            Some(".s.v[0].p is \"/a\" there but \"/b\" here")
        );
        let c = serde_json::json!({"s": {"v": [{"p": "/a"}, 1]}, "k": 1, "l": 2});
        assert_eq!(
            first_difference(&a, &c, "").as_deref(),
            Some(".l is extra (2)")
        );
        assert!(
            first_difference(&c, &a, "")
                .unwrap()
                .contains(".l is missing")
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
