//! The keyset cursor of every paged listing (`GET /v1/entries`, the admin listener's events and
//! action log): the opaque `next` of a page, base64url of a version, the last row's position
//! in the listing's order, the fingerprint of the query it belongs to, and a check over them.
//! The check catches a cursor that was cut or edited; it is not a signature, and need not be:
//! a position is no secret, and every page is read within what its caller may list anyway.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use sha2::{Digest, Sha256};

use crate::idempotency::canonical_json;

const VERSION: u8 = 1;
const FINGERPRINT_BYTES: usize = 8;
const CHECK_BYTES: usize = 8;

/// What a cursor is tied to: the query it was made for, all of it but `limit` and `cursor`. A
/// cursor given with other filters would start a page at a place that means nothing in that
/// listing, so it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint([u8; FINGERPRINT_BYTES]);

impl Fingerprint {
    /// Of the query `described` (its parameters, in a fixed order), in canonical JSON.
    pub fn of(described: &serde_json::Value) -> Self {
        Self(truncated_sha256(canonical_json(described).as_bytes()))
    }
}

/// Why a cursor was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not a cursor this listing made: cut, edited, or of another kind.
    Invalid,
    /// A cursor of this listing, given with another query.
    OtherQuery,
}

impl Refused {
    /// In words, for a `cursor:` problem; `same` names the parameters a cursor is tied to.
    pub fn describe(self, same: &str) -> String {
        match self {
            Refused::Invalid => "not a cursor this listing made; start again without one".into(),
            Refused::OtherQuery => format!(
                "it belongs to another query: give it with the same {same} as the page it came with"
            ),
        }
    }
}

fn truncated_sha256<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let digest = Sha256::digest(bytes);
    let mut out = [0u8; N];
    out.copy_from_slice(&digest[..N]);
    out
}

/// The cursor after the row at `position` (its key, `N` bytes) of the query `fingerprint`.
pub fn encode<const N: usize>(position: [u8; N], fingerprint: Fingerprint) -> String {
    let mut bytes = Vec::with_capacity(1 + N + FINGERPRINT_BYTES + CHECK_BYTES);
    bytes.push(VERSION);
    bytes.extend_from_slice(&position);
    bytes.extend_from_slice(&fingerprint.0);
    let check: [u8; CHECK_BYTES] = truncated_sha256(&bytes);
    bytes.extend_from_slice(&check);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The position in `text`, a cursor [`encode`] made for the query `fingerprint`.
pub fn decode<const N: usize>(text: &str, fingerprint: Fingerprint) -> Result<[u8; N], Refused> {
    let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| Refused::Invalid)?;
    if bytes.len() != 1 + N + FINGERPRINT_BYTES + CHECK_BYTES || bytes[0] != VERSION {
        return Err(Refused::Invalid);
    }
    let (body, check) = bytes.split_at(bytes.len() - CHECK_BYTES);
    if truncated_sha256::<CHECK_BYTES>(body)[..] != *check {
        return Err(Refused::Invalid);
    }
    if body[1 + N..] != fingerprint.0[..] {
        return Err(Refused::OtherQuery);
    }
    Ok(body[1..1 + N]
        .try_into()
        .expect("the length was checked above"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_refuses_edits_cuts_and_other_queries() {
        let query = Fingerprint::of(&serde_json::json!(["parked", "entry.created"]));
        let cursor = encode(42i64.to_be_bytes(), query);
        assert_eq!(decode::<8>(&cursor, query), Ok(42i64.to_be_bytes()));
        let other = Fingerprint::of(&serde_json::json!(["parked", null]));
        assert_eq!(decode::<8>(&cursor, other), Err(Refused::OtherQuery));
        assert_eq!(decode::<16>(&cursor, query), Err(Refused::Invalid));
        let mut bytes = URL_SAFE_NO_PAD.decode(&cursor).unwrap();
        bytes[3] ^= 1;
        assert_eq!(
            decode::<8>(&URL_SAFE_NO_PAD.encode(&bytes), query),
            Err(Refused::Invalid)
        );
        assert_eq!(decode::<8>("42", query), Err(Refused::Invalid));
        assert_eq!(
            decode::<8>(&cursor[..cursor.len() - 2], query),
            Err(Refused::Invalid)
        );
    }
}
