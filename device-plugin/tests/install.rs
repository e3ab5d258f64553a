//! `macvtap-deviceplugin install-cni`, run as the DaemonSet's init container
//! runs it: refusals, idempotence, and atomic replacement while another
//! process keeps executing the installed binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const BIN: &str = env!("CARGO_BIN_EXE_macvtap-deviceplugin");

fn install(source: &Path, dir: &Path) -> std::process::Output {
    Command::new(BIN)
        .args(["install-cni", "--source"])
        .arg(source)
        .arg("--target-dir")
        .arg(dir)
        .output()
        .unwrap()
}

#[test]
fn install_refuses_a_missing_target_dir() {
    let out = install(Path::new(BIN), Path::new("/nonexistent/opt/cni/bin"));
    assert!(!out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("/nonexistent/opt/cni/bin") && log.contains("mounted"),
        "{log}"
    );
    assert!(!Path::new("/nonexistent").exists(), "nothing was created");
}

#[test]
fn install_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        assert!(install(Path::new("/bin/true"), dir.path()).status.success());
    }
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["macvtap", "macvtap.settings.json"],
        "no temp file left"
    );
    let settings: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("macvtap.settings.json")).unwrap())
            .unwrap();
    assert_eq!(settings["kubeletDir"], "/var/lib/kubelet");
    assert_eq!(settings["podResourcesCheck"], "warn");
    assert_eq!(
        std::fs::read(dir.path().join("macvtap")).unwrap(),
        std::fs::read("/bin/true").unwrap()
    );
    assert!(
        Command::new(dir.path().join("macvtap"))
            .status()
            .unwrap()
            .success()
    );
}

/// Replaces a large binary and a small one in turn, 20 times, while another
/// thread executes the installed file in a loop: every exec must succeed.
#[test]
fn replacing_while_the_binary_runs_never_fails_an_exec() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("macvtap");
    assert!(install(Path::new(BIN), dir.path()).status.success());
    let stop = AtomicBool::new(false);
    let runs = AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                match Command::new(&target)
                    .arg("--version")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                {
                    Ok(st) if st.success() => {}
                    other => failures.lock().unwrap().push(format!("{other:?}")),
                }
                runs.fetch_add(1, Ordering::SeqCst);
            }
        });
        for i in 0..20 {
            let source = if i % 2 == 0 {
                Path::new("/bin/true")
            } else {
                Path::new(BIN)
            };
            let out = install(source, dir.path());
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        stop.store(true, Ordering::SeqCst);
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "failed execs: {failures:?}");
    assert!(
        runs.load(Ordering::SeqCst) >= 20,
        "the binary ran during the replacements"
    );
}
