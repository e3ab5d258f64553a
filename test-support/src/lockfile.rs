//! An exclusive `flock` on a lock file: how tests and fixtures that share a
//! machine-wide resource (a fixed path, a cache, a build) take turns across
//! processes and threads.

use anyhow::{Context, Result, anyhow};
use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::path::Path;

/// Takes an exclusive `flock` on `path` (created if missing, never
/// truncated), waiting for another holder to let go; the lock lasts as long
/// as the returned value.
pub fn flock(path: &Path) -> Result<Flock<File>> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow!("locking {}: {e}", path.display()))
}
