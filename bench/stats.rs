//! The statistics of the benchmark and the soak: per-run figures as typed numbers that keep the
//! text they are shown with, medians and extremes over runs, ratios, the judgement of targets,
//! and a least-squares slope. (Latency percentiles come from wrk and `bench-e2e`.)

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
        let text = text.trim();
        let value: f64 = text.parse().ok()?;
        value.is_finite().then(|| Num {
            value,
            text: text.to_owned(),
        })
    }

    pub fn int(value: i64) -> Num {
        Num {
            value: value as f64,
            text: value.to_string(),
        }
    }

    /// `value` shown with `decimals` digits after the point, and rounded to them: the number
    /// is the one its text shows, so that a report rebuilt from the per-run table (which holds
    /// the text) comes out the same.
    pub fn fixed(value: f64, decimals: usize) -> Option<Num> {
        value.is_finite().then(|| {
            let text = format!("{value:.decimals$}");
            Num {
                value: text.parse().unwrap_or(value),
                text,
            }
        })
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
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

pub fn maximum<'a>(values: impl IntoIterator<Item = &'a Option<Num>>) -> Option<f64> {
    present(values).into_iter().reduce(f64::max)
}

pub fn minimum<'a>(values: impl IntoIterator<Item = &'a Option<Num>>) -> Option<f64> {
    present(values).into_iter().reduce(f64::min)
}

/// `value` with `decimals` digits after the point, or `n/a`.
pub fn fmt(value: Option<f64>, decimals: usize) -> String {
    match value {
        Some(value) => format!("{value:.decimals$}"),
        None => "n/a".to_owned(),
    }
}

/// Every run's value joined with `/` (`n/a` for a run without one), as recorded or with
/// `decimals` digits; `n/a` when there is no run.
pub fn per_run<'a>(
    values: impl IntoIterator<Item = &'a Option<Num>>,
    decimals: Option<usize>,
) -> String {
    let shown: Vec<String> = values
        .into_iter()
        .flatten()
        .map(|num| match decimals {
            Some(d) => format!("{:.d$}", num.value),
            None => num.text.clone(),
        })
        .collect();
    if shown.is_empty() {
        "n/a".to_owned()
    } else {
        shown.join("/")
    }
}

/// `a / b` rounded to two decimals (as shown, and as judged); `None` when either is missing or
/// `b` is 0.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => Some(((a / b) * 100.0).round() / 100.0),
        _ => None,
    }
}

/// Whether a target was met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Met,
    NotMet,
    /// A figure is missing (the scenario did not run).
    NotAvailable,
}

impl Verdict {
    pub fn of(met: Option<bool>) -> Verdict {
        match met {
            Some(true) => Verdict::Met,
            Some(false) => Verdict::NotMet,
            None => Verdict::NotAvailable,
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Met => "met",
            Verdict::NotMet => "NOT met",
            Verdict::NotAvailable => "n/a",
        })
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
    pub fn judge(self, value: Option<f64>) -> Verdict {
        Verdict::of(value.map(|v| match self {
            Target::AtLeast(bound) => v >= bound,
            Target::AtMost(bound) => v <= bound,
            Target::Below(bound) => v < bound,
            Target::Above(bound) => v > bound,
        }))
    }

    /// The same target with a bound that is itself a figure (e.g. "p99 below pgbench's average").
    pub fn judge_against(
        value: Option<f64>,
        bound: Option<f64>,
        make: fn(f64) -> Target,
    ) -> Verdict {
        match bound {
            Some(bound) => make(bound).judge(value),
            None => Verdict::NotAvailable,
        }
    }
}

/// A least-squares line through points (x, y).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Line {
    pub slope: f64,
    pub intercept: f64,
    /// The points it was fitted to.
    pub points: usize,
    /// The root mean square of the residuals.
    pub residual_rms: f64,
}

