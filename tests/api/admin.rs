//! The admin listener: who reaches it, every admin API route and its refusals, and the
//! console's login, session and CSRF checks (the console in a browser: `console.rs`).

use std::time::{Duration, Instant};

use futures_util::future::{join, join_all};
use serde_json::{json, Value};

use crate::common::consumer::TestConsumer;
use crate::common::daemon::{spawn_app_with, spawn_app_without_relays, TestDaemon};
use crate::common::helpers::{
    admin, client, count_is, entry_body, eventually, insert_backlog, LockHolder, TestResponse,
};

pub const ADMIN_TOKEN: &str = "rs_admin-token-for-tests";
const CLIENT_TOKEN: &str = "rs_client-token-for-tests";

/// A daemon without relays whose events park at their first failure (no queue is bound, so
/// every publish comes back NO_ROUTE), with one admin (`ops`).
pub async fn parking_daemon() -> TestDaemon {
    spawn_app_without_relays(|settings| {
        settings.outbox.max_attempts = 1;
        settings.auth.admins = vec![admin("ops", ADMIN_TOKEN)];
    })
    .await
}

/// Writes `n` entries and parks their events.
pub async fn park(app: &TestDaemon, prefix: &str, n: i64) {
    for i in 0..n {
        app.post_entry(&format!("{prefix}-{i}"), &entry_body(i))
            .await
            .assert_created();
    }
    assert_eq!(app.relay_until_empty().await, 0);
    assert_eq!(
        app.count(
            "SELECT count(*) FROM outbox_events WHERE failed_at IS NOT NULL AND sent_at IS NULL"
        )
        .await,
        n
    );
}

/// A client that shows redirects instead of following them.
pub fn http() -> awc::Client {
    awc::Client::builder()
        .disable_redirects()
        .timeout(Duration::from_secs(60))
        .finish()
}

pub fn admin_address(app: &TestDaemon) -> &str {
    app.admin_address
        .as_deref()
        .expect("the admin listener is up")
}

async fn admin_get(app: &TestDaemon, path: &str, token: Option<&str>) -> TestResponse {
    let mut request = http().get(format!("{}{path}", admin_address(app)));
    if let Some(token) = token {
        request = request.insert_header(("Authorization", format!("Bearer {token}")));
    }
    app.send(request, Vec::new()).await
}

pub async fn admin_post(
    app: &TestDaemon,
    path: &str,
    key: Option<&str>,
    body: impl Into<Vec<u8>>,
) -> TestResponse {
    let mut request = http()
        .post(format!("{}{path}", admin_address(app)))
        .insert_header(("Authorization", format!("Bearer {ADMIN_TOKEN}")))
        .insert_header(("Content-Type", "application/json"));
    if let Some(key) = key {
        request = request.insert_header(("Idempotency-Key", key));
    }
    app.send(request, body).await
}

fn assert_problem(response: &TestResponse, status: u16, slug: &str) {
    assert_eq!(response.status, status, "{}", response.describe());
    assert_eq!(
        response.problem_slug().as_deref(),
        Some(slug),
        "{}",
        response.describe()
    );
}

async fn unsent_parked(app: &TestDaemon) -> i64 {
    app.count("SELECT count(*) FROM outbox_events WHERE failed_at IS NOT NULL AND sent_at IS NULL AND skipped_at IS NULL")
        .await
}

#[actix_web::test]
async fn the_admin_listener_serves_admins_alone_and_only_when_there_are_some() {
    let without = spawn_app_with(|_| {}).await;
    assert!(without.admin_address.is_none(), "no admins, no listener");

    let app = spawn_app_with(|settings| {
        settings.auth.clients = vec![client("jobs", CLIENT_TOKEN)];
        settings.auth.admins = vec![admin("ops", ADMIN_TOKEN)];
    })
    .await;
    let missing = admin_get(&app, "/admin/v1/outbox", None).await;
    assert_problem(&missing, 401, "unauthorized");
    assert_eq!(
        missing.header("www-authenticate").as_deref(),
        Some("Bearer")
    );
    let as_client = admin_get(&app, "/admin/v1/outbox", Some(CLIENT_TOKEN)).await;
    assert_problem(&as_client, 401, "unauthorized");
    let as_admin = admin_get(&app, "/admin/v1/outbox", Some(ADMIN_TOKEN)).await;
    assert_eq!(as_admin.status, 200, "{}", as_admin.describe());
    assert!(as_admin.json()["broker"]["connected"].is_boolean());

    // An admin's token is not a client's: the API refuses it, and has no admin route.
    let on_api = app.get("/v1/entries", Some(ADMIN_TOKEN)).await;
    assert_problem(&on_api, 401, "unauthorized");
    let admin_on_api = app.get("/admin/v1/outbox", Some(ADMIN_TOKEN)).await;
    assert_problem(&admin_on_api, 404, "not-found");
    // And the console is not on the API's listener either.
    assert_eq!(app.get("/console", None).await.status, 404);

    // A page whose name was made to resolve to 127.0.0.1 (DNS rebinding) is refused.
    let rebound = app
        .send(
            http()
                .get(format!("{}/admin/v1/outbox", admin_address(&app)))
                .insert_header(("Host", "attacker.example"))
                .insert_header(("Authorization", format!("Bearer {ADMIN_TOKEN}"))),
            Vec::new(),
        )
        .await;
    assert_problem(&rebound, 421, "misdirected-request");
    let console_rebound = app
        .send(
            http()
                .get(format!("{}/console/login", admin_address(&app)))
                .insert_header(("Host", "attacker.example:8081")),
            Vec::new(),
        )
        .await;
    assert_problem(&console_rebound, 421, "misdirected-request");

    // Its own description.
    let described = admin_get(&app, "/openapi.json", None).await;
    assert_eq!(described.status, 200);
    let paths = described.json()["paths"].clone();
    for path in [
        "/admin/v1/outbox",
        "/admin/v1/outbox/history",
        "/admin/v1/events",
        "/admin/v1/events/{event_id}",
        "/admin/v1/events/retry",
        "/admin/v1/events/skip",
        "/admin/v1/keys/{client}/{key}",
        "/admin/v1/actions",
    ] {
        assert!(paths.get(path).is_some(), "{path} is described: {paths}");
        // The problem responses come from the admin listener's table: 401 everywhere.
        let operation = paths[path]
            .as_object()
            .and_then(|item| item.values().next())
            .unwrap();
        assert!(
            operation["responses"]["401"]["description"]
                .as_str()
                .is_some_and(|words| words.contains("`unauthorized`")),
            "{path}: {operation}"
        );
    }
    let retry = &paths["/admin/v1/events/retry"]["post"]["responses"];
    for status in ["400", "409", "413", "415", "503"] {
        assert!(retry.get(status).is_some(), "{status}: {retry}");
    }
    assert!(
        retry["503"]["headers"]["Retry-After"].is_object(),
        "{retry}"
    );
    let wrong_method = app
        .send(
            http()
                .delete(format!("{}/admin/v1/outbox", admin_address(&app)))
                .insert_header(("Authorization", format!("Bearer {ADMIN_TOKEN}"))),
            Vec::new(),
        )
        .await;
    assert_problem(&wrong_method, 405, "method-not-allowed");
}

