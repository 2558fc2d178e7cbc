//! The business write: an entry, how a request for one is decoded and validated, and the JSON
//! view of it that responses and events carry (the events themselves are in `events`).

use std::cell::RefCell;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::idempotency::canonical::{normalize_number, write_string};
use crate::idempotency::{canonical_object, request_hash, BodyHash, RequestHash};

/// The route whose requests are hashed; part of every request hash.
pub const ENTRIES_ROUTE: &str = "/v1/entries";

/// What a client asks to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEntry {
    pub kind: String,
    pub data: Map<String, Value>,
    /// Writes of one client with one ordering key are numbered and delivered in commit order.
    pub ordering_key: Option<String>,
}

/// An entry as the API shows it, and as its events carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EntryView {
    pub id: Uuid,
    pub kind: String,
    #[schema(value_type = Object)]
    pub data: Map<String, Value>,
    /// RFC 3339 with microseconds, as PostgreSQL stores it, so every read shows the same text.
    pub created_at: String,
    /// The ordering key the entry was written with; absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub ordering_key: Option<String>,
    /// The entry's place among its client's writes with that ordering key: 1, 2, 3, ... in
    /// commit order, without a gap; absent without an ordering key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub sequence: Option<i64>,
}

/// A field-level problem in a request body (read back by [`crate::client`] from refusals).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FieldError {
    /// JSON pointer to the offending value (`/kind`, `/data/name`), or `/` for the body.
    pub pointer: String,
    pub detail: String,
}

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum DecodeError {
    /// Not JSON at all (syntax, encoding, nesting deeper than the parser allows).
    Malformed(String),
    /// JSON, but not a valid request.
    Invalid(Vec<FieldError>),
}

/// A decoded `POST /v1/entries` body, in the compact form a pending write keeps: the canonical
/// text of its data, not the decoded tree (which takes many times the body's size in memory).
#[derive(Debug, Clone, PartialEq)]
pub struct WriteRequest {
    pub kind: String,
    /// `data` as canonical JSON text.
    pub data_json: String,
    pub ordering_key: Option<String>,
    /// The request's hash: what tells the same request from another.
    pub hash: RequestHash,
    /// The hash of the body's bytes as they arrived: the bytes of a `POST /v1/entries`, the one
    /// route that writes (see [`BodyHash`]).
    pub bytes_hash: BodyHash,
}

/// [`decode_new_entry`], then the data in canonical form: the decoded tree is dropped here.
pub fn decode_write(body: &[u8]) -> Result<WriteRequest, DecodeError> {
    let (entry, hash) = decode_new_entry(body)?;
    Ok(WriteRequest {
        bytes_hash: BodyHash::of(body),
        data_json: canonical_object(&entry.data),
        kind: entry.kind,
        ordering_key: entry.ordering_key,
        hash,
    })
}

// The body's schema, kept beside `decode_new_entry` (below), which is what checks a body. Never
// built: its doc comments are the descriptions /openapi.json shows.
/// Body of `POST /v1/entries`. Unknown fields are refused.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct NewEntryRequest {
    /// 1 to 64 of `a-z 0-9 . _ -`.
    #[schema(pattern = "^[a-z0-9._-]{1,64}$", example = "invoice.paid")]
    kind: String,
    /// Any JSON object; strings and member names may not contain U+0000.
    #[schema(value_type = Object)]
    data: Map<String, Value>,
    /// Optional, 1 to 255 visible ASCII characters. The client's writes with one ordering key
    /// are numbered (`sequence`) in commit order, and their events reach consumers in that
    /// order (docs/ordering.md).
    #[schema(pattern = "^[!-~]{1,255}$", example = "invoice-42", nullable = false)]
    ordering_key: Option<String>,
}

