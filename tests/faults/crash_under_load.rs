//! SIGKILL of the real binary while clients write and retry: a 2xx means the write happened
//! exactly once, its events are all published after a restart, and the inbox applies each once.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::Duration;

use futures_util::future::join_all;
use rand::Rng;
use retrysafe::inbox::Inbox;
use uuid::Uuid;

use crate::common::consumer::{message_id, TestConsumer};
use crate::common::daemon::spawn_binary;
use crate::common::helpers::{
    all_event_ids, assert_nothing_half_written, count, count_is, eventually, http_client, knob,
    post_raw, test_settings, TestResponse,
};

/// How long clients keep retrying one key before the test calls the key lost.
const CLIENT_DEADLINE: Duration = Duration::from_secs(90);
/// Bound on one request: a daemon that hangs is a failed attempt, and the client retries.
const REQUEST_LIMIT: Duration = Duration::from_secs(5);

/// What one client saw for one key.
#[derive(Default)]
struct KeyLog {
    /// The entry id of every 2xx, in order.
    ids: Vec<Uuid>,
    /// Whether each 2xx after the first said `Idempotency-Replayed: true`.
    later_ones_replayed: Vec<bool>,
    /// Failed attempts (transport errors, 503, 409 request-in-progress).
    retries: usize,
}

fn body_for(key: &str, n: usize) -> String {
    serde_json::json!({"kind": "crash.test", "data": {"key": key, "n": n, "pad": "x".repeat(n % 50)}})
        .to_string()
}

/// Sends `key` with `body` until a 2xx (or the deadline): on a transport error, a 5xx or a 409
/// `request-in-progress` it retries the same key and body, as a real client does. Any other
/// answer is a refusal the contract does not allow here, recorded in `unexpected`.
async fn until_2xx(
    client: &awc::Client,
    base: &str,
    key: &str,
    body: &str,
    log: &mut KeyLog,
    unexpected: &RefCell<Vec<String>>,
) -> Option<TestResponse> {
    let deadline = tokio::time::Instant::now() + CLIENT_DEADLINE;
    let mut backoff = Duration::from_millis(20);
    while tokio::time::Instant::now() < deadline {
        match post_raw(client, base, key, body, REQUEST_LIMIT).await {
            Ok(reply) if (200..300).contains(&reply.status) => return Some(reply),
            Ok(reply)
                if reply.status == 503
                    || (reply.status == 409
                        && reply.problem_slug().as_deref() == Some("request-in-progress")) => {}
            Ok(reply) => unexpected
                .borrow_mut()
                .push(format!("{key}: {}", reply.describe())),
            Err(_transport) => {}
        }
        log.retries += 1;
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(200));
    }
    None
}

