//! Where the write tables live, and where each statement on them goes: the one place that knows
//! whether the database is a single server (or an HA formation of them) or a Citus cluster.
//!
//! The rest of the daemon asks three things, the same way whatever the topology:
//!
//! - [`Topology::route`]: where one client's rows are, for a write batch (its writes all go
//!   to one [`Route`]: one transaction on one node) and its probe;
//! - [`Topology::passes`]: the passes that together cover every row, one after another, for the
//!   relays and the janitor (a [`Pass`] names the clients its statements must name, if any);
//! - the statement shapes that differ: a write batch's transaction ([`Route::claim`],
//!   [`batch`]) and how a pass's transaction begins ([`Pass::begin`]).
//!
//! On a single server there is one route and one pass, and nothing here costs a query. On
//! Citus ([`citus`]) the write tables are distributed by `client_id`; a route is a shard's and
//! a pass takes one shard's clients, so that every statement reads and writes one shard, and
//! each runs on the pool of the node that holds that shard (through the coordinator where the
//! daemon cannot reach the node, or with `database.citus_direct = false`).

pub mod batch;
pub mod citus;

use std::sync::Arc;
use std::time::Duration;

use crate::db::{Database, StorageError};
pub use batch::{BatchRows, Claimed, EventRow, WriteRow};
use citus::{Cluster, ShardId};

/// For a transaction that modifies a reference table after rows of several shards (a replay's
/// record of a batch): Citus refuses that when the shards were modified in parallel, over
/// several connections per worker. Harmless elsewhere: PostgreSQL keeps an unknown setting of
/// a dotted name for the transaction, unused.
pub const ONE_CONNECTION_PER_WORKER: &str =
    "SET LOCAL citus.multi_shard_modify_mode TO 'sequential'";

/// How often the daemon reads again where each client's rows are (on Citus; nothing to read on
/// a single server).
pub const REFRESH_INTERVAL: Duration = citus::SHARD_MAP_REFRESH;

/// Where the write tables live. Cheap to clone: every clone sees the same readings.
#[derive(Debug, Clone)]
pub struct Topology {
    kind: Kind,
    /// `database.url`'s pool: every statement runs on it on a single server; on Citus, where a
    /// statement's node is not reached directly.
    db: Database,
}

#[derive(Debug, Clone)]
enum Kind {
    /// One PostgreSQL server (or an HA formation of them).
    Single,
    /// A Citus cluster, with the write tables distributed by `client_id`.
    Citus(Arc<Cluster>),
}

impl Topology {
    /// What the database of `db` is: Citus if its write tables are distributed. On Citus, where
    /// the rows of `clients` (the configured ones) and of every client with rows in the database
    /// are, and the nodes, are read at once (see [`refresh`](Self::refresh)).
    pub async fn detect(db: &Database, clients: &[String]) -> Result<Self, StorageError> {
        let kind = match citus::is_distributed_database(db).await? {
            false => Kind::Single,
            true => {
                let cluster = Cluster::new(db, clients);
                cluster.refresh().await?;
                Kind::Citus(Arc::new(cluster))
            }
        };
        Ok(Self {
            kind,
            db: db.clone(),
        })
    }

    /// Reads again where the rows are (on Citus; nothing on a single server): the clients with
    /// rows, their shards, the shards' nodes and whether the daemon reaches each node directly,
    /// so that a shard moved or split, or a node replaced, is followed.
    pub async fn refresh(&self) -> Result<(), StorageError> {
        match &self.kind {
            Kind::Single => Ok(()),
            Kind::Citus(cluster) => cluster.refresh().await,
        }
    }

