//! The batch on Citus: the writes of one shard (every client of the batch has its rows on the
//! same shard of each co-located table, see `write::queue`), in a few statements that Citus
//! routes to that shard's worker alone, so that the transaction is a single-shard one,
//! committed on one worker without a two-phase commit.
//!
//! Citus cannot route the single statement of [`super::one_statement`]: an `INSERT ... SELECT`
//! from a function of the daemon's arrays goes "via the coordinator" (several round trips to the
//! worker), and `now()` in its `ON CONFLICT ... WHERE` is refused. So:
//!
//! 1. the keys are claimed by `INSERT ... VALUES` (a row per write, [`CLAIM_ROWS_PER_STATEMENT`]
//!    at most per statement), which Citus routes to the shard; a record that has expired is
//!    taken over when its `expires_at` is at or before the new record's `created_at`, which is
//!    the database's `now()` (evaluated once, on the coordinator);
//! 2. the writes' rows are inserted by `INSERT ... SELECT` from the claimed records joined with
//!    the daemon's arrays: Citus pushes these down to the shard, since they read a co-located
//!    table by its distribution column. A write whose key another request holds finds no
//!    record with its entry id, and so inserts nothing;
//! 3. an ordered batch first counts its claimed writes into `ordering_keys` (the key's row lock,
//!    in `(client_id, ordering_key)` order, as on a single server), and the entries and events
//!    take their sequence and whether they are held from it.
//!
//! All are sent at once with `BEGIN` and `COMMIT`: one round trip to the coordinator.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock, PoisonError};

use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::db::{PgClient, StorageError};
use crate::entry::CREATED_STATUS;
use crate::events::ENTRY_CREATED;
use crate::write::batch::{Claimed, PreparedWrite};
use crate::write::writer::WriterConfig;

/// Rows one claim statement takes at most: a batch of more is claimed by several statements
/// in its transaction. Each row count has a statement of its own (prepared once per
/// connection), so this also bounds how many the daemon makes.
const CLAIM_ROWS_PER_STATEMENT: usize = 64;

/// Parameters of a claim row: client, key, request hash, response, entry id.
const CLAIM_ROW_PARAMETERS: usize = 5;

/// The claim statement for `rows` writes: `$1` the response status, `$2` the retention in
/// microseconds, then five parameters per write.
fn claim_statement(rows: usize) -> &'static str {
    static MADE: OnceLock<Mutex<HashMap<usize, &'static str>>> = OnceLock::new();
    let mut made = MADE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    made.entry(rows).or_insert_with(|| {
        let values: Vec<String> = (0..rows)
            .map(|row| {
                let first = 3 + row * CLAIM_ROW_PARAMETERS;
                format!(
                    "(${}, ${}, ${}::bytea, 'completed', $1::smallint, ${}::text::jsonb, ${}::uuid, now(), now() + $2::bigint * interval '1 microsecond')",
                    first,
                    first + 1,
                    first + 2,
                    first + 3,
                    first + 4
                )
            })
            .collect();
        // Made once per row count and kept for the process's life: a prepared statement's
        // text must outlive the connections that cache it.
        Box::leak(
            format!(
                "INSERT INTO idempotency_records AS r
    (client_id, key, request_hash, status, response_status, response_json, entry_id,
     created_at, expires_at)
VALUES {}
ON CONFLICT (client_id, key) DO UPDATE
    SET request_hash = EXCLUDED.request_hash,
        status = EXCLUDED.status,
        response_status = EXCLUDED.response_status,
        response_json = EXCLUDED.response_json,
        entry_id = EXCLUDED.entry_id,
        created_at = EXCLUDED.created_at,
        expires_at = EXCLUDED.expires_at
    WHERE r.expires_at <= EXCLUDED.created_at
RETURNING client_id, key, created_at",
                values.join(",\n       ")
            )
            .into_boxed_str(),
        )
    })
}

