//! `macvtap-deviceplugin doctor`: checks a node as an operator would, and
//! says what it finds in plain sentences, one [`Finding`] each.
//!
//! Each group of checks is a module of plain functions that take what was
//! read from the node and return findings, so tests call them directly:
//! `resources` (each resource's NIC, the devices pods hold, leaked links),
//! `kubelet` (the kubelet's directory and sockets, the daemon's own
//! registration), `cni` (the installed CNI and its node settings) and
//! `kernel` (`/dev` and the macvtap module), `record` (the daemon's record
//! directory in the shared device-plugins directory). [`run`] reads the
//! node and runs them all.

pub(crate) mod cni;
pub(crate) mod kernel;
pub(crate) mod kubelet;
pub(crate) mod record;
pub(crate) mod resources;

use crate::options::Options;
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// How long one question to the kubelet, the daemon or the CNI may take.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(5);

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// All is well.
    Ok,
    /// Works, but worth a look.
    Warning,
    /// Something does not work; `doctor` exits 1.
    Problem,
}

impl Level {
    /// `ok`, `warning` or `problem`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warning => "warning",
            Level::Problem => "problem",
        }
    }
}

/// One thing `doctor` found: a level, the check that found it, a sentence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// How bad it is.
    pub level: Level,
    /// The check that found it, e.g. `nic` or `cni-version`.
    pub check: &'static str,
    /// One plain sentence.
    pub message: String,
}

impl Finding {
    /// A finding of `level` from `check`.
    pub(crate) fn new(level: Level, check: &'static str, message: impl Into<String>) -> Self {
        Self {
            level,
            check,
            message: message.into(),
        }
    }

    /// An `ok` finding.
    pub(crate) fn ok(check: &'static str, message: impl Into<String>) -> Self {
        Self::new(Level::Ok, check, message)
    }

    /// A `warning` finding.
    pub(crate) fn warning(check: &'static str, message: impl Into<String>) -> Self {
        Self::new(Level::Warning, check, message)
    }

    /// A `problem` finding.
    pub(crate) fn problem(check: &'static str, message: impl Into<String>) -> Self {
        Self::new(Level::Problem, check, message)
    }
}

impl fmt::Display for Finding {
    /// `problem  lower NIC eth1 is down ...`: the level, padded, then the sentence.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<8} {}", self.level.as_str(), self.message)
    }
}

/// Whether any finding is a problem (`doctor` then exits 1).
pub fn has_problem(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.level == Level::Problem)
}

/// The findings one per line, as [`Finding`] shows them.
pub fn render_text(findings: &[Finding]) -> String {
    findings.iter().map(|f| format!("{f}\n")).collect()
}

/// The findings as a JSON array of `{"level","check","message"}` objects.
pub fn render_json(findings: &[Finding]) -> String {
    serde_json::to_string_pretty(findings).unwrap_or_else(|e| failure_json(&e.to_string()))
}

/// The JSON answer when the findings cannot be written: one problem whose
/// message is `message`, escaped as JSON escapes a string (a `Value` always
/// serializes).
fn failure_json(message: &str) -> String {
    serde_json::json!([{"level": "problem", "check": "doctor", "message": message}]).to_string()
}

/// What `doctor` checks besides the daemon's options.
#[derive(Debug, Clone)]
pub struct Target {
    /// The host's CNI bin dir; `None` looks in `cni::CNI_BIN_DIRS`.
    pub cni_bin_dir: Option<PathBuf>,
    /// The CNI's file name there.
    pub cni_name: String,
    /// Where `/dev` is (tap nodes appear there).
    pub dev_dir: PathBuf,
    /// Where procfs is mounted (`/proc`).
    pub proc_dir: PathBuf,
}

/// Reads the node as `opts` and `target` describe it and runs every check,
/// in the order an operator reads them.
pub async fn run(opts: &Options, target: &Target) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(kernel::check_module(&opts.sysfs, &target.proc_dir));
    let mountinfo =
        std::fs::read_to_string(target.proc_dir.join("self/mountinfo")).unwrap_or_default();
    out.push(kernel::check_dev(&target.dev_dir, &mountinfo));
    out.extend(kubelet::check_kubelet(opts));
    out.push(record::check_record_dir(
        &opts.plugin_dir(),
        nix::unistd::geteuid().as_raw(),
    ));
    let allocated = kubelet::list_allocated(opts).await;
    let resources = resources::gather(opts, allocated.as_ref().ok()).await;
    out.extend(resources.findings);
    if let Err(e) = &allocated {
        // The socket's own finding above says whether that is a problem.
        out.push(Finding::warning(
            "pod-resources",
            format!("which devices pods hold, and which links leaked, is unknown: {e}"),
        ));
    }
    out.extend(kubelet::check_registration(opts, &resources.configs));
    match cni::find_bin_dir(target.cni_bin_dir.as_deref(), &cni::CNI_BIN_DIRS) {
        Ok(dir) => out.extend(cni::check_cni(opts, &dir, &target.cni_name)),
        Err(finding) => out.push(finding),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_json_escapes_its_message() {
        let message = "a \"quoted\" name, a back\\slash\nand a new line";
        let v: serde_json::Value = serde_json::from_str(&failure_json(message)).unwrap();
        assert_eq!(v[0]["level"], "problem");
        assert_eq!(v[0]["check"], "doctor");
        assert_eq!(v[0]["message"], message);
    }

    #[test]
    fn text_and_json_say_the_same() {
        let f = [
            Finding::ok("nic", "NIC eth1 is up"),
            Finding::problem("cni", "no CNI"),
        ];
        assert_eq!(
            render_text(&f),
            "ok       NIC eth1 is up\nproblem  no CNI\n"
        );
        let v: serde_json::Value = serde_json::from_str(&render_json(&f)).unwrap();
        assert_eq!(v[1]["level"], "problem");
        assert_eq!(v[1]["check"], "cni");
        assert_eq!(v[0]["message"], "NIC eth1 is up");
        assert!(has_problem(&f));
        assert!(!has_problem(&f[..1]));
    }
}
