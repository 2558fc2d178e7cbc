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
