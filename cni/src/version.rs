//! CNI spec versions this plugin speaks.

use crate::error::{Error, Result};

/// Every spec version we accept, oldest first. The Go plugin accepted 0.1.0
/// and 0.2.0, and NetworkAttachmentDefinitions that say so exist.
pub(crate) const SUPPORTED_VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// What the plugin says of itself when it is run by hand (no
/// `CNI_COMMAND`, or `--help`/`--version`), in the reference plugins' words
/// (containernetworking/cni `pkg/skel`: the about line, then the protocol
/// versions), for stderr.
pub fn about() -> String {
    format!(
        "{}{}\nCNI protocol versions supported: {}",
        macvtap_link::CNI_ABOUT_PREFIX,
        env!("CARGO_PKG_VERSION"),
        SUPPORTED_VERSIONS.join(", ")
    )
}

/// Whether a run is by hand rather than by a runtime: no (or an empty)
/// `CNI_COMMAND`, as `pkg/skel` decides, or a `--help`/`--version` argument,
/// which no runtime passes.
pub fn is_by_hand(cni_command: Option<&str>, args: &[String]) -> bool {
    cni_command.is_none_or(str::is_empty)
        || args
            .iter()
            .any(|a| matches!(a.as_str(), "-h" | "--help" | "-V" | "--version"))
}

/// The version used when none is given (for VERSION and early errors).
pub(crate) const LATEST: &str = "1.1.0";

/// A supported spec version, ordered by age.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    /// 0.1.0: results are `ip4`/`ip6`, without interfaces.
    V0_1_0,
    /// 0.2.0: the same result shape as 0.1.0.
    V0_2_0,
    /// 0.3.0: results list interfaces and `ips`.
    V0_3_0,
    /// 0.3.1
    V0_3_1,
    /// 0.4.0: adds CHECK.
    V0_4_0,
    /// 1.0.0: drops `ips[].version`.
    V1_0_0,
    /// 1.1.0: adds STATUS and GC.
    V1_1_0,
}

impl Version {
    /// Parses a `cniVersion`, refusing the versions we do not speak (code 1).
    pub(crate) fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "0.1.0" => Version::V0_1_0,
            "0.2.0" => Version::V0_2_0,
            "0.3.0" => Version::V0_3_0,
            "0.3.1" => Version::V0_3_1,
            "0.4.0" => Version::V0_4_0,
            "1.0.0" => Version::V1_0_0,
            "1.1.0" => Version::V1_1_0,
            other => {
                return Err(Error::IncompatibleVersion {
                    msg: format!(
                        "cniVersion {other:?} is not supported (supported: {})",
                        SUPPORTED_VERSIONS.join(", ")
                    ),
                });
            }
        })
    }

    /// The version as written in JSON.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Version::V0_1_0 => "0.1.0",
            Version::V0_2_0 => "0.2.0",
            Version::V0_3_0 => "0.3.0",
            Version::V0_3_1 => "0.3.1",
            Version::V0_4_0 => "0.4.0",
            Version::V1_0_0 => "1.0.0",
            Version::V1_1_0 => "1.1.0",
        }
    }

    /// Whether results of this version carry `ips[].version` (0.3.0 to 0.4.0).
    pub(crate) fn has_ip_version(self) -> bool {
        self < Version::V1_0_0
    }

    /// Whether results of this version have the 0.1.0/0.2.0 shape: one `ip4`
    /// and one `ip6`, each with its routes, and no interfaces.
    pub(crate) fn is_02x(self) -> bool {
        self < Version::V0_3_0
    }

    /// Refuses `command` when it is newer than this version.
    pub(crate) fn require(self, min: Version, command: &str) -> Result<()> {
        if self < min {
            return Err(Error::IncompatibleVersion {
                msg: format!(
                    "{command} is not supported in cniVersion {} (needs {} or later)",
                    self.as_str(),
                    min.as_str()
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_version_round_trips() {
        for v in SUPPORTED_VERSIONS {
            assert_eq!(Version::parse(v).unwrap().as_str(), v);
        }
    }

    #[test]
    fn unknown_versions_get_code_1() {
        for v in ["0.0.1", "0.3", "2.0.0", ""] {
            assert_eq!(Version::parse(v).unwrap_err().code(), 1, "{v}");
        }
    }

    #[test]
    fn check_needs_0_4_and_status_needs_1_1() {
        assert_eq!(
            Version::V0_3_1
                .require(Version::V0_4_0, "CHECK")
                .unwrap_err()
                .code(),
            1
        );
        assert!(Version::V0_4_0.require(Version::V0_4_0, "CHECK").is_ok());
        assert!(Version::V1_0_0.require(Version::V1_1_0, "GC").is_err());
        assert!(Version::V0_2_0.require(Version::V0_4_0, "CHECK").is_err());
    }

    #[test]
    fn the_go_plugins_old_versions_are_accepted() {
        assert!(Version::parse("0.1.0").unwrap().is_02x());
        assert!(Version::parse("0.2.0").unwrap().is_02x());
        assert!(!Version::V0_3_0.is_02x());
        assert_eq!(SUPPORTED_VERSIONS[..2], ["0.1.0", "0.2.0"]);
    }

    #[test]
    fn a_run_by_hand_is_told_from_a_runtimes() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(is_by_hand(None, &[]));
        assert!(is_by_hand(Some(""), &[]));
        assert!(is_by_hand(Some("ADD"), &args(&["--help"])));
        assert!(is_by_hand(Some("ADD"), &args(&["-V"])));
        assert!(!is_by_hand(Some("ADD"), &[]));
        assert!(!is_by_hand(Some("VERSION"), &args(&["--other"])));
    }

    #[test]
    fn about_names_the_plugin_and_every_version() {
        let text = about();
        assert!(text.starts_with("CNI macvtap plugin v"), "{text}");
        assert!(
            text.ends_with(
                "CNI protocol versions supported: 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"
            ),
            "{text}"
        );
    }
}
