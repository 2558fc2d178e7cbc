//! RabbitMQ faults: the connection cut again and again during a drain, and a broker that nacks
//! every publish. Nothing is lost, nothing is marked sent without a confirm, refused events
//! back off and park, and parked events are delivered once requeued.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use rand::Rng;
use uuid::Uuid;

use crate::common::consumer::{message_id, TestConsumer};
use crate::common::daemon::{spawn_app_with, spawn_app_without_relays, spawn_binary};
use crate::common::helpers::{
    all_event_ids, amqp_url_through, count, count_is, entry_body, eventually, insert_backlog, knob,
    test_settings, AMQP_HOST_PORT, AMQP_URL,
};
use crate::common::proxy::TcpProxy;

const UNSENT: &str = "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL";

/// After the last cut, this long without a delivery while nothing is unsent means the rows
/// still missing were marked sent without reaching the broker. (A hang guard: a confirmed
/// message reaches the test's queue within milliseconds.)
const QUIET: Duration = Duration::from_secs(10);

#[actix_web::test]
async fn cutting_the_broker_during_a_drain_loses_nothing_and_marks_nothing_sent_unconfirmed() {
    let cuts = knob("RETRYSAFE_FAULT_ROUNDS", 5);
    let backlog = knob("RETRYSAFE_FAULT_BACKLOG", 4000) as i64;
    let proxy = TcpProxy::start(AMQP_HOST_PORT.parse::<SocketAddr>().unwrap()).await;
    let port = proxy.port;
    let app = spawn_app_with(|settings| {
        settings.amqp.url = retrysafe::config::UrlList::one(&amqp_url_through(port));
        settings.outbox.workers = 2;
        settings.outbox.batch_size = 50;
    })
    .await;
    // The consumer reaches the broker directly: only the daemon's connection is cut.
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    insert_backlog(&app.db, backlog).await;
    let events = all_event_ids(&app.db).await;

    // Cut when the i-th share of the backlog is marked sent (the relays drain faster than this
    // loop receives, so the consumer's count would place the cuts after the drain), for
    // 100-400 ms each time. Progress is read from the table at most every 50 ms.
    let mut received = HashSet::new();
    let mut deliveries = 0usize;
    let mut cuts_done = 0;
    let mut cuts_with_backlog = 0;
    let mut restore_at: Option<tokio::time::Instant> = None;
    let mut next_progress_check = tokio::time::Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let mut last_delivery = tokio::time::Instant::now();
    while received.len() < events.len() || restore_at.is_some() || cuts_done < cuts {
        assert!(
            tokio::time::Instant::now() < deadline,
            "stalled: {} of {} received after {cuts_done} cuts; {} unsent",
            received.len(),
            events.len(),
            count(&app.db, UNSENT).await
        );
        if cuts_done == cuts && restore_at.is_none() && last_delivery.elapsed() > QUIET {
            let unsent = count(&app.db, UNSENT).await;
            assert!(
                unsent > 0,
                "{} events are marked sent but never reached the queue",
                events.len() - received.len()
            );
        }
        match restore_at {
            Some(at) if tokio::time::Instant::now() >= at => {
                proxy.restore();
                restore_at = None;
                if cuts_done == cuts {
                    // Rows that failed during the cuts wait out their backoff; skip it.
                    app.db
                        .execute(
                            "UPDATE outbox_events SET next_attempt_at = now() WHERE sent_at IS NULL",
                            &[],
                        )
                        .await
                        .unwrap();
                }
            }
            None if cuts_done < cuts && tokio::time::Instant::now() >= next_progress_check => {
                next_progress_check = tokio::time::Instant::now() + Duration::from_millis(50);
                let unsent = count(&app.db, UNSENT).await as usize;
                let sent = events.len() - unsent;
                if sent * (cuts + 1) >= events.len() * (cuts_done + 1) {
                    proxy.cut();
                    cuts_done += 1;
                    if unsent > 0 {
                        cuts_with_backlog += 1;
                    }
                    let down = rand::thread_rng().gen_range(100..400);
                    restore_at = Some(tokio::time::Instant::now() + Duration::from_millis(down));
                }
            }
            _ => {}
        }
        if let Some(delivery) = consumer.next(Duration::from_millis(20)).await {
            last_delivery = tokio::time::Instant::now();
            deliveries += 1;
            received.insert(message_id(&delivery).parse::<Uuid>().unwrap());
        }
    }
    assert!(
        cuts_with_backlog > 0,
        "no cut came while events were unsent: the test did not exercise the fault"
    );
    assert_eq!(received, events, "every event_id arrives, and no other");

    eventually(Duration::from_secs(60), || count_is(&app.db, UNSENT, 0)).await;
    // Every row marked sent was confirmed: its message reached the queue. (The receive loop
    // above already saw all of them; a row marked sent whose publish was lost in a cut would
    // have been missing there.)
    let retried = count(
        &app.db,
        "SELECT count(*) FROM outbox_events WHERE attempts > 0",
    )
    .await;
    eprintln!(
        "broker cuts: {} events, {cuts} cuts ({cuts_with_backlog} with a backlog), {retried} rows failed an attempt, {} redelivered",
        events.len(),
        deliveries - events.len()
    );
    // The last cut may have come after the drain, with nothing left to publish: the relays
    // reconnect on their own all the same, within their backoff.
    app.readyz_once(|ready| ready.json()["broker"] == "connected")
        .await;
}

