//! The outbox gauges: the backlog, the parked and blocked events and the oldest unsent event's
//! age, read from the database every few seconds by a task of their own, so that scrapes and
//! readiness probes cost the database nothing ([`Backlog`] is what `/readyz` reports). If the
//! database does not answer in time, the gauges keep their last values.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::db::Database;
use crate::outbox::store;
use crate::{lifecycle, metric};

/// How often the outbox gauges are read from the database.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// Unsent and parked events at the last refresh of the gauges, for `/readyz`.
#[derive(Debug)]
pub struct Backlog {
    /// -1 until the first refresh.
    unsent: AtomicI64,
    parked: AtomicI64,
}

impl Default for Backlog {
    fn default() -> Self {
        Self {
            unsent: AtomicI64::new(-1),
            parked: AtomicI64::new(-1),
        }
    }
}

impl Backlog {
    /// Unsent events, as the gauges last read them; None before the first reading.
    pub fn unsent(&self) -> Option<i64> {
        known(&self.unsent)
    }

    /// Parked events, as the gauges last read them; None before the first reading.
    pub fn parked(&self) -> Option<i64> {
        known(&self.parked)
    }
}

fn known(count: &AtomicI64) -> Option<i64> {
    let count = count.load(Ordering::Relaxed);
    (count >= 0).then_some(count)
}

/// Refreshes the outbox gauges and `backlog` every [`REFRESH_INTERVAL`], from `reads`, until
/// `shutdown`: a plain task of the daemon ([`crate::lifecycle`]). A refresh in progress at
/// shutdown is abandoned: it only reads.
pub async fn run(reads: Database, backlog: Arc<Backlog>, shutdown: CancellationToken) {
    lifecycle::every(REFRESH_INTERVAL, shutdown, || async {
        match reads
            .run(async |connection| store::totals(&**connection).await)
            .await
        {
            Ok(totals) => {
                backlog.unsent.store(totals.unsent, Ordering::Relaxed);
                backlog.parked.store(totals.parked, Ordering::Relaxed);
                metrics::gauge!(metric::OUTBOX_UNSENT).set(totals.unsent as f64);
                metrics::gauge!(metric::OUTBOX_PARKED).set(totals.parked as f64);
                metrics::gauge!(metric::OUTBOX_OLDEST_AGE)
                    .set(totals.oldest_unsent_age_seconds.unwrap_or(0.0));
            }
            Err(error) => tracing::debug!(error = %error, "outbox gauges not refreshed"),
        }
        match reads
            .run(async |connection| store::blocked(&**connection).await)
            .await
        {
            Ok(blocked) => {
                metrics::gauge!(metric::OUTBOX_BLOCKED).set(blocked.events as f64);
                metrics::gauge!(metric::OUTBOX_BLOCKED_KEYS).set(blocked.keys as f64);
            }
            Err(error) => tracing::debug!(error = %error, "blocked-key gauges not refreshed"),
        }
    })
    .await
}
