//! The daemon under test, [`TestDaemon`]: in this test's process, on a thread of its own
//! ([`spawn_app`]), or the built binary as a child process that can be signalled, SIGKILLed
//! and restarted on the same port ([`spawn_binary`]); with the database and exchange it owns
//! and a direct connection for assertions. [`DaemonProcess`] is the child process alone, for
//! daemons on servers of a test's own (tests/tls, tests/ha).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use retrysafe::config::Settings;
use retrysafe::startup::{Application, Options};
use serde_json::Value;

use crate::common::cli;
use crate::common::helpers::{
    connect_to, count, eventually, http_client, metric_sample, test_settings, TestDatabase,
    TestExchange, TestResponse,
};

/// Bound on one request of [`TestDaemon::send`].
const REQUEST_LIMIT: Duration = Duration::from_secs(60);

/// A daemon under test, the database it owns, and a direct connection for assertions.
pub struct TestDaemon {
    /// The child process of a daemon run from the binary; None in-process. Dropped first: the
    /// daemon goes before its database.
    process: Option<DaemonProcess>,
    /// The daemon run in this process; None for a binary. Dropped as early, for the same reason.
    in_process: Option<InProcess>,
    pub address: String,
    /// `http://127.0.0.1:<port>` of `http.operations_listen`, for an in-process daemon that sets
    /// it.
    pub operations_address: Option<String>,
    /// `http://127.0.0.1:<port>` of `admin.listen`, for an in-process daemon with admins.
    pub admin_address: Option<String>,
    pub settings: Settings,
    pub db: tokio_postgres::Client,
    pub http: awc::Client,
    /// Drops the database when the last daemon using it is gone.
    pub database: Arc<TestDatabase>,
    /// Deletes the exchange when the last daemon using it is gone.
    pub exchange: Arc<TestExchange>,
}

pub async fn spawn_app() -> TestDaemon {
    spawn_app_with(|_| {}).await
}

/// An in-process daemon on [`test_settings`] changed by `configure`.
pub async fn spawn_app_with(configure: impl FnOnce(&mut Settings)) -> TestDaemon {
    spawn_in_process(configure, Options::default()).await
}

/// [`spawn_app_with`] without outbox relays and janitor: events stay in the outbox until the
/// test publishes them with [`TestDaemon::relay_until_empty`], so that it need not wait for a
/// relay's poll, and only the test's own janitor passes delete.
pub async fn spawn_app_without_relays(configure: impl FnOnce(&mut Settings)) -> TestDaemon {
    spawn_in_process(
        configure,
        Options {
            relays: false,
            // The console's charts get their points within a test's patience.
            history_interval: Duration::from_millis(500),
        },
    )
    .await
}

async fn spawn_in_process(configure: impl FnOnce(&mut Settings), options: Options) -> TestDaemon {
    let mut settings = test_settings();
    configure(&mut settings);
    let database = Arc::new(TestDatabase::new(&settings));
    let exchange = Arc::new(TestExchange::new(&settings));
    start_in_process(settings, database, exchange, options).await
}

/// A second in-process daemon (with relays) on the same database (as two machines behind one
/// load balancer).
pub async fn spawn_second_app(first: &TestDaemon) -> TestDaemon {
    spawn_second_app_with(first, |_| {}).await
}

/// [`spawn_second_app`], its settings (a copy of the first's) changed by `configure`.
pub async fn spawn_second_app_with(
    first: &TestDaemon,
    configure: impl FnOnce(&mut Settings),
) -> TestDaemon {
    let mut settings = first.settings.clone();
    settings.http.listen = "127.0.0.1:0".parse().unwrap();
    configure(&mut settings);
    start_in_process(
        settings,
        first.database.clone(),
        first.exchange.clone(),
        Options::default(),
    )
    .await
}

async fn start_in_process(
    settings: Settings,
    database: Arc<TestDatabase>,
    exchange: Arc<TestExchange>,
    options: Options,
) -> TestDaemon {
    init_logging();
    let in_process = InProcess::start(settings.clone(), options).await;
    TestDaemon {
        process: None,
        address: format!("http://127.0.0.1:{}", in_process.port),
        operations_address: in_process
            .operations_port
            .map(|port| format!("http://127.0.0.1:{port}")),
        admin_address: in_process
            .admin_port
            .map(|port| format!("http://127.0.0.1:{port}")),
        in_process: Some(in_process),
        settings,
        db: connect_to(&database.url).await,
        http: http_client(REQUEST_LIMIT),
        database,
        exchange,
    }
}

