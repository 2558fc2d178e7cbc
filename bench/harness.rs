//! What every scenario stands on: PostgreSQL, the daemon and the load programs as child
//! processes, the clean-up that runs on every exit (a signal's included), /proc readings, and
//! the machine a report names.

use std::collections::HashMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio_postgres::{NoTls, SimpleQueryMessage};

use crate::clients::{self, Names};
use crate::report::{quoted_settings, Settings, MACHINE};
use crate::stats::Num;

fn runtime() -> tokio::runtime::Runtime {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    runtime.expect("a current-thread runtime")
}

/// Runs a future to completion on a runtime of its own (the driver is otherwise synchronous).
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    runtime().block_on(future)
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
        let variable = |name: &str, default: &str| {
            let value = std::env::var(name).ok().filter(|v| !v.is_empty());
            let value = value.unwrap_or_else(|| default.to_owned());
            std::env::set_var(name, &value);
            value
        };
        let (host, port) = (variable("PGHOST", "127.0.0.1"), variable("PGPORT", "5432"));
        let user = variable("PGUSER", "postgres");
        Pg {
            base: format!("postgres://{user}@{host}:{port}"),
        }
    }

    pub fn url(&self, db: &str) -> String {
        format!("{}/{db}", self.base)
    }

    /// Runs `sql` (one or more statements) on `db` and returns the first column of the first
    /// row that any statement returned, as text ("" when none did).
    pub fn query(&self, db: &str, sql: &str) -> Result<String> {
        let url = self.url(db);
        block_on(async {
            let connect = tokio::time::timeout(Duration::from_secs(10), connect(&url)).await;
            let client = connect.with_context(|| format!("no answer from {url} within 10 s"))??;
            let messages = client.simple_query(sql).await;
            let messages = messages.with_context(|| format!("on {db}: {sql}"))?;
            let first = messages.iter().find_map(|message| match message {
                SimpleQueryMessage::Row(row) => Some(row.get(0).unwrap_or("").to_owned()),
                _ => None,
            });
            Ok(first.unwrap_or_default())
        })
    }

    pub fn count(&self, db: &str, sql: &str) -> Result<i64> {
        let text = self.query(db, sql)?;
        text.parse()
            .with_context(|| format!("{sql} gave {text:?}, not a count"))
    }

    pub fn drop_db(&self, db: &str) -> Result<()> {
        let sql = format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)");
        self.query("postgres", &sql).map(drop)
    }

    /// The databases whose name starts with `prefix` (letters, digits and `_`).
    pub fn databases_like(&self, prefix: &str) -> Result<Vec<String>> {
        let pattern = prefix.replace('_', "\\_");
        let sql = "SELECT string_agg(datname, ' ') FROM pg_database WHERE datname LIKE";
        let names = self.query("postgres", &format!("{sql} '{pattern}%'"))?;
        Ok(names.split_whitespace().map(str::to_owned).collect())
    }
}

/// A client of `url` whose connection runs on the current runtime.
pub async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let connected = tokio_postgres::connect(url, NoTls).await;
    let (client, connection) = connected.with_context(|| format!("cannot connect to {url}"))?;
    tokio::spawn(connection);
    Ok(client)
}

/// What a command printed (standard output, else standard error), trimmed; "" on failure.
pub fn command_line(program: &str, args: &[&str]) -> String {
    let Ok(out) = Command::new(program).args(args).output() else {
        return String::new();
    };
    let text = [out.stdout, out.stderr]
        .into_iter()
        .find(|text| !text.is_empty());
    String::from_utf8_lossy(&text.unwrap_or_default())
        .trim()
        .to_owned()
}

