//! The metrics page against the Prometheus Python client's OpenMetrics
//! parser (installed by `hack/setup.sh`), README's metrics table against the
//! page both ways, and the HTTP server's limits.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{DEADLINE, Node, metrics_get};
use macvtap_deviceplugin::operator::http::{self, Endpoints};
use macvtap_deviceplugin::operator::liveness::Liveness;
use macvtap_deviceplugin::operator::metrics::Metrics;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_kubelet::tools::parse_openmetrics;

const R: &str = "macvtap.network.kubevirt.io/eth0";

/// The connection bound README's *Metrics* section gives.
const README_MAX_CONNECTIONS: usize = 32;

/// A page with every metric holding a sample.
fn busy_metrics() -> Metrics {
    let m = Metrics::default();
    m.set_devices(R, 3, 1);
    m.set_devices("macvtap.network.kubevirt.io/bond0", 100, 0);
    m.allocation(R, true, Duration::from_micros(700));
    m.allocation(R, true, Duration::from_millis(4));
    m.allocation(R, false, Duration::from_millis(30));
    m.allocation(R, true, Duration::from_secs(20));
    m.registration(R, true);
    m.registration(R, false);
    m.set_registered(R, true);
    m.handed_out(R, &["eth0Mvp0".to_string()], Instant::now());
    m.leaked_links_removed(2);
    m.links_healed(1);
    m.unhealthy(R, "nic_enslaved");
    m.config_reload(true);
    m.config_reload(false);
    m
}

fn families(v: &Value) -> &Vec<Value> {
    v.as_array().expect("a list of families")
}

fn samples(f: &Value) -> &Vec<Value> {
    f["samples"].as_array().unwrap()
}

