//! The janitor: deletes idempotency records past `expires_at` and sent outbox rows older than
//! `outbox.retention`, in small batches so that no statement holds many locks for long.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::db::{Database, StorageError};
use crate::{lifecycle, telemetry};

/// Rows one DELETE removes at most.
pub const PURGE_BATCH: i64 = 1000;

/// How often the janitor runs in the daemon.
pub const PURGE_INTERVAL: Duration = Duration::from_secs(60);

/// `SKIP LOCKED`: a row that a writer is taking over (an expired key reused) is left for the
/// next pass instead of waited on.
const DELETE_EXPIRED_RECORDS: &str = "
DELETE FROM idempotency_records r
USING (
    SELECT client_id, key FROM idempotency_records
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
) expired
WHERE r.client_id = expired.client_id AND r.key = expired.key";

/// Only sent rows: unsent and parked rows stay whatever their age. They are found through the
/// partial index on `sent_at` of sent rows (migration V4), oldest first, so a pass reads about
/// as many index entries as it deletes, and no number of parked or unsent rows stands in the
/// way. The events' replay records go with them (found through event_replays' primary key):
/// once an event is gone, how often it was replayed is of no use, and the record would grow
/// with every replay for ever.
const DELETE_OLD_SENT_EVENTS: &str = "
WITH deleted AS (
    DELETE FROM outbox_events
    WHERE id IN (
        SELECT id FROM outbox_events
        WHERE sent_at IS NOT NULL AND sent_at < now() - make_interval(secs => $1)
        ORDER BY sent_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING event_id
),
replays_deleted AS (
    DELETE FROM event_replays WHERE event_id IN (SELECT event_id FROM deleted)
)
SELECT count(*) FROM deleted";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    pub records_deleted: u64,
    pub events_deleted: u64,
}

/// One janitor pass: deletes in batches until nothing more is due. Each batch is one operation
/// with its own deadline.
pub async fn purge_once(
    db: &Database,
    outbox_retention: Duration,
) -> Result<PurgeReport, StorageError> {
    let mut report = PurgeReport::default();
    loop {
        let deleted = db
            .run(async |connection| {
                Ok(connection
                    .execute(DELETE_EXPIRED_RECORDS, &[&PURGE_BATCH])
                    .await?)
            })
            .await?;
        report.records_deleted += deleted;
        metrics::counter!(telemetry::JANITOR_DELETED, "table" => "idempotency_records")
            .increment(deleted);
        if deleted < PURGE_BATCH as u64 {
            break;
        }
    }
    let retention_seconds = outbox_retention.as_secs_f64();
    loop {
        let deleted = db
            .run(async |connection| {
                let row = connection
                    .query_one(DELETE_OLD_SENT_EVENTS, &[&retention_seconds, &PURGE_BATCH])
                    .await?;
                Ok(row.get::<_, i64>(0) as u64)
            })
            .await?;
        report.events_deleted += deleted;
        metrics::counter!(telemetry::JANITOR_DELETED, "table" => "outbox_events")
            .increment(deleted);
        if deleted < PURGE_BATCH as u64 {
            break;
        }
    }
    Ok(report)
}

/// Runs [`purge_once`] at start and then every [`PURGE_INTERVAL`], until `shutdown`: a plain
/// task of the daemon ([`crate::lifecycle`]). A pass in progress at shutdown is abandoned (each
/// of its deletes stands or not on its own; the next start deletes what is left).
pub async fn run(db: Database, outbox_retention: Duration, shutdown: CancellationToken) {
    lifecycle::every(PURGE_INTERVAL, shutdown, || async {
        match purge_once(&db, outbox_retention).await {
            Ok(report) if report != PurgeReport::default() => tracing::info!(
                records_deleted = report.records_deleted,
                events_deleted = report.events_deleted,
                "janitor pass"
            ),
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(error = %error, "janitor pass failed; retrying at the next interval")
            }
        }
    })
    .await
}
