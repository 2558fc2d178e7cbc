//! Every metric the daemon exports, declared once: a constant holding its name, which callers
//! give the `metrics` macros, and its entry in [`METRICS`], from which `/metrics` describes it
//! and docs/metrics.md's reference is rendered. Prometheus text at `GET /metrics`
//! comes from the recorder installed here ([`metrics_handle`]). A leaf: it imports nothing of
//! the daemon, so that every layer may count.

use std::sync::OnceLock;

use metrics::Unit;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use MetricKind::{Counter, Gauge, Histogram};

/// How a metric is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric the daemon exports.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    pub name: &'static str,
    pub kind: MetricKind,
    pub unit: Option<Unit>,
    /// The labels it is recorded with.
    pub labels: &'static [&'static str],
    /// Its `# HELP` line at `/metrics`.
    pub help: &'static str,
    /// What it means, for docs/metrics.md: its doc comment in [`metrics_table!`].
    pub doc: &'static str,
    /// Read from the shared tables, so every daemon on one database reports the same value.
    pub database_wide: bool,
}

impl Metric {
    const fn in_unit(self, unit: Unit) -> Self {
        Metric {
            unit: Some(unit),
            ..self
        }
    }

    const fn database_wide(self) -> Self {
        Metric {
            database_wide: true,
            ..self
        }
    }
}

const fn metric(
    kind: MetricKind,
    name: &'static str,
    labels: &'static [&'static str],
    help: &'static str,
) -> Metric {
    Metric {
        name,
        kind,
        unit: None,
        labels,
        help,
        doc: "",
        database_wide: false,
    }
}

