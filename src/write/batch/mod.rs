//! One batch's transaction: a statement that claims every key with `INSERT ... ON CONFLICT`
//! and inserts the entries and outbox rows of the keys it claimed, committed as it returns; a
//! key it did not claim (another process holds or completed it) is read back and answered as a
//! replay or a conflict. Everything a batch's rows need is computed first ([`prepare`]); the
//! statement sets only what must come from the database's clock.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use actix_web::web::Bytes;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::db::citus::Topology;
use crate::db::{Database, PgClient, StorageError, WriteHealth};
use crate::entry::{entry_json, format_time, Ordering, CREATED_STATUS};
use crate::events::{events_for, AuditFacts, EventSubject, NewEvent};
use crate::idempotency::{canonical_json, RequestHash};
use crate::write::writer::{Committed, WriterConfig};

mod one_statement;
mod per_shard;
use crate::write::{SavedRecord, SavedResponse, Write, WriteError};

/// A write with everything computed that its rows need. When its record expires is not among
/// them: the statement sets that from the database's own clock.
pub(crate) struct PreparedWrite<'a> {
    write: &'a Write,
    entry_id: Uuid,
    /// The database's time, as estimated for the batch ([`stamp`]).
    created_at: DateTime<Utc>,
    /// The entry as the API shows it: the saved response's body, and the data of its event.
    response_body: String,
    events: Vec<NewEvent>,
}

impl PreparedWrite<'_> {
    pub(crate) fn client_id(&self) -> &str {
        &self.write.key.client_id
    }
}

pub(crate) fn prepare<'a>(
    write: &'a Write,
    config: &WriterConfig,
    created_at: DateTime<Utc>,
) -> PreparedWrite<'a> {
    let created_at_text = format_time(created_at);
    let entry_id = Uuid::now_v7();
    let request = &write.request;
    // An ordered write's answer is written again once its sequence is known (`answer`).
    let response_body = entry_json(
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
        entry_json: &response_body,
    };
    let events = events_for(&subject, audit);
    PreparedWrite {
        write,
        entry_id,
        created_at,
        response_body,
        events,
    }
}

