//! What each scenario measured in one run (a struct per scenario), and the report that turns the
//! runs into BENCHMARKS.md: the results against their targets, the daemon's resources, the
//! checks, the commands, and every run's values.

use std::fmt::Write as _;

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

/// A scenario's per-run figures, in the order of the per-run table.
pub trait Metrics {
    fn metrics(&self) -> Vec<(String, Option<Num>)>;
}

/// The daemon's WARN/ERROR log lines of one run: under load, and after the SIGTERM that stopped it.
#[derive(Clone, Debug, Default)]
pub struct LogProblems {
    pub under_load: Option<Num>,
    pub after_sigterm: Option<Num>,
}

impl LogProblems {
    fn metrics(&self) -> [(String, Option<Num>); 2] {
        [
            ("log_problems".into(), self.under_load.clone()),
            ("shutdown_log_problems".into(), self.after_sigterm.clone()),
        ]
    }
}

/// The figures of one wrk run (its `BENCH_RESULT` line).
#[derive(Clone, Debug, Default)]
pub struct WrkFigures {
    pub rps: Option<Num>,
    pub p50_ms: Option<Num>,
    pub p99_ms: Option<Num>,
    pub requests: Option<Num>,
    /// connect + read + write + status + timeout.
    pub errors: Option<Num>,
    /// Non-2xx answers.
    pub status_errors: Option<Num>,
}

impl WrkFigures {
    fn metrics(&self, prefix: &str) -> Vec<(String, Option<Num>)> {
        [
            ("rps", &self.rps),
            ("p50_ms", &self.p50_ms),
            ("p99_ms", &self.p99_ms),
            ("requests", &self.requests),
            ("errors", &self.errors),
            ("status_errors", &self.status_errors),
        ]
        .into_iter()
        .map(|(name, value)| (format!("{prefix}{name}"), value.clone()))
        .collect()
    }
}

#[derive(Clone, Debug, Default)]
pub struct WritesRun {
    pub cpu_cores: Option<Num>,
    pub rss_mb: Option<Num>,
    pub wrk: WrkFigures,
    pub backlog_at_end: Option<Num>,
    pub entries: Option<Num>,
    pub entries_minus_2xx: Option<Num>,
    pub rows_consistent: Option<Num>,
    pub payload_bytes: Option<Num>,
    pub log: LogProblems,
    pub pg_tps: Option<Num>,
    pub pg_latency_ms: Option<Num>,
    pub pg_failed: Option<Num>,
    /// CPU seconds per 1,000 committed writes, from wrk's start until the outbox is empty (the
    /// events published too): the daemon's, PostgreSQL's and RabbitMQ's.
    pub cost_daemon: Option<Num>,
    pub cost_postgres: Option<Num>,
    pub cost_rabbitmq: Option<Num>,
    /// PostgreSQL's CPU seconds per 1,000 pgbench transactions.
    pub pg_cost: Option<Num>,
    /// The whole machine's CPU seconds (every process and the kernel, load generators
    /// included; steal not) per 1,000 writes over the same window as `cost_*`, and its busy
    /// share while wrk ran, in per cent.
    pub machine_cost: Option<Num>,
    pub machine_busy_pct: Option<Num>,
    /// The same per 1,000 pgbench transactions, and while pgbench ran.
    pub pg_machine_cost: Option<Num>,
    pub pg_machine_busy_pct: Option<Num>,
    /// The same load on a fresh database with the broker unreachable, so that the relays
    /// publish nothing while wrk runs: the write without its delivery.
    pub alone_rps: Option<Num>,
    pub alone_p99_ms: Option<Num>,
    /// CPU seconds per 1,000 writes of that load, until its daemon stopped.
    pub alone_cost_daemon: Option<Num>,
    pub alone_cost_postgres: Option<Num>,
    pub alone_cost_rabbitmq: Option<Num>,
    /// CPU seconds per 1,000 events to deliver that load's backlog afterwards (a daemon with
    /// the broker reachable, from its start until the outbox is empty): claim, publish, await
    /// the confirms, mark sent.
    pub delivery_cost_daemon: Option<Num>,
    pub delivery_cost_postgres: Option<Num>,
    pub delivery_cost_rabbitmq: Option<Num>,
}

/// One of a run's CPU costs, read off the run.
type CostPart = fn(&WritesRun) -> &Option<Num>;

impl WritesRun {
    /// The parts of each CPU cost, the daemon's, PostgreSQL's and RabbitMQ's: per 1,000 writes
    /// with their events delivered; per 1,000 writes alone; per 1,000 events delivered alone.
    const COST: [CostPart; 3] = [
        |run| &run.cost_daemon,
        |run| &run.cost_postgres,
        |run| &run.cost_rabbitmq,
    ];
    const ALONE_COST: [CostPart; 3] = [
        |run| &run.alone_cost_daemon,
        |run| &run.alone_cost_postgres,
        |run| &run.alone_cost_rabbitmq,
    ];
    const DELIVERY_COST: [CostPart; 3] = [
        |run| &run.delivery_cost_daemon,
        |run| &run.delivery_cost_postgres,
        |run| &run.delivery_cost_rabbitmq,
    ];

    /// The three `parts` together: their sum as recorded (3 decimals), so that the report
    /// rebuilt from its per-run table gives the same total; None if one is missing.
    fn cost(&self, parts: [CostPart; 3]) -> Option<Num> {
        let mut thousandths = 0.0;
        for part in parts {
            thousandths += (part(self).as_ref()?.value * 1000.0).round();
        }
        Num::fixed(thousandths / 1000.0, 3)
    }
}

/// A CPU cost over the runs: the median of its per-run totals, and the median of each part.
struct CostMedians {
    total: Option<f64>,
    parts: [Option<f64>; 3],
}

impl CostMedians {
    fn of(runs: &[WritesRun], parts: [CostPart; 3]) -> Self {
        let totals: Vec<Option<Num>> = runs.iter().map(|run| run.cost(parts)).collect();
        Self {
            total: median(&totals),
            parts: parts.map(|part| median(&col(runs, part))),
        }
    }

    /// "total (`label`daemon + PostgreSQL + RabbitMQ)", 3 decimals each.
    fn cell(&self, label: &str) -> String {
        let [daemon, postgres, rabbitmq] = self.parts.map(|part| fmt(part, 3));
        format!(
            "{} ({label}{daemon} + {postgres} + {rabbitmq})",
            fmt(self.total, 3)
        )
    }
}

impl Metrics for WritesRun {
    fn metrics(&self) -> Vec<(String, Option<Num>)> {
        let mut m = vec![
            ("cpu_cores".into(), self.cpu_cores.clone()),
            ("rss_mb".into(), self.rss_mb.clone()),
        ];
        m.extend(self.wrk.metrics(""));
        m.extend([
            ("backlog_at_end".into(), self.backlog_at_end.clone()),
            ("entries".into(), self.entries.clone()),
            ("entries_minus_2xx".into(), self.entries_minus_2xx.clone()),
            ("rows_consistent".into(), self.rows_consistent.clone()),
            ("payload_bytes".into(), self.payload_bytes.clone()),
        ]);
        m.extend(self.log.metrics());
        m.extend([
            ("pg_tps".into(), self.pg_tps.clone()),
            ("pg_latency_ms".into(), self.pg_latency_ms.clone()),
            ("pg_failed".into(), self.pg_failed.clone()),
            ("cost_daemon".into(), self.cost_daemon.clone()),
            ("cost_postgres".into(), self.cost_postgres.clone()),
            ("cost_rabbitmq".into(), self.cost_rabbitmq.clone()),
            ("pg_cost".into(), self.pg_cost.clone()),
            ("machine_cost".into(), self.machine_cost.clone()),
            ("machine_busy_pct".into(), self.machine_busy_pct.clone()),
            ("pg_machine_cost".into(), self.pg_machine_cost.clone()),
            (
                "pg_machine_busy_pct".into(),
                self.pg_machine_busy_pct.clone(),
            ),
            ("alone_rps".into(), self.alone_rps.clone()),
            ("alone_p99_ms".into(), self.alone_p99_ms.clone()),
            ("alone_cost_daemon".into(), self.alone_cost_daemon.clone()),
            (
                "alone_cost_postgres".into(),
                self.alone_cost_postgres.clone(),
            ),
            (
                "alone_cost_rabbitmq".into(),
                self.alone_cost_rabbitmq.clone(),
            ),
            (
                "delivery_cost_daemon".into(),
                self.delivery_cost_daemon.clone(),
            ),
            (
                "delivery_cost_postgres".into(),
                self.delivery_cost_postgres.clone(),
            ),
            (
                "delivery_cost_rabbitmq".into(),
                self.delivery_cost_rabbitmq.clone(),
            ),
        ]);
        m
    }
}

