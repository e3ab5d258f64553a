//! Command-line flags.

use crate::config::{DiscoveryPolicy, ENV_VAR};
use crate::glog::{self, GlogFlags};
use crate::logging::{self, LogFormat};
use crate::operator::owner::Owner;
use crate::options::{Front, Options};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use macvtap_link::PodResourcesCheck;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tracing_subscriber::filter::Targets;

/// The default of `--metrics-addr`: every address of the node, port 9402
/// (the DaemonSet runs with hostNetwork, so that is the node's port).
pub(crate) const METRICS_ADDR: &str = "0.0.0.0:9402";

/// `macvtap-deviceplugin`: advertises macvtap devices on host NICs to the kubelet.
///
/// The daemon's flags are global: they may stand before or after a
/// subcommand (`doctor --kubelet-dir X` and `--kubelet-dir X doctor` alike).
#[derive(Debug, Clone, Parser)]
#[command(name = "macvtap-deviceplugin", version, about)]
pub struct Args {
    /// Run a one-off task instead of the daemon.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// The kubelet's root directory; sockets go to DIR/device-plugins, the
    /// PodResources API is read from DIR/pod-resources/kubelet.sock. For
    /// `install-cni`, the directory as the node sees it, written into the
    /// CNI's node settings (`macvtap.settings.json` beside the binary): the
    /// CNI asks `DIR/pod-resources/kubelet.sock` whether a device is the pod's.
    #[arg(
        long,
        global = true,
        value_name = "DIR",
        default_value = "/var/lib/kubelet"
    )]
    pub kubelet_dir: PathBuf,

    /// A JSON file in the DP_MACVTAP_CONF format; wins over DP_MACVTAP_CONF
    /// and is re-read when it changes. From MACVTAP_CONFIG when not given,
    /// so that `kubectl exec ... doctor` reads the daemon's file too.
    #[arg(long, global = true, env = "MACVTAP_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// A resource, winning over the file and the environment (repeatable):
    /// `name=N,lowerDevice=NIC,mode=bridge|vepa|private|passthru,capacity=C`,
    /// or just a NIC name.
    #[arg(long = "resource", global = true, value_name = "SPEC")]
    pub resources: Vec<String>,

    /// Link kinds that auto-discovery treats as NICs, besides physical NICs
    /// and bonds (comma-separated, e.g. `veth` on test nodes).
    #[arg(long, global = true, value_name = "KINDS", value_delimiter = ',')]
    pub discover_kinds: Vec<String>,

    /// Which NICs auto-discovery offers: `spare` (none that a default route
    /// leaves through or that holds the Node's InternalIP, and none with a
    /// global address unless `--discover-include` names it) or `all` (every
    /// NIC, as the Go project). Not given: `all` when `DP_MACVTAP_CONF` in the
    /// environment asks for auto-discovery (the Go project's DaemonSets),
    /// else `spare`. Also read from `MACVTAP_DISCOVERY`, which our manifests
    /// set, so that `kubectl exec ... doctor` sees it.
    #[arg(
        long,
        global = true,
        env = "MACVTAP_DISCOVERY",
        value_enum,
        value_name = "POLICY"
    )]
    pub discovery: Option<DiscoveryPolicy>,

    /// NICs with a global address that `spare` auto-discovery offers all the
    /// same (comma-separated names; never a NIC that a default route leaves
    /// through or that holds the Node's InternalIP: name such a NIC in the
    /// configuration). Also read from `MACVTAP_DISCOVER_INCLUDE`.
    #[arg(
        long,
        global = true,
        env = "MACVTAP_DISCOVER_INCLUDE",
        value_name = "NICS",
        value_delimiter = ','
    )]
    pub discover_include: Vec<String>,

    /// Address for /metrics and /healthz; `off` disables them. The default
    /// listens on every address of the node (with hostNetwork): whoever can
    /// reach the node's port can read them.
    #[arg(long, global = true, value_name = "ADDR", default_value = METRICS_ADDR)]
    pub metrics_addr: String,

    /// Log format.
    #[arg(long, global = true, value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Log level: `error`, `warn`, `info`, `debug`, `trace` or `off`, or
    /// per target as `RUST_LOG` takes it (`warn,macvtap_deviceplugin=debug`).
    /// Wins over the Go project's `-v` and over `RUST_LOG`; default `info`.
    #[arg(long, global = true, value_name = "LEVEL", value_parser = logging::parse_filter)]
    pub log_level: Option<Targets>,

    /// How often to look for leaked links, as Go writes durations (`1m30s`,
    /// `500ms`, `2h`) or a number of seconds.
    #[arg(long, global = true, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub reclaim_interval: Duration,

    /// How long a link must be allocated to no pod before it is deleted.
    #[arg(long, global = true, value_name = "DURATION", default_value = "120s", value_parser = parse_duration)]
    pub reclaim_grace: Duration,

    /// How long one Register call to the kubelet may take before it is
    /// given up and retried (it never holds up anything else).
    #[arg(long, global = true, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub register_timeout: Duration,

    /// This node's name, for Kubernetes Events on its Node (the DaemonSet
    /// sets `NODE_NAME` from `spec.nodeName`); without it Events are off.
    #[arg(long, global = true, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,

    /// The DaemonSet that runs the daemon, in the pod's namespace
    /// (`POD_NAMESPACE`, from the downward API): when it is deleted (an
    /// uninstall), the daemon removes what is ours from the node as it
    /// exits. Unset: an exit never cleans.
    #[arg(long, global = true, value_name = "NAME")]
    pub owner_daemonset: Option<String>,

    /// The pod's namespace, where `--owner-daemonset` is.
    #[arg(long, global = true, env = "POD_NAMESPACE", value_name = "NAMESPACE")]
    pub pod_namespace: Option<String>,

    /// The host's CNI bin dir as mounted (read-write), whose `macvtap` and
    /// `macvtap.settings.json` an uninstall removes once no pod holds our
    /// devices, unless an install-cni ran since the daemon started (another
    /// install's). Unset: they are left.
    #[arg(long, global = true, value_name = "DIR")]
    pub uninstall_cni_dir: Option<PathBuf>,

    /// The CNI binary this image ships (what install-cni copied): an
    /// uninstall removes the installed `macvtap` only when its bytes are
    /// these, so it never removes a binary it cannot prove it installed.
    #[arg(long, global = true, value_name = "FILE", default_value = "/macvtap")]
    pub uninstall_cni_source: PathBuf,

    /// Which kubelet API serves this node's macvtap resources:
    /// `device-plugin` (extended resources in the Node's allocatable), or
    /// `dra` (ResourceSlices of driver `macvtap.network.kubevirt.io`, which
    /// pods request under the same names through a DeviceClass's
    /// `extendedResourceName`; Kubernetes 1.37 or newer, a runtime with CDI,
    /// and `NODE_NAME` and API access). Also read from `MACVTAP_FRONT`,
    /// which the DRA kustomize component and the chart set.
    #[arg(
        long,
        global = true,
        env = "MACVTAP_FRONT",
        value_enum,
        default_value = "device-plugin"
    )]
    pub front: Front,

    /// The container runtime's CDI spec directory, where the DRA front
    /// writes one spec per prepared claim (containerd 2.x and CRI-O read
    /// `/etc/cdi` and `/var/run/cdi`).
    #[arg(
        long,
        global = true,
        value_name = "DIR",
        default_value = "/var/run/cdi"
    )]
    pub cdi_dir: PathBuf,
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
    /// (as mounted where `doctor` runs); by default the first directory of
    /// `/host/cni-bin` (our DaemonSet's mount), `/host/opt/cni/bin` (the Go
    /// project's) and `/opt/cni/bin` (on the host) that exists.
    #[arg(long, value_name = "DIR")]
    pub cni_bin_dir: Option<PathBuf>,
    /// The CNI's file name in that dir (install-cni's `--name`).
    #[arg(long, value_name = "NAME", default_value = "macvtap")]
    pub cni_name: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

