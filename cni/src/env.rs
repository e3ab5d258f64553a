//! The `CNI_*` environment variables a runtime passes to a plugin.

use crate::args::CniArgs;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::PathBuf;

/// A CNI command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    /// Attach the link to the container.
    Add,
    /// Detach and remove it.
    Del,
    /// Verify the attachment.
    Check,
    /// Report supported versions.
    Version,
    /// Report readiness (1.1.0).
    Status,
    /// Garbage-collect stale resources (1.1.0).
    Gc,
}

impl Command {
    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            other => {
                return Err(Error::InvalidEnv {
                    var: "CNI_COMMAND",
                    msg: format!(
                        "unknown command {other:?} (expected ADD, DEL, CHECK, VERSION, STATUS or GC)"
                    ),
                });
            }
        })
    }

    /// The command as the runtime spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Status => "STATUS",
            Command::Gc => "GC",
        }
    }
}

/// The parsed environment of one plugin invocation.
#[derive(Debug, Clone)]
pub(crate) struct CniEnv {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID` (empty for VERSION, STATUS and GC).
    pub container_id: String,
    /// `CNI_NETNS`; may be empty for DEL.
    pub netns: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS`, parsed.
    pub args: CniArgs,
    /// `CNI_PATH`, split on `:`.
    pub path: Vec<PathBuf>,
}

impl CniEnv {
    /// Reads and checks the variables `command` needs from `vars`.
    pub(crate) fn from_vars(vars: &HashMap<String, String>) -> Result<Self> {
        let get = |k: &str| vars.get(k).map(String::as_str).unwrap_or("");
        let required = |var: &'static str| -> Result<String> {
            let v = get(var);
            if v.is_empty() {
                return Err(Error::InvalidEnv {
                    var,
                    msg: "required but not set".into(),
                });
            }
            Ok(v.to_string())
        };
        let command = Command::parse(&required("CNI_COMMAND")?)?;
        let per_container = matches!(command, Command::Add | Command::Del | Command::Check);
        let (container_id, ifname) = if per_container {
            let ifname = required("CNI_IFNAME")?;
            check_ifname(&ifname)?;
            let id = required("CNI_CONTAINERID")?;
            check_container_id(&id)?;
            (id, ifname)
        } else {
            (
                get("CNI_CONTAINERID").to_string(),
                get("CNI_IFNAME").to_string(),
            )
        };
        let netns = if matches!(command, Command::Add | Command::Check) {
            required("CNI_NETNS")?
        } else {
            get("CNI_NETNS").to_string()
        };
        let args = CniArgs::parse(get("CNI_ARGS"))?;
        let path = get("CNI_PATH")
            .split(':')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect();
        Ok(Self {
            command,
            container_id,
            netns,
            ifname,
            args,
            path,
        })
    }
}

impl CniEnv {
    /// Opens `CNI_NETNS`; a namespace that cannot be opened means the
    /// container is unknown (code 3).
    pub(crate) fn open_netns(
        &self,
        kernel: &dyn macvtap_link::Kernel,
    ) -> Result<macvtap_link::Netns> {
        kernel
            .open_netns(std::path::Path::new(&self.netns))
            .map_err(|source| Error::ContainerUnknown {
                netns: self.netns.clone(),
                container_id: self.container_id.clone(),
                source,
            })
    }
}

/// Checks `CNI_CONTAINERID` as the spec restricts it: alphanumerics, then
/// alphanumerics, `_`, `.` or `-`.
fn check_container_id(id: &str) -> Result<()> {
    let mut chars = id.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        return Err(Error::InvalidEnv {
            var: "CNI_CONTAINERID",
            msg: format!("{id:?} has characters other than letters, digits, '_', '.' and '-'"),
        });
    }
    Ok(())
}

/// Checks `CNI_IFNAME` by the rule both binaries share
/// ([`macvtap_link::check_ifname`]).
fn check_ifname(name: &str) -> Result<()> {
    macvtap_link::check_ifname(name).map_err(|e| Error::InvalidEnv {
        var: "CNI_IFNAME",
        msg: e.to_string(),
    })
}

/// An environment made of `pairs`, for this crate's unit tests.
#[cfg(test)]
pub(crate) fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_needs_netns_ifname_and_container_id() {
        for missing in ["CNI_NETNS", "CNI_IFNAME", "CNI_CONTAINERID"] {
            let mut v = vars(&[
                ("CNI_COMMAND", "ADD"),
                ("CNI_NETNS", "/run/netns/x"),
                ("CNI_IFNAME", "net1"),
                ("CNI_CONTAINERID", "c1"),
            ]);
            v.remove(missing);
            let e = CniEnv::from_vars(&v).unwrap_err();
            assert_eq!(e.code(), 4);
            assert!(e.to_string().contains(missing), "{e}");
        }
    }

    #[test]
    fn del_does_not_need_a_netns() {
        let v = vars(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_IFNAME", "net1"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_PATH", "/a:/b"),
        ]);
        let env = CniEnv::from_vars(&v).unwrap();
        assert_eq!(env.command, Command::Del);
        assert_eq!(env.path, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
    }

    #[test]
    fn container_ids_are_checked_as_the_spec_says() {
        for (id, ok) in [
            ("abc-1.2_3", true),
            ("-abc", false),
            ("a/b", false),
            ("a b", false),
        ] {
            let v = vars(&[
                ("CNI_COMMAND", "DEL"),
                ("CNI_IFNAME", "net1"),
                ("CNI_CONTAINERID", id),
            ]);
            assert_eq!(CniEnv::from_vars(&v).is_ok(), ok, "{id}");
        }
    }

    #[test]
    fn version_needs_only_the_command() {
        let env = CniEnv::from_vars(&vars(&[("CNI_COMMAND", "VERSION")])).unwrap();
        assert_eq!(env.command, Command::Version);
    }

    #[test]
    fn bad_commands_and_ifnames_get_code_4() {
        assert_eq!(
            CniEnv::from_vars(&vars(&[("CNI_COMMAND", "FOO")]))
                .unwrap_err()
                .code(),
            4
        );
        assert_eq!(CniEnv::from_vars(&vars(&[])).unwrap_err().code(), 4);
        for name in [
            "a/b",
            "a:b",
            "a b",
            "a\u{1b}b",
            "0123456789abcdef",
            ".",
            "..",
            "all",
            "default",
        ] {
            let v = vars(&[
                ("CNI_COMMAND", "DEL"),
                ("CNI_IFNAME", name),
                ("CNI_CONTAINERID", "c1"),
            ]);
            let e = CniEnv::from_vars(&v).unwrap_err();
            assert_eq!(e.code(), 4, "{name:?}");
            assert!(
                e.to_string().contains("is not a valid interface name"),
                "{name:?}: {e}"
            );
        }
    }
}
