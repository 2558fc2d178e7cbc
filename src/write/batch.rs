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

use crate::db::{Database, PgClient, StorageError, WriteHealth};
use crate::entry::{entry_json, format_time, Ordering, CREATED_STATUS};
use crate::events::{events_for, AuditFacts, EventSubject, NewEvent, ENTRY_CREATED};
use crate::idempotency::{canonical_json, RequestHash};
use crate::write::writer::{Committed, WriterConfig};
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

/// Whether writes would succeed now, without writing a row: the writers' statement with no
/// write in it (so a schema it does not fit, a read-only database or a lost connection fail it
/// as they fail writes), in a transaction that writes a WAL record (so a full disk fails its
/// commit, and a synchronous standby must confirm it) and commits as a batch does. Told to
/// `health` either way. Run by readiness checks while writes fail, so that readiness comes
/// back by itself when they would succeed, even with no write arriving to tell.
pub async fn probe(db: &Database, health: &WriteHealth, limit: Duration) {
    let result = db
        .run_within(limit, async |connection| {
            let statement = connection.prepare_cached(CLAIM_AND_INSERT).await?;
            let columns = Columns::new(&[], Duration::ZERO);
            let params = columns.params();
            let warnings = connection.warnings();
            let client: &tokio_postgres::Client = connection;
            let (begun, claimed, wrote, committed) = tokio::join!(
                client.batch_execute("BEGIN"),
                client.query_one(&statement, &params),
                client.batch_execute(PROBE_WAL),
                client.batch_execute("COMMIT"),
            );
            begun?;
            claimed?;
            wrote?;
            committed?;
            connection.confirm_commit(warnings)
        })
        .await;
    match result {
        Ok(()) => health.succeeded(),
        Err(error) => {
            tracing::debug!(error = %error, "write probe failed");
            health.failed(&error);
        }
    }
}

/// The claim statement around its `sequenced` CTE (the ordered writes' numbers).
macro_rules! claim_and_insert {
    ($sequenced:literal) => {
        concat!(
            r#"
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::bytea[], $4::uuid[], $5::text[], $6::text[],
                $7::timestamptz[], $8::text[], $17::text[]) WITH ORDINALITY
        AS t(client_id, key, request_hash, entry_id, kind, data, created_at, response_json,
             ordering_key, position)
),
claimed AS (
    INSERT INTO idempotency_records AS r
        (client_id, key, request_hash, status, response_status, response_json, entry_id,
         created_at, expires_at)
    SELECT client_id, key, request_hash, 'completed', $15::smallint, response_json::jsonb,
           entry_id, created_at,
           greatest(created_at, now()) + $16::bigint * interval '1 microsecond'
    FROM input
    ORDER BY client_id, key
    ON CONFLICT (client_id, key) DO UPDATE
        SET request_hash = EXCLUDED.request_hash,
            status = EXCLUDED.status,
            response_status = EXCLUDED.response_status,
            response_json = EXCLUDED.response_json,
            entry_id = EXCLUDED.entry_id,
            created_at = EXCLUDED.created_at,
            expires_at = EXCLUDED.expires_at
        WHERE r.expires_at <= now()
    RETURNING client_id, key
),
"#,
            $sequenced,
            r#"new_entries AS (
    INSERT INTO entries (id, client_id, idempotency_key, kind, data, created_at, ordering_key,
                         sequence)
    SELECT i.entry_id, i.client_id, i.key, i.kind, i.data::jsonb, i.created_at, s.ordering_key,
           s.sequence
    FROM input i JOIN claimed c USING (client_id, key) LEFT JOIN sequenced s USING (entry_id)
),
new_events AS (
    INSERT INTO outbox_events
        (event_id, event_key, client_id, idempotency_key, event_type, payload, created_at,
         next_attempt_at, ordering_key, sequence, traceparent, tracestate)
    SELECT e.event_id, e.event_key, e.client_id, e.key, e.event_type,
           CASE WHEN s.sequence IS NULL THEN e.payload::jsonb
                ELSE jsonb_set(
                    e.payload::jsonb || jsonb_build_object('partitionkey', s.ordering_key,
                                                           'sequence', s.sequence::text),
                    '{data}',
                    CASE WHEN e.carries_entry
                         THEN (e.payload::jsonb -> 'data')
                              || jsonb_build_object('ordering_key', s.ordering_key,
                                                    'sequence', s.sequence)
                         ELSE e.payload::jsonb -> 'data' END)
           END,
           now(),
           CASE WHEN s.held THEN 'infinity'::timestamptz ELSE now() END,
           s.ordering_key, s.sequence, e.traceparent, e.tracestate
    FROM unnest($9::uuid[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[],
                $18::uuid[], $19::bool[], $20::text[], $21::text[])
            AS e(event_id, event_key, client_id, key, event_type, payload, entry_id,
                 carries_entry, traceparent, tracestate)
        JOIN claimed c USING (client_id, key)
        LEFT JOIN sequenced s USING (entry_id)
    -- Ids drawn in sequence order, under the key's lock: a key's events are in id order too
    -- (what a replay, which walks the outbox by id, sends them in).
    ORDER BY s.sequence
)
SELECT now(), array_agg(client_id), array_agg(key),
       (SELECT array_agg(entry_id) FROM sequenced),
       (SELECT array_agg(sequence) FROM sequenced)
FROM claimed
"#
        )
    };
}

