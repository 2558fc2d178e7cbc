//! PostgreSQL over TLS with libpq's parameters and libpq's meaning: `sslmode`, `sslrootcert`,
//! `sslcert`, `sslkey`.
//!
//! tokio-postgres knows only `sslmode=disable|prefer|require` and refuses the other three
//! parameters, so they are taken out of `database.url` (a URL or `key=value` pairs) here, before
//! the rest goes to `tokio_postgres::Config`, and turned into a rustls client configuration:
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
//! With `sslmode=disable` none of the files is read.

use std::path::{Path, PathBuf};

use tokio_postgres_rustls::MakeRustlsConnect;

use crate::tls::{self, ServerVerification, TlsError};

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
    fn for_tokio_postgres(self) -> tokio_postgres::config::SslMode {
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

/// `database.url` without its TLS parameters, for tokio-postgres, and those parameters.
#[derive(Debug)]
pub struct SplitUrl {
    pub rest: String,
    pub tls: PgTls,
}

const TLS_PARAMETERS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// Takes the TLS parameters out of `url` and checks them (without reading any file).
/// Messages never quote the URL: it may hold a password.
pub fn split(url: &str) -> Result<SplitUrl, String> {
    let (rest, parameters) = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        split_url(url)?
    } else {
        split_key_values(url)?
    };
    let mut mode = None;
    let mut root_certificates = None;
    let mut client_certificate = None;
    let mut client_key = None;
    for (name, value) in parameters {
        match name.as_str() {
            "sslmode" => mode = Some(SslMode::parse(&value)?),
            "sslrootcert" if value == "system" => {
                root_certificates = Some(RootCertificates::System)
            }
            "sslrootcert" => {
                root_certificates = Some(RootCertificates::File(non_empty(&name, value)?))
            }
            "sslcert" => client_certificate = Some(non_empty(&name, value)?),
            "sslkey" => client_key = Some(non_empty(&name, value)?),
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
    Ok(SplitUrl {
        rest,
        tls: PgTls {
            mode,
            root_certificates,
            client_certificate,
            client_key,
        },
    })
}

fn non_empty(name: &str, value: String) -> Result<PathBuf, String> {
    if value.is_empty() {
        return Err(format!("{name} is empty: give the path of a PEM file"));
    }
    Ok(PathBuf::from(value))
}

/// `postgres://...?a=b&sslmode=...`: the query's TLS parameters out, the rest left as written.
fn split_url(url: &str) -> Result<(String, Vec<(String, String)>), String> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), Vec::new()));
    };
    let mut kept = Vec::new();
    let mut taken = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = percent_decode(name)?;
        if TLS_PARAMETERS.contains(&name.as_str()) {
            taken.push((name, percent_decode(value)?));
        } else {
            kept.push(pair);
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, taken))
}

fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = text
                .get(index + 1..index + 3)
                .and_then(|digits| u8::from_str_radix(digits, 16).ok())
                .ok_or("a bad percent-encoding in the URL's query")?;
            decoded.push(hex);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).map_err(|_| "the URL's query is not UTF-8 once decoded".into())
}

/// `host=... sslmode=...`: libpq's `keyword = value` pairs, a value quoted with `'...'` or bare,
/// `\` escaping the next character in both. The rest is written back with every value quoted.
fn split_key_values(text: &str) -> Result<(String, Vec<(String, String)>), String> {
    let mut characters = text.chars().peekable();
    let mut kept = Vec::new();
    let mut taken = Vec::new();
    loop {
        while characters.next_if(|c| c.is_whitespace()).is_some() {}
        if characters.peek().is_none() {
            break;
        }
        let mut name = String::new();
        while let Some(c) = characters.next_if(|c| *c != '=' && !c.is_whitespace()) {
            name.push(c);
        }
        while characters.next_if(|c| c.is_whitespace()).is_some() {}
        if characters.next() != Some('=') {
            return Err(format!("{name:?} has no value (keyword=value)"));
        }
        while characters.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if characters.next_if_eq(&'\'').is_some() {
            loop {
                match characters.next() {
                    Some('\'') => break,
                    Some('\\') => value.extend(characters.next()),
                    Some(c) => value.push(c),
                    None => return Err(format!("the value of {name:?} has no closing quote")),
                }
            }
        } else {
            while let Some(c) = characters.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(characters.next());
                } else {
                    value.push(c);
                }
            }
        }
        if TLS_PARAMETERS.contains(&name.as_str()) {
            taken.push((name, value));
        } else {
            let quoted = value.replace('\\', "\\\\").replace('\'', "\\'");
            kept.push(format!("{name}='{quoted}'"));
        }
    }
    Ok((kept.join(" "), taken))
}

/// libpq's default files, under `~/.postgresql`.
fn default_file(name: &str) -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let path = Path::new(&home).join(".postgresql").join(name);
    path.is_file().then_some(path)
}

impl PgTls {
    /// Whether the server's certificate is checked against a CA, which is what authenticates
    /// the server: `verify-ca` and `verify-full`, and `require` with a root certificate file
    /// (libpq's rule, as in [`connector`](Self::connector)).
    pub fn checks_server_certificate(&self) -> bool {
        match self.mode {
            SslMode::VerifyCa | SslMode::VerifyFull => true,
            SslMode::Require => match &self.root_certificates {
                Some(_) => true,
                None => default_file("root.crt").is_some(),
            },
            SslMode::Disable | SslMode::Prefer => false,
        }
    }

    /// tokio-postgres's mode: the verification itself is in the rustls configuration.
    pub fn tokio_ssl_mode(&self) -> tokio_postgres::config::SslMode {
        self.mode.for_tokio_postgres()
    }

