//! When to retry and how long to wait: the retry policy as a value, full-jitter backoff, and
//! `Retry-After`.

use std::time::{Duration, SystemTime};

use awc::http::header::HttpDate;
use awc::http::StatusCode;
use rand::Rng;

use crate::http::problem::REQUEST_IN_PROGRESS;

/// How long a write is retried and how far apart the attempts are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Bound on the whole call, from the first attempt on: no attempt starts or runs past it,
    /// and a wait that would pass it gives up instead.
    pub max_time: Duration,
    /// Bound on one attempt: connecting, sending, and reading the whole answer.
    pub attempt_timeout: Duration,
    /// The wait after the first failed attempt is random in [0, `base_delay`]; the bound doubles
    /// with each further failure.
    pub base_delay: Duration,
    /// Cap on that bound. A longer `Retry-After` is still honoured.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    /// Ten minutes in all, 30 s per attempt, waits from up to 0.5 s growing to up to 30 s: long
    /// enough to ride out a daemon restart or a database failover, short enough for a daily job.
    fn default() -> Self {
        Self {
            max_time: Duration::from_secs(600),
            attempt_timeout: Duration::from_secs(30),
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The bound of the wait after `failures` failed attempts (1 for the first):
    /// `min(max_delay, base_delay × 2^(failures − 1))`.
    pub fn backoff_bound(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1));
        self.base_delay.saturating_mul(factor).min(self.max_delay)
    }

    /// The wait before the next attempt, or None to give up now. "Full jitter": uniform in
    /// [0, bound], the bound cut to `time_left`, so that many callers that failed together do
    /// not retry together; at least `retry_after` when the daemon advised one. None when that
    /// advised wait would pass the deadline (sleeping past it would only end in giving up
    /// later), or when no more than `base_delay` is left (short waits then would pile attempts
    /// into the last moments).
    pub fn wait_before_retry(
        &self,
        failures: u32,
        retry_after: Option<Duration>,
        time_left: Duration,
    ) -> Option<Duration> {
        let floor = retry_after.unwrap_or_default();
        if time_left <= self.base_delay || floor >= time_left {
            return None;
        }
        let bound = self.backoff_bound(failures).min(time_left);
        let jitter = rand::thread_rng().gen_range(0.0..=bound.as_secs_f64());
        Some(Duration::from_secs_f64(jitter).max(floor))
    }
}

/// Whether an answer says "try again later": 408, 409 `request-in-progress`, 429 and every 5xx.
/// Every other 4xx (a reused key among them: also a 409, or 422) needs a different request, and
/// so does a redirect (a POST must not be replayed as the GET a redirect turns it into).
pub fn is_retryable(status: StatusCode, problem_type: Option<&str>) -> bool {
    match status {
        StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS => true,
        StatusCode::CONFLICT => problem_type == Some(&request_in_progress_type()),
        status => status.is_server_error(),
    }
}

/// The one 409 worth retrying, named as the daemon names it.
fn request_in_progress_type() -> String {
    REQUEST_IN_PROGRESS.type_uri()
}

/// A `Retry-After` value as a wait from `now`: delay-seconds or an HTTP date (a date already
/// past is no wait). None when it is neither.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date: SystemTime = value.parse::<HttpDate>().ok()?.into();
    Some(date.duration_since(now).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_bound_doubles_up_to_the_cap() {
        let policy = RetryPolicy {
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            ..RetryPolicy::default()
        };
        let bounds: Vec<u128> = (1..=6)
            .map(|n| policy.backoff_bound(n).as_millis())
            .collect();
        assert_eq!(bounds, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(policy.backoff_bound(u32::MAX), Duration::from_secs(1));
        let plenty = Duration::from_secs(60);
        for failures in 1..=10 {
            let wait = policy.wait_before_retry(failures, None, plenty).unwrap();
            assert!(wait <= policy.backoff_bound(failures), "{wait:?}");
            let advised = policy
                .wait_before_retry(failures, Some(Duration::from_secs(3)), plenty)
                .unwrap();
            assert!(advised >= Duration::from_secs(3), "Retry-After is a floor");
        }
    }

    #[test]
    fn no_wait_passes_the_deadline() {
        let policy = RetryPolicy {
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(10),
            ..RetryPolicy::default()
        };
        let left = Duration::from_millis(300);
        for _ in 0..100 {
            let wait = policy.wait_before_retry(8, None, left).unwrap();
            assert!(wait <= left, "the jitter is cut to the time left: {wait:?}");
        }
        assert_eq!(
            policy.wait_before_retry(1, Some(Duration::from_secs(1)), left),
            None,
            "an advised wait past the deadline gives up at once"
        );
        assert_eq!(
            policy.wait_before_retry(1, None, policy.base_delay),
            None,
            "the last base_delay is not spent on ever shorter waits"
        );
        assert_eq!(policy.wait_before_retry(1, None, Duration::ZERO), None);
    }

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777); // 1994-11-06 08:49:37
        assert_eq!(parse_retry_after("1", now), Some(Duration::from_secs(1)));
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-1", now), None);
    }

    #[test]
    fn only_transient_answers_are_retried() {
        let in_progress = "/problems/request-in-progress";
        for status in [408, 429, 500, 502, 503, 504] {
            let status = StatusCode::from_u16(status).unwrap();
            assert!(is_retryable(status, None), "{status}");
        }
        assert!(is_retryable(StatusCode::CONFLICT, Some(in_progress)));
        assert!(!is_retryable(
            StatusCode::CONFLICT,
            Some("/problems/idempotency-key-reused")
        ));
        assert!(!is_retryable(StatusCode::CONFLICT, None));
        for status in [301, 400, 401, 404, 413, 415, 422] {
            let status = StatusCode::from_u16(status).unwrap();
            assert!(!is_retryable(status, None), "{status}");
        }
    }
}
