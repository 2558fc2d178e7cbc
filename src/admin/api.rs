//! The admin API (`/admin/v1/...`, JSON, problem+json errors): the outbox overview, events by
//! filter, retry and skip by selector, the key lookup of any client, the action log. Every
//! route takes an admin's bearer token (`[[auth.admins]]`); a client's token is refused.

use std::sync::Arc;

use actix_web::http::header::{self, HeaderValue};
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::admin::history::{HistorySeries, Range};
use crate::admin::store::{
    self, Action, ActionError, ActionOutcome, EventFilter, EventState, ListedEvent, LoggedAction,
    Selector, TypeBacklog,
};
use crate::admin::SharedAdmin;
use crate::http::cursor::{self, Fingerprint};
use crate::http::entries::{idempotency_key, read_body_within, require_json};
use crate::http::listing::query_pairs;
use crate::http::problem::ApiError;
use crate::idempotency::{IdempotencyKey, Verdict};
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
    /// its end, the rates over the whole step.
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

/// A page of events.
#[derive(Serialize, utoipa::ToSchema)]
pub struct EventPage {
    pub events: Vec<ListedEvent>,
    /// The `cursor` of the next page; null on the last.
    pub next: Option<String>,
    /// True when the page holds fewer events than `limit` and is not the last: a page looks at
    /// no more than 20 times `limit` events of its state, and the filters matched fewer than
    /// `limit` among them. Older events may match: `next` goes on from where it stopped.
    pub partial: bool,
}

/// The query parameters of a page of events, in the API and in the console's events page.
pub const EVENT_PARAMETERS: [&str; 8] = [
    "state",
    "type",
    "client",
    "error",
    "created_after",
    "created_before",
    "limit",
    "cursor",
];

/// Query parameters, each known and given once, as `(name, value)`.
pub struct Parameters(Vec<(String, String)>);

impl Parameters {
    pub fn parse(query: &str, known: &[&str]) -> Result<Self, ApiError> {
        let pairs = query_pairs(query)?;
        let mut problems = Vec::new();
        for (index, (name, _)) in pairs.iter().enumerate() {
            if !known.contains(&name.as_str()) {
                problems.push(format!(
                    "{name}: unknown parameter (known: {})",
                    known.join(", ")
                ));
            } else if pairs[..index].iter().any(|(earlier, _)| earlier == name) {
                problems.push(format!("{name}: given more than once"));
            }
        }
        if problems.is_empty() {
            Ok(Self(pairs))
        } else {
            Err(ApiError::InvalidQuery(problems.join("; ")))
        }
    }

    /// The value of `name`; an empty one (a form's blank field) is none.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(given, _)| given == name)
            .map(|(_, value)| value.as_str())
            .filter(|value| !value.is_empty())
    }
}

/// The RFC 3339 time `text` of parameter `name`, if given; what is wrong with it goes to
/// `problems`.
pub fn optional_time(
    name: &str,
    text: Option<&str>,
    problems: &mut Vec<String>,
) -> Option<DateTime<Utc>> {
    let text = text?;
    match DateTime::parse_from_rfc3339(text) {
        Ok(time) => Some(time.with_timezone(&Utc)),
        Err(_) => {
            problems.push(format!(
                "{name}: {text:?} is not an RFC 3339 time such as 2026-12-01T00:00:00Z"
            ));
            None
        }
    }
}

/// The page size and the cursor (a position, exclusive) of `parameters`, a page of the query
/// `fingerprint` ([`crate::http::cursor`]; `same` names what the cursor is tied to).
fn page_of(
    parameters: &Parameters,
    (fingerprint, same): (Fingerprint, &str),
    problems: &mut Vec<String>,
) -> (i64, Option<i64>) {
    let limit = match parameters.get("limit").map(str::parse::<i64>) {
        None => DEFAULT_PAGE,
        Some(Ok(limit)) if (1..=MAX_PAGE).contains(&limit) => limit,
        Some(_) => {
            problems.push(format!("limit: a whole number from 1 to {MAX_PAGE}"));
            DEFAULT_PAGE
        }
    };
    let cursor = match parameters
        .get("cursor")
        .map(|text| cursor::decode(text, fingerprint))
    {
        None => None,
        Some(Ok(position)) => Some(i64::from_be_bytes(position)),
        Some(Err(refused)) => {
            problems.push(format!("cursor: {}", refused.describe(same)));
            None
        }
    };
    (limit, cursor)
}

/// What an events cursor is tied to: every filter of the page it came with.
fn events_query(filter: &EventFilter) -> (Fingerprint, &'static str) {
    let time = |time: Option<DateTime<Utc>>| time.map(crate::entry::format_time);
    let described = serde_json::json!([
        "events",
        filter.state.as_str(),
        filter.event_type,
        filter.client,
        filter.error,
        time(filter.created_after),
        time(filter.created_before),
    ]);
    (
        Fingerprint::of(&described),
        "state, type, client, error, created_after and created_before",
    )
}