#[actix_web::test]
async fn parked_events_are_grouped_listed_and_retried_by_selector_once_per_key() {
    let app = parking_daemon().await;
    park(&app, "parked", 3).await;

    let overview = admin_get(&app, "/admin/v1/outbox", Some(ADMIN_TOKEN)).await;
    assert_eq!(overview.status, 200, "{}", overview.describe());
    let overview = overview.json();
    assert_eq!(overview["parked"], 3, "{overview}");
    assert_eq!(
        overview["unsent"], 0,
        "parked events are not unsent: {overview}"
    );
    assert_eq!(overview["backlog"][0]["event_type"], "entry.created");
    assert_eq!(overview["backlog"][0]["parked"], 3);
    let group = &overview["parked_groups"][0];
    assert_eq!(group["parked"], 3, "{overview}");
    let error = group["last_error"].as_str().unwrap().to_owned();
    assert!(error.contains("NO_ROUTE"), "{error}");
    assert_eq!(overview["replays_in_progress"], 0);

    // Listed, newest first, in keyset pages.
    let first = admin_get(
        &app,
        "/admin/v1/events?state=parked&limit=2",
        Some(ADMIN_TOKEN),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.describe());
    let first = first.json();
    assert_eq!(first["events"].as_array().unwrap().len(), 2);
    assert_eq!(first["events"][0]["state"], "parked");
    assert_eq!(first["events"][0]["idempotency_key"], "parked-2");
    assert_eq!(
        first["events"][0]["payload"]["id"], first["events"][0]["event_id"],
        "the payload as published"
    );
    let next = first["next"].as_str().unwrap();
    let second = admin_get(
        &app,
        &format!("/admin/v1/events?state=parked&limit=2&cursor={next}"),
        Some(ADMIN_TOKEN),
    )
    .await
    .json();
    assert_eq!(second["events"].as_array().unwrap().len(), 1);
    assert_eq!(second["events"][0]["idempotency_key"], "parked-0");
    assert_eq!(second["next"], Value::Null);
    // A cursor belongs to its query: with another filter it is refused, and so is its number.
    for other in [
        format!("state=skipped&limit=2&cursor={next}"),
        format!("state=parked&type=other&cursor={next}"),
    ] {
        let refused = admin_get(
            &app,
            &format!("/admin/v1/events?{other}"),
            Some(ADMIN_TOKEN),
        )
        .await;
        assert_problem(&refused, 400, "invalid-request");
        assert!(
            refused.json()["detail"]
                .as_str()
                .unwrap()
                .contains("another query"),
            "{}",
            refused.describe()
        );
    }
    let actions_cursor = admin_get(
        &app,
        &format!("/admin/v1/actions?cursor={next}"),
        Some(ADMIN_TOKEN),
    )
    .await;
    assert_problem(&actions_cursor, 400, "invalid-request");
    let sent = admin_get(&app, "/admin/v1/events?state=sent", Some(ADMIN_TOKEN)).await;
    assert_eq!(sent.json()["events"], json!([]));
    for bad in [
        "state=lost",
        "limit=0",
        "cursor=abc",
        "created_after=yesterday",
        "client=no%20spaces",
        "bogus=1",
        "type=a&type=b",
    ] {
        let refused = admin_get(&app, &format!("/admin/v1/events?{bad}"), Some(ADMIN_TOKEN)).await;
        assert_problem(&refused, 400, "invalid-request");
    }

    // A selector that would match everything must say so; nothing changes meanwhile.
    let everything = admin_post(&app, "/admin/v1/events/retry", Some("k-all"), "{}").await;
    assert_problem(&everything, 400, "invalid-request");
    assert!(everything.text().contains("all"), "{}", everything.text());
    let no_key = admin_post(
        &app,
        "/admin/v1/events/retry",
        None,
        json!({"type": "entry.created"}).to_string(),
    )
    .await;
    assert_problem(&no_key, 400, "missing-idempotency-key");
    let counted = admin_post(
        &app,
        "/admin/v1/events/retry",
        None,
        json!({"error": error, "dry_run": true}).to_string(),
    )
    .await;
    assert_eq!(counted.status, 200, "{}", counted.describe());
    assert_eq!(counted.json()["matched"], 3);
    assert_eq!(counted.json()["matched_capped"], false);
    assert_eq!(counted.json()["changed"], 0);
    assert_eq!(unsent_parked(&app).await, 3, "a dry run changes nothing");
    assert_eq!(app.count("SELECT count(*) FROM admin_actions").await, 0);

    // Retried by group, once per key.
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    let selector = json!({"type": "entry.created", "error": error});
    let retried = admin_post(
        &app,
        "/admin/v1/events/retry",
        Some("k-1"),
        selector.to_string(),
    )
    .await;
    assert_eq!(retried.status, 200, "{}", retried.describe());
    assert!(!retried.replayed());
    let outcome = retried.json();
    assert_eq!(outcome["changed"], 3, "{outcome}");
    assert_eq!(outcome["matched"], 3);
    assert_eq!(outcome["admin_id"], "ops");
    assert_eq!(unsent_parked(&app).await, 0);
    let again = admin_post(
        &app,
        "/admin/v1/events/retry",
        Some("k-1"),
        // The same selector, written otherwise.
        format!(
            "  {{\"error\": {},\n \"type\": \"entry.created\"}}",
            json!(error)
        ),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.describe());
    assert!(again.replayed(), "the first answer, replayed");
    assert_eq!(again.json(), outcome);
    let reused = admin_post(
        &app,
        "/admin/v1/events/retry",
        Some("k-1"),
        json!({"type": "audit.entry.created"}).to_string(),
    )
    .await;
    assert_problem(&reused, 409, "idempotency-key-reused");
    assert_eq!(app.count("SELECT count(*) FROM admin_actions").await, 1);

    app.relay_until_empty().await;
    let delivered = consumer.drain(Duration::from_secs(2)).await;
    assert_eq!(
        delivered.len(),
        3,
        "the retried events reach the bound queue"
    );

    let log = admin_get(&app, "/admin/v1/actions", Some(ADMIN_TOKEN)).await;
    assert_eq!(log.status, 200, "{}", log.describe());
    let log = log.json();
    let actions = log["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 1, "{log}");
    assert_eq!(actions[0]["admin_id"], "ops");
    assert_eq!(actions[0]["action"], "retry");
    assert_eq!(actions[0]["changed"], 3);
    assert_eq!(actions[0]["selector"], selector);
}

#[actix_web::test]
async fn events_are_skipped_by_id_and_bad_selectors_change_nothing() {
    let app = parking_daemon().await;
    park(&app, "skip", 3).await;
    let event: uuid::Uuid = app
        .db
        .query_one(
            "SELECT event_id FROM outbox_events WHERE idempotency_key = 'skip-1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    let bad_bodies: [(&str, &str, u16, &str); 8] = [
        ("{\"event_ids\": [\"x\"]}", "application/json", 400, "malformed-json"),
        ("{\"typo\": 1}", "application/json", 400, "malformed-json"),
        ("{\"type\": \"a\\u0000b\"}", "application/json", 400, "invalid-request"),
        ("{\"type\": \"\"}", "application/json", 400, "invalid-request"),
        ("{\"client\": \"jobs\", \"event_ids\": [\"8d1a5d4e-9a43-4c44-8f3a-6a2f0f4b3c11\"]}", "application/json", 400, "invalid-request"),
        ("{\"created_after\": \"2026-12-02T00:00:00Z\", \"created_before\": \"2026-12-01T00:00:00Z\"}", "application/json", 400, "invalid-request"),
        ("{\"all\": true}", "text/plain", 415, "unsupported-media-type"),
        ("{\"created_after\": \"-5000-01-01T00:00:00Z\"}", "application/json", 400, "invalid-request"),
    ];
    for (body, content_type, status, slug) in bad_bodies {
        let response = app
            .send(
                http()
                    .post(format!("{}/admin/v1/events/skip", admin_address(&app)))
                    .insert_header(("Authorization", format!("Bearer {ADMIN_TOKEN}")))
                    .insert_header(("Content-Type", content_type))
                    .insert_header(("Idempotency-Key", "bad")),
                body.to_owned(),
            )
            .await;
        assert_problem(&response, status, slug);
    }
    let huge = format!("{{\"type\": \"{}\"}}", "x".repeat(100 * 1024));
    let too_large = admin_post(&app, "/admin/v1/events/skip", Some("huge"), huge).await;
    assert_problem(&too_large, 413, "payload-too-large");
    assert_eq!(unsent_parked(&app).await, 3, "nothing was skipped");
    assert_eq!(app.count("SELECT count(*) FROM admin_actions").await, 0);

    let skipped = admin_post(
        &app,
        "/admin/v1/events/skip",
        Some("skip-one"),
        json!({"event_ids": [event]}).to_string(),
    )
    .await;
    assert_eq!(skipped.status, 200, "{}", skipped.describe());
    assert_eq!(skipped.json()["changed"], 1);
    assert_eq!(unsent_parked(&app).await, 2);
    let recorded = app
        .db
        .query_one(
            "SELECT admin_id, reason FROM outbox_skips WHERE event_id = $1",
            &[&event],
        )
        .await
        .unwrap();
    assert_eq!(recorded.get::<_, Option<String>>(0).as_deref(), Some("ops"));
    assert!(recorded.get::<_, String>(1).starts_with("admin action "));
    let listed = admin_get(&app, "/admin/v1/events?state=skipped", Some(ADMIN_TOKEN))
        .await
        .json();
    assert_eq!(listed["events"][0]["event_id"], json!(event));
    // Skipping it again changes nothing more.
    let twice = admin_post(
        &app,
        "/admin/v1/events/skip",
        Some("skip-again"),
        json!({"event_ids": [event]}).to_string(),
    )
    .await;
    assert_eq!(twice.json()["changed"], 0, "{}", twice.describe());
    let everything = admin_post(
        &app,
        "/admin/v1/events/skip",
        Some("skip-all"),
        json!({"all": true, "dry_run": true}).to_string(),
    )
    .await;
    assert_eq!(everything.json()["matched"], 2, "{}", everything.describe());
}

#[actix_web::test]
async fn any_clients_key_is_looked_up() {
    let app = parking_daemon().await;
    park(&app, "lookup", 1).await;
    let found = admin_get(&app, "/admin/v1/keys/anonymous/lookup-0", Some(ADMIN_TOKEN)).await;
    assert_eq!(found.status, 200, "{}", found.describe());
    let found = found.json();
    assert_eq!(found["key"], "lookup-0");
    assert_eq!(found["events"][0]["event_type"], "entry.created");
    assert!(found["events"][0]["failed_at"].is_string(), "{found}");
    let missing = admin_get(&app, "/admin/v1/keys/anonymous/nope", Some(ADMIN_TOKEN)).await;
    assert_problem(&missing, 404, "not-found");
    let other_client = admin_get(&app, "/admin/v1/keys/jobs/lookup-0", Some(ADMIN_TOKEN)).await;
    assert_problem(&other_client, 404, "not-found");
    let bad_client = admin_get(&app, "/admin/v1/keys/a%20b/lookup-0", Some(ADMIN_TOKEN)).await;
    assert_problem(&bad_client, 400, "invalid-request");
}

/// The event id of the (first) event of a write with Idempotency-Key `key`.
pub async fn event_of(app: &TestDaemon, key: &str) -> uuid::Uuid {
    app.db
        .query_one(
            "SELECT event_id FROM outbox_events WHERE idempotency_key = $1 ORDER BY id LIMIT 1",
            &[&key],
        )
        .await
        .unwrap()
        .get(0)
}

/// Two writes of one ordering key, `<prefix>-1` and `<prefix>-2`, whose head parks (no queue
/// is bound) and whose second waits behind it; and a replay that published the head again,
/// as `retrysafe outbox replay` records one. The two events' ids.
pub async fn parked_head_and_held_event(
    app: &TestDaemon,
    prefix: &str,
) -> (uuid::Uuid, uuid::Uuid) {
    for n in 1..=2 {
        app.post_entry(
            &format!("{prefix}-{n}"),
            &json!({"kind": "invoice.event", "data": {"n": n}, "ordering_key": prefix}),
        )
        .await
        .assert_created();
    }
    app.relay_until_empty().await;
    let (head, held) = (
        event_of(app, &format!("{prefix}-1")).await,
        event_of(app, &format!("{prefix}-2")).await,
    );
    app.db
        .execute(
            "WITH replay AS (
                 INSERT INTO replays (selection, selection_hash, target, requested_by, status,
                                      max_event_id, events_total, events_sent)
                 VALUES ('{}', '\\x00', 'queue:audit', 'alice@ops', 'completed', 0, 1, 1)
                 RETURNING id)
             INSERT INTO event_replays (client_id, event_id, replay_id)
             SELECT 'anonymous', $1, id FROM replay",
            &[&head],
        )
        .await
        .unwrap();
    (head, held)
}

