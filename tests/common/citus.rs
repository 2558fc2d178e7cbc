//! A Citus cluster of a test's own: a coordinator and two workers, each a [`PgCluster`] with
//! the `citus` extension loaded, on free loopback ports; the database `retrysafe` exists on
//! every node with the extension, and the workers are added to the coordinator. Dropped (every
//! node stopped and removed) with the lab.
//!
//! Citus is not in the distribution's packages: where its extension is not installed,
//! [`CitusLab::available`] says so and the tests that need it skip.

use std::path::Path;

use crate::common::postgres::PgCluster;

/// Where the machine's PostgreSQL keeps extensions' libraries.
const CITUS_LIBRARY: &str = "/usr/lib/postgresql/15/lib/citus.so";

/// Settings of every node. Two-phase commits are kept for counting (`recover_2pc_interval =
/// -1`: the recovery that would delete their records from `pg_dist_transaction` never runs), and
/// Citus counts single- and multi-shard queries (`citus_stat_counters`). Connections for three
/// daemons' pools, and the coordinator's own to the workers.
const NODE_SETTINGS: &str = "shared_preload_libraries = 'citus'
max_prepared_transactions = 100
max_connections = 300
citus.shard_count = 8
citus.recover_2pc_interval = -1
citus.enable_stat_counters = on
";

pub struct CitusLab {
    pub coordinator: PgCluster,
    pub workers: Vec<PgCluster>,
}

impl CitusLab {
    /// Whether the Citus extension is installed here (and the test runs as root, which starting
    /// clusters as the `postgres` user needs); says why not otherwise.
    pub fn available() -> bool {
        // SAFETY: getuid has no preconditions and cannot fail.
        if unsafe { libc::getuid() } != 0 {
            eprintln!(
                "skipped: a Citus cluster of the test's own runs as the postgres user (runuser)"
            );
            return false;
        }
        if !Path::new(CITUS_LIBRARY).exists() {
            eprintln!(
                "skipped: the Citus extension is not installed ({CITUS_LIBRARY} is missing); build a 13.x release of github.com/citusdata/citus for PostgreSQL 15 to run this test"
            );
            return false;
        }
        true
    }

    /// [`Self::start`] where the extension is installed; None (having said why) where not: the
    /// test then skips.
    pub fn start_if_available() -> Option<Self> {
        Self::available().then(Self::start)
    }

    /// A coordinator and two workers, running, with the database `retrysafe` ([`Self::add_citus_to`]).
    pub fn start() -> Self {
        let coordinator = PgCluster::start_plain(NODE_SETTINGS);
        let workers: Vec<PgCluster> = (0..2)
            .map(|_| PgCluster::start_plain(NODE_SETTINGS))
            .collect();
        let lab = Self {
            coordinator,
            workers,
        };
        lab.coordinator.psql("CREATE DATABASE retrysafe");
        lab.add_citus_to("retrysafe");
        lab
    }

    /// Makes the coordinator's database `name` (which exists) a Citus database over the
    /// workers: the extension on every node (the workers get a database of that name), the
    /// workers added to it. As an operator moving a single server's database to Citus does.
    pub fn add_citus_to(&self, name: &str) {
        for worker in &self.workers {
            worker.psql(&format!("CREATE DATABASE {name}"));
            worker.psql_on(name, "CREATE EXTENSION citus");
        }
        let coordinator = &self.coordinator;
        coordinator.psql_on(name, "CREATE EXTENSION citus");
        coordinator.psql_on(
            name,
            &format!(
                "SELECT citus_set_coordinator_host('127.0.0.1', {})",
                coordinator.port
            ),
        );
        for worker in &self.workers {
            coordinator.psql_on(
                name,
                &format!("SELECT citus_add_node('127.0.0.1', {})", worker.port),
            );
        }
    }

    /// The coordinator's `retrysafe` database: what the daemon is given.
    pub fn url(&self) -> String {
        self.coordinator.url_of("retrysafe")
    }

    /// SQL on the coordinator's `retrysafe` database.
    pub fn sql(&self, sql: &str) -> String {
        self.coordinator.psql_on("retrysafe", sql)
    }

    /// The worker that holds `client`'s rows.
    pub fn worker_of(&self, client: &str) -> &PgCluster {
        let port: u16 = self
            .sql(&format!(
                "SELECT nodeport FROM pg_dist_shard_placement
                 WHERE shardid = get_shard_id_for_distribution_column('idempotency_records', '{client}')"
            ))
            .parse()
            .expect("a port");
        self.workers
            .iter()
            .find(|worker| worker.port == port)
            .expect("the client's shard is on a worker")
    }

    /// Two-phase commits the coordinator has made since the lab started.
    pub fn two_phase_commits(&self) -> i64 {
        self.sql("SELECT count(*) FROM pg_dist_transaction")
            .parse()
            .expect("a count")
    }
}
