//! The macvtap CNI plugin.
//!
//! Multus runs this plugin (`"type": "macvtap"`) during pod sandbox set-up
//! with the device ID that the macvtap device plugin allocated to the pod
//! (or, when the device was allocated through Dynamic Resource Allocation,
//! without one: the plugin then asks the kubelet which device the pod holds,
//! `dra.rs`). The plugin finds the macvtap link the device plugin created
//! for that ID in the host namespace, moves it into the pod, configures it,
//! gives `/dev/tapN` to the VM's user and optionally runs IPAM. See
//! `ARCHITECTURE.md`.
//!
//! [`run`] is the whole plugin as a function of its environment and stdin;
//! `main.rs` only wires it to the process.

pub(crate) mod add;
pub(crate) mod args;
pub(crate) mod backoff;
pub(crate) mod check;
pub mod config;
#[cfg(test)]
mod crash_tests;
pub(crate) mod del;
pub(crate) mod dra;
#[cfg(test)]
mod dra_tests;
pub(crate) mod env;
pub mod error;
pub mod escape;
pub(crate) mod give_back;
pub(crate) mod ipam;
pub mod logfile;
pub mod podresources;
pub(crate) mod result;
#[cfg(test)]
mod rollback_tests;
pub mod settings;
pub(crate) mod status;
pub mod stdin;
pub(crate) mod tap;
pub mod version;

use env::{CniEnv, Command};
use error::{Error, Result};
use macvtap_link::Kernel;
use serde_json::{Value, json};
use settings::NodeSettings;
use std::collections::HashMap;
use stdin::Stdin;
use version::{LATEST, SUPPORTED_VERSIONS, Version};

/// What the process prints and how it exits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Text for stdout (a result, a version report or an error), if any.
    pub stdout: Option<String>,
    /// Exit status: 0 on success, 1 on error.
    pub exit_code: i32,
}

/// Runs one plugin invocation with environment `vars` and `stdin`, with the
/// node settings found from `vars` (see [`settings`]).
pub fn run(vars: &HashMap<String, String>, stdin: &[u8]) -> Outcome {
    run_with(&settings::load(vars), vars, &Stdin::decode(stdin))
}

/// [`run`] with node settings already loaded and stdin decoded.
pub fn run_with(settings: &NodeSettings, vars: &HashMap<String, String>, stdin: &Stdin) -> Outcome {
    run_decoded_on(&macvtap_link::Linux, settings, vars, stdin)
}

/// [`run_with`] against `kernel` (the real one, or the fake in unit
/// tests), with stdin as read.
pub fn run_on(
    kernel: &dyn Kernel,
    settings: &NodeSettings,
    vars: &HashMap<String, String>,
    stdin: &[u8],
) -> Outcome {
    run_decoded_on(kernel, settings, vars, &Stdin::decode(stdin))
}

/// [`run_on`] with stdin decoded.
fn run_decoded_on(
    kernel: &dyn Kernel,
    settings: &NodeSettings,
    vars: &HashMap<String, String>,
    stdin: &Stdin,
) -> Outcome {
    match dispatch(kernel, settings, vars, stdin) {
        Ok(stdout) => Outcome {
            stdout,
            exit_code: 0,
        },
        Err(e) => {
            tracing::error!(code = e.code(), "{e}");
            Outcome {
                stdout: Some(error_json(&e, stdin).to_string()),
                exit_code: 1,
            }
        }
    }
}

fn dispatch(
    kernel: &dyn Kernel,
    settings: &NodeSettings,
    vars: &HashMap<String, String>,
    stdin: &Stdin,
) -> Result<Option<String>> {
    if vars.get("CNI_COMMAND").map(String::as_str) == Some("VERSION") {
        return Ok(Some(version_report(stdin).to_string()));
    }
    let env = CniEnv::from_vars(vars)?;
    let conf = stdin.net_conf()?;
    tracing::debug!(
        command = env.command.as_str(),
        container = %env.container_id,
        pod = %env.args.pod_ref(),
        ifname = %env.ifname,
        netns = %env.netns,
        "invoked"
    );
    if let Some(problem) = &settings.problem {
        if env.command == Command::Add {
            // The settings hold the ownership check: never fall back silently.
            return Err(Error::NodeSettings(problem.clone()));
        }
        tracing::warn!("{problem}; using the defaults");
    }
    // Delegated IPAM plugins get the configuration as it was written.
    let bytes = stdin.bytes();
    match env.command {
        Command::Add => {
            let result = add::add(kernel, &env, &conf, settings, bytes)?;
            Ok(Some(result.to_value(conf.version).to_string()))
        }
        Command::Del => del::del(kernel, &env, &conf, settings, bytes).map(|()| None),
        Command::Check => check::check(kernel, &env, &conf, bytes).map(|()| None),
        Command::Status => {
            status::status(&env, &conf, settings.problem.as_deref(), bytes).map(|()| None)
        }
        Command::Gc => status::gc(&env, &conf, stdin).map(|()| None),
        Command::Version => Ok(Some(version_report(stdin).to_string())),
    }
}

/// The VERSION answer, in the requested version when we speak it.
fn version_report(stdin: &Stdin) -> Value {
    let asked = stdin
        .requested_version()
        .filter(|v| Version::parse(v).is_ok());
    json!({
        "cniVersion": asked.unwrap_or(LATEST),
        "supportedVersions": SUPPORTED_VERSIONS,
    })
}