/// A cut broker connection is one WARN of the daemon's ("broker connection lost") and no ERROR
/// line: lapin's I/O loop reports the same cut with two ERRORs of its own, which would page
/// whoever alerts on errors at every broker restart. The daemon runs as its binary, with the
/// repository's configuration and log filter.
#[actix_web::test]
async fn a_cut_broker_connection_is_logged_as_one_warning_and_no_error() {
    let proxy = TcpProxy::start(AMQP_HOST_PORT.parse::<SocketAddr>().unwrap()).await;
    let amqp = amqp_url_through(proxy.port);
    let mut daemon = spawn_binary(test_settings(), &[("RETRYSAFE_AMQP__URL", amqp)]).await;
    let mut consumer = TestConsumer::bind(&daemon.settings.amqp.exchange, "#").await;
    daemon
        .post_entry("before-cut", &entry_body(1))
        .await
        .assert_created();
    assert!(consumer.next(Duration::from_secs(30)).await.is_some());

    proxy.cut();
    eventually(Duration::from_secs(30), || async {
        let log = daemon.log_text();
        if log.contains("broker connection lost") {
            Ok(())
        } else {
            Err(format!("no \"broker connection lost\" yet:\n{log}"))
        }
    })
    .await;
    proxy.restore();
    daemon
        .post_entry("after-cut", &entry_body(2))
        .await
        .assert_created();
    assert!(
        consumer.next(Duration::from_secs(30)).await.is_some(),
        "the event written after the cut is delivered: {}",
        daemon.log_tail(20)
    );
    daemon.signal("TERM");
    assert!(daemon.wait_for_exit().await.success());

    let log = daemon.log_text();
    assert_eq!(
        log.matches("broker connection lost").count(),
        1,
        "one cut, one warning:\n{log}"
    );
    let errors: Vec<&str> = log.lines().filter(|line| line.contains("ERROR")).collect();
    assert!(errors.is_empty(), "no ERROR line for a cut: {errors:#?}");
}

/// A queue bound to the exchange that holds one message and refuses the rest
/// (`x-max-length = 1`, `x-overflow = reject-publish`): the broker nacks every publish routed to
/// it. Filled with one message of the test's own, and never consumed.
struct RefusingQueue {
    connection: Connection,
    name: String,
}

