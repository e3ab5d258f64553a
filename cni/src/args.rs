//! `CNI_ARGS`: `K=V` pairs separated by `;`, as Multus and the kubelet send them.

use crate::error::{Error, Result};

/// Keys that the runtime or Multus sends to every plugin.
const STANDARD_KEYS: [&str; 5] = [
    "IgnoreUnknown",
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_INFRA_CONTAINER_ID",
    "K8S_POD_UID",
];

/// The parsed `CNI_ARGS`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CniArgs {
    /// `MAC=`: the MAC address to give the link.
    pub mac: Option<String>,
    /// `K8S_POD_NAMESPACE=`, for logs.
    pub pod_namespace: Option<String>,
    /// `K8S_POD_NAME=`, for logs.
    pub pod_name: Option<String>,
}

impl CniArgs {
    /// `namespace/name` of the pod for logs, or `-` when the runtime sent neither.
    pub(crate) fn pod_ref(&self) -> String {
        match (&self.pod_namespace, &self.pod_name) {
            (None, None) => "-".to_string(),
            (ns, name) => format!(
                "{}/{}",
                ns.as_deref().unwrap_or("?"),
                name.as_deref().unwrap_or("?")
            ),
        }
    }

    /// Parses `CNI_ARGS`. A key we do not know is an error unless
    /// `IgnoreUnknown` is `true` or `1`.
    pub(crate) fn parse(s: &str) -> Result<Self> {
        let bad = |msg: String| Error::InvalidEnv {
            var: "CNI_ARGS",
            msg,
        };
        let mut pairs = Vec::new();
        for item in s.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| bad(format!("{item:?} is not of the form KEY=VALUE")))?;
            pairs.push((k, v));
        }
        let ignore_unknown = pairs
            .iter()
            .any(|(k, v)| *k == "IgnoreUnknown" && (v.eq_ignore_ascii_case("true") || *v == "1"));
        let mut args = CniArgs::default();
        for (k, v) in pairs {
            match k {
                "MAC" => args.mac = Some(v.to_string()),
                "K8S_POD_NAMESPACE" => args.pod_namespace = Some(v.to_string()),
                "K8S_POD_NAME" => args.pod_name = Some(v.to_string()),
                _ if STANDARD_KEYS.contains(&k) || ignore_unknown => {}
                _ => {
                    return Err(bad(format!(
                        "unknown key {k:?} (set IgnoreUnknown=true to allow unknown keys)"
                    )));
                }
            }
        }
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multus_args_parse() {
        let a = CniArgs::parse(
            "IgnoreUnknown=true;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=vm-1;\
             K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u;MAC=02:00:00:00:00:01;FOO=bar",
        )
        .unwrap();
        assert_eq!(a.mac.as_deref(), Some("02:00:00:00:00:01"));
        assert_eq!(a.pod_name.as_deref(), Some("vm-1"));
    }

    #[test]
    fn unknown_keys_need_ignore_unknown() {
        let e = CniArgs::parse("FOO=bar;MAC=02:00:00:00:00:01").unwrap_err();
        assert_eq!(e.code(), 4);
        assert!(e.to_string().contains("FOO"));
        assert!(CniArgs::parse("IgnoreUnknown=1;FOO=bar").is_ok());
        assert!(CniArgs::parse("IgnoreUnknown=false;FOO=bar").is_err());
    }

    #[test]
    fn standard_keys_need_no_ignore_unknown() {
        assert!(CniArgs::parse("K8S_POD_NAMESPACE=a;K8S_POD_NAME=b;K8S_POD_UID=c").is_ok());
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
    }

    #[test]
    fn pairs_without_equals_are_refused() {
        assert_eq!(CniArgs::parse("MAC").unwrap_err().code(), 4);
    }
}
