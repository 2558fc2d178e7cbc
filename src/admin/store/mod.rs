//! What the admin API and the console read and change, on the read pool: the outbox overview,
//! events by filter, the action log, and the actions themselves (retry, skip), recorded with
//! the admin's Idempotency-Key in the transaction that makes them.
//!
//! Every read is bounded: the counts over at most [`GAUGE_COUNT_CAP`] rows (as the gauges),
//! the pages by a limit and a keyset cursor.
//!
//! The reads are here, one event's page in [`event`]; the actions, with their selectors and
//! their record, in [`actions`].

mod actions;
mod event;

pub use actions::*;
pub use event::*;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::db::outbox_state::{held, not_done, parked, sent, skipped, unsent};
use crate::db::{PgClient, StorageError};
use crate::outbox::store::{self, Blocked, BlockingEvent, ParkedGroup, Totals, GAUGE_COUNT_CAP};

/// The backlog of one event type, counted over at most [`GAUGE_COUNT_CAP`] unsent events.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TypeBacklog {
    pub event_type: String,
    pub unsent: i64,
    pub parked: i64,
}

/// Unsent and parked events by type, over at most [`GAUGE_COUNT_CAP`] rows of each: past it,
/// lower bounds. Each side reads its own partial index (`outbox_events_due`, the relays';
/// `outbox_events_parked`), so that neither walks the sent rows: one scan of "sent_at IS NULL"
/// read the whole table to find a backlog at its end (2.2 s at 3 million rows, bench/admin).
const BACKLOG_BY_TYPE: &str = concat!(
    "
SELECT event_type, sum(unsent)::bigint, sum(parked)::bigint
FROM (SELECT event_type, 1 AS unsent, 0 AS parked
      FROM (SELECT event_type FROM outbox_events
            WHERE ",
    unsent!(),
    "
            LIMIT $1) AS due
      UNION ALL
      SELECT event_type, 0, 1
      FROM (SELECT event_type FROM outbox_events
            WHERE ",
    parked!(),
    "
            LIMIT $1) AS parked) AS backlog
GROUP BY event_type
ORDER BY event_type"
);

pub async fn backlog_by_type(
    client: &impl GenericClient,
) -> Result<Vec<TypeBacklog>, StorageError> {
    Ok(client
        .query(BACKLOG_BY_TYPE, &[&GAUGE_COUNT_CAP])
        .await?
        .iter()
        .map(|row| TypeBacklog {
            event_type: row.get(0),
            unsent: row.get(1),
            parked: row.get(2),
        })
        .collect())
}

/// What the overview reads from the database, in one transaction (one snapshot).
pub struct OutboxFigures {
    /// The database's time of the snapshot.
    pub now: DateTime<Utc>,
    pub totals: Totals,
    pub by_type: Vec<TypeBacklog>,
    pub parked_groups: Vec<ParkedGroup>,
    pub blocked: Blocked,
    pub blocking: Vec<BlockingEvent>,
}

pub async fn outbox_figures(connection: &mut PgClient) -> Result<OutboxFigures, StorageError> {
    let transaction = connection
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let figures = OutboxFigures {
        now: store::database_now(&transaction).await?,
        totals: store::totals(&transaction).await?,
        by_type: backlog_by_type(&transaction).await?,
        parked_groups: store::parked_groups(&transaction).await?,
        blocked: store::blocked(&transaction).await?,
        blocking: store::blocking_events(&transaction).await?,
    };
    transaction.commit().await?;
    Ok(figures)
}

/// The delivery states an event is listed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EventState {
    /// Given up on after `outbox.max_attempts` (or nacked for good): waits for an operator.
    Parked,
    /// Not sent yet, not parked: the relays have it.
    Unsent,
    Sent,
    /// Given up on by an operator: never published.
    Skipped,
}

