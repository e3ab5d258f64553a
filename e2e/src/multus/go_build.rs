//! The real Multus built once with Go 1.23 into `target/e2e-multus/`, from
//! its source tarball among the peers: in `$MACVTAP_PEERS_DIR`, or in
//! `../shared/peers/` beside the checkout (outside the repository; see that
//! directory's README).

use super::VERSION;
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

/// The Multus source tarball, from `$MACVTAP_PEERS_DIR` if set and it is
/// there, else from `../shared/peers/` beside the checkout; nowhere else.
/// Fails naming both places when neither has it.
pub fn tarball() -> Result<PathBuf> {
    find_tarball(std::env::var_os(PEERS_ENV), &peers_beside_checkout())
}

/// [`tarball`] with the environment's peers directory `env_dir` and the
/// directory `beside` the checkout given.
fn find_tarball(env_dir: Option<OsString>, beside: &Path) -> Result<PathBuf> {
    let name = format!("multus-{VERSION}.tar.gz");
    let from_env = env_dir.map(|d| PathBuf::from(d).join(&name));
    let beside = beside.join(&name);
    if let Some(p) = from_env.iter().chain([&beside]).find(|p| p.exists()) {
        return Ok(p.clone());
    }
    let env_place = match &from_env {
        Some(p) => format!("${PEERS_ENV} ({})", p.display()),
        None => format!("${PEERS_ENV} (not set)"),
    };
    bail!(
        "the Multus {VERSION} source {name} is in neither {env_place} nor ../shared/peers/ \
         beside the checkout ({}): the node e2e runs the real Multus and builds it from that \
         tarball; put it in one of them (see ../shared/peers/README.md)",
        beside.display()
    )
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
    let src_tar = tarball()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tarball_comes_from_the_env_dir_else_from_beside_the_checkout() {
        let env = tempfile::tempdir().unwrap();
        let beside = tempfile::tempdir().unwrap();
        let name = format!("multus-{VERSION}.tar.gz");
        let err = find_tarball(None, beside.path()).unwrap_err().to_string();
        assert!(err.contains("$MACVTAP_PEERS_DIR (not set)"), "{err}");
        assert!(err.contains(&beside.path().display().to_string()), "{err}");
        let err = find_tarball(Some(env.path().into()), beside.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains(&env.path().display().to_string()), "{err}");
        assert!(err.contains(&beside.path().display().to_string()), "{err}");

        std::fs::write(beside.path().join(&name), "").unwrap();
        assert_eq!(
            find_tarball(Some(env.path().into()), beside.path()).unwrap(),
            beside.path().join(&name)
        );
        std::fs::write(env.path().join(&name), "").unwrap();
        assert_eq!(
            find_tarball(Some(env.path().into()), beside.path()).unwrap(),
            env.path().join(&name)
        );
        assert_eq!(
            find_tarball(None, beside.path()).unwrap(),
            beside.path().join(&name)
        );
    }
}
