//! Broker and database helpers for `bench/run`, and the plain lapin publisher that is the
//! baseline of the outbox-drain scenario.
//!
//! ```text
//! bench-publisher [--amqp URL] bind    --exchange X --queue Q      # durable topic exchange, durable queue, bound for '#'
//! bench-publisher [--amqp URL] count   --queue Q [--expect N]      # messages ready in Q (waits for N a while)
//! bench-publisher [--amqp URL] delete  [--exchange X]... [--queue Q]...
//! bench-publisher [--amqp URL] publish --exchange X --count N --payload-bytes B [--window 1000]
//! bench-publisher wait-drained --db URL --start-unix-ns T          # polls the outbox until nothing is unsent
//! ```
//!
//! `publish` sends N persistent, mandatory messages shaped like the daemon's events (CloudEvents
//! JSON padded to B bytes, the same AMQP properties and headers as the outbox relay sets) and
//! keeps at most `--window` confirms outstanding, awaiting the oldest as it goes. It prints one
//! line `BENCH_RESULT {json}`; so do `count` and `wait-drained`.

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, PublisherConfirm,
};
use serde_json::json;
use tokio_postgres::NoTls;
use uuid::Uuid;

#[derive(Parser)]
#[command(
    name = "bench-publisher",
    about = "Broker helpers and baseline publisher for bench/run"
)]
struct Cli {
    /// AMQP URL of the broker.
    #[arg(
        long,
        global = true,
        env = "BENCH_AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    amqp: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Bind(Bind),
    Count(Count),
    Delete(Delete),
    Publish(Publish),
    WaitDrained(WaitDrained),
}

/// Declare a durable topic exchange and a durable queue, and bind the queue for a routing key.
#[derive(Args)]
struct Bind {
    #[arg(long)]
    exchange: String,
    #[arg(long)]
    queue: String,
    #[arg(long, default_value = "#")]
    routing_key: String,
}

/// Print how many messages are ready in a queue; with --expect, wait (up to --timeout-secs)
/// until the count reaches that number, as the broker may lag a little.
#[derive(Args)]
struct Count {
    #[arg(long)]
    queue: String,
    #[arg(long)]
    expect: Option<u32>,
    #[arg(long, default_value_t = 15)]
    timeout_secs: u64,
}

/// Delete queues and exchanges; a missing one is not an error.
#[derive(Args)]
struct Delete {
    #[arg(long)]
    exchange: Vec<String>,
    #[arg(long)]
    queue: Vec<String>,
}

/// Publish --count persistent mandatory messages with at most --window confirms outstanding.
#[derive(Args)]
struct Publish {
    #[arg(long)]
    exchange: String,
    #[arg(long, default_value = "entry.created")]
    routing_key: String,
    #[arg(long, default_value_t = 100_000)]
    count: usize,
    /// Size of each message body in bytes (the daemon's event payload size).
    #[arg(long, default_value_t = 400)]
    payload_bytes: usize,
    #[arg(long, default_value_t = 1_000)]
    window: usize,
}

/// Poll until no outbox row has `sent_at` null and print the seconds elapsed since
/// --start-unix-ns (taken by the caller just before it started the daemon).
#[derive(Args)]
struct WaitDrained {
    #[arg(long)]
    db: String,
    #[arg(long)]
    start_unix_ns: u128,
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    #[arg(long, default_value_t = 900)]
    timeout_secs: u64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bind(args) => bind(&cli.amqp, args).await,
        Command::Count(args) => count(&cli.amqp, args).await,
        Command::Delete(args) => delete(&cli.amqp, args).await,
        Command::Publish(args) => publish(&cli.amqp, args).await,
        Command::WaitDrained(args) => wait_drained(args).await,
    }
}

async fn connect(amqp: &str) -> anyhow::Result<Connection> {
    let properties = ConnectionProperties::default().with_connection_name("bench-publisher".into());
    tokio::time::timeout(
        Duration::from_secs(10),
        Connection::connect(amqp, properties),
    )
    .await
    .context("no answer from the broker within 10 s")?
    .with_context(|| format!("cannot connect to {amqp}"))
}

async fn bind(amqp: &str, args: Bind) -> anyhow::Result<()> {
    let Bind {
        exchange,
        queue,
        routing_key,
    } = &args;
    let connection = connect(amqp).await?;
    let channel = connection.create_channel().await?;
    // The daemon's own declaration (durable topic), so either may come first.
    retrysafe::outbox::declare_exchange(&channel, exchange)
        .await
        .with_context(|| format!("declaring exchange {exchange}"))?;
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("declaring queue {queue}"))?;
    channel
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            routing_key.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("binding {queue} to {exchange}"))?;
    let _ = connection.close(200, "bound".into()).await;
    Ok(())
}

async fn queue_count(channel: &Channel, queue: &str) -> anyhow::Result<u32> {
    let declared = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("queue {queue} does not exist"))?;
    Ok(declared.message_count())
}

async fn count(amqp: &str, args: Count) -> anyhow::Result<()> {
    let (queue, expect) = (args.queue.as_str(), args.expect);
    let connection = connect(amqp).await?;
    let channel = connection.create_channel().await?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let mut messages = queue_count(&channel, queue).await?;
    if let Some(expected) = expect {
        // Confirms may precede the queue's own count by a moment; wait for it to settle.
        let mut last_change = Instant::now();
        while messages < expected && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = queue_count(&channel, queue).await?;
            if now != messages {
                last_change = Instant::now();
            } else if last_change.elapsed() > Duration::from_secs(5) {
                break;
            }
            messages = now;
        }
    }
    println!(
        "BENCH_RESULT {}",
        json!({ "queue": queue, "messages": messages })
    );
    let _ = connection.close(200, "counted".into()).await;
    Ok(())
}

