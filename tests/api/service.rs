//! The systemd units: the daemon's verifies cleanly and its exposure stays at 2.0 or less; the
//! example job and its timer verify, and the job's command writes once per day.

use std::process::{Command, Stdio};

use retrysafe::client::key_for_intent;

use crate::common::daemon::spawn_app_with;
use crate::common::helpers::client;

const UNIT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/retrysafe.service");
const JOB: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/systemd/retrysafe-example-job.service"
);
const JOB_TIMER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/systemd/retrysafe-example-job.timer"
);

/// Whether systemd-analyze runs here; if not, says that the test is skipped.
fn systemd_analyze_available() -> bool {
    let available = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !available {
        eprintln!("skipped: systemd-analyze is not installed (.ci/run installs it)");
    }
    available
}

fn assert_has_lines(unit: &str, name: &str, lines: &[&str]) {
    for line in lines {
        assert!(
            unit.lines().any(|l| l.starts_with(line)),
            "{name} lacks {line}"
        );
    }
}

/// Copies `units` (file name, text) into a fresh directory and runs `systemd-analyze verify` on
/// them. verify checks that the binaries exist: the copies run the one just built.
fn assert_verify(units: &[(&str, &str)]) -> std::path::PathBuf {
    let directory = tempdir();
    let mut verify = Command::new("systemd-analyze");
    verify.arg("verify");
    for (name, text) in units {
        let copy = directory.join(name);
        std::fs::write(
            &copy,
            text.replace("/usr/bin/retrysafe", env!("CARGO_BIN_EXE_retrysafe")),
        )
        .unwrap();
        verify.arg(copy);
    }
    let verify = verify.output().unwrap();
    assert!(
        verify.status.success(),
        "systemd-analyze verify failed: {}",
        String::from_utf8_lossy(&verify.stderr)
    );
    directory
}

