//! Every scenario (`SCENARIOS`): the metrics of its per-run table, as data, and a function that
//! measures one run of them, step by step, with the helpers of `Scene` (bench/scene.rs); and
//! `bench run`, which runs the scenarios and writes the report.

use std::collections::HashMap;
use std::fs;

use anyhow::{Context, Result};

use crate::harness;
use crate::report::{Report, REPORTED};
use crate::scene::{Bench, Scene, Up, UNSENT};
use crate::stats::{Figures, Num};
use crate::{soak, RunArgs};

/// A scenario: the metrics of its per-run table, and the function that measures one run. A
/// scenario of sides (variants measured in turn, set side by side in a table of their own) has,
/// after `metrics`, each of `per_side` as `<side>_<metric>` for each side.
pub struct Scenario {
    pub name: &'static str,
    metrics: &'static str,
    /// Each side's name and its column's label (`{name}` in it a setting).
    pub sides: &'static [(&'static str, &'static str)],
    per_side: &'static str,
    measure: fn(&mut Scene) -> Result<()>,
}

impl Scenario {
    /// The metrics of the per-run table, in order, none measured yet.
    pub fn metrics(&self) -> Figures {
        let mut names: Vec<String> = self.metrics.split_whitespace().map(Into::into).collect();
        for (side, _) in self.sides {
            names.extend(
                self.per_side
                    .split_whitespace()
                    .map(|metric| format!("{side}_{metric}")),
            );
        }
        Figures::of(names.iter().map(String::as_str))
    }
}

/// The scale scenario's sides: a database of {scale_small} rows per table, then one of
/// {scale_large}.
#[rustfmt::skip]
const SCALE: &[(&str, &str)] = &[("small", "{scale_small} rows"), ("large", "{scale_large} rows")];
/// The citus scenario's sides: each on servers of its own with the same settings.
const CITUS: &[(&str, &str)] = &[
    ("plain", "plain PostgreSQL"),
    ("citus", "Citus, 2 workers, through the workers"),
    ("coordinator", "Citus, 2 workers, through the coordinator"),
];

