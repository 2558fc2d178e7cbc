//! The plumbing that the benchmark and the soak share: what a run stands on (`Harness`: the
//! release binaries, PostgreSQL, the broker helpers, the clean-up that runs on every exit), the
//! daemon as a child process, /proc readings, and running a tool into a file and reading its
//! result line.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use serde_json::{Map, Value};
use tokio_postgres::{NoTls, SimpleQueryMessage};

use crate::stats::Num;

/// Progress on standard error: `[bench 12:34:56] message`.
pub fn log(tag: &str, message: &str) {
    eprintln!("[{tag} {}] {message}", chrono::Local::now().format("%T"));
}

/// What a run of the benchmark or the soak stands on.
pub struct Harness {
    /// The program's name in its progress lines: `bench` or `soak`.
    pub tag: &'static str,
    pub bin: Binaries,
    pub pg: Pg,
    pub broker: Broker,
    pub cleanup: Arc<Cleanup>,
    /// Where the raw output goes.
    pub work: PathBuf,
}

impl Harness {
    /// Checks that PostgreSQL answers, makes `work`, and arms the clean-up for every exit, a
    /// signal's included: the databases whose names start with `db_prefix`, and the daemon,
    /// exchanges and queues it is told of.
    pub fn new(
        tag: &'static str,
        bin: Binaries,
        amqp: &str,
        work: PathBuf,
        db_prefix: String,
    ) -> anyhow::Result<Harness> {
        let pg = Pg::from_env();
        pg.query("postgres", "SELECT 1")
            .with_context(|| format!("cannot reach PostgreSQL at {}", pg.base))?;
        fs::create_dir_all(&work)?;
        let cleanup = Cleanup::new(tag, pg.clone(), bin.publisher.clone(), db_prefix);
        cleanup.on_signals()?;
        let broker = Broker {
            publisher: bin.publisher.clone(),
            amqp: amqp.to_owned(),
        };
        Ok(Harness {
            tag,
            bin,
            pg,
            broker,
            cleanup,
            work,
        })
    }

    /// After the work: cleans up (exiting as the signal says if one interrupted it) and notes
    /// where the raw output of a failed run is.
    pub fn finish<T>(&self, result: anyhow::Result<T>) -> anyhow::Result<T> {
        self.cleanup.finish();
        if let Err(error) = &result {
            let work = self.work.display();
            log(self.tag, &format!("ERROR: {error:#}; raw output in {work}"));
        }
        result
    }

    /// Starts the daemon; unless `wait` is false, waits until /healthz answers.
    pub fn start(&self, spec: DaemonSpec<'_>, wait: bool) -> anyhow::Result<Daemon> {
        Daemon::start(&self.bin.daemon, spec, &self.cleanup, wait)
    }
}

/// The release binaries: the daemon, and the helpers beside this program.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub daemon: PathBuf,
    pub publisher: PathBuf,
    pub e2e: PathBuf,
}

impl Binaries {
    /// This program is `<target>/<profile>/examples/bench`; the helpers are its siblings and the
    /// daemon is in the directory above.
    pub fn beside_this_program() -> anyhow::Result<Binaries> {
        let exe = std::env::current_exe().context("cannot find this program's path")?;
        let examples = exe.parent().context("this program has no directory")?;
        let profile = examples
            .parent()
            .context("no directory above this program's")?;
        let binaries = Binaries {
            daemon: profile.join("retrysafe"),
            publisher: examples.join("bench-publisher"),
            e2e: examples.join("bench-e2e"),
        };
        for path in [&binaries.daemon, &binaries.publisher, &binaries.e2e] {
            if !path.is_file() {
                bail!(
                    "{} is missing: build with cargo build --release --features bench-routes --bin retrysafe --example bench-publisher --example bench-e2e --example bench-delay-proxy --example bench",
                    path.display()
                );
            }
        }
        Ok(binaries)
    }
}

/// Runs a future to completion on a runtime of its own (the driver is otherwise synchronous).
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
        .block_on(future)
}

/// PostgreSQL as PGHOST, PGPORT and PGUSER say (default 127.0.0.1:5432, postgres), which are
/// also exported for pgbench.
#[derive(Clone, Debug)]
pub struct Pg {
    /// `postgres://user@host:port`
    pub base: String,
}

