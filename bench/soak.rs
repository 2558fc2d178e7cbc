//! `bench soak`: a steady mixed load against the release daemon for minutes or hours, measured
//! in slices, with end checks and a verdict on memory.
//!
//! Each slice is one wrk run of `scripts/soak.lua` (70 % writes with fresh keys, 20 % replays,
//! 5 % conflicts, 5 % GETs). The rate is held by a fixed-rate schedule: each wrk thread sends
//! its next request at the next slot of its own schedule (`SOAK_INTERVAL_US` apart), so the time
//! the daemon takes to answer does not lower the offered rate, as a fixed pause after every
//! answer did. While a slice runs, the daemon's VmRSS is sampled every second; the memory
//! verdict is the least-squares slope of those samples after the warm-up, in MiB per hour.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use serde_json::{Map, Value};

use crate::harness::{
    self, field, log, result_line, unix_ns, Binaries, Daemon, DaemonSpec, Harness, MachineTicks,
};
use crate::stats::{least_squares, Line};

const TAG: &str = "soak";
const THREADS: u32 = 2;
/// How often the daemon's RSS is sampled while a slice runs.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Fewer samples after the warm-up than this, or spanning less time, give no memory verdict.
const MIN_SAMPLES: usize = 10;
const MIN_SPAN_S: f64 = 60.0;

#[derive(clap::Args, Debug)]
pub struct SoakArgs {
    /// Length of the load, in minutes.
    #[arg(long, env = "SOAK_MINUTES", default_value_t = 10)]
    pub minutes: u32,
    /// Seconds per slice (one wrk run, one row of the table).
    #[arg(long, env = "SOAK_SLICE_SECONDS", default_value_t = 30)]
    pub slice_seconds: u32,
    /// Offered requests per second, held by a fixed-rate schedule.
    #[arg(long, env = "SOAK_RATE", default_value_t = 1000)]
    pub rate: u32,
    /// wrk's connections (at least 2: one per wrk thread).
    #[arg(long, env = "SOAK_CONNECTIONS", default_value_t = 8)]
    pub connections: u32,
    /// The daemon's port (default: a free one).
    #[arg(long, env = "SOAK_PORT")]
    pub port: Option<u16>,
    #[arg(long, env = "SOAK_CONFIG", default_value = "config.toml")]
    pub config: String,
    /// VACUUM the daemon's tables after every slice (standing in for autovacuum where it is off).
    #[arg(long, env = "SOAK_VACUUM", value_parser = clap::builder::BoolishValueParser::new())]
    pub vacuum: bool,
    /// Minutes at the start whose RSS samples the memory verdict leaves out (the replay cache
    /// fills then). Default: the first half of the run.
    #[arg(long, env = "SOAK_WARMUP_MINUTES")]
    pub warmup_minutes: Option<f64>,
    /// The RSS slope after the warm-up, in MiB per hour, above which the memory check fails.
    #[arg(long, env = "SOAK_RSS_SLOPE_LIMIT", default_value_t = 1.0)]
    pub rss_slope_limit: f64,
    /// The daemon to soak (default: the release build beside this program), e.g. one built
    /// with another allocator, to run two soaks side by side.
    #[arg(long, env = "SOAK_DAEMON")]
    pub daemon: Option<PathBuf>,
    #[arg(
        long,
        env = "SOAK_AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp: String,
}

/// One slice's figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SliceRow {
    pub slice: u32,
    /// Seconds since the load started, at the slice's end.
    pub end_s: u64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// 201 created + 201 replayed + 200.
    pub ok: u64,
    /// 409 idempotency-key-reused (expected).
    pub reused: u64,
    pub conflicts_sent: u64,
    /// Any other non-2xx: 409 request-in-progress, 503, others.
    pub unexpected: u64,
    /// connect + read + write + timeout.
    pub socket_errors: u64,
    pub rss_mib: f64,
    pub daemon_cores: f64,
    pub machine_pct: f64,
    pub unsent: u64,
    pub fds: u64,
    pub created: u64,
    pub requests: u64,
}

