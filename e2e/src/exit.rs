//! How the sandbox, the bench and the examples end: an error is printed as
//! sentences (the error, then each cause on a line of its own) and the
//! program exits 1. Never anyhow's `Debug` form, which adds a `Stack
//! backtrace` of `<unknown>` frames (release builds are stripped) whenever
//! the user's shell has `RUST_BACKTRACE` set.

use std::fmt::Write;
use std::process::ExitCode;

/// The error and its causes as people read them: `error: <what>` and one
/// `  caused by: <why>` line per cause, outermost first.
pub fn sentences(err: &anyhow::Error) -> String {
    let mut out = format!("error: {err}");
    for cause in err.chain().skip(1) {
        let _ = write!(out, "\n  caused by: {cause}");
    }
    out
}

/// The exit of a program whose body returned `result`: success, or the
/// error printed to stderr as [`sentences`] and exit code 1.
pub fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", sentences(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn an_error_reads_as_sentences_without_a_backtrace_whatever_the_environment() {
        // Display of each cause only: whether anyhow captured a backtrace
        // (RUST_BACKTRACE in the environment) cannot show.
        let err = std::fs::read("/nonexistent/multus.tar")
            .context("reading the Multus source")
            .context("building Multus")
            .unwrap_err();
        let text = sentences(&err);
        assert!(text.starts_with("error: building Multus\n"), "{text}");
        assert!(
            text.contains("\n  caused by: reading the Multus source\n"),
            "{text}"
        );
        assert!(text.contains("No such file or directory"), "{text}");
        assert!(!text.contains("backtrace"), "{text}");
        assert_eq!(text.lines().count(), 3, "{text}");
    }
}
