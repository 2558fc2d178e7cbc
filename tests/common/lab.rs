//! `scripts/ha-lab` as a guard: started for a test, stopped (everything killed, its directory
//! removed) when the test ends, failed or not.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/ha-lab");

pub struct Lab {
    dir: PathBuf,
    env: HashMap<String, String>,
}

impl Lab {
    /// Starts `what` (`pg` or `rabbit`) in a fresh directory.
    pub fn start(what: &str) -> Self {
        Self::start_with(what, &[])
    }

    /// Starts `what` (`pg`, `rabbit`, `rabbit-one` or `rabbit-tls`) in a fresh directory, with
    /// `env` for the script (rabbit-tls takes its certificate files from it).
    pub fn start_with(what: &str, env: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!("retrysafe-ha-{}", uuid::Uuid::new_v4()));
        let mut lab = Self {
            dir,
            env: HashMap::new(),
        };
        lab.run_with(&["start", what], env);
        let text =
            std::fs::read_to_string(lab.dir.join("lab.env")).expect("the lab writes lab.env");
        lab.env = text
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect();
        lab
    }

    pub fn var(&self, name: &str) -> &str {
        self.env
            .get(name)
            .unwrap_or_else(|| panic!("lab.env has no {name}"))
    }

    /// Runs `scripts/ha-lab COMMAND DIR ARGS...`, returning its standard output.
    pub fn run(&self, args: &[&str]) -> String {
        self.run_with(args, &[])
    }

    fn run_with(&self, args: &[&str], env: &[(&str, &str)]) -> String {
        let (command, rest) = args.split_first().expect("a command");
        let output = Command::new(SCRIPT)
            .arg(command)
            .arg(&self.dir)
            .args(rest)
            .envs(env.iter().copied())
            .output()
            .expect("scripts/ha-lab runs");
        assert!(
            output.status.success(),
            "scripts/ha-lab {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// [`run`](Self::run) on a blocking thread, so that the clients on the test's runtime keep
    /// running while the lab acts.
    pub async fn act(&self, args: &[&str]) -> String {
        let lab = Self {
            dir: self.dir.clone(),
            env: HashMap::new(),
        };
        let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
        let output = actix_web::rt::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let output = lab.run(&args);
            // Only the original guard stops the lab.
            std::mem::forget(lab);
            output
        })
        .await;
        output.expect("scripts/ha-lab succeeds")
    }

    /// The pg_auto_failover node that is primary now, once there is one.
    pub async fn pg_primary(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let primary = self.act(&["pg-primary"]).await;
            if !primary.is_empty() {
                return primary;
            }
            assert!(Instant::now() < deadline, "no primary for two minutes");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let status = Command::new(SCRIPT).arg("stop").arg(&self.dir).status();
        if !matches!(status, Ok(status) if status.success()) {
            eprintln!("scripts/ha-lab stop {} failed", self.dir.display());
        }
    }
}
