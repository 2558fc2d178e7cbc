//! Running it: expiry and retention, metrics, the OpenAPI description, graceful shutdown.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use retrysafe::http::problem::{ProblemType, METHOD_NOT_ALLOWED, MISDIRECTED_REQUEST};
use retrysafe::janitor::purge_once;

use crate::common::consumer::{header, TestConsumer};
use crate::common::daemon::{
    spawn_app_with, spawn_app_without_relays, spawn_binary, spawn_second_app_with, TestDaemon,
};
use crate::common::helpers::{entry_body, metric_sample, test_settings, TestDatabase};

const WAIT: Duration = Duration::from_secs(30);

#[actix_web::test]
async fn after_its_retention_a_key_is_new_again() {
    let app =
        spawn_app_with(|settings| settings.idempotency.retention = Duration::from_secs(1)).await;
    let db = retrysafe::db::Database::new(&app.config().database).unwrap();
    let body = entry_body(1);
    let first = app.post_entry("expiring", &body).await;
    first.assert_created();
    let replay = app.post_entry("expiring", &body).await;
    assert!(replay.replayed());

    tokio::time::sleep(Duration::from_millis(1200)).await;
    app.get("/v1/idempotency-keys/expiring", None)
        .await
        .assert_problem(404, "not-found");
    let report = purge_once(&db, app.settings.outbox.retention)
        .await
        .unwrap();
    assert_eq!(report.records_deleted, 1);
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_records").await,
        0
    );

    // The replay cache forgets the key too: a new request with it makes a new entry.
    let again = app.post_entry("expiring", &entry_body(2)).await;
    again.assert_created();
    assert_eq!(again.header("idempotency-replayed"), None);
    assert_ne!(again.json()["id"], first.json()["id"]);
    assert_eq!(
        app.count("SELECT count(*) FROM entries WHERE idempotency_key = 'expiring'")
            .await,
        2
    );
}

/// The daemon's passes start where the previous one ended, not at the beginning of each table
/// (whose index there is full of entries of rows deleted since vacuum ran): a row that expired
/// before where they stand (here, set back by hand, as a failover to a server with a slower
/// clock would) waits for the next pass that starts from the beginning, every
/// `FULL_PASS_EVERY`-th.
#[actix_web::test]
async fn janitor_passes_resume_where_the_last_ended_and_every_tenth_starts_over() {
    use retrysafe::db::topology::Topology;
    use retrysafe::janitor::{purge_from, PassStart, FULL_PASS_EVERY};
    // No daemon: its own janitor would delete the rows in between.
    let settings = test_settings();
    let _database = TestDatabase::new(&settings);
    let config = settings.validated().unwrap();
    retrysafe::db::migrate(&config.database).await.unwrap();
    let db = retrysafe::db::Database::new(&config.database).unwrap();
    let passes = Topology::detect(&db, &[]).await.unwrap().passes();
    assert_eq!(passes.len(), 1, "a single server is one pass");
    let everything = &passes[0];
    let (client, connection) =
        tokio_postgres::connect(settings.database.url.as_str(), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    let count = async |sql: &str| client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0);
    let retention = Duration::from_secs(7 * 24 * 3600);
    let expired = |key: &str, ago: &str| {
        format!(
            "INSERT INTO idempotency_records (client_id, key, request_hash, status, response_status,
                                              response_json, expires_at)
             VALUES ('anonymous', '{key}', '\\x00', 'completed', 201, '{{}}', now() - interval '{ago}');
             INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key,
                                        event_type, payload, sent_at)
             VALUES (gen_random_uuid(), '{key}/entry.created', 'anonymous', '{key}',
                     'entry.created', '{{}}', now() - interval '8 days' - interval '{ago}')"
        )
    };
    client
        .batch_execute(&expired("recent", "1 minute"))
        .await
        .unwrap();
    let mut start = PassStart::default();
    let first = purge_from(retention, everything, &mut start).await.unwrap();
    assert_eq!((first.records_deleted, first.events_deleted), (1, 1));

    // Expired before where the passes stand.
    client
        .batch_execute(&expired("straggler", "1 hour"))
        .await
        .unwrap();
    for pass in 2..=FULL_PASS_EVERY {
        let report = purge_from(retention, everything, &mut start).await.unwrap();
        assert_eq!(
            (report.records_deleted, report.events_deleted),
            (0, 0),
            "pass {pass} started where the first ended"
        );
    }
    assert_eq!(
        count("SELECT count(*) FROM idempotency_records WHERE key = 'straggler'").await,
        1
    );
    let full = purge_from(retention, everything, &mut start).await.unwrap();
    assert_eq!((full.records_deleted, full.events_deleted), (1, 1));
    assert_eq!(count("SELECT count(*) FROM idempotency_records").await, 0);
    assert_eq!(count("SELECT count(*) FROM outbox_events").await, 0);
}

