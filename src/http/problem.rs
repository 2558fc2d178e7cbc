//! The closed set of errors the API answers with, and their one mapping to RFC 9457
//! `application/problem+json`.
//!
//! Every problem type is one [`ProblemType`] in [`ALL`]: its status, slug, title, how the
//! request is counted in the metrics, whether the client is told when to retry, the other header
//! fields it carries, and what it means in one sentence. The responses, the OpenAPI description
//! (each route's problem responses, made in [`crate::http::openapi`], and the enum of types) and
//! the tests' list are all derived from that table. [`ApiError`] says which type an error is,
//! once, and what its detail says.

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use crate::db::{Blocker, StorageError};
use crate::entry::{DecodeError, FieldError};
use crate::http::limits::RateLimited;
use crate::http::observe::RequestOutcome;
use crate::idempotency::KeyError;
use crate::write::WriteError;

/// Every problem type is this prefix and a slug (`/problems/request-in-progress`).
pub const PROBLEM_TYPE_PREFIX: &str = "/problems/";

/// Seconds a client is told to wait before retrying a 503 or a 409 `request-in-progress`.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// The fields of draft-ietf-httpapi-ratelimit-headers on a 429: the client's limits, and what is
/// left of the one that refused.
const RATELIMIT_POLICY: header::HeaderName = header::HeaderName::from_static("ratelimit-policy");
const RATELIMIT: header::HeaderName = header::HeaderName::from_static("ratelimit");

/// One problem type: what the API answers for one kind of error.
#[derive(Debug, PartialEq, Eq)]
pub struct ProblemType {
    pub status: StatusCode,
    /// The status answered instead when the configuration asks for it (`description` says
    /// which setting).
    pub configured_status: Option<StatusCode>,
    pub slug: &'static str,
    pub title: &'static str,
    /// How the request is counted in `retrysafe_http_requests_total`.
    pub outcome: RequestOutcome,
    /// Whether the answer carries `Retry-After` (the same request will do, later).
    pub retry_after: bool,
    /// The header fields it carries besides `Retry-After`, each with what it says: the
    /// OpenAPI description documents them, and a test checks that the answers carry exactly
    /// these.
    pub headers: &'static [(&'static str, &'static str)],
    /// When it is answered and what the client should know (whether anything was written,
    /// which setting sets a limit), in one sentence: what the OpenAPI description says of it on
    /// every route that answers it.
    pub description: &'static str,
}

impl ProblemType {
    /// The `type` member: `/problems/<slug>`.
    pub fn type_uri(&self) -> String {
        format!("{PROBLEM_TYPE_PREFIX}{}", self.slug)
    }

    /// Every status it may be answered with.
    pub fn statuses(&self) -> impl Iterator<Item = StatusCode> {
        std::iter::once(self.status).chain(self.configured_status)
    }

    const fn with_headers(self, headers: &'static [(&'static str, &'static str)]) -> Self {
        ProblemType { headers, ..self }
    }

    const fn or_when_configured(self, status: StatusCode) -> Self {
        ProblemType {
            configured_status: Some(status),
            ..self
        }
    }
}

const fn problem(
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
    outcome: RequestOutcome,
    retry_after: bool,
    description: &'static str,
) -> ProblemType {
    ProblemType {
        status,
        configured_status: None,
        slug,
        title,
        outcome,
        retry_after,
        headers: &[],
        description,
    }
}