#[test]
fn the_unit_verifies_and_is_hardened() {
    if !systemd_analyze_available() {
        return;
    }
    let unit = std::fs::read_to_string(UNIT).unwrap();
    assert_has_lines(
        &unit,
        "the unit",
        &[
            "Type=notify",
            "ExecStartPre=/usr/bin/retrysafe check-config",
            // Where the Debian package installs the binary (Cargo.toml, package.metadata.deb).
            "ExecStart=/usr/bin/retrysafe serve",
            // SIGHUP reloads the HTTPS certificate.
            "ExecReload=/bin/kill -HUP $MAINPID",
            "Restart=on-failure",
            "User=retrysafe",
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "PrivateTmp=yes",
            "SystemCallFilter=@system-service",
            "WatchdogSec=",
        ],
    );

    let directory = assert_verify(&[("retrysafe.service", &unit)]);
    let copy = directory.join("retrysafe.service");

    let security = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&copy)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&security.stdout).to_string()
        + &String::from_utf8_lossy(&security.stderr);
    let exposure: f64 = report
        .lines()
        .find_map(|line| {
            line.split("Overall exposure level for retrysafe.service:")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in: {report}"));
    assert!(
        exposure <= 2.0,
        "exposure {exposure} is above 2.0:\n{report}"
    );
    std::fs::remove_dir_all(directory).unwrap();
}

#[test]
fn the_example_job_and_its_timer_verify() {
    if !systemd_analyze_available() {
        return;
    }
    let job = std::fs::read_to_string(JOB).unwrap();
    let timer = std::fs::read_to_string(JOB_TIMER).unwrap();
    assert_has_lines(
        &job,
        "the job",
        &[
            "Type=oneshot",
            "LoadCredential=retrysafe-token:",
            "StandardInput=data",
            "DynamicUser=yes",
        ],
    );
    let command = setting(&job, "ExecStart=");
    assert!(
        command.contains("retrysafe send") && command.contains("--intent"),
        "{command}"
    );
    assert_has_lines(&timer, "the timer", &["OnCalendar=", "Persistent=true"]);

    let directory = assert_verify(&[
        ("retrysafe-example-job.timer", &timer),
        ("retrysafe-example-job.service", &job),
    ]);
    std::fs::remove_dir_all(directory).unwrap();
}

/// The job's ExecStart= run as systemd runs it: `$$` and `%%` unescaped, the token in
/// $CREDENTIALS_DIRECTORY, StandardInputText= on standard input; twice, as a repeated run of the
/// same day.
#[actix_web::test]
async fn the_example_jobs_command_writes_once_a_day() {
    const TOKEN: &str = "rs_example-job-token";
    let app =
        spawn_app_with(|settings| settings.auth.clients = vec![client("nightly-invoices", TOKEN)])
            .await;
    let job = std::fs::read_to_string(JOB).unwrap();
    let script = setting(&job, "ExecStart=")
        .strip_prefix("/bin/sh -c '")
        .and_then(|rest| rest.strip_suffix('\''))
        .expect("the job runs one /bin/sh -c '...' command");
    let script = unescape(script).replace("/usr/bin/retrysafe", env!("CARGO_BIN_EXE_retrysafe"));
    let input = format!("{}\n", setting(&job, "StandardInputText="));
    let credentials = tempdir();
    std::fs::write(credentials.join("retrysafe-token"), TOKEN).unwrap();

    let day_before = chrono::Utc::now().format("%F").to_string();
    let mut outputs = Vec::new();
    for _ in 0..2 {
        let mut child = tokio::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(&script)
            .env("CREDENTIALS_DIRECTORY", &credentials)
            .env("RETRYSAFE_URL", &app.address)
            .env("RETRYSAFE_CONFIG", "/nonexistent/retrysafe/config.toml")
            .env_remove("RETRYSAFE_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut stdin, input.as_bytes())
            .await
            .unwrap();
        drop(stdin);
        let output = tokio::time::timeout(
            std::time::Duration::from_secs(120),
            child.wait_with_output(),
        )
        .await
        .expect("the job finishes")
        .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        outputs.push((String::from_utf8_lossy(&output.stdout).into_owned(), stderr));
    }
    let day_after = chrono::Utc::now().format("%F").to_string();

    let entry: serde_json::Value = serde_json::from_str(&outputs[0].0).unwrap();
    assert_eq!(entry["kind"], "report.requested");
    assert_eq!(entry["data"]["report"], "nightly-invoices");
    assert!(outputs[1].1.contains("replayed"), "{}", outputs[1].1);
    assert_eq!(outputs[0].0, outputs[1].0, "the same entry both times");
    let key: String = app
        .db
        .query_one("SELECT key FROM idempotency_records", &[])
        .await
        .unwrap()
        .get(0);
    let days = [day_before, day_after];
    assert!(
        days.iter().any(|day| key
            == key_for_intent(&format!("nightly-invoices:{day}"))
                .unwrap()
                .as_str()),
        "the key is the day's: {key}"
    );
    assert_eq!(app.row_counts().await, (1, 1, 1));
    std::fs::remove_dir_all(credentials).unwrap();
}

/// The value of a unit's one `name` line.
fn setting<'a>(unit: &'a str, name: &str) -> &'a str {
    let mut values = unit.lines().filter_map(|line| line.strip_prefix(name));
    let value = values.next().unwrap_or_else(|| panic!("no {name}"));
    assert!(values.next().is_none(), "more than one {name}");
    value
}

/// A unit's `$$` and `%%` as the command receives them; the job uses no other `$` or `%`,
/// which systemd would expand.
fn unescape(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '$' | '%' => match chars.next() {
                Some(next) if next == c => out.push(c),
                other => panic!("systemd would expand {c}{other:?} in {text}"),
            },
            c => out.push(c),
        }
    }
    out
}

fn tempdir() -> std::path::PathBuf {
    let directory = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("unit-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&directory).unwrap();
    directory
}
