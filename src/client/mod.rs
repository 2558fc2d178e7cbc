//! The caller's side: one write, one stable `Idempotency-Key`, the same key and body on every
//! attempt, and retries only where they can help. `retrysafe send` is a thin shell over it.
//!
//! - [`request`]: the key (given, or derived from an intent with [`key_for_intent`]) and the
//!   body, both fixed before the first attempt and checked as the daemon checks them.
//! - [`policy`]: [`RetryPolicy`], a value the caller may change; which answers are retried
//!   ([`is_retryable`]: connection errors, timeouts, 408, 409 `request-in-progress`, 429, 5xx);
//!   full-jitter backoff with `Retry-After` as a floor.
//! - [`Client::send`]: the loop, ending in an [`Outcome`]: created, replayed, refused (a 4xx
//!   that needs a different request), or gave up (transient failures until
//!   [`RetryPolicy::max_time`]; trying again later with the same key is safe).
//!
//! The HTTP client is awc, actix-web's own: it is compiled into the daemon already, speaks
//! HTTP/1.1 and HTTP/2, and does TLS with rustls 0.23 on the ring provider, the project's one TLS
//! stack. Its futures are not `Send`: run [`Client::send`] on an actix system
//! (`#[actix_web::main]`, `actix_web::rt::System::new().block_on(...)`) or in a
//! `tokio::task::LocalSet`.
//!
//! ```no_run
//! use std::time::Duration;
//! use retrysafe::client::{key_for_intent, Client, EntryRequest, Outcome, RetryPolicy};
//!
//! # async fn job() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::builder("http://127.0.0.1:8080")
//!     .token(std::env::var("RETRYSAFE_TOKEN")?)
//!     .policy(RetryPolicy { max_time: Duration::from_secs(60), ..RetryPolicy::default() })
//!     .build()?;
//! let key = key_for_intent("nightly-invoices:2026-01-31")?;
//! let request = EntryRequest::from_json_text(key, "report.requested", r#"{"report": "invoices"}"#)?;
//! match client.send(&request).await {
//!     Outcome::Created(written) | Outcome::Replayed(written) => println!("{}", written.entry.id),
//!     Outcome::Refused { reason, .. } => eprintln!("the request must be fixed: {reason}"),
//!     Outcome::GaveUp { last_error, .. } => eprintln!("try later with the same key: {last_error}"),
//! }
//! # Ok(()) }
//! ```

mod answer;
pub mod policy;
pub mod request;
mod tls;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use awc::http::header::{self, HeaderValue};
use awc::http::Uri;

use answer::judge;
pub use answer::{AttemptError, AttemptReport, Next, Outcome, ProblemDetails, RetryAfter, Written};
pub use policy::{is_retryable, parse_retry_after, RetryPolicy};
pub use request::{key_as_given, key_for_intent, EntryRequest, RequestError, INTENT_KEY_PREFIX};

use crate::entry::ENTRIES_ROUTE;
use crate::http::entries::IDEMPOTENCY_KEY;

/// Largest answer read. An entry is about the size of the request (at most `http.max_body_bytes`,
/// 64 KiB by default); this leaves room for a daemon configured with a larger limit.
const MAX_ANSWER_BYTES: usize = 4 << 20;

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: &'static str },
    #[error("invalid token: {0}")]
    InvalidToken(&'static str),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("invalid retry policy: {0}")]
    InvalidPolicy(&'static str),
}

/// Builds a [`Client`] for a daemon's base URL (`http://host:port`, or `https://` with a path
/// prefix when it sits behind a reverse proxy).
pub struct ClientBuilder {
    base_url: String,
    token: Option<String>,
    ca_file: Option<PathBuf>,
    policy: RetryPolicy,
}

impl ClientBuilder {
    /// The bearer token; without one, requests carry no credentials (the daemon's `anonymous`
    /// client, on loopback only).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// A PEM bundle of CA certificates trusted besides the platform's, for a private CA. Used
    /// only with an `https://` URL.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    pub fn build(self) -> Result<Client, ClientError> {
        if self.policy.max_time.is_zero() {
            return Err(ClientError::InvalidPolicy("max_time must be more than 0"));
        }
        if self.policy.attempt_timeout.is_zero() {
            return Err(ClientError::InvalidPolicy(
                "attempt_timeout must be more than 0",
            ));
        }
        let (entries_url, https) = entries_url(&self.base_url)?;
        let authorization = self.token.as_deref().map(bearer).transpose()?;
        let mut connector = awc::Connector::new()
            .timeout(self.policy.attempt_timeout)
            .handshake_timeout(self.policy.attempt_timeout);
        if https {
            connector = connector.rustls_0_23(tls::client_config(self.ca_file.as_deref())?);
        }
        let http = awc::Client::builder()
            .connector(connector)
            // Each attempt is bounded as a whole (connect, send, read) by `attempt`.
            .disable_timeout()
            // A redirected POST comes back as a GET: refuse it instead (see `is_retryable`).
            .disable_redirects()
            .add_default_header((
                header::USER_AGENT,
                concat!("retrysafe/", env!("CARGO_PKG_VERSION")),
            ))
            .finish();
        Ok(Client {
            http,
            entries_url,
            authorization,
            policy: self.policy,
        })
    }
}

