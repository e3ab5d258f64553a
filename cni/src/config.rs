//! The network configuration (NetConf) read from stdin (`crate::stdin`).

use crate::args::CniArgs;
use crate::error::{Error, Result};
use crate::version::Version;
use macvtap_link::link::parse_mac;
use serde::Deserialize;
use serde_json::Value;

/// The uid and gid `/dev/tapN` is given by default: the qemu user of virt-launcher.
pub(crate) const DEFAULT_OWNER: u32 = 107;

/// The plugin's network configuration, as Multus hands it over.
#[derive(Debug, Clone, Deserialize)]
pub struct NetConf {
    /// `cniVersion`, as written.
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    /// Network name.
    #[serde(default)]
    pub name: String,
    /// Plugin type (`macvtap`).
    #[serde(rename = "type", default)]
    pub plugin_type: String,
    /// The device ID that the device plugin allocated and Multus injected.
    #[serde(rename = "deviceID", default)]
    pub device_id: String,
    /// The extended resource this network's device is of
    /// (`macvtap.network.kubevirt.io/<name>`), as the NAD's
    /// `k8s.v1.cni.cncf.io/resourceName` annotation names it: only read when
    /// there is no `deviceID`, to pick among the pod's devices allocated
    /// through Dynamic Resource Allocation (`crate::dra`); checked there.
    #[serde(rename = "resourceName")]
    pub resource_name: Option<String>,
    /// MTU to set; 0 leaves the link's MTU as it is.
    #[serde(default)]
    pub mtu: u32,
    /// Whether to put the link in promiscuous mode.
    #[serde(rename = "promiscMode", default)]
    pub promisc_mode: bool,
    /// Owner uid of `/dev/tapN`.
    pub owner: Option<u32>,
    /// Owner gid of `/dev/tapN`.
    pub group: Option<u32>,
    /// MAC address from the NetConf itself (lowest precedence).
    pub mac: Option<String>,
    /// Capabilities set by the runtime.
    #[serde(rename = "runtimeConfig", default)]
    pub runtime_config: RuntimeConfig,
    /// IPAM section, delegated to the plugin named by its `type`.
    pub ipam: Option<Value>,
    /// The result of the previous plugin in a chain (or of ADD, for CHECK).
    #[serde(rename = "prevResult")]
    pub prev_result: Option<Value>,
    /// Attachments still valid, for GC (spec 1.1): read so that a malformed
    /// list is refused; GC hands IPAM the raw list (`crate::status::gc`).
    #[serde(rename = "cni.dev/valid-attachments")]
    pub valid_attachments: Option<Vec<Attachment>>,
    /// The older spelling of the same list.
    #[serde(rename = "cni.dev/attachments")]
    pub attachments: Option<Vec<Attachment>>,
    /// The version, parsed.
    #[serde(skip, default = "latest")]
    pub version: Version,
}

fn latest() -> Version {
    Version::V1_1_0
}

/// Values the runtime fills in for declared capabilities.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RuntimeConfig {
    /// The `mac` capability.
    pub mac: Option<String>,
}

/// One attachment in a GC request.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Attachment {
    /// Container ID.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Interface name.
    pub ifname: String,
}

