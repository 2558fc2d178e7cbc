//! A daemon whose clock is wrong, by a day either way (libfaketime on the daemon's process
//! only; the database's clock is right): the records it writes still live exactly
//! `idempotency.retention` on the database's clock, so a retry through any daemon, or through
//! the same one restarted, is a replay, never a second write; entries are stamped with the
//! database's time; the skew is logged and shown in /metrics.

use std::path::Path;
use std::time::Duration;

use futures_util::future::join_all;
use serde_json::json;

use crate::common::daemon::{spawn_binary, spawn_second_app, TestDaemon};
use crate::common::helpers::{entry_body, test_settings};

/// libfaketime for a multi-threaded process (Debian's `faketime` package).
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The environment that runs the daemon `offset` away from the real time (`-25h`, `+25h`).
/// The monotonic clock stays real: timeouts and intervals are not what this test is about.
fn skewed(offset: &str) -> Vec<(&'static str, String)> {
    vec![
        ("LD_PRELOAD", LIBFAKETIME.into()),
        ("FAKETIME", offset.into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
        ("RETRYSAFE_LOG__LEVEL", "info".into()),
    ]
}

fn have_libfaketime() -> bool {
    if Path::new(LIBFAKETIME).exists() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{LIBFAKETIME} is missing: install Debian's faketime package (.ci/run does)"
    );
    eprintln!("skipped: {LIBFAKETIME} is missing (apt install faketime)");
    false
}

