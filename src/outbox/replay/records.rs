//! The `replays` table, a row per replay with its resume point, and `event_replays`, a row per
//! event a replay sent: their statements and [`ReplayRecord`].

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::{Ending, Plan, ReplayError, Selection};
use crate::db::{Database, StorageError};
use crate::operator::Operator;

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
    INSERT INTO event_replays (client_id, event_id, replay_id)
    SELECT o.client_id, o.event_id, $1 FROM outbox_events o WHERE o.event_id = ANY($4::uuid[])
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

/// The time is read in a CTE of its own: Citus refuses `now()` inside a `CASE` of a
/// modification.
const FINISH_REPLAY: &str = concat!(
    "WITH clock AS (SELECT now() AS now)
UPDATE replays
SET status = $2, last_error = $3, updated_at = clock.now,
    finished_at = CASE WHEN $2 = 'completed' THEN clock.now END
FROM clock
WHERE id = $1
RETURNING ",
    replay_columns!()
);

const RECENT_REPLAYS: &str = concat!(
    "SELECT ",
    replay_columns!(),
    " FROM replays ORDER BY id DESC LIMIT $1"
);

/// The unfinished replay of a command, by its [`super::selection_hash`].
pub(super) async fn find_unfinished(
    db: &Database,
    selection_hash: &[u8; 32],
) -> Result<Option<ReplayRecord>, StorageError> {
    db.run(async |connection| {
        one_record(
            &connection
                .query(FIND_UNFINISHED, &[&&selection_hash[..]])
                .await?,
        )
    })
    .await
}

/// Records the planned replay as started by `operator`; None when another process started the
/// same command a moment ago (its row is then the unfinished one).
pub(super) async fn insert(
    db: &Database,
    plan: &Plan,
    operator: &Operator,
) -> Result<Option<ReplayRecord>, StorageError> {
    let selection_text = serde_json::to_string(&plan.selection)
        .map_err(|error| StorageError::from(anyhow::Error::from(error)))?;
    let target = plan.target.as_text();
    let total = plan.to_send();
    let uid = i64::from(operator.uid);
    db.run(async |connection| {
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
    .await
}

/// Marks an unfinished replay running again; None when it was completed meanwhile.
pub(super) async fn mark_running(
    db: &Database,
    id: i64,
) -> Result<Option<ReplayRecord>, StorageError> {
    db.run(async |connection| one_record(&connection.query(RESUME_REPLAY, &[&id]).await?))
        .await
}

/// The newest replays, newest first.
pub async fn recent(db: &Database, limit: i64) -> Result<Vec<ReplayRecord>, StorageError> {
    db.run(async |connection| records(&connection.query(RECENT_REPLAYS, &[&limit]).await?))
        .await
}

/// Records a batch the broker confirmed ([`RECORD_BATCH`]), in one transaction; a replay moved
/// on by another process meanwhile is left as that process has it, and this one stops.
pub(super) async fn record_batch(
    db: &Database,
    replay: &ReplayRecord,
    next_position: i64,
    confirmed: &[Uuid],
) -> Result<ReplayRecord, ReplayError> {
    let recorded = db
        .run(async |connection| {
            let transaction = connection.transaction().await?;
            transaction
                .batch_execute(crate::db::topology::ONE_CONNECTION_PER_WORKER)
                .await?;
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

/// Records how the run ended on the replay's row.
pub(super) async fn finish(
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