#[actix_web::test]
async fn an_event_has_a_page_with_its_errors_what_it_waits_for_and_its_replays() {
    let app = parking_daemon().await;
    let (head, held) = parked_head_and_held_event(&app, "page").await;

    let page = admin_get(&app, &format!("/admin/v1/events/{head}"), Some(ADMIN_TOKEN)).await;
    assert_eq!(page.status, 200, "{}", page.describe());
    let page = page.json();
    assert_eq!(page["event_id"], head.to_string());
    assert_eq!(page["state"], "parked", "{page}");
    assert_eq!(page["attempts"], 1);
    assert_eq!(page["ordering_key"], "page");
    assert_eq!(page["sequence"], 1);
    let last_error = page["last_error"].as_str().unwrap_or_default();
    assert!(last_error.contains("NO_ROUTE"), "{page}");
    assert_eq!(
        page["first_error"], page["last_error"],
        "one failed attempt"
    );
    assert!(page["first_error_at"].is_string(), "{page}");
    assert_eq!(page["first_error_at"], page["last_error_at"]);
    assert!(page["failed_at"].is_string(), "{page}");
    assert_eq!(
        page["next_attempt_at"],
        Value::Null,
        "a parked event is not due"
    );
    assert_eq!(page["held"], false);
    assert_eq!(page["waits_for"], Value::Null, "the head waits for nothing");
    assert_eq!(page["payload"]["data"]["data"]["n"], 1, "{page}");
    assert_eq!(page["replay_count"], 1);
    assert_eq!(page["replays"][0]["target"], "queue:audit", "{page}");
    assert_eq!(page["replays"][0]["requested_by"], "alice@ops");

    let waiting = admin_get(&app, &format!("/admin/v1/events/{held}"), Some(ADMIN_TOKEN))
        .await
        .json();
    assert_eq!(waiting["state"], "unsent", "{waiting}");
    assert_eq!(waiting["held"], true);
    assert_eq!(waiting["attempts"], 0);
    assert_eq!(waiting["first_error"], Value::Null);
    assert_eq!(
        waiting["waits_for"],
        json!({"event_id": head.to_string(), "parked": true})
    );
    assert_eq!(waiting["replay_count"], 0);
    // The list of unsent events says it too.
    let unsent = admin_get(&app, "/admin/v1/events?state=unsent", Some(ADMIN_TOKEN))
        .await
        .json();
    assert_eq!(
        unsent["events"][0]["event_id"],
        held.to_string(),
        "{unsent}"
    );
    assert_eq!(unsent["events"][0]["waits_for"]["parked"], true);

    // Once retried and failed again, the first error keeps its time and the last moves on.
    let first_at = page["first_error_at"].clone();
    app.db
        .execute(
            "UPDATE outbox_events SET failed_at = NULL, next_attempt_at = now() WHERE event_id = $1",
            &[&head],
        )
        .await
        .unwrap();
    app.relay_until_empty().await;
    let again = admin_get(&app, &format!("/admin/v1/events/{head}"), Some(ADMIN_TOKEN))
        .await
        .json();
    assert_eq!(again["attempts"], 2, "{again}");
    assert_eq!(again["first_error_at"], first_at);
    assert_ne!(again["last_error_at"], first_at, "{again}");

    let refused = admin_get(&app, &format!("/admin/v1/events/{head}"), None).await;
    assert_problem(&refused, 401, "unauthorized");
    let missing = admin_get(
        &app,
        &format!("/admin/v1/events/{}", uuid::Uuid::new_v4()),
        Some(ADMIN_TOKEN),
    )
    .await;
    assert_problem(&missing, 404, "not-found");
    let malformed = admin_get(&app, "/admin/v1/events/nope", Some(ADMIN_TOKEN)).await;
    assert_problem(&malformed, 400, "invalid-request");
}