/// Flags of `install-cni` (the kubelet dir it writes into the CNI's node
/// settings is the global `--kubelet-dir`).
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

/// What a command line says: our flags, and the Go project's glog flags
/// taken out before clap read the rest (`glog::take`).
#[derive(Debug, Clone)]
pub struct CommandLine {
    /// Our flags and subcommand.
    pub args: Args,
    /// The glog flags given.
    pub glog: GlogFlags,
}

/// Parses a command line (the program name first). An error is clap's,
/// whose `exit()` prints it with the usage and exits 2.
pub fn parse_from(
    argv: impl IntoIterator<Item = impl Into<OsString>>,
) -> Result<CommandLine, clap::Error> {
    let command = Args::command();
    let mut with_value = Vec::new();
    long_flags_with_values(&command, &mut with_value);
    let (rest, glog) = glog::take(argv.into_iter().map(Into::into), |name| {
        with_value.iter().any(|n| n == name)
    })
    .map_err(|e| Args::command().error(ErrorKind::ValueValidation, e))?;
    Ok(CommandLine {
        args: Args::try_parse_from(rest)?,
        glog,
    })
}

/// The long names of `command`'s flags (and its subcommands') that take a value.
fn long_flags_with_values(command: &clap::Command, out: &mut Vec<String>) {
    for a in command.get_arguments() {
        if let Some(long) = a.get_long().filter(|_| a.get_action().takes_values()) {
            out.push(long.to_string());
        }
    }
    for sub in command.get_subcommands() {
        long_flags_with_values(sub, out);
    }
}

