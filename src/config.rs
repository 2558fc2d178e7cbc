//! Layered configuration: built-in defaults, then `config.toml`, then `RETRYSAFE_<SECTION>__<KEY>`
//! environment variables. Unknown keys and invalid values are errors that name the key.
//!
//! Every key is declared once ([`keys::section!`]): its type, default, bounds and doc line.
//! [`Settings::load`] reads and checks them, and [`Settings::validated`] turns them into the
//! [`Config`] the rest of the program takes, with the two URLs parsed once.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

mod database_url;
pub mod keys;
mod redact;
mod validated;
mod warnings;

pub use database_url::{DatabaseHost, DatabaseUrl, HostName, PgTls, RootCertificates, SslMode};
use keys::{minutes, section, Bound, Key, HOUR, TEN_YEARS};
pub use redact::{redact_url, UNPARSABLE};
pub use validated::{AmqpConfig, BrokerEndpoint, Config, DatabaseConfig};
pub use warnings::{warnings, ConfigWarning};

/// Prefix of the environment variables that override configuration keys.
pub const ENV_PREFIX: &str = "RETRYSAFE_";

/// The client every request belongs to when no `[[auth.clients]]` are configured.
pub const ANONYMOUS_CLIENT: &str = "anonymous";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration file {path} does not exist")]
    MissingFile { path: String },
    #[error("invalid configuration: {0}")]
    Parse(String),
    #[error("invalid configuration: {key}: {message}")]
    Invalid { key: &'static str, message: String },
}

fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        message: message.into(),
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub http: HttpSettings,
    pub database: DatabaseSettings,
    pub amqp: AmqpSettings,
    pub idempotency: IdempotencySettings,
    pub outbox: OutboxSettings,
    pub events: EventSettings,
    pub auth: AuthSettings,
    pub admin: AdminSettings,
    pub log: LogSettings,
    pub telemetry: TelemetrySettings,
}

impl Settings {
    /// Every key of every section, as declared.
    pub fn keys() -> impl Iterator<Item = &'static Key> {
        [
            HttpSettings::KEYS,
            DatabaseSettings::KEYS,
            AmqpSettings::KEYS,
            IdempotencySettings::KEYS,
            OutboxSettings::KEYS,
            EventSettings::KEYS,
            AuthSettings::KEYS,
            AdminSettings::KEYS,
            LogSettings::KEYS,
            TelemetrySettings::KEYS,
        ]
        .into_iter()
        .flatten()
    }

    fn check_bounds(&self) -> Result<(), ConfigError> {
        self.http.check_bounds()?;
        self.database.check_bounds()?;
        self.amqp.check_bounds()?;
        self.idempotency.check_bounds()?;
        self.outbox.check_bounds()?;
        self.events.check_bounds()?;
        self.auth.check_bounds()?;
        self.admin.check_bounds()?;
        self.log.check_bounds()?;
        self.telemetry.check_bounds()
    }
}

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
        max_concurrent_writes: u32 = 128, Bound::Count(0, 1_000_000);
        /// Requests of one client per second, at most, on any `/v1/` route, with a burst of
        /// one second's worth (past it, 429 at once); 0 is no limit. The default for every
        /// client; a client may set its own.
        max_requests_per_second: f64 = 0.0, Bound::Any;
    }
}

/// A client's limits; 0 is none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub max_concurrent_writes: u32,
    pub max_requests_per_second: f64,
}

impl AuthSettings {
    /// The limits of `client` (None: the anonymous client): its own where it sets them, else
    /// the daemon-wide defaults.
    pub fn limits_of(&self, client: Option<&ClientSettings>) -> Limits {
        Limits {
            max_concurrent_writes: client
                .and_then(|client| client.max_concurrent_writes)
                .unwrap_or(self.max_concurrent_writes),
            max_requests_per_second: client
                .and_then(|client| client.max_requests_per_second)
                .unwrap_or(self.max_requests_per_second),
        }
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

impl Settings {
    /// Loads defaults, then the file at `path` (which must exist), then the environment; the
    /// keys as given, not yet validated ([`validated`](Self::validated)).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        if !path.exists() {
            return Err(ConfigError::MissingFile {
                path: path.display().to_string(),
            });
        }
        Self::from_figment(
            Figment::from(Serialized::defaults(Settings::default()))
                .merge(Toml::file_exact(path))
                .merge(environment()),
        )
    }