/// The cookie `Set-Cookie` sets, as `name=value`.
fn session_cookie(response: &TestResponse) -> String {
    let set = response
        .header("set-cookie")
        .unwrap_or_else(|| panic!("a session cookie: {}", response.describe()));
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(attribute), "{attribute}: {set}");
    }
    set.split(';').next().unwrap().to_owned()
}

async fn console_post(
    app: &TestDaemon,
    path: &str,
    cookie: Option<&str>,
    origin: Option<&str>,
    form: &str,
) -> TestResponse {
    let mut request = http()
        .post(format!("{}{path}", admin_address(app)))
        .insert_header(("Content-Type", "application/x-www-form-urlencoded"));
    if let Some(cookie) = cookie {
        request = request.insert_header(("Cookie", cookie.to_owned()));
    }
    if let Some(origin) = origin {
        request = request.insert_header(("Origin", origin.to_owned()));
    }
    app.send(request, form.to_owned()).await
}

/// The value of the hidden field `name` in a page.
fn hidden(page: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = page
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} in the page"))
        + marker.len();
    page[start..].split('"').next().unwrap().to_owned()
}

#[actix_web::test]
async fn the_console_takes_a_login_and_refuses_forms_without_the_sessions_csrf_token() {
    let app = parking_daemon().await;
    park(&app, "console", 2).await;
    let own_origin = admin_address(&app).to_owned();

    let anonymous = admin_get(&app, "/console", None).await;
    assert_eq!(anonymous.status, 303);
    assert_eq!(
        anonymous.header("location").as_deref(),
        Some("/console/login")
    );
    let wrong = console_post(&app, "/console/login", None, None, "token=rs_nope").await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_none());
    let client_token = console_post(&app, "/console/login", None, None, "token=").await;
    assert_eq!(client_token.status, 401);
    let cross_site = console_post(
        &app,
        "/console/login",
        None,
        Some("http://attacker.example"),
        &format!("token={ADMIN_TOKEN}"),
    )
    .await;
    assert_problem(&cross_site, 403, "forbidden");

    let login = console_post(
        &app,
        "/console/login",
        None,
        Some(&own_origin),
        &format!("token={ADMIN_TOKEN}"),
    )
    .await;
    assert_eq!(login.status, 303, "{}", login.describe());
    let cookie = session_cookie(&login);
    let page = app
        .send(
            http()
                .get(format!("{own_origin}/console"))
                .insert_header(("Cookie", cookie.clone())),
            Vec::new(),
        )
        .await;
    assert_eq!(page.status, 200, "{}", page.describe());
    assert!(page.text().contains("needs attention"), "{}", page.text());
    assert!(page.text().contains("NO_ROUTE"));
    assert!(page
        .header("content-security-policy")
        .unwrap()
        .contains("frame-ancestors 'none'"));
    let csrf = hidden(&page.text(), "csrf");

    let ids: Vec<uuid::Uuid> = app
        .db
        .query("SELECT event_id FROM outbox_events ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let form = format!("action=retry&key=form-1&event_id={}", ids[0]);
    let no_session = console_post(
        &app,
        "/console/act",
        None,
        None,
        &format!("{form}&csrf={csrf}"),
    )
    .await;
    assert_problem(&no_session, 401, "unauthorized");
    let no_csrf = console_post(&app, "/console/act", Some(&cookie), None, &form).await;
    assert_problem(&no_csrf, 403, "forbidden");
    let wrong_csrf = console_post(
        &app,
        "/console/act",
        Some(&cookie),
        None,
        &format!("{form}&csrf=00"),
    )
    .await;
    assert_problem(&wrong_csrf, 403, "forbidden");
    let other_origin = console_post(
        &app,
        "/console/act",
        Some(&cookie),
        Some("http://attacker.example"),
        &format!("{form}&csrf={csrf}"),
    )
    .await;
    assert_problem(&other_origin, 403, "forbidden");
    assert_eq!(unsent_parked(&app).await, 2, "nothing was retried");

    let done = console_post(
        &app,
        "/console/act",
        Some(&cookie),
        Some(&own_origin),
        &format!("{form}&csrf={csrf}"),
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.describe());
    assert!(done.text().contains("1 of 1 event(s)"), "{}", done.text());
    assert_eq!(unsent_parked(&app).await, 1);
    let resent = console_post(
        &app,
        "/console/act",
        Some(&cookie),
        Some(&own_origin),
        &format!("{form}&csrf={csrf}"),
    )
    .await;
    assert!(
        resent.text().contains("already been sent"),
        "{}",
        resent.text()
    );
    assert_eq!(app.count("SELECT count(*) FROM admin_actions").await, 1);

    let logout = console_post(
        &app,
        "/console/logout",
        Some(&cookie),
        Some(&own_origin),
        &format!("csrf={csrf}"),
    )
    .await;
    assert_eq!(logout.status, 303);
    let after = app
        .send(
            http()
                .get(format!("{own_origin}/console"))
                .insert_header(("Cookie", cookie.clone())),
            Vec::new(),
        )
        .await;
    assert_eq!(after.status, 303, "the session ended");
}

