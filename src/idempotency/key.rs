//! Parsing of the `Idempotency-Key` header.

use std::fmt;

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// What a key is, as a regular expression (for the OpenAPI description): visible ASCII only.
pub const KEY_PATTERN: &str = "^[!-~]{1,255}$";

/// A validated idempotency key: 1 to 255 visible ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the key is empty")]
    Empty,
    #[error("the key is {0} characters long; at most 255 are allowed")]
    TooLong(usize),
    #[error("the key may contain only visible ASCII characters (0x21 to 0x7E)")]
    NotVisibleAscii,
    #[error("the key is a malformed structured-field string")]
    MalformedString,
    #[error("the key carries structured-field parameters (`;name=value` after the quoted string); send the key alone")]
    Parameters,
}

impl IdempotencyKey {
    /// Parses a header value. A structured-field string (`"abc"`, the IETF draft's form) is
    /// unquoted first; what remains must be 1 to 255 visible ASCII characters. Parameters after
    /// the string (`"abc";p=1`) are refused: taken as part of the key they would make one
    /// logical key into several, and ignored they would hide what the client meant.
    pub fn parse_header(raw: &[u8]) -> Result<Self, KeyError> {
        let unquoted = match raw.first() {
            Some(b'"') => unquote_sf_string(&raw[1..])?,
            _ => raw.to_vec(),
        };
        Self::parse(&unquoted)
    }

    /// Validates an unquoted key, such as one taken from a URL path.
    pub fn parse(bytes: &[u8]) -> Result<Self, KeyError> {
        if bytes.is_empty() {
            return Err(KeyError::Empty);
        }
        if !bytes.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(KeyError::NotVisibleAscii);
        }
        if bytes.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong(bytes.len()));
        }
        let text = std::str::from_utf8(bytes).expect("visible ASCII is valid UTF-8");
        Ok(Self(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An idempotency key as the daemon keeps it: keys are scoped by client, so two clients may use
/// the same key without seeing each other.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopedKey {
    pub client_id: std::sync::Arc<str>,
    pub key: IdempotencyKey,
}

/// An RFC 8941 sf-string after its opening quote: printable ASCII, with `\"` and `\\` the only
/// escapes, up to the closing quote, which must end the value.
fn unquote_sf_string(after_quote: &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut out = Vec::with_capacity(after_quote.len());
    let mut bytes = after_quote.iter();
    while let Some(&byte) = bytes.next() {
        match byte {
            b'\\' => match bytes.next() {
                Some(&escaped @ (b'"' | b'\\')) => out.push(escaped),
                _ => return Err(KeyError::MalformedString),
            },
            b'"' => {
                return match bytes.as_slice() {
                    [] => Ok(out),
                    [b';', ..] => Err(KeyError::Parameters),
                    _ => Err(KeyError::MalformedString),
                };
            }
            0x20..=0x7e => out.push(byte),
            _ => return Err(KeyError::NotVisibleAscii),
        }
    }
    // No closing quote.
    Err(KeyError::MalformedString)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_and_quoted_keys() {
        assert_eq!(
            IdempotencyKey::parse_header(b"demo-001").unwrap().as_str(),
            "demo-001"
        );
        assert_eq!(
            IdempotencyKey::parse_header(b"\"demo-001\"")
                .unwrap()
                .as_str(),
            "demo-001"
        );
        assert_eq!(
            IdempotencyKey::parse_header(br#""a\"b\\c""#)
                .unwrap()
                .as_str(),
            r#"a"b\c"#
        );
        let longest = vec![b'k'; 255];
        assert!(IdempotencyKey::parse_header(&longest).is_ok());
    }

    #[test]
    fn refuses_bad_keys() {
        assert_eq!(IdempotencyKey::parse_header(b""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse_header(b"\"\""), Err(KeyError::Empty));
        assert_eq!(
            IdempotencyKey::parse_header(&[b'k'; 256]),
            Err(KeyError::TooLong(256))
        );
        assert_eq!(
            IdempotencyKey::parse_header(b"a b"),
            Err(KeyError::NotVisibleAscii)
        );
        assert_eq!(
            IdempotencyKey::parse_header("cl\u{e9}".as_bytes()),
            Err(KeyError::NotVisibleAscii)
        );
        assert_eq!(
            IdempotencyKey::parse_header(b"a\0b"),
            Err(KeyError::NotVisibleAscii)
        );
        assert_eq!(
            IdempotencyKey::parse_header(b"\"a\"b\""),
            Err(KeyError::MalformedString)
        );
        assert_eq!(
            IdempotencyKey::parse_header(br#""a\nb""#),
            Err(KeyError::MalformedString)
        );
        assert_eq!(
            IdempotencyKey::parse_header(br#""k1";p=1"#),
            Err(KeyError::Parameters)
        );
        assert_eq!(
            IdempotencyKey::parse_header(br#""k1""#).unwrap().as_str(),
            "k1"
        );
        assert_eq!(
            IdempotencyKey::parse_header(br#""k1"x"#),
            Err(KeyError::MalformedString)
        );
        assert_eq!(
            IdempotencyKey::parse_header(br#""k1"#),
            Err(KeyError::MalformedString)
        );
    }
}
