//! The outbox's recent history, for the console's charts and `GET /admin/v1/outbox/history`:
//! the backlog (unsent events), the parked events, and the rates at which events were sent and
//! parked, sampled by the daemon every [`SAMPLE_INTERVAL`] into two rings of fixed size, one
//! for the last hour and one for the last day. Kept in memory: a restart starts them empty, and
//! each daemon keeps its own.
//!
//! Every sample is one read-only statement ([`SAMPLE`]) on the read pool, with the database's
//! time (the daemon's one clock): the counts as the gauges take them (at most
//! [`GAUGE_COUNT_CAP`] rows each), and the events sent and parked since the previous sample,
//! counted through the partial indexes of sent and of parked events. So a sample costs what a
//! gauge refresh costs whatever the size of the table, and the figures are the whole outbox's:
//! daemons that share one outbox draw the same curves (each from its own start), the rates
//! being every relay's together.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::GenericClient;
use tokio_util::sync::CancellationToken;

use crate::db::outbox_state::parked;
use crate::db::{Database, StorageError};
use crate::lifecycle;
use crate::outbox::store::{capped_backlog, GAUGE_COUNT_CAP};

/// How often the daemon samples the outbox.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(10);
/// Samples in the last hour's ring: an hour at [`SAMPLE_INTERVAL`].
pub const HOUR_POINTS: usize = 360;
/// Samples folded into one point of the day's ring: five minutes at [`SAMPLE_INTERVAL`].
pub const DAY_FOLD: usize = 30;
/// Points in the day's ring: a day of five-minute points.
pub const DAY_POINTS: usize = 288;

/// One statement, so one snapshot and one time: the backlog as the gauges count it
/// ([`capped_backlog!`]), and the rates. The rates' window ends `$3` seconds before the
/// database's now, one sample interval: a relay stamps `sent_at` (and `failed_at`) with its
/// batch's start and commits after publishing, so an event is counted once its batch took less
/// than that to commit; the window starts where the previous one ended (`$2`), so no event is
/// counted twice. Sent events are found through `outbox_events_sent` (sent_at), at most `$1`
/// of them; newly parked ones among the `$1` newest parked events (`outbox_events_parked`, by
/// id), where a parked event that was retried and parked again counts again. Plain aggregates:
/// nothing Citus would refuse.
const SAMPLE: &str = concat!(
    "
SELECT now(),
       now() - make_interval(secs => $3),
       ",
    capped_backlog!(),
    ",
       (SELECT count(*) FROM (SELECT 1 FROM outbox_events
                              WHERE sent_at > $2 AND sent_at <= now() - make_interval(secs => $3)
                              LIMIT $1) sent),
       (SELECT count(*) FILTER (WHERE failed_at > $2
                                  AND failed_at <= now() - make_interval(secs => $3))
        FROM (SELECT failed_at FROM outbox_events
              WHERE ",
    parked!(),
    "
              ORDER BY id DESC LIMIT $1) newest_parked)"
);

/// The outbox at one moment, and what happened since the point before.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub struct HistoryPoint {
    /// The database's time of the sample.
    pub at: DateTime<Utc>,
    /// Unsent events that are not parked, counted up to `counts_capped_at`.
    pub unsent: i64,
    /// Parked events, counted up to `counts_capped_at`.
    pub parked: i64,
    /// Events sent in the point's window (every relay's): since the previous point's window,
    /// ending a sample interval before `at`; null for the first sample after the daemon
    /// started.
    pub sent: Option<i64>,
    /// Events parked in the point's window; null for the first sample.
    pub newly_parked: Option<i64>,
    /// `sent` per second of the window.
    pub sent_per_second: Option<f64>,
    /// Events parked per second over the point's window; null for the first sample.
    pub parked_per_second: Option<f64>,
    /// The rates' counts reached `counts_capped_at`: the rates are lower bounds.
    pub rates_capped: bool,
}

/// What one sample read.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: DateTime<Utc>,
    /// Where its rates' window ended: where the next one starts.
    window_end: DateTime<Utc>,
    unsent: i64,
    parked: i64,
    /// Events sent and parked in the window, and its length; None without a previous sample.
    window: Option<Window>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Window {
    sent: i64,
    parked: i64,
    seconds: f64,
    capped: bool,
}

