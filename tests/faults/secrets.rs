//! Secrets never leave the daemon: not in its logs, not in any answer (body or header), not in
//! `/metrics`, not in the rows it writes. The real binary runs with a configuration file (written
//! by the test, as an operator would) that holds a database URL with two passwords (one in the
//! user info, one as `?password=`; PostgreSQL's `trust` on loopback accepts any), the AMQP URL
//! with its `guest:guest` credentials, and a client token; logging is `debug` in JSON, the most
//! an operator would turn on. The test drives writes and lookups with the token, a wrong token
//! and the token in wrong places, then stops the daemon and searches everything it produced.
//!
//! Each search can fail; the comment above it names a change to `src/` that makes it fail.
//! The positive checks before them make sure the searches look at real output (the startup line
//! that names both URLs, a debug line per request), so that they cannot pass on empty text.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use awc::http::Method;
use uuid::Uuid;

use crate::common::daemon::{free_port, log_to, spawn_binary_as, TestDaemon};
use crate::common::helpers::{
    client, count_is, database_name, eventually, test_settings, TestResponse,
};
use crate::common::passwords::{
    assert_no_piece_of, in_url, run_with_database_url, PASSWORDS, RAW_AT_PASSWORD,
};
use crate::common::postgres::PgCluster;

const CLIENT_ID: &str = "secrets-test";

/// What the daemon answered, as text, for the searches.
#[derive(Default)]
struct Transcript {
    bodies: String,
    headers: String,
}

/// Sends a request to the daemon and adds its answer to `transcript`.
async fn send(
    daemon: &TestDaemon,
    transcript: &mut Transcript,
    method: Method,
    url: String,
    headers: &[(&str, String)],
    body: &str,
) -> TestResponse {
    let mut request = daemon.http.request(method, url);
    for (name, value) in headers {
        request = request.insert_header((*name, value.as_str()));
    }
    let answer = daemon.send(request, body.to_owned()).await;
    for (name, value) in &answer.headers {
        transcript.headers.push_str(&format!(
            "{name}: {}\n",
            String::from_utf8_lossy(value.as_bytes())
        ));
    }
    transcript.bodies.push_str(&answer.text());
    transcript.bodies.push('\n');
    answer
}

/// The first line of `text` that holds `secret`, for the failure message.
fn line_with<'a>(text: &'a str, secret: &str) -> &'a str {
    text.lines()
        .find(|line| line.contains(secret))
        .unwrap_or_default()
}

#[actix_web::test]
async fn tokens_and_passwords_appear_in_no_log_answer_metric_or_row() {
    run_and_search("debug").await;
}

/// The same at `trace`, where lapin logs every AMQP frame it writes, `Connection.StartOk`
/// included: its SASL PLAIN response is the broker login (`\0guest\0guest`), printed as a byte
/// list. It failed so until src/telemetry.rs capped `lapin::io_loop` at debug; nothing else
/// leaked at trace (no database password, no token).
#[actix_web::test]
async fn the_broker_password_stays_out_of_a_trace_log() {
    run_and_search("trace").await;
}

