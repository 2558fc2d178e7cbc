//! Wiring and the shutdown protocol: the database and the broker, the write path (writers and
//! key shards), the outbox (relays, the janitor, the gauges), and the HTTP server; then, when
//! asked, every part stopped in order, in one place ([`Application::run_until_stopped`]), as
//! [`crate::lifecycle`] describes.

use std::net::TcpListener;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use actix::Addr;
use actix_web::dev::{Server, ServerHandle};
use actix_web::web;

use crate::admin::history::OutboxHistory;
use crate::admin::AdminState;
use crate::config::Config;
use crate::db::topology::{self, Topology};
use crate::db::{self, Database, DatabaseClock, WriteHealth};
use crate::http::health::ReadinessMonitor;
use crate::http::server::Listener;
use crate::http::{self, AppState};
use crate::lifecycle::{self, systemd, Tasks};
use crate::outbox::{gauges, Broker, OutboxRelay, OutboxWaker, RelayConfig};
use crate::tls::server::ServerCertificate;
use crate::write::writer::CommitHook;
use crate::write::{KeyShard, PendingBytes, ShardHandle, WriteQueue, Writer, WriterConfig};
use crate::{janitor, metric, telemetry};

/// Memory the replay caches may hold in all, whatever `idempotency.cache_entries` says.
const CACHE_BYTES: usize = 64 * 1024 * 1024;

/// What an embedded daemon runs.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Start the outbox relays and the janitor. Without them events stay in the outbox until
    /// something else publishes them (another daemon, or [`crate::outbox::relay_until_empty`]
    /// in a test), and nothing is purged but by [`crate::janitor::purge_once`].
    pub relays: bool,
    /// How often the outbox's history is sampled for the console's charts, when admins are
    /// configured ([`crate::admin::history::SAMPLE_INTERVAL`]; shorter in tests).
    pub history_interval: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            relays: true,
            history_interval: crate::admin::history::SAMPLE_INTERVAL,
        }
    }
}

/// A running daemon: its actors started and its listener bound.
pub struct Application {
    ports: Ports,
    server: Server,
    /// The HTTPS certificates of `http.listen` and `admin.listen`, reloaded on SIGHUP.
    certificates: Vec<Arc<ServerCertificate>>,
    config: Config,
    broker: Arc<Broker>,
    shards: Vec<Addr<KeyShard>>,
    writers: Vec<Addr<Writer>>,
    relays: Vec<Addr<OutboxRelay>>,
    /// The relays' thread.
    relay_arbiter: actix::Arbiter,
    /// The janitor, the outbox gauges, the metrics' upkeep, the systemd watchdog, the signal
    /// handlers.
    tasks: Tasks,
    /// When a signal asked the daemon to stop: `http.shutdown_timeout` counts from then.
    stop_asked: Arc<OnceLock<Instant>>,
}

/// The write path: its writers, and the shards the HTTP layer submits writes to.
struct WritePath {
    writers: Vec<Addr<Writer>>,
    shards: Vec<ShardHandle>,
}

