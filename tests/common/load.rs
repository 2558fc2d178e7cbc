//! Clients that write under load, each key retried with the same body until it gets a 2xx, as
//! a job does; what every attempt got, and when, for the assertions and the recovery figures;
//! and the check that the database holds what the clients were told, once each.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::common::consumer::TestConsumer;
use crate::common::helpers::{count, http_client, post_raw_as};
use crate::common::ordering::{assert_all_delivered_in_order, OrderChecker};

/// Bound on one request: a daemon that hangs shows up as a failed attempt, and the client
/// retries. Longer than the daemon's own bound on a write, so a 503 arrives before it.
const REQUEST_LIMIT: Duration = Duration::from_secs(30);
/// A client gives a key up only after this long without an answer: the test then fails.
const KEY_DEADLINE: Duration = Duration::from_secs(300);
/// Pause between two writes of one client, to keep the volume checkable.
const PACE: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx.
    Answered,
    /// 503, 409 `request-in-progress`, a transport error or no answer in time: retried.
    Failed,
}

/// One attempt: by which writer, when it was sent and answered, and how.
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    /// The writer's index in [`Load::start_writers`]' list.
    pub writer: usize,
    pub sent: Instant,
    pub answered: Instant,
    pub outcome: Outcome,
    /// The answer's status; None for a transport failure (refused, reset, no answer in time).
    pub status: Option<u16>,
    /// A 503 `storage-unavailable` with a numeric `Retry-After`.
    pub storage_unavailable: bool,
}

impl Attempt {
    pub fn latency(&self) -> Duration {
        self.answered.duration_since(self.sent)
    }
}

/// One client's loop of writes: its token, and the body of each of its keys.
#[derive(Clone)]
pub struct Writer {
    /// Sent as a bearer token; None writes as the anonymous client.
    pub token: Option<String>,
    /// The body of the writer's `n`th key `key`, the writer being the `writer`th of the load;
    /// its `data.key` must be `key` (a 2xx is checked to be the key's own answer by it).
    pub body: fn(key: &str, writer: usize, n: usize) -> String,
}

#[derive(Default)]
pub struct Records {
    /// Every key that got a 2xx, with the entry id the client was told.
    pub acknowledged: HashMap<String, Uuid>,
    pub attempts: Vec<Attempt>,
    /// Answers the contract does not allow here (a 409 `idempotency-key-reused`, a 2xx for
    /// another key, a 500, ...).
    pub unexpected: Vec<String>,
}

impl Records {
    /// Every answer was one the contract allows.
    pub fn assert_allowed(&self) {
        assert!(
            self.unexpected.is_empty(),
            "answers the contract does not allow: {:?}",
            &self.unexpected[..self.unexpected.len().min(10)]
        );
    }

    /// What the clients were told is what the database at `db` holds, once each: every
    /// acknowledged key has one entry, with the id its client was told, and its record; no
    /// other entry or record exists. (The load's keys are unique whatever their clients.)
    pub async fn assert_held_once(&self, db: &tokio_postgres::Client) {
        let rows = db
            .query("SELECT idempotency_key, id FROM entries", &[])
            .await
            .unwrap();
        let mut held = HashMap::new();
        for row in &rows {
            let key: String = row.get(0);
            let id: Uuid = row.get(1);
            assert!(held.insert(key.clone(), id).is_none(), "{key}: two entries");
        }
        for (key, id) in &self.acknowledged {
            assert_eq!(
                held.get(key),
                Some(id),
                "{key}: acknowledged with {id}, the database holds {:?}",
                held.get(key)
            );
        }
        assert_eq!(
            held.len(),
            self.acknowledged.len(),
            "an entry no client was told about"
        );
        let records = count(db, "SELECT count(*) FROM idempotency_records").await;
        assert_eq!(records as usize, held.len());
    }

