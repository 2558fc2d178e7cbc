//! Creating the database and applying the embedded migrations (then distributing the write
//! tables where the database has Citus), at start or by `retrysafe migrate`.

use std::time::Duration;

use tokio_postgres::Client;

use super::connect::{ConnectError, Connection, Connector};
use super::topology::citus;
use super::{base_pg_config, connector, quote_identifier, sqlstate, StorageError};
use crate::config::DatabaseConfig;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// Serializes migrations across daemons that start together on one database.
const MIGRATION_LOCK_ID: i64 = 0x7265_7472_7973_6166; // "retrysaf"

/// Creates the database named in the URL, connecting to the `postgres` maintenance database as
/// the same role. Only called when connecting to it said it does not exist (3D000), so a role
/// that may not connect to `postgres` starts fine against a database that exists.
async fn create_database(connector: &Connector) -> Result<(), StorageError> {
    let name = connector
        .dbname()
        .ok_or_else(|| StorageError::from(anyhow::anyhow!("database.url names no database")))?;
    let maintenance = connector.for_database("postgres").connect().await?;
    let statement = format!("CREATE DATABASE {}", quote_identifier(&name));
    let created = maintenance.client.batch_execute(&statement).await;
    maintenance.close(true);
    match created {
        Ok(()) => tracing::info!(database = %name, "created database"),
        // Another daemon created it at the same moment.
        Err(error) if sqlstate::is_duplicate_database(&error) => {}
        Err(error) => return Err(error.into()),
    }
    Ok(())
}

/// Creates the database if it does not exist, then applies the embedded migrations it does not
/// have yet. Migrations run without the pool's statement and lock timeouts and without a
/// client-side deadline: building an index on a large table, or waiting for another daemon's
/// migration, may take longer (systemd's start timeout bounds a start that hangs here).
/// Connecting is bounded as everywhere: each host within `database.connect_timeout`.
pub async fn migrate(settings: &DatabaseConfig) -> Result<Migrated, StorageError> {
    let connector = connector(settings, base_pg_config(settings), settings.url.hosts())?;
    let deadline = tokio::time::Instant::now() + settings.start_timeout;
    let mut connection = match connect_at_start(&connector, deadline).await {
        Ok(connection) => connection,
        Err(error) if error.is_invalid_catalog_name() => {
            create_database(&connector).await?;
            connect_at_start(&connector, deadline).await?
        }
        Err(error) => return Err(error.into()),
    };
    let result = apply_migrations(&mut connection.client).await;
    connection.close(result.is_ok());
    let migrated = result?;
    if migrated.applied > 0 {
        tracing::info!(applied = migrated.applied, "applied migrations");
    }
    Ok(migrated)
}

/// What [`migrate`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Migrated {
    /// Migrations applied.
    pub applied: usize,
    /// Tables it distributed over Citus's workers (none on a single server, or where they were
    /// already).
    pub distributed: Vec<&'static str>,
}

/// First and longest wait between two connection attempts at start.
const FIRST_START_RETRY: Duration = Duration::from_millis(250);
const MAX_START_RETRY: Duration = Duration::from_secs(5);

/// Connects at start, waiting for a database that is not there yet: unreachable, starting up,
/// or with every connection slot taken (a start that exits at once on those makes systemd
/// restart the daemon in a loop, and a burst of other clients stop it). Each attempt is bounded
/// by `database.connect_timeout`; a failure that only the configuration can fix
/// (authentication, TLS, a missing database) is returned at once, and so is the last failure
/// once no attempt fits before `deadline` (`database.start_timeout`).
async fn connect_at_start(
    connector: &Connector,
    deadline: tokio::time::Instant,
) -> Result<Connection, ConnectError> {
    let mut delay = FIRST_START_RETRY;
    loop {
        match connector.connect().await {
            Ok(connection) => return Ok(connection),
            Err(error) if error.is_transient() && tokio::time::Instant::now() < deadline => {
                let wait = delay.min(deadline - tokio::time::Instant::now());
                tracing::warn!(
                    error = %error,
                    retry_in = %humantime::format_duration(wait),
                    "waiting for the database at start (database.start_timeout bounds the wait)"
                );
                tokio::time::sleep(wait).await;
                delay = (delay * 2).min(MAX_START_RETRY);
            }
            Err(error) => return Err(error),
        }
    }
}

/// Applies the migrations, then distributes the write tables where the database has Citus
/// ([`citus::distribute`]), under one advisory lock. Refuses a node of a Citus cluster that is
/// not its coordinator ([`citus::refuse_worker`]): the migrations' history and the tables'
/// distribution are the coordinator's.
async fn apply_migrations(client: &mut Client) -> Result<Migrated, StorageError> {
    citus::refuse_worker(client).await?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_ID])
        .await?;
    let report = embedded::migrations::runner()
        .run_async(client)
        .await
        .map_err(|error| {
            StorageError::from(anyhow::anyhow!(
                "migration failed: {}",
                describe_migration_error(&error)
            ))
        });
    let distributed = match &report {
        Ok(_) => citus::distribute(client).await,
        Err(_) => Ok(Vec::new()),
    };
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_ID])
        .await?;
    Ok(Migrated {
        distributed: distributed?,
        applied: report?.applied_migrations().len(),
    })
}

/// What made a migration fail, in PostgreSQL's words where it was PostgreSQL: the migration,
/// then the server's message, its detail and its SQLSTATE (refinery's own text ends in
/// tokio-postgres's bare "db error").
fn describe_migration_error(error: &refinery::Error) -> String {
    let refinery::error::Kind::Connection(what, cause) = error.kind() else {
        return error.to_string();
    };
    let Some(pg) = cause.downcast_ref::<tokio_postgres::Error>() else {
        return format!("{what}: {cause}");
    };
    match pg.as_db_error() {
        Some(db) => {
            let detail = db.detail().map(|d| format!(" ({d})")).unwrap_or_default();
            format!(
                "{what}: {}{detail} (SQLSTATE {})",
                db.message(),
                db.code().code()
            )
        }
        None => format!("{what}: {}", sqlstate::describe(pg)),
    }
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