impl CommandLine {
    /// The log filter in force: `--log-level`, else `-v`, else `RUST_LOG`
    /// (`rust_log`), else `info` (`logging::filter`).
    pub fn log_filter(&self, rust_log: Option<&str>) -> Result<Targets, String> {
        logging::filter(
            self.args.log_level.as_ref(),
            self.glog.verbosity.map(glog::level),
            rust_log,
        )
    }
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
            discovery: self.discovery,
            discover_include: self
                .discover_include
                .iter()
                .map(|n| n.trim())
                .filter(|n| !n.is_empty())
                .map(|n| {
                    macvtap_link::check_ifname(n)
                        .map(|_| n.to_string())
                        .map_err(|m| format!("--discover-include: {m}"))
                })
                .collect::<Result<_, _>>()?,
            metrics_addr,
            reclaim_interval: self.reclaim_interval,
            reclaim_grace: self.reclaim_grace,
            sysfs: PathBuf::from("/sys"),
            register_timeout: self.register_timeout,
            node_name: self.node_name.clone(),
            owner: match (&self.owner_daemonset, &self.pod_namespace) {
                (Some(name), Some(ns)) if !name.is_empty() && !ns.is_empty() => Some(Owner {
                    namespace: ns.clone(),
                    name: name.clone(),
                }),
                (Some(_), _) => {
                    return Err(
                        "--owner-daemonset needs the pod's namespace (POD_NAMESPACE or --pod-namespace)"
                            .into(),
                    );
                }
                _ => None,
            },
            uninstall_cni_dir: self.uninstall_cni_dir.clone(),
            uninstall_cni_source: self.uninstall_cni_source.clone(),
            front: self.front,
            cdi_dir: self.cdi_dir.clone(),
        })
    }
}

