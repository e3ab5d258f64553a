//! The Go programs that the tests, the sandbox and the benchmarks run beside
//! ours, built from the Go module proxy by module path and version: each is
//! a small module under `hack/peers/<name>/` whose committed `go.mod` and
//! `go.sum` pin it (see `hack/peers/README.md`).
//!
//! [`build`] runs the machine's `go` (`GOTOOLCHAIN=local`, which must be at
//! least the module's `go` line) with `-mod=readonly -trimpath` and
//! `CGO_ENABLED=0`, and keeps the binaries in a cache outside the checkout
//! keyed by what it builds (the Go version, `go.mod`, `go.sum`, the package
//! list and the flags), with the module and build caches beside it
//! ([`cache_root`]): the first build on a machine downloads and compiles, a
//! later one (any process, any clone) finds the binaries, and a changed pin
//! builds afresh from the warm caches in seconds.

use anyhow::{Context, Result, anyhow, bail, ensure};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

/// One Go program set: the wrapper module under `hack/peers/` and the
/// packages built from it.
#[derive(Debug, Clone, Copy)]
pub struct GoPeer {
    /// What messages call it, e.g. "Multus v4.2.2 (thin plugin)".
    pub what: &'static str,
    /// The wrapper module's directory under `hack/peers/`.
    pub module: &'static str,
    /// The module it wraps, as `path@version`, which the builder asks the
    /// proxy for when the wrapper has no `go.sum` yet.
    pub wraps: &'static str,
    /// The import paths built; each binary is named after its last element.
    pub packages: &'static [&'static str],
    /// `-ldflags` as the project's own release build sets them (its version
    /// stamp), or empty.
    pub ldflags: &'static str,
    /// Which test or program needs it, for the error when it cannot build.
    pub needed_by: &'static str,
}

/// Multus' version stamp, as its `hack/build-go.sh` sets it.
const MULTUS_LDFLAGS: &str =
    "-X gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus.version=v4.2.2";

/// Multus v4.2.2's thin plugin (`multus`), which the sandbox and the node
/// e2e run.
pub const MULTUS: GoPeer = GoPeer {
    what: "Multus v4.2.2 (thin plugin)",
    module: "multus",
    wraps: "gopkg.in/k8snetworkplumbingwg/multus-cni.v4@v4.2.2",
    packages: &["gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus"],
    ldflags: MULTUS_LDFLAGS,
    needed_by: "the sandbox and the node e2e run the real Multus",
};

/// Multus v4.2.2's thick plugin: `multus-daemon` and `multus-shim`, its
/// recommended deployment.
pub const MULTUS_THICK: GoPeer = GoPeer {
    what: "Multus v4.2.2 (thick plugin)",
    module: "multus",
    wraps: "gopkg.in/k8snetworkplumbingwg/multus-cni.v4@v4.2.2",
    packages: &[
        "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-daemon",
        "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-shim",
    ],
    ldflags: MULTUS_LDFLAGS,
    needed_by: "a node runs Multus thick as its recommended deployment",
};

/// The reference CNI plugins v1.10.0 the tests run, in one directory (see
/// [`cni_plugins_dir`]).
pub const CNI_PLUGINS: GoPeer = GoPeer {
    what: "the reference CNI plugins v1.10.0",
    module: "cni-plugins",
    wraps: "github.com/containernetworking/plugins@v1.10.0",
    packages: &[
        "github.com/containernetworking/plugins/plugins/ipam/dhcp",
        "github.com/containernetworking/plugins/plugins/ipam/host-local",
        "github.com/containernetworking/plugins/plugins/ipam/static",
        "github.com/containernetworking/plugins/plugins/main/bridge",
        "github.com/containernetworking/plugins/plugins/main/loopback",
        "github.com/containernetworking/plugins/plugins/main/macvlan",
        "github.com/containernetworking/plugins/plugins/main/ptp",
        "github.com/containernetworking/plugins/plugins/meta/tuning",
    ],
    // As the plugins' `build_linux.sh` stamps a release.
    ldflags: "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=v1.10.0",
    needed_by: "the IPAM, chained-plugin and Multus tests run the reference plugins",
};