impl RefusingQueue {
    async fn bind(exchange: &str) -> Self {
        let (connection, channel) = crate::common::consumer::connect_and_declare(exchange).await;
        let name = format!("retrysafe.test.refusing.{}", Uuid::new_v4().simple());
        let mut arguments = FieldTable::default();
        arguments.insert("x-max-length".into(), AMQPValue::LongInt(1));
        arguments.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        channel
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions::exclusive(),
                arguments,
            )
            .await
            .unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let filler = channel
            .basic_publish(
                "".into(),
                name.as_str().into(),
                BasicPublishOptions::default(),
                b"filler",
                BasicProperties::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(filler.is_ack(), "the queue takes its one message");
        channel
            .queue_bind(
                name.as_str().into(),
                exchange.into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        Self { connection, name }
    }

    async fn delete(self) {
        let channel = self.connection.create_channel().await.unwrap();
        channel
            .queue_delete(self.name.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// Runs the built binary's `outbox retry --all` against `database_url`; returns its output.
async fn outbox_retry_all(database_url: &str) -> String {
    let database_url = database_url.to_owned();
    // A blocking wait, off the test's thread (which also runs the daemon's actors).
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_retrysafe"))
            .args(["outbox", "retry", "--all", "--config"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml"))
            .env("RETRYSAFE_DATABASE__URL", database_url)
            .env_remove("FAILPOINTS")
            .output()
            .expect("the binary runs")
    })
    .await
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "outbox retry --all failed: {text}");
    text
}

/// The outbox rows as the test follows them.
struct Row {
    attempts: i32,
    last_error: Option<String>,
    next_attempt_at: DateTime<Utc>,
    sent: bool,
    parked: bool,
}

async fn rows(db: &tokio_postgres::Client) -> Vec<Row> {
    db.query(
        "SELECT attempts, last_error, next_attempt_at, sent_at IS NOT NULL, failed_at IS NOT NULL
         FROM outbox_events ORDER BY id",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|row| Row {
        attempts: row.get(0),
        last_error: row.get(1),
        next_attempt_at: row.get(2),
        sent: row.get(3),
        parked: row.get(4),
    })
    .collect()
}

#[actix_web::test]
async fn nacked_events_back_off_park_and_are_delivered_once_requeued() {
    const MAX_ATTEMPTS: i32 = 3;
    const WRITES: i64 = 5;
    // The test runs every relay pass itself: an attempt is one pass over all the events.
    let app =
        spawn_app_without_relays(|settings| settings.outbox.max_attempts = MAX_ATTEMPTS).await;
    let refusing = RefusingQueue::bind(&app.settings.amqp.exchange).await;
    for n in 0..WRITES {
        let key = format!("nacked-{n}");
        app.post_entry(&key, &entry_body(n)).await.assert_created();
    }

    // Each attempt is nacked; the next is scheduled later (backoff), until the row parks.
    for attempt in 1..=MAX_ATTEMPTS {
        let released_at: DateTime<Utc> = app
            .db
            .query_one("SELECT clock_timestamp()", &[])
            .await
            .unwrap()
            .get(0);
        if attempt > 1 {
            // Skip the wait instead of sleeping through it.
            app.db
                .execute(
                    "UPDATE outbox_events SET next_attempt_at = now() WHERE failed_at IS NULL",
                    &[],
                )
                .await
                .unwrap();
        }
        assert_eq!(app.relay_until_empty().await, 0, "attempt {attempt}");
        let tried = format!("SELECT count(*) FROM outbox_events WHERE attempts = {attempt}");
        assert_eq!(count(&app.db, &tried).await, WRITES);
        for row in rows(&app.db).await {
            assert!(!row.sent, "a nacked event is never marked sent");
            let error = row.last_error.unwrap_or_default();
            assert!(error.contains("nacked"), "last_error: {error}");
            if attempt < MAX_ATTEMPTS {
                assert!(
                    !row.parked,
                    "parked after {attempt} of {MAX_ATTEMPTS} attempts"
                );
                assert!(
                    row.next_attempt_at > released_at,
                    "attempt {attempt}: the retry is scheduled after the failure, not at once"
                );
            } else {
                assert!(row.parked, "parked after {MAX_ATTEMPTS} attempts");
            }
        }
    }

    // Parked events stay parked, even when due.
    app.db
        .execute("UPDATE outbox_events SET next_attempt_at = now()", &[])
        .await
        .unwrap();
    assert_eq!(app.relay_until_empty().await, 0);
    for row in rows(&app.db).await {
        assert!(row.parked && !row.sent && row.attempts == MAX_ATTEMPTS);
    }
    // Parked events are not backlog.
    app.readyz_once(|ready| ready.json()["outbox_backlog"] == 0)
        .await;

    // The broker takes messages again; requeue the parked events as `outbox retry --all` does.
    refusing.delete().await;
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    // `retrysafe outbox retry --all`, the operator's command; its SQL is
    // `UPDATE outbox_events SET failed_at = NULL, attempts = 0, next_attempt_at = now()
    //  WHERE failed_at IS NOT NULL AND sent_at IS NULL`.
    let output = outbox_retry_all(&app.settings.database.url).await;
    assert!(
        output.contains(&format!("requeued {WRITES} event(s)")),
        "outbox retry --all: {output}"
    );
    assert_eq!(
        count(
            &app.db,
            "SELECT count(*) FROM outbox_events WHERE failed_at IS NOT NULL OR attempts > 0"
        )
        .await,
        0,
        "requeued with a fresh attempt count"
    );
    assert_eq!(app.relay_until_empty().await, WRITES as usize);
    let events = all_event_ids(&app.db).await;
    let mut received = HashSet::new();
    while received.len() < events.len() {
        let delivery = consumer
            .next(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| {
                panic!(
                    "{} of {} requeued events delivered",
                    received.len(),
                    events.len()
                )
            });
        received.insert(message_id(&delivery).parse::<Uuid>().unwrap());
    }
    assert_eq!(received, events);
    assert_eq!(count(&app.db, UNSENT).await, 0);
}

/// Whether `exchange` exists, asked as the daemon asks, on a connection of the test's own.
async fn exchange_exists(exchange: &str) -> bool {
    let connection = Connection::connect(AMQP_URL, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let exists = retrysafe::outbox::broker::exchange_exists(&channel, exchange)
        .await
        .expect("the broker answers a passive declare");
    let _ = connection.close(200, "done".into()).await;
    exists
}

/// The exchange deleted under a running daemon (by an operator, a broker reset or a cleanup
/// script): publishes fail with NOT_FOUND and close the channel, but the connection stays up,
/// and the daemon declares its exchange only when it opens a connection.
#[actix_web::test]
async fn a_deleted_exchange_is_declared_again_and_events_still_arrive() {
    let app = spawn_app_with(|settings| settings.outbox.max_attempts = 5).await;
    let exchange = app.settings.amqp.exchange.clone();
    let mut consumer = TestConsumer::bind(&exchange, "#").await;
    app.post_entry("before-delete", &entry_body(1))
        .await
        .assert_created();
    consumer
        .next(Duration::from_secs(30))
        .await
        .expect("delivered while the exchange exists");

    let connection = Connection::connect(AMQP_URL, ConnectionProperties::default())
        .await
        .unwrap();
    connection
        .create_channel()
        .await
        .unwrap()
        .exchange_delete(exchange.as_str().into(), Default::default())
        .await
        .unwrap();
    let _ = connection.close(200, "done".into()).await;
    let never_declared = format!("{exchange}.never-declared");
    assert!(!exchange_exists(&never_declared).await, "{never_declared}");

    app.post_entry("after-delete", &entry_body(2))
        .await
        .assert_created();
    // Let the relay fail and retry a few times (skipping its backoff).
    for attempt in 1..=3 {
        let tried = format!(
            "SELECT count(*) FROM outbox_events WHERE sent_at IS NOT NULL OR attempts >= {attempt}"
        );
        eventually(Duration::from_secs(30), || count_is(&app.db, &tried, 2)).await;
        app.db
            .execute(
                "UPDATE outbox_events SET next_attempt_at = now() WHERE sent_at IS NULL",
                &[],
            )
            .await
            .unwrap();
    }
    let last_error: Option<String> = app
        .db
        .query_one(
            "SELECT last_error FROM outbox_events WHERE idempotency_key = 'after-delete'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        exchange_exists(&exchange).await,
        "after 3 failed attempts the daemon has not declared its exchange again; last_error: {last_error:?}"
    );
}

/// A nack backs off by the event's nacks, not by all its failed attempts: an event that failed
/// four times for other reasons (a broker node down, say) waits at most 30 s after its first
/// nack, then at most 60 s after its second; `outbox retry` starts both counts again.
#[actix_web::test]
async fn a_nack_after_other_failures_backs_off_by_the_nacks_alone() {
    use retrysafe::db::Database;
    use retrysafe::outbox::store::{self, FailedAttempt, RelayStatements};

    let app = spawn_app_without_relays(|_| {}).await;
    app.post_entry("nacked-late", &entry_body(1))
        .await
        .assert_created();
    let db = Database::new(&app.config().database).unwrap();
    // One failed attempt of the event, nacked or not; returns its attempts, nacks and the
    // seconds until its next attempt.
    let fail = |nacked: bool| {
        let db = db.clone();
        async move {
            db.run(async |connection| {
                let statements = RelayStatements::prepare(connection).await?;
                let client: &tokio_postgres::Client = connection;
                client
                    .batch_execute("UPDATE outbox_events SET next_attempt_at = now()")
                    .await?;
                let claim = store::claim_due(client, &statements, 10, None).await?;
                assert_eq!(claim.events.len(), 1);
                let failure = FailedAttempt {
                    event: &claim.events[0],
                    error: "test".into(),
                    nacked,
                };
                let now = claim.database_now.expect("an event was claimed");
                store::mark_failed(client, &statements, &[failure], (1000, now)).await?;
                let row = client
                    .query_one(
                        "SELECT attempts, nacks,
                                extract(epoch FROM next_attempt_at - now())::float8
                         FROM outbox_events",
                        &[],
                    )
                    .await?;
                Ok((
                    row.get::<_, i32>(0),
                    row.get::<_, i32>(1),
                    row.get::<_, f64>(2),
                ))
            })
            .await
            .unwrap()
        }
    };
    for _ in 0..4 {
        let (_, nacks, _) = fail(false).await;
        assert_eq!(nacks, 0);
    }
    let (attempts, nacks, wait) = fail(true).await;
    assert_eq!((attempts, nacks), (5, 1));
    assert!(
        (15.0..=30.5).contains(&wait),
        "after the first nack: {wait} s"
    );
    let (attempts, nacks, wait) = fail(true).await;
    assert_eq!((attempts, nacks), (6, 2));
    assert!(
        (30.0..=60.5).contains(&wait),
        "after the second nack: {wait} s"
    );
    // A failure of another kind is scheduled by the attempts, as before.
    let (attempts, nacks, wait) = fail(false).await;
    assert_eq!((attempts, nacks), (7, 2));
    assert!(
        (16.0..=32.5).contains(&wait),
        "after a 7th failed attempt: {wait} s"
    );

    let event_id: Uuid = app
        .db
        .query_one("SELECT event_id FROM outbox_events", &[])
        .await
        .unwrap()
        .get(0);
    assert!(store::requeue_event(&app.db, event_id).await.unwrap());
    assert_eq!(
        count(
            &app.db,
            "SELECT count(*) FROM outbox_events WHERE attempts = 0 AND nacks = 0"
        )
        .await,
        1
    );
}
