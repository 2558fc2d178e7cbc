//! `GET /openapi.json`: the OpenAPI 3.1 description, generated from the handlers' annotations.

use actix_web::HttpResponse;
use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::entry::{EntryView, FieldError};
use crate::http::{entries, health, keys, observe};

/// Body of `POST /v1/entries`. Unknown fields are refused.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct NewEntryRequest {
    /// 1 to 64 of `a-z 0-9 . _ -`.
    #[schema(pattern = "^[a-z0-9._-]{1,64}$", example = "invoice.paid")]
    kind: String,
    /// Any JSON object; strings and member names may not contain U+0000.
    #[schema(value_type = Object)]
    data: Map<String, Value>,
}

/// Every problem type the API answers with (`/problems/<slug>`).
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub enum ProblemType {
    #[serde(rename = "/problems/unauthorized")]
    Unauthorized,
    #[serde(rename = "/problems/missing-idempotency-key")]
    MissingIdempotencyKey,
    #[serde(rename = "/problems/invalid-idempotency-key")]
    InvalidIdempotencyKey,
    #[serde(rename = "/problems/unsupported-media-type")]
    UnsupportedMediaType,
    #[serde(rename = "/problems/payload-too-large")]
    PayloadTooLarge,
    #[serde(rename = "/problems/request-timeout")]
    RequestTimeout,
    #[serde(rename = "/problems/malformed-json")]
    MalformedJson,
    #[serde(rename = "/problems/invalid-request")]
    InvalidRequest,
    #[serde(rename = "/problems/idempotency-key-reused")]
    IdempotencyKeyReused,
    #[serde(rename = "/problems/request-in-progress")]
    RequestInProgress,
    #[serde(rename = "/problems/storage-unavailable")]
    StorageUnavailable,
    #[serde(rename = "/problems/not-found")]
    NotFound,
    #[serde(rename = "/problems/method-not-allowed")]
    MethodNotAllowed,
    #[serde(rename = "/problems/internal-error")]
    InternalError,
}

/// An RFC 9457 problem (`application/problem+json`).
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct Problem {
    #[serde(rename = "type")]
    problem_type: ProblemType,
    title: String,
    status: u16,
    detail: String,
    /// Present for `invalid-request`: one item per offending field.
    errors: Option<Vec<FieldError>>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "retrysafe",
        description = "Makes retried writes safe: a write sent with an Idempotency-Key happens once, every retry gets the same answer, and its events reach RabbitMQ at least once.",
    ),
    paths(
        entries::create_entry,
        entries::get_entry,
        keys::get_key,
        health::healthz,
        health::readyz,
        observe::metrics,
        openapi_json,
    ),
    components(schemas(NewEntryRequest, EntryView, FieldError, Problem, ProblemType, keys::KeyView, keys::EventView, health::Readiness)),
    modifiers(&BearerAuth),
    tags(
        (name = "entries", description = "Idempotent writes and their results"),
        (name = "operations", description = "Probes, metrics and this description"),
    ),
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A client's token; configured as [[auth.clients]] with its SHA-256. Not required when no clients are configured (loopback only).",
                    ))
                    .build(),
            ),
        );
    }
}

/// The OpenAPI 3.1 description of every route.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    responses((status = 200, description = "This description", content_type = "application/json", body = Object)),
)]
pub async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok().json(ApiDoc::openapi())
}
