//! Feeds arbitrary bytes to the request-decoding path: the `Idempotency-Key` header parser and
//! the `POST /v1/entries` body decoder. Neither may panic; what they accept must be valid.
#![no_main]

use libfuzzer_sys::fuzz_target;
use retrysafe::entry::{decode_new_entry, is_valid_kind, ENTRIES_ROUTE};
use retrysafe::idempotency::{canonical_json, request_hash, IdempotencyKey};

fuzz_target!(|data: &[u8]| {
    if let Ok(key) = IdempotencyKey::parse_header(data) {
        let bytes = key.as_str().as_bytes();
        assert!(
            (1..=255).contains(&bytes.len()),
            "accepted a key of {} bytes",
            bytes.len()
        );
        assert!(
            bytes.iter().all(|b| (0x21..=0x7e).contains(b)),
            "accepted a key with a byte outside visible ASCII: {bytes:?}"
        );
    }

    if let Ok((entry, hash)) = decode_new_entry(data) {
        assert!(is_valid_kind(&entry.kind), "accepted kind {:?}", entry.kind);
        let body: serde_json::Value =
            serde_json::from_slice(data).expect("an accepted body is JSON");
        assert_eq!(hash, request_hash("POST", ENTRIES_ROUTE, &body));
        // The canonical text of what was accepted is itself accepted. (Its hash is not
        // compared: serde_json without `float_roundtrip` re-reads some floats one ULP off, a
        // known bug that tests/properties.rs shows; asserting it would stop every run at once.)
        let canonical = canonical_json(&body);
        assert!(
            decode_new_entry(canonical.as_bytes()).is_ok(),
            "the canonical form {canonical} of an accepted body is refused"
        );
    }
});
