//! A consumer of retrysafe's events with exactly-once effects.
//!
//! It binds a durable queue to the daemon's exchange, and for each delivery applies a visible
//! side effect (a per-kind count of entries in the table `example_entry_totals`) through
//! `retrysafe::inbox`: the event id is recorded in `processed_events` in the same transaction
//! as the effect, so a redelivered event changes nothing. The message is acked only after the
//! commit (at-least-once delivery, exactly-once effect).
//!
//! The events of one ordering key come first in sequence order; the queue is declared with
//! `x-single-active-consumer`, so that however many copies of this consumer run, one at a time
//! receives, in queue order. Each key's last applied sequence is kept with the effect
//! (`example_key_positions`): a copy of an older event of the key (a redelivery) is recognised
//! by the inbox and not applied; a gap would be reported.
//!
//! ```text
//! cargo run --example consumer -- [--config config.toml] [--queue retrysafe.example]
//! ```
//!
//! It reads `database.url`, `amqp.url`, `amqp.exchange` and `amqp.tls_*` from the daemon's
//! configuration (file and `RETRYSAFE_*` environment), connects as the daemon does (TLS
//! included), and stops after `--max-events N` when given.

use std::path::PathBuf;

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Connection;
use retrysafe::config::{AmqpConfig, Settings};
use retrysafe::inbox::Inbox;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use uuid::Uuid;

const CONSUMER_NAME: &str = "example-consumer";

const CREATE_EFFECT_TABLE: &str = "
CREATE TABLE IF NOT EXISTS example_entry_totals (
    kind    text   PRIMARY KEY,
    entries bigint NOT NULL
)";

const APPLY_EFFECT: &str = "
INSERT INTO example_entry_totals (kind, entries) VALUES ($1, 1)
ON CONFLICT (kind) DO UPDATE SET entries = example_entry_totals.entries + 1";

const CREATE_POSITIONS_TABLE: &str = "
CREATE TABLE IF NOT EXISTS example_key_positions (
    client_id    text   NOT NULL,
    ordering_key text   NOT NULL,
    sequence     bigint NOT NULL,
    PRIMARY KEY (client_id, ordering_key)
)";

/// Moves the key's position to this event's sequence; returns the previous one.
const ADVANCE_POSITION: &str = "
WITH previous AS (
    SELECT sequence FROM example_key_positions WHERE client_id = $1 AND ordering_key = $2
)
INSERT INTO example_key_positions (client_id, ordering_key, sequence) VALUES ($1, $2, $3)
ON CONFLICT (client_id, ordering_key) DO UPDATE SET sequence = EXCLUDED.sequence
RETURNING (SELECT sequence FROM previous)";

struct Args {
    config: PathBuf,
    queue: String,
    max_events: Option<usize>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        config: PathBuf::from("config.toml"),
        queue: "retrysafe.example".into(),
        max_events: None,
    };
    let mut raw = std::env::args().skip(1);
    while let Some(flag) = raw.next() {
        let mut value = || {
            raw.next()
                .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--config" => args.config = value()?.into(),
            "--queue" => args.queue = value()?,
            "--max-events" => args.max_events = Some(value()?.parse()?),
            other => anyhow::bail!("unknown argument {other}; see the top of examples/consumer.rs"),
        }
    }
    Ok(args)
}

