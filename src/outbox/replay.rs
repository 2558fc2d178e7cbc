//! Replays (`retrysafe outbox replay`): past events published again, with their original event
//! id and the relay's message properties, to the exchange or to one queue.
//!
//! A replay is a row of `replays`. It walks the outbox in id order, a batch at a time; each
//! batch is published with the relay's code ([`publish_all`]: pipelined confirms, returns
//! matched by `message_id`, one deadline), and only after the broker confirmed it is the batch
//! recorded, in one transaction: a row of `event_replays` per confirmed event, and the replay's
//! resume point (`last_event_id`) moved past the batch. The outbox rows are only read, so their
//! delivery record (`sent_at`, `attempts`) stays the relay's.
//!
//! Which events: every event the selection matches, whatever its delivery state (sent, waiting
//! for the relay, parked), with an id up to the newest one when the replay started. Sending a
//! not yet delivered event is harmless (consumers dedupe on its id) and is what a consumer
//! rebuilt through its own queue needs; the plan counts such events apart. The events a replay
//! covers are fixed when it starts (time bounds resolved, newest id taken), so that resuming it
//! sends the rest of the same set; events written later reach bound queues through the relay.
//!
//! "The same command" is the same selection and target ([`selection_hash`]): an unfinished
//! replay with it is resumed after its `last_event_id`; a completed one is not, and the command
//! starts a new replay that sends everything again.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::Channel;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::db::{Database, StorageError};
use crate::entry::format_time;
use crate::idempotency::canonical_json;
use crate::operator::Operator;
use crate::outbox::publish::{publish_all, Destination, PublishResult};
use crate::outbox::store::{pending_event, PendingEvent};

/// Most outbox ids one statement of a replay looks at: a selection that matches few events
/// walks the table in windows this wide, so that no statement scans far (each stays well inside
/// `database.statement_timeout`), and the resume point moves on even where nothing matched.
const SCAN_WINDOW: i64 = 50_000;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("{0}")]
    Invalid(String),
    #[error("no event with id {0} in the outbox")]
    UnknownEvent(Uuid),
    #[error(
        "replay {0} was moved on by another process running the same command; stopping (nothing of this batch was recorded, the other process goes on)"
    )]
    Moved(i64),
}

/// A bound of `--since`/`--until`: a time, or a duration before the replay starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeBound {
    At(DateTime<Utc>),
    Ago(Duration),
}

impl TimeBound {
    /// An RFC 3339 time (`2026-12-01T00:00:00Z`), or a duration meaning that long ago (`24h`,
    /// `7d`, `1h 30m`).
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Ok(time) = DateTime::parse_from_rfc3339(text) {
            return Ok(TimeBound::At(time.with_timezone(&Utc)));
        }
        match humantime::parse_duration(text) {
            Ok(duration) if !duration.is_zero() => Ok(TimeBound::Ago(duration)),
            _ => Err(format!(
                "{text:?} is neither an RFC 3339 time (2026-12-01T00:00:00Z) nor a duration ago (24h, 7d)"
            )),
        }
    }

    pub fn resolve(self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            TimeBound::At(time) => time,
            TimeBound::Ago(duration) => chrono::Duration::from_std(duration)
                .ok()
                .and_then(|ago| now.checked_sub_signed(ago))
                .unwrap_or(DateTime::<Utc>::MIN_UTC),
        }
    }
}

impl fmt::Display for TimeBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimeBound::At(time) => f.write_str(&format_time(*time)),
            TimeBound::Ago(duration) => write!(f, "{}", humantime::format_duration(*duration)),
        }
    }
}

impl Serialize for TimeBound {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TimeBound {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        TimeBound::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Which events to replay, as given on the command line. Stored with the replay, and hashed
/// (with the target) to recognize the same command.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Selection {
    /// Created at or after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<TimeBound>,
    /// Created before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<TimeBound>,
    /// Of one of these event types (any when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<String>,
    /// Of one of these clients (any when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<String>,
    /// This one event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<Uuid>,
    /// Every event the outbox holds: asked for explicitly, never implied by an empty selection.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
}

impl Selection {
    /// The same selection in one spelling: lists sorted, without repeats.
    pub fn normalized(mut self) -> Self {
        for list in [&mut self.types, &mut self.clients] {
            list.sort();
            list.dedup();
        }
        self
    }

