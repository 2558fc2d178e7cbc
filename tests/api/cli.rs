//! Every command of the built binary, including its errors.

use std::process::Command;

use sha2::Digest;

use crate::common::cli::{retrysafe, stderr, stdout};
use crate::common::daemon::spawn_app_without_relays;
use crate::common::helpers::{connect, entry_body, test_settings, TestDatabase};

fn temp_file(contents: &str) -> std::path::PathBuf {
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("config-{}.toml", uuid::Uuid::new_v4()));
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn every_command_has_help() {
    for args in [
        &["--help"][..],
        &["serve", "--help"],
        &["migrate", "--help"],
        &["check-config", "--help"],
        &["outbox", "status", "--help"],
        &["outbox", "retry", "--help"],
        &["outbox", "skip", "--help"],
        &["outbox", "replay", "--help"],
        &["purge", "--help"],
        &["token", "new", "--help"],
        &["send", "--help"],
    ] {
        let output = retrysafe(args, &[]);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        assert!(stdout(&output).contains("Usage"), "{args:?}");
    }
}

#[test]
fn send_documents_its_exit_statuses_and_refuses_bad_usage() {
    let help = stdout(&retrysafe(&["send", "--help"], &[]));
    for status in ["  65  refused", "  75  gave up"] {
        assert!(help.contains(status), "{help}");
    }
    let base = [
        "send",
        "--url",
        "http://127.0.0.1:1",
        "--kind",
        "k",
        "--data",
        "{}",
    ];
    let neither = retrysafe(&base, &[]);
    assert_eq!(
        neither.status.code(),
        Some(2),
        "--key or --intent is required"
    );
    let both: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--key", "k", "--intent", "i"])
        .collect();
    assert_eq!(retrysafe(&both, &[]).status.code(), Some(2), "not both");
    let no_url = retrysafe(&["send", "--kind", "k", "--data", "{}", "--key", "k"], &[]);
    assert_eq!(
        no_url.status.code(),
        Some(2),
        "--url or RETRYSAFE_URL is required"
    );
    let bad_url: Vec<&str> = ["send", "--url", "ftp://host", "--kind", "k", "--data", "{}"]
        .into_iter()
        .chain(["--key", "k"])
        .collect();
    let output = retrysafe(&bad_url, &[]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("http or https"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn check_config_accepts_the_shipped_config_and_names_bad_keys() {
    let output = retrysafe(&["check-config"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("configuration is valid"));

    let unknown = temp_file("[http]\nlisten = \"127.0.0.1:8080\"\nlisen = 1\n");
    let output = retrysafe(
        &["check-config", "--config", unknown.to_str().unwrap()],
        &[],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("lisen"), "{}", stderr(&output));

    let bad_value = temp_file("[idempotency]\nwait_timeout = \"soon\"\n");
    let output = retrysafe(
        &["check-config", "--config", bad_value.to_str().unwrap()],
        &[],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("idempotency.wait_timeout"),
        "{}",
        stderr(&output)
    );

    let output = retrysafe(
        &["check-config"],
        &[("RETRYSAFE_IDEMPOTENCY__MISMATCH_STATUS", "418")],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("idempotency.mismatch_status"),
        "{}",
        stderr(&output)
    );

    let output = retrysafe(
        &["check-config"],
        &[("RETRYSAFE_HTTP__LISTEN", "0.0.0.0:8080")],
    );
    assert_eq!(
        output.status.code(),
        Some(1),
        "anonymous access off loopback is refused"
    );
    assert!(
        stderr(&output).contains("auth.clients"),
        "{}",
        stderr(&output)
    );

    // Malformed variable names are not silently ignored.
    for name in [
        "RETRYSAFE_HTTP_LISTEN",
        "RETRYSAFE_HTTP____LISTEN",
        "RETRYSAFE_HTTP__LISTEN__",
        "RETRYSAFE___LISTEN",
    ] {
        let output = retrysafe(&["check-config"], &[(name, "0.0.0.0:1")]);
        assert!(output.status.success(), "{name}: {}", stderr(&output));
        assert!(
            stderr(&output).contains(&format!("warning: {name} is ignored")),
            "{name}: {}",
            stderr(&output)
        );
    }
    // Values past what the daemon or its dependencies can take are refused up front.
    for (name, value, key) in [
        (
            "RETRYSAFE_DATABASE__STATEMENT_TIMEOUT",
            "30d",
            "database.statement_timeout",
        ),
        (
            "RETRYSAFE_IDEMPOTENCY__SHARDS",
            "100000000",
            "idempotency.shards",
        ),
        ("RETRYSAFE_HTTP__HEAD_TIMEOUT", "0s", "http.head_timeout"),
        ("RETRYSAFE_HTTP__WORKERS", "1000", "http.workers"),
    ] {
        let output = retrysafe(&["check-config"], &[(name, value)]);
        assert_eq!(output.status.code(), Some(1), "{name}={value}");
        assert!(
            stderr(&output).contains(key),
            "{name}={value}: {}",
            stderr(&output)
        );
    }

    let output = retrysafe(
        &["check-config", "--config", "/nonexistent/retrysafe.toml"],
        &[],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("/nonexistent/retrysafe.toml"),
        "{}",
        stderr(&output)
    );

    // Every command refuses a bad configuration the same way.
    for command in [
        &["serve"][..],
        &["migrate"],
        &["purge"],
        &["outbox", "status"],
    ] {
        let mut args = command.to_vec();
        args.extend(["--config", unknown.to_str().unwrap()]);
        let output = retrysafe(&args, &[]);
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&output).contains("lisen"),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    std::fs::remove_file(unknown).unwrap();
    std::fs::remove_file(bad_value).unwrap();
}

#[test]
fn token_new_prints_a_token_and_its_config_lines() {
    let output = retrysafe(&["token", "new", "--client", "billing-cron"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let token = text
        .lines()
        .find(|l| l.starts_with("rs_"))
        .expect("a token line");
    let digest = hex::encode(sha2::Sha256::digest(token.as_bytes()));
    assert!(text.contains("[[auth.clients]]"));
    assert!(text.contains("id = \"billing-cron\""));
    assert!(text.contains(&format!("token_sha256 = \"{digest}\"")));

    let output = retrysafe(&["token", "new", "--client", "bad name!"], &[]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("--client"));
    let output = retrysafe(&["token", "new"], &[]);
    assert_eq!(
        output.status.code(),
        Some(2),
        "clap refuses a missing --client"
    );

    let output = retrysafe(&["token", "new", "--admin", "alice"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let token = text
        .lines()
        .find(|l| l.starts_with("rs_"))
        .expect("a token line");
    let digest = hex::encode(sha2::Sha256::digest(token.as_bytes()));
    assert!(text.contains("[[auth.admins]]"), "{text}");
    assert!(!text.contains("[[auth.clients]]"), "{text}");
    assert!(text.contains("id = \"alice\""));
    assert!(text.contains(&format!("token_sha256 = \"{digest}\"")));
    let output = retrysafe(&["token", "new", "--admin", "a", "--client", "b"], &[]);
    assert_eq!(output.status.code(), Some(2), "one or the other");
}

#[test]
fn migrate_creates_the_database_and_applies_the_schema() {
    let settings = test_settings();
    let _database = TestDatabase::new(&settings);
    let url = settings.database.url.as_str();
    let output = retrysafe(&["migrate"], &[("RETRYSAFE_DATABASE__URL", url)]);
    assert!(output.status.success(), "{}", stderr(&output));
    let migrations = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .unwrap()
        .count();
    assert!(
        stdout(&output).contains(&format!("applied {migrations} migration")),
        "{}",
        stdout(&output)
    );
    let again = retrysafe(&["migrate"], &[("RETRYSAFE_DATABASE__URL", url)]);
    assert!(again.status.success());
    assert!(
        stdout(&again).contains("applied 0 migration"),
        "{}",
        stdout(&again)
    );

    let unreachable = retrysafe(
        &["migrate"],
        &[(
            "RETRYSAFE_DATABASE__URL",
            "postgres://postgres@127.0.0.1:1/x",
        )],
    );
    assert_eq!(unreachable.status.code(), Some(1));
    assert!(
        stderr(&unreachable).contains("database unavailable"),
        "{}",
        stderr(&unreachable)
    );
}

/// A migration PostgreSQL refuses names the migration, PostgreSQL's message and its SQLSTATE
/// (here: a table of the first migration's name that is not the daemon's), not a bare "db
/// error"; and nothing of it stays.
#[actix_web::test]
async fn a_failed_migration_names_its_cause() {
    let settings = test_settings();
    let database = TestDatabase::new(&settings);
    let url = settings.database.url.as_str();
    connect("postgres")
        .await
        .batch_execute(&format!("CREATE DATABASE \"{}\"", database.name))
        .await
        .unwrap();
    connect(&database.name)
        .await
        .batch_execute("CREATE TABLE entries (id int)")
        .await
        .unwrap();
    let output = retrysafe(&["migrate"], &[("RETRYSAFE_DATABASE__URL", url)]);
    assert_eq!(output.status.code(), Some(1), "{}", stdout(&output));
    let said = stderr(&output);
    assert!(
        said.contains("error applying migration V1__initial_schema")
            && said.contains("relation \"entries\" already exists")
            && said.contains("SQLSTATE 42P07")
            && !said.contains("db error"),
        "{said}"
    );
}

#[actix_web::test]
async fn outbox_status_retry_and_purge_work_on_the_database() {
    // No queue is bound: every publish is returned, so events stay unsent and get parked.
    let app = spawn_app_without_relays(|settings| settings.outbox.max_attempts = 1).await;
    for n in 0..3 {
        app.post_entry(&format!("cli-{n}"), &entry_body(n))
            .await
            .assert_created();
    }
    assert_eq!(app.relay_until_empty().await, 0);
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE failed_at IS NOT NULL")
            .await,
        3
    );
    let status = app.retrysafe(&["outbox", "status", "--json"]);
    assert!(status.status.success(), "{}", stderr(&status));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let rows = &status["backlog"];
    assert_eq!(rows[0]["event_type"], "entry.created");
    assert_eq!(rows[0]["parked"], 3);
    assert_eq!(rows[0]["unsent"], 0);
    assert_eq!(status["replays"], serde_json::json!([]));
    // Parked events grouped by what they last failed with.
    let groups = &status["parked"];
    assert_eq!(groups.as_array().unwrap().len(), 1, "{groups}");
    assert_eq!(groups[0]["parked"], 3);
    assert_eq!(groups[0]["event_type"], "entry.created");
    assert!(
        groups[0]["last_error"].to_string().contains("NO_ROUTE"),
        "{groups}"
    );
    let table = app.retrysafe(&["outbox", "status"]);
    assert!(
        stdout(&table).contains("entry.created")
            && stdout(&table).contains("parked events by last error"),
        "{}",
        stdout(&table)
    );

    let event_id: uuid::Uuid = app
        .db
        .query_one(
            "SELECT event_id FROM outbox_events ORDER BY id LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let one = app.retrysafe(&["outbox", "retry", "--event", &event_id.to_string()]);
    assert!(one.status.success(), "{}", stderr(&one));
    assert!(stdout(&one).contains("requeued 1 event"));
    let unknown = app.retrysafe(&[
        "outbox",
        "retry",
        "--event",
        &uuid::Uuid::now_v7().to_string(),
    ]);
    assert_eq!(unknown.status.code(), Some(1));
    let neither = app.retrysafe(&["outbox", "retry"]);
    assert_eq!(
        neither.status.code(),
        Some(2),
        "--all or --event is required"
    );
    // The requeued event is unsent (no relay runs); the others are parked.
    let all = app.retrysafe(&["outbox", "retry", "--all"]);
    assert!(all.status.success(), "{}", stderr(&all));
    assert!(stdout(&all).contains("requeued"), "{}", stdout(&all));

    let purge = app.retrysafe(&["purge"]);
    assert!(purge.status.success(), "{}", stderr(&purge));
    assert!(
        stdout(&purge).contains("deleted 0 expired idempotency record(s)"),
        "{}",
        stdout(&purge)
    );
}

/// What a valid configuration may still get wrong is said, not refused: a database reached
/// without a checked certificate (libpq's default `sslmode=prefer` checks none, and falls back
/// to a plain connection), an operations listener off loopback, a file others may read or
/// write.
#[test]
fn check_config_warns_about_an_unauthenticated_database_an_open_operations_listener_and_the_files_mode(
) {
    use std::os::unix::fs::PermissionsExt;
    let chmod = |path: &std::path::Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    let warned = temp_file(
        "[database]\nurl = \"postgres://app:hunter2@db.example.internal:5432/x\"\n\n[http]\noperations_listen = \"0.0.0.0:9090\"\n",
    );
    chmod(&warned, 0o644);
    let output = retrysafe(&["check-config", "--config", warned.to_str().unwrap()], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stderr(&output);
    for needle in [
        "warning: database.url: db.example.internal is not a loopback address, and sslmode=prefer",
        "set sslmode=verify-full and sslrootcert",
        "warning: http.operations_listen: 0.0.0.0:9090 is not a loopback address",
        &format!(
            "warning: {}: every user of the machine may read this file (mode 0644)",
            warned.display()
        ),
    ] {
        assert!(text.contains(needle), "no {needle:?} in: {text}");
    }
    assert!(!text.contains("hunter2"), "{text}");
    chmod(&warned, 0o660);
    let text = stderr(&retrysafe(
        &["check-config", "--config", warned.to_str().unwrap()],
        &[],
    ));
    assert!(
        text.contains("its group may write this file (mode 0660)"),
        "{text}"
    );

    let quiet = temp_file(
        "[database]\nurl = \"postgres://app:hunter2@127.0.0.1:5432/x\"\n\n[http]\noperations_listen = \"127.0.0.1:9090\"\n",
    );
    chmod(&quiet, 0o600);
    let output = retrysafe(&["check-config", "--config", quiet.to_str().unwrap()], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!stderr(&output).contains("warning"), "{}", stderr(&output));
    for file in [warned, quiet] {
        std::fs::remove_file(file).unwrap();
    }
}

/// The same warnings at start, at WARN, beside the one that says the API is unauthenticated
/// (no clients). The database is named by a host off loopback and reached through
/// `hostaddr=127.0.0.1`, so that the daemon starts.
#[actix_web::test]
async fn serve_warns_at_start_about_the_database_the_files_mode_and_anonymous_mode() {
    use std::os::unix::fs::PermissionsExt;
    let settings = test_settings();
    let database = crate::common::helpers::database_name(&settings.database.url);
    let port = crate::common::daemon::free_port();
    let config = temp_file(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\n\n[database]\nurl = \"postgres://postgres@db.example.internal:5432/{database}?hostaddr=127.0.0.1\"\n\n[amqp]\nexchange = \"{}\"\n",
        settings.amqp.exchange
    ));
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let serve = config.clone();
    let daemon = crate::common::daemon::spawn_binary_as(settings, port, move |log| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_retrysafe"));
        command.args(["serve", "--config"]).arg(&serve).env_clear();
        crate::common::daemon::log_to(&mut command, log);
        command
    })
    .await;
    let log = daemon.log_text();
    let warnings: Vec<&str> = log.lines().filter(|line| line.contains("WARN")).collect();
    for needle in [
        "db.example.internal is not a loopback address, and sslmode=prefer",
        "every user of the machine may read this file (mode 0644)",
        "the api is unauthenticated",
    ] {
        assert!(
            warnings.iter().any(|line| line.contains(needle)),
            "no WARN with {needle:?}: {log}"
        );
    }
    drop(daemon);
    std::fs::remove_file(config).unwrap();
}
