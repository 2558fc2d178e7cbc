//! Every refusal is problem+json with its type, and writes nothing.

use actix_web::web::Bytes;
use serde_json::json;

use crate::common::daemon::{spawn_app, TestDaemon};
use crate::common::helpers::{entry_body, TestResponse};

async fn post_raw(
    app: &TestDaemon,
    key: Option<&[u8]>,
    content_type: Option<&str>,
    body: impl Into<Vec<u8>>,
) -> crate::common::helpers::TestResponse {
    let mut request = app.http.post(format!("{}/v1/entries", app.address));
    if let Some(key) = key {
        request = request.insert_header((
            "Idempotency-Key",
            awc::http::header::HeaderValue::from_bytes(key)
                .expect("a header value the client can send"),
        ));
    }
    if let Some(content_type) = content_type {
        request = request.insert_header(("Content-Type", content_type));
    }
    app.send(request, body).await
}

async fn assert_nothing_written(app: &TestDaemon) {
    assert_eq!(
        app.row_counts().await,
        (0, 0, 0),
        "a refused request writes no row"
    );
}

#[actix_web::test]
async fn bad_idempotency_keys_are_refused() {
    let app = spawn_app().await;
    let body = entry_body(1).to_string();
    let json = Some("application/json");

    post_raw(&app, None, json, body.clone())
        .await
        .assert_problem(400, "missing-idempotency-key");
    post_raw(&app, Some(b""), json, body.clone())
        .await
        .assert_problem(400, "invalid-idempotency-key");
    post_raw(&app, Some(b"\"\""), json, body.clone())
        .await
        .assert_problem(400, "invalid-idempotency-key");
    let long = vec![b'k'; 256];
    post_raw(&app, Some(&long), json, body.clone())
        .await
        .assert_problem(400, "invalid-idempotency-key");
    post_raw(&app, Some("clé-1".as_bytes()), json, body.clone())
        .await
        .assert_problem(400, "invalid-idempotency-key");
    post_raw(&app, Some(b"a b"), json, body.clone())
        .await
        .assert_problem(400, "invalid-idempotency-key");
    post_raw(&app, Some(b"\"a\"b\""), json, body.clone())
        .await
        .assert_problem(400, "invalid-idempotency-key");
    // Structured-field parameters would make one logical key into several.
    let with_parameters = post_raw(&app, Some(b"\"k1\";p=1"), json, body.clone()).await;
    with_parameters.assert_problem(400, "invalid-idempotency-key");
    assert!(
        with_parameters.json()["detail"]
            .as_str()
            .is_some_and(|detail| detail.contains("parameters")),
        "{}",
        with_parameters.json()
    );
    assert_nothing_written(&app).await;

    // The longest key, and a structured-field string, are fine.
    let longest = vec![b'k'; 255];
    post_raw(&app, Some(&longest), json, body.clone())
        .await
        .assert_created();
    let quoted = post_raw(&app, Some(b"\"sf-key\""), json, body.clone()).await;
    quoted.assert_created();
    let plain = post_raw(&app, Some(b"sf-key"), json, body.clone()).await;
    assert!(plain.replayed(), "\"sf-key\" and sf-key are one key");
}