async fn run_and_search(level: &str) {
    let settings = test_settings();
    let db_name = database_name(&settings.database.url);
    let nonce = Uuid::new_v4().simple().to_string();
    // With `?`, `#` and `/` typed unencoded, as libpq and tokio-postgres take them (the user
    // info runs to the first `@`); the old redaction cut at the `?` and logged what came
    // before it.
    let db_userinfo_password_start = format!("DbUserinfoPw{nonce}");
    let db_userinfo_password = format!("{db_userinfo_password_start}?se#cret/tail");
    let db_query_password = format!("DbQueryPw{nonce}");
    let token = format!("rs_{nonce}{}", Uuid::new_v4().simple());
    let wrong_token = format!("rs_{}{nonce}", Uuid::new_v4().simple());
    // The only login the test broker accepts; the URL form is what must not show.
    let amqp_credentials = "guest:guest@";
    // The SASL PLAIN response (`\0user\0password`) as lapin's Debug prints it: a byte list.
    let plain_response: String = std::iter::once(0u8)
        .chain(*b"guest")
        .chain(std::iter::once(0u8))
        .chain(*b"guest")
        .map(|byte| byte.to_string())
        .collect::<Vec<_>>()
        .join(", ");

    let port = free_port();
    let address = format!("http://127.0.0.1:{port}");
    let config = format!(
        r#"[http]
listen = "127.0.0.1:{port}"

[database]
url = "postgres://postgres:{db_userinfo_password}@127.0.0.1:5432/{db_name}?password={db_query_password}&application_name=retrysafe-secrets"

[amqp]
url = "amqp://guest:guest@127.0.0.1:5672/%2f"
exchange = "{exchange}"

[outbox]
poll_interval = "100ms"

[events]
audit = true

[log]
format = "json"
level = "{level}"

[[auth.clients]]
id = "{CLIENT_ID}"
token_sha256 = "{digest}"
"#,
        exchange = settings.amqp.exchange,
        digest = client(CLIENT_ID, &token).token_sha256,
    );
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let config_path = dir.join(format!("secrets-{nonce}.toml"));
    std::fs::write(&config_path, config).unwrap();
    let serve = config_path.clone();
    // Killed and its log removed when dropped, before its database and exchange go.
    let mut daemon = spawn_binary_as(settings, port, move |log| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_retrysafe"));
        command
            .arg("serve")
            .arg("--config")
            .arg(&serve)
            // Nothing from the test's environment (RUST_LOG, RETRYSAFE_*) changes the run.
            .env_clear();
        log_to(&mut command, log);
        command
    })
    .await;

    let mut seen = Transcript::default();
    let bearer = |t: &str| ("Authorization", format!("Bearer {t}"));
    let json = ("Content-Type", "application/json".to_owned());
    let key = ("Idempotency-Key", "secrets-1".to_owned());
    // What a client writes is its business: no log line of the daemon shows it, not even
    // tokio-postgres's statement logs, at debug or at trace.
    let entry_data = format!("entry-data-{nonce}");
    let body =
        format!(r#"{{"kind":"secrets.check","data":{{"amount":1250,"note":"{entry_data}"}}}}"#);
    let body = body.as_str();
    let entries = format!("{address}/v1/entries");
    let mut unauthorized = 0;

    // A good write with the token, and its replay.
    let first = send(
        &daemon,
        &mut seen,
        Method::POST,
        entries.clone(),
        &[bearer(&token), json.clone(), key.clone()],
        body,
    )
    .await;
    first.assert_created();
    let replay = send(
        &daemon,
        &mut seen,
        Method::POST,
        entries.clone(),
        &[bearer(&token), json.clone(), key.clone()],
        body,
    )
    .await;
    assert_eq!(
        (replay.status, replay.replayed()),
        (201, true),
        "{}",
        replay.describe()
    );
    // A refused body with the right token (an error answer that is not about credentials).
    let bad = send(
        &daemon,
        &mut seen,
        Method::POST,
        entries.clone(),
        &[
            bearer(&token),
            json.clone(),
            ("Idempotency-Key", "secrets-2".into()),
        ],
        "{\"kind\":",
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.describe());

    // A wrong token, and the right token in places that are not `Authorization: Bearer`.
    let refused: Vec<(String, Vec<(&str, String)>)> = vec![
        (entries.clone(), vec![bearer(&wrong_token)]),
        (entries.clone(), vec![("Authorization", token.clone())]),
        (
            entries.clone(),
            vec![("Authorization", format!("Token {token}"))],
        ),
        (
            entries.clone(),
            vec![("Authorization", format!("Bearer{token}"))],
        ),
        (entries.clone(), vec![("X-Api-Key", token.clone())]),
        (format!("{entries}?access_token={token}"), vec![]),
    ];
    for (url, mut headers) in refused {
        headers.extend([json.clone(), ("Idempotency-Key", "secrets-3".to_owned())]);
        let answer = send(&daemon, &mut seen, Method::POST, url, &headers, body).await;
        assert_eq!(answer.status, 401, "{:?}: {}", headers, answer.describe());
        unauthorized += 1;
    }
    let lookup = format!("{address}/v1/idempotency-keys/secrets-1");
    let answer = send(
        &daemon,
        &mut seen,
        Method::GET,
        lookup.clone(),
        &[bearer(&wrong_token)],
        "",
    )
    .await;
    assert_eq!(answer.status, 401, "{}", answer.describe());
    unauthorized += 1;

    // The relay tries the events; no queue is bound, so they come back as unroutable and
    // `last_error` (shown by the key lookup) is set: an error text that reaches an answer.
    let tried = "SELECT count(*) FROM outbox_events WHERE attempts > 0 AND last_error IS NOT NULL";
    eventually(Duration::from_secs(20), || count_is(&daemon.db, tried, 2)).await;
    let answer = send(
        &daemon,
        &mut seen,
        Method::GET,
        lookup,
        &[bearer(&token)],
        "",
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.describe());
    assert!(
        answer.text().contains("last_error"),
        "{}",
        answer.describe()
    );
    let location = first.header("location").expect("a 201 has a Location");
    let answer = send(
        &daemon,
        &mut seen,
        Method::GET,
        format!("{address}{location}"),
        &[bearer(&token)],
        "",
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.describe());
    for path in ["/readyz", "/healthz", "/openapi.json"] {
        send(
            &daemon,
            &mut seen,
            Method::GET,
            format!("{address}{path}"),
            &[bearer(&token)],
            "",
        )
        .await;
    }
    let metrics = send(
        &daemon,
        &mut seen,
        Method::GET,
        format!("{address}/metrics"),
        &[bearer(&token)],
        "",
    )
    .await;
    assert_eq!(metrics.status, 200);
    let metrics = metrics.text();

    let rows: String = daemon
        .db
        .query_one(
            "SELECT coalesce(string_agg(t, E'\\n'), '') FROM (
                 SELECT row_to_json(r)::text FROM idempotency_records r
                 UNION ALL SELECT row_to_json(e)::text FROM entries e
                 UNION ALL SELECT row_to_json(o)::text FROM outbox_events o) AS rows(t)",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    // Stop it the normal way, so that the shutdown lines are searched too.
    daemon.signal("TERM");
    let status = daemon.wait_for_exit().await;
    assert!(status.success(), "exit after SIGTERM: {status}");
    let log = daemon.log_text();

    let places = [
        ("the daemon's log", log.as_str()),
        // Before the bodies, which hold the /metrics answer too.
        ("/metrics", metrics.as_str()),
        ("the rows the daemon wrote", rows.as_str()),
        ("a response body", seen.bodies.as_str()),
        ("a response header", seen.headers.as_str()),
    ];
    // What would make each search fail:
    // - the database passwords: logging `settings.database.url` instead of
    //   `redact_url(...)` in `serve` (src/cli.rs), a `redact_url` that keeps the query
    //   (`?password=`) or cuts the URL at its first `?` before finding the `@` (the user-info
    //   password's start); a `StorageError` whose text carries the URL, answered in a 503
    //   detail;
    // - the client token: `uri = %request.uri()` instead of `path` in the request span
    //   (src/http/observe.rs; the query-string token then shows), a `headers = ?request.headers()`
    //   field there, an `unauthorized` detail that quotes the `Authorization` header
    //   (src/http/problem.rs), the token used as a metric label or stored in the audit event;
    // - the wrong token: the same changes (a client's mistyped token is still its secret);
    // - the broker login: logging `settings.amqp.url` instead of `redact_url(...)`, or a
    //   `BrokerError::Connect` text that formats the URI, shown in a log line; as PLAIN bytes:
    //   lapin's frame logging reaching the log (it did at `trace` before the telemetry cap).
    let secrets = [
        (
            "the database password (user info)",
            db_userinfo_password.as_str(),
        ),
        (
            "the database password's start, before its `?` (user info)",
            db_userinfo_password_start.as_str(),
        ),
        (
            "the database password (?password=)",
            db_query_password.as_str(),
        ),
        ("the client token", token.as_str()),
        ("the wrong token", wrong_token.as_str()),
        ("the broker login (guest:guest@)", amqp_credentials),
        (
            "the broker login (SASL PLAIN bytes)",
            plain_response.as_str(),
        ),
    ];
    for (secret_name, secret) in secrets {
        for (place, text) in places {
            assert!(
                !text.contains(secret),
                "{secret_name} appears in {place}: {}",
                line_with(text, secret)
            );
        }
    }
    // tokio-postgres logs statement parameters at debug; src/telemetry.rs keeps it at info,
    // at trace too, unless the filter names it.
    assert!(
        !log.contains(&entry_data),
        "entry data in the {level} log: {}",
        line_with(&log, &entry_data)
    );
    // The searches above looked at real output:
    // - the startup line names both URLs, redacted (so removing `redact_url` leaks them);
    assert!(
        log.contains("postgres://postgres:***@127.0.0.1:5432/"),
        "no startup line with the redacted database URL:\n{log}"
    );
    assert!(
        log.contains("amqp://guest:***@127.0.0.1:5672"),
        "no startup line with the redacted broker URL:\n{log}"
    );
    // - every refused request has its own debug line, with its span (method, path);
    let logged_401 = log
        .lines()
        .filter(|line| line.contains("\"level\":\"DEBUG\"") && line.contains("\"status\":401"))
        .count();
    assert!(
        logged_401 >= unauthorized,
        "{logged_401} debug lines for {unauthorized} refused requests:\n{log}"
    );
    // - the metrics count the refusals; the rows hold the write and its two events.
    assert!(
        metrics.contains("outcome=\"unauthorized\""),
        "/metrics does not count refusals:\n{metrics}"
    );
    assert!(
        rows.contains("secrets-1") && rows.contains("audit.entry.created"),
        "the rows are not the write's: {rows}"
    );

    let _ = std::fs::remove_file(&config_path);
}

