//! Spans over OTLP/HTTP (protobuf), when `telemetry.otlp_endpoint` (or the standard
//! `OTEL_EXPORTER_OTLP_*ENDPOINT` variables) names a collector: the daemon's own `tracing` spans
//! (targets `retrysafe::*`) become OpenTelemetry spans through `tracing-opentelemetry`, and the
//! SDK's batch processor sends them from a thread of its own.
//!
//! Exporting never slows or fails a write. Spans wait in a queue bounded in spans (each span is
//! bounded by the SDK's span limits, so the queue is bounded in bytes too); a span that finds it
//! full is dropped at once, and so is a batch the collector did not take within
//! [`EXPORT_TIMEOUT`] (slow, down, or answering errors): both counted in
//! `retrysafe_trace_spans_dropped_total`. Without an endpoint nothing here runs: no layer, no
//! thread, and the write path does not build the spans it would export.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider, Span, SpanData,
    SpanExporter, SpanProcessor, Tracer,
};
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::config::TracesUrl;
use crate::metric;
use crate::trace_context::TraceContext;

/// Spans queued for export or being exported, at most; past it, new spans are dropped.
const QUEUE_SPANS: usize = 4096;
/// Spans per export request.
const BATCH_SPANS: usize = 512;
/// How long spans wait for the next export at most.
const EXPORT_DELAY: Duration = Duration::from_secs(1);
/// Bound on one export request, and on the flush at shutdown.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported: the write path builds the writer's, the relay's and the
/// publishes' spans only then.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The export, once started: shut it down at exit to send what is queued (bounded).
pub struct TraceExport {
    provider: SdkTracerProvider,
    pub endpoint: TracesUrl,
}

impl TraceExport {
    /// Starts exporting to `endpoint`, a share `sample_ratio` of new traces; returns the tracer
    /// for the layer.
    pub fn start(endpoint: &TracesUrl, sample_ratio: f64) -> Result<(Self, Tracer), String> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint.as_str())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|error| format!("telemetry.otlp_endpoint: {error}"))?;
        let in_flight = Arc::new(AtomicUsize::new(0));
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(QUEUE_SPANS)
            .with_max_export_batch_size(BATCH_SPANS)
            .with_scheduled_delay(EXPORT_DELAY)
            .build();
        let processor = Bounded {
            inner: BatchSpanProcessor::builder(Counting {
                inner: exporter,
                in_flight: Arc::clone(&in_flight),
            })
            .with_batch_config(batches)
            .build(),
            in_flight,
        };
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                sample_ratio,
            ))))
            .with_resource(resource())
            .build();
        let tracer = provider.tracer("retrysafe");
        let _ = TRACER.set(tracer.clone());
        EXPORTING.store(true, Ordering::Relaxed);
        Ok((
            Self {
                provider,
                endpoint: endpoint.clone(),
            },
            tracer,
        ))
    }

    /// Sends what is queued, within [`EXPORT_TIMEOUT`], and stops the export's thread.
    pub fn shutdown(&self) {
        EXPORTING.store(false, Ordering::Relaxed);
        if let Err(error) = self.provider.shutdown_with_timeout(EXPORT_TIMEOUT) {
            tracing::warn!(error = %error, "spans not all exported at shutdown");
        }
    }
}

/// `service.name = retrysafe` unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names
/// the service (the SDK reads both), and `service.version`.
fn resource() -> Resource {
    let named_by_environment = std::env::var_os("OTEL_SERVICE_NAME").is_some()
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|attributes| {
            attributes
                .split(',')
                .any(|pair| pair.trim_start().starts_with("service.name="))
        });
    let builder = Resource::builder();
    let builder = if named_by_environment {
        builder
    } else {
        builder.with_service_name("retrysafe")
    };
    builder
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Hands spans to the batch processor while fewer than [`QUEUE_SPANS`] are queued or being
/// exported, and drops (and counts) the rest: the batch processor would drop them too, but
/// without telling anyone.
#[derive(Debug)]
struct Bounded {
    inner: BatchSpanProcessor,
    in_flight: Arc<AtomicUsize>,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.in_flight.fetch_add(1, Ordering::Relaxed) >= QUEUE_SPANS {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            metrics::counter!(metric::TRACE_SPANS_DROPPED, "reason" => "queue_full").increment(1);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, counting the spans of a batch the collector did not take as dropped, and
/// every batch's spans out of [`Bounded`]'s count once it is done.
#[derive(Debug)]
struct Counting<E> {
    inner: E,
    in_flight: Arc<AtomicUsize>,
}

impl<E: SpanExporter> SpanExporter for Counting<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        self.in_flight.fetch_sub(spans, Ordering::Relaxed);
        if let Err(error) = &result {
            metrics::counter!(metric::TRACE_SPANS_DROPPED, "reason" => "export_failed")
                .increment(spans as u64);
            tracing::debug!(error = %error, spans, "spans not exported");
        }
        if result.is_ok() {
            metrics::counter!(metric::TRACE_SPANS_EXPORTED).increment(spans as u64);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The span context a write's stored `traceparent` names: what the writer's and the relay's
/// spans link to, and what a publish's span continues.
pub fn span_context_of(trace: &TraceContext) -> Option<SpanContext> {
    span_context_from(&trace.traceparent, trace.tracestate.as_deref())
}

/// [`span_context_of`] from the two headers' values, as an event row holds them.
pub fn span_context_from(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
    let trace_id = TraceId::from_hex(traceparent.get(3..35)?).ok()?;
    let span_id = SpanId::from_hex(traceparent.get(36..52)?).ok()?;
    let flags = u8::from_str_radix(traceparent.get(53..55)?, 16).ok()?;
    let state = tracestate
        .and_then(|state| state.parse::<TraceState>().ok())
        .unwrap_or_default();
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags),
        true,
        state,
    ))
}

