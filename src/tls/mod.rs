//! TLS on every connection the daemon makes or accepts: rustls 0.23 on the ring provider, the
//! one TLS stack of the crate (no OpenSSL, no aws-lc).
//!
//! This module holds what the three connections share: reading PEM files (certificates, private
//! keys, CA bundles) with errors that name the file, the client configurations with the server
//! verification each needs (PostgreSQL's `sslmode`s, RabbitMQ), and describing a failed
//! handshake in words an operator can act on. [`server`] is the HTTPS listener's certificate,
//! reloaded on SIGHUP.

pub mod server;

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, InconsistentKeys, RootCertStore,
    SignatureScheme,
};
use rustls_pki_types::pem::{self, PemObject};

/// Why a TLS file or configuration cannot be used. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: cannot read: {source}")]
    Unreadable {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a valid PEM file: {reason}")]
    NotPem { path: String, reason: String },
    #[error("{path}: no PEM certificate (BEGIN CERTIFICATE) in this file")]
    NoCertificate { path: String },
    #[error("{path}: no PEM private key (BEGIN PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY) in this file")]
    NoPrivateKey { path: String },
    #[error("{key}: this private key does not match the certificate in {certificate}")]
    KeyMismatch { certificate: String, key: String },
    #[error("{path}: {reason}")]
    Unusable { path: String, reason: String },
    #[error("no trusted root certificate: the platform's store has none ({0})")]
    NoPlatformRoots(String),
    #[error("cannot build the TLS configuration: {0}")]
    Config(String),
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

/// The crypto provider of every TLS configuration the crate builds.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Unreadable {
        path: display(path),
        source,
    })
}

/// Every certificate of a PEM file, in order (a server's own first, then its chain); at least
/// one.
pub fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(path)?;
    let certificates = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsError::NotPem {
            path: display(path),
            reason: error.to_string(),
        })?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate {
            path: display(path),
        });
    }
    Ok(certificates)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|error| match error {
        pem::Error::NoItemsFound => TlsError::NoPrivateKey {
            path: display(path),
        },
        other => TlsError::NotPem {
            path: display(path),
            reason: other.to_string(),
        },
    })
}

/// A certificate (with its chain) and its private key, checked to belong together.
pub struct Identity {
    pub certificates: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// The same pair, ready to sign with.
    pub certified: Arc<CertifiedKey>,
}

/// Reads a certificate file and its key file and checks that the key is the certificate's.
pub fn load_identity(certificate_file: &Path, key_file: &Path) -> Result<Identity, TlsError> {
    let certificates = load_certificates(certificate_file)?;
    let key = load_private_key(key_file)?;
    let signing_key = provider()
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|error| TlsError::Unusable {
            path: display(key_file),
            reason: format!("unusable private key: {error}"),
        })?;
    let certified = CertifiedKey::new(certificates.clone(), signing_key);
    match certified.keys_match() {
        // ring's keys all know their public key; Unknown cannot happen with them, and would
        // leave the handshake to tell.
        Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => {}
        Err(rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch)) => {
            return Err(TlsError::KeyMismatch {
                certificate: display(certificate_file),
                key: display(key_file),
            })
        }
        Err(error) => {
            return Err(TlsError::Unusable {
                path: display(certificate_file),
                reason: format!("unusable certificate: {error}"),
            })
        }
    }
    Ok(Identity {
        certificates,
        key,
        certified: Arc::new(certified),
    })
}

/// A TLS file error and the configuration key of the file at fault.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {error}")]
pub struct KeyedTlsError {
    pub key: &'static str,
    pub error: TlsError,
}

