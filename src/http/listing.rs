//! `GET /v1/entries`: the calling client's entries, newest or oldest first, a page at a time.
//!
//! Pages are keyset pagination on `(created_at, id)`, the order of the index
//! `entries_client_created`: each page starts strictly after the last entry of the one before,
//! as an index condition, so a page costs the same however deep it is, and entries written
//! meanwhile never make an entry that existed before repeat or go missing. The position travels
//! in an opaque cursor ([`crate::http::cursor`]) that is tied to the query it was made for.

use actix_web::{HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::entry::{format_time, is_valid_kind};
use crate::http::cursor::{self, Fingerprint, Refused};
use crate::http::entries::entry_data;
use crate::http::problem::ApiError;
use crate::http::SharedState;
use crate::idempotency::canonical_json;

/// Entries per page unless `limit` says otherwise.
pub const DEFAULT_LIMIT: i64 = 100;
/// Most entries per page.
pub const MAX_LIMIT: i64 = 1000;
/// Most bytes of entry data (PostgreSQL's text of it) per page; a page ends before the entry
/// that would pass it, but holds its first entry whatever its size. Entries are at most
/// `http.max_body_bytes` (64 KiB by default) when written: about 16 of those fit.
pub const PAGE_BYTES: i64 = 1024 * 1024;
/// Listings served at once, daemon-wide; each holds up to a page of [`PAGE_BYTES`] several times
/// over while it reads, shapes and writes it. A listing waits for a turn at most
/// `database.connect_timeout` (as for a pooled connection), then gets 503.
pub const CONCURRENT_LISTINGS: usize = 4;

/// The query parameters this route knows; any other is refused, so that a misspelt filter
/// (`created_since`) is an error, not a silently unfiltered listing.
const PARAMETERS: [&str; 6] = [
    "kind",
    "created_after",
    "created_before",
    "order",
    "limit",
    "cursor",
];

/// One page in one direction: the row comparison `$position $after $start...` positions the
/// walk where it starts (`$5`, `$6`: the cursor, or the time bound the walk starts from,
/// whichever is tighter: [`start`]); `$start_time` and `$start_id` are where a walk without
/// either starts, `$stop` where it stops, `$order` its direction, `$kind` the kind's condition.
/// Absent bounds become infinite ones (`coalesce` of parameters is computed once, before the
/// scan), so that every bound stays an index condition, also in the generic plan of the
/// prepared statement. Without a kind the walk is on `entries_client_created`; with one, on
/// `entries_client_kind_created`, the kind leading the row comparison, which only that index can
/// position a scan by (the generic plan does not know how rare the kind is, and could otherwise
/// walk the other index checking the kind of every row). A page costs the same whatever the
/// table's size, the kind's share of it, and the time bounds.
///
/// A page is bounded by bytes as well as by count (`$8`, [`PAGE_BYTES`]): the walk's rows are
/// measured in order (their data as text, a running sum), and a row's data is sent only while
/// the sum stays within `$8`, the first row's always. The row after the page comes back without
/// its data, so that the caller knows there is a next page without receiving it; the rows after
/// that one do not come back at all. So the daemon holds one page's bytes whatever `limit` and
/// the entries' sizes, where it held `limit` entries of any size.
macro_rules! list_entries {
    ($kind:expr, $stop:expr, $position:expr, $after:literal, $start:expr, $start_time:literal, $start_id:literal, $order:literal) => {
        concat!(
            "
WITH walk AS (
    SELECT id, kind, data::text AS data, created_at, idempotency_key, ordering_key, sequence
    FROM entries
    WHERE client_id = $1
      AND ",
            $kind,
            "
      AND ",
            $stop,
            "
      AND ",
            $position,
            " ",
            $after,
            " ",
            $start,
            "coalesce($5::timestamptz, '",
            $start_time,
            "'), coalesce($6::uuid, '",
            $start_id,
            "'))
    ORDER BY ",
            $order,
            "
    LIMIT $7
), measured AS (
    SELECT walk.*,
           row_number() OVER in_order AS position,
           sum(octet_length(data)) OVER in_order AS bytes_through
    FROM walk
    WINDOW in_order AS (ORDER BY ",
            $order,
            " ROWS UNBOUNDED PRECEDING)
)
SELECT id, kind,
       CASE WHEN position = 1 OR bytes_through <= $8 THEN data END,
       created_at, idempotency_key, ordering_key, sequence
FROM measured
WHERE position <= 2 OR bytes_through - octet_length(data) <= $8
ORDER BY ",
            $order
        )
    };
}

/// Where a walk stops: the time bound on the side it walks to. The bound on the side it starts
/// from is in where it starts ([`start`]), and only there: a condition of its own there could
/// position the scan instead of the cursor, which would then be checked on every row from the
/// bound to the cursor. (`$n IS NULL OR true` keeps the unused parameter's type known.)
macro_rules! newest_first_stop {
    () => {
        "created_at > coalesce($3::timestamptz, '-infinity') AND ($4::timestamptz IS NULL OR true)"
    };
}
macro_rules! oldest_first_stop {
    () => {
        "created_at < coalesce($4::timestamptz, 'infinity') AND ($3::timestamptz IS NULL OR true)"
    };
}

/// Newest first: the index walked backwards from the cursor.
pub const LIST_NEWEST_FIRST: &str = list_entries!(
    "$2::text IS NULL",
    newest_first_stop!(),
    "(created_at, id)",
    "<",
    "(",
    "infinity",
    "ffffffff-ffff-ffff-ffff-ffffffffffff",
    "created_at DESC, id DESC"
);

/// Oldest first: the same walk, forwards.
pub const LIST_OLDEST_FIRST: &str = list_entries!(
    "$2::text IS NULL",
    oldest_first_stop!(),
    "(created_at, id)",
    ">",
    "(",
    "-infinity",
    "00000000-0000-0000-0000-000000000000",
    "created_at, id"
);

/// [`LIST_NEWEST_FIRST`] of one kind.
pub const LIST_KIND_NEWEST_FIRST: &str = list_entries!(
    "kind = $2::text",
    newest_first_stop!(),
    "(kind, created_at, id)",
    "<",
    "($2::text, ",
    "infinity",
    "ffffffff-ffff-ffff-ffff-ffffffffffff",
    "created_at DESC, id DESC"
);

/// [`LIST_OLDEST_FIRST`] of one kind.
pub const LIST_KIND_OLDEST_FIRST: &str = list_entries!(
    "kind = $2::text",
    oldest_first_stop!(),
    "(kind, created_at, id)",
    ">",
    "($2::text, ",
    "-infinity",
    "00000000-0000-0000-0000-000000000000",
    "created_at, id"
);

/// Where a walk starts: after the cursor, or at the time bound on the side it starts from,
/// whichever is tighter. `created_at < B` is `(created_at, id) < (B, the least uuid)` and
/// `created_at > A` is `(created_at, id) > (A, the greatest uuid)`, so a time bound folds into
/// the row comparison that positions the index scan. (Given apart, PostgreSQL would position the
/// scan by one of them and check the other on every row until it held.)
fn start(
    order: Order,
    cursor: Option<(DateTime<Utc>, Uuid)>,
    created_after: Option<DateTime<Utc>>,
    created_before: Option<DateTime<Utc>>,
) -> Option<(DateTime<Utc>, Uuid)> {
    let bound = match order {
        Order::NewestFirst => created_before.map(|time| (time, Uuid::nil())),
        Order::OldestFirst => created_after.map(|time| (time, Uuid::max())),
    };
    match (cursor, bound) {
        (Some(cursor), Some(bound)) => Some(match order {
            Order::NewestFirst => cursor.min(bound),
            Order::OldestFirst => cursor.max(bound),
        }),
        (cursor, bound) => cursor.or(bound),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    NewestFirst,
    OldestFirst,
}

impl Order {
    fn as_str(self) -> &'static str {
        match self {
            Order::NewestFirst => "desc",
            Order::OldestFirst => "asc",
        }
    }
}

/// A page request, validated.
#[derive(Debug, Clone, PartialEq)]
struct ListQuery {
    kind: Option<String>,
    created_after: Option<DateTime<Utc>>,
    created_before: Option<DateTime<Utc>>,
    order: Order,
    limit: i64,
    /// Where the previous page ended.
    after: Option<Position>,
}

/// An entry's place in the listing's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    created_at: DateTime<Utc>,
    id: Uuid,
}

/// Parses the query string; every problem is reported, each naming its parameter.
/// One arm per parameter, so that every bad parameter is reported at once; long because the
/// parameters are many.
fn parse_query(query_string: &str, client_id: &str) -> Result<ListQuery, ApiError> {
    let pairs: Vec<(String, String)> = query_pairs(query_string)?;
    let mut problems = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for (name, _) in &pairs {
        if !PARAMETERS.contains(&name.as_str()) {
            problems.push(format!(
                "{name}: unknown parameter (known: {})",
                PARAMETERS.join(", ")
            ));
        } else if seen.contains(&name.as_str()) {
            problems.push(format!("{name}: given more than once"));
        } else {
            seen.push(name);
        }
    }
    let value = |name: &str| {
        pairs
            .iter()
            .find(|(given, _)| given == name)
            .map(|(_, value)| value.as_str())
    };

    let kind = value("kind").map(str::to_owned);
    if kind.as_deref().is_some_and(|kind| !is_valid_kind(kind)) {
        problems.push("kind: must be 1 to 64 of a-z 0-9 . _ -".into());
    }
    let mut time = |name: &str| {
        let text = value(name)?;
        match DateTime::parse_from_rfc3339(text) {
            Ok(time) => Some(time.with_timezone(&Utc)),
            Err(_) => {
                problems.push(format!(
                    "{name}: {text:?} is not an RFC 3339 time such as 2026-12-01T00:00:00Z (in a URL, write a + offset as %2B)"
                ));
                None
            }
        }
    };
    let created_after = time("created_after");
    let created_before = time("created_before");
    let order = match value("order") {
        None | Some("desc") => Order::NewestFirst,
        Some("asc") => Order::OldestFirst,
        Some(other) => {
            problems.push(format!("order: {other:?} is neither asc nor desc"));
            Order::NewestFirst
        }
    };
    let limit = match value("limit").map(str::parse::<i64>) {
        None => DEFAULT_LIMIT,
        Some(Ok(limit)) if (1..=MAX_LIMIT).contains(&limit) => limit,
        Some(_) => {
            problems.push(format!(
                "limit: must be a whole number from 1 to {MAX_LIMIT}"
            ));
            DEFAULT_LIMIT
        }
    };
    let mut query = ListQuery {
        kind,
        created_after,
        created_before,
        order,
        limit,
        after: None,
    };
    if let Some(text) = value("cursor") {
        match Cursor::decode(text, query.fingerprint(client_id)) {
            Ok(position) => query.after = Some(position),
            Err(problem) => problems.push(format!("cursor: {problem}")),
        }
    }
    if problems.is_empty() {
        Ok(query)
    } else {
        Err(ApiError::InvalidQuery(problems.join("; ")))
    }
}

pub(crate) fn query_pairs(query: &str) -> Result<Vec<(String, String)>, ApiError> {
    actix_web::web::Query::<Vec<(String, String)>>::from_query(query)
        .map(|pairs| pairs.into_inner())
        .map_err(|error| ApiError::InvalidQuery(format!("the query string is malformed: {error}")))
}

impl ListQuery {
    /// What a cursor is tied to: the client and every parameter but `limit` and `cursor`. A
    /// cursor used with other filters would start a page at a place that means nothing in
    /// that listing, so it is refused.
    fn fingerprint(&self, client_id: &str) -> Fingerprint {
        let time = |time: Option<DateTime<Utc>>| time.map(format_time).unwrap_or_default();
        let described = serde_json::json!([
            client_id,
            self.kind,
            time(self.created_after),
            time(self.created_before),
            self.order.as_str(),
        ]);
        Fingerprint::of(&described)
    }
}

/// A position in a listing, as a cursor holds it: `created_at` (microseconds since the epoch)
/// and `id`.
struct Cursor;

impl Cursor {
    fn encode(position: Position, fingerprint: Fingerprint) -> String {
        let mut bytes = [0u8; 24];
        bytes[..8].copy_from_slice(&position.created_at.timestamp_micros().to_be_bytes());
        bytes[8..].copy_from_slice(position.id.as_bytes());
        cursor::encode(bytes, fingerprint)
    }

    fn decode(text: &str, fingerprint: Fingerprint) -> Result<Position, String> {
        let refused =
            |refused: Refused| refused.describe("kind, created_after, created_before and order");
        let bytes: [u8; 24] = cursor::decode(text, fingerprint).map_err(refused)?;
        let micros = i64::from_be_bytes(bytes[..8].try_into().expect("8 of 24 bytes"));
        let created_at =
            DateTime::from_timestamp_micros(micros).ok_or_else(|| refused(Refused::Invalid))?;
        let id = Uuid::from_slice(&bytes[8..]).map_err(|_| refused(Refused::Invalid))?;
        Ok(Position { created_at, id })
    }
}

/// An entry as listed: the entry and the idempotency key it was written with.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ListedEntry {
    id: Uuid,
    kind: String,
    #[schema(value_type = Object)]
    data: Map<String, Value>,
    /// RFC 3339 with microseconds.
    created_at: String,
    idempotency_key: String,
    /// The ordering key the entry was written with, and its sequence; absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    ordering_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    sequence: Option<i64>,
}

