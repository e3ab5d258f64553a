//! What the daemon is told at start: [`Options`], made by the CLI from
//! flags and the environment, and the reading of the configuration sources
//! they name.

use crate::config::{self, DiscoveryPolicy, Resolved, Sources};
use crate::error::{Error, Result};
use crate::operator::owner::Owner;
use kubelet_proto::v1beta1::KUBELET_SOCKET;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Everything the daemon needs, from flags and environment.
#[derive(Debug, Clone)]
pub struct Options {
    /// The kubelet's root directory (`/var/lib/kubelet`).
    pub kubelet_dir: PathBuf,
    /// `--config FILE`.
    pub config_file: Option<PathBuf>,
    /// `--resource` flags.
    pub resource_flags: Vec<String>,
    /// The value of `DP_MACVTAP_CONF`.
    pub env_config: Option<String>,
    /// Link kinds that auto-discovery treats as NICs besides physical NICs and bonds.
    pub discover_kinds: Vec<String>,
    /// Which NICs auto-discovery offers; `None`: by the configuration's
    /// source ([`DiscoveryPolicy::default_for`]).
    pub discovery: Option<DiscoveryPolicy>,
    /// NICs with a global address that auto-discovery offers all the same
    /// under the `spare` policy.
    pub discover_include: Vec<String>,
    /// Where to serve `/metrics` and `/healthz`, if anywhere.
    pub metrics_addr: Option<SocketAddr>,
    /// How often to look for leaked links.
    pub reclaim_interval: Duration,
    /// How long a link must look leaked before it is deleted.
    pub reclaim_grace: Duration,
    /// Where sysfs is mounted (`/sys`).
    pub sysfs: PathBuf,
    /// How long one Register call (connect and call) may take.
    pub register_timeout: Duration,
    /// The node's name, for Events on its Node; `None` turns Events off.
    pub node_name: Option<String>,
    /// The DaemonSet running the daemon, whose deletion (an uninstall)
    /// makes the daemon clean the node as it exits; `None`: never.
    pub owner: Option<Owner>,
    /// The host's CNI bin dir as mounted, whose CNI binary and settings an
    /// uninstall removes; `None` leaves them.
    pub uninstall_cni_dir: Option<PathBuf>,
    /// The CNI binary this image ships: the installed one is removed at an
    /// uninstall only when its bytes are these.
    pub uninstall_cni_source: PathBuf,
    /// Which kubelet API serves the resources on this node.
    pub front: Front,
    /// The runtime's CDI spec directory, where the DRA front writes a spec
    /// per prepared claim.
    pub cdi_dir: PathBuf,
}

/// The kubelet API through which a node's macvtap resources are served:
/// one per node, so a resource name is never served by both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Front {
    /// The device plugin API: extended resources in the Node's allocatable.
    #[default]
    DevicePlugin,
    /// Dynamic Resource Allocation: ResourceSlices of driver
    /// `macvtap.network.kubevirt.io`, requested under the same names
    /// through a DeviceClass's `extendedResourceName` (Kubernetes 1.37+).
    Dra,
}

/// The DRA front's service socket under the kubelet's directory
/// `kubelet_dir`: `plugins/macvtap.network.kubevirt.io/dra.sock`, where the
/// kubelet's own helper puts a driver's (kubernetes/dynamic-resource-allocation
/// `kubeletplugin/draplugin.go`).
pub fn dra_socket(kubelet_dir: &Path) -> PathBuf {
    kubelet_dir
        .join("plugins")
        .join(macvtap_link::dra::DRIVER)
        .join("dra.sock")
}

/// The DRA front's registration socket, in the kubelet's plugin watcher
/// directory: `plugins_registry/macvtap.network.kubevirt.io-reg.sock`.
pub fn registration_socket(kubelet_dir: &Path) -> PathBuf {
    kubelet_dir
        .join("plugins_registry")
        .join(format!("{}-reg.sock", macvtap_link::dra::DRIVER))
}

impl Options {
    /// `<kubelet dir>/device-plugins`.
    pub(crate) fn plugin_dir(&self) -> PathBuf {
        self.kubelet_dir.join("device-plugins")
    }

