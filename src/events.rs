//! The events a write emits, as CloudEvents 1.0 structured-mode JSON.
//!
//! Payloads are written as canonical JSON text (keys sorted, no white space) straight from the
//! entry's own canonical text, so that the hot path builds no intermediate JSON values.

use serde_json::json;
use uuid::Uuid;

use crate::idempotency::canonical::write_string;
use crate::idempotency::canonical_json;
use crate::trace_context::TraceContext;

pub const ENTRY_CREATED: &str = "entry.created";
pub const AUDIT_ENTRY_CREATED: &str = "audit.entry.created";

/// CloudEvents `source` of every event this daemon emits.
pub const EVENT_SOURCE: &str = "/retrysafe";

/// One outbox row about to be written.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub event_id: Uuid,
    pub event_type: &'static str,
    /// The CloudEvent as JSON text: the message body.
    pub payload: String,
}

impl NewEvent {
    /// `'<entry id>/<event type>'`: unique, so an entry can never get an event type twice.
    pub fn event_key(&self, entry_id: Uuid) -> String {
        debug_assert!(EVENT_TYPES.contains(&self.event_type));
        format!("{entry_id}/{}", self.event_type)
    }
}

/// Every event type a write can emit.
pub const EVENT_TYPES: [&str; 2] = [ENTRY_CREATED, AUDIT_ENTRY_CREATED];

/// The event keys the events of `entry_id` can have, one per [`EVENT_TYPES`].
pub fn event_keys_of(entry_id: Uuid) -> Vec<String> {
    EVENT_TYPES
        .iter()
        .map(|event_type| format!("{entry_id}/{event_type}"))
        .collect()
}

/// The entry an event is about.
pub struct EventSubject<'a> {
    pub entry_id: Uuid,
    /// The write's trace context: the CloudEvents distributed-tracing attributes.
    pub trace: Option<&'a TraceContext>,
    /// RFC 3339, as the API shows it: the event's `time`.
    pub created_at: &'a str,
    /// The entry as the API shows it, in canonical JSON: the data of `entry.created`.
    pub entry_json: &'a str,
}

/// What the audit event records about the request that made an entry.
pub struct AuditFacts<'a> {
    pub client_id: &'a str,
    pub idempotency_key: &'a str,
    pub request_hash_hex: String,
    pub remote_addr: Option<&'a str>,
}

/// The events one write emits: `entry.created`, and `audit.entry.created` when asked for.
pub fn events_for(subject: &EventSubject<'_>, audit: Option<AuditFacts<'_>>) -> Vec<NewEvent> {
    let mut events = Vec::with_capacity(if audit.is_some() { 2 } else { 1 });
    events.push(cloud_event(ENTRY_CREATED, subject, subject.entry_json));
    if let Some(facts) = audit {
        let data = canonical_json(&json!({
            "client_id": facts.client_id,
            "idempotency_key": facts.idempotency_key,
            "request_hash": facts.request_hash_hex,
            "remote_addr": facts.remote_addr,
            "entry_id": subject.entry_id,
        }));
        events.push(cloud_event(AUDIT_ENTRY_CREATED, subject, &data));
    }
    events
}

/// The CloudEvent envelope, members in canonical (sorted) order, around `data_json`.
fn cloud_event(event_type: &'static str, subject: &EventSubject<'_>, data_json: &str) -> NewEvent {
    let event_id = Uuid::now_v7();
    let mut payload = String::with_capacity(data_json.len() + 256);
    payload.push_str("{\"data\":");
    payload.push_str(data_json);
    payload.push_str(",\"datacontenttype\":\"application/json\",\"id\":\"");
    payload.push_str(&event_id.to_string());
    payload.push_str("\",\"source\":");
    write_string(EVENT_SOURCE, &mut payload);
    payload.push_str(",\"specversion\":\"1.0\",\"subject\":\"");
    payload.push_str(&subject.entry_id.to_string());
    payload.push_str("\",\"time\":");
    write_string(subject.created_at, &mut payload);
    if let Some(trace) = subject.trace {
        payload.push_str(",\"traceparent\":");
        write_string(&trace.traceparent, &mut payload);
        if let Some(state) = &trace.tracestate {
            payload.push_str(",\"tracestate\":");
            write_string(state, &mut payload);
        }
    }
    payload.push_str(",\"type\":");
    write_string(event_type, &mut payload);
    payload.push('}');
    NewEvent {
        event_id,
        event_type,
        payload,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn payloads_are_canonical_cloud_events() {
        let entry_id = Uuid::now_v7();
        let entry_json = format!(
            r#"{{"created_at":"2026-12-02T11:00:00.000000Z","data":{{"a":"x\"y"}},"id":"{entry_id}","kind":"k"}}"#
        );
        let trace = TraceContext {
            traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            tracestate: Some("congo=t61rcWkgMzE".into()),
        };
        let subject = EventSubject {
            entry_id,
            trace: Some(&trace),
            created_at: "2026-12-02T11:00:00.000000Z",
            entry_json: &entry_json,
        };
        let events = events_for(
            &subject,
            Some(AuditFacts {
                client_id: "c",
                idempotency_key: "k\"1",
                request_hash_hex: "00".repeat(32),
                remote_addr: None,
            }),
        );
        assert_eq!(events.len(), 2);
        for event in &events {
            let parsed: Value = serde_json::from_str(&event.payload).expect("valid JSON");
            assert_eq!(canonical_json(&parsed), event.payload, "canonical text");
            assert_eq!(parsed["specversion"], "1.0");
            assert_eq!(parsed["id"], event.event_id.to_string());
            assert_eq!(parsed["type"], event.event_type);
            assert_eq!(parsed["subject"], entry_id.to_string());
            assert_eq!(parsed["time"], "2026-12-02T11:00:00.000000Z");
            assert_eq!(parsed["traceparent"], trace.traceparent);
            assert_eq!(parsed["tracestate"], "congo=t61rcWkgMzE");
        }
        let created: Value = serde_json::from_str(&events[0].payload).unwrap();
        assert_eq!(
            created["data"],
            serde_json::from_str::<Value>(&entry_json).unwrap()
        );
        let audit: Value = serde_json::from_str(&events[1].payload).unwrap();
        assert_eq!(audit["data"]["idempotency_key"], "k\"1");
    }
}
