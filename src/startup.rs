//! Wiring: migrations, the pool, the actors, and the HTTP server.

use std::net::TcpListener;
use std::sync::Arc;

use actix::{Actor, Addr};
use actix_web::dev::Server;
use actix_web::{web, App, HttpServer};

use crate::config::Settings;
use crate::db::{self, PgPool};
use crate::http::{self, AppState};
use crate::shard::KeyShard;
use crate::writer::{Writer, WriterConfig};

/// A running daemon: its actors started and its listener bound.
pub struct Application {
    port: u16,
    server: Server,
    pool: PgPool,
    shards: Vec<Addr<KeyShard>>,
}

impl Application {
    /// Migrates the database, starts the actors and binds `http.listen` (port 0 picks a free one).
    /// Must run inside an actix system.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        db::migrate(&settings.database)
            .await
            .map_err(|error| anyhow::anyhow!("cannot prepare the database: {error}"))?;
        let pool = db::build_pool(&settings.database)?;

        let writer_config = WriterConfig {
            max_batch: settings.database.max_batch,
            retention: settings.idempotency.retention.0,
            audit: settings.events.audit,
        };
        let writers: Vec<Addr<Writer>> = (0..settings.database.writers)
            .map(|_| Writer::new(pool.clone(), writer_config.clone(), None).start())
            .collect();
        let cache_per_shard = settings
            .idempotency
            .cache_entries
            .div_ceil(settings.idempotency.shards);
        let shards: Vec<Addr<KeyShard>> = (0..settings.idempotency.shards)
            .map(|_| KeyShard::new(writers.clone(), cache_per_shard).start())
            .collect();

        let state = web::Data::new(Arc::new(AppState::new(
            &settings,
            pool.clone(),
            shards.clone(),
        )));
        let listener = TcpListener::bind(settings.http.listen).map_err(|error| {
            anyhow::anyhow!("cannot listen on {}: {error}", settings.http.listen)
        })?;
        let port = listener.local_addr()?.port();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .configure(http::routes)
                .default_service(web::to(http::not_found))
        })
        .shutdown_timeout(settings.http.shutdown_timeout.0.as_secs())
        .listen(listener)?
        .run();
        tracing::info!(address = %settings.http.listen.ip(), port, "listening");
        Ok(Self {
            port,
            server,
            pool,
            shards,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn shards(&self) -> &[Addr<KeyShard>] {
        &self.shards
    }

    /// A handle that stops the server gracefully.
    pub fn server_handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    /// Serves until the server is stopped (by SIGTERM/SIGINT, or its handle).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }
}
