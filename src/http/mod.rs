//! The HTTP layer: authenticate, parse, validate and hash, then hand the write to its shard.

pub mod auth;
pub mod entries;
pub mod health;
pub mod keys;
pub mod observe;
pub mod openapi;
pub mod problem;

use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, HttpRequest, HttpResponse};

use crate::config::Settings;
use crate::db::Database;
use crate::idempotency::IdempotencyKey;
use crate::outbox::Broker;
use crate::shard::{shard_index, ShardHandle};
use auth::Authenticator;
use problem::ApiError;

/// What every handler shares.
pub struct AppState {
    pub db: Database,
    pub shards: Vec<ShardHandle>,
    pub broker: Arc<Broker>,
    pub auth: Authenticator,
    pub max_body_bytes: usize,
    /// actix bounds the headers; this bounds the body, so that a client trickling it cannot
    /// hold a connection and a task forever.
    pub body_timeout: Duration,
    pub wait_timeout: Duration,
    /// Status for a reused key with another request (409, or 422).
    pub mismatch_status: actix_web::http::StatusCode,
    /// Bounds the bytes held by pending writes (`database.max_pending_bytes`).
    pub pending: crate::writer::PendingBytes,
    /// Turns for decoding large bodies off the HTTP workers.
    pub decoders: Arc<tokio::sync::Semaphore>,
    /// The database's readiness, shared by every probe.
    pub readiness: Arc<health::ReadinessMonitor>,
    /// `database.pool_size`, for the pool metric.
    pub pool_size: u32,
}

impl AppState {
    pub fn new(
        settings: &Settings,
        db: Database,
        shards: Vec<ShardHandle>,
        broker: Arc<Broker>,
        readiness: Arc<health::ReadinessMonitor>,
    ) -> Self {
        Self {
            db,
            shards,
            broker,
            auth: Authenticator::new(&settings.auth),
            max_body_bytes: settings.http.max_body_bytes,
            body_timeout: settings.http.body_timeout.0,
            wait_timeout: settings.idempotency.wait_timeout.0,
            mismatch_status: actix_web::http::StatusCode::from_u16(
                settings.idempotency.mismatch_status,
            )
            .expect("mismatch_status is validated as 409 or 422"),
            readiness,
            pending: crate::writer::PendingBytes::new(settings.database.max_pending_bytes),
            // As many at once as there are cores to run them, and never fewer than two.
            decoders: Arc::new(tokio::sync::Semaphore::new(
                std::thread::available_parallelism()
                    .map(usize::from)
                    .unwrap_or(2)
                    .max(2),
            )),
            pool_size: settings.database.pool_size,
        }
    }

    pub fn shard_for(&self, client_id: &str, key: &IdempotencyKey) -> &ShardHandle {
        &self.shards[shard_index(client_id, key, self.shards.len())]
    }
}

/// Registers every route.
pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(only(
            entries::ENTRIES_PATH,
            web::post().to(entries::create_entry),
        ))
        .service(only("/v1/entries/{id}", web::get().to(entries::get_entry)))
        .service(only(
            "/v1/idempotency-keys/{key}",
            web::get().to(keys::get_key),
        ))
        .service(
            only("/healthz", web::get().to(health::healthz)).route(web::head().to(health::healthz)),
        )
        .service(
            only("/readyz", web::get().to(health::readyz)).route(web::head().to(health::readyz)),
        )
        .service(only("/metrics", web::get().to(observe::metrics)))
        .service(only("/openapi.json", web::get().to(openapi::openapi_json)));
}

/// A resource with one route; any other method gets a `method-not-allowed` problem.
fn only(path: &str, route: actix_web::Route) -> actix_web::Resource {
    web::resource(path)
        .route(route)
        .default_service(web::to(method_not_allowed))
}

pub async fn not_found(request: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound(format!(
        "no route for {} {}",
        request.method(),
        request.path()
    )))
}

async fn method_not_allowed(request: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed(format!(
        "{} is not allowed on {}",
        request.method(),
        request.path()
    )))
}

pub type SharedState = web::Data<Arc<AppState>>;
