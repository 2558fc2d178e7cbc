//! The configuration as the daemon runs with it: every key checked, and what was given as text
//! parsed once: the two URLs (here), the status of a reused key, the clients' and admins' token
//! digests and limits, the admin listener's host names ([`ListenerHost`]), the log filter
//! ([`LogFilter`]), where spans go ([`TracesEndpoint`]). The database, the broker, the HTTP
//! layer, the logs and the export of spans take what was parsed, never the text again, and no
//! validated section hands back its keys as given. Each section's keys are destructured where
//! it is validated, so that a key added to a section does not compile until its validated type
//! holds it.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lapin::uri::{AMQPScheme, AMQPUri};

use crate::config::{
    invalid, redact_url, AdminSettings, AmqpSettings, ConfigError, DatabaseSettings, DatabaseUrl,
    EventSettings, HttpSettings, IdempotencySettings, ListenerHost, LogFilter, LogFormat,
    OutboxSettings, TracesEndpoint,
};

/// Heartbeat asked of a broker whose URL sets none: a silently dead peer is noticed within
/// about two heartbeats instead of RabbitMQ's default of two minutes.
const DEFAULT_HEARTBEAT_SECONDS: u16 = 10;

/// [`Settings`](super::Settings), validated ([`validated`](super::Settings::validated)).
#[derive(Debug, Clone)]
pub struct Config {
    pub http: HttpSettings,
    pub database: DatabaseConfig,
    pub amqp: AmqpConfig,
    pub idempotency: IdempotencyConfig,
    pub outbox: OutboxSettings,
    pub events: EventSettings,
    pub auth: AuthConfig,
    pub admin: AdminListenerConfig,
    pub log: LogConfig,
    pub telemetry: TelemetryConfig,
}

/// `[database]`, with `database.url` parsed: what tokio-postgres reads, libpq's TLS parameters
/// (which tokio-postgres does not know and the daemon applies itself), the hosts, and the URL
/// as logs show it.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// `database.url`, parsed: every consumer takes this, so that nothing parses the text again.
    pub url: DatabaseUrl,
    /// `database.pool_size`: the connections of both pools together.
    pub pool_size: u32,
    /// `database.writers`.
    pub writers: usize,
    /// `database.max_batch`.
    pub max_batch: usize,
    /// `database.connect_timeout`.
    pub connect_timeout: Duration,
    /// `database.start_timeout`.
    pub start_timeout: Duration,
    /// `database.statement_timeout`.
    pub statement_timeout: Duration,
    /// `database.max_pending_bytes`.
    pub max_pending_bytes: usize,
    /// `database.citus_direct`.
    pub citus_direct: bool,
    /// `database.citus_node_addresses`, parsed.
    pub citus_node_addresses: Vec<NodeAddress>,
}

/// Where to reach a Citus node: as Citus's metadata names it (`name`, `port`), and the host and
/// port to connect to instead (`database.citus_node_addresses`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddress {
    pub name: String,
    pub port: u16,
    pub reach_host: String,
    pub reach_port: u16,
}

impl NodeAddress {
    /// One entry, `name:port=host:port`; each host a name, an IPv4 address or an IPv6 address in
    /// brackets. The error quotes the entry (it holds no secret).
    pub fn parse(text: &str) -> Result<Self, String> {
        let host_and_port = |part: &str| -> Option<(String, u16)> {
            let (host, port) = part.trim().rsplit_once(':')?;
            let port: u16 = port.parse().ok().filter(|port| *port > 0)?;
            let host = match host.strip_prefix('[') {
                Some(inside) => inside
                    .strip_suffix(']')
                    .filter(|address| address.parse::<std::net::Ipv6Addr>().is_ok())?,
                None => Some(host).filter(|host| {
                    !host.is_empty()
                        && host
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
                })?,
            };
            Some((host.to_owned(), port))
        };
        let parsed = text
            .split_once('=')
            .and_then(|(named, reached)| Some((host_and_port(named)?, host_and_port(reached)?)));
        match parsed {
            Some(((name, port), (reach_host, reach_port))) => Ok(Self {
                name,
                port,
                reach_host,
                reach_port,
            }),
            None => Err(format!(
                "{text:?} is not name:port=host:port (each host a name, an IPv4 address or an IPv6 address in brackets, each port 1 to 65535)"
            )),
        }
    }
}