/// Counts the claimed ordered writes of each (client, ordering key) into its counter, taking
/// the counter's row lock in key order (see the single server's `CLAIM_AND_INSERT`). `$1..$4`:
/// the writes' clients, keys, entry ids and ordering keys; `$5` the batch's clients.
const COUNT_ORDERED: &str = "
INSERT INTO ordering_keys AS k (client_id, ordering_key, last_sequence, done_through)
SELECT r.client_id, w.ordering_key, count(*), 0
FROM unnest($1::text[], $2::text[], $3::uuid[], $4::text[])
        AS w(client_id, key, entry_id, ordering_key)
    JOIN idempotency_records r
        ON r.client_id = w.client_id AND r.key = w.key AND r.entry_id = w.entry_id
WHERE r.client_id = ANY($5) AND w.ordering_key IS NOT NULL
GROUP BY r.client_id, w.ordering_key
ORDER BY r.client_id, w.ordering_key
ON CONFLICT (client_id, ordering_key) DO UPDATE
    SET last_sequence = k.last_sequence + EXCLUDED.last_sequence";

/// The claimed writes' entries; an ordered one is numbered after its key's counter, which
/// [`COUNT_ORDERED`] has moved on by the batch's writes of the key: the key's writes in the
/// batch take the numbers up to it, in batch order. `$1..$8`: the writes' clients, keys, entry
/// ids, kinds, data, times and ordering keys (in batch order); `$8` the batch's clients.
const INSERT_ENTRIES: &str = "
INSERT INTO entries (id, client_id, idempotency_key, kind, data, created_at, ordering_key,
                     sequence)
SELECT w.entry_id, r.client_id, r.key, w.kind, w.data::jsonb, w.created_at, w.ordering_key,
       k.last_sequence
           - count(*) OVER (PARTITION BY r.client_id, w.ordering_key)
           + row_number() OVER (PARTITION BY r.client_id, w.ordering_key ORDER BY w.position)
FROM unnest($1::text[], $2::text[], $3::uuid[], $4::text[], $5::text[], $6::timestamptz[],
            $7::text[]) WITH ORDINALITY
        AS w(client_id, key, entry_id, kind, data, created_at, ordering_key, position)
    JOIN idempotency_records r
        ON r.client_id = w.client_id AND r.key = w.key AND r.entry_id = w.entry_id
    LEFT JOIN ordering_keys k
        ON k.client_id = r.client_id AND k.ordering_key = w.ordering_key
WHERE r.client_id = ANY($8)
RETURNING id, sequence";

/// The claimed writes' events. An ordered write's event takes its entry's sequence, and is held
/// (due at `infinity`, released by a relay) unless every earlier write of its key is done.
/// `$1..$10`: the events' ids, keys, clients, idempotency keys, types, payloads, entry ids,
/// whether they carry the entry, trace parents and states; `$11` the batch's clients.
const INSERT_EVENTS: &str = "
INSERT INTO outbox_events
    (event_id, event_key, client_id, idempotency_key, event_type, payload, created_at,
     next_attempt_at, ordering_key, sequence, traceparent, tracestate)
SELECT e.event_id, e.event_key, r.client_id, r.key, e.event_type,
       CASE WHEN n.sequence IS NULL THEN e.payload::jsonb
            ELSE jsonb_set(
                e.payload::jsonb || jsonb_build_object('partitionkey', n.ordering_key,
                                                       'sequence', n.sequence::text),
                '{data}',
                CASE WHEN e.carries_entry
                     THEN (e.payload::jsonb -> 'data')
                          || jsonb_build_object('ordering_key', n.ordering_key,
                                                'sequence', n.sequence)
                     ELSE e.payload::jsonb -> 'data' END)
       END,
       now(),
       CASE WHEN n.sequence - 1 > k.done_through THEN 'infinity'::timestamptz ELSE now() END,
       n.ordering_key, n.sequence, e.traceparent, e.tracestate
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
            $7::uuid[], $8::bool[], $9::text[], $10::text[])
        AS e(event_id, event_key, client_id, key, event_type, payload, entry_id,
             carries_entry, traceparent, tracestate)
    JOIN idempotency_records r
        ON r.client_id = e.client_id AND r.key = e.key AND r.entry_id = e.entry_id
    LEFT JOIN entries n ON n.client_id = r.client_id AND n.id = e.entry_id
    LEFT JOIN ordering_keys k ON k.client_id = r.client_id AND k.ordering_key = n.ordering_key
WHERE r.client_id = ANY($11)
-- Ids drawn in sequence order, under the key's lock, as on a single server.
ORDER BY n.sequence";