#[actix_web::test]
async fn skipping_parked_heads_of_ordering_keys_lets_each_key_go_on() {
    let app = parking_daemon().await;
    // Two keys, two writes each; the heads park (no queue is bound), the seconds wait behind.
    for key in ["k-a", "k-b"] {
        for n in 1..=2 {
            app.post_entry(
                &format!("{key}-{n}"),
                &json!({"kind": "invoice.event", "data": {"n": n}, "ordering_key": key}),
            )
            .await
            .assert_created();
        }
    }
    app.relay_until_empty().await;
    let held = "SELECT count(*) FROM outbox_events WHERE next_attempt_at = 'infinity'";
    assert_eq!(app.count(held).await, 2, "each key's second event waits");
    let overview = admin_get(&app, "/admin/v1/outbox", Some(ADMIN_TOKEN))
        .await
        .json();
    assert_eq!(overview["blocked"]["keys"], 2, "{overview}");
    assert_eq!(overview["blocked"]["events"], 2, "{overview}");
    assert_eq!(overview["blocked"]["by"].as_array().unwrap().len(), 2);

    // Both heads at once, by filter (the parked events of the type).
    let skipped = admin_post(
        &app,
        "/admin/v1/events/skip",
        Some("skip-heads"),
        json!({"type": "entry.created"}).to_string(),
    )
    .await;
    assert_eq!(skipped.status, 200, "{}", skipped.describe());
    assert_eq!(skipped.json()["changed"], 2, "{}", skipped.describe());
    assert_eq!(app.count(held).await, 0, "each key went on past its head");
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_skips WHERE admin_id = 'ops'")
            .await,
        2
    );
}

