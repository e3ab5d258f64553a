//! The node's kernel as macvtaps need it: the macvtap driver, and a `/dev`
//! on which the kernel creates tap nodes (devtmpfs: the host's `/dev`
//! mounted; a privileged container's own `/dev` and a kind node's are not).

use super::Finding;
use crate::core::degraded::Degraded;
use crate::core::link::not_devtmpfs;
use std::path::Path;

/// Whether the macvtap driver is there: `/sys/class/macvtap` exists once it
/// is registered (built in or loaded), `/sys/module/macvtap` or a line of
/// `/proc/modules` when it is a loaded module. Not loaded is a warning where
/// the kernel loads modules (creating the first macvtap loads it), a
/// problem where it cannot (no `/proc/modules`).
pub(crate) fn check_module(sysfs: &Path, proc_dir: &Path) -> Vec<Finding> {
    const CHECK: &str = "kernel-module";
    let modules = std::fs::read_to_string(proc_dir.join("modules"));
    let listed = modules.as_ref().is_ok_and(|m| {
        m.lines()
            .any(|l| l.split_whitespace().next() == Some("macvtap"))
    });
    if sysfs.join("class/macvtap").exists() || sysfs.join("module/macvtap").exists() || listed {
        return vec![Finding::ok(
            CHECK,
            "the macvtap driver is in the kernel (built in or loaded)",
        )];
    }
    match modules {
        Ok(_) => vec![Finding::warning(
            CHECK,
            "the macvtap module is not loaded; creating the first macvtap loads it, or run \
             `modprobe macvtap` on the node",
        )],
        Err(_) => vec![Finding::problem(
            CHECK,
            "the kernel has no macvtap driver and cannot load modules, so no macvtap can be created",
        )],
    }
}

/// Whether `dev_dir` is devtmpfs, judged from `mountinfo` (the text of
/// `/proc/self/mountinfo`) as the daemon judges it at start. Without it the
/// daemon still serves (a warning saying what it leaves undone and the
/// mount that would enable it, the daemon's own sentence).
pub(crate) fn check_dev(dev_dir: &Path, mountinfo: &str) -> Finding {
    const CHECK: &str = "dev";
    match not_devtmpfs(dev_dir, mountinfo) {
        None => Finding::ok(
            CHECK,
            format!(
                "{} is devtmpfs, so the kernel creates the tap nodes of macvtaps there",
                dev_dir.display()
            ),
        ),
        Some(fstype) => {
            let gap = Degraded::NoHostDev {
                dev: dev_dir.to_path_buf(),
                fstype,
            };
            Finding::warning(CHECK, gap.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::doctor::Level;

    #[test]
    fn dev_must_be_devtmpfs() {
        let devtmpfs = "24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw\n";
        assert_eq!(check_dev(Path::new("/dev"), devtmpfs).level, Level::Ok);
        // A privileged container's own /dev (the Go project's DaemonSets
        // mount none), or a kind node's: the daemon serves, with less.
        let copy = "24 27 0:6 / /dev rw,relatime - tmpfs tmpfs rw\n";
        let f = check_dev(Path::new("/dev"), copy);
        assert_eq!(f.level, Level::Warning);
        for want in [
            "not devtmpfs",
            "lost macvtaps are never re-created",
            "mount the host's /dev (hostPath /dev, read-only) at /dev",
        ] {
            assert!(f.message.contains(want), "want {want:?} in {f:?}");
        }
    }

    #[test]
    fn the_module_is_found_or_missed() {
        let sys = tempfile::tempdir().unwrap();
        let proc_dir = tempfile::tempdir().unwrap();
        // No module support, no driver.
        let f = check_module(sys.path(), proc_dir.path());
        assert_eq!(f[0].level, Level::Problem, "{f:?}");
        // Modules supported, macvtap not loaded.
        std::fs::write(
            proc_dir.path().join("modules"),
            "tap 28672 1 macvlan, Live 0x0\n",
        )
        .unwrap();
        assert_eq!(
            check_module(sys.path(), proc_dir.path())[0].level,
            Level::Warning
        );
        // Loaded.
        std::fs::write(
            proc_dir.path().join("modules"),
            "macvtap 16384 0 - Live 0x0\ntap 28672 1 macvtap, Live 0x0\n",
        )
        .unwrap();
        assert_eq!(
            check_module(sys.path(), proc_dir.path())[0].level,
            Level::Ok
        );
        // Built in: only its class shows.
        std::fs::remove_file(proc_dir.path().join("modules")).unwrap();
        std::fs::create_dir_all(sys.path().join("class/macvtap")).unwrap();
        assert_eq!(
            check_module(sys.path(), proc_dir.path())[0].level,
            Level::Ok
        );
    }
}