    /// The rustls connector for this mode, reading the files it needs. Errors name the
    /// parameter and the file.
    pub fn connector(&self) -> Result<MakeRustlsConnect, String> {
        if self.mode == SslMode::Disable {
            // Never used for a handshake: tokio-postgres does not ask for TLS.
            return tls::client_config(ServerVerification::None, None)
                .map(MakeRustlsConnect::new)
                .map_err(|error| error.to_string());
        }
        let root_file = match &self.root_certificates {
            Some(RootCertificates::File(path)) => Some(path.clone()),
            Some(RootCertificates::System) => None,
            None => default_file("root.crt"),
        };
        let roots = match (&self.root_certificates, &root_file) {
            (Some(RootCertificates::System), _) => Some(
                tls::platform_roots().map_err(|error| format!("sslrootcert=system: {error}"))?,
            ),
            (_, Some(path)) => {
                Some(tls::roots_from_file(path).map_err(|error| format!("sslrootcert: {error}"))?)
            }
            (_, None) => None,
        };
        let verification = match (self.mode, roots) {
            (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => {
                ServerVerification::None
            }
            (SslMode::Require | SslMode::VerifyCa, Some(roots)) => ServerVerification::Chain(roots),
            (SslMode::VerifyFull, Some(roots)) => ServerVerification::ChainAndName(roots),
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
                return Err(format!(
                    "sslmode={} needs the CA certificates to check the server against, and there is no ~/.postgresql/root.crt: set sslrootcert to a PEM file of them (or sslrootcert=system for the platform's roots), or use sslmode=require to skip the check",
                    self.mode.as_str()
                ))
            }
        };
        let (certificate, key) = match (&self.client_certificate, &self.client_key) {
            (Some(certificate), Some(key)) => (Some(certificate.clone()), Some(key.clone())),
            _ => match (
                default_file("postgresql.crt"),
                default_file("postgresql.key"),
            ) {
                (Some(certificate), Some(key)) => (Some(certificate), Some(key)),
                _ => (None, None),
            },
        };
        let identity = tls::load_configured_identity(
            ("sslcert", certificate.as_deref()),
            ("sslkey", key.as_deref()),
        )
        .map_err(|error| error.to_string())?;
        tls::client_config(verification, identity.as_ref())
            .map(MakeRustlsConnect::new)
            .map_err(|error: TlsError| error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_tls_parameters_out_of_a_url() {
        let parsed = split(
            "postgres://app:pw@db1:5432,db2:5432/x?sslmode=verify-full&target_session_attrs=read-write&sslrootcert=%2Fetc%2Fca.pem&sslcert=/c.pem&sslkey=/k.pem",
        )
        .unwrap();
        assert_eq!(
            parsed.rest,
            "postgres://app:pw@db1:5432,db2:5432/x?target_session_attrs=read-write"
        );
        assert_eq!(
            parsed.tls,
            PgTls {
                mode: SslMode::VerifyFull,
                root_certificates: Some(RootCertificates::File("/etc/ca.pem".into())),
                client_certificate: Some("/c.pem".into()),
                client_key: Some("/k.pem".into()),
            }
        );
        let plain = split("postgres://app@db/x").unwrap();
        assert_eq!(plain.rest, "postgres://app@db/x");
        assert_eq!(plain.tls.mode, SslMode::Prefer);
        assert_eq!(
            split("postgres://app@db/x?sslmode=require").unwrap().rest,
            "postgres://app@db/x"
        );
    }

    #[test]
    fn takes_the_tls_parameters_out_of_key_values() {
        let parsed = split(
            r"host=db port=5433 sslmode = verify-ca sslrootcert='/etc/my ca.pem' password='it\'s' user=app",
        )
        .unwrap();
        assert_eq!(
            parsed.rest,
            r"host='db' port='5433' password='it\'s' user='app'"
        );
        assert_eq!(parsed.tls.mode, SslMode::VerifyCa);
        assert_eq!(
            parsed.tls.root_certificates,
            Some(RootCertificates::File("/etc/my ca.pem".into()))
        );
        let config: tokio_postgres::Config = parsed.rest.parse().unwrap();
        assert_eq!(config.get_password(), Some(&b"it's"[..]));
        assert_eq!(config.get_ports(), [5433]);
    }

    #[test]
    fn names_an_unknown_sslmode_and_never_quotes_the_url() {
        let error = split("postgres://app:hunter2@db/x?sslmode=verify_full").unwrap_err();
        assert!(error.contains("\"verify_full\""), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
        let error = split("host=db password=hunter2 sslmode=allow").unwrap_err();
        assert!(error.contains("sslmode=allow"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn system_roots_mean_verify_full() {
        let parsed = split("postgres://db/x?sslrootcert=system").unwrap();
        assert_eq!(parsed.tls.mode, SslMode::VerifyFull);
        assert_eq!(parsed.tls.root_certificates, Some(RootCertificates::System));
        let error = split("postgres://db/x?sslrootcert=system&sslmode=verify-ca").unwrap_err();
        assert!(error.contains("verify-full"), "{error}");
    }

    #[test]
    fn a_client_certificate_needs_its_key() {
        let error = split("postgres://db/x?sslcert=/c.pem").unwrap_err();
        assert!(error.contains("sslcert and sslkey"), "{error}");
    }

    #[test]
    fn verify_modes_need_roots() {
        let parsed =
            split("postgres://db/x?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem").unwrap();
        let error = parsed.tls.connector().err().unwrap();
        assert!(
            error.contains("sslrootcert") && error.contains("/nonexistent/ca.pem"),
            "{error}"
        );
    }
}
