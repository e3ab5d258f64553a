//! What README and SECURITY.md say about the manifests, held to the
//! manifests: SECURITY.md's table of the daemon's API grants is exactly
//! the rules the kustomizations and the chart render.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use macvtap_e2e::manifests::{render, render_chart};
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
    let chart = render_chart(&root().join("charts/macvtap-rs"), &[]).unwrap();
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
    let text = section(security, "## The daemon's access to the API server");
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with('|'))
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
            Grant {
                role: (kind.into(), name),
                group: one(0),
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
    let mut documented = documented_grants(&read("SECURITY.md"));
    documented.sort();
    for (what, docs) in renderings() {
        assert_eq!(
            rendered_grants(&what, &docs),
            documented,
            "{what}: SECURITY.md's table of the daemon's API access is not what it grants"
        );
    }
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