/// Claims the keys, inserts entries and outbox rows for the claimed ones, in one statement.
///
/// Keys are inserted in `(client_id, key)` order so that two daemons' batches sharing keys wait
/// for each other instead of deadlocking. A record past `expires_at` that the janitor has not
/// deleted yet is taken over: after its retention a key is new again, whenever the janitor runs.
///
/// `expires_at` is the database's `now()` plus the retention ($16, in microseconds), never a
/// time the daemon sends: a daemon whose clock is behind would otherwise write records that the
/// database already sees as expired, and the next request for the key would take it over (a
/// duplicate write). `created_at` is the daemon's estimate of the database's time (the answer
/// and the events carry it, so it is known before the statement runs); `greatest` keeps a
/// record's life at least the retention however far that estimate is off. The statement
/// returns the database's `now()` with the claimed keys, for the next estimate.
///
/// Ordered writes (an ordering key, $17) are numbered here, once their keys are claimed (a
/// replay or a conflict gets no number, so sequences have no gap): the upsert of
/// `ordering_keys` takes the key's row lock, after every idempotency record (`ordered` reads
/// all of `claimed` before its window functions yield a row) and in `(client_id,
/// ordering_key)` order, the order every relay locks them in too, so no two transactions wait
/// for each other in a circle. The lock lasts until this statement commits: the key's next
/// write waits for it and so commits later, with the next number. The writes of one key in one
/// batch are numbered in batch order. An event whose write is not next in line to be published
/// (its key's earlier events are not all sent: `done_through` behind) is held: due at
/// `infinity`, out of the relays' range until a relay (or `outbox skip`) releases it. Its
/// CloudEvent gets `partitionkey` and `sequence`, and `entry.created`'s data (the entry, $18)
/// its `ordering_key` and `sequence`. Batches without an ordered write take
/// [`CLAIM_AND_INSERT_UNORDERED`].
const CLAIM_AND_INSERT: &str = claim_and_insert!(
    r#"ordered AS (
    SELECT i.client_id, i.ordering_key, i.entry_id,
           row_number() OVER same_key AS rank,
           count(*) OVER (PARTITION BY i.client_id, i.ordering_key) AS writes
    FROM input i JOIN claimed c USING (client_id, key)
    WHERE i.ordering_key IS NOT NULL
    WINDOW same_key AS (PARTITION BY i.client_id, i.ordering_key ORDER BY i.position)
),
counters AS (
    INSERT INTO ordering_keys AS k (client_id, ordering_key, last_sequence, done_through)
    SELECT client_id, ordering_key, max(writes), 0
    FROM ordered
    GROUP BY client_id, ordering_key
    ORDER BY client_id, ordering_key
    ON CONFLICT (client_id, ordering_key) DO UPDATE
        SET last_sequence = k.last_sequence + EXCLUDED.last_sequence
    RETURNING client_id, ordering_key, last_sequence, done_through
),
sequenced AS (
    SELECT o.entry_id, o.ordering_key,
           k.last_sequence - o.writes + o.rank AS sequence,
           k.last_sequence - o.writes + o.rank - 1 > k.done_through AS held
    FROM ordered o JOIN counters k USING (client_id, ordering_key)
),
"#
);

