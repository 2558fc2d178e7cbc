//! Layered configuration: built-in defaults, then `config.toml`, then `RETRYSAFE_<SECTION>__<KEY>`
//! environment variables. Unknown keys and invalid values are errors that name the key.
//!
//! Every key is declared once ([`keys::section!`], in [`sections`]): its type, default, bounds
//! and doc line. [`Settings::load`] reads them, and [`Settings::validated`] ([`validate`])
//! checks them and turns them into the [`Config`] the rest of the program takes
//! ([`validated`]): what is given as text parsed once (the two URLs, the log filter, where spans
//! go, a status, the tokens' digests), with the environment variables the configuration defers
//! to (`RUST_LOG`, `OTEL_EXPORTER_OTLP_*`) read once, there too.

use std::path::Path;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

mod database_url;
pub mod keys;
mod listener_host;
mod log_filter;
mod redact;
#[cfg(test)]
mod reference;
mod sections;
#[cfg(test)]
mod tests;
mod traces;
mod validate;
mod validated;
mod warnings;

pub use database_url::{DatabaseHost, DatabaseUrl, HostName, PgTls, RootCertificates, SslMode};
use keys::{Key, Section};
pub use listener_host::{host_without_port, ListenerHost};
pub use log_filter::LogFilter;
pub use redact::{redact_url, UNPARSABLE};
pub use sections::{
    AdminPrincipal, AdminSettings, AmqpSettings, AuthSettings, ClientSettings, ConnectionString,
    DatabaseSettings, EventSettings, HttpSettings, IdempotencySettings, LogFormat, LogSettings,
    OutboxSettings, TelemetrySettings, UrlList, MAX_CLIENT_LIMIT,
};
pub use traces::{TracesEndpoint, TracesUrl};
pub use validate::is_valid_client_id;
pub use validated::{
    AdminConfig, AdminListenerConfig, AmqpConfig, AuthConfig, BrokerEndpoint, ClientConfig, Config,
    DatabaseConfig, IdempotencyConfig, Limits, LogConfig, MismatchStatus, NodeAddress,
    TelemetryConfig, TokenDigest,
};
pub use warnings::{warnings, ConfigWarning};

/// Prefix of the environment variables that override configuration keys.
pub const ENV_PREFIX: &str = "RETRYSAFE_";

/// The client every request belongs to when no `[[auth.clients]]` are configured.
pub const ANONYMOUS_CLIENT: &str = "anonymous";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration file {path} does not exist")]
    MissingFile { path: String },
    #[error("invalid configuration: {0}")]
    Parse(String),
    #[error("invalid configuration: {key}: {message}")]
    Invalid { key: &'static str, message: String },
}

fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        message: message.into(),
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub http: HttpSettings,
    pub database: DatabaseSettings,
    pub amqp: AmqpSettings,
    pub idempotency: IdempotencySettings,
    pub outbox: OutboxSettings,
    pub events: EventSettings,
    pub auth: AuthSettings,
    pub admin: AdminSettings,
    pub log: LogSettings,
    pub telemetry: TelemetrySettings,
}

impl Settings {
    /// Every section, as declared, in the order the configuration reference lists them.
    pub const SECTIONS: [Section; 10] = [
        HttpSettings::SECTION,
        DatabaseSettings::SECTION,
        AmqpSettings::SECTION,
        IdempotencySettings::SECTION,
        OutboxSettings::SECTION,
        EventSettings::SECTION,
        AuthSettings::SECTION,
        AdminSettings::SECTION,
        LogSettings::SECTION,
        TelemetrySettings::SECTION,
    ];

