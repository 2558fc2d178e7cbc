//! The janitor: deletes idempotency records past `expires_at` and sent outbox rows older than
//! `outbox.retention`, in small batches so that no statement holds many locks for long.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::types::Timestamp;
use tokio_postgres::Row;
use tokio_util::sync::CancellationToken;

use std::collections::HashMap;

use crate::db::outbox_state::sent;
use crate::db::topology::{Pass, Topology};
use crate::db::{Database, StorageError};
use crate::{lifecycle, metric};

/// Rows one DELETE removes at most.
pub const PURGE_BATCH: i64 = 1000;

/// How often the janitor runs in the daemon.
pub const PURGE_INTERVAL: Duration = Duration::from_secs(60);

/// `SKIP LOCKED`: a row that a writer is taking over (an expired key reused) is left for the
/// next pass instead of waited on.
///
/// Each batch starts where the pass's previous one ended (`$2`, the latest `expires_at` it
/// deleted; `-infinity` for the first): the index entries of the rows deleted before are dead
/// until vacuum removes them, and a batch that started from the left of the index would walk
/// them all again, so that a pass over millions of rows cost more per row the further it got.
/// Returns how many rows it deleted and the latest `expires_at` among them.
///
/// `$3` names the clients whose rows a pass takes (NULL for every client's; see
/// [`Pass::clients`]): on Citus, a delete with a limit, and its row locks, must read one shard.
const DELETE_EXPIRED_RECORDS: &str = "
WITH deleted AS (
    DELETE FROM idempotency_records r
    USING (
        SELECT client_id, key FROM idempotency_records
        WHERE expires_at >= $2 AND expires_at <= now()
          AND ($3::text[] IS NULL OR client_id = ANY($3))
        ORDER BY expires_at
        LIMIT $1
        FOR UPDATE SKIP LOCKED
    ) expired
    WHERE r.client_id = expired.client_id AND r.key = expired.key
      AND ($3::text[] IS NULL OR r.client_id = ANY($3))
    RETURNING r.expires_at
)
SELECT count(*), max(expires_at) FROM deleted";

