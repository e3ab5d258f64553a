//! The resource configuration: parsing, validation and precedence.
//!
//! The format is the Go project's `DP_MACVTAP_CONF`: a JSON array of
//! `{"name", "lowerDevice", "mode", "capacity"}`; `[]` or `null` means
//! auto-discovery. The same JSON may come from `--config FILE`, and entries
//! from `--resource` flags. The source with the highest precedence that is
//! present decides the whole list: flags, then the file, then the env, then
//! the default (auto-discovery).

use crate::error::{Error, Result};
use macvtap_link::{MacvtapMode, RESOURCE_PREFIX};
use serde::Deserialize;
use std::fmt;
use std::path::PathBuf;

/// Capacity used when an entry says 0 or less (as the Go project does).
pub const DEFAULT_CAPACITY: u32 = 100;
/// The largest capacity one resource may have.
pub const MAX_CAPACITY: u32 = 10_000;
/// The environment variable the Go project reads its configuration from.
pub const ENV_VAR: &str = "DP_MACVTAP_CONF";

/// One validated resource: devices `<name>Mvp<i>`, macvtaps on `lower_device`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceConfig {
    /// Resource name suffix, e.g. `dataplane` for `macvtap.network.kubevirt.io/dataplane`.
    pub name: String,
    /// The host NIC the macvtaps are created on.
    pub lower_device: String,
    /// The macvtap mode.
    pub mode: MacvtapMode,
    /// Number of devices advertised.
    pub capacity: u32,
}

impl ResourceConfig {
    /// The resource with the default mode and capacity on a NIC of the same
    /// name, as auto-discovery makes it.
    pub fn for_nic(nic: &str) -> Self {
        Self {
            name: nic.to_string(),
            lower_device: nic.to_string(),
            mode: MacvtapMode::Bridge,
            capacity: DEFAULT_CAPACITY,
        }
    }

    /// The full extended resource name, `macvtap.network.kubevirt.io/<name>`.
    pub fn resource_name(&self) -> String {
        format!("{RESOURCE_PREFIX}/{}", self.name)
    }

    /// The file name of this resource's socket in the device-plugins directory.
    pub fn socket_name(&self) -> String {
        format!("{RESOURCE_PREFIX}_{}", self.name)
    }
}

/// What the configuration asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resources {
    /// Exactly these resources.
    Static(Vec<ResourceConfig>),
    /// One resource per NIC found on the node, following NICs as they come and go.
    AutoDiscover,
}

/// Where the effective configuration came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `--resource` flags.
    Flags,
    /// `--config FILE`.
    File(PathBuf),
    /// The `DP_MACVTAP_CONF` environment variable.
    Env,
    /// Nothing was configured: auto-discovery.
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Flags => f.write_str("--resource flags"),
            Source::File(p) => write!(f, "config file {}", p.display()),
            Source::Env => f.write_str(ENV_VAR),
            Source::Default => f.write_str("defaults (auto-discovery)"),
        }
    }
}

/// The inputs of [`resolve`]: each source as found, not yet parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sources {
    /// Values of `--resource` flags.
    pub flags: Vec<String>,
    /// `--config` path and the file's content.
    pub file: Option<(PathBuf, String)>,
    /// The value of `DP_MACVTAP_CONF`, if set and not blank.
    pub env: Option<String>,
}

/// The effective configuration and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The resources to serve.
    pub resources: Resources,
    /// The source that decided them.
    pub source: Source,
}

/// Picks the source with the highest precedence and parses and validates it.
/// An invalid source is an error even when a lower one is valid: a typo must
/// not silently fall back to another configuration.
pub fn resolve(sources: &Sources) -> Result<Resolved> {
    if !sources.flags.is_empty() {
        let source = Source::Flags;
        let entries = sources
            .flags
            .iter()
            .map(|f| parse_resource_flag(f).map_err(|msg| config_err(&source, msg)))
            .collect::<Result<Vec<_>>>()?;
        let list = validate(&source, entries)?;
        return Ok(Resolved {
            resources: Resources::Static(list),
            source,
        });
    }
    if let Some((path, text)) = &sources.file {
        let source = Source::File(path.clone());
        return Ok(Resolved {
            resources: parse_json(&source, text)?,
            source,
        });
    }
    if let Some(text) = &sources.env {
        let source = Source::Env;
        return Ok(Resolved {
            resources: parse_json(&source, text)?,
            source,
        });
    }
    Ok(Resolved {
        resources: Resources::AutoDiscover,
        source: Source::Default,
    })
}

