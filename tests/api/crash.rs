//! Crashes of the real binary at the failpoints: nothing committed is lost, and the inbox turns
//! the resulting redelivery into one effect.

use std::time::Duration;

use retrysafe::inbox::Inbox;

use crate::common::consumer::{message_id, TestConsumer};
use crate::common::daemon::spawn_binary;
use crate::common::helpers::{count_is, entry_body, eventually, test_settings};

const WAIT: Duration = Duration::from_secs(30);

#[actix_web::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs the binary built with --features failpoints"
)]
async fn a_crash_after_publish_redelivers_the_event_and_the_inbox_applies_it_once() {
    let settings = test_settings();
    let mut consumer = TestConsumer::bind(&settings.amqp.exchange, "#").await;

    // First run: the relay publishes, gets the confirm, and aborts before writing sent_at.
    let mut daemon = spawn_binary(
        settings,
        &[("FAILPOINTS", "outbox-after-publish=return".into())],
    )
    .await;
    daemon
        .post_entry("crash-1", &entry_body(1))
        .await
        .assert_created();
    let status = daemon.wait_for_exit().await;
    assert!(
        !status.success(),
        "the failpoint aborts the process: {status}"
    );
    assert!(
        daemon.log_text().contains("outbox-after-publish"),
        "{}",
        daemon.log_text()
    );

    daemon
        .db
        .batch_execute("CREATE TABLE effects (event_id uuid NOT NULL)")
        .await
        .unwrap();
    assert_eq!(
        daemon
            .count("SELECT count(*) FROM outbox_events WHERE sent_at IS NULL")
            .await,
        1,
        "the crash came before sent_at was written"
    );

    let inbox = Inbox::new("crash-test");
    let first = consumer
        .next(WAIT)
        .await
        .expect("published before the crash");

    // Second run, without the failpoint: the same event is published again.
    daemon.restart_with(&[]).await;
    let second = consumer
        .next(WAIT)
        .await
        .expect("published again after the restart");
    assert_eq!(
        message_id(&first),
        message_id(&second),
        "the same message_id both times"
    );

    for delivery in [&first, &second] {
        let event_id = message_id(delivery).parse().unwrap();
        if let Some(transaction) = inbox.begin(&mut daemon.db, event_id).await.unwrap() {
            transaction
                .execute("INSERT INTO effects VALUES ($1)", &[&event_id])
                .await
                .unwrap();
            transaction.commit().await.unwrap();
        }
    }
    assert_eq!(
        daemon.count("SELECT count(*) FROM effects").await,
        1,
        "the inbox applies the effect once"
    );

    // The row ends with sent_at set.
    eventually(WAIT, || {
        count_is(
            &daemon.db,
            "SELECT count(*) FROM outbox_events WHERE sent_at IS NOT NULL",
            1,
        )
    })
    .await;

    daemon.signal("TERM");
    let status = daemon.wait_for_exit().await;
    assert!(
        status.success(),
        "SIGTERM exits 0: {status}\n{}",
        daemon.log_text()
    );
}
