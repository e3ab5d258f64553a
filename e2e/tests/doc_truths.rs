//! What README and SECURITY.md say about the manifests, held to the
//! manifests: SECURITY.md's table of the daemon's API grants is exactly
//! the rules the kustomizations and the chart render; README's `doctor`
//! command finds our pod on the chosen node by the DaemonSet's own
//! namespace, selector and container and runs the program the image has;
//! README's migration copies the Go project's ConfigMap (name and key of
//! `e2e/fixtures/`) into the one our DaemonSet mounts, in our namespace;
//! SECURITY.md says how to report a vulnerability, through the repository
//! that `Cargo.toml` names.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use macvtap_e2e::manifests::{render, render_chart_in, shell_words};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(file: &str) -> String {
    std::fs::read_to_string(root().join(file)).unwrap()
}

/// The section of `text` under the heading line `heading`, up to the next
/// heading of the same or a higher level.
fn section(text: &str, heading: &str) -> String {
    let level = heading.split(' ').next().unwrap();
    let body = text
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no heading {heading:?}"))
        .1;
    let mut out = String::new();
    for line in body.lines() {
        let hashes = line.split(' ').next().unwrap_or("");
        if !hashes.is_empty() && hashes.chars().all(|c| c == '#') && hashes.len() <= level.len() {
            break;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Every kustomization under `manifests/` (the base and each overlay) and
/// the chart with its defaults, named.
fn renderings() -> Vec<(String, Vec<Value>)> {
    let manifests = root().join("manifests");
    let mut dirs = vec!["base".to_string()];
    for e in std::fs::read_dir(manifests.join("overlays")).unwrap() {
        dirs.push(format!(
            "overlays/{}",
            e.unwrap().file_name().to_string_lossy()
        ));
    }
    let mut out: Vec<(String, Vec<Value>)> = dirs
        .into_iter()
        .map(|d| {
            let docs = render(&manifests.join(&d)).unwrap_or_else(|e| panic!("{d}: {e:#}"));
            (format!("manifests/{d}"), docs)
        })
        .collect();
    // As README installs it: `--namespace macvtap-system`.
    let chart = render_chart_in(&root().join("charts/macvtap-rs"), "macvtap-system", &[]).unwrap();
    out.push(("the chart".into(), chart));
    out
}

/// One rule of a Role or ClusterRole, as SECURITY.md lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Grant {
    /// `ClusterRole` or `Role`, and its name.
    role: (String, String),
    group: String,
    resource: String,
    /// `None`: any object.
    names: Option<BTreeSet<String>>,
    verbs: BTreeSet<String>,
}

/// The backticked words of a table cell.
fn quoted(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// SECURITY.md's table under *The daemon's access to the API server*.
fn documented_grants(security: &str) -> Vec<Grant> {
    documented_grants_of(security, false)
}

/// The grants SECURITY.md lists for every install, and with `dra` also
/// those its subsection *In DRA mode* adds (`manifests/components/dra`).
fn documented_grants_of(security: &str, dra: bool) -> Vec<Grant> {
    let text = section(security, "## The daemon's access to the API server");
    let mut parts = text.split("\n### ");
    let mut tables = vec![parts.next().unwrap_or_default()];
    if dra {
        tables.push(
            parts
                .find(|p| p.starts_with("In DRA mode"))
                .expect("SECURITY.md has a subsection 'In DRA mode'"),
        );
    }
    let mut out = Vec::new();
    for t in tables {
        out.extend(grants_of_table(t));
    }
    out
}

/// The rows of the first table in `text`, as grants.
fn grants_of_table(text: &str) -> Vec<Grant> {
    let rows: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .collect();
    assert!(!rows.is_empty(), "SECURITY.md lists no grants");
    rows.iter()
        .map(|row| {
            let cells: Vec<&str> = row.trim().trim_matches('|').split('|').collect();
            assert_eq!(cells.len(), 6, "not 6 cells: {row}");
            let one = |i: usize| {
                let q = quoted(cells[i]);
                assert_eq!(q.len(), 1, "one name in {:?}", cells[i]);
                q[0].clone()
            };
            let names = match cells[2].trim() {
                "any" => None,
                _ => Some(quoted(cells[2]).into_iter().collect()),
            };
            let kind = if cells[4].contains("ClusterRole `") {
                "ClusterRole"
            } else if cells[4].contains("Role `") {
                "Role"
            } else {
                panic!("{:?} names no Role or ClusterRole", cells[4])
            };
            let name = cells[4]
                .split(&format!("{kind} `"))
                .nth(1)
                .and_then(|r| r.split('`').next())
                .unwrap()
                .to_string();
            // The core group, "" in a rule, is written `""` (core).
            let group = match one(0).as_str() {
                "\"\"" => String::new(),
                g => g.to_string(),
            };
            Grant {
                role: (kind.into(), name),
                group,
                resource: one(1),
                names,
                verbs: quoted(cells[3]).into_iter().collect(),
            }
        })
        .collect()
}

/// The rules of every Role and ClusterRole in `docs`, each bound to the
/// DaemonSet's service account by a binding of its kind.
fn rendered_grants(what: &str, docs: &[Value]) -> Vec<Grant> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    let mut out = Vec::new();
    for role in docs
        .iter()
        .filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole")
    {
        let kind = role["kind"].as_str().unwrap();
        let name = role["metadata"]["name"].as_str().unwrap();
        let bound = docs.iter().any(|b| {
            b["kind"] == format!("{kind}Binding")
                && b["roleRef"]["kind"] == kind
                && b["roleRef"]["name"] == name
                && b["subjects"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|s| s["kind"] == "ServiceAccount" && s["name"] == "macvtap-cni")
        });
        assert!(
            bound,
            "{what}: {kind} {name} is bound to the DaemonSet's account"
        );
        for rule in role["rules"].as_array().unwrap() {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    let names = rule
                        .get("resourceNames")
                        .map(|n| strings(n).into_iter().collect());
                    out.push(Grant {
                        role: (kind.into(), name.into()),
                        group: group.clone(),
                        resource,
                        names,
                        verbs: strings(&rule["verbs"]).into_iter().collect(),
                    });
                }
            }
        }
    }
    out.sort();
    out
}

