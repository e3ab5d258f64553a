//! When each device's link was last handed out by Allocate: the plugin
//! servers restart a link's clock before they touch it and once it is
//! ready, and the reclaimer keeps a link whose device was allocated within
//! its grace period. The reclaimer deletes only while it holds the clock
//! ([`AllocationClock::hold`]), having looked at it then, so an Allocate
//! either restarts the clock first (and the link is kept) or touches the
//! link after the deletion (and makes it anew): never a link handed out
//! and deleted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// When each device link was last handed out by Allocate, shared by the
/// plugin servers (which write) and the reclaimer (which reads).
#[derive(Debug, Clone, Default)]
pub struct AllocationClock {
    last: Arc<Mutex<HashMap<String, Instant>>>,
}

impl AllocationClock {
    /// Records that the link named `link` was allocated at `now`; waits
    /// while the reclaimer holds the clock.
    pub fn allocated(&self, link: &str, now: Instant) {
        self.lock().insert(link.to_string(), now);
    }

    /// When the link named `link` was last allocated.
    pub(crate) fn last_allocated(&self, link: &str) -> Option<Instant> {
        self.lock().get(link).copied()
    }

    /// Forgets allocations older than `age` at `now`, keeping the map small.
    pub(crate) fn forget_older_than(&self, age: Duration, now: Instant) {
        self.lock()
            .retain(|_, t| now.saturating_duration_since(*t) < age);
    }

    /// Holds the clock: no Allocate restarts one (and so none goes on to
    /// touch its links) until the hold is dropped.
    pub(crate) fn hold(&self) -> ClockHold<'_> {
        ClockHold { map: self.lock() }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The clock held by the reclaimer while it deletes ([`AllocationClock::hold`]).
#[derive(Debug)]
pub(crate) struct ClockHold<'a> {
    map: MutexGuard<'a, HashMap<String, Instant>>,
}

impl ClockHold<'_> {
    /// Whether the link named `link` was allocated less than `grace` before `now`.
    pub(crate) fn allocated_within(&self, link: &str, grace: Duration, now: Instant) -> bool {
        self.map
            .get(link)
            .is_some_and(|at| now.saturating_duration_since(*at) < grace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocate_waits_while_the_clock_is_held() {
        let clock = AllocationClock::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        clock.allocated("mvt1", t0);
        let hold = clock.hold();
        assert!(hold.allocated_within("mvt1", s(60), t0 + s(59)));
        assert!(!hold.allocated_within("mvt1", s(60), t0 + s(60)));
        assert!(!hold.allocated_within("mvt2", s(60), t0));
        let (tx, rx) = std::sync::mpsc::channel();
        let allocating = clock.clone();
        let t = std::thread::spawn(move || {
            allocating.allocated("mvt2", t0);
            tx.send(()).unwrap();
        });
        // The Allocate's record waits for the hold: it cannot have been
        // made while the hold lives, whatever the threads' timing.
        assert!(!hold.allocated_within("mvt2", s(60), t0));
        assert!(rx.try_recv().is_err());
        drop(hold);
        rx.recv().unwrap();
        t.join().unwrap();
        assert_eq!(clock.last_allocated("mvt2"), Some(t0));
    }
}
