//! What a namespace user controls (a NetworkAttachmentDefinition's config, a
//! pod's network-selection annotation, hence `CNI_IFNAME` and `CNI_ARGS`)
//! cannot reach outside the pod's own link and tap: `logFile` stays in the
//! node's log directory, and no input starts a log line or forges one.
//! Needs root (each test runs the real plugin inside a fresh node namespace).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{CniRun, Sandbox, netconf};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What every hostile value carries after a newline: no output line may
/// start with it.
const MARK: &str = "INJECTED";

/// A value that tries to start a log line, move the cursor and clear the
/// screen, and fake a line break three ways.
fn hostile(prefix: &str) -> String {
    format!("{prefix}\n{MARK} forged\r{MARK}\x1b[2J\u{85}\u{2028}end")
}

/// A temporary home with an `authorized_keys` and a root-only log directory.
struct Files {
    tmp: tempfile::TempDir,
}

const ADMIN_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIadmin admin@node\n";

impl Files {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let ssh = tmp.path().join("home/.ssh");
        std::fs::create_dir_all(&ssh).unwrap();
        std::fs::write(ssh.join("authorized_keys"), ADMIN_KEY).unwrap();
        std::fs::create_dir(tmp.path().join("log")).unwrap();
        std::fs::set_permissions(
            tmp.path().join("log"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        Files { tmp }
    }

    fn keys(&self) -> PathBuf {
        self.tmp.path().join("home/.ssh/authorized_keys")
    }

    fn log_dir(&self) -> PathBuf {
        self.tmp.path().join("log")
    }

    fn log(&self) -> PathBuf {
        self.log_dir().join("macvtap.log")
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("MACVTAP_CNI_LOG_DIR", self.log_dir().display().to_string()),
            ("MACVTAP_CNI_LOG_LEVEL", "debug".to_string()),
        ]
    }
}