impl Application {
    /// Migrates the database, starts the actors and binds `http.listen` (port 0 picks a free one).
    /// Must run inside an actix system.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        Self::build_with(config, Options::default()).await
    }

    /// [`build`](Self::build), with parts left out as `options` say.
    pub async fn build_with(config: Config, options: Options) -> anyhow::Result<Self> {
        metric::metrics_handle();
        let tasks = Tasks::default();
        tasks.spawn(telemetry::metrics_upkeep);
        // Read before anything else: a certificate that cannot be used stops the start at once.
        let load = |files: Option<(&std::path::Path, &std::path::Path)>| match files {
            Some((certificate_file, key_file)) => {
                ServerCertificate::load(certificate_file, key_file)
                    .map(Some)
                    .map_err(|error| anyhow::anyhow!("invalid configuration: {error}"))
            }
            None => Ok(None),
        };
        let certificate = load(config.http.tls_files())?;
        let admin_certificate = match config.auth.admins.is_empty() {
            true => None,
            false => load(config.admin.tls_files())?,
        };
        db::migrate(&config.database)
            .await
            .map_err(|error| anyhow::anyhow!("cannot prepare the database: {error}"))?;
        let (writes, reads) = Database::split(&config.database)?;
        let clients: Vec<String> = config
            .auth
            .clients
            .iter()
            .map(|client| client.id.clone())
            .chain([crate::config::ANONYMOUS_CLIENT.to_owned()])
            .collect();
        let topology = Topology::detect(&writes, &clients)
            .await
            .map_err(|error| anyhow::anyhow!("cannot read the database's topology: {error}"))?;
        tracing::info!(topology = %topology.describe(), "where the write tables live");
        let refreshed = topology.clone();
        tasks.spawn(move |shutdown| {
            lifecycle::every(topology::REFRESH_INTERVAL, shutdown, move || {
                let topology = refreshed.clone();
                async move {
                    if let Err(error) = topology.refresh().await {
                        tracing::warn!(error = %error, "cannot read where the write tables' rows are; keeping the last reading");
                    }
                }
            })
        });
        let clock = read_database_clock(&writes).await;
        let broker = Arc::new(Broker::new(&config.amqp)?);

        let relay_arbiter = actix::Arbiter::new();
        let write_health = WriteHealth::default();
        let relays = if options.relays {
            start_relays(&config, (&topology, &write_health), &broker, &relay_arbiter)
        } else {
            Vec::new()
        };
        let write_path = start_write_path(
            &config,
            &topology,
            (clock, write_health.clone()),
            OutboxWaker::new(relays.clone()),
        );
        let retention = config.outbox.retention;
        let janitor_topology = topology.clone();
        if options.relays {
            tasks.spawn(move |shutdown| janitor::run(retention, janitor_topology, shutdown));
        }
        // A readiness check is bounded like a connection attempt plus a second: a probe must
        // answer quickly, and the check is one small query.
        let backlog = Arc::new(gauges::Backlog::default());
        let readiness = Arc::new(ReadinessMonitor::new(
            reads.clone(),
            config.database.connect_timeout + Duration::from_secs(1),
            (write_health, backlog.clone()),
            (topology.clone(), clients),
        ));
        let gauges_pool = reads.clone();
        tasks.spawn(move |shutdown| gauges::run(gauges_pool, backlog, shutdown));
        let refreshed = readiness.clone();
        tasks.spawn(move |shutdown| crate::http::health::refresh(refreshed, shutdown));

        let shards = write_path
            .shards
            .iter()
            .map(|shard| shard.actor().clone())
            .collect();
        // The admin listener's state, and the sampling of the outbox's history it draws.
        let admin = (!config.auth.admins.is_empty()).then(|| {
            let history = Arc::new(OutboxHistory::new(options.history_interval));
            let (sampled, pool) = (history.clone(), reads.clone());
            tasks.spawn(move |shutdown| crate::admin::history::run(pool, sampled, shutdown));
            web::Data::new(AdminState::new(
                &config,
                (reads.clone(), topology.clone()),
                broker.clone(),
                history,
            ))
        });
        let state = AppState::new(
            &config,
            writes,
            (reads, topology.clone()),
            write_path.shards,
            broker.clone(),
            readiness,
        );
        let (server, ports) = start_http(
            &config,
            state,
            admin,
            (certificate.as_ref(), admin_certificate.as_ref()),
        )?;
        Ok(Self {
            ports,
            server,
            certificates: certificate.into_iter().chain(admin_certificate).collect(),
            config,
            broker,
            shards,
            writers: write_path.writers,
            relays,
            relay_arbiter,
            tasks,
            stop_asked: Arc::default(),
        })
    }

    /// The port of `http.listen`.
    pub fn port(&self) -> u16 {
        self.ports.listen
    }

    /// The port of `http.operations_listen`, when it is set.
    pub fn operations_port(&self) -> Option<u16> {
        self.ports.operations
    }

    /// The port of `admin.listen`, when admins are configured.
    pub fn admin_port(&self) -> Option<u16> {
        self.ports.admin
    }

    /// A handle that stops the server gracefully, which then shuts the whole daemon down.
    pub fn server_handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Serves until SIGTERM or SIGINT, then shuts down ([`run_until_stopped`](Self::run_until_stopped)).
    /// SIGHUP meanwhile reloads the HTTPS listener's certificate. Tells systemd that it is
    /// ready (and pings its watchdog), and when it stops.
    pub async fn run_until_signal(self) -> std::io::Result<()> {
        let server = self.server_handle();
        let certificates = self.certificates.clone();
        self.tasks
            .spawn(move |shutdown| reload_on_hangup(certificates, shutdown));
        systemd::ready();
        systemd::watchdog(&self.tasks);
        let stop_asked = self.stop_asked.clone();
        self.tasks.spawn(move |shutdown| async move {
            tokio::select! {
                () = wait_for_termination() => {}
                // Stopped another way (its handle): nothing left to wait for.
                () = shutdown.cancelled() => return,
            }
            let _ = stop_asked.set(Instant::now());
            tracing::info!("shutting down: finishing requests in flight");
            systemd::stopping();
            server.stop(true).await;
        });
        self.run_until_stopped().await
    }

    /// Serves until the server is stopped (by a signal, or its handle), then shuts down, in
    /// order, all within one `http.shutdown_timeout` counted from the signal: the server
    /// finishes the requests in flight (actix-web's own graceful timeout is the same); the key
    /// shards stop (nothing waits on them any more); the writers commit what they have queued;
    /// the relays finish their batches; the tasks (janitor, gauges, upkeep, watchdog, signal
    /// handlers) end; the broker connection is closed. Each step has what the steps before it
    /// left, so the whole stop stays within the bound (and systemd's `TimeoutStopSec`, which
    /// must be longer): what a step could not finish in time is what a crash would leave, and
    /// is safe to leave (an unacknowledged write, a batch published again).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let served = self.server.await;
        let began = self.stop_asked.get().copied().unwrap_or_else(Instant::now);
        let deadline = began + self.config.http.shutdown_timeout;
        let left = || deadline.saturating_duration_since(Instant::now());
        tracing::info!("http server stopped; committing queued writes");
        lifecycle::stop_all(&self.shards, left()).await;
        if !lifecycle::stop_all(&self.writers, left()).await {
            tracing::warn!("writers did not commit their queues within http.shutdown_timeout");
        }
        tracing::info!("stopping relays after their batches in flight");
        if !lifecycle::stop_all(&self.relays, left()).await {
            tracing::warn!("relays did not finish within http.shutdown_timeout");
        }
        // None holds anything that must be finished: a pass or a refresh is abandoned.
        if !self.tasks.stop(left()).await {
            tracing::warn!("tasks did not end within http.shutdown_timeout");
        }
        self.broker.close_within(left()).await;
        self.relay_arbiter.stop();
        tracing::info!(
            took = %humantime::format_duration(Duration::from_millis(began.elapsed().as_millis() as u64)),
            "stopped"
        );
        served
    }
}

