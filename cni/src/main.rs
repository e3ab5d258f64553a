//! The `macvtap` CNI plugin binary: reads the environment and stdin, runs the
//! command, prints the result or the spec's error JSON, logs to stderr (and
//! to the NetConf's `logFile` when it names a file in the node's log directory).

use macvtap_cni::escape::EscapingWriter;
use macvtap_cni::logfile;
use macvtap_cni::settings::{self, NodeSettings};
use macvtap_cni::stdin::Stdin;
use std::collections::HashMap;
use std::io::{Read, Write};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

fn main() {
    // Run by hand: say what we are and exit 0, before stdin is read (a
    // terminal would block it), as the reference plugins' `pkg/skel` does.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = std::env::var_os("CNI_COMMAND").map(|c| c.to_string_lossy().into_owned());
    if macvtap_cni::version::is_by_hand(command.as_deref(), &args) {
        eprintln!("{}", macvtap_cni::version::about());
        return;
    }
    let mut stdin = Vec::new();
    let read = std::io::stdin().read_to_end(&mut stdin);
    // Lossy, not std::env::vars(), which panics on a value that is not UTF-8.
    let vars: HashMap<String, String> = std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    let settings = settings::load(&vars);
    let stdin = Stdin::decode(&stdin);
    init_logging(&vars, &settings, &stdin);
    if let Err(e) = read {
        tracing::warn!("reading stdin: {e}");
    }
    let outcome = macvtap_cni::run_with(&settings, &vars, &stdin);
    if let Some(out) = outcome.stdout {
        let mut stdout = std::io::stdout().lock();
        // A runtime that closed our stdout cannot be told anything else.
        let _ = writeln!(stdout, "{out}");
        let _ = stdout.flush();
    }
    std::process::exit(outcome.exit_code);
}

/// Logs go to stderr (stdout carries the result) and, when the NetConf has
/// `"logFile"` inside the node's log directory, are appended to that file
/// too; a `logFile` that is refused gets one warning on stderr and no file.
/// Every line is escaped as it is written (see `escape`). The level comes
/// from `MACVTAP_CNI_LOG_LEVEL` (error, warn, info, debug, trace; default info).
fn init_logging(vars: &HashMap<String, String>, settings: &NodeSettings, stdin: &Stdin) {
    let level = vars
        .get("MACVTAP_CNI_LOG_LEVEL")
        .and_then(|l| l.parse::<tracing::Level>().ok())
        .unwrap_or(tracing::Level::INFO);
    let mut refused = None;
    let file = stdin.log_file().and_then(|requested| {
        match logfile::open_log_file(&settings.log_dir, &requested) {
            Ok(f) => Some(f),
            Err(e) => {
                refused = Some(e);
                None
            }
        }
    });
    let file_layer = file.map(|f| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::sync::Mutex::new(EscapingWriter::new(f)))
            .with_ansi(false)
    });
    let _ = tracing_subscriber::registry()
        .with(LevelFilter::from_level(level))
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(|| EscapingWriter::new(std::io::stderr()))
                .with_ansi(false),
        )
        .with(file_layer)
        .try_init();
    if let Some(e) = refused {
        tracing::warn!("{e}");
    }
}
