//! `GET /healthz` (the process runs) and `GET /readyz` (it can serve writes).

use actix_web::HttpResponse;
use serde::Serialize;

use crate::db::{self, Database, StorageError};
use crate::http::SharedState;
use crate::outbox::store;

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
    let (database, migrations, outbox_backlog) =
        match check_database(&state.db, state.probe_timeout).await {
            Ok((true, backlog)) => ("up", "applied", Some(backlog)),
            Ok((false, _)) => ("up", "pending", None),
            Err(error) => {
                tracing::warn!(error = %error, "readiness check failed");
                ("down", "unknown", None)
            }
        };
    let ready = database == "up" && migrations == "applied";
    let body = Readiness {
        status: if ready { "ready" } else { "unready" },
        database,
        migrations,
        broker: if state.broker.is_connected() {
            "connected"
        } else {
            "disconnected"
        },
        outbox_backlog,
    };
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

async fn check_database(
    db: &Database,
    limit: std::time::Duration,
) -> Result<(bool, i64), StorageError> {
    db.run_within(limit, async |connection| {
        if !db::migrations_applied(connection).await? {
            return Ok((false, 0));
        }
        Ok((true, store::totals(&**connection).await?.unsent))
    })
    .await
}