/// The page size and the cursor of a page of the action log.
pub fn actions_page_of(parameters: &Parameters, problems: &mut Vec<String>) -> (i64, Option<i64>) {
    page_of(parameters, actions_query(), problems)
}

/// What an action log cursor is tied to: the log, which has no filter.
fn actions_query() -> (Fingerprint, &'static str) {
    (Fingerprint::of(&serde_json::json!(["actions"])), "listing")
}

/// The filter, page size and cursor of an events query.
pub fn event_query(parameters: &Parameters) -> Result<(EventFilter, i64, Option<i64>), ApiError> {
    let mut problems = Vec::new();
    let state = match parameters.get("state") {
        None => EventState::Parked,
        Some(text) => EventState::parse(text).unwrap_or_else(|| {
            problems.push(format!(
                "state: {text:?} is none of parked, unsent, sent, skipped"
            ));
            EventState::Parked
        }),
    };
    let mut time = |name: &str| optional_time(name, parameters.get(name), &mut problems);
    let created_after = time("created_after");
    let created_before = time("created_before");
    let selector = Selector {
        event_type: parameters.get("type").map(str::to_owned),
        client: parameters.get("client").map(str::to_owned),
        error: parameters.get("error").map(str::to_owned),
        created_after,
        created_before,
        all: true,
        ..Selector::default()
    };
    problems.extend(selector.problems());
    let filter = EventFilter {
        state,
        event_type: selector.event_type,
        client: selector.client,
        error: selector.error,
        created_after,
        created_before,
    };
    let (limit, cursor) = page_of(parameters, events_query(&filter), &mut problems);
    if !problems.is_empty() {
        return Err(ApiError::InvalidQuery(problems.join("; ")));
    }
    Ok((filter, limit, cursor))
}

/// The events of a filter and page, and the database's time when they were read.
pub async fn read_events(
    state: &SharedAdmin,
    filter: &EventFilter,
    limit: i64,
    cursor: Option<i64>,
) -> Result<(EventPage, DateTime<Utc>), ApiError> {
    let _turn = admin_turn(state).await?;
    let (page, now) = state
        .reads
        .run(async |connection| {
            let page = store::events_page(&**connection, filter, cursor, limit).await?;
            Ok((
                page,
                crate::outbox::store::database_now(&**connection).await?,
            ))
        })
        .await?;
    let full = page.events.len() as i64 == limit;
    let next = if full {
        page.events.last().map(|event| event.position)
    } else {
        page.walk_ended_at
    };
    let page = EventPage {
        events: page.events,
        next: next.map(|position| cursor::encode(position.to_be_bytes(), events_query(filter).0)),
        partial: !full && next.is_some(),
    };
    Ok((page, now))
}

#[utoipa::path(
    get,
    path = "/admin/v1/events",
    tag = "admin",
    params(
        ("state" = Option<String>, Query, description = "parked (default), unsent, sent or skipped"),
        ("type" = Option<String>, Query, description = "Only events of this type"),
        ("client" = Option<String>, Query, description = "Only events of this client"),
        ("error" = Option<String>, Query, description = "Only events whose last error is exactly this (a parked group)"),
        ("created_after" = Option<String>, Query, description = "Only events created after this RFC 3339 time"),
        ("created_before" = Option<String>, Query, description = "Only events created before this RFC 3339 time"),
        ("limit" = Option<i64>, Query, description = "Events per page, 1 to 500; default 50"),
        ("cursor" = Option<String>, Query, description = "The `next` of the previous page, opaque; only with the same filters"),
    ),
    responses(
        (status = 200, description = "Events, newest first (sent events: the last sent first), looking at no more than 20 times `limit` events of the state: a page with fewer events than `limit` and a `next` is `partial`, and older events may match", body = EventPage),
    ),
    security(("admin" = [])),
)]
pub async fn events(request: HttpRequest, state: SharedAdmin) -> Result<HttpResponse, ApiError> {
    admin_of(&state, &request)?;
    let parameters = Parameters::parse(request.query_string(), &EVENT_PARAMETERS)?;
    let (filter, limit, cursor) = event_query(&parameters)?;
    Ok(HttpResponse::Ok().json(read_events(&state, &filter, limit, cursor).await?.0))
}

/// The body of `POST /admin/v1/events/retry` and `/skip`: a selector, and whether to count only.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionRequest {
    #[serde(default)]
    pub event_ids: Vec<uuid::Uuid>,
    #[serde(default, rename = "type")]
    pub event_type: Option<String>,
    #[serde(default)]
    pub client: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub created_after: Option<DateTime<Utc>>,
    #[serde(default)]
    pub created_before: Option<DateTime<Utc>>,
    /// Must be true for a selector without ids or filters (every parked event).
    #[serde(default)]
    pub all: bool,
    /// Count what would change; change nothing (no Idempotency-Key needed).
    #[serde(default)]
    pub dry_run: bool,
}

impl ActionRequest {
    pub fn selector(&self) -> Selector {
        Selector {
            event_ids: self.event_ids.clone(),
            event_type: self.event_type.clone(),
            client: self.client.clone(),
            error: self.error.clone(),
            created_after: self.created_after,
            created_before: self.created_before,
            all: self.all,
        }
    }
}

