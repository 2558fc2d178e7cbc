//! A write whose commit's wait for the synchronous standby was cancelled, on a pg_auto_failover
//! formation: the primary shows it at once (its client was answered 503), the secondary does not
//! have it. No event of it may reach a queue before the secondary has it: a failover then would
//! leave an event of a write that does not exist.

use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant};

use lapin::message::Delivery;
use tokio_postgres::{Client, NoTls};

use crate::common::consumer::message_id;
use crate::common::helpers::{count, eventually, post_bounded};
use crate::common::lab::Lab;
use crate::common::postgres::SyncRepCanceller;
use crate::postgres::FormationDaemon;

/// How long the secondary's WAL receiver stays stopped: several relay polls, and far from what
/// makes the monitor give up on the standby (pg_auto_failover then lets the primary go on alone,
/// in wait_primary, which would void the test) or from the primary's `wal_sender_timeout`.
const STOPPED_WINDOW: Duration = Duration::from_secs(5);

/// A direct connection to the `retrysafe` database of the lab's node on `port`.
async fn connect_node(port: &str) -> Client {
    let url = format!("postgres://postgres@127.0.0.1:{port}/retrysafe");
    let (db, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    actix_web::rt::spawn(async move {
        let _ = connection.await;
    });
    db
}

fn port_of<'a>(lab: &'a Lab, node: &str) -> &'a str {
    match node {
        "node1" => lab.var("HA_PG_NODE1_PORT"),
        "node2" => lab.var("HA_PG_NODE2_PORT"),
        other => panic!("no such node: {other}"),
    }
}

/// The formation's states as the monitor has them and what the primary promises, for failure
/// messages: pg_auto_failover's keeper may have let the primary go on without its standby
/// (wait_primary, `synchronous_standby_names` empty), and then no commit waits for it.
async fn formation(lab: &Lab, primary: &Client) -> String {
    let states = lab.act(&["status"]).await.replace('\n', " ");
    let names: String = match primary
        .query_one("SELECT current_setting('synchronous_standby_names')", &[])
        .await
    {
        Ok(row) => row.get(0),
        Err(error) => format!("(not read: {error})"),
    };
    format!("{states}; the primary's synchronous_standby_names = '{names}'")
}

/// The secondary's WAL receiver, SIGSTOPped: it receives nothing and confirms nothing, so the
/// primary's commits wait. Resumed when dropped, whatever the test's outcome.
struct StoppedReceiver {
    pid: i32,
}

fn signal(name: &str, pid: i32) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{name} {pid} failed");
}

impl StoppedReceiver {
    async fn stop(secondary: &Client) -> Self {
        let pid: i32 = secondary
            .query_one("SELECT pid FROM pg_stat_wal_receiver", &[])
            .await
            .expect("the secondary runs a WAL receiver")
            .get(0);
        signal("STOP", pid);
        Self { pid }
    }
}

impl Drop for StoppedReceiver {
    fn drop(&mut self) {
        signal("CONT", self.pid);
    }
}

/// Whether the secondary had, when asked, received the entry of the event `delivery` carries:
/// everything up to the WAL it has received and flushed by now is replayed first (a hot standby
/// shows a commit once it is replayed, a moment after it is flushed), then the entry is looked
/// for. The event's entry is found through the primary's outbox row.
async fn secondary_holds_entry_of(
    delivery: &Delivery,
    primary: &Client,
    secondary: &Client,
) -> Result<(), String> {
    let event_id: uuid::Uuid = message_id(delivery).parse().expect("event ids are uuids");
    let row = primary
        .query_one(
            "SELECT client_id, idempotency_key FROM outbox_events WHERE event_id = $1",
            &[&event_id],
        )
        .await
        .unwrap_or_else(|error| panic!("the primary's outbox row of event {event_id}: {error}"));
    let (client_id, key): (String, String) = (row.get(0), row.get(1));
    let received: String = secondary
        .query_one("SELECT pg_last_wal_receive_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    eventually(Duration::from_secs(10), || async {
        let replayed: bool = secondary
            .query_one(
                "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
                &[&received],
            )
            .await
            .map_err(|error| error.to_string())?
            .get(0);
        replayed
            .then_some(())
            .ok_or_else(|| format!("the secondary has not replayed up to {received}"))
    })
    .await;
    let held: i64 = secondary
        .query_one(
            "SELECT count(*) FROM entries WHERE client_id = $1 AND idempotency_key = $2",
            &[&client_id, &key],
        )
        .await
        .unwrap()
        .get(0);
    if held == 1 {
        Ok(())
    } else {
        Err(format!(
            "event {event_id} (key {key}) reached the queue while the secondary lacked its entry (it had received the WAL up to {received})"
        ))
    }
}

fn body(n: u32) -> String {
    serde_json::json!({"kind": "ha.unconfirmed", "data": {"n": n}}).to_string()
}

