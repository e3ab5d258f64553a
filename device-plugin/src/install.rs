//! `macvtap-deviceplugin install-cni`: copies the CNI binary into the host's
//! CNI bin dir, atomically.
//!
//! It is a subcommand of the daemon's binary rather than a script because
//! the image has no shell or `cp` (a distroless base), and one binary keeps
//! the image small. The copy goes to a temporary file in the target dir,
//! is fsynced, then renamed over the old binary, so a runtime executing the
//! plugin during an upgrade sees either the whole old file or the whole new
//! one, never a partial file, and never `ETXTBSY`.

use crate::error::{Error, Result};
use macvtap_link::{CNI_SETTINGS_FILE, NodeSettingsFile, PodResourcesCheck};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use tracing::info;

/// What an install did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// The target was missing or different and now holds the source.
    Replaced,
    /// The target already had exactly the source's bytes.
    Unchanged,
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
