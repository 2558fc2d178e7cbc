//! Ordered delivery under concurrency and faults: a checker consumes one queue and asserts
//! that, per ordering key, first deliveries come in commit order with a gapless sequence —
//! with three daemons writing the same keys, and with a daemon killed (SIGKILL) and its broker
//! connection cut while clients write and retry.

use std::cell::Cell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use futures_util::future::join_all;
use rand::Rng;

use crate::common::consumer::TestConsumer;
use crate::common::daemon::{spawn_app_with, spawn_binary, spawn_second_app, TestDaemon};
use crate::common::helpers::{
    amqp_url_through, http_client, knob, post_raw, test_settings, AMQP_HOST_PORT,
};
use crate::common::ordering::OrderChecker;
use crate::common::proxy::TcpProxy;

/// How long a client retries one write before the test calls it lost.
const CLIENT_DEADLINE: Duration = Duration::from_secs(90);
const REQUEST_LIMIT: Duration = Duration::from_secs(5);
/// How long the checker waits for the next delivery before it calls the rest lost.
const DELIVERY_WAIT: Duration = Duration::from_secs(60);

fn ordered_body(key: &str, n: usize) -> String {
    serde_json::json!({"kind": "ledger.posted", "data": {"key": key, "n": n}, "ordering_key": key})
        .to_string()
}

/// Sends the write until a 2xx (retrying transport errors, 503, 409 request-in-progress and
/// 429 with the same key and body, as a client does); returns its sequence.
async fn write_until_2xx(client: &awc::Client, base: &str, key: &str, body: &str) -> i64 {
    let deadline = tokio::time::Instant::now() + CLIENT_DEADLINE;
    let mut backoff = Duration::from_millis(20);
    while tokio::time::Instant::now() < deadline {
        match post_raw(client, base, key, body, REQUEST_LIMIT).await {
            Ok(reply) if reply.status == 201 => {
                return reply.json()["sequence"]
                    .as_i64()
                    .unwrap_or_else(|| panic!("{key}: no sequence in {}", reply.describe()));
            }
            Ok(reply)
                if matches!(reply.status, 503 | 429)
                    || reply.problem_slug().as_deref() == Some("request-in-progress") => {}
            Ok(reply) => panic!("{key}: unexpected answer {}", reply.describe()),
            Err(_transport) => {}
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(200));
    }
    panic!("{key}: no 2xx within {CLIENT_DEADLINE:?}");
}

/// Consumes until `expected` first deliveries arrived (or none came for [`DELIVERY_WAIT`]).
async fn check_deliveries(consumer: &mut TestConsumer, expected: usize) -> OrderChecker {
    let mut checker = OrderChecker::default();
    while checker.first_deliveries() < expected {
        let Some(delivery) = consumer.next(DELIVERY_WAIT).await else {
            break;
        };
        checker.observe(&delivery);
    }
    checker
}

/// Each key's sequences in the entries table are 1..=n.
async fn assert_gapless_in_database(app: &TestDaemon, writes_per_key: &HashMap<String, usize>) {
    for row in app
        .db
        .query(
            "SELECT ordering_key, count(*), min(sequence), max(sequence), count(DISTINCT sequence)
             FROM entries GROUP BY ordering_key",
            &[],
        )
        .await
        .unwrap()
    {
        let key: String = row.get(0);
        let count: i64 = row.get(1);
        assert_eq!(count as usize, writes_per_key[&key], "{key}");
        assert_eq!(
            (
                row.get::<_, i64>(2),
                row.get::<_, i64>(3),
                row.get::<_, i64>(4)
            ),
            (1, count, count),
            "{key}: sequences 1..={count}, each once"
        );
    }
}

