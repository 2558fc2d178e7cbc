//! Writer actors: they commit writes to PostgreSQL, many at a time.
//!
//! A writer queues the writes sent to it. While one batch is in flight, new writes queue; when it
//! finishes, the next batch takes everything that queued (up to `database.max_batch`). No timer
//! delays a lone write: an idle writer starts a batch of one at once.
//!
//! A batch is one transaction whose main statement claims every key with `INSERT ... ON CONFLICT`
//! and inserts the entries and outbox rows of the keys it claimed. A key it did not claim (another
//! process holds or completed it) is read back and answered as a replay or a conflict.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_web::web::Bytes;
use chrono::{DateTime, Utc};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::db::{Database, PgClient, StorageError};
use crate::entry::{format_time, now_micros};
use crate::events::{events_for, AuditFacts, EventSubject, NewEvent};
use crate::idempotency::canonical::write_string;
use crate::idempotency::{canonical_json, IdempotencyKey, RequestHash};
use crate::telemetry;

/// Writes a writer queues at most, in batches' worth: past that it refuses new writes with
/// 503 at once (shedding load) rather than letting latency and memory grow without bound.
const MAX_QUEUED_BATCHES: usize = 8;

/// How often a batch aborted by a deadlock or serialization failure is run again.
const MAX_CONFLICT_RETRIES: u32 = 5;

/// Bound on the request bytes one batch carries, whatever `database.max_batch` says: 256 writes
/// of 32 KiB each take longer to insert than a statement timeout allows, and every write of the
/// batch, other clients' small ones included, would fail with it.
pub const MAX_BATCH_BYTES: usize = 2 * 1024 * 1024;

/// One write a client asked for, validated and hashed, in compact form: the canonical text of
/// its data, not the decoded tree (which takes many times the body's size in memory).
#[derive(Debug)]
pub struct WriteRequest {
    pub client_id: Arc<str>,
    pub key: IdempotencyKey,
    pub request_hash: RequestHash,
    pub kind: String,
    /// `data`, as canonical JSON text.
    pub data_json: String,
    pub remote_addr: Option<String>,
    /// Its share of the bytes all pending writes may hold; given back when the write is done.
    pub pending: PendingPermit,
}

/// Bounds the bytes held by writes that are queued or being committed (or waiting in a shard
/// for another write of their key): past the limit a new write is refused at once with 503,
/// rather than letting memory grow while the database is slow or stalled.
#[derive(Debug, Clone)]
pub struct PendingBytes {
    limit: usize,
    used: Arc<AtomicUsize>,
}

/// A write's share of [`PendingBytes`], returned when dropped.
#[derive(Debug)]
pub struct PendingPermit {
    bytes: usize,
    used: Arc<AtomicUsize>,
}

/// What a pending write is counted as: its canonical data, kind and key, and the bookkeeping
/// around them. (While its batch commits, the statement's copies take a few times that.)
pub fn pending_size(kind: &str, data_json: &str, key: &IdempotencyKey) -> usize {
    data_json.len() + kind.len() + key.as_str().len() + 512
}

impl PendingBytes {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            used: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A permit for `bytes`, or None when that would pass the limit.
    pub fn try_acquire(&self, bytes: usize) -> Option<PendingPermit> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let wanted = used.checked_add(bytes)?;
            if wanted > self.limit {
                return None;
            }
            match self
                .used
                .compare_exchange_weak(used, wanted, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    metrics::gauge!(telemetry::PENDING_WRITE_BYTES).increment(bytes as f64);
                    return Some(PendingPermit {
                        bytes,
                        used: self.used.clone(),
                    });
                }
                Err(actual) => used = actual,
            }
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

impl PendingPermit {
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for PendingPermit {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::AcqRel);
        metrics::gauge!(telemetry::PENDING_WRITE_BYTES).decrement(self.bytes as f64);
    }
}

