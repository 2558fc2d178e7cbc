//! The outbox table as the relay and the admin commands see it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;
use tokio_postgres::{GenericClient, Row, Statement, ToStatement};
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
    /// Of those failed attempts, the ones the broker nacked.
    pub nacks: i32,
    pub created_at: DateTime<Utc>,
    /// The write's ordering key and its sequence among the key's writes; None when unordered.
    pub ordering_key: Option<String>,
    pub sequence: Option<i64>,
    /// The W3C trace context of the write that made it.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

/// Due rows, oldest first. `SKIP LOCKED` lets relays (of this and other daemons) claim disjoint
/// sets without waiting on each other; the row locks last until the relay's transaction ends,
/// so no row is published by two relays at once.
///
/// Why an event of an ordering key can never be claimed before an earlier one of its key was
/// confirmed: it is claimed only when no event of the key with a lower sequence is unsent (and
/// not skipped), and `sent_at` is set only in the transaction that saw the broker's confirm. A
/// lower sequence is an earlier commit, since writers number a key's writes under its row lock
/// (see the writer's `CLAIM_AND_INSERT`): whenever this statement's snapshot sees an event, it
/// sees every earlier event of its key, sent or not. Order comes from `sequence`, never from
/// `id`: a bigserial is drawn when a row is inserted, not when it commits, so across keys and
/// without a lock a later id can commit first. The check holds whatever relays, daemons,
/// retries, backoff or an operator's `UPDATE ... next_attempt_at` do; the events of one write
/// share a sequence and go together. Held events (due at `infinity`, see `ADVANCE_KEYS`) are
/// also outside the due range, so a long queue behind a parked head costs the scan nothing;
/// unordered rows skip the check (`ordering_key IS NULL`), and it is one probe of
/// outbox_events_ordered_unsent for an ordered one.
const CLAIM_DUE: &str = "
SELECT id, event_id, event_type, client_id, idempotency_key, payload::text, attempts, created_at,
       ordering_key, sequence, traceparent, tracestate, nacks
FROM outbox_events e
WHERE sent_at IS NULL AND failed_at IS NULL AND next_attempt_at <= now()
  AND (e.ordering_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM outbox_events earlier
        WHERE earlier.client_id = e.client_id AND earlier.ordering_key = e.ordering_key
          AND earlier.sequence < e.sequence
          AND earlier.sent_at IS NULL AND earlier.skipped_at IS NULL
          AND earlier.ordering_key IS NOT NULL))
ORDER BY next_attempt_at, id
LIMIT $1
FOR UPDATE SKIP LOCKED";

const MARK_SENT: &str =
    "UPDATE outbox_events SET sent_at = now(), last_error = NULL WHERE id = ANY($1)";

/// Failed attempts: count them, schedule the next one, and park the row after `max_attempts`.
/// A row sent meanwhile is left alone: after a batch whose recording failed (the relay records
/// its publishes as failed attempts in a transaction of its own), another relay may have
/// claimed, published and marked it.
const MARK_FAILED: &str = "
UPDATE outbox_events AS o
SET attempts = o.attempts + 1,
    nacks = o.nacks + f.nacked::int,
    last_error = f.error,
    next_attempt_at = now() + make_interval(secs => f.delay_seconds),
    failed_at = CASE WHEN o.attempts + 1 >= $4 THEN now() END
FROM unnest($1::bigint[], $2::text[], $3::float8[], $5::bool[])
    AS f(id, error, delay_seconds, nacked)
WHERE o.id = f.id AND o.sent_at IS NULL";

/// Locks the `ordering_keys` rows of the given (client, ordering key) pairs, in key order: the
/// order writers lock them in, so that a relay and a writer never wait for each other in a
/// circle. A statement of its own, before [`ADVANCE_KEYS`]: in READ COMMITTED a statement sees
/// what was committed before it started, so the advance, started once the locks are held,
/// sees every write of these keys that committed while this waited.
const LOCK_KEYS: &str = "
SELECT 1
FROM ordering_keys k
    JOIN unnest($1::text[], $2::text[]) AS u(client_id, ordering_key) USING (client_id, ordering_key)
