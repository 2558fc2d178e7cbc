//! KeyShard actors: where requests for one idempotency key meet.
//!
//! Keys are spread over shards by a hash of (client, key). A shard holds the keys now in flight
//! and a [`ReplayCache`] of completed responses. A request is judged only against a committed
//! record, never against another request still in flight: any request for a key in flight
//! (the same body or not) waits for that write's outcome, and is then answered as a replay or a
//! conflict against the saved record, or, if nothing was saved, its own write runs next. A
//! cached completed key is answered from memory. The database's unique key stays the final
//! guard: another daemon on the same database is answered through the writer's read-back.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::idempotency::{BodyHash, IdempotencyKey, RequestHash};
use crate::telemetry;
use crate::write::writer::{Commit, Committed, Writer};
use crate::write::{
    Answer, PendingBytes, PendingPermit, ReplayCache, SavedResponse, ScopedKey, Write, WriteError,
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
    /// A replay answered before the body is decoded: `key` is cached as completed by a request
    /// whose body had these very bytes. None otherwise: the request is decoded and
    /// [`submit`](Self::submit)ted.
    pub fn replay_of_same_body(&self, key: &ScopedKey, body: &[u8]) -> Option<Answer> {
        self.cache.replay_of_same_body(key, body)
    }

    /// What becomes of `write`: a replay or a conflict from the cache, at once; otherwise the
    /// answer of its own write, or of the write in flight for its key, awaited at most
    /// `idempotency.wait_timeout`. Past that, a request whose write was sent to a writer is
    /// [`WriteError::NotConfirmed`] (the write may still commit: a retry with the same key then
    /// gets its answer), and one that waited for another write of its key is
    /// [`Answer::InProgress`].
    pub async fn submit(&self, write: Write) -> Answer {
        if let Some(answer) = self.cache.answer(&write.key, write.request_hash) {
            return answer;
        }
        let Some(permit) = self.pending.try_acquire(write.pending_size()) else {
            metrics::counter!(telemetry::WRITES_SHED, "reason" => "pending_bytes").increment(1);
            return Answer::Failed(WriteError::Overloaded(
                "too many writes are pending (database.max_pending_bytes): the database is slow or stalled",
            ));
        };
        let admission = match self.addr.send(Submit { write, permit }).await {
            Ok(admission) => admission,
            // The shard is gone only when the daemon is shutting down.
            Err(_) => return Answer::Failed(WriteError::WriterGone),
        };
        let (answer, leads) = match admission {
            Admission::Ready(answer) => return answer,
            Admission::Leader(answer) => (answer, true),
            Admission::Follower(answer) => (answer, false),
        };
        match tokio::time::timeout(self.wait_timeout, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_dropped)) => Answer::Failed(WriteError::WriterGone),
            Err(_elapsed) if leads => Answer::Failed(WriteError::NotConfirmed(self.wait_timeout)),
            Err(_elapsed) => Answer::InProgress,
        }
    }
}

/// How a shard admits a request.
#[derive(Debug)]
pub enum Admission {
    /// Answered at once, from the cache.
    Ready(Answer),
    /// Its write was sent to a writer; the answer comes when it is committed.
    Leader(oneshot::Receiver<Answer>),
    /// Another write of its key is in flight; the answer comes once that one is done.
    Follower(oneshot::Receiver<Answer>),
}

/// A write for the shard, with its share of the pending bytes.
#[derive(Message)]
#[rtype(result = "Admission")]
pub struct Submit {
    pub write: Write,
    pub permit: PendingPermit,
}

struct InFlight {
    /// The hashes of the request whose write is being committed.
    request_hash: RequestHash,
    body_hash: BodyHash,
    /// Who gets that write's answer.
    reply: oneshot::Sender<Answer>,
    /// Requests for the key that arrived meanwhile, in order, each with its own write: the next
    /// one runs if the write in flight saves nothing.
    waiting: VecDeque<Waiting>,
}

struct Waiting {
    submit: Submit,
    reply: oneshot::Sender<Answer>,
}

pub struct KeyShard {
    writers: Vec<Addr<Writer>>,
    next_writer: usize,
    in_flight: HashMap<ScopedKey, InFlight>,
    cache: ReplayCache,
}

impl KeyShard {
    /// Starts a shard sending its writes to `writers`, with a cache of at most
    /// `cache_capacity` responses and `cache_bytes` bytes.
    pub fn start(
        writers: Vec<Addr<Writer>>,
        cache_capacity: usize,
        cache_bytes: usize,
        pending: PendingBytes,
        wait_timeout: Duration,
    ) -> ShardHandle {
        assert!(!writers.is_empty(), "a shard needs at least one writer");
        let cache = ReplayCache::new(cache_capacity, cache_bytes);
        let addr = KeyShard {
            writers,
            next_writer: 0,
            in_flight: HashMap::new(),
            cache: cache.clone(),
        }
        .start();
        ShardHandle {
            addr,
            cache,
            pending,
            wait_timeout,
        }
    }