    /// Whether it selects nothing explicitly (a bare `outbox replay`).
    pub fn is_empty(&self) -> bool {
        *self == Selection::default()
    }

    /// The command-line options that give this selection.
    pub fn arguments(&self) -> Vec<String> {
        let mut arguments = Vec::new();
        let mut push = |name: &str, value: String| {
            arguments.push(name.to_owned());
            arguments.push(value);
        };
        if let Some(since) = self.since {
            push("--since", since.to_string());
        }
        if let Some(until) = self.until {
            push("--until", until.to_string());
        }
        for event_type in &self.types {
            push("--type", event_type.clone());
        }
        for client in &self.clients {
            push("--client", client.clone());
        }
        if let Some(event) = self.event {
            push("--event", event.to_string());
        }
        if self.all {
            arguments.push("--all".to_owned());
        }
        arguments
    }
}

/// Where a replay publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `amqp.exchange`, routing key = event type: every queue bound for the type gets a copy.
    Exchange(String),
    /// One queue, through the default exchange: no other queue gets a copy.
    Queue(String),
}

impl Target {
    /// As stored in `replays.target`.
    pub fn as_text(&self) -> String {
        match self {
            Target::Exchange(exchange) => format!("exchange:{exchange}"),
            Target::Queue(queue) => format!("queue:{queue}"),
        }
    }

    pub fn destination(&self) -> Destination<'_> {
        match self {
            Target::Exchange(exchange) => Destination::Exchange(exchange),
            Target::Queue(queue) => Destination::Queue(queue),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Exchange(exchange) => {
                write!(f, "exchange {exchange:?} (routing key = event type)")
            }
            Target::Queue(queue) => write!(f, "queue {queue:?} only"),
        }
    }
}

/// Identifies "the same command": SHA-256 over the canonical JSON of the normalized selection
/// and the target. Pacing options (`--rate`, `--batch-size`) are not part of it.
pub fn selection_hash(selection: &Selection, target: &Target) -> [u8; 32] {
    let value = serde_json::json!({
        "selection": selection,
        "target": target.as_text(),
    });
    Sha256::digest(canonical_json(&value).as_bytes()).into()
}