#[actix_web::test]
async fn malformed_and_invalid_bodies_are_refused() {
    let app = spawn_app().await;
    let json = Some("application/json");
    let mut n = 0;
    let mut next_key = || {
        n += 1;
        format!("bad-{n}").into_bytes()
    };

    for body in [
        &b"{"[..],
        b"not json",
        b"",
        b"{\"kind\":\"a\",\"data\":{}} trailing",
        b"\xff\xfe{}",
    ] {
        post_raw(&app, Some(&next_key()), json, body.to_vec())
            .await
            .assert_problem(400, "malformed-json");
    }
    let deep = format!(
        "{{\"kind\":\"a\",\"data\":{{\"x\":{}{}}}}}",
        "[".repeat(5000),
        "]".repeat(5000)
    );
    post_raw(&app, Some(&next_key()), json, deep)
        .await
        .assert_problem(400, "malformed-json");
    let lone_surrogate = r#"{"kind":"a","data":{"s":"\ud800"}}"#;
    post_raw(&app, Some(&next_key()), json, lone_surrogate)
        .await
        .assert_problem(400, "malformed-json");

    let invalid = [
        (json!([1, 2]), "/"),
        (json!("text"), "/"),
        (json!({"kind": "a", "data": {}, "extra": 1}), "/extra"),
        (json!({"kind": "a"}), "/data"),
        (json!({"data": {}}), "/kind"),
        (json!({"kind": "", "data": {}}), "/kind"),
        (json!({"kind": "Upper", "data": {}}), "/kind"),
        (json!({"kind": "k".repeat(65), "data": {}}), "/kind"),
        (json!({"kind": 5, "data": {}}), "/kind"),
        (json!({"kind": "a", "data": [1]}), "/data"),
        (json!({"kind": "a", "data": "string"}), "/data"),
        (json!({"kind": "a", "data": null}), "/data"),
        (
            json!({"kind": "a", "data": {"note": "nul\u{0}inside"}}),
            "/data/note",
        ),
        (
            json!({"kind": "a", "data": {"list": [{"deep": "x\u{0}"}]}}),
            "/data/list/0/deep",
        ),
    ];
    // Two members with one name: another parser may read the other one.
    let duplicates = [
        (r#"{"kind":"a","kind":"b","data":{}}"#, "/kind"),
        (r#"{"kind":"a","data":{"n":1,"n":2}}"#, "/data/n"),
        (
            r#"{"kind":"a","data":{"x":[{"y":1},{"y":1,"y":2}]}}"#,
            "/data/x/1/y",
        ),
    ];
    let invalid = invalid
        .into_iter()
        .map(|(body, pointer)| (body.to_string(), pointer))
        .chain(duplicates.map(|(body, pointer)| (body.to_owned(), pointer)));
    for (body, pointer) in invalid {
        let response = post_raw(&app, Some(&next_key()), json, body.clone()).await;
        response.assert_problem(400, "invalid-request");
        let errors = response.json()["errors"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            errors
                .iter()
                .any(|e| e["pointer"] == pointer && e["detail"].is_string()),
            "{body} should name {pointer}: {errors:?}"
        );
    }
    assert_nothing_written(&app).await;
}

#[actix_web::test]
async fn wrong_content_type_and_oversized_bodies_are_refused() {
    let app = spawn_app().await;
    let body = entry_body(1).to_string();
    post_raw(&app, Some(b"ct-1"), None, body.clone())
        .await
        .assert_problem(415, "unsupported-media-type");
    post_raw(&app, Some(b"ct-2"), Some("text/plain"), body.clone())
        .await
        .assert_problem(415, "unsupported-media-type");
    post_raw(
        &app,
        Some(b"ct-3"),
        Some("application/x-www-form-urlencoded"),
        body.clone(),
    )
    .await
    .assert_problem(415, "unsupported-media-type");
    post_raw(
        &app,
        Some(b"ct-4"),
        Some("application/json; charset=latin1"),
        body.clone(),
    )
    .await
    .assert_problem(415, "unsupported-media-type");

    let limit = app.settings.http.max_body_bytes;
    let padding = "x".repeat(limit);
    let huge = json!({"kind": "a", "data": {"padding": padding}}).to_string();
    post_raw(&app, Some(b"big-1"), Some("application/json"), huge)
        .await
        .assert_problem(413, "payload-too-large");
    assert_nothing_written(&app).await;

    // Just under the limit is accepted.
    let overhead = json!({"kind": "a", "data": {"padding": ""}})
        .to_string()
        .len();
    let fits = json!({"kind": "a", "data": {"padding": "x".repeat(limit - overhead)}}).to_string();
    assert_eq!(fits.len(), limit);
    post_raw(&app, Some(b"big-2"), Some("application/json"), fits)
        .await
        .assert_created();
}

/// `body` sent with chunked transfer encoding, a few bytes per chunk, so that the daemon reads
/// it in many parts and knows no length in advance.
async fn post_chunked(app: &TestDaemon, key: &str, body: String) -> TestResponse {
    let chunks: Vec<Result<Bytes, std::io::Error>> = body
        .into_bytes()
        .chunks(7)
        .map(|chunk| Ok(Bytes::copy_from_slice(chunk)))
        .collect();
    let response = app
        .post_request(key)
        .send_stream(futures_util::stream::iter(chunks))
        .await
        .expect("the request is answered");
    TestResponse::read(response)
        .await
        .expect("the body is read")
}

#[actix_web::test]
async fn a_body_in_many_chunks_is_read_whole_and_refused_past_the_limit() {
    let app = spawn_app().await;
    let body = entry_body(7).to_string();
    let created = post_chunked(&app, "chunked-1", body.clone()).await;
    created.assert_created();
    assert_eq!(created.json()["data"], entry_body(7)["data"]);
    // The same bytes in one piece are the same request.
    let replayed = post_raw(&app, Some(b"chunked-1"), Some("application/json"), body).await;
    assert_eq!(replayed.status, 201);
    assert_eq!(
        replayed.header("idempotency-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(replayed.body, created.body);

    let limit = app.settings.http.max_body_bytes;
    let huge = json!({"kind": "a", "data": {"padding": "x".repeat(limit)}}).to_string();
    post_chunked(&app, "chunked-2", huge)
        .await
        .assert_problem(413, "payload-too-large");
    assert_eq!(
        app.row_counts().await,
        (1, 1, 1),
        "the refused body wrote nothing"
    );
}

#[actix_web::test]
async fn unknown_routes_and_methods_are_problems() {
    let app = spawn_app().await;
    app.get("/v1/nothing-here", None)
        .await
        .assert_problem(404, "not-found");
    let not_allowed = app
        .send(
            app.http.put(format!("{}/v1/entries", app.address)),
            Vec::new(),
        )
        .await;
    not_allowed.assert_problem(405, "method-not-allowed");
    assert_eq!(
        not_allowed.header("allow").as_deref(),
        Some("GET, HEAD, POST")
    );
    let delete = app
        .send(
            app.http
                .delete(format!("{}/v1/idempotency-keys/k", app.address)),
            Vec::new(),
        )
        .await;
    delete.assert_problem(405, "method-not-allowed");
    assert_eq!(delete.header("allow").as_deref(), Some("GET, HEAD"));
    app.get("/v1/entries/not-a-uuid", None)
        .await
        .assert_problem(404, "not-found");
    app.get(&format!("/v1/entries/{}", uuid::Uuid::now_v7()), None)
        .await
        .assert_problem(404, "not-found");
}

#[actix_web::test]
async fn compressed_bodies_are_refused() {
    let app = spawn_app().await;
    let request = app
        .post_request("gz-1")
        .insert_header(("Content-Encoding", "gzip"));
    app.send(request, entry_body(1).to_string())
        .await
        .assert_problem(415, "unsupported-media-type");
    assert_nothing_written(&app).await;
}

#[actix_web::test]
async fn a_body_that_does_not_arrive_in_time_gets_408_and_writes_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = crate::common::daemon::spawn_app_with(|settings| {
        settings.http.body_timeout = std::time::Duration::from_millis(500);
    })
    .await;
    let address = app.address.trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    stream
        .write_all(
            b"POST /v1/entries HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: slow-1\r\n\
              Content-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"kind\"",
        )
        .await
        .unwrap();
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(std::time::Duration::from_secs(30), stream.read(&mut answer))
        .await
        .expect("the daemon answers a trickling body instead of waiting forever")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..read]).to_string();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("/problems/request-timeout"), "{answer}");
    assert_nothing_written(&app).await;
}

#[actix_web::test]
async fn every_get_route_answers_head_with_the_same_status_and_no_body() {
    let app = spawn_app().await;
    let created = app.post_entry("head-key", &entry_body(1)).await;
    let id = created.json()["id"].as_str().unwrap().to_owned();
    for path in [
        "/healthz".to_owned(),
        "/readyz".to_owned(),
        "/metrics".to_owned(),
        "/openapi.json".to_owned(),
        format!("/v1/entries/{id}"),
        "/v1/idempotency-keys/head-key".to_owned(),
        "/v1/idempotency-keys/no-such-key".to_owned(),
    ] {
        let get = app.get(&path, None).await;
        let head = app
            .send(app.http.head(format!("{}{path}", app.address)), Vec::new())
            .await;
        assert_eq!(head.status, get.status, "HEAD {path}");
        assert!(head.body.is_empty(), "HEAD {path} has no body");
        assert_eq!(
            head.header("content-type"),
            get.header("content-type"),
            "HEAD {path}"
        );
    }
}