/// GET of `url` with curl, a 2xx answer within `seconds`: its body.
pub fn get(url: &str, seconds: &str) -> Result<String> {
    let mut curl = Command::new("curl");
    let output = curl.args(["-sf", "-m", seconds, url]).output()?;
    if !output.status.success() {
        bail!("cannot GET {url}");
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

pub fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Installs the Debian package of each (tool, package) whose tool is missing, as root or
/// through sudo.
pub fn ensure_tools(tools: &[(&str, &str)]) -> Result<()> {
    let have = |tool: &str| !command_line("sh", &["-c", &format!("command -v {tool}")]).is_empty();
    let missing: Vec<&str> = tools.iter().filter(|t| !have(t.0)).map(|t| t.1).collect();
    if !missing.is_empty() {
        let missing = missing.join(" ");
        say!("installing {missing} with apt-get");
        let sudo = if running_as_root() { "" } else { "sudo " };
        let install = format!("{sudo}apt-get update -qq && {sudo}apt-get install -y -qq {missing}");
        let mut apt = Command::new("sh");
        apt.args(["-c", &install])
            .env("DEBIAN_FRONTEND", "noninteractive");
        apt.stdout(Stdio::null()).status()?;
    }
    match tools.iter().find(|(tool, _)| !have(tool)) {
        Some((tool, _)) => bail!("{tool} is not available"),
        None => Ok(()),
    }
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

/// One process as /proc/PID/stat shows it: its parent, its name, and its CPU ticks: its own
/// (utime + stime) and those of its children that have exited and been waited for (cutime +
/// cstime), so that the sum over a tree does not move when a process exits and is reaped: its
/// time passes from its own line to its parent's.
struct ProcStat {
    parent: u32,
    name: String,
    own: u64,
    reaped: u64,
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(") ")?;
    let fields = rest.split_whitespace().map(|v| v.parse().unwrap_or(0));
    let fields: Vec<u64> = fields.collect();
    // After "pid (comm) ": state is 0, ppid 1, utime 11, stime 12, cutime 13, cstime 14.
    let at = |i: usize| fields.get(i).copied().unwrap_or(0);
    let name = head.split_once(" (")?.1.to_owned();
    let (own, reaped) = (at(11) + at(12), at(13) + at(14));
    Some(ProcStat {
        parent: at(1) as u32,
        name,
        own,
        reaped,
    })
}

fn all_processes() -> HashMap<u32, ProcStat> {
    let pids = fs::read_dir("/proc").into_iter().flatten().flatten();
    let pids = pids.filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok());
    pids.filter_map(|pid| Some((pid, proc_stat(pid)?)))
        .collect()
}

/// The CPU ticks of each tree whose root `root` names, a process counted in the tree of its
/// nearest ancestor (itself included) that is a root.
fn tree_ticks<K: Eq + std::hash::Hash>(
    processes: &HashMap<u32, ProcStat>,
    root: impl Fn(u32) -> Option<K>,
) -> HashMap<K, u64> {
    let mut trees = HashMap::new();
    for (pid, process) in processes {
        let (mut at, mut depth) = (*pid, 0);
        // Up the parents (at most 64), until a root or a process that is gone.
        let key = loop {
            match (root(at), processes.get(&at)) {
                (Some(key), _) => break Some(key),
                (None, Some(p)) if depth < 64 && p.parent != at => {
                    (at, depth) = (p.parent, depth + 1)
                }
                _ => break None,
            }
        };
        if let Some(key) = key {
            *trees.entry(key).or_default() += process.own + process.reaped;
        }
    }
    trees
}

/// CPU ticks of the process `root` and all its descendants (a postmaster's: one server's).
pub fn ticks_of_tree(root: u32) -> u64 {
    let trees = tree_ticks(&all_processes(), |pid| (pid == root).then_some(()));
    trees.into_values().sum()
}

/// CPU time, in clock ticks, of the machine's PostgreSQL and RabbitMQ servers, for the cost of a
/// write: the services' share of it, beside the daemon's own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceTicks {
    /// Every postmaster (a `postgres` process whose parent is not one) and all its descendants.
    pub postgres: u64,
    /// Every `beam.smp` (RabbitMQ's Erlang VM) and all its descendants.
    pub rabbitmq: u64,
}

impl ServiceTicks {
    /// A reading. /proc is read one process at a time, so a process reaped during the scan
    /// could be missed or counted twice: the scan is repeated (at most 10 times) until the
    /// roots' reaped time did not change.
    pub fn now() -> ServiceTicks {
        let mut processes = all_processes();
        for _ in 0..10 {
            let held = |(pid, p): (&u32, &ProcStat)| {
                Self::root(&processes, *pid).is_none()
                    || proc_stat(*pid).is_some_and(|now| now.reaped == p.reaped)
            };
            if processes.iter().all(held) {
                break;
            }
            processes = all_processes();
        }
        let trees = tree_ticks(&processes, |pid| Self::root(&processes, pid));
        let ticks = |postgres| trees.get(&postgres).copied().unwrap_or(0);
        ServiceTicks {
            postgres: ticks(true),
            rabbitmq: ticks(false),
        }
    }

    /// Whether `pid` is the root of PostgreSQL's tree (true) or RabbitMQ's (false).
    fn root(processes: &HashMap<u32, ProcStat>, pid: u32) -> Option<bool> {
        let process = processes.get(&pid)?;
        let parent = processes.get(&process.parent).map(|p| p.name.as_str());
        match (process.name.as_str(), parent) {
            ("postgres", Some("postgres")) => None,
            ("postgres", _) => Some(true),
            ("beam.smp", _) => Some(false),
            _ => None,
        }
    }

    /// What was used since `earlier`; None if a figure went down (a server restarted).
    pub fn since(self, earlier: ServiceTicks) -> Option<ServiceTicks> {
        let postgres = self.postgres.checked_sub(earlier.postgres)?;
        let rabbitmq = self.rabbitmq.checked_sub(earlier.rabbitmq)?;
        Some(ServiceTicks { postgres, rabbitmq })
    }
}

/// CPU seconds per 1,000 operations, from `ticks` spent on `operations`.
pub fn seconds_per_1000(ticks: u64, operations: f64) -> Option<Num> {
    let seconds = ticks as f64 / clock_ticks();
    (operations > 0.0).then(|| Num::fixed(seconds / operations * 1000.0, 3))?
}

/// The whole machine's jiffies, every process and the kernel (/proc/stat's first line): work
/// done on these CPUs (user, nice, system, irq and softirq), the time the hypervisor gave
/// another guest while this one wanted a CPU (steal), and everything (idle and iowait included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MachineTicks {
    pub work: u64,
    pub steal: u64,
    pub total: u64,
}

