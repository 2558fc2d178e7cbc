//! `retrysafe outbox skip --event ID`: gives up on one event for good. It is never published;
//! the later events of its ordering key, which it held back, go on. Recorded in outbox_skips
//! with who ran it (the process's OS user id and the session's database role), when and why.

use std::time::Duration;

use clap::Args;
use uuid::Uuid;

use crate::db::Database;
use crate::operator::Operator;
use crate::outbox::store::{self, Skip};

#[derive(Args)]
pub struct SkipArgs {
    /// The event to give up on, by its event id (`retrysafe outbox status` and the key lookup
    /// name parked events and what they block)
    #[arg(long, value_name = "ID")]
    event: Uuid,
    /// Why, for the record
    #[arg(long, value_name = "TEXT", default_value = "")]
    reason: String,
}

/// How long to keep trying while a relay holds the event (it is publishing it: a few seconds
/// at most, `outbox.confirm_timeout`).
const BUSY_FOR_AT_MOST: Duration = Duration::from_secs(60);

pub async fn run(db: &Database, args: &SkipArgs) -> anyhow::Result<()> {
    let uid = i64::from(Operator::current().uid);
    let started = std::time::Instant::now();
    let outcome = loop {
        let outcome = db
            .run(async |connection| {
                store::skip_event(connection, args.event, uid, &args.reason).await
            })
            .await?;
        if outcome != Skip::Busy || started.elapsed() > BUSY_FOR_AT_MOST {
            break outcome;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    match outcome {
        Skip::Skipped {
            event_type,
            client_id,
            ordering_key,
            sequence,
            released,
        } => {
            println!(
                "skipped event {} ({event_type} of client {client_id}): it will not be published",
                args.event
            );
            if let (Some(key), Some(sequence)) = (ordering_key, sequence) {
                println!(
                    "ordering key {key:?} goes on past sequence {sequence}: {released} event(s) released"
                );
            }
            Ok(())
        }
        Skip::NotFound => anyhow::bail!("no event with id {} in the outbox", args.event),
        Skip::AlreadySent => anyhow::bail!(
            "event {} was already published; nothing to skip",
            args.event
        ),
        Skip::AlreadySkipped => anyhow::bail!("event {} was already skipped", args.event),
        Skip::Busy => anyhow::bail!(
            "event {} is being published by a relay; try again in a moment",
            args.event
        ),
    }
}
