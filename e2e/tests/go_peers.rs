//! The Go peers build from their tarballs and run: Multus and the Go
//! project we replace (kubevirt/macvtap-cni v0.13.1), whose binaries the
//! side-by-side benchmarks and the upgrade e2e use.

use macvtap_e2e::gobuild::{GO_MACVTAP, MULTUS, build};
use std::process::Command;

#[test]
fn the_go_project_builds_and_its_cni_answers_version() {
    let bins = build(&GO_MACVTAP).unwrap();
    assert_eq!(bins.len(), 2, "{bins:?}");
    let (cni, dp) = (&bins[0], &bins[1]);
    assert!(
        cni.ends_with("cni") && dp.ends_with("deviceplugin"),
        "{bins:?}"
    );
    let out = Command::new(cni)
        .env("CNI_COMMAND", "VERSION")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(
        v["supportedVersions"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "0.4.0")),
        "{stdout}"
    );
    // Started without DP_MACVTAP_CONF, its device plugin refuses to run.
    let out = Command::new(dp).output().unwrap();
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("DP_MACVTAP_CONF"),
        "{out:?}"
    );
}

#[test]
fn multus_builds() {
    let bins = build(&MULTUS).unwrap();
    assert_eq!(bins.len(), 1);
    assert!(bins[0].ends_with("multus") && bins[0].exists(), "{bins:?}");
}
