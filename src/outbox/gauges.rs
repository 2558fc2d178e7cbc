//! The outbox gauges: the backlog, the parked and blocked events and the oldest unsent event's
//! age, read
//! from the database every few seconds by a task of their own, so that scrapes and readiness
//! probes cost the database nothing. Each refresh also renews the readiness check. If the
//! database does not answer in time, the gauges keep their last values.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::db::Database;
use crate::http::health::ReadinessMonitor;
use crate::outbox::store;
use crate::{lifecycle, metric};

/// How often the outbox gauges are read from the database.
const REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// Refreshes the readiness gauge and the outbox gauges every [`REFRESH_INTERVAL`], from
/// `reads`, until `shutdown`: a plain task of the daemon ([`crate::lifecycle`]). A refresh in
/// progress at shutdown is abandoned: it only reads.
pub async fn run(reads: Database, readiness: Arc<ReadinessMonitor>, shutdown: CancellationToken) {
    lifecycle::every(REFRESH_INTERVAL, shutdown, || async {
        readiness.current().await;
        match reads
            .run(async |connection| store::totals(&**connection).await)
            .await
        {
            Ok(totals) => {
                readiness.set_outbox(totals.unsent, totals.parked);
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