/// The events one replay covers, fixed when it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct EventSet {
    pub created_since: Option<DateTime<Utc>>,
    pub created_until: Option<DateTime<Utc>>,
    pub types: Vec<String>,
    pub clients: Vec<String>,
    pub event: Option<Uuid>,
    /// The newest outbox id when the replay started.
    pub max_event_id: i64,
}

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

    fn of_replay(selection: &Selection, replay: &ReplayRecord) -> Self {
        Self {
            created_since: replay.created_since,
            created_until: replay.created_until,
            types: selection.types.clone(),
            clients: selection.clients.clone(),
            event: selection.event,
            max_event_id: replay.max_event_id,
        }
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
macro_rules! selected_events {
    () => {
        "
FROM outbox_events
WHERE id > $1 AND id <= $2
  AND ($3::timestamptz IS NULL OR created_at >= $3)
  AND ($4::timestamptz IS NULL OR created_at < $4)
  AND (cardinality($5::text[]) = 0 OR event_type = ANY($5::text[]))
  AND (cardinality($6::text[]) = 0 OR client_id = ANY($6::text[]))
  AND ($7::uuid IS NULL OR event_id = $7)"
    };
}

/// One batch, in id order; the columns are those [`pending_event`] reads.
const SELECT_PAGE: &str = concat!(
    "SELECT id, event_id, event_type, client_id, idempotency_key, payload::text, attempts, created_at",
    selected_events!(),
    "
ORDER BY id
LIMIT $8"
);

const COUNT_BY_TYPE: &str = concat!(
    "SELECT event_type, count(*),
       count(*) FILTER (WHERE sent_at IS NULL AND failed_at IS NULL),
       count(*) FILTER (WHERE sent_at IS NULL AND failed_at IS NOT NULL)",
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
        let window_end = window_end(position, set.max_event_id);
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

fn window_end(position: i64, max_event_id: i64) -> i64 {
    position.saturating_add(SCAN_WINDOW).min(max_event_id)
}

/// The next batch after `position`, and the position after it: the last event's id when the
/// batch is full, else the end of the window looked at.
async fn next_page(
    db: &Database,
    set: &EventSet,
    position: i64,
    limit: usize,
) -> Result<(Vec<PendingEvent>, i64), StorageError> {
    let window_end = window_end(position, set.max_event_id);
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

/// A replay's state of progress, as `replays` holds it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayRecord {
    pub id: i64,
    pub selection: serde_json::Value,
    pub target: String,
    /// The user (looked up from the id) and host: `alice@ops1`, `alice (as root)@ops1`.
    pub requested_by: String,
    /// The operating-system user id of the command; None for replays recorded before V5.
    pub requested_uid: Option<i64>,
    /// The database role the command's session ran as (`current_user`); None before V5.
    pub requested_db_user: Option<String>,
    pub started_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub status: String,
    pub created_since: Option<DateTime<Utc>>,
    pub created_until: Option<DateTime<Utc>>,
    pub max_event_id: i64,
    pub events_total: i64,
    pub events_sent: i64,
    pub last_event_id: i64,
    pub last_error: Option<String>,
}

/// The columns [`ReplayRecord::from_row`] reads, in its order.
macro_rules! replay_columns {
    () => {
        "id, selection::text, target, requested_by, started_at, updated_at, finished_at, status,
         created_since, created_until, max_event_id, events_total, events_sent, last_event_id,
         last_error, requested_uid, requested_db_user"
    };
}

impl ReplayRecord {
    fn from_row(row: &tokio_postgres::Row) -> Result<Self, StorageError> {
        let selection_text: String = row.get(1);
        let selection = serde_json::from_str(&selection_text).map_err(|error| {
            StorageError::from(anyhow::anyhow!("a replay's selection is not JSON: {error}"))
        })?;
        Ok(Self {
            id: row.get(0),
            selection,
            target: row.get(2),
            requested_by: row.get(3),
            started_at: row.get(4),
            updated_at: row.get(5),
            finished_at: row.get(6),
            status: row.get(7),
            created_since: row.get(8),
            created_until: row.get(9),
            max_event_id: row.get(10),
            events_total: row.get(11),
            events_sent: row.get(12),
            last_event_id: row.get(13),
            last_error: row.get(14),
            requested_uid: row.get(15),
            requested_db_user: row.get(16),
        })
    }

    /// The selection as the command line gives it; `None` for one this build cannot read.
    pub fn parsed_selection(&self) -> Option<Selection> {
        serde_json::from_value(self.selection.clone()).ok()
    }
}

fn records(rows: &[tokio_postgres::Row]) -> Result<Vec<ReplayRecord>, StorageError> {
    rows.iter().map(ReplayRecord::from_row).collect()
}

fn one_record(rows: &[tokio_postgres::Row]) -> Result<Option<ReplayRecord>, StorageError> {
    Ok(records(rows)?.into_iter().next())
}

/// Served by the partial unique index on unfinished selections.
const FIND_UNFINISHED: &str = concat!(
    "SELECT ",
    replay_columns!(),
    " FROM replays WHERE selection_hash = $1 AND status <> 'completed'"
);

/// `DO NOTHING` when another process started the same replay a moment ago: it is resumed.
/// `current_user` is the database's own name for the session: who ran it, as the server knows.
const INSERT_REPLAY: &str = concat!(
    "INSERT INTO replays (selection, selection_hash, target, requested_by, requested_uid,
                     requested_db_user, status, created_since, created_until, max_event_id,
                     events_total, last_event_id)
VALUES ($1::text::jsonb, $2, $3, $4, $10, current_user, 'running', $5, $6, $7, $8, $9)
ON CONFLICT (selection_hash) WHERE status <> 'completed' DO NOTHING
RETURNING ",
    replay_columns!()
);

const RESUME_REPLAY: &str = concat!(
    "UPDATE replays SET status = 'running', last_error = NULL, updated_at = now()
WHERE id = $1 AND status <> 'completed'
RETURNING ",
    replay_columns!()
);

/// Records a published batch: its confirmed events, and the resume point moved on. Only if the
/// resume point is still where this process left it (`$2`): another process running the same
/// replay would have moved it, and then this one stops. Repeated events (a batch sent again after
/// a failure or a resume) are not counted twice.
const RECORD_BATCH: &str = concat!(
    "WITH recorded AS (
    INSERT INTO event_replays (event_id, replay_id)
    SELECT event_id, $1 FROM unnest($4::uuid[]) AS e(event_id)
    ON CONFLICT DO NOTHING
    RETURNING 1
)
UPDATE replays
SET events_sent = events_sent + (SELECT count(*) FROM recorded),
    last_event_id = $3,
    updated_at = now()
WHERE id = $1 AND last_event_id = $2 AND status = 'running'
RETURNING ",
    replay_columns!()
);

