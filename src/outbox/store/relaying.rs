//! Claiming due events for a relay's batch, and recording what became of them: sent, or a
//! failed attempt scheduled by backoff; and the ordering keys moved on.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;
use tokio_postgres::{GenericClient, Row, Statement, ToStatement};
use uuid::Uuid;

use crate::db::outbox_state::{held, not_done, unsent};
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
///
/// The statement also returns the database's `now()`: the time failed attempts are scheduled
/// from ([`mark_failed`]). `$2` names the clients whose events a pass takes (NULL for every
/// client's): every event claimed on Citus is of one shard's clients, since Citus takes row
/// locks (`FOR UPDATE`) on one shard at a time. The filter is written on the events' table and
/// again on the earlier events', so that Citus sees both read one shard; planned with the
/// values (a pass's transaction on Citus, [`crate::db::topology::Pass::begin`]), a NULL `$2`
/// folds away.
const CLAIM_DUE: &str = concat!(
    "
SELECT id, event_id, event_type, client_id, idempotency_key, payload::text, attempts, created_at,
       ordering_key, sequence, traceparent, tracestate, nacks, now()
FROM outbox_events e
WHERE ",
    unsent!("e"),
    " AND e.next_attempt_at <= now()
  AND ($2::text[] IS NULL OR e.client_id = ANY($2))
  AND (e.ordering_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM outbox_events earlier
        WHERE earlier.client_id = e.client_id AND earlier.ordering_key = e.ordering_key
          AND ($2::text[] IS NULL OR earlier.client_id = ANY($2))
          AND earlier.sequence < e.sequence
          AND ",
    not_done!("earlier"),
    " AND earlier.ordering_key IS NOT NULL))
ORDER BY next_attempt_at, id
LIMIT $1
FOR UPDATE SKIP LOCKED"
);

/// `$1` the events, `$2` their clients (on Citus, what routes the statement to their shard).
const MARK_SENT: &str = "UPDATE outbox_events SET sent_at = now(), last_error = NULL
WHERE client_id = ANY($2) AND id = ANY($1)";

/// Failed attempts: count them, schedule the next one, and park the row after `max_attempts`;
/// the error is the last one, and the first one when the event had none (each with the
/// attempt's time, the claim's: what an event's page shows). A row done meanwhile (sent or
/// skipped) is left alone: after a batch whose recording failed (the relay records its publishes as failed
/// attempts in a transaction of its own), another relay may have claimed, published and
/// marked it.
///
/// The next attempt's time is computed by the daemon from the database's `now()` that the
/// claim returned (`$6`) and the backoff: Citus refuses a distributed UPDATE that computes a
/// time from a column with a function (`now() + make_interval(secs => ...)`). `$7`: the
/// events' clients (what routes the statement to their shard on Citus).
const MARK_FAILED: &str = concat!(
    "
UPDATE outbox_events AS o
SET attempts = o.attempts + 1,
    nacks = o.nacks + f.nacked::int,
    last_error = f.error,
    last_error_at = $6::timestamptz,
    first_error = coalesce(o.first_error, f.error),
    first_error_at = coalesce(o.first_error_at, $6::timestamptz),
    next_attempt_at = f.next_attempt_at,
    failed_at = CASE WHEN o.attempts + 1 >= $4 THEN $6::timestamptz END
FROM unnest($1::bigint[], $2::text[], $3::timestamptz[], $5::bool[])
    AS f(id, error, next_attempt_at, nacked)
WHERE o.id = f.id AND ",
    not_done!("o"),
    " AND o.client_id = ANY($7)"
);

/// Locks the `ordering_keys` rows of the given (client, ordering key) pairs, in key order: the
/// order writers lock them in, so that a relay and a writer never wait for each other in a
/// circle. A statement of its own, before [`ADVANCE_KEYS`]: in READ COMMITTED a statement sees
/// what was committed before it started, so the advance, started once the locks are held,
/// sees every write of these keys that committed while this waited.
pub(super) const LOCK_KEYS: &str = "
SELECT 1
FROM ordering_keys k
    JOIN unnest($1::text[], $2::text[]) AS u(client_id, ordering_key) USING (client_id, ordering_key)
WHERE k.client_id = ANY($1)
ORDER BY k.client_id, k.ordering_key
FOR UPDATE OF k";

/// Under the locks of [`LOCK_KEYS`]: moves each key's `done_through` up to just before its
/// lowest unsent (and not skipped) sequence, or to its last sequence when none is unsent, and
/// releases the events of the next sequence if they were held (due at `infinity`, as a writer
/// inserts an event whose key's earlier events were not all done). A writer reads
/// `done_through` from the same locked row, so an event is held exactly when a relay will
/// release it: the writer commits first and this statement sees its rows, or this commits
/// first and the writer sees the new `done_through`.
pub(super) const ADVANCE_KEYS: &str = concat!(
    "
WITH advanced AS (
    UPDATE ordering_keys k
    SET done_through = coalesce(
            (SELECT min(e.sequence) - 1
             FROM outbox_events e
             WHERE e.client_id = k.client_id AND e.ordering_key = k.ordering_key
               AND ",
    not_done!("e"),
    " AND e.ordering_key IS NOT NULL
               AND e.client_id = ANY($1)),
            k.last_sequence)
    FROM unnest($1::text[], $2::text[]) AS u(client_id, ordering_key)
    WHERE k.client_id = u.client_id AND k.ordering_key = u.ordering_key
      AND k.client_id = ANY($1)
    RETURNING k.client_id, k.ordering_key, k.done_through
)
UPDATE outbox_events e
SET next_attempt_at = now()
FROM advanced a
WHERE e.client_id = a.client_id AND e.ordering_key = a.ordering_key
  AND e.sequence = a.done_through + 1
  AND ",
    not_done!("e"),
    " AND e.ordering_key IS NOT NULL
  AND ",
    held!("e"),
    " AND e.client_id = ANY($1)"
);

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
    pub(super) fn of_one(client_id: String, ordering_key: Option<String>) -> Self {
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

/// The ordering keys of the ordered events among `event_ids`, by client and key.
const KEYS_OF_EVENTS: &str = "
SELECT DISTINCT client_id, ordering_key FROM outbox_events
WHERE event_id = ANY($1) AND ordering_key IS NOT NULL
ORDER BY client_id, ordering_key";

/// Locks the `ordering_keys` rows of the ordered events among `event_ids` in (client, key)
/// order, as [`LOCK_KEYS`] does: taken once, before a transaction skips several events one by
/// one, so that it holds its keys in the order writers and relays take them, not in the
/// events' order. A statement per client: on Citus, a statement that takes row locks must
/// read one shard. Returns how many keys it locked.
pub async fn lock_keys_of_events(
    client: &impl GenericClient,
    event_ids: &[Uuid],
) -> Result<u64, StorageError> {
    let rows = client.query(KEYS_OF_EVENTS, &[&event_ids]).await?;
    let mut locked = 0;
    for of_one_client in rows.chunk_by(|a, b| a.get::<_, &str>(0) == b.get::<_, &str>(0)) {
        let keys = OrderingKeys {
            clients: of_one_client.iter().map(|row| row.get(0)).collect(),
            keys: of_one_client.iter().map(|row| row.get(1)).collect(),
        };
        locked += on_keys(client, LOCK_KEYS, &keys).await?;
    }
    Ok(locked)
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
pub(super) async fn on_keys<T: ToStatement + Sync + Send + ?Sized>(
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

/// Events claimed for a batch, and the database's time then.
pub struct Claim {
    pub events: Vec<PendingEvent>,
    /// None when nothing was claimed.
    pub database_now: Option<DateTime<Utc>>,
}

/// Claims up to `limit` due events: of every client, or of `clients` (one shard's, on Citus).
pub async fn claim_due(
    client: &impl GenericClient,
    statements: &RelayStatements,
    limit: usize,
    clients: Option<&[String]>,
) -> Result<Claim, StorageError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client
        .query(&statements.claim_due, &[&limit, &clients])
        .await?;
    Ok(Claim {
        events: rows.iter().map(pending_event).collect(),
        database_now: rows.first().map(|row| row.get(13)),
    })
}

/// The distinct clients of `events`, for the statements that must name them.
pub fn clients_of<'a>(events: impl IntoIterator<Item = &'a PendingEvent>) -> Vec<&'a str> {
    let mut clients: Vec<&str> = events
        .into_iter()
        .map(|event| event.client_id.as_str())
        .collect();
    clients.sort_unstable();
    clients.dedup();
    clients
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
    sent: &[&PendingEvent],
) -> Result<u64, StorageError> {
    if sent.is_empty() {
        return Ok(0);
    }
    let ids: Vec<i64> = sent.iter().map(|event| event.id).collect();
    let clients = clients_of(sent.iter().copied());
    Ok(client
        .execute(&statements.mark_sent, &[&ids, &clients])
        .await?)
}

/// One failed attempt of one row.
pub struct FailedAttempt<'a> {
    pub event: &'a PendingEvent,
    pub error: String,
    /// The broker nacked it: retried on the slower schedule of [`retry_delay_after_nack`].
    pub nacked: bool,
}

