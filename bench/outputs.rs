//! What the tools print, read into figures: wrk's and the soak script's result line, pgbench's
//! summary and per-second reports, the daemon's /metrics.

use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};

use crate::stats::{median, Figures, Num};

/// The last line starting with `tag `, parsed as a JSON object (wrk's scripts print one).
pub fn result_line(text: &str, tag: &str) -> Result<Map<String, Value>> {
    let line = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(tag)?.strip_prefix(' '));
    let line = line.with_context(|| format!("no {tag} line"))?;
    match serde_json::from_str(line).with_context(|| format!("{tag} line: {line}"))? {
        Value::Object(map) => Ok(map),
        other => bail!("{tag} line is not an object: {other}"),
    }
}

/// A figure of a result line, with the text the tool printed.
pub fn field(map: &Map<String, Value>, key: &str) -> Option<Num> {
    match map.get(key)? {
        Value::Number(number) => Num::parse(&number.to_string()),
        Value::String(text) => Num::parse(text),
        _ => None,
    }
}

/// wrk's figures, from bench/report.lua's `BENCH_RESULT`: rps, p50_ms, p99_ms, requests, errors
/// (connect + read + write + status + timeout), status_errors (non-2xx).
pub fn wrk_figures(result: &Map<String, Value>) -> Figures {
    let count = |kind: &str| field(result, &format!("errors_{kind}")).map(|n| n.value as i64);
    let kinds = ["connect", "read", "write", "status", "timeout"];
    let errors = kinds.into_iter().map(count).sum::<Option<i64>>();
    let mut figures = Figures::default();
    for name in ["rps", "p50_ms", "p99_ms", "requests"] {
        figures.push(name, field(result, name));
    }
    figures.push("errors", errors.map(Num::int));
    figures.push("status_errors", field(result, "errors_status"));
    figures
}

/// pgbench's figures, from its output: tps, latency_ms (the average), failed (transactions) and
/// transactions (done). With `steady` s, tps and latency_ms are the medians of its last
/// `steady` per-second reports (`-P 1`), those before its first transaction and its first
/// partial second left out.
pub fn pgbench_figures(text: &str, steady: Option<u32>) -> Figures {
    let word = |prefix: &str, index: usize| {
        let line = text.lines().rev().find(|line| line.starts_with(prefix))?;
        Num::parse(line.split_whitespace().nth(index)?)
    };
    let mut figures = Figures::default();
    figures.push("tps", word("tps = ", 2));
    figures.push("latency_ms", word("latency average = ", 3));
    figures.push("failed", word("number of failed transactions:", 4));
    figures.push(
        "transactions",
        word("number of transactions actually processed:", 5),
    );
    let Some(seconds) = steady else {
        return figures;
    };
    // progress: 7.0 s, 512.0 tps, lat 124.650 ms stddev 10.123, 0 failed
    let report = |line: &str| {
        let words: Vec<&str> = line
            .strip_prefix("progress: ")?
            .split_whitespace()
            .collect();
        Some([words.get(2)?.parse().ok()?, words.get(5)?.parse().ok()?])
    };
    let reports = text
        .lines()
        .filter_map(report)
        .skip_while(|r: &[f64; 2]| r[0] == 0.0);
    let reports: Vec<[f64; 2]> = reports.skip(1).collect();
    let steady = &reports[reports.len().saturating_sub(seconds as usize)..];
    for (i, figure) in figures.0[..2].iter_mut().enumerate() {
        let values: Vec<f64> = steady
            .iter()
            .filter_map(|r| Some(Num::fixed(r[i], 1)?.value))
            .collect();
        figure.1 = median(&values).and_then(|v| Num::fixed(v, 1));
    }
    figures
}

/// The sum of a metric's series (Prometheus text) whose labels contain `label`.
pub fn metric(text: &str, name: &str, label: &str) -> f64 {
    let series = text
        .lines()
        .filter_map(|line| line.strip_prefix(name)?.split_once(' '));
    let ours =
        |labels: &str| labels.contains(label) && (labels.is_empty() || labels.starts_with('{'));
    let values = series.filter(|(labels, _)| ours(labels));
    values
        .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `name=text ` of each figure (`-`: none), in order.
    fn texts(figures: &Figures) -> String {
        let mut out = String::new();
        for (name, num) in &figures.0 {
            out += &format!(
                "{name}={} ",
                num.as_ref().map_or("-", |num| num.text.as_str())
            );
        }
        out
    }

    #[test]
    fn what_the_tools_print_read_into_figures() {
        let mut text = String::from("transaction type: bench/conventional.sql\nnumber of transactions actually processed: 45359\nnumber of failed transactions: 0 (0.000%)\nlatency average = 21.147 ms\ninitial connection time = 70.190 ms\ntps = 3026.413026 (without initial connection time)\n");
        let summary = "tps=3026.413026 latency_ms=21.147 failed=0 transactions=45359 ";
        assert_eq!(texts(&pgbench_figures(&text, None)), summary);
        let refused = pgbench_figures("pgbench: error: connection refused\n", Some(3));
        assert_eq!(
            texts(&refused),
            "tps=- latency_ms=- failed=- transactions=- "
        );
        let tps = [0.0, 0.0, 3.0, 40.0, 500.0, 510.0, 490.0, 505.0];
        for (second, tps) in (1..).zip(tps) {
            let latency = if tps > 100.0 { 126.0 } else { 900.0 };
            text += &format!("progress: {second}.0 s, {tps:.1} tps, lat {latency:.3} ms stddev 1.000, 0 failed\n");
        }
        // The zeros and the first partial second are left out; the last three are taken.
        let steady = texts(&pgbench_figures(&text, Some(3)));
        assert!(
            steady.starts_with("tps=505.0 latency_ms=126.0 "),
            "{steady}"
        );
        let text = "Running 5s test\nBENCH_RESULT {\"requests\":97333,\"duration_s\":15.06,\"rps\":6461.60,\"p50_ms\":8.644,\"p90_ms\":20.1,\"p99_ms\":32.912,\"mean_ms\":9.9,\"max_ms\":80.0,\"errors_connect\":0,\"errors_read\":1,\"errors_write\":0,\"errors_status\":2,\"errors_timeout\":3}\n";
        let figures = wrk_figures(&result_line(text, "BENCH_RESULT").unwrap());
        let wrk = "rps=6461.60 p50_ms=8.644 p99_ms=32.912 requests=97333 errors=6 status_errors=2 ";
        assert_eq!(texts(&figures), wrk);
        assert!(result_line("BENCH_RESULT [1]\n", "BENCH_RESULT").is_err());
        let text = "# TYPE x counter\nx_total{table=\"a\"} 7\nx_total{table=\"b\"} 5\nx_sum 12.5\n";
        assert_eq!(metric(text, "x_total", "\"a\""), 7.0);
        assert_eq!(metric(text, "x_total", ""), 12.0);
        assert_eq!(metric(text, "x_sum", ""), 12.5);
    }
}
