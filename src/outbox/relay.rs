//! The outbox relay actor: runs [`relay_once`](super::batch::relay_once) again and again in the
//! daemon, up to [`BATCHES_IN_FLIGHT`] at a time, backing off when the broker or the database
//! pushes back.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::db::topology::{Group, Pass};
use crate::db::{Database, StorageError};
use crate::lifecycle::Stop;
use crate::outbox::batch::{relay_once_then, RelayConfig, RelayReport};
use crate::outbox::broker::{Broker, BrokerChannel, BrokerError};
use crate::outbox::store;

/// Longest wait between two attempts to reach the broker.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(5);
const FIRST_RECONNECT_DELAY: Duration = Duration::from_millis(100);

/// While the broker blocks publishing, a relay looks again this often even if it heard nothing
/// (the connection may have been replaced meanwhile).
const BLOCKED_RECHECK: Duration = Duration::from_secs(5);

/// Wakes the relays of this process right after a writer commits.
#[derive(Clone, Default)]
pub struct OutboxWaker {
    relays: Vec<Addr<OutboxRelay>>,
}

impl OutboxWaker {
    pub fn new(relays: Vec<Addr<OutboxRelay>>) -> Self {
        Self { relays }
    }

    /// Events were committed, in `group`'s rows (a shard's, on Citus).
    pub fn wake(&self, group: &Group) {
        for relay in &self.relays {
            // A full mailbox already holds a wake-up (or a stop): one more adds nothing.
            let _ = relay.try_send(Wake(group.clone()));
        }
    }
}

/// Commits wrote events in these rows (on Citus, a shard's): relay now rather than at the next
/// poll, and these first.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Wake(pub Group);

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
    /// Batches running now (at most [`BATCHES_IN_FLIGHT`]).
    pub in_flight: usize,
}

/// Why the relay's next batch waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pause {
    /// Until the poll interval or a wake-up.
    Poll,
    /// Until a backoff ends (a reconnect to the broker, or after a batch whose recording
    /// failed): a wake-up must not cut it short.
    Backoff,
    /// Until the broker unblocks publishing: a wake-up would only find it blocked.
    Unblocked,
}

/// Batches one relay runs at once, each in a transaction and on a channel of its own. While
/// one batch awaits its confirms and records them, the next is claimed and published, so the
/// broker is not left idle between batches (with one at a time, the relays' batches fell into
/// step and the broker waited on every claim and mark). A second batch also takes events
/// committed while the first awaits its confirms, instead of leaving them until it ends.
pub const BATCHES_IN_FLIGHT: usize = 2;

/// An outbox relay: runs [`relay_once`] while there is work, up to [`BATCHES_IN_FLIGHT`] at a
/// time, and otherwise waits for a [`Wake`], the poll interval, or a [`Stop`]. A stop lets the
/// batches in progress finish; none is cut short.
pub struct OutboxRelay {
    index: usize,
    broker: Arc<Broker>,
    config: RelayConfig,
    /// Open channels that no batch is using. A batch takes one (or opens one) and gives it
    /// back after, unless the channel broke or is to be renewed.
    channels: Vec<BrokerChannel>,
    reconnect_delay: Duration,
    /// The next batch, when one is scheduled.
    next: Option<(SpawnHandle, Pause)>,
    /// Batches running.
    in_flight: usize,
    /// More may be due (a wake-up, or a full batch) while no batch could start: start one as
    /// soon as a batch ends.
    more_due: bool,
    /// The last batch to end had events of ordering keys (see [`OutboxRelay::claim_limit`]).
    ordered_lately: bool,
    /// Batches in a row whose recording failed after the broker confirmed them: the relay
    /// waits [`store::retry_delay`] of it before its next batch.
    unrecorded_batches: i32,
    /// What is left of the round of batches (on Citus, a shard each), taken from the front: a
    /// round starts with every pass ([`RelayConfig::passes`]) and ends when none is left; after
    /// a round with nothing more due, the relay waits for the poll interval.
    passes: VecDeque<Pass>,
    /// Stop requests, answered once the last batch in flight has ended.
    stopping: Option<Vec<oneshot::Sender<()>>>,
    state: RelayState,
}

