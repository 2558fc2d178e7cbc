//! Events by filter, and the actions on them (retry, skip by selector), once per admin's
//! Idempotency-Key.

use actix_web::http::header::{self, HeaderValue};
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::admin::store::{
    self, Action, ActionError, ActionOutcome, EventDetail, EventFilter, ListedEvent, MatchCount,
    Selector,
};
use crate::admin::SharedAdmin;
use crate::http::cursor;
use crate::http::entries::{idempotency_key, read_body_within, require_json};
use crate::http::problem::ApiError;
use crate::idempotency::{IdempotencyKey, Verdict};

use super::query::events_query;
use super::{admin_of, admin_turn, event_query, Parameters, EVENT_PARAMETERS, MAX_ADMIN_BODY};

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

/// The events of a filter and page, how many events the filter matches when `count` is asked
/// (the console's list: a walk of its own, up to the overview's cap), and the database's time
/// when they were read.
pub async fn read_events(
    state: &SharedAdmin,
    filter: &EventFilter,
    limit: i64,
    cursor: Option<i64>,
    count: bool,
) -> Result<(EventPage, Option<MatchCount>, DateTime<Utc>), ApiError> {
    let _turn = admin_turn(state).await?;
    let (page, matched, now) = state
        .reads
        .run(async |connection| {
            let page = store::events_page(&**connection, filter, cursor, limit).await?;
            let matched = if count {
                Some(store::count_events(&**connection, filter).await?)
            } else {
                None
            };
            Ok((
                page,
                matched,
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
    Ok((page, matched, now))
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
    Ok(HttpResponse::Ok().json(read_events(&state, &filter, limit, cursor, false).await?.0))
}

/// The event id of a path.
pub fn event_id_of(text: &str) -> Result<Uuid, ApiError> {
    text.parse()
        .map_err(|_| ApiError::InvalidQuery(format!("event_id: {text:?} is not an event id")))
}

/// The event `event_id` and the database's time when it was read; 404 when there is none.
pub async fn read_event(
    state: &SharedAdmin,
    event_id: Uuid,
) -> Result<(EventDetail, DateTime<Utc>), ApiError> {
    let _turn = admin_turn(state).await?;
    let (detail, now) = state
        .reads
        .run(async |connection| {
            Ok((
                store::event_detail(&**connection, event_id).await?,
                crate::outbox::store::database_now(&**connection).await?,
            ))
        })
        .await?;
    let detail = detail.ok_or_else(|| ApiError::NotFound(format!("no event {event_id}")))?;
    Ok((detail, now))
}

#[utoipa::path(
    get,
    path = "/admin/v1/events/{event_id}",
    tag = "admin",
    params(("event_id" = uuid::Uuid, Path, description = "The event's id")),
    responses(
        (status = 200, description = "The event, its payload, its failed attempts (the first and the last error, with their times), its next attempt, the earlier event of its ordering key it waits for, who skipped it, and the replays that published it again", body = EventDetail),
    ),
    security(("admin" = [])),
)]
pub async fn event(
    request: HttpRequest,
    path: web::Path<String>,
    state: SharedAdmin,
) -> Result<HttpResponse, ApiError> {
    admin_of(&state, &request)?;
    let event_id = event_id_of(&path)?;
    Ok(HttpResponse::Ok().json(read_event(&state, event_id).await?.0))
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
