//! Wiring: migrations, the pool, the actors, and the HTTP server; and the shutdown protocol.

use std::net::TcpListener;
use std::sync::Arc;

use actix::{Actor, Addr};
use actix_web::dev::Server;
use actix_web::{web, App, HttpServer};
use tokio::sync::{mpsc, watch};

use crate::config::Settings;
use crate::db;
use crate::http::{self, AppState};
use crate::janitor::Janitor;
use crate::outbox::{Broker, OutboxRelay, OutboxWaker, RelayConfig};
use crate::shard::{KeyShard, ShardHandle};
use crate::tls::server::ServerCertificate;
use crate::writer::{CommitHook, Writer, WriterConfig};

/// Memory the replay caches may hold in all, whatever `idempotency.cache_entries` says.
const CACHE_BYTES: usize = 64 * 1024 * 1024;

/// What an embedded daemon runs.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Start the outbox relays. Without them events stay in the outbox until something else
    /// publishes them (another daemon, or [`crate::outbox::relay_until_empty`] in a test).
    pub relays: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self { relays: true }
    }
}

/// A running daemon: its actors started and its listener bound.
pub struct Application {
    port: u16,
    server: Server,
    /// The HTTPS listener's certificate, which SIGHUP reloads; `None` for plain HTTP.
    certificate: Option<Arc<ServerCertificate>>,
    broker: Arc<Broker>,
    settings: Settings,
    /// Tells relays to stop after their current batch.
    shutdown: watch::Sender<bool>,
    /// Each relay holds a sender; when all are dropped, every relay has finished.
    relays_done: mpsc::Receiver<()>,
    /// The relays' thread.
    relay_arbiter: actix::Arbiter,
}