ORDER BY k.client_id, k.ordering_key
FOR UPDATE OF k";

/// Under the locks of [`LOCK_KEYS`]: moves each key's `done_through` up to just before its
/// lowest unsent (and not skipped) sequence, or to its last sequence when none is unsent, and
/// releases the events of the next sequence if they were held (due at `infinity`, as a writer
/// inserts an event whose key's earlier events were not all done). A writer reads
/// `done_through` from the same locked row, so an event is held exactly when a relay will
/// release it: the writer commits first and this statement sees its rows, or this commits
/// first and the writer sees the new `done_through`.
const ADVANCE_KEYS: &str = "
WITH advanced AS (
    UPDATE ordering_keys k
    SET done_through = coalesce(
            (SELECT min(e.sequence) - 1
             FROM outbox_events e
             WHERE e.client_id = k.client_id AND e.ordering_key = k.ordering_key
               AND e.sent_at IS NULL AND e.skipped_at IS NULL AND e.ordering_key IS NOT NULL),
            k.last_sequence)
    FROM unnest($1::text[], $2::text[]) AS u(client_id, ordering_key)
    WHERE k.client_id = u.client_id AND k.ordering_key = u.ordering_key
    RETURNING k.client_id, k.ordering_key, k.done_through
)
UPDATE outbox_events e
SET next_attempt_at = now()
FROM advanced a
WHERE e.client_id = a.client_id AND e.ordering_key = a.ordering_key
  AND e.sequence = a.done_through + 1
  AND e.sent_at IS NULL AND e.skipped_at IS NULL AND e.ordering_key IS NOT NULL
  AND e.next_attempt_at = 'infinity'";

/// The relay's statements, prepared once per connection.
pub struct RelayStatements {
    /// Whether the batch's publishes must wait for a synchronous standby
    /// ([`crate::db::barrier`]).
    pub replication_promised: Statement,
    claim_due: Statement,
    mark_sent: Statement,
    mark_failed: Statement,
    lock_keys: Statement,
    advance_keys: Statement,
}

impl RelayStatements {
    pub async fn prepare(connection: &mut PgClient) -> Result<Self, StorageError> {
        Ok(Self {
            replication_promised: connection
                .prepare_cached(crate::db::REPLICATION_PROMISED)
                .await?,
            claim_due: connection.prepare_cached(CLAIM_DUE).await?,
            mark_sent: connection.prepare_cached(MARK_SENT).await?,
            mark_failed: connection.prepare_cached(MARK_FAILED).await?,
            lock_keys: connection.prepare_cached(LOCK_KEYS).await?,
            advance_keys: connection.prepare_cached(ADVANCE_KEYS).await?,
        })
    }
}

/// Ordering keys, as the `$1`/`$2` arrays of [`LOCK_KEYS`] and [`ADVANCE_KEYS`]: each pair once.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OrderingKeys {
    clients: Vec<String>,
    keys: Vec<String>,
}