impl Pg {
    pub fn from_env() -> Pg {
        let [host, port, user] = [
            ("PGHOST", "127.0.0.1"),
            ("PGPORT", "5432"),
            ("PGUSER", "postgres"),
        ]
        .map(|(name, default)| {
            let value = std::env::var(name).ok().filter(|v| !v.is_empty());
            let value = value.unwrap_or_else(|| default.to_owned());
            std::env::set_var(name, &value);
            value
        });
        Pg {
            base: format!("postgres://{user}@{host}:{port}"),
        }
    }

    pub fn url(&self, db: &str) -> String {
        format!("{}/{db}", self.base)
    }

    /// Runs `sql` (one or more statements) on `db` and returns the first column of the first
    /// row that any statement returned, as text ("" when none did).
    pub fn query(&self, db: &str, sql: &str) -> anyhow::Result<String> {
        let url = self.url(db);
        block_on(async {
            let connect = tokio_postgres::connect(&url, NoTls);
            let (client, connection) = tokio::time::timeout(Duration::from_secs(10), connect)
                .await
                .with_context(|| format!("no answer from {url} within 10 s"))?
                .with_context(|| format!("cannot connect to {url}"))?;
            let connection = tokio::spawn(connection);
            let messages = client
                .simple_query(sql)
                .await
                .with_context(|| format!("on {db}: {sql}"))?;
            drop(client);
            let _ = connection.await;
            let first = messages.iter().find_map(|message| match message {
                SimpleQueryMessage::Row(row) => Some(row.get(0).unwrap_or("").to_owned()),
                _ => None,
            });
            Ok(first.unwrap_or_default())
        })
    }

    /// `query` as a number.
    pub fn number(&self, db: &str, sql: &str) -> anyhow::Result<Option<Num>> {
        Ok(Num::parse(&self.query(db, sql)?))
    }

    pub fn count(&self, db: &str, sql: &str) -> anyhow::Result<i64> {
        let text = self.query(db, sql)?;
        text.parse()
            .with_context(|| format!("{sql} gave {text:?}, not a count"))
    }

    pub fn drop_db(&self, db: &str) -> anyhow::Result<()> {
        let sql = format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)");
        self.query("postgres", &sql).map(drop)
    }

    /// The databases whose name starts with `prefix` (letters, digits and `_`).
    pub fn databases_like(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        let pattern = prefix.replace('_', "\\_");
        let sql = format!(
            "SELECT string_agg(datname, ' ') FROM pg_database WHERE datname LIKE '{pattern}%'"
        );
        let names = self.query("postgres", &sql)?;
        Ok(names.split_whitespace().map(str::to_owned).collect())
    }
}

/// The first line starting with `tag ` (the last one, if several), parsed as a JSON object.
pub fn result_line(text: &str, tag: &str) -> anyhow::Result<Map<String, Value>> {
    let prefix = format!("{tag} ");
    let line = text
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix(&prefix))
        .ok_or_else(|| anyhow!("no {tag} line"))?;
    match serde_json::from_str(line).with_context(|| format!("{tag} line: {line}"))? {
        Value::Object(map) => Ok(map),
        other => bail!("{tag} line is not an object: {other}"),
    }
}

/// A figure of a result line, with the text the tool printed.
pub fn field(map: &Map<String, Value>, key: &str) -> Option<Num> {
    match map.get(key)? {
        Value::Number(number) => Num::parse(&number.to_string()),
        Value::String(text) => Num::parse(text),
        _ => None,
    }
}

/// wrk as the benchmark and the soak run it: `threads` threads, `connections` connections for
/// `seconds`, `script`'s requests to `url`, latency percentiles, 10 s before a request times out.
pub fn wrk(threads: u32, connections: u32, seconds: u32, script: &str, url: &str) -> Command {
    let mut command = Command::new("wrk");
    let load = format!("-t{threads} -c{connections} -d{seconds}s --timeout 10s --latency");
    command
        .args(load.split_whitespace())
        .args(["-s", script, url]);
    command
}

/// Runs `command` with standard output and error into `out`; returns what it printed and its
/// status. Fails only when it cannot be started.
pub fn run_to_file(command: &mut Command, out: &Path) -> anyhow::Result<(ExitStatus, String)> {
    let file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let status = command
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .with_context(|| format!("starting {:?}", command.get_program()))?;
    let text = fs::read_to_string(out).unwrap_or_default();
    Ok((status, text))
}

/// `run_to_file`, failing unless it exits 0.
pub fn run_ok(command: &mut Command, out: &Path, what: &str) -> anyhow::Result<String> {
    let (status, text) = run_to_file(command, out)?;
    if !status.success() {
        bail!("{what} failed ({status}); see {}", out.display());
    }
    Ok(text)
}