/// Declares each metric once: a constant holding its name, which callers give the `metrics`
/// macros, and its entry in [`METRICS`], with its doc comment as its meaning, from which
/// `/metrics` describes it and docs/metrics.md's reference is rendered. (A name declared apart
/// from its description could be exported without one.)
macro_rules! metrics_table {
    ($($(#[doc = $doc:literal])* $constant:ident = $metric:expr;)+) => {
        $(
            $(#[doc = $doc])*
            pub const $constant: &str = $metric.name;
        )+

        /// Every metric the daemon exports.
        pub const METRICS: &[Metric] = &[$(Metric {
            doc: concat!($($doc),*),
            ..$metric
        }),+];
    };
}

metrics_table! {
    /// Requests answered. `route` is the route pattern: `/v1/entries`, `/v1/entries/{id}`,
    /// `/v1/idempotency-keys/{key}`, `/healthz`, `/readyz`, `/metrics`, `/openapi.json`, or
    /// `unmatched` (no route). `outcome`: `created` (201, a new entry), `replayed` (a replay of a
    /// completed key), `conflict` (`idempotency-key-reused`, 409 or 422), `in_progress` (409
    /// `request-in-progress`), `rate_limited` (429), `invalid` (400, 405, 408, 413, 415, 421),
    /// `unauthorized` (401), `unavailable` (503: `storage-unavailable`, including writes shed by
    /// saturated writers, and also a 503 from `/readyz`), `error` (500), `ok` (another 2xx/3xx,
    /// e.g. a `GET`), `not_found` (404).
    HTTP_REQUESTS = metric(
        Counter,
        "retrysafe_http_requests_total",
        &["route", "outcome"],
        "HTTP requests by route and outcome",
    );
    /// Answers actix-http gave before a request reached a route: a request head it could not parse
    /// (a NUL byte in a header, a line without a colon), one that did not arrive within
    /// `http.head_timeout`, one too large. They are also logged at WARN (`refused a request before
    /// routing`, with `status`, `detail` and `suppressed`), sampled: per status, the first one,
    /// then at most one line every 10 s, whose `suppressed` says how many more came since the
    /// previous line (a flood of idle or slowloris connections writes a few lines, not one each, so
    /// journald's rate limit keeps the lines that matter); this counter counts every one. They have
    /// no `x-request-id` and no problem+json body: actix-http writes them itself. Values of
    /// `status`: `400`, `408`, `431`.
    HTTP_PROTOCOL_ERRORS = metric(
        Counter,
        "retrysafe_http_protocol_errors_total",
        &["status"],
        "answers given before routing (malformed, too large or too slow request heads), by status",
    );
    /// Time from receiving the request to the response, per route.
    HTTP_DURATION = metric(
        Histogram,
        "retrysafe_http_request_duration_seconds",
        &["route"],
        "HTTP request latency by route",
    )
    .in_unit(Unit::Seconds);
    /// Writes per batch a writer takes (recorded when the batch starts, whether it commits or not).
    WRITER_BATCH_SIZE = metric(Histogram, "retrysafe_writer_batch_size", &[], "writes per batch")
        .in_unit(Unit::Count);
    /// Time of one batch transaction, from taking a connection to commit (or failure). Each attempt
    /// of a retried batch is recorded.
    WRITER_TRANSACTION = metric(
        Histogram,
        "retrysafe_writer_transaction_seconds",
        &[],
        "time of one batch transaction",
    )
    .in_unit(Unit::Seconds);
    /// Batch transactions by result, per attempt: a batch retried after a deadlock counts once as
    /// `failed` and once as `committed`; when a batch is split to isolate a bad item, each
    /// single-item transaction counts.
    WRITER_BATCHES = metric(
        Counter,
        "retrysafe_writer_batches_total",
        &["result"],
        "writer batch transaction attempts by result",
    );
    /// Writes queued in the writers, waiting for the next batch.
    WRITER_QUEUE_DEPTH =
        metric(Gauge, "retrysafe_writer_queue_depth", &[], "writes queued for the next batch");
    /// Request data held by writes queued, being committed, or waiting for another write of their
    /// key; bounded by `database.max_pending_bytes`.
    PENDING_WRITE_BYTES = metric(
        Gauge,
        "retrysafe_pending_write_bytes",
        &[],
        "bytes held by pending writes (database.max_pending_bytes bounds them)",
    )
    .in_unit(Unit::Bytes);
    /// Writes refused at once with 503 to shed load: pending writes over
    /// `database.max_pending_bytes`, the writers' queue full (`8 × database.max_batch` per writer),
    /// on Citus the queue's share of the node that holds the client's rows full (as many writes
    /// as its writers' share: half the writers, rounded up) or writes to that node failing
    /// ([Scaling out](scaling.md#when-a-node-fails)), or no turn to decode a large body within
    /// `idempotency.wait_timeout`. Values of `reason`:
    /// `pending_bytes`, `queue_full`, `node_queue_full`, `node_failing`, `busy`.
    WRITES_SHED = metric(
        Counter,
        "retrysafe_writes_shed_total",
        &["reason"],
        "writes refused at once with 503 to shed load, by reason",
    );
    /// Keys whose write is in flight (sent to a writer, not yet answered).
    SHARD_IN_FLIGHT = metric(
        Gauge,
        "retrysafe_shard_in_flight_keys",
        &[],
        "idempotency keys whose write is in flight",
    );
    /// Requests waiting for the write in flight of their key (with the same body or not) to finish,
    /// to be judged against its record.
    SHARD_WAITERS = metric(
        Gauge,
        "retrysafe_shard_waiting_duplicates",
        &[],
        "duplicates waiting for an in-flight key",
    );
    /// Replay-cache lookups; one per valid `POST /v1/entries`, made in the HTTP worker. A hit is
    /// answered there from memory, without a message to the key shard. Values of `result`: `hit`,
    /// `miss`.
    REPLAY_CACHE_LOOKUPS = metric(
        Counter,
        "retrysafe_replay_cache_lookups_total",
        &["result"],
        "replay cache lookups by result",
    );
    /// Responses held in the replay cache.
    REPLAY_CACHE_ENTRIES =
        metric(Gauge, "retrysafe_replay_cache_entries", &[], "responses in the replay cache");
    /// Bytes held by the replay cache's entries (keys and saved bodies): the cache's share of the
    /// daemon's memory.
    REPLAY_CACHE_BYTES = metric(
        Gauge,
        "retrysafe_replay_cache_bytes",
        &[],
        "bytes held by the replay cache",
    )
    .in_unit(Unit::Bytes);
    /// Events not yet delivered and not parked, counted up to 100,000 (at 100000, at least that
    /// many: a refresh costs the same whatever the backlog); refreshed every 5 s.
    OUTBOX_UNSENT = metric(
        Gauge,
        "retrysafe_outbox_unsent_events",
        &[],
        "events not yet delivered and not parked",
    )
    .database_wide();
    /// Events parked after `outbox.max_attempts` failed publishes, counted up to 100,000; refreshed
    /// every 5 s.
    OUTBOX_PARKED = metric(
        Gauge,
        "retrysafe_outbox_parked_events",
        &[],
        "events parked after outbox.max_attempts",
    )
    .database_wide();
    /// Unsent events of ordering keys whose earlier event is parked: they wait until it is retried
    /// or skipped ([Ordered delivery](ordering.md)); counted up to 100,000; refreshed every 5 s.
    OUTBOX_BLOCKED = metric(
        Gauge,
        "retrysafe_outbox_blocked_events",
        &[],
        "events waiting behind a parked event of their ordering key",
    )
    .database_wide();
    /// Ordering keys held back by a parked event; refreshed every 5 s.
    OUTBOX_BLOCKED_KEYS = metric(
        Gauge,
        "retrysafe_outbox_blocked_keys",
        &[],
        "ordering keys whose next event is parked",
    )
    .database_wide();
    /// Age of the oldest unsent, unparked event, in seconds; 0 when there is none; refreshed every
    /// 5 s. Read from the 100,000 events due first: exact while the backlog is smaller, a lower
    /// bound beyond (an older event whose next attempt is later than theirs is not seen).
    OUTBOX_OLDEST_AGE = metric(
        Gauge,
        "retrysafe_outbox_oldest_unsent_age_seconds",
        &[],
        "age of the oldest unsent event",
    )
    .in_unit(Unit::Seconds)
    .database_wide();
    /// Publishes by how the broker answered. `acked`: confirmed and routed, the event is marked
    /// sent. `nacked`: the broker refused it (a queue full with `reject-publish`, say); retried on
    /// a slower schedule ([Nacks](operations.md#a-full-queue-nacks)). `blocked`: the batch's
    /// confirms did not come while the broker blocked publishing; not a failed attempt, the events
    /// are due again once it unblocks. `returned`: no queue is bound for the routing key (the
    /// publish is `mandatory`; a returned message is matched to its event by `message_id`).
    /// `timeout`: not written or not confirmed within the batch's `outbox.confirm_timeout`.
    /// `connection_lost`: the channel or connection failed during the batch. In a batch whose
    /// confirms are incomplete, the events the broker acked are counted under that batch's
    /// `timeout` or `connection_lost`, since they are published again. Every outcome but `acked` is
    /// a failed attempt.
    OUTBOX_PUBLISHES = metric(
        Counter,
        "retrysafe_outbox_publishes_total",
        &["outcome"],
        "event publishes by outcome",
    );
    /// Relay batches the broker confirmed whose recording then failed (marking the events sent,
    /// advancing their ordering keys, or the commit): the transaction is rolled back, so the events
    /// are published again. Each such publish is recorded as a failed attempt instead (`last_error`
    /// starts `published, but recording the publish failed`), which backs off like a failed publish
    /// and parks after `outbox.max_attempts`, and the relay waits before its next batch, longer
    /// each time in a row: a persistent fault costs a bounded number of copies. Above zero: look at
    /// the ERROR lines `the broker confirmed a batch, but recording it failed`.
    OUTBOX_RECORDING_FAILURES = metric(
        Counter,
        "retrysafe_outbox_recording_failures_total",
        &[],
        "relay batches the broker confirmed whose recording in the database failed (their events are published again, with backoff)",
    );
    /// Time from a relay batch's first publish to its last confirm.
    OUTBOX_CONFIRM = metric(
        Histogram,
        "retrysafe_outbox_confirm_seconds",
        &[],
        "time from a batch's first publish to its last confirm",
    )
    .in_unit(Unit::Seconds);
    /// Events claimed per relay batch (batches that claimed none are not recorded).
    OUTBOX_BATCH_SIZE = metric(
        Histogram,
        "retrysafe_outbox_batch_size",
        &[],
        "events claimed per relay batch",
    )
    .in_unit(Unit::Count);
    /// 1 while the database answers, has every migration this build needs and writes do not fail
    /// (what `/readyz` says), else 0; checked every 5 s, and by `/readyz` at most once a second.
    READY = metric(
        Gauge,
        "retrysafe_ready",
        &[],
        "1 while ready: the database answers, migrations are applied, and writes do not fail",
    );
    /// 1 while this daemon's broker connection is up, else 0; read at scrape time. A connection the
    /// broker blocks is up.
    BROKER_CONNECTED =
        metric(Gauge, "retrysafe_broker_connected", &[], "1 while the broker connection is up");
    /// 1 while the broker blocks this daemon's publishing (`connection.blocked`: a memory or disk
    /// alarm), else 0. The relays wait on the same connection until it unblocks.
    BROKER_BLOCKED = metric(
        Gauge,
        "retrysafe_broker_blocked",
        &[],
        "1 while the broker blocks publishing (a resource alarm: connection.blocked)",
    );
    /// The database's clock minus this machine's at the last reading (every write batch reads it).
    /// Positive: this machine is behind. See [Clocks](operations.md#clocks). Times that decide
    /// anything are the database's; this shows how wrong the machine's clock is.
    CLOCK_OFFSET = metric(
        Gauge,
        "retrysafe_database_clock_offset_seconds",
        &[],
        "the database's clock minus this machine's at the last reading",
    )
    .in_unit(Unit::Seconds);
    /// 1 while writes fail for that reason (what `/readyz` reports as `writes: failing`, once it
    /// has lasted), else 0. Values of `reason`: `disk_full`, `read_only`, `no_connections`.
    WRITES_BLOCKED = metric(
        Gauge,
        "retrysafe_database_writes_blocked",
        &["reason"],
        "1 while writes fail for a reason only an operator can fix, by reason",
    );
    /// Commits the database answered with a warning instead of a plain success: above all
    /// "canceling wait for synchronous replication" (committed locally, not confirmed by the
    /// synchronous standby; the wait was cancelled, as pg_auto_failover does when it lets a primary
    /// go on without its standby). None of them is acknowledged (503), and the pool's connections
    /// are opened anew. Above zero: a primary lost its standby, or an old primary cut off from the
    /// formation still takes connections. See [Synchronous
    /// replication](operations.md#synchronous-replication).
    DB_UNCONFIRMED_COMMITS = metric(
        Counter,
        "retrysafe_database_unconfirmed_commits_total",
        &[],
        "commits the database warned about (not confirmed by a synchronous standby), not acknowledged",
    );
    /// Spans not exported: more than 4,096 were waiting (`queue_full`), or the collector did not
    /// take their batch within 5 s or answered an error (`export_failed`). Writes never wait for
    /// the export. See [Tracing](tracing.md).
    TRACE_SPANS_DROPPED = metric(
        Counter,
        "retrysafe_trace_spans_dropped_total",
        &["reason"],
        "spans not exported, by reason",
    );
    /// Spans the collector took (with `telemetry.otlp_endpoint`).
    TRACE_SPANS_EXPORTED = metric(
        Counter,
        "retrysafe_trace_spans_exported_total",
        &[],
        "spans the collector took",
    );
    /// Requests refused with 429 by a client's limits ([Client
    /// limits](operations.md#client-limits)). Values of `limit`: `concurrent_writes`,
    /// `requests_per_second`.
    RATE_LIMITED = metric(
        Counter,
        "retrysafe_http_rate_limited_total",
        &["client", "limit"],
        "requests refused with 429 by a client's limits, by client and limit",
    );
    /// Open database connections in each of this daemon's pools, at scrape time. Values of `pool`:
    /// `writes`, `reads`.
    POOL_CONNECTIONS =
        metric(Gauge, "retrysafe_db_pool_connections", &["pool"], "open database connections");
    /// Of those, idle ones. In use = connections − idle.
    POOL_IDLE =
        metric(Gauge, "retrysafe_db_pool_idle_connections", &["pool"], "idle database connections");
    /// Each pool's share of `database.pool_size`: a quarter (at least one) for `reads`, the rest
    /// for `writes`.
    POOL_MAX = metric(
        Gauge,
        "retrysafe_db_pool_max_connections",
        &["pool"],
        "the pool's share of database.pool_size",
    );
    /// Rows this daemon's janitor deleted (`retrysafe purge` runs in its own process and is not
    /// counted). Values of `table`: `idempotency_records`, `outbox_events`.
    JANITOR_DELETED = metric(
        Counter,
        "retrysafe_janitor_deleted_rows_total",
        &["table"],
        "rows deleted by the janitor, by table",
    );
    /// When the HTTPS listener's certificate expires, in seconds since the Unix epoch; set at start
    /// and by every successful reload (SIGHUP). Absent without `http.tls_cert_file`.
    TLS_CERTIFICATE_EXPIRY = metric(
        Gauge,
        "retrysafe_tls_certificate_expiry_timestamp_seconds",
        &[],
        "expiry of the https listener's certificate, in seconds since the unix epoch",
    )
    .in_unit(Unit::Seconds);
}

/// Latency buckets, in seconds: 0.5 ms to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// The process-wide Prometheus recorder, installed on first use.
pub fn metrics_handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
            .and_then(|builder| {
                builder.set_buckets_for_metric(Matcher::Suffix("_batch_size".into()), BATCH_BUCKETS)
            })
            .expect("the bucket lists are not empty")
            .build_recorder();
        let handle = recorder.handle();
        // Fails only if another recorder was installed first (an embedding program's); then
        // /metrics shows what this one sees, which is nothing, rather than crash.
        if let Err(error) = metrics::set_global_recorder(recorder) {
            tracing::warn!(error = %error, "a metrics recorder was already installed");
        }
        describe_metrics();
        handle
    })
}