fn start_relays(
    config: &Config,
    (topology, health): (&Topology, &WriteHealth),
    broker: &Arc<Broker>,
    arbiter: &actix::Arbiter,
) -> Vec<Addr<OutboxRelay>> {
    let relay_config = RelayConfig::from_config(config, (topology.clone(), health.clone()));
    (0..config.outbox.workers)
        .map(|index| {
            OutboxRelay::start(
                &arbiter.handle(),
                index,
                broker.clone(),
                relay_config.clone(),
            )
        })
        .collect()
}

/// The database's clock, read once before the first write (every batch reads it again). A
/// database that does not answer now leaves it unread: the first batch reads it.
async fn read_database_clock(db: &Database) -> DatabaseClock {
    let clock = DatabaseClock::new();
    let read = db
        .run(async |connection| Ok(clock.read(connection).await?))
        .await;
    if let Err(error) = read {
        tracing::debug!(error = %error, "database clock not read at start");
    }
    clock
}

fn start_write_path(
    config: &Config,
    topology: &Topology,
    (clock, health): (DatabaseClock, WriteHealth),
    waker: OutboxWaker,
) -> WritePath {
    let on_commit: CommitHook = Arc::new(move |group| waker.wake(group));
    let writer_config = WriterConfig {
        max_batch: config.database.max_batch,
        retention: config.idempotency.retention,
        audit: config.events.audit,
        clock,
        health: health.clone(),
    };
    let queue = WriteQueue::new(
        (config.database.writers, config.database.max_batch),
        topology.clone(),
        health.clone(),
    );
    let writers: Vec<Addr<Writer>> = (0..config.database.writers)
        .map(|_| {
            Writer::start(
                topology.clone(),
                writer_config.clone(),
                queue.clone(),
                on_commit.clone(),
            )
        })
        .collect();
    let pending = PendingBytes::new(config.database.max_pending_bytes);
    let shard_count = config.idempotency.shards;
    let shards = (0..shard_count)
        .map(|_| {
            KeyShard::start(
                queue.clone(),
                config.idempotency.cache_entries.div_ceil(shard_count),
                CACHE_BYTES / shard_count,
                pending.clone(),
                config.idempotency.wait_timeout,
            )
        })
        .collect();
    WritePath { writers, shards }
}

