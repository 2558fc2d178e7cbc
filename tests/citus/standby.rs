//! A worker with a synchronous standby, lost and replaced by it: a write whose commit's wait for
//! the standby was cancelled (its client answered 503) is on the worker alone, and no event of
//! it may reach a queue, before or after the failover: the relays publish a worker's events only
//! once its standby has confirmed (a barrier taken on the worker, directly or through the
//! coordinator), and a key lookup reports a write only then. After the standby is
//! promoted and Citus told (`citus_update_node`), the daemon follows at its next reading of the
//! shard map, and the client's writes go on on the promoted node.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::acceptance::{body, daemon_on, token, until_answered, CLIENTS};
use crate::common::citus::CitusLab;
use crate::common::consumer::{message_id, TestConsumer};
use crate::common::daemon::{spawn_second_app, spawn_second_app_with, TestDaemon};
use crate::common::helpers::{connect_to, eventually};
use crate::common::postgres::{PgCluster, SyncRepCanceller};
use crate::common::proxy::TcpProxy;
use retrysafe::db::topology::REFRESH_INTERVAL;

/// How long the write's event is watched for with the standby's link cut: many relay polls.
const CUT_WINDOW: Duration = Duration::from_secs(5);

/// The shard tables (`<table>_<shard id>`) that hold `client`'s rows of `table`: what a node's
/// own rows are read from (on a standby, or a node the metadata no longer names).
fn shard_table(lab: &CitusLab, table: &str, client: &str) -> String {
    let shard = lab.sql(&format!(
        "SELECT get_shard_id_for_distribution_column('{table}', '{client}')"
    ));
    format!("{table}_{shard}")
}

/// How many entries of `client`'s key `key` the shard table `entries` (see [`shard_table`])
/// holds on `node`.
fn entries_on(node: &PgCluster, entries: &str, key: &str) -> i64 {
    node.psql_on(
        "retrysafe",
        &format!("SELECT count(*) FROM {entries} WHERE idempotency_key = '{key}'"),
    )
    .parse()
    .expect("a count")
}

/// The event id of `client`'s write of `key`, read through the coordinator.
async fn event_of(app: &TestDaemon, client: &str, key: &str) -> String {
    app.db
        .query_one(
            "SELECT event_id::text FROM outbox_events WHERE client_id = $1 AND idempotency_key = $2",
            &[&client, &key],
        )
        .await
        .unwrap()
        .get(0)
}

/// Deliveries until `wanted` comes (within `limit`), each recorded in `delivered`; none may be
/// `phantom`.
async fn until_delivered(
    consumer: &mut TestConsumer,
    wanted: &str,
    phantom: &str,
    delivered: &mut HashSet<String>,
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let delivery = consumer
            .next(left)
            .await
            .unwrap_or_else(|| panic!("event {wanted} not delivered within {limit:?}"));
        let id = message_id(&delivery);
        assert_ne!(
            id, phantom,
            "the event of a write the promoted standby lacks"
        );
        delivered.insert(id.clone());
        if id == wanted {
            return;
        }
    }
}

/// Deliveries for [`CUT_WINDOW`], none of which may be `phantom`, each recorded in `delivered`.
async fn no_phantom_within(
    consumer: &mut TestConsumer,
    phantom: &str,
    delivered: &mut HashSet<String>,
) {
    let since = Instant::now();
    while since.elapsed() < CUT_WINDOW {
        if let Some(delivery) = consumer.next(Duration::from_millis(200)).await {
            let id = message_id(&delivery);
            assert_ne!(
                id, phantom,
                "the event of the unconfirmed write published, the standby lacking it"
            );
            delivered.insert(id);
        }
    }
}

/// The sessions on `node` of an application named like `application` waiting for the node's
/// synchronous standby to confirm a commit.
fn barriers_waiting(node: &PgCluster, application: &str) -> i64 {
    node.psql(&format!(
        "SELECT count(*) FROM pg_stat_activity
         WHERE wait_event = 'SyncRep' AND application_name LIKE '{application}'"
    ))
    .parse()
    .expect("a count")
}

/// Writes of `client` after the failover, none of whose deliveries may be `phantom`.
struct Written<'a> {
    app: &'a TestDaemon,
    client: &'a str,
    phantom: &'a str,
}

impl Written<'_> {
    /// The `n`th write (see [`body`]) of `key`, again until it is answered 2xx (as a caller
    /// retries, while the daemon has not read the map again): made anew, not replayed, and its
    /// event delivered; returns the event's id.
    async fn anew_and_delivered(
        &self,
        (key, n): (&str, i64),
        consumer: &mut TestConsumer,
        delivered: &mut HashSet<String>,
    ) -> String {
        let answer =
            until_answered(self.app, self.client, (key, &body(n)), REFRESH_INTERVAL * 2).await;
        assert!(!answer.replayed(), "{}", answer.describe());
        let event = event_of(self.app, self.client, key).await;
        until_delivered(
            consumer,
            &event,
            self.phantom,
            delivered,
            REFRESH_INTERVAL * 2,
        )
        .await;
        event
    }
}

