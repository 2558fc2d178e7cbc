//! The writes waiting for a writer: the writers share one queue ([`WriteQueue`]). The shards
//! put writes in it, and a writer that is free takes everything that queued (up to
//! `database.max_batch`, and [`MAX_BATCH_BYTES`]) as its next batch. So a write waits only until
//! the first writer is free, not for one writer chosen when it arrived (which could be busy
//! with a batch while another stood idle: with the database 20 ms away, that made a write wait
//! about one batch more). No timer delays a lone write: an idle writer is woken ([`Wake`]) and
//! starts a batch of one at once.
//!
//! On Citus the writers are shared out between the nodes that hold the writes' shards: at most
//! half of them (rounded up) run batches on one node at a time, so that a node that stops
//! answering holds no more than that, and the others' writes go on with the rest. While writes
//! to a node fail, one batch at a time goes there (the first to find it back), and the node's
//! other writes are refused at once with 503, without waiting for a writer. A node's writes
//! hold as much of the queue as its writers' share, no more: a node that answers slowly (locks,
//! a saturated disk) sheds its own clients' writes, not the other nodes'.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use actix::prelude::*;

use crate::db::topology::{Group, Topology};
use crate::db::{StorageError, WriteHealth};
use crate::metric;
use crate::write::{Decided, Waiting, WriteError};

/// Writes the queue holds at most, in batches' worth per writer: past that new writes are
/// refused with 503 at once (shedding load) rather than letting latency and memory grow without
/// bound.
pub const MAX_QUEUED_BATCHES: usize = 8;

/// Bound on the request bytes one batch carries, whatever `database.max_batch` says: 256 writes
/// of 32 KiB each take longer to insert than a statement timeout allows, and every write of the
/// batch, other clients' small ones included, would fail with it.
pub const MAX_BATCH_BYTES: usize = 2 * 1024 * 1024;

/// The writes waiting for a writer, shared by the shards (which [`push`](Self::push)) and the
/// writers (which take their batches from it), with the writers that wait for work.
#[derive(Clone)]
pub struct WriteQueue {
    inner: Arc<Mutex<QueueInner>>,
    /// Writes it holds at most.
    limit: usize,
    /// Where each write's rows go: a batch takes the writes of one group (one shard, on Citus).
    topology: Topology,
    /// Which nodes' writes fail (what the writers and the readiness probes found).
    health: WriteHealth,
    /// Batches in flight on one node at most: half the writers, rounded up.
    per_node: usize,
    /// Writes queued for one node at most: its writers' share of `limit`.
    node_limit: usize,
}

struct QueueInner {
    /// Each write with its group, as found when it was queued: what it is counted against.
    writes: VecDeque<(Group, Waiting<Decided>)>,
    /// Writers with no batch in flight and nothing to take, each at most once.
    idle: Vec<Recipient<Wake>>,
    /// Batches in flight on each node (Citus).
    on_node: HashMap<String, usize>,
    /// Writes queued for each node (Citus).
    queued_on: HashMap<String, usize>,
}

/// Whether a write to a node is taken into a batch now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Admit {
    Take,
    /// The node runs as many batches as it may: the write waits for one to end.
    Wait,
    /// Writes to the node fail, and one batch there already finds out whether they still do.
    Refuse(String),
}

impl WriteQueue {
    /// A queue for `writers` writers of batches of `max_batch`.
    pub fn new(
        (writers, max_batch): (usize, usize),
        topology: Topology,
        health: WriteHealth,
    ) -> Self {
        Self {
            inner: Arc::new(Mutex::new(QueueInner {
                writes: VecDeque::new(),
                idle: Vec::new(),
                on_node: HashMap::new(),
                queued_on: HashMap::new(),
            })),
            limit: writers.max(1) * max_batch * MAX_QUEUED_BATCHES,
            topology,
            health,
            per_node: writers.max(1).div_ceil(2),
            node_limit: writers.max(1).div_ceil(2) * max_batch * MAX_QUEUED_BATCHES,
        }
    }

