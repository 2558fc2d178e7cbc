//! Whether writes succeed, as the writers find it: `/readyz` reports the daemon unready while
//! writes fail and none succeeds, whatever the reason, so that a load balancer stops sending
//! writes to a daemon that cannot make them.
//!
//! Failures of three kinds only an operator can fix are named ([`Blocker`]: the database's
//! disk is full, the database is read-only, it takes no more connections), told to the client
//! in those words, and make the daemon unready at once (a full disk) or after a few seconds (a
//! failover or a burst of other clients pass within that). Every other failure of a write
//! batch (an unreachable database, a statement the schema does not fit, a commit the database
//! warned about, ...) makes it unready once writes have failed for [`FAILING_WINDOW`] with none
//! succeeding. Readiness then comes back by itself: while writes fail, each readiness check
//! runs a probe write (the writers' statement, writing nothing, in a transaction that does
//! write WAL; see `write::batch::probe`), and the first write or probe that succeeds clears
//! the failure.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::db::StorageError;
use crate::metric;

/// Why the database takes no writes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Blocker {
    /// SQLSTATE 53100: a table, an index or the WAL could not grow.
    DiskFull,
    /// SQLSTATE 25006: a standby, or `default_transaction_read_only` (as some managed services
    /// set when storage runs out).
    ReadOnly,
    /// SQLSTATE 53300: every connection slot is taken (`max_connections`, or the role's
    /// connection limit).
    NoConnections,
}

impl Blocker {
    /// For metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Blocker::DiskFull => "disk_full",
            Blocker::ReadOnly => "read_only",
            Blocker::NoConnections => "no_connections",
        }
    }

    /// What it is, for a client and for the log.
    pub fn describe(self) -> &'static str {
        match self {
            Blocker::DiskFull => "the database's disk is full (SQLSTATE 53100)",
            Blocker::ReadOnly => "the database is read-only (SQLSTATE 25006)",
            Blocker::NoConnections => "the database accepts no more connections (SQLSTATE 53300)",
        }
    }

    /// What an operator does about it.
    pub fn remedy(self) -> &'static str {
        match self {
            Blocker::DiskFull => "free space on the database's disk",
            Blocker::ReadOnly => "point database.url at the primary, or make the database writable",
            Blocker::NoConnections => {
                "raise max_connections or the role's limit, or close other connections"
            }
        }
    }

    /// How long failures must go on before the daemon calls itself unready. A full disk is
    /// not going to pass by itself; a read-only answer may be a failover in progress, and no
    /// free connection a burst of other clients, which both pass within seconds.
    fn persists_after(self) -> Duration {
        match self {
            Blocker::DiskFull => Duration::ZERO,
            Blocker::ReadOnly | Blocker::NoConnections => Duration::from_secs(5),
        }
    }

    const ALL: [Blocker; 3] = [Blocker::DiskFull, Blocker::ReadOnly, Blocker::NoConnections];
}

/// How long writes must fail, with none succeeding, before the daemon calls itself unready for
/// a failure that is not a [`Blocker`]: long enough that a lost connection or a failover's
/// first seconds do not take it out of a load balancer, short enough that a daemon whose every
/// write fails is out within seconds.
pub const FAILING_WINDOW: Duration = Duration::from_secs(5);

/// The write path's last word on whether writes succeed: set by writers (and readiness probes)
/// when a batch fails, cleared when one commits; read by `/readyz`. On Citus it also keeps
/// which nodes the failing batches' shards are on: a worker down fails its clients' writes
/// while others' succeed, and `/readyz` names it (see [`failing_nodes`](Self::failing_nodes)).
#[derive(Debug, Clone, Default)]
pub struct WriteHealth(Arc<Mutex<State>>);

#[derive(Debug, Default)]
struct State {
    /// Writes failing, none succeeding since the first failure.
    all: Option<Failing>,
    /// Citus nodes (`host:port`) whose shards' writes fail, none succeeding there since.
    nodes: BTreeMap<String, Failing>,
}

/// Writes failing since `first`, none succeeding since.
#[derive(Debug, Clone)]
struct Failing {
    /// The last failure's class ([`StorageError::class`]).
    class: &'static str,
    /// The last failure, when it was a [`Blocker`].
    blocker: Option<Blocker>,
    /// The last failure, in the database's words.
    reason: String,
    first: Instant,
    last: Instant,
}

impl Failing {
    fn new(error: &StorageError, now: Instant) -> Self {
        let mut failing = Failing {
            class: error.class(),
            blocker: None,
            reason: String::new(),
            first: now,
            last: now,
        };
        failing.again(error, now);
        failing
    }

