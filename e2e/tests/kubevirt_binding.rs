//! KubeVirt's `macvtap` binding as README's *A first VM* registers it: the
//! patch files in `manifests/examples/` are what their comments and README
//! say (a merge patch touching only the binding; a JSON patch appending the
//! feature gate; the HyperConverged CR's field), and each `kubectl patch`
//! README gives, run as written but on a local object (`kubectl patch
//! --local`, the real kubectl 1.37), changes nothing of a KubeVirt or
//! HyperConverged CR with other settings but the binding and the gate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use macvtap_e2e::manifests::{parse_docs, shell_words};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The name the example VM's interface gives its binding.
const BINDING: &str = "macvtap";

/// The feature gate KubeVirt 1.1.1 to 1.4 need for any binding plugin.
const GATE: &str = "NetworkBindingPlugins";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn example(name: &str) -> Vec<Value> {
    let path = root().join("manifests/examples").join(name);
    parse_docs(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// README's section `## <title>`, up to the next `## `.
fn readme_section(title: &str) -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme
        .split(&format!("\n## {title}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("README has no section {title}"));
    section.split("\n## ").next().unwrap().to_string()
}

/// Every leaf of `v` with its path (`.spec.a.b`); an array is one leaf.
fn leaves(v: &Value, path: &str, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, w) in m {
                leaves(w, &format!("{path}.{k}"), out);
            }
        }
        _ => out.push((path.to_string(), v.clone())),
    }
}

/// One difference between an object before and after a patch.
#[derive(Debug, Clone, PartialEq)]
enum Change {
    /// A leaf (or a whole list) that was not there.
    Added(String, Value),
    /// A leaf (or list element) that is gone.
    Removed(String),
    /// A leaf whose value is another.
    Replaced(String, Value),
}

/// What changed from `before` to `after`, leaf by leaf; a list element
/// counts by its place.
fn changes(before: &Value, after: &Value, path: &str, out: &mut Vec<Change>) {
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let here = format!("{path}.{k}");
                match b.get(k) {
                    Some(w) => changes(v, w, &here, out),
                    None => out.push(Change::Removed(here)),
                }
            }
            for (k, w) in b {
                if !a.contains_key(k) {
                    let mut added = Vec::new();
                    leaves(w, &format!("{path}.{k}"), &mut added);
                    out.extend(added.into_iter().map(|(p, v)| Change::Added(p, v)));
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                let here = format!("{path}[{i}]");
                match (a.get(i), b.get(i)) {
                    (Some(v), Some(w)) => changes(v, w, &here, out),
                    (Some(_), None) => out.push(Change::Removed(here)),
                    (None, Some(w)) => out.push(Change::Added(here, w.clone())),
                    (None, None) => {}
                }
            }
        }
        _ if before == after => {}
        _ => out.push(Change::Replaced(path.to_string(), after.clone())),
    }
}

/// The changes a registration may make: the binding added, the gate added
/// to the list (or the list made with only the gate), nothing else.
fn allowed(change: &Change) -> bool {
    const GATES: &str = ".spec.configuration.developerConfiguration.featureGates";
    let Change::Added(path, value) = change else {
        return false;
    };
    let binding = [
        format!(".spec.configuration.network.binding.{BINDING}.domainAttachmentType"),
        format!(".spec.networkBinding.{BINDING}.domainAttachmentType"),
    ];
    (binding.contains(path) && value == "tap")
        || (path == GATES && *value == json!([GATE]))
        || (path.starts_with(&format!("{GATES}[")) && value == GATE)
}

/// A KubeVirt CR as a cluster has it: other network settings, another
/// binding, feature gates (`gates: false`: no feature gate list at all).
fn kubevirt_cr(gates: bool) -> Value {
    let mut cr = json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {
            "configuration": {
                "developerConfiguration": {"featureGates": ["LiveMigration", "Snapshot"], "logVerbosity": {"virtLauncher": 4}},
                "network": {
                    "defaultNetworkInterface": "bridge",
                    "permitBridgeInterfaceOnPodNetwork": false,
                    "binding": {"passt": {"sidecarImage": "registry.example.com/passt:v1"}}
                },
                "migrations": {"parallelMigrationsPerCluster": 5}
            },
            "workloadUpdateStrategy": {"workloadUpdateMethods": ["LiveMigrate"]}
        }
    });
    if !gates {
        cr["spec"]["configuration"]["developerConfiguration"]
            .as_object_mut()
            .unwrap()
            .remove("featureGates");
    }
    cr
}