impl OrderingKeys {
    /// The keys of the ordered events among `events`.
    pub fn of<'a>(events: impl IntoIterator<Item = &'a PendingEvent>) -> Self {
        let pairs: std::collections::BTreeSet<(&str, &str)> = events
            .into_iter()
            .filter_map(|event| Some((event.client_id.as_str(), event.ordering_key.as_deref()?)))
            .collect();
        Self {
            clients: pairs
                .iter()
                .map(|(client, _)| (*client).to_owned())
                .collect(),
            keys: pairs.iter().map(|(_, key)| (*key).to_owned()).collect(),
        }
    }

    /// One key, or none for an unordered event.
    fn of_one(client_id: String, ordering_key: Option<String>) -> Self {
        match ordering_key {
            Some(key) => Self {
                clients: vec![client_id],
                keys: vec![key],
            },
            None => Self::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Locks the keys' rows ([`LOCK_KEYS`]); with [`advance_keys`] after it, in one transaction.
pub async fn lock_keys(
    client: &impl GenericClient,
    statements: &RelayStatements,
    keys: &OrderingKeys,
) -> Result<u64, StorageError> {
    on_keys(client, &statements.lock_keys, keys).await
}

/// Locks the `ordering_keys` rows of the ordered events among `event_ids`, in key order (as
/// [`LOCK_KEYS`] does): taken once, before a transaction skips several events one by one, so
/// that it holds its keys in the order writers and relays take them, not in the events' order.
const LOCK_KEYS_OF_EVENTS: &str = "
SELECT 1
FROM ordering_keys k
WHERE (k.client_id, k.ordering_key) IN (
    SELECT client_id, ordering_key FROM outbox_events
    WHERE event_id = ANY($1) AND ordering_key IS NOT NULL)
ORDER BY k.client_id, k.ordering_key
FOR UPDATE OF k";

pub async fn lock_keys_of_events(
    client: &impl GenericClient,
    event_ids: &[Uuid],
) -> Result<u64, StorageError> {
    Ok(client.execute(LOCK_KEYS_OF_EVENTS, &[&event_ids]).await?)
}

/// Moves the keys on past what is sent or skipped and releases their next events
/// ([`ADVANCE_KEYS`]); returns how many events it released.
pub async fn advance_keys(
    client: &impl GenericClient,
    statements: &RelayStatements,
    keys: &OrderingKeys,
) -> Result<u64, StorageError> {
    on_keys(client, &statements.advance_keys, keys).await
}

/// Runs a statement whose `$1` and `$2` are the keys' clients and ordering keys; nothing for
/// no keys.
async fn on_keys<T: ToStatement + Sync + Send + ?Sized>(
    client: &impl GenericClient,
    statement: &T,
    keys: &OrderingKeys,
) -> Result<u64, StorageError> {
    if keys.is_empty() {
        return Ok(0);
    }
    Ok(client
        .execute(statement, &[&keys.clients, &keys.keys])
        .await?)
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
        ordering_key: row.get(8),
        sequence: row.get(9),
        traceparent: row.get(10),
        tracestate: row.get(11),
        nacks: row.get(12),
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
pub struct FailedAttempt<'a> {
    pub event: &'a PendingEvent,
    pub error: String,
    /// The broker nacked it: retried on the slower schedule of [`retry_delay_after_nack`].
    pub nacked: bool,
}

pub async fn mark_failed(
    client: &impl GenericClient,
    statements: &RelayStatements,
    failures: &[FailedAttempt<'_>],
    max_attempts: i32,
) -> Result<u64, StorageError> {
    if failures.is_empty() {
        return Ok(0);
    }
    let ids: Vec<i64> = failures.iter().map(|f| f.event.id).collect();
    let errors: Vec<&str> = failures.iter().map(|f| f.error.as_str()).collect();
    let delays: Vec<f64> = failures
        .iter()
        .map(|f| {
            // A nack backs off by the nacks so far, other failures by every failed attempt.
            let delay = if f.nacked {
                retry_delay_after_nack(f.event.nacks + 1)
            } else {
                retry_delay(f.event.attempts + 1)
            };
            delay.as_secs_f64()
        })
        .collect();
    let nacked: Vec<bool> = failures.iter().map(|f| f.nacked).collect();
    Ok(client
        .execute(
            &statements.mark_failed,
            &[&ids, &errors, &delays, &max_attempts, &nacked],
        )
        .await?)
}

/// First retry delay; doubles with each failed attempt.
const BASE_RETRY_DELAY: Duration = Duration::from_millis(500);
/// Longest delay between two attempts.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(300);

/// First retry delay after a nack, and the longest. A nack comes from a queue that refused the
/// message (full, with `x-overflow = reject-publish`), while every other queue bound for its
/// type may have taken it: each retry is one more copy for those. So a nack backs off much
/// more slowly than a lost connection or a missing route, which cost no one else anything:
/// a queue full for 10 minutes gets about 5 attempts, not 11; for an hour, about 8, not 20.
const BASE_NACK_DELAY: Duration = Duration::from_secs(30);
const MAX_NACK_DELAY: Duration = Duration::from_secs(30 * 60);

/// Exponential backoff with jitter: the n-th failure waits between half and all of
/// `BASE * 2^(n-1)`, capped at `MAX`, so that events failing together do not retry together.
pub fn retry_delay(failed_attempts: i32) -> Duration {
    backoff(failed_attempts, BASE_RETRY_DELAY, MAX_RETRY_DELAY)
}

/// [`retry_delay`] for an attempt the broker nacked: the same shape, on a slower schedule
/// ([`BASE_NACK_DELAY`]), doubling with the event's `nacks` (this one included), not with all
/// its failed attempts: failures that cost no queue a copy do not slow it down.
pub fn retry_delay_after_nack(nacks: i32) -> Duration {
    backoff(nacks, BASE_NACK_DELAY, MAX_NACK_DELAY)
}

fn backoff(failed_attempts: i32, base: Duration, max: Duration) -> Duration {
    let exponent = failed_attempts.clamp(1, 30) as u32 - 1;
    let ceiling = base.saturating_mul(1 << exponent.min(20)).min(max);
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
WHERE sent_at IS NULL AND skipped_at IS NULL
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

/// Parked events that share a last error and an event type: what `outbox status` lists, so
/// that an operator can requeue a group (`outbox retry --error ... --type ...`) once its cause
/// is fixed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ParkedGroup {
    pub event_type: String,
    pub last_error: String,
    pub parked: i64,
    pub first_parked_at: DateTime<Utc>,
    pub last_parked_at: DateTime<Utc>,
}

/// At most this many groups are listed (the largest).
pub const PARKED_GROUPS_SHOWN: i64 = 20;

/// Through the partial index of parked rows, over at most [`GAUGE_COUNT_CAP`] of them (the
/// oldest), so that the cost is bounded however many are parked: past the cap the counts are
/// lower bounds.
const PARKED_GROUPS: &str = "
SELECT event_type, coalesce(last_error, ''), count(*), min(failed_at), max(failed_at)
FROM (SELECT event_type, last_error, failed_at
      FROM outbox_events
      WHERE sent_at IS NULL AND failed_at IS NOT NULL AND skipped_at IS NULL
      ORDER BY id
      LIMIT $2) AS parked
GROUP BY event_type, last_error
ORDER BY count(*) DESC, event_type
LIMIT $1";

pub async fn parked_groups(client: &impl GenericClient) -> Result<Vec<ParkedGroup>, StorageError> {
    Ok(client
        .query(PARKED_GROUPS, &[&PARKED_GROUPS_SHOWN, &GAUGE_COUNT_CAP])
        .await?
        .iter()
        .map(|row| ParkedGroup {
            event_type: row.get(0),
            last_error: row.get(1),
            parked: row.get(2),
            first_parked_at: row.get(3),
            last_parked_at: row.get(4),
        })
        .collect())
}

/// Requeues one unsent event (parked or not) for an attempt now, with a fresh attempt count;
/// not a skipped one (given up on for good), nor one held behind earlier events of its
/// ordering key (it is released when they are done).
const REQUEUE_EVENTS: &str = "
UPDATE outbox_events
SET failed_at = NULL, attempts = 0, nacks = 0, next_attempt_at = now()
WHERE sent_at IS NULL AND skipped_at IS NULL AND next_attempt_at <> 'infinity'
  AND event_id = ANY($1)";

/// Requeues the unsent event with `event_id`; false when there is none.
pub async fn requeue_event(
    client: &impl GenericClient,
    event_id: Uuid,
) -> Result<bool, StorageError> {
    Ok(requeue_events(client, &[event_id]).await? > 0)
}

/// Requeues the unsent events among `event_ids` (parked or not); returns how many.
pub async fn requeue_events(
    client: &impl GenericClient,
    event_ids: &[Uuid],
) -> Result<u64, StorageError> {
    Ok(client.execute(REQUEUE_EVENTS, &[&event_ids]).await?)
}

/// Which parked events to requeue: every criterion given must hold; none given is every parked
/// event (callers ask for that explicitly).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParkedSelection {
    /// Of one of these event types (any when empty).
    pub types: Vec<String>,
    /// Of one of these clients (any when empty).
    pub clients: Vec<String>,
    /// Whose last error contains this text.
    pub error: Option<String>,
    /// Parked at or after this time (on the database's clock).
    pub parked_since: Option<DateTime<Utc>>,
    /// Whose last error is exactly this text (a group of `outbox status` and the console).
    pub error_is: Option<String>,
    /// Created after this time (exclusive).
    pub created_after: Option<DateTime<Utc>>,
    /// Created before this time (exclusive).
    pub created_before: Option<DateTime<Utc>>,
}

/// The parked rows a [`ParkedSelection`] picks, through the partial index of parked rows
/// (outbox_events_parked), in id order.
const PARKED_SELECTED: &str = "
SELECT id, event_type
FROM outbox_events
WHERE sent_at IS NULL AND failed_at IS NOT NULL AND skipped_at IS NULL
  AND (cardinality($1::text[]) = 0 OR event_type = ANY($1))
  AND (cardinality($2::text[]) = 0 OR client_id = ANY($2))
  AND ($3::text IS NULL OR strpos(last_error, $3) > 0)
  AND ($4::timestamptz IS NULL OR failed_at >= $4)
  AND ($5::text IS NULL OR coalesce(last_error, '') = $5)
  AND ($6::timestamptz IS NULL OR created_at > $6)
  AND ($7::timestamptz IS NULL OR created_at < $7)";

/// Requeues the selected parked events with a fresh attempt count, due one after another at
/// `$5` events per second from now (all at once when null): a consumer whose queue has room for
/// a hundred is not handed thousands at once, to park them again. Rows that changed since they
/// were selected (sent, or requeued by someone else) are left alone.
const REQUEUE_PARKED: &str = "
WITH selected AS (
    SELECT id, row_number() OVER (ORDER BY id) - 1 AS position
    FROM (SELECT id FROM outbox_events
          WHERE sent_at IS NULL AND failed_at IS NOT NULL AND skipped_at IS NULL
            AND (cardinality($1::text[]) = 0 OR event_type = ANY($1))
            AND (cardinality($2::text[]) = 0 OR client_id = ANY($2))
            AND ($3::text IS NULL OR strpos(last_error, $3) > 0)
            AND ($4::timestamptz IS NULL OR failed_at >= $4)
            AND ($5::text IS NULL OR coalesce(last_error, '') = $5)
            AND ($6::timestamptz IS NULL OR created_at > $6)
            AND ($7::timestamptz IS NULL OR created_at < $7)) AS parked
)
UPDATE outbox_events o
SET failed_at = NULL, attempts = 0, nacks = 0,
    next_attempt_at = now() + CASE WHEN $8::float8 IS NULL THEN interval '0'
                                   ELSE make_interval(secs => s.position / $8::float8) END
FROM selected s
WHERE o.id = s.id AND o.sent_at IS NULL AND o.failed_at IS NOT NULL AND o.skipped_at IS NULL";

impl ParkedSelection {
    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 7] {
        [
            &self.types,
            &self.clients,
            &self.error,
            &self.parked_since,
            &self.error_is,
            &self.created_after,
            &self.created_before,
        ]
    }
}

/// How many parked events `selection` picks, by event type (what a dry run shows).
pub async fn count_parked(
    client: &impl GenericClient,
    selection: &ParkedSelection,
) -> Result<Vec<(String, i64)>, StorageError> {
    let counted = format!(
        "SELECT event_type, count(*) FROM ({PARKED_SELECTED}) AS picked GROUP BY event_type ORDER BY event_type"
    );
    Ok(client
        .query(&counted, &selection.params())
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect())
}

/// How many parked events `selection` picks, counted up to `cap` (through the partial index of
/// parked rows, stopping there): at the cap, at least that many.
pub async fn count_parked_up_to(
    client: &impl GenericClient,
    selection: &ParkedSelection,
    cap: i64,
) -> Result<i64, StorageError> {
    let counted = format!("SELECT count(*) FROM ({PARKED_SELECTED} LIMIT $8) AS picked");
    let [types, clients, error, since, error_is, after, before] = selection.params();
    Ok(client
        .query_one(
            &counted,
            &[types, clients, error, since, error_is, after, before, &cap],
        )
        .await?
        .get(0))
}

/// Requeues the parked events `selection` picks, at most `rate` a second from now (at once
/// without one); returns how many.
pub async fn requeue_parked(
    client: &impl GenericClient,
    selection: &ParkedSelection,
    rate: Option<f64>,
) -> Result<u64, StorageError> {
    let [types, clients, error, since, error_is, after, before] = selection.params();
    Ok(client
        .execute(
            REQUEUE_PARKED,
            &[types, clients, error, since, error_is, after, before, &rate],
        )
        .await?)
}

/// The event ids of at most `limit` parked events `selection` picks, oldest first.
pub async fn parked_event_ids(
    client: &impl GenericClient,
    selection: &ParkedSelection,
    limit: i64,
) -> Result<Vec<Uuid>, StorageError> {
    let picked = format!(
        "SELECT o.event_id FROM ({PARKED_SELECTED}) AS picked JOIN outbox_events o ON o.id = picked.id ORDER BY picked.id LIMIT {limit}"
    );
    Ok(client
        .query(&picked, &selection.params())
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect())
}

/// The database's time now: what relative times (`--since 24h`) are counted back from.
pub async fn database_now(client: &impl GenericClient) -> Result<DateTime<Utc>, StorageError> {
    Ok(client.query_one("SELECT now()", &[]).await?.get(0))
}

/// The whole outbox's backlog, for metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Totals {
    /// Exact up to [`GAUGE_COUNT_CAP`]; at it, at least that many.
    pub unsent: i64,
    /// Exact up to [`GAUGE_COUNT_CAP`]; at it, at least that many.
    pub parked: i64,
    /// Of the [`GAUGE_COUNT_CAP`] unsent events due first: exact while the backlog is smaller
    /// (the oldest unsent event is then among them), a lower bound beyond.
    pub oldest_unsent_age_seconds: Option<f64>,
}

