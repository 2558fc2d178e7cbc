//! Per-client limits, so that one client's flood cannot take every other client's share of the
//! writers and the pools: at most `max_concurrent_writes` writes of a client in flight at once,
//! and at most `max_requests_per_second` of its requests on any route (a token bucket holding
//! one second's worth, so a burst that size passes). Past either, 429 `rate-limited` at once,
//! with `Retry-After` and the `RateLimit-Policy` / `RateLimit` fields of
//! draft-ietf-httpapi-ratelimit-headers. Nothing is queued: a refused request costs a header
//! check and a short answer.
//!
//! A client that goes on sending while refused (a flood that ignores `Retry-After`) would still
//! take the daemon's CPU with refusals, however cheap each: past [`FREE_REFUSALS`] refusals in a
//! second, each further refusal is answered only after [`SLOW_REFUSAL`]. A connection then
//! sends at most one request a second, and a flood of a few hundred connections costs timers,
//! not the CPU the other clients' requests need.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::metric;

/// Refusals a client gets at once in a second; the ones after are slowed.
pub const FREE_REFUSALS: u32 = 16;

/// How long a refusal past [`FREE_REFUSALS`] waits before it is answered.
pub const SLOW_REFUSAL: Duration = Duration::from_secs(1);

pub use crate::config::Limits;

/// Which limit refused a request, and what to tell the client.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimited {
    pub limit: Limit,
    /// When the same request may pass, at the soonest (whole seconds, at least one).
    pub retry_after: Duration,
    /// The `RateLimit-Policy` field: every limit the client has.
    pub policy: String,
    /// The `RateLimit` field: what is left of the limit that refused.
    pub state: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    ConcurrentWrites,
    RequestsPerSecond,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::ConcurrentWrites => "concurrent_writes",
            Limit::RequestsPerSecond => "requests_per_second",
        }
    }

    /// The policy's name in the `RateLimit-Policy` and `RateLimit` fields.
    fn policy_name(self) -> &'static str {
        match self {
            Limit::ConcurrentWrites => "writes",
            Limit::RequestsPerSecond => "requests",
        }
    }
}

/// One client's limits and what it uses of them now.
#[derive(Debug)]
pub struct ClientLimiter {
    client: Arc<str>,
    limits: Limits,
    writes_in_flight: Arc<AtomicUsize>,
    bucket: Mutex<Bucket>,
    /// Refusals in the current second: since when, and how many.
    refusals: Mutex<(Instant, u32)>,
    /// The `RateLimit-Policy` field, made once.
    policy: String,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    refilled: Instant,
}

/// A write of the client in flight; given back when dropped.
#[derive(Debug)]
pub struct WritePermit(Option<Arc<AtomicUsize>>);