/// kubevirt/macvtap-cni v0.13.1, the Go project's release that names a
/// device's link after its device ID: `cni` and `deviceplugin`.
pub const GO_MACVTAP_V0_13_1: GoPeer = GoPeer {
    what: "kubevirt/macvtap-cni v0.13.1",
    module: "macvtap-cni-v0.13.1",
    wraps: "github.com/kubevirt/macvtap-cni@v0.13.1",
    packages: &[
        "github.com/kubevirt/macvtap-cni/cmd/cni",
        "github.com/kubevirt/macvtap-cni/cmd/deviceplugin",
    ],
    ldflags: "",
    needed_by: "the parity test, the upgrade e2e and the side-by-side benchmarks run the Go \
                project we replace",
};

/// kubevirt/macvtap-cni v0.13.2, the Go project's newest release (its
/// temporary host link is `mvt%012x` of xxhash64(deviceID), as ours).
pub const GO_MACVTAP_V0_13_2: GoPeer = GoPeer {
    what: "kubevirt/macvtap-cni v0.13.2",
    module: "macvtap-cni-v0.13.2",
    wraps: "github.com/kubevirt/macvtap-cni@v0.13.2",
    ..GO_MACVTAP_V0_13_1
};

/// Helm v4.3.2 (`helm`), which the chart tests run to lint the chart and
/// render it as `helm install` would.
pub const HELM: GoPeer = GoPeer {
    what: "Helm v4.3.2",
    module: "helm",
    wraps: "helm.sh/helm/v4@v4.3.2",
    packages: &["helm.sh/helm/v4/cmd/helm"],
    // As Helm's Makefile stamps a release (`helm version` prints it).
    ldflags: "-X helm.sh/helm/v4/internal/version.version=v4.3.2",
    needed_by: "the chart tests lint and render the Helm chart with the real helm",
};

/// kustomize v4.5.7 (`kustomize`), the one kubectl 1.26 bundles, our oldest
/// supported kubectl's: the tests render every kustomization with it and
/// with kubectl 1.37's and require the same objects.
pub const KUSTOMIZE_V4: GoPeer = GoPeer {
    what: "kustomize v4.5.7",
    module: "kustomize-v4",
    wraps: "sigs.k8s.io/kustomize/kustomize/v4@v4.5.7",
    packages: &["sigs.k8s.io/kustomize/kustomize/v4"],
    // As kustomize's release build stamps it (`kustomize version` prints it).
    ldflags: "-X sigs.k8s.io/kustomize/api/provenance.version=kustomize/v4.5.7",
    needed_by: "the kustomize compatibility test renders our kustomizations with the \
                kustomize of kubectl 1.26",
};

/// Prometheus v3.16.0's `promtool` (module version v0.316.0), which the
/// alert tests run to check the PrometheusRule's rules and run their unit
/// tests.
pub const PROMTOOL: GoPeer = GoPeer {
    what: "Prometheus v3.16.0 (promtool)",
    module: "prometheus",
    wraps: "github.com/prometheus/prometheus@v0.316.0",
    packages: &["github.com/prometheus/prometheus/cmd/promtool"],
    // As Prometheus' `.promu.yml` stamps a release (`promtool --version`).
    ldflags: "-X github.com/prometheus/common/version.Version=3.16.0",
    needed_by: "the alert tests check and unit-test the PrometheusRule with the real promtool",
};

/// Bumped when the builder's own way of building changes, so that old
/// cache entries are not reused.
const BUILDER_VERSION: &str = "1";

/// The flags every build uses (part of the cache key).
const BUILD_FLAGS: &[&str] = &["-mod=readonly", "-trimpath"];

/// The environment variable that moves the cache ([`cache_root`]).
pub const CACHE_ENV: &str = "MACVTAP_CACHE_DIR";

