//! What the admin API and the console read and change, on the read pool: the outbox overview,
//! events by filter, the action log, and the actions themselves (retry, skip), recorded with
//! the admin's Idempotency-Key in the transaction that makes them.
//!
//! Every read is bounded: the counts over at most [`GAUGE_COUNT_CAP`] rows (as the gauges),
//! the pages by a limit and a keyset cursor.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::db::{PgClient, StorageError};
use crate::idempotency::Verdict;
use crate::outbox::store::{
    self, Blocked, BlockingEvent, ParkedGroup, ParkedSelection, Skip, SkippedBy, Totals,
    GAUGE_COUNT_CAP,
};

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
const BACKLOG_BY_TYPE: &str = "
SELECT event_type, sum(unsent)::bigint, sum(parked)::bigint
FROM (SELECT event_type, 1 AS unsent, 0 AS parked
      FROM (SELECT event_type FROM outbox_events
            WHERE sent_at IS NULL AND failed_at IS NULL
            LIMIT $1) AS due
      UNION ALL
      SELECT event_type, 0, 1
      FROM (SELECT event_type FROM outbox_events
            WHERE sent_at IS NULL AND failed_at IS NOT NULL AND skipped_at IS NULL
            LIMIT $1) AS parked) AS backlog
GROUP BY event_type
ORDER BY event_type";

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

    /// The state's condition, written as the partial indexes are (parked and skipped rows are
    /// in `outbox_events_parked`, so that their pages read that small index).
    fn condition(self) -> &'static str {
        match self {
            EventState::Parked => {
                "sent_at IS NULL AND failed_at IS NOT NULL AND skipped_at IS NULL"
            }
            EventState::Unsent => "sent_at IS NULL AND failed_at IS NULL",
            EventState::Sent => "sent_at IS NOT NULL",
            EventState::Skipped => {
                "sent_at IS NULL AND failed_at IS NOT NULL AND skipped_at IS NOT NULL"
            }
        }
    }

    /// The order a page walks the state's rows in, newest first. Sent rows go by the time they
    /// were sent, through their partial index (`outbox_events_sent`, the janitor's): in id
    /// order a walk through the primary key passed every unsent and parked row first, and
    /// those are the newest (265 ms past 120,000 of them, where a page now takes 1 ms;
    /// bench/admin). The id breaks ties: a relay marks a whole batch sent at one time.
    fn order(self) -> &'static str {
        match self {
            EventState::Sent => "sent_at DESC, id DESC",
            _ => "id DESC",
        }
    }

    /// Where a page starts: after the row of the cursor (`$6`, an outbox id) in [`Self::order`].
    /// For sent rows the cursor's time is read from its row (the primary key); a cursor whose
    /// row the janitor has deleted since had only rows sent earlier after it, deleted with it
    /// or before, so that the page is empty and the listing ends.
    fn after_cursor(self) -> &'static str {
        match self {
            EventState::Sent => {
                "($6::bigint IS NULL
                  OR (sent_at, id) < ((SELECT cursor.sent_at FROM outbox_events cursor
                                       WHERE cursor.id = $6), $6))"
            }
            _ => "($6::bigint IS NULL OR id < $6)",
        }
    }
}

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
    /// The event's body as published.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    /// The keyset position (outbox id): pages go on from the last one's.
    #[serde(skip)]
    pub position: i64,
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

/// A page of events of one state, newest first ([`EventState::order`]), after the cursor `$6`:
/// a walk of at most `$8` ([`WALK_PER_EVENT`] times the limit) rows of the state, through the
/// state's own index, numbered (`walked`), then the filters (`matched`). It returns the rows
/// that match, up to `$7`, and the walk's last row whether or not it matches, so that a walk
/// that stopped at its cap says where. The outer query neither sorts nor aggregates, so that
/// the planner plans the walk for the `$7` rows a page takes when nothing is filtered (and the
/// walk keeps its order); the window function streams, reading no row past the page.
const EVENTS_PAGE: &str = "
SELECT id, event_id, event_type, client_id, idempotency_key, created_at, attempts,
       last_error, sent_at, failed_at, skipped_at,
       CASE WHEN sent_at IS NULL AND failed_at IS NULL AND next_attempt_at <> 'infinity'
            THEN next_attempt_at END,
       ordering_key, sequence, payload::text, matched, walked
