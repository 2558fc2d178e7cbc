//! `retrysafe send`, the built binary, against a real daemon: lost answers, a daemon that is
//! down, concurrent runs, refusals, advised waits, and giving up.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use retrysafe::client::key_for_intent;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr};

use crate::common::daemon::{free_port, spawn_app, spawn_app_with, TestDaemon};
use crate::common::helpers::{client, reach_database_through, LockHolder, PG_HOST_PORT};
use crate::common::proxy::TcpProxy;

const REFUSED: i32 = 65;
const GAVE_UP: i32 = 75;

/// Bound on one run of the binary in these tests (their --max-time is smaller).
const RUN_LIMIT: Duration = Duration::from_secs(120);

const DATA: &str = r#"{"invoice": 42, "amount": {"value": 1250, "currency": "EUR"}}"#;

/// `--intent INTENT --kind invoice.paid --data DATA` and `extra`: the write most tests send.
fn job_args<'a>(intent: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--intent", intent, "--kind", "invoice.paid", "--data", DATA];
    args.extend_from_slice(extra);
    args
}

/// A fresh intent, so that tests sharing nothing cannot share a key either.
fn intent(name: &str) -> String {
    format!("{name}:{}", uuid::Uuid::new_v4())
}

/// `retrysafe send --url URL ARGS`, from a directory without a configuration file and with
/// `RETRYSAFE_CONFIG` naming none: `send` must not need one.
fn send_command(url: &str, args: &[&str], env: &[(&str, &str)]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_retrysafe"));
    command
        .arg("send")
        .arg("--url")
        .arg(url)
        .args(args)
        .current_dir(env!("CARGO_TARGET_TMPDIR"))
        .env("RETRYSAFE_CONFIG", "/nonexistent/retrysafe/config.toml")
        .env_remove("RETRYSAFE_TOKEN")
        .env_remove("RETRYSAFE_URL")
        .env_remove("RETRYSAFE_CA_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

/// A finished run.
struct SendRun {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

impl SendRun {
    /// The per-attempt lines of standard error.
    fn attempts(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|line| line.contains(": attempt "))
            .collect()
    }

    fn entry(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|error| {
            panic!("stdout is not an entry ({error}): {self}");
        })
    }

    fn assert_code(&self, code: i32) {
        assert_eq!(self.code, Some(code), "{self}");
    }
}

impl std::fmt::Display for SendRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// A run in progress whose standard error the test reads line by line.
struct RunningSend {
    child: Child,
    stderr: Lines<BufReader<ChildStderr>>,
    seen: Vec<String>,
    started: Instant,
}

impl RunningSend {
    fn spawn(url: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let started = Instant::now();
        let mut child = send_command(url, args, env)
            .spawn()
            .expect("the binary runs");
        let stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        Self {
            child,
            stderr,
            seen: Vec::new(),
            started,
        }
    }

    /// Reads standard error up to the first line containing `needle`, and returns that line.
    async fn wait_for_line(&mut self, needle: &str) -> String {
        let found = tokio::time::timeout(RUN_LIMIT, async {
            while let Some(line) = self.stderr.next_line().await.unwrap() {
                self.seen.push(line.clone());
                if line.contains(needle) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            _ => panic!("no line with {needle:?} in:\n{}", self.seen.join("\n")),
        }
    }

    async fn finish(mut self) -> SendRun {
        let finished = tokio::time::timeout(RUN_LIMIT, async {
            while let Some(line) = self.stderr.next_line().await.unwrap() {
                self.seen.push(line);
            }
            let mut stdout = String::new();
            self.child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut stdout)
                .await
                .unwrap();
            let status = self.child.wait().await.unwrap();
            (status, stdout)
        })
        .await;
        let Ok((status, stdout)) = finished else {
            panic!("send did not finish:\n{}", self.seen.join("\n"));
        };
        SendRun {
            code: status.code(),
            stdout,
            stderr: self.seen.iter().map(|line| format!("{line}\n")).collect(),
            elapsed: self.started.elapsed(),
        }
    }
}

async fn run_send(url: &str, args: &[&str], env: &[(&str, &str)]) -> SendRun {
    RunningSend::spawn(url, args, env).finish().await
}

/// The wait a "retrying in 1.2s" line announces.
fn announced_wait(line: &str) -> Duration {
    let seconds = line
        .split("retrying in ")
        .nth(1)
        .and_then(|rest| rest.split('s').next())
        .and_then(|number| number.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no wait in {line:?}"));
    Duration::from_secs_f64(seconds)
}

async fn entry_ids(app: &TestDaemon) -> Vec<String> {
    app.db
        .query("SELECT id::text FROM entries", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// One entry, the one `run` printed, with its one record and one event.
async fn assert_written_once(app: &TestDaemon, run: &SendRun) {
    assert_eq!(entry_ids(app).await, [run.entry()["id"].as_str().unwrap()]);
    assert_eq!(app.row_counts().await, (1, 1, 1));
}

/// A daemon on `port`, chosen before it starts so that a run can be pointed at it while it is
/// down.
async fn spawn_app_on(port: u16) -> TestDaemon {
    spawn_app_with(|settings| {
        settings.http.listen = format!("127.0.0.1:{port}").parse().unwrap();
    })
    .await
}

#[actix_web::test]
async fn a_lost_answer_is_retried_and_gets_the_saved_one() {
    let app = spawn_app().await;
    let daemon: SocketAddr = app.address.trim_start_matches("http://").parse().unwrap();
    let proxy = TcpProxy::start(daemon).await;
    proxy.lose_next_answers(1);
    let url = format!("http://127.0.0.1:{}", proxy.port);
    let intent = intent("answer-lost");

    let run = run_send(&url, &job_args(&intent, &[]), &[]).await;

    run.assert_code(0);
    assert_eq!(proxy.answers_lost(), 1, "the daemon answered once in vain");
    let attempts = run.attempts();
    assert_eq!(attempts.len(), 2, "{run}");
    assert!(attempts[0].contains("no answer"), "{run}");
    assert!(
        attempts[1].contains("replayed (Idempotency-Replayed: true)"),
        "the retry gets the saved answer: {run}"
    );
    let key = key_for_intent(&intent).unwrap();
    assert!(
        attempts[0].contains(key.as_str()),
        "lines name the key: {run}"
    );
    assert_written_once(&app, &run).await;
}

#[actix_web::test]
async fn a_daemon_that_comes_up_late_gets_the_write_once() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let intent = intent("late-daemon");
    let running = RunningSend::spawn(&url, &job_args(&intent, &["--max-time", "60s"]), &[]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let app = spawn_app_on(port).await;

    let run = running.finish().await;
    run.assert_code(0);
    let attempts = run.attempts();
    assert!(
        attempts.len() >= 2 && attempts[0].contains("no answer"),
        "it found the daemon down first: {run}"
    );
    assert!(attempts.last().unwrap().contains("created"), "{run}");
    assert_written_once(&app, &run).await;
}

#[actix_web::test]
async fn twenty_concurrent_sends_of_one_intent_write_once() {
    let app = spawn_app().await;
    let intent = intent("concurrent");
    let args = job_args(&intent, &[]);
    let running: Vec<RunningSend> = (0..20)
        .map(|_| RunningSend::spawn(&app.address, &args, &[]))
        .collect();
    let runs = futures_util::future::join_all(running.into_iter().map(RunningSend::finish)).await;

    let ids: Vec<String> = runs
        .iter()
        .map(|run| {
            run.assert_code(0);
            run.entry()["id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert!(
        ids.iter().all(|id| *id == ids[0]),
        "one id for all: {ids:?}"
    );
    let created = runs
        .iter()
        .flat_map(|run| run.attempts())
        .filter(|line| line.contains(" created, "))
        .count();
    assert_eq!(created, 1, "one run created it, the others got it replayed");
    assert_eq!(entry_ids(&app).await, [ids[0].clone()]);
    assert_eq!(app.row_counts().await, (1, 1, 1));
}

#[actix_web::test]
async fn a_reused_key_with_another_body_is_refused_at_once() {
    let app = spawn_app().await;
    let intent = intent("reused");
    let first = run_send(&app.address, &job_args(&intent, &[]), &[]).await;
    first.assert_code(0);

    let other = run_send(
        &app.address,
        &[
            "--intent",
            &intent,
            "--kind",
            "invoice.paid",
            "--data",
            r#"{"invoice": 42, "amount": 9999}"#,
        ],
        &[],
    )
    .await;
    other.assert_code(REFUSED);
    assert_eq!(other.attempts().len(), 1, "no retry: {other}");
    assert!(
        other.attempts()[0].contains("409 idempotency-key-reused"),
        "{other}"
    );
    assert_eq!(other.stdout, "", "nothing on stdout but an entry");
    assert_eq!(
        app.row_counts().await,
        (1, 1, 1),
        "nothing more was written"
    );

    // Refused here, before sending: the same checks as the daemon's.
    for (kind, data) in [
        ("Invoice", DATA),
        ("invoice.paid", "[1]"),
        ("invoice.paid", "{"),
    ] {
        let local = run_send(
            &app.address,
            &["--key", "local-check", "--kind", kind, "--data", data],
            &[],
        )
        .await;
        local.assert_code(REFUSED);
        assert!(local.stderr.contains("nothing sent"), "{local}");
        assert!(local.attempts().is_empty(), "{local}");
    }
    assert_eq!(app.row_counts().await, (1, 1, 1));
}

#[actix_web::test]
async fn request_in_progress_is_retried_after_the_advised_wait() {
    let app = spawn_app_with(|settings| {
        settings.idempotency.wait_timeout = Duration::from_millis(200);
        // The first attempt's write waits on the test's lock; it must outlive the test's hold.
        settings.database.statement_timeout = std::time::Duration::from_secs(60);
    })
    .await;
    let intent = intent("in-progress");
    let key = key_for_intent(&intent).unwrap();
    // An uncommitted record for the key: the daemon's claim of it waits for this transaction.
    let holder = LockHolder::claim(&app.database.name, key.as_str()).await;

    // Attempt 1 writes and waits on the lock: after wait_timeout the daemon answers 503 (the
    // write may still commit). Attempt 2 finds that write still in flight and is told, after
    // wait_timeout, to come back after Retry-After.
    let mut running = RunningSend::spawn(
        &app.address,
        &job_args(&intent, &["--timeout", "1s", "--max-time", "60s"]),
        &[],
    );
    let in_progress = running.wait_for_line("409 request-in-progress").await;
    holder.release().await;
    let run = running.finish().await;

    run.assert_code(0);
    let attempts = run.attempts();
    assert!(attempts[0].contains("503 storage-unavailable"), "{run}");
    assert!(in_progress.contains("(Retry-After: 1)"), "{in_progress}");
    assert!(
        announced_wait(&in_progress) >= Duration::from_secs(1),
        "the advised wait is a floor: {in_progress}"
    );
    assert!(
        run.elapsed >= Duration::from_secs(2),
        "at least the advised 1 s after the 503, and again after the 409: {run}"
    );
    assert!(
        attempts.last().unwrap().contains("replayed"),
        "the first attempt's write was completed by the daemon: {run}"
    );
    assert_written_once(&app, &run).await;
}

#[actix_web::test]
async fn storage_unavailable_is_retried_after_the_advised_wait() {
    let proxy = TcpProxy::start(PG_HOST_PORT.parse::<SocketAddr>().unwrap()).await;
    let port = proxy.port;
    let app = spawn_app_with(|settings| reach_database_through(settings, port)).await;
    proxy.cut();

    let intent = intent("storage-down");
    let mut running = RunningSend::spawn(
        &app.address,
        &job_args(&intent, &["--max-time", "60s"]),
        &[],
    );
    let unavailable = running.wait_for_line("503 storage-unavailable").await;
    proxy.restore();
    let run = running.finish().await;

    run.assert_code(0);
    assert!(unavailable.contains("(Retry-After: 1)"), "{unavailable}");
    assert!(
        announced_wait(&unavailable) >= Duration::from_secs(1),
        "the advised wait is a floor: {unavailable}"
    );
    assert!(run.elapsed >= Duration::from_secs(1), "{run}");
    assert!(run.attempts().last().unwrap().contains("created"), "{run}");
    assert_written_once(&app, &run).await;
}

#[actix_web::test]
async fn giving_up_at_max_time_leaves_the_same_intent_safe_to_run_again() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let intent = intent("gave-up");
    let args = job_args(&intent, &["--max-time", "2s"]);

    let gave_up = run_send(&url, &args, &[]).await;
    gave_up.assert_code(GAVE_UP);
    assert!(
        gave_up
            .attempts()
            .iter()
            .all(|line| line.contains("no answer")),
        "{gave_up}"
    );
    assert!(
        gave_up.stderr.contains("gave up after")
            && gave_up
                .stderr
                .contains("running again later with the same key is safe"),
        "{gave_up}"
    );
    assert_eq!(gave_up.stdout, "");

    let app = spawn_app_on(port).await;
    let later = run_send(&url, &args, &[]).await;
    later.assert_code(0);
    assert!(later.attempts()[0].contains("created"), "{later}");
    let again = run_send(&url, &args, &[]).await;
    again.assert_code(0);
    assert!(again.attempts()[0].contains("replayed"), "{again}");
    assert_eq!(later.entry(), again.entry());
    assert_eq!(app.row_counts().await, (1, 1, 1), "written exactly once");
}

#[actix_web::test]
async fn the_token_is_read_from_a_file_or_the_environment_and_never_shown() {
    const TOKEN: &str = "rs_send-test-token";
    let app = spawn_app_with(|settings| settings.auth.clients = vec![client("jobs", TOKEN)]).await;
    let token_file = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("token-{}", uuid::Uuid::new_v4()));
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let intent = intent("token");
    let args = job_args(&intent, &[]);
    let token_path = token_file.to_str().unwrap();
    let with_file = job_args(&intent, &["--token-file", token_path]);

    let dry_run = job_args(&intent, &["--token-file", token_path, "--dry-run"]);
    let dry = run_send(&app.address, &dry_run, &[]).await;
    dry.assert_code(0);
    let key = key_for_intent(&intent).unwrap();
    assert!(
        dry.stdout.starts_with(&format!(
            "POST {}/v1/entries\nIdempotency-Key: {key}\nContent-Type: application/json\nAuthorization: Bearer ***\n\n{{\"data\":",
            app.address
        )),
        "{dry}"
    );
    assert_eq!(app.row_counts().await, (0, 0, 0), "a dry run sends nothing");

    let from_file = run_send(&app.address, &with_file, &[]).await;
    from_file.assert_code(0);
    let from_env = run_send(&app.address, &args, &[("RETRYSAFE_TOKEN", TOKEN)]).await;
    from_env.assert_code(0);
    assert!(from_env.attempts()[0].contains("replayed"), "{from_env}");
    let anonymous = run_send(&app.address, &args, &[]).await;
    anonymous.assert_code(REFUSED);
    assert!(
        anonymous.attempts()[0].contains("401 unauthorized"),
        "{anonymous}"
    );
    for run in [&dry, &from_file, &from_env, &anonymous] {
        assert!(
            !run.stdout.contains(TOKEN) && !run.stderr.contains(TOKEN),
            "{run}"
        );
    }
    assert_eq!(app.row_counts().await, (1, 1, 1));
    std::fs::remove_file(token_file).unwrap();
}

#[actix_web::test]
async fn data_comes_from_a_file_or_standard_input() {
    let app = spawn_app().await;
    let data_file = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("data-{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&data_file, DATA).unwrap();
    let intent = intent("data-sources");
    let at_file = format!("@{}", data_file.display());
    let from_file = run_send(
        &app.address,
        &[
            "--intent",
            &intent,
            "--kind",
            "invoice.paid",
            "--data",
            &at_file,
        ],
        &[],
    )
    .await;
    from_file.assert_code(0);

    let mut command = send_command(
        &app.address,
        &["--intent", &intent, "--kind", "invoice.paid", "--data", "-"],
        &[],
    );
    command.stdin(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, DATA.as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let output = tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
        .await
        .expect("send finishes")
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("replayed"),
        "the same data from standard input is the same request"
    );
    assert_eq!(app.row_counts().await, (1, 1, 1));

    let missing = run_send(
        &app.address,
        &[
            "--intent",
            &intent,
            "--kind",
            "invoice.paid",
            "--data",
            "@/nonexistent/data.json",
        ],
        &[],
    )
    .await;
    missing.assert_code(1);
    std::fs::remove_file(data_file).unwrap();
}

/// A CA of the test's own, and a certificate it signed for 127.0.0.1.
struct TestPki {
    ca_pem: String,
    server_config: Arc<rustls::ServerConfig>,
}

fn test_ca(name: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    (params.self_signed(&key).unwrap(), key)
}

fn test_pki() -> TestPki {
    let (ca, ca_key) = test_ca("retrysafe test CA");
    let server_key = rcgen::KeyPair::generate().unwrap();
    let server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&server_key, &ca, &ca_key)
        .unwrap();
    let mut server_config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![server.der().clone()],
        rustls_pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
    )
    .unwrap();
    // A proxy that would speak HTTP/2 to a client that offers it: the front only forwards
    // bytes to the daemon's HTTP/1.1, so a client that offered h2 would fail here. `send`
    // offers http/1.1 alone (src/client/tls.rs).
    server_config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    TestPki {
        ca_pem: ca.pem(),
        server_config: Arc::new(server_config),
    }
}

/// Terminates TLS on a port of its own and forwards the plain bytes to `daemon`, as a reverse
/// proxy in front of the daemon would. Returns the port.
async fn tls_front(daemon: SocketAddr, config: Arc<rustls::ServerConfig>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    actix_web::rt::spawn(async move {
        loop {
            let Ok((inbound, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            actix_web::rt::spawn(async move {
                let Ok(mut tls) = acceptor.accept(inbound).await else {
                    return;
                };
                let Ok(mut outbound) = tokio::net::TcpStream::connect(daemon).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut outbound).await;
            });
        }
    });
    port
}

#[actix_web::test]
async fn https_works_with_a_private_ca_and_no_other_issuer_is_trusted() {
    let app = spawn_app().await;
    let pki = test_pki();
    let daemon: SocketAddr = app.address.trim_start_matches("http://").parse().unwrap();
    let port = tls_front(daemon, pki.server_config.clone()).await;
    let url = format!("https://127.0.0.1:{port}");
    let directory = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("pki-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&directory).unwrap();
    let ca_file = directory.join("ca.pem");
    std::fs::write(&ca_file, &pki.ca_pem).unwrap();
    // The "platform" roots: another CA, so that the result does not depend on this machine's.
    let platform = directory.join("platform.pem");
    std::fs::write(&platform, test_ca("another CA").0.pem()).unwrap();
    let platform_env = ("SSL_CERT_FILE", platform.to_str().unwrap());
    let intent = intent("https");
    let args = job_args(&intent, &[]);

    let with_ca = job_args(&intent, &["--ca-file", ca_file.to_str().unwrap()]);
    let trusted = run_send(&url, &with_ca, &[platform_env]).await;
    trusted.assert_code(0);
    assert!(trusted.attempts()[0].contains("created"), "{trusted}");
    let from_env = run_send(
        &url,
        &args,
        &[
            platform_env,
            ("RETRYSAFE_CA_FILE", ca_file.to_str().unwrap()),
        ],
    )
    .await;
    from_env.assert_code(0);
    assert!(from_env.attempts()[0].contains("replayed"), "{from_env}");

    let without = job_args(&intent, &["--max-time", "2s"]);
    let untrusted = run_send(&url, &without, &[platform_env]).await;
    untrusted.assert_code(GAVE_UP);
    assert!(
        untrusted.attempts()[0].contains("invalid peer certificate: UnknownIssuer"),
        "the line says why: {untrusted}"
    );
    assert_eq!(app.row_counts().await, (1, 1, 1));
    std::fs::remove_dir_all(directory).unwrap();
}

#[actix_web::test]
async fn an_ordering_key_is_sent_with_every_attempt_and_numbers_the_write() {
    let app = spawn_app().await;
    let first_intent = intent("ordered-first");
    let second_intent = intent("ordered-second");
    let ordered = ["--ordering-key", "invoice-42"];
    let first = run_send(&app.address, &job_args(&first_intent, &ordered), &[]).await;
    first.assert_code(0);
    assert_eq!(first.entry()["ordering_key"], "invoice-42");
    assert_eq!(first.entry()["sequence"], 1);
    let second = run_send(&app.address, &job_args(&second_intent, &ordered), &[]).await;
    assert_eq!(second.entry()["sequence"], 2);
    // The same intent again: the same write, the same number.
    let again = run_send(&app.address, &job_args(&first_intent, &ordered), &[]).await;
    again.assert_code(0);
    assert_eq!(again.entry()["sequence"], 1);
    // Without the ordering key it is another request under the same key: refused.
    let changed = run_send(&app.address, &job_args(&first_intent, &[]), &[]).await;
    changed.assert_code(REFUSED);
    // A malformed ordering key is refused before anything is sent.
    let malformed = run_send(
        &app.address,
        &job_args(&intent("bad"), &["--ordering-key", "has space"]),
        &[],
    )
    .await;
    malformed.assert_code(REFUSED);
    assert!(malformed.attempts().is_empty(), "{malformed}");
    assert_eq!(
        app.count("SELECT count(*) FROM entries").await,
        2,
        "two writes"
    );
}