fn sample_names(f: &Value) -> Vec<String> {
    samples(f)
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_page_passes_the_openmetrics_parser_and_follows_its_conventions() {
    let page = busy_metrics().render();
    assert!(page.ends_with("# EOF\n"), "{page}");
    let parsed = parse_openmetrics(&page).unwrap_or_else(|e| panic!("{e}\n{page}"));
    let fams = families(&parsed);
    let mut names = Vec::new();
    for f in fams {
        let name = f["name"].as_str().unwrap();
        let kind = f["type"].as_str().unwrap();
        let help = f["help"].as_str().unwrap();
        // A sample the parser could not attach to its declared family
        // becomes a family of type "unknown" with no help.
        assert!(
            ["counter", "gauge", "histogram"].contains(&kind),
            "{name} has type {kind}:\n{page}"
        );
        assert!(
            help.len() > 10 && help.ends_with('.') && !help.ends_with(".."),
            "{name}'s help {help:?} is not a sentence"
        );
        let samples = sample_names(f);
        assert!(!samples.is_empty(), "{name} has no samples:\n{page}");
        match kind {
            "counter" => assert!(
                samples.iter().all(|s| s == &format!("{name}_total")),
                "counter {name}: samples {samples:?} must be {name}_total"
            ),
            "gauge" => assert!(samples.iter().all(|s| s == name), "{name}: {samples:?}"),
            _ => {}
        }
        if name.contains("seconds") {
            assert!(name.ends_with("_seconds"), "{name}: a unit goes last");
        }
        names.push(name.to_string());
    }
    for want in [
        "macvtap_dp_devices",
        "macvtap_dp_devices_in_use",
        "macvtap_dp_devices_free",
        "macvtap_dp_registered",
        "macvtap_dp_allocations",
        "macvtap_dp_allocation_errors",
        "macvtap_dp_allocate_seconds",
        "macvtap_dp_registrations",
        "macvtap_dp_registration_errors",
        "macvtap_dp_leaked_links_removed",
        "macvtap_dp_links_healed",
        "macvtap_dp_config_reloads",
        "macvtap_dp_config_reload_errors",
        "macvtap_dp_build_info",
        "process_cpu_seconds",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing:\n{page}");
    }

    // The histogram: cumulative buckets ending in +Inf == _count, per resource.
    let h = fams
        .iter()
        .find(|f| f["name"] == "macvtap_dp_allocate_seconds")
        .unwrap();
    assert_eq!(h["type"], "histogram");
    let of = |suffix: &str| -> Vec<&Value> {
        samples(h)
            .iter()
            .filter(|s| s["name"] == format!("macvtap_dp_allocate_seconds{suffix}"))
            .filter(|s| s["labels"]["resource"] == R)
            .collect()
    };
    let buckets = of("_bucket");
    let bounds: Vec<f64> = buckets
        .iter()
        .map(|s| s["labels"]["le"].as_str().unwrap().parse().unwrap())
        .collect();
    let mut want_bounds = macvtap_deviceplugin::operator::metrics::ALLOCATE_BUCKETS.to_vec();
    want_bounds.push(f64::INFINITY);
    assert_eq!(bounds, want_bounds);
    let counts: Vec<f64> = buckets
        .iter()
        .map(|s| s["value"].as_f64().unwrap())
        .collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    assert_eq!(buckets.last().unwrap()["value"].as_f64(), Some(4.0));
    assert_eq!(of("_count")[0]["value"].as_f64(), Some(4.0));
    // 0.7 ms, 4 ms and 30 ms fall within 0.05 s; the 20 s one only in +Inf.
    let le = |b: f64| {
        buckets
            .iter()
            .zip(&bounds)
            .find(|(_, x)| **x == b)
            .unwrap_or_else(|| panic!("no le={b}"))
            .0["value"]
            .as_f64()
            .unwrap()
    };
    assert_eq!(
        (le(0.001), le(0.005), le(0.05), le(10.0)),
        (1.0, 2.0, 3.0, 3.0)
    );
    let sum = of("_sum")[0]["value"].as_f64().unwrap();
    assert!((sum - 20.0347).abs() < 1e-9, "{sum}");

    let build = fams
        .iter()
        .find(|f| f["name"] == "macvtap_dp_build_info")
        .unwrap();
    assert_eq!(
        build["samples"][0]["labels"]["version"],
        env!("CARGO_PKG_VERSION")
    );
}

#[test]
fn the_parser_rejects_a_broken_page() {
    // Proves the checks above can fail: OpenMetrics requires `# EOF`, and
    // a counter's sample must be its family name plus `_total`.
    let err = parse_openmetrics("# TYPE x counter\nx_total 1\n").unwrap_err();
    assert!(err.contains("EOF"), "{err}");
    let err = parse_openmetrics("# TYPE x counter\nx 1\n# EOF\n").unwrap_err();
    assert!(err.contains("ValueError"), "{err}");
}

#[test]
fn every_resource_has_all_its_series_from_zero() {
    let m = Metrics::default();
    m.set_devices(R, 2, 0);
    let parsed = parse_openmetrics(&m.render()).unwrap();
    let value = |family: &str, sample: &str, labels: &[(&str, &str)]| -> Option<f64> {
        families(&parsed)
            .iter()
            .find(|f| f["name"] == family)
            .and_then(|f| {
                samples(f).iter().find(|s| {
                    s["name"] == sample && labels.iter().all(|(k, v)| s["labels"][*k] == *v)
                })
            })
            .and_then(|s| s["value"].as_f64())
    };
    let r = ("resource", R);
    for (family, sample, labels) in [
        (
            "macvtap_dp_devices",
            "macvtap_dp_devices",
            vec![r, ("state", "unhealthy")],
        ),
        (
            "macvtap_dp_allocations",
            "macvtap_dp_allocations_total",
            vec![r],
        ),
        (
            "macvtap_dp_devices_in_use",
            "macvtap_dp_devices_in_use",
            vec![r],
        ),
        ("macvtap_dp_registered", "macvtap_dp_registered", vec![r]),
        (
            "macvtap_dp_allocation_errors",
            "macvtap_dp_allocation_errors_total",
            vec![r],
        ),
        (
            "macvtap_dp_allocate_seconds",
            "macvtap_dp_allocate_seconds_count",
            vec![r],
        ),
        (
            "macvtap_dp_registrations",
            "macvtap_dp_registrations_total",
            vec![r],
        ),
        (
            "macvtap_dp_registration_errors",
            "macvtap_dp_registration_errors_total",
            vec![r],
        ),
        (
            "macvtap_dp_unhealthy",
            "macvtap_dp_unhealthy_total",
            vec![r, ("reason", "nic_missing")],
        ),
        (
            "macvtap_dp_unhealthy",
            "macvtap_dp_unhealthy_total",
            vec![r, ("reason", "nic_down")],
        ),
        (
            "macvtap_dp_unhealthy",
            "macvtap_dp_unhealthy_total",
            vec![r, ("reason", "nic_enslaved")],
        ),
        (
            "macvtap_dp_reclaim_rounds",
            "macvtap_dp_reclaim_rounds_total",
            vec![("outcome", "done")],
        ),
        (
            "macvtap_dp_reclaim_rounds",
            "macvtap_dp_reclaim_rounds_total",
            vec![("outcome", "skipped")],
        ),
        (
            "macvtap_dp_reclaim_rounds",
            "macvtap_dp_reclaim_rounds_total",
            vec![("outcome", "failed")],
        ),
        (
            "macvtap_dp_leaked_links_removed",
            "macvtap_dp_leaked_links_removed_total",
            vec![],
        ),
    ] {
        assert_eq!(
            value(family, sample, &labels),
            Some(0.0),
            "{sample} {labels:?}"
        );
    }
    assert_eq!(
        value(
            "macvtap_dp_devices",
            "macvtap_dp_devices",
            &[r, ("state", "healthy")]
        ),
        Some(2.0)
    );
}

/// One row of README's metrics table: the name Prometheus stores, the
/// type, and each label with the values it lists (empty when open).
#[derive(Debug, PartialEq)]
struct Row {
    kind: String,
    labels: BTreeMap<String, BTreeSet<String>>,
}

/// README's metrics table, by metric name.
fn readme_rows() -> BTreeMap<String, Row> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let table = readme
        .split("| metric | type | labels | what it counts |\n| --- | --- | --- | --- |\n")
        .nth(1)
        .expect("README has the metrics table");
    let mut rows = BTreeMap::new();
    for line in table.lines().take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (name, kind, labels) = (cells[1], cells[2], cells[3]);
        let name = name.trim_matches('`').to_string();
        // "`a`, `b` (`x`, `y`: note)": label names outside parentheses,
        // their values inside.
        let mut parsed = BTreeMap::new();
        let mut current: Option<String> = None;
        let mut depth = 0;
        let mut rest = labels;
        while let Some(i) = rest.find(['`', '(', ')']) {
            let c = rest.as_bytes()[i];
            if c == b'(' {
                depth += 1;
                rest = &rest[i + 1..];
            } else if c == b')' {
                depth -= 1;
                rest = &rest[i + 1..];
            } else {
                let end = rest[i + 1..].find('`').unwrap() + i + 1;
                let word = rest[i + 1..end].to_string();
                if depth == 0 {
                    parsed.insert(word.clone(), BTreeSet::new());
                    current = Some(word);
                } else {
                    parsed
                        .get_mut(current.as_ref().unwrap())
                        .unwrap()
                        .insert(word);
                }
                rest = &rest[end + 1..];
            }
        }
        rows.insert(
            name,
            Row {
                kind: kind.to_string(),
                labels: parsed,
            },
        );
    }
    rows
}