/// One write's parameters of the claim statement.
struct ClaimRow<'a> {
    client: &'a str,
    key: &'a str,
    hash: &'a [u8],
    response: &'a str,
    entry_id: Uuid,
}

/// The batch's writes and events as the statements' arrays.
struct Arrays<'a> {
    clients: Vec<&'a str>,
    keys: Vec<&'a str>,
    entry_ids: Vec<Uuid>,
    kinds: Vec<&'a str>,
    data: Vec<&'a str>,
    created: Vec<DateTime<Utc>>,
    ordering_keys: Vec<Option<&'a str>>,
    batch_clients: Vec<&'a str>,
    event_ids: Vec<Uuid>,
    event_keys: Vec<String>,
    event_clients: Vec<&'a str>,
    event_idempotency_keys: Vec<&'a str>,
    event_types: Vec<&'a str>,
    payloads: Vec<&'a str>,
    event_entry_ids: Vec<Uuid>,
    event_carries_entry: Vec<bool>,
    event_traceparents: Vec<Option<&'a str>>,
    event_tracestates: Vec<Option<&'a str>>,
}

impl<'a> Arrays<'a> {
    fn new(prepared: &'a [PreparedWrite<'a>]) -> Self {
        let writes = || prepared.iter();
        let events = || {
            prepared
                .iter()
                .flat_map(|p| p.events.iter().map(move |event| (p, event)))
        };
        let mut batch_clients: Vec<&str> = writes().map(|p| &*p.write.key.client_id).collect();
        batch_clients.sort_unstable();
        batch_clients.dedup();
        Self {
            clients: writes().map(|p| &*p.write.key.client_id).collect(),
            keys: writes().map(|p| p.write.key.key.as_str()).collect(),
            entry_ids: writes().map(|p| p.entry_id).collect(),
            kinds: writes().map(|p| p.write.request.kind.as_str()).collect(),
            data: writes()
                .map(|p| p.write.request.data_json.as_str())
                .collect(),
            created: writes().map(|p| p.created_at).collect(),
            ordering_keys: writes()
                .map(|p| p.write.request.ordering_key.as_deref())
                .collect(),
            batch_clients,
            event_ids: events().map(|(_, e)| e.event_id).collect(),
            event_keys: events().map(|(p, e)| e.event_key(p.entry_id)).collect(),
            event_clients: events().map(|(p, _)| &*p.write.key.client_id).collect(),
            event_idempotency_keys: events().map(|(p, _)| p.write.key.key.as_str()).collect(),
            event_types: events().map(|(_, e)| e.event_type).collect(),
            payloads: events().map(|(_, e)| e.payload.as_str()).collect(),
            event_entry_ids: events().map(|(p, _)| p.entry_id).collect(),
            event_carries_entry: events()
                .map(|(_, e)| e.event_type == ENTRY_CREATED)
                .collect(),
            event_traceparents: events()
                .map(|(p, _)| p.write.trace.as_ref().map(|t| t.traceparent.as_str()))
                .collect(),
            event_tracestates: events()
                .map(|(p, _)| p.write.trace.as_ref().and_then(|t| t.tracestate.as_deref()))
                .collect(),
        }
    }
}

