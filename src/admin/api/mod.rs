//! The admin API (`/admin/v1/...`, JSON, problem+json errors): the outbox overview, events by
//! filter, retry and skip by selector, the key lookup of any client, the action log. Every
//! route takes an admin's bearer token (`[[auth.admins]]`); a client's token is refused.
//!
//! Here: who may ask, the turns on the read pool, the overview and its history, the key lookup
//! and the action log; the events and the actions on them in [`events`]; the query parameters
//! and the pages' cursors in [`query`].

mod events;
mod query;

use query::actions_query;

pub use events::*;
pub use query::*;

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::admin::history::{HistorySeries, Range};
use crate::admin::store::{self, LoggedAction, TypeBacklog};
use crate::admin::SharedAdmin;
use crate::http::cursor::{self};
use crate::http::problem::ApiError;
use crate::idempotency::IdempotencyKey;
use crate::outbox::replay::ReplayRecord;
use crate::outbox::store::{BlockingEvent, ParkedGroup, GAUGE_COUNT_CAP};

/// Largest body of an admin POST: a selector with [`store::MAX_EVENT_IDS`] ids fits.
pub const MAX_ADMIN_BODY: usize = 64 * 1024;
/// Events or actions per page by default, and at most.
pub const DEFAULT_PAGE: i64 = 50;
pub const MAX_PAGE: i64 = 500;
/// Replays the overview lists.
const RECENT_REPLAYS: i64 = 10;

/// The admin of a request's bearer token: 401 without one.
fn admin_of(state: &SharedAdmin, request: &HttpRequest) -> Result<Arc<str>, ApiError> {
    state
        .admins
        .of_request(request)
        .ok_or(ApiError::Unauthorized)
}

/// A turn of the admin listener on the read pool ([`crate::admin::AdminState::turns`]), held
/// while a request reads or acts; waited for at most as long as a pooled connection
/// (`database.connect_timeout`), then 503 `storage-unavailable` with `Retry-After`. Taken once
/// per request, by the functions below that the API and the console share.
pub async fn admin_turn(state: &SharedAdmin) -> Result<tokio::sync::SemaphorePermit<'_>, ApiError> {
    tokio::time::timeout(state.read_wait, state.turns.acquire())
        .await
        .map_err(|_| {
            ApiError::Busy(format!(
                "{} admin request(s) are using the database (their share of the read pool) and none finished within {}",
                state.turn_count,
                humantime::format_duration(state.read_wait)
            ))
        })
        .map(|permit| permit.expect("the admin turns' semaphore is never closed"))
}

/// Is delivery healthy: the backlog, what is parked and why, what parked events hold back, the
/// broker, the replays.
#[derive(Serialize, utoipa::ToSchema)]
pub struct OutboxOverview {
    /// Unsent events that are not parked (the relays have them), counted up to
    /// `counts_capped_at`.
    pub unsent: i64,
    /// Parked events, counted up to `counts_capped_at`.
    pub parked: i64,
    /// Age of the oldest unsent (not parked) event; a lower bound past the cap.
    pub oldest_unsent_age_seconds: Option<f64>,
    /// Counts stop here: a count at it means at least that many.
    pub counts_capped_at: i64,
    pub backlog: Vec<TypeBacklog>,
    /// Parked events grouped by last error and event type, the largest groups first (20 at
    /// most).
    #[schema(value_type = Vec<Object>)]
    pub parked_groups: Vec<ParkedGroup>,
    pub blocked: BlockedOverview,
    pub broker: BrokerState,
    /// The newest replays, and which of them are running.
    #[schema(value_type = Vec<Object>)]
    pub replays: Vec<ReplayRecord>,
    pub replays_in_progress: usize,
}

/// Ordered delivery: events held behind a parked event of their key.
#[derive(Serialize, utoipa::ToSchema)]
pub struct BlockedOverview {
    pub events: i64,
    pub keys: i64,
    /// The parked events that hold back the most (20 at most): retry or skip them.
    #[schema(value_type = Vec<Object>)]
    pub by: Vec<BlockingEvent>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct BrokerState {
    pub connected: bool,
    /// RabbitMQ blocks publishers (a resource alarm): why, and for how long so far.
    pub blocked: Option<String>,
    pub blocked_for_seconds: Option<f64>,
}

/// What the overview shows, read in one snapshot.
pub struct Overview {
    pub figures: store::OutboxFigures,
    pub broker: BrokerState,
    pub replays: Vec<ReplayRecord>,
}

pub async fn read_overview(state: &SharedAdmin) -> Result<Overview, ApiError> {
    let _turn = admin_turn(state).await?;
    let figures = state.reads.run(store::outbox_figures).await?;
    let replays = crate::outbox::replay::recent(&state.reads, RECENT_REPLAYS).await?;
    let blocked = state.broker.blocked();
    Ok(Overview {
        figures,
        broker: BrokerState {
            connected: state.broker.is_connected(),
            blocked_for_seconds: blocked.as_ref().map(|(_, since)| since.as_secs_f64()),
            blocked: blocked.map(|(reason, _)| reason),
        },
        replays,
    })
}

#[utoipa::path(
    get,
    path = "/admin/v1/outbox",
    tag = "admin",
    responses(
        (status = 200, description = "The outbox at a glance", body = OutboxOverview),
    ),
    security(("admin" = [])),
)]
pub async fn outbox(request: HttpRequest, state: SharedAdmin) -> Result<HttpResponse, ApiError> {
    admin_of(&state, &request)?;
    let overview = read_overview(&state).await?;
    let figures = overview.figures;
    let replays_in_progress = overview
        .replays
        .iter()
        .filter(|replay| replay.status == "running")
        .count();
    Ok(HttpResponse::Ok().json(OutboxOverview {
        unsent: figures.totals.unsent,
        parked: figures.totals.parked,
        oldest_unsent_age_seconds: figures.totals.oldest_unsent_age_seconds,
        counts_capped_at: GAUGE_COUNT_CAP,
        backlog: figures.by_type,
        parked_groups: figures.parked_groups,
        blocked: BlockedOverview {
            events: figures.blocked.events,
            keys: figures.blocked.keys,
            by: figures.blocking,
        },
        broker: overview.broker,
        replays: overview.replays,
        replays_in_progress,
    }))
}

