//! One event as its page shows it (`GET /admin/v1/events/{event_id}`, the console's
//! `/console/events/{event_id}`): its fields and payload, its failed attempts, what it waits
//! for, who skipped it, and the replays that published it again.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::db::outbox_state::{held, unsent};
use crate::db::StorageError;

use super::{fill_waits_for, listed_event, ListedEvent, LISTED_COLUMNS};

/// An event and what became of it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EventDetail {
    #[serde(flatten)]
    pub event: ListedEvent,
    /// Of its failed attempts, those the broker nacked.
    pub nacks: i32,
    /// Its first failed attempt's error and time (kept through a requeue); null if it never
    /// failed, or failed only before the daemon recorded first errors.
    pub first_error: Option<String>,
    pub first_error_at: Option<DateTime<Utc>>,
    /// The time of the attempt that failed with `last_error`.
    pub last_error_at: Option<DateTime<Utc>>,
    /// Due at no time: it waits until the earlier events of its ordering key are sent or
    /// skipped (`waits_for`), then a relay releases it.
    pub held: bool,
    /// Who gave up on it, when it is skipped.
    pub skip: Option<SkipRecord>,
    /// How many replays published it again (the relay's own delivery is not one).
    pub replay_count: i64,
    /// The newest of them, the newest first ([`REPLAYS_SHOWN`] at most).
    pub replays: Vec<EventReplay>,
}

/// Who skipped an event, and why (`outbox_skips`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SkipRecord {
    /// The admin who skipped it through the admin listener; null for `retrysafe outbox skip`.
    pub admin_id: Option<String>,
    /// The database role of the session that skipped it.
    pub db_user: String,
    pub reason: String,
}

/// A replay that published the event again.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EventReplay {
    pub replay_id: i64,
    pub replayed_at: DateTime<Utc>,
    /// Where it was published: `exchange:<name>` or `queue:<name>`.
    pub target: String,
    pub requested_by: String,
}

/// Replays an event's page lists at most.
pub const REPLAYS_SHOWN: i64 = 20;

/// The event by its id (`outbox_events_event_id`), with its skip's record (named by its client,
/// so that on Citus the join stays on the event's shard).
const EVENT: &str = concat!(
    "
SELECT {columns}, o.nacks, o.first_error, o.first_error_at, o.last_error_at,
       ",
    unsent!("o"),
    " AND ",
    held!("o"),
    " AS held,
       s.admin_id, s.requested_db_user, s.reason
FROM outbox_events o
     LEFT JOIN outbox_skips s ON s.client_id = o.client_id AND s.event_id = o.event_id
WHERE o.event_id = $1"
);

/// The event's replays through `event_replays`' primary key (client, event first), the newest
/// `$3`, each with the total.
const EVENT_REPLAYS: &str = "
SELECT r.replay_id, r.replayed_at, p.target, p.requested_by, count(*) OVER ()
FROM event_replays r
     JOIN replays p ON p.id = r.replay_id
WHERE r.client_id = $1 AND r.event_id = $2
ORDER BY r.replayed_at DESC, r.replay_id DESC
LIMIT $3";

/// The event `event_id`; None when there is none (never written, or deleted by the janitor
/// after it was sent).
pub async fn event_detail(
    client: &impl GenericClient,
    event_id: Uuid,
) -> Result<Option<EventDetail>, StorageError> {
    let query = EVENT.replace("{columns}", LISTED_COLUMNS);
    let Some(row) = client.query_opt(&query, &[&event_id]).await? else {
        return Ok(None);
    };
    let mut event = listed_event(&row)?;
    fill_waits_for(client, std::slice::from_mut(&mut event)).await?;
    let replays = client
        .query(
            EVENT_REPLAYS,
            &[&event.client_id, &event_id, &REPLAYS_SHOWN],
        )
        .await?;
    let skip = row
        .get::<_, Option<String>>("requested_db_user")
        .map(|db_user| SkipRecord {
            admin_id: row.get("admin_id"),
            db_user,
            reason: row.get("reason"),
        });
    Ok(Some(EventDetail {
        nacks: row.get("nacks"),
        first_error: row.get("first_error"),
        first_error_at: row.get("first_error_at"),
        last_error_at: row.get("last_error_at"),
        held: row.get("held"),
        skip,
        replay_count: replays.first().map_or(0, |row| row.get(4)),
        replays: replays
            .iter()
            .map(|row| EventReplay {
                replay_id: row.get(0),
                replayed_at: row.get(1),
                target: row.get(2),
                requested_by: row.get(3),
            })
            .collect(),
        event,
    }))
}
