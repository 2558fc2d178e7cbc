//! PostgreSQL faults under load: connections cut and restored through a proxy, and statements
//! stuck behind locks. Requests fail with 503, nothing is half-written, the pool recovers
//! without a restart, and the same keys then succeed.

use std::cell::Cell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use futures_util::future::join_all;
use rand::Rng;
use uuid::Uuid;

use crate::common::consumer::TestConsumer;
use crate::common::daemon::{spawn_app_with, TestDaemon};
use crate::common::helpers::{
    assert_nothing_half_written, count, entry_body, http_client, knob, post_bounded, post_raw,
    reach_database_through, LockHolder, TestResponse, PG_HOST_PORT,
};
use crate::common::proxy::TcpProxy;

/// Hang guard for one request: far above the daemon's own bounds (connect 1s, statements 5s).
const REQUEST_LIMIT: Duration = Duration::from_secs(30);

fn body(key: &str) -> String {
    serde_json::json!({"kind": "db.fault", "data": {"key": key}}).to_string()
}

/// Every answer during a database fault is 201 or a 503 `storage-unavailable` with
/// problem+json and `Retry-After`; a transport error or anything else is a failure.
fn check_answer(key: &str, answer: &Result<TestResponse, String>) -> Result<bool, String> {
    match answer {
        Ok(reply) if reply.status == 201 => {
            let json = reply.json();
            if json["data"]["key"] != key {
                return Err(format!("{key}: answered with another key's entry: {json}"));
            }
            Ok(true)
        }
        Ok(reply) if reply.is_storage_unavailable() => Ok(false),
        Ok(reply) => Err(format!("{key}: {}", reply.describe())),
        Err(error) => Err(format!("{key}: {error}")),
    }
}

