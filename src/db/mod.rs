//! PostgreSQL: the connection pool, creating the database, migrations, and SQLSTATE mapping.
//!
//! Every operation on the database goes through [`Database::run`], which bounds it on the
//! client's side: a server that stops answering (a hung host, a paused VM) enforces no
//! `statement_timeout`, and an operation waiting on it would hold its pooled connection for
//! ever. A connection whose operation passed its deadline, or that failed in a way that leaves
//! its state unknown, is dropped, never returned to the pool.

pub mod blocked;
pub mod clock;
pub mod connect;
mod migrate;
pub mod outbox_state;
pub mod sqlstate;
pub mod tls;
pub mod topology;

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_postgres::{Client, Statement};

use crate::config::{self, DatabaseConfig};
pub use blocked::{Blocker, FailingWrites, WriteHealth};
pub use clock::DatabaseClock;
use connect::{ConnectError, Connection, Connector};
pub use migrate::{latest_migration_version, migrate, migrations_applied, Migrated};
pub use sqlstate::StorageError;

pub type PgPool = bb8::Pool<Manager>;

/// Added to `database.statement_timeout` for the client-side deadline of an operation: the
/// server's own timeout should fire first, and the client's only when the server cannot.
const DEADLINE_MARGIN: Duration = Duration::from_secs(2);

/// A pooled connection that keeps the statements prepared on it, so that a hot statement is
/// parsed and planned once per connection instead of once per use.
pub struct PgClient {
    connection: Option<Connection>,
    /// Prepared statements by the address and length of their SQL text (a `&'static str`):
    /// hashing the text itself, some of it over a kilobyte, took longer than the lookup saves.
    statements: HashMap<(usize, usize), Statement>,
    /// Set while an operation runs; cleared when it ends with an answer from the server. A
    /// connection left in doubt (its operation abandoned at its deadline, or failed without a
    /// clear answer) is discarded by the pool.
    in_doubt: bool,
    /// The pool's generation when the connection was opened; see [`Generation`].
    generation: u64,
    pool_generation: Generation,
}

/// A pool's generation: raised when a commit on one of its connections was not confirmed by a
/// synchronous standby. That server may be an old primary cut off from the formation (paused,
/// then resumed after its standby was promoted), which still takes writes, commits them
/// locally and loses them when it is demoted: every connection opened before is discarded
/// instead of being used again.
#[derive(Debug, Clone, Default)]
struct Generation(Arc<AtomicU64>);

impl Generation {
    fn current(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl PgClient {
    /// How many WARNING notices this connection's server has sent; see
    /// [`confirm_commit`](Self::confirm_commit).
    pub fn warnings(&self) -> u64 {
        self.connection
            .as_ref()
            .map_or(0, connect::Connection::warnings)
    }

    /// Checks a commit that just returned, given [`warnings`](Self::warnings) from before it was
    /// sent; the commit must have been a simple query (`COMMIT`), whose answer follows the
    /// commit's warnings. A server whose wait for its synchronous standby is cancelled
    /// (`pg_cancel_backend`, as pg_auto_failover does when it disables synchronous
    /// replication) answers the commit with success and a WARNING: "committed locally, but
    /// might not have been replicated to the standby". Such a commit is not durable: a
    /// failover to that standby loses it. So it counts as
    /// unavailable (503: the client retries, and the retry is judged by the record wherever
    /// it survives), the connection is discarded, and so is every other connection of the
    /// pool opened before it.
    pub fn confirm_commit(&mut self, warnings_before: u64) -> Result<(), StorageError> {
        if self.warnings() == warnings_before {
            return Ok(());
        }
        let warning = self
            .connection
            .as_ref()
            .map(connect::Connection::last_warning)
            .unwrap_or_default();
        self.in_doubt = true;
        self.pool_generation
            .0
            .fetch_max(self.generation + 1, Ordering::SeqCst);
        metrics::counter!(crate::metric::DB_UNCONFIRMED_COMMITS).increment(1);
        Err(StorageError::Unavailable(format!(
            "the database warned about a commit, which may not be durable (not confirmed by a synchronous standby?), so it is not acknowledged: {warning}"
        )))
    }

    /// The prepared statement for `sql`, preparing it on first use.
    pub async fn prepare_cached(
        &mut self,
        sql: &'static str,
    ) -> Result<Statement, tokio_postgres::Error> {
        let key = (sql.as_ptr() as usize, sql.len());
        if let Some(statement) = self.statements.get(&key) {
            return Ok(statement.clone());
        }
        let statement = self.client().prepare(sql).await?;
        self.statements.insert(key, statement.clone());
        Ok(statement)
    }

    fn client(&self) -> &Client {
        // Only `Drop` takes the connection out.
        &self
            .connection
            .as_ref()
            .expect("a live PgClient has its connection")
            .client
    }
}

impl Drop for PgClient {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            connection.close(!self.in_doubt);
        }
    }
}

