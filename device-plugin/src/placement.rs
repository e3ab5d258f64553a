//! Where a configured resource is served and on which NIC, when its entry
//! says more than the Go project's one `lowerDevice` (issue 46, item 4): a
//! NIC selector (a list of names, a name pattern, a driver, a PCI vendor
//! and device ID, all of which must hold) that each node resolves to the
//! first NIC matching it, and a node selector (Node labels that must all
//! be set to the values given). This file holds the two as configured and
//! validated; which NIC a node picks, and whether it serves the entry at
//! all, is `crate::core::nic::select`'s.
//!
//! In JSON (the ConfigMap, `--config`) an entry carries them as
//! `"nicSelector": {"names": [...], "pattern": "...", "driver": "...",
//! "vendor": "8086", "device": "10fb"}` and `"nodeSelector": {"label":
//! "value"}`; in a `--resource` flag as `names=eth1|ens5f0`, `pattern=`,
//! `driver=`, `vendor=`, `device=` and `node=label:value` (repeatable).

use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

/// How a resource picks its NIC on each node: the first NIC for which
/// every criterion given holds, in the order of `names` when given, else
/// in the kernel's (ifindex) order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NicSelector {
    /// NIC names, tried in this order.
    pub names: Vec<String>,
    /// A pattern the NIC's name must match: `*` any run of characters,
    /// `?` one character.
    pub pattern: Option<String>,
    /// The kernel driver bound to the NIC's device: the name of the link
    /// `/sys/class/net/<nic>/device/driver` points to.
    pub driver: Option<String>,
    /// The PCI vendor ID, 4 lower-case hex digits: what
    /// `/sys/class/net/<nic>/device/vendor` holds (`0x8086`).
    pub vendor: Option<String>,
    /// The PCI device ID, 4 lower-case hex digits: what
    /// `/sys/class/net/<nic>/device/device` holds (`0x10fb`).
    pub device: Option<String>,
}

impl NicSelector {
    /// Whether it asks for anything read from sysfs (driver, vendor, device).
    pub(crate) fn reads_sysfs(&self) -> bool {
        self.driver.is_some() || self.vendor.is_some() || self.device.is_some()
    }
}

impl fmt::Display for NicSelector {
    /// `the first NIC named eth1 or ens5f0, with driver ixgbe`: what the
    /// selector asks, as a phrase.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if !self.names.is_empty() {
            parts.push(format!("named {}", self.names.join(" or ")));
        }
        if let Some(p) = &self.pattern {
            parts.push(format!("whose name matches {p}"));
        }
        if let Some(d) = &self.driver {
            parts.push(format!("with driver {d}"));
        }
        if let Some(v) = &self.vendor {
            parts.push(format!("with PCI vendor {v}"));
        }
        if let Some(d) = &self.device {
            parts.push(format!("with PCI device {d}"));
        }
        write!(f, "the first NIC {}", parts.join(", "))
    }
}

/// Where a resource entry is served and on which NIC, beyond one
/// `lowerDevice`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// How each node picks the NIC; `None`: the entry's `lowerDevice`.
    pub nic: Option<NicSelector>,
    /// The Node labels (name to value) a node must have to serve the
    /// entry; empty: every node.
    pub nodes: BTreeMap<String, String>,
}

impl Placement {
    /// Whether a node's `labels` are all the node selector asks.
    pub(crate) fn node_matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.nodes.iter().all(|(k, v)| labels.get(k) == Some(v))
    }

    /// Why a node with `labels` does not serve the entry: each label it
    /// lacks or has another value of, as a phrase.
    pub(crate) fn node_mismatch(&self, labels: &BTreeMap<String, String>) -> Vec<String> {
        self.nodes
            .iter()
            .filter_map(|(k, want)| match labels.get(k) {
                Some(v) if v == want => None,
                Some(v) => Some(format!("its label {k} is {v:?}, not {want:?}")),
                None => Some(format!("it has no label {k}")),
            })
            .collect()
    }

    /// The node selector as `a=b, c=d`.
    pub(crate) fn nodes_text(&self) -> String {
        self.nodes
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A `nicSelector` as written in JSON: every key optional, no other key
/// (a misspelt one would silently widen what matches).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawNicSelector {
    /// `names`.
    #[serde(default)]
    pub names: Option<Vec<String>>,
    /// `pattern`.
    #[serde(default)]
    pub pattern: Option<String>,
    /// `driver`.
    #[serde(default)]
    pub driver: Option<String>,
    /// `vendor`.
    #[serde(default)]
    pub vendor: Option<String>,
    /// `device`.
    #[serde(default)]
    pub device: Option<String>,
}

