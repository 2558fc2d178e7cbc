//! The statistics of the benchmark and the soak: per-run figures as typed numbers that keep the
//! text they are shown with, medians, ratios, targets, and a least-squares slope. (Latency
//! percentiles come from wrk and the end-to-end client.)

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
        Num::parse(&text).expect("an integer is a number")
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

/// Figures by name, in order: what a load or a reading gives, or one run's metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures(pub Vec<(String, Option<Num>)>);

impl Figures {
    /// Named figures, none measured yet.
    pub fn of<'a>(names: impl IntoIterator<Item = &'a str>) -> Figures {
        Figures(names.into_iter().map(|name| (name.into(), None)).collect())
    }

    pub fn num(&self, name: &str) -> Option<&Num> {
        self.0.iter().find(|(n, _)| n == name)?.1.as_ref()
    }

    pub fn get(&self, name: &str) -> Option<f64> {
        self.num(name).map(|num| num.value)
    }

    pub fn push(&mut self, name: &str, value: Option<Num>) {
        self.0.push((name.into(), value));
    }

    /// Sets the figure `name`, if there is one.
    pub fn set(&mut self, name: &str, value: Option<Num>) {
        if let Some(figure) = self.0.iter_mut().find(|(n, _)| n == name) {
            figure.1 = value;
        }
    }

    #[cfg(test)]
    pub fn names(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_str()).collect()
    }
}

/// The values present among `figures`, in order.
pub fn present(figures: &[Option<Num>]) -> Vec<f64> {
    figures.iter().flatten().map(|num| num.value).collect()
}

/// The middle value, or the mean of the two middle values; `None` without values.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut values = values.to_vec();
    values.sort_by(f64::total_cmp);
    let (n, half) = (values.len(), values.len() / 2);
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[half]),
        _ => Some((values[half - 1] + values[half]) / 2.0),
    }
}

/// `value` with `decimals` digits after the point, or `n/a`.
pub fn fmt(value: Option<f64>, decimals: usize) -> String {
    value.map_or("n/a".to_owned(), |value| format!("{value:.decimals$}"))
}

/// Every run's value joined with `/`, as recorded or with `decimals` digits; `n/a` when there is
/// no value.
pub fn per_run(figures: &[Option<Num>], decimals: Option<usize>) -> String {
    let shown = figures.iter().flatten().map(|num| match decimals {
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

/// A least-squares line through points (x, y): its slope, its intercept, and the root mean
/// square of its residuals; `None` with fewer than two points or when every x is the same.
pub fn least_squares(points: &[(f64, f64)]) -> Option<(f64, f64, f64)> {
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
        .map(|p| (p.1 - intercept - slope * p.0).powi(2));
    Some((slope, intercept, (squares.sum::<f64>() / n).sqrt()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the report's rendering (`report::tests`) does not reach: a figure's text kept as
    /// the tool printed it, an even number of runs, missing runs, a ratio judged as shown,
    /// targets at their bounds, a line through points.
    #[test]
    fn figures_medians_ratios_targets_and_lines() {
        let num = Num::parse(" 3026.4130 ").unwrap();
        assert_eq!((num.text.as_str(), num.value), ("3026.4130", 3026.413));
        let invalid = ["", "n/a", "null", "inf"].map(Num::parse);
        assert!(invalid.iter().all(Option::is_none));
        assert_eq!(Num::fixed(0.52249, 3), Num::parse("0.522"));
        let medians = [[3.0, 1.0, 2.0].as_slice(), &[4.0, 1.0, 3.0, 2.0], &[]].map(median);
        assert_eq!(medians, [Some(2.0), Some(2.5), None]);
        // A run without the figure does not count.
        let figures = ["0.571", "", "11.196"].map(Num::parse);
        assert_eq!(present(&figures), [0.571, 11.196]);
        assert_eq!(per_run(&figures, Some(2)), "0.57/11.20");
        // 1.996 shows as 2.00, and 2.00 meets "at least 2.0".
        let shown = ratio(Some(1.996), Some(1.0));
        assert_eq!(fmt(shown, 2), "2.00");
        assert_eq!(Target::AtLeast(2.0).judge(shown), Some(true));
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
        let at_5 = |target: Target| target.judge(Some(5.0));
        assert_eq!(
            [Target::Below(5.0), Target::Above(5.0)].map(at_5),
            [Some(false); 2]
        );
        assert_eq!(
            [Target::AtLeast(5.0), Target::AtMost(5.0)].map(at_5),
            [Some(true); 2]
        );
        // y = 2x + 1 exactly; then symmetric noise around a flat line.
        let points: Vec<_> = (0..10)
            .map(|x| (f64::from(x), f64::from(2 * x + 1)))
            .collect();
        assert_eq!(least_squares(&points), Some((2.0, 1.0, 0.0)));
        let flat: Vec<_> = (0..7)
            .map(|x| (f64::from(x), f64::from(1 - x % 2 * 2)))
            .collect();
        let (slope, _, rms) = least_squares(&flat).unwrap();
        assert!(slope.abs() < 0.2 && (rms - 1.0).abs() < 0.05);
        assert_eq!(least_squares(&[(1.0, 1.0), (1.0, 2.0)]), None);
    }
}
