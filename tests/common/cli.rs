//! The built binary's commands, run as an operator runs them.

use std::process::{Command, Output};

/// The built binary with `args`, to be run from the repository (so `./config.toml` is its
/// default configuration), logging at `warn`; the caller adds its environment.
pub fn command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_retrysafe"));
    command
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RETRYSAFE_CONFIG")
        .env_remove("RETRYSAFE_URL")
        .env("RETRYSAFE_LOG__LEVEL", "warn");
    command
}

/// [`command`] with `env` on top, run to its end.
pub fn retrysafe(args: &[&str], env: &[(&str, &str)]) -> Output {
    command(args)
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
