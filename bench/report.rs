//! What the benchmark measured, and the report it makes of it. Each scenario's per-run figures
//! are declared once (`runs!`): the struct the scenario fills, and the metrics of the per-run
//! table, in order. Every table of BENCHMARKS.md is rendered from those values: the results
//! (described as data, `RESULTS`: each figure, its baseline, its target), the daemon's resources,
//! the checks (`CHECKS`), and the per-run table itself; the text around them is the template
//! bench/report.md.

use std::fmt::Write as _;
use std::str::FromStr;

use anyhow::bail;

use crate::stats::{fmt, maximum, median, minimum, per_run, ratio, Num, Target, Verdict};

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

/// `text` with each `{name}` that `lookup` knows replaced by its value.
pub fn fill(text: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        let name = &rest[open + 1..];
        let end = name.find(|c: char| !c.is_ascii_alphanumeric() && c != '_');
        let value = end.filter(|&n| name[n..].starts_with('}'));
        match value.and_then(|n| Some((n, lookup(&name[..n])?))) {
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

/// The scenarios, in the order of the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Writes,
    Replays,
    Storm,
    Drain,
    E2e,
    Ordered,
    Latency,
}

impl Scenario {
    pub const ALL: [Scenario; 7] = [
        Scenario::Writes,
        Scenario::Replays,
        Scenario::Storm,
        Scenario::Drain,
        Scenario::E2e,
        Scenario::Ordered,
        Scenario::Latency,
    ];

    pub fn name(self) -> &'static str {
        [
            "writes", "replays", "storm", "drain", "e2e", "ordered", "latency",
        ][self as usize]
    }

    /// A list such as BENCH_SCENARIOS gives it: names separated by spaces or commas.
    pub fn list(names: &str) -> anyhow::Result<Vec<Scenario>> {
        names
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|name| !name.is_empty())
            .map(Scenario::from_str)
            .collect()
    }
}

impl FromStr for Scenario {
    type Err = anyhow::Error;

    fn from_str(name: &str) -> anyhow::Result<Scenario> {
        match Scenario::ALL.into_iter().find(|s| s.name() == name) {
            Some(scenario) => Ok(scenario),
            None => bail!("unknown scenario {name} in BENCH_SCENARIOS"),
        }
    }
}

/// One run of a scenario: each metric of the per-run table, in order, with its value as
/// recorded (the tool's own text, or a value rounded when it was recorded).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Run(pub Vec<(String, Option<Num>)>);

impl Run {
    fn get(&self, metric: &str) -> Option<&Num> {
        self.0.iter().find(|(name, _)| name == metric)?.1.as_ref()
    }

    /// Gives each metric still without a value the one `source` has under its name (a tool's
    /// result line).
    pub fn fill(&mut self, source: impl Fn(&str) -> Option<Num>) {
        for (name, value) in &mut self.0 {
            if value.is_none() {
                *value = source(name);
            }
        }
    }

    /// Sets `metric`, which must be one of the run's.
    pub fn set(&mut self, metric: &str, value: Option<Num>) {
        match self.0.iter_mut().find(|(name, _)| name == metric) {
            Some((_, slot)) => *slot = value,
            None => panic!("no metric {metric} in this run"),
        }
    }

    /// A CPU cost per 1,000 in three parts (the daemon's, PostgreSQL's, RabbitMQ's): their sum
    /// as recorded (3 decimals), so that the report rebuilt from its per-run table gives the
    /// same total; None if a part is missing.
    fn cost(&self, parts: &[&str; 3]) -> Option<Num> {
        let mut thousandths = 0.0;
        for part in parts {
            thousandths += (self.get(part)?.value * 1000.0).round();
        }
        Num::fixed(thousandths / 1000.0, 3)
    }
}

