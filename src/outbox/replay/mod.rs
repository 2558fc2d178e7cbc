//! Replays (`retrysafe outbox replay`): past events published again, with their original event
//! id and the relay's message properties, to the exchange or to one queue.
//!
//! A replay is a row of `replays`. It walks the outbox in id order, a batch at a time; each
//! batch is published with the relay's code ([`crate::outbox::publish`]: pipelined confirms,
//! returns matched by `message_id`, one deadline), and only after the broker confirmed it is the
//! batch recorded, in one transaction: a row of `event_replays` per confirmed event, and the
//! replay's resume point (`last_event_id`) moved past the batch. The outbox rows are only read,
//! so their delivery record (`sent_at`, `attempts`) stays the relay's.
//!
//! Which events: every event the selection matches, whatever its delivery state (sent, waiting
//! for the relay, parked), with an id up to the newest one when the replay started. Sending a
//! not yet delivered event is harmless (consumers dedupe on its id) and is what a consumer
//! rebuilt through its own queue needs; the plan counts such events apart. The events a replay
//! covers are fixed when it starts (time bounds resolved, newest id taken), so that resuming it
//! sends the rest of the same set; events written later reach bound queues through the relay.
//!
//! "The same command" is the same selection and target ([`selection_hash`]): an unfinished
//! replay with it is resumed after its `last_event_id`; a completed one is not, and the command
//! starts a new replay that sends everything again.
//!
//! # Layout
//!
//! This file is the command's vocabulary: what to replay ([`Selection`], [`TimeBound`]), where
//! ([`ReplayTo`]), the plan, the pace and how a run ended. `scan` reads the selected events from
//! the outbox, a window of ids at a time; `records` is the `replays` and `event_replays` tables;
//! `send` plans, starts and sends a replay.

mod records;
mod scan;
mod send;

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::db::StorageError;
use crate::entry::format_time;
use crate::idempotency::canonical_json;
use crate::outbox::publish::Destination;

pub use records::{recent, ReplayRecord};
pub use scan::{count, outbox_extent, OutboxExtent, TypeCount};
pub use send::{plan, send, start};

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("{0}")]
    Invalid(String),
    #[error("no event with id {0} in the outbox")]
    UnknownEvent(Uuid),
    #[error(
        "replay {0} was moved on by another process running the same command; stopping (nothing of this batch was recorded, the other process goes on)"
    )]
    Moved(i64),
}

/// A bound of `--since`/`--until`: a time, or a duration before the replay starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeBound {
    At(DateTime<Utc>),
    Ago(Duration),
}

impl TimeBound {
    /// An RFC 3339 time (`2026-12-01T00:00:00Z`), or a duration meaning that long ago (`24h`,
    /// `7d`, `1h 30m`).
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Ok(time) = DateTime::parse_from_rfc3339(text) {
            return Ok(TimeBound::At(time.with_timezone(&Utc)));
        }
        match humantime::parse_duration(text) {
            Ok(duration) if !duration.is_zero() => Ok(TimeBound::Ago(duration)),
            _ => Err(format!(
                "{text:?} is neither an RFC 3339 time (2026-12-01T00:00:00Z) nor a duration ago (24h, 7d)"
            )),
        }
    }

    pub fn resolve(self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            TimeBound::At(time) => time,
            TimeBound::Ago(duration) => chrono::Duration::from_std(duration)
                .ok()
                .and_then(|ago| now.checked_sub_signed(ago))
                .unwrap_or(DateTime::<Utc>::MIN_UTC),
        }
    }
}

impl fmt::Display for TimeBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimeBound::At(time) => f.write_str(&format_time(*time)),
            TimeBound::Ago(duration) => write!(f, "{}", humantime::format_duration(*duration)),
        }
    }
}

impl Serialize for TimeBound {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TimeBound {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        TimeBound::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Which events to replay, as given on the command line. Stored with the replay, and hashed
/// (with the target) to recognize the same command.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Selection {
    /// Created at or after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<TimeBound>,
    /// Created before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<TimeBound>,
    /// Of one of these event types (any when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<String>,
    /// Of one of these clients (any when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<String>,
    /// This one event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<Uuid>,
    /// Every event the outbox holds: asked for explicitly, never implied by an empty selection.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
}

impl Selection {
    /// The same selection in one spelling: lists sorted, without repeats.
    pub fn normalized(mut self) -> Self {
        for list in [&mut self.types, &mut self.clients] {
            list.sort();
            list.dedup();
        }
        self
    }

