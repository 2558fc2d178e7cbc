//! `retrysafe outbox replay`, the built binary against the real PostgreSQL and RabbitMQ: past
//! events to one queue or to the exchange, resumed after an interrupt, recorded, and deduped by
//! a consumer's inbox. The daemons run without relays: a test publishes its writes' events
//! itself, and they are sent when it goes on.

use std::collections::{HashMap, HashSet};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use futures_util::future::join_all;
use lapin::message::Delivery;
use retrysafe::inbox::Inbox;
use uuid::Uuid;

use crate::common::cli::{stderr, stdout};
use crate::common::consumer::{header, message_id, TestConsumer};
use crate::common::daemon::{spawn_app_without_relays, TestDaemon};
use crate::common::helpers::eventually;
use crate::common::helpers::{connect, entry_body};

/// Long enough for a delivery under load; the bound on every wait for one.
const WAIT: Duration = Duration::from_secs(30);
/// How long a queue must stay silent to count as having received everything.
const QUIET: Duration = Duration::from_millis(750);

fn replay(app: &TestDaemon, args: &[&str]) -> Output {
    let mut all = vec!["outbox", "replay"];
    all.extend_from_slice(args);
    app.retrysafe(&all)
}

/// Asserts that the command succeeded and printed `text` on standard output; returns the output.
fn assert_says(output: &Output, text: &str) -> String {
    assert!(
        output.status.success(),
        "{}{}",
        stdout(output),
        stderr(output)
    );
    let printed = stdout(output);
    assert!(printed.contains(text), "{text:?} is not in: {printed}");
    printed
}

fn ids(deliveries: &[Delivery]) -> Vec<String> {
    deliveries.iter().map(message_id).collect()
}

/// Writes `count` entries with keys `<prefix>-<n>`, publishes their events, and returns their
/// event ids.
async fn write_entries(app: &TestDaemon, prefix: &str, count: i64) -> Vec<String> {
    let answers =
        join_all((0..count).map(|n| app.post_entry_owned(format!("{prefix}-{n}"), entry_body(n))))
            .await;
    assert!(answers.iter().all(|answer| answer.status == 201));
    app.relay_until_empty().await;
    let rows = app
        .db
        .query(
            "SELECT event_id::text FROM outbox_events WHERE idempotency_key LIKE $1 || '-%' ORDER BY id",
            &[&prefix],
        )
        .await
        .unwrap();
    rows.iter().map(|row| row.get(0)).collect()
}

/// The database's clock now, as an RFC 3339 time for `--since`/`--until`, a little apart from
/// the events before and after it.
async fn time_mark(app: &TestDaemon) -> String {
    tokio::time::sleep(Duration::from_millis(20)).await;
    let now: chrono::DateTime<chrono::Utc> =
        app.db.query_one("SELECT now()", &[]).await.unwrap().get(0);
    tokio::time::sleep(Duration::from_millis(20)).await;
    now.to_rfc3339()
}

