//! `GET /healthz` (the process runs) and `GET /readyz` (it can serve writes).

use actix_web::HttpResponse;
use serde::Serialize;

use crate::db;
use crate::http::SharedState;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

#[derive(Serialize)]
struct Readiness {
    status: &'static str,
    database: &'static str,
    migrations: &'static str,
}

/// Ready when the database answers and has every migration this build needs.
pub async fn readyz(state: SharedState) -> HttpResponse {
    let check =
        tokio::time::timeout(state.probe_timeout, db::migrations_applied(&state.pool)).await;
    let (database, migrations) = match check {
        Ok(Ok(true)) => ("up", "applied"),
        Ok(Ok(false)) => ("up", "pending"),
        Ok(Err(error)) => {
            tracing::warn!(error = %error, "readiness check failed");
            ("down", "unknown")
        }
        Err(_elapsed) => ("down", "unknown"),
    };
    let ready = database == "up" && migrations == "applied";
    let body = Readiness {
        status: if ready { "ready" } else { "unready" },
        database,
        migrations,
    };
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}
