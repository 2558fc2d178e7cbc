//! The systemd unit: it verifies cleanly and its exposure stays at 2.0 or less.

use std::process::Command;

const UNIT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/retrysafe.service");

fn systemd_analyze_available() -> bool {
    Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn the_unit_verifies_and_is_hardened() {
    if !systemd_analyze_available() {
        eprintln!("skipped: systemd-analyze is not installed (.ci/run installs it)");
        return;
    }
    let unit = std::fs::read_to_string(UNIT).unwrap();
    for line in [
        "Type=notify",
        "ExecStartPre=/usr/bin/retrysafe check-config",
        // Where the Debian package installs the binary (Cargo.toml, package.metadata.deb).
        "ExecStart=/usr/bin/retrysafe serve",
        "Restart=on-failure",
        "User=retrysafe",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "SystemCallFilter=@system-service",
    ] {
        assert!(
            unit.lines().any(|l| l.starts_with(line)),
            "the unit lacks {line}"
        );
    }
    assert!(
        unit.lines().any(|l| l.starts_with("WatchdogSec=")),
        "the unit sets no watchdog"
    );

    // verify checks that the binaries exist: point the unit at the one just built.
    let directory = tempdir();
    let copy = directory.join("retrysafe.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/bin/retrysafe", env!("CARGO_BIN_EXE_retrysafe")),
    )
    .unwrap();
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "systemd-analyze verify failed: {}",
        String::from_utf8_lossy(&verify.stderr)
    );

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

fn tempdir() -> std::path::PathBuf {
    let directory = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("unit-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&directory).unwrap();
    directory
}
