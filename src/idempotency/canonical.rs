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

/// SHA-256 of a request body's bytes as they arrived. A retry usually sends the very bytes of
/// the request it repeats, so a completed key remembers its body's hash, and such a retry is
/// recognised as the same request without parsing it again. Bodies that differ only in spacing
/// or key order have different body hashes but one [`RequestHash`]: they take the longer way.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BodyHash(pub [u8; 32]);

impl BodyHash {
    pub fn of(body: &[u8]) -> Self {
        Self(Sha256::digest(body).into())
    }
}

impl fmt::Debug for BodyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BodyHash({})", hex::encode(self.0))
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
        Value::Number(number) => {
            let literal = number.to_string();
            match normalize_number(&literal) {
                Some(normalized) => out.push_str(&normalized),
                // Out of range: validation refuses such a request; its hash still needs a form.
                None => out.push_str(&literal),
            }
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Longest number accepted, in characters of its normalized form.
pub const MAX_NUMBER_LEN: usize = 1000;

/// A JSON number in the form PostgreSQL's `numeric` prints it, which is how jsonb stores and
/// shows it: plain decimal notation, no exponent, the scale kept (`1.50` stays `1.50`, `1.5e1`
/// is `15`, `1e-2` is `0.01`), no sign on zero. Numbers are kept digit for digit (serde_json's
/// `arbitrary_precision`), so two requests that differ in the 20th digit differ. None when the
/// normalized form would be longer than [`MAX_NUMBER_LEN`] or the text is not a JSON number.
/// One pass over the digits, kept whole so that the rules above read against one body.
pub fn normalize_number(literal: &str) -> Option<String> {
    let (negative, unsigned) = match literal.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, literal),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], unsigned[at + 1..].parse::<i64>().ok()?),
        None => (unsigned, 0),
    };
    if exponent.unsigned_abs() > MAX_NUMBER_LEN as u64 {
        return None;
    }
    let (integer, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if integer.is_empty()
        || !integer
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits: String = [integer, fraction].concat();
    // Where the decimal point falls within `digits`, and how many fraction digits to show.
    let point = integer.len() as i64 + exponent;
    let scale = (fraction.len() as i64 - exponent).max(0) as usize;
    let (integer_digits, fraction_digits) = if point <= 0 {
        (
            String::from("0"),
            "0".repeat(point.unsigned_abs() as usize) + &digits,
        )
    } else if point as usize >= digits.len() {
        (
            digits.clone() + &"0".repeat(point as usize - digits.len()),
            String::new(),
        )
    } else {
        (
            digits[..point as usize].to_owned(),
            digits[point as usize..].to_owned(),
        )
    };
    let integer_digits = integer_digits.trim_start_matches('0');
    let integer_digits = if integer_digits.is_empty() {
        "0"
    } else {
        integer_digits
    };
    let mut fraction_digits = fraction_digits;
    fraction_digits.truncate(scale);
    let is_zero = integer_digits == "0" && fraction_digits.bytes().all(|b| b == b'0');
    let mut out = String::with_capacity(integer_digits.len() + scale + 2);
    if negative && !is_zero {
        out.push('-');
    }
    out.push_str(integer_digits);
    if scale > 0 {
        out.push('.');
        out.push_str(&fraction_digits);
    }
    (out.len() <= MAX_NUMBER_LEN).then_some(out)
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
    fn numbers_take_postgresql_numeric_form() {
        for (literal, expected) in [
            ("0", "0"),
            ("-0", "0"),
            ("-0.0", "0.0"),
            ("12", "12"),
            ("-12", "-12"),
            ("1.50", "1.50"),
            ("1.5e1", "15"),
            ("1.50e1", "15.0"),
            ("1e2", "100"),
            ("1E+2", "100"),
            ("1e-2", "0.01"),
            ("100e-2", "1.00"),
            ("-1.25e-3", "-0.00125"),
            ("123.456e1", "1234.56"),
            ("100000000000000000000001", "100000000000000000000001"),
            ("0.1000000000000000000001", "0.1000000000000000000001"),
        ] {
            assert_eq!(
                normalize_number(literal).as_deref(),
                Some(expected),
                "{literal}"
            );
        }
        assert_eq!(normalize_number("1e100000"), None);
        assert_eq!(normalize_number(&format!("1{}", "0".repeat(1000))), None);
    }

    #[test]
    fn numbers_are_kept_digit_for_digit() {
        let a: Value = serde_json::from_str(r#"{"n":100000000000000000000001}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"n":100000000000000000000002}"#).unwrap();
        assert_ne!(
            request_hash("POST", "/v1/entries", &a),
            request_hash("POST", "/v1/entries", &b)
        );
        let c: Value = serde_json::from_str(r#"{"n":1.5e1}"#).unwrap();
        assert_eq!(canonical_json(&c), r#"{"n":15}"#);
    }

    #[test]
    fn strings_are_escaped() {
        assert_eq!(
            canonical_json(&json!({"a\"b": "line\nbreak"})),
            r#"{"a\"b":"line\nbreak"}"#
        );
    }
}
