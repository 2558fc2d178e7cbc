//! The idempotency promise under hostile timing: a request is judged only against a committed
//! record, never against another request still in flight.

use std::time::Duration;

use crate::common::daemon::{spawn_app_with, spawn_second_app, TestDaemon};
use crate::common::helpers::{count, post_bounded, LockHolder, TestResponse};

const REQUEST_LIMIT: Duration = Duration::from_secs(60);

fn body(amount: i64) -> String {
    serde_json::json!({"kind": "invoice.paid", "data": {"invoice": 7, "amount": amount}})
        .to_string()
}

/// Posts in the background: the answer comes once the test lets the database go on.
fn post_later(
    app: &TestDaemon,
    key: &str,
    body: String,
) -> actix_web::rt::task::JoinHandle<TestResponse> {
    let (address, key) = (app.address.clone(), key.to_owned());
    actix_web::rt::spawn(async move { post_bounded(&address, &key, &body, REQUEST_LIMIT).await })
}

#[actix_web::test]
async fn a_retry_of_the_saved_request_is_a_replay_while_another_body_for_its_key_is_in_flight() {
    let first = spawn_app_with(|_| {}).await;
    let saved = post_later(&first, "reused-then-retried", body(100))
        .await
        .unwrap();
    saved.assert_created();
    let saved_id = saved.json()["id"].clone();

    // A daemon that does not have the key in its replay cache (another instance, or after a
    // restart): both requests go to the database. The saved record's row is locked for a moment,
    // so the second body is still in flight when the retry of the first arrives.
    let second = spawn_second_app(&first).await;
    let lock = LockHolder::take(
        &first.database.name,
        "SELECT 1 FROM idempotency_records WHERE key = 'reused-then-retried' FOR UPDATE",
    )
    .await;
    let other_body = post_later(&second, "reused-then-retried", body(999));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let retry = post_later(&second, "reused-then-retried", body(100));
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock.release().await;

    let other_body = other_body.await.unwrap();
    assert_eq!(
        other_body.problem_slug().as_deref(),
        Some("idempotency-key-reused"),
        "{}",
        other_body.describe()
    );
    let retry = retry.await.unwrap();
    assert_eq!(
        retry.status,
        201,
        "the retry of the saved request must be its replay, not \"use a new key\": {}",
        retry.describe()
    );
    assert!(retry.replayed());
    assert_eq!(retry.json()["id"], saved_id);
    assert_eq!(first.row_counts().await, (1, 1, 1));
}

#[actix_web::test]
async fn a_body_that_arrives_while_the_first_write_of_its_key_fails_is_run_not_refused() {
    let app = spawn_app_with(|settings| {
        settings.database.statement_timeout = Duration::from_secs(1);
    })
    .await;
    // Another session's uncommitted claim of the key makes the first write wait, then fail with
    // a lock timeout: nothing is saved for the key.
    let lock = LockHolder::claim(&app.database.name, "first-fails").await;
    let first = post_later(&app, "first-fails", body(1));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = post_later(&app, "first-fails", body(2));
    let first = first.await.unwrap();
    assert!(first.is_storage_unavailable(), "{}", first.describe());
    // The first write saved nothing; the second request must now run, not be told the key was
    // used by a request that never completed.
    lock.release().await;
    let second = second.await.unwrap();
    second.assert_created();
    assert!(
        !second.replayed(),
        "nothing was saved before: it runs afresh"
    );
    assert_eq!(second.json()["data"]["amount"], 2);
    assert_eq!(app.row_counts().await, (1, 1, 1));
    assert_eq!(
        count(
            &app.db,
            "SELECT count(*) FROM idempotency_records WHERE key = 'first-fails' AND entry_id IS NOT NULL"
        )
        .await,
        1
    );
}

#[actix_web::test]
async fn a_duplicate_with_the_same_body_waits_for_the_write_in_flight_and_is_its_replay() {
    let app = spawn_app_with(|_| {}).await;
    let lock = LockHolder::take(
        &app.database.name,
        "LOCK TABLE idempotency_records IN SHARE MODE",
    )
    .await;
    let first = post_later(&app, "duplicate", body(5));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let duplicate = post_later(&app, "duplicate", body(5));
    tokio::time::sleep(Duration::from_millis(200)).await;
    lock.release().await;
    let (first, duplicate) = (first.await.unwrap(), duplicate.await.unwrap());
    first.assert_created();
    assert!(!first.replayed());
    duplicate.assert_created();
    assert!(duplicate.replayed());
    assert_eq!(first.json()["id"], duplicate.json()["id"]);
    assert_eq!(app.row_counts().await, (1, 1, 1));
}