/// A slice's columns: name, figure, decimals. In the slice table "conflicts sent" stands in
/// brackets after "409 reused".
type Column = (&'static str, fn(&SliceRow) -> f64, usize);
#[rustfmt::skip]
const COLUMNS: [Column; 14] = [
    ("req/s", |r| r.rps, 0),
    ("p50 ms", |r| r.p50_ms, 2),
    ("p99 ms", |r| r.p99_ms, 2),
    ("max ms", |r| r.max_ms, 1),
    ("2xx", |r| r.ok as f64, 0),
    ("409 reused", |r| r.reused as f64, 0),
    ("conflicts sent", |r| r.conflicts_sent as f64, 0),
    ("unexpected", |r| r.unexpected as f64, 0),
    ("socket errors", |r| r.socket_errors as f64, 0),
    ("RSS MiB", |r| r.rss_mib, 1),
    ("daemon CPU (cores)", |r| r.daemon_cores, 2),
    ("machine CPU %", |r| r.machine_pct, 0),
    ("unsent events", |r| r.unsent as f64, 0),
    ("fds", |r| r.fds as f64, 0),
];

/// `m:ss`
pub fn clock(seconds: u64) -> String {
    format!("{}:{:02}", seconds / 60, seconds % 60)
}

/// A figure rounded as the table shows it, printed without trailing zeros (as %g would).
fn short(value: f64, decimals: usize) -> String {
    let scale = 10f64.powi(decimals as i32);
    format!("{}", (value * scale).round() / scale)
}

/// A row of the slice table: the slice, its end, then each column's figure.
fn table_row(first: String, second: String, figure: impl Fn(&Column) -> String) -> String {
    let mut cells = vec![first, second];
    for column in &COLUMNS {
        match column.0 {
            "conflicts sent" => {
                let reused = cells.pop().unwrap_or_default();
                cells.push(format!("{reused} ({})", figure(column)));
            }
            _ => cells.push(figure(column)),
        }
    }
    format!("| {} |", cells.join(" | "))
}

pub fn slice_table(rows: &[SliceRow]) -> String {
    let mut out = table_row("slice".into(), "end".into(), |column| column.0.to_owned());
    out.push_str(&format!("\n|{}", "---:|".repeat(COLUMNS.len() + 1)));
    for row in rows {
        let figure = |(_, value, decimals): &Column| format!("{:.*}", *decimals, value(row));
        out.push('\n');
        out.push_str(&table_row(row.slice.to_string(), clock(row.end_s), figure));
    }
    out
}

/// min, max, first and last slice of every column.
pub fn summary_table(rows: &[SliceRow]) -> String {
    let mut out = String::from(
        "| column | min | max | first slice | last slice |\n|---|---:|---:|---:|---:|",
    );
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return out;
    };
    for (name, value, decimals) in COLUMNS {
        let shown: Vec<f64> = rows
            .iter()
            .map(|row| short(value(row), decimals).parse().unwrap_or(0.0))
            .collect();
        let lo = shown.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = shown.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let [first, last] = [first, last].map(|row| short(value(row), decimals));
        let _ = write!(out, "\n| {name} | {lo} | {hi} | {first} | {last} |");
    }
    out
}

/// What the RSS samples after the warm-up say.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MemoryVerdict {
    /// Slope within the limit.
    Flat,
    /// Slope above the limit.
    Growing,
    /// Too few samples, or too short a span, after the warm-up.
    Inconclusive,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Memory {
    pub warmup_s: f64,
    pub limit_mib_per_h: f64,
    /// Samples after the warm-up, and the time they span.
    pub samples: usize,
    pub span_s: f64,
    pub line: Option<Line>,
    pub verdict: MemoryVerdict,
}

impl Memory {
    /// The fit of `samples` (seconds since the load started, RSS in MiB) after `warmup_s`.
    pub fn judge(samples: &[(f64, f64)], warmup_s: f64, limit_mib_per_h: f64) -> Memory {
        let after: Vec<(f64, f64)> = samples
            .iter()
            .copied()
            .filter(|(t, _)| *t >= warmup_s)
            .collect();
        let span_s = match (after.first(), after.last()) {
            (Some(a), Some(b)) => b.0 - a.0,
            _ => 0.0,
        };
        let line = least_squares(&after);
        let verdict = match line {
            Some(line) if after.len() >= MIN_SAMPLES && span_s >= MIN_SPAN_S => {
                if line.slope * 3600.0 <= limit_mib_per_h {
                    MemoryVerdict::Flat
                } else {
                    MemoryVerdict::Growing
                }
            }
            _ => MemoryVerdict::Inconclusive,
        };
        Memory {
            warmup_s,
            limit_mib_per_h,
            samples: after.len(),
            span_s,
            line,
            verdict,
        }
    }

    /// The end check of the verdict.
    pub fn check(&self) -> Check {
        let after = format!(
            "{} samples after {:.1} min",
            self.samples,
            self.warmup_s / 60.0
        );
        Check {
            name: format!(
                "RSS slope after the warm-up ≤ {} MiB/h",
                self.limit_mib_per_h
            ),
            passed: self.passed(),
            detail: match self.slope_mib_per_h() {
                Some(slope) if self.verdict != MemoryVerdict::Inconclusive => {
                    format!("{slope:+.2} MiB/h over {after}")
                }
                _ => format!("no verdict: {after}"),
            },
        }
    }