/// `sent` sent events, sent in id order one millisecond apart an hour ago (the `rare` oldest of
/// type `audit.entry.created`, the others `entry.created`), then `unsent` unsent ones, newer
/// than all of them: the outbox at retention size in small, with the backlog at the end of the
/// primary key. Analyzed, so that the planner knows it.
async fn sent_behind_a_backlog(app: &TestDaemon, sent: i64, rare: i64, unsent: i64) {
    app.db
        .execute(
            "INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key, event_type,
                                        payload, created_at, sent_at)
             SELECT gen_random_uuid(), 'sent/' || n, 'anonymous', 'sent-' || n,
                    CASE WHEN n <= $2 THEN 'audit.entry.created' ELSE 'entry.created' END,
                    jsonb_build_object('n', n),
                    now() - interval '1 hour' + n * interval '1 ms',
                    now() - interval '1 hour' + n * interval '1 ms' + interval '50 ms'
             FROM generate_series(1, $1::bigint) AS n",
            &[&sent, &rare],
        )
        .await
        .unwrap();
    insert_backlog(&app.db, unsent).await;
    app.db.batch_execute("ANALYZE outbox_events").await.unwrap();
}

/// Index entries read so far from the outbox's indexes that sent rows are in (the primary key,
/// the unique ones, `outbox_events_sent`), as the statistics have them; not the partial indexes
/// of unsent and parked rows, which the gauges read every few seconds.
async fn outbox_index_reads(app: &TestDaemon) -> i64 {
    app.count(
        "SELECT coalesce(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes
         WHERE relname = 'outbox_events'
           AND indexrelname NOT IN ('outbox_events_due', 'outbox_events_parked',
                                    'outbox_events_ordered_unsent')",
    )
    .await
}

#[actix_web::test]
async fn pages_of_sent_events_come_last_sent_first_without_walking_the_backlog() {
    let app = parking_daemon().await;
    let backlog = 5_000;
    sent_behind_a_backlog(&app, 15_000, 0, backlog).await;
    // The oldest event was sent last (a retry that went through at last).
    app.db
        .execute(
            "UPDATE outbox_events SET sent_at = now() WHERE event_key = 'sent/1'",
            &[],
        )
        .await
        .unwrap();

    let before = outbox_index_reads(&app).await;
    let first = admin_get(
        &app,
        "/admin/v1/events?state=sent&limit=50",
        Some(ADMIN_TOKEN),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.describe());
    // What the page read, once the daemon's session has reported it (within a second or so
    // of going idle).
    let read = eventually(Duration::from_secs(15), || async {
        let read = outbox_index_reads(&app).await - before;
        if read >= 50 {
            Ok(read)
        } else {
            Err(format!("{read} index entries read so far"))
        }
    })
    .await;
    assert!(
        read < 1_000,
        "a page of 50 sent events read {read} index entries: it walked the {backlog} unsent events"
    );
    let first = first.json();
    let keys: Vec<&str> = first["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| event["idempotency_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 50, "{first}");
    assert_eq!(keys[0], "sent-1", "the last sent first: {keys:?}");
    assert_eq!(keys[1], "sent-15000");
    assert_eq!(keys[49], "sent-14952");
    assert_eq!(first["partial"], false);

    // The next page goes on from the cursor, in the same order.
    let next = first["next"].as_str().unwrap();
    let second = admin_get(
        &app,
        &format!("/admin/v1/events?state=sent&limit=50&cursor={next}"),
        Some(ADMIN_TOKEN),
    )
    .await
    .json();
    assert_eq!(
        second["events"][0]["idempotency_key"], "sent-14951",
        "{second}"
    );
    assert_eq!(second["events"].as_array().unwrap().len(), 50);
}

/// Rows of the outbox read by the statement `read` in a transaction of its own, from the
/// transaction's statistics (heap rows fetched through an index, and by a scan): no other
/// session's reads count.
async fn outbox_rows_read_by<T>(app: &TestDaemon, read: impl AsyncFnOnce() -> T) -> (T, i64) {
    app.db.batch_execute("BEGIN").await.unwrap();
    let result = read().await;
    let rows = app
        .count(
            "SELECT (coalesce(idx_tup_fetch, 0) + seq_tup_read)::bigint FROM pg_stat_xact_user_tables
             WHERE relname = 'outbox_events'",
        )
        .await;
    app.db.batch_execute("COMMIT").await.unwrap();
    (result, rows)
}

