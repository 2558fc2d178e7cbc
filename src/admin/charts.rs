//! What the console draws and how it says times: line charts as inline SVG, server-rendered
//! (no script, styled by the console's own stylesheet), each with a title and a description
//! in words for screen readers and each point's time and value on hover (its SVG `title`);
//! times as "3 min ago" with the exact UTC time on hover; durations in their largest unit;
//! long texts folded to one line.

use chrono::{DateTime, TimeZone, Utc};
use maud::{html, Markup};

use crate::admin::history::{HistoryPoint, HistorySeries, Range};

/// The drawing's height in CSS pixels. Its width is the figure's: the outer SVG has no
/// viewBox, so that its text keeps its size (the stylesheet's) at any width, and its labels
/// are placed in percent of the width; the plot inside it is an SVG of its own, stretched to
/// the width ([`PLOT_WIDTH`] units), whose lines keep their width (`non-scaling-stroke`).
const HEIGHT: f64 = 172.0;
/// The plot's top (room for the top value label above it) and height, in pixels.
const PLOT_TOP: f64 = 18.0;
const PLOT_HEIGHT: f64 = 128.0;
/// The plot's width in its own units.
const PLOT_WIDTH: f64 = 1000.0;
/// Where the time labels stand, below the plot.
const TIME_LABEL_Y: f64 = HEIGHT - 8.0;
/// At most this many intervals between time labels: at a phone's width (about 350 px of
/// chart) six labels of "HH:MM:SS" still stand apart.
const MAX_TIME_INTERVALS: i64 = 5;
/// The intervals a time axis is labelled at, in seconds: round times of the clock.
const TIME_STEPS: [i64; 18] = [
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10_800, 21_600, 43_200, 86_400,
];

/// One figure of the history: its name, its unit, how to read it from a point.
pub struct Measure {
    /// The chart's id in the page (for its title and description).
    pub id: &'static str,
    pub title: &'static str,
    /// The unit in words after a number: "unsent event(s)", "event(s)/s".
    pub unit: &'static str,
    /// The unit on the value axis, short: "event(s)", "event(s)/s".
    pub axis_unit: &'static str,
    pub value: fn(&HistoryPoint) -> Option<f64>,
}

/// The four charts of the overview.
pub const MEASURES: [Measure; 4] = [
    Measure {
        id: "chart-unsent",
        title: "Backlog (unsent events)",
        unit: "unsent event(s)",
        axis_unit: "event(s)",
        value: |point| Some(point.unsent as f64),
    },
    Measure {
        id: "chart-parked",
        title: "Parked events",
        unit: "parked event(s)",
        axis_unit: "event(s)",
        value: |point| Some(point.parked as f64),
    },
    Measure {
        id: "chart-sent-rate",
        title: "Publish rate (events sent per second)",
        unit: "event(s)/s",
        axis_unit: "event(s)/s",
        value: |point| point.sent_per_second,
    },
    Measure {
        id: "chart-park-rate",
        title: "Park rate (events parked per second)",
        unit: "event(s)/s",
        axis_unit: "event(s)/s",
        value: |point| point.parked_per_second,
    },
];

/// A number as the charts say it: whole when it is (or is large), else with one or two
/// decimals, without trailing zeros.
pub fn number(value: f64) -> String {
    if value.fract() == 0.0 || value.abs() >= 100.0 {
        return format!("{value:.0}");
    }
    let decimals = if value.abs() >= 1.0 { 1 } else { 2 };
    format!("{value:.decimals$}")
        .trim_end_matches('0')
        .trim_end_matches('.')
        .to_owned()
}

/// The top of the value axis: the largest value rounded up to 1, 2 or 5 times a power of ten
/// (at least 1), so that the labels are round.
fn axis_top(largest: f64) -> f64 {
    if largest <= 1.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(largest.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|step| step * magnitude)
        .find(|top| *top >= largest)
        .unwrap_or(10.0 * magnitude)
}

