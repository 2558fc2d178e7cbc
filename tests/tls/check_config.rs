//! `retrysafe check-config` reads every TLS file the configuration names, without connecting,
//! and names the key and the file of the first that cannot be used.

use std::process::Command;

use crate::pki::{Request, TestCa, TestDir};

const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml");

fn check_config(env: &[(&str, String)]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_retrysafe"))
        .args(["check-config", "--config", CONFIG])
        .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).to_string()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

fn assert_refused(env: &[(&str, String)], needles: &[&str]) {
    let (succeeded, text) = check_config(env);
    assert!(!succeeded, "{env:?} passed: {text}");
    for needle in needles {
        assert!(text.contains(needle), "{env:?}: no {needle:?} in: {text}");
    }
}

#[test]
fn every_tls_file_is_read_and_named_when_it_cannot_be_used() {
    let dir = TestDir::new("tls-check-config");
    let ca = TestCa::new("retrysafe test CA");
    let ca_file = ca.write(&dir, "ca.pem").display().to_string();
    let issue = |serial, name: &str| {
        let (certificate, key) = ca
            .issue(Request {
                names: &["localhost"],
                serial,
                ..Request::default()
            })
            .write(&dir, name);
        (certificate.display().to_string(), key.display().to_string())
    };
    let (certificate, key) = issue(40, "server");
    let (_, other_key) = issue(41, "other");
    let not_pem = dir.write("not-pem.txt", "hello\n").display().to_string();
    let a_directory = dir.0.display().to_string();
    let http = |certificate: &str, key: &str| {
        vec![
            ("RETRYSAFE_HTTP__TLS_CERT_FILE", certificate.to_owned()),
            ("RETRYSAFE_HTTP__TLS_KEY_FILE", key.to_owned()),
        ]
    };

    let mut everything = http(&certificate, &key);
    everything.extend([
        ("RETRYSAFE_AMQP__URL", "amqps://guest:guest@localhost:5671/%2f".to_owned()),
        ("RETRYSAFE_AMQP__TLS_CA_FILE", ca_file.clone()),
        ("RETRYSAFE_AMQP__TLS_CERT_FILE", certificate.clone()),
        ("RETRYSAFE_AMQP__TLS_KEY_FILE", key.clone()),
        (
            "RETRYSAFE_DATABASE__URL",
            format!("postgres://app@localhost/x?sslmode=verify-full&sslrootcert={ca_file}&sslcert={certificate}&sslkey={key}"),
        ),
    ]);
    let (succeeded, text) = check_config(&everything);
    assert!(
        succeeded && text.contains("configuration is valid"),
        "{text}"
    );

    assert_refused(
        &http("/nonexistent/server.crt", &key),
        &[
            "http.tls_cert_file",
            "/nonexistent/server.crt",
            "cannot read",
        ],
    );
    assert_refused(
        &http(&certificate, &a_directory),
        &["http.tls_key_file", &a_directory, "cannot read"],
    );
    assert_refused(
        &http(&not_pem, &key),
        &["http.tls_cert_file", &not_pem, "no PEM certificate"],
    );
    assert_refused(
        &http(&certificate, &certificate),
        &["http.tls_key_file", "no PEM private key"],
    );
    assert_refused(
        &http(&certificate, &other_key),
        &["http.tls_key_file", &other_key, "does not match"],
    );
    assert_refused(
        &[("RETRYSAFE_HTTP__TLS_CERT_FILE", certificate.clone())],
        &["http.tls_key_file", "must be set"],
    );
    assert_refused(
        &[
            ("RETRYSAFE_AMQP__URL", "amqps://localhost/%2f".to_owned()),
            ("RETRYSAFE_AMQP__TLS_CA_FILE", not_pem.clone()),
        ],
        &["amqp.tls_ca_file", &not_pem],
    );
    assert_refused(
        &[
            ("RETRYSAFE_AMQP__TLS_CERT_FILE", certificate.clone()),
            ("RETRYSAFE_AMQP__TLS_KEY_FILE", other_key.clone()),
        ],
        &["amqp.tls_key_file", "does not match"],
    );
    assert_refused(
        &[(
            "RETRYSAFE_DATABASE__URL",
            "postgres://app:hunter2@localhost/x?sslmode=verify-ca&sslrootcert=/nonexistent/root.crt".to_owned(),
        )],
        &["database.url", "sslrootcert", "/nonexistent/root.crt"],
    );
    assert_refused(
        &[(
            "RETRYSAFE_DATABASE__URL",
            "postgres://app:hunter2@localhost/x?sslmode=verify_full".to_owned(),
        )],
        &["database.url", "\"verify_full\""],
    );
    let (_, text) = check_config(&[(
        "RETRYSAFE_DATABASE__URL",
        "postgres://app:hunter2@localhost/x?sslmode=verify-ca&sslrootcert=/nonexistent/root.crt"
            .to_owned(),
    )]);
    assert!(!text.contains("hunter2"), "{text}");
}
