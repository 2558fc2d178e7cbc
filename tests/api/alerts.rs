//! docs/alerts.yml: valid Prometheus rules, firing as their unit tests say, on metrics the
//! daemon exports.

use std::process::Command;

const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/alerts.yml");
const RULE_TESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/alerts.test.yml");

fn promtool(args: &[&str]) -> Option<std::process::Output> {
    Command::new("promtool").args(args).output().ok()
}

#[test]
fn the_alert_rules_check_and_pass_their_unit_tests() {
    let Some(check) = promtool(&["check", "rules", RULES]) else {
        eprintln!(
            "skipped: promtool is not installed (.ci/run installs the Debian package prometheus)"
        );
        return;
    };
    assert!(
        check.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let test = promtool(&["test", "rules", RULE_TESTS]).expect("promtool runs");
    assert!(
        test.status.success(),
        "promtool test rules: {}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
}

/// A rule on a metric the daemon does not export would never fire.
#[test]
fn the_alert_rules_use_only_exported_metrics() {
    let rules = std::fs::read_to_string(RULES).unwrap();
    let mut checked = 0;
    for (start, _) in rules.match_indices("retrysafe_") {
        let name: String = rules[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let exported = name.strip_suffix("_bucket").unwrap_or(&name);
        assert!(
            retrysafe::metric::METRICS
                .iter()
                .any(|metric| metric.name == exported),
            "docs/alerts.yml uses {name}, which src/metric.rs does not define"
        );
        checked += 1;
    }
    assert!(
        checked >= 8,
        "only {checked} metric names found in the rules"
    );
}
