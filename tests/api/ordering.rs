//! Ordered delivery per ordering key: numbering, what every view shows, what the events carry,
//! and a parked event holding back its key until it is retried or skipped. Delivery order under
//! concurrent daemons and faults is in tests/faults/ordering.rs.

use std::time::Duration;

use serde_json::{json, Value};
use uuid::Uuid;

use crate::common::cli::{stderr, stdout};
use crate::common::consumer::{header, TestConsumer};
use crate::common::daemon::{spawn_app_without_relays, TestDaemon};

const WAIT: Duration = Duration::from_secs(30);
const QUIET: Duration = Duration::from_millis(500);

fn ordered(n: i64, key: &str) -> Value {
    json!({"kind": "invoice.event", "data": {"n": n}, "ordering_key": key})
}

/// The event id of the `entry.created` event of the write with idempotency key `key`.
async fn event_of(app: &TestDaemon, key: &str) -> Uuid {
    app.db
        .query_one(
            "SELECT event_id FROM outbox_events WHERE idempotency_key = $1 AND event_type = 'entry.created'",
            &[&key],
        )
        .await
        .unwrap()
        .get(0)
}

/// (data.n, sequence header) of each delivery, in delivery order.
fn delivered(deliveries: &[lapin::message::Delivery]) -> Vec<(i64, Option<String>)> {
    deliveries
        .iter()
        .map(|delivery| {
            let event: Value = serde_json::from_slice(&delivery.data).unwrap();
            (
                event["data"]["data"]["n"].as_i64().unwrap(),
                header(delivery, "sequence"),
            )
        })
        .collect()
}

#[actix_web::test]
async fn writes_of_one_key_are_numbered_in_commit_order_and_every_view_shows_it() {
    let app = spawn_app_without_relays(|_| {}).await;
    let mut sequences = Vec::new();
    for (n, key) in [
        "invoice-42",
        "invoice-7",
        "invoice-42",
        "invoice-42",
        "invoice-7",
    ]
    .iter()
    .enumerate()
    {
        let created = app
            .post_entry(&format!("w-{n}"), &ordered(n as i64, key))
            .await;
        created.assert_created();
        let body = created.json();
        assert_eq!(body["ordering_key"], *key);
        sequences.push(body["sequence"].as_i64().expect("a sequence"));
    }
    assert_eq!(sequences, [1, 1, 2, 3, 2]);
    let unordered = app
        .post_entry("w-plain", &json!({"kind": "invoice.event", "data": {}}))
        .await;
    unordered.assert_created();
    let plain = unordered.json();
    assert!(
        plain.get("ordering_key").is_none() && plain.get("sequence").is_none(),
        "{plain}"
    );

    // A retry gets the first answer, byte for byte; so does one after the replay cache.
    let first = app.post_entry("w-2", &ordered(2, "invoice-42")).await;
    assert!(first.replayed());
    assert_eq!(first.json()["sequence"], 2);
    let entry_id = first.json()["id"].as_str().unwrap().to_owned();
    let got = app.get(&format!("/v1/entries/{entry_id}"), None).await;
    assert_eq!(got.status, 200);
    assert_eq!(
        got.text(),
        first.text(),
        "GET shows what the write answered"
    );

    let key = app.get("/v1/idempotency-keys/w-3", None).await.json();
    assert_eq!(key["ordering_key"], "invoice-42");
    assert_eq!(key["sequence"], 3);
    assert_eq!(key["blocked_by"], Value::Null);
    assert_eq!(
        key["events"][0]["next_attempt_at"],
        Value::Null,
        "held behind sequence 1 and 2, unsent: {key}"
    );
    let plain_key = app.get("/v1/idempotency-keys/w-plain", None).await.json();
    assert!(plain_key.get("sequence").is_none(), "{plain_key}");

    let page = app.get("/v1/entries?order=asc", None).await.json();
    let listed: Vec<(Value, Value)> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| (entry["ordering_key"].clone(), entry["sequence"].clone()))
        .collect();
    assert_eq!(
        listed,
        [
            (json!("invoice-42"), json!(1)),
            (json!("invoice-7"), json!(1)),
            (json!("invoice-42"), json!(2)),
            (json!("invoice-42"), json!(3)),
            (json!("invoice-7"), json!(2)),
            (Value::Null, Value::Null),
        ]
    );
    assert_eq!(
        app.count("SELECT count(*) FROM entries WHERE sequence IS NOT NULL")
            .await,
        5
    );
}