/// What one step of a relay found.
enum Step {
    Relayed {
        channel: BrokerChannel,
        report: Result<RelayReport, StorageError>,
        pass: Box<Pass>,
    },
    BrokerUnreachable(BrokerError),
}

impl OutboxRelay {
    /// Starts a relay on `arbiter` (relays run on a thread of their own: publishing a large
    /// batch is a burst of work that must not delay the shards and writers on the request path).
    pub fn start(
        arbiter: &actix::ArbiterHandle,
        index: usize,
        broker: Arc<Broker>,
        config: RelayConfig,
    ) -> Addr<Self> {
        OutboxRelay::start_in_arbiter(arbiter, move |_| OutboxRelay {
            index,
            broker,
            config,
            channels: Vec::new(),
            reconnect_delay: FIRST_RECONNECT_DELAY,
            next: None,
            in_flight: 0,
            more_due: false,
            ordered_lately: false,
            unrecorded_batches: 0,
            passes: VecDeque::new(),
            stopping: None,
            state: RelayState::default(),
        })
    }

    /// Schedules the next batch `after` from now, replacing a scheduled one; a reconnect
    /// backoff is replaced only by another, and nothing is scheduled once a stop was asked.
    fn schedule(&mut self, after: Duration, pause: Pause, ctx: &mut Context<Self>) {
        if self.stopping.is_some() {
            return;
        }
        if let Some((pending, scheduled)) = self.next.take() {
            if scheduled != Pause::Poll && pause == Pause::Poll {
                self.next = Some((pending, scheduled));
                return;
            }
            ctx.cancel_future(pending);
        }
        let handle = ctx.run_later(after, |relay, ctx| {
            relay.next = None;
            relay.step(ctx);
        });
        self.next = Some((handle, pause));
    }

    /// Waits (on the same connection, opening none) until the broker unblocks publishing, then
    /// goes on; looks again every [`BLOCKED_RECHECK`] in case the connection was replaced.
    fn wait_until_unblocked(&mut self, ctx: &mut Context<Self>) {
        if self.stopping.is_some() || matches!(self.next, Some((_, Pause::Unblocked))) {
            return;
        }
        if let Some((pending, _)) = self.next.take() {
            ctx.cancel_future(pending);
        }
        let broker = self.broker.clone();
        let unblocked = async move {
            let _ = tokio::time::timeout(BLOCKED_RECHECK, broker.until_unblocked()).await;
        };
        let handle = ctx.spawn(unblocked.into_actor(self).map(|(), relay, ctx| {
            relay.next = None;
            relay.step(ctx);
        }));
        self.next = Some((handle, Pause::Unblocked));
    }

    /// How many events the next batch claims: `outbox.batch_size`, or a quarter of it while
    /// ordered events flow. A key's next event is released only when the batch that sent its
    /// predecessor commits, so a backlog of ordered events drains in rounds of one event per
    /// key; with the keys' heads split over several batches (this relay's two in flight and
    /// the other relays'), some publish while others await their confirms and commit.
    /// Measured with 1,000 keys (bench/run, ordered drain vs the unordered drain of the same
    /// backlog): 0.38x with whole batches, 0.51-0.52x with halves, 0.53-0.57x with quarters.
    /// Unordered events take whole batches as before.
    fn claim_limit(&self) -> usize {
        if self.ordered_lately {
            (self.config.batch_size / 4).max(1)
        } else {
            self.config.batch_size
        }
    }

