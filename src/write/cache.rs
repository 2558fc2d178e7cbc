//! The replay cache: each shard's completed responses, bounded in entries and in bytes.
//!
//! The shard owns its cache and is the only one to change it (inserts, and evictions, oldest
//! first). HTTP workers read it directly, so that a replay of a completed key costs no message
//! to the shard and no query: [`ReplayCache::answer`] only reads, and an entry past its
//! record's life ([`SavedRecord::live_until`], on the monotonic clock) is not served (after it
//! the key is new again) but left for eviction.
//! An entry also remembers the hash of the completing request's body bytes, so that a retry
//! sending those very bytes is known as a replay before its body is parsed
//! ([`ReplayCache::replay_of_same_body`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock};

use std::time::Instant;

use metrics::Counter;

use crate::idempotency::{BodyHash, RequestHash, Verdict};
use crate::metric;
use crate::write::{Answer, SavedRecord, ScopedKey};

/// A shard's replay cache, shared by the shard (which writes it) and the HTTP workers (which
/// read it).
#[derive(Clone)]
pub struct ReplayCache(Arc<Shared>);

struct Shared {
    entries: RwLock<Entries>,
    /// `REPLAY_CACHE_LOOKUPS` by result, looked up in the registry once rather than at every
    /// request (the lookup hashes the name and labels, a share of a replay's own cost).
    hits: Counter,
    misses: Counter,
}

impl ReplayCache {
    /// A cache of at most `capacity` responses and `capacity_bytes` bytes. Its metrics go to
    /// the recorder installed when it is made.
    pub fn new(capacity: usize, capacity_bytes: usize) -> Self {
        Self(Arc::new(Shared {
            entries: RwLock::new(Entries {
                capacity,
                capacity_bytes,
                bytes: 0,
                entries: HashMap::new(),
                order: VecDeque::new(),
                next_generation: 0,
            }),
            hits: metrics::counter!(metric::REPLAY_CACHE_LOOKUPS, "result" => "hit"),
            misses: metrics::counter!(metric::REPLAY_CACHE_LOOKUPS, "result" => "miss"),
        }))
    }

    /// The answer for a request whose key is completed and cached: a replay if the request is
    /// the same, a conflict if not. None when the key is not cached (or its record expired).
    pub fn answer(&self, key: &ScopedKey, request_hash: RequestHash) -> Option<Answer> {
        let answer = self.lookup(key, request_hash);
        match answer {
            Some(_) => self.0.hits.increment(1),
            None => self.0.misses.increment(1),
        }
        answer
    }

    /// The replay for a request whose body has the very bytes of the request that completed
    /// `key`, known without parsing it; None in every other case (the request is then decoded
    /// and judged by [`answer`](Self::answer)). The body is hashed only when the key is cached
    /// with a body hash, outside the lock. Only a hit is counted: a miss is counted by the
    /// `answer` that follows.
    pub fn replay_of_same_body(&self, key: &ScopedKey, body: &[u8]) -> Option<Answer> {
        let (saved_hash, response) = self.with_live(key, |cached| {
            Some((cached.bytes_hash?, cached.record.clone()))
        })?;
        if BodyHash::of(body) != saved_hash {
            return None;
        }
        self.0.hits.increment(1);
        Some(Answer::Judged(Verdict::Replay(response)))
    }

    /// [`answer`](Self::answer) without counting the lookup (the shard's second look).
    pub(crate) fn lookup(&self, key: &ScopedKey, request_hash: RequestHash) -> Option<Answer> {
        self.with_live(key, |cached| Some(cached.record.answer_for(request_hash)))
    }

    /// `read` of the entry for `key`, if there is one and its record has not expired.
    fn with_live<T>(&self, key: &ScopedKey, read: impl FnOnce(&Cached) -> Option<T>) -> Option<T> {
        let entries = self
            .0
            .entries
            .read()
            // A panic while holding the lock cannot leave the map half-updated in a way that
            // matters (at worst an entry is missing), so a poisoned lock is used as it is.
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let cached = entries.entries.get(key)?;
        if cached.record.live_until <= Instant::now() {
            return None;
        }
        read(cached)
    }

