//! The daemon's HTTPS listener (`http.tls_cert_file`, `http.tls_key_file`): clients that trust
//! the test CA get answers, others do not; a certificate rotated with SIGHUP under load fails
//! no request; a broken rotation keeps the previous certificate.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use retrysafe::tls::{CertificateInfo, ServerVerification};
use rustls_pki_types::{CertificateDer, ServerName};

use crate::common::daemon::{spawn_app_with, DaemonProcess, TestDaemon};
use crate::common::helpers::{entry_body, pg_url, read_until, TestDatabase, TestExchange};
use crate::pki::{Issued, Request, TestCa, TestDir};

/// An HTTP client that trusts only the certificates of `ca_file`.
fn https_client(ca_file: &Path) -> awc::Client {
    let roots = retrysafe::tls::roots_from_file(ca_file).unwrap();
    let mut config =
        retrysafe::tls::client_config(ServerVerification::ChainAndName(roots), None).unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(config)))
        .timeout(Duration::from_secs(30))
        .finish()
}

async fn post(client: &awc::Client, address: &str, key: &str) -> Result<u16, String> {
    let mut response = client
        .post(format!("{address}/v1/entries"))
        .insert_header(("Idempotency-Key", key))
        .insert_header(("Content-Type", "application/json"))
        .send_body(entry_body(1).to_string())
        .await
        .map_err(|error| error.to_string())?;
    // The whole answer, so that a connection cut mid-body counts as a failure.
    response.body().await.map_err(|error| error.to_string())?;
    Ok(response.status().as_u16())
}

