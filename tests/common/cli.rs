//! The built binary's commands, run as an operator runs them.

use std::process::{Command, Output};

/// The built binary with `args`, run from the repository (so `./config.toml` is its default
/// configuration), with `env` on top.
pub fn retrysafe(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_retrysafe"));
    command
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RETRYSAFE_CONFIG")
        .env_remove("RETRYSAFE_URL")
        .env("RETRYSAFE_LOG__LEVEL", "warn");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("the binary runs")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
