//! `macvtap-deviceplugin install-cni`: copies the CNI binary into the host's
//! CNI bin dir, atomically.
//!
//! It is a subcommand of the daemon's binary rather than a script because
//! the image has no shell or `cp` (a distroless base), and one binary keeps
//! the image small. The copy goes to a temporary file in the target dir,
//! is fsynced, then renamed over the old binary, so a runtime executing the
//! plugin during an upgrade sees either the whole old file or the whole new
//! one, never a partial file, and never `ETXTBSY`.
//!
//! Every run leaves its mark on what it installs, changed or not (a new
//! file, or a `chmod` of the same one, moves the file's change time):
//! a daemon remembers the marks ([`CniStamps`]) as it starts, and its
//! uninstall leaves the files to another install that ran since (our
//! DaemonSet applied in another namespace). Runs and that clean-up take
//! turns on the directory ([`lock_dir`]).

use crate::error::{Error, Result};
use macvtap_link::{CNI_SETTINGS_FILE, NodeSettingsFile, PodResourcesCheck};
use nix::fcntl::{Flock, FlockArg};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};
use tracing::info;

/// How long an install or a clean-up waits for the other to be done with
/// the CNI bin dir (each holds it for a copy or a compare of a few MiB).
pub const DIR_LOCK_WAIT: Duration = Duration::from_secs(30);

/// What an install did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// The target was missing or different and now holds the source.
    Replaced,
    /// The target already had exactly the source's bytes.
    Unchanged,
}

/// What install-cni did to one file, as a later run changes it: the
/// file's device, inode and change time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
}

impl FileStamp {
    /// The stamp of `path` itself (a link is not followed), if it exists.
    fn read(path: &Path) -> Option<Self> {
        let m = std::fs::symlink_metadata(path).ok()?;
        Some(Self {
            dev: m.dev(),
            ino: m.ino(),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// The stamps of the CNI binary and its node settings in a CNI bin dir:
/// read by the daemon as it starts, they tell its uninstall whether an
/// install-cni ran since.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CniStamps {
    /// The binary's, if there was one.
    pub binary: Option<FileStamp>,
    /// The settings file's, if there was one.
    pub settings: Option<FileStamp>,
}

impl CniStamps {
    /// Reads the stamps of `dir/name` and `dir/macvtap.settings.json`.
    pub fn read(dir: &Path, name: &str) -> Self {
        Self {
            binary: FileStamp::read(&dir.join(name)),
            settings: FileStamp::read(&dir.join(CNI_SETTINGS_FILE)),
        }
    }

    /// Whether a file present now was installed (or marked by an
    /// install) after `self` was read: another install uses it.
    pub fn installed_since(&self, now: &CniStamps) -> bool {
        let changed =
            |then: Option<FileStamp>, now: Option<FileStamp>| now.is_some_and(|n| then != Some(n));
        changed(self.binary, now.binary) || changed(self.settings, now.settings)
    }
}

/// Locks `dir` (an exclusive `flock` on the directory itself, which every
/// pod that mounts it shares) against another install-cni and an
/// uninstall's clean-up, waiting up to `wait` for the holder.
pub fn lock_dir(dir: OwnedFd, wait: Duration) -> std::io::Result<Flock<OwnedFd>> {
    let deadline = Instant::now() + wait;
    let mut fd = dir;
    loop {
        match try_lock(fd)? {
            Ok(lock) => return Ok(lock),
            Err(back) if Instant::now() < deadline => {
                fd = back;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "another install or clean-up held it for {} s",
                        wait.as_secs()
                    ),
                ));
            }
        }
    }
}

/// One try at an exclusive `flock` on `fd`, without waiting: the lock, or
/// `fd` back while another open file holds it; any other failure is an
/// error.
pub(crate) fn try_lock(fd: OwnedFd) -> std::io::Result<Result<Flock<OwnedFd>, OwnedFd>> {
    match Flock::lock(fd, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Ok(lock)),
        Err((back, nix::errno::Errno::EWOULDBLOCK)) => Ok(Err(back)),
        Err((_, e)) => Err(std::io::Error::from(e)),
    }
}