#[actix_web::test]
async fn sigkill_under_load_loses_no_write_and_duplicates_none() {
    let kills = knob("RETRYSAFE_FAULT_KILLS", 3);
    let clients = knob("RETRYSAFE_FAULT_CLIENTS", 8);
    let keys_per_client = knob("RETRYSAFE_FAULT_KEYS", 30);
    let total_keys = clients * keys_per_client;

    let settings = test_settings();
    let mut consumer = TestConsumer::bind(&settings.amqp.exchange, "#").await;
    let mut daemon = spawn_binary(
        settings,
        // Two events per write: both must be written with it, or neither.
        &[("RETRYSAFE_EVENTS__AUDIT", "true".into())],
    )
    .await;
    let base = daemon.address.clone();

    let done = Rc::new(Cell::new(0usize));
    let unexpected = Rc::new(RefCell::new(Vec::<String>::new()));
    let load = join_all((0..clients).map(|client_index| {
        let done = done.clone();
        let unexpected = unexpected.clone();
        let base = base.clone();
        async move {
            let http = http_client(REQUEST_LIMIT);
            let mut logs: Vec<(String, KeyLog)> = Vec::new();
            for n in 0..keys_per_client {
                let key = format!("crash-{client_index}-{n}");
                let body = body_for(&key, client_index * keys_per_client + n);
                let mut log = KeyLog::default();
                // The write, then one replay: both retried until a 2xx.
                for attempt in 0..2 {
                    let Some(reply) =
                        until_2xx(&http, &base, &key, &body, &mut log, &unexpected).await
                    else {
                        break;
                    };
                    let answer = reply.json();
                    assert_eq!(
                        answer["data"]["key"], key,
                        "the answer is for this key's request: {answer}"
                    );
                    log.ids
                        .push(answer["id"].as_str().unwrap().parse().unwrap());
                    if attempt > 0 {
                        log.later_ones_replayed.push(reply.replayed());
                    }
                }
                logs.push((key, log));
                done.set(done.get() + 1);
            }
            logs
        }
    }));

    // Kills at random moments while the clients are busy: the i-th once a random share of the
    // keys (within the i-th slice of the run) is done, plus a random few milliseconds.
    let killer = async {
        let mut moments = Vec::new();
        for round in 0..kills {
            let slice = total_keys / (kills + 2);
            let threshold = slice * (round + 1) + rand::thread_rng().gen_range(0..slice.max(1));
            while done.get() < threshold && done.get() < total_keys {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(Duration::from_millis(rand::thread_rng().gen_range(0..40))).await;
            moments.push(done.get());
            daemon.kill();
            // Down for a moment: clients see refused connections and keep retrying.
            tokio::time::sleep(Duration::from_millis(rand::thread_rng().gen_range(0..200))).await;
            daemon.restart().await;
        }
        moments
    };
    let (logs, kill_moments) = futures_util::future::join(load, killer).await;
    let logs: Vec<(String, KeyLog)> = logs.into_iter().flatten().collect();
    let retries: usize = logs.iter().map(|(_, log)| log.retries).sum();
    eprintln!(
        "crash under load: {total_keys} keys, kills after {kill_moments:?} keys done, {retries} retried attempts"
    );
    assert!(
        unexpected.borrow().is_empty(),
        "answers a retrying client must never get: {:?}\n{}",
        unexpected.borrow(),
        daemon.log_tail(30)
    );

    // A final crash and restart: whatever the last run left unpublished goes out now.
    daemon.restart().await;
    let db = &daemon.db;

    // Every key: one record, one entry, two outbox rows; every 2xx carried the record's entry.
    assert_eq!(
        assert_nothing_half_written(db, 2).await,
        total_keys as i64,
        "one record per key"
    );
    assert_eq!(
        count(db, "SELECT count(*) FROM entries").await,
        total_keys as i64
    );
    let recorded: HashMap<String, Uuid> = db
        .query("SELECT key, entry_id FROM idempotency_records", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    for (key, log) in &logs {
        assert_eq!(
            log.ids.len(),
            2,
            "{key}: no 2xx within {CLIENT_DEADLINE:?}\n{}",
            daemon.log_tail(30)
        );
        let entry = recorded
            .get(key)
            .unwrap_or_else(|| panic!("{key} got a 2xx but has no record"));
        assert!(
            log.ids.iter().all(|id| id == entry),
            "{key}: 2xx answers carried {:?}, the record says {entry}",
            log.ids
        );
        assert!(
            log.later_ones_replayed.iter().all(|replayed| *replayed),
            "{key}: a request after a 2xx was not a replay"
        );
    }
    let wrong_data = count(
        db,
        "SELECT count(*) FROM entries WHERE data->>'key' <> idempotency_key",
    )
    .await;
    assert_eq!(wrong_data, 0, "an entry holds another key's request");

    // Every event is published (at least once) and ends marked sent.
    let events = all_event_ids(db).await;
    assert_eq!(events.len(), 2 * total_keys);
    let unsent = "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL";
    eventually(Duration::from_secs(60), || count_is(db, unsent, 0)).await;
    let db = &mut daemon.db;
    db.batch_execute("CREATE TABLE crash_effects (event_id uuid NOT NULL)")
        .await
        .unwrap();
    let inbox = Inbox::new("crash-under-load");
    let mut received = HashSet::new();
    let mut deliveries = 0usize;
    // Drain until every event arrived and then until the queue is quiet, so that redeliveries
    // of the crashes reach the inbox too.
    loop {
        let wait = if received.len() == events.len() {
            Duration::from_millis(500)
        } else {
            Duration::from_secs(30)
        };
        let Some(delivery) = consumer.next(wait).await else {
            break;
        };
        deliveries += 1;
        let event_id: Uuid = message_id(&delivery).parse().unwrap();
        received.insert(event_id);
        if let Some(transaction) = inbox.begin(db, event_id).await.unwrap() {
            transaction
                .execute("INSERT INTO crash_effects VALUES ($1)", &[&event_id])
                .await
                .unwrap();
            transaction.commit().await.unwrap();
        }
    }
    let missing: Vec<&Uuid> = events.difference(&received).take(5).collect();
    assert!(
        missing.is_empty(),
        "{} events never published, e.g. {missing:?}",
        events.len() - received.len().min(events.len())
    );
    assert!(
        received.is_subset(&events),
        "a message_id that is no outbox event"
    );
    eprintln!(
        "crash under load: {} events, {deliveries} deliveries ({} redelivered)",
        events.len(),
        deliveries - events.len()
    );
    assert_eq!(
        daemon.count("SELECT count(*) FROM crash_effects").await,
        events.len() as i64,
        "the inbox applies every event exactly once"
    );
    assert_eq!(
        daemon
            .count("SELECT count(DISTINCT event_id) FROM crash_effects")
            .await,
        events.len() as i64
    );
    assert!(daemon.is_running());
}