/// The least-squares line through `points`; `None` with fewer than two points or when every x
/// is the same.
pub fn least_squares(points: &[(f64, f64)]) -> Option<Line> {
    let n = points.len();
    if n < 2 {
        return None;
    }
    let count = n as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / count;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / count;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let slope = sxy / sxx;
    let intercept = mean_y - slope * mean_x;
    let residual_rms = (points
        .iter()
        .map(|p| (p.1 - (intercept + slope * p.0)).powi(2))
        .sum::<f64>()
        / count)
        .sqrt();
    Some(Line {
        slope,
        intercept,
        points: n,
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
    fn parse_keeps_the_text() {
        let num = Num::parse("1.9173689999999999").unwrap();
        assert_eq!(num.text, "1.9173689999999999");
        assert!((num.value - 1.917369).abs() < 1e-9);
        assert_eq!(Num::parse(""), None);
        assert_eq!(Num::parse("n/a"), None);
        assert_eq!(Num::parse("null"), None);
        assert_eq!(Num::fixed(0.52249, 3).unwrap().text, "0.522");
        assert_eq!(Num::flag(true).text, "1");
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&nums(&["3", "1", "2"])), Some(2.0));
        assert_eq!(median(&nums(&["4", "1", "3", "2"])), Some(2.5));
        assert_eq!(
            median(&nums(&["6461.60", "6345.19", "6996.96"])),
            Some(6461.60)
        );
        assert_eq!(median(&nums(&[])), None);
        // A run without the figure does not count.
        assert_eq!(median(&nums(&["5", "", "7"])), Some(6.0));
    }

    #[test]
    fn extremes() {
        let values = nums(&["81.0", "79.9", "82.4"]);
        assert_eq!(maximum(&values), Some(82.4));
        assert_eq!(minimum(&values), Some(79.9));
        assert_eq!(maximum(&nums(&[])), None);
    }

    #[test]
    fn per_run_values() {
        assert_eq!(per_run(&nums(&["0", "0", "0"]), None), "0/0/0");
        assert_eq!(
            per_run(
                &nums(&["10.571798177", "10.675597435", "11.196098298"]),
                Some(2)
            ),
            "10.57/10.68/11.20"
        );
        assert_eq!(per_run(&nums(&[]), None), "n/a");
    }

    #[test]
    fn ratios_are_rounded_as_shown_and_judged_so() {
        assert_eq!(ratio(Some(6462.0), Some(3026.4)), Some(2.14));
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
        // 1.996 shows as 2.00, and 2.00 meets "at least 2.0".
        let shown = ratio(Some(1.996), Some(1.0));
        assert_eq!(fmt(shown, 2), "2.00");
        assert_eq!(Target::AtLeast(2.0).judge(shown), Verdict::Met);
        assert_eq!(
            Target::AtLeast(0.8).judge(ratio(Some(9367.2), Some(11679.1))),
            Verdict::Met
        );
    }

    #[test]
    fn targets() {
        assert_eq!(Target::Below(5.0).judge(Some(2.38)), Verdict::Met);
        assert_eq!(Target::Below(5.0).judge(Some(5.0)), Verdict::NotMet);
        assert_eq!(Target::Above(1.0).judge(Some(1.0)), Verdict::NotMet);
        assert_eq!(Target::AtLeast(1.0).judge(Some(1.0)), Verdict::Met);
        assert_eq!(Target::AtMost(1.5).judge(Some(1.5)), Verdict::Met);
        assert_eq!(Target::AtMost(1.5).judge(Some(1.51)), Verdict::NotMet);
        assert_eq!(Target::Below(5.0).judge(None), Verdict::NotAvailable);
        assert_eq!(
            Target::judge_against(Some(32.5), Some(21.15), Target::Below),
            Verdict::NotMet
        );
        assert_eq!(
            Target::judge_against(Some(32.5), None, Target::Below),
            Verdict::NotAvailable
        );
        assert_eq!(Verdict::NotMet.to_string(), "NOT met");
        assert_eq!(Verdict::NotAvailable.to_string(), "n/a");
    }

    #[test]
    fn fmt_rounds_or_says_na() {
        assert_eq!(fmt(Some(6461.6), 0), "6462");
        assert_eq!(fmt(Some(32.506), 2), "32.51");
        assert_eq!(fmt(None, 1), "n/a");
    }

    #[test]
    fn least_squares_slope() {
        // y = 2x + 1 exactly.
        let points: Vec<(f64, f64)> = (0..10)
            .map(|x| (f64::from(x), 2.0 * f64::from(x) + 1.0))
            .collect();
        let line = least_squares(&points).unwrap();
        assert!((line.slope - 2.0).abs() < 1e-12);
        assert!((line.intercept - 1.0).abs() < 1e-12);
        assert!(line.residual_rms < 1e-12);
        assert_eq!(line.points, 10);
        // Symmetric noise around a flat line: slope 0.
        let flat = [
            (0.0, 1.0),
            (1.0, -1.0),
            (2.0, 1.0),
            (3.0, -1.0),
            (4.0, 1.0),
            (5.0, -1.0),
            (6.0, 1.0),
        ];
        let line = least_squares(&flat).unwrap();
        assert!(line.slope.abs() < 0.2);
        assert!((line.residual_rms - 1.0).abs() < 0.05);
        assert_eq!(least_squares(&[(1.0, 1.0)]), None);
        assert_eq!(least_squares(&[(1.0, 1.0), (1.0, 2.0)]), None);
    }
}
