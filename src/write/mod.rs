//! The write path: from a validated request to its committed record, entry and events.
//!
//! - [`shard`]: `KeyShard` actors, one per shard of (client, key), where requests for one key
//!   meet; [`ShardHandle::submit`] is the one call the HTTP layer makes.
//! - [`cache`]: each shard's bounded cache of completed responses, read by the HTTP workers.
//! - [`queue`]: the writes waiting for a writer, one queue that every writer takes from.
//! - [`writer`]: `Writer` actors, which commit writes in batches, one transaction each.
//! - [`batch`]: one batch: its rows, its transaction (in the shape of the database's topology,
//!   [`crate::db::topology`]), and what it decided for each write.
//! - [`pending`]: the bound on the bytes pending writes hold.
//!
//! A write takes two forms on its way. It is [`Waiting`] (what the client asked for, its
//! share of the pending bytes, and where its decision goes) from the HTTP layer through its
//! key's shard and the queue to a writer; then it is [`Decided`] by the key's record (saved by
//! this write, or found) or failed. Each request is answered from that ([`Answer`]): the
//! request that made the record gets it as new, and every other request for the key is judged
//! by it ([`SavedRecord::answer_for`]: the same request is a replay, another one a conflict).

pub mod batch;
pub mod cache;
pub mod pending;
pub mod queue;
pub mod shard;
pub mod writer;

use std::time::Duration;

use actix_web::web::Bytes;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::db::{DatabaseClock, StorageError, WriteHealth};
pub use crate::entry::WriteRequest;
pub use crate::idempotency::ScopedKey;
use crate::idempotency::{RequestHash, Verdict};
use crate::trace_context::TraceContext;

pub use cache::ReplayCache;
pub use pending::{PendingBytes, PendingPermit};
pub use queue::WriteQueue;
pub use shard::{shard_index, KeyShard, ShardHandle};
pub use writer::Writer;

/// One write a client asked for: its request, validated and hashed, under its key.
#[derive(Debug)]
pub struct Write {
    pub key: ScopedKey,
    pub request: WriteRequest,
    /// The client's address, for the audit event.
    pub remote_addr: Option<String>,
    /// The trace context its events carry to consumers.
    pub trace: Option<TraceContext>,
}

impl Write {
    /// What the write is counted as against `database.max_pending_bytes`: its canonical data,
    /// kind and key, and the bookkeeping around them. (While its batch commits, the statement's
    /// copies take a few times that.)
    pub fn pending_size(&self) -> usize {
        self.request.data_json.len()
            + self.request.kind.len()
            + self.key.key.as_str().len()
            + self.request.ordering_key.as_ref().map_or(0, String::len)
            + self.trace.as_ref().map_or(0, TraceContext::size)
            + 512
    }
}

/// A write on its way, waiting to be decided: what the client asked for, its share of
/// [`PendingBytes`] (given back once it is answered), and where its decision goes (`D`: the
/// [`Answer`] a request waits for in its key's shard, the [`Decided`] a shard waits for from
/// the writers).
#[derive(Debug)]
pub struct Waiting<D> {
    pub write: Write,
    pub permit: PendingPermit,
    pub reply: oneshot::Sender<D>,
}

/// What the writers decided for a write.
#[derive(Debug, Clone)]
pub enum Decided {
    /// This write claimed the key and committed its entry: the record is its own.
    Created(SavedRecord),
    /// The key was completed before (by another request, another daemon, or before a restart):
    /// the write is judged by that record.
    Found(SavedRecord),
    /// Nothing is known to be saved.
    Failed(WriteError),
}

/// What a writer needs besides the writes.
#[derive(Clone)]
pub struct WriterConfig {
    pub max_batch: usize,
    /// How long a completed key stays an idempotency record, counted on the database's clock.
    pub retention: Duration,
    /// Emit `audit.entry.created` too.
    pub audit: bool,
    /// The database's clock: new entries are stamped with it, and every batch reads it.
    pub clock: DatabaseClock,
    /// Told of every batch that commits or fails.
    pub health: WriteHealth,
}

/// A completed key's record as the write path knows it: the hash of the request that completed
/// it, and the answer saved for that request, given again to every request with the same key
/// and body.
#[derive(Debug, Clone)]
pub struct SavedRecord {
    pub request_hash: RequestHash,
    pub status: u16,
    /// The JSON body, in canonical form so that a replay from the database is byte-identical.
    pub body: Bytes,
    pub entry_id: Option<Uuid>,
    /// Until when, on this process's monotonic clock, the record surely lives: measured from the
    /// database's clock when the record was written or read (after its `expires_at` the key is
    /// new again). The daemon's wall clock, which may be wrong, plays no part.
    pub live_until: std::time::Instant,
}

impl SavedRecord {
    /// The answer to a request with `request_hash` for this record's key: the same request is a
    /// replay of the saved answer, another one a conflict ([`Verdict::of_saved`]).
    pub fn answer_for(&self, request_hash: RequestHash) -> Answer {
        Answer::Judged(Verdict::of_saved(&self.request_hash, &request_hash, || {
            self.clone()
        }))
    }
}

/// What became of a request.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Judged by the key's record: this request made the entry (new), the key was completed
    /// before by this same request (a replay), or by another one (a conflict).
    Judged(Verdict<SavedRecord>),
    /// Another request for the key was still being written when this one's wait ended.
    InProgress,
    /// The write failed, or its outcome is not known.
    Failed(WriteError),
}

/// Why a write has no answer from its record. Every one of them is safe to retry with the same
/// key: either nothing was saved, or what was saved is then replayed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WriteError {
    /// The database failed the batch or did not confirm its commit.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The writer did not answer within `idempotency.wait_timeout` (the write may still
    /// commit).
    #[error("the write was not confirmed within idempotency.wait_timeout ({})", humantime::format_duration(*.0))]
    NotConfirmed(Duration),
    /// Refused before anything was sent to the database, to shed load.
    #[error("{0}")]
    Overloaded(&'static str),
    /// The key's record was deleted (it had expired) between the claim and the read-back.
    #[error("the key's record changed during the write")]
    RecordChanged,
    /// The key's shard or its writer stopped before answering: the daemon is shutting down.
    #[error("the daemon is shutting down")]
    Stopping,
}
