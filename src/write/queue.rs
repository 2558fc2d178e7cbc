//! The writes waiting for a writer: the writers share one queue ([`WriteQueue`]). The shards
//! put writes in it, and a writer that is free takes everything that queued (up to
//! `database.max_batch`, and [`MAX_BATCH_BYTES`]) as its next batch. So a write waits only until
//! the first writer is free, not for one writer chosen when it arrived (which could be busy
//! with a batch while another stood idle: with the database 20 ms away, that made a write wait
//! about one batch more). No timer delays a lone write: an idle writer is woken ([`Wake`]) and
//! starts a batch of one at once.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::db::citus::{ShardId, Topology};
use crate::metric;
use crate::write::writer::Committed;
use crate::write::{PendingWrite, WriteError};

/// Writes the queue holds at most, in batches' worth per writer: past that new writes are
/// refused with 503 at once (shedding load) rather than letting latency and memory grow without
/// bound.
pub const MAX_QUEUED_BATCHES: usize = 8;

/// Bound on the request bytes one batch carries, whatever `database.max_batch` says: 256 writes
/// of 32 KiB each take longer to insert than a statement timeout allows, and every write of the
/// batch, other clients' small ones included, would fail with it.
pub const MAX_BATCH_BYTES: usize = 2 * 1024 * 1024;

/// A write queued for the writers; the outcome comes on `reply`.
pub struct Commit {
    pub pending: PendingWrite,
    pub reply: oneshot::Sender<Result<Committed, WriteError>>,
}

/// The writes waiting for a writer, shared by the shards (which [`push`](Self::push)) and the
/// writers (which take their batches from it), with the writers that wait for work.
#[derive(Clone)]
pub struct WriteQueue {
    inner: Arc<Mutex<QueueInner>>,
    /// Writes it holds at most.
    limit: usize,
    /// Which shard each write goes to: a batch takes one shard's.
    topology: Topology,
}

struct QueueInner {
    writes: VecDeque<Commit>,
    /// Writers with no batch in flight and nothing to take, each at most once.
    idle: Vec<Recipient<Wake>>,
}

