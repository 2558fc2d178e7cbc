//! The statistics of the benchmark and the soak: per-run figures as typed numbers that keep the
//! text they are shown with, medians and extremes over runs, ratios, targets, and a
//! least-squares slope. (Latency percentiles come from wrk and the end-to-end client.)

use std::fmt;

/// One measured figure: its value, and the text that the per-run table shows for it (the tool's
/// own text, e.g. wrk's `6461.60` or pgbench's `3026.413026`, or a value formatted when it was
/// recorded, e.g. `0.522` cores).
#[derive(Clone, Debug, PartialEq)]
pub struct Num {
    pub value: f64,
    pub text: String,
}

impl Num {
    /// A figure as a tool printed it; `None` when it is empty or not a number.
    pub fn parse(text: &str) -> Option<Num> {
        let text = text.trim().to_owned();
        let value: f64 = text.parse().ok()?;
        value.is_finite().then_some(Num { value, text })
    }

    pub fn int(value: i64) -> Num {
        let text = value.to_string();
        Num {
            value: value as f64,
            text,
        }
    }

    /// `value` shown with `decimals` digits after the point, and rounded to them: the number
    /// is the one its text shows, so that a report rebuilt from the per-run table (which holds
    /// the text) comes out the same.
    pub fn fixed(value: f64, decimals: usize) -> Option<Num> {
        Num::parse(&format!("{value:.decimals$}"))
    }

    pub fn flag(yes: bool) -> Num {
        Num::int(i64::from(yes))
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The values present among `values`, in order.
fn present<'a>(values: impl IntoIterator<Item = &'a Option<Num>>) -> Vec<f64> {
    values.into_iter().flatten().map(|num| num.value).collect()
}

/// The median: the middle value, or the mean of the two middle values; `None` without values.
pub fn median<'a>(values: impl IntoIterator<Item = &'a Option<Num>>) -> Option<f64> {
    let mut values = present(values);
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n % 2 {
        _ if n == 0 => None,
        1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

pub fn maximum<'a>(values: impl IntoIterator<Item = &'a Option<Num>>) -> Option<f64> {
    present(values).into_iter().reduce(f64::max)
}

pub fn minimum<'a>(values: impl IntoIterator<Item = &'a Option<Num>>) -> Option<f64> {
    present(values).into_iter().reduce(f64::min)
}

/// `value` with `decimals` digits after the point, or `n/a`.
pub fn fmt(value: Option<f64>, decimals: usize) -> String {
    value.map_or("n/a".to_owned(), |value| format!("{value:.decimals$}"))
}

/// Every run's value joined with `/`, as recorded or with `decimals` digits; `n/a` when there is
/// no value.
pub fn per_run<'a>(
    values: impl IntoIterator<Item = &'a Option<Num>>,
    decimals: Option<usize>,
) -> String {
    let shown = values.into_iter().flatten().map(|num| match decimals {
        Some(d) => format!("{:.d$}", num.value),
        None => num.text.clone(),
    });
    let shown: Vec<String> = shown.collect();
    match shown.is_empty() {
        true => "n/a".to_owned(),
        false => shown.join("/"),
    }
}

/// `a / b` rounded to two decimals (as shown, and as judged); `None` when either is missing or
/// `b` is 0.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    let (a, b) = (a?, b?);
    (b != 0.0).then(|| ((a / b) * 100.0).round() / 100.0)
}

/// Whether a target was met, as the tables say it: `None` when a figure is missing (the
/// scenario did not run).
pub fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "n/a",
    }
}

/// A target on one figure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    AtLeast(f64),
    AtMost(f64),
    Below(f64),
    Above(f64),
}

impl Target {
    pub fn judge(self, value: Option<f64>) -> Option<bool> {
        value.map(|v| match self {
            Target::AtLeast(bound) => v >= bound,
            Target::AtMost(bound) => v <= bound,
            Target::Below(bound) => v < bound,
            Target::Above(bound) => v > bound,
        })
    }
}

/// A least-squares line through points (x, y), and the root mean square of its residuals.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Line {
    pub slope: f64,
    pub intercept: f64,
    pub residual_rms: f64,
}