/// The secondary's WAL receiver is stopped, so the primary's commits wait for it; a write's wait
/// is cancelled (its client gets 503) and the write is then visible on the primary alone. For
/// several seconds no event of it may reach the queue (the build before published it at once);
/// once the receiver resumes, the event is published, and only with the secondary holding the
/// entry; after a switchover, every delivered event's entry is on the new primary.
#[actix_web::test]
async fn no_event_reaches_a_queue_for_a_write_the_promoted_standby_lacks() {
    let lab = Lab::start("pg");
    let FormationDaemon {
        daemon,
        mut consumer,
        exchange: _exchange,
    } = FormationDaemon::start(&lab).await;
    let request_limit = Duration::from_secs(30);
    let mut delivered: HashSet<String> = HashSet::new();

    // A write the standby confirmed: acknowledged, and its event published.
    let before = post_bounded(&daemon.address, "confirmed", &body(0), request_limit).await;
    assert_eq!(before.status, 201, "{}", before.describe());
    let first = consumer
        .next(Duration::from_secs(30))
        .await
        .expect("the confirmed write's event is published");
    delivered.insert(message_id(&first));

    lab.act(&["pg-wait"]).await;
    let primary_node = lab.pg_primary().await;
    let secondary_node = if primary_node == "node1" {
        "node2"
    } else {
        "node1"
    };
    let primary = connect_node(port_of(&lab, &primary_node)).await;
    let secondary = connect_node(port_of(&lab, secondary_node)).await;
    let settled = formation(&lab, &primary).await;
    let names: String = primary
        .query_one("SELECT current_setting('synchronous_standby_names')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        !names.is_empty(),
        "the formation promises no synchronous standby before the test: {settled}"
    );
    let absent = "SELECT count(*) FROM entries WHERE idempotency_key = 'unconfirmed'";

    // The secondary stops receiving; the write's commit waits for it, and the wait is cancelled:
    // the commit stays, on the primary alone, and the client is answered 503.
    let receiver = StoppedReceiver::stop(&secondary).await;
    let stopped_at = Instant::now();
    let canceller = SyncRepCanceller::start(connect_node(port_of(&lab, &primary_node)).await);
    let unconfirmed = post_bounded(&daemon.address, "unconfirmed", &body(1), request_limit).await;
    drop(canceller);
    assert!(
        unconfirmed.is_storage_unavailable(),
        "the write's commit was not held for the stopped standby: {}; formation: {}",
        unconfirmed.describe(),
        formation(&lab, &primary).await
    );
    assert_eq!(
        count(&primary, absent).await,
        1,
        "the primary holds the write whose wait was cancelled"
    );
    let event_id: uuid::Uuid = primary
        .query_one(
            "SELECT event_id FROM outbox_events WHERE idempotency_key = 'unconfirmed'",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    // The stopped window: relays poll every 100 ms and find the event due; none of its
    // deliveries may come while the secondary lacks the entry.
    while stopped_at.elapsed() < STOPPED_WINDOW {
        assert_eq!(
            count(&secondary, absent).await,
            0,
            "the secondary got the write though its WAL receiver is stopped; formation: {}",
            formation(&lab, &primary).await
        );
        if let Some(delivery) = consumer.next(Duration::from_millis(200)).await {
            if let Err(phantom) = secondary_holds_entry_of(&delivery, &primary, &secondary).await {
                panic!(
                    "{phantom}, {:.1}s after the WAL receiver stopped; formation: {}",
                    stopped_at.elapsed().as_secs_f64(),
                    formation(&lab, &primary).await
                );
            }
            delivered.insert(message_id(&delivery));
        }
    }
    let during = formation(&lab, &primary).await;
    assert_eq!(
        lab.pg_primary().await,
        primary_node,
        "the primary changed while the WAL receiver was stopped: {during}"
    );
    eprintln!(
        "no event of the unconfirmed write in {:.1}s with the WAL receiver stopped; formation: {during}",
        stopped_at.elapsed().as_secs_f64()
    );

    // The receiver resumes: the secondary gets the write, and only then is its event published.
    drop(receiver);
    let resumed_at = Instant::now();
    loop {
        let delivery = consumer.next(Duration::from_secs(30)).await.unwrap_or_else(|| {
            panic!("the unconfirmed write's event {event_id} was not published within 30 s of the WAL receiver resuming")
        });
        if let Err(phantom) = secondary_holds_entry_of(&delivery, &primary, &secondary).await {
            panic!("{phantom}, after the WAL receiver resumed");
        }
        let id = message_id(&delivery);
        delivered.insert(id.clone());
        if id == event_id.to_string() {
            break;
        }
    }
    eprintln!(
        "the unconfirmed write's event published {:.1}s after the WAL receiver resumed",
        resumed_at.elapsed().as_secs_f64()
    );

    // A switchover: the old secondary is primary, and holds every delivered event's entry.
    lab.act(&["pg-switchover"]).await;
    lab.act(&["pg-wait"]).await;
    let new_primary_node = lab.pg_primary().await;
    assert_ne!(
        new_primary_node, primary_node,
        "the switchover moved the primary"
    );
    let new_primary = connect_node(port_of(&lab, &new_primary_node)).await;
    for id in &delivered {
        let event_id: uuid::Uuid = id.parse().unwrap();
        let held: i64 = new_primary
            .query_one(
                "SELECT count(*) FROM outbox_events o JOIN entries e
                   ON e.client_id = o.client_id AND e.idempotency_key = o.idempotency_key
                 WHERE o.event_id = $1",
                &[&event_id],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            held, 1,
            "event {id} was delivered, and the new primary lacks its entry"
        );
    }
    // The write the client was answered 503 for survived: its retry gets the entry.
    let saved: uuid::Uuid = new_primary
        .query_one(
            "SELECT entry_id FROM idempotency_records WHERE key = 'unconfirmed'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let retried = eventually(Duration::from_secs(60), || async {
        let answer = post_bounded(&daemon.address, "unconfirmed", &body(1), request_limit).await;
        if answer.status / 100 == 2 {
            Ok(answer)
        } else {
            Err(answer.describe())
        }
    })
    .await;
    assert_eq!(retried.json()["id"], saved.to_string());
    eprintln!(
        "{} events delivered, each of an entry the new primary ({new_primary_node}) holds",
        delivered.len()
    );
    drop(daemon);
}