    /// Defaults and environment only: what tests and embedders start from.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_figment(
            Figment::from(Serialized::defaults(Settings::default())).merge(environment()),
        )
    }

    fn from_figment(figment: Figment) -> Result<Self, ConfigError> {
        figment
            .extract()
            .map_err(|error| ConfigError::Parse(describe_figment_error(error)))
    }

    /// Checks every key ([`validated`](Self::validated)), keeping nothing of what it parsed.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validated().map(drop)
    }

    /// Checks what the types alone do not (bounds, keys that go together, an open listener's
    /// credentials) and parses the two URLs, once: the [`Config`] the daemon runs with.
    pub fn validated(&self) -> Result<Config, ConfigError> {
        self.check_bounds()?;
        // At least one write of the largest body must fit among the pending ones.
        let smallest_pending = self.http.max_body_bytes as u64 + 1024;
        if (self.database.max_pending_bytes as u64) < smallest_pending {
            return Err(invalid(
                "database.max_pending_bytes",
                format!(
                    "must be at least http.max_body_bytes + 1024 ({smallest_pending}), so that a write of the largest body fits"
                ),
            ));
        }
        if !matches!(self.idempotency.mismatch_status, 409 | 422) {
            return Err(invalid("idempotency.mismatch_status", "must be 409 or 422"));
        }
        let ratio = self.telemetry.sample_ratio;
        if !ratio.is_finite() || !(0.0..=1.0).contains(&ratio) {
            return Err(invalid(
                "telemetry.sample_ratio",
                "must be between 0 (no new trace exported) and 1 (every one)",
            ));
        }
        if !self.telemetry.otlp_endpoint.is_empty() {
            crate::otlp::traces_url(&self.telemetry.otlp_endpoint)
                .map_err(|error| invalid("telemetry.otlp_endpoint", error))?;
        }
        both_or_neither(
            ("http.tls_cert_file", &self.http.tls_cert_file),
            ("http.tls_key_file", &self.http.tls_key_file),
        )?;
        if let Some(operations) = self.http.operations_listen {
            if operations == self.http.listen && operations.port() != 0 {
                return Err(invalid(
                    "http.operations_listen",
                    format!("{operations} is http.listen itself; give the operations routes an address of their own, or leave the key out to serve them on http.listen"),
                ));
            }
        }
        both_or_neither(
            ("admin.tls_cert_file", &self.admin.tls_cert_file),
            ("admin.tls_key_file", &self.admin.tls_key_file),
        )?;
        self.validate_admins()?;
        both_or_neither(
            ("amqp.tls_cert_file", &self.amqp.tls_cert_file),
            ("amqp.tls_key_file", &self.amqp.tls_key_file),
        )?;
        if self.amqp.exchange.is_empty() || self.amqp.exchange.len() > 255 {
            return Err(invalid("amqp.exchange", "must be 1 to 255 characters"));
        }
        tracing_subscriber::EnvFilter::try_new(&self.log.level)
            .map_err(|error| invalid("log.level", error.to_string()))?;
        self.validate_clients()?;
        Config::from_settings(self)
    }

    fn validate_clients(&self) -> Result<(), ConfigError> {
        let check_limits =
            |key_prefix: &str, writes: Option<u32>, rate: Option<f64>| -> Result<(), ConfigError> {
                if writes.is_some_and(|writes| writes > 1_000_000) {
                    return Err(invalid(
                        "auth.max_concurrent_writes",
                        format!("{key_prefix}must be between 0 (no limit) and 1000000"),
                    ));
                }
                if rate.is_some_and(|rate| !rate.is_finite() || !(0.0..=1e6).contains(&rate)) {
                    return Err(invalid(
                        "auth.max_requests_per_second",
                        format!("{key_prefix}must be between 0 (no limit) and 1000000"),
                    ));
                }
                Ok(())
            };
        check_limits(
            "",
            Some(self.auth.max_concurrent_writes),
            Some(self.auth.max_requests_per_second),
        )?;
        let mut seen = std::collections::HashSet::new();
        for client in &self.auth.clients {
            check_limits(
                &format!("client {:?}: ", client.id),
                client.max_concurrent_writes,
                client.max_requests_per_second,
            )?;
            if !is_valid_client_id(&client.id) {
                return Err(invalid(
                    "auth.clients.id",
                    format!("{:?} must be 1 to 64 of a-z A-Z 0-9 . _ -", client.id),
                ));
            }
            if !seen.insert(client.id.as_str()) {
                return Err(invalid(
                    "auth.clients.id",
                    format!("{:?} is configured twice", client.id),
                ));
            }
            if !is_sha256_hex(&client.token_sha256) {
                return Err(invalid(
                    "auth.clients.token_sha256",
                    format!(
                        "client {:?}: must be 64 hex digits (SHA-256 of the token)",
                        client.id
                    ),
                ));
            }
        }
        if self.auth.clients.is_empty() && !self.http.listen.ip().is_loopback() {
            return Err(invalid(
                "auth.clients",
                format!(
                    "no clients are configured, which is allowed only on a loopback address, but http.listen is {}",
                    self.http.listen
                ),
            ));
        }
        Ok(())
    }
}