pub const UNAUTHORIZED: ProblemType = problem(
    StatusCode::UNAUTHORIZED,
    "unauthorized",
    "Unauthorized",
    RequestOutcome::Unauthorized,
    false,
    "no bearer token, or one that no configured client has; nothing was done",
)
.with_headers(&[("WWW-Authenticate", "`Bearer`: the scheme the API takes")]);
pub const MISSING_IDEMPOTENCY_KEY: ProblemType = problem(
    StatusCode::BAD_REQUEST,
    "missing-idempotency-key",
    "Missing Idempotency-Key",
    RequestOutcome::Invalid,
    false,
    "a write without an Idempotency-Key header; nothing was written",
);
pub const INVALID_IDEMPOTENCY_KEY: ProblemType = problem(
    StatusCode::BAD_REQUEST,
    "invalid-idempotency-key",
    "Invalid Idempotency-Key",
    RequestOutcome::Invalid,
    false,
    "the key is not 1 to 255 visible ASCII characters, nor (in the header) a structured-field string of them; nothing was done",
);
pub const UNSUPPORTED_MEDIA_TYPE: ProblemType = problem(
    StatusCode::UNSUPPORTED_MEDIA_TYPE,
    "unsupported-media-type",
    "Unsupported media type",
    RequestOutcome::Invalid,
    false,
    "Content-Type is not application/json, or the body is compressed; nothing was written",
);
pub const PAYLOAD_TOO_LARGE: ProblemType = problem(
    StatusCode::PAYLOAD_TOO_LARGE,
    "payload-too-large",
    "Payload too large",
    RequestOutcome::Invalid,
    false,
    "the body is over `http.max_body_bytes`; nothing was written",
);
pub const REQUEST_TIMEOUT: ProblemType = problem(
    StatusCode::REQUEST_TIMEOUT,
    "request-timeout",
    "Request timeout",
    RequestOutcome::Invalid,
    false,
    "the body did not arrive within `http.body_timeout`; nothing was written",
);
pub const MALFORMED_JSON: ProblemType = problem(
    StatusCode::BAD_REQUEST,
    "malformed-json",
    "Malformed JSON",
    RequestOutcome::Invalid,
    false,
    "the body is not JSON; nothing was written",
);
pub const INVALID_REQUEST: ProblemType = problem(
    StatusCode::BAD_REQUEST,
    "invalid-request",
    "Invalid request",
    RequestOutcome::Invalid,
    false,
    "the body or the query is not one the route takes (the detail, or for a body `errors`, says what is wrong); nothing was done",
);
pub const IDEMPOTENCY_KEY_REUSED: ProblemType = problem(
    StatusCode::CONFLICT,
    "idempotency-key-reused",
    "Idempotency-Key reused",
    RequestOutcome::Conflict,
    false,
    "the key was used with a different request (method, route or body); answered with 422 instead of 409 when `idempotency.mismatch_status = 422`",
)
.or_when_configured(StatusCode::UNPROCESSABLE_ENTITY);
pub const REQUEST_IN_PROGRESS: ProblemType = problem(
    StatusCode::CONFLICT,
    "request-in-progress",
    "Request in progress",
    RequestOutcome::InProgress,
    true,
    "a request with this key is still in flight past `idempotency.wait_timeout`; retry after the time in `Retry-After`",
);
pub const RATE_LIMITED: ProblemType = problem(
    StatusCode::TOO_MANY_REQUESTS,
    "rate-limited",
    "Too many requests",
    RequestOutcome::RateLimited,
    true,
    "past one of the client's limits, `max_concurrent_writes` (writes) or `max_requests_per_second`; nothing was done: retry after the time in `Retry-After`",
)
.with_headers(&[
    ("RateLimit-Policy", "The client's limits (draft-ietf-httpapi-ratelimit-headers)"),
    ("RateLimit", "What is left of the limit that refused"),
]);
pub const STORAGE_UNAVAILABLE: ProblemType = problem(
    StatusCode::SERVICE_UNAVAILABLE,
    "storage-unavailable",
    "Storage unavailable",
    RequestOutcome::Unavailable,
    true,
    "the database is unreachable, did not answer in time or takes no writes until an operator acts, or the daemon shed load (writers saturated, too many listings or admin requests at once); retry with the same key after the time in `Retry-After`: a write whose commit was not confirmed is then replayed, any other runs afresh",
);
pub const NOT_FOUND: ProblemType = problem(
    StatusCode::NOT_FOUND,
    "not-found",
    "Not found",
    RequestOutcome::NotFound,
    false,
    "no such route, entry or key for this client (a key is unknown or expired)",
);
pub const METHOD_NOT_ALLOWED: ProblemType = problem(
    StatusCode::METHOD_NOT_ALLOWED,
    "method-not-allowed",
    "Method not allowed",
    RequestOutcome::Invalid,
    false,
    "the method is not one of this path's; `Allow` lists them",
)
.with_headers(&[("Allow", "The methods the path answers")]);
/// Anonymous mode only: a `Host` that is not a loopback host (see [`crate::http::host`]).
pub const MISDIRECTED_REQUEST: ProblemType = problem(
    StatusCode::MISDIRECTED_REQUEST,
    "misdirected-request",
    "Misdirected request",
    RequestOutcome::Invalid,
    false,
    "the `Host` header, or the request target, names a host other than localhost, 127.0.0.0/8 or [::1]: without clients configured the daemon answers only requests to a loopback host",
);
/// The admin listener's own: a console POST without its session's CSRF token, or sent from
/// another origin. Not in [`ALL`], the API's table: the API never answers it.
pub const FORBIDDEN: ProblemType = problem(
    StatusCode::FORBIDDEN,
    "forbidden",
    "Forbidden",
    RequestOutcome::Unauthorized,
    false,
    "a console form sent without the session's CSRF token, or from another origin; nothing was done",
);
pub const INTERNAL_ERROR: ProblemType = problem(
    StatusCode::INTERNAL_SERVER_ERROR,
    "internal-error",
    "Internal server error",
    RequestOutcome::Error,
    false,
    "an unexpected error; its cause is logged",
);