/// The outbox gauges count at most `GAUGE_COUNT_CAP` rows each, so that a refresh costs the same
/// whatever the backlog; below the cap they are exact.
#[actix_web::test]
async fn the_outbox_gauges_count_up_to_their_cap() {
    use retrysafe::outbox::store::{totals, GAUGE_COUNT_CAP};
    let app = spawn_app_without_relays(|_| {}).await;
    let insert = |rows: i64, parked: bool, age: &str| {
        format!(
            "INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key,
                                        event_type, payload, created_at, failed_at)
             SELECT gen_random_uuid(), '{age}-{parked}/' || g, 'anonymous', 'k' || g,
                    'entry.created', '{{}}', now() - interval '{age}',
                    CASE WHEN {parked} THEN now() END
             FROM generate_series(1, {rows}) AS g"
        )
    };
    app.db
        .batch_execute(&(insert(10, false, "1 hour") + ";" + &insert(3, true, "2 hours")))
        .await
        .unwrap();
    let below = totals(&app.db).await.unwrap();
    assert_eq!((below.unsent, below.parked), (10, 3));
    let age = below.oldest_unsent_age_seconds.unwrap();
    assert!((3600.0..3700.0).contains(&age), "{age}");

    app.db
        .batch_execute(&insert(GAUGE_COUNT_CAP + 40, false, "1 minute"))
        .await
        .unwrap();
    let capped = totals(&app.db).await.unwrap();
    assert_eq!((capped.unsent, capped.parked), (GAUGE_COUNT_CAP, 3));
    let age = capped.oldest_unsent_age_seconds.unwrap();
    assert!(
        (3600.0..3700.0).contains(&age),
        "the oldest is due first: {age}"
    );
}

/// The tables the janitor deletes from are vacuumed after 2 % of their rows are dead (plus
/// 10,000), not after PostgreSQL's default 20 % (migration V12); the others keep the server's
/// settings.
#[actix_web::test]
async fn the_purged_tables_are_vacuumed_sooner_than_by_default() {
    let app = spawn_app_without_relays(|_| {}).await;
    let rows = app
        .db
        .query(
            "SELECT relname, coalesce(array_to_string(reloptions, ','), '') FROM pg_class
             WHERE relname IN ('idempotency_records', 'outbox_events', 'entries')
               AND relkind = 'r' ORDER BY relname",
            &[],
        )
        .await
        .unwrap();
    let options: Vec<(String, String)> = rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    let tuned = "autovacuum_vacuum_scale_factor=0.02,autovacuum_vacuum_threshold=10000";
    assert_eq!(
        options,
        [
            ("entries".to_string(), String::new()),
            ("idempotency_records".to_string(), tuned.to_string()),
            ("outbox_events".to_string(), tuned.to_string()),
        ]
    );
}

/// A pass goes on batch after batch, each from where the last ended: rows that share one time
/// across a batch's end are deleted too, and what has not expired, or was not sent, stays.
#[actix_web::test]
async fn a_janitor_pass_deletes_every_batch_with_ties_at_their_ends() {
    let app = spawn_app_without_relays(|_| {}).await;
    // 1,500 records expired at one instant (a batch ends among them), 1,000 more at distinct
    // times after, and 10 not expired.
    app.db
        .batch_execute(
            "INSERT INTO idempotency_records (client_id, key, request_hash, status, response_status,
                                              response_json, expires_at)
             SELECT 'anonymous', 'purge-' || g, '\\x00', 'completed', 201, '{}',
                    CASE WHEN g <= 1500 THEN now() - interval '2 hours'
                         WHEN g <= 2500 THEN now() - interval '1 hour' + g * interval '1 ms'
                         ELSE now() + interval '1 hour' END
             FROM generate_series(1, 2510) AS g;
             INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key,
                                        event_type, payload, sent_at)
             SELECT gen_random_uuid(), 'purge/' || g, 'anonymous', 'purge-' || g, 'entry.created',
                    '{}', CASE WHEN g <= 1500 THEN now() - interval '8 days'
                               WHEN g <= 2500 THEN now() - interval '8 days' + g * interval '1 ms'
                               WHEN g <= 2505 THEN now() END
             FROM generate_series(1, 2510) AS g",
        )
        .await
        .unwrap();
    let db = retrysafe::db::Database::new(&app.config().database).unwrap();
    let report = purge_once(&db, Duration::from_secs(7 * 24 * 3600))
        .await
        .unwrap();
    assert_eq!(report.records_deleted, 2500);
    assert_eq!(report.events_deleted, 2500);
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_records WHERE expires_at > now()")
            .await,
        10
    );
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_records").await,
        10
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE sent_at IS NULL")
            .await,
        5,
        "unsent events stay"
    );
    assert_eq!(app.count("SELECT count(*) FROM outbox_events").await, 10);
}

