//! The batch in one statement, on a single server: claims every key with `INSERT ... ON
//! CONFLICT` and inserts the entries and outbox rows of the keys it claimed, all in one
//! statement of CTEs, committed as it returns.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{event_payload, take_over_expired, BatchRows, Claimed};
use crate::db::outbox_state::held_until;
use crate::db::{PgClient, StorageError};

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
           entry_id, now(), now() + $16::bigint * interval '1 microsecond'
    FROM input
    ORDER BY client_id, key
    "#,
            take_over_expired!(),
            r#"
    RETURNING client_id, key, entry_id AS claimed_entry
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
           "#,
            event_payload!(
                "e.payload::jsonb",
                "e.carries_entry",
                "s.ordering_key",
                "s.sequence"
            ),
            r#",
           now(),
           CASE WHEN s.held THEN "#,
            held_until!(),
            r#" ELSE now() END,
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
SELECT now(), array_agg(claimed_entry),
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
/// for each other instead of deadlocking; an expired record is taken over
/// ([`take_over_expired!`]). A record lives from the database's `now()` for the retention ($16,
/// in microseconds); the entries' `created_at` is the daemon's estimate of the database's time
/// ($7, see [`super::WriteRow::created_at`]). The statement returns the database's `now()` with
/// the claimed writes' entry ids, for the next estimate.
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
/// docs/benchmark-history.md, "Ordered delivery").
const CLAIM_AND_INSERT_UNORDERED: &str = claim_and_insert!(
    r#"sequenced AS (
    SELECT NULL::uuid AS entry_id, NULL::text AS ordering_key, NULL::bigint AS sequence,
           NULL::boolean AS held
    WHERE false
),
"#
);

/// The claim statement's parameters: one array per column, built from the batch's writes (the
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
    event_keys: Vec<&'a str>,
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
    event_carries_entry: Vec<bool>,
}

impl<'a> Columns<'a> {
    fn new(rows: &'a BatchRows<'a>) -> Self {
        let writes = || rows.writes.iter();
        let events = || rows.events();
        Self {
            client_ids: writes().map(|w| &*w.key.client_id).collect(),
            keys: writes().map(|w| w.key.key.as_str()).collect(),
            hashes: writes().map(|w| &w.request_hash.0[..]).collect(),
            entry_ids: writes().map(|w| w.entry_id).collect(),
            kinds: writes().map(|w| w.kind).collect(),
            data: writes().map(|w| w.data).collect(),
            created: writes().map(|w| w.created_at).collect(),
            responses: writes().map(|w| w.response.as_str()).collect(),
            event_ids: events().map(|(_, e)| e.event_id).collect(),
            event_keys: events().map(|(_, e)| e.event_key.as_str()).collect(),
            event_clients: events().map(|(w, _)| &*w.key.client_id).collect(),
            event_idempotency_keys: events().map(|(w, _)| w.key.key.as_str()).collect(),
            event_types: events().map(|(_, e)| e.event_type).collect(),
            payloads: events().map(|(_, e)| e.payload.as_str()).collect(),
            response_status: rows.response_status,
            retention_micros: rows.retention_micros(),
            ordering_keys: writes().map(|w| w.ordering_key).collect(),
            event_entry_ids: events().map(|(w, _)| w.entry_id).collect(),
            event_traceparents: events().map(|(_, e)| e.traceparent).collect(),
            event_tracestates: events().map(|(_, e)| e.tracestate).collect(),
            event_carries_entry: events().map(|(_, e)| e.carries_entry).collect(),
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

/// Claims and writes the batch in one statement ([`CLAIM_AND_INSERT`]), committed with it.
pub(super) async fn claim(
    connection: &mut PgClient,
    rows: &BatchRows<'_>,
) -> Result<Claimed, StorageError> {
    let statement = if rows.ordered() {
        CLAIM_AND_INSERT
    } else {
        CLAIM_AND_INSERT_UNORDERED
    };
    let claim_and_insert = connection.prepare_cached(statement).await?;
    let columns = Columns::new(rows);
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
    // array_agg over no rows is NULL: nothing was claimed.
    let entries: Vec<Uuid> = row.get::<_, Option<Vec<Uuid>>>(1).unwrap_or_default();
    let sequenced_entries: Vec<Uuid> = row.get::<_, Option<Vec<Uuid>>>(2).unwrap_or_default();
    let sequences: Vec<i64> = row.get::<_, Option<Vec<i64>>>(3).unwrap_or_default();
    Ok(Claimed {
        database_now: Some(row.get::<_, DateTime<Utc>>(0)),
        entries: entries.into_iter().collect(),
        sequences: sequenced_entries.into_iter().zip(sequences).collect(),
    })
}

/// Begins a transaction and runs the one statement with no write in it (see
/// [`super::Route::begin_probe`]).
pub(super) async fn begin_probe(connection: &mut PgClient) -> Result<(), StorageError> {
    let statement = connection.prepare_cached(CLAIM_AND_INSERT).await?;
    let rows = BatchRows {
        writes: &[],
        retention: std::time::Duration::ZERO,
        response_status: 0,
    };
    let columns = Columns::new(&rows);
    let params = columns.params();
    let client: &tokio_postgres::Client = connection;
    let (begun, claimed) = tokio::join!(
        client.batch_execute("BEGIN"),
        client.query_one(&statement, &params),
    );
    begun?;
    claimed?;
    Ok(())
}