/// The scenarios. The first seven are BENCHMARKS.md's (`bench/run` runs them by default);
/// `scale` and `citus` print a table of their own (`BENCH_SCENARIOS=scale`); `soak` is
/// `scripts/soak`'s.
#[rustfmt::skip]
pub const SCENARIOS: [Scenario; 10] = [
    Scenario { name: "writes", measure: writes, sides: &[], per_side: "", metrics: "cpu_cores \
        rss_mb rps p50_ms p99_ms requests errors status_errors backlog_at_end entries \
        entries_minus_2xx rows_consistent payload_bytes log_problems shutdown_log_problems pg_tps \
        pg_latency_ms pg_failed cost_daemon cost_postgres cost_rabbitmq pg_cost machine_cost \
        machine_busy_pct pg_machine_cost pg_machine_busy_pct alone_rps alone_p99_ms \
        alone_cost_daemon alone_cost_postgres alone_cost_rabbitmq delivery_cost_daemon \
        delivery_cost_postgres delivery_cost_rabbitmq" },
    Scenario { name: "replays", measure: replays, sides: &[], per_side: "", metrics: "cpu_cores \
        rss_mb rps p50_ms p99_ms requests errors status_errors healthz_rps healthz_p50_ms \
        healthz_p99_ms healthz_requests healthz_errors healthz_status_errors pg_tps pg_latency_ms \
        rss_mb_after_all entries log_problems shutdown_log_problems same_bytes_rps \
        same_bytes_p50_ms same_bytes_p99_ms same_bytes_requests same_bytes_errors \
        same_bytes_status_errors answer_bytes" },
    Scenario { name: "storm", measure: storm, sides: &[], per_side: "", metrics: "cpu_cores rss_mb \
        rps p50_ms p99_ms requests errors status_errors entries records events count_ok \
        log_problems shutdown_log_problems" },
    Scenario { name: "drain", measure: drain, sides: &[], per_side: "", metrics: "payload_bytes \
        cpu_cores rss_mb seconds events_per_s queued queued_ok log_problems shutdown_log_problems \
        pub_events_per_s pub_queued rabbitmq_cost pub_rabbitmq_cost" },
    Scenario { name: "e2e", measure: e2e, sides: &[], per_side: "", metrics: "cpu_cores rss_mb \
        p50_ms p99_ms max_ms matched created errors sent achieved_rate http_p50_ms http_p99_ms \
        negative duplicate_deliveries log_problems shutdown_log_problems" },
    Scenario { name: "ordered", measure: ordered, sides: &[], per_side: "", metrics: "cpu_cores \
        rss_mb rps p50_ms p99_ms requests errors status_errors entries entries_minus_2xx order_ok \
        drain_seconds drain_events_per_s drain_queued drain_order_ok e2e_p50_ms e2e_p99_ms \
        e2e_max_ms e2e_sent e2e_created e2e_errors e2e_matched e2e_duplicate_deliveries \
        log_problems shutdown_log_problems" },
    Scenario { name: "latency", measure: latency, sides: &[], per_side: "", metrics: "cpu_cores \
        rss_mb \
        d0_round_trip_ms d0_rps d0_p50_ms d0_p99_ms d0_errors d0_p50_round_trips \
        d0_writes_per_batch d0_ms_per_batch d0_sends_per_write d0_pg_tps d0_pg_latency_ms d0_pg_sends_per_transaction \
        d2_round_trip_ms d2_rps d2_p50_ms d2_p99_ms d2_errors d2_p50_round_trips \
        d2_writes_per_batch d2_ms_per_batch d2_sends_per_write d2_pg_tps d2_pg_latency_ms d2_pg_sends_per_transaction \
        d20_round_trip_ms d20_rps d20_p50_ms d20_p99_ms d20_errors d20_p50_round_trips \
        d20_writes_per_batch d20_ms_per_batch d20_sends_per_write d20_pg_tps d20_pg_latency_ms d20_pg_sends_per_transaction \
        log_problems shutdown_log_problems" },
    Scenario { name: "scale", measure: scale, sides: SCALE, metrics: "", per_side: "rps p99_ms \
        wal_per_write fpi_per_write newest_rps newest_p50_ms oldest_rps oldest_p50_ms rare_rps \
        rare_p50_ms absent_rps absent_p50_ms before_rps before_p50_ms cursor_rps cursor_p50_ms \
        lookup_rps lookup_p50_ms janitor_records_per_s janitor_events_per_s janitor_rps \
        janitor_p99_ms" },
    Scenario { name: "citus", measure: citus, sides: CITUS, metrics: "log_problems \
        shutdown_log_problems", per_side: "rps p50_ms p99_ms errors status_errors \
        entries_minus_2xx writes_per_batch ms_per_batch cost_daemon cost_postgres \
        cost_coordinator cost_worker_1 cost_worker_2 machine_busy_pct two_phase_commits" },
    Scenario { name: "soak", measure: soak, sides: &[], per_side: "", metrics: "unsent records \
        entries events parked not_201 orphans queued hwm_mib log_problems shutdown_log_problems \
        exit_code stop_ms" },
];

/// The loads that are programs of their own (see `Scene::load`).
const UNIQUE_KEYS: &str = "BENCH_NONCE={nonce} {wrk} -s bench/unique_keys.lua {url}/";
const UNIQUE_KEYS_ALONE: &str = "BENCH_NONCE={nonce}alone {wrk} -s bench/unique_keys.lua {url}/";
const CONVENTIONAL: &str = "{pgbench} -f bench/conventional.sql {db}";
const REPLAYS: &str = "BENCH_REPLAY_KEYS={replay_keys} {wrk} -s bench/replay.lua {url}/";
const HEALTHZ: &str = "{wrk} -s bench/healthz.lua {url}/healthz";
/// The same requests to POST /bench/same-bytes (feature `bench-routes`): read as a write is,
/// answered with a replay's bytes and header fields, nothing else.
const SAME_BYTES: &str =
    "BENCH_REPLAY_KEYS={replay_keys} BENCH_SAME_BYTES={bytes} {wrk} -s bench/replay.lua {url}/";
