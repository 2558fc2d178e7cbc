//! Citus: the write tables distributed by `client_id` over a coordinator's workers
//! (docs/scaling.md).
//!
//! When the database has the `citus` extension, [`distribute`] (run by every migration, at start
//! and by `retrysafe migrate`) makes the write tables distributed tables, co-located, and the
//! small shared table a reference table; a database moved from a single server is distributed
//! by the same command. The daemon then learns which shard holds each client and which node
//! holds each shard, and keeps a pool to each node ([`Cluster`], read from Citus's metadata and
//! read again every [`SHARD_MAP_REFRESH`], so that a shard moved or split is followed): a write
//! batch takes the writes of one shard only, so that it is a single-shard transaction, and
//! runs on that shard's node; relays and the janitor work a shard at a time, on its node too.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::config::NodeAddress;
use crate::db::{Database, PgClient, StorageError};

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

/// What a node of a Citus cluster is, by its metadata: the coordinator (group 0), or a worker,
/// named as the metadata names it, with the coordinator's address.
const NODE_ROLE: &str = "
SELECT citus_is_coordinator(),
       (SELECT nodename || ':' || nodeport FROM pg_dist_node
        WHERE groupid = (SELECT groupid FROM pg_dist_local_group) LIMIT 1),
       (SELECT nodename || ':' || nodeport FROM pg_dist_node WHERE groupid = 0 LIMIT 1)";