/// The outbox gauges count at most this many rows each, so that a refresh costs the same
/// whatever the backlog: at 300,000 unsent events on an outbox of 5 million rows, 113 ms (21 ms
/// once vacuum had set the visibility map), where counting them all took 560 ms (116 ms), and
/// that grows with the backlog (bench/scale's database; BENCHMARKS.md).
pub const GAUGE_COUNT_CAP: i64 = 100_000;

/// Each part reads one partial index (outbox_events_due, outbox_events_parked) and stops
/// after `$1` rows of it.
const TOTALS: &str = "
SELECT (SELECT count(*) FROM (SELECT 1 FROM outbox_events
                              WHERE sent_at IS NULL AND failed_at IS NULL LIMIT $1) unsent),
       (SELECT count(*) FROM (SELECT 1 FROM outbox_events
                              WHERE sent_at IS NULL AND failed_at IS NOT NULL
                                AND skipped_at IS NULL LIMIT $1) parked),
       extract(epoch FROM now() - (SELECT min(created_at) FROM (
           SELECT created_at FROM outbox_events WHERE sent_at IS NULL AND failed_at IS NULL
           ORDER BY next_attempt_at, id LIMIT $1) due_first))::float8";

pub async fn totals(client: &impl GenericClient) -> Result<Totals, StorageError> {
    let row = client.query_one(TOTALS, &[&GAUGE_COUNT_CAP]).await?;
    Ok(Totals {
        unsent: row.get(0),
        parked: row.get(1),
        oldest_unsent_age_seconds: row.get(2),
    })
}

