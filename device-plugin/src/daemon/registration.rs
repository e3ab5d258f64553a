//! One resource's registration with the kubelet, as a state machine of
//! plain transitions: the daemon loop feeds it what happened (a Register
//! due, started, done; a ListAndWatch stream opened or ended; a deadline;
//! a kubelet restart) and acts on what it answers (log, Event, restart the
//! server). No transition waits, spawns a Register or talks to the kubelet.
//!
//! The registration is [`State`]: `Unregistered` (a Register is due at
//! `retry_at`), `Registering` (one Register call in flight) or `Registered`
//! (the call returned; the kubelet must open its ListAndWatch stream within
//! [`STREAM_WAIT`] unless it already did). Beside the state, counted across
//! states: the live streams on the current server (a real kubelet opens the
//! stream before Register returns), quick registration losses in a row, and
//! whether the kubelet may still complete a Register the daemon gave up on.

use crate::error::{Error, Result};
use std::mem;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// First and longest wait between registration attempts.
pub(super) const RETRY_MIN: Duration = Duration::from_millis(100);
pub(super) const RETRY_MAX: Duration = Duration::from_secs(5);
/// How long the kubelet has, after Register returned, to open ListAndWatch
/// (real kubelets open it before Register returns).
pub(crate) const STREAM_WAIT: Duration = Duration::from_secs(2);
/// Failed registrations in a row that make a `RegistrationFailing` Event.
const REGISTRATION_EVENT_AFTER: u32 = 3;
/// While registration keeps failing, how often a failure is logged as a
/// warning (and, from the third failure on, posted as an Event); the rest
/// are debug lines.
const REGISTRATION_WARN_EVERY: Duration = Duration::from_secs(60);
/// A stream that lived this long ends the backoff of quick stream losses.
const STABLE_STREAM: Duration = Duration::from_secs(1);

/// Where a resource's registration stands.
#[derive(Debug)]
enum State {
    /// Not registered: a Register is due at `retry_at`.
    Unregistered { retry_at: Instant, failing: Failing },
    /// The Register call `attempt` runs in `task`.
    Registering {
        attempt: u64,
        task: JoinHandle<()>,
        failing: Failing,
    },
    /// A Register call returned; while `stream_deadline` is set, the kubelet
    /// has opened no stream yet and must by then.
    Registered { stream_deadline: Option<Instant> },
}

/// What failed registrations since the last success left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Failing {
    /// Failed attempts since the last success.
    failures: u32,
    /// When a failure was last logged as a warning.
    warned_at: Option<Instant>,
    /// The wait before the retry after the next failure.
    backoff: Duration,
    /// Whether a missing `kubelet.sock` was logged.
    said_waiting: bool,
}

impl Failing {
    /// Nothing failed since the last success.
    const NONE: Failing = Failing {
        failures: 0,
        warned_at: None,
        backoff: RETRY_MIN,
        said_waiting: false,
    };
}

/// One resource's registration with the kubelet.
#[derive(Debug)]
pub(super) struct Registration {
    state: State,
    /// Live ListAndWatch streams on the current server.
    streams: usize,
    /// When the current server's live streams went from none to one; kept
    /// when they end, until the registration is lost or the server replaced.
    stream_since: Option<Instant>,
    /// Registrations lost in a row soon after they were made.
    losses: u32,
    /// A Register timed out or was abandoned, so the kubelet may still
    /// complete it: a second stream on one server is then a second
    /// registration.
    late_possible: bool,
}

/// What became of a finished Register call.
#[derive(Debug)]
pub(super) enum Done {
    /// It was abandoned (not the call in flight): ignored.
    Stale,
    /// Registered.
    Registered,
    /// It failed with `error`; a retry is due after `delay`. `warn`: worth
    /// a warning (the first failure, then one per
    /// [`REGISTRATION_WARN_EVERY`]); `event`: worth a `RegistrationFailing`
    /// Event (the third failure in a row, then with each warning).
    Failed {
        error: Error,
        delay: Duration,
        failures: u32,
        warn: bool,
        event: bool,
    },
}