#[actix_web::test]
async fn an_ordering_key_is_validated_and_part_of_the_request() {
    let app = spawn_app_without_relays(|_| {}).await;
    for bad in [
        json!(""),
        json!("has space"),
        json!("é"),
        json!("k".repeat(256)),
        json!(42),
        Value::Null,
    ] {
        let refused = app
            .post_entry(
                "bad",
                &json!({"kind": "a", "data": {}, "ordering_key": bad}),
            )
            .await;
        refused.assert_problem(400, "invalid-request");
        assert_eq!(
            refused.json()["errors"][0]["pointer"],
            "/ordering_key",
            "{}",
            refused.text()
        );
    }
    assert_eq!(app.row_counts().await, (0, 0, 0), "nothing written");
    assert_eq!(app.count("SELECT count(*) FROM ordering_keys").await, 0);

    app.post_entry("same", &ordered(1, "a"))
        .await
        .assert_created();
    app.post_entry("same", &ordered(1, "b"))
        .await
        .assert_problem(409, "idempotency-key-reused");
    app.post_entry("same", &json!({"kind": "invoice.event", "data": {"n": 1}}))
        .await
        .assert_problem(409, "idempotency-key-reused");
    // A refused or replayed write takes no number: the next write of the key is 2.
    app.post_entry("same", &ordered(1, "a")).await;
    let next = app.post_entry("next", &ordered(2, "a")).await;
    assert_eq!(next.json()["sequence"], 2);
}

#[actix_web::test]
async fn ordered_events_carry_their_key_and_sequence_in_headers_and_cloud_event() {
    let app = spawn_app_without_relays(|settings| settings.events.audit = true).await;
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    let entries: Vec<Value> = [1, 2]
        .into_iter()
        .map(|n| ordered(n, "account-9"))
        .collect();
    let mut written = Vec::new();
    for (n, body) in entries.iter().enumerate() {
        let created = app.post_entry(&format!("e-{n}"), body).await;
        created.assert_created();
        written.push(created.json());
    }
    app.post_entry("e-plain", &json!({"kind": "x", "data": {}}))
        .await
        .assert_created();
    assert_eq!(app.relay_until_empty().await, 6);
    let deliveries = consumer.take(6, WAIT).await;
    for delivery in &deliveries {
        let event: Value = serde_json::from_slice(&delivery.data).unwrap();
        let plain = event["subject"] != written[0]["id"] && event["subject"] != written[1]["id"];
        if plain {
            assert!(header(delivery, "ordering-key").is_none());
            assert!(event.get("partitionkey").is_none() && event.get("sequence").is_none());
            continue;
        }
        let sequence = if event["subject"] == written[0]["id"] {
            1
        } else {
            2
        };
        assert_eq!(
            header(delivery, "ordering-key").as_deref(),
            Some("account-9")
        );
        assert_eq!(
            header(delivery, "sequence").as_deref(),
            Some(sequence.to_string().as_str())
        );
        assert_eq!(event["partitionkey"], "account-9");
        assert_eq!(event["sequence"], sequence.to_string(), "a string");
        if event["type"] == "entry.created" {
            assert_eq!(
                event["data"],
                written[sequence as usize - 1],
                "the data is the entry"
            );
        }
    }
    // Sequence 2's events come after both of sequence 1's.
    let order: Vec<Option<String>> = deliveries
        .iter()
        .map(|delivery| header(delivery, "sequence"))
        .filter(Option::is_some)
        .collect();
    assert_eq!(
        order,
        [
            Some("1".into()),
            Some("1".into()),
            Some("2".into()),
            Some("2".into())
        ]
    );
}

