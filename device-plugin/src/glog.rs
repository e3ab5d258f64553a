//! The Go project's logging flags, accepted so that its DaemonSet and the
//! one cluster-network-addons-operator renders run our image unchanged
//! (they run `/macvtap-deviceplugin -v 3 -logtostderr`).
//!
//! Its daemon parsed them with Go's `flag` package for glog; klog's flags
//! are accepted too. They are taken out of the command line, as Go's
//! `flag` reads them (`-name` or `--name`, `-name=value`, `-name value`
//! for all but booleans, booleans as `-name` or `-name=false`), before
//! clap reads the rest. `-v N` sets the log level (`level`); the others
//! change nothing (logs always go to stderr), and [`GlogFlags::warning`]
//! is the one warning at start that says so.

use std::ffi::OsString;
use tracing_subscriber::filter::LevelFilter;

/// glog's and klog's boolean flags.
const BOOL_FLAGS: &[&str] = &[
    "logtostderr",
    "alsologtostderr",
    "add_dir_header",
    "skip_headers",
    "skip_log_headers",
    "one_output",
    "legacy_stderr_threshold_behavior",
];

/// glog's and klog's flags that take a value.
const VALUE_FLAGS: &[&str] = &[
    "v",
    "vmodule",
    "stderrthreshold",
    "log_dir",
    "log_file",
    "log_file_max_size",
    "log_backtrace_at",
    "log_link",
    "logbuflevel",
];

/// The glog flags found on a command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GlogFlags {
    /// Each as `-name` or `-name=value`, in the order given.
    pub given: Vec<String>,
    /// The last `-v`.
    pub verbosity: Option<i32>,
}

