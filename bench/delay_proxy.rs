//! A TCP proxy that delays what the client sends, for the latency scenario of `bench/run`:
//! the daemon (or pgbench) connects to it instead of PostgreSQL, and every round trip through it
//! takes `--delay-ms` longer, as over a link whose one-way delay is that (this kernel has no
//! netem). Only the client-to-server direction is delayed, so a round trip is delayed once.
//!
//! ```text
//! bench-delay-proxy --target 127.0.0.1:5432 --delay-ms 20 [--listen 127.0.0.1:0]
//! ```
//!
//! It prints `LISTENING <port>` once it accepts connections. On SIGUSR1 it prints
//! `BENCH_RESULT {"connections":N,"sends":N,"bytes":N}`, the counts so far: the connections it
//! carried and the client's sends it forwarded (each read of what a client wrote; requests sent
//! together, pipelined, arrive as one), and their bytes; on SIGTERM or SIGINT, the same, and it
//! exits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::time::Instant;

#[derive(Parser)]
#[command(
    name = "bench-delay-proxy",
    about = "A TCP proxy that delays the client's sends"
)]
struct Cli {
    /// Where to forward connections (PostgreSQL).
    #[arg(long)]
    target: String,
    /// Added to every send from the client, in milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
}

/// Chunks in flight per direction of a connection: a bound on what a proxy holds (64 KiB each).
const IN_FLIGHT: usize = 256;
const CHUNK: usize = 64 * 1024;

#[derive(Default)]
struct Counts {
    connections: AtomicU64,
    sends: AtomicU64,
    bytes: AtomicU64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let listener = TcpListener::bind(&cli.listen).await?;
    println!("LISTENING {}", listener.local_addr()?.port());
    let delay = Duration::from_millis(cli.delay_ms);
    let counts = Arc::new(Counts::default());
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut report = signal(SignalKind::user_defined1())?;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (client, _) = accepted?;
                let target = cli.target.clone();
                let counts = counts.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&target).await {
                        counts.connections.fetch_add(1, Ordering::Relaxed);
                        carry(client, server, delay, counts).await;
                    }
                });
            }
            _ = report.recv() => print_counts(&counts),
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    print_counts(&counts);
    Ok(())
}

fn print_counts(counts: &Counts) {
    use std::io::Write;
    println!(
        "BENCH_RESULT {}",
        serde_json::json!({
            "connections": counts.connections.load(Ordering::Relaxed),
            "sends": counts.sends.load(Ordering::Relaxed),
            "bytes": counts.bytes.load(Ordering::Relaxed),
        })
    );
    let _ = std::io::stdout().flush();
}

async fn carry(client: TcpStream, server: TcpStream, delay: Duration, counts: Arc<Counts>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        one_way(client_read, server_write, delay, counts),
        back(server_read, client_write),
    );
}

/// Forwards what the server sends to the client as it comes, undelayed; ends when either side
/// closes.
async fn back(mut from: OwnedReadHalf, mut to: OwnedWriteHalf) {
    let _ = tokio::io::copy(&mut from, &mut to).await;
    let _ = to.shutdown().await;
}

/// Forwards what `from` reads to `to`, each chunk `delay` after it was read, in order; ends
/// when either side closes.
async fn one_way(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    delay: Duration,
    counts: Arc<Counts>,
) {
    let (sender, mut receiver) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let reading = async move {
        let mut buffer = vec![0u8; CHUNK];
        loop {
            match from.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => {
                    counts.sends.fetch_add(1, Ordering::Relaxed);
                    counts.bytes.fetch_add(read as u64, Ordering::Relaxed);
                    let due = Instant::now() + delay;
                    if sender.send((due, buffer[..read].to_vec())).await.is_err() {
                        break;
                    }
                }
            }
        }
    };
    let writing = async move {
        while let Some((due, bytes)) = receiver.recv().await {
            // Only a deadline still ahead goes through the timer: tokio's timer counts whole
            // milliseconds and wakes on its next tick, so even a deadline already passed cost up
            // to a millisecond there (each round trip through a proxy of no delay took 2.3 ms
            // more than without it).
            if due > Instant::now() {
                tokio::time::sleep_until(due).await;
            }
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reading, writing);
}