/// What parked events hold back: the unsent events of their ordering keys behind them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Blocked {
    /// Unsent events with a parked event of their key before them.
    pub events: i64,
    /// Keys whose head (lowest unsent sequence) is parked and has events behind it.
    pub keys: i64,
}

/// From the parked rows (their partial index) to the unsent events behind each in its key
/// (outbox_events_ordered_unsent): as cheap as parked and blocked events are few.
macro_rules! parked_and_what_they_block {
    () => {
        "
FROM outbox_events parked
    JOIN outbox_events later
        ON later.client_id = parked.client_id AND later.ordering_key = parked.ordering_key
       AND later.sequence > parked.sequence
       AND later.sent_at IS NULL AND later.skipped_at IS NULL AND later.ordering_key IS NOT NULL
WHERE parked.sent_at IS NULL AND parked.failed_at IS NOT NULL AND parked.skipped_at IS NULL
  AND parked.ordering_key IS NOT NULL"
    };
}

/// Counts at most [`GAUGE_COUNT_CAP`] blocked events (and the keys among them), as the totals
/// do.
const BLOCKED: &str = concat!(
    "SELECT count(DISTINCT id), count(DISTINCT (client_id, ordering_key)) FROM (
SELECT later.id, later.client_id, later.ordering_key",
    parked_and_what_they_block!(),
    "
LIMIT $1) blocked"
);