/// One page of entries.
#[derive(Serialize, utoipa::ToSchema)]
pub struct EntryPage {
    /// In the order asked for.
    entries: Vec<ListedEntry>,
    /// Give it as `cursor`, with the same other parameters, for the next page; null after the
    /// last page.
    next: Option<String>,
}

/// The calling client's entries, newest first (or oldest first), a page at a time.
#[utoipa::path(
    get,
    path = "/v1/entries",
    tag = "entries",
    params(
        ("kind" = Option<String>, Query, description = "Only entries of this kind (1 to 64 of `a-z 0-9 . _ -`)"),
        ("created_after" = Option<String>, Query, description = "Only entries created after this RFC 3339 time (exclusive); percent-encode a `+` offset as `%2B`"),
        ("created_before" = Option<String>, Query, description = "Only entries created before this RFC 3339 time (exclusive)"),
        ("order" = Option<String>, Query, description = "`desc` (default): newest first; `asc`: oldest first"),
        ("limit" = Option<i64>, Query, description = "Entries per page, 1 to 1000; default 100", minimum = 1, maximum = 1000),
        ("cursor" = Option<String>, Query, description = "The `next` of the previous page, opaque; only with the same kind, created_after, created_before and order"),
    ),
    responses(
        (status = 200, description = "A page of entries, in (created_at, id) order; an entry written while paging appears at most once, and every entry that existed when paging began appears exactly once. A page ends early, with `next`, before the entry that would take its entries' data past 1 MiB (its first entry comes whatever its size)", body = EntryPage, content_type = "application/json"),
        // The problems it answers: crate::http::openapi::ROUTE_PROBLEMS.
    ),
    security(("bearer" = [])),
)]
// One route from request to response: authenticate, parse, read a page, shape it with its
// `Link` header; the steps are calls, the length is the response written out once.
pub async fn list_entries(
    request: HttpRequest,
    state: SharedState,
) -> Result<HttpResponse, ApiError> {
    let client_id = state.auth.admit(&request).await?.id.clone();
    let query = parse_query(request.query_string(), &client_id)?;
    // Held while the page is read and shaped: the bound on the pages in memory at once (the
    // body, once built, is written out after).
    let _turn = tokio::time::timeout(state.read_wait, state.listings.acquire())
        .await
        .map_err(|_| {
            ApiError::Busy(format!(
                "{CONCURRENT_LISTINGS} listings are being served and none finished within {}",
                humantime::format_duration(state.read_wait)
            ))
        })?
        .expect("the listings' semaphore is never closed");
    let statement = match (query.order, query.kind.is_some()) {
        (Order::NewestFirst, false) => LIST_NEWEST_FIRST,
        (Order::OldestFirst, false) => LIST_OLDEST_FIRST,
        (Order::NewestFirst, true) => LIST_KIND_NEWEST_FIRST,
        (Order::OldestFirst, true) => LIST_KIND_OLDEST_FIRST,
    };
    // One more than the page: whether there is a next page, without counting.
    let fetch = query.limit + 1;
    let page_bytes = PAGE_BYTES;
    let cursor = query
        .after
        .map(|position| (position.created_at, position.id));
    let (after_time, after_id) = match start(
        query.order,
        cursor,
        query.created_after,
        query.created_before,
    ) {
        Some((time, id)) => (Some(time), Some(id)),
        None => (None, None),
    };
    let rows = state
        .reads
        .run(async |connection| {
            let statement = connection.prepare_cached(statement).await?;
            Ok(connection
                .query(
                    &statement,
                    &[
                        &&*client_id,
                        &query.kind,
                        &query.created_after,
                        &query.created_before,
                        &after_time,
                        &after_id,
                        &fetch,
                        &page_bytes,
                    ],
                )
                .await?)
        })
        .await?;
    let mut entries = Vec::with_capacity(rows.len().min(query.limit as usize));
    let mut last = None;
    // The page: the rows that came with their data (a prefix), at most `limit` of them. A row
    // after it, with or without its data, says there is a next page.
    for row in rows.iter().take(query.limit as usize) {
        let Some(data) = row.get::<_, Option<String>>(2) else {
            break;
        };
        let created_at: DateTime<Utc> = row.get(3);
        let id: Uuid = row.get(0);
        entries.push(ListedEntry {
            id,
            kind: row.get(1),
            data: entry_data(data)?,
            created_at: format_time(created_at),
            idempotency_key: row.get(4),
            ordering_key: row.get(5),
            sequence: row.get(6),
        });
        last = Some(Position { created_at, id });
    }
    let more = rows.len() > entries.len();
    let next = match last {
        Some(position) if more => Some(Cursor::encode(position, query.fingerprint(&client_id))),
        _ => None,
    };
    let page = EntryPage { entries, next };
    let body = canonical_json(&serde_json::to_value(&page).map_err(|error| {
        ApiError::Internal(anyhow::anyhow!(
            "a page of entries did not serialize: {error}"
        ))
    })?);
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;

    fn refusal(query: &str) -> String {
        match parse_query(query, "billing") {
            Err(ApiError::InvalidQuery(detail)) => detail,
            other => panic!("{query:?} was not refused: {other:?}"),
        }
    }

    #[test]
    fn parameters_are_parsed_with_their_defaults() {
        let query = parse_query("", "billing").unwrap();
        assert_eq!(query.order, Order::NewestFirst);
        assert_eq!(query.limit, DEFAULT_LIMIT);
        assert_eq!(query.after, None);
        let query = parse_query(
            "kind=invoice.paid&created_after=2026-12-01T00:00:00%2B01:00&created_before=2026-12-02T00:00:00Z&order=asc&limit=1000",
            "billing",
        )
        .unwrap();
        assert_eq!(query.kind.as_deref(), Some("invoice.paid"));
        assert_eq!(
            query.created_after,
            Some("2026-11-30T23:00:00Z".parse().unwrap())
        );
        assert_eq!(query.order, Order::OldestFirst);
        assert_eq!(query.limit, 1000);
    }

    #[test]
    fn every_bad_parameter_is_named() {
        assert!(refusal("limit=0").starts_with("limit:"));
        assert!(refusal("limit=1001").starts_with("limit:"));
        assert!(refusal("limit=ten").starts_with("limit:"));
        assert!(refusal("order=newest").starts_with("order:"));
        assert!(refusal("kind=Not+Valid").starts_with("kind:"));
        assert!(refusal("created_after=yesterday").starts_with("created_after:"));
        // An unencoded + is a space: refused, with the hint.
        assert!(refusal("created_before=2026-12-01T00:00:00+01:00").contains("%2B"));
        assert!(refusal("created_since=2026-12-01T00:00:00Z").starts_with("created_since:"));
        assert!(refusal("limit=5&limit=6").contains("more than once"));
        assert!(refusal("cursor=abc").starts_with("cursor:"));
        let both = refusal("order=up&limit=0");
        assert!(both.contains("order:") && both.contains("limit:"), "{both}");
    }

    #[test]
    fn a_cursor_round_trips_and_refuses_edits_and_other_queries() {
        let query = parse_query("kind=a&order=asc", "billing").unwrap();
        let position = Position {
            created_at: "2026-12-01T10:00:00.123456Z".parse().unwrap(),
            id: Uuid::now_v7(),
        };
        let cursor = Cursor::encode(position, query.fingerprint("billing"));
        let next = parse_query(
            &format!("kind=a&order=asc&limit=7&cursor={cursor}"),
            "billing",
        )
        .unwrap();
        assert_eq!(next.after, Some(position), "limit may change between pages");

        for other in [
            "kind=b&order=asc",
            "kind=a",
            "kind=a&order=asc&created_after=2026-01-01T00:00:00Z",
        ] {
            let detail = refusal(&format!("{other}&cursor={cursor}"));
            assert!(detail.contains("another query"), "{other}: {detail}");
        }
        let other_client = parse_query(&format!("kind=a&order=asc&cursor={cursor}"), "shipping");
        assert!(other_client.is_err(), "a cursor is the client's own");

        let mut bytes = URL_SAFE_NO_PAD.decode(&cursor).unwrap();
        bytes[5] ^= 1;
        let edited = URL_SAFE_NO_PAD.encode(&bytes);
        let detail = refusal(&format!("kind=a&order=asc&cursor={edited}"));
        assert!(detail.contains("not a cursor"), "{detail}");
        let cut = &cursor[..cursor.len() - 2];
        assert!(refusal(&format!("kind=a&order=asc&cursor={cut}")).contains("not a cursor"));
    }

    #[test]
    fn a_walk_starts_at_the_tighter_of_the_cursor_and_the_time_bound_on_its_side() {
        let at = |day: u32| {
            chrono::NaiveDate::from_ymd_opt(2026, 12, day)
                .unwrap()
                .and_hms_opt(0, 0, 0)
                .unwrap()
                .and_utc()
        };
        let id = Uuid::now_v7();
        let newest = Order::NewestFirst;
        let oldest = Order::OldestFirst;
        assert_eq!(start(newest, None, None, None), None);
        assert_eq!(
            start(newest, Some((at(5), id)), None, None),
            Some((at(5), id))
        );
        // created_before: before the bound's least row; the cursor, when it is older.
        assert_eq!(
            start(newest, None, None, Some(at(3))),
            Some((at(3), Uuid::nil()))
        );
        assert_eq!(
            start(newest, Some((at(5), id)), None, Some(at(3))),
            Some((at(3), Uuid::nil()))
        );
        assert_eq!(
            start(newest, Some((at(2), id)), None, Some(at(3))),
            Some((at(2), id))
        );
        // created_after starts nothing newest first (it is where the walk stops).
        assert_eq!(start(newest, None, Some(at(3)), None), None);
        // created_after, oldest first: after the bound's greatest row; the cursor, when newer.
        assert_eq!(
            start(oldest, None, Some(at(3)), None),
            Some((at(3), Uuid::max()))
        );
        assert_eq!(
            start(oldest, Some((at(2), id)), Some(at(3)), None),
            Some((at(3), Uuid::max()))
        );
        assert_eq!(
            start(oldest, Some((at(5), id)), Some(at(3)), Some(at(9))),
            Some((at(5), id))
        );
        assert_eq!(start(oldest, None, None, Some(at(3))), None);
    }
}