#[actix_web::test]
async fn an_expired_key_is_new_again_even_before_the_janitor_runs() {
    let app =
        spawn_app_with(|settings| settings.idempotency.retention = Duration::from_secs(1)).await;
    let first = app.post_entry("expired-unpurged", &entry_body(1)).await;
    first.assert_created();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Another daemon (no cache) meets the expired record in the database and takes it over. Its
    // own record is kept an hour, so that a slow machine cannot expire it before it is read.
    let other = spawn_second_app_with(&app, |settings| {
        settings.idempotency.retention = Duration::from_secs(3600)
    })
    .await;
    let again = other.post_entry("expired-unpurged", &entry_body(1)).await;
    again.assert_created();
    assert_eq!(
        again.header("idempotency-replayed"),
        None,
        "an expired record is not replayed"
    );
    assert_ne!(again.json()["id"], first.json()["id"]);
    let key = other
        .get("/v1/idempotency-keys/expired-unpurged", None)
        .await
        .json();
    assert_eq!(key["entry_id"], again.json()["id"]);
    assert_eq!(
        key["events"].as_array().unwrap().len(),
        1,
        "only the new entry's events: {key}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_records").await,
        1
    );
    assert_eq!(app.count("SELECT count(*) FROM outbox_events").await, 2);
}

#[actix_web::test]
async fn the_janitor_removes_sent_events_past_their_retention_and_keeps_unsent_ones() {
    let app =
        spawn_app_without_relays(|settings| settings.outbox.retention = Duration::from_secs(1))
            .await;
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    app.post_entry("retained", &entry_body(1))
        .await
        .assert_created();
    assert_eq!(app.relay_until_empty().await, 1, "sent");
    consumer.next(WAIT).await.expect("delivered");
    // An old unsent event and an old parked one, as a broker outage would leave them.
    app.db
        .batch_execute(
            "INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key, event_type, payload, created_at, next_attempt_at, failed_at)
             VALUES (gen_random_uuid(), 'old/unsent', 'anonymous', 'old-1', 'entry.created', '{}', now() - interval '1 day', now() + interval '1 hour', NULL),
                    (gen_random_uuid(), 'old/parked', 'anonymous', 'old-2', 'entry.created', '{}', now() - interval '1 day', now(), now() - interval '1 day')",
        )
        .await
        .unwrap();
    // Each of the three replayed once: the record of a deleted event goes with it.
    app.db
        .batch_execute(
            "WITH replay AS (
                 INSERT INTO replays (selection, selection_hash, target, requested_by, status,
                                      max_event_id, events_total)
                 VALUES ('{\"all\": true}', '\\x00', 'queue:rebuild', 'test@host', 'completed', 3, 3)
                 RETURNING id
             )
             INSERT INTO event_replays (client_id, event_id, replay_id)
             SELECT client_id, event_id, replay.id FROM outbox_events, replay",
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let db = retrysafe::db::Database::new(&app.config().database).unwrap();
    let report = purge_once(&db, app.settings.outbox.retention)
        .await
        .unwrap();
    assert_eq!(report.events_deleted, 1);
    assert_eq!(
        app.count(
            "SELECT count(*) FROM event_replays r
             WHERE EXISTS (SELECT 1 FROM outbox_events o WHERE o.event_id = r.event_id)"
        )
        .await,
        2
    );
    assert_eq!(app.count("SELECT count(*) FROM event_replays").await, 2);
    assert_eq!(
        app.count("SELECT count(*) FROM replays").await,
        1,
        "the replay itself stays on record"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE sent_at IS NOT NULL")
            .await,
        0
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE sent_at IS NULL")
            .await,
        2
    );
}