pub async fn blocked(client: &impl GenericClient) -> Result<Blocked, StorageError> {
    let row = client.query_one(BLOCKED, &[&GAUGE_COUNT_CAP]).await?;
    Ok(Blocked {
        events: row.get(0),
        keys: row.get(1),
    })
}

/// A parked event that holds back later events of its ordering key.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BlockingEvent {
    pub event_id: Uuid,
    pub event_type: String,
    pub client_id: String,
    pub ordering_key: String,
    pub sequence: i64,
    /// Unsent events of the key behind it.
    pub blocked: i64,
    pub last_error: String,
}

/// At most this many blocking events are listed (those holding back the most).
pub const BLOCKING_SHOWN: i64 = 20;

const BLOCKING_EVENTS: &str = concat!(
    "SELECT parked.event_id, parked.event_type, parked.client_id, parked.ordering_key,
       parked.sequence, count(*), coalesce(parked.last_error, '')",
    parked_and_what_they_block!(),
    "
GROUP BY parked.client_id, parked.id
ORDER BY count(*) DESC, parked.id
LIMIT $1"
);

/// The parked events that block the most, for `outbox status`: each one to retry or skip.
pub async fn blocking_events(
    client: &impl GenericClient,
) -> Result<Vec<BlockingEvent>, StorageError> {
    Ok(client
        .query(BLOCKING_EVENTS, &[&BLOCKING_SHOWN])
        .await?
        .iter()
        .map(|row| BlockingEvent {
            event_id: row.get(0),
            event_type: row.get(1),
            client_id: row.get(2),
            ordering_key: row.get(3),
            sequence: row.get(4),
            blocked: row.get(5),
            last_error: row.get(6),
        })
        .collect())
}