/// One entry as written, before validation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct RawEntry {
    /// Resource name suffix.
    #[serde(default)]
    pub name: String,
    /// Lower NIC; empty means the same as `name`.
    #[serde(default, rename = "lowerDevice")]
    pub lower_device: String,
    /// Mode; empty means bridge.
    #[serde(default)]
    pub mode: String,
    /// Capacity; 0 or less means [`DEFAULT_CAPACITY`].
    #[serde(default)]
    pub capacity: i64,
}

/// Parses the JSON of `DP_MACVTAP_CONF` or a config file.
pub fn parse_json(source: &Source, text: &str) -> Result<Resources> {
    let entries: Option<Vec<RawEntry>> = serde_json::from_str(text.trim())
        .map_err(|e| config_err(source, format!("not a JSON array of resources: {e}")))?;
    match entries {
        None => Ok(Resources::AutoDiscover),
        Some(e) if e.is_empty() => Ok(Resources::AutoDiscover),
        Some(e) => Ok(Resources::Static(validate(source, e)?)),
    }
}

/// Parses one `--resource` flag: `name=N,lowerDevice=D,mode=M,capacity=C`,
/// or just a NIC name for the defaults.
pub fn parse_resource_flag(s: &str) -> std::result::Result<RawEntry, String> {
    if !s.contains('=') {
        return Ok(RawEntry {
            name: s.trim().to_string(),
            ..Default::default()
        });
    }
    let mut e = RawEntry::default();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("--resource {s:?}: {part:?} is not key=value"))?;
        let v = v.trim().to_string();
        match k.trim() {
            "name" => e.name = v,
            "lowerDevice" | "lower" => e.lower_device = v,
            "mode" => e.mode = v,
            "capacity" => {
                e.capacity = v
                    .parse()
                    .map_err(|_| format!("--resource {s:?}: capacity {v:?} is not a number"))?;
            }
            other => {
                return Err(format!(
                    "--resource {s:?}: unknown key {other:?} (expected name, lowerDevice, mode, capacity)"
                ));
            }
        }
    }
    Ok(e)
}

/// Validates entries: names, NIC names, modes, capacities and duplicates.
pub fn validate(source: &Source, entries: Vec<RawEntry>) -> Result<Vec<ResourceConfig>> {
    let mut out: Vec<ResourceConfig> = Vec::with_capacity(entries.len());
    for (i, e) in entries.into_iter().enumerate() {
        let what = format!("entry {i} ({:?})", e.name);
        let bad = |msg: String| config_err(source, format!("{what}: {msg}"));
        check_resource_name(&e.name).map_err(bad)?;
        let lower = if e.lower_device.is_empty() {
            e.name.clone()
        } else {
            e.lower_device.clone()
        };
        check_ifname(&lower).map_err(|m| bad(format!("lowerDevice: {m}")))?;
        let mode: MacvtapMode = e.mode.parse().map_err(bad)?;
        let capacity = if e.capacity <= 0 {
            DEFAULT_CAPACITY
        } else {
            u32::try_from(e.capacity)
                .ok()
                .filter(|c| *c <= MAX_CAPACITY)
                .ok_or_else(|| {
                    bad(format!(
                        "capacity {} is out of range (1 to {MAX_CAPACITY}; 0 or less means {DEFAULT_CAPACITY})",
                        e.capacity
                    ))
                })?
        };
        if out.iter().any(|o| o.name == e.name) {
            return Err(bad("duplicate resource name".into()));
        }
        out.push(ResourceConfig {
            name: e.name,
            lower_device: lower,
            mode,
            capacity,
        });
    }
    Ok(out)
}