async fn replay_row(app: &TestDaemon, id: i64) -> (String, i64, i64) {
    let row = app
        .db
        .query_one(
            "SELECT status, events_sent, events_total FROM replays WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// A consumer that applies each event through the inbox: counts a row in `effects` per event
/// it applied, once per event id whatever the redeliveries.
struct InboxConsumer {
    client: tokio_postgres::Client,
    inbox: Inbox,
}

impl InboxConsumer {
    async fn connect(app: &TestDaemon) -> Self {
        let client = connect(&app.database.name).await;
        client
            .batch_execute("CREATE TABLE effects (event_id uuid NOT NULL)")
            .await
            .unwrap();
        Self {
            client,
            inbox: Inbox::new("rebuilt-consumer"),
        }
    }

    async fn apply(&mut self, deliveries: &[Delivery]) {
        for delivery in deliveries {
            let event_id: Uuid = message_id(delivery).parse().unwrap();
            if let Some(transaction) = self.inbox.begin(&mut self.client, event_id).await.unwrap() {
                transaction
                    .execute("INSERT INTO effects (event_id) VALUES ($1)", &[&event_id])
                    .await
                    .unwrap();
                transaction.commit().await.unwrap();
            }
        }
    }

    async fn effects(&self) -> (i64, i64) {
        let row = self
            .client
            .query_one(
                "SELECT count(*), count(DISTINCT event_id) FROM effects",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }
}

#[actix_web::test]
async fn a_queue_bound_after_the_fact_gets_a_time_range_once_per_replay_and_the_inbox_applies_it_once(
) {
    let app = spawn_app_without_relays(|_| {}).await;
    let exchange = app.settings.amqp.exchange.clone();
    let mut existing = TestConsumer::bind(&exchange, "#").await;
    write_entries(&app, "before", 10).await;
    let since = time_mark(&app).await;
    let in_range = write_entries(&app, "range", 12).await;
    let until = time_mark(&app).await;
    write_entries(&app, "after", 10).await;
    assert_eq!(existing.take(32, WAIT).await.len(), 32, "delivered once");

    // The new consumer's queue, bound after the events were delivered.
    let queue = format!("{exchange}.rebuild");
    let mut rebuilt = TestConsumer::declare(&exchange, &queue, Some("#")).await;
    let mut consumer = InboxConsumer::connect(&app).await;
    let arguments = ["--since", &since, "--until", &until, "--to-queue", &queue];

    let first = replay(&app, &arguments);
    assert_says(&first, "completed: 12 event(s) sent in this run, 12 of 12");
    let received = rebuilt.drain(QUIET).await;
    let mut received_ids = ids(&received);
    received_ids.sort();
    let mut expected = in_range.clone();
    expected.sort();
    assert_eq!(received_ids, expected, "each event of the range, once");
    consumer.apply(&received).await;

    // A completed replay is not resumed: the same command starts another.
    assert_says(&replay(&app, &arguments), "replay 2 started");
    let again = rebuilt.drain(QUIET).await;
    assert_eq!(again.len(), 12, "the second replay sends every event again");
    consumer.apply(&again).await;
    assert_eq!(
        consumer.effects().await,
        (12, 12),
        "the inbox applied each once"
    );

    assert!(
        existing.drain(QUIET).await.is_empty(),
        "the queues bound before get nothing from a replay to another queue"
    );
    // The delivery record stays the relay's.
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE sent_at IS NULL OR attempts <> 0")
            .await,
        0
    );

    let replayed = app.get("/v1/idempotency-keys/range-3", None).await.json();
    let event = &replayed["events"][0];
    assert_eq!(event["replay_count"], 2, "{replayed}");
    assert!(event["last_replayed_at"].is_string(), "{replayed}");
    assert!(event["sent_at"].is_string(), "{replayed}");
    let untouched = app.get("/v1/idempotency-keys/before-3", None).await.json();
    assert_eq!(untouched["events"][0]["replay_count"], 0);
    assert!(untouched["events"][0]["last_replayed_at"].is_null());

    let status = app.retrysafe(&["outbox", "status", "--json"]);
    assert!(status.status.success(), "{}", stderr(&status));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let replays = status["replays"].as_array().unwrap();
    assert_eq!(replays.len(), 2);
    for replay in replays {
        assert_eq!(replay["status"], "completed");
        assert_eq!(replay["events_sent"], 12);
        assert_eq!(replay["events_total"], 12);
        assert_eq!(replay["target"], format!("queue:{queue}"));
        assert!(replay["selection"]["until"].is_string(), "{replay}");
        assert!(replay["requested_by"].as_str().unwrap().contains('@'));
    }
    let table = app.retrysafe(&["outbox", "status"]);
    let table = stdout(&table);
    assert!(
        table.contains("completed") && table.contains(&format!("queue:{queue}")),
        "{table}"
    );
    assert!(table.contains("--since"), "{table}");
}

#[actix_web::test]
async fn a_replay_to_the_exchange_reaches_the_bound_queues_with_the_original_routing_keys_and_ids()
{
    let app = spawn_app_without_relays(|settings| settings.events.audit = true).await;
    let exchange = app.settings.amqp.exchange.clone();
    let mut everything = TestConsumer::bind(&exchange, "#").await;
    write_entries(&app, "exchange", 3).await;
    let originals = everything.take(6, WAIT).await;
    let original: HashMap<String, &Delivery> = originals
        .iter()
        .map(|delivery| (message_id(delivery), delivery))
        .collect();

    // Only entry.created is bound here: the audit events would be returned.
    let mut created_only = TestConsumer::bind(&exchange, "entry.created").await;
    assert_says(&replay(&app, &["--type", "entry.created"]), "completed");
    assert_eq!(created_only.drain(QUIET).await.len(), 3);

    assert_says(&replay(&app, &["--all"]), "completed");
    let replayed = everything.drain(QUIET).await;
    // 3 entry.created of the --type replay, then all 6.
    assert_eq!(replayed.len(), 9);
    for delivery in &replayed {
        let first = original[&message_id(delivery)];
        assert_eq!(delivery.routing_key, first.routing_key);
        assert_eq!(delivery.exchange.as_str(), exchange);
        assert_eq!(delivery.data, first.data, "the same body");
        assert_eq!(delivery.properties.kind(), first.properties.kind());
        assert_eq!(
            delivery.properties.timestamp(),
            first.properties.timestamp()
        );
        assert_eq!(*delivery.properties.delivery_mode(), Some(2));
        assert_eq!(
            header(delivery, "idempotency-key"),
            header(first, "idempotency-key")
        );
        assert_eq!(header(delivery, "client-id").as_deref(), Some("anonymous"));
    }
    let types: HashSet<&str> = replayed
        .iter()
        .map(|delivery| delivery.routing_key.as_str())
        .collect();
    assert_eq!(
        types,
        HashSet::from(["entry.created", "audit.entry.created"])
    );
    assert_eq!(created_only.drain(QUIET).await.len(), 3);

    // With no queue bound for audit events, the broker returns them: the replay fails, says
    // why, keeps what was confirmed, and the same command goes on once a queue is bound.
    everything.close().await;
    let failed = replay(&app, &["--all"]);
    assert_eq!(failed.status.code(), Some(1), "{}", stdout(&failed));
    assert!(stderr(&failed).contains("NO_ROUTE"), "{}", stderr(&failed));
    assert!(
        stdout(&failed).contains("run the same command again"),
        "{}",
        stdout(&failed)
    );
    let (status, _, _) = replay_row(&app, 3).await;
    assert_eq!(status, "failed");
    let mut audit = TestConsumer::bind(&exchange, "audit.#").await;
    assert_says(&replay(&app, &["--all"]), "replay 3 resumed");
    assert_eq!(audit.drain(QUIET).await.len(), 3);
    assert_eq!(replay_row(&app, 3).await, ("completed".into(), 6, 6));
}

/// Inserts `count` events into the outbox as delivered long ago, without a daemon's writes:
/// a large past to replay.
async fn insert_sent_events(app: &TestDaemon, count: i64) -> Vec<String> {
    let rows = app
        .db
        .query(
            "INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key, event_type,
                                        payload, created_at, sent_at)
             SELECT gen_random_uuid(), 'past/' || n, 'anonymous', 'past-' || n, 'entry.created',
                    jsonb_build_object('specversion', '1.0', 'n', n),
                    now() - interval '1 hour', now() - interval '1 hour'
             FROM generate_series(1, $1::bigint) AS n
             RETURNING event_id::text",
            &[&count],
        )
        .await
        .unwrap();
    rows.iter().map(|row| row.get(0)).collect()
}

#[actix_web::test]
async fn a_replay_interrupted_half_way_resumes_with_the_same_command_and_sends_the_rest() {
    let app = spawn_app_without_relays(|_| {}).await;
    let all: HashSet<String> = insert_sent_events(&app, 2000).await.into_iter().collect();
    let queue = format!("{}.resume", app.settings.amqp.exchange);
    let mut consumer = TestConsumer::declare(&app.settings.amqp.exchange, &queue, None).await;
    let arguments = [
        "outbox",
        "replay",
        "--since",
        "2h",
        "--to-queue",
        &queue,
        "--rate",
        "500",
        "--batch-size",
        "100",
    ];

    let child = app
        .command(&arguments)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let sent_before_signal = eventually(Duration::from_secs(30), || async {
        let sent = app
            .count("SELECT coalesce(max(events_sent), 0) FROM replays")
            .await;
        if sent >= 300 {
            Ok(sent)
        } else {
            Err(format!("the replay has sent {sent} events, not yet 300"))
        }
    })
    .await;
    assert!(
        (300..2000).contains(&sent_before_signal),
        "the replay was still running with some sent: {sent_before_signal}"
    );
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let interrupted = wait_with_bound(child).await;
    assert_eq!(
        interrupted.status.code(),
        Some(130),
        "{} {}",
        stdout(&interrupted),
        stderr(&interrupted)
    );
    assert!(
        stdout(&interrupted).contains("interrupted")
            && stdout(&interrupted).contains("run the same command again"),
        "{}",
        stdout(&interrupted)
    );
    let (status, sent_first, total) = replay_row(&app, 1).await;
    assert_eq!(status, "interrupted");
    assert_eq!(total, 2000);
    assert!(
        (sent_before_signal..2000).contains(&sent_first),
        "{sent_first}"
    );
    let first: Vec<String> = ids(&consumer.drain(QUIET).await);
    assert_eq!(
        first.len() as i64,
        sent_first,
        "what was confirmed is what is recorded"
    );

    assert_says(&app.retrysafe(&arguments), "replay 1 resumed");
    assert_eq!(replay_row(&app, 1).await, ("completed".into(), 2000, 2000));
    let second: Vec<String> = ids(&consumer.drain(QUIET).await);

    let first: HashSet<String> = first.into_iter().collect();
    let second_set: HashSet<String> = second.iter().cloned().collect();
    assert_eq!(
        second_set.len(),
        second.len(),
        "the second run sends each once"
    );
    assert_eq!(&first | &second_set, all, "together they cover every event");
    let both = first.intersection(&second_set).count();
    assert!(
        both <= 100,
        "at most the batch in flight is sent twice: {both}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM event_replays WHERE replay_id = 1")
            .await,
        2000
    );
}

