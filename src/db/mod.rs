//! PostgreSQL: the connection pool, creating the database, migrations, and SQLSTATE mapping.

pub mod sqlstate;

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::str::FromStr;
use std::time::Duration;

use bb8_postgres::PostgresConnectionManager;
use tokio_postgres::{Client, NoTls, Statement};

use crate::config::DatabaseSettings;
pub use sqlstate::StorageError;

pub type PgPool = bb8::Pool<Manager>;

/// A pooled connection that keeps the statements prepared on it, so that a hot statement is
/// parsed and planned once per connection instead of once per use.
pub struct PgClient {
    client: Client,
    statements: HashMap<&'static str, Statement>,
}

impl PgClient {
    /// The prepared statement for `sql`, preparing it on first use.
    pub async fn prepare_cached(
        &mut self,
        sql: &'static str,
    ) -> Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).await?;
        self.statements.insert(sql, statement.clone());
        Ok(statement)
    }
}

impl Deref for PgClient {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl DerefMut for PgClient {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.client
    }
}

/// bb8-postgres's manager, with a statement cache on each connection.
pub struct Manager(PostgresConnectionManager<NoTls>);

impl bb8::ManageConnection for Manager {
    type Connection = PgClient;
    type Error = tokio_postgres::Error;

    async fn connect(&self) -> Result<PgClient, tokio_postgres::Error> {
        Ok(PgClient {
            client: self.0.connect().await?,
            statements: HashMap::new(),
        })
    }

    async fn is_valid(&self, connection: &mut PgClient) -> Result<(), tokio_postgres::Error> {
        self.0.is_valid(&mut connection.client).await
    }

    fn has_broken(&self, connection: &mut PgClient) -> bool {
        self.0.has_broken(&mut connection.client)
    }
}

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// Serializes migrations across daemons that start together on one database.
const MIGRATION_LOCK_ID: i64 = 0x7265_7472_7973_6166; // "retrysaf"

/// Parses `database.url` and applies what every connection needs: a connect timeout, an
/// application name, and TCP keepalives so that dead peers behind a cut network are noticed.
fn base_pg_config(settings: &DatabaseSettings) -> Result<tokio_postgres::Config, StorageError> {
    let mut config = tokio_postgres::Config::from_str(&settings.url)
        .map_err(|error| StorageError::from(anyhow::anyhow!("database.url: {error}")))?;
    config.connect_timeout(settings.connect_timeout.0);
    if config.get_application_name().is_none() {
        config.application_name("retrysafe");
    }
    config.keepalives_idle(Duration::from_secs(30));
    config.tcp_user_timeout(settings.statement_timeout.0 + settings.connect_timeout.0);
    Ok(config)
}

/// A transaction left open this long (a stuck relay, say) is ended by the server, so that it
/// cannot hold its row locks and block vacuum indefinitely.
const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(300);

/// The pool's connections: the base settings, and server-side bounds on every statement.
pub fn pg_config(settings: &DatabaseSettings) -> Result<tokio_postgres::Config, StorageError> {
    let mut config = base_pg_config(settings)?;
    // A statement that waits past this (for a lock held by a stuck session, say) is cancelled,
    // so that a request fails with 503 instead of hanging.
    let timeout_ms = settings.statement_timeout.0.as_millis();
    let idle_ms = IDLE_IN_TRANSACTION_TIMEOUT.as_millis();
    let options = format!(
        "-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms} -c idle_in_transaction_session_timeout={idle_ms}"
    );
    let options = match config.get_options() {
        Some(existing) => format!("{existing} {options}"),
        None => options,
    };
    config.options(&options);
    Ok(config)
}

/// Builds the pool without connecting: connections are opened on demand, so a database that is
/// down at this moment makes requests fail with 503 until it is back, not the daemon exit.
pub fn build_pool(settings: &DatabaseSettings) -> Result<PgPool, StorageError> {
    let manager = Manager(PostgresConnectionManager::new(pg_config(settings)?, NoTls));
    Ok(bb8::Pool::builder()
        .max_size(settings.pool_size)
        .min_idle(Some(1))
        .connection_timeout(settings.connect_timeout.0)
        .idle_timeout(Some(Duration::from_secs(600)))
        .test_on_check_out(false)
        .build_unchecked(manager))
}

/// Creates the database named in the URL, connecting to the `postgres` maintenance database as
/// the same role. Only called when connecting to it said it does not exist (3D000), so a role
/// that may not connect to `postgres` starts fine against a database that exists.
async fn create_database(config: &tokio_postgres::Config) -> Result<(), StorageError> {
    let name = config
        .get_dbname()
        .map(str::to_owned)
        .or_else(|| config.get_user().map(str::to_owned))
        .ok_or_else(|| StorageError::from(anyhow::anyhow!("database.url names no database")))?;
    let mut maintenance = config.clone();
    maintenance.dbname("postgres");
    let (client, connection) = maintenance.connect(NoTls).await?;
    let connection = tokio::spawn(connection);
    let statement = format!("CREATE DATABASE {}", quote_identifier(&name));
    match client.batch_execute(&statement).await {
        Ok(()) => tracing::info!(database = %name, "created database"),
        // Another daemon created it at the same moment.
        Err(error) if sqlstate::is_duplicate_database(&error) => {}
        Err(error) => return Err(error.into()),
    }
    drop(client);
    let _ = connection.await;
    Ok(())
}

/// Creates the database if it does not exist, then applies the embedded migrations it does not
/// have yet. Migrations run without the pool's statement and lock timeouts: building an index
/// on a large table, or waiting for another daemon's migration, may take longer.
pub async fn migrate(settings: &DatabaseSettings) -> Result<usize, StorageError> {
    let config = base_pg_config(settings)?;
    let (mut client, connection) = match config.connect(NoTls).await {
        Ok(connected) => connected,
        Err(error) if sqlstate::is_invalid_catalog_name(&error) => {
            create_database(&config).await?;
            config.connect(NoTls).await?
        }
        Err(error) => return Err(error.into()),
    };
    let connection = tokio::spawn(connection);
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_ID])
        .await?;
    let report = embedded::migrations::runner()
        .run_async(&mut client)
        .await
        .map_err(|error| StorageError::from(anyhow::anyhow!("migration failed: {error}")));
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_ID])
        .await?;
    drop(client);
    let _ = connection.await;
    let applied = report?.applied_migrations().len();
    if applied > 0 {
        tracing::info!(applied, "applied migrations");
    }
    Ok(applied)
}

/// The newest migration this build carries.
pub fn latest_migration_version() -> i64 {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|migration| i64::from(migration.version()))
        .max()
        .unwrap_or(0)
}

/// Whether the database answers and has every migration this build needs.
pub async fn migrations_applied(connection: &Client) -> Result<bool, StorageError> {
    let row = connection
        .query_one(
            "SELECT coalesce(max(version), 0)::bigint FROM refinery_schema_history",
            &[],
        )
        .await;
    match row {
        Ok(row) => Ok(row.get::<_, i64>(0) >= latest_migration_version()),
        Err(error) if sqlstate::is_undefined_table(&error) => Ok(false),
        Err(error) => Err(error.into()),
    }
}

/// Quotes an SQL identifier, doubling embedded quotes.
pub fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
