//! What waits in the outbox: the backlog by type, the totals behind the gauges, the events
//! held behind parked ones. Every count is bounded ([`GAUGE_COUNT_CAP`]) so that a refresh costs
//! the same whatever the backlog.

use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::db::outbox_state::{not_done, parked, unsent};
use crate::db::StorageError;

/// The outbox backlog of one event type.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TypeStatus {
    pub event_type: String,
    pub unsent: i64,
    pub parked: i64,
    /// Age in seconds of the oldest unsent (not parked) event.
    pub oldest_unsent_age_seconds: Option<f64>,
}

const STATUS_BY_TYPE: &str = concat!(
    "
SELECT event_type,
       count(*) FILTER (WHERE ",
    unsent!(),
    ") AS unsent,
       count(*) FILTER (WHERE ",
    parked!(),
    ") AS parked,
       extract(epoch FROM now() - min(created_at) FILTER (WHERE ",
    unsent!(),
    "))::float8 AS oldest_age
FROM outbox_events
WHERE ",
    not_done!(),
    "
GROUP BY event_type
ORDER BY event_type"
);

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

/// The unsent and the parked events, each counted up to `$1`: two columns of a `SELECT`, each
/// reading one partial index (outbox_events_due, outbox_events_parked) and stopping after `$1`
/// rows of it. What the gauges and the console's history both count.
macro_rules! capped_backlog {
    () => {
        concat!(
            "(SELECT count(*) FROM (SELECT 1 FROM outbox_events WHERE ",
            $crate::db::outbox_state::unsent!(),
            " LIMIT $1) unsent),
       (SELECT count(*) FROM (SELECT 1 FROM outbox_events WHERE ",
            $crate::db::outbox_state::parked!(),
            " LIMIT $1) parked)"
        )
    };
}
pub(crate) use capped_backlog;

/// The backlog ([`capped_backlog!`]) and the age of the oldest of the `$1` unsent events due
/// first.
const TOTALS: &str = concat!(
    "
SELECT ",
    capped_backlog!(),
    ",
       extract(epoch FROM now() - (SELECT min(created_at) FROM (
           SELECT created_at FROM outbox_events WHERE ",
    unsent!(),
    "
           ORDER BY next_attempt_at, id LIMIT $1) due_first))::float8"
);

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
        concat!(
            "
FROM outbox_events parked
    JOIN outbox_events later
        ON later.client_id = parked.client_id AND later.ordering_key = parked.ordering_key
       AND later.sequence > parked.sequence
       AND ",
            not_done!("later"),
            " AND later.ordering_key IS NOT NULL
WHERE ",
            parked!("parked"),
            " AND parked.ordering_key IS NOT NULL"
        )
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
