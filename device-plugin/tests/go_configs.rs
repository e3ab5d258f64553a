//! Every `DP_MACVTAP_CONF` the Go device plugin started with starts here:
//! questionable entries are served as Go served them, with a warning naming
//! the entry, and entries that cannot work are left out with an error naming
//! the entry. What Go's `json.Unmarshal` refused (the Go plugin exited) is a
//! startup error, as are bad entries in our own sources (flags, config file).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{DEADLINE, Node};

fn run_once(args: &[&str], env: Option<&str>) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_macvtap-deviceplugin"));
    cmd.args([
        "--kubelet-dir",
        dir.path().to_str().unwrap(),
        "--metrics-addr",
        "off",
    ])
    .args(args)
    .env_remove("DP_MACVTAP_CONF");
    if let Some(conf) = env {
        cmd.env("DP_MACVTAP_CONF", conf);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn what_go_could_not_decode_and_bad_entries_of_our_sources_are_startup_errors() {
    // No namespace needed: the daemon checks its configuration first.
    for conf in [
        r#"{"name":"a"}"#,
        r#"[{"name":"a","capacity":"10"}]"#,
        r#"[{"name":"a","capacity":1.5}]"#,
        r#"[{"name":5}]"#,
        r#"["eth0"]"#,
    ] {
        let (ok, err) = run_once(&[], Some(conf));
        assert!(!ok, "{conf}: should fail; log: {err}");
        assert!(
            err.contains("DP_MACVTAP_CONF") && err.contains("not a JSON array"),
            "{conf}: the source is named: {err}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("conf.json");
    std::fs::write(&file, r#"[{"name":"a"},{"name":"b","mode":"source"}]"#).unwrap();
    let (ok, err) = run_once(&[&format!("--config={}", file.display())], None);
    assert!(!ok, "{err}");
    assert!(
        err.contains(&format!("config file {}", file.display()))
            && err.contains("entry 1 (\"b\")")
            && err.contains("unknown macvtap mode"),
        "{err}"
    );
    let (ok, err) = run_once(&["--resource", "name=x,mode=bogus"], None);
    assert!(!ok && err.contains("--resource flags"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_config_with_questionable_and_broken_entries_starts() {
    let mut node = Node::new("goconf");
    node.start_kubelet().await;
    node.ns
        .ip(&[
            "link", "add", "eth2", "type", "veth", "peer", "name", "eth2p",
        ])
        .unwrap();
    node.ns.ip(&["link", "set", "eth2", "up"]).unwrap();
    // As Go's encoding/json read it: keys in any case, unknown keys (with a
    // warning) and a null value ignored, the last "dp" entry wins; "bad",
    // "x/y", the null entry and "x:y" cannot work (Go failed every Allocate
    // or registration). "x:y" is the one that would reach the kubelet if let
    // through ("x/y" fails earlier, at its socket's path), to be refused there.
    let conf = r#"[
        {"NAME": "dp", "lowerDevice": "eth2", "colour": "red"},
        {"name": "bad", "lowerDevice": "eth1", "mode": "source"},
        {"Name": "dp", "LowerDevice": "eth1", "Capacity": 10001, "mode": null},
        {"name": "x/y", "lowerDevice": "eth1"},
        null,
        {"name": "x:y", "lowerDevice": "eth1"},
        {"name": "ok", "lowerDevice": "eth1", "capacity": 2}
    ]"#;
    node.start_daemon(&[], &[("DP_MACVTAP_CONF", conf)]);
    let k = node.kubelet();
    let dp = k
        .wait_resource("macvtap.network.kubevirt.io/dp", DEADLINE, |v| {
            v.connected && v.devices.len() == 10_001
        })
        .await
        .unwrap();
    assert_eq!(dp.allocatable(), 10_001, "eth1 is up: all healthy");
    k.wait_for_registration("macvtap.network.kubevirt.io/ok", 0, DEADLINE)
        .await
        .unwrap();
    // The device of the winning entry is made on its NIC, eth1.
    let resp = k
        .allocate("macvtap.network.kubevirt.io/dp", &["dpMvp10000"])
        .await
        .unwrap();
    assert_eq!(resp.container_responses[0].devices.len(), 1);
    let link = node
        .ns
        .link(&macvtap_link::link_name_for_device("dpMvp10000"))
        .unwrap()
        .expect("the device's macvtap exists");
    let eth1 = node.ns.link("eth1").unwrap().unwrap();
    assert_eq!(link.lower_index, Some(eth1.index));

    // The refused entries never reach the kubelet: not accepted ("bad"
    // would be), not refused ("x:y" would be: no extended resource name).
    let refusals = k.refusals();
    assert!(refusals.is_empty(), "{refusals:?}");
    let names: Vec<String> = k
        .registrations()
        .iter()
        .map(|r| r.resource_name.clone())
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n.ends_with("/bad") || n.ends_with("/x/y") || n.ends_with("/x:y")),
        "{names:?}"
    );
    let log = node.daemon().log();
    let line_with = |a: &str, b: &str| log.lines().any(|l| l.contains(a) && l.contains(b));
    assert!(
        line_with(
            "WARN",
            "entry 2 (\"dp\"): the resource name is used by an earlier entry"
        ),
        "{log}"
    );
    assert!(
        line_with("WARN", "entry 2 (\"dp\"): capacity 10001 is above 10000"),
        "{log}"
    );
    assert!(
        line_with("WARN", "entry 0 (\"dp\"): unknown key \"colour\" ignored"),
        "{log}"
    );
    for (entry, why) in [
        ("entry 1 (\"bad\")", "unknown macvtap mode"),
        ("entry 3 (\"x/y\")", "not a valid resource name"),
        ("entry 4 (\"\")", "name is empty"),
        ("entry 5 (\"x:y\")", "not a valid resource name"),
    ] {
        assert!(
            log.lines().any(|l| l.contains("ERROR")
                && l.contains(&format!("DP_MACVTAP_CONF: {entry}: "))
                && l.contains(why)),
            "{entry}: {log}"
        );
    }
}
