//! The database's clock, as the daemon knows it.
//!
//! Every time that decides something is the database's `now()`: when a record expires (set by
//! the write's own statement), whether an expired key may be taken over, what the janitor
//! deletes, whether a key lookup still shows a record. The daemon's wall clock may be wrong (a
//! bad hardware clock at boot, a restored VM, a step by NTP) and is never compared with a
//! stored time. The time stamped on a new entry (`created_at`, which its answer and its events
//! carry, so it must be known before the write's statement is sent) is the database's time at
//! the last reading plus the time elapsed since on this process's monotonic clock, which no
//! step of the wall clock moves. Every write batch's statement returns the database's `now()`,
//! so a reading is at most one batch old while writes flow.
//!
//! A monotonic clock stops while the machine is suspended (a paused VM, a laptop's sleep),
//! where the world's time goes on. So before an estimate is used, the wall clock's progress
//! since the reading is compared with the monotonic clock's: when they differ by more than
//! [`STEP_BOUND`] (the wall clock was stepped, or the machine slept), the estimate is not
//! used, and the writer reads the database's clock first. An entry's time is therefore never
//! further off the database's than that bound plus a round trip.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::metric;

/// An offset this large (either way) is worth a warning: the daemon's clock is wrong. Also
/// the most the wall clock and the monotonic clock may disagree about the time elapsed since a
/// reading before the estimate is distrusted.
pub const STEP_BOUND: Duration = Duration::from_secs(1);

/// One reading of the database's clock.
#[derive(Debug, Clone, Copy)]
struct Reading {
    /// What the database said.
    database: DateTime<Utc>,
    /// When it said it, on this process's monotonic clock (the middle of the exchange).
    at: Instant,
    /// And on its wall clock: only ever compared with the wall clock itself.
    wall: DateTime<Utc>,
}

/// The last reading of the database's clock, shared by every writer, and the latest time
/// [`DatabaseClock::now`] gave.
#[derive(Debug, Clone, Default)]
pub struct DatabaseClock {
    last: Arc<Mutex<Option<Reading>>>,
    issued: Arc<Mutex<Option<DateTime<Utc>>>>,
}

impl DatabaseClock {
    /// A clock with no reading yet: [`now`](Self::now) has no estimate until the first.
    pub fn new() -> Self {
        Self::default()
    }

