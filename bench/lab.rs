//! PostgreSQL servers of the bench's own, for the citus scenario: one plain server, or a Citus
//! coordinator with two workers, all initialised and started alike (as the `postgres` user when
//! the bench runs as root) on free loopback ports, with the database `retrysafe` on each (for
//! Citus, with the extension and the workers added to the coordinator). Both kinds have the same
//! settings, so that the two differ by Citus alone. Stopped and removed by the clean-up
//! ([`Cleanup::stop_servers`](crate::harness::Cleanup::stop_servers)).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::harness::{free_port, Cleanup, Pg};

/// Where the machine's PostgreSQL keeps extensions' libraries.
pub const CITUS_LIBRARY: &str = "/usr/lib/postgresql/15/lib/citus.so";

/// Every server's settings: room for the daemon's pools (and a coordinator's connections to its
/// workers), and two-phase commits kept for counting (the recovery that deletes their records
/// from `pg_dist_transaction` never runs).
const SETTINGS: &str = "listen_addresses = '127.0.0.1'
max_connections = 300
shared_buffers = 256MB
max_prepared_transactions = 100
";
const CITUS: &str = "shared_preload_libraries = 'citus'
citus.recover_2pc_interval = -1
";

/// The server the daemon is given (a Citus coordinator, or the plain server), where the
/// database `retrysafe` exists, and the servers beside it (a Citus cluster's workers).
pub struct Lab {
    pub pg: Pg,
    /// Every server's data directory, the one the daemon is given first; each one's
    /// `postmaster.pid` names its process.
    data: Vec<PathBuf>,
}

impl Lab {
    /// Each server's process (its postmaster), whose tree is all that server's CPU: the one the
    /// daemon is given first.
    pub fn postmasters(&self) -> anyhow::Result<Vec<u32>> {
        self.data
            .iter()
            .map(|data| {
                let pid = std::fs::read_to_string(data.join("postmaster.pid"))?;
                let first = pid.lines().next().unwrap_or_default();
                first
                    .trim()
                    .parse()
                    .context("postmaster.pid names no process")
            })
            .collect()
    }
}

/// Starts a lab (`citus`: a coordinator and two workers; otherwise one plain server) in `work`.
pub fn start(cleanup: &Cleanup, work: &Path, citus: bool) -> anyhow::Result<Lab> {
    if citus && !Path::new(CITUS_LIBRARY).exists() {
        bail!("the citus scenario needs the Citus extension ({CITUS_LIBRARY} is missing): build a 13.x release of github.com/citusdata/citus for PostgreSQL 15");
    }
    let settings = if citus {
        format!("{SETTINGS}{CITUS}")
    } else {
        SETTINGS.to_owned()
    };
    let nodes = if citus { 3 } else { 1 };
    let mut servers = Vec::new();
    for node in 0..nodes {
        let dir = work.join(format!(
            "lab-{}-{node}",
            if citus { "citus" } else { "plain" }
        ));
        servers.push(server(cleanup, &dir, &settings)?);
    }
    for (server, _) in &servers {
        server.query("postgres", "CREATE DATABASE retrysafe")?;
        if citus {
            server.query("retrysafe", "CREATE EXTENSION citus")?;
        }
    }
    let data = servers.iter().map(|(_, data)| data.clone()).collect();
    let (coordinator, _) = servers.remove(0);
    if citus {
        let port = |pg: &Pg| pg.base.rsplit(':').next().unwrap_or_default().to_owned();
        let sql = format!(
            "SELECT citus_set_coordinator_host('127.0.0.1', {})",
            port(&coordinator)
        );
        coordinator.query("retrysafe", &sql)?;
        for (worker, _) in &servers {
            let sql = format!("SELECT citus_add_node('127.0.0.1', {})", port(worker));
            coordinator.query("retrysafe", &sql)?;
        }
    }
    Ok(Lab {
        pg: coordinator,
        data,
    })
}

/// One server in `dir`, registered with the clean-up before it starts; and its data directory.
fn server(cleanup: &Cleanup, dir: &Path, settings: &str) -> anyhow::Result<(Pg, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let data = dir.join("data");
    let data_text = data
        .to_str()
        .context("a lab directory's path is not UTF-8")?;
    as_server_user(dir, &["chown", "-R", "postgres:postgres"])?;
    run(&[
        "initdb", "-D", data_text, "-U", "postgres", "-A", "trust", "-E", "UTF8",
    ])?;
    let port = free_port()?;
    let conf = data.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf)?;
    text.push_str(&format!(
        "\nport = {port}\nunix_socket_directories = '{}'\n{settings}",
        dir.display()
    ));
    std::fs::write(&conf, text)?;
    cleanup.add_server(data.clone())?;
    let log = dir.join("postgres.log");
    let log = log
        .to_str()
        .context("a lab directory's path is not UTF-8")?;
    run(&[
        "pg_ctl", "-D", data_text, "-l", log, "-w", "-t", "60", "start",
    ])?;
    let base = format!("postgres://postgres@127.0.0.1:{port}");
    Ok((Pg { base }, data))
}

/// `chown` of `dir` to the servers' user, when the bench runs as root (a server refuses to run
/// as root); nothing otherwise.
fn as_server_user(dir: &Path, chown: &[&str]) -> anyhow::Result<()> {
    if !running_as_root() {
        return Ok(());
    }
    let status = Command::new(chown[0]).args(&chown[1..]).arg(dir).status()?;
    if !status.success() {
        bail!("cannot give {} to the postgres user", dir.display());
    }
    Ok(())
}

fn running_as_root() -> bool {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() == 0 }
}

/// Runs a PostgreSQL program, as the `postgres` user (with its own home: a Citus node's
/// connections to the others read libpq's files there) when the bench runs as root.
pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let mut command = if running_as_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).args(args);
        command.env("HOME", "/var/lib/postgresql").current_dir("/");
        command
    } else {
        let mut command = Command::new(args[0]);
        command.args(&args[1..]);
        command
    };
    let output = command
        .output()
        .with_context(|| format!("cannot run {}", args[0]))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        bail!("{} failed: {stderr}", args.join(" "));
    }
    Ok(())
}
