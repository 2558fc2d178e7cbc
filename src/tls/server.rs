//! The HTTPS listener's certificate (`http.tls_cert_file`, `http.tls_key_file`), replaced on
//! SIGHUP without dropping a connection.
//!
//! rustls asks the configuration's certificate resolver for a certificate at every handshake.
//! The resolver here hands out the certified key it holds behind a lock; a reload reads and
//! checks the new files first and swaps the key only if they are good. Connections already
//! open keep the certificate they were made with (TLS does not present it again), new ones get
//! the new one, and no listener is closed or reopened. A reload that fails keeps the previous
//! certificate.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use crate::metric;
use crate::tls::{load_configured_identity, CertificateInfo, KeyedTlsError, TlsError};

/// The one application protocol the HTTPS listener speaks, by its ALPN name.
pub const HTTP_1_1: &[u8] = b"http/1.1";

/// The listener's certificate and key, and where they are read from.
#[derive(Debug)]
pub struct ServerCertificate {
    certificate_file: PathBuf,
    key_file: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

impl ServerCertificate {
    /// Reads and checks the files (PEM, the key matches the certificate), as
    /// [`load`](Self::load) does, without keeping them: for check-config.
    pub fn check(
        certificate_file: &Path,
        key_file: &Path,
    ) -> Result<CertificateInfo, KeyedTlsError> {
        read_pair(certificate_file, key_file).map(|(_, info)| info)
    }

    /// Reads and checks the files (PEM, the key matches the certificate).
    pub fn load(certificate_file: &Path, key_file: &Path) -> Result<Arc<Self>, KeyedTlsError> {
        let (certified, info) = read_pair(certificate_file, key_file)?;
        let loaded = Arc::new(Self {
            certificate_file: certificate_file.to_owned(),
            key_file: key_file.to_owned(),
            current: RwLock::new(certified),
        });
        loaded.report(false, &info);
        Ok(loaded)
    }

    /// Reads the files again and serves the new certificate to new connections. On failure the
    /// previous certificate stays, and the error is logged and returned.
    pub fn reload(&self) -> Result<CertificateInfo, KeyedTlsError> {
        match read_pair(&self.certificate_file, &self.key_file) {
            Ok((certified, info)) => {
                *self
                    .current
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = certified;
                self.report(true, &info);
                Ok(info)
            }
            Err(error) => {
                tracing::error!(
                    error = %error,
                    certificate_file = %self.certificate_file.display(),
                    key_file = %self.key_file.display(),
                    "cannot reload the tls certificate; still serving the previous one"
                );
                Err(error)
            }
        }
    }

    /// The certificate served now.
    pub fn info(&self) -> Result<CertificateInfo, String> {
        let current = self.current();
        let end_entity = current
            .end_entity_cert()
            .map_err(|error| error.to_string())?;
        CertificateInfo::read(end_entity)
    }

    fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn report(&self, reloaded: bool, info: &CertificateInfo) {
        metrics::gauge!(metric::TLS_CERTIFICATE_EXPIRY).set(info.not_after_unix() as f64);
        if info.has_expired() {
            // Every client that verifies the certificate refuses it: someone must replace it.
            tracing::error!(
                subject = %info.subject,
                not_after = %info.not_after_text(),
                certificate_file = %self.certificate_file.display(),
                "the tls certificate has expired; clients will refuse it"
            );
        }
        // tracing wants a literal message: one line per case.
        if reloaded {
            tracing::info!(
                subject = %info.subject,
                serial = %info.serial,
                not_after = %info.not_after_text(),
                certificate_file = %self.certificate_file.display(),
                "tls certificate reloaded"
            );
        } else {
            tracing::info!(
                subject = %info.subject,
                serial = %info.serial,
                not_after = %info.not_after_text(),
                certificate_file = %self.certificate_file.display(),
                "tls certificate loaded"
            );
        }
    }

    /// A server configuration that takes its certificate from `self` at every handshake, and
    /// whose ALPN offers `http/1.1` alone: a client that offers `h2` too gets HTTP/1.1, one that
    /// offers only `h2` fails its handshake (src/http/server.rs says why).
    pub fn server_config(self: &Arc<Self>) -> Result<ServerConfig, TlsError> {
        let mut config = ServerConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError::Config(error.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![HTTP_1_1.to_vec()];
        Ok(config)
    }
}

impl ResolvesServerCert for ServerCertificate {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn read_pair(
    certificate_file: &Path,
    key_file: &Path,
) -> Result<(Arc<CertifiedKey>, CertificateInfo), KeyedTlsError> {
    let identity = load_configured_identity(
        ("http.tls_cert_file", Some(certificate_file)),
        ("http.tls_key_file", Some(key_file)),
    )?
    .expect("both files are given");
    let info =
        CertificateInfo::read(&identity.certificates[0]).map_err(|reason| KeyedTlsError {
            key: "http.tls_cert_file",
            error: TlsError::Unusable {
                path: certificate_file.display().to_string(),
                reason,
            },
        })?;
    Ok((identity.certified, info))
}
