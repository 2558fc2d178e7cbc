//! PostgreSQL over TLS against a cluster of the test's own: `initdb` and `pg_ctl` as the
//! `postgres` user, on a free port, `ssl = on` and a `pg_hba.conf` of `hostssl` lines only,
//! stopped and removed by a guard. The machine's own PostgreSQL is not touched.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::daemon::{free_port, serve_command, DaemonProcess};
use crate::common::passwords::{assert_no_piece_of, run_with_database_url, PASSWORDS};
use crate::common::postgres::{give_to, DataFile, PgCluster};
use crate::pki::{Issued, Request, TestCa, TestDir};

const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml");
/// Sent in every URL; trust authentication ignores it, and no message may show it.
const PASSWORD: &str = "pw-never-shown-4b1d";

/// The test's cluster: `ssl = on` with `server`'s certificate and key, `ca` as the CA of
/// client certificates, and these `pg_hba.conf` lines.
fn tls_cluster(server: &Issued, ca: &TestCa, hba: &[&str]) -> PgCluster {
    let ca_pem = ca.pem();
    PgCluster::start(
        "tls-pg",
        "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nssl_ca_file = 'root.crt'",
        hba,
        &[
            DataFile {
                name: "server.crt",
                contents: server.certificate_pem.as_bytes(),
                private: false,
            },
            DataFile {
                name: "server.key",
                contents: server.key_pem.as_bytes(),
                private: true,
            },
            DataFile {
                name: "root.crt",
                contents: ca_pem.as_bytes(),
                private: false,
            },
        ],
    )
}

/// Serves another certificate and key (PostgreSQL rereads them on reload).
fn replace_certificate(cluster: &PgCluster, server: &Issued) {
    std::fs::write(cluster.data().join("server.crt"), &server.certificate_pem).unwrap();
    std::fs::write(cluster.data().join("server.key"), &server.key_pem).unwrap();
    give_to("postgres", &cluster.data());
    cluster.psql("SELECT pg_reload_conf()");
}

/// A URL to the database `database` on `cluster` as `user`, through `host`, with `query`.
fn cluster_url(cluster: &PgCluster, user: &str, host: &str, database: &str, query: &str) -> String {
    format!(
        "postgres://{user}:{PASSWORD}@{host}:{}/{database}?{query}",
        cluster.port
    )
}

/// `retrysafe migrate` with `database.url`; its exit status and all it printed.
fn migrate(url: &str) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_retrysafe"))
        .args(["migrate", "--config", CONFIG])
        .env("RETRYSAFE_DATABASE__URL", url)
        .env("RETRYSAFE_DATABASE__CONNECT_TIMEOUT", "10s")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(!text.contains(PASSWORD), "the password is shown: {text}");
    (output.status.success(), text)
}

fn assert_migrates(url: &str) {
    let (succeeded, text) = migrate(url);
    assert!(
        succeeded && text.contains("the schema is at version"),
        "{url}: {text}"
    );
}

fn assert_refused(url: &str, reason: &str) {
    let (succeeded, text) = migrate(url);
    assert!(!succeeded, "{url} connected: {text}");
    assert!(
        text.contains(reason),
        "{url}: expected {reason:?} in: {text}"
    );
}

/// The test's PKI: a CA, a server certificate for `localhost` only, and another CA.
struct Pki {
    dir: TestDir,
    ca: TestCa,
    ca_file: PathBuf,
    other_ca_file: PathBuf,
    server: Issued,
}

fn pki() -> Pki {
    let dir = TestDir::new("tls-pg-pki");
    let ca = TestCa::new("retrysafe test CA");
    let ca_file = ca.write(&dir, "ca.pem");
    let other_ca_file = TestCa::new("another CA").write(&dir, "other-ca.pem");
    let server = ca.issue(Request {
        names: &["localhost"],
        serial: 2,
        ..Request::default()
    });
    Pki {
        dir,
        ca,
        ca_file,
        other_ca_file,
        server,
    }
}

fn path(file: &Path) -> &str {
    file.to_str().unwrap()
}