/// The certificate a new TLS connection to `port` is shown.
async fn presented_certificate(port: u16, ca_file: &Path) -> Vec<u8> {
    let roots = retrysafe::tls::roots_from_file(ca_file).unwrap();
    let config =
        retrysafe::tls::client_config(ServerVerification::ChainAndName(roots), None).unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let tls = connector
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn expiry_of(issued: &Issued) -> i64 {
    CertificateInfo::read(&CertificateDer::from(issued.der.clone()))
        .unwrap()
        .not_after_unix()
}

fn port_of(address: &str) -> u16 {
    address.rsplit(':').next().unwrap().parse().unwrap()
}

/// A daemon whose listener serves a certificate for 127.0.0.1 that the test CA issued as
/// `request` says; with the directory of the files and the CA's file.
async fn https_app(request: Request<'_>) -> (TestDir, PathBuf, TestDaemon) {
    let dir = TestDir::new("tls-https");
    let ca = TestCa::new("retrysafe test CA");
    let ca_file = ca.write(&dir, "ca.pem");
    let (certificate, key) = ca
        .issue(Request {
            names: &["127.0.0.1"],
            ..request
        })
        .write(&dir, "server");
    let app = spawn_app_with(|settings| {
        settings.http.tls_cert_file = Some(certificate);
        settings.http.tls_key_file = Some(key);
    })
    .await;
    (dir, ca_file, app)
}

#[actix_web::test]
async fn only_a_client_that_verifies_the_certificate_gets_answers() {
    let (dir, ca_file, app) = https_app(Request {
        serial: 20,
        ..Request::default()
    })
    .await;
    let other_ca_file = TestCa::new("another CA").write(&dir, "other-ca.pem");
    let port = port_of(&app.address);
    let https = format!("https://127.0.0.1:{port}");

    assert_eq!(
        post(&https_client(&ca_file), &https, "trusted").await,
        Ok(201)
    );

    let plaintext = post(
        &awc::Client::default(),
        &format!("http://127.0.0.1:{port}"),
        "plain",
    )
    .await;
    assert!(
        !matches!(plaintext, Ok(status) if (200..300).contains(&status)),
        "a plaintext request to the TLS port got {plaintext:?}"
    );
    let untrusted = post(&https_client(&other_ca_file), &https, "untrusted").await;
    assert!(
        untrusted
            .as_ref()
            .is_err_and(|error| error.contains("UnknownIssuer")),
        "{untrusted:?}"
    );
    assert_eq!(app.row_counts().await, (1, 1, 1), "only the trusted write");
}

/// A TLS connection to `port` that offers `protocols` by ALPN, trusting `ca_file`.
async fn handshake(
    port: u16,
    ca_file: &Path,
    protocols: &[&[u8]],
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let roots = retrysafe::tls::roots_from_file(ca_file).unwrap();
    let mut config =
        retrysafe::tls::client_config(ServerVerification::ChainAndName(roots), None).unwrap();
    config.alpn_protocols = protocols.iter().map(|protocol| protocol.to_vec()).collect();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .map_err(|error| error.to_string())
}

/// Writes `request` on `stream` and returns the answer's status line.
async fn status_line(
    stream: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    request: &[u8],
) -> String {
    use tokio::io::AsyncWriteExt;
    // The daemon may answer and close before it has read everything: the answer is the verdict.
    let _ = stream.write_all(request).await;
    let answer = tokio::time::timeout(Duration::from_secs(30), read_until(stream, b"\r\n"))
        .await
        .expect("the daemon answers");
    let text = String::from_utf8_lossy(&answer).into_owned();
    text.lines().next().unwrap_or_default().to_owned()
}

/// HTTP/2 stays off the HTTPS listener: actix-web's own HTTPS listener offered `h2` first
/// whenever actix-http was built with HTTP/2 (awc, the client side, builds it so), which
/// brought the h2 0.3 server (RUSTSEC-2026-0258, no 0.3 fix) to every client and took 300
/// headers where HTTP/1 answers 431.
#[actix_web::test]
async fn the_https_listener_speaks_http_1_1_only() {
    let (_dir, ca_file, app) = https_app(Request {
        serial: 22,
        ..Request::default()
    })
    .await;
    let port = port_of(&app.address);

    // Offered h2 first, as browsers and curl do: the listener picks http/1.1.
    let mut stream = handshake(port, &ca_file, &[b"h2", b"http/1.1"])
        .await
        .expect("a client offering h2 and http/1.1 connects");
    assert_eq!(
        stream.get_ref().1.alpn_protocol(),
        Some(&b"http/1.1"[..]),
        "the listener chose another protocol than http/1.1"
    );
    let many: String = (0..300).map(|i| format!("X-Header-{i}: {i}\r\n")).collect();
    let request = format!("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n{many}\r\n");
    let status = status_line(&mut stream, request.as_bytes()).await;
    assert!(
        status.starts_with("HTTP/1.1 431"),
        "300 headers: {status:?}"
    );

    // Offered h2 alone: nothing in common, the handshake fails.
    let h2_only = handshake(port, &ca_file, &[b"h2"]).await;
    assert!(
        h2_only
            .as_ref()
            .is_err_and(|error| error.contains("NoApplicationProtocol")),
        "a client offering only h2: {:?}",
        h2_only.map(|stream| stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec))
    );

    // No ALPN, and the HTTP/2 connection preface (prior knowledge): not HTTP/2.
    let mut stream = handshake(port, &ca_file, &[]).await.unwrap();
    let status = status_line(&mut stream, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    assert!(
        status.is_empty() || status.starts_with("HTTP/1.1 4"),
        "an HTTP/2 preface got {status:?}"
    );

    // The listener still serves HTTP/1.1 with ALPN.
    let mut stream = handshake(port, &ca_file, &[b"http/1.1"]).await.unwrap();
    let status = status_line(
        &mut stream,
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, "HTTP/1.1 200 OK");
}

#[actix_web::test]
async fn an_expired_listener_certificate_is_refused_by_clients() {
    let (_dir, ca_file, app) = https_app(Request {
        serial: 21,
        expired: true,
        ..Request::default()
    })
    .await;
    let https = format!("https://127.0.0.1:{}", port_of(&app.address));
    let refused = post(&https_client(&ca_file), &https, "expired").await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|error| error.contains("certificate expired")),
        "{refused:?}"
    );
    assert_eq!(app.row_counts().await, (0, 0, 0));
}