/// Parses a duration as Go's `time.ParseDuration` writes it (`1m30s`,
/// `500ms`, `1.5h`, `300us`: numbers with a unit each, `ns`, `us`, `ms`,
/// `s`, `m` or `h`, run together), or a plain number of seconds (`60`).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    let like = "a duration like 1m30s, 500ms, 60s or 2h";
    if text.starts_with('-') {
        return Err(format!("{text:?}: a duration cannot be negative"));
    }
    let body = text.strip_prefix('+').unwrap_or(text);
    if body.is_empty() {
        return Err(format!("{text:?} is not {like}"));
    }
    if body.bytes().all(|b| b.is_ascii_digit()) {
        return body
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| format!("{text:?} is too long a duration"));
    }
    let is_number = |c: char| c.is_ascii_digit() || c == '.';
    let mut nanos: u128 = 0;
    let mut rest = body;
    while !rest.is_empty() {
        let (number, after) = rest.split_at(rest.find(|c| !is_number(c)).unwrap_or(rest.len()));
        let (unit, next) = after.split_at(after.find(is_number).unwrap_or(after.len()));
        let per_unit: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => {
                return Err(format!(
                    "{text:?}: {number} has no unit (ns, us, ms, s, m or h)"
                ));
            }
            _ => {
                return Err(format!(
                    "{text:?}: unknown unit {unit:?} (ns, us, ms, s, m or h)"
                ));
            }
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(format!("{text:?} is not {like}"));
        }
        let too_long = || format!("{text:?} is too long a duration");
        let mut value = match whole {
            "" => 0,
            w => w
                .parse::<u128>()
                .ok()
                .and_then(|n| n.checked_mul(per_unit))
                .ok_or_else(too_long)?,
        };
        // Digits past a nanosecond are dropped, as Go drops them.
        let mut scale = per_unit;
        for d in fraction.bytes() {
            scale /= 10;
            value += u128::from(d - b'0') * scale;
        }
        nanos = nanos.checked_add(value).ok_or_else(too_long)?;
        rest = next;
    }
    let secs = u64::try_from(nanos / 1_000_000_000)
        .map_err(|_| format!("{text:?} is too long a duration"))?;
    // The remainder is below 10^9, so it fits.
    let subsec = u32::try_from(nanos % 1_000_000_000).unwrap_or(0);
    Ok(Duration::new(secs, subsec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_before() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("60s").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("60").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration(" 5m ").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn durations_parse_in_gos_form() {
        let secs = Duration::from_secs;
        assert_eq!(parse_duration("1m30s").unwrap(), secs(90));
        assert_eq!(parse_duration("2h").unwrap(), secs(7200));
        assert_eq!(parse_duration("1h2m3s").unwrap(), secs(3723));
        assert_eq!(parse_duration("1.5h").unwrap(), secs(5400));
        assert_eq!(parse_duration(".5s").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.s").unwrap(), secs(1));
        assert_eq!(parse_duration("+10s").unwrap(), secs(10));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert_eq!(
            parse_duration("1s500ms").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_duration("300us").unwrap(), Duration::from_micros(300));
        assert_eq!(
            parse_duration("300\u{b5}s").unwrap(),
            Duration::from_micros(300)
        );
        assert_eq!(
            parse_duration("300\u{3bc}s").unwrap(),
            Duration::from_micros(300)
        );
        assert_eq!(parse_duration("42ns").unwrap(), Duration::from_nanos(42));
        assert_eq!(
            parse_duration("1.0000000019s").unwrap(),
            Duration::new(1, 1)
        );
    }

    #[test]
    fn durations_that_are_not_refused_with_the_reason() {
        for (text, why) in [
            ("", "is not a duration"),
            ("s", "is not a duration"),
            (".s", "is not a duration"),
            ("1.2.3s", "is not a duration"),
            ("5x", "unknown unit \"x\""),
            ("1m30", "30 has no unit"),
            ("-1s", "cannot be negative"),
            ("99999999999999999999999h", "too long"),
            ("99999999999999999999999", "too long"),
        ] {
            let err = parse_duration(text).unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn flags_parse_with_defaults() {
        let a = Args::try_parse_from(["macvtap-deviceplugin"]).unwrap();
        assert_eq!(a.kubelet_dir, PathBuf::from("/var/lib/kubelet"));
        assert_eq!(a.log_format, LogFormat::Text);
        let o = a.options().unwrap();
        assert_eq!(o.metrics_addr, Some("0.0.0.0:9402".parse().unwrap()));
        assert_eq!(o.reclaim_interval, Duration::from_secs(60));
        assert_eq!(o.reclaim_grace, Duration::from_secs(120));
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
    fn discovery_flags_parse_and_a_bad_nic_name_is_refused() {
        let a = Args::try_parse_from(["x"]).unwrap();
        let o = a.options().unwrap();
        assert_eq!(o.discovery, None, "by the configuration's source");
        assert!(o.discover_include.is_empty());
        let a = Args::try_parse_from([
            "x",
            "--discovery",
            "all",
            "--discover-include",
            "eth2, eth3,",
            "doctor",
        ])
        .unwrap();
        let o = a.options().unwrap();
        assert_eq!(o.discovery, Some(DiscoveryPolicy::All));
        assert_eq!(o.discover_include, ["eth2", "eth3"]);
        assert!(Args::try_parse_from(["x", "--discovery", "go"]).is_err());
        let err = Args::try_parse_from(["x", "--discover-include", "a/b"])
            .unwrap()
            .options()
            .unwrap_err();
        assert!(err.starts_with("--discover-include: "), "{err}");
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
        assert_eq!(d.cni_bin_dir, None);
        assert_eq!(d.cni_name, "macvtap");
    }

    #[test]
    fn daemon_flags_are_global() {
        for argv in [
            &[
                "x",
                "doctor",
                "--kubelet-dir",
                "/k",
                "--metrics-addr=off",
                "--resource",
                "eth1",
            ][..],
            &[
                "x",
                "--kubelet-dir",
                "/k",
                "--metrics-addr=off",
                "doctor",
                "--resource",
                "eth1",
            ],
            &[
                "x",
                "--resource",
                "eth1",
                "--kubelet-dir=/k",
                "doctor",
                "--metrics-addr",
                "off",
            ],
        ] {
            let a = Args::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            assert_eq!(a.kubelet_dir, PathBuf::from("/k"), "{argv:?}");
            assert_eq!(a.resources, ["eth1"], "{argv:?}");
            assert_eq!(a.options().unwrap().metrics_addr, None, "{argv:?}");
            assert!(matches!(a.command, Some(Command::Doctor(_))), "{argv:?}");
        }
        // install-cni writes the global --kubelet-dir into the CNI's settings,
        // given where the DaemonSet gives it: after the subcommand.
        let a = Args::try_parse_from([
            "x",
            "install-cni",
            "--source=/macvtap",
            "--target-dir=/host/cni-bin",
            "--kubelet-dir=/var/lib/k0s/kubelet",
            "--pod-resources-check=enforce",
        ])
        .unwrap();
        assert_eq!(a.kubelet_dir, PathBuf::from("/var/lib/k0s/kubelet"));
        let Some(Command::InstallCni(i)) = a.command else {
            panic!("{a:?}")
        };
        assert_eq!(i.pod_resources_check, PodResourcesCheck::Enforce);
        let a = Args::try_parse_from(["x", "install-cni", "--target-dir=/d"]).unwrap();
        assert_eq!(a.kubelet_dir, PathBuf::from("/var/lib/kubelet"));
    }

    #[test]
    fn the_metrics_address_defaults_to_every_address_port_9402() {
        let a = Args::try_parse_from(["x"]).unwrap();
        let addr = a.options().unwrap().metrics_addr.unwrap();
        assert!(addr.ip().is_unspecified(), "{addr}");
        assert!(addr.is_ipv4(), "{addr}");
        assert_eq!(addr.port(), 9402);
        assert_eq!(addr.to_string(), METRICS_ADDR);
        let err = Args::try_parse_from(["x", "--metrics-addr", "9402"])
            .unwrap()
            .options()
            .unwrap_err();
        assert!(err.starts_with("--metrics-addr \"9402\""), "{err}");
    }

    #[test]
    fn log_level_flag_takes_a_level_and_refuses_others() {
        let a = Args::try_parse_from(["x", "--log-level", "debug"]).unwrap();
        let f = a.log_level.unwrap();
        assert!(f.would_enable("x", &tracing::Level::DEBUG));
        let a =
            Args::try_parse_from(["x", "doctor", "--log-level=warn,macvtap_deviceplugin=trace"]);
        assert!(a.is_ok(), "global, and per target");
        let err = Args::try_parse_from(["x", "--log-level", "loud"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        let text = err.to_string();
        assert!(text.contains("--log-level"), "{text}");
        assert!(text.contains("\"loud\" is not a log level"), "{text}");
    }

    #[test]
    fn the_go_manifests_command_line_parses() {
        let line = parse_from(["/macvtap-deviceplugin", "-v", "3", "-logtostderr"]).unwrap();
        assert!(line.args.command.is_none());
        assert_eq!(line.glog.verbosity, Some(3));
        assert_eq!(line.glog.given, ["-v=3", "-logtostderr"]);
        let f = line.log_filter(Some("trace")).unwrap();
        assert!(f.would_enable("x", &tracing::Level::INFO), "-v 3 is info");
        assert!(
            !f.would_enable("x", &tracing::Level::DEBUG),
            "-v wins over RUST_LOG"
        );

        let line = parse_from([
            "p",
            "--kubelet-dir",
            "/k",
            "--v=5",
            "doctor",
            "--alsologtostderr",
            "-stderrthreshold=WARNING",
            "--output=json",
        ])
        .unwrap();
        assert_eq!(line.args.kubelet_dir, PathBuf::from("/k"));
        assert!(matches!(line.args.command, Some(Command::Doctor(_))));
        assert_eq!(line.glog.given.len(), 3);
        let f = line.log_filter(None).unwrap();
        assert!(f.would_enable("x", &tracing::Level::TRACE));

        let line = parse_from(["p", "-v", "4", "--log-level", "error"]).unwrap();
        let f = line.log_filter(None).unwrap();
        assert!(
            !f.would_enable("x", &tracing::Level::WARN),
            "--log-level wins over -v"
        );

        // A flag's value that looks like a glog flag stays its value (and
        // clap takes a value with a leading dash only after `=`).
        let line = parse_from(["p", "--config=-v"]).unwrap();
        assert_eq!(line.args.config, Some(PathBuf::from("-v")));
        assert_eq!(line.glog, GlogFlags::default());
        let err = parse_from(["p", "--config", "-v", "3"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnknownArgument, "{err}");

        let err = parse_from(["p", "-v", "three"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        assert!(
            err.to_string()
                .contains("invalid value \"three\" for flag -v"),
            "{err}"
        );
        let err = parse_from(["p", "-q"]).unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::UnknownArgument,
            "other flags are clap's"
        );
    }

    #[test]
    fn a_bad_rust_log_is_an_error_unless_a_flag_decides() {
        let line = parse_from(["p"]).unwrap();
        let err = line.log_filter(Some("infoo")).unwrap_err();
        assert!(err.contains("RUST_LOG=\"infoo\""), "{err}");
        assert!(
            parse_from(["p", "--log-level=info"])
                .unwrap()
                .log_filter(Some("infoo"))
                .is_ok()
        );
    }
}