#[test]
fn security_md_lists_exactly_the_rbac_grants() {
    let security = read("SECURITY.md");
    let mut documented = documented_grants(&security);
    documented.sort();
    for (what, docs) in renderings() {
        assert_eq!(
            rendered_grants(&what, &docs),
            documented,
            "{what}: SECURITY.md's table of the daemon's API access is not what it grants"
        );
    }
    let mut dra = documented_grants_of(&security, true);
    dra.sort();
    let chart = render_chart_in(
        &root().join("charts/macvtap-rs"),
        "macvtap-system",
        &["front=dra"],
    )
    .unwrap();
    for (what, docs) in [
        ("the base with components/dra", render_with_component("dra")),
        ("the chart with front=dra", chart),
    ] {
        assert_eq!(
            rendered_grants(what, &docs),
            dra,
            "{what}: SECURITY.md's tables of the daemon's API access in DRA mode are not what it grants"
        );
    }
}

/// `manifests/base` with `manifests/components/<component>`, rendered from
/// a kustomization beside them (kustomize takes no absolute paths).
fn render_with_component(component: &str) -> Vec<Value> {
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

#[test]
fn a_grant_missing_from_security_md_is_caught() {
    let security = read("SECURITY.md");
    let row = security
        .lines()
        .find(|l| l.starts_with("| `apps` | `daemonsets` |"))
        .expect("SECURITY.md lists the DaemonSet grant");
    let mut fewer = documented_grants(&security.replace(&format!("{row}\n"), ""));
    fewer.sort();
    let (_, docs) = renderings().remove(0);
    assert_ne!(rendered_grants("base", &docs), fewer);
    let wider = security.replace("`get`, `list`, `watch`", "`get`, `list`");
    let mut wider = documented_grants(&wider);
    wider.sort();
    assert_ne!(rendered_grants("base", &docs), wider);
}

/// The value after `flag` in `words`.
fn flag<'a>(words: &'a [String], flag: &str) -> Option<&'a str> {
    words
        .iter()
        .position(|w| w == flag)
        .and_then(|i| words.get(i + 1))
        .map(String::as_str)
}

/// README's `kubectl ... exec ... doctor` command of its *Doctor*
/// section, continuation lines joined, as words.
fn readme_doctor_command(readme: &str) -> Vec<String> {
    let doctor = section(readme, "### Doctor");
    let block = doctor
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.contains("kubectl") && b.contains(" exec "))
        .expect("README's Doctor section has a kubectl exec block");
    let joined = block.replace("\\\n", " ");
    let line = joined
        .lines()
        .find(|l| l.trim_start().starts_with("kubectl"))
        .unwrap();
    shell_words(line.split(" #").next().unwrap())
}