/// The validated selector of `raw`, or why it cannot work.
pub(crate) fn check_nic_selector(raw: &RawNicSelector) -> Result<NicSelector, String> {
    let names = raw.names.clone().unwrap_or_default();
    for n in &names {
        macvtap_link::check_ifname(n).map_err(|m| format!("nicSelector.names: {m}"))?;
    }
    let pattern = match raw.pattern.as_deref() {
        None => None,
        Some(p) => Some(check_pattern(p).map_err(|m| format!("nicSelector.pattern: {m}"))?),
    };
    let driver = match raw.driver.as_deref() {
        None => None,
        Some(d) if d.is_empty() || d.contains('/') || d.chars().any(char::is_whitespace) => {
            return Err(format!(
                "nicSelector.driver {d:?} is not a driver name (e.g. ixgbe, mlx5_core)"
            ));
        }
        Some(d) => Some(d.to_string()),
    };
    let pci = |what: &str, v: Option<&str>| -> Result<Option<String>, String> {
        v.map(|v| {
            pci_id(v).ok_or_else(|| {
                format!(
                    "nicSelector.{what} {v:?} is not a PCI ID (4 hex digits, e.g. 8086 or 0x8086)"
                )
            })
        })
        .transpose()
    };
    let s = NicSelector {
        names,
        pattern,
        driver,
        vendor: pci("vendor", raw.vendor.as_deref())?,
        device: pci("device", raw.device.as_deref())?,
    };
    if s.names.is_empty() && s.pattern.is_none() && !s.reads_sysfs() {
        return Err(
            "nicSelector says nothing: give names, pattern, driver, vendor or device".into(),
        );
    }
    Ok(s)
}

/// A PCI ID as sysfs writes it without its `0x`: 4 lower-case hex digits;
/// `None` when `text` is not one (with or without `0x`).
pub(crate) fn pci_id(text: &str) -> Option<String> {
    let t = text.trim();
    let hex = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    (hex.len() == 4 && hex.chars().all(|c| c.is_ascii_hexdigit())).then(|| hex.to_ascii_lowercase())
}

/// `p` when it is a name pattern a NIC's name can match: 1 to 15 bytes of
/// what a name may hold, plus `*` and `?`.
fn check_pattern(p: &str) -> Result<String, String> {
    if p.is_empty() || p.len() > 15 {
        return Err(format!("{p:?} is not 1 to 15 bytes"));
    }
    if p.chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "{p:?} holds what no interface name does ('/', ':', whitespace or control characters)"
        ));
    }
    Ok(p.to_string())
}

