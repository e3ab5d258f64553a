//! The `macvtap` CNI plugin binary: reads the environment and stdin, runs the
//! command, prints the result or the spec's error JSON, logs to stderr (and
//! to the NetConf's `logFile` when it names one).

use std::io::{Read, Write};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

fn main() {
    let mut stdin = Vec::new();
    let read = std::io::stdin().read_to_end(&mut stdin);
    init_logging(&stdin);
    if let Err(e) = read {
        tracing::warn!("reading stdin: {e}");
    }
    let vars = std::env::vars().collect();
    let outcome = macvtap_cni::run(&vars, &stdin);
    if let Some(out) = outcome.stdout {
        let mut stdout = std::io::stdout().lock();
        // A runtime that closed our stdout cannot be told anything else.
        let _ = writeln!(stdout, "{out}");
        let _ = stdout.flush();
    }
    std::process::exit(outcome.exit_code);
}

/// Logs go to stderr (stdout carries the result) and, when the NetConf has
/// `"logFile"`, are appended to that file too. The level comes from
/// `MACVTAP_CNI_LOG_LEVEL` (error, warn, info, debug, trace; default info).
fn init_logging(stdin: &[u8]) {
    let level = std::env::var("MACVTAP_CNI_LOG_LEVEL")
        .ok()
        .and_then(|l| l.parse::<tracing::Level>().ok())
        .unwrap_or(tracing::Level::INFO);
    let file = macvtap_cni::config::log_file(stdin).and_then(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok()
    });
    let file_layer = file.map(|f| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::sync::Mutex::new(f))
            .with_ansi(false)
    });
    let _ = tracing_subscriber::registry()
        .with(LevelFilter::from_level(level))
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false),
        )
        .with(file_layer)
        .try_init();
}
