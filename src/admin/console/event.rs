//! One event's page (`/console/events/{event_id}`): what became of it in a sentence, then its
//! fields, its failed attempts, what it waits for, its replays and its payload; retry or skip
//! it from there.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use maud::{html, Markup};

use crate::admin::api;
use crate::admin::charts;
use crate::admin::store::{EventDetail, EventState};
use crate::admin::SharedAdmin;

use super::pages::state_words;
use super::{error_page, event_link, html_response, link, page, session_of, to_login};

pub(super) async fn event(
    request: HttpRequest,
    path: web::Path<String>,
    state: SharedAdmin,
) -> HttpResponse {
    let Some(session) = session_of(&state, &request) else {
        return to_login();
    };
    let found = match api::event_id_of(&path) {
        Ok(event_id) => api::read_event(&state, event_id).await,
        Err(error) => Err(error),
    };
    let (detail, now) = match found {
        Ok(found) => found,
        Err(error) => return error_page(Some(&session), &error),
    };
    let id = detail.event.event_id.to_string();
    let title = format!("Event …{}", &id[id.len() - 8..]);
    html_response(
        StatusCode::OK,
        page(&title, Some(&session), event_page(&detail, now)),
    )
}

/// What became of the event, in a sentence.
fn verdict(detail: &EventDetail, now: DateTime<Utc>) -> Markup {
    let event = &detail.event;
    let attempts = event.attempts;
    html! {
        @match event.state {
            EventState::Sent => {
                "Sent" @if let Some(at) = event.sent_at { " " (charts::time(at, now)) }
                @if attempts > 0 { ", after " (attempts) " failed attempt(s)" } "."
            }
            EventState::Parked => {
                "Parked" @if let Some(at) = event.failed_at { " " (charts::time(at, now)) }
                " after " (attempts) " failed attempt(s): retry it once the cause of its last error is fixed, or skip it."
            }
            EventState::Skipped => {
                "Skipped" @if let Some(at) = event.skipped_at { " " (charts::time(at, now)) } ": it will never be published."
            }
            EventState::Unsent => {
                @if let Some(head) = event.waits_for {
                    "Held: it waits for " (event_link(head.event_id)) ", the earlier event of its ordering key"
                    @if head.parked { ", which is parked: retry or skip that one and this one goes on." } @else { "." }
                } @else if let Some(due) = event.next_attempt_at {
                    "Unsent: a relay tries it " @if due <= now { "now" } @else { (charts::time(due, now)) } "."
                } @else {
                    "Held: it waits for the earlier events of its ordering key."
                }
            }
        }
    }
}

/// The time of a row, or words when there is none.
fn time_or(time: Option<DateTime<Utc>>, now: DateTime<Utc>, none: &str) -> Markup {
    match time {
        Some(time) => charts::time(time, now),
        None => html! { (none) },
    }
}

/// An error, whole (this is its page), and when it happened; or "none".
fn error_at(error: Option<&str>, at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Markup {
    html! {
        @match error {
            None => { "none" }
            Some(error) => {
                @if let Some(at) = at { (charts::time(at, now)) ": " }
                span.error { (error) }
            }
        }
    }
}

fn event_page(detail: &EventDetail, now: DateTime<Utc>) -> Markup {
    let event = &detail.event;
    let id = event.event_id.to_string();
    let actionable = matches!(event.state, EventState::Parked | EventState::Unsent);
    let next_attempt = match event.state {
        EventState::Unsent if event.next_attempt_at.is_some() => {
            time_or(event.next_attempt_at, now, "")
        }
        EventState::Unsent => {
            html! { "when the earlier events of its ordering key are sent or skipped" }
        }
        EventState::Parked => html! { "none: parked (a retry requeues it)" },
        EventState::Sent | EventState::Skipped => html! { "none" },
    };
    html! {
        p.verdict role="status" { (verdict(detail, now)) }
        @if actionable {
            p.actions {
                a.button href=(link("/console/confirm", &[("action", "retry"), ("event_id", &id)])) { "Retry this event…" }
                a.button href=(link("/console/confirm", &[("action", "skip"), ("event_id", &id)])) { "Skip this event…" }
                @if let Some(head) = event.waits_for.filter(|head| head.parked) {
                    a href=(format!("/console/events/{}", head.event_id)) { "The parked event it waits for" }
                }
            }
        }
        div.scroll { table.fields {
            caption { "The event" }
            tbody {
                tr { th scope="row" { "Event id" } td { code { (id) } } }
                tr { th scope="row" { "Type" } td { (event.event_type) } }
                tr { th scope="row" { "Client / key" } td {
                    a href=(link("/console/keys", &[("client", &event.client_id), ("key", &event.idempotency_key)])) { (event.client_id) " / " (event.idempotency_key) }
                } }
                tr { th scope="row" { "State" } td { (state_words(event, now)) } }
                tr { th scope="row" { "Created" } td { (charts::time(event.created_at, now)) } }
                @if let Some(ordering_key) = &event.ordering_key {
                    tr { th scope="row" { "Ordering key" } td { (ordering_key) " #" (event.sequence.unwrap_or_default()) } }
                }
                tr { th scope="row" { "Waits for" } td {
                    @match event.waits_for {
                        Some(head) => { (event_link(head.event_id)) @if head.parked { " (parked)" } @else { " (unsent)" } }
                        None => { "nothing" }
                    }
                } }
                tr { th scope="row" { "Attempts" } td {
                    (event.attempts) " failed"
                    @if detail.nacks > 0 { " (" (detail.nacks) " nacked by the broker)" }
                } }
                tr { th scope="row" { "Next attempt" } td { (next_attempt) } }
                tr { th scope="row" { "First error" } td { (error_at(detail.first_error.as_deref(), detail.first_error_at, now)) } }
                tr { th scope="row" { "Last error" } td { (error_at(event.last_error.as_deref(), detail.last_error_at, now)) } }
                @if let Some(at) = event.sent_at { tr { th scope="row" { "Sent" } td { (charts::time(at, now)) } } }
                @if let Some(at) = event.failed_at.filter(|_| event.state == EventState::Parked) { tr { th scope="row" { "Parked" } td { (charts::time(at, now)) } } }
                @if let Some(at) = event.skipped_at { tr { th scope="row" { "Skipped" } td { (charts::time(at, now)) } } }
                @if let Some(skip) = &detail.skip {
                    tr { th scope="row" { "Skipped by" } td {
                        @match &skip.admin_id {
                            Some(admin) => { "admin " (admin) }
                            None => { "retrysafe outbox skip, as database role " (skip.db_user) }
                        }
                        ": " (skip.reason)
                    } }
                }
                tr { th scope="row" { "Replays" } td { (detail.replay_count) } }
            }
        } }
        @if !detail.replays.is_empty() {
            h2 { "Replays" }
            div.scroll { table.cards {
                caption { "The replays that published it again, the newest first" }
                thead { tr { th.n scope="col" { "Replay" } th scope="col" { "When" } th scope="col" { "Target" } th scope="col" { "By" } } }
                tbody {
                    @for replay in &detail.replays {
                        tr {
                            td.n data-label="Replay" { (replay.replay_id) }
                            td data-label="When" { (charts::time(replay.replayed_at, now)) }
                            td data-label="Target" { (replay.target) }
                            td data-label="By" { (replay.requested_by) }
                        }
                    }
                }
            } }
        }
        h2 { "Payload" }
        pre.payload { (serde_json::to_string_pretty(&event.payload).unwrap_or_default()) }
    }
}
