//! libpq's TLS parameters of `database.url`, which tokio-postgres does not know: checked here,
//! applied by the daemon's own connector.
//!
//! # TLS, with libpq's meaning
//!
//! | sslmode | TLS | server certificate |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` (default) | when the server offers it, else a plain connection | not checked |
//! | `require` | always; a server without TLS is refused | not checked; with a root certificate file, checked as in `verify-ca` (libpq's rule) |
//! | `verify-ca` | always | chain up to a root of `sslrootcert`, and its dates |
//! | `verify-full` | always | as `verify-ca`, and the host name (each host's own, with several hosts) |
//!
//! `sslrootcert` is a PEM file of CA certificates, by default `~/.postgresql/root.crt` when that
//! file exists; `verify-ca` and `verify-full` need one. `sslrootcert=system` trusts the
//! platform's roots; with it `sslmode` defaults to `verify-full` and a weaker mode is an error
//! (libpq 16's rule: anyone can get a certificate from a public CA for a name they control).
//! `sslcert` and `sslkey` are the client certificate and its key (PEM), sent to a server that
//! asks for one; by default `~/.postgresql/postgresql.crt` and `.key` when both exist.
//! With `sslmode=disable` none of the files is read. `db::tls` builds the rustls connector.

use std::path::{Path, PathBuf};

/// libpq's `sslmode`, less `allow` (a plain connection first), which tokio-postgres lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self, String> {
        match value {
            "disable" => Ok(Self::Disable),
            "prefer" => Ok(Self::Prefer),
            "require" => Ok(Self::Require),
            "verify-ca" => Ok(Self::VerifyCa),
            "verify-full" => Ok(Self::VerifyFull),
            "allow" => Err("sslmode=allow is not supported; use prefer or a stronger mode".into()),
            other => Err(format!(
                "sslmode={other:?} is not one of disable, prefer, require, verify-ca, verify-full"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres is told: whether to try TLS, and whether it is required.
    pub(super) fn for_tokio_postgres(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Tokio;
        match self {
            Self::Disable => Tokio::Disable,
            Self::Prefer => Tokio::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => Tokio::Require,
        }
    }
}

/// `sslrootcert`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCertificates {
    File(PathBuf),
    /// `sslrootcert=system`: the platform's roots.
    System,
}

/// The TLS parameters of `database.url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTls {
    pub mode: SslMode,
    /// `sslrootcert` as given; `None` means libpq's default file, when it exists.
    pub root_certificates: Option<RootCertificates>,
    pub client_certificate: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

impl PgTls {
    /// Checks libpq's TLS parameters, the last value given of each (without reading any file).
    pub(super) fn from_parameters(parameters: &[(&'static str, String)]) -> Result<Self, String> {
        let mut mode = None;
        let mut root_certificates = None;
        let mut client_certificate = None;
        let mut client_key = None;
        for (name, value) in parameters {
            match *name {
                "sslmode" => mode = Some(SslMode::parse(value)?),
                "sslrootcert" if value == "system" => {
                    root_certificates = Some(RootCertificates::System)
                }
                "sslrootcert" => {
                    root_certificates = Some(RootCertificates::File(non_empty(name, value)?))
                }
                "sslcert" => client_certificate = Some(non_empty(name, value)?),
                "sslkey" => client_key = Some(non_empty(name, value)?),
                _ => unreachable!("only TLS parameters are taken out"),
            }
        }
        let mode = match (mode, &root_certificates) {
            (None, Some(RootCertificates::System)) => SslMode::VerifyFull,
            (Some(mode), Some(RootCertificates::System)) if mode != SslMode::VerifyFull => {
                return Err(format!(
                    "sslrootcert=system needs sslmode=verify-full (or no sslmode), not sslmode={}: a public CA issues certificates to anyone for a name they control, so only the host name check makes these roots meaningful",
                    mode.as_str()
                ))
            }
            (mode, _) => mode.unwrap_or(SslMode::Prefer),
        };
        if client_certificate.is_some() != client_key.is_some() {
            return Err("sslcert and sslkey go together: set both, or neither".into());
        }
        Ok(Self {
            mode,
            root_certificates,
            client_certificate,
            client_key,
        })
    }

    /// Whether the server's certificate is checked against a CA, which is what authenticates
    /// the server: `verify-ca` and `verify-full`, and `require` with a root certificate file
    /// (libpq's rule).
    pub fn checks_server_certificate(&self) -> bool {
        match self.mode {
            SslMode::VerifyCa | SslMode::VerifyFull => true,
            SslMode::Require => {
                self.root_certificates.is_some() || default_file("root.crt").is_some()
            }
            SslMode::Disable | SslMode::Prefer => false,
        }
    }

    /// The PEM file of CA certificates to check the server against: `sslrootcert`, or libpq's
    /// default `~/.postgresql/root.crt` when it exists; `None` with `sslrootcert=system`.
    pub fn root_certificate_file(&self) -> Option<PathBuf> {
        match &self.root_certificates {
            Some(RootCertificates::File(path)) => Some(path.clone()),
            Some(RootCertificates::System) => None,
            None => default_file("root.crt"),
        }
    }

    /// The client certificate and its key: `sslcert` and `sslkey`, or libpq's defaults
    /// `~/.postgresql/postgresql.crt` and `.key` when both exist.
    pub fn client_identity_files(&self) -> Option<(PathBuf, PathBuf)> {
        match (&self.client_certificate, &self.client_key) {
            (Some(certificate), Some(key)) => Some((certificate.clone(), key.clone())),
            _ => Some((
                default_file("postgresql.crt")?,
                default_file("postgresql.key")?,
            )),
        }
    }
}

fn non_empty(name: &str, value: &str) -> Result<PathBuf, String> {
    if value.is_empty() {
        return Err(format!("{name} is empty: give the path of a PEM file"));
    }
    Ok(PathBuf::from(value))
}

/// libpq's default files, under `~/.postgresql`.
fn default_file(name: &str) -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let path = Path::new(&home).join(".postgresql").join(name);
    path.is_file().then_some(path)
}
