//! The binary's command line as people and other projects' manifests write
//! it: the Go project's glog flags (its DaemonSet runs
//! `/macvtap-deviceplugin -v 3 -logtostderr` with `DP_MACVTAP_CONF` from
//! its ConfigMap), log levels that are errors, and README's flag table
//! against the flags clap knows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use clap::CommandFactory;
use common::{DEADLINE, Node};
use macvtap_deviceplugin::cli::Args;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_macvtap-deviceplugin");
const DP: &str = "macvtap.network.kubevirt.io/dp";
const COMPAT: &str = "accepted for compatibility with kubevirt/macvtap-cni";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_manifests_command_line_serves_with_one_warning() {
    let mut node = Node::new("goflags");
    node.start_kubelet().await;
    // The harness sets RUST_LOG=macvtap_deviceplugin=debug,info: -v 3 wins
    // and is info.
    node.start_daemon(
        &["-v", "3", "-logtostderr"],
        &[(
            "DP_MACVTAP_CONF",
            r#"[{"name":"dp","lowerDevice":"eth1","capacity":2}]"#,
        )],
    );
    node.kubelet()
        .wait_for_registration(DP, 0, DEADLINE)
        .await
        .unwrap();
    node.kubelet()
        .wait_resource(DP, DEADLINE, |v| v.connected && v.allocatable() == 2)
        .await
        .unwrap();
    let log = node.daemon().log();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains(COMPAT)).collect();
    assert_eq!(warnings.len(), 1, "one warning:\n{log}");
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    assert!(
        warnings[0].contains("-v=3 -logtostderr") && warnings[0].contains("log level info"),
        "{}",
        warnings[0]
    );
    assert!(
        !log.lines().any(|l| l.contains("DEBUG")),
        "-v 3 is info, over RUST_LOG's debug:\n{log}"
    );
}

/// Runs the binary's `install-cni` (quick, no namespace) with `args` before
/// it and `rust_log` as `RUST_LOG`.
fn install_cni(args: &[&str], rust_log: Option<&str>) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .args(["install-cni", "--source", "/bin/true", "--target-dir"])
        .arg(dir.path())
        .env_remove("RUST_LOG");
    if let Some(v) = rust_log {
        cmd.env("RUST_LOG", v);
    }
    cmd.output().unwrap()
}

#[test]
fn glog_flags_in_every_form_go_accepts_start_the_binary() {
    for args in [
        &["-v=2", "--logtostderr"][..],
        &[
            "--v",
            "4",
            "-alsologtostderr=false",
            "-stderrthreshold",
            "INFO",
        ],
        &["-log_dir=/tmp", "-vmodule", "x=1", "-skip_headers"],
    ] {
        let out = install_cni(args, None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {err}");
        assert_eq!(err.matches(COMPAT).count(), 1, "{args:?}: {err}");
    }
    let out = install_cni(&[], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains(COMPAT), "{err}");
    let out = install_cni(&["-v", "three"], None);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid value \"three\" for flag -v"), "{err}");
}

#[test]
fn a_bad_log_level_is_an_error_saying_so() {
    let out = install_cni(&[], Some("infoo"));
    assert_eq!(
        out.status.code(),
        Some(2),
        "a bad RUST_LOG is no silent info"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("RUST_LOG=\"infoo\"") && err.contains("is not a log level"),
        "{err}"
    );
    let out = install_cni(&["--log-level", "loud"], None);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--log-level") && err.contains("\"loud\" is not a log level"),
        "{err}"
    );
    // A flag decides, so a bad RUST_LOG is not read.
    let out = install_cni(&["--log-level=warn"], Some("infoo"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = install_cni(&["--log-level=error"], None);
    assert!(out.status.success());
    assert!(
        out.stderr.is_empty(),
        "install-cni's info lines are below error"
    );
}

/// README's table under `### Flags`: `| \`--flag ...\` | default | meaning |`.
fn readme_flags() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let table = readme
        .split("\n### Flags\n")
        .nth(1)
        .expect("README has a section 'Flags'");
    table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| {
            let cells: Vec<&str> = row.split(" | ").collect();
            let flag = cells[0]
                .trim_start_matches("| `")
                .split([' ', '`'])
                .next()
                .unwrap();
            (flag.to_string(), cells[1].trim_matches('`').to_string())
        })
        .collect()
}

#[test]
fn readme_documents_every_daemon_flag_and_its_default() {
    let documented = readme_flags();
    let command = Args::command();
    let mut flags = Vec::new();
    for a in command.get_arguments() {
        let Some(long) = a.get_long() else { continue };
        if ["help", "version"].contains(&long) {
            continue;
        }
        let name = format!("--{long}");
        flags.push(name.clone());
        let row = documented
            .iter()
            .find(|(f, _)| *f == name)
            .unwrap_or_else(|| panic!("README's flag table has no row for {name}"));
        if let Some(default) = a.get_default_values().first() {
            assert_eq!(
                row.1,
                default.to_string_lossy(),
                "README's default of {name}"
            );
        }
    }
    for (f, _) in &documented {
        assert!(
            flags.contains(f) || f.starts_with("-v"),
            "README documents {f}, which the daemon does not have"
        );
    }
    let metrics = documented
        .iter()
        .find(|(f, _)| f == "--metrics-addr")
        .unwrap();
    assert_eq!(metrics.1, "0.0.0.0:9402", "the stated default");
}
