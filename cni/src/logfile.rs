//! The NetConf's `logFile`, confined to the node's log directory.
//!
//! A NetConf comes from a NetworkAttachmentDefinition, which namespace users
//! may write, and the plugin runs as root: an unconfined `logFile` would let
//! them create or append to any file on the node (`/root/.ssh/authorized_keys`).
//! So a `logFile` is accepted only beneath one directory that only the node's
//! administrator chooses (`MACVTAP_CNI_LOG_DIR` in the runtime's environment,
//! else `logDir` in the node settings file, default `/var/log/macvtap-cni`;
//! see `settings`), resolved without following any symlink,
//! created 0600, and only if it is a regular file of ours with one link.

use crate::error::{Error, Result};
use macvtap_link::admin_only;
use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat, openat2};
use nix::sys::stat::Mode;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

/// Where log files may be, unless the node's administrator says otherwise.
pub(crate) const DEFAULT_LOG_DIR: &str = "/var/log/macvtap-cni";

/// The environment variable (set by the administrator in the container
/// runtime's environment, never in a NetConf) that moves the log directory.
pub(crate) const LOG_DIR_ENV: &str = "MACVTAP_CNI_LOG_DIR";

/// The mode a new log file is created with.
pub(crate) const LOG_FILE_MODE: u32 = 0o600;

/// Opens `requested` (the NetConf's `logFile`, absolute or relative to
/// `dir`) for appending, if it lies beneath `dir`; otherwise says why not.
pub fn open_log_file(dir: &Path, requested: &str) -> Result<File> {
    let refuse = |reason: String| Error::LogFileRefused {
        path: requested.to_string(),
        dir: dir.display().to_string(),
        reason,
    };
    if !dir.is_absolute() {
        return Err(refuse(format!(
            "the log directory {} ({LOG_DIR_ENV}) is not an absolute path",
            dir.display()
        )));
    }
    let rel = relative_beneath(dir, Path::new(requested)).map_err(refuse)?;
    let dir_fd = open_dir(dir).map_err(refuse)?;
    let flags = OFlag::O_WRONLY
        | OFlag::O_APPEND
        | OFlag::O_CREAT
        | OFlag::O_CLOEXEC
        | OFlag::O_NOCTTY
        | OFlag::O_NOFOLLOW
        // A FIFO would block the plugin; with O_NONBLOCK it fails instead.
        | OFlag::O_NONBLOCK;
    let mode = Mode::from_bits_truncate(LOG_FILE_MODE);
    let fd = match open_beneath(&dir_fd, &rel, flags, mode) {
        Err(Errno::ENOSYS) => open_beneath_walk(&dir_fd, &rel, flags, mode),
        other => other,
    }
    .map_err(|e| refuse(explain_open_error(e)))?;
    let file = File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| refuse(format!("cannot stat it: {e}")))?;
    if !meta.file_type().is_file() {
        return Err(refuse("it is not a regular file".into()));
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(refuse(format!(
            "it belongs to uid {}, not to the plugin's user",
            meta.uid()
        )));
    }
    if meta.nlink() != 1 {
        return Err(refuse(format!(
            "it has {} hard links; a log file must have exactly one",
            meta.nlink()
        )));
    }
    Ok(file)
}

/// `requested` as a path relative to `dir`, made only of plain names.
fn relative_beneath(dir: &Path, requested: &Path) -> std::result::Result<PathBuf, String> {
    let rel = if requested.is_absolute() {
        requested
            .strip_prefix(dir)
            .map_err(|_| "it is not inside the log directory".to_string())?
    } else {
        requested
    };
    let mut out = PathBuf::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return Err("it leaves the log directory (\"..\")".into()),
        }
    }
    if out.as_os_str().is_empty() {
        return Err("it names the log directory itself, not a file in it".into());
    }
    Ok(out)
}

/// Opens the log directory, creating it (0700) when missing, and checks that
/// nobody but its owner, the plugin's user, can put files in it.
fn open_dir(dir: &Path) -> std::result::Result<File, String> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create the log directory: {e}"))?;
    }
    let fd = nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open the log directory: {}", e.desc()))?;
    let file = File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot stat the log directory: {e}"))?;
    admin_only(&meta).map_err(|why| format!("the log directory {why}"))?;
    Ok(file)
}

/// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`: no component may
/// be a symlink or leave `dir` (Linux 5.6 and later).
fn open_beneath(dir: &File, rel: &Path, flags: OFlag, mode: Mode) -> nix::Result<OwnedFd> {
    let how = OpenHow::new().flags(flags).mode(mode).resolve(
        ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_SYMLINKS
            | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    );
    openat2(dir, rel, how)
}