impl EventState {
    pub const ALL: [EventState; 4] = [
        EventState::Parked,
        EventState::Unsent,
        EventState::Sent,
        EventState::Skipped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventState::Parked => "parked",
            EventState::Unsent => "unsent",
            EventState::Sent => "sent",
            EventState::Skipped => "skipped",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == text)
    }

    /// The state's condition (parked and skipped rows are in `outbox_events_parked`, so that
    /// their pages read that small index).
    fn condition(self) -> &'static str {
        match self {
            EventState::Parked => parked!(),
            EventState::Unsent => unsent!(),
            EventState::Sent => sent!(),
            EventState::Skipped => skipped!(),
        }
    }

    /// The order a page walks the state's rows in, each through the state's own index. Parked
    /// and skipped rows newest first (`outbox_events_parked`, by id). Sent rows by the time
    /// they were sent, the last sent first (`outbox_events_sent`, the janitor's): in id order
    /// a walk through the primary key passed every unsent and parked row first, and those are
    /// the newest (265 ms past 120,000 of them, where a page now takes 1 ms; bench/admin).
    /// Unsent rows in the order relays take them, the next due first and those held behind
    /// their ordering key (due at `infinity`) last (`outbox_events_due`, the relays'): in id
    /// order the walk passed every parked row newer than the newest unsent one (98 ms past
    /// 420,000 on an outbox of 3 million, where a page now takes 1.2 ms; docs/reliability.md).
    /// The id breaks ties: a relay marks a whole batch sent at one time, and a writer's events
    /// are due at one time.
    fn order(self) -> &'static str {
        match self {
            EventState::Sent => "sent_at DESC, id DESC",
            EventState::Unsent => "next_attempt_at, id",
            EventState::Parked | EventState::Skipped => "id DESC",
        }
    }

    /// Where a page starts: after the row of the cursor (`$6`, an outbox id) in [`Self::order`].
    /// For sent and unsent rows the cursor's time is read from its row (the primary key). A
    /// sent cursor whose row the janitor has deleted since had only rows sent earlier after
    /// it, deleted with it or before, so that the page is empty and the listing ends. An
    /// unsent row's next attempt moves when it fails an attempt: the next page goes on from
    /// where its cursor is due now (the order of a live queue).
    fn after_cursor(self) -> &'static str {
        match self {
            EventState::Sent => {
                "($6::bigint IS NULL
                  OR (sent_at, id) < ((SELECT cursor.sent_at FROM outbox_events cursor
                                       WHERE cursor.id = $6), $6))"
            }
            EventState::Unsent => {
                "($6::bigint IS NULL
                  OR (next_attempt_at, id) > ((SELECT cursor.next_attempt_at
                                               FROM outbox_events cursor
                                               WHERE cursor.id = $6), $6))"
            }
            EventState::Parked | EventState::Skipped => "($6::bigint IS NULL OR id < $6)",
        }
    }

    /// The statement `template` for this state: its condition, order and cursor in place.
    fn statement(self, template: &str) -> String {
        template
            .replace("{filters}", FILTERS)
            .replace("{order}", self.order())
            .replace("{condition}", self.condition())
            .replace("{after_cursor}", self.after_cursor())
    }
}

/// Whether a row matches an [`EventFilter`] (`$1` to `$5`).
const FILTERS: &str = "($1::text IS NULL OR event_type = $1)
               AND ($2::text IS NULL OR client_id = $2)
               AND ($3::text IS NULL OR coalesce(last_error, '') = $3)
               AND ($4::timestamptz IS NULL OR created_at > $4)
               AND ($5::timestamptz IS NULL OR created_at < $5)";

/// Which events a page lists: every criterion given must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventFilter {
    pub state: EventState,
    pub event_type: Option<String>,
    pub client: Option<String>,
    /// The exact last error (a parked group).
    pub error: Option<String>,
    pub created_after: Option<DateTime<Utc>>,
    pub created_before: Option<DateTime<Utc>>,
}

/// One event as the admin API lists it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ListedEvent {
    pub event_id: Uuid,
    pub event_type: String,
    pub client_id: String,
    pub idempotency_key: String,
    pub state: EventState,
    pub created_at: DateTime<Utc>,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub sent_at: Option<DateTime<Utc>>,
    pub failed_at: Option<DateTime<Utc>>,
    pub skipped_at: Option<DateTime<Utc>>,
    /// When a relay tries it next; null while sent, parked, or held behind its ordering key.
    pub next_attempt_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence: Option<i64>,
    /// For an unsent (or parked) event of an ordering key: the earlier event of its key it
    /// waits for, when there is one; null otherwise.
    pub waits_for: Option<WaitsFor>,
    /// The event's body as published.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    /// The keyset position (outbox id): pages go on from the last one's.
    #[serde(skip)]
    pub position: i64,
}

/// What an event of an ordering key waits for: the first unsent event of its key before it
/// (the key's head). A relay publishes it only once that one is sent or skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct WaitsFor {
    pub event_id: Uuid,
    /// The head is parked: the key is held back until it is retried or skipped.
    pub parked: bool,
}

/// The columns of a [`ListedEvent`] of the row `o`, read by [`listed_event`].
const LISTED_COLUMNS: &str = concat!(
    "
       o.id, o.event_id, o.event_type, o.client_id, o.idempotency_key, o.created_at,
       o.attempts, o.last_error, o.sent_at, o.failed_at, o.skipped_at,
       CASE WHEN ",
    unsent!("o"),
    " AND NOT ",
    held!("o"),
    "
            THEN o.next_attempt_at END AS next_attempt_at,
       o.ordering_key, o.sequence, o.payload::text AS payload"
);

