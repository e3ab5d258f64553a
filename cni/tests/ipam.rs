//! IPAM delegation with the reference plugins (v1.10.0, built from
//! hack/peers/cni-plugins).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use serde_json::{Value, json};
use test_support::sh;

fn require_plugin(name: &str) {
    test_support::gopeers::cni_plugin(name).unwrap();
}

fn leases(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir.join("dataplane"))
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.starts_with("192.0.2.") || n.starts_with("2001:db8"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn host_local_addresses_land_on_the_link_and_are_released() {
    require_plugin("host-local");
    for version in ["0.3.1", "0.4.0", "1.0.0"] {
        let sb = Sandbox::new();
        sb.allocate("eth0Mvp0");
        let data = tempfile::tempdir().unwrap();
        let mut conf = netconf(version, "eth0Mvp0");
        conf["ipam"] = json!({
            "type": "host-local",
            "dataDir": data.path(),
            "ranges": [
                [{"subnet": "192.0.2.0/24", "rangeStart": "192.0.2.10", "rangeEnd": "192.0.2.20", "gateway": "192.0.2.1"}],
                [{"subnet": "2001:db8::/64"}]
            ],
            "routes": [{"dst": "198.51.100.0/24"}]
        });
        let r = sb.cni("ADD", &conf, &[]).ok().json();
        let ips = r["ips"].as_array().unwrap();
        assert_eq!(ips.len(), 2, "{r}");
        assert_eq!(ips[0]["address"], "192.0.2.10/24");
        assert_eq!(ips[0]["interface"], 0);
        assert_eq!(
            ips[0].get("version").is_some(),
            version.starts_with('0'),
            "{version}: {r}"
        );
        assert_eq!(r["routes"][0]["dst"], "198.51.100.0/24");

        let have = sb.pod_addrs();
        assert!(have.contains(&"192.0.2.10/24".to_string()), "{have:?}");
        assert!(have.iter().any(|a| a.starts_with("2001:db8::")), "{have:?}");
        let routes = sb.pod.ip(&["route", "show", "198.51.100.0/24"]).unwrap();
        assert!(
            routes.contains("via 192.0.2.1 dev net1"),
            "gateway of the v4 range: {routes}"
        );
        assert_eq!(leases(data.path()).len(), 2);

        if version != "0.3.1" {
            let mut check = conf.clone();
            check["prevResult"] = r.clone();
            sb.cni("CHECK", &check, &[]).ok();
            sb.pod
                .ip(&["addr", "del", "192.0.2.10/24", "dev", "net1"])
                .unwrap();
            assert!(
                sb.cni("CHECK", &check, &[])
                    .fails_with(106)
                    .contains("192.0.2.10/24")
            );
        }

        sb.cni("DEL", &conf, &[]).ok();
        assert!(
            leases(data.path()).is_empty(),
            "{version}: DEL released the addresses"
        );
        sb.cni("DEL", &conf, &[]).ok();
    }
}

#[test]
fn static_ipam_addresses_and_routes() {
    require_plugin("static");
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    let mut conf = netconf("1.0.0", "eth0Mvp0");
    conf["ipam"] = json!({
        "type": "static",
        "addresses": [{"address": "192.0.2.2/24", "gateway": "192.0.2.1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {"nameservers": ["192.0.2.53"]}
    });
    let r = sb.cni("ADD", &conf, &[]).ok().json();
    assert_eq!(r["ips"][0]["address"], "192.0.2.2/24");
    assert_eq!(r["dns"]["nameservers"][0], "192.0.2.53");
    let routes = sb.pod.ip(&["route", "show", "default"]).unwrap();
    assert!(routes.contains("via 192.0.2.1 dev net1"), "{routes}");
    // The address really works: the peer answers a ping.
    sb.peer
        .ip(&["addr", "add", "192.0.2.1/24", "dev", "peer0"])
        .unwrap();
    sh(&[
        "ip",
        "netns",
        "exec",
        &sb.pod.name,
        "ping",
        "-c",
        "1",
        "-W",
        "5",
        "192.0.2.1",
    ])
    .unwrap();
    sb.cni("DEL", &conf, &[]).ok();
}

#[test]
fn a_missing_ipam_plugin_is_refused_before_touching_anything() {
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    let before = sb.node_links();
    let mut conf = netconf("1.0.0", "eth0Mvp0");
    conf["ipam"] = json!({"type": "no-such-ipam"});
    let msg = sb.cni("ADD", &conf, &[]).fails_with(5);
    assert!(msg.contains("no-such-ipam"), "{msg}");
    assert_eq!(sb.node_links(), before);
}

/// STATUS and GC go to the IPAM plugin (the reference plugins packaged here
/// predate spec 1.1, so a recording plugin stands in for one that has them).
#[test]
fn status_and_gc_are_delegated_to_ipam() {
    let sb = Sandbox::new();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls");
    let plugin = dir.path().join("rec-ipam");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\nin=$(cat)\necho \"$CNI_COMMAND $in\" >> {}\n\
             case \"$in\" in *fail-status*) echo '{{\"cniVersion\":\"1.1.0\",\"code\":50,\"msg\":\"not ready\"}}'; exit 1;; esac\n",
            log.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().display().to_string();
    let mut conf = netconf("1.1.0", "");
    conf["ipam"] = json!({"type": "rec-ipam"});
    sb.cni("STATUS", &conf, &[("CNI_PATH", &path)]).ok();
    conf["cni.dev/attachments"] = json!([{"containerID": "a", "ifname": "net1"}]);
    sb.cni("GC", &conf, &[("CNI_PATH", &path)]).ok();
    let calls = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = calls.lines().collect();
    assert!(lines[0].starts_with("STATUS "), "{calls}");
    assert!(lines[1].starts_with("GC "), "{calls}");
    let gc: Value = serde_json::from_str(&lines[1][3..]).unwrap();
    assert_eq!(gc["cni.dev/valid-attachments"][0]["containerID"], "a");

    conf["ipam"]["fail-status"] = json!(true);
    let msg = sb
        .cni("STATUS", &conf, &[("CNI_PATH", &path)])
        .fails_with(50);
    assert!(msg.contains("not ready"), "{msg}");
}
