//! The database's clock, as the daemon knows it.
//!
//! Every time that decides something is the database's `now()`: when a record expires (set by
//! the write's own statement), whether an expired key may be taken over, what the janitor
//! deletes, whether a key lookup still shows a record. The daemon's clock may be wrong (a bad
//! hardware clock at boot, a restored VM, a step by NTP) and is never compared with a stored
//! time. It is used only to estimate the database's time between two readings: the time
//! stamped on a new entry (`created_at`, which its answer and its events carry, so it must be
//! known before the write's statement is sent) is the daemon's clock corrected by the offset
//! measured at the last reading. Every write batch's statement returns the database's `now()`,
//! so the offset is at most one batch old.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::telemetry;

/// An offset this large (either way) is worth a warning: the daemon's clock is wrong.
const SKEW_WORTH_A_WARNING_MICROS: i64 = 1_000_000;

/// No reading yet.
const UNKNOWN: i64 = i64::MIN;

/// The database's time minus this process's, in microseconds, shared by every writer.
#[derive(Debug, Clone)]
pub struct DatabaseClock {
    offset_micros: Arc<AtomicI64>,
}

impl Default for DatabaseClock {
    fn default() -> Self {
        Self::new()
    }
}

impl DatabaseClock {
    /// A clock with no reading yet: until the first, it is the daemon's own.
    pub fn new() -> Self {
        Self {
            offset_micros: Arc::new(AtomicI64::new(UNKNOWN)),
        }
    }

    /// The database's time now, as last measured, to the microsecond PostgreSQL keeps.
    pub fn now(&self) -> DateTime<Utc> {
        let offset = match self.offset_micros.load(Ordering::Relaxed) {
            UNKNOWN => 0,
            offset => offset,
        };
        let micros = Utc::now().timestamp_micros().saturating_add(offset);
        DateTime::from_timestamp_micros(micros).unwrap_or_else(Utc::now)
    }

    /// The database's offset from this process's clock, once measured.
    pub fn offset(&self) -> Option<chrono::Duration> {
        match self.offset_micros.load(Ordering::Relaxed) {
            UNKNOWN => None,
            offset => Some(chrono::Duration::microseconds(offset)),
        }
    }

    /// Takes in a reading: the database said `database_now` while this process's clock went
    /// from `sent` to `received` (the server's time is taken as the middle of the exchange).
    /// A daemon clock off by more than a second, or one that moved by more than a second since
    /// the last reading, is logged: the database's time is used regardless.
    pub fn observe(
        &self,
        database_now: DateTime<Utc>,
        sent: DateTime<Utc>,
        received: DateTime<Utc>,
    ) {
        let local_micros = sent.timestamp_micros() / 2 + received.timestamp_micros() / 2;
        let offset = database_now.timestamp_micros().saturating_sub(local_micros);
        let previous = self.offset_micros.swap(offset, Ordering::Relaxed);
        metrics::gauge!(telemetry::CLOCK_OFFSET).set(offset as f64 / 1e6);
        let skewed = offset.abs() >= SKEW_WORTH_A_WARNING_MICROS;
        let moved = previous != UNKNOWN
            && offset.saturating_sub(previous).abs() >= SKEW_WORTH_A_WARNING_MICROS;
        let first_skewed = previous == UNKNOWN && skewed;
        if moved || first_skewed {
            let offset_text = describe_offset(offset);
            if skewed {
                tracing::warn!(
                    offset = %offset_text,
                    "this machine's clock differs from the database's; the database's clock decides every time that matters (expiry, takeover, retention), and entries are stamped with it"
                );
            } else {
                tracing::info!(offset = %offset_text, "this machine's clock agrees with the database's again");
            }
        }
    }

    /// Reads the database's clock once, on `client`: at start, so that the first writes are
    /// stamped right.
    pub async fn read(&self, client: &tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
        let sent = Utc::now();
        let row = client.query_one("SELECT clock_timestamp()", &[]).await?;
        self.observe(row.get(0), sent, Utc::now());
        Ok(())
    }
}

/// `+25h 3s` (the database ahead) or `-2s 120ms` (behind), for logs.
fn describe_offset(micros: i64) -> String {
    let magnitude = std::time::Duration::from_micros(micros.unsigned_abs());
    // Whole milliseconds: a reading's precision is a round trip, not a microsecond.
    let magnitude = std::time::Duration::from_millis(magnitude.as_millis() as u64);
    let sign = if micros < 0 { "-" } else { "+" };
    format!(
        "{sign}{} (database minus this machine)",
        humantime::format_duration(magnitude)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_follows_the_database_by_the_measured_offset() {
        let clock = DatabaseClock::new();
        assert!(clock.offset().is_none());
        let local = Utc::now();
        let ahead = local + chrono::Duration::hours(25);
        clock.observe(ahead, local, local + chrono::Duration::milliseconds(2));
        let offset = clock.offset().unwrap();
        assert!(
            (offset - chrono::Duration::hours(25))
                .num_milliseconds()
                .abs()
                <= 2,
            "{offset}"
        );
        let estimated = clock.now();
        assert!(
            (estimated - (Utc::now() + chrono::Duration::hours(25)))
                .num_seconds()
                .abs()
                <= 1,
            "{estimated}"
        );
        assert_eq!(
            describe_offset(-1_500_000),
            "-1s 500ms (database minus this machine)"
        );
    }
}
