//! A write batch's transaction, in the shape its topology takes: one statement on a single
//! server ([`single`]), a few single-shard statements on Citus ([`citus`]). Both claim every key
//! with `INSERT ... ON CONFLICT` (keys in `(client_id, key)` order, so that two daemons' batches
//! sharing keys wait for each other instead of deadlocking), take over an expired record by one
//! rule ([`take_over_expired!`]), and insert the entries and outbox rows of the keys they
//! claimed, committed in the same round trip as the statements; they differ only where Citus
//! cannot plan what one server can.

mod citus;
mod single;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::Route;
use crate::db::{PgClient, StorageError};
use crate::idempotency::{RequestHash, ScopedKey};

/// The takeover rule of a key, as the claim's `ON CONFLICT` clause: the key's record is replaced
/// by the batch's only when it has expired (`expires_at` at or before the new record's
/// `created_at`, the database's `now()`) and the janitor has not deleted it yet: after its
/// retention a key is new again, whenever the janitor runs. Otherwise the key is not claimed,
/// and its record is read back. (A time from the row inserted, not `now()` itself: Citus refuses
/// a function in this `WHERE`.)
macro_rules! take_over_expired {
    () => {
        "ON CONFLICT (client_id, key) DO UPDATE
    SET request_hash = EXCLUDED.request_hash,
        status = EXCLUDED.status,
        response_status = EXCLUDED.response_status,
        response_json = EXCLUDED.response_json,
        entry_id = EXCLUDED.entry_id,
        created_at = EXCLUDED.created_at,
        expires_at = EXCLUDED.expires_at
    WHERE r.expires_at <= EXCLUDED.created_at"
    };
}
use take_over_expired;

/// An event's payload as its row holds it, from the SQL expressions given: `$payload` (the
/// CloudEvent, jsonb), `$carries_entry` (whether its data is the entry), and the write's
/// `$key` and `$sequence` (NULL when unordered). An ordered write's event gets the CloudEvents
/// extension attributes `partitionkey` and `sequence` (a string), and `entry.created`'s data
/// (the entry) its `ordering_key` and `sequence`: known only once the statement has numbered
/// the write. `$payload` is written once: on Citus the batch's payloads are a parameter that
/// each use of it spells out again in the statement the node plans (a `jsonb_set` of an empty
/// path changes nothing).
macro_rules! event_payload {
    ($payload:literal, $carries_entry:literal, $key:literal, $sequence:literal) => {
        concat!(
            "jsonb_set(
               jsonb_set(
                 ",
            $payload,
            "
                   || CASE WHEN ",
            $sequence,
            " IS NULL THEN '{}'::jsonb
                           ELSE jsonb_build_object('partitionkey', ",
            $key,
            ",
                                                   'sequence', ",
            $sequence,
            "::text) END,
                 CASE WHEN ",
            $sequence,
            " IS NOT NULL AND ",
            $carries_entry,
            "
                      THEN '{data,ordering_key}' ELSE '{}' END::text[],
                 to_jsonb(coalesce(",
            $key,
            ", ''))),
               CASE WHEN ",
            $sequence,
            " IS NOT NULL AND ",
            $carries_entry,
            "
                    THEN '{data,sequence}' ELSE '{}' END::text[],
               to_jsonb(coalesce(",
            $sequence,
            ", 0)))"
        )
    };
}
use event_payload;

/// A batch's writes and their events, as its statements take them. A record's `created_at` and
/// `expires_at` are not among them: the statements set them from the database's own clock
/// (`now()`, and `now()` plus [`retention`](Self::retention)), never from a time the daemon
/// sends: a daemon whose clock is behind would otherwise write records that the database
/// already sees as expired, and the next request for the key would take it over.
pub struct BatchRows<'a> {
    pub writes: &'a [WriteRow<'a>],
    /// How long a record lives.
    pub retention: Duration,
    /// The status of the answer saved with each record.
    pub response_status: i16,
}

/// One write of a batch, with its events.
pub struct WriteRow<'a> {
    pub key: &'a ScopedKey,
    pub request_hash: &'a RequestHash,
    /// The entry's id: also how the statements tell the batch's writes apart.
    pub entry_id: Uuid,
    pub kind: &'a str,
    /// The entry's data, as canonical JSON text.
    pub data: &'a str,
    /// The entry's time: the daemon's estimate of the database's clock (its answer and its
    /// events carry it, so it is known before the statement runs).
    pub created_at: DateTime<Utc>,
    /// The answer saved with the record.
    pub response: String,
    pub ordering_key: Option<&'a str>,
    pub events: Vec<EventRow<'a>>,
}

/// One event of a batch's write.
pub struct EventRow<'a> {
    pub event_id: Uuid,
    pub event_key: String,
    pub event_type: &'a str,
    /// The CloudEvent, as JSON text; an ordered write's gets its ordering key and sequence in
    /// the statement.
    pub payload: String,
    /// The event's data is the entry (`entry.created`): an ordered write's sequence goes in it.
    pub carries_entry: bool,
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
}

impl BatchRows<'_> {
    fn ordered(&self) -> bool {
        self.writes.iter().any(|write| write.ordering_key.is_some())
    }

    fn retention_micros(&self) -> i64 {
        i64::try_from(self.retention.as_micros()).unwrap_or(i64::MAX)
    }

    /// Every event, with its write.
    fn events(&self) -> impl Iterator<Item = (&WriteRow<'_>, &EventRow<'_>)> {
        self.writes
            .iter()
            .flat_map(|write| write.events.iter().map(move |event| (write, event)))
    }
}

/// What a batch's claim found: the writes whose keys it claimed (their entries and events are
/// written), the sequences of its ordered writes, and the database's time when it ran.
pub struct Claimed {
    /// None when the statements that return it returned no row (no key claimed, on Citus).
    pub database_now: Option<DateTime<Utc>>,
    /// The entry ids of the writes whose keys were claimed.
    pub entries: HashSet<Uuid>,
    /// The sequence of each claimed ordered write, by entry id.
    pub sequences: HashMap<Uuid, i64>,
}

impl Route {
    /// Claims the batch's keys and writes the claimed ones' rows, in one transaction that ends
    /// with a `COMMIT` sent with the statements: its answer comes after the commit's wait for a
    /// synchronous standby, and after any warning that the wait was cancelled (which the
    /// caller's [`PgClient::confirm_commit`] then sees). A failed statement leaves the
    /// transaction aborted, and PostgreSQL answers the `COMMIT` with `ROLLBACK`.
    pub async fn claim(
        &self,
        connection: &mut PgClient,
        rows: &BatchRows<'_>,
    ) -> Result<Claimed, StorageError> {
        match &self.cluster {
            Some(cluster) => citus::claim(connection, rows, &cluster.ids).await,
            None => single::claim(connection, rows).await,
        }
    }

    /// Opens a transaction and runs the writers' statements with no write in them, on this
    /// route's rows: what a probe of whether writes would succeed runs before its commit
    /// (`write::batch::probe`). Fails as a write there would: a schema the statements do not
    /// fit, a read-only database, a lost connection or, on Citus, the shard's node down.
    pub async fn begin_probe(&self, connection: &mut PgClient) -> Result<(), StorageError> {
        match &self.cluster {
            Some(_) => citus::begin_probe(connection, self.probe_client()).await,
            None => single::begin_probe(connection).await,
        }
    }
}