impl Deref for PgClient {
    type Target = Client;

    fn deref(&self) -> &Client {
        self.client()
    }
}

impl DerefMut for PgClient {
    fn deref_mut(&mut self) -> &mut Client {
        // Only `Drop` takes the connection out.
        &mut self
            .connection
            .as_mut()
            .expect("a live PgClient has its connection")
            .client
    }
}

/// How [`Database::split`] shares `database.pool_size`: (writes, reads).
fn split_sizes(pool_size: u32) -> (u32, u32) {
    let reads = (pool_size / 4).max(1);
    (pool_size - reads, reads)
}

/// The condition under which a commit on this session waits for a synchronous standby.
macro_rules! replication_promised {
    () => {
        "current_setting('synchronous_standby_names') <> ''
         AND current_setting('synchronous_commit') NOT IN ('off', 'local')"
    };
}

/// One WAL record (a logical decoding message, which no table holds), so that the commit of a
/// transaction that writes it is a real one, waited for by a synchronous standby.
macro_rules! barrier_record {
    () => {
        "pg_logical_emit_message(true, 'retrysafe', 'barrier')"
    };
}

/// Whether a commit on this session waits for a synchronous standby: what a commit is
/// promised to be durable as. Sent with other statements (in one round trip), it tells whether
/// a [`barrier`] is needed.
pub const REPLICATION_PROMISED: &str = concat!("SELECT ", replication_promised!());

/// A transaction that writes that record.
const BARRIER: &str = concat!("SELECT ", barrier_record!());

/// [`BARRIER`], written only where a commit waits for a synchronous standby
/// ([`REPLICATION_PROMISED`]), as one statement committed on its own: a barrier taken on a
/// Citus node through the coordinator ([`topology::citus::node_barrier`]).
pub const BARRIER_WHERE_PROMISED: &str = concat!(
    "SELECT CASE WHEN ",
    replication_promised!(),
    " THEN ",
    barrier_record!(),
    "::text ELSE 'no synchronous standby' END"
);

/// Waits until a synchronous standby has everything this session could read until now: a
/// commit of a transaction that writes one WAL record, checked as a write batch's commit is
/// ([`PgClient::confirm_commit`]). PostgreSQL shows a commit to other sessions once it is
/// flushed locally if its wait for the standby was cancelled (or the server crashed while
/// waiting), so a row read from the primary may be one the standby never gets; the standby
/// confirming this later commit confirms every earlier one, since it receives the WAL in
/// order. Call it after the reads, and only where [`REPLICATION_PROMISED`] said so: a
/// commit with nothing to wait for costs a WAL flush for nothing. Fails with
/// [`StorageError::Unavailable`] when the database warned about the commit (the standby did not
/// confirm it): what was read must then not be acted on as durable.
pub async fn barrier(connection: &mut PgClient) -> Result<(), StorageError> {
    let warnings = connection.warnings();
    let client: &Client = connection;
    let (begun, marked, committed) = tokio::join!(
        client.batch_execute("BEGIN"),
        client.batch_execute(BARRIER),
        client.batch_execute("COMMIT"),
    );
    begun?;
    marked?;
    committed?;
    connection.confirm_commit(warnings)
}

/// The pool's connection manager: connections from a [`Connector`] (each host in turn, each
/// attempt bounded), with a statement cache on each.
pub struct Manager {
    connector: Connector,
    generation: Generation,
}

impl bb8::ManageConnection for Manager {
    type Connection = PgClient;
    type Error = ConnectError;

    async fn connect(&self) -> Result<PgClient, ConnectError> {
        let generation = self.generation.current();
        Ok(PgClient {
            connection: Some(self.connector.connect().await?),
            statements: HashMap::new(),
            in_doubt: false,
            generation,
            pool_generation: self.generation.clone(),
        })
    }