/// Decodes and validates a `POST /v1/entries` body, returning the entry and the request hash.
/// The checks run in the order of the body's members, each a few lines; splitting them would
/// scatter the one order the errors are reported in.
pub fn decode_new_entry(body: &[u8]) -> Result<(NewEntry, RequestHash), DecodeError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|error| DecodeError::Malformed(format!("the body is not valid JSON: {error}")))?;
    // The parser keeps the last of two members with one name; another parser in front of the
    // daemon (a proxy, a firewall, the client's own log) may keep the first. Such a body means
    // two things, so it is refused.
    if let Some(pointer) = find_duplicate_member(body) {
        return Err(DecodeError::Invalid(vec![field_error(
            &pointer,
            "this member name appears twice in one object; each may appear once",
        )]));
    }
    let hash = request_hash("POST", ENTRIES_ROUTE, &value);
    let Value::Object(mut fields) = value else {
        return Err(DecodeError::Invalid(vec![field_error(
            "/",
            "the body must be a JSON object",
        )]));
    };
    let mut errors = Vec::new();
    for name in fields.keys() {
        if name != "kind" && name != "data" && name != "ordering_key" {
            errors.push(field_error(
                &format!("/{}", escape_pointer(name)),
                "unknown field; only \"kind\", \"data\" and \"ordering_key\" are allowed",
            ));
        }
    }
    let kind = match fields.remove("kind") {
        Some(Value::String(kind)) if is_valid_kind(&kind) => Some(kind),
        Some(Value::String(_)) => {
            errors.push(field_error("/kind", "must be 1 to 64 of a-z 0-9 . _ -"));
            None
        }
        Some(_) => {
            errors.push(field_error("/kind", "must be a string"));
            None
        }
        None => {
            errors.push(field_error("/kind", "is required"));
            None
        }
    };
    let data = match fields.remove("data") {
        Some(Value::Object(data)) => {
            find_unstorable(&data, "/data", &mut errors);
            Some(data)
        }
        Some(_) => {
            errors.push(field_error("/data", "must be a JSON object"));
            None
        }
        None => {
            errors.push(field_error("/data", "is required"));
            None
        }
    };
    let ordering_key = match fields.remove("ordering_key") {
        None => None,
        Some(Value::String(key)) if is_valid_ordering_key(&key) => Some(key),
        Some(Value::String(_)) => {
            errors.push(field_error(
                "/ordering_key",
                "must be 1 to 255 visible ASCII characters (! to ~, no spaces)",
            ));
            None
        }
        Some(_) => {
            errors.push(field_error(
                "/ordering_key",
                "must be a string (leave it out for an unordered write)",
            ));
            None
        }
    };
    match (kind, data) {
        (Some(kind), Some(data)) if errors.is_empty() => Ok((
            NewEntry {
                kind,
                data,
                ordering_key,
            },
            hash,
        )),
        _ => Err(DecodeError::Invalid(errors)),
    }
}

/// 1 to 255 visible ASCII characters, as an `Idempotency-Key`.
pub fn is_valid_ordering_key(key: &str) -> bool {
    (1..=255).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
}

pub fn is_valid_kind(kind: &str) -> bool {
    (1..=64).contains(&kind.len())
        && kind.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
}

/// Refuses, with the place it was found, what PostgreSQL's jsonb would reject or change: U+0000
/// in a string or a member name, and numbers too long for its `numeric` (see
/// [`normalize_number`]).
fn find_unstorable(map: &Map<String, Value>, pointer: &str, errors: &mut Vec<FieldError>) {
    for (name, value) in map {
        let member = format!("{pointer}/{}", escape_pointer(name));
        if name.contains('\0') {
            errors.push(field_error(&member, "member names may not contain U+0000"));
        }
        find_unstorable_in_value(value, &member, errors);
    }
}

fn find_unstorable_in_value(value: &Value, pointer: &str, errors: &mut Vec<FieldError>) {
    match value {
        Value::String(text) if text.contains('\0') => {
            errors.push(field_error(pointer, "strings may not contain U+0000"));
        }
        Value::Number(number) if normalize_number(&number.to_string()).is_none() => {
            errors.push(field_error(
                pointer,
                "numbers may have at most 1000 digits (written out without an exponent)",
            ));
        }
        Value::Object(map) => find_unstorable(map, pointer, errors),
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                find_unstorable_in_value(item, &format!("{pointer}/{index}"), errors);
            }
        }
        _ => {}
    }
}

/// The JSON pointer of the first member whose name its object already had, at any depth. Only
/// called on a body that parsed as JSON.
fn find_duplicate_member(body: &[u8]) -> Option<String> {
    let path = RefCell::new(Vec::new());
    let found = RefCell::new(None);
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let scan = DuplicateScan {
        path: &path,
        found: &found,
    };
    // An error here is the scan stopping at a duplicate (recorded in `found`): the body itself
    // parsed before.
    let _ = serde::de::DeserializeSeed::deserialize(scan, &mut deserializer);
    found.into_inner()
}

