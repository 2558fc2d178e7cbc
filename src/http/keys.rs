//! `GET /v1/idempotency-keys/{key}`: what became of a key.

use actix_web::web;
use actix_web::{HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::db::outbox_state::{held, not_done, parked};
use crate::db::topology::Topology;
use crate::db::StorageError;
use crate::entry::format_time;
use crate::http::problem::ApiError;
use crate::http::SharedState;
use crate::idempotency::IdempotencyKey;

#[derive(Serialize, utoipa::ToSchema)]
pub struct KeyView {
    pub key: String,
    pub status: String,
    pub request_hash: String,
    pub created_at: String,
    pub expires_at: String,
    pub response_status: i16,
    pub entry_id: Option<Uuid>,
    /// The write's ordering key and its sequence; absent for an unordered write.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub ordering_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub sequence: Option<i64>,
    /// The parked event of the ordering key that holds this write's events back (retry or
    /// skip it: docs/ordering.md); null when nothing does.
    pub blocked_by: Option<Uuid>,
    pub events: Vec<EventView>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct EventView {
    pub event_id: Uuid,
    pub event_type: String,
    pub attempts: i32,
    pub sent_at: Option<String>,
    pub failed_at: Option<String>,
    /// When a relay tries it next; null while it waits for the earlier events of its ordering
    /// key (it is released when they are sent or skipped).
    pub next_attempt_at: Option<String>,
    pub last_error: Option<String>,
    /// Given up on with `retrysafe outbox skip`: never published.
    pub skipped_at: Option<String>,
    /// The parked event of the ordering key that holds this one back; null when nothing does.
    pub blocked_by: Option<Uuid>,
    /// How many replays (`retrysafe outbox replay`) have published this event again; the
    /// relay's own delivery is not one.
    pub replay_count: i64,
    /// When a replay last published it; null when never.
    pub last_replayed_at: Option<String>,
}

/// An expired record is gone for clients even before the janitor deletes it.
const SELECT_RECORD: &str = "
SELECT r.request_hash, r.status, r.created_at, r.expires_at, r.response_status, r.entry_id,
       e.ordering_key, e.sequence
FROM idempotency_records r
    LEFT JOIN entries e ON e.client_id = r.client_id AND e.id = r.entry_id
WHERE r.client_id = $1 AND r.key = $2 AND r.expires_at > now()";

/// The events of the record's entry, by their event keys (`'<entry id>/<event type>'`, every
/// type a write can emit: the unique index of event_key finds each); a key that expired and was
/// reused has older events under the same key, which belong to the older entry. Replays are counted through event_replays'
/// primary key (event_id first). What blocks an ordered event is its key's first parked event
/// before it (outbox_events_ordered_unsent).
const SELECT_EVENTS: &str = concat!(
    "
SELECT o.event_id, o.event_type, o.attempts, o.sent_at, o.failed_at,
       CASE WHEN NOT ",
    held!("o"),
    " THEN o.next_attempt_at END AS next_attempt_at,
       o.last_error, r.replay_count, r.last_replayed_at, o.skipped_at,
       (SELECT b.event_id
        FROM outbox_events b
        WHERE o.ordering_key IS NOT NULL AND ",
    not_done!("o"),
    "
          AND b.client_id = o.client_id AND b.ordering_key = o.ordering_key
          AND b.sequence < o.sequence
          AND ",
    parked!("b"),
    "
          AND b.ordering_key IS NOT NULL
        ORDER BY b.sequence, b.id
        LIMIT 1) AS blocked_by
FROM outbox_events o
     CROSS JOIN LATERAL (
         SELECT count(*) AS replay_count, max(replayed_at) AS last_replayed_at
         FROM event_replays
         WHERE client_id = o.client_id AND event_id = o.event_id
     ) r
WHERE o.event_key = ANY($3::text[]) AND o.client_id = $1 AND o.idempotency_key = $2
ORDER BY o.id"
);

/// What became of an idempotency key: its record and its events' delivery state.
#[utoipa::path(
    get,
    path = "/v1/idempotency-keys/{key}",
    tag = "entries",
    params(("key" = String, Path, description = "The Idempotency-Key, percent-encoded")),
    responses(
        (status = 200, description = "The key's record", body = KeyView, content_type = "application/json"),
        // The problems it answers: crate::http::openapi::ROUTE_PROBLEMS.
    ),
    security(("bearer" = [])),
)]
// One route from request to response; its steps (authenticate, parse, read, shape) are each
// a call, and the length is the response's shape, written out once.
pub async fn get_key(
    request: HttpRequest,
    path: web::Path<String>,
    state: SharedState,
) -> Result<HttpResponse, ApiError> {
    let client_id = state.auth.admit(&request).await?.id.clone();
    let key = IdempotencyKey::parse(path.as_bytes()).map_err(ApiError::InvalidIdempotencyKey)?;
    let view = lookup((&state.reads, &state.topology), &client_id, &key).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// The record of `client`'s `key` and its events: what the key lookup answers, to the client
/// (`GET /v1/idempotency-keys/{key}`) or to an admin (`GET /admin/v1/keys/{client}/{key}`).
/// With a synchronous standby, only once the standby has them (a barrier: see
/// [`Topology::barrier_after_read`]), so that the lookup never reports a write that a failover
/// may lose.
pub async fn lookup(
    (reads, topology): (&crate::db::Database, &Topology),
    client: &str,
    key: &IdempotencyKey,
) -> Result<KeyView, ApiError> {
    let not_found =
        || ApiError::NotFound(format!("no record for Idempotency-Key {:?}", key.as_str()));
    let (record, event_rows) = reads
        .run(async |connection| {
            let key_text = key.as_str();
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&client, &key_text];
            let (promised, record) = tokio::join!(
                connection.query_one(crate::db::REPLICATION_PROMISED, &[]),
                connection.query_opt(SELECT_RECORD, &params),
            );
            let Some(record) = record? else {
                return Ok(None);
            };
            let events = match record.get::<_, Option<Uuid>>("entry_id") {
                Some(entry_id) => {
                    connection
                        .query(
                            SELECT_EVENTS,
                            &[
                                &client,
                                &key.as_str(),
                                &crate::events::event_keys_of(entry_id),
                            ],
                        )
                        .await?
                }
                None => Vec::new(),
            };
            // A record read on the primary may be of a write whose commit the synchronous
            // standby never confirmed (its client was answered 503): not shown as completed
            // until the standby has it.
            topology
                .barrier_after_read(connection, client, promised?.get(0))
                .await?;
            Ok::<_, StorageError>(Some((record, events)))
        })
        .await?
        .ok_or_else(not_found)?;
    let entry_id: Option<Uuid> = record.get("entry_id");
    let events = event_rows
        .iter()
        .map(|row| EventView {
            event_id: row.get("event_id"),
            event_type: row.get("event_type"),
            attempts: row.get("attempts"),
            sent_at: row
                .get::<_, Option<DateTime<Utc>>>("sent_at")
                .map(format_time),
            failed_at: row
                .get::<_, Option<DateTime<Utc>>>("failed_at")
                .map(format_time),
            next_attempt_at: row
                .get::<_, Option<DateTime<Utc>>>("next_attempt_at")
                .map(format_time),
            last_error: row.get("last_error"),
            skipped_at: row
                .get::<_, Option<DateTime<Utc>>>("skipped_at")
                .map(format_time),
            blocked_by: row.get("blocked_by"),
            replay_count: row.get("replay_count"),
            last_replayed_at: row
                .get::<_, Option<DateTime<Utc>>>("last_replayed_at")
                .map(format_time),
        })
        .collect::<Vec<_>>();
    let blocked_by = events.iter().find_map(|event| event.blocked_by);
    let view = KeyView {
        key: key.as_str().to_owned(),
        status: record.get("status"),
        request_hash: hex::encode(record.get::<_, Vec<u8>>("request_hash")),
        created_at: format_time(record.get("created_at")),
        expires_at: format_time(record.get("expires_at")),
        response_status: record.get("response_status"),
        entry_id,
        ordering_key: record.get("ordering_key"),
        sequence: record.get("sequence"),
        blocked_by,
        events,
    };
    Ok(view)
}