impl MachineTicks {
    pub fn now() -> Result<MachineTicks> {
        let stat = fs::read_to_string("/proc/stat")?;
        let line = stat.lines().find(|line| line.starts_with("cpu "));
        Ok(Self::parse(line.context("no cpu line in /proc/stat")?))
    }

    /// `cpu  user nice system idle iowait irq softirq steal ...` (guest time is already in
    /// user and nice).
    fn parse(line: &str) -> MachineTicks {
        let values = line.split_whitespace().skip(1).take(8);
        let values: Vec<u64> = values.map(|v| v.parse().unwrap_or(0)).collect();
        let at = |i: usize| values.get(i).copied().unwrap_or(0);
        let (work, steal) = (at(0) + at(1) + at(2) + at(5) + at(6), at(7));
        MachineTicks {
            work,
            steal,
            total: values.iter().sum(),
        }
    }

    /// What passed since `earlier` (counters only grow).
    pub fn since(self, earlier: MachineTicks) -> MachineTicks {
        let work = self.work.saturating_sub(earlier.work);
        let steal = self.steal.saturating_sub(earlier.steal);
        let total = self.total.saturating_sub(earlier.total);
        MachineTicks { work, steal, total }
    }

    /// The share of the time the CPUs worked (the steal counted as work if `steal`), in per
    /// cent; none of no time.
    pub fn busy_share(self, steal: bool) -> Option<f64> {
        let work = self.work + if steal { self.steal } else { 0 };
        (self.total > 0).then(|| 100.0 * work as f64 / self.total as f64)
    }
}

pub fn port_in_use(port: u16) -> bool {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    std::net::TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok()
}

/// A free port of 127.0.0.1, as the kernel hands one out.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

fn send_signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill has no memory-safety preconditions; a stale pid only gives ESRCH.
    unsafe { libc::kill(pid as libc::pid_t, signal) };
}

/// `retrysafe serve` as a child process, its output in a log file.
pub struct Daemon {
    child: Child,
    pub pid: u32,
    url: String,
    pub log: PathBuf,
    /// The log's lines, and the daemon's CPU ticks, when SIGTERM was sent.
    lines_at_stop: Option<usize>,
    pub ticks_at_stop: Option<u64>,
    cleanup: Arc<Cleanup>,
}

