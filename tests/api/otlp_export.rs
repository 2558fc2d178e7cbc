//! Spans over OTLP/HTTP, against a receiver of the test's own (an HTTP server that decodes the
//! `ExportTraceServiceRequest`s the daemon posts) and a real queue: the SERVER span of a write
//! is the child of the caller's span, the event's `traceparent` names it, the writer's batch and
//! the PRODUCER span of the publish link to it, with the messaging conventions' attributes; a
//! write without a context, or with a malformed one, gets a trace of its own; a replay publishes
//! nothing; log lines carry the trace id. A collector that hangs changes nothing for writes: its
//! spans are dropped, and counted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as ProtoValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::Value;

use crate::common::consumer::{header, message_id, TestConsumer};
use crate::common::daemon::{spawn_binary, TestDaemon};
use crate::common::helpers::{entry_body, eventually, metric_sample, test_settings};

const WAIT: Duration = Duration::from_secs(30);
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// A span as received, with its service's name.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    span: Span,
}

impl Received {
    fn trace_id(&self) -> String {
        hex::encode(&self.span.trace_id)
    }

    fn span_id(&self) -> String {
        hex::encode(&self.span.span_id)
    }

    fn parent_span_id(&self) -> String {
        hex::encode(&self.span.parent_span_id)
    }

    fn attribute(&self, key: &str) -> Option<String> {
        attribute(&self.span.attributes, key)
    }

    /// (trace id, span id) of each link.
    fn links(&self) -> Vec<(String, String)> {
        self.span
            .links
            .iter()
            .map(|link| (hex::encode(&link.trace_id), hex::encode(&link.span_id)))
            .collect()
    }
}

fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    Some(match value.value.as_ref()? {
        ProtoValue::StringValue(text) => text.clone(),
        ProtoValue::IntValue(number) => number.to_string(),
        ProtoValue::BoolValue(flag) => flag.to_string(),
        ProtoValue::DoubleValue(number) => number.to_string(),
        other => format!("{other:?}"),
    })
}

/// An OTLP/HTTP receiver: POST /v1/traces, protobuf.
struct Receiver {
    port: u16,
    spans: Arc<Mutex<Vec<Received>>>,
    server: actix_web::dev::ServerHandle,
}

impl Receiver {
    async fn start() -> Self {
        let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
        let kept = Arc::clone(&spans);
        let server = HttpServer::new(move || {
            let kept = Arc::clone(&kept);
            App::new().route(
                "/v1/traces",
                web::post().to(move |body: web::Bytes| {
                    let kept = Arc::clone(&kept);
                    async move {
                        let request = ExportTraceServiceRequest::decode(body.as_ref())
                            .expect("an ExportTraceServiceRequest");
                        let mut kept = kept.lock().unwrap();
                        for resource in request.resource_spans {
                            let service = resource
                                .resource
                                .as_ref()
                                .and_then(|resource| {
                                    attribute(&resource.attributes, "service.name")
                                })
                                .unwrap_or_default();
                            for scope in resource.scope_spans {
                                for span in scope.spans {
                                    kept.push(Received {
                                        service: service.clone(),
                                        span,
                                    });
                                }
                            }
                        }
                        HttpResponse::Ok()
                            .content_type("application/x-protobuf")
                            .finish()
                    }
                }),
            )
        })
        .workers(1)
        .bind(("127.0.0.1", 0))
        .unwrap();
        let port = server.addrs()[0].port();
        let server = server.run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        Self {
            port,
            spans,
            server: handle,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The first span received that `wanted` picks, within [`WAIT`].
    async fn span(&self, what: &str, wanted: impl Fn(&Received) -> bool) -> Received {
        eventually(WAIT, || async {
            self.spans
                .lock()
                .unwrap()
                .iter()
                .find(|span| wanted(span))
                .cloned()
                .ok_or_else(|| format!("no {what} span yet"))
        })
        .await
    }

    fn count(&self, wanted: impl Fn(&Received) -> bool) -> usize {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|span| wanted(span))
            .count()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        drop(self.server.stop(false));
    }
}

fn is_server_span_of(trace_id: &str) -> impl Fn(&Received) -> bool + '_ {
    move |span| span.span.kind == SpanKind::Server as i32 && span.trace_id() == trace_id
}

fn is_producer_of(event_id: &str) -> impl Fn(&Received) -> bool + '_ {
    move |span| {
        span.span.kind == SpanKind::Producer as i32
            && span.attribute("messaging.message.id").as_deref() == Some(event_id)
    }
}

async fn exporting_daemon(endpoint: &str) -> TestDaemon {
    spawn_binary(
        test_settings(),
        &[
            ("RETRYSAFE_TELEMETRY__OTLP_ENDPOINT", endpoint.to_owned()),
            ("RETRYSAFE_LOG__LEVEL", "retrysafe=debug,info".into()),
        ],
    )
    .await
}

/// Posts `key` with `traceparent` (if any); returns the delivered event's `traceparent` header
/// and message id.
async fn write(
    app: &TestDaemon,
    consumer: &mut TestConsumer,
    key: &str,
    traceparent: Option<&str>,
) -> (String, String) {
    let mut request = app.post_request(key);
    if let Some(traceparent) = traceparent {
        request = request.insert_header(("traceparent", traceparent));
    }
    let response = request.send_json(&entry_body(1)).await.unwrap();
    assert_eq!(response.status(), 201, "{key}");
    let delivery = consumer.next(WAIT).await.expect("the event is delivered");
    let traceparent = header(&delivery, "traceparent").expect("a traceparent header");
    let event: Value = serde_json::from_slice(&delivery.data).unwrap();
    assert_eq!(
        event["traceparent"], traceparent,
        "the CloudEvent says the same"
    );
    (traceparent, message_id(&delivery))
}

