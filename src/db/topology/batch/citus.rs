//! The batch on Citus: the writes of one shard (every client of the batch has its rows on the
//! same shard of each co-located table, see `write::queue`), in statements that Citus routes to
//! that shard's worker alone, so that the transaction is a single-shard one, committed on one
//! worker without a two-phase commit.
//!
//! Citus cannot route the single statement of [`super::one_statement`]: an `INSERT ... SELECT`
//! from a function of the daemon's arrays goes "via the coordinator" (several round trips to the
//! worker), and `now()` in its `ON CONFLICT ... WHERE` is refused. So, in one transaction:
//!
//! 1. the keys are claimed by `INSERT ... VALUES` (a row per write, [`ROWS_PER_STATEMENT`] at most
//!    per statement), which Citus routes to the shard (an expired record is taken over by the
//!    one rule, [`take_over_expired!`]);
//! 2. an ordered batch counts its claimed writes into `ordering_keys` (the key's row lock, in
//!    `(client_id, ordering_key)` order, as on a single server), and the claimed writes' entries
//!    are inserted, numbered from those counters: both `INSERT ... SELECT` from the claimed
//!    records joined with the daemon's arrays, which Citus pushes down to the shard since they
//!    read a co-located table by its distribution column (a write whose key another request
//!    holds finds no record with its entry id, and inserts nothing);
//! 3. once their answers are back (the claimed keys, the sequences, each key's `done_through`),
//!    the claimed writes' events are inserted by `INSERT ... VALUES`, held (due at `infinity`)
//!    where an earlier write of their key is not done. They cannot be pushed down as the entries
//!    are: their table's ids come from a sequence on the coordinator, so Citus would take the
//!    rows through the coordinator, which it cannot do with a prepared statement's parameters.
//!
//! Steps 1 and 2 go in one round trip with `BEGIN`, step 3 in a second one with `COMMIT`. Every
//! table a statement reads names the batch's clients in its own condition (an outer join's
//! too): Citus prunes each table's shards by its own conditions only, and reads every shard of
//! a table it cannot prune. And Citus plans each statement with its parameters' values
//! ([`BEGIN_WITH_VALUES`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock, PoisonError};

use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::{take_over_expired, BatchRows, Claimed, WriteRow};
use crate::db::outbox_state::held_until;
use crate::db::topology::citus::BEGIN_WITH_VALUES;
use crate::db::{PgClient, StorageError};

/// Rows one `INSERT ... VALUES` takes at most: a batch of more is inserted by several
/// statements in its transaction. Each row count has a statement of its own (prepared once per
/// connection), so this also bounds how many the daemon makes.
const ROWS_PER_STATEMENT: usize = 64;

/// Parameters of a claim row: client, key, request hash, response, entry id.
const CLAIM_ROW_PARAMETERS: usize = 5;

/// Parameters of an event row: event id, event key, client, idempotency key, type, payload,
/// ordering key, sequence, traceparent, tracestate.
const EVENT_ROW_PARAMETERS: usize = 10;