/// The least-squares line through `points`; `None` with fewer than two points or when every x
/// is the same.
pub fn least_squares(points: &[(f64, f64)]) -> Option<Line> {
    let n = points.len() as f64;
    let mean = |pick: fn(&(f64, f64)) -> f64| points.iter().map(pick).sum::<f64>() / n;
    let (mean_x, mean_y) = (mean(|p| p.0), mean(|p| p.1));
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    if points.len() < 2 || sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let (slope, intercept) = (sxy / sxx, mean_y - sxy / sxx * mean_x);
    let squares = points
        .iter()
        .map(|p| (p.1 - (intercept + slope * p.0)).powi(2));
    let residual_rms = (squares.sum::<f64>() / n).sqrt();
    Some(Line {
        slope,
        intercept,
        residual_rms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nums(values: &[&str]) -> Vec<Option<Num>> {
        values.iter().map(|v| Num::parse(v)).collect()
    }

    #[test]
    fn figures_keep_their_text() {
        let num = Num::parse("1.9173689999999999").unwrap();
        assert_eq!(num.text, "1.9173689999999999");
        assert!((num.value - 1.917369).abs() < 1e-9);
        assert!(["", "n/a", "null", "inf"]
            .iter()
            .all(|text| Num::parse(text).is_none()));
        assert_eq!(
            Num::fixed(0.52249, 3).unwrap(),
            Num {
                value: 0.522,
                text: "0.522".into()
            }
        );
        assert_eq!(Num::flag(true).text, "1");
    }

    #[test]
    fn medians_extremes_and_runs() {
        assert_eq!(median(&nums(&["3", "1", "2"])), Some(2.0));
        assert_eq!(median(&nums(&["4", "1", "3", "2"])), Some(2.5));
        assert_eq!(median(&nums(&[])), None);
        // A run without the figure does not count.
        assert_eq!(median(&nums(&["5", "", "7"])), Some(6.0));
        let values = nums(&["81.0", "79.9", "82.4"]);
        assert_eq!(
            (maximum(&values), minimum(&values)),
            (Some(82.4), Some(79.9))
        );
        assert_eq!(maximum(&nums(&[])), None);
        assert_eq!(per_run(&nums(&["0", "", "0"]), None), "0/0");
        let texts = nums(&["10.571798177", "10.675597435", "11.196098298"]);
        assert_eq!(per_run(&texts, Some(2)), "10.57/10.68/11.20");
        assert_eq!(per_run(&nums(&[]), None), "n/a");
        assert_eq!(
            (fmt(Some(6461.6), 0), fmt(Some(32.506), 2)),
            ("6462".into(), "32.51".into())
        );
        assert_eq!(fmt(None, 1), "n/a");
    }

    #[test]
    fn ratios_are_rounded_as_shown_and_judged_so() {
        assert_eq!(ratio(Some(6462.0), Some(3026.4)), Some(2.14));
        assert_eq!(
            (ratio(Some(1.0), Some(0.0)), ratio(None, Some(1.0))),
            (None, None)
        );
        // 1.996 shows as 2.00, and 2.00 meets "at least 2.0".
        let shown = ratio(Some(1.996), Some(1.0));
        assert_eq!(fmt(shown, 2), "2.00");
        assert_eq!(Target::AtLeast(2.0).judge(shown), Some(true));
    }

    #[test]
    fn targets() {
        assert_eq!(Target::Below(5.0).judge(Some(2.38)), Some(true));
        assert_eq!(Target::Below(5.0).judge(Some(5.0)), Some(false));
        assert_eq!(Target::Above(1.0).judge(Some(1.0)), Some(false));
        assert_eq!(Target::AtLeast(1.0).judge(Some(1.0)), Some(true));
        assert_eq!(Target::AtMost(1.5).judge(Some(1.51)), Some(false));
        assert_eq!(Target::Below(5.0).judge(None), None);
        assert_eq!(
            [Some(true), Some(false), None].map(verdict),
            ["met", "NOT met", "n/a"]
        );
    }

    #[test]
    fn least_squares_slope() {
        // y = 2x + 1 exactly.
        let points: Vec<(f64, f64)> = (0..10)
            .map(|x| (f64::from(x), 2.0 * f64::from(x) + 1.0))
            .collect();
        let line = least_squares(&points).unwrap();
        assert!((line.slope - 2.0).abs() < 1e-12 && (line.intercept - 1.0).abs() < 1e-12);
        assert!(line.residual_rms < 1e-12);
        // Symmetric noise around a flat line: slope 0.
        let flat: Vec<(f64, f64)> = (0..7)
            .map(|x| (f64::from(x), [1.0, -1.0][x as usize % 2]))
            .collect();
        let line = least_squares(&flat).unwrap();
        assert!(line.slope.abs() < 0.2 && (line.residual_rms - 1.0).abs() < 0.05);
        assert_eq!(least_squares(&[(1.0, 1.0)]), None);
        assert_eq!(least_squares(&[(1.0, 1.0), (1.0, 2.0)]), None);
    }
}
