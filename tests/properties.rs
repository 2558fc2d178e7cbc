//! Property tests for the request-decoding path: the `Idempotency-Key` parser, canonical JSON,
//! the request hash and the body decoder. Each property runs 256 generated cases (a few
//! seconds in all); `PROPTEST_CASES=10000 cargo test --test properties` runs more.
//!
//! A failing case is printed shrunk, with its seed. Failures are not persisted to a
//! `proptest-regressions/` file: that file would land outside the paths this suite owns.

use proptest::prelude::*;
use proptest::test_runner::Config;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retrysafe::entry::{decode_new_entry, DecodeError, ENTRIES_ROUTE};
use retrysafe::idempotency::{canonical_json, request_hash, IdempotencyKey, KeyError};
use serde_json::{Map, Number, Value};

fn config() -> Config {
    Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(256),
        failure_persistence: None,
        ..Config::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------------

/// A visible-ASCII key of 1 to 255 characters, as a client may send it.
fn visible_ascii(lengths: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = String> {
    prop::collection::vec(0x21u8..=0x7e, lengths)
        .prop_map(|bytes| String::from_utf8(bytes).expect("ASCII"))
}

/// Whether a raw header value has the structured-field string form, which is unquoted first.
fn has_quoted_form(raw: &[u8]) -> bool {
    raw.first() == Some(&b'"')
}

/// The RFC 8941 sf-string spelling of `key`: quoted, with `"` and `\` escaped.
fn sf_string(key: &str) -> String {
    let mut out = String::from("\"");
    for c in key.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// Strings that stress escaping and key ordering: any Unicode (control characters, quotes,
/// backslashes, astral characters), and short strings over a tiny alphabet so that objects get
/// keys sharing prefixes (`"a"`, `"ab"`, `"B"`, `"é"`).
fn json_string() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => any::<String>(),
        2 => "[aAbB\u{e9}\u{1F600}\"\\\n/]{0,3}",
    ]
}

fn json_string_without_nul() -> impl Strategy<Value = String> {
    json_string().prop_map(|s| s.replace('\0', ""))
}

/// Which floats the generators make.
#[derive(Clone, Copy)]
enum Floats {
    /// Every finite f64.
    All,
    /// Only those that serde_json reads back exactly from its own output. This build's
    /// serde_json has no `float_roundtrip` feature, and its fast float parser is off by one ULP
    /// for some literals with large exponents (`7.089665258415694e-214` reads back as
    /// `7.0896652584156944e-214`); see `..._for_every_float` below, ignored as a bug.
    ReadBackExactly,
}

fn reads_back_exactly(number: &Number) -> bool {
    serde_json::from_str::<Value>(&number.to_string()).ok() == Some(Value::Number(number.clone()))
}

fn json_number(floats: Floats) -> impl Strategy<Value = Value> {
    let float = move |f: f64| {
        Number::from_f64(f)
            .filter(|n| matches!(floats, Floats::All) || reads_back_exactly(n))
            .map(Value::Number)
    };
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1000i64..1000).prop_map(Value::from),
        any::<f64>().prop_filter_map("finite, and read back exactly if asked", float),
        (-1.0e6f64..1.0e6).prop_filter_map("finite", float),
    ]
}

/// Arbitrary JSON trees, at most 4 levels of containers deep.
fn json_value_with(strings: BoxedStrategy<String>, floats: Floats) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        json_number(floats),
        strings.clone().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((strings.clone(), inner), 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

fn json_value() -> impl Strategy<Value = Value> {
    json_value_with(json_string().boxed(), Floats::ReadBackExactly)
}

fn json_object_without_nul() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec(
        (
            json_string_without_nul(),
            json_value_with(json_string_without_nul().boxed(), Floats::ReadBackExactly),
        ),
        0..6,
    )
    .prop_map(|members| members.into_iter().collect())
}

/// A valid `kind`: 1 to 64 of a-z 0-9 . _ -
fn valid_kind() -> impl Strategy<Value = String> {
    "[a-z0-9._-]{1,64}"
}

// ---------------------------------------------------------------------------------------------
// Rendering a value as JSON text, another way each time
// ---------------------------------------------------------------------------------------------

/// Writes `value` as JSON text with object members in a random order, random insignificant
/// white space, and characters randomly written as `\u` escapes (surrogate pairs for astral
/// ones) or short escapes. serde_json's `Map` may be a `BTreeMap` that sorts its keys, so the
/// shuffled order exists only in this text; parsing it must give back `value`.
fn render(value: &Value, rng: &mut StdRng) -> String {
    let mut out = String::new();
    space(rng, &mut out);
    render_into(value, rng, &mut out);
    space(rng, &mut out);
    out
}

