//! Hostile connections against the real binary: slowloris, oversized headers and a flood of
//! idle connections. The daemon must refuse or drop them, and keep answering normal requests
//! meanwhile. Everything stays on 127.0.0.1 and every loop is bounded in count and time.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::daemon::{spawn_binary, TestDaemon};
use crate::common::helpers::{
    entry_body, http_client, knob, post_bounded, post_raw, read_until, test_settings,
};

/// Bound on everything the attack waits for: past it, the daemon is hanging.
const HANG_GUARD: Duration = Duration::from_secs(30);

async fn start_daemon() -> TestDaemon {
    start_daemon_with(&[]).await
}

async fn start_daemon_with(env: &[(&str, String)]) -> TestDaemon {
    spawn_binary(test_settings(), env).await
}

fn host_port(daemon: &TestDaemon) -> String {
    daemon.address.trim_start_matches("http://").to_owned()
}

/// Sends `head` (and a small body) on a fresh connection and returns the status code the
/// daemon answers with, or None if it closed the connection without an answer.
async fn raw_exchange(address: &str, head: &[u8]) -> Option<u16> {
    let exchange = async {
        let mut stream = TcpStream::connect(address).await.unwrap();
        // The daemon may answer and close before it has read everything: a failed write is
        // not the verdict, the answer is.
        let _ = stream.write_all(head).await;
        let _ = stream.write_all(b"{}").await;
        let answer = read_until(&mut stream, b"\r\n\r\n").await;
        let text = String::from_utf8_lossy(&answer);
        text.strip_prefix("HTTP/1.1 ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
    };
    tokio::time::timeout(HANG_GUARD, exchange)
        .await
        .expect("the daemon answers or closes an oversized request instead of hanging")
}

fn request_head(extra_headers: &str) -> Vec<u8> {
    format!(
        "POST /v1/entries HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: oversized\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\n{extra_headers}\r\n"
    )
    .into_bytes()
}

#[actix_web::test]
async fn oversized_headers_are_refused_without_a_hang_or_a_write() {
    let mut daemon = start_daemon().await;
    let address = host_port(&daemon);
    let big = "a".repeat(64 * 1024);
    let many: String = (0..1000)
        .map(|i| format!("X-Header-{i}: {i}\r\n"))
        .collect();
    let cases = [
        (
            "one 64 KiB header",
            request_head(&format!("X-Big: {big}\r\n")),
        ),
        (
            "a 64 KiB Idempotency-Key",
            request_head(&format!("Idempotency-Key: {big}\r\n")),
        ),
        ("1000 headers", request_head(&many)),
        (
            "a 64 KiB request line",
            format!("GET /{big} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").into_bytes(),
        ),
    ];
    for (what, head) in cases {
        let status = raw_exchange(&address, &head).await;
        assert!(
            matches!(status, Some(400 | 414 | 431) | None),
            "{what}: answered {status:?}"
        );
        eprintln!("hostile: {what} -> {status:?}");
    }
    assert!(
        daemon.is_running(),
        "the daemon survived: {}",
        daemon.log_text()
    );
    post_bounded(
        &daemon.address,
        "after-oversized",
        &entry_body(1).to_string(),
        HANG_GUARD,
    )
    .await
    .assert_created();
    assert_eq!(
        daemon
            .count("SELECT count(*) FROM idempotency_records")
            .await,
        1,
        "only the normal request wrote"
    );
}

#[actix_web::test]
async fn slowloris_and_an_idle_flood_do_not_stop_normal_requests() {
    let slow_count = knob("RETRYSAFE_FAULT_SLOWLORIS", 200);
    let idle_count = knob("RETRYSAFE_FAULT_IDLE", 1000);
    let mut daemon = start_daemon().await;
    let address = host_port(&daemon);

    // Idle connections that never send a byte, and slow ones that send a request head that
    // never ends, one byte per 100 ms each.
    let mut idle = Vec::with_capacity(idle_count);
    for _ in 0..idle_count {
        idle.push(TcpStream::connect(&address).await.unwrap());
    }
    let mut slow = Vec::with_capacity(slow_count);
    for _ in 0..slow_count {
        slow.push(TcpStream::connect(&address).await.unwrap());
    }
    let head: Vec<u8> = b"POST /v1/entries HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        .iter()
        .copied()
        .chain(b"X-Slow: a\r\n".iter().copied().cycle().take(10_000))
        .collect();

    let attack_over = Rc::new(Cell::new(false));
    let attack = {
        let attack_over = attack_over.clone();
        async move {
            let started = tokio::time::Instant::now();
            let mut slow_open: Vec<Option<TcpStream>> = slow.into_iter().map(Some).collect();
            let mut idle_open: Vec<Option<TcpStream>> = idle.into_iter().map(Some).collect();
            let mut buffer = [0u8; 512];
            let mut sent = 0;
            // Until the daemon has dropped every attacking connection, or the hang guard.
            while started.elapsed() < HANG_GUARD {
                for slot in slow_open.iter_mut() {
                    let Some(stream) = slot else { continue };
                    let closed = match stream.try_read(&mut buffer) {
                        Ok(_) => true, // EOF, or an answer such as 408: the daemon gave up
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            stream.try_write(&head[sent..sent + 1]).is_err()
                        }
                        Err(_) => true,
                    };
                    if closed {
                        *slot = None;
                    }
                }
                for slot in idle_open.iter_mut() {
                    let Some(stream) = slot else { continue };
                    match stream.try_read(&mut buffer) {
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        _ => *slot = None,
                    }
                }
                sent = (sent + 1).min(head.len() - 1);
                let slow_left = slow_open.iter().flatten().count();
                let idle_left = idle_open.iter().flatten().count();
                if slow_left == 0 && idle_left == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            attack_over.set(true);
            (
                slow_open.iter().flatten().count(),
                idle_open.iter().flatten().count(),
                started.elapsed(),
            )
        }
    };

    // Meanwhile, a normal client writes every 100 ms.
    let normal = {
        let base = daemon.address.clone();
        let attack_over = attack_over.clone();
        async move {
            let http = http_client(HANG_GUARD);
            let mut answered = 0;
            while !attack_over.get() && answered < 300 {
                let key = format!("normal-{answered}");
                let reply = post_raw(
                    &http,
                    &base,
                    &key,
                    &entry_body(answered).to_string(),
                    HANG_GUARD,
                )
                .await
                .unwrap_or_else(|e| panic!("{key} during the attack: {e}"));
                assert_eq!(
                    reply.status,
                    201,
                    "{key} during the attack: {}",
                    reply.describe()
                );
                answered += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            answered
        }
    };
    let ((slow_left, idle_left, took), answered) = futures_util::future::join(attack, normal).await;
    eprintln!(
        "hostile: {slow_count} slowloris and {idle_count} idle connections dropped by the daemon within {took:?}; {answered} normal writes answered 201 meanwhile"
    );
    assert!(answered >= 1, "no normal request ran during the attack");
    assert_eq!(
        slow_left, 0,
        "slowloris connections still open after {HANG_GUARD:?}: the daemon has no header deadline"
    );
    assert_eq!(
        idle_left, 0,
        "idle connections still open after {HANG_GUARD:?}: the daemon keeps them forever"
    );
    assert!(
        daemon.is_running(),
        "the daemon survived: {}",
        daemon.log_text()
    );
}

/// The value of the counter `name` with `labels` in a Prometheus text exposition, 0 if absent.
fn counter(metrics: &str, name: &str, labels: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name}{{{labels}}} ")))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

#[actix_web::test]
async fn requests_refused_before_routing_are_counted_and_logged_as_the_clients_fault() {
    let daemon = start_daemon_with(&[
        // A request head must arrive within this (actix's client_request_timeout).
        ("RETRYSAFE_HTTP__HEAD_TIMEOUT", "1s".into()),
    ])
    .await;
    let address = host_port(&daemon);
    // A NUL byte in a header value, and a header line without a colon.
    for head in [
        request_head("X-Bad: a\0b\r\n"),
        request_head("bad header y\r\n"),
    ] {
        assert_eq!(raw_exchange(&address, &head).await, Some(400));
    }
    // A head that never ends.
    let mut slow = TcpStream::connect(&address).await.unwrap();
    slow.write_all(b"POST /v1/entries HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(HANG_GUARD, slow.read_to_end(&mut answer))
        .await
        .expect("the daemon answers a slow head")
        .unwrap();
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    let metrics = daemon.get("/metrics", None).await.text();
    let name = "retrysafe_http_protocol_errors_total";
    assert_eq!(counter(&metrics, name, "status=\"400\""), 2.0, "{metrics}");
    assert_eq!(counter(&metrics, name, "status=\"408\""), 1.0, "{metrics}");
    let log = daemon.log_text();
    assert!(
        log.lines()
            .filter(|line| line.contains("refused a request before routing"))
            .all(|line| line.contains("WARN")),
        "{log}"
    );
    // One line per kind of answer within 10 s: the second 400 is counted, not logged.
    let lines = |status: &str| {
        log.lines()
            .filter(|line| {
                line.contains("refused a request before routing")
                    && line.contains(&format!("status=\"{status}\""))
            })
            .count()
    };
    assert_eq!((lines("400"), lines("408")), (1, 1), "{log}");
    assert!(
        !log.lines().any(|line| line.contains("ERROR")),
        "a client's malformed request is not an operator's error: {log}"
    );
}

/// A flood of idle connections that never send a byte, each answered 408 by actix-http
/// once `http.head_timeout` passes. Each used to be one WARN line (1,200 connections, 1,200
/// lines, and journald's rate limit then drops the lines that matter); now the first is logged,
/// then at most one every 10 s with the number left out, while the counter counts them all.
#[actix_web::test]
async fn a_flood_of_refused_connections_logs_a_few_lines_and_counts_every_one() {
    let connections = knob("RETRYSAFE_FAULT_REFUSED", 300);
    let mut daemon = start_daemon_with(&[("RETRYSAFE_HTTP__HEAD_TIMEOUT", "1s".into())]).await;
    let address = host_port(&daemon);
    let started = std::time::Instant::now();
    let mut idle = Vec::with_capacity(connections);
    for _ in 0..connections {
        idle.push(TcpStream::connect(&address).await.unwrap());
    }
    // Every connection is answered (408) and closed by the daemon.
    for mut stream in idle {
        let mut answer = Vec::new();
        tokio::time::timeout(HANG_GUARD, stream.read_to_end(&mut answer))
            .await
            .expect("the daemon closes an idle connection")
            .unwrap();
    }
    let elapsed = started.elapsed();
    let metrics = daemon.get("/metrics", None).await.text();
    let name = "retrysafe_http_protocol_errors_total";
    assert_eq!(
        counter(&metrics, name, "status=\"408\""),
        connections as f64,
        "every refusal is counted: {metrics}"
    );
    let log = daemon.log_text();
    let lines = log
        .lines()
        .filter(|line| line.contains("refused a request before routing"))
        .count();
    // The first line, then one per 10 s at most (and one more for an interval under way).
    let bound = 2 + elapsed.as_secs() as usize / 10;
    eprintln!("hostile: {connections} idle connections refused in {elapsed:?}: {lines} lines");
    assert!(
        (1..=bound).contains(&lines),
        "{lines} lines for {connections} refusals in {elapsed:?}: {log}"
    );
    assert!(daemon.is_running(), "{}", daemon.log_text());
}

#[actix_web::test]
async fn a_flood_of_large_costly_bodies_does_not_keep_small_writes_from_being_answered() {
    let daemon = start_daemon().await;
    // 64 KiB of nested empty arrays: cheap to send, costly to parse, hash and canonicalize.
    let costly = format!(
        r#"{{"kind":"flood","data":{{"x":[{}]}}}}"#,
        vec!["[[[[[[[[[[]]]]]]]]]]"; 3000].join(",")
    );
    assert!(costly.len() > 60_000);
    let flooding = Rc::new(Cell::new(true));
    let sent = Rc::new(Cell::new(0usize));
    let flood = futures_util::future::join_all((0..32).map(|client| {
        let (flooding, sent, costly, address) = (
            flooding.clone(),
            sent.clone(),
            costly.clone(),
            daemon.address.clone(),
        );
        async move {
            let http = http_client(HANG_GUARD);
            let mut n = 0;
            while flooding.get() {
                // Its answer does not matter (201, or 503 when decoding turns run out); that the
                // daemon answers does.
                let _ = post_raw(
                    &http,
                    &address,
                    &format!("flood-{client}-{n}"),
                    &costly,
                    HANG_GUARD,
                )
                .await
                .expect("a flooded daemon still answers");
                sent.set(sent.get() + 1);
                n += 1;
            }
        }
    }));
    let small = async {
        let http = http_client(HANG_GUARD);
        let mut statuses = Vec::new();
        for n in 0..20 {
            let reply = post_raw(
                &http,
                &daemon.address,
                &format!("small-{n}"),
                &entry_body(n).to_string(),
                HANG_GUARD,
            )
            .await
            .expect("a small write is answered during the flood");
            statuses.push(reply.status);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        flooding.set(false);
        statuses
    };
    let (_, statuses) = tokio::join!(flood, small);
    assert!(
        statuses.iter().all(|status| *status == 201),
        "small writes during the flood: {statuses:?}"
    );
    assert!(sent.get() > 32, "the flood ran: {} bodies", sent.get());
    let metrics = daemon.get("/metrics", None).await.text();
    assert_eq!(
        counter(
            &metrics,
            "retrysafe_http_protocol_errors_total",
            "status=\"408\""
        ),
        0.0,
        "no request head timed out: {metrics}"
    );
}