/// The log level glog's `-v N` stands for, by the Kubernetes logging
/// conventions: up to 3 (the Go manifests' `-v 3`) is `info`, 4 `debug`,
/// 5 and more `trace`.
pub(crate) fn level(verbosity: i32) -> LevelFilter {
    match verbosity {
        ..=3 => LevelFilter::INFO,
        4 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// Go's `strconv.ParseBool`.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// Takes the glog flags out of `args` (the program name first) and returns
/// the rest for clap. `takes_value(long)` says which of our own long flags
/// take a value, so that a value such as `--config -v` is left alone.
/// Everything after `--` is left alone. A glog flag that Go's `flag` would
/// refuse (`-v x`, `-v` last, `-logtostderr=yes`) is an error.
pub(crate) fn take(
    args: impl IntoIterator<Item = OsString>,
    takes_value: impl Fn(&str) -> bool,
) -> Result<(Vec<OsString>, GlogFlags), String> {
    let mut args = args.into_iter();
    let mut rest: Vec<OsString> = args.next().into_iter().collect();
    let mut found = GlogFlags::default();
    while let Some(arg) = args.next() {
        let Some(text) = arg.to_str() else {
            rest.push(arg);
            continue;
        };
        if text == "--" {
            rest.push(arg);
            rest.extend(args.by_ref());
            break;
        }
        let name_value = text
            .strip_prefix("--")
            .or_else(|| text.strip_prefix('-'))
            .filter(|nv| !nv.is_empty() && !nv.starts_with('-'));
        let Some(name_value) = name_value else {
            rest.push(arg);
            continue;
        };
        let (name, value) = match name_value.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (name_value, None),
        };
        if BOOL_FLAGS.contains(&name) {
            if let Some(v) = value {
                parse_bool(v).ok_or_else(|| format!("invalid boolean value {v:?} for -{name}"))?;
            }
            found.given.push(format!("-{name_value}"));
        } else if VALUE_FLAGS.contains(&name) {
            let value = match value {
                Some(v) => v.to_string(),
                None => args
                    .next()
                    .map(|v| v.to_string_lossy().into_owned())
                    .ok_or_else(|| format!("flag needs an argument: -{name}"))?,
            };
            if name == "v" {
                let n = value
                    .parse::<i32>()
                    .map_err(|_| format!("invalid value {value:?} for flag -v: not a number"))?;
                found.verbosity = Some(n);
            }
            found.given.push(format!("-{name}={value}"));
        } else {
            let ours_with_value = text.starts_with("--") && value.is_none() && takes_value(name);
            rest.push(arg);
            if ours_with_value {
                rest.extend(args.next());
            }
        }
    }
    Ok((rest, found))
}

impl GlogFlags {
    /// The warning to log at start, if any glog flag was given;
    /// `level_flag` says whether `--log-level` was given too (it wins).
    pub fn warning(&self, level_flag: bool) -> Option<String> {
        if self.given.is_empty() {
            return None;
        }
        let v = match self.verbosity {
            Some(_) if level_flag => "; -v is overridden by --log-level".to_string(),
            Some(n) => format!("; -v {n} sets the log level {}", level(n)),
            None => String::new(),
        };
        Some(format!(
            "accepted for compatibility with kubevirt/macvtap-cni: {}{v}; no other glog flag changes anything (logs go to stderr; use --log-level and --log-format)",
            self.given.join(" ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(args: &[&str]) -> Result<(Vec<String>, GlogFlags), String> {
        let takes_value = |n: &str| ["config", "kubelet-dir"].contains(&n);
        let (rest, found) = take(args.iter().map(OsString::from), takes_value)?;
        let rest = rest.into_iter().map(|a| a.into_string().unwrap()).collect();
        Ok((rest, found))
    }

    #[test]
    fn the_go_manifests_command_line_is_taken_whole() {
        let (rest, found) = split(&["/macvtap-deviceplugin", "-v", "3", "-logtostderr"]).unwrap();
        assert_eq!(rest, ["/macvtap-deviceplugin"]);
        assert_eq!(found.verbosity, Some(3));
        assert_eq!(found.given, ["-v=3", "-logtostderr"]);
        let w = found.warning(false).unwrap();
        assert!(w.contains("-v=3 -logtostderr"), "{w}");
        assert!(w.contains("-v 3 sets the log level info"), "{w}");
    }

    #[test]
    fn every_form_gos_flag_package_accepts() {
        for (args, v, given) in [
            (&["p", "-v=4"][..], Some(4), 1),
            (&["p", "--v", "5"], Some(5), 1),
            (&["p", "--v=2", "-alsologtostderr=false"], Some(2), 2),
            (
                &["p", "-stderrthreshold", "INFO", "-log_dir", "/tmp/x"],
                None,
                2,
            ),
            (&["p", "--stderrthreshold=2", "--log_dir=/tmp/x"], None, 2),
            (
                &["p", "-vmodule=foo=2", "-log_backtrace_at", "x.go:1"],
                None,
                2,
            ),
            (
                &[
                    "p",
                    "-log_file",
                    "f",
                    "-log_file_max_size=10",
                    "-skip_headers",
                ],
                None,
                3,
            ),
            (
                &[
                    "p",
                    "-add_dir_header",
                    "-one_output=1",
                    "-skip_log_headers=T",
                ],
                None,
                3,
            ),
            (
                &["p", "-logtostderr=true", "-v", "-1", "-v", "2"],
                Some(2),
                3,
            ),
        ] {
            let (rest, found) = split(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert_eq!(rest, ["p"], "{args:?}");
            assert_eq!(found.verbosity, v, "{args:?}");
            assert_eq!(found.given.len(), given, "{args:?}: {:?}", found.given);
        }
    }

    #[test]
    fn our_flags_and_their_values_are_left_for_clap() {
        let (rest, found) = split(&[
            "p",
            "--kubelet-dir",
            "-v",
            "--config=-v",
            "doctor",
            "-v",
            "1",
            "--output",
            "json",
            "-h",
            "--",
            "-logtostderr",
        ])
        .unwrap();
        assert_eq!(
            rest,
            [
                "p",
                "--kubelet-dir",
                "-v",
                "--config=-v",
                "doctor",
                "--output",
                "json",
                "-h",
                "--",
                "-logtostderr"
            ]
        );
        assert_eq!(found.verbosity, Some(1));
        assert_eq!(
            split(&["p", "--log-level", "debug"]).unwrap().0,
            ["p", "--log-level", "debug"]
        );
        assert_eq!(split(&["p", "-"]).unwrap().0, ["p", "-"]);
        assert_eq!(split(&["p", "---v"]).unwrap().0, ["p", "---v"]);
    }

    #[test]
    fn what_gos_flag_package_refuses_is_an_error() {
        for (args, why) in [
            (&["p", "-v"][..], "flag needs an argument: -v"),
            (&["p", "-v", "x"], "invalid value \"x\" for flag -v"),
            (&["p", "-v=3.5"], "invalid value \"3.5\" for flag -v"),
            (
                &["p", "-logtostderr=yes"],
                "invalid boolean value \"yes\" for -logtostderr",
            ),
            (&["p", "-log_dir"], "flag needs an argument: -log_dir"),
        ] {
            let err = split(args).unwrap_err();
            assert!(err.contains(why), "{args:?}: {err}");
        }
    }

    #[test]
    fn verbosity_maps_to_a_level() {
        assert_eq!(level(0), LevelFilter::INFO);
        assert_eq!(level(3), LevelFilter::INFO);
        assert_eq!(level(4), LevelFilter::DEBUG);
        assert_eq!(level(5), LevelFilter::TRACE);
        assert_eq!(level(10), LevelFilter::TRACE);
    }

    #[test]
    fn one_warning_or_none() {
        assert_eq!(GlogFlags::default().warning(false), None);
        let (_, found) = split(&["p", "-v", "4", "-logtostderr"]).unwrap();
        let w = found.warning(true).unwrap();
        assert!(w.contains("-v is overridden by --log-level"), "{w}");
        let (_, found) = split(&["p", "-logtostderr"]).unwrap();
        let w = found.warning(false).unwrap();
        assert!(!w.contains("-v"), "{w}");
    }
}
