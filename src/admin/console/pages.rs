//! The pages that list: events by filter, any client's key, the action log.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use maud::html;

use crate::admin::api::{self, Parameters};
use crate::admin::charts;
use crate::admin::store::EventState;
use crate::admin::SharedAdmin;
use crate::http::problem::ApiError;

use super::{error_page, html_response, link, page, session_of, to_login};

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
    let (page_of_events, now) = match api::read_events(&state, &filter, limit, cursor).await {
        Ok(page) => page,
        Err(error) => return error_page(Some(&session), &error),
    };
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
    let mut retry_all_pairs: Vec<(&str, &str)> = std::iter::once(("action", "retry"))
        .chain(
            filter_pairs
                .iter()
                .copied()
                .filter(|(name, value)| *name != "state" && !value.is_empty()),
        )
        .collect();
    if retry_all_pairs.len() == 1 {
        // No filter: every parked event, which the selector must say.
        retry_all_pairs.push(("all", "true"));
    }
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
        @if filter.state == EventState::Parked {
            p { a href=(link("/console/confirm", &retry_all_pairs)) { "Retry every parked event that matches these filters…" } }
        }
        @if page_of_events.partial {
            // A walk that stopped at its cap: say so before the events, whose count is short.
            p role="status" { "This page looked at " (limit * crate::admin::store::WALK_PER_EVENT) " " (filter.state.as_str()) " events and stopped: " (page_of_events.events.len()) " of them match the filters. Older events may match: follow \"Older events\" below." }
        } @else if page_of_events.events.is_empty() {
            p role="status" { "No event matches." }
        }
        @if !page_of_events.events.is_empty() {
            form method="get" action="/console/confirm" {
                div.scroll { table.cards {
                    caption {
                        @if filter.state == EventState::Sent { "Events, the last sent first (" } @else { "Events, newest first (" }
                        (page_of_events.events.len()) " on this page)"
                    }
                    thead { tr {
                        th scope="col" { "Select" } th scope="col" { "Event" } th scope="col" { "Type" } th scope="col" { "Client and key" }
                        th scope="col" { "State" } th.n scope="col" { "Attempts" } th scope="col" { "Last error" } th scope="col" { "Created" } th scope="col" { "Payload" }
                    } }
                    tbody {
                        @for event in &page_of_events.events {
                            @let id = event.event_id.to_string();
                            tr {
                                td { input type="checkbox" name="event_id" value=(id) id=(format!("select-{id}")) aria-label=(format!("Select event {id}")); }
                                td data-label="Event" { label for=(format!("select-{id}")) { code { (id) } } }
                                td data-label="Type" { (event.event_type) }
                                td data-label="Client and key" { a href=(link("/console/keys", &[("client", &event.client_id), ("key", &event.idempotency_key)])) { (event.client_id) " / " (event.idempotency_key) } }
                                td data-label="State" { span class=(format!("state {}", event.state.as_str())) { (event.state.as_str()) } }
                                td.n data-label="Attempts" { (event.attempts) }
                                td data-label="Last error" { (charts::folded(event.last_error.as_deref().unwrap_or_default())) }
                                td data-label="Created" { (charts::time(event.created_at, now)) }
                                td data-label="Payload" { details { summary { "Show" } pre { (serde_json::to_string_pretty(&event.payload).unwrap_or_default()) } } }
                            }
                        }
                    }
                } }
                button type="submit" name="action" value="retry" { "Retry the selected events…" }
                " "
                button type="submit" name="action" value="skip" { "Skip the selected events…" }
            }
        }
        @if let Some(next) = &next_link {
            p { a href=(next) { "Older events" } }
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
            label { "Idempotency-Key" input name="key" value=(key.unwrap_or_default()) required size="50"; }
            button type="submit" { "Look up" }
        }
        @match &found {
            None => {}
            Some(Err(error)) => { p role="alert" { (error.to_string()) } }
            Some(Ok(view)) => {
                div.scroll { table {
                    caption { "The key's record" }
                    tbody {
                        tr { th scope="row" { "Status" } td { (view.status) " (answered " (view.response_status) ")" } }
                        tr { th scope="row" { "Created" } td { (view.created_at) } }
                        tr { th scope="row" { "Expires" } td { (view.expires_at) } }
                        tr { th scope="row" { "Entry" } td { (view.entry_id.map(|id| id.to_string()).unwrap_or_default()) } }
                        tr { th scope="row" { "Request hash" } td { code { (view.request_hash) } } }
                        @if let Some(ordering_key) = &view.ordering_key { tr { th scope="row" { "Ordering key" } td { (ordering_key) " #" (view.sequence.unwrap_or_default()) } } }
                        @if let Some(blocked_by) = view.blocked_by { tr { th scope="row" { "Held back by" } td { code { (blocked_by.to_string()) } } } }
                    }
                } }
                div.scroll { table {
                    caption { "Its events" }
                    thead { tr { th scope="col" { "Event" } th scope="col" { "Type" } th scope="col" { "Delivery" } th.n scope="col" { "Attempts" } th scope="col" { "Last error" } th.n scope="col" { "Replays" } } }
                    tbody {
                        @for event in &view.events {
                            tr {
                                td { code { (event.event_id.to_string()) } }
                                td { (event.event_type) }
                                td {
                                    @if let Some(sent) = &event.sent_at { "sent " (sent) }
                                    @else if let Some(skipped) = &event.skipped_at { "skipped " (skipped) }
                                    @else if let Some(failed) = &event.failed_at { "parked " (failed) }
                                    @else { "unsent" }
                                }
                                td.n { (event.attempts) }
                                td { (charts::folded(event.last_error.as_deref().unwrap_or_default())) }
                                td.n { (event.replay_count) }
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
            div.scroll { table {
                caption { "Every admin action, newest first" }
                thead { tr { th scope="col" { "Action" } th scope="col" { "When" } th scope="col" { "Admin" } th scope="col" { "What" } th scope="col" { "Selector" } th.n scope="col" { "Events changed" } } }
                tbody {
                    @for action in &page_of_actions.actions {
                        tr {
                            td { (action.id) }
                            td { (charts::time(action.created_at, now)) }
                            td { (action.admin_id) }
                            td { (action.action) }
                            td { pre { (action.selector.to_string()) } }
                            td.n { (action.changed) }
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
