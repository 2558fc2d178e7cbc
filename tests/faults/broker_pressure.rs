//! RabbitMQ pushing back rather than failing: a resource alarm that blocks publishers
//! (`connection.blocked`), and a consumer's queue that is full and rejects publishes (nacks).
//! The daemon waits on the same connection while blocked (no new connections, no attempts
//! counted, writes still accepted) and delivers everything once unblocked without a flood of
//! copies; a nack backs off slowly, since every other queue bound for the event got a copy.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use lapin::options::{QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};

use crate::common::consumer::{connect_and_declare, message_id, TestConsumer};
use crate::common::daemon::{spawn_binary, TestDaemon};
use crate::common::helpers::{count, entry_body, knob, test_settings};
use crate::common::lab::Lab;

/// Events per relay batch in these tests: small, so that a batch caught by the alarm is a
/// small share of the events.
const BATCH: usize = 50;

async fn write_entries(daemon: &TestDaemon, prefix: &str, count: usize) {
    for chunk in (0..count).collect::<Vec<_>>().chunks(50) {
        join_all(chunk.iter().map(|n| async move {
            daemon
                .post_entry(&format!("{prefix}-{n}"), &entry_body(*n as i64))
                .await
                .assert_created();
        }))
        .await;
    }
}

/// Connections the lab's broker has open (the test's consumer's and the daemon's).
async fn broker_connections(lab: &Lab) -> usize {
    lab.act(&["rabbitmqctl", "1", "list_connections", "pid"])
        .await
        .lines()
        .filter(|line| line.contains('<'))
        .count()
}

#[actix_web::test]
async fn a_blocked_broker_is_waited_for_on_one_connection_and_unblocking_brings_no_flood() {
    let lab = Lab::start("rabbit-one");
    let url = format!(
        "amqp://guest:guest@127.0.0.1:{}/%2f",
        lab.var("HA_AMQP_PORT1")
    );
    let settings = test_settings();
    let mut consumer = TestConsumer::bind_at(&url, &settings.amqp.exchange, "#").await;
    let daemon = spawn_binary(
        settings,
        &[
            ("RETRYSAFE_AMQP__URL", url.clone()),
            ("RETRYSAFE_OUTBOX__CONFIRM_TIMEOUT", "2s".into()),
            ("RETRYSAFE_OUTBOX__BATCH_SIZE", BATCH.to_string()),
        ],
    )
    .await;
    write_entries(&daemon, "before", 100).await;
    assert_eq!(consumer.take(100, Duration::from_secs(30)).await.len(), 100);

    // A memory alarm: the broker blocks every connection that publishes.
    lab.act(&[
        "rabbitmqctl",
        "1",
        "set_vm_memory_high_watermark",
        "absolute",
        "1",
    ])
    .await;
    // Writes go on being accepted while the broker blocks, and their events wait. For three
    // confirm timeouts at least (RETRYSAFE_BLOCKED_SECONDS for a long run, which prints what
    // the daemon holds every 30 s; with RETRYSAFE_TEST_DAEMON, of another build), writes go
    // on, one every 50 ms.
    write_entries(&daemon, "during", 400).await;
    let mut written = 400;
    let hold = Duration::from_secs(knob("RETRYSAFE_BLOCKED_SECONDS", 6) as u64);
    let blocked_at = tokio::time::Instant::now();
    while blocked_at.elapsed() < hold {
        let step = tokio::time::Instant::now();
        while step.elapsed() < Duration::from_secs(30) && blocked_at.elapsed() < hold {
            daemon
                .post_entry(&format!("during-{written}"), &entry_body(written as i64))
                .await
                .assert_created();
            written += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let rss = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid()))
            .unwrap_or_default()
            .lines()
            .find(|line| line.starts_with("VmRSS"))
            .unwrap_or_default()
            .to_owned();
        eprintln!(
            "blocked for {:?}: {} broker connections, daemon {rss}, most attempts of an event {}",
            blocked_at.elapsed(),
            broker_connections(&lab).await,
            count(
                &daemon.db,
                "SELECT coalesce(max(attempts), 0)::bigint FROM outbox_events"
            )
            .await
        );
    }
    let ready = daemon
        .readyz_once(|ready| ready.json()["broker"] == "blocked")
        .await;
    assert_eq!(
        ready.status, 200,
        "a blocked broker does not make the daemon unready"
    );
    let reason = ready.json()["broker_blocked_reason"].to_string();
    assert!(reason.contains("memory"), "{reason}");
    // Still one connection of the daemon's, no attempt counted, nothing parked, and the
    // metrics say blocked, not disconnected.
    assert_eq!(
        broker_connections(&lab).await,
        2,
        "the consumer's connection and the daemon's one"
    );
    assert_eq!(
        count(
            &daemon.db,
            "SELECT count(*) FROM outbox_events WHERE attempts > 0 OR failed_at IS NOT NULL"
        )
        .await,
        0,
        "flow control is not a failed attempt"
    );
    assert_eq!(daemon.metric("retrysafe_broker_blocked").await, 1.0);
    assert_eq!(daemon.metric("retrysafe_broker_connected").await, 1.0);
    let unsent_while_blocked = count(
        &daemon.db,
        "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL",
    )
    .await;
    assert!(unsent_while_blocked > 0);

    // The alarm clears: everything arrives, with at most the copies of the batches that were
    // in flight when the broker blocked (two per relay).
    lab.act(&["rabbitmqctl", "1", "set_vm_memory_high_watermark", "0.4"])
        .await;
    let mut copies: HashMap<String, usize> = HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while copies.len() < written {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {written} events received two minutes after the alarm cleared",
            copies.len()
        );
        if let Some(delivery) = consumer.next(Duration::from_millis(500)).await {
            *copies.entry(message_id(&delivery)).or_default() += 1;
        }
    }
    // Late copies, if any, come within moments.
    while let Some(delivery) = consumer.next(Duration::from_secs(3)).await {
        *copies.entry(message_id(&delivery)).or_default() += 1;
    }
    let duplicates: usize = copies.values().map(|copies| copies - 1).sum();
    eprintln!(
        "blocked broker: {unsent_while_blocked} events waited, {} received, {duplicates} duplicate deliveries",
        copies.len()
    );
    let in_flight_at_most = 2 * 2 * BATCH;
    assert!(
        duplicates <= in_flight_at_most,
        "{duplicates} duplicates: more than the {in_flight_at_most} events of the batches in flight"
    );
    daemon
        .readyz_once(|ready| ready.json()["broker"] == "connected")
        .await;
    assert_eq!(daemon.metric("retrysafe_broker_blocked").await, 0.0);
    let log = daemon.log_text();
    assert_eq!(
        log.matches("the broker blocks publishing").count(),
        1,
        "one warning when the block starts: {}",
        daemon.log_tail(40)
    );
    assert_eq!(
        log.matches("the broker unblocked publishing").count(),
        1,
        "one line when it ends"
    );
}

