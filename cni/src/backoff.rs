//! Jittered exponential back-off between the tries of a call the server
//! refused for now (the kubelet's rate limit): each pause is drawn between
//! half and all of a step that doubles up to a cap, so processes refused
//! together do not come back together. The jitter comes from a small
//! generator seeded by the clock and the process ID, not from a crate.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The pauses between the tries of one call.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    step: Duration,
    max: Duration,
    state: u64,
}

impl Backoff {
    /// Pauses from about `first`, doubling up to `max`, jittered by `seed`.
    pub(crate) fn new(first: Duration, max: Duration, seed: u64) -> Self {
        Self {
            step: first.min(max),
            max,
            state: seed,
        }
    }

    /// [`Backoff::new`] seeded by the clock and this process's ID, so that
    /// plugin runs started in the same instant still draw apart.
    pub(crate) fn seeded_by_process(first: Duration, max: Duration) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| (d.as_secs() << 30) ^ u64::from(d.subsec_nanos()))
            .unwrap_or(0);
        let pid = u64::from(std::process::id());
        Self::new(first, max, nanos ^ pid.rotate_left(32))
    }

    /// The next pause: uniform between half the current step and all of it;
    /// the step then doubles, up to the cap.
    pub(crate) fn next_pause(&mut self) -> Duration {
        let step = self.step;
        self.step = (step * 2).min(self.max);
        let half = step / 2;
        let span = u64::try_from((step - half).as_nanos()).unwrap_or(u64::MAX);
        let jitter = if span == 0 {
            0
        } else {
            splitmix64(&mut self.state) % (span + 1)
        };
        half + Duration::from_nanos(jitter)
    }
}

/// SplitMix64: a well-mixed 64-bit number from a counter, enough for jitter.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn pauses_double_within_their_jitter_up_to_the_cap() {
        let mut b = Backoff::new(10 * MS, 80 * MS, 42);
        let steps = [10, 20, 40, 80, 80, 80];
        for step in steps {
            let pause = b.next_pause();
            let step = step * MS;
            assert!(pause >= step / 2 && pause <= step, "{pause:?} for {step:?}");
        }
    }

    #[test]
    fn different_seeds_draw_different_pauses() {
        let draw = |seed| {
            let mut b = Backoff::new(100 * MS, 100 * MS, seed);
            (0..8).map(|_| b.next_pause()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7), "a seed gives one sequence");
        assert_ne!(draw(7), draw(8));
        let pauses = draw(7);
        assert!(
            pauses.iter().any(|p| *p != pauses[0]),
            "the jitter varies: {pauses:?}"
        );
    }

    #[test]
    fn a_zero_step_never_divides_by_zero() {
        let mut b = Backoff::new(Duration::ZERO, Duration::ZERO, 1);
        assert_eq!(b.next_pause(), Duration::ZERO);
    }
}
