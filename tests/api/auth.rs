//! Bearer tokens and client scoping.

use crate::common::daemon::spawn_app_with;
use crate::common::helpers::{client, entry_body};

#[actix_web::test]
async fn missing_or_wrong_credentials_are_refused_and_write_nothing() {
    let app =
        spawn_app_with(|settings| settings.auth.clients = vec![client("billing", "s3cret-token")])
            .await;
    let body = entry_body(1);

    app.post_entry_as(None, "auth-1", &body)
        .await
        .assert_problem(401, "unauthorized");
    app.post_entry_as(Some("wrong-token"), "auth-1", &body)
        .await
        .assert_problem(401, "unauthorized");
    app.post_entry_as(Some(""), "auth-1", &body)
        .await
        .assert_problem(401, "unauthorized");
    let basic = app
        .send(
            app.post_request("auth-1")
                .insert_header(("Authorization", "Basic czNjcmV0LXRva2Vu")),
            body.to_string(),
        )
        .await;
    basic.assert_problem(401, "unauthorized");
    assert_eq!(basic.header("www-authenticate").as_deref(), Some("Bearer"));
    app.get("/v1/idempotency-keys/auth-1", None)
        .await
        .assert_problem(401, "unauthorized");
    app.get(
        &format!("/v1/entries/{}", uuid::Uuid::now_v7()),
        Some("wrong"),
    )
    .await
    .assert_problem(401, "unauthorized");
    // Two Authorization headers: a proxy in front may read one, the daemon the other.
    for second in ["Bearer s3cret-token", "Bearer wrong-token"] {
        app.send(
            app.post_request("auth-1")
                .append_header(("Authorization", "Bearer s3cret-token"))
                .append_header(("Authorization", second)),
            body.to_string(),
        )
        .await
        .assert_problem(401, "unauthorized");
    }
    assert_eq!(app.row_counts().await, (0, 0, 0));

    let created = app
        .post_entry_as(Some("s3cret-token"), "auth-1", &body)
        .await;
    created.assert_created();
    // Health probes need no credentials.
    assert_eq!(app.get("/healthz", None).await.status, 200);
}

#[actix_web::test]
async fn a_client_sees_only_its_own_entries_and_keys() {
    let app = spawn_app_with(|settings| {
        settings.auth.clients = vec![client("billing", "token-a"), client("shipping", "token-b")];
    })
    .await;
    let created = app
        .post_entry_as(Some("token-a"), "private-1", &entry_body(1))
        .await;
    created.assert_created();
    let id = created.json()["id"].as_str().unwrap().to_owned();

    assert_eq!(
        app.get(&format!("/v1/entries/{id}"), Some("token-a"))
            .await
            .status,
        200
    );
    assert_eq!(
        app.get("/v1/idempotency-keys/private-1", Some("token-a"))
            .await
            .status,
        200
    );

    app.get(&format!("/v1/entries/{id}"), Some("token-b"))
        .await
        .assert_problem(404, "not-found");
    app.get("/v1/idempotency-keys/private-1", Some("token-b"))
        .await
        .assert_problem(404, "not-found");
    assert_eq!(app.row_counts().await, (1, 1, 1));
}

#[test]
fn anonymous_access_is_refused_off_loopback() {
    let mut settings = crate::common::helpers::test_settings();
    settings.http.listen = "0.0.0.0:0".parse().unwrap();
    let error = settings.validate().unwrap_err().to_string();
    assert!(error.contains("auth.clients"), "{error}");
    settings.auth.clients = vec![client("billing", "t")];
    settings.validate().unwrap();
}

/// What a raw HTTP/1 exchange got: the status and the whole answer.
struct RawAnswer {
    status: u16,
    text: String,
}

/// Sends `head` (a request line and headers, without the blank line) and `body` on a fresh
/// connection, as the daemon's HTTP/1 server sees them: `Host` is what the test writes, not
/// what a client library would put.
async fn raw(address: &str, head: &str, body: &str) -> RawAnswer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!(
            "{head}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    };
    let text = tokio::time::timeout(std::time::Duration::from_secs(30), exchange)
        .await
        .expect("the daemon answers");
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    RawAnswer { status, text }
}

