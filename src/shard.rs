//! KeyShard actors: where requests for one idempotency key meet.
//!
//! Keys are spread over shards by a hash of (client, key). A shard holds the keys now in flight
//! and a bounded cache of completed responses. A request is judged only against a committed
//! record, never against another request still in flight: any request for a key in flight
//! (the same body or not) waits for that write's outcome, and is then answered as a replay or a
//! conflict against the saved record, or, if nothing was saved, its own write runs next. A
//! cached completed key is answered from memory. The database's unique key stays the final
//! guard: another daemon on the same database is answered through the writer's read-back.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use chrono::Utc;
use tokio::sync::oneshot;

use crate::db::StorageError;
use crate::idempotency::{IdempotencyKey, RequestHash};
use crate::telemetry;
use crate::writer::{StoredResponse, Write, WriteOutcome, WriteRequest, WriteResult, Writer};

/// A key as shards know it: keys are scoped by client.
pub type ScopedKey = (Arc<str>, IdempotencyKey);

/// Which of `shard_count` shards owns the key.
pub fn shard_index(client_id: &str, key: &IdempotencyKey, shard_count: usize) -> usize {
    // SipHash with fixed keys: stable within a process, which is all that is needed.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    client_id.hash(&mut hasher);
    key.hash(&mut hasher);
    (hasher.finish() % shard_count as u64) as usize
}

/// What became of a request, as its handler needs to know.
#[derive(Debug, Clone)]
pub enum Answer {
    /// This request made the entry.
    Created(StoredResponse),
    /// The key was completed before, by this same request.
    Replayed(StoredResponse),
    /// The key was used before with another request.
    Conflict,
    /// The write could not be done; nothing was saved for the key.
    Failed(StorageError),
}

/// How a shard admits a request.
#[derive(Debug)]
pub enum Admission {
    /// Answered at once, from the cache.
    Ready(Answer),
    /// The answer comes later. `leader` is true for the request whose write was sent to a writer
    /// and false for one waiting for another write of its key to finish first.
    Pending {
        leader: bool,
        answer: oneshot::Receiver<Answer>,
    },
}

#[derive(Message)]
#[rtype(result = "Admission")]
pub struct Submit(pub WriteRequest);

struct InFlight {
    /// The hash of the request whose write is being committed.
    request_hash: RequestHash,
    /// Who gets that write's answer.
    reply: oneshot::Sender<Answer>,
    /// Requests for the key that arrived meanwhile, in order, each with its own write: the next
    /// one runs if the write in flight saves nothing.
    waiting: VecDeque<Waiting>,
}

struct Waiting {
    request: WriteRequest,
    reply: oneshot::Sender<Answer>,
}

pub struct KeyShard {
    writers: Vec<Addr<Writer>>,
    next_writer: usize,
    in_flight: HashMap<ScopedKey, InFlight>,
    cache: SharedCache,
}

/// A shard's replay cache. Only the shard writes it; HTTP workers read it directly, so that a
/// replay of a completed key costs no message hop.
#[derive(Clone)]
pub struct SharedCache(Arc<Mutex<ResponseCache>>);

impl SharedCache {
    pub fn new(capacity: usize, capacity_bytes: usize) -> Self {
        Self(Arc::new(Mutex::new(ResponseCache::new(
            capacity,
            capacity_bytes,
        ))))
    }

    /// The answer for a request whose key is completed and cached: a replay if the request is
    /// the same, a conflict if not. None when the key is not cached.
    pub fn answer(&self, key: &ScopedKey, request_hash: RequestHash) -> Option<Answer> {
        let answer = self.lookup(key, request_hash);
        let result = if answer.is_some() { "hit" } else { "miss" };
        metrics::counter!(telemetry::SHARD_CACHE_LOOKUPS, "result" => result).increment(1);
        answer
    }