impl Settings {
    /// The admins' ids and digests, and where the admin listener may listen.
    fn validate_admins(&self) -> Result<(), ConfigError> {
        let mut seen = std::collections::HashSet::new();
        for admin in &self.auth.admins {
            if !is_valid_client_id(&admin.id) {
                return Err(invalid(
                    "auth.admins.id",
                    format!("{:?} must be 1 to 64 of a-z A-Z 0-9 . _ -", admin.id),
                ));
            }
            if !seen.insert(admin.id.as_str()) {
                return Err(invalid(
                    "auth.admins.id",
                    format!("{:?} is configured twice", admin.id),
                ));
            }
            if !is_sha256_hex(&admin.token_sha256) {
                return Err(invalid(
                    "auth.admins.token_sha256",
                    format!(
                        "admin {:?}: must be 64 hex digits (SHA-256 of the token)",
                        admin.id
                    ),
                ));
            }
            let digest = admin.token_sha256.to_ascii_lowercase();
            if self
                .auth
                .clients
                .iter()
                .any(|client| client.token_sha256.to_ascii_lowercase() == digest)
            {
                return Err(invalid(
                    "auth.admins.token_sha256",
                    format!("admin {:?}: a client has the same token; give the admin a token of its own (retrysafe token new --admin NAME)", admin.id),
                ));
            }
        }
        let admin = &self.admin;
        if !admin.listen.ip().is_loopback() && admin.tls_files().is_none() {
            return Err(invalid(
                "admin.listen",
                format!("{} is not a loopback address, so admin tokens and session cookies would travel in clear; set admin.tls_cert_file and admin.tls_key_file, or listen on loopback and reach it through an SSH tunnel", admin.listen),
            ));
        }
        if !self.auth.admins.is_empty() {
            let taken = [Some(self.http.listen), self.http.operations_listen];
            if admin.listen.port() != 0 && taken.contains(&Some(admin.listen)) {
                return Err(invalid(
                    "admin.listen",
                    format!("{} is already http.listen or http.operations_listen; give the admin listener an address of its own", admin.listen),
                ));
            }
        }
        for host in &admin.hosts {
            if host.is_empty() || host.len() > 255 || !host.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(invalid(
                    "admin.hosts",
                    format!("{host:?} is not a host name (1 to 255 visible ASCII characters)"),
                ));
            }
        }
        Ok(())
    }
}

fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

