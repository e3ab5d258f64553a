//! Log setup: `tracing` to stderr as text or JSON, filtered by `RUST_LOG`
//! (default `info`; `warn`, `macvtap_deviceplugin=debug,info` and the like).
//!
//! The filter is `tracing_subscriber::filter::Targets`: levels per target,
//! without the regex engine `EnvFilter` brings into the binary.

use crate::cli::LogFormat;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The filter `RUST_LOG` asks for; `info` when it is unset or unreadable.
pub fn filter(rust_log: Option<&str>) -> Targets {
    rust_log
        .and_then(|v| v.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO))
}

/// Installs the global subscriber.
pub fn init(format: LogFormat) {
    let filter = filter(std::env::var("RUST_LOG").ok().as_deref());
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
        let f = filter(Some("warn,macvtap_deviceplugin=debug"));
        assert!(f.would_enable("macvtap_deviceplugin::daemon", &Level::DEBUG));
        assert!(!f.would_enable("tonic", &Level::INFO));
        let default = filter(None);
        assert!(default.would_enable("anything", &Level::INFO));
        assert!(!default.would_enable("anything", &Level::DEBUG));
    }
}
