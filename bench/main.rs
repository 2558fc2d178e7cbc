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