/// The statement `make` writes for `rows` rows, made once per kind and row count and kept for
/// the process's life: a prepared statement's text must outlive the connections that cache it.
fn statement_for(kind: &'static str, rows: usize, make: impl Fn(usize) -> String) -> &'static str {
    static MADE: OnceLock<Mutex<HashMap<(&'static str, usize), &'static str>>> = OnceLock::new();
    let mut made = MADE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    made.entry((kind, rows))
        .or_insert_with(|| Box::leak(make(rows).into_boxed_str()))
}

/// `rows` rows of `parameters` parameters each, from `$first`, as `make` writes one row.
fn value_rows(
    rows: usize,
    (first, parameters): (usize, usize),
    make: impl Fn(usize) -> String,
) -> String {
    (0..rows)
        .map(|row| make(first + row * parameters))
        .collect::<Vec<_>>()
        .join(",\n       ")
}

/// The claim statement for `rows` writes: `$1` the response status, `$2` the retention in
/// microseconds, then five parameters per write.
fn claim_statement(rows: usize) -> &'static str {
    statement_for("claim", rows, |rows| {
        let values = value_rows(rows, (3, CLAIM_ROW_PARAMETERS), |p| {
            format!(
                "(${}, ${}, ${}::bytea, 'completed', $1::smallint, ${}::text::jsonb, ${}::uuid, now(), now() + $2::bigint * interval '1 microsecond')",
                p,
                p + 1,
                p + 2,
                p + 3,
                p + 4
            )
        });
        format!(
            "INSERT INTO idempotency_records AS r
    (client_id, key, request_hash, status, response_status, response_json, entry_id,
     created_at, expires_at)
VALUES {values}
{}
RETURNING entry_id, created_at",
            take_over_expired!()
        )
    })
}

/// The events statement for `rows` events of claimed writes, due now or held (`held`: due at
/// `infinity`, released by a relay once their key's earlier writes are done).
fn events_statement(rows: usize, held: bool) -> &'static str {
    let kind = if held { "held events" } else { "events" };
    statement_for(kind, rows, |rows| {
        let due = if held { held_until!() } else { "now()" };
        let values = value_rows(rows, (1, EVENT_ROW_PARAMETERS), |p| {
            format!(
                "(${}::uuid, ${}, ${}, ${}, ${}, ${}::text::jsonb, now(), {due}, ${}, ${}::bigint, ${}, ${})",
                p,
                p + 1,
                p + 2,
                p + 3,
                p + 4,
                p + 5,
                p + 6,
                p + 7,
                p + 8,
                p + 9
            )
        });
        format!(
            "INSERT INTO outbox_events
    (event_id, event_key, client_id, idempotency_key, event_type, payload, created_at,
     next_attempt_at, ordering_key, sequence, traceparent, tracestate)
VALUES {values}"
        )
    })
}

/// Counts the claimed ordered writes of each (client, ordering key) into its counter, taking
/// the counter's row lock in key order (see the single server's `CLAIM_AND_INSERT`), and
/// returns how far each key's events are done (what decides whether the new ones are held).
/// `$1..$4`: the writes' clients, keys, entry ids and ordering keys; `$5` the batch's clients.
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
    SET last_sequence = k.last_sequence + EXCLUDED.last_sequence
RETURNING client_id, ordering_key, done_through";

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
           AND k.client_id = ANY($8)
WHERE r.client_id = ANY($8)
RETURNING id, sequence";

/// One write's parameters of the claim statement.
struct ClaimRow<'a> {
    client: &'a str,
    key: &'a str,
    hash: &'a [u8],
    response: &'a str,
    entry_id: Uuid,
}

/// The batch's writes as the entries' and the counters' arrays.
struct Arrays<'a> {
    clients: Vec<&'a str>,
    keys: Vec<&'a str>,
    entry_ids: Vec<Uuid>,
    kinds: Vec<&'a str>,
    data: Vec<&'a str>,
    created: Vec<DateTime<Utc>>,
    ordering_keys: Vec<Option<&'a str>>,
    /// Each client of the batch once.
    batch_clients: Vec<&'a str>,
}

impl<'a> Arrays<'a> {
    fn new(writes: &'a [WriteRow<'a>]) -> Self {
        let mut batch_clients: Vec<&str> = writes.iter().map(|w| &*w.key.client_id).collect();
        batch_clients.sort_unstable();
        batch_clients.dedup();
        Self {
            clients: writes.iter().map(|w| &*w.key.client_id).collect(),
            keys: writes.iter().map(|w| w.key.key.as_str()).collect(),
            entry_ids: writes.iter().map(|w| w.entry_id).collect(),
            kinds: writes.iter().map(|w| w.kind).collect(),
            data: writes.iter().map(|w| w.data).collect(),
            created: writes.iter().map(|w| w.created_at).collect(),
            ordering_keys: writes.iter().map(|w| w.ordering_key).collect(),
            batch_clients,
        }
    }
}

/// One event of a claimed write, as its row is inserted.
struct EventValues<'a> {
    event_id: Uuid,
    event_key: &'a str,
    client: &'a str,
    idempotency_key: &'a str,
    event_type: &'a str,
    /// The CloudEvent; an ordered write's carries its ordering key and sequence.
    payload: String,
    ordering_key: Option<&'a str>,
    sequence: Option<i64>,
    traceparent: Option<&'a str>,
    tracestate: Option<&'a str>,
}

