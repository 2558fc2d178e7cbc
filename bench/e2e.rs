//! HTTP helpers for `bench/run`, and the end-to-end latency benchmark.
//!
//! ```text
//! bench-e2e precreate --url http://127.0.0.1:18437 --kind bench.replay --prefix replay- --count 1000
//! bench-e2e run --url http://127.0.0.1:18437 --queue Q [--rate 1000] [--seconds 20]
//! ```
//!
//! `precreate` POSTs keys `<prefix>1` .. `<prefix><count>` with the body
//! `{"kind":"<kind>","data":{"i":<i>,"note":"..."}}` (the body `bench/replay.lua` replays) and
//! fails unless every answer is 201.
//!
//! `run` is an open-loop load: it starts a POST with a fresh key every 1/rate seconds whether or
//! not earlier ones have been answered (many in flight at once), notes when each 201 arrived,
//! and consumes the queue bound to the daemon's exchange on another thread. Each delivery is
//! matched to its request by the `idempotency-key` header; the report gives the percentiles of
//! (delivery received − 201 received). It prints one line `BENCH_RESULT {json}`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use awc::http::StatusCode;
use clap::{Parser, Subcommand};
use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use serde_json::json;

/// Padding that brings the request bodies to about 100 bytes, like `bench/unique_keys.lua`.
const NOTE: &str = "retrysafe benchmark payload";

#[derive(Parser)]
#[command(
    name = "bench-e2e",
    about = "HTTP helpers and end-to-end latency for bench/run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create keys <prefix>1..<prefix>N (each answered 201), for the replay scenario.
    Precreate {
        #[arg(long)]
        url: String,
        #[arg(long, default_value = "bench.replay")]
        kind: String,
        #[arg(long, default_value = "replay-")]
        prefix: String,
        #[arg(long, default_value_t = 1000)]
        count: usize,
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
    },
    /// Open-loop POSTs at --rate per second, and the latency from each 201 to its event.
    Run {
        #[arg(long)]
        url: String,
        #[arg(
            long,
            env = "BENCH_AMQP_URL",
            default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
        )]
        amqp: String,
        /// A queue bound to the daemon's exchange; it should be empty.
        #[arg(long)]
        queue: String,
        #[arg(long, default_value_t = 1000)]
        rate: u32,
        #[arg(long, default_value_t = 20)]
        seconds: u32,
        /// How long to wait for outstanding deliveries once the last 201 arrived.
        #[arg(long, default_value_t = 15)]
        drain_timeout_secs: u64,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Precreate {
            url,
            kind,
            prefix,
            count,
            concurrency,
        } => actix_web::rt::System::new().block_on(precreate(
            &url,
            &kind,
            &prefix,
            count,
            concurrency,
        )),
        Command::Run {
            url,
            amqp,
            queue,
            rate,
            seconds,
            drain_timeout_secs,
        } => run(
            &url,
            &amqp,
            &queue,
            rate,
            seconds,
            Duration::from_secs(drain_timeout_secs),
        ),
    }
}

fn http_client(connections: usize) -> awc::Client {
    awc::Client::builder()
        .connector(awc::Connector::new().limit(connections))
        .timeout(Duration::from_secs(30))
        .finish()
}

fn body(kind: &str, i: usize) -> String {
    format!(r#"{{"kind":"{kind}","data":{{"i":{i},"note":"{NOTE}"}}}}"#)
}

async fn precreate(
    url: &str,
    kind: &str,
    prefix: &str,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    let client = http_client(concurrency);
    let endpoint = format!("{url}/v1/entries");
    let next = Rc::new(RefCell::new(1usize));
    let mut workers = Vec::new();
    for _ in 0..concurrency.max(1) {
        let client = client.clone();
        let endpoint = endpoint.clone();
        let next = next.clone();
        let kind = kind.to_owned();
        let prefix = prefix.to_owned();
        workers.push(actix_web::rt::spawn(async move {
            let mut created = 0usize;
            loop {
                let i = {
                    let mut next = next.borrow_mut();
                    let i = *next;
                    *next += 1;
                    i
                };
                if i > count {
                    return Ok::<usize, anyhow::Error>(created);
                }
                let key = format!("{prefix}{i}");
                let mut response = client
                    .post(&endpoint)
                    .insert_header(("Idempotency-Key", key.as_str()))
                    .insert_header(("Content-Type", "application/json"))
                    .send_body(body(&kind, i))
                    .await
                    .map_err(|e| anyhow::anyhow!("POST {key}: {e}"))?;
                let status = response.status();
                let text = response.body().await.unwrap_or_default();
                if status != StatusCode::CREATED {
                    bail!("POST {key}: {status}: {}", String::from_utf8_lossy(&text));
                }
                created += 1;
            }
        }));
    }
    let mut created = 0;
    for worker in workers {
        created += worker.await.context("a precreate worker panicked")??;
    }
    println!("BENCH_RESULT {}", json!({ "created": created }));
    Ok(())
}

/// What the consumer thread saw: the first delivery time of each key, and the total.
#[derive(Default)]
struct Deliveries {
    first: HashMap<String, Instant>,
    total: usize,
    without_key: usize,
}

fn header_key(delivery: &lapin::message::Delivery) -> Option<String> {
    delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get("idempotency-key"))
        .and_then(|value| value.as_long_string())
        .map(|value| value.to_string())
}

