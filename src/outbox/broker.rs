//! The daemon's connection to RabbitMQ: one connection, a confirm-mode channel per relay.
//!
//! `amqp.url` may list several brokers (the nodes of a cluster). The daemon connects to the
//! first that answers; when that connection is lost it moves on to the next, round robin.
//! lapin's automatic recovery stays off: a lost connection is noticed (through its events, a
//! failed publish, or a confirm that never came), dropped, and opened again by the next relay
//! that needs a channel, with the relay's own backoff between attempts.
//!
//! A broker under a resource alarm (memory or disk) blocks its publishers (`connection.blocked`)
//! until the alarm clears (`connection.unblocked`): flow control, not a failure. The daemon then
//! stops publishing and waits on the same connection ([`Broker::blocked`],
//! [`Broker::until_unblocked`]): a new connection would be blocked as well, and whatever was
//! written on an abandoned one would still be delivered when the alarm clears.
//!
//! An `amqps://` broker is reached over TLS with the daemon's own rustls configuration (the
//! roots of `amqp.tls_ca_file`, else the platform's; the host name checked; the client
//! certificate of `amqp.tls_cert_file`), handed to lapin through its connector hook rather than
//! lapin's own TLS setup, which would always trust the platform's roots besides the CA file.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::protocol::AMQPSoftError;
use lapin::tcp::{AMQPUriTcpExt, RustlsConnector};
use lapin::types::FieldTable;
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Channel, Connection, ConnectionProperties, Event, ExchangeKind};
use rustls::ClientConfig;

use crate::config::{AmqpConfig, BrokerEndpoint};
use crate::metric;
use crate::tls::{self, ServerVerification, TlsError};