/// The head of each ordering key's place `$1..$3` (client, ordering key, sequence of an event
/// not done, by its position): the first event of the key with a lower sequence that is
/// neither sent nor skipped, and whether it is parked. A probe of
/// `outbox_events_ordered_unsent` each; on Citus, each on its client's shard (a join of the
/// places with the events by `client_id`, which Citus runs on each shard).
const HEADS: &str = concat!(
    "
SELECT DISTINCT ON (w.position) w.position, head.event_id, ",
    parked!("head"),
    "
FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY
        AS w(client_id, ordering_key, sequence, position)
    JOIN outbox_events head
        ON head.client_id = w.client_id AND head.ordering_key = w.ordering_key
       AND head.sequence < w.sequence
WHERE head.client_id = ANY($1) AND ",
    not_done!("head"),
    " AND head.ordering_key IS NOT NULL
ORDER BY w.position, head.sequence, head.id"
);

/// Tells each of `events` that is of an ordering key and not done what it waits for, if
/// anything: its key's head ([`HEADS`]), in one statement for them all.
async fn fill_waits_for(
    client: &impl GenericClient,
    events: &mut [ListedEvent],
) -> Result<(), StorageError> {
    let waiting: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, event)| {
            event.ordering_key.is_some()
                && matches!(event.state, EventState::Unsent | EventState::Parked)
        })
        .map(|(index, _)| index)
        .collect();
    if waiting.is_empty() {
        return Ok(());
    }
    let clients: Vec<&str> = waiting
        .iter()
        .map(|&i| events[i].client_id.as_str())
        .collect();
    let keys: Vec<Option<&str>> = waiting
        .iter()
        .map(|&i| events[i].ordering_key.as_deref())
        .collect();
    let sequences: Vec<Option<i64>> = waiting.iter().map(|&i| events[i].sequence).collect();
    let heads = client.query(HEADS, &[&clients, &keys, &sequences]).await?;
    for head in heads {
        let position = usize::try_from(head.get::<_, i64>(0) - 1).ok();
        if let Some(&index) = position.and_then(|position| waiting.get(position)) {
            events[index].waits_for = Some(WaitsFor {
                event_id: head.get(1),
                parked: head.get(2),
            });
        }
    }
    Ok(())
}

/// A row of [`LISTED_COLUMNS`].
fn listed_event(row: &tokio_postgres::Row) -> Result<ListedEvent, StorageError> {
    let payload: String = row.get("payload");
    let sent_at: Option<DateTime<Utc>> = row.get("sent_at");
    let failed_at: Option<DateTime<Utc>> = row.get("failed_at");
    let skipped_at: Option<DateTime<Utc>> = row.get("skipped_at");
    let state = match (sent_at, failed_at, skipped_at) {
        (Some(_), _, _) => EventState::Sent,
        (None, _, Some(_)) => EventState::Skipped,
        (None, Some(_), None) => EventState::Parked,
        (None, None, None) => EventState::Unsent,
    };
    Ok(ListedEvent {
        position: row.get("id"),
        event_id: row.get("event_id"),
        event_type: row.get("event_type"),
        client_id: row.get("client_id"),
        idempotency_key: row.get("idempotency_key"),
        state,
        created_at: row.get("created_at"),
        attempts: row.get("attempts"),
        last_error: row.get("last_error"),
        sent_at,
        failed_at,
        skipped_at,
        next_attempt_at: row.get("next_attempt_at"),
        ordering_key: row.get("ordering_key"),
        sequence: row.get("sequence"),
        // Told by `fill_waits_for`.
        waits_for: None,
        payload: serde_json::from_str(&payload).map_err(|error| {
            StorageError::from(anyhow::anyhow!("an event's payload is not JSON: {error}"))
        })?,
    })
}

/// Rows of its state a page walks at most, for each event it may hold (its limit): 1,000 for
/// the default page of 50, 10,000 for the largest (500). The filters (type, client, error,
/// created time) are checked on the rows walked, so that a page reads at most 20 times its
/// size however few rows a filter matches, and whatever the outbox's size: one that matches
/// fewer than a page within the walk ends the page there, partial, and the next page goes on
/// from where it stopped. An index per filter would make those pages full, at the price of one
/// more index written for every event a relay marks sent; event types are few (`entry.created`,
/// `audit.entry.created`), and the longest walk, 10,000 rows, takes 10 ms on an outbox of
/// 3 million (bench/admin, a type that matches nothing), where it took 1.3 s to find none.
pub const WALK_PER_EVENT: i64 = 20;

/// A page of events and where its walk stopped.
pub struct EventsPage {
    pub events: Vec<ListedEvent>,
    /// The position of the walk's last row, when the walk stopped at its cap
    /// ([`WALK_PER_EVENT`] times the limit): where the next page goes on from if this one is
    /// not full.
    pub walk_ended_at: Option<i64>,
}

