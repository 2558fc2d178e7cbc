//! What operators do to parked (and other unsent) events: list their groups, requeue them by
//! selection, skip one for good.

use chrono::{DateTime, Utc};
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::db::outbox_state::{held, not_done, parked, sent, skipped};
use crate::db::{PgClient, StorageError};
use crate::outbox::store::relaying::{on_keys, OrderingKeys, ADVANCE_KEYS, LOCK_KEYS};
use crate::outbox::store::GAUGE_COUNT_CAP;

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
const PARKED_GROUPS: &str = concat!(
    "
SELECT event_type, coalesce(last_error, ''), count(*), min(failed_at), max(failed_at)
FROM (SELECT event_type, last_error, failed_at
      FROM outbox_events
      WHERE ",
    parked!(),
    "
      ORDER BY id
      LIMIT $2) AS parked
GROUP BY event_type, last_error
ORDER BY count(*) DESC, event_type
LIMIT $1"
);

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
const REQUEUE_EVENTS: &str = concat!(
    "
UPDATE outbox_events
SET failed_at = NULL, attempts = 0, nacks = 0, next_attempt_at = now()
WHERE ",
    not_done!(),
    " AND NOT ",
    held!(),
    "
  AND event_id = ANY($1)"
);

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
/// (outbox_events_parked).
const PARKED_SELECTED: &str = concat!(
    "
SELECT id, event_type, event_id, client_id
FROM outbox_events
WHERE ",
    parked!(),
    "
  AND (cardinality($1::text[]) = 0 OR event_type = ANY($1))
  AND (cardinality($2::text[]) = 0 OR client_id = ANY($2))
  AND ($3::text IS NULL OR strpos(last_error, $3) > 0)
  AND ($4::timestamptz IS NULL OR failed_at >= $4)
  AND ($5::text IS NULL OR coalesce(last_error, '') = $5)
  AND ($6::timestamptz IS NULL OR created_at > $6)
  AND ($7::timestamptz IS NULL OR created_at < $7)"
);

/// Requeues the picked parked events (`$1` their clients, `$2` their ids) with a fresh attempt
/// count, each due at its time in `$3`. Rows that changed since they were picked (sent, or
/// requeued by someone else) are left alone. The clients are named, so that on Citus the
/// statement reads only their shards.
const REQUEUE_PICKED: &str = concat!(
    "
UPDATE outbox_events o
SET failed_at = NULL, attempts = 0, nacks = 0, next_attempt_at = s.due
FROM unnest($1::text[], $2::bigint[], $3::timestamptz[]) AS s(client_id, id, due)
WHERE o.client_id = s.client_id AND o.id = s.id AND o.client_id = ANY($1)
  AND ",
    parked!("o")
);

/// Parked events are requeued this many at a time (picked in id order, then updated by id).
const REQUEUE_CHUNK: i64 = 5_000;

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

/// Requeues the parked events `selection` picks, oldest first, at most `rate` a second from now
/// (all due now without one): a consumer whose queue has room for a hundred is not handed
/// thousands at once, to park them again. Returns how many. The due times are counted from the
/// database's time, read once; the events are picked and updated [`REQUEUE_CHUNK`] at a time
/// (on Citus a distributed `UPDATE` may not compute a time from a row's column), all in the
/// caller's transaction.
pub async fn requeue_parked(
    client: &impl GenericClient,
    selection: &ParkedSelection,
    rate: Option<f64>,
) -> Result<u64, StorageError> {
    let now = database_now(client).await?;
    let picked = format!("{PARKED_SELECTED} AND id > $8 ORDER BY id LIMIT $9");
    let [types, clients, error, since, error_is, after, before] = selection.params();
    let (mut last_id, mut position, mut requeued) = (0_i64, 0_u64, 0);
    loop {
        let rows = client
            .query(
                &picked,
                &[
                    types,
                    clients,
                    error,
                    since,
                    error_is,
                    after,
                    before,
                    &last_id,
                    &REQUEUE_CHUNK,
                ],
            )
            .await?;
        let Some(last) = rows.last() else { break };
        last_id = last.get(0);
        let ids: Vec<i64> = rows.iter().map(|row| row.get(0)).collect();
        let of_clients: Vec<String> = rows.iter().map(|row| row.get(3)).collect();
        let due: Vec<DateTime<Utc>> = (position..position + rows.len() as u64)
            .map(|position| match rate {
                Some(rate) => {
                    now + chrono::Duration::microseconds((position as f64 / rate * 1e6) as i64)
                }
                None => now,
            })
            .collect();
        position += rows.len() as u64;
        requeued += client
            .execute(REQUEUE_PICKED, &[&of_clients, &ids, &due])
            .await?;
        if (rows.len() as i64) < REQUEUE_CHUNK {
            break;
        }
    }
    Ok(requeued)
}

/// The event ids of at most `limit` parked events `selection` picks, oldest first.
pub async fn parked_event_ids(
    client: &impl GenericClient,
    selection: &ParkedSelection,
    limit: i64,
) -> Result<Vec<Uuid>, StorageError> {
    let picked = format!("{PARKED_SELECTED} ORDER BY id LIMIT {limit}");
    Ok(client
        .query(&picked, &selection.params())
        .await?
        .iter()
        .map(|row| row.get(2))
        .collect())
}

/// The database's time now: what relative times (`--since 24h`) are counted back from.
pub async fn database_now(client: &impl GenericClient) -> Result<DateTime<Utc>, StorageError> {
    Ok(client.query_one("SELECT now()", &[]).await?.get(0))
}

/// The event as `outbox skip` finds it, under its key's lock (when it has one) and its own.
/// Its client is named, so that on Citus the lock is taken on its shard alone.
const SKIP_CANDIDATE: &str = concat!(
    "
SELECT event_type, client_id, ordering_key, sequence, ",
    sent!(),
    ", ",
    skipped!(),
    "
FROM outbox_events
WHERE event_id = $1 AND client_id = $2
FOR UPDATE NOWAIT"
);

/// Gives up on the event: never published, out of the relays' reach (failed_at), recorded
/// with who (the OS user id given, or the admin's id; the session's role) and why. `$6` is the
/// database's time (Citus takes no `now()` beside a column in a distributed `UPDATE`).
const SKIP: &str = concat!(
    "
WITH skipped AS (
    UPDATE outbox_events
    SET skipped_at = $6, failed_at = coalesce(failed_at, $6)
    WHERE event_id = $1 AND client_id = $5 AND ",
    not_done!(),
    "
    RETURNING event_id, event_type, client_id, ordering_key, sequence
)
INSERT INTO outbox_skips (event_id, event_type, client_id, ordering_key, sequence,
                          requested_uid, requested_db_user, reason, admin_id)
SELECT event_id, event_type, client_id, ordering_key, sequence, $2, current_user, $3, $4
FROM skipped"
);

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
    let client_id: String = found.get(0);
    let keys = OrderingKeys::of_one(client_id.clone(), found.get(1));
    on_keys(&transaction, LOCK_KEYS, &keys).await?;
    let candidate = match transaction
        .query_one(SKIP_CANDIDATE, &[&event_id, &client_id])
        .await
    {
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
    let now = database_now(&transaction).await?;
    transaction
        .execute(
            SKIP,
            &[
                &event_id,
                &requested_uid,
                &reason,
                &admin_id,
                &client_id,
                &now,
            ],
        )
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