impl Window {
    fn add(self, other: Window) -> Window {
        Window {
            sent: self.sent + other.sent,
            parked: self.parked + other.parked,
            seconds: self.seconds + other.seconds,
            capped: self.capped || other.capped,
        }
    }
}

impl Sample {
    fn point(&self, window: Option<Window>) -> HistoryPoint {
        let rate = |count: i64, window: &Window| {
            (window.seconds > 0.0).then(|| count as f64 / window.seconds)
        };
        HistoryPoint {
            at: self.at,
            unsent: self.unsent,
            parked: self.parked,
            sent: window.map(|window| window.sent),
            newly_parked: window.map(|window| window.parked),
            sent_per_second: window.as_ref().and_then(|window| rate(window.sent, window)),
            parked_per_second: window
                .as_ref()
                .and_then(|window| rate(window.parked, window)),
            rates_capped: window.is_some_and(|window| window.capped),
        }
    }
}

/// The two rings, and the samples waiting to be folded into the day's.
#[derive(Debug, Default)]
struct Rings {
    hour: VecDeque<HistoryPoint>,
    day: VecDeque<HistoryPoint>,
    /// The previous sample's window end: the next window's start.
    last_window_end: Option<DateTime<Utc>>,
    /// Samples since the last day point, and their windows added up.
    folding: usize,
    folded: Option<Window>,
}

impl Rings {
    fn push(&mut self, sample: Sample) {
        self.last_window_end = Some(sample.window_end);
        push_bounded(&mut self.hour, sample.point(sample.window), HOUR_POINTS);
        self.folded = match (self.folded, sample.window) {
            (Some(folded), Some(window)) => Some(folded.add(window)),
            (folded, window) => folded.or(window),
        };
        self.folding += 1;
        if self.folding == DAY_FOLD {
            push_bounded(&mut self.day, sample.point(self.folded), DAY_POINTS);
            self.folding = 0;
            self.folded = None;
        }
    }
}

fn push_bounded(ring: &mut VecDeque<HistoryPoint>, point: HistoryPoint, capacity: usize) {
    if ring.len() == capacity {
        ring.pop_front();
    }
    ring.push_back(point);
}

/// The outbox's history on this daemon: rings of fixed size, filled by [`run`].
#[derive(Debug)]
pub struct OutboxHistory {
    rings: Mutex<Rings>,
    /// How often [`run`] samples ([`SAMPLE_INTERVAL`], shorter in tests).
    pub interval: Duration,
}

/// A range of history as the API and the console show it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct HistorySeries {
    /// Seconds between two points (the day's last points, taken since its last five-minute
    /// point, are the samples themselves).
    pub step_seconds: f64,
    /// Seconds the range covers when full.
    pub span_seconds: f64,
    /// Oldest first.
    pub points: Vec<HistoryPoint>,
}

/// Which range of history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    Hour,
    Day,
}

impl Range {
    pub fn as_str(self) -> &'static str {
        match self {
            Range::Hour => "hour",
            Range::Day => "day",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "hour" => Some(Range::Hour),
            "day" => Some(Range::Day),
            _ => None,
        }
    }
}

impl OutboxHistory {
    pub fn new(interval: Duration) -> Self {
        Self {
            rings: Mutex::default(),
            interval,
        }
    }

    /// The points of `range`, oldest first. The day's are its five-minute points, then the
    /// samples taken since the last of them (fewer than [`DAY_FOLD`]), so that the day's range
    /// has points from the daemon's first sample, as the hour's has, and ends where it ends.
    pub fn series(&self, range: Range) -> HistorySeries {
        let rings = self
            .rings
            .lock()
            .expect("no code panics holding the rings' lock");
        let (points, step, capacity) = match range {
            Range::Hour => (
                rings.hour.iter().copied().collect(),
                self.interval,
                HOUR_POINTS,
            ),
            Range::Day => {
                let folded_until = rings.day.back().map(|point| point.at);
                let since_then = rings
                    .hour
                    .iter()
                    .filter(|sample| folded_until.is_none_or(|until| sample.at > until));
                (
                    rings.day.iter().chain(since_then).copied().collect(),
                    self.interval * DAY_FOLD as u32,
                    DAY_POINTS,
                )
            }
        };
        HistorySeries {
            step_seconds: step.as_secs_f64(),
            span_seconds: step.as_secs_f64() * capacity as f64,
            points,
        }
    }

