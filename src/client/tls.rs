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
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
