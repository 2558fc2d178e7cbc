//! The sections of the configuration, each key declared once ([`section!`]), and the small
//! types their keys take.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config::keys::{minutes, section, Bound, HOUR, TEN_YEARS};
use crate::config::redact_url;

fn localhost(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn secs(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

section! {
    /// `[http]`: the listeners.
    pub struct HttpSettings("http") {
        /// Address the HTTP server binds; port 0 picks a free port.
        listen: SocketAddr = localhost(8080), Bound::Any;
        /// Largest request body accepted; larger ones get 413.
        max_body_bytes: usize = 64 * 1024, Bound::Count(64, 64 << 20);
        /// How long the whole stop may take, from the signal: requests in flight, queued
        /// writes, the relays' batches, the tasks and the broker's close, in that order.
        shutdown_timeout: Duration = secs(30), Bound::Duration(HOUR);
        /// How long a client may take to send a request body; slower ones get 408.
        body_timeout: Duration = secs(30), Bound::Duration(HOUR);
        /// How long a client may take to send a request's head (request line and headers);
        /// slower ones get 408 and the connection is closed.
        head_timeout: Duration = secs(5), Bound::Duration(HOUR);
        /// HTTP worker threads; 0 is one per CPU core.
        workers: usize = 0, Bound::Count(0, 256);
        /// PEM certificate (and its chain) of the HTTPS listener; with `tls_key_file`, the
        /// listener speaks HTTPS only. Reloaded on SIGHUP.
        tls_cert_file: Option<PathBuf> = None, Bound::Any;
        /// PEM private key of `tls_cert_file`.
        tls_key_file: Option<PathBuf> = None, Bound::Any;
        /// When set, `/readyz`, `/metrics` and `/openapi.json` are served on this address (plain
        /// HTTP) and no longer on `listen`; `/healthz` is on both.
        operations_listen: Option<SocketAddr> = None, Bound::Any;
    }
}

impl HttpSettings {
    /// The certificate and key files, when the listener is HTTPS.
    pub fn tls_files(&self) -> Option<(&Path, &Path)> {
        Some((
            self.tls_cert_file.as_deref()?,
            self.tls_key_file.as_deref()?,
        ))
    }
}

section! {
    /// `[database]`: PostgreSQL.
    pub struct DatabaseSettings("database") {
        /// libpq-style URL; the database it names is created at start when missing.
        url: ConnectionString = ConnectionString::from("postgres://postgres@127.0.0.1:5432/retrysafe"), Bound::Any;
        /// Connections in the pool, shared by writers, relays and reads.
        pool_size: u32 = 16, Bound::Count(2, 1000);
        /// Writer actors; each commits one batch at a time.
        writers: usize = 6, Bound::Count(1, 64);
        /// Most writes one batch (one transaction) takes.
        max_batch: usize = 256, Bound::Count(1, 10_000);
        /// Bound on opening a connection and on waiting for a pooled one.
        connect_timeout: Duration = secs(2), Bound::Duration(minutes(5));
        /// How long `serve` (and `migrate`) wait at start for a database that is not there yet
        /// (unreachable, starting up, every connection slot taken), trying again with backoff,
        /// before they give up. Keep it below systemd's start timeout (the unit's
        /// `TimeoutStartSec`).
        start_timeout: Duration = secs(60), Bound::Duration(HOUR);
        /// Server-side bound on any one statement, including time spent waiting for locks.
        statement_timeout: Duration = secs(5), Bound::Duration(HOUR);
        /// Bound on the bytes held by writes queued or being committed; past it, 503 at once.
        /// At least one write of the largest body must fit (checked with `http.max_body_bytes`).
        max_pending_bytes: usize = 64 * 1024 * 1024, Bound::Count(64 + 1024, 16 << 30);
    }
}

section! {
    /// `[amqp]`: RabbitMQ.
    pub struct AmqpSettings("amqp") {
        /// One broker URL, or several (the nodes of a cluster), tried in turn.
        url: UrlList = UrlList::one("amqp://guest:guest@127.0.0.1:5672/%2f"), Bound::Any;
        /// Durable topic exchange the daemon declares and publishes to.
        exchange: String = "retrysafe.events".into(), Bound::Any;
        /// Bound on connecting to one broker and on opening a channel.
        connect_timeout: Duration = secs(10), Bound::Duration(minutes(10));
        /// PEM CA certificates that an `amqps://` broker's certificate must chain to; without
        /// it, the platform's roots.
        tls_ca_file: Option<PathBuf> = None, Bound::Any;
        /// PEM client certificate for brokers that authenticate with one (with
        /// `tls_key_file`).
        tls_cert_file: Option<PathBuf> = None, Bound::Any;
        /// PEM private key of `tls_cert_file`.
        tls_key_file: Option<PathBuf> = None, Bound::Any;
    }
}

impl AmqpSettings {
    /// Whether any broker of `amqp.url` is reached over TLS.
    pub fn uses_tls(&self) -> bool {
        self.url.iter().any(|url| url.starts_with("amqps://"))
    }
}

/// A PostgreSQL connection string (a URL, or libpq's `key=value` pairs). It may hold a
/// password: shown (`Display`, `Debug`) without it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ConnectionString(String);

impl ConnectionString {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The text itself (to build or change one), as a `String`; only `Display` and `Debug` hide the
/// password.
impl std::ops::Deref for ConnectionString {
    type Target = String;

    fn deref(&self) -> &String {
        &self.0
    }
}

impl std::ops::DerefMut for ConnectionString {
    fn deref_mut(&mut self) -> &mut String {
        &mut self.0
    }
}

impl From<&str> for ConnectionString {
    fn from(text: &str) -> Self {
        Self(text.to_owned())
    }
}

impl From<String> for ConnectionString {
    fn from(text: String) -> Self {
        Self(text)
    }
}

impl fmt::Display for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

impl fmt::Debug for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// One URL or several: a TOML string or array of strings; a string (as an environment variable
/// gives) may list several URLs separated by commas. Shown without passwords.
#[derive(Clone, PartialEq, Eq)]
pub struct UrlList(pub Vec<String>);

impl UrlList {
    pub fn one(url: &str) -> Self {
        Self(vec![url.to_owned()])
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    /// The URLs without their passwords, comma-separated, for logs.
    pub fn redacted(&self) -> String {
        self.iter().map(redact_url).collect::<Vec<_>>().join(",")
    }
}

impl fmt::Debug for UrlList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for UrlList {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for UrlList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        let urls = match OneOrMany::deserialize(deserializer)? {
            OneOrMany::One(text) => text.split(',').map(|url| url.trim().to_owned()).collect(),
            OneOrMany::Many(urls) => urls.into_iter().map(|url| url.trim().to_owned()).collect(),
        };
        Ok(Self(urls))
    }
}

section! {
    /// `[idempotency]`: keys, their records and the write path's in-memory state.
    pub struct IdempotencySettings("idempotency") {
        /// How long a completed key is remembered, on the database's clock; afterwards it is
        /// new again.
        retention: Duration = secs(24 * 3600), Bound::Duration(TEN_YEARS);
        /// How long a request waits for its answer, and a duplicate for the first request of
        /// its key before 409.
        wait_timeout: Duration = secs(10), Bound::Duration(minutes(10));
        /// Status for a key reused with another request: 409, or 422 as in the IETF draft.
        mismatch_status: u16 = 409, Bound::Count(409, 422);
        /// KeyShard actors.
        shards: usize = 8, Bound::Count(1, 1024);
        /// Completed responses kept in memory, across all shards.
        cache_entries: usize = 100_000, Bound::Count(0, 100_000_000);
    }
}

section! {
    /// `[outbox]`: relaying committed events to the broker, and keeping them.
    pub struct OutboxSettings("outbox") {
        /// Relay actors in this daemon.
        workers: usize = 2, Bound::Count(1, 64);
        /// Most events one relay batch claims, publishes and marks in one transaction.
        batch_size: usize = 1000, Bound::Count(1, 10_000);
        /// How often an idle relay looks for due events written by other processes.
        poll_interval: Duration = secs(1), Bound::Duration(HOUR);
        /// One deadline for a relay batch's publishes and their confirms.
        confirm_timeout: Duration = secs(10), Bound::Duration(minutes(10));
        /// Failed publishes after which an event is parked.
        max_attempts: i32 = 20, Bound::Count(1, 1000);
        /// How long sent events stay in the outbox before the janitor deletes them.
        retention: Duration = secs(7 * 24 * 3600), Bound::Duration(TEN_YEARS);
    }
}

section! {
    /// `[events]`: what a write emits besides `entry.created`.
    pub struct EventSettings("events") {
        /// Also emit `audit.entry.created` for every write.
        audit: bool = false, Bound::Any;
    }
}

/// The most any limit of a client may be, daemon-wide or its own (`auth.max_concurrent_writes`,
/// `auth.max_requests_per_second`); 0 is no limit.
pub const MAX_CLIENT_LIMIT: u32 = 1_000_000;

section! {
    /// `[auth]`: the clients and their limits.
    pub struct AuthSettings("auth") {
        /// The clients (`[[auth.clients]]`); none: every request is the anonymous client,
        /// allowed on a loopback address only.
        clients: Vec<ClientSettings> = Vec::new(), Bound::Any;
        /// The admins (`[[auth.admins]]`: `id` and `token_sha256`), who reach the admin API and
        /// the console on `admin.listen` and see every client's data; none: no admin listener.
        admins: Vec<AdminPrincipal> = Vec::new(), Bound::Any;
        /// Writes of one client in flight at once, at most (past it, 429 at once); 0 is no
        /// limit. The default for every client, the anonymous one included; a client may set
        /// its own.
        max_concurrent_writes: u32 = 128, Bound::Count(0, MAX_CLIENT_LIMIT as u64);
        /// Requests of one client per second, at most, on any `/v1/` route, with a burst of
        /// one second's worth (past it, 429 at once); 0 is no limit. The default for every
        /// client; a client may set its own.
        max_requests_per_second: f64 = 0.0, Bound::Any;
    }
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSettings {
    pub id: String,
    /// Hex SHA-256 of the client's bearer token; the token itself is never stored.
    pub token_sha256: String,
    /// This client's own `auth.max_concurrent_writes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_writes: Option<u32>,
    /// This client's own `auth.max_requests_per_second`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests_per_second: Option<f64>,
}

impl fmt::Debug for ClientSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientSettings")
            .field("id", &self.id)
            .field("max_concurrent_writes", &self.max_concurrent_writes)
            .field("max_requests_per_second", &self.max_requests_per_second)
            .finish_non_exhaustive()
    }
}

/// An admin (`[[auth.admins]]`): a principal of the admin listener, never of the API.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminPrincipal {
    pub id: String,
    /// Hex SHA-256 of the admin's bearer token (`retrysafe token new --admin NAME`).
    pub token_sha256: String,
}

impl fmt::Debug for AdminPrincipal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminPrincipal")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

section! {
    /// `[admin]`: the admin listener (the admin API and the console), started when
    /// `[[auth.admins]]` are configured.
    pub struct AdminSettings("admin") {
        /// Address of the admin listener; one that is not loopback needs `tls_cert_file` and
        /// `tls_key_file`.
        listen: SocketAddr = localhost(8081), Bound::Any;
        /// PEM certificate (and its chain) of the admin listener, which then speaks HTTPS only.
        tls_cert_file: Option<PathBuf> = None, Bound::Any;
        /// PEM private key of `tls_cert_file`.
        tls_key_file: Option<PathBuf> = None, Bound::Any;
        /// Host names (with or without a port) the admin listener answers besides loopback
        /// ones and its own address; any other `Host` gets 421 (DNS rebinding).
        hosts: Vec<String> = Vec::new(), Bound::Any;
        /// How long a console login lasts.
        session_timeout: Duration = secs(8 * 3600), Bound::Duration(minutes(7 * 24 * 60));
    }
}

impl AdminSettings {
    /// The certificate and key files, when the admin listener is HTTPS.
    pub fn tls_files(&self) -> Option<(&Path, &Path)> {
        Some((
            self.tls_cert_file.as_deref()?,
            self.tls_key_file.as_deref()?,
        ))
    }
}

section! {
    /// `[telemetry]`: spans over OTLP.
    pub struct TelemetrySettings("telemetry") {
        /// Base URL of an OpenTelemetry collector's OTLP/HTTP receiver
        /// (`http://127.0.0.1:4318`); spans go to its `/v1/traces`. Empty: the
        /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` variable, or no
        /// export when neither is set.
        otlp_endpoint: String = String::new(), Bound::Any;
        /// Share of new traces whose spans are exported, 0 to 1; a request with a caller's
        /// context follows the caller's sampled flag.
        sample_ratio: f64 = 1.0, Bound::Any;
    }
}

section! {
    /// `[log]`: what the daemon writes to stderr.
    pub struct LogSettings("log") {
        /// `text` for terminals, `json` for journald and collectors.
        format: LogFormat = LogFormat::Text, Bound::Any;
        /// A tracing filter: `info`, or `retrysafe=debug,info`.
        level: String = "info".into(), Bound::Any;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}