#[derive(Clone, Debug, Default)]
pub struct ReplaysRun {
    pub cpu_cores: Option<Num>,
    pub rss_mb: Option<Num>,
    pub wrk: WrkFigures,
    pub healthz: WrkFigures,
    pub pg_tps: Option<Num>,
    pub pg_latency_ms: Option<Num>,
    pub rss_mb_after_all: Option<Num>,
    pub entries: Option<Num>,
    pub log: LogProblems,
}

impl Metrics for ReplaysRun {
    fn metrics(&self) -> Vec<(String, Option<Num>)> {
        let mut m = vec![
            ("cpu_cores".into(), self.cpu_cores.clone()),
            ("rss_mb".into(), self.rss_mb.clone()),
        ];
        m.extend(self.wrk.metrics(""));
        m.extend(self.healthz.metrics("healthz_"));
        m.extend([
            ("pg_tps".into(), self.pg_tps.clone()),
            ("pg_latency_ms".into(), self.pg_latency_ms.clone()),
            ("rss_mb_after_all".into(), self.rss_mb_after_all.clone()),
            ("entries".into(), self.entries.clone()),
        ]);
        m.extend(self.log.metrics());
        m
    }
}

#[derive(Clone, Debug, Default)]
pub struct StormRun {
    pub cpu_cores: Option<Num>,
    pub rss_mb: Option<Num>,
    pub wrk: WrkFigures,
    pub entries: Option<Num>,
    pub records: Option<Num>,
    pub events: Option<Num>,
    /// 1 when entries, records and events are each exactly the number of keys.
    pub count_ok: Option<Num>,
    pub log: LogProblems,
}

impl Metrics for StormRun {
    fn metrics(&self) -> Vec<(String, Option<Num>)> {
        let mut m = vec![
            ("cpu_cores".into(), self.cpu_cores.clone()),
            ("rss_mb".into(), self.rss_mb.clone()),
        ];
        m.extend(self.wrk.metrics(""));
        m.extend([
            ("entries".into(), self.entries.clone()),
            ("records".into(), self.records.clone()),
            ("events".into(), self.events.clone()),
            ("count_ok".into(), self.count_ok.clone()),
        ]);
        m.extend(self.log.metrics());
        m
    }
}

#[derive(Clone, Debug, Default)]
pub struct DrainRun {
    pub payload_bytes: Option<Num>,
    pub cpu_cores: Option<Num>,
    pub rss_mb: Option<Num>,
    pub seconds: Option<Num>,
    pub events_per_s: Option<Num>,
    pub queued: Option<Num>,
    pub queued_ok: Option<Num>,
    pub log: LogProblems,
    pub pub_events_per_s: Option<Num>,
    pub pub_queued: Option<Num>,
    /// RabbitMQ's CPU seconds per 1,000 messages: while the daemon drained (its start until
    /// the outbox was empty), and while the plain publisher ran.
    pub rabbitmq_cost: Option<Num>,
    pub pub_rabbitmq_cost: Option<Num>,
}

impl Metrics for DrainRun {
    fn metrics(&self) -> Vec<(String, Option<Num>)> {
        let mut m = vec![
            ("payload_bytes".into(), self.payload_bytes.clone()),
            ("cpu_cores".into(), self.cpu_cores.clone()),
            ("rss_mb".into(), self.rss_mb.clone()),
            ("seconds".into(), self.seconds.clone()),
            ("events_per_s".into(), self.events_per_s.clone()),
            ("queued".into(), self.queued.clone()),
            ("queued_ok".into(), self.queued_ok.clone()),
        ];
        m.extend(self.log.metrics());
        m.extend([
            ("pub_events_per_s".into(), self.pub_events_per_s.clone()),
            ("pub_queued".into(), self.pub_queued.clone()),
            ("rabbitmq_cost".into(), self.rabbitmq_cost.clone()),
            ("pub_rabbitmq_cost".into(), self.pub_rabbitmq_cost.clone()),
        ]);
        m
    }
}

/// `bench-e2e run`'s figures, as it printed them.
#[derive(Clone, Debug, Default)]
pub struct E2eRun {
    pub cpu_cores: Option<Num>,
    pub rss_mb: Option<Num>,
    pub p50_ms: Option<Num>,
    pub p99_ms: Option<Num>,
    pub max_ms: Option<Num>,
    pub matched: Option<Num>,
    pub created: Option<Num>,
    pub errors: Option<Num>,
    pub sent: Option<Num>,
    pub achieved_rate: Option<Num>,
    pub http_p50_ms: Option<Num>,
    pub http_p99_ms: Option<Num>,
    pub negative: Option<Num>,
    pub duplicate_deliveries: Option<Num>,
    pub log: LogProblems,
}

impl E2eRun {
    /// The fields of `bench-e2e run`'s result line that the report keeps, in order.
    pub const FIELDS: [&'static str; 12] = [
        "p50_ms",
        "p99_ms",
        "max_ms",
        "matched",
        "created",
        "errors",
        "sent",
        "achieved_rate",
        "http_p50_ms",
        "http_p99_ms",
        "negative",
        "duplicate_deliveries",
    ];

    pub fn field_mut(&mut self, name: &str) -> Option<&mut Option<Num>> {
        Some(match name {
            "p50_ms" => &mut self.p50_ms,
            "p99_ms" => &mut self.p99_ms,
            "max_ms" => &mut self.max_ms,
            "matched" => &mut self.matched,
            "created" => &mut self.created,
            "errors" => &mut self.errors,
            "sent" => &mut self.sent,
            "achieved_rate" => &mut self.achieved_rate,
            "http_p50_ms" => &mut self.http_p50_ms,
            "http_p99_ms" => &mut self.http_p99_ms,
            "negative" => &mut self.negative,
            "duplicate_deliveries" => &mut self.duplicate_deliveries,
            _ => return None,
        })
    }
}

impl Metrics for E2eRun {
    fn metrics(&self) -> Vec<(String, Option<Num>)> {
        let mut m = vec![
            ("cpu_cores".into(), self.cpu_cores.clone()),
            ("rss_mb".into(), self.rss_mb.clone()),
        ];
        let mut copy = self.clone();
        for name in E2eRun::FIELDS {
            let value = copy.field_mut(name).and_then(Option::take);
            m.push((name.into(), value));
        }
        m.extend(self.log.metrics());
        m
    }
}

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
    pub port: u16,
    pub config: String,
    /// postgres://user@host:port
    pub pg_base: String,
}

impl Settings {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
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
    pub writes: Vec<WritesRun>,
    pub replays: Vec<ReplaysRun>,
    pub storm: Vec<StormRun>,
    pub drain: Vec<DrainRun>,
    pub e2e: Vec<E2eRun>,
}

fn col<T>(runs: &[T], field: impl Fn(&T) -> &Option<Num>) -> Vec<Option<Num>> {
    runs.iter().map(|run| field(run).clone()).collect()
}

/// "met" when every run's flag is 1, "NOT met" when one is not, n/a without runs.
fn all_flags(values: &[Option<Num>]) -> Verdict {
    if values.is_empty() {
        return Verdict::NotAvailable;
    }
    Verdict::of(Some(minimum(values) == Some(1.0)))
}

/// "cost (busy share %)", or n/a without the cost.
fn busy_cell(cost: Option<f64>, busy_pct: Option<f64>) -> String {
    match busy_pct {
        Some(_) if cost.is_some() => format!("{} (busy {} %)", fmt(cost, 3), fmt(busy_pct, 1)),
        _ => fmt(cost, 3),
    }
}

fn ratio_cell(value: Option<f64>) -> String {
    format!("{}×", fmt(value, 2))
}

