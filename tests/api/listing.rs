//! `GET /v1/entries`: a client's entries a page at a time, while others are written.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};

use futures_util::{future, stream, StreamExt};
use serde_json::{json, Value};

use crate::common::daemon::{spawn_app_with, TestDaemon};
use crate::common::helpers::client;

const BILLING: &str = "token-billing";
const SHIPPING: &str = "token-shipping";

async fn two_clients() -> TestDaemon {
    spawn_app_with(|settings| {
        settings.auth.clients = vec![client("billing", BILLING), client("shipping", SHIPPING)];
    })
    .await
}

/// Writes entries `<prefix>-<n>` for n in `range` as the client of `token`, 64 at a time;
/// returns their ids.
async fn write(
    app: &TestDaemon,
    token: &str,
    prefix: &str,
    range: std::ops::Range<i64>,
) -> Vec<String> {
    stream::iter(range)
        .map(|n| async move {
            let body = json!({"kind": "invoice.paid", "data": {"n": n}});
            let created = app
                .post_entry_as(Some(token), &format!("{prefix}-{n}"), &body)
                .await;
            created.assert_created();
            created.json()["id"].as_str().unwrap().to_owned()
        })
        .buffer_unordered(64)
        .collect()
        .await
}

/// Lists every page of `query` (without `cursor`) as the client of `token`.
async fn list_all(app: &TestDaemon, token: &str, query: &str) -> Vec<Value> {
    let mut entries = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..1000 {
        let path = match &cursor {
            Some(cursor) => format!("/v1/entries?{query}&cursor={cursor}"),
            None => format!("/v1/entries?{query}"),
        };
        let page = app.get(&path, Some(token)).await;
        assert_eq!(
            page.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&page.body)
        );
        let page = page.json();
        entries.extend(page["entries"].as_array().unwrap().iter().cloned());
        match page["next"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return entries,
        }
    }
    panic!("{query}: more than 1000 pages");
}

/// `(created_at, id)`, the listing's order; both compare as text in their fixed formats.
fn position(entry: &Value) -> (String, String) {
    (
        entry["created_at"].as_str().unwrap().to_owned(),
        entry["id"].as_str().unwrap().to_owned(),
    )
}

fn assert_ordered(entries: &[Value], newest_first: bool, what: &str) {
    for pair in entries.windows(2) {
        let (a, b) = (position(&pair[0]), position(&pair[1]));
        let in_order = if newest_first { a > b } else { a < b };
        assert!(in_order, "{what}: {a:?} then {b:?}");
    }
}

