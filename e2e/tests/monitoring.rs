//! The monitoring objects (`manifests/components/monitoring/`, the chart's
//! `monitoring` values) against the real daemon: every metric of ours an
//! alert names (in its expression or its text) is one the daemon's
//! `/metrics` serves, the PodMonitor scrapes the port and path the daemon
//! serves on, and the series the alerts test move as the alerts assume: all
//! devices in use leaves none free, a NIC down makes its devices unhealthy,
//! an invalid config edit is refused until a valid one, a held device whose
//! NIC is deleted cannot be re-created, a failing PodResources fails the
//! reclaim rounds, and a kubelet gone leaves the resource unregistered.
//! Prometheus' engine evaluates the expressions in `alerts.rs` (promtool).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use macvtap_e2e::manifests::{parse_docs, render};
use macvtap_e2e::node::{Node, WAIT};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const PORT: u16 = 9402;
const RESOURCE: &str = "macvtap.network.kubevirt.io/dataplane";
const CONF: &str = r#"[{"name":"dataplane","lowerDevice":"lower0","capacity":2}]"#;
/// A config the daemon refuses: no such mode.
const INVALID_CONF: &str = r#"[{"name":"dataplane","lowerDevice":"lower0","mode":"sideways"}]"#;

fn component() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/components/monitoring")
}

fn object(kind: &str) -> Value {
    let file = match kind {
        "PodMonitor" => "podmonitor.yaml",
        _ => "prometheusrule.yaml",
    };
    let text = std::fs::read_to_string(component().join(file)).unwrap();
    parse_docs(&text).unwrap().remove(0)
}

/// Every word in `text` that is a metric name of ours or a process metric.
fn metric_names(text: &str, into: &mut BTreeSet<String>) {
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
        if word.starts_with("macvtap_") || word.starts_with("process_") {
            into.insert(word.to_string());
        }
    }
}

/// The metric names the PrometheusRule's alerts name, with the alert names.
fn names_in_rules() -> (BTreeSet<String>, Vec<String>) {
    let rule = object("PrometheusRule");
    let mut names = BTreeSet::new();
    let mut alerts = Vec::new();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for r in group["rules"].as_array().unwrap() {
            alerts.push(r["alert"].as_str().unwrap().to_string());
            metric_names(r["expr"].as_str().unwrap(), &mut names);
            for text in r["annotations"].as_object().unwrap().values() {
                metric_names(text.as_str().unwrap(), &mut names);
            }
        }
    }
    (names, alerts)
}

/// The daemon's page, body only.
fn scrape(node: &Node) -> String {
    let resp = test_kubelet::http_get(&node.ns, PORT, "/metrics").unwrap();
    assert!(resp.starts_with("HTTP/1.1 200 "), "{resp}");
    resp[resp.find("\r\n\r\n").unwrap() + 4..].to_string()
}

/// The sample names on a page.
fn sample_names(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect()
}