/// A ListAndWatch stream opened on the current server.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Opened {
    /// Now this many streams are live.
    Live(usize),
    /// This many streams are live while a Register the daemon gave up on
    /// may have been completed by the kubelet: it was. The server must be
    /// served anew; a new registration is due at once.
    LateRegistration(usize),
}

/// A registration lost because the kubelet has no stream left.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Lost {
    /// How long ago the last stream opened (zero when none did).
    pub lived: Duration,
    /// When the next Register is due, from now.
    pub retry_in: Duration,
}

impl Registration {
    /// A new resource's registration: due at `now`.
    pub(super) fn new(now: Instant) -> Self {
        Self {
            state: State::Unregistered {
                retry_at: now,
                failing: Failing::NONE,
            },
            streams: 0,
            stream_since: None,
            losses: 0,
            late_possible: false,
        }
    }

    /// Whether the kubelet accepted the last Register and has not lost it
    /// since (what `macvtap_dp_registered` shows).
    pub(super) fn is_registered(&self) -> bool {
        matches!(self.state, State::Registered { .. })
    }

    /// Registers again at `now`, abandoning a Register in flight (which
    /// the kubelet may then still complete). Failures since the last
    /// success stay counted; the backoff starts over.
    pub(super) fn want(&mut self, now: Instant) {
        let failing = match self.take_state() {
            State::Unregistered { failing, .. } => failing,
            State::Registering { task, failing, .. } => {
                task.abort();
                self.late_possible = true;
                failing
            }
            State::Registered { .. } => Failing::NONE,
        };
        self.state = State::Unregistered {
            retry_at: now,
            failing: Failing {
                backoff: RETRY_MIN,
                ..failing
            },
        };
    }

    /// The kubelet restarted: registers again at `now`; the old kubelet's
    /// pending Registers died with it.
    pub(super) fn kubelet_restarted(&mut self, now: Instant) {
        self.want(now);
        self.late_possible = false;
    }

    /// Ends the registration for good (the resource is removed or the
    /// daemon stops), aborting a Register in flight.
    pub(super) fn abandon(self) {
        if let State::Registering { task, .. } = self.state {
            task.abort();
        }
    }

    /// Whether a Register is due at `now`.
    pub(super) fn is_due(&self, now: Instant) -> bool {
        matches!(self.state, State::Unregistered { retry_at, .. } if retry_at <= now)
    }

    /// A due Register cannot start yet (the plugin is not served): it is
    /// due again at `at`.
    pub(super) fn postpone(&mut self, at: Instant) {
        if let State::Unregistered { retry_at, .. } = &mut self.state {
            *retry_at = at;
        }
    }

    /// A due Register cannot start because `kubelet.sock` is missing: it is
    /// due again at `at`. True the first time since the last success, when
    /// that is worth a log line.
    pub(super) fn wait_for_kubelet(&mut self, at: Instant) -> bool {
        match &mut self.state {
            State::Unregistered { retry_at, failing } => {
                *retry_at = at;
                !mem::replace(&mut failing.said_waiting, true)
            }
            _ => false,
        }
    }

    /// Starts Register call `attempt` with `spawn` if the registration is
    /// unregistered (else `spawn` is not called); returns whether it did.
    pub(super) fn start(&mut self, attempt: u64, spawn: impl FnOnce() -> JoinHandle<()>) -> bool {
        let State::Unregistered { failing, .. } = self.state else {
            return false;
        };
        self.state = State::Registering {
            attempt,
            task: spawn(),
            failing,
        };
        true
    }

