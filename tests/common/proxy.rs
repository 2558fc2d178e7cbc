//! A TCP proxy the test controls, to cut or freeze one daemon's connections to PostgreSQL or
//! RabbitMQ without disturbing other tests, or to lose a daemon's answers on the way to a client.
//!
//! `cut` is a crash or a network cut: connections are closed and new ones refused. `freeze` is a
//! hung server (a paused VM, a SIGSTOPped process): connections stay open and new ones are
//! accepted, but nothing is forwarded in either direction until `thaw`. `lose_next_answers` is
//! an answer lost on the way back: the request is forwarded, the whole answer read, and the
//! client's connection closed without it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct TcpProxy {
    pub port: u16,
    state: Arc<Mutex<State>>,
    frozen: watch::Sender<bool>,
    accept_loop: JoinHandle<()>,
}

struct State {
    /// While false, new connections are closed at once and nothing is forwarded.
    open: bool,
    connections: Vec<JoinHandle<()>>,
    /// The next this many connections forward the request but lose the answer.
    answers_to_lose: usize,
    /// Answers the target sent in full that the client never got.
    answers_lost: usize,
}

impl TcpProxy {
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State {
            open: true,
            connections: Vec::new(),
            answers_to_lose: 0,
            answers_lost: 0,
        }));
        let (frozen, frozen_watch) = watch::channel(false);
        let accept_state = state.clone();
        let accept_loop = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                let mut state = accept_state.lock().unwrap();
                if !state.open {
                    drop(inbound);
                    continue;
                }
                state.connections.retain(|task| !task.is_finished());
                if state.answers_to_lose > 0 {
                    state.answers_to_lose -= 1;
                    let lost_state = accept_state.clone();
                    state.connections.push(tokio::spawn(async move {
                        if forward_and_lose_the_answer(inbound, target).await {
                            lost_state.lock().unwrap().answers_lost += 1;
                        }
                    }));
                    continue;
                }
                let frozen = frozen_watch.clone();
                state
                    .connections
                    .push(tokio::spawn(forward(inbound, target, frozen)));
            }
        });
        Self {
            port,
            state,
            frozen,
            accept_loop,
        }
    }

    /// Closes every forwarded connection and refuses new ones until `restore`.
    pub fn cut(&self) {
        let mut state = self.state.lock().unwrap();
        state.open = false;
        for task in state.connections.drain(..) {
            task.abort();
        }
    }

    pub fn restore(&self) {
        self.state.lock().unwrap().open = true;
    }

    /// Stops forwarding anything, in both directions, on every connection (new ones included),
    /// while keeping them open: the peer's kernel still accepts what is sent.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Forwards again, everything held included.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// The next `count` connections forward the client's request, wait for the target's whole
    /// HTTP answer, and close the client's connection without passing the answer on: the write
    /// happened, the client cannot know it.
    pub fn lose_next_answers(&self, count: usize) {
        self.state.lock().unwrap().answers_to_lose = count;
    }

    pub fn answers_lost(&self) -> usize {
        self.state.lock().unwrap().answers_lost
    }
}

async fn forward(inbound: TcpStream, target: SocketAddr, mut frozen: watch::Receiver<bool>) {
    // A hung server completes the TCP handshake and then says nothing: so does a frozen proxy.
    if frozen.wait_for(|frozen| !*frozen).await.is_err() {
        return;
    }
    let Ok(outbound) = TcpStream::connect(target).await else {
        return;
    };
    let (inbound_read, inbound_write) = inbound.into_split();
    let (outbound_read, outbound_write) = outbound.into_split();
    let upstream = pump(inbound_read, outbound_write, frozen.clone());
    let downstream = pump(outbound_read, inbound_write, frozen);
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}

/// Copies until either side closes, holding what it read while frozen.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if frozen.wait_for(|frozen| !*frozen).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

/// Forwards `inbound`'s bytes to `target` and reads one HTTP/1.1 response back, which it drops
/// with the connection. True if the whole response arrived (within a bound).
async fn forward_and_lose_the_answer(inbound: TcpStream, target: SocketAddr) -> bool {
    let Ok(outbound) = TcpStream::connect(target).await else {
        return false;
    };
    let (mut client_reader, mut client_writer) = inbound.into_split();
    let (mut target_reader, mut target_writer) = outbound.into_split();
    let upstream = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_reader, &mut target_writer).await;
    });
    let answered = tokio::time::timeout(
        Duration::from_secs(60),
        read_one_response(&mut target_reader),
    )
    .await
    .unwrap_or(false);
    upstream.abort();
    let _ = client_writer.shutdown().await;
    answered
}

/// Reads a response's head and, by its Content-Length, its body.
async fn read_one_response(reader: &mut (impl AsyncReadExt + Unpin)) -> bool {
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(head_end) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&received[..head_end]).to_ascii_lowercase();
            let body_length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse().ok())
                .unwrap_or(0);
            if received.len() >= head_end + 4 + body_length {
                return true;
            }
        }
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(read) => received.extend_from_slice(&chunk[..read]),
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
        self.accept_loop.abort();
    }
}
