//! Helpers the fault tests share and tests/common does not have: a daemon process that can be
//! SIGKILLed and restarted on the same port, a bounded HTTP attempt, SQL invariants, knobs for
//! the long versions, and polling with a deadline.

use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use awc::http::header::HeaderMap;
use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

use crate::common::daemon::serve_command;
use crate::common::helpers::pg_url;

/// A knob for the long versions (docs/reliability.md, "Long versions"): the environment
/// variable's value, or `default` in CI.
pub fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

pub use crate::common::daemon::free_port;
pub use crate::common::helpers::insert_backlog;

/// The database name at the end of a test URL.
pub fn database_name(url: &str) -> String {
    url.rsplit('/').next().unwrap().to_owned()
}

/// A direct connection to a test database, for assertions and for holding locks.
pub async fn connect(database: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(&pg_url(database), NoTls)
        .await
        .unwrap();
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

/// Polls `sql` (a count) until it returns `expected`, for up to `limit`; a hang guard.
pub async fn wait_for_count(db: &Client, sql: &str, expected: i64, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let now = count(db, sql).await;
        if now == expected {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("{sql} never returned {expected} within {limit:?} (last: {now})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

pub async fn all_event_ids(db: &Client) -> std::collections::HashSet<Uuid> {
    db.query("SELECT event_id FROM outbox_events", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// One HTTP exchange, as a client sees it.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} body is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    pub fn replayed(&self) -> bool {
        self.header("idempotency-replayed").as_deref() == Some("true")
    }

    /// The problem `type` slug of a problem+json answer.
    pub fn problem_slug(&self) -> Option<String> {
        if self.header("content-type").as_deref() != Some("application/problem+json") {
            return None;
        }
        let problem: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
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

    pub fn describe(&self) -> String {
        format!("{} {}", self.status, String::from_utf8_lossy(&self.body))
    }
}

/// A client whose requests are bounded: a hang shows up as an error, not as a stuck test.
pub fn http_client(timeout: Duration) -> awc::Client {
    awc::Client::builder().timeout(timeout).finish()
}

/// `POST {base}/v1/entries` with `key` and the raw JSON `body`. Err is a transport failure
/// (refused, reset, timed out), as a client that retries sees it.
pub async fn post_raw(
    client: &awc::Client,
    base: &str,
    key: &str,
    body: &str,
    limit: Duration,
) -> Result<Reply, String> {
    let exchange = async {
        let mut response = client
            .post(format!("{base}/v1/entries"))
            .insert_header(("Idempotency-Key", key))
            .insert_header(("Content-Type", "application/json"))
            .send_body(body.to_owned())
            .await
            .map_err(|e| format!("send: {e}"))?;
        let body = response
            .body()
            .limit(1 << 20)
            .await
            .map_err(|e| format!("body: {e}"))?;
        Ok(Reply {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: body.to_vec(),
        })
    };
    tokio::time::timeout(limit, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {limit:?}")))
}

/// The built binary on a fixed port, so that it can be SIGKILLed and started again where its
/// clients expect it (tests/common's `Daemon` picks a new port at every start).
pub struct RestartableDaemon {
    pub port: u16,
    pub address: String,
    env: Vec<(&'static str, String)>,
    child: Option<Child>,
    /// One log per run, kept when the test fails.
    pub logs: Vec<PathBuf>,
}

impl RestartableDaemon {
    pub async fn start(port: u16, env: Vec<(&'static str, String)>) -> Self {
        let mut daemon = Self {
            port,
            address: format!("http://127.0.0.1:{port}"),
            env,
            child: None,
            logs: Vec::new(),
        };
        daemon.spawn().await;
        daemon
    }

    async fn spawn(&mut self) {
        let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("faults-daemon-{}.log", Uuid::new_v4()));
        let mut command = serve_command(self.port, &log);
        for (name, value) in &self.env {
            command.env(name, value);
        }
        self.child = Some(command.spawn().expect("the daemon binary starts"));
        self.logs.push(log);
        self.wait_until_healthy().await;
    }

    async fn wait_until_healthy(&mut self) {
        let client = http_client(Duration::from_secs(2));
        for _ in 0..600 {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "the daemon exited with {status} before serving:\n{}",
                    self.log_tail(40)
                );
            }
            if let Ok(response) = client.get(format!("{}/healthz", self.address)).send().await {
                if response.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the daemon never became healthy:\n{}", self.log_tail(40));
    }

    /// SIGKILL: no shutdown protocol, no flush; the process is gone when this returns.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL the daemon");
            child.wait().expect("reap the daemon");
        }
    }

    /// Starts the binary again on the same port, database and exchange.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| child.try_wait().unwrap().is_none())
    }

    /// The last `lines` lines of every run's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let mut out = String::new();
        for (run, log) in self.logs.iter().enumerate() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            let start = all.len().saturating_sub(lines);
            out.push_str(&format!(
                "--- run {run} ({}) ---\n{}\n",
                log.display(),
                all[start..].join("\n")
            ));
        }
        out
    }
}

impl Drop for RestartableDaemon {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("daemon logs kept: {:?}", self.logs);
        } else {
            for log in &self.logs {
                let _ = std::fs::remove_file(log);
            }
        }
    }
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

    pub async fn release(self) {
        self.session.batch_execute("ROLLBACK").await.unwrap();
    }
}
