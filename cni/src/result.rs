//! CNI results: one internal model, printed in the config's `cniVersion`.

use crate::error::{Error, Result};
use crate::version::Version;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::net::IpAddr;

/// An interface in a result.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// MTU (printed for 1.x only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Network namespace path, for interfaces inside the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// Fields of other plugins, kept as they are.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// An IP address in a result.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IpConfig {
    /// Address with prefix length, e.g. `192.0.2.10/24`.
    pub address: String,
    /// Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
    /// Fields of other plugins, kept as they are (`version` is recomputed).
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// A route in a result.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Route {
    /// Destination with prefix length.
    pub dst: String,
    /// Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// Other route fields (1.1's `mtu`, `table`, ...), kept.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// A CNI result in any supported version.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CniResult {
    /// Interfaces.
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    /// Addresses.
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    /// Routes.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// DNS settings, passed through.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub dns: Value,
}

impl CniResult {
    /// Reads a result of any supported version (a `prevResult` or an IPAM
    /// plugin's output).
    pub fn from_value(v: &Value, what: &str) -> Result<Self> {
        let mut r: CniResult = serde_json::from_value(v.clone())
            .map_err(|e| Error::InvalidConfig(format!("{what} is not a CNI result: {e}")))?;
        for ip in &mut r.ips {
            ip.other.remove("version");
            parse_cidr(&ip.address).ok_or_else(|| {
                Error::InvalidConfig(format!("{what}: bad address {:?}", ip.address))
            })?;
        }
        for route in &r.routes {
            parse_cidr(&route.dst).ok_or_else(|| {
                Error::InvalidConfig(format!("{what}: bad route {:?}", route.dst))
            })?;
        }
        Ok(r)
    }

    /// The result as JSON in `version`: before 1.0.0 `ips[].version` is added
    /// and `interfaces[].mtu` left out.
    pub fn to_value(&self, version: Version) -> Value {
        let mut out = Map::new();
        out.insert("cniVersion".into(), Value::from(version.as_str()));
        let interfaces = self
            .interfaces
            .iter()
            .map(|i| {
                let mut i = i.clone();
                if version.has_ip_version() {
                    i.mtu = None;
                }
                serde_json::to_value(i).unwrap_or(Value::Null)
            })
            .collect();
        out.insert("interfaces".into(), Value::Array(interfaces));
        let ips = self
            .ips
            .iter()
            .map(|ip| {
                let mut v = serde_json::to_value(ip).unwrap_or(Value::Null);
                if version.has_ip_version() {
                    if let (Some(obj), Some((addr, _))) =
                        (v.as_object_mut(), parse_cidr(&ip.address))
                    {
                        let fam = if addr.is_ipv4() { "4" } else { "6" };
                        obj.insert("version".into(), Value::from(fam));
                    }
                }
                v
            })
            .collect();
        out.insert("ips".into(), Value::Array(ips));
        if !self.routes.is_empty() {
            out.insert(
                "routes".into(),
                serde_json::to_value(&self.routes).unwrap_or(Value::Null),
            );
        }
        out.insert(
            "dns".into(),
            if self.dns.is_null() {
                Value::Object(Map::new())
            } else {
                self.dns.clone()
            },
        );
        Value::Object(out)
    }
}

/// Parses `addr/prefix` into its parts, checking the prefix fits the family.
pub fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (a, p) = s.split_once('/')?;
    let addr: IpAddr = a.parse().ok()?;
    let prefix: u8 = p.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some((addr, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![Interface {
                name: "net1".into(),
                mac: Some("02:00:00:00:00:01".into()),
                mtu: Some(1400),
                sandbox: Some("/run/netns/p".into()),
                other: Map::new(),
            }],
            ips: vec![
                IpConfig {
                    address: "192.0.2.10/24".into(),
                    gateway: Some("192.0.2.1".parse().unwrap()),
                    interface: Some(0),
                    other: Map::new(),
                },
                IpConfig {
                    address: "2001:db8::10/64".into(),
                    gateway: None,
                    interface: Some(0),
                    other: Map::new(),
                },
            ],
            routes: vec![Route {
                dst: "0.0.0.0/0".into(),
                gw: None,
                other: Map::new(),
            }],
            dns: json!({"nameservers": ["192.0.2.53"]}),
        }
    }

    #[test]
    fn old_versions_carry_ip_version_and_no_mtu() {
        let v = sample().to_value(Version::V0_3_1);
        assert_eq!(v["cniVersion"], "0.3.1");
        assert_eq!(v["ips"][0]["version"], "4");
        assert_eq!(v["ips"][1]["version"], "6");
        assert!(v["interfaces"][0].get("mtu").is_none());
        assert_eq!(v["interfaces"][0]["sandbox"], "/run/netns/p");
    }

    #[test]
    fn new_versions_carry_mtu_and_no_ip_version() {
        let v = sample().to_value(Version::V1_0_0);
        assert_eq!(v["interfaces"][0]["mtu"], 1400);
        assert!(v["ips"][0].get("version").is_none());
        assert_eq!(v["ips"][0]["gateway"], "192.0.2.1");
        assert_eq!(v["dns"]["nameservers"][0], "192.0.2.53");
    }

    #[test]
    fn results_round_trip_through_every_version() {
        for ver in [Version::V0_3_0, Version::V0_4_0, Version::V1_1_0] {
            let back = CniResult::from_value(&sample().to_value(ver), "test").unwrap();
            assert_eq!(back.ips, sample().ips);
            assert_eq!(back.routes, sample().routes);
        }
    }

    #[test]
    fn unknown_fields_are_kept() {
        let v = json!({"cniVersion":"1.1.0","interfaces":[{"name":"eth0","socketPath":"/s"}],
                       "ips":[],"routes":[{"dst":"10.0.0.0/8","table":100}]});
        let r = CniResult::from_value(&v, "prevResult").unwrap();
        let out = r.to_value(Version::V1_1_0);
        assert_eq!(out["interfaces"][0]["socketPath"], "/s");
        assert_eq!(out["routes"][0]["table"], 100);
    }

    #[test]
    fn bad_addresses_are_refused() {
        let v = json!({"ips":[{"address":"192.0.2.1/33"}]});
        assert_eq!(CniResult::from_value(&v, "x").unwrap_err().code(), 7);
        assert_eq!(parse_cidr("2001:db8::1/64").unwrap().1, 64);
    }
}
