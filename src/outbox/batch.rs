//! One relay batch: claim due rows, publish them with pipelined confirms, record the result,
//! all in one transaction. [`relay_once`] runs one; [`relay_until_empty`] runs them until nothing
//! is due, for tests and tools; the [`OutboxRelay`](super::relay::OutboxRelay) actor runs them
//! again and again in the daemon.

use std::time::Duration;

use lapin::Channel;
use tokio::sync::oneshot;

use crate::db::topology::{Pass, Topology};
use crate::db::{Database, PgClient, StorageError, WriteHealth};
use crate::metric;
use crate::outbox::broker::Broker;
use crate::outbox::publish::{publish_all_then, Destination, FailureKind, PublishResult};
use crate::outbox::spans::PublishSpans;
use crate::outbox::store::{self, FailedAttempt, OrderingKeys, RelayStatements};

#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub exchange: String,
    pub batch_size: usize,
    pub poll_interval: Duration,
    pub confirm_timeout: Duration,
    pub max_attempts: i32,
    /// Where the outbox lives: a batch claims the events of one [`Pass`] (on Citus, one shard's).
    pub topology: Topology,
    /// Which nodes do not answer (on Citus): their passes wait until they do, and a batch that
    /// finds one so says.
    pub health: WriteHealth,
}

impl RelayConfig {
    pub fn from_config(
        config: &crate::config::Config,
        (topology, health): (Topology, WriteHealth),
    ) -> Self {
        Self {
            exchange: config.amqp.exchange.clone(),
            batch_size: config.outbox.batch_size,
            poll_interval: config.outbox.poll_interval,
            confirm_timeout: config.outbox.confirm_timeout,
            max_attempts: config.outbox.max_attempts,
            topology,
            health,
        }
    }

    /// What a round of batches claims from, one pass after another ([`Topology::passes`]).
    pub fn passes(&self) -> Vec<Pass> {
        self.topology.passes()
    }
}

/// Publishes every due event of the outbox in `config`'s database, batch after batch, until a
/// batch finds nothing due; returns how many were marked sent. What a relay does, once, without
/// a relay running: for tests and tools that must not wait for a poll. Events that fail are
/// scheduled for a later attempt as a relay would, and are not due again within this call.
pub async fn relay_until_empty(config: &crate::config::Config) -> anyhow::Result<usize> {
    let db = Database::new(&config.database)?;
    let broker = Broker::new(&config.amqp)?;
    let topology = Topology::detect(&db, &[]).await?;
    let relay_config = RelayConfig::from_config(config, (topology, WriteHealth::default()));
    let channel = broker.open_channel().await?;
    let mut sent = 0;
    for pass in relay_config.passes() {
        loop {
            let report = relay_once(&broker, &channel.channel, &relay_config, &pass).await?;
            sent += report.sent;
            if report.claimed == 0 || report.channel_broken || report.blocked {
                break;
            }
        }
    }
    broker.close().await;
    Ok(sent)
}

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayReport {
    pub claimed: usize,
    /// As many were claimed as the batch could take: more may be due.
    pub full: bool,
    /// Some of the claimed events were of an ordering key.
    pub ordered: bool,
    /// Events the broker confirmed, now marked sent.
    pub sent: usize,
    /// The channel failed during the batch and must be replaced.
    pub channel_broken: bool,
    /// The broker nacked a publish: the next batch uses a fresh channel on the same connection.
    /// (A channel opened while a quorum queue had no leader may go on nacking every publish
    /// routed to it after a new leader is elected; a fresh channel does not.)
    pub renew_channel: bool,
    /// The broker blocks publishing (a resource alarm): the batch was not published, or its
    /// confirms did not come while the broker blocked it. Nothing was marked, no attempt
    /// counted; its events are due again once the broker unblocks. Its channel is not used
    /// again (confirms of its publishes may still come), but its connection is kept: the
    /// broker will unblock it.
    pub blocked: bool,
    /// The broker confirmed the batch, but recording that in the database failed: its events
    /// are published again later (each with a failed attempt counted where that could be
    /// recorded), and the relay backs off.
    pub recording_failed: bool,
}

