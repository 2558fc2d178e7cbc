//! The events a write emits, as CloudEvents 1.0 structured-mode JSON.

use serde_json::{json, Value};
use uuid::Uuid;

use crate::entry::EntryView;

pub const ENTRY_CREATED: &str = "entry.created";
pub const AUDIT_ENTRY_CREATED: &str = "audit.entry.created";

/// CloudEvents `source` of every event this daemon emits.
pub const EVENT_SOURCE: &str = "/retrysafe";

/// One outbox row about to be written.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub event_id: Uuid,
    pub event_type: &'static str,
    /// The CloudEvent, published as the message body.
    pub payload: Value,
}

impl NewEvent {
    /// `'<entry id>/<event type>'`: unique, so an entry can never get an event type twice.
    pub fn event_key(&self, entry_id: Uuid) -> String {
        format!("{entry_id}/{}", self.event_type)
    }
}

/// What the audit event records about the request that made an entry.
pub struct AuditFacts<'a> {
    pub client_id: &'a str,
    pub idempotency_key: &'a str,
    pub request_hash_hex: String,
    pub remote_addr: Option<&'a str>,
}

/// The events one write emits: `entry.created`, and `audit.entry.created` when asked for.
pub fn events_for(entry: &EntryView, audit: Option<AuditFacts<'_>>) -> Vec<NewEvent> {
    let mut events = vec![cloud_event(ENTRY_CREATED, entry, json!(entry))];
    if let Some(facts) = audit {
        let data = json!({
            "client_id": facts.client_id,
            "idempotency_key": facts.idempotency_key,
            "request_hash": facts.request_hash_hex,
            "remote_addr": facts.remote_addr,
            "entry_id": entry.id,
        });
        events.push(cloud_event(AUDIT_ENTRY_CREATED, entry, data));
    }
    events
}

fn cloud_event(event_type: &'static str, entry: &EntryView, data: Value) -> NewEvent {
    let event_id = Uuid::now_v7();
    let payload = json!({
        "specversion": "1.0",
        "id": event_id,
        "source": EVENT_SOURCE,
        "type": event_type,
        "time": entry.created_at,
        "subject": entry.id,
        "datacontenttype": "application/json",
        "data": data,
    });
    NewEvent {
        event_id,
        event_type,
        payload,
    }
}