#[actix_web::test]
async fn openapi_json_describes_every_route_and_problem_type() {
    let app = spawn_app_with(|_| {}).await;
    let response = app.get("/openapi.json", None).await;
    assert_eq!(response.status, 200);
    let document = response.json();
    assert!(document["openapi"].as_str().unwrap().starts_with("3.1"));
    let paths: HashSet<&str> = document["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let expected: HashSet<&str> = [
        "/v1/entries",
        "/v1/entries/{id}",
        "/v1/idempotency-keys/{key}",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    ]
    .into();
    assert_eq!(paths, expected);
    let list = &document["paths"]["/v1/entries"]["get"];
    for status in ["200", "400", "401", "503"] {
        assert!(
            list["responses"].get(status).is_some(),
            "GET /v1/entries documents no {status}"
        );
    }
    let parameters: HashSet<&str> = list["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|parameter| parameter["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        parameters,
        HashSet::from([
            "kind",
            "created_after",
            "created_before",
            "order",
            "limit",
            "cursor"
        ])
    );
    let schemas = &document["components"]["schemas"];
    let event = &schemas["EventView"]["properties"];
    assert!(event.get("replay_count").is_some() && event.get("last_replayed_at").is_some());
    assert!(event.get("blocked_by").is_some() && event.get("skipped_at").is_some());
    // Ordered delivery: the optional body member, and the entry's number wherever it is shown.
    assert_eq!(
        schemas["NewEntryRequest"]["properties"]["ordering_key"]["type"],
        "string"
    );
    for view in ["EntryView", "ListedEntry", "KeyView"] {
        let properties = &schemas[view]["properties"];
        assert_eq!(properties["ordering_key"]["type"], "string", "{view}");
        assert_eq!(properties["sequence"]["type"], "integer", "{view}");
    }
    assert!(schemas["KeyView"]["properties"].get("blocked_by").is_some());
    let post = &document["paths"]["/v1/entries"]["post"]["responses"];
    for status in [
        "201", "400", "401", "409", "413", "415", "422", "429", "503",
    ] {
        assert!(
            post.get(status).is_some(),
            "POST /v1/entries documents no {status}"
        );
    }
    let text = document.to_string();
    // The contract's problem types (DESIGN.md), each described in the document: the library's
    // one table of problems must hold exactly these.
    let contract = [
        "unauthorized",
        "missing-idempotency-key",
        "invalid-idempotency-key",
        "malformed-json",
        "invalid-request",
        "unsupported-media-type",
        "payload-too-large",
        "idempotency-key-reused",
        "request-in-progress",
        "rate-limited",
        "storage-unavailable",
        "not-found",
        "method-not-allowed",
        "request-timeout",
        "misdirected-request",
        "internal-error",
    ];
    let mut table: Vec<&str> = retrysafe::http::problem::ALL
        .iter()
        .map(|problem| problem.slug)
        .collect();
    table.sort_unstable();
    let mut expected = contract.to_vec();
    expected.sort_unstable();
    assert_eq!(table, expected, "the problem table is the contract's");
    for problem in retrysafe::http::problem::ALL {
        assert!(
            text.contains(&format!("\"{}\"", problem.type_uri())),
            "{} is not described",
            problem.slug
        );
    }
    // Every GET has its HEAD, every operation its 405 with Allow.
    for (path, item) in document["paths"].as_object().unwrap() {
        let item = item.as_object().unwrap();
        assert_eq!(
            item.contains_key("get"),
            item.contains_key("head"),
            "{path}: GET and HEAD go together"
        );
        for (method, operation) in item {
            let not_allowed = &operation["responses"]["405"];
            assert!(
                not_allowed["headers"]["Allow"].is_object(),
                "{method} {path} documents no 405 with Allow"
            );
        }
    }
    // The key's rule, on the header and on the path parameter.
    let parameters = document["paths"]["/v1/entries"]["post"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .chain(
            document["paths"]["/v1/idempotency-keys/{key}"]["get"]["parameters"]
                .as_array()
                .unwrap(),
        )
        .filter(|parameter| parameter["name"] == "Idempotency-Key" || parameter["name"] == "key")
        .collect::<Vec<_>>();
    assert_eq!(parameters.len(), 2);
    for parameter in parameters {
        assert_eq!(parameter["schema"]["minLength"], 1, "{parameter}");
        assert_eq!(parameter["schema"]["maxLength"], 255, "{parameter}");
        assert_eq!(
            parameter["schema"]["pattern"], "^[!-~]{1,255}$",
            "{parameter}"
        );
    }
    // No clients configured: bearer authentication is optional.
    let security = document["paths"]["/v1/entries"]["post"]["security"]
        .as_array()
        .unwrap();
    assert!(security.contains(&serde_json::json!({})), "{security:?}");
    // ... and a Host that is not loopback is refused, on every operation.
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            assert!(
                operation["responses"]["421"].is_object(),
                "{method} {path} documents no 421"
            );
        }
    }
    assert!(!text.contains("spawn_outbox_gauges"), "no rustdoc links");
}