/// Claims up to `batch_size` due rows, publishes them all with confirms pipelined, awaits the
/// confirms, and in the same transaction marks each row sent (acked, not returned) or failed.
/// Other relays skip the rows this one holds, so no row is published by two at once.
///
/// The whole batch is bounded on the client's side by the database's operation deadline plus
/// `outbox.confirm_timeout`: past it the batch is abandoned, nothing is marked, and its rows are
/// claimed again (a resend, which consumers dedupe; never a loss). It is abandoned as soon as
/// the database (on Citus, the pass's node) is found not to answer at all, as a write batch is
/// ([`Database::unresponsive`]), and that is told to the write health: a hung node holds a
/// relay's batches no longer than a writer's, and the relays leave its passes out until it
/// answers again.
pub async fn relay_once(
    broker: &Broker,
    channel: &Channel,
    config: &RelayConfig,
    pass: &Pass,
) -> Result<RelayReport, StorageError> {
    relay_once_then(broker, channel, (config, pass), None).await
}

/// [`relay_once`], sending on `on_full_batch` once a full batch (`batch_size` rows: more may be due) is
/// published, before its confirms are awaited: the relay's cue to start its next batch.
pub(super) async fn relay_once_then(
    broker: &Broker,
    channel: &Channel,
    (config, pass): (&RelayConfig, &Pass),
    on_full_batch: Option<oneshot::Sender<()>>,
) -> Result<RelayReport, StorageError> {
    let db = &pass.db;
    let limit = db.operation_timeout() + config.confirm_timeout;
    let batch = db.run_within(limit, async |connection| {
        relay_batch(connection, broker, (channel, config, pass), on_full_batch).await
    });
    tokio::select! {
        report = batch => report,
        hung = db.unresponsive() => {
            config.health.failed(pass.node(), &hung);
            Err(hung)
        }
    }
}

/// One relay batch, in one transaction: claim due rows, publish them, mark what the broker
/// confirmed and reschedule the rest. Kept whole because each step uses the previous one's
/// rows inside the same transaction (the claim's row locks last until COMMIT).
///
/// `BEGIN` is sent with the claim, and the marks with `COMMIT`, each pair in one round trip
/// (tokio-postgres pipelines requests sent together on one connection): a batch costs the
/// database two round trips, not four. After a failure the transaction is rolled back before
/// the connection goes back to the pool.
///
/// With a synchronous standby, the claimed events are published only once a
/// [`barrier`](crate::db::barrier) on another connection, taken after the claim, is confirmed
/// by the standby (the standby of the node that holds them, on Citus: [`Pass::barrier`]): a write whose
/// commit's wait for the standby was cancelled is visible on the primary at once (its client
/// was answered 503, not 201), and an event of it published before the standby has it would be
/// an event of a write that a failover loses. If the barrier is not confirmed, nothing is
/// published and the batch ends as failed (its events are due again at once: no attempt is
/// counted, the events did not fail).
async fn relay_batch(
    connection: &mut PgClient,
    broker: &Broker,
    (channel, config, pass): (&Channel, &RelayConfig, &Pass),
    on_full_batch: Option<oneshot::Sender<()>>,
) -> Result<RelayReport, StorageError> {
    let statements = RelayStatements::prepare(connection).await?;
    let warnings = connection.warnings();
    let client: &tokio_postgres::Client = connection;
    let (begun, promised, claimed) = tokio::join!(
        client.batch_execute(pass.begin()),
        client.query_one(&statements.replication_promised, &[]),
        store::claim_due(client, &statements, config.batch_size, pass.clients()),
    );
    let claimed = match (begun, promised, claimed) {
        (Err(error), _, _) | (Ok(()), Err(error), _) => Err(StorageError::from(error)),
        (Ok(()), Ok(_), Err(error)) => Err(error),
        (Ok(()), Ok(promised), Ok(claim)) if !claim.events.is_empty() => {
            match pass.barrier(promised.get(0)).await {
                Ok(()) => Ok(claim),
                Err(error) => Err(StorageError::Unavailable(format!(
                    "not publishing {} events: the synchronous standby did not confirm a barrier after their claim ({error})",
                    claim.events.len()
                ))),
            }
        }
        (Ok(()), Ok(_), Ok(claim)) => Ok(claim),
    };
    let result = match claimed {
        Err(error) => Err(error),
        Ok(claim) => {
            let target = Publishing {
                broker,
                channel,
                config,
            };
            let full = claim.events.len() >= config.batch_size;
            let ordered = claim
                .events
                .iter()
                .any(|event| event.ordering_key.is_some());
            publish_and_record(client, &statements, target, claim, on_full_batch)
                .await
                .map(|report| RelayReport {
                    full,
                    ordered,
                    ..report
                })
        }
    };
    if let Err(error) = &result {
        // Also sent when BEGIN failed: ROLLBACK outside a transaction only warns.
        if let Err(rollback) = client.batch_execute("ROLLBACK").await {
            return Err(StorageError::Unavailable(format!(
                "{error}; and the rollback after it failed: {rollback}"
            )));
        }
        return result;
    }
    // Marks the server warned about may be lost with it (the events are then sent again:
    // at least once); what matters is leaving a server that does not replicate.
    connection.confirm_commit(warnings)?;
    result
}

