//! The loads and probes that run inside this program: the broker's exchanges and queues, the
//! plain lapin publisher (the drain's baseline), the outbox's drain clock, the HTTP client (keys
//! created, the end-to-end latency) and the delay proxy of the latency scenario.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use awc::http::StatusCode;
use futures_util::StreamExt;
use lapin::options::*;
use lapin::types::FieldTable;
use lapin::{Confirmation, Connection, ConnectionProperties};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::harness::block_on;
use crate::stats::{Figures, Num};

pub const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// Exchanges and queues, by name (`--exchange X --queue Q`, each repeatable).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Names {
    #[arg(long)]
    pub exchange: Vec<String>,
    #[arg(long)]
    pub queue: Vec<String>,
    #[arg(long, env = "BENCH_AMQP_URL", default_value = AMQP)]
    pub amqp: String,
}

impl Names {
    /// An exchange and its queue `<exchange>.q`.
    pub fn of(exchange: &str, amqp: &str) -> Names {
        let (queue, amqp) = (vec![format!("{exchange}.q")], amqp.into());
        Names {
            exchange: vec![exchange.into()],
            queue,
            amqp,
        }
    }
}

async fn connect(amqp: &str) -> Result<Connection> {
    let properties = ConnectionProperties::default().with_connection_name("bench".into());
    let connect = Connection::connect(amqp, properties);
    let connected = tokio::time::timeout(Duration::from_secs(10), connect).await;
    let connected = connected.context("no answer from the broker within 10 s")?;
    connected.with_context(|| format!("cannot connect to {amqp}"))
}

/// Each exchange a durable topic exchange (the daemon's own declaration, so either may come
/// first) and each queue durable, bound to it for '#'.
pub async fn bind(names: &Names) -> Result<()> {
    let connection = connect(&names.amqp).await?;
    let channel = connection.create_channel().await?;
    for (exchange, queue) in names.exchange.iter().zip(&names.queue) {
        retrysafe::outbox::declare_exchange(&channel, exchange).await?;
        let (q, x, table) = (queue.as_str(), exchange.as_str(), FieldTable::default);
        channel
            .queue_declare(q.into(), QueueDeclareOptions::durable(), table())
            .await?;
        let bind = channel.queue_bind(q.into(), x.into(), "#".into(), Default::default(), table());
        bind.await?;
    }
    let _ = connection.close(200, "bound".into()).await;
    Ok(())
}

/// Deletes the queues and exchanges; a missing one is not an error.
pub async fn delete(names: &Names) -> Result<()> {
    if names.exchange.is_empty() && names.queue.is_empty() {
        return Ok(());
    }
    let connection = connect(&names.amqp).await?;
    // A failed operation closes its channel, so each one gets a fresh channel.
    for queue in &names.queue {
        let channel = connection.create_channel().await?;
        let _ = channel
            .queue_delete(queue.as_str().into(), Default::default())
            .await;
    }
    for exchange in &names.exchange {
        let channel = connection.create_channel().await?;
        let _ = channel
            .exchange_delete(exchange.as_str().into(), Default::default())
            .await;
    }
    let _ = connection.close(200, "deleted".into()).await;
    Ok(())
}

