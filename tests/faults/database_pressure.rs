//! PostgreSQL present but refusing writes for a reason only an operator can fix: its disk full,
//! the database read-only, every connection slot taken. Each write is refused with 503 and a
//! detail that names the reason and says that nothing was written; no row is written; the
//! daemon says it is unready while it lasts (`/readyz` 503, `"writes":"failing"`) and recovers
//! without a restart. A start without a free connection waits for one, within
//! `database.start_timeout`, instead of exiting at once. A commit that a synchronous standby
//! did not confirm is not acknowledged.
//!
//! The full disk and the connection slots are a PostgreSQL cluster of the test's own (tests of
//! them run as root: `runuser`, and `mount` for a small tmpfs).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tokio_postgres::NoTls;

use crate::common::daemon::{
    binary_env, free_port, serve_command, spawn_app, DaemonProcess, TestDaemon,
};
use crate::common::helpers::{
    connect_to, count, entry_body, eventually, http_client, test_settings, TestExchange,
    TestResponse,
};
use crate::common::postgres::{give_to, PgCluster, SyncRepCanceller, TestDir};

fn is_root() -> bool {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() == 0 }
}

/// Posts `key` until the answer satisfies `wanted`, within half a minute.
async fn post_until(
    daemon: &TestDaemon,
    key: &str,
    wanted: impl Fn(&TestResponse) -> bool,
) -> TestResponse {
    eventually(Duration::from_secs(30), || async {
        let answer = daemon.post_entry(key, &entry_body(7)).await;
        if wanted(&answer) {
            Ok(answer)
        } else {
            Err(answer.describe())
        }
    })
    .await
}

fn detail(answer: &TestResponse) -> String {
    answer.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Ends the daemon's sessions on its database, so that its pools open new ones.
async fn end_daemon_sessions(db: &tokio_postgres::Client, database: &str) {
    db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = $1 AND pid <> pg_backend_pid()",
        &[&database],
    )
    .await
    .unwrap();
}

#[actix_web::test]
async fn a_read_only_database_refuses_writes_in_words_and_makes_the_daemon_unready() {
    let app = spawn_app().await;
    app.post_entry("before", &entry_body(1))
        .await
        .assert_created();
    let name = app.database.name.clone();
    app.db
        .batch_execute(&format!(
            "ALTER DATABASE \"{name}\" SET default_transaction_read_only = on"
        ))
        .await
        .unwrap();
    end_daemon_sessions(&app.db, &name).await;

    let refused = post_until(&app, "while-read-only", |answer| {
        detail(answer).contains("read-only")
    })
    .await;
    refused.assert_problem(503, "storage-unavailable");
    assert!(refused.header("retry-after").is_some());
    let text = detail(&refused);
    assert!(text.contains("nothing was written"), "{text}");
    assert!(text.contains("make the database writable"), "{text}");
    // A read-only answer may be a failover under way: unready only once it lasts (5 s), while
    // writes keep failing.
    let unready = eventually(Duration::from_secs(30), || async {
        let _ = app.post_entry("while-read-only", &entry_body(7)).await;
        let ready = app.get("/readyz", None).await;
        if ready.status == 503 && ready.json()["writes"] == "failing" {
            Ok(ready)
        } else {
            Err(ready.describe())
        }
    })
    .await;
    let why = unready.json()["writes_error"].to_string();
    assert!(why.contains("read-only") && why.contains("25006"), "{why}");
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_records WHERE key = 'while-read-only'")
            .await,
        0
    );

    // Writable again: the same key is written, and the daemon is ready, without a restart.
    app.db
        .batch_execute(&format!(
            "ALTER DATABASE \"{name}\" RESET default_transaction_read_only"
        ))
        .await
        .unwrap();
    end_daemon_sessions(&app.db, &name).await;
    post_until(&app, "while-read-only", |answer| answer.status == 201).await;
    app.readyz_once(|ready| ready.status == 200 && ready.json()["writes"] == "ok")
        .await;
}

/// A tmpfs mounted for a test; unmounted when dropped (after what uses it).
struct Tmpfs {
    dir: TestDir,
}