    async fn is_valid(&self, _connection: &mut PgClient) -> Result<(), ConnectError> {
        // Checkout tests are off (`test_on_check_out(false)`): a broken connection shows itself
        // on first use, and the operation's deadline bounds that.
        Ok(())
    }

    fn has_broken(&self, connection: &mut PgClient) -> bool {
        connection.in_doubt
            || connection.is_closed()
            || connection.generation < self.generation.current()
    }
}

/// Remembers the pool's last failed connection attempt, so that a request that timed out
/// waiting for a connection can say why none could be opened (and whether that is a
/// [`Blocker`]: no connection slot free).
#[derive(Debug, Clone, Default)]
struct LastConnectError(Arc<Mutex<Option<FailedAttempt>>>);

/// A failed connection attempt: in words, and the [`Blocker`] it was, if any.
type FailedAttempt = (String, Option<Blocker>);

impl bb8::ErrorSink<ConnectError> for LastConnectError {
    fn sink(&self, error: ConnectError) {
        tracing::debug!(error = %error, "database connection attempt failed");
        *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) =
            Some((error.to_string(), error.blocker()));
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<ConnectError>> {
        Box::new(self.clone())
    }
}

/// The pool and the bounds every operation on it gets.
#[derive(Clone)]
pub struct Database {
    pool: PgPool,
    max_size: u32,
    /// Client-side deadline of one operation once it has its connection.
    operation_timeout: Duration,
    /// Bound on waiting for a pooled connection (and on opening one, per host).
    connect_timeout: Duration,
    last_connect_error: LastConnectError,
    generation: Generation,
    /// What the pool was built from: what a pool to another node of a Citus cluster is built
    /// from too ([`for_node`](Self::for_node)).
    settings: Arc<DatabaseConfig>,
    /// A pool to one node of a Citus cluster: the node (`host:port`), which its unavailability
    /// errors name (a lost connection says nothing of where it went).
    node: Option<Arc<str>>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("max_size", &self.max_size)
            .field("state", &self.pool.state())
            .finish_non_exhaustive()
    }
}

impl Database {
    /// A pool of `database.pool_size` connections, for a command that runs alone.
    pub fn new(settings: &DatabaseConfig) -> Result<Self, StorageError> {
        Self::build(settings, settings.pool_size, None)
    }

    /// The daemon's two pools, which share `database.pool_size`: one for writers, relays and the
    /// janitor, and a quarter of it (at least one connection) for reads, readiness checks and
    /// the gauges, so that no flood of reads or probes can take the connections writes need.
    /// The reads' connections are named `<application_name> (reads)` in `pg_stat_activity`.
    pub fn split(settings: &DatabaseConfig) -> Result<(Self, Self), StorageError> {
        let (writes, reads) = split_sizes(settings.pool_size);
        Ok((
            Self::build(settings, writes, None)?,
            Self::build(settings, reads, Some(" (reads)"))?,
        ))
    }

    /// A pool as large as the writes' of [`split`](Self::split), to one node of a Citus cluster
    /// at `host` (a name or an address) and `port`, with every other setting of the
    /// configuration this pool was built from.
    pub fn for_node(&self, host: &str, port: u16) -> Result<Self, StorageError> {
        let node = config::DatabaseHost {
            host: Some(config::HostName::Tcp(host.to_owned())),
            address: None,
            port,
        };
        let settings = &self.settings;
        let (writes, _) = split_sizes(settings.pool_size);
        let mut pool = Self::build_to(settings, writes, None, &[node])?;
        pool.node = Some(Arc::from(format!("{host}:{port}")));
        Ok(pool)
    }

    /// The configuration the pool was built from.
    pub fn settings(&self) -> &DatabaseConfig {
        &self.settings
    }

    /// Builds the pool without connecting: connections are opened on demand, so a database that
    /// is down at this moment makes requests fail with 503 until it is back, not the daemon exit.
    fn build(
        settings: &DatabaseConfig,
        size: u32,
        name_suffix: Option<&str>,
    ) -> Result<Self, StorageError> {
        Self::build_to(settings, size, name_suffix, settings.url.hosts())
    }

