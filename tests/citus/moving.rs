//! A single server's database moved to Citus: the extension added and the workers joined (as
//! the operator does, docs/scaling.md), then one command, `retrysafe migrate`, distributes the
//! tables with their rows; the daemon then answers every earlier key as before.

use std::time::Duration;

use serde_json::json;

use crate::acceptance::{body, token, with_clients, CLIENTS};
use crate::common::citus::CitusLab;
use crate::common::cli::{retrysafe, stderr, stdout};
use crate::common::consumer::{message_id, TestConsumer};
use crate::common::daemon::spawn_app_on;
use crate::common::helpers::{count, count_is, eventually};

#[actix_web::test]
async fn a_single_server_database_moves_to_citus_with_retrysafe_migrate() {
    let Some(lab) = CitusLab::start_if_available() else {
        return;
    };
    // A single server's database: the coordinator's `single`, without Citus.
    lab.coordinator.psql("CREATE DATABASE single");
    let url = lab.coordinator.url_of("single");
    let before = spawn_app_on(&url, false, with_clients).await;
    let mut consumer = TestConsumer::bind(&before.settings.amqp.exchange, "#").await;
    let mut answers = Vec::new();
    for client in CLIENTS {
        let token = token(client);
        answers.push(
            before
                .post_entry_as(Some(&token), "invoice-1", &body(1))
                .await,
        );
        for n in 1..=2 {
            before
                .post_entry_as(
                    Some(&token),
                    &format!("ordered-{n}"),
                    &json!({"kind": "k", "data": {"n": n}, "ordering_key": "account"}),
                )
                .await
                .assert_created();
        }
    }
    // Some events delivered before the move, the rest after it.
    assert_eq!(before.relay_until_empty().await, 18);
    before
        .post_entry_as(Some(&token(CLIENTS[0])), "invoice-2", &body(2))
        .await
        .assert_created();
    let exchange = format!("{}.after", before.settings.amqp.exchange);
    drop(before);

    lab.add_citus_to("single");
    let env = [("RETRYSAFE_DATABASE__URL", url.as_str())];
    let migrated = retrysafe(&["migrate"], &env);
    assert!(migrated.status.success(), "{}", stderr(&migrated));
    assert!(
        stdout(&migrated).contains(
            "distributed over the Citus workers, their rows moved into the shards: replays, idempotency_records, entries, outbox_events"
        ),
        "{}",
        stdout(&migrated)
    );
    // Once is enough: again, there is nothing to do.
    let again = retrysafe(&["migrate"], &env);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        !stdout(&again).contains("distributed"),
        "{}",
        stdout(&again)
    );
    // The rows are in the shards, none left on the coordinator's own tables.
    assert_eq!(
        lab.coordinator.psql_on(
            "single",
            "SELECT sum(pg_relation_size(logicalrelid)) FROM pg_dist_partition"
        ),
        "0"
    );

    let mut consumer_after = TestConsumer::bind(&exchange, "#").await;
    let after = spawn_app_on(&url, true, |settings| {
        with_clients(settings);
        settings.amqp.exchange = exchange.clone();
    })
    .await;
    for (client, first_answer) in CLIENTS.into_iter().zip(&answers) {
        let token = token(client);
        let replay = after
            .post_entry_as(Some(&token), "invoice-1", &body(1))
            .await;
        assert!(replay.replayed(), "{}", replay.describe());
        assert_eq!(
            replay.body, first_answer.body,
            "the same answer, byte for byte"
        );
        let lookup = after
            .get("/v1/idempotency-keys/invoice-1", Some(&token))
            .await;
        assert_eq!(lookup.status, 200, "{}", lookup.describe());
        let ordered = after
            .post_entry_as(
                Some(&token),
                "ordered-3",
                &json!({"kind": "k", "data": {"n": 3}, "ordering_key": "account"}),
            )
            .await;
        ordered.assert_created();
        assert_eq!(
            ordered.json()["sequence"],
            json!(3),
            "{}",
            ordered.describe()
        );
    }
    let unsent = "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL";
    eventually(Duration::from_secs(60), || count_is(&after.db, unsent, 0)).await;
    assert_eq!(
        count(&after.db, "SELECT count(*) FROM outbox_events").await,
        25
    );
    let mut deliveries = consumer.take(18, Duration::from_secs(30)).await;
    deliveries.extend(consumer_after.take(7, Duration::from_secs(30)).await);
    let delivered: std::collections::HashSet<String> = deliveries.iter().map(message_id).collect();
    assert_eq!(delivered.len(), 25, "every event, once each");
    // The rows are spread over both workers.
    let nodes = lab.coordinator.psql_on(
        "single",
        "SELECT count(DISTINCT p.nodeport)
         FROM (SELECT DISTINCT get_shard_id_for_distribution_column('entries', client_id) AS shardid
               FROM entries) AS e
             JOIN pg_dist_shard_placement p USING (shardid)",
    );
    assert_eq!(nodes, "2");
}