/// Installs the CNI binary and its node settings ([`install_cni`], then
/// [`install_settings`]) with the target dir locked ([`lock_dir`]).
pub fn install(
    source: &Path,
    target_dir: &Path,
    name: &str,
    kubelet_dir: &Path,
    check: PodResourcesCheck,
) -> Result<()> {
    let dir = File::open(target_dir).map_err(|e| Error::Install {
        target_dir: target_dir.to_path_buf(),
        msg: format!(
            "it does not exist or cannot be read ({e}); is the host's CNI bin dir mounted there?"
        ),
    })?;
    let _lock = lock_dir(OwnedFd::from(dir), DIR_LOCK_WAIT).map_err(|e| Error::Install {
        target_dir: target_dir.to_path_buf(),
        msg: format!("locking it: {e}"),
    })?;
    install_cni(source, target_dir, name)?;
    install_settings(target_dir, kubelet_dir, check)?;
    Ok(())
}

/// Installs `source` as `target_dir/name` (mode 0755). Refuses a target dir
/// that does not exist: that is a missing hostPath mount, not something to
/// create.
pub fn install_cni(source: &Path, target_dir: &Path, name: &str) -> Result<Installed> {
    let err = |msg: String| Error::Install {
        target_dir: target_dir.to_path_buf(),
        msg,
    };
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(err(format!("{name:?} is not a plain file name")));
    }
    let bytes =
        std::fs::read(source).map_err(|e| err(format!("reading {}: {e}", source.display())))?;
    let done = install_bytes(target_dir, name, &bytes, 0o755)?;
    let target = target_dir.join(name);
    match done {
        Installed::Unchanged => info!(target = %target.display(), "CNI binary already up to date"),
        Installed::Replaced => {
            info!(source = %source.display(), target = %target.display(), bytes = bytes.len(), "installed the CNI binary")
        }
    }
    Ok(done)
}

/// Writes the CNI's node settings file ([`NodeSettingsFile`]) beside the
/// installed binary (`target_dir/macvtap.settings.json`, mode 0644),
/// atomically: the kubelet's root dir as the node sees it, and what ADD does
/// when the kubelet's PodResources API cannot be asked (`warn` or `enforce`).
pub fn install_settings(
    target_dir: &Path,
    kubelet_dir: &Path,
    check: PodResourcesCheck,
) -> Result<Installed> {
    let settings = NodeSettingsFile {
        kubelet_dir: Some(kubelet_dir.to_path_buf()),
        pod_resources_check: Some(check),
        log_dir: None,
    };
    let text = settings.to_json().map_err(|e| Error::Install {
        target_dir: target_dir.to_path_buf(),
        msg: format!("the CNI's node settings cannot be written: {e}"),
    })?;
    let done = install_bytes(target_dir, CNI_SETTINGS_FILE, text.as_bytes(), 0o644)?;
    info!(
        target = %target_dir.join(CNI_SETTINGS_FILE).display(),
        kubelet_dir = %kubelet_dir.display(),
        pod_resources_check = check.as_str(),
        "CNI node settings in place"
    );
    Ok(done)
}

/// Puts `bytes` at `target_dir/name` with `mode`: a temp file in the same
/// dir, fsync, rename, fsync of the dir. Refuses a target dir that does not
/// exist (a missing hostPath mount, not something to create).
fn install_bytes(target_dir: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<Installed> {
    let err = |msg: String| Error::Install {
        target_dir: target_dir.to_path_buf(),
        msg,
    };
    match std::fs::metadata(target_dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(err("it is not a directory".into())),
        Err(e) => {
            return Err(err(format!(
                "it does not exist or cannot be read ({e}); is the host's CNI bin dir mounted there?"
            )));
        }
    }
    let target = target_dir.join(name);
    if std::fs::read(&target).is_ok_and(|old| old == bytes) {
        // The chmod, needed or not, also marks the file as installed now
        // (its change time moves): see [`CniStamps`].
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
            .map_err(|e| err(format!("chmod {}: {e}", target.display())))?;
        return Ok(Installed::Unchanged);
    }
    let tmp = target_dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = write_synced(&tmp, bytes, mode)
        .and_then(|()| std::fs::rename(&tmp, &target))
        .and_then(|()| File::open(target_dir)?.sync_all());
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(format!("writing {}: {e}", target.display())));
    }
    Ok(Installed::Replaced)
}

