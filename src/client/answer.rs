//! What an answer means for the caller: [`Outcome`]s that end the write (created, replayed,
//! refused, gave up), [`AttemptError`]s that another attempt may cure, and how each attempt is
//! reported.

use std::fmt;
use std::time::{Duration, SystemTime};

use awc::http::header::{self, HeaderMap};
use awc::http::StatusCode;
use serde::Deserialize;

use super::policy::{is_retryable, parse_retry_after};
use crate::entry::{EntryView, FieldError};
use crate::http::entries::IDEMPOTENCY_REPLAYED;
use crate::http::problem::PROBLEM_TYPE_PREFIX;

/// What an answer means for the write: done (created, replayed, refused), or try again.
/// One match over every answer the daemon can give, kept together so the table of outcomes
/// reads in one place (hence its length).
pub(super) fn judge(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Outcome, AttemptError> {
    let problem = serde_json::from_slice::<ProblemDetails>(body)
        .ok()
        .filter(|problem| !problem.problem_type.is_empty());
    if is_retryable(status, problem.as_ref().map(|p| p.problem_type.as_str())) {
        let retry_after = headers
            .get(header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| {
                Some(RetryAfter {
                    wait: parse_retry_after(text, SystemTime::now())?,
                    header: text.trim().to_owned(),
                })
            });
        return Err(AttemptError::Status {
            status: status.as_u16(),
            problem: problem.map(Box::new),
            retry_after,
        });
    }
    let refused = |reason: String, problem: Option<ProblemDetails>| Outcome::Refused {
        status: status.as_u16(),
        problem,
        reason,
    };
    if status.is_success() {
        let text = String::from_utf8_lossy(body).into_owned();
        return Ok(match serde_json::from_str::<EntryView>(&text) {
            Ok(entry) => {
                let written = Written {
                    status: status.as_u16(),
                    entry,
                    body: text,
                };
                let replayed = headers
                    .get(IDEMPOTENCY_REPLAYED)
                    .is_some_and(|value| value.as_bytes() == b"true");
                if replayed {
                    Outcome::Replayed(written)
                } else {
                    Outcome::Created(written)
                }
            }
            Err(error) => refused(
                format!("{status}, but the answer is not an entry ({error}); is the URL the daemon's base URL?"),
                None,
            ),
        });
    }
    if status.is_redirection() {
        let location = headers
            .get(header::LOCATION)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("?");
        return Ok(refused(
            format!("{status}, redirected to {location}; give the daemon's own base URL"),
            None,
        ));
    }
    Ok(match problem {
        Some(problem) => refused(
            format!("{status_code} {problem}", status_code = status.as_u16()),
            Some(problem),
        ),
        None => {
            let excerpt: String = String::from_utf8_lossy(body).chars().take(200).collect();
            refused(format!("{status}: {excerpt}"), None)
        }
    })
}

/// An RFC 9457 problem, as the daemon answers a refusal.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ProblemDetails {
    /// `/problems/<slug>`.
    #[serde(rename = "type", default)]
    pub problem_type: String,
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub detail: String,
    /// For `invalid-request`: what is wrong, field by field.
    #[serde(default)]
    pub errors: Vec<FieldError>,
}

impl ProblemDetails {
    /// `request-in-progress` for `/problems/request-in-progress`.
    pub fn slug(&self) -> &str {
        self.problem_type
            .strip_prefix(PROBLEM_TYPE_PREFIX)
            .unwrap_or(&self.problem_type)
    }
}

impl fmt::Display for ProblemDetails {
    /// `idempotency-key-reused: <detail>`, with the field errors if any.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.slug(), self.detail)?;
        for error in &self.errors {
            write!(f, "; {} {}", error.pointer, error.detail)?;
        }
        Ok(())
    }
}

/// A write the daemon holds: created by this call, or replayed from an earlier one.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// 201 for a new entry; a replay repeats the first answer's status.
    pub status: u16,
    pub entry: EntryView,
    /// The answer's body as the daemon sent it: the entry in canonical JSON.
    pub body: String,
}

/// What became of a write.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Written by this call.
    Created(Written),
    /// Written before, by an earlier attempt whose answer was lost or by an earlier run with the
    /// same key: this is its saved answer (`Idempotency-Replayed: true`).
    Replayed(Written),
    /// Answered with a status that retrying cannot change (a 4xx other than 408, 409
    /// `request-in-progress` and 429, or a redirect): the request must be fixed. This request
    /// wrote nothing.
    Refused {
        status: u16,
        problem: Option<ProblemDetails>,
        /// Status, problem type and detail, for a log line.
        reason: String,
    },
    /// Every attempt failed for a reason that may pass, until the policy's `max_time`. The write
    /// may or may not have happened; retrying later with the same key is safe either way.
    GaveUp {
        attempts: u32,
        elapsed: Duration,
        last_error: AttemptError,
    },
}

/// An attempt that may succeed if tried again.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AttemptError {
    /// No connection, or it broke before the whole answer arrived.
    #[error("no answer: {0}")]
    Transport(String),
    #[error("no answer within {}", seconds(.0))]
    TimedOut(Duration),
    /// 408, 409 `request-in-progress`, 429 or 5xx.
    #[error("{status} {}", .problem.as_ref().map_or_else(|| reason_phrase(*.status), |p| p.slug().to_owned()))]
    Status {
        status: u16,
        /// Boxed: the error stays small, and most attempts do not fail.
        problem: Option<Box<ProblemDetails>>,
        retry_after: Option<RetryAfter>,
    },
}