    /// Caches `record` for `key` (with, when known, the hash of the bytes of a request body
    /// that completed it), evicting the oldest entries past the bounds. Only the shard calls
    /// it.
    pub(crate) fn insert(&self, key: ScopedKey, record: SavedRecord, bytes_hash: Option<BodyHash>) {
        self.0
            .entries
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(key, record, bytes_hash);
    }
}

/// Completed responses in insertion order, evicted oldest first past the bounds.
struct Entries {
    capacity: usize,
    /// Bound on the bytes held (keys and bodies), whatever the entry count: bodies may be up to
    /// `http.max_body_bytes` and more, and the count alone would not bound memory.
    capacity_bytes: usize,
    bytes: usize,
    entries: HashMap<ScopedKey, Cached>,
    /// Insertion order, with the generation each key had when inserted: a key re-inserted later
    /// leaves a stale item here that eviction skips.
    order: VecDeque<(ScopedKey, u64)>,
    next_generation: u64,
}

struct Cached {
    record: SavedRecord,
    /// The hash of the body bytes of a request known to be the record's: the one that
    /// completed the key through this daemon. None for a record read back from the database.
    bytes_hash: Option<BodyHash>,
    generation: u64,
}

/// What a cached record costs, roughly: its body, its key, and the bookkeeping around them.
fn cached_size(key: &ScopedKey, record: &SavedRecord) -> usize {
    record.body.len() + key.client_id.len() + key.key.as_str().len() + 200
}

