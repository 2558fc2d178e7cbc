//! amqps:// against a RabbitMQ node of the test's own with a TLS listener that requires a client
//! certificate (`scripts/ha-lab start DIR rabbit-tls`, beside the machine's broker).

use std::path::{Path, PathBuf};
use std::time::Duration;

use retrysafe::config::{AmqpConfig, Settings, UrlList};

use crate::common::consumer::TestConsumer;
use crate::common::daemon::DaemonProcess;
use crate::common::helpers::{entry_body, pg_url, TestDatabase};
use crate::common::lab::Lab;
use crate::pki::{Request, TestCa, TestDir};

/// `[amqp]` with the one broker `url`, as the daemon would validate it.
fn amqp(url: &str, ca_file: &Path, client: Option<&(PathBuf, PathBuf)>) -> AmqpConfig {
    let mut settings = Settings::default();
    settings.amqp.url = UrlList::one(url);
    settings.amqp.tls_ca_file = Some(ca_file.to_owned());
    settings.amqp.tls_cert_file = client.map(|(certificate, _)| certificate.clone());
    settings.amqp.tls_key_file = client.map(|(_, key)| key.clone());
    settings
        .validated()
        .expect("the test's [amqp] is valid")
        .amqp
}

async fn refusal(amqp: &AmqpConfig) -> String {
    let broker = &amqp.brokers[0];
    let attempt = tokio::time::timeout(
        Duration::from_secs(30),
        retrysafe::outbox::broker::connect(broker, amqp),
    )
    .await
    .expect("the broker answers within 30 s");
    match attempt {
        Ok(_) => panic!("{broker:?} connected"),
        Err(error) => error.to_string(),
    }
}

#[actix_web::test]
async fn amqps_delivers_events_with_the_right_ca_and_client_certificate_and_refuses_the_rest() {
    let dir = TestDir::new("tls-rabbit");
    let ca = TestCa::new("retrysafe test CA");
    let ca_file = ca.write(&dir, "ca.pem");
    let other_ca_file = TestCa::new("another CA").write(&dir, "other-ca.pem");
    let (server_certificate, server_key) = ca
        .issue(Request {
            names: &["localhost"],
            serial: 10,
            ..Request::default()
        })
        .write(&dir, "server");
    let client = ca
        .issue(Request {
            common_name: Some("retrysafe"),
            serial: 11,
            client: true,
            ..Request::default()
        })
        .write(&dir, "client");
    let lab = Lab::start_with(
        "rabbit-tls",
        &[
            ("HA_LAB_TLS_CA", ca_file.to_str().unwrap()),
            ("HA_LAB_TLS_CERT", server_certificate.to_str().unwrap()),
            ("HA_LAB_TLS_KEY", server_key.to_str().unwrap()),
            ("HA_LAB_TLS_CLIENT_CERT", "required"),
        ],
    );
    let tls_port = lab.var("HA_AMQPS_PORT").to_owned();
    let by_name = format!("amqps://guest:guest@localhost:{tls_port}/%2f");
    let by_address = format!("amqps://guest:guest@127.0.0.1:{tls_port}/%2f");

    let wrong_ca = refusal(&amqp(&by_name, &other_ca_file, Some(&client))).await;
    assert!(wrong_ca.contains("unknown CA"), "{wrong_ca}");
    let wrong_name = refusal(&amqp(&by_address, &ca_file, Some(&client))).await;
    assert!(wrong_name.contains("host name mismatch"), "{wrong_name}");
    // With TLS 1.3 the client finishes its side of the handshake before the broker checks for
    // a certificate, so the refusal may arrive as an alert or as a reset connection.
    let no_client_certificate = refusal(&amqp(&by_name, &ca_file, None)).await;
    assert!(
        no_client_certificate.contains("cannot connect to the broker"),
        "{no_client_certificate}"
    );
    assert!(!wrong_ca.contains("guest:guest"), "{wrong_ca}");

    // A consumer on the node's plain listener; the daemon publishes through amqps://.
    let exchange = format!("retrysafe.test.{}", uuid::Uuid::new_v4().simple());
    let plain = format!(
        "amqp://guest:guest@127.0.0.1:{}/%2f",
        lab.var("HA_AMQP_PORT1")
    );
    let mut consumer = TestConsumer::bind_at(&plain, &exchange, "#").await;

    let database =
        TestDatabase::named(&format!("retrysafe_test_{}", uuid::Uuid::new_v4().simple()));
    let daemon = DaemonProcess::start(
        &pg_url(&database.name),
        &exchange,
        &[
            ("RETRYSAFE_AMQP__URL", by_name.clone()),
            ("RETRYSAFE_AMQP__TLS_CA_FILE", ca_file.display().to_string()),
            (
                "RETRYSAFE_AMQP__TLS_CERT_FILE",
                client.0.display().to_string(),
            ),
            (
                "RETRYSAFE_AMQP__TLS_KEY_FILE",
                client.1.display().to_string(),
            ),
        ],
    )
    .await;
    let response = awc::Client::default()
        .post(format!("{}/v1/entries", daemon.address))
        .insert_header(("Idempotency-Key", "amqps"))
        .insert_header(("Content-Type", "application/json"))
        .send_body(entry_body(7).to_string())
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    let delivery = consumer
        .next(Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("no event within 30 s: {}", daemon.log_text()));
    assert_eq!(delivery.routing_key.as_str(), "entry.created");
    let log = daemon.log_text();
    assert!(
        log.contains("connected to the broker") && log.contains("amqps://guest:***@localhost"),
        "{log}"
    );
}
