//! Opening connections to PostgreSQL: every host of `database.url` in turn, each attempt
//! bounded as a whole.
//!
//! tokio-postgres bounds only the TCP connect of an attempt. A server that accepts TCP but never
//! answers (a hung or paused host: the kernel still completes the handshake) would hold the
//! startup, authentication or read-write check forever, and with several hosts the later ones
//! would never be tried. So the connector tries the hosts itself, one at a time, each within
//! `database.connect_timeout`, starting with the host that answered last: after a failover, new
//! connections go straight to the new primary instead of waiting on the old one first.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;

use rand::seq::SliceRandom;
use tokio_postgres::config::LoadBalanceHosts;
use tokio_postgres::error::{DbError, Severity};
use tokio_postgres::{AsyncMessage, Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::{DatabaseHost, HostName};
use crate::db::blocked::Blocker;
use crate::db::sqlstate;
use tokio_postgres::error::SqlState;

/// Bound on the graceful end of a connection dropped while healthy: it sends Terminate and
/// closes; a server that stopped answering meanwhile must not keep the task and socket.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Opens connections to the hosts of one configuration.
pub struct Connector {
    /// One configuration per host, in the order the URL lists them.
    hosts: Vec<HostConfig>,
    /// Index of the host that answered last; tried first.
    preferred: AtomicUsize,
    /// `load_balance_hosts=random`: a random order for every connection instead.
    random_order: bool,
    /// Bound on one host's whole attempt: TCP, TLS, authentication, and the read-write check.
    attempt_timeout: Duration,
    /// TLS as `database.url` asks (its `sslmode` is in each host's configuration). tokio-postgres
    /// gives it each host's own name, which `verify-full` checks.
    tls: MakeRustlsConnect,
}

/// One host's configuration, and the host as messages name it (`host:port`, from the parsed
/// `database.url`: no text of the URL beyond its host part).
#[derive(Clone)]
struct HostConfig {
    name: String,
    config: Config,
}

/// A connection: the client, and the task that drives its socket.
pub struct Connection {
    pub client: Client,
    io: tokio::task::JoinHandle<()>,
    warnings: Arc<Warnings>,
}

/// The WARNING notices a connection's server sent, as its task reads them (in the order of the
/// server's messages: a warning sent before a statement's ReadyForQuery is counted before a
/// simple query's answer reaches the client).
#[derive(Debug, Default)]
struct Warnings {
    count: AtomicU64,
    last: Mutex<String>,
}

impl Warnings {
    /// Counts and logs a notice that is a warning; logs the others at debug level.
    fn note(&self, host: &str, notice: &DbError) {
        let warning = match notice.parsed_severity() {
            Some(severity) => severity == Severity::Warning,
            None => notice.severity() == "WARNING",
        };
        let detail = notice.detail().unwrap_or_default();
        if !warning {
            tracing::debug!(
                host,
                code = notice.code().code(),
                detail,
                "database notice: {}",
                notice.message()
            );
            return;
        }
        tracing::warn!(
            host,
            code = notice.code().code(),
            detail,
            "the database warned: {}",
            notice.message()
        );
        let text = if detail.is_empty() {
            notice.message().to_owned()
        } else {
            format!("{} ({detail})", notice.message())
        };
        *self
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = text;
        self.count.fetch_add(1, Ordering::SeqCst);
    }
}

impl Connection {
    /// How many WARNING notices the server has sent on this connection so far. A commit that
    /// the server warned about (above all: "canceling wait for synchronous replication",
    /// committed locally but not confirmed by a synchronous standby) is told apart by this
    /// count changing across it.
    pub fn warnings(&self) -> u64 {
        self.warnings.count.load(Ordering::SeqCst)
    }

    /// The last warning's message and detail.
    pub fn last_warning(&self) -> String {
        self.warnings
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Ends the connection. `healthy`: the server answered the last request, so the connection
    /// may close gracefully; otherwise its task is stopped at once.
    pub fn close(self, healthy: bool) {
        let Connection { client, io, .. } = self;
        drop(client);
        if !healthy {
            io.abort();
            return;
        }
        // Dropping the client lets the task send Terminate and finish; bound that.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let io = io.abort_handle();
            runtime.spawn(async move {
                tokio::time::sleep(CLOSE_GRACE).await;
                io.abort();
            });
        }
    }
}

/// Why no host gave a connection: each host's failure, in the order tried.
#[derive(Debug)]
pub struct ConnectError {
    failures: Vec<(String, HostFailure)>,
}

#[derive(Debug)]
enum HostFailure {
    TimedOut(Duration),
    Refused(tokio_postgres::Error),
}

impl ConnectError {
    /// Whether a host said the database does not exist (SQLSTATE 3D000).
    pub fn is_invalid_catalog_name(&self) -> bool {
        self.failures.iter().any(|(_, failure)| {
            matches!(failure, HostFailure::Refused(error) if sqlstate::is_invalid_catalog_name(error))
        })
    }

    /// What stops writes, when every host refused for the same such reason (every connection
    /// slot taken: SQLSTATE 53300).
    pub fn blocker(&self) -> Option<Blocker> {
        let mut blockers = self.failures.iter().map(|(_, failure)| match failure {
            HostFailure::Refused(error) => error.code().and_then(sqlstate::blocker_of),
            HostFailure::TimedOut(_) => None,
        });
        let first = blockers.next()??;
        blockers
            .all(|blocker| blocker == Some(first))
            .then_some(first)
    }

    /// Whether trying again later may succeed: every host failed in a way that passes (no
    /// answer, refused at the TCP level, starting up or shutting down, out of connections), and
    /// none for a reason that only the configuration can fix (authentication, TLS, a missing
    /// database or role).
    pub fn is_transient(&self) -> bool {
        self.failures.iter().all(|(_, failure)| match failure {
            HostFailure::TimedOut(_) => true,
            HostFailure::Refused(error) => match error.code() {
                Some(code) => {
                    let class = &code.code()[..2];
                    matches!(class, "08" | "53") || *code == SqlState::CANNOT_CONNECT_NOW
                }
                // No SQLSTATE: the socket (refused, reset, unreachable), unless TLS failed.
                None => {
                    crate::tls::describe_handshake_failure(error).is_none() && {
                        let mut cause = std::error::Error::source(error);
                        let mut tls_refused = false;
                        while let Some(inner) = cause {
                            tls_refused |= inner.to_string() == NO_TLS_ON_SERVER;
                            cause = inner.source();
                        }
                        !tls_refused
                    }
                }
            },
        })
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let described: Vec<String> = self
            .failures
            .iter()
            .map(|(host, failure)| match failure {
                HostFailure::TimedOut(limit) => {
                    format!(
                        "{host}: no answer within {}",
                        humantime::format_duration(*limit)
                    )
                }
                HostFailure::Refused(error) => format!("{host}: {}", describe_refusal(error)),
            })
            .collect();
        write!(
            f,
            "cannot connect to the database ({})",
            described.join("; ")
        )
    }
}

impl std::error::Error for ConnectError {}

/// What tokio-postgres returns when the server answers the TLS request with "no".
const NO_TLS_ON_SERVER: &str = "server does not support TLS";

/// A host's refusal in an operator's words; a TLS failure says which check failed.
fn describe_refusal(error: &tokio_postgres::Error) -> String {
    if let Some(tls) = crate::tls::describe_handshake_failure(error) {
        return format!("TLS: {tls}");
    }
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause {
        if inner.to_string() == NO_TLS_ON_SERVER {
            return "TLS: the server does not support SSL, and sslmode requires it (require, verify-ca or verify-full)".into();
        }
        cause = inner.source();
    }
    sqlstate::describe(error)
}

impl Connector {
    /// A connector to `hosts` (those of the parsed `database.url`), each with `config`'s other
    /// settings, with `tls`; each attempt is bounded by `attempt_timeout`.
    pub fn new(
        config: &Config,
        hosts: &[DatabaseHost],
        tls: MakeRustlsConnect,
        attempt_timeout: Duration,
    ) -> Self {
        Self {
            hosts: split_hosts(config, hosts),
            preferred: AtomicUsize::new(0),
            random_order: config.get_load_balance_hosts() == LoadBalanceHosts::Random,
            attempt_timeout,
            tls,
        }
    }

    /// The same hosts and settings, connecting to another database (for `CREATE DATABASE`).
    pub fn for_database(&self, dbname: &str) -> Self {
        let hosts = self
            .hosts
            .iter()
            .map(|host| {
                let mut host = host.clone();
                host.config.dbname(dbname);
                host
            })
            .collect();
        Self {
            hosts,
            preferred: AtomicUsize::new(self.preferred.load(Ordering::Relaxed)),
            random_order: self.random_order,
            attempt_timeout: self.attempt_timeout,
            tls: self.tls.clone(),
        }
    }

    /// The database the configuration names (or, as libpq does, the user's name).
    pub fn dbname(&self) -> Option<String> {
        let first = &self.hosts.first()?.config;
        first
            .get_dbname()
            .or_else(|| first.get_user())
            .map(str::to_owned)
    }

    /// Connects to the first host that answers, trying the one that answered last first.
    pub async fn connect(&self) -> Result<Connection, ConnectError> {
        let mut failures = Vec::new();
        for index in self.order() {
            let HostConfig { name, config } = &self.hosts[index];
            let attempt =
                tokio::time::timeout(self.attempt_timeout, config.connect(self.tls.clone())).await;
            match attempt {
                Ok(Ok((client, connection))) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    let warnings = Arc::new(Warnings::default());
                    let noted = Arc::clone(&warnings);
                    let host = name.clone();
                    let io = tokio::spawn(async move {
                        // Driven message by message (what awaiting the connection does) so
                        // that its notices are seen. An error here (the server went away)
                        // shows up to the client as a closed connection, which the pool then
                        // discards.
                        let mut connection = connection;
                        let mut messages =
                            futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                        while let Some(Ok(message)) = messages.next().await {
                            if let AsyncMessage::Notice(notice) = message {
                                noted.note(&host, &notice);
                            }
                        }
                    });
                    return Ok(Connection {
                        client,
                        io,
                        warnings,
                    });
                }
                Ok(Err(error)) => failures.push((name.clone(), HostFailure::Refused(error))),
                Err(_elapsed) => {
                    failures.push((name.clone(), HostFailure::TimedOut(self.attempt_timeout)))
                }
            }
        }
        Err(ConnectError { failures })
    }

    fn order(&self) -> Vec<usize> {
        let count = self.hosts.len();
        if self.random_order {
            let mut order: Vec<usize> = (0..count).collect();
            order.shuffle(&mut rand::thread_rng());
            return order;
        }
        let first = self.preferred.load(Ordering::Relaxed) % count.max(1);
        (0..count).map(|offset| (first + offset) % count).collect()
    }
}

