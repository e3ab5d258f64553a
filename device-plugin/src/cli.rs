//! Command-line flags.

use crate::config::ENV_VAR;
use crate::options::Options;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Parser, Subcommand, ValueEnum};
use macvtap_link::PodResourcesCheck;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `macvtap-deviceplugin`: advertises macvtap devices on host NICs to the kubelet.
#[derive(Debug, Clone, Parser)]
#[command(name = "macvtap-deviceplugin", version, about)]
pub struct Args {
    /// Run a one-off task instead of the daemon.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// The kubelet's root directory; sockets go to DIR/device-plugins, the
    /// PodResources API is read from DIR/pod-resources/kubelet.sock.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,

    /// A JSON file in the DP_MACVTAP_CONF format; wins over the environment
    /// and is re-read when it changes.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// A resource, winning over the file and the environment (repeatable):
    /// `name=N,lowerDevice=NIC,mode=bridge|vepa|private|passthru,capacity=C`,
    /// or just a NIC name.
    #[arg(long = "resource", value_name = "SPEC")]
    pub resources: Vec<String>,

    /// Link kinds that auto-discovery treats as NICs, besides physical NICs
    /// and bonds (comma-separated, e.g. `veth` on test nodes).
    #[arg(long, value_name = "KINDS", value_delimiter = ',')]
    pub discover_kinds: Vec<String>,

    /// Address for /metrics and /healthz; `off` disables them.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:9402")]
    pub metrics_addr: String,

    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// How often to look for leaked links (e.g. `60s`, `5m`, `500ms`).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub reclaim_interval: Duration,

    /// How long a link must be allocated to no pod before it is deleted.
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = parse_duration)]
    pub reclaim_grace: Duration,

    /// How long one Register call to the kubelet may take before it is
    /// given up and retried (it never holds up anything else).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub register_timeout: Duration,

    /// This node's name, for Kubernetes Events on its Node (the DaemonSet
    /// sets `NODE_NAME` from `spec.nodeName`); without it Events are off.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
}

/// One-off tasks of the binary.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Copy the CNI binary into the host's CNI bin dir, atomically (the
    /// DaemonSet's init container runs this).
    InstallCni(InstallArgs),
    /// Check this node (NICs, kubelet, the daemon, the installed CNI, the
    /// kernel) and say what is wrong, one sentence per finding; exits 1 when
    /// anything is a problem. Takes the daemon's flags for what it checks.
    Doctor(DoctorArgs),
}

/// How `doctor` prints its findings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// One line per finding: level, then a sentence.
    Text,
    /// A JSON array of `{"level","check","message"}` objects, for tooling.
    Json,
}

/// Flags of `doctor`.
#[derive(Debug, Clone, clap::Args)]
pub struct DoctorArgs {
    /// The host's CNI bin dir, where the container runtime finds CNI plugins
    /// (as mounted where `doctor` runs).
    #[arg(long, value_name = "DIR", default_value = "/opt/cni/bin")]
    pub cni_bin_dir: PathBuf,
    /// The CNI's file name in that dir (install-cni's `--name`).
    #[arg(long, value_name = "NAME", default_value = "macvtap")]
    pub cni_name: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

/// Flags of `install-cni`.
#[derive(Debug, Clone, clap::Args)]
pub struct InstallArgs {
    /// The CNI binary to install.
    #[arg(long, value_name = "FILE", default_value = "/macvtap")]
    pub source: PathBuf,
    /// The host's CNI bin dir as mounted in the container; must exist.
    #[arg(long, value_name = "DIR")]
    pub target_dir: PathBuf,
    /// File name in the target dir (the NetConf's `type`).
    #[arg(long, default_value = "macvtap")]
    pub name: String,
    /// The kubelet's root dir as the node sees it, written into the CNI's
    /// node settings (`macvtap.settings.json` beside the binary): the CNI
    /// asks `<dir>/pod-resources/kubelet.sock` whether a device is the pod's.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// What the CNI's ADD does when that socket cannot be asked: `warn` and
    /// go on, or `enforce` (refuse; the runtime retries).
    #[arg(
        long,
        default_value = "warn",
        value_parser = PossibleValuesParser::new([
            PossibleValue::new("warn").help("Log a warning and go on"),
            PossibleValue::new("enforce").help("Refuse the ADD (code 11, the runtime retries)"),
        ])
        .try_map(|s| s.parse::<PodResourcesCheck>()),
    )]
    pub pod_resources_check: PodResourcesCheck,
}

impl Args {
    /// The daemon options these flags and the environment describe.
    pub fn options(&self) -> Result<Options, String> {
        let metrics_addr = match self.metrics_addr.trim() {
            "" | "off" => None,
            a => Some(
                a.parse::<SocketAddr>()
                    .map_err(|e| format!("--metrics-addr {a:?}: {e}"))?,
            ),
        };
        Ok(Options {
            kubelet_dir: self.kubelet_dir.clone(),
            config_file: self.config.clone(),
            resource_flags: self.resources.clone(),
            env_config: std::env::var(ENV_VAR).ok(),
            discover_kinds: self
                .discover_kinds
                .iter()
                .filter(|k| !k.is_empty())
                .cloned()
                .collect(),
            metrics_addr,
            reclaim_interval: self.reclaim_interval,
            reclaim_grace: self.reclaim_grace,
            sysfs: PathBuf::from("/sys"),
            register_timeout: self.register_timeout,
            node_name: self.node_name.clone(),
        })
    }
}

/// Parses `500ms`, `60s`, `5m`, `1h`, or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 500ms, 60s, 5m or 1h"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m or h)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("60s").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("60").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn flags_parse_with_defaults() {
        let a = Args::try_parse_from(["macvtap-deviceplugin"]).unwrap();
        assert_eq!(a.kubelet_dir, PathBuf::from("/var/lib/kubelet"));
        assert_eq!(a.log_format, LogFormat::Text);
        let o = a.options().unwrap();
        assert_eq!(o.metrics_addr, Some("0.0.0.0:9402".parse().unwrap()));
        assert_eq!(o.reclaim_interval, Duration::from_secs(60));
        let a = Args::try_parse_from([
            "x",
            "--resource",
            "eth0",
            "--resource=name=a,lowerDevice=eth1",
            "--discover-kinds",
            "veth,bond",
            "--metrics-addr",
            "off",
            "--log-format",
            "json",
        ])
        .unwrap();
        assert_eq!(a.resources, ["eth0", "name=a,lowerDevice=eth1"]);
        assert_eq!(a.discover_kinds, ["veth", "bond"]);
        assert_eq!(a.options().unwrap().metrics_addr, None);
        assert!(Args::try_parse_from(["x", "--log-format", "xml"]).is_err());
    }

    #[test]
    fn doctor_takes_the_daemon_flags() {
        let a = Args::try_parse_from(["x", "--resource", "eth1", "doctor", "--output", "json"])
            .unwrap();
        assert_eq!(a.resources, ["eth1"]);
        let Some(Command::Doctor(d)) = a.command else {
            panic!("{a:?}")
        };
        assert_eq!(d.output, Output::Json);
        assert_eq!(d.cni_bin_dir, PathBuf::from("/opt/cni/bin"));
        assert_eq!(d.cni_name, "macvtap");
    }
}
