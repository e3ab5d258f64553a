//! The CNI's node settings file: the device plugin's `install-cni` step
//! writes it beside the CNI binary, the CNI reads it. One type, so both
//! sides agree on every key and value.
//!
//! ```json
//! {"kubeletDir":"/var/lib/kubelet","podResourcesCheck":"enforce","logDir":"/var/log/macvtap-cni"}
//! ```
//!
//! Every key is optional (the CNI fills in defaults); an unknown key or a
//! relative path makes the file invalid. [`admin_only`] is the ownership
//! rule the CNI holds the file (and its log directory) to.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::str::FromStr;

/// The settings file's name beside the installed CNI binary.
pub const CNI_SETTINGS_FILE: &str = "macvtap.settings.json";

/// The kubelet's root directory the CNI uses when the file names none.
pub const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet";

/// How the CNI's first line run by hand (no `CNI_COMMAND`) begins; its
/// version follows (`CNI macvtap plugin v0.1.0`). The device plugin's
/// `doctor` reads the installed CNI's version from it.
pub const CNI_ABOUT_PREFIX: &str = "CNI macvtap plugin v";

/// What the CNI's ADD does when it cannot ask the kubelet whether a device
/// is the pod's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PodResourcesCheck {
    /// Logs a warning and goes on (the default: the Go project did no check,
    /// and nodes whose PodResources socket is elsewhere keep working).
    #[default]
    Warn,
    /// Refuses the ADD (code 11, the runtime retries).
    Enforce,
}

impl PodResourcesCheck {
    /// The value as the settings file writes it: `warn` or `enforce`.
    pub fn as_str(self) -> &'static str {
        match self {
            PodResourcesCheck::Warn => "warn",
            PodResourcesCheck::Enforce => "enforce",
        }
    }
}

impl fmt::Display for PodResourcesCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PodResourcesCheck {
    type Err = String;

    /// Parses `warn` or `enforce`, as the settings file spells them.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "warn" => Ok(PodResourcesCheck::Warn),
            "enforce" => Ok(PodResourcesCheck::Enforce),
            other => Err(format!(
                "unknown podResourcesCheck {other:?} (expected warn or enforce)"
            )),
        }
    }
}

/// The node settings as the file holds them; a missing key is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSettingsFile {
    /// The kubelet's root directory as the node sees it (`kubeletDir`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_dir: Option<PathBuf>,
    /// What ADD does when the PodResources API cannot be asked
    /// (`podResourcesCheck`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_resources_check: Option<PodResourcesCheck>,
    /// The directory a NetConf's `logFile` must be in (`logDir`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_dir: Option<PathBuf>,
}

impl NodeSettingsFile {
    /// Reads the file's JSON and checks it ([`NodeSettingsFile::check`]).
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let file: Self = serde_json::from_slice(bytes).map_err(|e| Error::NodeSettings {
            problem: e.to_string(),
        })?;
        file.check()?;
        Ok(file)
    }

    /// The file's JSON, one line, keys in the order above; refuses what
    /// [`NodeSettingsFile::check`] refuses.
    pub fn to_json(&self) -> Result<String> {
        self.check()?;
        serde_json::to_string(self).map_err(|e| Error::NodeSettings {
            problem: e.to_string(),
        })
    }

    /// Refuses a relative `kubeletDir` or `logDir`: the CNI runs with
    /// whatever working directory the container runtime has.
    pub fn check(&self) -> Result<()> {
        for (key, dir) in [("kubeletDir", &self.kubelet_dir), ("logDir", &self.log_dir)] {
            if let Some(dir) = dir.as_ref().filter(|d| !d.is_absolute()) {
                return Err(Error::NodeSettings {
                    problem: format!("{key} {} must be an absolute path", dir.display()),
                });
            }
        }
        Ok(())
    }
}

/// Checks that only the plugin's user (root) can change a file or directory
/// the node's administrator controls: it is that user's, and neither its
/// group nor others may write it. Says why not, as a phrase after its name.
pub fn admin_only(meta: &std::fs::Metadata) -> std::result::Result<(), String> {
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(format!(
            "belongs to uid {}, not to the plugin's user",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "has mode {:o}: others may write it",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_installer_writes_what_it_always_wrote() {
        let written = NodeSettingsFile {
            kubelet_dir: Some("/var/lib/k0s/kubelet".into()),
            pod_resources_check: Some(PodResourcesCheck::Enforce),
            log_dir: None,
        };
        let text = written.to_json().unwrap();
        assert_eq!(
            text,
            r#"{"kubeletDir":"/var/lib/k0s/kubelet","podResourcesCheck":"enforce"}"#
        );
        assert_eq!(
            NodeSettingsFile::from_json(text.as_bytes()).unwrap(),
            written
        );
    }

    #[test]
    fn every_key_is_optional_and_unknown_keys_are_refused() {
        assert_eq!(
            NodeSettingsFile::from_json(b"{}").unwrap(),
            NodeSettingsFile::default()
        );
        let full = NodeSettingsFile::from_json(
            br#"{"kubeletDir":"/k","podResourcesCheck":"warn","logDir":"/l"}"#,
        )
        .unwrap();
        assert_eq!(full.pod_resources_check, Some(PodResourcesCheck::Warn));
        assert_eq!(full.log_dir, Some("/l".into()));
        for bad in [
            r#"{"kubeletdir":"/x"}"#,
            r#"{"podResourcesCheck":"maybe"}"#,
            "not json",
        ] {
            assert!(
                NodeSettingsFile::from_json(bad.as_bytes()).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn relative_directories_are_refused_both_ways() {
        let e = NodeSettingsFile::from_json(br#"{"logDir":"logs"}"#).unwrap_err();
        assert_eq!(e.to_string(), "logDir logs must be an absolute path");
        let relative = NodeSettingsFile {
            kubelet_dir: Some("var/lib/kubelet".into()),
            ..Default::default()
        };
        assert!(relative.to_json().is_err());
    }

    #[test]
    fn check_values_parse_as_written() {
        for c in [PodResourcesCheck::Warn, PodResourcesCheck::Enforce] {
            assert_eq!(c.as_str().parse::<PodResourcesCheck>(), Ok(c));
        }
        assert!("Enforce".parse::<PodResourcesCheck>().is_err());
    }
}