fn write_synced(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    f.write_all(bytes)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_then_reports_unchanged() {
        let src_dir = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let src = src_dir.path().join("macvtap");
        std::fs::write(&src, b"#!/bin/sh\nexit 0\n").unwrap();
        assert_eq!(
            install_cni(&src, dst.path(), "macvtap").unwrap(),
            Installed::Replaced
        );
        assert_eq!(
            install_cni(&src, dst.path(), "macvtap").unwrap(),
            Installed::Unchanged
        );
        let m = std::fs::metadata(dst.path().join("macvtap")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o755);
        let leftovers: Vec<_> = std::fs::read_dir(dst.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temp file left");
    }

    /// Waits until the kernel's (coarse) clock for change times has moved
    /// past `path`'s change time, so that a new change is seen as one.
    fn wait_for_a_later_ctime(path: &Path) {
        let then = std::fs::metadata(path).unwrap();
        let probe = path.with_extension("probe");
        loop {
            std::fs::write(&probe, b"").unwrap();
            let now = std::fs::metadata(&probe).unwrap();
            if (now.ctime(), now.ctime_nsec()) > (then.ctime(), then.ctime_nsec()) {
                break;
            }
        }
        std::fs::remove_file(&probe).unwrap();
    }

    #[test]
    fn every_run_marks_what_it_installs_changed_or_not() {
        let src_dir = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let src = src_dir.path().join("macvtap");
        std::fs::write(&src, b"the CNI").unwrap();
        let run = || {
            install(
                &src,
                dst.path(),
                "macvtap",
                Path::new("/var/lib/kubelet"),
                PodResourcesCheck::Enforce,
            )
            .unwrap()
        };
        let none = CniStamps::read(dst.path(), "macvtap");
        assert_eq!(none, CniStamps::default());
        run();
        let first = CniStamps::read(dst.path(), "macvtap");
        assert!(first.binary.is_some() && first.settings.is_some());
        assert!(none.installed_since(&first));
        assert!(!first.installed_since(&first));
        wait_for_a_later_ctime(&dst.path().join("macvtap"));
        wait_for_a_later_ctime(&dst.path().join(CNI_SETTINGS_FILE));
        // The same bytes again: nothing is rewritten, and still both marked.
        run();
        let second = CniStamps::read(dst.path(), "macvtap");
        assert_ne!(first.binary, second.binary);
        assert_ne!(first.settings, second.settings);
        assert!(first.installed_since(&second));
        // Files gone since are no install of another.
        std::fs::remove_file(dst.path().join("macvtap")).unwrap();
        std::fs::remove_file(dst.path().join(CNI_SETTINGS_FILE)).unwrap();
        assert!(!second.installed_since(&CniStamps::read(dst.path(), "macvtap")));
    }

    #[test]
    fn an_install_waits_for_the_dir_and_says_so_when_it_is_held() {
        let src = tempfile::NamedTempFile::new().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let open = || OwnedFd::from(File::open(dst.path()).unwrap());
        let held = lock_dir(open(), Duration::ZERO).unwrap();
        let e = lock_dir(open(), Duration::ZERO).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        drop(held);
        install(
            src.path(),
            dst.path(),
            "macvtap",
            Path::new("/var/lib/kubelet"),
            PodResourcesCheck::Warn,
        )
        .unwrap();
        assert!(dst.path().join("macvtap").exists());
    }

    #[test]
    fn refuses_a_missing_target_dir() {
        let src = tempfile::NamedTempFile::new().unwrap();
        let e = install_cni(src.path(), Path::new("/nonexistent/cni/bin"), "macvtap")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/nonexistent/cni/bin") && e.contains("mounted"),
            "{e}"
        );
        assert!(!Path::new("/nonexistent").exists());
    }

    #[test]
    fn writes_the_cni_settings_the_cni_reads() {
        let dst = tempfile::tempdir().unwrap();
        let kubelet = Path::new("/var/lib/k0s/kubelet");
        assert_eq!(
            install_settings(dst.path(), kubelet, PodResourcesCheck::Enforce).unwrap(),
            Installed::Replaced
        );
        assert_eq!(
            install_settings(dst.path(), kubelet, PodResourcesCheck::Enforce).unwrap(),
            Installed::Unchanged
        );
        let path = dst.path().join("macvtap.settings.json");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["kubeletDir"], "/var/lib/k0s/kubelet");
        assert_eq!(v["podResourcesCheck"], "enforce");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
        assert!(install_settings(dst.path(), Path::new("rel"), PodResourcesCheck::Warn).is_err());
        // Byte for byte what the json! literal wrote before the shared type.
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            r#"{"kubeletDir":"/var/lib/k0s/kubelet","podResourcesCheck":"enforce"}"#
        );
    }

    #[test]
    fn refuses_odd_names() {
        let src = tempfile::NamedTempFile::new().unwrap();
        let dst = tempfile::tempdir().unwrap();
        for name in ["", "a/b", ".hidden"] {
            assert!(
                install_cni(src.path(), dst.path(), name).is_err(),
                "{name:?}"
            );
        }
    }
}