/// The page's families as README's rows: counters by their `_total`
/// sample (what Prometheus stores), label values listed for the labels
/// whose values are a fixed set.
fn page_rows(page: &str) -> BTreeMap<String, Row> {
    const FIXED: [&str; 3] = ["state", "reason", "outcome"];
    let parsed = parse_openmetrics(page).unwrap();
    let mut rows = BTreeMap::new();
    for f in families(&parsed) {
        let name = f["name"].as_str().unwrap();
        let kind = f["type"].as_str().unwrap();
        let stored = if kind == "counter" {
            format!("{name}_total")
        } else {
            name.to_string()
        };
        let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for s in samples(f) {
            for (k, v) in s["labels"].as_object().unwrap() {
                let values = labels.entry(k.clone()).or_default();
                if FIXED.contains(&k.as_str()) {
                    values.insert(v.as_str().unwrap().to_string());
                }
            }
        }
        rows.insert(
            stored,
            Row {
                kind: kind.to_string(),
                labels,
            },
        );
    }
    rows
}

#[test]
fn readme_and_the_page_list_the_same_metrics_types_and_labels() {
    let readme = readme_rows();
    let page = page_rows(&busy_metrics().render());
    for (name, row) in &page {
        assert_eq!(
            readme.get(name),
            Some(row),
            "README.md's row of {name} does not match the page"
        );
    }
    for name in readme.keys() {
        assert!(
            page.contains_key(name),
            "README.md lists {name}, the page does not"
        );
    }
}

/// A server on a free port of 127.0.0.1, answering from `metrics` and a
/// loop that beat just now.
fn local_server() -> http::Server {
    let endpoints = Endpoints {
        metrics: Arc::new(Metrics::default()),
        liveness: Arc::new(Liveness::new(Instant::now())),
    };
    http::spawn("127.0.0.1:0".parse().unwrap(), endpoints).unwrap()
}