#[test]
fn each_sslmode_against_a_hostssl_only_server() {
    let pki = pki();
    let cluster = tls_cluster(
        &pki.server,
        &pki.ca,
        &["hostssl all all 127.0.0.1/32 trust"],
    );
    let ca = format!("sslrootcert={}", path(&pki.ca_file));
    let other_ca = format!("sslrootcert={}", path(&pki.other_ca_file));

    // require: encrypted, the certificate not checked (it is not valid for 127.0.0.1).
    assert_migrates(&cluster_url(
        &cluster,
        "postgres",
        "127.0.0.1",
        "modes",
        "sslmode=require",
    ));
    // verify-ca: the chain, not the name.
    assert_migrates(&cluster_url(
        &cluster,
        "postgres",
        "127.0.0.1",
        "modes",
        &format!("sslmode=verify-ca&{ca}"),
    ));
    // verify-full: the chain and the name.
    assert_migrates(&cluster_url(
        &cluster,
        "postgres",
        "localhost",
        "modes",
        &format!("sslmode=verify-full&{ca}"),
    ));
    // The default, prefer, takes TLS when the server offers it.
    assert_migrates(&cluster_url(&cluster, "postgres", "127.0.0.1", "modes", ""));

    assert_refused(
        &cluster_url(
            &cluster,
            "postgres",
            "127.0.0.1",
            "modes",
            &format!("sslmode=verify-full&{ca}"),
        ),
        "host name mismatch",
    );
    assert_refused(
        &cluster_url(
            &cluster,
            "postgres",
            "localhost",
            "modes",
            &format!("sslmode=verify-full&{other_ca}"),
        ),
        "unknown CA",
    );
    // require with a root file checks the chain (libpq's rule).
    assert_refused(
        &cluster_url(
            &cluster,
            "postgres",
            "127.0.0.1",
            "modes",
            &format!("sslmode=require&{other_ca}"),
        ),
        "unknown CA",
    );
    // Without TLS the server has no pg_hba.conf line for the connection.
    assert_refused(
        &cluster_url(
            &cluster,
            "postgres",
            "127.0.0.1",
            "modes",
            "sslmode=disable",
        ),
        "no encryption",
    );
    assert_refused(
        &cluster_url(
            &cluster,
            "postgres",
            "127.0.0.1",
            "modes",
            "sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem",
        ),
        "/nonexistent/ca.pem",
    );
    drop(pki.dir);
}

#[test]
fn an_expired_certificate_and_a_server_without_ssl_are_refused() {
    let pki = pki();
    let expired = pki.ca.issue(Request {
        names: &["localhost"],
        serial: 3,
        expired: true,
        ..Request::default()
    });
    let cluster = tls_cluster(&expired, &pki.ca, &["hostssl all all 127.0.0.1/32 trust"]);
    let ca = format!("sslrootcert={}", path(&pki.ca_file));
    assert_refused(
        &cluster_url(
            &cluster,
            "postgres",
            "localhost",
            "expired",
            &format!("sslmode=verify-full&{ca}"),
        ),
        "has expired",
    );
    // libpq's require does not look at the certificate at all.
    assert_migrates(&cluster_url(
        &cluster,
        "postgres",
        "localhost",
        "expired",
        "sslmode=require",
    ));

    cluster.psql("ALTER SYSTEM SET ssl = off");
    cluster.psql("SELECT pg_reload_conf()");
    assert_refused(
        &cluster_url(
            &cluster,
            "postgres",
            "127.0.0.1",
            "expired",
            "sslmode=require",
        ),
        "does not support SSL",
    );
    // Back on with a valid certificate: verify-full works again without a restart.
    cluster.psql("ALTER SYSTEM SET ssl = on");
    replace_certificate(&cluster, &pki.server);
    assert_migrates(&cluster_url(
        &cluster,
        "postgres",
        "localhost",
        "expired",
        &format!("sslmode=verify-full&{ca}"),
    ));
}