/// Every problem type the API answers with.
pub const ALL: [&ProblemType; 16] = [
    &UNAUTHORIZED,
    &MISSING_IDEMPOTENCY_KEY,
    &INVALID_IDEMPOTENCY_KEY,
    &UNSUPPORTED_MEDIA_TYPE,
    &PAYLOAD_TOO_LARGE,
    &REQUEST_TIMEOUT,
    &MALFORMED_JSON,
    &INVALID_REQUEST,
    &IDEMPOTENCY_KEY_REUSED,
    &REQUEST_IN_PROGRESS,
    &RATE_LIMITED,
    &STORAGE_UNAVAILABLE,
    &NOT_FOUND,
    &METHOD_NOT_ALLOWED,
    &MISDIRECTED_REQUEST,
    &INTERNAL_ERROR,
];

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("missing or invalid credentials")]
    Unauthorized,
    #[error("the Idempotency-Key header is required")]
    MissingIdempotencyKey,
    #[error("invalid Idempotency-Key: {0}")]
    InvalidIdempotencyKey(KeyError),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("the body did not arrive within {0:?}")]
    RequestTimeout(std::time::Duration),
    #[error("the body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("{0}")]
    MalformedJson(String),
    #[error("the request body is not a valid entry")]
    InvalidRequest(Vec<FieldError>),
    /// Query parameters that are unknown, repeated or invalid; the text names each.
    #[error("invalid query parameters: {0}")]
    InvalidQuery(String),
    /// An admin action's selector that cannot be acted on; the text says why.
    #[error("invalid selector: {0}")]
    InvalidSelector(String),
    #[error("this Idempotency-Key was used with a different request")]
    IdempotencyKeyReused { status: StatusCode },
    #[error("a request with this Idempotency-Key is still being processed")]
    RequestInProgress,
    /// Past one of the client's limits; nothing was done.
    #[error("rate limited: {}", .0.limit.as_str())]
    RateLimited(RateLimited),
    /// A write whose outcome the database did not confirm: it may have been saved.
    #[error("write not confirmed: {0}")]
    WriteNotConfirmed(String),
    /// A read or a probe the database could not answer.
    #[error("storage unavailable: {0}")]
    StorageUnavailable(String),
    /// The database takes no writes until an operator acts (disk full, read-only, no free
    /// connection): certain, nothing was written.
    #[error("storage unavailable: {reason}")]
    CannotWrite { blocker: Blocker, reason: String },
    /// Load shed before anything was sent to the database (pending writes over their bound,
    /// writers saturated, too many large bodies being decoded): nothing was written.
    #[error("overloaded: {0}")]
    Overloaded(String),
    /// A read shed before it ran (too many listings, or admin requests, at once): nothing to
    /// retry but the request.
    #[error("busy: {0}")]
    Busy(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{detail}")]
    MethodNotAllowed {
        detail: String,
        /// The methods the resource answers, for the `Allow` header.
        allow: String,
    },
    /// The admin listener: a console POST without its session's CSRF token, or from another
    /// origin; the text says which.
    #[error("{0}")]
    Forbidden(String),
    /// Anonymous mode: the request does not name a loopback host; the text says what it named.
    #[error("{0}")]
    MisdirectedRequest(String),
    #[error("internal error: {0:#}")]
    Internal(anyhow::Error),
}

