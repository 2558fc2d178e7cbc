//! A worker that answers, but slowly (here its clients' shard locked: its batches wait, its
//! probes answer, so it is not given up as hung): a flood of its clients' writes fills its share
//! of the writers' queue, no more; past that they are refused at once with 503, while the other
//! worker's clients keep getting 201. Nothing refused is written, and the queued writes commit
//! once the worker goes on.

use std::time::Duration;

use futures_util::future::join_all;

use crate::acceptance::{body, clients_on_two_workers, token, with_clients};
use crate::common::citus::CitusLab;
use crate::common::daemon::spawn_app_on;
use crate::common::helpers::{connect_to, eventually, metric_sample};

/// The writers and their batches: 2 writers of 4 hold 64 writes queued, 32 of one node.
const WRITERS: usize = 2;
const MAX_BATCH: usize = 4;
/// More writes of the slow worker's clients at once than its share of the queue holds.
const FLOOD: i64 = 90;
const SHED: &str = "retrysafe_writes_shed_total{reason=\"node_queue_full\"}";
const QUEUE_FULL: &str = "retrysafe_writes_shed_total{reason=\"queue_full\"}";

#[actix_web::test]
async fn a_slow_worker_sheds_its_own_clients_writes_not_the_other_workers() {
    let Some(lab) = CitusLab::start_if_available() else {
        return;
    };
    let app = spawn_app_on(&lab.url(), false, |settings| {
        with_clients(settings);
        settings.database.writers = WRITERS;
        settings.database.max_batch = MAX_BATCH;
        settings.database.statement_timeout = Duration::from_secs(60);
    })
    .await;
    let (slow, other) = clients_on_two_workers(&lab);
    let shard: i64 = lab
        .sql(&format!(
            "SELECT get_shard_id_for_distribution_column('idempotency_records', '{slow}')"
        ))
        .parse()
        .expect("a shard id");
    let worker = lab.worker_of(slow);
    let mut locker = connect_to(&worker.url_of("retrysafe")).await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute(&format!(
        "SET LOCAL citus.enable_manual_changes_to_shards = on;
         LOCK TABLE idempotency_records_{shard} IN SHARE MODE"
    ))
    .await
    .unwrap();

    let slow_token = token(slow);
    let flood = join_all((0..FLOOD).map(|n| {
        let (app, token) = (&app, &slow_token);
        async move {
            let key = format!("slow-{n}");
            let answer = app.post_entry_as(Some(token), &key, &body(n)).await;
            (key, answer)
        }
    }));
    let other_writes = async {
        eventually(Duration::from_secs(30), || async {
            let metrics = app.get("/metrics", None).await.text();
            // Shed because its share is full (or, were there no share, the whole queue).
            let shed = [SHED, QUEUE_FULL]
                .iter()
                .filter_map(|metric| metric_sample(&metrics, metric))
                .sum::<f64>();
            if shed > 0.0 {
                Ok(())
            } else {
                Err("no write of the slow worker's clients shed yet".to_owned())
            }
        })
        .await;
        // The slow worker's writes hold their share of the queue: the other worker's go on.
        for n in 0..20 {
            let answer = app
                .post_entry_as(Some(&token(other)), &format!("other-{n}"), &body(n))
                .await;
            assert_eq!(
                answer.status,
                201,
                "a write of the other worker's client while the slow one's fill the queue: {}",
                answer.text()
            );
        }
        lock.rollback().await.unwrap();
    };
    let (answers, ()) = tokio::join!(flood, other_writes);
    let (created, refused): (Vec<_>, Vec<_>) =
        answers.iter().partition(|(_, answer)| answer.status == 201);
    eprintln!(
        "the slow worker's client: {} of {FLOOD} writes created, {} refused",
        created.len(),
        refused.len()
    );
    for (key, answer) in &refused {
        assert!(
            answer.is_storage_unavailable(),
            "{key}: {} {}",
            answer.status,
            answer.text()
        );
    }
    assert!(
        refused
            .iter()
            .any(|(_, answer)| answer.text().contains("share of the writers' queue")),
        "no write refused for the node's share of the queue"
    );
    let queue_share = (WRITERS.div_ceil(2) * MAX_BATCH * 8) as i64;
    assert!(
        created.len() as i64 <= queue_share + MAX_BATCH as i64,
        "{} writes of the slow worker's client created: more than its share of the queue and a batch",
        created.len()
    );
    assert!(!created.is_empty(), "no queued write committed");
    let written = app
        .count(&format!(
            "SELECT count(*) FROM idempotency_records WHERE client_id = '{slow}' AND key LIKE 'slow-%'"
        ))
        .await;
    assert_eq!(
        written,
        created.len() as i64,
        "the slow worker's client's records: only the created writes'"
    );
}
