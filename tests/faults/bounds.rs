//! Every resource a client or a slow database can hold is bounded: probe floods, read floods,
//! writes queued behind a stalled database (in bytes and in time), and batches too large for
//! the statement timeout.

use std::time::Duration;

use futures_util::future::join_all;

use crate::common::daemon::{spawn_app_with, TestDaemon};
use crate::common::helpers::{
    client, count, entry_body, insert_backlog, post_bounded, LockHolder, TestResponse,
};

const REQUEST_LIMIT: Duration = Duration::from_secs(60);

async fn post(app: &TestDaemon, key: &str, body: &str) -> TestResponse {
    post_bounded(&app.address, key, body, REQUEST_LIMIT).await
}

/// Transactions committed in the test's database so far, as PostgreSQL's statistics count them
/// (every query the daemon runs outside a transaction block is one).
async fn commits(app: &TestDaemon) -> i64 {
    app.db
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    count(
        &app.db,
        &format!(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = '{}'",
            app.database.name
        ),
    )
    .await
}

#[actix_web::test]
async fn a_flood_of_readiness_probes_costs_the_database_one_query_a_second_and_no_write_fails() {
    let app = spawn_app_with(|_| {}).await;
    // A large backlog: a probe that counted it would cost a scan each time.
    insert_backlog(&app.db, 20_000).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = commits(&app).await;
    let probing = std::rc::Rc::new(std::cell::Cell::new(true));
    let probes = join_all((0..200).map(|_| {
        let (probing, app) = (probing.clone(), &app);
        async move {
            let mut answered = 0;
            while probing.get() {
                let ready = app.get("/readyz", None).await;
                assert!(matches!(ready.status, 200 | 503));
                answered += 1;
            }
            answered
        }
    }));
    let writes = async {
        let mut statuses = Vec::new();
        for n in 0..20 {
            statuses.push(
                post(
                    &app,
                    &format!("during-probes-{n}"),
                    &entry_body(n).to_string(),
                )
                .await
                .status,
            );
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        probing.set(false);
        statuses
    };
    let (answered, statuses) = tokio::join!(probes, writes);
    let answered: usize = answered.iter().sum();
    assert!(statuses.iter().all(|status| *status == 201), "{statuses:?}");
    // Let the backends report their statistics.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let queries = commits(&app).await - before;
    eprintln!("{answered} probes answered with {queries} transactions in the database, 20 writes included");
    assert!(answered > 200, "the probes ran: {answered}");
    // About one readiness check a second, the gauges every 5 s, and the 20 writes: far fewer
    // than one per probe.
    assert!(
        queries < 150,
        "{queries} transactions for {answered} probes and 20 writes"
    );
}

#[actix_web::test]
async fn a_flood_of_reads_cannot_take_the_connections_writes_need() {
    let app = spawn_app_with(|settings| {
        settings.auth.clients = vec![
            client("reader", "reader-token"),
            client("writer", "writer-token"),
        ];
    })
    .await;
    let created = app
        .post_entry_as(Some("reader-token"), "read-me", &entry_body(0))
        .await;
    created.assert_created();
    let reading = std::rc::Rc::new(std::cell::Cell::new(true));
    let reads = join_all((0..100).map(|_| {
        let (reading, app) = (reading.clone(), &app);
        async move {
            while reading.get() {
                let read = app
                    .get("/v1/idempotency-keys/read-me", Some("reader-token"))
                    .await;
                assert!(matches!(read.status, 200 | 503), "{}", read.status);
            }
        }
    }));
    let pool_size = app.settings.database.pool_size as i64;
    let writes = async {
        let mut statuses = Vec::new();
        let mut most_read_connections = 0;
        for n in 0..30 {
            let response = app
                .post_entry_as(Some("writer-token"), &format!("write-{n}"), &entry_body(n))
                .await;
            statuses.push(response.status);
            let read_connections = count(
                &app.db,
                &format!(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = '{}' AND application_name = 'retrysafe (reads)'",
                    app.database.name
                ),
            )
            .await;
            most_read_connections = most_read_connections.max(read_connections);
        }
        reading.set(false);
        (statuses, most_read_connections)
    };
    let (_, (statuses, most_read_connections)) = tokio::join!(reads, writes);
    assert!(
        statuses.iter().all(|status| *status == 201),
        "writes failed under a flood of reads: {statuses:?}"
    );
    assert!(
        most_read_connections >= 1 && most_read_connections <= (pool_size / 4).max(1),
        "reads held {most_read_connections} connections of {pool_size}"
    );
}

#[actix_web::test]
async fn writes_queued_behind_a_stalled_database_are_bounded_in_bytes_and_answered_in_time() {
    let app = spawn_app_with(|settings| {
        settings.database.max_pending_bytes = 1024 * 1024;
        // Long enough that, on a loaded machine too, the bodies are decoded (each waits at
        // most this for a turn on the blocking pool) and reach the pending bound; well below
        // the statement timeout, which is what must not decide when clients are answered.
        settings.idempotency.wait_timeout = Duration::from_secs(5);
        // The server would give up on the lock only after this: the daemon's own bound is what
        // answers the clients.
        settings.database.statement_timeout = Duration::from_secs(30);
    })
    .await;
    let body = |n: usize| {
        serde_json::json!({"kind": "bulk", "data": {"n": n, "pad": "x".repeat(60 * 1024)}})
            .to_string()
    };
    let stall = LockHolder::take(
        &app.database.name,
        "LOCK TABLE idempotency_records IN ACCESS EXCLUSIVE MODE",
    )
    .await;
    let stalled_at = std::time::Instant::now();
    let answers = join_all((0..40).map(|n| {
        let (app, body) = (&app, body(n));
        async move { (n, post(app, &format!("bulk-{n}"), &body).await) }
    }))
    .await;
    let answered_while_stalled = stalled_at.elapsed();
    let pending_bytes_metric = app.get("/metrics", None).await;
    stall.release().await;

    // Every one was answered while the database was still stalled: none waited for it.
    assert!(
        answered_while_stalled < Duration::from_secs(30),
        "answers took {answered_while_stalled:?}"
    );
    let mut shed = 0;
    for (n, answer) in &answers {
        assert!(
            answer.is_storage_unavailable(),
            "bulk-{n}: {}",
            answer.describe()
        );
        if answer.json()["detail"]
            .as_str()
            .is_some_and(|detail| detail.contains("pending"))
        {
            shed += 1;
        }
    }
    assert!(
        shed > 0,
        "with 40 writes of 60 KiB and a 1 MiB bound, some must be refused at once"
    );
    let metrics = String::from_utf8_lossy(&pending_bytes_metric.body).into_owned();
    let pending: f64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("retrysafe_pending_write_bytes "))
        .and_then(|value| value.trim().parse().ok())
        .expect("the pending bytes gauge is exported");
    assert!(pending <= 1024.0 * 1024.0, "{pending} bytes pending");

    // The 503s said "retry with the same key": every key retried gets exactly one entry.
    for (n, _) in &answers {
        let key = format!("bulk-{n}");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let answer = post(&app, &key, &body(*n)).await;
            if answer.status == 201 {
                break;
            }
            assert!(
                answer.is_storage_unavailable(),
                "{key}: {}",
                answer.describe()
            );
            assert!(std::time::Instant::now() < deadline, "{key} never written");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert_eq!(app.row_counts().await, (40, 40, 40));
}

#[actix_web::test]
async fn a_batch_cancelled_by_the_statement_timeout_is_committed_in_smaller_parts() {
    let app = spawn_app_with(|settings| {
        settings.database.statement_timeout = Duration::from_secs(1);
        settings.idempotency.wait_timeout = Duration::from_secs(60);
        settings.database.writers = 1;
    })
    .await;
    // Every entry takes 100 ms to insert: a batch of more than about 9 runs past the timeout.
    app.db
        .batch_execute(
            "CREATE FUNCTION slow_entry() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN PERFORM pg_sleep(0.1); RETURN NEW; END $$;
             CREATE TRIGGER slow_entry BEFORE INSERT ON entries
                 FOR EACH ROW EXECUTE FUNCTION slow_entry();",
        )
        .await
        .unwrap();
    let answers = join_all((0..30).map(|n| {
        let app = &app;
        async move { post(app, &format!("slow-{n}"), &entry_body(n).to_string()).await }
    }))
    .await;
    for answer in &answers {
        answer.assert_created();
    }
    assert_eq!(app.row_counts().await, (30, 30, 30));
}

/// Inserts `count` entries of the anonymous client, each with `blob_bytes` of hex in its data,
/// one millisecond apart (the newest has the lowest n), straight into the table: quicker than
/// writing them, and past what a write may carry when `blob_bytes` is large.
async fn insert_large_entries(app: &TestDaemon, prefix: &str, count: i64, blob_bytes: i64) {
    app.db
        .execute(
            "INSERT INTO entries (id, client_id, idempotency_key, kind, data, created_at)
             SELECT gen_random_uuid(), 'anonymous', $1 || '-' || g, 'bulk',
                    jsonb_build_object('blob', left(repeat(md5(g::text), ($2::bigint / 32 + 1)::int), $2::bigint::int)),
                    now() - g * interval '1 ms'
             FROM generate_series(1, $3::bigint) AS g",
            &[&prefix, &blob_bytes, &count],
        )
        .await
        .unwrap();
}

/// Walks every page of `GET /v1/entries?limit=1000`; returns each page's keys.
async fn walk_pages(app: &TestDaemon) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut query = "limit=1000".to_owned();
    loop {
        let page = app.get(&format!("/v1/entries?{query}"), None).await;
        assert_eq!(page.status, 200, "{}", page.describe());
        let page = page.json();
        let keys = page["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|entry| entry["idempotency_key"].as_str().unwrap().to_owned())
            .collect();
        pages.push(keys);
        match page["next"].as_str() {
            Some(cursor) => query = format!("limit=1000&cursor={cursor}"),
            None => return pages,
        }
        assert!(pages.len() < 100, "the pages never end");
    }
}

/// A listing once too large: `limit=1000` over entries of 60 KB answered 1000 of them at once (60 MB
/// a page, several times that in the daemon while it shaped the page: 8 such listings at once
/// took a debug build from 50 to 770-800 MiB). A page now ends before the entry that would take
/// its data past 1 MiB, and `next` goes on after the last entry it holds.
#[actix_web::test]
async fn a_page_ends_at_its_byte_bound_and_next_continues_after_its_last_entry() {
    let app = spawn_app_with(|_| {}).await;
    insert_large_entries(&app, "large", 40, 60_000).await;
    // A single entry past the bound (written by another program, or under a larger
    // http.max_body_bytes) comes alone: the first entry of a page always does.
    insert_large_entries(&app, "huge", 1, 2 * 1024 * 1024).await;
    app.db
        .execute(
            "UPDATE entries SET created_at = created_at - interval '1 hour' WHERE idempotency_key = 'huge-1'",
            &[],
        )
        .await
        .unwrap();
    let entry_bytes: i32 = app
        .db
        .query_one(
            "SELECT octet_length(data::text) FROM entries WHERE idempotency_key = 'large-1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let per_page = (retrysafe::http::listing::PAGE_BYTES / i64::from(entry_bytes)) as usize;

    let pages = walk_pages(&app).await;
    let sizes: Vec<usize> = pages.iter().map(Vec::len).collect();
    let mut expected = vec![per_page; 40 / per_page];
    expected.push(40 % per_page);
    expected.retain(|size| *size > 0);
    expected.push(1);
    assert_eq!(sizes, expected, "pages of {entry_bytes}-byte entries");
    let keys: Vec<String> = pages.concat();
    let mut in_order: Vec<String> = (1..=40).map(|n| format!("large-{n}")).collect();
    in_order.push("huge-1".into());
    assert_eq!(keys, in_order, "every entry once, newest first");
}

/// Listings are served `CONCURRENT_LISTINGS` at a time, daemon-wide: one that finds every turn
/// taken for `database.connect_timeout` gets 503 `storage-unavailable` with `Retry-After`, as a
/// read that finds no pooled connection does. Here the turns are held by listings stuck behind
/// a lock on `entries`; the reads' pool has connections to spare, so the turns are the bound.
#[actix_web::test]
async fn listings_beyond_the_concurrent_bound_wait_then_get_503() {
    use std::cell::Cell;
    use std::rc::Rc;
    let turns = retrysafe::http::listing::CONCURRENT_LISTINGS;
    let app = spawn_app_with(|settings| {
        // A quarter for reads: more connections than turns.
        settings.database.pool_size = 64;
        settings.database.statement_timeout = Duration::from_secs(60);
    })
    .await;
    insert_large_entries(&app, "few", 3, 100).await;
    let stall = LockHolder::take(
        &app.database.name,
        "LOCK TABLE entries IN ACCESS EXCLUSIVE MODE",
    )
    .await;
    let answered = Rc::new(Cell::new(0));
    let listings = join_all((0..turns + 2).map(|_| {
        let (app, answered) = (&app, answered.clone());
        async move {
            let answer = app.get("/v1/entries", None).await;
            answered.set(answered.get() + 1);
            answer
        }
    }));
    // The lock goes once the listings without a turn have had their answer.
    let release = async {
        let started = std::time::Instant::now();
        while answered.get() < 2 {
            assert!(started.elapsed() < REQUEST_LIMIT, "no listing gave up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stall.release().await;
    };
    let (answers, ()) = tokio::join!(listings, release);
    let refused: Vec<&TestResponse> = answers.iter().filter(|a| a.status == 503).collect();
    assert_eq!(
        refused.len(),
        2,
        "{:?}",
        answers.iter().map(|a| a.status).collect::<Vec<_>>()
    );
    for answer in refused {
        answer.assert_problem(503, "storage-unavailable");
        assert_eq!(answer.header("retry-after").as_deref(), Some("1"));
        assert!(answer.text().contains("listings"), "{}", answer.describe());
    }
    assert_eq!(
        answers.iter().filter(|a| a.status == 200).count(),
        turns,
        "the listings that had a turn are answered once the lock is gone"
    );
}