/// The time a chart of a series shows: from its oldest point to its newest, as long as its
/// range when full (an hour, a day) at most; so that a daemon that started 15 minutes ago
/// draws its 15 minutes across the width. At least a step long.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// The range is full: the window is its whole span.
    pub full: bool,
}

impl Window {
    pub fn of(series: &HistorySeries) -> Option<Window> {
        let (first, last) = (series.points.first()?.at, series.points.last()?.at);
        let held = (last - first).as_seconds_f64();
        let seconds = held.clamp(series.step_seconds, series.span_seconds);
        Some(Window {
            start: last - chrono::Duration::milliseconds((seconds * 1000.0) as i64),
            end: last,
            full: held >= series.span_seconds - series.step_seconds,
        })
    }

    fn seconds(&self) -> f64 {
        (self.end - self.start)
            .as_seconds_f64()
            .max(f64::MIN_POSITIVE)
    }

    /// Where `at` stands across the window, from 0 (its start) to 1 (its end).
    fn share(&self, at: DateTime<Utc>) -> f64 {
        ((at - self.start).as_seconds_f64() / self.seconds()).clamp(0.0, 1.0)
    }

    /// The round times of the clock within the window, a few intervals apart
    /// ([`MAX_TIME_INTERVALS`] at most), each with its label ("HH:MM", or "HH:MM:SS" for
    /// intervals shorter than a minute).
    fn ticks(&self) -> Vec<(DateTime<Utc>, String)> {
        let seconds = self.seconds();
        let step = TIME_STEPS
            .into_iter()
            .find(|step| seconds / *step as f64 <= MAX_TIME_INTERVALS as f64)
            .unwrap_or(86_400);
        let format = if step < 60 { "%H:%M:%S" } else { "%H:%M" };
        let first = self.start.timestamp().div_euclid(step) * step + step;
        (0..)
            .map(|n| first + n * step)
            .map_while(|at| Utc.timestamp_opt(at, 0).single())
            .take_while(|at| *at <= self.end)
            .map(|at| (at, at.format(format).to_string()))
            .collect()
    }
}

/// What a chart of `range` over `series` shows, in words: "the last hour", or, while the
/// daemon has less, "the last 15 min (since this daemon started)".
pub fn window_words(series: &HistorySeries, range: Range) -> String {
    let full = match range {
        Range::Hour => "the last hour",
        Range::Day => "the last day",
    };
    match Window::of(series) {
        Some(window) if !window.full => format!(
            "the last {} (since this daemon started)",
            duration(window.seconds().round() as u64)
        ),
        _ => full.to_owned(),
    }
}

