//! `bench run`: the benchmark's scenarios, each side by side with its baseline, on a fresh
//! database and exchange per scenario and run, and the report they make.
//!
//! The load generators are external programs (wrk with the scripts in bench/, pgbench,
//! `bench-e2e`, `bench-publisher`); this module starts them and the daemon, reads their result
//! lines into the scenario structs of `report`, and writes the report.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{Map, Value};

use crate::harness::{
    self, append, cpu_share, field, log, mib, result_line, run_ok, run_to_file, seconds_per_1000,
    unix_ns, Binaries, Broker, Cleanup, Daemon, DaemonSpec, MachineTicks, Pg, ServiceTicks,
};
use crate::report::{
    quoted_settings, DrainRun, E2eRun, LogProblems, Machine, ReplaysRun, Report, Settings,
    StormRun, WritesRun, WrkFigures,
};
use crate::stats::Num;

const TAG: &str = "bench";
const CONNECTIONS: u32 = 64;
const WRK_THREADS: u32 = 2;
const REPLAY_KEYS: u32 = 1000;
const STORM_KEYS: u32 = 10;
const PUBLISH_WINDOW: u32 = 1000;

/// The synthetic backlog of the drain: CloudEvents shaped and sized like the daemon's own
/// entry.created. `{events}` is the number of rows.
const BACKLOG_SQL: &str = r#"
WITH e AS MATERIALIZED (
    SELECT g, gen_random_uuid() AS event_id, gen_random_uuid() AS entry_id,
           to_char(clock_timestamp() AT TIME ZONE 'utc', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS t
    FROM generate_series(1, {events}) AS g
)
INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key, event_type, payload)
SELECT e.event_id, e.entry_id::text || '/entry.created', 'anonymous', 'drain-' || e.g, 'entry.created',
       jsonb_build_object(
           'specversion', '1.0', 'id', e.event_id, 'source', '/retrysafe', 'type', 'entry.created',
           'time', e.t, 'subject', e.entry_id, 'datacontenttype', 'application/json',
           'data', jsonb_build_object(
               'id', e.entry_id, 'kind', 'bench.write', 'created_at', e.t,
               'data', jsonb_build_object('seq', 1000000 + e.g, 'amount', 1250, 'currency', 'EUR',
                                          'note', 'retrysafe benchmark payload')))
FROM e ORDER BY e.g;
ANALYZE outbox_events;"#;

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
    /// A subset of "writes replays storm drain e2e" (spaces or commas); the report shows n/a
    /// for the others.
    #[arg(
        long,
        env = "BENCH_SCENARIOS",
        default_value = "writes replays storm drain e2e"
    )]
    pub scenarios: String,
    /// SQL run on every fresh database after its migrations, e.g. "DROP INDEX
    /// entries_client_created" to measure a write without it.
    #[arg(long, env = "BENCH_SETUP_SQL")]
    pub setup_sql: Option<String>,
    #[arg(
        long,
        env = "BENCH_AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Writes,
    Replays,
    Storm,
    Drain,
    E2e,
}

impl FromStr for Scenario {
    type Err = anyhow::Error;

    fn from_str(name: &str) -> anyhow::Result<Scenario> {
        Ok(match name {
            "writes" => Scenario::Writes,
            "replays" => Scenario::Replays,
            "storm" => Scenario::Storm,
            "drain" => Scenario::Drain,
            "e2e" => Scenario::E2e,
            other => bail!("unknown scenario {other} in BENCH_SCENARIOS"),
        })
    }
}

pub fn parse_scenarios(list: &str) -> anyhow::Result<Vec<Scenario>> {
    list.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|name| !name.is_empty())
        .map(Scenario::from_str)
        .collect()
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
            port: self.port,
            config: self.config.clone(),
            pg_base: pg.base.clone(),
        }
    }
}

/// Everything a scenario needs.
struct Bench {
    s: Settings,
    bin: Binaries,
    pg: Pg,
    broker: Broker,
    cleanup: Arc<Cleanup>,
    work: PathBuf,
    run_id: String,
    setup_sql: Option<String>,
    amqp: String,
}

impl WrkFigures {
    fn from_result(map: &Map<String, Value>) -> WrkFigures {
        let errors: Option<i64> = [
            "errors_connect",
            "errors_read",
            "errors_write",
            "errors_status",
            "errors_timeout",
        ]
        .iter()
        .map(|key| field(map, key).map(|n| n.value as i64))
        .sum();
        WrkFigures {
            rps: field(map, "rps"),
            p50_ms: field(map, "p50_ms"),
            p99_ms: field(map, "p99_ms"),
            requests: field(map, "requests"),
            errors: errors.map(Num::int),
            status_errors: field(map, "errors_status"),
        }
    }
}

