//! BENCHMARKS.md: its tables described as data (`RESULTS`, `CHECKS`), each figure taken from
//! the runs' per-run values, rendered into the template bench/report.md; what the file has below
//! the hand-written marker is kept.

use std::collections::HashMap;

use crate::stats::{fmt, median, per_run, present, ratio, verdict, Figures, Num, Target};

/// The line after which BENCHMARKS.md is written by hand: `bench/run` keeps everything below it
/// when it rewrites the file.
pub const HAND_WRITTEN_MARKER: &str =
    "<!-- Everything below this line is written by hand: bench/run keeps it when it rewrites the file. -->";

/// What the generated file has below the marker when there is no hand-written part yet.
const READING_PLACEHOLDER: &str = "## Reading

_To be written by a person after a full run: where the time goes in each scenario, what limits
each figure (PostgreSQL commits and WAL flushes, RabbitMQ confirms, the 2 shared cores, wrk's
own CPU), and, for each target not met, what stands in the way, with the profile that shows it._
";

/// The generated part of BENCHMARKS.md, `{name}` filled in by `Report::render_generated`.
const TEMPLATE: &str = include_str!("report.md");

/// The scenarios BENCHMARKS.md reports, in its order.
pub const REPORTED: [&str; 7] = [
    "writes", "replays", "storm", "drain", "e2e", "ordered", "latency",
];

/// `text` with each `{name}` that `lookup` knows replaced by its value.
pub fn fill(text: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        let name_len = rest[open + 1..].find(|c: char| !c.is_ascii_alphanumeric() && c != '_');
        let value = name_len
            .filter(|&n| rest[open + 1 + n..].starts_with('}'))
            .and_then(|n| Some((n, lookup(&rest[open + 1..open + 1 + n])?)));
        match value {
            Some((n, value)) => {
                out.push_str(&rest[..open]);
                out.push_str(&value);
                rest = &rest[open + n + 2..];
            }
            None => {
                out.push_str(&rest[..=open]);
                rest = &rest[open + 1..];
            }
        }
    }
    out + rest
}

/// A CPU cost per 1,000 in three parts (`<prefix>cost_daemon`, `_postgres`, `_rabbitmq`): their
/// sum as recorded (3 decimals), so that the report rebuilt from its per-run table gives the
/// same total; None if a part is missing.
fn cost(run: &Figures, prefix: &str) -> Option<Num> {
    let mut thousandths = 0.0;
    for part in ["daemon", "postgres", "rabbitmq"] {
        thousandths += (run.get(&format!("{prefix}cost_{part}"))? * 1000.0).round();
    }
    Num::fixed(thousandths / 1000.0, 3)
}