    fn again(&mut self, error: &StorageError, now: Instant) {
        self.class = error.class();
        (self.blocker, self.reason) = match error {
            StorageError::CannotWrite(blocker, reason) => (Some(*blocker), reason.clone()),
            other => (None, other.to_string()),
        };
        self.last = now;
    }

    fn lasted(&self) -> Duration {
        self.last.duration_since(self.first)
    }
}

/// Why the daemon is unready for writes: what fails, in words, and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailingWrites {
    /// [`StorageError::class`] of the last failure (a [`Blocker`]'s is its name).
    pub class: &'static str,
    pub blocker: Option<Blocker>,
    pub reason: String,
    pub for_how_long: Duration,
}

impl FailingWrites {
    /// Whether writes there cannot succeed now: the database unreachable or not answering, or
    /// refusing every write (a [`Blocker`]). Not a statement that failed for its own reasons
    /// (a bad row, a timeout, a conflict): those say nothing of the next write.
    pub fn shuts_writes_out(&self) -> bool {
        self.blocker.is_some() || self.class == "unavailable"
    }

    fn of(failing: &Failing) -> Self {
        FailingWrites {
            class: failing.class,
            blocker: failing.blocker,
            reason: failing.reason.clone(),
            for_how_long: round_to_seconds(failing.first.elapsed()),
        }
    }

    /// For `/readyz` and the log: what fails, for how long, and what to do where that is known.
    pub fn describe(&self) -> String {
        let lasted = humantime::format_duration(self.for_how_long);
        match self.blocker {
            Some(blocker) => format!(
                "{} for {lasted}: {}; {}",
                blocker.describe(),
                self.reason,
                blocker.remedy()
            ),
            None => format!(
                "every write has failed for {lasted}, none succeeding ({}): {}",
                self.class, self.reason
            ),
        }
    }
}

impl WriteHealth {
    /// A write batch (or a probe) failed with `error`; on Citus, `node` holds its shard.
    pub fn failed(&self, node: Option<&str>, error: &StorageError) {
        let now = Instant::now();
        let mut state = self.lock();
        let previous_blocker = state.all.as_ref().and_then(|failing| failing.blocker);
        match &mut state.all {
            Some(failing) => failing.again(error, now),
            all => *all = Some(Failing::new(error, now)),
        }
        let blocker = state.all.as_ref().and_then(|failing| failing.blocker);
        if let Some(blocker) = blocker.filter(|_| blocker != previous_blocker) {
            tracing::warn!(
                blocker = blocker.as_str(),
                reason = %error,
                "writes fail: {}; {} (the daemon reports itself unready while this lasts)",
                blocker.describe(),
                blocker.remedy()
            );
        }
        if blocker != previous_blocker {
            set_gauges(blocker);
        }
        if let Some(node) = node {
            match state.nodes.get_mut(node) {
                Some(failing) => failing.again(error, now),
                None => {
                    tracing::warn!(
                        node,
                        error = %error,
                        "writes to the shards on {node} fail (its clients' writes are refused while this lasts)"
                    );
                    state
                        .nodes
                        .insert(node.to_owned(), Failing::new(error, now));
                }
            }
        }
    }

    /// A write committed (or a probe did); on Citus, `node` holds its shard. Whatever failed
    /// has passed, on that node at least.
    pub fn succeeded(&self, node: Option<&str>) {
        let mut state = self.lock();
        if let Some(failing) = state.all.take() {
            if failing.lasted() >= FAILING_WINDOW || failing.blocker.is_some() {
                tracing::info!(
                    class = failing.class,
                    after = %humantime::format_duration(round_to_seconds(failing.first.elapsed())),
                    "writes succeed again"
                );
            }
            if failing.blocker.is_some() {
                set_gauges(None);
            }
        }
        let Some(node) = node else { return };
        if let Some(failing) = state.nodes.remove(node) {
            tracing::info!(
                node,
                after = %humantime::format_duration(round_to_seconds(failing.first.elapsed())),
                "writes to the shards on {node} succeed again"
            );
        }
    }

    /// A node no known client's shard is on any more (shards moved): nothing to tell of it.
    pub fn forget(&self, node: &str) {
        self.lock().nodes.remove(node);
    }

    /// Whether the last write (or probe) failed: worth a probe, to learn when that ends.
    pub fn is_failing(&self) -> bool {
        self.lock().all.is_some()
    }

    /// What makes the daemon unready now, if anything: writes failing, none succeeding, for
    /// long enough (a [`Blocker`]'s own time, or [`FAILING_WINDOW`]).
    pub fn current(&self) -> Option<FailingWrites> {
        let state = self.lock();
        let failing = state.all.as_ref()?;
        let needed = failing
            .blocker
            .map_or(FAILING_WINDOW, Blocker::persists_after);
        (failing.lasted() >= needed).then(|| FailingWrites::of(failing))
    }