impl Daemon {
    /// Starts `retrysafe serve` with the settings' configuration and port, and `env`
    /// (`RETRYSAFE_` and a key, a value), at log level warn; never once the clean-up has begun.
    pub fn start(
        binary: &Path,
        s: &Settings,
        env: &[(&str, &str)],
        log: PathBuf,
        cleanup: &Arc<Cleanup>,
    ) -> Result<Daemon> {
        if port_in_use(s.port) {
            bail!("port {} is in use; choose another", s.port);
        }
        let out = File::create(&log)?;
        let mut command = Command::new(binary);
        command
            .args(["serve", "--config", &s.config])
            .stdin(Stdio::null());
        command.env("RETRYSAFE_HTTP__LISTEN", format!("127.0.0.1:{}", s.port));
        command.env("RETRYSAFE_LOG__LEVEL", "warn");
        for (key, value) in env {
            command.env(format!("RETRYSAFE_{key}"), value);
        }
        command.stdout(out.try_clone()?).stderr(out);
        let child = cleanup.guard(|state| {
            let child = command.spawn();
            let child = child.with_context(|| format!("starting {}", binary.display()))?;
            state.daemon_pid = Some(child.id());
            Ok(child)
        })?;
        let (pid, url) = (child.id(), format!("http://127.0.0.1:{}", s.port));
        let (lines_at_stop, ticks_at_stop, cleanup) = (None, None, cleanup.clone());
        Ok(Daemon {
            child,
            pid,
            url,
            log,
            lines_at_stop,
            ticks_at_stop,
            cleanup,
        })
    }

    /// Waits until /healthz answers 2xx (at most 30 s).
    pub fn wait_healthy(&mut self) -> Result<()> {
        let log = self.log.display();
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait()? {
                bail!("the daemon exited at start ({status}); see {log}");
            }
            if get(&format!("{}/healthz", self.url), "2").is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("the daemon did not answer /healthz within 30 s; see {log}")
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// utime + stime, in clock ticks (those at its stop once it stopped).
    pub fn cpu_ticks(&self) -> Result<u64> {
        let now = || Some(proc_stat(self.pid)?.own);
        let ticks = self.ticks_at_stop.or_else(now);
        ticks.with_context(|| format!("cannot read /proc/{}/stat", self.pid))
    }

    /// A `kB` line of /proc/PID/status (VmRSS, VmHWM), in MiB.
    pub fn status_mib(&self, key: &str) -> Result<f64> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let kb = status.lines().find_map(|line| {
            let rest = line.strip_prefix(key)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<f64>().ok()
        });
        Ok(kb.with_context(|| format!("no {key} in /proc/{}/status", self.pid))? / 1024.0)
    }

    pub fn open_fds(&self) -> usize {
        fs::read_dir(format!("/proc/{}/fd", self.pid)).map_or(0, |dir| dir.count())
    }

    fn log_lines(&self) -> Vec<String> {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().map(str::to_owned).collect()
    }