/// Runs `action` on `selector` for `admin` (counts only without a key): what the API and the
/// console's buttons both do.
pub async fn run_action(
    state: &SharedAdmin,
    admin: &str,
    key: Option<&IdempotencyKey>,
    action: Action,
    selector: &Selector,
) -> Result<(ActionOutcome, bool), ApiError> {
    let problems = selector.problems();
    if !problems.is_empty() {
        return Err(ApiError::InvalidSelector(problems.join("; ")));
    }
    let _turn = admin_turn(state).await?;
    let refused = |error: ActionError| match error {
        ActionError::TooManyToSkip => ApiError::InvalidSelector(error.to_string()),
        ActionError::Storage(storage) => storage.into(),
    };
    let Some(key) = key else {
        let outcome = state
            .reads
            .run(async |connection| Ok(store::dry_run(connection, admin, action, selector).await))
            .await?
            .map_err(refused)?;
        return Ok((outcome, false));
    };
    let recorded = state
        .reads
        .run(async |connection| {
            Ok(store::act(connection, admin, key.as_str(), action, selector).await)
        })
        .await?
        .map_err(refused)?;
    match recorded {
        Verdict::New(outcome) => {
            tracing::info!(
                admin,
                action = action.as_str(),
                action_id = outcome.action_id,
                matched = outcome.matched,
                changed = outcome.changed,
                selector = %serde_json::to_string(selector).unwrap_or_default(),
                "admin action"
            );
            Ok((outcome, false))
        }
        Verdict::Replay(outcome) => Ok((outcome, true)),
        Verdict::Conflict => Err(ApiError::IdempotencyKeyReused {
            status: state.mismatch_status,
        }),
    }
}

async fn act_on_events(
    request: HttpRequest,
    payload: web::Payload,
    state: SharedAdmin,
    action: Action,
) -> Result<HttpResponse, ApiError> {
    let admin = admin_of(&state, &request)?;
    require_json(&request)?;
    let body = read_body_within(state.body_timeout, &request, payload, MAX_ADMIN_BODY).await?;
    let parsed: ActionRequest = serde_json::from_slice(&body)
        .map_err(|error| ApiError::MalformedJson(format!("the body is not a selector: {error}")))?;
    let key = match idempotency_key(&request) {
        Ok(key) => Some(key),
        Err(ApiError::MissingIdempotencyKey) if parsed.dry_run => None,
        Err(error) => return Err(error),
    };
    let key = if parsed.dry_run { None } else { key };
    let (outcome, replayed) =
        run_action(&state, &admin, key.as_ref(), action, &parsed.selector()).await?;
    let mut response = HttpResponse::Ok().json(outcome);
    if replayed {
        response.headers_mut().insert(
            header::HeaderName::from_static("idempotency-replayed"),
            HeaderValue::from_static("true"),
        );
    }
    Ok(response)
}

#[utoipa::path(
    post,
    path = "/admin/v1/events/retry",
    tag = "admin",
    request_body(content = ActionRequest, content_type = "application/json"),
    params(("Idempotency-Key" = String, Header, description = "Required unless dry_run: the same request again under it answers the first answer")),
    responses(
        (status = 200, description = "What was requeued (with `Idempotency-Replayed: true`, the first answer to this key)", body = ActionOutcome),
    ),
    security(("admin" = [])),
)]
pub async fn retry(
    request: HttpRequest,
    payload: web::Payload,
    state: SharedAdmin,
) -> Result<HttpResponse, ApiError> {
    act_on_events(request, payload, state, Action::Retry).await
}

#[utoipa::path(
    post,
    path = "/admin/v1/events/skip",
    tag = "admin",
    request_body(content = ActionRequest, content_type = "application/json"),
    params(("Idempotency-Key" = String, Header, description = "Required unless dry_run: the same request again under it answers the first answer")),
    responses(
        (status = 200, description = "What was skipped (never to be published; an ordering key goes on past it)", body = ActionOutcome),
    ),
    security(("admin" = [])),
)]
pub async fn skip(
    request: HttpRequest,
    payload: web::Payload,
    state: SharedAdmin,
) -> Result<HttpResponse, ApiError> {
    act_on_events(request, payload, state, Action::Skip).await
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
    let view = lookup_key(&state, &client, &key).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// A client's key, checked, looked up.
pub async fn lookup_key(
    state: &SharedAdmin,
    client: &str,
    key: &str,
) -> Result<crate::http::keys::KeyView, ApiError> {
    if !crate::config::is_valid_client_id(client) {
        return Err(ApiError::InvalidQuery(
            "client: 1 to 64 of a-z A-Z 0-9 . _ -".into(),
        ));
    }
    let key = IdempotencyKey::parse(key.as_bytes()).map_err(ApiError::InvalidIdempotencyKey)?;
    let _turn = admin_turn(state).await?;
    crate::http::keys::lookup(&state.reads, client, &key).await
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
