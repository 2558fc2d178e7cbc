//! Where the daemon's statements run on Citus: each shard's on the node that holds it (the
//! coordinator off the write path), or all through the coordinator when asked; every shard's
//! rows reached by the janitor, `retrysafe purge` and the relays, whichever clients they are
//! of; and a worker's address given as `database.url` refused with what was found.

use std::collections::HashSet;
use std::time::Duration;

use crate::acceptance::{body, clients_on_two_workers, token, with_clients, CLIENTS};
use crate::common::citus::CitusLab;
use crate::common::cli::{retrysafe, stderr, stdout};
use crate::common::consumer::{message_id, TestConsumer};
use crate::common::daemon::{spawn_app_on, TestDaemon};
use crate::common::helpers::{connect_to, count, count_is, eventually};
use crate::common::postgres::PgCluster;

/// The single-shard statements a node has planned and run as the node a client gave them to
/// (Citus's `citus_stat_counters`, `citus.enable_stat_counters` on in the lab).
pub fn single_shard_executions(node: &PgCluster) -> i64 {
    node.psql_on(
        "retrysafe",
        "SELECT query_execution_single_shard FROM citus_stat_counters WHERE name = 'retrysafe'",
    )
    .parse()
    .expect("a count")
}

/// The daemon's connections to `node` (its application name; Citus's own are named otherwise).
fn daemon_connections(node: &PgCluster) -> i64 {
    node.psql_on(
        "retrysafe",
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'retrysafe'",
    )
    .parse()
    .expect("a count")
}

/// 20 writes of each of two clients whose rows are on different workers, all delivered.
async fn write_on_both_workers(lab: &CitusLab, app: &TestDaemon) {
    let (first, second) = clients_on_two_workers(lab);
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    for n in 0..20 {
        for client in [first, second] {
            app.post_entry_as(Some(&token(client)), &format!("k-{n}"), &body(n))
                .await
                .assert_created();
        }
    }
    let received: HashSet<String> = consumer
        .take(40, Duration::from_secs(30))
        .await
        .iter()
        .map(message_id)
        .collect();
    assert_eq!(received.len(), 40, "every event delivered once");
    assert!(consumer.drain(Duration::from_millis(500)).await.is_empty());
}

/// The daemon's writes and relay batches run on the workers: each worker plans and runs
/// statements of its shards (at least one per write, the batches being of one write each here,
/// written one after another), and the coordinator runs next to none: what it still answers
/// are reads (the readiness check, the gauges) and the reading of the metadata.
#[actix_web::test]
async fn writes_and_relays_run_on_the_workers_that_hold_their_shards() {
    let Some(lab) = CitusLab::start_if_available() else {
        return;
    };
    let app = daemon_on_with(&lab, true).await;
    let two_phase_before = lab.two_phase_commits();
    let coordinator_before = single_shard_executions(&lab.coordinator);
    let workers_before: Vec<i64> = lab.workers.iter().map(single_shard_executions).collect();
    write_on_both_workers(&lab, &app).await;
    let on_coordinator = single_shard_executions(&lab.coordinator) - coordinator_before;
    let on_workers: Vec<i64> = lab
        .workers
        .iter()
        .zip(&workers_before)
        .map(|(worker, before)| single_shard_executions(worker) - before)
        .collect();
    assert!(
        on_workers.iter().all(|executed| *executed >= 20),
        "each worker ran its shards' statements: {on_workers:?}"
    );
    assert!(
        on_coordinator < 10,
        "the coordinator ran {on_coordinator} single-shard statements for 40 writes, their relay batches and marks"
    );
    // The daemon's connections to each worker are its own.
    for worker in &lab.workers {
        let connections = daemon_connections(worker);
        assert!(
            connections >= 1,
            "the daemon is connected to {}",
            worker.port
        );
    }
    assert_eq!(
        lab.two_phase_commits(),
        two_phase_before,
        "no two-phase commit"
    );
}

/// With `database.citus_direct = false` every statement goes through the coordinator, which
/// then plans and runs each of them.
#[actix_web::test]
async fn with_citus_direct_off_every_statement_goes_through_the_coordinator() {
    let Some(lab) = CitusLab::start_if_available() else {
        return;
    };
    let app = daemon_on_with(&lab, false).await;
    let before = single_shard_executions(&lab.coordinator);
    write_on_both_workers(&lab, &app).await;
    let on_coordinator = single_shard_executions(&lab.coordinator) - before;
    assert!(
        on_coordinator >= 40,
        "the coordinator ran {on_coordinator} single-shard statements for 40 writes"
    );
    for worker in &lab.workers {
        let connections = daemon_connections(worker);
        assert_eq!(
            connections, 0,
            "no connection of the daemon to {}",
            worker.port
        );
    }
}

/// A daemon on the lab with [`CLIENTS`] configured and `database.citus_direct` as given.
async fn daemon_on_with(lab: &CitusLab, direct: bool) -> TestDaemon {
    spawn_app_on(&lab.url(), true, |settings| {
        with_clients(settings);
        settings.database.citus_direct = direct;
    })
    .await
}