async fn delete(amqp: &str, args: Delete) -> anyhow::Result<()> {
    let (exchanges, queues) = (&args.exchange, &args.queue);
    let connection = connect(amqp).await?;
    // A failed operation closes its channel, so each one gets a fresh channel.
    for queue in queues {
        let channel = connection.create_channel().await?;
        if let Err(error) = channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await
        {
            eprintln!("bench-publisher: deleting queue {queue}: {error}");
        }
    }
    for exchange in exchanges {
        let channel = connection.create_channel().await?;
        if let Err(error) = channel
            .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await
        {
            eprintln!("bench-publisher: deleting exchange {exchange}: {error}");
        }
    }
    let _ = connection.close(200, "deleted".into()).await;
    Ok(())
}

/// A CloudEvents body shaped like the daemon's `entry.created`, padded to exactly `size` bytes
/// when that is larger than the bare event.
fn event_body(event_id: Uuid, entry_id: Uuid, time: &str, seq: usize, size: usize) -> Vec<u8> {
    let build = |pad: &str| {
        json!({
            "specversion": "1.0",
            "id": event_id,
            "source": "/retrysafe",
            "type": "entry.created",
            "time": time,
            "subject": entry_id,
            "datacontenttype": "application/json",
            "data": {
                "id": entry_id,
                "kind": "bench.write",
                "created_at": time,
                "data": {"seq": seq, "note": pad},
            },
        })
        .to_string()
        .into_bytes()
    };
    let bare = build("");
    if bare.len() >= size {
        return bare;
    }
    build(&"x".repeat(size - bare.len()))
}

/// The relay's own message properties (the library's), for an `entry.created` event.
fn properties(event_id: Uuid, key: &str) -> BasicProperties {
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    retrysafe::outbox::event_properties(event_id, "entry.created", "anonymous", key, timestamp)
}

#[derive(Default)]
struct Tally {
    acked: usize,
    returned: usize,
    nacked: usize,
    errors: usize,
}

impl Tally {
    fn record(&mut self, result: lapin::Result<Confirmation>) {
        match result {
            Ok(Confirmation::Ack(None)) => self.acked += 1,
            Ok(Confirmation::Ack(Some(_))) => self.returned += 1,
            Ok(Confirmation::Nack(_)) => self.nacked += 1,
            Ok(Confirmation::NotRequested) | Err(_) => self.errors += 1,
        }
    }
}

async fn publish(amqp: &str, args: Publish) -> anyhow::Result<()> {
    let (exchange, routing_key) = (args.exchange.as_str(), args.routing_key.as_str());
    let (count, payload_bytes, window) = (args.count, args.payload_bytes, args.window);
    let connection = connect(amqp).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let window = window.max(1);
    let mut outstanding: VecDeque<PublisherConfirm> = VecDeque::with_capacity(window);
    let mut tally = Tally::default();
    let mut body_bytes = 0usize;

    let started = Instant::now();
    for seq in 0..count {
        let event_id = Uuid::now_v7();
        let entry_id = Uuid::now_v7();
        let body = event_body(event_id, entry_id, &time, seq, payload_bytes);
        body_bytes += body.len();
        let key = format!("publisher-{seq}");
        let confirm = channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &body,
                properties(event_id, &key),
            )
            .await
            .context("basic.publish")?;
        outstanding.push_back(confirm);
        if outstanding.len() >= window {
            let oldest = outstanding.pop_front().expect("the window is not empty");
            tally.record(oldest.await);
        }
    }
    while let Some(confirm) = outstanding.pop_front() {
        tally.record(confirm.await);
    }
    let seconds = started.elapsed().as_secs_f64();
    let _ = connection.close(200, "published".into()).await;

    println!(
        "BENCH_RESULT {}",
        json!({
            "published": count,
            "acked": tally.acked,
            "returned": tally.returned,
            "nacked": tally.nacked,
            "errors": tally.errors,
            "seconds": seconds,
            "events_per_s": count as f64 / seconds,
            "payload_bytes": body_bytes.checked_div(count).unwrap_or(0),
            "window": window,
        })
    );
    if tally.acked != count {
        bail!(
            "only {} of {count} messages were acked without a return",
            tally.acked
        );
    }
    Ok(())
}

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

async fn wait_drained(args: WaitDrained) -> anyhow::Result<()> {
    let db = args.db.as_str();
    let interval = Duration::from_millis(args.interval_ms);
    let timeout = Duration::from_secs(args.timeout_secs);
    let (client, connection) = tokio_postgres::connect(db, NoTls)
        .await
        .with_context(|| format!("cannot connect to {db}"))?;
    tokio::spawn(connection);
    // Counted once; each poll then asks only whether one unsent row is left, a few milliseconds
    // at most, where a count of a 100,000-event backlog costs PostgreSQL ~60 ms of the CPU
    // the drain it measures runs on.
    let first: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL",
            &[],
        )
        .await?
        .get(0);
    let statement = client
        .prepare("SELECT EXISTS (SELECT 1 FROM outbox_events WHERE sent_at IS NULL)")
        .await?;
    let deadline = Instant::now() + timeout;
    let mut polls = 0u64;
    loop {
        let tick = Instant::now();
        let unsent: bool = client.query_one(&statement, &[]).await?.get(0);
        polls += 1;
        if !unsent {
            let seconds = unix_ns().saturating_sub(args.start_unix_ns) as f64 / 1e9;
            println!(
                "BENCH_RESULT {}",
                json!({ "seconds": seconds, "polls": polls, "first_unsent": first })
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("events still unsent after {timeout:?}");
        }
        tokio::time::sleep(interval.saturating_sub(tick.elapsed())).await;
    }
}
