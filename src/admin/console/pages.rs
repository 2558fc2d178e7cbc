//! The pages that list: events by filter, any client's key, the action log.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use maud::{html, Markup};

use crate::admin::api::{self, Parameters};
use crate::admin::charts;
use crate::admin::store::{EventState, ListedEvent, Selector, MAX_SKIPPED_AT_ONCE};
use crate::admin::SharedAdmin;
use crate::http::problem::ApiError;
use crate::outbox::store::GAUGE_COUNT_CAP;

use super::actions::selector_words;
use super::{
    counted, error_page, event_link, html_response, link, page, session_of, time_text, to_login,
};

/// What a list says of a state: its caption (the events' order), and which of them a capped
/// count looked at.
fn order_words(state: EventState) -> (&'static str, &'static str) {
    match state {
        EventState::Parked => ("Parked events, newest first", "newest"),
        EventState::Unsent => ("Unsent events, the next due first", "due first"),
        EventState::Sent => ("Sent events, the last sent first", "last sent"),
        EventState::Skipped => ("Skipped events, newest first", "newest"),
    }
}

/// An event's state in a list, with the time that goes with it: when it was sent, parked or
/// skipped; for an unsent one when it is due, or the earlier event of its ordering key it
/// waits for (held behind a parked one until that is retried or skipped).
pub(super) fn state_words(event: &ListedEvent, now: chrono::DateTime<chrono::Utc>) -> Markup {
    let state = event.state.as_str();
    html! {
        @if let Some(head) = event.waits_for {
            span class=(format!("state {}", if head.parked { "parked" } else { "unsent" })) { "held" }
            " behind " (event_link(head.event_id))
            @if head.parked { " (parked)" }
        } @else {
            span class=(format!("state {state}")) { (state) }
            @match event.state {
                EventState::Sent => { @if let Some(at) = event.sent_at { " " (charts::time(at, now)) } }
                EventState::Parked => { @if let Some(at) = event.failed_at { " " (charts::time(at, now)) } }
                EventState::Skipped => { @if let Some(at) = event.skipped_at { " " (charts::time(at, now)) } }
                EventState::Unsent => { @if let Some(at) = event.next_attempt_at { ", due " (charts::time(at, now)) } }
            }
        }
    }
}

