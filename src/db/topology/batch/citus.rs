//! The batch on Citus: the writes of one shard (every client of the batch has its rows on the
//! same shard of each co-located table, see `write::queue`), in statements that each read and
//! write that shard alone, so that the transaction is a single-shard one, committed on one node
//! without a two-phase commit; sent together with `BEGIN` and `COMMIT`, so that the batch costs
//! one round trip, as on a single server. Sent to the node that holds the shard, each statement
//! is planned and run there (Citus 11 and later let any node run single-shard statements).
//!
//! Citus cannot plan the single statement of [`super::single`] as one shard's: its CTEs read
//! what their siblings inserted, which Citus runs one after another, each through the node
//! that plans it. So, in one transaction:
//!
//! 1. the keys are claimed by `INSERT ... VALUES` (a row per write, [`ROWS_PER_STATEMENT`] at most
//!    per statement), which Citus routes to the shard (an expired record is taken over by the
//!    one rule, [`take_over_expired!`]);
//! 2. an ordered batch counts its claimed writes into `ordering_keys` (the key's row lock, in
//!    `(client_id, ordering_key)` order, as on a single server);
//! 3. the claimed writes' entries are inserted, numbered from those counters;
//! 4. their events are inserted, held (due [`held_until!`]) where an earlier write of their key
//!    is not done.
//!
//! Steps 2 to 4 are `INSERT ... SELECT`s from the shard's rows of a co-located table (the
//! records claimed, the entries inserted: a statement sees what the earlier ones of its
//! transaction wrote), by the distribution column, with the batch's values taken from its
//! arrays by position: Citus pushes such a statement down to the shard whole. An event's id is
//! one the daemon reserved on the coordinator ([`IdBlocks`]), given as a value: a sequence's
//! `nextval` in the statement would make Citus take the rows through the node that plans it.
//! Every table a statement reads names the batch's clients in its own condition (an outer
//! join's too): Citus prunes each table's shards by its own conditions only. And Citus plans
//! each statement with its parameters' values ([`BEGIN_WITH_VALUES`]).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::{event_payload, take_over_expired, BatchRows, Claimed, WriteRow};
use crate::db::outbox_state::held_until;
use crate::db::topology::citus::{IdBlocks, BEGIN_WITH_VALUES};
use crate::db::{PgClient, StorageError};

/// Rows one `INSERT ... VALUES` takes at most: a batch of more is claimed by several statements
/// in its transaction. Each row count has a statement of its own (prepared once per
/// connection), so this also bounds how many the daemon makes.
const ROWS_PER_STATEMENT: usize = 64;

/// Parameters of a claim row: client, key, request hash, response, entry id.
const CLAIM_ROW_PARAMETERS: usize = 5;

/// The claim statement for `rows` writes, made once per row count and kept for the process's
/// life (a prepared statement's text must outlive the connections that cache it): `$1` the
/// response status, `$2` the retention in microseconds, then five parameters per write.
fn claim_statement(rows: usize) -> &'static str {
    static MADE: OnceLock<Mutex<HashMap<usize, &'static str>>> = OnceLock::new();
    let mut made = MADE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    made.entry(rows).or_insert_with(|| {
        let values = (0..rows)
            .map(|row| {
                let p = 3 + row * CLAIM_ROW_PARAMETERS;
                format!(
                    "(${}, ${}, ${}::bytea, 'completed', $1::smallint, ${}::text::jsonb, ${}::uuid, now(), now() + $2::bigint * interval '1 microsecond')",
                    p,
                    p + 1,
                    p + 2,
                    p + 3,
                    p + 4
                )
            })
            .collect::<Vec<_>>()
            .join(",\n       ");
        let statement = format!(
            "INSERT INTO idempotency_records AS r
    (client_id, key, request_hash, status, response_status, response_json, entry_id,
     created_at, expires_at)
VALUES {values}
{}
RETURNING entry_id, created_at",
            take_over_expired!()
        );
        Box::leak(statement.into_boxed_str())
    })
}

/// The batch's claimed writes, each joined to its position `i` in the batch's arrays: `$1` the
/// writes' entry ids, `$2` their clients, `$3` their keys, `$4` the batch's clients (each once:
/// what prunes the shards). The records are found through their primary key, by the batch's
/// clients and keys (the statement's `WHERE` must say `r.client_id = ANY($4) AND r.key =
/// ANY($3)`: a join on the positions alone is planned as a scan of every record of the
/// clients); a write whose key another request holds finds no record with its entry id.
macro_rules! claimed_writes {
    () => {
        "FROM idempotency_records r
    JOIN generate_subscripts($1::uuid[], 1) AS i
        ON r.client_id = ($2::text[])[i] AND r.key = ($3::text[])[i]
       AND r.entry_id = ($1::uuid[])[i]"
    };
}

