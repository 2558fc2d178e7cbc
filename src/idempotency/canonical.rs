//! Canonical JSON and the request hash.
//!
//! Two requests are the same when their method, route and body in canonical JSON are the same:
//! object keys sorted (by their UTF-8 bytes), no insignificant white space, strings escaped as
//! serde_json escapes them, numbers as serde_json prints them. So key order and spacing do not
//! make a request different.

use std::fmt;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// SHA-256 of a request, stored with its idempotency record.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestHash(pub [u8; 32]);

impl RequestHash {
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }
}

impl fmt::Debug for RequestHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestHash({})", self.to_hex())
    }
}

/// The hash of `method`, `route` and the canonical form of `body`.
pub fn request_hash(method: &str, route: &str, body: &Value) -> RequestHash {
    let mut hasher = Sha256::new();
    hasher.update(method.as_bytes());
    hasher.update(b"\n");
    hasher.update(route.as_bytes());
    hasher.update(b"\n");
    hasher.update(canonical_json(body).as_bytes());
    RequestHash(hasher.finalize().into())
}

/// Serializes `value` canonically, independent of how serde_json's map orders keys.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

/// Serializes a JSON object canonically (as [`canonical_json`] would `Value::Object(map)`).
pub fn canonical_object(map: &Map<String, Value>) -> String {
    let mut out = String::new();
    write_object(map, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => write_object(map, out),
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::String(text) => write_string(text, out),
        scalar => out.push_str(&scalar.to_string()),
    }
}

fn write_object(map: &Map<String, Value>, out: &mut String) {
    let mut members: Vec<(&String, &Value)> = map.iter().collect();
    members.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    out.push('{');
    for (index, (name, member)) in members.into_iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        write_string(name, out);
        out.push(':');
        write_canonical(member, out);
    }
    out.push('}');
}

/// Appends `text` as a JSON string, escaped as serde_json escapes it.
pub fn write_string(text: &str, out: &mut String) {
    // Writing to a String cannot fail, and a str always serializes.
    let quoted = serde_json::to_string(text).expect("a str serializes");
    out.push_str(&quoted);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_and_spacing_do_not_matter() {
        let a: Value =
            serde_json::from_str(r#"{"kind":"x","data":{"b":1,"a":[1, 2,{"z":null,"y":true}]}}"#)
                .unwrap();
        let b: Value = serde_json::from_str(
            "{ \"data\" : {\"a\":[1,2,{\"y\":true,\"z\":null}],\n\"b\":1}, \"kind\":\"x\"}",
        )
        .unwrap();
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(
            canonical_json(&a),
            r#"{"data":{"a":[1,2,{"y":true,"z":null}],"b":1},"kind":"x"}"#
        );
        assert_eq!(
            request_hash("POST", "/v1/entries", &a),
            request_hash("POST", "/v1/entries", &b)
        );
    }

    #[test]
    fn values_method_and_route_do_matter() {
        let a = json!({"kind": "x", "data": {"n": 1}});
        let b = json!({"kind": "x", "data": {"n": 2}});
        assert_ne!(
            request_hash("POST", "/v1/entries", &a),
            request_hash("POST", "/v1/entries", &b)
        );
        assert_ne!(
            request_hash("POST", "/v1/entries", &a),
            request_hash("PUT", "/v1/entries", &a)
        );
        assert_ne!(
            request_hash("POST", "/v1/entries", &a),
            request_hash("POST", "/v1/other", &a)
        );
    }

    #[test]
    fn strings_are_escaped() {
        assert_eq!(
            canonical_json(&json!({"a\"b": "line\nbreak"})),
            r#"{"a\"b":"line\nbreak"}"#
        );
    }
}