/// A figure of the results table, from the runs of one scenario.
enum Figure {
    /// No figure: "–".
    Dash,
    /// The median of a metric, with so many decimals.
    Median(&'static str, &'static str, usize),
    /// A figure and, in brackets after a label, another: "41.29 (p50 12.00)".
    Noted(&'static Figure, &'static str, &'static Figure),
    /// A CPU cost per 1,000 (3 decimals) and, in brackets, the busy share of the CPUs while the
    /// load ran: "0.395 (busy 89.6 %)".
    Busy(&'static str, &'static str, &'static str),
    /// CPU costs per 1,000 in three parts (see `cost`), of each prefix, joined with " + ": each
    /// the median of the runs' totals and, in brackets after the label, the median of each part.
    Costs(&'static str, &'static str, &'static [&'static str]),
    /// Every run's value: "100000/100000/100000".
    PerRun(&'static str, &'static str),
}

/// How a row of the results table judges its figure.
enum Judge {
    /// No target.
    Nothing,
    /// The ratio of the figure to its baseline (rounded as shown) against a bound.
    Ratio(Target),
    /// The figure against a bound.
    Value(Target),
    /// The figure against its baseline as the bound.
    Baseline(fn(f64) -> Target),
    /// Every run's flag (a metric that is 1 or 0) is 1.
    EveryRun(&'static str, &'static str),
}

/// A row of the results table: scenario, measure, figure, baseline, whether the row shows their
/// ratio, target, judgement. `{name}` in its texts is a setting (see `Settings::var`).
struct Row(
    &'static str,
    &'static str,
    Figure,
    Figure,
    bool,
    &'static str,
    Judge,
);

use Figure::{Busy, Costs, Dash, Median, Noted, PerRun};
use Judge::{Baseline, EveryRun, Nothing, Ratio, Value};

/// The results: each figure beside its baseline, with its target. (The writes' rate has none
/// now: see "Targets" in the hand-written part of BENCHMARKS.md.)
#[rustfmt::skip]
const RESULTS: [Row; 25] = [
    Row("unique-key writes, {connections} conn.", "requests/s vs pgbench conventional tps",
        Median("writes", "rps", 0), Median("writes", "pg_tps", 0), true, "–", Nothing),
    Row("unique-key writes", "p99 latency vs pgbench average latency (ms)",
        Noted(&Median("writes", "p99_ms", 2), "p50", &Median("writes", "p50_ms", 2)),
        Median("writes", "pg_latency_ms", 2), true, "p99 < pgbench avg", Baseline(Target::Below)),
    Row("unique-key writes", "CPU s per 1,000 writes (daemon + PostgreSQL + RabbitMQ, events delivered) vs PostgreSQL's per 1,000 pgbench transactions",
        Costs("writes", "medians: ", &[""]), Median("writes", "pg_cost", 3), true, "–", Nothing),
    Row("unique-key writes", "CPU s per 1,000, whole machine (every process, load generators included): writes, events delivered, vs pgbench transactions; in brackets the machine's busy share while the load ran",
        Busy("writes", "machine_cost", "machine_busy_pct"),
        Busy("writes", "pg_machine_cost", "pg_machine_busy_pct"), true, "–", Nothing),
    Row("unique-key writes, broker unreachable", "requests/s (p99 ms) while no event is delivered vs pgbench conventional tps",
        Noted(&Median("writes", "alone_rps", 0), "p99", &Median("writes", "alone_p99_ms", 2)),
        Median("writes", "pg_tps", 0), true, "–", Nothing),
    Row("unique-key writes", "CPU s per 1,000: the write alone (broker unreachable) + delivering its events afterwards (daemon + PostgreSQL + RabbitMQ each)",
        Costs("writes", "", &["alone_", "delivery_"]), Median("writes", "pg_cost", 3), false, "–", Nothing),
    Row("replays ({replay_keys} keys)", "requests/s vs the same bytes through the daemon's HTTP stack (POST /bench/same-bytes)",
        Median("replays", "rps", 0), Median("replays", "same_bytes_rps", 0), true, "≥ 0.9×", Ratio(Target::AtLeast(0.9))),
    Row("replays", "requests/s vs the daemon's /healthz",
        Median("replays", "rps", 0), Median("replays", "healthz_rps", 0), true, "≥ 0.7×", Ratio(Target::AtLeast(0.7))),
    Row("replays", "requests/s vs pgbench PK select tps",
        Median("replays", "rps", 0), Median("replays", "pg_tps", 0), true, "> 1.0×", Baseline(Target::Above)),
    Row("duplicate storm ({storm_keys} keys)", "requests/s; entries = {storm_keys} after",
        Median("storm", "rps", 0), Dash, false, "exactly {storm_keys} entries, records, events", EveryRun("storm", "count_ok")),
    Row("outbox drain ({drain_events} events)", "events/s vs plain lapin publisher (window {publish_window})",
        Median("drain", "events_per_s", 0), Median("drain", "pub_events_per_s", 0), true, "≥ 1.0×", Ratio(Target::AtLeast(1.0))),
    Row("outbox drain", "events/s vs unique-key write rate",
        Median("drain", "events_per_s", 0), Median("writes", "rps", 0), true, "> 1.0×", Baseline(Target::Above)),
    Row("outbox drain", "RabbitMQ's CPU s per 1,000 messages: the daemon's relays vs the plain publisher",
        Median("drain", "rabbitmq_cost", 3), Median("drain", "pub_rabbitmq_cost", 3), true, "–", Nothing),
    Row("outbox drain", "every event reached the bound queue",
        PerRun("drain", "queued"), Dash, false, "{drain_events}", EveryRun("drain", "queued_ok")),
    Row("end-to-end at {e2e_rate} req/s", "p50, 201 received → delivery received (ms)",
        Median("e2e", "p50_ms", 2), Dash, false, "< 5 ms", Value(Target::Below(5.0))),
    Row("end-to-end", "p99 (ms)", Median("e2e", "p99_ms", 2), Dash, false, "< 20 ms", Value(Target::Below(20.0))),
    Row("ordered writes ({ordering_keys} keys), {connections} conn.", "requests/s vs unique-key writes without an ordering key",
        Median("ordered", "rps", 0), Median("writes", "rps", 0), true, "–", Nothing),
    Row("ordered writes", "p99 latency vs unique-key writes' p99 (ms)",
        Noted(&Median("ordered", "p99_ms", 2), "p50", &Median("ordered", "p50_ms", 2)),
        Median("writes", "p99_ms", 2), true, "–", Nothing),
    Row("ordered drain ({drain_events} events, {ordering_keys} keys)", "events/s vs the unordered drain of the same backlog",
        Median("ordered", "drain_events_per_s", 0), Median("drain", "events_per_s", 0), true, "≥ 0.5×", Ratio(Target::AtLeast(0.5))),
    Row("ordered writes and drain", "every key's events gapless and marked sent in sequence order; every drained event in the bound queue",
        PerRun("ordered", "drain_queued"), Dash, false, "in order, {drain_events}", EveryRun("ordered", "drain_order_ok")),
    Row("ordered end-to-end at {e2e_rate} req/s ({ordering_keys} keys)", "p50 / p99, 201 received → delivery received (ms), vs unordered end-to-end",
        Noted(&Median("ordered", "e2e_p50_ms", 2), "p99", &Median("ordered", "e2e_p99_ms", 2)),
        Noted(&Median("e2e", "p50_ms", 2), "p99", &Median("e2e", "p99_ms", 2)), true, "–", Nothing),
    Row("unique-key writes, PostgreSQL 20 ms further away (bench-delay-proxy), {connections} conn.", "requests/s vs pgbench conventional tps through the same link (its five round trips against the batch's one)",
        Median("latency", "d20_rps", 0), Median("latency", "d20_pg_tps", 0), true, "≥ 5×", Ratio(Target::AtLeast(5.0))),
    Row("unique-key writes, 20 ms further", "p50 latency in round trips of the link (p50 ms ÷ one client's SELECT 1 through it, in brackets)",
        Median("latency", "d20_p50_round_trips", 2),
        Noted(&Median("latency", "d20_p50_ms", 2), "round trip", &Median("latency", "d20_round_trip_ms", 2)), false, "≤ 1.5", Value(Target::AtMost(1.5))),
    Row("unique-key writes, 2 ms further", "requests/s (p50 in round trips) vs pgbench conventional tps through the same link",
        Noted(&Median("latency", "d2_rps", 0), "p50", &Median("latency", "d2_p50_round_trips", 2)),
        Median("latency", "d2_pg_tps", 0), true, "–", Nothing),
    Row("unique-key writes, through the proxy with no delay added", "requests/s vs pgbench conventional tps through the same proxy",
        Median("latency", "d0_rps", 0), Median("latency", "d0_pg_tps", 0), true, "–", Nothing),
];

/// The checks: every run's values of each row's metrics (`name:decimals` to round them), joined
/// with " / ", and a note after them. `{name}` is a setting. The log lines close the table (see
/// `Report::checks_table`).
#[rustfmt::skip]
const CHECKS: [(&str, &str, &[&str], &str); 23] = [
    ("writes: wrk errors (connect/read/write/status/timeout)", "writes", &["errors"], ""),
    ("writes: entries − 2xx answers (≥ 0; in-flight at the end on top)", "writes", &["entries_minus_2xx"], ""),
    ("writes: entries = idempotency records = outbox rows", "writes", &["rows_consistent"], " (1 = yes)"),
    ("writes: unsent outbox rows when wrk stopped", "writes", &["backlog_at_end"], ""),
    ("writes: event payload bytes (daemon's real events)", "writes", &["payload_bytes"], ""),
    ("writes: pgbench failed transactions", "writes", &["pg_failed"], ""),
    ("replays: wrk errors (replays / healthz / same bytes)", "replays", &["errors", "healthz_errors", "same_bytes_errors"], ""),
    ("replays: entries after (must stay {replay_keys})", "replays", &["entries"], ""),
    ("storm: wrk errors", "storm", &["errors"], ""),
    ("storm: entries / records / events", "storm", &["entries", "records", "events"], ""),
    ("drain: synthetic payload bytes", "drain", &["payload_bytes"], ""),
    ("drain: seconds to drain", "drain", &["seconds:2"], ""),
    ("drain: messages in the bound queue (daemon / publisher)", "drain", &["queued", "pub_queued"], ""),
    ("e2e: sent / 201 / errors / matched", "e2e", &["sent", "created", "errors", "matched"], ""),
    ("e2e: achieved request rate", "e2e", &["achieved_rate:1"], ""),
    ("e2e: deliveries before the 201 was seen (negative latency)", "e2e", &["negative"], ""),
    ("e2e: duplicate deliveries", "e2e", &["duplicate_deliveries"], ""),
    ("e2e: HTTP latency p50 / p99 (ms)", "e2e", &["http_p50_ms:2", "http_p99_ms:2"], ""),
    ("ordered: wrk errors; entries − 2xx answers", "ordered", &["errors", "entries_minus_2xx"], ""),
    ("ordered: writes in order after delivery; drain in order", "ordered", &["order_ok", "drain_order_ok"], " (1 = yes)"),
    ("ordered e2e: sent / 201 / errors / matched / duplicates", "ordered", &["e2e_sent", "e2e_created", "e2e_errors", "e2e_matched", "e2e_duplicate_deliveries"], ""),
    ("latency: wrk errors at 0 / 2 / 20 ms", "latency", &["d0_errors", "d2_errors", "d20_errors"], ""),
    ("latency: client sends per write / per conventional transaction at 20 ms", "latency", &["d20_sends_per_write:2", "d20_pg_sends_per_transaction:2"], ""),
];

/// Declares the settings once: the struct, its defaults, and `{name}` for each in a text.
macro_rules! settings {
    ($($(#[$doc:meta])* $name:ident: $type:ty = $default:expr,)*) => {
        /// How the benchmark was run: the knobs that the report quotes and the scenarios use.
        #[derive(Clone, Debug)]
        pub struct Settings {
            $($(#[$doc])* pub $name: $type,)*
        }

        impl Default for Settings {
            fn default() -> Settings {
                Settings { $($name: $default,)* }
            }
        }

        impl Settings {
            fn field(&self, name: &str) -> Option<String> {
                match name {
                    $(stringify!($name) => Some(self.$name.to_string()),)*
                    _ => None,
                }
            }

            /// The setting `name` read from its text, if it is one.
            #[cfg(test)]
            fn set(&mut self, name: &str, value: &str) {
                match name {
                    $(stringify!($name) => self.$name = value.parse().expect("a setting's text"),)*
                    _ => {}
                }
            }
        }
    };
}

settings! {
    quick: bool = false,
    runs: u32 = 3,
    duration: u32 = 15,
    drain_events: u64 = 100_000,
    e2e_seconds: u32 = 20,
    e2e_rate: u32 = 1000,
    connections: u32 = 64,
    wrk_threads: u32 = 2,
    replay_keys: u32 = 1000,
    storm_keys: u32 = 10,
    publish_window: u32 = 1000,
    ordering_keys: u32 = 1000,
    /// The scale scenario's databases, in rows per table, and the rows the janitor deletes.
    scale_small: u64 = 10_000,
    scale_large: u64 = 5_000_000,
    scale_expired: u64 = 500_000,
    port: u16 = 18437,
    /// The citus scenario's clients (their tokens: {tokens}).
    clients: u32 = 8,
    config: String = "config.toml".into(),
    /// postgres://user@host:port
    pg_base: String = "postgres://postgres@127.0.0.1:5432".into(),
}

impl Settings {
    /// The setting `{name}` stands for in a text: a field, or a command line's start.
    pub fn var(&self, name: &str) -> Option<String> {
        let (t, c, d) = (self.wrk_threads, self.connections, self.duration);
        let wrk = |c: u32, d: u32| format!("wrk -t{t} -c{c} -d{d}s --timeout 10s --latency");
        let pgbench = |d: u32| format!("pgbench -n -M prepared -c {c} -j {t} -T {d}");
        Some(match name {
            "url" => format!("http://127.0.0.1:{}", self.port),
            "wrk" => wrk(c, d),
            "reads" => wrk(8, 5),
            // The janitor's pass has writes beside it for 4 measurements' time (60 s in full).
            "wrk_janitor" => wrk(c, 4 * d),
            "pgbench" => pgbench(d),
            // Through the delay proxy: 6 s longer, judged by its last {duration} s (`-P 1`).
            "pgbench_link" => format!("{} -P 1", pgbench(d + 6)),
            "tokens" => self.tokens().join(","),
            name => return self.field(name),
        })
    }

    /// The bearer tokens of the citus scenario's clients, `bench-client-0-token` and so on.
    pub fn tokens(&self) -> Vec<String> {
        let tokens = (0..self.clients).map(|client| format!("bench-client-{client}-token"));
        tokens.collect()
    }

    pub fn mode_line(&self) -> String {
        let (d, r) = (self.duration, self.runs);
        let (e, s) = (self.drain_events, self.e2e_seconds);
        match self.quick {
            true => format!("**QUICK RUN (BENCH_QUICK=1): {d} s per measurement, {r} run(s), a {e}-event drain, {s} s of end-to-end load. These figures only show that the benchmark works; they are NOT the reference figures. Run `bench/run` (full mode) on a quiet machine for those.**"),
            false => format!("Full run: {d} s per measurement, medians of {r} runs, a {e}-event drain, {s} s of end-to-end load per run."),
        }
    }
}

/// The names of the machine and the software a run measured (`harness::machine`) in the
/// template.
pub const MACHINE: &str =
    "cpu nproc mem kernel pg autovacuum rabbit wrk pgbench rustc commit settings";

/// The keys of the daemon's configuration that the report quotes.
const QUOTED_SETTINGS: &str =
    "pool_size writers max_batch shards cache_entries workers batch_size poll_interval audit";

/// `section.key=value` for each quoted key of a TOML configuration, spaces removed, in file order.
pub fn quoted_settings(config: &str) -> String {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in config.lines() {
        let key = line.split_once('=').map(|(key, _)| key.trim_end());
        if line.starts_with('[') {
            section = line.replace(['[', ']'], "");
        } else if key.is_some_and(|key| QUOTED_SETTINGS.split(' ').any(|q| q == key)) {
            out.push(format!("{section}.{}", line.replace(' ', "")));
        }
    }
    out.join(", ")
}

/// Every run of every scenario, and what is needed to describe them.
#[derive(Clone, Debug)]
pub struct Report {
    pub settings: Settings,
    /// The machine and the software the run measured, by their names in the template
    /// (`harness::machine`).
    pub machine: HashMap<&'static str, String>,
    /// `YYYY-MM-DD HH:MM UTC`
    pub written_at: String,
    pub run_id: String,
    /// The runs of each scenario run, by name.
    pub runs: HashMap<String, Vec<Figures>>,
}

impl Figure {
    /// The number the ratio and the target are taken of.
    fn number(&self, report: &Report) -> Option<f64> {
        match self {
            Dash | PerRun(..) => None,
            Median(scenario, metric, _) | Busy(scenario, metric, _) => {
                report.median(scenario, metric)
            }
            Noted(figure, _, _) => figure.number(report),
            Costs(scenario, _, prefixes) => report.cost_median(scenario, prefixes[0]),
        }
    }

    fn cell(&self, report: &Report) -> String {
        match self {
            Dash => "–".into(),
            Median(scenario, metric, decimals) => fmt(report.median(scenario, metric), *decimals),
            Noted(figure, label, note) => {
                let (figure, note) = (figure.cell(report), note.cell(report));
                format!("{figure} ({label} {note})")
            }
            Busy(scenario, cost, busy) => {
                let (cost, busy) = (report.median(scenario, cost), report.median(scenario, busy));
                let busy = busy
                    .filter(|_| cost.is_some())
                    .map(|busy| fmt(Some(busy), 1));
                let busy = busy.map(|busy| format!(" (busy {busy} %)"));
                fmt(cost, 3) + &busy.unwrap_or_default()
            }
            Costs(scenario, label, prefixes) => {
                let cell = |prefix: &&str| {
                    let median = |part| report.median(scenario, &format!("{prefix}cost_{part}"));
                    let parts = ["daemon", "postgres", "rabbitmq"].map(|p| fmt(median(p), 3));
                    let (total, parts) = (report.cost_median(scenario, prefix), parts.join(" + "));
                    format!("{} ({label}{parts})", fmt(total, 3))
                };
                prefixes.iter().map(cell).collect::<Vec<_>>().join(" + ")
            }
            PerRun(scenario, metric) => per_run(&report.column(scenario, metric), None),
        }
    }
}

impl Row {
    /// The row as the table shows it.
    fn line(&self, report: &Report) -> String {
        let Row(scenario, measure, figure, baseline, shows_ratio, target, judge) = self;
        let fill = |text: &str| fill(text, |name| report.settings.var(name));
        let (value, bound) = (figure.number(report), baseline.number(report));
        let ratio = ratio(value, bound);
        let met = match judge {
            Nothing => None,
            Ratio(target) => Some(target.judge(ratio)),
            Value(target) => Some(target.judge(value)),
            Baseline(make) => Some(bound.and_then(|bound| make(bound).judge(value))),
            EveryRun(scenario, flag) => {
                let flags = report.column(scenario, flag);
                let lowest = present(&flags).into_iter().reduce(f64::min);
                Some((!flags.is_empty()).then(|| lowest == Some(1.0)))
            }
        };
        let ratio = shows_ratio.then(|| format!("{}×", fmt(ratio, 2)));
        let (ratio, met) = (ratio.unwrap_or("–".into()), met.map_or("–", verdict));
        let (figure, baseline) = (figure.cell(report), baseline.cell(report));
        let (scenario, measure, target) = (fill(scenario), fill(measure), fill(target));
        format!("| {scenario} | {measure} | {figure} | {baseline} | {ratio} | {target} | {met} |")
    }
}

impl Report {
    fn runs(&self, scenario: &str) -> &[Figures] {
        self.runs.get(scenario).map_or(&[], Vec::as_slice)
    }

    /// Every run's value of `metric`.
    fn column(&self, scenario: &str, metric: &str) -> Vec<Option<Num>> {
        let runs = self.runs(scenario).iter();
        runs.map(|run| run.num(metric).cloned()).collect()
    }

    fn median(&self, scenario: &str, metric: &str) -> Option<f64> {
        median(&present(&self.column(scenario, metric)))
    }

    /// The median of the runs' totals of a CPU cost in three parts.
    fn cost_median(&self, scenario: &str, prefix: &str) -> Option<f64> {
        let costs = self.runs(scenario).iter().map(|run| cost(run, prefix));
        let costs: Vec<Option<Num>> = costs.collect();
        median(&present(&costs))
    }

    /// The results table: each figure beside its baseline, with its target.
    pub fn results_table(&self) -> String {
        let mut out = String::from("| scenario | measure | retrysafe | baseline | ratio | target | result |\n|---|---|---:|---:|---:|---|---|");
        for row in &RESULTS {
            out += &format!("\n{}", row.line(self));
        }
        out
    }

    /// Peak RSS and CPU of the daemon per scenario.
    pub fn resources_table(&self) -> String {
        let mut out = String::from("| scenario | daemon peak RSS, MiB (max of runs) | daemon CPU, cores (median; 1.00 = one core) | target | result |\n|---|---:|---:|---|---|");
        let nproc = self.machine.get("nproc").map_or("", String::as_str);
        for scenario in REPORTED {
            let rss = present(&self.column(scenario, "rss_mb"));
            let peak = rss.into_iter().reduce(f64::max);
            let cores = fmt(self.median(scenario, "cpu_cores"), 2);
            let (peak, met) = (fmt(peak, 1), verdict(Target::Below(200.0).judge(peak)));
            let row = format!("{scenario} | {peak} | {cores} of {nproc} | RSS < 200 MiB | {met}");
            out += &format!("\n| {row} |");
        }
        out
    }

    /// The sanity checks, every run's value; the daemons' log lines close the table.
    pub fn checks_table(&self) -> String {
        // Every run's values of a metric (`name:decimals` to round them).
        let runs = |scenario: &str, metric: &str| {
            let (metric, decimals) = metric.split_once(':').unwrap_or((metric, ""));
            per_run(&self.column(scenario, metric), decimals.parse().ok())
        };
        let mut out = String::from("| check | per run |\n|---|---|");
        for (check, scenario, metrics, note) in CHECKS {
            let values: Vec<String> = metrics.iter().map(|m| runs(scenario, m)).collect();
            let check = fill(check, |name| self.settings.var(name));
            out += &format!("\n| {check} | {}{note} |", values.join(" / "));
        }
        let logs = |metric| REPORTED.map(|scenario| runs(scenario, metric)).join(" / ");
        let (under_load, after) = (logs("log_problems"), logs("shutdown_log_problems"));
        out += &format!("\n| daemon log lines at WARN/ERROR under load (writes/replays/storm/drain/e2e/ordered/latency) | {under_load} |");
        out + &format!("\n| daemon log lines at WARN/ERROR after SIGTERM (same order) | {after} |")
    }

    /// Every run's value of every metric, one row per scenario and metric.
    pub fn per_run_table(&self) -> String {
        let runs = self.settings.runs as usize;
        let mut out = String::from("| scenario | metric |");
        for run in 1..=runs {
            out += &format!(" run {run} |");
        }
        out.push_str(&format!("\n|---|---|{}", "---:|".repeat(runs)));
        for scenario in REPORTED {
            let scenario_runs = self.runs(scenario);
            let Some(first) = scenario_runs.first() else {
                continue;
            };
            for (i, (metric, _)) in first.0.iter().enumerate() {
                out += &format!("\n| {scenario} | {metric}");
                for run in 0..runs {
                    let cell = match scenario_runs.get(run).map(|run| &run.0[i].1) {
                        Some(Some(num)) => num.text.as_str(),
                        Some(None) => "n/a",
                        None => "",
                    };
                    out += &format!(" | {cell}");
                }
                out.push_str(" |");
            }
        }
        out
    }

    /// A scenario of sides, if it ran: each measure's medians on each side (`sides`: each one's
    /// prefix and column label), and each later side's ratio to the first.
    pub fn side_by_side_table(&self, scenario: &str, sides: &[(&str, &str)]) -> Option<String> {
        let (first, (side, _)) = (self.runs(scenario).first()?, sides.first()?);
        let label = |side: &(&str, &str)| fill(side.1, |name| self.settings.var(name));
        let labels: Vec<String> = sides.iter().map(label).collect();
        let (labels, runs) = (labels.join(" | "), self.runs(scenario).len());
        let ratios = " ratio |".repeat(sides.len() - 1);
        let mut out = format!("| measure (medians of {runs} runs) | {labels} |{ratios}\n|---|");
        out += &"---:|".repeat(2 * sides.len() - 1);
        let prefix = format!("{side}_");
        for (metric, _) in first.0.iter().filter(|(name, _)| name.starts_with(&prefix)) {
            let measure = &metric[prefix.len()..];
            let median =
                |side: &(&str, &str)| self.median(scenario, &format!("{}_{measure}", side.0));
            let medians: Vec<Option<f64>> = sides.iter().map(median).collect();
            out += &format!("\n| {measure} |");
            for median in &medians {
                out += &format!(" {} |", fmt(*median, 2));
            }
            for median in &medians[1..] {
                out += &format!(" {}x |", fmt(ratio(*median, medians[0]), 2));
            }
        }
        Some(out)
    }

    /// What `bench/run` prints when it is done.
    pub fn summary(&self) -> String {
        let (mode, results) = (self.settings.mode_line(), self.results_table());
        let (resources, checks) = (self.resources_table(), self.checks_table());
        format!("\n{mode}\n\n{results}\n\n{resources}\n\n{checks}\n")
    }

    /// The generated part of BENCHMARKS.md, up to and including the hand-written marker.
    pub fn render_generated(&self) -> String {
        let s = &self.settings;
        fill(TEMPLATE, |name| {
            Some(match name {
                "mode_line" => s.mode_line(),
                "mode" => (if s.quick { "BENCH_QUICK=1" } else { "full" }).into(),
                "written_at" => self.written_at.clone(),
                "run_id" => self.run_id.clone(),
                "results" => self.results_table(),
                "resources" => self.resources_table(),
                "checks" => self.checks_table(),
                "marker" => HAND_WRITTEN_MARKER.into(),
                name => return self.machine.get(name).cloned().or_else(|| s.var(name)),
            })
        })
    }

    /// docs/benchmark-runs.md: every run's value of every metric, written with BENCHMARKS.md.
    pub fn render_runs(&self) -> String {
        let (at, id, table) = (&self.written_at, &self.run_id, self.per_run_table());
        format!("# Benchmarks: every run's values\n\nWritten by `bench/run` on {at} (run id `{id}`) with [BENCHMARKS.md](../BENCHMARKS.md), whose tables take their figures from these; do not edit by hand.\n\n{table}\n")
    }

    /// The whole file: the generated part, then what `existing` (the file as it is) has after
    /// the hand-written marker, or the placeholder for the reading when it has no marker.
    pub fn render(&self, existing: Option<&str>) -> String {
        let kept = existing.and_then(|file| file.split_once(HAND_WRITTEN_MARKER));
        let kept = kept.map_or(READING_PLACEHOLDER, |kept| kept.1.trim_start_matches('\n'));
        format!("{}\n{kept}", self.render_generated())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::{list, SCENARIOS};

    const COMMITTED: &str = include_str!("../BENCHMARKS.md");
    const COMMITTED_RUNS: &str = include_str!("../docs/benchmark-runs.md");

    /// The committed BENCHMARKS.md as a report: its settings, machine and per-run values, read
    /// back through the template: each `{name}`'s value is the text up to the template's next
    /// literal (the first value of a name that comes again).
    fn committed_report() -> Report {
        let (mut template, mut file) = (TEMPLATE, COMMITTED);
        let mut values = HashMap::new();
        while let Some(open) = template.find('{') {
            let close = open + template[open..].find('}').unwrap();
            assert_eq!(template[..open], file[..open]);
            let name = &template[open + 1..close];
            (template, file) = (&template[close + 1..], &file[open..]);
            let literal = &template[..template.find('{').unwrap_or(template.len())];
            let len = file.find(literal).unwrap();
            values.entry(name).or_insert(&file[..len]);
            file = &file[len..];
        }
        let (_, per_run) = COMMITTED_RUNS.split_once("by hand.\n\n").unwrap();
        let per_run = per_run.trim_end();
        let runs = per_run.lines().next().unwrap().matches(" run ").count();
        let mut settings = Settings::default();
        for (name, value) in &values {
            settings.set(name, value);
        }
        (settings.quick, settings.runs) = (values["mode"] != "full", runs as u32);
        let mut by_scenario: HashMap<String, Vec<Figures>> = HashMap::new();
        for line in per_run.lines().skip(2) {
            let row: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            assert!(REPORTED.contains(&row[0]), "{}", row[0]);
            let scenario_runs = by_scenario.entry(row[0].into()).or_default();
            scenario_runs.resize(runs, Figures::default());
            for (run, text) in scenario_runs.iter_mut().zip(&row[2..]) {
                run.push(row[1], Num::parse(text));
            }
        }
        let machine = MACHINE
            .split(' ')
            .map(|name| (name, values[name].to_owned()));
        let (written_at, run_id) = (values["written_at"].into(), values["run_id"].into());
        let (machine, runs) = (machine.collect(), by_scenario);
        Report {
            settings,
            machine,
            written_at,
            run_id,
            runs,
        }
    }

    /// The committed BENCHMARKS.md, rendered again from its own settings, machine and per-run
    /// values, is the same file to the byte: every table, the commands, the hand-written part;
    /// and what the scenarios record is what its per-run table holds, metric for metric.
    #[test]
    fn the_committed_file_is_rendered_again_byte_for_byte() {
        let report = committed_report();
        assert_eq!(REPORTED.map(|s| report.runs(s).len()), [3; 7]);
        assert_eq!(report.results_table().lines().count(), 27);
        assert_eq!(report.render(Some(COMMITTED)), COMMITTED);
        assert_eq!(report.render_runs(), COMMITTED_RUNS);
        for (scenario, name) in SCENARIOS.iter().zip(REPORTED) {
            assert_eq!(scenario.name, name);
            assert_eq!(scenario.metrics().names(), report.runs(name)[0].names());
        }
    }

    /// A failed run fails its target; a scenario not run shows n/a, and has no rows.
    #[test]
    fn failed_runs_and_scenarios_not_run() {
        let mut report = committed_report();
        let storm = &mut report.runs.get_mut("storm").unwrap()[1];
        storm.set("count_ok", Num::parse("0"));
        let table = report.results_table();
        assert!(table.contains("exactly 10 entries, records, events | NOT met |"));
        report.runs.retain(|name, _| name == "writes");
        let table = report.results_table();
        for row in [
            "| ordered drain (100000 events, 1000 keys) | events/s vs the unordered drain of the same backlog | n/a | n/a | n/a× | ≥ 0.5× | n/a |",
            "| replays (1000 keys) | requests/s vs the same bytes through the daemon's HTTP stack (POST /bench/same-bytes) | n/a | n/a | n/a× | ≥ 0.9× | n/a |",
            "exactly 10 entries, records, events | n/a |",
            "| unique-key writes, 20 ms further | p50 latency in round trips of the link (p50 ms ÷ one client's SELECT 1 through it, in brackets) | n/a | n/a (round trip n/a) | – | ≤ 1.5 | n/a |",
            "| outbox drain | every event reached the bound queue | n/a | – | – | 100000 | n/a |",
        ] {
            assert!(table.contains(row), "{row}");
        }
        let resources = report.resources_table();
        assert!(resources.contains("| storm | n/a | n/a of 2 | RSS < 200 MiB | n/a |"));
        let checks = report.checks_table();
        assert!(checks.contains("| storm: entries / records / events | n/a / n/a / n/a |"));
        let per_run = report.per_run_table();
        let writes_rps = COMMITTED_RUNS
            .lines()
            .find(|line| line.starts_with("| writes | rps | "));
        assert!(per_run.contains(writes_rps.unwrap()) && !per_run.contains("| storm |"));
        let scale = list("scale").unwrap()[0].sides;
        assert!(report.side_by_side_table("scale", scale).is_none());
    }

    #[test]
    fn the_scale_table_sets_the_large_database_beside_the_small() {
        let mut report = committed_report();
        let scale = list("scale").unwrap()[0];
        let mut run = scale.metrics();
        run.set("small_rps", Num::parse("2092"));
        run.set("large_rps", Num::parse("1634"));
        report.runs.insert("scale".into(), vec![run]);
        let table = report.side_by_side_table("scale", scale.sides).unwrap();
        let head = "| measure (medians of 1 runs) | 10000 rows | 5000000 rows | ratio |\n|---|";
        assert!(table.starts_with(head), "{table}");
        assert!(
            table.contains("\n| rps | 2092.00 | 1634.00 | 0.78x |"),
            "{table}"
        );
        assert!(
            table.contains("\n| janitor_p99_ms | n/a | n/a | n/ax |"),
            "{table}"
        );
    }

    /// Quick mode says so; what a file has below the marker is kept, and a file without it gets
    /// the placeholder.
    #[test]
    fn the_mode_and_the_hand_written_part() {
        let mut report = committed_report();
        let (marker, by_hand) = (HAND_WRITTEN_MARKER, "## Reading\n\nBy hand.\n");
        let text = report.render(Some(&format!(
            "# Benchmarks\n\nold figures\n\n{marker}\n{by_hand}"
        )));
        assert!(!text.contains("old figures") && !text.contains("_To be written by a person"));
        assert!(text.ends_with(&format!("{marker}\n\n{by_hand}")));
        assert_eq!(text.matches(HAND_WRITTEN_MARKER).count(), 1);
        // Rendering its own output again changes nothing below the marker.
        assert_eq!(report.render(Some(&text)), text);
        let placeholder = format!("{HAND_WRITTEN_MARKER}\n\n{READING_PLACEHOLDER}");
        assert!(report.render(None).ends_with(&placeholder));
        let unmarked = report.render(Some("# Benchmarks\n\nno marker\n"));
        assert!(unmarked.ends_with(&placeholder));
        report.settings.quick = true;
        let text = report.render(None);
        assert!(text.contains("**QUICK RUN (BENCH_QUICK=1): 15 s per measurement, 3 run(s)"));
        assert!(text.contains("`bench/run` (mode: BENCH_QUICK=1) ran"));
    }

    /// The quoted settings of a config, a command line as the report shows it, and placeholders
    /// filled while others are kept.
    #[test]
    fn texts_filled_in() {
        let config = "[http]\nlisten = \"127.0.0.1:8080\"\n\n[database]\nurl = \"x\"\npool_size = 16\nwriters = 2\n\n[outbox]\nworkers = 2\npoll_interval = \"1s\"\n# shards = 3\n[events]\naudit = false\n";
        let quoted = "database.pool_size=16, database.writers=2, outbox.workers=2, outbox.poll_interval=\"1s\", events.audit=false";
        assert_eq!(quoted_settings(config), quoted);
        let settings = Settings::default();
        let command = fill("{wrk} -s bench/storm.lua {url}/", |name| settings.var(name));
        let wrk = "wrk -t2 -c64 -d15s --timeout 10s --latency";
        assert_eq!(
            command,
            format!("{wrk} -s bench/storm.lua http://127.0.0.1:18437/")
        );
        let lookup = |name: &str| (name == "a_1").then(|| "x".to_owned());
        assert_eq!(fill("{a_1} {b} {a_1}{ {} }", lookup), "x {b} x{ {} }");
    }
}
