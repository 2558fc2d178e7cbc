//! The spans of a relay's batch and its publishes, when spans are exported ([`crate::otlp`]).

use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _,
};
use opentelemetry::{Context, KeyValue};

use crate::otlp;
use crate::outbox::publish::PublishResult;
use crate::outbox::store::PendingEvent;

/// The spans of a relay's batch: the batch (INTERNAL, a trace of its own), linking the writes
/// of its events, and a PRODUCER span per publish (OpenTelemetry's messaging conventions for
/// RabbitMQ), child of the batch and linked to its write's context. Built only while exporting,
/// and only for a sampled batch.
pub struct PublishSpans {
    batch: opentelemetry_sdk::trace::Span,
    publishes: Vec<opentelemetry_sdk::trace::Span>,
}

impl PublishSpans {
    pub fn start(exchange: &str, events: &[PendingEvent]) -> Option<Self> {
        let tracer = otlp::tracer()?;
        let writes: Vec<Option<SpanContext>> = events
            .iter()
            .map(|event| {
                otlp::span_context_from(event.traceparent.as_deref()?, event.tracestate.as_deref())
            })
            .collect();
        let batch = tracer
            .span_builder("relay.batch")
            .with_kind(SpanKind::Internal)
            .with_attributes([KeyValue::new("retrysafe.batch.events", events.len() as i64)])
            .with_links(
                writes
                    .iter()
                    .flatten()
                    .map(|context| Link::with_context(context.clone()))
                    .collect(),
            )
            .start_with_context(tracer, &Context::new());
        if !batch.span_context().is_sampled() {
            return None;
        }
        let parent = Context::new().with_remote_span_context(batch.span_context().clone());
        let name = format!("publish {exchange}");
        let publishes = events
            .iter()
            .zip(writes)
            .map(|(event, write)| {
                tracer
                    .span_builder(name.clone())
                    .with_kind(SpanKind::Producer)
                    .with_attributes([
                        KeyValue::new("messaging.system", "rabbitmq"),
                        KeyValue::new("messaging.operation.name", "publish"),
                        KeyValue::new("messaging.operation.type", "send"),
                        KeyValue::new("messaging.destination.name", exchange.to_owned()),
                        KeyValue::new(
                            "messaging.rabbitmq.destination.routing_key",
                            event.event_type.clone(),
                        ),
                        KeyValue::new("messaging.message.id", event.event_id.to_string()),
                    ])
                    .with_links(write.map(Link::with_context).into_iter().collect())
                    .start_with_context(tracer, &parent)
            })
            .collect();
        Some(Self { batch, publishes })
    }

    /// Ends each publish's span with its outcome (an error status and `error.type` for a
    /// failure), then the batch's.
    pub fn finish(self, results: &[PublishResult]) {
        for (mut span, result) in self.publishes.into_iter().zip(results) {
            if let PublishResult::Failed { kind, error } = result {
                span.set_attribute(KeyValue::new("error.type", kind.as_str()));
                span.set_status(Status::error(error.clone()));
            }
            span.end();
        }
        let mut batch = self.batch;
        batch.end();
    }
}
