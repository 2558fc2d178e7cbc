//! TLS for a daemon behind HTTPS: rustls on the ring provider, trusting the platform's roots and,
//! for a private CA, the certificates of a PEM file.

use std::path::Path;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::client::ClientError;

/// A client configuration trusting the platform's roots (the system store, or `SSL_CERT_FILE` /
/// `SSL_CERT_DIR` when set) and every certificate in `ca_file`.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, ClientError> {
    let mut roots = RootCertStore::empty();
    // An unreadable platform store is not an error by itself: the CA file may be all we need.
    let platform = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(platform.certs);
    if let Some(path) = ca_file {
        let tls_error = |reason: String| ClientError::Tls(format!("{}: {reason}", path.display()));
        let mut added = 0;
        for certificate in
            CertificateDer::pem_file_iter(path).map_err(|error| tls_error(error.to_string()))?
        {
            let certificate = certificate.map_err(|error| tls_error(error.to_string()))?;
            roots
                .add(certificate)
                .map_err(|error| tls_error(error.to_string()))?;
            added += 1;
        }
        if added == 0 {
            return Err(tls_error("no PEM certificate in this file".into()));
        }
    }
    if roots.is_empty() {
        let platform_errors: Vec<String> = platform.errors.iter().map(|e| e.to_string()).collect();
        return Err(ClientError::Tls(format!(
            "no trusted root certificate: the platform store has none ({}) and no CA file was given",
            platform_errors.join("; ")
        )));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| ClientError::Tls(error.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