#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    #[error("cannot connect to the broker: {0}")]
    Connect(String),
    #[error("invalid configuration: {key}: {message}")]
    Tls { key: &'static str, message: String },
    #[error("broker error: {0}")]
    Protocol(#[from] lapin::Error),
}

pub struct Broker {
    endpoints: Vec<BrokerEndpoint>,
    /// For the `amqps://` endpoints; `None` when every one is `amqp://`.
    tls: Option<Arc<ClientConfig>>,
    exchange: String,
    /// Bound on connecting to one broker, and on opening a channel.
    connect_timeout: Duration,
    state: tokio::sync::Mutex<ConnectionState>,
    /// The generation of the connection in use, 0 when there is none. Only that connection's
    /// loss clears it: a late error of a connection already replaced (its close failing, say)
    /// must not mark the broker disconnected while the new one works.
    live: Arc<AtomicU64>,
    /// Set by `close`, so that the connection's end is not reported as a loss.
    closing: Arc<AtomicBool>,
    /// Whether the broker blocks publishing on the connection in use, and every change of it.
    blocked: Arc<tokio::sync::watch::Sender<Blocked>>,
    /// Each connection's event listener, and the closes of abandoned connections: waited for
    /// by [`close`](Self::close).
    tasks: tokio_util::task::TaskTracker,
}

/// The broker's flow control as the daemon last heard it.
#[derive(Debug, Clone, Default)]
struct Blocked {
    /// Why, and since when, while the connection in use is blocked.
    now: Option<(String, Instant, u64)>,
    /// Blocks heard so far: a batch that saw this change was blocked at some point.
    count: u64,
}

struct ConnectionState {
    connection: Option<Connection>,
    /// The endpoint to try first: the one connected to, or after a loss the next one.
    next_endpoint: usize,
    /// Counts connections, so that a relay reporting a loss drops only the connection its
    /// channel was on, not a newer one another relay opened since.
    generation: u64,
}

/// A confirm-mode channel and the connection generation it belongs to.
pub struct BrokerChannel {
    pub channel: Channel,
    pub generation: u64,
}

impl Broker {
    /// The brokers of `amqp.url`, as the validation parsed them, reached with `amqp`'s TLS
    /// settings and within `amqp.connect_timeout`.
    pub fn new(amqp: &AmqpConfig) -> Result<Self, BrokerError> {
        Ok(Self {
            endpoints: amqp.brokers.clone(),
            tls: tls_config(amqp)?,
            exchange: amqp.exchange.clone(),
            connect_timeout: amqp.connect_timeout,
            state: tokio::sync::Mutex::new(ConnectionState {
                connection: None,
                next_endpoint: 0,
                generation: 0,
            }),
            live: Arc::new(AtomicU64::new(0)),
            closing: Arc::new(AtomicBool::new(false)),
            blocked: Arc::new(tokio::sync::watch::Sender::new(Blocked::default())),
            tasks: tokio_util::task::TaskTracker::new(),
        })
    }

    /// Why the broker blocks publishing now (`connection.blocked`: a memory or disk alarm), and
    /// for how long; None while it does not.
    pub fn blocked(&self) -> Option<(String, Duration)> {
        let blocked = self.blocked.borrow();
        let (reason, since, generation) = blocked.now.as_ref()?;
        (*generation == self.live_generation()).then(|| (reason.clone(), since.elapsed()))
    }

    /// How many times the broker has blocked publishing so far: a batch that sees it change
    /// was blocked while it waited for its confirms.
    pub fn blocks_so_far(&self) -> u64 {
        self.blocked.borrow().count
    }

    /// Resolves once the broker no longer blocks publishing on the connection in use (at once
    /// if it does not), or the connection is gone.
    pub async fn until_unblocked(&self) {
        let mut changes = self.blocked.subscribe();
        let _ = changes
            .wait_for(|blocked| match &blocked.now {
                None => true,
                Some((_, _, generation)) => *generation != self.live_generation(),
            })
            .await;
    }

    /// Whether the connection is up, as far as the daemon knows.
    pub fn is_connected(&self) -> bool {
        self.live.load(Ordering::Relaxed) != 0
    }

    /// The generation of the connection in use (0: none). A channel of another generation is
    /// on a connection that was dropped or lost, even if it still looks open.
    pub fn live_generation(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }

    /// A new confirm-mode channel, connecting (and declaring the exchange) first if needed.
    pub async fn open_channel(&self) -> Result<BrokerChannel, BrokerError> {
        let mut state = self.state.lock().await;
        if let Some(existing) = state.connection.as_ref() {
            if existing.status().connected() {
                match self.confirm_channel(existing).await {
                    Ok(channel) => {
                        return Ok(BrokerChannel {
                            channel,
                            generation: state.generation,
                        })
                    }
                    Err(error) => {
                        tracing::warn!(error = %error, "cannot open a channel; reconnecting")
                    }
                }
            }
            self.drop_connection(&mut state);
        }
        self.live.store(0, Ordering::Relaxed);
        // Every attempt takes a number of its own: a connection abandoned after it opened
        // must not share one with the next.
        state.generation += 1;
        let generation = state.generation;
        let (connection, index) = self.connect_any(state.next_endpoint, generation).await?;
        let channel = match self.confirm_channel(&connection).await {
            Ok(channel) => channel,
            Err(error) => {
                state.next_endpoint = (index + 1) % self.endpoints.len();
                abandon(&self.tasks, connection, self.connect_timeout);
                return Err(error);
            }
        };
        state.connection = Some(connection);
        state.next_endpoint = index;
        self.live.store(generation, Ordering::Relaxed);
        Ok(BrokerChannel {
            channel,
            generation: state.generation,
        })
    }

    /// Drops the connection of `generation` after a channel on it failed (lost, or a confirm
    /// that never came: a hung broker still looks connected), so that the next `open_channel`
    /// connects again, starting with the next broker of the list.
    pub async fn connection_lost(&self, generation: u64) {
        let mut state = self.state.lock().await;
        if state.generation == generation && state.connection.is_some() {
            self.drop_connection(&mut state);
        }
    }

    fn drop_connection(&self, state: &mut ConnectionState) {
        if let Some(connection) = state.connection.take() {
            abandon(&self.tasks, connection, self.connect_timeout);
        }
        state.next_endpoint = (state.next_endpoint + 1) % self.endpoints.len();
        self.live.store(0, Ordering::Relaxed);
    }

    /// Connects to the first broker that answers, starting at `first`.
    async fn connect_any(
        &self,
        first: usize,
        generation: u64,
    ) -> Result<(Connection, usize), BrokerError> {
        let count = self.endpoints.len();
        let mut failures = Vec::with_capacity(count);
        for offset in 0..count {
            let index = (first + offset) % count;
            let endpoint = &self.endpoints[index];
            match self.connect(endpoint, generation).await {
                Ok(connection) => return Ok((connection, index)),
                Err(error) => failures.push(format!("{}: {error}", endpoint.display)),
            }
        }
        Err(BrokerError::Connect(failures.join("; ")))
    }

    /// Connects to one broker; the connection will be generation `generation` if it becomes
    /// the one in use.
    async fn connect(
        &self,
        endpoint: &BrokerEndpoint,
        generation: u64,
    ) -> Result<Connection, String> {
        let properties = ConnectionProperties::default().with_connection_name("retrysafe".into());
        let connection = tokio::time::timeout(
            self.connect_timeout,
            open(endpoint.uri.clone(), self.tls.clone(), properties),
        )
        .await
        .map_err(|_| {
            format!(
                "no answer within {}",
                humantime::format_duration(self.connect_timeout)
            )
        })??;
        // Events reach only listeners that exist, so listen before anything can go wrong.
        let mut events = connection.events_listener();
        let live = self.live.clone();
        let closing = self.closing.clone();
        let blocked = self.blocked.clone();
        let broker = endpoint.display.clone();
        self.tasks.spawn(async move {
            while let Some(event) = events.next().await {
                match event {
                    Event::ConnectionBlocked(reason) => {
                        flow_blocked(&blocked, generation, &broker, reason)
                    }
                    Event::ConnectionUnblocked => flow_unblocked(&blocked, generation, &broker),
                    // A channel's own error (a soft AMQP error: a passive declare of a missing
                    // exchange, a publish to one) closes that channel, not the connection.
                    Event::Error(error) if error.is_amqp_soft_error() => {
                        tracing::debug!(error = %error, broker = %broker, "broker closed a channel");
                    }
                    Event::Error(error) => {
                        // Only if it is still the connection in use.
                        let _ = live.compare_exchange(
                            generation,
                            0,
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        );
                        // A lost connection blocks nothing any more.
                        flow_unblocked(&blocked, generation, &broker);
                        if closing.load(Ordering::Relaxed) {
                            tracing::debug!(error = %error, broker = %broker, "broker connection closed");
                        } else {
                            tracing::warn!(error = %error, broker = %broker, "broker connection lost");
                        }
                    }
                    _ => {}
                }
            }
        });
        tracing::info!(broker = %endpoint.display, exchange = %self.exchange, "connected to the broker");
        Ok(connection)
    }

    /// A confirm-mode channel on `connection`, within the connect timeout: a broker that hangs
    /// after the connection was made must not hold the relay that asked.
    async fn confirm_channel(&self, connection: &Connection) -> Result<Channel, BrokerError> {
        tokio::time::timeout(
            self.connect_timeout,
            confirm_channel(connection, &self.exchange),
        )
        .await
        .unwrap_or_else(|_| {
            Err(BrokerError::Connect(format!(
                "no channel within {}",
                humantime::format_duration(self.connect_timeout)
            )))
        })
    }

    /// Whether a queue named `queue` exists on the broker, asked with a passive declare (which
    /// only reads) on a channel of its own: the broker closes a channel whose passive declare
    /// names a missing queue. Bounded like opening a channel.
    pub async fn queue_exists(&self, queue: &str) -> Result<bool, BrokerError> {
        let probe = self.open_channel().await?.channel;
        let declared = tokio::time::timeout(
            self.connect_timeout,
            probe.queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            ),
        )
        .await
        .map_err(|_| {
            BrokerError::Connect(format!(
                "no answer to a queue declare within {}",
                humantime::format_duration(self.connect_timeout)
            ))
        })?;
        match declared {
            Ok(_) => {
                // The channel was only for this question; a broker that does not answer the
                // close is not waited for past the timeout.
                let _ =
                    tokio::time::timeout(self.connect_timeout, probe.close(200, "".into())).await;
                Ok(true)
            }
            Err(error) if is_soft_error(&error, AMQPSoftError::NOTFOUND) => Ok(false),
            // An exclusive queue of another connection: it exists, and messages reach it.
            Err(error) if is_soft_error(&error, AMQPSoftError::RESOURCELOCKED) => Ok(true),
            Err(error) => Err(error.into()),
        }
    }

    /// Closes the connection, for shutdown.
    pub async fn close(&self) {
        self.close_within(self.connect_timeout).await;
    }

    /// [`close`](Self::close), waiting at most `limit` (and `amqp.connect_timeout`) for the
    /// broker to answer, and for the connections' listeners and abandoned closes to end.
    pub async fn close_within(&self, limit: Duration) {
        self.closing.store(true, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + limit;
        if let Some(connection) = self.state.lock().await.connection.take() {
            // Closing a connection that already failed reports that failure; a broker that
            // does not answer the close is not waited for past the timeout.
            let _ = tokio::time::timeout(
                self.connect_timeout.min(limit),
                connection.close(200, "retrysafe shutting down".into()),
            )
            .await;
        }
        self.live.store(0, Ordering::Relaxed);
        self.tasks.close();
        let _ = tokio::time::timeout_at(deadline, self.tasks.wait()).await;
    }
}

/// The TLS configuration of the `amqps://` brokers: their certificate checked against
/// `amqp.tls_ca_file` (else the platform's roots) and their host name, and the client
/// certificate of `amqp.tls_cert_file` presented to a broker that asks for one. `None` when no
/// broker is `amqps://` and no TLS file is set; with files set, they are read and checked
/// either way. Errors name the key and the file.
pub fn tls_config(amqp: &AmqpConfig) -> Result<Option<Arc<ClientConfig>>, BrokerError> {
    let files_set = amqp.tls_ca_file.is_some() || amqp.tls_cert_file.is_some();
    if !amqp.uses_tls() && !files_set {
        return Ok(None);
    }
    let keyed = |key: &'static str| {
        move |error: TlsError| BrokerError::Tls {
            key,
            message: error.to_string(),
        }
    };
    let roots = match &amqp.tls_ca_file {
        Some(path) => tls::roots_from_file(path).map_err(keyed("amqp.tls_ca_file"))?,
        // Read only when a broker needs them: a machine without a CA store may still use
        // amqp:// with a client certificate configured for later.
        None if amqp.uses_tls() => tls::platform_roots().map_err(keyed("amqp.tls_ca_file"))?,
        None => rustls::RootCertStore::empty(),
    };
    let identity = tls::load_configured_identity(
        ("amqp.tls_cert_file", amqp.tls_cert_file.as_deref()),
        ("amqp.tls_key_file", amqp.tls_key_file.as_deref()),
    )
    .map_err(|error| BrokerError::Tls {
        key: error.key,
        message: error.error.to_string(),
    })?;
    let config = tls::client_config(ServerVerification::ChainAndName(roots), identity.as_ref())
        .map_err(keyed("amqp.url"))?;
    Ok(Some(Arc::new(config)))
}