const FINISH_REPLAY: &str = concat!(
    "UPDATE replays
SET status = $2, last_error = $3, updated_at = now(),
    finished_at = CASE WHEN $2 = 'completed' THEN now() END
WHERE id = $1
RETURNING ",
    replay_columns!()
);

const RECENT_REPLAYS: &str = concat!(
    "SELECT ",
    replay_columns!(),
    " FROM replays ORDER BY id DESC LIMIT $1"
);

/// The newest replays, newest first.
pub async fn recent(db: &Database, limit: i64) -> Result<Vec<ReplayRecord>, StorageError> {
    db.run(async |connection| records(&connection.query(RECENT_REPLAYS, &[&limit]).await?))
        .await
}

async fn record_batch(
    db: &Database,
    replay: &ReplayRecord,
    next_position: i64,
    confirmed: &[Uuid],
) -> Result<ReplayRecord, ReplayError> {
    let recorded = db
        .run(async |connection| {
            let transaction = connection.transaction().await?;
            let rows = transaction
                .query(
                    RECORD_BATCH,
                    &[
                        &replay.id,
                        &replay.last_event_id,
                        &next_position,
                        &confirmed,
                    ],
                )
                .await?;
            let Some(updated) = one_record(&rows)? else {
                transaction.rollback().await?;
                return Ok(None);
            };
            transaction.commit().await?;
            Ok(Some(updated))
        })
        .await?;
    recorded.ok_or(ReplayError::Moved(replay.id))
}

/// What a replay is to do, worked out before anything is sent: the dry run shows it, the real
/// run follows it.
#[derive(Debug, Clone)]
pub struct Plan {
    pub selection: Selection,
    pub target: Target,
    pub selection_hash: [u8; 32],
    /// The unfinished replay of the same command, which the run resumes.
    pub resumes: Option<ReplayRecord>,
    pub set: EventSet,
    /// Where sending starts: after this outbox id.
    pub start_after: i64,
    /// The events still to send, by type.
    pub counts: Vec<TypeCount>,
    pub extent: OutboxExtent,
}

impl Plan {
    pub fn to_send(&self) -> i64 {
        self.counts.iter().map(|c| c.selected).sum()
    }

    pub fn not_delivered(&self) -> i64 {
        self.counts.iter().map(|c| c.unsent + c.parked).sum()
    }
}

/// Works out what the replay would send: resumes the unfinished replay of the same command, or
/// fixes the event set of a new one as of `now`.
pub async fn plan(
    db: &Database,
    selection: Selection,
    target: Target,
    now: DateTime<Utc>,
) -> Result<Plan, ReplayError> {
    let selection = selection.normalized();
    let selection_hash = selection_hash(&selection, &target);
    let extent = outbox_extent(db).await?;
    let resumes = db
        .run(async |connection| {
            one_record(
                &connection
                    .query(FIND_UNFINISHED, &[&&selection_hash[..]])
                    .await?,
            )
        })
        .await?;
    let (set, start_after) = match &resumes {
        Some(replay) => (
            EventSet::of_replay(&selection, replay),
            replay.last_event_id,
        ),
        None => new_event_set(db, &selection, &extent, now).await?,
    };
    let counts = count(db, &set, start_after).await?;
    Ok(Plan {
        selection,
        target,
        selection_hash,
        resumes,
        set,
        start_after,
        counts,
        extent,
    })
}