/// The `traceparent` and `tracestate` of a span context.
pub fn trace_context_of(context: &SpanContext) -> TraceContext {
    let state = context.trace_state().header();
    TraceContext {
        traceparent: format!(
            "00-{}-{}-{:02x}",
            context.trace_id(),
            context.span_id(),
            context.trace_flags().to_u8()
        ),
        tracestate: (!state.is_empty()).then_some(state),
    }
}

/// The request's headers, as the W3C propagator reads them.
struct Headers<'a>(&'a actix_web::http::header::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|name| name.as_str()).collect()
    }
}

/// Makes the request's span a SERVER span, child of the caller's (its `traceparent`, when
/// well-formed; a new trace otherwise), with the HTTP conventions' request attributes, and
/// records its `trace_id` and `span_id` for the log lines. Called before the span is entered.
pub fn start_server_span(span: &tracing::Span, request: &actix_web::dev::ServiceRequest) {
    span.record("otel.kind", "server");
    span.record("otel.name", request.method().as_str());
    let parent = TraceContextPropagator::new().extract(&Headers(request.headers()));
    let _ = span.set_parent(parent);
    let context = span.context();
    let span_context = context.span().span_context().clone();
    if span_context.is_valid() {
        span.record("trace_id", tracing::field::display(span_context.trace_id()));
        span.record("span_id", tracing::field::display(span_context.span_id()));
    }
    if span_context.is_sampled() {
        span.set_attribute("http.request.method", request.method().as_str().to_owned());
        span.set_attribute("url.path", request.path().to_owned());
    }
}

/// The response's part of a SERVER span: its name (`POST /v1/entries`: the method and the
/// route pattern), the route and the status, and the error status for a 5xx.
pub fn end_server_span(span: &tracing::Span, method: &str, route: &str, status: u16) {
    // Started by now: renamed through the OpenTelemetry span itself.
    let context = span.context();
    if !context.span().span_context().is_sampled() {
        return;
    }
    context.span().update_name(format!("{method} {route}"));
    span.set_attribute("http.route", route.to_owned());
    span.set_attribute("http.response.status_code", i64::from(status));
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
        span.set_attribute("error.type", status.to_string());
    }
}

/// The trace context a write's events carry. While exporting: the request's SERVER span, so
/// that the event names a span the daemon exported (in the caller's trace); otherwise the
/// caller's context as it came, or a new trace. Its trace id goes into the log lines.
pub fn write_context(request: &actix_web::HttpRequest) -> TraceContext {
    let current = tracing::Span::current();
    if exporting() {
        let context = current.context();
        let span = context.span();
        if span.span_context().is_valid() {
            return trace_context_of(span.span_context());
        }
    }
    let trace = TraceContext::of_request(request);
    current.record("trace_id", trace.trace_id());
    trace
}

/// The tracer of the export, for the spans built without `tracing`: the writer's batch (below),
/// the relay's batches and the publishes (`outbox::spans`) are built straight on the SDK, without the way
/// through `tracing`'s subscriber and the OpenTelemetry layer (they log nothing of their own).
static TRACER: std::sync::OnceLock<Tracer> = std::sync::OnceLock::new();

/// The tracer, while exporting; None otherwise.
pub fn tracer() -> Option<&'static Tracer> {
    if exporting() {
        TRACER.get()
    } else {
        None
    }
}

/// The span of a writer's batch: INTERNAL, a trace of its own, linking the writes it carries.
/// None unless exporting and sampled.
pub fn writer_batch_span<'a>(
    writes: impl ExactSizeIterator<Item = Option<&'a TraceContext>>,
) -> Option<opentelemetry_sdk::trace::Span> {
    let tracer = tracer()?;
    let count = writes.len();
    let links = writes
        .flatten()
        .filter_map(span_context_of)
        .map(Link::with_context)
        .collect();
    let span = tracer
        .span_builder("writer.batch")
        .with_kind(SpanKind::Internal)
        .with_attributes([
            KeyValue::new("db.system.name", "postgresql"),
            KeyValue::new("retrysafe.batch.writes", count as i64),
        ])
        .with_links(links)
        .start_with_context(tracer, &Context::new());
    span.span_context().is_sampled().then_some(span)
}

/// Ends a writer's batch span, with an error status when a write of it failed.
pub fn end_writer_batch_span(span: Option<opentelemetry_sdk::trace::Span>, failed: bool) {
    if let Some(mut span) = span {
        if failed {
            span.set_status(Status::error("a write of the batch failed"));
        }
        span.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_trace_context_round_trips_through_a_span_context() {
        let trace = TraceContext {
            traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            tracestate: Some("vendor=value".into()),
        };
        let context = span_context_of(&trace).unwrap();
        assert!(context.is_valid() && context.is_sampled() && context.is_remote());
        assert_eq!(trace_context_of(&context), trace);
        let malformed = TraceContext {
            traceparent: "00-xyz".into(),
            tracestate: None,
        };
        assert!(span_context_of(&malformed).is_none());
    }
}