pub fn unix_ns() -> u128 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH);
    since_epoch.map(|d| d.as_nanos()).unwrap_or(0)
}

/// Clock ticks per second of /proc's CPU times.
pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

/// One process as /proc/PID/stat shows it.
struct ProcStat {
    ppid: u32,
    comm: String,
    /// utime + stime.
    ticks: u64,
    /// cutime + cstime: the CPU time of its children that have exited and been waited for.
    child_ticks: u64,
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(") ")?;
    let comm = head.split_once(" (")?.1.to_owned();
    let fields: Vec<u64> = rest
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // After "pid (comm) state ": ppid is 0, utime 10, stime 11, cutime 12, cstime 13.
    let at = |i: usize| fields.get(i).copied().unwrap_or(0);
    Some(ProcStat {
        ppid: at(0) as u32,
        comm,
        ticks: at(10) + at(11),
        child_ticks: at(12) + at(13),
    })
}

fn all_processes() -> HashMap<u32, ProcStat> {
    let pids = fs::read_dir("/proc").into_iter().flatten().flatten();
    pids.filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, proc_stat(pid)?)))
        .collect()
}

/// CPU time, in clock ticks, of the machine's PostgreSQL and RabbitMQ servers, for the cost of a
/// write: the services' share of it, beside the daemon's own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceTicks {
    /// Every postmaster (a `postgres` process whose parent is not one) and all its descendants
    /// (backends, background processes, what they run).
    pub postgres: u64,
    /// Every `beam.smp` (RabbitMQ's Erlang VM) and all its descendants (`erl_child_setup` and
    /// the programs it starts).
    pub rabbitmq: u64,
}

impl ServiceTicks {
    /// A reading. Each process of a tree counts its own time and that of its children that
    /// have exited and been waited for (cutime + cstime), so the sum over the tree does not move
    /// when a process exits and is reaped: its time passes from its own line to its parent's.
    /// /proc is read one process at a time, so a process reaped during the scan could be missed
    /// or counted twice: the scan is repeated until the roots' reaped time did not change
    /// during it.
    pub fn now() -> ServiceTicks {
        let mut processes = all_processes();
        for _ in 0..10 {
            let unchanged = processes.iter().all(|(pid, process)| {
                Self::root(process, processes.get(&process.ppid)).is_none()
                    || proc_stat(*pid).is_some_and(|now| now.child_ticks == process.child_ticks)
            });
            if unchanged {
                break;
            }
            processes = all_processes();
        }
        let mut ticks = ServiceTicks::default();
        for (pid, process) in &processes {
            // The service whose tree the process is in: walk up to a root.
            let (mut at, mut service) = ((*pid, process), None);
            for _ in 0..64 {
                let parent = processes.get(&at.1.ppid);
                service = Self::root(at.1, parent);
                match parent {
                    Some(parent) if service.is_none() && at.1.ppid != at.0 => {
                        at = (at.1.ppid, parent)
                    }
                    _ => break,
                }
            }
            let own = process.ticks + process.child_ticks;
            match service {
                Some(Service::Postgres) => ticks.postgres += own,
                Some(Service::Rabbitmq) => ticks.rabbitmq += own,
                None => {}
            }
        }
        ticks
    }

    /// The service whose tree `process` is the root of, if it is one.
    fn root(process: &ProcStat, parent: Option<&ProcStat>) -> Option<Service> {
        match (process.comm.as_str(), parent.map(|p| p.comm.as_str())) {
            ("postgres", Some("postgres")) => None,
            ("postgres", _) => Some(Service::Postgres),
            ("beam.smp", _) => Some(Service::Rabbitmq),
            _ => None,
        }
    }

