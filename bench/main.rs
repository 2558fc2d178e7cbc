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
//! - `scenarios`: every scenario, the soak's included, as data (steps), and the one harness
//!   that interprets them: a fresh database and exchange per stage, the daemon, the loads.
//! - `clients`: the loads and probes that run inside this program: the broker's exchanges and
//!   queues, the plain lapin publisher, the end-to-end client, the delay proxy.
//! - `harness`: PostgreSQL, the daemon as a child process, the clean-up on every exit, /proc.
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
mod report;
mod scenarios;
mod soak;
mod stats;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "bench",
    about = "retrysafe's benchmark (bench/run) and soak (scripts/soak)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The benchmark: every scenario beside its baseline; prints a table, writes BENCHMARKS.md.
    Run(scenarios::RunArgs),
    /// A steady mixed load at a held rate; per-slice figures, end checks, memory verdict.
    Soak(soak::SoakArgs),
    /// Declares a durable topic exchange and a durable queue bound to it for '#'.
    Bind(clients::Names),
    /// Deletes exchanges and queues; a missing one is not an error.
    Delete(clients::Names),
    /// A TCP proxy that adds --delay-ms to every round trip to --target, until stopped.
    DelayProxy(clients::ProxyArgs),
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
    /// with spaces. (The only test that sets variables, so none races with it.)
    #[test]
    fn environment_variables_are_flags() {
        let names = [
            "BENCH_QUICK",
            "BENCH_RUNS",
            "BENCH_SCENARIOS",
            "SOAK_VACUUM",
            "SOAK_MINUTES",
        ];
        for (name, value) in names.iter().zip(["1", "2", "writes e2e", "0", "2"]) {
            std::env::set_var(name, value);
        }
        let run = Cli::try_parse_from(["bench", "run"]).unwrap();
        let soak = Cli::try_parse_from(["bench", "soak"]).unwrap();
        let explicit = Cli::try_parse_from(["bench", "run", "--runs", "5"]).unwrap();
        for name in names {
            std::env::remove_var(name);
        }
        let Command::Run(run) = run.command else {
            panic!("not run")
        };
        assert!(run.quick);
        assert_eq!(run.runs, Some(2));
        assert_eq!(run.scenarios, "writes e2e");
        let Command::Soak(soak) = soak.command else {
            panic!("not soak")
        };
        assert!(!soak.vacuum);
        assert_eq!(soak.minutes, 2);
        let Command::Run(explicit) = explicit.command else {
            panic!("not run")
        };
        assert_eq!(explicit.runs, Some(5));
    }
}