/// Passwords holding `?`, `#`, `/` and `@` (tests/common/passwords.rs) against a PostgreSQL
/// cluster of the test's own that refuses the login (SCRAM, another password): `check-config`
/// takes each URL, `migrate` and `serve` stop with an error that names the host and says the
/// authentication failed, and none of the three prints a piece of the password. A password
/// with a raw `@` is refused by all three before anything connects: read as libpq reads it, its
/// rest would be the host, which the warnings and the connect errors print.
#[test]
fn a_refused_login_names_the_host_and_shows_no_piece_of_the_password() {
    let cluster = PgCluster::start(
        "refused-login",
        "log_connections = on",
        &["host all all 127.0.0.1/32 scram-sha-256"],
        &[],
    );
    cluster.psql("CREATE ROLE app LOGIN SUPERUSER PASSWORD 'Another-One-0'");
    let host = format!("127.0.0.1:{}", cluster.port);
    for password in PASSWORDS {
        let url = format!("postgres://app:{}@{host}/refused", in_url(password));
        let (valid, text) = run_with_database_url("check-config", &url);
        assert_no_piece_of(password, &text, "check-config");
        assert!(valid, "{password}: check-config refused the URL: {text}");
        for command in ["migrate", "serve"] {
            let before = cluster.log_text().len();
            let (succeeded, text) = run_with_database_url(command, &url);
            assert_no_piece_of(password, &text, command);
            assert!(!succeeded, "{password}: {command} succeeded: {text}");
            assert!(
                text.contains(&format!("({host}: password authentication failed")),
                "{password}: {command}: {text}"
            );
            let log = cluster.log_text()[before..].to_owned();
            assert!(
                log.contains("password authentication failed for user \"app\""),
                "{password}: {command}: the server did not refuse a login: {log}"
            );
            // The search looked at real output: serve's startup line shows the URL redacted.
            assert!(
                command != "serve" || text.contains(&format!("postgres://app:***@{host}/refused")),
                "{password}: no startup line with the redacted URL: {text}"
            );
        }
    }

    let url = format!("postgres://app:{RAW_AT_PASSWORD}@{host}/refused");
    for command in ["check-config", "migrate", "serve"] {
        let before = cluster.log_text().len();
        let (succeeded, text) = run_with_database_url(command, &url);
        assert_no_piece_of(RAW_AT_PASSWORD, &text, command);
        assert!(!succeeded, "{command} took a raw @ in the password: {text}");
        assert!(
            text.contains("database.url") && text.contains("%40"),
            "{command}: {text}"
        );
        let log = cluster.log_text()[before..].to_owned();
        assert!(
            !log.contains("connection received"),
            "{command} connected: {log}"
        );
    }
}