impl Application {
    /// Migrates the database, starts the actors and binds `http.listen` (port 0 picks a free one).
    /// Must run inside an actix system.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        Self::build_with(settings, Options::default()).await
    }

    /// [`build`](Self::build), with parts left out as `options` say.
    pub async fn build_with(settings: Settings, options: Options) -> anyhow::Result<Self> {
        crate::telemetry::metrics_handle();
        crate::telemetry::spawn_metrics_upkeep();
        // Read before anything else: a certificate that cannot be used stops the start at once.
        let certificate = match settings.http.tls_files() {
            Some((certificate_file, key_file)) => Some(
                ServerCertificate::load(certificate_file, key_file)
                    .map_err(|error| anyhow::anyhow!("invalid configuration: {error}"))?,
            ),
            None => None,
        };
        db::migrate(&settings.database)
            .await
            .map_err(|error| anyhow::anyhow!("cannot prepare the database: {error}"))?;
        let (db, reads) = db::Database::split(&settings.database)?;
        let broker = Arc::new(Broker::new(
            &settings.amqp,
            settings.outbox.confirm_timeout.0,
        )?);

        let waker = OutboxWaker::new(settings.outbox.workers);
        let (shutdown, shutdown_signal) = watch::channel(false);
        let (relay_token, relays_done) = mpsc::channel::<()>(1);
        let relay_config = RelayConfig::from_settings(&settings);
        // Relays run on a thread of their own: publishing a large batch is a burst of work that
        // must not delay the shards and writers on the request path.
        let relay_arbiter = actix::Arbiter::new();
        let relays = if options.relays {
            settings.outbox.workers
        } else {
            0
        };
        for index in 0..relays {
            let relay = OutboxRelay {
                index,
                db: db.clone(),
                broker: broker.clone(),
                config: relay_config.clone(),
                wake: waker.notifier(index),
                shutdown: shutdown_signal.clone(),
                done: relay_token.clone(),
            };
            OutboxRelay::start_in_arbiter(&relay_arbiter.handle(), move |_| relay);
        }
        drop(relay_token);

        let commit_hook: CommitHook = {
            let waker = waker.clone();
            Arc::new(move || waker.wake())
        };
        let writer_config = WriterConfig {
            max_batch: settings.database.max_batch,
            retention: settings.idempotency.retention.0,
            audit: settings.events.audit,
        };
        let writers: Vec<Addr<Writer>> = (0..settings.database.writers)
            .map(|_| {
                Writer::new(db.clone(), writer_config.clone(), Some(commit_hook.clone())).start()
            })
            .collect();
        let cache_per_shard = settings
            .idempotency
            .cache_entries
            .div_ceil(settings.idempotency.shards);
        let shards: Vec<ShardHandle> = (0..settings.idempotency.shards)
            .map(|_| {
                KeyShard::spawn(
                    writers.clone(),
                    cache_per_shard,
                    CACHE_BYTES / settings.idempotency.shards,
                )
            })
            .collect();
        Janitor::new(db.clone(), settings.outbox.retention.0).start();
        // A readiness check is bounded like a connection attempt plus a second: a probe must
        // answer quickly, and the check is one small query.
        let readiness = Arc::new(http::health::ReadinessMonitor::new(
            reads.clone(),
            settings.database.connect_timeout.0 + std::time::Duration::from_secs(1),
        ));
        http::observe::spawn_outbox_gauges(reads.clone(), readiness.clone());

        let state = web::Data::new(Arc::new(AppState::new(
            &settings,
            db.clone(),
            reads,
            shards.clone(),
            broker.clone(),
            readiness,
        )));
        let listener = TcpListener::bind(settings.http.listen).map_err(|error| {
            anyhow::anyhow!("cannot listen on {}: {error}", settings.http.listen)
        })?;
        let port = listener.local_addr()?.port();
        let server = HttpServer::new(move || {
            App::new()
                .wrap(actix_web::middleware::from_fn(http::observe::observe))
                .app_data(state.clone())
                .configure(http::routes)
                .default_service(web::to(http::not_found))
        })
        .client_request_timeout(settings.http.head_timeout.0)
        .shutdown_timeout(settings.http.shutdown_timeout.0.as_secs())
        // The process's signal handling (serve) stops the server; embedded, its owner does.
        .disable_signals();
        let server = match &certificate {
            Some(certificate) => {
                server.listen_rustls_0_23(listener, certificate.server_config()?)?
            }
            None => server.listen(listener)?,
        }
        .run();
        let scheme = if certificate.is_some() {
            "https"
        } else {
            "http"
        };
        tracing::info!(address = %settings.http.listen.ip(), port, scheme, "listening");
        if tokens_travel_in_clear(&settings) {
            tracing::warn!(
                address = %settings.http.listen,
                "bearer tokens travel in clear: http.listen is not a loopback address and the listener is plain http; set http.tls_cert_file and http.tls_key_file, or put a tls-terminating proxy in front"
            );
        }
        Ok(Self {
            port,
            server,
            certificate,
            broker,
            settings,
            shutdown,
            relays_done,
            relay_arbiter,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The HTTPS listener's certificate, to reload (SIGHUP); `None` for plain HTTP.
    pub fn certificate(&self) -> Option<Arc<ServerCertificate>> {
        self.certificate.clone()
    }

    /// A handle that stops the server gracefully.
    pub fn server_handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    /// Serves until the server is stopped (by SIGTERM/SIGINT, or its handle), then shuts down:
    /// the server has finished the requests in flight (and so their writes); relays finish their
    /// batch; the broker connection is closed.
    pub async fn run_until_stopped(mut self) -> std::io::Result<()> {
        let served = self.server.await;
        tracing::info!("http server stopped; stopping relays");
        // Relays that already stopped dropped their receivers; nothing else can fail here.
        let _ = self.shutdown.send(true);
        let relays = tokio::time::timeout(
            self.settings.http.shutdown_timeout.0,
            self.relays_done.recv(),
        )
        .await;
        if relays.is_err() {
            tracing::warn!("relays did not finish within http.shutdown_timeout");
        }
        self.broker.close().await;
        self.relay_arbiter.stop();
        served
    }
}

/// Whether bearer tokens reach the listener unencrypted over a network: clients are configured,
/// the address is not loopback, and the listener is plain HTTP. (A TLS-terminating proxy in
/// front may make this fine; the daemon cannot tell, so it only warns.)
fn tokens_travel_in_clear(settings: &Settings) -> bool {
    settings.http.tls_files().is_none()
        && !settings.auth.clients.is_empty()
        && !settings.http.listen.ip().is_loopback()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClientSettings;

    #[test]
    fn tokens_travel_in_clear_only_to_a_plain_listener_off_loopback_with_clients() {
        let mut settings = Settings::default();
        settings.auth.clients = vec![ClientSettings {
            id: "jobs".into(),
            token_sha256: "0".repeat(64),
        }];
        assert!(!tokens_travel_in_clear(&settings), "loopback");
        settings.http.listen = "10.1.2.3:8080".parse().unwrap();
        assert!(tokens_travel_in_clear(&settings));
        settings.http.tls_cert_file = Some("/etc/retrysafe/cert.pem".into());
        settings.http.tls_key_file = Some("/etc/retrysafe/key.pem".into());
        assert!(!tokens_travel_in_clear(&settings), "https");
    }
}