    pub fn slope_mib_per_h(&self) -> Option<f64> {
        self.line.map(|line| line.slope * 3600.0)
    }

    /// A check row's outcome: `Some(true)` ok, `Some(false)` failed, `None` no verdict.
    pub fn passed(&self) -> Option<bool> {
        match self.verdict {
            MemoryVerdict::Flat => Some(true),
            MemoryVerdict::Growing => Some(false),
            MemoryVerdict::Inconclusive => None,
        }
    }

    pub fn sentence(&self) -> String {
        let warmup = format!("{:.1} min", self.warmup_s / 60.0);
        match (self.line, self.verdict) {
            (Some(line), verdict) if verdict != MemoryVerdict::Inconclusive => format!(
                "RSS slope {:+.2} MiB/h by least squares over {} samples after the {warmup} warm-up ({} of load; fit {:.1} MiB at the warm-up's end, residual RMS {:.2} MiB); limit {} MiB/h: {}",
                line.slope * 3600.0,
                self.samples,
                clock(self.span_s.round() as u64),
                line.intercept + line.slope * self.warmup_s,
                line.residual_rms,
                self.limit_mib_per_h,
                if verdict == MemoryVerdict::Flat {
                    "flat"
                } else {
                    "GROWING"
                }
            ),
            (line, _) => format!(
                "no verdict: {} samples spanning {:.0} s after the {warmup} warm-up (at least {MIN_SAMPLES} over {MIN_SPAN_S:.0} s needed){}",
                self.samples,
                self.span_s,
                line.map(|l| format!("; slope so far {:+.2} MiB/h", l.slope * 3600.0))
                    .unwrap_or_default()
            ),
        }
    }
}

/// An end check.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    pub name: String,
    /// `None`: no verdict (does not fail the run).
    pub passed: Option<bool>,
    pub detail: String,
}

impl Check {
    fn new(name: &str, passed: bool, detail: String) -> Check {
        let (name, passed) = (name.to_owned(), Some(passed));
        Check {
            name,
            passed,
            detail,
        }
    }
}

pub fn check_table(checks: &[Check]) -> String {
    let mut out = String::from("| check | result | detail |\n|---|---|---|");
    for check in checks {
        let result = match check.passed {
            Some(true) => "ok",
            Some(false) => "FAILED",
            None => "n/a",
        };
        let _ = write!(
            out,
            "\n| {} | {result} | {} |",
            check.name,
            check.detail.replace('|', "/")
        );
    }
    out
}

/// The daemon's path, with the glibc malloc setting it inherits when one is set.
fn describe_daemon(binary: &Path) -> String {
    match std::env::var("MALLOC_ARENA_MAX") {
        Ok(arenas) => format!("{}, MALLOC_ARENA_MAX={arenas}", binary.display()),
        Err(_) => binary.display().to_string(),
    }
}

/// Everything the soak report says.
pub struct SoakReport {
    pub id: String,
    pub written_at: String,
    pub commit: String,
    /// The daemon's binary, and the allocator settings in its environment if any.
    pub daemon: String,
    pub config: String,
    pub slices: u32,
    pub slice_seconds: u32,
    pub rate: u32,
    pub connections: u32,
    pub machine: String,
    pub rows: Vec<SliceRow>,
    pub hwm_mib: String,
    pub memory: Memory,
    pub checks: Vec<Check>,
}

impl SoakReport {
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.passed == Some(false))
    }

    pub fn render(&self) -> String {
        let requests: u64 = self.rows.iter().map(|r| r.requests).sum();
        let created: u64 = self.rows.iter().map(|r| r.created).sum();
        let interval_ms = f64::from(THREADS) * 1000.0 / f64::from(self.rate.max(1));
        format!(
            "# Soak run {id}

`scripts/soak` on {at}, daemon at commit `{commit}` (`{daemon}`,
`{config}`, log level warn): {slices} slices of {slice} s, offered {rate} requests/s over
{conn} connections (wrk -t{threads} -c{conn}) on a fixed-rate schedule (each wrk thread sends a
request every {interval:.2} ms of its own schedule; a late answer makes the next ones go at once
until it has caught up), mix 70 % new keys, 20 % replays, 5 % conflicts, 5 % GETs
(scripts/soak.lua).

Machine: {machine}. Daemon, PostgreSQL, RabbitMQ and wrk share the cores.

Per slice: wrk's figures (latency from the request's first byte sent to the answer), 2xx
answers, 409 `idempotency-key-reused` (expected) beside the conflicts sent, unexpected answers
(other non-2xx), wrk socket errors (connect, read, write, timeout); then, after the slice, the
daemon's VmRSS, its CPU over the slice (utime + stime / wall time; 1.00 = one core), the whole
machine's CPU busy share (/proc/stat), unsent outbox events, and the daemon's open file
descriptors.

{table}

Total: {requests} requests, {created} fresh 201s, daemon peak RSS (VmHWM) {hwm} MiB.

Memory: VmRSS sampled every second while the load ran; {memory}.

{summary}

{checks}
",
            id = self.id,
            at = self.written_at,
            commit = self.commit,
            daemon = self.daemon,
            config = self.config,
            slices = self.slices,
            slice = self.slice_seconds,
            rate = self.rate,
            conn = self.connections,
            threads = THREADS,
            interval = interval_ms,
            machine = self.machine,
            table = slice_table(&self.rows),
            hwm = self.hwm_mib,
            memory = self.memory.sentence(),
            summary = summary_table(&self.rows),
            checks = check_table(&self.checks),
        )
    }
}