/// Records `failures`, each next attempt scheduled by backoff from `database_now` (the time the
/// claim returned).
pub async fn mark_failed(
    client: &impl GenericClient,
    statements: &RelayStatements,
    failures: &[FailedAttempt<'_>],
    (max_attempts, database_now): (i32, DateTime<Utc>),
) -> Result<u64, StorageError> {
    if failures.is_empty() {
        return Ok(0);
    }
    let ids: Vec<i64> = failures.iter().map(|f| f.event.id).collect();
    let errors: Vec<&str> = failures.iter().map(|f| f.error.as_str()).collect();
    let next_attempts: Vec<DateTime<Utc>> = failures
        .iter()
        .map(|f| {
            // A nack backs off by the nacks so far, other failures by every failed attempt.
            let delay = if f.nacked {
                retry_delay_after_nack(f.event.nacks + 1)
            } else {
                retry_delay(f.event.attempts + 1)
            };
            database_now + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX)
        })
        .collect();
    let nacked: Vec<bool> = failures.iter().map(|f| f.nacked).collect();
    let clients = clients_of(failures.iter().map(|f| f.event));
    Ok(client
        .execute(
            &statements.mark_failed,
            &[
                &ids,
                &errors,
                &next_attempts,
                &max_attempts,
                &nacked,
                &database_now,
                &clients,
            ],
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
