//! The outbox relay against the real RabbitMQ: delivery, properties, failures and outages.
//! What one relay pass publishes and records is tested on a daemon without relays, the pass
//! run by the test (`TestDaemon::relay_until_empty`); the relays themselves (several, in two
//! daemons, through a broker outage) on daemons with them.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::future::join_all;
use serde_json::Value;

use crate::common::consumer::{header, message_id, TestConsumer};
use crate::common::daemon::{spawn_app_with, spawn_app_without_relays, spawn_second_app};
use crate::common::helpers::{
    amqp_url_through, count_is, entry_body, eventually, insert_backlog, AMQP_HOST_PORT,
};
use crate::common::proxy::TcpProxy;

const WAIT: Duration = Duration::from_secs(30);
/// Bound on the relays' work after the last delivery: marking the rows sent.
const MARKED: Duration = Duration::from_secs(60);
const UNSENT: &str = "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL";
const SENT: &str = "SELECT count(*) FROM outbox_events WHERE sent_at IS NOT NULL";

#[actix_web::test]
async fn each_write_publishes_its_event_with_the_contracted_properties() {
    let app = spawn_app_without_relays(|_| {}).await;
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;

    let created = app.post_entry("evt-1", &entry_body(1)).await;
    created.assert_created();
    let entry = created.json();
    assert_eq!(app.relay_until_empty().await, 1);
    let delivery = consumer.next(WAIT).await.expect("the event is delivered");

    let row = app
        .db
        .query_one("SELECT event_id::text, event_key FROM outbox_events", &[])
        .await
        .unwrap();
    let event_id: String = row.get(0);
    assert_eq!(message_id(&delivery), event_id);
    assert_eq!(
        row.get::<_, String>(1),
        format!("{}/entry.created", entry["id"].as_str().unwrap())
    );
    assert_eq!(delivery.routing_key.as_str(), "entry.created");
    assert_eq!(delivery.exchange.as_str(), app.settings.amqp.exchange);
    let properties = &delivery.properties;
    assert_eq!(*properties.delivery_mode(), Some(2), "persistent");
    assert_eq!(
        properties.kind().as_ref().map(|t| t.as_str()),
        Some("entry.created")
    );
    assert_eq!(
        properties.app_id().as_ref().map(|t| t.as_str()),
        Some("retrysafe")
    );
    assert_eq!(
        properties.content_type().as_ref().map(|t| t.as_str()),
        Some("application/cloudevents+json")
    );
    assert!(properties.timestamp().is_some_and(|t| t > 1_700_000_000));
    assert_eq!(
        header(&delivery, "idempotency-key").as_deref(),
        Some("evt-1")
    );
    assert_eq!(header(&delivery, "client-id").as_deref(), Some("anonymous"));

    let event: Value = serde_json::from_slice(&delivery.data).unwrap();
    assert_eq!(event["specversion"], "1.0");
    assert_eq!(event["id"], event_id);
    assert_eq!(event["type"], "entry.created");
    assert!(event["source"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(event["subject"], entry["id"]);
    assert_eq!(event["time"], entry["created_at"]);
    assert_eq!(event["data"], entry, "the event carries the entry");

    assert_eq!(app.count(SENT).await, 1);
    let key = app.get("/v1/idempotency-keys/evt-1", None).await.json();
    assert!(key["events"][0]["sent_at"].is_string(), "{key}");
    assert!(
        consumer.next(Duration::from_millis(500)).await.is_none(),
        "published once"
    );
}

#[actix_web::test]
async fn audit_events_are_written_with_the_entry_and_a_replay_emits_nothing() {
    let app = spawn_app_without_relays(|settings| settings.events.audit = true).await;
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;

    let body = entry_body(1);
    let created = app.post_entry("audit-1", &body).await;
    created.assert_created();
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE idempotency_key = 'audit-1'")
            .await,
        2
    );
    assert_eq!(app.relay_until_empty().await, 2);
    let deliveries = consumer.take(2, WAIT).await;
    let mut types: Vec<String> = deliveries
        .iter()
        .map(|d| d.routing_key.to_string())
        .collect();
    types.sort();
    assert_eq!(types, ["audit.entry.created", "entry.created"]);
    let audit = deliveries
        .iter()
        .find(|d| d.routing_key.as_str() == "audit.entry.created")
        .unwrap();
    let audit: Value = serde_json::from_slice(&audit.data).unwrap();
    assert_eq!(audit["data"]["client_id"], "anonymous");
    assert_eq!(audit["data"]["idempotency_key"], "audit-1");
    assert_eq!(audit["data"]["request_hash"].as_str().unwrap().len(), 64);
    assert_eq!(audit["data"]["remote_addr"], "127.0.0.1");
    assert_eq!(audit["subject"], created.json()["id"]);

    let replay = app.post_entry("audit-1", &body).await;
    assert!(replay.replayed());
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE idempotency_key = 'audit-1'")
            .await,
        2
    );
    assert_eq!(app.relay_until_empty().await, 0, "nothing more to publish");
    assert_eq!(app.count(SENT).await, 2);
    assert!(
        consumer.next(Duration::from_millis(500)).await.is_none(),
        "a replay publishes nothing"
    );

    // The key lookup lists both events, found by their event keys (the outbox has no index
    // of client and key: migration V11).
    let lookup = app.get("/v1/idempotency-keys/audit-1", None).await;
    assert_eq!(lookup.status, 200, "{}", lookup.describe());
    let mut listed: Vec<String> = lookup.json()["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| event["event_type"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    assert_eq!(listed, ["audit.entry.created", "entry.created"]);
    assert_eq!(
        app.count("SELECT count(*) FROM pg_indexes WHERE indexname = 'outbox_events_client_key'")
            .await,
        0
    );
}

#[actix_web::test]
async fn unroutable_events_are_not_marked_sent_and_are_delivered_once_a_queue_is_bound() {
    let app = spawn_app_without_relays(|_| {}).await;
    app.post_entry("unroutable-1", &entry_body(1))
        .await
        .assert_created();

    assert_eq!(app.relay_until_empty().await, 0, "returned, not confirmed");
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE attempts >= 1")
            .await,
        1
    );
    let row = app
        .db
        .query_one("SELECT sent_at IS NULL, failed_at IS NULL, last_error, next_attempt_at > created_at FROM outbox_events", &[])
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0), "a returned message is not sent");
    assert!(row.get::<_, bool>(1), "one failure does not park");
    let error: String = row.get(2);
    assert!(error.contains("NO_ROUTE"), "{error}");
    assert!(row.get::<_, bool>(3), "the next attempt is scheduled later");

    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "entry.*").await;
    // Skip the backoff rather than wait for it.
    app.db
        .execute("UPDATE outbox_events SET next_attempt_at = now()", &[])
        .await
        .unwrap();
    assert_eq!(app.relay_until_empty().await, 1);
    let delivery = consumer
        .next(WAIT)
        .await
        .expect("delivered once a queue is bound");
    assert_eq!(
        header(&delivery, "idempotency-key").as_deref(),
        Some("unroutable-1")
    );
    assert_eq!(app.count(SENT).await, 1);
}