/// One configuration per host, each with that host's name or socket, address and port, and
/// every other setting of `config`. Without hosts (never, for a validated `database.url`),
/// `config` as it is.
fn split_hosts(config: &Config, hosts: &[DatabaseHost]) -> Vec<HostConfig> {
    if hosts.is_empty() {
        return vec![HostConfig {
            name: "(no host)".to_owned(),
            config: config.clone(),
        }];
    }
    hosts
        .iter()
        .map(|host| {
            let mut single = copy_settings(config);
            match &host.host {
                Some(HostName::Tcp(name)) => {
                    single.host(name);
                }
                Some(HostName::Socket(directory)) => {
                    single.host_path(directory);
                }
                None => {}
            }
            if let Some(address) = host.address {
                single.hostaddr(address);
            }
            single.port(host.port);
            HostConfig {
                name: host.to_string(),
                config: single,
            }
        })
        .collect()
}

/// Every setting of `config` but its hosts, addresses and ports.
fn copy_settings(config: &Config) -> Config {
    let mut copy = Config::new();
    if let Some(user) = config.get_user() {
        copy.user(user);
    }
    if let Some(password) = config.get_password() {
        copy.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        copy.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        copy.options(options);
    }
    if let Some(name) = config.get_application_name() {
        copy.application_name(name);
    }
    if let Some(timeout) = config.get_connect_timeout() {
        copy.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        copy.tcp_user_timeout(*timeout);
    }
    copy.ssl_mode(config.get_ssl_mode())
        .ssl_negotiation(config.get_ssl_negotiation())
        .keepalives(config.get_keepalives())
        .keepalives_idle(config.get_keepalives_idle())
        .target_session_attrs(config.get_target_session_attrs())
        .channel_binding(config.get_channel_binding());
    if let Some(interval) = config.get_keepalives_interval() {
        copy.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        copy.keepalives_retries(retries);
    }
    copy
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DatabaseUrl;
    use tokio_postgres::config::{Host, TargetSessionAttrs};

    fn connector_for(url: &str) -> Connector {
        let url = DatabaseUrl::parse(url).unwrap();
        let tls = crate::tls::client_config(crate::tls::ServerVerification::None, None).unwrap();
        Connector::new(
            url.connection(),
            url.hosts(),
            MakeRustlsConnect::new(tls),
            Duration::from_secs(1),
        )
    }

    fn names(connector: &Connector) -> Vec<&str> {
        connector
            .hosts
            .iter()
            .map(|host| host.name.as_str())
            .collect()
    }

    #[test]
    fn splits_hosts_keeping_every_other_setting() {
        let connector = connector_for(
            "postgres://app:secret@db1:5433,db2:5434/billing?target_session_attrs=read-write&application_name=x",
        );
        assert_eq!(names(&connector), ["db1:5433", "db2:5434"]);
        for (host, name) in connector.hosts.iter().zip(["db1", "db2"]) {
            let config = &host.config;
            assert_eq!(config.get_hosts(), [Host::Tcp(name.into())]);
            assert_eq!(config.get_user(), Some("app"));
            assert_eq!(config.get_password(), Some(&b"secret"[..]));
            assert_eq!(config.get_dbname(), Some("billing"));
            assert_eq!(config.get_application_name(), Some("x"));
            assert_eq!(
                config.get_target_session_attrs(),
                TargetSessionAttrs::ReadWrite
            );
        }
    }

    #[test]
    fn one_port_serves_every_host() {
        let connector = connector_for("host=a,b port=6000 dbname=x");
        assert_eq!(names(&connector), ["a:6000", "b:6000"]);
    }

    #[test]
    fn hosts_are_named_from_the_parsed_url_only() {
        let connector = connector_for(
            "postgres://app:pw@[::1]:5433,%2Fvar%2Frun%2Fpostgresql/x?target_session_attrs=read-write",
        );
        assert_eq!(
            names(&connector),
            ["[::1]:5433", "/var/run/postgresql:5432"]
        );
        let addresses = connector_for("hostaddr=10.0.0.1,10.0.0.2 port=5433 dbname=x");
        assert_eq!(names(&addresses), ["10.0.0.1:5433", "10.0.0.2:5433"]);
        assert_eq!(
            addresses.hosts[1].config.get_hostaddrs(),
            ["10.0.0.2".parse::<std::net::IpAddr>().unwrap()]
        );
    }

    #[test]
    fn tries_the_host_that_answered_last_first() {
        let connector = connector_for("host=a,b,c dbname=x");
        assert_eq!(connector.order(), vec![0, 1, 2]);
        connector.preferred.store(2, Ordering::Relaxed);
        assert_eq!(connector.order(), vec![2, 0, 1]);
    }
}