    /// What was used since `earlier`; None if a figure went down (a server restarted).
    pub fn since(self, earlier: ServiceTicks) -> Option<ServiceTicks> {
        Some(ServiceTicks {
            postgres: self.postgres.checked_sub(earlier.postgres)?,
            rabbitmq: self.rabbitmq.checked_sub(earlier.rabbitmq)?,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Service {
    Postgres,
    Rabbitmq,
}

/// CPU seconds per 1,000 operations, from `ticks` spent on `operations`.
pub fn seconds_per_1000(ticks: u64, operations: i64) -> Option<Num> {
    let seconds = ticks as f64 / clock_ticks();
    (operations > 0)
        .then(|| Num::fixed(seconds / operations as f64 * 1000.0, 3))
        .flatten()
}

/// Cores used over a window: CPU seconds / wall seconds.
pub fn cpu_share(ticks: u64, wall_ns: u128) -> Option<Num> {
    let wall = wall_ns as f64 / 1e9;
    (wall > 0.0)
        .then(|| Num::fixed(ticks as f64 / clock_ticks() / wall, 3))
        .flatten()
}

/// MiB from kB, one decimal.
pub fn mib(kb: u64) -> Option<Num> {
    Num::fixed(kb as f64 / 1024.0, 1)
}

/// The whole machine's jiffies, every process and the kernel (/proc/stat's first line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MachineTicks {
    /// user, nice, system, irq and softirq: work done on these CPUs.
    pub work: u64,
    /// Time the hypervisor gave another guest while this one wanted a CPU.
    pub steal: u64,
    /// Everything, idle and iowait included.
    pub total: u64,
}

impl MachineTicks {
    pub fn now() -> anyhow::Result<MachineTicks> {
        let stat = fs::read_to_string("/proc/stat")?;
        let line = stat.lines().find(|line| line.starts_with("cpu "));
        Ok(Self::parse(line.context("no cpu line in /proc/stat")?))
    }

    /// `cpu  user nice system idle iowait irq softirq steal ...` (guest time is already in
    /// user and nice).
    fn parse(line: &str) -> MachineTicks {
        let values: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| values.get(i).copied().unwrap_or(0);
        MachineTicks {
            work: at(0) + at(1) + at(2) + at(5) + at(6),
            steal: at(7),
            total: values.iter().sum(),
        }
    }

    /// What passed since `earlier` (counters only grow).
    pub fn since(self, earlier: MachineTicks) -> MachineTicks {
        MachineTicks {
            work: self.work.saturating_sub(earlier.work),
            steal: self.steal.saturating_sub(earlier.steal),
            total: self.total.saturating_sub(earlier.total),
        }
    }

    /// The share of the time the CPUs worked, in per cent (one decimal).
    pub fn busy_pct(self) -> Option<Num> {
        (self.total > 0)
            .then(|| Num::fixed(100.0 * self.work as f64 / self.total as f64, 1))
            .flatten()
    }
}

fn connect(port: u16, timeout: Duration) -> std::io::Result<TcpStream> {
    TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), timeout)
}

pub fn port_in_use(port: u16) -> bool {
    connect(port, Duration::from_millis(200)).is_ok()
}

/// A free port of 127.0.0.1, as the kernel hands one out.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Whether GET /healthz on 127.0.0.1:port answers 2xx.
pub fn healthy(port: u16) -> bool {
    let check = || -> std::io::Result<bool> {
        let mut stream = connect(port, Duration::from_secs(1))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
        let mut status = String::new();
        BufReader::new(stream).read_line(&mut status)?;
        let code = status.split_whitespace().nth(1);
        Ok(code.is_some_and(|code| code.starts_with('2')))
    };
    check().unwrap_or(false)
}

pub fn send_signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill has no memory-safety preconditions; a stale pid only gives ESRCH.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// What must go away on every exit, also on failure or a signal: the daemon, the databases
/// with a prefix, the exchanges and queues that were bound.
pub struct Cleanup {
    tag: &'static str,
    pg: Pg,
    publisher: PathBuf,
    db_prefix: String,
    state: Mutex<CleanupState>,
    /// Held for the whole clean-up, so that a second caller waits for the first to finish.
    running: Mutex<()>,
    /// The exit code of the signal that started the clean-up (0: none).
    interrupted: AtomicI32,
}

#[derive(Default)]
struct CleanupState {
    daemon_pid: Option<u32>,
    /// `--exchange X` and `--queue Q` of `bench-publisher delete`.
    bound: Vec<String>,
    done: bool,
}

impl Cleanup {
    pub fn new(tag: &'static str, pg: Pg, publisher: PathBuf, db_prefix: String) -> Arc<Cleanup> {
        Arc::new(Cleanup {
            tag,
            pg,
            publisher,
            db_prefix,
            state: Mutex::new(CleanupState::default()),
            running: Mutex::new(()),
            interrupted: AtomicI32::new(0),
        })
    }