/// An in-process daemon on the database at `url` (a server of the test's own, such as a Citus
/// lab, which the test tears down), with [`test_settings`] changed by `configure`; `relays:
/// false` as [`spawn_app_without_relays`].
pub async fn spawn_app_on(
    url: &str,
    relays: bool,
    configure: impl FnOnce(&mut Settings),
) -> TestDaemon {
    let mut settings = test_settings();
    settings.database.url = url.into();
    configure(&mut settings);
    let database = Arc::new(TestDatabase::external(url));
    let exchange = Arc::new(TestExchange::new(&settings));
    start_in_process(
        settings,
        database,
        exchange,
        Options {
            relays,
            ..Options::default()
        },
    )
    .await
}

/// A daemon run in this process, in an actix system on a thread of its own. Dropping it stops
/// the daemon and waits for its shutdown (bounded by `http.shutdown_timeout` at each step), so
/// that nothing of it outlives the test: run in the test's own runtime, its relays lived on
/// after the test had deleted the exchange, and re-declared it on their next reconnect.
struct InProcess {
    port: u16,
    operations_port: Option<u16>,
    admin_port: Option<u16>,
    server: actix_web::dev::ServerHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InProcess {
    async fn start(settings: Settings, options: Options) -> Self {
        let (started, answer) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("in-process daemon".into())
            .spawn(move || {
                actix_web::rt::System::new().block_on(async move {
                    let config = settings.validated().expect("the test's settings are valid");
                    match Application::build_with(config, options).await {
                        Ok(application) => {
                            let handle = (
                                application.port(),
                                application.operations_port(),
                                application.admin_port(),
                                application.server_handle(),
                            );
                            let _ = started.send(Ok(handle));
                            let _ = application.run_until_stopped().await;
                        }
                        Err(error) => {
                            let _ = started.send(Err(error));
                        }
                    }
                })
            })
            .expect("a thread for the daemon");
        let (port, operations_port, admin_port, server) = answer
            .await
            .expect("the daemon's thread answers")
            .expect("the app starts");
        Self {
            port,
            operations_port,
            admin_port,
            server,
            thread: Some(thread),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        // Not graceful: a request the test left in flight is not waited for. The command is
        // sent at once; the daemon's own thread then runs its shutdown.
        drop(self.server.stop(false));
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() && !std::thread::panicking() {
                panic!("the in-process daemon's thread panicked");
            }
        }
    }
}

/// The built binary (`retrysafe serve` with the repository's config.toml) on `settings`'
/// database and exchange, which it is given with `env` on top; nothing else of `settings`
/// reaches it.
pub async fn spawn_binary(settings: Settings, env: &[(&str, String)]) -> TestDaemon {
    let database = Arc::new(TestDatabase::new(&settings));
    let exchange = Arc::new(TestExchange::new(&settings));
    let port = free_port();
    let env = binary_env(settings.database.url.as_str(), &settings.amqp.exchange, env);
    let process = DaemonProcess::launch(port, "http", None, &env, move |log| {
        serve_command(port, log)
    })
    .await;
    binary_daemon(settings, database, exchange, process).await
}

/// [`spawn_binary`] with a command of the test's own (a configuration file of its own, say)
/// that makes the daemon listen on `port` and use `settings`' database and exchange.
pub async fn spawn_binary_as(
    settings: Settings,
    port: u16,
    command: impl Fn(&Path) -> Command + 'static,
) -> TestDaemon {
    let database = Arc::new(TestDatabase::new(&settings));
    let exchange = Arc::new(TestExchange::new(&settings));
    let process = DaemonProcess::launch(port, "http", None, &[], command).await;
    binary_daemon(settings, database, exchange, process).await
}

async fn binary_daemon(
    settings: Settings,
    database: Arc<TestDatabase>,
    exchange: Arc<TestExchange>,
    process: DaemonProcess,
) -> TestDaemon {
    TestDaemon {
        address: process.address.clone(),
        operations_address: None,
        admin_address: None,
        process: Some(process),
        in_process: None,
        settings,
        db: connect_to(&database.url).await,
        http: http_client(REQUEST_LIMIT),
        database,
        exchange,
    }
}

/// The environment that points the binary, the daemon or one of its commands, at the database
/// of `database_url` and the exchange `exchange`, with `env` on top.
pub fn binary_env(
    database_url: &str,
    exchange: &str,
    env: &[(&str, String)],
) -> Vec<(String, String)> {
    [
        ("RETRYSAFE_DATABASE__URL", database_url.to_owned()),
        ("RETRYSAFE_AMQP__EXCHANGE", exchange.to_owned()),
    ]
    .iter()
    .chain(env)
    .map(|(name, value)| (name.to_string(), value.clone()))
    .collect()
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

impl TestDaemon {
    pub async fn send(
        &self,
        request: awc::ClientRequest,
        body: impl Into<Vec<u8>>,
    ) -> TestResponse {
        let response = request
            .send_body(body.into())
            .await
            .expect("the request is answered");
        TestResponse::read(response)
            .await
            .expect("the body is read")
    }

    /// `POST /v1/entries` with a key and a JSON body.
    pub async fn post_entry(&self, key: &str, body: &Value) -> TestResponse {
        self.post_entry_as(None, key, body).await
    }

    pub async fn post_entry_owned(&self, key: String, body: Value) -> TestResponse {
        self.post_entry(&key, &body).await
    }

    /// `POST /v1/entries` with a key, a JSON body and (optionally) a bearer token.
    pub async fn post_entry_as(
        &self,
        token: Option<&str>,
        key: &str,
        body: &Value,
    ) -> TestResponse {
        let mut request = self.post_request(key);
        if let Some(token) = token {
            request = request.insert_header(("Authorization", format!("Bearer {token}")));
        }
        self.send(request, body.to_string()).await
    }

    /// `POST /v1/entries` with a key and `text` as the body, sent as it is.
    pub async fn post_text(&self, key: &str, text: &str) -> TestResponse {
        self.send(self.post_request(key), text.to_owned()).await
    }

    /// A `POST /v1/entries` with a key and `Content-Type: application/json`, to send with
    /// [`send`](Self::send) (headers may be added or replaced).
    pub fn post_request(&self, key: &str) -> awc::ClientRequest {
        self.http
            .post(format!("{}/v1/entries", self.address))
            .insert_header(("Idempotency-Key", key))
            .insert_header(("Content-Type", "application/json"))
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
        eventually(Duration::from_secs(30), || async {
            let ready = self.get("/readyz", None).await;
            if wanted(&ready) {
                Ok(ready)
            } else {
                Err(format!("/readyz: {}", ready.describe()))
            }
        })
        .await
    }

    /// One sample of `/metrics` (see [`metric_sample`]); panics if it is absent.
    pub async fn metric(&self, name_and_labels: &str) -> f64 {
        let metrics = self.get("/metrics", None).await.text();
        metric_sample(&metrics, name_and_labels)
            .unwrap_or_else(|| panic!("{name_and_labels} is not in /metrics"))
    }

    /// The binary's command `args` (`outbox status`, `purge`, ...) on this daemon's database and
    /// exchange ([`cli::command`]), not yet run: to add to its environment, or to spawn.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = cli::command(args);
        command.envs(binary_env(
            self.settings.database.url.as_str(),
            &self.settings.amqp.exchange,
            &[],
        ));
        command
    }

    /// [`command`](Self::command), run to its end.
    pub fn retrysafe(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("the binary runs")
    }

    /// The daemon's settings, validated: what the library's functions take.
    pub fn config(&self) -> retrysafe::config::Config {
        self.settings
            .validated()
            .expect("the daemon started with these settings")
    }

    pub async fn count(&self, sql: &str) -> i64 {
        count(&self.db, sql).await
    }

    /// Rows in the three tables a write touches.
    pub async fn row_counts(&self) -> (i64, i64, i64) {
        (
            self.count("SELECT count(*) FROM idempotency_records").await,
            self.count("SELECT count(*) FROM entries").await,
            self.count("SELECT count(*) FROM outbox_events").await,
        )
    }

    /// Publishes every due event of the outbox, as a relay would, until none is due; returns
    /// how many the broker confirmed (and are now marked sent). For a daemon without relays
    /// ([`spawn_app_without_relays`]): no poll to wait for. A pass that fails (the database or
    /// the broker out of reach for a moment) is run again, as a relay would at its next poll,
    /// for up to a minute.
    pub async fn relay_until_empty(&self) -> usize {
        eventually(Duration::from_secs(60), || async {
            retrysafe::outbox::relay_until_empty(&self.config())
                .await
                .map_err(|error| format!("relaying the outbox: {error}"))
        })
        .await
    }

    fn process(&self) -> &DaemonProcess {
        self.process
            .as_ref()
            .expect("an in-process daemon has no process: use spawn_binary")
    }

    fn process_mut(&mut self) -> &mut DaemonProcess {
        self.process
            .as_mut()
            .expect("an in-process daemon has no process: use spawn_binary")
    }

    /// SIGKILL: no shutdown protocol, no flush; the process is gone when this returns.
    pub fn kill(&mut self) {
        self.process_mut().kill();
    }

    /// The process id of a daemon run from the binary.
    pub fn pid(&self) -> u32 {
        self.process()
            .child
            .as_ref()
            .expect("the daemon is running")
            .id()
    }

    /// Starts the binary again (after a SIGKILL if it still runs) on the same port, database
    /// and exchange.
    pub async fn restart(&mut self) {
        self.process_mut().restart().await;
        // A client keeps idle connections: one to the process that is gone would fail the
        // next request.
        self.http = http_client(REQUEST_LIMIT);
    }

    /// [`restart`](Self::restart) with `env` instead of the environment it was started with
    /// (the database and exchange stay).
    pub async fn restart_with(&mut self, env: &[(&str, String)]) {
        let env = binary_env(
            self.settings.database.url.as_str(),
            &self.settings.amqp.exchange,
            env,
        );
        self.process_mut().env = env;
        self.restart().await;
    }

    /// Sends `signal` (`TERM`, `HUP`, ...) to the process.
    pub fn signal(&self, signal: &str) {
        self.process().signal(signal);
    }

    pub async fn wait_for_exit(&mut self) -> ExitStatus {
        self.process_mut().wait_for_exit().await
    }

    pub fn is_running(&mut self) -> bool {
        self.process_mut().is_running()
    }

    /// The log of the process's current run.
    pub fn log_text(&self) -> String {
        self.process().log_text()
    }

    /// The last `lines` lines of every run's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process().log_tail(lines)
    }
}

