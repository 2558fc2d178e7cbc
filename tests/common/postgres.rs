//! A PostgreSQL cluster of a test's own, beside the machine's: `initdb` and `pg_ctl` as the
//! `postgres` user (through `runuser`, so the tests that use it run as root), on a free
//! loopback port, stopped (immediate) and removed when dropped. The machine's own PostgreSQL is
//! not touched. tests/tls gives it TLS; tests/faults puts it under pressure (a full disk, no
//! free connection).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::daemon::free_port;

/// A directory for a test's files, readable by the `postgres` and `rabbitmq` users (their
/// servers read copies the tests give them), removed on drop.
pub struct TestDir(pub PathBuf);

impl TestDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("retrysafe-{name}-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }

    /// Writes `text` to `file` and returns its path.
    pub fn write(&self, file: &str, text: &str) -> PathBuf {
        let path = self.path(file);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Gives `path` (a file or a directory) to `user`, for a server that runs as that user.
pub fn give_to(user: &str, path: &Path) {
    let status = Command::new("chown")
        .arg("-R")
        .arg(format!("{user}:{user}"))
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "chown {user} {}", path.display());
}

/// Runs `args` as the `postgres` user, with that user's own home: a server started this way
/// that opens connections of its own (Citus's nodes do) looks for its libpq files there, not in
/// the test's (root's) home, which it may not read.
pub fn as_postgres(args: &[&str]) -> Output {
    Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .args(args)
        .env("HOME", "/var/lib/postgresql")
        .current_dir("/")
        .output()
        .expect("runuser runs")
}

pub fn assert_ran(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A file put into the data directory before the cluster starts.
pub struct DataFile<'a> {
    pub name: &'a str,
    pub contents: &'a [u8],
    /// Readable by its owner only (PostgreSQL refuses a key file others can read).
    pub private: bool,
}

/// A PostgreSQL cluster of the test's own; stopped (immediate) and removed on drop.
pub struct PgCluster {
    dir: TestDir,
    pub port: u16,
}

impl PgCluster {
    /// A cluster with trust authentication for everyone on loopback.
    pub fn start_plain(settings: &str) -> Self {
        Self::start(
            "plain-pg",
            settings,
            &["host all all 127.0.0.1/32 trust"],
            &[],
        )
    }

    /// A cluster whose `postgresql.conf` ends with `settings` and whose `pg_hba.conf` is the
    /// superuser's local trust line and `hba`, with `files` in its data directory.
    pub fn start(name: &str, settings: &str, hba: &[&str], files: &[DataFile]) -> Self {
        let dir = TestDir::new(name);
        let data = dir.path("data");
        give_to("postgres", &dir.0);
        let data_text = data.to_str().unwrap();
        let initdb = as_postgres(&[
            "initdb",
            "-D",
            data_text,
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
        ]);
        assert_ran(&initdb, "initdb");
        for file in files {
            std::fs::write(data.join(file.name), file.contents).unwrap();
        }
        let port = free_port();
        let conf = format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\nfsync = off\nmax_connections = 40\n{settings}\n",
            dir.0.display()
        );
        append(&data.join("postgresql.conf"), &conf);
        let mut lines = vec!["local all postgres trust"];
        lines.extend_from_slice(hba);
        std::fs::write(data.join("pg_hba.conf"), lines.join("\n") + "\n").unwrap();
        give_to("postgres", &dir.0);
        for file in files.iter().filter(|file| file.private) {
            let mode = Command::new("chmod")
                .arg("0600")
                .arg(data.join(file.name))
                .status()
                .unwrap();
            assert!(mode.success());
        }
        let cluster = Self { dir, port };
        cluster.start_again();
        cluster
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path("data")
    }

    /// Stops the server at once (`immediate`: as a crash does), keeping its data.
    pub fn stop(&self) {
        assert_ran(&self.pg_ctl_stop(), "pg_ctl stop");
    }

    /// `pg_ctl stop -m immediate`, waiting for it at most 30 s.
    fn pg_ctl_stop(&self) -> Output {
        self.pg_ctl(&["-m", "immediate", "-w", "-t", "30", "stop"])
    }

    /// `pg_ctl` with `args` on the cluster's data directory.
    fn pg_ctl(&self, args: &[&str]) -> Output {
        let data = self.data();
        let mut command = vec!["pg_ctl", "-D", data.to_str().unwrap()];
        command.extend_from_slice(args);
        as_postgres(&command)
    }

    /// Starts the server (again, after [`stop`](Self::stop)), logging to `postgres.log`.
    pub fn start_again(&self) {
        let log = self.dir.path("postgres.log");
        let start = self.pg_ctl(&["-l", log.to_str().unwrap(), "-w", "-t", "60", "start"]);
        assert_ran(&start, "pg_ctl start");
    }

    /// A streaming standby of `primary`, made with `pg_basebackup` (the primary is first let
    /// take replication connections from loopback), receiving its WAL through `port` on
    /// loopback (the primary's own, or a proxy's that can cut the link), as `application_name`
    /// `standby`; running, on a port and in a directory of its own.
    pub fn standby_of(primary: &PgCluster, port: u16) -> Self {
        append(
            &primary.data().join("pg_hba.conf"),
            "host replication all 127.0.0.1/32 trust\n",
        );
        primary.psql("SELECT pg_reload_conf()");
        let dir = TestDir::new("standby");
        give_to("postgres", &dir.0);
        let data = dir.path("data");
        let backup = as_postgres(&[
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            &primary.port.to_string(),
            "-U",
            "postgres",
            "-D",
            data.to_str().unwrap(),
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        ]);
        assert_ran(&backup, "pg_basebackup");
        let own_port = free_port();
        let conf = format!(
            "\nport = {own_port}\nunix_socket_directories = '{}'\nprimary_conninfo = 'host=127.0.0.1 port={port} user=postgres application_name=standby'\n",
            dir.0.display()
        );
        append(&data.join("postgresql.conf"), &conf);
        std::fs::write(data.join("standby.signal"), "").unwrap();
        give_to("postgres", &dir.0);
        let standby = Self {
            dir,
            port: own_port,
        };
        standby.start_again();
        standby
    }

    /// Promotes a standby, waiting until it takes writes.
    pub fn promote(&self) {
        let promoted = self.pg_ctl(&["-w", "-t", "60", "promote"]);
        assert_ran(&promoted, "pg_ctl promote");
    }

    /// Stops every process of the server (the postmaster, then each of its children) with
    /// SIGSTOP: a hung host, which accepts connections (the kernel completes the handshake)
    /// and answers nothing. Resumed when the guard is dropped.
    pub fn freeze(&self) -> Frozen {
        let pid = std::fs::read_to_string(self.data().join("postmaster.pid"))
            .unwrap()
            .lines()
            .next()
            .and_then(|line| line.trim().parse::<i32>().ok())
            .expect("postmaster.pid starts with the postmaster's pid");
        // The postmaster first: stopped, it starts no child that would be missed.
        signal(pid, libc::SIGSTOP);
        let children = children_of(pid);
        for child in &children {
            signal(*child, libc::SIGSTOP);
        }
        let mut pids = vec![pid];
        pids.extend(children);
        Frozen { pids }
    }

    /// The cluster's own directory (the data directory and the socket are in it).
    pub fn dir(&self) -> &Path {
        &self.dir.0
    }

    /// The server's log so far (`log_connections = on` in the settings makes it name every
    /// connection and its user).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path("postgres.log")).unwrap_or_default()
    }

    /// Runs SQL as the superuser over the cluster's Unix socket, on `database`.
    pub fn psql_on(&self, database: &str, sql: &str) -> String {
        let output = as_postgres(&[
            "psql",
            "-X",
            "-q",
            "-At",
            "-h",
            self.dir.0.to_str().unwrap(),
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
            "-d",
            database,
            "-c",
            sql,
        ]);
        assert_ran(&output, sql);
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// [`psql_on`](Self::psql_on) the `postgres` database.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_on("postgres", sql)
    }

    /// `postgres://postgres@127.0.0.1:PORT/DATABASE`, without a password (trust).
    pub fn url_of(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let stop = self.pg_ctl_stop();
        if !stop.status.success() {
            eprintln!(
                "pg_ctl stop failed: {}",
                String::from_utf8_lossy(&stop.stderr)
            );
        }
    }
}

