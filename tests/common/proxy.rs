//! A TCP proxy the test controls, to cut or freeze one daemon's connections to PostgreSQL or
//! RabbitMQ without disturbing other tests.
//!
//! `cut` is a crash or a network cut: connections are closed and new ones refused. `freeze` is a
//! hung server (a paused VM, a SIGSTOPped process): connections stay open and new ones are
//! accepted, but nothing is forwarded in either direction until `thaw`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

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
}

impl TcpProxy {
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State {
            open: true,
            connections: Vec::new(),
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

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
        self.accept_loop.abort();
    }
}