/// A free port on 127.0.0.1 (free when asked; the daemon binds it right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Sends a command's standard output and error to `log`, and gives it no standard input.
pub fn log_to(command: &mut Command, log: &Path) {
    let log_file = std::fs::File::create(log).unwrap();
    command
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file);
}

/// The daemon binary the tests run: this build's, or the one `RETRYSAFE_TEST_DAEMON` names (to
/// measure another build, an older one say, under the same test: docs/reliability.md), with
/// the repository's config.toml or the file `RETRYSAFE_TEST_CONFIG` names (an older build may
/// not know every key of this one's).
pub fn daemon_binary() -> (PathBuf, PathBuf) {
    let binary = std::env::var_os("RETRYSAFE_TEST_DAEMON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_retrysafe")));
    let config = std::env::var_os("RETRYSAFE_TEST_CONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml")));
    (binary, config)
}

/// `retrysafe serve` with the repository's config.toml, listening on `port`, polling the outbox
/// every 100 ms, logging to `log`; the caller adds its own environment.
pub fn serve_command(port: u16, log: &Path) -> Command {
    let (binary, config) = daemon_binary();
    let mut command = Command::new(binary);
    command
        .arg("serve")
        .arg("--config")
        .arg(config)
        .env("RETRYSAFE_HTTP__LISTEN", format!("127.0.0.1:{port}"))
        .env("RETRYSAFE_OUTBOX__POLL_INTERVAL", "100ms")
        .env("RETRYSAFE_LOG__LEVEL", "info")
        .env_remove("FAILPOINTS");
    log_to(&mut command, log);
    command
}

