//! One batch: the rows of its writes ([`rows`], everything computed that the statements need
//! but what must come from the database's clock), its transaction on the writes' route (in the
//! shape of the database's topology: [`Route::claim`]), and what it decided for each write. A key
//! it did not claim (another process holds or completed it) is read back and decided by its
//! record: a replay or a conflict.

use std::collections::HashMap;
use std::time::Duration;

use actix_web::web::Bytes;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::db::topology::{BatchRows, EventRow, Route, WriteRow};
use crate::db::{PgClient, StorageError, WriteHealth};
use crate::entry::{entry_json, format_time, Ordering, CREATED_STATUS};
use crate::events::{events_for, AuditFacts, EventSubject, ENTRY_CREATED};
use crate::idempotency::{canonical_json, RequestHash, ScopedKey};
use crate::write::{Decided, SavedRecord, Write, WriteError, WriterConfig};

/// The rows of `writes` (a batch), their entries stamped `created_at` (the database's time, as
/// estimated for the batch). An ordered write's answer and events are written again by the
/// statement once its sequence is known.
pub fn rows<'a>(
    writes: impl IntoIterator<Item = &'a Write>,
    config: &WriterConfig,
    created_at: DateTime<Utc>,
) -> Vec<WriteRow<'a>> {
    let created_at_text = format_time(created_at);
    writes
        .into_iter()
        .map(|write| {
            let entry_id = Uuid::now_v7();
            let request = &write.request;
            let response = entry_json(
                entry_id,
                &request.kind,
                &request.data_json,
                &created_at_text,
                None,
            );
            let audit = config.audit.then(|| AuditFacts {
                client_id: &write.key.client_id,
                idempotency_key: write.key.key.as_str(),
                request_hash_hex: request.hash.to_hex(),
                remote_addr: write.remote_addr.as_deref(),
            });
            let subject = EventSubject {
                entry_id,
                trace: write.trace.as_ref(),
                created_at: &created_at_text,
                entry_json: &response,
            };
            let events = events_for(&subject, audit)
                .into_iter()
                .map(|event| EventRow {
                    event_id: event.event_id,
                    event_key: event.event_key(entry_id),
                    event_type: event.event_type,
                    carries_entry: event.event_type == ENTRY_CREATED,
                    payload: event.payload,
                    traceparent: write.trace.as_ref().map(|t| t.traceparent.as_str()),
                    tracestate: write.trace.as_ref().and_then(|t| t.tracestate.as_deref()),
                })
                .collect();
            WriteRow {
                key: &write.key,
                request_hash: &request.hash,
                entry_id,
                kind: &request.kind,
                data: &request.data_json,
                created_at,
                response,
                ordering_key: request.ordering_key.as_deref(),
                events,
            }
        })
        .collect()
}

/// The record saved for `row`'s write, once committed with `sequence` (ordered writes): it
/// lives at least `retention` from the commit on the database's clock, so the daemon's
/// monotonic clock may count that long from now.
fn saved_record(row: &WriteRow<'_>, retention: Duration, sequence: Option<i64>) -> SavedRecord {
    let body = match (row.ordering_key, sequence) {
        (Some(key), Some(sequence)) => entry_json(
            row.entry_id,
            row.kind,
            row.data,
            &format_time(row.created_at),
            Some(Ordering { key, sequence }),
        ),
        _ => row.response.clone(),
    };
    SavedRecord {
        request_hash: *row.request_hash,
        status: CREATED_STATUS,
        body: Bytes::from(body),
        entry_id: Some(row.entry_id),
        live_until: live_until(retention),
    }
}

