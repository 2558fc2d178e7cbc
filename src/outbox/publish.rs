//! Publishing a batch of outbox events with pipelined publisher confirms: what the relay does
//! for due events and `retrysafe outbox replay` for past ones, with the same messages.

use std::collections::HashSet;
use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, PublisherConfirm};

use uuid::Uuid;

use crate::outbox::store::PendingEvent;

/// The AMQP `content_type` of every event.
pub const CONTENT_TYPE: &str = "application/cloudevents+json";
/// The AMQP `app_id` of every event.
pub const APP_ID: &str = "retrysafe";

/// Where a batch is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination<'a> {
    /// The daemon's topic exchange, with the event type as routing key: every queue bound for
    /// that type gets the event.
    Exchange(&'a str),
    /// One queue, through the default exchange (`""`, which routes by queue name): no other
    /// queue gets a copy.
    Queue(&'a str),
}

impl Destination<'_> {
    fn exchange(&self) -> &str {
        match self {
            Destination::Exchange(exchange) => exchange,
            Destination::Queue(_) => "",
        }
    }

    fn routing_key<'e>(&'e self, event: &'e PendingEvent) -> &'e str {
        match self {
            Destination::Exchange(_) => &event.event_type,
            Destination::Queue(queue) => queue,
        }
    }

    /// Why a returned (mandatory, unroutable) message was returned.
    fn no_route(&self, event: &PendingEvent) -> String {
        match self {
            Destination::Exchange(exchange) => format!(
                "returned by the broker: NO_ROUTE (no queue bound to exchange {exchange:?} for routing key {:?})",
                event.event_type
            ),
            Destination::Queue(queue) => {
                format!("returned by the broker: NO_ROUTE (no queue named {queue:?})")
            }
        }
    }
}

/// How the broker answered one publish.
#[derive(Debug)]
pub enum PublishResult {
    Acked,
    Failed { kind: FailureKind, error: String },
}

/// Why a publish failed, as the publish metric labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    Nacked,
    Returned,
    Timeout,
    ConnectionLost,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Nacked => "nacked",
            FailureKind::Returned => "returned",
            FailureKind::Timeout => "timeout",
            FailureKind::ConnectionLost => "connection_lost",
        }
    }

    /// A channel that lost its connection, or left a confirm unanswered, is replaced: a late
    /// confirm must not be taken for another message's.
    pub fn breaks_channel(self) -> bool {
        matches!(self, FailureKind::Timeout | FailureKind::ConnectionLost)
    }
}

/// What a nack means, as far as the daemon can tell: a queue bound for the event refused it
/// (most often a full one with `x-overflow = reject-publish`), or the broker failed to store
/// it. Which queue, the nack does not say; queues that took it have a copy.
const NACKED: &str = "nacked by the broker: a queue refused it (full, with x-overflow = reject-publish?) or the broker could not store it; queues that took it have a copy";

/// Why one publish failed, in words, with the kind the metric counts.
#[derive(Debug, Clone)]
struct PublishFailure {
    kind: FailureKind,
    error: String,
}

impl PublishFailure {
    fn new(kind: FailureKind, error: impl Into<String>) -> Self {
        PublishFailure {
            kind,
            error: error.into(),
        }
    }
}

/// Publishes every event before awaiting any confirm, then awaits them all; one deadline,
/// `confirm_timeout` from now, bounds the whole batch, the socket writes included (a blocked or
/// half-open connection must not hold the caller's transaction open). Every message is
/// `mandatory` and persistent: an event that reaches no queue is returned, and a failure.
pub async fn publish_all(
    channel: &Channel,
    destination: Destination<'_>,
    confirm_timeout: Duration,
    events: &[PendingEvent],
) -> Vec<PublishResult> {
    publish_all_then(channel, destination, confirm_timeout, events, || {}).await
}

/// [`publish_all`], calling `published` once the publishes are written (or have failed) and
/// before the first confirm is awaited: the relay starts its next batch then, so that the
/// broker has messages to take while this batch's confirms come back.
pub async fn publish_all_then(
    channel: &Channel,
    destination: Destination<'_>,
    confirm_timeout: Duration,
    events: &[PendingEvent],
    published: impl FnOnce(),
) -> Vec<PublishResult> {
    let deadline = Deadline {
        at: tokio::time::Instant::now() + confirm_timeout,
        timeout: confirm_timeout,
    };
    let confirms = publish(channel, destination, deadline, events).await;
    published();
    let (outcomes, returned) = await_confirms(confirms, deadline).await;
    attribute(destination, events, outcomes, &returned)
}

