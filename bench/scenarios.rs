//! `bench run`: the benchmark's scenarios, each side by side with its baseline, on a fresh
//! database and exchange per scenario and run, and the report they make.
//!
//! The load generators are external programs (wrk with the scripts in bench/, pgbench,
//! `bench-e2e`, `bench-publisher`); this module starts them and the daemon, reads their result
//! lines into the runs of `report`, and writes the report.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{Map, Value};

use crate::harness::{
    self, append, cpu_share, field, log, mib, result_line, run_ok, run_to_file, seconds_per_1000,
    send_signal, unix_ns, Binaries, Daemon, DaemonSpec, Harness, MachineTicks, Pg, ServiceTicks,
};
use crate::report::{
    quoted_settings, DrainRun, E2eRun, LatencyRun, Machine, OrderedRun, ReplaysRun, Report, Run,
    Scenario, Settings, StormRun, WritesRun, LINK_DELAYS_MS,
};
use crate::stats::Num;

const TAG: &str = "bench";
const CONNECTIONS: u32 = 64;
const WRK_THREADS: u32 = 2;
const REPLAY_KEYS: u32 = 1000;
const STORM_KEYS: u32 = 10;
const PUBLISH_WINDOW: u32 = 1000;
const ORDERING_KEYS: u32 = 1000;

/// The synthetic backlog of the drain (`:events` rows).
const BACKLOG_SQL: &str = include_str!("drain_backlog.sql");

/// The same backlog as writes of `:keys` ordering keys in turn (after `BACKLOG_SQL`).
const ORDERED_BACKLOG_SQL: &str = include_str!("ordered_backlog.sql");

/// How many ordered events break their key's order (-1 if there are none): a sequence that is
/// not the one after the key's previous, an event unsent, or one marked sent before the key's
/// previous (a relay marks a batch sent once the broker confirmed it, and releases a key's
/// next event only then).
const ORDER_BROKEN_SQL: &str = "
SELECT CASE WHEN count(*) = 0 THEN -1 ELSE count(*) FILTER (WHERE broken) END FROM (
    SELECT sequence <> coalesce(lag(sequence) OVER w, 0) + 1 OR sent_at IS NULL
           OR sent_at < lag(sent_at) OVER w AS broken
    FROM outbox_events WHERE ordering_key IS NOT NULL
    WINDOW w AS (PARTITION BY client_id, ordering_key ORDER BY sequence)) AS events";

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Quick check: 5 s per measurement, 1 run, a 10,000-event drain; NOT reference figures.
    #[arg(long, env = "BENCH_QUICK", value_parser = clap::builder::BoolishValueParser::new())]
    pub quick: bool,
    /// Runs of every scenario (default 3; quick: 1).
    #[arg(long, env = "BENCH_RUNS")]
    pub runs: Option<u32>,
    /// Seconds per measurement (default 15; quick: 5).
    #[arg(long, env = "BENCH_DURATION")]
    pub duration: Option<u32>,
    /// Events of the drain's backlog (default 100000; quick: 10000).
    #[arg(long, env = "BENCH_DRAIN_EVENTS")]
    pub drain_events: Option<u64>,
    /// Seconds of end-to-end load (default 20; quick: 5).
    #[arg(long, env = "BENCH_E2E_SECONDS")]
    pub e2e_seconds: Option<u32>,
    /// Requests/s of the end-to-end load.
    #[arg(long, env = "BENCH_E2E_RATE", default_value_t = 1000)]
    pub e2e_rate: u32,
    #[arg(long, env = "BENCH_PORT", default_value_t = 18437)]
    pub port: u16,
    /// The daemon's configuration file.
    #[arg(long, env = "BENCH_CONFIG", default_value = "config.toml")]
    pub config: String,
    /// The report; what it has after the hand-written marker is kept.
    #[arg(long, env = "BENCH_OUTPUT", default_value = "BENCHMARKS.md")]
    pub output: PathBuf,
    /// A subset of "writes replays storm drain e2e ordered latency" (spaces or commas); the
    /// report shows n/a for the others.
    #[arg(
        long,
        env = "BENCH_SCENARIOS",
        default_value = "writes replays storm drain e2e ordered latency"
    )]
    pub scenarios: String,
    /// SQL run on every fresh database after its migrations, e.g. "DROP INDEX
    /// entries_client_created" to measure a write without it.
    #[arg(long, env = "BENCH_SETUP_SQL")]
    pub setup_sql: Option<String>,
    /// The daemon to measure instead of the one built beside this program (e.g. an earlier
    /// build, to compare two commits in one run of each).
    #[arg(long, env = "BENCH_DAEMON")]
    pub daemon: Option<PathBuf>,
    #[arg(
        long,
        env = "BENCH_AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp: String,
}

impl RunArgs {
    pub fn settings(&self, pg: &Pg) -> Settings {
        let pick = |value: Option<u32>, full: u32, quick: u32| {
            value.unwrap_or(if self.quick { quick } else { full })
        };
        Settings {
            quick: self.quick,
            runs: pick(self.runs, 3, 1),
            duration: pick(self.duration, 15, 5),
            drain_events: self
                .drain_events
                .unwrap_or(if self.quick { 10_000 } else { 100_000 }),
            e2e_seconds: pick(self.e2e_seconds, 20, 5),
            e2e_rate: self.e2e_rate,
            connections: CONNECTIONS,
            wrk_threads: WRK_THREADS,
            replay_keys: REPLAY_KEYS,
            storm_keys: STORM_KEYS,
            publish_window: PUBLISH_WINDOW,
            ordering_keys: ORDERING_KEYS,
            port: self.port,
            config: self.config.clone(),
            pg_base: pg.base.clone(),
        }
    }
}

/// Everything a scenario needs.
struct Bench {
    s: Settings,
    /// What the run stands on: binaries, PostgreSQL, the broker helpers, the clean-up.
    h: Harness,
    run_id: String,
    setup_sql: Option<String>,
    amqp: String,
}

/// wrk's figure of a metric, from its `BENCH_RESULT`: rps, p50_ms, p99_ms and requests as wrk
/// printed them, errors (connect + read + write + status + timeout), status_errors (non-2xx
/// answers); None for any other metric.
fn wrk_figure(result: &Map<String, Value>, metric: &str) -> Option<Num> {
    match metric {
        "rps" | "p50_ms" | "p99_ms" | "requests" => field(result, metric),
        "status_errors" => field(result, "errors_status"),
        "errors" => {
            let kinds = ["connect", "read", "write", "status", "timeout"];
            let count = |kind| field(result, &format!("errors_{kind}")).map(|n| n.value as i64);
            kinds
                .into_iter()
                .map(count)
                .sum::<Option<i64>>()
                .map(Num::int)
        }
        _ => None,
    }
}

/// The size of a replay's answer: the body the daemon answers replay-1 of bench/replay.lua with.
fn replay_answer_bytes(url: &str) -> anyhow::Result<usize> {
    let body = r#"{"kind":"bench.replay","data":{"i":1,"note":"retrysafe benchmark payload"}}"#;
    let output = std::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{size_download}",
            "-X",
            "POST",
        ])
        .args([
            "-H",
            "Content-Type: application/json",
            "-H",
            "Idempotency-Key: replay-1",
        ])
        .args(["--data-binary", body, &format!("{url}/v1/entries")])
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("curl did not say the size of a replay's answer: {text:?}"))
}

