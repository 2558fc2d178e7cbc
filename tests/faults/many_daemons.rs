//! Three daemons on one database and broker, with the same keys sent to all of them at once:
//! one entry per key, one identical answer per key, one publish per event.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures_util::future::join_all;

use crate::common::consumer::{message_id, TestConsumer};
use crate::common::daemon::{spawn_app_with, spawn_second_app};
use crate::common::helpers::{
    assert_nothing_half_written, count, count_is, eventually, knob, TestResponse,
};

/// The same request body spelled `variant` ways: member order and white space differ, the
/// request hash does not.
fn spelling(key: &str, n: usize, variant: usize) -> String {
    match variant % 3 {
        0 => format!(
            r#"{{"kind":"fleet.write","data":{{"key":"{key}","n":{n},"tags":["a","b"],"nested":{{"x":1,"y":null}}}}}}"#
        ),
        1 => format!(
            "{{ \"data\" : {{ \"nested\" : {{\"y\":null, \"x\":1}}, \"tags\":[\"a\", \"b\"],\n \"n\" : {n}, \"key\":\"{key}\" }},\n\t\"kind\" : \"fleet.write\" }}"
        ),
        _ => format!(
            r#"{{"data":{{"n":{n},"nested":{{"x":1,"y":null}},"key":"{key}","tags":["a","b"]}},"kind":"fleet.write"}}"#
        ),
    }
}

#[actix_web::test]
async fn three_daemons_sharing_keys_write_once_answer_identically_and_publish_once() {
    let keys = knob("RETRYSAFE_FAULT_FLEET_KEYS", 80);
    let copies_per_daemon = 2;
    let first = spawn_app_with(|settings| {
        settings.database.pool_size = 6;
    })
    .await;
    let second = spawn_second_app(&first).await;
    let third = spawn_second_app(&first).await;
    let daemons = [&first, &second, &third];
    let mut consumer = TestConsumer::bind(&first.settings.amqp.exchange, "#").await;

    // Every key goes to every daemon, twice, each copy spelled another way; all at once.
    let requests =
        (0..keys).flat_map(|n| (0..daemons.len() * copies_per_daemon).map(move |copy| (n, copy)));
    let answers = join_all(requests.map(|(n, copy)| {
        let app = daemons[copy % daemons.len()];
        let key = format!("fleet-{n}");
        async move {
            let reply = app.post_text(&key, &spelling(&key, n, copy)).await;
            (key, reply)
        }
    }))
    .await;

    let mut by_key: HashMap<String, Vec<TestResponse>> = HashMap::new();
    for (key, reply) in answers {
        by_key.entry(key).or_default().push(reply);
    }
    for (key, replies) in &by_key {
        let first_body = &replies[0].body;
        for reply in replies {
            assert_eq!(reply.status, 201, "{key}: {}", reply.describe());
            assert_eq!(
                &reply.body,
                first_body,
                "{key}: daemons answered with different bodies:\n{}\n{}",
                String::from_utf8_lossy(first_body),
                String::from_utf8_lossy(&reply.body)
            );
            assert_eq!(reply.header("location"), replies[0].header("location"));
        }
        let created = replies.iter().filter(|reply| !reply.replayed()).count();
        assert_eq!(
            created, 1,
            "{key}: {created} answers claim to have created the entry; the rest are replays"
        );
    }

    let db = &first.db;
    assert_eq!(
        assert_nothing_half_written(db, 1).await,
        keys as i64,
        "one record per key"
    );
    assert_eq!(count(db, "SELECT count(*) FROM entries").await, keys as i64);

    // Each event exactly once: nothing crashed, so nothing may be published twice.
    let mut seen = HashSet::new();
    while seen.len() < keys {
        let delivery = consumer
            .next(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("{} of {keys} events delivered", seen.len()));
        let id = message_id(&delivery);
        assert!(seen.insert(id.clone()), "{id} published twice");
    }
    let unsent = "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL";
    eventually(Duration::from_secs(30), || count_is(db, unsent, 0)).await;
    assert!(
        consumer.next(Duration::from_secs(1)).await.is_none(),
        "an event was published twice"
    );
}

/// Numbers that PostgreSQL's jsonb spells differently from serde_json: a replay read back from
/// the database (by another daemon, or after a restart or cache eviction) is re-serialized from
/// jsonb's text and no longer matches the first answer byte for byte. Found by this suite; see
/// docs/reliability.md.
#[actix_web::test]
async fn a_replay_from_another_daemon_is_byte_identical_for_every_number() {
    let first = spawn_app_with(|_| {}).await;
    let second = spawn_second_app(&first).await;
    let mut mismatches = Vec::new();
    for (n, literal) in [
        "1e16",
        "-1e17",
        "-0.0",
        "7.089665258415694e-214",
        "1.5",
        "12",
    ]
    .iter()
    .enumerate()
    {
        let key = format!("number-{n}");
        let text = format!(r#"{{"kind":"numbers","data":{{"value":{literal}}}}}"#);
        let created = first.post_text(&key, &text).await;
        created.assert_created();
        // The second daemon has not seen the key: it reads the record back from PostgreSQL.
        let replayed = second.post_text(&key, &text).await;
        replayed.assert_created();
        assert!(replayed.replayed());
        if replayed.body != created.body {
            // The raw text of the number in each body.
            let value = |reply: &TestResponse| {
                let text = String::from_utf8_lossy(&reply.body).into_owned();
                let start = text.find("\"value\":").map_or(0, |i| i + 8);
                let end = text[start..].find('}').map_or(text.len(), |i| start + i);
                text[start..end].to_owned()
            };
            mismatches.push(format!(
                "{literal}: first answer {}, replay {}",
                value(&created),
                value(&replayed)
            ));
        }
    }
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}
