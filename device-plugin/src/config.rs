//! The resource configuration: parsing, validation and precedence.
//!
//! The format is the Go project's `DP_MACVTAP_CONF`: a JSON array of
//! `{"name", "lowerDevice", "mode", "capacity"}`; `[]` or `null` means
//! auto-discovery. An entry may also carry a `nicSelector` (instead of
//! `lowerDevice`) and a `nodeSelector` ([`crate::placement`]), which each
//! node resolves to its own NIC, or to not serving the entry. The same JSON may come from `--config FILE`, and entries
//! from `--resource` flags. The source with the highest precedence that is
//! present decides the whole list: flags, then the file, then the env, then
//! the default (auto-discovery).
//!
//! Auto-discovery has a policy ([`DiscoveryPolicy`]): `spare` offers only
//! the NICs the node does not use itself, `all` every NIC as the Go
//! project did. `--discovery` chooses; without it, auto-discovery asked for
//! by `DP_MACVTAP_CONF` in the environment (what the Go project's
//! DaemonSets do: their ConfigMap holds `[]`) is `all`, so that swapping
//! their image for ours changes nothing, and any other (no configuration,
//! a config file's `[]`) is `spare`.
//!
//! Every `DP_MACVTAP_CONF` the Go device plugin started with starts here.
//! The JSON is read as Go's `encoding/json` read it into the Go project's
//! struct (kubevirt/macvtap-cni `pkg/deviceplugin/lister.go`, `readConfig`):
//! keys match case-insensitively, a repeated key or a `null` value is
//! handled as Go handles it, unknown keys are ignored, and a wrong type or
//! shape is refused (Go exited on those). Where Go silently did something
//! questionable, the same is done with a warning that names the entry: a
//! repeated resource name (Go kept the last entry of that name) and a
//! capacity above `MAX_CAPACITY`. An entry that cannot work (a name the
//! kubelet refuses, an unknown mode, a NIC name the shared interface-name
//! rule refuses ([`macvtap_link::check_ifname`], as the CNI does), a device
//! list too large for the kubelet to receive) is refused: from
//! `DP_MACVTAP_CONF` it is logged as an error naming the entry and left out,
//! so the others still start, as they did with Go; from `--resource` flags
//! or a config file (sources Go never had) it makes the whole source invalid.
//!
//! Passthru mode follows the kernel's rule of one passthru macvtap per NIC,
//! alone on it: such a resource has exactly one device (unset capacity means
//! 1), and no other resource may share its NIC. From flags or a file a
//! larger capacity or a shared NIC is refused like any impossible entry;
//! from `DP_MACVTAP_CONF` a larger capacity is lowered to 1 with a warning
//! (the resource works with one device, so it starts, as every entry that
//! can work does there) and of two entries sharing a NIC the passthru one is
//! left out naming both (the Go device plugin never served passthru, so the
//! other entry is the one that worked with it).

use crate::error::{Error, Result};
use crate::placement::{
    NicSelector, Placement, RawNicSelector, check_nic_selector, check_node_selector,
};
use macvtap_link::{MacvtapMode, RESOURCE_PREFIX, check_ifname};
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

/// Capacity used when an entry says 0 or less (as the Go project does).
pub(crate) const DEFAULT_CAPACITY: u32 = 100;
/// The largest capacity accepted without a warning.
pub(crate) const MAX_CAPACITY: u32 = 10_000;
/// The largest gRPC message the kubelet receives: its device manager dials
/// plugins with grpc-go's defaults (kubernetes `pkg/kubelet/cm/devicemanager/
/// plugin/v1beta1/client.go`, `dial`), whose receive limit is 4 MiB. A
/// resource whose device list cannot fit one ListAndWatch message cannot work.
pub(crate) const KUBELET_MAX_MESSAGE: u64 = 4 * 1024 * 1024;
/// The environment variable the Go project reads its configuration from.
pub(crate) const ENV_VAR: &str = "DP_MACVTAP_CONF";

/// One validated resource: devices `<name>Mvp<i>`, macvtaps on `lower_device`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceConfig {
    /// Resource name suffix, e.g. `dataplane` for `macvtap.network.kubevirt.io/dataplane`.
    pub name: String,
    /// The host NIC the macvtaps are created on. For an entry whose NIC a
    /// selector picks (`placement`), empty as configured, and the NIC this
    /// node picked once the node resolved it (as every served resource is).
    pub lower_device: String,
    /// The macvtap mode.
    pub mode: MacvtapMode,
    /// Number of devices advertised.
    pub capacity: u32,
    /// Where it is served and how each node picks its NIC, when the entry
    /// says (a `nicSelector`, a `nodeSelector`); `None`: on every node, on
    /// `lower_device`, as every Go project entry.
    pub placement: Option<Placement>,
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
            placement: None,
        }
    }

    /// The NIC selector that picks its NIC on each node, if any.
    pub(crate) fn nic_selector(&self) -> Option<&NicSelector> {
        self.placement.as_ref().and_then(|p| p.nic.as_ref())
    }

    /// Whether it is served only on nodes with some labels.
    pub(crate) fn has_node_selector(&self) -> bool {
        self.placement.as_ref().is_some_and(|p| !p.nodes.is_empty())
    }

    /// The full extended resource name, `macvtap.network.kubevirt.io/<name>`.
    pub fn resource_name(&self) -> String {
        format!("{RESOURCE_PREFIX}/{}", self.name)
    }

    /// The file name of this resource's socket in the device-plugins directory.
    pub(crate) fn socket_name(&self) -> String {
        format!("{RESOURCE_PREFIX}_{}", self.name)
    }
}

impl fmt::Display for ResourceConfig {
    /// `macvtap.network.kubevirt.io/dp on NIC eth1 (bridge mode, 100
    /// devices)`; as configured with a NIC selector, `... on the first NIC
    /// with driver ixgbe ...`; with a node selector, `..., on nodes
    /// labelled role=dp`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on ", self.resource_name())?;
        match self.nic_selector() {
            Some(sel) if self.lower_device.is_empty() => write!(f, "{sel}")?,
            _ => write!(f, "NIC {}", self.lower_device)?,
        }
        write!(f, " ({} mode, {} devices)", self.mode, self.capacity)?;
        if let Some(p) = self.placement.as_ref().filter(|p| !p.nodes.is_empty()) {
            write!(f, ", on nodes labelled {}", p.nodes_text())?;
        }
        Ok(())
    }
}