FROM (SELECT id, event_id, event_type, client_id, idempotency_key, created_at, attempts,
             last_error, sent_at, failed_at, skipped_at, next_attempt_at, ordering_key,
             sequence, payload,
             ($1::text IS NULL OR event_type = $1)
               AND ($2::text IS NULL OR client_id = $2)
               AND ($3::text IS NULL OR coalesce(last_error, '') = $3)
               AND ($4::timestamptz IS NULL OR created_at > $4)
               AND ($5::timestamptz IS NULL OR created_at < $5) AS matched,
             row_number() OVER (ORDER BY {order}) AS walked
      FROM outbox_events
      WHERE {condition} AND {after_cursor}
      ORDER BY {order}
      LIMIT $8) AS walk
WHERE matched OR walked = $8
LIMIT $7";

/// A page of events, newest first, from `before` (an outbox id, exclusive).
pub async fn events_page(
    client: &impl GenericClient,
    filter: &EventFilter,
    before: Option<i64>,
    limit: i64,
) -> Result<EventsPage, StorageError> {
    let state = filter.state;
    let walk = limit * WALK_PER_EVENT;
    let query = EVENTS_PAGE
        .replace("{order}", state.order())
        .replace("{condition}", state.condition())
        .replace("{after_cursor}", state.after_cursor());
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
        let position: i64 = row.get(0);
        let walked: i64 = row.get(16);
        if walked == walk {
            page.walk_ended_at = Some(position);
        }
        let matched: bool = row.get(15);
        if !matched {
            continue;
        }
        let payload: String = row.get(14);
        let sent_at: Option<DateTime<Utc>> = row.get(8);
        let failed_at: Option<DateTime<Utc>> = row.get(9);
        let skipped_at: Option<DateTime<Utc>> = row.get(10);
        let state = match (sent_at, failed_at, skipped_at) {
            (Some(_), _, _) => EventState::Sent,
            (None, _, Some(_)) => EventState::Skipped,
            (None, Some(_), None) => EventState::Parked,
            (None, None, None) => EventState::Unsent,
        };
        page.events.push(ListedEvent {
            position,
            event_id: row.get(1),
            event_type: row.get(2),
            client_id: row.get(3),
            idempotency_key: row.get(4),
            state,
            created_at: row.get(5),
            attempts: row.get(6),
            last_error: row.get(7),
            sent_at,
            failed_at,
            skipped_at,
            next_attempt_at: row.get(11),
            ordering_key: row.get(12),
            sequence: row.get(13),
            payload: serde_json::from_str(&payload).map_err(|error| {
                StorageError::from(anyhow::anyhow!("an event's payload is not JSON: {error}"))
            })?,
        });
    }
    Ok(page)
}

/// What an admin action applies to: some events by id, or the parked events that match every
/// filter given. Nothing given matches every parked event, which must be said (`all`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Selector {
    /// These events (up to 1,000), whatever their filters: for a retry, each unsent one
    /// (parked or not); for a skip, each unsent one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_ids: Vec<Uuid>,
    /// Parked events of this type.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// Parked events of this client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// Parked events whose last error is exactly this (a group of the overview).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Parked events created after this time (RFC 3339, exclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_after: Option<DateTime<Utc>>,
    /// Parked events created before this time (RFC 3339, exclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_before: Option<DateTime<Utc>>,
    /// Says that a selector without ids or filters means every parked event.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
}

