//! What a scenario does its steps with: `Bench`, what every run stands on (the settings, the run
//! id, PostgreSQL, the clean-up, the daemon's binary), and `Scene`, one run of a scenario: its
//! stage (a database and an exchange, or a lab's servers), its daemon, the figures it records,
//! and the helpers a scenario calls.
//!
//! A figure is recorded under a name (`Scene::put`); those that are metrics of the scenario are
//! its per-run values, the others are dropped. A helper that measures several figures records
//! them as `<prefix><figure>`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use sha2::Digest as _;

use crate::clients::{self, DelayProxy, Names};
use crate::harness::{
    self, block_on, seconds_per_1000, Cleanup, Daemon, MachineTicks, Pg, ServiceTicks,
};
use crate::lab::{self, Lab};
use crate::outputs;
use crate::report::{self, Settings};
use crate::stats::{Figures, Num};
use crate::{soak, SoakArgs};

pub const UNSENT: &str = "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL";

/// What every scenario's run stands on.
pub struct Bench {
    pub s: Settings,
    pub run_id: String,
    pub pg: Pg,
    cleanup: Arc<Cleanup>,
    /// The daemon's binary.
    pub daemon: PathBuf,
    /// Where the raw output goes: bench/results/<run id>/.
    pub work: PathBuf,
    amqp: String,
    /// SQL run on every fresh database after its migrations (BENCH_SETUP_SQL).
    pub setup_sql: Option<String>,
    /// The soak's knobs, when this is a soak.
    pub soak: Option<SoakArgs>,
}

impl Bench {
    /// Checks that PostgreSQL and the broker answer, makes the work directory, and arms the
    /// clean-up for every exit (the databases `retrysafe_bench_<run id>_*`, the exchanges and
    /// queues bound, the daemon, the labs' servers).
    pub fn new(mut s: Settings, daemon: Option<PathBuf>, amqp: &str) -> Result<Bench> {
        if !Path::new(&s.config).is_file() {
            bail!("no {}", s.config);
        }
        // This program is <target>/<profile>/examples/bench, the daemon <target>/<profile>/retrysafe.
        let exe = std::env::current_exe()?;
        let profile = exe.parent().and_then(Path::parent);
        let daemon = daemon.unwrap_or(profile.context("no profile directory")?.join("retrysafe"));
        if !daemon.is_file() {
            let build =
                "cargo build --release --features bench-routes --bin retrysafe --example bench";
            bail!("{} is missing: build with {build}", daemon.display());
        }
        let pg = Pg::from_env();
        let reached = pg.query("postgres", "SELECT 1");
        reached.with_context(|| format!("cannot reach PostgreSQL at {}", pg.base))?;
        s.pg_base = pg.base.clone();
        let names = Names {
            amqp: amqp.into(),
            ..Names::default()
        };
        block_on(clients::bind(&names)).context("cannot reach RabbitMQ")?;
        if harness::port_in_use(s.port) {
            bail!("port {} is in use; choose another", s.port);
        }
        let time = chrono::Local::now().format("%m%d%H%M");
        let run_id = format!("{time}{:04x}", rand::random::<u16>());
        let work = PathBuf::from("bench/results").join(&run_id);
        fs::create_dir_all(&work)?;
        fs::write(work.join("select-1.sql"), "SELECT 1;\n")?;
        let cleanup = Cleanup::arm(pg.clone(), amqp, format!("retrysafe_bench_{run_id}_"))?;
        let (amqp, setup_sql, soak) = (amqp.to_owned(), None, None);
        Ok(Bench {
            s,
            run_id,
            pg,
            cleanup,
            daemon,
            work,
            amqp,
            setup_sql,
            soak,
        })
    }

    /// After the work: cleans up (exiting as a signal said if one interrupted it) and notes
    /// where the raw output of a failed run is.
    pub fn finish<T>(&self, result: Result<T>) -> Result<T> {
        self.cleanup.finish();
        if let Err(error) = &result {
            say!("ERROR: {error:#}; raw output in {}", self.work.display());
        }
        result
    }

