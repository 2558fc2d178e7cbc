//! What makes two requests "the same": the idempotency key a client sends, and the hash of the
//! request it sends with it.

pub mod canonical;
pub mod key;

pub use canonical::{canonical_json, canonical_object, request_hash, BodyHash, RequestHash};
pub use key::{IdempotencyKey, KeyError};