/// Waits up to a minute for the child to exit, then reads what it printed.
async fn wait_with_bound(mut child: std::process::Child) -> Output {
    for _ in 0..600 {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    panic!("the replay did not stop within a minute of SIGINT");
}

#[actix_web::test]
async fn a_dry_run_sends_and_records_nothing_and_careless_or_impossible_replays_are_refused() {
    let app = spawn_app_without_relays(|_| {}).await;
    let exchange = app.settings.amqp.exchange.clone();
    let mut consumer = TestConsumer::bind(&exchange, "#").await;
    let events = write_entries(&app, "dry", 5).await;
    consumer.take(5, WAIT).await;

    let dry = replay(&app, &["--since", "2000-01-01T00:00:00Z", "--dry-run"]);
    let text = assert_says(&dry, "dry run: nothing is sent or recorded");
    for expected in [
        "dry run: nothing is sent or recorded",
        "would start a new replay",
        "events to send: 5",
        "entry.created",
        "outbox.retention is 7days",
        "--since asks for events from 2000-01-01T00:00:00.000000Z",
    ] {
        assert!(text.contains(expected), "{expected:?} in {text}");
    }
    assert!(
        consumer.drain(QUIET).await.is_empty(),
        "a dry run sends nothing"
    );
    assert_eq!(app.count("SELECT count(*) FROM replays").await, 0);

    let bare = replay(&app, &[]);
    assert_eq!(bare.status.code(), Some(2), "a bare replay is refused");
    assert!(stderr(&bare).contains("--since"), "{}", stderr(&bare));
    let mixed = replay(&app, &["--event", &events[0], "--since", "1h"]);
    assert_eq!(
        mixed.status.code(),
        Some(2),
        "--event is one event, nothing else"
    );
    let bad_time = replay(&app, &["--since", "yesterday"]);
    assert_eq!(bad_time.status.code(), Some(2));
    assert!(
        stderr(&bad_time).contains("RFC 3339"),
        "{}",
        stderr(&bad_time)
    );

    let unknown = Uuid::now_v7().to_string();
    let missing = replay(&app, &["--event", &unknown]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains(&format!("no event with id {unknown}"))
            && stderr(&missing).contains("outbox.retention"),
        "{}",
        stderr(&missing)
    );
    let no_queue = replay(
        &app,
        &["--all", "--to-queue", &format!("{exchange}.missing")],
    );
    assert_eq!(no_queue.status.code(), Some(1));
    assert!(
        stderr(&no_queue).contains("no queue named"),
        "{}",
        stderr(&no_queue)
    );
    let future = replay(&app, &["--since", "2100-01-01T00:00:00Z"]);
    let said = assert_says(&future, "nothing to replay");
    assert!(
        said.contains("the outbox holds events created from"),
        "{said}"
    );
    assert_eq!(app.count("SELECT count(*) FROM replays").await, 0);
    assert!(consumer.drain(QUIET).await.is_empty());

    assert_says(&replay(&app, &["--event", &events[2]]), "completed");
    let delivered = consumer.drain(QUIET).await;
    assert_eq!(ids(&delivered), [events[2].clone()]);
}

/// Who ran a replay is the process's user id (and the name the user database gives it) and the
/// database role of its session, not `$USER`, `$LOGNAME` or `$SUDO_USER`, which whoever runs
/// the command sets as they like.
#[actix_web::test]
async fn a_replay_records_the_os_user_id_and_the_database_user_not_the_environment() {
    let app = spawn_app_without_relays(|_| {}).await;
    let exchange = app.settings.amqp.exchange.clone();
    write_entries(&app, "who", 3).await;
    let queue = format!("{exchange}.who");
    let mut target = TestConsumer::declare(&exchange, &queue, None).await;
    let output = app
        .command(&["outbox", "replay", "--all", "--to-queue", &queue])
        .envs([
            ("USER", "mallory"),
            ("LOGNAME", "mallory"),
            ("SUDO_USER", "mallory"),
        ])
        .output()
        .expect("the binary runs");
    assert_says(&output, "completed: 3 event(s) sent in this run, 3 of 3");
    assert_eq!(target.drain(QUIET).await.len(), 3);

    let row = app
        .db
        .query_one(
            "SELECT requested_by, requested_uid, requested_db_user, current_user::text FROM replays",
            &[],
        )
        .await
        .unwrap();
    let (requested_by, uid, db_user, test_user): (String, Option<i64>, Option<String>, String) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    // SAFETY: getuid has no preconditions. The binary runs as this test's user.
    let own_uid = i64::from(unsafe { libc::getuid() });
    assert_eq!(uid, Some(own_uid));
    assert_eq!(db_user.as_deref(), Some(test_user.as_str()));
    assert!(!requested_by.contains("mallory"), "{requested_by}");
    let expected = retrysafe::operator::Operator::current().display;
    assert_eq!(requested_by, expected);

    let status = app.retrysafe(&["outbox", "status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let replay = &status["replays"][0];
    assert_eq!(replay["requested_uid"], own_uid, "{replay}");
    assert_eq!(replay["requested_db_user"], test_user.as_str(), "{replay}");
}