/// `measure` over `series` as a line chart: a `figure` with an SVG (`role="img"`, its
/// `title` and `desc`), the value axis in `measure`'s unit, the time axis at round times of
/// the clock (UTC), a `title` for each point (its time and value, shown on hover), and a
/// caption. `window_words` says what time it shows ([`window_words`]).
pub fn chart(measure: &Measure, series: &HistorySeries, window_words: &str) -> Markup {
    let window = Window::of(series);
    let values: Vec<(DateTime<Utc>, f64)> = series
        .points
        .iter()
        .filter(|point| window.is_some_and(|window| point.at >= window.start))
        .filter_map(|point| (measure.value)(point).map(|value| (point.at, value)))
        .collect();
    let top = axis_top(values.iter().map(|(_, value)| *value).fold(0.0, f64::max));
    let x = |at: DateTime<Utc>| window.map_or(PLOT_WIDTH, |window| PLOT_WIDTH * window.share(at));
    let y = |value: f64| PLOT_HEIGHT * (1.0 - value / top);
    // A line per run of points no more than three steps apart: a gap (the daemon stopped, or
    // the database did not answer) is drawn as one. A lone point is a short dash.
    let mut runs: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut previous: Option<DateTime<Utc>> = None;
    for (at, value) in &values {
        let gap = previous
            .is_some_and(|previous| (*at - previous).as_seconds_f64() > 3.0 * series.step_seconds);
        if runs.is_empty() || gap {
            runs.push(Vec::new());
        }
        runs.last_mut()
            .expect("a run was pushed above")
            .push((x(*at), y(*value)));
        previous = Some(*at);
    }
    let polylines: Vec<String> = runs
        .iter()
        .map(|run| match run.as_slice() {
            [(x, y)] => format!("{:.1},{y:.1} {:.1},{y:.1}", x - 3.0, x + 3.0),
            run => run
                .iter()
                .map(|(x, y)| format!("{x:.1},{y:.1}"))
                .collect::<Vec<_>>()
                .join(" "),
        })
        .collect();
    // Each point's hover area: the plot's height, from halfway to the point before to halfway
    // to the point after.
    let xs: Vec<f64> = values.iter().map(|(at, _)| x(*at)).collect();
    let hover = values.iter().enumerate().map(|(index, (at, value))| {
        let left = index
            .checked_sub(1)
            .map_or(0.0, |before| (xs[before] + xs[index]) / 2.0);
        let right = xs
            .get(index + 1)
            .map_or(PLOT_WIDTH, |after| (xs[index] + after) / 2.0);
        let words = format!("{}: {} {}", clock(*at), number(*value), measure.unit);
        (left, (right - left).max(1.0), words)
    });
    let description = describe(measure, &values, window_words);
    let title_id = format!("{}-title", measure.id);
    let desc_id = format!("{}-desc", measure.id);
    let ticks = window.map(|window| window.ticks()).unwrap_or_default();
    let percent = |at: DateTime<Utc>| window.map_or(100.0, |window| 100.0 * window.share(at));
    let values_axis = [
        (1.0, format!("{} {}", number(top), measure.axis_unit)),
        (0.5, number(top / 2.0)),
        (0.0, "0".to_owned()),
    ];
    html! {
        figure.chart {
            svg id=(measure.id) role="img" aria-labelledby=(format!("{title_id} {desc_id}"))
                width="100%" height=(HEIGHT) data-points=(values.len()) {
                title id=(title_id) { (measure.title) ", " (window_words) }
                desc id=(desc_id) { (description) }
                @for (share, _) in &values_axis {
                    @let height = PLOT_TOP + PLOT_HEIGHT * (1.0 - share);
                    line.grid x1="0" x2="100%" y1=(height) y2=(height) {}
                }
                @for (at, _) in &ticks {
                    @let at = format!("{:.2}%", percent(*at));
                    line.grid.time x1=(at) x2=(at) y1=(PLOT_TOP) y2=(PLOT_TOP + PLOT_HEIGHT) {}
                }
                svg.plot x="0" y=(PLOT_TOP) width="100%" height=(PLOT_HEIGHT)
                    viewBox=(format!("0 0 {PLOT_WIDTH} {PLOT_HEIGHT}")) preserveAspectRatio="none" {
                    @for points in &polylines {
                        polyline.line points=(points) vector-effect="non-scaling-stroke" {}
                    }
                    @for (left, width, words) in hover {
                        rect.point x=(format!("{left:.1}")) y="0" width=(format!("{width:.1}")) height=(PLOT_HEIGHT) {
                            title { (words) }
                        }
                    }
                }
                @for (share, label) in &values_axis {
                    text.axis.value x="4" y=(PLOT_TOP + PLOT_HEIGHT * (1.0 - share) - 4.0) { (label) }
                }
                @for (at, label) in &ticks {
                    @let share = percent(*at);
                    @let anchor = if share < 6.0 { "start" } else if share > 94.0 { "end" } else { "middle" };
                    text.axis.time x=(format!("{share:.2}%")) y=(TIME_LABEL_Y) text-anchor=(anchor) { (label) }
                }
            }
            figcaption { (measure.title) " (times in UTC)" }
        }
    }
}

