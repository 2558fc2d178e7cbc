//! Several daemons and clients on one Citus cluster: the same keys sent to every daemon at
//! once are written once and answered alike, an answer lost on the way is given again by
//! another daemon (read back from the shards), every event is published once, and no write is
//! a two-phase commit.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::future::join_all;

use crate::acceptance::{body, daemon_on, token, CLIENTS};
use crate::common::citus::CitusLab;
use crate::common::consumer::{message_id, TestConsumer};
use crate::common::daemon::spawn_second_app;
use crate::common::helpers::{count, count_is, eventually, http_client, TestResponse};
use crate::common::proxy::TcpProxy;

#[actix_web::test]
async fn three_daemons_and_six_clients_write_each_key_once_and_publish_each_event_once() {
    let Some(lab) = CitusLab::start_if_available() else {
        return;
    };
    let first = daemon_on(&lab).await;
    let second = spawn_second_app(&first).await;
    let third = spawn_second_app(&first).await;
    let daemons = [&first, &second, &third];
    let mut consumer = TestConsumer::bind(&first.settings.amqp.exchange, "#").await;
    let two_phase_before = lab.two_phase_commits();

    // Every client's keys go to every daemon, twice, all at once.
    let keys_per_client = 10;
    let requests = CLIENTS.iter().flat_map(|client| {
        (0..keys_per_client).flat_map(move |n| (0..6).map(move |copy| (*client, n, copy)))
    });
    let answers = join_all(requests.map(|(client, n, copy)| async move {
        let token = token(client);
        let key = format!("fleet-{n}");
        let answer = daemons[copy % 3]
            .post_entry_as(Some(&token), &key, &body(n))
            .await;
        ((client, key), answer)
    }))
    .await;
    let mut by_key: HashMap<(&str, String), Vec<TestResponse>> = HashMap::new();
    for (key, answer) in answers {
        by_key.entry(key).or_default().push(answer);
    }
    for (key, answers) in &by_key {
        for answer in answers {
            assert_eq!(answer.status, 201, "{key:?}: {}", answer.describe());
            assert_eq!(answer.body, answers[0].body, "{key:?}: answered alike");
        }
        let created = answers.iter().filter(|answer| !answer.replayed()).count();
        assert_eq!(created, 1, "{key:?}: created once, replayed otherwise");
    }

    // An answer lost on its way back: the client asks another daemon, which reads it back.
    let address: SocketAddr = first.address.trim_start_matches("http://").parse().unwrap();
    let proxy = TcpProxy::start(address).await;
    proxy.lose_next_answers(1);
    let lost = http_client(Duration::from_secs(10))
        .post(format!("http://127.0.0.1:{}/v1/entries", proxy.port))
        .insert_header(("Authorization", format!("Bearer {}", token(CLIENTS[0]))))
        .insert_header(("Idempotency-Key", "answer-lost"))
        .insert_header(("Content-Type", "application/json"))
        .send_body(body(7).to_string())
        .await;
    assert!(lost.is_err(), "the answer was lost");
    assert_eq!(proxy.answers_lost(), 1);
    let again = second
        .post_entry_as(Some(&token(CLIENTS[0])), "answer-lost", &body(7))
        .await;
    again.assert_created();
    assert!(again.replayed(), "{}", again.describe());

    let entries = (CLIENTS.len() * keys_per_client as usize + 1) as i64;
    assert_eq!(
        count(&first.db, "SELECT count(*) FROM entries").await,
        entries
    );
    let unsent = "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL";
    eventually(Duration::from_secs(60), || count_is(&first.db, unsent, 0)).await;
    let mut seen = HashSet::new();
    while seen.len() < entries as usize {
        let delivery = consumer
            .next(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("{} of {entries} events delivered", seen.len()));
        let id = message_id(&delivery);
        assert!(seen.insert(id.clone()), "{id} published twice");
    }
    assert!(
        consumer.next(Duration::from_secs(1)).await.is_none(),
        "an event was published twice"
    );
    assert_eq!(
        lab.two_phase_commits(),
        two_phase_before,
        "no write, relay batch or janitor pass made a two-phase commit"
    );
}