impl Tmpfs {
    fn mount(megabytes: u32) -> Self {
        let dir = TestDir::new("tmpfs");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(&dir.0)
            .status()
            .unwrap();
        assert!(status.success(), "mount a tmpfs");
        Self { dir }
    }

    fn path(&self) -> &Path {
        &self.dir.0
    }

    /// Takes every free byte with a file of its own; returns it.
    fn fill(&self) -> PathBuf {
        let filler = self.dir.path("filler");
        // dd stops at ENOSPC, which it reports as a failure: that is the point.
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=64k"])
            .arg(format!("of={}", filler.display()))
            .output()
            .unwrap();
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir.0).status();
    }
}

/// A private cluster whose database `retrysafe` lives on a small tmpfs, and the daemon (the
/// built binary) on it. Dropped in this order: the daemon, the cluster, then the tmpfs.
struct FullDiskLab {
    daemon: DaemonProcess,
    db: tokio_postgres::Client,
    _exchange: TestExchange,
    _cluster: PgCluster,
    tmpfs: Tmpfs,
}

/// The daemon (the built binary) on the database `retrysafe` of `cluster`, with an exchange of
/// its own, and the test's connection to that database.
async fn daemon_on(cluster: &PgCluster) -> (DaemonProcess, tokio_postgres::Client, TestExchange) {
    let settings = test_settings();
    let exchange = TestExchange::new(&settings);
    let daemon =
        DaemonProcess::start(&cluster.url_of("retrysafe"), &settings.amqp.exchange, &[]).await;
    let (db, connection) = tokio_postgres::connect(&cluster.url_of("retrysafe"), NoTls)
        .await
        .unwrap();
    actix_web::rt::spawn(connection);
    (daemon, db, exchange)
}

async fn full_disk_lab() -> FullDiskLab {
    let tmpfs = Tmpfs::mount(48);
    let cluster = PgCluster::start_plain("");
    let location = tmpfs.path().join("tablespace");
    std::fs::create_dir(&location).unwrap();
    give_to("postgres", &location);
    cluster.psql(&format!(
        "CREATE TABLESPACE small LOCATION '{}'",
        location.display()
    ));
    cluster.psql("CREATE DATABASE retrysafe TABLESPACE small");
    let (daemon, db, exchange) = daemon_on(&cluster).await;
    FullDiskLab {
        daemon,
        db,
        _exchange: exchange,
        _cluster: cluster,
        tmpfs,
    }
}

async fn post(daemon: &DaemonProcess, key: &str) -> TestResponse {
    let response = http_client(Duration::from_secs(30))
        .post(format!("{}/v1/entries", daemon.address))
        .insert_header(("Idempotency-Key", key))
        .insert_header(("Content-Type", "application/json"))
        .send_body(entry_body(3).to_string())
        .await
        .expect("answered");
    TestResponse::read(response).await.unwrap()
}

async fn readyz(daemon: &DaemonProcess) -> TestResponse {
    let response = http_client(Duration::from_secs(30))
        .get(format!("{}/readyz", daemon.address))
        .send()
        .await
        .expect("answered");
    TestResponse::read(response).await.unwrap()
}

