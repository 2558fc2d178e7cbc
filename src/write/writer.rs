//! Writer actors: each takes the writes queued for the writers ([`crate::write::queue`]) as a
//! batch and commits it in one transaction ([`crate::write::batch`]), one batch at a time;
//! answers every write of it; and tells the relays when it wrote events.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, Utc};
use tokio::sync::oneshot;

use crate::db::citus::{ShardId, Topology};
use crate::db::{Database, DatabaseClock, StorageError, WriteHealth};
use crate::lifecycle::Stop;
use crate::metric;
use crate::write::batch::{self, PreparedWrite};
use crate::write::queue::{Commit, Wake, WriteQueue};
use crate::write::{SavedRecord, WriteError};

/// How often a batch aborted by a deadlock or serialization failure is run again.
const MAX_CONFLICT_RETRIES: u32 = 5;

/// What a committed batch did for one write: the key's record, saved by this write or found.
#[derive(Debug, Clone)]
pub enum Committed {
    /// This write claimed the key and committed the entry.
    Created(SavedRecord),
    /// The key was already completed (by another process, or before a restart).
    Existing(SavedRecord),
}

#[derive(Clone)]
pub struct WriterConfig {
    pub max_batch: usize,
    /// How long a completed key stays an idempotency record, counted on the database's clock.
    pub retention: Duration,
    /// Emit `audit.entry.created` too.
    pub audit: bool,
    /// The database's clock: new entries are stamped with it, and every batch reads it.
    pub clock: DatabaseClock,
    /// Told of every batch that commits or fails.
    pub health: WriteHealth,
    /// Where the write tables live: one server, or shards on Citus (a batch's statements, and
    /// the node a failure is told against).
    pub topology: Topology,
}

/// Called after each commit that wrote outbox rows, to wake the outbox relays; with the shard
/// written to, on Citus.
pub type CommitHook = Arc<dyn Fn(Option<ShardId>) + Send + Sync>;