/// The same as [`open_beneath`] for kernels without `openat2`: a walk that
/// opens each directory with `O_NOFOLLOW` and the file with `O_NOFOLLOW`.
/// `rel` holds only plain names (see [`relative_beneath`]).
fn open_beneath_walk(dir: &File, rel: &Path, flags: OFlag, mode: Mode) -> nix::Result<OwnedFd> {
    let names: Vec<_> = rel.components().collect();
    let Some((last, parents)) = names.split_last() else {
        return Err(Errno::EINVAL);
    };
    let mut current: Option<OwnedFd> = None;
    for name in parents {
        let next = match &current {
            Some(fd) => openat(
                fd,
                name.as_os_str(),
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ),
            None => openat(
                dir,
                name.as_os_str(),
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ),
        }
        // O_DIRECTORY with O_NOFOLLOW on a symlink fails with ENOTDIR; say
        // ELOOP as openat2 would.
        .map_err(|e| if e == Errno::ENOTDIR { Errno::ELOOP } else { e })?;
        current = Some(next);
    }
    match &current {
        Some(fd) => openat(fd, last.as_os_str(), flags, mode),
        None => openat(dir, last.as_os_str(), flags, mode),
    }
}

fn explain_open_error(e: Errno) -> String {
    match e {
        Errno::ELOOP => "it is, or passes through, a symbolic link".into(),
        Errno::EXDEV => "it leaves the log directory".into(),
        Errno::ENXIO => "it is a FIFO or socket, not a regular file".into(),
        Errno::EISDIR => "it is a directory".into(),
        Errno::ENOENT => "a directory on its path does not exist".into(),
        other => format!("cannot open it: {}", other.desc()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn logdir() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("log");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        (t, d)
    }

    fn refusal(dir: &Path, requested: &str) -> String {
        open_log_file(dir, requested).unwrap_err().to_string()
    }

    #[test]
    fn a_file_in_the_directory_is_created_0600_and_appended() {
        let (_t, d) = logdir();
        let abs = d.join("macvtap.log");
        writeln!(open_log_file(&d, abs.to_str().unwrap()).unwrap(), "one").unwrap();
        writeln!(open_log_file(&d, "macvtap.log").unwrap(), "two").unwrap();
        assert_eq!(std::fs::read_to_string(&abs).unwrap(), "one\ntwo\n");
        let mode = std::fs::metadata(&abs).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn paths_outside_the_directory_are_refused() {
        let (t, d) = logdir();
        let outside = t.path().join("authorized_keys");
        for p in [
            outside.to_str().unwrap().to_string(),
            format!("{}/../authorized_keys", d.display()),
            "../authorized_keys".to_string(),
            d.display().to_string(),
            "/etc/passwd".to_string(),
        ] {
            let e = refusal(&d, &p);
            assert!(e.contains("logFile"), "{e}");
        }
        assert!(!outside.exists());
    }

    #[test]
    fn symlinks_are_refused_at_every_component() {
        let (t, d) = logdir();
        let target = t.path().join("authorized_keys");
        std::fs::write(&target, "ssh-ed25519 AAAA admin\n").unwrap();
        symlink(&target, d.join("evil.log")).unwrap();
        std::fs::create_dir(t.path().join("elsewhere")).unwrap();
        symlink(t.path().join("elsewhere"), d.join("sub")).unwrap();
        for p in ["evil.log", "sub/x.log"] {
            let e = refusal(&d, p);
            assert!(e.contains("symbolic link"), "{p}: {e}");
        }
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            "ssh-ed25519 AAAA admin\n"
        );
        assert!(!t.path().join("elsewhere/x.log").exists());
    }

    #[test]
    fn the_walk_fallback_refuses_symlinks_too() {
        let (t, d) = logdir();
        let target = t.path().join("target");
        std::fs::write(&target, "keep\n").unwrap();
        symlink(&target, d.join("evil.log")).unwrap();
        std::fs::create_dir(t.path().join("elsewhere")).unwrap();
        symlink(t.path().join("elsewhere"), d.join("sub")).unwrap();
        std::fs::create_dir(d.join("real")).unwrap();
        let dir = File::open(&d).unwrap();
        let flags = OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT | OFlag::O_NOFOLLOW;
        let mode = Mode::from_bits_truncate(0o600);
        for p in ["evil.log", "sub/x.log"] {
            assert_eq!(
                open_beneath_walk(&dir, Path::new(p), flags, mode).unwrap_err(),
                Errno::ELOOP,
                "{p}"
            );
        }
        open_beneath_walk(&dir, Path::new("real/ok.log"), flags, mode).unwrap();
        assert!(d.join("real/ok.log").is_file());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep\n");
    }

    #[test]
    fn only_regular_files_with_one_link_are_taken() {
        let (_t, d) = logdir();
        std::fs::create_dir(d.join("adir")).unwrap();
        assert!(refusal(&d, "adir").contains("directory"));
        nix::unistd::mkfifo(&d.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        assert!(refusal(&d, "fifo").contains("FIFO"));
        std::fs::write(d.join("a.log"), "").unwrap();
        std::fs::hard_link(d.join("a.log"), d.join("b.log")).unwrap();
        assert!(refusal(&d, "a.log").contains("hard links"));
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        let (_t, d) = logdir();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(refusal(&d, "x.log").contains("others may write"));
        assert!(!d.join("x.log").exists());
    }

    #[test]
    fn a_missing_directory_is_created_root_only() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("var/log/macvtap-cni");
        open_log_file(&d, "macvtap.log").unwrap();
        let mode = std::fs::metadata(&d).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn a_relative_directory_is_refused() {
        assert!(refusal(Path::new("relative"), "x.log").contains("absolute"));
    }
}