/// A page of events of one state ([`EventState::order`]), after the cursor `$6`: a walk of at
/// most `$8` ([`WALK_PER_EVENT`] times the limit) rows of the state, through the state's own
/// index, numbered (`walked`), then the filters (`matched`). It returns the rows that match,
/// up to `$7`, and the walk's last row whether or not it matches, so that a walk that stopped
/// at its cap says where. The outer
/// query neither sorts nor aggregates, so that the planner plans the walk for the `$7` rows a
/// page takes when nothing is filtered (and the walk keeps its order); the window function
/// streams, reading no row past the page.
const EVENTS_PAGE: &str = "
SELECT {columns}, o.matched, o.walked
FROM (SELECT *, {filters} AS matched, row_number() OVER (ORDER BY {order}) AS walked
      FROM outbox_events
      WHERE {condition} AND {after_cursor}
      ORDER BY {order}
      LIMIT $8) AS o
WHERE o.matched OR o.walked = $8
LIMIT $7";

/// A page of events in their state's order, from `before` (an outbox id, exclusive).
pub async fn events_page(
    client: &impl GenericClient,
    filter: &EventFilter,
    before: Option<i64>,
    limit: i64,
) -> Result<EventsPage, StorageError> {
    let walk = limit * WALK_PER_EVENT;
    let query = filter
        .state
        .statement(EVENTS_PAGE)
        .replace("{columns}", LISTED_COLUMNS);
    let rows = client
        .query(
            &query,
            &[
                &filter.event_type,
                &filter.client,
                &filter.error,
                &filter.created_after,
                &filter.created_before,
                &before,
                &limit,
                &walk,
            ],
        )
        .await?;
    let mut page = EventsPage {
        events: Vec::with_capacity(rows.len()),
        walk_ended_at: None,
    };
    for row in &rows {
        if row.get::<_, i64>("walked") == walk {
            page.walk_ended_at = Some(row.get("id"));
        }
        if row.get("matched") {
            page.events.push(listed_event(row)?);
        }
    }
    fill_waits_for(client, &mut page.events).await?;
    Ok(page)
}

/// How many events a filter matches, as the console's list says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatchCount {
    pub matched: i64,
    /// The count stopped at [`GAUGE_COUNT_CAP`] rows of the state: at least `matched` match.
    pub capped: bool,
}

/// The events of a state that match the filters among at most `$6` ([`GAUGE_COUNT_CAP`]) of
/// the state's rows, walked in the pages' order through the state's index: bounded as the
/// overview's counts are, whatever the outbox's size or how few rows the filters match.
const EVENTS_MATCHED: &str = "
SELECT count(*) FILTER (WHERE matched), count(*)
FROM (SELECT {filters} AS matched
      FROM outbox_events
      WHERE {condition}
      ORDER BY {order}
      LIMIT $6) AS walk";

/// How many events `filter` matches, counted over at most [`GAUGE_COUNT_CAP`] of its state's.
pub async fn count_events(
    client: &impl GenericClient,
    filter: &EventFilter,
) -> Result<MatchCount, StorageError> {
    let row = client
        .query_one(
            &filter.state.statement(EVENTS_MATCHED),
            &[
                &filter.event_type,
                &filter.client,
                &filter.error,
                &filter.created_after,
                &filter.created_before,
                &GAUGE_COUNT_CAP,
            ],
        )
        .await?;
    let walked: i64 = row.get(1);
    Ok(MatchCount {
        matched: row.get(0),
        capped: walked >= GAUGE_COUNT_CAP,
    })
}

/// One admin action as the log lists it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct LoggedAction {
    pub id: i64,
    pub admin_id: String,
    pub action: String,
    #[schema(value_type = Object)]
    pub selector: serde_json::Value,
    pub changed: i64,
    pub created_at: DateTime<Utc>,
}

/// A page of the action log, newest first, from `before` (an action id, exclusive).
pub async fn actions_page(
    client: &impl GenericClient,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<LoggedAction>, StorageError> {
    client
        .query(
            "SELECT id, admin_id, action, selector::text, changed, created_at
             FROM admin_actions
             WHERE $1::bigint IS NULL OR id < $1
             ORDER BY id DESC
             LIMIT $2",
            &[&before, &limit],
        )
        .await?
        .iter()
        .map(|row| {
            let selector: String = row.get(3);
            Ok(LoggedAction {
                id: row.get(0),
                admin_id: row.get(1),
                action: row.get(2),
                selector: serde_json::from_str(&selector).map_err(|error| {
                    StorageError::from(anyhow::anyhow!("a stored selector is not JSON: {error}"))
                })?,
                changed: row.get(4),
                created_at: row.get(5),
            })
        })
        .collect()
}