const REPLAY_SELECT: &str = "{pgbench} -D keys={replay_keys} -f bench/replay_select.sql {db}";
const STORM: &str = "BENCH_STORM_KEYS={storm_keys} {wrk} -s bench/storm.lua {url}/";
const ORDERED_KEYS: &str = "BENCH_NONCE={nonce}ordered BENCH_ORDERING_KEYS={ordering_keys} \
    {wrk} -s bench/unique_keys.lua {url}/";
/// The link's round trip: one client's SELECT 1 through the delay proxy for 3 s.
const LINK: &str =
    "pgbench -n -M prepared -c 1 -T 3 -h 127.0.0.1 -p {proxy_port} -f {work}/select-1.sql {db}";
const LATENCY_KEYS: &str = "BENCH_NONCE={nonce}l{delay} {wrk} -s bench/unique_keys.lua {url}/";
const CONVENTIONAL_LINKED: &str =
    "{pgbench_link} -h 127.0.0.1 -p {proxy_port} -f bench/conventional.sql {db}";
const RANDOM_KEYS: &str = "BENCH_KEYS=random {wrk} -s bench/unique_keys.lua {url}/";
const LISTING: &str = "{reads} -s bench/healthz.lua {url}/v1/entries?{query}";
const LOOKUPS: &str = "BENCH_KEYS_FILE={keys} {reads} -s bench/scale_keys.lua {url}/";
const CLIENT_KEYS: &str =
    "BENCH_NONCE={nonce}{side} BENCH_TOKENS={tokens} {wrk} -s bench/unique_keys.lua {url}/";

const ENTRIES: &str = "SELECT count(*) FROM entries";
const RECORDS: &str = "SELECT count(*) FROM idempotency_records";
const EVENTS: &str = "SELECT count(*) FROM outbox_events";
const PAYLOAD: &str = "SELECT round(avg(octet_length(payload::text))) FROM outbox_events";
/// The drain's backlog: {drain_events} events shaped and sized like the daemon's own.
const BACKLOG: &str = include_str!("drain_backlog.sql");
/// The same backlog as writes of {ordering_keys} ordering keys in turn (after `BACKLOG`).
const ORDERED: &str = include_str!("ordered_backlog.sql");
/// 1 when there are ordered events and none breaks its key's order: a sequence that is not the
/// one after the key's previous, an event unsent, or one marked sent before the key's previous
/// (a relay marks a batch sent once the broker confirmed it, and releases a key's next event
/// only then).
const IN_ORDER: &str = "
SELECT (count(*) > 0 AND count(*) FILTER (WHERE broken) = 0)::int FROM (
    SELECT sequence <> coalesce(lag(sequence) OVER w, 0) + 1 OR sent_at IS NULL
           OR sent_at < lag(sent_at) OVER w AS broken
    FROM outbox_events WHERE ordering_key IS NOT NULL
    WINDOW w AS (PARTITION BY client_id, ordering_key ORDER BY sequence)) AS events";
const WAL: &str = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')";
const FPI: &str = "SELECT wal_fpi FROM pg_stat_wal";
const MIDDLE: &str =
    "SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')
    FROM entries ORDER BY created_at OFFSET (SELECT count(*) / 2 FROM entries) LIMIT 1";
const SOME_KEYS: &str = "SELECT string_agg(key, E'\\n') FROM (SELECT key FROM idempotency_records
    TABLESAMPLE SYSTEM (1) WHERE key <> 'scale-template' LIMIT 10000) AS keys";
