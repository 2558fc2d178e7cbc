fn main() -> std::process::ExitCode {
    match retrysafe::cli::run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("retrysafe: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
