//! The consumer-side inbox: exactly-once effects on top of at-least-once delivery.
//!
//! retrysafe publishes every event at least once, each with a stable `message_id` (the event
//! id). A consumer makes its effects happen once by recording the ids it has processed in the
//! same transaction as the effect:
//!
//! 1. [`Inbox::begin`] opens a transaction and inserts `(consumer, event_id)` into
//!    `processed_events` with `ON CONFLICT DO NOTHING`;
//! 2. if the row was new it returns the transaction: apply the effect in it and commit;
//!    if not (a redelivery), it returns `None` and there is nothing to do;
//! 3. then, and only then, acknowledge the message to the broker.
//!
//! A crash before the commit leaves no row, so the redelivered message is processed afresh; a
//! crash between the commit and the ack leaves the row, so the redelivery is skipped.
//!
//! The events of writes with an ordering key come first in sequence order (docs/ordering.md);
//! [`ordering_of`] reads a delivery's key and sequence, so that a consumer that keeps the last
//! sequence it applied per key can tell a late copy from news.
//!
//! ```no_run
//! # async fn example(client: &mut tokio_postgres::Client, event_id: uuid::Uuid) -> Result<(), tokio_postgres::Error> {
//! let inbox = retrysafe::inbox::Inbox::new("invoice-mailer");
//! if let Some(transaction) = inbox.begin(client, event_id).await? {
//!     transaction.execute("UPDATE totals SET n = n + 1", &[]).await?;
//!     transaction.commit().await?;
//! }
//! // now ack the delivery
//! # Ok(())
//! # }
//! ```

use lapin::types::AMQPValue;
use lapin::BasicProperties;
use tokio_postgres::{Client, Transaction};
use uuid::Uuid;

/// The trace context the write that made the event had (its `traceparent` and `tracestate`
/// headers): start the consumer's span as a child of it (or linked to it) to continue the
/// caller's trace. None for an event written before the daemon kept it.
pub fn trace_context_of(
    properties: &BasicProperties,
) -> Option<crate::trace_context::TraceContext> {
    let headers = properties.headers().as_ref()?.inner();
    let text = |name: &str| match headers.get(name)? {
        AMQPValue::LongString(value) => Some(value.to_string()),
        AMQPValue::ShortString(value) => Some(value.to_string()),
        _ => None,
    };
    Some(crate::trace_context::TraceContext {
        traceparent: crate::trace_context::parse_traceparent(&text("traceparent")?)?,
        tracestate: text("tracestate"),
    })
}

/// [`trace_context_of`] as an OpenTelemetry context holding the write's span as a remote
/// parent: give it to the consumer's span (`tracing_opentelemetry::OpenTelemetrySpanExt::
/// set_parent`, or `Tracer::start_with_context`) and the consumer's work is a child of the
/// write in the caller's trace. An empty context when the event carries none.
pub fn parent_context_of(properties: &BasicProperties) -> opentelemetry::Context {
    use opentelemetry::trace::TraceContextExt;
    trace_context_of(properties)
        .as_ref()
        .and_then(crate::otlp::span_context_of)
        .map(|span| opentelemetry::Context::new().with_remote_span_context(span))
        .unwrap_or_default()
}

/// Where an event stands among the events of its ordering key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The ordering key the write was made with (per client: see the `client-id` header).
    pub ordering_key: String,
    /// The write's number among the client's writes with that key: 1, 2, 3, ...
    pub sequence: i64,
}

/// The ordering key and sequence of a delivery (its `ordering-key` and `sequence` headers);
/// None for an event of a write without an ordering key.
pub fn ordering_of(properties: &BasicProperties) -> Option<Position> {
    let headers = properties.headers().as_ref()?.inner();
    let text = |name: &str| match headers.get(name)? {
        AMQPValue::LongString(value) => Some(value.to_string()),
        AMQPValue::ShortString(value) => Some(value.to_string()),
        _ => None,
    };
    Some(Position {
        ordering_key: text("ordering-key")?,
        sequence: text("sequence")?.parse().ok()?,
    })
}

/// Claims the event for this consumer; a row that exists already means "processed before".
const CLAIM_EVENT: &str =
    "INSERT INTO processed_events (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING";

/// One consumer's record of the events it has processed, in the `processed_events` table.
#[derive(Debug, Clone)]
pub struct Inbox {
    consumer: String,
}

impl Inbox {
    /// `consumer` names the consuming application; each consumer processes each event once.
    pub fn new(consumer: impl Into<String>) -> Self {
        Self {
            consumer: consumer.into(),
        }
    }

    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Starts processing `event_id`: the transaction to apply its effect in, or `None` if this
    /// consumer has processed it already. The caller commits, then acks the message.
    pub async fn begin<'a>(
        &self,
        client: &'a mut Client,
        event_id: Uuid,
    ) -> Result<Option<Transaction<'a>>, tokio_postgres::Error> {
        let transaction = client.transaction().await?;
        let inserted = transaction
            .execute(CLAIM_EVENT, &[&self.consumer, &event_id])
            .await?;
        if inserted == 0 {
            transaction.rollback().await?;
            return Ok(None);
        }
        Ok(Some(transaction))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::FieldTable;

    #[test]
    fn a_delivery_tells_its_ordering_key_and_sequence() {
        let event = crate::outbox::store::PendingEvent {
            id: 1,
            event_id: Uuid::now_v7(),
            event_type: "entry.created".into(),
            client_id: "billing".into(),
            idempotency_key: "k".into(),
            payload: "{}".into(),
            attempts: 0,
            nacks: 0,
            created_at: chrono::Utc::now(),
            ordering_key: Some("invoice-42".into()),
            sequence: Some(7),
            traceparent: None,
            tracestate: None,
        };
        let properties = crate::outbox::publish::message_properties(&event);
        assert!(!opentelemetry::trace::TraceContextExt::has_active_span(
            &parent_context_of(&properties)
        ));
        let traced = crate::outbox::store::PendingEvent {
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            ..event.clone()
        };
        let parent = parent_context_of(&crate::outbox::publish::message_properties(&traced));
        let span = opentelemetry::trace::TraceContextExt::span(&parent);
        assert_eq!(
            span.span_context().trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(
            span.span_context().span_id().to_string(),
            "00f067aa0ba902b7"
        );
        assert!(span.span_context().is_remote());
        assert_eq!(
            ordering_of(&properties),
            Some(Position {
                ordering_key: "invoice-42".into(),
                sequence: 7
            })
        );
        let unordered = crate::outbox::store::PendingEvent {
            ordering_key: None,
            sequence: None,
            ..event
        };
        assert_eq!(
            ordering_of(&crate::outbox::publish::message_properties(&unordered)),
            None
        );
        assert_eq!(
            ordering_of(&BasicProperties::default().with_headers(FieldTable::default())),
            None
        );
    }
}