#[actix_web::test]
async fn a_full_disk_refuses_writes_in_words_and_makes_the_daemon_unready_until_space_is_freed() {
    if !is_root() {
        eprintln!("skipped: mounting a small tmpfs for the database needs root");
        return;
    }
    let lab = full_disk_lab().await;
    // Filled before the first write: its tables and indexes, empty, must grow to take it.
    let filler = lab.tmpfs.fill();

    let refused = eventually(Duration::from_secs(30), || async {
        let answer = post(&lab.daemon, "on-a-full-disk").await;
        if detail(&answer).contains("disk is full") {
            Ok(answer)
        } else {
            Err(answer.describe())
        }
    })
    .await;
    refused.assert_problem(503, "storage-unavailable");
    let text = detail(&refused);
    assert!(
        text.contains("nothing was written") && text.contains("free space"),
        "{text}"
    );
    let unready = readyz(&lab.daemon).await;
    assert_eq!(unready.status, 503, "{}", unready.describe());
    assert_eq!(unready.json()["writes"], "failing");
    assert_eq!(unready.json()["database"], "up");
    assert!(unready.json()["writes_error"].to_string().contains("53100"));
    assert_eq!(
        count(
            &lab.db,
            "SELECT count(*) FROM idempotency_records WHERE key = 'on-a-full-disk'"
        )
        .await,
        0,
        "nothing written"
    );
    assert!(lab
        .daemon
        .log_text()
        .contains("writes fail: the database's disk is full"));

    // Space freed: the same key is written, and the daemon is ready again, without a restart.
    std::fs::remove_file(filler).unwrap();
    let written = eventually(Duration::from_secs(30), || async {
        let answer = post(&lab.daemon, "on-a-full-disk").await;
        if answer.status == 201 {
            Ok(answer)
        } else {
            Err(answer.describe())
        }
    })
    .await;
    assert!(!written.replayed());
    let ready = readyz(&lab.daemon).await;
    assert_eq!(ready.status, 200, "{}", ready.describe());
    assert!(lab.daemon.log_text().contains("writes succeed again"));
}

/// Connections to `cluster` held until dropped, taking every slot there is: the daemon's
/// sessions are ended first, as often as they come back.
async fn take_every_slot(cluster: &PgCluster) -> Vec<tokio_postgres::Client> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut held: Vec<tokio_postgres::Client> = Vec::new();
    loop {
        if held.is_empty() {
            cluster.psql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE application_name LIKE 'retrysafe%'",
            );
        } else {
            held[0]
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE application_name LIKE 'retrysafe%'",
                    &[],
                )
                .await
                .unwrap();
        }
        loop {
            match tokio_postgres::connect(&cluster.url_of("postgres"), NoTls).await {
                Ok((client, connection)) => {
                    actix_web::rt::spawn(connection);
                    held.push(client);
                }
                Err(error) if format!("{error:?}").contains("too many clients") => break,
                Err(error) => panic!("connecting to the test's cluster: {error}"),
            }
        }
        let theirs = count(
            &held[0],
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'retrysafe%'",
        )
        .await;
        if theirs == 0 {
            return held;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the daemon still holds {theirs} connection(s)"
        );
    }
}

#[actix_web::test]
async fn a_start_without_a_free_connection_waits_for_one_within_the_start_timeout() {
    if !is_root() {
        eprintln!("skipped: a PostgreSQL cluster of the test's own needs root (runuser)");
        return;
    }
    let cluster = PgCluster::start_plain("max_connections = 6\nsuperuser_reserved_connections = 0");
    cluster.psql("CREATE DATABASE retrysafe");
    let settings = test_settings();
    let _exchange = TestExchange::new(&settings);
    let env = binary_env(&cluster.url_of("retrysafe"), &settings.amqp.exchange, &[]);

    // Every slot taken for longer than a short start timeout: the start gives up, and says why.
    let held = take_every_slot(&cluster).await;
    let log = std::env::temp_dir().join(format!("retrysafe-start-{}.log", uuid::Uuid::new_v4()));
    let mut command = serve_command(free_port(), &log);
    command.envs(env.iter().cloned());
    command.env("RETRYSAFE_DATABASE__START_TIMEOUT", "3s");
    let started = std::time::Instant::now();
    let status = command.status().unwrap();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "it waited: {text}"
    );
    assert!(
        text.contains("waiting for the database at start") && text.contains("too many clients"),
        "{text}"
    );

    // Slots freed while it waits: it starts and serves.
    let port = free_port();
    let mut command = serve_command(port, &log);
    command.envs(env.iter().cloned());
    let mut child = command.spawn().unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "still waiting, not exited"
    );
    drop(held);
    let client = http_client(Duration::from_secs(5));
    eventually(Duration::from_secs(60), || async {
        let health = client
            .get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .await
            .map_err(|error| error.to_string())?;
        if health.status().is_success() {
            Ok(())
        } else {
            Err(health.status().to_string())
        }
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&log);
}