    /// Takes one sample now, from `reads`.
    pub async fn sample(&self, reads: &Database) -> Result<(), StorageError> {
        let since = self
            .rings
            .lock()
            .expect("no code panics holding the rings' lock")
            .last_window_end;
        let lag = self.interval.as_secs_f64();
        let sample = reads
            .run(async |connection| read_sample(&**connection, since, lag).await)
            .await?;
        self.rings
            .lock()
            .expect("no code panics holding the rings' lock")
            .push(sample);
        Ok(())
    }
}

async fn read_sample(
    client: &impl GenericClient,
    since: Option<DateTime<Utc>>,
    lag_seconds: f64,
) -> Result<Sample, StorageError> {
    let row = client
        .query_one(SAMPLE, &[&GAUGE_COUNT_CAP, &since, &lag_seconds])
        .await?;
    let window_end: DateTime<Utc> = row.get(1);
    let (sent, parked): (i64, i64) = (row.get(4), row.get(5));
    Ok(Sample {
        at: row.get(0),
        window_end,
        unsent: row.get(2),
        parked: row.get(3),
        // Without a previous sample the counts ran over no window (`> NULL` matches nothing).
        window: since.map(|since| Window {
            sent,
            parked,
            seconds: (window_end - since).as_seconds_f64().max(0.0),
            capped: sent >= GAUGE_COUNT_CAP || parked >= GAUGE_COUNT_CAP,
        }),
    })
}

/// Samples the outbox into `history` every `history.interval` until `shutdown`: a plain task of
/// the daemon ([`crate::lifecycle`]), started with the admin listener. A sample the database
/// does not answer is left out (the charts show a gap in time, not a made-up value).
pub async fn run(
    reads: Database,
    history: std::sync::Arc<OutboxHistory>,
    shutdown: CancellationToken,
) {
    let interval = history.interval;
    lifecycle::every(interval, shutdown, || async {
        if let Err(error) = history.sample(&reads).await {
            tracing::debug!(error = %error, "outbox history not sampled");
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seconds: i64, window: Option<Window>) -> Sample {
        let at = DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap();
        Sample {
            at,
            window_end: at,
            unsent: seconds,
            parked: 1,
            window,
        }
    }

    #[test]
    fn the_rings_keep_their_size_and_the_day_folds_the_hour() {
        let mut rings = Rings::default();
        rings.push(sample(0, None));
        let window = Window {
            sent: 20,
            parked: 1,
            seconds: 10.0,
            capped: false,
        };
        for n in 1..(HOUR_POINTS as i64 + 100) {
            rings.push(sample(n * 10, Some(window)));
        }
        assert_eq!(rings.hour.len(), HOUR_POINTS);
        assert_eq!(rings.hour.back().unwrap().sent_per_second, Some(2.0));
        assert_eq!(rings.hour.back().unwrap().sent, Some(20));
        assert_eq!(rings.hour.back().unwrap().parked_per_second, Some(0.1));
        assert_eq!(
            rings.hour.front().unwrap().unsent,
            1000,
            "the oldest went first"
        );
        assert_eq!(rings.day.len(), (HOUR_POINTS + 99) / DAY_FOLD);
        // The first day point folds the first sample (no window) with 29 windows.
        assert_eq!(rings.day[0].sent_per_second, Some(2.0));
        assert_eq!(rings.day[0].sent, Some(20 * 29));
        assert_eq!(rings.day[0].newly_parked, Some(29));
        assert!(rings.hour[0].sent_per_second.is_some());
    }

    #[test]
    fn the_day_has_points_from_the_first_sample_and_ends_with_the_latest() {
        let history = OutboxHistory::new(Duration::from_secs(10));
        let day = |history: &OutboxHistory| history.series(Range::Day).points;
        history.rings.lock().unwrap().push(sample(0, None));
        assert_eq!(day(&history).len(), 1, "the first sample, before any fold");
        for n in 1..(DAY_FOLD as i64 + 15) {
            history.rings.lock().unwrap().push(sample(n * 10, None));
        }
        let points = day(&history);
        // The first five-minute point (at the 30th sample), then the 15 samples since.
        assert_eq!(points.len(), 16, "{points:?}");
        assert_eq!(points[0].unsent, (DAY_FOLD as i64 - 1) * 10);
        assert_eq!(points.last().unwrap().unsent, (DAY_FOLD as i64 + 14) * 10);
        assert!(points.windows(2).all(|pair| pair[0].at < pair[1].at));
    }
}