/// The value of `name{resource=RESOURCE<more>}` on `page`.
fn value(page: &str, name: &str, more: &str) -> Option<f64> {
    let head = format!("{name}{{resource=\"{RESOURCE}\"{more}}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&head))
        .map(|v| v.trim().parse().unwrap())
}

/// The value of the label-less sample `name` on `page`.
fn plain(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .map(|v| v.trim().parse().unwrap())
}

/// The value of `macvtap_dp_reclaim_rounds_total{outcome}` on `page`.
fn rounds(page: &str, outcome: &str) -> f64 {
    let head = format!("macvtap_dp_reclaim_rounds_total{{outcome=\"{outcome}\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&head))
        .map(|v| v.trim().parse().unwrap())
        .unwrap()
}

/// Writes `text` to `path` as a ConfigMap's volume changes: a new file
/// renamed over the old, never half written.
fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Waits until the page says what `ok` wants, returning it.
async fn wait_page(node: &Node, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let end = Instant::now() + WAIT;
    loop {
        let page = scrape(node);
        if ok(&page) {
            return page;
        }
        assert!(
            Instant::now() < end,
            "{what} not on the page within {WAIT:?}:\n{page}\ndaemon log:\n{}",
            node.daemon_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn the_pod_monitor_scrapes_the_daemonsets_metrics_port() {
    let pm = object("PodMonitor");
    let base = render(&component().join("../../base")).unwrap();
    let ds = base.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let pod = &ds["spec"]["template"];
    for (k, v) in pm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&pod["metadata"]["labels"][k], v, "the pods carry {k}");
    }
    assert_eq!(pm["metadata"]["namespace"], ds["metadata"]["namespace"]);
    let endpoint = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["path"], "/metrics");
    let main = pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "macvtap-deviceplugin")
        .unwrap();
    let port = main["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == endpoint["port"])
        .expect("the PodMonitor's port is a named port of the daemon");
    assert!(
        main["args"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == &format!("--metrics-addr=0.0.0.0:{}", port["containerPort"])),
        "the daemon serves /metrics on that port"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_alerts_name_is_on_the_real_daemons_page_and_moves_as_they_assume() {
    let (names, alerts) = names_in_rules();
    assert_eq!(
        alerts,
        [
            "MacvtapDaemonNotScraped",
            "MacvtapRegistrationFailing",
            "MacvtapDevicesExhausted",
            "MacvtapNicUnhealthy",
            "MacvtapReclaimFailing",
            "MacvtapConfigRefused",
            "MacvtapHealFailing",
        ]
    );
    assert!(names.len() >= 10, "{names:?}");

    let mut node = Node::new().unwrap();
    node.start_kubelet().await.unwrap();
    node.start_pod_resources().await.unwrap();
    let addr = format!("--metrics-addr=127.0.0.1:{PORT}");
    let conf_dir = tempfile::tempdir().unwrap();
    let conf_file = conf_dir.path().join("DP_MACVTAP_CONF");
    std::fs::write(&conf_file, CONF).unwrap();
    let conf_arg = format!("--config={}", conf_file.display());
    node.start_device_plugin(CONF, &[&addr, &conf_arg, "--reclaim-interval", "200ms"])
        .unwrap();
    let mut client = node.plugin("dataplane", 2).await.unwrap();
    let page = wait_page(&node, "registered 1", |p| {
        value(p, "macvtap_dp_registered", "") == Some(1.0)
    })
    .await;
    let served = sample_names(&page);
    // A counter's samples are `<family>_total`; the alerts name samples.
    for name in &names {
        assert!(
            served.contains(name),
            "an alert names {name}, which the daemon does not serve:\n{page}"
        );
    }
    assert_eq!(value(&page, "macvtap_dp_devices_free", ""), Some(2.0));
    assert_eq!(
        plain(&page, "macvtap_dp_config_last_reload_successful"),
        Some(1.0),
        "no change yet"
    );

    // Every device in use: none free (MacvtapDevicesExhausted's condition).
    for id in ["dataplaneMvp0", "dataplaneMvp1"] {
        Node::allocate(&mut client, id).await.unwrap();
    }
    node.hold_pod(
        "default",
        "vm",
        RESOURCE,
        &["dataplaneMvp0", "dataplaneMvp1"],
    )
    .unwrap();
    let page = wait_page(&node, "2 in use, 0 free", |p| {
        value(p, "macvtap_dp_devices_in_use", "") == Some(2.0)
            && value(p, "macvtap_dp_devices_free", "") == Some(0.0)
    })
    .await;
    assert_eq!(
        value(&page, "macvtap_dp_devices", ",state=\"healthy\""),
        Some(2.0)
    );

    // The NIC down: its devices unhealthy (MacvtapNicUnhealthy's condition).
    node.ns.ip(&["link", "set", "lower0", "down"]).unwrap();
    wait_page(&node, "2 unhealthy devices", |p| {
        value(p, "macvtap_dp_devices", ",state=\"unhealthy\"") == Some(2.0)
    })
    .await;
    node.ns.ip(&["link", "set", "lower0", "up"]).unwrap();
    wait_page(&node, "no unhealthy devices", |p| {
        value(p, "macvtap_dp_devices", ",state=\"unhealthy\"") == Some(0.0)
    })
    .await;

    // An invalid config edit: refused until a valid one comes
    // (MacvtapConfigRefused's condition).
    replace_file(&conf_file, INVALID_CONF);
    let page = wait_page(&node, "the edit refused", |p| {
        plain(p, "macvtap_dp_config_last_reload_successful") == Some(0.0)
    })
    .await;
    assert_eq!(
        plain(&page, "macvtap_dp_config_reload_errors_total"),
        Some(1.0)
    );
    replace_file(&conf_file, CONF);
    let page = wait_page(&node, "the edit mended", |p| {
        plain(p, "macvtap_dp_config_last_reload_successful") == Some(1.0)
    })
    .await;
    assert_eq!(plain(&page, "macvtap_dp_config_reloads_total"), Some(1.0));

    // The NIC deleted takes the held devices' macvtaps with it, and the
    // rounds cannot make them again (MacvtapHealFailing's condition).
    let page = scrape(&node);
    assert_eq!(plain(&page, "macvtap_dp_heal_errors_total"), Some(0.0));
    assert!(rounds(&page, "done") > 0.0, "{page}");
    node.ns.ip(&["link", "del", "lower0"]).unwrap();
    let page = wait_page(&node, "heal errors rising", |p| {
        plain(p, "macvtap_dp_heal_errors_total").is_some_and(|n| n >= 4.0)
    })
    .await;
    assert_eq!(plain(&page, "macvtap_dp_links_healed_total"), Some(0.0));
    assert!(
        node.daemon_log()
            .contains("and so is its NIC: not re-created"),
        "{}",
        node.daemon_log()
    );

    // PodResources failing: every round fails, none is done
    // (MacvtapReclaimFailing's condition).
    node.pod_resources
        .as_ref()
        .unwrap()
        .fail(Some(test_kubelet::Code::Unavailable));
    let failed_before = rounds(&scrape(&node), "failed");
    let page = wait_page(&node, "failed rounds rising", |p| {
        rounds(p, "failed") >= failed_before + 3.0
    })
    .await;
    let done = rounds(&page, "done");
    let page = wait_page(&node, "more failed rounds", |p| {
        rounds(p, "failed") >= failed_before + 6.0
    })
    .await;
    assert_eq!(rounds(&page, "done"), done, "no round done meanwhile");

    // The kubelet gone: the resource unregistered while it still has
    // devices (MacvtapRegistrationFailing's condition).
    drop(client);
    node.kubelet.take();
    let page = wait_page(&node, "registered 0", |p| {
        value(p, "macvtap_dp_registered", "") == Some(0.0)
    })
    .await;
    let advertised = value(&page, "macvtap_dp_devices", ",state=\"healthy\"").unwrap()
        + value(&page, "macvtap_dp_devices", ",state=\"unhealthy\"").unwrap();
    assert_eq!(advertised, 2.0, "{page}");
    node.stop_device_plugin().unwrap();
}
