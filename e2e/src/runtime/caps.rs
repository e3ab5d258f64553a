//! Capabilities as containerd sets them: its default set, every Linux
//! capability by number, the set a `securityContext` gives
//! (containerd `pkg/cri/opts/spec_linux.go` `WithCapabilities`: add `ALL`,
//! drop `ALL`, then each add and drop; `oci/spec_opts.go`
//! `WithAddedCapabilities`: bounding, effective and permitted alike), and
//! the masks `/proc/PID/status` prints.

use anyhow::{Context, Result, ensure};
use serde_json::Value;

/// containerd's default capability set (`defaultUnixCaps` in `oci/spec.go`).
pub const DEFAULT_CAPS: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// Every Linux capability, indexed by its number (`linux/capability.h`).
pub const ALL_CAPS: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// The capability set containerd gives a container with `securityContext`
/// `sc` (`WithCapabilities`): the defaults, or all with `add: [ALL]`, none
/// with `drop: [ALL]`, then each `add` and each `drop`.
pub fn capabilities(sc: &Value, field: &str) -> Result<Vec<String>> {
    let list = |key: &str| -> Result<Vec<String>> {
        sc["capabilities"][key]
            .as_array()
            .map(|a| a.iter())
            .into_iter()
            .flatten()
            .map(|c| {
                let name = c
                    .as_str()
                    .with_context(|| format!("{field}.capabilities.{key}: not a string"))?
                    .to_ascii_uppercase();
                if name == "ALL" {
                    return Ok(name);
                }
                let full = format!("CAP_{name}");
                ensure!(
                    ALL_CAPS.contains(&full.as_str()),
                    "{field}.capabilities.{key}: unknown capability {name}"
                );
                Ok(full)
            })
            .collect()
    };
    let (add, drop) = (list("add")?, list("drop")?);
    let mut caps: Vec<String> = DEFAULT_CAPS.iter().map(|s| s.to_string()).collect();
    if add.iter().any(|c| c == "ALL") {
        caps = ALL_CAPS.iter().map(|s| s.to_string()).collect();
    }
    if drop.iter().any(|c| c == "ALL") {
        caps.clear();
    }
    for c in add.iter().filter(|c| *c != "ALL") {
        if !caps.contains(c) {
            caps.push(c.clone());
        }
    }
    caps.retain(|c| !drop.contains(c));
    Ok(caps)
}

/// The bit mask of capability names, as `/proc/PID/status` prints it.
pub fn cap_mask(caps: &[String]) -> Result<u64> {
    caps.iter().try_fold(0u64, |mask, c| {
        let bit = ALL_CAPS
            .iter()
            .position(|k| k == c)
            .with_context(|| format!("unknown capability {c}"))?;
        Ok(mask | 1 << bit)
    })
}

/// Names of the capabilities set in `mask`.
pub fn cap_names(mask: u64) -> Vec<String> {
    ALL_CAPS
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, n)| n.to_string())
        .collect()
}

/// Reads `CapEff`, `CapPrm` and `CapBnd` of process `pid`.
pub fn process_caps(pid: u32) -> Result<[(String, u64); 3]> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let get = |key: &str| -> Result<(String, u64)> {
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}:")))
            .with_context(|| format!("/proc/{pid}/status has no {key}"))?;
        Ok((key.to_string(), u64::from_str_radix(line.trim(), 16)?))
    };
    Ok([get("CapEff")?, get("CapPrm")?, get("CapBnd")?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn drop_all_then_add_leaves_only_the_added() {
        let sc = json!({"capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}});
        assert_eq!(capabilities(&sc, "sc").unwrap(), vec!["CAP_NET_ADMIN"]);
        assert_eq!(
            cap_mask(&capabilities(&sc, "sc").unwrap()).unwrap(),
            1 << 12
        );
    }

    #[test]
    fn without_drop_the_defaults_stay_minus_what_is_dropped() {
        let sc = json!({"capabilities": {"drop": ["NET_RAW"], "add": ["NET_ADMIN"]}});
        let caps = capabilities(&sc, "sc").unwrap();
        assert_eq!(caps.len(), DEFAULT_CAPS.len());
        assert!(caps.contains(&"CAP_NET_ADMIN".to_string()));
        assert!(!caps.contains(&"CAP_NET_RAW".to_string()));
        assert_eq!(capabilities(&json!({}), "sc").unwrap().len(), 14);
        assert!(capabilities(&json!({"capabilities": {"add": ["NOPE"]}}), "sc").is_err());
    }
}