/// Where a batch goes: the broker (for its flow control), the channel, and the relay's
/// settings.
#[derive(Clone, Copy)]
struct Publishing<'a> {
    broker: &'a Broker,
    channel: &'a Channel,
    config: &'a RelayConfig,
}

/// The rest of [`relay_batch`], inside its transaction: publish the claimed events, then mark
/// them and commit. While the broker blocks publishing, nothing is published, or, if the block
/// came while the batch awaited its confirms, nothing is marked: the transaction is rolled back
/// and no attempt counted (flow control is not a failure of the events). Every end of the
/// transaction (COMMIT, or ROLLBACK under a block) is here; the steps between are functions.
async fn publish_and_record(
    client: &tokio_postgres::Client,
    statements: &RelayStatements,
    Publishing {
        broker,
        channel,
        config,
    }: Publishing<'_>,
    claim: store::Claim,
    on_full_batch: Option<oneshot::Sender<()>>,
) -> Result<RelayReport, StorageError> {
    let store::Claim {
        events,
        database_now,
    } = claim;
    let Some(database_now) = database_now else {
        client.batch_execute("COMMIT").await?;
        return Ok(RelayReport::default());
    };
    let blocked_report = RelayReport {
        claimed: events.len(),
        blocked: true,
        ..RelayReport::default()
    };
    let blocks_before = broker.blocks_so_far();
    if broker.blocked().is_some() {
        client.batch_execute("ROLLBACK").await?;
        return Ok(blocked_report);
    }
    let spans = PublishSpans::start(&config.exchange, &events);
    let results = publish_batch(channel, config, &events, on_full_batch).await;
    if let Some(spans) = spans {
        spans.finish(&results);
    }
    let unconfirmed = results.iter().any(
        |result| matches!(result, PublishResult::Failed { kind, .. } if kind.breaks_channel()),
    );
    let blocked_meanwhile = broker.blocked().is_some() || broker.blocks_so_far() != blocks_before;
    if unconfirmed && blocked_meanwhile {
        metrics::counter!(metric::OUTBOX_PUBLISHES, "outcome" => "blocked")
            .increment(events.len() as u64);
        client.batch_execute("ROLLBACK").await?;
        return Ok(blocked_report);
    }
    let sorted = sort_results(&events, results);
    // The ordering keys of the events now sent move on, and their next events are released
    // (store::ADVANCE_KEYS), in this transaction: a key's next event becomes due exactly when
    // this one is recorded sent. Nothing for a batch without ordered events.
    let sent_events: Vec<&store::PendingEvent> = sorted.sent_events(&events).collect();
    let advancing = OrderingKeys::of(sent_events.iter().copied());
    // A failed mark leaves the transaction aborted: the COMMIT sent behind it then rolls back
    // (PostgreSQL answers it with ROLLBACK, not an error), and the mark's error is returned.
    // The statements go together, in this order (tokio-postgres pipelines them).
    let (marked_sent, marked_failed, locked, advanced, committed) = tokio::join!(
        store::mark_sent(client, statements, &sent_events),
        store::mark_failed(
            client,
            statements,
            &sorted.failures,
            (config.max_attempts, database_now)
        ),
        store::lock_keys(client, statements, &advancing),
        store::advance_keys(client, statements, &advancing),
        client.batch_execute("COMMIT"),
    );
    let recorded = marked_sent
        .and(marked_failed)
        .and(locked)
        .and(advanced)
        .and(committed.map_err(StorageError::from));
    if let Err(error) = recorded {
        metrics::counter!(metric::OUTBOX_RECORDING_FAILURES).increment(1);
        return Ok(record_unrecorded(
            client,
            statements,
            &events,
            &error,
            (config.max_attempts, database_now),
        )
        .await);
    }
    log_failures(&sorted.failures, config.max_attempts);
    Ok(sorted.report)
}

