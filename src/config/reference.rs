//! docs/configuration.md's reference of keys, rendered from the declarations
//! ([`Settings::SECTIONS`]): each section's keys with their type, default, range and
//! description.

use std::time::Duration;

use super::keys::{Bound, Key};
use super::Settings;

/// What a value of the declared type is, in the reader's words.
fn type_in_words(ty: &str) -> &'static str {
    let ty: String = ty.split_whitespace().collect();
    let ty = ty
        .strip_prefix("Option<")
        .and_then(|inner| inner.strip_suffix('>'))
        .unwrap_or(&ty);
    match ty {
        "SocketAddr" => "socket address `IP:port`",
        "usize" | "u32" | "u16" | "i32" => "integer",
        "f64" => "number",
        "bool" => "boolean",
        "Duration" => "duration",
        "PathBuf" => "path",
        "String" | "ConnectionString" => "string",
        "UrlList" => "string, or array of strings",
        "LogFormat" => "`\"text\"` or `\"json\"`",
        "Vec<String>" => "array of strings",
        "Vec<ClientSettings>" | "Vec<AdminPrincipal>" => "array of tables",
        other => panic!("no words for the type {other}: add them here"),
    }
}

/// The declared default as the configuration file would write it: `none` for an absent
/// value, `empty` for an empty list.
fn default_of(key: &Key) -> String {
    let (section, name) = key
        .name
        .split_once('.')
        .expect("a key's name is section.key");
    let defaults = serde_json::to_value(Settings::default()).expect("the settings serialize");
    match &defaults[section][name] {
        serde_json::Value::Null => "none".into(),
        serde_json::Value::Array(items) if items.is_empty() => "empty".into(),
        value => format!("`{value}`"),
    }
}

/// `n` with a comma between thousands.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (at, digit) in digits.chars().enumerate() {
        if at > 0 && (digits.len() - at).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A count of bytes in the largest binary unit that holds it whole.
fn bytes(n: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{} {unit}", n >> shift);
        }
    }
    grouped(n)
}

/// A bound on a duration, in the largest unit that holds it whole.
fn duration(bound: Duration) -> String {
    let seconds = bound.as_secs();
    for (unit_seconds, unit) in [(86_400, "day"), (3600, "hour"), (60, "minute")] {
        if seconds >= unit_seconds && seconds.is_multiple_of(unit_seconds) {
            let n = seconds / unit_seconds;
            return format!("{n} {unit}{}", if n == 1 { "" } else { "s" });
        }
    }
    format!("{seconds} s")
}

/// What values the key takes beyond its type.
fn range_of(key: &Key) -> String {
    match key.bound {
        Bound::Any => String::new(),
        Bound::Count(min, max) if key.name.ends_with("_bytes") => {
            format!("{} to {}", bytes(min), bytes(max))
        }
        Bound::Count(min, max) => format!("{} to {}", grouped(min), grouped(max)),
        Bound::Duration(max) => format!("at most {}", duration(max)),
    }
}

/// The reference: a heading, the section's description and a table of its keys, per section.
pub fn render() -> String {
    let mut out = String::new();
    for section in Settings::SECTIONS {
        out.push_str(&format!(
            "### `[{}]`\n\n{}\n\n",
            section.name,
            section.doc.trim()
        ));
        out.push_str("| key | type | default | range | meaning |\n|---|---|---|---|---|\n");
        for key in section.keys {
            let (_, name) = key
                .name
                .split_once('.')
                .expect("a key's name is section.key");
            assert!(
                !key.doc.contains('|'),
                "{}: a `|` would end its cell",
                key.name
            );
            out.push_str(&format!(
                "| `{name}` | {} | {} | {} | {} |\n",
                type_in_words(key.ty),
                default_of(key),
                range_of(key),
                key.doc.trim()
            ));
        }
        out.push('\n');
    }
    out
}

/// docs/configuration.md's reference is what the declarations render now.
#[test]
fn the_configuration_reference_is_rendered_from_the_declarations() {
    crate::reference_docs::check_or_bless(
        "docs/configuration.md",
        "configuration reference",
        "the key declarations in src/config/sections.rs",
        "config::reference::the_configuration_reference_is_rendered_from_the_declarations",
        &render(),
    );
}