/// Whether `name` matches `pattern`: `*` any run of characters (none
/// too), `?` exactly one, anything else itself.
pub(crate) fn pattern_matches(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The classic two-pointer glob, remembering the last `*`.
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// Checks a node selector: each key a Kubernetes label name (an optional
/// DNS-subdomain prefix and `/`, then at most 63 letters, digits, `-`,
/// `_` and `.`, starting and ending alphanumeric), each value empty or of
/// the same characters, at most 63.
pub(crate) fn check_node_selector(nodes: &BTreeMap<String, String>) -> Result<(), String> {
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let prefix_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && l.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    };
    for (k, v) in nodes {
        let key_ok = match k.split_once('/') {
            Some((prefix, name)) => prefix_ok(prefix) && name_ok(name),
            None => name_ok(k),
        };
        if !key_ok {
            return Err(format!(
                "nodeSelector: {k:?} is not a label name ([prefix/]name, the name at most 63 \
                 letters, digits, '-', '_' or '.')"
            ));
        }
        if !(v.is_empty() || name_ok(v)) {
            return Err(format!(
                "nodeSelector: {v:?} (of {k}) is not a label value (at most 63 letters, digits, \
                 '-', '_' or '.', starting and ending with a letter or digit)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_a_shell_matches_names() {
        for (p, n, want) in [
            ("ens5f*", "ens5f0", true),
            ("ens5f*", "ens5f", true),
            ("ens5f*", "ens6f0", false),
            ("eth?", "eth1", true),
            ("eth?", "eth10", false),
            ("*", "anything", true),
            ("e*1", "eth0.1", true),
            ("e*1", "eth0.12", false),
            ("*p*s*", "enp3s0", true),
            ("eth1", "eth1", true),
            ("eth1", "eth11", false),
        ] {
            assert_eq!(pattern_matches(p, n), want, "{p} ~ {n}");
        }
    }

    #[test]
    fn pci_ids_are_four_hex_digits_with_or_without_0x() {
        assert_eq!(pci_id("0x8086").as_deref(), Some("8086"));
        assert_eq!(pci_id("10FB").as_deref(), Some("10fb"));
        assert_eq!(pci_id(" 0x15b3\n").as_deref(), Some("15b3"));
        for bad in ["", "808", "80866", "0x", "zzzz", "0x80 6"] {
            assert_eq!(pci_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_selector_is_checked_and_normalised() {
        let raw = RawNicSelector {
            names: Some(vec!["eth1".into(), "ens5f0".into()]),
            driver: Some("ixgbe".into()),
            vendor: Some("0x8086".into()),
            device: Some("10FB".into()),
            ..Default::default()
        };
        let s = check_nic_selector(&raw).unwrap();
        assert_eq!(s.vendor.as_deref(), Some("8086"));
        assert_eq!(s.device.as_deref(), Some("10fb"));
        assert_eq!(
            s.to_string(),
            "the first NIC named eth1 or ens5f0, with driver ixgbe, with PCI vendor 8086, with \
             PCI device 10fb"
        );
        for (raw, why) in [
            (RawNicSelector::default(), "nicSelector says nothing"),
            (
                RawNicSelector {
                    names: Some(vec!["a/b".into()]),
                    ..Default::default()
                },
                "nicSelector.names: ",
            ),
            (
                RawNicSelector {
                    pattern: Some("ens 5*".into()),
                    ..Default::default()
                },
                "nicSelector.pattern: ",
            ),
            (
                RawNicSelector {
                    driver: Some("".into()),
                    ..Default::default()
                },
                "nicSelector.driver",
            ),
            (
                RawNicSelector {
                    vendor: Some("intel".into()),
                    ..Default::default()
                },
                "nicSelector.vendor \"intel\" is not a PCI ID",
            ),
        ] {
            let e = check_nic_selector(&raw).unwrap_err();
            assert!(e.starts_with(why), "{e}");
        }
    }

    #[test]
    fn node_selectors_take_label_names_and_values() {
        let sel = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        for (k, v) in [
            ("role", "dp"),
            ("macvtap.example.com/dataplane", "yes"),
            ("kubernetes.io/hostname", "node-1"),
            ("zone", ""),
        ] {
            check_node_selector(&sel(k, v)).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
        }
        for (k, v) in [
            ("", "x"),
            ("-role", "x"),
            ("Example.com/role", "x"),
            ("a/b/c", "x"),
            ("role", "not ok"),
            ("role", "-x"),
        ] {
            assert!(check_node_selector(&sel(k, v)).is_err(), "{k}={v}");
        }
        let p = Placement {
            nic: None,
            nodes: BTreeMap::from([
                ("role".to_string(), "dp".to_string()),
                ("zone".to_string(), "a".to_string()),
            ]),
        };
        let labels = BTreeMap::from([
            ("role".to_string(), "dp".to_string()),
            ("zone".to_string(), "a".to_string()),
            ("other".to_string(), "x".to_string()),
        ]);
        assert!(p.node_matches(&labels));
        let labels = BTreeMap::from([("role".to_string(), "web".to_string())]);
        assert!(!p.node_matches(&labels));
        assert_eq!(
            p.node_mismatch(&labels),
            [
                "its label role is \"web\", not \"dp\"",
                "it has no label zone"
            ]
        );
        assert_eq!(p.nodes_text(), "role=dp, zone=a");
    }
}