/// The environment variable naming a file to which each build appends
/// `<what>\t<seconds>\n`: how `hack/test.sh` reports the builds its tests
/// did, whose own output shows only when a test fails.
pub const TIMES_ENV: &str = "MACVTAP_GO_PEER_TIMES";

/// The workspace root (this crate's parent directory).
fn workspace() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    dir.canonicalize().unwrap_or(dir)
}

/// The persistent cache: `$MACVTAP_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/macvtap-rs`, else `$HOME/.cache/macvtap-rs`. It holds
/// `go-peers/` (built binaries), `go/mod` (`GOMODCACHE`) and `go/build`
/// (`GOCACHE`).
pub fn cache_root() -> Result<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = var(CACHE_ENV) {
        return Ok(dir);
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return Ok(dir.join("macvtap-rs"));
    }
    match var("HOME") {
        Some(home) => Ok(home.join(".cache/macvtap-rs")),
        None => bail!("neither ${CACHE_ENV}, $XDG_CACHE_HOME nor $HOME is set: set one"),
    }
}

/// The wrapper module's directory, `hack/peers/<module>`.
pub fn module_dir(peer: &GoPeer) -> PathBuf {
    workspace().join("hack/peers").join(peer.module)
}

/// The `go` command as the builder runs it: the machine's Go, never a
/// toolchain it would download, without the caller's `GOFLAGS` or
/// workspace, static, with the caches under [`cache_root`].
fn go_command(cache: &Path) -> Command {
    let mut cmd = Command::new("go");
    cmd.env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "")
        .env("GOWORK", "off")
        .env("CGO_ENABLED", "0")
        .env("GOMODCACHE", cache.join("go/mod"))
        .env("GOCACHE", cache.join("go/build"));
    cmd
}