const EVENT_OUTBOX_ID: &str = "SELECT id FROM outbox_events WHERE event_id = $1";

async fn new_event_set(
    db: &Database,
    selection: &Selection,
    extent: &OutboxExtent,
    now: DateTime<Utc>,
) -> Result<(EventSet, i64), ReplayError> {
    let created_since = selection.since.map(|bound| bound.resolve(now));
    let created_until = selection.until.map(|bound| bound.resolve(now));
    if let (Some(since), Some(until)) = (created_since, created_until) {
        if since >= until {
            return Err(ReplayError::Invalid(format!(
                "--since ({}) is not before --until ({})",
                format_time(since),
                format_time(until)
            )));
        }
    }
    let mut set = EventSet {
        created_since,
        created_until,
        types: selection.types.clone(),
        clients: selection.clients.clone(),
        event: selection.event,
        max_event_id: extent.newest_id.unwrap_or(0),
    };
    let Some(event_id) = selection.event else {
        let start_after = extent.oldest_id.map_or(0, |oldest| oldest - 1);
        return Ok((set, start_after));
    };
    // One event: its own id is the whole range, found through the event_id index.
    let outbox_id: Option<i64> = db
        .run(async |connection| {
            Ok(connection
                .query_opt(EVENT_OUTBOX_ID, &[&event_id])
                .await?
                .map(|row| row.get(0)))
        })
        .await?;
    let Some(outbox_id) = outbox_id else {
        return Err(ReplayError::UnknownEvent(event_id));
    };
    set.max_event_id = outbox_id;
    Ok((set, outbox_id - 1))
}

/// Starts the planned replay, or resumes the unfinished one of the same command (also one that
/// another process started since the plan was made).
pub async fn start(
    db: &Database,
    plan: &Plan,
    operator: &Operator,
) -> Result<ReplayRecord, ReplayError> {
    if let Some(replay) = &plan.resumes {
        return resume(db, replay.id).await;
    }
    let selection_text = serde_json::to_string(&plan.selection)
        .map_err(|error| StorageError::from(anyhow::Error::from(error)))?;
    let target = plan.target.as_text();
    let total = plan.to_send();
    let uid = i64::from(operator.uid);
    let inserted = db
        .run(async |connection| {
            one_record(
                &connection
                    .query(
                        INSERT_REPLAY,
                        &[
                            &selection_text,
                            &&plan.selection_hash[..],
                            &target,
                            &operator.display,
                            &plan.set.created_since,
                            &plan.set.created_until,
                            &plan.set.max_event_id,
                            &total,
                            &plan.start_after,
                            &uid,
                        ],
                    )
                    .await?,
            )
        })
        .await?;
    if let Some(replay) = inserted {
        return Ok(replay);
    }
    let raced = db
        .run(async |connection| {
            one_record(
                &connection
                    .query(FIND_UNFINISHED, &[&&plan.selection_hash[..]])
                    .await?,
            )
        })
        .await?;
    match raced {
        Some(replay) => resume(db, replay.id).await,
        None => Err(ReplayError::Invalid(
            "the same replay was started and finished by another process meanwhile; run the command again to replay once more".into(),
        )),
    }
}

async fn resume(db: &Database, id: i64) -> Result<ReplayRecord, ReplayError> {
    let resumed = db
        .run(async |connection| one_record(&connection.query(RESUME_REPLAY, &[&id]).await?))
        .await?;
    resumed.ok_or_else(|| {
        ReplayError::Invalid(format!(
            "replay {id} was completed by another process meanwhile"
        ))
    })
}

/// How fast a replay sends.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Most events per batch (one publish round and one recording transaction).
    pub batch_size: usize,
    /// Events per second at most; unlimited when `None`.
    pub rate: Option<f64>,
}

