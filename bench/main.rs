//! retrysafe's benchmark and soak, as one program (`bench/run` and `scripts/soak` start it).
//!
//! ```text
//! bench run  [--quick] [--runs N] ...   # every BENCH_* variable of bench/run works as before
//! bench soak [--minutes N] ...          # every SOAK_* variable of scripts/soak works as before
//! ```
//!
//! `run` measures each scenario beside its baseline (see `scenarios`) and writes BENCHMARKS.md
//! (see `report`), keeping what the file has below its hand-written marker. `soak` runs a steady
//! mixed load at a held rate for minutes or hours and judges the run, memory included (see
//! `soak`). Both start the release daemon, wrk, pgbench and the helper examples `bench-e2e`
//! and `bench-publisher` as processes; the statistics, the judgement of the targets and the
//! reports are here (`stats`, `report`).

mod harness;
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
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => scenarios::run(args),
        Command::Soak(args) => soak::run(args),
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
        std::env::set_var("BENCH_QUICK", "1");
        std::env::set_var("BENCH_RUNS", "2");
        std::env::set_var("BENCH_SCENARIOS", "writes e2e");
        std::env::set_var("SOAK_VACUUM", "0");
        std::env::set_var("SOAK_MINUTES", "2");
        let run = Cli::try_parse_from(["bench", "run"]).unwrap();
        let soak = Cli::try_parse_from(["bench", "soak"]).unwrap();
        let explicit = Cli::try_parse_from(["bench", "run", "--runs", "5"]).unwrap();
        for name in [
            "BENCH_QUICK",
            "BENCH_RUNS",
            "BENCH_SCENARIOS",
            "SOAK_VACUUM",
            "SOAK_MINUTES",
        ] {
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
