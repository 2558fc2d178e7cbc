//! The batch in one statement, on a single server: claims every key with `INSERT ... ON
//! CONFLICT` and inserts the entries and outbox rows of the keys it claimed, all in one
//! statement of CTEs, committed as it returns.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::db::{PgClient, StorageError};
use crate::entry::CREATED_STATUS;
use crate::events::ENTRY_CREATED;
use crate::write::batch::{Claimed, PreparedWrite};
use crate::write::writer::WriterConfig;

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
/// docs/benchmark-history.md, "Ordered delivery").
const CLAIM_AND_INSERT_UNORDERED: &str = claim_and_insert!(
    r#"sequenced AS (
    SELECT NULL::uuid AS entry_id, NULL::text AS ordering_key, NULL::bigint AS sequence,
           NULL::boolean AS held
    WHERE false
),
"#
);

/// The claim statement's parameters: one array per column, built from the prepared writes (the
/// first eight: one element per write) and their events (the next six: one per event), the
/// response status and the retention, then the writes' ordering keys and four more arrays of
/// the events.
pub(super) struct Columns<'a> {
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
    pub(super) fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 21] {
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
    config: &WriterConfig,
    prepared: &[PreparedWrite<'_>],
) -> Result<Claimed, StorageError> {
    let statement = if prepared
        .iter()
        .any(|p| p.write.request.ordering_key.is_some())
    {
        CLAIM_AND_INSERT
    } else {
        CLAIM_AND_INSERT_UNORDERED
    };
    let claim_and_insert = connection.prepare_cached(statement).await?;
    let columns = Columns::new(prepared, config.retention);
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
    let claimed_clients: Vec<String> = row.get::<_, Option<Vec<String>>>(1).unwrap_or_default();
    let claimed_keys: Vec<String> = row.get::<_, Option<Vec<String>>>(2).unwrap_or_default();
    let sequenced_entries: Vec<Uuid> = row.get::<_, Option<Vec<Uuid>>>(3).unwrap_or_default();
    let sequences: Vec<i64> = row.get::<_, Option<Vec<i64>>>(4).unwrap_or_default();
    Ok(Claimed {
        database_now: Some(row.get::<_, DateTime<Utc>>(0)),
        keys: claimed_clients
            .into_iter()
            .zip(claimed_keys)
            .collect::<HashSet<_>>(),
        sequence_of: sequenced_entries
            .into_iter()
            .zip(sequences)
            .collect::<HashMap<_, _>>(),
    })
}

/// The one statement with no write in it, for the probe (`batch::probe`).
pub(super) async fn prepare_probe(
    connection: &mut PgClient,
) -> Result<(tokio_postgres::Statement, Columns<'static>), StorageError> {
    let statement = connection.prepare_cached(CLAIM_AND_INSERT).await?;
    Ok((statement, Columns::new(&[], Duration::ZERO)))
}
