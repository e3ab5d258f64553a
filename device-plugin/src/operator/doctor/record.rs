//! The daemon's record directory, `macvtap-deviceplugin/` in the
//! device-plugins directory, which every device plugin of the node mounts:
//! it must be the daemon's own (a directory of its uid, mode 0700) and hold
//! only files the daemon made where the record, its journal and its
//! temporary files go. The daemon refuses such a directory, and removes
//! such files at its next write; this says so before.

use super::Finding;
use crate::core::ledger::record_file::{self, DirState, FILE_NAME, JOURNAL_NAME, Stat, TMP_PREFIX};
use std::path::Path;

/// The check's name.
const CHECK: &str = "record-dir";

/// What is at `path`, not following it, as a phrase: `a FIFO`, `a symbolic
/// link to "/x"`.
fn found(path: &Path, st: Stat) -> String {
    match std::fs::read_link(path) {
        Ok(target) if record_file::is_link(st) => record_file::link_to(target.as_os_str()),
        _ => record_file::kind(st).to_string(),
    }
}

/// The record directory under the device-plugins directory `plugin_dir`,
/// judged for a daemon of uid `euid`.
pub(crate) fn check_record_dir(plugin_dir: &Path, euid: u32) -> Finding {
    let dir = record_file::dir_in(plugin_dir);
    let st = match std::fs::symlink_metadata(&dir) {
        Ok(m) => Stat::from(&m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Finding::ok(
                CHECK,
                format!(
                    "the record directory {} does not exist yet; the daemon makes it (0700) at \
                     its first Allocate",
                    dir.display()
                ),
            );
        }
        Err(e) => {
            return Finding::problem(
                CHECK,
                format!(
                    "the record directory {} cannot be read: {}",
                    dir.display(),
                    macvtap_link::error::io_cause(&e)
                ),
            );
        }
    };
    match record_file::judge_dir(st, &found(&dir, st), euid) {
        DirState::Ours => {}
        DirState::Refused(why) => {
            return Finding::problem(
                CHECK,
                format!(
                    "the record directory {} {why}; until then the daemon keeps no record, so a \
                     restarted daemon re-creates no lost link",
                    dir.display()
                ),
            );
        }
        DirState::Mode(mode) => {
            return Finding::problem(
                CHECK,
                format!(
                    "the record directory {} has mode {mode:04o}, not 0700, so others may write \
                     in it: the daemon sets 0700 back when it starts, or chmod 0700 it",
                    dir.display()
                ),
            );
        }
    }
    let mut names = vec![FILE_NAME.to_string(), JOURNAL_NAME.to_string()];
    if let Ok(entries) = std::fs::read_dir(&dir) {
        names.extend(
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(TMP_PREFIX)),
        );
    }
    let planted: Vec<String> = names
        .iter()
        .filter_map(|name| {
            let path = dir.join(name);
            let st = Stat::from(&std::fs::symlink_metadata(&path).ok()?);
            let what = record_file::foreign(st, euid)?;
            let what = if record_file::is_link(st) {
                found(&path, st)
            } else {
                what
            };
            Some(format!("{what} at {name}"))
        })
        .collect();
    if planted.is_empty() {
        return Finding::ok(
            CHECK,
            format!(
                "the record directory {} is the daemon's own (mode 0700) and holds only files \
                 it made",
                dir.display()
            ),
        );
    }
    Finding::problem(
        CHECK,
        format!(
            "the record directory {} holds what the daemon did not make where its files go ({}): \
             something else on the node put it there; the daemon removes it at its next write \
             (Event MacvtapRecordFilePlanted), or remove it",
            dir.display(),
            planted.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::doctor::Level;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn euid() -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    #[test]
    fn a_missing_or_own_record_directory_is_ok() {
        let tmp = tempfile::tempdir().unwrap();
        let f = check_record_dir(tmp.path(), euid());
        assert_eq!(f.level, Level::Ok, "{f}");
        assert!(f.message.contains("does not exist yet"), "{f}");
        let dir = record_file::RecordDir::open_or_create(tmp.path()).unwrap();
        record_file::append(&dir, b"x\n", &crate::core::report::Silent).unwrap();
        let f = check_record_dir(tmp.path(), euid());
        assert_eq!(f.level, Level::Ok, "{f}");
        assert!(f.message.ends_with("holds only files it made"), "{f}");
    }

    #[test]
    fn a_linked_foreign_or_open_record_directory_is_a_problem_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = record_file::dir_in(tmp.path());
        symlink("/host/cni-bin", &dir).unwrap();
        let f = check_record_dir(tmp.path(), euid());
        assert_eq!(f.level, Level::Problem, "{f}");
        assert!(
            f.message.starts_with(&format!(
                "the record directory {} is a symbolic link to \"/host/cni-bin\"; refusing to \
                 follow it",
                dir.display()
            )),
            "{f}"
        );
        std::fs::remove_file(&dir).unwrap();
        nix::unistd::mkfifo(&dir, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let f = check_record_dir(tmp.path(), euid());
        assert!(f.message.contains("is a FIFO, not a directory"), "{f}");
        std::fs::remove_file(&dir).unwrap();
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let f = check_record_dir(tmp.path(), euid());
        assert_eq!(f.level, Level::Problem, "{f}");
        assert!(f.message.contains("has mode 0755, not 0700"), "{f}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let f = check_record_dir(tmp.path(), euid().wrapping_add(1));
        assert_eq!(f.level, Level::Problem, "{f}");
        assert!(
            f.message
                .contains(&format!("is a directory of uid {}", euid())),
            "{f}"
        );
    }

    #[test]
    fn a_planted_file_where_the_record_goes_is_a_problem_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = record_file::RecordDir::open_or_create(tmp.path()).unwrap();
        drop(dir);
        let at = record_file::dir_in(tmp.path());
        symlink("/host/cni-bin/multus-shim", at.join(JOURNAL_NAME)).unwrap();
        nix::unistd::mkfifo(
            &at.join(format!("{TMP_PREFIX}1")),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        std::fs::write(at.join(FILE_NAME), "{}").unwrap();
        let f = check_record_dir(tmp.path(), euid());
        assert_eq!(f.level, Level::Problem, "{f}");
        assert!(
            f.message.contains(&format!(
                "(a symbolic link to \"/host/cni-bin/multus-shim\" at {JOURNAL_NAME}, a FIFO at \
                 {TMP_PREFIX}1)"
            )),
            "{f}"
        );
    }
}