/// Counts the claimed ordered writes of each (client, ordering key) into its counter, taking
/// the counter's row lock in key order (see the single server's `CLAIM_AND_INSERT`), and
/// returns how far each key's events are done. `$1..$4` as [`claimed_writes!`], `$5` the
/// writes' ordering keys.
const COUNT_ORDERED: &str = concat!(
    "
INSERT INTO ordering_keys AS k (client_id, ordering_key, last_sequence, done_through)
SELECT r.client_id, ($5::text[])[i], count(*), 0
",
    claimed_writes!(),
    "
WHERE r.client_id = ANY($4) AND r.key = ANY($3) AND ($5::text[])[i] IS NOT NULL
GROUP BY r.client_id, ($5::text[])[i]
ORDER BY r.client_id, ($5::text[])[i]
ON CONFLICT (client_id, ordering_key) DO UPDATE
    SET last_sequence = k.last_sequence + EXCLUDED.last_sequence
RETURNING client_id, ordering_key, done_through"
);

/// The claimed writes' entries; an ordered one is numbered after its key's counter, which
/// [`COUNT_ORDERED`] has moved on by the batch's writes of the key: the key's writes in the
/// batch take the numbers up to it, in batch order. `$1..$5` as in [`COUNT_ORDERED`], then the
/// writes' kinds, data and times.
const INSERT_ENTRIES: &str = concat!(
    "
INSERT INTO entries (id, client_id, idempotency_key, kind, data, created_at, ordering_key,
                     sequence)
SELECT r.entry_id, r.client_id, r.key, ($6::text[])[i], ($7::text[])[i]::jsonb,
       ($8::timestamptz[])[i], ($5::text[])[i],
       k.last_sequence
           - count(*) OVER (PARTITION BY r.client_id, ($5::text[])[i])
           + row_number() OVER (PARTITION BY r.client_id, ($5::text[])[i] ORDER BY i)
",
    claimed_writes!(),
    "
    LEFT JOIN ordering_keys k
        ON k.client_id = r.client_id AND k.ordering_key = ($5::text[])[i]
           AND k.client_id = ANY($4)
WHERE r.client_id = ANY($4) AND r.key = ANY($3)
RETURNING id, sequence"
);

/// The events of the claimed writes, each joined to its write's entry (inserted by
/// [`INSERT_ENTRIES`] in this transaction) by position `i` in the events' arrays: `$1` their
/// ids, `$2` event ids, `$3` event keys, `$4` their entries' ids, `$5` types, `$6` payloads,
/// `$7` whether each carries the entry, `$8` and `$9` the trace context, `$10` the batch's
/// clients; the entries found through their primary key (`en.id = ANY($4)`, as in
/// [`claimed_writes!`]). An event is held (due [`held_until!`]) when an earlier write of its key is not
/// done: the key's `done_through`, on the row [`COUNT_ORDERED`] locked, is behind.
const INSERT_EVENTS: &str = concat!(
    "
INSERT INTO outbox_events
    (id, event_id, event_key, client_id, idempotency_key, event_type, payload, created_at,
     next_attempt_at, ordering_key, sequence, traceparent, tracestate)
SELECT ($1::bigint[])[i], ($2::uuid[])[i], ($3::text[])[i], en.client_id, en.idempotency_key,
       ($5::text[])[i],
       ",
    event_payload!(
        "($6::text[])[i]::jsonb",
        "($7::bool[])[i]",
        "en.ordering_key",
        "en.sequence"
    ),
    ",
       now(),
       CASE WHEN en.sequence - 1 > k.done_through THEN ",
    held_until!(),
    " ELSE now() END,
       en.ordering_key, en.sequence, ($8::text[])[i], ($9::text[])[i]
FROM entries en
    JOIN generate_subscripts($4::uuid[], 1) AS i ON en.id = ($4::uuid[])[i]
    LEFT JOIN ordering_keys k
        ON k.client_id = en.client_id AND k.ordering_key = en.ordering_key
           AND k.client_id = ANY($10)
WHERE en.client_id = ANY($10) AND en.id = ANY($4)"
);

