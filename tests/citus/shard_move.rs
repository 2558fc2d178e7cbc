//! A shard moved from one worker to the other while clients write (`citus_move_shard_placement`,
//! as a rebalance does): nothing acknowledged is lost, nothing written twice, every event
//! delivered, ordered keys in order; and once the daemon has read the shard map again, the
//! moved shard's writes run on the node that now holds it.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::acceptance::{daemon_on, load_of, token, CLIENTS};
use crate::common::citus::CitusLab;
use crate::common::consumer::TestConsumer;
use crate::nodes::single_shard_executions;
use retrysafe::db::topology::REFRESH_INTERVAL;

/// Writes of the moved shard's client in a round that finds where they run.
const WRITES: i64 = 20;
/// Rows of the moved shard before the move.
const BULK_ROWS: i64 = 1_000_000;

#[actix_web::test]
async fn a_shard_moved_under_load_loses_nothing_doubles_nothing_and_its_writes_follow_it() {
    let Some(lab) = CitusLab::start_if_available() else {
        return;
    };
    let app = daemon_on(&lab).await;
    let moved = CLIENTS[0];
    let from = lab.worker_of(moved);
    let to = lab
        .workers
        .iter()
        .find(|worker| worker.port != from.port)
        .unwrap();
    let shard: i64 = lab
        .sql(&format!(
            "SELECT get_shard_id_for_distribution_column('idempotency_records', '{moved}')"
        ))
        .parse()
        .unwrap();
    // Rows for the move to copy, so that it takes a while under the writes (keys of the
    // client's that no write uses: nothing the test checks).
    app.db
        .execute(
            "INSERT INTO ordering_keys (client_id, ordering_key, last_sequence, done_through)
             SELECT $1, 'bulk-' || n, 1, 1 FROM generate_series(1, $2::bigint) AS n",
            &[&moved, &BULK_ROWS],
        )
        .await
        .unwrap();
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    // Two loops of the moved shard's client, one of each other client.
    let mut clients = vec![moved];
    clients.extend(CLIENTS);
    let load = load_of(&app, "move", &clients);
    tokio::time::sleep(Duration::from_secs(3)).await;

    let moving = Instant::now();
    app.db
        .execute(
            "SELECT citus_move_shard_placement($1, '127.0.0.1', $2, '127.0.0.1', $3,
                                               shard_transfer_mode => 'block_writes')",
            &[&shard, &i32::from(from.port), &i32::from(to.port)],
        )
        .await
        .unwrap();
    let moved_in = moving.elapsed();
    assert_eq!(lab.worker_of(moved).port, to.port, "the shard moved");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let records = load.stop().await;
    records.assert_allowed();
    let failed = records
        .attempts
        .iter()
        .filter(|attempt| attempt.status != Some(201) && attempt.status != Some(200))
        .count();
    let during_the_move = records
        .attempts
        .iter()
        .filter(|attempt| clients[attempt.writer] == moved)
        .filter(|attempt| attempt.answered >= moving && attempt.sent <= moving + moved_in)
        .count();
    eprintln!(
        "the shard moved in {moved_in:?} under load, {during_the_move} writes of its client meanwhile: {} keys acknowledged, {} attempts, {failed} of them not answered 2xx",
        records.acknowledged.len(),
        records.attempts.len()
    );
    let order = records
        .assert_held_and_delivered(&app.db, &mut consumer, Duration::from_secs(90))
        .await;
    eprintln!(
        "{} events delivered ({} ordered), {} copies",
        records.acknowledged.len(),
        order.first_deliveries(),
        order.copies
    );

    // Once the daemon has read the map again (every `topology::REFRESH_INTERVAL`), the moved
    // client's writes run on the node that now holds its shard: planned and run there, none
    // through the old node. Each write is at least three single-shard statements (its claim,
    // entry and event), on one node or the other; nothing else writes meanwhile, but the
    // relays' and the janitor's passes over the old node's own shards are single-shard
    // statements there too: a few a round, never one per write.
    let token = token(moved);
    let deadline = Instant::now() + REFRESH_INTERVAL * 2;
    let mut rounds = Vec::new();
    let (on_from, on_to) = loop {
        let (from_before, to_before) = (single_shard_executions(from), single_shard_executions(to));
        for write in 0..WRITES {
            app.post_entry_as(
                Some(&token),
                &format!("after-{}-{write}", rounds.len()),
                &json!({"kind": "after", "data": {}}),
            )
            .await
            .assert_created();
        }
        let (on_from, on_to) = (
            single_shard_executions(from) - from_before,
            single_shard_executions(to) - to_before,
        );
        rounds.push((on_from, on_to));
        if on_from < WRITES && on_to >= 3 * WRITES {
            break (on_from, on_to);
        }
        assert!(
            Instant::now() < deadline,
            "{WRITES} writes of the moved shard's client still made {on_from} single-shard statements on the old node ({on_to} on the new) {:?} after the move",
            moving.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    eprintln!(
        "{WRITES} writes of the moved shard's client, in {} rounds: the first, {} single-shard statements on the old node and {} on the new; the last, {on_from} and {on_to}",
        rounds.len(),
        rounds[0].0,
        rounds[0].1
    );
}