fn space(rng: &mut StdRng, out: &mut String) {
    for _ in 0..rng.gen_range(0..3) {
        out.push([' ', '\t', '\n', '\r'][rng.gen_range(0..4)]);
    }
}

fn render_into(value: &Value, rng: &mut StdRng, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            // Fisher-Yates with the case's own generator, so that a failure replays.
            for i in (1..members.len()).rev() {
                members.swap(i, rng.gen_range(0..=i));
            }
            out.push('{');
            for (index, (name, member)) in members.into_iter().enumerate() {
                if index > 0 {
                    space(rng, out);
                    out.push(',');
                }
                space(rng, out);
                render_string(name, rng, out);
                space(rng, out);
                out.push(':');
                space(rng, out);
                render_into(member, rng, out);
                space(rng, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                space(rng, out);
                render_into(item, rng, out);
                space(rng, out);
            }
            out.push(']');
        }
        Value::String(text) => render_string(text, rng, out),
        // Numbers keep serde_json's spelling: another spelling of a float (`1e2` for `100.0`)
        // is another literal, which serde_json (without `float_roundtrip`) may round to
        // another f64.
        scalar => out.push_str(&scalar.to_string()),
    }
}

fn render_string(text: &str, rng: &mut StdRng, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        let short = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            '/' => Some("\\/"),
            _ => None,
        };
        let must_escape = c == '"' || c == '\\' || (c as u32) < 0x20;
        if must_escape || rng.gen_bool(0.25) {
            match short {
                Some(escape) if rng.gen_bool(0.5) => out.push_str(escape),
                _ => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{:04x}", unit));
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out.push('"');
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("rendered text must parse ({e}): {text}"))
}