    /// After the work stopped: cleans up (or waits for the signal handler's clean-up) and, when
    /// a signal interrupted the run, exits with its code: the work's error is only its echo.
    pub fn finish(&self) {
        self.run();
        match self.interrupted.load(Ordering::SeqCst) {
            0 => {}
            code => std::process::exit(code),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, CleanupState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The daemon that runs now, if any.
    pub fn running(&self, pid: Option<u32>) {
        self.state().daemon_pid = pid;
    }

    /// Runs `create` (what makes a database, an exchange or a daemon) unless the clean-up has
    /// begun, and never while it runs: after a signal the work goes on until it fails, and what
    /// it made after the clean-up would be left behind.
    pub fn guard<T>(&self, create: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
        let _running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if self.state().done {
            bail!("interrupted");
        }
        create()
    }

    pub fn bound(&self, exchange: &str, queue: &str) {
        let words = ["--exchange", exchange, "--queue", queue];
        self.state().bound.extend(words.map(str::to_owned));
    }

    /// Stops the daemon, drops the databases, deletes the exchanges and queues; once.
    pub fn run(&self) {
        let _running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let (pid, bound) = {
            let mut state = self.state();
            if std::mem::replace(&mut state.done, true) {
                return;
            }
            (state.daemon_pid.take(), std::mem::take(&mut state.bound))
        };
        if let Some(pid) = pid {
            send_signal(pid, libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                // Gone, or a zombie: it has exited.
                let stat = fs::read_to_string(format!("/proc/{pid}/stat"));
                if stat.map(|s| s.contains(") Z ")).unwrap_or(true) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            send_signal(pid, libc::SIGKILL);
        }
        let databases = self.pg.databases_like(&self.db_prefix);
        let databases = databases.unwrap_or_else(|error| {
            log(
                self.tag,
                &format!("could not list the databases to drop: {error:#}"),
            );
            Vec::new()
        });
        for db in databases {
            if let Err(error) = self.pg.drop_db(&db) {
                log(
                    self.tag,
                    &format!("could not drop database {db}: {error:#}"),
                );
            }
        }
        if !bound.is_empty() {
            let mut command = Command::new(&self.publisher);
            let status = command
                .arg("delete")
                .args(&bound)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if !status.is_ok_and(|s| s.success()) {
                log(self.tag, "could not delete the exchanges and queues");
            }
        }
    }

    /// On SIGINT or SIGTERM: clean up and exit 130 or 143, as a shell would.
    pub fn on_signals(self: &Arc<Cleanup>) -> anyhow::Result<()> {
        let cleanup = self.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                let code = block_on(async move {
                    use tokio::signal::unix::{signal, SignalKind};
                    let int = signal(SignalKind::interrupt());
                    let term = signal(SignalKind::terminate());
                    let (Ok(mut int), Ok(mut term)) = (int, term) else {
                        let _ = ready_tx.send(false);
                        return None;
                    };
                    let _ = ready_tx.send(true);
                    tokio::select! {
                        _ = int.recv() => Some(130),
                        _ = term.recv() => Some(143),
                    }
                });
                if let Some(code) = code {
                    cleanup.interrupted.store(code, Ordering::SeqCst);
                    // Outside the runtime: the clean-up runs runtimes of its own.
                    log(cleanup.tag, "interrupted; cleaning up");
                    cleanup.run();
                    std::process::exit(code);
                }
            })?;
        if !ready_rx.recv().unwrap_or(false) {
            bail!("cannot install the signal handlers");
        }
        Ok(())
    }
}

/// The broker helpers, run as `bench-publisher` processes.
pub struct Broker {
    pub publisher: PathBuf,
    pub amqp: String,
}

impl Broker {
    /// `bench-publisher` with `words` (none has a space).
    fn command(&self, words: &str) -> Command {
        let mut command = Command::new(&self.publisher);
        command
            .env("BENCH_AMQP_URL", &self.amqp)
            .args(words.split_whitespace());
        command
    }

    /// Runs `bench-publisher` with `words`; an error with what it printed if it fails.
    fn run(&self, words: &str, what: &str) -> anyhow::Result<()> {
        let output = self.command(words).output()?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            bail!("cannot {what} at {}: {}", self.amqp, stderr.trim());
        }
        Ok(())
    }

    /// Checks that the broker answers.
    pub fn reachable(&self) -> anyhow::Result<()> {
        self.run("delete", "reach RabbitMQ")
    }

    /// A durable topic exchange and a durable queue bound for '#', deleted by `cleanup`.
    pub fn bind(&self, cleanup: &Cleanup, exchange: &str, queue: &str) -> anyhow::Result<()> {
        cleanup.guard(|| {
            cleanup.bound(exchange, queue);
            let words = format!("bind --exchange {exchange} --queue {queue}");
            self.run(&words, &format!("bind {queue} to {exchange}"))
        })
    }