/// The built binary as a child process on a fixed port, so that it can be SIGKILLed and started
/// again where its clients expect it. Killed when dropped; its logs are kept if the test fails.
pub struct DaemonProcess {
    pub port: u16,
    pub address: String,
    /// Added to the command's environment at every start.
    pub env: Vec<(String, String)>,
    /// The command of a run, given the run's log.
    command: Box<dyn Fn(&Path) -> Command>,
    /// Asks `/healthz` (a fresh client at each run when None).
    health: Option<awc::Client>,
    child: Option<Child>,
    /// One log per run.
    pub logs: Vec<PathBuf>,
}

impl DaemonProcess {
    /// [`serve_command`] on the database of `database_url` and the exchange `exchange`
    /// ([`binary_env`]) with `env` on top, on a free port, once it answers `/healthz`.
    pub async fn start(database_url: &str, exchange: &str, env: &[(&str, String)]) -> Self {
        let env = binary_env(database_url, exchange, env);
        Self::serve(&env, "http", None).await
    }

    /// [`start`](Self::start) for a listener of `scheme` (`https` when `env` sets
    /// `http.tls_cert_file`), asking `/healthz` with `client` (one that trusts the certificate).
    pub async fn start_with(
        database_url: &str,
        exchange: &str,
        env: &[(&str, String)],
        scheme: &str,
        client: awc::Client,
    ) -> Self {
        let env = binary_env(database_url, exchange, env);
        Self::serve(&env, scheme, Some(client)).await
    }