/// Copies per event a queue full for `window` costs each other bound queue at most: the
/// attempts whose earliest start (half the backoff's ceiling) falls within the window.
fn nack_copies_at_most(window: Duration) -> usize {
    let mut at = Duration::ZERO;
    let mut attempts = 1;
    loop {
        let ceiling = Duration::from_secs(30)
            .saturating_mul(1 << (attempts - 1).min(20))
            .min(Duration::from_secs(30 * 60));
        at += ceiling / 2;
        if at > window {
            return attempts;
        }
        attempts += 1;
    }
}

#[actix_web::test]
async fn a_full_queue_costs_the_other_queues_few_copies() {
    let window = Duration::from_secs(knob("RETRYSAFE_FULL_QUEUE_SECONDS", 12) as u64);
    let settings = test_settings();
    // A queue limited to 100 messages that refuses more (nobody consumes it), and a normal one,
    // both bound for every event.
    let (_connection, channel) = connect_and_declare(&settings.amqp.exchange).await;
    let mut limits = FieldTable::default();
    limits.insert("x-max-length".into(), AMQPValue::LongInt(100));
    limits.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    let full = channel
        .queue_declare("".into(), QueueDeclareOptions::exclusive(), limits)
        .await
        .unwrap();
    channel
        .queue_bind(
            full.name().clone(),
            settings.amqp.exchange.as_str().into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut other = TestConsumer::bind(&settings.amqp.exchange, "#").await;
    let daemon = spawn_binary(settings, &[("RETRYSAFE_OUTBOX__BATCH_SIZE", "100".into())]).await;
    write_entries(&daemon, "full", 300).await;
    let started = tokio::time::Instant::now();
    let mut copies: HashMap<String, usize> = HashMap::new();
    while started.elapsed() < window {
        if let Some(delivery) = other.next(Duration::from_millis(500)).await {
            *copies.entry(message_id(&delivery)).or_default() += 1;
        }
    }
    assert_eq!(copies.len(), 300, "the other queue got every event");
    let most = copies.values().max().copied().unwrap_or(0);
    let total: usize = copies.values().sum();
    let bound = nack_copies_at_most(window + Duration::from_secs(5));
    eprintln!(
        "full queue for {window:?}: {total} deliveries of 300 events to the other queue, at most {most} copies of one (bound {bound})"
    );
    assert!(
        most <= bound,
        "an event reached the other queue {most} times in {window:?}"
    );
    // The refused ones are counted apart and scheduled on the nack's slow schedule.
    let nacked = count(
        &daemon.db,
        "SELECT count(*) FROM outbox_events
         WHERE sent_at IS NULL AND last_error LIKE 'nacked by the broker%'",
    )
    .await;
    assert!(nacked >= 190, "{nacked} events nacked and waiting");
    let nacks = daemon
        .metric("retrysafe_outbox_publishes_total{outcome=\"nacked\"}")
        .await;
    assert!(nacks >= nacked as f64, "{nacks} nacks counted");
}