/// [`INSERT_ENTRIES`] for a batch without an ordered write: nothing to number, so no counter
/// to read (Citus plans each statement afresh, and a simpler one costs it less). `$1..$4` as
/// [`claimed_writes!`], then the writes' kinds, data and times.
const INSERT_ENTRIES_UNORDERED: &str = concat!(
    "
INSERT INTO entries (id, client_id, idempotency_key, kind, data, created_at)
SELECT r.entry_id, r.client_id, r.key, ($5::text[])[i], ($6::text[])[i]::jsonb,
       ($7::timestamptz[])[i]
",
    claimed_writes!(),
    "
WHERE r.client_id = ANY($4) AND r.key = ANY($3)"
);

/// [`INSERT_EVENTS`] for a batch without an ordered write: due now, as written. `$1` their ids,
/// `$2` event ids, `$3` event keys, `$4` their entries' ids, `$5` types, `$6` payloads, `$7`
/// and `$8` the trace context, `$9` the batch's clients.
const INSERT_EVENTS_UNORDERED: &str = "
INSERT INTO outbox_events
    (id, event_id, event_key, client_id, idempotency_key, event_type, payload, created_at,
     next_attempt_at, traceparent, tracestate)
SELECT ($1::bigint[])[i], ($2::uuid[])[i], ($3::text[])[i], en.client_id, en.idempotency_key,
       ($5::text[])[i], ($6::text[])[i]::jsonb, now(), now(), ($7::text[])[i], ($8::text[])[i]
FROM entries en
    JOIN generate_subscripts($4::uuid[], 1) AS i ON en.id = ($4::uuid[])[i]
WHERE en.client_id = ANY($9) AND en.id = ANY($4)";

/// One write's parameters of the claim statement.
struct ClaimRow<'a> {
    client: &'a str,
    key: &'a str,
    hash: &'a [u8],
    response: &'a str,
    entry_id: Uuid,
}

/// The batch's writes as the arrays of [`COUNT_ORDERED`] and [`INSERT_ENTRIES`] (without the
/// ordering keys, [`INSERT_ENTRIES_UNORDERED`]'s).
struct Writes<'a> {
    entry_ids: Vec<Uuid>,
    clients: Vec<&'a str>,
    keys: Vec<&'a str>,
    /// Each client of the batch once.
    batch_clients: Vec<&'a str>,
    ordering_keys: Vec<Option<&'a str>>,
    kinds: Vec<&'a str>,
    data: Vec<&'a str>,
    created: Vec<DateTime<Utc>>,
}

impl<'a> Writes<'a> {
    fn new(writes: &'a [WriteRow<'a>]) -> Self {
        let mut batch_clients: Vec<&str> = writes.iter().map(|w| &*w.key.client_id).collect();
        batch_clients.sort_unstable();
        batch_clients.dedup();
        Self {
            entry_ids: writes.iter().map(|w| w.entry_id).collect(),
            clients: writes.iter().map(|w| &*w.key.client_id).collect(),
            keys: writes.iter().map(|w| w.key.key.as_str()).collect(),
            batch_clients,
            ordering_keys: writes.iter().map(|w| w.ordering_key).collect(),
            kinds: writes.iter().map(|w| w.kind).collect(),
            data: writes.iter().map(|w| w.data).collect(),
            created: writes.iter().map(|w| w.created_at).collect(),
        }
    }
}

/// The batch's events as the arrays of [`INSERT_EVENTS`] (without whether each carries the
/// entry, [`INSERT_EVENTS_UNORDERED`]'s), with their ids.
struct Events<'a> {
    ids: Vec<i64>,
    event_ids: Vec<Uuid>,
    event_keys: Vec<&'a str>,
    entry_ids: Vec<Uuid>,
    types: Vec<&'a str>,
    payloads: Vec<&'a str>,
    carries_entry: Vec<bool>,
    traceparents: Vec<Option<&'a str>>,
    tracestates: Vec<Option<&'a str>>,
}