/// The first broker of `amqp.url` (one URL, or a cluster's nodes) that answers, with the
/// daemon's TLS settings for `amqps://` ones.
async fn connect_to_any(amqp: &AmqpConfig) -> anyhow::Result<Connection> {
    let mut failures = Vec::new();
    for broker in &amqp.brokers {
        match retrysafe::outbox::broker::connect(broker, amqp).await {
            Ok(connection) => return Ok(connection),
            Err(error) => failures.push(error.to_string()),
        }
    }
    anyhow::bail!("no broker answered: {}", failures.join("; "))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let settings = Settings::load(&args.config)?.validated()?;

    // As the daemon connects: each host of database.url in turn, with its sslmode.
    let mut db = retrysafe::db::connect(&settings.database).await?.client;
    db.batch_execute(CREATE_EFFECT_TABLE).await?;
    db.batch_execute(CREATE_POSITIONS_TABLE).await?;

    let broker = connect_to_any(&settings.amqp).await?;
    let channel = broker.create_channel().await?;
    retrysafe::outbox::declare_exchange(&channel, &settings.amqp.exchange).await?;
    // One consumer at a time receives (the others wait as standbys): the order of the queue is
    // the order of processing. (An existing queue keeps the arguments it was declared with.)
    let mut queue_arguments = FieldTable::default();
    queue_arguments.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
    channel
        .queue_declare(
            args.queue.as_str().into(),
            QueueDeclareOptions::durable(),
            queue_arguments,
        )
        .await?;
    channel
        .queue_bind(
            args.queue.as_str().into(),
            settings.amqp.exchange.as_str().into(),
            "entry.created".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    channel.basic_qos(32, BasicQosOptions::default()).await?;
    let mut deliveries = channel
        .basic_consume(
            args.queue.as_str().into(),
            CONSUMER_NAME.into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    println!(
        "consuming {} from exchange {}",
        args.queue, settings.amqp.exchange
    );

    let inbox = Inbox::new(CONSUMER_NAME);
    let mut handled = 0;
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery?;
        let event_id: Uuid = delivery
            .properties
            .message_id()
            .as_ref()
            .and_then(|id| id.as_str().parse().ok())
            .ok_or_else(|| anyhow::anyhow!("a delivery without a UUID message_id"))?;
        let event: serde_json::Value = serde_json::from_slice(&delivery.data)?;
        let kind = event["data"]["kind"]
            .as_str()
            .unwrap_or("unknown")
            .to_owned();
        let position = retrysafe::inbox::ordering_of(&delivery.properties);
        // The consumer's span continues the write's trace: with an OpenTelemetry layer
        // installed (tracing-opentelemetry), it is a child of the daemon's span of the write.
        let span = tracing::info_span!("process", "otel.kind" = "consumer", %event_id);
        let _ = span.set_parent(retrysafe::inbox::parent_context_of(&delivery.properties));
        if let Some(trace) = retrysafe::inbox::trace_context_of(&delivery.properties) {
            println!("{event_id} continues trace {}", trace.trace_id());
        }
        match inbox.begin(&mut db, event_id).await? {
            Some(transaction) => {
                transaction.execute(APPLY_EFFECT, &[&kind]).await?;
                if let Some(position) = &position {
                    let client = event_client(&delivery);
                    let previous: Option<i64> = transaction
                        .query_one(
                            ADVANCE_POSITION,
                            &[&client, &position.ordering_key, &position.sequence],
                        )
                        .await?
                        .get(0);
                    if previous.unwrap_or(0) + 1 != position.sequence {
                        println!(
                            "note: {} went from {previous:?} to {} (a skipped event, or events this queue did not get)",
                            position.ordering_key, position.sequence
                        );
                    }
                }
                transaction.commit().await?;
                match position {
                    Some(position) => println!(
                        "applied {event_id} (kind {kind}, {} #{})",
                        position.ordering_key, position.sequence
                    ),
                    None => println!("applied {event_id} (kind {kind})"),
                }
            }
            None => println!("skipped {event_id}: already processed"),
        }
        // Only after the commit: a crash before this point redelivers, and the inbox skips it.
        delivery.ack(BasicAckOptions::default()).await?;
        drop(span);
        handled += 1;
        if args.max_events.is_some_and(|max| handled >= max) {
            break;
        }
    }
    Ok(())
}

/// The `client-id` header: ordering keys are per client.
fn event_client(delivery: &lapin::message::Delivery) -> String {
    delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get("client-id"))
        .and_then(AMQPValue::as_long_string)
        .map(|client| client.to_string())
        .unwrap_or_default()
}