/// A head parked, as after `outbox.max_attempts` failures.
async fn park(app: &TestDaemon, event_id: Uuid) {
    app.db
        .execute(
            "UPDATE outbox_events SET failed_at = now(), attempts = 10, last_error = 'returned by the broker: NO_ROUTE' WHERE event_id = $1",
            &[&event_id],
        )
        .await
        .unwrap();
}

/// A daemon without relays and a consumer of its exchange, after three writes of `key` with
/// idempotency keys `<prefix>-1` to `<prefix>-3`.
async fn three_ordered_writes(prefix: &str, key: &str) -> (TestDaemon, TestConsumer) {
    let app = spawn_app_without_relays(|_| {}).await;
    let consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    for n in 1..=3 {
        app.post_entry(&format!("{prefix}-{n}"), &ordered(n, key))
            .await
            .assert_created();
    }
    (app, consumer)
}

#[actix_web::test]
async fn a_parked_event_holds_back_its_key_alone_until_it_is_retried() {
    let (app, mut consumer) = three_ordered_writes("a", "a").await;
    app.post_entry("b-1", &ordered(100, "b"))
        .await
        .assert_created();
    let head = event_of(&app, "a-1").await;
    park(&app, head).await;

    assert_eq!(app.relay_until_empty().await, 1, "only key b goes on");
    assert_eq!(
        delivered(&consumer.drain(QUIET).await),
        [(100, Some("1".into()))]
    );
    let key = app.get("/v1/idempotency-keys/a-3", None).await.json();
    assert_eq!(key["blocked_by"], head.to_string(), "{key}");
    assert_eq!(key["events"][0]["blocked_by"], head.to_string());
    let status = app.retrysafe(&["outbox", "status", "--json"]);
    assert!(status.status.success(), "{}", stderr(&status));
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["blocked"]["events"], 2, "{status}");
    assert_eq!(status["blocked"]["keys"], 1);
    assert_eq!(status["blocked"]["by"][0]["event_id"], head.to_string());
    assert_eq!(status["blocked"]["by"][0]["blocked"], 2);
    let table = stdout(&app.retrysafe(&["outbox", "status"]));
    assert!(table.contains("2 event(s) of 1 ordering key(s)"), "{table}");
    let blocked_metric = eventually_metric(&app, "retrysafe_outbox_blocked_events", 2.0).await;
    assert_eq!(blocked_metric, 2.0);

    // A held event cannot be requeued past its head.
    let held = event_of(&app, "a-2").await;
    let refused = app.retrysafe(&["outbox", "retry", "--event", &held.to_string()]);
    assert_eq!(refused.status.code(), Some(1), "{}", stdout(&refused));

    let retried = app.retrysafe(&["outbox", "retry", "--event", &head.to_string()]);
    assert!(retried.status.success(), "{}", stderr(&retried));
    assert_eq!(app.relay_until_empty().await, 3);
    assert_eq!(
        delivered(&consumer.drain(QUIET).await),
        [
            (1, Some("1".into())),
            (2, Some("2".into())),
            (3, Some("3".into()))
        ]
    );
    let status = app.retrysafe(&["outbox", "status", "--json"]);
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["blocked"]["events"], 0);
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE sent_at IS NULL")
            .await,
        0
    );
}

async fn eventually_metric(app: &TestDaemon, name: &str, wanted: f64) -> f64 {
    crate::common::helpers::eventually(Duration::from_secs(30), || async {
        let value = app.metric(name).await;
        if value == wanted {
            Ok(value)
        } else {
            Err(format!("{name} is {value}, not {wanted}"))
        }
    })
    .await
}