impl<'a> Events<'a> {
    /// `ids` go to the events in the batch's order, so that a key's events within the batch take
    /// ids in its sequences' order (the batch numbers its writes of a key in that order).
    /// Across batches they need not: the ids are reserved before the batch takes the key's lock
    /// ([`IdBlocks`]), so a later write of a key written by another batch less than a second
    /// after may have the lower id. Its first delivery still comes in sequence order (the relay
    /// follows `sequence`); a replay follows ids.
    fn new(rows: &'a BatchRows<'a>, ids: Vec<i64>) -> Self {
        let events = || rows.events();
        Self {
            ids,
            event_ids: events().map(|(_, e)| e.event_id).collect(),
            event_keys: events().map(|(_, e)| e.event_key.as_str()).collect(),
            entry_ids: events().map(|(w, _)| w.entry_id).collect(),
            types: events().map(|(_, e)| e.event_type).collect(),
            payloads: events().map(|(_, e)| e.payload.as_str()).collect(),
            carries_entry: events().map(|(_, e)| e.carries_entry).collect(),
            traceparents: events().map(|(_, e)| e.traceparent).collect(),
            tracestates: events().map(|(_, e)| e.tracestate).collect(),
        }
    }
}

/// Claims and writes the batch (the writes of one shard), in one transaction of one round trip.
/// The first statement to fail is the batch's error: those after it only find the transaction
/// aborted.
pub(super) async fn claim(
    connection: &mut PgClient,
    rows: &BatchRows<'_>,
    ids: &IdBlocks,
) -> Result<Claimed, StorageError> {
    let event_ids = ids.take(rows.events().count(), connection).await?;
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
    let mut claims = Vec::new();
    for chunk in order.chunks(ROWS_PER_STATEMENT) {
        let statement = connection
            .prepare_cached(claim_statement(chunk.len()))
            .await?;
        claims.push((statement, chunk));
    }
    let ordered = rows.ordered();
    let (insert_entries, insert_events) = match ordered {
        true => (INSERT_ENTRIES, INSERT_EVENTS),
        false => (INSERT_ENTRIES_UNORDERED, INSERT_EVENTS_UNORDERED),
    };
    let count_ordered = connection.prepare_cached(COUNT_ORDERED).await?;
    let insert_entries = connection.prepare_cached(insert_entries).await?;
    let insert_events = connection.prepare_cached(insert_events).await?;

    let (status, retention) = (rows.response_status, rows.retention_micros());
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
    let w = Writes::new(rows.writes);
    let mut writes_params: Vec<&(dyn ToSql + Sync)> =
        vec![&w.entry_ids, &w.clients, &w.keys, &w.batch_clients];
    if ordered {
        writes_params.push(&w.ordering_keys);
    }
    let counter_params = writes_params.clone();
    writes_params.extend([&w.kinds as &(dyn ToSql + Sync), &w.data, &w.created]);
    let e = Events::new(rows, event_ids);
    let mut events_params: Vec<&(dyn ToSql + Sync)> = vec![
        &e.ids,
        &e.event_ids,
        &e.event_keys,
        &e.entry_ids,
        &e.types,
        &e.payloads,
    ];
    if ordered {
        events_params.push(&e.carries_entry);
    }
    events_params.extend([
        &e.traceparents as &(dyn ToSql + Sync),
        &e.tracestates,
        &w.batch_clients,
    ]);

    let client: &tokio_postgres::Client = connection;
    let claimed_rows = futures_util::future::join_all(
        claims
            .iter()
            .zip(&claim_params)
            .map(|((statement, _), params)| client.query(statement, params)),
    );
    let counted = async {
        if !ordered {
            return Ok(Vec::new());
        }
        client.query(&count_ordered, &counter_params).await
    };
    let (begun, claimed_rows, counted, entries, events, committed) = tokio::join!(
        client.batch_execute(BEGIN_WITH_VALUES),
        claimed_rows,
        counted,
        client.query(&insert_entries, &writes_params),
        client.execute(&insert_events, &events_params),
        client.batch_execute("COMMIT"),
    );
    begun?;
    let mut claimed = Claimed {
        database_now: None,
        entries: Default::default(),
        sequences: HashMap::new(),
    };
    for found in claimed_rows {
        for row in found? {
            claimed.entries.insert(row.get::<_, Uuid>(0));
            claimed.database_now = Some(row.get::<_, DateTime<Utc>>(1));
        }
    }
    counted?;
    claimed.sequences = entries?
        .iter()
        .filter_map(|row| Some((row.get::<_, Uuid>(0), row.get::<_, Option<i64>>(1)?)))
        .collect();
    events?;
    committed?;
    Ok(claimed)
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
        &no_ids, &none, &none, &clients, &no_keys, &none, &none, &no_times,
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
