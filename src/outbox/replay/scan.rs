//! The selected events, read from the outbox a window of ids at a time: how far the outbox
//! reaches, how many events a plan covers by type, and the next batch to send. Only read: the
//! outbox rows' delivery record stays the relay's.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::EventSet;
use crate::db::outbox_state::{parked, skipped, unsent};
use crate::db::{Database, StorageError};
use crate::outbox::store::{pending_event, PendingEvent};

/// Most outbox ids one statement of a replay looks at: a selection that matches few events
/// walks the table in windows this wide, so that no statement scans far (each stays well inside
/// `database.statement_timeout`), and the resume point moves on even where nothing matched.
const SCAN_WINDOW: i64 = 50_000;

impl EventSet {
    /// `$1` to `$7` of the statements that read the set (`selected_events!`), for the outbox
    /// ids in (`after`, `up_to`].
    fn parameters<'a>(&'a self, after: &'a i64, up_to: &'a i64) -> Vec<&'a (dyn ToSql + Sync)> {
        vec![
            after,
            up_to,
            &self.created_since,
            &self.created_until,
            &self.types,
            &self.clients,
            &self.event,
        ]
    }
}

/// How far the outbox reaches: what is left after the janitor's deletions.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OutboxExtent {
    pub oldest_id: Option<i64>,
    pub newest_id: Option<i64>,
    pub oldest_created_at: Option<DateTime<Utc>>,
    pub newest_created_at: Option<DateTime<Utc>>,
}

/// Both ends read through the primary key: two index probes whatever the table's size. Ids
/// follow creation closely enough for "how far back" (a row's id and created_at are both taken
/// in its write's transaction).
const OUTBOX_EXTENT: &str = "
SELECT o.id, o.created_at, n.id, n.created_at
FROM (SELECT id, created_at FROM outbox_events ORDER BY id LIMIT 1) o
     FULL JOIN (SELECT id, created_at FROM outbox_events ORDER BY id DESC LIMIT 1) n ON true";

pub async fn outbox_extent(db: &Database) -> Result<OutboxExtent, StorageError> {
    db.run(async |connection| {
        let extent = connection
            .query_opt(OUTBOX_EXTENT, &[])
            .await?
            .map(|row| OutboxExtent {
                oldest_id: row.get(0),
                oldest_created_at: row.get(1),
                newest_id: row.get(2),
                newest_created_at: row.get(3),
            });
        Ok(extent.unwrap_or_default())
    })
    .await
}

