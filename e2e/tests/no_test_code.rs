//! No test code ships: the binaries that `cargo build --release` at the
//! workspace root makes, as a user or `hack/sandbox.sh` runs it (no `-p`, no
//! features), hold no test-only string, and no test crate is in their
//! dependency graph as that build resolves it (Cargo unifies features across
//! the whole workspace, so a test crate's feature on a shipped crate would
//! end up in the shipped binary).

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The shipped binaries: (package, binary).
const SHIPPED: [(&str, &str); 2] = [
    ("macvtap-cni", "macvtap"),
    ("macvtap-deviceplugin", "macvtap-deviceplugin"),
];

/// The workspace's test-only crates.
const TEST_CRATES: [&str; 3] = ["test-kubelet", "test-support", "macvtap-e2e"];

/// Strings that only test code has: test-only variables, test hooks' log
/// lines, the test kubelet's and fixtures' names and paths.
const TEST_ONLY_STRINGS: [&str; 12] = [
    "MACVTAP_DP_TEST",
    "test hook",
    "TestKubelet",
    "TestPodResources",
    "FakeApiServer",
    "testkubelet",
    "test-kubelet",
    "test_kubelet",
    "test-support",
    "test_support",
    "MACVTAP_VENV",
    "macvtap-tap-nodes.lock",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace());
    cmd
}

/// Runs `cargo ARGS` at the workspace root and returns its stdout.
fn run_cargo(args: &[&str]) -> Result<String> {
    let out = cargo()
        .args(args)
        .output()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    ensure!(
        out.status.success(),
        "cargo {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// The packages of the workspace, its target directory and its root.
fn workspace_metadata() -> Result<(Vec<String>, PathBuf, PathBuf)> {
    let meta: Value = serde_json::from_str(&run_cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
    ])?)?;
    let members = meta["packages"]
        .as_array()
        .context("cargo metadata lists no packages")?
        .iter()
        .filter_map(|p| p["name"].as_str().map(String::from))
        .collect();
    let target = meta["target_directory"]
        .as_str()
        .context("cargo metadata names no target directory")?;
    let root = meta["workspace_root"]
        .as_str()
        .context("cargo metadata names no workspace root")?;
    Ok((members, PathBuf::from(target), PathBuf::from(root)))
}

/// The packages that depend on `krate` through normal or build edges as a
/// build of the whole workspace resolves features (what a root `cargo
/// build` links).
fn dependents(krate: &str) -> Result<Vec<String>> {
    let tree = run_cargo(&[
        "tree",
        "--workspace",
        "-e",
        "normal,build,features",
        "--invert",
        krate,
        "--prefix",
        "none",
    ])?;
    Ok(tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != krate)
        .map(String::from)
        .collect())
}

/// `bytes` without any occurrence of `needle`.
fn without(bytes: &[u8], needle: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if !needle.is_empty() && bytes[i..].starts_with(needle) {
            i += needle.len();
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// The test-only strings found in `bin`, outside the build's own paths
/// (source and `OUT_DIR` paths in panic locations name the checkout, whose
/// directory name is anybody's choice).
fn test_strings_in(bin: &Path, build_paths: &[PathBuf]) -> Result<Vec<&'static str>> {
    let mut bytes = std::fs::read(bin).with_context(|| format!("reading {}", bin.display()))?;
    for p in build_paths {
        bytes = without(&bytes, p.as_os_str().as_encoded_bytes());
    }
    Ok(TEST_ONLY_STRINGS
        .into_iter()
        .filter(|s| bytes.windows(s.len()).any(|w| w == s.as_bytes()))
        .collect())
}

#[test]
fn a_release_build_at_the_root_ships_no_test_code() -> Result<()> {
    let start = Instant::now();
    let status = cargo()
        .args(["build", "--release"])
        .status()
        .context("running cargo build --release")?;
    ensure!(status.success(), "cargo build --release failed");
    println!(
        "MEASURE cargo build --release at the workspace root: {:.0} s",
        start.elapsed().as_secs_f64()
    );

    let (members, target, root) = workspace_metadata()?;
    let mut found = Vec::new();
    for (_, bin) in SHIPPED {
        let path = target.join("release").join(bin);
        let strings = test_strings_in(&path, &[root.clone(), target.clone()])?;
        println!("{}: test-only strings {strings:?}", path.display());
        if !strings.is_empty() {
            found.push(format!("{} holds {strings:?}", path.display()));
        }
    }
    for krate in TEST_CRATES
        .iter()
        .filter(|k| members.iter().any(|m| m == *k))
    {
        let users = dependents(krate)?;
        println!("{krate} is used by {users:?}");
        for (package, _) in SHIPPED {
            if users.iter().any(|u| u == package) {
                found.push(format!(
                    "{package} depends on {krate} in a workspace build (its dependents: {users:?})"
                ));
            }
        }
    }
    ensure!(found.is_empty(), "test code ships:\n{}", found.join("\n"));
    Ok(())
}
