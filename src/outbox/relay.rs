//! Outbox relay actors: claim due rows, publish them with pipelined confirms, record the result.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use lapin::Channel;
use tokio::sync::{watch, Notify};

use crate::db::{Database, PgClient, StorageError};
use crate::outbox::broker::{Broker, BrokerChannel};
use crate::outbox::publish::{publish_all, Destination, FailureKind, PublishResult};
use crate::outbox::store::{self, Failure, RelayStatements};
use crate::telemetry;

/// Longest wait between two attempts to reach the broker.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(5);
const FIRST_RECONNECT_DELAY: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub exchange: String,
    pub batch_size: usize,
    pub poll_interval: Duration,
    pub confirm_timeout: Duration,
    pub max_attempts: i32,
}

impl RelayConfig {
    pub fn from_settings(settings: &crate::config::Settings) -> Self {
        Self {
            exchange: settings.amqp.exchange.clone(),
            batch_size: settings.outbox.batch_size,
            poll_interval: settings.outbox.poll_interval.0,
            confirm_timeout: settings.outbox.confirm_timeout.0,
            max_attempts: settings.outbox.max_attempts,
        }
    }
}

/// Publishes every due event of the outbox in `settings`' database, batch after batch, until a
/// batch finds nothing due; returns how many were marked sent. What a relay does, once, without
/// a relay running: for tests and tools that must not wait for a poll. Events that fail are
/// scheduled for a later attempt as a relay would, and are not due again within this call.
pub async fn relay_until_empty(settings: &crate::config::Settings) -> anyhow::Result<usize> {
    let db = Database::new(&settings.database)?;
    let config = RelayConfig::from_settings(settings);
    let broker = Broker::new(&settings.amqp, config.confirm_timeout)?;
    let channel = broker.open_channel().await?;
    let mut sent = 0;
    loop {
        let report = relay_once(&db, &channel.channel, &config).await?;
        sent += report.sent;
        if report.claimed == 0 || report.channel_broken {
            break;
        }
    }
    broker.close().await;
    Ok(sent)
}

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayReport {
    pub claimed: usize,
    pub sent: usize,
    pub failed: usize,
    /// The channel failed during the batch and must be replaced.
    pub channel_broken: bool,
    /// The broker nacked a publish: the next batch uses a fresh channel on the same connection.
    /// (A channel opened while a quorum queue had no leader may go on nacking every publish
    /// routed to it after a new leader is elected; a fresh channel does not.)
    pub renew_channel: bool,
}

/// Claims up to `batch_size` due rows, publishes them all with confirms pipelined, awaits the
/// confirms, and in the same transaction marks each row sent (acked, not returned) or failed.
/// Other relays skip the rows this one holds, so no row is published by two at once.
///
/// The whole batch is bounded on the client's side by the database's operation deadline plus
/// `outbox.confirm_timeout`: past it the batch is abandoned, nothing is marked, and its rows are
/// claimed again (a resend, which consumers dedupe; never a loss).
pub async fn relay_once(
    db: &Database,
    channel: &Channel,
    config: &RelayConfig,
) -> Result<RelayReport, StorageError> {
    let limit = db.operation_timeout() + config.confirm_timeout;
    db.run_within(limit, async |connection| {
        relay_batch(connection, channel, config).await
    })
    .await
}

async fn relay_batch(
    connection: &mut PgClient,
    channel: &Channel,
    config: &RelayConfig,
) -> Result<RelayReport, StorageError> {
    let statements = RelayStatements::prepare(connection).await?;
    let transaction = connection.transaction().await.map_err(StorageError::from)?;
    let events = store::claim_due(&transaction, &statements, config.batch_size).await?;
    if events.is_empty() {
        transaction.commit().await.map_err(StorageError::from)?;
        return Ok(RelayReport::default());
    }
    fail::fail_point!("outbox-before-publish", |_| {
        tracing::error!("failpoint outbox-before-publish: aborting");
        std::process::abort();
    });

    metrics::histogram!(telemetry::OUTBOX_BATCH_SIZE).record(events.len() as f64);
    let started = std::time::Instant::now();
    let destination = Destination::Exchange(&config.exchange);
    let results = publish_all(channel, destination, config.confirm_timeout, &events).await;
    metrics::histogram!(telemetry::OUTBOX_CONFIRM).record(started.elapsed().as_secs_f64());
    fail::fail_point!("outbox-after-publish", |_| {
        tracing::error!("failpoint outbox-after-publish: aborting");
        std::process::abort();
    });

    let mut report = RelayReport {
        claimed: events.len(),
        ..RelayReport::default()
    };
    let mut sent = Vec::with_capacity(events.len());
    let mut failures = Vec::new();
    for (event, result) in events.iter().zip(results) {
        let outcome = match &result {
            PublishResult::Acked => "acked",
            PublishResult::Failed { kind, .. } => kind.as_str(),
        };
        metrics::counter!(telemetry::OUTBOX_PUBLISHES, "outcome" => outcome).increment(1);
        match result {
            PublishResult::Acked => sent.push(event.id),
            PublishResult::Failed { kind, error } => {
                report.channel_broken |= kind.breaks_channel();
                report.renew_channel |= kind == FailureKind::Nacked;
                tracing::debug!(event_id = %event.event_id, event_type = %event.event_type, error = %error, "publish failed");
                failures.push(Failure { event, error });
            }
        }
    }
    store::mark_sent(&transaction, &statements, &sent).await?;
    store::mark_failed(&transaction, &statements, &failures, config.max_attempts).await?;
    transaction.commit().await.map_err(StorageError::from)?;
    report.sent = sent.len();
    report.failed = failures.len();
    if !failures.is_empty() {
        let parked = failures
            .iter()
            .filter(|f| f.event.attempts + 1 >= config.max_attempts)
            .count();
        tracing::warn!(
            failed = failures.len(),
            parked,
            first_error = %failures[0].error,
            "events not delivered; will retry with backoff"
        );
    }
    Ok(report)
}

