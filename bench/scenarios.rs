//! Every scenario as data (`SCENARIOS`: the metrics of its per-run table, and the steps that
//! measure them), and the one harness that plays the steps (`Scene::play`).
//!
//! A step records figures under names; those the scenario lists are its per-run values, the
//! others stay for later steps of the same run (`Calc`'s operands, `{name}` in a text). In a
//! text, `{name}` is also a setting (`Settings::var`), `{each}` the value of the enclosing
//! `Each`, `{nonce}` unique to the run, `{db}` the stage's database. A metric recorded again
//! keeps its peak (`rss_mb`), its first value (`cpu_cores`), adds up (log lines), or, for a flag
//! (`Eq`), is the AND of its values.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::clients::{self, DelayProxy, Names};
use crate::harness::{self, block_on, field, mib, seconds_per_1000, Cleanup, Daemon};
use crate::harness::{MachineTicks, Pg, ServiceTicks};
use crate::lab;
use crate::report::{self, Machine, Report, Run, Settings};
use crate::soak::{self, SoakArgs};
use crate::stats::{median, Num};
use sha2::Digest as _;

/// A scenario: the metrics of its per-run table, in order, and the steps that measure them.
pub struct Scenario {
    pub name: &'static str,
    pub metrics: &'static str,
    steps: &'static [Step],
}

