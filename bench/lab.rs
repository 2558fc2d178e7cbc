//! PostgreSQL servers of the bench's own, for the citus scenario: one plain server, or a Citus
//! coordinator with two workers, all initialised and started alike (as the `postgres` user when
//! the bench runs as root) on free loopback ports, with the database `retrysafe` on each (for
//! Citus, with the extension and the workers added to the coordinator). Both kinds have the same
//! settings, so that the two differ by Citus alone. Stopped and removed by the clean-up
//! ([`Cleanup::stop_servers`](crate::harness::Cleanup::stop_servers)).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::harness::{free_port, running_as_root, Cleanup, Pg};

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
    pub fn postmasters(&self) -> Result<Vec<u32>> {
        let pid = |data: &PathBuf| {
            let pid = std::fs::read_to_string(data.join("postmaster.pid"))?;
            let first = pid.lines().next().unwrap_or_default().trim();
            first.parse().context("postmaster.pid names no process")
        };
        self.data.iter().map(pid).collect()
    }
}

/// Starts a lab (`citus`: a coordinator and two workers; otherwise one plain server) in `work`.
pub fn start(cleanup: &Cleanup, work: &Path, citus: bool) -> Result<Lab> {
    if citus && !Path::new(CITUS_LIBRARY).exists() {
        bail!("the citus scenario needs the Citus extension ({CITUS_LIBRARY} is missing): build a 13.x release of github.com/citusdata/citus for PostgreSQL 15");
    }
    let (kind, nodes) = if citus { ("citus", 3) } else { ("plain", 1) };
    let settings = format!("{SETTINGS}{}", if citus { CITUS } else { "" });
    let (mut ports, mut data) = (Vec::new(), Vec::new());
    for node in 0..nodes {
        let dir = work.join(format!("lab-{kind}-{node}"));
        ports.push(server(cleanup, &dir, &settings)?);
        data.push(dir.join("data"));
    }
    let pg = |port| Pg {
        base: format!("postgres://postgres@127.0.0.1:{port}"),
    };
    for &port in &ports {
        pg(port).query("postgres", "CREATE DATABASE retrysafe")?;
        if citus {
            pg(port).query("retrysafe", "CREATE EXTENSION citus")?;
        }
    }
    let (pg, coordinator) = (pg(ports[0]), ports[0]);
    if citus {
        let sql = format!("SELECT citus_set_coordinator_host('127.0.0.1', {coordinator})");
        pg.query("retrysafe", &sql)?;
        for worker in &ports[1..] {
            let sql = format!("SELECT citus_add_node('127.0.0.1', {worker})");
            pg.query("retrysafe", &sql)?;
        }
    }
    Ok(Lab { pg, data })
}

/// One server in `dir`, registered with the clean-up before it starts; its port.
fn server(cleanup: &Cleanup, dir: &Path, settings: &str) -> Result<u16> {
    std::fs::create_dir_all(dir)?;
    // A server refuses to run as root: its directory is the postgres user's.
    let mut chown = Command::new("chown");
    chown.args(["-R", "postgres:postgres"]).arg(dir);
    if running_as_root() && !chown.status()?.success() {
        bail!("cannot give {} to the postgres user", dir.display());
    }
    let data = dir.join("data");
    let (data_text, log) = (data.display().to_string(), dir.join("postgres.log"));
    let log = log.display().to_string();
    run(&[
        "initdb", "-D", &data_text, "-U", "postgres", "-A", "trust", "-E", "UTF8",
    ])?;
    let port = free_port()?;
    let conf = data.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf)?;
    let socket = dir.display();
    text += &format!("\nport = {port}\nunix_socket_directories = '{socket}'\n{settings}");
    std::fs::write(&conf, text)?;
    cleanup.add_server(data)?;
    run(&[
        "pg_ctl", "-D", &data_text, "-l", &log, "-w", "-t", "60", "start",
    ])?;
    Ok(port)
}

/// Runs a PostgreSQL program, as the `postgres` user (with its own home: a Citus node's
/// connections to the others read libpq's files there) when the bench runs as root.
pub fn run(args: &[&str]) -> Result<()> {
    let mut command = Command::new(args[0]);
    if running_as_root() {
        command = Command::new("runuser");
        command.args(["-u", "postgres", "--", args[0]]);
        command.env("HOME", "/var/lib/postgresql").current_dir("/");
    }
    let output = command.args(&args[1..]).output();
    let output = output.with_context(|| format!("cannot run {}", args[0]))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        bail!("{} failed: {stderr}", args.join(" "));
    }
    Ok(())
}
