//! Writes that fail for a reason only an operator can fix: the database's disk is full, the
//! database is read-only, or it takes no more connections. Such a failure is certain (nothing
//! was written), is told to the client in those words, and, while it lasts, makes the daemon
//! unready (`/readyz` 503), where a passing fault (a lost connection, a timeout) does not.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::telemetry;

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

/// With no write failing for this long, a blocker is taken to have passed even if no write has
/// succeeded since: the daemon is ready again, and the next write tells.
const FORGOTTEN_AFTER: Duration = Duration::from_secs(60);

/// The write path's last word on whether the database takes writes: set by writers when a batch
/// fails for a [`Blocker`], cleared when one commits; read by `/readyz`.
#[derive(Debug, Clone, Default)]
pub struct WriteHealth(Arc<Mutex<Option<Blocked>>>);

#[derive(Debug, Clone)]
struct Blocked {
    blocker: Blocker,
    reason: String,
    first: Instant,
    last: Instant,
}

/// A blocker that makes the daemon unready: what, the database's words, and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentBlocker {
    pub blocker: Blocker,
    pub reason: String,
    pub for_how_long: Duration,
}

impl WriteHealth {
    /// A write failed because of `blocker`; `reason` is the database's message.
    pub fn failed(&self, blocker: Blocker, reason: &str) {
        let now = Instant::now();
        let mut state = self.lock();
        match state.as_mut() {
            Some(blocked) if blocked.blocker == blocker => {
                blocked.last = now;
                blocked.reason = reason.to_owned();
            }
            _ => {
                tracing::warn!(
                    blocker = blocker.as_str(),
                    reason,
                    "writes fail: {}; {} (the daemon reports itself unready while this lasts)",
                    blocker.describe(),
                    blocker.remedy()
                );
                *state = Some(Blocked {
                    blocker,
                    reason: reason.to_owned(),
                    first: now,
                    last: now,
                });
                set_gauges(Some(blocker));
            }
        }
    }

    /// A write committed: whatever blocked writes has passed.
    pub fn succeeded(&self) {
        let mut state = self.lock();
        if let Some(blocked) = state.take() {
            tracing::info!(
                blocker = blocked.blocker.as_str(),
                after = %humantime::format_duration(round_to_seconds(blocked.first.elapsed())),
                "writes succeed again"
            );
            set_gauges(None);
        }
    }

    /// The blocker that makes the daemon unready now, if any: one that has lasted long enough
    /// and has not gone quiet.
    pub fn current(&self) -> Option<CurrentBlocker> {
        let mut state = self.lock();
        let blocked = state.as_ref()?;
        if blocked.last.elapsed() > FORGOTTEN_AFTER {
            *state = None;
            set_gauges(None);
            return None;
        }
        let lasted = blocked.last.duration_since(blocked.first);
        (lasted >= blocked.blocker.persists_after()).then(|| CurrentBlocker {
            blocker: blocked.blocker,
            reason: blocked.reason.clone(),
            for_how_long: round_to_seconds(blocked.first.elapsed()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Blocked>> {
        // The state is replaced whole: a panic elsewhere cannot leave it half-written.
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
        metrics::gauge!(telemetry::WRITES_BLOCKED, "reason" => blocker.as_str()).set(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_blocks_at_once_and_a_commit_clears_it() {
        let health = WriteHealth::default();
        assert_eq!(health.current(), None);
        health.failed(Blocker::DiskFull, "could not extend file");
        let current = health.current().expect("blocked");
        assert_eq!(current.blocker, Blocker::DiskFull);
        assert_eq!(current.reason, "could not extend file");
        health.succeeded();
        assert_eq!(health.current(), None);
    }

    #[test]
    fn a_read_only_database_blocks_only_once_it_lasts() {
        let health = WriteHealth::default();
        health.failed(Blocker::ReadOnly, "read-only transaction");
        assert_eq!(health.current(), None, "a failover may be in progress");
        {
            let mut state = health.lock();
            let blocked = state.as_mut().unwrap();
            blocked.first -= Duration::from_secs(6);
        }
        assert_eq!(health.current().unwrap().blocker, Blocker::ReadOnly);
        {
            let mut state = health.lock();
            let blocked = state.as_mut().unwrap();
            blocked.first -= FORGOTTEN_AFTER;
            blocked.last -= FORGOTTEN_AFTER + Duration::from_secs(1);
        }
        assert_eq!(health.current(), None, "quiet for long: forgotten");
    }
}