    pub fn delete(&self, exchange: &str, queue: &str) -> anyhow::Result<()> {
        let words = format!("delete --exchange {exchange} --queue {queue}");
        self.run(&words, &format!("delete {exchange} / {queue}"))
    }

    /// Messages ready in `queue`, waiting up to `timeout_secs` for `expect` of them; none if
    /// they could not be counted.
    pub fn count(
        &self,
        queue: &str,
        expect: i64,
        timeout_secs: u64,
    ) -> anyhow::Result<Option<Num>> {
        let expect = expect.max(0);
        let words =
            format!("count --queue {queue} --expect {expect} --timeout-secs {timeout_secs}");
        let output = self.command(&words).stderr(Stdio::inherit()).output()?;
        let result = result_line(&String::from_utf8_lossy(&output.stdout), "BENCH_RESULT");
        Ok(result.ok().and_then(|map| field(&map, "messages")))
    }
}

/// How the daemon is started.
pub struct DaemonSpec<'a> {
    pub config: &'a str,
    pub port: u16,
    pub db_url: String,
    pub amqp: &'a str,
    pub exchange: &'a str,
    pub log: PathBuf,
}

/// `retrysafe serve` as a child process, its output in a log file.
pub struct Daemon {
    child: Child,
    pub pid: u32,
    pub port: u16,
    pub log: PathBuf,
    lines_at_stop: Option<usize>,
    cleanup: Arc<Cleanup>,
}

impl Daemon {
    fn start(
        binary: &Path,
        spec: DaemonSpec<'_>,
        cleanup: &Arc<Cleanup>,
        wait: bool,
    ) -> anyhow::Result<Daemon> {
        if port_in_use(spec.port) {
            bail!("port {} is in use; choose another", spec.port);
        }
        let log = File::create(&spec.log)?;
        let mut command = Command::new(binary);
        command
            .args(["serve", "--config", spec.config])
            .env("RETRYSAFE_HTTP__LISTEN", format!("127.0.0.1:{}", spec.port))
            .env("RETRYSAFE_DATABASE__URL", &spec.db_url)
            .env("RETRYSAFE_AMQP__URL", spec.amqp)
            .env("RETRYSAFE_AMQP__EXCHANGE", spec.exchange)
            .env("RETRYSAFE_LOG__LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cleanup.guard(|| {
            let child = command.spawn();
            let child = child.with_context(|| format!("starting {}", binary.display()))?;
            cleanup.running(Some(child.id()));
            Ok(child)
        })?;
        let pid = child.id();
        let mut daemon = Daemon {
            child,
            pid,
            port: spec.port,
            log: spec.log,
            lines_at_stop: None,
            cleanup: cleanup.clone(),
        };
        if wait {
            daemon.wait_healthy()?;
        }
        Ok(daemon)
    }

    pub fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let log = self.log.display();
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait()? {
                bail!("the daemon exited at start ({status}); see {log}");
            }
            if healthy(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("the daemon did not answer /healthz within 30 s; see {log}")
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// utime + stime, in clock ticks.
    pub fn cpu_ticks(&self) -> anyhow::Result<u64> {
        let stat = proc_stat(self.pid);
        stat.map(|process| process.ticks)
            .ok_or_else(|| anyhow!("cannot read /proc/{}/stat", self.pid))
    }

    /// A `kB` line of /proc/PID/status (VmRSS, VmHWM).
    pub fn status_kb(&self, key: &str) -> anyhow::Result<u64> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let kb = status.lines().find_map(|line| {
            let rest = line.strip_prefix(key)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse().ok()
        });
        kb.ok_or_else(|| anyhow!("no {key} in /proc/{}/status", self.pid))
    }

    pub fn open_fds(&self) -> usize {
        let fds = fs::read_dir(format!("/proc/{}/fd", self.pid));
        fds.map(|dir| dir.count()).unwrap_or(0)
    }

    fn log_lines(&self) -> Vec<String> {
        let mut text = String::new();
        if let Ok(mut file) = File::open(&self.log) {
            let _ = file.read_to_string(&mut text);
        }
        text.lines().map(str::to_owned).collect()
    }

    /// SIGTERM, then SIGKILL after 30 s; returns the exit status and how long it took. Notes
    /// how many log lines there were before the signal.
    pub fn stop(&mut self, tag: &str) -> anyhow::Result<(ExitStatus, Duration)> {
        self.lines_at_stop = Some(self.log_lines().len());
        let started = Instant::now();
        send_signal(self.pid, libc::SIGTERM);
        let deadline = started + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                log(
                    tag,
                    "the daemon did not stop within 30 s of SIGTERM; killing it",
                );
                let _ = self.child.kill();
                break self.child.wait()?;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = started.elapsed();
        self.cleanup.running(None);
        if !status.success() {
            log(
                tag,
                &format!("the daemon exited with {status} after SIGTERM"),
            );
        }
        Ok((status, took))
    }

    /// The log's lines at WARN or ERROR once the daemon listens: before the SIGTERM that
    /// stopped it, and after it. The lines before it are the setup's, not the load's: the
    /// benchmark runs the repository's config.toml (readable by all, no clients, on loopback),
    /// which the daemon warns about at start, on purpose.
    pub fn log_problems(&self) -> (usize, usize) {
        let lines = self.log_lines();
        let listening = listening_line(&lines);
        let at_stop = self
            .lines_at_stop
            .unwrap_or(lines.len())
            .clamp(listening, lines.len());
        (
            lines[listening..at_stop]
                .iter()
                .filter(|line| is_problem(line))
                .count(),
            lines[at_stop..]
                .iter()
                .filter(|line| is_problem(line))
                .count(),
        )
    }

    /// The first WARN or ERROR line once the daemon listens, if any.
    pub fn first_problem(&self) -> Option<String> {
        let lines = self.log_lines();
        let listening = listening_line(&lines);
        lines
            .into_iter()
            .skip(listening)
            .find(|line| is_problem(line))
    }
}

