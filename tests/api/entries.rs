//! The write path: first writes, replays, conflicts, concurrency, and two daemons.

use futures_util::future::join_all;
use serde_json::json;

use crate::common::daemon::{spawn_app, spawn_app_with, spawn_second_app};
use crate::common::helpers::entry_body;

#[actix_web::test]
async fn twenty_concurrent_duplicates_make_one_entry() {
    let app = spawn_app().await;
    let body = entry_body(1);

    let responses = join_all((0..20).map(|_| app.post_entry("demo-001", &body))).await;

    let mut replayed = 0;
    let first_id = responses[0].json()["id"].clone();
    for response in &responses {
        response.assert_created();
        assert_eq!(response.json()["id"], first_id);
        assert_eq!(
            response.header("location"),
            Some(format!("/v1/entries/{}", first_id.as_str().unwrap()))
        );
        match response.header("idempotency-replayed").as_deref() {
            Some("true") => replayed += 1,
            None => {}
            other => panic!("unexpected Idempotency-Replayed {other:?}"),
        }
    }
    assert_eq!(replayed, 19, "all but the first are replays");
    assert_eq!(
        app.count("select count(*) from idempotency_records where key = 'demo-001'")
            .await,
        1
    );
    assert_eq!(
        app.count("select count(*) from outbox_events where idempotency_key = 'demo-001'")
            .await,
        1
    );
    assert_eq!(
        app.count("select count(*) from entries where idempotency_key = 'demo-001'")
            .await,
        1
    );

    // A new key adds exactly one row to each table.
    let response = app.post_entry("demo-002", &entry_body(2)).await;
    response.assert_created();
    assert_ne!(response.json()["id"], first_id);
    assert_eq!(app.row_counts().await, (2, 2, 2));
}

#[actix_web::test]
async fn the_first_response_is_saved_and_replayed_byte_for_byte() {
    let app = spawn_app().await;
    let body = json!({"kind": "invoice.paid", "data": {"z": 1.5, "a": [true, null, "x"], "nested": {"b": 2, "a": 1}}});

    let first = app.post_entry("k-1", &body).await;
    first.assert_created();
    assert_eq!(first.header("idempotency-replayed"), None);
    let created = first.json();
    assert_eq!(created["kind"], "invoice.paid");
    assert_eq!(created["data"], body["data"]);
    assert!(created["created_at"].as_str().unwrap().ends_with('Z'));

    let replay = app.post_entry("k-1", &body).await;
    replay.assert_created();
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body, "a replay carries the first body");
    assert_eq!(replay.header("location"), first.header("location"));

    // A daemon that never saw the key (another process, or after a restart) replays from the
    // database, still byte for byte.
    let other = spawn_second_app(&app).await;
    let from_database = other.post_entry("k-1", &body).await;
    from_database.assert_created();
    assert!(from_database.replayed());
    assert_eq!(from_database.body, first.body);

    // GET shows the same entry.
    let id = created["id"].as_str().unwrap();
    let fetched = app.get(&format!("/v1/entries/{id}"), None).await;
    assert_eq!(fetched.status, 200);
    assert_eq!(fetched.body, first.body);
    assert_eq!(app.row_counts().await, (1, 1, 1));
}

#[actix_web::test]
async fn key_order_and_white_space_do_not_make_a_request_different() {
    const COMPACT: &str = r#"{"kind":"a.b","data":{"x":1,"y":{"p":[1,2],"q":"s"}}}"#;
    let app = spawn_app().await;
    let first = app.post_text("order-1", COMPACT).await;
    first.assert_created();
    let second = app
        .send(
            app.post_request("order-1")
                .insert_header(("Content-Type", "application/json; charset=utf-8")),
            "{\n  \"data\" : { \"y\" : {\"q\":\"s\", \"p\":[ 1, 2 ]}, \"x\" : 1 },\n  \"kind\" : \"a.b\"\n}\n",
        )
        .await;
    second.assert_created();
    assert!(second.replayed());
    assert_eq!(second.body, first.body);
    // The very bytes of the first request again (answered before the body is parsed): the
    // same answer, byte for byte, headers included.
    let third = app.post_text("order-1", COMPACT).await;
    third.assert_created();
    assert!(third.replayed());
    assert_eq!(third.body, first.body);
    assert_eq!(third.header("location"), first.header("location"));
    assert_eq!(third.header("content-type"), second.header("content-type"));
    // The same bytes under another key are another request.
    let other = app.post_text("order-2", COMPACT).await;
    other.assert_created();
    assert!(!other.replayed());
    assert_eq!(app.row_counts().await, (2, 2, 2));
}

