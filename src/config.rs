//! Layered configuration: built-in defaults, then `config.toml`, then `RETRYSAFE_<SECTION>__<KEY>`
//! environment variables. Unknown keys and invalid values are errors that name the key.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

mod redact;
mod warnings;

pub use redact::{redact_url, UNPARSABLE};
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
    pub log: LogSettings,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    /// Address the HTTP server binds; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Largest request body accepted; larger ones get 413.
    pub max_body_bytes: usize,
    /// How long a shutdown waits for requests in flight and queued writes.
    pub shutdown_timeout: ConfigDuration,
    /// How long a client may take to send a request body; slower ones get 408.
    pub body_timeout: ConfigDuration,
    /// How long a client may take to send a request's head (request line and headers); slower
    /// ones get 408 and the connection is closed.
    pub head_timeout: ConfigDuration,
    /// HTTP worker threads; 0 is one per CPU core.
    pub workers: usize,
    /// PEM certificate (and its chain) of the HTTPS listener; with `tls_key_file`, the listener
    /// speaks HTTPS only. Reloaded on SIGHUP.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
    /// When set, `/readyz`, `/metrics` and `/openapi.json` are served on this address (plain
    /// HTTP) and no longer on `listen`; `/healthz` is on both.
    pub operations_listen: Option<SocketAddr>,
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

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSettings {
    /// libpq-style URL; the database it names is created at start when missing.
    pub url: String,
    /// Connections in the pool, shared by writers, relays and reads.
    pub pool_size: u32,
    /// Writer actors; each commits one batch at a time.
    pub writers: usize,
    /// Most writes one batch (one transaction) takes.
    pub max_batch: usize,
    /// Bound on opening a connection and on waiting for a pooled one.
    pub connect_timeout: ConfigDuration,
    /// How long `serve` (and `migrate`) wait at start for a database that is not there yet
    /// (unreachable, starting up, every connection slot taken), trying again with backoff,
    /// before they give up. Keep it below systemd's start timeout (the unit's
    /// `TimeoutStartSec`).
    pub start_timeout: ConfigDuration,
    /// Server-side bound on any one statement, including time spent waiting for locks.
    pub statement_timeout: ConfigDuration,
    /// Bound on the bytes held by writes queued or being committed; past it, 503 at once.
    pub max_pending_bytes: usize,
}

impl fmt::Debug for DatabaseSettings {
    // The URL may carry a password: show only where it points.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &redact_url(&self.url))
            .field("pool_size", &self.pool_size)
            .field("writers", &self.writers)
            .field("max_batch", &self.max_batch)
            .field("max_pending_bytes", &self.max_pending_bytes)
            .field("connect_timeout", &self.connect_timeout)
            .field("start_timeout", &self.start_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .finish()
    }
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AmqpSettings {
    /// One broker URL, or several (the nodes of a cluster), tried in turn.
    pub url: UrlList,
    /// Durable topic exchange the daemon declares and publishes to.
    pub exchange: String,
    /// PEM CA certificates that an `amqps://` broker's certificate must chain to; without it,
    /// the platform's roots.
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate for brokers that authenticate with one (with `tls_key_file`).
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
}

impl AmqpSettings {
    /// Whether any broker of `amqp.url` is reached over TLS.
    pub fn uses_tls(&self) -> bool {
        self.url.iter().any(|url| url.starts_with("amqps://"))
    }
}

impl fmt::Debug for AmqpSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpSettings")
            .field("url", &self.url.redacted())
            .field("exchange", &self.exchange)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .finish()
    }
}