/// Sends `request` and reads the answer until the server closes.
fn exchange(server: &http::Server, request: &[u8]) -> String {
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    // The server may answer and close before it has read everything.
    let _ = s.write_all(request);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn metrics_are_served_as_openmetrics() {
    let server = local_server();
    let resp = exchange(&server, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
    assert!(
        resp.contains(
            "\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"
        ),
        "{resp}"
    );
    let body = &resp[resp.find("\r\n\r\n").unwrap() + 4..];
    parse_openmetrics(body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    let health = exchange(&server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        health.starts_with("HTTP/1.1 200 OK\r\n") && health.ends_with("\r\n\r\nok\n"),
        "{health}"
    );
    let resp = exchange(&server, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(resp.starts_with("HTTP/1.1 405 "), "{resp}");
}

#[test]
fn an_oversized_request_head_gets_431() {
    let server = local_server();
    let big = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Filler: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let resp = exchange(&server, big.as_bytes());
    assert!(resp.starts_with("HTTP/1.1 431 "), "{resp}");
    // More headers than the limit, fewer than hyper's default of 100.
    let many: String = (0..40).map(|i| format!("X-H{i}: 1\r\n")).collect();
    let resp = exchange(
        &server,
        format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{many}\r\n").as_bytes(),
    );
    assert!(resp.starts_with("HTTP/1.1 431 "), "{resp}");
}

#[test]
fn a_request_body_gets_413() {
    let server = local_server();
    let resp = exchange(
        &server,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
    );
    assert!(resp.starts_with("HTTP/1.1 413 "), "{resp}");
    let resp = exchange(
        &server,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    );
    assert!(resp.starts_with("HTTP/1.1 413 "), "{resp}");
}

#[test]
fn a_client_sending_its_head_one_byte_a_second_is_cut_at_the_timeout() {
    let server = local_server();
    // 60 bytes: a minute at this pace, far beyond the header timeout.
    let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nUser-Agent: slowloris-0000\r\n\r\n";
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut sent = 0;
    let mut answer = Vec::new();
    let closed = loop {
        if sent == head.len() {
            break false;
        }
        if s.write_all(&head[sent..sent + 1]).is_err() {
            break true;
        }
        sent += 1;
        // The pace: one second of waiting for the server between bytes.
        let mut buf = [0u8; 512];
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break true,
        }
    };
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        closed,
        "the server waited for the whole slow head ({sent} bytes)"
    );
    // Cut by the header timeout, not by the connection's whole lifetime.
    let by_header_timeout = http::HEADER_READ_TIMEOUT.as_secs() as usize + 3;
    assert!(
        by_header_timeout < http::CONNECTION_LIFETIME.as_secs() as usize
            && sent <= by_header_timeout,
        "{sent} bytes at one a second were read"
    );
    assert!(!answer.contains(" 200 "), "{answer}");
}

#[test]
fn a_silent_connection_is_closed_at_the_header_timeout() {
    let server = local_server();
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    // Longer than the header timeout, shorter than the connection's
    // lifetime: only the header timeout closes it within this wait.
    assert!(http::HEADER_READ_TIMEOUT < DEADLINE && DEADLINE < http::CONNECTION_LIFETIME);
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut buf = [0u8; 64];
    let n = s
        .read(&mut buf)
        .unwrap_or_else(|e| panic!("the idle connection stayed open: {e}"));
    assert_eq!(n, 0, "{:?}", String::from_utf8_lossy(&buf[..n]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_thousand_idle_connections_neither_keep_a_scrape_out_nor_grow_the_fds() {
    let mut node = Node::new("idle3k");
    node.start_kubelet().await;
    node.start_daemon(
        &[
            "--resource=name=dp,lowerDevice=eth1,capacity=2",
            "--metrics-addr=127.0.0.1:9402",
        ],
        &[],
    );
    let end = Instant::now() + DEADLINE;
    loop {
        match test_kubelet::http_get(&node.ns, common::METRICS_PORT, "/healthz") {
            Ok(r) if r.starts_with("HTTP/1.1 200") => break,
            r => assert!(Instant::now() < end, "no /healthz: {r:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = node.daemon().pid();
    let fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let base = fds();
    // The daemon's client sockets, plus its own short-lived ones (a
    // PodResources call of the reclaim loop, a registration).
    // README says 32 connections; the daemon may hold one more, accepted
    // and waiting for a slot.
    let bound = base + README_MAX_CONNECTIONS + 1 + 4;
    let mut held = Vec::new();
    let mut most = base;
    for _ in 0..30 {
        let batch = node
            .ns
            .run(|| {
                (0..100)
                    .map(|_| {
                        TcpStream::connect_timeout(
                            &([127, 0, 0, 1], common::METRICS_PORT).into(),
                            Duration::from_secs(5),
                        )
                    })
                    .collect::<std::io::Result<Vec<_>>>()
                    .map_err(anyhow::Error::from)
            })
            .unwrap();
        held.extend(batch);
        most = most.max(fds());
    }
    assert_eq!(held.len(), 3000);
    let page = metrics_get(&node.ns, "/metrics");
    most = most.max(fds());
    assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
    assert!(page.contains("macvtap_dp_devices{"), "{page}");
    assert!(
        most <= bound,
        "the daemon held {most} fds with 3000 idle clients (at most {bound}: {base} before)"
    );
    let health = metrics_get(&node.ns, "/healthz");
    assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
}