/// A completed response as it is saved with its idempotency record and replayed.
#[derive(Debug, Clone)]
pub struct StoredResponse {
    pub status: u16,
    /// The JSON body, in canonical form so that a replay from the database is byte-identical.
    pub body: Bytes,
    pub entry_id: Option<Uuid>,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub enum WriteOutcome {
    /// This write claimed the key and committed the entry.
    Created(StoredResponse),
    /// The key was already completed (by another process, or before a restart).
    Existing {
        request_hash: RequestHash,
        response: StoredResponse,
    },
}

pub type WriteResult = Result<WriteOutcome, StorageError>;

/// Asks a writer to commit one write; the answer comes on `reply`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Write {
    pub request: WriteRequest,
    pub reply: oneshot::Sender<WriteResult>,
}

#[derive(Clone)]
pub struct WriterConfig {
    pub max_batch: usize,
    /// How long a completed key stays an idempotency record.
    pub retention: Duration,
    /// Emit `audit.entry.created` too.
    pub audit: bool,
}

/// Called after each commit that wrote outbox rows, to wake the outbox relays.
pub type CommitHook = Arc<dyn Fn() + Send + Sync>;

pub struct Writer {
    db: Database,
    config: WriterConfig,
    queue: VecDeque<Write>,
    batch_in_flight: bool,
    on_commit: Option<CommitHook>,
}

impl Writer {
    pub fn new(db: Database, config: WriterConfig, on_commit: Option<CommitHook>) -> Self {
        Self {
            db,
            config,
            queue: VecDeque::new(),
            batch_in_flight: false,
            on_commit,
        }
    }

    fn start_batch(&mut self, ctx: &mut Context<Self>) {
        if self.batch_in_flight || self.queue.is_empty() {
            return;
        }
        let batch = self.take_batch();
        self.batch_in_flight = true;
        let db = self.db.clone();
        let config = self.config.clone();
        let on_commit = self.on_commit.clone();
        let work = async move {
            let created = process_batch(&db, &config, batch).await;
            if created > 0 {
                if let Some(hook) = on_commit {
                    hook();
                }
            }
        };
        ctx.spawn(work.into_actor(self).map(|(), writer, ctx| {
            writer.batch_in_flight = false;
            writer.start_batch(ctx);
        }));
    }

    /// Takes up to `max_batch` queued writes and [`MAX_BATCH_BYTES`] of them (at least one),
    /// never two of one key: `ON CONFLICT DO UPDATE` cannot touch a row twice in one statement.
    /// (Shards keep one write per key in flight, so that is a guard, not a path taken in
    /// practice.)
    fn take_batch(&mut self) -> Vec<Write> {
        let mut batch = Vec::with_capacity(self.queue.len().min(self.config.max_batch));
        let mut bytes = 0;
        let mut keys = HashSet::new();
        let mut deferred = VecDeque::new();
        while batch.len() < self.config.max_batch {
            let Some(write) = self.queue.pop_front() else {
                break;
            };
            let size = write.request.pending.bytes();
            if !batch.is_empty() && bytes + size > MAX_BATCH_BYTES {
                self.queue.push_front(write);
                break;
            }
            let key = (write.request.client_id.clone(), write.request.key.clone());
            if keys.insert(key) {
                bytes += size;
                batch.push(write);
            } else {
                deferred.push_back(write);
            }
        }
        deferred.append(&mut self.queue);
        self.queue = deferred;
        metrics::gauge!(telemetry::WRITER_QUEUE_DEPTH).decrement(batch.len() as f64);
        batch
    }
}

impl Actor for Writer {
    type Context = Context<Self>;
}

impl Handler<Write> for Writer {
    type Result = ();

    fn handle(&mut self, write: Write, ctx: &mut Self::Context) {
        if self.queue.len() >= self.config.max_batch * MAX_QUEUED_BATCHES {
            let _ = write.reply.send(Err(StorageError::Unavailable(
                "the writers are saturated: too many writes queued".into(),
            )));
            metrics::counter!(telemetry::WRITES_SHED, "reason" => "queue_full").increment(1);
            return;
        }
        self.queue.push_back(write);
        metrics::gauge!(telemetry::WRITER_QUEUE_DEPTH).increment(1.0);
        self.start_batch(ctx);
    }
}