/// One URL or several: a TOML string or array of strings; a string (as an environment variable
/// gives) may list several URLs separated by commas.
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

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencySettings {
    /// How long a completed key is remembered; afterwards it is new again.
    pub retention: ConfigDuration,
    /// How long a duplicate waits for the first request of its key before 409.
    pub wait_timeout: ConfigDuration,
    /// Status for a key reused with another request: 409, or 422 as in the IETF draft.
    pub mismatch_status: u16,
    /// KeyShard actors.
    pub shards: usize,
    /// Completed responses kept in memory, across all shards.
    pub cache_entries: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxSettings {
    pub workers: usize,
    pub batch_size: usize,
    pub poll_interval: ConfigDuration,
    pub confirm_timeout: ConfigDuration,
    pub max_attempts: i32,
    pub retention: ConfigDuration,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventSettings {
    /// Also emit `audit.entry.created` for every write.
    pub audit: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    pub clients: Vec<ClientSettings>,
    /// Writes of one client in flight at once, at most (past it, 429 at once); 0 is no limit.
    /// The default for every client, the anonymous one included; a client may set its own.
    pub max_concurrent_writes: u32,
    /// Requests of one client per second, at most, on any `/v1/` route, with a burst of one
    /// second's worth (past it, 429 at once); 0 is no limit. The default for every client; a
    /// client may set its own.
    pub max_requests_per_second: f64,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            clients: Vec::new(),
            max_concurrent_writes: 128,
            max_requests_per_second: 0.0,
        }
    }
}

impl AuthSettings {
    /// The limits of `client` (None: the anonymous client): its own where it sets them, else
    /// the daemon-wide defaults.
    pub fn limits_of(&self, client: Option<&ClientSettings>) -> crate::http::limits::Limits {
        crate::http::limits::Limits {
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

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    pub format: LogFormat,
    /// A tracing filter: `info`, or `retrysafe=debug,info`.
    pub level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: 64 * 1024,
            shutdown_timeout: ConfigDuration::from_secs(30),
            body_timeout: ConfigDuration::from_secs(30),
            head_timeout: ConfigDuration::from_secs(5),
            workers: 0,
            tls_cert_file: None,
            tls_key_file: None,
            operations_listen: None,
        }
    }
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: "postgres://postgres@127.0.0.1:5432/retrysafe".into(),
            pool_size: 16,
            writers: 2,
            max_batch: 256,
            connect_timeout: ConfigDuration::from_secs(2),
            start_timeout: ConfigDuration::from_secs(60),
            statement_timeout: ConfigDuration::from_secs(5),
            max_pending_bytes: 64 * 1024 * 1024,
        }
    }
}