/// One connection to `broker` (one of `amqp.brokers`), over TLS for `amqps://` with `amqp`'s
/// TLS settings: for programs beside the daemon, such as consumers.
pub async fn connect(
    broker: &BrokerEndpoint,
    amqp: &AmqpConfig,
) -> Result<Connection, BrokerError> {
    open(
        broker.uri.clone(),
        tls_config(amqp)?,
        ConnectionProperties::default(),
    )
    .await
    .map_err(|error| BrokerError::Connect(format!("{}: {error}", broker.display)))
}

/// Opens an AMQP connection to `uri`: TCP, then for `amqps://` a TLS handshake with `tls`
/// (the host name is the URL's), then AMQP. A failed handshake says which check failed.
async fn open(
    uri: AMQPUri,
    tls: Option<Arc<ClientConfig>>,
    properties: ConnectionProperties,
) -> Result<Connection, String> {
    let runtime = lapin::runtime::default_runtime().map_err(|error| error.to_string())?;
    let connect = async move |uri: AMQPUri, runtime| {
        let mut tcp = uri.clone();
        tcp.scheme = AMQPScheme::AMQP;
        let stream = tcp.connect_async(&runtime).await?;
        if uri.scheme != AMQPScheme::AMQPS {
            return Ok(stream);
        }
        let Some(config) = tls.clone() else {
            // tls_config builds one whenever a URL is amqps://.
            return Err(std::io::Error::other("no TLS configuration for an amqps:// URL").into());
        };
        let connector = RustlsConnector::from(config);
        stream
            .into_rustls(&connector, &uri.authority.host)
            .await
            .map_err(|error| {
                let described = tls::describe_handshake_failure(&error)
                    .map(|reason| format!("TLS: {reason}"))
                    .unwrap_or_else(|| format!("TLS: {error}"));
                lapin::Error::from(std::io::Error::other(described))
            })
    };
    Connection::connector(uri, runtime, connect, properties)
        .await
        .map_err(|error| error.to_string())
}