/// A HyperConverged CR (v1beta1) with other settings.
fn hyperconverged_cr() -> Value {
    json!({
        "apiVersion": "hco.kubevirt.io/v1beta1",
        "kind": "HyperConverged",
        "metadata": {"name": "kubevirt-hyperconverged", "namespace": "kubevirt-hyperconverged"},
        "spec": {
            "featureGates": {"downwardMetrics": true},
            "networkBinding": {"passt": {"sidecarImage": "registry.example.com/passt:v1"}},
            "liveMigrationConfig": {"parallelMigrationsPerCluster": 5}
        }
    })
}

/// The `kubectl ... patch` command lines of `text`'s shell blocks that
/// patch a KubeVirt or HyperConverged CR, as words.
fn patch_commands(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_sh = !in_sh && t == "```sh";
            continue;
        }
        if !in_sh || t.starts_with('#') {
            continue;
        }
        let words = shell_words(t);
        let Some(at) = words.iter().position(|w| w == "patch") else {
            continue;
        };
        if words.first().map(String::as_str) == Some("kubectl")
            && words
                .get(at + 1)
                .is_some_and(|r| r == "kubevirt" || r.starts_with("hyperconverged"))
        {
            out.push(words);
        }
    }
    out
}

/// The value of `flag` in `words` (`--flag value`).
fn flag<'a>(words: &'a [String], flag: &str) -> Option<&'a str> {
    words
        .iter()
        .position(|w| w == flag)
        .and_then(|i| words.get(i + 1))
        .map(String::as_str)
}

/// Runs README's `command` as written, but on `cr` instead of the
/// cluster's object: `kubectl patch --local -f <cr> -o json` with the
/// command's `--type` and `--patch-file` or `-p`, from the repository root
/// as README's paths are. The patched object, or kubectl's error.
fn patch_locally(command: &[String], cr: &Value) -> Result<Value, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cr.json");
    std::fs::write(&file, cr.to_string()).unwrap();
    let kubectl = test_kubelet::tools::venv_tool("kubectl");
    let mut cmd = Command::new(kubectl);
    cmd.current_dir(root())
        .args(["patch", "--local", "-o", "json", "-f"])
        .arg(&file);
    let kind = flag(command, "--type").expect("README's patch names its --type");
    cmd.args(["--type", kind]);
    match (flag(command, "--patch-file"), flag(command, "-p")) {
        (Some(f), None) => cmd.args(["--patch-file", f]),
        (None, Some(p)) => cmd.args(["-p", p]),
        _ => panic!("{command:?}: one --patch-file or -p"),
    };
    let out = cmd.output().unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap())
}

/// The changes `command` makes to `cr` that a registration must not make.
fn forbidden(command: &[String], cr: &Value) -> Result<Vec<Change>, String> {
    let after = patch_locally(command, cr)?;
    let mut all = Vec::new();
    changes(cr, &after, "", &mut all);
    assert!(!all.is_empty(), "{command:?} changed nothing");
    Ok(all.into_iter().filter(|c| !allowed(c)).collect())
}