    /// Every key of every section, as declared.
    pub fn keys() -> impl Iterator<Item = &'static Key> {
        Self::SECTIONS.iter().flat_map(|section| section.keys)
    }

    fn check_bounds(&self) -> Result<(), ConfigError> {
        self.http.check_bounds()?;
        self.database.check_bounds()?;
        self.amqp.check_bounds()?;
        self.idempotency.check_bounds()?;
        self.outbox.check_bounds()?;
        self.events.check_bounds()?;
        self.auth.check_bounds()?;
        self.admin.check_bounds()?;
        self.log.check_bounds()?;
        self.telemetry.check_bounds()
    }

    /// Loads defaults, then the file at `path` (which must exist), then the environment; the
    /// keys as given, not yet validated ([`validated`](Self::validated)).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        if !path.exists() {
            return Err(ConfigError::MissingFile {
                path: path.display().to_string(),
            });
        }
        Self::from_figment(
            Figment::from(Serialized::defaults(Settings::default()))
                .merge(Toml::file_exact(path))
                .merge(environment()),
        )
    }

    /// Defaults and environment only: what tests and embedders start from.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_figment(
            Figment::from(Serialized::defaults(Settings::default())).merge(environment()),
        )
    }

    fn from_figment(figment: Figment) -> Result<Self, ConfigError> {
        figment
            .extract()
            .map_err(|error| ConfigError::Parse(describe_figment_error(error)))
    }
}

/// `RETRYSAFE_*` variables that are not configuration keys, other than `RETRYSAFE_CONFIG`:
/// without the `__` between section and key (`RETRYSAFE_HTTP_LISTEN`), or with an empty or
/// extra part (`RETRYSAFE_HTTP____LISTEN`, `RETRYSAFE_HTTP__LISTEN__`, `RETRYSAFE___LISTEN`).
/// Most likely mistyped keys: they are ignored, and the daemon warns about each.
pub fn stray_environment() -> Vec<String> {
    let mut names: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| {
            name.starts_with(ENV_PREFIX)
                && !OTHER_VARIABLES.contains(&name.as_str())
                && !is_key_variable(name)
        })
        .collect();
    names.sort();
    names
}

/// `RETRYSAFE_*` variables that are not configuration keys and mean something: the
/// configuration file's path, and what `retrysafe send` reads.
const OTHER_VARIABLES: [&str; 4] = [
    "RETRYSAFE_CONFIG",
    "RETRYSAFE_URL",
    "RETRYSAFE_TOKEN",
    "RETRYSAFE_CA_FILE",
];

/// `RETRYSAFE_<SECTION>__<KEY>`, both parts present. Other `RETRYSAFE_*` variables (such as
/// `RETRYSAFE_CONFIG`, or `RETRYSAFE_URL` for `retrysafe send`) are not mistaken for keys.
fn is_key_variable(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
        return false;
    };
    let parts: Vec<&str> = rest.split("__").collect();
    parts.len() == 2 && parts.iter().all(|part| !part.is_empty())
}

/// What the configuration takes from the process's environment besides its `RETRYSAFE_*` keys,
/// read once, when it is validated ([`Settings::validated`]).
#[derive(Debug, Clone, Default)]
struct Environment {
    /// `RUST_LOG`, when set: it replaces `log.level`.
    rust_log: Option<String>,
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, when set and not empty.
    otlp_traces_endpoint: Option<String>,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`, when set and not empty.
    otlp_endpoint: Option<String>,
}

impl Environment {
    fn of_process() -> Result<Self, ConfigError> {
        let variable = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        let rust_log = match std::env::var("RUST_LOG") {
            Ok(filter) => Some(filter),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(invalid("RUST_LOG", "is not valid UTF-8"))
            }
        };
        Ok(Self {
            rust_log,
            otlp_traces_endpoint: variable("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            otlp_endpoint: variable("OTEL_EXPORTER_OTLP_ENDPOINT"),
        })
    }
}

fn environment() -> Env {
    Env::prefixed(ENV_PREFIX)
        .filter(|key| is_key_variable(&format!("{ENV_PREFIX}{}", key.as_str())))
        .split("__")
}

fn describe_figment_error(error: figment::Error) -> String {
    error
        .into_iter()
        .map(|error| {
            let key = error.path.join(".");
            let source = error
                .metadata
                .as_ref()
                .map(
                    |metadata| match &error.metadata.as_ref().and_then(|m| m.source.as_ref()) {
                        Some(source) => format!(" (from {} {source})", metadata.name),
                        None => format!(" (from {})", metadata.name),
                    },
                )
                .unwrap_or_default();
            if key.is_empty() {
                format!("{}{source}", error.kind)
            } else {
                format!("{key}: {}{source}", error.kind)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}