/// After the broker confirmed a batch whose recording (mark sent, advance the ordering keys,
/// the commit) then failed and was rolled back: the events are due again, and a relay would
/// publish them again at once, every round for as long as the fault lasts. So the publish is
/// recorded as a failed attempt of each event instead, in a transaction of its own, which
/// backs off as a failed publish does (and parks after `outbox.max_attempts`): a persistent
/// fault costs a bounded number of copies. The report says so
/// ([`RelayReport::recording_failed`]), and the relay itself backs off too, in case this
/// recording fails as well (the events are then due at once in the database).
async fn record_unrecorded(
    client: &tokio_postgres::Client,
    statements: &RelayStatements,
    events: &[store::PendingEvent],
    error: &StorageError,
    (max_attempts, database_now): (i32, chrono::DateTime<chrono::Utc>),
) -> RelayReport {
    let reason = format!("published, but recording the publish failed: {error}");
    let failures: Vec<FailedAttempt> = events
        .iter()
        .map(|event| FailedAttempt {
            event,
            error: reason.clone(),
            nacked: false,
        })
        .collect();
    let backed_off = if client.is_closed() {
        Err(StorageError::Unavailable("the connection is closed".into()))
    } else {
        store::mark_failed(client, statements, &failures, (max_attempts, database_now)).await
    };
    match backed_off {
        Ok(_) => tracing::error!(
            events = events.len(),
            error = %error,
            "the broker confirmed a batch, but recording it failed; its events will be published again, with backoff"
        ),
        Err(backoff_error) => tracing::error!(
            events = events.len(),
            error = %error,
            backoff_error = %backoff_error,
            "the broker confirmed a batch, but recording it failed, and so did recording the failure; its events will be published again once the relay's backoff ends"
        ),
    }
    RelayReport {
        claimed: events.len(),
        recording_failed: true,
        ..RelayReport::default()
    }
}

