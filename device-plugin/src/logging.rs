//! Log setup: `tracing` to stderr as text or JSON, at the level that
//! `--log-level`, the Go project's `-v` ([`crate::glog`]) or `RUST_LOG` ask
//! for, the first of them given (default `info`). Each takes a level
//! (`warn`) or levels per target (`warn,macvtap_deviceplugin=debug`); a
//! value that is neither is an error at start, never a silent `info`.
//!
//! The filter is `tracing_subscriber::filter::Targets`: levels per target,
//! without the regex engine `EnvFilter` brings into the binary.

use clap::ValueEnum;
use std::env::VarError;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The levels a filter names, as messages list them.
const LEVELS: &str = "error, warn, info, debug, trace or off";

/// Parses a log filter: comma-separated directives, each a level (the
/// default for every target) or `TARGET=LEVEL`. Unlike `Targets`' own
/// parser, a bare word that is not a level is refused (`Targets` would take
/// `infoo` for a target and log nothing else).
pub(crate) fn parse_filter(text: &str) -> Result<Targets, String> {
    let directives: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return Err(format!("{text:?} names no log level ({LEVELS})"));
    }
    for d in &directives {
        let (target, level) = match d.split_once('=') {
            Some((t, l)) => (Some(t.trim()), l.trim()),
            None => (None, *d),
        };
        if target == Some("") {
            return Err(format!("{text:?}: {d:?} names no target before '='"));
        }
        if level.is_empty() || level.parse::<LevelFilter>().is_err() {
            return Err(format!(
                "{text:?}: {level:?} is not a log level ({LEVELS}; per target TARGET=LEVEL)"
            ));
        }
    }
    directives
        .join(",")
        .parse::<Targets>()
        .map_err(|e| format!("{text:?}: {e}"))
}

/// The filter in force: `--log-level` if given, else the level the Go
/// project's `-v` maps to, else `RUST_LOG` (an error when it is set but
/// not a filter; blank counts as unset), else `info`.
pub(crate) fn filter(
    flag: Option<&Targets>,
    go_verbosity: Option<LevelFilter>,
    rust_log: Option<&str>,
) -> Result<Targets, String> {
    if let Some(f) = flag {
        return Ok(f.clone());
    }
    if let Some(level) = go_verbosity {
        return Ok(Targets::new().with_default(level));
    }
    match rust_log.filter(|v| !v.trim().is_empty()) {
        Some(v) => parse_filter(v).map_err(|e| format!("RUST_LOG={e}")),
        None => Ok(Targets::new().with_default(LevelFilter::INFO)),
    }
}

/// `RUST_LOG` from the environment; an error when it is not UTF-8.
pub fn rust_log() -> Result<Option<String>, String> {
    match std::env::var("RUST_LOG") {
        Ok(v) => Ok(Some(v)),
        Err(VarError::NotPresent) => Ok(None),
        Err(VarError::NotUnicode(v)) => Err(format!("RUST_LOG={v:?} is not UTF-8")),
    }
}

/// Installs the global subscriber.
pub fn init(format: LogFormat, filter: Targets) {
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match format {
        LogFormat::Text => registry.with(layer.with_ansi(false)).try_init(),
        LogFormat::Json => registry.with(layer.json().flatten_event(true)).try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn rust_log_sets_levels_per_target() {
        let f = filter(None, None, Some("warn,macvtap_deviceplugin=debug")).unwrap();
        assert!(f.would_enable("macvtap_deviceplugin::daemon", &Level::DEBUG));
        assert!(!f.would_enable("tonic", &Level::INFO));
        let default = filter(None, None, None).unwrap();
        assert!(default.would_enable("anything", &Level::INFO));
        assert!(!default.would_enable("anything", &Level::DEBUG));
    }

    #[test]
    fn levels_parse_in_any_case_and_with_blank_directives() {
        for text in [
            "debug",
            "DEBUG",
            " debug ",
            "debug,",
            "info,tonic=warn",
            "off",
            "trace",
        ] {
            parse_filter(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        }
        let f = parse_filter("Debug").unwrap();
        assert!(f.would_enable("x", &Level::DEBUG));
        assert!(!f.would_enable("x", &Level::TRACE));
        let off = parse_filter("off").unwrap();
        assert!(!off.would_enable("x", &Level::ERROR));
    }

    #[test]
    fn a_bad_level_is_an_error_naming_it() {
        for (text, names) in [
            ("infoo", "\"infoo\" is not a log level"),
            ("verbose", "\"verbose\" is not a log level"),
            ("macvtap_deviceplugin=loud", "\"loud\" is not a log level"),
            ("=debug", "names no target"),
            ("tonic=", "\"\" is not a log level"),
            ("", "names no log level"),
            (" , ", "names no log level"),
        ] {
            let err = parse_filter(text).unwrap_err();
            assert!(err.contains(names), "{text:?}: {err}");
        }
        assert!(
            filter(None, None, Some(" ")).is_ok(),
            "a blank RUST_LOG is unset"
        );
        let err = filter(None, None, Some("infoo")).unwrap_err();
        assert!(err.starts_with("RUST_LOG=\"infoo\""), "{err}");
    }

    #[test]
    fn the_flag_wins_over_go_verbosity_which_wins_over_rust_log() {
        let flag = parse_filter("warn").unwrap();
        let f = filter(Some(&flag), Some(LevelFilter::TRACE), Some("debug")).unwrap();
        assert!(!f.would_enable("x", &Level::INFO));
        let f = filter(None, Some(LevelFilter::TRACE), Some("error")).unwrap();
        assert!(f.would_enable("x", &Level::TRACE));
        // A bad RUST_LOG that a flag overrides is never read.
        assert!(filter(Some(&flag), None, Some("infoo")).is_ok());
        assert!(filter(None, Some(LevelFilter::INFO), Some("infoo")).is_ok());
    }
}
