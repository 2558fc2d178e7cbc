//! `GET /healthz` (the process runs) and `GET /readyz` (it can serve writes).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use actix_web::HttpResponse;
use serde::Serialize;

use crate::db::{self, Database};
use crate::http::SharedState;
use crate::telemetry;

/// 200 while the process runs.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "The process runs", body = Object, content_type = "application/json")))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Readiness {
    status: &'static str,
    database: &'static str,
    migrations: &'static str,
    /// Reported, but not part of readiness: writes work while the broker is down.
    broker: &'static str,
    /// Events committed and not yet delivered (parked ones excluded); null when unknown.
    outbox_backlog: Option<i64>,
}

/// Ready when the database answers and has every migration this build needs.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "The database answers and migrations are applied", body = Readiness, content_type = "application/json"),
        (status = 503, description = "Not ready; the body says why", body = Readiness, content_type = "application/json"),
    ),
)]
pub async fn readyz(state: SharedState) -> HttpResponse {
    let database = state.readiness.current().await;
    let (database_text, migrations) = match database {
        DatabaseState::Ready => ("up", "applied"),
        DatabaseState::MigrationsPending => ("up", "pending"),
        DatabaseState::Down => ("down", "unknown"),
    };
    let body = Readiness {
        status: if database == DatabaseState::Ready {
            "ready"
        } else {
            "unready"
        },
        database: database_text,
        migrations,
        broker: if state.broker.is_connected() {
            "connected"
        } else {
            "disconnected"
        },
        outbox_backlog: state.readiness.backlog(),
    };
    if database == DatabaseState::Ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// What the database's readiness check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseState {
    Ready,
    MigrationsPending,
    Down,
}

/// How long a readiness result is reused: probes, however many, cost the database at most one
/// check per this interval.
const READINESS_FRESH: Duration = Duration::from_secs(1);

/// The database's readiness, checked at most once per [`READINESS_FRESH`] whatever the number
/// of probes: concurrent probes wait for the check in progress and share its result. The
/// outbox backlog it reports comes from the background gauges, not from a query per probe.
pub struct ReadinessMonitor {
    db: Database,
    /// Bound on one check.
    limit: Duration,
    last: tokio::sync::Mutex<Option<(Instant, DatabaseState)>>,
    /// Unsent events at the last refresh of the outbox gauges; -1 when unknown.
    backlog: AtomicI64,
}

impl ReadinessMonitor {
    pub fn new(db: Database, limit: Duration) -> Self {
        Self {
            db,
            limit,
            last: tokio::sync::Mutex::new(None),
            backlog: AtomicI64::new(-1),
        }
    }

    /// The last result if it is fresh, else the result of a new check.
    pub async fn current(&self) -> DatabaseState {
        let mut last = self.last.lock().await;
        if let Some((at, state)) = *last {
            if at.elapsed() < READINESS_FRESH {
                return state;
            }
        }
        let state = self.check().await;
        *last = Some((Instant::now(), state));
        metrics::gauge!(telemetry::READY).set(if state == DatabaseState::Ready {
            1.0
        } else {
            0.0
        });
        state
    }

    async fn check(&self) -> DatabaseState {
        let applied = self
            .db
            .run_within(self.limit, async |connection| {
                db::migrations_applied(connection).await
            })
            .await;
        match applied {
            Ok(true) => DatabaseState::Ready,
            Ok(false) => DatabaseState::MigrationsPending,
            Err(error) => {
                tracing::warn!(error = %error, "readiness check failed");
                DatabaseState::Down
            }
        }
    }

    /// Unsent events, as the outbox gauges last saw them.
    pub fn backlog(&self) -> Option<i64> {
        let backlog = self.backlog.load(Ordering::Relaxed);
        (backlog >= 0).then_some(backlog)
    }

    pub fn set_backlog(&self, unsent: i64) {
        self.backlog.store(unsent, Ordering::Relaxed);
    }
}
