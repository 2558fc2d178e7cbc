//! The outbox table as the relay and the admin commands see it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;
use tokio_postgres::{GenericClient, Row, Statement};
use uuid::Uuid;

use crate::db::{PgClient, StorageError};

/// An event claimed for publishing.
#[derive(Debug, Clone)]
pub struct PendingEvent {
    pub id: i64,
    pub event_id: Uuid,
    pub event_type: String,
    pub client_id: String,
    pub idempotency_key: String,
    /// The CloudEvent, as JSON text: the message body.
    pub payload: String,
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
}

/// Due rows, oldest first. `SKIP LOCKED` lets relays (of this and other daemons) claim disjoint
/// sets without waiting on each other; the row locks last until the relay's transaction ends,
/// so no row is published by two relays at once.
const CLAIM_DUE: &str = "
SELECT id, event_id, event_type, client_id, idempotency_key, payload::text, attempts, created_at
FROM outbox_events
WHERE sent_at IS NULL AND failed_at IS NULL AND next_attempt_at <= now()
ORDER BY next_attempt_at, id
LIMIT $1
FOR UPDATE SKIP LOCKED";

const MARK_SENT: &str =
    "UPDATE outbox_events SET sent_at = now(), last_error = NULL WHERE id = ANY($1)";

/// Failed attempts: count them, schedule the next one, and park the row after `max_attempts`.
const MARK_FAILED: &str = "
UPDATE outbox_events AS o
SET attempts = o.attempts + 1,
    last_error = f.error,
    next_attempt_at = now() + make_interval(secs => f.delay_seconds),
    failed_at = CASE WHEN o.attempts + 1 >= $4 THEN now() END
FROM unnest($1::bigint[], $2::text[], $3::float8[]) AS f(id, error, delay_seconds)
WHERE o.id = f.id";

/// The relay's statements, prepared once per connection.
pub struct RelayStatements {
    claim_due: Statement,
    mark_sent: Statement,
    mark_failed: Statement,
}

impl RelayStatements {
    pub async fn prepare(connection: &mut PgClient) -> Result<Self, StorageError> {
        Ok(Self {
            claim_due: connection.prepare_cached(CLAIM_DUE).await?,
            mark_sent: connection.prepare_cached(MARK_SENT).await?,
            mark_failed: connection.prepare_cached(MARK_FAILED).await?,
        })
    }
}

pub async fn claim_due(
    client: &impl GenericClient,
    statements: &RelayStatements,
    limit: usize,
) -> Result<Vec<PendingEvent>, StorageError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client.query(&statements.claim_due, &[&limit]).await?;
    Ok(rows.iter().map(pending_event).collect())
}

/// An event from a row whose first columns are those `CLAIM_DUE` selects, in its order.
pub fn pending_event(row: &Row) -> PendingEvent {
    PendingEvent {
        id: row.get(0),
        event_id: row.get(1),
        event_type: row.get(2),
        client_id: row.get(3),
        idempotency_key: row.get(4),
        payload: row.get(5),
        attempts: row.get(6),
        created_at: row.get(7),
    }
}

pub async fn mark_sent(
    client: &impl GenericClient,
    statements: &RelayStatements,
    ids: &[i64],
) -> Result<u64, StorageError> {
    if ids.is_empty() {
        return Ok(0);
    }
    Ok(client.execute(&statements.mark_sent, &[&ids]).await?)
}

/// One failed attempt of one row.
pub struct Failure<'a> {
    pub event: &'a PendingEvent,
    pub error: String,
}

