//! The admin API's query parameters: each known and given once, times, page sizes, and the
//! cursors of its pages, tied to the query they belong to ([`crate::http::cursor`]).

use chrono::{DateTime, Utc};

use crate::admin::store::{EventFilter, EventState, Selector};
use crate::http::cursor::{self, Fingerprint};
use crate::http::listing::query_pairs;
use crate::http::problem::ApiError;

use super::{DEFAULT_PAGE, MAX_PAGE};

/// The query parameters of a page of events, in the API and in the console's events page.
pub const EVENT_PARAMETERS: [&str; 8] = [
    "state",
    "type",
    "client",
    "error",
    "created_after",
    "created_before",
    "limit",
    "cursor",
];

/// Query parameters, each known and given once, as `(name, value)`.
pub struct Parameters(Vec<(String, String)>);

impl Parameters {
    pub fn parse(query: &str, known: &[&str]) -> Result<Self, ApiError> {
        let pairs = query_pairs(query)?;
        let mut problems = Vec::new();
        for (index, (name, _)) in pairs.iter().enumerate() {
            if !known.contains(&name.as_str()) {
                problems.push(format!(
                    "{name}: unknown parameter (known: {})",
                    known.join(", ")
                ));
            } else if pairs[..index].iter().any(|(earlier, _)| earlier == name) {
                problems.push(format!("{name}: given more than once"));
            }
        }
        if problems.is_empty() {
            Ok(Self(pairs))
        } else {
            Err(ApiError::InvalidQuery(problems.join("; ")))
        }
    }

    /// The value of `name`; an empty one (a form's blank field) is none.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(given, _)| given == name)
            .map(|(_, value)| value.as_str())
            .filter(|value| !value.is_empty())
    }
}

/// The RFC 3339 time `text` of parameter `name`, if given; what is wrong with it goes to
/// `problems`.
pub fn optional_time(
    name: &str,
    text: Option<&str>,
    problems: &mut Vec<String>,
) -> Option<DateTime<Utc>> {
    let text = text?;
    match DateTime::parse_from_rfc3339(text) {
        Ok(time) => Some(time.with_timezone(&Utc)),
        Err(_) => {
            problems.push(format!(
                "{name}: {text:?} is not an RFC 3339 time such as 2026-12-01T00:00:00Z"
            ));
            None
        }
    }
}

/// The page size and the cursor (a position, exclusive) of `parameters`, a page of the query
/// `fingerprint` ([`crate::http::cursor`]; `same` names what the cursor is tied to).
fn page_of(
    parameters: &Parameters,
    (fingerprint, same): (Fingerprint, &str),
    problems: &mut Vec<String>,
) -> (i64, Option<i64>) {
    let limit = match parameters.get("limit").map(str::parse::<i64>) {
        None => DEFAULT_PAGE,
        Some(Ok(limit)) if (1..=MAX_PAGE).contains(&limit) => limit,
        Some(_) => {
            problems.push(format!("limit: a whole number from 1 to {MAX_PAGE}"));
            DEFAULT_PAGE
        }
    };
    let cursor = match parameters
        .get("cursor")
        .map(|text| cursor::decode(text, fingerprint))
    {
        None => None,
        Some(Ok(position)) => Some(i64::from_be_bytes(position)),
        Some(Err(refused)) => {
            problems.push(format!("cursor: {}", refused.describe(same)));
            None
        }
    };
    (limit, cursor)
}

/// What an events cursor is tied to: every filter of the page it came with.
pub(super) fn events_query(filter: &EventFilter) -> (Fingerprint, &'static str) {
    let time = |time: Option<DateTime<Utc>>| time.map(crate::entry::format_time);
    let described = serde_json::json!([
        "events",
        filter.state.as_str(),
        filter.event_type,
        filter.client,
        filter.error,
        time(filter.created_after),
        time(filter.created_before),
    ]);
    (
        Fingerprint::of(&described),
        "state, type, client, error, created_after and created_before",
    )
}

/// The page size and the cursor of a page of the action log.
pub fn actions_page_of(parameters: &Parameters, problems: &mut Vec<String>) -> (i64, Option<i64>) {
    page_of(parameters, actions_query(), problems)
}

/// What an action log cursor is tied to: the log, which has no filter.
pub(super) fn actions_query() -> (Fingerprint, &'static str) {
    (Fingerprint::of(&serde_json::json!(["actions"])), "listing")
}

/// The filter, page size and cursor of an events query.
pub fn event_query(parameters: &Parameters) -> Result<(EventFilter, i64, Option<i64>), ApiError> {
    let mut problems = Vec::new();
    let state = match parameters.get("state") {
        None => EventState::Parked,
        Some(text) => EventState::parse(text).unwrap_or_else(|| {
            problems.push(format!(
                "state: {text:?} is none of parked, unsent, sent, skipped"
            ));
            EventState::Parked
        }),
    };
    let mut time = |name: &str| optional_time(name, parameters.get(name), &mut problems);
    let created_after = time("created_after");
    let created_before = time("created_before");
    let selector = Selector {
        event_type: parameters.get("type").map(str::to_owned),
        client: parameters.get("client").map(str::to_owned),
        error: parameters.get("error").map(str::to_owned),
        created_after,
        created_before,
        all: true,
        ..Selector::default()
    };
    problems.extend(selector.problems());
    let filter = EventFilter {
        state,
        event_type: selector.event_type,
        client: selector.client,
        error: selector.error,
        created_after,
        created_before,
    };
    let (limit, cursor) = page_of(parameters, events_query(&filter), &mut problems);
    if !problems.is_empty() {
        return Err(ApiError::InvalidQuery(problems.join("; ")));
    }
    Ok((filter, limit, cursor))
}