/// Event ids one selector may name.
pub const MAX_EVENT_IDS: usize = 1000;
/// Events one skip may change: a skip is for good, so a larger one is refused (narrow it); and
/// each is a few round trips, all within one transaction and its time limit
/// (`database.statement_timeout`), holding the events' ordering keys meanwhile.
pub const MAX_SKIPPED_AT_ONCE: i64 = 100;

impl Selector {
    fn has_filters(&self) -> bool {
        self.event_type.is_some()
            || self.client.is_some()
            || self.error.is_some()
            || self.created_after.is_some()
            || self.created_before.is_some()
    }

    /// What is wrong with it, in words for the admin; None when it may be acted on.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.event_ids.is_empty() {
            if self.has_filters() || self.all {
                problems.push("event_ids: name events, or filter them (type, client, error, created_after, created_before, all), not both".into());
            }
            if self.event_ids.len() > MAX_EVENT_IDS {
                problems.push(format!("event_ids: at most {MAX_EVENT_IDS} at once"));
            }
        } else if !self.has_filters() && !self.all {
            problems.push("the selector matches every parked event; send \"all\": true to mean that, or narrow it with event_ids, type, client, error, created_after or created_before".into());
        }
        let text = |name: &str, value: &Option<String>, max: usize, problems: &mut Vec<String>| {
            if let Some(value) = value {
                if value.is_empty() || value.len() > max || value.contains('\0') {
                    problems.push(format!("{name}: 1 to {max} bytes, without NUL"));
                }
            }
        };
        text("type", &self.event_type, 255, &mut problems);
        text("error", &self.error, 4096, &mut problems);
        if let Some(client) = &self.client {
            if !crate::config::is_valid_client_id(client) {
                problems.push("client: 1 to 64 of a-z A-Z 0-9 . _ -".into());
            }
        }
        for (name, time) in [
            ("created_after", self.created_after),
            ("created_before", self.created_before),
        ] {
            // PostgreSQL takes other years than RFC 3339's four digits, but not all that
            // chrono reads (a signed year of six digits): refused here, not by the database.
            if time.is_some_and(|time| !(1..=9999).contains(&chrono::Datelike::year(&time))) {
                problems.push(format!("{name}: a year from 1 to 9999"));
            }
        }
        if let (Some(after), Some(before)) = (self.created_after, self.created_before) {
            if after >= before {
                problems.push("created_after: must be before created_before".into());
            }
        }
        problems
    }

    fn parked(&self) -> ParkedSelection {
        ParkedSelection {
            types: self.event_type.iter().cloned().collect(),
            clients: self.client.iter().cloned().collect(),
            error_is: self.error.clone(),
            created_after: self.created_after,
            created_before: self.created_before,
            ..ParkedSelection::default()
        }
    }
}

/// What an admin may do to events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Requeue for delivery, with a fresh attempt count.
    Retry,
    /// Give up on for good: never published; an ordering key goes on past it.
    Skip,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Skip => "skip",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [Action::Retry, Action::Skip]
            .into_iter()
            .find(|action| action.as_str() == text)
    }
}

/// What an action did (or, for a dry run, would do): the answer of the admin POST, stored with
/// its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ActionOutcome {
    /// The action's row in the log (`GET /admin/v1/actions`); null for a dry run.
    pub action_id: Option<i64>,
    pub action: Action,
    pub admin_id: String,
    pub selector: Selector,
    /// Events the selector matched when the action ran. Parked events picked by filters are
    /// counted up to 100,000 (as the overview's counts): see `matched_capped`.
    pub matched: i64,
    /// True when the count of `matched` stopped at its cap: at least that many match (a retry
    /// answers at least as many as it changed). A retry still requeues every one, in one
    /// statement within `database.statement_timeout`; past it nothing changes (narrow the
    /// selector by created_after and created_before, or use `retrysafe outbox retry`).
    #[serde(default)]
    pub matched_capped: bool,
    /// Events it changed: requeued, or skipped. Less than `matched` when some changed
    /// meanwhile (sent, or being published by a relay: skip them again).
    pub changed: i64,
    pub dry_run: bool,
    pub created_at: DateTime<Utc>,
}