/// A figure of wrk's `SOAK_RESULT` (0 without it).
fn num(map: &Map<String, Value>, key: &str) -> f64 {
    field(map, key).map_or(0.0, |n| n.value)
}

/// The sum of the counts `keys` of wrk's `SOAK_RESULT`.
fn count(map: &Map<String, Value>, keys: &[&str]) -> u64 {
    keys.iter().map(|key| num(map, key).max(0.0) as u64).sum()
}

/// A soak's load: each slice's row, the RSS samples, the unexpected answers.
type Load = (Vec<SliceRow>, Vec<(f64, f64)>, Vec<String>);

struct Soak {
    args: SoakArgs,
    /// What the run stands on: binaries, PostgreSQL, the broker helpers, the clean-up.
    h: Harness,
    output: PathBuf,
    id: String,
    db: String,
    exchange: String,
    queue: String,
    port: u16,
}

pub fn run(args: SoakArgs) -> anyhow::Result<()> {
    let slices = args.minutes * 60 / args.slice_seconds.max(1);
    if slices < 1 {
        bail!("SOAK_MINUTES * 60 must be at least SOAK_SLICE_SECONDS");
    }
    if args.connections < THREADS {
        bail!("SOAK_CONNECTIONS must be at least {THREADS}");
    }
    if args.rate == 0 {
        bail!("SOAK_RATE must be positive");
    }
    if !Path::new(&args.config).is_file() {
        bail!("no {}", args.config);
    }
    if !harness::have("wrk") {
        harness::apt_install(TAG, &["wrk"])?;
    }
    let mut bin = Binaries::beside_this_program()?;
    if let Some(daemon) = &args.daemon {
        if !daemon.is_file() {
            bail!("SOAK_DAEMON: no file {}", daemon.display());
        }
        bin.daemon = daemon.clone();
    }
    let id = crate::scenarios::run_id();
    let stamp = chrono::Utc::now().format("%Y%m%d-%H%M%S").to_string();
    let work = PathBuf::from(format!("bench/results/soak-{stamp}"));
    let db = format!("retrysafe_soak_{id}");
    let h = Harness::new(TAG, bin, &args.amqp, work, db.clone())?;
    let port = match args.port {
        Some(port) => port,
        None => harness::free_port()?,
    };
    let exchange = format!("retrysafe.soak.{id}");
    let soak = Soak {
        output: PathBuf::from(format!("bench/results/soak-{stamp}.md")),
        queue: format!("{exchange}.q"),
        exchange,
        db,
        id,
        port,
        args,
        h,
    };
    if !soak.h.finish(soak.run(slices))? {
        bail!("a check failed");
    }
    Ok(())
}

impl Soak {
    /// Microseconds between a wrk thread's requests, for the offered rate.
    fn interval_us(&self) -> u64 {
        u64::from(THREADS) * 1_000_000 / u64::from(self.args.rate)
    }

