//! retrysafe's benchmark and soak, as one program (`bench/run` and `scripts/soak` start it).
//!
//! ```text
//! bench run  [--quick] [--runs N] ...   # every BENCH_* variable of bench/run is a flag
//! bench soak [--minutes N] ...          # every SOAK_* variable of scripts/soak is a flag
//! bench bind --exchange X --queue Q     # a durable topic exchange and queue bound for '#'
//! bench delete --exchange X --queue Q   # (scripts/schemathesis uses these two)
//! bench delay-proxy --target HOST:PORT --delay-ms D [--listen 127.0.0.1:0]
//! ```
//!
//! # Layout
//!
//! - this file: the command line, every subcommand's arguments.
//! - `scenarios`: every scenario, the soak's included: the metrics of its per-run table as data,
//!   and a function that measures one run; `bench run`.
//! - `scene`: what a scenario does its steps with: a fresh database and exchange per stage, the
//!   daemon, the loads, the readings, the figures recorded.
//! - `outputs`: what wrk, pgbench and the daemon's /metrics print, read into figures.
//! - `clients`: the loads and probes that run inside this program: the broker's exchanges and
//!   queues, the plain lapin publisher, the end-to-end client, the delay proxy.
//! - `harness`: PostgreSQL, the daemon and the load programs as child processes, the clean-up
//!   on every exit, /proc, the machine the report names.
//! - `lab`: the citus scenario's own servers: a plain PostgreSQL, or a Citus coordinator and two
//!   workers.
//! - `report` (template bench/report.md): BENCHMARKS.md's tables, described as data.
//! - `soak` (template bench/soak.md): the soak's slices, memory verdict, checks and report.
//! - `stats`: figures that keep their text, medians, ratios, targets, a least-squares slope.

/// Progress on standard error: `[bench 12:34:56] message`.
macro_rules! say {
    ($($arg:tt)*) => {
        eprintln!("[bench {}] {}", chrono::Local::now().format("%T"), format_args!($($arg)*))
    };
}

mod clients;
mod harness;
mod lab;
mod outputs;
mod report;
mod scenarios;
mod scene;
mod soak;
mod stats;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::report::Settings;

/// retrysafe's benchmark (bench/run) and soak (scripts/soak)
#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The benchmark: every scenario beside its baseline; prints a table, writes BENCHMARKS.md.
    Run(RunArgs),
    /// A steady mixed load at a held rate; per-slice figures, end checks, memory verdict.
    Soak(SoakArgs),
    /// Declares a durable topic exchange and a durable queue bound to it for '#'.
    Bind(clients::Names),
    /// Deletes exchanges and queues; a missing one is not an error.
    Delete(clients::Names),
    /// A TCP proxy that adds --delay-ms to every round trip to --target, until stopped.
    DelayProxy(clients::ProxyArgs),
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Quick check: 5 s per measurement, 1 run, a 10,000-event drain; NOT reference figures.
    #[arg(long, env = "BENCH_QUICK", value_parser = clap::builder::BoolishValueParser::new())]
    pub quick: bool,
    /// Runs of every scenario (default 3; quick: 1).
    #[arg(long, env = "BENCH_RUNS")]
    pub runs: Option<u32>,
    /// Seconds per measurement (default 15; quick: 5).
    #[arg(long, env = "BENCH_DURATION")]
    pub duration: Option<u32>,
    /// Events of the drain's backlog (default 100000; quick: 10000).
    #[arg(long, env = "BENCH_DRAIN_EVENTS")]
    pub drain_events: Option<u64>,
    /// Seconds of end-to-end load (default 20; quick: 5).
    #[arg(long, env = "BENCH_E2E_SECONDS")]
    pub e2e_seconds: Option<u32>,
    /// Requests/s of the end-to-end load.
    #[arg(long, env = "BENCH_E2E_RATE", default_value_t = 1000)]
    pub e2e_rate: u32,
    /// Rows per table of the scale scenario's large database.
    #[arg(long, env = "BENCH_SCALE_ROWS", default_value_t = 5_000_000)]
    pub scale_rows: u64,
    /// Rows per table of the scale scenario's small database.
    #[arg(long, env = "BENCH_SCALE_SMALL", default_value_t = 10_000)]
    pub scale_small: u64,
    /// Expired records, and old events, that the scale scenario's janitor deletes.
    #[arg(long, env = "BENCH_SCALE_EXPIRED", default_value_t = 500_000)]
    pub scale_expired: u64,
    #[arg(long, env = "BENCH_PORT", default_value_t = 18437)]
    pub port: u16,
    /// The daemon's configuration file.
    #[arg(long, env = "BENCH_CONFIG", default_value = "config.toml")]
    pub config: String,
    /// The report; what it has after the hand-written marker is kept.
    #[arg(long, env = "BENCH_OUTPUT", default_value = "BENCHMARKS.md")]
    pub output: PathBuf,
    /// Every run's values, written with the report.
    #[arg(
        long,
        env = "BENCH_RUNS_OUTPUT",
        default_value = "docs/benchmark-runs.md"
    )]
    pub runs_output: PathBuf,
    /// Some of "writes replays storm drain e2e ordered latency scale citus" (spaces or commas); the
    /// report shows n/a for those of BENCHMARKS.md not run.
    #[arg(
        long,
        env = "BENCH_SCENARIOS",
        default_value = "writes replays storm drain e2e ordered latency"
    )]
    pub scenarios: String,
    /// SQL run on every fresh database after its migrations, e.g. "DROP INDEX
    /// entries_client_created" to measure a write without it.
    #[arg(long, env = "BENCH_SETUP_SQL")]
    pub setup_sql: Option<String>,
    /// The daemon to measure instead of the one built beside this program (e.g. an earlier
    /// build, to compare two commits in one run of each).
    #[arg(long, env = "BENCH_DAEMON")]
    pub daemon: Option<PathBuf>,
    #[arg(long, env = "BENCH_AMQP_URL", default_value = clients::AMQP)]
    pub amqp: String,
}