/// The broker blocked publishing on the connection of `generation`: one WARN, the gauge, and the
/// relays wait ([`Broker::until_unblocked`]).
fn flow_blocked(
    blocked: &tokio::sync::watch::Sender<Blocked>,
    generation: u64,
    broker: &str,
    reason: String,
) {
    tracing::warn!(
        broker,
        reason = %reason,
        "the broker blocks publishing (a resource alarm); events wait in the outbox and are delivered once it unblocks, on the same connection"
    );
    metrics::gauge!(metric::BROKER_BLOCKED).set(1.0);
    blocked.send_modify(|state| {
        state.now = Some((reason, Instant::now(), generation));
        state.count += 1;
    });
}

/// The connection of `generation` is unblocked (or gone): one INFO if it was blocked.
fn flow_unblocked(blocked: &tokio::sync::watch::Sender<Blocked>, generation: u64, broker: &str) {
    blocked.send_if_modified(|state| match &state.now {
        Some((_, since, blocked_generation)) if *blocked_generation == generation => {
            tracing::info!(
                broker,
                after = %humantime::format_duration(Duration::from_secs(since.elapsed().as_secs())),
                "the broker unblocked publishing"
            );
            metrics::gauge!(metric::BROKER_BLOCKED).set(0.0);
            state.now = None;
            true
        }
        _ => false,
    });
}

