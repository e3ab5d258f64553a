//! CNI results: one internal model, printed in the config's `cniVersion`.
//!
//! Results of 0.1.0 and 0.2.0 have another shape (`ip4`/`ip6`, each with its
//! routes, no interfaces); they are converted to and from the model as the
//! reference library does (containernetworking/cni `pkg/types/100/types.go`
//! `convertFrom02x` and `convertTo02x`, through `pkg/types/040`).

use crate::error::{Error, Result};
use crate::version::Version;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::net::IpAddr;

/// An interface in a result.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct Interface {
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
pub(crate) struct IpConfig {
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
pub(crate) struct Route {
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
pub(crate) struct CniResult {
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
    pub(crate) fn from_value(v: &Value, what: &str) -> Result<Self> {
        let mut r: CniResult = if is_02x_value(v) {
            serde_json::from_value::<Result02x>(v.clone())
                .map_err(|e| {
                    Error::InvalidConfig(format!("{what} is not a CNI 0.2.0 result: {e}"))
                })?
                .into_current()
        } else {
            serde_json::from_value(v.clone())
                .map_err(|e| Error::InvalidConfig(format!("{what} is not a CNI result: {e}")))?
        };
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
    pub(crate) fn to_value(&self, version: Version) -> Value {
        if version.is_02x() {
            return self.to_02x(version);
        }
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
        // Empty `ips` is left out, as libcni's `omitempty` leaves it (the Go
        // plugin's result has no `ips` without IPAM).
        if !self.ips.is_empty() {
            out.insert("ips".into(), Value::Array(ips));
        }
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

/// The `ip4`/`ip6` part of a 0.1.0 or 0.2.0 result.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct IpConfig02x {
    ip: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routes: Vec<Route>,
}

/// A 0.1.0 or 0.2.0 result.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
struct Result02x {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ip4: Option<IpConfig02x>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ip6: Option<IpConfig02x>,
    #[serde(default)]
    dns: Value,
}

impl Result02x {
    /// `convertFrom02x`: each of `ip4` and `ip6` becomes an address (tied to
    /// no interface), its routes follow it.
    fn into_current(self) -> CniResult {
        let mut r = CniResult {
            dns: self.dns,
            ..Default::default()
        };
        for ip in [self.ip4, self.ip6].into_iter().flatten() {
            r.ips.push(IpConfig {
                address: ip.ip,
                gateway: ip.gateway,
                interface: None,
                other: Map::new(),
            });
            r.routes.extend(ip.routes);
        }
        r
    }
}

/// Whether `v` has the 0.1.0/0.2.0 shape: it says so, or it has `ip4` or
/// `ip6` and none of the later fields.
fn is_02x_value(v: &Value) -> bool {
    match v.get("cniVersion").and_then(Value::as_str) {
        Some(ver) => Version::parse(ver).is_ok_and(Version::is_02x),
        None => {
            (v.get("ip4").is_some() || v.get("ip6").is_some())
                && v.get("ips").is_none()
                && v.get("interfaces").is_none()
        }
    }
}

impl CniResult {
    /// `convertTo02x`: the first IPv4 and the first IPv6 address (0.2.0 has
    /// room for one of each), each route under the address of its family
    /// with only `dst` and `gw`, and no interfaces. The reference library
    /// refuses a result without addresses ("cannot convert: no valid IP
    /// addresses"); a macvtap without IPAM has none, so this prints the
    /// result without `ip4` and `ip6`, which every reader of 0.2.0 accepts.
    fn to_02x(&self, version: Version) -> Value {
        let mut out = Result02x::default();
        for ip in &self.ips {
            let Some((addr, _)) = parse_cidr(&ip.address) else {
                continue;
            };
            let slot = if addr.is_ipv4() {
                &mut out.ip4
            } else {
                &mut out.ip6
            };
            if slot.is_none() {
                *slot = Some(IpConfig02x {
                    ip: ip.address.clone(),
                    gateway: ip.gateway,
                    routes: Vec::new(),
                });
            }
        }
        for route in &self.routes {
            let Some((dst, _)) = parse_cidr(&route.dst) else {
                continue;
            };
            let slot = if dst.is_ipv4() {
                &mut out.ip4
            } else {
                &mut out.ip6
            };
            if let Some(ip) = slot {
                ip.routes.push(Route {
                    dst: route.dst.clone(),
                    gw: route.gw,
                    other: Map::new(),
                });
            }
        }
        out.dns = if self.dns.is_null() {
            Value::Object(Map::new())
        } else {
            self.dns.clone()
        };
        let mut v = serde_json::to_value(out).unwrap_or(Value::Null);
        if let Some(obj) = v.as_object_mut() {
            obj.insert("cniVersion".into(), Value::from(version.as_str()));
        }
        v
    }
}

/// Parses `addr/prefix` into its parts, checking the prefix fits the family.
pub(crate) fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
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

    #[test]
    fn a_result_without_addresses_has_no_ips_key_as_libcni_prints_it() {
        let r = CniResult {
            ips: Vec::new(),
            ..sample()
        };
        for ver in [Version::V0_3_1, Version::V0_4_0, Version::V1_0_0] {
            let v = r.to_value(ver);
            assert!(v.get("ips").is_none(), "{v}");
            assert_eq!(v["interfaces"][0]["name"], "net1", "{v}");
        }
        assert!(sample().to_value(Version::V1_0_0)["ips"].is_array());
    }

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
    fn version_0_2_0_prints_ip4_and_ip6_without_interfaces() {
        let mut r = sample();
        r.ips.push(IpConfig {
            address: "192.0.2.11/24".into(),
            gateway: None,
            interface: Some(0),
            other: Map::new(),
        });
        r.routes.push(Route {
            dst: "2001:db8:1::/48".into(),
            gw: Some("2001:db8::1".parse().unwrap()),
            other: Map::from_iter([("table".to_string(), json!(100))]),
        });
        for ver in [Version::V0_1_0, Version::V0_2_0] {
            let v = r.to_value(ver);
            assert_eq!(v["cniVersion"], ver.as_str());
            assert!(v.get("interfaces").is_none(), "{v}");
            assert!(v.get("ips").is_none(), "{v}");
            // Only the first address of each family fits.
            assert_eq!(
                v["ip4"],
                json!({"ip": "192.0.2.10/24", "gateway": "192.0.2.1",
                       "routes": [{"dst": "0.0.0.0/0"}]})
            );
            assert_eq!(
                v["ip6"],
                json!({"ip": "2001:db8::10/64",
                       "routes": [{"dst": "2001:db8:1::/48", "gw": "2001:db8::1"}]})
            );
            assert_eq!(v["dns"]["nameservers"][0], "192.0.2.53");
        }
    }

    #[test]
    fn version_0_2_0_without_addresses_prints_no_ip4() {
        let r = CniResult {
            interfaces: sample().interfaces,
            ..Default::default()
        };
        let v = r.to_value(Version::V0_2_0);
        assert_eq!(v, json!({"cniVersion": "0.2.0", "dns": {}}));
    }

    #[test]
    fn a_0_2_0_result_converts_as_the_spec_says() {
        // An IPAM plugin run with a 0.2.0 config prints this shape.
        let v = json!({"cniVersion": "0.2.0",
            "ip4": {"ip": "192.0.2.10/24", "gateway": "192.0.2.1",
                    "routes": [{"dst": "0.0.0.0/0"}]},
            "ip6": {"ip": "2001:db8::10/64", "routes": [{"dst": "::/0", "gw": "2001:db8::1"}]},
            "dns": {"nameservers": ["192.0.2.53"]}});
        let r = CniResult::from_value(&v, "prevResult").unwrap();
        assert!(r.interfaces.is_empty());
        assert_eq!(
            r.ips.iter().map(|i| i.address.as_str()).collect::<Vec<_>>(),
            ["192.0.2.10/24", "2001:db8::10/64"]
        );
        assert_eq!(r.ips[0].gateway, Some("192.0.2.1".parse().unwrap()));
        assert_eq!(r.ips[0].interface, None);
        assert_eq!(
            r.routes.iter().map(|r| r.dst.as_str()).collect::<Vec<_>>(),
            ["0.0.0.0/0", "::/0"]
        );
        assert_eq!(r.dns["nameservers"][0], "192.0.2.53");
        // Without cniVersion the shape decides; and it prints back the same.
        let mut bare = v.clone();
        bare.as_object_mut().unwrap().remove("cniVersion");
        assert_eq!(CniResult::from_value(&bare, "x").unwrap(), r);
        assert_eq!(r.to_value(Version::V0_2_0), v);
        // The same result printed for 0.4.0 has ips with versions.
        let v4 = r.to_value(Version::V0_4_0);
        assert_eq!(v4["ips"][1]["version"], "6");
        assert_eq!(v4["interfaces"], json!([]));
    }

    #[test]
    fn a_bad_0_2_0_result_is_refused() {
        let v = json!({"cniVersion": "0.2.0", "ip4": {"ip": "192.0.2.300/24"}});
        assert_eq!(CniResult::from_value(&v, "x").unwrap_err().code(), 7);
        let v = json!({"cniVersion": "0.1.0", "ip4": {"gateway": "192.0.2.1"}});
        assert_eq!(CniResult::from_value(&v, "x").unwrap_err().code(), 7);
    }

    #[test]
    fn bad_addresses_are_refused() {
        let v = json!({"ips":[{"address":"192.0.2.1/33"}]});
        assert_eq!(CniResult::from_value(&v, "x").unwrap_err().code(), 7);
        assert_eq!(parse_cidr("2001:db8::1/64").unwrap().1, 64);
    }
}