impl AttemptError {
    /// The wait the daemon advised, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            AttemptError::Status {
                retry_after: Some(retry_after),
                ..
            } => Some(retry_after.wait),
            _ => None,
        }
    }
}

/// A `Retry-After` header: as sent, and as a wait from when it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryAfter {
    pub header: String,
    pub wait: Duration,
}

fn reason_phrase(status: u16) -> String {
    StatusCode::from_u16(status)
        .ok()
        .and_then(|status| status.canonical_reason())
        .unwrap_or("")
        .to_owned()
}

/// `1.2s`: what a log line needs.
fn seconds(duration: &Duration) -> String {
    format!("{:.1}s", duration.as_secs_f64())
}

/// One attempt, as reported to [`Client::send_observed`]'s observer.
pub struct AttemptReport<'a> {
    /// 1 for the first attempt.
    pub number: u32,
    /// The final outcome, or why this attempt failed.
    pub result: Result<&'a Outcome, &'a AttemptError>,
    pub next: Next,
}

/// What follows an attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Next {
    /// The outcome is final.
    Done,
    /// Another attempt after this wait.
    RetryIn(Duration),
    /// No time left for another attempt within `max_time` (or the daemon advised a longer wait).
    GiveUp { max_time: Duration },
}

impl fmt::Display for AttemptReport<'_> {
    /// `attempt 3: 503 storage-unavailable; retrying in 1.2s (Retry-After: 1)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attempt {}: ", self.number)?;
        match self.result {
            Ok(Outcome::Created(written)) => {
                write!(f, "{} created, entry {}", written.status, written.entry.id)
            }
            Ok(Outcome::Replayed(written)) => write!(
                f,
                "{} replayed (Idempotency-Replayed: true), entry {}",
                written.status, written.entry.id
            ),
            Ok(Outcome::Refused { reason, .. }) => {
                write!(f, "{reason}; not retrying: the request must be fixed")
            }
            Ok(Outcome::GaveUp { .. }) => write!(f, "gave up"),
            Err(error) => {
                write!(f, "{error}")?;
                match self.next {
                    Next::RetryIn(wait) => write!(f, "; retrying in {}", seconds(&wait))?,
                    Next::GiveUp { max_time } => write!(
                        f,
                        "; giving up: no time left for another attempt within the time limit ({})",
                        humantime::format_duration(max_time)
                    )?,
                    Next::Done => {}
                }
                if let AttemptError::Status {
                    retry_after: Some(retry_after),
                    ..
                } = error
                {
                    write!(f, " (Retry-After: {})", retry_after.header)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use awc::http::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                header::HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        map
    }

    const ENTRY: &str = r#"{"created_at":"2026-01-31T00:00:00.000000Z","data":{},"id":"01a236a2-e78e-7258-b436-52ef1b1e7f31","kind":"k"}"#;

    #[test]
    fn answers_are_judged_by_status_and_problem_type() {
        let created = judge(StatusCode::CREATED, &headers(&[]), ENTRY.as_bytes());
        assert!(matches!(created, Ok(Outcome::Created(ref w)) if w.body == ENTRY));
        let replayed = judge(
            StatusCode::CREATED,
            &headers(&[("idempotency-replayed", "true")]),
            ENTRY.as_bytes(),
        );
        assert!(matches!(replayed, Ok(Outcome::Replayed(_))));

        let in_progress =
            br#"{"type":"/problems/request-in-progress","title":"t","status":409,"detail":"d"}"#;
        let error = judge(
            StatusCode::CONFLICT,
            &headers(&[("retry-after", "1")]),
            in_progress,
        )
        .unwrap_err();
        assert_eq!(error.retry_after(), Some(Duration::from_secs(1)));
        assert_eq!(error.to_string(), "409 request-in-progress");

        let reused = br#"{"type":"/problems/idempotency-key-reused","title":"t","status":409,"detail":"use a new key"}"#;
        match judge(StatusCode::CONFLICT, &headers(&[]), reused) {
            Ok(Outcome::Refused {
                status: 409,
                problem: Some(problem),
                reason,
            }) => {
                assert_eq!(problem.slug(), "idempotency-key-reused");
                assert_eq!(reason, "409 idempotency-key-reused: use a new key");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            judge(StatusCode::OK, &headers(&[]), b"<html>"),
            Ok(Outcome::Refused { status: 200, .. })
        ));
        assert!(matches!(
            judge(
                StatusCode::FOUND,
                &headers(&[("location", "/elsewhere")]),
                b""
            ),
            Ok(Outcome::Refused { status: 302, .. })
        ));
        let gateway = judge(StatusCode::BAD_GATEWAY, &headers(&[]), b"<html>").unwrap_err();
        assert_eq!(gateway.to_string(), "502 Bad Gateway");
    }

    #[test]
    fn a_report_line_names_the_outcome_and_the_wait() {
        let error = AttemptError::Status {
            status: 503,
            problem: Some(Box::new(ProblemDetails {
                problem_type: "/problems/storage-unavailable".into(),
                title: String::new(),
                detail: String::new(),
                errors: Vec::new(),
            })),
            retry_after: Some(RetryAfter {
                header: "1".into(),
                wait: Duration::from_secs(1),
            }),
        };
        let report = AttemptReport {
            number: 3,
            result: Err(&error),
            next: Next::RetryIn(Duration::from_millis(1234)),
        };
        assert_eq!(
            report.to_string(),
            "attempt 3: 503 storage-unavailable; retrying in 1.2s (Retry-After: 1)"
        );
    }
}