/// A pass over a JSON document that keeps nothing but the path to where it is.
struct DuplicateScan<'a> {
    path: &'a RefCell<Vec<String>>,
    found: &'a RefCell<Option<String>>,
}

impl DuplicateScan<'_> {
    fn child(&self) -> Self {
        DuplicateScan {
            path: self.path,
            found: self.found,
        }
    }

    fn pointer(&self) -> String {
        self.path
            .borrow()
            .iter()
            .map(|segment| format!("/{}", escape_pointer(segment)))
            .collect()
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for DuplicateScan<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for DuplicateScan<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
        let mut index = 0usize;
        loop {
            self.path.borrow_mut().push(index.to_string());
            let more = items.next_element_seed(self.child())?.is_some();
            self.path.borrow_mut().pop();
            if !more {
                return Ok(());
            }
            index += 1;
        }
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut members: A) -> Result<(), A::Error> {
        let mut names = std::collections::HashSet::new();
        while let Some(name) = members.next_key::<String>()? {
            self.path.borrow_mut().push(name.clone());
            if !names.insert(name) {
                *self.found.borrow_mut() = Some(self.pointer());
                return Err(serde::de::Error::custom("duplicate member name"));
            }
            members.next_value_seed(self.child())?;
            self.path.borrow_mut().pop();
        }
        Ok(())
    }
}

fn escape_pointer(name: &str) -> String {
    name.replace('~', "~0")
        .replace('/', "~1")
        .replace('\0', "\\u0000")
}

fn field_error(pointer: &str, detail: &str) -> FieldError {
    FieldError {
        pointer: pointer.to_owned(),
        detail: detail.to_owned(),
    }
}

/// The status of the answer to the request that creates an entry, saved with its record and
/// replayed to every retry.
pub const CREATED_STATUS: u16 = 201;

/// The ordering key of an ordered write and the sequence it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ordering<'a> {
    pub key: &'a str,
    pub sequence: i64,
}

/// The entry as the API shows it ([`EntryView`]), in canonical JSON, written from its parts:
/// members in sorted order, `data` already canonical. The body of the answer that created it,
/// and the data of its `entry.created` event.
pub fn entry_json(
    id: Uuid,
    kind: &str,
    data_json: &str,
    created_at: &str,
    ordering: Option<Ordering<'_>>,
) -> String {
    let mut out = String::with_capacity(data_json.len() + kind.len() + 128);
    out.push_str("{\"created_at\":");
    write_string(created_at, &mut out);
    out.push_str(",\"data\":");
    out.push_str(data_json);
    out.push_str(",\"id\":\"");
    out.push_str(&id.to_string());
    out.push_str("\",\"kind\":");
    write_string(kind, &mut out);
    if let Some(Ordering { key, sequence }) = ordering {
        out.push_str(",\"ordering_key\":");
        write_string(key, &mut out);
        out.push_str(",\"sequence\":");
        out.push_str(&sequence.to_string());
    }
    out.push('}');
    out
}