/// Claims and writes the batch (the writes of one shard), committed with it.
pub(super) async fn claim(
    connection: &mut PgClient,
    config: &WriterConfig,
    prepared: &[PreparedWrite<'_>],
) -> Result<Claimed, StorageError> {
    // Keys claimed in (client, key) order, as on a single server: two batches sharing keys
    // wait for each other rather than deadlock.
    let mut order: Vec<&PreparedWrite> = prepared.iter().collect();
    order.sort_by(|a, b| {
        (&*a.write.key.client_id, a.write.key.key.as_str())
            .cmp(&(&*b.write.key.client_id, b.write.key.key.as_str()))
    });
    let status = CREATED_STATUS as i16;
    let retention = i64::try_from(config.retention.as_micros()).unwrap_or(i64::MAX);
    let rows: Vec<ClaimRow> = order
        .iter()
        .map(|p| ClaimRow {
            client: &p.write.key.client_id,
            key: p.write.key.key.as_str(),
            hash: &p.write.request.hash.0[..],
            response: &p.response_body,
            entry_id: p.entry_id,
        })
        .collect();
    let mut claims = Vec::new();
    for chunk in rows.chunks(CLAIM_ROWS_PER_STATEMENT) {
        let statement = connection
            .prepare_cached(claim_statement(chunk.len()))
            .await?;
        claims.push((statement, chunk));
    }
    let ordered = prepared
        .iter()
        .any(|p| p.write.request.ordering_key.is_some());
    let count_ordered = connection.prepare_cached(COUNT_ORDERED).await?;
    let insert_entries = connection.prepare_cached(INSERT_ENTRIES).await?;
    let insert_events = connection.prepare_cached(INSERT_EVENTS).await?;

    let arrays = Arrays::new(prepared);
    let claim_params: Vec<Vec<&(dyn ToSql + Sync)>> = claims
        .iter()
        .map(|(_, chunk)| {
            let mut params: Vec<&(dyn ToSql + Sync)> = vec![&status, &retention];
            for row in *chunk {
                params.extend([
                    &row.client as &(dyn ToSql + Sync),
                    &row.key,
                    &row.hash,
                    &row.response,
                    &row.entry_id,
                ]);
            }
            params
        })
        .collect();
    let client: &tokio_postgres::Client = connection;
    let a = &arrays;
    let claimed_rows = futures_util::future::join_all(
        claims
            .iter()
            .zip(&claim_params)
            .map(|((statement, _), params)| client.query(statement, params)),
    );
    let counted = async {
        if !ordered {
            return Ok(0);
        }
        client
            .execute(
                &count_ordered,
                &[
                    &a.clients,
                    &a.keys,
                    &a.entry_ids,
                    &a.ordering_keys,
                    &a.batch_clients,
                ],
            )
            .await
    };
    let entry_params: [&(dyn ToSql + Sync); 8] = [
        &a.clients,
        &a.keys,
        &a.entry_ids,
        &a.kinds,
        &a.data,
        &a.created,
        &a.ordering_keys,
        &a.batch_clients,
    ];
    let event_params: [&(dyn ToSql + Sync); 11] = [
        &a.event_ids,
        &a.event_keys,
        &a.event_clients,
        &a.event_idempotency_keys,
        &a.event_types,
        &a.payloads,
        &a.event_entry_ids,
        &a.event_carries_entry,
        &a.event_traceparents,
        &a.event_tracestates,
        &a.batch_clients,
    ];
    let (begun, claimed_rows, counted, entries, events, committed) = tokio::join!(
        client.batch_execute("BEGIN"),
        claimed_rows,
        counted,
        client.query(&insert_entries, &entry_params),
        client.execute(&insert_events, &event_params),
        client.batch_execute("COMMIT"),
    );
    begun?;
    let mut keys = HashSet::new();
    let mut database_now = None;
    for rows in claimed_rows {
        for row in rows? {
            keys.insert((row.get::<_, String>(0), row.get::<_, String>(1)));
            database_now = Some(row.get::<_, DateTime<Utc>>(2));
        }
    }
    counted?;
    let entries = entries?;
    events?;
    committed?;
    let sequence_of = entries
        .iter()
        .filter_map(|row| Some((row.get::<_, Uuid>(0), row.get::<_, Option<i64>>(1)?)))
        .collect();
    Ok(Claimed {
        database_now,
        keys,
        sequence_of,
    })
}

/// The entries' statement with no write in it, routed to `client`'s shard: what a probe runs
/// on Citus (`batch::probe`), which fails as a write to that shard would.
pub(super) async fn probe_on(connection: &mut PgClient, client: &str) -> Result<(), StorageError> {
    let statement = connection.prepare_cached(INSERT_ENTRIES).await?;
    let none: Vec<&str> = Vec::new();
    let no_ids: Vec<Uuid> = Vec::new();
    let no_times: Vec<DateTime<Utc>> = Vec::new();
    let no_keys: Vec<Option<&str>> = Vec::new();
    let clients = vec![client];
    connection
        .query(
            &statement,
            &[
                &none, &none, &no_ids, &none, &none, &no_times, &no_keys, &clients,
            ],
        )
        .await?;
    Ok(())
}