    /// Starts one batch, with a channel opened first if needed, unless as many as
    /// [`BATCHES_IN_FLIGHT`] run already, or one runs and the pool has no connection free
    /// (then the first to end starts it), or the broker blocks publishing (then it waits).
    fn step(&mut self, ctx: &mut Context<Self>) {
        if self.stopping.is_some() {
            return;
        }
        if self.broker.blocked().is_some() {
            self.wait_until_unblocked(ctx);
            return;
        }
        if self.passes.is_empty() {
            // A node whose writes cannot succeed now is left out of the round (its batches
            // would only wait on it); it is back in once a write or a probe succeeds there.
            let passes = self.config.passes().into_iter().filter(|pass| {
                pass.node()
                    .and_then(|node| self.config.health.node_failing(node))
                    .is_none_or(|failing| !failing.shuts_writes_out())
            });
            self.passes.extend(passes);
        }
        let Some(pass) = self.passes.front() else {
            // Every pass's node is out: the next poll looks again.
            self.schedule(self.config.poll_interval, Pause::Poll, ctx);
            return;
        };
        if self.in_flight >= BATCHES_IN_FLIGHT || (self.in_flight > 0 && !connection_free(&pass.db))
        {
            self.more_due = true;
            return;
        }
        let Some(pass) = self.passes.pop_front() else {
            return;
        };
        self.in_flight += 1;
        self.more_due = false;
        let (broker, mut config) = (self.broker.clone(), self.config.clone());
        config.batch_size = self.claim_limit();
        let idle_channel = self.channels.pop();
        let (on_full_batch, full_batch_published) = oneshot::channel();
        let step = async move {
            let channel = match idle_channel {
                // A channel of a connection since dropped may still look open: not reused.
                Some(open)
                    if open.channel.status().connected()
                        && open.generation == broker.live_generation() =>
                {
                    open
                }
                // Bounded inside: each broker of the list within its connect timeout.
                _ => match broker.open_channel().await {
                    Ok(opened) => opened,
                    Err(error) => return Step::BrokerUnreachable(error),
                },
            };
            let report = relay_once_then(
                &broker,
                &channel.channel,
                (&config, &pass),
                Some(on_full_batch),
            )
            .await;
            Step::Relayed {
                channel,
                report,
                pass: Box::new(pass),
            }
        };
        ctx.spawn(
            step.into_actor(self)
                .map(|step, relay, ctx| relay.after(step, ctx)),
        );
        // A full batch, published: more may be due, and the broker is free for it.
        ctx.spawn(
            async move { full_batch_published.await.is_ok() }
                .into_actor(self)
                .map(|full, relay, ctx| {
                    if full {
                        relay.schedule(Duration::ZERO, Pause::Poll, ctx);
                    }
                }),
        );
    }

    fn after(&mut self, step: Step, ctx: &mut Context<Self>) {
        self.in_flight -= 1;
        self.state.batches += 1;
        self.record(step, ctx);
        if let Some(waiting) = &mut self.stopping {
            if self.in_flight == 0 {
                for stopped in waiting.drain(..) {
                    let _ = stopped.send(());
                }
                ctx.stop();
            }
        }
    }