/// What pgbench printed of a run.
#[derive(Debug, Default)]
pub struct PgbenchFigures {
    pub tps: Option<Num>,
    pub latency_ms: Option<Num>,
    pub failed: Option<Num>,
    /// Transactions done ("number of transactions actually processed").
    pub transactions: Option<Num>,
}

/// pgbench's figures, from its output.
pub fn pgbench_figures(text: &str) -> PgbenchFigures {
    let word = |prefix: &str, index: usize| {
        text.lines()
            .rev()
            .find(|line| line.starts_with(prefix))
            .and_then(|line| line.split_whitespace().nth(index))
            .and_then(Num::parse)
    };
    PgbenchFigures {
        tps: word("tps = ", 2),
        latency_ms: word("latency average = ", 3),
        failed: word("number of failed transactions:", 4),
        transactions: word("number of transactions actually processed:", 5),
    }
}

const UNSENT_SQL: &str = "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL";

/// 1 while an event is unsent, else 0: a few milliseconds at most (0.8-4.6 ms measured at
/// 60,000-120,000 unsent events), where counting them costs PostgreSQL 45-70 ms. Polled every
/// 100 ms, the count took a large share of the CPU whose use it was there to measure.
const ANY_UNSENT_SQL: &str =
    "SELECT count(*) FROM (SELECT 1 FROM outbox_events WHERE sent_at IS NULL LIMIT 1) AS unsent";

/// How long the writes scenario waits for its backlog of events to be published.
const EMPTY_OUTBOX_WAIT: Duration = Duration::from_secs(120);

/// A broker URL nothing listens on (port 1 of loopback): the daemon serves writes, and its
/// relays, never connected, claim nothing.
const UNREACHABLE_AMQP: &str = "amqp://guest:guest@127.0.0.1:1/%2f";

/// No service CPU figure: a reading went down, as after a server restart.
fn went_down(scenario: &str) -> Option<ServiceTicks> {
    log(
        TAG,
        &format!("{scenario}: PostgreSQL's or RabbitMQ's CPU time went down during the run (restarted?): no CPU cost"),
    );
    None
}

/// PostgreSQL's and RabbitMQ's CPU seconds per 1,000 `operations`, from the ticks they used
/// meanwhile (None if a reading went down, which is logged).
fn service_costs(
    services: Option<ServiceTicks>,
    operations: i64,
    scenario: &str,
) -> (Option<Num>, Option<Num>) {
    match services.or_else(|| went_down(scenario)) {
        Some(services) => (
            seconds_per_1000(services.postgres, operations),
            seconds_per_1000(services.rabbitmq, operations),
        ),
        None => (None, None),
    }
}

fn count_num(value: i64) -> Option<Num> {
    Some(Num::int(value))
}

impl Bench {
    fn path(&self, name: &str) -> PathBuf {
        self.work.join(name)
    }

    /// Drops the database if present, creates and migrates it with `retrysafe migrate`, then
    /// runs BENCH_SETUP_SQL on it.
    fn fresh_db(&self, db: &str) -> anyhow::Result<()> {
        self.pg.drop_db(db)?;
        let log = self.path("migrate.log");
        let status = Command::new(&self.bin.daemon)
            .args(["migrate", "--config", &self.s.config])
            .env("RETRYSAFE_DATABASE__URL", self.pg.url(db))
            .env("RETRYSAFE_LOG__LEVEL", "warn")
            .stdout(append(&log)?)
            .stderr(append(&log)?)
            .status()?;
        if !status.success() {
            bail!("migrate {db} failed (see {})", log.display());
        }
        if let Some(sql) = &self.setup_sql {
            self.pg.query(db, sql)?;
        }
        Ok(())
    }

    fn start_daemon(
        &self,
        db: &str,
        exchange: &str,
        log: &str,
        wait: bool,
    ) -> anyhow::Result<Daemon> {
        self.start_daemon_with_broker(db, exchange, log, wait, &self.amqp)
    }

    /// [`start_daemon`](Self::start_daemon) with another broker URL.
    fn start_daemon_with_broker(
        &self,
        db: &str,
        exchange: &str,
        log: &str,
        wait: bool,
        amqp: &str,
    ) -> anyhow::Result<Daemon> {
        Daemon::start(
            DaemonSpec {
                binary: &self.bin.daemon,
                config: &self.s.config,
                port: self.s.port,
                db_url: self.pg.url(db),
                amqp,
                exchange,
                log: self.path(log),
            },
            &self.cleanup,
            wait,
        )
    }