    /// Runs the soak; whether every check passed.
    fn run(&self, slices: u32) -> anyhow::Result<bool> {
        let (a, pg) = (&self.args, &self.h.pg);
        self.h
            .broker
            .bind(&self.h.cleanup, &self.exchange, &self.queue)
            .context("binding the soak's queue")?;
        let spec = DaemonSpec {
            config: &a.config,
            port: self.port,
            db_url: pg.url(&self.db),
            amqp: &a.amqp,
            exchange: &self.exchange,
            log: self.h.work.join("daemon.log"),
        };
        let mut daemon = self.h.start(spec, true)?;
        let autovacuum = pg.query("postgres", "SHOW autovacuum");
        let autovacuum = autovacuum.unwrap_or_else(|_| "unknown".into());
        if autovacuum != "on" && !a.vacuum {
            log(TAG, "note: autovacuum is off on this server: the outbox's dead rows (one per delivered event) pile up; SOAK_VACUUM=1 vacuums between slices");
        }
        log(
            TAG,
            &format!(
                "soak {}: {slices} slices of {}s, {} requests/s offered over {} connections on a fixed-rate schedule ({} µs per wrk thread), daemon {} pid {} on 127.0.0.1:{}",
                self.id, a.slice_seconds, a.rate, a.connections, self.interval_us(), describe_daemon(&self.h.bin.daemon), daemon.pid, self.port
            ),
        );
        let (rows, samples, unexpected_lines) = self.load(&mut daemon, slices)?;
        let (mut checks, hwm_mib) =
            self.end_checks(&mut daemon, &rows, slices, &unexpected_lines)?;
        let load_s = f64::from(slices * a.slice_seconds);
        let warmup_s = a.warmup_minutes.map_or(load_s / 2.0, |m| m * 60.0);
        let memory = Memory::judge(&samples, warmup_s, a.rss_slope_limit);
        checks.push(memory.check());
        let report = SoakReport {
            id: self.id.clone(),
            written_at: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            commit: harness::commit(),
            daemon: describe_daemon(&self.h.bin.daemon),
            config: a.config.clone(),
            slices,
            slice_seconds: a.slice_seconds,
            rate: a.rate,
            connections: a.connections,
            machine: self.machine(&autovacuum),
            rows,
            hwm_mib,
            memory,
            checks,
        };
        fs::write(&self.output, report.render())?;
        println!(
            "\n{}\n\nMemory: {}.\n\n{}\n\n{}\n",
            slice_table(&report.rows),
            report.memory.sentence(),
            summary_table(&report.rows),
            check_table(&report.checks)
        );
        let (output, work) = (self.output.display(), self.h.work.display());
        log(TAG, &format!("wrote {output}; raw output in {work}"));
        Ok(!report.failed())
    }

    /// The load, slice after slice: each slice's row, the daemon's VmRSS samples (seconds since
    /// the load started, MiB; also written to rss.tsv) and the unexpected answers wrk noted
    /// (also in unexpected.txt).
    fn load(&self, daemon: &mut Daemon, slices: u32) -> anyhow::Result<Load> {
        let (a, work) = (&self.args, &self.h.work);
        fs::write(work.join("keys.txt"), "")?;
        let mut rows: Vec<SliceRow> = Vec::new();
        let mut samples: Vec<(f64, f64)> = Vec::new();
        let mut unexpected_lines = Vec::new();
        let started = Instant::now();
        for slice in 1..=slices {
            let (row, text) = self.slice(daemon, slice, started, &mut samples)?;
            if a.vacuum {
                let vacuum = "VACUUM outbox_events, idempotency_records, entries";
                self.h.pg.query(&self.db, vacuum)?;
            }
            let unexpected = text
                .lines()
                .filter_map(|l| l.strip_prefix("SOAK_UNEXPECTED "));
            unexpected_lines.extend(unexpected.map(|line| format!("slice {slice}: {line}")));
            eprintln!(
                "[soak] slice {} ({}): {:.0} req/s (offered {}), p50 {:.2} ms, p99 {:.2} ms, 2xx {}, 409 {}, unexpected {}, socket errors {}, RSS {:.1} MiB, CPU {:.2}, machine {:.0}%, backlog {}",
                row.slice, clock(row.end_s), row.rps, a.rate, row.p50_ms, row.p99_ms, row.ok,
                row.reused, row.unexpected, row.socket_errors, row.rss_mib, row.daemon_cores,
                row.machine_pct, row.unsent
            );
            rows.push(row);
        }
        let rss = samples.iter().map(|(t, mib)| format!("{t:.1}\t{mib:.2}\n"));
        fs::write(work.join("rss.tsv"), rss.collect::<String>())?;
        if !unexpected_lines.is_empty() {
            let text = unexpected_lines.join("\n") + "\n";
            fs::write(work.join("unexpected.txt"), text)?;
        }
        Ok((rows, samples, unexpected_lines))
    }

    /// The machine and the servers, as the report names them.
    fn machine(&self, autovacuum: &str) -> String {
        let (cpu, mem) = harness::cpu_and_memory();
        let nproc = harness::command_line("nproc", &[]);
        let kernel = harness::command_line("uname", &["-sr"]);
        let pg = self.h.pg.query("postgres", "SHOW server_version");
        let pg = pg.unwrap_or_default();
        let vacuum = if self.args.vacuum {
            "; SOAK_VACUUM=1: `VACUUM` of the three tables after every slice"
        } else {
            ""
        };
        let rabbit = harness::rabbit_package_version();
        let wrk = harness::wrk_version();
        format!("{cpu}, {nproc} cores, {mem} GiB, {kernel}; PostgreSQL {pg} (autovacuum {autovacuum}{vacuum}), RabbitMQ {rabbit}, wrk {wrk}")
    }