/// The outbox's recent history on this daemon (`GET /admin/v1/outbox/history`), what the
/// console's charts draw.
#[derive(Serialize, utoipa::ToSchema)]
pub struct OutboxHistoryView {
    /// The last hour, a point per sample (every `hour.step_seconds`).
    pub hour: HistorySeries,
    /// The last day, a point per `day.step_seconds` (five minutes): the gauges as sampled at
    /// its end, the rates over the whole step; then the samples taken since the last of them.
    pub day: HistorySeries,
    /// Counts stop here: a count at it means at least that many.
    pub counts_capped_at: i64,
}

#[utoipa::path(
    get,
    path = "/admin/v1/outbox/history",
    tag = "admin",
    responses(
        (status = 200, description = "The backlog, the parked events and the rates of sent and parked events over the last hour and the last day, as this daemon sampled them since it started (the whole outbox's figures, with the database's times)", body = OutboxHistoryView),
    ),
    security(("admin" = [])),
)]
pub async fn outbox_history(
    request: HttpRequest,
    state: SharedAdmin,
) -> Result<HttpResponse, ApiError> {
    admin_of(&state, &request)?;
    Ok(HttpResponse::Ok().json(OutboxHistoryView {
        hour: state.history.series(Range::Hour),
        day: state.history.series(Range::Day),
        counts_capped_at: GAUGE_COUNT_CAP,
    }))
}

#[utoipa::path(
    get,
    path = "/admin/v1/keys/{client}/{key}",
    tag = "admin",
    params(
        ("client" = String, Path, description = "The client id"),
        ("key" = String, Path, description = "The Idempotency-Key, percent-encoded"),
    ),
    responses(
        (status = 200, description = "The key's record and its events", body = crate::http::keys::KeyView),
    ),
    security(("admin" = [])),
)]
pub async fn key(
    request: HttpRequest,
    path: web::Path<(String, String)>,
    state: SharedAdmin,
) -> Result<HttpResponse, ApiError> {
    admin_of(&state, &request)?;
    let (client, key) = path.into_inner();
    let (view, _) = lookup_key(&state, &client, &key).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// A client's key, checked, looked up; and the database's time once it was read.
pub async fn lookup_key(
    state: &SharedAdmin,
    client: &str,
    key: &str,
) -> Result<(crate::http::keys::KeyView, DateTime<Utc>), ApiError> {
    if !crate::config::is_valid_client_id(client) {
        return Err(ApiError::InvalidQuery(
            "client: 1 to 64 of a-z A-Z 0-9 . _ -".into(),
        ));
    }
    let key = IdempotencyKey::parse(key.as_bytes()).map_err(ApiError::InvalidIdempotencyKey)?;
    let _turn = admin_turn(state).await?;
    let view = crate::http::keys::lookup((&state.reads, &state.topology), client, &key).await?;
    let now = state
        .reads
        .run(async |connection| crate::outbox::store::database_now(&**connection).await)
        .await?;
    Ok((view, now))
}

/// A page of the action log.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ActionPage {
    pub actions: Vec<LoggedAction>,
    /// The `cursor` of the next page; null on the last.
    pub next: Option<String>,
}

/// A page of the action log, and the database's time when it was read.
pub async fn read_actions(
    state: &SharedAdmin,
    limit: i64,
    cursor: Option<i64>,
) -> Result<(ActionPage, DateTime<Utc>), ApiError> {
    let _turn = admin_turn(state).await?;
    let (actions, now) = state
        .reads
        .run(async |connection| {
            let actions = store::actions_page(&**connection, cursor, limit).await?;
            Ok((
                actions,
                crate::outbox::store::database_now(&**connection).await?,
            ))
        })
        .await?;
    let next = (actions.len() as i64 == limit)
        .then(|| {
            actions
                .last()
                .map(|action| cursor::encode(action.id.to_be_bytes(), actions_query().0))
        })
        .flatten();
    Ok((ActionPage { actions, next }, now))
}

#[utoipa::path(
    get,
    path = "/admin/v1/actions",
    tag = "admin",
    params(
        ("limit" = Option<i64>, Query, description = "Actions per page, 1 to 500; default 50"),
        ("cursor" = Option<String>, Query, description = "The `next` of the previous page"),
    ),
    responses(
        (status = 200, description = "Every admin action, newest first", body = ActionPage),
    ),
    security(("admin" = [])),
)]
pub async fn actions(request: HttpRequest, state: SharedAdmin) -> Result<HttpResponse, ApiError> {
    admin_of(&state, &request)?;
    let parameters = Parameters::parse(request.query_string(), &["limit", "cursor"])?;
    let mut problems = Vec::new();
    let (limit, cursor) = actions_page_of(&parameters, &mut problems);
    if !problems.is_empty() {
        return Err(ApiError::InvalidQuery(problems.join("; ")));
    }
    Ok(HttpResponse::Ok().json(read_actions(&state, limit, cursor).await?.0))
}