fn run(sb: &Sandbox, cmd: &str, conf: &Value, env: &[(&'static str, String)]) -> CniRun {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    sb.cni(cmd, conf, &env)
}

/// No raw control character (but the newlines that end lines) and no line
/// that starts with the mark.
fn assert_clean(what: &str, text: &str) {
    let raw: Vec<char> = text
        .chars()
        .filter(|&c| c != '\n' && (c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')))
        .collect();
    assert!(
        raw.is_empty(),
        "{what} has raw control characters {raw:?}: {text:?}"
    );
    for line in text.lines() {
        assert!(
            !line.starts_with(MARK) && !line.starts_with("ssh-"),
            "{what} has a forged line {line:?} in {text:?}"
        );
    }
}

/// The plugin's stderr, its log file and its error message are all clean,
/// and the hostile value did reach the log (escaped), so the check meant
/// something.
fn assert_all_clean(files: &Files, run: &CniRun) {
    assert_clean("stderr", &run.stderr);
    let log = files.log_text();
    assert_clean("the log file", &log);
    if run.code != 0 {
        let msg = run.json()["msg"].as_str().unwrap().to_string();
        assert_clean("the error message", &msg);
    }
    assert!(
        log.contains(&format!("\\n{MARK}")),
        "the hostile value never reached the log file, so nothing was tested: {log:?} / {}",
        run.stderr
    );
}

#[test]
fn a_nad_cannot_append_to_authorized_keys() {
    let sb = Sandbox::new();
    let files = Files::new();
    let mut conf = netconf("1.0.0", "x\nssh-ed25519 AAAAattacker attacker@evil");
    conf["logFile"] = json!(files.keys());
    let out = run(&sb, "ADD", &conf, &files.env());
    out.fails_with(101);
    assert_eq!(std::fs::read_to_string(files.keys()).unwrap(), ADMIN_KEY);
    assert_eq!(
        out.stderr.matches("is not used").count(),
        1,
        "one warning: {}",
        out.stderr
    );
    assert_clean("stderr", &out.stderr);
    assert!(!files.log().exists());
}

#[test]
fn without_a_log_dir_setting_only_the_default_directory_is_accepted() {
    let sb = Sandbox::new();
    let files = Files::new();
    let mut conf = netconf("1.0.0", "eth0Mvp0");
    conf["logFile"] = json!(files.keys());
    let out = sb.cni("ADD", &conf, &[]);
    out.fails_with(101);
    assert!(
        out.stderr.contains("/var/log/macvtap-cni"),
        "{}",
        out.stderr
    );
    assert_eq!(std::fs::read_to_string(files.keys()).unwrap(), ADMIN_KEY);
}

#[test]
fn a_symlinked_log_file_is_not_followed() {
    let sb = Sandbox::new();
    let files = Files::new();
    std::os::unix::fs::symlink(files.keys(), files.log()).unwrap();
    let mut conf = netconf("1.0.0", "x\nssh-ed25519 AAAAattacker attacker@evil");
    conf["logFile"] = json!(files.log());
    let out = run(&sb, "ADD", &conf, &files.env());
    out.fails_with(101);
    assert!(out.stderr.contains("symbolic link"), "{}", out.stderr);
    assert_eq!(std::fs::read_to_string(files.keys()).unwrap(), ADMIN_KEY);
    // Relative names resolve in the log directory too, and the same way.
    conf["logFile"] = json!("macvtap.log");
    run(&sb, "ADD", &conf, &files.env()).fails_with(101);
    assert_eq!(std::fs::read_to_string(files.keys()).unwrap(), ADMIN_KEY);
}

#[test]
fn log_files_outside_the_directory_are_refused() {
    let sb = Sandbox::new();
    let files = Files::new();
    let mut conf = netconf("1.0.0", "eth0Mvp0");
    for path in [
        format!("{}/../escape.log", files.log_dir().display()),
        "../escape.log".to_string(),
        files.tmp.path().join("escape.log").display().to_string(),
    ] {
        conf["logFile"] = json!(path);
        let out = run(&sb, "ADD", &conf, &files.env());
        out.fails_with(101);
        assert!(out.stderr.contains("is not used"), "{path}: {}", out.stderr);
        assert!(!files.tmp.path().join("escape.log").exists(), "{path}");
    }
}

#[test]
fn an_accepted_log_file_is_0600_and_holds_escaped_lines() {
    let sb = Sandbox::new();
    let files = Files::new();
    let mut conf = netconf("1.0.0", "x\nssh-ed25519 AAAAattacker attacker@evil");
    conf["logFile"] = json!(files.log());
    let out = run(&sb, "ADD", &conf, &files.env());
    out.fails_with(101);
    let mode = std::fs::metadata(files.log()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let log = files.log_text();
    assert!(log.contains("x\\nssh-ed25519 AAAAattacker"), "{log}");
    assert_clean("the log file", &log);
    assert_clean("stderr", &out.stderr);
}

#[test]
fn a_hostile_device_id_and_network_name_stay_on_their_line() {
    let sb = Sandbox::new();
    let files = Files::new();
    let mut conf = netconf("1.0.0", &hostile("dev"));
    conf["logFile"] = json!(files.log());
    let out = run(&sb, "ADD", &conf, &files.env());
    out.fails_with(101);
    assert_all_clean(&files, &out);

    // A name is logged when the link moves: that ADD must succeed.
    std::fs::remove_file(files.log()).unwrap();
    sb.allocate("eth0Mvp0");
    let mut conf = netconf("1.0.0", "eth0Mvp0");
    conf["name"] = json!(hostile("net"));
    conf["logFile"] = json!(files.log());
    let out = run(&sb, "ADD", &conf, &files.env());
    out.ok();
    assert_all_clean(&files, &out);
}

#[test]
fn hostile_environment_values_stay_on_their_line() {
    let sb = Sandbox::new();
    let files = Files::new();
    let mut conf = netconf("1.0.0", "eth0Mvp0");
    conf["logFile"] = json!(files.log());
    // (command, variable, value, expected error code or None for success)
    let cases: Vec<(&str, &'static str, String, Option<u64>)> = vec![
        ("ADD", "CNI_IFNAME", hostile("n"), Some(4)),
        ("ADD", "CNI_CONTAINERID", hostile("c"), Some(4)),
        ("ADD", "CNI_ARGS", format!("{}=1", hostile("KEY")), Some(4)),
        (
            "ADD",
            "CNI_ARGS",
            format!("IgnoreUnknown=true;MAC={}", hostile("02:00:00:00:00:01")),
            Some(7),
        ),
        ("ADD", "CNI_COMMAND", hostile("ADD"), Some(4)),
        (
            "DEL",
            "CNI_ARGS",
            format!("K8S_POD_NAMESPACE={};K8S_POD_NAME=vm", hostile("ns")),
            None,
        ),
        // DEL logs the namespace path it could not find.
        (
            "DEL",
            "CNI_NETNS",
            format!("/run/netns/{}", hostile("gone")),
            None,
        ),
    ];
    for (cmd, var, value, code) in cases {
        std::fs::remove_file(files.log()).ok();
        let mut env = files.env();
        env.push((var, value));
        let out = run(&sb, cmd, &conf, &env);
        match code {
            Some(code) => {
                out.fails_with(code);
            }
            None => {
                out.ok();
            }
        }
        assert_all_clean(&files, &out);
    }
}

#[test]
fn serde_errors_quoting_input_stay_on_their_line() {
    let sb = Sandbox::new();
    let files = Files::new();
    let log = files.log().display().to_string();
    for (field, value, code) in [
        ("mtu", json!(hostile("m")), 7),
        ("cniVersion", json!(hostile("1.0.0")), 1),
        ("ipam", json!({ "type": hostile("../host-local") }), 7),
        ("mac", json!(hostile("02")), 7),
    ] {
        std::fs::remove_file(files.log()).ok();
        let mut conf = netconf("1.0.0", "eth0Mvp0");
        conf["logFile"] = json!(log);
        conf[field] = value;
        let out = run(&sb, "ADD", &conf, &files.env());
        out.fails_with(code);
        assert_all_clean(&files, &out);
        assert_ne!(
            out.json()["cniVersion"].as_str(),
            Some(hostile("1.0.0").as_str())
        );
    }
}

#[test]
fn ipam_output_stays_on_its_line() {
    let sb = Sandbox::new();
    let files = Files::new();
    let plugin = files.tmp.path().join("loud-ipam");
    // Prints a hostile line on stderr and a hostile error message.
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\ncat >/dev/null\nprintf 'ipam says\\n{MARK} stderr\\033[2J\\n' >&2\n\
             printf '{{\"cniVersion\":\"1.1.0\",\"code\":50,\"msg\":\"no\\\\n{MARK} msg\",\
             \"details\":\"d\\\\r\\\\n{MARK} details\"}}'\nexit 1\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut conf = netconf("1.1.0", "");
    conf["ipam"] = json!({"type": "loud-ipam"});
    conf["logFile"] = json!(files.log());
    let mut env = files.env();
    env.push(("CNI_PATH", files.tmp.path().display().to_string()));
    let out = run(&sb, "STATUS", &conf, &env);
    let msg = out.fails_with(50);
    assert!(msg.contains(&format!("no\\n{MARK} msg")), "{msg}");
    assert_all_clean(&files, &out);
    assert!(
        files
            .log_text()
            .contains(&format!("IPAM plugin stderr: {MARK} stderr")),
        "the IPAM plugin's stderr is logged, escaped: {}",
        files.log_text()
    );
}

#[test]
fn a_non_regular_log_file_is_refused() {
    let sb = Sandbox::new();
    let files = Files::new();
    nix::unistd::mkfifo(
        &files.log(),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let mut conf = netconf("1.0.0", "eth0Mvp0");
    conf["logFile"] = json!(files.log());
    // Must not block on the FIFO: the run returns and says why.
    let out = run(&sb, "ADD", &conf, &files.env());
    out.fails_with(101);
    assert!(out.stderr.contains("FIFO"), "{}", out.stderr);
    assert!(Path::new(&files.log()).exists());
}