/// The hash that tells the same request from another under one key.
fn request_hash(action: Action, selector: &Selector) -> Vec<u8> {
    let canonical = serde_json::to_vec(&(action, selector)).expect("a selector serializes");
    Sha256::digest(&canonical).to_vec()
}

const FIND_ACTION: &str = "
SELECT request_hash, response::text FROM admin_actions WHERE admin_id = $1 AND idempotency_key = $2";

/// Claims the key: blocks while another transaction holds it, and inserts nothing when it was
/// used before (then [`FIND_ACTION`] tells what for).
const CLAIM_ACTION: &str = "
INSERT INTO admin_actions (admin_id, idempotency_key, request_hash, action, selector, changed, response)
VALUES ($1, $2, $3, $4, $5::text::jsonb, 0, '{}')
ON CONFLICT (admin_id, idempotency_key) DO NOTHING
RETURNING id, created_at";

const FINISH_ACTION: &str = "
UPDATE admin_actions SET changed = $2, response = $3::text::jsonb WHERE id = $1";

/// The events a selector matches now.
struct Matched {
    /// How many; up to [`GAUGE_COUNT_CAP`] for a retry by filters.
    count: i64,
    /// The count stopped at its cap.
    capped: bool,
    /// Their ids, where the action goes one by one (by ids, or a skip).
    ids: Vec<Uuid>,
}

impl Matched {
    fn ids(ids: Vec<Uuid>) -> Self {
        Matched {
            count: ids.len() as i64,
            capped: false,
            ids,
        }
    }
}