/// A write with everything computed that its rows need.
struct PreparedWrite {
    client_id: Arc<str>,
    key: IdempotencyKey,
    request_hash: RequestHash,
    entry_id: Uuid,
    kind: String,
    data_json: String,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    response_body: String,
    events: Vec<NewEvent>,
}

fn prepare(request: &WriteRequest, config: &WriterConfig) -> PreparedWrite {
    let created_at = now_micros();
    let created_at_text = format_time(created_at);
    let retention = chrono::Duration::from_std(config.retention).unwrap_or(chrono::Duration::MAX);
    let entry_id = Uuid::now_v7();
    let response_body = entry_json(
        entry_id,
        &request.kind,
        &request.data_json,
        &created_at_text,
    );
    let audit = config.audit.then(|| AuditFacts {
        client_id: &request.client_id,
        idempotency_key: request.key.as_str(),
        request_hash_hex: request.request_hash.to_hex(),
        remote_addr: request.remote_addr.as_deref(),
    });
    let subject = EventSubject {
        entry_id,
        created_at: &created_at_text,
        entry_json: &response_body,
    };
    let events = events_for(&subject, audit);
    PreparedWrite {
        client_id: request.client_id.clone(),
        key: request.key.clone(),
        request_hash: request.request_hash,
        entry_id,
        kind: request.kind.clone(),
        data_json: request.data_json.clone(),
        created_at,
        expires_at: created_at
            .checked_add_signed(retention)
            .unwrap_or(DateTime::<Utc>::MAX_UTC),
        response_body,
        events,
    }
}

/// The entry as the API shows it ([`EntryView`]), in canonical JSON, written from its parts:
/// members in sorted order, `data` already canonical.
fn entry_json(id: Uuid, kind: &str, data_json: &str, created_at: &str) -> String {
    let mut out = String::with_capacity(data_json.len() + kind.len() + 128);
    out.push_str("{\"created_at\":");
    write_string(created_at, &mut out);
    out.push_str(",\"data\":");
    out.push_str(data_json);
    out.push_str(",\"id\":\"");
    out.push_str(&id.to_string());
    out.push_str("\",\"kind\":");
    write_string(kind, &mut out);
    out.push('}');
    out
}

/// Commits `batch`, answers every write in it, and returns how many entries it created.
async fn process_batch(db: &Database, config: &WriterConfig, batch: Vec<Write>) -> usize {
    let prepared: Vec<PreparedWrite> = batch
        .iter()
        .map(|write| prepare(&write.request, config))
        .collect();
    metrics::histogram!(telemetry::WRITER_BATCH_SIZE).record(prepared.len() as f64);
    let results = commit_isolating_bad_items(db, &prepared).await;
    let mut created = 0;
    for (write, result) in batch.into_iter().zip(results) {
        if matches!(result, Ok(WriteOutcome::Created(_))) {
            created += 1;
        }
        fail::fail_point!("writer-after-commit", |_| {
            tracing::error!("failpoint writer-after-commit: aborting");
            std::process::abort();
        });
        // The requester may have gone (client disconnected); the write stands regardless.
        let _ = write.reply.send(result);
    }
    created
}