    /// One slice: wrk at the held rate while the daemon's VmRSS is sampled every second (into
    /// `samples`, seconds since `started`); its row, and what wrk printed.
    fn slice(
        &self,
        daemon: &mut Daemon,
        slice: u32,
        started: Instant,
        samples: &mut Vec<(f64, f64)>,
    ) -> anyhow::Result<(SliceRow, String)> {
        let a = &self.args;
        let out = self.h.work.join(format!("slice-{slice}.txt"));
        let (t0, n0, m0) = (daemon.cpu_ticks()?, unix_ns(), MachineTicks::now()?);
        let file = fs::File::create(&out)?;
        let url = format!("http://127.0.0.1:{}/", self.port);
        let script = "scripts/soak.lua";
        let mut wrk = harness::wrk(THREADS, a.connections, a.slice_seconds, script, &url)
            .env("SOAK_NONCE", &self.id)
            .env("SOAK_SLICE", slice.to_string())
            .env("SOAK_STATE", self.h.work.join("keys.txt"))
            .env("SOAK_INTERVAL_US", self.interval_us().to_string())
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("starting wrk")?;
        let mut next_sample = Instant::now();
        let status = loop {
            if let Some(status) = wrk.try_wait()? {
                break status;
            }
            if Instant::now() >= next_sample {
                if let Ok(kb) = daemon.status_kb("VmRSS") {
                    samples.push((started.elapsed().as_secs_f64(), kb as f64 / 1024.0));
                }
                next_sample += SAMPLE_EVERY;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let (t1, n1, m1) = (daemon.cpu_ticks()?, unix_ns(), MachineTicks::now()?);
        let text = fs::read_to_string(&out).unwrap_or_default();
        if !status.success() {
            bail!("wrk failed ({status}); see {}", out.display());
        }
        let result = result_line(&text, "SOAK_RESULT")
            .with_context(|| format!("wrk printed no result; see {}", out.display()))?;
        if !daemon.alive() {
            let log = daemon.log.display();
            bail!("the daemon died during slice {slice}; see {log}");
        }
        let rss_kb = daemon.status_kb("VmRSS")?;
        let unsent = self.h.pg.count(
            &self.db,
            "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL AND failed_at IS NULL",
        )?;
        let wall_s = (n1 - n0) as f64 / 1e9;
        // The machine's busy share, steal counted as busy.
        let machine = m1.since(m0);
        let busy = (machine.work + machine.steal) as f64;
        let row = SliceRow {
            slice,
            end_s: started.elapsed().as_secs(),
            rps: num(&result, "rps"),
            p50_ms: num(&result, "p50_ms"),
            p99_ms: num(&result, "p99_ms"),
            max_ms: num(&result, "max_ms"),
            ok: count(&result, &["got_created", "got_replayed", "got_200"]),
            reused: count(&result, &["got_reused"]),
            conflicts_sent: count(&result, &["sent_conflict"]),
            unexpected: count(&result, &["got_other", "got_503", "got_in_progress"]),
            socket_errors: count(
                &result,
                &[
                    "errors_connect",
                    "errors_read",
                    "errors_write",
                    "errors_timeout",
                ],
            ),
            rss_mib: rss_kb as f64 / 1024.0,
            daemon_cores: (t1 - t0) as f64 / harness::clock_ticks() / wall_s,
            machine_pct: 100.0 * busy / machine.total.max(1) as f64,
            unsent: unsent.max(0) as u64,
            fds: daemon.open_fds() as u64,
            created: count(&result, &["got_created"]),
            requests: count(&result, &["requests"]),
        };
        Ok((row, text))
    }

    /// The checks after the load, the daemon's stop included; and its peak RSS.
    fn end_checks(
        &self,
        daemon: &mut Daemon,
        rows: &[SliceRow],
        slices: u32,
        unexpected_lines: &[String],
    ) -> anyhow::Result<(Vec<Check>, String)> {
        let mut checks = Vec::new();
        let entries = self.store_checks(&mut checks)?;
        // The first 160 characters of a line.
        let cut = |line: &str| line.chars().take(160).collect::<String>();
        let created: u64 = rows.iter().map(|r| r.created).sum();
        let unexpected: u64 = rows.iter().map(|r| r.unexpected).sum();
        let sockets: u64 = rows.iter().map(|r| r.socket_errors).sum();
        // Every 201 that said "created" is a row; the rows may exceed them by the requests wrk
        // abandoned in flight at the end of each slice (at most one per connection per slice).
        let extra = entries - created as i64;
        checks.push(Check::new(
            "rows = fresh 201s (+ requests in flight at slice ends)",
            extra >= 0 && extra <= i64::from(self.args.connections * slices),
            format!("{entries} entries, {created} fresh 201s"),
        ));
        let example = unexpected_lines.first().map(|line| cut(line));
        let detail = example.map_or(unexpected.to_string(), |e| {
            format!("{unexpected}; e.g. {e}")
        });
        checks.push(Check::new("no unexpected answer", unexpected == 0, detail));
        checks.push(Check::new(
            "no socket error",
            sockets == 0,
            sockets.to_string(),
        ));
        let (problems, _) = daemon.log_problems();
        let first = daemon.first_problem().filter(|_| problems > 0);
        checks.push(Check::new(
            "no WARN or ERROR in the daemon's log under load",
            problems == 0,
            first.map_or(problems.to_string(), |line| {
                format!("{problems}; first: {}", cut(&line))
            }),
        ));
        let hwm = daemon.status_kb("VmHWM");
        let hwm = hwm.map_or_else(|_| "?".into(), |kb| format!("{:.1}", kb as f64 / 1024.0));
        let (status, took) = daemon.stop(TAG)?;
        let (_, after) = daemon.log_problems();
        let code = status.code().map_or("by signal".into(), |c| c.to_string());
        let millis = took.as_millis();
        checks.push(Check::new(
            "clean exit on SIGTERM",
            status.success() && after == 0,
            format!("exit {code} after {millis} ms, {after} WARN/ERROR lines"),
        ));
        Ok((checks, hwm))
    }

    /// The checks of what the load left in the database and the bound queue, once the outbox
    /// is drained (or a minute has passed); the entries.
    fn store_checks(&self, checks: &mut Vec<Check>) -> anyhow::Result<i64> {
        let count = |sql: &str| self.h.pg.count(&self.db, sql);
        let mut unsent = -1;
        for _ in 0..600 {
            unsent = count("SELECT count(*) FROM outbox_events WHERE sent_at IS NULL")?;
            if unsent == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let drained = "outbox drained within 60 s of the load";
        checks.push(Check::new(drained, unsent == 0, format!("{unsent} unsent")));
        let records = count("SELECT count(*) FROM idempotency_records")?;
        let entries = count("SELECT count(*) FROM entries")?;
        let events = count("SELECT count(*) FROM outbox_events")?;
        let parked = count("SELECT count(*) FROM outbox_events WHERE failed_at IS NOT NULL")?;
        let not_201 =
            count("SELECT count(*) FROM idempotency_records WHERE response_status <> 201")?;
        let orphans = count(
            "SELECT (SELECT count(*) FROM idempotency_records r WHERE NOT EXISTS (SELECT 1 FROM entries e WHERE e.id = r.entry_id))
                + (SELECT count(*) FROM entries e WHERE NOT EXISTS (SELECT 1 FROM outbox_events o WHERE o.event_key = e.id || '/entry.created'))",
        )?;
        checks.push(Check::new(
            "one record, one entry, one event per key",
            records == entries && entries == events && orphans == 0,
            format!("{records} records, {entries} entries, {events} events, {orphans} without their entry or event"),
        ));
        let other = format!("{not_201} other");
        checks.push(Check::new("every record is a 201", not_201 == 0, other));
        let parked_detail = format!("{parked} parked");
        checks.push(Check::new("no event parked", parked == 0, parked_detail));
        let queued = self.h.broker.count(&self.queue, events, 60)?;
        let all_queued = queued.as_ref().is_some_and(|q| q.value as i64 >= events);
        let queued = queued.map_or("?".into(), |n| n.text);
        checks.push(Check::new(
            "every event reached the bound queue",
            all_queued,
            format!(
                "{queued} messages for {events} events (more: redeliveries after a lost confirm)"
            ),
        ));
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(slice: u32, rss: f64) -> SliceRow {
        SliceRow {
            slice,
            end_s: u64::from(slice) * 30,
            rps: 999.6,
            p50_ms: 1.333,
            p99_ms: 5.24,
            max_ms: 31.04,
            ok: 23842,
            reused: 1258,
            conflicts_sent: 1258,
            unexpected: 0,
            socket_errors: 0,
            rss_mib: rss,
            daemon_cores: 0.371,
            machine_pct: 63.4,
            unsent: 0,
            fds: 34,
            created: 20000,
            requests: 30000,
        }
    }

    #[test]
    fn slice_rows_render_as_before() {
        assert_eq!(clock(0), "0:00");
        assert_eq!(clock(605), "10:05");
        let table = slice_table(&[row(1, 33.44), row(2, 40.0)]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[..3],
            [
                "| slice | end | req/s | p50 ms | p99 ms | max ms | 2xx | 409 reused (conflicts sent) | unexpected | socket errors | RSS MiB | daemon CPU (cores) | machine CPU % | unsent events | fds |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                "| 1 | 0:30 | 1000 | 1.33 | 5.24 | 31.0 | 23842 | 1258 (1258) | 0 | 0 | 33.4 | 0.37 | 63 | 0 | 34 |"
            ]
        );
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn summary_has_min_max_first_last() {
        let summary = summary_table(&[row(1, 33.4), row(2, 97.0), row(3, 90.0)]);
        assert!(
            summary.contains("| RSS MiB | 33.4 | 97 | 33.4 | 90 |"),
            "{summary}"
        );
        assert!(
            summary.contains("| req/s | 1000 | 1000 | 1000 | 1000 |"),
            "{summary}"
        );
        assert!(
            summary.contains("| p50 ms | 1.33 | 1.33 | 1.33 | 1.33 |"),
            "{summary}"
        );
        assert_eq!(summary.lines().count(), 2 + 14);
    }

    /// One sample a second for `seconds`, growing at `mib_per_h` with a small wobble.
    fn samples(seconds: u32, base: f64, mib_per_h: f64) -> Vec<(f64, f64)> {
        (0..seconds)
            .map(|s| {
                let t = f64::from(s);
                let wobble = if s % 2 == 0 { 0.3 } else { -0.3 };
                (t, base + mib_per_h * t / 3600.0 + wobble)
            })
            .collect()
    }

    #[test]
    fn memory_flat_after_the_warm_up() {
        // Steep growth during the warm-up (the cache fills), flat after it.
        let mut points: Vec<(f64, f64)> = (0..300)
            .map(|s| (f64::from(s), 30.0 + f64::from(s) * 0.2))
            .collect();
        points.extend(
            samples(600, 90.0, 0.0)
                .into_iter()
                .map(|(t, v)| (t + 300.0, v)),
        );
        let memory = Memory::judge(&points, 300.0, 10.0);
        assert_eq!(memory.verdict, MemoryVerdict::Flat);
        assert_eq!(memory.samples, 600);
        assert!(memory.slope_mib_per_h().unwrap().abs() < 1.0);
        assert_eq!(memory.passed(), Some(true));
        assert!(memory.sentence().contains("flat"), "{}", memory.sentence());
        // Over the whole run, the warm-up would dominate.
        assert_eq!(
            Memory::judge(&points, 0.0, 10.0).verdict,
            MemoryVerdict::Growing
        );
    }

    #[test]
    fn memory_growing() {
        let memory = Memory::judge(&samples(1200, 90.0, 36.0), 600.0, 10.0);
        assert_eq!(memory.verdict, MemoryVerdict::Growing);
        let slope = memory.slope_mib_per_h().unwrap();
        assert!((slope - 36.0).abs() < 2.0, "{slope}");
        assert_eq!(memory.passed(), Some(false));
        assert!(memory.sentence().contains("GROWING"));
    }

    #[test]
    fn memory_needs_enough_samples() {
        let memory = Memory::judge(&samples(100, 90.0, 0.0), 60.0, 10.0);
        assert_eq!(memory.verdict, MemoryVerdict::Inconclusive);
        assert_eq!(memory.passed(), None);
        assert!(memory.sentence().starts_with("no verdict"));
        assert_eq!(
            Memory::judge(&[], 0.0, 10.0).verdict,
            MemoryVerdict::Inconclusive
        );
    }

    #[test]
    fn report_and_checks() {
        let checks = vec![
            Check {
                name: "no socket error".into(),
                passed: Some(true),
                detail: "0".into(),
            },
            Check {
                name: "RSS slope".into(),
                passed: None,
                detail: "a | b".into(),
            },
        ];
        let table = check_table(&checks);
        assert!(table.contains("| no socket error | ok | 0 |"));
        assert!(table.contains("| RSS slope | n/a | a / b |"));
        let mut report = SoakReport {
            id: "12021307abcd".into(),
            written_at: "2026-12-02 13:17 UTC".into(),
            commit: "2e7982c".into(),
            daemon: "target/release/retrysafe".into(),
            config: "config.toml".into(),
            slices: 2,
            slice_seconds: 30,
            rate: 1000,
            connections: 8,
            machine: "AMD EPYC, 2 cores".into(),
            rows: vec![row(1, 33.4), row(2, 40.0)],
            hwm_mib: "41.0".into(),
            memory: Memory::judge(&samples(60, 40.0, 0.0), 30.0, 10.0),
            checks,
        };
        assert!(!report.failed());
        let text = report.render();
        assert!(text.starts_with("# Soak run 12021307abcd\n"));
        assert!(text.contains("every 2.00 ms of its own schedule"));
        assert!(text.contains(
            "Total: 60000 requests, 40000 fresh 201s, daemon peak RSS (VmHWM) 41.0 MiB."
        ));
        assert!(text.contains("Memory: VmRSS sampled every second while the load ran; no verdict"));
        report.checks[0].passed = Some(false);
        assert!(report.failed());
    }
}