/// Which NICs auto-discovery offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DiscoveryPolicy {
    /// Only NICs the node does not use itself: none that a default route
    /// leaves through or that holds the Node's InternalIP, and none with a
    /// global address unless `--discover-include` names it.
    Spare,
    /// Every NIC, as the Go project's auto-discovery offered them.
    All,
}

impl DiscoveryPolicy {
    /// The policy when `--discovery` is not given, for auto-discovery asked
    /// for by `source`: `all` from `DP_MACVTAP_CONF` in the environment (the
    /// Go project's DaemonSets, whose ConfigMap holds `[]`), `spare` from
    /// anything else (no configuration, a config file's `[]`).
    pub fn default_for(source: &Source) -> Self {
        match source {
            Source::Env => DiscoveryPolicy::All,
            Source::Flags | Source::File(_) | Source::Default => DiscoveryPolicy::Spare,
        }
    }

    /// `spare` or `all`, as `--discovery` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            DiscoveryPolicy::Spare => "spare",
            DiscoveryPolicy::All => "all",
        }
    }
}

impl fmt::Display for DiscoveryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the configuration asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resources {
    /// Exactly these resources.
    Static(Vec<ResourceConfig>),
    /// One resource per NIC found on the node under this policy, following
    /// NICs as they come and go.
    AutoDiscover(DiscoveryPolicy),
}

impl fmt::Display for Resources {
    /// Each resource as [`ResourceConfig`] shows it, `; `-separated, or
    /// auto-discovery.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resources::Static(list) if list.is_empty() => f.write_str("no resources"),
            Resources::Static(list) => {
                for (i, r) in list.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{r}")?;
                }
                Ok(())
            }
            Resources::AutoDiscover(DiscoveryPolicy::Spare) => f.write_str(
                "auto-discovery of spare NICs (one resource per NIC the node does not use itself)",
            ),
            Resources::AutoDiscover(DiscoveryPolicy::All) => {
                f.write_str("auto-discovery of every NIC (one resource per NIC, as the Go project)")
            }
        }
    }
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
pub(crate) struct Sources {
    /// Values of `--resource` flags.
    pub flags: Vec<String>,
    /// `--config` path and the file's content.
    pub file: Option<(PathBuf, String)>,
    /// The value of `DP_MACVTAP_CONF`, if set and not blank.
    pub env: Option<String>,
    /// `--discovery`, if given: the policy of auto-discovery whatever the
    /// source that asks for it.
    pub discovery: Option<DiscoveryPolicy>,
}

/// The effective configuration and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// The resources to serve.
    pub resources: Resources,
    /// The source that decided them.
    pub source: Source,
}

/// Picks the source with the highest precedence and parses and validates it.
/// An invalid source is an error even when a lower one is valid: a typo must
/// not silently fall back to another configuration.
pub(crate) fn resolve(sources: &Sources) -> Result<Resolved> {
    let mut resolved = resolve_source(sources)?;
    if let (Resources::AutoDiscover(policy), Some(given)) =
        (&mut resolved.resources, sources.discovery)
    {
        *policy = given;
    }
    Ok(resolved)
}

/// [`resolve`] without `--discovery`: auto-discovery gets its source's
/// default policy ([`DiscoveryPolicy::default_for`]).
fn resolve_source(sources: &Sources) -> Result<Resolved> {
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
        resources: Resources::AutoDiscover(DiscoveryPolicy::default_for(&Source::Default)),
        source: Source::Default,
    })
}

/// One entry as written, before validation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RawEntry {
    /// Resource name suffix.
    pub name: String,
    /// Lower NIC; empty means the same as `name`.
    pub lower_device: String,
    /// Mode; empty means bridge.
    pub mode: String,
    /// Capacity; 0 or less means [`DEFAULT_CAPACITY`].
    pub capacity: i64,
    /// The NIC selector, instead of `lowerDevice`.
    pub nic_selector: Option<RawNicSelector>,
    /// The node selector: labels a node must have.
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Keys that name no field (ignored, as Go ignored them), in order.
    pub unknown_keys: Vec<String>,
}

/// The struct fields of the Go project's `macvtapConfig`, and our two
/// selectors.
#[derive(Clone, Copy)]
enum Field {
    Name,
    LowerDevice,
    Mode,
    Capacity,
    NicSelector,
    NodeSelector,
}

impl Field {
    /// The field a JSON key fills, as Go's `encoding/json` picks it: the
    /// exact name, else a case-insensitive match (the Go project's names
    /// hold no `k` or `s`, the only letters Go folds beyond ASCII; the
    /// selectors, which Go never had, are matched the same way).
    fn for_key(key: &str) -> Option<Field> {
        const FIELDS: [(&str, Field); 6] = [
            ("name", Field::Name),
            ("lowerDevice", Field::LowerDevice),
            ("mode", Field::Mode),
            ("capacity", Field::Capacity),
            ("nicSelector", Field::NicSelector),
            ("nodeSelector", Field::NodeSelector),
        ];
        FIELDS
            .iter()
            .find(|(n, _)| *n == key)
            .or_else(|| FIELDS.iter().find(|(n, _)| n.eq_ignore_ascii_case(key)))
            .map(|(_, f)| *f)
    }
}