fn is_problem(line: &str) -> bool {
    line.contains("WARN") || line.contains("ERROR")
}

/// The index of the line after the one where the daemon says it listens (the setup's lines
/// end there); 0 if there is none.
fn listening_line(lines: &[String]) -> usize {
    lines
        .iter()
        .position(|line| line.contains("listening"))
        .map_or(0, |index| index + 1)
}

/// Appends to a log file (the migrations' output).
pub fn append(path: &Path) -> anyhow::Result<File> {
    Ok(OpenOptions::new().create(true).append(true).open(path)?)
}

/// What a command printed (standard output, else standard error), trimmed; "" on failure.
pub fn command_line(program: &str, args: &[&str]) -> String {
    let Ok(out) = Command::new(program).args(args).output() else {
        return String::new();
    };
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if stdout.is_empty() {
        String::from_utf8_lossy(&out.stderr).trim().to_owned()
    } else {
        stdout
    }
}

/// The short commit, noting uncommitted changes to what the daemon is built from.
pub fn commit() -> String {
    let short = command_line("git", &["rev-parse", "--short", "HEAD"]);
    let short = if short.is_empty() || short.contains("fatal") {
        "unknown".to_owned()
    } else {
        short
    };
    let paths = ["src", "Cargo.toml", "Cargo.lock", "migrations"];
    let mut args = vec!["status", "--porcelain", "--untracked-files=no", "--"];
    args.extend(paths);
    if command_line("git", &args).is_empty() {
        short
    } else {
        format!("{short} (with uncommitted changes in src/)")
    }
}

/// The CPU model and the memory in GiB (one decimal), from /proc.
pub fn cpu_and_memory() -> (String, String) {
    let line = |file: &str, prefix: &str| {
        let text = fs::read_to_string(file).unwrap_or_default();
        let line = text.lines().find(|l| l.starts_with(prefix)).unwrap_or("");
        line.to_owned()
    };
    let cpu = line("/proc/cpuinfo", "model name");
    let cpu = cpu.split_once(": ").map(|(_, model)| model.to_owned());
    let mem = line("/proc/meminfo", "MemTotal:");
    let kb = mem
        .split_whitespace()
        .nth(1)
        .and_then(|kb| kb.parse::<f64>().ok());
    let mem = kb.map(|kb| format!("{:.1}", kb / 1_048_576.0));
    (cpu.unwrap_or_default(), mem.unwrap_or_default())
}

/// RabbitMQ's version from the Debian package; "unknown" without it.
pub fn rabbit_package_version() -> String {
    let version = command_line("dpkg-query", &["-W", "-f=${Version}", "rabbitmq-server"]);
    if version.is_empty() || version.contains("no packages") {
        "unknown".into()
    } else {
        version
    }
}