pub async fn mark_failed(
    client: &impl GenericClient,
    statements: &RelayStatements,
    failures: &[Failure<'_>],
    max_attempts: i32,
) -> Result<u64, StorageError> {
    if failures.is_empty() {
        return Ok(0);
    }
    let ids: Vec<i64> = failures.iter().map(|f| f.event.id).collect();
    let errors: Vec<&str> = failures.iter().map(|f| f.error.as_str()).collect();
    let delays: Vec<f64> = failures
        .iter()
        .map(|f| retry_delay(f.event.attempts + 1).as_secs_f64())
        .collect();
    Ok(client
        .execute(
            &statements.mark_failed,
            &[&ids, &errors, &delays, &max_attempts],
        )
        .await?)
}

/// First retry delay; doubles with each failed attempt.
const BASE_RETRY_DELAY: Duration = Duration::from_millis(500);
/// Longest delay between two attempts.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(300);

/// Exponential backoff with jitter: the n-th failure waits between half and all of
/// `BASE * 2^(n-1)`, capped at `MAX`, so that events failing together do not retry together.
pub fn retry_delay(failed_attempts: i32) -> Duration {
    let exponent = failed_attempts.clamp(1, 30) as u32 - 1;
    let ceiling = BASE_RETRY_DELAY
        .saturating_mul(1 << exponent.min(20))
        .min(MAX_RETRY_DELAY);
    let jittered = rand::thread_rng().gen_range(0.5..=1.0) * ceiling.as_secs_f64();
    Duration::from_secs_f64(jittered)
}

/// The outbox backlog of one event type.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TypeStatus {
    pub event_type: String,
    pub unsent: i64,
    pub parked: i64,
    /// Age in seconds of the oldest unsent (not parked) event.
    pub oldest_unsent_age_seconds: Option<f64>,
}

const STATUS_BY_TYPE: &str = "
SELECT event_type,
       count(*) FILTER (WHERE failed_at IS NULL) AS unsent,
       count(*) FILTER (WHERE failed_at IS NOT NULL) AS parked,
       extract(epoch FROM now() - min(created_at) FILTER (WHERE failed_at IS NULL))::float8 AS oldest_age
FROM outbox_events
WHERE sent_at IS NULL
GROUP BY event_type
ORDER BY event_type";

/// Unsent and parked events per type; types with neither are not listed.
pub async fn status(client: &impl GenericClient) -> Result<Vec<TypeStatus>, StorageError> {
    Ok(client
        .query(STATUS_BY_TYPE, &[])
        .await?
        .iter()
        .map(|row| TypeStatus {
            event_type: row.get(0),
            unsent: row.get(1),
            parked: row.get(2),
            oldest_unsent_age_seconds: row.get(3),
        })
        .collect())
}

/// Requeues parked events (or one unsent event) for an attempt now, with a fresh attempt count.
const REQUEUE: &str = "
UPDATE outbox_events
SET failed_at = NULL, attempts = 0, next_attempt_at = now()
WHERE sent_at IS NULL AND ($1::uuid IS NULL AND failed_at IS NOT NULL OR event_id = $1)";

/// Requeues every parked event (`event_id` None) or the one unsent event with `event_id`.
pub async fn requeue(
    client: &impl GenericClient,
    event_id: Option<Uuid>,
) -> Result<u64, StorageError> {
    Ok(client.execute(REQUEUE, &[&event_id]).await?)
}

/// The whole outbox's backlog, for metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Totals {
    pub unsent: i64,
    pub parked: i64,
    pub oldest_unsent_age_seconds: Option<f64>,
}

/// Each part matches one partial index (outbox_events_due, outbox_events_parked) exactly, so
/// the figures cost the size of the backlog, not of the table.
const TOTALS: &str = "
SELECT (SELECT count(*) FROM outbox_events WHERE sent_at IS NULL AND failed_at IS NULL),
       (SELECT count(*) FROM outbox_events WHERE sent_at IS NULL AND failed_at IS NOT NULL),
       extract(epoch FROM now() - (SELECT min(created_at) FROM outbox_events
                                   WHERE sent_at IS NULL AND failed_at IS NULL))::float8";

pub async fn totals(client: &impl GenericClient) -> Result<Totals, StorageError> {
    let row = client.query_one(TOTALS, &[]).await?;
    Ok(Totals {
        unsent: row.get(0),
        parked: row.get(1),
        oldest_unsent_age_seconds: row.get(2),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_grow_are_jittered_and_capped() {
        for attempt in 1..=40 {
            let delay = retry_delay(attempt);
            let ceiling = BASE_RETRY_DELAY
                .saturating_mul(1 << (attempt.min(21) - 1))
                .min(MAX_RETRY_DELAY);
            assert!(
                delay <= ceiling && delay >= ceiling / 2,
                "attempt {attempt}: {delay:?}"
            );
        }
        assert!(retry_delay(1) < Duration::from_secs(1));
        assert_eq!(retry_delay(40).max(MAX_RETRY_DELAY), MAX_RETRY_DELAY);
    }
}