/// Closes a connection that is no longer used, in the background (on `tasks`) and within
/// `limit`: its broker may be the one that stopped answering.
fn abandon(tasks: &tokio_util::task::TaskTracker, connection: Connection, limit: Duration) {
    tasks.spawn(async move {
        let _ = tokio::time::timeout(limit, connection.close(320, "reconnecting".into())).await;
    });
}

/// A confirm-mode channel on which the exchange is known to exist: declaring it for every
/// channel re-creates an exchange deleted while the connection stayed up (publishing to a
/// missing exchange fails and closes the channel).
///
/// A passive declare comes first: it only reads, where an active declare takes a write lock on
/// the cluster's metadata, which waits for every node, a hung one included, until the cluster
/// declares it down (`net_ticktime`, a minute by default). Only a missing exchange (the passive
/// declare closes its channel with 404) is declared, on a fresh channel.
async fn confirm_channel(connection: &Connection, exchange: &str) -> Result<Channel, BrokerError> {
    let channel = connection.create_channel().await?;
    let channel = if exchange_exists(&channel, exchange).await? {
        channel
    } else {
        let fresh = connection.create_channel().await?;
        declare_exchange(&fresh, exchange).await?;
        fresh
    };
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}

/// Whether `exchange` exists, asked with a passive declare on `channel`, which only reads. When
/// it does not, the broker closes `channel` (404 NOT_FOUND).
pub async fn exchange_exists(channel: &Channel, exchange: &str) -> Result<bool, lapin::Error> {
    let declared = channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await;
    match declared {
        Ok(()) => Ok(true),
        Err(error) if is_soft_error(&error, AMQPSoftError::NOTFOUND) => Ok(false),
        Err(error) => Err(error),
    }
}

/// Declares the daemon's exchange: a durable topic exchange. Consumers that bind queues before
/// the daemon first connects declare it the same way.
pub async fn declare_exchange(channel: &Channel, exchange: &str) -> Result<(), lapin::Error> {
    channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
}

/// A channel closed by the broker with `kind`: 404 NOT_FOUND for a passive declare of a missing
/// exchange or queue, 405 RESOURCE_LOCKED for one of another connection's exclusive queue.
fn is_soft_error(error: &lapin::Error, kind: AMQPSoftError) -> bool {
    use lapin::protocol::AMQPErrorKind;
    matches!(error.kind(), lapin::ErrorKind::ProtocolError(amqp)
        if amqp.kind() == &AMQPErrorKind::Soft(kind))
}
