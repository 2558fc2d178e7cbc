//! One write as the caller sends it on every attempt: its key and its body, fixed once.

use actix_web::web::Bytes;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::entry::{decode_new_entry, DecodeError, FieldError};
use crate::idempotency::{canonical_json, IdempotencyKey, KeyError};

/// What every key derived from an intent starts with.
pub const INTENT_KEY_PREFIX: &str = "intent-";

/// The key for a business intent: `"intent-"` followed by the lowercase hex SHA-256 of the
/// intent's UTF-8 bytes (71 visible ASCII characters). The same text gives the same key on every
/// run and every machine, so a job re-run for the same intent cannot write twice; any language
/// can compute it (`printf %s "$intent" | sha256sum`).
pub fn key_for_intent(intent: &str) -> Result<IdempotencyKey, RequestError> {
    if intent.is_empty() {
        return Err(RequestError::EmptyIntent);
    }
    let digest = hex::encode(Sha256::digest(intent.as_bytes()));
    let key = format!("{INTENT_KEY_PREFIX}{digest}");
    Ok(IdempotencyKey::parse(key.as_bytes())
        .expect("a prefix of visible ASCII and 64 hex digits is a valid key"))
}

/// A key given as is, checked against the daemon's rule before anything is sent.
pub fn key_as_given(key: &str) -> Result<IdempotencyKey, RequestError> {
    IdempotencyKey::parse(key.as_bytes()).map_err(RequestError::InvalidKey)
}

/// Why a write was refused before anything was sent: retrying it cannot help.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    #[error("the intent is empty; name the business intent, e.g. \"nightly-invoices:2026-01-31\"")]
    EmptyIntent,
    #[error("invalid Idempotency-Key: {0}")]
    InvalidKey(KeyError),
    #[error("the data is not valid JSON: {0}")]
    MalformedData(String),
    #[error("the request is not a valid entry: {}", describe(.0))]
    Invalid(Vec<FieldError>),
}

fn describe(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|error| format!("{} {}", error.pointer, error.detail))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `POST /v1/entries` with one key and one body, byte for byte the same on every attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryRequest {
    key: IdempotencyKey,
    /// `{"data":...,"kind":...}` in canonical JSON: the daemon hashes the canonical form anyway,
    /// and sending it makes the bytes independent of how the caller spelled the data.
    body: Bytes,
}

impl EntryRequest {
    /// Checks `kind` and `data` as the daemon will (so a request it would refuse is refused here,
    /// before anything is sent) and fixes the body.
    pub fn new(
        key: IdempotencyKey,
        kind: &str,
        data: Map<String, Value>,
    ) -> Result<Self, RequestError> {
        Self::from_value(key, kind, Value::Object(data))
    }

    /// As [`EntryRequest::new`], with the data as JSON text, which must be an object. Numbers are
    /// kept digit for digit.
    pub fn from_json_text(
        key: IdempotencyKey,
        kind: &str,
        data: &str,
    ) -> Result<Self, RequestError> {
        let data: Value = serde_json::from_str(data)
            .map_err(|error| RequestError::MalformedData(error.to_string()))?;
        Self::from_value(key, kind, data)
    }

    /// The same write with an ordering key: the daemon numbers the client's writes with one
    /// ordering key and delivers their events in that order (docs/ordering.md). It
    /// is part of the request: every attempt, and every run for the same intent, must give it.
    pub fn with_ordering_key(self, ordering_key: &str) -> Result<Self, RequestError> {
        let mut body: Map<String, Value> =
            serde_json::from_slice(&self.body).expect("the body was made from a JSON object");
        body.insert("ordering_key".into(), Value::String(ordering_key.into()));
        Self::checked(self.key, canonical_json(&Value::Object(body)))
    }

    fn from_value(key: IdempotencyKey, kind: &str, data: Value) -> Result<Self, RequestError> {
        Self::checked(
            key,
            canonical_json(&serde_json::json!({ "kind": kind, "data": data })),
        )
    }

    fn checked(key: IdempotencyKey, body: String) -> Result<Self, RequestError> {
        match decode_new_entry(body.as_bytes()) {
            Ok(_) => Ok(Self {
                key,
                body: Bytes::from(body),
            }),
            Err(DecodeError::Invalid(errors)) => Err(RequestError::Invalid(errors)),
            Err(DecodeError::Malformed(detail)) => Err(RequestError::MalformedData(detail)),
        }
    }

    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    pub fn body(&self) -> &Bytes {
        &self.body
    }

    pub fn body_text(&self) -> &str {
        std::str::from_utf8(&self.body).expect("the body was made from a String")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test vector that docs/clients.md gives for other languages.
    #[test]
    fn an_intent_gives_the_documented_key() {
        assert_eq!(
            key_for_intent("nightly-invoices:2026-01-31")
                .unwrap()
                .as_str(),
            "intent-c1442fa4bca115488a558a23f11e16fe11f8f219e5f7d252867e6fb75433c0a1"
        );
        assert_eq!(
            key_for_intent("").unwrap_err(),
            RequestError::EmptyIntent,
            "an empty intent is a mistake, not a key"
        );
        let unicode = key_for_intent("rapport-journalier:été").unwrap();
        assert_eq!(unicode.as_str().len(), INTENT_KEY_PREFIX.len() + 64);
    }

    #[test]
    fn the_body_is_canonical_and_validated() {
        let key = key_as_given("k-1").unwrap();
        let request = EntryRequest::from_json_text(
            key.clone(),
            "invoice.paid",
            r#"{ "b": 1.5e1, "a": [1] }"#,
        )
        .unwrap();
        assert_eq!(
            request.body_text(),
            r#"{"data":{"a":[1],"b":15},"kind":"invoice.paid"}"#
        );
        assert!(matches!(
            EntryRequest::from_json_text(key.clone(), "invoice.paid", "[1]"),
            Err(RequestError::Invalid(errors)) if errors[0].pointer == "/data"
        ));
        assert!(matches!(
            EntryRequest::from_json_text(key.clone(), "Invoice", "{}"),
            Err(RequestError::Invalid(errors)) if errors[0].pointer == "/kind"
        ));
        assert!(matches!(
            EntryRequest::from_json_text(key.clone(), "invoice.paid", "{"),
            Err(RequestError::MalformedData(_))
        ));
        assert!(matches!(
            EntryRequest::from_json_text(key, "invoice.paid", r#"{"s":"a\u0000"}"#),
            Err(RequestError::Invalid(errors)) if errors[0].pointer == "/data/s"
        ));
        assert!(matches!(
            key_as_given("has space"),
            Err(RequestError::InvalidKey(KeyError::NotVisibleAscii))
        ));
    }
}
