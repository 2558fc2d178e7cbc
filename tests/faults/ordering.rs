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

// ---------------------------------------------------------------------------------------------
// The claim against a model: generated sequences of writes, relay batches (each event acked,
// failed or parked), backoff elapsing, an operator making every unsent row due, retries and
// skips, run on the real statements. Safety: every claimed event is its key's head (the lowest
// sequence neither sent nor skipped) and not parked. Liveness: once the parked are retried, the
// relays deliver everything, with no event left held.
// ---------------------------------------------------------------------------------------------

mod model {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRunner};
    use retrysafe::db::{Database, StorageError};
    use retrysafe::outbox::store::{self, FailedAttempt, OrderingKeys, RelayStatements, Skip};
    use uuid::Uuid;

    use crate::common::daemon::{spawn_app_without_relays, TestDaemon};

    const KEYS: usize = 3;

    /// Backoff elapses: every failed event is due now; held ones stay held.
    const BACKOFF_OVER: &str = "UPDATE outbox_events SET next_attempt_at = now()
        WHERE sent_at IS NULL AND failed_at IS NULL AND next_attempt_at <> 'infinity'";

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Outcome {
        Ack,
        Fail,
        Park,
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write(usize),
        Relay {
            limit: usize,
            outcomes: Vec<Outcome>,
        },
        /// Backoff elapses: failed events are due again (held ones stay held).
        Tick,
        /// An operator's `UPDATE ... SET next_attempt_at = now()` on every unsent row.
        Bump,
        Retry(usize),
        Skip(usize, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        let outcome = prop_oneof![
            6 => Just(Outcome::Ack),
            2 => Just(Outcome::Fail),
            1 => Just(Outcome::Park),
        ];
        prop_oneof![
            5 => (0..KEYS).prop_map(Op::Write),
            5 => (1usize..6, prop::collection::vec(outcome, 6))
                .prop_map(|(limit, outcomes)| Op::Relay { limit, outcomes }),
            2 => Just(Op::Tick),
            1 => Just(Op::Bump),
            1 => (0..KEYS).prop_map(Op::Retry),
            1 => (0..KEYS, 0usize..8).prop_map(|(key, which)| Op::Skip(key, which)),
        ]
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum State {
        Unsent,
        Parked,
        Sent,
        Skipped,
    }

    #[derive(Default)]
    struct Model {
        /// Per key, each write's event by sequence − 1.
        keys: [Vec<(Uuid, State)>; KEYS],
    }

    impl Model {
        fn head(&self, key: usize) -> Option<usize> {
            self.keys[key]
                .iter()
                .position(|(_, state)| matches!(state, State::Unsent | State::Parked))
        }
    }

    fn key_name(key: usize) -> String {
        format!("k{key}")
    }

    fn key_index(name: &str) -> usize {
        name[1..].parse().unwrap()
    }

    /// One relay batch as the relay runs it, the outcomes chosen by the case; returns the
    /// claimed events (key, sequence) with their outcome.
    async fn relay_batch(
        db: &Database,
        limit: usize,
        outcomes: &[Outcome],
    ) -> Result<Vec<(String, i64, Outcome)>, StorageError> {
        db.run(async |connection| {
            let statements = RelayStatements::prepare(connection).await?;
            let client: &tokio_postgres::Client = connection;
            client.batch_execute("BEGIN").await?;
            let claim = store::claim_due(client, &statements, limit, None).await?;
            let claimed = claim.events;
            let now = claim.database_now.unwrap_or_else(chrono::Utc::now);
            let mut sent = Vec::new();
            let (mut failed, mut parked) = (Vec::new(), Vec::new());
            let mut seen = Vec::new();
            for (event, outcome) in claimed.iter().zip(outcomes.iter().cycle()) {
                let attempt = || FailedAttempt {
                    event,
                    error: "test".into(),
                    nacked: false,
                };
                match outcome {
                    Outcome::Ack => sent.push(event),
                    Outcome::Fail => failed.push(attempt()),
                    Outcome::Park => parked.push(attempt()),
                }
                seen.push((
                    event.ordering_key.clone().expect("every write is ordered"),
                    event.sequence.expect("with a sequence"),
                    *outcome,
                ));
            }
            store::mark_sent(client, &statements, &sent).await?;
            store::mark_failed(client, &statements, &failed, (1000, now)).await?;
            store::mark_failed(client, &statements, &parked, (1, now)).await?;
            let advancing = OrderingKeys::of(sent.iter().copied());
            store::lock_keys(client, &statements, &advancing).await?;
            store::advance_keys(client, &statements, &advancing).await?;
            client.batch_execute("COMMIT").await?;
            Ok(seen)
        })
        .await
    }

    async fn run_case(
        app: &TestDaemon,
        db: &Database,
        case: usize,
        ops: &[Op],
    ) -> Result<(), String> {
        app.db
            .batch_execute(
                "TRUNCATE outbox_events, ordering_keys, entries, idempotency_records, outbox_skips",
            )
            .await
            .unwrap();
        let mut model = Model::default();
        let mut writes = 0;
        let relay = async |model: &mut Model, limit: usize, outcomes: &[Outcome]| {
            let seen = relay_batch(db, limit, outcomes)
                .await
                .map_err(|error| format!("relay batch: {error}"))?;
            let count = seen.len();
            for (name, sequence, outcome) in seen {
                let key = key_index(&name);
                let index = sequence as usize - 1;
                if model.head(key) != Some(index) || model.keys[key][index].1 != State::Unsent {
                    return Err(format!(
                        "claimed {name} #{sequence}, but the key's head is {:?} and the event is {:?}",
                        model.head(key).map(|head| head + 1),
                        model.keys[key].get(index)
                    ));
                }
                model.keys[key][index].1 = match outcome {
                    Outcome::Ack => State::Sent,
                    Outcome::Fail => State::Unsent,
                    Outcome::Park => State::Parked,
                };
            }
            Ok::<usize, String>(count)
        };
        for op in ops {
            match op {
                Op::Write(key) => {
                    writes += 1;
                    let body = serde_json::json!({"kind": "model", "data": {}, "ordering_key": key_name(*key)});
                    let created = app.post_entry(&format!("p{case}-{writes}"), &body).await;
                    let sequence = created.json()["sequence"].as_i64();
                    let expected = model.keys[*key].len() as i64 + 1;
                    if sequence != Some(expected) {
                        return Err(format!("write to k{key} got {sequence:?}, not {expected}"));
                    }
                    let event_id: Uuid = app
                        .db
                        .query_one(
                            "SELECT event_id FROM outbox_events WHERE ordering_key = $1 AND sequence = $2",
                            &[&key_name(*key), &expected],
                        )
                        .await
                        .unwrap()
                        .get(0);
                    model.keys[*key].push((event_id, State::Unsent));
                }
                Op::Relay { limit, outcomes } => {
                    relay(&mut model, *limit, outcomes).await?;
                }
                Op::Tick => {
                    app.db.execute(BACKOFF_OVER, &[]).await.unwrap();
                }
                Op::Bump => {
                    app.db
                        .execute(
                            "UPDATE outbox_events SET next_attempt_at = now()
                             WHERE sent_at IS NULL AND failed_at IS NULL",
                            &[],
                        )
                        .await
                        .unwrap();
                }
                Op::Retry(key) => {
                    if let Some(head) = model.head(*key) {
                        if model.keys[*key][head].1 == State::Parked {
                            let event_id = model.keys[*key][head].0;
                            let requeued = db
                                .run(async |connection| {
                                    store::requeue_event(&**connection, event_id).await
                                })
                                .await
                                .map_err(|error| error.to_string())?;
                            if !requeued {
                                return Err(format!("the parked head of k{key} was not requeued"));
                            }
                            model.keys[*key][head].1 = State::Unsent;
                        }
                    }
                }
                Op::Skip(key, which) => {
                    let events = &mut model.keys[*key];
                    if events.is_empty() {
                        continue;
                    }
                    let index = which % events.len();
                    let (event_id, state) = events[index];
                    let skipped = db
                        .run(async |connection| {
                            store::skip_event(connection, event_id, 0, "model").await
                        })
                        .await
                        .map_err(|error| error.to_string())?;
                    let expected_skip = matches!(state, State::Unsent | State::Parked);
                    if matches!(skipped, Skip::Skipped { .. }) != expected_skip {
                        return Err(format!(
                            "skip of k{key} #{}: {skipped:?} with the event {state:?}",
                            index + 1
                        ));
                    }
                    if expected_skip {
                        events[index].1 = State::Skipped;
                    }
                }
            }
        }
        // Liveness: the parked retried, backoff over, relays acking everything until idle.
        for key in 0..KEYS {
            for index in 0..model.keys[key].len() {
                if model.keys[key][index].1 == State::Parked {
                    let event_id = model.keys[key][index].0;
                    db.run(async |connection| store::requeue_event(&**connection, event_id).await)
                        .await
                        .map_err(|error| error.to_string())?;
                    model.keys[key][index].1 = State::Unsent;
                }
            }
        }
        loop {
            app.db.execute(BACKOFF_OVER, &[]).await.unwrap();
            if relay(&mut model, 100, &[Outcome::Ack]).await? == 0 {
                break;
            }
        }
        for key in 0..KEYS {
            if let Some(head) = model.head(key) {
                return Err(format!(
                    "k{key} #{} never delivered (held with nothing to release it?)",
                    head + 1
                ));
            }
        }
        Ok(())
    }

    #[actix_web::test]
    async fn the_claim_never_passes_a_keys_head_and_leaves_nothing_held() {
        let app = spawn_app_without_relays(|_| {}).await;
        let db = Database::new(&app.config().database).unwrap();
        let cases: u32 = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(24);
        let strategy = prop::collection::vec(op(), 1..40);
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        let mut case = 0;
        for _ in 0..cases {
            let mut tree = strategy.new_tree(&mut runner).unwrap();
            case += 1;
            let Err(first) = run_case(&app, &db, case, &tree.current()).await else {
                continue;
            };
            // Shrink as proptest does: simpler while it still fails, else back.
            let mut failure = (tree.current(), first);
            let mut shrinking = tree.simplify();
            while shrinking {
                case += 1;
                shrinking = match run_case(&app, &db, case, &tree.current()).await {
                    Err(error) => {
                        failure = (tree.current(), error);
                        tree.simplify()
                    }
                    Ok(()) => tree.complicate(),
                };
            }
            panic!("{}\nops: {:?}", failure.1, failure.0);
        }
    }
}
