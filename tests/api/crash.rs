//! Crashes of the real binary at the failpoints: nothing committed is lost, and the inbox turns
//! the resulting redelivery into one effect.

use std::time::Duration;

use retrysafe::inbox::Inbox;
use tokio_postgres::NoTls;

use crate::common::consumer::{message_id, TestConsumer};
use crate::common::daemon::Daemon;
use crate::common::helpers::{entry_body, pg_url, test_settings, TestDatabase, TestExchange};

const WAIT: Duration = Duration::from_secs(30);

#[actix_web::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs the binary built with --features failpoints"
)]
async fn a_crash_after_publish_redelivers_the_event_and_the_inbox_applies_it_once() {
    let settings = test_settings();
    let database_name = settings.database.url.rsplit('/').next().unwrap().to_owned();
    let _database = TestDatabase {
        name: database_name.clone(),
    };
    let _exchange = TestExchange {
        name: settings.amqp.exchange.clone(),
    };
    let env = vec![
        ("RETRYSAFE_DATABASE__URL", settings.database.url.clone()),
        ("RETRYSAFE_AMQP__EXCHANGE", settings.amqp.exchange.clone()),
    ];
    let mut consumer = TestConsumer::bind(&settings.amqp.exchange, "#").await;

    // First run: the relay publishes, gets the confirm, and aborts before writing sent_at.
    let mut with_failpoint = env.clone();
    with_failpoint.push(("FAILPOINTS", "outbox-after-publish=return".into()));
    let mut daemon = Daemon::start(&with_failpoint).await;
    let response = awc::Client::default()
        .post(format!("{}/v1/entries", daemon.address))
        .insert_header(("Idempotency-Key", "crash-1"))
        .insert_header(("Content-Type", "application/json"))
        .send_body(entry_body(1).to_string())
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
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

    let (mut db, connection) = tokio_postgres::connect(&pg_url(&database_name), NoTls)
        .await
        .unwrap();
    actix_web::rt::spawn(connection);
    db.batch_execute("CREATE TABLE effects (event_id uuid NOT NULL)")
        .await
        .unwrap();
    let unsent: i64 = db
        .query_one(
            "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(unsent, 1, "the crash came before sent_at was written");

    let inbox = Inbox::new("crash-test");
    let first = consumer
        .next(WAIT)
        .await
        .expect("published before the crash");

    // Second run, without the failpoint: the same event is published again.
    let mut restarted = Daemon::start(&env).await;
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
        if let Some(transaction) = inbox.begin(&mut db, event_id).await.unwrap() {
            transaction
                .execute("INSERT INTO effects VALUES ($1)", &[&event_id])
                .await
                .unwrap();
            transaction.commit().await.unwrap();
        }
    }
    let effects: i64 = db
        .query_one("SELECT count(*) FROM effects", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(effects, 1, "the inbox applies the effect once");

    let mut sent = 0;
    for _ in 0..300 {
        sent = db
            .query_one(
                "SELECT count(*) FROM outbox_events WHERE sent_at IS NOT NULL",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0);
        if sent == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(sent, 1, "the row ends with sent_at set");

    restarted.signal("TERM");
    let status = restarted.wait_for_exit().await;
    assert!(
        status.success(),
        "SIGTERM exits 0: {status}\n{}",
        restarted.log_text()
    );
    drop(db);
}
