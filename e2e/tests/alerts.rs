//! The PrometheusRule's alerts (`manifests/components/monitoring/`, which
//! the chart renders the same: `chart.rs`) evaluated by the real Prometheus
//! engine: `promtool check rules` and `promtool test rules` (Prometheus
//! v3.16.0, built from its module by `test_support::gopeers`) on the rule's
//! groups and `tests/alerts.yaml`, where each alert has a case in which it
//! fires and one in which it stays quiet. Also: every alert carries a
//! `runbook_url` to its README section, and every metric an expression
//! names is the daemon's or one README says which exporter serves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use macvtap_e2e::manifests::parse_docs;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The metrics the alerts name that the daemon does not serve, and what
/// serves them; README's *Monitoring* says so too.
const OTHER_METRICS: [(&str, &str); 2] = [
    ("up", "Prometheus"),
    (
        "kube_daemonset_status_desired_number_scheduled",
        "kube-state-metrics",
    ),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn component() -> PathBuf {
    root().join("manifests/components/monitoring")
}

/// The PrometheusRule's `spec`: a rules file's `groups`.
fn spec() -> Value {
    let text = std::fs::read_to_string(component().join("prometheusrule.yaml")).unwrap();
    let rule = parse_docs(&text).unwrap().remove(0);
    assert_eq!(rule["kind"], "PrometheusRule");
    rule["spec"].clone()
}

/// Every alerting rule of the PrometheusRule.
fn alerts() -> Vec<Value> {
    spec()["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .collect()
}

/// The unit tests promtool runs.
fn unit_tests() -> Value {
    let text = std::fs::read_to_string(component().join("tests/alerts.yaml")).unwrap();
    parse_docs(&text).unwrap().remove(0)
}

/// The promtool binary, built on first use.
fn promtool() -> PathBuf {
    let bins = test_support::gopeers::build(&test_support::gopeers::PROMTOOL)
        .unwrap_or_else(|e| panic!("{e:#}"));
    bins.into_iter().next().unwrap()
}

/// A directory holding `rules.yaml` (`spec` as a plain rules file) and
/// `alerts.yaml` (`tests`), as the tests' `rule_files` expects.
fn workdir(spec: &Value, tests: &Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let groups = json!({ "groups": spec["groups"] });
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_norway::to_string(&groups).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("alerts.yaml"),
        serde_norway::to_string(tests).unwrap(),
    )
    .unwrap();
    dir
}

/// Runs promtool with `args` in `dir`: whether it passed, and all it said.
fn run_promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[test]
fn promtool_checks_the_rules_and_passes_their_unit_tests() {
    let dir = workdir(&spec(), &unit_tests());
    let (ok, said) = run_promtool(
        dir.path(),
        &["check", "rules", "--lint-fatal", "rules.yaml"],
    );
    assert!(ok, "promtool check rules failed:\n{said}");
    let n = alerts().len();
    assert!(
        said.contains(&format!("SUCCESS: {n} rules found")),
        "{said}"
    );
    let (ok, said) = run_promtool(dir.path(), &["test", "rules", "alerts.yaml"]);
    assert!(ok, "promtool test rules failed:\n{said}");
    assert!(said.contains("SUCCESS"), "{said}");
}

/// Each alert made unable to fire fails its firing case: the cases test
/// the rules promtool was given, and each alert has one that needs it.
#[test]
fn an_alert_that_cannot_fire_fails_its_firing_case() {
    let mut spec = spec();
    for group in spec["groups"].as_array_mut().unwrap() {
        for rule in group["rules"].as_array_mut().unwrap() {
            rule["expr"] = json!("vector(1) < 0");
        }
    }
    let dir = workdir(&spec, &unit_tests());
    let (ok, said) = run_promtool(dir.path(), &["test", "rules", "alerts.yaml"]);
    assert!(!ok, "promtool passed rules that never fire:\n{said}");
    for alert in alerts() {
        let name = alert["alert"].as_str().unwrap();
        assert!(
            said.contains(&format!("alertname: {name},")),
            "no case of {name} failed when it could not fire:\n{said}"
        );
    }
}

/// The alert names the unit tests expect: (firing, quiet), where a case
/// is firing when it expects an alert and quiet when it expects none.
fn cases() -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut firing, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for group in unit_tests()["tests"].as_array().unwrap() {
        for case in group["alert_rule_test"].as_array().unwrap() {
            let name = case["alertname"].as_str().unwrap().to_string();
            match case["exp_alerts"].as_array() {
                Some(exp) if !exp.is_empty() => firing.insert(name),
                _ => quiet.insert(name),
            };
        }
    }
    (firing, quiet)
}

#[test]
fn every_alert_has_a_case_that_fires_and_one_that_stays_quiet() {
    let names: BTreeSet<String> = alerts()
        .iter()
        .map(|a| a["alert"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 7, "{names:?}");
    let (firing, quiet) = cases();
    assert_eq!(firing, names, "alerts with a firing case");
    assert_eq!(quiet, names, "alerts with a quiet case");
}

/// GitHub's anchor of a heading: lower case, punctuation other than `-`
/// and `_` dropped, spaces as `-`.
fn github_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// README's sections by the anchor of their heading, each with its text
/// up to the next heading.
fn readme_sections() -> BTreeMap<String, String> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut sections = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    let mut fenced = false;
    for line in readme.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        let heading = (!fenced && line.starts_with('#'))
            .then(|| line.trim_start_matches('#'))
            .filter(|rest| rest.starts_with(' '));
        if let Some(h) = heading {
            sections.extend(current.take());
            current = Some((github_anchor(h), String::new()));
        } else if let Some((_, text)) = current.as_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    sections.extend(current);
    sections
}

