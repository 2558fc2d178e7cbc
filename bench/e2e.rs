//! HTTP helpers for `bench/run`, and the end-to-end latency benchmark.
//!
//! ```text
//! bench-e2e precreate --url http://127.0.0.1:18437 --kind bench.replay --prefix replay- --count 1000
//! bench-e2e run --url http://127.0.0.1:18437 --queue Q [--rate 1000] [--seconds 20] [--ordering-keys 1000]
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
//! (delivery received − 201 received). With `--ordering-keys N`, request i is a write of
//! ordering key `e2e-key-<i mod N>` (ordered delivery). It prints one line
//! `BENCH_RESULT {json}`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use awc::http::StatusCode;
use clap::{Args, Parser, Subcommand};
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
    Precreate(Precreate),
    Run(Run),
}

/// Create keys <prefix>1..<prefix>N (each answered 201), for the replay scenario.
#[derive(Args)]
struct Precreate {
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
}

/// Open-loop POSTs at --rate per second, and the latency from each 201 to its event.
#[derive(Args)]
struct Run {
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
    /// Writes of so many ordering keys, in turn (0: no ordering key).
    #[arg(long, default_value_t = 0)]
    ordering_keys: usize,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Precreate(args) => actix_web::rt::System::new().block_on(precreate(args)),
        Command::Run(args) => run(args),
    }
}

fn http_client(connections: usize) -> awc::Client {
    awc::Client::builder()
        .connector(awc::Connector::new().limit(connections))
        .timeout(Duration::from_secs(30))
        .finish()
}

/// POST /v1/entries with an idempotency key.
fn post(client: &awc::Client, endpoint: &str, key: &str, body: String) -> awc::SendClientRequest {
    client
        .post(endpoint)
        .insert_header(("Idempotency-Key", key))
        .insert_header(("Content-Type", "application/json"))
        .send_body(body)
}

fn body(kind: &str, i: usize) -> String {
    format!(r#"{{"kind":"{kind}","data":{{"i":{i},"note":"{NOTE}"}}}}"#)
}

/// The body of request `i` of `run`: of ordering key `e2e-key-<i mod keys>` unless `keys` is 0.
fn run_body(i: usize, ordering_keys: usize) -> String {
    let plain = body("bench.e2e", i);
    match ordering_keys {
        0 => plain,
        keys => {
            let object = plain.strip_suffix('}').expect("a JSON object");
            format!(r#"{object},"ordering_key":"e2e-key-{}"}}"#, i % keys)
        }
    }
}

async fn precreate(args: Precreate) -> anyhow::Result<()> {
    let (count, concurrency) = (args.count, args.concurrency);
    let client = http_client(concurrency);
    let endpoint = format!("{}/v1/entries", args.url);
    let next = Rc::new(RefCell::new(1usize));
    let mut workers = Vec::new();
    for _ in 0..concurrency.max(1) {
        let client = client.clone();
        let endpoint = endpoint.clone();
        let next = next.clone();
        let kind = args.kind.clone();
        let prefix = args.prefix.clone();
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
                let mut response = post(&client, &endpoint, &key, body(&kind, i))
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

impl Requests {
    /// A request that got no 201.
    fn failed(&mut self, error: String) {
        self.errors += 1;
        self.first_error.get_or_insert(error);
    }
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

/// Sends a POST with each of `keys` every 1/rate seconds, whether or not earlier ones have been
/// answered, and notes when each was sent and when its 201 arrived; the seconds the sending
/// took (the answers awaited after).
async fn send_open_loop(
    endpoint: &str,
    rate: u32,
    ordering_keys: usize,
    keys: &[String],
    requests: &Rc<RefCell<Requests>>,
) -> f64 {
    let client = http_client(1024);
    let in_flight = Rc::new(AtomicUsize::new(0));
    let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let mut ticker = actix_web::rt::time::interval(period);
    // Open loop: a late tick is made up at once, so the average rate holds.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    for (i, key) in keys.iter().enumerate() {
        ticker.tick().await;
        let (client, endpoint, key) = (client.clone(), endpoint.to_owned(), key.clone());
        let (requests, in_flight) = (requests.clone(), in_flight.clone());
        in_flight.fetch_add(1, Ordering::Relaxed);
        actix_web::rt::spawn(async move {
            requests.borrow_mut().sent_at[i] = Some(Instant::now());
            match post(&client, &endpoint, &key, run_body(i, ordering_keys)).await {
                Ok(mut response) if response.status() == StatusCode::CREATED => {
                    requests.borrow_mut().created_at[i] = Some(Instant::now());
                    let _ = response.body().await;
                }
                Ok(mut response) => {
                    let status = response.status();
                    let text = response.body().await.unwrap_or_default();
                    let text = String::from_utf8_lossy(&text);
                    requests.borrow_mut().failed(format!("{status}: {text}"));
                }
                Err(error) => requests.borrow_mut().failed(error.to_string()),
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

fn run(args: Run) -> anyhow::Result<()> {
    let (rate, total) = (args.rate, args.rate as usize * args.seconds as usize);
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("e2e-{}-", &nonce[..12]);
    let keys: Vec<String> = (0..total).map(|i| format!("{prefix}{i}")).collect();

    let deliveries = Arc::new(Mutex::new(Deliveries::default()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let consumer = start_consumer(args.amqp, args.queue, deliveries.clone(), stop_rx)?;
    let requests = Rc::new(RefCell::new(Requests {
        sent_at: vec![None; total],
        created_at: vec![None; total],
        ..Requests::default()
    }));
    let endpoint = format!("{}/v1/entries", args.url);
    let sending = send_open_loop(&endpoint, rate, args.ordering_keys, &keys, &requests);
    let sending_seconds = actix_web::rt::System::new().block_on(sending);

    let requests = requests.borrow();
    let created = requests.created_at.iter().flatten().count();
    // Wait for the events of every created key (or the timeout).
    let deadline = Instant::now() + Duration::from_secs(args.drain_timeout_secs);
    let delivered = || deliveries.lock().expect("not poisoned").first.len();
    while delivered() < created && Instant::now() <= deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = stop_tx.send(true);
    let consumer_result = consumer
        .join()
        .map_err(|_| anyhow::anyhow!("the consumer thread panicked"))?;

    let seen = deliveries.lock().expect("not poisoned");
    let mut latencies = Vec::with_capacity(created);
    let mut http = Vec::with_capacity(created);
    for (i, key) in keys.iter().enumerate() {
        let (Some(sent), Some(done)) = (requests.sent_at[i], requests.created_at[i]) else {
            continue;
        };
        http.push(signed_ms(done, sent));
        if let Some(&delivered) = seen.first.get(key) {
            latencies.push(signed_ms(delivered, done));
        }
    }
    latencies.sort_by(f64::total_cmp);
    http.sort_by(f64::total_cmp);
    let negative = latencies.iter().filter(|&&ms| ms < 0.0).count();
    let foreign = seen.first.keys().filter(|key| !key.starts_with(&prefix));

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
            "foreign_keys": foreign.count(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_bodies_name_their_key_in_turn() {
        let plain: serde_json::Value = serde_json::from_str(&run_body(7, 0)).unwrap();
        assert_eq!(plain["data"]["i"], 7);
        assert!(plain.get("ordering_key").is_none());
        let ordered: serde_json::Value = serde_json::from_str(&run_body(1003, 1000)).unwrap();
        assert_eq!(ordered["ordering_key"], "e2e-key-3");
        assert_eq!(ordered["kind"], "bench.e2e");
        assert_eq!(ordered["data"]["i"], 1003);
    }
}
