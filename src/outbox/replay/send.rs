//! Planning a replay (what it would send, or what the unfinished one of the same command has
//! left), starting it, and sending it a batch at a time.

use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::Channel;
use tokio::sync::watch;
use uuid::Uuid;

use super::scan::{self, count, outbox_extent, OutboxExtent};
use super::{
    records, selection_hash, Ending, EventSet, Pace, Plan, ReplayError, ReplayRecord, ReplayTo,
    RunReport, Selection,
};
use crate::db::Database;
use crate::entry::format_time;
use crate::operator::Operator;
use crate::outbox::publish::{publish_all, Destination, PublishResult};
use crate::outbox::store::PendingEvent;

/// Works out what the replay would send: resumes the unfinished replay of the same command, or
/// fixes the event set of a new one as of `now`.
pub async fn plan(
    db: &Database,
    selection: Selection,
    target: ReplayTo,
    now: DateTime<Utc>,
) -> Result<Plan, ReplayError> {
    let selection = selection.normalized();
    let selection_hash = selection_hash(&selection, &target);
    let extent = outbox_extent(db).await?;
    let resumes = records::find_unfinished(db, &selection_hash).await?;
    let (set, start_after) = match &resumes {
        Some(replay) => (
            EventSet::of_replay(&selection, replay),
            replay.last_event_id,
        ),
        None => new_event_set(db, &selection, &extent, now).await?,
    };
    let counts = count(db, &set, start_after).await?;
    Ok(Plan {
        selection,
        target,
        selection_hash,
        resumes,
        set,
        start_after,
        counts,
        extent,
    })
}

async fn new_event_set(
    db: &Database,
    selection: &Selection,
    extent: &OutboxExtent,
    now: DateTime<Utc>,
) -> Result<(EventSet, i64), ReplayError> {
    let created_since = selection.since.map(|bound| bound.resolve(now));
    let created_until = selection.until.map(|bound| bound.resolve(now));
    if let (Some(since), Some(until)) = (created_since, created_until) {
        if since >= until {
            return Err(ReplayError::Invalid(format!(
                "--since ({}) is not before --until ({})",
                format_time(since),
                format_time(until)
            )));
        }
    }
    let mut set = EventSet {
        created_since,
        created_until,
        types: selection.types.clone(),
        clients: selection.clients.clone(),
        event: selection.event,
        max_event_id: extent.newest_id.unwrap_or(0),
    };
    let Some(event_id) = selection.event else {
        let start_after = extent.oldest_id.map_or(0, |oldest| oldest - 1);
        return Ok((set, start_after));
    };
    // One event: its own id is the whole range.
    let Some(outbox_id) = scan::event_outbox_id(db, event_id).await? else {
        return Err(ReplayError::UnknownEvent(event_id));
    };
    set.max_event_id = outbox_id;
    Ok((set, outbox_id - 1))
}

/// Starts the planned replay, or resumes the unfinished one of the same command (also one that
/// another process started since the plan was made).
pub async fn start(
    db: &Database,
    plan: &Plan,
    operator: &Operator,
) -> Result<ReplayRecord, ReplayError> {
    if let Some(replay) = &plan.resumes {
        return resume(db, replay.id).await;
    }
    if let Some(replay) = records::insert(db, plan, operator).await? {
        return Ok(replay);
    }
    // Another process started the same command since the plan was made.
    match records::find_unfinished(db, &plan.selection_hash).await? {
        Some(replay) => resume(db, replay.id).await,
        None => Err(ReplayError::Invalid(
            "the same replay was started and finished by another process meanwhile; run the command again to replay once more".into(),
        )),
    }
}

async fn resume(db: &Database, id: i64) -> Result<ReplayRecord, ReplayError> {
    let resumed = records::mark_running(db, id).await?;
    resumed.ok_or_else(|| {
        ReplayError::Invalid(format!(
            "replay {id} was completed by another process meanwhile"
        ))
    })
}

/// Sends the rest of a started replay, a batch at a time, until it is done, `stop` turns true
/// (checked between batches, so that a batch's confirms are always recorded), or the broker
/// fails a batch. `on_batch` sees the replay after each recorded batch, with this run's sent
/// count and time.
#[allow(clippy::too_many_arguments)]
pub async fn send(
    db: &Database,
    channel: &Channel,
    confirm_timeout: Duration,
    plan: &Plan,
    mut replay: ReplayRecord,
    pace: Pace,
    mut stop: watch::Receiver<bool>,
    mut on_batch: impl FnMut(&ReplayRecord, u64, Duration),
) -> Result<RunReport, ReplayError> {
    let started = tokio::time::Instant::now();
    let batch_size = pace.effective_batch_size();
    let destination = plan.target.destination();
    let mut sent: u64 = 0;
    let ending = loop {
        if *stop.borrow() {
            break Ending::Interrupted;
        }
        if replay.last_event_id >= plan.set.max_event_id {
            break Ending::Completed;
        }
        let (events, next_position) =
            scan::next_page(db, &plan.set, replay.last_event_id, batch_size).await?;
        if events.is_empty() {
            replay = records::record_batch(db, &replay, next_position, &[]).await?;
            continue;
        }
        let (confirmed, failures) =
            publish_batch(channel, destination, confirm_timeout, &events).await;
        sent += confirmed.len() as u64;
        if let Some(first_error) = failures.first() {
            // The confirmed events of the batch count; the resume point stays before it, so
            // the same command sends the whole batch again once the cause is fixed.
            let position = replay.last_event_id;
            replay = records::record_batch(db, &replay, position, &confirmed).await?;
            break Ending::Failed {
                failed: failures.len(),
                first_error: first_error.clone(),
            };
        }
        replay = records::record_batch(db, &replay, next_position, &confirmed).await?;
        if let Some(rate) = pace.rate {
            let due = started + Duration::from_secs_f64(sent as f64 / rate);
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                Ok(()) = stop.changed() => {}
            }
        }
        // After the pause, so that the rate shown is the paced one, not a batch's burst.
        on_batch(&replay, sent, started.elapsed());
    };
    let replay = records::finish(db, replay, &ending).await?;
    Ok(RunReport {
        replay,
        ending,
        sent,
        elapsed: started.elapsed(),
    })
}

/// Publishes one page of events: the ids the broker confirmed, and the errors of the others.
async fn publish_batch(
    channel: &Channel,
    destination: Destination<'_>,
    confirm_timeout: Duration,
    events: &[PendingEvent],
) -> (Vec<Uuid>, Vec<String>) {
    let results = publish_all(channel, destination, confirm_timeout, events).await;
    let mut confirmed = Vec::with_capacity(events.len());
    let mut failures = Vec::new();
    for (event, result) in events.iter().zip(results) {
        match result {
            PublishResult::Acked => confirmed.push(event.event_id),
            PublishResult::Failed { error, .. } => failures.push(error),
        }
    }
    (confirmed, failures)
}