#[actix_web::test]
async fn a_page_of_unsent_events_reads_a_page_however_many_parked_events_are_newer() {
    use retrysafe::admin::store::{events_page, EventFilter, EventState};
    let app = parking_daemon().await;
    insert_backlog(&app.db, 200).await;
    // Parked events newer than every unsent one: the end of the primary key, as a stopped
    // consumer leaves it.
    let parked: i64 = 5_000;
    app.db
        .execute(
            "INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key, event_type,
                                        payload, attempts, last_error, failed_at)
             SELECT gen_random_uuid(), 'parked/' || n, 'anonymous', 'parked-' || n, 'entry.created',
                    '{}', 1, 'returned by the broker: NO_ROUTE', now()
             FROM generate_series(1, $1::bigint) AS n",
            &[&parked],
        )
        .await
        .unwrap();
    app.db.batch_execute("ANALYZE outbox_events").await.unwrap();
    let filter = EventFilter {
        state: EventState::Unsent,
        event_type: None,
        client: None,
        error: None,
        created_after: None,
        created_before: None,
    };
    let (first, read) =
        outbox_rows_read_by(&app, async || events_page(&app.db, &filter, None, 50).await).await;
    let first = first.unwrap();
    assert!(
        read < 200,
        "a page of 50 unsent events read {read} outbox rows: it walked the {parked} parked ones"
    );
    let keys = |page: &retrysafe::admin::store::EventsPage| -> Vec<String> {
        page.events
            .iter()
            .map(|event| event.idempotency_key.clone())
            .collect()
    };
    // In the relays' order: due at one time, so by id.
    let first_keys = keys(&first);
    assert_eq!(first_keys.len(), 50);
    assert_eq!(
        (first_keys[0].as_str(), first_keys[49].as_str()),
        ("backlog-1", "backlog-50")
    );
    let cursor = first.events.last().map(|event| event.position);
    let (second, read) = outbox_rows_read_by(&app, async || {
        events_page(&app.db, &filter, cursor, 50).await
    })
    .await;
    assert!(read < 200, "the next page read {read} outbox rows");
    assert_eq!(keys(&second.unwrap())[0], "backlog-51");
}

#[actix_web::test]
async fn a_filter_that_matches_few_events_examines_a_bounded_walk_and_says_the_page_is_partial() {
    let app = parking_daemon().await;
    // 3 rare events, the oldest sent, behind 1,497 others: more than the 1,000 a page of 50
    // looks at.
    sent_behind_a_backlog(&app, 1_500, 3, 100).await;
    let first = admin_get(
        &app,
        "/admin/v1/events?state=sent&type=audit.entry.created",
        Some(ADMIN_TOKEN),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.describe());
    let first = first.json();
    assert_eq!(first["events"], json!([]), "{first}");
    assert_eq!(
        first["partial"], true,
        "the walk stopped at its cap: {first}"
    );
    let next = first["next"]
        .as_str()
        .unwrap_or_else(|| panic!("a partial page says where to go on: {first}"));
    let second = admin_get(
        &app,
        &format!("/admin/v1/events?state=sent&type=audit.entry.created&cursor={next}"),
        Some(ADMIN_TOKEN),
    )
    .await
    .json();
    let keys: Vec<&str> = second["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| event["idempotency_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["sent-3", "sent-2", "sent-1"], "{second}");
    assert_eq!(second["partial"], false);
    assert_eq!(second["next"], Value::Null, "the walk reached the end");
}

#[actix_web::test]
async fn the_dry_run_of_a_retry_by_filter_counts_up_to_the_cap_and_the_retry_requeues_them_all() {
    let app = spawn_app_without_relays(|settings| {
        settings.auth.admins = vec![admin("ops", ADMIN_TOKEN)];
        // Requeuing 100,001 events on a loaded machine: more than the default 5 s.
        settings.database.statement_timeout = Duration::from_secs(60);
    })
    .await;
    let parked = 100_001_i64;
    app.db
        .execute(
            "INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key, event_type,
                                        payload, attempts, last_error, failed_at)
             SELECT gen_random_uuid(), 'parked/' || n, 'anonymous', 'parked-' || n,
                    'entry.created', '{}', 1, 'returned by the broker: NO_ROUTE', now()
             FROM generate_series(1, $1::bigint) AS n",
            &[&parked],
        )
        .await
        .unwrap();
    let selector = json!({"error": "returned by the broker: NO_ROUTE"});
    let mut dry_run = selector.clone();
    dry_run["dry_run"] = json!(true);
    let counted = admin_post(&app, "/admin/v1/events/retry", None, dry_run.to_string()).await;
    assert_eq!(counted.status, 200, "{}", counted.describe());
    let counted = counted.json();
    assert_eq!(
        counted["matched"], 100_000,
        "counted up to the cap: {counted}"
    );
    assert_eq!(counted["matched_capped"], true, "{counted}");

    let retried = admin_post(
        &app,
        "/admin/v1/events/retry",
        Some("all-of-them"),
        selector.to_string(),
    )
    .await;
    assert_eq!(retried.status, 200, "{}", retried.describe());
    let retried = retried.json();
    assert_eq!(retried["changed"], parked, "{retried}");
    assert_eq!(
        retried["matched"], parked,
        "at least what it changed: {retried}"
    );
    assert_eq!(retried["matched_capped"], true, "{retried}");
    count_is(
        &app.db,
        "SELECT count(*) FROM outbox_events WHERE failed_at IS NOT NULL",
        0,
    )
    .await
    .unwrap();
}

#[actix_web::test]
async fn admin_reads_wait_for_turns_of_their_own_and_client_listings_keep_their_connections() {
    // A pool of 8: 6 for writes, 2 for reads, of which admins may take 1.
    let app = spawn_app_without_relays(|settings| {
        settings.auth.admins = vec![admin("ops", ADMIN_TOKEN)];
        settings.database.pool_size = 8;
        settings.database.statement_timeout = Duration::from_secs(30);
    })
    .await;
    app.post_entry("listed", &entry_body(1))
        .await
        .assert_created();
    // The action log cannot be read until the test lets go: an admin read that takes long.
    let lock = LockHolder::take(
        &app.database.name,
        "LOCK TABLE admin_actions IN ACCESS EXCLUSIVE MODE",
    )
    .await;
    let slow = admin_get(&app, "/admin/v1/actions", Some(ADMIN_TOKEN));
    let meanwhile = async {
        eventually(Duration::from_secs(15), || {
            count_is(
                &app.db,
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE '%admin_actions%'",
                1,
            )
        })
        .await;
        let excess = join_all((0..3).map(|_| async {
            let started = Instant::now();
            let response = admin_get(&app, "/admin/v1/actions", Some(ADMIN_TOKEN)).await;
            (response, started.elapsed())
        }));
        let listing = async {
            let started = Instant::now();
            let response = app.get("/v1/entries", None).await;
            (response, started.elapsed())
        };
        let (excess, (listing, listed_in)) = join(excess, listing).await;
        assert_eq!(listing.status, 200, "{}", listing.describe());
        assert!(
            listed_in < Duration::from_secs(3),
            "the client's listing waited {listed_in:?} behind admin reads"
        );
        for (response, waited) in excess {
            assert_problem(&response, 503, "storage-unavailable");
            assert!(
                response.header("retry-after").is_some(),
                "{}",
                response.describe()
            );
            assert!(response.text().contains("admin"), "{}", response.text());
            // A turn is waited for as long as a pooled connection (database.connect_timeout).
            assert!(
                waited < app.settings.database.connect_timeout + Duration::from_secs(3),
                "an excess admin read waited {waited:?}"
            );
        }
        lock.release().await;
    };
    let (slow, ()) = join(slow, meanwhile).await;
    assert_eq!(slow.status, 200, "{}", slow.describe());
}

