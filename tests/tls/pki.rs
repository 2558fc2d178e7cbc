//! A certificate authority of the test's own, and certificates it issues, written to PEM files
//! in a directory that is removed when the test ends.

use std::path::PathBuf;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    SerialNumber,
};

pub use crate::common::postgres::TestDir;

pub struct TestCa {
    certificate: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate and its key, in PEM and DER.
pub struct Issued {
    pub certificate_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

impl Issued {
    /// Writes `NAME.crt` and `NAME.key` into `dir`; returns their paths.
    pub fn write(&self, dir: &TestDir, name: &str) -> (PathBuf, PathBuf) {
        (
            dir.write(&format!("{name}.crt"), &self.certificate_pem),
            dir.write(&format!("{name}.key"), &self.key_pem),
        )
    }
}

/// What to put in a certificate.
#[derive(Default)]
pub struct Request<'a> {
    /// Subject alternative names: DNS names or IP addresses.
    pub names: &'a [&'a str],
    /// The subject's common name (PostgreSQL maps a client certificate to a role by it).
    pub common_name: Option<&'a str>,
    pub serial: u64,
    pub expired: bool,
    /// Days taken off the default expiry (4096-01-01), so that two certificates differ.
    pub days_shorter: u64,
    pub client: bool,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let certificate = params.self_signed(&key).unwrap();
        Self { certificate, key }
    }

    pub fn pem(&self) -> String {
        self.certificate.pem()
    }

    pub fn write(&self, dir: &TestDir, file: &str) -> PathBuf {
        dir.write(file, &self.pem())
    }

    pub fn issue(&self, request: Request<'_>) -> Issued {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = request.names.iter().map(|name| name.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        if let Some(common_name) = request.common_name {
            params
                .distinguished_name
                .push(DnType::CommonName, common_name);
        }
        params.serial_number = Some(SerialNumber::from(request.serial.max(1)));
        if request.expired {
            // Valid for a year from 1975 (rcgen's default start).
            params.not_after = params.not_before + Duration::from_secs(365 * 24 * 3600);
        } else {
            params.not_after -= Duration::from_secs(request.days_shorter * 24 * 3600);
        }
        if request.client {
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
        let certificate = params
            .signed_by(&key, &self.certificate, &self.key)
            .unwrap();
        Issued {
            certificate_pem: certificate.pem(),
            key_pem: key.serialize_pem(),
            der: certificate.der().to_vec(),
        }
    }
}