/// `[amqp]`, with `amqp.url` parsed: the brokers, in the order they are tried.
#[derive(Debug, Clone)]
pub struct AmqpConfig {
    /// `amqp.url`, parsed: at least one broker.
    pub brokers: Vec<BrokerEndpoint>,
    /// `amqp.exchange`: 1 to 255 characters.
    pub exchange: String,
    /// `amqp.connect_timeout`.
    pub connect_timeout: Duration,
    /// `amqp.tls_ca_file`.
    pub tls_ca_file: Option<PathBuf>,
    /// `amqp.tls_cert_file`; set when `tls_key_file` is.
    pub tls_cert_file: Option<PathBuf>,
    /// `amqp.tls_key_file`; set when `tls_cert_file` is.
    pub tls_key_file: Option<PathBuf>,
}

/// One broker of `amqp.url`: where to connect (a heartbeat asked for unless the URL sets one),
/// and how to name it in logs.
#[derive(Clone)]
pub struct BrokerEndpoint {
    pub uri: AMQPUri,
    /// The URL without its password.
    pub display: String,
}

/// `[idempotency]`, with `idempotency.mismatch_status` as a status.
#[derive(Debug, Clone)]
pub struct IdempotencyConfig {
    /// `idempotency.retention`.
    pub retention: Duration,
    /// `idempotency.wait_timeout`.
    pub wait_timeout: Duration,
    /// `idempotency.mismatch_status`, 409 or 422.
    pub mismatch_status: MismatchStatus,
    /// `idempotency.shards`.
    pub shards: usize,
    /// `idempotency.cache_entries`; 0 turns the cache off.
    pub cache_entries: usize,
}

/// The status of a request that reuses a key with another request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MismatchStatus {
    /// 409 Conflict, the default.
    Conflict,
    /// 422 Unprocessable Content, as in the IETF draft.
    UnprocessableContent,
}

/// `[auth]`, checked: each principal's token digest decoded, each client's limits resolved.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// `[[auth.clients]]`; none: every request is the anonymous client.
    pub clients: Vec<ClientConfig>,
    /// `[[auth.admins]]`; none: no admin listener.
    pub admins: Vec<AdminConfig>,
    /// The anonymous client's limits: the daemon-wide ones (`auth.max_concurrent_writes`,
    /// `auth.max_requests_per_second`).
    pub anonymous_limits: Limits,
}

/// A client of the API (`[[auth.clients]]`).
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub id: String,
    pub token_sha256: TokenDigest,
    /// Its own limits where it sets them, else the daemon-wide ones.
    pub limits: Limits,
}

/// An admin (`[[auth.admins]]`): a principal of the admin listener, never of the API.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    pub id: String,
    pub token_sha256: TokenDigest,
}

/// A client's limits; 0 is none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub max_concurrent_writes: u32,
    pub max_requests_per_second: f64,
}

/// The SHA-256 of a bearer token, as the configuration gives it (64 hex digits), decoded; the
/// token itself is never stored. Not shown in `Debug`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TokenDigest([u8; 32]);

impl TokenDigest {
    /// 64 hex digits, in either case; None for any other text.
    pub fn of_hex(text: &str) -> Option<Self> {
        let mut digest = [0u8; 32];
        hex::decode_to_slice(text, &mut digest).ok()?;
        Some(Self(digest))
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenDigest(..)")
    }
}

/// `[admin]`, with `admin.hosts` parsed into host names.
#[derive(Debug, Clone)]
pub struct AdminListenerConfig {
    /// `admin.listen`.
    pub listen: SocketAddr,
    /// `admin.tls_cert_file`; set when `tls_key_file` is.
    pub tls_cert_file: Option<PathBuf>,
    /// `admin.tls_key_file`; set when `tls_cert_file` is.
    pub tls_key_file: Option<PathBuf>,
    /// `admin.hosts`: the hosts answered besides loopback ones and the listener's address.
    pub hosts: Vec<ListenerHost>,
    /// `admin.session_timeout`.
    pub session_timeout: Duration,
}

/// `[log]`, with the filter parsed: `RUST_LOG` when it is set, else `log.level`.
#[derive(Debug, Clone)]
pub struct LogConfig {
    pub format: LogFormat,
    pub filter: LogFilter,
}

/// `[telemetry]`, with the collector resolved: `telemetry.otlp_endpoint`, else the environment.
#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    pub traces: TracesEndpoint,
    /// Share of new traces whose spans are exported, 0 to 1.
    pub sample_ratio: f64,
}