/// Runs `cmd`, failing with `what` and its stderr's last lines.
fn run(mut cmd: Command, what: &str) -> Result<Output> {
    let out = cmd
        .output()
        .with_context(|| format!("{what}: running go (is Go installed and on PATH?)"))?;
    ensure!(
        out.status.success(),
        "{what} failed ({}):\n{}",
        out.status,
        tail(&String::from_utf8_lossy(&out.stderr), 30)
    );
    Ok(out)
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A Go version as numbers: `go1.26.8` or `1.26.8` → `[1, 26, 8]`; a
/// release candidate's suffix (`1.27rc1`) counts as `.0`.
fn version_numbers(v: &str) -> Option<Vec<u64>> {
    let v = v.trim().trim_start_matches("go");
    let mut out = Vec::new();
    for part in v.split('.') {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        out.push(digits.parse().ok()?);
    }
    while out.len() < 3 {
        out.push(0);
    }
    Some(out)
}

/// The `go` line of a go.mod text, e.g. `1.26.8`.
pub fn go_line(go_mod: &str) -> Option<&str> {
    go_mod
        .lines()
        .find_map(|l| l.trim().strip_prefix("go "))
        .map(str::trim)
}

/// Fails unless `have` (as `go env GOVERSION` prints it) is at least `need`
/// (a go.mod's `go` line), saying what to install.
fn check_go_version(have: &str, need: &str, go_mod: &Path) -> Result<()> {
    let (h, n) = (version_numbers(have), version_numbers(need));
    match (h, n) {
        (Some(h), Some(n)) if h >= n => Ok(()),
        (Some(_), Some(_)) => bail!(
            "this machine's Go is {have}, but {} says go {need}: install Go {need} or newer \
             (GOTOOLCHAIN=local: no other toolchain is downloaded)",
            go_mod.display()
        ),
        _ => bail!("cannot compare Go versions {have:?} and {need:?}"),
    }
}

/// The machine's Go version, as `go env GOVERSION` prints it.
pub fn go_version() -> Result<String> {
    let cache = cache_root()?;
    let mut cmd = go_command(&cache);
    cmd.args(["env", "GOVERSION"]);
    let out = run(cmd, "go env GOVERSION")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The binary name `go build -o <dir>/` gives a package: its import path's
/// last element, or the one before when the last is a major version
/// suffix (`.../kustomize/v4` builds `kustomize`).
fn binary_name(package: &str) -> &str {
    let mut parts = package.rsplit('/');
    let last = parts.next().unwrap_or(package);
    let is_major = last
        .strip_prefix('v')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    match parts.next() {
        Some(before) if is_major => before,
        _ => last,
    }
}

/// What a build depends on, hashed into the cache directory's name.
fn cache_key(
    go_version: &str,
    go_mod: &str,
    go_sum: &str,
    packages: &[&str],
    ldflags: &str,
) -> String {
    let mut text = String::new();
    for part in [
        BUILDER_VERSION,
        go_version,
        go_mod,
        go_sum,
        &packages.join(" "),
        &BUILD_FLAGS.join(" "),
        ldflags,
    ] {
        text.push_str(part);
        text.push('\0');
    }
    format!("{:016x}", xxhash_rust::xxh64::xxh64(text.as_bytes(), 0))
}

/// Why a wrapper without `go.sum` cannot build: the proxy's answer for the
/// module it wraps, or, when the proxy serves it, the step that is missing.
fn missing_sum(peer: &GoPeer, cache: &Path, dir: &Path) -> anyhow::Error {
    let mut cmd = go_command(cache);
    cmd.args(["mod", "download", "-json", peer.wraps])
        .current_dir(dir);
    let answer = match cmd.output() {
        Ok(out) => serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|v| v["Error"].as_str().map(str::to_string)),
        Err(e) => Some(format!("running go: {e}")),
    };
    match answer {
        Some(err) => anyhow!(
            "cannot build {}: the Go module proxy does not serve {} (it answered: {}); {}, \
             so those tests are ignored (see {}/go.mod)",
            peer.what,
            peer.wraps,
            err.split_whitespace().collect::<Vec<_>>().join(" "),
            peer.needed_by,
            dir.display()
        ),
        None => anyhow!(
            "cannot build {}: {}/go.sum is missing, but the proxy now serves {}: run \
             `GOTOOLCHAIN=local go mod tidy` there and commit go.sum",
            peer.what,
            dir.display(),
            peer.wraps
        ),
    }
}

/// Builds the peer's packages once and returns each binary's path, in
/// [`GoPeer::packages`] order; later calls (any process) reuse them. Fails
/// with a sentence when Go is missing or too old, the proxy refuses a
/// module, or the build fails.
pub fn build(peer: &GoPeer) -> Result<Vec<PathBuf>> {
    let cache = cache_root()?;
    let dir = module_dir(peer);
    let go_mod_path = dir.join("go.mod");
    let go_mod = std::fs::read_to_string(&go_mod_path)
        .with_context(|| format!("reading {}", go_mod_path.display()))?;
    let need = go_line(&go_mod)
        .ok_or_else(|| anyhow!("{} has no go line", go_mod_path.display()))?
        .to_string();
    let have = go_version().with_context(|| {
        format!(
            "{} needs Go {need} or newer to build {}",
            peer.needed_by, peer.what
        )
    })?;
    check_go_version(&have, &need, &go_mod_path)?;
    let go_sum = match std::fs::read_to_string(dir.join("go.sum")) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(missing_sum(peer, &cache, &dir));
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}/go.sum", dir.display())),
    };
    let key = cache_key(&have, &go_mod, &go_sum, peer.packages, peer.ldflags);
    let peers = cache.join("go-peers");
    std::fs::create_dir_all(&peers).with_context(|| format!("creating {}", peers.display()))?;
    let slug = format!(
        "{}-{}",
        peer.module,
        binary_name(peer.packages.first().copied().unwrap_or("none"))
    );
    let out_dir = peers.join(format!("{slug}-{key}"));
    let bins: Vec<PathBuf> = peer
        .packages
        .iter()
        .map(|p| out_dir.join(binary_name(p)))
        .collect();
    let lock_path = peers.join(format!("{slug}.lock"));
    let _lock = crate::lockfile::flock(&lock_path)?;
    if bins.iter().all(|b| b.exists()) {
        return Ok(bins);
    }
    let tmp = peers.join(format!("{slug}-{key}.tmp"));
    remove_dir(&tmp)?;
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let started = Instant::now();
    let mut cmd = go_command(&cache);
    // `-o <dir>/` names each binary after its package's last element.
    let mut o = tmp.clone().into_os_string();
    o.push("/");
    cmd.arg("build").args(BUILD_FLAGS);
    if !peer.ldflags.is_empty() {
        cmd.arg("-ldflags").arg(peer.ldflags);
    }
    cmd.arg("-o").arg(&o).args(peer.packages).current_dir(&dir);
    run(cmd, &format!("building {} in {}", peer.what, dir.display()))
        .with_context(|| peer.needed_by)?;
    for bin in &bins {
        let built = tmp.join(bin.file_name().unwrap_or_default());
        ensure!(
            built.exists(),
            "building {} left no {} in {}",
            peer.what,
            built.display(),
            tmp.display()
        );
    }
    remove_dir(&out_dir)?;
    std::fs::rename(&tmp, &out_dir)
        .with_context(|| format!("moving {} to {}", tmp.display(), out_dir.display()))?;
    // Builds of earlier pins of the same programs are not needed again.
    if let Ok(entries) = std::fs::read_dir(&peers) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let stale = name.strip_prefix(&format!("{slug}-")).is_some_and(|rest| {
                rest.len() == 16 && rest.bytes().all(|b| b.is_ascii_hexdigit())
            });
            if stale && e.path() != out_dir {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "built {} with {have} in {secs:.1} s into {}",
        peer.what,
        out_dir.display()
    );
    record_time(peer.what, secs);
    Ok(bins)
}