/// pgbench's figures, from its output: tps, the average latency (ms), the failed transactions,
/// and the transactions done.
fn pgbench_figures(text: &str) -> [Option<Num>; 4] {
    let word = |prefix: &str, index: usize| {
        text.lines()
            .rev()
            .find(|line| line.starts_with(prefix))
            .and_then(|line| line.split_whitespace().nth(index))
            .and_then(Num::parse)
    };
    [
        word("tps = ", 2),
        word("latency average = ", 3),
        word("number of failed transactions:", 4),
        word("number of transactions actually processed:", 5),
    ]
}

const UNSENT_SQL: &str = "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL";

/// 1 while an event is unsent, else 0: a few milliseconds at most (0.8-4.6 ms measured at
/// 60,000-120,000 unsent events), where counting them costs PostgreSQL 45-70 ms. Polled every
/// 100 ms, the count took a large share of the CPU whose use it was there to measure.
const ANY_UNSENT_SQL: &str =
    "SELECT count(*) FROM (SELECT 1 FROM outbox_events WHERE sent_at IS NULL LIMIT 1) AS unsent";

const PAYLOAD_SQL: &str = "SELECT round(avg(octet_length(payload::text))) FROM outbox_events";

/// How long the writes scenario waits for its backlog of events to be published.
const EMPTY_OUTBOX_WAIT: Duration = Duration::from_secs(120);

/// A broker URL nothing listens on (port 1 of loopback): the daemon serves writes, and its
/// relays, never connected, claim nothing.
const UNREACHABLE_AMQP: &str = "amqp://guest:guest@127.0.0.1:1/%2f";

/// PostgreSQL's and RabbitMQ's CPU seconds per 1,000 `operations`, from the ticks they used
/// meanwhile; none if a reading went down, as after a server restart (which is logged).
fn service_costs(services: Option<ServiceTicks>, operations: i64, what: &str) -> [Option<Num>; 2] {
    match services {
        Some(services) => {
            [services.postgres, services.rabbitmq].map(|ticks| seconds_per_1000(ticks, operations))
        }
        None => {
            log(TAG, &format!("{what}: PostgreSQL's or RabbitMQ's CPU time went down during the run (restarted?): no CPU cost"));
            [None, None]
        }
    }
}

/// The daemon's CPU time at the start of a measured window of wall time.
struct Window {
    ticks: u64,
    unix_ns: u128,
}

impl Window {
    fn open(daemon: &Daemon) -> anyhow::Result<Window> {
        let ticks = daemon.cpu_ticks()?;
        Ok(Window {
            ticks,
            unix_ns: unix_ns(),
        })
    }

    /// The cores the daemon used from the window's start until now.
    fn cores(&self, daemon: &Daemon) -> anyhow::Result<Option<Num>> {
        let ticks = daemon.cpu_ticks()? - self.ticks;
        Ok(cpu_share(ticks, unix_ns() - self.unix_ns))
    }

    /// `cores`, and the daemon's peak RSS (MiB) right after.
    fn close(&self, daemon: &Daemon) -> anyhow::Result<[Option<Num>; 2]> {
        Ok([self.cores(daemon)?, mib(daemon.status_kb("VmHWM")?)])
    }
}

/// A scenario's run: its fresh database and exchange, with a durable queue bound for '#'.
struct Stage {
    /// `<scenario>-<run>`, in the names of its files.
    name: String,
    db: String,
    exchange: String,
    queue: String,
}

impl Bench {
    fn path(&self, name: &str) -> PathBuf {
        self.h.work.join(name)
    }

    fn db_name(&self, scenario: &str, run: u32) -> String {
        format!("retrysafe_bench_{}_{scenario}_{run}", self.run_id)
    }

    /// Drops the database if present, creates and migrates it with `retrysafe migrate`, then
    /// runs BENCH_SETUP_SQL on it; not once the clean-up has begun.
    fn fresh_db(&self, db: &str) -> anyhow::Result<()> {
        self.h.cleanup.guard(|| {
            self.h.pg.drop_db(db)?;
            let log = self.path("migrate.log");
            let status = Command::new(&self.h.bin.daemon)
                .args(["migrate", "--config", &self.s.config])
                .env("RETRYSAFE_DATABASE__URL", self.h.pg.url(db))
                .env("RETRYSAFE_LOG__LEVEL", "warn")
                .stdout(append(&log)?)
                .stderr(append(&log)?)
                .status()?;
            if !status.success() {
                bail!("migrate {db} failed (see {})", log.display());
            }
            if let Some(sql) = &self.setup_sql {
                self.h.pg.query(db, sql)?;
            }
            Ok(())
        })
    }

    /// A fresh database and exchange (its queue bound) for one run of `scenario`.
    fn stage(&self, scenario: &str, run: u32) -> anyhow::Result<Stage> {
        let exchange = format!("retrysafe.bench.{}.{scenario}.{run}", self.run_id);
        let stage = Stage {
            name: format!("{scenario}-{run}"),
            db: self.db_name(scenario, run),
            queue: format!("{exchange}.q"),
            exchange,
        };
        self.fresh_db(&stage.db)?;
        self.h
            .broker
            .bind(&self.h.cleanup, &stage.exchange, &stage.queue)?;
        Ok(stage)
    }

    fn unstage(&self, stage: Stage) -> anyhow::Result<()> {
        self.h.pg.drop_db(&stage.db)?;
        self.h.broker.delete(&stage.exchange, &stage.queue)
    }

    /// The daemon on `db` and `exchange`, its output in `log`; unless `wait` is false, once it
    /// answers /healthz.
    fn start(
        &self,
        db: &str,
        exchange: &str,
        amqp: &str,
        log: &str,
        wait: bool,
    ) -> anyhow::Result<Daemon> {
        let spec = DaemonSpec {
            config: &self.s.config,
            port: self.s.port,
            db_url: self.h.pg.url(db),
            amqp,
            exchange,
            log: self.path(log),
        };
        self.h.start(spec, wait)
    }

    /// The daemon on the stage, its output in `daemon-<scenario>-<run>.log`.
    fn start_on(&self, stage: &Stage, wait: bool) -> anyhow::Result<Daemon> {
        let log = format!("daemon-{}.log", stage.name);
        self.start(&stage.db, &stage.exchange, &self.amqp, &log, wait)
    }

    /// Stops the daemon; its WARN/ERROR log lines under load and after the SIGTERM.
    fn stop(&self, daemon: &mut Daemon) -> anyhow::Result<[Option<Num>; 2]> {
        daemon.stop(TAG)?;
        let (under_load, after) = daemon.log_problems();
        Ok([under_load, after].map(|lines| Some(Num::int(lines as i64))))
    }

    /// The standard wrk command of every HTTP scenario; its figures (see `wrk_figure`).
    fn wrk(
        &self,
        out: &str,
        script: &str,
        path: &str,
        env: &[(&str, String)],
    ) -> anyhow::Result<impl Fn(&str) -> Option<Num>> {
        let out = self.path(out);
        let s = &self.s;
        let url = format!("{}{path}", s.url());
        let mut command = harness::wrk(s.wrk_threads, s.connections, s.duration, script, &url);
        command.envs(env.iter().map(|(name, value)| (name, value)));
        let text = run_ok(&mut command, &out, "wrk")?;
        let result = result_line(&text, "BENCH_RESULT")
            .with_context(|| format!("wrk printed no result; see {}", out.display()))?;
        Ok(move |metric: &str| wrk_figure(&result, metric))
    }

