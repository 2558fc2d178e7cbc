//! Outbox relay actors: claim due rows, publish them with pipelined confirms, record the result.
//!
//! [`relay_once`] is one batch, in one transaction; [`OutboxRelay`] runs it again and again in
//! the daemon; [`relay_until_empty`] runs it until nothing is due, for tests and tools.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use lapin::Channel;

use crate::db::{Database, PgClient, StorageError};
use crate::outbox::broker::{Broker, BrokerChannel, BrokerError};
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
    /// Events the broker confirmed, now marked sent.
    pub sent: usize,
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

/// One relay batch, in one transaction: claim due rows, publish them, mark what the broker
/// confirmed and reschedule the rest. Kept whole because each step uses the previous one's
/// rows inside the same transaction (the claim's row locks last until COMMIT).
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
    relays: Vec<Addr<OutboxRelay>>,
}

impl OutboxWaker {
    pub fn new(relays: Vec<Addr<OutboxRelay>>) -> Self {
        Self { relays }
    }

    pub fn wake(&self) {
        for relay in &self.relays {
            // A full mailbox already holds a wake-up (or a stop): one more adds nothing.
            let _ = relay.try_send(Wake);
        }
    }
}

/// Commits wrote events: relay now rather than at the next poll.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Wake;

/// Finish the batch in progress, then stop. Answered once the relay has stopped.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Stop;

/// What a relay has done, for tests and diagnostics.
#[derive(Message)]
#[rtype(result = "RelayState")]
pub struct GetState;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayState {
    /// Batches relayed (a batch that found nothing due included).
    pub batches: u64,
    /// Events the broker confirmed.
    pub events_sent: u64,
    /// Whether the relay has a channel to the broker.
    pub connected: bool,
    /// The last failure: the broker unreachable, or a batch that failed.
    pub last_error: Option<String>,
}

/// Why the relay's next batch waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pause {
    /// Until the poll interval or a wake-up.
    Poll,
    /// Until the reconnect delay: a wake-up must not cut a backoff short.
    Reconnect,
}

/// An outbox relay: runs [`relay_once`] while there is work, and otherwise waits for a
/// [`Wake`], the poll interval, or a [`Stop`]. A batch runs with the actor's mailbox held
/// (`ctx.wait`), so a stop takes effect between batches, never inside one.
pub struct OutboxRelay {
    index: usize,
    db: Database,
    broker: Arc<Broker>,
    config: RelayConfig,
    channel: Option<BrokerChannel>,
    reconnect_delay: Duration,
    /// The next batch, when it is waiting; None while a batch runs.
    next: Option<(SpawnHandle, Pause)>,
    state: RelayState,
}

/// What one step of a relay found.
enum Step {
    Relayed {
        channel: BrokerChannel,
        report: Result<RelayReport, StorageError>,
    },
    BrokerUnreachable(BrokerError),
}

impl OutboxRelay {
    /// Starts a relay on `arbiter` (relays run on a thread of their own: publishing a large
    /// batch is a burst of work that must not delay the shards and writers on the request path).
    pub fn start(
        arbiter: &actix::ArbiterHandle,
        index: usize,
        db: Database,
        broker: Arc<Broker>,
        config: RelayConfig,
    ) -> Addr<Self> {
        OutboxRelay::start_in_arbiter(arbiter, move |_| OutboxRelay {
            index,
            db,
            broker,
            config,
            channel: None,
            reconnect_delay: FIRST_RECONNECT_DELAY,
            next: None,
            state: RelayState::default(),
        })
    }

    fn schedule(&mut self, after: Duration, pause: Pause, ctx: &mut Context<Self>) {
        if let Some((pending, _)) = self.next.take() {
            ctx.cancel_future(pending);
        }
        let handle = ctx.run_later(after, |relay, ctx| {
            relay.next = None;
            relay.step(ctx);
        });
        self.next = Some((handle, pause));
    }

    /// One batch, with a channel opened first if needed; the mailbox waits meanwhile.
    fn step(&mut self, ctx: &mut Context<Self>) {
        let (db, broker, config) = (self.db.clone(), self.broker.clone(), self.config.clone());
        let channel = self.channel.take();
        let step = async move {
            let channel = match channel {
                Some(open) if open.channel.status().connected() => open,
                // Bounded inside: each broker of the list within its connect timeout.
                _ => match broker.open_channel().await {
                    Ok(opened) => opened,
                    Err(error) => return Step::BrokerUnreachable(error),
                },
            };
            let report = relay_once(&db, &channel.channel, &config).await;
            Step::Relayed { channel, report }
        };
        ctx.wait(
            step.into_actor(self)
                .map(|step, relay, ctx| relay.after(step, ctx)),
        );
    }

    fn after(&mut self, step: Step, ctx: &mut Context<Self>) {
        self.state.batches += 1;
        let (channel, report) = match step {
            Step::BrokerUnreachable(error) => {
                tracing::warn!(relay = self.index, error = %error, retry_in = ?self.reconnect_delay, "broker unreachable");
                self.state.connected = false;
                self.state.last_error = Some(error.to_string());
                self.schedule(self.reconnect_delay, Pause::Reconnect, ctx);
                self.reconnect_delay = (self.reconnect_delay * 2).min(MAX_RECONNECT_DELAY);
                return;
            }
            Step::Relayed { channel, report } => (channel, report),
        };
        self.reconnect_delay = FIRST_RECONNECT_DELAY;
        self.state.connected = true;
        let report = match report {
            Ok(report) => report,
            Err(error) => {
                tracing::warn!(relay = self.index, error = %error, "relay batch failed");
                self.state.last_error = Some(error.to_string());
                // The batch may have been abandoned between its publishes and their confirms:
                // a fresh channel keeps late confirms and returns out of the next batch.
                self.schedule(self.config.poll_interval, Pause::Poll, ctx);
                return;
            }
        };
        self.state.events_sent += report.sent as u64;
        if report.channel_broken {
            self.state.connected = false;
            let broker = self.broker.clone();
            let generation = channel.generation;
            ctx.wait(
                async move { broker.connection_lost(generation).await }
                    .into_actor(self)
                    .map(|(), relay, ctx| relay.schedule(Duration::ZERO, Pause::Poll, ctx)),
            );
            return;
        }
        if !report.renew_channel {
            self.channel = Some(channel);
        }
        if report.claimed == self.config.batch_size {
            self.schedule(Duration::ZERO, Pause::Poll, ctx);
        } else {
            self.schedule(self.config.poll_interval, Pause::Poll, ctx);
        }
    }
}

impl Actor for OutboxRelay {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.schedule(Duration::ZERO, Pause::Poll, ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        tracing::debug!(relay = self.index, "relay stopped");
    }
}

impl Handler<Wake> for OutboxRelay {
    type Result = ();

    fn handle(&mut self, _: Wake, ctx: &mut Self::Context) {
        if matches!(self.next, Some((_, Pause::Poll))) {
            self.schedule(Duration::ZERO, Pause::Poll, ctx);
        }
    }
}

impl Handler<Stop> for OutboxRelay {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        if let Some((pending, _)) = self.next.take() {
            ctx.cancel_future(pending);
        }
        ctx.stop();
    }
}

impl Handler<GetState> for OutboxRelay {
    type Result = MessageResult<GetState>;

    fn handle(&mut self, _: GetState, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.state.clone())
    }
}