#[test]
fn the_binding_patch_is_a_merge_patch_of_only_the_binding() {
    let docs = example("kubevirt-cr-patch.yaml");
    assert_eq!(docs.len(), 1);
    assert!(
        docs[0].is_object(),
        "a merge patch is an object; a JSON patch (a list) `add` of /spec/configuration/network would replace the whole network object"
    );
    let mut found = Vec::new();
    leaves(&docs[0], "", &mut found);
    assert_eq!(
        found,
        [(
            format!(".spec.configuration.network.binding.{BINDING}.domainAttachmentType"),
            json!("tap")
        )],
        "only the binding: anything else in a merge patch is set on the cluster's CR too"
    );

    let docs = example("hyperconverged-patch.yaml");
    assert_eq!(docs.len(), 1);
    let mut found = Vec::new();
    leaves(&docs[0], "", &mut found);
    assert_eq!(
        found,
        [(
            format!(".spec.networkBinding.{BINDING}.domainAttachmentType"),
            json!("tap")
        )]
    );

    let docs = example("kubevirt-cr-featuregate-patch.yaml");
    assert_eq!(
        docs,
        [json!([{
            "op": "add",
            "path": "/spec/configuration/developerConfiguration/featureGates/-",
            "value": GATE
        }])],
        "one JSON patch operation appending the gate to the list"
    );

    let vm = &example("vm.yaml")[0];
    let names: Vec<&Value> = vm["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i.get("binding").map(|b| &b["name"]))
        .collect();
    assert_eq!(
        names,
        [BINDING],
        "the example VM names the binding registered"
    );
}

/// README's commands, applied as written to a KubeVirt CR with gates,
/// one without any, and a HyperConverged CR: each registers the binding
/// (and the gate) and changes nothing else; the gate's JSON patch fails
/// where there is no list, as README says, and the merge patch README
/// gives for that case would drop the gates of a CR that has some, which
/// is why README says "only then".
#[test]
fn readme_patch_commands_change_only_the_binding_and_the_gate() {
    let section = readme_section("A first VM");
    let commands = patch_commands(&section);
    for file in [
        "kubevirt-cr-patch.yaml",
        "kubevirt-cr-featuregate-patch.yaml",
        "hyperconverged-patch.yaml",
    ] {
        assert!(
            commands
                .iter()
                .any(|c| flag(c, "--patch-file") == Some(&format!("manifests/examples/{file}"))),
            "README's A first VM runs {file}: {commands:?}"
        );
    }
    let mut registered = [false; 3];
    for c in &commands {
        let (kind, patch) = (
            flag(c, "--type").unwrap(),
            flag(c, "--patch-file").or(flag(c, "-p")).unwrap(),
        );
        if c[c.iter().position(|w| w == "patch").unwrap() + 1].starts_with("hyperconverged") {
            assert!(
                c.iter().any(|w| w.contains(".v1beta1.")),
                "{c:?}: the v1beta1 API by name, where the field is spec.networkBinding"
            );
            assert_eq!(forbidden(c, &hyperconverged_cr()), Ok(vec![]), "{c:?}");
            registered[2] = true;
            continue;
        }
        let makes_the_list = kind == "merge" && patch.contains("featureGates");
        for gates in [true, false] {
            let cr = kubevirt_cr(gates);
            match forbidden(c, &cr) {
                Ok(bad) if makes_the_list && gates => assert!(
                    bad.iter()
                        .any(|b| matches!(b, Change::Removed(_) | Change::Replaced(..))),
                    "{c:?} on a CR with gates drops them, so README must say only then: {bad:?}"
                ),
                Ok(bad) => {
                    assert!(
                        bad.is_empty(),
                        "{c:?} (feature gate list: {gates}): {bad:?}"
                    );
                    registered[usize::from(kind == "json" || makes_the_list)] = true;
                }
                Err(e) if kind == "json" && !gates => {
                    assert!(e.contains("doc is missing path"), "{e}");
                    assert!(
                        section.contains("doc is missing path"),
                        "README says how it fails"
                    );
                }
                Err(e) => panic!("{c:?} (feature gate list: {gates}): {e}"),
            }
        }
    }
    assert_eq!(
        registered, [true; 3],
        "the binding, the gate and HyperConverged's binding each registered"
    );
}

/// The check can fail: a JSON patch `add` of `/spec/configuration/network`
/// (what an earlier example did) replaces the cluster's network settings,
/// and a merge patch carrying more than the binding sets that too.
#[test]
fn a_patch_replacing_the_network_object_is_caught() {
    let cr = kubevirt_cr(true);
    let add = shell_words(
        r#"kubectl -n kubevirt patch kubevirt kubevirt --type json -p '[{"op":"add","path":"/spec/configuration/network","value":{"binding":{"macvtap":{"domainAttachmentType":"tap"}}}}]'"#,
    );
    let bad = forbidden(&add, &cr).unwrap();
    for gone in [
        ".spec.configuration.network.defaultNetworkInterface",
        ".spec.configuration.network.binding.passt",
    ] {
        assert!(bad.contains(&Change::Removed(gone.into())), "{bad:?}");
    }
    let more = shell_words(
        r#"kubectl patch kubevirt kubevirt --type merge -p '{"spec":{"configuration":{"network":{"binding":{"macvtap":{"domainAttachmentType":"tap"}},"defaultNetworkInterface":"masquerade"}}}}'"#,
    );
    assert_eq!(
        forbidden(&more, &cr).unwrap(),
        [Change::Replaced(
            ".spec.configuration.network.defaultNetworkInterface".into(),
            json!("masquerade")
        )]
    );
}

#[test]
fn shell_words_follow_readmes_quoting() {
    assert_eq!(
        shell_words(r#"kubectl patch kubevirt kubevirt -p '{"a": 1}' --type "merge""#),
        [
            "kubectl",
            "patch",
            "kubevirt",
            "kubevirt",
            "-p",
            r#"{"a": 1}"#,
            "--type",
            "merge"
        ]
    );
    let text = "x\n```sh\n# kubectl patch kubevirt k --type json -p '[]'\nkubectl -n kubevirt patch kubevirt kubevirt --type merge --patch-file f.yaml\nkubectl get pods\n```\n`kubectl patch kubevirt a --type merge -p x`\n";
    let found = patch_commands(text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(flag(&found[0], "--patch-file"), Some("f.yaml"));
}