    /// wrk's unique-key writes: every request with a fresh key, kept apart from other runs'
    /// keys by `nonce`.
    fn unique_key_writes(
        &self,
        out: &str,
        nonce: String,
    ) -> anyhow::Result<impl Fn(&str) -> Option<Num>> {
        self.wrk(out, "bench/unique_keys.lua", "/", &[("BENCH_NONCE", nonce)])
    }

    /// pgbench against `db` with `script` and the `extra` options; its figures (a failure is
    /// logged, not fatal, as its figures say).
    fn pgbench(
        &self,
        out: &str,
        db: &str,
        script: &str,
        extra: &str,
    ) -> anyhow::Result<[Option<Num>; 4]> {
        let text = self.pgbench_output(out, db, script, extra, self.s.duration)?;
        Ok(pgbench_figures(&text))
    }

    /// [`pgbench`](Self::pgbench) for `seconds`: what it printed.
    fn pgbench_output(
        &self,
        out: &str,
        db: &str,
        script: &str,
        extra: &str,
        seconds: u32,
    ) -> anyhow::Result<String> {
        let out = self.path(out);
        let (c, j) = (self.s.connections, self.s.wrk_threads);
        let words = format!("-n -M prepared -c {c} -j {j} -T {seconds} {extra} -f {script} {db}");
        let mut command = Command::new("pgbench");
        command.args(words.split_whitespace());
        let (status, text) = run_to_file(&mut command, &out)?;
        if !status.success() {
            let out = out.display();
            log(TAG, &format!("pgbench exited with {status}; see {out}"));
        }
        Ok(text)
    }

    /// Runs a helper program (`bench-e2e`, `bench-publisher`) with `words` (none has a space)
    /// into `out`; its `BENCH_RESULT`.
    fn helper(&self, binary: &Path, words: &str, out: &str) -> anyhow::Result<Map<String, Value>> {
        let mut command = Command::new(binary);
        command.env("BENCH_AMQP_URL", &self.amqp);
        command.args(words.split_whitespace());
        let what = format!("{} {words}", binary.display());
        result_line(
            &run_ok(&mut command, &self.path(out), &what)?,
            "BENCH_RESULT",
        )
    }