impl Report {
    /// The results table: each figure beside its baseline, with its target.
    pub fn results_table(&self) -> String {
        let s = &self.settings;
        let w_rps = median(&col(&self.writes, |r| &r.wrk.rps));
        let w_p50 = median(&col(&self.writes, |r| &r.wrk.p50_ms));
        let w_p99 = median(&col(&self.writes, |r| &r.wrk.p99_ms));
        let pg_tps = median(&col(&self.writes, |r| &r.pg_tps));
        let pg_lat = median(&col(&self.writes, |r| &r.pg_latency_ms));
        let w_cost = CostMedians::of(&self.writes, WritesRun::COST);
        let pg_cost = median(&col(&self.writes, |r| &r.pg_cost));
        let m_cost = median(&col(&self.writes, |r| &r.machine_cost));
        let m_busy = median(&col(&self.writes, |r| &r.machine_busy_pct));
        let pm_cost = median(&col(&self.writes, |r| &r.pg_machine_cost));
        let pm_busy = median(&col(&self.writes, |r| &r.pg_machine_busy_pct));
        let a_rps = median(&col(&self.writes, |r| &r.alone_rps));
        let a_p99 = median(&col(&self.writes, |r| &r.alone_p99_ms));
        let a_cost = CostMedians::of(&self.writes, WritesRun::ALONE_COST);
        let d_cost = CostMedians::of(&self.writes, WritesRun::DELIVERY_COST);
        let r_rps = median(&col(&self.replays, |r| &r.wrk.rps));
        let h_rps = median(&col(&self.replays, |r| &r.healthz.rps));
        let s_tps = median(&col(&self.replays, |r| &r.pg_tps));
        let st_rps = median(&col(&self.storm, |r| &r.wrk.rps));
        let d_eps = median(&col(&self.drain, |r| &r.events_per_s));
        let d_mq = median(&col(&self.drain, |r| &r.rabbitmq_cost));
        let p_mq = median(&col(&self.drain, |r| &r.pub_rabbitmq_cost));
        let p_eps = median(&col(&self.drain, |r| &r.pub_events_per_s));
        let e_p50 = median(&col(&self.e2e, |r| &r.p50_ms));
        let e_p99 = median(&col(&self.e2e, |r| &r.p99_ms));
        let storm_ok = all_flags(&col(&self.storm, |r| &r.count_ok));
        let drain_ok = all_flags(&col(&self.drain, |r| &r.queued_ok));

        let writes_ratio = ratio(w_rps, pg_tps);
        let p99_ratio = ratio(w_p99, pg_lat);
        let cost_ratio = ratio(w_cost.total, pg_cost);
        let healthz_ratio = ratio(r_rps, h_rps);
        let select_ratio = ratio(r_rps, s_tps);
        let drain_ratio = ratio(d_eps, p_eps);
        let drain_write_ratio = ratio(d_eps, w_rps);

        let rows: Vec<[String; 7]> = vec![
            [
                format!("unique-key writes, {} conn.", s.connections),
                "requests/s vs pgbench conventional tps".into(),
                fmt(w_rps, 0),
                fmt(pg_tps, 0),
                ratio_cell(writes_ratio),
                "≥ 2.5×".into(),
                Target::AtLeast(2.5).judge(writes_ratio).to_string(),
            ],
            [
                "unique-key writes".into(),
                "p99 latency vs pgbench average latency (ms)".into(),
                format!("{} (p50 {})", fmt(w_p99, 2), fmt(w_p50, 2)),
                fmt(pg_lat, 2),
                ratio_cell(p99_ratio),
                "p99 < pgbench avg".into(),
                Target::judge_against(w_p99, pg_lat, Target::Below).to_string(),
            ],
            [
                "unique-key writes".into(),
                "CPU s per 1,000 writes (daemon + PostgreSQL + RabbitMQ, events delivered) vs PostgreSQL's per 1,000 pgbench transactions".into(),
                w_cost.cell("medians: "),
                fmt(pg_cost, 3),
                ratio_cell(cost_ratio),
                "–".into(),
                "–".into(),
            ],
            [
                "unique-key writes".into(),
                "CPU s per 1,000, whole machine (every process, load generators included): writes, events delivered, vs pgbench transactions; in brackets the machine's busy share while the load ran".into(),
                busy_cell(m_cost, m_busy),
                busy_cell(pm_cost, pm_busy),
                ratio_cell(ratio(m_cost, pm_cost)),
                "–".into(),
                "–".into(),
            ],
            [
                "unique-key writes, broker unreachable".into(),
                "requests/s (p99 ms) while no event is delivered vs pgbench conventional tps"
                    .into(),
                format!("{} (p99 {})", fmt(a_rps, 0), fmt(a_p99, 2)),
                fmt(pg_tps, 0),
                ratio_cell(ratio(a_rps, pg_tps)),
                "–".into(),
                "–".into(),
            ],
            [
                "unique-key writes".into(),
                "CPU s per 1,000: the write alone (broker unreachable) + delivering its events afterwards (daemon + PostgreSQL + RabbitMQ each)".into(),
                format!("{} + {}", a_cost.cell(""), d_cost.cell("")),
                fmt(pg_cost, 3),
                "–".into(),
                "–".into(),
                "–".into(),
            ],
            [
                format!("replays ({} keys)", s.replay_keys),
                "requests/s vs the daemon's /healthz".into(),
                fmt(r_rps, 0),
                fmt(h_rps, 0),
                ratio_cell(healthz_ratio),
                "≥ 0.8×".into(),
                Target::AtLeast(0.8).judge(healthz_ratio).to_string(),
            ],
            [
                "replays".into(),
                "requests/s vs pgbench PK select tps".into(),
                fmt(r_rps, 0),
                fmt(s_tps, 0),
                ratio_cell(select_ratio),
                "> 1.0×".into(),
                Target::judge_against(r_rps, s_tps, Target::Above).to_string(),
            ],
            [
                format!("duplicate storm ({} keys)", s.storm_keys),
                format!("requests/s; entries = {} after", s.storm_keys),
                fmt(st_rps, 0),
                "–".into(),
                "–".into(),
                format!("exactly {} entries, records, events", s.storm_keys),
                storm_ok.to_string(),
            ],
            [
                format!("outbox drain ({} events)", s.drain_events),
                format!(
                    "events/s vs plain lapin publisher (window {})",
                    s.publish_window
                ),
                fmt(d_eps, 0),
                fmt(p_eps, 0),
                ratio_cell(drain_ratio),
                "≥ 0.9×".into(),
                Target::AtLeast(0.9).judge(drain_ratio).to_string(),
            ],
            [
                "outbox drain".into(),
                "events/s vs unique-key write rate".into(),
                fmt(d_eps, 0),
                fmt(w_rps, 0),
                ratio_cell(drain_write_ratio),
                "> 1.0×".into(),
                Target::judge_against(d_eps, w_rps, Target::Above).to_string(),
            ],
            [
                "outbox drain".into(),
                "RabbitMQ's CPU s per 1,000 messages: the daemon's relays vs the plain publisher"
                    .into(),
                fmt(d_mq, 3),
                fmt(p_mq, 3),
                ratio_cell(ratio(d_mq, p_mq)),
                "–".into(),
                "–".into(),
            ],
            [
                "outbox drain".into(),
                "every event reached the bound queue".into(),
                per_run(&col(&self.drain, |r| &r.queued), None),
                "–".into(),
                "–".into(),
                s.drain_events.to_string(),
                drain_ok.to_string(),
            ],
            [
                format!("end-to-end at {} req/s", s.e2e_rate),
                "p50, 201 received → delivery received (ms)".into(),
                fmt(e_p50, 2),
                "–".into(),
                "–".into(),
                "< 5 ms".into(),
                Target::Below(5.0).judge(e_p50).to_string(),
            ],
            [
                "end-to-end".into(),
                "p99 (ms)".into(),
                fmt(e_p99, 2),
                "–".into(),
                "–".into(),
                "< 20 ms".into(),
                Target::Below(20.0).judge(e_p99).to_string(),
            ],
        ];
        let mut out = String::from(
            "| scenario | measure | retrysafe | baseline | ratio | target | result |\n|---|---|---:|---:|---:|---|---|",
        );
        for row in rows {
            out.push_str("\n| ");
            out.push_str(&row.join(" | "));
            out.push_str(" |");
        }
        out
    }

    /// Peak RSS and CPU of the daemon per scenario.
    pub fn resources_table(&self) -> String {
        let mut out = String::from(
            "| scenario | daemon peak RSS, MiB (max of runs) | daemon CPU, cores (median; 1.00 = one core) | target | result |\n|---|---:|---:|---|---|",
        );
        // Per scenario: its name, every run's peak RSS, every run's CPU.
        type Column = Vec<Option<Num>>;
        let scenarios: [(&str, Column, Column); 5] = [
            (
                "writes",
                col(&self.writes, |r| &r.rss_mb),
                col(&self.writes, |r| &r.cpu_cores),
            ),
            (
                "replays",
                col(&self.replays, |r| &r.rss_mb),
                col(&self.replays, |r| &r.cpu_cores),
            ),
            (
                "storm",
                col(&self.storm, |r| &r.rss_mb),
                col(&self.storm, |r| &r.cpu_cores),
            ),
            (
                "drain",
                col(&self.drain, |r| &r.rss_mb),
                col(&self.drain, |r| &r.cpu_cores),
            ),
            (
                "e2e",
                col(&self.e2e, |r| &r.rss_mb),
                col(&self.e2e, |r| &r.cpu_cores),
            ),
        ];
        for (name, rss, cpu) in scenarios {
            let peak = maximum(&rss);
            let _ = write!(
                out,
                "\n| {name} | {} | {} of {} | RSS < 200 MiB | {} |",
                fmt(peak, 1),
                fmt(median(&cpu), 2),
                self.machine.nproc,
                Target::Below(200.0).judge(peak)
            );
        }
        out
    }

