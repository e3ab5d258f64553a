//! The installed CNI: its binary in the runtime's CNI bin dir, its version
//! (it says it when run by hand) against the daemon's, and its node
//! settings file beside it, valid and changeable by root only (the rule
//! the CNI itself holds the file to, [`macvtap_link::admin_only`]).

use super::{Finding, TIMEOUT};
use crate::options::Options;
use macvtap_link::{
    CNI_ABOUT_PREFIX, CNI_SETTINGS_FILE, DEFAULT_KUBELET_DIR, NodeSettingsFile, PodResourcesCheck,
    admin_only,
};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;

/// This daemon's version, which the installed CNI should have too.
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where `doctor` looks for the host's CNI bin dir when not told, in
/// order: our DaemonSet's mount, the Go project's DaemonSets' mount (in
/// their init container only), and the host's own path.
pub const CNI_BIN_DIRS: [&str; 3] = ["/host/cni-bin", "/host/opt/cni/bin", "/opt/cni/bin"];

/// The CNI bin dir to check: `given`, else the first of `candidates` that
/// is a directory; with none, a warning that the CNI is not checked.
pub fn find_bin_dir(given: Option<&Path>, candidates: &[&str]) -> Result<PathBuf, Finding> {
    if let Some(dir) = given {
        return Ok(dir.to_path_buf());
    }
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|d| d.is_dir())
        .ok_or_else(|| {
            Finding::warning(
                "cni-binary",
                format!(
                    "the installed CNI is not checked: no CNI bin dir is mounted here (none of {}); \
                     give --cni-bin-dir",
                    candidates.join(", ")
                ),
            )
        })
}

/// The binary `bin_dir/name`, its version, and the settings file beside it.
pub(crate) fn check_cni(opts: &Options, bin_dir: &Path, name: &str) -> Vec<Finding> {
    let bin = bin_dir.join(name);
    let mut out = vec![check_binary(&bin)];
    if out[0].level == super::Level::Ok {
        out.push(check_version(&bin, VERSION));
    }
    out.push(check_settings(
        &bin_dir.join(CNI_SETTINGS_FILE),
        &opts.kubelet_dir,
    ));
    out
}

/// Whether `bin` is an executable file.
pub(crate) fn check_binary(bin: &Path) -> Finding {
    const CHECK: &str = "cni-binary";
    match std::fs::metadata(bin) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {
            Finding::ok(CHECK, format!("the CNI is installed at {}", bin.display()))
        }
        Ok(_) => Finding::problem(
            CHECK,
            format!("{} is not an executable file", bin.display()),
        ),
        Err(e) => Finding::problem(
            CHECK,
            format!(
                "no CNI binary at {} ({}): the DaemonSet's install-cni init container has not \
                 run, or --cni-bin-dir is not the container runtime's CNI bin dir",
                bin.display(),
                macvtap_link::error::io_cause(&e)
            ),
        ),
    }
}

/// Runs `bin` by hand and compares the version it prints with `expected`.
pub(crate) fn check_version(bin: &Path, expected: &str) -> Finding {
    const CHECK: &str = "cni-version";
    match installed_version(bin) {
        Ok(v) if v == expected => {
            Finding::ok(CHECK, format!("the installed CNI is v{v}, as this daemon"))
        }
        Ok(v) => Finding::problem(
            CHECK,
            format!(
                "the installed CNI is v{v} but this daemon is v{expected}: restart the \
                 DaemonSet's pod so that install-cni installs its own CNI"
            ),
        ),
        Err(why) => Finding::problem(
            CHECK,
            format!(
                "{} does not say its version when run by hand ({why}): it is not this \
                 project's CNI, or one older than v{expected}",
                bin.display()
            ),
        ),
    }
}

/// The version `bin` prints on stderr when run without `CNI_COMMAND`.
fn installed_version(bin: &Path) -> Result<String, String> {
    let child = Command::new(bin)
        .env_remove("CNI_COMMAND")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("it cannot be run: {e}"))?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output = match rx.recv_timeout(TIMEOUT) {
        Ok(r) => r.map_err(|e| format!("it cannot be run: {e}"))?,
        Err(_) => {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return Err(format!("it ran for more than {} s", TIMEOUT.as_secs()));
        }
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    let first = stderr.lines().next().unwrap_or("").trim();
    if !output.status.success() {
        return Err(format!(
            "it exited with {} and said {first:?}",
            output.status
        ));
    }
    first
        .strip_prefix(CNI_ABOUT_PREFIX)
        .map(str::to_string)
        .ok_or_else(|| format!("it said {first:?}"))
}

