//! A TCP proxy the test controls, to cut one daemon's connections to PostgreSQL or RabbitMQ
//! without disturbing other tests.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub struct TcpProxy {
    pub port: u16,
    state: Arc<Mutex<State>>,
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
        let accept_state = state.clone();
        let accept_loop = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                let mut state = accept_state.lock().unwrap();
                if !state.open {
                    drop(inbound);
                    continue;
                }
                state.connections.retain(|task| !task.is_finished());
                state.connections.push(tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }));
            }
        });
        Self {
            port,
            state,
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
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
        self.accept_loop.abort();
    }
}