impl WriteQueue {
    /// A queue for `writers` writers of batches of `max_batch`.
    pub fn new(writers: usize, max_batch: usize, topology: Topology) -> Self {
        Self {
            inner: Arc::new(Mutex::new(QueueInner {
                writes: VecDeque::new(),
                idle: Vec::new(),
            })),
            limit: writers.max(1) * max_batch * MAX_QUEUED_BATCHES,
            topology,
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `commit` for the first writer free, and wakes one that waits; refuses it at once
    /// when the queue is full.
    pub fn push(&self, commit: Commit) {
        let mut inner = self.lock();
        if inner.writes.len() >= self.limit {
            drop(inner);
            let _ = commit.reply.send(Err(WriteError::Overloaded(
                "the writers are saturated: too many writes queued",
            )));
            metrics::counter!(metric::WRITES_SHED, "reason" => "queue_full").increment(1);
            return;
        }
        inner.writes.push_back(commit);
        metrics::gauge!(metric::WRITER_QUEUE_DEPTH).increment(1.0);
        let idle = inner.idle.pop();
        drop(inner);
        if let Some(writer) = idle {
            writer.do_send(Wake);
        }
    }

    /// The next batch ([`take_batch`]); when there is none and `waiter` is given, it is
    /// recorded as waiting, to be woken by the next [`push`](Self::push).
    pub(crate) fn take_or_wait(
        &self,
        max_batch: usize,
        waiter: Option<Recipient<Wake>>,
    ) -> Vec<Commit> {
        let mut inner = self.lock();
        let batch = take_batch(&mut inner.writes, max_batch, &self.topology);
        if batch.is_empty() {
            inner.idle.extend(waiter);
        }
        batch
    }

    /// `writer` no longer waits for work (it stops).
    pub(crate) fn forget(&self, writer: &Recipient<Wake>) {
        self.lock().idle.retain(|idle| idle != writer);
    }
}

/// Tells a waiting writer that the queue has writes.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Wake;

/// Takes up to `max_batch` queued writes and [`MAX_BATCH_BYTES`] of them (at least one), all
/// of the first one's shard (on Citus, so that the batch is a single-shard transaction; one
/// shard holds everything on a single server), never two of one key: `ON CONFLICT DO UPDATE`
/// cannot touch a row twice in one statement. (Key shards keep one write per key in flight, so
/// that is a guard, not a path taken in practice.) The writes it leaves keep their order.
pub(crate) fn take_batch(
    queue: &mut VecDeque<Commit>,
    max_batch: usize,
    topology: &Topology,
) -> Vec<Commit> {
    let mut batch = Vec::with_capacity(queue.len().min(max_batch));
    let mut bytes = 0;
    let mut keys = HashSet::new();
    let mut shard = None;
    let mut left = VecDeque::new();
    while let Some(commit) = queue.pop_front() {
        let write = &commit.pending.write;
        let its_shard = ShardOf::write(topology, write);
        if *shard.get_or_insert_with(|| its_shard.clone()) != its_shard || keys.contains(&write.key)
        {
            left.push_back(commit);
            continue;
        }
        let size = commit.pending.permit.bytes();
        if !batch.is_empty() && bytes + size > MAX_BATCH_BYTES {
            left.push_back(commit);
            break;
        }
        keys.insert(write.key.clone());
        bytes += size;
        batch.push(commit);
        if batch.len() >= max_batch {
            break;
        }
    }
    left.append(queue);
    *queue = left;
    metrics::gauge!(metric::WRITER_QUEUE_DEPTH).decrement(batch.len() as f64);
    batch
}

/// Which shard a write's rows go to, for batching: every write on a single server; on Citus the
/// client's shard, or, for a client whose shard is not known yet, the client alone.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ShardOf {
    Shard(ShardId),
    Client(Arc<str>),
}

impl ShardOf {
    fn write(topology: &Topology, write: &crate::write::Write) -> Self {
        match topology.shard_of(&write.key.client_id) {
            Some(shard) => ShardOf::Shard(shard),
            None => ShardOf::Client(write.key.client_id.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::IdempotencyKey;
    use crate::idempotency::RequestHash;
    use crate::write::{PendingBytes, ScopedKey, Write};

    fn queued(key: &str, data_bytes: usize, pending: &PendingBytes) -> Commit {
        let write = Write {
            key: ScopedKey {
                client_id: Arc::from("c"),
                key: IdempotencyKey::parse(key.as_bytes()).unwrap(),
            },
            request: crate::write::WriteRequest {
                hash: RequestHash([0; 32]),
                bytes_hash: crate::idempotency::BodyHash([0; 32]),
                kind: "k".into(),
                ordering_key: None,
                data_json: format!("{{\"pad\":\"{}\"}}", "x".repeat(data_bytes)),
            },
            remote_addr: None,
            trace: None,
        };
        Commit {
            pending: PendingWrite {
                permit: pending.try_acquire(write.pending_size()).unwrap(),
                write,
            },
            reply: oneshot::channel().0,
        }
    }

    #[test]
    fn a_batch_is_bounded_in_bytes_as_well_as_in_writes() {
        let mut queue = VecDeque::new();
        let pending = PendingBytes::new(usize::MAX);
        for n in 0..10 {
            queue.push_back(queued(&format!("k{n}"), 512 * 1024, &pending));
        }
        let first = take_batch(&mut queue, 256, &Topology::Single);
        assert_eq!(
            first.len(),
            3,
            "three of 512 KiB fit in MAX_BATCH_BYTES, a fourth does not"
        );
        assert_eq!(queue.len(), 7);
        queue.push_front(queued("huge", MAX_BATCH_BYTES * 2, &pending));
        assert_eq!(
            take_batch(&mut queue, 256, &Topology::Single).len(),
            1,
            "an oversized write still goes, alone"
        );
    }
}