/// An RFC 9457 problem (`application/problem+json`), as the API sends it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Problem<'a> {
    /// `/problems/<slug>`.
    #[serde(rename = "type")]
    #[schema(schema_with = problem_types)]
    pub problem_type: String,
    pub title: &'a str,
    pub status: u16,
    pub detail: String,
    /// Present for `invalid-request` about a body: one item per offending field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<&'a [FieldError]>,
}

/// The schema of `type`: one of [`ALL`].
fn problem_types() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(ALL.iter().map(|problem| problem.type_uri())))
        .build()
}

impl ApiError {
    /// Which problem type this error is answered with.
    pub fn problem_type(&self) -> &'static ProblemType {
        match self {
            ApiError::Unauthorized => &UNAUTHORIZED,
            ApiError::MissingIdempotencyKey => &MISSING_IDEMPOTENCY_KEY,
            ApiError::InvalidIdempotencyKey(_) => &INVALID_IDEMPOTENCY_KEY,
            ApiError::UnsupportedMediaType(_) => &UNSUPPORTED_MEDIA_TYPE,
            ApiError::PayloadTooLarge { .. } => &PAYLOAD_TOO_LARGE,
            ApiError::RequestTimeout(_) => &REQUEST_TIMEOUT,
            ApiError::MalformedJson(_) => &MALFORMED_JSON,
            ApiError::InvalidRequest(_)
            | ApiError::InvalidQuery(_)
            | ApiError::InvalidSelector(_) => &INVALID_REQUEST,
            ApiError::IdempotencyKeyReused { .. } => &IDEMPOTENCY_KEY_REUSED,
            ApiError::RequestInProgress => &REQUEST_IN_PROGRESS,
            ApiError::RateLimited(_) => &RATE_LIMITED,
            ApiError::WriteNotConfirmed(_)
            | ApiError::StorageUnavailable(_)
            | ApiError::CannotWrite { .. }
            | ApiError::Overloaded(_)
            | ApiError::Busy(_) => &STORAGE_UNAVAILABLE,
            ApiError::NotFound(_) => &NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => &METHOD_NOT_ALLOWED,
            ApiError::MisdirectedRequest(_) => &MISDIRECTED_REQUEST,
            ApiError::Forbidden(_) => &FORBIDDEN,
            ApiError::Internal(_) => &INTERNAL_ERROR,
        }
    }

    /// What the client is told. An internal error says nothing of its cause (which is logged).
    fn detail(&self) -> String {
        match self {
            ApiError::WriteNotConfirmed(_) => {
                // Not "nothing was saved": when the connection fails during COMMIT the write may have
                // been saved. Retrying the same key is safe either way; a new key is not.
                "the database did not confirm the write; retry the request with the same Idempotency-Key: if the write was saved the retry returns its answer, otherwise it runs the write".into()
            }
            ApiError::StorageUnavailable(_) => {
                "the database is unavailable; retry after the time in Retry-After".into()
            }
            ApiError::CannotWrite { blocker, .. } => format!(
                "{}, so nothing was written for this request; an operator must {}; retry after the time in Retry-After (a write with the same Idempotency-Key)",
                blocker.describe(),
                blocker.remedy()
            ),
            ApiError::Busy(reason) => {
                format!("{reason}; retry after the time in Retry-After")
            }
            ApiError::Overloaded(reason) => format!(
                "{reason}; nothing was written for this request: retry it with the same Idempotency-Key after the time in Retry-After"
            ),
            ApiError::IdempotencyKeyReused { .. } => {
                "this Idempotency-Key was already used with a different request (method, route or body); use a new key for a new request".into()
            }
            ApiError::RequestInProgress => {
                "a request with this Idempotency-Key is still being processed; retry after the time in Retry-After".into()
            }
            ApiError::RateLimited(limited) => match limited.limit {
                crate::http::limits::Limit::ConcurrentWrites => "this client has as many writes in flight as its max_concurrent_writes allows; nothing was done for this request: retry it (with the same Idempotency-Key) after the time in Retry-After",
                crate::http::limits::Limit::RequestsPerSecond => "this client sent more requests than its max_requests_per_second allows; nothing was done for this request: retry it (with the same Idempotency-Key for a write) after the time in Retry-After",
            }
            .into(),
            ApiError::Internal(_) => "an unexpected error occurred; it has been logged".into(),
            other => other.to_string(),
        }
    }

    /// Logs what an operator may need to know: the cause of a 500, and why storage failed.
    fn log(&self) {
        match self {
            ApiError::Internal(error) => {
                tracing::error!(error = format!("{error:#}"), "internal error")
            }
            ApiError::WriteNotConfirmed(reason)
            | ApiError::StorageUnavailable(reason)
            | ApiError::CannotWrite { reason, .. } => {
                tracing::warn!(reason = %reason, "storage unavailable")
            }
            ApiError::Overloaded(reason) | ApiError::Busy(reason) => {
                tracing::warn!(reason = %reason, "load shed")
            }
            _ => {}
        }
    }
}