/// An ordered write's event as the single server's statement makes it: the CloudEvent
/// extension attributes `partitionkey` and `sequence` (a string), and, in `entry.created`'s data
/// (the entry), `ordering_key` and `sequence`.
fn ordered_payload(payload: &str, carries_entry: bool, key: &str, sequence: i64) -> String {
    let Ok(serde_json::Value::Object(mut event)) = serde_json::from_str(payload) else {
        // Made by the daemon from an object: not reached.
        return payload.to_owned();
    };
    event.insert("partitionkey".into(), key.into());
    event.insert("sequence".into(), sequence.to_string().into());
    if carries_entry {
        if let Some(serde_json::Value::Object(data)) = event.get_mut("data") {
            data.insert("ordering_key".into(), key.into());
            data.insert("sequence".into(), sequence.into());
        }
    }
    serde_json::Value::Object(event).to_string()
}

/// Claims and writes the batch (the writes of one shard), in a transaction of two round trips.
pub(super) async fn claim(
    connection: &mut PgClient,
    rows: &BatchRows<'_>,
) -> Result<Claimed, StorageError> {
    let first = claim_and_number(connection, rows).await;
    let (entries, database_now, sequences, done_through) = match first {
        Ok(found) => found,
        Err(error) => {
            // Nothing of the transaction stands: ended before the connection goes back.
            let _ = connection.batch_execute("ROLLBACK").await;
            return Err(error);
        }
    };
    let values: Vec<(bool, EventValues)> = rows
        .events()
        .filter_map(|(write, event)| {
            if !entries.contains(&write.entry_id) {
                return None;
            }
            let client = &*write.key.client_id;
            let sequence = sequences.get(&write.entry_id).copied();
            let (held, payload) = match (write.ordering_key, sequence) {
                (Some(key), Some(sequence)) => (
                    // Held unless every earlier write of its key is done.
                    done_through
                        .get(&(client, key))
                        .is_some_and(|done| sequence - 1 > *done),
                    ordered_payload(&event.payload, event.carries_entry, key, sequence),
                ),
                _ => (false, event.payload.clone()),
            };
            Some((
                held,
                EventValues {
                    event_id: event.event_id,
                    event_key: &event.event_key,
                    client,
                    idempotency_key: write.key.key.as_str(),
                    event_type: event.event_type,
                    payload,
                    ordering_key: write.ordering_key,
                    sequence,
                    traceparent: event.traceparent,
                    tracestate: event.tracestate,
                },
            ))
        })
        .collect();
    insert_events_and_commit(connection, values).await?;
    Ok(Claimed {
        database_now,
        entries,
        sequences,
    })
}

/// What the first round trip found: the entry ids of the claimed writes, the database's time,
/// the entries' sequences, and how far each counted ordering key's events are done.
type Numbered<'a> = (
    HashSet<Uuid>,
    Option<DateTime<Utc>>,
    HashMap<Uuid, i64>,
    HashMap<(&'a str, &'a str), i64>,
);

