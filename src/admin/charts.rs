//! What the console draws and how it says times: line charts as inline SVG, server-rendered
//! (no script, styled by the console's own stylesheet), each with a title and a description
//! in words for screen readers; times as "3 min ago" with the exact UTC time on hover.

use chrono::{DateTime, Utc};
use maud::{html, Markup};

use crate::admin::history::{HistoryPoint, HistorySeries};

/// The drawing's coordinates (the SVG's viewBox); it scales to the width of its box.
const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 180.0;
/// Room for the value labels on the left and the time labels below.
const LEFT: f64 = 48.0;
const BOTTOM: f64 = 22.0;
const TOP: f64 = 8.0;
const RIGHT: f64 = 8.0;

/// One figure of the history: its name, its unit, how to read it from a point.
pub struct Measure {
    /// The chart's id in the page (for its title and description).
    pub id: &'static str,
    pub title: &'static str,
    /// The unit in words after a number: "event(s)", "event(s)/s".
    pub unit: &'static str,
    pub value: fn(&HistoryPoint) -> Option<f64>,
}

/// The four charts of the overview.
pub const MEASURES: [Measure; 4] = [
    Measure {
        id: "chart-unsent",
        title: "Backlog (unsent events)",
        unit: "unsent event(s)",
        value: |point| Some(point.unsent as f64),
    },
    Measure {
        id: "chart-parked",
        title: "Parked events",
        unit: "parked event(s)",
        value: |point| Some(point.parked as f64),
    },
    Measure {
        id: "chart-sent-rate",
        title: "Publish rate (events sent per second)",
        unit: "event(s)/s",
        value: |point| point.sent_per_second,
    },
    Measure {
        id: "chart-park-rate",
        title: "Park rate (events parked per second)",
        unit: "event(s)/s",
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

/// How long a chart's range is, in words: "60 min", "24 h".
fn span_words(seconds: f64) -> String {
    let seconds = seconds.round() as i64;
    match seconds {
        ..120 => format!("{seconds} s"),
        120..7200 => format!("{} min", seconds / 60),
        _ => format!("{} h", seconds / 3600),
    }
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

/// `measure` over `series`, whose range ends at `now` (the newest sample's time), as a line
/// chart: a `figure` with an SVG (`role="img"`, its `title` and `desc`) and a caption.
pub fn chart(measure: &Measure, series: &HistorySeries, range_words: &str) -> Markup {
    let values: Vec<(DateTime<Utc>, f64)> = series
        .points
        .iter()
        .filter_map(|point| (measure.value)(point).map(|value| (point.at, value)))
        .collect();
    let end = series.points.last().map(|point| point.at);
    let span = series.span_seconds.max(1.0);
    let top = axis_top(values.iter().map(|(_, value)| *value).fold(0.0, f64::max));
    let x = |at: DateTime<Utc>| {
        let before_end = end.map_or(0.0, |end| (end - at).as_seconds_f64());
        LEFT + (WIDTH - LEFT - RIGHT) * (1.0 - before_end / span).clamp(0.0, 1.0)
    };
    let y = |value: f64| TOP + (HEIGHT - TOP - BOTTOM) * (1.0 - value / top);
    // A line per run of points no more than three steps apart: a gap (the daemon stopped, or
    // the database did not answer) is drawn as one.
    let mut runs: Vec<Vec<String>> = Vec::new();
    let mut previous: Option<DateTime<Utc>> = None;
    for (at, value) in &values {
        let gap = previous
            .is_some_and(|previous| (*at - previous).as_seconds_f64() > 3.0 * series.step_seconds);
        if runs.is_empty() || gap {
            runs.push(Vec::new());
        }
        runs.last_mut()
            .expect("a run was pushed above")
            .push(format!("{:.1},{:.1}", x(*at), y(*value)));
        previous = Some(*at);
    }
    let description = describe(measure, &values, range_words);
    let title_id = format!("{}-title", measure.id);
    let desc_id = format!("{}-desc", measure.id);
    let gridlines = [0.0, 0.5, 1.0].map(|share| (y(top * share), number(top * share)));
    html! {
        figure.chart {
            svg id=(measure.id) role="img" aria-labelledby=(format!("{title_id} {desc_id}"))
                viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) preserveAspectRatio="none"
                data-points=(values.len()) {
                title id=(title_id) { (measure.title) ", " (range_words) }
                desc id=(desc_id) { (description) }
                @for (height, label) in &gridlines {
                    line.grid x1=(LEFT) x2=(WIDTH - RIGHT) y1=(format!("{height:.1}")) y2=(format!("{height:.1}")) {}
                    text.axis x=(LEFT - 4.0) y=(format!("{:.1}", height + 4.0)) text-anchor="end" { (label) }
                }
                text.axis x=(LEFT) y=(HEIGHT - 6.0) text-anchor="start" { (span_words(span)) " ago" }
                text.axis x=(WIDTH - RIGHT) y=(HEIGHT - 6.0) text-anchor="end" { "now" }
                @for run in &runs {
                    @if run.len() == 1 {
                        @let (cx, cy) = run[0].split_once(',').expect("a point is x,y");
                        circle.line cx=(cx) cy=(cy) r="2" {}
                    } @else {
                        polyline.line points=(run.join(" ")) {}
                    }
                }
            }
            figcaption { (measure.title) }
        }
    }
}

/// The chart in words: what it shows, the latest value, the least and the most.
fn describe(measure: &Measure, values: &[(DateTime<Utc>, f64)], range_words: &str) -> String {
    let Some((newest_at, newest)) = values.last() else {
        return format!(
            "No sample yet over the {range_words}: the daemon samples the outbox every few seconds from its start."
        );
    };
    let least = values
        .iter()
        .map(|(_, value)| *value)
        .fold(f64::MAX, f64::min);
    let most = values.iter().map(|(_, value)| *value).fold(0.0, f64::max);
    format!(
        "{} over the {range_words}, {} samples from {} to {}: now {} {}, least {}, most {}.",
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

/// How long before `now` `time` was, in words: "just now", "42 s ago", "3 min ago", "5 h
/// ago", "2 days ago" (and "in ..." for a time after `now`).
pub fn ago(time: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let seconds = (now - time).num_seconds();
    let (amount, future) = (seconds.unsigned_abs(), seconds < 0);
    let words = match amount {
        0..5 => return "just now".to_owned(),
        5..120 => format!("{amount} s"),
        120..7200 => format!("{} min", amount / 60),
        7200..172_800 => format!("{} h", amount / 3600),
        _ => format!("{} days", amount / 86_400),
    };
    if future {
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

/// A text that may be long (an error), folded past `FOLD_AT` characters: its beginning shown,
/// the whole of it on demand.
pub fn folded(text: &str) -> Markup {
    const FOLD_AT: usize = 80;
    if text.chars().count() <= FOLD_AT {
        return html! { span.error { (text) } };
    }
    let beginning: String = text.chars().take(FOLD_AT).collect();
    html! {
        details.error {
            summary { (beginning) "…" }
            pre { (text) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    #[test]
    fn times_read_as_how_long_ago() {
        assert_eq!(ago(at(0), at(2)), "just now");
        assert_eq!(ago(at(0), at(42)), "42 s ago");
        assert_eq!(ago(at(0), at(200)), "3 min ago");
        assert_eq!(ago(at(0), at(5 * 3600 + 10)), "5 h ago");
        assert_eq!(ago(at(0), at(3 * 86_400)), "3 days ago");
        assert_eq!(ago(at(60), at(0)), "in 60 s");
    }

    #[test]
    fn numbers_and_ranges_read_short() {
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(2.0), "2");
        assert_eq!(number(12.34), "12.3");
        assert_eq!(number(1234.4), "1234");
        assert_eq!(span_words(3600.0), "60 min");
        assert_eq!(span_words(86_400.0), "24 h");
        assert_eq!(span_words(90.0), "90 s");
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
    fn a_chart_draws_its_points_and_says_them_in_words() {
        let point = |seconds: i64, unsent: i64| HistoryPoint {
            at: at(seconds),
            unsent,
            parked: 0,
            sent: None,
            newly_parked: None,
            sent_per_second: None,
            parked_per_second: None,
            rates_capped: false,
        };
        let series = HistorySeries {
            step_seconds: 10.0,
            span_seconds: 3600.0,
            points: vec![point(0, 4), point(10, 8), point(20, 2), point(1000, 5)],
        };
        let markup = chart(&MEASURES[0], &series, "last hour").into_string();
        assert!(markup.contains(r#"data-points="4""#), "{markup}");
        assert_eq!(markup.matches("<polyline").count(), 1, "{markup}");
        assert_eq!(markup.matches("<circle").count(), 1, "a gap: {markup}");
        assert!(
            markup.contains("4 samples from 08:00:00 UTC to 08:16:40 UTC: now 5 unsent event(s), least 2, most 8."),
            "{markup}"
        );
        let empty = chart(&MEASURES[2], &series, "last hour").into_string();
        assert!(empty.contains(r#"data-points="0""#), "{empty}");
        assert!(empty.contains("No sample yet"), "{empty}");
    }
}