/// Binds `http.listen` (HTTPS with `certificate`) and `http.operations_listen` if set, and
/// starts serving; returns the server and the ports they got.
fn start_http(
    config: &Config,
    state: AppState,
    admin: Option<web::Data<AdminState>>,
    (certificate, admin_certificate): (
        Option<&Arc<ServerCertificate>>,
        Option<&Arc<ServerCertificate>>,
    ),
) -> anyhow::Result<(Server, Ports)> {
    let anonymous = state.auth.is_anonymous();
    let shared = web::Data::new(state);
    let bind = |address: std::net::SocketAddr| {
        TcpListener::bind(address)
            .map_err(|error| anyhow::anyhow!("cannot listen on {address}: {error}"))
    };
    let socket = bind(config.http.listen)?;
    let port = socket.local_addr()?.port();
    let mut listeners = vec![Listener {
        socket,
        routes: match config.http.operations_listen {
            Some(_) => Arc::new(http::api_routes),
            None => Arc::new(http::routes),
        },
        tls: certificate
            .map(|certificate| certificate.server_config())
            .transpose()?,
        hosts: None,
    }];
    let mut operations_port = None;
    if let Some(address) = config.http.operations_listen {
        let operations_socket = bind(address)?;
        operations_port = Some(operations_socket.local_addr()?.port());
        listeners.push(Listener {
            socket: operations_socket,
            routes: Arc::new(http::operations_listener_routes),
            tls: None,
            hosts: None,
        });
    }
    let mut admin_port = None;
    if let Some(admin) = admin {
        let admin_socket = bind(config.admin.listen)?;
        let local = admin_socket.local_addr()?;
        admin_port = Some(local.port());
        listeners.push(Listener {
            socket: admin_socket,
            routes: crate::admin::routes_with(admin),
            tls: admin_certificate
                .map(|certificate| certificate.server_config())
                .transpose()?,
            hosts: Some(http::host::HostPolicy::for_admin(
                local,
                &config.admin.hosts,
            )),
        });
    }
    let server = http::server::serve(listeners, shared, &config.http)?;
    if anonymous {
        tracing::warn!(
            address = %config.http.listen,
            "the api is unauthenticated: no [[auth.clients]] are configured, so every process on this machine may write as the client anonymous (requests must name a loopback host: localhost, 127.0.0.1 or [::1]); add clients with retrysafe token new unless the machine has one user"
        );
    }
    let scheme = if certificate.is_some() {
        "https"
    } else {
        "http"
    };
    tracing::info!(address = %config.http.listen.ip(), port, scheme, "listening");
    if let (Some(address), Some(operations_port)) = (config.http.operations_listen, operations_port)
    {
        tracing::info!(
            address = %address.ip(),
            port = operations_port,
            scheme = "http",
            "listening for /healthz, /readyz, /metrics and /openapi.json"
        );
    }
    if let Some(port) = admin_port {
        tracing::info!(
            address = %config.admin.listen.ip(),
            port,
            scheme = if admin_certificate.is_some() { "https" } else { "http" },
            admins = config.auth.admins.len(),
            "listening for the admin api and the console (/console)"
        );
    }
    if tokens_travel_in_clear(config) {
        tracing::warn!(
            address = %config.http.listen,
            "bearer tokens travel in clear: http.listen is not a loopback address and the listener is plain http; set http.tls_cert_file and http.tls_key_file, or put a tls-terminating proxy in front"
        );
    }
    Ok((
        server,
        Ports {
            listen: port,
            operations: operations_port,
            admin: admin_port,
        },
    ))
}

