//! Latency samples and their summary.

use std::time::Duration;

/// A named series of latency samples.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// What was measured, e.g. `ours ADD`.
    pub name: String,
    /// Samples in milliseconds, in measurement order.
    pub ms: Vec<f64>,
}

impl Samples {
    /// An empty series.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ms: Vec::new(),
        }
    }

    /// Adds one sample.
    pub fn push(&mut self, d: Duration) {
        self.ms.push(d.as_secs_f64() * 1000.0);
    }

    /// Number of samples.
    pub fn n(&self) -> usize {
        self.ms.len()
    }

    /// The `p`-th percentile (nearest rank), in ms; NaN when empty.
    pub fn pct(&self, p: f64) -> f64 {
        if self.ms.is_empty() {
            return f64::NAN;
        }
        let mut v = self.ms.clone();
        v.sort_by(f64::total_cmp);
        let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
        v[rank.min(v.len()) - 1]
    }

    /// Median in ms.
    pub fn p50(&self) -> f64 {
        self.pct(50.0)
    }

    /// Sorted copy, for plots.
    pub fn sorted(&self) -> Vec<f64> {
        let mut v = self.ms.clone();
        v.sort_by(f64::total_cmp);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let s = Samples {
            name: "x".into(),
            ms: (1..=100).map(f64::from).collect(),
        };
        assert_eq!(s.p50(), 50.0);
        assert_eq!(s.pct(99.0), 99.0);
        assert_eq!(s.pct(100.0), 100.0);
        assert!(Samples::new("e").p50().is_nan());
    }
}