impl Pace {
    /// Batches no larger than a second's worth at the rate, so that pacing stays smooth and a
    /// stop is never more than a second's sending away.
    pub fn effective_batch_size(&self) -> usize {
        match self.rate {
            Some(rate) => self.batch_size.min(rate.ceil() as usize).max(1),
            None => self.batch_size.max(1),
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Completed,
    /// Stopped on request, between two batches.
    Interrupted,
    /// The broker did not take a batch (returned, nacked, unconfirmed): the events it confirmed
    /// are recorded, the resume point stays before the batch.
    Failed {
        failed: usize,
        first_error: String,
    },
}

impl Ending {
    fn status(&self) -> &'static str {
        match self {
            Ending::Completed => "completed",
            Ending::Interrupted => "interrupted",
            Ending::Failed { .. } => "failed",
        }
    }
}

/// What one run did.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The replay as recorded at the end.
    pub replay: ReplayRecord,
    pub ending: Ending,
    /// Events the broker confirmed in this run (a batch sent again counts again).
    pub sent: u64,
    pub elapsed: Duration,
}

/// Sends the rest of a started replay, a batch at a time, until it is done, `stop` turns true
/// (checked between batches, so that a batch's confirms are always recorded), or the broker
/// fails a batch. `on_batch` sees the replay after each recorded batch, with this run's sent
/// count and time.
#[allow(clippy::too_many_arguments)]
pub async fn send(
    db: &Database,
    channel: &Channel,
    confirm_timeout: Duration,
    plan: &Plan,
    mut replay: ReplayRecord,
    pace: Pace,
    mut stop: watch::Receiver<bool>,
    mut on_batch: impl FnMut(&ReplayRecord, u64, Duration),
) -> Result<RunReport, ReplayError> {
    let started = tokio::time::Instant::now();
    let batch_size = pace.effective_batch_size();
    let destination = plan.target.destination();
    let mut sent: u64 = 0;
    let ending = loop {
        if *stop.borrow() {
            break Ending::Interrupted;
        }
        if replay.last_event_id >= plan.set.max_event_id {
            break Ending::Completed;
        }
        let (events, next_position) =
            next_page(db, &plan.set, replay.last_event_id, batch_size).await?;
        if events.is_empty() {
            replay = record_batch(db, &replay, next_position, &[]).await?;
            continue;
        }
        let (confirmed, failures) =
            publish_batch(channel, destination, confirm_timeout, &events).await;
        sent += confirmed.len() as u64;
        if let Some(first_error) = failures.first() {
            // The confirmed events of the batch count; the resume point stays before it, so
            // the same command sends the whole batch again once the cause is fixed.
            let position = replay.last_event_id;
            replay = record_batch(db, &replay, position, &confirmed).await?;
            break Ending::Failed {
                failed: failures.len(),
                first_error: first_error.clone(),
            };
        }
        replay = record_batch(db, &replay, next_position, &confirmed).await?;
        if let Some(rate) = pace.rate {
            let due = started + Duration::from_secs_f64(sent as f64 / rate);
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                Ok(()) = stop.changed() => {}
            }
        }
        // After the pause, so that the rate shown is the paced one, not a batch's burst.
        on_batch(&replay, sent, started.elapsed());
    };
    let replay = finish(db, replay, &ending).await?;
    Ok(RunReport {
        replay,
        ending,
        sent,
        elapsed: started.elapsed(),
    })
}

/// Publishes one page of events: the ids the broker confirmed, and the errors of the others.
async fn publish_batch(
    channel: &Channel,
    destination: Destination<'_>,
    confirm_timeout: Duration,
    events: &[PendingEvent],
) -> (Vec<Uuid>, Vec<String>) {
    let results = publish_all(channel, destination, confirm_timeout, events).await;
    let mut confirmed = Vec::with_capacity(events.len());
    let mut failures = Vec::new();
    for (event, result) in events.iter().zip(results) {
        match result {
            PublishResult::Acked => confirmed.push(event.event_id),
            PublishResult::Failed { error, .. } => failures.push(error),
        }
    }
    (confirmed, failures)
}