pub(super) async fn events(request: HttpRequest, state: SharedAdmin) -> HttpResponse {
    let Some(session) = session_of(&state, &request) else {
        return to_login();
    };
    let parsed = Parameters::parse(request.query_string(), &api::EVENT_PARAMETERS)
        .and_then(|parameters| api::event_query(&parameters).map(|query| (parameters, query)));
    let (parameters, (filter, limit, cursor)) = match parsed {
        Ok(parsed) => parsed,
        Err(error) => return error_page(Some(&session), &error),
    };
    let (page_of_events, matched, now) =
        match api::read_events(&state, &filter, limit, cursor, true).await {
            Ok(page) => page,
            Err(error) => return error_page(Some(&session), &error),
        };
    let matched = matched.expect("the count was asked for");
    let value = |name: &str| parameters.get(name).unwrap_or_default().to_owned();
    let filters = [
        ("state", filter.state.as_str().to_owned()),
        ("type", value("type")),
        ("client", value("client")),
        ("error", value("error")),
        ("created_after", value("created_after")),
        ("created_before", value("created_before")),
    ];
    let filter_pairs: Vec<(&str, &str)> = filters
        .iter()
        .map(|(name, value)| (*name, value.as_str()))
        .collect();
    let limit_text = limit.to_string();
    let next_link = page_of_events.next.as_deref().map(|next| {
        let mut pairs = filter_pairs.clone();
        pairs.extend([("limit", limit_text.as_str()), ("cursor", next)]);
        link("/console/events", &pairs)
    });
    // Every event the filters match, by a selector of the same filters (parked events only).
    let matching_link = |action: &'static str| {
        let mut pairs: Vec<(&str, &str)> = std::iter::once(("action", action))
            .chain(
                filter_pairs
                    .iter()
                    .copied()
                    .filter(|(name, value)| *name != "state" && !value.is_empty()),
            )
            .collect();
        if pairs.len() == 1 {
            // No filter: every parked event, which the selector must say.
            pairs.push(("all", "true"));
        }
        link("/console/confirm", &pairs)
    };
    let parked = filter.state == EventState::Parked;
    let selectable = matches!(filter.state, EventState::Parked | EventState::Unsent);
    let (order, counted_among) = order_words(filter.state);
    let matched_words = counted(matched.matched, matched.capped);
    let content = html! {
        form.filters method="get" action="/console/events" {
            label { "State"
                select name="state" {
                    @for option in EventState::ALL {
                        option value=(option.as_str()) selected[option == filter.state] { (option.as_str()) }
                    }
                }
            }
            label { "Event type" input name="type" value=(value("type")); }
            label { "Client" input name="client" value=(value("client")); }
            label { "Last error (exactly)" input name="error" value=(value("error")); }
            label { "Created after (RFC 3339)" input name="created_after" value=(value("created_after")); }
            label { "Created before (RFC 3339)" input name="created_before" value=(value("created_before")); }
            button type="submit" { "Show" }
        }
        p id="matched" role="status" {
            strong { (matched_words) " " (filter.state.as_str()) " event(s)" } " match these filters"
            @if matched.capped { " (counted among the " (GAUGE_COUNT_CAP) " " (counted_among) ")" }
            "."
        }
        @if page_of_events.partial {
            // A walk that stopped at its cap: say so before the events, whose count is short.
            p role="status" { "This page looked at " (limit * crate::admin::store::WALK_PER_EVENT) " " (filter.state.as_str()) " events and stopped: " (page_of_events.events.len()) " of them match the filters. Older events may match: follow \"More events\" below." }
        }
        @if !page_of_events.events.is_empty() {
            form method="get" action="/console/confirm" {
                @if selectable {
                    div.actions {
                        button type="submit" name="action" value="retry" { "Retry the selected…" }
                        button type="submit" name="action" value="skip" { "Skip the selected…" }
                        @if parked && matched.matched > 0 {
                            a.button href=(matching_link("retry")) { "Retry all " (matched_words) " matching…" }
                            @if !matched.capped && matched.matched <= MAX_SKIPPED_AT_ONCE {
                                a.button href=(matching_link("skip")) { "Skip all " (matched_words) " matching…" }
                            }
                        }
                    }
                }
                div.scroll { table.list.cards {
                    caption { (order) " (" (page_of_events.events.len()) " on this page)" }
                    colgroup {
                        @if selectable { col.select; }
                        col.event; col.type; col.key; col.state; col.attempts; col.error; col.created;
                    }
                    thead { tr {
                        @if selectable { th scope="col" { span.visually-hidden { "Select" } } }
                        th scope="col" { "Event" } th scope="col" { "Type" } th scope="col" { "Client / key" }
                        th scope="col" { "State" } th.n scope="col" { "Attempts" } th scope="col" { "Last error" } th scope="col" { "Created" }
                    } }
                    tbody {
                        @for event in &page_of_events.events {
                            @let id = event.event_id.to_string();
                            tr {
                                @if selectable {
                                    td { input type="checkbox" name="event_id" value=(id) aria-label=(format!("Select event {id}")); }
                                }
                                td data-label="Event" { (super::event_link(event.event_id)) }
                                td data-label="Type" title=(event.event_type) { (event.event_type) }
                                td data-label="Client / key" {
                                    @let key = format!("{} / {}", event.client_id, event.idempotency_key);
                                    a href=(link("/console/keys", &[("client", &event.client_id), ("key", &event.idempotency_key)])) title=(key) { (key) }
                                }
                                td data-label="State" { (state_words(event, now)) }
                                td.n data-label="Attempts" { (event.attempts) }
                                td data-label="Last error" { (charts::folded(event.last_error.as_deref().unwrap_or_default())) }
                                td data-label="Created" { (charts::time(event.created_at, now)) }
                            }
                        }
                    }
                } }
            }
        }
        @if let Some(next) = &next_link {
            p { a href=(next) { "More events" } }
        }
    };
    html_response(StatusCode::OK, page("Events", Some(&session), content))
}