    /// In words, for the log at start.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::Single => "a single server".into(),
            Kind::Citus(cluster) => format!(
                "citus: the write tables distributed by client_id, {} shards with known clients; batches, relays and the janitor work a shard at a time, {}",
                cluster.clients_by_shard().len(),
                if self.db.settings().citus_direct {
                    "on the node that holds it"
                } else {
                    "through the coordinator (database.citus_direct = false)"
                }
            ),
        }
    }

    /// Where `client`'s rows are.
    pub fn route(&self, client: &str) -> Route {
        let group = self.group_of(client);
        let (db, cluster) = match &self.kind {
            Kind::Single => (self.db.clone(), None),
            Kind::Citus(cluster) => (cluster.pool_of(group.node()).0, Some(cluster.clone())),
        };
        Route {
            db,
            group,
            client: Arc::from(client),
            cluster,
        }
    }

    /// The group of `client`'s rows (see [`Group`]): what batches writes together.
    pub fn group_of(&self, client: &str) -> Group {
        match &self.kind {
            Kind::Single => Group(GroupOf::Everything, None),
            Kind::Citus(cluster) => match cluster.shard_of(client) {
                Some(shard) => Group(GroupOf::Shard(shard), cluster.node_of(shard)),
                // Not read yet: a group of its own, which Citus routes by the client.
                None => Group(GroupOf::Client(Arc::from(client)), None),
            },
        }
    }

    /// A route to `node` (`host:port`, as [`Route::node`] names it), through a known client
    /// whose shard is there; None on a single server, or where no known client's shard is on
    /// it (any more).
    pub fn route_on_node(&self, node: &str) -> Option<Route> {
        match &self.kind {
            Kind::Single => None,
            Kind::Citus(cluster) => Some(self.route(&cluster.a_client_on(node)?)),
        }
    }

    /// The passes that cover every row, to take one after another: one on a single server; on
    /// Citus, one per shard, naming the shard's clients.
    pub fn passes(&self) -> Vec<Pass> {
        match &self.kind {
            Kind::Single => vec![self.single_pass()],
            Kind::Citus(cluster) => cluster
                .clients_by_shard()
                .into_iter()
                .map(|(shard, clients)| shard_pass(cluster, shard, clients))
                .collect(),
        }
    }

    /// The pass over the rows of `group` (a route's), when there is one: the pass a relay takes
    /// first after a write to that group.
    pub fn pass_of(&self, group: &Group) -> Option<Pass> {
        match (&self.kind, &group.0) {
            (Kind::Single, _) => Some(self.single_pass()),
            (Kind::Citus(cluster), GroupOf::Shard(shard)) => {
                let clients = cluster.clients_by_shard().remove(shard)?;
                Some(shard_pass(cluster, *shard, clients))
            }
            (Kind::Citus(_), _) => None,
        }
    }

    fn single_pass(&self) -> Pass {
        Pass {
            db: self.db.clone(),
            scope: Scope::Everything,
            node: None,
            own_pool: true,
        }
    }

    /// Waits until the synchronous standby of the server that holds `client`'s rows has what
    /// was just read of them on `connection` (one of `database.url`'s pools), where that server
    /// has one (see [`crate::db::barrier`]); `promised` is [`crate::db::REPLICATION_PROMISED`]
    /// as read there. On Citus the rows were read through the coordinator, and the barrier is
    /// taken on their node ([`citus::node_barrier`]).
    pub async fn barrier_after_read(
        &self,
        connection: &mut crate::db::PgClient,
        client: &str,
        promised: bool,
    ) -> Result<(), StorageError> {
        match &self.kind {
            Kind::Single if promised => crate::db::barrier(connection).await,
            Kind::Single => Ok(()),
            Kind::Citus(_) => citus::node_barrier(connection, client).await,
        }
    }
}

/// The pass over one shard's rows, on the pool of the node that holds it.
fn shard_pass(cluster: &Cluster, shard: ShardId, clients: Vec<String>) -> Pass {
    let node = cluster.node_of(shard);
    let (db, own_pool) = cluster.pool_of(node.as_deref());
    Pass {
        db,
        scope: Scope::Clients(clients.into()),
        node,
        own_pool,
    }
}

/// Which rows go together in one transaction: everything on a single server, a shard's on
/// Citus (or one client's, whose shard is not read yet), with the node that holds them. Writes
/// of one group share a batch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Group(GroupOf, Option<String>);

