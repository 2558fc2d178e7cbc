//! What the tests share besides the daemon: settings, the database and exchange a test owns,
//! answers as a client sees them, polling with a deadline, and checks on the tables.

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use retrysafe::config::{ClientSettings, Settings};
use serde_json::Value;
use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

pub const PG_HOST_PORT: &str = "127.0.0.1:5432";
pub const AMQP_HOST_PORT: &str = "127.0.0.1:5672";
pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// Reads from `stream` until what came holds `marker` (a line end, the end of a head), the
/// stream ends or fails; returns what came. For raw exchanges, where the daemon may answer and
/// close before it has read the whole request.
pub async fn read_until(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    marker: &[u8],
) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return answer,
            Ok(n) => {
                answer.extend_from_slice(&buffer[..n]);
                if answer.windows(marker.len()).any(|window| window == marker) {
                    return answer;
                }
            }
        }
    }
}

/// The most of an answer's body a test reads.
const BODY_LIMIT: usize = 4 << 20;

/// A knob for the long versions (docs/reliability.md, "Long versions"): the environment
/// variable's value, or `default` in CI.
pub fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// Settings for a test: a fresh database name, port 0, a short outbox poll.
pub fn test_settings() -> Settings {
    let mut settings = Settings::default();
    settings.http.listen = "127.0.0.1:0".parse().unwrap();
    settings.admin.listen = "127.0.0.1:0".parse().unwrap();
    settings.http.shutdown_timeout = std::time::Duration::from_secs(5);
    settings.database.url = pg_url(&format!("retrysafe_test_{}", Uuid::new_v4().simple())).into();
    // Longer than the daemon's default (2 s): on a loaded machine a connection can take over a
    // second, and a start that fails on it fails the test for the wrong reason. Tests of a hung
    // database set their own, short, bound.
    settings.database.connect_timeout = std::time::Duration::from_secs(5);
    settings.log.level = "warn".into();
    settings.amqp.exchange = format!("retrysafe.test.{}", Uuid::new_v4().simple());
    settings.outbox.poll_interval = Duration::from_millis(100);
    settings
}

pub fn pg_url(database: &str) -> String {
    format!("postgres://postgres@{PG_HOST_PORT}/{database}")
}

/// The database a PostgreSQL URL names.
pub fn database_name(url: &str) -> String {
    url.parse::<tokio_postgres::Config>()
        .unwrap()
        .get_dbname()
        .unwrap()
        .to_owned()
}

/// Points the daemon at its database through a proxy on `port` (the test's own connection stays
/// direct).
pub fn reach_database_through(settings: &mut Settings, port: u16) {
    let direct = settings.database.url.as_str().to_owned();
    settings.database.url = direct
        .replace(PG_HOST_PORT, &format!("127.0.0.1:{port}"))
        .into();
    assert_ne!(settings.database.url.as_str(), direct);
}

/// The broker's URL through a proxy on `port`: the daemon's connection goes through it, the
/// test's consumers reach the broker directly.
pub fn amqp_url_through(port: u16) -> String {
    let url = AMQP_URL.replace(AMQP_HOST_PORT, &format!("127.0.0.1:{port}"));
    assert_ne!(url, AMQP_URL);
    url
}

/// A client with a known token, for configs that require authentication.
pub fn client(id: &str, token: &str) -> ClientSettings {
    use sha2::Digest;
    ClientSettings {
        id: id.into(),
        token_sha256: hex::encode(sha2::Sha256::digest(token.as_bytes())),
        max_concurrent_writes: None,
        max_requests_per_second: None,
    }
}

/// An admin with a known token, for configs with an admin listener.
pub fn admin(id: &str, token: &str) -> retrysafe::config::AdminPrincipal {
    use sha2::Digest;
    retrysafe::config::AdminPrincipal {
        id: id.into(),
        token_sha256: hex::encode(sha2::Sha256::digest(token.as_bytes())),
    }
}

