//! The overview: the verdict first, the figures now, their trends, the backlog by type, the
//! parked groups, the ordering keys held back, the replays.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use maud::{html, Markup};

use crate::admin::api::{self, Parameters};
use crate::admin::charts;
use crate::admin::history::Range;
use crate::admin::SharedAdmin;
use crate::http::problem::ApiError;

use super::{
    counted, error_page, event_link, html_response, link, refreshing_page, session_of, to_login,
};

/// How often the overview may reload itself (`refresh`, in seconds); none by default.
const REFRESH_CHOICES: [u32; 3] = [10, 30, 60];

/// The overview's own choices: which range its charts show (`range`, hour by default), and
/// whether it reloads itself (`refresh`).
fn overview_choices(query: &str) -> Result<(Range, Option<u32>), ApiError> {
    let parameters = Parameters::parse(query, &["range", "refresh"])?;
    let mut problems = Vec::new();
    let range = match parameters.get("range") {
        None => Range::Hour,
        Some(text) => Range::parse(text).unwrap_or_else(|| {
            problems.push(format!("range: {text:?} is neither hour nor day"));
            Range::Hour
        }),
    };
    let refresh = match parameters.get("refresh") {
        None | Some("off") => None,
        Some(text) => match text.parse() {
            Ok(seconds) if REFRESH_CHOICES.contains(&seconds) => Some(seconds),
            _ => {
                problems.push(format!(
                    "refresh: {text:?} is not one of off, 10, 30, 60 (seconds)"
                ));
                None
            }
        },
    };
    if problems.is_empty() {
        Ok((range, refresh))
    } else {
        Err(ApiError::InvalidQuery(problems.join("; ")))
    }
}

/// The overview's address with these choices.
fn overview_link(range: Range, refresh: Option<u32>) -> String {
    let refresh = refresh.map(|seconds| seconds.to_string());
    let range = (range != Range::Hour).then_some(range.as_str());
    link(
        "/console",
        &[
            ("range", range.unwrap_or_default()),
            ("refresh", refresh.as_deref().unwrap_or_default()),
        ],
    )
}

/// The charts of the outbox's history, with the links that choose the range and the refresh.
fn trends(state: &SharedAdmin, range: Range, refresh: Option<u32>) -> Markup {
    let series = state.history.series(range);
    let window_words = charts::window_words(&series, range);
    html! {
        h2 { "Trends over " (window_words) }
        p.choices {
            span { "Show: "
                @for choice in [Range::Hour, Range::Day] {
                    @if choice == range { strong aria-current="true" { (choice.as_str()) } } @else { a href=(overview_link(choice, refresh)) { (choice.as_str()) } }
                    " "
                }
            }
            span { "Reload this page: "
                @if refresh.is_none() { strong aria-current="true" { "off" } } @else { a href=(overview_link(range, None)) { "off" } }
                @for seconds in REFRESH_CHOICES {
                    " "
                    @if refresh == Some(seconds) { strong aria-current="true" { "every " (seconds) " s" } }
                    @else { a href=(overview_link(range, Some(seconds))) { "every " (seconds) " s" } }
                }
            }
        }
        div.charts {
            @for measure in &charts::MEASURES { (charts::chart(measure, &series, &window_words)) }
        }
        p {
            "Sampled by this daemon every " (charts::number(state.history.interval.as_secs_f64())) " s since it started (kept in memory, a restart starts afresh), from the database: "
            "the whole outbox's figures, the same on every daemon that shares it; the rates count every relay's events, a sample interval late."
            " A point's time and value show where the pointer rests. The same series as JSON: " code { "GET /admin/v1/outbox/history" } "."
        }
    }
}