    async fn serve(env: &[(String, String)], scheme: &str, health: Option<awc::Client>) -> Self {
        let port = free_port();
        Self::launch(port, scheme, health, env, move |log| {
            serve_command(port, log)
        })
        .await
    }

    /// Runs `command` (which must make the daemon listen on `port` and log to the path it is
    /// given) with `env` added, and waits until it answers `/healthz`.
    pub async fn launch(
        port: u16,
        scheme: &str,
        health: Option<awc::Client>,
        env: &[(String, String)],
        command: impl Fn(&Path) -> Command + 'static,
    ) -> Self {
        let mut process = Self {
            port,
            address: format!("{scheme}://127.0.0.1:{port}"),
            env: env.to_vec(),
            command: Box::new(command),
            health,
            child: None,
            logs: Vec::new(),
        };
        process.spawn().await;
        process
    }

    async fn spawn(&mut self) {
        let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("daemon-{}.log", uuid::Uuid::new_v4()));
        let mut command = (self.command)(&log);
        command.envs(self.env.iter().map(|(name, value)| (name, value)));
        self.child = Some(command.spawn().expect("the daemon binary starts"));
        self.logs.push(log);
        self.wait_until_healthy().await;
    }

    async fn wait_until_healthy(&mut self) {
        let client = self
            .health
            .clone()
            .unwrap_or_else(|| http_client(Duration::from_secs(2)));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::time::Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "the daemon exited with {status} before serving: {}",
                    self.log_text()
                );
            }
            if let Ok(response) = client.get(format!("{}/healthz", self.address)).send().await {
                if response.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the daemon never became healthy: {}", self.log_text());
    }

    /// SIGKILL (unless it has exited): no shutdown protocol, no flush; the process is gone
    /// when this returns.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if child.try_wait().unwrap().is_none() {
                child.kill().expect("SIGKILL the daemon");
            }
            child.wait().expect("reap the daemon");
        }
    }

    /// Starts the binary again on the same port (after a SIGKILL if it still runs).
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| child.try_wait().unwrap().is_none())
    }

    /// Waits up to a minute for the process to exit.
    pub async fn wait_for_exit(&mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("the daemon was started");
        for _ in 0..600 {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the daemon did not exit: {}", self.log_text());
    }

    pub fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("the daemon was started");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// The log of the current (last) run.
    pub fn log_text(&self) -> String {
        self.logs
            .last()
            .map(|log| std::fs::read_to_string(log).unwrap_or_default())
            .unwrap_or_default()
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

impl Drop for DaemonProcess {
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