    /// Waits until every event of `db` was published, at most [`EMPTY_OUTBOX_WAIT`]; false
    /// (and a log line) if they were not.
    fn outbox_emptied(&self, db: &str) -> anyhow::Result<bool> {
        let deadline = Instant::now() + EMPTY_OUTBOX_WAIT;
        while self.h.pg.count(db, ANY_UNSENT_SQL)? != 0 {
            if Instant::now() >= deadline {
                let unsent = self.h.pg.count(db, UNSENT_SQL)?;
                log(TAG, &format!("{unsent} events still unsent after {EMPTY_OUTBOX_WAIT:?}: no CPU cost per write"));
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(true)
    }

    /// Waits (at most 10 s) until no session is connected to `db`.
    fn sessions_closed(&self, db: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let sql = format!("SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}'");
        while self.h.pg.count("postgres", &sql)? > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// `SELECT count(*)` of each table of `db`.
    fn counts<const N: usize>(&self, db: &str, tables: [&str; N]) -> anyhow::Result<[i64; N]> {
        let mut counts = [0; N];
        for (count, table) in counts.iter_mut().zip(tables) {
            *count = self
                .h
                .pg
                .count(db, &format!("SELECT count(*) FROM {table}"))?;
        }
        Ok(counts)
    }

    fn measure(&self, scenario: Scenario, run: u32) -> anyhow::Result<Run> {
        match scenario {
            Scenario::Writes => self.writes(run),
            Scenario::Replays => self.replays(run),
            Scenario::Storm => self.storm(run),
            Scenario::Drain => self.drain(run),
            Scenario::E2e => self.e2e(run),
            Scenario::Ordered => self.ordered(run),
            Scenario::Latency => self.latency(run),
        }
    }

    fn writes(&self, run: u32) -> anyhow::Result<Run> {
        let (connections, duration) = (self.s.connections, self.s.duration);
        let load = format!("-c{connections}, {duration}s");
        log(TAG, &format!("run {run}: unique-key writes (wrk {load})"));
        let stage = self.stage("writes", run)?;
        let mut daemon = self.start_on(&stage, true)?;
        let (services0, machine0) = (ServiceTicks::now(), MachineTicks::now()?);
        let window = Window::open(&daemon)?;
        let nonce = format!("{}{run}", self.run_id);
        let wrk = self.unique_key_writes(&format!("writes-{run}.wrk"), nonce)?;
        let mut r = WritesRun {
            cpu_cores: window.cores(&daemon)?,
            machine_busy_pct: MachineTicks::now()?.since(machine0).busy_pct(),
            backlog_at_end: self.h.pg.number(&stage.db, UNSENT_SQL)?,
            rss_mb: mib(daemon.status_kb("VmHWM")?),
            ..WritesRun::default()
        };
        // A write's cost includes publishing its event: the CPU is read once the outbox is empty.
        if self.outbox_emptied(&stage.db)? {
            let services = ServiceTicks::now().since(services0);
            let machine = MachineTicks::now()?.since(machine0);
            let [written] = self.counts(&stage.db, ["entries"])?;
            r.cost_daemon = seconds_per_1000(daemon.cpu_ticks()? - window.ticks, written);
            [r.cost_postgres, r.cost_rabbitmq] = service_costs(services, written, "writes");
            r.machine_cost = seconds_per_1000(machine.work, written);
        }
        [r.log_problems, r.shutdown_log_problems] = self.stop(&mut daemon)?;
        // Sanity: every 201 has its entry; at most the requests in flight at the end (wrk
        // closes those connections; the daemon may still commit them) and timed-out ones come
        // on top.
        let tables = ["entries", "idempotency_records", "outbox_events"];
        let [entries, records, events] = self.counts(&stage.db, tables)?;
        let value = |metric| wrk(metric).map_or(0.0, |n| n.value) as i64;
        let answered_2xx = value("requests") - value("status_errors");
        r.entries = Some(Num::int(entries));
        r.entries_minus_2xx = Some(Num::int(entries - answered_2xx));
        r.rows_consistent = Some(Num::flag(entries == records && entries == events));
        r.payload_bytes = self.h.pg.number(&stage.db, PAYLOAD_SQL)?;
        self.h.pg.drop_db(&stage.db)?;
        self.write_then_deliver(run, &stage.exchange, &mut r)?;
        self.h.broker.delete(&stage.exchange, &stage.queue)?;

        log(
            TAG,
            &format!("run {run}: baseline pgbench conventional transaction ({load})"),
        );
        let db = self.db_name("pgwrites", run);
        self.fresh_db(&db)?;
        let (services0, machine0) = (ServiceTicks::now(), MachineTicks::now()?);
        let out = format!("writes-pgbench-{run}.txt");
        let pgbench = self.pgbench(&out, &db, "bench/conventional.sql", "")?;
        r.pg_machine_busy_pct = MachineTicks::now()?.since(machine0).busy_pct();
        // Read once pgbench's backends are gone, so that their whole time is counted.
        self.sessions_closed(&db)?;
        let services = ServiceTicks::now().since(services0);
        let machine = MachineTicks::now()?.since(machine0);
        let [tps, latency, failed, transactions] = pgbench;
        (r.pg_tps, r.pg_latency_ms, r.pg_failed) = (tps, latency, failed);
        let transactions = transactions.map_or(0, |n| n.value as i64);
        [r.pg_cost, _] = service_costs(services, transactions, "pgbench");
        if services.is_some() {
            r.pg_machine_cost = seconds_per_1000(machine.work, transactions);
        }
        self.h.pg.drop_db(&db)?;
        let mut run = Run::from(r);
        run.fill(wrk);
        Ok(run)
    }

    /// The writes' load again on a fresh database, first with the broker unreachable (the
    /// relays publish nothing: what a write costs without its delivery), then delivered by a
    /// daemon that reaches the broker (what the delivery costs alone).
    fn write_then_deliver(
        &self,
        run: u32,
        exchange: &str,
        r: &mut WritesRun,
    ) -> anyhow::Result<()> {
        let db = self.db_name("writes_alone", run);
        let what = "the same writes with the broker unreachable, then delivered";
        log(TAG, &format!("run {run}: {what}"));
        self.fresh_db(&db)?;
        let daemon_log = format!("daemon-writes-alone-{run}.log");
        let mut daemon = self.start(&db, exchange, UNREACHABLE_AMQP, &daemon_log, true)?;
        let services0 = ServiceTicks::now();
        let t0 = daemon.cpu_ticks()?;
        let nonce = format!("{}{run}alone", self.run_id);
        let wrk = self.unique_key_writes(&format!("writes-alone-{run}.wrk"), nonce)?;
        let t1 = daemon.cpu_ticks()?;
        daemon.stop(TAG)?;
        let services = ServiceTicks::now().since(services0);
        let [written] = self.counts(&db, ["entries"])?;
        (r.alone_rps, r.alone_p99_ms) = (wrk("rps"), wrk("p99_ms"));
        r.alone_cost_daemon = seconds_per_1000(t1 - t0, written);
        [r.alone_cost_postgres, r.alone_cost_rabbitmq] =
            service_costs(services, written, "writes alone");

        let services0 = ServiceTicks::now();
        let daemon_log = format!("daemon-deliver-{run}.log");
        let mut daemon = self.start(&db, exchange, &self.amqp, &daemon_log, false)?;
        if self.outbox_emptied(&db)? {
            let services = ServiceTicks::now().since(services0);
            let [events] = self.counts(&db, ["outbox_events"])?;
            r.delivery_cost_daemon = seconds_per_1000(daemon.cpu_ticks()?, events);
            [r.delivery_cost_postgres, r.delivery_cost_rabbitmq] =
                service_costs(services, events, "delivery");
        }
        daemon.stop(TAG)?;
        self.h.pg.drop_db(&db)
    }

    fn replays(&self, run: u32) -> anyhow::Result<Run> {
        let keys = self.s.replay_keys;
        log(
            TAG,
            &format!("run {run}: replays of {keys} keys, /healthz, pgbench PK select"),
        );
        let stage = self.stage("replays", run)?;
        let mut daemon = self.start_on(&stage, true)?;
        let url = self.s.url();
        let words =
            format!("precreate --url {url} --kind bench.replay --prefix replay- --count {keys}");
        self.helper(
            &self.h.bin.e2e,
            &words,
            &format!("replays-precreate-{run}.txt"),
        )?;
        let window = Window::open(&daemon)?;
        let env = [("BENCH_REPLAY_KEYS", keys.to_string())];
        let wrk = self.wrk(&format!("replays-{run}.wrk"), "bench/replay.lua", "/", &env)?;
        let [cpu_cores, rss_mb] = window.close(&daemon)?;
        let out = format!("healthz-{run}.wrk");
        let healthz = self.wrk(&out, "bench/healthz.lua", "/healthz", &[])?;
        // The same requests to the route that only reads them and answers a replay's bytes.
        let answer_bytes = replay_answer_bytes(&url)?;
        let env = [
            ("BENCH_REPLAY_KEYS", keys.to_string()),
            ("BENCH_SAME_BYTES", answer_bytes.to_string()),
        ];
        let out = format!("same-bytes-{run}.wrk");
        let same_bytes = self.wrk(&out, "bench/same_bytes.lua", "/", &env)?;
        let out = format!("replays-pgbench-{run}.txt");
        let keys = format!("-D keys={keys}");
        let [pg_tps, pg_latency_ms, ..] =
            self.pgbench(&out, &stage.db, "bench/replay_select.sql", &keys)?;
        let mut r = ReplaysRun {
            cpu_cores,
            rss_mb,
            pg_tps,
            pg_latency_ms,
            rss_mb_after_all: mib(daemon.status_kb("VmHWM")?),
            ..ReplaysRun::default()
        };
        [r.log_problems, r.shutdown_log_problems] = self.stop(&mut daemon)?;
        r.entries = Some(Num::int(self.counts(&stage.db, ["entries"])?[0]));
        self.unstage(stage)?;
        let mut run = Run::from(r);
        run.fill(wrk);
        run.fill(|metric| healthz(metric.strip_prefix("healthz_")?));
        run.fill(|metric| same_bytes(metric.strip_prefix("same_bytes_")?));
        run.fill(|metric| (metric == "answer_bytes").then(|| Num::int(answer_bytes as i64)));
        Ok(run)
    }

    fn storm(&self, run: u32) -> anyhow::Result<Run> {
        let (keys, connections) = (self.s.storm_keys, self.s.connections);
        log(
            TAG,
            &format!("run {run}: duplicate storm ({connections} connections, {keys} keys)"),
        );
        let stage = self.stage("storm", run)?;
        let mut daemon = self.start_on(&stage, true)?;
        let window = Window::open(&daemon)?;
        let env = [("BENCH_STORM_KEYS", keys.to_string())];
        let wrk = self.wrk(&format!("storm-{run}.wrk"), "bench/storm.lua", "/", &env)?;
        let [cpu_cores, rss_mb] = window.close(&daemon)?;
        let mut r = StormRun {
            cpu_cores,
            rss_mb,
            ..StormRun::default()
        };
        [r.log_problems, r.shutdown_log_problems] = self.stop(&mut daemon)?;
        let tables = ["entries", "idempotency_records", "outbox_events"];
        let counts = self.counts(&stage.db, tables)?;
        let ok = counts.iter().all(|count| *count == i64::from(keys));
        if !ok {
            let [entries, records, events] = counts;
            log(TAG, &format!("FAIL: storm run {run}: entries={entries} records={records} events={events}, expected {keys} each"));
        }
        [r.entries, r.records, r.events] = counts.map(|count| Some(Num::int(count)));
        r.count_ok = Some(Num::flag(ok));
        self.unstage(stage)?;
        let mut run = Run::from(r);
        run.fill(wrk);
        Ok(run)
    }

    fn drain(&self, run: u32) -> anyhow::Result<Run> {
        let events = self.s.drain_events;
        log(TAG, &format!("run {run}: outbox drain of {events} events"));
        let mut r = self.drained("drain", run, 0)?;
        self.publisher_baseline(run, r.payload_bytes.clone(), &mut r)?;
        Ok(r.into())
    }

    /// The drain's backlog, as writes of `ordering_keys` keys in turn unless that is 0, on a
    /// fresh stage, drained by a daemon started on it: its figures (and, ordered, whether every
    /// key went out in order), the stage removed after.
    fn drained(&self, scenario: &str, run: u32, ordering_keys: u32) -> anyhow::Result<DrainRun> {
        let events = self.s.drain_events;
        let stage = self.stage(scenario, run)?;
        let backlog = BACKLOG_SQL.replace(":events", &events.to_string());
        let ordered = match ordering_keys {
            0 => String::new(),
            keys => ORDERED_BACKLOG_SQL.replace(":keys", &keys.to_string()),
        };
        let pg = &self.h.pg;
        pg.query(
            &stage.db,
            &format!("{backlog}\n{ordered}\nANALYZE outbox_events;"),
        )?;
        let payload = pg.number(&stage.db, PAYLOAD_SQL)?;
        let expected = i64::try_from(events)?;
        let (start_ns, services0) = (unix_ns(), ServiceTicks::now());
        let mut daemon = self.start_on(&stage, false)?;
        // The window opens just before the daemon is spawned: all its CPU time is in it.
        let window = Window {
            ticks: 0,
            unix_ns: start_ns,
        };
        let words = format!(
            "wait-drained --db {} --start-unix-ns {start_ns}",
            pg.url(&stage.db)
        );
        let drained = self
            .helper(
                &self.h.bin.publisher,
                &words,
                &format!("{}.txt", stage.name),
            )
            .with_context(|| format!("the backlog did not drain; see {}", daemon.log.display()))?;
        let cpu_cores = window.cores(&daemon)?;
        let services = ServiceTicks::now().since(services0);
        daemon.wait_healthy()?;
        let seconds = field(&drained, "seconds");
        let mut r = DrainRun {
            payload_bytes: payload,
            cpu_cores,
            rss_mb: mib(daemon.status_kb("VmHWM")?),
            events_per_s: seconds
                .as_ref()
                .and_then(|s| Num::fixed(events as f64 / s.value, 1)),
            seconds,
            ..DrainRun::default()
        };
        [_, r.rabbitmq_cost] = service_costs(services, expected, scenario);
        [r.log_problems, r.shutdown_log_problems] = self.stop(&mut daemon)?;
        r.queued = self.h.broker.count(&stage.queue, expected, 15)?;
        let queued_ok = r.queued.as_ref().map(|n| n.value) == Some(events as f64);
        r.queued_ok = Some(Num::flag(queued_ok));
        if !queued_ok {
            let queued = r.queued.as_ref().map_or("?".into(), |n| n.text.clone());
            log(
                TAG,
                &format!(
                    "FAIL: {scenario} run {run}: the queue holds {queued} messages, expected {events}"
                ),
            );
        }
        if ordering_keys > 0 {
            // Whether every key went out in order too.
            r.queued_ok = Some(Num::flag(queued_ok && self.in_order(&stage.db, scenario)?));
        }
        self.unstage(stage)?;
        Ok(r)
    }

    /// The drain's baseline: the plain lapin publisher sends as many messages, of the size of
    /// the drain's events, to an exchange and queue of its own.
    fn publisher_baseline(
        &self,
        run: u32,
        payload: Option<Num>,
        r: &mut DrainRun,
    ) -> anyhow::Result<()> {
        let events = self.s.drain_events;
        let expected = i64::try_from(events)?;
        let payload = payload.map_or("400".to_owned(), |n| n.text);
        let window = self.s.publish_window;
        let baseline = format!("{events} messages of {payload} bytes, window {window}");
        log(
            TAG,
            &format!("run {run}: baseline plain lapin publisher ({baseline})"),
        );
        let exchange = format!("retrysafe.bench.{}.publisher.{run}", self.run_id);
        let queue = format!("{exchange}.q");
        self.h.broker.bind(&self.h.cleanup, &exchange, &queue)?;
        let services0 = ServiceTicks::now();
        let words = format!(
            "publish --exchange {exchange} --count {events} --payload-bytes {payload} --window {window}"
        );
        let out = format!("publisher-{run}.txt");
        let published = self.helper(&self.h.bin.publisher, &words, &out)?;
        let services = ServiceTicks::now().since(services0);
        [_, r.pub_rabbitmq_cost] = service_costs(services, expected, "publisher");
        r.pub_events_per_s = field(&published, "events_per_s");
        r.pub_queued = self.h.broker.count(&queue, expected, 15)?;
        self.h.broker.delete(&exchange, &queue)?;
        Ok(())
    }

    fn e2e(&self, run: u32) -> anyhow::Result<Run> {
        let (rate, seconds) = (self.s.e2e_rate, self.s.e2e_seconds);
        log(
            TAG,
            &format!("run {run}: end-to-end latency at {rate} requests/s for {seconds}s"),
        );
        let (r, result, _) = self.end_to_end("e2e", run, 0)?;
        // The rest of the run's metrics are bench-e2e's figures of the same names.
        let mut run = Run::from(r);
        run.fill(|metric| field(&result, metric));
        Ok(run)
    }

    /// `bench-e2e run` against a daemon on a fresh stage, writes of `ordering_keys` keys in
    /// turn (0: none): the daemon's figures, bench-e2e's, and whether the keys' events went out
    /// in order (true without keys).
    fn end_to_end(
        &self,
        scenario: &str,
        run: u32,
        ordering_keys: u32,
    ) -> anyhow::Result<(E2eRun, Map<String, Value>, bool)> {
        let (rate, seconds) = (self.s.e2e_rate, self.s.e2e_seconds);
        let stage = self.stage(scenario, run)?;
        let mut daemon = self.start_on(&stage, true)?;
        let window = Window::open(&daemon)?;
        let (url, queue) = (self.s.url(), &stage.queue);
        let words = format!(
            "run --url {url} --queue {queue} --rate {rate} --seconds {seconds} --ordering-keys {ordering_keys}"
        );
        let result = self.helper(&self.h.bin.e2e, &words, &format!("{}.txt", stage.name))?;
        let [cpu_cores, rss_mb] = window.close(&daemon)?;
        let mut r = E2eRun {
            cpu_cores,
            rss_mb,
            ..E2eRun::default()
        };
        [r.log_problems, r.shutdown_log_problems] = self.stop(&mut daemon)?;
        let in_order = ordering_keys == 0 || self.in_order(&stage.db, scenario)?;
        self.unstage(stage)?;
        Ok((r, result, in_order))
    }

    /// Whether every ordered event of `db` is in its key's order (see [`ORDER_BROKEN_SQL`]),
    /// and there are some; a log line if not.
    fn in_order(&self, db: &str, scenario: &str) -> anyhow::Result<bool> {
        let broken = self.h.pg.count(db, ORDER_BROKEN_SQL)?;
        match broken {
            0 => return Ok(true),
            -1 => log(TAG, &format!("FAIL: {scenario}: no ordered event")),
            _ => log(
                TAG,
                &format!("FAIL: {scenario}: {broken} ordered events out of order"),
            ),
        }
        Ok(false)
    }

    /// Ordered delivery with [`ORDERING_KEYS`] keys: the writes' load, the drain's backlog and
    /// the end-to-end load, each on a fresh stage with a daemon of its own, every key's order
    /// checked after each. Their baselines are the writes', drain's and e2e's unordered figures
    /// of the same run.
    fn ordered(&self, run: u32) -> anyhow::Result<Run> {
        let (keys, connections, duration) =
            (self.s.ordering_keys, self.s.connections, self.s.duration);
        log(
            TAG,
            &format!(
                "run {run}: writes of {keys} ordering keys (wrk -c{connections}, {duration}s)"
            ),
        );
        let stage = self.stage("ordered", run)?;
        let mut daemon = self.start_on(&stage, true)?;
        let window = Window::open(&daemon)?;
        let env = [
            ("BENCH_NONCE", format!("{}{run}ordered", self.run_id)),
            ("BENCH_ORDERING_KEYS", keys.to_string()),
        ];
        let out = format!("ordered-{run}.wrk");
        let wrk = self.wrk(&out, "bench/unique_keys.lua", "/", &env)?;
        let [cpu_cores, rss_mb] = window.close(&daemon)?;
        let emptied = self.outbox_emptied(&stage.db)?;
        let mut r = OrderedRun {
            cpu_cores,
            rss_mb,
            ..OrderedRun::default()
        };
        let [writes_log, writes_shutdown_log] = self.stop(&mut daemon)?;
        let [entries] = self.counts(&stage.db, ["entries"])?;
        let value = |metric| wrk(metric).map_or(0.0, |n| n.value) as i64;
        r.entries = Some(Num::int(entries));
        r.entries_minus_2xx = Some(Num::int(
            entries - (value("requests") - value("status_errors")),
        ));
        r.order_ok = Some(Num::flag(
            emptied && self.in_order(&stage.db, "ordered writes")?,
        ));
        self.unstage(stage)?;

        let events = self.s.drain_events;
        log(
            TAG,
            &format!("run {run}: ordered drain of {events} events, {keys} keys"),
        );
        let drain = self.drained("ordered_drain", run, keys)?;
        (r.drain_seconds, r.drain_events_per_s) = (drain.seconds, drain.events_per_s);
        (r.drain_queued, r.drain_order_ok) = (drain.queued, drain.queued_ok);

        let rate = self.s.e2e_rate;
        log(
            TAG,
            &format!("run {run}: end-to-end at {rate} requests/s, {keys} ordering keys"),
        );
        let (e2e, result, e2e_in_order) = self.end_to_end("ordered_e2e", run, keys)?;
        let writes_in_order = r.order_ok.as_ref().is_some_and(|ok| ok.value == 1.0);
        r.order_ok = Some(Num::flag(writes_in_order && e2e_in_order));
        let problems = [
            [writes_log, writes_shutdown_log],
            [drain.log_problems, drain.shutdown_log_problems],
            [e2e.log_problems, e2e.shutdown_log_problems],
        ];
        [r.log_problems, r.shutdown_log_problems] = [0, 1].map(|i| {
            let lines = problems
                .iter()
                .map(|p| p[i].as_ref().map_or(0.0, |n| n.value));
            Some(Num::int(lines.sum::<f64>() as i64))
        });
        let mut run = Run::from(r);
        run.fill(wrk);
        run.fill(|metric| field(&result, metric.strip_prefix("e2e_")?));
        Ok(run)
    }
}

impl Bench {
    /// Writes and the conventional transaction with PostgreSQL further away: for each delay of
    /// `LINK_DELAYS_MS`, through a `bench-delay-proxy` that adds it to every round trip.
    fn latency(&self, run: u32) -> anyhow::Result<Run> {
        let mut r = Run::from(LatencyRun::default());
        let (mut rss, mut problems) = (0.0f64, [0i64; 2]);
        for delay in LINK_DELAYS_MS {
            let [cores, peak, under_load, after] = self.over_link(run, delay, &mut r)?;
            if delay == 0 {
                r.set("cpu_cores", cores);
            }
            rss = rss.max(peak.map_or(0.0, |n| n.value));
            for (sum, lines) in problems.iter_mut().zip([under_load, after]) {
                *sum += lines.map_or(0, |n| n.value as i64);
            }
        }
        r.set("rss_mb", Num::fixed(rss, 1));
        r.set("log_problems", Some(Num::int(problems[0])));
        r.set("shutdown_log_problems", Some(Num::int(problems[1])));
        Ok(r)
    }

    /// One delay of [`latency`](Self::latency): fills the `d<delay>_` metrics of `r`; returns the
    /// daemon's cores and peak RSS while wrk ran, and its WARN/ERROR lines (under load, after
    /// SIGTERM).
    fn over_link(&self, run: u32, delay: u32, r: &mut Run) -> anyhow::Result<[Option<Num>; 4]> {
        let (connections, duration) = (self.s.connections, self.s.duration);
        log(
            TAG,
            &format!("run {run}: unique-key writes with {delay} ms added to every round trip to PostgreSQL (wrk -c{connections}, {duration}s), then pgbench through the same link"),
        );
        let metric = |name: &str| format!("d{delay}_{name}");
        let stage = self.stage(&format!("latency{delay}"), run)?;
        let mut proxy = DelayProxy::start(
            &self.h.bin.publisher.with_file_name("bench-delay-proxy"),
            delay,
            self.path(&format!("proxy-{delay}-{run}.txt")),
        )?;
        let round_trip =
            self.round_trip(&proxy, &stage.db, &format!("round-trip-{delay}-{run}.txt"))?;
        r.set(&metric("round_trip_ms"), round_trip.clone());

        let spec = DaemonSpec {
            config: &self.s.config,
            port: self.s.port,
            db_url: proxy.url(&stage.db),
            amqp: &self.amqp,
            exchange: &stage.exchange,
            log: self.path(&format!("daemon-{}.log", stage.name)),
        };
        let mut daemon = self.h.start(spec, true)?;
        let window = Window::open(&daemon)?;
        let sends_before = proxy.sends()?;
        let nonce = format!("{}l{delay}r{run}", self.run_id);
        let wrk = self.unique_key_writes(&format!("latency-{delay}-{run}.wrk"), nonce)?;
        let sends = proxy.sends()? - sends_before;
        let [cores, peak] = window.close(&daemon)?;
        let (per_batch, ms_per_batch) = writer_batches(&self.s.url())?;
        let [under_load, after] = self.stop(&mut daemon)?;
        for name in ["rps", "p50_ms", "p99_ms", "errors"] {
            r.set(&metric(name), wrk(name));
        }
        let p50 = wrk("p50_ms").map(|n| n.value);
        let trips = p50
            .zip(round_trip.map(|n| n.value))
            .map(|(p50, trip)| p50 / trip);
        r.set(
            &metric("p50_round_trips"),
            trips.and_then(|t| Num::fixed(t, 2)),
        );
        r.set(&metric("writes_per_batch"), per_batch);
        r.set(&metric("ms_per_batch"), ms_per_batch);
        let writes = wrk("requests").map_or(0.0, |n| n.value);
        r.set(&metric("sends_per_write"), per(sends, writes));
        self.unstage(stage)?;

        let db = self.db_name(&format!("pglatency{delay}"), run);
        self.fresh_db(&db)?;
        let sends_before = proxy.sends()?;
        let out = format!("latency-pgbench-{delay}-{run}.txt");
        // pgbench opens its connections, then prepares each client's statements, one client
        // after another on each of its threads: seconds at 20 ms, all in its -T. It runs that
        // much longer, and its figures are the medians of its last `duration` per-second
        // reports.
        let link = format!("-P 1 -h 127.0.0.1 -p {}", proxy.port);
        let seconds = duration + PGBENCH_WARM_UP_SECONDS;
        let text = self.pgbench_output(&out, &db, "bench/conventional.sql", &link, seconds)?;
        let sends = proxy.sends()? - sends_before;
        let [tps, latency] = pgbench_steady(&text, duration);
        r.set(&metric("pg_tps"), tps);
        r.set(&metric("pg_latency_ms"), latency);
        let [_, _, _, transactions] = pgbench_figures(&text);
        let transactions = transactions.map_or(0.0, |n| n.value);
        r.set(
            &metric("pg_sends_per_transaction"),
            per(sends, transactions),
        );
        self.h.pg.drop_db(&db)?;
        Ok([cores, peak, under_load, after])
    }

    /// The link's round trip as one client sees it: the average latency of pgbench's single
    /// client sending `SELECT 1` through the proxy for 3 s.
    fn round_trip(&self, proxy: &DelayProxy, db: &str, out: &str) -> anyhow::Result<Option<Num>> {
        let script = self.path("select-1.sql");
        fs::write(&script, "SELECT 1;\n")?;
        let port = proxy.port.to_string();
        let mut command = Command::new("pgbench");
        command
            .args([
                "-n",
                "-M",
                "prepared",
                "-c",
                "1",
                "-T",
                "3",
                "-h",
                "127.0.0.1",
                "-p",
            ])
            .arg(&port)
            .arg("-f")
            .arg(&script)
            .arg(db);
        let text = run_ok(&mut command, &self.path(out), "pgbench SELECT 1")?;
        let [_, latency, _, _] = pgbench_figures(&text);
        Ok(latency)
    }
}

/// How much longer than the others the latency scenario runs pgbench (see `Bench::over_link`).
const PGBENCH_WARM_UP_SECONDS: u32 = 6;

/// The medians of pgbench's last `seconds` per-second reports (`-P 1`), tps and latency (ms), the
/// reports before its first transaction and its first partial second left out.
fn pgbench_steady(text: &str, seconds: u32) -> [Option<Num>; 2] {
    let reports: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("progress: ")?;
            let words: Vec<&str> = rest.split_whitespace().collect();
            // progress: 7.0 s, 512.0 tps, lat 124.650 ms stddev 10.123, 0 failed
            let tps = words.get(2)?.parse().ok()?;
            let latency = words.get(5)?.parse().ok()?;
            Some((tps, latency))
        })
        .skip_while(|(tps, _)| *tps == 0.0)
        .skip(1)
        .collect();
    let steady = &reports[reports.len().saturating_sub(seconds as usize)..];
    let median = |pick: fn(&(f64, f64)) -> f64| {
        let values: Vec<Option<Num>> = steady.iter().map(|r| Num::fixed(pick(r), 1)).collect();
        crate::stats::median(&values).and_then(|v| Num::fixed(v, 1))
    };
    [median(|r| r.0), median(|r| r.1)]
}

/// `count` per `of`, two decimals; None when `of` is 0.
fn per(count: i64, of: f64) -> Option<Num> {
    (of > 0.0)
        .then(|| Num::fixed(count as f64 / of, 2))
        .flatten()
}

/// The writers' batches so far, from the daemon's /metrics: writes per batch, and ms per batch
/// transaction.
fn writer_batches(url: &str) -> anyhow::Result<(Option<Num>, Option<Num>)> {
    let output = Command::new("curl")
        .args(["-sf", "--max-time", "10", &format!("{url}/metrics")])
        .output()?;
    if !output.status.success() {
        bail!("cannot read {url}/metrics");
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let value = |name: &str| {
        text.lines()
            .find_map(|line| {
                line.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    let batches = value("retrysafe_writer_batch_size_count");
    let transactions = value("retrysafe_writer_transaction_seconds_count");
    let per_batch = (batches > 0.0).then(|| value("retrysafe_writer_batch_size_sum") / batches);
    let ms = (transactions > 0.0)
        .then(|| 1000.0 * value("retrysafe_writer_transaction_seconds_sum") / transactions);
    Ok((
        per_batch.and_then(|v| Num::fixed(v, 1)),
        ms.and_then(|v| Num::fixed(v, 1)),
    ))
}

/// `bench-delay-proxy` (bench/delay_proxy.rs) in front of PostgreSQL (PGHOST:PGPORT), adding its
/// delay to every round trip through it; stopped when dropped.
struct DelayProxy {
    child: std::process::Child,
    port: u16,
    out: PathBuf,
    /// The `BENCH_RESULT` lines asked for so far.
    reports: usize,
}

impl DelayProxy {
    fn start(binary: &Path, delay_ms: u32, out: PathBuf) -> anyhow::Result<DelayProxy> {
        if !binary.is_file() {
            bail!(
                "{} is missing: build with cargo build --release --example bench-delay-proxy",
                binary.display()
            );
        }
        let host = std::env::var("PGHOST").unwrap_or_else(|_| "127.0.0.1".into());
        let port = std::env::var("PGPORT").unwrap_or_else(|_| "5432".into());
        let child = Command::new(binary)
            .args(["--target", &format!("{host}:{port}")])
            .args(["--delay-ms", &delay_ms.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(fs::File::create(&out)?)
            .stderr(append(&out)?)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut proxy = DelayProxy {
            child,
            port: 0,
            out,
            reports: 0,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = fs::read_to_string(&proxy.out).unwrap_or_default();
            if let Some(port) = text
                .lines()
                .find_map(|line| line.strip_prefix("LISTENING "))
            {
                proxy.port = port.trim().parse()?;
                return Ok(proxy);
            }
            if Instant::now() > deadline {
                bail!(
                    "bench-delay-proxy did not listen within 10 s; see {}",
                    proxy.out.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The URL of `db` through the proxy.
    fn url(&self, db: &str) -> String {
        let user = std::env::var("PGUSER").unwrap_or_else(|_| "postgres".into());
        format!("postgres://{user}@127.0.0.1:{}/{db}", self.port)
    }

    /// The client's sends the proxy forwarded so far (SIGUSR1 makes it print them).
    fn sends(&mut self) -> anyhow::Result<i64> {
        send_signal(self.child.id(), libc::SIGUSR1);
        self.reports += 1;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = fs::read_to_string(&self.out).unwrap_or_default();
            let results: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("BENCH_RESULT "))
                .collect();
            if results.len() >= self.reports {
                let result = result_line(results[self.reports - 1], "BENCH_RESULT")?;
                return field(&result, "sends")
                    .map(|n| n.value as i64)
                    .context("bench-delay-proxy printed no sends");
            }
            if Instant::now() > deadline {
                bail!(
                    "bench-delay-proxy did not report within 10 s; see {}",
                    self.out.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ensure_tools() -> anyhow::Result<()> {
    let mut missing = Vec::new();
    if !harness::have("wrk") {
        missing.push("wrk");
    }
    if !harness::have("pgbench") {
        // Debian ships pgbench in postgresql-client-NN (older releases: postgresql-contrib).
        missing.push("postgresql-client");
    }
    harness::apt_install(TAG, &missing)?;
    if !harness::have("pgbench") {
        harness::apt_install(TAG, &["postgresql-contrib"])?;
    }
    for tool in ["wrk", "pgbench"] {
        if !harness::have(tool) {
            bail!("{tool} is not available");
        }
    }
    Ok(())
}

fn machine(pg: &Pg, config: &str) -> Machine {
    let (cpu_model, mem_gib) = harness::cpu_and_memory();
    let show = |setting: &str| {
        pg.query("postgres", &format!("SHOW {setting}"))
            .unwrap_or_else(|_| "unknown".into())
    };
    let pgbench = harness::command_line("pgbench", &["--version"]);
    let rustc = harness::command_line("rustc", &["--version"]);
    Machine {
        cpu_model,
        nproc: harness::command_line("nproc", &[]),
        mem_gib,
        kernel: harness::command_line("uname", &["-sr"]),
        pg_version: show("server_version"),
        autovacuum: show("autovacuum"),
        rabbit_version: harness::rabbit_version(),
        wrk_version: harness::wrk_version(),
        pgbench_version: pgbench.split_whitespace().nth(2).unwrap_or("").to_owned(),
        rustc_version: if rustc.is_empty() {
            "rustc unknown".into()
        } else {
            rustc
        },
        commit: harness::commit(),
        daemon_settings: fs::read_to_string(config)
            .map(|text| quoted_settings(&text))
            .unwrap_or_default(),
    }
}

pub fn run_id() -> String {
    format!(
        "{}{:04x}",
        chrono::Local::now().format("%m%d%H%M"),
        rand::random::<u16>()
    )
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let scenarios = Scenario::list(&args.scenarios)?;
    if !Path::new(&args.config).is_file() {
        bail!("no {}", args.config);
    }
    ensure_tools()?;
    let mut bin = Binaries::beside_this_program()?;
    if let Some(daemon) = &args.daemon {
        bin.daemon = daemon.clone();
    }
    let run_id = run_id();
    let work = PathBuf::from("bench/results").join(&run_id);
    let db_prefix = format!("retrysafe_bench_{run_id}_");
    let h = Harness::new(TAG, bin, &args.amqp, work, db_prefix)?;
    let bench = Bench {
        s: args.settings(&h.pg),
        h,
        run_id,
        setup_sql: args.setup_sql.clone().filter(|sql| !sql.trim().is_empty()),
        amqp: args.amqp.clone(),
    };
    bench.h.finish(measure(&bench, &scenarios, &args.output))
}

fn measure(bench: &Bench, scenarios: &[Scenario], output: &Path) -> anyhow::Result<()> {
    bench.h.broker.reachable()?;
    if harness::port_in_use(bench.s.port) {
        bail!("port {} is in use; set BENCH_PORT", bench.s.port);
    }
    let machine = machine(&bench.h.pg, &bench.s.config);
    let s = &bench.s;
    let mode = if s.quick { "quick" } else { "full" };
    log(
        TAG,
        &format!(
            "run id {}; mode {mode}: {} run(s), {}s per measurement, {}-event drain",
            bench.run_id, s.runs, s.duration, s.drain_events
        ),
    );
    let mut runs: [Vec<Run>; 7] = Default::default();
    for run in 1..=s.runs {
        for scenario in scenarios {
            runs[*scenario as usize].push(bench.measure(*scenario, run)?);
        }
    }
    let report = Report {
        settings: s.clone(),
        machine,
        written_at: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        run_id: bench.run_id.clone(),
        runs,
    };
    print!("{}", report.summary());
    let existing = fs::read_to_string(output).ok();
    fs::write(output, report.render(existing.as_deref()))
        .with_context(|| format!("writing {}", output.display()))?;
    log(
        TAG,
        &format!(
            "wrote {}; raw output in {}",
            output.display(),
            bench.h.work.display()
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgbench_output() {
        let text = "transaction type: bench/conventional.sql\nnumber of transactions actually processed: 45359\nnumber of failed transactions: 0 (0.000%)\nlatency average = 21.147 ms\ninitial connection time = 70.190 ms\ntps = 3026.413026 (without initial connection time)\n";
        let texts = pgbench_figures(text).map(|figure| figure.unwrap().text);
        assert_eq!(texts, ["3026.413026", "21.147", "0", "45359"]);
        let figures = pgbench_figures("pgbench: error: connection refused\n");
        assert!(figures.iter().all(Option::is_none));
    }

    #[test]
    fn pgbench_steady_seconds() {
        let mut text = String::from("pgbench (15.20)\n");
        for (second, tps) in [0.0, 0.0, 3.0, 40.0, 500.0, 510.0, 490.0, 505.0]
            .iter()
            .enumerate()
        {
            let latency = if *tps > 100.0 { 126.0 } else { 900.0 };
            text += &format!(
                "progress: {}.0 s, {tps:.1} tps, lat {latency:.3} ms stddev 1.000, 0 failed\n",
                second + 1
            );
        }
        // The zeros and the first partial second are left out; the last three are taken.
        let [tps, latency] = pgbench_steady(&text, 3).map(|n| n.unwrap().value);
        assert_eq!((tps, latency), (505.0, 126.0));
        assert_eq!(pgbench_steady("no progress\n", 3), [None, None]);
    }

    #[test]
    fn wrk_result_line() {
        let text = "Running 5s test\nBENCH_RESULT {\"requests\":97333,\"duration_s\":15.06,\"rps\":6461.60,\"p50_ms\":8.644,\"p90_ms\":20.1,\"p99_ms\":32.912,\"mean_ms\":9.9,\"max_ms\":80.0,\"errors_connect\":0,\"errors_read\":1,\"errors_write\":0,\"errors_status\":2,\"errors_timeout\":3}\n";
        let result = result_line(text, "BENCH_RESULT").unwrap();
        let metrics = [
            "rps",
            "p50_ms",
            "p99_ms",
            "requests",
            "errors",
            "status_errors",
        ];
        let texts = metrics.map(|metric| wrk_figure(&result, metric).unwrap().text);
        assert_eq!(texts, ["6461.60", "8.644", "32.912", "97333", "6", "2"]);
        assert_eq!(wrk_figure(&result, "max_ms"), None);
    }

    #[test]
    fn settings_by_mode() {
        let pg = Pg {
            base: "postgres://postgres@127.0.0.1:5432".into(),
        };
        let mut args = RunArgs {
            quick: false,
            runs: None,
            duration: None,
            drain_events: None,
            e2e_seconds: None,
            e2e_rate: 1000,
            port: 18437,
            config: "config.toml".into(),
            output: "BENCHMARKS.md".into(),
            scenarios: "writes".into(),
            setup_sql: None,
            daemon: None,
            amqp: String::new(),
        };
        let figures = |s: Settings| (s.runs, s.duration, s.drain_events, s.e2e_seconds);
        assert_eq!(figures(args.settings(&pg)), (3, 15, 100_000, 20));
        args.quick = true;
        args.runs = Some(2);
        assert_eq!(figures(args.settings(&pg)), (2, 5, 10_000, 5));
    }
}