/// What a step does. Names are those a figure is recorded under; "" records nothing.
#[derive(Clone, Copy)]
enum Step {
    /// A fresh database `retrysafe_bench_<run id>_<name>_<run>` (created and migrated with
    /// `retrysafe migrate`, then BENCH_SETUP_SQL run on it) and a fresh durable topic exchange
    /// `retrysafe.bench.<run id>.<name>.<run>` with a durable queue bound for '#'; the previous
    /// stage's removed.
    Stage(&'static str),
    /// A fresh database in place of the stage's; the exchange stays.
    Db(&'static str),
    /// A database of `.1` rows per table (bench/scale_fill.sql) filled at its first use and kept
    /// for the later runs, and a fresh exchange.
    Fill(&'static str, &'static str),
    /// A stage on servers of its own (bench/lab.rs): `.0` "citus" (a coordinator and two
    /// workers) or "plain" (one server), their database `retrysafe` migrated (on Citus, its
    /// tables distributed), and a fresh exchange; the previous stage's removed.
    Lab(&'static str),
    /// The stage's database dropped (unless filled), its exchange and queue deleted; a lab's
    /// servers stopped and removed.
    Unstage,
    /// SQL on the stage's database; its first value recorded as `.0`.
    Sql(&'static str, &'static str),
    /// SQL's first value written to a file of the run; `{.0}` is its path.
    File(&'static str, &'static str),
    /// A delay proxy in front of PostgreSQL that adds `{each}` ms to every round trip; the
    /// stage's daemons reach PostgreSQL through it, and `{proxy_port}` is its port.
    Proxy,
    /// The daemon on the stage.
    Daemon(Up),
    /// Opens the measured window: the clock, the daemon's CPU (0 before it starts), PostgreSQL's
    /// and RabbitMQ's, the machine's.
    Open,
    /// A program's load: `NAME=value` words, then wrk's or pgbench's command line. Its figures,
    /// as `<.1><figure>`: wrk's rps, p50_ms, p99_ms, requests, errors (connect + read + write +
    /// status + timeout), status_errors (non-2xx); pgbench's tps, latency_ms, failed,
    /// transactions (with `-P 1`, tps and latency are the medians of the last {duration} s);
    /// and the proxy's sends meanwhile.
    Load(&'static str, &'static str),
    /// Keys replay-1 .. replay-{replay_keys} created through the daemon, each answered 201, and
    /// the size of a replay's answer as `answer_bytes`.
    Precreate,
    /// The end-to-end client at {e2e_rate} requests/s for {e2e_seconds} s, writes of
    /// {ordering_keys} ordering keys in turn if `.0`; its figures as `<.1><figure>`.
    E2e(bool, &'static str),
    /// The plain lapin publisher: {drain_events} messages of {payload_bytes} bytes to an
    /// exchange and queue of its own; events_per_s, queued, rabbitmq_cost as `<.0><figure>`.
    Publish(&'static str),
    /// Waits until no event is unsent, at most `.0` s; the seconds since the window opened as
    /// `.1`. Costs are only taken once it held.
    Empty(u64, &'static str),
    /// The daemon's cores since the window opened, its peak RSS (VmHWM), and the machine's busy
    /// share since the window opened, in per cent.
    Readings(&'static str, &'static str, &'static str),
    /// CPU seconds per 1,000 of `.0` since the window opened: the daemon's, PostgreSQL's,
    /// RabbitMQ's, and the whole machine's (steal not counted).
    Costs(&'static str, [&'static str; 4]),
    /// CPU seconds per 1,000 of `.0` since the window opened of the lab's server the daemon is
    /// given (a Citus coordinator, or the plain server), as `.1`.
    LabCost(&'static str, &'static str),
    /// The writers' batches so far, from /metrics: writes_per_batch and ms_per_batch (per batch
    /// transaction) as `<.0><figure>`.
    Batches(&'static str),
    /// The janitor's first pass from a daemon's start, beside the load `.0`: records and events
    /// deleted per second, and the load's figures, as `<.1><figure>`.
    Janitor(&'static str, &'static str),
    /// GET of a path of the daemon: the JSON field `.2` of its answer as `.0`.
    Get(&'static str, &'static str, &'static str),
    /// Messages in the stage's queue, waiting a while for `.1` of them, as `.0`.
    Queued(&'static str, &'static str),
    /// Stops the daemon; its log's WARN/ERROR lines under load and after the SIGTERM are added
    /// to log_problems and shutdown_log_problems if `.0`.
    Stop(bool),
    /// `.0` = `.1` op `.3`: each a figure, a setting or a number.
    Calc(&'static str, &'static str, Op, &'static str),
    /// The steps, once for each value (`{each}`).
    Each(&'static [&'static str], &'static [Step]),
    /// The soak's slices (see `soak`).
    Slices,
}

#[derive(Clone, Copy, PartialEq)]
enum Up {
    /// Reaching the broker, once it answers /healthz.
    Healthy,
    /// Reaching the broker, not waited for.
    Spawned,
    /// With a broker URL nothing listens on (port 1 of loopback): it serves writes, and its
    /// relays, never connected, claim nothing.
    NoBroker,
    /// Reaching the broker, once it answers /healthz, with {clients} clients, whose tokens are
    /// {tokens} (on Citus, their rows spread over the shards).
    Clients,
}

#[derive(Clone, Copy)]
enum Op {
    Sub,
    /// Divided, with so many decimals.
    Div(usize),
    /// A flag: 1 if equal (an inequality is logged as a failure).
    Eq,
}

const ENTRIES: &str = "SELECT count(*) FROM entries";
const RECORDS: &str = "SELECT count(*) FROM idempotency_records";
const EVENTS: &str = "SELECT count(*) FROM outbox_events";
const UNSENT: &str = "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL";
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

/// The citus scenario's writes, on the stage's lab, as `{each}_<figure>`.
#[rustfmt::skip]
const CLIENT_WRITES: &[Step] = &[
    Daemon(Clients), Open,
    Load("BENCH_NONCE={nonce}{each} BENCH_TOKENS={tokens} {wrk} -s bench/unique_keys.lua {url}/", "{each}_"),
    Readings("", "", "{each}_machine_busy_pct"), Batches("{each}_"), Empty(120, ""), Sql("entries", ENTRIES),
    Costs("entries", ["{each}_cost_daemon", "{each}_cost_postgres", "", ""]),
    LabCost("entries", "{each}_cost_coordinator"), Stop(true),
    Calc("answered", "requests", Sub, "status_errors"),
    Calc("{each}_entries_minus_2xx", "entries", Sub, "answered"),
];
/// Citus's two-phase commits (the lab keeps their records: no recovery deletes them).
const TWO_PHASE_COMMITS: &str = "SELECT count(*) FROM pg_dist_transaction";

use Op::{Div, Eq, Sub};
use Step::*;
use Up::{Clients, Healthy, NoBroker, Spawned};

/// The scenarios. The first seven are BENCHMARKS.md's (`bench/run` runs them by default);
/// `scale` sets a database of {scale_large} rows per table beside one of {scale_small}
/// (`BENCH_SCENARIOS=scale`); `soak` is `scripts/soak`'s.
#[rustfmt::skip]
pub const SCENARIOS: [Scenario; 10] = [
    Scenario { name: "writes", metrics: "cpu_cores rss_mb rps p50_ms p99_ms requests errors \
        status_errors backlog_at_end entries entries_minus_2xx rows_consistent payload_bytes \
        log_problems shutdown_log_problems pg_tps pg_latency_ms pg_failed cost_daemon cost_postgres \
        cost_rabbitmq pg_cost machine_cost machine_busy_pct pg_machine_cost pg_machine_busy_pct \
        alone_rps alone_p99_ms alone_cost_daemon alone_cost_postgres alone_cost_rabbitmq \
        delivery_cost_daemon delivery_cost_postgres delivery_cost_rabbitmq", steps: &[
        Stage("writes"), Daemon(Healthy), Open,
        Load("BENCH_NONCE={nonce} {wrk} -s bench/unique_keys.lua {url}/", ""),
        Readings("cpu_cores", "rss_mb", "machine_busy_pct"), Sql("backlog_at_end", UNSENT),
        // A write's cost includes publishing its event: the CPU is read once the outbox is empty.
        Empty(120, ""), Sql("entries", ENTRIES),
        Costs("entries", ["cost_daemon", "cost_postgres", "cost_rabbitmq", "machine_cost"]),
        Stop(true), Sql("records", RECORDS), Sql("events", EVENTS),
        // Every 201 has its entry; the requests in flight when wrk stopped may come on top.
        Calc("answered", "requests", Sub, "status_errors"),
        Calc("entries_minus_2xx", "entries", Sub, "answered"),
        Calc("rows_consistent", "entries", Eq, "records"), Calc("rows_consistent", "entries", Eq, "events"),
        Sql("payload_bytes", PAYLOAD),
        // The same load with the broker unreachable: the write without its delivery...
        Db("writes_alone"), Daemon(NoBroker), Open,
        Load("BENCH_NONCE={nonce}alone {wrk} -s bench/unique_keys.lua {url}/", "alone_"),
        Stop(false), Sql("written", ENTRIES),
        Costs("written", ["alone_cost_daemon", "alone_cost_postgres", "alone_cost_rabbitmq", ""]),
        // ...then delivered by a daemon that reaches the broker: claim, publish, confirm, mark.
        Open, Daemon(Spawned), Empty(120, ""), Sql("delivered", EVENTS),
        Costs("delivered", ["delivery_cost_daemon", "delivery_cost_postgres", "delivery_cost_rabbitmq", ""]),
        Stop(false),
        // The baseline: a conventional implementation's transaction per request.
        Db("pgwrites"), Open, Load("{pgbench} -f bench/conventional.sql {db}", "pg_"),
        Readings("", "", "pg_machine_busy_pct"),
        Costs("transactions", ["", "pg_cost", "", "pg_machine_cost"]), Unstage,
    ]},
    Scenario { name: "replays", metrics: "cpu_cores rss_mb rps p50_ms p99_ms requests errors \
        status_errors healthz_rps healthz_p50_ms healthz_p99_ms healthz_requests healthz_errors \
        healthz_status_errors pg_tps pg_latency_ms rss_mb_after_all entries log_problems \
        shutdown_log_problems same_bytes_rps same_bytes_p50_ms same_bytes_p99_ms \
        same_bytes_requests same_bytes_errors same_bytes_status_errors answer_bytes", steps: &[
        Stage("replays"), Daemon(Healthy), Precreate, Open,
        Load("BENCH_REPLAY_KEYS={replay_keys} {wrk} -s bench/replay.lua {url}/", ""),
        Readings("cpu_cores", "rss_mb", ""),
        Load("{wrk} -s bench/healthz.lua {url}/healthz", "healthz_"),
        // The same requests to POST /bench/same-bytes (feature `bench-routes`): read as a write
        // is, answered with a replay's bytes and header fields, nothing else.
        Load("BENCH_REPLAY_KEYS={replay_keys} BENCH_SAME_BYTES={answer_bytes} {wrk} -s bench/replay.lua {url}/", "same_bytes_"),
        Load("{pgbench} -D keys={replay_keys} -f bench/replay_select.sql {db}", "pg_"),
        Readings("", "rss_mb_after_all", ""), Stop(true), Sql("entries", ENTRIES), Unstage,
    ]},
    Scenario { name: "storm", metrics: "cpu_cores rss_mb rps p50_ms p99_ms requests errors \
        status_errors entries records events count_ok log_problems shutdown_log_problems", steps: &[
        Stage("storm"), Daemon(Healthy), Open,
        Load("BENCH_STORM_KEYS={storm_keys} {wrk} -s bench/storm.lua {url}/", ""),
        Readings("cpu_cores", "rss_mb", ""), Stop(true),
        Sql("entries", ENTRIES), Sql("records", RECORDS), Sql("events", EVENTS),
        Calc("count_ok", "entries", Eq, "{storm_keys}"), Calc("count_ok", "records", Eq, "{storm_keys}"),
        Calc("count_ok", "events", Eq, "{storm_keys}"), Unstage,
    ]},
    Scenario { name: "drain", metrics: "payload_bytes cpu_cores rss_mb seconds events_per_s \
        queued queued_ok log_problems shutdown_log_problems pub_events_per_s pub_queued \
        rabbitmq_cost pub_rabbitmq_cost", steps: &[
        Stage("drain"), Sql("", BACKLOG), Sql("", "ANALYZE outbox_events"), Sql("payload_bytes", PAYLOAD),
        // The clock starts just before the daemon is spawned: its start is part of the drain.
        Open, Daemon(Spawned), Empty(900, "seconds"), Readings("cpu_cores", "rss_mb", ""),
        Costs("{drain_events}", ["", "", "rabbitmq_cost", ""]),
        Calc("events_per_s", "{drain_events}", Div(1), "seconds"),
        Stop(true), Queued("queued", "{drain_events}"), Calc("queued_ok", "queued", Eq, "{drain_events}"),
        Unstage, Publish("pub_"),
    ]},
    Scenario { name: "e2e", metrics: "cpu_cores rss_mb p50_ms p99_ms max_ms matched created \
        errors sent achieved_rate http_p50_ms http_p99_ms negative duplicate_deliveries \
        log_problems shutdown_log_problems", steps: &[
        Stage("e2e"), Daemon(Healthy), Open, E2e(false, ""), Readings("cpu_cores", "rss_mb", ""),
        Stop(true), Unstage,
    ]},
    // The writes, the drain's backlog and the end-to-end load with {ordering_keys} ordering
    // keys, each on a stage and with a daemon of its own, every key's order checked after each.
    Scenario { name: "ordered", metrics: "cpu_cores rss_mb rps p50_ms p99_ms requests errors \
        status_errors entries entries_minus_2xx order_ok drain_seconds drain_events_per_s \
        drain_queued drain_order_ok e2e_p50_ms e2e_p99_ms e2e_max_ms e2e_sent e2e_created \
        e2e_errors e2e_matched e2e_duplicate_deliveries log_problems shutdown_log_problems", steps: &[
        Stage("ordered"), Daemon(Healthy), Open,
        Load("BENCH_NONCE={nonce}ordered BENCH_ORDERING_KEYS={ordering_keys} {wrk} -s bench/unique_keys.lua {url}/", ""),
        Readings("cpu_cores", "rss_mb", ""), Empty(120, ""), Stop(true), Sql("entries", ENTRIES),
        Calc("answered", "requests", Sub, "status_errors"), Calc("entries_minus_2xx", "entries", Sub, "answered"),
        Sql("in_order", IN_ORDER), Calc("order_ok", "in_order", Eq, "1"),
        Stage("ordered_drain"), Sql("", BACKLOG), Sql("", ORDERED), Sql("", "ANALYZE outbox_events"),
        Open, Daemon(Spawned), Empty(900, "drain_seconds"),
        Calc("drain_events_per_s", "{drain_events}", Div(1), "drain_seconds"),
        Stop(true), Queued("drain_queued", "{drain_events}"),
        Calc("drain_order_ok", "drain_queued", Eq, "{drain_events}"),
        Sql("in_order", IN_ORDER), Calc("drain_order_ok", "in_order", Eq, "1"),
        Stage("ordered_e2e"), Daemon(Healthy), E2e(true, "e2e_"), Stop(true),
        Sql("in_order", IN_ORDER), Calc("order_ok", "in_order", Eq, "1"), Unstage,
    ]},
    // Writes and the conventional transaction with PostgreSQL further away. The daemon's CPU is
    // that with no delay added (its busiest), its RSS the peak of the three.
    Scenario { name: "latency", metrics: "cpu_cores rss_mb \
        d0_round_trip_ms d0_rps d0_p50_ms d0_p99_ms d0_errors d0_p50_round_trips \
        d0_writes_per_batch d0_ms_per_batch d0_sends_per_write d0_pg_tps d0_pg_latency_ms d0_pg_sends_per_transaction \
        d2_round_trip_ms d2_rps d2_p50_ms d2_p99_ms d2_errors d2_p50_round_trips \
        d2_writes_per_batch d2_ms_per_batch d2_sends_per_write d2_pg_tps d2_pg_latency_ms d2_pg_sends_per_transaction \
        d20_round_trip_ms d20_rps d20_p50_ms d20_p99_ms d20_errors d20_p50_round_trips \
        d20_writes_per_batch d20_ms_per_batch d20_sends_per_write d20_pg_tps d20_pg_latency_ms d20_pg_sends_per_transaction \
        log_problems shutdown_log_problems", steps: &[Each(&["0", "2", "20"], &[
        Stage("latency{each}"), Proxy,
        // The link's round trip: one client's SELECT 1 through the proxy for 3 s.
        Load("pgbench -n -M prepared -c 1 -T 3 -h 127.0.0.1 -p {proxy_port} -f {work}/select-1.sql {db}", "link_"),
        Calc("d{each}_round_trip_ms", "latency_ms", Div(3), "1"),
        Daemon(Healthy), Open, Load("BENCH_NONCE={nonce}l{each} {wrk} -s bench/unique_keys.lua {url}/", "d{each}_"),
        Readings("cpu_cores", "rss_mb", ""), Batches("d{each}_"), Stop(true),
        Calc("d{each}_p50_round_trips", "p50_ms", Div(2), "d{each}_round_trip_ms"),
        Calc("d{each}_sends_per_write", "sends", Div(2), "requests"),
        // pgbench opens its connections, then prepares each client's statements, one client
        // after another: seconds at 20 ms, all in its -T. It runs 6 s longer, judged by -P 1.
        Db("pglatency{each}"),
        Load("{pgbench_link} -h 127.0.0.1 -p {proxy_port} -f bench/conventional.sql {db}", "d{each}_pg_"),
        Calc("d{each}_pg_sends_per_transaction", "sends", Div(2), "transactions"), Unstage,
    ])]},
    // What retained size costs: random-key writes after a CHECKPOINT (the worst case for
    // full-page images), every shape of listing and key lookups (8 connections, 5 s each), and
    // the janitor's pass over {scale_expired} expired records and as many old events.
    Scenario { name: "scale", metrics: "small_rps small_p99_ms small_wal_per_write \
        small_fpi_per_write small_newest_rps small_newest_p50_ms small_oldest_rps \
        small_oldest_p50_ms small_rare_rps small_rare_p50_ms small_absent_rps small_absent_p50_ms \
        small_before_rps small_before_p50_ms small_cursor_rps small_cursor_p50_ms small_lookup_rps \
        small_lookup_p50_ms small_janitor_records_per_s small_janitor_events_per_s \
        small_janitor_rps small_janitor_p99_ms \
        large_rps large_p99_ms large_wal_per_write \
        large_fpi_per_write large_newest_rps large_newest_p50_ms large_oldest_rps \
        large_oldest_p50_ms large_rare_rps large_rare_p50_ms large_absent_rps large_absent_p50_ms \
        large_before_rps large_before_p50_ms large_cursor_rps large_cursor_p50_ms large_lookup_rps \
        large_lookup_p50_ms large_janitor_records_per_s large_janitor_events_per_s \
        large_janitor_rps large_janitor_p99_ms", steps: &[Each(&["small", "large"], &[
        Fill("scale_{each}", "{scale_{each}}"), Daemon(Healthy),
        Sql("", "CHECKPOINT"), Sql("wal0", WAL), Sql("fpi0", FPI),
        Load("BENCH_KEYS=random {wrk} -s bench/unique_keys.lua {url}/", "{each}_"),
        Sql("wal1", WAL), Sql("fpi1", FPI),
        Calc("wal", "wal1", Sub, "wal0"), Calc("{each}_wal_per_write", "wal", Div(0), "requests"),
        Calc("fpi", "fpi1", Sub, "fpi0"), Calc("{each}_fpi_per_write", "fpi", Div(2), "requests"),
        Sql("middle", MIDDLE), Get("cursor", "/v1/entries?created_before={middle}&limit=100", "next"),
        Load("{reads} -s bench/healthz.lua {url}/v1/entries?limit=100", "{each}_newest_"),
        Load("{reads} -s bench/healthz.lua {url}/v1/entries?order=asc&limit=100", "{each}_oldest_"),
        Load("{reads} -s bench/healthz.lua {url}/v1/entries?kind=bench.rare&limit=100", "{each}_rare_"),
        Load("{reads} -s bench/healthz.lua {url}/v1/entries?kind=bench.absent&limit=100", "{each}_absent_"),
        Load("{reads} -s bench/healthz.lua {url}/v1/entries?created_before={middle}&limit=100", "{each}_before_"),
        Load("{reads} -s bench/healthz.lua {url}/v1/entries?created_before={middle}&limit=100&cursor={cursor}", "{each}_cursor_"),
        File("keys", SOME_KEYS), Load("BENCH_KEYS_FILE={keys} {reads} -s bench/scale_keys.lua {url}/", "{each}_lookup_"),
        Stop(false), Sql("", include_str!("scale_expired.sql")),
        Janitor("BENCH_KEYS=random {wrk_janitor} -s bench/unique_keys.lua {url}/", "{each}_janitor_"), Stop(false),
    ])]},
    // Unique-key writes of {clients} clients on a plain PostgreSQL, then on Citus (a coordinator
    // and two workers), each on servers of its own with the same settings, and the two-phase
    // commits Citus made meanwhile (0: every write a single-shard transaction; distributing the
    // tables, before, makes some). CPU per 1,000 writes, events delivered: the daemon's, every
    // PostgreSQL server's, and the server the daemon is given (the coordinator; on plain, the
    // whole server).
    Scenario { name: "citus", metrics: "plain_rps plain_p50_ms plain_p99_ms plain_errors \
        plain_status_errors plain_entries_minus_2xx plain_writes_per_batch plain_ms_per_batch \
        plain_cost_daemon plain_cost_postgres plain_cost_coordinator plain_machine_busy_pct \
        plain_two_phase_commits citus_rps citus_p50_ms citus_p99_ms citus_errors \
        citus_status_errors citus_entries_minus_2xx citus_writes_per_batch citus_ms_per_batch \
        citus_cost_daemon citus_cost_postgres citus_cost_coordinator citus_machine_busy_pct \
        citus_two_phase_commits log_problems shutdown_log_problems", steps: &[
        Lab("plain"), Each(&["plain"], CLIENT_WRITES),
        Lab("citus"), Sql("before", TWO_PHASE_COMMITS), Each(&["citus"], CLIENT_WRITES),
        Sql("after", TWO_PHASE_COMMITS), Calc("citus_two_phase_commits", "after", Sub, "before"),
        Unstage,
    ]},
    Scenario { name: "soak", metrics: "unsent records entries events parked not_201 orphans \
        queued hwm_mib log_problems shutdown_log_problems exit_code stop_ms", steps: &[
        Stage("soak"), Daemon(Healthy), Open, Slices, Empty(60, ""), Sql("unsent", UNSENT),
        Sql("records", RECORDS), Sql("entries", ENTRIES), Sql("events", EVENTS),
        Sql("parked", "SELECT count(*) FROM outbox_events WHERE failed_at IS NOT NULL"),
        Sql("not_201", "SELECT count(*) FROM idempotency_records WHERE response_status <> 201"),
        Sql("orphans", soak::ORPHANS), Queued("queued", "events"), Readings("", "hwm_mib", ""),
        Stop(true), Unstage,
    ]},
];

/// The scenarios of a list such as BENCH_SCENARIOS gives it: names separated by spaces or commas.
pub fn list(names: &str) -> anyhow::Result<Vec<&'static Scenario>> {
    let names = names.split(|c: char| c.is_whitespace() || c == ',');
    let find = |name| SCENARIOS.iter().find(|s| s.name == name);
    let list = names.filter(|name| !name.is_empty());
    list.map(|name| find(name).with_context(|| format!("unknown scenario {name}")))
        .collect()
}

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
    /// Rows per table of the scale scenario's large database.
    #[arg(long, env = "BENCH_SCALE_ROWS", default_value_t = 5_000_000)]
    pub scale_rows: u64,
    /// Rows per table of the scale scenario's small database.
    #[arg(long, env = "BENCH_SCALE_SMALL", default_value_t = 10_000)]
    pub scale_small: u64,
    /// Expired records, and old events, that the scale scenario's janitor deletes.
    #[arg(long, env = "BENCH_SCALE_EXPIRED", default_value_t = 500_000)]
    pub scale_expired: u64,
    #[arg(long, env = "BENCH_PORT", default_value_t = 18437)]
    pub port: u16,
    /// The daemon's configuration file.
    #[arg(long, env = "BENCH_CONFIG", default_value = "config.toml")]
    pub config: String,
    /// The report; what it has after the hand-written marker is kept.
    #[arg(long, env = "BENCH_OUTPUT", default_value = "BENCHMARKS.md")]
    pub output: PathBuf,
    /// Every run's values, written with the report.
    #[arg(
        long,
        env = "BENCH_RUNS_OUTPUT",
        default_value = "docs/benchmark-runs.md"
    )]
    pub runs_output: PathBuf,
    /// Some of "writes replays storm drain e2e ordered latency scale citus" (spaces or commas); the
    /// report shows n/a for those of BENCHMARKS.md not run.
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
    #[arg(long, env = "BENCH_AMQP_URL", default_value = clients::AMQP)]
    pub amqp: String,
}

impl RunArgs {
    pub fn settings(&self, pg: &Pg) -> Settings {
        let quick = self.quick;
        let pick =
            |value: Option<u32>, full, fast| value.unwrap_or(if quick { fast } else { full });
        let drain_events = if quick { 10_000 } else { 100_000 };
        let duration = pick(self.duration, 15, 5);
        Settings {
            quick,
            runs: pick(self.runs, 3, 1),
            duration,
            drain_events: self.drain_events.unwrap_or(drain_events),
            e2e_seconds: pick(self.e2e_seconds, 20, 5),
            e2e_rate: self.e2e_rate,
            scale_large: self.scale_rows,
            scale_small: self.scale_small,
            scale_expired: self.scale_expired,
            // The janitor's pass has writes beside it for 4 measurements' time (60 s in full).
            janitor_seconds: 4 * duration,
            port: self.port,
            config: self.config.clone(),
            pg_base: pg.base.clone(),
            ..Settings::default()
        }
    }
}

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
    setup_sql: Option<String>,
    /// The soak's knobs, when this is a soak.
    pub soak: Option<SoakArgs>,
}

impl Bench {
    /// Checks that PostgreSQL and the broker answer, makes the work directory, and arms the
    /// clean-up for every exit (the databases `retrysafe_bench_<run id>_*`, the exchanges and
    /// queues bound, the daemon).
    pub fn new(s: Settings, daemon: Option<PathBuf>, amqp: &str) -> anyhow::Result<Bench> {
        if !Path::new(&s.config).is_file() {
            bail!("no {}", s.config);
        }
        // This program is <target>/<profile>/examples/bench, the daemon <target>/<profile>/retrysafe.
        let exe = std::env::current_exe()?;
        let profile = exe
            .parent()
            .and_then(Path::parent)
            .context("no profile directory")?;
        let daemon = daemon.unwrap_or_else(|| profile.join("retrysafe"));
        if !daemon.is_file() {
            let build =
                "cargo build --release --features bench-routes --bin retrysafe --example bench";
            bail!("{} is missing: build with {build}", daemon.display());
        }
        let pg = Pg::from_env();
        let reached = pg.query("postgres", "SELECT 1");
        reached.with_context(|| format!("cannot reach PostgreSQL at {}", pg.base))?;
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
        let amqp = amqp.to_owned();
        let (setup_sql, soak) = (None, None);
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
    pub fn finish<T>(&self, result: anyhow::Result<T>) -> anyhow::Result<T> {
        self.cleanup.finish();
        if let Err(error) = &result {
            say!("ERROR: {error:#}; raw output in {}", self.work.display());
        }
        result
    }

    /// One run of a scenario: its steps played on a scene of their own.
    pub fn measure(&self, scenario: &'static Scenario, run: u32) -> anyhow::Result<Scene<'_>> {
        say!("run {run}: {}", scenario.name);
        let record = Run::of(scenario.metrics);
        let mut scene = Scene {
            bench: self,
            scenario: scenario.name,
            run,
            record,
            ..Scene::new(self)
        };
        scene.play(scenario.steps)?;
        Ok(scene)
    }
}

/// A stage: its database (kept for later runs if filled) and exchange.
struct Stage {
    db: String,
    filled: bool,
    exchange: Option<String>,
}

/// What a scenario's run has at hand while its steps play.
pub struct Scene<'a> {
    bench: &'a Bench,
    scenario: &'static str,
    run: u32,
    each: &'static str,
    /// Steps played so far: each output file is named after its step.
    step: usize,
    /// The run's figures of the scenario's metrics.
    pub record: Run,
    /// Every figure recorded, as text, under its name (and a load's under its own).
    pub figures: HashMap<String, String>,
    stage: Option<Stage>,
    /// The stage's own servers (bench/lab.rs): the one the daemon is given, and its CPU ticks
    /// when the measured window opened.
    lab: Option<(lab::Lab, u64)>,
    pub daemon: Option<Daemon>,
    proxy: Option<DelayProxy>,
    /// The readings at the measured window's start: the clock, the daemon's CPU ticks,
    /// PostgreSQL's and RabbitMQ's, the machine's.
    window: Option<(Instant, u64, ServiceTicks, MachineTicks)>,
    /// Whether the outbox emptied (costs are not taken otherwise).
    emptied: bool,
    pub soak: soak::Load,
}

impl<'a> Scene<'a> {
    fn new(bench: &'a Bench) -> Scene<'a> {
        let (scenario, run, each, step, emptied) = ("", 0, "", 0, true);
        let (record, figures, soak) = (Run::default(), HashMap::new(), soak::Load::default());
        let (stage, lab, daemon, proxy, window) = (None, None, None, None, None);
        Scene {
            bench,
            scenario,
            run,
            each,
            step,
            record,
            figures,
            stage,
            lab,
            daemon,
            proxy,
            window,
            emptied,
            soak,
        }
    }

    pub fn bench(&self) -> &'a Bench {
        self.bench
    }

    /// `text` with its `{name}`s filled in; those unknown left as they are.
    pub fn fill(&self, text: &str) -> String {
        let text = text.replace("{each}", self.each);
        report::fill(&text, |name| match name {
            "nonce" => Some(format!("{}{}", self.bench.run_id, self.run)),
            "db" => self.db().ok().map(str::to_owned),
            "proxy_port" => self.proxy.as_ref().map(|proxy| proxy.port.to_string()),
            "work" => Some(self.bench.work.display().to_string()),
            name => self
                .bench
                .s
                .var(name)
                .or_else(|| self.figures.get(name).cloned()),
        })
    }

    fn out(&self, extension: &str) -> PathBuf {
        let name = format!("{}-{}-{}.{extension}", self.scenario, self.run, self.step);
        self.bench.work.join(name)
    }

    /// Records `value` under `name` (filled in): a metric of the scenario, or a figure for
    /// later steps (see the module's comment for a metric recorded again).
    fn put(&mut self, name: &str, value: Option<Num>) {
        let name = self.fill(name);
        if name.is_empty() {
            return;
        }
        if let Some(value) = &value {
            self.figures.insert(name.clone(), value.text.clone());
        }
        let Some(slot) = self.record.slot(&name) else {
            return;
        };
        let (old, new) = (
            slot.as_ref().map(|n| n.value),
            value.as_ref().map(|n| n.value),
        );
        *slot = match (name.as_str(), old, new) {
            ("cpu_cores", Some(_), _) => return,
            ("rss_mb", Some(old), Some(new)) if old > new => return,
            ("log_problems" | "shutdown_log_problems", Some(old), Some(new)) => {
                Some(Num::int((old + new) as i64))
            }
            _ => value,
        };
    }

    /// A load's figures, under their own names and as `<to><name>`.
    fn put_load(&mut self, to: &str, figures: Vec<(&str, Option<Num>)>) {
        for (name, value) in figures {
            self.figures.remove(name);
            if let Some(value) = &value {
                self.figures.insert(name.to_owned(), value.text.clone());
            }
            self.put(&format!("{to}{name}"), value);
        }
    }

    /// An operand of `Calc`: a number, or a setting or figure that is one.
    fn value(&self, operand: &str) -> Option<f64> {
        let text = self.fill(operand);
        text.parse()
            .ok()
            .or_else(|| self.figures.get(&text)?.parse().ok())
    }

    /// The PostgreSQL of the stage: its lab's, or the machine's.
    fn pg(&self) -> &Pg {
        self.lab.as_ref().map_or(&self.bench.pg, |(lab, _)| &lab.pg)
    }

    pub fn db(&self) -> anyhow::Result<&str> {
        self.stage
            .as_ref()
            .map(|stage| stage.db.as_str())
            .context("no stage")
    }

    fn queue(&self) -> anyhow::Result<String> {
        let exchange = self
            .stage
            .as_ref()
            .and_then(|stage| stage.exchange.as_ref());
        Ok(format!("{}.q", exchange.context("no exchange")?))
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.bench.s.port)
    }

    /// A fresh database: dropped if present, created and migrated with `retrysafe migrate`, then
    /// BENCH_SETUP_SQL run on it; not once the clean-up has begun.
    fn fresh_db(&self, name: &str) -> anyhow::Result<String> {
        let b = self.bench;
        let db = format!("retrysafe_bench_{}_{name}", b.run_id);
        b.cleanup.guard(|| {
            b.pg.drop_db(&db)?;
            self.migrate(&b.pg, &db)?;
            Ok(db)
        })
    }

    /// `retrysafe migrate` on `db` of `pg`, then BENCH_SETUP_SQL.
    fn migrate(&self, pg: &Pg, db: &str) -> anyhow::Result<()> {
        let b = self.bench;
        let log = harness::append(&b.work.join("migrate.log"))?;
        let mut migrate = Command::new(&b.daemon);
        migrate.args(["migrate", "--config", &b.s.config]);
        migrate.env("RETRYSAFE_DATABASE__URL", pg.url(db));
        migrate.env("RETRYSAFE_LOG__LEVEL", "warn");
        if !migrate
            .stdout(log.try_clone()?)
            .stderr(log)
            .status()?
            .success()
        {
            bail!("migrate {db} failed (see migrate.log)");
        }
        if let Some(sql) = &b.setup_sql {
            pg.query(db, sql)?;
        }
        Ok(())
    }

    /// Drops the stage's database (unless filled) and deletes its exchange and queue.
    fn unstage(&mut self) -> anyhow::Result<()> {
        let Some(stage) = self.stage.take() else {
            return Ok(());
        };
        if !stage.filled {
            self.bench.pg.drop_db(&stage.db)?;
        }
        if self.lab.take().is_some() {
            self.bench.cleanup.stop_servers();
        }
        match stage.exchange {
            Some(x) => block_on(clients::delete(&Names::of(&x, &self.bench.amqp))),
            None => Ok(()),
        }
    }

    /// A fresh exchange, with its queue bound.
    fn exchange(&self, name: &str) -> anyhow::Result<String> {
        let name = name.replace('_', ".");
        let exchange = format!("retrysafe.bench.{}.{name}", self.bench.run_id);
        self.bench.cleanup.bind(&exchange)?;
        Ok(exchange)
    }

    fn start(&mut self, up: Up) -> anyhow::Result<()> {
        let (b, db) = (self.bench, self.db()?.to_owned());
        let stage = self.stage.as_ref().and_then(|s| s.exchange.clone());
        let exchange = stage.context("no exchange")?;
        let db_url = match &self.proxy {
            Some(proxy) => format!(
                "postgres://{}@127.0.0.1:{}/{db}",
                std::env::var("PGUSER")?,
                proxy.port
            ),
            None => self.pg().url(&db),
        };
        let amqp = if up == NoBroker {
            "amqp://guest:guest@127.0.0.1:1/%2f"
        } else {
            &b.amqp
        };
        let env = [
            ("DATABASE__URL", db_url.as_str()),
            ("AMQP__URL", amqp),
            ("AMQP__EXCHANGE", &exchange),
        ];
        let settings = match up {
            Clients => self.with_clients()?,
            _ => b.s.clone(),
        };
        let daemon = Daemon::start(&b.daemon, &settings, &env, self.out("log"), &b.cleanup);
        self.daemon = Some(daemon?);
        match up {
            Spawned => Ok(()),
            _ => self.daemon.as_mut().map_or(Ok(()), Daemon::wait_healthy),
        }
    }

    /// The settings with a configuration of their own: the bench's, and {clients} clients whose
    /// tokens are {tokens}.
    fn with_clients(&self) -> anyhow::Result<Settings> {
        let s = &self.bench.s;
        let mut config = fs::read_to_string(&s.config)?;
        for (client, token) in s.tokens().iter().enumerate() {
            let digest = sha2::Sha256::digest(token.as_bytes());
            let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
            config +=
                &format!("\n[[auth.clients]]\nid = \"bench-{client}\"\ntoken_sha256 = \"{hex}\"\n");
        }
        let path = self.bench.work.join("clients.toml");
        fs::write(&path, config)?;
        let config = path.display().to_string();
        Ok(Settings {
            config,
            ..s.clone()
        })
    }

    fn play(&mut self, steps: &'static [Step]) -> anyhow::Result<()> {
        for step in steps {
            self.step += 1;
            let (scenario, run, at) = (self.scenario, self.run, self.step);
            self.play_one(*step)
                .with_context(|| format!("{scenario} run {run}, step {at}"))?;
        }
        Ok(())
    }

    fn play_one(&mut self, step: Step) -> anyhow::Result<()> {
        let (b, s) = (self.bench, &self.bench.s);
        match step {
            Stage(name) => {
                self.unstage()?;
                let name = format!("{}_{}", self.fill(name), self.run);
                let (db, exchange) = (self.fresh_db(&name)?, Some(self.exchange(&name)?));
                self.stage = Some(Stage {
                    db,
                    filled: false,
                    exchange,
                });
            }
            Db(name) => {
                let db = self.fresh_db(&format!("{}_{}", self.fill(name), self.run))?;
                let stage = self.stage.as_mut().context("no stage")?;
                b.pg.drop_db(&std::mem::replace(&mut stage.db, db))?;
            }
            Fill(name, rows) => {
                self.unstage()?;
                let name = self.fill(name);
                let exchange = Some(self.exchange(&format!("{name}_{}", self.run))?);
                let db = format!("retrysafe_bench_{}_{name}", b.run_id);
                let filled = b.pg.databases_like(&db)?.contains(&db);
                let db = if filled { db } else { self.fresh_db(&name)? };
                self.stage = Some(Stage {
                    db,
                    filled: true,
                    exchange,
                });
                if !filled {
                    self.fill_db(&self.fill(rows))?;
                }
            }
            Lab(kind) => {
                self.unstage()?;
                let name = format!("{}_{}", self.fill(kind), self.run);
                let dir = std::env::temp_dir().join(format!("retrysafe-bench-{}", b.run_id));
                let lab = lab::start(&b.cleanup, &dir, name.starts_with("citus"))?;
                self.migrate(&lab.pg, "retrysafe")?;
                let exchange = Some(self.exchange(&name)?);
                self.lab = Some((lab, 0));
                let db = "retrysafe".to_owned();
                self.stage = Some(Stage {
                    db,
                    filled: true,
                    exchange,
                });
            }
            Unstage => self.unstage()?,
            Sql(name, sql) => {
                let value = self.pg().query(self.db()?, &self.fill(sql))?;
                self.figures.insert(self.fill(name), value.clone());
                self.put(name, Num::parse(&value));
            }
            File(name, sql) => {
                let path = self.out("txt");
                fs::write(&path, self.pg().query(self.db()?, sql)? + "\n")?;
                self.figures.insert(name.into(), path.display().to_string());
            }
            Proxy => {
                let target = format!("{}:{}", std::env::var("PGHOST")?, std::env::var("PGPORT")?);
                let delay = Duration::from_millis(self.each.parse()?);
                self.proxy = None;
                self.proxy = Some(DelayProxy::start(target, delay, "127.0.0.1:0")?);
            }
            Daemon(up) => self.start(up)?,
            Open => {
                let running = self.daemon.as_ref().filter(|d| d.ticks_at_stop.is_none());
                let ticks = running.map_or(Ok(0), Daemon::cpu_ticks)?;
                let (services, machine) = (ServiceTicks::now(), MachineTicks::now()?);
                if let Some((lab, at_open)) = &mut self.lab {
                    *at_open = harness::tree_ticks(lab.postmaster()?);
                }
                self.window = Some((Instant::now(), ticks, services, machine));
                self.emptied = true;
            }
            Load(command, to) => {
                let figures = self.tool(command, |_| Ok(()))?;
                self.put_load(to, figures);
            }
            Precreate => {
                clients::precreate(&self.url(), s.replay_keys as usize)?;
                let bytes = clients::answer_bytes(&self.url())?;
                self.put("answer_bytes", Some(Num::int(bytes as i64)));
            }
            E2e(ordered, to) => {
                let keys = if ordered { s.ordering_keys as usize } else { 0 };
                let (url, queue) = (self.url(), self.queue()?);
                let (rate, seconds) = (s.e2e_rate, s.e2e_seconds);
                let e2e = clients::end_to_end(&url, &b.amqp, &queue, rate, seconds, keys)?;
                let number = |v: Option<f64>| v.and_then(|v| Num::parse(&v.to_string()));
                self.put_load(
                    to,
                    e2e.into_iter().map(|(name, v)| (name, number(v))).collect(),
                );
            }
            Publish(to) => {
                let exchange = self.exchange(&format!("publisher_{}", self.run))?;
                let payload = self.value("payload_bytes").unwrap_or(400.0) as usize;
                let (events, window) = (s.drain_events, s.publish_window as usize);
                let services = ServiceTicks::now();
                let publish = clients::publish(&b.amqp, &exchange, events, payload, window);
                let rate = block_on(publish)?;
                let spent = ServiceTicks::now().since(services);
                let cost = self.service_costs(spent, events as f64)[1].clone();
                let queue = format!("{exchange}.q");
                let queued = Num::int(block_on(clients::count(&b.amqp, &queue, events))? as i64);
                block_on(clients::delete(&Names::of(&exchange, &b.amqp)))?;
                let rate = Num::parse(&rate.to_string());
                let figures = vec![
                    ("events_per_s", rate),
                    ("queued", Some(queued)),
                    ("rabbitmq_cost", cost),
                ];
                self.put_load(to, figures);
            }
            Empty(timeout, name) => {
                let url = self.pg().url(self.db()?);
                self.emptied = block_on(clients::drained(&url, Duration::from_secs(timeout)))?;
                let seconds = self.window.map(|window| window.0.elapsed().as_secs_f64());
                if self.emptied {
                    self.put(name, seconds.and_then(|s| Num::parse(&s.to_string())));
                } else {
                    let unsent = self.pg().count(self.db()?, UNSENT)?;
                    say!("{unsent} events still unsent after {timeout} s: no CPU cost");
                }
            }
            Readings(cores, rss, busy) => {
                let (at, ticks, _, machine) = self.window.context("no window")?;
                self.put(busy, MachineTicks::now()?.since(machine).busy_pct());
                if cores.is_empty() && rss.is_empty() {
                    return Ok(());
                }
                let daemon = self.daemon.as_ref().context("no daemon")?;
                let used = daemon.cpu_ticks()?.saturating_sub(ticks) as f64;
                let used = used / harness::clock_ticks() / at.elapsed().as_secs_f64();
                let hwm = mib(daemon.status_kb("VmHWM")?);
                self.put(cores, Num::fixed(used, 3));
                self.put(rss, hwm);
            }
            LabCost(count, name) => {
                let (lab, at_open) = self.lab.as_ref().context("no lab")?;
                let spent = harness::tree_ticks(lab.postmaster()?).saturating_sub(*at_open);
                let cost = seconds_per_1000(spent, self.value(count).unwrap_or(0.0));
                self.put(name, cost);
            }
            Costs(count, names) => {
                let (_, ticks, services, machine) = self.window.context("no window")?;
                let per_1000 = |spent| seconds_per_1000(spent, self.value(count).unwrap_or(0.0));
                if !self.emptied {
                    return Ok(());
                }
                let daemon = self.daemon.as_ref().map(Daemon::cpu_ticks).transpose()?;
                let daemon = daemon.and_then(|now| per_1000(now.saturating_sub(ticks)));
                let spent = ServiceTicks::now().since(services);
                let [pg, rabbit] = self.service_costs(spent, self.value(count).unwrap_or(0.0));
                let machine = per_1000(MachineTicks::now()?.since(machine).work);
                for (name, cost) in names.iter().zip([daemon, pg, rabbit, machine]) {
                    self.put(name, cost);
                }
            }
            Batches(to) => {
                let metrics = metrics(&self.url())?;
                let value = |name| metric(&metrics, name, "");
                let per = |sum: f64, count: f64, scale: f64| match count > 0.0 {
                    true => Num::fixed(scale * sum / count, 1),
                    false => None,
                };
                let batches = value("retrysafe_writer_batch_size_count");
                let per_batch = per(value("retrysafe_writer_batch_size_sum"), batches, 1.0);
                let commits = value("retrysafe_writer_transaction_seconds_count");
                let ms = per(
                    value("retrysafe_writer_transaction_seconds_sum"),
                    commits,
                    1000.0,
                );
                self.put_load(
                    to,
                    vec![("writes_per_batch", per_batch), ("ms_per_batch", ms)],
                );
            }
            Janitor(command, to) => self.janitor(command, to)?,
            Get(name, path, key) => {
                let url = format!("{}{}", self.url(), self.fill(path));
                let answer = Command::new("curl")
                    .args(["-sf", "--max-time", "30", &url])
                    .output()?;
                let answer: serde_json::Value = serde_json::from_slice(&answer.stdout)?;
                let value = answer[key]
                    .as_str()
                    .with_context(|| format!("GET {url}: no {key}"))?;
                self.figures.insert(name.into(), value.into());
            }
            Queued(name, expect) => {
                let expect = self.value(expect).unwrap_or(0.0) as u64;
                let queued = block_on(clients::count(&b.amqp, &self.queue()?, expect))?;
                self.put(name, Some(Num::int(queued as i64)));
            }
            Stop(count_logs) => {
                let daemon = self.daemon.as_mut().context("no daemon")?;
                let (status, took) = daemon.stop()?;
                let (under_load, after, first) = daemon.log_problems();
                if count_logs {
                    self.put("log_problems", Some(Num::int(under_load as i64)));
                    self.put("shutdown_log_problems", Some(Num::int(after as i64)));
                }
                self.figures
                    .insert("first_problem".into(), first.unwrap_or_default());
                self.put("exit_code", status.code().map(|code| Num::int(code.into())));
                self.put("stop_ms", Some(Num::int(took.as_millis() as i64)));
            }
            Calc(name, a, op, b) => {
                let (a, b) = (self.value(a), self.value(b));
                let value = match (op, a, b) {
                    (Sub, Some(a), Some(b)) => Some(Num::int((a - b) as i64)),
                    (Div(decimals), Some(a), Some(b)) if b > 0.0 => Num::fixed(a / b, decimals),
                    (Eq, a, b) => {
                        let (name, equal) = (self.fill(name), a.is_some() && a == b);
                        if !equal {
                            say!(
                                "FAIL: {} run {}: {name} ({a:?} against {b:?})",
                                self.scenario,
                                self.run
                            );
                        }
                        let before = self.record.get(&name).is_none_or(|flag| flag.value == 1.0);
                        Some(Num::flag(before && equal))
                    }
                    _ => None,
                };
                self.put(name, value);
            }
            Each(values, steps) => {
                for value in values {
                    self.each = value;
                    self.play(steps)?;
                }
            }
            Slices => soak::slices(self)?,
        }
        Ok(())
    }

    /// Runs a program's load (see `Load`), calling `poll` every 500 ms while it runs; its figures.
    fn tool(&mut self, command: &str, mut poll: impl FnMut(&mut Self) -> Check) -> Figures {
        let line = self.fill(command);
        let mut words = line.split_whitespace().peekable();
        let mut env = Vec::new();
        while let Some(pair) = words.peek().and_then(|word| word.split_once('=')) {
            env.push(pair);
            words.next();
        }
        let program = words.next().context("no program")?;
        let out = self.out(program);
        let file = fs::File::create(&out)?;
        let mut tool = Command::new(program);
        tool.args(words)
            .envs(env)
            .stdout(file.try_clone()?)
            .stderr(file);
        let mut tool = tool
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        let sends = self.proxy.as_ref().map(DelayProxy::sends);
        let mut next_poll = Instant::now();
        let status = loop {
            if let Some(status) = tool.try_wait()? {
                break status;
            }
            if Instant::now() >= next_poll {
                poll(self)?;
                next_poll += Duration::from_millis(500);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let text = fs::read_to_string(&out)?;
        let sends = self.proxy.as_ref().map(DelayProxy::sends).zip(sends);
        let sends = (
            "sends",
            sends.map(|(now, before)| Num::int((now - before) as i64)),
        );
        if program == "pgbench" {
            if !status.success() {
                say!("pgbench exited with {status}; see {}", out.display());
            }
            self.quiet()?;
            let [mut tps, mut latency, failed, transactions] = pgbench_figures(&text);
            if line.contains("-P 1") {
                [tps, latency] = pgbench_steady(&text, self.bench.s.duration);
            }
            return Ok(vec![
                ("tps", tps),
                ("latency_ms", latency),
                ("failed", failed),
                ("transactions", transactions),
                sends,
            ]);
        }
        if !status.success() {
            bail!("{program} failed ({status}); see {}", out.display());
        }
        let result = harness::result_line(&text, "BENCH_RESULT");
        let result = result.with_context(|| format!("no result; see {}", out.display()))?;
        Ok(wrk_figures(&result).into_iter().chain([sends]).collect())
    }

    /// Waits (at most 10 s) until pgbench's backends on the stage's database are gone, so that
    /// their whole time counts.
    fn quiet(&self) -> anyhow::Result<()> {
        let db = self.db()?;
        let sql = format!("SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}' AND application_name = 'pgbench'");
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.bench.pg.count("postgres", &sql)? > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// PostgreSQL's and RabbitMQ's CPU seconds per 1,000 `operations`; none if a reading went
    /// down, as after a server restart (which is logged).
    fn service_costs(&self, services: Option<ServiceTicks>, operations: f64) -> [Option<Num>; 2] {
        let Some(s) = services else {
            say!(
                "{}: PostgreSQL's or RabbitMQ's CPU time went down (restarted?): no CPU cost",
                self.scenario
            );
            return [None, None];
        };
        [s.postgres, s.rabbitmq].map(|ticks| seconds_per_1000(ticks, operations))
    }

    /// The stage's database filled to `rows` rows per table with one write of the daemon's own
    /// as the template of every row (bench/scale_fill.sql): the daemon's shape and size.
    fn fill_db(&mut self, rows: &str) -> anyhow::Result<()> {
        let (started, pg) = (Instant::now(), &self.bench.pg);
        self.start(Healthy)?;
        let body = r#"{"kind":"bench.write","data":{"seq":1,"amount":1250,"currency":"EUR","note":"retrysafe benchmark payload"}}"#;
        let key = "Idempotency-Key: scale-template";
        let mut post = Command::new("curl");
        post.args([
            "-sf",
            "-o",
            "/dev/null",
            "-H",
            "Content-Type: application/json",
            "-H",
            key,
        ]);
        post.args(["-d", body, &format!("{}/v1/entries", self.url())])
            .status()?;
        let db = self.db()?.to_owned();
        block_on(clients::drained(&pg.url(&db), Duration::from_secs(30)))?;
        self.daemon.as_mut().context("no daemon")?.stop()?;
        pg.query(&db, &include_str!("scale_fill.sql").replace("{rows}", rows))?;
        pg.query(&db, "VACUUM ANALYZE")?;
        say!(
            "filled {db}: {rows} rows per table in {:.0} s",
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// The janitor's first pass: a daemon started (its janitor begins at once) beside the load;
    /// how fast each table's expired rows went, from the daemon's /metrics.
    fn janitor(&mut self, command: &str, to: &str) -> anyhow::Result<()> {
        let (started, expired) = (Instant::now(), self.bench.s.scale_expired as f64);
        self.start(Healthy)?;
        let deleted = |url: &str, table| {
            metrics(url).map(|text| metric(&text, "retrysafe_janitor_deleted_rows_total", table))
        };
        let mut done = [None, None];
        let figures = self.tool(command, |scene| {
            for (table, done) in ["idempotency_records", "outbox_events"]
                .iter()
                .zip(&mut done)
            {
                if done.is_none() && deleted(&scene.url(), table)? >= expired {
                    *done = Some(started.elapsed().as_secs_f64());
                }
            }
            Ok(())
        })?;
        // Records from the pass's start until the last was deleted; events from then (the pass
        // deletes records first) until theirs were.
        let [records, events] = done;
        let rate = |count: f64, seconds: f64| Num::fixed(count / seconds, 0);
        let records =
            records.and_then(|t| rate(deleted(&self.url(), "idempotency_records").ok()?, t));
        let events_took = events.zip(done[0]).map(|(e, r)| (e - r).max(0.5));
        let events = events_took.and_then(|t| rate(deleted(&self.url(), "outbox_events").ok()?, t));
        self.put_load(
            to,
            figures
                .into_iter()
                .chain([("records_per_s", records), ("events_per_s", events)])
                .collect(),
        );
        Ok(())
    }
}

/// Whether a poll went well.
type Check = anyhow::Result<()>;

/// A load's figures, by name.
type Figures = anyhow::Result<Vec<(&'static str, Option<Num>)>>;

/// wrk's figures, from its `BENCH_RESULT` (see `Load`).
fn wrk_figures(
    result: &serde_json::Map<String, serde_json::Value>,
) -> Vec<(&'static str, Option<Num>)> {
    let count = |kind: &str| field(result, &format!("errors_{kind}")).map(|n| n.value as i64);
    let kinds = ["connect", "read", "write", "status", "timeout"];
    let errors = kinds
        .into_iter()
        .map(count)
        .sum::<Option<i64>>()
        .map(Num::int);
    let mut figures: Vec<_> = ["rps", "p50_ms", "p99_ms", "requests"]
        .map(|name| (name, field(result, name)))
        .into();
    figures.extend([
        ("errors", errors),
        ("status_errors", field(result, "errors_status")),
    ]);
    figures
}

/// pgbench's figures, from its output: tps, the average latency (ms), the failed transactions,
/// and the transactions done.
fn pgbench_figures(text: &str) -> [Option<Num>; 4] {
    let word = |prefix: &str, index: usize| {
        let line = text.lines().rev().find(|line| line.starts_with(prefix))?;
        Num::parse(line.split_whitespace().nth(index)?)
    };
    [
        word("tps = ", 2),
        word("latency average = ", 3),
        word("number of failed transactions:", 4),
        word("number of transactions actually processed:", 5),
    ]
}

/// The medians of pgbench's last `seconds` per-second reports (`-P 1`), tps and latency (ms), the
/// reports before its first transaction and its first partial second left out.
fn pgbench_steady(text: &str, seconds: u32) -> [Option<Num>; 2] {
    let reports: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|line| {
            // progress: 7.0 s, 512.0 tps, lat 124.650 ms stddev 10.123, 0 failed
            let words: Vec<&str> = line
                .strip_prefix("progress: ")?
                .split_whitespace()
                .collect();
            Some((words.get(2)?.parse().ok()?, words.get(5)?.parse().ok()?))
        })
        .skip_while(|(tps, _)| *tps == 0.0)
        .skip(1)
        .collect();
    let steady = &reports[reports.len().saturating_sub(seconds as usize)..];
    let median_of = |pick: fn(&(f64, f64)) -> f64| {
        let values: Vec<Option<Num>> = steady.iter().map(|r| Num::fixed(pick(r), 1)).collect();
        median(&values).and_then(|v| Num::fixed(v, 1))
    };
    [median_of(|r| r.0), median_of(|r| r.1)]
}

/// The daemon's /metrics, as text.
fn metrics(url: &str) -> anyhow::Result<String> {
    let url = format!("{url}/metrics");
    let output = Command::new("curl")
        .args(["-sf", "--max-time", "10", &url])
        .output()?;
    if !output.status.success() {
        bail!("cannot read {url}");
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The sum of a metric's series whose labels contain `label`.
fn metric(text: &str, name: &str, label: &str) -> f64 {
    let series = text
        .lines()
        .filter_map(|line| line.strip_prefix(name)?.split_once(' '));
    let ours =
        |labels: &str| labels.contains(label) && (labels.is_empty() || labels.starts_with('{'));
    let values = series
        .filter(|(labels, _)| ours(labels))
        .map(|(_, value)| value.trim().parse::<f64>());
    values.flatten().sum()
}

fn machine(pg: &Pg, config: &str) -> Machine {
    let (cpu_model, mem_gib) = harness::cpu_and_memory();
    let show = |setting: &str| {
        pg.query("postgres", &format!("SHOW {setting}"))
            .unwrap_or_else(|_| "unknown".into())
    };
    let pgbench = harness::command_line("pgbench", &["--version"]);
    let rustc = harness::command_line("rustc", &["--version"]);
    let settings = fs::read_to_string(config).map(|text| report::quoted_settings(&text));
    Machine {
        cpu_model,
        nproc: harness::command_line("nproc", &[]),
        mem_gib,
        kernel: harness::command_line("uname", &["-sr"]),
        pg_version: show("server_version"),
        autovacuum: show("autovacuum"),
        rabbit_version: harness::rabbit_version(true),
        wrk_version: harness::wrk_version(),
        pgbench_version: pgbench.split_whitespace().nth(2).unwrap_or("").to_owned(),
        rustc_version: if rustc.is_empty() {
            "rustc unknown".into()
        } else {
            rustc
        },
        commit: harness::commit(),
        daemon_settings: settings.unwrap_or_default(),
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let scenarios = list(&args.scenarios)?;
    harness::ensure_tools(&[
        ("wrk", "wrk"),
        ("pgbench", "postgresql-client"),
        ("curl", "curl"),
    ])?;
    let s = args.settings(&Pg::from_env());
    let mut bench = Bench::new(s, args.daemon.clone(), &args.amqp)?;
    bench.setup_sql = args.setup_sql.clone().filter(|sql| !sql.trim().is_empty());
    let outputs = [args.output.as_path(), args.runs_output.as_path()];
    bench.finish(measure(&bench, &scenarios, outputs))
}

/// Runs the scenarios and writes the report to `output` and every run's values to `runs_output`.
fn measure(
    bench: &Bench,
    scenarios: &[&'static Scenario],
    [output, runs_output]: [&Path; 2],
) -> anyhow::Result<()> {
    let s = &bench.s;
    let machine = machine(&bench.pg, &s.config);
    let (id, mode) = (&bench.run_id, if s.quick { "quick" } else { "full" });
    say!(
        "run id {id}; mode {mode}: {} run(s), {}s per measurement, {}-event drain",
        s.runs,
        s.duration,
        s.drain_events
    );
    let mut runs: HashMap<String, Vec<Run>> = HashMap::new();
    for run in 1..=s.runs {
        for scenario in scenarios {
            let record = bench.measure(scenario, run)?.record;
            runs.entry(scenario.name.into()).or_default().push(record);
        }
    }
    let written_at = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string();
    let (settings, run_id) = (s.clone(), id.clone());
    let report = Report {
        settings,
        machine,
        written_at,
        run_id,
        runs,
    };
    for name in ["scale", "citus"] {
        if let Some(table) = report.side_by_side_table(name) {
            println!("\n{table}\n");
            fs::write(bench.work.join(format!("{name}.md")), table + "\n")?;
        }
    }
    if !report::REPORTED
        .iter()
        .any(|name| report.runs.contains_key(*name))
    {
        return Ok(());
    }
    print!("{}", report.summary());
    let existing = fs::read_to_string(output).ok();
    let written = fs::write(output, report.render(existing.as_deref()));
    written.with_context(|| format!("writing {}", output.display()))?;
    let written = fs::write(runs_output, report.render_runs());
    written.with_context(|| format!("writing {}", runs_output.display()))?;
    say!(
        "wrote {}; raw output in {}",
        output.display(),
        bench.work.display()
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
        let seconds = [0.0, 0.0, 3.0, 40.0, 500.0, 510.0, 490.0, 505.0];
        for (second, tps) in seconds.iter().enumerate() {
            let latency = if *tps > 100.0 { 126.0 } else { 900.0 };
            let second = second + 1;
            text += &format!("progress: {second}.0 s, {tps:.1} tps, lat {latency:.3} ms stddev 1.000, 0 failed\n");
        }
        // The zeros and the first partial second are left out; the last three are taken.
        let [tps, latency] = pgbench_steady(&text, 3).map(|n| n.unwrap().value);
        assert_eq!((tps, latency), (505.0, 126.0));
        assert_eq!(pgbench_steady("no progress\n", 3), [None, None]);
    }

    #[test]
    fn wrk_result_line() {
        let text = "Running 5s test\nBENCH_RESULT {\"requests\":97333,\"duration_s\":15.06,\"rps\":6461.60,\"p50_ms\":8.644,\"p90_ms\":20.1,\"p99_ms\":32.912,\"mean_ms\":9.9,\"max_ms\":80.0,\"errors_connect\":0,\"errors_read\":1,\"errors_write\":0,\"errors_status\":2,\"errors_timeout\":3}\n";
        let result = harness::result_line(text, "BENCH_RESULT").unwrap();
        let figures = wrk_figures(&result);
        let texts: Vec<_> = figures
            .iter()
            .map(|(name, n)| format!("{name}={}", n.as_ref().unwrap()))
            .collect();
        let expected = [
            "rps=6461.60",
            "p50_ms=8.644",
            "p99_ms=32.912",
            "requests=97333",
            "errors=6",
            "status_errors=2",
        ];
        assert_eq!(texts, expected);
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
            scale_rows: 5_000_000,
            scale_small: 10_000,
            scale_expired: 500_000,
            port: 18437,
            config: "config.toml".into(),
            output: "BENCHMARKS.md".into(),
            runs_output: "docs/benchmark-runs.md".into(),
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

    #[test]
    fn scenario_lists() {
        let names = |list: Vec<&Scenario>| list.iter().map(|s| s.name).collect::<Vec<_>>();
        let all = list("writes replays storm drain e2e ordered latency").unwrap();
        assert_eq!(names(all), report::REPORTED);
        assert_eq!(names(list(" drain,writes ").unwrap()), ["drain", "writes"]);
        assert!(list("writes reads").is_err());
    }

    #[test]
    fn metrics_by_label() {
        let text = "# TYPE x counter\nx_total{table=\"a\"} 7\nx_total{table=\"b\"} 5\nx_sum 12.5\n";
        assert_eq!(metric(text, "x_total", "\"a\""), 7.0);
        assert_eq!(metric(text, "x_total", ""), 12.0);
        assert_eq!(metric(text, "x_sum", ""), 12.5);
    }
}
