//! W3C Trace Context (`traceparent`, `tracestate`) as a write carries it to its events: read
//! from the request (a malformed value is ignored, never refused), stored with each event row in
//! the write's transaction, and published with the event (AMQP headers and CloudEvents
//! distributed-tracing attributes of the same names), so that a consumer continues the trace.

use actix_web::HttpRequest;
use rand::Rng;

/// The trace context a write's events carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `00-<trace id>-<parent id>-<flags>`, lowercase hex.
    pub traceparent: String,
    /// The vendors' list, passed on as it came (at most [`MAX_TRACESTATE`] bytes).
    pub tracestate: Option<String>,
}

/// Longest `tracestate` kept: W3C asks that at least 512 bytes be propagated; a longer one is
/// dropped whole rather than cut mid-member.
pub const MAX_TRACESTATE: usize = 512;

impl TraceContext {
    /// The caller's context from the request's headers; a new trace when it sent none or a
    /// malformed one.
    pub fn of_request(request: &HttpRequest) -> Self {
        let headers = request.headers();
        let traceparent = headers
            .get("traceparent")
            .and_then(|value| value.to_str().ok())
            .and_then(parse_traceparent);
        let Some(traceparent) = traceparent else {
            return Self::new_trace();
        };
        // Several tracestate headers are one list (RFC 9110 field combination).
        let tracestate = headers
            .get_all("tracestate")
            .map(|value| value.to_str().ok().map(str::trim))
            .collect::<Option<Vec<&str>>>()
            .map(|parts| parts.join(","))
            .filter(|state| is_valid_tracestate(state));
        Self {
            traceparent,
            tracestate,
        }
    }

    /// A fresh trace: random trace and span ids, sampled.
    pub fn new_trace() -> Self {
        let mut rng = rand::thread_rng();
        let trace_id: u128 = rng.gen_range(1..=u128::MAX);
        let span_id: u64 = rng.gen_range(1..=u64::MAX);
        Self {
            traceparent: format!("00-{trace_id:032x}-{span_id:016x}-01"),
            tracestate: None,
        }
    }

    /// The trace id: 32 hex digits.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// Bytes it adds to a pending write.
    pub fn size(&self) -> usize {
        self.traceparent.len() + self.tracestate.as_ref().map_or(0, String::len)
    }
}

/// A valid `traceparent`, normalized to version 00 (a later version's first four fields, as
/// the specification asks of a version-00 reader); None when malformed.
pub fn parse_traceparent(value: &str) -> Option<String> {
    let value = value.trim();
    let bytes = value.as_bytes();
    if bytes.len() < 55 {
        return None;
    }
    let hex = |range: std::ops::Range<usize>| {
        bytes[range]
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    };
    let dashes = bytes[2] == b'-' && bytes[35] == b'-' && bytes[52] == b'-';
    if !dashes || !hex(0..2) || !hex(3..35) || !hex(36..52) || !hex(53..55) {
        return None;
    }
    let version = &value[0..2];
    if version == "ff" || (version == "00" && bytes.len() != 55) {
        return None;
    }
    if version != "00" && bytes.len() > 55 && bytes[55] != b'-' {
        return None;
    }
    let (trace_id, parent_id) = (&value[3..35], &value[36..52]);
    if trace_id.bytes().all(|b| b == b'0') || parent_id.bytes().all(|b| b == b'0') {
        return None;
    }
    Some(format!("00-{trace_id}-{parent_id}-{}", &value[53..55]))
}

/// A `tracestate` that can be passed on: printable ASCII, within [`MAX_TRACESTATE`], at most
/// 32 members, each `key=value`.
pub fn is_valid_tracestate(value: &str) -> bool {
    if value.is_empty() || value.len() > MAX_TRACESTATE {
        return false;
    }
    if !value.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return false;
    }
    let members: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|member| !member.is_empty())
        .collect();
    !members.is_empty()
        && members.len() <= 32
        && members.iter().all(|member| {
            member
                .split_once('=')
                .is_some_and(|(key, value)| !key.is_empty() && !value.is_empty())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_is_kept_and_a_malformed_one_refused() {
        let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(parse_traceparent(valid).as_deref(), Some(valid));
        assert_eq!(
            parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future")
                .as_deref(),
            Some(valid),
            "a later version is read as 00"
        );
        for bad in [
            "",
            "garbage",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
    }

    #[test]
    fn tracestate_is_passed_on_only_when_well_formed_and_small() {
        assert!(is_valid_tracestate(
            "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
        ));
        assert!(!is_valid_tracestate("no-equals"));
        assert!(!is_valid_tracestate(&format!("k={}", "v".repeat(600))));
        assert!(!is_valid_tracestate("k=caf\u{e9}"));
    }

    #[test]
    fn a_new_trace_is_a_valid_traceparent() {
        let context = TraceContext::new_trace();
        assert_eq!(
            parse_traceparent(&context.traceparent).as_deref(),
            Some(context.traceparent.as_str())
        );
        assert_ne!(context.trace_id(), TraceContext::new_trace().trace_id());
    }
}
