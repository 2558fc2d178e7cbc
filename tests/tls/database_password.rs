//! A password in `database.url` holding `?`, `#`, `/` or `@`, against a PostgreSQL cluster of
//! the test's own that declines TLS, while the URL says `sslmode=require`: the daemon must stop
//! at the refused TLS request, before it sends the password (its `pg_hba.conf` asks for the
//! password in clear, so a password sent would be the password itself on the wire), and print
//! no piece of it. The same passwords against a server that refuses the login are in
//! tests/faults/secrets.rs.

use crate::common::passwords::{
    assert_no_piece_of, in_url, run_with_database_url, PASSWORDS, RAW_AT_PASSWORD,
};
use crate::common::postgres::PgCluster;

/// What the server's log shows of a login once it has the startup message: the user's name, in
/// `connection authorized: user=app` or `password authentication failed for user "app"`.
fn login_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| {
            line.contains("user=app")
                || line.contains("user \"app\"")
                || line.contains("connection authenticated")
        })
        .collect()
}

#[test]
fn a_password_with_url_characters_is_never_sent_to_a_server_that_declines_tls() {
    // No `ssl = on`: the server answers the TLS request with "no".
    let cluster = PgCluster::start(
        "declines-tls",
        "log_connections = on",
        &["host all all 127.0.0.1/32 password"],
        &[],
    );
    cluster.psql("CREATE ROLE app LOGIN SUPERUSER");
    for password in PASSWORDS {
        // The right password: had the daemon sent it, it would have been let in.
        cluster.psql(&format!("ALTER ROLE app PASSWORD '{password}'"));
        let url = format!(
            "postgres://app:{}@127.0.0.1:{}/declined?sslmode=require",
            in_url(password),
            cluster.port
        );

        let (valid, text) = run_with_database_url("check-config", &url);
        assert_no_piece_of(password, &text, "check-config");
        assert!(valid, "{password}: check-config refused the URL: {text}");

        for command in ["migrate", "serve"] {
            let before = cluster.log_text().len();
            let (succeeded, text) = run_with_database_url(command, &url);
            let log = cluster.log_text()[before..].to_owned();
            assert!(
                log.contains("connection received"),
                "{password}: {command} made no connection: {log}\n{text}"
            );
            assert!(
                login_lines(&log).is_empty(),
                "{password}: {command} sent its login over a plain connection (sslmode=require): {:?}\n{text}",
                login_lines(&log)
            );
            assert_no_piece_of(password, &text, command);
            assert!(!succeeded, "{password}: {command} succeeded: {text}");
            assert!(
                text.contains("does not support SSL"),
                "{password}: {command}: {text}"
            );
        }
    }

    // A raw `@`: refused before anything connects, and no piece of the password shown.
    let url = format!(
        "postgres://app:{RAW_AT_PASSWORD}@127.0.0.1:{}/declined?sslmode=require",
        cluster.port
    );
    for command in ["check-config", "migrate", "serve"] {
        let before = cluster.log_text().len();
        let (succeeded, text) = run_with_database_url(command, &url);
        let log = cluster.log_text()[before..].to_owned();
        assert_no_piece_of(RAW_AT_PASSWORD, &text, command);
        assert!(!succeeded, "{command} took a raw @ in the password: {text}");
        assert!(
            text.contains("database.url") && text.contains("%40"),
            "{command}: {text}"
        );
        assert!(
            !log.contains("connection received"),
            "{command} connected: {log}"
        );
    }
}