/// What is wrong with `command` (README's doctor command) for our
/// DaemonSet `ds`: the namespace, the pod's selector and node, the
/// container and the program it runs.
fn doctor_command_problems(command: &[String], ds: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let ns = ds["metadata"]["namespace"].as_str().unwrap();
    if flag(command, "-n") != Some(ns) {
        out.push(format!("exec's namespace is not the DaemonSet's {ns}"));
    }
    let Some(dashes) = command.iter().position(|w| w == "--") else {
        return vec!["no `--` before the program".into()];
    };
    let Some(sub) = command[..dashes].iter().find(|w| w.starts_with("$(")) else {
        out.push("the pod is not looked up on the node (no `$(kubectl get pod ...)`)".into());
        return out;
    };
    let inner = shell_words(sub.trim_start_matches("$(").trim_end_matches(')'));
    if inner.first().map(String::as_str) != Some("kubectl")
        || !inner
            .windows(2)
            .any(|w| w[0] == "get" && (w[1] == "pod" || w[1] == "pods"))
    {
        out.push(format!("{inner:?} does not get pods"));
    }
    if flag(&inner, "-n") != Some(ns) {
        out.push(format!("the pod lookup's namespace is not {ns}"));
    }
    let selector: BTreeSet<(String, String)> = flag(&inner, "-l")
        .unwrap_or("")
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let labels = |v: &Value| -> BTreeSet<(String, String)> {
        v.as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect()
    };
    let match_labels = labels(&ds["spec"]["selector"]["matchLabels"]);
    let pod_labels = labels(&ds["spec"]["template"]["metadata"]["labels"]);
    if selector != match_labels || !selector.is_subset(&pod_labels) {
        out.push(format!(
            "the pod selector {selector:?} is not the DaemonSet's {match_labels:?}"
        ));
    }
    let node = flag(&inner, "--field-selector").unwrap_or("");
    if !node.starts_with("spec.nodeName=") || node.len() == "spec.nodeName=".len() {
        out.push(format!("the pod is not chosen by its node: {node:?}"));
    }
    if flag(&inner, "-o") != Some("name") {
        out.push("the lookup does not print the pod as exec takes it (`-o name`)".into());
    }
    let spec = &ds["spec"]["template"]["spec"];
    let container = flag(command, "-c").unwrap_or("");
    let Some(c) = spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == container)
    else {
        out.push(format!("the DaemonSet has no container {container:?}"));
        return out;
    };
    let program = c["command"][0].as_str().unwrap();
    let run: Vec<&str> = command[dashes + 1..].iter().map(String::as_str).collect();
    if run != [program, "doctor"] {
        out.push(format!(
            "runs {run:?}, but the container's program is {program} (the image has no PATH to find it)"
        ));
    }
    out
}

#[test]
fn readme_doctor_runs_in_our_pod_on_the_chosen_node() {
    let command = readme_doctor_command(&read("README.md"));
    for (what, docs) in renderings() {
        let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
        let wrong = doctor_command_problems(&command, ds);
        assert!(
            wrong.is_empty(),
            "{what}: README's {command:?}:\n{}",
            wrong.join("\n")
        );
        let program = ds["spec"]["template"]["spec"]["containers"][0]["command"][0]
            .as_str()
            .unwrap();
        assert!(
            read("hack/image-rootfs.sh").contains(&format!("\"$root{program}\"")),
            "the image has {program}"
        );
    }
}

#[test]
fn a_doctor_command_on_an_arbitrary_node_is_caught() {
    let (_, docs) = renderings().remove(0);
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let old = shell_words(
        "kubectl -n macvtap-system exec ds/macvtap-cni -c macvtap-deviceplugin -- macvtap-deviceplugin doctor",
    );
    let wrong = doctor_command_problems(&old, ds).join("\n");
    assert!(wrong.contains("not looked up on the node"), "{wrong}");
    let other_label = shell_words(
        r#"kubectl -n macvtap-system exec -c macvtap-deviceplugin "$(kubectl -n macvtap-system get pod -l app=macvtap --field-selector spec.nodeName="$NODE" -o name)" -- macvtap-deviceplugin doctor"#,
    );
    let wrong = doctor_command_problems(&other_label, ds).join("\n");
    assert!(wrong.contains("is not the DaemonSet's"), "{wrong}");
    assert!(
        wrong.contains("the container's program is /macvtap-deviceplugin"),
        "{wrong}"
    );
}