/// Only sent rows: unsent and parked rows stay whatever their age. They are found through the
/// partial index on `sent_at` of sent rows (migration V4), oldest first, so a pass reads about
/// as many index entries as it deletes, and no number of parked or unsent rows stands in the
/// way. The events' replay records go with them (found through event_replays' primary key):
/// once an event is gone, how often it was replayed is of no use, and the record would grow
/// with every replay for ever. Each batch starts where the previous one ended (`$3`), as
/// [`DELETE_EXPIRED_RECORDS`] does; `$4` names the pass's clients, as there.
const DELETE_OLD_SENT_EVENTS: &str = concat!(
    "
WITH deleted AS (
    DELETE FROM outbox_events
    WHERE (client_id, id) IN (
        SELECT client_id, id FROM outbox_events
        WHERE ",
    sent!(),
    " AND sent_at >= $3
          AND sent_at < now() - make_interval(secs => $1)
          AND ($4::text[] IS NULL OR client_id = ANY($4))
        ORDER BY sent_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
      AND ($4::text[] IS NULL OR client_id = ANY($4))
    RETURNING client_id, event_id, sent_at
),
replays_deleted AS (
    DELETE FROM event_replays
    WHERE (client_id, event_id) IN (SELECT client_id, event_id FROM deleted)
      AND ($4::text[] IS NULL OR client_id = ANY($4))
)
SELECT count(*), max(sent_at) FROM deleted"
);

/// Where a pass's first batch starts: before every time.
const NEGATIVE_INFINITY: Timestamp<DateTime<Utc>> = Timestamp::NegInfinity;

/// A delete batch's row: how many it deleted, and the latest time among them (none if none).
fn deleted_up_to(row: &Row) -> (u64, Option<Timestamp<DateTime<Utc>>>) {
    let latest: Option<DateTime<Utc>> = row.get(1);
    (row.get::<_, i64>(0) as u64, latest.map(Timestamp::Value))
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    pub records_deleted: u64,
    pub events_deleted: u64,
}

/// Where a pass's deletes start, per table: where the previous pass ended, so that a pass does
/// not walk the index entries of every row deleted since vacuum last ran (on a table at
/// retention size with autovacuum's default settings, millions of them). Every
/// [`FULL_PASS_EVERY`]-th pass starts from the beginning instead, for rows the others passed
/// over: one a writer had locked at the time (an expired key being reused), or one whose time is
/// earlier than where the passes stood (the database's clock set back by a failover).
#[derive(Debug, Clone, Copy)]
pub struct PassStart {
    records: Timestamp<DateTime<Utc>>,
    events: Timestamp<DateTime<Utc>>,
    passes: u32,
}

/// How often (in passes) a pass starts from the beginning of both tables: every 10 minutes.
pub const FULL_PASS_EVERY: u32 = 10;

impl Default for PassStart {
    /// The first pass starts from the beginning.
    fn default() -> Self {
        PassStart {
            records: NEGATIVE_INFINITY,
            events: NEGATIVE_INFINITY,
            passes: 0,
        }
    }
}

/// One janitor pass from the beginning of both tables: deletes in batches until nothing more is
/// due. Each batch is one operation with its own deadline. On Citus, a shard at a time.
pub async fn purge_once(
    db: &Database,
    outbox_retention: Duration,
) -> Result<PurgeReport, StorageError> {
    let topology = Topology::detect(db, &[]).await?;
    let mut report = PurgeReport::default();
    for pass in topology.passes() {
        let part = purge_from(outbox_retention, &pass, &mut PassStart::default()).await?;
        report.records_deleted += part.records_deleted;
        report.events_deleted += part.events_deleted;
    }
    Ok(report)
}

/// One janitor pass over `pass`'s rows from `start`, which it moves on to where this pass ended
/// (see [`PassStart`]). Each delete is planned with its values (a statement prepared for one
/// run), so that on Citus it reads one shard.
pub async fn purge_from(
    outbox_retention: Duration,
    pass: &Pass,
    start: &mut PassStart,
) -> Result<PurgeReport, StorageError> {
    let (db, clients) = (&pass.db, pass.clients());
    if start.passes.is_multiple_of(FULL_PASS_EVERY) {
        start.records = NEGATIVE_INFINITY;
        start.events = NEGATIVE_INFINITY;
    }
    start.passes = start.passes.wrapping_add(1);
    let mut report = PurgeReport::default();
    loop {
        let from = start.records;
        let (deleted, latest) = db
            .run(async |connection| {
                let row = connection
                    .query_one(DELETE_EXPIRED_RECORDS, &[&PURGE_BATCH, &from, &clients])
                    .await?;
                Ok(deleted_up_to(&row))
            })
            .await?;
        start.records = latest.unwrap_or(from);
        report.records_deleted += deleted;
        metrics::counter!(metric::JANITOR_DELETED, "table" => "idempotency_records")
            .increment(deleted);
        if deleted < PURGE_BATCH as u64 {
            break;
        }
    }
    let retention_seconds = outbox_retention.as_secs_f64();
    loop {
        let from = start.events;
        let (deleted, latest) = db
            .run(async |connection| {
                let row = connection
                    .query_one(
                        DELETE_OLD_SENT_EVENTS,
                        &[&retention_seconds, &PURGE_BATCH, &from, &clients],
                    )
                    .await?;
                Ok(deleted_up_to(&row))
            })
            .await?;
        start.events = latest.unwrap_or(from);
        report.events_deleted += deleted;
        metrics::counter!(metric::JANITOR_DELETED, "table" => "outbox_events").increment(deleted);
        if deleted < PURGE_BATCH as u64 {
            break;
        }
    }
    Ok(report)
}

/// Runs [`purge_once`] at start and then every [`PURGE_INTERVAL`], until `shutdown`: a plain
/// task of the daemon ([`crate::lifecycle`]). A pass in progress at shutdown is abandoned (each
/// of its deletes stands or not on its own; the next start deletes what is left).
pub async fn run(outbox_retention: Duration, topology: Topology, shutdown: CancellationToken) {
    // Where each pass's last run ended.
    let starts = tokio::sync::Mutex::new(HashMap::<Pass, PassStart>::new());
    lifecycle::every(PURGE_INTERVAL, shutdown, || async {
        let mut starts = starts.lock().await;
        let passes = topology.passes();
        // Passes no longer made (a shard's clients changed, or it moved) start afresh.
        starts.retain(|pass, _| passes.contains(pass));
        // A shard whose worker is down fails its part of the pass, not the others'.
        for pass in passes {
            let start = starts.entry(pass.clone()).or_default();
            match purge_from(outbox_retention, &pass, start).await {
                Ok(report) if report != PurgeReport::default() => tracing::info!(
                    records_deleted = report.records_deleted,
                    events_deleted = report.events_deleted,
                    "janitor pass"
                ),
                Ok(_) => {}
                Err(error) => tracing::warn!(
                    error = %error,
                    "janitor pass failed; retrying at the next interval"
                ),
            }
        }
    })
    .await
}