/// Refuses a database that is a worker of a Citus cluster (a `database.url` given a worker's
/// address): its migrations' history and the tables' distribution are the coordinator's, and
/// migrating there would apply the schema again. Says what it found and what to do.
pub async fn refuse_worker(client: &Client) -> Result<(), StorageError> {
    if !has_citus(client).await? {
        return Ok(());
    }
    let row = client.query_one(NODE_ROLE, &[]).await?;
    if row.get::<_, bool>(0) {
        return Ok(());
    }
    let this: Option<String> = row.get(1);
    let coordinator: Option<String> = row.get(2);
    Err(StorageError::from(anyhow::anyhow!(
        "database.url points at a worker of a Citus cluster (this node is {} in Citus's metadata; its coordinator is {}), not at the coordinator, where the migrations and the tables' distribution are kept: give database.url the coordinator's address (the daemon then sends each shard's statements to the node that holds it by itself)",
        this.as_deref().unwrap_or("not listed"),
        coordinator.as_deref().unwrap_or("not listed")
    )))
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

/// What the daemon knows of a Citus cluster, as its metadata said at the last reading: which
/// shard holds each client's rows and which node holds each shard, the clients each shard has
/// rows of, a pool to each node, and the outbox ids reserved for the writers
/// ([`IdBlocks`]).
#[derive(Debug)]
pub struct Cluster {
    /// `database.url`'s pool: the coordinator. The metadata is read there, ids are reserved
    /// there, and a node the daemon cannot reach directly is reached through it.
    coordinator: Database,
    /// `database.citus_direct`: statements go to the node that holds their shard.
    direct: bool,
    /// `database.citus_node_addresses`.
    addresses: Vec<NodeAddress>,
    /// The clients always read (the configured ones), beside those found in the database.
    configured: Arc<[String]>,
    state: RwLock<State>,
    pub ids: IdBlocks,
}

#[derive(Debug, Default)]
struct State {
    by_client: HashMap<String, ShardId>,
    /// The node (`host:port`, as Citus's metadata names it) of each shard with known clients.
    node_of: HashMap<ShardId, String>,
    nodes: HashMap<String, Node>,
}

/// A node of the cluster: a pool to it, and whether the daemon reaches it directly (it answered
/// there at a reading; see [`Cluster::reach_nodes`]).
#[derive(Debug, Clone)]
struct Node {
    db: Database,
    reachable: bool,
}

/// The shard of each client, and the node of each shard.
const SHARDS_OF: &str = "
SELECT c.client_id, s.shardid, p.nodename, p.nodeport
FROM unnest($1::text[]) AS c(client_id)
    CROSS JOIN LATERAL (
        SELECT get_shard_id_for_distribution_column('idempotency_records', c.client_id) AS shardid
    ) s
    JOIN pg_dist_shard_placement p ON p.shardid = s.shardid";

/// Every client with rows in `$1` (a table distributed by `client_id`), shard by shard: on each
/// shard a walk of its primary key's first column, one index probe per client (a loose index
/// scan, by a recursive CTE), however many rows the client has. Each shard answers with a
/// JSON array (`run_command_on_shards` gives text).
const CLIENTS_OF_SHARDS: &str = "
SELECT success, result
FROM run_command_on_shards($1::text::regclass, $cmd$
WITH RECURSIVE c(client_id) AS (
    (SELECT client_id FROM %1$s ORDER BY client_id LIMIT 1)
    UNION ALL
    SELECT (SELECT t.client_id FROM %1$s t WHERE t.client_id > c.client_id
            ORDER BY t.client_id LIMIT 1)
    FROM c WHERE c.client_id IS NOT NULL
)
SELECT coalesce(json_agg(client_id), '[]') FROM c WHERE client_id IS NOT NULL
$cmd$)";

/// The tables whose rows a pass must reach: the janitor deletes expired records and old sent
/// events, and relays take unsent events.
const TABLES_WITH_PASSES: [&str; 2] = ["idempotency_records", "outbox_events"];

impl Cluster {
    /// A cluster reached through `coordinator`, that reads `configured` (besides the clients it
    /// finds) at every refresh, and nothing yet.
    pub fn new(coordinator: &Database, configured: &[String]) -> Self {
        let settings = coordinator.settings();
        Self {
            coordinator: coordinator.clone(),
            direct: settings.citus_direct,
            addresses: settings.citus_node_addresses.clone(),
            configured: configured.into(),
            state: RwLock::default(),
            ids: IdBlocks::new(coordinator.clone()),
        }
    }

    pub fn shard_of(&self, client: &str) -> Option<ShardId> {
        self.read().by_client.get(client).copied()
    }

    pub fn node_of(&self, shard: ShardId) -> Option<String> {
        self.read().node_of.get(&shard).cloned()
    }

    /// The pool a statement on `node`'s rows runs on, and whether it is the node's own: the
    /// node's, where the daemon reaches it (and `database.citus_direct`); the coordinator's
    /// otherwise.
    pub fn pool_of(&self, node: Option<&str>) -> (Database, bool) {
        let state = self.read();
        node.and_then(|node| state.nodes.get(node))
            .filter(|node| self.direct && node.reachable)
            .map_or_else(
                || (self.coordinator.clone(), false),
                |node| (node.db.clone(), true),
            )
    }

    /// The first (by name) of the known clients whose shard `node` holds.
    pub fn a_client_on(&self, node: &str) -> Option<String> {
        let state = self.read();
        state
            .by_client
            .iter()
            .filter(|(_, shard)| state.node_of.get(shard).is_some_and(|at| at == node))
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

    /// Reads again which clients have rows, which shard holds each and which node each shard,
    /// and whether each node answers the daemon directly. The clients are the configured ones
    /// and every client with rows in the tables passes reach, found on every shard (so that a
    /// client no longer configured, or one with nothing but old sent events, is reached by the
    /// relays and the janitor); while a shard cannot be read, the clients known before stay.
    pub async fn refresh(&self) -> Result<(), StorageError> {
        let (found, complete) = self.clients_with_rows().await.unwrap_or_else(|error| {
            tracing::warn!(error = %error, "cannot read which clients have rows; keeping those known");
            (Vec::new(), false)
        });
        let mut clients: Vec<String> = self.configured.to_vec();
        clients.extend(found);
        if !complete {
            clients.extend(self.read().by_client.keys().cloned());
        }
        clients.sort_unstable();
        clients.dedup();
        let rows = self
            .coordinator
            .run(async |connection| Ok(connection.query(SHARDS_OF, &[&clients]).await?))
            .await?;
        let mut by_client = HashMap::new();
        let mut node_of = HashMap::new();
        for row in &rows {
            let shard: ShardId = row.get(1);
            let (name, port): (String, i32) = (row.get(2), row.get(3));
            by_client.insert(row.get::<_, String>(0), shard);
            node_of.insert(shard, format!("{name}:{port}"));
        }
        let nodes = self.reach_nodes(&rows).await;
        let mut state = self
            .state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *state = State {
            by_client,
            node_of,
            nodes,
        };
        Ok(())
    }

    /// Every client with rows in the tables passes reach, and whether every shard answered.
    async fn clients_with_rows(&self) -> Result<(Vec<String>, bool), StorageError> {
        let mut found = Vec::new();
        let mut complete = true;
        for table in TABLES_WITH_PASSES {
            let rows = self
                .coordinator
                .run(async |connection| Ok(connection.query(CLIENTS_OF_SHARDS, &[&table]).await?))
                .await?;
            for row in rows {
                let (answered, result): (bool, String) = (row.get(0), row.get(1));
                match answered.then(|| serde_json::from_str::<Vec<String>>(&result)) {
                    Some(Ok(clients)) => found.extend(clients),
                    _ => {
                        tracing::warn!(table, error = %result, "cannot read which clients have rows on a shard; keeping those known");
                        complete = false;
                    }
                }
            }
        }
        Ok((found, complete))
    }

    /// The nodes of `placements` (rows of [`SHARDS_OF`]), each with a pool (the one it had, or
    /// a new one), and whether it answers at the address the daemon reaches it at; none when
    /// every statement goes through the coordinator (`database.citus_direct = false`). A node
    /// the daemon has reached directly is not asked again: its address works from here, so a
    /// node that stops answering there is down or hung, and the coordinator cannot reach it
    /// either; routed through the coordinator, its statements would wait there until their
    /// timeout, holding the coordinator's connections, instead of being given up as soon as
    /// the node is found not to answer (`Database::unresponsive`).
    async fn reach_nodes(&self, placements: &[tokio_postgres::Row]) -> HashMap<String, Node> {
        if !self.direct {
            return HashMap::new();
        }
        let mut named: Vec<(String, i32)> = placements
            .iter()
            .map(|row| (row.get(2), row.get(3)))
            .collect();
        named.sort_unstable();
        named.dedup();
        let known = self.read().nodes.clone();
        let nodes = named.into_iter().filter_map(|(name, port)| {
            let key = format!("{name}:{port}");
            if let Some(node) = known.get(&key) {
                return Some((key, node.clone()));
            }
            let port = u16::try_from(port).ok()?;
            let (host, port) = self
                .addresses
                .iter()
                .find(|address| address.name == name && address.port == port)
                .map_or((name.as_str(), port), |address| {
                    (address.reach_host.as_str(), address.reach_port)
                });
            match self.coordinator.for_node(host, port) {
                Ok(db) => Some((
                    key,
                    Node {
                        db,
                        reachable: false,
                    },
                )),
                Err(error) => {
                    tracing::warn!(node = %key, error = %error, "cannot make a pool to a node; it is reached through the coordinator");
                    None
                }
            }
        });
        let checked = nodes.map(|(key, node)| async move {
            if node.reachable {
                return (key, node);
            }
            let db = node.db;
            let limit = db.settings().connect_timeout;
            let answered = db
                .run_within(limit, async |connection| {
                    Ok(connection.simple_query("SELECT 1").await?)
                })
                .await;
            if let Err(error) = &answered {
                tracing::warn!(node = %key, error = %error, "a node does not answer the daemon directly; its shards are reached through the coordinator meanwhile");
            }
            let reachable = answered.is_ok();
            (key, Node { db, reachable })
        });
        futures_util::future::join_all(checked)
            .await
            .into_iter()
            .collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // Replaced whole by `refresh`: a panic elsewhere cannot leave it half-written.
        self.state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// [`crate::db::BARRIER_WHERE_PROMISED`] on the node that holds `$1`'s rows, run by Citus on a
/// connection of its own to the node.
const NODE_BARRIER: &str = "
SELECT p.nodename || ':' || p.nodeport, b.success, b.result
FROM pg_dist_shard_placement p,
    master_run_on_worker(ARRAY[p.nodename], ARRAY[p.nodeport], ARRAY[$2::text], false) b
WHERE p.shardid = get_shard_id_for_distribution_column('idempotency_records', $1::text)";

/// A barrier ([`crate::db::barrier`]) for `client`'s rows read through the coordinator (on
/// `connection`, the coordinator's): taken on the node that holds them, whose own synchronous
/// standby they must reach (the coordinator's holds none of them), and only where that node's
/// commits wait for one. It fails where the node does not run it, where the wait for its
/// standby outlasts the statement's timeout, and where the node warns about its commit (the
/// wait cancelled: Citus passes the warning on).
pub async fn node_barrier(connection: &mut PgClient, client: &str) -> Result<(), StorageError> {
    let warnings = connection.warnings();
    let row = connection
        .query_one(NODE_BARRIER, &[&client, &crate::db::BARRIER_WHERE_PROMISED])
        .await?;
    let (node, success, result): (String, bool, String) = (row.get(0), row.get(1), row.get(2));
    if !success {
        return Err(StorageError::Unavailable(format!(
            "{node}: a barrier for its synchronous standby failed there: {result}"
        )));
    }
    connection
        .confirm_commit(warnings)
        .map_err(|error| StorageError::Unavailable(format!("{node}: {error}")))
}

/// Outbox ids reserved on the coordinator, for the rows a write batch inserts on a node. An
/// event's id comes from `outbox_events`' sequence on the coordinator, as it does when the row is
/// written there, so that ids follow the order events are written in (a node's own copy of the
/// sequence hands out ids of a range of its own, 2^48 apart from the coordinator's). Taken a
/// block at a time, a block costs the coordinator one statement per [`ID_BLOCK`] events; a block
/// older than [`ID_BLOCK_LIFE`] is not used, so ids follow the writes' order to within that.
/// While the coordinator cannot be reached (asked within `database.connect_timeout`, and not
/// asked again for [`COORDINATOR_RETRY`] after it failed), each batch's ids come from the
/// sequence's copy on the node it writes on, in the same round trip's time, without holding
/// the other nodes' batches: writes on the nodes go on without the coordinator, and their
/// events are replayed after the others (a replay walks the outbox by id, stepping over the
/// gap).
#[derive(Debug, Clone)]
pub struct IdBlocks {
    coordinator: Database,
    reserved: Arc<tokio::sync::Mutex<Reserved>>,
}

#[derive(Debug, Default)]
struct Reserved {
    /// In decreasing order: the lowest are taken first, from the end.
    ids: Vec<i64>,
    since: Option<Instant>,
    /// When the coordinator last failed to reserve a block.
    coordinator_failed: Option<Instant>,
}

/// Ids reserved at a time.
pub const ID_BLOCK: i64 = 1000;

/// How long reserved ids are used.
pub const ID_BLOCK_LIFE: Duration = Duration::from_secs(1);

/// How long the node at hand reserves the blocks after the coordinator failed to.
pub const COORDINATOR_RETRY: Duration = Duration::from_secs(10);

const RESERVE_IDS: &str =
    "SELECT nextval('outbox_events_id_seq') FROM generate_series(1, $1::bigint)";

impl IdBlocks {
    fn new(coordinator: Database) -> Self {
        Self {
            coordinator,
            reserved: Arc::default(),
        }
    }

    /// `count` ids, in increasing order; `at_hand` is the connection to the node the batch
    /// writes on, which gives them while the coordinator cannot.
    pub async fn take(
        &self,
        count: usize,
        at_hand: &tokio_postgres::Client,
    ) -> Result<Vec<i64>, StorageError> {
        if let Some(ids) = self.reserved_ids(count).await {
            return Ok(ids);
        }
        let wanted = i64::try_from(count).unwrap_or(i64::MAX);
        let rows = at_hand.query(RESERVE_IDS, &[&wanted]).await?;
        let mut ids: Vec<i64> = rows.iter().map(|row| row.get(0)).collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// `count` ids of the block reserved on the coordinator (a new block where it has too few,
    /// or is too old); None while the coordinator cannot reserve one.
    async fn reserved_ids(&self, count: usize) -> Option<Vec<i64>> {
        let mut reserved = self.reserved.lock().await;
        if reserved
            .since
            .is_none_or(|since| since.elapsed() > ID_BLOCK_LIFE)
        {
            reserved.ids.clear();
        }
        if reserved.ids.len() < count {
            if reserved
                .coordinator_failed
                .is_some_and(|failed| failed.elapsed() < COORDINATOR_RETRY)
            {
                return None;
            }
            let wanted = ID_BLOCK.max(i64::try_from(count).unwrap_or(i64::MAX));
            match self.reserve_on_coordinator(wanted).await {
                Ok(mut block) => {
                    block.sort_unstable_by(|a, b| b.cmp(a));
                    reserved.ids = block;
                    reserved.since = Some(Instant::now());
                }
                Err(error) => {
                    tracing::warn!(error = %error, "the coordinator cannot reserve outbox ids; each node gives its batches' ids from its own range meanwhile");
                    reserved.coordinator_failed = Some(Instant::now());
                    return None;
                }
            }
        }
        let from = reserved.ids.len() - count;
        let mut taken = reserved.ids.split_off(from);
        taken.reverse();
        Some(taken)
    }

    /// A block of `wanted` ids from the coordinator's sequence, asked within
    /// `database.connect_timeout`.
    async fn reserve_on_coordinator(&self, wanted: i64) -> Result<Vec<i64>, StorageError> {
        let limit = self.coordinator.settings().connect_timeout;
        let rows = self
            .coordinator
            .run_within(limit, async |connection| {
                Ok(connection.query(RESERVE_IDS, &[&wanted]).await?)
            })
            .await?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }
}