    /// `<kubelet dir>/pod-resources/kubelet.sock`.
    pub(crate) fn pod_resources_socket(&self) -> PathBuf {
        self.kubelet_dir.join("pod-resources").join(KUBELET_SOCKET)
    }

    /// The configuration sources: the flags, the config file's `text` (when
    /// a file is configured) and the environment.
    pub(crate) fn sources(&self, file_text: Option<String>) -> Sources {
        Sources {
            flags: self.resource_flags.clone(),
            file: self.config_file.clone().zip(file_text),
            env: self.env_config.clone().filter(|s| !s.trim().is_empty()),
            discovery: self.discovery,
        }
    }

    /// The directory holding the config file, which is watched for edits.
    pub(crate) fn config_dir(&self) -> Option<PathBuf> {
        self.config_file.as_ref().map(|f| match f.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        })
    }
}

/// Reads the configuration sources named by `opts` and resolves them;
/// also returns the config file's text, if a file is configured and there.
/// A config file that does not exist (yet) is no source: a ConfigMap
/// mounted as an optional volume has no file until it is created, and the
/// watch of its directory applies it then.
pub(crate) fn load_config(opts: &Options) -> Result<(Resolved, Option<String>)> {
    let file_text = match &opts.config_file {
        Some(p) => read_config_file(p)?,
        None => None,
    };
    let resolved = config::resolve(&opts.sources(file_text.clone()))?;
    Ok((resolved, file_text))
}

/// The config file's text, or `None` when there is no such file; any other
/// failure to read it is an error.
pub(crate) fn read_config_file(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("reading the config file", path)(e)),
    }
}

#[cfg(test)]
impl Options {
    /// The CLI's defaults with `config_file`, for this crate's unit tests.
    pub(crate) fn for_tests(config_file: Option<PathBuf>) -> Options {
        Options {
            kubelet_dir: PathBuf::from("kubelet"),
            config_file,
            resource_flags: Vec::new(),
            env_config: None,
            discover_kinds: Vec::new(),
            discovery: None,
            discover_include: Vec::new(),
            metrics_addr: None,
            reclaim_interval: Duration::from_secs(60),
            reclaim_grace: Duration::from_secs(120),
            sysfs: PathBuf::from("/sys"),
            register_timeout: Duration::from_secs(5),
            node_name: None,
            owner: None,
            uninstall_cni_dir: None,
            uninstall_cni_source: PathBuf::from("/macvtap"),
            front: Front::DevicePlugin,
            cdi_dir: PathBuf::from("/var/run/cdi"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(config_file: Option<&str>) -> Options {
        Options {
            kubelet_dir: PathBuf::from("/var/lib/kubelet"),
            resource_flags: vec!["eth0".into()],
            env_config: Some("  ".into()),
            ..Options::for_tests(config_file.map(PathBuf::from))
        }
    }

    #[test]
    fn paths_follow_the_kubelet_dir_and_the_config_file() {
        let o = options(Some("/etc/macvtap/conf.json"));
        assert_eq!(o.plugin_dir(), Path::new("/var/lib/kubelet/device-plugins"));
        assert_eq!(
            o.pod_resources_socket(),
            Path::new("/var/lib/kubelet/pod-resources/kubelet.sock")
        );
        assert_eq!(o.config_dir().unwrap(), Path::new("/etc/macvtap"));
        assert_eq!(
            options(Some("conf.json")).config_dir().unwrap(),
            Path::new("."),
            "a bare file name is in the working directory"
        );
        assert_eq!(options(None).config_dir(), None);
    }

    #[test]
    fn sources_leave_out_a_blank_env_and_a_file_without_text() {
        let o = options(Some("conf.json"));
        let s = o.sources(Some("[]".into()));
        assert_eq!(s.flags, ["eth0"]);
        assert_eq!(s.file, Some((PathBuf::from("conf.json"), "[]".into())));
        assert_eq!(s.env, None, "a blank DP_MACVTAP_CONF is no source");
        assert_eq!(options(None).sources(Some("[]".into())).file, None);
    }
}