    /// SIGTERM, then SIGKILL after 30 s; the exit status and how long it took. Notes the log's
    /// lines and the CPU ticks before the signal.
    pub fn stop(&mut self) -> Result<(ExitStatus, Duration)> {
        self.lines_at_stop = Some(self.log_lines().len());
        self.ticks_at_stop = self.cpu_ticks().ok();
        let started = Instant::now();
        send_signal(self.pid, libc::SIGTERM);
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if started.elapsed() > Duration::from_secs(30) {
                say!("the daemon did not stop within 30 s of SIGTERM; killing it");
                let _ = self.child.kill();
                break self.child.wait()?;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.cleanup.state().daemon_pid = None;
        if !status.success() {
            say!("the daemon exited with {status} after SIGTERM");
        }
        Ok((status, started.elapsed()))
    }

    /// The log's lines at WARN or ERROR once the daemon listens: before the SIGTERM that
    /// stopped it, and after it; and the first of them. The lines before it listens are the
    /// setup's, not the load's: the benchmark runs the repository's config.toml (readable by
    /// all, no clients, on loopback), which the daemon warns about at start, on purpose.
    pub fn log_problems(&self) -> (usize, usize, Option<String>) {
        let lines = self.log_lines();
        let listening = lines.iter().position(|line| line.contains("listening"));
        let listening = listening.map_or(0, |i| i + 1);
        let at_stop = self.lines_at_stop.unwrap_or(lines.len());
        let at_stop = at_stop.clamp(listening, lines.len());
        let problem = |line: &&String| line.contains("WARN") || line.contains("ERROR");
        let first = lines[listening..].iter().find(problem).cloned();
        let count = |lines: &[String]| lines.iter().filter(problem).count();
        let under_load = count(&lines[listening..at_stop]);
        (under_load, count(&lines[at_stop..]), first)
    }
}

/// Runs a command line, `NAME=value` words then a program and its arguments, its output in
/// `out`, calling `poll` every `every` while it runs; its exit status and what it printed.
pub fn run_program(
    line: &str,
    out: &Path,
    every: Duration,
    mut poll: impl FnMut() -> Result<()>,
) -> Result<(ExitStatus, String)> {
    let mut words = line.split_whitespace().peekable();
    let mut env = Vec::new();
    while let Some(pair) = words.peek().and_then(|word| word.split_once('=')) {
        env.push(pair);
        words.next();
    }
    let program = words.next().context("no program")?;
    let file = File::create(out)?;
    let mut command = Command::new(program);
    command.args(words).envs(env).stdin(Stdio::null());
    command.stdout(file.try_clone()?).stderr(file);
    let child = command.spawn();
    let mut child = child.with_context(|| format!("starting {program}"))?;
    let mut next_poll = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= next_poll {
            poll()?;
            next_poll += every;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok((status, fs::read_to_string(out)?))
}

/// What must go away on every exit, also on failure or a signal: the daemon, the databases
/// with a prefix, the exchanges and queues that were bound, the bench's own servers.
pub struct Cleanup {
    pg: Pg,
    db_prefix: String,
    /// Held while something is made and for the whole clean-up, so that nothing is made during
    /// or after it, and a second caller waits for the first to finish.
    state: Mutex<CleanupState>,
    /// The exit code of the signal that started the clean-up (0: none).
    interrupted: AtomicI32,
}

#[derive(Default)]
pub struct CleanupState {
    daemon_pid: Option<u32>,
    bound: Names,
    /// The data directories of the bench's own servers (bench/lab.rs).
    servers: Vec<PathBuf>,
    done: bool,
}

impl Cleanup {
    /// Armed for every exit: on SIGINT or SIGTERM it cleans up and exits 130 or 143, as a shell
    /// would.
    pub fn arm(pg: Pg, amqp: &str, db_prefix: String) -> Result<Arc<Cleanup>> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut state = CleanupState::default();
        state.bound.amqp = amqp.into();
        let (state, interrupted) = (Mutex::new(state), AtomicI32::new(0));
        let cleanup = Arc::new(Cleanup {
            pg,
            db_prefix,
            state,
            interrupted,
        });
        // The handlers are installed here, before any work; their runtime runs on a thread.
        let runtime = runtime();
        let entered = runtime.enter();
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        drop(entered);
        let on_signal = cleanup.clone();
        let thread = std::thread::Builder::new().name("signals".into());
        thread.spawn(move || {
            let signal = async {
                tokio::select! { _ = int.recv() => 130, _ = term.recv() => 143 }
            };
            let code = runtime.block_on(signal);
            on_signal.interrupted.store(code, Ordering::SeqCst);
            // Outside the runtime: the clean-up runs runtimes of its own.
            say!("interrupted; cleaning up");
            on_signal.run();
            std::process::exit(code);
        })?;
        Ok(cleanup)
    }

    fn state(&self) -> MutexGuard<'_, CleanupState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `create` (what makes a database, an exchange, a server or a daemon, noting it in
    /// the state) unless the clean-up has begun, and never while it runs: after a signal the
    /// work goes on until it fails, and what it made after the clean-up would be left behind.
    pub fn guard<T>(&self, create: impl FnOnce(&mut CleanupState) -> Result<T>) -> Result<T> {
        let mut state = self.state();
        if state.done {
            bail!("interrupted");
        }
        create(&mut state)
    }

    /// A durable topic exchange and its queue `<exchange>.q` bound for '#', deleted by the
    /// clean-up.
    pub fn bind(&self, exchange: &str) -> Result<()> {
        self.guard(|state| {
            state.bound.exchange.push(exchange.into());
            state.bound.queue.push(format!("{exchange}.q"));
            let names = Names::of(exchange, &state.bound.amqp);
            block_on(clients::bind(&names)).context("cannot bind an exchange")
        })
    }

    /// A server of the bench's own (bench/lab.rs) in `data`, stopped and removed by the
    /// clean-up or by [`Cleanup::stop_servers`].
    pub fn add_server(&self, data: PathBuf) -> Result<()> {
        self.guard(|state| {
            state.servers.push(data);
            Ok(())
        })
    }

    /// Stops the bench's own servers (immediately: their data is thrown away) and removes
    /// their directories.
    pub fn stop_servers(&self) {
        stop_servers(std::mem::take(&mut self.state().servers));
    }

    /// Stops the daemon and the bench's own servers, drops the databases, deletes the
    /// exchanges and queues; once.
    fn run(&self) {
        let mut state = self.state();
        if std::mem::replace(&mut state.done, true) {
            return;
        }
        if let Some(pid) = state.daemon_pid.take() {
            send_signal(pid, libc::SIGTERM);
            // Gone, or a zombie: it has exited.
            let stat = || fs::read_to_string(format!("/proc/{pid}/stat"));
            let exited = || stat().map_or(true, |s| s.contains(") Z "));
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && !exited() {
                std::thread::sleep(Duration::from_millis(100));
            }
            send_signal(pid, libc::SIGKILL);
        }
        stop_servers(std::mem::take(&mut state.servers));
        let databases = self.pg.databases_like(&self.db_prefix);
        let databases = databases.inspect_err(|e| say!("could not list the databases: {e:#}"));
        for db in databases.unwrap_or_default() {
            if let Err(error) = self.pg.drop_db(&db) {
                say!("could not drop database {db}: {error:#}");
            }
        }
        if let Err(error) = block_on(clients::delete(&state.bound)) {
            say!("could not delete the exchanges and queues: {error:#}");
        }
    }

    /// After the work: cleans up, then, when a signal interrupted the work, exits with its
    /// code: the work's error is only its echo.
    pub fn finish(&self) {
        self.run();
        match self.interrupted.load(Ordering::SeqCst) {
            0 => {}
            code => std::process::exit(code),
        }
    }
}

fn stop_servers(servers: Vec<PathBuf>) {
    for data in servers {
        let data_text = data.to_string_lossy();
        let stop = ["pg_ctl", "-D", &data_text, "-m", "immediate", "stop"];
        if let Err(error) = crate::lab::run(&stop) {
            say!("could not stop the server in {}: {error:#}", data.display());
        }
        if let Some(dir) = data.parent() {
            let _ = fs::remove_dir_all(dir);
            // The labs' directory, once its last server is gone (it fails while others stay).
            let _ = dir.parent().map(fs::remove_dir);
        }
    }
}

/// The machine and the software a run measures, by their names in the reports (`MACHINE`);
/// RabbitMQ's version from rabbitmqctl if `ask_rabbit` (it may take seconds), else from the
/// Debian package.
pub fn machine(pg: &Pg, config: &str, ask_rabbit: bool) -> HashMap<&'static str, String> {
    // What follows `prefix` on the line of a /proc file that starts with it.
    let proc = |file: &str, prefix: &str| {
        let text = fs::read_to_string(file).unwrap_or_default();
        let line = text.lines().find_map(|line| line.strip_prefix(prefix));
        line.unwrap_or_default().to_owned()
    };
    let word = |text: &str, index| text.split_whitespace().nth(index).unwrap_or("").to_owned();
    let kb: Option<f64> = word(&proc("/proc/meminfo", "MemTotal:"), 0).parse().ok();
    let cpu = proc("/proc/cpuinfo", "model name");
    let show = |setting: &str| pg.query("postgres", &format!("SHOW {setting}"));
    let show = |setting| show(setting).unwrap_or_else(|_| "unknown".into());
    let wrk = command_line("wrk", &["-v"]);
    let rustc = Some(command_line("rustc", &["--version"])).filter(|v| !v.is_empty());
    let settings = fs::read_to_string(config).map(|text| quoted_settings(&text));
    let values = [
        cpu.split_once(": ")
            .map_or("", |(_, model)| model)
            .to_owned(),
        command_line("nproc", &[]),
        kb.map_or(String::new(), |kb| format!("{:.1}", kb / 1_048_576.0)),
        command_line("uname", &["-sr"]),
        show("server_version"),
        show("autovacuum"),
        rabbit_version(ask_rabbit),
        word(wrk.lines().next().unwrap_or(""), 1),
        word(&command_line("pgbench", &["--version"]), 2),
        rustc.unwrap_or_else(|| "rustc unknown".into()),
        commit(),
        settings.unwrap_or_default(),
    ];
    MACHINE.split(' ').zip(values).collect()
}