/// The batch's one deadline, and the timeout it came from (for the messages).
#[derive(Debug, Clone, Copy)]
struct Deadline {
    at: tokio::time::Instant,
    timeout: Duration,
}

/// Phase 1: writes every publish. They are all handed to lapin at once, in the batch's order:
/// each queues its frames and wakes lapin's I/O thread, which writes them together, where
/// awaiting each write before the next publish cost a hand-off to that thread and back per
/// event. After the first failure the channel is not trusted with the rest: they fail the
/// same way (a publish that was written after it is sent again with the next batch).
async fn publish(
    channel: &Channel,
    destination: Destination<'_>,
    deadline: Deadline,
    events: &[PendingEvent],
) -> Vec<Result<PublisherConfirm, PublishFailure>> {
    // join_all polls the publishes first in this order, which is when lapin numbers each one
    // for its confirm and queues its frames.
    let publishes = futures_util::future::join_all(events.iter().map(|event| {
        channel.basic_publish(
            short_string(destination.exchange()),
            short_string(destination.routing_key(event)),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            event.payload.as_bytes(),
            message_properties(event),
        )
    }));
    let Ok(written) = tokio::time::timeout_at(deadline.at, publishes).await else {
        let failure = PublishFailure::new(
            FailureKind::Timeout,
            format!("publish not written within {:?}", deadline.timeout),
        );
        return events.iter().map(|_| Err(failure.clone())).collect();
    };
    let mut broken: Option<PublishFailure> = None;
    written
        .into_iter()
        .map(|result| {
            if let Some(failure) = &broken {
                return Err(failure.clone());
            }
            result.map_err(|error| {
                let failure = PublishFailure::new(
                    FailureKind::ConnectionLost,
                    format!("publish failed: {error}"),
                );
                broken = Some(failure.clone());
                failure
            })
        })
        .collect()
}

/// Phase 2: awaits each confirm until the deadline, and collects the message ids of returned
/// messages. lapin hands a returned message to whichever confirm completes next, not to its own
/// publish's: a return is attributed by its message_id, never by where it arrived.
async fn await_confirms(
    confirms: Vec<Result<PublisherConfirm, PublishFailure>>,
    deadline: Deadline,
) -> (Vec<Result<(), PublishFailure>>, HashSet<String>) {
    let mut returned: HashSet<String> = HashSet::new();
    let mut outcomes = Vec::with_capacity(confirms.len());
    for publishing in confirms {
        let outcome = match publishing {
            Err(failure) => Err(failure),
            Ok(pending) => match tokio::time::timeout_at(deadline.at, pending).await {
                Ok(Ok(confirmation)) => {
                    let acked = confirmation.is_ack();
                    let requested = !matches!(confirmation, Confirmation::NotRequested);
                    if let Some(message) = confirmation.take_message() {
                        if let Some(id) = message.delivery.properties.message_id() {
                            returned.insert(id.to_string());
                        }
                    }
                    match (requested, acked) {
                        (false, _) => Err(PublishFailure::new(
                            FailureKind::ConnectionLost,
                            "the channel is not in confirm mode",
                        )),
                        (true, true) => Ok(()),
                        (true, false) => Err(PublishFailure::new(FailureKind::Nacked, NACKED)),
                    }
                }
                Ok(Err(error)) => Err(PublishFailure::new(
                    FailureKind::ConnectionLost,
                    format!("connection lost before the confirm: {error}"),
                )),
                // A late confirm would arrive on a channel that is about to be replaced.
                Err(_elapsed) => Err(PublishFailure::new(
                    FailureKind::Timeout,
                    format!("no confirm within {:?}", deadline.timeout),
                )),
            },
        };
        outcomes.push(outcome);
    }
    (outcomes, returned)
}