/// The 4xx and 5xx statuses of an operation's responses.
fn error_statuses(responses: &serde_json::Value) -> HashSet<String> {
    responses
        .as_object()
        .unwrap()
        .keys()
        .filter(|status| status.starts_with(['4', '5']))
        .cloned()
        .collect()
}

/// Asserts that one operation documents exactly the problem statuses its `problems` give, with
/// the 405 and 421 of every operation, each response naming its problem types and, but on a
/// HEAD (which has no body), carrying a problem.
fn assert_documents_its_problems(
    operation: &str,
    responses: &serde_json::Value,
    problems: &[&ProblemType],
) {
    let everywhere: [&ProblemType; 2] = [&METHOD_NOT_ALLOWED, &MISDIRECTED_REQUEST];
    let mut expected = HashSet::new();
    for problem in problems.iter().chain(&everywhere) {
        for status in problem.statuses() {
            let status = status.as_u16().to_string();
            let description = responses[&status]["description"].as_str().unwrap();
            assert!(
                description.contains(&format!("(`{}`)", problem.slug)),
                "{operation}: the {status} does not name {}",
                problem.slug
            );
            expected.insert(status);
        }
    }
    assert_eq!(error_statuses(responses), expected, "{operation}");
    if !operation.starts_with("head") {
        for status in expected {
            assert!(
                responses[&status]["content"]["application/problem+json"].is_object(),
                "{operation}: the {status} is not a problem"
            );
        }
    }
}

/// The library lists the problems each route answers, and the problem table describes each: the
/// document shows exactly those, one response per status, each naming its problem types.
#[actix_web::test]
async fn openapi_json_documents_exactly_the_problems_each_route_answers() {
    let app = spawn_app_with(|_| {}).await;
    let document = app.get("/openapi.json", None).await.json();
    let mut answered = HashSet::from(["method-not-allowed", "misdirected-request"]);
    for route in &retrysafe::http::openapi::ROUTE_PROBLEMS {
        let method = serde_json::to_value(&route.method).unwrap();
        let mut methods = vec![method.as_str().unwrap()];
        if methods == ["get"] {
            methods.push("head");
        }
        for method in methods {
            let responses = &document["paths"][route.path][method]["responses"];
            let operation = format!("{method} {}", route.path);
            assert_documents_its_problems(&operation, responses, route.problems);
        }
        answered.extend(route.problems.iter().map(|problem| problem.slug));
    }
    for problem in retrysafe::http::problem::ALL {
        assert!(
            answered.contains(problem.slug),
            "no route answers {}",
            problem.slug
        );
    }
    for path in ["/healthz", "/metrics", "/openapi.json"] {
        let responses = &document["paths"][path]["get"]["responses"];
        assert_documents_its_problems(path, responses, &[]);
    }
    // Not ready, /readyz answers 503 with its own body, not a problem.
    let readyz = &document["paths"]["/readyz"]["get"]["responses"];
    assert_eq!(
        error_statuses(readyz),
        HashSet::from(["405".to_owned(), "421".to_owned(), "503".to_owned()])
    );
    // The header fields the table gives a problem type are documented where it is answered.
    let too_many = &document["paths"]["/v1/entries"]["post"]["responses"]["429"]["headers"];
    for name in ["Retry-After", "RateLimit-Policy", "RateLimit"] {
        assert!(too_many[name].is_object(), "the 429 documents no {name}");
    }
    let unauthorized = &document["paths"]["/v1/entries/{id}"]["get"]["responses"]["401"];
    assert!(unauthorized["headers"]["WWW-Authenticate"].is_object());
}

