//! The checks the types alone do not make: [`Settings::validated`] turns the keys as given
//! into the [`Config`] the daemon runs with.

use std::collections::HashSet;
use std::path::PathBuf;

use crate::config::{
    invalid, AdminConfig, AdminListenerConfig, AmqpConfig, AuthConfig, ClientConfig, Config,
    ConfigError, DatabaseConfig, Environment, IdempotencyConfig, Limits, LogConfig, LogFilter,
    Settings, TelemetryConfig, TokenDigest, TracesEndpoint, MAX_CLIENT_LIMIT,
};

impl Settings {
    /// Checks every key ([`validated`](Self::validated)), keeping nothing of what it parsed.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validated().map(drop)
    }

    /// Checks what the types alone do not (bounds, keys that go together, an open listener's
    /// credentials) and parses what is given as text, once: the [`Config`] the daemon runs
    /// with. The environment variables the configuration defers to (`RUST_LOG`, the
    /// `OTEL_EXPORTER_OTLP_*` endpoints) are read now, once.
    pub fn validated(&self) -> Result<Config, ConfigError> {
        self.validated_in(&Environment::of_process()?)
    }

    /// [`validated`](Self::validated), with the environment given.
    pub(super) fn validated_in(&self, environment: &Environment) -> Result<Config, ConfigError> {
        self.check_bounds()?;
        // At least one write of the largest body must fit among the pending ones.
        let smallest_pending = self.http.max_body_bytes as u64 + 1024;
        if (self.database.max_pending_bytes as u64) < smallest_pending {
            return Err(invalid(
                "database.max_pending_bytes",
                format!(
                    "must be at least http.max_body_bytes + 1024 ({smallest_pending}), so that a write of the largest body fits"
                ),
            ));
        }
        let idempotency = IdempotencyConfig::parse(&self.idempotency)?;
        let sample_ratio = self.telemetry.sample_ratio;
        if !sample_ratio.is_finite() || !(0.0..=1.0).contains(&sample_ratio) {
            return Err(invalid(
                "telemetry.sample_ratio",
                "must be between 0 (no new trace exported) and 1 (every one)",
            ));
        }
        let traces = TracesEndpoint::resolve(&self.telemetry.otlp_endpoint, environment)?;
        both_or_neither(
            ("http.tls_cert_file", &self.http.tls_cert_file),
            ("http.tls_key_file", &self.http.tls_key_file),
        )?;
        if let Some(operations) = self.http.operations_listen {
            if operations == self.http.listen && operations.port() != 0 {
                return Err(invalid(
                    "http.operations_listen",
                    format!("{operations} is http.listen itself; give the operations routes an address of their own, or leave the key out to serve them on http.listen"),
                ));
            }
        }
        both_or_neither(
            ("admin.tls_cert_file", &self.admin.tls_cert_file),
            ("admin.tls_key_file", &self.admin.tls_key_file),
        )?;
        let admins = self.checked_admins()?;
        let admin = AdminListenerConfig::parse(&self.admin)?;
        both_or_neither(
            ("amqp.tls_cert_file", &self.amqp.tls_cert_file),
            ("amqp.tls_key_file", &self.amqp.tls_key_file),
        )?;
        if self.amqp.exchange.is_empty() || self.amqp.exchange.len() > 255 {
            return Err(invalid("amqp.exchange", "must be 1 to 255 characters"));
        }
        let log = self.log_config(environment)?;
        let auth = self.checked_clients(admins)?;
        Ok(Config {
            http: self.http.clone(),
            database: DatabaseConfig::parse(&self.database)?,
            amqp: AmqpConfig::parse(&self.amqp)?,
            idempotency,
            outbox: self.outbox.clone(),
            events: self.events.clone(),
            auth,
            admin,
            log,
            telemetry: TelemetryConfig {
                traces,
                sample_ratio,
            },
        })
    }

    /// `RUST_LOG` when it is set (it replaces `log.level`), else `log.level`: both checked, an
    /// error naming the one at fault.
    fn log_config(&self, environment: &Environment) -> Result<LogConfig, ConfigError> {
        let level = LogFilter::parse(&self.log.level)
            .map_err(|error| invalid("log.level", error.to_string()))?;
        let filter = match &environment.rust_log {
            Some(rust_log) => LogFilter::parse(rust_log)
                .map_err(|error| invalid("RUST_LOG", error.to_string()))?,
            None => level,
        };
        Ok(LogConfig {
            format: self.log.format,
            filter,
        })
    }

    /// The clients (their limits, ids and digests), with the daemon-wide limits, and whether
    /// the API may go without them; with `admins`, the `[auth]` the daemon runs with.
    fn checked_clients(&self, admins: Vec<AdminConfig>) -> Result<AuthConfig, ConfigError> {
        let auth = &self.auth;
        check_limits(
            "",
            Some(auth.max_concurrent_writes),
            Some(auth.max_requests_per_second),
        )?;
        let mut principals = PrincipalChecks::new(&CLIENTS);
        let mut clients = Vec::with_capacity(auth.clients.len());
        for client in &auth.clients {
            check_limits(
                &format!("client {:?}: ", client.id),
                client.max_concurrent_writes,
                client.max_requests_per_second,
            )?;
            let token_sha256 = principals.check(&client.id, &client.token_sha256)?;
            clients.push(ClientConfig {
                id: client.id.clone(),
                token_sha256,
                limits: Limits {
                    max_concurrent_writes: client
                        .max_concurrent_writes
                        .unwrap_or(auth.max_concurrent_writes),
                    max_requests_per_second: client
                        .max_requests_per_second
                        .unwrap_or(auth.max_requests_per_second),
                },
            });
        }
        if auth.clients.is_empty() && !self.http.listen.ip().is_loopback() {
            return Err(invalid(
                "auth.clients",
                format!(
                    "no clients are configured, which is allowed only on a loopback address, but http.listen is {}",
                    self.http.listen
                ),
            ));
        }
        Ok(AuthConfig {
            clients,
            admins,
            anonymous_limits: Limits {
                max_concurrent_writes: auth.max_concurrent_writes,
                max_requests_per_second: auth.max_requests_per_second,
            },
        })
    }

    /// The admins' ids and digests, and where the admin listener may listen.
    fn checked_admins(&self) -> Result<Vec<AdminConfig>, ConfigError> {
        let mut principals = PrincipalChecks::new(&ADMINS);
        let mut admins = Vec::with_capacity(self.auth.admins.len());
        for admin in &self.auth.admins {
            let token_sha256 = principals.check(&admin.id, &admin.token_sha256)?;
            if self.auth.clients.iter().any(|client| {
                client
                    .token_sha256
                    .eq_ignore_ascii_case(&admin.token_sha256)
            }) {
                return Err(invalid(
                    "auth.admins.token_sha256",
                    format!("admin {:?}: a client has the same token; give the admin a token of its own (retrysafe token new --admin NAME)", admin.id),
                ));
            }
            admins.push(AdminConfig {
                id: admin.id.clone(),
                token_sha256,
            });
        }
        let admin = &self.admin;
        let https = admin.tls_cert_file.is_some() && admin.tls_key_file.is_some();
        if !admin.listen.ip().is_loopback() && !https {
            return Err(invalid(
                "admin.listen",
                format!("{} is not a loopback address, so admin tokens and session cookies would travel in clear; set admin.tls_cert_file and admin.tls_key_file, or listen on loopback and reach it through an SSH tunnel", admin.listen),
            ));
        }
        if !self.auth.admins.is_empty() {
            let taken = [Some(self.http.listen), self.http.operations_listen];
            if admin.listen.port() != 0 && taken.contains(&Some(admin.listen)) {
                return Err(invalid(
                    "admin.listen",
                    format!("{} is already http.listen or http.operations_listen; give the admin listener an address of its own", admin.listen),
                ));
            }
        }
        Ok(admins)
    }
}