    /// [`build`](Self::build), to `hosts` instead of `database.url`'s.
    fn build_to(
        settings: &DatabaseConfig,
        size: u32,
        name_suffix: Option<&str>,
        hosts: &[config::DatabaseHost],
    ) -> Result<Self, StorageError> {
        let mut config = pg_config(settings);
        if let Some(suffix) = name_suffix {
            let name = format!(
                "{}{suffix}",
                config.get_application_name().unwrap_or_default()
            );
            config.application_name(name);
        }
        let connector = connector(settings, config, hosts)?;
        let last_connect_error = LastConnectError::default();
        let generation = Generation::default();
        let pool = bb8::Pool::builder()
            .max_size(size)
            .min_idle(Some(1))
            .connection_timeout(settings.connect_timeout)
            .idle_timeout(Some(Duration::from_secs(600)))
            .test_on_check_out(false)
            .error_sink(Box::new(last_connect_error.clone()))
            .build_unchecked(Manager {
                connector,
                generation: generation.clone(),
            });
        Ok(Self {
            pool,
            max_size: size,
            operation_timeout: operation_timeout(settings),
            connect_timeout: settings.connect_timeout,
            last_connect_error,
            generation,
            settings: Arc::new(settings.clone()),
            node: None,
        })
    }

    /// The most connections this pool opens.
    pub fn max_size(&self) -> u32 {
        self.max_size
    }

    /// The client-side deadline of one operation: `database.statement_timeout` plus a margin.
    pub fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// The pool's state, for metrics.
    pub fn state(&self) -> bb8::State {
        self.pool.state()
    }

    /// Runs `work` on a pooled connection within [`operation_timeout`](Self::operation_timeout).
    pub async fn run<T>(
        &self,
        work: impl AsyncFnOnce(&mut PgClient) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        self.run_within(self.operation_timeout, work).await
    }

    /// Runs `work` on a pooled connection within `limit` (not counting the wait for the
    /// connection, bounded by `database.connect_timeout`). Past `limit`, `work` is abandoned,
    /// its connection dropped, and the answer is [`StorageError::Unavailable`]: if `work` was
    /// committing, the outcome is unknown, which that error's callers already allow for.
    pub async fn run_within<T>(
        &self,
        limit: Duration,
        work: impl AsyncFnOnce(&mut PgClient) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        self.run_on_pool(limit, work)
            .await
            .map_err(|error| self.naming_the_node(error))
    }

    /// `error`, naming this pool's node (on Citus) when it says the database is unavailable.
    fn naming_the_node(&self, error: StorageError) -> StorageError {
        match (error, &self.node) {
            (StorageError::Unavailable(reason), Some(node)) if !reason.contains(&**node) => {
                StorageError::Unavailable(format!("{node}: {reason}"))
            }
            (error, _) => error,
        }
    }

    async fn run_on_pool<T>(
        &self,
        limit: Duration,
        work: impl AsyncFnOnce(&mut PgClient) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let mut connection = self.checkout().await?;
        connection.in_doubt = true;
        let result = match tokio::time::timeout(limit, work(&mut connection)).await {
            Ok(result) => result,
            Err(_elapsed) => Err(StorageError::Unavailable(format!(
                "the database did not answer within {}",
                humantime::format_duration(limit)
            ))),
        };
        connection.in_doubt = match &result {
            Ok(_) => false,
            Err(error) => !error.leaves_connection_usable(),
        };
        result
    }

    /// Waits while the server answers, and returns why it stopped: a connection of its own
    /// (not the pool's, which may all be held by operations that wait on locks of a server that
    /// is merely busy), opened and asked `SELECT 1` every `database.connect_timeout`, within that
    /// time each. A hung server (stopped, paused, cut off with no reset) accepts TCP but answers
    /// nothing; one that is only slow answers at once, and so does one that refuses the new
    /// connection for a reason of its own (every slot taken: its operations in flight go on).
    /// Raced against an operation, this tells a hung server from a slow one sooner than the
    /// operation's deadline.
    pub async fn unresponsive(&self) -> StorageError {
        self.naming_the_node(self.until_unresponsive().await)
    }

    async fn until_unresponsive(&self) -> StorageError {
        loop {
            tokio::time::sleep(self.connect_timeout).await;
            let asked = tokio::time::timeout(self.connect_timeout, async {
                let connection = self.pool.dedicated_connection().await?;
                connection
                    .simple_query("SELECT 1")
                    .await
                    .map_err(|error| StorageError::Unavailable(error.to_string()))?;
                Ok::<(), StorageError>(())
            })
            .await;
            match asked {
                Ok(Ok(()) | Err(StorageError::CannotWrite(..))) => continue,
                Ok(Err(error)) => return error,
                Err(_elapsed) => {
                    return StorageError::Unavailable(format!(
                        "the database did not answer a new connection's SELECT 1 within {}",
                        humantime::format_duration(self.connect_timeout)
                    ));
                }
            }
        }
    }

