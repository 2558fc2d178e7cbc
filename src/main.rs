// jemalloc returns freed memory to the kernel where glibc's malloc kept more and more of it under
// a steady load (docs/benchmark-history.md, "Memory over time").
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    // With the `failpoints` feature, FAILPOINTS=<name>=return arms a fault-injection point.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();

    match retrysafe::cli::run() {
        Ok(code) => code,
        Err(error) => {
            eprintln!("retrysafe: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