    /// The sanity checks, every run's value.
    pub fn checks_table(&self) -> String {
        let w = |f: fn(&WritesRun) -> &Option<Num>| per_run(&col(&self.writes, f), None);
        let r = |f: fn(&ReplaysRun) -> &Option<Num>| per_run(&col(&self.replays, f), None);
        let st = |f: fn(&StormRun) -> &Option<Num>| per_run(&col(&self.storm, f), None);
        let d = |f: fn(&DrainRun) -> &Option<Num>, decimals: Option<usize>| {
            per_run(&col(&self.drain, f), decimals)
        };
        let e = |f: fn(&E2eRun) -> &Option<Num>, decimals: Option<usize>| {
            per_run(&col(&self.e2e, f), decimals)
        };
        let logs = |f: fn(&LogProblems) -> &Option<Num>| {
            [
                per_run(&col(&self.writes, |x| f(&x.log)), None),
                per_run(&col(&self.replays, |x| f(&x.log)), None),
                per_run(&col(&self.storm, |x| f(&x.log)), None),
                per_run(&col(&self.drain, |x| f(&x.log)), None),
                per_run(&col(&self.e2e, |x| f(&x.log)), None),
            ]
            .join(" / ")
        };
        let keys = self.settings.replay_keys;
        let rows: Vec<(String, String)> = vec![
            (
                "writes: wrk errors (connect/read/write/status/timeout)".into(),
                w(|x| &x.wrk.errors),
            ),
            (
                "writes: entries − 2xx answers (≥ 0; in-flight at the end on top)".into(),
                w(|x| &x.entries_minus_2xx),
            ),
            (
                "writes: entries = idempotency records = outbox rows".into(),
                format!("{} (1 = yes)", w(|x| &x.rows_consistent)),
            ),
            (
                "writes: unsent outbox rows when wrk stopped".into(),
                w(|x| &x.backlog_at_end),
            ),
            (
                "writes: event payload bytes (daemon's real events)".into(),
                w(|x| &x.payload_bytes),
            ),
            (
                "writes: pgbench failed transactions".into(),
                w(|x| &x.pg_failed),
            ),
            (
                "replays: wrk errors (replays / healthz)".into(),
                format!("{} / {}", r(|x| &x.wrk.errors), r(|x| &x.healthz.errors)),
            ),
            (
                format!("replays: entries after (must stay {keys})"),
                r(|x| &x.entries),
            ),
            ("storm: wrk errors".into(), st(|x| &x.wrk.errors)),
            (
                "storm: entries / records / events".into(),
                format!(
                    "{} / {} / {}",
                    st(|x| &x.entries),
                    st(|x| &x.records),
                    st(|x| &x.events)
                ),
            ),
            (
                "drain: synthetic payload bytes".into(),
                d(|x| &x.payload_bytes, None),
            ),
            ("drain: seconds to drain".into(), d(|x| &x.seconds, Some(2))),
            (
                "drain: messages in the bound queue (daemon / publisher)".into(),
                format!(
                    "{} / {}",
                    d(|x| &x.queued, None),
                    d(|x| &x.pub_queued, None)
                ),
            ),
            (
                "e2e: sent / 201 / errors / matched".into(),
                format!(
                    "{} / {} / {} / {}",
                    e(|x| &x.sent, None),
                    e(|x| &x.created, None),
                    e(|x| &x.errors, None),
                    e(|x| &x.matched, None)
                ),
            ),
            (
                "e2e: achieved request rate".into(),
                e(|x| &x.achieved_rate, Some(1)),
            ),
            (
                "e2e: deliveries before the 201 was seen (negative latency)".into(),
                e(|x| &x.negative, None),
            ),
            (
                "e2e: duplicate deliveries".into(),
                e(|x| &x.duplicate_deliveries, None),
            ),
            (
                "e2e: HTTP latency p50 / p99 (ms)".into(),
                format!(
                    "{} / {}",
                    e(|x| &x.http_p50_ms, Some(2)),
                    e(|x| &x.http_p99_ms, Some(2))
                ),
            ),
            (
                "daemon log lines at WARN/ERROR under load (writes/replays/storm/drain/e2e)".into(),
                logs(|l| &l.under_load),
            ),
            (
                "daemon log lines at WARN/ERROR after SIGTERM (same order)".into(),
                logs(|l| &l.after_sigterm),
            ),
        ];
        let mut out = String::from("| check | per run |\n|---|---|");
        for (check, value) in rows {
            let _ = write!(out, "\n| {check} | {value} |");
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
        for _ in 0..runs {
            out.push_str("---:|");
        }
        fn rows<T: Metrics>(out: &mut String, scenario: &str, runs: &[T], columns: usize) {
            let per_run: Vec<Vec<(String, Option<Num>)>> =
                runs.iter().map(Metrics::metrics).collect();
            let Some(first) = per_run.first() else {
                return;
            };
            for (i, (metric, _)) in first.iter().enumerate() {
                let _ = write!(out, "\n| {scenario} | {metric}");
                for run in 0..columns {
                    let cell = match per_run.get(run) {
                        Some(values) => match &values[i].1 {
                            Some(num) => num.text.clone(),
                            None => "n/a".into(),
                        },
                        None => String::new(),
                    };
                    let _ = write!(out, " | {cell}");
                }
                out.push_str(" |");
            }
        }
        rows(&mut out, "writes", &self.writes, runs);
        rows(&mut out, "replays", &self.replays, runs);
        rows(&mut out, "storm", &self.storm, runs);
        rows(&mut out, "drain", &self.drain, runs);
        rows(&mut out, "e2e", &self.e2e, runs);
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
        let s = &self.settings;
        let m = &self.machine;
        let url = s.url();
        let (t, c, d) = (s.wrk_threads, s.connections, s.duration);
        let mode = if s.quick { "BENCH_QUICK=1" } else { "full" };
        format!(
            r#"# Benchmarks

{mode_line}

Written by `bench/run` on {written_at} (run id `{run_id}`), daemon at commit
`{commit}`. Every figure is the median of the runs; each scenario was measured side by side
with its baseline in the same run.

## Machine

| | |
|---|---|
| CPU | {cpu}, {nproc} cores (nproc) |
| memory | {mem} GiB |
| kernel | {kernel} |
| PostgreSQL | {pg} (the distribution package's settings; autovacuum: {autovacuum}) |
| RabbitMQ | {rabbit} |
| tools | wrk {wrk}, pgbench {pgbench}, {rustc} |

Everything (daemon, PostgreSQL, RabbitMQ, wrk/pgbench/the Rust helpers) shares these {nproc} cores.
Daemon settings from `{config}`: {settings}.

## Results

{results}

### Daemon resources per scenario

Peak RSS is `VmHWM` from `/proc/PID/status` just before the daemon is stopped (the daemon is
restarted for every scenario and run). CPU is (utime + stime) of the daemon over the measured
window divided by the window's wall time: wrk's duration for writes, replays and storm; daemon
start to empty outbox for the drain; the whole `bench-e2e run` for end-to-end.

{resources}

### Checks

{checks}

## Commands

`bench/run` (mode: {mode}) ran, per scenario and run, on a fresh
database `retrysafe_bench_<run id>_<scenario>_<run>` (created and migrated with `retrysafe migrate`)
and a fresh durable topic exchange `retrysafe.bench.<run id>.<scenario>.<run>` with a durable
queue bound for `#` (`bench-publisher bind`):

```sh
cargo build --release --locked --bin retrysafe --example bench-publisher --example bench-e2e --example bench
RETRYSAFE_HTTP__LISTEN=127.0.0.1:{port} RETRYSAFE_DATABASE__URL={pg_base}/<db> \
  RETRYSAFE_AMQP__EXCHANGE=<exchange> RETRYSAFE_LOG__LEVEL=warn \
  target/release/retrysafe serve --config {config}

# unique-key writes, then its baseline on another fresh migrated database (daemon stopped)
wrk -t{t} -c{c} -d{d}s --timeout 10s --latency -s bench/unique_keys.lua {url}/
# between them, on a third: the same wrk with RETRYSAFE_AMQP__URL=amqp://guest:guest@127.0.0.1:1/%2f
# (no broker: nothing is delivered), then the daemon restarted as above until no event is unsent
pgbench -n -M prepared -c {c} -j {t} -T {d} -f bench/conventional.sql <db>

# replays: create the keys, replay them, then the baselines against the same daemon and database
target/release/examples/bench-e2e precreate --url {url} --kind bench.replay --prefix replay- --count {replay_keys}
wrk -t{t} -c{c} -d{d}s --timeout 10s --latency -s bench/replay.lua {url}/
wrk -t{t} -c{c} -d{d}s --timeout 10s --latency -s bench/healthz.lua {url}/healthz
pgbench -n -M prepared -c {c} -j {t} -T {d} -D keys={replay_keys} -f bench/replay_select.sql <db>

# duplicate storm; then SELECT count(*) FROM entries (and idempotency_records, outbox_events) = {storm_keys}
wrk -t{t} -c{c} -d{d}s --timeout 10s --latency -s bench/storm.lua {url}/

# outbox drain: daemon not running, {drain} rows inserted with generate_series (see BACKLOG_SQL
# in bench/scenarios.rs), ANALYZE, then the daemon is started and timed until nothing is unsent
target/release/examples/bench-publisher wait-drained --db <db> --start-unix-ns <just before start>
target/release/examples/bench-publisher count --queue <queue> --expect {drain}
# baseline, to a fresh exchange of the same kind with a bound queue
target/release/examples/bench-publisher publish --exchange <exchange> --count {drain} --payload-bytes <avg payload> --window {window}

# end-to-end latency
target/release/examples/bench-e2e run --url {url} --queue <queue> --rate {e2e_rate} --seconds {e2e_seconds}
```

Method notes:

- wrk is closed-loop: each of the {c} connections sends its next request when the previous
  answer arrives, so its percentiles understate the latency an open-loop client would see under
  overload (coordinated omission). `bench-e2e` is open-loop.
- pgbench's "latency average" for the conventional transaction covers its five round trips
  (BEGIN, three INSERTs, COMMIT); its JSON values are built per transaction so that PostgreSQL
  parses jsonb each time, with the sizes the daemon stores (see the comments in
  bench/conventional.sql).
- The whole machine's CPU per write or transaction is /proc/stat's user, nice, system, irq and
  softirq time (steal not counted) over the same window as the per-process costs, divided by
  the writes or transactions: every process counts, wrk, pgbench and this program included.
  Operations per second are busy CPU-seconds per second over CPU-seconds per operation, so the
  rate ratio is the inverse of the ratio of these costs times the ratio of the busy shares; with
  both loads keeping the machine busy, a higher rate ratio needs a lower cost ratio.
- The drain's clock starts just before the daemon process is spawned, so it includes the
  daemon's start (connecting, checking migrations, connecting to the broker).
  `bench-publisher publish` sends messages of the same size with the relay's properties and
  headers, persistent and mandatory, to a durable queue, as the relay does.
- The end-to-end latency is measured from the moment `bench-e2e` has the 201's headers to the
  moment its consumer (auto-ack, on its own thread) gets the delivery; both clocks are the same
  monotonic clock of one process. A negative value means the event arrived before the client had
  read the 201.

## Per-run values

{per_run}

{marker}
"#,
            mode_line = s.mode_line(),
            written_at = self.written_at,
            run_id = self.run_id,
            commit = m.commit,
            cpu = m.cpu_model,
            nproc = m.nproc,
            mem = m.mem_gib,
            kernel = m.kernel,
            pg = m.pg_version,
            autovacuum = m.autovacuum,
            rabbit = m.rabbit_version,
            wrk = m.wrk_version,
            pgbench = m.pgbench_version,
            rustc = m.rustc_version,
            config = s.config,
            settings = m.daemon_settings,
            results = self.results_table(),
            resources = self.resources_table(),
            checks = self.checks_table(),
            port = s.port,
            pg_base = s.pg_base,
            replay_keys = s.replay_keys,
            storm_keys = s.storm_keys,
            drain = s.drain_events,
            window = s.publish_window,
            e2e_rate = s.e2e_rate,
            e2e_seconds = s.e2e_seconds,
            per_run = self.per_run_table(),
            marker = HAND_WRITTEN_MARKER,
        )
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

    fn n(text: &str) -> Option<Num> {
        Num::parse(text)
    }

    fn settings(runs: u32) -> Settings {
        Settings {
            quick: false,
            runs,
            duration: 15,
            drain_events: 100_000,
            e2e_seconds: 20,
            e2e_rate: 1000,
            connections: 64,
            wrk_threads: 2,
            replay_keys: 1000,
            storm_keys: 10,
            publish_window: 1000,
            port: 18437,
            config: "config.toml".into(),
            pg_base: "postgres://postgres@127.0.0.1:5432".into(),
        }
    }

    fn wrk(rps: &str, p50: &str, p99: &str) -> WrkFigures {
        WrkFigures {
            rps: n(rps),
            p50_ms: n(p50),
            p99_ms: n(p99),
            requests: n("1000"),
            errors: n("0"),
            status_errors: n("0"),
        }
    }

    fn logs() -> LogProblems {
        LogProblems {
            under_load: n("0"),
            after_sigterm: n("0"),
        }
    }

    /// Three runs with the figures of the committed BENCHMARKS.md's reference run.
    fn report() -> Report {
        let writes = [
            ("6461.60", "8.644", "32.912", "3026.413026", "21.147"),
            ("6345.19", "8.899", "32.506", "2785.185364", "22.979"),
            ("6996.96", "7.931", "31.643", "3684.375836", "17.371"),
        ]
        .iter()
        .map(|(rps, p50, p99, tps, lat)| WritesRun {
            cpu_cores: n("0.522"),
            rss_mb: n("81.0"),
            wrk: wrk(rps, p50, p99),
            backlog_at_end: n("6846"),
            entries: n("97397"),
            entries_minus_2xx: n("64"),
            rows_consistent: n("1"),
            payload_bytes: n("468"),
            log: logs(),
            pg_tps: n(tps),
            pg_latency_ms: n(lat),
            pg_failed: n("0"),
            cost_daemon: n("0.101"),
            cost_postgres: n("0.152"),
            cost_rabbitmq: n("0.048"),
            pg_cost: n("0.602"),
            machine_cost: n("0.312"),
            machine_busy_pct: n("98.4"),
            pg_machine_cost: n("0.650"),
            pg_machine_busy_pct: n("99.1"),
            alone_rps: n("11327.75"),
            alone_p99_ms: n("15.805"),
            alone_cost_daemon: n("0.054"),
            alone_cost_postgres: n("0.069"),
            alone_cost_rabbitmq: n("0.002"),
            delivery_cost_daemon: n("0.011"),
            delivery_cost_postgres: n("0.078"),
            delivery_cost_rabbitmq: n("0.104"),
        })
        .collect();
        let replays = [
            ("70612.68", "104995.10", "43549.662212"),
            ("76526.33", "101661.81", "43890.630458"),
            ("75382.79", "102623.81", "40630.118182"),
        ]
        .iter()
        .map(|(rps, healthz, tps)| ReplaysRun {
            cpu_cores: n("1.08"),
            rss_mb: n("29.4"),
            wrk: wrk(rps, "0.7", "5.0"),
            healthz: wrk(healthz, "0.4", "6.0"),
            pg_tps: n(tps),
            pg_latency_ms: n("1.47"),
            rss_mb_after_all: n("31.7"),
            entries: n("1000"),
            log: logs(),
        })
        .collect();
        let storm = ["77323.48", "83493.86", "76943.26"]
            .iter()
            .map(|rps| StormRun {
                cpu_cores: n("1.09"),
                rss_mb: n("29.2"),
                wrk: wrk(rps, "0.6", "4.5"),
                entries: n("10"),
                records: n("10"),
                events: n("10"),
                count_ok: n("1"),
                log: logs(),
            })
            .collect();
        let drain = [
            ("9459.1", "11679.13233425567"),
            ("9367.2", "11799.300387197158"),
            ("8931.7", "11672.398741820982"),
        ]
        .iter()
        .map(|(eps, pub_eps)| DrainRun {
            payload_bytes: n("470"),
            cpu_cores: n("0.229"),
            rss_mb: n("22.7"),
            seconds: n("10.571798177"),
            events_per_s: n(eps),
            queued: n("100000"),
            queued_ok: n("1"),
            log: logs(),
            pub_events_per_s: n(pub_eps),
            pub_queued: n("100000"),
            rabbitmq_cost: n("0.095"),
            pub_rabbitmq_cost: n("0.090"),
        })
        .collect();
        let e2e = [
            ("2.380844", "13.811098000000001"),
            ("1.9173689999999999", "13.030600999999999"),
            ("2.463325", "15.048056"),
        ]
        .iter()
        .map(|(p50, p99)| E2eRun {
            cpu_cores: n("0.371"),
            rss_mb: n("33.6"),
            p50_ms: n(p50),
            p99_ms: n(p99),
            max_ms: n("31.1"),
            matched: n("20000"),
            created: n("20000"),
            errors: n("0"),
            sent: n("20000"),
            achieved_rate: n("999.9413053452647"),
            http_p50_ms: n("3.852935"),
            http_p99_ms: n("16.428818"),
            negative: n("305"),
            duplicate_deliveries: n("0"),
            log: logs(),
        })
        .collect();
        Report {
            settings: settings(3),
            machine: Machine {
                cpu_model: "AMD EPYC".into(),
                nproc: "2".into(),
                mem_gib: "23.5".into(),
                kernel: "Linux 6.18".into(),
                pg_version: "15.20".into(),
                autovacuum: "off".into(),
                rabbit_version: "3.10.8".into(),
                wrk_version: "debian/4.1.0-3+b2".into(),
                pgbench_version: "15.20".into(),
                rustc_version: "rustc 1.95.0".into(),
                commit: "2e7982c".into(),
                daemon_settings: "database.pool_size=16".into(),
            },
            written_at: "2026-12-02 13:24 UTC".into(),
            run_id: "12021318ee32".into(),
            writes,
            replays,
            storm,
            drain,
            e2e,
        }
    }

    #[test]
    fn results_match_the_reference_run() {
        let table = report().results_table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 17);
        assert_eq!(
            lines[2],
            "| unique-key writes, 64 conn. | requests/s vs pgbench conventional tps | 6462 | 3026 | 2.14× | ≥ 2.5× | NOT met |"
        );
        assert_eq!(
            lines[3],
            "| unique-key writes | p99 latency vs pgbench average latency (ms) | 32.51 (p50 8.64) | 21.15 | 1.54× | p99 < pgbench avg | NOT met |"
        );
        assert_eq!(
            lines[4],
            "| unique-key writes | CPU s per 1,000 writes (daemon + PostgreSQL + RabbitMQ, events delivered) vs PostgreSQL's per 1,000 pgbench transactions | 0.301 (medians: 0.101 + 0.152 + 0.048) | 0.602 | 0.50× | – | – |"
        );
        assert_eq!(
            lines[5],
            "| unique-key writes | CPU s per 1,000, whole machine (every process, load generators included): writes, events delivered, vs pgbench transactions; in brackets the machine's busy share while the load ran | 0.312 (busy 98.4 %) | 0.650 (busy 99.1 %) | 0.48× | – | – |"
        );
        assert_eq!(
            lines[6],
            "| unique-key writes, broker unreachable | requests/s (p99 ms) while no event is delivered vs pgbench conventional tps | 11328 (p99 15.80) | 3026 | 3.74× | – | – |"
        );
        assert_eq!(
            lines[7],
            "| unique-key writes | CPU s per 1,000: the write alone (broker unreachable) + delivering its events afterwards (daemon + PostgreSQL + RabbitMQ each) | 0.125 (0.054 + 0.069 + 0.002) + 0.193 (0.011 + 0.078 + 0.104) | 0.602 | – | – | – |"
        );
        assert_eq!(
            lines[8],
            "| replays (1000 keys) | requests/s vs the daemon's /healthz | 75383 | 102624 | 0.73× | ≥ 0.8× | NOT met |"
        );
        assert_eq!(
            lines[9],
            "| replays | requests/s vs pgbench PK select tps | 75383 | 43550 | 1.73× | > 1.0× | met |"
        );
        assert_eq!(
            lines[10],
            "| duplicate storm (10 keys) | requests/s; entries = 10 after | 77323 | – | – | exactly 10 entries, records, events | met |"
        );
        assert_eq!(
            lines[11],
            "| outbox drain (100000 events) | events/s vs plain lapin publisher (window 1000) | 9367 | 11679 | 0.80× | ≥ 0.9× | NOT met |"
        );
        assert_eq!(
            lines[12],
            "| outbox drain | events/s vs unique-key write rate | 9367 | 6462 | 1.45× | > 1.0× | met |"
        );
        assert_eq!(
            lines[13],
            "| outbox drain | RabbitMQ's CPU s per 1,000 messages: the daemon's relays vs the plain publisher | 0.095 | 0.090 | 1.06× | – | – |"
        );
        assert_eq!(
            lines[14],
            "| outbox drain | every event reached the bound queue | 100000/100000/100000 | – | – | 100000 | met |"
        );
        assert_eq!(
            lines[15],
            "| end-to-end at 1000 req/s | p50, 201 received → delivery received (ms) | 2.38 | – | – | < 5 ms | met |"
        );
        assert_eq!(
            lines[16],
            "| end-to-end | p99 (ms) | 13.81 | – | – | < 20 ms | met |"
        );
    }

    #[test]
    fn a_failed_storm_run_fails_its_target() {
        let mut report = report();
        report.storm[1].count_ok = n("0");
        assert!(report
            .results_table()
            .contains("exactly 10 entries, records, events | NOT met |"));
    }

    #[test]
    fn scenarios_not_run_show_na() {
        let mut report = report();
        report.replays.clear();
        report.storm.clear();
        report.drain.clear();
        report.e2e.clear();
        let table = report.results_table();
        assert!(table.contains(
            "| replays (1000 keys) | requests/s vs the daemon's /healthz | n/a | n/a | n/a× | ≥ 0.8× | n/a |"
        ));
        assert!(table.contains("exactly 10 entries, records, events | n/a |"));
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
        assert!(per_run.contains("| writes | rps | 6461.60 | 6345.19 | 6996.96 |"));
        assert!(!per_run.contains("| storm |"));
    }

    #[test]
    fn resources_and_checks() {
        let report = report();
        let resources = report.resources_table();
        assert!(resources.contains("| writes | 81.0 | 0.52 of 2 | RSS < 200 MiB | met |"));
        assert!(resources.contains("| drain | 22.7 | 0.23 of 2 | RSS < 200 MiB | met |"));
        let checks = report.checks_table();
        assert!(checks
            .contains("| writes: entries = idempotency records = outbox rows | 1/1/1 (1 = yes) |"));
        assert!(checks.contains("| drain: seconds to drain | 10.57/10.57/10.57 |"));
        assert!(checks.contains("| e2e: achieved request rate | 999.9/999.9/999.9 |"));
        assert!(checks
            .contains("| e2e: HTTP latency p50 / p99 (ms) | 3.85/3.85/3.85 / 16.43/16.43/16.43 |"));
        assert!(checks.contains(
            "| daemon log lines at WARN/ERROR after SIGTERM (same order) | 0/0/0 / 0/0/0 / 0/0/0 / 0/0/0 / 0/0/0 |"
        ));
    }

    #[test]
    fn per_run_table_keeps_the_tools_text_and_order() {
        let table = report().per_run_table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "| scenario | metric | run 1 | run 2 | run 3 |");
        assert_eq!(lines[1], "|---|---|---:|---:|---:|");
        assert_eq!(lines[2], "| writes | cpu_cores | 0.522 | 0.522 | 0.522 |");
        assert!(table.contains("| e2e | p50_ms | 2.380844 | 1.9173689999999999 | 2.463325 |"));
        assert!(table.contains("| drain | pub_events_per_s | 11679.13233425567 | 11799.300387197158 | 11672.398741820982 |"));
        let metrics: Vec<&str> = lines
            .iter()
            .filter(|l| l.starts_with("| writes |"))
            .map(|l| l.split(" | ").nth(1).unwrap())
            .collect();
        assert_eq!(
            metrics,
            [
                "cpu_cores",
                "rss_mb",
                "rps",
                "p50_ms",
                "p99_ms",
                "requests",
                "errors",
                "status_errors",
                "backlog_at_end",
                "entries",
                "entries_minus_2xx",
                "rows_consistent",
                "payload_bytes",
                "log_problems",
                "shutdown_log_problems",
                "pg_tps",
                "pg_latency_ms",
                "pg_failed",
                "cost_daemon",
                "cost_postgres",
                "cost_rabbitmq",
                "pg_cost",
                "machine_cost",
                "machine_busy_pct",
                "pg_machine_cost",
                "pg_machine_busy_pct",
                "alone_rps",
                "alone_p99_ms",
                "alone_cost_daemon",
                "alone_cost_postgres",
                "alone_cost_rabbitmq",
                "delivery_cost_daemon",
                "delivery_cost_postgres",
                "delivery_cost_rabbitmq"
            ]
        );
        let e2e: Vec<&str> = lines
            .iter()
            .filter(|l| l.starts_with("| e2e |"))
            .map(|l| l.split(" | ").nth(1).unwrap())
            .collect();
        assert_eq!(e2e.len(), 16);
        assert_eq!(e2e[2], "p50_ms");
        assert_eq!(e2e[15], "shutdown_log_problems");
        // 34 + 20 + 14 + 13 + 16 rows, and the two header lines.
        assert_eq!(lines.len(), 2 + 34 + 20 + 14 + 13 + 16);
    }

    #[test]
    fn the_document_has_every_section_in_order() {
        let text = report().render(None);
        let headings: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
        assert_eq!(
            headings,
            [
                "# Benchmarks",
                "## Machine",
                "## Results",
                "### Daemon resources per scenario",
                "### Checks",
                "## Commands",
                "# unique-key writes, then its baseline on another fresh migrated database (daemon stopped)",
                "# between them, on a third: the same wrk with RETRYSAFE_AMQP__URL=amqp://guest:guest@127.0.0.1:1/%2f",
                "# (no broker: nothing is delivered), then the daemon restarted as above until no event is unsent",
                "# replays: create the keys, replay them, then the baselines against the same daemon and database",
                "# duplicate storm; then SELECT count(*) FROM entries (and idempotency_records, outbox_events) = 10",
                "# outbox drain: daemon not running, 100000 rows inserted with generate_series (see BACKLOG_SQL",
                "# in bench/scenarios.rs), ANALYZE, then the daemon is started and timed until nothing is unsent",
                "# baseline, to a fresh exchange of the same kind with a bound queue",
                "# end-to-end latency",
                "## Per-run values",
                "## Reading",
            ]
        );
        assert!(text.contains(
            "Full run: 15 s per measurement, medians of 3 runs, a 100000-event drain, 20 s of end-to-end load per run."
        ));
        assert!(text.contains("wrk -t2 -c64 -d15s --timeout 10s --latency -s bench/unique_keys.lua http://127.0.0.1:18437/"));
        assert!(text.contains(
            "| PostgreSQL | 15.20 (the distribution package's settings; autovacuum: off) |"
        ));
        assert!(text.contains("_To be written by a person after a full run"));
        assert!(text.ends_with("with the profile that shows it._\n"));
    }

    #[test]
    fn quick_mode_says_so() {
        let mut report = report();
        report.settings.quick = true;
        let text = report.render(None);
        assert!(text.contains("**QUICK RUN (BENCH_QUICK=1): 15 s per measurement, 3 run(s)"));
        assert!(text.contains("`bench/run` (mode: BENCH_QUICK=1) ran"));
    }

    #[test]
    fn the_hand_written_part_is_kept() {
        let report = report();
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
        let again = report.render(Some(&text));
        assert_eq!(again, text);
        // A file without the marker gets the placeholder.
        assert!(report
            .render(Some("# Benchmarks\n\nno marker\n"))
            .contains("_To be written by a person"));
    }

    #[test]
    fn quoted_settings_of_a_config() {
        let config = "[http]\nlisten = \"127.0.0.1:8080\"\n\n[database]\nurl = \"x\"\npool_size = 16\nwriters = 2\n\n[outbox]\nworkers = 2\npoll_interval = \"1s\"\n# shards = 3\n[events]\naudit = false\n";
        assert_eq!(
            quoted_settings(config),
            "database.pool_size=16, database.writers=2, outbox.workers=2, outbox.poll_interval=\"1s\", events.audit=false"
        );
    }

    fn writes_slot<'a>(r: &'a mut WritesRun, name: &str) -> &'a mut Option<Num> {
        match name {
            "cpu_cores" => &mut r.cpu_cores,
            "rss_mb" => &mut r.rss_mb,
            "rps" => &mut r.wrk.rps,
            "p50_ms" => &mut r.wrk.p50_ms,
            "p99_ms" => &mut r.wrk.p99_ms,
            "requests" => &mut r.wrk.requests,
            "errors" => &mut r.wrk.errors,
            "status_errors" => &mut r.wrk.status_errors,
            "backlog_at_end" => &mut r.backlog_at_end,
            "entries" => &mut r.entries,
            "entries_minus_2xx" => &mut r.entries_minus_2xx,
            "rows_consistent" => &mut r.rows_consistent,
            "payload_bytes" => &mut r.payload_bytes,
            "log_problems" => &mut r.log.under_load,
            "shutdown_log_problems" => &mut r.log.after_sigterm,
            "pg_tps" => &mut r.pg_tps,
            "pg_latency_ms" => &mut r.pg_latency_ms,
            "pg_failed" => &mut r.pg_failed,
            "cost_daemon" => &mut r.cost_daemon,
            "cost_postgres" => &mut r.cost_postgres,
            "cost_rabbitmq" => &mut r.cost_rabbitmq,
            "pg_cost" => &mut r.pg_cost,
            "machine_cost" => &mut r.machine_cost,
            "machine_busy_pct" => &mut r.machine_busy_pct,
            "pg_machine_cost" => &mut r.pg_machine_cost,
            "pg_machine_busy_pct" => &mut r.pg_machine_busy_pct,
            "alone_rps" => &mut r.alone_rps,
            "alone_p99_ms" => &mut r.alone_p99_ms,
            "alone_cost_daemon" => &mut r.alone_cost_daemon,
            "alone_cost_postgres" => &mut r.alone_cost_postgres,
            "alone_cost_rabbitmq" => &mut r.alone_cost_rabbitmq,
            "delivery_cost_daemon" => &mut r.delivery_cost_daemon,
            "delivery_cost_postgres" => &mut r.delivery_cost_postgres,
            "delivery_cost_rabbitmq" => &mut r.delivery_cost_rabbitmq,
            other => panic!("writes metric {other}"),
        }
    }

    fn replays_slot<'a>(r: &'a mut ReplaysRun, name: &str) -> &'a mut Option<Num> {
        match name {
            "cpu_cores" => &mut r.cpu_cores,
            "rss_mb" => &mut r.rss_mb,
            "rps" => &mut r.wrk.rps,
            "p50_ms" => &mut r.wrk.p50_ms,
            "p99_ms" => &mut r.wrk.p99_ms,
            "requests" => &mut r.wrk.requests,
            "errors" => &mut r.wrk.errors,
            "status_errors" => &mut r.wrk.status_errors,
            "healthz_rps" => &mut r.healthz.rps,
            "healthz_p50_ms" => &mut r.healthz.p50_ms,
            "healthz_p99_ms" => &mut r.healthz.p99_ms,
            "healthz_requests" => &mut r.healthz.requests,
            "healthz_errors" => &mut r.healthz.errors,
            "healthz_status_errors" => &mut r.healthz.status_errors,
            "pg_tps" => &mut r.pg_tps,
            "pg_latency_ms" => &mut r.pg_latency_ms,
            "rss_mb_after_all" => &mut r.rss_mb_after_all,
            "entries" => &mut r.entries,
            "log_problems" => &mut r.log.under_load,
            "shutdown_log_problems" => &mut r.log.after_sigterm,
            other => panic!("replays metric {other}"),
        }
    }

    fn storm_slot<'a>(r: &'a mut StormRun, name: &str) -> &'a mut Option<Num> {
        match name {
            "cpu_cores" => &mut r.cpu_cores,
            "rss_mb" => &mut r.rss_mb,
            "rps" => &mut r.wrk.rps,
            "p50_ms" => &mut r.wrk.p50_ms,
            "p99_ms" => &mut r.wrk.p99_ms,
            "requests" => &mut r.wrk.requests,
            "errors" => &mut r.wrk.errors,
            "status_errors" => &mut r.wrk.status_errors,
            "entries" => &mut r.entries,
            "records" => &mut r.records,
            "events" => &mut r.events,
            "count_ok" => &mut r.count_ok,
            "log_problems" => &mut r.log.under_load,
            "shutdown_log_problems" => &mut r.log.after_sigterm,
            other => panic!("storm metric {other}"),
        }
    }

    fn drain_slot<'a>(r: &'a mut DrainRun, name: &str) -> &'a mut Option<Num> {
        match name {
            "payload_bytes" => &mut r.payload_bytes,
            "cpu_cores" => &mut r.cpu_cores,
            "rss_mb" => &mut r.rss_mb,
            "seconds" => &mut r.seconds,
            "events_per_s" => &mut r.events_per_s,
            "queued" => &mut r.queued,
            "queued_ok" => &mut r.queued_ok,
            "log_problems" => &mut r.log.under_load,
            "shutdown_log_problems" => &mut r.log.after_sigterm,
            "pub_events_per_s" => &mut r.pub_events_per_s,
            "pub_queued" => &mut r.pub_queued,
            "rabbitmq_cost" => &mut r.rabbitmq_cost,
            "pub_rabbitmq_cost" => &mut r.pub_rabbitmq_cost,
            other => panic!("drain metric {other}"),
        }
    }

    fn e2e_slot<'a>(r: &'a mut E2eRun, name: &str) -> &'a mut Option<Num> {
        match name {
            "cpu_cores" => &mut r.cpu_cores,
            "rss_mb" => &mut r.rss_mb,
            "log_problems" => &mut r.log.under_load,
            "shutdown_log_problems" => &mut r.log.after_sigterm,
            other => r
                .field_mut(other)
                .unwrap_or_else(|| panic!("e2e metric {other}")),
        }
    }

    /// The lines of `file` from the first that starts with `from` up to (not including) the
    /// first after it that starts with `to`.
    fn section<'a>(file: &'a str, from: &str, to: &str) -> Vec<&'a str> {
        file.lines()
            .skip_while(|l| !l.starts_with(from))
            .skip(1)
            .take_while(|l| !l.starts_with(to))
            .collect()
    }

    fn table_lines(lines: &[&str]) -> String {
        lines
            .iter()
            .filter(|l| l.starts_with('|'))
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn number_after(file: &str, prefix: &str) -> u64 {
        let at = file.find(prefix).unwrap() + prefix.len();
        file[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap()
    }

    /// The committed BENCHMARKS.md, rebuilt from its own per-run values: the results, the
    /// resources and the checks must come out exactly as the shell version wrote them.
    #[test]
    fn the_committed_report_is_reproduced_from_its_per_run_values() {
        let file = include_str!("../BENCHMARKS.md");
        let per_run = section(file, "## Per-run values", "<!--");
        let rows: Vec<Vec<&str>> = per_run
            .iter()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| scenario"))
            .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
            .collect();
        let runs = per_run
            .iter()
            .find(|l| l.starts_with("| scenario"))
            .unwrap()
            .matches(" run ")
            .count();
        let mut report = report();
        report.settings.runs = runs as u32;
        report.settings.drain_events = number_after(file, "| outbox drain (");
        report.settings.e2e_rate = number_after(file, "| end-to-end at ") as u32;
        report.settings.quick = file.contains("**QUICK RUN");
        report.writes = vec![WritesRun::default(); runs];
        report.replays = vec![ReplaysRun::default(); runs];
        report.storm = vec![StormRun::default(); runs];
        report.drain = vec![DrainRun::default(); runs];
        report.e2e = vec![E2eRun::default(); runs];
        for row in &rows {
            let (scenario, metric) = (row[0], row[1]);
            for run in 0..runs {
                let value = Num::parse(row[2 + run]);
                match scenario {
                    "writes" => *writes_slot(&mut report.writes[run], metric) = value,
                    "replays" => *replays_slot(&mut report.replays[run], metric) = value,
                    "storm" => *storm_slot(&mut report.storm[run], metric) = value,
                    "drain" => *drain_slot(&mut report.drain[run], metric) = value,
                    "e2e" => *e2e_slot(&mut report.e2e[run], metric) = value,
                    other => panic!("scenario {other}"),
                }
            }
        }
        assert_eq!(rows.len(), 34 + 20 + 14 + 13 + 16);
        let results = table_lines(&section(file, "## Results", "###"));
        assert_eq!(results.lines().count(), 17);
        assert_eq!(report.results_table(), results);
        assert_eq!(
            report.resources_table(),
            table_lines(&section(file, "### Daemon resources", "###"))
        );
        assert_eq!(
            report.checks_table(),
            table_lines(&section(file, "### Checks", "## "))
        );
        assert_eq!(report.per_run_table(), table_lines(&per_run));
        assert!(report.settings.mode_line().len() > 10);
        assert!(file.contains(&report.settings.mode_line()));
    }

    /// The text of `file` between the first `before` and the first `after` that follows it.
    fn between<'a>(file: &'a str, before: &str, after: &str) -> &'a str {
        let start = file.find(before).unwrap() + before.len();
        let len = file[start..].find(after).unwrap();
        &file[start..start + len]
    }

    /// The committed BENCHMARKS.md as a report: its settings, machine and per-run values.
    fn committed_report(file: &str) -> Report {
        let per_run = section(file, "## Per-run values", "<!--");
        let runs = per_run
            .iter()
            .find(|l| l.starts_with("| scenario"))
            .unwrap()
            .matches(" run ")
            .count();
        let mut report = report();
        report.writes = vec![WritesRun::default(); runs];
        report.replays = vec![ReplaysRun::default(); runs];
        report.storm = vec![StormRun::default(); runs];
        report.drain = vec![DrainRun::default(); runs];
        report.e2e = vec![E2eRun::default(); runs];
        for line in per_run
            .iter()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| scenario"))
        {
            let row: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            for run in 0..runs {
                let value = Num::parse(row[2 + run]);
                match row[0] {
                    "writes" => *writes_slot(&mut report.writes[run], row[1]) = value,
                    "replays" => *replays_slot(&mut report.replays[run], row[1]) = value,
                    "storm" => *storm_slot(&mut report.storm[run], row[1]) = value,
                    "drain" => *drain_slot(&mut report.drain[run], row[1]) = value,
                    "e2e" => *e2e_slot(&mut report.e2e[run], row[1]) = value,
                    other => panic!("scenario {other}"),
                }
            }
        }
        let quick = file.contains("**QUICK RUN");
        let tools = between(file, "| tools | wrk ", " |\n");
        let (wrk, rest) = tools.split_once(", pgbench ").unwrap();
        let (pgbench, rustc) = rest.split_once(", ").unwrap();
        let (cpu_model, nproc) = between(file, "| CPU | ", " cores (nproc)")
            .rsplit_once(", ")
            .unwrap();
        let (config, daemon_settings) = between(file, "Daemon settings from `", ".\n")
            .split_once("`: ")
            .unwrap();
        report.settings = Settings {
            quick,
            runs: runs as u32,
            duration: number_after(
                file,
                if quick {
                    "(BENCH_QUICK=1): "
                } else {
                    "Full run: "
                },
            ) as u32,
            drain_events: number_after(file, "| outbox drain ("),
            e2e_seconds: number_after(file, "-event drain, ") as u32,
            e2e_rate: number_after(file, "| end-to-end at ") as u32,
            connections: number_after(file, "| unique-key writes, ") as u32,
            wrk_threads: number_after(file, "wrk -t") as u32,
            replay_keys: number_after(file, "| replays (") as u32,
            storm_keys: number_after(file, "| duplicate storm (") as u32,
            publish_window: number_after(file, "(window ") as u32,
            port: number_after(file, "RETRYSAFE_HTTP__LISTEN=127.0.0.1:") as u16,
            config: config.into(),
            pg_base: between(file, "RETRYSAFE_DATABASE__URL=", "/<db>").into(),
        };
        report.machine = Machine {
            cpu_model: cpu_model.into(),
            nproc: nproc.into(),
            mem_gib: between(file, "| memory | ", " GiB |").into(),
            kernel: between(file, "| kernel | ", " |\n").into(),
            pg_version: between(file, "| PostgreSQL | ", " (the distribution package's").into(),
            autovacuum: between(file, "autovacuum: ", ") |").into(),
            rabbit_version: between(file, "| RabbitMQ | ", " |\n").into(),
            wrk_version: wrk.into(),
            pgbench_version: pgbench.into(),
            rustc_version: rustc.into(),
            commit: between(file, "daemon at commit\n`", "`. Every").into(),
            daemon_settings: daemon_settings.into(),
        };
        report.written_at = between(file, "Written by `bench/run` on ", " (run id").into();
        report.run_id = between(file, "(run id `", "`)").into();
        report
    }

    /// The committed BENCHMARKS.md, rendered again from its own settings, machine and per-run
    /// values, is the same file to the byte: the generated part and the hand-written one.
    #[test]
    fn the_committed_file_is_rendered_again_byte_for_byte() {
        let file = include_str!("../BENCHMARKS.md");
        let report = committed_report(file);
        assert_eq!(report.writes.len(), 3);
        assert_eq!(report.render(Some(file)), file);
    }
}