/// The spec's error object for `e`, answering a request of `stdin`.
pub fn error_json(e: &Error, stdin: &Stdin) -> Value {
    // Echo the request's version only when it is one we know: an error must
    // not carry arbitrary input in a field its reader trusts.
    let version = stdin
        .requested_version()
        .filter(|v| Version::parse(v).is_ok())
        .unwrap_or(LATEST);
    let msg = match e {
        Error::TryAgain(inner) => inner.to_string(),
        other => other.to_string(),
    };
    // The runtime logs this message: whatever it quotes stays on one line.
    let msg = escape::escape_controls(&msg).into_owned();
    let mut out = json!({ "cniVersion": version, "code": e.code(), "msg": msg });
    if let Error::TryAgain(_) = e {
        out["details"] = Value::from("everything was rolled back; a retry may succeed");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::vars;

    #[test]
    fn version_lists_every_supported_version() {
        let out = run(
            &vars(&[("CNI_COMMAND", "VERSION")]),
            br#"{"cniVersion":"0.4.0"}"#,
        );
        assert_eq!(out.exit_code, 0);
        let v: Value = serde_json::from_str(&out.stdout.unwrap()).unwrap();
        assert_eq!(v["cniVersion"], "0.4.0");
        assert_eq!(v["supportedVersions"].as_array().unwrap().len(), 7);
        assert_eq!(v["supportedVersions"][0], "0.1.0");
        assert_eq!(v["supportedVersions"][1], "0.2.0");
        let old = run(
            &vars(&[("CNI_COMMAND", "VERSION")]),
            br#"{"cniVersion":"0.2.0"}"#,
        );
        let v: Value = serde_json::from_str(&old.stdout.unwrap()).unwrap();
        assert_eq!(v["cniVersion"], "0.2.0");
        let empty = run(&vars(&[("CNI_COMMAND", "VERSION")]), b"");
        assert!(empty.stdout.unwrap().contains("\"1.1.0\""));
    }

    #[test]
    fn errors_are_spec_json_with_exit_1() {
        let out = run(
            &vars(&[("CNI_COMMAND", "DEL")]),
            br#"{"cniVersion":"0.3.1"}"#,
        );
        assert_eq!(out.exit_code, 1);
        let v: Value = serde_json::from_str(&out.stdout.unwrap()).unwrap();
        assert_eq!(v["code"], 4);
        assert_eq!(v["cniVersion"], "0.3.1");
        assert!(v["msg"].as_str().unwrap().contains("CNI_IFNAME"));
    }

    #[test]
    fn status_and_gc_need_1_1_and_check_needs_0_4() {
        let conf = |v: &str| format!(r#"{{"cniVersion":"{v}","name":"n","type":"macvtap"}}"#);
        let code = |cmd: &str, v: &str| {
            let out = run(
                &vars(&[
                    ("CNI_COMMAND", cmd),
                    ("CNI_CONTAINERID", "c"),
                    ("CNI_IFNAME", "net1"),
                    ("CNI_NETNS", "/nonexistent"),
                ]),
                conf(v).as_bytes(),
            );
            out.stdout
                .map(|s| {
                    serde_json::from_str::<Value>(&s).unwrap()["code"]
                        .as_u64()
                        .unwrap()
                })
                .unwrap_or(0)
        };
        assert_eq!(code("STATUS", "1.0.0"), 1);
        assert_eq!(code("GC", "0.4.0"), 1);
        assert_eq!(code("CHECK", "0.3.1"), 1);
        assert_eq!(code("STATUS", "1.1.0"), 0);
    }

    #[test]
    fn status_reports_a_broken_node_settings_file_as_not_available() {
        let env = vars(&[("CNI_COMMAND", "STATUS")]);
        let mut settings = NodeSettings::defaults(&env);
        settings.problem =
            Some("node settings file /opt/cni/bin/macvtap.settings.json: bad JSON".into());
        let out = run_with(
            &settings,
            &env,
            &Stdin::decode(br#"{"cniVersion":"1.1.0","name":"n","type":"macvtap"}"#),
        );
        assert_eq!(out.exit_code, 1);
        let v: Value = serde_json::from_str(&out.stdout.unwrap()).unwrap();
        assert_eq!(v["code"], 50, "{v}");
        assert!(v["msg"].as_str().unwrap().contains("bad JSON"), "{v}");
    }

    #[test]
    fn gc_without_attachments_is_refused_when_ipam_would_run() {
        let out = run(
            &vars(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/usr/lib/cni")]),
            br#"{"cniVersion":"1.1.0","name":"n","type":"macvtap","ipam":{"type":"host-local"}}"#,
        );
        let v: Value = serde_json::from_str(&out.stdout.unwrap()).unwrap();
        assert_eq!(v["code"], 7, "{v}");
    }

    #[test]
    fn add_without_device_id_says_why() {
        let out = run(
            &vars(&[
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "c"),
                ("CNI_IFNAME", "net1"),
                ("CNI_NETNS", "/nonexistent"),
            ]),
            br#"{"cniVersion":"1.0.0","name":"n","type":"macvtap"}"#,
        );
        let v: Value = serde_json::from_str(&out.stdout.unwrap()).unwrap();
        assert_eq!(v["code"], 100);
        assert!(v["msg"].as_str().unwrap().contains("resourceName"));
    }
}