/// Messages ready in `queue`, waiting up to 60 s for `expect` of them (the queue's count may
/// lag the confirms a moment; it stops waiting once the count held still for 5 s).
pub async fn count(amqp: &str, queue: &str, expect: u64) -> Result<u64> {
    let connection = connect(amqp).await?;
    let channel = connection.create_channel().await?;
    let passive = QueueDeclareOptions::default().passive();
    let (started, mut last, mut since) = (Instant::now(), u64::MAX, Instant::now());
    loop {
        let declared = channel.queue_declare(queue.into(), passive, FieldTable::default());
        let declared = declared.await;
        let messages = u64::from(declared.context("no such queue")?.message_count());
        if messages != last {
            (last, since) = (messages, Instant::now());
        }
        let waited = started.elapsed() > Duration::from_secs(60);
        if messages >= expect || waited || since.elapsed() > Duration::from_secs(5) {
            let _ = connection.close(200, "counted".into()).await;
            return Ok(messages);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The drain's baseline: `count` persistent, mandatory messages shaped like the daemon's events
/// (CloudEvents JSON of `size` bytes, the relay's own properties and headers), at most `window`
/// confirms outstanding, awaiting the oldest as it goes. Messages per second.
pub async fn publish(amqp: &str, x: &str, count: u64, size: usize, window: usize) -> Result<f64> {
    let connection = connect(amqp).await?;
    let channel = connection.create_channel().await?;
    channel.confirm_select(Default::default()).await?;
    let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let (mut outstanding, mut acked) = (VecDeque::new(), 0);
    let mut tally = |confirm| acked += matches!(confirm, Ok(Confirmation::Ack(None))) as u64;
    let mandatory = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    let started = Instant::now();
    for seq in 0..count {
        let (event, entry) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
        let body = |note: &str| {
            let data = serde_json::json!({"seq": seq, "note": note});
            let data = serde_json::json!({"id": entry, "kind": "bench.write", "created_at": time, "data": data});
            let event = serde_json::json!({"specversion": "1.0", "id": event, "source": "/retrysafe",
                "type": "entry.created", "time": time, "subject": entry, "datacontenttype": "application/json", "data": data});
            event.to_string()
        };
        // Padded to exactly `size` bytes when that is larger than the bare event.
        let body = body(&"x".repeat(size.saturating_sub(body("").len())));
        let unix = SystemTime::now().duration_since(UNIX_EPOCH);
        let unix = unix.map_or(0, |d| d.as_secs());
        let (kind, key) = ("entry.created", format!("publisher-{seq}"));
        let properties = retrysafe::outbox::event_properties(event, kind, "anonymous", &key, unix);
        let (x, kind, body) = (x.into(), kind.into(), body.as_bytes());
        let publish = channel.basic_publish(x, kind, mandatory, body, properties);
        outstanding.push_back(publish.await.context("basic.publish")?);
        if outstanding.len() >= window.max(1) {
            let oldest = outstanding.pop_front().expect("the window is not empty");
            tally(oldest.await);
        }
    }
    while let Some(confirm) = outstanding.pop_front() {
        tally(confirm.await);
    }
    let seconds = started.elapsed().as_secs_f64();
    let _ = connection.close(200, "published".into()).await;
    if acked != count {
        bail!("only {acked} of {count} messages were acked without a return");
    }
    Ok(count as f64 / seconds)
}

/// Waits until no outbox row of `db_url` is unsent (at most `timeout`): whether it came to that.
/// One connection asks every 100 ms whether one unsent row is left (a few milliseconds at most),
/// where a count of a 100,000-event backlog costs PostgreSQL ~60 ms of the CPU it measures.
pub async fn drained(db_url: &str, timeout: Duration) -> Result<bool> {
    let client = crate::harness::connect(db_url).await?;
    let sql = "SELECT EXISTS (SELECT 1 FROM outbox_events WHERE sent_at IS NULL)";
    let any = client.prepare(sql).await?;
    let deadline = Instant::now() + timeout;
    loop {
        let tick = Instant::now();
        if !client.query_one(&any, &[]).await?.get::<_, bool>(0) {
            return Ok(true);
        }
        if tick > deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100).saturating_sub(tick.elapsed())).await;
    }
}

/// The body of request `i`: `{"kind":<kind>,"data":{"i":<i>,...}}` (the body `bench/replay.lua`
/// replays for the same key), of ordering key `e2e-key-<i mod keys>` unless `ordering_keys` is 0.
fn body(kind: &str, i: usize, ordering_keys: usize) -> String {
    let data = format!(r#""data":{{"i":{i},"note":"retrysafe benchmark payload"}}"#);
    match ordering_keys {
        0 => format!(r#"{{"kind":"{kind}",{data}}}"#),
        keys => {
            let key = i % keys;
            format!(r#"{{"kind":"{kind}",{data},"ordering_key":"e2e-key-{key}"}}"#)
        }
    }
}

/// POST /v1/entries with `key` and `body`: the answer's bytes if it was a 201, else the error.
async fn post(client: &awc::Client, url: &str, key: &str, body: String) -> Result<usize, String> {
    let request = client.post(format!("{url}/v1/entries"));
    let request = request.insert_header(("Idempotency-Key", key));
    let request = request.insert_header(("Content-Type", "application/json"));
    let sent = request.send_body(body).await;
    let mut response = sent.map_err(|error| error.to_string())?;
    let text = response.body().await.unwrap_or_default();
    match response.status() {
        StatusCode::CREATED => Ok(text.len()),
        status => Err(format!("{status}: {}", String::from_utf8_lossy(&text))),
    }
}

fn http_client(connections: usize) -> awc::Client {
    let client = awc::Client::builder().connector(awc::Connector::new().limit(connections));
    client.timeout(Duration::from_secs(30)).finish()
}

/// Keys `replay-1` .. `replay-<count>` created (32 at a time), each answered 201; the size of a
/// replay's answer: the body the daemon answers replay-1 of bench/replay.lua with.
pub fn precreate(url: &str, count: usize) -> Result<usize> {
    actix_web::rt::System::new().block_on(async {
        let client = http_client(32);
        let post = |i| {
            let (client, key) = (&client, format!("replay-{i}"));
            async move {
                let posted = post(client, url, &key, body("bench.replay", i, 0)).await;
                posted.map_err(|e| anyhow::anyhow!("POST {key}: {e}"))
            }
        };
        let posts = futures_util::stream::iter(1..=count).map(post);
        let mut posts = posts.buffer_unordered(32);
        while let Some(done) = posts.next().await {
            done?;
        }
        post(1).await
    })
}

/// The first time each key was delivered, and how many deliveries there were.
type Deliveries = Arc<Mutex<(HashMap<String, Instant>, usize)>>;

/// The end-to-end latency: an open-loop load that starts a POST with a fresh key every 1/rate
/// seconds whether or not earlier ones were answered, notes when each 201 arrived, and consumes
/// `queue` (bound to the daemon's exchange, empty) on a thread of its own. Each delivery is
/// matched to its request by the `idempotency-key` header: the percentiles of (delivery
/// received − 201 received). With `keys` N, request i is a write of ordering key
/// `e2e-key-<i mod N>`.
pub fn end_to_end(
    url: &str,
    amqp: &str,
    queue: &str,
    rate: u32,
    seconds: u32,
    keys: usize,
) -> Result<Figures> {
    let total = rate as usize * seconds as usize;
    let prefix = format!("e2e-{}-", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let deliveries = Deliveries::default();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let consumer = consume(amqp.into(), queue.into(), deliveries.clone(), stopped)?;
    // Open loop: request i starts at its own time, whether or not earlier ones were answered
    // (a late one at once, so that the average rate holds). When each was sent, and when its
    // 201 arrived or why none did.
    let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let started = Instant::now();
    let answers = actix_web::rt::System::new().block_on(async {
        let (client, start) = (http_client(1024), tokio::time::Instant::from_std(started));
        let request = |i: usize| {
            let (client, key) = (&client, format!("{prefix}{i}"));
            async move {
                tokio::time::sleep_until(start + period * i as u32).await;
                let sent = Instant::now();
                let answer = post(client, url, &key, body("bench.e2e", i, keys)).await;
                (sent, answer.map(|_| Instant::now()))
            }
        };
        futures_util::future::join_all((0..total).map(request)).await
    });
    let last_sent = answers.last().map(|(sent, _)| *sent - started);
    let sending = last_sent.unwrap_or_default().as_secs_f64();
    let failed: Vec<&String> = answers.iter().filter_map(|a| a.1.as_ref().err()).collect();
    if let Some(error) = failed.first() {
        eprintln!("bench: e2e: first request without a 201: {error}");
    }
    let (errors, created) = (failed.len(), answers.len() - failed.len());
    // Waits for the events of every created key, at most 15 s.
    let delivered = || deliveries.lock().expect("not poisoned").0.len();
    let deadline = Instant::now() + Duration::from_secs(15);
    while delivered() < created && Instant::now() <= deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = stop.send(true);
    let consumed = consumer
        .join()
        .map_err(|_| anyhow::anyhow!("the consumer panicked"))?;
    let (first, all) = &*deliveries.lock().expect("not poisoned");
    let ms = |later: Instant, earlier: Instant| match later >= earlier {
        true => (later - earlier).as_secs_f64() * 1e3,
        false => -((earlier - later).as_secs_f64() * 1e3),
    };
    let (mut latencies, mut http) = (Vec::new(), Vec::new());
    for (i, (sent, answer)) in answers.iter().enumerate() {
        if let Ok(done) = answer {
            http.push(ms(*done, *sent));
            let delivered = first.get(&format!("{prefix}{i}"));
            latencies.extend(delivered.map(|delivered| ms(*delivered, *done)));
        }
    }
    latencies.sort_by(f64::total_cmp);
    http.sort_by(f64::total_cmp);
    let percentile = |sorted: &[f64], p: f64| {
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        (!sorted.is_empty()).then(|| sorted[rank.clamp(1, sorted.len()) - 1])
    };
    consumed?;
    let negative = latencies.iter().filter(|&&ms| ms < 0.0).count();
    let mut figures = Figures::default();
    for (name, value) in [
        ("p50_ms", percentile(&latencies, 50.0)),
        ("p99_ms", percentile(&latencies, 99.0)),
        ("max_ms", latencies.last().copied()),
        ("matched", Some(latencies.len() as f64)),
        ("created", Some(created as f64)),
        ("errors", Some(errors as f64)),
        ("sent", Some(total as f64)),
        ("achieved_rate", Some(total as f64 / sending)),
        ("http_p50_ms", percentile(&http, 50.0)),
        ("http_p99_ms", percentile(&http, 99.0)),
        ("negative", Some(negative as f64)),
        ("duplicate_deliveries", Some((all - first.len()) as f64)),
    ] {
        figures.push(name, value.and_then(|value| Num::parse(&value.to_string())));
    }
    Ok(figures)
}

/// Consumes `queue` (auto-ack) on a thread of its own, so that the HTTP load cannot delay the
/// time a delivery is noted. Returns once the consumer is registered.
fn consume(
    amqp: String,
    queue: String,
    deliveries: Deliveries,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<std::thread::JoinHandle<Result<()>>> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let consumer = std::thread::Builder::new().name("e2e-consumer".into());
    let thread = consumer.spawn(move || {
        block_on(async move {
            let setup = async {
                let connection = connect(&amqp).await?;
                let channel = connection.create_channel().await?;
                channel.basic_qos(2000, BasicQosOptions::default()).await?;
                let options = BasicConsumeOptions { no_ack: true, ..BasicConsumeOptions::default() };
                let consume = channel.basic_consume(queue.as_str().into(), "".into(), options, FieldTable::default());
                anyhow::Ok((connection, consume.await?))
            };
            let setup = setup.await;
            let _ = ready_tx.send(setup.as_ref().map(drop).map_err(|error| format!("{error:#}")));
            let (connection, mut consumer) = setup?;
            loop {
                tokio::select! {
                    _ = stop.changed() => break,
                    next = consumer.next() => {
                        let delivery = next.context("the consumer stream ended")??;
                        let at = Instant::now();
                        let headers = delivery.properties.headers().as_ref();
                        let key = headers.and_then(|h| h.inner().get("idempotency-key")?.as_long_string().map(|v| v.to_string()));
                        let mut seen = deliveries.lock().expect("not poisoned");
                        seen.1 += 1;
                        seen.0.entry(key.unwrap_or_default()).or_insert(at);
                    }
                }
            }
            let _ = connection.close(200, "done".into()).await;
            Ok(())
        })
    })?;
    let ready = ready_rx
        .recv()
        .context("the consumer thread exited before it was ready")?;
    ready.map_err(anyhow::Error::msg)?;
    Ok(thread)
}

/// A TCP proxy in front of PostgreSQL that holds each of the client's sends for `delay` before
/// passing it on, and passes the server's answers at once: every round trip through it takes
/// `delay` longer, as over a link whose one-way delay is that (this kernel has no netem, and
/// the proxy needs no privileges). It runs on a thread of its own until dropped.
pub struct DelayProxy {
    pub port: u16,
    /// The client's sends it forwarded (each read of what a client wrote; requests sent
    /// together, pipelined, arrive as one).
    sends: Arc<AtomicU64>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl DelayProxy {
    pub fn start(target: String, delay: Duration, listen: &str) -> Result<DelayProxy> {
        let listener = std::net::TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let (port, sends) = (listener.local_addr()?.port(), Arc::new(AtomicU64::new(0)));
        // Dropping the sender stops the proxy: its runtime goes, and every connection with it.
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let counted = sends.clone();
        let proxy = async move {
            let listener = TcpListener::from_std(listener).expect("a listener for this runtime");
            while let Ok((client, _)) = listener.accept().await {
                let (target, sends) = (target.clone(), counted.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&target).await {
                        carry(client, server, delay, sends).await;
                    }
                });
            }
        };
        let thread = std::thread::Builder::new().name("delay-proxy".into());
        thread.spawn(move || {
            block_on(async {
                tokio::select! { _ = stopped => {}, _ = proxy => {} }
            })
        })?;
        Ok(DelayProxy {
            port,
            sends,
            _stop: stop,
        })
    }

    pub fn sends(&self) -> u64 {
        self.sends.load(Ordering::Relaxed)
    }
}

/// `bench delay-proxy`: the latency scenario's proxy on its own, e.g. to put a standby further
/// from its primary.
#[derive(clap::Args, Debug)]
pub struct ProxyArgs {
    /// Where to forward connections (PostgreSQL).
    #[arg(long)]
    target: String,
    /// Added to every send from the client, in milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
}

/// Runs the proxy until the process is stopped; prints `LISTENING <port>` once it accepts
/// connections.
pub fn proxy(args: ProxyArgs) -> Result<()> {
    let delay = Duration::from_millis(args.delay_ms);
    let proxy = DelayProxy::start(args.target, delay, &args.listen)?;
    println!("LISTENING {}", proxy.port);
    loop {
        std::thread::park();
    }
}

/// Chunks in flight per connection: a bound on what the proxy holds (64 KiB each).
const IN_FLIGHT: usize = 256;

/// Forwards the client's reads to the server, each `delay` after it was read, in order, and the
/// server's answers back as they come; ends when either side closes.
async fn carry(client: TcpStream, server: TcpStream, delay: Duration, sends: Arc<AtomicU64>) {
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let (sender, mut receiver) = tokio::sync::mpsc::channel(IN_FLIGHT);
    let reading = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(read @ 1..) = from_client.read(&mut buffer).await {
            sends.fetch_add(1, Ordering::Relaxed);
            let due = tokio::time::Instant::now() + delay;
            if sender.send((due, buffer[..read].to_vec())).await.is_err() {
                break;
            }
        }
    };
    let writing = async move {
        while let Some((due, bytes)) = receiver.recv().await {
            // Only a deadline still ahead goes through the timer: tokio's timer counts whole
            // milliseconds and wakes on its next tick, so even a deadline already passed cost up
            // to a millisecond there (each round trip through a proxy of no delay took 2.3 ms
            // more than without it).
            if due > tokio::time::Instant::now() {
                tokio::time::sleep_until(due).await;
            }
            if to_server.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to_server.shutdown().await;
    };
    let back = async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        let _ = to_client.shutdown().await;
    };
    tokio::join!(reading, writing, back);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_bodies_name_their_key_in_turn() {
        let plain = r#"{"kind":"bench.e2e","data":{"i":7,"note":"retrysafe benchmark payload"}}"#;
        assert_eq!(body("bench.e2e", 7, 0), plain);
        let ordered: serde_json::Value =
            serde_json::from_str(&body("bench.e2e", 1003, 1000)).unwrap();
        assert_eq!(ordered["ordering_key"], "e2e-key-3");
        assert_eq!(
            (&ordered["kind"], &ordered["data"]["i"]),
            (&"bench.e2e".into(), &1003.into())
        );
    }
}