#[actix_web::test]
async fn no_event_reaches_a_queue_for_a_write_a_workers_promoted_standby_lacks() {
    let Some(lab) = CitusLab::start_if_available() else {
        return;
    };
    let app = daemon_on(&lab).await;
    let client = CLIENTS[0];
    let worker = lab.worker_of(client);
    let entries = shard_table(&lab, "entries", client);
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    let mut delivered = HashSet::new();

    // The worker's synchronous standby, its WAL through a link the test can cut.
    let link = TcpProxy::start(format!("127.0.0.1:{}", worker.port).parse().unwrap()).await;
    let standby = PgCluster::standby_of(worker, link.port);
    worker.psql("ALTER SYSTEM SET synchronous_standby_names = '*'");
    worker.psql("SELECT pg_reload_conf()");
    eventually(Duration::from_secs(30), || async {
        let state = worker.psql(
            "SELECT coalesce(string_agg(application_name || ' ' || state || ' ' || sync_state, ', '), 'none')
             FROM pg_stat_replication",
        );
        (state == "standby streaming sync")
            .then_some(())
            .ok_or_else(|| format!("the worker's replication: {state}"))
    })
    .await;

    // A write the standby confirmed: acknowledged, its event delivered, on the standby.
    app.post_entry_as(Some(&token(client)), "confirmed", &body(0))
        .await
        .assert_created();
    let confirmed = event_of(&app, client, "confirmed").await;
    until_delivered(
        &mut consumer,
        &confirmed,
        "",
        &mut delivered,
        Duration::from_secs(30),
    )
    .await;
    eventually(Duration::from_secs(10), || async {
        match entries_on(&standby, &entries, "confirmed") {
            1 => Ok(()),
            held => Err(format!(
                "the standby holds {held} entries of the confirmed write"
            )),
        }
    })
    .await;

    // The standby's link cut, the write's commit waits for it, and the wait is cancelled: the
    // commit stays, on the worker alone, and the client is answered 503.
    link.cut();
    let canceller = SyncRepCanceller::start(connect_to(&worker.url_of("retrysafe")).await);
    let unconfirmed = app
        .post_entry_as(Some(&token(client)), "unconfirmed", &body(1))
        .await;
    drop(canceller);
    assert!(
        unconfirmed.is_storage_unavailable(),
        "{}",
        unconfirmed.describe()
    );
    assert_eq!(
        entries_on(worker, &entries, "unconfirmed"),
        1,
        "the worker holds the write whose wait was cancelled"
    );
    let phantom = event_of(&app, client, "unconfirmed").await;

    // More daemons of the group, which have seen no write fail on that worker, relay its
    // events (the first leaves the worker's shards out of its rounds while its writes there
    // fail), one after the other (a relay's claim holds the rows while its barrier waits):
    // one on the worker, one through the coordinator (`database.citus_direct = false`). The
    // barrier each takes on the worker waits for the standby and is not confirmed, so nothing
    // of the write is published.
    let other = spawn_second_app(&app).await;
    no_phantom_within(&mut consumer, &phantom, &mut delivered).await;
    assert!(
        barriers_waiting(worker, "retrysafe") > 0,
        "no barrier on the worker waits for its standby"
    );
    drop(other);
    let through = spawn_second_app_with(&app, |settings| {
        settings.database.citus_direct = false;
    })
    .await;
    no_phantom_within(&mut consumer, &phantom, &mut delivered).await;
    assert!(
        barriers_waiting(worker, "citus_run_command%") > 0,
        "no barrier through the coordinator waits on the worker for its standby"
    );
    assert_eq!(entries_on(&standby, &entries, "unconfirmed"), 0);
    // Nor does a key lookup (through the coordinator) report the write done.
    for daemon in [&app, &through] {
        daemon
            .get("/v1/idempotency-keys/unconfirmed", Some(&token(client)))
            .await
            .assert_problem(503, "storage-unavailable");
    }

    // The worker lost, its standby promoted, Citus told; the daemons follow at their next
    // reading of the map.
    worker.stop();
    standby.promote();
    assert_eq!(
        entries_on(&standby, &entries, "unconfirmed"),
        0,
        "the promoted standby lacks the unconfirmed write"
    );
    lab.sql(&format!(
        "SELECT citus_update_node(nodeid, '127.0.0.1', {}) FROM pg_dist_node WHERE nodeport = {}",
        standby.port, worker.port
    ));
    let failed_over_at = Instant::now();
    let written = Written {
        app: &app,
        client,
        phantom: &phantom,
    };
    written
        .anew_and_delivered(("after-failover", 2), &mut consumer, &mut delivered)
        .await;
    let followed_after = failed_over_at.elapsed();
    // The write the client was answered 503 for, retried: made anew on the promoted node.
    let retried = written
        .anew_and_delivered(("unconfirmed", 1), &mut consumer, &mut delivered)
        .await;
    assert_ne!(retried, phantom);
    for key in ["after-failover", "unconfirmed"] {
        assert_eq!(
            entries_on(&standby, &entries, key),
            1,
            "{key} is on the promoted standby"
        );
    }
    for delivery in consumer.drain(Duration::from_secs(3)).await {
        assert_ne!(message_id(&delivery), phantom);
    }
    eprintln!(
        "no event of the unconfirmed write in {CUT_WINDOW:?} with the standby's link cut, nor after the failover; writes on the promoted standby {followed_after:?} after citus_update_node; {} events delivered",
        delivered.len()
    );
    drop(through);
}