impl Drop for WritePermit {
    fn drop(&mut self) {
        if let Some(in_flight) = self.0.take() {
            in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl ClientLimiter {
    pub fn new(client: Arc<str>, limits: Limits) -> Self {
        let mut policies = Vec::new();
        if limits.max_concurrent_writes > 0 {
            policies.push(format!(
                "\"{}\";q={};qu=\"concurrent-requests\"",
                Limit::ConcurrentWrites.policy_name(),
                limits.max_concurrent_writes
            ));
        }
        if limits.max_requests_per_second > 0.0 {
            policies.push(format!(
                "\"{}\";q={};w=1",
                Limit::RequestsPerSecond.policy_name(),
                quota(limits.max_requests_per_second)
            ));
        }
        Self {
            client,
            limits,
            writes_in_flight: Arc::new(AtomicUsize::new(0)),
            bucket: Mutex::new(Bucket {
                tokens: burst(limits.max_requests_per_second),
                refilled: Instant::now(),
            }),
            refusals: Mutex::new((Instant::now(), 0)),
            policy: policies.join(", "),
        }
    }

    /// Takes one request from the client's rate, or says when the next may come (slowly, to a
    /// client that keeps sending while refused).
    pub async fn admit_request(&self) -> Result<(), RateLimited> {
        let refused = self.take_request();
        self.answer(refused).await
    }

    /// A permit for one more write in flight, or a refusal past `max_concurrent_writes`
    /// (slowly, to a client that keeps sending while refused).
    pub async fn start_write(&self) -> Result<WritePermit, RateLimited> {
        let started = self.take_write();
        self.answer(started).await
    }

    /// `result`, after [`SLOW_REFUSAL`] if it is a refusal past the client's
    /// [`FREE_REFUSALS`] of this second.
    async fn answer<T>(&self, result: Result<T, RateLimited>) -> Result<T, RateLimited> {
        if result.is_err() && self.refused_often() {
            tokio::time::sleep(SLOW_REFUSAL).await;
        }
        result
    }

    /// Counts a refusal; true past the first [`FREE_REFUSALS`] of the current second.
    fn refused_often(&self) -> bool {
        let now = Instant::now();
        let mut refusals = self
            .refusals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if now.duration_since(refusals.0) >= Duration::from_secs(1) {
            *refusals = (now, 0);
        }
        refusals.1 = refusals.1.saturating_add(1);
        refusals.1 > FREE_REFUSALS
    }

    fn take_request(&self) -> Result<(), RateLimited> {
        let rate = self.limits.max_requests_per_second;
        if rate <= 0.0 {
            return Ok(());
        }
        let now = Instant::now();
        // A panic while holding the lock cannot leave the bucket in a state that matters.
        let mut bucket = self
            .bucket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let refill = now.duration_since(bucket.refilled).as_secs_f64() * rate;
        bucket.tokens = (bucket.tokens + refill).min(burst(rate));
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = Duration::from_secs_f64((1.0 - bucket.tokens) / rate);
        drop(bucket);
        Err(self.refused(Limit::RequestsPerSecond, wait))
    }

    fn take_write(&self) -> Result<WritePermit, RateLimited> {
        let max = self.limits.max_concurrent_writes as usize;
        if max == 0 {
            return Ok(WritePermit(None));
        }
        let taken =
            self.writes_in_flight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |in_flight| {
                    (in_flight < max).then_some(in_flight + 1)
                });
        match taken {
            Ok(_) => Ok(WritePermit(Some(self.writes_in_flight.clone()))),
            // A write in flight ends within idempotency.wait_timeout; most much sooner.
            Err(_) => Err(self.refused(Limit::ConcurrentWrites, Duration::from_secs(1))),
        }
    }

    fn refused(&self, limit: Limit, wait: Duration) -> RateLimited {
        metrics::counter!(
            metric::RATE_LIMITED,
            "client" => self.client.to_string(),
            "limit" => limit.as_str()
        )
        .increment(1);
        let retry_after = Duration::from_secs(wait.as_secs_f64().ceil().max(1.0) as u64);
        let state = match limit {
            Limit::ConcurrentWrites => format!("\"{}\";r=0", limit.policy_name()),
            Limit::RequestsPerSecond => format!(
                "\"{}\";r=0;t={}",
                limit.policy_name(),
                retry_after.as_secs()
            ),
        };
        RateLimited {
            limit,
            retry_after,
            policy: self.policy.clone(),
            state,
        }
    }
}

/// A second's worth of requests, and at least one.
fn burst(rate: f64) -> f64 {
    rate.max(1.0)
}

/// The quota as the field states it: an integer.
fn quota(rate: f64) -> u64 {
    rate.ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(max_concurrent_writes: u32, max_requests_per_second: f64) -> ClientLimiter {
        ClientLimiter::new(
            Arc::from("jobs"),
            Limits {
                max_concurrent_writes,
                max_requests_per_second,
            },
        )
    }

    #[test]
    fn writes_in_flight_are_bounded_and_given_back() {
        let limiter = limiter(2, 0.0);
        let first = limiter.take_write().unwrap();
        let _second = limiter.take_write().unwrap();
        let refused = limiter.take_write().unwrap_err();
        assert_eq!(refused.limit, Limit::ConcurrentWrites);
        assert_eq!(refused.retry_after, Duration::from_secs(1));
        assert_eq!(refused.policy, "\"writes\";q=2;qu=\"concurrent-requests\"");
        assert_eq!(refused.state, "\"writes\";r=0");
        drop(first);
        limiter.take_write().unwrap();
    }

    #[test]
    fn requests_pass_at_the_rate_with_a_burst_of_one_second() {
        let limiter = limiter(4, 10.0);
        for _ in 0..10 {
            limiter.take_request().unwrap();
        }
        let refused = limiter.take_request().unwrap_err();
        assert_eq!(refused.limit, Limit::RequestsPerSecond);
        assert_eq!(refused.retry_after, Duration::from_secs(1));
        assert_eq!(
            refused.policy,
            "\"writes\";q=4;qu=\"concurrent-requests\", \"requests\";q=10;w=1"
        );
        assert_eq!(refused.state, "\"requests\";r=0;t=1");
        // A tenth of a second later, one more.
        limiter.bucket.lock().unwrap().refilled -= Duration::from_millis(110);
        limiter.take_request().unwrap();
        assert!(limiter.take_request().is_err());
    }

    #[test]
    fn no_limits_refuse_nothing() {
        let limiter = limiter(0, 0.0);
        let permits: Vec<_> = (0..1000).map(|_| limiter.take_write().unwrap()).collect();
        assert_eq!(permits.len(), 1000);
        for _ in 0..1000 {
            limiter.take_request().unwrap();
        }
    }

    #[test]
    fn refusals_past_the_free_ones_of_a_second_are_slowed() {
        let limiter = limiter(1, 0.0);
        for _ in 0..FREE_REFUSALS {
            assert!(!limiter.refused_often());
        }
        assert!(limiter.refused_often());
        limiter.refusals.lock().unwrap().0 -= Duration::from_secs(1);
        assert!(!limiter.refused_often(), "a new second");
    }
}