    /// Whether it selects nothing explicitly (a bare `outbox replay`).
    pub fn is_empty(&self) -> bool {
        *self == Selection::default()
    }

    /// The command-line options that give this selection.
    pub fn arguments(&self) -> Vec<String> {
        let mut arguments = Vec::new();
        let mut push = |name: &str, value: String| {
            arguments.push(name.to_owned());
            arguments.push(value);
        };
        if let Some(since) = self.since {
            push("--since", since.to_string());
        }
        if let Some(until) = self.until {
            push("--until", until.to_string());
        }
        for event_type in &self.types {
            push("--type", event_type.clone());
        }
        for client in &self.clients {
            push("--client", client.clone());
        }
        if let Some(event) = self.event {
            push("--event", event.to_string());
        }
        if self.all {
            arguments.push("--all".to_owned());
        }
        arguments
    }
}

/// Where a replay publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayTo {
    /// `amqp.exchange`, routing key = event type: every queue bound for the type gets a copy.
    Exchange(String),
    /// One queue, through the default exchange: no other queue gets a copy.
    Queue(String),
}

impl ReplayTo {
    /// As stored in `replays.target`.
    pub fn as_text(&self) -> String {
        match self {
            ReplayTo::Exchange(exchange) => format!("exchange:{exchange}"),
            ReplayTo::Queue(queue) => format!("queue:{queue}"),
        }
    }

    pub fn destination(&self) -> Destination<'_> {
        match self {
            ReplayTo::Exchange(exchange) => Destination::Exchange(exchange),
            ReplayTo::Queue(queue) => Destination::Queue(queue),
        }
    }
}

impl fmt::Display for ReplayTo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayTo::Exchange(exchange) => {
                write!(f, "exchange {exchange:?} (routing key = event type)")
            }
            ReplayTo::Queue(queue) => write!(f, "queue {queue:?} only"),
        }
    }
}

/// Identifies "the same command": SHA-256 over the canonical JSON of the normalized selection
/// and the target. Pacing options (`--rate`, `--batch-size`) are not part of it.
pub fn selection_hash(selection: &Selection, target: &ReplayTo) -> [u8; 32] {
    let value = serde_json::json!({
        "selection": selection,
        "target": target.as_text(),
    });
    Sha256::digest(canonical_json(&value).as_bytes()).into()
}

/// The events one replay covers, fixed when it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct EventSet {
    pub created_since: Option<DateTime<Utc>>,
    pub created_until: Option<DateTime<Utc>>,
    pub types: Vec<String>,
    pub clients: Vec<String>,
    pub event: Option<Uuid>,
    /// The newest outbox id when the replay started.
    pub max_event_id: i64,
}

impl EventSet {
    fn of_replay(selection: &Selection, replay: &ReplayRecord) -> Self {
        Self {
            created_since: replay.created_since,
            created_until: replay.created_until,
            types: selection.types.clone(),
            clients: selection.clients.clone(),
            event: selection.event,
            max_event_id: replay.max_event_id,
        }
    }
}

/// What a replay is to do, worked out before anything is sent: the dry run shows it, the real
/// run follows it.
#[derive(Debug, Clone)]
pub struct Plan {
    pub selection: Selection,
    pub target: ReplayTo,
    pub selection_hash: [u8; 32],
    /// The unfinished replay of the same command, which the run resumes.
    pub resumes: Option<ReplayRecord>,
    pub set: EventSet,
    /// Where sending starts: after this outbox id.
    pub start_after: i64,
    /// The events still to send, by type.
    pub counts: Vec<TypeCount>,
    pub extent: OutboxExtent,
}

impl Plan {
    pub fn to_send(&self) -> i64 {
        self.counts.iter().map(|c| c.selected).sum()
    }

    pub fn not_delivered(&self) -> i64 {
        self.counts.iter().map(|c| c.unsent + c.parked).sum()
    }
}

/// How fast a replay sends.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Most events per batch (one publish round and one recording transaction).
    pub batch_size: usize,
    /// Events per second at most; unlimited when `None`.
    pub rate: Option<f64>,
}