/// Reads a configured certificate and key when both are given (the configuration's validation
/// makes sure that they come together); an error names the key of the file at fault.
pub fn load_configured_identity(
    (certificate_key, certificate_file): (&'static str, Option<&Path>),
    (key_key, key_file): (&'static str, Option<&Path>),
) -> Result<Option<Identity>, KeyedTlsError> {
    let (Some(certificate_file), Some(key_file)) = (certificate_file, key_file) else {
        return Ok(None);
    };
    let keyed = |key| move |error| KeyedTlsError { key, error };
    // Each file on its own first, so that the error names the right key.
    load_certificates(certificate_file).map_err(keyed(certificate_key))?;
    load_private_key(key_file).map_err(keyed(key_key))?;
    load_identity(certificate_file, key_file)
        .map(Some)
        .map_err(|error| match &error {
            TlsError::KeyMismatch { .. } => keyed(key_key)(error),
            TlsError::Unusable { path, .. } if *path == display(key_file) => keyed(key_key)(error),
            _ => keyed(certificate_key)(error),
        })
}

/// The CA certificates of a PEM file, and only those.
pub fn roots_from_file(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in load_certificates(path)? {
        roots.add(certificate).map_err(|error| TlsError::Unusable {
            path: display(path),
            reason: format!("not a usable CA certificate: {error}"),
        })?;
    }
    Ok(roots)
}

/// The platform's trusted roots: the system store, or `SSL_CERT_FILE` / `SSL_CERT_DIR` when
/// set. An error if there are none.
pub fn platform_roots() -> Result<RootCertStore, TlsError> {
    let platform = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(platform.certs);
    if roots.is_empty() {
        let errors: Vec<String> = platform.errors.iter().map(ToString::to_string).collect();
        return Err(TlsError::NoPlatformRoots(if errors.is_empty() {
            "it is empty".into()
        } else {
            errors.join("; ")
        }));
    }
    Ok(roots)
}

/// How a client checks the server's certificate.
pub enum ServerVerification {
    /// Not at all: the connection is encrypted but the server is not authenticated (libpq's
    /// `sslmode=require` without a root certificate file, and `prefer`).
    None,
    /// The chain up to one of these roots, and the validity dates; not the host name (libpq's
    /// `verify-ca`).
    Chain(RootCertStore),
    /// The chain and the host name (libpq's `verify-full`; RabbitMQ).
    ChainAndName(RootCertStore),
}

/// A client configuration on the ring provider, verifying the server as asked and presenting
/// `identity` to a server that asks for a client certificate.
pub fn client_config(
    verification: ServerVerification,
    identity: Option<&Identity>,
) -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError::Config(error.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> = match verification {
        ServerVerification::None => Arc::new(WithoutNameCheck {
            chain: None,
            algorithms: provider.signature_verification_algorithms,
        }),
        ServerVerification::Chain(roots) => Arc::new(WithoutNameCheck {
            chain: Some(webpki_verifier(roots, &provider)?),
            algorithms: provider.signature_verification_algorithms,
        }),
        ServerVerification::ChainAndName(roots) => webpki_verifier(roots, &provider)?,
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match identity {
        Some(identity) => builder
            .with_client_auth_cert(identity.certificates.clone(), identity.key.clone_key())
            .map_err(|error| TlsError::Config(error.to_string())),
        None => Ok(builder.with_no_client_auth()),
    }
}

fn webpki_verifier(
    roots: RootCertStore,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, TlsError> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|error| TlsError::Config(error.to_string()))
}

/// rustls's check of a handshake signature of one TLS version.
type SignatureCheck = fn(
    &[u8],
    &CertificateDer<'_>,
    &DigitallySignedStruct,
    &WebPkiSupportedAlgorithms,
) -> Result<HandshakeSignatureValid, rustls::Error>;

impl WithoutNameCheck {
    /// The handshake's signature checked by `verify`, or, where nothing is verified and webpki
    /// cannot read the certificate, with its public key alone ([`Self::verify_with_public_key`]).
    fn verify_signature(
        &self,
        verify: SignatureCheck,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        match verify(message, certificate, signature, &self.algorithms) {
            Err(error) if self.chain.is_none() && is_unparsable(&error) => {
                self.verify_with_public_key(message, certificate, signature)
            }
            other => other,
        }
    }

    /// Checks the handshake's signature with the public key of `certificate` alone, for a
    /// certificate webpki will not read: an X.509 v1 certificate, which is what Citus makes for
    /// itself when it turns TLS on (`citus-auto-ssl`) and what `openssl req -x509` makes without
    /// extensions. libpq's `sslmode=require` and `prefer` accept it (OpenSSL checks the key, not
    /// the certificate's form), and so does this: without a chain to check, the certificate is
    /// only the carrier of the key the server must hold.
    fn verify_with_public_key(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        use x509_cert::der::{Decode, Encode};
        let invalid = || rustls::Error::InvalidCertificate(CertificateError::BadEncoding);
        let parsed =
            x509_cert::Certificate::from_der(certificate.as_ref()).map_err(|_| invalid())?;
        let key_info = &parsed.tbs_certificate.subject_public_key_info;
        let algorithm = key_info.algorithm.to_der().map_err(|_| invalid())?;
        let public_key = key_info.subject_public_key.raw_bytes();
        let candidates = self
            .algorithms
            .mapping
            .iter()
            .filter(|(scheme, _)| *scheme == signature.scheme)
            .flat_map(|(_, algorithms)| algorithms.iter());
        for candidate in candidates {
            // webpki's identifiers are the DER of the AlgorithmIdentifier without its SEQUENCE
            // header (a short-form length: these are a few dozen bytes).
            if algorithm.get(2..) != Some(candidate.public_key_alg_id().as_ref()) {
                continue;
            }
            return candidate
                .verify_signature(public_key, message, signature.signature())
                .map(|()| HandshakeSignatureValid::assertion())
                .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadSignature));
        }
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::NoSignatureSchemesInCommon,
        ))
    }
}

/// A certificate webpki could not read (its version, its encoding), as opposed to a signature
/// that does not verify.
fn is_unparsable(error: &rustls::Error) -> bool {
    matches!(
        error,
        rustls::Error::InvalidCertificate(CertificateError::BadEncoding)
            | rustls::Error::InvalidCertificate(CertificateError::Other(_))
    )
}

