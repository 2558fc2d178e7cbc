//! What makes two requests "the same": the idempotency key a client sends, and the hash of the
//! request it sends with it; and what becomes of a request under a key that holds one already
//! ([`Verdict`]).

pub mod canonical;
pub mod key;
pub mod verdict;

pub use canonical::{canonical_json, canonical_object, request_hash, BodyHash, RequestHash};
pub use key::{IdempotencyKey, KeyError, ScopedKey};
pub use verdict::Verdict;