const PARKED: &str = "SELECT count(*) FROM outbox_events WHERE failed_at IS NOT NULL";
const NOT_201: &str = "SELECT count(*) FROM idempotency_records WHERE response_status <> 201";
/// Records without their entry, and entries without their event.
const ORPHANS: &str = "SELECT (SELECT count(*) FROM idempotency_records r WHERE NOT EXISTS (SELECT 1 FROM entries e WHERE e.id = r.entry_id))
    + (SELECT count(*) FROM entries e WHERE NOT EXISTS (SELECT 1 FROM outbox_events o WHERE o.event_key = e.id || '/entry.created'))";
/// Citus's two-phase commits (the lab keeps their records: no recovery deletes them).
const TWO_PHASE: &str = "SELECT count(*) FROM pg_dist_transaction";

fn sub(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? - b?)
}

/// A whole number.
fn int(value: Option<f64>) -> Option<Num> {
    value.map(|value| Num::int(value as i64))
}

/// `a / b` with so many decimals; none unless `b` is positive.
fn over(a: Option<f64>, b: Option<f64>, decimals: usize) -> Option<Num> {
    let (a, b) = (a?, b?);
    (b > 0.0).then(|| Num::fixed(a / b, decimals))?
}

/// wrk's requests answered 2xx. Every 201 has its entry; the requests in flight when wrk stopped
/// may come on top.
fn answered(wrk: &Figures) -> Option<f64> {
    sub(wrk.get("requests"), wrk.get("status_errors"))
}

/// Unique-key writes beside a conventional implementation's transaction per request (pgbench),
/// then the same writes with the broker unreachable and their delivery afterwards, apart.
fn writes(s: &mut Scene) -> Result<()> {
    s.enter("writes")?;
    s.start(Up::Healthy)?;
    let mut window = s.open()?;
    let wrk = s.load("", UNIQUE_KEYS)?;
    s.put_daemon_use(&window)?;
    s.put("machine_busy_pct", s.busy(&window)?);
    s.put("backlog_at_end", s.sql(UNSENT)?);
    // A write's cost includes publishing its event: the CPU is read once the outbox is empty.
    s.empty(&mut window, 120)?;
    let entries = s.put("entries", s.sql(ENTRIES)?);
    s.put_costs(&window, entries, "")?;
    s.stop(true)?;
    let (records, events) = (s.value(RECORDS)?, s.value(EVENTS)?);
    s.put("entries_minus_2xx", int(sub(entries, answered(&wrk))));
    s.check("rows_consistent", entries, records);
    s.check("rows_consistent", entries, events);
    s.put("payload_bytes", s.sql(PAYLOAD)?);
    // The same load with the broker unreachable: the write without its delivery...
    s.replace_db("writes_alone")?;
    s.start(Up::NoBroker)?;
    let window = s.open()?;
    s.load("alone_", UNIQUE_KEYS_ALONE)?;
    s.stop(false)?;
    s.put_costs(&window, s.value(ENTRIES)?, "alone_")?;
    // ...then delivered by a daemon that reaches the broker: claim, publish, confirm, mark.
    let mut window = s.open()?;
    s.start(Up::Spawned)?;
    s.empty(&mut window, 120)?;
    s.put_costs(&window, s.value(EVENTS)?, "delivery_")?;
    s.stop(false)?;
    // The baseline: a conventional implementation's transaction per request.
    s.replace_db("pgwrites")?;
    let window = s.open()?;
    let transactions = s.load("pg_", CONVENTIONAL)?.get("transactions");
    s.put("pg_machine_busy_pct", s.busy(&window)?);
    let [_, postgres, _, machine] = s.costs(&window, transactions)?;
    s.put("pg_cost", postgres);
    s.put("pg_machine_cost", machine);
    Ok(())
}

