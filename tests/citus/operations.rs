//! Operator commands and the admin API on a distributed outbox: status, retry, skip, replay,
//! purge, the admin routes, with events of clients on both workers.

use std::time::Duration;

use serde_json::json;

use crate::acceptance::{body, clients_on_two_workers, token, with_clients};
use crate::common::citus::CitusLab;
use crate::common::cli::{stderr, stdout};
use crate::common::consumer::{message_id, TestConsumer};
use crate::common::daemon::{spawn_app_on, TestDaemon};
use crate::common::helpers::{admin, count, eventually, TestResponse};

const ADMIN_TOKEN: &str = "rs_admin-token-for-citus";

async fn admin_call(
    app: &TestDaemon,
    request: awc::ClientRequest,
    body: serde_json::Value,
) -> TestResponse {
    let request = request
        .insert_header(("Authorization", format!("Bearer {ADMIN_TOKEN}")))
        .insert_header(("Content-Type", "application/json"));
    let body = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    app.send(request, body).await
}

fn admin_url(app: &TestDaemon, path: &str) -> String {
    format!("{}{path}", app.admin_address.as_deref().unwrap())
}

/// The event ids of `client`'s events in this state (`parked`, `held`: waiting behind a parked
/// event of their ordering key).
async fn event_ids(app: &TestDaemon, client: &str, parked: bool) -> Vec<String> {
    app.db
        .query(
            "SELECT event_id::text FROM outbox_events
             WHERE client_id = $1 AND sent_at IS NULL AND skipped_at IS NULL
               AND (failed_at IS NOT NULL) = $2
             ORDER BY id",
            &[&client, &parked],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[actix_web::test]
async fn operator_commands_and_the_admin_api_work_on_a_distributed_outbox() {
    let Some(lab) = CitusLab::start_if_available() else {
        return;
    };
    // No relay, no queue bound: every publish comes back NO_ROUTE and parks at once.
    let app = spawn_app_on(&lab.url(), false, |settings| {
        with_clients(settings);
        settings.outbox.max_attempts = 1;
        settings.auth.admins = vec![admin("ops", ADMIN_TOKEN)];
    })
    .await;
    let (first, second) = clients_on_two_workers(&lab);
    for client in [first, second] {
        for n in 0..2 {
            app.post_entry_as(Some(&token(client)), &format!("k-{n}"), &body(n))
                .await
                .assert_created();
        }
    }
    for n in 1..=2 {
        app.post_entry_as(
            Some(&token(first)),
            &format!("ordered-{n}"),
            &json!({"kind": "k", "data": {"n": n}, "ordering_key": "account"}),
        )
        .await
        .assert_created();
    }
    assert_eq!(app.relay_until_empty().await, 0);
    // The first ordered event parked holds the second back.
    assert_eq!(event_ids(&app, first, true).await.len(), 3);
    assert_eq!(event_ids(&app, first, false).await.len(), 1);
    assert_eq!(event_ids(&app, second, true).await.len(), 2);
    // Status: the parked events of both workers, and the one that holds its key back.
    let status = app.retrysafe(&["outbox", "status", "--json"]);
    assert!(status.status.success(), "{}", stderr(&status));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["backlog"][0]["parked"], 5, "{status}");
    assert_eq!(status["backlog"][0]["unsent"], 1, "{status}");
    assert_eq!(status["parked"][0]["parked"], 5, "{status}");
    let table = app.retrysafe(&["outbox", "status"]);
    assert!(table.status.success(), "{}", stderr(&table));

    // The admin API: the overview, a listing, a key, and a dry run, over both workers.
    let overview = admin_call(
        &app,
        app.http.get(admin_url(&app, "/admin/v1/outbox")),
        json!(null),
    )
    .await;
    assert_eq!(overview.status, 200, "{}", overview.describe());
    assert_eq!(overview.json()["parked"], 5, "{}", overview.describe());
    // The console's trends: the history's samples count both workers' parked events.
    let history = eventually(Duration::from_secs(30), || async {
        let request = app.http.get(admin_url(&app, "/admin/v1/outbox/history"));
        let answer = admin_call(&app, request, json!(null)).await;
        let last = answer.json()["hour"]["points"]
            .as_array()
            .and_then(|p| p.last().cloned());
        match last {
            Some(point) if answer.status == 200 && point["parked"] == 5 => Ok(point),
            _ => Err(answer.describe()),
        }
    })
    .await;
    assert_eq!(history["unsent"], 1, "{history}");
    let listed = admin_call(
        &app,
        app.http
            .get(admin_url(&app, "/admin/v1/events?state=parked&limit=3")),
        json!(null),
    )
    .await;
    assert_eq!(listed.status, 200, "{}", listed.describe());
    assert_eq!(listed.json()["events"].as_array().unwrap().len(), 3);
    let cursor = listed.json()["next"].as_str().unwrap().to_owned();
    let rest = admin_call(
        &app,
        app.http.get(admin_url(
            &app,
            &format!("/admin/v1/events?state=parked&limit=3&cursor={cursor}"),
        )),
        json!(null),
    )
    .await;
    assert_eq!(rest.status, 200, "{}", rest.describe());
    assert_eq!(rest.json()["events"].as_array().unwrap().len(), 2);
    let key = admin_call(
        &app,
        app.http.get(admin_url(
            &app,
            &format!("/admin/v1/keys/{first}/ordered-1"),
        )),
        json!(null),
    )
    .await;
    assert_eq!(key.status, 200, "{}", key.describe());
    let counted = admin_call(
        &app,
        app.http.post(admin_url(&app, "/admin/v1/events/retry")),
        json!({"client": second, "dry_run": true}),
    )
    .await;
    assert_eq!(counted.status, 200, "{}", counted.describe());
    assert_eq!(counted.json()["matched"], 2, "{}", counted.describe());

    // Skip the parked ordered event: the one it held goes on.
    let blocking = event_ids(&app, first, true).await[2].clone();
    let skipped = app.retrysafe(&["outbox", "skip", "--event", &blocking, "--reason", "test"]);
    assert!(skipped.status.success(), "{}", stderr(&skipped));
    assert!(
        stdout(&skipped).contains("1 event(s) released"),
        "{}",
        stdout(&skipped)
    );

    // Retry: one event by id (second's), then by the admin API (first's), then everything.
    let one = event_ids(&app, second, true).await[0].clone();
    let retried = app.retrysafe(&["outbox", "retry", "--event", &one]);
    assert!(retried.status.success(), "{}", stderr(&retried));
    assert!(
        stdout(&retried).contains("requeued 1 event"),
        "{}",
        stdout(&retried)
    );
    let by_admin = admin_call(
        &app,
        app.http
            .post(admin_url(&app, "/admin/v1/events/retry"))
            .insert_header(("Idempotency-Key", "retry-first")),
        json!({"client": first}),
    )
    .await;
    assert_eq!(by_admin.status, 200, "{}", by_admin.describe());
    assert_eq!(by_admin.json()["changed"], 2, "{}", by_admin.describe());
    let all = app.retrysafe(&["outbox", "retry", "--all"]);
    assert!(all.status.success(), "{}", stderr(&all));
    assert!(stdout(&all).contains("requeued 1"), "{}", stdout(&all));

    // With a queue bound, everything but the skipped event goes out.
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    assert_eq!(app.relay_until_empty().await, 5);
    assert_eq!(consumer.take(5, Duration::from_secs(30)).await.len(), 5);

    // Replay every sent event to a queue of its own.
    let replayed_to = TestConsumer::declare(&app.settings.amqp.exchange, "", None).await;
    let mut replayed_to = replayed_to;
    let queue = replayed_to.queue().to_owned();
    let replay = app.retrysafe(&["outbox", "replay", "--all", "--to-queue", &queue]);
    assert!(
        replay.status.success(),
        "{} {}",
        stdout(&replay),
        stderr(&replay)
    );
    let copies = replayed_to.take(5, Duration::from_secs(30)).await;
    assert_eq!(copies.len(), 5, "{}", stdout(&replay));
    assert!(!copies.iter().any(|copy| message_id(copy) == blocking));
    let again = app.retrysafe(&["outbox", "replay", "--all", "--to-queue", &queue]);
    assert!(again.status.success(), "{}", stderr(&again));

    // Purge: records past their expiry go, on both workers.
    lab.sql(
        "UPDATE idempotency_records SET expires_at = now() - interval '1 day' WHERE key LIKE 'k-%'",
    );
    let purge = app.retrysafe(&["purge"]);
    assert!(purge.status.success(), "{}", stderr(&purge));
    assert!(
        stdout(&purge).contains("deleted 4 expired idempotency record(s)"),
        "{}",
        stdout(&purge)
    );
    assert_eq!(
        count(&app.db, "SELECT count(*) FROM idempotency_records").await,
        2
    );
}