#[actix_web::test]
async fn cutting_the_database_under_load_gives_201_or_503_and_leaves_nothing_half_written() {
    let cuts = knob("RETRYSAFE_FAULT_ROUNDS", 4);
    let proxy = TcpProxy::start(PG_HOST_PORT.parse::<SocketAddr>().unwrap()).await;
    let port = proxy.port;
    let app = spawn_app_with(|settings| {
        reach_database_through(settings, port);
        settings.database.pool_size = 8;
        settings.events.audit = true;
        // A write that waits for a connection longer than this gets 503: the last cut lasts
        // longer, so that the fault is met however the other cuts fall between batches.
        settings.database.connect_timeout = Duration::from_secs(1);
    })
    .await;
    // The test's own connection goes straight to PostgreSQL, not through the proxy.
    let db = &app.db;
    // Somewhere for the events to go, so that the relay does not retry unroutable ones.
    let _consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;

    let stop = Rc::new(Cell::new(false));
    let load = join_all((0..6).map(|client| {
        let stop = stop.clone();
        let address = app.address.clone();
        async move {
            let http = http_client(REQUEST_LIMIT);
            let mut answers = Vec::new();
            for n in 0..20_000 {
                if stop.get() {
                    break;
                }
                let key = format!("db-{client}-{n}");
                let answer = post_raw(&http, &address, &key, &body(&key), REQUEST_LIMIT).await;
                answers.push((key, answer));
            }
            answers
        }
    }));
    let chaos = async {
        for round in 0..cuts {
            tokio::time::sleep(Duration::from_millis(
                rand::thread_rng().gen_range(200..500),
            ))
            .await;
            proxy.cut();
            // A cut may fall between two batches, with no commit in flight; the last one
            // outlasts the wait for a connection (database.connect_timeout, above).
            let cut_for = if round + 1 == cuts {
                1500
            } else {
                rand::thread_rng().gen_range(200..600)
            };
            tokio::time::sleep(Duration::from_millis(cut_for)).await;
            proxy.restore();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.set(true);
    };
    let (answers, ()) = futures_util::future::join(load, chaos).await;
    let answers: Vec<(String, Result<TestResponse, String>)> =
        answers.into_iter().flatten().collect();

    let mut created = HashMap::new();
    let mut refused = Vec::new();
    let mut wrong = Vec::new();
    for (key, answer) in &answers {
        match check_answer(key, answer) {
            Ok(true) => {
                let id: Uuid = answer.as_ref().unwrap().json()["id"]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                created.insert(key.clone(), id);
            }
            Ok(false) => refused.push(key.clone()),
            Err(problem) => wrong.push(problem),
        }
    }
    assert!(wrong.is_empty(), "answers other than 201 or 503: {wrong:?}");
    assert!(
        !refused.is_empty(),
        "no request met a cut connection: the test did not exercise the fault"
    );
    assert!(!created.is_empty());

    // Nothing half-written; every 201 is in the tables with the entry it announced.
    let records = assert_nothing_half_written(db, 2).await;
    for (key, id) in &created {
        let row = db
            .query_opt(
                "SELECT entry_id FROM idempotency_records WHERE key = $1",
                &[key],
            )
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{key} got a 201 but has no record"));
        assert_eq!(row.get::<_, Uuid>(0), *id, "{key}");
    }
    // A 503 whose commit reached the server before the connection broke left a record: the
    // outcome was lost, not the write. Its retry must be a replay of that record.
    let mut committed_before_503 = HashMap::new();
    for key in &refused {
        if let Some(row) = db
            .query_opt(
                "SELECT entry_id FROM idempotency_records WHERE key = $1",
                &[key],
            )
            .await
            .unwrap()
        {
            committed_before_503.insert(key.clone(), row.get::<_, Uuid>(0));
        }
    }
    assert_eq!(records as usize, created.len() + committed_before_503.len());

    // The same daemon, same pool: the refused keys now succeed, once each.
    let http = http_client(REQUEST_LIMIT);
    for key in &refused {
        let mut reply = None;
        for _ in 0..100 {
            let answer = post_raw(&http, &app.address, key, &body(key), REQUEST_LIMIT).await;
            match check_answer(key, &answer) {
                Ok(true) => {
                    reply = answer.ok();
                    break;
                }
                // The first requests after a restore may still meet a connection the pool
                // has not yet found broken.
                Ok(false) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(problem) => panic!("retry after the fault: {problem}"),
            }
        }
        let reply = reply.unwrap_or_else(|| panic!("{key}: still 503 after the database is back"));
        let id: Uuid = reply.json()["id"].as_str().unwrap().parse().unwrap();
        match committed_before_503.get(key) {
            Some(earlier) => {
                assert_eq!(id, *earlier, "{key}: the retry replays the committed write");
                assert!(reply.replayed(), "{key}");
            }
            None => assert!(
                !reply.replayed(),
                "{key}: nothing was saved, so it runs afresh"
            ),
        }
    }
    let records = assert_nothing_half_written(db, 2).await;
    assert_eq!(records as usize, created.len() + refused.len());
    app.readyz_once(|ready| ready.status == 200).await;
    eprintln!(
        "database cuts: {} answers, {} created, {} refused with 503 ({} of them committed before the connection broke)",
        answers.len(),
        created.len(),
        refused.len(),
        committed_before_503.len()
    );
}

async fn app_with_short_statement_timeout() -> TestDaemon {
    spawn_app_with(|settings| {
        settings.database.statement_timeout = Duration::from_millis(500);
    })
    .await
}

async fn post_entry_bounded(app: &TestDaemon, key: &str, n: i64) -> TestResponse {
    post_bounded(&app.address, key, &entry_body(n).to_string(), REQUEST_LIMIT).await
}

#[actix_web::test]
async fn a_write_blocked_by_a_table_lock_gives_503_and_succeeds_once_the_lock_is_gone() {
    let app = app_with_short_statement_timeout().await;
    post_entry_bounded(&app, "before-lock", 0)
        .await
        .assert_created();

    let lock = LockHolder::take(
        &app.database.name,
        "LOCK TABLE idempotency_records IN ACCESS EXCLUSIVE MODE",
    )
    .await;
    for _ in 0..2 {
        let reply = post_entry_bounded(&app, "locked-1", 1).await;
        assert!(
            reply.is_storage_unavailable(),
            "a write stuck behind a lock: {}",
            reply.describe()
        );
    }
    lock.release().await;

    assert_eq!(app.row_counts().await, (1, 1, 1), "the 503s wrote nothing");
    let reply = post_entry_bounded(&app, "locked-1", 1).await;
    reply.assert_created();
    assert!(!reply.replayed(), "the retry runs afresh");
    assert_eq!(app.row_counts().await, (2, 2, 2));
    app.readyz_once(|ready| ready.status == 200).await;
}

#[actix_web::test]
async fn a_write_waiting_on_another_sessions_uncommitted_claim_of_its_key_gives_503_then_succeeds()
{
    let app = app_with_short_statement_timeout().await;
    // Another process has claimed the key and is stuck before its commit: its record is an
    // uncommitted row that the daemon's INSERT ... ON CONFLICT must wait for.
    let lock = LockHolder::claim(&app.database.name, "row-locked").await;
    let reply = post_entry_bounded(&app, "row-locked", 1).await;
    assert!(
        reply.is_storage_unavailable(),
        "a write waiting on a stuck claim of its key: {}",
        reply.describe()
    );
    // Other keys are not blocked by it.
    post_entry_bounded(&app, "free-key", 2)
        .await
        .assert_created();
    lock.release().await;

    let reply = post_entry_bounded(&app, "row-locked", 1).await;
    reply.assert_created();
    assert!(!reply.replayed());
    assert_eq!(app.row_counts().await, (2, 2, 2));
    assert_eq!(
        count(
            &app.db,
            "SELECT count(*) FROM idempotency_records WHERE key = 'row-locked' AND entry_id IS NOT NULL"
        )
        .await,
        1
    );
}

/// A proxy to PostgreSQL that, once armed, lets one write's claim statement through and then
/// cuts the connection before the server's answer comes back: the writer sends that statement
/// outside an explicit transaction, so the server commits it before answering; the commit
/// happens, the daemon never learns it. (What a network fault at the worst moment does.)
struct CommitAckDropper {
    port: u16,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    fired: std::sync::Arc<std::sync::atomic::AtomicBool>,
    accept_loop: tokio::task::JoinHandle<()>,
}

/// The name of the statement that a Parse message in `chunk` prepares with `sql`, if any: the
/// C string just before the query text (`'P'`, length, name, query), which tokio-postgres
/// spells `s<number>`.
fn prepared_name(chunk: &[u8], sql: &[u8]) -> Option<Vec<u8>> {
    let query = chunk.windows(sql.len()).position(|w| w == sql)?;
    let name_end = query.checked_sub(1)?;
    let digits = chunk[..name_end]
        .iter()
        .rev()
        .take_while(|byte| byte.is_ascii_digit())
        .count();
    let name_start = name_end.checked_sub(digits + 1)?;
    (digits > 0 && chunk[name_start] == b's').then(|| chunk[name_start..name_end].to_vec())
}

/// Whether `chunk` holds a Bind message of the statement `name` (`'B'`, length, the unnamed
/// portal's empty C string, then the statement's name).
fn binds(chunk: &[u8], name: &[u8]) -> bool {
    let mut pattern = vec![0u8];
    pattern.extend_from_slice(name);
    pattern.push(0);
    chunk
        .windows(pattern.len())
        .enumerate()
        .any(|(at, w)| w == pattern.as_slice() && at >= 5 && chunk[at - 5] == b'B')
}

impl CommitAckDropper {
    async fn start(target: &str) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let fired = Arc::new(AtomicBool::new(false));
        // The names the daemon prepared the claim statement under (one per connection).
        let claims: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let target = target.to_owned();
        let (armed_, fired_) = (armed.clone(), fired.clone());
        let accept_loop = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                    continue;
                };
                let (armed, fired, claims) = (armed_.clone(), fired_.clone(), claims.clone());
                tokio::spawn(async move {
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let mute = Arc::new(AtomicBool::new(false));
                    let mute_ = mute.clone();
                    let upstream = async move {
                        let mut buffer = vec![0u8; 64 * 1024];
                        loop {
                            let n = match client_read.read(&mut buffer).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            let chunk = &buffer[..n];
                            if let Some(name) = prepared_name(chunk, b"\nWITH input AS (") {
                                claims.lock().unwrap().push(name);
                            }
                            let runs_claim =
                                claims.lock().unwrap().iter().any(|name| binds(chunk, name));
                            let drop_answer = runs_claim && armed.swap(false, Ordering::SeqCst);
                            if drop_answer {
                                // Silence the answer before the server can send it.
                                mute_.store(true, Ordering::SeqCst);
                            }
                            if server_write.write_all(chunk).await.is_err() {
                                return;
                            }
                            if drop_answer {
                                // Let the server run and commit the claim, then cut both sides.
                                tokio::time::sleep(Duration::from_millis(300)).await;
                                fired.store(true, Ordering::SeqCst);
                                return;
                            }
                        }
                    };
                    let downstream = async move {
                        let mut buffer = vec![0u8; 64 * 1024];
                        loop {
                            let n = match server_read.read(&mut buffer).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if mute.load(Ordering::SeqCst) {
                                continue;
                            }
                            if client_write.write_all(&buffer[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    // Either side ending ends both: the sockets drop together.
                    tokio::select! {
                        () = upstream => {}
                        () = downstream => {}
                    }
                });
            }
        });
        Self {
            port,
            armed,
            fired,
            accept_loop,
        }
    }

    fn arm(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn fired(&self) -> bool {
        self.fired.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for CommitAckDropper {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

async fn app_behind_commit_ack_dropper() -> (TestDaemon, CommitAckDropper) {
    let dropper = CommitAckDropper::start(PG_HOST_PORT).await;
    let port = dropper.port;
    let app = spawn_app_with(|settings| {
        reach_database_through(settings, port);
        // The proxy reads the protocol to find the COMMIT: no TLS on this connection.
        settings.database.url.push_str("?sslmode=disable");
    })
    .await;
    (app, dropper)
}

#[actix_web::test]
async fn a_write_whose_commit_acknowledgement_is_lost_is_replayed_by_its_retry() {
    let (app, dropper) = app_behind_commit_ack_dropper().await;
    dropper.arm();
    let body = entry_body(7);
    let lost = post_entry_bounded(&app, "ack-lost", 7).await;
    assert!(dropper.fired(), "the proxy cut a commit's answer");
    assert!(
        lost.is_storage_unavailable(),
        "an unknown commit outcome is a 503: {}",
        lost.describe()
    );
    // The write did happen, whole.
    assert_eq!(app.row_counts().await, (1, 1, 1));
    assert_nothing_half_written(&app.db, 1).await;
    let committed: Uuid = app
        .db
        .query_one(
            "SELECT entry_id FROM idempotency_records WHERE key = 'ack-lost'",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    // The client retries the same key: it gets the committed write, not a second one.
    let mut reply = None;
    for _ in 0..50 {
        let answer = post_entry_bounded(&app, "ack-lost", 7).await;
        if answer.status != 503 {
            reply = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reply = reply.expect("the retry succeeds once the pool has a working connection");
    reply.assert_created();
    assert!(
        reply.replayed(),
        "the retry is a replay of the committed write"
    );
    assert_eq!(reply.json()["id"], committed.to_string());
    assert_eq!(reply.json()["data"], body["data"]);
    assert_eq!(app.row_counts().await, (1, 1, 1));
}

#[actix_web::test]
async fn a_503_after_an_unknown_commit_outcome_does_not_claim_nothing_was_saved() {
    let (app, dropper) = app_behind_commit_ack_dropper().await;
    dropper.arm();
    let lost = post_entry_bounded(&app, "ack-lost", 7).await;
    assert!(dropper.fired());
    assert_eq!(app.row_counts().await, (1, 1, 1), "the write was committed");
    let detail = lost.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        !detail.contains("nothing was saved"),
        "a client told \"nothing was saved\" may retry with a NEW key and write twice: {detail}"
    );
}

/// Every write fails with a 500 (a schema the daemon's statement does not fit: a column renamed
/// under it). Readiness, which used to know only the failures it was taught (read-only, a full
/// disk, no connection slot), stayed 200 with `"writes":"ok"`: within a few seconds of failing
/// writes it is 503, naming the failure's class; and once the schema fits again it is ready
/// again by itself, before any write arrives (its probe write succeeds), and writes succeed.
#[actix_web::test]
async fn writes_that_all_fail_make_the_daemon_unready_until_they_would_succeed_again() {
    let app = spawn_app_with(|_| {}).await;
    app.post_entry("before", &entry_body(1))
        .await
        .assert_created();
    app.readyz_once(|ready| ready.status == 200).await;
    app.db
        .batch_execute("ALTER TABLE entries RENAME COLUMN kind TO kind_renamed")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut n = 0;
    let unready = loop {
        n += 1;
        let answer = app.post_entry(&format!("broken-{n}"), &entry_body(n)).await;
        assert_eq!(answer.status, 500, "{}", answer.describe());
        let ready = app.get("/readyz", None).await;
        if ready.status == 503 {
            break ready;
        }
        assert_eq!(ready.json()["writes"], "ok", "{}", ready.describe());
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "writes fail, /readyz still says {}",
            ready.describe()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let body = unready.json();
    assert_eq!(body["status"], "unready", "{body}");
    assert_eq!(body["writes"], "failing", "{body}");
    assert_eq!(body["writes_error_class"], "other", "{body}");
    assert!(
        body["writes_error"]
            .as_str()
            .is_some_and(|error| error.contains("kind")),
        "the database's words: {body}"
    );
    assert!(
        started.elapsed() >= retrysafe::db::blocked::FAILING_WINDOW,
        "not before writes have failed for the window"
    );
    assert_eq!(app.metric("retrysafe_ready").await, 0.0);
    assert_eq!(count(&app.db, "SELECT count(*) FROM entries").await, 1);

    // The schema fits again: ready again without a write (the probe), then writes succeed.
    app.db
        .batch_execute("ALTER TABLE entries RENAME COLUMN kind_renamed TO kind")
        .await
        .unwrap();
    let ready = app.readyz_once(|ready| ready.status == 200).await;
    assert_eq!(ready.json()["writes"], "ok", "{}", ready.describe());
    assert_eq!(count(&app.db, "SELECT count(*) FROM entries").await, 1);
    app.post_entry("after", &entry_body(2))
        .await
        .assert_created();
}

/// Refuses every update that marks an event sent: the statement that records a publish fails
/// after the broker confirmed it.
const REFUSE_MARKING_SENT: &str = "
CREATE FUNCTION refuse_marking_sent() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'marking events sent is refused by the test'; END $$;
CREATE TRIGGER refuse_marking_sent BEFORE UPDATE OF sent_at ON outbox_events
    FOR EACH ROW WHEN (NEW.sent_at IS NOT NULL) EXECUTE FUNCTION refuse_marking_sent();";

/// Copies of `event_id` delivered within `window`.
async fn copies_within(consumer: &mut TestConsumer, event_id: &str, window: Duration) -> usize {
    let until = std::time::Instant::now() + window;
    let mut copies = 0;
    while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
        match consumer.next(left).await {
            Some(delivery) if crate::common::consumer::message_id(&delivery) == event_id => {
                copies += 1
            }
            Some(_) => {}
            None => break,
        }
    }
    copies
}

/// The statement that records a publish fails after the broker confirmed it (a trigger refuses
/// to mark events sent). The batch rolls back, so its events are due again: the build before
/// published the same event again every round, about 25 copies in 10 seconds. Now the publish
/// is recorded as a failed attempt instead, which backs off like a failed publish: a handful of
/// copies in 12 seconds, the attempts and the cause on the event, a count and a log line.
#[actix_web::test]
async fn a_publish_whose_recording_fails_is_published_again_only_with_backoff() {
    let app = spawn_app_with(|_| {}).await;
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "entry.created").await;
    app.db.batch_execute(REFUSE_MARKING_SENT).await.unwrap();
    app.post_entry("unrecorded", &entry_body(1))
        .await
        .assert_created();
    let event_id: Uuid = app
        .db
        .query_one(
            "SELECT event_id FROM outbox_events WHERE idempotency_key = 'unrecorded'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let copies = copies_within(
        &mut consumer,
        &event_id.to_string(),
        Duration::from_secs(12),
    )
    .await;
    eprintln!("a recording that fails: {copies} copies in 12 s");
    assert!(
        (2..=7).contains(&copies),
        "{copies} copies in 12 s: published again, but only with backoff (0.5, 1, 2, 4, 8 s)"
    );
    let row = app
        .db
        .query_one(
            "SELECT attempts, last_error, sent_at IS NULL FROM outbox_events WHERE event_id = $1",
            &[&event_id],
        )
        .await
        .unwrap();
    let (attempts, last_error, unsent): (i32, Option<String>, bool) =
        (row.get(0), row.get(1), row.get(2));
    assert!(unsent);
    assert!(attempts >= 2, "each copy counted as an attempt: {attempts}");
    let last_error = last_error.unwrap_or_default();
    assert!(
        last_error.contains("recording the publish failed")
            && last_error.contains("refused by the test"),
        "{last_error}"
    );
    assert!(
        app.metric("retrysafe_outbox_recording_failures_total")
            .await
            >= 2.0
    );

    // The fault gone, the event is recorded sent, and no more copies come.
    app.db
        .batch_execute("DROP TRIGGER refuse_marking_sent ON outbox_events")
        .await
        .unwrap();
    app.db
        .execute(
            "UPDATE outbox_events SET next_attempt_at = now() WHERE event_id = $1",
            &[&event_id],
        )
        .await
        .unwrap();
    crate::common::helpers::eventually(Duration::from_secs(30), || async {
        crate::common::helpers::count_is(
            &app.db,
            "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL",
            0,
        )
        .await
    })
    .await;
}

/// As above, but recording the failure fails too (every update of the outbox is refused): the
/// relay itself backs off, so a persistent fault still costs a bounded number of copies.
#[actix_web::test]
async fn a_relay_backs_off_when_even_recording_the_failure_fails() {
    let app = spawn_app_with(|settings| settings.outbox.workers = 1).await;
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "entry.created").await;
    app.db
        .batch_execute(
            "CREATE FUNCTION refuse_updates() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'updates of the outbox are refused by the test'; END $$;
             CREATE TRIGGER refuse_updates BEFORE UPDATE ON outbox_events
                 FOR EACH ROW EXECUTE FUNCTION refuse_updates();",
        )
        .await
        .unwrap();
    app.post_entry("unrecordable", &entry_body(1))
        .await
        .assert_created();
    let event_id: Uuid = app
        .db
        .query_one(
            "SELECT event_id FROM outbox_events WHERE idempotency_key = 'unrecordable'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let copies = copies_within(
        &mut consumer,
        &event_id.to_string(),
        Duration::from_secs(12),
    )
    .await;
    eprintln!("recording the failure fails too: {copies} copies in 12 s");
    assert!(
        (2..=7).contains(&copies),
        "{copies} copies in 12 s: published again, but only with the relay's backoff"
    );
    assert!(
        app.metric("retrysafe_outbox_recording_failures_total")
            .await
            >= 2.0
    );
}