/// [`CLAIM_AND_INSERT`] for a batch without an ordered write: `sequenced` is empty without
/// reading `claimed` again or touching `ordering_keys`, so writes without an ordering key pay
/// nothing for the feature (the ordered statement cost them 6-10 % of their rate;
/// BENCHMARKS.md, "Ordered delivery").
const CLAIM_AND_INSERT_UNORDERED: &str = claim_and_insert!(
    r#"sequenced AS (
    SELECT NULL::uuid AS entry_id, NULL::text AS ordering_key, NULL::bigint AS sequence,
           NULL::boolean AS held
    WHERE false
),
"#
);

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
"#;

/// The claim statement's parameters: one array per column, built from the prepared writes (the
/// first eight: one element per write) and their events (the next six: one per event), the
/// response status and the retention, then the writes' ordering keys and four more arrays of
/// the events.
struct Columns<'a> {
    client_ids: Vec<&'a str>,
    keys: Vec<&'a str>,
    hashes: Vec<&'a [u8]>,
    entry_ids: Vec<Uuid>,
    kinds: Vec<&'a str>,
    data: Vec<&'a str>,
    created: Vec<DateTime<Utc>>,
    responses: Vec<&'a str>,
    event_ids: Vec<Uuid>,
    event_keys: Vec<String>,
    event_clients: Vec<&'a str>,
    event_idempotency_keys: Vec<&'a str>,
    event_types: Vec<&'a str>,
    payloads: Vec<&'a str>,
    response_status: i16,
    retention_micros: i64,
    ordering_keys: Vec<Option<&'a str>>,
    event_entry_ids: Vec<Uuid>,
    event_traceparents: Vec<Option<&'a str>>,
    event_tracestates: Vec<Option<&'a str>>,
    /// The event's data is the entry (`entry.created`): an ordered write's sequence goes in it.
    event_carries_entry: Vec<bool>,
}

impl<'a> Columns<'a> {
    fn new(prepared: &'a [PreparedWrite<'a>], retention: Duration) -> Self {
        let writes = || prepared.iter();
        let events = || {
            prepared
                .iter()
                .flat_map(|p| p.events.iter().map(move |event| (p, event)))
        };
        Self {
            client_ids: writes().map(|p| &*p.write.key.client_id).collect(),
            keys: writes().map(|p| p.write.key.key.as_str()).collect(),
            hashes: writes().map(|p| &p.write.request.hash.0[..]).collect(),
            entry_ids: writes().map(|p| p.entry_id).collect(),
            kinds: writes().map(|p| p.write.request.kind.as_str()).collect(),
            data: writes()
                .map(|p| p.write.request.data_json.as_str())
                .collect(),
            created: writes().map(|p| p.created_at).collect(),
            responses: writes().map(|p| p.response_body.as_str()).collect(),
            event_ids: events().map(|(_, e)| e.event_id).collect(),
            event_keys: events().map(|(p, e)| e.event_key(p.entry_id)).collect(),
            event_clients: events().map(|(p, _)| &*p.write.key.client_id).collect(),
            event_idempotency_keys: events().map(|(p, _)| p.write.key.key.as_str()).collect(),
            event_types: events().map(|(_, e)| e.event_type).collect(),
            payloads: events().map(|(_, e)| e.payload.as_str()).collect(),
            response_status: CREATED_STATUS as i16,
            retention_micros: i64::try_from(retention.as_micros()).unwrap_or(i64::MAX),
            ordering_keys: writes()
                .map(|p| p.write.request.ordering_key.as_deref())
                .collect(),
            event_entry_ids: events().map(|(p, _)| p.entry_id).collect(),
            event_traceparents: events()
                .map(|(p, _)| p.write.trace.as_ref().map(|t| t.traceparent.as_str()))
                .collect(),
            event_tracestates: events()
                .map(|(p, _)| p.write.trace.as_ref().and_then(|t| t.tracestate.as_deref()))
                .collect(),
            event_carries_entry: events()
                .map(|(_, e)| e.event_type == ENTRY_CREATED)
                .collect(),
        }
    }

    /// In the order of `CLAIM_AND_INSERT`'s parameters.
    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 21] {
        [
            &self.client_ids,
            &self.keys,
            &self.hashes,
            &self.entry_ids,
            &self.kinds,
            &self.data,
            &self.created,
            &self.responses,
            &self.event_ids,
            &self.event_keys,
            &self.event_clients,
            &self.event_idempotency_keys,
            &self.event_types,
            &self.payloads,
            &self.response_status,
            &self.retention_micros,
            &self.ordering_keys,
            &self.event_entry_ids,
            &self.event_carries_entry,
            &self.event_traceparents,
            &self.event_tracestates,
        ]
    }
}

