//! KeyShard actors: where requests for one idempotency key meet.
//!
//! Keys are spread over shards by a hash of (client, key). A shard holds the keys now in flight
//! and a [`ReplayCache`] of completed records. A request is judged only against a saved record,
//! never against another request still in flight: any request for a key in flight (the same
//! body or not) waits for that write's outcome, and is then answered by the saved record (a
//! replay or a conflict, [`SavedRecord::answer_for`]), or, if nothing was saved, its own write
//! runs next. A cached completed key is answered from memory. The database's unique key stays
//! the final guard: another daemon on the same database is answered through the writer's
//! read-back.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::idempotency::{BodyHash, IdempotencyKey, RequestHash, Verdict};
use crate::lifecycle::Stop;
use crate::metric;
use crate::write::queue::WriteQueue;
use crate::write::{
    Answer, Decided, PendingBytes, ReplayCache, ScopedKey, Waiting, Write, WriteError,
};

/// Which of `shard_count` shards owns the key.
pub fn shard_index(client_id: &str, key: &IdempotencyKey, shard_count: usize) -> usize {
    // SipHash with fixed keys: stable within a process, which is all that is needed.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    client_id.hash(&mut hasher);
    key.hash(&mut hasher);
    (hasher.finish() % shard_count as u64) as usize
}

/// A shard as the HTTP layer uses it.
#[derive(Clone)]
pub struct ShardHandle {
    addr: Addr<KeyShard>,
    cache: ReplayCache,
    /// Shared by every shard: the bytes all pending writes may hold.
    pending: PendingBytes,
    /// How long a request waits for its answer (`idempotency.wait_timeout`).
    wait_timeout: Duration,
}

impl ShardHandle {
    /// The shard actor, for the shutdown.
    pub fn actor(&self) -> &Addr<KeyShard> {
        &self.addr
    }

    /// A replay answered before the body is decoded: `key` is cached as completed by a request
    /// whose body had these very bytes. None otherwise: the request is decoded and
    /// [`submit`](Self::submit)ted.
    pub fn replay_of_same_body(&self, key: &ScopedKey, body: &[u8]) -> Option<Answer> {
        self.cache.replay_of_same_body(key, body)
    }

    /// What becomes of `write`: a replay or a conflict from the cache, at once; otherwise the
    /// shard's answer, awaited within `idempotency.wait_timeout`.
    pub async fn submit(&self, write: Write) -> Answer {
        if let Some(answer) = self.cache.answer(&write.key, write.request.hash) {
            return answer;
        }
        let Some(permit) = self.pending.try_acquire(write.pending_size()) else {
            metrics::counter!(metric::WRITES_SHED, "reason" => "pending_bytes").increment(1);
            return Answer::Failed(WriteError::Overloaded(
                "too many writes are pending (database.max_pending_bytes): the database is slow or stalled",
            ));
        };
        let (reply, answer) = oneshot::channel();
        let waiting = Waiting {
            write,
            permit,
            reply,
        };
        let Ok(unanswered) = self.addr.send(waiting).await else {
            // The shard is gone only when the daemon is shutting down.
            return Answer::Failed(WriteError::Stopping);
        };
        match tokio::time::timeout(self.wait_timeout, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_dropped)) => Answer::Failed(WriteError::Stopping),
            Err(_elapsed) => unanswered,
        }
    }
}

/// A request for a key, given to its shard: answered on its `reply` (a replay or a conflict at
/// once, else once its key's write is decided). The shard's own answer to the message is what
/// the request is told if that takes longer than `idempotency.wait_timeout`: a request whose
/// write was sent to a writer is [`WriteError::NotConfirmed`] (the write may still commit: a
/// retry with the same key then gets its answer), and one that waited for another write of its
/// key is [`Answer::InProgress`].
impl Message for Waiting<Answer> {
    type Result = Answer;
}

/// A key whose write is being committed.
struct InFlight {
    /// The hashes of the request whose write it is.
    request_hash: RequestHash,
    bytes_hash: BodyHash,
    /// Who gets that write's answer.
    reply: oneshot::Sender<Answer>,
    /// Requests for the key that arrived meanwhile, in order: each is judged by the saved
    /// record, or, if nothing was saved, the first runs its own write.
    waiting: VecDeque<Waiting<Answer>>,
}

pub struct KeyShard {
    queue: WriteQueue,
    in_flight: HashMap<ScopedKey, InFlight>,
    cache: ReplayCache,
    /// How long a request waits for its answer (`idempotency.wait_timeout`): what a request
    /// that was not answered in time is told it waited.
    wait_timeout: Duration,
}

impl KeyShard {
    /// Starts a shard sending its writes to the writers through `queue`, with a cache of at most
    /// `cache_capacity` records and `cache_bytes` bytes.
    pub fn start(
        queue: WriteQueue,
        cache_capacity: usize,
        cache_bytes: usize,
        pending: PendingBytes,
        wait_timeout: Duration,
    ) -> ShardHandle {
        let cache = ReplayCache::new(cache_capacity, cache_bytes);
        let addr = KeyShard {
            queue,
            in_flight: HashMap::new(),
            cache: cache.clone(),
            wait_timeout,
        }
        .start();
        ShardHandle {
            addr,
            cache,
            pending,
            wait_timeout,
        }
    }