/// RabbitMQ's version from rabbitmqctl, else the Debian package's.
pub fn rabbit_version() -> String {
    let output = Command::new("timeout")
        .args(["20", "rabbitmqctl", "version"])
        .output();
    let from_ctl = output
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.lines().last().map(str::to_owned)
        });
    from_ctl
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(rabbit_package_version)
}

/// wrk's version: the second word of `wrk -v`'s first line.
pub fn wrk_version() -> String {
    let text = command_line("wrk", &["-v"]);
    let first = text.lines().next().unwrap_or("");
    first.split_whitespace().nth(1).unwrap_or("").to_owned()
}

pub fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool} >/dev/null")])
        .status();
    found.is_ok_and(|s| s.success())
}

/// Installs missing Debian packages with apt-get (as root, or through sudo).
pub fn apt_install(tag: &str, packages: &[&str]) -> anyhow::Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    let packages = packages.join(" ");
    if !have("apt-get") {
        bail!("missing {packages} and no apt-get to install them");
    }
    log(tag, &format!("installing {packages} with apt-get"));
    // SAFETY: geteuid has no preconditions.
    let sudo = if unsafe { libc::geteuid() } == 0 {
        ""
    } else {
        "sudo "
    };
    for args in [
        "update -qq".to_owned(),
        format!("install -y -qq {packages}"),
    ] {
        let line = format!("{sudo}apt-get {args}");
        let mut words = line.split_whitespace();
        let status = Command::new(words.next().expect("a program"))
            .args(words)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()?;
        if !status.success() {
            bail!("apt-get {args} failed");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_line_splits_work_steal_and_idle() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let before = MachineTicks::parse("cpu  100 5 40 800 20 3 2 10 7 0");
        let expected = MachineTicks {
            work: 150,
            steal: 10,
            total: 980,
        };
        assert_eq!(before, expected);
        let after = MachineTicks::parse("cpu  250 5 90 850 20 3 2 30 9 0");
        let spent = after.since(before);
        assert_eq!((spent.work, spent.steal, spent.total), (200, 20, 270));
        assert_eq!(spent.busy_pct().unwrap().text, "74.1");
        assert!(MachineTicks::default().busy_pct().is_none());
        let now = MachineTicks::now().unwrap();
        assert!(now.work + now.steal <= now.total && now.total > 0);
    }

    #[test]
    fn this_process_as_proc_shows_it() {
        let me = proc_stat(std::process::id()).unwrap();
        assert_eq!(me.ppid, std::os::unix::process::parent_id());
        assert!(!me.comm.is_empty() && !me.comm.contains(')'));
        // Spin a little so that some CPU time shows.
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(proc_stat(std::process::id()).unwrap().ticks >= me.ticks);
    }

    #[test]
    fn the_machines_services_have_used_some_cpu() {
        // PostgreSQL and RabbitMQ run on every machine the benchmark runs on.
        let before = ServiceTicks::now();
        assert!(before.postgres > 0, "{before:?}");
        assert!(before.rabbitmq > 0, "{before:?}");
        let later = ServiceTicks::now();
        assert!(later.postgres >= before.postgres && later.rabbitmq >= before.rabbitmq);
        assert!(later.since(before).is_some());
        // A reading that went down (a restarted server) is no figure, not a wrapped number.
        let restarted = ServiceTicks {
            postgres: 0,
            ..later
        };
        assert_eq!(restarted.since(before), None);
    }

    #[test]
    fn cost_per_1000() {
        let ticks = (clock_ticks() * 3.0) as u64;
        assert_eq!(seconds_per_1000(ticks, 10_000).unwrap().text, "0.300");
        assert!(seconds_per_1000(ticks, 0).is_none());
    }

    /// The command line the report's "Commands" section shows.
    #[test]
    fn wrk_as_the_report_shows_it() {
        let command = wrk(2, 64, 15, "bench/storm.lua", "http://127.0.0.1:18437/");
        let args: Vec<_> = command.get_args().map(|a| a.to_string_lossy()).collect();
        assert_eq!(
            format!(
                "{} {}",
                command.get_program().to_string_lossy(),
                args.join(" ")
            ),
            "wrk -t2 -c64 -d15s --timeout 10s --latency -s bench/storm.lua http://127.0.0.1:18437/"
        );
    }

    #[test]
    fn databases_by_prefix() {
        let pg = Pg::from_env();
        let names = pg.databases_like("postgre").unwrap();
        assert!(names.contains(&"postgres".to_owned()), "{names:?}");
        assert!(pg.databases_like("retrysafe_no_such_").unwrap().is_empty());
    }
}
