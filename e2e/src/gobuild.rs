//! The Go peers built once with Go 1.23 into `target/`, each from its
//! source tarball among the peers: in `$MACVTAP_PEERS_DIR`, or in
//! `../shared/peers/` beside the checkout (outside the repository; see that
//! directory's README). [`MULTUS`] is the real Multus the node e2e runs;
//! [`GO_MACVTAP`] is kubevirt/macvtap-cni v0.13.1, the Go project we
//! replace, whose CNI and device plugin the side-by-side benchmarks and the
//! upgrade e2e run.

use anyhow::{Context, Result, bail, ensure};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The Go 1.23 compiler from Debian's bookworm-backports (`hack/setup.sh`).
pub const GO: &str = "/usr/lib/go-1.23/bin/go";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The environment variable naming the peers directory explicitly.
pub const PEERS_ENV: &str = "MACVTAP_PEERS_DIR";

/// The peers directory beside the checkout: `<workspace root>/../shared/peers`.
pub fn peers_beside_checkout() -> PathBuf {
    let root = workspace().canonicalize().unwrap_or_else(|_| workspace());
    match root.parent() {
        Some(up) => up.join("shared/peers"),
        None => root.join("../shared/peers"),
    }
}

/// One Go peer: where its source tarball is, what it builds and where the
/// binaries are cached.
#[derive(Debug, Clone, Copy)]
pub struct GoPeer {
    /// What messages call it, e.g. "Multus v4.2.2".
    pub what: &'static str,
    /// The tarball's file name among the peers.
    pub tarball: &'static str,
    /// The cache directory under `target/`, one per version.
    pub cache: &'static str,
    /// The `go build` package pattern.
    pub package: &'static str,
    /// The binaries `go build -o <dir>/` leaves for that pattern.
    pub binaries: &'static [&'static str],
    /// Which test or benchmark needs it, for the error when it is missing.
    pub needed_by: &'static str,
}

/// Multus v4.2.2, its thin plugin (`multus`).
pub const MULTUS: GoPeer = GoPeer {
    what: "Multus v4.2.2",
    tarball: "multus-v4.2.2.tar.gz",
    cache: "e2e-multus/v4.2.2",
    package: "./cmd/multus",
    binaries: &["multus"],
    needed_by: "the node e2e runs the real Multus",
};

/// kubevirt/macvtap-cni v0.13.1: `cni` (its `macvtap` CNI) and
/// `deviceplugin` (see `../shared/peers/README.md` for what they expect).
pub const GO_MACVTAP: GoPeer = GoPeer {
    what: "kubevirt/macvtap-cni v0.13.1",
    tarball: "macvtap-cni-v0.13.1.tar.gz",
    cache: "e2e-go-macvtap/v0.13.1",
    package: "./cmd/...",
    binaries: &["cni", "deviceplugin"],
    needed_by: "the side-by-side benchmarks and the upgrade e2e run the Go project we replace",
};

/// The peer's source tarball, from `$MACVTAP_PEERS_DIR` if set and it is
/// there, else from `../shared/peers/` beside the checkout; nowhere else.
/// Fails naming both places when neither has it.
pub fn tarball(peer: &GoPeer) -> Result<PathBuf> {
    find_tarball(peer, std::env::var_os(PEERS_ENV), &peers_beside_checkout())
}

/// [`tarball`] with the environment's peers directory `env_dir` and the
/// directory `beside` the checkout given.
fn find_tarball(peer: &GoPeer, env_dir: Option<OsString>, beside: &Path) -> Result<PathBuf> {
    let name = peer.tarball;
    let from_env = env_dir.map(|d| PathBuf::from(d).join(name));
    let beside = beside.join(name);
    if let Some(p) = from_env.iter().chain([&beside]).find(|p| p.exists()) {
        return Ok(p.clone());
    }
    let env_place = match &from_env {
        Some(p) => format!("${PEERS_ENV} ({})", p.display()),
        None => format!("${PEERS_ENV} (not set)"),
    };
    bail!(
        "the {} source {name} is in neither {env_place} nor ../shared/peers/ beside the \
         checkout ({}): {} and builds it from that tarball; put it in one of them (see \
         ../shared/peers/README.md)",
        peer.what,
        beside.display(),
        peer.needed_by,
    )
}