#[actix_web::test]
async fn the_daemon_writes_over_verify_full_and_authenticates_with_a_client_certificate() {
    let pki = pki();
    let client = pki.ca.issue(Request {
        common_name: Some("app_cert"),
        serial: 4,
        client: true,
        ..Request::default()
    });
    let (client_certificate, client_key) = client.write(&pki.dir, "client");
    let cluster = tls_cluster(
        &pki.server,
        &pki.ca,
        &[
            "hostssl all app_cert 127.0.0.1/32 cert",
            "hostssl all all 127.0.0.1/32 trust",
        ],
    );
    cluster.psql("CREATE ROLE app_cert LOGIN SUPERUSER");
    let ca = format!("sslrootcert={}", path(&pki.ca_file));
    let url = cluster_url(
        &cluster,
        "app_cert",
        "localhost",
        "daemon",
        &format!(
            "sslmode=verify-full&{ca}&sslcert={}&sslkey={}",
            path(&client_certificate),
            path(&client_key)
        ),
    );
    // Without the certificate, the cert line refuses the role.
    assert_refused(
        &cluster_url(
            &cluster,
            "app_cert",
            "localhost",
            "daemon",
            &format!("sslmode=verify-full&{ca}"),
        ),
        "certificate",
    );

    let exchange = format!("retrysafe.test.{}", uuid::Uuid::new_v4().simple());
    let _exchange = crate::common::helpers::TestExchange {
        name: exchange.clone(),
    };
    let daemon = DaemonProcess::start(&url, &exchange, &[]).await;
    let response = awc::Client::default()
        .post(format!("{}/v1/entries", daemon.address))
        .insert_header(("Idempotency-Key", "over-tls"))
        .insert_header(("Content-Type", "application/json"))
        .send_body(crate::common::helpers::entry_body(1).to_string())
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201, "{}", daemon.log_text());
    assert!(!daemon.log_text().contains(PASSWORD));

    // Read back over the same TLS settings, through the crate's own connect.
    let mut settings = retrysafe::config::Settings::default();
    settings.database.url = url.into();
    let config = settings.validated().unwrap();
    let connection = retrysafe::db::connect(&config.database).await.unwrap();
    let written: i64 = connection
        .client
        .query_one(
            "SELECT count(*) FROM entries WHERE idempotency_key = 'over-tls'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(written, 1, "the write landed");
    let row = connection
        .client
        .query_one(
            "SELECT current_user::text, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "app_cert");
    assert!(row.get::<_, bool>(1), "the connection is encrypted");
}

#[actix_web::test]
async fn serve_stops_at_start_when_the_database_certificate_is_not_trusted() {
    let pki = pki();
    let cluster = tls_cluster(
        &pki.server,
        &pki.ca,
        &["hostssl all all 127.0.0.1/32 trust"],
    );
    let url = cluster_url(
        &cluster,
        "postgres",
        "localhost",
        "serve",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            path(&pki.other_ca_file)
        ),
    );
    let log = pki.dir.path("serve.log");
    let mut child = serve_command(free_port(), &log)
        .env("RETRYSAFE_DATABASE__URL", &url)
        .spawn()
        .unwrap();
    let mut status = None;
    for _ in 0..600 {
        status = child.try_wait().unwrap();
        if status.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let Some(status) = status else {
        let _ = child.kill();
        panic!("serve kept running: {text}");
    };
    assert!(!status.success());
    assert!(text.contains("unknown CA"), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");
}

/// libpq's rule, which the daemon documents: the user info runs to the first `@`, so a password
/// may hold `?` unencoded, and the query after the host part still sets the TLS parameters. A
/// URL cut at its first `?` lost them (refused as invalid with `verify-full`, which
/// tokio-postgres does not know, or silently back to `prefer`).
#[test]
fn a_password_with_a_question_mark_keeps_the_tls_parameters_of_the_query() {
    let pki = pki();
    let cluster = tls_cluster(
        &pki.server,
        &pki.ca,
        &["hostssl all app 127.0.0.1/32 scram-sha-256"],
    );
    let password = PASSWORDS[0];
    assert!(password.contains('?'));
    cluster.psql(&format!(
        "CREATE ROLE app LOGIN SUPERUSER PASSWORD '{password}'"
    ));
    let url = |ca_file: &Path| {
        format!(
            "postgres://app:{password}@localhost:{}/questioned?sslmode=verify-full&sslrootcert={}",
            cluster.port,
            path(ca_file)
        )
    };
    let (succeeded, text) = run_with_database_url("migrate", &url(&pki.ca_file));
    assert_no_piece_of(password, &text, "migrate");
    assert!(
        succeeded && text.contains("the schema is at version"),
        "{text}"
    );
    // The certificate is checked: against another CA the server is refused.
    let (succeeded, text) = run_with_database_url("migrate", &url(&pki.other_ca_file));
    assert_no_piece_of(password, &text, "migrate");
    assert!(!succeeded && text.contains("unknown CA"), "{text}");
    drop(pki.dir);
}