/// One sample's value in Prometheus text: the line that starts with `name_and_labels` (a name,
/// or a name and its labels as the exposition writes them, `name{label="value"}`).
pub fn metric_sample(metrics: &str, name_and_labels: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(name_and_labels)?;
        value.starts_with(' ').then(|| value.trim().parse().ok())?
    })
}

pub fn entry_body(n: i64) -> Value {
    serde_json::json!({"kind": "invoice.paid", "data": {"invoice": n, "amount": {"value": 1250, "currency": "EUR"}}})
}

/// Runs `work` to completion on a thread and runtime of its own: a guard's `drop` runs inside
/// the test's runtime, where it cannot block on a future.
fn block_on_in_thread<F: Future<Output = ()> + Send + 'static>(work: F, what: &str) {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(work)
    })
    .join()
    .unwrap_or_else(|_| panic!("{what}"));
}

/// A test's database (the daemon creates it when it starts); dropped when the test ends, when
/// it is on the machine's server.
pub struct TestDatabase {
    pub name: String,
    /// Where the test connects for its assertions.
    pub url: String,
    /// On the machine's server, the test's own: dropped at the end. A database of a server of
    /// the test's own (a Citus lab) goes with that server.
    owned: bool,
}

impl TestDatabase {
    /// The database of `settings.database.url`.
    pub fn new(settings: &Settings) -> Self {
        let name = database_name(settings.database.url.as_str());
        Self {
            url: pg_url(&name),
            name,
            owned: true,
        }
    }