/// Commits the batch; if it fails for a reason one item can cause, commits each item alone so
/// that only the bad one fails; if it ran past the statement timeout, commits each half on its
/// own (a large batch may take too long where its halves do not).
async fn commit_isolating_bad_items(db: &Database, prepared: &[PreparedWrite]) -> Vec<WriteResult> {
    match commit_with_retries(db, prepared).await {
        Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
        Err(StorageError::DataRejected(reason)) if prepared.len() > 1 => {
            tracing::warn!(reason = %reason, size = prepared.len(), "batch rejected; committing its writes one by one");
            let mut results = Vec::with_capacity(prepared.len());
            for item in prepared {
                let result = commit_with_retries(db, std::slice::from_ref(item))
                    .await
                    .map(|mut outcomes| outcomes.remove(0));
                results.push(result);
            }
            results
        }
        Err(StorageError::StatementTimeout(reason)) if prepared.len() > 1 => {
            tracing::warn!(reason = %reason, size = prepared.len(), "batch ran past the statement timeout; committing it in halves");
            let (first, second) = prepared.split_at(prepared.len() / 2);
            let mut results = Box::pin(commit_isolating_bad_items(db, first)).await;
            results.extend(Box::pin(commit_isolating_bad_items(db, second)).await);
            results
        }
        Err(error) => {
            tracing::warn!(error = %error, size = prepared.len(), "batch failed");
            prepared.iter().map(|_| Err(error.clone())).collect()
        }
    }
}

async fn commit_with_retries(
    db: &Database,
    prepared: &[PreparedWrite],
) -> Result<Vec<WriteOutcome>, StorageError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let started = std::time::Instant::now();
        // Bounded on the client's side too: a hung server enforces no statement_timeout.
        let result = db
            .run(async |connection| commit(connection, prepared).await)
            .await;
        metrics::histogram!(telemetry::WRITER_TRANSACTION).record(started.elapsed().as_secs_f64());
        let label = if result.is_ok() {
            "committed"
        } else {
            "failed"
        };
        metrics::counter!(telemetry::WRITER_BATCHES, "result" => label).increment(1);
        match result {
            Err(StorageError::Retryable(reason)) if attempt < MAX_CONFLICT_RETRIES => {
                tracing::debug!(reason = %reason, attempt, "batch aborted by a conflict; retrying");
            }
            other => return other,
        }
    }
}