/// Checks that `name` may follow `macvtap.network.kubevirt.io/`: a
/// Kubernetes qualified name (at most 63 characters of letters, digits, `-`,
/// `_` and `.`, starting and ending with a letter or digit).
pub fn check_resource_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("name is empty".into());
    }
    if name.len() > 63 {
        return Err(format!(
            "name {name:?} is longer than 63 characters, so {RESOURCE_PREFIX}/{name} is not a valid resource name"
        ));
    }
    let ok_inner = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let first_last_ok = name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !first_last_ok || !name.chars().all(ok_inner) {
        return Err(format!(
            "name {name:?} is not a valid resource name suffix (letters, digits, '-', '_' and '.', \
             starting and ending with a letter or digit)"
        ));
    }
    Ok(())
}

/// Checks that `name` is a valid Linux interface name.
pub fn check_ifname(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > 15 || name == "." || name == ".." {
        return Err(format!(
            "{name:?} is not a valid interface name (1 to 15 bytes)"
        ));
    }
    if name.contains(|c: char| c == '/' || c == ':' || c.is_whitespace()) {
        return Err(format!(
            "{name:?} is not a valid interface name (no '/', ':' or spaces)"
        ));
    }
    Ok(())
}

fn config_err(source: &Source, msg: String) -> Error {
    Error::Config {
        source_name: source.to_string(),
        msg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(text: &str) -> Sources {
        Sources {
            env: Some(text.into()),
            ..Default::default()
        }
    }

    fn err(sources: &Sources) -> String {
        resolve(sources).unwrap_err().to_string()
    }

    #[test]
    fn go_format_parses_with_defaults() {
        let r = resolve(&env(
            r#"[{"name":"dataplane","lowerDevice":"eth0","mode":"vepa","capacity":50},
                {"name":"eth1","capacity":0}]"#,
        ))
        .unwrap();
        assert_eq!(r.source, Source::Env);
        let Resources::Static(list) = r.resources else {
            panic!("expected a static list")
        };
        assert_eq!(
            list[0],
            ResourceConfig {
                name: "dataplane".into(),
                lower_device: "eth0".into(),
                mode: MacvtapMode::Vepa,
                capacity: 50
            }
        );
        assert_eq!(list[1], ResourceConfig::for_nic("eth1"));
        assert_eq!(
            list[0].resource_name(),
            "macvtap.network.kubevirt.io/dataplane"
        );
        assert_eq!(
            list[0].socket_name(),
            "macvtap.network.kubevirt.io_dataplane"
        );
    }

    #[test]
    fn empty_array_and_null_mean_auto_discovery() {
        for text in ["[]", "null", " null\n"] {
            assert_eq!(
                resolve(&env(text)).unwrap().resources,
                Resources::AutoDiscover
            );
        }
        let none = resolve(&Sources::default()).unwrap();
        assert_eq!(none.resources, Resources::AutoDiscover);
        assert_eq!(none.source, Source::Default);
    }

    #[test]
    fn flags_win_over_file_and_file_over_env() {
        let file = Some((
            PathBuf::from("/etc/dp.json"),
            r#"[{"name":"fromfile","lowerDevice":"eth0"}]"#.to_string(),
        ));
        let all = Sources {
            flags: vec!["name=fromflag,lowerDevice=eth2,mode=private,capacity=3".into()],
            file: file.clone(),
            env: Some(r#"[{"name":"fromenv"}]"#.into()),
        };
        let r = resolve(&all).unwrap();
        assert_eq!(r.source, Source::Flags);
        assert_eq!(
            r.resources,
            Resources::Static(vec![ResourceConfig {
                name: "fromflag".into(),
                lower_device: "eth2".into(),
                mode: MacvtapMode::Private,
                capacity: 3
            }])
        );
        let no_flags = Sources {
            flags: vec![],
            ..all.clone()
        };
        let r = resolve(&no_flags).unwrap();
        assert_eq!(r.source, Source::File("/etc/dp.json".into()));
        let Resources::Static(l) = r.resources else {
            panic!()
        };
        assert_eq!(l[0].name, "fromfile");
        let env_only = Sources {
            file: None,
            ..no_flags
        };
        let r = resolve(&env_only).unwrap();
        assert_eq!(r.source, Source::Env);
    }

    #[test]
    fn a_file_saying_auto_discover_still_wins_over_env() {
        let s = Sources {
            flags: vec![],
            file: Some(("/c.json".into(), "[]".into())),
            env: Some(r#"[{"name":"eth0"}]"#.into()),
        };
        let r = resolve(&s).unwrap();
        assert_eq!(r.resources, Resources::AutoDiscover);
        assert_eq!(r.source, Source::File("/c.json".into()));
    }

    #[test]
    fn bare_flag_is_a_nic_with_defaults() {
        let s = Sources {
            flags: vec!["eth3".into()],
            ..Default::default()
        };
        assert_eq!(
            resolve(&s).unwrap().resources,
            Resources::Static(vec![ResourceConfig::for_nic("eth3")])
        );
    }

    #[test]
    fn unknown_mode_is_rejected_naming_the_entry() {
        let e = err(&env(r#"[{"name":"a"},{"name":"b","mode":"source"}]"#));
        assert!(e.contains("DP_MACVTAP_CONF"), "{e}");
        assert!(e.contains("entry 1 (\"b\")"), "{e}");
        assert!(e.contains("unknown macvtap mode \"source\""), "{e}");
    }

    #[test]
    fn invalid_names_are_rejected() {
        for bad in ["", "a/b", "-a", "a-", "has space", &"x".repeat(64)] {
            let text = serde_json::json!([{ "name": bad, "lowerDevice": "eth0" }]).to_string();
            let e = err(&env(&text));
            assert!(e.contains("entry 0"), "{bad:?}: {e}");
        }
        for good in ["eth0", "data_plane.1", "A-b"] {
            check_resource_name(good).unwrap();
        }
    }

    #[test]
    fn invalid_lower_device_is_rejected() {
        let e = err(&env(
            r#"[{"name":"a","lowerDevice":"a-very-long-nic-name"}]"#,
        ));
        assert!(e.contains("lowerDevice"), "{e}");
        // A name too long for a NIC with no lowerDevice is caught the same way.
        let e = err(&env(r#"[{"name":"abcdefghijklmnopq"}]"#));
        assert!(e.contains("lowerDevice"), "{e}");
    }

    #[test]
    fn duplicate_names_are_rejected() {
        let e = err(&env(
            r#"[{"name":"a","lowerDevice":"eth0"},{"name":"a","lowerDevice":"eth1"}]"#,
        ));
        assert!(
            e.contains("entry 1 (\"a\"): duplicate resource name"),
            "{e}"
        );
    }

    #[test]
    fn capacity_out_of_range_is_rejected() {
        let e = err(&env(r#"[{"name":"a","capacity":10001}]"#));
        assert!(e.contains("capacity 10001 is out of range"), "{e}");
        let ok = resolve(&env(r#"[{"name":"a","capacity":-5}]"#)).unwrap();
        assert_eq!(
            ok.resources,
            Resources::Static(vec![ResourceConfig::for_nic("a")])
        );
    }

    #[test]
    fn malformed_json_and_flags_are_rejected() {
        assert!(err(&env("{")).contains("not a JSON array"));
        assert!(err(&env(r#"{"name":"a"}"#)).contains("not a JSON array"));
        let s = Sources {
            flags: vec!["name=a,colour=red".into()],
            ..Default::default()
        };
        assert!(err(&s).contains("unknown key \"colour\""));
        let s = Sources {
            flags: vec!["name=a,capacity=many".into()],
            ..Default::default()
        };
        assert!(err(&s).contains("capacity \"many\" is not a number"));
    }

    #[test]
    fn an_invalid_higher_source_does_not_fall_back() {
        let s = Sources {
            flags: vec![],
            file: Some(("/c.json".into(), "[{\"name\":\"a\",\"mode\":\"x\"}]".into())),
            env: Some("[]".into()),
        };
        assert!(err(&s).contains("config file /c.json"));
    }
}