    /// A database of the machine's server named `name`.
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            url: pg_url(name),
            owned: true,
        }
    }

    /// The database at `url`, on a server of the test's own.
    pub fn external(url: &str) -> Self {
        Self {
            name: database_name(url),
            url: url.to_owned(),
            owned: false,
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let name = self.name.clone();
        let drop_database = async move {
            let (client, connection) = tokio_postgres::connect(&pg_url("postgres"), NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            client
                .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await
                .unwrap();
        };
        block_on_in_thread(drop_database, "dropping the test database");
    }
}

/// An exchange a test's daemon declares; deleted when the test ends.
pub struct TestExchange {
    pub name: String,
}

impl TestExchange {
    /// The exchange of `settings.amqp.exchange`.
    pub fn new(settings: &Settings) -> Self {
        Self {
            name: settings.amqp.exchange.clone(),
        }
    }
}

impl Drop for TestExchange {
    fn drop(&mut self) {
        let name = self.name.clone();
        let delete_exchange = async move {
            let connection =
                lapin::Connection::connect(AMQP_URL, lapin::ConnectionProperties::default())
                    .await
                    .expect("the test broker is reachable");
            let channel = connection.create_channel().await.unwrap();
            channel
                .exchange_delete(
                    name.as_str().into(),
                    lapin::options::ExchangeDeleteOptions::default(),
                )
                .await
                .unwrap();
            let _ = connection.close(200, "done".into()).await;
        };
        block_on_in_thread(delete_exchange, "deleting the test exchange");
    }
}

/// An answer with its body read, as a client sees it.
#[derive(Debug, Clone)]
pub struct TestResponse {
    pub status: u16,
    pub headers: awc::http::header::HeaderMap,
    pub body: Vec<u8>,
}

impl TestResponse {
    /// Reads the body of `response`.
    pub async fn read(mut response: awc::ClientResponse) -> Result<Self, String> {
        let body = response
            .body()
            .limit(BODY_LIMIT)
            .await
            .map_err(|e| format!("body: {e}"))?;
        Ok(Self {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: body.to_vec(),
        })
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{} body is not JSON ({e}): {}", self.status, self.text()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The status and the body, for failure messages.
    pub fn describe(&self) -> String {
        format!("{} {}", self.status, self.text())
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    /// Whether it says `Idempotency-Replayed: true`.
    pub fn replayed(&self) -> bool {
        self.header("idempotency-replayed").as_deref() == Some("true")
    }

    /// Asserts a 201, showing the answer otherwise.
    pub fn assert_created(&self) {
        assert_eq!(self.status, 201, "expected 201, got {}", self.describe());
    }

    /// The problem `type` slug of a problem+json answer.
    pub fn problem_slug(&self) -> Option<String> {
        if self.header("content-type").as_deref() != Some("application/problem+json") {
            return None;
        }
        let problem: Value = serde_json::from_slice(&self.body).ok()?;
        problem["type"]
            .as_str()?
            .strip_prefix("/problems/")
            .map(str::to_owned)
    }

    /// A 503 `storage-unavailable` with a numeric `Retry-After`, as the contract says.
    pub fn is_storage_unavailable(&self) -> bool {
        self.status == 503
            && self.problem_slug().as_deref() == Some("storage-unavailable")
            && self
                .header("retry-after")
                .is_some_and(|v| v.parse::<u32>().is_ok())
    }

    /// Asserts a problem+json refusal of the given status and type.
    pub fn assert_problem(&self, status: u16, slug: &str) {
        assert_eq!(
            self.status,
            status,
            "expected {status} {slug}, got {}",
            self.describe()
        );
        assert_eq!(
            self.header("content-type").as_deref(),
            Some("application/problem+json")
        );
        let problem = self.json();
        assert_eq!(problem["type"], format!("/problems/{slug}"), "{problem}");
        assert_eq!(problem["status"], status);
        assert!(
            problem["title"].as_str().is_some_and(|t| !t.is_empty()),
            "{problem}"
        );
        assert!(
            problem["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{problem}"
        );
    }
}

/// A client whose requests are bounded: a hang shows up as an error, not as a stuck test.
///
/// It drops a connection left idle for 2 s, before the daemon's keep-alive (actix-web's 5 s)
/// closes it: a request sent on a connection the daemon is closing fails (`Connect
/// (Disconnected)`, the answer never comes), and awc would otherwise reuse one for 15 s.
pub fn http_client(timeout: Duration) -> awc::Client {
    awc::Client::builder()
        .timeout(timeout)
        .connector(awc::Connector::new().conn_keep_alive(Duration::from_secs(2)))
        .finish()
}

/// `POST {base}/v1/entries` with `key` and the raw JSON `body`. Err is a transport failure
/// (refused, reset, timed out), as a client that retries sees it.
pub async fn post_raw(
    client: &awc::Client,
    base: &str,
    key: &str,
    body: &str,
    limit: Duration,
) -> Result<TestResponse, String> {
    post_raw_as(client, base, None, key, body, limit).await
}

/// [`post_raw`] with a bearer `token`, when one is given.
pub async fn post_raw_as(
    client: &awc::Client,
    base: &str,
    token: Option<&str>,
    key: &str,
    body: &str,
    limit: Duration,
) -> Result<TestResponse, String> {
    let exchange = async {
        let mut request = client
            .post(format!("{base}/v1/entries"))
            .insert_header(("Idempotency-Key", key))
            .insert_header(("Content-Type", "application/json"));
        if let Some(token) = token {
            request = request.insert_header(("Authorization", format!("Bearer {token}")));
        }
        let response = request
            .send_body(body.to_owned())
            .await
            .map_err(|e| format!("send: {e}"))?;
        TestResponse::read(response).await
    };
    tokio::time::timeout(limit, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {limit:?}")))
}

/// [`post_raw`] on a client of its own, within `limit`; a transport failure fails the test.
pub async fn post_bounded(base: &str, key: &str, body: &str, limit: Duration) -> TestResponse {
    post_raw(&http_client(limit), base, key, body, limit)
        .await
        .unwrap_or_else(|error| panic!("{key}: {error}"))
}

/// Runs `check` until it returns Ok, every 50 ms for up to `limit`, and returns its value;
/// past the limit the test fails with the last Err (what `check` saw instead).
pub async fn eventually<T, F, Fut>(limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) if tokio::time::Instant::now() >= deadline => {
                panic!("not so within {limit:?}: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Whether `sql` (a count) returns `expected`, for [`eventually`].
pub async fn count_is(db: &Client, sql: &str, expected: i64) -> Result<(), String> {
    let now = count(db, sql).await;
    if now == expected {
        Ok(())
    } else {
        Err(format!("{sql} returned {now}, not {expected}"))
    }
}

/// A direct connection to a test database, for assertions and for holding locks.
pub async fn connect(database: &str) -> Client {
    connect_to(&pg_url(database)).await
}

/// A connection of the test's own to the database at `url`.
pub async fn connect_to(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    actix_web::rt::spawn(async move {
        // The connection ends when the test drops its client (or the database is dropped).
        let _ = connection.await;
    });
    client
}

pub async fn count(db: &Client, sql: &str) -> i64 {
    db.query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// Inserts `count` events straight into the outbox, as a large backlog left by writes.
pub async fn insert_backlog(db: &Client, count: i64) {
    db.execute(
        "INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key, event_type, payload)
         SELECT gen_random_uuid(), 'backlog/' || n, 'anonymous', 'backlog-' || n, 'entry.created',
                jsonb_build_object('specversion', '1.0', 'n', n, 'padding', repeat('x', 200))
         FROM generate_series(1, $1::bigint) AS n",
        &[&count],
    )
    .await
    .unwrap();
}

pub async fn all_event_ids(db: &Client) -> HashSet<Uuid> {
    db.query("SELECT event_id FROM outbox_events", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// The write path's atomicity, checked on the tables: every idempotency record has its entry
/// and the entry its `events_per_entry` outbox rows, and nothing exists without its record.
/// Returns the number of records.
pub async fn assert_nothing_half_written(db: &Client, events_per_entry: i64) -> i64 {
    let checks = [
        (
            "records without their entry",
            "SELECT count(*) FROM idempotency_records r WHERE NOT EXISTS
                (SELECT 1 FROM entries e WHERE e.id = r.entry_id
                    AND e.client_id = r.client_id AND e.idempotency_key = r.key)",
        ),
        (
            "entries without their record",
            "SELECT count(*) FROM entries e WHERE NOT EXISTS
                (SELECT 1 FROM idempotency_records r WHERE r.entry_id = e.id)",
        ),
        (
            "outbox rows without their entry",
            "SELECT count(*) FROM outbox_events o WHERE NOT EXISTS
                (SELECT 1 FROM entries e WHERE o.event_key LIKE e.id::text || '/%'
                    AND o.client_id = e.client_id AND o.idempotency_key = e.idempotency_key)",
        ),
    ];
    for (what, sql) in checks {
        assert_eq!(count(db, sql).await, 0, "{what}");
    }
    let wrong_event_count = format!(
        "SELECT count(*) FROM entries e WHERE
            (SELECT count(*) FROM outbox_events o WHERE o.event_key LIKE e.id::text || '/%')
            <> {events_per_entry}"
    );
    assert_eq!(
        count(db, &wrong_event_count).await,
        0,
        "entries without exactly {events_per_entry} outbox rows"
    );
    count(db, "SELECT count(*) FROM idempotency_records").await
}

/// A session that holds a lock and does not let go (a stuck migration, a long report, an
/// operator's open transaction).
pub struct LockHolder {
    session: Client,
}

impl LockHolder {
    /// Opens a transaction on `database` and runs `statements` in it, keeping it open.
    pub async fn take(database: &str, statements: &str) -> Self {
        let session = connect(database).await;
        session
            .batch_execute(&format!("BEGIN; {statements}"))
            .await
            .unwrap();
        Self { session }
    }

    /// Another session's claim of `key` (the anonymous client's), stuck before its commit: an
    /// uncommitted idempotency record that a write of the key must wait for.
    pub async fn claim(database: &str, key: &str) -> Self {
        Self::take(
            database,
            &format!(
                "INSERT INTO idempotency_records
                    (client_id, key, request_hash, status, response_status, response_json, expires_at)
                 VALUES ('anonymous', '{key}', '\\x00', 'completed', 201, '{{}}', now() + interval '1 day')"
            ),
        )
        .await
    }

    pub async fn release(self) {
        self.session.batch_execute("ROLLBACK").await.unwrap();
    }
}
