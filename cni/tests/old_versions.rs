//! CNI 0.1.0 and 0.2.0, which the Go plugin accepted, through the real binary:
//! results in their `ip4`/`ip6` shape, IPAM and `prevResult` converted as the
//! reference library (containernetworking/cni `pkg/types/100`) converts them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use serde_json::json;

#[test]
fn add_and_del_work_in_0_1_0_and_0_2_0() {
    for version in ["0.1.0", "0.2.0"] {
        let sb = Sandbox::new();
        let index = sb.allocate("dataplaneMvp42");
        let conf = netconf(version, "dataplaneMvp42");
        let result = sb.cni("ADD", &conf, &[]).ok().json();
        // No addresses: nothing but the version and DNS (no interfaces in 0.2.0).
        assert_eq!(result, json!({"cniVersion": version, "dns": {}}));
        let link = sb.link(&sb.pod, "net1").expect("net1 is in the pod");
        assert_eq!(link["ifindex"].as_u64(), Some(index as u64), "{version}");

        let mut check = conf.clone();
        check["prevResult"] = result.clone();
        let msg = sb.cni("CHECK", &check, &[]).fails_with(1);
        assert!(msg.contains("CHECK"), "{msg}");

        sb.cni("DEL", &conf, &[]).ok();
        assert!(sb.link(&sb.pod, "net1").is_none(), "{version}");
        let back = sb
            .link(&sb.node, "mvt1d9e32f0b2c5")
            .expect("DEL gave the link back to the host");
        assert_eq!(back["ifindex"].as_u64(), Some(index as u64), "{version}");
    }
}

#[test]
fn host_local_in_0_2_0_prints_ip4_and_lands_on_the_link() {
    test_support::gopeers::cni_plugin("host-local").unwrap();
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp0");
    let data = tempfile::tempdir().unwrap();
    let mut conf = netconf("0.2.0", "eth0Mvp0");
    conf["ipam"] = json!({
        "type": "host-local",
        "dataDir": data.path(),
        "ranges": [[{"subnet": "192.0.2.0/24", "rangeStart": "192.0.2.10",
                     "rangeEnd": "192.0.2.20", "gateway": "192.0.2.1"}]],
        "routes": [{"dst": "198.51.100.0/24"}]
    });
    let r = sb.cni("ADD", &conf, &[]).ok().json();
    assert_eq!(r["cniVersion"], "0.2.0");
    assert!(
        r.get("interfaces").is_none() && r.get("ips").is_none(),
        "{r}"
    );
    assert_eq!(r["ip4"]["ip"], "192.0.2.10/24", "{r}");
    assert_eq!(r["ip4"]["gateway"], "192.0.2.1", "{r}");
    assert_eq!(
        r["ip4"]["routes"],
        json!([{"dst": "198.51.100.0/24"}]),
        "{r}"
    );
    assert!(r.get("ip6").is_none(), "{r}");
    assert!(sb.pod_addrs().contains(&"192.0.2.10/24".to_string()));
    let routes = sb.pod.ip(&["route", "show", "198.51.100.0/24"]).unwrap();
    assert!(routes.contains("via 192.0.2.1 dev net1"), "{routes}");

    sb.cni("DEL", &conf, &[]).ok();
    let lease = data.path().join("dataplane").join("192.0.2.10");
    assert!(!lease.exists(), "DEL released the lease");
}

#[test]
fn a_0_2_0_prev_result_is_converted() {
    let prev = json!({"cniVersion": "0.2.0",
        "ip4": {"ip": "198.51.100.5/24", "gateway": "198.51.100.1",
                "routes": [{"dst": "203.0.113.0/24"}]},
        "dns": {"nameservers": ["198.51.100.53"]}});
    for (version, device) in [("0.2.0", "eth0Mvp1"), ("1.0.0", "eth0Mvp2")] {
        let sb = Sandbox::new();
        sb.allocate(device);
        let mut conf = netconf(version, device);
        conf["prevResult"] = prev.clone();
        let r = sb.cni("ADD", &conf, &[]).ok().json();
        if version == "0.2.0" {
            // Ours adds no address, so the previous result comes out unchanged.
            assert_eq!(r, prev);
        } else {
            assert_eq!(r["interfaces"][0]["name"], "net1", "{r}");
            assert_eq!(r["ips"][0]["address"], "198.51.100.5/24", "{r}");
            assert!(r["ips"][0].get("interface").is_none(), "{r}");
            assert_eq!(r["routes"][0]["dst"], "203.0.113.0/24", "{r}");
            assert_eq!(r["dns"]["nameservers"][0], "198.51.100.53", "{r}");
        }
        sb.cni("DEL", &conf, &[]).ok();
    }
}