    pub fn scene(&self, scenario: &'static str, run: u32, record: Figures) -> Scene<'_> {
        let (stage, daemon, first_problem, soak) = (None, None, None, soak::Load::default());
        Scene {
            bench: self,
            scenario,
            run,
            files: 0,
            record,
            stage,
            daemon,
            first_problem,
            soak,
        }
    }
}

/// A stage: its database (`kept` when not the stage's own: filled for later runs, or a lab's),
/// its exchange, its own servers (bench/lab.rs) if any, and the latency scenario's delay proxy
/// in front of PostgreSQL (the daemon's way to it, and `{proxy_port}`).
struct Stage {
    db: String,
    kept: bool,
    exchange: String,
    lab: Option<Lab>,
    proxy: Option<DelayProxy>,
}

/// How the daemon starts.
#[derive(Clone, Copy, PartialEq)]
pub enum Up {
    /// Reaching the broker, once it answers /healthz.
    Healthy,
    /// Reaching the broker, not waited for.
    Spawned,
    /// With a broker URL nothing listens on (port 1 of loopback): it serves writes, and its
    /// relays, never connected, claim nothing.
    NoBroker,
    /// Reaching the broker, once it answers /healthz, with {clients} clients, whose tokens are
    /// {tokens} (on Citus, their rows spread over the shards), and `database.citus_direct`.
    Clients { citus_direct: bool },
}

/// The readings when a measured window opened: the clock, the daemon's CPU ticks (0 before it
/// starts), PostgreSQL's and RabbitMQ's, the machine's, each lab server's (see
/// [`Lab::postmasters`]); and whether the outbox emptied when waited for (CPU costs are only
/// taken if it did).
pub struct Window {
    at: Instant,
    daemon: u64,
    services: ServiceTicks,
    machine: MachineTicks,
    lab: Vec<u64>,
    emptied: bool,
}

/// One run of a scenario.
pub struct Scene<'a> {
    pub bench: &'a Bench,
    scenario: &'static str,
    run: u32,
    /// The raw output's files so far: each is numbered.
    files: usize,
    /// The run's values of the scenario's metrics.
    pub record: Figures,
    stage: Option<Stage>,
    pub daemon: Option<Daemon>,
    /// The first WARN or ERROR line of the last daemon's log once it listened.
    pub first_problem: Option<String>,
    /// What the soak's slices measured.
    pub soak: soak::Load,
}