    /// Register call `attempt` ended at `now` with `result`.
    pub(super) fn done(&mut self, attempt: u64, result: Result<()>, now: Instant) -> Done {
        let failing = match &self.state {
            State::Registering {
                attempt: current,
                failing,
                ..
            } if *current == attempt => *failing,
            _ => return Done::Stale,
        };
        let error = match result {
            Ok(()) => {
                self.state = State::Registered {
                    stream_deadline: (self.streams == 0).then(|| now + STREAM_WAIT),
                };
                return Done::Registered;
            }
            Err(e) => e,
        };
        if matches!(&error, Error::Grpc { status, .. } if status.code() == tonic::Code::DeadlineExceeded)
        {
            // The kubelet may still complete this one.
            self.late_possible = true;
        }
        let failures = failing.failures + 1;
        let warn = failing
            .warned_at
            .is_none_or(|t| now.duration_since(t) >= REGISTRATION_WARN_EVERY);
        let delay = failing.backoff;
        self.state = State::Unregistered {
            retry_at: now + delay,
            failing: Failing {
                failures,
                warned_at: if warn { Some(now) } else { failing.warned_at },
                backoff: (delay * 2).min(RETRY_MAX),
                said_waiting: failing.said_waiting,
            },
        };
        Done::Failed {
            error,
            delay,
            failures,
            warn,
            event: failures == REGISTRATION_EVENT_AFTER
                || (warn && failures > REGISTRATION_EVENT_AFTER),
        }
    }

    /// A ListAndWatch stream opened on the current server at `now`.
    pub(super) fn stream_opened(&mut self, now: Instant) -> Opened {
        self.streams += 1;
        if let State::Registered { stream_deadline } = &mut self.state {
            *stream_deadline = None;
        }
        if self.streams == 1 {
            self.stream_since = Some(now);
        }
        if self.streams > 1 && self.late_possible {
            let streams = self.streams;
            self.server_replaced();
            // Wanting a registration abandons the pending one, which makes
            // a late one possible again: clear it after.
            self.want(now);
            self.late_possible = false;
            return Opened::LateRegistration(streams);
        }
        Opened::Live(self.streams)
    }

    /// A ListAndWatch stream of the current server ended at `now`: returns
    /// the streams still live, and whether the registration is lost (it
    /// was registered and has no stream left). A first loss retries at
    /// once, quick repeated losses with backoff.
    pub(super) fn stream_ended(&mut self, now: Instant) -> (usize, Option<Lost>) {
        self.streams = self.streams.saturating_sub(1);
        if self.streams > 0 || !matches!(self.state, State::Registered { .. }) {
            return (self.streams, None);
        }
        let lived = self
            .stream_since
            .map_or(Duration::ZERO, |t| now.duration_since(t));
        let retry_in = self.lost(now);
        (0, Some(Lost { lived, retry_in }))
    }

    /// At `now`: when the kubelet opened no stream by the deadline after
    /// Register, the registration is lost; returns the wait before the
    /// next Register.
    pub(super) fn check_stream_deadline(&mut self, now: Instant) -> Option<Duration> {
        let due = matches!(self.state, State::Registered { stream_deadline: Some(t) } if t <= now);
        (due && self.streams == 0).then(|| self.lost(now))
    }

    /// The plugin is served anew: no stream is live on the new server, and
    /// the old one's stream deadline is void.
    pub(super) fn server_replaced(&mut self) {
        self.streams = 0;
        self.stream_since = None;
        if let State::Registered { stream_deadline } = &mut self.state {
            *stream_deadline = None;
        }
    }

    /// When the loop must wake for this registration: a due Register or a
    /// stream deadline.
    pub(super) fn wake_at(&self) -> Option<Instant> {
        match self.state {
            State::Unregistered { retry_at, .. } => Some(retry_at),
            State::Registering { .. } => None,
            State::Registered { stream_deadline } => stream_deadline,
        }
    }

    /// Registered → unregistered at `now`: due at once after a stable
    /// stream or a first loss, with backoff after quick repeated losses.
    fn lost(&mut self, now: Instant) -> Duration {
        if self
            .stream_since
            .is_some_and(|t| now.duration_since(t) >= STABLE_STREAM)
        {
            self.losses = 0;
        }
        let delay = if self.losses == 0 {
            Duration::ZERO
        } else {
            (RETRY_MIN * 2u32.saturating_pow(self.losses - 1)).min(RETRY_MAX)
        };
        self.losses = self.losses.saturating_add(1);
        self.stream_since = None;
        self.state = State::Unregistered {
            retry_at: now + delay,
            failing: Failing::NONE,
        };
        delay
    }