/// Whether this build's serde_json `Map` keeps keys sorted (no `preserve_order` feature).
fn map_is_sorted() -> bool {
    let reordered = parse(r#"{"b":1,"a":2}"#).to_string();
    reordered == r#"{"a":2,"b":1}"#
}

// ---------------------------------------------------------------------------------------------
// IdempotencyKey::parse_header
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    /// Every 1-255 visible-ASCII value is a key, unchanged (unless it starts with `"`: it is
    /// then an sf-string, which the contract unquotes first; see the next properties).
    #[test]
    fn every_visible_ascii_value_is_accepted_unchanged(raw in visible_ascii(1..=255)) {
        prop_assume!(!has_quoted_form(raw.as_bytes()));
        let key = IdempotencyKey::parse_header(raw.as_bytes());
        prop_assert_eq!(key.as_ref().map(|k| k.as_str()), Ok(raw.as_str()));
    }

    /// A key sent in the sf-string form, with `"` and `\` escaped, unquotes to the same key.
    #[test]
    fn the_sf_string_form_unquotes_to_the_same_key(key in visible_ascii(1..=255)) {
        let quoted = sf_string(&key);
        let parsed = IdempotencyKey::parse_header(quoted.as_bytes());
        prop_assert_eq!(parsed.as_ref().map(|k| k.as_str()), Ok(key.as_str()), "sent {}", quoted);
        if !has_quoted_form(key.as_bytes()) {
            prop_assert_eq!(parsed, IdempotencyKey::parse_header(key.as_bytes()));
        }
    }

    /// An sf-string followed by parameters (`"key";p=1`) is refused, whatever the key and the
    /// parameters: one logical key must not become several.
    #[test]
    fn an_sf_string_with_parameters_is_refused(
        key in visible_ascii(1..=255),
        parameters in visible_ascii(0..=40),
    ) {
        let raw = format!("{};{parameters}", sf_string(&key));
        prop_assert_eq!(
            IdempotencyKey::parse_header(raw.as_bytes()),
            Err(KeyError::Parameters)
        );
    }

    /// A byte outside 0x21-0x7E anywhere (space, control, DEL, non-ASCII) refuses the value,
    /// plain or inside an sf-string.
    #[test]
    fn a_byte_outside_visible_ascii_is_refused(
        prefix in visible_ascii(0..=120),
        bad in prop_oneof![0u8..=0x20, 0x7fu8..=0xff],
        suffix in visible_ascii(0..=120),
        quoted in any::<bool>(),
    ) {
        let mut raw = Vec::new();
        if quoted { raw.push(b'"'); }
        raw.extend_from_slice(prefix.replace(['"', '\\'], "k").as_bytes());
        raw.push(bad);
        raw.extend_from_slice(suffix.replace(['"', '\\'], "k").as_bytes());
        if quoted { raw.push(b'"'); }
        let parsed = IdempotencyKey::parse_header(&raw);
        prop_assert!(parsed.is_err(), "accepted {:?} as {:?}", raw, parsed);
    }

    /// A key longer than 255 characters is refused, plain or quoted.
    #[test]
    fn a_key_longer_than_255_is_refused(key in visible_ascii(256..=600)) {
        if !has_quoted_form(key.as_bytes()) {
            prop_assert_eq!(
                IdempotencyKey::parse_header(key.as_bytes()),
                Err(KeyError::TooLong(key.len()))
            );
        }
        prop_assert_eq!(
            IdempotencyKey::parse_header(sf_string(&key).as_bytes()),
            Err(KeyError::TooLong(key.len()))
        );
    }

    /// Whatever the bytes, parsing does not panic, and an accepted key is 1-255 visible ASCII.
    #[test]
    fn any_bytes_give_a_valid_key_or_an_error(
        raw in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300),
            prop::collection::vec(prop::sample::select(b"\"\\ a~\x7f\x00".to_vec()), 0..12),
        ]
    ) {
        if let Ok(key) = IdempotencyKey::parse_header(&raw) {
            let bytes = key.as_str().as_bytes();
            prop_assert!((1..=255).contains(&bytes.len()));
            prop_assert!(bytes.iter().all(|b| (0x21..=0x7e).contains(b)));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// canonical_json and request_hash
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    /// The canonical text parses back to the same value (numbers compared by value: they are
    /// written in PostgreSQL's plain decimal form), and canonicalizing it again changes nothing.
    #[test]
    fn canonical_json_round_trips_and_is_idempotent(value in json_value()) {
        let canonical = canonical_json(&value);
        let reparsed = parse(&canonical);
        prop_assert!(same_values(&reparsed, &value), "canonical text: {}", canonical);
        prop_assert_eq!(canonical_json(&reparsed), canonical);
    }

    /// The same, for every finite float: numbers are kept digit for digit (serde_json's
    /// `arbitrary_precision`), so the canonical text of any float is a fixed point and a replay
    /// read back from the database is the first response's bytes.
    #[test]
    fn canonical_json_round_trips_and_is_idempotent_for_every_float(
        value in json_value_with(json_string().boxed(), Floats::All)
    ) {
        let canonical = canonical_json(&value);
        let reparsed = parse(&canonical);
        prop_assert!(same_values(&reparsed, &value), "canonical text: {}", canonical);
        prop_assert_eq!(canonical_json(&reparsed), canonical);
    }

    /// Key order, white space and string escapes in the text do not change the canonical form.
    #[test]
    fn canonical_json_ignores_key_order_spacing_and_escapes(
        value in json_value(),
        seeds in (any::<u64>(), any::<u64>()),
    ) {
        let first = render(&value, &mut StdRng::seed_from_u64(seeds.0));
        let second = render(&value, &mut StdRng::seed_from_u64(seeds.1));
        prop_assert_eq!(&parse(&first), &value, "text: {}", first);
        let canonical = canonical_json(&value);
        prop_assert_eq!(canonical_json(&parse(&first)), canonical.clone(), "text: {}", first);
        prop_assert_eq!(canonical_json(&parse(&second)), canonical, "text: {}", second);
    }

    /// The canonical form is compact JSON with keys sorted by their UTF-8 bytes: with a sorted
    /// serde_json `Map`, exactly serde_json's own compact output of the value it denotes.
    #[test]
    fn canonical_json_is_compact_and_sorted(value in json_value()) {
        if map_is_sorted() {
            let canonical = canonical_json(&value);
            prop_assert_eq!(parse(&canonical).to_string(), canonical);
        }
    }

    /// Texts of one value hash the same, whatever their key order, spacing and escapes.
    #[test]
    fn request_hash_is_equal_for_every_spelling_of_a_value(
        kind in valid_kind(),
        data in json_object_without_nul(),
        seeds in (any::<u64>(), any::<u64>()),
    ) {
        let body = serde_json::json!({"kind": kind, "data": data});
        let first = parse(&render(&body, &mut StdRng::seed_from_u64(seeds.0)));
        let second = parse(&render(&body, &mut StdRng::seed_from_u64(seeds.1)));
        prop_assert_eq!(
            request_hash("POST", ENTRIES_ROUTE, &first),
            request_hash("POST", ENTRIES_ROUTE, &second)
        );
    }

    /// Different values hash differently: two arbitrary values, and a value and a small edit of
    /// it (one member added, or one member's value replaced).
    #[test]
    fn request_hash_differs_for_different_values(
        a in json_value(),
        b in json_value(),
        name in json_string(),
        replacement in json_value(),
    ) {
        if canonical_json(&a) != canonical_json(&b) {
            prop_assert_ne!(
                request_hash("POST", ENTRIES_ROUTE, &a),
                request_hash("POST", ENTRIES_ROUTE, &b)
            );
        }
        let mut edited = serde_json::json!({"kind": "k", "data": {}});
        let original = edited.clone();
        edited["data"][name.as_str()] = replacement;
        prop_assert_ne!(
            request_hash("POST", ENTRIES_ROUTE, &original),
            request_hash("POST", ENTRIES_ROUTE, &edited)
        );
        // One member of an object replaced by a value it did not have, or added.
        if let Value::Object(map) = &a {
            let mut changed = map.clone();
            let different = if map.get(&name) == Some(&Value::Null) {
                Value::Bool(true)
            } else {
                Value::Null
            };
            changed.insert(name.clone(), different);
            prop_assert_ne!(
                request_hash("POST", ENTRIES_ROUTE, &a),
                request_hash("POST", ENTRIES_ROUTE, &Value::Object(changed))
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// decode_new_entry
// ---------------------------------------------------------------------------------------------

/// Fragments of JSON and of near-JSON, so that generated garbage reaches past the first byte.
fn json_token() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        " ",
        "\"kind\"",
        "\"data\"",
        "\"extra\"",
        "\"a\"",
        "\"invoice.paid\"",
        "\"A\"",
        "1",
        "-0",
        "1e999",
        "-1e-999",
        "1.5",
        "18446744073709551616",
        "null",
        "true",
        "false",
        "\"\\u0000\"",
        "\"\\ud800\"",
        "\"\\udc00\\ud800\"",
        "\"\\\"",
        "\"\u{e9}\"",
        "\u{0}",
        "\u{feff}",
        "\"\\x\"",
        "\"",
        "[[[[[[[[",
        "]]]]]]]]",
        "{\"a\":",
    ])
}

proptest! {
    #![proptest_config(config())]

    /// Arbitrary bytes never make the decoder panic, and whatever it accepts is a valid entry.
    #[test]
    fn decoding_any_bytes_never_panics(
        body in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..2048),
            prop::collection::vec(json_token(), 0..64).prop_map(|t| t.concat().into_bytes()),
        ]
    ) {
        if let Ok((entry, hash)) = decode_new_entry(&body) {
            prop_assert!(retrysafe::entry::is_valid_kind(&entry.kind));
            let value: Value = serde_json::from_slice(&body).expect("accepted bodies are JSON");
            prop_assert_eq!(hash, request_hash("POST", ENTRIES_ROUTE, &value));
        }
    }

    /// Every valid body is accepted, in any spelling, with its kind, its data, and the hash of
    /// its value.
    #[test]
    fn every_valid_body_is_accepted(
        kind in valid_kind(),
        data in json_object_without_nul(),
        seed in any::<u64>(),
    ) {
        let body = serde_json::json!({"kind": kind, "data": data});
        let text = render(&body, &mut StdRng::seed_from_u64(seed));
        let decoded = decode_new_entry(text.as_bytes());
        let (entry, hash) = match decoded {
            Ok(decoded) => decoded,
            Err(error) => return Err(TestCaseError::fail(format!("refused {text}: {error:?}"))),
        };
        prop_assert_eq!(&entry.kind, &kind);
        prop_assert_eq!(&Value::Object(entry.data), &body["data"]);
        prop_assert_eq!(hash, request_hash("POST", ENTRIES_ROUTE, &body));
    }

    /// A valid body with one defect is refused as invalid (not malformed, not accepted): an
    /// unknown field, a bad kind, or U+0000 somewhere in the data.
    #[test]
    fn a_body_with_one_defect_is_refused_as_invalid(
        kind in valid_kind(),
        data in json_object_without_nul(),
        defect in 0..4u8,
        extra in "[a-z_]{1,8}",
        bad_kind in prop_oneof!["[A-Z !@#]{1,8}", Just(String::new()), "[a-z]{65,80}"],
        seed in any::<u64>(),
    ) {
        let mut body = serde_json::json!({"kind": kind, "data": data});
        match defect {
            0 => {
                prop_assume!(extra != "kind" && extra != "data");
                body[extra.as_str()] = Value::Bool(true);
            }
            1 => body["kind"] = Value::String(bad_kind),
            2 => body["data"]["nul"] = Value::String("a\0b".into()),
            _ => body["data"]["nested"] = serde_json::json!([{"k\0": 1}]),
        }
        let text = render(&body, &mut StdRng::seed_from_u64(seed));
        prop_assert!(
            matches!(decode_new_entry(text.as_bytes()), Err(DecodeError::Invalid(_))),
            "not refused as invalid: {}", text
        );
    }
}