impl PreparedWrite<'_> {
    /// The record saved for this write, once committed with `sequence` (ordered writes): it
    /// lives at least `retention` from the commit on the database's clock, so the daemon's
    /// monotonic clock may count that long from now.
    fn saved_record(&self, retention: Duration, sequence: Option<i64>) -> SavedRecord {
        let request = &self.write.request;
        let body = match (request.ordering_key.as_deref(), sequence) {
            (Some(key), Some(sequence)) => entry_json(
                self.entry_id,
                &request.kind,
                &request.data_json,
                &format_time(self.created_at),
                Some(Ordering { key, sequence }),
            ),
            _ => self.response_body.clone(),
        };
        SavedRecord {
            request_hash: request.hash,
            response: SavedResponse {
                status: CREATED_STATUS,
                body: Bytes::from(body),
                entry_id: Some(self.entry_id),
                live_until: live_until(retention),
            },
        }
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

/// Whether writes would succeed now, without writing a row: the writers' statements with no
/// write in them (so a schema they do not fit, a read-only database, a lost connection or, on
/// Citus, a worker down fail them as they fail writes), in a transaction that writes a WAL
/// record (so a full disk fails its commit, and a synchronous standby must confirm it) and
/// commits as a batch does. Told to `health` either way. Run by readiness checks while writes
/// fail, so that readiness comes back by itself when they would succeed, even with no write
/// arriving to tell. On Citus, `client` picks the shard (the readiness check turns through the
/// clients, so that any worker back makes the daemon ready).
pub async fn probe(
    db: &Database,
    (health, topology): (&WriteHealth, &Topology),
    client: &str,
    limit: Duration,
) {
    let result = db
        .run_within(limit, async |connection| {
            let warnings = connection.warnings();
            if topology.is_citus() {
                let client_handle: &tokio_postgres::Client = connection;
                client_handle
                    .batch_execute(crate::db::citus::BEGIN_WITH_VALUES)
                    .await?;
                per_shard::probe_on(connection, client).await?;
            } else {
                let (statement, columns) = one_statement::prepare_probe(connection).await?;
                let params = columns.params();
                let client_handle: &tokio_postgres::Client = connection;
                let (begun, claimed) = tokio::join!(
                    client_handle.batch_execute("BEGIN"),
                    client_handle.query_one(&statement, &params),
                );
                begun?;
                claimed?;
            }
            let client_handle: &tokio_postgres::Client = connection;
            let (wrote, committed) = tokio::join!(
                client_handle.batch_execute(PROBE_WAL),
                client_handle.batch_execute("COMMIT"),
            );
            wrote?;
            committed?;
            connection.confirm_commit(warnings)
        })
        .await;
    let node = topology.node_of_client(client);
    match result {
        Ok(()) => health.succeeded(node.as_deref()),
        Err(error) => {
            tracing::debug!(error = %error, "write probe failed");
            health.failed(node.as_deref(), &error);
        }
    }
}

/// Reads back the records of keys a batch did not claim. Runs after the claim has committed,
/// so it sees the rows that the claim found or waited for. How long each record still lives is
/// measured on the database's clock. The saved answer of an ordered write gets its ordering
/// key and sequence from the entry: the record is written before the number is known.
const READ_BACK: &str = r#"
SELECT r.client_id, r.key, r.request_hash, r.response_status,
       CASE WHEN e.sequence IS NULL THEN r.response_json
            ELSE r.response_json || jsonb_build_object('ordering_key', e.ordering_key,
                                                       'sequence', e.sequence)
       END::text AS response_json,
       r.entry_id,
       greatest(extract(epoch FROM r.expires_at - now()), 0)::float8 AS remaining_seconds
FROM idempotency_records r
    JOIN unnest($1::text[], $2::text[]) AS u(client_id, key) USING (client_id, key)
    LEFT JOIN entries e ON e.client_id = r.client_id AND e.id = r.entry_id
WHERE r.client_id = ANY($1)
"#;

/// What a batch's claim found: the keys it claimed (their entries and events are written), the
/// sequences of its ordered writes, and the database's time when it ran.
pub(crate) struct Claimed {
    /// None when the statements that return it returned no row (no key claimed, on Citus).
    pub database_now: Option<DateTime<Utc>>,
    pub keys: HashSet<(String, String)>,
    pub sequence_of: HashMap<Uuid, i64>,
}

/// Claims the batch's keys and writes the claimed ones' rows, in one transaction committed in
/// one round trip (in one statement on a single server, [`one_statement`]; in a few
/// single-shard statements on Citus, [`per_shard`]), then reads back the records of the others.
/// One outcome per write, in the batch's order.
///
/// The transaction's COMMIT is a simple query sent with the statements: its answer comes after
/// the commit's wait for a synchronous standby, and after any warning that the wait was
/// cancelled, which `confirm_commit` then sees. A failed statement leaves the transaction
/// aborted, and PostgreSQL answers the COMMIT with ROLLBACK. The read-back, when some keys were
/// not claimed, comes after that commit and sees every record the claim found or waited for (a
/// record deleted in between by the janitor is [`WriteError::RecordChanged`]: a retry starts
/// afresh).
pub(crate) async fn commit(
    connection: &mut PgClient,
    config: &WriterConfig,
    prepared: &[PreparedWrite<'_>],
) -> Result<Vec<Result<Committed, WriteError>>, StorageError> {
    let sent = std::time::Instant::now();
    let warnings = connection.warnings();
    let claimed = if config.topology.is_citus() {
        per_shard::claim(connection, config, prepared).await?
    } else {
        one_statement::claim(connection, config, prepared).await?
    };
    connection.confirm_commit(warnings)?;
    if let Some(database_now) = claimed.database_now {
        config
            .clock
            .observe(database_now, sent, std::time::Instant::now());
    }
    let is_claimed = |p: &PreparedWrite| {
        claimed.keys.contains(&(
            p.write.key.client_id.to_string(),
            p.write.key.key.as_str().to_owned(),
        ))
    };

    let unclaimed: Vec<&PreparedWrite> = prepared.iter().filter(|p| !is_claimed(p)).collect();
    let mut existing: HashMap<(String, String), SavedRecord> = HashMap::new();
    if !unclaimed.is_empty() {
        let read_back = connection.prepare_cached(READ_BACK).await?;
        let clients: Vec<&str> = unclaimed.iter().map(|p| &*p.write.key.client_id).collect();
        let keys: Vec<&str> = unclaimed.iter().map(|p| p.write.key.key.as_str()).collect();
        for found in connection.query(&read_back, &[&clients, &keys]).await? {
            let record = saved_record_from_row(&found)?;
            existing.insert((found.get(0), found.get(1)), record);
        }
    }

    Ok(prepared
        .iter()
        .map(|p| {
            if is_claimed(p) {
                let sequence = claimed.sequence_of.get(&p.entry_id).copied();
                return Ok(Committed::Created(
                    p.saved_record(config.retention, sequence),
                ));
            }
            let id = (
                p.write.key.client_id.to_string(),
                p.write.key.key.as_str().to_owned(),
            );
            match existing.remove(&id) {
                Some(record) => Ok(Committed::Existing(record)),
                // Deleted by the janitor between the claim and the read: a retry starts afresh.
                None => Err(WriteError::RecordChanged),
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
        response: SavedResponse {
            status: status as u16,
            body: Bytes::from(canonical_json(&json)),
            entry_id: row.get("entry_id"),
            live_until: live_until(Duration::from_secs_f64(
                row.get::<_, f64>("remaining_seconds").clamp(0.0, 1e12),
            )),
        },
    })
}