    /// Takes the state out, leaving a placeholder the caller replaces.
    fn take_state(&mut self) -> State {
        mem::replace(
            &mut self.state,
            State::Registered {
                stream_deadline: None,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::task::AbortHandle;

    /// A Register failure that the kubelet refused outright.
    fn refused() -> Result<()> {
        Err(Error::Grpc {
            op: "registering macvtap.network.kubevirt.io/eth0".into(),
            status: Box::new(tonic::Status::unknown("the ResourceName is invalid")),
        })
    }

    /// A Register that timed out: the kubelet may still complete it.
    fn timed_out() -> Result<()> {
        Err(Error::Grpc {
            op: "registering macvtap.network.kubevirt.io/eth0".into(),
            status: Box::new(tonic::Status::deadline_exceeded("no answer within 5000 ms")),
        })
    }

    /// Starts attempt `attempt` on a task that never ends; returns its abort handle.
    fn start(r: &mut Registration, attempt: u64) -> AbortHandle {
        let mut handle = None;
        assert!(r.start(attempt, || {
            let task = tokio::spawn(std::future::pending::<()>());
            handle = Some(task.abort_handle());
            task
        }));
        handle.unwrap()
    }

    /// Whether the task behind `h` has ended (after the runtime ran once).
    async fn ended(h: &AbortHandle) -> bool {
        tokio::task::yield_now().await;
        h.is_finished()
    }

    /// Runs one Register that ends at `now` with `result`.
    fn register(r: &mut Registration, result: Result<()>, now: Instant) -> Done {
        start(r, 7);
        r.done(7, result, now)
    }

    /// Fails one Register at `now`: its delay, failures in a row, warning and Event.
    fn fail(r: &mut Registration, now: Instant) -> (Duration, u32, bool, bool) {
        match register(r, refused(), now) {
            Done::Failed {
                delay,
                failures,
                warn,
                event,
                ..
            } => {
                assert!(r.is_due(now + delay) && !r.is_due(now + delay / 2));
                (delay, failures, warn, event)
            }
            other => panic!("{other:?}"),
        }
    }

    /// A registration registered at `t0` with a stream open since `t0`.
    fn registered_with_a_stream(t0: Instant) -> Registration {
        let mut r = Registration::new(t0);
        start(&mut r, 1);
        assert_eq!(r.stream_opened(t0), Opened::Live(1));
        assert!(matches!(r.done(1, Ok(()), t0), Done::Registered));
        r
    }

    #[tokio::test]
    async fn a_new_registration_is_due_at_once() {
        let t0 = Instant::now();
        let r = Registration::new(t0);
        assert!(r.is_due(t0));
        assert_eq!(r.wake_at(), Some(t0));
    }

    #[tokio::test]
    async fn a_postponed_registration_is_due_later() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        r.postpone(t0 + RETRY_MAX);
        assert!(!r.is_due(t0));
        assert!(r.is_due(t0 + RETRY_MAX));
        assert_eq!(r.wake_at(), Some(t0 + RETRY_MAX));
    }

    #[tokio::test]
    async fn a_missing_kubelet_is_said_once_until_a_registration_succeeds() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        assert!(r.wait_for_kubelet(t0 + RETRY_MAX), "said the first time");
        assert!(!r.is_due(t0));
        assert_eq!(r.wake_at(), Some(t0 + RETRY_MAX));
        assert!(!r.wait_for_kubelet(t0 + RETRY_MAX * 2), "not again");
        // Wanting a registration again does not make it worth saying again.
        r.want(t0);
        assert!(!r.wait_for_kubelet(t0 + RETRY_MAX));
        // A success does.
        r.want(t0);
        assert!(matches!(register(&mut r, Ok(()), t0), Done::Registered));
        r.want(t0);
        assert!(r.wait_for_kubelet(t0 + RETRY_MAX));
    }

    #[tokio::test]
    async fn starting_makes_it_registering_once() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        start(&mut r, 1);
        assert!(matches!(r.state, State::Registering { attempt: 1, .. }));
        assert!(
            !r.is_due(t0 + RETRY_MAX),
            "no second Register while one runs"
        );
        assert_eq!(r.wake_at(), None);
        let mut spawned = false;
        assert!(!r.start(2, || {
            spawned = true;
            tokio::spawn(async {})
        }));
        assert!(!spawned, "no task is spawned unless unregistered");
    }