/// The project's repository, from the workspace's `Cargo.toml`.
fn repository() -> String {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("repository = "))
        .unwrap()
        .trim_matches('"')
        .to_string()
}

#[test]
fn github_anchors_are_made_as_github_makes_them() {
    assert_eq!(github_anchor(" MacvtapHealFailing"), "macvtaphealfailing");
    assert_eq!(
        github_anchor(" Serving without `/dev` or `pod-resources`"),
        "serving-without-dev-or-pod-resources"
    );
    assert_eq!(github_anchor(" DRA mode"), "dra-mode");
}

#[test]
fn every_alert_has_a_runbook_in_readme_and_sensible_labels() {
    let sections = readme_sections();
    let base = format!("{}/blob/main/README.md#", repository());
    for alert in alerts() {
        let name = alert["alert"].as_str().unwrap();
        let url = alert["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has no runbook_url"));
        let anchor = url
            .strip_prefix(&base)
            .unwrap_or_else(|| panic!("{name}'s runbook_url {url} is not in {base}..."));
        assert_eq!(
            anchor,
            github_anchor(name),
            "{name}'s runbook is its own section"
        );
        let text = sections
            .get(anchor)
            .unwrap_or_else(|| panic!("README has no section #{anchor} ({name}'s runbook)"));
        for part in ["**What it means.**", "**What to do.**"] {
            assert!(text.contains(part), "README #{anchor} does not say {part}");
        }
        let severity = alert["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["warning", "critical"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        assert!(alert["for"].is_string(), "{name} has no `for`");
        for key in ["summary", "description"] {
            assert!(alert["annotations"][key].is_string(), "{name} has no {key}");
        }
    }
}

/// Words of PromQL that are not metric names.
const KEYWORDS: [&str; 11] = [
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
];

/// The metric names in a PromQL expression: the identifiers outside label
/// matchers (`{...}`), label lists (`by (...)`), strings and durations
/// (`[15m]`) that are no keyword, no function and no aggregation.
fn metrics_in(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    // The last word, to know when a `(` opens a label list.
    let mut last_word = String::new();
    while i < chars.len() {
        let c = chars[i];
        let skip_to = |close: char, from: usize| {
            (from..chars.len())
                .find(|&j| chars[j] == close)
                .map_or(chars.len(), |j| j + 1)
        };
        if c == '{' {
            i = skip_to('}', i);
        } else if c == '[' {
            i = skip_to(']', i);
        } else if c == '"' {
            i = skip_to('"', i + 1);
        } else if c == '(' && KEYWORDS[3..9].contains(&last_word.as_str()) {
            i = skip_to(')', i);
            last_word.clear();
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i])) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let rest: String = chars[i..].iter().collect::<String>();
            let rest = rest.trim_start();
            // A call, or an aggregation whose `by (...)` comes first.
            let called = rest.starts_with('(')
                || ["by", "without"].iter().any(|k| {
                    rest.strip_prefix(k)
                        .is_some_and(|r| r.trim_start().starts_with('('))
                });
            if !called && !KEYWORDS.contains(&word.as_str()) {
                names.insert(word.clone());
            }
            last_word = word;
        } else {
            if !c.is_whitespace() {
                last_word.clear();
            }
            i += 1;
        }
    }
    names
}

#[test]
fn metric_names_are_read_from_promql() {
    let expr = r#"max by (namespace) (kube_x{daemonset="a"}) - (count by (namespace) (up{job=~".+/b"} == 1) or 0 * max by (namespace) (kube_x)) > 0"#;
    assert_eq!(
        metrics_in(expr),
        BTreeSet::from(["kube_x".to_string(), "up".to_string()])
    );
    let expr = r#"increase(m_total{outcome="failed"}[15m]) > 0 unless ignoring (outcome) increase(m_total{outcome="done"}[15m]) > 0"#;
    assert_eq!(metrics_in(expr), BTreeSet::from(["m_total".to_string()]));
    let expr = "a == 0 and on (instance, resource) sum by (instance, resource) (b) > 0";
    assert_eq!(
        metrics_in(expr),
        BTreeSet::from(["a".to_string(), "b".to_string()])
    );
}

/// The daemon's metrics are checked against its page in `monitoring.rs`;
/// any other must be one README's *Monitoring* names with its exporter.
#[test]
fn every_metric_an_alert_names_is_the_daemons_or_a_documented_exporters() {
    let monitoring = readme_sections().remove("monitoring").unwrap();
    let other: BTreeMap<&str, &str> = OTHER_METRICS.into_iter().collect();
    let mut used = BTreeSet::new();
    for alert in alerts() {
        for name in metrics_in(alert["expr"].as_str().unwrap()) {
            if name.starts_with("macvtap_") {
                continue;
            }
            let exporter = other.get(name.as_str()).unwrap_or_else(|| {
                panic!(
                    "{} names {name}, which the daemon does not serve",
                    alert["alert"]
                )
            });
            assert!(
                monitoring.contains(&format!("`{name}`")) && monitoring.contains(exporter),
                "README's Monitoring does not say that {exporter} serves {name}"
            );
            used.insert(name);
        }
    }
    assert_eq!(used.len(), OTHER_METRICS.len(), "{used:?}");
}