pub fn is_valid_client_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A certificate and its key are given together: the error names the one missing.
fn both_or_neither(
    (certificate_key, certificate): (&'static str, &Option<PathBuf>),
    (key_key, key): (&'static str, &Option<PathBuf>),
) -> Result<(), ConfigError> {
    match (certificate, key) {
        (Some(_), None) => Err(invalid(
            key_key,
            format!("must be set when {certificate_key} is (the certificate's private key)"),
        )),
        (None, Some(_)) => Err(invalid(
            certificate_key,
            format!("must be set when {key_key} is (the key's certificate)"),
        )),
        _ => Ok(()),
    }
}

/// `RETRYSAFE_*` variables that are not configuration keys, other than `RETRYSAFE_CONFIG`:
/// without the `__` between section and key (`RETRYSAFE_HTTP_LISTEN`), or with an empty or
/// extra part (`RETRYSAFE_HTTP____LISTEN`, `RETRYSAFE_HTTP__LISTEN__`, `RETRYSAFE___LISTEN`).
/// Most likely mistyped keys: they are ignored, and the daemon warns about each.
pub fn stray_environment() -> Vec<String> {
    let mut names: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| {
            name.starts_with(ENV_PREFIX)
                && !OTHER_VARIABLES.contains(&name.as_str())
                && !is_key_variable(name)
        })
        .collect();
    names.sort();
    names
}

/// `RETRYSAFE_*` variables that are not configuration keys and mean something: the
/// configuration file's path, and what `retrysafe send` reads.
const OTHER_VARIABLES: [&str; 4] = [
    "RETRYSAFE_CONFIG",
    "RETRYSAFE_URL",
    "RETRYSAFE_TOKEN",
    "RETRYSAFE_CA_FILE",
];

/// `RETRYSAFE_<SECTION>__<KEY>`, both parts present. Other `RETRYSAFE_*` variables (such as
/// `RETRYSAFE_CONFIG`, or `RETRYSAFE_URL` for `retrysafe send`) are not mistaken for keys.
fn is_key_variable(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
        return false;
    };
    let parts: Vec<&str> = rest.split("__").collect();
    parts.len() == 2 && parts.iter().all(|part| !part.is_empty())
}

fn environment() -> Env {
    Env::prefixed(ENV_PREFIX)
        .filter(|key| is_key_variable(&format!("{ENV_PREFIX}{}", key.as_str())))
        .split("__")
}