/// Claims the batch's keys and writes the claimed ones' rows in one statement, then reads back
/// the records of the others. One outcome per write, in the batch's order.
///
/// The claim is a single statement sent outside an explicit transaction: PostgreSQL runs it
/// in a transaction of its own and commits it before it answers, so a batch costs one round
/// trip where `BEGIN`, the statement and `COMMIT` cost three. The read-back, when some keys
/// were not claimed, comes after that commit and sees every record the claim found or waited
/// for (a record deleted in between by the janitor is [`WriteError::RecordChanged`]: a retry
/// starts afresh).
pub(crate) async fn commit(
    connection: &mut PgClient,
    config: &WriterConfig,
    prepared: &[PreparedWrite<'_>],
) -> Result<Vec<Result<Committed, WriteError>>, StorageError> {
    let statement = if prepared
        .iter()
        .any(|p| p.write.request.ordering_key.is_some())
    {
        CLAIM_AND_INSERT
    } else {
        CLAIM_AND_INSERT_UNORDERED
    };
    let claim_and_insert = connection.prepare_cached(statement).await?;
    let read_back = connection.prepare_cached(READ_BACK).await?;

    let columns = Columns::new(prepared, config.retention);
    let sent = std::time::Instant::now();
    // In a transaction whose COMMIT is a simple query, all three sent together (one round
    // trip): its answer comes after the commit's wait for a synchronous standby, and after any
    // warning that the wait was cancelled, which `confirm_commit` then sees. (The statement
    // alone, committed at its Sync, could return its row before that warning arrived.) A
    // failed statement leaves the transaction aborted, and PostgreSQL answers the COMMIT with
    // ROLLBACK.
    let warnings = connection.warnings();
    let client: &tokio_postgres::Client = connection;
    let params = columns.params();
    let (begun, row, committed) = tokio::join!(
        client.batch_execute("BEGIN"),
        client.query_one(&claim_and_insert, &params),
        client.batch_execute("COMMIT"),
    );
    begun?;
    let row = row?;
    committed?;
    connection.confirm_commit(warnings)?;
    config
        .clock
        .observe(row.get(0), sent, std::time::Instant::now());
    // array_agg over no rows is NULL: nothing was claimed.
    let claimed_clients: Vec<String> = row.get::<_, Option<Vec<String>>>(1).unwrap_or_default();
    let claimed_keys: Vec<String> = row.get::<_, Option<Vec<String>>>(2).unwrap_or_default();
    let claimed: HashSet<(String, String)> =
        claimed_clients.into_iter().zip(claimed_keys).collect();
    let sequenced_entries: Vec<Uuid> = row.get::<_, Option<Vec<Uuid>>>(3).unwrap_or_default();
    let sequences: Vec<i64> = row.get::<_, Option<Vec<i64>>>(4).unwrap_or_default();
    let sequence_of: HashMap<Uuid, i64> = sequenced_entries.into_iter().zip(sequences).collect();
    let is_claimed = |p: &PreparedWrite| {
        claimed.contains(&(
            p.write.key.client_id.to_string(),
            p.write.key.key.as_str().to_owned(),
        ))
    };

    let unclaimed: Vec<&PreparedWrite> = prepared.iter().filter(|p| !is_claimed(p)).collect();
    let mut existing: HashMap<(String, String), SavedRecord> = HashMap::new();
    if !unclaimed.is_empty() {
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
                let sequence = sequence_of.get(&p.entry_id).copied();
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