#[actix_web::test]
async fn skipping_a_parked_event_lets_its_key_go_on_and_is_recorded() {
    let (app, mut consumer) = three_ordered_writes("s", "k").await;
    let head = event_of(&app, "s-1").await;
    park(&app, head).await;
    assert_eq!(app.relay_until_empty().await, 0, "the key waits");

    let skipped = app.retrysafe(&[
        "outbox",
        "skip",
        "--event",
        &head.to_string(),
        "--reason",
        "the invoice was voided by hand",
    ]);
    assert!(skipped.status.success(), "{}", stderr(&skipped));
    assert!(
        stdout(&skipped).contains("1 event(s) released"),
        "{}",
        stdout(&skipped)
    );
    let record = app
        .db
        .query_one(
            "SELECT reason, requested_uid, requested_db_user, sequence, ordering_key FROM outbox_skips WHERE event_id = $1",
            &[&head],
        )
        .await
        .unwrap();
    assert_eq!(record.get::<_, String>(0), "the invoice was voided by hand");
    assert_eq!(
        record.get::<_, Option<i64>>(1),
        Some(i64::from(unsafe { libc::getuid() }))
    );
    assert_eq!(record.get::<_, String>(2), "postgres");
    assert_eq!(record.get::<_, Option<i64>>(3), Some(1));
    assert_eq!(record.get::<_, Option<String>>(4).as_deref(), Some("k"));

    assert_eq!(app.relay_until_empty().await, 2);
    assert_eq!(
        delivered(&consumer.drain(QUIET).await),
        [(2, Some("2".into())), (3, Some("3".into()))]
    );
    let key = app.get("/v1/idempotency-keys/s-1", None).await.json();
    assert!(key["events"][0]["skipped_at"].is_string(), "{key}");
    assert_eq!(key["events"][0]["sent_at"], Value::Null);

    let again = app.retrysafe(&["outbox", "skip", "--event", &head.to_string()]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("already skipped"),
        "{}",
        stderr(&again)
    );
    let sent = event_of(&app, "s-2").await;
    let published = app.retrysafe(&["outbox", "skip", "--event", &sent.to_string()]);
    assert_eq!(published.status.code(), Some(1));
    assert!(stderr(&published).contains("already published"));
    let unknown = app.retrysafe(&["outbox", "skip", "--event", &Uuid::now_v7().to_string()]);
    assert_eq!(unknown.status.code(), Some(1));
    // A skipped event is neither parked nor retried.
    let all = app.retrysafe(&["outbox", "retry", "--all"]);
    assert!(
        stdout(&all).contains("requeued 0 event(s)"),
        "{}",
        stdout(&all)
    );
    assert_eq!(app.count("SELECT count(*) FROM outbox_skips").await, 1);
}

#[actix_web::test]
async fn a_replay_sends_each_keys_events_in_sequence_order_with_their_headers() {
    let app = spawn_app_without_relays(|_| {}).await;
    let exchange = app.settings.amqp.exchange.clone();
    let mut bound = TestConsumer::bind(&exchange, "#").await;
    // Written all at once: one writer batch numbers several writes of one key.
    let bodies: Vec<(String, Value)> = (0..12)
        .map(|n| {
            let key = if n % 3 == 0 { "r" } else { "s" };
            (format!("replayed-{n}"), ordered(n, key))
        })
        .collect();
    for created in
        futures_util::future::join_all(bodies.iter().map(|(key, body)| app.post_entry(key, body)))
            .await
    {
        created.assert_created();
    }
    assert_eq!(app.relay_until_empty().await, 12);
    assert_eq!(bound.take(12, WAIT).await.len(), 12);
    // Ids in sequence order within each key (what a replay's walk by id relies on).
    assert_eq!(
        app.count(
            "SELECT count(*) FROM (SELECT id, lag(id) OVER (PARTITION BY ordering_key ORDER BY sequence) AS previous
                                   FROM outbox_events) AS walk
             WHERE previous > id"
        )
        .await,
        0
    );
    let queue = format!("{exchange}.rebuild");
    let mut rebuilt = TestConsumer::declare(&exchange, &queue, None).await;
    let replayed = app.retrysafe(&["outbox", "replay", "--all", "--to-queue", &queue]);
    assert!(replayed.status.success(), "{}", stderr(&replayed));
    let deliveries = rebuilt.take(12, WAIT).await;
    let mut checker = crate::common::ordering::OrderChecker::default();
    for delivery in &deliveries {
        checker.observe(delivery);
    }
    assert_eq!(checker.out_of_order(1), Vec::<String>::new());
    assert_eq!(
        checker.per_key(),
        [("r".to_owned(), 4), ("s".to_owned(), 8)]
            .into_iter()
            .collect()
    );
}