    /// A pooled connection of the current [`Generation`]: idle connections opened before the
    /// generation was raised are discarded on the way (the pool checks that only when a
    /// connection is returned).
    async fn checkout(&self) -> Result<bb8::PooledConnection<'_, Manager>, StorageError> {
        loop {
            let mut connection = self.checkout_any().await?;
            if connection.generation >= self.generation.current() {
                return Ok(connection);
            }
            connection.in_doubt = true;
        }
    }

    async fn checkout_any(&self) -> Result<bb8::PooledConnection<'_, Manager>, StorageError> {
        self.pool.get().await.map_err(|error| match error {
            bb8::RunError::User(error) => StorageError::Unavailable(error.to_string()),
            bb8::RunError::TimedOut => {
                let waited = humantime::format_duration(self.connect_timeout);
                let last = self
                    .last_connect_error
                    .0
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .clone();
                match last {
                    Some((last, Some(blocker))) => StorageError::CannotWrite(
                        blocker,
                        format!("no database connection within {waited}; last attempt: {last}"),
                    ),
                    Some((last, None)) => StorageError::Unavailable(format!(
                        "no database connection within {waited}; last attempt: {last}"
                    )),
                    None => {
                        StorageError::Unavailable(format!("no database connection within {waited}"))
                    }
                }
            }
        })
    }
}

/// The client-side deadline of one operation: `database.statement_timeout` plus a margin.
pub fn operation_timeout(settings: &DatabaseConfig) -> Duration {
    settings.statement_timeout + DEADLINE_MARGIN
}

/// `database.url` as parsed by the validation, with what every connection needs: a connect
/// timeout, an application name, and TCP keepalives so that dead peers behind a cut network
/// are noticed. Its TLS mode (libpq's parameters, which tokio-postgres knows only a few of) is
/// the parsed URL's.
pub(super) fn base_pg_config(settings: &DatabaseConfig) -> tokio_postgres::Config {
    let mut config = settings.url.connection().clone();
    config.connect_timeout(settings.connect_timeout);
    if config.get_application_name().is_none() {
        config.application_name("retrysafe");
    }
    config.keepalives_idle(Duration::from_secs(30));
    config.tcp_user_timeout(settings.statement_timeout + settings.connect_timeout);
    config
}

/// A connector for `config`, to `hosts` (those of `database.url`, or a Citus node) with the TLS
/// `database.url` asks for. Fails when a TLS file cannot be used, naming the parameter and the
/// file.
pub(super) fn connector(
    settings: &DatabaseConfig,
    config: tokio_postgres::Config,
    hosts: &[config::DatabaseHost],
) -> Result<Connector, StorageError> {
    let tls = tls::connector(settings.url.tls())
        .map_err(|error| StorageError::from(anyhow::anyhow!("database.url: {error}")))?;
    Ok(Connector::new(
        &config,
        hosts,
        tls,
        settings.connect_timeout,
    ))
}

/// One connection to the database of `database.url`, as the daemon makes them (each host in
/// turn, TLS as the URL says), without the pool's statement bounds: for programs beside the
/// daemon, such as consumers using [`crate::inbox`].
pub async fn connect(settings: &DatabaseConfig) -> Result<Connection, StorageError> {
    Ok(
        connector(settings, base_pg_config(settings), settings.url.hosts())?
            .connect()
            .await?,
    )
}

/// A transaction left open this long (a stuck relay, say) is ended by the server, so that it
/// cannot hold its row locks and block vacuum indefinitely.
const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(300);

/// The pool's connections: the base settings, and server-side bounds on every statement.
fn pg_config(settings: &DatabaseConfig) -> tokio_postgres::Config {
    let mut config = base_pg_config(settings);
    // A statement that waits past this (for a lock held by a stuck session, say) is cancelled,
    // so that a request fails with 503 instead of hanging.
    let timeout_ms = settings.statement_timeout.as_millis();
    let idle_ms = IDLE_IN_TRANSACTION_TIMEOUT.as_millis();
    let options = format!(
        "-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms} -c idle_in_transaction_session_timeout={idle_ms}"
    );
    let options = match config.get_options() {
        Some(existing) => format!("{existing} {options}"),
        None => options,
    };
    config.options(&options);
    config
}

/// Quotes an SQL identifier, doubling embedded quotes.
pub fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