/// Claims the keys, inserts entries and outbox rows for the claimed ones, in one statement.
///
/// Keys are inserted in `(client_id, key)` order so that two daemons' batches sharing keys wait
/// for each other instead of deadlocking. A record past `expires_at` that the janitor has not
/// deleted yet is taken over: after its retention a key is new again, whenever the janitor runs.
const CLAIM_AND_INSERT: &str = r#"
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::bytea[], $4::uuid[], $5::text[], $6::text[],
                $7::timestamptz[], $8::timestamptz[], $9::text[])
        AS t(client_id, key, request_hash, entry_id, kind, data, created_at, expires_at, response_json)
),
claimed AS (
    INSERT INTO idempotency_records AS r
        (client_id, key, request_hash, status, response_status, response_json, entry_id,
         created_at, expires_at)
    SELECT client_id, key, request_hash, 'completed', 201, response_json::jsonb, entry_id,
           created_at, expires_at
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
new_entries AS (
    INSERT INTO entries (id, client_id, idempotency_key, kind, data, created_at)
    SELECT i.entry_id, i.client_id, i.key, i.kind, i.data::jsonb, i.created_at
    FROM input i JOIN claimed c USING (client_id, key)
),
new_events AS (
    INSERT INTO outbox_events
        (event_id, event_key, client_id, idempotency_key, event_type, payload, created_at)
    SELECT e.event_id, e.event_key, e.client_id, e.key, e.event_type, e.payload::jsonb, now()
    FROM unnest($10::uuid[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[])
            AS e(event_id, event_key, client_id, key, event_type, payload)
        JOIN claimed c USING (client_id, key)
)
SELECT client_id, key FROM claimed
"#;

/// Reads back the records of keys a batch did not claim. Runs after the claim in the same
/// transaction: under READ COMMITTED it sees the rows that the claim waited for.
const READ_BACK: &str = r#"
SELECT r.client_id, r.key, r.request_hash, r.response_status, r.response_json::text,
       r.entry_id, r.expires_at
FROM idempotency_records r
    JOIN unnest($1::text[], $2::text[]) AS u(client_id, key) USING (client_id, key)
"#;

async fn commit(
    connection: &mut PgClient,
    prepared: &[PreparedWrite],
) -> Result<Vec<WriteOutcome>, StorageError> {
    let claim_and_insert = connection.prepare_cached(CLAIM_AND_INSERT).await?;
    let read_back = connection.prepare_cached(READ_BACK).await?;
    let transaction = connection.transaction().await?;

    let client_ids: Vec<&str> = prepared.iter().map(|p| &*p.client_id).collect();
    let keys: Vec<&str> = prepared.iter().map(|p| p.key.as_str()).collect();
    let hashes: Vec<&[u8]> = prepared.iter().map(|p| &p.request_hash.0[..]).collect();
    let entry_ids: Vec<Uuid> = prepared.iter().map(|p| p.entry_id).collect();
    let kinds: Vec<&str> = prepared.iter().map(|p| p.kind.as_str()).collect();
    let data: Vec<&str> = prepared.iter().map(|p| p.data_json.as_str()).collect();
    let created: Vec<DateTime<Utc>> = prepared.iter().map(|p| p.created_at).collect();
    let expires: Vec<DateTime<Utc>> = prepared.iter().map(|p| p.expires_at).collect();
    let responses: Vec<&str> = prepared.iter().map(|p| p.response_body.as_str()).collect();

    let events: Vec<(&PreparedWrite, &NewEvent)> = prepared
        .iter()
        .flat_map(|p| p.events.iter().map(move |event| (p, event)))
        .collect();
    let event_ids: Vec<Uuid> = events.iter().map(|(_, e)| e.event_id).collect();
    let event_keys: Vec<String> = events
        .iter()
        .map(|(p, e)| e.event_key(p.entry_id))
        .collect();
    let event_clients: Vec<&str> = events.iter().map(|(p, _)| &*p.client_id).collect();
    let event_idem_keys: Vec<&str> = events.iter().map(|(p, _)| p.key.as_str()).collect();
    let event_types: Vec<&str> = events.iter().map(|(_, e)| e.event_type).collect();
    let payloads: Vec<&str> = events.iter().map(|(_, e)| e.payload.as_str()).collect();

    let claimed_rows = transaction
        .query(
            &claim_and_insert,
            &[
                &client_ids,
                &keys,
                &hashes,
                &entry_ids,
                &kinds,
                &data,
                &created,
                &expires,
                &responses,
                &event_ids,
                &event_keys,
                &event_clients,
                &event_idem_keys,
                &event_types,
                &payloads,
            ],
        )
        .await?;
    let claimed: HashSet<(String, String)> = claimed_rows
        .iter()
        .map(|row| (row.get::<_, String>(0), row.get::<_, String>(1)))
        .collect();

    let unclaimed: Vec<&PreparedWrite> = prepared
        .iter()
        .filter(|p| !claimed.contains(&(p.client_id.to_string(), p.key.as_str().to_owned())))
        .collect();
    let mut existing: HashMap<(String, String), (RequestHash, StoredResponse)> = HashMap::new();
    if !unclaimed.is_empty() {
        let clients: Vec<&str> = unclaimed.iter().map(|p| &*p.client_id).collect();
        let keys: Vec<&str> = unclaimed.iter().map(|p| p.key.as_str()).collect();
        for row in transaction.query(&read_back, &[&clients, &keys]).await? {
            let record = stored_record_from_row(&row)?;
            existing.insert((row.get(0), row.get(1)), record);
        }
    }
    transaction.commit().await?;

    prepared
        .iter()
        .map(|p| {
            let id = (p.client_id.to_string(), p.key.as_str().to_owned());
            if claimed.contains(&id) {
                return Ok(WriteOutcome::Created(StoredResponse {
                    status: 201,
                    body: Bytes::from(p.response_body.clone()),
                    entry_id: Some(p.entry_id),
                    expires_at: p.expires_at,
                }));
            }
            match existing.remove(&id) {
                Some((request_hash, response)) => Ok(WriteOutcome::Existing {
                    request_hash,
                    response,
                }),
                // Deleted by the janitor between the claim and the read: a retry starts afresh.
                None => Err(StorageError::Unavailable(
                    "the key's record changed during the write; retry".into(),
                )),
            }
        })
        .collect()
}

/// Decodes an idempotency record row of the form `READ_BACK` selects.
fn stored_record_from_row(
    row: &tokio_postgres::Row,
) -> Result<(RequestHash, StoredResponse), StorageError> {
    let hash_bytes: Vec<u8> = row.get("request_hash");
    let request_hash = RequestHash::from_slice(&hash_bytes).ok_or_else(|| {
        StorageError::from(anyhow::anyhow!("stored request hash is not 32 bytes"))
    })?;
    let status: i16 = row.get("response_status");
    let json_text: String = row.get("response_json");
    let json: serde_json::Value = serde_json::from_str(&json_text).map_err(|error| {
        StorageError::from(anyhow::anyhow!("stored response is not JSON: {error}"))
    })?;
    Ok((
        request_hash,
        StoredResponse {
            status: status as u16,
            body: Bytes::from(canonical_json(&json)),
            entry_id: row.get("entry_id"),
            expires_at: row.get("expires_at"),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::EntryView;
    use crate::idempotency::canonical_object;

    fn queued_write(key: &str, data_bytes: usize, pending: &PendingBytes) -> Write {
        let key = IdempotencyKey::parse(key.as_bytes()).unwrap();
        let data_json = format!("{{\"pad\":\"{}\"}}", "x".repeat(data_bytes));
        let size = pending_size("k", &data_json, &key);
        Write {
            request: WriteRequest {
                client_id: Arc::from("c"),
                key,
                request_hash: RequestHash([0; 32]),
                kind: "k".into(),
                data_json,
                remote_addr: None,
                pending: pending.try_acquire(size).unwrap(),
            },
            reply: oneshot::channel().0,
        }
    }

    #[actix_web::test]
    async fn a_batch_is_bounded_in_bytes_as_well_as_in_writes() {
        let db = Database::new(&crate::config::DatabaseSettings::default()).unwrap();
        let config = WriterConfig {
            max_batch: 256,
            retention: Duration::from_secs(60),
            audit: false,
        };
        let mut writer = Writer::new(db, config, None);
        let pending = PendingBytes::new(usize::MAX);
        for n in 0..10 {
            writer
                .queue
                .push_back(queued_write(&format!("k{n}"), 512 * 1024, &pending));
        }
        let first = writer.take_batch();
        assert_eq!(
            first.len(),
            3,
            "three of 512 KiB fit in MAX_BATCH_BYTES, a fourth does not"
        );
        assert_eq!(writer.queue.len(), 7);
        let huge = queued_write("huge", MAX_BATCH_BYTES * 2, &pending);
        writer.queue.push_front(huge);
        assert_eq!(
            writer.take_batch().len(),
            1,
            "an oversized write still goes, alone"
        );
    }

    #[test]
    fn pending_bytes_are_bounded_and_given_back() {
        let pending = PendingBytes::new(1000);
        let first = pending.try_acquire(600).unwrap();
        assert!(pending.try_acquire(600).is_none(), "past the limit");
        let second = pending.try_acquire(400).unwrap();
        assert_eq!(pending.used(), 1000);
        drop(first);
        assert_eq!(pending.used(), 400);
        drop(second);
        assert_eq!(pending.used(), 0);
    }

    #[test]
    fn the_entry_json_is_the_canonical_entry_view() {
        let data: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(r#"{"z":[1,{"b":"\u00e9\"","a":null}],"a":1.5}"#).unwrap();
        let id = Uuid::now_v7();
        let text = entry_json(
            id,
            "invoice.paid",
            &canonical_object(&data),
            "2026-12-02T11:00:00.000001Z",
        );
        let view = EntryView {
            id,
            kind: "invoice.paid".into(),
            data,
            created_at: "2026-12-02T11:00:00.000001Z".into(),
        };
        assert_eq!(text, canonical_json(&serde_json::to_value(&view).unwrap()));
    }
}