/// A primary whose synchronous standby does not confirm commits, and whose waits for it are
/// cancelled: the server then answers each commit with success and a warning ("canceling wait
/// for synchronous replication ... The transaction has already committed locally, but might
/// not have been replicated to the standby"). After a failover to that standby such a write
/// would be gone, so none is acknowledged, neither its first request nor a retry that finds
/// its record; once the standby requirement is gone, the retry gets the record the first
/// request saved.
#[actix_web::test]
async fn a_commit_the_synchronous_standby_did_not_confirm_is_not_acknowledged() {
    if !is_root() {
        eprintln!("skipped: a cluster of the test's own runs as the postgres user (runuser)");
        return;
    }
    let cluster = PgCluster::start_plain("");
    cluster.psql("CREATE DATABASE retrysafe");
    let (daemon, db, exchange) = daemon_on(&cluster).await;
    assert_eq!(post(&daemon, "before").await.status, 201);

    cluster.psql("ALTER SYSTEM SET synchronous_standby_names = 'a_standby_that_never_connects'");
    cluster.psql("SELECT pg_reload_conf()");
    let canceller = SyncRepCanceller::start(connect_to(&cluster.url_of("postgres")).await);
    let unconfirmed = post(&daemon, "unconfirmed").await;
    unconfirmed.assert_problem(503, "storage-unavailable");
    assert!(detail(&unconfirmed).contains("same Idempotency-Key"));
    // The server did commit it, locally: that is what must not be acknowledged.
    let local = "SELECT count(*) FROM idempotency_records WHERE key = 'unconfirmed'";
    assert_eq!(count(&db, local).await, 1);
    // A retry finds the record, and is not acknowledged either: its own commit (it locks the
    // record) waits for the standby, like the first one did.
    for _ in 0..2 {
        let retry = post(&daemon, "unconfirmed").await;
        assert_eq!(retry.status, 503, "{}", retry.describe());
    }
    drop(canceller);
    let log = daemon.log_text();
    assert!(
        log.contains("canceling wait for synchronous replication"),
        "the server's warning is logged"
    );
    let metrics = http_client(Duration::from_secs(30))
        .get(format!("{}/metrics", daemon.address))
        .send()
        .await
        .expect("answered")
        .body()
        .await
        .unwrap();
    let metrics = String::from_utf8_lossy(&metrics);
    let unconfirmed_commits: f64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("retrysafe_database_unconfirmed_commits_total "))
        .expect("the counter is exported")
        .parse()
        .unwrap();
    assert!(unconfirmed_commits >= 3.0, "{unconfirmed_commits}");

    // The standby requirement gone, the retry is answered by the record the first request
    // saved, and no second entry is written.
    cluster.psql("ALTER SYSTEM RESET synchronous_standby_names");
    cluster.psql("SELECT pg_reload_conf()");
    let answered = eventually(Duration::from_secs(30), || async {
        let answer = post(&daemon, "unconfirmed").await;
        if answer.status / 100 == 2 {
            Ok(answer)
        } else {
            Err(answer.describe())
        }
    })
    .await;
    let saved: uuid::Uuid = db
        .query_one(
            "SELECT entry_id FROM idempotency_records WHERE key = 'unconfirmed'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(answered.json()["id"], saved.to_string());
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM entries WHERE idempotency_key = 'unconfirmed'"
        )
        .await,
        1
    );
    drop(daemon);
    drop(exchange);
}

/// The `/metrics` sample of `name` (a counter without labels) of a daemon process.
async fn process_metric(daemon: &DaemonProcess, name: &str) -> f64 {
    let metrics = http_client(Duration::from_secs(30))
        .get(format!("{}/metrics", daemon.address))
        .send()
        .await
        .expect("answered")
        .body()
        .await
        .unwrap();
    crate::common::helpers::metric_sample(&String::from_utf8_lossy(&metrics), name)
        .unwrap_or_else(|| panic!("{name} is exported"))
}