/// Adds `text` at the end of the file at `path`.
fn append(path: &Path, text: &str) {
    let mut all = std::fs::read_to_string(path).unwrap();
    all.push_str(text);
    std::fs::write(path, all).unwrap();
}

/// A server's processes stopped by [`PgCluster::freeze`]; resumed (SIGCONT) when dropped.
pub struct Frozen {
    pids: Vec<i32>,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for pid in &self.pids {
            signal(*pid, libc::SIGCONT);
        }
    }
}

/// Sends `signal` to `pid`, a process of a server of the test's own; one that has just ended
/// (a backend whose client left) is not an error.
fn signal(pid: i32, signal: libc::c_int) {
    // SAFETY: kill(2) has no memory preconditions.
    unsafe { libc::kill(pid, signal) };
}

/// The processes whose parent is `pid` (from /proc).
fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|child| {
            // `pid (name) state ppid ...`: the name may hold spaces, not a closing parenthesis
            // followed by one.
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    let after_name = &stat[stat.rfind(") ")? + 2..];
                    after_name.split(' ').nth(1)?.parse::<i32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// Cancels every backend of a primary waiting for its synchronous standby, every 50 ms, until
/// dropped: what pg_auto_failover's keeper does when it disables synchronous replication (the
/// standby is unhealthy, so the primary goes on alone), and an operator's cancel does. Each
/// cancelled commit stays committed locally, with a warning.
pub struct SyncRepCanceller {
    task: actix_web::rt::task::JoinHandle<()>,
}

impl SyncRepCanceller {
    /// Starts cancelling through `primary`, a connection to the primary.
    pub fn start(primary: tokio_postgres::Client) -> Self {
        let task = actix_web::rt::spawn(async move {
            loop {
                let _ = primary
                    .execute(
                        "SELECT pg_cancel_backend(pid) FROM pg_stat_activity
                         WHERE wait_event = 'SyncRep'",
                        &[],
                    )
                    .await;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        });
        Self { task }
    }
}

impl Drop for SyncRepCanceller {
    fn drop(&mut self) {
        self.task.abort();
    }
}
