//! PostgreSQL over TLS: the rustls connector for the TLS parameters of `database.url` (libpq's
//! `sslmode`, `sslrootcert`, `sslcert`, `sslkey`, parsed and checked in
//! [`crate::config::DatabaseUrl`], where their meaning is described).

use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::{PgTls, RootCertificates, SslMode};
use crate::tls::{self, ServerVerification, TlsError};

/// The rustls connector for `tls`'s mode, reading the files it needs. Errors name the parameter
/// and the file.
pub fn connector(tls: &PgTls) -> Result<MakeRustlsConnect, String> {
    if tls.mode == SslMode::Disable {
        // Never used for a handshake: tokio-postgres does not ask for TLS.
        return tls::client_config(ServerVerification::None, None)
            .map(MakeRustlsConnect::new)
            .map_err(|error| error.to_string());
    }
    let roots = match (&tls.root_certificates, tls.root_certificate_file()) {
        (Some(RootCertificates::System), _) => {
            Some(tls::platform_roots().map_err(|error| format!("sslrootcert=system: {error}"))?)
        }
        (_, Some(path)) => {
            Some(tls::roots_from_file(&path).map_err(|error| format!("sslrootcert: {error}"))?)
        }
        (_, None) => None,
    };
    let verification = match (tls.mode, roots) {
        (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => {
            ServerVerification::None
        }
        (SslMode::Require | SslMode::VerifyCa, Some(roots)) => ServerVerification::Chain(roots),
        (SslMode::VerifyFull, Some(roots)) => ServerVerification::ChainAndName(roots),
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            return Err(format!(
                "sslmode={} needs the CA certificates to check the server against, and there is no ~/.postgresql/root.crt: set sslrootcert to a PEM file of them (or sslrootcert=system for the platform's roots), or use sslmode=require to skip the check",
                tls.mode.as_str()
            ))
        }
    };
    let (certificate, key) = tls.client_identity_files().unzip();
    let identity = tls::load_configured_identity(
        ("sslcert", certificate.as_deref()),
        ("sslkey", key.as_deref()),
    )
    .map_err(|error| error.to_string())?;
    tls::client_config(verification, identity.as_ref())
        .map(MakeRustlsConnect::new)
        .map_err(|error: TlsError| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DatabaseUrl;

    #[test]
    fn verify_modes_need_roots() {
        let url = DatabaseUrl::parse(
            "postgres://db/x?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        )
        .unwrap();
        let error = connector(url.tls()).err().unwrap();
        assert!(
            error.contains("sslrootcert") && error.contains("/nonexistent/ca.pem"),
            "{error}"
        );
    }
}