/// Consumes `queue` (auto-ack) on a thread of its own, so that the HTTP load cannot delay the
/// time a delivery is noted. Returns once the consumer is registered.
fn start_consumer(
    amqp: String,
    queue: String,
    deliveries: Arc<Mutex<Deliveries>>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<std::thread::JoinHandle<anyhow::Result<()>>> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    let handle = std::thread::Builder::new()
        .name("e2e-consumer".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let setup = async {
                    let connection = Connection::connect(
                        &amqp,
                        ConnectionProperties::default().with_connection_name("bench-e2e".into()),
                    )
                    .await?;
                    let channel = connection.create_channel().await?;
                    channel.basic_qos(2000, BasicQosOptions::default()).await?;
                    let consumer = channel
                        .basic_consume(
                            queue.as_str().into(),
                            "".into(),
                            BasicConsumeOptions {
                                no_ack: true,
                                ..BasicConsumeOptions::default()
                            },
                            FieldTable::default(),
                        )
                        .await?;
                    Ok::<_, anyhow::Error>((connection, channel, consumer))
                };
                let (connection, _channel, mut consumer) = match setup.await {
                    Ok(parts) => {
                        let _ = ready_tx.send(Ok(()));
                        parts
                    }
                    Err(error) => {
                        let message = format!("{error:#}");
                        let _ = ready_tx.send(Err(error));
                        bail!("consumer setup failed: {message}");
                    }
                };
                let mut stop = stop;
                loop {
                    tokio::select! {
                        _ = stop.changed() => break,
                        next = consumer.next() => match next {
                            Some(Ok(delivery)) => {
                                let at = Instant::now();
                                let key = header_key(&delivery);
                                let mut seen = deliveries.lock().expect("not poisoned");
                                seen.total += 1;
                                match key {
                                    Some(key) => {
                                        seen.first.entry(key).or_insert(at);
                                    }
                                    None => seen.without_key += 1,
                                }
                            }
                            Some(Err(error)) => bail!("consumer failed: {error}"),
                            None => bail!("the consumer stream ended"),
                        }
                    }
                }
                let _ = connection.close(200, "done".into()).await;
                Ok(())
            })
        })?;
    ready_rx
        .recv()
        .context("the consumer thread exited before it was ready")??;
    Ok(handle)
}

#[derive(Default)]
struct Requests {
    /// For request i: when it was sent, and when its 201 arrived.
    sent_at: Vec<Option<Instant>>,
    created_at: Vec<Option<Instant>>,
    errors: usize,
    first_error: Option<String>,
}

fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn signed_ms(later: Instant, earlier: Instant) -> f64 {
    if later >= earlier {
        (later - earlier).as_secs_f64() * 1e3
    } else {
        -((earlier - later).as_secs_f64() * 1e3)
    }
}

