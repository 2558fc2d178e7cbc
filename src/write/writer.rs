//! Writer actors: each takes the writes queued for the writers ([`crate::write::queue`]) as a
//! batch and commits it in one transaction ([`crate::write::batch`]), one batch at a time;
//! answers every write of it; and tells the relays when it wrote events.

use std::sync::Arc;

use actix::prelude::*;
use chrono::{DateTime, Utc};
use tokio::sync::oneshot;

use crate::db::topology::{Group, Route, Topology, WriteRow};
use crate::db::StorageError;
use crate::lifecycle::Stop;
use crate::metric;
use crate::write::batch;
use crate::write::queue::{Wake, WriteQueue};
use crate::write::{Decided, Waiting, WriteError, WriterConfig};

/// How often a batch aborted by a deadlock or serialization failure is run again.
const MAX_CONFLICT_RETRIES: u32 = 5;

/// Called after each commit that wrote outbox rows, to wake the outbox relays; with the group
/// of rows written to (a shard's, on Citus).
pub type CommitHook = Arc<dyn Fn(&Group) + Send + Sync>;

pub struct Writer {
    /// Where each batch's rows go.
    topology: Topology,
    config: WriterConfig,
    queue: WriteQueue,
    batch_in_flight: bool,
    /// In the queue's list of waiting writers (until a push wakes it).
    waiting: bool,
    on_commit: CommitHook,
    /// [`Stop`] requests, answered once the queue is committed.
    stopping: Vec<oneshot::Sender<()>>,
}

impl Writer {
    pub fn start(
        topology: Topology,
        config: WriterConfig,
        queue: WriteQueue,
        on_commit: CommitHook,
    ) -> Addr<Self> {
        Self {
            topology,
            config,
            queue,
            batch_in_flight: false,
            waiting: false,
            on_commit,
            stopping: Vec::new(),
        }
        .start()
    }

    fn start_batch(&mut self, ctx: &mut Context<Self>) {
        if self.batch_in_flight {
            return;
        }
        // A stopping writer does not wait for more: it takes what is queued, then stops; while
        // writes are queued that wait for a node's batches to end, it waits with them.
        let waiter = (!self.waiting).then(|| ctx.address().recipient());
        let will_wait = waiter.is_some();
        let (writes, node) = self.queue.take_or_wait(self.config.max_batch, waiter);
        if writes.is_empty() {
            self.waiting |= will_wait;
            if !self.stopping.is_empty() && self.queue.is_empty() {
                self.queue.forget(&ctx.address().recipient());
                for stopped in self.stopping.drain(..) {
                    let _ = stopped.send(());
                }
                ctx.stop();
            }
            return;
        }
        self.batch_in_flight = true;
        // Every write of a batch is of one group (`queue::take_batch`): the first one's route.
        let route = self.topology.route(&writes[0].write.key.client_id);
        let (config, queue) = (self.config.clone(), self.queue.clone());
        let on_commit = self.on_commit.clone();
        let work = async move {
            let created = process_batch(&route, &config, writes).await;
            queue.finished(node.as_deref());
            if created > 0 {
                on_commit(route.group());
            }
        };
        ctx.spawn(work.into_actor(self).map(|(), writer, ctx| {
            writer.batch_in_flight = false;
            writer.start_batch(ctx);
        }));
    }
}

impl Actor for Writer {
    type Context = Context<Self>;

    /// A new writer waits for the first write.
    fn started(&mut self, ctx: &mut Self::Context) {
        self.start_batch(ctx);
    }
}

impl Handler<Wake> for Writer {
    type Result = ();

    fn handle(&mut self, _: Wake, ctx: &mut Self::Context) {
        self.waiting = false;
        self.start_batch(ctx);
    }
}

/// Commits what is queued, then stops; answered then.
impl Handler<Stop> for Writer {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) -> Self::Result {
        let (stopped, wait) = oneshot::channel();
        self.stopping.push(stopped);
        self.start_batch(ctx);
        Box::pin(async move {
            // Dropped only if the writer stops, which is also the end of its queue.
            let _ = wait.await;
        })
    }
}