#[actix_web::test]
async fn events_past_max_attempts_are_parked() {
    let app = spawn_app_without_relays(|settings| settings.outbox.max_attempts = 2).await;
    app.post_entry("parked-1", &entry_body(1))
        .await
        .assert_created();
    app.relay_until_empty().await;
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE attempts >= 1")
            .await,
        1
    );
    app.db
        .execute("UPDATE outbox_events SET next_attempt_at = now()", &[])
        .await
        .unwrap();
    app.relay_until_empty().await;
    assert_eq!(
        app.count(
            "SELECT count(*) FROM outbox_events WHERE failed_at IS NOT NULL AND attempts = 2"
        )
        .await,
        1
    );
    assert_eq!(app.count(SENT).await, 0);
    // Parked events are not backlog.
    app.readyz_once(|ready| ready.json()["outbox_backlog"] == 0)
        .await;
}

#[actix_web::test]
async fn several_relays_in_two_daemons_publish_a_backlog_exactly_once() {
    const EVENTS: i64 = 10_000;
    let first = spawn_app_with(|settings| {
        settings.outbox.workers = 3;
        settings.outbox.batch_size = 250;
        // A batch whose confirms take longer than confirm_timeout is published again (at least
        // once, as designed); on a loaded machine that can pass the default 10 s, and this
        // test is about relays never claiming the same rows, not about slow confirms.
        settings.outbox.confirm_timeout = std::time::Duration::from_secs(60);
    })
    .await;
    let second = spawn_second_app(&first).await;
    let mut consumer = TestConsumer::bind(&first.settings.amqp.exchange, "#").await;
    insert_backlog(&first.db, EVENTS).await;

    let mut seen = HashSet::new();
    let mut duplicates = 0;
    while seen.len() < EVENTS as usize {
        let delivery = consumer
            .next(WAIT)
            .await
            .unwrap_or_else(|| panic!("stalled after {} events", seen.len()));
        if !seen.insert(message_id(&delivery)) {
            duplicates += 1;
        }
    }
    assert!(
        consumer.next(Duration::from_secs(1)).await.is_none(),
        "no event is published twice"
    );
    assert_eq!(duplicates, 0, "no event is published twice");
    eventually(MARKED, || count_is(&first.db, UNSENT, 0)).await;
    assert_eq!(
        first
            .count("SELECT count(*) FROM outbox_events WHERE attempts > 0")
            .await,
        0
    );
    drop(second);
}

