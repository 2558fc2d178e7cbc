//! The outbox under the weight of what it keeps: many parked events must not stop retention
//! (the janitor finds old sent events by an index of its own), and requeueing parked events is
//! done by selector and at a pace, so that a consumer with little room is not handed them all
//! at once to park them again.

use std::process::Command;
use std::time::Duration;

use crate::common::daemon::spawn_app_without_relays;
use crate::common::helpers::{count, entry_body};

/// Parked events of `event_type` for `client`, with `error`, parked `parked_ago` ago.
async fn insert_parked(
    db: &tokio_postgres::Client,
    rows: i64,
    (event_type, client, error, parked_ago): (&str, &str, &str, &str),
) {
    db.execute(
        "INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key, event_type,
                                    payload, attempts, last_error, failed_at)
         SELECT gen_random_uuid(), 'parked/' || gen_random_uuid(), $2, 'parked-' || n, $1,
                '{\"specversion\":\"1.0\"}', 20, $3, now() - $4::text::interval
         FROM generate_series(1, $5::bigint) AS n",
        &[&event_type, &client, &error, &parked_ago, &rows],
    )
    .await
    .unwrap();
}

#[actix_web::test]
async fn parked_events_do_not_stop_the_janitor_and_readyz_counts_them() {
    let app = spawn_app_without_relays(|_| {}).await;
    // 10,000 parked events, the oldest rows of the outbox, then 2,000 sent 8 days ago and 500
    // sent an hour ago.
    insert_parked(
        &app.db,
        10_000,
        (
            "entry.created",
            "anonymous",
            "returned by the broker: NO_ROUTE",
            "9 days",
        ),
    )
    .await;
    app.db
        .execute(
            "INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key, event_type,
                                        payload, created_at, sent_at)
             SELECT gen_random_uuid(), 'sent/' || n, 'anonymous', 'sent-' || n, 'entry.created',
                    '{}', now() - interval '8 days', now() - CASE WHEN n <= 2000
                        THEN interval '8 days' ELSE interval '1 hour' END
             FROM generate_series(1, 2500) AS n",
            &[],
        )
        .await
        .unwrap();
    let db = retrysafe::db::Database::new(&app.config().database).unwrap();
    let report = retrysafe::janitor::purge_once(&db, Duration::from_secs(7 * 24 * 3600))
        .await
        .unwrap();
    assert_eq!(
        report.events_deleted, 2000,
        "every sent event past the retention"
    );
    assert_eq!(
        count(
            &app.db,
            "SELECT count(*) FROM outbox_events WHERE failed_at IS NOT NULL"
        )
        .await,
        10_000,
        "parked events stay"
    );
    assert_eq!(
        count(
            &app.db,
            "SELECT count(*) FROM outbox_events WHERE sent_at IS NOT NULL"
        )
        .await,
        500,
        "recent sent events stay"
    );
    // The query reads the sent events' index, not the parked rows in front of them.
    let plan: String = app
        .db
        .query(
            "EXPLAIN SELECT id FROM outbox_events
             WHERE sent_at IS NOT NULL AND sent_at < now() - interval '7 days'
             ORDER BY sent_at LIMIT 1000",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(plan.contains("outbox_events_sent"), "{plan}");

    let ready = app
        .readyz_once(|ready| ready.json()["outbox_parked"] == 10_000)
        .await;
    assert_eq!(ready.json()["outbox_backlog"], 0, "{}", ready.describe());
}

/// `retrysafe outbox retry ARGS` on the test's database; its output, and whether it succeeded.
fn outbox_retry(database_url: &str, args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_retrysafe"))
        .args(["outbox", "retry", "--config"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml"))
        .args(args)
        .env("RETRYSAFE_DATABASE__URL", database_url)
        .output()
        .unwrap();
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[actix_web::test]
async fn outbox_retry_requeues_by_selector_and_at_a_rate() {
    let app = spawn_app_without_relays(|_| {}).await;
    let url = &app.settings.database.url;
    insert_parked(
        &app.db,
        500,
        (
            "entry.created",
            "billing",
            "nacked by the broker: a queue refused it",
            "1 hour",
        ),
    )
    .await;
    insert_parked(
        &app.db,
        30,
        (
            "audit.entry.created",
            "billing",
            "returned by the broker: NO_ROUTE",
            "1 hour",
        ),
    )
    .await;
    insert_parked(
        &app.db,
        20,
        (
            "entry.created",
            "reports",
            "nacked by the broker: a queue refused it",
            "3 days",
        ),
    )
    .await;
    let parked = "SELECT count(*) FROM outbox_events WHERE failed_at IS NOT NULL";

    // A selection is required: a bare retry is refused, and changes nothing.
    let (ok, output) = outbox_retry(url, &[]);
    assert!(!ok, "{output}");
    assert_eq!(count(&app.db, parked).await, 550);

    // A dry run counts and changes nothing.
    let (ok, output) = outbox_retry(url, &["--error", "NO_ROUTE", "--dry-run"]);
    assert!(ok, "{output}");
    assert!(
        output.contains("30 parked event(s) would be requeued"),
        "{output}"
    );
    assert_eq!(count(&app.db, parked).await, 550);

    // Type, client, error and when parked narrow the selection; 500 requeued at 100 a second
    // are due over five seconds, not at once, with a fresh attempt count.
    let (ok, output) = outbox_retry(
        url,
        &[
            "--type",
            "entry.created",
            "--client",
            "billing",
            "--error",
            "nacked",
            "--since",
            "2h",
            "--rate",
            "100",
        ],
    );
    assert!(ok, "{output}");
    assert!(output.contains("requeued 500 event(s)"), "{output}");
    let row = app
        .db
        .query_one(
            "SELECT count(*), extract(epoch FROM max(next_attempt_at) - min(next_attempt_at))::float8,
                    max(attempts)
             FROM outbox_events WHERE failed_at IS NULL AND sent_at IS NULL",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 500);
    let spread: f64 = row.get(1);
    assert!(
        (4.9..=5.1).contains(&spread),
        "500 events at 100 a second are due over 4.99 s: {spread}"
    );
    assert_eq!(row.get::<_, i32>(2), 0);
    assert_eq!(
        count(&app.db, parked).await,
        50,
        "the other type, client and older ones stay parked"
    );

    // --all takes what is left; an unknown event id is an error.
    let (ok, output) = outbox_retry(url, &["--all"]);
    assert!(ok && output.contains("requeued 50 event(s)"), "{output}");
    let (ok, output) = outbox_retry(url, &["--event", &uuid::Uuid::new_v4().to_string()]);
    assert!(!ok && output.contains("no unsent event"), "{output}");
    // The write path is untouched by all this.
    app.post_entry("after-retry", &entry_body(1))
        .await
        .assert_created();
}