/// Commits `writes` (a batch) on `route`, decides every write in it, and returns how many
/// entries it created.
async fn process_batch(
    route: &Route,
    config: &WriterConfig,
    writes: Vec<Waiting<Decided>>,
) -> usize {
    metrics::histogram!(metric::WRITER_BATCH_SIZE).record(writes.len() as f64);
    let span =
        crate::otlp::writer_batch_span(writes.iter().map(|waiting| waiting.write.trace.as_ref()));
    let decided = match stamp(route, config).await {
        Ok(created_at) => {
            let rows = batch::rows(writes.iter().map(|w| &w.write), config, created_at);
            commit_isolating_bad_items(route, config, &rows).await
        }
        Err(error) => {
            tracing::warn!(error = %error, size = writes.len(), "batch failed: cannot read the database's clock");
            config.health.failed(route.node(), &error);
            writes
                .iter()
                .map(|_| Decided::Failed(WriteError::Storage(error.clone())))
                .collect()
        }
    };
    crate::otlp::end_writer_batch_span(
        span,
        decided.iter().any(|d| matches!(d, Decided::Failed(_))),
    );
    let mut created = 0;
    for (waiting, decided) in writes.into_iter().zip(decided) {
        if matches!(decided, Decided::Created(_)) {
            created += 1;
        }
        fail::fail_point!("writer-after-commit", |_| {
            tracing::error!("failpoint writer-after-commit: aborting");
            std::process::abort();
        });
        // The requester may have gone (client disconnected); the write stands regardless.
        let _ = waiting.reply.send(decided);
    }
    created
}

/// The time a batch's entries are stamped with: the database's time as the daemon's clock
/// estimates it ([`crate::db::DatabaseClock::now`]), or, where that estimate is not to be
/// trusted (no reading yet, or the wall clock stepped or the machine slept since the last), the
/// database's clock read now, at the cost of a round trip.
async fn stamp(route: &Route, config: &WriterConfig) -> Result<DateTime<Utc>, StorageError> {
    if let Some(now) = config.clock.now() {
        return Ok(now);
    }
    route
        .db
        .run(async |connection| Ok(config.clock.read(connection).await?))
        .await
}

/// Commits the batch; if it fails for a reason one item can cause, commits each item alone so
/// that only the bad one fails; if it ran past the statement timeout, commits each half on its
/// own (a large batch may take too long where its halves do not).
async fn commit_isolating_bad_items(
    route: &Route,
    config: &WriterConfig,
    rows: &[WriteRow<'_>],
) -> Vec<Decided> {
    match commit_with_retries(route, config, rows).await {
        Ok(decided) => decided,
        Err(StorageError::DataRejected(reason)) if rows.len() > 1 => {
            tracing::warn!(reason = %reason, size = rows.len(), "batch rejected; committing its writes one by one");
            let mut decided = Vec::with_capacity(rows.len());
            for row in rows {
                decided.push(
                    match commit_with_retries(route, config, std::slice::from_ref(row)).await {
                        Ok(mut one) => one.remove(0),
                        Err(error) => Decided::Failed(error.into()),
                    },
                );
            }
            decided
        }
        Err(StorageError::StatementTimeout(reason)) if rows.len() > 1 => {
            tracing::warn!(reason = %reason, size = rows.len(), "batch ran past the statement timeout; committing it in halves");
            let (first, second) = rows.split_at(rows.len() / 2);
            let mut decided = Box::pin(commit_isolating_bad_items(route, config, first)).await;
            decided.extend(Box::pin(commit_isolating_bad_items(route, config, second)).await);
            decided
        }
        Err(error) => {
            tracing::warn!(error = %error, size = rows.len(), "batch failed");
            rows.iter()
                .map(|_| Decided::Failed(WriteError::Storage(error.clone())))
                .collect()
        }
    }
}

/// Commits the batch, again after a deadlock or serialization failure; one decision per write
/// (a key whose record vanished during the batch is the only per-write failure).
async fn commit_with_retries(
    route: &Route,
    config: &WriterConfig,
    rows: &[WriteRow<'_>],
) -> Result<Vec<Decided>, StorageError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let started = std::time::Instant::now();
        // Bounded on the client's side too: a hung server enforces no statement_timeout; and
        // abandoned as soon as the server is found not to answer at all.
        let committed = route
            .db
            .run(async |connection| batch::commit(connection, (route, config), rows).await);
        let result = tokio::select! {
            result = committed => result,
            hung = route.db.unresponsive() => Err(hung),
        };
        metrics::histogram!(metric::WRITER_TRANSACTION).record(started.elapsed().as_secs_f64());
        let label = if result.is_ok() {
            "committed"
        } else {
            "failed"
        };
        metrics::counter!(metric::WRITER_BATCHES, "result" => label).increment(1);
        match result {
            Err(StorageError::Retryable(reason)) if attempt < MAX_CONFLICT_RETRIES => {
                tracing::debug!(reason = %reason, attempt, "batch aborted by a conflict; retrying");
            }
            other => {
                match &other {
                    Ok(_) => config.health.succeeded(route.node()),
                    Err(error) => config.health.failed(route.node(), error),
                }
                return other;
            }
        }
    }
}