impl<'de> Deserialize<'de> for RawEntry {
    /// Reads an entry as Go's `json.Unmarshal` fills the struct: keys in
    /// document order (a repeated key: the last wins), `null` leaves a
    /// field as it is, unknown keys are skipped, and `null` for the whole
    /// entry is an entry with every field empty.
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = RawEntry;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "an object with name, lowerDevice, mode and capacity (and nicSelector, \
                     nodeSelector)",
                )
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<RawEntry, E> {
                Ok(RawEntry::default())
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<RawEntry, A::Error> {
                let mut e = RawEntry::default();
                while let Some(key) = map.next_key::<String>()? {
                    let text = |v: Option<String>, slot: &mut String| {
                        if let Some(v) = v {
                            *slot = v;
                        }
                    };
                    match Field::for_key(&key) {
                        Some(Field::Name) => text(map.next_value()?, &mut e.name),
                        Some(Field::LowerDevice) => text(map.next_value()?, &mut e.lower_device),
                        Some(Field::Mode) => text(map.next_value()?, &mut e.mode),
                        Some(Field::Capacity) => {
                            if let Some(c) = map.next_value::<Option<i64>>()? {
                                e.capacity = c;
                            }
                        }
                        Some(Field::NicSelector) => {
                            if let Some(s) = map.next_value::<Option<RawNicSelector>>()? {
                                e.nic_selector = Some(s);
                            }
                        }
                        Some(Field::NodeSelector) => {
                            if let Some(n) = map.next_value::<Option<BTreeMap<String, String>>>()? {
                                e.node_selector = Some(n);
                            }
                        }
                        None => {
                            map.next_value::<IgnoredAny>()?;
                            e.unknown_keys.push(key);
                        }
                    }
                }
                Ok(e)
            }
        }
        d.deserialize_any(EntryVisitor)
    }
}

/// Parses the JSON of `DP_MACVTAP_CONF` or a config file; auto-discovery
/// gets the source's default policy ([`DiscoveryPolicy::default_for`]).
pub fn parse_json(source: &Source, text: &str) -> Result<Resources> {
    let entries: Option<Vec<RawEntry>> = serde_json::from_str(text.trim())
        .map_err(|e| config_err(source, format!("not a JSON array of resources: {e}")))?;
    let discover = Resources::AutoDiscover(DiscoveryPolicy::default_for(source));
    match entries {
        None => Ok(discover),
        Some(e) if e.is_empty() => Ok(discover),
        Some(e) => Ok(Resources::Static(validate(source, e)?)),
    }
}

/// Parses one `--resource` flag: `name=N,lowerDevice=D,mode=M,capacity=C`,
/// or just a NIC name for the defaults; a NIC selector as `names=A|B`,
/// `pattern=P`, `driver=D`, `vendor=V`, `device=D` and a node selector as
/// `node=LABEL:VALUE` (repeatable).
pub(crate) fn parse_resource_flag(s: &str) -> std::result::Result<RawEntry, String> {
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
            "names" => {
                e.nic_selector.get_or_insert_with(Default::default).names =
                    Some(v.split('|').map(|n| n.trim().to_string()).collect());
            }
            "pattern" => e.nic_selector.get_or_insert_with(Default::default).pattern = Some(v),
            "driver" => e.nic_selector.get_or_insert_with(Default::default).driver = Some(v),
            "vendor" => e.nic_selector.get_or_insert_with(Default::default).vendor = Some(v),
            "device" => e.nic_selector.get_or_insert_with(Default::default).device = Some(v),
            "node" => {
                let (label, value) = v
                    .split_once(':')
                    .ok_or_else(|| format!("--resource {s:?}: node {v:?} is not LABEL:VALUE"))?;
                e.node_selector
                    .get_or_insert_with(Default::default)
                    .insert(label.trim().to_string(), value.trim().to_string());
            }
            other => {
                return Err(format!(
                    "--resource {s:?}: unknown key {other:?} (expected name, lowerDevice, mode, \
                     capacity, names, pattern, driver, vendor, device, node)"
                ));
            }
        }
    }
    Ok(e)
}

/// Validates entries: names, NIC names, modes, capacities and duplicates,
/// logging the warnings and refusals of [`check_entries`].
pub(crate) fn validate(source: &Source, entries: Vec<RawEntry>) -> Result<Vec<ResourceConfig>> {
    let checked = check_entries(source, entries)?;
    for w in &checked.warnings {
        tracing::warn!(source = %source, "{w}");
    }
    for r in &checked.refused {
        tracing::error!(source = %source, "{r}; this resource is not served");
    }
    Ok(checked.resources)
}

/// What [`check_entries`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Checked {
    /// The resources to serve, in the order of the entries.
    pub resources: Vec<ResourceConfig>,
    /// What Go silently accepted and is accepted here with a warning, each
    /// naming the source and the entry.
    pub warnings: Vec<String>,
    /// Entries that cannot work, left out (only from `DP_MACVTAP_CONF`),
    /// each naming the source and the entry.
    pub refused: Vec<String>,
}