/// Builds the peer once into `target/<cache>/` and returns the path of each
/// of its binaries, in [`GoPeer::binaries`] order; later calls (any
/// process) reuse them. Fails, saying what is missing, when the source or
/// Go 1.23 is not there.
pub fn build(peer: &GoPeer) -> Result<Vec<PathBuf>> {
    let dir = workspace().join("target").join(peer.cache);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let bins: Vec<PathBuf> = peer.binaries.iter().map(|b| dir.join(b)).collect();
    let lock = std::fs::File::create(dir.join(".lock"))?;
    let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("locking the {} build: {e}", peer.what))?;
    if bins.iter().all(|b| b.exists()) {
        return Ok(bins);
    }
    let src_tar = tarball(peer)?;
    if !Path::new(GO).exists() {
        bail!(
            "{GO} is missing: {} and builds it with Go 1.23; run hack/setup.sh (it installs \
             golang-1.23-go from bookworm-backports)",
            peer.needed_by
        );
    }
    let src = dir.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src)?;
    let t = Instant::now();
    let out = Command::new("tar")
        .arg("-xzf")
        .arg(&src_tar)
        .arg("-C")
        .arg(&src)
        .output()
        .context("running tar")?;
    ensure!(
        out.status.success(),
        "unpacking {}: {}",
        src_tar.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let tmp = dir.join("out.tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    // `-o <dir>/` names each binary after its package's last element.
    let mut out_dir = tmp.clone().into_os_string();
    out_dir.push("/");
    let out = Command::new(GO)
        .args(["build", "-mod=vendor", "-o"])
        .arg(&out_dir)
        .arg(peer.package)
        .current_dir(&src)
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", "")
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .output()
        .context("running go build")?;
    ensure!(
        out.status.success(),
        "building {} failed: {}",
        peer.what,
        String::from_utf8_lossy(&out.stderr)
    );
    for (name, bin) in peer.binaries.iter().zip(&bins) {
        let built = tmp.join(name);
        ensure!(
            built.exists(),
            "building {} left no {name} in {}",
            peer.what,
            tmp.display()
        );
        std::fs::rename(&built, bin)?;
    }
    // The build cache and the source are not needed again.
    let _ = std::fs::remove_dir_all(&tmp);
    let _ = std::fs::remove_dir_all(&src);
    let _ = std::fs::remove_dir_all(dir.join("gocache"));
    let _ = Command::new("chmod")
        .args(["-R", "u+w"])
        .arg(dir.join("gopath"))
        .status();
    let _ = std::fs::remove_dir_all(dir.join("gopath"));
    eprintln!(
        "built {} in {:.1} s into {}",
        peer.what,
        t.elapsed().as_secs_f64(),
        dir.display()
    );
    Ok(bins)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tarball_comes_from_the_env_dir_else_from_beside_the_checkout() {
        let env = tempfile::tempdir().unwrap();
        let beside = tempfile::tempdir().unwrap();
        assert!(MULTUS.tarball.contains(crate::multus::VERSION));
        let name = MULTUS.tarball;
        let err = find_tarball(&MULTUS, None, beside.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("$MACVTAP_PEERS_DIR (not set)"), "{err}");
        assert!(err.contains(&beside.path().display().to_string()), "{err}");
        let err = find_tarball(&MULTUS, Some(env.path().into()), beside.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains(&env.path().display().to_string()), "{err}");
        assert!(err.contains(&beside.path().display().to_string()), "{err}");

        std::fs::write(beside.path().join(name), "").unwrap();
        assert_eq!(
            find_tarball(&MULTUS, Some(env.path().into()), beside.path()).unwrap(),
            beside.path().join(name)
        );
        std::fs::write(env.path().join(name), "").unwrap();
        assert_eq!(
            find_tarball(&MULTUS, Some(env.path().into()), beside.path()).unwrap(),
            env.path().join(name)
        );
        assert_eq!(
            find_tarball(&MULTUS, None, beside.path()).unwrap(),
            beside.path().join(name)
        );
    }
}
