//! The benchmark report: tables for the terminal and `BENCHMARKS.md`.

use super::stats::Samples;
use std::fmt::Write;

/// One row comparing a series with its reference.
#[derive(Debug, Clone)]
pub struct Row {
    /// The measured series.
    pub series: Samples,
    /// Name of the reference this row is compared with, if any.
    pub reference: Option<(String, f64)>,
}

/// A report: sections of text and latency tables.
#[derive(Debug, Default)]
pub struct Report {
    md: String,
}

impl Report {
    /// Adds a heading and a paragraph that says what was measured.
    pub fn section(&mut self, title: &str, what: &str) {
        let _ = write!(self.md, "\n## {title}\n\n{what}\n\n");
        println!("\n== {title}\n{what}");
    }

    /// Adds a latency table: N, p50, p95, p99 and the p50 ratio to the
    /// reference (and the overhead above it in ms).
    pub fn latency_table(&mut self, rows: &[Row]) {
        self.md
            .push_str("| series | N | p50 ms | p95 ms | p99 ms | p50 ratio to reference | p50 overhead ms |\n");
        self.md
            .push_str("| --- | ---: | ---: | ---: | ---: | --- | ---: |\n");
        for r in rows {
            let s = &r.series;
            let (ratio, over) = match &r.reference {
                Some((name, p50)) if *p50 > 0.0 => (
                    format!("{:.2}x {name}", s.p50() / p50),
                    format!("{:+.2}", s.p50() - p50),
                ),
                _ => ("(reference)".to_string(), String::new()),
            };
            let line = format!(
                "| {} | {} | {:.2} | {:.2} | {:.2} | {ratio} | {over} |\n",
                s.name,
                s.n(),
                s.p50(),
                s.pct(95.0),
                s.pct(99.0)
            );
            print!("{}", line.replace('|', " ").trim_start());
            println!();
            self.md.push_str(&line);
        }
        self.md.push('\n');
    }

    /// Adds free text (a table already in Markdown, a note).
    pub fn text(&mut self, md: &str) {
        println!("{md}");
        self.md.push_str(md);
        self.md.push('\n');
    }

    /// The Markdown collected so far.
    pub fn markdown(&self) -> &str {
        &self.md
    }
}