/// Now plus `remaining` on the monotonic clock, saturating far in the future.
fn live_until(remaining: Duration) -> std::time::Instant {
    let now = std::time::Instant::now();
    now.checked_add(remaining)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// Writes WAL in the probe's transaction, so that its commit is a real one: flushed, and
/// waited for by a synchronous standby.
const PROBE_WAL: &str = "SELECT pg_logical_emit_message(true, 'retrysafe', 'write probe')";

/// Whether writes would succeed now on `route`, without writing a row: the writers' statements
/// with no write in them ([`Route::begin_probe`]), in a transaction that writes a WAL record (so
/// a full disk fails its commit, and a synchronous standby must confirm it) and commits as a
/// batch does. Told to `health` either way. Run by readiness checks while writes fail, so that
/// readiness comes back by itself when they would succeed, even with no write arriving to tell.
pub async fn probe(route: &Route, health: &WriteHealth, limit: Duration) {
    let result = route
        .db
        .run_within(limit, async |connection| {
            let warnings = connection.warnings();
            route.begin_probe(connection).await?;
            let client: &tokio_postgres::Client = connection;
            let (wrote, committed) = tokio::join!(
                client.batch_execute(PROBE_WAL),
                client.batch_execute("COMMIT"),
            );
            wrote?;
            committed?;
            connection.confirm_commit(warnings)
        })
        .await;
    match result {
        Ok(()) => health.succeeded(route.node()),
        Err(error) => {
            tracing::debug!(error = %error, "write probe failed");
            health.failed(route.node(), &error);
        }
    }
}

/// Reads back the records of keys a batch did not claim, each with its key's position in the
/// arrays. Runs after the claim has committed, so it sees the rows that the claim found or
/// waited for. How long each record still lives is measured on the database's clock. The saved
/// answer of an ordered write gets its ordering key and sequence from the entry: the record is
/// written before the number is known.
const READ_BACK: &str = r#"
SELECT u.position, r.request_hash, r.response_status,
       CASE WHEN e.sequence IS NULL THEN r.response_json
            ELSE r.response_json || jsonb_build_object('ordering_key', e.ordering_key,
                                                       'sequence', e.sequence)
       END::text AS response_json,
       r.entry_id,
       greatest(extract(epoch FROM r.expires_at - now()), 0)::float8 AS remaining_seconds
FROM idempotency_records r
    JOIN unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(client_id, key, position)
        USING (client_id, key)
    LEFT JOIN entries e ON e.client_id = r.client_id AND e.id = r.entry_id
WHERE r.client_id = ANY($1)
"#;

/// Commits the batch `writes` on `route` ([`Route::claim`]), then reads back the records of the
/// keys it did not claim; decides each write, in the batch's order.
///
/// The read-back, when some keys were not claimed, comes after the commit and sees every
/// record the claim found or waited for (a record deleted in between by the janitor is
/// [`WriteError::RecordChanged`]: a retry starts afresh).
pub async fn commit(
    connection: &mut PgClient,
    (route, config): (&Route, &WriterConfig),
    writes: &[WriteRow<'_>],
) -> Result<Vec<Decided>, StorageError> {
    let sent = std::time::Instant::now();
    let warnings = connection.warnings();
    let rows = BatchRows {
        writes,
        retention: config.retention,
        response_status: CREATED_STATUS as i16,
    };
    let claimed = route.claim(connection, &rows).await?;
    connection.confirm_commit(warnings)?;
    if let Some(database_now) = claimed.database_now {
        config
            .clock
            .observe(database_now, sent, std::time::Instant::now());
    }

    let unclaimed: Vec<&ScopedKey> = writes
        .iter()
        .filter(|w| !claimed.entries.contains(&w.entry_id))
        .map(|w| w.key)
        .collect();
    let mut found: HashMap<&ScopedKey, SavedRecord> = HashMap::new();
    if !unclaimed.is_empty() {
        let read_back = connection.prepare_cached(READ_BACK).await?;
        let clients: Vec<&str> = unclaimed.iter().map(|key| &*key.client_id).collect();
        let keys: Vec<&str> = unclaimed.iter().map(|key| key.key.as_str()).collect();
        for row in connection.query(&read_back, &[&clients, &keys]).await? {
            let position = usize::try_from(row.get::<_, i64>("position") - 1).ok();
            if let Some(key) = position.and_then(|index| unclaimed.get(index)) {
                found.insert(key, saved_record_from_row(&row)?);
            }
        }
    }

    Ok(writes
        .iter()
        .map(|write| {
            if claimed.entries.contains(&write.entry_id) {
                let sequence = claimed.sequences.get(&write.entry_id).copied();
                return Decided::Created(saved_record(write, config.retention, sequence));
            }
            match found.remove(write.key) {
                Some(record) => Decided::Found(record),
                // Deleted by the janitor between the claim and the read: a retry starts afresh.
                None => Decided::Failed(WriteError::RecordChanged),
            }
        })
        .collect())
}

/// Decodes an idempotency record row of the form `READ_BACK` selects.
fn saved_record_from_row(row: &tokio_postgres::Row) -> Result<SavedRecord, StorageError> {
    let hash_bytes: Vec<u8> = row.get("request_hash");
    let request_hash = RequestHash::from_slice(&hash_bytes).ok_or_else(|| {
        StorageError::from(anyhow::anyhow!("stored request hash is not 32 bytes"))
    })?;
    let status: i16 = row.get("response_status");
    let json_text: String = row.get("response_json");
    let json: serde_json::Value = serde_json::from_str(&json_text).map_err(|error| {
        StorageError::from(anyhow::anyhow!("stored response is not JSON: {error}"))
    })?;
    Ok(SavedRecord {
        request_hash,
        status: status as u16,
        body: Bytes::from(canonical_json(&json)),
        entry_id: row.get("entry_id"),
        live_until: live_until(Duration::from_secs_f64(
            row.get::<_, f64>("remaining_seconds").clamp(0.0, 1e12),
        )),
    })
}