    /// Sends the write to a writer and records it as its key's write in flight.
    fn start_write(
        &mut self,
        request: Waiting<Answer>,
        waiting: VecDeque<Waiting<Answer>>,
        ctx: &mut Context<Self>,
    ) {
        let Waiting {
            write,
            permit,
            reply,
        } = request;
        metrics::gauge!(metric::SHARD_IN_FLIGHT).increment(1.0);
        let key = write.key.clone();
        self.in_flight.insert(
            key.clone(),
            InFlight {
                request_hash: write.request.hash,
                bytes_hash: write.request.bytes_hash,
                reply,
                waiting,
            },
        );
        let (decided_reply, decided) = oneshot::channel();
        self.queue.push(Waiting {
            write,
            permit,
            reply: decided_reply,
        });
        ctx.spawn(decided.into_actor(self).map(move |decided, shard, ctx| {
            // The writer is gone only when the daemon is shutting down.
            let decided = decided.unwrap_or(Decided::Failed(WriteError::Stopping));
            shard.complete(key, decided, ctx)
        }));
    }

    fn complete(&mut self, key: ScopedKey, decided: Decided, ctx: &mut Context<Self>) {
        let Some(in_flight) = self.in_flight.remove(&key) else {
            return;
        };
        metrics::gauge!(metric::SHARD_IN_FLIGHT).decrement(1.0);
        metrics::gauge!(metric::SHARD_WAITERS).decrement(in_flight.waiting.len() as f64);
        // A receiver that is gone belongs to a client that gave up; nothing to tell it.
        let record = match decided {
            Decided::Created(record) => {
                let _ = in_flight
                    .reply
                    .send(Answer::Judged(Verdict::New(record.clone())));
                self.cache
                    .insert(key, record.clone(), Some(in_flight.bytes_hash));
                record
            }
            Decided::Found(record) => {
                let _ = in_flight
                    .reply
                    .send(record.answer_for(in_flight.request_hash));
                // Saved by another request (perhaps another daemon's): this request's body
                // bytes stand for it only if the two are the same request.
                let bytes_hash =
                    (record.request_hash == in_flight.request_hash).then_some(in_flight.bytes_hash);
                self.cache.insert(key, record.clone(), bytes_hash);
                record
            }
            Decided::Failed(error) => {
                let _ = in_flight.reply.send(Answer::Failed(error));
                self.run_next(in_flight.waiting, ctx);
                return;
            }
        };
        // Every request that waited is judged by the record now saved.
        for waiting in in_flight.waiting {
            let _ = waiting
                .reply
                .send(record.answer_for(waiting.write.request.hash));
        }
    }

    /// Nothing was saved for the key: the first request still waiting runs its own write, and
    /// the others wait on it. Requests whose clients gave up are dropped, not written.
    fn run_next(&mut self, mut waiting: VecDeque<Waiting<Answer>>, ctx: &mut Context<Self>) {
        while let Some(next) = waiting.pop_front() {
            if next.reply.is_closed() {
                continue;
            }
            // The rest wait on, now for `next`.
            metrics::gauge!(metric::SHARD_WAITERS).increment(waiting.len() as f64);
            self.start_write(next, waiting, ctx);
            return;
        }
    }
}

impl Actor for KeyShard {
    type Context = Context<Self>;
}

impl Handler<Waiting<Answer>> for KeyShard {
    type Result = MessageResult<Waiting<Answer>>;

    fn handle(&mut self, request: Waiting<Answer>, ctx: &mut Self::Context) -> Self::Result {
        // Checked again here: the key may have completed since the HTTP worker looked.
        let write = &request.write;
        if let Some(answer) = self.cache.lookup(&write.key, write.request.hash) {
            let _ = request.reply.send(answer);
            // Not read: the answer is on its way.
            return MessageResult(Answer::InProgress);
        }
        MessageResult(match self.in_flight.get_mut(&request.write.key) {
            Some(in_flight) => {
                in_flight.waiting.push_back(request);
                metrics::gauge!(metric::SHARD_WAITERS).increment(1.0);
                Answer::InProgress
            }
            None => {
                self.start_write(request, VecDeque::new(), ctx);
                Answer::Failed(WriteError::NotConfirmed(self.wait_timeout))
            }
        })
    }
}

/// Stops at once: it is asked to only once the HTTP server has finished its requests, so no
/// request waits on the shard any more. A write it sent to a writer is committed by the writer
/// all the same (the writers stop after the shards).
impl Handler<Stop> for KeyShard {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_index_is_stable_and_in_range() {
        let k = IdempotencyKey::parse(b"demo-001").unwrap();
        let first = shard_index("billing", &k, 8);
        assert!(first < 8);
        assert_eq!(first, shard_index("billing", &k, 8));
    }
}