/// The event as `outbox skip` finds it, under its key's lock (when it has one) and its own.
const SKIP_CANDIDATE: &str = "
SELECT event_type, client_id, ordering_key, sequence, sent_at IS NOT NULL, skipped_at IS NOT NULL
FROM outbox_events
WHERE event_id = $1
FOR UPDATE NOWAIT";

/// Gives up on the event: never published, out of the relays' reach (failed_at), recorded
/// with who (the OS user id given, or the admin's id; the session's role) and why.
const SKIP: &str = "
WITH skipped AS (
    UPDATE outbox_events
    SET skipped_at = now(), failed_at = coalesce(failed_at, now())
    WHERE event_id = $1 AND sent_at IS NULL AND skipped_at IS NULL
    RETURNING event_id, event_type, client_id, ordering_key, sequence
)
INSERT INTO outbox_skips (event_id, event_type, client_id, ordering_key, sequence,
                          requested_uid, requested_db_user, reason, admin_id)
SELECT event_id, event_type, client_id, ordering_key, sequence, $2, current_user, $3, $4
FROM skipped";

/// What `outbox skip` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    Skipped {
        event_type: String,
        client_id: String,
        ordering_key: Option<String>,
        sequence: Option<i64>,
        /// Events of the key released by the skip: the next write's, now due.
        released: u64,
    },
    NotFound,
    AlreadySent,
    AlreadySkipped,
    /// A relay holds the event (it is being published): try again in a moment.
    Busy,
}

/// Skips one event, in one transaction. The key's row is locked before the event's (the
/// order relays take them in); the event's lock is taken without waiting, since a relay that
/// holds it may be waiting for the key's: the caller tries again.
pub async fn skip_event(
    connection: &mut PgClient,
    event_id: Uuid,
    requested_uid: i64,
    reason: &str,
) -> Result<Skip, StorageError> {
    let mut transaction = connection.transaction().await?;
    let who = SkippedBy::User(requested_uid);
    let skip = skip_in(&mut transaction, event_id, who, reason).await?;
    transaction.commit().await?;
    Ok(skip)
}