impl Group {
    /// The node (`host:port`, as Citus's metadata names it) that holds the group's rows, on
    /// Citus: what a failure is told against ([`crate::db::WriteHealth`]), and what the writers
    /// share out.
    pub fn node(&self) -> Option<&str> {
        self.1.as_deref()
    }

    /// A single server's one group.
    #[cfg(test)]
    pub(crate) fn everything() -> Self {
        Group(GroupOf::Everything, None)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum GroupOf {
    Everything,
    Shard(ShardId),
    Client(Arc<str>),
}

/// Where one client's rows are: the pool to run on, and on Citus the node that holds them.
#[derive(Debug, Clone)]
pub struct Route {
    pub db: Database,
    group: Group,
    /// The client the route was asked for: on Citus, what routes a statement with no row of
    /// its own (a probe) to the shard.
    client: Arc<str>,
    /// On Citus, the cluster (its reserved outbox ids).
    cluster: Option<Arc<Cluster>>,
}

impl Route {
    /// The rows this route reaches go together with those of every route of the same group.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// The node (`host:port`) that holds the rows, on Citus: what a failure is told against
    /// ([`crate::db::WriteHealth`]).
    pub fn node(&self) -> Option<&str> {
        self.group.node()
    }

    fn probe_client(&self) -> &str {
        &self.client
    }
}

/// A pass over some of the rows (see [`Topology::passes`]): the pool it runs on, and the
/// clients whose rows it takes.
#[derive(Debug, Clone)]
pub struct Pass {
    pub db: Database,
    scope: Scope,
    /// On Citus, the node that holds the pass's shard.
    node: Option<String>,
    /// Whether `db` is the pool of the server that holds the rows (not the coordinator's, for
    /// a node reached through it).
    own_pool: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Scope {
    /// Every client's rows (a single server).
    Everything,
    /// These clients', all of one shard (Citus): a statement that takes row locks, or deletes
    /// with a limit, must read one shard there.
    Clients(Arc<[String]>),
}

impl Pass {
    /// The clients a pass's statements name (`client_id = ANY(...)`): None for every one.
    pub fn clients(&self) -> Option<&[String]> {
        match &self.scope {
            Scope::Everything => None,
            Scope::Clients(clients) => Some(clients),
        }
    }

    /// The node (`host:port`) that holds the pass's rows, on Citus.
    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// Waits until the synchronous standby of the server that holds the pass's rows has what
    /// was just read of them on a connection of `db`, where that server has one (see
    /// [`crate::db::barrier`]); `promised` is [`crate::db::REPLICATION_PROMISED`] as read
    /// there. A node reached through the coordinator is asked itself
    /// ([`citus::node_barrier`]): the coordinator's standby holds none of its rows.
    pub async fn barrier(&self, promised: bool) -> Result<(), StorageError> {
        match (&self.scope, self.own_pool) {
            (Scope::Clients(clients), false) => match clients.first() {
                Some(client) => {
                    self.db
                        .run(async |connection| citus::node_barrier(connection, client).await)
                        .await
                }
                None => Ok(()),
            },
            _ if promised => {
                self.db
                    .run(async |connection| crate::db::barrier(connection).await)
                    .await
            }
            _ => Ok(()),
        }
    }

    /// How a transaction of this pass begins. On Citus, its statements are planned with their
    /// parameters' values (see [`citus::BEGIN_WITH_VALUES`]), so that each reads its one shard.
    pub fn begin(&self) -> &'static str {
        match &self.scope {
            Scope::Everything => "BEGIN",
            Scope::Clients(_) => citus::BEGIN_WITH_VALUES,
        }
    }
}

impl PartialEq for Pass {
    fn eq(&self, other: &Self) -> bool {
        self.scope == other.scope
    }
}

impl Eq for Pass {}

impl std::hash::Hash for Pass {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.scope.hash(state);
    }
}
