//! The kubelet's rate limit on its PodResources API: one token bucket for
//! all callers, as kubernetes `pkg/kubelet/apis/podresources/grpc/
//! ratelimit.go` sets it up (`WithRateLimiter(DefaultQPS,
//! DefaultBurstTokens)` over `golang.org/x/time/rate`'s `Limiter`, checked by
//! `LimiterUnaryServerInterceptor` before every unary call).

use std::time::Instant;

/// Tokens the kubelet's bucket gains per second (`DefaultQPS`).
pub const DEFAULT_QPS: f64 = 100.0;
/// Tokens the kubelet's bucket holds at most, and starts with
/// (`DefaultBurstTokens`).
pub const DEFAULT_BURST_TOKENS: u32 = 10;
/// The message of the `ResourceExhausted` status a refused call gets
/// (`ErrorLimitExceeded`).
pub const LIMIT_EXCEEDED: &str = "rejected by rate limit";

/// A token bucket as `rate.Limiter`'s `Allow` uses it: full at the start,
/// refilled continuously at `qps` up to `burst`; a call takes one token or
/// is refused and changes nothing.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilled at `qps` tokens a second
    /// (`qps` 0: the burst is all there ever is, as in `rate.Limiter`).
    pub fn new(qps: f64, burst: u32) -> Self {
        Self {
            qps: qps.max(0.0),
            burst: f64::from(burst),
            tokens: f64::from(burst),
            last: None,
        }
    }

    /// The kubelet's bucket: [`DEFAULT_QPS`], [`DEFAULT_BURST_TOKENS`].
    pub fn kubelet() -> Self {
        Self::new(DEFAULT_QPS, DEFAULT_BURST_TOKENS)
    }

    /// Whether a call at `now` may go on (`Limiter.Allow`); takes a token
    /// if so.
    pub fn allow(&mut self, now: Instant) -> bool {
        let tokens = match self.last {
            None => self.burst,
            Some(last) => {
                let elapsed = now.saturating_duration_since(last).as_secs_f64();
                (self.tokens + elapsed * self.qps).min(self.burst)
            }
        };
        if tokens < 1.0 {
            return false;
        }
        self.tokens = tokens - 1.0;
        self.last = Some(now.max(self.last.unwrap_or(now)));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_kubelet_bucket_lets_ten_through_at_once_then_one_per_ten_ms() {
        let mut b = TokenBucket::kubelet();
        let t0 = Instant::now();
        for i in 0..10 {
            assert!(b.allow(t0), "call {i} of the burst");
        }
        assert!(!b.allow(t0), "the eleventh at once is refused");
        assert!(!b.allow(t0 + Duration::from_millis(9)));
        assert!(
            b.allow(t0 + Duration::from_millis(10)),
            "one token per 10 ms"
        );
        assert!(!b.allow(t0 + Duration::from_millis(10)));
        // A long pause refills the burst, never more.
        let later = t0 + Duration::from_secs(60);
        for i in 0..10 {
            assert!(b.allow(later), "call {i} after the pause");
        }
        assert!(!b.allow(later));
    }

    #[test]
    fn refused_calls_take_nothing() {
        let mut b = TokenBucket::new(100.0, 1);
        let t0 = Instant::now();
        assert!(b.allow(t0));
        for ms in 1..10 {
            assert!(!b.allow(t0 + Duration::from_millis(ms)));
        }
        assert!(b.allow(t0 + Duration::from_millis(10)));
    }

    #[test]
    fn no_rate_and_no_burst_refuses_everything() {
        let mut b = TokenBucket::new(0.0, 0);
        let t0 = Instant::now();
        assert!(!b.allow(t0));
        assert!(!b.allow(t0 + Duration::from_secs(3600)));
        let mut b = TokenBucket::new(0.0, 2);
        assert!(b.allow(t0));
        assert!(b.allow(t0 + Duration::from_secs(3600)));
        assert!(!b.allow(t0 + Duration::from_secs(7200)));
    }
}