/// Records how the run ended on the replay's row.
async fn finish(
    db: &Database,
    replay: ReplayRecord,
    ending: &Ending,
) -> Result<ReplayRecord, ReplayError> {
    let error = match ending {
        Ending::Failed { first_error, .. } => Some(first_error.as_str()),
        _ => None,
    };
    let status = ending.status();
    let id = replay.id;
    let finished = db
        .run(async |connection| {
            one_record(
                &connection
                    .query(FINISH_REPLAY, &[&id, &status, &error])
                    .await?,
            )
        })
        .await?;
    Ok(finished.unwrap_or(replay))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_bounds_are_rfc3339_times_or_durations_ago() {
        let at = TimeBound::parse("2026-12-01T01:00:00+01:00").unwrap();
        assert_eq!(
            at,
            TimeBound::At("2026-12-01T00:00:00Z".parse().unwrap()),
            "normalized to UTC"
        );
        assert_eq!(at.to_string(), "2026-12-01T00:00:00.000000Z");
        let ago = TimeBound::parse("24h").unwrap();
        assert_eq!(ago, TimeBound::Ago(Duration::from_secs(86_400)));
        assert_eq!(TimeBound::parse(&ago.to_string()).unwrap(), ago);
        let now: DateTime<Utc> = "2026-12-02T00:00:00Z".parse().unwrap();
        assert_eq!(
            ago.resolve(now),
            "2026-12-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        for bad in ["yesterday", "0s", "", "2026-13-01T00:00:00Z"] {
            assert!(TimeBound::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_same_command_has_the_same_hash_in_any_spelling() {
        let one = Selection {
            since: Some(TimeBound::parse("24h").unwrap()),
            types: vec!["entry.created".into(), "audit.entry.created".into()],
            ..Selection::default()
        }
        .normalized();
        let other = Selection {
            since: Some(TimeBound::parse("1day").unwrap()),
            types: vec![
                "audit.entry.created".into(),
                "entry.created".into(),
                "entry.created".into(),
            ],
            ..Selection::default()
        }
        .normalized();
        let queue = Target::Queue("rebuild".into());
        assert_eq!(selection_hash(&one, &queue), selection_hash(&other, &queue));
        assert_ne!(
            selection_hash(&one, &queue),
            selection_hash(&one, &Target::Exchange("rebuild".into())),
            "the target is part of the command"
        );
        let until = Selection {
            until: Some(TimeBound::parse("1h").unwrap()),
            ..one.clone()
        };
        assert_ne!(selection_hash(&one, &queue), selection_hash(&until, &queue));
    }

    #[test]
    fn a_selection_round_trips_through_its_stored_form_and_its_arguments() {
        let selection = Selection {
            since: Some(TimeBound::parse("2026-12-01T00:00:00Z").unwrap()),
            until: Some(TimeBound::parse("1h 30m").unwrap()),
            types: vec!["entry.created".into()],
            clients: vec!["billing".into()],
            ..Selection::default()
        };
        let stored = serde_json::to_value(&selection).unwrap();
        assert_eq!(
            stored,
            serde_json::json!({"since": "2026-12-01T00:00:00.000000Z", "until": "1h 30m",
                               "types": ["entry.created"], "clients": ["billing"]})
        );
        assert_eq!(
            serde_json::from_value::<Selection>(stored).unwrap(),
            selection
        );
        assert_eq!(
            selection.arguments(),
            [
                "--since",
                "2026-12-01T00:00:00.000000Z",
                "--until",
                "1h 30m",
                "--type",
                "entry.created",
                "--client",
                "billing"
            ]
        );
        assert!(Selection::default().is_empty());
        assert!(!Selection {
            all: true,
            ..Selection::default()
        }
        .is_empty());
    }

    #[test]
    fn batches_hold_at_most_a_second_of_the_rate() {
        let pace = |batch_size, rate| Pace { batch_size, rate }.effective_batch_size();
        assert_eq!(pace(500, None), 500);
        assert_eq!(pace(500, Some(100.0)), 100);
        assert_eq!(pace(500, Some(0.5)), 1);
        assert_eq!(pace(50, Some(1000.0)), 50);
    }
}