/// The weaker checks of libpq's modes. With `chain`, the full check less the host name:
/// webpki checks the chain and the dates first and the name last, so a name mismatch is
/// reported only for a certificate whose chain is valid (`verify-ca`). Without it, any
/// certificate (`require` without a root file, `prefer`). Either way the handshake's signatures
/// are checked, so the server must hold the key of the certificate it shows.
#[derive(Debug)]
struct WithoutNameCheck {
    chain: Option<Arc<WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for WithoutNameCheck {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let verify = rustls::crypto::verify_tls12_signature;
        self.verify_signature(verify, message, certificate, signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let verify = rustls::crypto::verify_tls13_signature;
        self.verify_signature(verify, message, certificate, signature)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// What a failed TLS handshake means, if `error` or one of its causes is one: the rustls error
/// is found through `io::Error`s, which hide it from `source()`.
pub fn describe_handshake_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(describe_rustls_error(tls));
        }
        let inner = error
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        if let Some(tls) = inner {
            return Some(describe_rustls_error(tls));
        }
        current = error.source();
    }
    None
}

fn describe_rustls_error(error: &rustls::Error) -> String {
    use rustls::Error;
    match error {
        Error::InvalidCertificate(certificate) => describe_certificate_error(certificate),
        Error::AlertReceived(alert) => format!(
            "the server refused the handshake (TLS alert {alert:?}); if it requires a client certificate, check the one configured"
        ),
        Error::InvalidMessage(_) | Error::InappropriateMessage { .. } => {
            format!("the server does not speak TLS on this port ({error})")
        }
        other => format!("TLS handshake failed: {other}"),
    }
}

fn describe_certificate_error(error: &CertificateError) -> String {
    match error {
        CertificateError::UnknownIssuer => {
            "the server's certificate is not trusted: unknown CA (not issued by a trusted root)"
                .into()
        }
        CertificateError::NotValidForName => {
            "host name mismatch: the server's certificate is not valid for the host connected to"
                .into()
        }
        CertificateError::NotValidForNameContext {
            expected,
            presented,
        } => format!(
            "host name mismatch: the server's certificate is not valid for {}, only for {}",
            expected.to_str(),
            if presented.is_empty() {
                "no name".into()
            } else {
                presented.join(", ")
            }
        ),
        CertificateError::Expired => "the server's certificate has expired".into(),
        CertificateError::ExpiredContext { not_after, .. } => format!(
            "the server's certificate has expired (not valid after {})",
            format_unix_time(not_after.as_secs())
        ),
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "the server's certificate is not valid yet".into()
        }
        CertificateError::Revoked => "the server's certificate is revoked".into(),
        CertificateError::Other(other)
            if matches!(
                other.0.downcast_ref::<webpki::Error>(),
                Some(webpki::Error::UnsupportedCertVersion)
            ) =>
        {
            "the server's certificate is an X.509 v1 certificate (as Citus makes for itself), which cannot be verified: give the server a certificate issued by your CA, or use sslmode=require (encrypted, not verified)".into()
        }
        other => format!("the server's certificate is refused: {other:?}"),
    }
}

fn format_unix_time(seconds: u64) -> String {
    i64::try_from(seconds)
        .ok()
        .and_then(|seconds| chrono::DateTime::from_timestamp(seconds, 0))
        .map(|time| time.to_rfc3339())
        .unwrap_or_else(|| format!("{seconds} s after the epoch"))
}

/// What an operator wants to know of a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateInfo {
    /// The subject's distinguished name (RFC 4514).
    pub subject: String,
    /// The serial number in hex.
    pub serial: String,
    pub not_after: SystemTime,
}

impl CertificateInfo {
    pub fn read(certificate: &CertificateDer<'_>) -> Result<Self, String> {
        use x509_cert::der::Decode;
        let parsed = x509_cert::Certificate::from_der(certificate.as_ref())
            .map_err(|error| format!("not an X.509 certificate: {error}"))?;
        let tbs = &parsed.tbs_certificate;
        Ok(Self {
            subject: tbs.subject.to_string(),
            serial: hex::encode(tbs.serial_number.as_bytes()),
            not_after: tbs.validity.not_after.to_system_time(),
        })
    }

    /// The expiry in seconds since the Unix epoch.
    pub fn not_after_unix(&self) -> i64 {
        match self.not_after.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
            Err(before) => -i64::try_from(before.duration().as_secs()).unwrap_or(i64::MAX),
        }
    }

    /// The expiry as an RFC 3339 time, for logs.
    pub fn not_after_text(&self) -> String {
        chrono::DateTime::<chrono::Utc>::from(self.not_after).to_rfc3339()
    }

    pub fn has_expired(&self) -> bool {
        self.not_after < SystemTime::now()
    }
}
