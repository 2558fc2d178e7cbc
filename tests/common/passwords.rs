//! Database passwords holding the characters a URL gives a meaning to, and the checks that no
//! piece of one shows in what the daemon's commands print: for the tests of `database.url`
//! against servers of their own (tests/tls/database_password.rs, tests/faults/secrets.rs).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::daemon::{daemon_binary, free_port, serve_command};

/// Passwords an operator may type into `database.url` unencoded (libpq's rule: the user info
/// runs to the first `@`), one character of `?`, `#`, `/` and `@` each, then all four. Each is
/// written in the URL with its `@` percent-encoded ([`in_url`]); the upper-case letters and
/// digits make every piece of four characters text that no message of the daemon holds.
pub const PASSWORDS: [&str; 5] = [
    "Kq7?Vz3Lw",
    "Hx4#Jm8Tp",
    "Sd2/Fb6Nr",
    "Ay9@Gc5Ek",
    "Zu3?Wt#Pe/Io@Rb",
];

/// A password with a raw `@`, which `database.url` must refuse without showing any of it.
pub const RAW_AT_PASSWORD: &str = "Qm5Yx2@Tn8Wk";

/// `password` as the user info of a URL holds it: only `@` percent-encoded.
pub fn in_url(password: &str) -> String {
    password.replace('@', "%40")
}

/// Every run of four characters of `secret` (and of its URL form), or the whole when shorter.
pub fn pieces(secret: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    for form in [secret.to_owned(), in_url(secret)] {
        let characters: Vec<char> = form.chars().collect();
        if characters.len() < 4 {
            pieces.push(form.clone());
            continue;
        }
        for window in characters.windows(4) {
            pieces.push(window.iter().collect());
        }
    }
    pieces
}

/// Fails naming the piece of `secret` that `text` holds, and the line it is on.
pub fn assert_no_piece_of(secret: &str, text: &str, what: &str) {
    for piece in pieces(secret) {
        if let Some(line) = text.lines().find(|line| line.contains(&piece)) {
            panic!("{what}: a piece of the password ({piece:?}) is shown: {line}");
        }
    }
}

/// Runs `retrysafe COMMAND` (`check-config`, `migrate` or `serve`) with the repository's
/// config.toml and `database.url` set to `url`; its exit status and all it printed. `serve` is
/// expected to stop at start; one that still runs after a minute is killed, and counts as
/// succeeded.
pub fn run_with_database_url(command: &str, url: &str) -> (bool, String) {
    if command == "serve" {
        return serve_until_it_stops(url);
    }
    let (binary, config) = daemon_binary();
    let output = Command::new(binary)
        .arg(command)
        .arg("--config")
        .arg(config)
        .env("RETRYSAFE_DATABASE__URL", url)
        .env("RETRYSAFE_DATABASE__CONNECT_TIMEOUT", "10s")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

fn serve_until_it_stops(url: &str) -> (bool, String) {
    let log = std::env::temp_dir().join(format!(
        "retrysafe-password-serve-{}.log",
        uuid::Uuid::new_v4().simple()
    ));
    let mut child = serve_command(free_port(), &log)
        .env("RETRYSAFE_DATABASE__URL", url)
        .env("RETRYSAFE_DATABASE__CONNECT_TIMEOUT", "10s")
        .env_remove("RUST_LOG")
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    (status.is_none_or(|status| status.success()), text)
}
