//! A pg_auto_failover formation under load: a planned switchover, a crash of the primary (its
//! keeper and PostgreSQL SIGKILLed, restarted later), and a hung primary (SIGSTOPped until the
//! standby is promoted, then resumed).

use std::time::{Duration, Instant};

use tokio_postgres::NoTls;

use crate::common::consumer::TestConsumer;
use crate::common::daemon::DaemonProcess;
use crate::common::helpers::TestExchange;
use crate::common::lab::Lab;
use crate::common::load::{Load, Recovery};

/// Injects a fault on the primary, waits until the other node is primary and writes flow again,
/// then runs `afterwards` (restart or resume the old primary) and waits until the formation has
/// a primary and a secondary again.
async fn fault(
    lab: &Lab,
    load: &Load,
    name: &str,
    inject: &str,
    afterwards: Option<&str>,
) -> Recovery {
    let old_primary = lab.pg_primary().await;
    let at = Instant::now();
    lab.act(&[inject, &old_primary]).await;
    let promoted = loop {
        let primary = lab.pg_primary().await;
        if primary != old_primary {
            break Instant::now();
        }
        assert!(
            at.elapsed() < Duration::from_secs(180),
            "{name}: no failover within 3 minutes"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let recovery = load.wait_for_recovery(at, promoted).await;
    eprintln!(
        "{name} of {old_primary}: new primary after {:.1}s; writes answered 201 again after {:.1}s; {} attempts failed (503 or no answer), {} answered 2xx meanwhile",
        promoted.duration_since(at).as_secs_f64(),
        recovery.writes_back_after.as_secs_f64(),
        recovery.failed,
        recovery.answered
    );
    if let Some(action) = afterwards {
        lab.act(&[action, &old_primary]).await;
    }
    lab.act(&["pg-wait"]).await;
    recovery
}

/// The daemon (the built binary) on the formation's database (`HA_PG_URL`) and an exchange of
/// the test's own, with a queue bound to it. Statements are bounded at 2 s and connection
/// attempts at 1 s, below the defaults, so that a write to a primary that is gone or hung fails
/// within seconds and its retry reaches the new one.
pub struct FormationDaemon {
    pub daemon: DaemonProcess,
    pub consumer: TestConsumer,
    /// Deleted when the test ends.
    pub exchange: TestExchange,
}

impl FormationDaemon {
    pub async fn start(lab: &Lab) -> Self {
        let exchange = TestExchange {
            name: format!("retrysafe.test.{}", uuid::Uuid::new_v4().simple()),
        };
        let consumer = TestConsumer::bind(&exchange.name, "#").await;
        let daemon = DaemonProcess::start(
            lab.var("HA_PG_URL"),
            &exchange.name,
            &[
                ("RETRYSAFE_DATABASE__STATEMENT_TIMEOUT", "2s".into()),
                ("RETRYSAFE_DATABASE__CONNECT_TIMEOUT", "1s".into()),
            ],
        )
        .await;
        Self {
            daemon,
            consumer,
            exchange,
        }
    }
}

#[actix_web::test]
async fn failovers_under_load_lose_no_acknowledged_write_duplicate_none_and_need_no_restart() {
    let lab = Lab::start("pg");
    let url = lab.var("HA_PG_URL").to_owned();
    let FormationDaemon {
        daemon,
        mut consumer,
        exchange: _exchange,
    } = FormationDaemon::start(&lab).await;
    let load = Load::start(&daemon.address, "pg", 6);
    tokio::time::sleep(Duration::from_secs(3)).await;

    fault(&lab, &load, "switchover", "pg-switchover", None).await;
    fault(&lab, &load, "crash", "pg-kill", Some("pg-start")).await;
    fault(&lab, &load, "hang", "pg-freeze", Some("pg-thaw")).await;
    let records = load.stop().await;
    records.assert_allowed();

    // What the clients were told is what the (new) primary holds, once each; every committed
    // event was published and reached the queue, each ordering key's first deliveries in
    // sequence order, through the three failovers.
    let (db, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    actix_web::rt::spawn(connection);
    records
        .assert_held_and_delivered(&db, &mut consumer, Duration::from_secs(120))
        .await;
    eprintln!(
        "{} keys acknowledged, {} attempts in all",
        records.acknowledged.len(),
        records.attempts.len()
    );
    drop(daemon);
}
