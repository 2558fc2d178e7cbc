//! Every metric the daemon exports, declared once: a constant holding its name, which callers
//! give the `metrics` macros, and its entry in [`METRICS`], from which `/metrics` describes it
//! and a test holds docs/operations.md's table to this one. Prometheus text at `GET /metrics`
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
}

impl Metric {
    const fn in_unit(self, unit: Unit) -> Self {
        Metric {
            unit: Some(unit),
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
    }
}

/// Declares each metric once: a constant holding its name, which callers give the `metrics`
/// macros, and its entry in [`METRICS`], from which `/metrics` describes it and a test checks
/// docs/operations.md. (A name declared apart from its description could be exported without
/// one.)
macro_rules! metrics_table {
    ($($(#[doc = $doc:literal])* $constant:ident = $metric:expr;)+) => {
        $(
            $(#[doc = $doc])*
            pub const $constant: &str = $metric.name;
        )+

        /// Every metric the daemon exports.
        pub const METRICS: &[Metric] = &[$($metric),+];
    };
}

metrics_table! {
    /// Outcomes: created, replayed, conflict, in_progress, rate_limited, invalid, unauthorized,
    /// unavailable, error, ok, not_found.
    HTTP_REQUESTS = metric(
        Counter,
        "retrysafe_http_requests_total",
        &["route", "outcome"],
        "HTTP requests by route and outcome",
    );
    /// Answers actix-http gave itself, by status (400, 408, 431): see `ActixOwnAnswers`.
    HTTP_PROTOCOL_ERRORS = metric(
        Counter,
        "retrysafe_http_protocol_errors_total",
        &["status"],
        "answers given before routing (malformed, too large or too slow request heads), by status",
    );
    HTTP_DURATION = metric(
        Histogram,
        "retrysafe_http_request_duration_seconds",
        &["route"],
        "HTTP request latency by route",
    )
    .in_unit(Unit::Seconds);
    /// Failed batches included.
    WRITER_BATCH_SIZE = metric(Histogram, "retrysafe_writer_batch_size", &[], "writes per batch")
        .in_unit(Unit::Count);
    /// Each attempt, from begin to commit.
    WRITER_TRANSACTION = metric(
        Histogram,
        "retrysafe_writer_transaction_seconds",
        &[],
        "time of one batch transaction",
    )
    .in_unit(Unit::Seconds);
    /// Results: committed, failed; a retried batch counts each try.
    WRITER_BATCHES = metric(
        Counter,
        "retrysafe_writer_batches_total",
        &["result"],
        "writer batch transaction attempts by result",
    );
    WRITER_QUEUE_DEPTH =
        metric(Gauge, "retrysafe_writer_queue_depth", &[], "writes queued for the next batch");
    /// Writes queued, being committed, or waiting for another write of their key.
    PENDING_WRITE_BYTES = metric(
        Gauge,
        "retrysafe_pending_write_bytes",
        &[],
        "bytes held by pending writes (database.max_pending_bytes bounds them)",
    )
    .in_unit(Unit::Bytes);
    /// Reasons: pending_bytes, queue_full, busy.
    WRITES_SHED = metric(
        Counter,
        "retrysafe_writes_shed_total",
        &["reason"],
        "writes refused at once with 503 to shed load, by reason",
    );
    /// Across the shards.
    SHARD_IN_FLIGHT = metric(
        Gauge,
        "retrysafe_shard_in_flight_keys",
        &[],
        "idempotency keys whose write is in flight",
    );
    SHARD_WAITERS = metric(
        Gauge,
        "retrysafe_shard_waiting_duplicates",
        &[],
        "duplicates waiting for an in-flight key",
    );
    /// Results: hit, miss.
    REPLAY_CACHE_LOOKUPS = metric(
        Counter,
        "retrysafe_replay_cache_lookups_total",
        &["result"],
        "replay cache lookups by result",
    );
    /// Across the shards.
    REPLAY_CACHE_ENTRIES =
        metric(Gauge, "retrysafe_replay_cache_entries", &[], "responses in the replay cache");
    /// Bodies, keys and bookkeeping, across the shards.
    REPLAY_CACHE_BYTES = metric(
        Gauge,
        "retrysafe_replay_cache_bytes",
        &[],
        "bytes held by the replay cache",
    )
    .in_unit(Unit::Bytes);
    OUTBOX_UNSENT = metric(
        Gauge,
        "retrysafe_outbox_unsent_events",
        &[],
        "events not yet delivered and not parked",
    );
    OUTBOX_PARKED = metric(
        Gauge,
        "retrysafe_outbox_parked_events",
        &[],
        "events parked after outbox.max_attempts",
    );
    /// Unsent events of ordering keys whose earlier event is parked (README "Ordered delivery").
    OUTBOX_BLOCKED = metric(
        Gauge,
        "retrysafe_outbox_blocked_events",
        &[],
        "events waiting behind a parked event of their ordering key",
    );
    OUTBOX_BLOCKED_KEYS = metric(
        Gauge,
        "retrysafe_outbox_blocked_keys",
        &[],
        "ordering keys whose next event is parked",
    );
    /// 0 when none.
    OUTBOX_OLDEST_AGE = metric(
        Gauge,
        "retrysafe_outbox_oldest_unsent_age_seconds",
        &[],
        "age of the oldest unsent event",
    )
    .in_unit(Unit::Seconds);
    /// Outcomes: acked, nacked, returned, timeout, connection_lost, blocked.
    OUTBOX_PUBLISHES = metric(
        Counter,
        "retrysafe_outbox_publishes_total",
        &["outcome"],
        "event publishes by outcome",
    );
    /// The relay then records the publishes as failed attempts (backing off as failed
    /// publishes do) and waits itself: see docs/operations.md, "Delivery".
    OUTBOX_RECORDING_FAILURES = metric(
        Counter,
        "retrysafe_outbox_recording_failures_total",
        &[],
        "relay batches the broker confirmed whose recording in the database failed (their events are published again, with backoff)",
    );
    OUTBOX_CONFIRM = metric(
        Histogram,
        "retrysafe_outbox_confirm_seconds",
        &[],
        "time from a batch's first publish to its last confirm",
    )
    .in_unit(Unit::Seconds);
    OUTBOX_BATCH_SIZE = metric(
        Histogram,
        "retrysafe_outbox_batch_size",
        &[],
        "events claimed per relay batch",
    )
    .in_unit(Unit::Count);
    /// What /readyz says.
    READY = metric(
        Gauge,
        "retrysafe_ready",
        &[],
        "1 while ready: the database answers, migrations are applied, and writes do not fail",
    );
    BROKER_CONNECTED =
        metric(Gauge, "retrysafe_broker_connected", &[], "1 while the broker connection is up");
    /// A RabbitMQ memory or disk alarm; relays wait on the same connection until it unblocks.
    BROKER_BLOCKED = metric(
        Gauge,
        "retrysafe_broker_blocked",
        &[],
        "1 while the broker blocks publishing (a resource alarm: connection.blocked)",
    );
    /// Every write batch reads it. Times that decide anything are the database's; this shows
    /// how wrong the machine's clock is.
    CLOCK_OFFSET = metric(
        Gauge,
        "retrysafe_database_clock_offset_seconds",
        &[],
        "the database's clock minus this machine's at the last reading",
    )
    .in_unit(Unit::Seconds);
    /// Reasons: disk_full, read_only, no_connections; /readyz is then 503.
    WRITES_BLOCKED = metric(
        Gauge,
        "retrysafe_database_writes_blocked",
        &["reason"],
        "1 while writes fail for a reason only an operator can fix, by reason",
    );
    /// The server committed locally and warned that its synchronous standby did not confirm
    /// (the wait was cancelled): not acknowledged, and the pool's connections are renewed.
    /// See docs/operations.md, "Synchronous replication".
    DB_UNCONFIRMED_COMMITS = metric(
        Counter,
        "retrysafe_database_unconfirmed_commits_total",
        &[],
        "commits the database warned about (not confirmed by a synchronous standby), not acknowledged",
    );
    /// Reasons: queue_full (more than 4,096 spans waiting), export_failed (the collector did
    /// not take a batch in time, or answered an error).
    TRACE_SPANS_DROPPED = metric(
        Counter,
        "retrysafe_trace_spans_dropped_total",
        &["reason"],
        "spans not exported, by reason",
    );
    TRACE_SPANS_EXPORTED = metric(
        Counter,
        "retrysafe_trace_spans_exported_total",
        &[],
        "spans the collector took",
    );
    /// Limits: concurrent_writes, requests_per_second.
    RATE_LIMITED = metric(
        Counter,
        "retrysafe_http_rate_limited_total",
        &["client", "limit"],
        "requests refused with 429 by a client's limits, by client and limit",
    );
    /// Pools: writes, reads.
    POOL_CONNECTIONS =
        metric(Gauge, "retrysafe_db_pool_connections", &["pool"], "open database connections");
    POOL_IDLE =
        metric(Gauge, "retrysafe_db_pool_idle_connections", &["pool"], "idle database connections");
    POOL_MAX = metric(
        Gauge,
        "retrysafe_db_pool_max_connections",
        &["pool"],
        "the pool's share of database.pool_size",
    );
    /// Tables: idempotency_records, outbox_events.
    JANITOR_DELETED = metric(
        Counter,
        "retrysafe_janitor_deleted_rows_total",
        &["table"],
        "rows deleted by the janitor, by table",
    );
    /// Set at start and on every successful reload (SIGHUP); absent without
    /// `http.tls_cert_file`.
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

    /// docs/operations.md has a row per metric, `| name | kind | labels | description |`: the
    /// same metrics, kinds and label names as [`METRICS`].
    #[test]
    fn the_operations_guide_lists_every_metric_with_its_kind_and_labels() {
        let guide =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
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
                .unwrap_or_else(|| panic!("docs/operations.md has no row for {name}"));
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
}
