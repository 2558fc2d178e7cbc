//! `GET /healthz` (the process runs) and `GET /readyz` (it can serve writes).

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::HttpResponse;
use serde::Serialize;

use tokio_util::sync::CancellationToken;

use crate::db::topology::Topology;
use crate::db::{self, Database, WriteHealth};
use crate::http::SharedState;
use crate::metric;
use crate::outbox::gauges::{self, Backlog};

/// 200 while the process runs.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "The process runs", body = Object, content_type = "application/json")))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Readiness {
    status: &'static str,
    database: &'static str,
    migrations: &'static str,
    /// `ok`, or `failing` while writes fail with none succeeding: at once for a full disk, after
    /// a few seconds for any other reason (the database read-only, no connection slot free,
    /// unreachable, a statement the schema does not fit, ...). Then the daemon is unready.
    writes: &'static str,
    /// Why writes fail, in words, with the database's message; absent while they do not.
    #[serde(skip_serializing_if = "Option::is_none")]
    writes_error: Option<String>,
    /// The class of the last failure: `disk_full`, `read_only`, `no_connections`,
    /// `unavailable`, `statement_timeout`, `conflict`, `data_rejected` or `other`; absent while
    /// writes do not fail.
    #[serde(skip_serializing_if = "Option::is_none")]
    writes_error_class: Option<&'static str>,
    /// On Citus, the workers whose shards' writes fail, none succeeding there since: their
    /// clients' writes are refused (503) while others' may succeed, so the daemon may be ready
    /// with some listed. Absent while there is none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    failing_workers: Vec<FailingWorker>,
    /// `connected`, `blocked` (a resource alarm: the broker takes no publishes until it clears;
    /// events wait in the outbox) or `disconnected`. Reported, but not part of readiness:
    /// writes work while the broker is down or blocked.
    broker: &'static str,
    /// Why the broker blocks publishing, as it said, and for how long; absent while it does
    /// not.
    #[serde(skip_serializing_if = "Option::is_none")]
    broker_blocked_reason: Option<String>,
    /// Events committed and not yet delivered (parked ones excluded); null when unknown.
    outbox_backlog: Option<i64>,
    /// Events parked after `outbox.max_attempts` (waiting for `retrysafe outbox retry`); null
    /// when unknown.
    outbox_parked: Option<i64>,
}

/// A Citus worker whose shards' writes fail.
#[derive(Serialize, utoipa::ToSchema)]
pub struct FailingWorker {
    /// `host:port`, as in `pg_dist_node`.
    node: String,
    /// As `writes_error_class`.
    error_class: &'static str,
    /// The last failure, in the database's words.
    error: String,
    /// Since the first failure with none succeeding there since.
    failing_seconds: u64,
}

/// Ready when the database answers, has every migration this build needs, and writes do not
/// fail.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "The database answers, migrations are applied, and writes do not fail", body = Readiness, content_type = "application/json"),
        (status = 503, description = "Not ready; the body says why", body = Readiness, content_type = "application/json"),
    ),
)]
pub async fn readyz(state: SharedState) -> HttpResponse {
    let database = state.readiness.current().await;
    let writes_blocked = state.readiness.writes_blocked();
    let blocked = state.broker.blocked();
    let ready = database == DatabaseState::Ready && writes_blocked.is_none();
    let (database_text, migrations) = match database {
        DatabaseState::Ready => ("up", "applied"),
        DatabaseState::MigrationsPending => ("up", "pending"),
        DatabaseState::Down => ("down", "unknown"),
    };
    let body = Readiness {
        status: if ready { "ready" } else { "unready" },
        database: database_text,
        migrations,
        writes: if writes_blocked.is_some() {
            "failing"
        } else {
            "ok"
        },
        writes_error_class: writes_blocked.as_ref().map(|failing| failing.class),
        writes_error: writes_blocked.map(|failing| failing.describe()),
        failing_workers: state
            .readiness
            .failing_nodes()
            .into_iter()
            .map(|(node, failing)| FailingWorker {
                node,
                error_class: failing.class,
                error: failing.reason,
                failing_seconds: failing.for_how_long.as_secs(),
            })
            .collect(),
        broker: match (state.broker.is_connected(), &blocked) {
            (true, Some(_)) => "blocked",
            (true, None) => "connected",
            (false, _) => "disconnected",
        },
        broker_blocked_reason: blocked.map(|(reason, lasted)| {
            format!(
                "{reason} (for {})",
                humantime::format_duration(Duration::from_secs(lasted.as_secs()))
            )
        }),
        outbox_backlog: state.readiness.backlog().unsent(),
        outbox_parked: state.readiness.backlog().parked(),
    };
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// What the database's readiness check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseState {
    Ready,
    MigrationsPending,
    Down,
}

/// How long a readiness result is reused: probes, however many, cost the database at most one
/// check per this interval.
const READINESS_FRESH: Duration = Duration::from_secs(1);