/// The chart in words: what it shows, the latest value, the least and the most.
fn describe(measure: &Measure, values: &[(DateTime<Utc>, f64)], window_words: &str) -> String {
    let Some((newest_at, newest)) = values.last() else {
        return format!(
            "No sample yet over {window_words}: the daemon samples the outbox every few seconds from its start."
        );
    };
    let least = values
        .iter()
        .map(|(_, value)| *value)
        .fold(f64::MAX, f64::min);
    let most = values.iter().map(|(_, value)| *value).fold(0.0, f64::max);
    format!(
        "{} over {window_words}, {} samples from {} to {}: now {} {}, least {}, most {}.",
        measure.title,
        values.len(),
        clock(values[0].0),
        clock(*newest_at),
        number(*newest),
        measure.unit,
        number(least),
        number(most),
    )
}

/// A time of day in UTC, to the second.
fn clock(time: DateTime<Utc>) -> String {
    time.format("%H:%M:%S UTC").to_string()
}

/// A length of time in the largest unit that fits, whole: "42 s", "11 min", "5 h", "3 days".
pub fn duration(seconds: u64) -> String {
    match seconds {
        ..60 => format!("{seconds} s"),
        60..3600 => format!("{} min", seconds / 60),
        3600..86_400 => format!("{} h", seconds / 3600),
        86_400..172_800 => "1 day".to_owned(),
        _ => format!("{} days", seconds / 86_400),
    }
}

/// How long before `now` `time` was, in words: "just now", "42 s ago", "3 min ago", "5 h
/// ago", "2 days ago" (and "in ..." for a time after `now`).
pub fn ago(time: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let seconds = (now - time).num_seconds();
    if seconds.unsigned_abs() < 5 {
        return "just now".to_owned();
    }
    let words = duration(seconds.unsigned_abs());
    if seconds < 0 {
        format!("in {words}")
    } else {
        format!("{words} ago")
    }
}

/// A time as the console shows it: how long ago, with the exact UTC time in its title (on
/// hover) and `datetime`.
pub fn time(time: DateTime<Utc>, now: DateTime<Utc>) -> Markup {
    let exact = crate::entry::format_time(time);
    html! { time datetime=(exact) title=(exact) { (ago(time, now)) } }
}

/// A text that may be long (an error) on one line, the whole of it on hover (its title):
/// past [`FOLD_AT`] characters, its beginning, cut with "…" where the line ends, then its last
/// words, shown whole while the line has room (an error's routing key or queue); the whole of
/// it on demand.
pub fn folded(text: &str) -> Markup {
    let Some((beginning, end)) = fold(text) else {
        return html! { span.error title=(text) { (text) } };
    };
    html! {
        details.error {
            summary title=(text) { span.fold-beginning { (beginning) } span.fold-end { (end) } }
            pre { (text) }
        }
    }
}

/// Texts longer than this many characters are folded.
const FOLD_AT: usize = 60;
/// The last words a fold always shows: at most this many characters, from a space.
const FOLD_END: usize = 40;