pub struct Writer {
    db: Database,
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
        db: Database,
        config: WriterConfig,
        queue: WriteQueue,
        on_commit: CommitHook,
    ) -> Addr<Self> {
        Self {
            db,
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
        // A stopping writer does not wait for more: it takes what is queued, then stops.
        let waiter = (!self.waiting && self.stopping.is_empty()).then(|| ctx.address().recipient());
        let will_wait = waiter.is_some();
        let commits = self.queue.take_or_wait(self.config.max_batch, waiter);
        if commits.is_empty() {
            self.waiting |= will_wait;
            if !self.stopping.is_empty() {
                self.queue.forget(&ctx.address().recipient());
                for stopped in self.stopping.drain(..) {
                    let _ = stopped.send(());
                }
                ctx.stop();
            }
            return;
        }
        self.batch_in_flight = true;
        let db = self.db.clone();
        let config = self.config.clone();
        let on_commit = self.on_commit.clone();
        // Every write of a batch is of one shard (`queue::take_batch`): the first one's.
        let shard = match &config.topology {
            Topology::Single => None,
            citus => citus.shard_of(&commits[0].pending.write.key.client_id),
        };
        let work = async move {
            let created = process_batch(&db, &config, commits).await;
            if created > 0 {
                on_commit(shard);
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

/// Commits `commits` (a batch), answers every write in it, and returns how many entries it created.
async fn process_batch(db: &Database, config: &WriterConfig, commits: Vec<Commit>) -> usize {
    metrics::histogram!(metric::WRITER_BATCH_SIZE).record(commits.len() as f64);
    let span = crate::otlp::writer_batch_span(
        commits
            .iter()
            .map(|commit| commit.pending.write.trace.as_ref()),
    );
    let results = match stamp(db, config).await {
        Ok(created_at) => {
            let prepared: Vec<PreparedWrite> = commits
                .iter()
                .map(|commit| batch::prepare(&commit.pending.write, config, created_at))
                .collect();
            commit_isolating_bad_items(db, config, &prepared).await
        }
        Err(error) => {
            tracing::warn!(error = %error, size = commits.len(), "batch failed: cannot read the database's clock");
            config.health.failed(None, &error);
            commits
                .iter()
                .map(|_| Err(WriteError::Storage(error.clone())))
                .collect()
        }
    };
    crate::otlp::end_writer_batch_span(span, results.iter().any(Result::is_err));
    let mut created = 0;
    for (commit, result) in commits.into_iter().zip(results) {
        if matches!(result, Ok(Committed::Created(_))) {
            created += 1;
        }
        fail::fail_point!("writer-after-commit", |_| {
            tracing::error!("failpoint writer-after-commit: aborting");
            std::process::abort();
        });
        // The requester may have gone (client disconnected); the write stands regardless.
        let _ = commit.reply.send(result);
    }
    created
}

/// The time a batch's entries are stamped with: the database's time as the daemon's clock
/// estimates it ([`DatabaseClock::now`]), or, where that estimate is not to be trusted (no
/// reading yet, or the wall clock stepped or the machine slept since the last), the database's
/// clock read now, at the cost of a round trip.
async fn stamp(db: &Database, config: &WriterConfig) -> Result<DateTime<Utc>, StorageError> {
    if let Some(now) = config.clock.now() {
        return Ok(now);
    }
    db.run(async |connection| Ok(config.clock.read(connection).await?))
        .await
}

/// Commits the batch; if it fails for a reason one item can cause, commits each item alone so
/// that only the bad one fails; if it ran past the statement timeout, commits each half on its
/// own (a large batch may take too long where its halves do not).
async fn commit_isolating_bad_items(
    db: &Database,
    config: &WriterConfig,
    prepared: &[PreparedWrite<'_>],
) -> Vec<Result<Committed, WriteError>> {
    match commit_with_retries(db, config, prepared).await {
        Ok(outcomes) => outcomes,
        Err(StorageError::DataRejected(reason)) if prepared.len() > 1 => {
            tracing::warn!(reason = %reason, size = prepared.len(), "batch rejected; committing its writes one by one");
            let mut results = Vec::with_capacity(prepared.len());
            for item in prepared {
                let result = match commit_with_retries(db, config, std::slice::from_ref(item)).await
                {
                    Ok(mut outcomes) => outcomes.remove(0),
                    Err(error) => Err(error.into()),
                };
                results.push(result);
            }
            results
        }
        Err(StorageError::StatementTimeout(reason)) if prepared.len() > 1 => {
            tracing::warn!(reason = %reason, size = prepared.len(), "batch ran past the statement timeout; committing it in halves");
            let (first, second) = prepared.split_at(prepared.len() / 2);
            let mut results = Box::pin(commit_isolating_bad_items(db, config, first)).await;
            results.extend(Box::pin(commit_isolating_bad_items(db, config, second)).await);
            results
        }
        Err(error) => {
            tracing::warn!(error = %error, size = prepared.len(), "batch failed");
            prepared
                .iter()
                .map(|_| Err(WriteError::Storage(error.clone())))
                .collect()
        }
    }
}

/// Commits the batch, again after a deadlock or serialization failure; one outcome per write
/// (a key whose record vanished during the batch is the only per-write failure).
async fn commit_with_retries(
    db: &Database,
    config: &WriterConfig,
    prepared: &[PreparedWrite<'_>],
) -> Result<Vec<Result<Committed, WriteError>>, StorageError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let started = std::time::Instant::now();
        // Bounded on the client's side too: a hung server enforces no statement_timeout.
        let result = db
            .run(async |connection| batch::commit(connection, config, prepared).await)
            .await;
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
                // Every write of a batch is of one shard, on one node (Citus).
                let node = config.topology.node_of_client(prepared[0].client_id());
                match &other {
                    Ok(_) => config.health.succeeded(node.as_deref()),
                    Err(error) => config.health.failed(node.as_deref(), error),
                }
                return other;
            }
        }
    }
}