#[actix_web::test]
async fn openapi_json_requires_bearer_authentication_when_clients_are_configured() {
    let app = spawn_app_with(|settings| {
        settings.auth.clients = vec![crate::common::helpers::client("c", "t")];
    })
    .await;
    let document = app.get("/openapi.json", None).await.json();
    let security = document["paths"]["/v1/entries"]["post"]["security"]
        .as_array()
        .unwrap();
    assert_eq!(security, &vec![serde_json::json!({"bearer": []})]);
}

/// `http.operations_listen`: `/readyz`, `/metrics` and `/openapi.json` move to an address of
/// their own, so that the API's port tells nobody the backlog, the request counts, the version
/// or whether anonymous mode is on; on `http.listen` they answer 404. `/healthz` is on both, the
/// API on `http.listen` only.
#[actix_web::test]
async fn operations_routes_move_to_their_own_listener() {
    let app = spawn_app_with(|settings| {
        settings.http.operations_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let operations = app
        .operations_address
        .clone()
        .expect("the daemon reports the operations port");
    let on_operations = |path: &str| {
        let request = app.http.get(format!("{operations}{path}"));
        app.send(request, Vec::new())
    };
    for path in ["/readyz", "/metrics", "/openapi.json"] {
        app.get(path, None).await.assert_problem(404, "not-found");
        let answer = on_operations(path).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.describe());
    }
    for answer in [
        app.get("/healthz", None).await,
        on_operations("/healthz").await,
    ] {
        assert_eq!(answer.status, 200, "{}", answer.describe());
    }
    app.post_entry("split-1", &entry_body(1))
        .await
        .assert_created();
    let posted_to_operations = app
        .send(
            app.http
                .post(format!("{operations}/v1/entries"))
                .insert_header(("Idempotency-Key", "split-2"))
                .insert_header(("Content-Type", "application/json")),
            entry_body(2).to_string(),
        )
        .await;
    posted_to_operations.assert_problem(404, "not-found");
    on_operations("/v1/idempotency-keys/split-1")
        .await
        .assert_problem(404, "not-found");
    assert_eq!(app.row_counts().await.0, 1, "only the write to http.listen");
    let metrics = on_operations("/metrics").await.text();
    assert!(
        metrics.contains("route=\"/v1/entries\",outcome=\"created\"")
            || metrics.contains("outcome=\"created\",route=\"/v1/entries\""),
        "the operations listener's metrics count the API's requests: {metrics}"
    );
}

#[test]
fn the_operations_listener_must_be_another_address() {
    let mut settings = test_settings();
    settings.http.listen = "127.0.0.1:9090".parse().unwrap();
    settings.http.operations_listen = Some("127.0.0.1:9090".parse().unwrap());
    let error = settings.validate().unwrap_err().to_string();
    assert!(error.contains("http.operations_listen"), "{error}");
    settings.http.operations_listen = Some("127.0.0.1:9091".parse().unwrap());
    settings.validate().unwrap();
}

/// One sample's value in Prometheus text (0 when absent).
fn sample(metrics: &str, name_and_labels: &str) -> f64 {
    metric_sample(metrics, name_and_labels).unwrap_or(0.0)
}

async fn scrape(daemon: &TestDaemon) -> String {
    let response = daemon.get("/metrics", None).await;
    assert_eq!(response.status, 200);
    String::from_utf8(response.body).unwrap()
}

/// The daemon runs as its own process so that no other test's requests move its counters.
#[actix_web::test]
async fn metrics_move_for_a_write_a_replay_a_conflict_and_a_publish() {
    let settings = test_settings();
    let mut consumer = TestConsumer::bind(&settings.amqp.exchange, "#").await;
    let daemon = spawn_binary(settings, &[]).await;

    let before = scrape(&daemon).await;
    let created = r#"retrysafe_http_requests_total{route="/v1/entries",outcome="created"}"#;
    let replayed = r#"retrysafe_http_requests_total{route="/v1/entries",outcome="replayed"}"#;
    let conflict = r#"retrysafe_http_requests_total{route="/v1/entries",outcome="conflict"}"#;
    let invalid = r#"retrysafe_http_requests_total{route="/v1/entries",outcome="invalid"}"#;
    let acked = r#"retrysafe_outbox_publishes_total{outcome="acked"}"#;

    let first = daemon.post_entry("metered", &entry_body(1)).await;
    first.assert_created();
    assert!(
        first
            .header("x-request-id")
            .is_some_and(|id| !id.is_empty()),
        "every response carries X-Request-Id"
    );
    daemon
        .post_entry("metered", &entry_body(1))
        .await
        .assert_created();
    assert_eq!(
        daemon.post_entry("metered", &entry_body(2)).await.status,
        409
    );
    assert_eq!(daemon.post_entry("", &entry_body(2)).await.status, 400);
    consumer.next(WAIT).await.expect("the event is published");
    // The publish's confirm, and the outbox gauges' first reading (a task of their own, which
    // may still be reading on a busy machine), are awaited.
    let mut after = scrape(&daemon).await;
    for _ in 0..100 {
        if sample(&after, acked) > sample(&before, acked)
            && after.contains("retrysafe_outbox_unsent_events")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = scrape(&daemon).await;
    }

    assert_eq!(sample(&after, created) - sample(&before, created), 1.0);
    assert_eq!(sample(&after, replayed) - sample(&before, replayed), 1.0);
    assert_eq!(sample(&after, conflict) - sample(&before, conflict), 1.0);
    assert_eq!(sample(&after, invalid) - sample(&before, invalid), 1.0);
    assert_eq!(sample(&after, acked) - sample(&before, acked), 1.0);
    assert_eq!(sample(&after, "retrysafe_broker_connected"), 1.0);
    assert!(
        sample(&after, "retrysafe_writer_batch_size_count") >= 1.0,
        "{after}"
    );
    assert!(
        sample(
            &after,
            r#"retrysafe_http_request_duration_seconds_count{route="/v1/entries"}"#
        ) >= 4.0
    );
    // database.pool_size = 16: a quarter for reads, the rest for writes.
    assert_eq!(
        sample(
            &after,
            r#"retrysafe_db_pool_max_connections{pool="writes"}"#
        ),
        12.0
    );
    assert_eq!(
        sample(&after, r#"retrysafe_db_pool_max_connections{pool="reads"}"#),
        4.0
    );
    assert!(sample(&after, r#"retrysafe_db_pool_connections{pool="writes"}"#) >= 1.0);
    assert!(after.contains("retrysafe_outbox_unsent_events"), "{after}");
    assert!(
        sample(
            &after,
            r#"retrysafe_replay_cache_lookups_total{result="hit"}"#
        ) >= 2.0,
        "{after}"
    );

    // The process's own figures, under the standard names: the daemon's, not another process's.
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    let proc_kb = |field: &str| -> f64 {
        status
            .lines()
            .find_map(|line| {
                line.strip_prefix(field)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap()
    };
    let rss = sample(&after, "process_resident_memory_bytes");
    let (peak, threads) = (proc_kb("VmHWM:") * 1024.0, proc_kb("Threads:"));
    assert!(
        rss > 1e6 && rss <= peak,
        "RSS {rss} vs VmHWM {peak}: {after}"
    );
    assert!(sample(&after, "process_threads") >= 2.0, "{after}");
    assert!(
        sample(&after, "process_threads") <= threads + 8.0,
        "{after}"
    );
    assert!(sample(&after, "process_open_fds") >= 3.0, "{after}");
    assert!(sample(&after, "process_cpu_seconds_total") > 0.0, "{after}");
    assert!(sample(&after, "process_max_fds") >= sample(&after, "process_open_fds"));
}

/// SIGTERM while requests are in flight: every request that got a 201 is committed, the
/// process exits 0, and every committed event is delivered (after a restart if need be).
#[actix_web::test]
async fn sigterm_finishes_requests_in_flight_and_loses_nothing() {
    let settings = test_settings();
    let mut consumer = TestConsumer::bind(&settings.amqp.exchange, "#").await;
    let mut daemon = spawn_binary(
        settings,
        &[("RETRYSAFE_HTTP__SHUTDOWN_TIMEOUT", "20s".to_owned())],
    )
    .await;
    let address = daemon.address.clone();

    // 8 clients writing as fast as they can; SIGTERM lands in the middle.
    let clients: Vec<_> = (0..8)
        .map(|client| {
            let address = address.clone();
            actix_web::rt::spawn(async move {
                let http = awc::Client::builder()
                    .timeout(Duration::from_secs(30))
                    .finish();
                let mut created = HashMap::new();
                for n in 0..200 {
                    let key = format!("term-{client}-{n}");
                    let response = http
                        .post(format!("{address}/v1/entries"))
                        .insert_header(("Idempotency-Key", key.as_str()))
                        .insert_header(("Content-Type", "application/json"))
                        .send_body(entry_body(n).to_string())
                        .await;
                    match response {
                        Ok(mut response) if response.status().as_u16() == 201 => {
                            let body: serde_json::Value = response.json().await.unwrap();
                            created.insert(key, body["id"].as_str().unwrap().to_owned());
                        }
                        // Refused or cut off by the shutdown: this client stops.
                        _ => break,
                    }
                }
                created
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    daemon.signal("TERM");
    let status = daemon.wait_for_exit().await;
    assert!(
        status.success(),
        "exit status {status}: {}",
        daemon.log_text()
    );

    let mut created = HashMap::new();
    for client in clients {
        created.extend(client.await.unwrap());
    }
    assert!(
        !created.is_empty(),
        "some requests completed before the shutdown"
    );
    assert!(
        created.len() < 8 * 200,
        "the shutdown came while clients were still writing"
    );

    for (key, id) in &created {
        let row = daemon
            .db
            .query_one(
                "SELECT entry_id::text FROM idempotency_records WHERE key = $1",
                &[key],
            )
            .await
            .unwrap_or_else(|e| panic!("{key} got 201 but is not committed: {e}"));
        assert_eq!(&row.get::<_, String>(0), id);
    }
    let events = daemon.count("SELECT count(*) FROM outbox_events").await;
    let records = daemon
        .count("SELECT count(*) FROM idempotency_records")
        .await;
    assert_eq!(events, records, "every committed write has its event");

    // Whatever the relays had not sent is sent after a restart: nothing is lost.
    daemon.restart().await;
    let mut delivered = HashSet::new();
    while delivered.len() < events as usize {
        let delivery = consumer
            .next(WAIT)
            .await
            .unwrap_or_else(|| panic!("{} of {events} events delivered", delivered.len()));
        delivered.insert(header(&delivery, "idempotency-key").unwrap());
    }
    for key in created.keys() {
        assert!(delivered.contains(key), "the event of {key} was lost");
    }
}

/// SIGTERM while everything is stuck on the database (the test holds the write tables locked):
/// a request in flight, a writer in its batch, relays in theirs. The whole stop stays within one
/// `http.shutdown_timeout` counted from the signal, whatever it leaves unfinished (the build
/// before gave each of its steps the whole timeout: the server's drain, the writers, the
/// relays, each 3 s here). Nothing stuck is acknowledged: the write in flight gets no 201, and
/// once the locks are gone it is written by its retry.
#[actix_web::test]
async fn the_whole_stop_fits_in_one_shutdown_timeout_whatever_is_stuck() {
    let mut daemon = spawn_binary(
        test_settings(),
        &[
            ("RETRYSAFE_HTTP__SHUTDOWN_TIMEOUT", "3s".to_owned()),
            ("RETRYSAFE_DATABASE__STATEMENT_TIMEOUT", "60s".to_owned()),
        ],
    )
    .await;
    daemon
        .post_entry("before", &entry_body(1))
        .await
        .assert_created();
    let locks = crate::common::helpers::LockHolder::take(
        &daemon.database.name,
        "LOCK TABLE idempotency_records, outbox_events IN ACCESS EXCLUSIVE MODE",
    )
    .await;
    let stuck = {
        let request = daemon.post_request("stuck");
        actix_web::rt::spawn(async move { request.send_body(entry_body(2).to_string()).await })
    };
    // The write reaches its writer, and the relays' polls meet the locks too.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let signalled = std::time::Instant::now();
    daemon.signal("TERM");
    let status = daemon.wait_for_exit().await;
    let took = signalled.elapsed();
    assert!(
        status.success(),
        "exit status {status}: {}",
        daemon.log_tail(20)
    );
    assert!(
        took < Duration::from_millis(4500),
        "stopped {took:?} after SIGTERM, with http.shutdown_timeout = 3s: {}",
        daemon.log_tail(20)
    );
    let stuck = stuck.await.unwrap();
    assert!(
        !matches!(&stuck, Ok(response) if response.status().is_success()),
        "the stuck write was not acknowledged: {:?}",
        stuck.as_ref().map(|response| response.status())
    );
    locks.release().await;
    daemon.restart().await;
    daemon
        .post_entry("stuck", &entry_body(2))
        .await
        .assert_created();
    assert_eq!(
        daemon
            .count("SELECT count(*) FROM entries WHERE idempotency_key = 'stuck'")
            .await,
        1
    );
}