/// Appends a build's time to the file [`TIMES_ENV`] names, if it is set.
/// A report only: a file that cannot be written fails nothing.
fn record_time(what: &str, secs: f64) {
    if let Some(path) = std::env::var_os(TIMES_ENV).filter(|p| !p.is_empty()) {
        let _ = append_time(Path::new(&path), what, secs);
    }
}

/// Appends `<what>\t<seconds>\n` to `path` in one write, so that builds
/// in other test processes can append theirs to the same file.
fn append_time(path: &Path, what: &str, secs: f64) -> std::io::Result<()> {
    use std::io::Write;
    let line = format!("{what}\t{secs:.1}\n");
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(line.as_bytes())
}

/// Removes a directory if it exists.
fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", dir.display())),
    }
}

/// The directory holding the reference CNI plugins ([`CNI_PLUGINS`]),
/// built on first use: what a test puts in `CNI_PATH`.
pub fn cni_plugins_dir() -> Result<PathBuf> {
    let bins = build(&CNI_PLUGINS)?;
    bins.first()
        .and_then(|b| b.parent())
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow!("{} built nothing", CNI_PLUGINS.what))
}

/// One reference CNI plugin's path (`host-local`, `dhcp`, ...), built on
/// first use.
pub fn cni_plugin(name: &str) -> Result<PathBuf> {
    ensure!(
        CNI_PLUGINS.packages.iter().any(|p| binary_name(p) == name),
        "{name} is not among {}",
        CNI_PLUGINS.what
    );
    Ok(cni_plugins_dir()?.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_as_numbers() {
        let p = Path::new("hack/peers/x/go.mod");
        check_go_version("go1.26.8", "1.26.8", p).unwrap();
        check_go_version("go1.26.10", "1.26.8", p).unwrap();
        check_go_version("go1.27rc1", "1.26.8", p).unwrap();
        check_go_version("go1.26.8", "1.23.4", p).unwrap();
        check_go_version("go1.26", "1.26", p).unwrap();
        let err = check_go_version("go1.26.7", "1.26.8", p)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("go1.26.7") && err.contains("install Go 1.26.8 or newer"),
            "{err}"
        );
        assert!(check_go_version("go1.9.1", "1.20", p).is_err());
        assert!(check_go_version("devel", "1.20", p).is_err());
    }

    #[test]
    fn the_go_line_is_read_past_comments() {
        let m = "// go 1.1 in a comment\nmodule a\n\ngo 1.23.4\n\nrequire b v1\n";
        assert_eq!(go_line(m), Some("1.23.4"));
        assert_eq!(go_line("module a\n"), None);
    }

    #[test]
    fn the_cache_key_changes_with_what_is_built() {
        let k = cache_key("go1.26.8", "m", "s", &["a/b"], "");
        assert_eq!(k.len(), 16);
        assert_eq!(k, cache_key("go1.26.8", "m", "s", &["a/b"], ""));
        for other in [
            cache_key("go1.26.9", "m", "s", &["a/b"], ""),
            cache_key("go1.26.8", "m2", "s", &["a/b"], ""),
            cache_key("go1.26.8", "m", "s2", &["a/b"], ""),
            cache_key("go1.26.8", "m", "s", &["a/b", "a/c"], ""),
            cache_key("go1.26.8", "m", "s", &["a/b"], "-X a=b"),
            // The separator keeps parts apart.
            cache_key("go1.26.8", "ms", "", &["a/b"], ""),
        ] {
            assert_ne!(k, other);
        }
    }

    #[test]
    fn every_peer_module_is_in_the_repository_with_its_go_line() {
        for peer in [
            MULTUS,
            MULTUS_THICK,
            CNI_PLUGINS,
            GO_MACVTAP_V0_13_1,
            GO_MACVTAP_V0_13_2,
            HELM,
            KUSTOMIZE_V4,
            PROMTOOL,
        ] {
            let go_mod = std::fs::read_to_string(module_dir(&peer).join("go.mod")).unwrap();
            assert!(go_line(&go_mod).is_some(), "{}", peer.module);
            let (path, version) = peer.wraps.split_once('@').unwrap();
            assert!(
                go_mod.contains(&format!("require {path} {version}"))
                    || go_mod.contains(&format!("\t{path} {version}")),
                "{} does not require {}",
                peer.module,
                peer.wraps
            );
            for p in peer.packages {
                // `go mod tidy` writes a single tool as `tool <path>`.
                assert!(
                    go_mod.contains(&format!("\t{p}\n"))
                        || go_mod.contains(&format!("\ntool {p}\n")),
                    "{} has no tool line for {p}",
                    peer.module
                );
            }
        }
    }

    #[test]
    fn build_times_are_appended_one_line_each() {
        let path = std::env::temp_dir().join(format!("go-peer-times-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        append_time(&path, "Multus v4.2.2 (thin plugin)", 3.24).unwrap();
        append_time(&path, "Helm v4.3.2", 61.0).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            text,
            "Multus v4.2.2 (thin plugin)\t3.2\nHelm v4.3.2\t61.0\n"
        );
    }

    #[test]
    fn binaries_are_named_as_go_build_names_them() {
        assert_eq!(binary_name("helm.sh/helm/v4/cmd/helm"), "helm");
        assert_eq!(
            binary_name("sigs.k8s.io/kustomize/kustomize/v4"),
            "kustomize"
        );
        assert_eq!(binary_name("example.com/tool/v2"), "tool");
        assert_eq!(binary_name("example.com/v2x"), "v2x");
        assert_eq!(binary_name("example.com/x/v"), "v");
        assert_eq!(binary_name("v2"), "v2");
    }

    #[test]
    fn only_plugins_it_builds_are_named() {
        let err = cni_plugin("../../bin/sh").unwrap_err().to_string();
        assert!(err.contains("is not among"), "{err}");
    }
}