/// Rows the configuration does not name: old sent events of a client with nothing else (no
/// record, nothing unsent), and expired records and old sent events of a client no longer
/// configured, on every shard. `retrysafe purge` deletes them all, and the daemon's janitor
/// reaches them too; an unconfigured client's unsent event is published by the relays.
#[actix_web::test]
async fn every_shards_rows_are_purged_and_relayed_whichever_clients_they_are_of() {
    let Some(lab) = CitusLab::start_if_available() else {
        return;
    };
    // The schema, and a daemon that knows the clients' shards, without relays or janitor.
    let app = spawn_app_on(&lab.url(), false, with_clients).await;
    let db = connect_to(&lab.url()).await;
    let old_sent = |client: &str, n: i64| {
        format!(
            "INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key, event_type,
                                        payload, created_at, sent_at)
             VALUES (gen_random_uuid(), 'old-{client}-{n}/entry.created', '{client}', 'old-{n}',
                     'entry.created', '{{}}', now() - interval '30 days', now() - interval '30 days')"
        )
    };
    let expired = |client: &str, n: i64| {
        format!(
            "INSERT INTO idempotency_records (client_id, key, request_hash, status, response_status,
                                              response_json, created_at, expires_at)
             VALUES ('{client}', 'expired-{n}', '\\x00', 'completed', 201, '{{}}',
                     now() - interval '3 days', now() - interval '2 days')"
        )
    };
    // A configured client with nothing but old sent events, and clients nobody configured,
    // one for each shard the lab has (8): every shard has such rows.
    let strangers: Vec<String> = (0..40).map(|n| format!("gone-{n}")).collect();
    let mut statements = vec![old_sent(CLIENTS[2], 1), old_sent(CLIENTS[2], 2)];
    for stranger in &strangers {
        statements.push(old_sent(stranger, 1));
        statements.push(expired(stranger, 1));
    }
    db.batch_execute(&statements.join(";")).await.unwrap();
    let shards = count(
        &db,
        "SELECT count(DISTINCT get_shard_id_for_distribution_column('outbox_events', client_id))
         FROM outbox_events WHERE client_id LIKE 'gone-%'",
    )
    .await;
    assert_eq!(shards, 8, "the strangers' rows are on every shard");

    let purged = app.retrysafe(&["purge"]);
    assert!(purged.status.success(), "{}", stderr(&purged));
    assert!(
        stdout(&purged).contains("deleted 40 expired idempotency record(s) and 42 sent event(s)"),
        "{}",
        stdout(&purged)
    );
    assert_eq!(count(&db, "SELECT count(*) FROM outbox_events").await, 0);
    assert_eq!(
        count(&db, "SELECT count(*) FROM idempotency_records").await,
        0
    );
    drop(app);

    // The daemon's own janitor and relays, on a stranger's rows written before it started.
    db.batch_execute(&format!(
        "{}; {}; INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key,
                                          event_type, payload)
         VALUES (gen_random_uuid(), 'new/entry.created', 'gone-7', 'new', 'entry.created', '{{}}')",
        old_sent("gone-3", 9),
        expired("gone-5", 9)
    ))
    .await
    .unwrap();
    let app = spawn_app_on(&lab.url(), true, with_clients).await;
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    eventually(Duration::from_secs(60), || async {
        count_is(
            &db,
            "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL OR sent_at < now() - interval '7 days'",
            0,
        )
        .await?;
        count_is(&db, "SELECT count(*) FROM idempotency_records", 0).await
    })
    .await;
    let delivered = consumer.take(1, Duration::from_secs(10)).await;
    assert_eq!(delivered[0].routing_key.as_str(), "entry.created");
}

/// Given a worker's address, `retrysafe migrate` (and so `serve`) refuses, naming the node it
/// reached and the coordinator to give instead, and changes nothing there.
#[actix_web::test]
async fn a_workers_address_is_refused_with_what_was_found_there() {
    let Some(lab) = CitusLab::start_if_available() else {
        return;
    };
    let coordinator = lab.url();
    let worker = lab.workers[0].url_of("retrysafe");
    let env = [("RETRYSAFE_DATABASE__URL", worker.as_str())];
    let refused = retrysafe(&["migrate"], &env);
    assert!(!refused.status.success(), "{}", stdout(&refused));
    let said = stderr(&refused);
    let this = format!("127.0.0.1:{}", lab.workers[0].port);
    let main = format!("127.0.0.1:{}", lab.coordinator.port);
    assert!(
        said.contains("points at a worker of a Citus cluster")
            && said.contains(&this)
            && said.contains(&main),
        "{said}"
    );
    let tables: i64 = lab.workers[0]
        .psql_on(
            "retrysafe",
            "SELECT count(*) FROM pg_tables WHERE tablename = 'refinery_schema_history'",
        )
        .parse()
        .unwrap();
    assert_eq!(tables, 0, "nothing applied on the worker");
    let env = [("RETRYSAFE_DATABASE__URL", coordinator.as_str())];
    let migrated = retrysafe(&["migrate"], &env);
    assert!(migrated.status.success(), "{}", stderr(&migrated));
}