pub(super) async fn overview(request: HttpRequest, state: SharedAdmin) -> HttpResponse {
    let Some(session) = session_of(&state, &request) else {
        return to_login();
    };
    let (range, refresh) = match overview_choices(request.query_string()) {
        Ok(choices) => choices,
        Err(error) => return error_page(Some(&session), &error),
    };
    let overview = match api::read_overview(&state).await {
        Ok(overview) => overview,
        Err(error) => return error_page(Some(&session), &error),
    };
    let figures = &overview.figures;
    let totals = figures.totals;
    let now = figures.now;
    let count = |n: i64| counted(n, n >= crate::outbox::store::GAUGE_COUNT_CAP);
    let mut concerns = Vec::new();
    if !overview.broker.connected {
        concerns.push("the broker is not connected".to_owned());
    }
    if let Some(reason) = &overview.broker.blocked {
        concerns.push(format!("RabbitMQ blocks publishing ({reason})"));
    }
    if totals.parked > 0 {
        concerns.push(format!("{} parked event(s)", count(totals.parked)));
    }
    if figures.blocked.events > 0 {
        concerns.push(format!(
            "{} event(s) held behind parked ones",
            count(figures.blocked.events)
        ));
    }
    let age_words = |age: f64| format!("{} old", charts::duration(age.max(0.0) as u64));
    if let Some(age) = totals.oldest_unsent_age_seconds.filter(|age| *age >= 60.0) {
        concerns.push(format!("the oldest unsent event is {}", age_words(age)));
    }
    let running = overview
        .replays
        .iter()
        .filter(|replay| replay.status == "running")
        .count();
    let content = html! {
        @if concerns.is_empty() {
            p.verdict.ok role="status" { "Delivery: healthy. Nothing parked, the broker connected, the backlog moving." }
        } @else {
            p.verdict.attention role="status" { "Delivery: needs attention: " (concerns.join("; ")) "." }
        }
        h2 { "Now" }
        ul.figures {
            li { "Unsent: " strong { (count(totals.unsent)) } }
            li { "Parked: " strong { (count(totals.parked)) } }
            li { "Oldest unsent event: " strong { (totals.oldest_unsent_age_seconds.map(age_words).unwrap_or_else(|| "none".into())) } }
            li { "Broker: "
                @if overview.broker.connected { span.state.healthy { "connected" } } @else { span.state.parked { "not connected" } }
                @if let Some(reason) = &overview.broker.blocked { ", " span.state.parked { "blocked by RabbitMQ" } ": " (reason) }
            }
        }
        (trends(&state, range, refresh))
        h2 { "Backlog by type" }
        @if figures.by_type.is_empty() {
            p { "No unsent or parked event." }
        } @else {
            div.scroll { table.cards {
                caption { "Unsent and parked events by type" }
                thead { tr { th scope="col" { "Event type" } th.n scope="col" { "Unsent (not parked)" } th.n scope="col" { "Parked" } } }
                tbody {
                    @for row in &figures.by_type {
                        tr { td data-label="Event type" { (row.event_type) } td.n data-label="Unsent (not parked)" { (count(row.unsent)) } td.n data-label="Parked" { (count(row.parked)) } }
                    }
                }
            } }
        }
        h2 { "Parked events by error" }
        @if figures.parked_groups.is_empty() {
            p { "No parked event." }
        } @else {
            div.scroll { table.cards {
                caption { "Parked events, grouped by event type and last error (the largest groups first)" }
                thead { tr {
                    th scope="col" { "Event type" } th scope="col" { "Last error" } th.n scope="col" { "Events" }
                    th scope="col" { "First parked" } th scope="col" { "Last parked" } th scope="col" { "Act" }
                } }
                tbody {
                    @for group in &figures.parked_groups {
                        @let pairs = [("type", group.event_type.as_str()), ("error", group.last_error.as_str())];
                        tr {
                            td data-label="Event type" { (group.event_type) }
                            td data-label="Last error" { (charts::folded(&group.last_error)) }
                            td.n data-label="Events" { (group.parked) }
                            td data-label="First parked" { (charts::time(group.first_parked_at, now)) }
                            td data-label="Last parked" { (charts::time(group.last_parked_at, now)) }
                            td.act data-label="Act" {
                                a href=(link("/console/events", &[("state", "parked"), pairs[0], pairs[1]])) { "See the events" }
                                // A group without an error text cannot be named by one: its
                                // link would select every parked event of the type.
                                @if !group.last_error.is_empty() {
                                    " · "
                                    a href=(link("/console/confirm", &[("action", "retry"), pairs[0], pairs[1]])) { "Retry this group…" }
                                }
                            }
                        }
                    }
                }
            } }
        }
        @if figures.blocked.events > 0 {
            h2 { "Ordering keys held back" }
            p { (count(figures.blocked.events)) " event(s) of " (figures.blocked.keys) " key(s) wait behind a parked event of their key. Retry or skip the parked one." }
            div.scroll { table.cards {
                caption { "Parked events that hold the most back" }
                thead { tr { th scope="col" { "Event" } th scope="col" { "Client" } th scope="col" { "Ordering key" } th.n scope="col" { "Sequence" } th.n scope="col" { "Held back" } th scope="col" { "Last error" } th scope="col" { "Act" } } }
                tbody {
                    @for event in &figures.blocking {
                        @let id = event.event_id.to_string();
                        tr {
                            td data-label="Event" { (event_link(event.event_id)) }
                            td data-label="Client" { (event.client_id) }
                            td data-label="Ordering key" { (event.ordering_key) }
                            td.n data-label="Sequence" { (event.sequence) }
                            td.n data-label="Held back" { (event.blocked) }
                            td data-label="Last error" { (charts::folded(&event.last_error)) }
                            td.act data-label="Act" {
                                a href=(link("/console/confirm", &[("action", "retry"), ("event_id", &id)])) { "Retry…" }
                                " · "
                                a href=(link("/console/confirm", &[("action", "skip"), ("event_id", &id)])) { "Skip…" }
                            }
                        }
                    }
                }
            } }
        }
        h2 { "Replays" }
        @if overview.replays.is_empty() {
            p { "No replay has run." }
        } @else {
            p { (running) " in progress." }
            div.scroll { table.cards {
                caption { "The newest replays" }
                thead { tr { th.n scope="col" { "Replay" } th scope="col" { "Status" } th scope="col" { "Target" } th scope="col" { "By" } th scope="col" { "Started" } th.n scope="col" { "Sent" } th.n scope="col" { "Of" } } }
                tbody {
                    @for replay in &overview.replays {
                        tr {
                            td.n data-label="Replay" { (replay.id) }
                            td data-label="Status" { (replay.status) }
                            td data-label="Target" { (replay.target) }
                            td data-label="By" { (replay.requested_by) }
                            td data-label="Started" { (charts::time(replay.started_at, now)) }
                            td.n data-label="Sent" { (replay.events_sent) }
                            td.n data-label="Of" { (replay.events_total) }
                        }
                    }
                }
            } }
        }
    };
    html_response(
        StatusCode::OK,
        refreshing_page("Overview", Some(&session), refresh, content),
    )
}