/// Reads the process's own figures into the standard Prometheus process metrics
/// (`process_resident_memory_bytes`, `process_cpu_seconds_total`, `process_open_fds`,
/// `process_max_fds`, `process_threads`, `process_start_time_seconds`, ...), for each scrape:
/// the daemon's memory over days is watched with them.
pub fn collect_process_metrics() {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR
        .get_or_init(|| {
            metrics_handle();
            let collector = metrics_process::Collector::default();
            collector.describe();
            collector
        })
        .collect();
}

/// Every metric's description, from [`METRICS`].
fn describe_metrics() {
    metrics::with_recorder(|recorder| {
        for metric in METRICS {
            let name = metrics::KeyName::from_const_str(metric.name);
            let help = metrics::SharedString::const_str(metric.help);
            match metric.kind {
                MetricKind::Counter => recorder.describe_counter(name, metric.unit, help),
                MetricKind::Gauge => recorder.describe_gauge(name, metric.unit, help),
                MetricKind::Histogram => recorder.describe_histogram(name, metric.unit, help),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/metrics.md has a row per metric, `| name | kind | labels | description |`: the
    /// same metrics, kinds and label names as [`METRICS`].
    #[test]
    fn the_metrics_reference_lists_every_metric_with_its_kind_and_labels() {
        let guide =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md"))
                .unwrap();
        let rows: Vec<Vec<&str>> = guide
            .lines()
            .filter(|line| line.starts_with("| `retrysafe_"))
            .map(|line| line.splitn(5, '|').map(str::trim).collect())
            .collect();
        assert_eq!(rows.len(), METRICS.len(), "one row per metric");
        for metric in METRICS {
            let name = format!("`{}`", metric.name);
            let row = rows
                .iter()
                .find(|row| row[1] == name)
                .unwrap_or_else(|| panic!("docs/metrics.md has no row for {name}"));
            let kind = format!("{:?}", metric.kind).to_lowercase();
            assert!(row[2].starts_with(&kind), "{name} is a {kind}: {row:?}");
            // Label names come first, their values after a colon: `client`, `limit`: `...`.
            let names = row[3].split(':').next().unwrap_or_default();
            let mut documented: Vec<&str> = names
                .split(',')
                .map(|label| label.trim().trim_matches('`'))
                .filter(|label| !label.is_empty())
                .collect();
            let mut labels = metric.labels.to_vec();
            documented.sort_unstable();
            labels.sort_unstable();
            assert_eq!(documented, labels, "the labels of {name}");
        }
    }

    /// The reference: a row per metric, its name, kind (and scope), labels and meaning.
    fn render() -> String {
        let mut out = String::from("| metric | type | labels | meaning |\n|---|---|---|---|\n");
        for metric in METRICS {
            assert!(
                !metric.doc.trim().is_empty(),
                "{} has no doc comment",
                metric.name
            );
            assert!(
                !metric.doc.contains('|'),
                "{}: a `|` would end its cell",
                metric.name
            );
            let kind = format!("{:?}", metric.kind).to_lowercase();
            let scope = if metric.database_wide {
                " (database-wide)"
            } else {
                ""
            };
            let labels: Vec<String> = metric
                .labels
                .iter()
                .map(|label| format!("`{label}`"))
                .collect();
            out.push_str(&format!(
                "| `{}` | {kind}{scope} | {} | {} |\n",
                metric.name,
                labels.join(", "),
                metric.doc.trim()
            ));
        }
        out
    }

    /// docs/metrics.md's reference is what [`METRICS`] renders now.
    #[test]
    fn the_metrics_reference_is_rendered_from_the_table() {
        crate::reference_docs::check_or_bless(
            "docs/metrics.md",
            "metrics reference",
            "the metrics table in src/metric.rs",
            "metric::tests::the_metrics_reference_is_rendered_from_the_table",
            &render(),
        );
    }
}