impl Entries {
    fn insert(&mut self, key: ScopedKey, record: SavedRecord, bytes_hash: Option<BodyHash>) {
        let size = cached_size(&key, &record);
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
            Cached {
                record,
                bytes_hash,
                generation,
            },
        );
        metrics::gauge!(metric::REPLAY_CACHE_ENTRIES).increment(1.0);
        metrics::gauge!(metric::REPLAY_CACHE_BYTES).increment(size as f64);
        while self.entries.len() > self.capacity
            || self.bytes > self.capacity_bytes
            || self.order.len() > self.capacity * 2
        {
            let Some((oldest, queued_generation)) = self.order.pop_front() else {
                break;
            };
            if self
                .entries
                .get(&oldest)
                .is_some_and(|cached| cached.generation == queued_generation)
            {
                self.remove(&oldest);
            }
        }
    }

    fn remove(&mut self, key: &ScopedKey) {
        if let Some(cached) = self.entries.remove(key) {
            let size = cached_size(key, &cached.record);
            self.bytes -= size;
            metrics::gauge!(metric::REPLAY_CACHE_ENTRIES).decrement(1.0);
            metrics::gauge!(metric::REPLAY_CACHE_BYTES).decrement(size as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::IdempotencyKey;
    use actix_web::web::Bytes;

    /// Caches `response` as saved for a request with `request_hash`.
    fn put(
        cache: &ReplayCache,
        key: ScopedKey,
        request_hash: RequestHash,
        bytes_hash: Option<BodyHash>,
        response: SavedRecord,
    ) {
        cache.insert(
            key,
            SavedRecord {
                request_hash,
                ..response
            },
            bytes_hash,
        );
    }

    fn response(expires_in: chrono::Duration) -> SavedRecord {
        let now = Instant::now();
        SavedRecord {
            request_hash: RequestHash([0; 32]),
            status: 201,
            body: Bytes::from_static(b"{}"),
            entry_id: None,
            live_until: match expires_in.to_std() {
                Ok(ahead) => now + ahead,
                // Already past.
                Err(_) => now - (-expires_in).to_std().expect("negated, it is positive"),
            },
        }
    }

    fn key(name: &str) -> ScopedKey {
        ScopedKey {
            client_id: Arc::from("c"),
            key: IdempotencyKey::parse(name.as_bytes()).unwrap(),
        }
    }

    fn cached(cache: &ReplayCache, name: &str) -> bool {
        cache.lookup(&key(name), RequestHash([0; 32])).is_some()
    }

    #[test]
    fn cache_is_bounded_and_honors_expiry() {
        let cache = ReplayCache::new(2, 1 << 20);
        let hash = RequestHash([0; 32]);
        put(
            &cache,
            key("a"),
            hash,
            None,
            response(chrono::Duration::hours(1)),
        );
        put(
            &cache,
            key("b"),
            hash,
            None,
            response(chrono::Duration::hours(1)),
        );
        put(
            &cache,
            key("c"),
            hash,
            None,
            response(chrono::Duration::hours(1)),
        );
        assert!(!cached(&cache, "a"), "oldest evicted");
        assert!(cached(&cache, "b"));
        assert!(cached(&cache, "c"));
        put(
            &cache,
            key("d"),
            hash,
            None,
            response(chrono::Duration::seconds(-1)),
        );
        assert!(!cached(&cache, "d"), "expired entries are not served");
        assert!(matches!(
            cache.lookup(&key("c"), RequestHash([1; 32])),
            Some(Answer::Judged(Verdict::Conflict))
        ));
    }

    #[test]
    fn cache_is_bounded_in_bytes() {
        let big = |expires_in| SavedRecord {
            body: Bytes::from(vec![b'x'; 1000]),
            ..response(expires_in)
        };
        let hash = RequestHash([0; 32]);
        let cache = ReplayCache::new(100, 2500);
        for name in ["a", "b", "c"] {
            put(
                &cache,
                key(name),
                hash,
                None,
                big(chrono::Duration::hours(1)),
            );
        }
        let bytes = |cache: &ReplayCache| cache.0.entries.read().unwrap().bytes;
        let len = |cache: &ReplayCache| cache.0.entries.read().unwrap().entries.len();
        assert!(bytes(&cache) <= 2500);
        assert!(!cached(&cache, "a"), "the oldest is evicted by size");
        assert!(cached(&cache, "c"));
        put(
            &cache,
            key("c"),
            hash,
            None,
            big(chrono::Duration::hours(1)),
        );
        assert_eq!(len(&cache), 2, "re-inserting a key replaces it");
        put(
            &cache,
            key("huge"),
            hash,
            None,
            SavedRecord {
                body: Bytes::from(vec![b'x'; 5000]),
                ..response(chrono::Duration::hours(1))
            },
        );
        assert!(
            !cached(&cache, "huge"),
            "a response larger than the budget is not cached"
        );
    }

    #[test]
    fn the_same_body_bytes_are_a_replay_without_parsing() {
        let cache = ReplayCache::new(10, 1 << 20);
        let hash = RequestHash([7; 32]);
        let bytes = br#"{"kind":"a","data":{}}"#;
        let body = BodyHash::of(bytes);
        put(
            &cache,
            key("known"),
            hash,
            Some(body),
            response(chrono::Duration::hours(1)),
        );
        put(
            &cache,
            key("read-back"),
            hash,
            None,
            response(chrono::Duration::hours(1)),
        );
        put(
            &cache,
            key("old"),
            hash,
            Some(body),
            response(chrono::Duration::seconds(-1)),
        );
        assert!(matches!(
            cache.replay_of_same_body(&key("known"), bytes),
            Some(Answer::Judged(Verdict::Replay(_)))
        ));
        // Other bytes (perhaps the same request spaced differently), a record read back from
        // the database, an expired record or an unknown key: decoded and judged the long way.
        let other = br#"{"data":{},"kind":"a"}"#;
        assert!(cache.replay_of_same_body(&key("known"), other).is_none());
        assert!(cache
            .replay_of_same_body(&key("read-back"), bytes)
            .is_none());
        assert!(cache.replay_of_same_body(&key("old"), bytes).is_none());
        assert!(cache.replay_of_same_body(&key("unknown"), bytes).is_none());
        // The long way still finds them.
        assert!(matches!(
            cache.lookup(&key("read-back"), hash),
            Some(Answer::Judged(Verdict::Replay(_)))
        ));
    }
}
