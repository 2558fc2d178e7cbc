//! W3C trace context from the write to its events: the caller's `traceparent` and `tracestate`
//! travel with each event (AMQP headers and CloudEvents attributes), replays included; a write
//! without one, or with a malformed one, starts a trace and is never refused for it.

use std::time::Duration;

use serde_json::Value;

use crate::common::cli::stderr;
use crate::common::consumer::{header, TestConsumer};
use crate::common::daemon::spawn_app_without_relays;
use crate::common::helpers::entry_body;

const WAIT: Duration = Duration::from_secs(30);
const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[actix_web::test]
async fn the_callers_trace_context_travels_with_the_events_and_their_replays() {
    let app = spawn_app_without_relays(|settings| settings.events.audit = true).await;
    let exchange = app.settings.amqp.exchange.clone();
    let mut consumer = TestConsumer::bind(&exchange, "#").await;
    let created = app
        .post_request("traced")
        .insert_header(("traceparent", CALLER))
        .insert_header(("tracestate", "congo=t61rcWkgMzE"))
        .send_json(&entry_body(1))
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    assert_eq!(app.relay_until_empty().await, 2);
    for delivery in consumer.take(2, WAIT).await {
        let traceparent = header(&delivery, "traceparent").expect("a traceparent header");
        assert_eq!(&traceparent[3..35], &CALLER[3..35], "the caller's trace");
        assert_eq!(
            header(&delivery, "tracestate").as_deref(),
            Some("congo=t61rcWkgMzE")
        );
        let event: Value = serde_json::from_slice(&delivery.data).unwrap();
        assert_eq!(
            event["traceparent"], traceparent,
            "the CloudEvent says the same"
        );
        assert_eq!(event["tracestate"], "congo=t61rcWkgMzE");
        let context = retrysafe::inbox::trace_context_of(&delivery.properties).unwrap();
        assert_eq!(context.traceparent, traceparent);
    }

    let queue = format!("{exchange}.rebuild");
    let mut rebuilt = TestConsumer::declare(&exchange, &queue, None).await;
    let replayed = app.retrysafe(&["outbox", "replay", "--all", "--to-queue", &queue]);
    assert!(replayed.status.success(), "{}", stderr(&replayed));
    for delivery in rebuilt.take(2, WAIT).await {
        let traceparent = header(&delivery, "traceparent").expect("replays carry it too");
        assert_eq!(&traceparent[3..35], &CALLER[3..35]);
    }
}

#[actix_web::test]
async fn a_write_without_or_with_a_malformed_context_starts_a_trace() {
    let app = spawn_app_without_relays(|_| {}).await;
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    app.post_entry("plain-1", &entry_body(1))
        .await
        .assert_created();
    app.post_entry("plain-2", &entry_body(2))
        .await
        .assert_created();
    for (n, malformed) in [
        "garbage",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
    ]
    .iter()
    .enumerate()
    {
        let answer = app
            .post_request(&format!("malformed-{n}"))
            .insert_header(("traceparent", *malformed))
            .insert_header(("tracestate", "congo=t61rcWkgMzE"))
            .send_json(&entry_body(10 + n as i64))
            .await
            .unwrap();
        assert_eq!(answer.status(), 201, "{malformed} is ignored, not refused");
    }
    assert_eq!(app.relay_until_empty().await, 5);
    let mut trace_ids = std::collections::HashSet::new();
    for delivery in consumer.take(5, WAIT).await {
        let traceparent = header(&delivery, "traceparent").expect("every event has a trace");
        let parsed = retrysafe::trace_context::parse_traceparent(&traceparent);
        assert_eq!(parsed.as_deref(), Some(traceparent.as_str()), "valid");
        assert!(
            header(&delivery, "tracestate").is_none(),
            "no tracestate without the traceparent it belongs to"
        );
        trace_ids.insert(traceparent[3..35].to_owned());
    }
    assert_eq!(trace_ids.len(), 5, "a trace of its own for each write");
}