/// Replays of keys created before, beside /healthz, the same bytes through the daemon's HTTP
/// stack, and pgbench's primary-key select.
fn replays(s: &mut Scene) -> Result<()> {
    s.enter("replays")?;
    s.start(Up::Healthy)?;
    let bytes = crate::clients::precreate(&s.url(), s.settings().replay_keys as usize)?;
    s.put("answer_bytes", Some(Num::int(bytes as i64)));
    let window = s.open()?;
    s.load("", REPLAYS)?;
    s.put_daemon_use(&window)?;
    s.load("healthz_", HEALTHZ)?;
    let same_bytes = SAME_BYTES.replace("{bytes}", &bytes.to_string());
    s.load("same_bytes_", &same_bytes)?;
    s.load("pg_", REPLAY_SELECT)?;
    s.put("rss_mb_after_all", s.hwm()?);
    s.stop(true)?;
    s.put("entries", s.sql(ENTRIES)?);
    Ok(())
}

/// {storm_keys} keys hammered: exactly as many entries, records and events after.
fn storm(s: &mut Scene) -> Result<()> {
    s.enter("storm")?;
    s.start(Up::Healthy)?;
    let window = s.open()?;
    s.load("", STORM)?;
    s.put_daemon_use(&window)?;
    s.stop(true)?;
    let keys = Some(f64::from(s.settings().storm_keys));
    for (name, sql) in [
        ("entries", ENTRIES),
        ("records", RECORDS),
        ("events", EVENTS),
    ] {
        let count = s.put(name, s.sql(sql)?);
        s.check("count_ok", count, keys);
    }
    Ok(())
}

/// A backlog of {drain_events} events drained by a daemon started on it, beside the plain
/// lapin publisher.
fn drain(s: &mut Scene) -> Result<()> {
    s.enter("drain")?;
    s.text(BACKLOG)?;
    s.text("ANALYZE outbox_events")?;
    let payload = s.put("payload_bytes", s.sql(PAYLOAD)?);
    // The clock starts just before the daemon is spawned: its start is part of the drain.
    let mut window = s.open()?;
    s.start(Up::Spawned)?;
    let seconds = s.empty(&mut window, 900)?;
    let seconds = s.put("seconds", seconds);
    s.put_daemon_use(&window)?;
    let events = Some(s.settings().drain_events as f64);
    s.put("rabbitmq_cost", s.costs(&window, events)?[2].clone());
    s.put("events_per_s", over(events, seconds, 1));
    s.stop(true)?;
    let queued = s.queued("queued", events)?;
    s.check("queued_ok", queued, events);
    s.unstage()?;
    s.publish("pub_", payload)
}

/// The end-to-end client: from the 201 to the delivery.
fn e2e(s: &mut Scene) -> Result<()> {
    s.enter("e2e")?;
    s.start(Up::Healthy)?;
    let window = s.open()?;
    s.e2e("", false)?;
    s.put_daemon_use(&window)?;
    s.stop(true)
}

/// The writes, the drain's backlog and the end-to-end load with {ordering_keys} ordering keys,
/// each on a stage and with a daemon of its own, every key's order checked after each.
fn ordered(s: &mut Scene) -> Result<()> {
    s.enter("ordered")?;
    s.start(Up::Healthy)?;
    let mut window = s.open()?;
    let wrk = s.load("", ORDERED_KEYS)?;
    s.put_daemon_use(&window)?;
    s.empty(&mut window, 120)?;
    s.stop(true)?;
    let entries = s.put("entries", s.sql(ENTRIES)?);
    s.put("entries_minus_2xx", int(sub(entries, answered(&wrk))));
    s.check("order_ok", s.value(IN_ORDER)?, Some(1.0));

    s.enter("ordered_drain")?;
    for sql in [BACKLOG, ORDERED, "ANALYZE outbox_events"] {
        s.text(sql)?;
    }
    let mut window = s.open()?;
    s.start(Up::Spawned)?;
    let seconds = s.empty(&mut window, 900)?;
    let seconds = s.put("drain_seconds", seconds);
    let events = Some(s.settings().drain_events as f64);
    s.put("drain_events_per_s", over(events, seconds, 1));
    s.stop(true)?;
    let queued = s.queued("drain_queued", events)?;
    s.check("drain_order_ok", queued, events);
    s.check("drain_order_ok", s.value(IN_ORDER)?, Some(1.0));

    s.enter("ordered_e2e")?;
    s.start(Up::Healthy)?;
    s.e2e("e2e_", true)?;
    s.stop(true)?;
    s.check("order_ok", s.value(IN_ORDER)?, Some(1.0));
    Ok(())
}