    /// The standard wrk command of every HTTP scenario; its `BENCH_RESULT`.
    fn wrk(
        &self,
        out: &str,
        script: &str,
        path: &str,
        env: &[(&str, String)],
    ) -> anyhow::Result<Map<String, Value>> {
        let out = self.path(out);
        let mut command = Command::new("wrk");
        command
            .arg(format!("-t{}", self.s.wrk_threads))
            .arg(format!("-c{}", self.s.connections))
            .arg(format!("-d{}s", self.s.duration))
            .args(["--timeout", "10s", "--latency", "-s", script])
            .arg(format!("{}{path}", self.s.url()));
        for (name, value) in env {
            command.env(name, value);
        }
        let text = run_ok(&mut command, &out, "wrk")?;
        result_line(&text, "BENCH_RESULT")
            .with_context(|| format!("wrk printed no result; see {}", out.display()))
    }

    /// wrk's unique-key writes: every request with a fresh key, kept apart from other runs'
    /// keys by `nonce`.
    fn unique_key_writes(&self, out: &str, nonce: String) -> anyhow::Result<Map<String, Value>> {
        self.wrk(out, "bench/unique_keys.lua", "/", &[("BENCH_NONCE", nonce)])
    }

    /// pgbench against `db`; its output (a failure is logged, not fatal, as its figures say).
    fn pgbench(
        &self,
        out: &str,
        db: &str,
        script: &str,
        extra: &[String],
    ) -> anyhow::Result<String> {
        let out = self.path(out);
        let (c, t, d) = (self.s.connections, self.s.wrk_threads, self.s.duration);
        let mut command = Command::new("pgbench");
        command
            .args(["-n", "-M", "prepared"])
            .args([
                "-c",
                &c.to_string(),
                "-j",
                &t.to_string(),
                "-T",
                &d.to_string(),
            ])
            .args(extra)
            .args(["-f", script, db]);
        let (status, text) = run_to_file(&mut command, &out)?;
        if !status.success() {
            log(
                TAG,
                &format!("pgbench exited with {status}; see {}", out.display()),
            );
        }
        Ok(text)
    }