impl From<RateLimited> for ApiError {
    fn from(limited: RateLimited) -> Self {
        ApiError::RateLimited(limited)
    }
}

impl From<DecodeError> for ApiError {
    fn from(error: DecodeError) -> Self {
        match error {
            DecodeError::Malformed(detail) => ApiError::MalformedJson(detail),
            DecodeError::Invalid(errors) => ApiError::InvalidRequest(errors),
        }
    }
}

/// A read or a probe that failed in the database.
impl From<StorageError> for ApiError {
    fn from(error: StorageError) -> Self {
        match error {
            StorageError::Unavailable(reason)
            | StorageError::StatementTimeout(reason)
            | StorageError::Retryable(reason) => ApiError::StorageUnavailable(reason),
            StorageError::CannotWrite(blocker, reason) => ApiError::CannotWrite { blocker, reason },
            StorageError::DataRejected(reason) => ApiError::Internal(anyhow::anyhow!(
                "the database rejected data that passed validation: {reason}"
            )),
            StorageError::Other(error) => ApiError::Internal(anyhow::anyhow!("{error:#}")),
        }
    }
}

/// A write with no answer from its record.
impl From<WriteError> for ApiError {
    fn from(error: WriteError) -> Self {
        match error {
            // A bug, or a database in a state the daemon does not expect: a 500, logged.
            WriteError::Storage(
                storage @ (StorageError::DataRejected(_) | StorageError::Other(_)),
            ) => storage.into(),
            WriteError::Overloaded(reason) => ApiError::Overloaded(reason.to_owned()),
            WriteError::Storage(storage @ StorageError::CannotWrite(..)) => storage.into(),
            other => ApiError::WriteNotConfirmed(other.to_string()),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::IdempotencyKeyReused { status } => *status,
            other => other.problem_type().status,
        }
    }