/// Writes and the conventional transaction with PostgreSQL further away, through a delay proxy,
/// as `d<delay>_<figure>`.
fn latency(s: &mut Scene) -> Result<()> {
    for delay in [0, 2, 20] {
        let d = |figure: &str| format!("d{delay}_{figure}");
        s.enter(&format!("latency{delay}"))?;
        s.proxy(delay)?;
        let link = s.load("link_", LINK)?;
        let round_trip = over(link.get("latency_ms"), Some(1.0), 3);
        let round_trip = s.put(&d("round_trip_ms"), round_trip);
        s.start(Up::Healthy)?;
        let window = s.open()?;
        let keys = LATENCY_KEYS.replace("{delay}", &delay.to_string());
        let wrk = s.load(&d(""), &keys)?;
        s.put_daemon_use(&window)?;
        s.batches(&d(""))?;
        s.stop(true)?;
        s.put(
            &d("p50_round_trips"),
            over(wrk.get("p50_ms"), round_trip, 2),
        );
        let sends = over(wrk.get("sends"), wrk.get("requests"), 2);
        s.put(&d("sends_per_write"), sends);
        // pgbench opens its connections, then prepares each client's statements, one client
        // after another: seconds at 20 ms, all in its -T. It runs 6 s longer, judged by -P 1.
        s.replace_db(&format!("pglatency{delay}"))?;
        let pgbench = s.load(&d("pg_"), CONVENTIONAL_LINKED)?;
        let sends = over(pgbench.get("sends"), pgbench.get("transactions"), 2);
        s.put(&d("pg_sends_per_transaction"), sends);
    }
    Ok(())
}

/// What retained size costs, on each side: random-key writes after a CHECKPOINT (the worst
/// case for full-page images), every shape of listing and key lookups (8 connections, 5 s
/// each), and the janitor's pass over {scale_expired} expired records and as many old events.
fn scale(s: &mut Scene) -> Result<()> {
    for &(side, _) in SCALE {
        let p = |figure: &str| format!("{side}_{figure}");
        let (small, large) = (s.settings().scale_small, s.settings().scale_large);
        let rows = if side == "small" { small } else { large };
        s.enter_filled(&format!("scale_{side}"), rows)?;
        s.start(Up::Healthy)?;
        s.text("CHECKPOINT")?;
        let (wal, fpi) = (s.value(WAL)?, s.value(FPI)?);
        let requests = s.load(&p(""), RANDOM_KEYS)?.get("requests");
        let wal = sub(s.value(WAL)?, wal);
        s.put(&p("wal_per_write"), over(wal, requests, 0));
        let fpi = sub(s.value(FPI)?, fpi);
        s.put(&p("fpi_per_write"), over(fpi, requests, 2));
        let before = format!("created_before={}&limit=100", s.text(MIDDLE)?);
        let cursor = s.get(&format!("/v1/entries?{before}"), "next")?;
        let listings = [
            ("newest", "limit=100".to_owned()),
            ("oldest", "order=asc&limit=100".to_owned()),
            ("rare", "kind=bench.rare&limit=100".to_owned()),
            ("absent", "kind=bench.absent&limit=100".to_owned()),
            ("before", before.clone()),
            ("cursor", format!("{before}&cursor={cursor}")),
        ];
        for (shape, query) in listings {
            let listing = LISTING.replace("{query}", &query);
            s.load(&p(&format!("{shape}_")), &listing)?;
        }
        let keys = s.out("txt");
        fs::write(&keys, s.text(SOME_KEYS)? + "\n")?;
        let keys = keys.display().to_string();
        s.load(&p("lookup_"), &LOOKUPS.replace("{keys}", &keys))?;
        s.stop(false)?;
        s.text(include_str!("scale_expired.sql"))?;
        s.janitor(&p("janitor_"))?;
        s.stop(false)?;
    }
    Ok(())
}