#[actix_web::test]
async fn a_write_is_traced_from_the_callers_span_to_the_publish_of_its_event() {
    let receiver = Receiver::start().await;
    let app = exporting_daemon(&receiver.url()).await;
    let exchange = app.settings.amqp.exchange.clone();
    let mut consumer = TestConsumer::bind(&exchange, "#").await;

    // The caller's context: the SERVER span is its child, and the event names the SERVER span.
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let (traceparent, event_id) = write(&app, &mut consumer, "traced", Some(&caller)).await;
    assert_eq!(&traceparent[3..35], CALLER_TRACE, "the caller's trace");
    let server = receiver
        .span("SERVER", is_server_span_of(CALLER_TRACE))
        .await;
    assert_eq!(
        server.parent_span_id(),
        CALLER_SPAN,
        "child of the caller's span"
    );
    assert_eq!(
        &traceparent[36..52],
        server.span_id(),
        "the event's traceparent names the exported SERVER span"
    );
    assert_eq!(server.service, "retrysafe");
    assert_eq!(server.span.name, "POST /v1/entries");
    assert_eq!(
        server.attribute("http.request.method").as_deref(),
        Some("POST")
    );
    assert_eq!(
        server.attribute("http.route").as_deref(),
        Some("/v1/entries")
    );
    assert_eq!(
        server.attribute("http.response.status_code").as_deref(),
        Some("201")
    );
    let write_span = (CALLER_TRACE.to_owned(), server.span_id());

    // The writer's batch links to the write.
    let batch = receiver
        .span("writer.batch", |span| {
            span.span.name == "writer.batch" && span.links().contains(&write_span)
        })
        .await;
    assert_eq!(
        batch.attribute("db.system.name").as_deref(),
        Some("postgresql")
    );

    // The publish: a PRODUCER span with the messaging conventions' attributes, linked to the
    // write, child of the relay's batch (which links to it too).
    let producer = receiver.span("PRODUCER", is_producer_of(&event_id)).await;
    assert_eq!(
        producer.attribute("messaging.system").as_deref(),
        Some("rabbitmq")
    );
    assert_eq!(
        producer.attribute("messaging.destination.name").as_deref(),
        Some(exchange.as_str())
    );
    assert_eq!(
        producer
            .attribute("messaging.rabbitmq.destination.routing_key")
            .as_deref(),
        Some("entry.created")
    );
    assert_eq!(producer.span.name, format!("publish {exchange}"));
    assert!(
        producer.links().contains(&write_span),
        "{:?}",
        producer.links()
    );
    let relay_batch = receiver
        .span("relay.batch", |span| {
            span.span.name == "relay.batch" && span.span_id() == producer.parent_span_id()
        })
        .await;
    assert!(relay_batch.links().contains(&write_span));

    // No context, or a malformed one: a trace of its own, never a refusal.
    let mut traces = HashMap::new();
    for (key, sent) in [
        ("untraced", None),
        ("malformed", Some("00-zzz-not-a-traceparent")),
    ] {
        let (traceparent, _) = write(&app, &mut consumer, key, sent).await;
        let trace_id = traceparent[3..35].to_owned();
        assert_ne!(trace_id, CALLER_TRACE);
        let server = receiver.span("SERVER", is_server_span_of(&trace_id)).await;
        assert_eq!(server.parent_span_id(), "", "{key}: a root span");
        assert_eq!(&traceparent[36..52], server.span_id());
        traces.insert(key, trace_id);
    }
    assert_ne!(traces["untraced"], traces["malformed"]);

    // A replay publishes nothing: the next write's publish is exported, and the replayed key
    // has had one publish only.
    let replay = app
        .post_request("traced")
        .insert_header(("traceparent", caller.as_str()))
        .send_json(&entry_body(1))
        .await
        .unwrap();
    assert_eq!(replay.status(), 201);
    assert_eq!(
        replay
            .headers()
            .get("idempotency-replayed")
            .and_then(|value| value.to_str().ok()),
        Some("true")
    );
    let (_, later_event) = write(&app, &mut consumer, "after-the-replay", None).await;
    receiver
        .span("PRODUCER", is_producer_of(&later_event))
        .await;
    assert_eq!(receiver.count(is_producer_of(&event_id)), 1);
    assert!(consumer.next(Duration::from_secs(1)).await.is_none());

    // Log lines carry the trace id and the span id.
    let log = app.log_text();
    assert!(
        log.contains(&format!("trace_id={CALLER_TRACE}"))
            && log.contains(&format!("span_id={}", server.span_id())),
        "the request's log lines name its trace and span"
    );
    let exported = app.metric("retrysafe_trace_spans_exported_total").await;
    assert!(exported >= 4.0, "{exported}");
}

#[actix_web::test]
async fn a_hung_collector_changes_nothing_for_writes_and_its_spans_are_counted_as_dropped() {
    // Accepts connections (the kernel does) and never answers.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", hung.local_addr().unwrap());
    let app = exporting_daemon(&endpoint).await;
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    for n in 0..20 {
        write(&app, &mut consumer, &format!("hung-{n}"), None).await;
    }
    eventually(WAIT, || async {
        let metrics = app.get("/metrics", None).await.text();
        let dropped = metric_sample(
            &metrics,
            "retrysafe_trace_spans_dropped_total{reason=\"export_failed\"}",
        )
        .unwrap_or(0.0);
        if dropped > 0.0 {
            Ok(())
        } else {
            Err("no span counted as dropped yet".to_owned())
        }
    })
    .await;
    drop(hung);
}