impl NetConf {
    /// Parses stdin: undecodable JSON is code 6, a wrong shape code 7 and an
    /// unsupported `cniVersion` code 1.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let mut conf: NetConf = serde_json::from_slice(bytes).map_err(|e| {
            if e.is_data() {
                Error::InvalidConfig(e.to_string())
            } else {
                Error::Decode(e.to_string())
            }
        })?;
        conf.version = Version::parse(&conf.cni_version)?;
        if let Some(ipam) = &conf.ipam {
            conf.ipam_type_of(ipam)?;
        }
        Ok(conf)
    }

    /// The IPAM plugin type, when there is an `ipam` section.
    pub(crate) fn ipam_type(&self) -> Result<Option<String>> {
        self.ipam.as_ref().map(|i| self.ipam_type_of(i)).transpose()
    }

    fn ipam_type_of(&self, ipam: &Value) -> Result<String> {
        match ipam.get("type").and_then(Value::as_str) {
            Some(t) if !t.is_empty() && !t.contains('/') => Ok(t.to_string()),
            Some(t) => Err(Error::InvalidConfig(format!(
                "ipam.type {t:?} is not a plugin name"
            ))),
            None if ipam.as_object().is_some_and(|o| o.is_empty()) => Err(Error::InvalidConfig(
                "ipam is empty; remove it or give ipam.type".into(),
            )),
            None => Err(Error::InvalidConfig("ipam has no \"type\"".into())),
        }
    }

    /// The MAC to set, by precedence: `runtimeConfig.mac`, then `CNI_ARGS`
    /// `MAC=`, then `mac`. `None` keeps the kernel's address.
    pub(crate) fn resolve_mac(&self, args: &CniArgs) -> Result<Option<[u8; 6]>> {
        let candidates = [
            ("runtimeConfig.mac", self.runtime_config.mac.as_deref()),
            ("CNI_ARGS MAC", args.mac.as_deref()),
            ("mac", self.mac.as_deref()),
        ];
        let Some((source, text)) = candidates
            .into_iter()
            .find_map(|(s, v)| v.filter(|v| !v.is_empty()).map(|v| (s, v)))
        else {
            return Ok(None);
        };
        let mac = parse_mac(text).ok_or_else(|| {
            Error::InvalidConfig(format!("{source} {text:?} is not a MAC address"))
        })?;
        if mac[0] & 1 == 1 {
            return Err(Error::InvalidConfig(format!(
                "{source} {text} is a multicast address; a link needs a unicast MAC"
            )));
        }
        if mac == [0; 6] {
            return Err(Error::InvalidConfig(format!(
                "{source} {text} is all zeros"
            )));
        }
        Ok(Some(mac))
    }

    /// uid that `/dev/tapN` is given.
    pub(crate) fn owner(&self) -> u32 {
        self.owner.unwrap_or(DEFAULT_OWNER)
    }

    /// gid that `/dev/tapN` is given.
    pub(crate) fn group(&self) -> u32 {
        self.group.unwrap_or(DEFAULT_OWNER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(json: &str) -> NetConf {
        NetConf::parse(json.as_bytes()).unwrap()
    }

    #[test]
    fn the_go_projects_netconf_parses() {
        let c = conf(
            r#"{"cniVersion":"0.3.1","name":"dataplane","type":"macvtap","mtu":1500,
               "deviceID":"dataplaneMvp3","promiscMode":true,"owner":0,"group":5}"#,
        );
        assert_eq!(c.device_id, "dataplaneMvp3");
        assert_eq!(c.mtu, 1500);
        assert!(c.promisc_mode);
        assert_eq!((c.owner(), c.group()), (0, 5));
        assert_eq!(c.version, Version::V0_3_1);
    }

    #[test]
    fn old_netconf_versions_the_go_plugin_accepted_parse() {
        for (text, v) in [("0.1.0", Version::V0_1_0), ("0.2.0", Version::V0_2_0)] {
            let c = conf(&format!(
                r#"{{"cniVersion":"{text}","name":"n","type":"macvtap","deviceID":"eth0Mvp1"}}"#
            ));
            assert_eq!(c.version, v);
        }
    }

    #[test]
    fn owner_and_group_default_to_qemu() {
        let c = conf(r#"{"cniVersion":"1.0.0","name":"n","type":"macvtap"}"#);
        assert_eq!((c.owner(), c.group()), (107, 107));
        assert_eq!(c.mtu, 0);
    }

    #[test]
    fn mac_precedence_is_runtime_config_then_args_then_netconf() {
        let args = CniArgs::parse("MAC=02:00:00:00:00:02").unwrap();
        let all = conf(
            r#"{"cniVersion":"1.0.0","name":"n","type":"macvtap","mac":"02:00:00:00:00:03",
               "runtimeConfig":{"mac":"02:00:00:00:00:01"}}"#,
        );
        assert_eq!(
            all.resolve_mac(&args).unwrap(),
            parse_mac("02:00:00:00:00:01")
        );
        let no_rt =
            conf(r#"{"cniVersion":"1.0.0","name":"n","type":"macvtap","mac":"02:00:00:00:00:03"}"#);
        assert_eq!(
            no_rt.resolve_mac(&args).unwrap(),
            parse_mac("02:00:00:00:00:02")
        );
        assert_eq!(
            no_rt.resolve_mac(&CniArgs::default()).unwrap(),
            parse_mac("02:00:00:00:00:03")
        );
        let none = conf(r#"{"cniVersion":"1.0.0","name":"n","type":"macvtap"}"#);
        assert_eq!(none.resolve_mac(&CniArgs::default()).unwrap(), None);
    }

    #[test]
    fn bad_macs_are_invalid_config() {
        for mac in ["nope", "01:00:5e:00:00:01", "00:00:00:00:00:00"] {
            let c = conf(&format!(
                r#"{{"cniVersion":"1.0.0","name":"n","type":"macvtap","mac":"{mac}"}}"#
            ));
            assert_eq!(
                c.resolve_mac(&CniArgs::default()).unwrap_err().code(),
                7,
                "{mac}"
            );
        }
    }

    #[test]
    fn parse_errors_have_the_spec_codes() {
        let code = |s: &str| NetConf::parse(s.as_bytes()).unwrap_err().code();
        assert_eq!(code("{not json"), 6);
        assert_eq!(code(""), 6);
        assert_eq!(code(r#"{"cniVersion":"1.0.0","mtu":-1}"#), 7);
        assert_eq!(code(r#"{"cniVersion":"1.0.0","mtu":"big"}"#), 7);
        assert_eq!(code(r#"{"name":"n"}"#), 7);
        assert_eq!(code(r#"{"cniVersion":"0.0.9"}"#), 1);
        assert_eq!(code(r#"{"cniVersion":"1.0.0","ipam":{}}"#), 7);
        assert_eq!(code(r#"{"cniVersion":"1.0.0","ipam":{"type":"../x"}}"#), 7);
    }

    #[test]
    fn gc_accepts_both_attachment_spellings() {
        let new = conf(
            r#"{"cniVersion":"1.1.0","name":"n","type":"macvtap",
               "cni.dev/valid-attachments":[{"containerID":"a","ifname":"net1"}]}"#,
        );
        let old = conf(
            r#"{"cniVersion":"1.1.0","name":"n","type":"macvtap",
               "cni.dev/attachments":[{"containerID":"a","ifname":"net1"}]}"#,
        );
        assert_eq!(new.valid_attachments, old.attachments);
        assert_eq!(new.valid_attachments.unwrap().len(), 1);
        assert_eq!((new.attachments, old.valid_attachments), (None, None));
    }
}