/// Unique-key writes of {clients} clients on each side, on servers of its own with the same
/// settings: plain PostgreSQL; Citus with the daemon writing through the workers that hold each
/// shard (the default); Citus with every statement through the coordinator
/// (`database.citus_direct = false`). And the two-phase commits Citus made meanwhile (0: every
/// write a single-shard transaction; distributing the tables, before, makes some). CPU per
/// 1,000 writes, events delivered: the daemon's, every PostgreSQL server's, and each server's
/// (the one the daemon is given, the coordinator; on plain, the whole server; then each
/// worker).
fn citus(s: &mut Scene) -> Result<()> {
    for &(side, _) in CITUS {
        let (p, citus) = (|figure: &str| format!("{side}_{figure}"), side != "plain");
        s.enter_lab(side, citus)?;
        // Plain PostgreSQL makes no two-phase commits.
        let two_phase = if citus { TWO_PHASE } else { "SELECT NULL" };
        let commits = s.value(two_phase)?;
        let citus_direct = side != "coordinator";
        s.start(Up::Clients { citus_direct })?;
        let mut window = s.open()?;
        let wrk = s.load(&p(""), &CLIENT_KEYS.replace("{side}", side))?;
        s.put(&p("machine_busy_pct"), s.busy(&window)?);
        s.batches(&p(""))?;
        s.empty(&mut window, 120)?;
        let entries = s.value(ENTRIES)?;
        s.put_costs(&window, entries, &p(""))?;
        let nodes = ["cost_coordinator", "cost_worker_1", "cost_worker_2"];
        for (node, cost) in nodes.iter().zip(s.lab_costs(&window, entries)?) {
            s.put(&p(node), cost);
        }
        s.stop(true)?;
        s.put(&p("entries_minus_2xx"), int(sub(entries, answered(&wrk))));
        let commits = sub(s.value(two_phase)?, commits);
        s.put(&p("two_phase_commits"), int(commits));
    }
    Ok(())
}

/// The soak (`bench soak`): its slices (see `soak`), then the end counts.
fn soak(s: &mut Scene) -> Result<()> {
    s.enter("soak")?;
    s.start(Up::Healthy)?;
    let mut window = s.open()?;
    soak::slices(s)?;
    s.empty(&mut window, 60)?;
    let names = "unsent records entries events parked not_201 orphans".split(' ');
    for (name, sql) in names.zip([UNSENT, RECORDS, ENTRIES, EVENTS, PARKED, NOT_201, ORPHANS]) {
        s.put(name, s.sql(sql)?);
    }
    s.queued("queued", s.record.get("events"))?;
    s.put("hwm_mib", s.hwm()?);
    s.stop(true)
}

/// The scenarios of a list such as BENCH_SCENARIOS gives it: names separated by spaces or commas.
pub fn list(names: &str) -> Result<Vec<&'static Scenario>> {
    let names = names.split(|c: char| c.is_whitespace() || c == ',');
    let find = |name| SCENARIOS.iter().find(|s| s.name == name);
    let find = |name| find(name).with_context(|| format!("unknown scenario {name}"));
    names.filter(|name| !name.is_empty()).map(find).collect()
}