impl<'a> Scene<'a> {
    pub fn settings(&self) -> &'a Settings {
        &self.bench.s
    }

    /// `text` with its `{name}`s filled in: a setting (`Settings::var`), `{nonce}` (unique to
    /// the run), `{db}` (the stage's database), `{proxy_port}`, `{work}`; others left as they are.
    pub fn fill(&self, text: &str) -> String {
        report::fill(text, |name| match name {
            "nonce" => Some(format!("{}{}", self.bench.run_id, self.run)),
            "db" => self.db().ok().map(str::to_owned),
            "proxy_port" => Some(self.stage.as_ref()?.proxy.as_ref()?.port.to_string()),
            "work" => Some(self.bench.work.display().to_string()),
            name => self.bench.s.var(name),
        })
    }

    /// A new file of the run's raw output.
    pub fn out(&mut self, extension: &str) -> PathBuf {
        self.files += 1;
        let name = format!("{}-{}-{}.{extension}", self.scenario, self.run, self.files);
        self.bench.work.join(name)
    }

    /// Records `value` as the metric `name`, if the scenario has it; its number, for what follows.
    pub fn put(&mut self, name: &str, value: Option<Num>) -> Option<f64> {
        let number = value.as_ref().map(|num| num.value);
        self.record.set(name, value);
        number
    }

    fn put_all(&mut self, prefix: &str, figures: &Figures) {
        for (name, value) in &figures.0 {
            self.put(&format!("{prefix}{name}"), value.clone());
        }
    }

    /// The flag `name`: 1 while every comparison of the run found `a` present and equal to `b`.
    /// A failure is logged.
    pub fn check(&mut self, name: &str, a: Option<f64>, b: Option<f64>) {
        let (scenario, run, equal) = (self.scenario, self.run, a.is_some() && a == b);
        if !equal {
            say!("FAIL: {scenario} run {run}: {name} ({a:?} against {b:?})");
        }
        let before = self.record.get(name).is_none_or(|flag| flag == 1.0);
        self.put(name, Some(Num::flag(before && equal)));
    }

    fn stage(&self) -> Result<&Stage> {
        self.stage.as_ref().context("no stage")
    }

    /// The PostgreSQL of the stage: its lab's, or the machine's.
    fn pg(&self) -> &Pg {
        let lab = self.stage.as_ref().and_then(|stage| stage.lab.as_ref());
        lab.map_or(&self.bench.pg, |lab| &lab.pg)
    }

    pub fn db(&self) -> Result<&str> {
        Ok(&self.stage()?.db)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.bench.s.port)
    }

    /// A fresh stage, the previous one removed: a database `retrysafe_bench_<run id>_<name>_<run>`
    /// (created and migrated with `retrysafe migrate`, then BENCH_SETUP_SQL run on it) and a
    /// durable topic exchange `retrysafe.bench.<run id>.<name>.<run>` with a durable queue bound
    /// for '#'.
    pub fn enter(&mut self, name: &str) -> Result<()> {
        self.unstage()?;
        let db = self.fresh_db(&format!("{name}_{}", self.run))?;
        self.set_stage(name, db, false, None)
    }

    /// A fresh database in place of the stage's, as `enter` makes one; the exchange stays.
    pub fn replace_db(&mut self, name: &str) -> Result<()> {
        let db = self.fresh_db(&format!("{name}_{}", self.run))?;
        let stage = self.stage.as_mut().context("no stage")?;
        self.bench.pg.drop_db(&std::mem::replace(&mut stage.db, db))
    }

    /// A stage whose database has `rows` rows per table (see `fill_db`), filled at its first
    /// use and kept for the later runs; a fresh exchange.
    pub fn enter_filled(&mut self, name: &str, rows: u64) -> Result<()> {
        self.unstage()?;
        let db = format!("retrysafe_bench_{}_{name}", self.bench.run_id);
        let filled = self.bench.pg.databases_like(&db)?.contains(&db);
        let db = if filled { db } else { self.fresh_db(name)? };
        self.set_stage(name, db, true, None)?;
        if !filled {
            self.fill_db(rows)?;
        }
        Ok(())
    }

    /// A stage on servers of its own (bench/lab.rs): a Citus coordinator and two workers if
    /// `citus`, else one plain server; their database `retrysafe` migrated (on Citus, its tables
    /// distributed), and a fresh exchange.
    pub fn enter_lab(&mut self, name: &str, citus: bool) -> Result<()> {
        self.unstage()?;
        let b = self.bench;
        let dir = std::env::temp_dir().join(format!("retrysafe-bench-{}", b.run_id));
        let lab = lab::start(&b.cleanup, &dir, citus)?;
        self.migrate(&lab.pg, "retrysafe")?;
        self.set_stage(name, "retrysafe".into(), true, Some(lab))
    }

    /// The stage `name` on `db`, with a fresh exchange.
    fn set_stage(&mut self, name: &str, db: String, kept: bool, lab: Option<Lab>) -> Result<()> {
        let (id, name, run) = (&self.bench.run_id, name.replace('_', "."), self.run);
        let exchange = format!("retrysafe.bench.{id}.{name}.{run}");
        self.bench.cleanup.bind(&exchange)?;
        self.stage = Some(Stage {
            db,
            kept,
            exchange,
            lab,
            proxy: None,
        });
        Ok(())
    }

    /// Removes the stage: its database (unless kept), a lab's servers, its exchange and queue,
    /// the delay proxy.
    pub fn unstage(&mut self) -> Result<()> {
        let Some(stage) = self.stage.take() else {
            return Ok(());
        };
        if !stage.kept {
            self.bench.pg.drop_db(&stage.db)?;
        }
        if stage.lab.is_some() {
            self.bench.cleanup.stop_servers();
        }
        let names = Names::of(&stage.exchange, &self.bench.amqp);
        block_on(clients::delete(&names))
    }

    /// A fresh database of the machine's PostgreSQL, migrated; not once the clean-up has begun.
    fn fresh_db(&self, name: &str) -> Result<String> {
        let b = self.bench;
        let db = format!("retrysafe_bench_{}_{name}", b.run_id);
        b.cleanup.guard(|_| {
            b.pg.drop_db(&db)?;
            self.migrate(&b.pg, &db)?;
            Ok(db)
        })
    }

    /// `retrysafe migrate` on `db` of `pg`, then BENCH_SETUP_SQL.
    fn migrate(&self, pg: &Pg, db: &str) -> Result<()> {
        let b = self.bench;
        let mut log = fs::OpenOptions::new();
        let log = log
            .append(true)
            .create(true)
            .open(b.work.join("migrate.log"))?;
        let mut migrate = Command::new(&b.daemon);
        migrate.args(["migrate", "--config", &b.s.config]);
        migrate.env("RETRYSAFE_DATABASE__URL", pg.url(db));
        migrate.env("RETRYSAFE_LOG__LEVEL", "warn");
        let status = migrate.stdout(log.try_clone()?).stderr(log).status()?;
        if !status.success() {
            bail!("migrate {db} failed (see migrate.log)");
        }
        match &b.setup_sql {
            Some(sql) => pg.query(db, sql).map(drop),
            None => Ok(()),
        }
    }

    /// The stage's database filled to `rows` rows per table with one write of the daemon's own
    /// as the template of every row (bench/scale_fill.sql): the daemon's shape and size.
    fn fill_db(&mut self, rows: u64) -> Result<()> {
        let (started, db) = (Instant::now(), self.db()?.to_owned());
        self.start(Up::Healthy)?;
        let body = r#"{"kind":"bench.write","data":{"seq":1,"amount":1250,"currency":"EUR","note":"retrysafe benchmark payload"}}"#;
        let mut post = Command::new("curl");
        post.args(["-sf", "-o", "/dev/null", "-d", body]);
        post.args(["-H", "Content-Type: application/json"]);
        post.args(["-H", "Idempotency-Key: scale-template"]);
        post.arg(format!("{}/v1/entries", self.url())).status()?;
        let pg = &self.bench.pg;
        block_on(clients::drained(&pg.url(&db), Duration::from_secs(30)))?;
        self.daemon.as_mut().context("no daemon")?.stop()?;
        let fill = include_str!("scale_fill.sql").replace("{rows}", &rows.to_string());
        pg.query(&db, &fill)?;
        pg.query(&db, "VACUUM ANALYZE")?;
        let took = started.elapsed().as_secs_f64();
        say!("filled {db}: {rows} rows per table in {took:.0} s");
        Ok(())
    }

    /// A delay proxy in front of PostgreSQL that adds `delay_ms` to every round trip: the
    /// stage's daemons reach PostgreSQL through it, and `{proxy_port}` is its port.
    pub fn proxy(&mut self, delay_ms: u64) -> Result<()> {
        let target = format!("{}:{}", std::env::var("PGHOST")?, std::env::var("PGPORT")?);
        let proxy = DelayProxy::start(target, Duration::from_millis(delay_ms), "127.0.0.1:0")?;
        self.stage.as_mut().context("no stage")?.proxy = Some(proxy);
        Ok(())
    }

    /// The daemon on the stage.
    pub fn start(&mut self, up: Up) -> Result<()> {
        let log = self.out("log");
        let (b, stage) = (self.bench, self.stage()?);
        let db_url = match &stage.proxy {
            Some(proxy) => {
                let (user, port, db) = (std::env::var("PGUSER")?, proxy.port, &stage.db);
                format!("postgres://{user}@127.0.0.1:{port}/{db}")
            }
            None => self.pg().url(&stage.db),
        };
        let amqp = match up {
            Up::NoBroker => "amqp://guest:guest@127.0.0.1:1/%2f",
            _ => &b.amqp,
        };
        let mut env = vec![("DATABASE__URL", db_url.as_str()), ("AMQP__URL", amqp)];
        env.push(("AMQP__EXCHANGE", &stage.exchange));
        let mut settings = b.s.clone();
        if let Up::Clients { citus_direct } = up {
            let direct = if citus_direct { "true" } else { "false" };
            env.push(("DATABASE__CITUS_DIRECT", direct));
            settings.config = self.with_clients()?;
        }
        let daemon = Daemon::start(&b.daemon, &settings, &env, log, &b.cleanup)?;
        match (self.daemon.insert(daemon), up) {
            (_, Up::Spawned) => Ok(()),
            (daemon, _) => daemon.wait_healthy(),
        }
    }

    /// A configuration of its own: the bench's, and {clients} clients whose tokens are
    /// {tokens}; its path.
    fn with_clients(&self) -> Result<String> {
        let s = &self.bench.s;
        let mut config = fs::read_to_string(&s.config)?;
        for (client, token) in s.tokens().iter().enumerate() {
            let digest = sha2::Sha256::digest(token.as_bytes());
            let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
            let client = format!("id = \"bench-{client}\"\ntoken_sha256 = \"{hex}\"");
            config += &format!("\n[[auth.clients]]\n{client}\n");
        }
        let path = self.bench.work.join("clients.toml");
        fs::write(&path, config)?;
        Ok(path.display().to_string())
    }

    /// Stops the daemon: its log's WARN/ERROR lines under load and after the SIGTERM are added to
    /// `log_problems` and `shutdown_log_problems` if `count_logs`; `exit_code` and `stop_ms`.
    pub fn stop(&mut self, count_logs: bool) -> Result<()> {
        let daemon = self.daemon.as_mut().context("no daemon")?;
        let (status, took) = daemon.stop()?;
        let (under_load, after, first) = daemon.log_problems();
        if count_logs {
            let counts = [
                ("log_problems", under_load),
                ("shutdown_log_problems", after),
            ];
            for (name, count) in counts {
                let before = self.record.get(name).unwrap_or(0.0) as i64;
                self.put(name, Some(Num::int(before + count as i64)));
            }
        }
        self.first_problem = first;
        self.put("exit_code", status.code().map(|code| Num::int(code.into())));
        self.put("stop_ms", Some(Num::int(took.as_millis() as i64)));
        Ok(())
    }

    /// The first value `sql` (filled in) gives on the stage's database: as text; as a figure
    /// (`sql`); as a number (`value`).
    pub fn text(&self, sql: &str) -> Result<String> {
        self.pg().query(self.db()?, &self.fill(sql))
    }

    pub fn sql(&self, sql: &str) -> Result<Option<Num>> {
        Ok(Num::parse(&self.text(sql)?))
    }

    pub fn value(&self, sql: &str) -> Result<Option<f64>> {
        Ok(self.sql(sql)?.map(|num| num.value))
    }

    /// GET of a path of the daemon: the JSON string field `key` of its answer.
    pub fn get(&self, path: &str, key: &str) -> Result<String> {
        let answer = harness::get(&(self.url() + path), "30")?;
        let answer: serde_json::Value = serde_json::from_str(&answer)?;
        let value = answer[key].as_str().map(str::to_owned);
        value.with_context(|| format!("GET {path}: no {key}"))
    }

    pub fn open(&self) -> Result<Window> {
        let running = self.daemon.as_ref().filter(|d| d.ticks_at_stop.is_none());
        let daemon = running.map_or(Ok(0), Daemon::cpu_ticks)?;
        let (services, machine) = (ServiceTicks::now(), MachineTicks::now()?);
        let lab = self.stage.as_ref().and_then(|stage| stage.lab.as_ref());
        let lab = lab.map(Lab::postmasters).transpose()?.unwrap_or_default();
        let lab = lab.into_iter().map(harness::ticks_of_tree).collect();
        Ok(Window {
            at: Instant::now(),
            daemon,
            services,
            machine,
            lab,
            emptied: true,
        })
    }

    /// Waits until no event is unsent, at most `timeout` s: the seconds since the window
    /// opened, if it came to that.
    pub fn empty(&self, window: &mut Window, timeout: u64) -> Result<Option<Num>> {
        let (pg, db) = (self.pg(), self.db()?);
        window.emptied = block_on(clients::drained(&pg.url(db), Duration::from_secs(timeout)))?;
        if !window.emptied {
            let unsent = pg.count(db, UNSENT)?;
            say!("{unsent} events still unsent after {timeout} s: no CPU cost");
            return Ok(None);
        }
        Ok(Num::parse(&window.at.elapsed().as_secs_f64().to_string()))
    }

    /// The machine's busy share since the window opened, in per cent.
    pub fn busy(&self, window: &Window) -> Result<Option<Num>> {
        let busy = MachineTicks::now()?.since(window.machine).busy_share(false);
        Ok(busy.and_then(|busy| Num::fixed(busy, 1)))
    }

    /// The daemon's peak RSS (VmHWM), MiB.
    pub fn hwm(&self) -> Result<Option<Num>> {
        let daemon = self.daemon.as_ref().context("no daemon")?;
        Ok(Num::fixed(daemon.status_mib("VmHWM")?, 1))
    }

    /// The daemon's cores since the window opened, as `cpu_cores` (the run's first window: in
    /// latency, the one with no delay added, its busiest), and its peak RSS as `rss_mb` (the
    /// highest of the run's daemons).
    pub fn put_daemon_use(&mut self, window: &Window) -> Result<()> {
        let daemon = self.daemon.as_ref().context("no daemon")?;
        let used = daemon.cpu_ticks()?.saturating_sub(window.daemon) as f64;
        let cores = used / harness::clock_ticks() / window.at.elapsed().as_secs_f64();
        let hwm = self.hwm()?;
        if self.record.get("cpu_cores").is_none() {
            self.put("cpu_cores", Num::fixed(cores, 3));
        }
        if hwm.as_ref().map(|n| n.value) >= self.record.get("rss_mb") {
            self.put("rss_mb", hwm);
        }
        Ok(())
    }

    /// CPU seconds per 1,000 of `count` since the window opened: the daemon's, PostgreSQL's,
    /// RabbitMQ's, and the whole machine's (steal not counted); none unless the outbox emptied
    /// when waited for, or of a reading that went down, as after a server restart (which is
    /// logged).
    pub fn costs(&self, window: &Window, count: Option<f64>) -> Result<[Option<Num>; 4]> {
        if !window.emptied {
            return Ok([None, None, None, None]);
        }
        let count = count.unwrap_or(0.0);
        let daemon = self.daemon.as_ref().map(Daemon::cpu_ticks).transpose()?;
        let daemon =
            daemon.and_then(|now| seconds_per_1000(now.saturating_sub(window.daemon), count));
        let [pg, rabbit] = self.service_costs(window.services, count);
        let machine = seconds_per_1000(MachineTicks::now()?.since(window.machine).work, count);
        Ok([daemon, pg, rabbit, machine])
    }

    /// PostgreSQL's and RabbitMQ's CPU seconds per 1,000 `count` since `before`; none if a
    /// reading went down, as after a server restart (which is logged).
    fn service_costs(&self, before: ServiceTicks, count: f64) -> [Option<Num>; 2] {
        let Some(spent) = ServiceTicks::now().since(before) else {
            let scenario = self.scenario;
            say!("{scenario}: PostgreSQL's or RabbitMQ's CPU time went down (restarted?): no CPU cost");
            return [None, None];
        };
        [spent.postgres, spent.rabbitmq].map(|ticks| seconds_per_1000(ticks, count))
    }

    /// [`costs`](Self::costs) as `<prefix>cost_daemon`, `<prefix>cost_postgres`,
    /// `<prefix>cost_rabbitmq` and `<prefix>machine_cost`.
    pub fn put_costs(&mut self, window: &Window, count: Option<f64>, prefix: &str) -> Result<()> {
        let costs = self.costs(window, count)?;
        let names = "cost_daemon cost_postgres cost_rabbitmq machine_cost".split(' ');
        for (name, cost) in names.zip(costs) {
            self.put(&format!("{prefix}{name}"), cost);
        }
        Ok(())
    }

    /// CPU seconds per 1,000 of `count` since the window opened of each of the lab's servers:
    /// the one the daemon is given (a Citus coordinator, or the plain server) first.
    pub fn lab_costs(&self, window: &Window, n: Option<f64>) -> Result<Vec<Option<Num>>> {
        let lab = self.stage()?.lab.as_ref().context("no lab")?;
        let spent = lab.postmasters()?.into_iter().zip(&window.lab);
        let cost = |(postmaster, before): (u32, &u64)| {
            let ticks = harness::ticks_of_tree(postmaster).saturating_sub(*before);
            seconds_per_1000(ticks, n.unwrap_or(0.0))
        };
        Ok(spent.map(cost).collect())
    }

    /// A program's load, its figures recorded as `<prefix><figure>` (see `tool`).
    pub fn load(&mut self, prefix: &str, command: &str) -> Result<Figures> {
        let figures = self.tool(command, || Ok(()))?;
        self.put_all(prefix, &figures);
        Ok(figures)
    }

    /// Runs a program's load, `NAME=value` words then wrk's or pgbench's command line (filled
    /// in), calling `poll` every 500 ms while it runs. Its figures: wrk's (`wrk_figures`), or
    /// pgbench's (`pgbench_figures`; with `-P 1`, steady over the last {duration} s); and
    /// `sends`, the delay proxy's meanwhile.
    fn tool(&mut self, command: &str, poll: impl FnMut() -> Result<()>) -> Result<Figures> {
        let line = self.fill(command);
        let program = line.split_whitespace().find(|word| !word.contains('='));
        let program = program.context("no program")?.to_owned();
        let out = self.out(&program);
        let proxy = self.stage.as_ref().and_then(|stage| stage.proxy.as_ref());
        let before = proxy.map(DelayProxy::sends);
        let (status, text) = harness::run_program(&line, &out, Duration::from_millis(500), poll)?;
        let proxy = self.stage.as_ref().and_then(|stage| stage.proxy.as_ref());
        let sends = proxy.map(DelayProxy::sends).zip(before);
        let sends = sends.map(|(now, was)| Num::int((now - was) as i64));
        let mut figures = if program == "pgbench" {
            if !status.success() {
                say!("pgbench exited with {status}; see {}", out.display());
            }
            self.quiet()?;
            let steady = line.contains("-P 1").then_some(self.bench.s.duration);
            outputs::pgbench_figures(&text, steady)
        } else {
            if !status.success() {
                bail!("{program} failed ({status}); see {}", out.display());
            }
            let result = outputs::result_line(&text, "BENCH_RESULT");
            let result = result.with_context(|| format!("no result; see {}", out.display()))?;
            outputs::wrk_figures(&result)
        };
        figures.push("sends", sends);
        Ok(figures)
    }

    /// Waits (at most 10 s) until pgbench's backends on the stage's database are gone, so that
    /// their whole time counts.
    fn quiet(&self) -> Result<()> {
        let db = self.db()?;
        let sql = format!("SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}' AND application_name = 'pgbench'");
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.bench.pg.count("postgres", &sql)? > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The janitor's first pass beside unique-key writes with random keys for 4 measurements'
    /// time: a daemon started (its janitor begins at once); how fast each table's expired rows
    /// went, from the daemon's /metrics, as `records_per_s` and `events_per_s`, beside wrk's
    /// figures.
    pub fn janitor(&mut self, prefix: &str) -> Result<()> {
        let (started, expired) = (Instant::now(), self.bench.s.scale_expired as f64);
        self.start(Up::Healthy)?;
        let metrics = self.url() + "/metrics";
        let deleted = |table: &str| {
            let (metrics, name) = (
                harness::get(&metrics, "10")?,
                "retrysafe_janitor_deleted_rows_total",
            );
            anyhow::Ok(outputs::metric(&metrics, name, table))
        };
        let (tables, mut done) = (["idempotency_records", "outbox_events"], [None, None]);
        let load = "BENCH_KEYS=random {wrk_janitor} -s bench/unique_keys.lua {url}/";
        let mut figures = self.tool(load, || {
            for (table, done) in tables.iter().zip(&mut done) {
                if done.is_none() && deleted(table)? >= expired {
                    *done = Some(started.elapsed().as_secs_f64());
                }
            }
            Ok(())
        })?;
        // Records from the pass's start until the last was deleted; events from then (the pass
        // deletes records first) until theirs were.
        let rate = |table, seconds: Option<f64>| Num::fixed(deleted(table).ok()? / seconds?, 0);
        let events_took = done[1].zip(done[0]).map(|(e, r)| (e - r).max(0.5));
        figures.push("records_per_s", rate(tables[0], done[0]));
        figures.push("events_per_s", rate(tables[1], events_took));
        self.put_all(prefix, &figures);
        Ok(())
    }

    /// The writers' batches so far, from /metrics: writes_per_batch and ms_per_batch (per batch
    /// transaction), as `<prefix><figure>`.
    pub fn batches(&mut self, prefix: &str) -> Result<()> {
        let text = harness::get(&(self.url() + "/metrics"), "10")?;
        let per = |name: &str, scale: f64| {
            let count = outputs::metric(&text, &format!("{name}_count"), "");
            let sum = outputs::metric(&text, &format!("{name}_sum"), "");
            (count > 0.0).then(|| Num::fixed(scale * sum / count, 1))?
        };
        let writes = per("retrysafe_writer_batch_size", 1.0);
        let ms = per("retrysafe_writer_transaction_seconds", 1000.0);
        self.put(&format!("{prefix}writes_per_batch"), writes);
        self.put(&format!("{prefix}ms_per_batch"), ms);
        Ok(())
    }

    /// The end-to-end client at {e2e_rate} requests/s for {e2e_seconds} s, writes of
    /// {ordering_keys} ordering keys in turn if `ordered`; its figures as `<prefix><figure>`.
    pub fn e2e(&mut self, prefix: &str, ordered: bool) -> Result<()> {
        let (s, queue) = (&self.bench.s, format!("{}.q", self.stage()?.exchange));
        let keys = if ordered { s.ordering_keys as usize } else { 0 };
        let (url, amqp, rate, seconds) = (self.url(), &self.bench.amqp, s.e2e_rate, s.e2e_seconds);
        let e2e = clients::end_to_end(&url, amqp, &queue, rate, seconds, keys)?;
        self.put_all(prefix, &e2e);
        Ok(())
    }

    /// The plain lapin publisher: {drain_events} messages of `payload` bytes (400 if unknown) to
    /// an exchange and queue of its own; events_per_s, queued, rabbitmq_cost as
    /// `<prefix><figure>`.
    pub fn publish(&mut self, prefix: &str, payload: Option<f64>) -> Result<()> {
        let (b, events) = (self.bench, self.bench.s.drain_events);
        let exchange = format!("retrysafe.bench.{}.publisher.{}", b.run_id, self.run);
        b.cleanup.bind(&exchange)?;
        let payload = payload.unwrap_or(400.0) as usize;
        let (services, window) = (ServiceTicks::now(), b.s.publish_window as usize);
        let rate = block_on(clients::publish(
            &b.amqp, &exchange, events, payload, window,
        ))?;
        let [_, cost] = self.service_costs(services, events as f64);
        let queued = block_on(clients::count(&b.amqp, &format!("{exchange}.q"), events))?;
        block_on(clients::delete(&Names::of(&exchange, &b.amqp)))?;
        let rate = Num::parse(&rate.to_string());
        self.put(&format!("{prefix}events_per_s"), rate);
        self.put(&format!("{prefix}queued"), Some(Num::int(queued as i64)));
        self.put(&format!("{prefix}rabbitmq_cost"), cost);
        Ok(())
    }

    /// Messages in the stage's queue, waiting a while for `expect` of them, as `name`.
    pub fn queued(&mut self, name: &str, expect: Option<f64>) -> Result<Option<f64>> {
        let queue = format!("{}.q", self.stage()?.exchange);
        let expect = expect.unwrap_or(0.0) as u64;
        let queued = block_on(clients::count(&self.bench.amqp, &queue, expect))?;
        Ok(self.put(name, Some(Num::int(queued as i64))))
    }
}