#[actix_web::test]
async fn a_retry_that_passes_the_statement_timeout_changes_nothing_and_its_key_acts_later() {
    let app = spawn_app_without_relays(|settings| {
        settings.outbox.max_attempts = 1;
        settings.auth.admins = vec![admin("ops", ADMIN_TOKEN)];
        settings.database.statement_timeout = Duration::from_secs(1);
    })
    .await;
    park(&app, "slow", 3).await;
    // A relay (or anyone) holding one of the events: the requeue waits for it, within the
    // statement's time limit.
    let lock = LockHolder::take(
        &app.database.name,
        "SELECT 1 FROM outbox_events WHERE idempotency_key = 'slow-1' FOR UPDATE",
    )
    .await;
    let selector = json!({"type": "entry.created"}).to_string();
    let timed_out = admin_post(
        &app,
        "/admin/v1/events/retry",
        Some("retry-slow"),
        selector.clone(),
    )
    .await;
    assert_problem(&timed_out, 503, "storage-unavailable");
    assert_eq!(unsent_parked(&app).await, 3, "nothing was requeued");
    assert_eq!(
        app.count("SELECT count(*) FROM admin_actions").await,
        0,
        "nor recorded"
    );
    lock.release().await;
    let retried = admin_post(&app, "/admin/v1/events/retry", Some("retry-slow"), selector).await;
    assert_eq!(retried.status, 200, "{}", retried.describe());
    assert!(!retried.replayed(), "the key acted only now");
    assert_eq!(retried.json()["changed"], 3);
    assert_eq!(unsent_parked(&app).await, 0);
}

/// The hour's points of `GET /admin/v1/outbox/history` once `ready` holds for them.
pub async fn history_points(
    app: &TestDaemon,
    ready: impl Fn(&[Value]) -> Result<(), String>,
) -> Vec<Value> {
    eventually(Duration::from_secs(30), || async {
        let answer = admin_get(app, "/admin/v1/outbox/history", Some(ADMIN_TOKEN)).await;
        if answer.status != 200 {
            return Err(answer.describe());
        }
        let points = answer.json()["hour"]["points"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        ready(&points).map(|()| points)
    })
    .await
}

/// Parks `parked` events (no queue bound), then binds a queue and writes and sends `sent`
/// more: keys `<prefix>-parked-<n>` and `<prefix>-sent-<n>`.
pub async fn park_then_send(app: &TestDaemon, prefix: &str, parked: i64, sent: i64) {
    park(app, &format!("{prefix}-parked"), parked).await;
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    for i in 0..sent {
        app.post_entry(&format!("{prefix}-sent-{i}"), &entry_body(i))
            .await
            .assert_created();
    }
    assert_eq!(app.relay_until_empty().await, sent as usize);
    assert_eq!(
        consumer.drain(Duration::from_secs(2)).await.len(),
        sent as usize
    );
}

/// The sum of a field over points, nulls as 0.
pub fn total(points: &[Value], field: &str) -> i64 {
    points
        .iter()
        .filter_map(|point| point[field].as_i64())
        .sum()
}

#[actix_web::test]
async fn the_outbox_history_counts_each_event_sent_and_parked_once_with_the_databases_time() {
    let app = parking_daemon().await;
    let refused = admin_get(&app, "/admin/v1/outbox/history", None).await;
    assert_problem(&refused, 401, "unauthorized");

    park_then_send(&app, "history", 4, 3).await;

    // Every event in exactly one point's window: the sums are the counts, never more.
    let points = history_points(&app, |points| {
        let (sent, parked) = (total(points, "sent"), total(points, "newly_parked"));
        let last = points.last().ok_or("no point yet")?;
        if sent == 3 && parked == 4 && last["parked"] == 4 && last["unsent"] == 0 {
            Ok(())
        } else {
            Err(format!("sent {sent}, parked {parked}, last point {last}"))
        }
    })
    .await;
    let first = &points[0];
    assert!(
        first["sent"].is_null(),
        "the first sample has no window: {first}"
    );
    let peak_rate = points
        .iter()
        .filter_map(|point| point["sent_per_second"].as_f64())
        .fold(0.0, f64::max);
    assert!(peak_rate > 0.0, "{points:?}");
    // The times are the database's, in order.
    let times: Vec<chrono::DateTime<chrono::Utc>> = points
        .iter()
        .map(|point| point["at"].as_str().unwrap().parse().unwrap())
        .collect();
    assert!(times.windows(2).all(|pair| pair[0] < pair[1]), "{times:?}");
    let database_now = app.count("SELECT extract(epoch FROM now())::bigint").await;
    let newest = times.last().unwrap().timestamp();
    assert!(
        (database_now - newest).abs() <= 5,
        "the newest point at {newest}, the database's now {database_now}"
    );
    let answer = admin_get(&app, "/admin/v1/outbox/history", Some(ADMIN_TOKEN)).await;
    let history = answer.json();
    assert_eq!(history["counts_capped_at"], 100_000);
    assert_eq!(history["hour"]["step_seconds"], 0.5);
    assert_eq!(
        history["hour"]["span_seconds"], 180.0,
        "360 points of 0.5 s"
    );
    assert_eq!(history["day"]["step_seconds"], 15.0);
}
