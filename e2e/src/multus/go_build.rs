//! The real Multus built once from its source tarball among the peers, with
//! Go 1.23, into `target/e2e-multus/`.

use super::VERSION;
use anyhow::{Context, Result, bail, ensure};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The Go 1.23 compiler from Debian's bookworm-backports (`hack/setup.sh`).
pub const GO: &str = "/usr/lib/go-1.23/bin/go";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where the peer sources live on this machine when the checkout is not
/// beside them (a clone elsewhere, as CI makes one).
const MACHINE_PEERS: &str = "/work/shared/peers";

/// The environment variable naming the peers directory explicitly.
pub const PEERS_ENV: &str = "MACVTAP_PEERS_DIR";

/// The source tarball: in `$MACVTAP_PEERS_DIR`, else in `shared/peers/`
/// beside the repository or beside any directory above it, else in this
/// machine's `/work/shared/peers`. The first candidate is returned (for the
/// error message) when none exists.
pub fn tarball() -> PathBuf {
    let name = format!("multus-{VERSION}.tar.gz");
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(d) = std::env::var(PEERS_ENV) {
        candidates.push(PathBuf::from(d).join(&name));
    }
    let root = workspace().canonicalize().unwrap_or_else(|_| workspace());
    for dir in root.ancestors().skip(1) {
        candidates.push(dir.join("shared/peers").join(&name));
    }
    candidates.push(Path::new(MACHINE_PEERS).join(&name));
    candidates
        .iter()
        .find(|p| p.exists())
        .or(candidates.first())
        .cloned()
        .unwrap_or_else(|| Path::new(MACHINE_PEERS).join(&name))
}

/// Builds Multus once into `target/e2e-multus/<version>/multus` and returns
/// its path; later calls (any process) reuse it. Fails, saying what is
/// missing, when the source or Go 1.23 is not there.
pub fn build() -> Result<PathBuf> {
    let dir = workspace().join("target/e2e-multus").join(VERSION);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let bin = dir.join("multus");
    let lock = std::fs::File::create(dir.join(".lock"))?;
    let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("locking the Multus build: {e}"))?;
    if bin.exists() {
        return Ok(bin);
    }
    let src_tar = tarball();
    if !src_tar.exists() {
        bail!(
            "the Multus {VERSION} source is missing at {} (also looked in shared/peers/ above \
             the repository and in {MACHINE_PEERS}; set {PEERS_ENV} to its directory): the node \
             e2e runs the real Multus and builds it from that tarball (see \
             ../shared/peers/README.md)",
            src_tar.display()
        );
    }
    if !Path::new(GO).exists() {
        bail!(
            "{GO} is missing: the node e2e builds the real Multus {VERSION} with Go 1.23; \
             run hack/setup.sh (it installs golang-1.23-go from bookworm-backports)"
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
    let tmp = dir.join("multus.tmp");
    let out = Command::new(GO)
        .args(["build", "-mod=vendor", "-o"])
        .arg(&tmp)
        .arg("./cmd/multus")
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
        "building Multus {VERSION} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &bin)?;
    // The build cache and the source are not needed again.
    let _ = std::fs::remove_dir_all(&src);
    let _ = std::fs::remove_dir_all(dir.join("gocache"));
    let _ = Command::new("chmod")
        .args(["-R", "u+w"])
        .arg(dir.join("gopath"))
        .status();
    let _ = std::fs::remove_dir_all(dir.join("gopath"));
    eprintln!(
        "built Multus {VERSION} in {:.1} s into {}",
        t.elapsed().as_secs_f64(),
        bin.display()
    );
    Ok(bin)
}