/// Waits up to 30 s for `needle` to appear `count` times in the daemon's log.
async fn wait_for_log(daemon: &DaemonProcess, needle: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while daemon.log_text().matches(needle).count() < count {
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the log: {}",
            daemon.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn expiry_metric(client: &awc::Client, address: &str) -> i64 {
    let mut response = client
        .get(format!("{address}/metrics"))
        .send()
        .await
        .unwrap();
    let text = String::from_utf8(response.body().await.unwrap().to_vec()).unwrap();
    let value = text
        .lines()
        .find_map(|line| line.strip_prefix("retrysafe_tls_certificate_expiry_timestamp_seconds "))
        .unwrap_or_else(|| panic!("no expiry metric in:\n{text}"));
    value.trim().parse::<f64>().unwrap() as i64
}

/// Replaces `path` at once, as certbot and cert-manager do: a reader never sees half a file.
fn replace_file(path: &Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(next, path).unwrap();
}

#[actix_web::test]
async fn a_certificate_rotated_by_sighup_under_load_fails_no_request() {
    let dir = TestDir::new("tls-rotate");
    let ca = TestCa::new("retrysafe test CA");
    let ca_file = ca.write(&dir, "ca.pem");
    let first = ca.issue(Request {
        names: &["127.0.0.1"],
        serial: 30,
        ..Request::default()
    });
    let second = ca.issue(Request {
        names: &["127.0.0.1"],
        serial: 31,
        days_shorter: 30,
        ..Request::default()
    });
    let (certificate_file, key_file) = first.write(&dir, "server");
    let database =
        TestDatabase::named(&format!("retrysafe_test_{}", uuid::Uuid::new_v4().simple()));
    let exchange = TestExchange {
        name: format!("retrysafe.test.{}", uuid::Uuid::new_v4().simple()),
    };
    let client = https_client(&ca_file);
    let daemon = DaemonProcess::start_with(
        &pg_url(&database.name),
        &exchange.name,
        &[
            (
                "RETRYSAFE_HTTP__TLS_CERT_FILE",
                certificate_file.display().to_string(),
            ),
            (
                "RETRYSAFE_HTTP__TLS_KEY_FILE",
                key_file.display().to_string(),
            ),
        ],
        "https",
        client.clone(),
    )
    .await;
    let port = port_of(&daemon.address);
    assert_eq!(presented_certificate(port, &ca_file).await, first.der);
    assert_eq!(
        expiry_metric(&client, &daemon.address).await,
        expiry_of(&first)
    );

    // Writers: half keep their connections, half make a new one (a new handshake) per request.
    let stop = Rc::new(AtomicBool::new(false));
    let outcomes: Rc<RefCell<Vec<Result<u16, String>>>> = Rc::default();
    let workers: Vec<_> = (0..6)
        .map(|worker| {
            let (stop, outcomes, address, ca_file) = (
                stop.clone(),
                outcomes.clone(),
                daemon.address.clone(),
                ca_file.clone(),
            );
            let shared = client.clone();
            actix_web::rt::spawn(async move {
                // Bounded in count as well as by the stop flag.
                for _ in 0..5000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let client = if worker % 2 == 0 {
                        shared.clone()
                    } else {
                        https_client(&ca_file)
                    };
                    let key = uuid::Uuid::new_v4().to_string();
                    let outcome = post(&client, &address, &key).await;
                    outcomes.borrow_mut().push(outcome);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    replace_file(&certificate_file, &second.certificate_pem);
    replace_file(&key_file, &second.key_pem);
    daemon.signal("HUP");
    wait_for_log(&daemon, "tls certificate reloaded", 1).await;
    let after_reload = outcomes.borrow().len();
    // Keep the load going on the new certificate for a while.
    let deadline = Instant::now() + Duration::from_secs(30);
    while outcomes.borrow().len() < after_reload + 100 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
    let outcomes = outcomes.take();
    let failed: Vec<_> = outcomes
        .iter()
        .filter(|outcome| **outcome != Ok(201))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}",
        failed.len(),
        outcomes.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(
        outcomes.len() > after_reload + 50,
        "the load went on after the reload: {} then {}",
        after_reload,
        outcomes.len()
    );
    eprintln!(
        "{} writes over https, {after_reload} of them before the reload, none failed",
        outcomes.len()
    );
    assert_eq!(presented_certificate(port, &ca_file).await, second.der);
    assert_eq!(
        expiry_metric(&client, &daemon.address).await,
        expiry_of(&second)
    );

    // A broken key: the reload is refused, the second certificate stays.
    replace_file(&key_file, "not a key\n");
    daemon.signal("HUP");
    wait_for_log(&daemon, "cannot reload the tls certificate", 1).await;
    let log = daemon.log_text();
    let error_line = log
        .lines()
        .find(|line| line.contains("cannot reload the tls certificate"))
        .unwrap();
    assert!(
        error_line.contains("ERROR") && error_line.contains("http.tls_key_file"),
        "{error_line}"
    );
    assert_eq!(presented_certificate(port, &ca_file).await, second.der);
    assert_eq!(
        post(&https_client(&ca_file), &daemon.address, "after-broken").await,
        Ok(201)
    );
    assert_eq!(
        expiry_metric(&client, &daemon.address).await,
        expiry_of(&second)
    );
}