/// Checks every entry. From `DP_MACVTAP_CONF` an entry that cannot work is
/// left out and listed in `refused`; from other sources it is an error.
pub(crate) fn check_entries(source: &Source, entries: Vec<RawEntry>) -> Result<Checked> {
    let go_compatible = !matches!(source, Source::Flags);
    let mut out = Checked::default();
    // The entry number of each resource in `out.resources`.
    let mut entry_of: Vec<usize> = Vec::new();
    for (i, e) in entries.into_iter().enumerate() {
        let what = format!("{source}: entry {i} ({:?})", e.name);
        let config = match check_entry(&e) {
            Ok(c) => c,
            Err(msg) if *source == Source::Env => {
                out.refused.push(format!("{what}: {msg}"));
                continue;
            }
            Err(msg) => {
                return Err(config_err(
                    source,
                    format!("entry {i} ({:?}): {msg}", e.name),
                ));
            }
        };
        if !e.unknown_keys.is_empty() {
            out.warnings.push(format!(
                "{what}: unknown key{} {} ignored, as the Go device plugin ignored them \
                 (expected name, lowerDevice, mode, capacity, nicSelector, nodeSelector)",
                if e.unknown_keys.len() > 1 { "s" } else { "" },
                e.unknown_keys
                    .iter()
                    .map(|k| format!("{k:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if config.mode == MacvtapMode::Passthru && e.capacity > 1 {
            let why = format!(
                "capacity {} is impossible in passthru mode: the kernel allows one passthru \
                 macvtap per NIC, so a passthru resource has exactly one device",
                e.capacity
            );
            if *source != Source::Env {
                return Err(config_err(
                    source,
                    format!("entry {i} ({:?}): {why}; set capacity 1", e.name),
                ));
            }
            out.warnings.push(format!("{what}: {why}; advertising 1"));
        } else if e.capacity > i64::from(MAX_CAPACITY) {
            if !go_compatible {
                return Err(config_err(
                    source,
                    format!(
                        "entry {i} ({:?}): capacity {} is out of range (1 to {MAX_CAPACITY}; 0 or less means {DEFAULT_CAPACITY})",
                        e.name, e.capacity
                    ),
                ));
            }
            out.warnings.push(format!(
                "{what}: capacity {} is above {MAX_CAPACITY}; advertising that many devices, as the Go \
                 device plugin did",
                e.capacity
            ));
        }
        if let Some(at) = out.resources.iter().position(|o| o.name == config.name) {
            if !go_compatible {
                return Err(config_err(
                    source,
                    format!(
                        "entry {i} ({:?}): an earlier entry has the same resource name",
                        e.name
                    ),
                ));
            }
            out.warnings.push(format!(
                "{what}: the resource name is used by an earlier entry too; this entry replaces it, \
                 as the Go device plugin kept the last entry of a name"
            ));
            out.resources.remove(at);
            entry_of.remove(at);
        }
        out.resources.push(config);
        entry_of.push(i);
    }
    check_passthru_nics(source, &mut out, &entry_of)?;
    Ok(out)
}

/// A passthru macvtap must be its NIC's only macvlan/macvtap port, so two
/// resources on one NIC where one is passthru cannot both work. From flags
/// or a file that is an error naming both entries; from `DP_MACVTAP_CONF`
/// the passthru entry is left out (the later one when both are passthru)
/// and the other starts, as it did with the Go device plugin, which never
/// served passthru. `entry_of` holds each resource's entry number. An
/// entry with a placement is checked by each node against the others it
/// serves, on the NIC it picks (`crate::core::nic::select`).
fn check_passthru_nics(source: &Source, out: &mut Checked, entry_of: &[usize]) -> Result<()> {
    let passthru = |r: &ResourceConfig| r.mode == MacvtapMode::Passthru;
    let mut kept: Vec<usize> = Vec::new();
    let mut left_out = vec![false; out.resources.len()];
    for (n, r) in out.resources.iter().enumerate() {
        if r.placement.is_some() {
            continue;
        }
        let clash = kept.iter().position(|&k| {
            let o = &out.resources[k];
            o.lower_device == r.lower_device && (passthru(o) || passthru(r))
        });
        let Some(at) = clash else {
            kept.push(n);
            continue;
        };
        let k = kept[at];
        let o = &out.resources[k];
        let (pt, other) = if passthru(r) { (n, k) } else { (k, n) };
        let (pt_r, other_r) = (&out.resources[pt], &out.resources[other]);
        let both = format!(
            "entry {} ({:?}) and entry {} ({:?}) both use NIC {}, and {:?} is in passthru mode: \
             a passthru macvtap must be the NIC's only macvlan/macvtap port (the kernel refuses \
             any other beside it)",
            entry_of[k], o.name, entry_of[n], r.name, r.lower_device, pt_r.name
        );
        if *source != Source::Env {
            return Err(config_err(
                source,
                format!("{both}; give the passthru resource a NIC of its own"),
            ));
        }
        out.refused.push(format!(
            "{source}: {both}; entry {} ({:?}) is left out and {:?} is served",
            entry_of[pt], pt_r.name, other_r.name
        ));
        left_out[pt] = true;
        if pt == k {
            kept.remove(at);
            kept.push(n);
        }
    }
    let mut n = 0;
    out.resources.retain(|_| {
        n += 1;
        !left_out[n - 1]
    });
    Ok(())
}

/// One entry as a resource, or why it cannot work.
fn check_entry(e: &RawEntry) -> std::result::Result<ResourceConfig, String> {
    check_resource_name(&e.name)?;
    let nic = e
        .nic_selector
        .as_ref()
        .map(check_nic_selector)
        .transpose()?;
    if nic.is_some() && !e.lower_device.is_empty() {
        return Err(
            "lowerDevice and nicSelector both choose the NIC; give one of them".to_string(),
        );
    }
    let nodes = e.node_selector.clone().unwrap_or_default();
    check_node_selector(&nodes)?;
    let placement = (nic.is_some() || !nodes.is_empty()).then(|| Placement {
        nic: nic.clone(),
        nodes,
    });
    let lower = if nic.is_some() {
        String::new()
    } else if e.lower_device.is_empty() {
        check_ifname(&e.name).map_err(|m| {
            format!("lowerDevice is not given, so the NIC is the resource name, and {m}")
        })?;
        e.name.clone()
    } else {
        check_ifname(&e.lower_device).map_err(|m| format!("lowerDevice: {m}"))?;
        e.lower_device.clone()
    };
    let mode: MacvtapMode = e.mode.parse()?;
    // One passthru macvtap per NIC (the kernel's rule): [`check_entries`]
    // refuses or warns about a larger capacity.
    let capacity = if mode == MacvtapMode::Passthru {
        1
    } else if e.capacity <= 0 {
        DEFAULT_CAPACITY
    } else {
        u32::try_from(e.capacity).map_err(|_| too_many(e.capacity))?
    };
    if min_list_message_len(&e.name, capacity) > KUBELET_MAX_MESSAGE {
        return Err(too_many(e.capacity));
    }
    Ok(ResourceConfig {
        name: e.name.clone(),
        lower_device: lower,
        mode,
        capacity,
        placement,
    })
}

fn too_many(capacity: i64) -> String {
    format!(
        "capacity {capacity} is too large: the list of its devices does not fit one ListAndWatch \
         message of {KUBELET_MAX_MESSAGE} bytes, the most the kubelet receives"
    )
}

/// The smallest ListAndWatch message for `capacity` devices of resource
/// `name`: every device healthy, without topology. Each device is
/// `Device { ID: "<name>Mvp<i>", health: "Healthy" }` in field 1 of the
/// response: 2 bytes of tag and length around it, 2 around the ID and 2
/// around the 7 bytes of health, so `len(ID) + 13` with one-byte lengths.
pub(crate) fn min_list_message_len(name: &str, capacity: u32) -> u64 {
    let base = name.len() as u64 + 3 + 13;
    let mut total = 0u64;
    let mut start = 0u64;
    let mut digits = 1u64;
    let end = u64::from(capacity);
    while start < end {
        let next = (start.max(1) * 10).min(end);
        total += (next - start) * (base + digits);
        start = next;
        digits += 1;
    }
    total
}

/// Checks that `name` may follow `macvtap.network.kubevirt.io/`: a
/// Kubernetes qualified name (at most 63 characters of letters, digits, `-`,
/// `_` and `.`, starting and ending with a letter or digit).
pub(crate) fn check_resource_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err(
            "the name is empty; every entry needs the name of the resource it advertises".into(),
        );
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

fn config_err(source: &Source, msg: String) -> Error {
    Error::Config {
        source_name: source.to_string(),
        msg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Options;

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
                capacity: 50,
                placement: None,
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
            assert!(
                matches!(
                    resolve(&env(text)).unwrap().resources,
                    Resources::AutoDiscover(_)
                ),
                "{text:?}"
            );
        }
        let none = resolve(&Sources::default()).unwrap();
        assert!(matches!(none.resources, Resources::AutoDiscover(_)));
        assert_eq!(none.source, Source::Default);
    }

    #[test]
    fn the_go_daemonsets_empty_list_keeps_go_discovery_and_anything_else_is_spare() {
        use DiscoveryPolicy::{All, Spare};
        let policy = |s: &Sources| match resolve(s).unwrap().resources {
            Resources::AutoDiscover(p) => p,
            Resources::Static(l) => panic!("auto-discovery expected, got {l:?}"),
        };
        // The Go project's DaemonSets: DP_MACVTAP_CONF=[] (or null) from
        // their ConfigMap, through envFrom.
        assert_eq!(policy(&env("[]")), All);
        assert_eq!(policy(&env("null")), All);
        // Ours: no ConfigMap, or one whose file says [].
        assert_eq!(policy(&Sources::default()), Spare);
        assert_eq!(policy(&file("[]")), Spare);
        // A blank DP_MACVTAP_CONF is no source (the Go plugin exited on it).
        let blank = Options::for_tests(None);
        let blank = Options {
            env_config: Some(" ".into()),
            ..blank
        };
        assert_eq!(policy(&blank.sources(None)), Spare);
        // --discovery decides whatever the source.
        for given in [All, Spare] {
            for mut s in [env("[]"), file("[]"), Sources::default()] {
                s.discovery = Some(given);
                assert_eq!(policy(&s), given, "{s:?}");
            }
        }
        // It does not turn a list into auto-discovery.
        let mut s = env(r#"[{"name":"eth1"}]"#);
        s.discovery = Some(All);
        assert!(matches!(
            resolve(&s).unwrap().resources,
            Resources::Static(_)
        ));
        // parse_json, which the chart's and manifests' tests call, agrees.
        assert_eq!(
            parse_json(&Source::Env, "[]").unwrap(),
            Resources::AutoDiscover(All)
        );
        assert_eq!(
            parse_json(&Source::File("/c".into()), "[]").unwrap(),
            Resources::AutoDiscover(Spare)
        );
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
            discovery: None,
        };
        let r = resolve(&all).unwrap();
        assert_eq!(r.source, Source::Flags);
        assert_eq!(
            r.resources,
            Resources::Static(vec![ResourceConfig {
                name: "fromflag".into(),
                lower_device: "eth2".into(),
                mode: MacvtapMode::Private,
                capacity: 3,
                placement: None,
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
            discovery: None,
        };
        let r = resolve(&s).unwrap();
        assert_eq!(r.resources, Resources::AutoDiscover(DiscoveryPolicy::Spare));
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

    fn file(text: &str) -> Sources {
        Sources {
            file: Some(("/etc/dp.json".into(), text.into())),
            ..Default::default()
        }
    }

    fn flags(f: &[&str]) -> Sources {
        Sources {
            flags: f.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn checked(text: &str) -> Checked {
        let entries: Vec<RawEntry> = serde_json::from_str(text).unwrap();
        check_entries(&Source::Env, entries).unwrap()
    }

    fn names(r: &Resolved) -> Vec<String> {
        match &r.resources {
            Resources::Static(l) => l.iter().map(|c| c.name.clone()).collect(),
            Resources::AutoDiscover(_) => panic!("expected a static list"),
        }
    }

    #[test]
    fn an_env_entry_that_cannot_work_is_left_out_naming_it() {
        let text = r#"[{"name":"a"},{"name":"b","mode":"source"}]"#;
        // Go started with this (and failed every Allocate of "b"): "a" is served.
        assert_eq!(names(&resolve(&env(text)).unwrap()), ["a"]);
        let c = checked(text);
        assert_eq!(c.refused.len(), 1);
        let r = &c.refused[0];
        assert!(r.contains("DP_MACVTAP_CONF: entry 1 (\"b\")"), "{r}");
        assert!(r.contains("unknown macvtap mode \"source\""), "{r}");
        // From our own sources the same entry makes the source invalid.
        let e = err(&file(text));
        assert!(
            e.starts_with(
                "invalid configuration from config file /etc/dp.json: entry 1 (\"b\"): unknown \
                 macvtap mode \"source\""
            ),
            "{e}"
        );
        let e = err(&flags(&["a", "name=b,mode=source"]));
        assert!(
            e.contains("--resource flags") && e.contains("entry 1"),
            "{e}"
        );
    }

    #[test]
    fn invalid_names_are_refused() {
        for bad in ["", "a/b", "-a", "a-", "has space", &"x".repeat(64)] {
            let text = serde_json::json!([{ "name": bad, "lowerDevice": "eth0" }]).to_string();
            let c = checked(&text);
            assert!(c.resources.is_empty(), "{bad:?}");
            assert!(c.refused[0].contains("entry 0"), "{bad:?}: {:?}", c.refused);
            assert!(err(&file(&text)).contains("entry 0"), "{bad:?}");
        }
        // A null entry is an entry with every field empty, as in Go.
        assert_eq!(
            checked(r#"[null, {"name":"a"}]"#).refused,
            [
                "DP_MACVTAP_CONF: entry 0 (\"\"): the name is empty; every entry needs the name of \
              the resource it advertises"
            ]
        );
        for good in ["eth0", "data_plane.1", "A-b"] {
            check_resource_name(good).unwrap();
        }
    }

    #[test]
    fn the_configuration_is_logged_as_people_write_it() {
        let r = resolve(&env(
            r#"[{"name":"dp","lowerDevice":"eth1","capacity":2},{"name":"eth2"}]"#,
        ))
        .unwrap();
        assert_eq!(
            r.resources.to_string(),
            "macvtap.network.kubevirt.io/dp on NIC eth1 (bridge mode, 2 devices); \
             macvtap.network.kubevirt.io/eth2 on NIC eth2 (bridge mode, 100 devices)"
        );
        assert_eq!(
            Resources::AutoDiscover(DiscoveryPolicy::Spare).to_string(),
            "auto-discovery of spare NICs (one resource per NIC the node does not use itself)"
        );
        assert_eq!(
            Resources::AutoDiscover(DiscoveryPolicy::All).to_string(),
            "auto-discovery of every NIC (one resource per NIC, as the Go project)"
        );
    }

    #[test]
    fn invalid_lower_device_is_refused() {
        let c = checked(r#"[{"name":"a","lowerDevice":"a-very-long-nic-name"}]"#);
        assert!(c.refused[0].contains("lowerDevice"), "{:?}", c.refused);
        // A name too long for a NIC with no lowerDevice is caught the same way.
        let e = err(&file(r#"[{"name":"abcdefghijklmnopq"}]"#));
        assert_eq!(
            e,
            "invalid configuration from config file /etc/dp.json: entry 0 (\"abcdefghijklmnopq\"): \
             lowerDevice is not given, so the NIC is the resource name, and \"abcdefghijklmnopq\" \
             is not a valid interface name (1 to 15 bytes)"
        );
    }

    #[test]
    fn nic_names_the_cni_refuses_are_refused_too() {
        let long = "x".repeat(16);
        for bad in [
            "all",
            "default",
            ".",
            "..",
            "a/b",
            "a:b",
            "a b",
            "eth\u{1b}0",
            &long,
        ] {
            let text = serde_json::json!([{ "name": "dp", "lowerDevice": bad }, { "name": "b" }])
                .to_string();
            // From DP_MACVTAP_CONF the entry is left out, naming it; the rest starts.
            let c = checked(&text);
            assert_eq!(
                c.resources
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>(),
                ["b"],
                "{bad:?}"
            );
            assert_eq!(c.refused.len(), 1, "{bad:?}");
            let r = &c.refused[0];
            assert!(
                r.starts_with("DP_MACVTAP_CONF: entry 0 (\"dp\"): lowerDevice: ")
                    && r.contains("is not a valid interface name"),
                "{bad:?}: {r}"
            );
            // From a config file or flags the whole source is invalid.
            let e = err(&file(&text));
            assert!(
                e.starts_with("invalid configuration from config file /etc/dp.json: entry 0 (\"dp\"): lowerDevice: "),
                "{bad:?}: {e}"
            );
        }
        // A resource named like a reserved name needs a lowerDevice.
        let e = err(&flags(&["all"]));
        assert_eq!(
            e,
            "invalid configuration from --resource flags: entry 0 (\"all\"): lowerDevice is not \
             given, so the NIC is the resource name, and \"all\" is not a valid interface name (., \
             .., all and default are reserved)"
        );
        assert_eq!(
            names(&resolve(&flags(&["name=all,lowerDevice=eth0"])).unwrap()),
            ["all"]
        );
    }

    #[test]
    fn duplicate_names_keep_the_last_entry_with_a_warning() {
        let text =
            r#"[{"name":"a","lowerDevice":"eth0"},{"name":"b"},{"name":"a","lowerDevice":"eth1"}]"#;
        let c = checked(text);
        assert_eq!(
            c.resources
                .iter()
                .map(|r| (r.name.as_str(), r.lower_device.as_str()))
                .collect::<Vec<_>>(),
            [("b", "b"), ("a", "eth1")]
        );
        assert_eq!(c.warnings.len(), 1);
        assert!(
            c.warnings[0].contains("DP_MACVTAP_CONF: entry 2 (\"a\")"),
            "{:?}",
            c.warnings
        );
        assert_eq!(names(&resolve(&file(text)).unwrap()), ["b", "a"]);
        let e = err(&flags(&["a", "name=a,lowerDevice=eth1"]));
        assert_eq!(
            e,
            "invalid configuration from --resource flags: entry 1 (\"a\"): an earlier entry \
             has the same resource name"
        );
    }

    #[test]
    fn large_capacities_warn_and_impossible_ones_are_refused() {
        let c = checked(r#"[{"name":"a","capacity":10001}]"#);
        assert_eq!(c.resources[0].capacity, 10_001);
        assert!(
            c.warnings[0].contains("entry 0 (\"a\"): capacity 10001 is above 10000"),
            "{:?}",
            c.warnings
        );
        let e = err(&flags(&["name=a,capacity=10001"]));
        assert!(e.contains("capacity 10001 is out of range"), "{e}");
        // Four billion devices never fit a message the kubelet accepts.
        for cap in ["4000000000", "9223372036854775807", "1000000"] {
            let c = checked(&format!(
                r#"[{{"name":"a","capacity":{cap}}},{{"name":"b"}}]"#
            ));
            assert_eq!(c.resources.len(), 1, "{cap}");
            assert!(
                c.refused[0].contains("does not fit"),
                "{cap}: {:?}",
                c.refused
            );
        }
        let ok = resolve(&env(r#"[{"name":"a","capacity":-5}]"#)).unwrap();
        assert_eq!(
            ok.resources,
            Resources::Static(vec![ResourceConfig::for_nic("a")])
        );
    }

    fn passthru(name: &str, lower: &str, capacity: i64) -> serde_json::Value {
        serde_json::json!({"name": name, "lowerDevice": lower, "mode": "passthru",
                           "capacity": capacity})
    }

    #[test]
    fn a_passthru_resource_has_exactly_one_device() {
        // Unset capacity means 1 in passthru mode, silently.
        for cap in [0, -3, 1] {
            let c = checked(&serde_json::json!([passthru("pt", "eth0", cap)]).to_string());
            assert_eq!(c.resources[0].capacity, 1, "{cap}");
            assert!(
                c.warnings.is_empty() && c.refused.is_empty(),
                "{cap}: {c:?}"
            );
        }
        // From DP_MACVTAP_CONF a larger capacity is lowered to 1, naming the entry.
        for cap in [4, 4_000_000_000] {
            let text = serde_json::json!([{"name": "a"}, passthru("pt", "eth0", cap)]).to_string();
            let c = checked(&text);
            assert!(c.refused.is_empty(), "{cap}: {c:?}");
            assert_eq!(c.resources[1].capacity, 1, "{cap}");
            assert_eq!(
                c.warnings,
                [format!(
                    "DP_MACVTAP_CONF: entry 1 (\"pt\"): capacity {cap} is impossible in passthru \
                     mode: the kernel allows one passthru macvtap per NIC, so a passthru resource \
                     has exactly one device; advertising 1"
                )]
            );
            // From a file or flags it is refused, naming source and entry.
            let e = err(&file(&text));
            assert!(
                e.starts_with(&format!(
                    "invalid configuration from config file /etc/dp.json: entry 1 (\"pt\"): \
                     capacity {cap} is impossible in passthru mode"
                )) && e.ends_with("; set capacity 1"),
                "{e}"
            );
        }
        let e = err(&flags(&[
            "name=pt,lowerDevice=eth0,mode=passthru,capacity=2",
        ]));
        assert!(
            e.starts_with(
                "invalid configuration from --resource flags: entry 0 (\"pt\"): capacity 2 is \
                 impossible in passthru mode"
            ),
            "{e}"
        );
        let ok = resolve(&flags(&["name=pt,lowerDevice=eth0,mode=passthru"])).unwrap();
        assert_eq!(
            ok.resources,
            Resources::Static(vec![ResourceConfig {
                name: "pt".into(),
                lower_device: "eth0".into(),
                mode: MacvtapMode::Passthru,
                capacity: 1,
                placement: None,
            }])
        );
    }

    #[test]
    fn a_passthru_resource_sharing_its_nic_is_a_configuration_error_naming_both() {
        let both = "entry 0 (\"dp\") and entry 1 (\"pt\") both use NIC eth0, and \"pt\" is in \
                    passthru mode: a passthru macvtap must be the NIC's only macvlan/macvtap port \
                    (the kernel refuses any other beside it)";
        let text = serde_json::json!([
            {"name": "dp", "lowerDevice": "eth0"},
            passthru("pt", "eth0", 1),
            {"name": "eth1"}
        ])
        .to_string();
        let e = err(&file(&text));
        assert_eq!(
            e,
            format!(
                "invalid configuration from config file /etc/dp.json: {both}; give the passthru \
                 resource a NIC of its own"
            )
        );
        let e = err(&flags(&[
            "name=dp,lowerDevice=eth0",
            "name=pt,lowerDevice=eth0,mode=passthru",
        ]));
        assert!(e.contains(both), "{e}");
        // From DP_MACVTAP_CONF the passthru entry is left out, the rest starts.
        let c = checked(&text);
        assert_eq!(
            c.refused,
            [format!(
                "DP_MACVTAP_CONF: {both}; entry 1 (\"pt\") is left out and \"dp\" is served"
            )]
        );
        let served = |c: &Checked| {
            c.resources
                .iter()
                .map(|r| r.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(served(&c), ["dp", "eth1"]);
        // The passthru entry first: still the one left out.
        let c = checked(
            &serde_json::json!([passthru("pt", "eth0", 1), {"name": "dp", "lowerDevice": "eth0"}])
                .to_string(),
        );
        assert_eq!(served(&c), ["dp"]);
        assert!(
            c.refused[0].contains("entry 0 (\"pt\") is left out"),
            "{c:?}"
        );
        // Two passthru entries on one NIC: the first stays.
        let c = checked(
            &serde_json::json!([passthru("p1", "eth0", 1), passthru("p2", "eth0", 1)]).to_string(),
        );
        assert_eq!(served(&c), ["p1"]);
        assert!(
            c.refused[0].contains("entry 1 (\"p2\") is left out"),
            "{c:?}"
        );
        // Resources on other NICs, and several non-passthru ones on one NIC, are fine.
        let c = checked(
            &serde_json::json!([
                passthru("pt", "eth0", 1),
                {"name": "a", "lowerDevice": "eth1"},
                {"name": "b", "lowerDevice": "eth1", "mode": "vepa"}
            ])
            .to_string(),
        );
        assert!(c.refused.is_empty(), "{c:?}");
        assert_eq!(served(&c), ["pt", "a", "b"]);
    }

    #[test]
    fn message_length_counts_every_device() {
        // "aMvp0".."aMvp9": 5 bytes of ID + 13 each.
        assert_eq!(min_list_message_len("a", 10), 10 * 18);
        assert_eq!(min_list_message_len("a", 11), 10 * 18 + 19);
        assert_eq!(min_list_message_len("a", 0), 0);
        // The encoded message agrees.
        let devices = crate::kubelet::devices::device_list("eth0", 120, true, None);
        let msg = kubelet_proto::v1beta1::ListAndWatchResponse { devices };
        assert_eq!(
            prost::Message::encoded_len(&msg) as u64,
            min_list_message_len("eth0", 120)
        );
    }

    #[test]
    fn go_json_decoding_is_reproduced() {
        // Keys match case-insensitively; unknown keys and null values are
        // ignored; a repeated key keeps its last value.
        let c = checked(
            r#"[{"NAME":"a","LowerDevice":"eth0","MODE":"vepa","Capacity":3,"colour":"red"},
                {"name":"b","mode":null,"capacity":null,"lowerDevice":"x","lowerDevice":"eth2"},
                {"Name":"c","name":"d"}]"#,
        );
        assert!(c.refused.is_empty(), "{c:?}");
        assert_eq!(c.warnings.len(), 1, "{c:?}");
        assert!(
            c.warnings[0].contains("entry 0 (\"a\"): unknown key \"colour\" ignored"),
            "{c:?}"
        );
        assert_eq!(
            c.resources,
            vec![
                ResourceConfig {
                    name: "a".into(),
                    lower_device: "eth0".into(),
                    mode: MacvtapMode::Vepa,
                    capacity: 3,
                    placement: None,
                },
                ResourceConfig {
                    name: "b".into(),
                    lower_device: "eth2".into(),
                    mode: MacvtapMode::Bridge,
                    capacity: DEFAULT_CAPACITY,
                    placement: None,
                },
                ResourceConfig::for_nic("d"),
            ]
        );
        // What Go's json.Unmarshal refused (and the Go plugin exited on).
        for bad in [
            r#"[{"name":5}]"#,
            r#"[{"name":"a","capacity":1.5}]"#,
            r#"[{"name":"a","capacity":"10"}]"#,
            r#"[{"name":"a","capacity":1e3}]"#,
            r#"[{"name":"a","capacity":99999999999999999999}]"#,
            r#"["eth0"]"#,
            r#"[1]"#,
        ] {
            assert!(err(&env(bad)).contains("not a JSON array"), "{bad}");
        }
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
            discovery: None,
        };
        assert!(err(&s).contains("config file /c.json"));
    }

    #[test]
    fn an_entry_may_select_its_nic_and_its_nodes() {
        let text = r#"[{"name":"dp","nicSelector":{"names":["eth1","ens5f0"],"pattern":"e*",
                        "driver":"ixgbe","vendor":"0x8086","device":"10FB"},
                        "nodeSelector":{"role":"dp"},"capacity":4},
                       {"name":"plain","lowerDevice":"eth2"},
                       {"name":"labelled","lowerDevice":"eth3","NodeSelector":{"zone":"a"}}]"#;
        for source in [env(text), file(text)] {
            let r = resolve(&source).unwrap();
            let Resources::Static(list) = r.resources else {
                panic!()
            };
            let dp = &list[0];
            assert_eq!(dp.lower_device, "", "picked by each node");
            let p = dp.placement.as_ref().unwrap();
            let nic = p.nic.as_ref().unwrap();
            assert_eq!(nic.names, ["eth1", "ens5f0"]);
            assert_eq!(nic.pattern.as_deref(), Some("e*"));
            assert_eq!(nic.driver.as_deref(), Some("ixgbe"));
            assert_eq!(
                (nic.vendor.as_deref(), nic.device.as_deref()),
                (Some("8086"), Some("10fb"))
            );
            assert_eq!(p.nodes["role"], "dp");
            assert_eq!(
                dp.to_string(),
                "macvtap.network.kubevirt.io/dp on the first NIC named eth1 or ens5f0, whose \
                 name matches e*, with driver ixgbe, with PCI vendor 8086, with PCI device 10fb \
                 (bridge mode, 4 devices), on nodes labelled role=dp"
            );
            // The Go project's form stays as it was.
            assert_eq!(
                list[1],
                ResourceConfig {
                    lower_device: "eth2".into(),
                    ..ResourceConfig::for_nic("plain")
                }
            );
            assert_eq!(list[1].placement, None);
            let labelled = list[2].placement.as_ref().unwrap();
            assert_eq!(list[2].lower_device, "eth3");
            assert_eq!(labelled.nic, None);
            assert_eq!(labelled.nodes["zone"], "a");
        }
    }

    #[test]
    fn selectors_that_cannot_work_are_refused_naming_the_entry() {
        for (entry, why) in [
            (
                r#"{"name":"dp","lowerDevice":"eth1","nicSelector":{"names":["eth2"]}}"#,
                "lowerDevice and nicSelector both choose the NIC",
            ),
            (
                r#"{"name":"dp","nicSelector":{}}"#,
                "nicSelector says nothing",
            ),
            (
                r#"{"name":"dp","nicSelector":{"vendor":"intel"}}"#,
                "nicSelector.vendor \"intel\" is not a PCI ID",
            ),
            (
                r#"{"name":"dp","nicSelector":{"names":["a-name-far-too-long"]}}"#,
                "nicSelector.names: ",
            ),
            (
                r#"{"name":"dp","lowerDevice":"eth1","nodeSelector":{"bad key":"x"}}"#,
                "nodeSelector: \"bad key\" is not a label name",
            ),
        ] {
            let text = format!("[{entry},{{\"name\":\"eth9\"}}]");
            let c = checked(&text);
            assert_eq!(c.resources.len(), 1, "{entry}: the other entry is served");
            assert!(
                c.refused[0].starts_with("DP_MACVTAP_CONF: entry 0 (\"dp\"): ")
                    && c.refused[0].contains(why),
                "{entry}: {:?}",
                c.refused
            );
            let e = err(&file(&text));
            assert!(e.contains("entry 0 (\"dp\")") && e.contains(why), "{e}");
        }
        // A misspelt key inside a selector would widen what it matches:
        // the whole list is refused, as a wrong type is.
        let e = err(&env(r#"[{"name":"dp","nicSelector":{"drvier":"ixgbe"}}]"#));
        assert!(
            e.contains("not a JSON array") && e.contains("drvier"),
            "{e}"
        );
        let e = err(&env(r#"[{"name":"dp","nodeSelector":{"role":1}}]"#));
        assert!(e.contains("not a JSON array"), "{e}");
    }

    #[test]
    fn flags_take_the_selectors_too() {
        let r = resolve(&flags(&[
            "name=dp,names=eth1|ens5f0,driver=ixgbe,vendor=8086,device=10fb,node=role:dp,node=zone:a",
            "name=p,pattern=ens5f*,mode=passthru",
        ]))
        .unwrap();
        let Resources::Static(list) = r.resources else {
            panic!()
        };
        let p = list[0].placement.as_ref().unwrap();
        assert_eq!(p.nic.as_ref().unwrap().names, ["eth1", "ens5f0"]);
        assert_eq!(p.nodes.len(), 2);
        assert_eq!(
            list[1].nic_selector().unwrap().pattern.as_deref(),
            Some("ens5f*")
        );
        assert!(err(&flags(&["name=dp,node=role"])).contains("node \"role\" is not LABEL:VALUE"));
    }

    #[test]
    fn passthru_sharing_is_left_to_each_node_for_selected_nics() {
        // Two entries on one NIC, the passthru one for some nodes only:
        // whether they meet is each node's to see.
        let text = r#"[{"name":"dp","lowerDevice":"eth0"},
                       {"name":"pt","lowerDevice":"eth0","mode":"passthru",
                        "nodeSelector":{"role":"pt"}},
                       {"name":"sel","nicSelector":{"pattern":"eth*"},"mode":"passthru"}]"#;
        assert_eq!(names(&resolve(&file(text)).unwrap()), ["dp", "pt", "sel"]);
    }
}
