//! The one place where PostgreSQL and pool errors become domain errors.

use std::sync::Arc;

use tokio_postgres::error::SqlState;

use crate::db::blocked::Blocker;

/// What a storage failure means to a caller.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StorageError {
    /// The database cannot be reached, is shutting down, or did not answer in time. Nothing was
    /// written (or, if a commit's outcome was lost, the record guards a retry); retry later.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The server cancelled a statement that ran past `statement_timeout` (57014). A smaller
    /// batch may succeed where a large one did not. The connection is not used again: on Citus
    /// the node that planned the statement answers before it has cancelled the statement's
    /// work on the other nodes, and the cancel waits on a node that does not answer (a hung
    /// worker), holding up whatever the connection is asked next.
    #[error("statement timeout: {0}")]
    StatementTimeout(String),
    /// A deadlock or serialization failure: the transaction may simply be run again.
    #[error("transaction conflict: {0}")]
    Retryable(String),
    /// The statement failed because of the data it was given (SQLSTATE classes 22 and 23).
    #[error("data rejected by the database: {0}")]
    DataRejected(String),
    /// The database takes no writes until an operator acts ([`Blocker`]: disk full, read-only,
    /// no free connection). Certain: nothing was written.
    #[error("{description}: {1}", description = .0.describe())]
    CannotWrite(Blocker, String),
    /// Anything else: a bug, or a database in a state the daemon does not expect.
    #[error("{0:#}")]
    Other(Arc<anyhow::Error>),
}

impl From<anyhow::Error> for StorageError {
    fn from(error: anyhow::Error) -> Self {
        StorageError::Other(Arc::new(error))
    }
}

impl From<tokio_postgres::Error> for StorageError {
    fn from(error: tokio_postgres::Error) -> Self {
        classify(error)
    }
}

impl From<crate::db::connect::ConnectError> for StorageError {
    fn from(error: crate::db::connect::ConnectError) -> Self {
        match error.blocker() {
            Some(blocker) => StorageError::CannotWrite(blocker, error.to_string()),
            None => StorageError::Unavailable(error.to_string()),
        }
    }
}

impl StorageError {
    /// The kind of failure in one word, for `/readyz`, logs and metrics labels.
    pub fn class(&self) -> &'static str {
        match self {
            StorageError::Unavailable(_) => "unavailable",
            StorageError::StatementTimeout(_) => "statement_timeout",
            StorageError::Retryable(_) => "conflict",
            StorageError::DataRejected(_) => "data_rejected",
            StorageError::CannotWrite(blocker, _) => blocker.as_str(),
            StorageError::Other(_) => "other",
        }
    }

    /// Whether the connection that raised this error may be used again: the server answered
    /// (and the transaction, if any, is rolled back). After an `Unavailable` error the
    /// connection's state is unknown, or it is on a server that cannot take writes (a demoted
    /// primary answers 25006), so it is dropped; so it is after a statement timeout (see
    /// [`StorageError::StatementTimeout`]).
    pub fn leaves_connection_usable(&self) -> bool {
        !matches!(
            self,
            StorageError::Unavailable(_)
                | StorageError::StatementTimeout(_)
                | StorageError::CannotWrite(Blocker::ReadOnly | Blocker::NoConnections, _)
        )
    }
}

fn classify(error: tokio_postgres::Error) -> StorageError {
    let Some(code) = error.code() else {
        // No SQLSTATE: the connection failed, closed, or timed out.
        return StorageError::Unavailable(describe(&error));
    };
    let text = describe(&error);
    if *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED {
        return StorageError::Retryable(text);
    }
    if *code == SqlState::QUERY_CANCELED {
        return StorageError::StatementTimeout(text);
    }
    if let Some(blocker) = blocker_of(code) {
        return StorageError::CannotWrite(blocker, text);
    }
    let class = &code.code()[..2];
    match class {
        "22" | "23" => StorageError::DataRejected(text),
        // 08: connection exception; 53: insufficient resources; 57: operator intervention
        // (57P01 is an admin shutdown); 58: system error.
        "08" | "53" | "57" | "58" => StorageError::Unavailable(text),
        // 55P03: lock_not_available (lock_timeout).
        _ if *code == SqlState::LOCK_NOT_AVAILABLE => StorageError::Unavailable(text),
        _ => StorageError::from(anyhow::Error::new(error)),
    }
}

/// The SQLSTATEs that say the database takes no writes until an operator acts. 25006
/// (read_only_sql_transaction) is also what a demoted primary answers during a failover: the
/// write must go to the new primary, on a new connection (so the connection is dropped), and
/// the daemon calls itself unready only if it lasts ([`Blocker`]).
pub fn blocker_of(code: &SqlState) -> Option<Blocker> {
    if *code == SqlState::DISK_FULL {
        Some(Blocker::DiskFull)
    } else if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        Some(Blocker::ReadOnly)
    } else if *code == SqlState::TOO_MANY_CONNECTIONS {
        Some(Blocker::NoConnections)
    } else {
        None
    }
}

/// The error as one line: the server's message and SQLSTATE, or the client-side cause chain.
pub fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => {
            let mut text = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            text
        }
    }
}

pub fn is_duplicate_database(error: &tokio_postgres::Error) -> bool {
    matches!(error.code(), Some(code) if *code == SqlState::DUPLICATE_DATABASE || *code == SqlState::UNIQUE_VIOLATION)
}

pub fn is_invalid_catalog_name(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&SqlState::INVALID_CATALOG_NAME)
}

pub fn is_undefined_table(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&SqlState::UNDEFINED_TABLE)
}