    /// Waits until every event of `db` was published, at most [`EMPTY_OUTBOX_WAIT`]; false
    /// (and a log line) if they were not.
    fn outbox_emptied(&self, db: &str) -> anyhow::Result<bool> {
        let deadline = Instant::now() + EMPTY_OUTBOX_WAIT;
        loop {
            if self.pg.count(db, ANY_UNSENT_SQL)? == 0 {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                let unsent = self.pg.count(db, UNSENT_SQL)?;
                log(
                    TAG,
                    &format!("{unsent} events still unsent after {EMPTY_OUTBOX_WAIT:?}: no CPU cost per write"),
                );
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits (at most 10 s) until no session is connected to `db`.
    fn sessions_closed(&self, db: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let sql = format!("SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}'");
        while self.pg.count("postgres", &sql)? > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn log_problems(daemon: &Daemon) -> LogProblems {
        let (under_load, after) = daemon.log_problems();
        LogProblems {
            under_load: Some(Num::int(under_load as i64)),
            after_sigterm: Some(Num::int(after as i64)),
        }
    }

    fn names(&self, scenario: &str, run: u32) -> (String, String) {
        (
            format!("retrysafe_bench_{}_{scenario}_{run}", self.run_id),
            format!("retrysafe.bench.{}.{scenario}.{run}", self.run_id),
        )
    }

    fn writes(&self, run: u32) -> anyhow::Result<WritesRun> {
        let (db, ex) = self.names("writes", run);
        let q = format!("{ex}.q");
        log(
            TAG,
            &format!(
                "run {run}: unique-key writes (wrk -c{}, {}s)",
                self.s.connections, self.s.duration
            ),
        );
        self.fresh_db(&db)?;
        self.broker.bind(&self.cleanup, &ex, &q)?;
        let mut daemon = self.start_daemon(&db, &ex, &format!("daemon-writes-{run}.log"), true)?;
        let (services0, machine0) = (ServiceTicks::now(), MachineTicks::now()?);
        let (t0, n0) = (daemon.cpu_ticks()?, unix_ns());
        let result = self.unique_key_writes(
            &format!("writes-{run}.wrk"),
            format!("{}{run}", self.run_id),
        )?;
        let (t1, n1) = (daemon.cpu_ticks()?, unix_ns());
        let under_load = MachineTicks::now()?.since(machine0);
        let backlog = self.pg.number(&db, UNSENT_SQL)?;
        let mut figures = WritesRun {
            cpu_cores: cpu_share(t1 - t0, n1 - n0),
            rss_mb: mib(daemon.status_kb("VmHWM")?),
            wrk: WrkFigures::from_result(&result),
            backlog_at_end: backlog,
            machine_busy_pct: under_load.busy_pct(),
            ..WritesRun::default()
        };
        // A write's cost includes publishing its event: the CPU is read once the outbox is empty.
        if self.outbox_emptied(&db)? {
            let services = ServiceTicks::now().since(services0);
            let machine = MachineTicks::now()?.since(machine0);
            let written = self.pg.count(&db, "SELECT count(*) FROM entries")?;
            figures.cost_daemon = seconds_per_1000(daemon.cpu_ticks()? - t0, written);
            (figures.cost_postgres, figures.cost_rabbitmq) =
                service_costs(services, written, "writes");
            figures.machine_cost = seconds_per_1000(machine.work, written);
        }
        daemon.stop(TAG)?;
        // Sanity: every 201 has its entry; at most the requests in flight at the end (wrk
        // closes those connections; the daemon may still commit them) and timed-out ones come
        // on top.
        let entries = self.pg.count(&db, "SELECT count(*) FROM entries")?;
        let records = self
            .pg
            .count(&db, "SELECT count(*) FROM idempotency_records")?;
        let events = self.pg.count(&db, "SELECT count(*) FROM outbox_events")?;
        let requests = figures.wrk.requests.as_ref().map_or(0.0, |n| n.value) as i64;
        let status_errors = figures.wrk.status_errors.as_ref().map_or(0.0, |n| n.value) as i64;
        figures.entries = count_num(entries);
        figures.entries_minus_2xx = count_num(entries - (requests - status_errors));
        figures.rows_consistent = Some(Num::flag(entries == records && entries == events));
        figures.payload_bytes = self.pg.number(
            &db,
            "SELECT round(avg(octet_length(payload::text))) FROM outbox_events",
        )?;
        figures.log = Self::log_problems(&daemon);
        self.pg.drop_db(&db)?;
        self.write_then_deliver(run, &ex, &mut figures)?;
        self.broker.delete(&ex, &q)?;

        log(
            TAG,
            &format!(
                "run {run}: baseline pgbench conventional transaction (-c{}, {}s)",
                self.s.connections, self.s.duration
            ),
        );
        let pdb = format!("retrysafe_bench_{}_pgwrites_{run}", self.run_id);
        self.fresh_db(&pdb)?;
        let (services0, machine0) = (ServiceTicks::now(), MachineTicks::now()?);
        let text = self.pgbench(
            &format!("writes-pgbench-{run}.txt"),
            &pdb,
            "bench/conventional.sql",
            &[],
        )?;
        let under_load = MachineTicks::now()?.since(machine0);
        // Read once pgbench's backends are gone, so that their whole time is counted.
        self.sessions_closed(&pdb)?;
        let services = ServiceTicks::now().since(services0);
        let machine = MachineTicks::now()?.since(machine0);
        figures.pg_machine_busy_pct = under_load.busy_pct();
        let pgbench = pgbench_figures(&text);
        (figures.pg_tps, figures.pg_latency_ms, figures.pg_failed) =
            (pgbench.tps, pgbench.latency_ms, pgbench.failed);
        if let (Some(transactions), Some(services)) = (
            &pgbench.transactions,
            services.or_else(|| went_down("pgbench")),
        ) {
            figures.pg_cost = seconds_per_1000(services.postgres, transactions.value as i64);
            figures.pg_machine_cost = seconds_per_1000(machine.work, transactions.value as i64);
        }
        self.pg.drop_db(&pdb)?;
        Ok(figures)
    }

    /// The writes' load again on a fresh database, first with the broker unreachable (the
    /// relays publish nothing: what a write costs without its delivery), then delivered by a
    /// daemon that reaches the broker (what the delivery costs alone).
    fn write_then_deliver(
        &self,
        run: u32,
        exchange: &str,
        figures: &mut WritesRun,
    ) -> anyhow::Result<()> {
        let (db, _) = self.names("writes_alone", run);
        log(
            TAG,
            &format!("run {run}: the same writes with the broker unreachable, then delivered"),
        );
        self.fresh_db(&db)?;
        let mut daemon = self.start_daemon_with_broker(
            &db,
            exchange,
            &format!("daemon-writes-alone-{run}.log"),
            true,
            UNREACHABLE_AMQP,
        )?;
        let services0 = ServiceTicks::now();
        let t0 = daemon.cpu_ticks()?;
        let result = self.unique_key_writes(
            &format!("writes-alone-{run}.wrk"),
            format!("{}{run}alone", self.run_id),
        )?;
        let t1 = daemon.cpu_ticks()?;
        daemon.stop(TAG)?;
        let services = ServiceTicks::now().since(services0);
        let written = self.pg.count(&db, "SELECT count(*) FROM entries")?;
        let wrk = WrkFigures::from_result(&result);
        (figures.alone_rps, figures.alone_p99_ms) = (wrk.rps, wrk.p99_ms);
        figures.alone_cost_daemon = seconds_per_1000(t1 - t0, written);
        (figures.alone_cost_postgres, figures.alone_cost_rabbitmq) =
            service_costs(services, written, "writes alone");

        let services0 = ServiceTicks::now();
        let mut daemon =
            self.start_daemon(&db, exchange, &format!("daemon-deliver-{run}.log"), false)?;
        if self.outbox_emptied(&db)? {
            let services = ServiceTicks::now().since(services0);
            let events = self.pg.count(&db, "SELECT count(*) FROM outbox_events")?;
            figures.delivery_cost_daemon = seconds_per_1000(daemon.cpu_ticks()?, events);
            (
                figures.delivery_cost_postgres,
                figures.delivery_cost_rabbitmq,
            ) = service_costs(services, events, "delivery");
        }
        daemon.stop(TAG)?;
        self.pg.drop_db(&db)?;
        Ok(())
    }

    fn replays(&self, run: u32) -> anyhow::Result<ReplaysRun> {
        let (db, ex) = self.names("replays", run);
        let q = format!("{ex}.q");
        let keys = self.s.replay_keys;
        log(
            TAG,
            &format!("run {run}: replays of {keys} keys, /healthz, pgbench PK select"),
        );
        self.fresh_db(&db)?;
        self.broker.bind(&self.cleanup, &ex, &q)?;
        let mut daemon = self.start_daemon(&db, &ex, &format!("daemon-replays-{run}.log"), true)?;
        run_ok(
            Command::new(&self.bin.e2e).args([
                "precreate",
                "--url",
                &self.s.url(),
                "--kind",
                "bench.replay",
                "--prefix",
                "replay-",
                "--count",
                &keys.to_string(),
            ]),
            &self.path(&format!("replays-precreate-{run}.txt")),
            "precreate",
        )?;
        let (t0, n0) = (daemon.cpu_ticks()?, unix_ns());
        let result = self.wrk(
            &format!("replays-{run}.wrk"),
            "bench/replay.lua",
            "/",
            &[("BENCH_REPLAY_KEYS", keys.to_string())],
        )?;
        let (t1, n1) = (daemon.cpu_ticks()?, unix_ns());
        let mut figures = ReplaysRun {
            cpu_cores: cpu_share(t1 - t0, n1 - n0),
            rss_mb: mib(daemon.status_kb("VmHWM")?),
            wrk: WrkFigures::from_result(&result),
            ..ReplaysRun::default()
        };
        let healthz = self.wrk(
            &format!("healthz-{run}.wrk"),
            "bench/healthz.lua",
            "/healthz",
            &[],
        )?;
        figures.healthz = WrkFigures::from_result(&healthz);
        let text = self.pgbench(
            &format!("replays-pgbench-{run}.txt"),
            &db,
            "bench/replay_select.sql",
            &["-D".into(), format!("keys={keys}")],
        )?;
        let pgbench = pgbench_figures(&text);
        (figures.pg_tps, figures.pg_latency_ms) = (pgbench.tps, pgbench.latency_ms);
        figures.rss_mb_after_all = mib(daemon.status_kb("VmHWM")?);
        daemon.stop(TAG)?;
        figures.entries = count_num(self.pg.count(&db, "SELECT count(*) FROM entries")?);
        figures.log = Self::log_problems(&daemon);
        self.pg.drop_db(&db)?;
        self.broker.delete(&ex, &q)?;
        Ok(figures)
    }

    fn storm(&self, run: u32) -> anyhow::Result<StormRun> {
        let (db, ex) = self.names("storm", run);
        let q = format!("{ex}.q");
        let keys = self.s.storm_keys;
        log(
            TAG,
            &format!(
                "run {run}: duplicate storm ({} connections, {keys} keys)",
                self.s.connections
            ),
        );
        self.fresh_db(&db)?;
        self.broker.bind(&self.cleanup, &ex, &q)?;
        let mut daemon = self.start_daemon(&db, &ex, &format!("daemon-storm-{run}.log"), true)?;
        let (t0, n0) = (daemon.cpu_ticks()?, unix_ns());
        let result = self.wrk(
            &format!("storm-{run}.wrk"),
            "bench/storm.lua",
            "/",
            &[("BENCH_STORM_KEYS", keys.to_string())],
        )?;
        let (t1, n1) = (daemon.cpu_ticks()?, unix_ns());
        let mut figures = StormRun {
            cpu_cores: cpu_share(t1 - t0, n1 - n0),
            rss_mb: mib(daemon.status_kb("VmHWM")?),
            wrk: WrkFigures::from_result(&result),
            ..StormRun::default()
        };
        daemon.stop(TAG)?;
        let entries = self.pg.count(&db, "SELECT count(*) FROM entries")?;
        let records = self
            .pg
            .count(&db, "SELECT count(*) FROM idempotency_records")?;
        let events = self.pg.count(&db, "SELECT count(*) FROM outbox_events")?;
        let expected = i64::from(keys);
        let ok = entries == expected && records == expected && events == expected;
        if !ok {
            log(
                TAG,
                &format!(
                    "FAIL: storm run {run}: entries={entries} records={records} events={events}, expected {keys} each"
                ),
            );
        }
        figures.entries = count_num(entries);
        figures.records = count_num(records);
        figures.events = count_num(events);
        figures.count_ok = Some(Num::flag(ok));
        figures.log = Self::log_problems(&daemon);
        self.pg.drop_db(&db)?;
        self.broker.delete(&ex, &q)?;
        Ok(figures)
    }

    fn drain(&self, run: u32) -> anyhow::Result<DrainRun> {
        let (db, ex) = self.names("drain", run);
        let q = format!("{ex}.q");
        let events = self.s.drain_events;
        log(TAG, &format!("run {run}: outbox drain of {events} events"));
        self.fresh_db(&db)?;
        self.broker.bind(&self.cleanup, &ex, &q)?;
        self.pg
            .query(&db, &BACKLOG_SQL.replace("{events}", &events.to_string()))?;
        let payload = self.pg.number(
            &db,
            "SELECT round(avg(octet_length(payload::text))) FROM outbox_events",
        )?;
        let expected = i64::try_from(events)?;
        let (n0, services0) = (unix_ns(), ServiceTicks::now());
        let mut daemon = self.start_daemon(&db, &ex, &format!("daemon-drain-{run}.log"), false)?;
        let out = self.path(&format!("drain-{run}.txt"));
        let text = run_ok(
            Command::new(&self.bin.publisher).args([
                "wait-drained",
                "--db",
                &self.pg.url(&db),
                "--start-unix-ns",
                &n0.to_string(),
            ]),
            &out,
            "the drain (bench-publisher wait-drained)",
        )
        .with_context(|| format!("the backlog did not drain; see {}", daemon.log.display()))?;
        let (t1, n1) = (daemon.cpu_ticks()?, unix_ns());
        let services = ServiceTicks::now().since(services0);
        daemon.wait_healthy()?;
        let seconds = field(&result_line(&text, "BENCH_RESULT")?, "seconds");
        let mut figures = DrainRun {
            payload_bytes: payload.clone(),
            cpu_cores: cpu_share(t1, n1 - n0),
            rss_mb: mib(daemon.status_kb("VmHWM")?),
            events_per_s: seconds
                .as_ref()
                .and_then(|s| Num::fixed(events as f64 / s.value, 1)),
            seconds,
            rabbitmq_cost: service_costs(services, expected, "drain").1,
            ..DrainRun::default()
        };
        daemon.stop(TAG)?;
        figures.queued = self.broker.count(&q, expected, 15)?;
        let queued_ok = figures.queued.as_ref().map(|n| n.value) == Some(events as f64);
        figures.queued_ok = Some(Num::flag(queued_ok));
        if !queued_ok {
            log(
                TAG,
                &format!(
                    "FAIL: drain run {run}: the queue holds {} messages, expected {events}",
                    figures
                        .queued
                        .as_ref()
                        .map_or("?".into(), |n| n.text.clone())
                ),
            );
        }
        figures.log = Self::log_problems(&daemon);
        self.pg.drop_db(&db)?;
        self.broker.delete(&ex, &q)?;

        let payload_text = payload.map_or("400".to_owned(), |n| n.text);
        log(
            TAG,
            &format!(
                "run {run}: baseline plain lapin publisher ({events} messages of {payload_text} bytes, window {})",
                self.s.publish_window
            ),
        );
        let pex = format!("retrysafe.bench.{}.publisher.{run}", self.run_id);
        let pq = format!("{pex}.q");
        self.broker.bind(&self.cleanup, &pex, &pq)?;
        let services0 = ServiceTicks::now();
        let text = run_ok(
            Command::new(&self.bin.publisher)
                .env("BENCH_AMQP_URL", &self.amqp)
                .args([
                    "publish",
                    "--exchange",
                    &pex,
                    "--count",
                    &events.to_string(),
                    "--payload-bytes",
                    &payload_text,
                    "--window",
                    &self.s.publish_window.to_string(),
                ]),
            &self.path(&format!("publisher-{run}.txt")),
            "the baseline publisher",
        )?;
        let services = ServiceTicks::now().since(services0);
        figures.pub_rabbitmq_cost = service_costs(services, expected, "publisher").1;
        figures.pub_events_per_s = field(&result_line(&text, "BENCH_RESULT")?, "events_per_s");
        figures.pub_queued = self.broker.count(&pq, expected, 15)?;
        self.broker.delete(&pex, &pq)?;
        Ok(figures)
    }

    fn e2e(&self, run: u32) -> anyhow::Result<E2eRun> {
        let (db, ex) = self.names("e2e", run);
        let q = format!("{ex}.q");
        log(
            TAG,
            &format!(
                "run {run}: end-to-end latency at {} requests/s for {}s",
                self.s.e2e_rate, self.s.e2e_seconds
            ),
        );
        self.fresh_db(&db)?;
        self.broker.bind(&self.cleanup, &ex, &q)?;
        let mut daemon = self.start_daemon(&db, &ex, &format!("daemon-e2e-{run}.log"), true)?;
        let (t0, n0) = (daemon.cpu_ticks()?, unix_ns());
        let text = run_ok(
            Command::new(&self.bin.e2e)
                .env("BENCH_AMQP_URL", &self.amqp)
                .args([
                    "run",
                    "--url",
                    &self.s.url(),
                    "--queue",
                    &q,
                    "--rate",
                    &self.s.e2e_rate.to_string(),
                    "--seconds",
                    &self.s.e2e_seconds.to_string(),
                ]),
            &self.path(&format!("e2e-{run}.txt")),
            "bench-e2e",
        )?;
        let (t1, n1) = (daemon.cpu_ticks()?, unix_ns());
        let mut figures = E2eRun {
            cpu_cores: cpu_share(t1 - t0, n1 - n0),
            rss_mb: mib(daemon.status_kb("VmHWM")?),
            ..E2eRun::default()
        };
        let result = result_line(&text, "BENCH_RESULT")?;
        for name in E2eRun::FIELDS {
            if let Some(slot) = figures.field_mut(name) {
                *slot = field(&result, name);
            }
        }
        daemon.stop(TAG)?;
        figures.log = Self::log_problems(&daemon);
        self.pg.drop_db(&db)?;
        self.broker.delete(&ex, &q)?;
        Ok(figures)
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
    let scenarios = parse_scenarios(&args.scenarios)?;
    let pg = Pg::from_env();
    let settings = args.settings(&pg);
    if !Path::new(&settings.config).is_file() {
        bail!("no {}", settings.config);
    }
    ensure_tools()?;
    let bin = Binaries::beside_this_program()?;
    pg.query("postgres", "SELECT 1")
        .with_context(|| format!("cannot reach PostgreSQL at {}", pg.base))?;
    let run_id = run_id();
    let work = PathBuf::from("bench/results").join(&run_id);
    fs::create_dir_all(&work)?;
    let cleanup = Cleanup::new(
        TAG,
        pg.clone(),
        bin.publisher.clone(),
        format!("retrysafe_bench_{run_id}_"),
    );
    cleanup.on_signals()?;
    let broker = Broker {
        publisher: bin.publisher.clone(),
        amqp: args.amqp.clone(),
    };
    let bench = Bench {
        s: settings,
        bin,
        pg,
        broker,
        cleanup: cleanup.clone(),
        work: work.clone(),
        run_id,
        setup_sql: args.setup_sql.clone().filter(|sql| !sql.trim().is_empty()),
        amqp: args.amqp.clone(),
    };
    let result = measure(&bench, &scenarios, &args.output);
    cleanup.finish();
    if let Err(error) = &result {
        log(
            TAG,
            &format!("ERROR: {error:#}; raw output in {}", work.display()),
        );
    }
    result
}

fn measure(bench: &Bench, scenarios: &[Scenario], output: &Path) -> anyhow::Result<()> {
    bench.broker.reachable()?;
    if harness::port_in_use(bench.s.port) {
        bail!("port {} is in use; set BENCH_PORT", bench.s.port);
    }
    let machine = machine(&bench.pg, &bench.s.config);
    log(
        TAG,
        &format!(
            "run id {}; mode {}: {} run(s), {}s per measurement, {}-event drain",
            bench.run_id,
            if bench.s.quick { "quick" } else { "full" },
            bench.s.runs,
            bench.s.duration,
            bench.s.drain_events
        ),
    );
    let mut report = Report {
        settings: bench.s.clone(),
        machine,
        written_at: String::new(),
        run_id: bench.run_id.clone(),
        writes: Vec::new(),
        replays: Vec::new(),
        storm: Vec::new(),
        drain: Vec::new(),
        e2e: Vec::new(),
    };
    for run in 1..=bench.s.runs {
        for scenario in scenarios {
            match scenario {
                Scenario::Writes => report.writes.push(bench.writes(run)?),
                Scenario::Replays => report.replays.push(bench.replays(run)?),
                Scenario::Storm => report.storm.push(bench.storm(run)?),
                Scenario::Drain => report.drain.push(bench.drain(run)?),
                Scenario::E2e => report.e2e.push(bench.e2e(run)?),
            }
        }
    }
    report.written_at = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string();
    print!("{}", report.summary());
    let existing = fs::read_to_string(output).ok();
    fs::write(output, report.render(existing.as_deref()))
        .with_context(|| format!("writing {}", output.display()))?;
    log(
        TAG,
        &format!(
            "wrote {}; raw output in {}",
            output.display(),
            bench.work.display()
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_lists() {
        assert_eq!(
            parse_scenarios("writes replays storm drain e2e").unwrap(),
            [
                Scenario::Writes,
                Scenario::Replays,
                Scenario::Storm,
                Scenario::Drain,
                Scenario::E2e
            ]
        );
        assert_eq!(
            parse_scenarios(" drain,writes ").unwrap(),
            [Scenario::Drain, Scenario::Writes]
        );
        assert!(parse_scenarios("writes reads").is_err());
    }

    #[test]
    fn pgbench_output() {
        let text = "transaction type: bench/conventional.sql\nnumber of transactions actually processed: 45359\nnumber of failed transactions: 0 (0.000%)\nlatency average = 21.147 ms\ninitial connection time = 70.190 ms\ntps = 3026.413026 (without initial connection time)\n";
        let figures = pgbench_figures(text);
        assert_eq!(figures.tps.unwrap().text, "3026.413026");
        assert_eq!(figures.latency_ms.unwrap().text, "21.147");
        assert_eq!(figures.failed.unwrap().text, "0");
        assert_eq!(figures.transactions.unwrap().text, "45359");
        let figures = pgbench_figures("pgbench: error: connection refused\n");
        assert!(figures.tps.is_none() && figures.latency_ms.is_none() && figures.failed.is_none());
        assert!(figures.transactions.is_none());
    }

    #[test]
    fn wrk_result_line() {
        let text = "Running 5s test\nBENCH_RESULT {\"requests\":97333,\"duration_s\":15.06,\"rps\":6461.60,\"p50_ms\":8.644,\"p90_ms\":20.1,\"p99_ms\":32.912,\"mean_ms\":9.9,\"max_ms\":80.0,\"errors_connect\":0,\"errors_read\":1,\"errors_write\":0,\"errors_status\":2,\"errors_timeout\":3}\n";
        let figures = WrkFigures::from_result(&result_line(text, "BENCH_RESULT").unwrap());
        assert_eq!(figures.rps.unwrap().text, "6461.60");
        assert_eq!(figures.p99_ms.unwrap().text, "32.912");
        assert_eq!(figures.errors.unwrap().text, "6");
        assert_eq!(figures.status_errors.unwrap().text, "2");
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
            amqp: String::new(),
        };
        let full = args.settings(&pg);
        assert_eq!(
            (
                full.runs,
                full.duration,
                full.drain_events,
                full.e2e_seconds
            ),
            (3, 15, 100_000, 20)
        );
        args.quick = true;
        args.runs = Some(2);
        let quick = args.settings(&pg);
        assert_eq!(
            (
                quick.runs,
                quick.duration,
                quick.drain_events,
                quick.e2e_seconds
            ),
            (2, 5, 10_000, 5)
        );
    }
}
