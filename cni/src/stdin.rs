//! The network configuration as the runtime wrote it on stdin, decoded
//! once: the bytes, which a delegated IPAM plugin gets as they are and the
//! strict [`NetConf`] is read from, and the JSON they hold, from which the
//! lenient readers take what they need even from a configuration that is
//! otherwise invalid: the `cniVersion` asked for (the VERSION answer, an
//! error's version), `logFile`, and GC's body for IPAM.
//!
//! The NetConf is read from the bytes rather than from the JSON value: a
//! value keeps a repeated key's last value and no position, where the
//! typed read refuses a repeated field and says where a wrong one is.

use crate::config::NetConf;
use crate::error::Result;
use serde_json::Value;

/// stdin, with the JSON it holds decoded once.
#[derive(Debug, Clone)]
pub struct Stdin<'a> {
    bytes: &'a [u8],
    /// The JSON value, if stdin is JSON.
    json: Option<Value>,
}

impl<'a> Stdin<'a> {
    /// `bytes` as read from stdin, decoded as JSON.
    pub fn decode(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            json: serde_json::from_slice(bytes).ok(),
        }
    }

    /// The bytes as written: what a delegated IPAM plugin reads.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The JSON value, if stdin is JSON.
    pub fn json(&self) -> Option<&Value> {
        self.json.as_ref()
    }

    /// The network configuration: undecodable JSON is code 6, a wrong
    /// shape code 7 and an unsupported `cniVersion` code 1
    /// ([`NetConf::parse`]).
    pub fn net_conf(&self) -> Result<NetConf> {
        NetConf::parse(self.bytes)
    }

    /// The `cniVersion` as written, whatever else the configuration holds.
    pub fn requested_version(&self) -> Option<&str> {
        self.json.as_ref()?.get("cniVersion")?.as_str()
    }

    /// The NetConf's `logFile` as written, read leniently so that logging
    /// works even for a config that is otherwise invalid. It is a request,
    /// not a path to open: `logfile::open_log_file` confines it to the
    /// node's log directory.
    pub fn log_file(&self) -> Option<String> {
        self.json
            .as_ref()?
            .get("logFile")?
            .as_str()
            .filter(|p| !p.is_empty())
            .map(str::to_string)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_file_is_read_even_from_an_invalid_config() {
        let read = |s: &[u8]| Stdin::decode(s).log_file();
        assert_eq!(
            read(br#"{"cniVersion":"9","logFile":"/var/log/macvtap.log"}"#),
            Some("/var/log/macvtap.log".to_string())
        );
        assert_eq!(read(br#"{"logFile":""}"#), None);
        assert_eq!(read(br#"{"logFile":7}"#), None);
        assert_eq!(read(b"not json"), None);
    }

    #[test]
    fn the_version_asked_for_is_read_even_from_an_invalid_config() {
        let asked = |s: &'static [u8]| Stdin::decode(s).requested_version().map(str::to_string);
        assert_eq!(
            asked(br#"{"cniVersion":"0.4.0","mtu":"big"}"#).as_deref(),
            Some("0.4.0")
        );
        assert_eq!(asked(br#"{"cniVersion":4}"#), None);
        assert_eq!(asked(b""), None);
    }

    #[test]
    fn the_net_conf_is_read_strictly_from_the_bytes() {
        // A repeated field is refused (code 7), though the JSON value keeps
        // the last one.
        let twice = Stdin::decode(br#"{"cniVersion":"1.0.0","mtu":1500,"mtu":9000}"#);
        assert_eq!(twice.json().unwrap()["mtu"], 9000);
        let e = twice.net_conf().unwrap_err();
        assert_eq!(e.code(), 7, "{e}");
        assert!(e.to_string().contains("duplicate field `mtu`"), "{e}");
        let ok = Stdin::decode(br#"{"cniVersion":"1.0.0","mtu":1500}"#);
        assert_eq!(ok.net_conf().unwrap().mtu, 1500);
        assert_eq!(ok.bytes(), br#"{"cniVersion":"1.0.0","mtu":1500}"#);
    }
}
