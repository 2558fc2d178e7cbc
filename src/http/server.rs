//! The listeners: `http.listen` (the API; plain HTTP, or HTTPS with `http.tls_cert_file`) and,
//! when set, `http.operations_listen` (probes, metrics and the API description, plain HTTP).
//! Each serves an actix-web `App` through actix-http's HTTP/1 service, over actix-server.
//!
//! HTTP/1.1 only. actix-web's `HttpServer` offers HTTP/2 on an HTTPS listener (ALPN `h2`, in
//! front of `http/1.1`) whenever actix-http is built with HTTP/2, and `awc`, the client of
//! `retrysafe send`, builds it so. Served, HTTP/2 would bring the h2 0.3 crate's server to every
//! client: RUSTSEC-2026-0258 (empty DATA frames queued without bound; no 0.3 release fixes it),
//! and header limits other than HTTP/1's (300 headers were taken where HTTP/1 answers 431). So
//! the listeners are put together here as `HttpServer` does, but the TLS handshake offers
//! `http/1.1` alone ([`crate::tls::server::ServerCertificate::server_config`]) and every
//! connection goes to the HTTP/1 dispatcher; the h2 crate stays on the client side.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use actix_http::{HttpService, KeepAlive, Protocol};
use actix_service::{map_config, IntoServiceFactory, ServiceFactoryExt};
use actix_tls::accept::rustls_0_23::{Acceptor, TlsStream};
use actix_tls::accept::TlsError;
use actix_web::body::MessageBody;
use actix_web::dev::{AppConfig, Server, ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::{web, App};

use crate::config::HttpSettings;
use crate::http::host::{self, HostPolicy};
use crate::http::{observe, AppState};

/// What a listener serves: its routes, and any state of theirs beyond [`AppState`] (registered
/// with `ServiceConfig::app_data`). Given by whoever starts the listener, so that this layer
/// does not name the layers above it: `crate::http::routes`, `api_routes`,
/// `operations_listener_routes`, or the admin listener's.
pub type Routes = Arc<dyn Fn(&mut web::ServiceConfig) + Send + Sync>;

/// A bound socket and what it serves.
pub struct Listener {
    pub socket: TcpListener,
    pub routes: Routes,
    /// HTTPS: the TLS configuration, whose ALPN offers `http/1.1` alone.
    pub tls: Option<rustls::ServerConfig>,
    /// The hosts it answers, when not those [`HostPolicy::for_listener`] gives.
    pub hosts: Option<HostPolicy>,
}

/// actix-web's defaults, which `HttpServer` applied: how long an idle connection is kept, and
/// how long a closing one may take to say goodbye.
const KEEP_ALIVE: KeepAlive = KeepAlive::Timeout(Duration::from_secs(5));
const CLIENT_DISCONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Starts serving every listener; the returned server stops them all.
pub fn serve(
    listeners: Vec<Listener>,
    state: web::Data<AppState>,
    settings: &HttpSettings,
) -> std::io::Result<Server> {
    let mut builder = Server::build()
        .shutdown_timeout(settings.shutdown_timeout.as_secs())
        // Signals are handled by `run_until_signal` (serve); embedded, the owner stops the
        // server.
        .disable_signals();
    if settings.workers > 0 {
        builder = builder.workers(settings.workers);
    }
    let head_timeout = settings.head_timeout;
    for listener in listeners {
        let local = listener.socket.local_addr()?;
        let policy = listener
            .hosts
            .unwrap_or_else(|| HostPolicy::for_listener(state.auth.is_anonymous(), local.ip()));
        let routes = listener.routes;
        // Tells the connections of a worker that the server is shutting down, so that idle
        // keep-alive connections close instead of holding the shutdown to its timeout (actix-
        // http's hidden hook for it, the one `HttpServer` sets).
        let shutdown = builder.graceful_shutdown_signal();
        let name = format!("retrysafe-{local}");
        let state = state.clone();
        // The same service over a TCP stream or a TLS one: a macro, as the two are of
        // different types.
        macro_rules! http_service {
            ($secure:expr) => {{
                let shutdown = shutdown.clone();
                HttpService::build()
                    .graceful_shutdown_signal(move || {
                        let shutdown = shutdown.clone();
                        async move { shutdown.notified().await }
                    })
                    .keep_alive(KEEP_ALIVE)
                    .client_request_timeout(head_timeout)
                    .client_disconnect_timeout(CLIENT_DISCONNECT_TIMEOUT)
                    .local_addr(local)
                    .finish(map_config(
                        app(state.clone(), policy.clone(), routes.clone())
                            .into_factory()
                            .map_err(|error| error.error_response()),
                        move |_| app_config($secure, local),
                    ))
            }};
        }
        builder = match listener.tls {
            None => builder.listen(name, listener.socket, move || http_service!(false).tcp())?,
            Some(config) => {
                let acceptor = Acceptor::new(config);
                builder.listen(name, listener.socket, move || {
                    acceptor
                        .clone()
                        .map_err(TlsError::into_service_error)
                        // The handshake offered `http/1.1` alone: HTTP/1 whatever was asked.
                        .and_then(|stream: TlsStream<tokio::net::TcpStream>| async move {
                            let peer = stream.get_ref().0.peer_addr().ok();
                            Ok((stream, Protocol::Http1, peer))
                        })
                        .and_then(http_service!(true).map_err(TlsError::Service))
                })?
            }
        };
    }
    Ok(builder.run())
}

/// One listener's application: the request's observation (request id, metrics, the log line)
/// around the `Host` check around the routes, so that a refused host is counted and logged too.
fn app(
    state: web::Data<AppState>,
    policy: HostPolicy,
    routes: Routes,
) -> App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    App::new()
        .wrap(actix_web::middleware::from_fn(host::check_host))
        .wrap(actix_web::middleware::from_fn(observe::observe))
        .app_data(state)
        .app_data(policy)
        .configure(|config| routes(config))
        .default_service(web::to(crate::http::not_found))
}

/// What `HttpServer` tells an application about its listener. Built with actix-web's hidden
/// constructor, the one its own server and test server use: the public API has none for an
/// application served by other means than `HttpServer`. (Cargo.lock pins actix-web; an upgrade
/// that removes it fails to compile here.)
fn app_config(secure: bool, local: SocketAddr) -> AppConfig {
    AppConfig::__priv_test_new(secure, local.to_string(), local)
}