/// Begins the transaction, claims the keys, counts the ordered writes and inserts the entries:
/// one round trip.
async fn claim_and_number<'a>(
    connection: &mut PgClient,
    rows: &'a BatchRows<'a>,
) -> Result<Numbered<'a>, StorageError> {
    // Keys claimed in (client, key) order, as on a single server: two batches sharing keys
    // wait for each other rather than deadlock.
    let mut order: Vec<&WriteRow> = rows.writes.iter().collect();
    order.sort_by(|a, b| a.key.cmp(b.key));
    let order: Vec<ClaimRow> = order
        .into_iter()
        .map(|write| ClaimRow {
            client: &write.key.client_id,
            key: write.key.key.as_str(),
            hash: &write.request_hash.0,
            response: &write.response,
            entry_id: write.entry_id,
        })
        .collect();
    let status = rows.response_status;
    let retention = rows.retention_micros();
    let mut claims = Vec::new();
    for chunk in order.chunks(ROWS_PER_STATEMENT) {
        let statement = connection
            .prepare_cached(claim_statement(chunk.len()))
            .await?;
        claims.push((statement, chunk));
    }
    let count_ordered = connection.prepare_cached(COUNT_ORDERED).await?;
    let insert_entries = connection.prepare_cached(INSERT_ENTRIES).await?;

    let a = Arrays::new(rows.writes);
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
    let claimed_rows = futures_util::future::join_all(
        claims
            .iter()
            .zip(&claim_params)
            .map(|((statement, _), params)| client.query(statement, params)),
    );
    let counter_params: [&(dyn ToSql + Sync); 5] = [
        &a.clients,
        &a.keys,
        &a.entry_ids,
        &a.ordering_keys,
        &a.batch_clients,
    ];
    let counted = async {
        if !rows.ordered() {
            return Ok(Vec::new());
        }
        client.query(&count_ordered, &counter_params).await
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
    let (begun, claimed_rows, counted, entries) = tokio::join!(
        client.batch_execute(BEGIN_WITH_VALUES),
        claimed_rows,
        counted,
        client.query(&insert_entries, &entry_params),
    );
    begun?;
    let mut claimed = HashSet::new();
    let mut database_now = None;
    for found in claimed_rows {
        for row in found? {
            claimed.insert(row.get::<_, Uuid>(0));
            database_now = Some(row.get::<_, DateTime<Utc>>(1));
        }
    }
    // The counters' keys, as the batch's own text (each pair of the batch once).
    let keys_of: HashMap<(&str, &str), (&str, &str)> = rows
        .writes
        .iter()
        .filter_map(|w| {
            let pair = (&*w.key.client_id, w.ordering_key?);
            Some((pair, pair))
        })
        .collect();
    let done_through = counted?
        .iter()
        .filter_map(|row| {
            let pair = keys_of.get(&(row.get::<_, &str>(0), row.get::<_, &str>(1)))?;
            Some((*pair, row.get::<_, i64>(2)))
        })
        .collect();
    let sequences = entries?
        .iter()
        .filter_map(|row| Some((row.get::<_, Uuid>(0), row.get::<_, Option<i64>>(1)?)))
        .collect();
    Ok((claimed, database_now, sequences, done_through))
}

/// Inserts the claimed writes' events (those due now, and those held), in sequence order so
/// that a key's events take ids in its order, and commits: the second round trip.
async fn insert_events_and_commit(
    connection: &mut PgClient,
    mut values: Vec<(bool, EventValues<'_>)>,
) -> Result<(), StorageError> {
    values.sort_by_key(|(_, event)| event.sequence);
    let mut statements = Vec::new();
    for held in [false, true] {
        let of_kind: Vec<&EventValues> = values
            .iter()
            .filter(|(is_held, _)| *is_held == held)
            .map(|(_, event)| event)
            .collect();
        for chunk in of_kind.chunks(ROWS_PER_STATEMENT) {
            let statement = connection
                .prepare_cached(events_statement(chunk.len(), held))
                .await?;
            let params: Vec<&(dyn ToSql + Sync)> = chunk
                .iter()
                .flat_map(|event| {
                    [
                        &event.event_id as &(dyn ToSql + Sync),
                        &event.event_key,
                        &event.client,
                        &event.idempotency_key,
                        &event.event_type,
                        &event.payload,
                        &event.ordering_key,
                        &event.sequence,
                        &event.traceparent,
                        &event.tracestate,
                    ]
                })
                .collect();
            statements.push((statement, params));
        }
    }
    let client: &tokio_postgres::Client = connection;
    let inserted = futures_util::future::join_all(
        statements
            .iter()
            .map(|(statement, params)| client.execute(statement, params)),
    );
    let (inserted, committed) = tokio::join!(inserted, client.batch_execute("COMMIT"));
    for result in inserted {
        result?;
    }
    committed?;
    Ok(())
}

/// Begins a transaction and runs the entries' statement with no write in it, routed to
/// `client`'s shard (see [`super::Route::begin_probe`]).
pub(super) async fn begin_probe(
    connection: &mut PgClient,
    client: &str,
) -> Result<(), StorageError> {
    let statement = connection.prepare_cached(INSERT_ENTRIES).await?;
    let none: Vec<&str> = Vec::new();
    let no_ids: Vec<Uuid> = Vec::new();
    let no_times: Vec<DateTime<Utc>> = Vec::new();
    let no_keys: Vec<Option<&str>> = Vec::new();
    let clients = vec![client];
    let params: [&(dyn ToSql + Sync); 8] = [
        &none, &none, &no_ids, &none, &none, &no_times, &no_keys, &clients,
    ];
    let handle: &tokio_postgres::Client = connection;
    let (begun, probed) = tokio::join!(
        handle.batch_execute(BEGIN_WITH_VALUES),
        handle.query(&statement, &params),
    );
    begun?;
    probed?;
    Ok(())
}