    /// [`assert_held_once`](Self::assert_held_once), and each entry's one event published
    /// (within `publish_within`) and delivered to `consumer`, ordered keys in order
    /// ([`assert_all_delivered_in_order`]); returns the checker (its copies).
    pub async fn assert_held_and_delivered(
        &self,
        db: &tokio_postgres::Client,
        consumer: &mut TestConsumer,
        publish_within: Duration,
    ) -> OrderChecker {
        self.assert_held_once(db).await;
        let (events, order) = assert_all_delivered_in_order(db, consumer, publish_within).await;
        assert_eq!(events, self.acknowledged.len(), "one event per entry");
        order
    }
}

pub struct Load {
    stop: Rc<Cell<bool>>,
    pub records: Rc<RefCell<Records>>,
    clients: Vec<actix_web::rt::task::JoinHandle<()>>,
}

/// Ordering keys the clients share: a key's writes come from several clients, interleaved.
/// A key has one event in flight at a time, so the backlog a frozen broker node leaves drains
/// at about this many events per relay round trip: with 8 keys, the ~12,000 writes of a
/// 70-80 s freeze took minutes to drain on a loaded machine.
const ORDERING_KEYS: usize = 64;

/// Every write is ordered, on one of a few keys the clients share, so that the tests can check
/// the order of first deliveries through the faults too.
fn body_for(key: &str, client: usize, n: usize) -> String {
    serde_json::json!({
        "kind": "ha.test",
        "data": {"key": key, "n": n},
        "ordering_key": format!("ha-{}", (client + n) % ORDERING_KEYS),
    })
    .to_string()
}

/// A body whose every third write is ordered, on the client's key `account` (every loop of a
/// client shares it).
pub fn every_third_ordered(key: &str, _writer: usize, n: usize) -> String {
    let mut body = serde_json::json!({"kind": "load", "data": {"key": key, "n": n}});
    if n.is_multiple_of(3) {
        body["ordering_key"] = serde_json::json!("account");
    }
    body.to_string()
}

impl Load {
    /// Starts `clients` anonymous clients writing keys `{prefix}-{client}-{n}` to the daemon at
    /// `base`, every write ordered on keys they share ([`body_for`]).
    pub fn start(base: &str, prefix: &str, clients: usize) -> Self {
        let anonymous = Writer {
            token: None,
            body: body_for,
        };
        Self::start_writers(base, prefix, vec![anonymous; clients])
    }

    /// Starts a loop for each of `writers`, the `w`th writing keys `{prefix}-{w}-{n}` to the
    /// daemon at `base`.
    pub fn start_writers(base: &str, prefix: &str, writers: Vec<Writer>) -> Self {
        let stop = Rc::new(Cell::new(false));
        let records = Rc::new(RefCell::new(Records::default()));
        let clients = writers
            .into_iter()
            .enumerate()
            .map(|(client, writer)| {
                let (stop, records) = (stop.clone(), records.clone());
                let (base, prefix) = (base.to_owned(), prefix.to_owned());
                actix_web::rt::spawn(async move {
                    let http = http_client(REQUEST_LIMIT);
                    let mut n = 0;
                    while !stop.get() {
                        let key = format!("{prefix}-{client}-{n}");
                        let sender = Sender {
                            http: &http,
                            base: &base,
                            token: writer.token.as_deref(),
                            writer: client,
                        };
                        sender
                            .write_until_answered(&key, &(writer.body)(&key, client, n), &records)
                            .await;
                        n += 1;
                        tokio::time::sleep(PACE).await;
                    }
                })
            })
            .collect();
        Self {
            stop,
            records,
            clients,
        }
    }

    /// Lets every client finish its key (an unanswered key is not left in doubt), then stops.
    pub async fn stop(self) -> Records {
        self.stop.set(true);
        for client in self.clients {
            client.await.expect("a client task does not panic");
        }
        Rc::try_unwrap(self.records)
            .ok()
            .expect("the clients are gone")
            .into_inner()
    }