/// Who asks for a skip, as `outbox_skips` records it.
#[derive(Debug, Clone, Copy)]
pub enum SkippedBy<'a> {
    /// `retrysafe outbox skip`: the operating-system user id of the command.
    User(i64),
    /// The admin API or the console: the admin's id.
    Admin(&'a str),
}

/// [`skip_event`] inside `outer`, in a savepoint of its own: an event a relay holds (Busy) or
/// any other outcome but a skip leaves `outer` as it was and usable.
pub async fn skip_in(
    outer: &mut tokio_postgres::Transaction<'_>,
    event_id: Uuid,
    who: SkippedBy<'_>,
    reason: &str,
) -> Result<Skip, StorageError> {
    let (requested_uid, admin_id) = match who {
        SkippedBy::User(uid) => (Some(uid), None),
        SkippedBy::Admin(admin) => (None, Some(admin)),
    };
    let transaction = outer.transaction().await?;
    let Some(found) = transaction
        .query_opt(
            "SELECT client_id, ordering_key FROM outbox_events WHERE event_id = $1",
            &[&event_id],
        )
        .await?
    else {
        return Ok(Skip::NotFound);
    };
    let keys = OrderingKeys::of_one(found.get(0), found.get(1));
    on_keys(&transaction, LOCK_KEYS, &keys).await?;
    let candidate = match transaction.query_one(SKIP_CANDIDATE, &[&event_id]).await {
        Ok(row) => row,
        Err(error)
            if error.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) =>
        {
            return Ok(Skip::Busy);
        }
        Err(error) => return Err(error.into()),
    };
    if candidate.get::<_, bool>(4) {
        return Ok(Skip::AlreadySent);
    }
    if candidate.get::<_, bool>(5) {
        return Ok(Skip::AlreadySkipped);
    }
    transaction
        .execute(SKIP, &[&event_id, &requested_uid, &reason, &admin_id])
        .await?;
    let released = on_keys(&transaction, ADVANCE_KEYS, &keys).await?;
    transaction.commit().await?;
    Ok(Skip::Skipped {
        event_type: candidate.get(0),
        client_id: candidate.get(1),
        ordering_key: candidate.get(2),
        sequence: candidate.get(3),
        released,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_grow_are_jittered_and_capped() {
        let schedules = [
            (
                retry_delay as fn(i32) -> Duration,
                BASE_RETRY_DELAY,
                MAX_RETRY_DELAY,
            ),
            (retry_delay_after_nack, BASE_NACK_DELAY, MAX_NACK_DELAY),
        ];
        for (delay_of, base, max) in schedules {
            for attempt in 1..=40 {
                let delay = delay_of(attempt);
                let ceiling = base.saturating_mul(1 << (attempt.min(21) - 1)).min(max);
                assert!(
                    delay <= ceiling && delay >= ceiling / 2,
                    "attempt {attempt}: {delay:?}"
                );
            }
        }
        assert!(retry_delay(1) < Duration::from_secs(1));
        assert_eq!(retry_delay(40).max(MAX_RETRY_DELAY), MAX_RETRY_DELAY);
    }

    #[test]
    fn a_nack_backs_off_on_a_slower_schedule() {
        for attempt in 1..=40 {
            assert!(
                retry_delay_after_nack(attempt) >= retry_delay(attempt).min(MAX_RETRY_DELAY / 2)
            );
        }
        assert!(retry_delay_after_nack(1) >= Duration::from_secs(15));
        // The copies a queue full for ten minutes costs every other bound queue: attempts
        // whose earliest start falls within the ten minutes (each delay at least half its
        // ceiling), first attempt included.
        let mut at = Duration::ZERO;
        let mut attempts = 1;
        while let Some(next) = at.checked_add(
            BASE_NACK_DELAY
                .saturating_mul(1 << (attempts - 1).min(20))
                .min(MAX_NACK_DELAY)
                / 2,
        ) {
            if next > Duration::from_secs(600) {
                break;
            }
            at = next;
            attempts += 1;
        }
        assert!(attempts <= 6, "{attempts} copies in ten minutes at most");
    }
}