    fn last(&self) -> Option<Reading> {
        // A reading is replaced whole: a panic elsewhere cannot leave it half-written.
        *self.last.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The database's time now, to the microsecond PostgreSQL keeps: the last reading moved on
    /// by the monotonic clock. None before the first reading, and when the wall clock's
    /// progress since it disagrees with the monotonic clock's by more than [`STEP_BOUND`]
    /// (then read the database's clock again: [`read`](Self::read)).
    ///
    /// Never earlier than a time it gave before by less than [`STEP_BOUND`]: each reading places
    /// the database's time in the middle of its round trip, so a new one may put the estimate a
    /// few milliseconds behind the one it replaces, and a write answered after another would be
    /// stamped before it (and listed before it). A larger step back is the database's clock's
    /// own, and is followed.
    pub fn now(&self) -> Option<DateTime<Utc>> {
        let estimate = self.estimate()?;
        let mut issued = self.issued.lock().unwrap_or_else(PoisonError::into_inner);
        let bound = chrono::Duration::from_std(STEP_BOUND).ok()?;
        let now = match *issued {
            Some(before) if before > estimate && before - estimate <= bound => before,
            _ => estimate,
        };
        *issued = Some(now);
        Some(now)
    }

    /// The last reading moved on by the monotonic clock, if it can be trusted.
    fn estimate(&self) -> Option<DateTime<Utc>> {
        let reading = self.last()?;
        let elapsed = reading.at.elapsed();
        let wall_elapsed = Utc::now().signed_duration_since(reading.wall);
        let monotonic_elapsed = chrono::Duration::from_std(elapsed).ok()?;
        let disagreement = (wall_elapsed - monotonic_elapsed).abs();
        if disagreement > chrono::Duration::from_std(STEP_BOUND).ok()? {
            return None;
        }
        let micros = reading
            .database
            .timestamp_micros()
            .saturating_add(i64::try_from(elapsed.as_micros()).ok()?);
        DateTime::from_timestamp_micros(micros)
    }

    /// The database's offset from this process's wall clock at the last reading, once
    /// measured.
    pub fn offset(&self) -> Option<chrono::Duration> {
        self.last()
            .map(|reading| reading.database.signed_duration_since(reading.wall))
    }

    /// Takes in a reading: the database said `database_now` while this process's monotonic
    /// clock went from `sent` to `received` (the server's time is taken as the middle of the
    /// exchange). A daemon clock off by more than [`STEP_BOUND`], or one that moved by more
    /// than that since the last reading, is logged: the database's time is used regardless.
    pub fn observe(&self, database_now: DateTime<Utc>, sent: Instant, received: Instant) {
        let at = sent + received.saturating_duration_since(sent) / 2;
        let since_middle = chrono::Duration::from_std(at.elapsed()).unwrap_or_default();
        let reading = Reading {
            database: database_now,
            at,
            wall: Utc::now() - since_middle,
        };
        let previous = self
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(reading);
        let offset = micros_between(reading.wall, reading.database);
        metrics::gauge!(metric::CLOCK_OFFSET).set(offset as f64 / 1e6);
        let bound = STEP_BOUND.as_micros() as i64;
        let skewed = offset.abs() >= bound;
        let moved = previous.is_some_and(|previous| {
            offset
                .saturating_sub(micros_between(previous.wall, previous.database))
                .abs()
                >= bound
        });
        if moved || (previous.is_none() && skewed) {
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

    /// Reads the database's clock once, on `client`, and returns what it said: at start, and
    /// before a batch whose estimate [`now`](Self::now) distrusts.
    pub async fn read(
        &self,
        client: &tokio_postgres::Client,
    ) -> Result<DateTime<Utc>, tokio_postgres::Error> {
        let sent = Instant::now();
        let row = client.query_one("SELECT clock_timestamp()", &[]).await?;
        let database_now = row.get(0);
        self.observe(database_now, sent, Instant::now());
        Ok(database_now)
    }
}

/// `to - from` in microseconds, saturating.
fn micros_between(from: DateTime<Utc>, to: DateTime<Utc>) -> i64 {
    to.timestamp_micros()
        .saturating_sub(from.timestamp_micros())
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
        assert!(clock.now().is_none(), "no estimate before a reading");
        let ahead = Utc::now() + chrono::Duration::hours(25);
        let sent = Instant::now();
        clock.observe(ahead, sent, sent + Duration::from_millis(2));
        let offset = clock.offset().unwrap();
        assert!(
            (offset - chrono::Duration::hours(25))
                .num_milliseconds()
                .abs()
                <= 50,
            "{offset}"
        );
        let estimated = clock.now().expect("an estimate");
        assert!(
            (estimated - ahead).num_milliseconds().abs() <= 50,
            "{estimated} against {ahead}"
        );
        assert_eq!(
            describe_offset(-1_500_000),
            "-1s 500ms (database minus this machine)"
        );
    }

    #[test]
    fn a_step_of_the_wall_clock_since_the_reading_makes_the_estimate_unusable() {
        let clock = DatabaseClock::new();
        let database = Utc::now();
        // As if the wall clock had been stepped back 25 hours since the reading.
        *clock.last.lock().unwrap() = Some(Reading {
            database,
            at: Instant::now(),
            wall: Utc::now() + chrono::Duration::hours(25),
        });
        assert!(
            clock.now().is_none(),
            "stepped back: read the database again"
        );
        // And forward by two seconds (or two seconds of sleep the monotonic clock missed).
        *clock.last.lock().unwrap() = Some(Reading {
            database,
            at: Instant::now(),
            wall: Utc::now() - chrono::Duration::seconds(2),
        });
        assert!(
            clock.now().is_none(),
            "stepped forward: read the database again"
        );
        // Within the bound, the estimate stands.
        *clock.last.lock().unwrap() = Some(Reading {
            database,
            at: Instant::now(),
            wall: Utc::now() - chrono::Duration::milliseconds(300),
        });
        let estimated = clock.now().expect("within the bound");
        assert!((estimated - database).num_milliseconds().abs() <= 50);
    }

    #[test]
    fn a_new_reading_a_little_behind_does_not_move_the_time_back_and_a_step_back_does() {
        let clock = DatabaseClock::new();
        let database = Utc::now();
        let sent = Instant::now();
        clock.observe(database, sent, sent);
        let first = clock.now().unwrap();
        // A reading whose round trip put the database 5 ms behind the estimate.
        clock.observe(database - chrono::Duration::milliseconds(5), sent, sent);
        let second = clock.now().unwrap();
        assert!(second >= first, "{second} before {first}");
        // The database's own clock stepped back a minute: followed.
        clock.observe(database - chrono::Duration::minutes(1), sent, sent);
        let stepped = clock.now().unwrap();
        assert!(
            first - stepped >= chrono::Duration::seconds(59),
            "{stepped}"
        );
    }
}