/// The selected events among outbox ids ($1, $2]: an index range scan of the primary key,
/// filtered. `IS NULL`/`cardinality` let one statement serve every selection; each statement is
/// planned for its own values (unnamed, not cached), so the filters cost nothing when absent.
/// A skipped event is never published, by a replay no more than by a relay.
macro_rules! selected_events {
    () => {
        concat!(
            "
FROM outbox_events
WHERE id > $1 AND id <= $2
  AND ($3::timestamptz IS NULL OR created_at >= $3)
  AND ($4::timestamptz IS NULL OR created_at < $4)
  AND (cardinality($5::text[]) = 0 OR event_type = ANY($5::text[]))
  AND (cardinality($6::text[]) = 0 OR client_id = ANY($6::text[]))
  AND ($7::uuid IS NULL OR event_id = $7)
  AND NOT (",
            skipped!(),
            ")"
        )
    };
}

/// One batch, in id order; the columns are those [`pending_event`] reads. On one server the
/// events of an ordering key are in sequence order too: the writers draw their ids under the
/// key's lock (not so on Citus: see `db::topology::citus::IdBlocks`).
const SELECT_PAGE: &str = concat!(
    "SELECT id, event_id, event_type, client_id, idempotency_key, payload::text, attempts, created_at,
        ordering_key, sequence, traceparent, tracestate, nacks",
    selected_events!(),
    "
ORDER BY id
LIMIT $8"
);

const COUNT_BY_TYPE: &str = concat!(
    "SELECT event_type, count(*),
       count(*) FILTER (WHERE ",
    unsent!(),
    "),
       count(*) FILTER (WHERE ",
    parked!(),
    ")",
    selected_events!(),
    "
GROUP BY event_type"
);

/// The selected events of one event type, among those still to send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TypeCount {
    pub event_type: String,
    pub selected: i64,
    /// Not yet delivered by the relay (it will deliver them too).
    pub unsent: i64,
    /// Parked by the relay after `outbox.max_attempts` failures.
    pub parked: i64,
}

/// Counts the selected events with an id in (`after`, `set.max_event_id`], by type, a window of
/// ids per statement.
pub async fn count(
    db: &Database,
    set: &EventSet,
    after: i64,
) -> Result<Vec<TypeCount>, StorageError> {
    let mut counts: Vec<TypeCount> = Vec::new();
    let mut position = after;
    while position < set.max_event_id {
        let window_end = window_end(db, position, set.max_event_id).await?;
        let parameters = set.parameters(&position, &window_end);
        let rows = db
            .run(async |connection| Ok(connection.query(COUNT_BY_TYPE, &parameters).await?))
            .await?;
        for row in rows {
            let event_type: String = row.get(0);
            let index = match counts.iter().position(|c| c.event_type == event_type) {
                Some(index) => index,
                None => {
                    counts.push(TypeCount {
                        event_type,
                        selected: 0,
                        unsent: 0,
                        parked: 0,
                    });
                    counts.len() - 1
                }
            };
            counts[index].selected += row.get::<_, i64>(1);
            counts[index].unsent += row.get::<_, i64>(2);
            counts[index].parked += row.get::<_, i64>(3);
        }
        position = window_end;
    }
    counts.sort_by(|a, b| a.event_type.cmp(&b.event_type));
    Ok(counts)
}

/// The first outbox id after `$1`, through the index of ids.
const FIRST_ID_AFTER: &str = "SELECT min(id) FROM outbox_events WHERE id > $1";

/// Where the window after `position` ends: [`SCAN_WINDOW`] ids on from the first id after it,
/// at most `max_event_id`. Ids have gaps, which a window steps over in one: the rows deleted
/// after their retention, and, on Citus, between the ids of the coordinator's sequence and those
/// a node's own copy hands out (2^48 apart; used while the coordinator cannot be reached, see
/// `db::topology::citus::IdBlocks`).
async fn window_end(db: &Database, position: i64, max_event_id: i64) -> Result<i64, StorageError> {
    let first: Option<i64> = db
        .run(async |connection| {
            Ok(connection
                .query_one(FIRST_ID_AFTER, &[&position])
                .await?
                .get(0))
        })
        .await?;
    Ok(first.map_or(max_event_id, |first| {
        (first - 1).saturating_add(SCAN_WINDOW).min(max_event_id)
    }))
}

/// The next batch after `position`, and the position after it: the last event's id when the
/// batch is full, else the end of the window looked at.
pub(super) async fn next_page(
    db: &Database,
    set: &EventSet,
    position: i64,
    limit: usize,
) -> Result<(Vec<PendingEvent>, i64), StorageError> {
    let window_end = window_end(db, position, set.max_event_id).await?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut parameters = set.parameters(&position, &window_end);
    parameters.push(&limit);
    let events: Vec<PendingEvent> = db
        .run(async |connection| {
            let rows = connection.query(SELECT_PAGE, &parameters).await?;
            Ok(rows.iter().map(pending_event).collect())
        })
        .await?;
    let next = match events.last() {
        Some(last) if events.len() as i64 == limit => last.id,
        _ => window_end,
    };
    Ok((events, next))
}

const EVENT_OUTBOX_ID: &str = "SELECT id FROM outbox_events WHERE event_id = $1";

/// The outbox id of one event, found through the `event_id` index; None when the outbox does
/// not hold it (never written, or deleted after its retention).
pub(super) async fn event_outbox_id(
    db: &Database,
    event_id: Uuid,
) -> Result<Option<i64>, StorageError> {
    db.run(async |connection| {
        Ok(connection
            .query_opt(EVENT_OUTBOX_ID, &[&event_id])
            .await?
            .map(|row| row.get(0)))
    })
    .await
}
