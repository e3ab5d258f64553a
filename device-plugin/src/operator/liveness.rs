//! Whether the daemon's loop is alive, for `/healthz`: the loop beats after
//! every input it handles and on its timers (at least every few seconds
//! when idle), and the HTTP server, on its own thread, compares the last
//! beat with the clock.
//!
//! The loop never gives up on a resource: each one is registered, or has a
//! Register in flight or a retry due (`daemon/registration.rs` has no other
//! state), and retries run from the loop's timers. So a resource stuck
//! outside "registered or retrying" can only be a loop that stopped
//! beating, which is what `Liveness::check` reports.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long without a beat makes the loop stuck: far above its longest
/// idle wait (the 5 s socket check), far below the liveness probe's
/// patience (3 failures 20 s apart in the manifests).
pub(crate) const STUCK_AFTER: Duration = Duration::from_secs(30);

/// The loop's last beat, shared with the HTTP server.
#[derive(Debug)]
pub struct Liveness {
    last_beat: Mutex<Instant>,
    stuck_after: Duration,
}

impl Liveness {
    /// A loop that beat at `now` and is stuck after `STUCK_AFTER` without
    /// another beat.
    pub fn new(now: Instant) -> Self {
        Self {
            last_beat: Mutex::new(now),
            stuck_after: STUCK_AFTER,
        }
    }

    /// Records that the loop ran at `now`.
    pub(crate) fn beat(&self, now: Instant) {
        // A poisoned lock still holds a valid instant.
        let mut last = self.last_beat.lock().unwrap_or_else(|e| e.into_inner());
        *last = (*last).max(now);
    }

    /// `Ok` while the loop beat within [`STUCK_AFTER`] of `now`; otherwise
    /// the sentence `/healthz` answers with.
    pub(crate) fn check(&self, now: Instant) -> Result<(), String> {
        let last = *self.last_beat.lock().unwrap_or_else(|e| e.into_inner());
        let quiet = now.saturating_duration_since(last);
        if quiet <= self.stuck_after {
            Ok(())
        } else {
            Err(format!(
                "The daemon's loop has not run for {} s (more than {} s), so it is stuck and \
                 restarting the daemon is the fix.",
                quiet.as_secs(),
                self.stuck_after.as_secs()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_is_stuck_only_after_the_bound_without_a_beat() {
        let t0 = Instant::now();
        let l = Liveness::new(t0);
        assert_eq!(l.check(t0 + STUCK_AFTER), Ok(()));
        let err = l
            .check(t0 + STUCK_AFTER + Duration::from_secs(1))
            .unwrap_err();
        assert!(err.contains("has not run for 31 s"), "{err}");
        l.beat(t0 + Duration::from_secs(20));
        assert_eq!(l.check(t0 + STUCK_AFTER + Duration::from_secs(1)), Ok(()));
        // A beat from the past does not move the last one back.
        l.beat(t0);
        assert_eq!(l.check(t0 + Duration::from_secs(50)), Ok(()));
    }
}
