//! What a client sees on Citus is what it sees on one server: created, replayed, refused,
//! looked up, listed, its events delivered with their ids, ordered writes numbered; and every
//! write is a transaction on one shard, committed without a two-phase commit.

use std::time::Duration;

use retrysafe::config::Settings;
use serde_json::json;

use crate::common::citus::CitusLab;
use crate::common::cli::{retrysafe, stderr};
use crate::common::consumer::TestConsumer;
use crate::common::daemon::{spawn_app_on, TestDaemon};
use crate::common::helpers::{client, count, eventually, TestResponse};
use crate::common::load::{every_third_ordered, Load, Writer};
use crate::common::ordering::assert_all_delivered_in_order;

/// Clients configured for the tests, with their tokens (`token-<id>`).
pub const CLIENTS: [&str; 6] = ["billing", "shipping", "ledger", "audit", "crm", "search"];

pub fn token(client: &str) -> String {
    format!("token-{client}")
}

/// A daemon on the lab with [`CLIENTS`] configured.
pub async fn daemon_on(lab: &CitusLab) -> TestDaemon {
    spawn_app_on(&lab.url(), true, with_clients).await
}

/// [`CLIENTS`] configured in `settings`.
pub fn with_clients(settings: &mut Settings) {
    settings.auth.clients = CLIENTS.iter().map(|id| client(id, &token(id))).collect();
}

/// Two of [`CLIENTS`] whose rows are on different workers.
pub fn clients_on_two_workers(lab: &CitusLab) -> (&'static str, &'static str) {
    let first = CLIENTS[0];
    let first_port = lab.worker_of(first).port;
    let second = CLIENTS[1..]
        .iter()
        .find(|client| lab.worker_of(client).port != first_port)
        .expect("the clients spread over both workers");
    (first, second)
}

pub fn body(n: i64) -> serde_json::Value {
    json!({"kind": "invoice.paid", "data": {"invoice": n}})
}

/// Load on `app`: a loop for each of `clients` (a client named twice has two), writing keys
/// `{prefix}-{loop}-{n}` with its token, every third write ordered.
pub fn load_of(app: &TestDaemon, prefix: &str, clients: &[&str]) -> Load {
    let writers = clients
        .iter()
        .map(|client| Writer {
            token: Some(token(client)),
            body: every_third_ordered,
        })
        .collect();
    Load::start_writers(&app.address, prefix, writers)
}

/// `client`'s write of `key`, again until it is answered 2xx (as a caller's retries do), for
/// at most `limit`.
pub async fn until_answered(
    app: &TestDaemon,
    client: &str,
    (key, body): (&str, &serde_json::Value),
    limit: Duration,
) -> TestResponse {
    eventually(limit, || async {
        let answer = app.post_entry_as(Some(&token(client)), key, body).await;
        match answer.status {
            200 | 201 => Ok(answer),
            _ => Err(answer.describe()),
        }
    })
    .await
}