fn describe_figment_error(error: figment::Error) -> String {
    error
        .into_iter()
        .map(|error| {
            let key = error.path.join(".");
            let source = error
                .metadata
                .as_ref()
                .map(
                    |metadata| match &error.metadata.as_ref().and_then(|m| m.source.as_ref()) {
                        Some(source) => format!(" (from {} {source})", metadata.name),
                        None => format!(" (from {})", metadata.name),
                    },
                )
                .unwrap_or_default();
            if key.is_empty() {
                format!("{}{source}", error.kind)
            } else {
                format!("{key}: {}{source}", error.kind)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `load` reads, validated.
    fn checked(figment: Figment) -> Result<Config, ConfigError> {
        Settings::from_figment(figment)?.validated()
    }

    #[test]
    fn only_well_formed_variables_are_keys() {
        for name in [
            "RETRYSAFE_HTTP__LISTEN",
            "RETRYSAFE_DATABASE__MAX_PENDING_BYTES",
        ] {
            assert!(is_key_variable(name), "{name}");
        }
        for name in [
            "RETRYSAFE_HTTP_LISTEN",
            "RETRYSAFE_HTTP____LISTEN",
            "RETRYSAFE_HTTP__LISTEN__",
            "RETRYSAFE___LISTEN",
            "RETRYSAFE_HTTP__LISTEN__X",
            "RETRYSAFE_CONFIG",
        ] {
            assert!(!is_key_variable(name), "{name}");
        }
    }

    #[test]
    fn durations_and_counts_have_upper_bounds() {
        let mut settings = Settings::default();
        settings.database.statement_timeout = std::time::Duration::from_secs(30 * 24 * 3600);
        let error = settings.validate().unwrap_err().to_string();
        assert!(error.contains("database.statement_timeout"), "{error}");
        let mut settings = Settings::default();
        settings.idempotency.shards = 100_000_000;
        let error = settings.validate().unwrap_err().to_string();
        assert!(error.contains("idempotency.shards"), "{error}");
        let mut settings = Settings::default();
        settings.database.max_pending_bytes = 1000;
        let error = settings.validate().unwrap_err().to_string();
        assert!(error.contains("database.max_pending_bytes"), "{error}");
    }

    /// docs/operations.md's tables of keys are the declarations': the same keys, section by
    /// section, and each documented default, read as the configuration file would give it,
    /// is the declared default.
    #[test]
    fn the_operations_guide_documents_every_key_with_its_default() {
        let guide = include_str!("../docs/operations.md");
        let declared: std::collections::BTreeSet<&str> =
            Settings::keys().map(|key| key.name).collect();
        let mut documented = std::collections::BTreeSet::new();
        let mut section = None;
        for line in guide.lines() {
            if let Some(name) = line
                .strip_prefix("### `[")
                .and_then(|rest| rest.strip_suffix("]`"))
            {
                section = Some(name.to_owned());
                continue;
            }
            if line.starts_with("## ") {
                section = None;
            }
            let (Some(section), Some(row)) = (&section, line.strip_prefix("| `")) else {
                continue;
            };
            let cells: Vec<&str> = row.split(" | ").collect();
            let key = cells[0].trim_end_matches('`');
            let name = format!("{section}.{key}");
            let default = cells[2].trim();
            let read = match default {
                "none" | "empty" => None,
                _ => {
                    let value = default
                        .split('`')
                        .nth(1)
                        .unwrap_or_else(|| panic!("{name}: no default in `{default}`"));
                    Some(format!("[{section}]\n{key} = {value}\n"))
                }
            };
            let declared_default =
                serde_json::to_value(Settings::default()).unwrap()[section][key].clone();
            let documented_default = match read {
                None => serde_json::Value::Null,
                Some(toml) => {
                    let settings: Settings =
                        Figment::from(Serialized::defaults(Settings::default()))
                            .merge(Toml::string(&toml))
                            .extract()
                            .unwrap_or_else(|error| panic!("{name}: `{default}`: {error}"));
                    serde_json::to_value(settings).unwrap()[section][key].clone()
                }
            };
            let empty = serde_json::Value::Array(Vec::new());
            let documented_default = if default == "empty" {
                empty
            } else {
                documented_default
            };
            assert_eq!(
                documented_default, declared_default,
                "{name}: documented default `{default}`"
            );
            documented.insert(name);
        }
        let declared: std::collections::BTreeSet<String> =
            declared.into_iter().map(str::to_owned).collect();
        assert_eq!(
            documented, declared,
            "the keys documented are the keys declared"
        );
    }

    #[test]
    fn every_key_has_a_doc_line_and_a_bound_fit_for_its_type() {
        for key in Settings::keys() {
            assert!(!key.doc.trim().is_empty(), "{}", key.name);
        }
        Settings::default().check_bounds().unwrap();
    }

    #[test]
    fn defaults_are_valid() {
        Settings::default().validate().unwrap();
    }

    #[test]
    fn anonymous_only_on_loopback() {
        let mut settings = Settings::default();
        settings.http.listen = "0.0.0.0:8080".parse().unwrap();
        let error = settings.validate().unwrap_err().to_string();
        assert!(error.contains("auth.clients"), "{error}");
    }

    #[test]
    fn the_admin_listener_needs_tls_off_loopback_an_address_of_its_own_and_valid_admins() {
        let admin = |id: &str, digest: &str| AdminPrincipal {
            id: id.into(),
            token_sha256: digest.into(),
        };
        let digest = "ab".repeat(32);
        let refused = |change: &dyn Fn(&mut Settings), key: &str| {
            let mut settings = Settings::default();
            settings.auth.admins = vec![admin("ops", &digest)];
            change(&mut settings);
            let error = settings.validate().unwrap_err().to_string();
            assert!(error.contains(key), "{key}: {error}");
        };
        refused(
            &|settings| settings.admin.listen = "0.0.0.0:8081".parse().unwrap(),
            "admin.listen",
        );
        refused(
            &|settings| settings.admin.listen = settings.http.listen,
            "admin.listen",
        );
        refused(
            &|settings| settings.auth.admins.push(admin("ops", &"cd".repeat(32))),
            "auth.admins.id",
        );
        refused(
            &|settings| settings.auth.admins = vec![admin("o ps", &digest)],
            "auth.admins.id",
        );
        refused(
            &|settings| settings.auth.admins = vec![admin("ops", "abc")],
            "auth.admins.token_sha256",
        );
        refused(
            &|settings| {
                settings.auth.clients = vec![ClientSettings {
                    id: "jobs".into(),
                    token_sha256: digest.to_uppercase(),
                    max_concurrent_writes: None,
                    max_requests_per_second: None,
                }]
            },
            "auth.admins.token_sha256",
        );
        refused(
            &|settings| settings.admin.tls_cert_file = Some("/etc/retrysafe/admin.pem".into()),
            "admin.tls_key_file",
        );
        refused(
            &|settings| settings.admin.hosts = vec!["has space".into()],
            "admin.hosts",
        );
        let mut settings = Settings::default();
        settings.auth.admins = vec![admin("ops", &digest)];
        settings.validate().unwrap();
        settings.admin.listen = "0.0.0.0:8081".parse().unwrap();
        settings.admin.tls_cert_file = Some("/etc/retrysafe/admin.pem".into());
        settings.admin.tls_key_file = Some("/etc/retrysafe/admin.key".into());
        settings.validate().unwrap();
    }

    #[test]
    fn several_database_hosts_need_read_write_sessions() {
        let mut settings = Settings::default();
        settings.database.url = "postgres://app@db1:5432,db2:5432/x".into();
        let error = settings.validate().unwrap_err().to_string();
        assert!(error.contains("target_session_attrs=read-write"), "{error}");
        settings.database.url =
            "postgres://app@db1:5432,db2:5432/x?target_session_attrs=read-write".into();
        settings.validate().unwrap();
    }

    #[test]
    fn amqp_url_is_one_url_or_a_list() {
        let one = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(
            "[amqp]\nurl = \"amqp://a/%2f, amqp://b/%2f\"\n",
        ));
        let settings = checked(one).unwrap();
        assert_eq!(settings.amqp.url.0, ["amqp://a/%2f", "amqp://b/%2f"]);
        let many = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(
            "[amqp]\nurl = [\"amqp://a/%2f\", \"amqp://b/%2f\", \"amqp://c/%2f\"]\n",
        ));
        assert_eq!(checked(many).unwrap().amqp.url.0.len(), 3);
        let bad = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(
            "[amqp]\nurl = [\"amqp://a/%2f\", \"http://b\"]\n",
        ));
        let error = checked(bad).unwrap_err().to_string();
        assert!(
            error.contains("amqp.url") && error.contains("http://b"),
            "{error}"
        );
    }

    #[test]
    fn database_tls_parameters_are_checked_by_name() {
        let mut settings = Settings::default();
        for mode in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
            settings.database.url = format!("postgres://app:pw@db/x?sslmode={mode}").into();
            settings.validate().unwrap();
        }
        settings.database.url = "postgres://app:hunter2@db/x?sslmode=verify-everything".into();
        let error = settings.validate().unwrap_err().to_string();
        assert!(
            error.contains("database.url") && error.contains("\"verify-everything\""),
            "{error}"
        );
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn amqps_urls_and_tls_file_pairs() {
        let figment = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(
            "[amqp]\nurl = [\"amqps://a/%2f\", \"amqp://b/%2f\"]\ntls_ca_file = \"/ca.pem\"\n",
        ));
        let settings = checked(figment).unwrap();
        assert!(settings.amqp.uses_tls());
        for (section, given, missing) in [
            ("http", "tls_cert_file", "tls_key_file"),
            ("http", "tls_key_file", "tls_cert_file"),
            ("amqp", "tls_cert_file", "tls_key_file"),
        ] {
            let figment = Figment::from(Serialized::defaults(Settings::default())).merge(
                Toml::string(&format!("[{section}]\n{given} = \"/x.pem\"\n")),
            );
            let error = checked(figment).unwrap_err().to_string();
            assert!(error.contains(&format!("{section}.{missing}")), "{error}");
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let figment = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(
            "[http]\nlisten = \"127.0.0.1:1\"\nbogus = 1\n",
        ));
        let error = checked(figment).unwrap_err().to_string();
        assert!(error.contains("bogus"), "{error}");

        let figment = Figment::from(Serialized::defaults(Settings::default()))
            .merge(Toml::string("[outbox]\npoll_interval = \"soon\"\n"));
        let error = checked(figment).unwrap_err().to_string();
        assert!(error.contains("outbox.poll_interval"), "{error}");
    }
}