    /// Waits until writes flow again after a fault at `fault`: at least 20 attempts sent after
    /// `since` answered, and none failed after them. Returns what the window looked like.
    pub async fn wait_for_recovery(&self, fault: Instant, since: Instant) -> Recovery {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Some(recovery) = self.recovery(fault, since) {
                return recovery;
            }
            assert!(
                Instant::now() < deadline,
                "writes did not flow again within 3 minutes of the fault"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn recovery(&self, fault: Instant, since: Instant) -> Option<Recovery> {
        let records = self.records.borrow();
        let mut window: Vec<&Attempt> = records
            .attempts
            .iter()
            .filter(|attempt| attempt.answered >= fault)
            .collect();
        window.sort_by_key(|attempt| attempt.answered);
        let last_failure = window
            .iter()
            .rposition(|attempt| attempt.outcome == Outcome::Failed);
        let after_failures = &window[last_failure.map_or(0, |index| index + 1)..];
        let fresh_successes = after_failures
            .iter()
            .filter(|attempt| attempt.sent >= since)
            .count();
        if fresh_successes < 20 {
            return None;
        }
        let back_at = match last_failure {
            Some(_) => after_failures[0].answered,
            None => fault,
        };
        Some(Recovery {
            writes_back_after: back_at.saturating_duration_since(fault),
            failed: window
                .iter()
                .filter(|attempt| attempt.outcome == Outcome::Failed)
                .count(),
            answered: window
                .iter()
                .filter(|attempt| attempt.outcome == Outcome::Answered)
                .count(),
        })
    }
}

/// What a fault cost the clients.
#[derive(Debug)]
pub struct Recovery {
    /// From the fault to the first 2xx after the last failed attempt (zero if none failed).
    pub writes_back_after: Duration,
    /// Failed attempts (503s, timeouts, refused connections) since the fault.
    pub failed: usize,
    /// Attempts answered 2xx since the fault.
    pub answered: usize,
}

/// Where one writer sends its writes.
struct Sender<'a> {
    http: &'a awc::Client,
    base: &'a str,
    token: Option<&'a str>,
    writer: usize,
}

impl Sender<'_> {
    async fn write_until_answered(&self, key: &str, body: &str, records: &RefCell<Records>) {
        let deadline = Instant::now() + KEY_DEADLINE;
        let mut backoff = Duration::from_millis(50);
        while Instant::now() < deadline {
            let sent = Instant::now();
            let reply =
                post_raw_as(self.http, self.base, self.token, key, body, REQUEST_LIMIT).await;
            let answered = Instant::now();
            let outcome = match &reply {
                Ok(reply) if (200..300).contains(&reply.status) => {
                    let answer = reply.json();
                    let id: Option<Uuid> = answer["id"].as_str().and_then(|id| id.parse().ok());
                    let mut records = records.borrow_mut();
                    match id {
                        Some(id) if answer["data"]["key"] == key => {
                            if let Some(earlier) = records.acknowledged.insert(key.to_owned(), id) {
                                assert_eq!(earlier, id, "{key}: two different ids");
                            }
                        }
                        _ => records
                            .unexpected
                            .push(format!("{key}: a 2xx for another request: {answer}")),
                    }
                    Outcome::Answered
                }
                Ok(reply)
                    if reply.is_storage_unavailable()
                        || (reply.status == 409
                            && reply.problem_slug().as_deref() == Some("request-in-progress")) =>
                {
                    Outcome::Failed
                }
                Ok(reply) => {
                    records
                        .borrow_mut()
                        .unexpected
                        .push(format!("{key}: {}", reply.describe()));
                    Outcome::Failed
                }
                Err(_transport) => Outcome::Failed,
            };
            records.borrow_mut().attempts.push(Attempt {
                writer: self.writer,
                sent,
                answered,
                outcome,
                status: reply.as_ref().ok().map(|reply| reply.status),
                storage_unavailable: reply
                    .as_ref()
                    .is_ok_and(|reply| reply.is_storage_unavailable()),
            });
            if outcome == Outcome::Answered {
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
        records
            .borrow_mut()
            .unexpected
            .push(format!("{key}: no answer within {KEY_DEADLINE:?}"));
    }
}
