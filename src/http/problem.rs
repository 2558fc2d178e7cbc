//! The closed set of errors the API answers with, and their one mapping to RFC 9457
//! `application/problem+json`.

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use crate::db::StorageError;
use crate::entry::{DecodeError, FieldError};
use crate::http::observe::Outcome;
use crate::idempotency::KeyError;

/// Every problem type is this prefix and a slug (`/problems/request-in-progress`).
pub const PROBLEM_TYPE_PREFIX: &str = "/problems/";

/// Seconds a client is told to wait before retrying a 503 or a 409 `request-in-progress`.
pub const RETRY_AFTER_SECONDS: u32 = 1;

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
    #[error("this Idempotency-Key was used with a different request")]
    IdempotencyKeyReused { status: StatusCode },
    #[error("a request with this Idempotency-Key is still being processed")]
    RequestInProgress,
    #[error("storage unavailable: {0}")]
    StorageUnavailable(String),
    /// Load shed before anything was sent to the database (pending writes over their bound,
    /// too many large bodies being decoded): answered as `storage-unavailable`, with its own
    /// detail, since nothing was written.
    #[error("overloaded: {0}")]
    Overloaded(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{detail}")]
    MethodNotAllowed {
        detail: String,
        /// The methods the resource answers, for the `Allow` header.
        allow: String,
    },
    #[error("internal error: {0:#}")]
    Internal(anyhow::Error),
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    problem_type: String,
    title: &'a str,
    status: u16,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    errors: Option<&'a [FieldError]>,
}

impl ApiError {
    /// The problem type's slug (`/problems/<slug>`) and title.
    pub fn slug_and_title(&self) -> (&'static str, &'static str) {
        match self {
            ApiError::Unauthorized => ("unauthorized", "Unauthorized"),
            ApiError::MissingIdempotencyKey => {
                ("missing-idempotency-key", "Missing Idempotency-Key")
            }
            ApiError::InvalidIdempotencyKey(_) => {
                ("invalid-idempotency-key", "Invalid Idempotency-Key")
            }
            ApiError::UnsupportedMediaType(_) => {
                ("unsupported-media-type", "Unsupported media type")
            }
            ApiError::PayloadTooLarge { .. } => ("payload-too-large", "Payload too large"),
            ApiError::RequestTimeout(_) => ("request-timeout", "Request timeout"),
            ApiError::MalformedJson(_) => ("malformed-json", "Malformed JSON"),
            ApiError::InvalidRequest(_) | ApiError::InvalidQuery(_) => {
                ("invalid-request", "Invalid request")
            }
            ApiError::IdempotencyKeyReused { .. } => {
                ("idempotency-key-reused", "Idempotency-Key reused")
            }
            ApiError::RequestInProgress => ("request-in-progress", "Request in progress"),
            ApiError::StorageUnavailable(_) | ApiError::Overloaded(_) => {
                ("storage-unavailable", "Storage unavailable")
            }
            ApiError::NotFound(_) => ("not-found", "Not found"),
            ApiError::MethodNotAllowed { .. } => ("method-not-allowed", "Method not allowed"),
            ApiError::Internal(_) => ("internal-error", "Internal server error"),
        }
    }

    fn outcome(&self) -> Outcome {
        match self {
            ApiError::Unauthorized => Outcome::Unauthorized,
            ApiError::IdempotencyKeyReused { .. } => Outcome::Conflict,
            ApiError::RequestInProgress => Outcome::InProgress,
            ApiError::StorageUnavailable(_) | ApiError::Overloaded(_) => Outcome::Unavailable,
            ApiError::NotFound(_) => Outcome::NotFound,
            ApiError::Internal(_) => Outcome::Error,
            ApiError::MissingIdempotencyKey
            | ApiError::InvalidIdempotencyKey(_)
            | ApiError::UnsupportedMediaType(_)
            | ApiError::PayloadTooLarge { .. }
            | ApiError::RequestTimeout(_)
            | ApiError::MalformedJson(_)
            | ApiError::InvalidRequest(_)
            | ApiError::InvalidQuery(_)
            | ApiError::MethodNotAllowed { .. } => Outcome::Invalid,
        }
    }

    /// What the client is told. An internal error says nothing of its cause (which is logged).
    fn detail(&self) -> String {
        match self {
            ApiError::StorageUnavailable(_) => {
                // Not "nothing was saved": when the connection fails during COMMIT the write may have
                // been saved. Retrying the same key is safe either way; a new key is not.
                "the database did not confirm the write; retry the request with the same Idempotency-Key: if the write was saved the retry returns its answer, otherwise it runs the write".into()
            }
            ApiError::IdempotencyKeyReused { .. } => {
                "this Idempotency-Key was already used with a different request (method, route or body); use a new key for a new request".into()
            }
            ApiError::RequestInProgress => {
                "a request with this Idempotency-Key is still being processed; retry after the time in Retry-After".into()
            }
            ApiError::Overloaded(reason) => format!(
                "{reason}; nothing was written for this request: retry it with the same Idempotency-Key after the time in Retry-After"
            ),
            ApiError::Internal(_) => "an unexpected error occurred; it has been logged".into(),
            other => other.to_string(),
        }
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

impl From<StorageError> for ApiError {
    fn from(error: StorageError) -> Self {
        match error {
            StorageError::Unavailable(reason)
            | StorageError::StatementTimeout(reason)
            | StorageError::Retryable(reason) => ApiError::StorageUnavailable(reason),
            StorageError::DataRejected(reason) => ApiError::Internal(anyhow::anyhow!(
                "the database rejected data that passed validation: {reason}"
            )),
            StorageError::Other(error) => ApiError::Internal(anyhow::anyhow!("{error:#}")),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::MissingIdempotencyKey
            | ApiError::InvalidIdempotencyKey(_)
            | ApiError::MalformedJson(_)
            | ApiError::InvalidRequest(_)
            | ApiError::InvalidQuery(_) => StatusCode::BAD_REQUEST,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::IdempotencyKeyReused { status } => *status,
            ApiError::RequestInProgress => StatusCode::CONFLICT,
            ApiError::StorageUnavailable(_) | ApiError::Overloaded(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        let outcome = self.outcome();
        match self {
            ApiError::Internal(error) => {
                tracing::error!(error = format!("{error:#}"), "internal error")
            }
            ApiError::StorageUnavailable(reason) => {
                tracing::warn!(reason = %reason, "storage unavailable")
            }
            ApiError::Overloaded(reason) => tracing::warn!(reason = %reason, "load shed"),
            _ => {}
        }
        let (slug, title) = self.slug_and_title();
        let errors = match self {
            ApiError::InvalidRequest(errors) => Some(errors.as_slice()),
            _ => None,
        };
        let problem = Problem {
            problem_type: format!("{PROBLEM_TYPE_PREFIX}{slug}"),
            title,
            status: status.as_u16(),
            detail: self.detail(),
            errors,
        };
        let mut response = HttpResponse::build(status);
        response.content_type("application/problem+json");
        if matches!(
            self,
            ApiError::StorageUnavailable(_) | ApiError::Overloaded(_) | ApiError::RequestInProgress
        ) {
            response.insert_header((header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS)));
        }
        if matches!(self, ApiError::Unauthorized) {
            response.insert_header((header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer")));
        }
        if let ApiError::MethodNotAllowed { allow, .. } = self {
            if let Ok(allow) = HeaderValue::from_str(allow) {
                response.insert_header((header::ALLOW, allow));
            }
        }
        let mut response = response.json(problem);
        response.extensions_mut().insert(outcome);
        response
    }
}
