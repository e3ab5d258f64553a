//! The outside tools the tests call, which `hack/setup.sh` installs into one
//! Python virtual environment: the Prometheus client's exposition-format
//! parser and a recent `kubectl` (for `kubectl kustomize`). A test that
//! needs one and does not find it fails, naming the set-up step.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Where `hack/setup.sh` puts the virtual environment unless `MACVTAP_VENV`
/// says otherwise.
pub const DEFAULT_VENV: &str = "/opt/macvtap-rs/venv";

/// The virtual environment's directory.
pub fn venv() -> PathBuf {
    std::env::var_os("MACVTAP_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_VENV))
}

/// The path of `bin/<name>` in the virtual environment; panics (the test
/// fails, it is not skipped) when it is not there.
pub fn venv_tool(name: &str) -> PathBuf {
    let path = venv().join("bin").join(name);
    if !path.is_file() {
        panic!(
            "{} is missing: run hack/setup.sh (as root) to install the test tools' \
             virtual environment, or point MACVTAP_VENV at one",
            path.display()
        );
    }
    path
}

/// Parses a text exposition (Prometheus 0.0.4) with `prometheus_client`'s
/// parser and returns its families as JSON (`name`, `type`, `help`,
/// `samples` with `name`, `labels`, `value`), or the parser's error.
pub fn parse_exposition(text: &str) -> Result<serde_json::Value, String> {
    run_parser("prometheus_client.parser", text)
}

/// Parses an OpenMetrics text page with `prometheus_client`'s OpenMetrics
/// parser (strict: `# EOF`, `_total` counter samples) and returns its
/// families as [`parse_exposition`] does, or the parser's error.
pub fn parse_openmetrics(text: &str) -> Result<serde_json::Value, String> {
    run_parser("prometheus_client.openmetrics.parser", text)
}

/// Runs `text_string_to_metric_families` of the Python module `module` on
/// `text`.
fn run_parser(module: &str, text: &str) -> Result<serde_json::Value, String> {
    let script = format!(
        r#"
import json, math, sys
from {module} import text_string_to_metric_families
out = []
for f in text_string_to_metric_families(sys.stdin.read()):
    out.append({{
        "name": f.name, "type": f.type, "help": f.documentation,
        "samples": [{{"name": s.name, "labels": s.labels,
                     "value": s.value if math.isfinite(s.value) else str(s.value)}}
                    for s in f.samples],
    }})
print(json.dumps(out))
"#
    );
    let mut child = Command::new(venv_tool("python3"))
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the parser: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| format!("feeding the parser: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for the parser: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("reading the parser's output: {e}"))
}