/// The ports the listeners got (port 0 in the configuration picks a free one).
#[derive(Debug, Clone, Copy)]
struct Ports {
    /// `http.listen`'s.
    listen: u16,
    /// `http.operations_listen`'s, when set.
    operations: Option<u16>,
    /// `admin.listen`'s, when admins are configured.
    admin: Option<u16>,
}

/// Whether bearer tokens reach the listener unencrypted over a network: clients are configured,
/// the address is not loopback, and the listener is plain HTTP. (A TLS-terminating proxy in
/// front may make this fine; the daemon cannot tell, so it only warns.)
fn tokens_travel_in_clear(config: &Config) -> bool {
    config.http.tls_files().is_none()
        && !config.auth.clients.is_empty()
        && !config.http.listen.ip().is_loopback()
}

async fn wait_for_termination() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot listen for SIGTERM/SIGINT; stop the daemon with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
}

/// SIGHUP reloads the HTTPS listener's certificate and key (after certbot or cert-manager
/// renewed them), until `shutdown`. Handled even without HTTPS, where it only logs: SIGHUP's
/// default action would end the process.
async fn reload_on_hangup(
    certificates: Vec<Arc<ServerCertificate>>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hangup) = signal(SignalKind::hangup()) else {
        tracing::error!(
            "cannot listen for SIGHUP; the tls certificate cannot be reloaded without a restart"
        );
        return;
    };
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            received = hangup.recv() => if received.is_none() { return },
        }
        if certificates.is_empty() {
            tracing::info!("sighup: nothing to reload (the listeners are plain http)");
        }
        // The outcome is logged by reload itself, an error included.
        for certificate in &certificates {
            let _ = certificate.reload();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClientSettings;

    #[test]
    fn tokens_travel_in_clear_only_to_a_plain_listener_off_loopback_with_clients() {
        let mut settings = crate::config::Settings::default();
        settings.auth.clients = vec![ClientSettings {
            id: "jobs".into(),
            token_sha256: "0".repeat(64),
            max_concurrent_writes: None,
            max_requests_per_second: None,
        }];
        let mut config = settings.validated().unwrap();
        assert!(!tokens_travel_in_clear(&config), "loopback");
        config.http.listen = "10.1.2.3:8080".parse().unwrap();
        assert!(tokens_travel_in_clear(&config));
        config.http.tls_cert_file = Some("/etc/retrysafe/cert.pem".into());
        config.http.tls_key_file = Some("/etc/retrysafe/key.pem".into());
        assert!(!tokens_travel_in_clear(&config), "https");
    }
}