#[actix_web::test]
async fn a_reused_key_with_another_request_is_refused_and_writes_nothing() {
    let app = spawn_app().await;
    app.post_entry("reuse-1", &entry_body(1))
        .await
        .assert_created();
    let before = app.row_counts().await;

    let conflict = app.post_entry("reuse-1", &entry_body(2)).await;
    conflict.assert_problem(409, "idempotency-key-reused");
    let other_kind = app
        .post_entry("reuse-1", &json!({"kind": "other", "data": {"invoice": 1}}))
        .await;
    other_kind.assert_problem(409, "idempotency-key-reused");
    assert_eq!(app.row_counts().await, before);

    // The conflict is also found from the database by a daemon that never saw the key.
    let other = spawn_second_app(&app).await;
    other
        .post_entry("reuse-1", &entry_body(2))
        .await
        .assert_problem(409, "idempotency-key-reused");
    assert_eq!(app.row_counts().await, before);

    // The original request still replays.
    let replay = app.post_entry("reuse-1", &entry_body(1)).await;
    replay.assert_created();
    assert!(replay.replayed());
}

#[actix_web::test]
async fn concurrent_requests_with_one_key_and_two_bodies_make_one_entry() {
    let app = spawn_app().await;
    for round in 0..5 {
        let key = format!("race-{round}");
        let (a, b) = (entry_body(1), entry_body(2));
        let responses = join_all((0..10).map(|i| {
            let body = if i % 2 == 0 { &a } else { &b };
            app.post_entry(&key, body)
        }))
        .await;
        let created: Vec<_> = responses.iter().filter(|r| r.status == 201).collect();
        let refused: Vec<_> = responses.iter().filter(|r| r.status == 409).collect();
        assert_eq!(
            created.len() + refused.len(),
            10,
            "only 201 and 409 are expected"
        );
        assert!(!created.is_empty());
        let winner = &created[0].json();
        for response in &created {
            assert_eq!(&response.json(), winner, "every 201 shows the one entry");
        }
        for response in refused {
            response.assert_problem(409, "idempotency-key-reused");
        }
        // The winner's body decides which half succeeded: all of one body, none of the other.
        assert_eq!(
            created.len(),
            5,
            "the five requests with the winning body succeed"
        );
    }
    assert_eq!(app.row_counts().await, (5, 5, 5));
}

#[actix_web::test]
async fn mismatch_status_can_be_422() {
    let app = spawn_app_with(|settings| settings.idempotency.mismatch_status = 422).await;
    app.post_entry("m-1", &entry_body(1)).await.assert_created();
    app.post_entry("m-1", &entry_body(2))
        .await
        .assert_problem(422, "idempotency-key-reused");
}

#[actix_web::test]
async fn two_daemons_on_one_database_make_one_entry_per_key() {
    let first = spawn_app().await;
    // No replay cache on the second daemon, so all of its duplicates go to the database.
    let second = spawn_second_app(&first).await;
    for round in 0..5 {
        let key = format!("shared-{round}");
        let body = entry_body(round);
        let responses = join_all((0..20).map(|i| {
            let app = if i % 2 == 0 { &first } else { &second };
            app.post_entry(&key, &body)
        }))
        .await;
        let id = responses[0].json()["id"].clone();
        for response in &responses {
            response.assert_created();
            assert_eq!(
                response.json()["id"],
                id,
                "both daemons answer with the one entry"
            );
        }
        let replays = responses.iter().filter(|r| r.replayed()).count();
        assert_eq!(replays, 19, "exactly one request created the entry");
    }
    assert_eq!(first.row_counts().await, (5, 5, 5));
}