impl Pace {
    /// Batches no larger than a second's worth at the rate, so that pacing stays smooth and a
    /// stop is never more than a second's sending away.
    pub fn effective_batch_size(&self) -> usize {
        match self.rate {
            Some(rate) => self.batch_size.min(rate.ceil() as usize).max(1),
            None => self.batch_size.max(1),
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Completed,
    /// Stopped on request, between two batches.
    Interrupted,
    /// The broker did not take a batch (returned, nacked, unconfirmed): the events it confirmed
    /// are recorded, the resume point stays before the batch.
    Failed {
        failed: usize,
        first_error: String,
    },
}

impl Ending {
    fn status(&self) -> &'static str {
        match self {
            Ending::Completed => "completed",
            Ending::Interrupted => "interrupted",
            Ending::Failed { .. } => "failed",
        }
    }
}

/// What one run did.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The replay as recorded at the end.
    pub replay: ReplayRecord,
    pub ending: Ending,
    /// Events the broker confirmed in this run (a batch sent again counts again).
    pub sent: u64,
    pub elapsed: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_bounds_are_rfc3339_times_or_durations_ago() {
        let at = TimeBound::parse("2026-12-01T01:00:00+01:00").unwrap();
        assert_eq!(
            at,
            TimeBound::At("2026-12-01T00:00:00Z".parse().unwrap()),
            "normalized to UTC"
        );
        assert_eq!(at.to_string(), "2026-12-01T00:00:00.000000Z");
        let ago = TimeBound::parse("24h").unwrap();
        assert_eq!(ago, TimeBound::Ago(Duration::from_secs(86_400)));
        assert_eq!(TimeBound::parse(&ago.to_string()).unwrap(), ago);
        let now: DateTime<Utc> = "2026-12-02T00:00:00Z".parse().unwrap();
        assert_eq!(
            ago.resolve(now),
            "2026-12-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        for bad in ["yesterday", "0s", "", "2026-13-01T00:00:00Z"] {
            assert!(TimeBound::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_same_command_has_the_same_hash_in_any_spelling() {
        let one = Selection {
            since: Some(TimeBound::parse("24h").unwrap()),
            types: vec!["entry.created".into(), "audit.entry.created".into()],
            ..Selection::default()
        }
        .normalized();
        let other = Selection {
            since: Some(TimeBound::parse("1day").unwrap()),
            types: vec![
                "audit.entry.created".into(),
                "entry.created".into(),
                "entry.created".into(),
            ],
            ..Selection::default()
        }
        .normalized();
        let queue = ReplayTo::Queue("rebuild".into());
        assert_eq!(selection_hash(&one, &queue), selection_hash(&other, &queue));
        assert_ne!(
            selection_hash(&one, &queue),
            selection_hash(&one, &ReplayTo::Exchange("rebuild".into())),
            "the target is part of the command"
        );
        let until = Selection {
            until: Some(TimeBound::parse("1h").unwrap()),
            ..one.clone()
        };
        assert_ne!(selection_hash(&one, &queue), selection_hash(&until, &queue));
    }

    #[test]
    fn a_selection_round_trips_through_its_stored_form_and_its_arguments() {
        let selection = Selection {
            since: Some(TimeBound::parse("2026-12-01T00:00:00Z").unwrap()),
            until: Some(TimeBound::parse("1h 30m").unwrap()),
            types: vec!["entry.created".into()],
            clients: vec!["billing".into()],
            ..Selection::default()
        };
        let stored = serde_json::to_value(&selection).unwrap();
        assert_eq!(
            stored,
            serde_json::json!({"since": "2026-12-01T00:00:00.000000Z", "until": "1h 30m",
                               "types": ["entry.created"], "clients": ["billing"]})
        );
        assert_eq!(
            serde_json::from_value::<Selection>(stored).unwrap(),
            selection
        );
        assert_eq!(
            selection.arguments(),
            [
                "--since",
                "2026-12-01T00:00:00.000000Z",
                "--until",
                "1h 30m",
                "--type",
                "entry.created",
                "--client",
                "billing"
            ]
        );
        assert!(Selection::default().is_empty());
        assert!(!Selection {
            all: true,
            ..Selection::default()
        }
        .is_empty());
    }

    #[test]
    fn batches_hold_at_most_a_second_of_the_rate() {
        let pace = |batch_size, rate| Pace { batch_size, rate }.effective_batch_size();
        assert_eq!(pace(500, None), 500);
        assert_eq!(pace(500, Some(100.0)), 100);
        assert_eq!(pace(500, Some(0.5)), 1);
        assert_eq!(pace(50, Some(1000.0)), 50);
    }
}