#[actix_web::test]
async fn paging_through_ten_thousand_entries_during_writes_returns_each_once_and_only_the_clients_own(
) {
    let app = two_clients().await;
    let existing: HashSet<String> = write(&app, BILLING, "bulk", 0..10_000)
        .await
        .into_iter()
        .collect();
    write(&app, SHIPPING, "other", 0..300).await;

    for (query, newest_first) in [
        ("limit=1000", true),
        ("order=asc&limit=1000", false),
        ("order=desc&limit=333", true),
        ("order=asc&limit=777", false),
    ] {
        let paging_done = Cell::new(false);
        let written_meanwhile = Cell::new(0);
        let writer = async {
            let mut n = 0;
            while !paging_done.get() {
                // Both clients write while the listing runs, a few entries at a time so that
                // the writes interleave with the pages.
                let prefix = format!("during-{query}");
                future::join(
                    write(&app, BILLING, &prefix, n..n + 8),
                    write(&app, SHIPPING, &prefix, n..n + 8),
                )
                .await;
                n += 8;
            }
            written_meanwhile.set(n);
        };
        let pager = async {
            let listed = list_all(&app, BILLING, query).await;
            paging_done.set(true);
            listed
        };
        let ((), listed) = future::join(writer, pager).await;
        assert!(
            written_meanwhile.get() > 0,
            "{query}: nothing was written during the listing"
        );

        let mut seen: HashMap<String, usize> = HashMap::new();
        for entry in &listed {
            *seen
                .entry(entry["id"].as_str().unwrap().to_owned())
                .or_default() += 1;
            assert!(entry["idempotency_key"].is_string(), "{entry}");
        }
        let repeated: Vec<_> = seen.iter().filter(|(_, count)| **count > 1).collect();
        assert!(
            repeated.is_empty(),
            "{query}: listed more than once: {repeated:?}"
        );
        let missing = existing.iter().filter(|id| !seen.contains_key(*id)).count();
        assert_eq!(
            missing, 0,
            "{query}: entries that existed before paging are missing"
        );
        assert_ordered(&listed, newest_first, query);

        let listed_ids: Vec<uuid::Uuid> = seen.keys().map(|id| id.parse().unwrap()).collect();
        let foreign: i64 = app
            .db
            .query_one(
                "SELECT count(*) FROM entries WHERE id = ANY($1) AND client_id <> 'billing'",
                &[&listed_ids],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(foreign, 0, "{query}: another client's entries were listed");
    }

    assert_listing_uses_the_index(&app).await;
}

/// The listing's four statements (each order, with and without a kind), prepared as the daemon
/// prepares them, on `db`.
async fn prepare_listing(db: &tokio_postgres::Client) {
    let types = "text, text, timestamptz, timestamptz, timestamptz, uuid, bigint, bigint";
    db.batch_execute(&format!(
        "PREPARE newest_first ({types}) AS {};
         PREPARE oldest_first ({types}) AS {};
         PREPARE kind_newest_first ({types}) AS {};
         PREPARE kind_oldest_first ({types}) AS {}",
        retrysafe::http::listing::LIST_NEWEST_FIRST,
        retrysafe::http::listing::LIST_OLDEST_FIRST,
        retrysafe::http::listing::LIST_KIND_NEWEST_FIRST,
        retrysafe::http::listing::LIST_KIND_OLDEST_FIRST,
    ))
    .await
    .unwrap();
}

/// The rows of a simple query, first column, one text.
async fn text_of(db: &tokio_postgres::Client, sql: &str) -> String {
    db.simple_query(sql)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"))
        .into_iter()
        .filter_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The listing's statements walk an index with the page's bounds as index conditions, in both
/// orders and with a kind filter, in the plan PostgreSQL makes for each execution and in the
/// generic plan it may switch a prepared statement to.
async fn assert_listing_uses_the_index(app: &TestDaemon) {
    app.db.batch_execute("ANALYZE entries").await.unwrap();
    prepare_listing(&app.db).await;
    for mode in ["force_custom_plan", "force_generic_plan"] {
        app.db
            .batch_execute(&format!("SET plan_cache_mode = {mode}"))
            .await
            .unwrap();
        for (statement, arguments, index) in [
            ("newest_first", "'billing', NULL, NULL, NULL, NULL, NULL, 1001, 1048576", "entries_client_created"),
            ("oldest_first", "'billing', NULL, NULL, NULL, NULL, NULL, 1001, 1048576", "entries_client_created"),
            ("kind_newest_first", "'billing', 'invoice.paid', NULL, NULL, NULL, NULL, 1001, 1048576", "entries_client_kind_created"),
            ("kind_oldest_first", "'billing', 'invoice.paid', NULL, NULL, NULL, NULL, 1001, 1048576", "entries_client_kind_created"),
            ("newest_first", "'billing', NULL, '2000-01-01Z', NULL, '2100-01-01Z', '01a23833-187e-72d5-a313-eeb958536846', 101, 1048576", "entries_client_created"),
            ("oldest_first", "'billing', NULL, '2000-01-01Z', NULL, '2000-01-01Z', '01a23833-187e-72d5-a313-eeb958536846', 101, 1048576", "entries_client_created"),
        ] {
            let plan = text_of(&app.db, &format!("EXPLAIN EXECUTE {statement}({arguments})")).await;
            assert!(
                plan.contains("Index Scan") && plan.contains(index),
                "{mode} {statement}({arguments}):\n{plan}"
            );
            assert!(
                plan.contains("Index Cond: ((client_id = ")
                    && (plan.contains("ROW(created_at, id)")
                        || plan.contains("ROW(kind, created_at, id)")),
                "{mode} {statement}({arguments}): the cursor is not an index condition:\n{plan}"
            );
            assert!(!plan.contains("Sort"), "{mode} {statement}:\n{plan}");
        }
    }
}

/// Every shape of listing reads about a page, on a client with a million entries: no filter, a
/// kind of 1 % of them, a kind with none, a time bound on either side, a deep cursor, in both
/// orders, in the custom and the generic plan. `EXPLAIN (ANALYZE, BUFFERS)` counts the pages the
/// execution touched; a page of 100 entries of a rare kind touches at most one heap page per
/// entry and a few index pages. (Before the kind index and the folded time bounds, a page of
/// the rare kind read ~10,000 entries, the kind with none all of them, and a time bound every
/// entry from the other end to it.)
#[actix_web::test]
async fn every_listing_shape_reads_about_a_page_on_a_million_entries() {
    let app = spawn_app_with(|_| {}).await;
    // A million entries of one client, one a second from 2026-01-01, every 100th of the kind
    // `rare`; and a few of another client.
    app.db
        .batch_execute(
            "INSERT INTO entries (id, client_id, idempotency_key, kind, data, created_at)
             SELECT gen_random_uuid(), 'billing', 'k' || n,
                    CASE WHEN n % 100 = 0 THEN 'rare' ELSE 'common' END,
                    jsonb_build_object('n', n),
                    '2026-01-01Z'::timestamptz + n * interval '1 second'
             FROM generate_series(1, 1000000) AS n;
             INSERT INTO entries (id, client_id, idempotency_key, kind, data, created_at)
             SELECT gen_random_uuid(), 'shipping', 'k' || n, 'rare', '{}',
                    '2026-01-01Z'::timestamptz + n * interval '1 second'
             FROM generate_series(1, 1000) AS n",
        )
        .await
        .unwrap();
    app.db
        .batch_execute("VACUUM ANALYZE entries")
        .await
        .unwrap();
    prepare_listing(&app.db).await;
    let middle = "'2026-01-06T18:53:20Z'"; // entry 500,000
    let nil = "'00000000-0000-0000-0000-000000000000'";
    let max = "'ffffffff-ffff-ffff-ffff-ffffffffffff'";
    let deep = "'2026-01-02T00:00:00Z'"; // entry 86,400
                                         // (statement, kind, created_after, created_before, start time, start id), the start as
                                         // the daemon folds the cursor and the time bound on the side a walk starts from.
    let shapes = [
        ("newest_first", "NULL", "NULL", "NULL", "NULL", "NULL"),
        ("oldest_first", "NULL", "NULL", "NULL", "NULL", "NULL"),
        (
            "kind_newest_first",
            "'rare'",
            "NULL",
            "NULL",
            "NULL",
            "NULL",
        ),
        (
            "kind_oldest_first",
            "'rare'",
            "NULL",
            "NULL",
            "NULL",
            "NULL",
        ),
        (
            "kind_newest_first",
            "'absent'",
            "NULL",
            "NULL",
            "NULL",
            "NULL",
        ),
        (
            "kind_oldest_first",
            "'absent'",
            "NULL",
            "NULL",
            "NULL",
            "NULL",
        ),
        ("newest_first", "NULL", "NULL", middle, middle, nil),
        ("oldest_first", "NULL", middle, "NULL", middle, max),
        ("kind_newest_first", "'rare'", "NULL", middle, middle, nil),
        ("kind_oldest_first", "'rare'", middle, "NULL", middle, max),
        ("kind_oldest_first", "'rare'", deep, middle, deep, max),
        ("oldest_first", "NULL", "NULL", "NULL", middle, nil),
        ("kind_newest_first", "'rare'", "NULL", "NULL", deep, nil),
    ];
    for mode in ["force_custom_plan", "force_generic_plan"] {
        app.db
            .batch_execute(&format!("SET plan_cache_mode = {mode}"))
            .await
            .unwrap();
        for (statement, kind, after, before, start_time, start_id) in shapes {
            let arguments = format!(
                "'billing', {kind}, {after}, {before}, {start_time}, {start_id}, 101, 1048576"
            );
            let explained = text_of(
                &app.db,
                &format!(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {statement}({arguments})"
                ),
            )
            .await;
            let explained: Value = serde_json::from_str(&explained).unwrap();
            let plan = &explained[0]["Plan"];
            let pages = plan["Shared Hit Blocks"].as_i64().unwrap()
                + plan["Shared Read Blocks"].as_i64().unwrap();
            let rows = plan["Actual Rows"].as_i64().unwrap();
            eprintln!("listing pages: {mode} {statement}({arguments}): {pages} pages, {rows} rows");
            let expected_rows = if kind == "'absent'" { 0 } else { 101 };
            assert_eq!(rows, expected_rows, "{mode} {statement}({arguments})");
            assert!(
                pages <= 250,
                "{mode} {statement}({arguments}): {pages} pages for a page of {rows} entries:\n{explained:#}"
            );
        }
    }
}

#[actix_web::test]
async fn the_listing_filters_by_kind_and_time_and_refuses_bad_parameters() {
    let app = two_clients().await;
    let mut created = Vec::new();
    for (n, kind) in ["a", "a", "a", "b", "b", "b", "a", "a"].iter().enumerate() {
        let body = json!({"kind": kind, "data": {"n": n}});
        let answer = app
            .post_entry_as(Some(BILLING), &format!("f-{n}"), &body)
            .await;
        answer.assert_created();
        created.push(answer.json());
    }
    app.post_entry_as(Some(SHIPPING), "f-0", &json!({"kind": "a", "data": {}}))
        .await;
    let time = |n: usize| {
        created[n]["created_at"]
            .as_str()
            .unwrap()
            .replace('+', "%2B")
    };
    let ids = |entries: &[Value]| -> Vec<String> {
        entries
            .iter()
            .map(|entry| entry["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let expected = |indexes: &[usize]| -> Vec<String> {
        indexes
            .iter()
            .map(|n| created[*n]["id"].as_str().unwrap().to_owned())
            .collect()
    };

    let newest = list_all(&app, BILLING, "").await;
    assert_eq!(ids(&newest), expected(&[7, 6, 5, 4, 3, 2, 1, 0]));
    assert_eq!(newest[0]["idempotency_key"], "f-7");
    assert_eq!(newest[0]["data"], json!({"n": 7}));
    assert_eq!(newest[0]["kind"], "a");
    let of_a = list_all(&app, BILLING, "kind=a&order=asc&limit=1").await;
    assert_eq!(ids(&of_a), expected(&[0, 1, 2, 6, 7]));
    let window = list_all(
        &app,
        BILLING,
        &format!(
            "created_after={}&created_before={}&order=asc",
            time(2),
            time(6)
        ),
    )
    .await;
    assert_eq!(
        ids(&window),
        expected(&[3, 4, 5]),
        "both bounds are exclusive"
    );
    let a_after = list_all(&app, BILLING, &format!("kind=a&created_after={}", time(5))).await;
    assert_eq!(ids(&a_after), expected(&[7, 6]));
    let shipping = list_all(&app, SHIPPING, "").await;
    assert_eq!(shipping.len(), 1, "a client lists only its own entries");

    // A page's cursor, and what is refused.
    let first = app
        .get("/v1/entries?kind=a&limit=2", Some(BILLING))
        .await
        .json();
    let cursor = first["next"].as_str().unwrap().to_owned();
    let counts = app.row_counts().await;
    let mut tampered = cursor.clone().into_bytes();
    tampered[10] = if tampered[10] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    for (query, parameter) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=many", "limit"),
        ("order=sideways", "order"),
        ("kind=Not%20A%20Kind", "kind"),
        ("created_after=yesterday", "created_after"),
        ("created_before=2026-12-01T00:00:00+01:00", "created_before"),
        ("since=2026-12-01T00:00:00Z", "since"),
        ("limit=1&limit=2", "limit"),
        ("cursor=bm90LWEtY3Vyc29y", "cursor"),
        (&format!("kind=a&limit=2&cursor={tampered}"), "cursor"),
        (&format!("kind=b&limit=2&cursor={cursor}"), "cursor"),
        (&format!("kind=a&order=asc&cursor={cursor}"), "cursor"),
    ] {
        let refused = app
            .get(&format!("/v1/entries?{query}"), Some(BILLING))
            .await;
        refused.assert_problem(400, "invalid-request");
        let detail = refused.json()["detail"].as_str().unwrap().to_owned();
        assert!(
            detail.contains(&format!("{parameter}:")),
            "{query}: the detail names {parameter}: {detail}"
        );
    }
    app.get(
        &format!("/v1/entries?kind=a&limit=2&cursor={cursor}"),
        Some(SHIPPING),
    )
    .await
    .assert_problem(400, "invalid-request");
    app.get("/v1/entries", None)
        .await
        .assert_problem(401, "unauthorized");
    assert_eq!(
        app.row_counts().await,
        counts,
        "a refused listing changes nothing"
    );

    let second = app
        .get(
            &format!("/v1/entries?kind=a&limit=2&cursor={cursor}"),
            Some(BILLING),
        )
        .await
        .json();
    assert_eq!(
        ids(second["entries"].as_array().unwrap()),
        expected(&[2, 1])
    );
}