/// The database's readiness, checked at most once per [`READINESS_FRESH`] whatever the number
/// of probes: concurrent probes wait for the check in progress and share its result. The
/// outbox backlog it reports comes from the background gauges, not from a query per probe.
pub struct ReadinessMonitor {
    /// The reads' pool, on which the check runs.
    reads: Database,
    /// What the writers (and the last probe) found.
    writes: WriteHealth,
    /// Where the write tables live (a probe write runs on a client's route while writes
    /// fail), and the clients a probe takes in turn (on Citus, each probe goes to one client's
    /// shard).
    topology: Topology,
    clients: Vec<String>,
    probes: std::sync::atomic::AtomicUsize,
    /// Bound on one check.
    limit: Duration,
    last: tokio::sync::Mutex<Option<(Instant, DatabaseState)>>,
    /// Unsent and parked events at the last refresh of the outbox gauges.
    backlog: Arc<Backlog>,
}

impl ReadinessMonitor {
    pub fn new(
        reads: Database,
        limit: Duration,
        (writes, backlog): (WriteHealth, Arc<Backlog>),
        (topology, clients): (Topology, Vec<String>),
    ) -> Self {
        Self {
            reads,
            writes,
            topology,
            // Never empty: the anonymous client is always among them.
            clients,
            probes: std::sync::atomic::AtomicUsize::new(0),
            limit,
            last: tokio::sync::Mutex::new(None),
            backlog,
        }
    }

    /// The last result if it is fresh, else the result of a new check.
    pub async fn current(&self) -> DatabaseState {
        let mut last = self.last.lock().await;
        if let Some((at, state)) = *last {
            if at.elapsed() < READINESS_FRESH {
                return state;
            }
        }
        let state = self.check().await;
        if state == DatabaseState::Ready && self.writes.is_failing() {
            // On Citus the probe goes to one client's shard, another each time, of a node
            // whose writes are not known to fail: those are probed in the background
            // ([`refresh`]), so that a node that does not answer cannot hold a probe of
            // readiness for the probe's time.
            let turn = self
                .probes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let clients = self.clients.iter().cycle().skip(turn % self.clients.len());
            let route = clients
                .take(self.clients.len())
                .map(|client| self.topology.route(client))
                .find(|route| {
                    route
                        .node()
                        .is_none_or(|node| self.writes.node_failing(node).is_none())
                });
            if let Some(route) = route {
                crate::write::batch::probe(&route, &self.writes, self.limit).await;
            }
        }
        *last = Some((Instant::now(), state));
        let ready = state == DatabaseState::Ready && self.writes.current().is_none();
        metrics::gauge!(metric::READY).set(if ready { 1.0 } else { 0.0 });
        state
    }

    /// On Citus, a probe write to each node whose writes fail, through a client whose shard
    /// is there, so that a worker back is seen as such with no write of its clients arriving.
    /// A node no known client is on any more (its shards moved) is forgotten. Run by
    /// [`refresh`] alone, outside the check's lock: a probe of a node that does not answer
    /// takes its whole time.
    async fn probe_failing_nodes(&self) {
        let probes = self
            .writes
            .failing_nodes()
            .into_iter()
            .map(|(node, _)| async move {
                match self.topology.route_on_node(&node) {
                    Some(route) => {
                        crate::write::batch::probe(&route, &self.writes, self.limit).await
                    }
                    None => self.writes.forget(&node),
                }
            });
        futures_util::future::join_all(probes).await;
    }

    /// What makes writes fail now, if it has lasted (see [`WriteHealth::current`]).
    pub fn writes_blocked(&self) -> Option<db::FailingWrites> {
        self.writes.current()
    }

    /// On Citus, the nodes whose writes fail (see [`WriteHealth::failing_nodes`]).
    pub fn failing_nodes(&self) -> Vec<(String, db::FailingWrites)> {
        self.writes.failing_nodes()
    }

    async fn check(&self) -> DatabaseState {
        let applied = self
            .reads
            .run_within(self.limit, async |connection| {
                db::migrations_applied(connection).await
            })
            .await;
        match applied {
            Ok(true) => DatabaseState::Ready,
            Ok(false) => DatabaseState::MigrationsPending,
            Err(error) => {
                tracing::warn!(error = %error, "readiness check failed");
                DatabaseState::Down
            }
        }
    }

    /// The outbox backlog as the gauges last read it.
    pub fn backlog(&self) -> &Backlog {
        &self.backlog
    }
}

/// Renews the readiness check (and its gauge) every [`gauges::REFRESH_INTERVAL`] until
/// `shutdown`, whether probed or not, and probes the Citus nodes whose writes fail: a plain
/// task of the daemon ([`crate::lifecycle`]).
pub async fn refresh(readiness: Arc<ReadinessMonitor>, shutdown: CancellationToken) {
    crate::lifecycle::every(gauges::REFRESH_INTERVAL, shutdown, || async {
        if readiness.current().await == DatabaseState::Ready {
            readiness.probe_failing_nodes().await;
        }
    })
    .await
}
