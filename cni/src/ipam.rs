//! Delegation to an IPAM plugin, executed from `CNI_PATH` as the spec says:
//! same environment (with the command set), the network config on stdin.

use crate::env::{CniEnv, Command};
use crate::error::{CODE_IPAM_NO_ERROR_JSON, Error, Result};
use serde_json::Value;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Stdio;

/// Finds `plugin` in the `CNI_PATH` directories.
pub(crate) fn find_plugin(env: &CniEnv, plugin: &str) -> Result<PathBuf> {
    env.path
        .iter()
        .map(|dir| dir.join(plugin))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(|| Error::Io {
            what: format!(
                "finding IPAM plugin {plugin:?} in CNI_PATH [{}]",
                env.path
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":")
            ),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })
}

/// Runs IPAM plugin `plugin` with `command` and `stdin`; returns its parsed
/// stdout, if it printed anything. A failure keeps the plugin's own code.
pub(crate) fn exec(
    env: &CniEnv,
    plugin: &str,
    command: Command,
    stdin: &[u8],
) -> Result<Option<Value>> {
    let path = find_plugin(env, plugin)?;
    let io_err = |what: &str, source| Error::Io {
        what: format!("{what} IPAM plugin {}", path.display()),
        source,
    };
    let cni_path = std::env::join_paths(&env.path).map_err(|e| Error::Io {
        what: format!("passing CNI_PATH to IPAM plugin {}", path.display()),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
    })?;
    // The spec hands IPAM the plugin's own environment; the variables that
    // were read are set from what was read, the rest (CNI_ARGS) inherited.
    let mut child = std::process::Command::new(&path)
        .env("CNI_COMMAND", command.as_str())
        .env("CNI_CONTAINERID", &env.container_id)
        .env("CNI_NETNS", &env.netns)
        .env("CNI_IFNAME", &env.ifname)
        .env("CNI_PATH", cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // Its stderr is logged line by line through our (escaping) logger
        // rather than passed on raw: it may quote the NetConf.
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| io_err("starting", e))?;
    // Stdin is written beside the reading of stdout and stderr, so a plugin
    // that prints before it has read everything cannot block us. A plugin
    // that exits without reading it all (say, on a bad environment) closes
    // the pipe: like Go's os/exec (`skipStdinCopyError`, exec_unix.go), which
    // libcni's invoke uses, EPIPE is not an error and its exit status and
    // output speak for it.
    let input = child.stdin.take();
    let (written, out) = std::thread::scope(|s| {
        let writer = s.spawn(move || match input {
            Some(mut pipe) => match pipe.write_all(stdin) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                other => other,
            },
            None => Ok(()),
        });
        let out = child.wait_with_output();
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the stdin writer panicked")));
        (written, out)
    });
    let out = out.map_err(|e| io_err("waiting for", e))?;
    written.map_err(|e| io_err("writing to", e))?;
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        tracing::warn!(
            plugin,
            command = command.as_str(),
            "IPAM plugin stderr: {line}"
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let parsed: Option<Value> = if text.trim().is_empty() {
        None
    } else {
        serde_json::from_str(&text).ok()
    };
    if out.status.success() {
        return match parsed {
            Some(v) => Ok(Some(v)),
            None if text.trim().is_empty() => Ok(None),
            None => Err(Error::Ipam {
                plugin: plugin.to_string(),
                code: CODE_IPAM_NO_ERROR_JSON,
                msg: format!(
                    "{} printed output that is not JSON: {text:?}",
                    command.as_str()
                ),
            }),
        };
    }
    let (code, mut msg) = match &parsed {
        Some(v) => {
            let code = v
                .get("code")
                .and_then(Value::as_u64)
                .and_then(|c| u32::try_from(c).ok())
                .unwrap_or(CODE_IPAM_NO_ERROR_JSON);
            let mut msg = v
                .get("msg")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if let Some(d) = v
                .get("details")
                .and_then(Value::as_str)
                .filter(|d| !d.is_empty())
            {
                msg = format!("{msg}: {d}");
            }
            (code, msg)
        }
        None => (
            CODE_IPAM_NO_ERROR_JSON,
            format!("exited with {} and no error JSON: {text:?}", out.status),
        ),
    };
    if let Some(fix) = hint(&path, plugin, &msg) {
        msg = format!("{msg} ({fix})");
    }
    Err(Error::Ipam {
        plugin: plugin.to_string(),
        code,
        msg: format!("{} failed: {msg}", command.as_str()),
    })
}

/// The fix for a failure whose usual cause is known: the reference `dhcp`
/// plugin only talks to its daemon, which someone has to start on the node.
fn hint(path: &std::path::Path, plugin: &str, msg: &str) -> Option<String> {
    let no_daemon = msg.contains("error dialing DHCP daemon") || msg.contains("dhcp.sock");
    (plugin == "dhcp" && no_daemon).then(|| {
        format!(
            "the dhcp IPAM plugin needs its daemon on the node: start `{} daemon`",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_dhcp_daemon_names_the_fix() {
        let msg = "error dialing DHCP daemon: dial unix /run/cni/dhcp.sock: connect: no such file or directory";
        let fix = hint(std::path::Path::new("/opt/cni/bin/dhcp"), "dhcp", msg).unwrap();
        assert!(fix.contains("start `/opt/cni/bin/dhcp daemon`"), "{fix}");
        assert_eq!(
            hint(std::path::Path::new("/x/dhcp"), "dhcp", "no lease"),
            None
        );
        assert_eq!(hint(std::path::Path::new("/x/static"), "static", msg), None);
    }

    /// An environment whose `CNI_PATH` is `dir`, with `plugin` there as
    /// a shell script of `body`.
    fn env_with(dir: &std::path::Path, plugin: &str, body: &str) -> CniEnv {
        let path = dir.join(plugin);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        CniEnv {
            command: Command::Add,
            container_id: "c1".into(),
            netns: "/var/run/netns/x".into(),
            ifname: "net1".into(),
            args: Default::default(),
            path: vec![dir.to_path_buf()],
        }
    }

    /// A NetConf far bigger than a pipe's buffer, so a writer that is not
    /// read from meets the closed pipe or waits, rather than winning a race.
    fn big_stdin() -> Vec<u8> {
        format!("{{\"pad\":\"{}\"}}", "x".repeat(1 << 20)).into_bytes()
    }

    #[test]
    fn a_plugin_that_fails_before_reading_stdin_is_heard() {
        let dir = tempfile::tempdir().unwrap();
        let env = env_with(
            dir.path(),
            "early",
            r#"exec 0<&-
echo '{"cniVersion":"1.0.0","code":11,"msg":"busy","details":"try later"}'
exit 1"#,
        );
        match exec(&env, "early", Command::Add, &big_stdin()) {
            Err(Error::Ipam { code, msg, .. }) => {
                assert_eq!(code, 11, "{msg}");
                assert_eq!(msg, "ADD failed: busy: try later");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_plugin_that_prints_before_reading_stdin_does_not_hang() {
        let dir = tempfile::tempdir().unwrap();
        // Prints more than a pipe holds, then reads all its input.
        let env = env_with(
            dir.path(),
            "chatty",
            r#"head -c 200000 /dev/zero | tr '\0' 'y' >&2
n=$(wc -c)
echo "{\"cniVersion\":\"1.0.0\",\"read\":$n}""#,
        );
        let stdin = big_stdin();
        let out = exec(&env, "chatty", Command::Add, &stdin).unwrap().unwrap();
        assert_eq!(out["read"], stdin.len());
    }
}