/// Wakes the relays of this process right after a writer commits.
#[derive(Clone, Default)]
pub struct OutboxWaker {
    relays: Vec<Arc<Notify>>,
}

impl OutboxWaker {
    /// One notifier per relay: `notify_one` keeps a permit for a busy relay, so a commit during
    /// its batch is not missed.
    pub fn new(relays: usize) -> Self {
        Self {
            relays: (0..relays).map(|_| Arc::new(Notify::new())).collect(),
        }
    }

    pub fn wake(&self) {
        for relay in &self.relays {
            relay.notify_one();
        }
    }

    pub fn notifier(&self, relay: usize) -> Arc<Notify> {
        self.relays[relay].clone()
    }
}

/// A relay: loops over [`relay_once`] while there is work, and otherwise waits for a wake-up,
/// the poll interval, or shutdown. Shutdown is seen between batches, never inside one.
pub struct OutboxRelay {
    pub index: usize,
    pub db: Database,
    pub broker: Arc<Broker>,
    pub config: RelayConfig,
    pub wake: Arc<Notify>,
    pub shutdown: watch::Receiver<bool>,
    /// Dropped when the relay stops: the daemon's shutdown waits for every relay's token.
    pub done: tokio::sync::mpsc::Sender<()>,
}

impl Actor for OutboxRelay {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let run = run_relay(
            self.index,
            self.db.clone(),
            self.broker.clone(),
            self.config.clone(),
            self.wake.clone(),
            self.shutdown.clone(),
        );
        let done = self.done.clone();
        ctx.spawn(run.into_actor(self).map(move |(), _, ctx| {
            drop(done);
            ctx.stop();
        }));
    }
}

async fn run_relay(
    index: usize,
    db: Database,
    broker: Arc<Broker>,
    config: RelayConfig,
    wake: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut channel: Option<BrokerChannel> = None;
    let mut reconnect_delay = FIRST_RECONNECT_DELAY;
    loop {
        if *shutdown.borrow() {
            break;
        }
        let current = match &channel {
            Some(current) if current.channel.status().connected() => current,
            // Bounded inside: each broker of the list within its connect timeout.
            _ => match broker.open_channel().await {
                Ok(opened) => {
                    reconnect_delay = FIRST_RECONNECT_DELAY;
                    channel.insert(opened)
                }
                Err(error) => {
                    tracing::warn!(relay = index, error = %error, retry_in = ?reconnect_delay, "broker unreachable");
                    channel = None;
                    if wait(&mut shutdown, reconnect_delay, None).await {
                        break;
                    }
                    reconnect_delay = (reconnect_delay * 2).min(MAX_RECONNECT_DELAY);
                    continue;
                }
            },
        };
        match relay_once(&db, &current.channel, &config).await {
            Ok(report) => {
                if report.channel_broken {
                    let generation = current.generation;
                    channel = None;
                    broker.connection_lost(generation).await;
                    continue;
                }
                if report.renew_channel {
                    channel = None;
                }
                if report.claimed == config.batch_size {
                    continue;
                }
            }
            Err(error) => {
                tracing::warn!(relay = index, error = %error, "relay batch failed");
                // The batch may have been abandoned between its publishes and their confirms:
                // a fresh channel keeps late confirms and returns out of the next batch.
                channel = None;
            }
        }
        if wait(&mut shutdown, config.poll_interval, Some(&wake)).await {
            break;
        }
    }
    tracing::debug!(relay = index, "relay stopped");
}

/// Sleeps for `period` or until woken; true when shutdown was asked for.
async fn wait(
    shutdown: &mut watch::Receiver<bool>,
    period: Duration,
    wake: Option<&Notify>,
) -> bool {
    let woken = async {
        match wake {
            Some(notify) => notify.notified().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = shutdown.changed() => true,
        _ = tokio::time::sleep(period) => *shutdown.borrow(),
        _ = woken => *shutdown.borrow(),
    }
}