/// What the selector matches now. A retry by filters is counted up to [`GAUGE_COUNT_CAP`]
/// parked events, as the overview's counts: a dry run of a group of millions costs what one
/// of 100,000 does.
async fn matched(
    client: &impl GenericClient,
    action: Action,
    selector: &Selector,
) -> Result<Matched, StorageError> {
    if !selector.event_ids.is_empty() {
        let ids: Vec<Uuid> = client
            .query(
                "SELECT event_id FROM outbox_events
                 WHERE event_id = ANY($1) AND sent_at IS NULL AND skipped_at IS NULL
                 ORDER BY id",
                &[&selector.event_ids],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        return Ok(Matched::ids(ids));
    }
    let parked = selector.parked();
    match action {
        Action::Retry => {
            let count = store::count_parked_up_to(client, &parked, GAUGE_COUNT_CAP).await?;
            Ok(Matched {
                count,
                capped: count >= GAUGE_COUNT_CAP,
                ids: Vec::new(),
            })
        }
        Action::Skip => {
            let ids = store::parked_event_ids(client, &parked, MAX_SKIPPED_AT_ONCE + 1).await?;
            Ok(Matched::ids(ids))
        }
    }
}

/// Refused before anything changes.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("the selector matches more than {MAX_SKIPPED_AT_ONCE} parked events; a skip is for good, so skip at most {MAX_SKIPPED_AT_ONCE} at a time: narrow the selector (type, client, error, created_after, created_before)")]
    TooManyToSkip,
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl From<tokio_postgres::Error> for ActionError {
    fn from(error: tokio_postgres::Error) -> Self {
        ActionError::Storage(error.into())
    }
}

/// Counts what `action` would change, changing nothing.
pub async fn dry_run(
    connection: &mut PgClient,
    admin: &str,
    action: Action,
    selector: &Selector,
) -> Result<ActionOutcome, ActionError> {
    let matched = matched(&**connection, action, selector).await?;
    if action == Action::Skip && matched.count > MAX_SKIPPED_AT_ONCE {
        return Err(ActionError::TooManyToSkip);
    }
    Ok(ActionOutcome {
        action_id: None,
        action,
        admin_id: admin.to_owned(),
        selector: selector.clone(),
        matched: matched.count,
        matched_capped: matched.capped,
        changed: 0,
        dry_run: true,
        created_at: store::database_now(&**connection).await?,
    })
}

/// Acts, once per `key`: in one transaction, claims the key, changes the events and records
/// what it did. The same request again under the key gets the first answer; another request
/// under it is refused.
pub async fn act(
    connection: &mut PgClient,
    admin: &str,
    key: &str,
    action: Action,
    selector: &Selector,
) -> Result<Verdict<ActionOutcome>, ActionError> {
    let hash = request_hash(action, selector);
    let selector_json = serde_json::to_string(selector).expect("a selector serializes");
    let promised: bool = connection
        .query_one(crate::db::REPLICATION_PROMISED, &[])
        .await?
        .get(0);
    let warnings = connection.warnings();
    let recorded = act_in_transaction(
        connection,
        admin,
        key,
        (action, selector),
        (&hash, &selector_json),
    )
    .await?;
    // As a write batch's: a commit the database warned about (its synchronous standby did not
    // confirm it) is not reported done; and an answer found under the key is given only once
    // the standby has it too.
    connection.confirm_commit(warnings)?;
    if promised && matches!(recorded, Verdict::Replay(_)) {
        crate::db::barrier(connection).await?;
    }
    Ok(recorded)
}

async fn act_in_transaction(
    connection: &mut PgClient,
    admin: &str,
    key: &str,
    (action, selector): (Action, &Selector),
    (hash, selector_json): (&Vec<u8>, &String),
) -> Result<Verdict<ActionOutcome>, ActionError> {
    let mut transaction = connection.transaction().await?;
    let claimed = transaction
        .query_opt(
            CLAIM_ACTION,
            &[&admin, &key, &hash, &action.as_str(), &selector_json],
        )
        .await?;
    let Some(claimed) = claimed else {
        let row = transaction.query_one(FIND_ACTION, &[&admin, &key]).await?;
        let stored_hash: Vec<u8> = row.get(0);
        let verdict = Verdict::of_saved(&stored_hash, hash, || row.get::<_, String>(1));
        return verdict.try_map(|response| {
            serde_json::from_str(&response).map_err(|error| {
                ActionError::Storage(
                    anyhow::anyhow!("a stored admin answer is not one: {error}").into(),
                )
            })
        });
    };
    let (action_id, created_at): (i64, DateTime<Utc>) = (claimed.get(0), claimed.get(1));
    let Matched {
        count: mut matched,
        capped,
        ids,
    } = matched(&transaction, action, selector).await?;
    let changed = match action {
        Action::Retry if selector.event_ids.is_empty() => {
            store::requeue_parked(&transaction, &selector.parked(), None).await? as i64
        }
        Action::Retry => store::requeue_events(&transaction, &ids).await? as i64,
        Action::Skip => {
            if matched > MAX_SKIPPED_AT_ONCE {
                return Err(ActionError::TooManyToSkip);
            }
            let reason = format!("admin action {action_id}");
            // Every key at once, in key order: each skip would otherwise lock its key in the
            // events' order and hold it to the commit, against writers that lock in key order.
            store::lock_keys_of_events(&transaction, &ids).await?;
            let mut skipped = 0;
            for event_id in ids {
                let outcome =
                    store::skip_in(&mut transaction, event_id, SkippedBy::Admin(admin), &reason)
                        .await?;
                if matches!(outcome, Skip::Skipped { .. }) {
                    skipped += 1;
                }
            }
            skipped
        }
    };
    if capped {
        // Every event it changed matched: a better lower bound than the cap.
        matched = matched.max(changed);
    }
    let outcome = ActionOutcome {
        action_id: Some(action_id),
        action,
        admin_id: admin.to_owned(),
        selector: selector.clone(),
        matched,
        matched_capped: capped,
        changed,
        dry_run: false,
        created_at,
    };
    let response = serde_json::to_string(&outcome).expect("an outcome serializes");
    transaction
        .execute(FINISH_ACTION, &[&action_id, &changed, &response])
        .await?;
    transaction.commit().await?;
    Ok(Verdict::New(outcome))
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