#[actix_web::test]
async fn three_daemons_writing_the_same_keys_deliver_each_key_in_commit_order() {
    let keys = knob("RETRYSAFE_FAULT_ORDERED_KEYS", 30);
    let writes = knob("RETRYSAFE_FAULT_ORDERED_WRITES", 12);
    let first = spawn_app_with(|settings| settings.database.pool_size = 6).await;
    let second = spawn_second_app(&first).await;
    let third = spawn_second_app(&first).await;
    let daemons = [&first, &second, &third];
    let mut consumer = TestConsumer::bind(&first.settings.amqp.exchange, "#").await;

    // Every write of every key at once, each to one of the daemons: the writes of one key
    // race each other through three daemons' writers, and their events through nine relays.
    let client = http_client(REQUEST_LIMIT);
    let answers = join_all(
        (0..keys)
            .flat_map(|k| (0..writes).map(move |n| (k, n)))
            .map(|(k, n)| {
                let base = daemons[(k + n) % daemons.len()].address.clone();
                let client = &client;
                async move {
                    let key = format!("account-{k}");
                    let sequence = write_until_2xx(
                        client,
                        &base,
                        &format!("{key}/{n}"),
                        &ordered_body(&key, n),
                    )
                    .await;
                    (key, sequence)
                }
            }),
    )
    .await;
    let mut sequences: HashMap<String, Vec<i64>> = HashMap::new();
    for (key, sequence) in answers {
        sequences.entry(key).or_default().push(sequence);
    }
    for (key, mut got) in sequences {
        got.sort_unstable();
        assert_eq!(got, (1..=writes as i64).collect::<Vec<_>>(), "{key}");
    }

    let checker = check_deliveries(&mut consumer, keys * writes).await;
    assert_eq!(checker.out_of_order(1), Vec::<String>::new());
    assert_eq!(checker.first_deliveries(), keys * writes);
    let writes_per_key: HashMap<String, usize> = (0..keys)
        .map(|k| (format!("account-{k}"), writes))
        .collect();
    assert_gapless_in_database(&first, &writes_per_key).await;
}

#[actix_web::test]
async fn sigkill_and_broker_cuts_keep_each_keys_first_deliveries_in_order() {
    let clients = knob("RETRYSAFE_FAULT_ORDERED_CLIENTS", 6);
    let writes_per_client = knob("RETRYSAFE_FAULT_ORDERED_WRITES", 25);
    let keys = 8;
    let kills = 2;
    let proxy = TcpProxy::start(AMQP_HOST_PORT.parse::<SocketAddr>().unwrap()).await;
    let settings = test_settings();
    let mut consumer = TestConsumer::bind(&settings.amqp.exchange, "#").await;
    let mut daemon = spawn_binary(
        settings,
        &[
            ("RETRYSAFE_AMQP__URL", amqp_url_through(proxy.port)),
            // Relays poll often, so that events are in flight when the faults come.
            ("RETRYSAFE_OUTBOX__POLL_INTERVAL", "50ms".into()),
        ],
    )
    .await;
    let base = daemon.address.clone();

    // Clients write to a few shared keys, one write after another each, retrying each until a
    // 2xx: writes of one key come from several clients, interleaved.
    let total = clients * writes_per_client;
    let done = Rc::new(Cell::new(0usize));
    let load = join_all((0..clients).map(|c| {
        let base = base.clone();
        let done = done.clone();
        async move {
            let client = http_client(REQUEST_LIMIT);
            let mut written = Vec::new();
            for n in 0..writes_per_client {
                let key = format!("ledger-{}", (c * 7 + n) % keys);
                let body = ordered_body(&key, c * writes_per_client + n);
                write_until_2xx(&client, &base, &format!("c{c}-{n}"), &body).await;
                written.push(key);
                done.set(done.get() + 1);
            }
            written
        }
    }));
    // Faults while the load runs: the broker connection cut and restored, then the daemon
    // killed and restarted, in turns.
    let faults = async {
        for round in 0..kills * 2 {
            let threshold = total * (round + 1) / (kills * 2 + 2);
            while done.get() < threshold {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if round % 2 == 0 {
                proxy.cut();
                tokio::time::sleep(Duration::from_millis(
                    rand::thread_rng().gen_range(200..800),
                ))
                .await;
                proxy.restore();
            } else {
                daemon.kill();
                tokio::time::sleep(Duration::from_millis(rand::thread_rng().gen_range(0..200)))
                    .await;
                daemon.restart().await;
            }
        }
    };
    let (written, ()) = futures_util::future::join(load, faults).await;
    let mut writes_per_key: HashMap<String, usize> = HashMap::new();
    for key in written.into_iter().flatten() {
        *writes_per_key.entry(key).or_default() += 1;
    }

    let checker = check_deliveries(&mut consumer, total).await;
    eprintln!(
        "ordered under faults: {total} writes over {keys} keys, {} redelivered copies",
        checker.copies
    );
    assert_eq!(
        checker.out_of_order(1),
        Vec::<String>::new(),
        "{}",
        daemon.log_tail(20)
    );
    assert_eq!(
        checker.per_key(),
        writes_per_key,
        "every write's event, once first\n{}",
        daemon.log_tail(20)
    );
    assert_gapless_in_database(&daemon, &writes_per_key).await;
}