    /// [`answer`](Self::answer) without counting the lookup.
    fn lookup(&self, key: &ScopedKey, request_hash: RequestHash) -> Option<Answer> {
        let (stored_hash, response) = self.lock().get(key)?;
        Some(if stored_hash == request_hash {
            Answer::Replayed(response)
        } else {
            Answer::Conflict
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ResponseCache> {
        // A panic while holding the lock cannot leave the map half-updated in a way that
        // matters (at worst an entry is missing), so a poisoned lock is used as it is.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A shard as the HTTP layer uses it: its mailbox and its cache.
#[derive(Clone)]
pub struct ShardHandle {
    pub addr: Addr<KeyShard>,
    pub cache: SharedCache,
}

impl KeyShard {
    pub fn new(writers: Vec<Addr<Writer>>, cache: SharedCache) -> Self {
        assert!(!writers.is_empty(), "a shard needs at least one writer");
        Self {
            writers,
            next_writer: 0,
            in_flight: HashMap::new(),
            cache,
        }
    }

    /// Starts a shard with a cache of at most `cache_capacity` responses and `cache_bytes` bytes.
    pub fn spawn(
        writers: Vec<Addr<Writer>>,
        cache_capacity: usize,
        cache_bytes: usize,
    ) -> ShardHandle {
        let cache = SharedCache::new(cache_capacity, cache_bytes);
        let addr = KeyShard::new(writers, cache.clone()).start();
        ShardHandle { addr, cache }
    }

    fn pick_writer(&mut self) -> Addr<Writer> {
        self.next_writer = (self.next_writer + 1) % self.writers.len();
        self.writers[self.next_writer].clone()
    }

    /// Sends `request` to a writer and records it as the key's write in flight.
    fn start_write(
        &mut self,
        key: ScopedKey,
        request: WriteRequest,
        reply: oneshot::Sender<Answer>,
        waiting: VecDeque<Waiting>,
        ctx: &mut Context<Self>,
    ) {
        metrics::gauge!(telemetry::SHARD_IN_FLIGHT).increment(1.0);
        self.in_flight.insert(
            key.clone(),
            InFlight {
                request_hash: request.request_hash,
                reply,
                waiting,
            },
        );
        let (write_reply, result) = oneshot::channel();
        self.pick_writer().do_send(Write {
            request,
            reply: write_reply,
        });
        ctx.spawn(
            result
                .into_actor(self)
                .map(move |result, shard, ctx| shard.complete(key, result, ctx)),
        );
    }

    fn complete(
        &mut self,
        key: ScopedKey,
        result: Result<WriteResult, oneshot::error::RecvError>,
        ctx: &mut Context<Self>,
    ) {
        let Some(in_flight) = self.in_flight.remove(&key) else {
            return;
        };
        metrics::gauge!(telemetry::SHARD_IN_FLIGHT).decrement(1.0);
        metrics::gauge!(telemetry::SHARD_WAITERS).decrement(in_flight.waiting.len() as f64);
        // A receiver that is gone belongs to a client that gave up; nothing to tell it.
        let saved = match result {
            Ok(Ok(WriteOutcome::Created(response))) => {
                self.cache
                    .lock()
                    .insert(key, in_flight.request_hash, response.clone());
                let _ = in_flight.reply.send(Answer::Created(response.clone()));
                (in_flight.request_hash, response)
            }
            Ok(Ok(WriteOutcome::Existing {
                request_hash,
                response,
            })) => {
                self.cache
                    .lock()
                    .insert(key, request_hash, response.clone());
                let _ =
                    in_flight
                        .reply
                        .send(judge(in_flight.request_hash, request_hash, &response));
                (request_hash, response)
            }
            failed => {
                let error = match failed {
                    Ok(Err(error)) => error,
                    _ => StorageError::Unavailable("the writer stopped before answering".into()),
                };
                let _ = in_flight.reply.send(Answer::Failed(error));
                self.run_next(key, in_flight.waiting, ctx);
                return;
            }
        };
        // Every request that waited is judged against the record now saved.
        let (saved_hash, response) = saved;
        for waiting in in_flight.waiting {
            let _ = waiting
                .reply
                .send(judge(waiting.request.request_hash, saved_hash, &response));
        }
    }

    /// Nothing was saved for the key: the first request still waiting runs its own write, and
    /// the others wait on it. Requests whose clients gave up are dropped, not written.
    fn run_next(
        &mut self,
        key: ScopedKey,
        mut waiting: VecDeque<Waiting>,
        ctx: &mut Context<Self>,
    ) {
        while let Some(next) = waiting.pop_front() {
            if next.reply.is_closed() {
                continue;
            }
            // The rest wait on, now for `next`.
            metrics::gauge!(telemetry::SHARD_WAITERS).increment(waiting.len() as f64);
            self.start_write(key, next.request, next.reply, waiting, ctx);
            return;
        }
    }
}

/// The answer to a request with `request_hash` for a key whose saved record has `saved_hash`.
fn judge(request_hash: RequestHash, saved_hash: RequestHash, response: &StoredResponse) -> Answer {
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

    fn handle(&mut self, Submit(request): Submit, ctx: &mut Self::Context) -> Self::Result {
        let key: ScopedKey = (request.client_id.clone(), request.key.clone());
        // Checked again here: the key may have completed since the HTTP worker looked.
        if let Some(answer) = self.cache.lookup(&key, request.request_hash) {
            return MessageResult(Admission::Ready(answer));
        }
        let (reply, answer) = oneshot::channel();
        if let Some(in_flight) = self.in_flight.get_mut(&key) {
            in_flight.waiting.push_back(Waiting { request, reply });
            metrics::gauge!(telemetry::SHARD_WAITERS).increment(1.0);
            return MessageResult(Admission::Pending {
                leader: false,
                answer,
            });
        }
        self.start_write(key, request, reply, VecDeque::new(), ctx);
        MessageResult(Admission::Pending {
            leader: true,
            answer,
        })
    }
}

/// Completed responses, evicted oldest first past `capacity`, and never served past their
/// record's `expires_at` (after which the key is new again).
struct ResponseCache {
    capacity: usize,
    /// Bound on the bytes held (keys and bodies), whatever the entry count: bodies may be up to
    /// `http.max_body_bytes` and more, and the count alone would not bound memory.
    capacity_bytes: usize,
    bytes: usize,
    entries: HashMap<ScopedKey, CachedResponse>,
    /// Insertion order, with the generation each key had when inserted: a key re-inserted later
    /// leaves a stale item here that eviction skips.
    order: VecDeque<(ScopedKey, u64)>,
    next_generation: u64,
}

struct CachedResponse {
    request_hash: RequestHash,
    response: StoredResponse,
    generation: u64,
}

/// What a cached response costs, roughly: its body, its key, and the bookkeeping around them.
fn cached_size(key: &ScopedKey, response: &StoredResponse) -> usize {
    response.body.len() + key.0.len() + key.1.as_str().len() + 160
}

impl ResponseCache {
    fn new(capacity: usize, capacity_bytes: usize) -> Self {
        Self {
            capacity,
            capacity_bytes,
            bytes: 0,
            entries: HashMap::new(),
            order: VecDeque::new(),
            next_generation: 0,
        }
    }

    fn get(&mut self, key: &ScopedKey) -> Option<(RequestHash, StoredResponse)> {
        let cached = self.entries.get(key)?;
        if cached.response.expires_at <= Utc::now() {
            self.remove(key);
            return None;
        }
        Some((cached.request_hash, cached.response.clone()))
    }

    fn insert(&mut self, key: ScopedKey, request_hash: RequestHash, response: StoredResponse) {
        let size = cached_size(&key, &response);
        if self.capacity == 0 || size > self.capacity_bytes {
            return;
        }
        self.remove(&key);
        let generation = self.next_generation;
        self.next_generation += 1;
        self.order.push_back((key.clone(), generation));
        self.bytes += size;
        self.entries.insert(
            key,
            CachedResponse {
                request_hash,
                response,
                generation,
            },
        );
        metrics::gauge!(telemetry::SHARD_CACHE_ENTRIES).increment(1.0);
        while self.entries.len() > self.capacity
            || self.bytes > self.capacity_bytes
            || self.order.len() > self.capacity * 2
        {
            let Some((oldest, generation)) = self.order.pop_front() else {
                break;
            };
            if self
                .entries
                .get(&oldest)
                .is_some_and(|c| c.generation == generation)
            {
                self.remove(&oldest);
            }
        }
    }

    fn remove(&mut self, key: &ScopedKey) {
        if let Some(cached) = self.entries.remove(key) {
            self.bytes -= cached_size(key, &cached.response);
            metrics::gauge!(telemetry::SHARD_CACHE_ENTRIES).decrement(1.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::web::Bytes;

    fn response(expires_in: chrono::Duration) -> StoredResponse {
        StoredResponse {
            status: 201,
            body: Bytes::from_static(b"{}"),
            entry_id: None,
            expires_at: Utc::now() + expires_in,
        }
    }

    fn key(name: &str) -> ScopedKey {
        (
            Arc::from("c"),
            IdempotencyKey::parse(name.as_bytes()).unwrap(),
        )
    }

    #[test]
    fn cache_is_bounded_and_honors_expiry() {
        let mut cache = ResponseCache::new(2, 1 << 20);
        let hash = RequestHash([0; 32]);
        cache.insert(key("a"), hash, response(chrono::Duration::hours(1)));
        cache.insert(key("b"), hash, response(chrono::Duration::hours(1)));
        cache.insert(key("c"), hash, response(chrono::Duration::hours(1)));
        assert!(cache.get(&key("a")).is_none(), "oldest evicted");
        assert!(cache.get(&key("b")).is_some());
        assert!(cache.get(&key("c")).is_some());
        cache.insert(key("d"), hash, response(chrono::Duration::seconds(-1)));
        assert!(
            cache.get(&key("d")).is_none(),
            "expired entries are not served"
        );
    }

    #[test]
    fn cache_is_bounded_in_bytes() {
        let big = |expires_in| StoredResponse {
            body: Bytes::from(vec![b'x'; 1000]),
            ..response(expires_in)
        };
        let hash = RequestHash([0; 32]);
        let mut cache = ResponseCache::new(100, 2500);
        for name in ["a", "b", "c"] {
            cache.insert(key(name), hash, big(chrono::Duration::hours(1)));
        }
        assert!(cache.bytes <= 2500);
        assert!(
            cache.get(&key("a")).is_none(),
            "the oldest is evicted by size"
        );
        assert!(cache.get(&key("c")).is_some());
        cache.insert(key("c"), hash, big(chrono::Duration::hours(1)));
        assert_eq!(cache.entries.len(), 2, "re-inserting a key replaces it");
        cache.insert(
            key("huge"),
            hash,
            StoredResponse {
                body: Bytes::from(vec![b'x'; 5000]),
                ..response(chrono::Duration::hours(1))
            },
        );
        assert!(
            cache.get(&key("huge")).is_none(),
            "a response larger than the budget is not cached"
        );
    }

    #[test]
    fn shard_index_is_stable_and_in_range() {
        let k = IdempotencyKey::parse(b"demo-001").unwrap();
        let first = shard_index("billing", &k, 8);
        assert!(first < 8);
        assert_eq!(first, shard_index("billing", &k, 8));
    }
}
