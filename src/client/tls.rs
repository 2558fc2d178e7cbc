//! TLS for a daemon behind HTTPS: rustls on the ring provider, trusting the platform's roots and,
//! for a private CA, the certificates of a PEM file.

use std::path::Path;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};

use crate::client::ClientError;

/// A client configuration trusting the platform's roots (the system store, or `SSL_CERT_FILE` /
/// `SSL_CERT_DIR` when set) and every certificate in `ca_file`.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, ClientError> {
    let tls_error = |error: crate::tls::TlsError| ClientError::Tls(error.to_string());
    // An unreadable or empty platform store is not an error by itself: the CA file may be all
    // we need.
    let mut roots = crate::tls::platform_roots().unwrap_or_else(|_| RootCertStore::empty());
    if let Some(path) = ca_file {
        roots
            .roots
            .extend(crate::tls::roots_from_file(path).map_err(tls_error)?.roots);
    }
    if roots.is_empty() {
        return Err(ClientError::Tls(
            "no trusted root certificate: the platform store has none and no CA file was given"
                .into(),
        ));
    }
    let mut config =
        crate::tls::client_config(crate::tls::ServerVerification::ChainAndName(roots), None)
            .map_err(tls_error)?;
    // HTTP/1.1 only, as the daemon's own listener: offered h2, a proxy in front could pick it,
    // and the h2 0.3 crate, in the build through awc, has a flaw without a fix in 0.3
    // (RUSTSEC-2026-0258). Never offered, its code never runs (deny.toml).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