/// Equal JSON values, numbers compared by the value they denote rather than their spelling.
fn same_values(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_values(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(name, x)| y.get(name).is_some_and(|y| same_values(x, y)))
        }
        _ => a == b,
    }
}

// ---------------------------------------------------------------------------------------------
// config::redact_url
// ---------------------------------------------------------------------------------------------

/// A password as an operator may type it: an upper-case letter, then upper-case letters and the
/// characters that URLs give a meaning to (`? @ # / : %` and friends), spaces and quotes. The
/// other parts of the generated strings are lower case, so an upper-case letter in the shown
/// text is a piece of a password.
fn password() -> impl Strategy<Value = String> {
    "[A-Z][A-Z?@#/:%&=+!$;, '\"\\\\\u{e9}]{0,24}"
}

fn user() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_]{0,11}"
}

fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9-]{0,10}(\\.[a-z]{2,5}){0,2}",
        (0u8..=255, 0u8..=255, 1u8..=254).prop_map(|(b, c, d)| format!("10.{b}.{c}.{d}")),
    ]
}

fn database() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_]{0,10}"
}

/// Every byte but the unreserved ones percent-encoded, as a careful operator writes a password.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The checks every redacted text passes: no password, spelled as given or encoded, and no
/// upper-case letter (a piece of one).
fn shows_no_password(shown: &str, passwords: &[&str]) -> Result<(), TestCaseError> {
    for password in passwords {
        prop_assert!(!shown.contains(password), "{password:?} in {shown:?}");
        prop_assert!(
            !shown.contains(&percent_encoded(password)),
            "{password:?} (encoded) in {shown:?}"
        );
    }
    prop_assert!(
        !shown
            .chars()
            .any(|c| c.is_ascii_uppercase() || c == '\u{e9}'),
        "a piece of a password in {shown:?}"
    );
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// A URL written correctly (the password percent-encoded, perhaps another one in the query)
    /// is shown with its user and host, and without its passwords.
    #[test]
    fn a_redacted_url_shows_user_and_host_and_no_password(
        scheme in prop::sample::select(vec!["postgres", "postgresql", "amqp", "amqps"]),
        user in user(),
        password in password(),
        query_password in password(),
        host in host(),
        port in prop::option::of(1u16..=65535),
        database in database(),
        with_query in any::<bool>(),
    ) {
        let port = port.map(|port| format!(":{port}")).unwrap_or_default();
        let mut url = format!("{scheme}://{user}:{}@{host}{port}/{database}", percent_encoded(&password));
        if with_query && scheme.starts_with("postgres") {
            url.push_str(&format!("?password={}&application_name=x", percent_encoded(&query_password)));
        }
        let shown = retrysafe::config::redact_url(&url);
        shows_no_password(&shown, &[&password, &query_password])?;
        prop_assert!(shown.contains(&format!("{user}:***@{host}")), "{url:?} shown as {shown:?}");
    }

    /// A PostgreSQL URL with the password typed unencoded: the daemon reads the user info
    /// up to the first `@`, the redaction reads it so, and shows no piece of the password (and,
    /// when it shows anything, the user and the host).
    #[test]
    fn an_unencoded_password_never_shows(
        scheme in prop::sample::select(vec!["postgres", "postgresql", "amqp"]),
        user in user(),
        password in password(),
        host in host(),
        database in database(),
    ) {
        let url = format!("{scheme}://{user}:{password}@{host}/{database}");
        let shown = retrysafe::config::redact_url(&url);
        shows_no_password(&shown, &[&password])?;
        if shown != retrysafe::config::UNPARSABLE {
            prop_assert!(shown.contains(&user) && shown.contains(&host), "{url:?} shown as {shown:?}");
        }
    }

    /// libpq's `key=value` form, the password quoted and escaped as libpq wants.
    #[test]
    fn redacted_key_values_show_user_and_host_and_no_password(
        user in user(),
        password in password(),
        host in host(),
        port in 1u16..=65535,
        database in database(),
    ) {
        let quoted = password.replace('\\', "\\\\").replace('\'', "\\'");
        let text = format!("host={host} port={port} user={user} password='{quoted}' dbname={database}");
        let shown = retrysafe::config::redact_url(&text);
        shows_no_password(&shown, &[&password])?;
        prop_assert!(
            shown.contains(&format!("host={host}")) && shown.contains(&format!("user={user}")),
            "{text:?} shown as {shown:?}"
        );
    }
}