/// A client's limits within their bounds, the daemon-wide ones and a client's own alike: 0 (no
/// limit) to [`MAX_CLIENT_LIMIT`]. `whose` begins the message (`client "jobs": `).
fn check_limits(whose: &str, writes: Option<u32>, rate: Option<f64>) -> Result<(), ConfigError> {
    let message = || format!("{whose}must be between 0 (no limit) and {MAX_CLIENT_LIMIT}");
    if writes.is_some_and(|writes| writes > MAX_CLIENT_LIMIT) {
        return Err(invalid("auth.max_concurrent_writes", message()));
    }
    let most = f64::from(MAX_CLIENT_LIMIT);
    if rate.is_some_and(|rate| !rate.is_finite() || !(0.0..=most).contains(&rate)) {
        return Err(invalid("auth.max_requests_per_second", message()));
    }
    Ok(())
}

/// A table of principals, `[[auth.clients]]` or `[[auth.admins]]`: what its errors name.
struct Table {
    /// `client` or `admin`.
    kind: &'static str,
    id_key: &'static str,
    digest_key: &'static str,
}

const CLIENTS: Table = Table {
    kind: "client",
    id_key: "auth.clients.id",
    digest_key: "auth.clients.token_sha256",
};

const ADMINS: Table = Table {
    kind: "admin",
    id_key: "auth.admins.id",
    digest_key: "auth.admins.token_sha256",
};

/// The principals of one table checked so far.
struct PrincipalChecks<'a> {
    table: &'static Table,
    ids: HashSet<&'a str>,
}

impl<'a> PrincipalChecks<'a> {
    fn new(table: &'static Table) -> Self {
        Self {
            table,
            ids: HashSet::new(),
        }
    }

    /// The table's next principal: its id (its syntax, and not one of the table's before it)
    /// and its token's SHA-256 (64 hex digits), which it returns decoded.
    fn check(&mut self, id: &'a str, token_sha256: &str) -> Result<TokenDigest, ConfigError> {
        let Table {
            kind,
            id_key,
            digest_key,
        } = self.table;
        if !is_valid_client_id(id) {
            return Err(invalid(
                id_key,
                format!("{id:?} must be 1 to 64 of a-z A-Z 0-9 . _ -"),
            ));
        }
        if !self.ids.insert(id) {
            return Err(invalid(id_key, format!("{id:?} is configured twice")));
        }
        TokenDigest::of_hex(token_sha256).ok_or_else(|| {
            invalid(
                digest_key,
                format!("{kind} {id:?}: must be 64 hex digits (SHA-256 of the token)"),
            )
        })
    }
}

/// A client's or an admin's id: 1 to 64 of a-z A-Z 0-9 . _ -
pub fn is_valid_client_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A certificate and its key are given together: the error names the one missing.
fn both_or_neither(
    (certificate_key, certificate): (&'static str, &Option<PathBuf>),
    (key_key, key): (&'static str, &Option<PathBuf>),
) -> Result<(), ConfigError> {
    match (certificate, key) {
        (Some(_), None) => Err(invalid(
            key_key,
            format!("must be set when {certificate_key} is (the certificate's private key)"),
        )),
        (None, Some(_)) => Err(invalid(
            certificate_key,
            format!("must be set when {key_key} is (the key's certificate)"),
        )),
        _ => Ok(()),
    }
}