/// One run of a scenario, on a scene of its own, its stage removed after it.
pub fn measure<'a>(bench: &'a Bench, scenario: &Scenario, run: u32) -> Result<Scene<'a>> {
    say!("run {run}: {}", scenario.name);
    let mut scene = bench.scene(scenario.name, run, scenario.metrics());
    let measured = (scenario.measure)(&mut scene).and_then(|()| scene.unstage());
    measured.with_context(|| format!("{} run {run}", scenario.name))?;
    Ok(scene)
}

/// `bench run`.
pub fn run(args: RunArgs) -> Result<()> {
    let scenarios = list(&args.scenarios)?;
    harness::ensure_tools(&[
        ("wrk", "wrk"),
        ("pgbench", "postgresql-client"),
        ("curl", "curl"),
    ])?;
    let mut bench = Bench::new(args.settings(), args.daemon.clone(), &args.amqp)?;
    bench.setup_sql = args.setup_sql.clone().filter(|sql| !sql.trim().is_empty());
    bench.finish(measure_all(&bench, &scenarios, &args))
}

/// Runs the scenarios; prints and writes the table of each scenario of sides, and, if one of
/// BENCHMARKS.md's ran, the report to `output` and every run's values to `runs_output`.
fn measure_all(bench: &Bench, scenarios: &[&Scenario], args: &RunArgs) -> Result<()> {
    let (s, id) = (&bench.s, &bench.run_id);
    let machine = harness::machine(&bench.pg, &s.config, true);
    let mode = if s.quick { "quick" } else { "full" };
    let (runs, duration, drain) = (s.runs, s.duration, s.drain_events);
    let what = format!("{runs} run(s), {duration}s per measurement, {drain}-event drain");
    say!("run id {id}; mode {mode}: {what}");
    let mut runs: HashMap<String, Vec<Figures>> = HashMap::new();
    for run in 1..=s.runs {
        for scenario in scenarios {
            let record = measure(bench, scenario, run)?.record;
            runs.entry(scenario.name.into()).or_default().push(record);
        }
    }
    let written_at = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string();
    let report = Report {
        settings: s.clone(),
        machine,
        written_at,
        run_id: id.clone(),
        runs,
    };
    for scenario in scenarios {
        if let Some(table) = report.side_by_side_table(scenario.name, scenario.sides) {
            println!("\n{table}\n");
            let file = bench.work.join(format!("{}.md", scenario.name));
            fs::write(file, table + "\n")?;
        }
    }
    if !REPORTED.iter().any(|name| report.runs.contains_key(*name)) {
        return Ok(());
    }
    print!("{}", report.summary());
    let (output, runs_output) = (&args.output, &args.runs_output);
    let existing = fs::read_to_string(output).ok();
    let written = fs::write(output, report.render(existing.as_deref()));
    written.with_context(|| format!("writing {}", output.display()))?;
    let written = fs::write(runs_output, report.render_runs());
    written.with_context(|| format!("writing {}", runs_output.display()))?;
    let (output, work) = (output.display(), bench.work.display());
    say!("wrote {output}; raw output in {work}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_lists_and_their_metrics() {
        let listed = |text| {
            list(text)
                .unwrap()
                .iter()
                .map(|s| s.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            listed("writes replays storm drain e2e ordered latency"),
            REPORTED
        );
        assert_eq!(listed(" drain,writes "), ["drain", "writes"]);
        assert!(list("writes reads").is_err());
        // A scenario of sides has its metrics, then each side's in turn.
        let (citus, scale) = (SCENARIOS[8].metrics(), SCENARIOS[7].metrics());
        let (citus, scale) = (citus.names(), scale.names());
        assert_eq!(
            citus[..3],
            ["log_problems", "shutdown_log_problems", "plain_rps"]
        );
        assert_eq!([citus[17], citus[32]], ["citus_rps", "coordinator_rps"]);
        assert_eq!(citus.len(), 47);
        assert_eq!(scale[21..23], ["small_janitor_p99_ms", "large_rps"]);
    }
}