impl Default for AmqpSettings {
    fn default() -> Self {
        Self {
            url: UrlList::one("amqp://guest:guest@127.0.0.1:5672/%2f"),
            exchange: "retrysafe.events".into(),
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

impl Default for IdempotencySettings {
    fn default() -> Self {
        Self {
            retention: ConfigDuration::from_secs(24 * 3600),
            wait_timeout: ConfigDuration::from_secs(10),
            mismatch_status: 409,
            shards: 8,
            cache_entries: 100_000,
        }
    }
}

impl Default for OutboxSettings {
    fn default() -> Self {
        Self {
            workers: 2,
            batch_size: 1000,
            poll_interval: ConfigDuration::from_secs(1),
            confirm_timeout: ConfigDuration::from_secs(10),
            max_attempts: 20,
            retention: ConfigDuration::from_secs(7 * 24 * 3600),
        }
    }
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

impl Settings {
    /// Loads defaults, then the file at `path` (which must exist), then the environment, and
    /// validates the result.
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
        let settings: Settings = figment
            .extract()
            .map_err(|error| ConfigError::Parse(describe_figment_error(error)))?;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks what the types alone do not: ranges, and that an open listener has credentials.
    /// A list of independent checks, one per rule; long because the rules are many.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_ranges()?;
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
        // The TLS parameters (libpq's) are checked here and taken out: tokio-postgres knows
        // only a few of them. Their files are read by check-config and at start.
        let database = crate::db::tls::split(&self.database.url)
            .map_err(|error| invalid("database.url", error))?;
        let database = tokio_postgres::Config::from_str(&database.rest).map_err(|error| {
            invalid(
                "database.url",
                format!("not a valid PostgreSQL URL: {error}"),
            )
        })?;
        let hosts = database.get_hosts().len();
        if hosts > 1
            && database.get_target_session_attrs()
                != tokio_postgres::config::TargetSessionAttrs::ReadWrite
        {
            return Err(invalid(
                "database.url",
                format!(
                    "lists {hosts} hosts but not target_session_attrs=read-write: without it a connection may land on a standby, where every write fails; add ?target_session_attrs=read-write (an HA formation), or list one host"
                ),
            ));
        }
        if self.amqp.url.0.is_empty() || self.amqp.url.iter().any(str::is_empty) {
            return Err(invalid(
                "amqp.url",
                "must list at least one URL, and no empty one",
            ));
        }
        for url in self.amqp.url.iter() {
            if !(url.starts_with("amqp://") || url.starts_with("amqps://")) {
                return Err(invalid(
                    "amqp.url",
                    format!("{}: must start with amqp:// or amqps://", redact_url(url)),
                ));
            }
            url.parse::<lapin::uri::AMQPUri>().map_err(|error| {
                invalid(
                    "amqp.url",
                    format!("{}: not a valid AMQP URL: {error}", redact_url(url)),
                )
            })?;
        }
        both_or_neither(
            ("amqp.tls_cert_file", &self.amqp.tls_cert_file),
            ("amqp.tls_key_file", &self.amqp.tls_key_file),
        )?;
        if self.amqp.exchange.is_empty() || self.amqp.exchange.len() > 255 {
            return Err(invalid("amqp.exchange", "must be 1 to 255 characters"));
        }
        if !matches!(self.idempotency.mismatch_status, 409 | 422) {
            return Err(invalid("idempotency.mismatch_status", "must be 409 or 422"));
        }
        tracing_subscriber::EnvFilter::try_new(&self.log.level)
            .map_err(|error| invalid("log.level", error.to_string()))?;
        self.validate_clients()
    }

    /// Every count and duration within its range: a value past what the daemon or the systems
    /// it talks to can take would otherwise fail only at start (a 30-day statement timeout
    /// overflows the TCP user timeout) or later, far from the key that caused it.
    /// A table, one line per key; long because the keys are many.
    fn validate_ranges(&self) -> Result<(), ConfigError> {
        const MINUTE: u64 = 60;
        const HOUR: u64 = 60 * MINUTE;
        const TEN_YEARS: u64 = 3650 * 24 * HOUR;
        let durations = [
            ("http.shutdown_timeout", self.http.shutdown_timeout, HOUR),
            ("http.body_timeout", self.http.body_timeout, HOUR),
            ("http.head_timeout", self.http.head_timeout, HOUR),
            (
                "database.connect_timeout",
                self.database.connect_timeout,
                5 * MINUTE,
            ),
            ("database.start_timeout", self.database.start_timeout, HOUR),
            (
                "database.statement_timeout",
                self.database.statement_timeout,
                HOUR,
            ),
            (
                "idempotency.retention",
                self.idempotency.retention,
                TEN_YEARS,
            ),
            (
                "idempotency.wait_timeout",
                self.idempotency.wait_timeout,
                10 * MINUTE,
            ),
            ("outbox.poll_interval", self.outbox.poll_interval, HOUR),
            (
                "outbox.confirm_timeout",
                self.outbox.confirm_timeout,
                10 * MINUTE,
            ),
            ("outbox.retention", self.outbox.retention, TEN_YEARS),
        ];
        for (key, value, max_seconds) in durations {
            if value.0.is_zero() {
                return Err(invalid(key, "must be longer than zero"));
            }
            let max = Duration::from_secs(max_seconds);
            if value.0 > max {
                return Err(invalid(
                    key,
                    format!("must be at most {}", humantime::format_duration(max)),
                ));
            }
        }
        let max_body = self.http.max_body_bytes as u64;
        let counts = [
            ("http.max_body_bytes", max_body, 64, 64 << 20),
            (
                "database.pool_size",
                u64::from(self.database.pool_size),
                2,
                1000,
            ),
            ("database.writers", self.database.writers as u64, 1, 64),
            (
                "database.max_batch",
                self.database.max_batch as u64,
                1,
                10_000,
            ),
            // At least one write of the largest body must fit.
            (
                "database.max_pending_bytes",
                self.database.max_pending_bytes as u64,
                max_body + 1024,
                16 << 30,
            ),
            (
                "idempotency.shards",
                self.idempotency.shards as u64,
                1,
                1024,
            ),
            (
                "idempotency.cache_entries",
                self.idempotency.cache_entries as u64,
                0,
                100_000_000,
            ),
            ("http.workers", self.http.workers as u64, 0, 256),
            ("outbox.workers", self.outbox.workers as u64, 1, 64),
            (
                "outbox.batch_size",
                self.outbox.batch_size as u64,
                1,
                10_000,
            ),
            (
                "outbox.max_attempts",
                u64::try_from(self.outbox.max_attempts).unwrap_or(0),
                1,
                1000,
            ),
        ];
        for (key, value, min, max) in counts {
            if value < min || value > max {
                return Err(invalid(key, format!("must be between {min} and {max}")));
            }
        }
        Ok(())
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
            let is_sha256_hex = client.token_sha256.len() == 64
                && client.token_sha256.bytes().all(|b| b.is_ascii_hexdigit());
            if !is_sha256_hex {
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

/// A duration written as a string such as `"30s"`, `"250ms"` or `"24h"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigDuration(pub Duration);

impl ConfigDuration {
    pub const fn from_secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }
}

impl From<ConfigDuration> for Duration {
    fn from(value: ConfigDuration) -> Self {
        value.0
    }
}

impl Serialize for ConfigDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&humantime::format_duration(self.0).to_string())
    }
}

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text)
            .map(ConfigDuration)
            .map_err(|error| {
                serde::de::Error::custom(format!(
                    "{text:?} is not a duration such as \"30s\" or \"24h\": {error}"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        settings.database.statement_timeout = ConfigDuration::from_secs(30 * 24 * 3600);
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
        let settings = Settings::from_figment(one).unwrap();
        assert_eq!(settings.amqp.url.0, ["amqp://a/%2f", "amqp://b/%2f"]);
        let many = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(
            "[amqp]\nurl = [\"amqp://a/%2f\", \"amqp://b/%2f\", \"amqp://c/%2f\"]\n",
        ));
        assert_eq!(Settings::from_figment(many).unwrap().amqp.url.0.len(), 3);
        let bad = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(
            "[amqp]\nurl = [\"amqp://a/%2f\", \"http://b\"]\n",
        ));
        let error = Settings::from_figment(bad).unwrap_err().to_string();
        assert!(
            error.contains("amqp.url") && error.contains("http://b"),
            "{error}"
        );
    }

    #[test]
    fn database_tls_parameters_are_checked_by_name() {
        let mut settings = Settings::default();
        for mode in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
            settings.database.url = format!("postgres://app:pw@db/x?sslmode={mode}");
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
        let settings = Settings::from_figment(figment).unwrap();
        assert!(settings.amqp.uses_tls());
        for (section, given, missing) in [
            ("http", "tls_cert_file", "tls_key_file"),
            ("http", "tls_key_file", "tls_cert_file"),
            ("amqp", "tls_cert_file", "tls_key_file"),
        ] {
            let figment = Figment::from(Serialized::defaults(Settings::default())).merge(
                Toml::string(&format!("[{section}]\n{given} = \"/x.pem\"\n")),
            );
            let error = Settings::from_figment(figment).unwrap_err().to_string();
            assert!(error.contains(&format!("{section}.{missing}")), "{error}");
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let figment = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(
            "[http]\nlisten = \"127.0.0.1:1\"\nbogus = 1\n",
        ));
        let error = Settings::from_figment(figment).unwrap_err().to_string();
        assert!(error.contains("bogus"), "{error}");

        let figment = Figment::from(Serialized::defaults(Settings::default()))
            .merge(Toml::string("[outbox]\npoll_interval = \"soon\"\n"));
        let error = Settings::from_figment(figment).unwrap_err().to_string();
        assert!(error.contains("outbox.poll_interval"), "{error}");
    }
}
