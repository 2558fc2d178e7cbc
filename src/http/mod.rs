//! The HTTP layer: authenticate, parse, validate and hash, then hand the write to its shard.

pub mod auth;
pub mod cursor;
pub mod entries;
pub mod health;
pub mod host;
pub mod keys;
pub mod limits;
pub mod listing;
pub mod observe;
pub mod openapi;
pub mod problem;
pub mod server;

use std::sync::Arc;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};

use crate::config::MismatchStatus;
use crate::db::topology::Topology;
use crate::db::Database;
use crate::outbox::Broker;
use crate::write::{shard_index, ScopedKey, ShardHandle};
use auth::Authenticator;
use problem::ApiError;

/// What every handler shares.
pub struct AppState {
    /// The pool of writers, relays and the janitor: only its metrics are read here.
    pub writes: Database,
    /// The pool for reads, readiness checks and the gauges.
    pub reads: Database,
    /// Where the write tables live: where a key lookup's barrier is taken.
    pub topology: Topology,
    pub shards: Vec<ShardHandle>,
    pub broker: Arc<Broker>,
    pub auth: Authenticator,
    pub max_body_bytes: usize,
    /// actix bounds the headers; this bounds the body, so that a client trickling it cannot
    /// hold a connection and a task forever.
    pub body_timeout: Duration,
    pub wait_timeout: Duration,
    /// Status for a reused key with another request (409, or 422).
    pub mismatch_status: StatusCode,
    /// Turns for decoding large bodies off the HTTP workers.
    pub decoders: Arc<tokio::sync::Semaphore>,
    /// Turns for `GET /v1/entries`, each holding a page in memory
    /// ([`listing::CONCURRENT_LISTINGS`]).
    pub listings: Arc<tokio::sync::Semaphore>,
    /// How long a read waits for a turn: as long as for a pooled connection
    /// (`database.connect_timeout`).
    pub read_wait: Duration,
    /// The database's readiness, shared by every probe.
    pub readiness: Arc<health::ReadinessMonitor>,
}

impl AppState {
    pub fn new(
        config: &crate::config::Config,
        writes: Database,
        (reads, topology): (Database, Topology),
        shards: Vec<ShardHandle>,
        broker: Arc<Broker>,
        readiness: Arc<health::ReadinessMonitor>,
    ) -> Self {
        Self {
            writes,
            reads,
            topology,
            shards,
            broker,
            auth: Authenticator::new(&config.auth),
            max_body_bytes: config.http.max_body_bytes,
            body_timeout: config.http.body_timeout,
            wait_timeout: config.idempotency.wait_timeout,
            mismatch_status: match config.idempotency.mismatch_status {
                MismatchStatus::Conflict => StatusCode::CONFLICT,
                MismatchStatus::UnprocessableContent => StatusCode::UNPROCESSABLE_ENTITY,
            },
            readiness,
            listings: Arc::new(tokio::sync::Semaphore::new(listing::CONCURRENT_LISTINGS)),
            read_wait: config.database.connect_timeout,
            // As many at once as there are cores to run them, and never fewer than two.
            decoders: Arc::new(tokio::sync::Semaphore::new(
                std::thread::available_parallelism()
                    .map(usize::from)
                    .unwrap_or(2)
                    .max(2),
            )),
        }
    }

    pub fn shard_for(&self, key: &ScopedKey) -> &ShardHandle {
        &self.shards[shard_index(&key.client_id, &key.key, self.shards.len())]
    }
}

/// Registers every route: what one listener serves when `http.operations_listen` is not set.
pub fn routes(config: &mut web::ServiceConfig) {
    api_routes(config);
    operations_routes(config);
}

/// The API, and `/healthz`: what `http.listen` serves.
pub fn api_routes(config: &mut web::ServiceConfig) {
    config
        .service(
            Methods::on(entries::ENTRIES_PATH)
                .get(listing::list_entries)
                .post(entries::create_entry)
                .finish(),
        )
        .service(
            Methods::on("/v1/entries/{id}")
                .get(entries::get_entry)
                .finish(),
        )
        .service(
            Methods::on("/v1/idempotency-keys/{key}")
                .get(keys::get_key)
                .finish(),
        )
        .service(Methods::on("/healthz").get(health::healthz).finish());
    #[cfg(feature = "bench-routes")]
    config.service(
        Methods::on("/bench/same-bytes")
            .post(entries::same_bytes)
            .finish(),
    );
}

/// `/readyz`, `/metrics` and `/openapi.json`: what `http.operations_listen` serves, with its own
/// `/healthz`.
pub fn operations_routes(config: &mut web::ServiceConfig) {
    config
        .service(Methods::on("/readyz").get(health::readyz).finish())
        .service(Methods::on("/metrics").get(observe::metrics).finish())
        .service(
            Methods::on("/openapi.json")
                .get(openapi::openapi_json)
                .finish(),
        );
}

/// What `http.operations_listen` serves.
pub fn operations_listener_routes(config: &mut web::ServiceConfig) {
    config.service(Methods::on("/healthz").get(health::healthz).finish());
    operations_routes(config);
}

/// A resource and the methods it answers: every GET route answers HEAD too (RFC 9110), and any
/// other method gets a `method-not-allowed` problem with an `Allow` header listing them.
pub(crate) struct Methods {
    resource: actix_web::Resource,
    allow: Vec<&'static str>,
}

impl Methods {
    pub(crate) fn on(path: &str) -> Self {
        Self {
            resource: web::resource(path),
            allow: Vec::new(),
        }
    }

    pub(crate) fn get<F, Args>(mut self, handler: F) -> Self
    where
        F: actix_web::Handler<Args> + Clone,
        Args: actix_web::FromRequest + 'static,
        F::Output: actix_web::Responder + 'static,
    {
        self.resource = self
            .resource
            .route(web::get().to(handler.clone()))
            .route(web::head().to(handler));
        self.allow.extend(["GET", "HEAD"]);
        self
    }

    pub(crate) fn post<F, Args>(mut self, handler: F) -> Self
    where
        F: actix_web::Handler<Args>,
        Args: actix_web::FromRequest + 'static,
        F::Output: actix_web::Responder + 'static,
    {
        self.resource = self.resource.route(web::post().to(handler));
        self.allow.push("POST");
        self
    }

    pub(crate) fn finish(self) -> actix_web::Resource {
        let allow = self.allow.join(", ");
        self.resource
            .default_service(web::to(move |request: HttpRequest| {
                method_not_allowed(request, allow.clone())
            }))
    }
}

pub async fn not_found(request: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound(format!(
        "no route for {} {}",
        request.method(),
        request.path()
    )))
}

async fn method_not_allowed(request: HttpRequest, allow: String) -> Result<HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed {
        detail: format!(
            "{} is not allowed on {}; allowed: {allow}",
            request.method(),
            request.path()
        ),
        allow,
    })
}

/// What handlers get: `web::Data` is already an `Arc`.
pub type SharedState = web::Data<AppState>;
