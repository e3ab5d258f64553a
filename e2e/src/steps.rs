//! Prints each step of a run in plain words with its wall time, and keeps
//! the timings for a summary.

use std::time::{Duration, Instant};

/// A log of timed steps.
#[derive(Debug)]
pub struct Steps {
    start: Instant,
    current: Option<(String, Instant)>,
    /// Finished steps and how long each took.
    pub done: Vec<(String, Duration)>,
}

impl Default for Steps {
    fn default() -> Self {
        Self::new()
    }
}

impl Steps {
    /// Starts the clock.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            current: None,
            done: Vec::new(),
        }
    }

    /// Ends the current step (if any) and starts `name`.
    pub fn step(&mut self, name: &str) {
        self.finish();
        println!("\n==> {name}");
        self.current = Some((name.to_string(), Instant::now()));
    }

    /// A detail line under the current step.
    pub fn say(&self, line: impl AsRef<str>) {
        println!("    {}", line.as_ref());
    }

    /// Ends the current step.
    pub fn finish(&mut self) {
        if let Some((name, t)) = self.current.take() {
            let took = t.elapsed();
            println!("    ({:.2} s)", took.as_secs_f64());
            self.done.push((name, took));
        }
    }

    /// A table of every step's wall time.
    pub fn summary(&mut self) -> String {
        self.finish();
        let mut s = String::from("step | wall time\n--- | ---:\n");
        for (name, d) in &self.done {
            s.push_str(&format!("{name} | {:.2} s\n", d.as_secs_f64()));
        }
        s.push_str(&format!(
            "total | {:.2} s\n",
            self.start.elapsed().as_secs_f64()
        ));
        s
    }
}
