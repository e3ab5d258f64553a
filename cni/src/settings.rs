//! The node's settings for the CNI, which only the node's administrator
//! controls: never the NetConf (which namespace users write), never
//! `CNI_ARGS`.
//!
//! They live in a small JSON file beside the installed binary
//! (`<CNI bin dir>/macvtap.settings.json`, written by the DaemonSet's
//! `install-cni` step), or at the path in `MACVTAP_CNI_SETTINGS` in the
//! container runtime's environment:
//!
//! ```json
//! {"kubeletDir": "/var/lib/kubelet", "podResourcesCheck": "enforce", "logDir": "/var/log/macvtap-cni"}
//! ```
//!
//! The file's format is [`NodeSettingsFile`], the type the device plugin's
//! installer writes. Every key is optional. A missing file means the defaults. A file that is
//! not the plugin user's, is writable by others, or does not parse is an
//! error for ADD (a security setting must not silently fall back) and a
//! warning for every other command.

use crate::logfile::{DEFAULT_LOG_DIR, LOG_DIR_ENV};
use macvtap_link::{
    CNI_SETTINGS_FILE, DEFAULT_KUBELET_DIR, NodeSettingsFile, PodResourcesCheck, admin_only,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The environment variable that names another settings file.
pub(crate) const SETTINGS_ENV: &str = "MACVTAP_CNI_SETTINGS";

/// The node's settings, with defaults filled in.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// The kubelet's root directory.
    pub kubelet_dir: PathBuf,
    /// What ADD does when the PodResources API cannot be asked.
    pub pod_resources_check: PodResourcesCheck,
    /// The directory a `logFile` must be in.
    pub log_dir: PathBuf,
    /// Where the settings came from (a path, or "defaults").
    pub source: String,
    /// Why the settings file was not used, if it exists and was refused.
    pub problem: Option<String>,
}

impl NodeSettings {
    /// `<kubelet dir>/pod-resources/kubelet.sock`.
    pub(crate) fn pod_resources_socket(&self) -> PathBuf {
        self.kubelet_dir.join("pod-resources").join("kubelet.sock")
    }

    /// The defaults (and `MACVTAP_CNI_LOG_DIR`), with no file.
    pub fn defaults(vars: &HashMap<String, String>) -> Self {
        Self::from_file(NodeSettingsFile::default(), vars, "defaults".into())
    }

    fn from_file(f: NodeSettingsFile, vars: &HashMap<String, String>, source: String) -> Self {
        let env_log_dir = vars
            .get(LOG_DIR_ENV)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        NodeSettings {
            kubelet_dir: f
                .kubelet_dir
                .unwrap_or_else(|| PathBuf::from(DEFAULT_KUBELET_DIR)),
            pod_resources_check: f.pod_resources_check.unwrap_or_default(),
            log_dir: env_log_dir
                .or(f.log_dir)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_LOG_DIR)),
            source,
            problem: None,
        }
    }
}

/// Where the settings file is: `MACVTAP_CNI_SETTINGS`, else beside the
/// running binary.
pub(crate) fn settings_path(vars: &HashMap<String, String>) -> Option<PathBuf> {
    if let Some(p) = vars.get(SETTINGS_ENV).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.join(CNI_SETTINGS_FILE))
}

/// Loads the node's settings; see the module docs for what a bad file means.
pub fn load(vars: &HashMap<String, String>) -> NodeSettings {
    let Some(path) = settings_path(vars) else {
        return NodeSettings::defaults(vars);
    };
    match read(&path) {
        Ok(None) => NodeSettings::defaults(vars),
        Ok(Some(f)) => NodeSettings::from_file(f, vars, path.display().to_string()),
        Err(why) => NodeSettings {
            problem: Some(format!(
                "the node settings file {} is not used: {why}",
                path.display()
            )),
            ..NodeSettings::defaults(vars)
        },
    }
}

fn read(path: &Path) -> Result<Option<NodeSettingsFile>, String> {
    // One open: the file checked is the file read.
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read it: {e}")),
    };
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot stat it: {e}"))?;
    admin_only(&meta).map_err(|why| format!("it {why}"))?;
    let mut text = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut text).map_err(|e| format!("cannot read it: {e}"))?;
    let f = NodeSettingsFile::from_json(&text).map_err(|e| format!("it is not valid: {e}"))?;
    Ok(Some(f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn with_file(text: &str, mode: u32) -> (tempfile::TempDir, HashMap<String, String>) {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join(CNI_SETTINGS_FILE);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        let vars = HashMap::from([(SETTINGS_ENV.to_string(), p.display().to_string())]);
        (t, vars)
    }

    #[test]
    fn a_missing_file_means_the_defaults() {
        let vars = HashMap::from([(SETTINGS_ENV.to_string(), "/nonexistent/x.json".to_string())]);
        let s = load(&vars);
        assert_eq!(s.kubelet_dir, PathBuf::from("/var/lib/kubelet"));
        assert_eq!(s.pod_resources_check, PodResourcesCheck::Warn);
        assert_eq!(s.log_dir, PathBuf::from(DEFAULT_LOG_DIR));
        assert!(s.problem.is_none());
        assert_eq!(
            s.pod_resources_socket(),
            PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock")
        );
    }

    #[test]
    fn the_file_sets_each_key() {
        let (_t, vars) = with_file(
            r#"{"kubeletDir":"/var/lib/k0s/kubelet","podResourcesCheck":"enforce","logDir":"/run/mvt"}"#,
            0o644,
        );
        let s = load(&vars);
        assert!(s.problem.is_none(), "{:?}", s.problem);
        assert_eq!(s.kubelet_dir, PathBuf::from("/var/lib/k0s/kubelet"));
        assert_eq!(s.pod_resources_check, PodResourcesCheck::Enforce);
        assert_eq!(s.log_dir, PathBuf::from("/run/mvt"));
    }

    #[test]
    fn the_log_dir_variable_wins_over_the_file() {
        let (_t, mut vars) = with_file(r#"{"logDir":"/run/mvt"}"#, 0o600);
        vars.insert(LOG_DIR_ENV.into(), "/run/other".into());
        assert_eq!(load(&vars).log_dir, PathBuf::from("/run/other"));
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        for (text, mode, why) in [
            (r#"{"podResourcesCheck":"maybe"}"#, 0o600, "not valid"),
            (r#"{"kubeletdir":"/x"}"#, 0o600, "not valid"),
            (r#"{"kubeletDir":"relative"}"#, 0o600, "absolute"),
            (r#"{}"#, 0o666, "others may write"),
            ("not json", 0o600, "not valid"),
        ] {
            let (_t, vars) = with_file(text, mode);
            let s = load(&vars);
            let problem = s.problem.unwrap_or_default();
            assert!(problem.contains(why), "{text}: {problem}");
            assert_eq!(s.pod_resources_check, PodResourcesCheck::Warn);
        }
    }
}