    /// Whether a write to `node` (None: a single server) is taken now.
    fn admit(&self, on_node: &HashMap<String, usize>, node: Option<&str>) -> Admit {
        let Some(node) = node else {
            return Admit::Take;
        };
        let running = on_node.get(node).copied().unwrap_or(0);
        match self
            .health
            .node_failing(node)
            .filter(|f| f.shuts_writes_out())
        {
            Some(failing) if running > 0 => Admit::Refuse(format!(
                "writes to the shards on {node} fail ({}); this one is not sent while they do",
                failing.reason
            )),
            Some(_) => Admit::Take,
            None if running >= self.per_node => Admit::Wait,
            None => Admit::Take,
        }
    }

    /// A batch on `node` ended (see [`take_or_wait`](Self::take_or_wait)).
    pub(crate) fn finished(&self, node: Option<&str>) {
        let Some(node) = node else { return };
        let mut inner = self.lock();
        if let Some(running) = inner.on_node.get_mut(node) {
            *running = running.saturating_sub(1);
        }
        // A writer may wait for this node's writes.
        let idle = inner.idle.pop();
        drop(inner);
        if let Some(writer) = idle {
            writer.do_send(Wake);
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `waiting` for the first writer free, and wakes one that waits; refuses it at once
    /// when the queue is full.
    pub fn push(&self, waiting: Waiting<Decided>) {
        let mut inner = self.lock();
        let group = self.topology.group_of(&waiting.write.key.client_id);
        if let Admit::Refuse(reason) = self.admit(&inner.on_node, group.node()) {
            drop(inner);
            refuse(waiting, reason);
            return;
        }
        let full = if inner.writes.len() >= self.limit {
            Some((
                "queue_full",
                "the writers are saturated: too many writes queued",
            ))
        } else if group
            .node()
            .is_some_and(|node| inner.queued_on.get(node).copied().unwrap_or(0) >= self.node_limit)
        {
            Some((
                "node_queue_full",
                "the database node that holds this client's rows is saturated: its share of the writers' queue is full",
            ))
        } else {
            None
        };
        if let Some((reason, why)) = full {
            drop(inner);
            let _ = waiting
                .reply
                .send(Decided::Failed(WriteError::Overloaded(why)));
            metrics::counter!(metric::WRITES_SHED, "reason" => reason).increment(1);
            return;
        }
        if let Some(node) = group.node() {
            *inner.queued_on.entry(node.to_owned()).or_default() += 1;
        }
        inner.writes.push_back((group, waiting));
        metrics::gauge!(metric::WRITER_QUEUE_DEPTH).increment(1.0);
        let idle = inner.idle.pop();
        drop(inner);
        if let Some(writer) = idle {
            writer.do_send(Wake);
        }
    }

    /// The next batch ([`take_batch`]), with the node it is counted against until
    /// [`finished`](Self::finished) is told that node; when there is none and `waiter` is
    /// given, it is recorded as waiting, to be woken by the next [`push`](Self::push) or
    /// [`finished`](Self::finished).
    pub(crate) fn take_or_wait(
        &self,
        max_batch: usize,
        waiter: Option<Recipient<Wake>>,
    ) -> (Vec<Waiting<Decided>>, Option<String>) {
        let mut inner = self.lock();
        let QueueInner {
            writes,
            on_node,
            queued_on,
            ..
        } = &mut *inner;
        let (batch, group, refused) =
            take_batch(writes, max_batch, |node| self.admit(on_node, node));
        let taken = refused.iter().map(|(group, ..)| (group, 1));
        for (group, count) in taken.chain(group.as_ref().map(|group| (group, batch.len()))) {
            if let Some(queued) = group.node().and_then(|node| queued_on.get_mut(node)) {
                *queued = queued.saturating_sub(count);
            }
        }
        let node = group.and_then(|group| group.node().map(str::to_owned));
        if let Some(node) = &node {
            *inner.on_node.entry(node.clone()).or_default() += 1;
        }
        if batch.is_empty() {
            inner.idle.extend(waiter);
        }
        drop(inner);
        for (_, waiting, reason) in refused {
            refuse(waiting, reason);
        }
        (batch, node)
    }

    /// Whether no write is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().writes.is_empty()
    }

    /// `writer` no longer waits for work (it stops).
    pub(crate) fn forget(&self, writer: &Recipient<Wake>) {
        self.lock().idle.retain(|idle| idle != writer);
    }
}

/// A write taken out of the queue unsent, with its group, and why.
type Refused = (Group, Waiting<Decided>, String);

/// Answers a write to a node whose writes fail without sending it: 503, the same key may be
/// retried.
fn refuse(waiting: Waiting<Decided>, reason: String) {
    metrics::counter!(metric::WRITES_SHED, "reason" => "node_failing").increment(1);
    let _ = waiting.reply.send(Decided::Failed(WriteError::Storage(
        StorageError::Unavailable(reason),
    )));
}

/// Tells a waiting writer that the queue has writes.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Wake;

/// Takes up to `max_batch` queued writes and [`MAX_BATCH_BYTES`] of them (at least one), all
/// of one group (on Citus a shard's, so that the batch is a single-shard transaction; one group
/// holds everything on a single server): the first write's whose node `admit` takes. Never two of one
/// key: `ON CONFLICT DO UPDATE` cannot touch a row twice in one statement. (Key shards keep one
/// write per key in flight, so that is a guard, not a path taken in practice.) Returns the
/// batch with its group, and the writes `admit` refuses, taken out with why, to be answered;
/// the writes it leaves keep their order.
fn take_batch(
    queue: &mut VecDeque<(Group, Waiting<Decided>)>,
    max_batch: usize,
    admit: impl Fn(Option<&str>) -> Admit,
) -> (Vec<Waiting<Decided>>, Option<Group>, Vec<Refused>) {
    let mut batch = Vec::with_capacity(queue.len().min(max_batch));
    let mut refused = Vec::new();
    let mut bytes = 0;
    let mut keys = HashSet::new();
    let mut group: Option<Group> = None;
    let mut left = VecDeque::new();
    while let Some((its_group, waiting)) = queue.pop_front() {
        if group.is_none() {
            match admit(its_group.node()) {
                Admit::Take => group = Some(its_group.clone()),
                Admit::Wait => {
                    left.push_back((its_group, waiting));
                    continue;
                }
                Admit::Refuse(reason) => {
                    refused.push((its_group, waiting, reason));
                    continue;
                }
            }
        }
        let write = &waiting.write;
        if group.as_ref() != Some(&its_group) || keys.contains(&write.key) {
            left.push_back((its_group, waiting));
            continue;
        }
        let size = waiting.permit.bytes();
        if !batch.is_empty() && bytes + size > MAX_BATCH_BYTES {
            left.push_back((its_group, waiting));
            break;
        }
        keys.insert(write.key.clone());
        bytes += size;
        batch.push(waiting);
        if batch.len() >= max_batch {
            break;
        }
    }
    left.append(queue);
    *queue = left;
    metrics::gauge!(metric::WRITER_QUEUE_DEPTH).decrement((batch.len() + refused.len()) as f64);
    (batch, group, refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::IdempotencyKey;
    use crate::idempotency::RequestHash;
    use crate::write::{PendingBytes, ScopedKey, Write};
    use tokio::sync::oneshot;

    fn queued(key: &str, data_bytes: usize, pending: &PendingBytes) -> Waiting<Decided> {
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
        Waiting {
            permit: pending.try_acquire(write.pending_size()).unwrap(),
            write,
            reply: oneshot::channel().0,
        }
    }

    #[test]
    fn a_batch_is_bounded_in_bytes_as_well_as_in_writes() {
        let mut queue = VecDeque::new();
        let pending = PendingBytes::new(usize::MAX);
        for n in 0..10 {
            queue.push_back((
                Group::everything(),
                queued(&format!("k{n}"), 512 * 1024, &pending),
            ));
        }
        let take = |queue: &mut VecDeque<(Group, Waiting<Decided>)>| {
            take_batch(queue, 256, |_| Admit::Take).0
        };
        let first = take(&mut queue);
        assert_eq!(
            first.len(),
            3,
            "three of 512 KiB fit in MAX_BATCH_BYTES, a fourth does not"
        );
        assert_eq!(queue.len(), 7);
        queue.push_front((
            Group::everything(),
            queued("huge", MAX_BATCH_BYTES * 2, &pending),
        ));
        assert_eq!(
            take(&mut queue).len(),
            1,
            "an oversized write still goes, alone"
        );
    }
}
