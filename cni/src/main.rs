//! The `macvtap` CNI plugin binary: reads the environment and stdin, runs the
//! command, prints the result or the spec's error JSON, logs to stderr.

use std::io::{Read, Write};

fn main() {
    init_logging();
    let vars = std::env::vars().collect();
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        tracing::warn!("reading stdin: {e}");
    }
    let outcome = macvtap_cni::run(&vars, &stdin);
    if let Some(out) = outcome.stdout {
        let mut stdout = std::io::stdout().lock();
        // A runtime that closed our stdout cannot be told anything else.
        let _ = writeln!(stdout, "{out}");
        let _ = stdout.flush();
    }
    std::process::exit(outcome.exit_code);
}

/// Logs go to stderr only (stdout carries the result). The level comes from
/// `MACVTAP_CNI_LOG_LEVEL` (error, warn, info, debug, trace; default info).
fn init_logging() {
    let level = std::env::var("MACVTAP_CNI_LOG_LEVEL")
        .ok()
        .and_then(|l| l.parse().ok())
        .unwrap_or(tracing::Level::INFO);
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_ansi(false)
        .init();
}