/// Declares each scenario's per-run figures once: a struct of optional figures that the
/// scenario fills, whose field names, in this order, are the metrics of its per-run table.
macro_rules! runs {
    ($($(#[$doc:meta])* $name:ident { $($(#[$field_doc:meta])* $field:ident,)* })*) => {$(
        $(#[$doc])*
        #[derive(Clone, Debug, Default)]
        pub struct $name {
            $($(#[$field_doc])* pub $field: Option<Num>,)*
        }

        impl From<$name> for Run {
            fn from(run: $name) -> Run {
                Run(vec![$((stringify!($field).to_owned(), run.$field),)*])
            }
        }
    )*};
}

// wrk's figures (see `scenarios::wrk_figure`): rps, p50_ms, p99_ms, requests, errors (connect +
// read + write + status + timeout), status_errors (non-2xx answers). The daemon's WARN/ERROR log
// lines: log_problems under load, shutdown_log_problems after the SIGTERM that stopped it.
runs! {
    WritesRun {
        cpu_cores, rss_mb, rps, p50_ms, p99_ms, requests, errors, status_errors,
        backlog_at_end, entries, entries_minus_2xx, rows_consistent, payload_bytes,
        log_problems, shutdown_log_problems, pg_tps, pg_latency_ms, pg_failed,
        /// CPU seconds per 1,000 committed writes, from wrk's start until the outbox is empty
        /// (the events published too): the daemon's, PostgreSQL's and RabbitMQ's.
        cost_daemon, cost_postgres, cost_rabbitmq,
        /// PostgreSQL's CPU seconds per 1,000 pgbench transactions.
        pg_cost,
        /// The whole machine's CPU seconds (every process and the kernel, load generators
        /// included; steal not) per 1,000 writes over the same window as `cost_*`, and its
        /// busy share while wrk ran, in per cent.
        machine_cost, machine_busy_pct,
        /// The same per 1,000 pgbench transactions, and while pgbench ran.
        pg_machine_cost, pg_machine_busy_pct,
        /// The same load on a fresh database with the broker unreachable, so that the relays
        /// publish nothing while wrk runs: the write without its delivery; and its CPU seconds
        /// per 1,000 writes, until its daemon stopped.
        alone_rps, alone_p99_ms, alone_cost_daemon, alone_cost_postgres, alone_cost_rabbitmq,
        /// CPU seconds per 1,000 events to deliver that load's backlog afterwards (a daemon
        /// with the broker reachable, from its start until the outbox is empty): claim,
        /// publish, await the confirms, mark sent.
        delivery_cost_daemon, delivery_cost_postgres, delivery_cost_rabbitmq,
    }
    ReplaysRun {
        cpu_cores, rss_mb, rps, p50_ms, p99_ms, requests, errors, status_errors,
        healthz_rps, healthz_p50_ms, healthz_p99_ms, healthz_requests, healthz_errors,
        healthz_status_errors, pg_tps, pg_latency_ms, rss_mb_after_all, entries,
        log_problems, shutdown_log_problems,
        /// The same requests to POST /bench/same-bytes (feature `bench-routes`): read as a
        /// write is, answered with `answer_bytes` bytes (a replay's answer) and a replay's
        /// header fields, nothing else.
        same_bytes_rps, same_bytes_p50_ms, same_bytes_p99_ms, same_bytes_requests,
        same_bytes_errors, same_bytes_status_errors, answer_bytes,
    }
    StormRun {
        cpu_cores, rss_mb, rps, p50_ms, p99_ms, requests, errors, status_errors,
        entries, records, events,
        /// 1 when entries, records and events are each exactly the number of keys.
        count_ok,
        log_problems, shutdown_log_problems,
    }
    DrainRun {
        payload_bytes, cpu_cores, rss_mb, seconds, events_per_s, queued, queued_ok,
        log_problems, shutdown_log_problems, pub_events_per_s, pub_queued,
        /// RabbitMQ's CPU seconds per 1,000 messages: while the daemon drained (its start
        /// until the outbox was empty), and while the plain publisher ran.
        rabbitmq_cost, pub_rabbitmq_cost,
    }
    /// Between rss_mb and the log lines: `bench-e2e run`'s figures, as it printed them.
    E2eRun {
        cpu_cores, rss_mb, p50_ms, p99_ms, max_ms, matched, created, errors, sent,
        achieved_rate, http_p50_ms, http_p99_ms, negative, duplicate_deliveries,
        log_problems, shutdown_log_problems,
    }
    /// Ordered delivery with `{ordering_keys}` keys: the writes' wrk figures (as `WritesRun`),
    /// the drain of the drain scenario's backlog as writes of those keys (as `DrainRun`), and
    /// `bench-e2e run` with an ordering key on every write (`e2e_`, as `E2eRun`).
    OrderedRun {
        cpu_cores, rss_mb, rps, p50_ms, p99_ms, requests, errors, status_errors,
        entries, entries_minus_2xx,
        /// 1 when every key's sequences are 1, 2, 3, ... without a gap and each event was
        /// marked sent after the key's earlier ones (relays mark a batch sent once the broker
        /// confirmed it, and release a key's next event only then).
        order_ok,
        drain_seconds, drain_events_per_s, drain_queued, drain_order_ok,
        e2e_p50_ms, e2e_p99_ms, e2e_max_ms, e2e_sent, e2e_created, e2e_errors, e2e_matched,
        e2e_duplicate_deliveries,
        log_problems, shutdown_log_problems,
    }
    /// Writes and the conventional transaction through `bench-delay-proxy`, which adds N ms to
    /// every round trip to PostgreSQL, for N of `LINK_DELAYS_MS` (`d<N>_`): the link's round
    /// trip as one client's `SELECT 1` sees it; wrk's unique-key writes (its errors: connect +
    /// read + write + status + timeout), their p50 in round trips of the link, the writers'
    /// batches (writes per batch, ms per batch transaction) and the client's sends through the
    /// proxy per write (the relays' and probes' included); pgbench's conventional transaction
    /// on a fresh database through the same link, and its sends per transaction. The daemon's
    /// CPU is with no delay added (its busiest), its RSS the peak of the three, its log lines
    /// the sum.
    LatencyRun {
        cpu_cores, rss_mb,
        d0_round_trip_ms, d0_rps, d0_p50_ms, d0_p99_ms, d0_errors, d0_p50_round_trips,
        d0_writes_per_batch, d0_ms_per_batch, d0_sends_per_write,
        d0_pg_tps, d0_pg_latency_ms, d0_pg_sends_per_transaction,
        d2_round_trip_ms, d2_rps, d2_p50_ms, d2_p99_ms, d2_errors, d2_p50_round_trips,
        d2_writes_per_batch, d2_ms_per_batch, d2_sends_per_write,
        d2_pg_tps, d2_pg_latency_ms, d2_pg_sends_per_transaction,
        d20_round_trip_ms, d20_rps, d20_p50_ms, d20_p99_ms, d20_errors, d20_p50_round_trips,
        d20_writes_per_batch, d20_ms_per_batch, d20_sends_per_write,
        d20_pg_tps, d20_pg_latency_ms, d20_pg_sends_per_transaction,
        log_problems, shutdown_log_problems,
    }
}

/// The latency scenario's delays, in ms added to every round trip to PostgreSQL: its metrics
/// are `d<N>_...` for each (see `LatencyRun`).
pub const LINK_DELAYS_MS: [u32; 3] = [0, 2, 20];

/// A figure of the results table, from the runs of one scenario.
enum Figure {
    /// No figure: "–".
    Dash,
    /// The median of a metric, with so many decimals.
    Median(Scenario, &'static str, usize),
    /// A figure and, in brackets after a label, another: "41.29 (p50 12.00)".
    Noted(&'static Figure, &'static str, &'static Figure),
    /// A CPU cost per 1,000 (3 decimals) and, in brackets, the busy share of the CPUs while the
    /// load ran: "0.395 (busy 89.6 %)".
    Busy(Scenario, &'static str, &'static str),
    /// CPU costs per 1,000 in three parts (see `Run::cost`), joined with " + ": each the median
    /// of the runs' totals and, in brackets after the label, the median of each part.
    Costs(Scenario, &'static str, &'static [[&'static str; 3]]),
    /// Every run's value: "100000/100000/100000".
    PerRun(Scenario, &'static str),
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
    EveryRun(Scenario, &'static str),
}

/// A row of the results table. `{name}` in its texts is a setting (see `Settings::fill`).
struct Row {
    scenario: &'static str,
    measure: &'static str,
    value: Figure,
    baseline: Figure,
    /// Whether the row shows the ratio of the value to the baseline.
    ratio: bool,
    target: &'static str,
    judge: Judge,
}

use Figure::{Busy, Costs, Dash, Median, Noted, PerRun};
use Scenario::{Drain, E2e, Latency, Ordered, Replays, Storm, Writes};

const WRITE_COST: [&str; 3] = ["cost_daemon", "cost_postgres", "cost_rabbitmq"];
const ALONE_COST: [&str; 3] = [
    "alone_cost_daemon",
    "alone_cost_postgres",
    "alone_cost_rabbitmq",
];
const DELIVERY_COST: [&str; 3] = [
    "delivery_cost_daemon",
    "delivery_cost_postgres",
    "delivery_cost_rabbitmq",
];

/// The results: each figure beside its baseline, with its target.
#[rustfmt::skip]
const RESULTS: [Row; 25] = [
    Row {
        scenario: "unique-key writes, {connections} conn.",
        measure: "requests/s vs pgbench conventional tps",
        value: Median(Writes, "rps", 0), baseline: Median(Writes, "pg_tps", 0), ratio: true,
        // Retired: see "Targets" in the hand-written part of BENCHMARKS.md.
        target: "–", judge: Judge::Nothing,
    },
    Row {
        scenario: "unique-key writes", measure: "p99 latency vs pgbench average latency (ms)",
        value: Noted(&Median(Writes, "p99_ms", 2), "p50", &Median(Writes, "p50_ms", 2)),
        baseline: Median(Writes, "pg_latency_ms", 2), ratio: true,
        target: "p99 < pgbench avg", judge: Judge::Baseline(Target::Below),
    },
    Row {
        scenario: "unique-key writes",
        measure: "CPU s per 1,000 writes (daemon + PostgreSQL + RabbitMQ, events delivered) vs PostgreSQL's per 1,000 pgbench transactions",
        value: Costs(Writes, "medians: ", &[WRITE_COST]),
        baseline: Median(Writes, "pg_cost", 3), ratio: true,
        target: "–", judge: Judge::Nothing,
    },
    Row {
        scenario: "unique-key writes",
        measure: "CPU s per 1,000, whole machine (every process, load generators included): writes, events delivered, vs pgbench transactions; in brackets the machine's busy share while the load ran",
        value: Busy(Writes, "machine_cost", "machine_busy_pct"),
        baseline: Busy(Writes, "pg_machine_cost", "pg_machine_busy_pct"), ratio: true,
        target: "–", judge: Judge::Nothing,
    },
    Row {
        scenario: "unique-key writes, broker unreachable",
        measure: "requests/s (p99 ms) while no event is delivered vs pgbench conventional tps",
        value: Noted(&Median(Writes, "alone_rps", 0), "p99", &Median(Writes, "alone_p99_ms", 2)),
        baseline: Median(Writes, "pg_tps", 0), ratio: true,
        target: "–", judge: Judge::Nothing,
    },
    Row {
        scenario: "unique-key writes",
        measure: "CPU s per 1,000: the write alone (broker unreachable) + delivering its events afterwards (daemon + PostgreSQL + RabbitMQ each)",
        value: Costs(Writes, "", &[ALONE_COST, DELIVERY_COST]),
        baseline: Median(Writes, "pg_cost", 3), ratio: false,
        target: "–", judge: Judge::Nothing,
    },
    Row {
        scenario: "replays ({replay_keys} keys)", measure: "requests/s vs the same bytes through the daemon's HTTP stack (POST /bench/same-bytes)",
        value: Median(Replays, "rps", 0), baseline: Median(Replays, "same_bytes_rps", 0), ratio: true,
        target: "≥ 0.9×", judge: Judge::Ratio(Target::AtLeast(0.9)),
    },
    Row {
        scenario: "replays", measure: "requests/s vs the daemon's /healthz",
        value: Median(Replays, "rps", 0), baseline: Median(Replays, "healthz_rps", 0), ratio: true,
        target: "≥ 0.7×", judge: Judge::Ratio(Target::AtLeast(0.7)),
    },
    Row {
        scenario: "replays", measure: "requests/s vs pgbench PK select tps",
        value: Median(Replays, "rps", 0), baseline: Median(Replays, "pg_tps", 0), ratio: true,
        target: "> 1.0×", judge: Judge::Baseline(Target::Above),
    },
    Row {
        scenario: "duplicate storm ({storm_keys} keys)",
        measure: "requests/s; entries = {storm_keys} after",
        value: Median(Storm, "rps", 0), baseline: Dash, ratio: false,
        target: "exactly {storm_keys} entries, records, events",
        judge: Judge::EveryRun(Storm, "count_ok"),
    },
    Row {
        scenario: "outbox drain ({drain_events} events)",
        measure: "events/s vs plain lapin publisher (window {publish_window})",
        value: Median(Drain, "events_per_s", 0),
        baseline: Median(Drain, "pub_events_per_s", 0), ratio: true,
        target: "≥ 1.0×", judge: Judge::Ratio(Target::AtLeast(1.0)),
    },
    Row {
        scenario: "outbox drain", measure: "events/s vs unique-key write rate",
        value: Median(Drain, "events_per_s", 0), baseline: Median(Writes, "rps", 0), ratio: true,
        target: "> 1.0×", judge: Judge::Baseline(Target::Above),
    },
    Row {
        scenario: "outbox drain",
        measure: "RabbitMQ's CPU s per 1,000 messages: the daemon's relays vs the plain publisher",
        value: Median(Drain, "rabbitmq_cost", 3),
        baseline: Median(Drain, "pub_rabbitmq_cost", 3), ratio: true,
        target: "–", judge: Judge::Nothing,
    },
    Row {
        scenario: "outbox drain", measure: "every event reached the bound queue",
        value: PerRun(Drain, "queued"), baseline: Dash, ratio: false,
        target: "{drain_events}", judge: Judge::EveryRun(Drain, "queued_ok"),
    },
    Row {
        scenario: "end-to-end at {e2e_rate} req/s",
        measure: "p50, 201 received → delivery received (ms)",
        value: Median(E2e, "p50_ms", 2), baseline: Dash, ratio: false,
        target: "< 5 ms", judge: Judge::Value(Target::Below(5.0)),
    },
    Row {
        scenario: "end-to-end", measure: "p99 (ms)",
        value: Median(E2e, "p99_ms", 2), baseline: Dash, ratio: false,
        target: "< 20 ms", judge: Judge::Value(Target::Below(20.0)),
    },
    Row {
        scenario: "ordered writes ({ordering_keys} keys), {connections} conn.",
        measure: "requests/s vs unique-key writes without an ordering key",
        value: Median(Ordered, "rps", 0), baseline: Median(Writes, "rps", 0), ratio: true,
        target: "–", judge: Judge::Nothing,
    },
    Row {
        scenario: "ordered writes",
        measure: "p99 latency vs unique-key writes' p99 (ms)",
        value: Noted(&Median(Ordered, "p99_ms", 2), "p50", &Median(Ordered, "p50_ms", 2)),
        baseline: Median(Writes, "p99_ms", 2), ratio: true,
        target: "–", judge: Judge::Nothing,
    },
    Row {
        scenario: "ordered drain ({drain_events} events, {ordering_keys} keys)",
        measure: "events/s vs the unordered drain of the same backlog",
        value: Median(Ordered, "drain_events_per_s", 0),
        baseline: Median(Drain, "events_per_s", 0), ratio: true,
        target: "≥ 0.5×", judge: Judge::Ratio(Target::AtLeast(0.5)),
    },
    Row {
        scenario: "ordered writes and drain",
        measure: "every key's events gapless and marked sent in sequence order; every drained event in the bound queue",
        value: PerRun(Ordered, "drain_queued"), baseline: Dash, ratio: false,
        target: "in order, {drain_events}", judge: Judge::EveryRun(Ordered, "drain_order_ok"),
    },
    Row {
        scenario: "ordered end-to-end at {e2e_rate} req/s ({ordering_keys} keys)",
        measure: "p50 / p99, 201 received → delivery received (ms), vs unordered end-to-end",
        value: Noted(&Median(Ordered, "e2e_p50_ms", 2), "p99", &Median(Ordered, "e2e_p99_ms", 2)),
        baseline: Noted(&Median(E2e, "p50_ms", 2), "p99", &Median(E2e, "p99_ms", 2)),
        ratio: true, target: "–", judge: Judge::Nothing,
    },
    Row {
        scenario: "unique-key writes, PostgreSQL 20 ms further away (bench-delay-proxy), {connections} conn.",
        measure: "requests/s vs pgbench conventional tps through the same link (its five round trips against the batch's one)",
        value: Median(Latency, "d20_rps", 0), baseline: Median(Latency, "d20_pg_tps", 0), ratio: true,
        target: "≥ 5×", judge: Judge::Ratio(Target::AtLeast(5.0)),
    },
    Row {
        scenario: "unique-key writes, 20 ms further",
        measure: "p50 latency in round trips of the link (p50 ms ÷ one client's SELECT 1 through it, in brackets)",
        value: Median(Latency, "d20_p50_round_trips", 2),
        baseline: Noted(&Median(Latency, "d20_p50_ms", 2), "round trip", &Median(Latency, "d20_round_trip_ms", 2)),
        ratio: false, target: "≤ 1.5", judge: Judge::Value(Target::AtMost(1.5)),
    },
    Row {
        scenario: "unique-key writes, 2 ms further",
        measure: "requests/s (p50 in round trips) vs pgbench conventional tps through the same link",
        value: Noted(&Median(Latency, "d2_rps", 0), "p50", &Median(Latency, "d2_p50_round_trips", 2)),
        baseline: Median(Latency, "d2_pg_tps", 0), ratio: true,
        target: "–", judge: Judge::Nothing,
    },
    Row {
        scenario: "unique-key writes, through the proxy with no delay added",
        measure: "requests/s vs pgbench conventional tps through the same proxy",
        value: Median(Latency, "d0_rps", 0), baseline: Median(Latency, "d0_pg_tps", 0), ratio: true,
        target: "–", judge: Judge::Nothing,
    },
];

/// The checks: every run's values of each row's metrics (`name:decimals` to round them), joined
/// with " / ", and a note after them. `{name}` is a setting. The log lines close the table (see
/// `Report::checks_table`).
#[rustfmt::skip]
const CHECKS: [(&str, Scenario, &[&str], &str); 23] = [
    ("writes: wrk errors (connect/read/write/status/timeout)", Writes, &["errors"], ""),
    ("writes: entries − 2xx answers (≥ 0; in-flight at the end on top)", Writes, &["entries_minus_2xx"], ""),
    ("writes: entries = idempotency records = outbox rows", Writes, &["rows_consistent"], " (1 = yes)"),
    ("writes: unsent outbox rows when wrk stopped", Writes, &["backlog_at_end"], ""),
    ("writes: event payload bytes (daemon's real events)", Writes, &["payload_bytes"], ""),
    ("writes: pgbench failed transactions", Writes, &["pg_failed"], ""),
    ("replays: wrk errors (replays / healthz / same bytes)", Replays, &["errors", "healthz_errors", "same_bytes_errors"], ""),
    ("replays: entries after (must stay {replay_keys})", Replays, &["entries"], ""),
    ("storm: wrk errors", Storm, &["errors"], ""),
    ("storm: entries / records / events", Storm, &["entries", "records", "events"], ""),
    ("drain: synthetic payload bytes", Drain, &["payload_bytes"], ""),
    ("drain: seconds to drain", Drain, &["seconds:2"], ""),
    ("drain: messages in the bound queue (daemon / publisher)", Drain, &["queued", "pub_queued"], ""),
    ("e2e: sent / 201 / errors / matched", E2e, &["sent", "created", "errors", "matched"], ""),
    ("e2e: achieved request rate", E2e, &["achieved_rate:1"], ""),
    ("e2e: deliveries before the 201 was seen (negative latency)", E2e, &["negative"], ""),
    ("e2e: duplicate deliveries", E2e, &["duplicate_deliveries"], ""),
    ("e2e: HTTP latency p50 / p99 (ms)", E2e, &["http_p50_ms:2", "http_p99_ms:2"], ""),
    ("ordered: wrk errors; entries − 2xx answers", Ordered, &["errors", "entries_minus_2xx"], ""),
    ("ordered: writes in order after delivery; drain in order", Ordered, &["order_ok", "drain_order_ok"], " (1 = yes)"),
    ("ordered e2e: sent / 201 / errors / matched / duplicates", Ordered, &["e2e_sent", "e2e_created", "e2e_errors", "e2e_matched", "e2e_duplicate_deliveries"], ""),
    ("latency: wrk errors at 0 / 2 / 20 ms", Latency, &["d0_errors", "d2_errors", "d20_errors"], ""),
    ("latency: client sends per write / per conventional transaction at 20 ms", Latency, &["d20_sends_per_write:2", "d20_pg_sends_per_transaction:2"], ""),
];

/// How the benchmark was run: the knobs that the report quotes.
#[derive(Clone, Debug)]
pub struct Settings {
    pub quick: bool,
    pub runs: u32,
    pub duration: u32,
    pub drain_events: u64,
    pub e2e_seconds: u32,
    pub e2e_rate: u32,
    pub connections: u32,
    pub wrk_threads: u32,
    pub replay_keys: u32,
    pub storm_keys: u32,
    pub publish_window: u32,
    pub ordering_keys: u32,
    pub port: u16,
    pub config: String,
    /// postgres://user@host:port
    pub pg_base: String,
}

impl Settings {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The setting `{name}` stands for in a text.
    pub fn var(&self, name: &str) -> Option<String> {
        Some(match name {
            "duration" => self.duration.to_string(),
            "drain_events" => self.drain_events.to_string(),
            "e2e_seconds" => self.e2e_seconds.to_string(),
            "e2e_rate" => self.e2e_rate.to_string(),
            "connections" => self.connections.to_string(),
            "wrk_threads" => self.wrk_threads.to_string(),
            "replay_keys" => self.replay_keys.to_string(),
            "storm_keys" => self.storm_keys.to_string(),
            "publish_window" => self.publish_window.to_string(),
            "ordering_keys" => self.ordering_keys.to_string(),
            "port" => self.port.to_string(),
            "url" => self.url(),
            "config" => self.config.clone(),
            "pg_base" => self.pg_base.clone(),
            _ => return None,
        })
    }

    /// `text` with the settings it names in braces filled in.
    fn fill(&self, text: &str) -> String {
        fill(text, |name| self.var(name))
    }

    pub fn mode_line(&self) -> String {
        if self.quick {
            format!(
                "**QUICK RUN (BENCH_QUICK=1): {} s per measurement, {} run(s), a {}-event drain, {} s of end-to-end load. These figures only show that the benchmark works; they are NOT the reference figures. Run `bench/run` (full mode) on a quiet machine for those.**",
                self.duration, self.runs, self.drain_events, self.e2e_seconds
            )
        } else {
            format!(
                "Full run: {} s per measurement, medians of {} runs, a {}-event drain, {} s of end-to-end load per run.",
                self.duration, self.runs, self.drain_events, self.e2e_seconds
            )
        }
    }
}

/// The machine and the software the run measured.
#[derive(Clone, Debug, Default)]
pub struct Machine {
    pub cpu_model: String,
    pub nproc: String,
    pub mem_gib: String,
    pub kernel: String,
    pub pg_version: String,
    pub autovacuum: String,
    pub rabbit_version: String,
    pub wrk_version: String,
    pub pgbench_version: String,
    pub rustc_version: String,
    pub commit: String,
    /// `section.key=value, ...` of the settings that shape the load.
    pub daemon_settings: String,
}

/// The keys of the daemon's configuration that the report quotes.
const QUOTED_SETTINGS: [&str; 9] = [
    "pool_size",
    "writers",
    "max_batch",
    "shards",
    "cache_entries",
    "workers",
    "batch_size",
    "poll_interval",
    "audit",
];

/// `section.key=value` for each quoted key of a TOML configuration, spaces removed, in file order.
pub fn quoted_settings(config: &str) -> String {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in config.lines() {
        if line.starts_with('[') {
            section = line.replace(['[', ']'], "");
            continue;
        }
        let Some((key, _)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim_end_matches(' ');
        if QUOTED_SETTINGS.contains(&key) {
            out.push(format!("{section}.{}", line.replace(' ', "")));
        }
    }
    out.join(", ")
}

/// Every run of every scenario, and what is needed to describe them.
#[derive(Clone, Debug)]
pub struct Report {
    pub settings: Settings,
    pub machine: Machine,
    /// `YYYY-MM-DD HH:MM UTC`
    pub written_at: String,
    pub run_id: String,
    /// The runs of each scenario, in the order of `Scenario::ALL`; none for one not run.
    pub runs: [Vec<Run>; 7],
}

impl Figure {
    /// The number the ratio and the target are taken of.
    fn number(&self, report: &Report) -> Option<f64> {
        match self {
            Dash | PerRun(..) => None,
            Median(scenario, metric, _) | Busy(scenario, metric, _) => {
                report.median(*scenario, metric)
            }
            Noted(figure, _, _) => figure.number(report),
            Costs(scenario, _, costs) => report.cost_median(*scenario, &costs[0]),
        }
    }

    fn cell(&self, report: &Report) -> String {
        match self {
            Dash => "–".into(),
            Median(scenario, metric, decimals) => fmt(report.median(*scenario, metric), *decimals),
            Noted(figure, label, note) => {
                format!("{} ({label} {})", figure.cell(report), note.cell(report))
            }
            Busy(scenario, cost, busy) => {
                let (cost, busy) = (
                    report.median(*scenario, cost),
                    report.median(*scenario, busy),
                );
                match busy {
                    Some(_) if cost.is_some() => {
                        format!("{} (busy {} %)", fmt(cost, 3), fmt(busy, 1))
                    }
                    _ => fmt(cost, 3),
                }
            }
            Costs(scenario, label, costs) => {
                let cell = |parts: &[&str; 3]| {
                    let medians = parts.map(|part| fmt(report.median(*scenario, part), 3));
                    let total = fmt(report.cost_median(*scenario, parts), 3);
                    format!("{total} ({label}{})", medians.join(" + "))
                };
                costs.iter().map(cell).collect::<Vec<_>>().join(" + ")
            }
            PerRun(scenario, metric) => per_run(&report.column(*scenario, metric), None),
        }
    }
}

impl Row {
    fn cells(&self, report: &Report) -> [String; 7] {
        let s = &report.settings;
        let (value, baseline) = (self.value.number(report), self.baseline.number(report));
        let ratio_value = ratio(value, baseline);
        let verdict = match &self.judge {
            Judge::Nothing => None,
            Judge::Ratio(target) => Some(target.judge(ratio_value)),
            Judge::Value(target) => Some(target.judge(value)),
            Judge::Baseline(make) => Some(Target::judge_against(value, baseline, *make)),
            Judge::EveryRun(scenario, flag) => {
                let flags = report.column(*scenario, flag);
                Some(if flags.is_empty() {
                    Verdict::NotAvailable
                } else {
                    Verdict::of(Some(minimum(&flags) == Some(1.0)))
                })
            }
        };
        [
            s.fill(self.scenario),
            s.fill(self.measure),
            self.value.cell(report),
            self.baseline.cell(report),
            if self.ratio {
                format!("{}×", fmt(ratio_value, 2))
            } else {
                "–".into()
            },
            s.fill(self.target),
            verdict.map_or("–".into(), |verdict| verdict.to_string()),
        ]
    }
}

impl Report {
    fn runs(&self, scenario: Scenario) -> &[Run] {
        &self.runs[scenario as usize]
    }

    /// Every run's value of `metric`.
    fn column(&self, scenario: Scenario, metric: &str) -> Vec<Option<Num>> {
        let runs = self.runs(scenario);
        runs.iter().map(|run| run.get(metric).cloned()).collect()
    }

    fn median(&self, scenario: Scenario, metric: &str) -> Option<f64> {
        median(&self.column(scenario, metric))
    }

    /// The median of the runs' totals of a CPU cost in three parts.
    fn cost_median(&self, scenario: Scenario, parts: &[&str; 3]) -> Option<f64> {
        let totals: Vec<Option<Num>> = self
            .runs(scenario)
            .iter()
            .map(|run| run.cost(parts))
            .collect();
        median(&totals)
    }

    /// The results table: each figure beside its baseline, with its target.
    pub fn results_table(&self) -> String {
        let mut out = String::from(
            "| scenario | measure | retrysafe | baseline | ratio | target | result |\n|---|---|---:|---:|---:|---|---|",
        );
        for row in &RESULTS {
            let _ = write!(out, "\n| {} |", row.cells(self).join(" | "));
        }
        out
    }

    /// Peak RSS and CPU of the daemon per scenario.
    pub fn resources_table(&self) -> String {
        let mut out = String::from(
            "| scenario | daemon peak RSS, MiB (max of runs) | daemon CPU, cores (median; 1.00 = one core) | target | result |\n|---|---:|---:|---|---|",
        );
        for scenario in Scenario::ALL {
            let peak = maximum(&self.column(scenario, "rss_mb"));
            let _ = write!(
                out,
                "\n| {} | {} | {} of {} | RSS < 200 MiB | {} |",
                scenario.name(),
                fmt(peak, 1),
                fmt(self.median(scenario, "cpu_cores"), 2),
                self.machine.nproc,
                Target::Below(200.0).judge(peak)
            );
        }
        out
    }

    /// The sanity checks, every run's value.
    pub fn checks_table(&self) -> String {
        // Every run's values of a metric (`name:decimals` to round them).
        let runs = |scenario: Scenario, metric: &str| {
            let (metric, decimals) = match metric.split_once(':') {
                Some((metric, decimals)) => (metric, decimals.parse().ok()),
                None => (metric, None),
            };
            per_run(&self.column(scenario, metric), decimals)
        };
        let mut out = String::from("| check | per run |\n|---|---|");
        for (check, scenario, metrics, note) in CHECKS {
            let values: Vec<String> = metrics.iter().map(|m| runs(scenario, m)).collect();
            let check = self.settings.fill(check);
            let _ = write!(out, "\n| {check} | {}{note} |", values.join(" / "));
        }
        for (check, metric) in [
            (
                "under load (writes/replays/storm/drain/e2e/ordered/latency)",
                "log_problems",
            ),
            ("after SIGTERM (same order)", "shutdown_log_problems"),
        ] {
            let values: Vec<String> = Scenario::ALL.iter().map(|s| runs(*s, metric)).collect();
            let _ = write!(
                out,
                "\n| daemon log lines at WARN/ERROR {check} | {} |",
                values.join(" / ")
            );
        }
        out
    }

    /// Every run's value of every metric, one row per scenario and metric.
    pub fn per_run_table(&self) -> String {
        let runs = self.settings.runs as usize;
        let mut out = String::from("| scenario | metric |");
        for run in 1..=runs {
            let _ = write!(out, " run {run} |");
        }
        out.push_str("\n|---|---|");
        out.push_str(&"---:|".repeat(runs));
        for scenario in Scenario::ALL {
            let scenario_runs = self.runs(scenario);
            let Some(first) = scenario_runs.first() else {
                continue;
            };
            for (i, (metric, _)) in first.0.iter().enumerate() {
                let _ = write!(out, "\n| {} | {metric}", scenario.name());
                for run in 0..runs {
                    let cell = match scenario_runs.get(run).map(|run| &run.0[i].1) {
                        Some(Some(num)) => num.text.as_str(),
                        Some(None) => "n/a",
                        None => "",
                    };
                    let _ = write!(out, " | {cell}");
                }
                out.push_str(" |");
            }
        }
        out
    }

    /// What `bench/run` prints when it is done.
    pub fn summary(&self) -> String {
        format!(
            "\n{}\n\n{}\n\n{}\n\n{}\n",
            self.settings.mode_line(),
            self.results_table(),
            self.resources_table(),
            self.checks_table()
        )
    }

    /// The generated part of BENCHMARKS.md, up to and including the hand-written marker.
    pub fn render_generated(&self) -> String {
        let (s, m) = (&self.settings, &self.machine);
        fill(TEMPLATE, |name| {
            Some(match name {
                "mode_line" => s.mode_line(),
                "mode" => (if s.quick { "BENCH_QUICK=1" } else { "full" }).into(),
                "written_at" => self.written_at.clone(),
                "run_id" => self.run_id.clone(),
                "commit" => m.commit.clone(),
                "cpu" => m.cpu_model.clone(),
                "nproc" => m.nproc.clone(),
                "mem" => m.mem_gib.clone(),
                "kernel" => m.kernel.clone(),
                "pg" => m.pg_version.clone(),
                "autovacuum" => m.autovacuum.clone(),
                "rabbit" => m.rabbit_version.clone(),
                "wrk" => m.wrk_version.clone(),
                "pgbench" => m.pgbench_version.clone(),
                "rustc" => m.rustc_version.clone(),
                "settings" => m.daemon_settings.clone(),
                "results" => self.results_table(),
                "resources" => self.resources_table(),
                "checks" => self.checks_table(),
                "per_run" => self.per_run_table(),
                "marker" => HAND_WRITTEN_MARKER.into(),
                name => return s.var(name),
            })
        })
    }

    /// The whole file: the generated part, then what `existing` (the file as it is) has after
    /// the hand-written marker, or the placeholder for the reading when it has no marker.
    pub fn render(&self, existing: Option<&str>) -> String {
        let mut out = self.render_generated();
        out.push('\n');
        match existing.and_then(hand_written_part) {
            Some(kept) => out.push_str(kept.trim_start_matches('\n')),
            None => out.push_str(READING_PLACEHOLDER),
        }
        out
    }
}

/// What a BENCHMARKS.md has after the hand-written marker line.
pub fn hand_written_part(file: &str) -> Option<&str> {
    let at = file.find(HAND_WRITTEN_MARKER)?;
    let rest = &file[at + HAND_WRITTEN_MARKER.len()..];
    Some(rest.strip_prefix('\n').unwrap_or(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMITTED: &str = include_str!("../BENCHMARKS.md");

    /// The text of `file` between the first `before` and the first `after` that follows it.
    fn between<'a>(file: &'a str, before: &str, after: &str) -> &'a str {
        let start = file.find(before).unwrap() + before.len();
        let len = file[start..].find(after).unwrap();
        &file[start..start + len]
    }

    fn number_after<T: FromStr>(file: &str, prefix: &str) -> T {
        let at = file.find(prefix).unwrap() + prefix.len();
        let digits: String = file[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok().unwrap()
    }

    /// The committed BENCHMARKS.md as a report: its settings, machine and per-run values.
    fn committed_report() -> Report {
        let file = COMMITTED;
        let per_run = between(file, "## Per-run values\n\n", "\n\n");
        let runs = per_run.lines().next().unwrap().matches(" run ").count();
        let mut by_scenario: [Vec<Run>; 7] = Default::default();
        for line in per_run.lines().skip(2) {
            let row: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            let scenario: Scenario = row[0].parse().unwrap();
            let scenario_runs = &mut by_scenario[scenario as usize];
            scenario_runs.resize(runs, Run::default());
            for (run, text) in scenario_runs.iter_mut().zip(&row[2..]) {
                run.0.push((row[1].to_owned(), Num::parse(text)));
            }
        }
        let quick = file.contains("**QUICK RUN");
        let tools = between(file, "| tools | wrk ", " |\n");
        let (wrk, rest) = tools.split_once(", pgbench ").unwrap();
        let (pgbench, rustc) = rest.split_once(", ").unwrap();
        let cpu = between(file, "| CPU | ", " cores (nproc)");
        let (cpu_model, nproc) = cpu.rsplit_once(", ").unwrap();
        let daemon = between(file, "Daemon settings from `", ".\n");
        let (config, daemon_settings) = daemon.split_once("`: ").unwrap();
        let mode = if quick {
            "(BENCH_QUICK=1): "
        } else {
            "Full run: "
        };
        Report {
            settings: Settings {
                quick,
                runs: runs as u32,
                duration: number_after(file, mode),
                drain_events: number_after(file, "| outbox drain ("),
                e2e_seconds: number_after(file, "-event drain, "),
                e2e_rate: number_after(file, "| end-to-end at "),
                connections: number_after(file, "| unique-key writes, "),
                wrk_threads: number_after(file, "wrk -t"),
                replay_keys: number_after(file, "| replays ("),
                storm_keys: number_after(file, "| duplicate storm ("),
                publish_window: number_after(file, "(window "),
                ordering_keys: number_after(file, "| ordered writes ("),
                port: number_after(file, "RETRYSAFE_HTTP__LISTEN=127.0.0.1:"),
                config: config.into(),
                pg_base: between(file, "RETRYSAFE_DATABASE__URL=", "/<db>").into(),
            },
            machine: Machine {
                cpu_model: cpu_model.into(),
                nproc: nproc.into(),
                mem_gib: between(file, "| memory | ", " GiB |").into(),
                kernel: between(file, "| kernel | ", " |\n").into(),
                pg_version: between(file, "| PostgreSQL | ", " (the distribution").into(),
                autovacuum: between(file, "autovacuum: ", ") |").into(),
                rabbit_version: between(file, "| RabbitMQ | ", " |\n").into(),
                wrk_version: wrk.into(),
                pgbench_version: pgbench.into(),
                rustc_version: rustc.into(),
                commit: between(file, "daemon at commit\n`", "`. Every").into(),
                daemon_settings: daemon_settings.into(),
            },
            written_at: between(file, "Written by `bench/run` on ", " (run id").into(),
            run_id: between(file, "(run id `", "`)").into(),
            runs: by_scenario,
        }
    }

    /// The committed BENCHMARKS.md, rendered again from its own settings, machine and per-run
    /// values, is the same file to the byte: every table, the commands, the hand-written part.
    #[test]
    fn the_committed_file_is_rendered_again_byte_for_byte() {
        let report = committed_report();
        assert_eq!(report.runs.iter().map(Vec::len).collect::<Vec<_>>(), [3; 7]);
        assert_eq!(report.results_table().lines().count(), 27);
        assert_eq!(report.render(Some(COMMITTED)), COMMITTED);
    }

    /// What the scenarios record is what the committed per-run table holds, metric for metric.
    #[test]
    fn each_scenario_records_the_metrics_of_the_per_run_table() {
        let committed = committed_report();
        let recorded: [Run; 7] = [
            WritesRun::default().into(),
            ReplaysRun::default().into(),
            StormRun::default().into(),
            DrainRun::default().into(),
            E2eRun::default().into(),
            OrderedRun::default().into(),
            LatencyRun::default().into(),
        ];
        for (scenario, run) in Scenario::ALL.into_iter().zip(recorded) {
            let names = |run: &Run| {
                run.0
                    .iter()
                    .map(|(name, _)| name.clone())
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                names(&run),
                names(&committed.runs(scenario)[0]),
                "{scenario:?}"
            );
        }
        // bench-e2e's result line fills what the run did not measure itself.
        let mut run = Run::from(E2eRun {
            cpu_cores: Num::parse("0.4"),
            ..E2eRun::default()
        });
        run.fill(|name| Num::parse(if name == "p50_ms" { "3.0" } else { "" }));
        assert_eq!(run.get("cpu_cores"), Num::parse("0.4").as_ref());
        assert_eq!(run.get("p50_ms").unwrap().text, "3.0");
        assert_eq!(run.get("p99_ms"), None);
    }

    #[test]
    fn a_failed_storm_run_fails_its_target() {
        let mut report = committed_report();
        let run = &mut report.runs[Storm as usize][1];
        run.0
            .iter_mut()
            .find(|(name, _)| name == "count_ok")
            .unwrap()
            .1 = Num::parse("0");
        assert!(report
            .results_table()
            .contains("exactly 10 entries, records, events | NOT met |"));
    }

    #[test]
    fn scenarios_not_run_show_na() {
        let mut report = committed_report();
        for scenario in [Replays, Storm, Drain, E2e, Ordered, Latency] {
            report.runs[scenario as usize].clear();
        }
        let table = report.results_table();
        assert!(table.contains(
            "| ordered drain (100000 events, 1000 keys) | events/s vs the unordered drain of the same backlog | n/a | n/a | n/a× | ≥ 0.5× | n/a |"
        ));
        assert!(table.contains(
            "| replays (1000 keys) | requests/s vs the same bytes through the daemon's HTTP stack (POST /bench/same-bytes) | n/a | n/a | n/a× | ≥ 0.9× | n/a |"
        ));
        assert!(table.contains("exactly 10 entries, records, events | n/a |"));
        assert!(table.contains(
            "| unique-key writes, 20 ms further | p50 latency in round trips of the link (p50 ms ÷ one client's SELECT 1 through it, in brackets) | n/a | n/a (round trip n/a) | – | ≤ 1.5 | n/a |"
        ));
        assert!(table.contains(
            "| outbox drain | every event reached the bound queue | n/a | – | – | 100000 | n/a |"
        ));
        assert!(report
            .resources_table()
            .contains("| storm | n/a | n/a of 2 | RSS < 200 MiB | n/a |"));
        assert!(report
            .checks_table()
            .contains("| storm: entries / records / events | n/a / n/a / n/a |"));
        // The per-run table has rows only for what ran.
        let per_run = report.per_run_table();
        let writes_rps = COMMITTED
            .lines()
            .find(|line| line.starts_with("| writes | rps | "))
            .unwrap();
        assert!(per_run.contains(writes_rps));
        assert!(!per_run.contains("| storm |"));
    }

    #[test]
    fn quick_mode_says_so() {
        let mut report = committed_report();
        report.settings.quick = true;
        let text = report.render(None);
        assert!(text.contains("**QUICK RUN (BENCH_QUICK=1): 15 s per measurement, 3 run(s)"));
        assert!(text.contains("`bench/run` (mode: BENCH_QUICK=1) ran"));
    }

    #[test]
    fn the_hand_written_part_is_kept() {
        let report = committed_report();
        let old = format!(
            "# Benchmarks\n\nold figures\n\n{HAND_WRITTEN_MARKER}\n## Reading\n\nBy hand.\n\n## The listing index on the write path\n\nMeasured by hand.\n"
        );
        let text = report.render(Some(&old));
        assert!(!text.contains("old figures"));
        assert!(!text.contains("_To be written by a person"));
        assert!(text.ends_with(&format!(
            "{HAND_WRITTEN_MARKER}\n\n## Reading\n\nBy hand.\n\n## The listing index on the write path\n\nMeasured by hand.\n"
        )));
        assert_eq!(text.matches(HAND_WRITTEN_MARKER).count(), 1);
        // Rendering its own output again changes nothing below the marker.
        assert_eq!(report.render(Some(&text)), text);
        // A file without the marker, or none, gets the placeholder.
        let placeholder = format!("{HAND_WRITTEN_MARKER}\n\n{READING_PLACEHOLDER}");
        assert!(report.render(None).ends_with(&placeholder));
        assert!(report
            .render(Some("# Benchmarks\n\nno marker\n"))
            .ends_with(&placeholder));
    }

    #[test]
    fn quoted_settings_of_a_config() {
        let config = "[http]\nlisten = \"127.0.0.1:8080\"\n\n[database]\nurl = \"x\"\npool_size = 16\nwriters = 2\n\n[outbox]\nworkers = 2\npoll_interval = \"1s\"\n# shards = 3\n[events]\naudit = false\n";
        assert_eq!(
            quoted_settings(config),
            "database.pool_size=16, database.writers=2, outbox.workers=2, outbox.poll_interval=\"1s\", events.audit=false"
        );
    }

    #[test]
    fn placeholders_are_filled_and_others_kept() {
        let lookup = |name: &str| (name == "a_1").then(|| "x".to_owned());
        assert_eq!(fill("{a_1} {b} {a_1}{ {} }", lookup), "x {b} x{ {} }");
    }

    #[test]
    fn scenario_lists() {
        assert_eq!(
            Scenario::list("writes replays storm drain e2e ordered latency").unwrap(),
            Scenario::ALL
        );
        assert_eq!(Scenario::list(" drain,writes ").unwrap(), [Drain, Writes]);
        assert!(Scenario::list("writes reads").is_err());
    }
}
