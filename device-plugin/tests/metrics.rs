//! The metrics page against a real exposition-format parser (the Prometheus
//! Python client's, installed by `hack/setup.sh`), and the README against
//! the page.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use macvtap_deviceplugin::metrics::Metrics;
use serde_json::Value;
use std::time::Duration;
use test_kubelet::tools::parse_exposition;

const R: &str = "macvtap.network.kubevirt.io/eth0";

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

fn sample_names(f: &Value) -> Vec<String> {
    f["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_page_passes_the_prometheus_parser_and_follows_its_conventions() {
    let page = busy_metrics().render();
    let parsed = parse_exposition(&page).unwrap_or_else(|e| panic!("{e}\n{page}"));
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
            help.len() > 10 && help.ends_with('.'),
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
            assert!(
                name.ends_with("_seconds") || name.ends_with("_seconds_total"),
                "{name}: a unit goes last"
            );
        }
        names.push(name.to_string());
    }
    for want in [
        "macvtap_dp_devices",
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
    let samples = h["samples"].as_array().unwrap();
    let of = |suffix: &str| -> Vec<&Value> {
        samples
            .iter()
            .filter(|s| s["name"] == format!("macvtap_dp_allocate_seconds{suffix}"))
            .filter(|s| s["labels"]["resource"] == R)
            .collect()
    };
    let buckets = of("_bucket");
    let counts: Vec<f64> = buckets
        .iter()
        .map(|s| s["value"].as_f64().unwrap())
        .collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    let last = buckets.last().unwrap();
    assert_eq!(last["labels"]["le"], "+Inf");
    assert_eq!(last["value"].as_f64(), Some(4.0));
    assert_eq!(of("_count")[0]["value"].as_f64(), Some(4.0));
    // 0.7 ms, 4 ms and 30 ms fall within 0.05 s; the 20 s one only in +Inf.
    let le = |b: &str| {
        buckets
            .iter()
            .find(|s| s["labels"]["le"] == b)
            .unwrap_or_else(|| panic!("no le={b}"))["value"]
            .as_f64()
            .unwrap()
    };
    assert_eq!(
        (le("0.001"), le("0.005"), le("0.05"), le("10")),
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
    // Proves the check above can fail: an unterminated label value.
    let err = parse_exposition("# TYPE x counter\nx_total{a=\"b} 1\n").unwrap_err();
    assert!(err.contains("ValueError"), "{err}");
}

#[test]
fn readme_lists_every_metric() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let parsed = parse_exposition(&busy_metrics().render()).unwrap();
    for f in families(&parsed) {
        let name = f["name"].as_str().unwrap();
        let shown = if f["type"] == "counter" {
            format!("{name}_total")
        } else {
            name.to_string()
        };
        assert!(
            readme.contains(&format!("`{shown}")),
            "README.md does not list the metric {shown}"
        );
    }
}
