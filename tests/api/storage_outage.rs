//! PostgreSQL out of reach: 503 promptly, nothing saved, and recovery without a restart.

use std::net::SocketAddr;

use crate::common::daemon::spawn_app_with;
use crate::common::helpers::{entry_body, reach_database_through, PG_HOST_PORT};
use crate::common::proxy::TcpProxy;

#[actix_web::test]
async fn an_unreachable_database_gives_503_and_the_same_key_succeeds_once_it_is_back() {
    let proxy = TcpProxy::start(PG_HOST_PORT.parse::<SocketAddr>().unwrap()).await;
    let port = proxy.port;
    let app = spawn_app_with(|settings| {
        reach_database_through(settings, port);
        // The first write after the outage opens a new connection within this bound; the
        // harness's 1 s is tight on a loaded machine (a slower connection would make that
        // write a 503). While the proxy is cut every attempt fails at once, and a 503 comes
        // when this bound has passed.
        settings.database.connect_timeout = std::time::Duration::from_secs(3);
    })
    .await;
    app.post_entry("before-outage", &entry_body(0))
        .await
        .assert_created();

    proxy.cut();
    let body = entry_body(1);
    for _ in 0..3 {
        let response = app.post_entry("during-outage", &body).await;
        response.assert_problem(503, "storage-unavailable");
        assert!(response
            .header("retry-after")
            .is_some_and(|v| v.parse::<u32>().is_ok()));
    }
    let ready = app.readyz_once(|ready| ready.status == 503).await;
    assert_eq!(ready.json()["database"], "down");
    // A replay of a completed key is still answered from memory.
    let replay = app.post_entry("before-outage", &entry_body(0)).await;
    replay.assert_created();
    assert!(replay.replayed());
    assert_eq!(
        app.count("select count(*) from idempotency_records where key = 'during-outage'")
            .await,
        0,
        "nothing is saved while the database is out of reach"
    );
    assert_eq!(app.row_counts().await, (1, 1, 1));

    proxy.restore();
    let response = app.post_entry("during-outage", &body).await;
    response.assert_created();
    assert_eq!(
        response.header("idempotency-replayed"),
        None,
        "the retry runs afresh"
    );
    app.readyz_once(|ready| ready.status == 200).await;
    assert_eq!(app.row_counts().await, (2, 2, 2));
}