/// `<base>/v1/entries`, and whether it needs TLS.
fn entries_url(base_url: &str) -> Result<(String, bool), ClientError> {
    let invalid = |reason| ClientError::InvalidUrl {
        url: base_url.to_owned(),
        reason,
    };
    let uri: Uri = base_url
        .parse()
        .map_err(|_| invalid("not a URL; give e.g. http://127.0.0.1:8080"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(invalid("the scheme must be http or https")),
    };
    let authority = uri.authority().ok_or_else(|| invalid("no host"))?;
    if uri.query().is_some() {
        return Err(invalid("the daemon's base URL has no query"));
    }
    let prefix = uri.path().trim_end_matches('/');
    let scheme = if https { "https" } else { "http" };
    Ok((
        format!("{scheme}://{authority}{prefix}{ENTRIES_ROUTE}"),
        https,
    ))
}

/// `Authorization: Bearer <token>`, marked sensitive so that no debug output shows it.
fn bearer(token: &str) -> Result<HeaderValue, ClientError> {
    let token = token.trim();
    if token.is_empty() {
        return Err(ClientError::InvalidToken("it is empty"));
    }
    if !token.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(ClientError::InvalidToken(
            "it may contain only visible ASCII characters",
        ));
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
        .expect("visible ASCII is a valid header value");
    value.set_sensitive(true);
    Ok(value)
}

/// Sends writes to one daemon, retrying each by its [`RetryPolicy`]. Not `Send` (see the module
/// documentation).
pub struct Client {
    http: awc::Client,
    entries_url: String,
    authorization: Option<HeaderValue>,
    policy: RetryPolicy,
}

impl Client {
    pub fn builder(base_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.into(),
            token: None,
            ca_file: None,
            policy: RetryPolicy::default(),
        }
    }

    /// Where writes go: `<base URL>/v1/entries`.
    pub fn entries_url(&self) -> &str {
        &self.entries_url
    }

    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Whether requests carry a bearer token.
    pub fn has_token(&self) -> bool {
        self.authorization.is_some()
    }

    /// Sends `request` until it is answered for good or the policy's time is up, logging each
    /// attempt with `tracing`.
    pub async fn send(&self, request: &EntryRequest) -> Outcome {
        let key = request.key();
        self.send_observed(request, |report| match report.next {
            Next::Done => tracing::info!(key = %key, attempt = report.number, outcome = %report, "write answered"),
            Next::RetryIn(_) | Next::GiveUp { .. } => {
                tracing::warn!(key = %key, attempt = report.number, outcome = %report, "write attempt failed")
            }
        })
        .await
    }

    /// As [`Client::send`], calling `observe` after every attempt instead of logging.
    pub async fn send_observed(
        &self,
        request: &EntryRequest,
        mut observe: impl FnMut(&AttemptReport<'_>),
    ) -> Outcome {
        let started = Instant::now();
        let deadline = started + self.policy.max_time;
        let mut number = 0;
        loop {
            number += 1;
            let limit = self
                .policy
                .attempt_timeout
                .min(deadline.saturating_duration_since(Instant::now()));
            let error = match self.attempt(request, limit).await {
                Ok(outcome) => {
                    observe(&AttemptReport {
                        number,
                        result: Ok(&outcome),
                        next: Next::Done,
                    });
                    return outcome;
                }
                Err(error) => error,
            };
            let time_left = deadline.saturating_duration_since(Instant::now());
            let Some(wait) = self
                .policy
                .wait_before_retry(number, error.retry_after(), time_left)
            else {
                observe(&AttemptReport {
                    number,
                    result: Err(&error),
                    next: Next::GiveUp {
                        max_time: self.policy.max_time,
                    },
                });
                return Outcome::GaveUp {
                    attempts: number,
                    elapsed: started.elapsed(),
                    last_error: error,
                };
            };
            observe(&AttemptReport {
                number,
                result: Err(&error),
                next: Next::RetryIn(wait),
            });
            tokio::time::sleep(wait).await;
        }
    }

    /// One request and its whole answer, within `limit`.
    async fn attempt(
        &self,
        request: &EntryRequest,
        limit: Duration,
    ) -> Result<Outcome, AttemptError> {
        let exchange = async {
            let mut http_request = self
                .http
                .post(&self.entries_url)
                .insert_header((IDEMPOTENCY_KEY, request.key().as_str()))
                .insert_header((header::CONTENT_TYPE, "application/json"));
            if let Some(authorization) = &self.authorization {
                http_request =
                    http_request.insert_header((header::AUTHORIZATION, authorization.clone()));
            }
            let mut response = http_request
                .send_body(request.body().clone())
                .await
                .map_err(|error| AttemptError::Transport(error.to_string()))?;
            let body = response
                .body()
                .limit(MAX_ANSWER_BYTES)
                .await
                .map_err(|error| AttemptError::Transport(error.to_string()))?;
            Ok((response.status(), response.headers().clone(), body))
        };
        let (status, headers, body) = tokio::time::timeout(limit, exchange)
            .await
            .map_err(|_elapsed| AttemptError::TimedOut(limit))??;
        judge(status, &headers, &body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_url_gives_the_entries_url() {
        for (base, expected) in [
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080/v1/entries"),
            ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/v1/entries"),
            (
                "https://api.example/retrysafe/",
                "https://api.example/retrysafe/v1/entries",
            ),
        ] {
            assert_eq!(entries_url(base).unwrap().0, expected);
        }
        assert!(entries_url("https://api.example").unwrap().1);
        for bad in [
            "127.0.0.1:8080",
            "ftp://host",
            "http://host/?a=1",
            "",
            "http://",
        ] {
            assert!(entries_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_token_is_checked_and_hidden() {
        let value = bearer(" rs_abc\n").unwrap();
        assert_eq!(value.to_str().unwrap(), "Bearer rs_abc");
        assert!(value.is_sensitive());
        assert!(format!("{value:?}").contains("Sensitive"));
        assert!(bearer("  ").is_err());
        assert!(bearer("a b").is_err());
    }
}
