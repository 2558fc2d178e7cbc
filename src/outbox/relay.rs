//! Outbox relay actors: claim due rows, publish them with pipelined confirms, record the result.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation};
use tokio::sync::{watch, Notify};

use crate::db::{Database, PgClient, StorageError};
use crate::outbox::broker::{Broker, BrokerChannel};
use crate::outbox::store::{self, Failure, PendingEvent, RelayStatements};
use crate::telemetry;

/// The AMQP `content_type` of every event.
pub const CONTENT_TYPE: &str = "application/cloudevents+json";
/// The AMQP `app_id` of every event.
pub const APP_ID: &str = "retrysafe";

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

/// How the broker answered one publish.
#[derive(Debug)]
enum PublishResult {
    Acked,
    Failed { kind: FailureKind, error: String },
}

/// Why a publish failed, as the publish metric labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FailureKind {
    Nacked,
    Returned,
    Timeout,
    ConnectionLost,
}

impl FailureKind {
    fn as_str(self) -> &'static str {
        match self {
            FailureKind::Nacked => "nacked",
            FailureKind::Returned => "returned",
            FailureKind::Timeout => "timeout",
            FailureKind::ConnectionLost => "connection_lost",
        }
    }

    /// A channel that lost its connection, or left a confirm unanswered, is replaced: a late
    /// confirm must not be taken for another message's.
    fn breaks_channel(self) -> bool {
        matches!(self, FailureKind::Timeout | FailureKind::ConnectionLost)
    }
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
    let results = publish_all(channel, config, &events).await;
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

/// Publishes every event before awaiting any confirm, then awaits them all; one deadline
/// bounds the whole batch, the socket writes included (a blocked or half-open connection must
/// not hold the claim transaction open).
async fn publish_all(
    channel: &Channel,
    config: &RelayConfig,
    events: &[PendingEvent],
) -> Vec<PublishResult> {
    let deadline = tokio::time::Instant::now() + config.confirm_timeout;
    let mut confirms = Vec::with_capacity(events.len());
    let mut broken: Option<(FailureKind, String)> = None;
    for event in events {
        if let Some(failure) = &broken {
            confirms.push(Err(failure.clone()));
            continue;
        }
        let publish = channel.basic_publish(
            config.exchange.as_str().into(),
            short_string(&event.event_type),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            event.payload.as_bytes(),
            properties(event),
        );
        let failure = match tokio::time::timeout_at(deadline, publish).await {
            Ok(Ok(confirm)) => {
                confirms.push(Ok(confirm));
                continue;
            }
            Ok(Err(error)) => (
                FailureKind::ConnectionLost,
                format!("publish failed: {error}"),
            ),
            Err(_elapsed) => (
                FailureKind::Timeout,
                format!("publish not written within {:?}", config.confirm_timeout),
            ),
        };
        broken = Some(failure.clone());
        confirms.push(Err(failure));
    }

    // lapin hands a returned message to whichever confirm completes next, not to its own
    // publish's: a return is attributed by its message_id, never by where it arrived.
    let mut returned: HashSet<String> = HashSet::new();
    let mut outcomes = Vec::with_capacity(events.len());
    for confirm in confirms {
        let outcome = match confirm {
            Err(failure) => Err(failure),
            Ok(confirm) => match tokio::time::timeout_at(deadline, confirm).await {
                Ok(Ok(confirmation)) => {
                    let acked = confirmation.is_ack();
                    let requested = !matches!(confirmation, Confirmation::NotRequested);
                    if let Some(message) = confirmation.take_message() {
                        if let Some(id) = message.delivery.properties.message_id() {
                            returned.insert(id.to_string());
                        }
                    }
                    match (requested, acked) {
                        (false, _) => Err((
                            FailureKind::ConnectionLost,
                            "the channel is not in confirm mode".to_owned(),
                        )),
                        (true, true) => Ok(()),
                        (true, false) => {
                            Err((FailureKind::Nacked, "nacked by the broker".to_owned()))
                        }
                    }
                }
                Ok(Err(error)) => Err((
                    FailureKind::ConnectionLost,
                    format!("connection lost before the confirm: {error}"),
                )),
                // A late confirm would arrive on a channel that is about to be replaced.
                Err(_elapsed) => Err((
                    FailureKind::Timeout,
                    format!("no confirm within {:?}", config.confirm_timeout),
                )),
            },
        };
        outcomes.push(outcome);
    }

    // Without every confirm, a return may sit on one that never completed: no ack in this
    // batch can then be trusted to mean "routed", so none is marked sent (a resend is safe, a
    // loss is not).
    let incomplete = outcomes.iter().find_map(|outcome| match outcome {
        Err((kind, error)) if kind.breaks_channel() => Some((*kind, error.clone())),
        _ => None,
    });
    events
        .iter()
        .zip(outcomes)
        .map(|(event, outcome)| {
            if returned.contains(&event.event_id.to_string()) {
                return PublishResult::Failed {
                    kind: FailureKind::Returned,
                    error: format!(
                        "returned by the broker: NO_ROUTE (no queue bound to exchange {:?} for routing key {:?})",
                        config.exchange, event.event_type
                    ),
                };
            }
            match (outcome, &incomplete) {
                (Ok(()), None) => PublishResult::Acked,
                (Ok(()), Some((kind, error))) => PublishResult::Failed {
                    kind: *kind,
                    error: format!("acked, but the batch's confirms are incomplete: {error}"),
                },
                (Err((kind, error)), _) => PublishResult::Failed { kind, error },
            }
        })
        .collect()
}

/// Names and ids here are short (event types are at most 64 characters, ids are UUIDs), but
/// `ShortString` panics past 255 bytes, so truncate rather than trust that.
fn short_string(text: &str) -> ShortString {
    let mut end = text.len().min(255);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].into()
}

fn properties(event: &PendingEvent) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        "idempotency-key".into(),
        AMQPValue::LongString(event.idempotency_key.as_str().into()),
    );
    headers.insert(
        "client-id".into(),
        AMQPValue::LongString(event.client_id.as_str().into()),
    );
    BasicProperties::default()
        .with_message_id(event.event_id.to_string().into())
        .with_type(short_string(&event.event_type))
        .with_timestamp(event.created_at.timestamp().max(0) as u64)
        .with_app_id(APP_ID.into())
        .with_content_type(CONTENT_TYPE.into())
        .with_delivery_mode(2)
        .with_headers(headers)
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
