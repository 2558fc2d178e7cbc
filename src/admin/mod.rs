//! The admin listener (`admin.listen`, started when `[[auth.admins]]` are configured): the
//! admin API (`/admin/v1/...`, [`api`]), its OpenAPI description (`/openapi.json`), and the
//! console (`/console`, [`console`]), server-rendered HTML for an operator's browser.
//!
//! Admins see every client's data; clients never reach this listener (their tokens are not
//! admins'), and admins never reach the API. Everything here reads and acts through the read
//! pool with small, bounded queries ([`store`]), on at most half its connections at once
//! ([`AdminState::turns`]): the write path is not touched, and clients' reads, readiness and
//! the gauges keep the other half.

pub mod api;
pub mod charts;
pub mod console;
pub mod history;
pub mod openapi;
pub mod session;
pub mod store;

use std::sync::Arc;

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::web;

use crate::config::{Config, MismatchStatus};
use crate::db::topology::Topology;
use crate::db::Database;
use crate::http::auth::Principals;
use crate::http::Methods;
use crate::outbox::Broker;

/// What the admin listener's handlers share: registered as its own `web::Data` by whoever
/// builds the admin listener ([`routes_with`]), so that the HTTP layer never names it.
pub struct AdminState {
    /// The pool for reads, readiness checks and the gauges, which admins share.
    pub reads: Database,
    /// Where the write tables live: where a key lookup's barrier is taken.
    pub topology: Topology,
    pub broker: Arc<Broker>,
    /// How long a request waits for a turn: as long as for a pooled connection
    /// (`database.connect_timeout`).
    pub read_wait: Duration,
    /// How long a body may take to arrive (`http.body_timeout`).
    pub body_timeout: Duration,
    /// Status for a reused Idempotency-Key with another request (409, or 422).
    pub mismatch_status: StatusCode,
    /// The outbox's recent history, sampled by a task of the daemon.
    pub history: Arc<history::OutboxHistory>,
    pub admins: Principals<Arc<str>>,
    pub sessions: session::Sessions,
    /// Turns for the admin listener's work on the read pool ([`turns_for`] its connections),
    /// each held while a request reads or acts: past them an admin request waits, at most as
    /// long as for a pooled connection, then gets 503. Without them a few slow admin reads
    /// (the overview at retention size, a console left reloading) took every connection of
    /// the pool that client listings, key lookups, readiness and the gauges share.
    pub turns: tokio::sync::Semaphore,
    /// How many turns there are.
    pub turn_count: usize,
}

/// How many admin requests use the read pool at once: half its `read_connections` (a quarter
/// of `database.pool_size`), at least one. With a pool of 16 (the default), 4 read
/// connections, 2 of them for admins; below a pool of 8 the read pool has one connection,
/// which admins then share with everything else.
pub fn turns_for(read_connections: u32) -> usize {
    (read_connections as usize / 2).max(1)
}

impl AdminState {
    pub fn new(
        config: &Config,
        (reads, topology): (Database, Topology),
        broker: Arc<Broker>,
        history: Arc<history::OutboxHistory>,
    ) -> Self {
        let read_connections = reads.max_size();
        Self {
            reads,
            topology,
            broker,
            history,
            read_wait: config.database.connect_timeout,
            body_timeout: config.http.body_timeout,
            mismatch_status: match config.idempotency.mismatch_status {
                MismatchStatus::Conflict => StatusCode::CONFLICT,
                MismatchStatus::UnprocessableContent => StatusCode::UNPROCESSABLE_ENTITY,
            },
            turns: tokio::sync::Semaphore::new(turns_for(read_connections)),
            turn_count: turns_for(read_connections),
            admins: Principals::new(
                config
                    .auth
                    .admins
                    .iter()
                    .map(|admin| (Arc::from(admin.id.as_str()), admin.token_sha256)),
            ),
            sessions: session::Sessions::new(
                config.admin.session_timeout,
                config.admin.tls_files().is_some(),
            ),
        }
    }
}

/// What the admin handlers take.
pub type SharedAdmin = web::Data<AdminState>;

/// The admin listener's routes with `state` registered for them: what startup hands the HTTP
/// layer's listener.
pub fn routes_with(state: SharedAdmin) -> crate::http::server::Routes {
    Arc::new(move |config: &mut web::ServiceConfig| {
        config.app_data(state.clone());
        routes(config);
    })
}

/// Every route of the admin listener.
pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(Methods::on("/admin/v1/outbox").get(api::outbox).finish())
        .service(
            Methods::on("/admin/v1/outbox/history")
                .get(api::outbox_history)
                .finish(),
        )
        .service(Methods::on("/admin/v1/events").get(api::events).finish())
        .service(
            Methods::on("/admin/v1/events/retry")
                .post(api::retry)
                .finish(),
        )
        .service(
            Methods::on("/admin/v1/events/skip")
                .post(api::skip)
                .finish(),
        )
        .service(
            Methods::on("/admin/v1/events/{event_id}")
                .get(api::event)
                .finish(),
        )
        .service(
            Methods::on("/admin/v1/keys/{client}/{key}")
                .get(api::key)
                .finish(),
        )
        .service(Methods::on("/admin/v1/actions").get(api::actions).finish())
        .service(
            Methods::on("/openapi.json")
                .get(openapi::admin_openapi_json)
                .finish(),
        );
    console::routes(config);
}