    fn error_response(&self) -> HttpResponse {
        self.log();
        let problem_type = self.problem_type();
        let status = self.status_code();
        let problem = Problem {
            problem_type: problem_type.type_uri(),
            title: problem_type.title,
            status: status.as_u16(),
            detail: self.detail(),
            errors: match self {
                ApiError::InvalidRequest(errors) => Some(errors.as_slice()),
                _ => None,
            },
        };
        let mut response = HttpResponse::build(status);
        response.content_type("application/problem+json");
        if problem_type.retry_after {
            let seconds = match self {
                ApiError::RateLimited(limited) => limited.retry_after.as_secs(),
                _ => u64::from(RETRY_AFTER_SECONDS),
            };
            response.insert_header((header::RETRY_AFTER, HeaderValue::from(seconds)));
        }
        match self {
            ApiError::RateLimited(limited) => {
                for (name, value) in [
                    (RATELIMIT_POLICY, &limited.policy),
                    (RATELIMIT, &limited.state),
                ] {
                    if let Ok(value) = HeaderValue::from_str(value) {
                        response.insert_header((name, value));
                    }
                }
            }
            ApiError::Unauthorized => {
                response
                    .insert_header((header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer")));
            }
            ApiError::MethodNotAllowed { allow, .. } => {
                if let Ok(allow) = HeaderValue::from_str(allow) {
                    response.insert_header((header::ALLOW, allow));
                }
            }
            _ => {}
        }
        let mut response = response.json(problem);
        response.extensions_mut().insert(problem_type.outcome);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_type_has_its_own_slug_a_title_and_a_description() {
        let mut slugs: Vec<&str> = ALL.iter().map(|problem| problem.slug).collect();
        slugs.sort_unstable();
        slugs.dedup();
        assert_eq!(slugs.len(), ALL.len());
        assert!(ALL.iter().all(|problem| !problem.title.is_empty()));
        assert!(ALL.iter().all(|problem| !problem.description.is_empty()));
    }

    /// An error of each problem type, as the handlers make them, and the reused key under
    /// `idempotency.mismatch_status = 422`.
    fn one_of_each() -> Vec<ApiError> {
        use crate::http::limits::Limit;
        use std::time::Duration;
        vec![
            ApiError::Unauthorized,
            ApiError::MissingIdempotencyKey,
            ApiError::InvalidIdempotencyKey(KeyError::Empty),
            ApiError::UnsupportedMediaType("text/plain".into()),
            ApiError::PayloadTooLarge { limit: 1 },
            ApiError::RequestTimeout(Duration::from_secs(1)),
            ApiError::MalformedJson("not JSON".into()),
            ApiError::InvalidRequest(Vec::new()),
            ApiError::IdempotencyKeyReused {
                status: StatusCode::CONFLICT,
            },
            ApiError::IdempotencyKeyReused {
                status: StatusCode::UNPROCESSABLE_ENTITY,
            },
            ApiError::RequestInProgress,
            ApiError::RateLimited(RateLimited {
                limit: Limit::RequestsPerSecond,
                retry_after: Duration::from_secs(1),
                policy: "\"rps\";q=10;w=1".into(),
                state: "\"rps\";r=0;t=1".into(),
            }),
            ApiError::StorageUnavailable("down".into()),
            ApiError::NotFound("no entry".into()),
            ApiError::MethodNotAllowed {
                detail: "PUT is not allowed".into(),
                allow: "GET, HEAD".into(),
            },
            ApiError::MisdirectedRequest("example.com".into()),
            ApiError::Internal(anyhow::anyhow!("a bug")),
        ]
    }

    /// The table's statuses and header fields are what the OpenAPI description shows: they
    /// must be what the answers carry.
    #[test]
    fn every_answer_has_a_status_and_the_header_fields_its_problem_type_documents() {
        let errors = one_of_each();
        for problem in ALL {
            assert!(
                errors.iter().any(|error| error.problem_type() == problem),
                "no example of {}",
                problem.slug
            );
        }
        for error in errors {
            let problem = error.problem_type();
            let response = error.error_response();
            assert!(
                problem.statuses().any(|status| status == response.status()),
                "{}: {}",
                problem.slug,
                response.status()
            );
            let mut documented: Vec<String> = problem
                .headers
                .iter()
                .map(|(name, _)| name.to_ascii_lowercase())
                .collect();
            if problem.retry_after {
                documented.push("retry-after".into());
            }
            let mut sent: Vec<String> = response
                .headers()
                .keys()
                .map(|name| name.as_str().to_owned())
                .filter(|name| name != "content-type")
                .collect();
            documented.sort_unstable();
            sent.sort_unstable();
            assert_eq!(sent, documented, "{}", problem.slug);
        }
    }
}
