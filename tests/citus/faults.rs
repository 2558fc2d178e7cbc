//! Faults on Citus: a worker stopped fails only its clients' writes, and the cluster back,
//! everything resumes with nothing acknowledged lost, nothing written twice, ordered keys in
//! order.

use std::time::Duration;

use serde_json::json;

use crate::acceptance::{clients_on_two_workers, daemon_on, token, until_answered};
use crate::common::citus::CitusLab;
use crate::common::consumer::TestConsumer;
use crate::common::daemon::TestDaemon;
use crate::common::helpers::{connect_to, count, count_is, eventually, TestResponse};
use crate::common::ordering::assert_all_delivered_in_order;

/// `client`'s `n`th ordered write, of its key `account`: its idempotency key and body.
fn ordered_write(n: i64) -> (String, serde_json::Value) {
    (
        format!("ordered-{n}"),
        json!({"kind": "k", "data": {"n": n}, "ordering_key": "account"}),
    )
}

/// An ordered write of `client`'s key `account`, its `n`th.
async fn ordered(app: &TestDaemon, client: &str, n: i64) -> TestResponse {
    let (key, body) = ordered_write(n);
    app.post_entry_as(Some(&token(client)), &key, &body).await
}

/// The write again until it is acknowledged (as a caller's retries do), at most for a minute.
async fn until_created(app: &TestDaemon, client: &str, n: i64) -> TestResponse {
    let (key, body) = ordered_write(n);
    until_answered(app, client, (&key, &body), Duration::from_secs(60)).await
}

#[actix_web::test]
async fn a_stopped_worker_fails_only_its_clients_writes_and_everything_resumes_when_it_is_back() {
    let Some(lab) = CitusLab::start_if_available() else {
        return;
    };
    let app = daemon_on(&lab).await;
    let (down, up) = clients_on_two_workers(&lab);
    let worker = lab.worker_of(down);
    let worker_name = format!("127.0.0.1:{}", worker.port);
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    for client in [down, up] {
        ordered(&app, client, 1).await.assert_created();
    }

    worker.stop();
    // The stopped worker's client: refused, to be retried, and nothing of it written.
    let refused = ordered(&app, down, 2).await;
    assert!(refused.is_storage_unavailable(), "{}", refused.describe());
    // The other client goes on, its events delivered while the worker is down.
    for n in 2..=4 {
        ordered(&app, up, n).await.assert_created();
    }
    let unsent_of_up =
        format!("SELECT count(*) FROM outbox_events WHERE client_id = '{up}' AND sent_at IS NULL");
    eventually(Duration::from_secs(30), || {
        count_is(&app.db, &unsent_of_up, 0)
    })
    .await;
    // Ready (other writes succeed), naming the failing worker.
    let ready = app
        .readyz_once(|answer| answer.json()["failing_workers"].is_array())
        .await;
    assert_eq!(ready.status, 200, "{}", ready.describe());
    let failing = &ready.json()["failing_workers"];
    assert_eq!(failing.as_array().unwrap().len(), 1, "{failing}");
    assert_eq!(failing[0]["node"], json!(worker_name));
    assert_eq!(failing[0]["error_class"], json!("unavailable"));
    assert!(
        failing[0]["error"]
            .as_str()
            .unwrap()
            .contains(&worker.port.to_string()),
        "{failing}"
    );
    assert_eq!(ready.json()["writes"], json!("ok"));

    worker.start_again();
    // The refused write, retried, is made once; the worker is no longer named, with no other
    // write of its clients needed to tell.
    eventually(Duration::from_secs(30), || async {
        let answer = app.get("/readyz", None).await;
        match answer.json().get("failing_workers") {
            None if answer.status == 200 => Ok(()),
            _ => Err(answer.describe()),
        }
    })
    .await;
    let retried = until_created(&app, down, 2).await;
    assert!(!retried.replayed(), "the refused write was not made");
    assert!(until_created(&app, down, 2).await.replayed());
    ordered(&app, down, 3).await.assert_created();

    assert_eq!(
        count(
            &app.db,
            &format!("SELECT count(*) FROM entries WHERE client_id = '{down}'")
        )
        .await,
        3
    );
    assert_eq!(
        count(
            &app.db,
            &format!("SELECT count(*) FROM entries WHERE client_id = '{up}'")
        )
        .await,
        4
    );
    assert_all_delivered_in_order(&app.db, &mut consumer, Duration::from_secs(90)).await;
}

/// Writes go to the workers that hold their shards: with the coordinator stopped they go on,
/// their events too (the relays claim on the workers), their outbox ids reserved by the workers
/// once the coordinator's block is used up (`IdBlocks`); after it is back, nothing was lost.
#[actix_web::test]
async fn writes_go_on_through_the_workers_while_the_coordinator_is_down_and_lose_nothing() {
    let Some(lab) = CitusLab::start_if_available() else {
        return;
    };
    let app = daemon_on(&lab).await;
    let (first, second) = clients_on_two_workers(&lab);
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    for client in [first, second] {
        ordered(&app, client, 1).await.assert_created();
    }

    lab.coordinator.stop();
    // Past the reserved block's life: the next ids come from the workers' own ranges.
    tokio::time::sleep(retrysafe::db::topology::citus::ID_BLOCK_LIFE).await;
    for client in [first, second] {
        ordered(&app, client, 2).await.assert_created();
    }
    lab.coordinator.start_again();

    for client in [first, second] {
        ordered(&app, client, 3).await.assert_created();
    }
    let ready = app.readyz_once(|answer| answer.status == 200).await;
    assert_eq!(ready.status, 200, "{}", ready.describe());
    // The test's own connection did not live through the restart.
    let db = connect_to(&lab.url()).await;
    assert_eq!(count(&db, "SELECT count(*) FROM entries").await, 6);
    assert_all_delivered_in_order(&db, &mut consumer, Duration::from_secs(90)).await;
}