/// `text` split where its last words begin (at a space, at most [`FOLD_END`] characters before
/// its end, the space left out; the last [`FOLD_END`] characters without one), when it is long
/// enough to fold.
fn fold(text: &str) -> Option<(&str, &str)> {
    let length = text.chars().count();
    if length <= FOLD_AT {
        return None;
    }
    let (last_words_from, _) = text.char_indices().nth(length - FOLD_END)?;
    Some(match text[last_words_from..].find(' ') {
        Some(space) => (
            &text[..last_words_from + space],
            &text[last_words_from + space + 1..],
        ),
        None => text.split_at(last_words_from),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    #[test]
    fn times_read_as_how_long_ago_and_durations_in_their_largest_unit() {
        assert_eq!(ago(at(0), at(2)), "just now");
        assert_eq!(ago(at(0), at(42)), "42 s ago");
        assert_eq!(ago(at(0), at(200)), "3 min ago");
        assert_eq!(ago(at(0), at(5 * 3600 + 10)), "5 h ago");
        assert_eq!(ago(at(0), at(3 * 86_400)), "3 days ago");
        assert_eq!(ago(at(90), at(0)), "in 1 min");
        assert_eq!(duration(666), "11 min");
        assert_eq!(duration(3600), "1 h");
        assert_eq!(duration(86_400), "1 day");
    }

    #[test]
    fn numbers_read_short() {
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(2.0), "2");
        assert_eq!(number(12.34), "12.3");
        assert_eq!(number(1234.4), "1234");
    }

    #[test]
    fn the_value_axis_ends_on_a_round_number() {
        assert_eq!(axis_top(0.0), 1.0);
        assert_eq!(axis_top(3.0), 5.0);
        assert_eq!(axis_top(12.0), 20.0);
        assert_eq!(axis_top(100.0), 100.0);
        assert_eq!(axis_top(101.0), 200.0);
    }

    #[test]
    fn a_long_error_folds_to_its_beginning_and_its_last_words() {
        let error = r#"returned by the broker: NO_ROUTE (no queue bound to exchange "retrysafe.events" for routing key "entry.created")"#;
        let (beginning, end) = fold(error).unwrap();
        assert_eq!(end, r#"for routing key "entry.created")"#);
        assert_eq!(format!("{beginning} {end}"), error);
        assert_eq!(fold("short"), None);
        let unspaced = "x".repeat(100);
        assert_eq!(fold(&unspaced).unwrap().1.len(), FOLD_END);
        let markup = folded(error).into_string();
        assert!(markup.contains("fold-end"), "{markup}");
    }

    fn point(seconds: i64, unsent: i64) -> HistoryPoint {
        HistoryPoint {
            at: at(seconds),
            unsent,
            parked: 0,
            sent: None,
            newly_parked: None,
            sent_per_second: None,
            parked_per_second: None,
            rates_capped: false,
        }
    }

    #[test]
    fn the_window_fits_the_samples_until_the_range_is_full_and_is_labelled_at_round_times() {
        let series = |points: Vec<HistoryPoint>| HistorySeries {
            step_seconds: 10.0,
            span_seconds: 3600.0,
            points,
        };
        // 15 minutes of samples: the window is those 15 minutes, labelled every 5.
        let young = series((0..=90).map(|n| point(n * 10, n)).collect());
        let window = Window::of(&young).unwrap();
        assert_eq!(
            (window.start, window.end, window.full),
            (at(0), at(900), false)
        );
        let labels: Vec<String> = window.ticks().into_iter().map(|(_, label)| label).collect();
        assert_eq!(labels, ["08:05", "08:10", "08:15"]);
        assert_eq!(
            window_words(&young, Range::Hour),
            "the last 15 min (since this daemon started)"
        );
        // More than an hour held: the last hour, labelled every 15 minutes.
        let old = series((0..=400).map(|n| point(n * 10, n)).collect());
        let window = Window::of(&old).unwrap();
        assert_eq!(
            (window.start, window.end, window.full),
            (at(400), at(4000), true)
        );
        assert_eq!(window.ticks().len(), 4);
        assert_eq!(window_words(&old, Range::Hour), "the last hour");
    }

    #[test]
    fn a_chart_draws_its_points_each_with_its_title_and_says_them_in_words() {
        let series = HistorySeries {
            step_seconds: 10.0,
            span_seconds: 3600.0,
            points: vec![point(0, 4), point(10, 8), point(20, 2), point(1000, 5)],
        };
        let markup = chart(&MEASURES[0], &series, "the last hour").into_string();
        assert!(markup.contains(r#"data-points="4""#), "{markup}");
        assert_eq!(markup.matches("<polyline").count(), 2, "a gap: {markup}");
        assert_eq!(markup.matches("<rect").count(), 4, "{markup}");
        assert!(
            markup.contains("<title>08:00:10 UTC: 8 unsent event(s)</title>"),
            "{markup}"
        );
        assert!(markup.contains("10 event(s)</text>"), "{markup}");
        assert!(
            markup.contains("4 samples from 08:00:00 UTC to 08:16:40 UTC: now 5 unsent event(s), least 2, most 8."),
            "{markup}"
        );
        let empty = chart(&MEASURES[2], &series, "the last hour").into_string();
        assert!(empty.contains(r#"data-points="0""#), "{empty}");
        assert!(empty.contains("No sample yet"), "{empty}");
    }
}