/// Formats a timestamp the one way the API shows timestamps.
pub fn format_time(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Micros, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid_pointers(body: &str) -> Vec<String> {
        match decode_new_entry(body.as_bytes()) {
            Err(DecodeError::Invalid(errors)) => errors.into_iter().map(|e| e.pointer).collect(),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn the_entry_json_is_the_canonical_entry_view() {
        let data: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(r#"{"z":[1,{"b":"\u00e9\"","a":null}],"a":1.5}"#).unwrap();
        let id = Uuid::now_v7();
        for ordering in [
            None,
            Some(Ordering {
                key: "invoice-\"42\"",
                sequence: 7,
            }),
        ] {
            let text = entry_json(
                id,
                "invoice.paid",
                &canonical_object(&data),
                "2026-12-02T11:00:00.000001Z",
                ordering,
            );
            let view = EntryView {
                id,
                kind: "invoice.paid".into(),
                data: data.clone(),
                created_at: "2026-12-02T11:00:00.000001Z".into(),
                ordering_key: ordering.map(|o| o.key.to_owned()),
                sequence: ordering.map(|o| o.sequence),
            };
            assert_eq!(
                text,
                crate::idempotency::canonical_json(&serde_json::to_value(&view).unwrap())
            );
        }
    }

    #[test]
    fn an_ordering_key_is_optional_visible_ascii_and_part_of_the_hash() {
        let (unordered, unordered_hash) = decode_new_entry(br#"{"kind":"a","data":{}}"#).unwrap();
        assert_eq!(unordered.ordering_key, None);
        let (ordered, ordered_hash) =
            decode_new_entry(br#"{"kind":"a","data":{},"ordering_key":"invoice-42"}"#).unwrap();
        assert_eq!(ordered.ordering_key.as_deref(), Some("invoice-42"));
        assert_ne!(unordered_hash, ordered_hash);
        let long = "k".repeat(255);
        assert!(decode_new_entry(
            format!(r#"{{"kind":"a","data":{{}},"ordering_key":"{long}"}}"#).as_bytes()
        )
        .is_ok());
        for bad in [
            r#""""#.to_owned(),
            r#""with space""#.to_owned(),
            r#""caf\u00e9""#.to_owned(),
            r#""tab\there""#.to_owned(),
            r#""nul\u0000""#.to_owned(),
            format!(r#""{}""#, "k".repeat(256)),
            "42".to_owned(),
            "null".to_owned(),
            r#"["a"]"#.to_owned(),
        ] {
            assert_eq!(
                invalid_pointers(&format!(
                    r#"{{"kind":"a","data":{{}},"ordering_key":{bad}}}"#
                )),
                vec!["/ordering_key"],
                "{bad}"
            );
        }
    }

    #[test]
    fn decodes_a_valid_body() {
        let (entry, _) =
            decode_new_entry(br#"{"kind":"invoice.paid","data":{"amount":12}}"#).unwrap();
        assert_eq!(entry.kind, "invoice.paid");
        assert_eq!(entry.data["amount"], 12);
    }

    #[test]
    fn refuses_bad_shapes() {
        assert_eq!(invalid_pointers(r#"[1]"#), vec!["/"]);
        assert_eq!(
            invalid_pointers(r#"{"kind":"a","data":{},"extra":1}"#),
            vec!["/extra"]
        );
        assert_eq!(invalid_pointers(r#"{"kind":"A","data":{}}"#), vec!["/kind"]);
        assert_eq!(invalid_pointers(r#"{"kind":"a","data":[]}"#), vec!["/data"]);
        assert_eq!(invalid_pointers(r#"{"data":{}}"#), vec!["/kind"]);
        assert_eq!(
            invalid_pointers(r#"{"kind":"a","data":{"x":["ok","a\u0000b"]}}"#),
            vec!["/data/x/1"]
        );
        assert_eq!(
            invalid_pointers(r#"{"kind":"a","data":{"a\u0000":1}}"#),
            vec!["/data/a\\u0000"]
        );
        assert_eq!(
            invalid_pointers(r#"{"kind":"a","data":{"n":[1e100000]}}"#),
            vec!["/data/n/0"]
        );
    }

    #[test]
    fn refuses_duplicate_member_names_at_any_depth() {
        assert_eq!(
            invalid_pointers(r#"{"kind":"a","kind":"b","data":{}}"#),
            vec!["/kind"]
        );
        assert_eq!(
            invalid_pointers(r#"{"kind":"a","data":{"x":[1,{"y":1,"z":2,"y":3}]}}"#),
            vec!["/data/x/1/y"]
        );
        assert_eq!(
            invalid_pointers(r#"{"kind":"a","data":{"a/b":{"c":1,"c":1}}}"#),
            vec!["/data/a~1b/c"]
        );
        // The same name in two different objects is fine, and so are numbers of every form.
        decode_new_entry(br#"{"kind":"a","data":{"x":{"n":1},"y":{"n":1.5e3},"z":[{"n":-0.0}]}}"#)
            .unwrap();
    }

    #[test]
    fn refuses_malformed_json() {
        for body in [
            &b"{"[..],
            b"not json",
            b"{\"kind\":\"a\",\"data\":{}}x",
            b"\xff\xfe",
        ] {
            assert!(
                matches!(decode_new_entry(body), Err(DecodeError::Malformed(_))),
                "{body:?}"
            );
        }
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(matches!(
            decode_new_entry(deep.as_bytes()),
            Err(DecodeError::Malformed(_))
        ));
        assert!(matches!(
            decode_new_entry(br#"{"kind":"a","data":{"s":"\ud800"}}"#),
            Err(DecodeError::Malformed(_))
        ));
    }
}