/// Phase 3: each event's result. A returned event failed whatever its confirm said. Without
/// every confirm, a return may sit on one that never completed: no ack in this batch can then
/// be trusted to mean "routed", so none counts as sent (a resend is safe, a loss is not).
fn attribute(
    destination: Destination<'_>,
    events: &[PendingEvent],
    outcomes: Vec<Result<(), PublishFailure>>,
    returned: &HashSet<String>,
) -> Vec<PublishResult> {
    let incomplete = outcomes.iter().find_map(|outcome| match outcome {
        Err(failure) if failure.kind.breaks_channel() => Some(failure.clone()),
        _ => None,
    });
    events
        .iter()
        .zip(outcomes)
        .map(|(event, outcome)| {
            if !returned.is_empty() && returned.contains(&event.event_id.to_string()) {
                return PublishResult::Failed {
                    kind: FailureKind::Returned,
                    error: destination.no_route(event),
                };
            }
            match (outcome, &incomplete) {
                (Ok(()), None) => PublishResult::Acked,
                (Ok(()), Some(failure)) => PublishResult::Failed {
                    kind: failure.kind,
                    error: format!(
                        "acked, but the batch's confirms are incomplete: {}",
                        failure.error
                    ),
                },
                (Err(PublishFailure { kind, error }), _) => PublishResult::Failed { kind, error },
            }
        })
        .collect()
}

/// Names and ids here are short (event types are at most 64 characters, ids are UUIDs, queue
/// and exchange names at most 255 bytes by AMQP's rules), but `ShortString` panics past 255
/// bytes, so truncate rather than trust that.
fn short_string(text: &str) -> ShortString {
    let mut end = text.len().min(255);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].into()
}

/// The AMQP properties of an event's message, the same on every publication of it, replays
/// included: `message_id` is the event id (consumers dedupe on it), `type` the event type,
/// `timestamp` the write's time, `app_id` and `content_type` as above, persistent delivery, and
/// the headers `idempotency-key` and `client-id`; for an ordered write's event
/// `ordering-key` and `sequence`; and the write's `traceparent` and `tracestate`.
pub fn message_properties(event: &PendingEvent) -> BasicProperties {
    let properties = event_properties(
        event.event_id,
        &event.event_type,
        &event.client_id,
        &event.idempotency_key,
        event.created_at.timestamp().max(0) as u64,
    );
    let properties = match (&event.ordering_key, event.sequence) {
        (Some(key), Some(sequence)) => with_ordering(properties, key, sequence),
        _ => properties,
    };
    match &event.traceparent {
        Some(traceparent) => with_trace(properties, traceparent, event.tracestate.as_deref()),
        None => properties,
    }
}

/// The W3C trace context headers, as the write had them: a consumer continues its trace.
fn with_trace(
    properties: BasicProperties,
    traceparent: &str,
    tracestate: Option<&str>,
) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert(
        "traceparent".into(),
        AMQPValue::LongString(traceparent.into()),
    );
    if let Some(state) = tracestate {
        headers.insert("tracestate".into(), AMQPValue::LongString(state.into()));
    }
    properties.with_headers(headers)
}

/// The headers of an ordered write's event: `ordering-key` (what a consistent-hash exchange
/// can spread keys over queues by) and `sequence`, a string as in the CloudEvent's `sequence`.
fn with_ordering(properties: BasicProperties, key: &str, sequence: i64) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert("ordering-key".into(), AMQPValue::LongString(key.into()));
    headers.insert(
        "sequence".into(),
        AMQPValue::LongString(sequence.to_string().into()),
    );
    properties.with_headers(headers)
}

/// [`message_properties`] from the parts of an event: for tools that publish messages shaped
/// like the daemon's without an outbox row (the benchmark's baseline publisher).
pub fn event_properties(
    event_id: Uuid,
    event_type: &str,
    client_id: &str,
    idempotency_key: &str,
    timestamp: u64,
) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        "idempotency-key".into(),
        AMQPValue::LongString(idempotency_key.into()),
    );
    headers.insert("client-id".into(), AMQPValue::LongString(client_id.into()));
    BasicProperties::default()
        .with_message_id(event_id.to_string().into())
        .with_type(short_string(event_type))
        .with_timestamp(timestamp)
        .with_app_id(APP_ID.into())
        .with_content_type(CONTENT_TYPE.into())
        .with_delivery_mode(2)
        .with_headers(headers)
}