fn run(
    url: &str,
    amqp: &str,
    queue: &str,
    rate: u32,
    seconds: u32,
    drain_timeout: Duration,
) -> anyhow::Result<()> {
    let total = rate as usize * seconds as usize;
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let key_of = |i: usize| format!("e2e-{}-{i}", &nonce[..12]);

    let deliveries = Arc::new(Mutex::new(Deliveries::default()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let consumer = start_consumer(
        amqp.to_owned(),
        queue.to_owned(),
        deliveries.clone(),
        stop_rx,
    )?;

    let requests = Rc::new(RefCell::new(Requests {
        sent_at: vec![None; total],
        created_at: vec![None; total],
        ..Requests::default()
    }));
    let endpoint = format!("{url}/v1/entries");
    let system = actix_web::rt::System::new();
    let sending_seconds = system.block_on({
        let requests = requests.clone();
        let key_of = &key_of;
        async move {
            let client = http_client(1024);
            let in_flight = Rc::new(AtomicUsize::new(0));
            let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
            let mut ticker = actix_web::rt::time::interval(period);
            // Open loop: a late tick is made up at once, so the average rate holds.
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let started = Instant::now();
            for i in 0..total {
                ticker.tick().await;
                let client = client.clone();
                let endpoint = endpoint.clone();
                let requests = requests.clone();
                let in_flight = in_flight.clone();
                let key = key_of(i);
                in_flight.fetch_add(1, Ordering::Relaxed);
                actix_web::rt::spawn(async move {
                    let sent = Instant::now();
                    requests.borrow_mut().sent_at[i] = Some(sent);
                    let result = client
                        .post(&endpoint)
                        .insert_header(("Idempotency-Key", key.as_str()))
                        .insert_header(("Content-Type", "application/json"))
                        .send_body(body("bench.e2e", i))
                        .await;
                    match result {
                        Ok(mut response) if response.status() == StatusCode::CREATED => {
                            requests.borrow_mut().created_at[i] = Some(Instant::now());
                            let _ = response.body().await;
                        }
                        Ok(mut response) => {
                            let status = response.status();
                            let text = response.body().await.unwrap_or_default();
                            let mut requests = requests.borrow_mut();
                            requests.errors += 1;
                            requests.first_error.get_or_insert_with(|| {
                                format!("{status}: {}", String::from_utf8_lossy(&text))
                            });
                        }
                        Err(error) => {
                            let mut requests = requests.borrow_mut();
                            requests.errors += 1;
                            requests
                                .first_error
                                .get_or_insert_with(|| error.to_string());
                        }
                    }
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                });
            }
            let sending = started.elapsed().as_secs_f64();
            while in_flight.load(Ordering::Relaxed) > 0 {
                actix_web::rt::time::sleep(Duration::from_millis(5)).await;
            }
            sending
        }
    });

    let created = requests
        .borrow()
        .created_at
        .iter()
        .filter(|t| t.is_some())
        .count();
    // Wait for the events of every created key (or the timeout).
    let deadline = Instant::now() + drain_timeout;
    loop {
        let have = {
            let seen = deliveries.lock().expect("not poisoned");
            seen.first.len()
        };
        if have >= created || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = stop_tx.send(true);
    let consumer_result = consumer
        .join()
        .map_err(|_| anyhow::anyhow!("the consumer thread panicked"))?;

    let requests = requests.borrow();
    let seen = deliveries.lock().expect("not poisoned");
    let mut latencies = Vec::with_capacity(created);
    let mut http = Vec::with_capacity(created);
    for i in 0..total {
        let (Some(sent), Some(done)) = (requests.sent_at[i], requests.created_at[i]) else {
            continue;
        };
        http.push(signed_ms(done, sent));
        if let Some(&delivered) = seen.first.get(&key_of(i)) {
            latencies.push(signed_ms(delivered, done));
        }
    }
    latencies.sort_by(f64::total_cmp);
    http.sort_by(f64::total_cmp);
    let negative = latencies.iter().filter(|&&ms| ms < 0.0).count();
    let foreign = seen
        .first
        .keys()
        .filter(|key| !key.starts_with(&format!("e2e-{}-", &nonce[..12])))
        .count();

    println!(
        "BENCH_RESULT {}",
        json!({
            "target_rate": rate,
            "sent": total,
            "sending_seconds": sending_seconds,
            "achieved_rate": total as f64 / sending_seconds,
            "created": created,
            "errors": requests.errors,
            "first_error": requests.first_error,
            "deliveries": seen.total,
            "duplicate_deliveries": seen.total - seen.without_key - seen.first.len(),
            "deliveries_without_key": seen.without_key,
            "foreign_keys": foreign,
            "matched": latencies.len(),
            "negative": negative,
            "p50_ms": percentile(&latencies, 50.0),
            "p90_ms": percentile(&latencies, 90.0),
            "p99_ms": percentile(&latencies, 99.0),
            "max_ms": latencies.last(),
            "http_p50_ms": percentile(&http, 50.0),
            "http_p99_ms": percentile(&http, 99.0),
        })
    );
    consumer_result
}