#[actix_web::test]
async fn the_same_key_in_two_clients_is_two_keys() {
    use crate::common::helpers::client;
    let app = spawn_app_with(|settings| {
        settings.auth.clients = vec![
            client("billing", "token-billing"),
            client("shipping", "token-shipping"),
        ];
    })
    .await;
    let body = entry_body(1);
    let billing = app
        .post_entry_as(Some("token-billing"), "shared-key", &body)
        .await;
    let shipping = app
        .post_entry_as(Some("token-shipping"), "shared-key", &body)
        .await;
    billing.assert_created();
    shipping.assert_created();
    assert_eq!(shipping.header("idempotency-replayed"), None);
    assert_ne!(billing.json()["id"], shipping.json()["id"]);
    assert_eq!(app.row_counts().await, (2, 2, 2));
    assert_eq!(
        app.count("select count(*) from entries where client_id = 'billing'")
            .await,
        1
    );
}

#[actix_web::test]
async fn a_key_reports_its_record_and_events() {
    let app = spawn_app().await;
    // A bound queue, so that the relay's first attempt succeeds and `attempts` stays 0.
    let _consumer =
        crate::common::consumer::TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    // The key in the path is validated like the header.
    let response = app.get("/v1/idempotency-keys/bad%20key", None).await;
    response.assert_problem(400, "invalid-idempotency-key");

    // Reserved URL characters in a key are percent-encoded in the path.
    let created = app.post_entry("lookup/1?#", &entry_body(7)).await;
    created.assert_created();
    let entry_id = created.json()["id"].clone();
    let response = app.get("/v1/idempotency-keys/lookup%2F1%3F%23", None).await;
    assert_eq!(
        response.status,
        200,
        "{}",
        String::from_utf8_lossy(&response.body)
    );
    let view = response.json();
    assert_eq!(view["key"], "lookup/1?#");
    assert_eq!(view["status"], "completed");
    assert_eq!(view["response_status"], 201);
    assert_eq!(view["entry_id"], entry_id);
    assert_eq!(view["request_hash"].as_str().unwrap().len(), 64);
    assert!(view["created_at"].is_string() && view["expires_at"].is_string());
    let events = view["events"].as_array().unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["event_type"], "entry.created");
    assert_eq!(events[0]["attempts"], 0, "{view}");
    let event_id: uuid::Uuid = events[0]["event_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(event_id.get_version_num(), 7, "event ids are UUIDv7");

    app.get("/v1/idempotency-keys/unknown", None)
        .await
        .assert_problem(404, "not-found");
}

#[actix_web::test]
async fn health_and_readiness() {
    let app = spawn_app().await;
    assert_eq!(app.get("/healthz", None).await.status, 200);
    let ready = app.get("/readyz", None).await;
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["database"], "up");
    assert_eq!(ready.json()["migrations"], "applied");
}

#[actix_web::test]
async fn numbers_are_kept_digit_for_digit_and_replayed_as_stored() {
    let app = spawn_app().await;
    let first = app
        .post_text(
            "big-1",
            r#"{"kind":"a","data":{"n":100000000000000000000001}}"#,
        )
        .await;
    first.assert_created();
    assert!(String::from_utf8_lossy(&first.body).contains(r#""n":100000000000000000000001"#));
    // One digit apart is another request, not a replay.
    app.post_text(
        "big-1",
        r#"{"kind":"a","data":{"n":100000000000000000000002}}"#,
    )
    .await
    .assert_problem(409, "idempotency-key-reused");

    // Numbers are shown as the database stores them (plain decimal, scale kept), so the first
    // answer and a replay read back from the database are the same bytes.
    let body =
        r#"{"kind":"a","data":{"a":1.50,"b":1e2,"c":-0.0,"d":0.1000000000000000000001,"e":1.5e1}}"#;
    let created = app.post_text("num-1", body).await;
    created.assert_created();
    assert_eq!(
        created.json()["data"].to_string(),
        r#"{"a":1.50,"b":100,"c":0.0,"d":0.1000000000000000000001,"e":15}"#
    );
    let other = spawn_second_app(&app).await;
    let replay = other.post_text("num-1", body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, created.body);
    // The same values written another way are the same request.
    let same = app
        .post_text(
            "num-1",
            r#"{"data":{"e":15,"d":0.1000000000000000000001,"c":0.0,"b":100,"a":1.50},"kind":"a"}"#,
        )
        .await;
    assert!(same.replayed());

    let huge = app
        .post_text("num-2", r#"{"kind":"a","data":{"n":1e100000}}"#)
        .await;
    huge.assert_problem(400, "invalid-request");
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_records WHERE key = 'num-2'")
            .await,
        0
    );
}