#[test]
fn security_md_says_how_to_report_a_vulnerability() {
    let manifest = read("Cargo.toml");
    let repo = manifest
        .lines()
        .find_map(|l| l.strip_prefix("repository = "))
        .expect("Cargo.toml names the repository")
        .trim_matches('"');
    let security = read("SECURITY.md");
    let text = section(&security, "## Reporting a vulnerability");
    assert!(
        text.contains(&format!("{repo}/security/advisories/new")),
        "private reports through {repo}'s security advisories:\n{text}"
    );
    for needed in ["privately", "version", "reproduce", "acknowledge"] {
        assert!(text.contains(needed), "the section says {needed:?}");
    }
    assert!(
        !text.contains('@'),
        "no e-mail address: the repository's advisories are the channel"
    );
    assert!(
        security.contains("](#reporting-a-vulnerability)"),
        "linked from the top"
    );
}

/// README's migration copies the Go project's ConfigMap (the one the Go
/// DaemonSet's `envFrom` names, with the key of `e2e/fixtures/`, as
/// upstream and cluster-network-addons-operator make it) into the one our
/// DaemonSet mounts, in our namespace, which it applies from our own
/// Namespace file. `cluster/migrations.rs` runs the block on the real node.
#[test]
fn readme_migration_copies_the_go_configmap_into_ours() {
    let readme = read("README.md");
    let upgrade = section(&readme, "### From kubevirt/macvtap-cni");
    let block = upgrade
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the migration has a sh block")
        .replace("\\\n", " ");
    let lines: Vec<Vec<String>> = block
        .lines()
        .map(|l| shell_words(l.split(" #").next().unwrap()))
        .filter(|w| w.first().map(String::as_str) == Some("kubectl"))
        .collect();
    let (_, docs) = renderings().remove(0);
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let ours = ds["metadata"]["namespace"].as_str().unwrap();
    let mounted = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|v| v["configMap"]["name"].as_str())
        .unwrap();
    let ns_file = lines
        .iter()
        .find_map(|w| flag(w, "-f"))
        .expect("the Namespace applied from a file");
    let ns_doc = &macvtap_e2e::manifests::parse_docs(&read(ns_file)).unwrap()[0];
    assert_eq!(ns_doc["kind"], "Namespace");
    assert_eq!(
        ns_doc["metadata"]["name"], ours,
        "{ns_file} is our namespace"
    );

    let create = lines
        .iter()
        .find(|w| {
            w.windows(2)
                .any(|p| p[0] == "create" && p[1] == "configmap")
        })
        .expect("the ConfigMap created");
    assert_eq!(flag(create, "-n"), Some(ours));
    let at = create.iter().position(|w| w == "configmap").unwrap();
    assert_eq!(
        create[at + 1],
        mounted,
        "the ConfigMap our DaemonSet mounts"
    );
    let literal = create
        .iter()
        .find_map(|w| w.strip_prefix("--from-literal="))
        .expect("--from-literal=KEY=...");
    let (key, value) = literal.split_once('=').unwrap();
    let file = ds["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "MACVTAP_CONFIG")
        .and_then(|e| e["value"].as_str())
        .unwrap();
    assert!(
        file.ends_with(&format!("/{key}")),
        "the daemon reads key {key}: {file}"
    );

    let inner = shell_words(value.trim_start_matches("$(").trim_end_matches(')'));
    // The ConfigMap read is the one the Go DaemonSet's envFrom names (CNAO's
    // devicePluginConfig may name another than its own), with our key.
    let go_cm = block
        .lines()
        .find_map(|l| l.trim().strip_prefix("GO_CM="))
        .expect("GO_CM= read from the Go DaemonSet");
    assert!(
        go_cm.contains("get ds macvtap-cni")
            && go_cm.contains("{.spec.template.spec.containers[0].envFrom[0].configMapRef.name}"),
        "{go_cm}"
    );
    let at = inner
        .iter()
        .position(|w| w == "configmap")
        .expect("get configmap");
    assert_eq!(inner[at + 1], "$GO_CM");
    assert_eq!(
        flag(&inner, "-o"),
        Some(format!("jsonpath={{.data.{key}}}").as_str()),
    );
    let go = [
        macvtap_e2e::manifests::go_macvtap("x", "[]").unwrap(),
        macvtap_e2e::manifests::cnao_macvtap("x", "x", "[]").unwrap(),
    ];
    for (cm, ds) in go {
        let reads =
            &ds["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"];
        assert_eq!(reads, &cm["metadata"]["name"]);
        assert!(cm["data"].get(key).is_some(), "{cm} has {key}");
    }
    assert_eq!(
        flag(&inner, "-n"),
        Some("$GO_NS"),
        "from the Go DaemonSet's namespace"
    );
}