/// The short commit, noting uncommitted changes to what the daemon is built from.
fn commit() -> String {
    let short = command_line("git", &["rev-parse", "--short", "HEAD"]);
    let unknown = short.is_empty() || short.contains("fatal");
    let short = if unknown { "unknown".to_owned() } else { short };
    let status = ["status", "--porcelain", "--untracked-files=no", "--", "src"];
    let paths = ["Cargo.toml", "Cargo.lock", "migrations"];
    match command_line("git", &[&status[..], &paths].concat()).is_empty() {
        true => short,
        false => format!("{short} (with uncommitted changes in src/)"),
    }
}

/// RabbitMQ's version from rabbitmqctl (if `ask`), else from the Debian package; "unknown"
/// without either.
fn rabbit_version(ask: bool) -> String {
    let ctl = ask.then(|| command_line("timeout", &["20", "rabbitmqctl", "version"]));
    let ctl = ctl.and_then(|text| text.lines().last().map(str::to_owned));
    let ctl = ctl.filter(|v| !v.trim().is_empty() && !v.contains("rror"));
    let package = || command_line("dpkg-query", &["-W", "-f=${Version}", "rabbitmq-server"]);
    let version = ctl.unwrap_or_else(package);
    match version.is_empty() || version.contains("no packages") {
        true => "unknown".into(),
        false => version,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::fmt;

    #[test]
    fn the_machine_line_splits_work_steal_and_idle() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let before = MachineTicks::parse("cpu  100 5 40 800 20 3 2 10 7 0");
        assert_eq!((before.work, before.steal, before.total), (150, 10, 980));
        let spent = MachineTicks::parse("cpu  250 5 90 850 20 3 2 30 9 0").since(before);
        assert_eq!((spent.work, spent.steal, spent.total), (200, 20, 270));
        assert_eq!(fmt(spent.busy_share(false), 1), "74.1");
        assert_eq!(fmt(spent.busy_share(true), 1), "81.5");
        assert_eq!(MachineTicks::default().busy_share(false), None);
        let now = MachineTicks::now().unwrap();
        assert!(now.work + now.steal <= now.total && now.total > 0);
    }

    #[test]
    fn this_process_and_the_services_as_proc_shows_them() {
        let me = proc_stat(std::process::id()).unwrap();
        assert_eq!(me.parent, std::os::unix::process::parent_id());
        assert!(!me.name.is_empty() && !me.name.contains(')'));
        // Spin a little so that some CPU time shows.
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(start.elapsed());
        }
        assert!(proc_stat(std::process::id()).unwrap().own >= me.own);
        assert!(ticks_of_tree(me.parent) >= me.own);
        // PostgreSQL and RabbitMQ run on every machine the benchmark runs on.
        let before = ServiceTicks::now();
        assert!(before.postgres > 0 && before.rabbitmq > 0, "{before:?}");
        let mut later = ServiceTicks::now();
        assert!(later.since(before).is_some());
        // A reading that went down (a restarted server) is no figure, not a wrapped number.
        later.postgres = 0;
        assert_eq!(later.since(before), None);
        let ticks = (clock_ticks() * 3.0) as u64;
        assert_eq!(seconds_per_1000(ticks, 10_000.0).unwrap().text, "0.300");
        assert!(seconds_per_1000(ticks, 0.0).is_none());
    }

    #[test]
    fn databases_by_prefix() {
        let pg = Pg::from_env();
        let names = pg.databases_like("postgre").unwrap();
        assert!(names.contains(&"postgres".to_owned()), "{names:?}");
        assert!(pg.databases_like("retrysafe_no_such_").unwrap().is_empty());
    }
}
