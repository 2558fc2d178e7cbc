//! The ordered-delivery checker: what a consumer of one queue sees of the events of ordering
//! keys. First deliveries of each key must come in sequence order without a gap; a copy (a
//! `message_id` seen before) is a redelivery, which the promise allows anywhere.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use lapin::message::Delivery;

use crate::common::consumer::{header, message_id, TestConsumer};
use crate::common::helpers::{count_is, eventually};

/// Every event in the outbox at `db` published (within `publish_within`) and delivered to
/// `consumer`, no other; copies allowed (at least once: a resend after a lost confirm), each
/// ordering key's first deliveries in sequence order. Returns how many events there are, and
/// the checker (its `copies`).
pub async fn assert_all_delivered_in_order(
    db: &tokio_postgres::Client,
    consumer: &mut TestConsumer,
    publish_within: Duration,
) -> (usize, OrderChecker) {
    let unsent = "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL";
    eventually(publish_within, || count_is(db, unsent, 0)).await;
    let expected: HashSet<String> = db
        .query("SELECT event_id::text FROM outbox_events", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut order = OrderChecker::default();
    let mut delivered = HashSet::new();
    while delivered.len() < expected.len() {
        let delivery = consumer
            .next(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| {
                panic!("{} of {} events delivered", delivered.len(), expected.len())
            });
        order.observe(&delivery);
        delivered.insert(message_id(&delivery));
    }
    assert_eq!(
        delivered, expected,
        "every event of a committed write, no other"
    );
    assert_eq!(order.out_of_order(1), Vec::<String>::new());
    (expected.len(), order)
}

#[derive(Default)]
pub struct OrderChecker {
    seen: HashSet<String>,
    /// Per (client, ordering key): the sequences of first deliveries, in delivery order.
    firsts: HashMap<(String, String), Vec<i64>>,
    /// Copies of messages already delivered.
    pub copies: usize,
    /// Deliveries without an ordering key.
    pub unordered: usize,
}

impl OrderChecker {
    pub fn observe(&mut self, delivery: &Delivery) {
        if !self.seen.insert(message_id(delivery)) {
            self.copies += 1;
            return;
        }
        let Some(key) = header(delivery, "ordering-key") else {
            self.unordered += 1;
            return;
        };
        let client = header(delivery, "client-id").expect("every event names its client");
        let sequence: i64 = header(delivery, "sequence")
            .expect("an ordered event has a sequence header")
            .parse()
            .expect("the sequence header is a number");
        self.firsts.entry((client, key)).or_default().push(sequence);
    }

    /// First deliveries received so far.
    pub fn first_deliveries(&self) -> usize {
        self.firsts.values().map(Vec::len).sum()
    }

    /// Keys whose first deliveries are not 1, 2, 3, ... with one event per write (each key's
    /// sequences, as delivered, in the message); empty when every key is in order.
    pub fn out_of_order(&self, events_per_write: usize) -> Vec<String> {
        let mut problems = Vec::new();
        for ((client, key), sequences) in &self.firsts {
            let expected: Vec<i64> = (1..)
                .flat_map(|sequence| std::iter::repeat_n(sequence, events_per_write))
                .take(sequences.len())
                .collect();
            if *sequences != expected {
                problems.push(format!("{client}/{key}: {sequences:?}"));
            }
        }
        problems.sort();
        problems
    }

    /// How many first deliveries each key got.
    pub fn per_key(&self) -> HashMap<String, usize> {
        self.firsts
            .iter()
            .map(|((_, key), sequences)| (key.clone(), sequences.len()))
            .collect()
    }
}
