//! The write path: from a validated request to its committed record, entry and events.
//!
//! - [`shard`]: `KeyShard` actors, one per shard of (client, key), where requests for one key
//!   meet; [`ShardHandle::submit`] is the one call the HTTP layer makes.
//! - [`cache`]: each shard's bounded cache of completed responses, read by the HTTP workers.
//! - [`queue`]: the writes waiting for a writer, one queue that every writer takes from.
//! - [`writer`]: `Writer` actors, which commit writes in batches, one transaction each.
//! - [`batch`]: one batch's transaction, its statements and what it computes first.
//! - [`pending`]: a write on its way ([`PendingWrite`]), and the bound on the bytes pending
//!   writes hold.
//!
//! The types here are the write path's vocabulary, one per concept: a [`Write`] (what a client
//! asked for, its [`WriteRequest`] under its [`ScopedKey`]) goes in, an [`Answer`] comes out,
//! and between them a writer saves a [`SavedRecord`], which judges every later request for its
//! key ([`SavedRecord::answer_for`]: the same request is a replay, another one a conflict).

pub mod batch;
pub mod cache;
pub mod pending;
pub mod queue;
pub mod shard;
pub mod writer;

use std::sync::Arc;
use std::time::Duration;

use actix_web::web::Bytes;
use uuid::Uuid;

use crate::db::StorageError;
pub use crate::entry::WriteRequest;
use crate::idempotency::{IdempotencyKey, RequestHash, Verdict};
use crate::trace_context::TraceContext;

pub use cache::ReplayCache;
pub use pending::{PendingBytes, PendingPermit, PendingWrite};
pub use queue::WriteQueue;
pub use shard::{shard_index, KeyShard, ShardHandle};
pub use writer::{Writer, WriterConfig};

/// An idempotency key as the write path knows it: keys are scoped by client.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopedKey {
    pub client_id: Arc<str>,
    pub key: IdempotencyKey,
}

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

/// A completed key's record as the write path knows it: the hash of the request that completed
/// it, and the answer saved for that request.
#[derive(Debug, Clone)]
pub struct SavedRecord {
    pub request_hash: RequestHash,
    pub response: SavedResponse,
}

impl SavedRecord {
    /// The answer to a request with `request_hash` for this record's key: the same request is a
    /// replay of the saved answer, another one a conflict ([`Verdict::of_saved`]).
    pub fn answer_for(&self, request_hash: RequestHash) -> Answer {
        Answer::Judged(Verdict::of_saved(&self.request_hash, &request_hash, || {
            self.response.clone()
        }))
    }
}

/// The answer saved with a key's record: what the request that made the entry got, given again
/// to every request with the same key and body.
#[derive(Debug, Clone)]
pub struct SavedResponse {
    pub status: u16,
    /// The JSON body, in canonical form so that a replay from the database is byte-identical.
    pub body: Bytes,
    pub entry_id: Option<Uuid>,
    /// Until when, on this process's monotonic clock, the record surely lives: measured from the
    /// database's clock when the record was written or read (after its `expires_at` the key is
    /// new again). The daemon's wall clock, which may be wrong, plays no part.
    pub live_until: std::time::Instant,
}

/// What became of a request.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Judged by the key's record: this request made the entry (new), the key was completed
    /// before by this same request (a replay), or by another one (a conflict).
    Judged(Verdict<SavedResponse>),
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