/// The node settings file at `path`: present, owned and writable by root
/// only, valid, and naming `kubelet_dir` (a warning when it names another,
/// or is missing and the CNI uses its defaults).
pub(crate) fn check_settings(path: &Path, kubelet_dir: &Path) -> Finding {
    const CHECK: &str = "cni-settings";
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Finding::warning(
                CHECK,
                format!(
                    "there is no node settings file {}, so the CNI uses its defaults \
                     (kubeletDir {}, podResourcesCheck {}); install-cni writes it",
                    path.display(),
                    DEFAULT_KUBELET_DIR,
                    PodResourcesCheck::default()
                ),
            );
        }
        Err(e) => {
            return Finding::problem(
                CHECK,
                format!(
                    "the node settings file {} cannot be read: {e}",
                    path.display()
                ),
            );
        }
    };
    if let Err(why) = admin_only(&meta) {
        return Finding::problem(
            CHECK,
            format!(
                "the node settings file {} {why}, so the CNI ignores it and uses its defaults",
                path.display()
            ),
        );
    }
    let parsed = std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|b| NodeSettingsFile::from_json(&b).map_err(|e| e.to_string()));
    let file = match parsed {
        Ok(f) => f,
        Err(why) => {
            return Finding::problem(
                CHECK,
                format!(
                    "the node settings file {} is not valid ({why}), so the CNI ignores it and \
                     uses its defaults",
                    path.display()
                ),
            );
        }
    };
    let named = file
        .kubelet_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_KUBELET_DIR));
    if named != kubelet_dir {
        return Finding::warning(
            CHECK,
            format!(
                "the node settings file {} names kubelet dir {}, not {}: the CNI asks another \
                 kubelet's PodResources API than the daemon",
                path.display(),
                named.display(),
                kubelet_dir.display()
            ),
        );
    }
    Finding::ok(
        CHECK,
        format!(
            "the node settings file {} is valid and only root can change it",
            path.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::doctor::Level;

    #[test]
    fn the_bin_dir_is_the_one_given_else_the_first_that_exists() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        std::fs::create_dir(&b).unwrap();
        let (a_s, b_s) = (a.to_str().unwrap(), b.to_str().unwrap());
        assert_eq!(find_bin_dir(None, &[a_s, b_s]), Ok(b.clone()));
        std::fs::create_dir(&a).unwrap();
        assert_eq!(find_bin_dir(None, &[a_s, b_s]), Ok(a.clone()));
        let given = d.path().join("given");
        assert_eq!(find_bin_dir(Some(&given), &[a_s, b_s]), Ok(given));
        let none = find_bin_dir(None, &[d.path().join("x").to_str().unwrap()]).unwrap_err();
        assert_eq!(none.level, Level::Warning);
        assert!(none.message.contains("--cni-bin-dir"), "{}", none.message);
    }

    #[test]
    fn the_settings_file_must_be_valid_and_root_only() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(CNI_SETTINGS_FILE);
        let kdir = Path::new("/var/lib/kubelet");
        assert_eq!(check_settings(&p, kdir).level, Level::Warning);
        std::fs::write(&p, r#"{"kubeletDir":"/var/lib/kubelet"}"#).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(check_settings(&p, kdir).level, Level::Ok);
        assert_eq!(
            check_settings(&p, Path::new("/srv/kubelet")).level,
            Level::Warning
        );
        std::fs::write(&p, r#"{"kubeletDir":"relative"}"#).unwrap();
        let f = check_settings(&p, kdir);
        assert_eq!(f.level, Level::Problem);
        assert!(f.message.contains("absolute"), "{f:?}");
        std::fs::write(&p, "{}").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        let f = check_settings(&p, kdir);
        assert_eq!(f.level, Level::Problem);
        assert!(f.message.contains("others may write it"), "{f:?}");
    }
}
