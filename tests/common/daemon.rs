//! The built binary as a child process, for tests that crash or signal it.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// A free port on 127.0.0.1 (free when asked; the daemon binds it right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `retrysafe serve` with the repository's config.toml, listening on `port`, polling the outbox
/// every 100 ms, logging to `log`; the caller adds its own environment.
pub fn serve_command(port: u16, log: &std::path::Path) -> Command {
    let log_file = std::fs::File::create(log).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_retrysafe"));
    command
        .arg("serve")
        .arg("--config")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml"))
        .env("RETRYSAFE_HTTP__LISTEN", format!("127.0.0.1:{port}"))
        .env("RETRYSAFE_OUTBOX__POLL_INTERVAL", "100ms")
        .env("RETRYSAFE_LOG__LEVEL", "info")
        .env_remove("FAILPOINTS")
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file);
    command
}

pub struct Daemon {
    pub child: Child,
    pub address: String,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `retrysafe serve` with the repository's config.toml and `env` overrides, and waits
    /// until it answers `/healthz`.
    pub async fn start(env: &[(&str, String)]) -> Self {
        Self::start_with(env, "http", awc::Client::default()).await
    }

    /// [`start`](Self::start) for a listener of `scheme` (`https` when `env` sets
    /// `http.tls_cert_file`), asking `/healthz` with `client` (one that trusts the certificate).
    pub async fn start_with(env: &[(&str, String)], scheme: &str, client: awc::Client) -> Self {
        let port = free_port();
        let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("daemon-{}.log", uuid::Uuid::new_v4()));
        let mut command = serve_command(port, &log);
        for (name, value) in env {
            command.env(name, value);
        }
        let child = command.spawn().expect("the daemon binary starts");
        let mut daemon = Self {
            child,
            address: format!("{scheme}://127.0.0.1:{port}"),
            log,
        };
        daemon.wait_until_healthy(&client).await;
        daemon
    }

    async fn wait_until_healthy(&mut self, client: &awc::Client) {
        for _ in 0..300 {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "the daemon exited with {status} before serving: {}",
                    self.log_text()
                );
            }
            if let Ok(response) = client.get(format!("{}/healthz", self.address)).send().await {
                if response.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the daemon never became healthy: {}", self.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to a minute for the process to exit.
    pub async fn wait_for_exit(&mut self) -> ExitStatus {
        for _ in 0..600 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the daemon did not exit: {}", self.log_text());
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("daemon log kept: {}", self.log.display());
        } else {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}