/// Seconds from the database's now to the key's `expires_at`, and from the entry's
/// `created_at` to the database's now.
async fn record_times(daemon: &TestDaemon, key: &str) -> (f64, f64) {
    let row = daemon
        .db
        .query_one(
            "SELECT extract(epoch FROM r.expires_at - now())::float8,
                    extract(epoch FROM now() - e.created_at)::float8
             FROM idempotency_records r JOIN entries e ON e.id = r.entry_id
             WHERE r.key = $1",
            &[&key],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Retention (24 h) on the database's clock, give or take the test's own pace.
fn assert_lives_a_retention(key: &str, (expires_in, created_ago): (f64, f64)) {
    let retention = 24.0 * 3600.0;
    assert!(
        (retention - 120.0..=retention + 5.0).contains(&expires_in),
        "{key}: its record expires in {expires_in} s on the database's clock, not about 24 h"
    );
    assert!(
        (-5.0..=120.0).contains(&created_ago),
        "{key}: its entry was stamped {created_ago} s before the database's now"
    );
}

async fn write_all(daemon: &TestDaemon, keys: &[String]) -> Vec<String> {
    let answers = join_all(keys.iter().enumerate().map(|(n, key)| async move {
        let answer = daemon.post_entry(key, &entry_body(n as i64)).await;
        answer.assert_created();
        answer.json()["id"].as_str().unwrap().to_owned()
    }))
    .await;
    answers
}

#[actix_web::test]
async fn a_daemon_a_day_behind_writes_records_that_live_their_retention_on_the_databases_clock() {
    if !have_libfaketime() {
        return;
    }
    let mut behind = spawn_binary(test_settings(), &skewed("-25h")).await;
    let keys: Vec<String> = (0..40).map(|n| format!("behind-{n}")).collect();
    let ids = write_all(&behind, &keys).await;
    for key in &keys[..3] {
        assert_lives_a_retention(key, record_times(&behind, key).await);
    }
    assert!(
        behind
            .log_text()
            .contains("this machine's clock differs from the database's"),
        "the skew is logged: {}",
        behind.log_tail(20)
    );
    let offset = behind
        .metric("retrysafe_database_clock_offset_seconds")
        .await;
    assert!(
        (25.0 * 3600.0 - 60.0..25.0 * 3600.0 + 60.0).contains(&offset),
        "the database is 25 h ahead of this daemon: {offset}"
    );

    // Retries through a daemon with a right clock are replays of the same entries.
    let right = spawn_second_app(&behind).await;
    for (n, key) in keys.iter().enumerate().take(10) {
        let retry = right.post_entry(key, &entry_body(n as i64)).await;
        retry.assert_created();
        assert!(retry.replayed(), "{key}: {}", retry.describe());
        assert_eq!(retry.json()["id"], json!(ids[n]), "{key}");
    }

    // The skewed daemon restarted (its replay cache gone): every retry is answered from the
    // records, as replays; no key is written twice.
    behind.restart().await;
    let retried = join_all(keys.iter().enumerate().map(|(n, key)| {
        let behind = &behind;
        async move { behind.post_entry(key, &entry_body(n as i64)).await }
    }))
    .await;
    for ((key, id), retry) in keys.iter().zip(&ids).zip(&retried) {
        retry.assert_created();
        assert!(retry.replayed(), "{key}: {}", retry.describe());
        assert_eq!(retry.json()["id"], json!(id), "{key}");
    }
    assert_eq!(
        behind.row_counts().await,
        (40, 40, 40),
        "one record, entry and event per key"
    );
}

#[actix_web::test]
async fn a_daemon_a_day_ahead_does_not_make_records_outlive_their_retention() {
    if !have_libfaketime() {
        return;
    }
    let ahead = spawn_binary(test_settings(), &skewed("+25h")).await;
    let keys: Vec<String> = (0..5).map(|n| format!("ahead-{n}")).collect();
    let ids = write_all(&ahead, &keys).await;
    for key in &keys {
        assert_lives_a_retention(key, record_times(&ahead, key).await);
    }
    // What the key lookup shows agrees: created now, expiring a retention later.
    let lookup = ahead.get("/v1/idempotency-keys/ahead-0", None).await.json();
    assert_eq!(lookup["entry_id"], json!(ids[0]));
    let created =
        chrono::DateTime::parse_from_rfc3339(lookup["created_at"].as_str().unwrap()).unwrap();
    let expires =
        chrono::DateTime::parse_from_rfc3339(lookup["expires_at"].as_str().unwrap()).unwrap();
    let life = (expires - created).num_seconds();
    assert!(
        (24 * 3600 - 5..=24 * 3600 + 5).contains(&life),
        "{lookup}: lives {life} s"
    );
    // A janitor pass at the database's time deletes nothing of them: they have not expired.
    let report = retrysafe::janitor::purge_once(
        &retrysafe::db::Database::new(&ahead.config().database).unwrap(),
        Duration::from_secs(7 * 24 * 3600),
    )
    .await
    .unwrap();
    assert_eq!(report.records_deleted, 0);
}

/// The daemon's wall clock stepped back 25 hours while it writes (libfaketime reading its
/// offset from a file the test rewrites; the monotonic clock stays real): every entry is still
/// stamped within a second of the database's time, the one its write's events got from the
/// database's `now()`. An estimate made from the wall clock and the offset of the reading
/// before the step would be 25 hours off, and one from a reading that spans the step 12.5.
#[actix_web::test]
async fn entries_written_across_a_step_of_the_clock_are_stamped_with_the_databases_time() {
    if !have_libfaketime() {
        return;
    }
    let offset_file =
        std::env::temp_dir().join(format!("retrysafe-clock-{}", uuid::Uuid::new_v4()));
    std::fs::write(&offset_file, "+0\n").unwrap();
    let env = vec![
        ("LD_PRELOAD", LIBFAKETIME.to_owned()),
        ("FAKETIME_TIMESTAMP_FILE", offset_file.display().to_string()),
        // Read again at most once a second, not at every clock reading.
        ("FAKETIME_CACHE_DURATION", "1".to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ("RETRYSAFE_LOG__LEVEL", "info".to_owned()),
    ];
    let daemon = spawn_binary(test_settings(), &env).await;
    let written = std::sync::atomic::AtomicUsize::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let writer = |task: usize| {
        let (daemon, written, stop) = (&daemon, &written, &stop);
        async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let key = format!("step-{task}-{n}");
                daemon
                    .post_entry(&key, &entry_body(n))
                    .await
                    .assert_created();
                written.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                n += 1;
            }
        }
    };
    let step = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        std::fs::write(&offset_file, "-25h\n").unwrap();
        tokio::time::sleep(Duration::from_secs(4)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    };
    futures_util::join!(join_all((0..8).map(writer)), step);
    let _ = std::fs::remove_file(&offset_file);

    assert!(
        daemon
            .log_text()
            .contains("this machine's clock differs from the database's"),
        "the step happened and was seen: {}",
        daemon.log_tail(20)
    );
    let total = written.load(std::sync::atomic::Ordering::Relaxed) as i64;
    assert_eq!(daemon.count("SELECT count(*) FROM entries").await, total);
    // Each entry against its entry.created event, whose created_at is the database's now() in
    // the write's own statement.
    let off = daemon
        .db
        .query(
            "SELECT e.idempotency_key, e.created_at::text, o.created_at::text
             FROM entries e JOIN outbox_events o ON o.event_key = e.id || '/entry.created'
             WHERE abs(extract(epoch FROM e.created_at - o.created_at)) > 1",
            &[],
        )
        .await
        .unwrap();
    let described: Vec<String> = off
        .iter()
        .map(|row| {
            format!(
                "{}: stamped {}, written at {}",
                row.get::<_, String>(0),
                row.get::<_, String>(1),
                row.get::<_, String>(2)
            )
        })
        .collect();
    assert!(
        described.is_empty(),
        "{} of {total} entries stamped over a second off the database's time: {described:?}",
        described.len()
    );
}