    /// Why writes to the shards on `node` fail, if they do (none succeeding there since).
    pub fn node_failing(&self, node: &str) -> Option<FailingWrites> {
        self.lock().nodes.get(node).map(FailingWrites::of)
    }

    /// The Citus nodes whose shards' last writes (or probes) failed, by name, with none
    /// succeeding there since: reported by `/readyz` whether or not other writes succeed, and
    /// worth a probe each.
    pub fn failing_nodes(&self) -> Vec<(String, FailingWrites)> {
        self.lock()
            .nodes
            .iter()
            .map(|(node, failing)| (node.clone(), FailingWrites::of(failing)))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Each failure is replaced whole: a panic elsewhere cannot leave it half-written.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn round_to_seconds(duration: Duration) -> Duration {
    Duration::from_secs(duration.as_secs())
}

fn set_gauges(current: Option<Blocker>) {
    for blocker in Blocker::ALL {
        let value = if current == Some(blocker) { 1.0 } else { 0.0 };
        metrics::gauge!(metric::WRITES_BLOCKED, "reason" => blocker.as_str()).set(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked(blocker: Blocker, reason: &str) -> StorageError {
        StorageError::CannotWrite(blocker, reason.into())
    }

    /// Moves the failure's start `by` into the past, as if it had lasted that much longer.
    fn age(health: &WriteHealth, by: Duration) {
        let mut state = health.lock();
        let failing = state.all.as_mut().unwrap();
        failing.first -= by;
    }

    #[test]
    fn a_full_disk_blocks_at_once_and_a_commit_clears_it() {
        let health = WriteHealth::default();
        assert_eq!(health.current(), None);
        health.failed(None, &blocked(Blocker::DiskFull, "could not extend file"));
        let current = health.current().expect("blocked");
        assert_eq!(current.blocker, Some(Blocker::DiskFull));
        assert_eq!(current.class, "disk_full");
        assert_eq!(current.reason, "could not extend file");
        health.succeeded(None);
        assert_eq!(health.current(), None);
        assert!(!health.is_failing());
    }

    #[test]
    fn a_read_only_database_blocks_only_once_it_lasts() {
        let health = WriteHealth::default();
        health.failed(None, &blocked(Blocker::ReadOnly, "read-only transaction"));
        assert_eq!(health.current(), None, "a failover may be in progress");
        age(&health, Duration::from_secs(6));
        health.failed(None, &blocked(Blocker::ReadOnly, "read-only transaction"));
        assert_eq!(health.current().unwrap().blocker, Some(Blocker::ReadOnly));
    }

    #[test]
    fn any_failure_that_lasts_with_no_success_makes_writes_failing_until_one_succeeds() {
        let health = WriteHealth::default();
        let error = StorageError::from(anyhow::anyhow!(
            "functions used in the WHERE clause must be marked IMMUTABLE"
        ));
        health.failed(None, &error);
        assert!(health.is_failing());
        assert_eq!(health.current(), None, "one failure is not a window");
        age(&health, FAILING_WINDOW);
        health.failed(None, &error);
        let current = health.current().expect("failing for the window");
        assert_eq!(current.class, "other");
        assert_eq!(current.blocker, None);
        assert!(
            current.describe().contains("IMMUTABLE"),
            "{}",
            current.describe()
        );
        // The class named is the last failure's.
        health.failed(
            None,
            &StorageError::Unavailable("connection refused".into()),
        );
        assert_eq!(health.current().unwrap().class, "unavailable");
        health.succeeded(None);
        assert_eq!(health.current(), None);
        // A success between failures starts the window again.
        health.failed(None, &error);
        age(&health, FAILING_WINDOW);
        health.succeeded(None);
        health.failed(None, &error);
        assert_eq!(health.current(), None);
    }

    #[test]
    fn a_failing_node_is_named_until_a_write_to_it_succeeds_whatever_others_do() {
        let health = WriteHealth::default();
        let down = StorageError::Unavailable("connection to the remote node w1:5432 failed".into());
        health.failed(Some("w1:5432"), &down);
        health.succeeded(Some("w2:5432"));
        assert!(!health.is_failing(), "writes to w2 succeed");
        assert_eq!(health.current(), None);
        let nodes = health.failing_nodes();
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].0, "w1:5432");
        assert_eq!(nodes[0].1.class, "unavailable");
        assert!(nodes[0].1.reason.contains("remote node"), "{:?}", nodes[0]);
        health.succeeded(None);
        assert_eq!(health.failing_nodes().len(), 1, "a write of no known node");
        health.succeeded(Some("w1:5432"));
        assert!(health.failing_nodes().is_empty());
        health.failed(Some("w1:5432"), &down);
        health.forget("w1:5432");
        assert!(health.failing_nodes().is_empty());
    }
}