/// DNS rebinding: a web page whose name now resolves to 127.0.0.1 drives the daemon from a
/// browser on the machine, its requests carrying `Host: <the page's name>`. In anonymous mode
/// (no clients; loopback only) such a request is refused with 421 before routing, on every
/// route, and writes nothing; loopback hosts are served.
#[actix_web::test]
async fn in_anonymous_mode_a_host_that_is_not_loopback_is_refused_before_routing() {
    let app = spawn_app_with(|_| {}).await;
    let address = app.address.trim_start_matches("http://").to_owned();
    let port = address.rsplit(':').next().unwrap().to_owned();
    let write = |key: &str, host: &str| {
        format!(
            "POST /v1/entries HTTP/1.1\r\nHost: {host}\r\nIdempotency-Key: {key}\r\nContent-Type: application/json"
        )
    };
    let body = entry_body(1).to_string();

    for (what, head) in [
        ("a foreign name", write("rebound-1", "attacker.example")),
        (
            "a foreign name with the port",
            write("rebound-2", &format!("attacker.example:{port}")),
        ),
        (
            "a loopback name's look-alike",
            write("rebound-3", "localhost.attacker.example"),
        ),
        ("another address", write("rebound-4", "10.0.0.1")),
        (
            "an absolute target naming another host",
            "POST http://attacker.example/v1/entries HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: rebound-7\r\nContent-Type: application/json"
                .to_owned(),
        ),
    ] {
        let answer = raw(&address, &head, &body).await;
        assert_eq!(answer.status, 421, "{what}: {}", answer.text);
        assert!(
            answer.text.contains("application/problem+json")
                && answer.text.contains("/problems/misdirected-request"),
            "{what}: {}",
            answer.text
        );
    }
    // HTTP/1.1 requires one Host: actix-http refuses a request without one, or with two,
    // itself (400; the daemon's check would say 421).
    for (what, head) in [
        (
            "no Host in HTTP/1.1",
            "POST /v1/entries HTTP/1.1\r\nIdempotency-Key: rebound-5\r\nContent-Type: application/json"
                .to_owned(),
        ),
        (
            "two Host headers",
            format!("{}\r\nHost: attacker.example", write("rebound-6", "127.0.0.1")),
        ),
    ] {
        let answer = raw(&address, &head, &body).await;
        assert!(matches!(answer.status, 400 | 421), "{what}: {}", answer.text);
    }
    // Every route, the operations ones and unknown ones included.
    for path in [
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/nowhere",
    ] {
        let answer = raw(
            &address,
            &format!("GET {path} HTTP/1.1\r\nHost: attacker.example"),
            "",
        )
        .await;
        assert_eq!(answer.status, 421, "{path}: {}", answer.text);
    }
    assert_eq!(app.row_counts().await, (0, 0, 0), "nothing written");

    for (n, host) in [
        "localhost".to_owned(),
        format!("localhost:{port}"),
        "LOCALHOST.".to_owned(),
        format!("127.0.0.1:{port}"),
        "127.0.0.2".to_owned(),
        format!("[::1]:{port}"),
    ]
    .iter()
    .enumerate()
    {
        let answer = raw(&address, &write(&format!("loopback-{n}"), host), &body).await;
        assert_eq!(answer.status, 201, "Host: {host}: {}", answer.text);
    }
    let old_client = raw(&address, "GET /healthz HTTP/1.0", "").await;
    assert_eq!(old_client.status, 200, "HTTP/1.0 needs no Host");
    assert_eq!(app.row_counts().await.0, 6);
    let metrics = app.get("/metrics", None).await.text();
    assert!(
        metrics.contains("route=\"unmatched\",outcome=\"invalid\"")
            || metrics.contains("outcome=\"invalid\",route=\"unmatched\""),
        "refusals are counted: {metrics}"
    );
}

/// With clients configured, requests need a token a web page cannot have; `Host` is not
/// checked (a proxy or a load balancer in front may name the daemon anything).
#[actix_web::test]
async fn with_clients_any_host_is_served() {
    let app =
        spawn_app_with(|settings| settings.auth.clients = vec![client("billing", "t0ken")]).await;
    let address = app.address.trim_start_matches("http://").to_owned();
    let answer = raw(
        &address,
        "POST /v1/entries HTTP/1.1\r\nHost: retrysafe.example.internal\r\nIdempotency-Key: named-1\r\nContent-Type: application/json\r\nAuthorization: Bearer t0ken",
        &entry_body(1).to_string(),
    )
    .await;
    assert_eq!(answer.status, 201, "{}", answer.text);
    let health = raw(
        &address,
        "GET /healthz HTTP/1.1\r\nHost: anything.example",
        "",
    )
    .await;
    assert_eq!(health.status, 200, "{}", health.text);
}
