//! Citus: the write tables distributed by `client_id` over a coordinator's workers
//! (docs/scaling.md).
//!
//! When the database has the `citus` extension, [`distribute`] (run by every migration, at start
//! and by `retrysafe migrate`) makes the write tables distributed tables, co-located, and the
//! small shared table a reference table; a database moved from a single server is distributed
//! by the same command. The daemon then learns which shard holds each client ([`ShardMap`],
//! read from Citus's metadata and read again every [`SHARD_MAP_REFRESH`], so that a shard
//! moved or split is followed): a write batch takes the writes of one shard only, so that it
//! is a single-shard transaction, and relays and the janitor work a shard at a time.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_postgres::Client;

use crate::db::outbox_state::not_done;
use crate::db::{Database, StorageError};

/// The tables distributed by `client_id`, co-located with the first: every write is a
/// transaction on one shard of each.
pub const DISTRIBUTED_TABLES: [&str; 6] = [
    "idempotency_records",
    "entries",
    "outbox_events",
    "ordering_keys",
    "outbox_skips",
    "event_replays",
];

/// The tables every node holds whole: `replays` (an operator's replay, which `event_replays`
/// refers to). `admin_actions`, `processed_events` and the migrations' history stay on the
/// coordinator: nothing distributed refers to them.
pub const REFERENCE_TABLES: [&str; 1] = ["replays"];

/// Begins a transaction whose statements Citus plans with their parameters' values. A
/// statement prepared once per connection is run with a generic plan after five runs, and
/// Citus cannot route a generic plan of an `INSERT ... SELECT` (or of some updates) to the
/// shards its parameters name: it sends it to every shard, in a two-phase commit. Planned with
/// the values, each statement reads and writes its one shard.
pub const BEGIN_WITH_VALUES: &str = "BEGIN; SET LOCAL plan_cache_mode = force_custom_plan";

/// How often the daemon reads again which shard holds which client.
pub const SHARD_MAP_REFRESH: Duration = Duration::from_secs(30);

/// Makes the tables above distributed (and reference) tables where the database has the
/// `citus` extension and they are not yet; returns those it distributed. A table that
/// holds rows (a database restored from a single server) is copied into its shards, in this
/// transaction. Nothing on a database without Citus.
pub async fn distribute(client: &mut Client) -> Result<Vec<&'static str>, StorageError> {
    if !has_citus(client).await? {
        return Ok(Vec::new());
    }
    let transaction = client.transaction().await?;
    // Creating shards of tables that already hold rows in one transaction: Citus asks for the
    // sequential mode then (one connection per worker, which sees every shard it created).
    transaction
        .batch_execute(super::ONE_CONNECTION_PER_WORKER)
        .await?;
    let mut distributed = Vec::new();
    for table in REFERENCE_TABLES {
        if !is_reference(&transaction, table).await? {
            transaction
                .execute(
                    "SELECT create_reference_table($1::text::regclass)",
                    &[&table],
                )
                .await?;
            distributed.push(table);
        }
    }
    for (index, table) in DISTRIBUTED_TABLES.iter().enumerate() {
        if is_distributed(&transaction, table).await? {
            continue;
        }
        let colocate_with = if index == 0 {
            "default"
        } else {
            DISTRIBUTED_TABLES[0]
        };
        transaction
            .execute(
                "SELECT create_distributed_table($1::text::regclass, 'client_id', colocate_with => $2)",
                &[table, &colocate_with],
            )
            .await?;
        distributed.push(table);
    }
    // Once every table is distributed: a foreign key between them is then between shards.
    for table in &distributed {
        drop_local_copy(&transaction, table).await?;
    }
    transaction.commit().await?;
    if !distributed.is_empty() {
        tracing::info!(
            tables = %distributed.join(", "),
            "distributed the tables by client_id, replays as a reference table (citus)"
        );
    }
    Ok(distributed)
}

/// Empties the coordinator's own copy of the rows a table held before it was distributed
/// (Citus copies them into the shards and leaves them in place, where they take disk and are
/// never read again).
async fn drop_local_copy(
    client: &impl tokio_postgres::GenericClient,
    table: &str,
) -> Result<(), StorageError> {
    client
        .execute(
            "SELECT truncate_local_data_after_distributing_table($1::text::regclass)",
            &[&table],
        )
        .await?;
    Ok(())
}

/// Whether the database has the `citus` extension.
async fn has_citus(client: &impl tokio_postgres::GenericClient) -> Result<bool, StorageError> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')",
            &[],
        )
        .await?
        .get(0))
}

/// Whether `table` is distributed by hash (Citus's `h`).
async fn is_distributed(
    client: &impl tokio_postgres::GenericClient,
    table: &str,
) -> Result<bool, StorageError> {
    is_in_metadata(client, table, "partmethod = 'h'").await
}