/// Publishes the claimed events to the exchange and awaits their confirms: the broker's part of
/// the batch, which touches no row, so it needs nothing of the transaction. Sends on `on_full_batch`
/// once a full batch is published, before its confirms are awaited (see [`relay_once_then`]).
/// Its fail points abort the process before anything is published, and after the broker
/// confirmed but before a row is marked (tests/api/crash.rs: the event is published again).
async fn publish_batch(
    channel: &Channel,
    config: &RelayConfig,
    events: &[store::PendingEvent],
    on_full_batch: Option<oneshot::Sender<()>>,
) -> Vec<PublishResult> {
    fail::fail_point!("outbox-before-publish", |_| {
        tracing::error!("failpoint outbox-before-publish: aborting");
        std::process::abort();
    });
    metrics::histogram!(metric::OUTBOX_BATCH_SIZE).record(events.len() as f64);
    let started = std::time::Instant::now();
    let destination = Destination::Exchange(&config.exchange);
    let full = events.len() >= config.batch_size;
    let published = move || {
        if let (true, Some(on_full_batch)) = (full, on_full_batch) {
            let _ = on_full_batch.send(());
        }
    };
    let results = publish_all_then(
        channel,
        destination,
        config.confirm_timeout,
        events,
        published,
    )
    .await;
    metrics::histogram!(metric::OUTBOX_CONFIRM).record(started.elapsed().as_secs_f64());
    fail::fail_point!("outbox-after-publish", |_| {
        tracing::error!("failpoint outbox-after-publish: aborting");
        std::process::abort();
    });
    results
}

/// A batch's publish results as the transaction records them: the rows to mark sent, the
/// failures to reschedule, and the report the relay acts on.
struct Sorted<'a> {
    report: RelayReport,
    sent: Vec<i64>,
    failures: Vec<FailedAttempt<'a>>,
}

impl Sorted<'_> {
    /// The events of `events` (the batch) that are to be marked sent.
    fn sent_events<'e>(
        &self,
        events: &'e [store::PendingEvent],
    ) -> impl Iterator<Item = &'e store::PendingEvent> {
        let sent: std::collections::HashSet<i64> = self.sent.iter().copied().collect();
        events.iter().filter(move |event| sent.contains(&event.id))
    }
}

/// Sorts the results into sent and failed, counting every publish by its outcome. Kept apart
/// from the recording because it only reads the results: the report says whether the channel
/// must be replaced (a failure that breaks it) or renewed (a nack), whatever the marks do.
fn sort_results(events: &[store::PendingEvent], results: Vec<PublishResult>) -> Sorted<'_> {
    let mut sorted = Sorted {
        report: RelayReport {
            claimed: events.len(),
            ..RelayReport::default()
        },
        sent: Vec::with_capacity(events.len()),
        failures: Vec::new(),
    };
    for (event, result) in events.iter().zip(results) {
        let outcome = match &result {
            PublishResult::Acked => "acked",
            PublishResult::Failed { kind, .. } => kind.as_str(),
        };
        metrics::counter!(metric::OUTBOX_PUBLISHES, "outcome" => outcome).increment(1);
        match result {
            PublishResult::Acked => sorted.sent.push(event.id),
            PublishResult::Failed { kind, error } => {
                sorted.report.channel_broken |= kind.breaks_channel();
                sorted.report.renew_channel |= kind == FailureKind::Nacked;
                tracing::debug!(event_id = %event.event_id, event_type = %event.event_type, error = %error, "publish failed");
                sorted.failures.push(FailedAttempt {
                    event,
                    error,
                    nacked: kind == FailureKind::Nacked,
                });
            }
        }
    }
    sorted.report.sent = sorted.sent.len();
    sorted
}

/// One WARN for a batch's failures, once they are recorded (so that `parked` is what the
/// database now holds), instead of a line per event: a broker refusing everything would
/// otherwise write a line per event per attempt.
fn log_failures(failures: &[FailedAttempt<'_>], max_attempts: i32) {
    let Some(first) = failures.first() else {
        return;
    };
    let parked = failures
        .iter()
        .filter(|f| f.event.attempts + 1 >= max_attempts)
        .count();
    tracing::warn!(
        failed = failures.len(),
        parked,
        first_error = %first.error,
        "events not delivered; will retry with backoff"
    );
}