pub(super) async fn keys(request: HttpRequest, state: SharedAdmin) -> HttpResponse {
    let Some(session) = session_of(&state, &request) else {
        return to_login();
    };
    let parameters = match Parameters::parse(request.query_string(), &["client", "key"]) {
        Ok(parameters) => parameters,
        Err(error) => return error_page(Some(&session), &error),
    };
    let (client, key) = (parameters.get("client"), parameters.get("key"));
    let found = match (client, key) {
        (Some(client), Some(key)) => Some(api::lookup_key(&state, client, key).await),
        _ => None,
    };
    let content = html! {
        form.filters method="get" action="/console/keys" {
            label { "Client" input name="client" value=(client.unwrap_or_default()) required; }
            label.wide { "Idempotency-Key" input name="key" value=(key.unwrap_or_default()) required; }
            button type="submit" { "Look up" }
        }
        @match &found {
            None => {}
            Some(Err(error)) => { p role="alert" { (error.to_string()) } }
            Some(Ok((view, now))) => {
                @let now = *now;
                div.scroll { table.fields {
                    caption { "The key's record" }
                    tbody {
                        tr { th scope="row" { "Status" } td { (view.status) " (answered " (view.response_status) ")" } }
                        tr { th scope="row" { "Created" } td { (time_text(&view.created_at, now)) } }
                        tr { th scope="row" { "Expires" } td { (time_text(&view.expires_at, now)) } }
                        tr { th scope="row" { "Entry" } td { @if let Some(entry) = view.entry_id { code { (entry.to_string()) } } } }
                        tr { th scope="row" { "Request hash" } td { code { (view.request_hash) } } }
                        @if let Some(ordering_key) = &view.ordering_key { tr { th scope="row" { "Ordering key" } td { (ordering_key) " #" (view.sequence.unwrap_or_default()) } } }
                        @if let Some(blocked_by) = view.blocked_by { tr { th scope="row" { "Held back by" } td { (event_link(blocked_by)) " (parked)" } } }
                    }
                } }
                div.scroll { table.cards {
                    caption { "Its events" }
                    thead { tr { th scope="col" { "Event" } th scope="col" { "Type" } th scope="col" { "Delivery" } th.n scope="col" { "Attempts" } th scope="col" { "Last error" } th.n scope="col" { "Replays" } } }
                    tbody {
                        @for event in &view.events {
                            tr {
                                td data-label="Event" { (event_link(event.event_id)) }
                                td data-label="Type" { (event.event_type) }
                                td data-label="Delivery" {
                                    @if let Some(sent) = &event.sent_at { span.state.sent { "sent" } " " (time_text(sent, now)) }
                                    @else if let Some(skipped) = &event.skipped_at { span.state.skipped { "skipped" } " " (time_text(skipped, now)) }
                                    @else if let Some(failed) = &event.failed_at { span.state.parked { "parked" } " " (time_text(failed, now)) }
                                    @else if let Some(blocked_by) = event.blocked_by { span.state.parked { "held" } " behind " (event_link(blocked_by)) " (parked)" }
                                    @else if let Some(due) = &event.next_attempt_at { span.state.unsent { "unsent" } ", due " (time_text(due, now)) }
                                    @else { span.state.unsent { "held" } " behind earlier events of its ordering key" }
                                }
                                td.n data-label="Attempts" { (event.attempts) }
                                td data-label="Last error" { (charts::folded(event.last_error.as_deref().unwrap_or_default())) }
                                td.n data-label="Replays" { (event.replay_count) }
                            }
                        }
                    }
                } }
            }
        }
    };
    html_response(StatusCode::OK, page("Key lookup", Some(&session), content))
}

pub(super) async fn actions(request: HttpRequest, state: SharedAdmin) -> HttpResponse {
    let Some(session) = session_of(&state, &request) else {
        return to_login();
    };
    let parsed =
        Parameters::parse(request.query_string(), &["limit", "cursor"]).and_then(|parameters| {
            let mut problems = Vec::new();
            let page = api::actions_page_of(&parameters, &mut problems);
            if problems.is_empty() {
                Ok(page)
            } else {
                Err(ApiError::InvalidQuery(problems.join("; ")))
            }
        });
    let (limit, cursor) = match parsed {
        Ok(page) => page,
        Err(error) => return error_page(Some(&session), &error),
    };
    let (page_of_actions, now) = match api::read_actions(&state, limit, cursor).await {
        Ok(page) => page,
        Err(error) => return error_page(Some(&session), &error),
    };
    let content = html! {
        @if page_of_actions.actions.is_empty() {
            p role="status" { "No admin action yet." }
        } @else {
            div.scroll { table.cards {
                caption { "Every admin action, newest first" }
                thead { tr { th.n scope="col" { "Action" } th scope="col" { "When" } th scope="col" { "Admin" } th scope="col" { "What" } th.n scope="col" { "Events changed" } th scope="col" { "Of" } } }
                tbody {
                    @for action in &page_of_actions.actions {
                        tr {
                            td.n data-label="Action" { (action.id) }
                            td data-label="When" { (charts::time(action.created_at, now)) }
                            td data-label="Admin" { (action.admin_id) }
                            td data-label="What" { (action.action) }
                            td.n data-label="Events changed" { (action.changed) }
                            td data-label="Of" {
                                @match serde_json::from_value::<Selector>(action.selector.clone()) {
                                    Ok(selector) => { (selector_words(&selector, now)) }
                                    Err(_) => { code { (action.selector.to_string()) } }
                                }
                            }
                        }
                    }
                }
            } }
            @if let Some(next) = &page_of_actions.next {
                p { a href=(link("/console/actions", &[("cursor", next)])) { "Older actions" } }
            }
        }
    };
    html_response(StatusCode::OK, page("Action log", Some(&session), content))
}