/// Whether `table` is a reference table (on every node: Citus's `n` with replication `t`). A
/// table that refers to one becomes a "Citus local table" (`n`, `s`) by itself: not one of
/// these, and still to be distributed.
async fn is_reference(
    client: &impl tokio_postgres::GenericClient,
    table: &str,
) -> Result<bool, StorageError> {
    is_in_metadata(client, table, "partmethod = 'n' AND repmodel = 't'").await
}

async fn is_in_metadata(
    client: &impl tokio_postgres::GenericClient,
    table: &str,
    kind: &str,
) -> Result<bool, StorageError> {
    let query = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = $1::text::regclass AND {kind})"
    );
    Ok(client.query_one(&query, &[&table]).await?.get(0))
}

/// A shard of the write tables: the shard id of `idempotency_records`' shard, which every
/// co-located table's shard of the same range goes with.
pub type ShardId = i64;

/// Whether the database of `db` has its write tables distributed by Citus.
pub async fn is_distributed_database(db: &Database) -> Result<bool, StorageError> {
    db.run(async |connection| {
        if !has_citus(&**connection).await? {
            return Ok(false);
        }
        is_distributed(&**connection, DISTRIBUTED_TABLES[0]).await
    })
    .await
}

/// Which shard holds each client's rows, and which node holds each shard, as Citus's metadata
/// said at the last reading.
#[derive(Debug, Clone, Default)]
pub struct ShardMap {
    inner: Arc<RwLock<Shards>>,
    /// The clients always read (the configured ones), beside those found in the database.
    configured: Arc<[String]>,
}

#[derive(Debug, Default)]
struct Shards {
    by_client: HashMap<String, ShardId>,
    nodes: HashMap<ShardId, String>,
}

/// The shard of each client, and the node of each shard.
const SHARDS_OF: &str = "
SELECT c.client_id, s.shardid, p.nodename || ':' || p.nodeport
FROM unnest($1::text[]) AS c(client_id)
    CROSS JOIN LATERAL (
        SELECT get_shard_id_for_distribution_column('idempotency_records', c.client_id) AS shardid
    ) s
    JOIN pg_dist_shard_placement p ON p.shardid = s.shardid";

/// The clients with events not done or expired records: each shard groups its own (Citus
/// pushes a `GROUP BY` of the distribution column down to the shards), reading the partial
/// index of such events and the index of expiry times.
const CLIENTS_WITH_WORK: &str = concat!(
    "
SELECT client_id FROM outbox_events WHERE ",
    not_done!(),
    " GROUP BY client_id
UNION
SELECT client_id FROM idempotency_records WHERE expires_at <= now() GROUP BY client_id"
);

impl ShardMap {
    /// A map that reads `configured` at every refresh, and nothing yet.
    pub fn new(configured: &[String]) -> Self {
        Self {
            inner: Arc::default(),
            configured: configured.into(),
        }
    }

    pub fn shard_of(&self, client: &str) -> Option<ShardId> {
        self.read().by_client.get(client).copied()
    }

    pub fn node_of(&self, shard: ShardId) -> Option<String> {
        self.read().nodes.get(&shard).cloned()
    }

    /// The first (by name) of the known clients whose shard `node` holds.
    pub fn a_client_on(&self, node: &str) -> Option<String> {
        let shards = self.read();
        shards
            .by_client
            .iter()
            .filter(|(_, shard)| shards.nodes.get(shard).is_some_and(|at| at == node))
            .map(|(client, _)| client)
            .min()
            .cloned()
    }

    /// The clients known so far, by shard.
    pub fn clients_by_shard(&self) -> BTreeMap<ShardId, Vec<String>> {
        let mut grouped: BTreeMap<ShardId, Vec<String>> = BTreeMap::new();
        for (client, shard) in &self.read().by_client {
            grouped.entry(*shard).or_default().push(client.clone());
        }
        for clients in grouped.values_mut() {
            clients.sort_unstable();
        }
        grouped
    }

    /// Reads the shards, and their nodes, of the configured clients, of every client known
    /// already, and of the clients found with work in the database (unsent events, expired
    /// records): a client no longer configured may still have some, which relays and the
    /// janitor must reach.
    pub async fn refresh(&self, db: &Database) -> Result<(), StorageError> {
        let found = db
            .run(async |connection| {
                Ok(connection
                    .query(CLIENTS_WITH_WORK, &[])
                    .await?
                    .iter()
                    .map(|row| row.get::<_, String>(0))
                    .collect::<Vec<_>>())
            })
            .await?;
        let mut all: Vec<String> = self.read().by_client.keys().cloned().collect();
        all.extend(self.configured.iter().cloned());
        all.extend(found);
        all.sort_unstable();
        all.dedup();
        let rows = db
            .run(async |connection| Ok(connection.query(SHARDS_OF, &[&all]).await?))
            .await?;
        let mut shards = Shards::default();
        for row in rows {
            let shard: ShardId = row.get(1);
            shards.by_client.insert(row.get(0), shard);
            shards.nodes.insert(shard, row.get(2));
        }
        *self
            .inner
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = shards;
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Shards> {
        // Replaced whole by `refresh`: a panic elsewhere cannot leave it half-written.
        self.inner
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