#[actix_web::test]
async fn a_broker_outage_does_not_block_writes_and_loses_no_event() {
    let proxy = TcpProxy::start(AMQP_HOST_PORT.parse::<SocketAddr>().unwrap()).await;
    let port = proxy.port;
    let app = spawn_app_with(|settings| {
        settings.amqp.url = retrysafe::config::UrlList::one(&amqp_url_through(port));
    })
    .await;
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;

    app.post_entry("outage-0", &entry_body(0))
        .await
        .assert_created();
    consumer
        .next(WAIT)
        .await
        .expect("delivered while the broker is up");

    proxy.cut();
    let responses =
        join_all((1..=20).map(|n| app.post_entry_owned(format!("outage-{n}"), entry_body(n))))
            .await;
    for response in &responses {
        assert_eq!(
            response.status,
            201,
            "writes go on while the broker is down: {}",
            response.describe()
        );
    }
    let ready = app.get("/readyz", None).await;
    assert_eq!(
        ready.status, 200,
        "the broker being down does not make the daemon unready"
    );
    assert!(app.count(UNSENT).await > 0);

    proxy.restore();
    let mut ids: HashSet<String> = HashSet::new();
    while ids.len() < 20 {
        let delivery = consumer
            .next(WAIT)
            .await
            .unwrap_or_else(|| panic!("only {} of 20 delivered", ids.len()));
        ids.insert(header(&delivery, "idempotency-key").unwrap());
    }
    eventually(MARKED, || count_is(&app.db, UNSENT, 0)).await;
    assert_eq!(app.count("SELECT count(*) FROM outbox_events").await, 21);
    let ready = app.get("/readyz", None).await.json();
    assert_eq!(ready["broker"], "connected", "{ready}");
}

/// A batch that mixes routed and unroutable events: lapin may hand a returned message to
/// another publish's confirm, so the relay must attribute returns by message_id. An audit event
/// that no queue received must never be marked sent, and every entry.created must be.
#[actix_web::test]
async fn in_a_mixed_batch_only_routed_events_are_marked_sent() {
    let app = spawn_app_without_relays(|settings| {
        settings.events.audit = true;
        settings.outbox.batch_size = 500;
    })
    .await;
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "entry.created").await;
    let writes = 150;
    let responses =
        join_all((0..writes).map(|n| app.post_entry_owned(format!("mixed-{n}"), entry_body(n))))
            .await;
    assert!(responses.iter().all(|r| r.status == 201));
    // One batch holds all 300 events, routed and unroutable mixed.
    assert_eq!(app.relay_until_empty().await, writes as usize);

    let mut received = HashSet::new();
    while received.len() < writes as usize {
        let delivery = consumer
            .next(WAIT)
            .await
            .unwrap_or_else(|| panic!("{} of {writes} entry.created delivered", received.len()));
        assert_eq!(delivery.routing_key.as_str(), "entry.created");
        received.insert(message_id(&delivery));
    }
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE event_type = 'entry.created' AND sent_at IS NOT NULL")
            .await,
        writes
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE event_type = 'audit.entry.created' AND attempts >= 1")
            .await,
        writes
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE event_type = 'audit.entry.created' AND sent_at IS NOT NULL")
            .await,
        0,
        "an event no queue received is never marked sent"
    );
    let sent_ids: HashSet<String> = app
        .db
        .query(
            "SELECT event_id::text FROM outbox_events WHERE sent_at IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(
        sent_ids.is_subset(&received),
        "every row marked sent was received"
    );
}

/// A relay claims and publishes its next batch while the previous one awaits its confirms, so
/// the broker is not left idle between batches: with a backlog of many full batches, two of one
/// relay's batches are in flight at some moment and never more; every event arrives exactly once
/// and is marked sent.
#[actix_web::test]
async fn a_relay_publishes_its_next_batch_while_the_previous_awaits_its_confirms() {
    use retrysafe::db::Database;
    use retrysafe::outbox::relay::{GetState, BATCHES_IN_FLIGHT};
    use retrysafe::outbox::{Broker, OutboxRelay, RelayConfig};

    const EVENTS: i64 = 3000;
    let app = spawn_app_without_relays(|settings| settings.outbox.batch_size = 100).await;
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    insert_backlog(&app.db, EVENTS).await;

    let db = Database::new(&app.config().database).unwrap();
    let topology = retrysafe::db::topology::Topology::detect(&db, &[])
        .await
        .unwrap();
    let config = RelayConfig::from_config(
        &app.config(),
        (topology, retrysafe::db::WriteHealth::default()),
    );
    let broker = Broker::new(&app.config().amqp).unwrap();
    let arbiter = actix::Arbiter::new();
    let relay = OutboxRelay::start(&arbiter.handle(), 0, std::sync::Arc::new(broker), config);
    let mut most_in_flight = 0;
    let deadline = tokio::time::Instant::now() + MARKED;
    loop {
        let state = relay.send(GetState).await.unwrap();
        most_in_flight = most_in_flight.max(state.in_flight);
        if state.events_sent == EVENTS as u64 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {EVENTS} sent: {state:?}",
            state.events_sent
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    relay.send(retrysafe::lifecycle::Stop).await.unwrap();
    arbiter.stop();

    assert_eq!(
        most_in_flight, BATCHES_IN_FLIGHT,
        "a second batch runs while the first awaits its confirms, and no third"
    );
    let seen: HashSet<String> = consumer
        .take(EVENTS as usize, WAIT)
        .await
        .iter()
        .map(message_id)
        .collect();
    assert_eq!(seen.len(), EVENTS as usize, "no event is published twice");
    assert!(consumer.next(Duration::from_secs(1)).await.is_none());
    assert_eq!(app.count(UNSENT).await, 0);
}