    #[tokio::test]
    async fn a_register_that_returns_waits_for_the_stream() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        start(&mut r, 1);
        assert!(matches!(r.done(1, Ok(()), t0), Done::Registered));
        assert_eq!(r.wake_at(), Some(t0 + STREAM_WAIT), "the stream deadline");
        assert!(!r.is_due(t0 + RETRY_MAX));
        assert_eq!(r.check_stream_deadline(t0 + STREAM_WAIT / 2), None);
        // The stream opens in time: no deadline any more.
        assert_eq!(r.stream_opened(t0 + STREAM_WAIT / 2), Opened::Live(1));
        assert_eq!(r.wake_at(), None);
        assert_eq!(r.check_stream_deadline(t0 + STREAM_WAIT * 2), None);
    }

    #[tokio::test]
    async fn a_stream_opened_before_register_returned_sets_no_deadline() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        start(&mut r, 1);
        assert_eq!(r.stream_opened(t0), Opened::Live(1));
        assert!(matches!(r.done(1, Ok(()), t0), Done::Registered));
        assert!(matches!(
            r.state,
            State::Registered {
                stream_deadline: None
            }
        ));
        assert_eq!(r.wake_at(), None);
    }

    #[tokio::test]
    async fn no_stream_by_the_deadline_loses_the_registration() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        start(&mut r, 1);
        assert!(matches!(r.done(1, Ok(()), t0), Done::Registered));
        let at = t0 + STREAM_WAIT;
        assert_eq!(r.check_stream_deadline(at), Some(Duration::ZERO));
        assert!(r.is_due(at), "registers again at once");
        assert_eq!(r.check_stream_deadline(at), None, "lost once");
    }

    #[tokio::test]
    async fn an_abandoned_registers_result_is_ignored() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        start(&mut r, 1);
        r.want(t0);
        start(&mut r, 2);
        assert!(matches!(r.done(1, Ok(()), t0), Done::Stale));
        assert!(matches!(r.done(1, refused(), t0), Done::Stale));
        assert!(matches!(r.state, State::Registering { attempt: 2, .. }));
        assert!(matches!(r.done(2, Ok(()), t0), Done::Registered));
        assert!(
            matches!(r.done(2, Ok(()), t0), Done::Stale),
            "a result when none is in flight"
        );
    }

    #[tokio::test]
    async fn a_failing_registration_warns_at_once_then_once_a_period_with_backoff() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        let warned = |f: (Duration, u32, bool, bool)| (f.0, f.2);
        assert_eq!(warned(fail(&mut r, t0)), (RETRY_MIN, true));
        assert_eq!(warned(fail(&mut r, t0 + RETRY_MIN)), (RETRY_MIN * 2, false));
        // Failures every RETRY_MAX until just before the period is over.
        let mut now = t0 + RETRY_MIN;
        let mut last = Duration::ZERO;
        while now + RETRY_MAX < t0 + REGISTRATION_WARN_EVERY {
            now += RETRY_MAX;
            let (delay, warned) = warned(fail(&mut r, now));
            assert!(!warned);
            last = delay;
        }
        assert_eq!(last, RETRY_MAX, "the backoff stops at RETRY_MAX");
        let (_, warned_again) = warned(fail(&mut r, t0 + REGISTRATION_WARN_EVERY));
        assert!(
            warned_again,
            "a warning again after REGISTRATION_WARN_EVERY"
        );
        assert!(!warned(fail(&mut r, t0 + REGISTRATION_WARN_EVERY)).1);
        // A success starts over: the next failure warns at once.
        assert!(matches!(
            register(&mut r, Ok(()), t0 + REGISTRATION_WARN_EVERY),
            Done::Registered
        ));
        r.want(t0 + REGISTRATION_WARN_EVERY);
        assert_eq!(
            fail(&mut r, t0 + REGISTRATION_WARN_EVERY),
            (RETRY_MIN, 1, true, false)
        );
    }

    #[tokio::test]
    async fn the_third_failure_in_a_row_is_an_event_then_each_warning() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        let event = |f: (Duration, u32, bool, bool)| (f.1, f.3);
        let events: Vec<_> = (0..4).map(|_| event(fail(&mut r, t0))).collect();
        assert_eq!(events, [(1, false), (2, false), (3, true), (4, false)]);
        // Wanting a registration again (a kubelet restart) keeps the count.
        r.want(t0);
        assert_eq!(event(fail(&mut r, t0)), (5, false));
        // With the next warning, an Event again.
        assert_eq!(event(fail(&mut r, t0 + REGISTRATION_WARN_EVERY)), (6, true));
        assert_eq!(
            event(fail(&mut r, t0 + REGISTRATION_WARN_EVERY)),
            (7, false)
        );
    }

    #[tokio::test]
    async fn wanting_a_registration_starts_the_backoff_over_and_keeps_the_failures() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        for _ in 0..3 {
            fail(&mut r, t0);
        }
        assert!(!r.is_due(t0));
        r.want(t0);
        assert!(r.is_due(t0), "due at once");
        let (delay, failures, ..) = fail(&mut r, t0);
        assert_eq!((delay, failures), (RETRY_MIN, 4));
    }

    #[tokio::test]
    async fn wanting_a_registration_abandons_the_one_in_flight() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        let task = start(&mut r, 1);
        r.want(t0);
        assert!(ended(&task).await, "the Register task is aborted");
        assert!(r.is_due(t0));
        assert!(r.late_possible, "the kubelet may still complete it");
    }

    #[tokio::test]
    async fn wanting_a_registration_when_registered_unregisters() {
        let t0 = Instant::now();
        let mut r = registered_with_a_stream(t0);
        r.want(t0 + STREAM_WAIT);
        assert!(r.is_due(t0 + STREAM_WAIT));
        assert!(!r.late_possible);
        // Its old stream ending is no loss now.
        assert_eq!(r.stream_ended(t0 + STREAM_WAIT), (0, None));
    }

    #[tokio::test]
    async fn a_kubelet_restart_registers_again_and_forgets_late_registrations() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        let task = start(&mut r, 1);
        r.kubelet_restarted(t0);
        assert!(ended(&task).await);
        assert!(r.is_due(t0));
        assert!(
            !r.late_possible,
            "the old kubelet's pending Register died with it"
        );
        let mut r = registered_with_a_stream(t0);
        r.kubelet_restarted(t0);
        assert!(r.is_due(t0));
    }

    #[tokio::test]
    async fn abandoning_aborts_the_register_in_flight() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        let task = start(&mut r, 1);
        r.abandon();
        assert!(ended(&task).await);
    }

    #[tokio::test]
    async fn a_timed_out_register_completed_late_restarts_on_the_second_stream() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        start(&mut r, 1);
        assert!(matches!(r.done(1, timed_out(), t0), Done::Failed { .. }));
        assert!(r.late_possible);
        start(&mut r, 2);
        // The late Register's stream, then the new Register's.
        assert_eq!(r.stream_opened(t0), Opened::Live(1));
        let task = {
            let State::Registering { task, .. } = &r.state else {
                panic!("{:?}", r.state)
            };
            task.abort_handle()
        };
        assert_eq!(r.stream_opened(t0), Opened::LateRegistration(2));
        assert!(ended(&task).await, "the Register in flight is abandoned");
        assert!(r.is_due(t0), "registers once more at once");
        assert!(!r.late_possible, "only once");
        assert_eq!(r.streams, 0, "the server is served anew");
        assert_eq!(r.stream_since, None);
    }

    #[tokio::test]
    async fn a_refused_register_makes_a_second_stream_no_late_registration() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        start(&mut r, 1);
        assert!(matches!(r.done(1, refused(), t0), Done::Failed { .. }));
        assert_eq!(r.stream_opened(t0), Opened::Live(1));
        assert_eq!(r.stream_opened(t0), Opened::Live(2));
    }

    #[tokio::test]
    async fn a_stream_ending_while_registering_or_with_another_live_loses_nothing() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        start(&mut r, 1);
        assert_eq!(r.stream_opened(t0), Opened::Live(1));
        assert_eq!(r.stream_ended(t0), (0, None));
        assert!(matches!(r.state, State::Registering { .. }));
        let mut r = registered_with_a_stream(t0);
        assert_eq!(r.stream_opened(t0), Opened::Live(2));
        assert_eq!(r.stream_ended(t0), (1, None));
        assert!(matches!(r.state, State::Registered { .. }));
    }

    #[tokio::test]
    async fn the_last_stream_ending_loses_the_registration_at_once() {
        let t0 = Instant::now();
        let mut r = registered_with_a_stream(t0);
        let at = t0 + STABLE_STREAM * 3;
        assert_eq!(
            r.stream_ended(at),
            (
                0,
                Some(Lost {
                    lived: STABLE_STREAM * 3,
                    retry_in: Duration::ZERO
                })
            )
        );
        assert!(r.is_due(at));
    }

    #[tokio::test]
    async fn quick_losses_back_off_and_a_stable_stream_resets_them() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        // Registers at `now` and loses the registration: the stream opened
        // at `opened` and ended at `now`, or none opened by the deadline.
        let lose = |r: &mut Registration, opened: Option<Instant>, now: Instant| {
            start(r, 1);
            if let Some(t) = opened {
                r.stream_opened(t);
            }
            assert!(matches!(r.done(1, Ok(()), now), Done::Registered));
            let delay = match opened {
                Some(_) => r.stream_ended(now).1.unwrap().retry_in,
                None => r.check_stream_deadline(now + STREAM_WAIT).unwrap(),
            };
            r.want(now);
            delay
        };
        assert_eq!(lose(&mut r, Some(t0), t0), Duration::ZERO);
        assert_eq!(lose(&mut r, Some(t0), t0), RETRY_MIN);
        assert_eq!(lose(&mut r, None, t0), RETRY_MIN * 2);
        assert_eq!(lose(&mut r, Some(t0), t0), RETRY_MIN * 4);
        for _ in 0..10 {
            lose(&mut r, Some(t0), t0);
        }
        assert_eq!(lose(&mut r, Some(t0), t0), RETRY_MAX, "up to RETRY_MAX");
        assert_eq!(
            lose(&mut r, Some(t0), t0 + STABLE_STREAM),
            Duration::ZERO,
            "a stream that lived STABLE_STREAM ends the backoff"
        );
    }

    #[tokio::test]
    async fn a_stream_that_ended_before_register_returned_still_counts_as_stable() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        r.losses = 3;
        start(&mut r, 1);
        assert_eq!(r.stream_opened(t0), Opened::Live(1));
        assert_eq!(r.stream_ended(t0), (0, None));
        assert!(matches!(r.done(1, Ok(()), t0), Done::Registered));
        // No stream by the deadline, a stable while after the first opened.
        assert_eq!(
            r.check_stream_deadline(t0 + STREAM_WAIT),
            Some(Duration::ZERO)
        );
    }

    #[tokio::test]
    async fn a_new_server_has_no_streams_and_voids_the_deadline() {
        let t0 = Instant::now();
        let mut r = Registration::new(t0);
        start(&mut r, 1);
        assert_eq!(r.stream_opened(t0), Opened::Live(1));
        assert_eq!(r.stream_ended(t0), (0, None));
        assert!(matches!(r.done(1, Ok(()), t0), Done::Registered));
        assert_eq!(r.wake_at(), Some(t0 + STREAM_WAIT));
        r.server_replaced();
        assert_eq!((r.streams, r.stream_since), (0, None));
        assert_eq!(r.wake_at(), None);
        assert_eq!(r.check_stream_deadline(t0 + STREAM_WAIT), None);
        assert_eq!(r.stream_opened(t0), Opened::Live(1));
    }
}
