//! Test harness: each test gets its own database and its own daemon on port 0.

use std::sync::Arc;
use std::time::Duration;

use retrysafe::config::{ClientSettings, Settings};
use retrysafe::startup::Application;
use serde_json::Value;
use tokio_postgres::NoTls;
use uuid::Uuid;

pub const PG_HOST_PORT: &str = "127.0.0.1:5432";

/// A daemon under test, the database it owns, and a direct connection for assertions.
pub struct TestApp {
    pub address: String,
    pub settings: Settings,
    pub db: tokio_postgres::Client,
    pub http: awc::Client,
    /// Drops the database when the last app using it is gone.
    pub database: Arc<TestDatabase>,
    /// Deletes the exchange when the last app using it is gone.
    pub exchange: Arc<TestExchange>,
}

/// A response with its body read.
pub struct TestResponse {
    pub status: u16,
    pub headers: awc::http::header::HeaderMap,
    pub body: Vec<u8>,
}

impl TestResponse {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    }

    /// Asserts a problem+json refusal of the given status and type.
    pub fn assert_problem(&self, status: u16, slug: &str) {
        assert_eq!(
            self.status,
            status,
            "expected {status} {slug}, got {}: {}",
            self.status,
            String::from_utf8_lossy(&self.body)
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

/// Inserts `count` events straight into the outbox, as a large backlog left by writes.
pub async fn insert_backlog(db: &tokio_postgres::Client, count: i64) {
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

/// Runs `work` to completion on a thread and runtime of its own: a guard's `drop` runs inside
/// the test's runtime, where it cannot block on a future.
fn block_on_in_thread<F: std::future::Future<Output = ()> + Send + 'static>(work: F, what: &str) {
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

pub struct TestDatabase {
    pub name: String,
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
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

pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// An exchange a test's daemon declares; deleted when the test ends.
pub struct TestExchange {
    pub name: String,
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

pub fn pg_url(database: &str) -> String {
    format!("postgres://postgres@{PG_HOST_PORT}/{database}")
}

/// Settings for a test: a fresh database name, port 0, small timeouts.
pub fn test_settings() -> Settings {
    let mut settings = Settings::default();
    settings.http.listen = "127.0.0.1:0".parse().unwrap();
    settings.http.shutdown_timeout = retrysafe::config::ConfigDuration::from_secs(5);
    settings.database.url = pg_url(&format!("retrysafe_test_{}", Uuid::new_v4().simple()));
    settings.database.connect_timeout = retrysafe::config::ConfigDuration(Duration::from_secs(1));
    settings.log.level = "warn".into();
    settings.amqp.exchange = format!("retrysafe.test.{}", Uuid::new_v4().simple());
    settings.outbox.poll_interval = retrysafe::config::ConfigDuration(Duration::from_millis(100));
    settings
}

/// Points the daemon at its database through a proxy on `port` (the test's own connection stays
/// direct).
pub fn reach_database_through(settings: &mut Settings, port: u16) {
    let direct = settings.database.url.clone();
    settings.database.url = direct.replace(PG_HOST_PORT, &format!("127.0.0.1:{port}"));
    assert_ne!(settings.database.url, direct);
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(configure: impl FnOnce(&mut Settings)) -> TestApp {
    let mut settings = test_settings();
    configure(&mut settings);
    let name = database_name(&settings.database.url);
    let database = Arc::new(TestDatabase { name });
    let exchange = Arc::new(TestExchange {
        name: settings.amqp.exchange.clone(),
    });
    start(settings, database, exchange).await
}

/// A second daemon on the same database (as two machines behind one load balancer).
pub async fn spawn_second_app(first: &TestApp) -> TestApp {
    let mut settings = first.settings.clone();
    settings.http.listen = "127.0.0.1:0".parse().unwrap();
    start(settings, first.database.clone(), first.exchange.clone()).await
}

async fn start(
    settings: Settings,
    database: Arc<TestDatabase>,
    exchange: Arc<TestExchange>,
) -> TestApp {
    init_logging();
    let application = Application::build(settings.clone())
        .await
        .expect("the app starts");
    let address = format!("http://127.0.0.1:{}", application.port());
    actix_web::rt::spawn(application.run_until_stopped());
    let (db, connection) = tokio_postgres::connect(&pg_url(&database.name), NoTls)
        .await
        .unwrap();
    actix_web::rt::spawn(connection);
    TestApp {
        address,
        settings,
        db,
        http: awc::Client::builder()
            .timeout(Duration::from_secs(60))
            .finish(),
        database,
        exchange,
    }
}

fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(std::env::var("TEST_LOG").unwrap_or_else(|_| "warn".into()))
            .with_test_writer()
            .try_init();
    });
}

fn database_name(url: &str) -> String {
    url.parse::<tokio_postgres::Config>()
        .unwrap()
        .get_dbname()
        .unwrap()
        .to_owned()
}

impl TestApp {
    pub async fn send(
        &self,
        request: awc::ClientRequest,
        body: impl Into<Vec<u8>>,
    ) -> TestResponse {
        let mut response = request
            .send_body(body.into())
            .await
            .expect("the request is answered");
        let body = response
            .body()
            .limit(1 << 20)
            .await
            .expect("the body is read")
            .to_vec();
        TestResponse {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body,
        }
    }

    /// `POST /v1/entries` with a key, a JSON body and (optionally) a bearer token.
    pub async fn post_entry(&self, key: &str, body: &Value) -> TestResponse {
        self.post_entry_as(None, key, body).await
    }

    pub async fn post_entry_owned(&self, key: String, body: Value) -> TestResponse {
        self.post_entry(&key, &body).await
    }

    pub async fn post_entry_as(
        &self,
        token: Option<&str>,
        key: &str,
        body: &Value,
    ) -> TestResponse {
        let mut request = self
            .http
            .post(format!("{}/v1/entries", self.address))
            .insert_header(("Idempotency-Key", key))
            .insert_header(("Content-Type", "application/json"));
        if let Some(token) = token {
            request = request.insert_header(("Authorization", format!("Bearer {token}")));
        }
        self.send(request, body.to_string()).await
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> TestResponse {
        let mut request = self.http.get(format!("{}{path}", self.address));
        if let Some(token) = token {
            request = request.insert_header(("Authorization", format!("Bearer {token}")));
        }
        self.send(request, Vec::new()).await
    }

    /// `/readyz` once it satisfies `wanted` (readiness is re-checked at most once a second, and
    /// the backlog it reports is refreshed every few seconds), within a generous bound.
    pub async fn readyz_once(&self, wanted: impl Fn(&TestResponse) -> bool) -> TestResponse {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let ready = self.get("/readyz", None).await;
            if wanted(&ready) {
                return ready;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "/readyz never got there: {} {}",
                ready.status,
                String::from_utf8_lossy(&ready.body)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn count(&self, sql: &str) -> i64 {
        self.db.query_one(sql, &[]).await.unwrap().get(0)
    }

    /// Rows in the three tables a write touches.
    pub async fn row_counts(&self) -> (i64, i64, i64) {
        (
            self.count("SELECT count(*) FROM idempotency_records").await,
            self.count("SELECT count(*) FROM entries").await,
            self.count("SELECT count(*) FROM outbox_events").await,
        )
    }
}

/// A client with a known token, for configs that require authentication.
pub fn client(id: &str, token: &str) -> ClientSettings {
    use sha2::Digest;
    ClientSettings {
        id: id.into(),
        token_sha256: hex::encode(sha2::Sha256::digest(token.as_bytes())),
    }
}

pub fn entry_body(n: i64) -> Value {
    serde_json::json!({"kind": "invoice.paid", "data": {"invoice": n, "amount": {"value": 1250, "currency": "EUR"}}})
}