#[actix_web::test]
async fn a_client_gets_on_citus_what_it_gets_on_one_server_in_single_shard_transactions() {
    let Some(lab) = CitusLab::start_if_available() else {
        return;
    };
    let app = daemon_on(&lab).await;
    let distributed = lab.sql(
        "SELECT string_agg(logicalrelid::text || ':' || partmethod::text, ',' ORDER BY logicalrelid::text)
         FROM pg_dist_partition",
    );
    for table in [
        "entries:h",
        "event_replays:h",
        "idempotency_records:h",
        "ordering_keys:h",
        "outbox_events:h",
        "outbox_skips:h",
        "replays:n",
    ] {
        assert!(distributed.contains(table), "{table} in {distributed}");
    }
    let (first, second) = clients_on_two_workers(&lab);
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    let two_phase_before = lab.two_phase_commits();
    lab.sql("SELECT citus_stat_counters_reset()");

    let mut ids = Vec::new();
    for client in [first, second] {
        let token = token(client);
        let token = Some(token.as_str());
        let created = app.post_entry_as(token, "invoice-1", &body(1)).await;
        created.assert_created();
        assert!(!created.replayed());
        let replay = app.post_entry_as(token, "invoice-1", &body(1)).await;
        replay.assert_created();
        assert!(replay.replayed(), "{}", replay.describe());
        assert_eq!(replay.body, created.body, "replayed byte for byte");
        app.post_entry_as(token, "invoice-1", &body(2))
            .await
            .assert_problem(409, "idempotency-key-reused");
        let id = created.json()["id"].as_str().unwrap().to_owned();
        let got = app.get(&format!("/v1/entries/{id}"), token).await;
        assert_eq!(got.status, 200, "{}", got.describe());
        let lookup = app.get("/v1/idempotency-keys/invoice-1", token).await;
        assert_eq!(lookup.status, 200, "{}", lookup.describe());
        assert_eq!(lookup.json()["entry_id"], json!(id));
        assert_eq!(lookup.json()["events"].as_array().unwrap().len(), 1);
        let listed = app.get("/v1/entries", token).await;
        assert_eq!(listed.status, 200, "{}", listed.describe());
        assert_eq!(listed.json()["entries"][0]["id"], json!(id));
        // Ordered writes of one key, numbered in commit order.
        for n in 1..=3 {
            let ordered = app
                .post_entry_as(
                    token,
                    &format!("ordered-{n}"),
                    &json!({"kind": "k", "data": {"n": n}, "ordering_key": "account-7"}),
                )
                .await;
            ordered.assert_created();
            assert_eq!(
                ordered.json()["sequence"],
                json!(n),
                "{}",
                ordered.describe()
            );
        }
        ids.push(id);
    }
    // A client sees its own entries only, on whichever worker they are.
    let other = token(second);
    app.get(&format!("/v1/entries/{}", ids[0]), Some(&other))
        .await
        .assert_problem(404, "not-found");

    // Every event is published, and each ordering key's first deliveries come in order: each
    // client's 1, 2, 3.
    let (events, order) =
        assert_all_delivered_in_order(&app.db, &mut consumer, Duration::from_secs(60)).await;
    assert_eq!(events, 8);
    assert_eq!(
        order.first_deliveries(),
        6,
        "each client's three ordered writes"
    );
    assert_eq!(
        lab.two_phase_commits(),
        two_phase_before,
        "no write, relay batch or janitor pass made a two-phase commit"
    );
    let multi_shard: i64 = lab
        .sql("SELECT query_execution_multi_shard FROM citus_stat_counters WHERE name = 'retrysafe'")
        .parse()
        .unwrap();
    let single_shard: i64 = lab
        .sql(
            "SELECT query_execution_single_shard FROM citus_stat_counters WHERE name = 'retrysafe'",
        )
        .parse()
        .unwrap();
    assert!(single_shard > 0);
    eprintln!(
        "citus: {single_shard} single-shard and {multi_shard} multi-shard queries (the gauges' and the discovery's reads), no two-phase commit"
    );
    assert_eq!(count(&app.db, "SELECT count(*) FROM entries").await, 8);
}

/// Citus turns TLS on with a self-signed X.509 v1 certificate of its own. `sslmode=require`
/// takes it as libpq does (encrypted, nothing verified); `verify-ca` cannot verify a v1
/// certificate, and says so.
#[actix_web::test]
async fn the_coordinators_own_v1_certificate_is_taken_with_sslmode_require_and_refused_with_a_reason_when_verifying(
) {
    let Some(lab) = CitusLab::start_if_available() else {
        return;
    };
    // The daemon's URL asks for TLS; the test's own connection (NoTls) goes without.
    let app = spawn_app_on(&lab.url(), true, |settings| {
        with_clients(settings);
        settings.database.url = format!("{}?sslmode=require", lab.url()).into();
    })
    .await;
    app.post_entry_as(Some(&token(CLIENTS[0])), "over-tls", &body(1))
        .await
        .assert_created();
    let encrypted: i64 = lab
        .sql(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE s.ssl AND a.datname = 'retrysafe' AND a.client_addr IS NOT NULL
               AND a.application_name NOT LIKE 'citus%'",
        )
        .parse()
        .unwrap();
    assert!(encrypted > 0, "the daemon's connections are encrypted");

    let certificate = lab.coordinator.data().join("server.crt");
    let version = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in"])
        .arg(&certificate)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&version.stdout).contains("Version: 1 (0x0)"),
        "Citus made a v1 certificate"
    );
    let url = format!(
        "{}?sslmode=verify-ca&sslrootcert={}",
        lab.url(),
        certificate.display()
    );
    let refused = retrysafe(
        &["migrate"],
        &[
            ("RETRYSAFE_DATABASE__URL", url.as_str()),
            ("RETRYSAFE_DATABASE__START_TIMEOUT", "1s"),
        ],
    );
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains(
            "an X.509 v1 certificate (as Citus makes for itself), which cannot be verified"
        ),
        "{}",
        stderr(&refused)
    );
}