impl RunArgs {
    /// The settings of a run: quick mode's figures where no flag sets them.
    pub fn settings(&self) -> Settings {
        let mode = |full, quick| if self.quick { quick } else { full };
        Settings {
            quick: self.quick,
            runs: self.runs.unwrap_or(mode(3, 1)),
            duration: self.duration.unwrap_or(mode(15, 5)),
            drain_events: self.drain_events.unwrap_or(mode(100_000, 10_000).into()),
            e2e_seconds: self.e2e_seconds.unwrap_or(mode(20, 5)),
            e2e_rate: self.e2e_rate,
            scale_large: self.scale_rows,
            scale_small: self.scale_small,
            scale_expired: self.scale_expired,
            port: self.port,
            config: self.config.clone(),
            ..Settings::default()
        }
    }
}

#[derive(clap::Args, Clone, Debug)]
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
    #[arg(long, env = "SOAK_AMQP_URL", default_value = clients::AMQP)]
    pub amqp: String,
}

impl SoakArgs {
    pub fn slices(&self) -> u32 {
        self.minutes * 60 / self.slice_seconds.max(1)
    }
}

fn main() {
    let result = match Cli::parse().command {
        Command::Run(args) => scenarios::run(args),
        Command::Soak(args) => soak::run(args),
        Command::Bind(names) => harness::block_on(clients::bind(&names)),
        Command::Delete(names) => harness::block_on(clients::delete(&names)),
        Command::DelayProxy(args) => clients::proxy(args),
    };
    if let Err(error) = result {
        eprintln!("bench: {error:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shell scripts' variables still work: BENCH_QUICK=1, SOAK_VACUUM=0, BENCH_SCENARIOS
    /// with spaces; a flag wins over its variable. (The only test that sets variables, so none
    /// races with it.)
    #[test]
    fn environment_variables_are_flags() {
        let set =
            "BENCH_QUICK=1;BENCH_RUNS=2;BENCH_SCENARIOS=writes e2e;SOAK_VACUUM=0;SOAK_MINUTES=2";
        let set = set.split(';').filter_map(|pair| pair.split_once('='));
        for (name, value) in set.clone() {
            std::env::set_var(name, value);
        }
        let parse = |line: &str| Cli::try_parse_from(line.split(' ')).unwrap().command;
        let commands = ["bench run", "bench soak", "bench run --runs 5"].map(parse);
        for (name, _) in set {
            std::env::remove_var(name);
        }
        let [Command::Run(run), Command::Soak(soak), Command::Run(explicit)] = commands else {
            panic!("not run, soak, run")
        };
        let Command::Run(full) = parse("bench run") else {
            panic!("not run")
        };
        assert!(run.quick && !soak.vacuum);
        assert_eq!(
            (run.runs, explicit.runs, soak.minutes),
            (Some(2), Some(5), 2)
        );
        assert_eq!(run.scenarios, "writes e2e");
        // Full mode's figures, and quick mode's where no flag sets them.
        let figures = |s: Settings| (s.runs, s.duration, s.drain_events, s.e2e_seconds);
        assert_eq!(figures(full.settings()), (3, 15, 100_000, 20));
        assert_eq!(figures(run.settings()), (2, 5, 10_000, 5));
    }
}