    /// Takes in what a batch did and schedules the next.
    fn record(&mut self, step: Step, ctx: &mut Context<Self>) {
        let (channel, report, pass) = match step {
            Step::BrokerUnreachable(error) => {
                tracing::warn!(relay = self.index, error = %error, retry_in = ?self.reconnect_delay, "broker unreachable");
                self.state.connected = false;
                self.state.last_error = Some(error.to_string());
                self.channels.clear();
                self.schedule(self.reconnect_delay, Pause::Backoff, ctx);
                self.reconnect_delay = (self.reconnect_delay * 2).min(MAX_RECONNECT_DELAY);
                return;
            }
            Step::Relayed {
                channel,
                report,
                pass,
            } => (channel, report, *pass),
        };
        self.reconnect_delay = FIRST_RECONNECT_DELAY;
        self.state.connected = true;
        let report = match report {
            Ok(done) => done,
            Err(error) => {
                tracing::warn!(relay = self.index, error = %error, "relay batch failed");
                self.state.last_error = Some(error.to_string());
                // The batch may have been abandoned between its publishes and their confirms:
                // a fresh channel keeps late confirms and returns out of the next batch. The
                // round goes on (on Citus, one worker down must not hold back the others'
                // shards); the failed pass waits for the next round.
                let next = if self.passes.is_empty() {
                    self.config.poll_interval
                } else {
                    Duration::ZERO
                };
                self.schedule(next, Pause::Poll, ctx);
                return;
            }
        };
        self.state.events_sent += report.sent as u64;
        self.ordered_lately = report.ordered;
        if report.recording_failed {
            // Published, not recorded: the next batch may publish the same events again, so
            // it waits, longer each time in a row, whatever wakes the relay meanwhile.
            self.unrecorded_batches = self.unrecorded_batches.saturating_add(1);
            self.state.last_error =
                Some("the broker confirmed a batch, but recording it failed".into());
            self.channels.push(channel);
            let delay = store::retry_delay(self.unrecorded_batches);
            self.schedule(delay, Pause::Backoff, ctx);
            return;
        }
        self.unrecorded_batches = 0;
        if report.blocked {
            // The channel may still get confirms of this batch's publishes: not used again.
            // The connection stays: the broker unblocks it, and a new one would be blocked too.
            self.state.last_error = Some("the broker blocks publishing".into());
            self.wait_until_unblocked(ctx);
            return;
        }
        if report.channel_broken {
            self.state.connected = false;
            let broker = self.broker.clone();
            let generation = channel.generation;
            self.channels.retain(|open| open.generation != generation);
            ctx.spawn(
                async move { broker.connection_lost(generation).await }
                    .into_actor(self)
                    .map(|(), relay, ctx| relay.schedule(Duration::ZERO, Pause::Poll, ctx)),
            );
            return;
        }
        if !report.renew_channel {
            self.channels.push(channel);
        }
        if report.full {
            // More may be due on this pass: it goes first again.
            self.passes.retain(|queued| *queued != pass);
            self.passes.push_front(pass);
        }
        if report.full || !self.passes.is_empty() || std::mem::take(&mut self.more_due) {
            self.schedule(Duration::ZERO, Pause::Poll, ctx);
        } else if self.next.is_none() {
            self.schedule(self.config.poll_interval, Pause::Poll, ctx);
        }
    }
}

/// Whether a batch would get a connection of `db` without waiting. A second batch is only an
/// overlap: it must not take the connection a writer is about to need.
fn connection_free(db: &Database) -> bool {
    let pool = db.state();
    pool.idle_connections > 0 || pool.connections < db.max_size()
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

    fn handle(&mut self, Wake(group): Wake, ctx: &mut Self::Context) {
        // The rows written to go first (on Citus, the shard's).
        if let Some(pass) = self.config.topology.pass_of(&group) {
            self.passes.retain(|queued| *queued != pass);
            self.passes.push_front(pass);
        }
        // A backoff is not cut short (the broker is what the relay waits for); with no batch
        // free to start, the first to end starts the next.
        self.schedule(Duration::ZERO, Pause::Poll, ctx);
    }
}

/// Lets the batches in progress finish, then stops; answered then.
impl Handler<Stop> for OutboxRelay {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) -> Self::Result {
        if let Some((pending, _)) = self.next.take() {
            ctx.cancel_future(pending);
        }
        if self.in_flight == 0 {
            ctx.stop();
            return Box::pin(async {});
        }
        let (stopped, wait) = oneshot::channel();
        self.stopping.get_or_insert_with(Vec::new).push(stopped);
        Box::pin(async move {
            // Dropped only if the relay stops, which is what this waits for.
            let _ = wait.await;
        })
    }
}

impl Handler<GetState> for OutboxRelay {
    type Result = MessageResult<GetState>;

    fn handle(&mut self, _: GetState, _: &mut Self::Context) -> Self::Result {
        MessageResult(RelayState {
            in_flight: self.in_flight,
            ..self.state.clone()
        })
    }
}
