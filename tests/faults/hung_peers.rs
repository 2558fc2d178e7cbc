//! Peers that hang instead of dying: the TCP connection stays up (the kernel acknowledges what
//! is sent) but no answer ever comes, as with a SIGSTOPped server, a paused VM or a hung disk.
//! Here a proxy freezes one of two routes to the same server; tests/ha does it to a real
//! primary of an HA formation and a real node of a RabbitMQ cluster.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::consumer::{message_id, TestConsumer};
use crate::common::daemon::spawn_app_with;
use crate::common::helpers::{
    all_event_ids, count_is, eventually, http_client, post_raw, TestResponse,
};
use crate::common::helpers::{amqp_url_through, entry_body, AMQP_HOST_PORT, PG_HOST_PORT};
use crate::common::proxy::TcpProxy;

use retrysafe::config::UrlList;

/// Posts `key` until the daemon answers 201, each attempt bounded by a generous client timeout
/// (a hang fails the test instead of stalling it); returns every answer.
async fn post_until_created(address: &str, key: &str, body: &str) -> Vec<TestResponse> {
    let client = http_client(Duration::from_secs(60));
    let mut answers = Vec::new();
    for _ in 0..100 {
        let answer = post_raw(&client, address, key, body, Duration::from_secs(60))
            .await
            .unwrap_or_else(|error| panic!("{key}: no answer: {error}"));
        let created = answer.status == 201;
        assert!(
            created || answer.is_storage_unavailable(),
            "{key}: unexpected {}",
            answer.describe()
        );
        answers.push(answer);
        if created {
            return answers;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{key}: never created");
}

#[actix_web::test]
async fn a_hung_database_host_costs_503s_then_writes_go_to_the_other_host_without_a_restart() {
    let target: SocketAddr = PG_HOST_PORT.parse().unwrap();
    let first = TcpProxy::start(target).await;
    let second = TcpProxy::start(target).await;
    let (first_port, second_port) = (first.port, second.port);
    let app = spawn_app_with(|settings| {
        // Two hosts in the URL, both the same read-write server behind a proxy each: freezing
        // the first is a primary that hangs, with the second standing in for the promoted one.
        settings.database.url = (settings.database.url.replace(
            PG_HOST_PORT,
            &format!("127.0.0.1:{first_port},127.0.0.1:{second_port}"),
        ) + "?target_session_attrs=read-write")
            .into();
        settings.database.statement_timeout = Duration::from_secs(1);
        settings.database.connect_timeout = Duration::from_secs(1);
    })
    .await;
    let body = entry_body(1).to_string();
    let before = post_until_created(&app.address, "before-the-hang", &body).await;
    assert_eq!(before.len(), 1, "the first host answers at first");

    first.freeze();
    let frozen_at = Instant::now();
    let answers = post_until_created(&app.address, "during-the-hang", &body).await;
    let recovered_after = frozen_at.elapsed();
    eprintln!(
        "hung database host: {} answer(s), the last 201, {recovered_after:?} after the freeze",
        answers.len()
    );
    // Readiness answers too (503 or 200, but an answer), and no request hangs.
    let ready = app.get("/readyz", None).await;
    assert!(matches!(ready.status, 200 | 503), "{}", ready.status);

    // Every write from now on goes to the second host, which answered last.
    for n in 0..5 {
        let key = format!("after-the-hang-{n}");
        let answers = post_until_created(&app.address, &key, &body).await;
        assert_eq!(answers.len(), 1, "{key}: {}", answers[0].describe());
    }
    first.thaw();
    assert_eq!(
        app.row_counts().await,
        (7, 7, 7),
        "one record, entry and event per key, none twice"
    );
}

#[actix_web::test]
async fn a_hung_broker_is_left_for_the_next_one_and_no_event_is_lost() {
    let target: SocketAddr = AMQP_HOST_PORT.parse().unwrap();
    let first = TcpProxy::start(target).await;
    let second = TcpProxy::start(target).await;
    let urls: Vec<String> = [first.port, second.port]
        .iter()
        .map(|&port| amqp_url_through(port))
        .collect();
    let app = spawn_app_with(|settings| {
        settings.amqp.url = UrlList(urls);
        settings.outbox.confirm_timeout = Duration::from_secs(1);
    })
    .await;
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;

    let body = entry_body(1).to_string();
    post_until_created(&app.address, "before-the-hang", &body).await;
    let first_delivery = consumer
        .next(Duration::from_secs(30))
        .await
        .expect("delivered through the first broker");

    first.freeze();
    for n in 0..20 {
        post_until_created(&app.address, &format!("during-the-hang-{n}"), &body).await;
    }
    let mut delivered: HashSet<String> = HashSet::from([message_id(&first_delivery)]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while delivered.len() < 21 && Instant::now() < deadline {
        if let Some(delivery) = consumer.next(Duration::from_secs(5)).await {
            delivered.insert(message_id(&delivery));
        }
    }
    first.thaw();
    let event_ids: HashSet<String> = all_event_ids(&app.db)
        .await
        .iter()
        .map(uuid::Uuid::to_string)
        .collect();
    assert_eq!(event_ids.len(), 21);
    assert_eq!(delivered, event_ids, "every committed event arrived");
    // Marked sent only once confirmed: give the relay's transaction a moment to commit.
    let unsent = "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL";
    eventually(Duration::from_secs(30), || count_is(&app.db, unsent, 0)).await;
}