impl DatabaseConfig {
    pub(super) fn parse(settings: &DatabaseSettings) -> Result<Self, ConfigError> {
        let url = DatabaseUrl::parse(settings.url.as_str())
            .map_err(|error| invalid("database.url", error))?;
        let hosts = url.hosts().len();
        if hosts > 1
            && url.connection().get_target_session_attrs()
                != tokio_postgres::config::TargetSessionAttrs::ReadWrite
        {
            return Err(invalid(
                "database.url",
                format!(
                    "lists {hosts} hosts but not target_session_attrs=read-write: without it a connection may land on a standby, where every write fails; add ?target_session_attrs=read-write (an HA formation), or list one host"
                ),
            ));
        }
        let DatabaseSettings {
            url: _,
            pool_size,
            writers,
            max_batch,
            connect_timeout,
            start_timeout,
            statement_timeout,
            max_pending_bytes,
            citus_direct,
            ref citus_node_addresses,
        } = *settings;
        let citus_node_addresses = citus_node_addresses
            .iter()
            .map(|entry| {
                NodeAddress::parse(entry)
                    .map_err(|error| invalid("database.citus_node_addresses", error))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            url,
            pool_size,
            writers,
            max_batch,
            connect_timeout,
            start_timeout,
            statement_timeout,
            max_pending_bytes,
            citus_direct,
            citus_node_addresses,
        })
    }
}

impl AmqpConfig {
    pub(super) fn parse(settings: &AmqpSettings) -> Result<Self, ConfigError> {
        if settings.url.0.is_empty() || settings.url.iter().any(str::is_empty) {
            return Err(invalid(
                "amqp.url",
                "must list at least one URL, and no empty one",
            ));
        }
        let brokers = settings
            .url
            .iter()
            .map(|url| BrokerEndpoint::parse(url).map_err(|error| invalid("amqp.url", error)))
            .collect::<Result<_, _>>()?;
        let AmqpSettings {
            url: _,
            exchange,
            connect_timeout,
            tls_ca_file,
            tls_cert_file,
            tls_key_file,
        } = settings.clone();
        Ok(Self {
            brokers,
            exchange,
            connect_timeout,
            tls_ca_file,
            tls_cert_file,
            tls_key_file,
        })
    }

    /// Whether any broker is reached over TLS.
    pub fn uses_tls(&self) -> bool {
        self.brokers.iter().any(BrokerEndpoint::uses_tls)
    }

    /// The brokers as logs show them: without their passwords, comma-separated.
    pub fn shown(&self) -> String {
        let shown: Vec<&str> = self
            .brokers
            .iter()
            .map(|broker| broker.display.as_str())
            .collect();
        shown.join(",")
    }
}

impl IdempotencyConfig {
    pub(super) fn parse(settings: &IdempotencySettings) -> Result<Self, ConfigError> {
        let IdempotencySettings {
            retention,
            wait_timeout,
            mismatch_status,
            shards,
            cache_entries,
        } = *settings;
        let mismatch_status = MismatchStatus::of_code(mismatch_status)
            .ok_or_else(|| invalid("idempotency.mismatch_status", "must be 409 or 422"))?;
        Ok(Self {
            retention,
            wait_timeout,
            mismatch_status,
            shards,
            cache_entries,
        })
    }
}

impl AdminListenerConfig {
    pub(super) fn parse(settings: &AdminSettings) -> Result<Self, ConfigError> {
        let AdminSettings {
            listen,
            tls_cert_file,
            tls_key_file,
            hosts,
            session_timeout,
        } = settings.clone();
        let hosts = hosts
            .iter()
            .map(|host| ListenerHost::parse(host).map_err(|error| invalid("admin.hosts", error)))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            listen,
            tls_cert_file,
            tls_key_file,
            hosts,
            session_timeout,
        })
    }

    /// The certificate and key files, when the admin listener is HTTPS.
    pub fn tls_files(&self) -> Option<(&Path, &Path)> {
        Some((
            self.tls_cert_file.as_deref()?,
            self.tls_key_file.as_deref()?,
        ))
    }
}

impl MismatchStatus {
    /// The status of `code`, 409 or 422; None for any other.
    pub fn of_code(code: u16) -> Option<Self> {
        match code {
            409 => Some(Self::Conflict),
            422 => Some(Self::UnprocessableContent),
            _ => None,
        }
    }
}

impl BrokerEndpoint {
    /// Parses one broker URL, `amqp://` or `amqps://`. Errors show it without its password.
    pub fn parse(url: &str) -> Result<Self, String> {
        let display = redact_url(url);
        if !(url.starts_with("amqp://") || url.starts_with("amqps://")) {
            return Err(format!("{display}: must start with amqp:// or amqps://"));
        }
        let mut uri: AMQPUri = url
            .parse()
            .map_err(|error| format!("{display}: not a valid AMQP URL: {error}"))?;
        if uri.query.heartbeat.is_none() {
            uri.query.heartbeat = Some(DEFAULT_HEARTBEAT_SECONDS);
        }
        Ok(Self { uri, display })
    }

    /// Whether it is reached over TLS.
    pub fn uses_tls(&self) -> bool {
        self.uri.scheme == AMQPScheme::AMQPS
    }
}

impl fmt::Debug for BrokerEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}