/// With a synchronous standby that does not confirm commits and waits that are cancelled, a
/// write's commit is visible on the primary at once though its client was answered 503: after
/// a failover to that standby it would not exist. No event of it may reach a queue then: each
/// relay batch publishes only after a barrier (a commit taken after the claim) that the standby
/// confirms, and none is confirmed here, so nothing is published (the build before published
/// it within a second). The key lookup does not report the write either, nor does an admin
/// action that changes events report success. Once synchronous replication is off (the
/// primary goes on alone, promising nothing more), the event is published.
#[actix_web::test]
async fn no_event_of_a_write_the_synchronous_standby_did_not_confirm_is_published() {
    if !is_root() {
        eprintln!("skipped: a cluster of the test's own runs as the postgres user (runuser)");
        return;
    }
    let cluster = PgCluster::start_plain("");
    cluster.psql("CREATE DATABASE retrysafe");
    let (daemon, db, exchange) = daemon_on(&cluster).await;
    let mut consumer =
        crate::common::consumer::TestConsumer::bind(&exchange.name, "entry.created").await;
    assert_eq!(post(&daemon, "before").await.status, 201);
    assert!(
        consumer.next(Duration::from_secs(30)).await.is_some(),
        "an event of a write the database promised is published"
    );

    cluster.psql("ALTER SYSTEM SET synchronous_standby_names = 'a_standby_that_never_connects'");
    cluster.psql("SELECT pg_reload_conf()");
    let canceller = SyncRepCanceller::start(connect_to(&cluster.url_of("postgres")).await);
    let unconfirmed = post(&daemon, "unconfirmed").await;
    unconfirmed.assert_problem(503, "storage-unavailable");
    let event_id: uuid::Uuid = db
        .query_one(
            "SELECT event_id FROM outbox_events WHERE idempotency_key = 'unconfirmed'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let unconfirmed_before =
        process_metric(&daemon, "retrysafe_database_unconfirmed_commits_total").await;
    // Relays poll every second and find the event due: several batches claim it.
    let published = consumer.next(Duration::from_secs(8)).await;
    assert!(
        published.is_none(),
        "an event of a write the standby never confirmed was published"
    );
    assert!(
        process_metric(&daemon, "retrysafe_database_unconfirmed_commits_total").await
            > unconfirmed_before,
        "relay batches tried, and their barriers were not confirmed"
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM outbox_events WHERE idempotency_key = 'unconfirmed' AND sent_at IS NULL AND attempts = 0"
        )
        .await,
        1,
        "not published, and no attempt counted: the event did not fail"
    );
    let lookup = http_client(Duration::from_secs(30))
        .get(format!(
            "{}/v1/idempotency-keys/unconfirmed",
            daemon.address
        ))
        .send()
        .await
        .expect("answered");
    let lookup = TestResponse::read(lookup).await.unwrap();
    lookup.assert_problem(503, "storage-unavailable");

    // An admin action that changes events: its commit is not confirmed either.
    let mut settings = test_settings();
    settings.database.url = cluster.url_of("retrysafe").as_str().into();
    let database = retrysafe::db::Database::new(&settings.validated().unwrap().database).unwrap();
    let selector = retrysafe::admin::store::Selector {
        event_ids: vec![event_id],
        ..Default::default()
    };
    let acted = database
        .run(async |connection| {
            retrysafe::admin::store::act(
                connection,
                "ops",
                "retry-unconfirmed",
                retrysafe::admin::store::Action::Retry,
                &selector,
            )
            .await
            .map_err(|error| match error {
                retrysafe::admin::store::ActionError::Storage(storage) => storage,
                other => panic!("{other}"),
            })
        })
        .await;
    assert!(
        matches!(acted, Err(retrysafe::db::StorageError::Unavailable(_))),
        "an admin action whose commit the standby did not confirm is not reported done"
    );

    // Synchronous replication off: the primary goes on alone, and the event is published.
    drop(canceller);
    cluster.psql("ALTER SYSTEM RESET synchronous_standby_names");
    cluster.psql("SELECT pg_reload_conf()");
    let delivered = consumer
        .next(Duration::from_secs(30))
        .await
        .expect("published once nothing more is promised");
    assert_eq!(
        crate::common::consumer::message_id(&delivered),
        event_id.to_string()
    );
    drop(daemon);
    drop(exchange);
}