    fn pick_writer(&mut self) -> Addr<Writer> {
        self.next_writer = (self.next_writer + 1) % self.writers.len();
        self.writers[self.next_writer].clone()
    }

    /// Sends the write to a writer and records it as its key's write in flight.
    fn start_write(
        &mut self,
        Submit { write, permit }: Submit,
        reply: oneshot::Sender<Answer>,
        waiting: VecDeque<Waiting>,
        ctx: &mut Context<Self>,
    ) {
        metrics::gauge!(telemetry::SHARD_IN_FLIGHT).increment(1.0);
        let key = write.key.clone();
        self.in_flight.insert(
            key.clone(),
            InFlight {
                request_hash: write.request_hash,
                body_hash: write.body_hash,
                reply,
                waiting,
            },
        );
        let (commit_reply, committed) = oneshot::channel();
        self.pick_writer().do_send(Commit {
            write,
            permit,
            reply: commit_reply,
        });
        ctx.spawn(
            committed
                .into_actor(self)
                .map(move |result, shard, ctx| shard.complete(key, result, ctx)),
        );
    }

    fn complete(
        &mut self,
        key: ScopedKey,
        result: Result<Result<Committed, WriteError>, oneshot::error::RecvError>,
        ctx: &mut Context<Self>,
    ) {
        let Some(in_flight) = self.in_flight.remove(&key) else {
            return;
        };
        metrics::gauge!(telemetry::SHARD_IN_FLIGHT).decrement(1.0);
        metrics::gauge!(telemetry::SHARD_WAITERS).decrement(in_flight.waiting.len() as f64);
        // A receiver that is gone belongs to a client that gave up; nothing to tell it.
        let (saved_hash, response) = match result {
            Ok(Ok(Committed::Created(response))) => {
                self.cache.insert(
                    key,
                    in_flight.request_hash,
                    Some(in_flight.body_hash),
                    response.clone(),
                );
                let _ = in_flight.reply.send(Answer::Created(response.clone()));
                (in_flight.request_hash, response)
            }
            Ok(Ok(Committed::Existing {
                request_hash,
                response,
            })) => {
                // Saved by another request (perhaps another daemon's): this request's body
                // bytes stand for it only if the two are the same request.
                let body_hash =
                    (request_hash == in_flight.request_hash).then_some(in_flight.body_hash);
                self.cache
                    .insert(key, request_hash, body_hash, response.clone());
                let _ =
                    in_flight
                        .reply
                        .send(judge(in_flight.request_hash, request_hash, &response));
                (request_hash, response)
            }
            Ok(Err(error)) => {
                let _ = in_flight.reply.send(Answer::Failed(error));
                self.run_next(in_flight.waiting, ctx);
                return;
            }
            Err(_writer_gone) => {
                let _ = in_flight.reply.send(Answer::Failed(WriteError::WriterGone));
                self.run_next(in_flight.waiting, ctx);
                return;
            }
        };
        // Every request that waited is judged against the record now saved.
        for waiting in in_flight.waiting {
            let _ = waiting.reply.send(judge(
                waiting.submit.write.request_hash,
                saved_hash,
                &response,
            ));
        }
    }

    /// Nothing was saved for the key: the first request still waiting runs its own write, and
    /// the others wait on it. Requests whose clients gave up are dropped, not written.
    fn run_next(&mut self, mut waiting: VecDeque<Waiting>, ctx: &mut Context<Self>) {
        while let Some(next) = waiting.pop_front() {
            if next.reply.is_closed() {
                continue;
            }
            // The rest wait on, now for `next`.
            metrics::gauge!(telemetry::SHARD_WAITERS).increment(waiting.len() as f64);
            self.start_write(next.submit, next.reply, waiting, ctx);
            return;
        }
    }
}

/// The answer to a request with `request_hash` for a key whose saved record has `saved_hash`.
fn judge(request_hash: RequestHash, saved_hash: RequestHash, response: &SavedResponse) -> Answer {
    if request_hash == saved_hash {
        Answer::Replayed(response.clone())
    } else {
        Answer::Conflict
    }
}

impl Actor for KeyShard {
    type Context = Context<Self>;
}

impl Handler<Submit> for KeyShard {
    type Result = MessageResult<Submit>;

    fn handle(&mut self, submit: Submit, ctx: &mut Self::Context) -> Self::Result {
        // Checked again here: the key may have completed since the HTTP worker looked.
        if let Some(answer) = self
            .cache
            .lookup(&submit.write.key, submit.write.request_hash)
        {
            return MessageResult(Admission::Ready(answer));
        }
        let (reply, answer) = oneshot::channel();
        if let Some(in_flight) = self.in_flight.get_mut(&submit.write.key) {
            in_flight.waiting.push_back(Waiting { submit, reply });
            metrics::gauge!(telemetry::SHARD_WAITERS).increment(1.0);
            return MessageResult(Admission::Follower(answer));
        }
        self.start_write(submit, reply, VecDeque::new(), ctx);
        MessageResult(Admission::Leader(answer))
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
