//! A retry or a skip from the console: what it would change, asked to confirm, then done once
//! per form.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use maud::{html, Markup};

use crate::admin::api::{self};
use crate::admin::charts;
use crate::admin::store::{Action, ActionOutcome, Selector};
use crate::admin::SharedAdmin;
use crate::http::listing::query_pairs;
use crate::http::problem::ApiError;

use super::login::{field, form, posting_session};
use super::{counted, error_page, event_link, html_response, page, session_of, to_login};

/// The action and selector of a confirmation's query or an action's form.
fn selector_of(fields: &[(String, String)]) -> Result<(Action, Selector), ApiError> {
    let mut problems = Vec::new();
    let action = match field(fields, "action") {
        Some(text) => Action::parse(text).unwrap_or_else(|| {
            problems.push(format!("action: {text:?} is neither retry nor skip"));
            Action::Retry
        }),
        None => {
            problems.push("action: missing (retry or skip)".into());
            Action::Retry
        }
    };
    let mut event_ids = Vec::new();
    for (name, value) in fields {
        if name == "event_id" {
            match value.parse() {
                Ok(id) => event_ids.push(id),
                Err(_) => problems.push(format!("event_id: {value:?} is not an event id")),
            }
        }
    }
    let mut time = |name: &str| api::optional_time(name, field(fields, name), &mut problems);
    let created_after = time("created_after");
    let created_before = time("created_before");
    let selector = Selector {
        event_ids,
        event_type: field(fields, "type").map(str::to_owned),
        client: field(fields, "client").map(str::to_owned),
        error: field(fields, "error").map(str::to_owned),
        created_after,
        created_before,
        all: field(fields, "all") == Some("true"),
    };
    if problems.is_empty() {
        Ok((action, selector))
    } else {
        Err(ApiError::InvalidSelector(problems.join("; ")))
    }
}

/// A selector written as the filter it is: the events it names, or the parked events its
/// filters pick ("parked events of type entry.created whose last error is ..."); times as
/// long before `now`. The error comes last: it is folded, and its whole text opens below.
pub(super) fn selector_words(selector: &Selector, now: DateTime<Utc>) -> Markup {
    html! {
        @if !selector.event_ids.is_empty() {
            "event(s) "
            @for (index, id) in selector.event_ids.iter().enumerate() { @if index > 0 { ", " } (event_link(*id)) }
        } @else if !selector.has_filters() {
            "every parked event"
        } @else {
            "parked events"
            @if let Some(event_type) = &selector.event_type { " of type " code { (event_type) } }
            @if let Some(client) = &selector.client { " of client " code { (client) } }
            @if let Some(after) = selector.created_after { " created after " (charts::time(after, now)) }
            @if let Some(before) = selector.created_before { " created before " (charts::time(before, now)) }
            @if let Some(error) = &selector.error { " whose last error is " (charts::folded(error)) }
        }
    }
}

fn hidden_selector(action: Action, selector: &Selector) -> Markup {
    html! {
        input type="hidden" name="action" value=(action.as_str());
        @for id in &selector.event_ids { input type="hidden" name="event_id" value=(id.to_string()); }
        @if let Some(value) = &selector.event_type { input type="hidden" name="type" value=(value); }
        @if let Some(value) = &selector.client { input type="hidden" name="client" value=(value); }
        @if let Some(value) = &selector.error { input type="hidden" name="error" value=(value); }
        @if let Some(value) = selector.created_after { input type="hidden" name="created_after" value=(value.to_rfc3339()); }
        @if let Some(value) = selector.created_before { input type="hidden" name="created_before" value=(value.to_rfc3339()); }
        @if selector.all { input type="hidden" name="all" value="true"; }
    }
}

fn verb(action: Action) -> (&'static str, &'static str) {
    match action {
        Action::Retry => ("Retry", "requeued for delivery with a fresh attempt count"),
        Action::Skip => (
            "Skip",
            "given up on for good: never published (an ordering key goes on past them)",
        ),
    }
}

/// Says how many events an action would change, and asks to confirm it.
pub(super) async fn confirm(request: HttpRequest, state: SharedAdmin) -> HttpResponse {
    let Some(session) = session_of(&state, &request) else {
        return to_login();
    };
    let parsed = query_pairs(request.query_string()).and_then(|fields| selector_of(&fields));
    let (action, selector) = match parsed {
        Ok(parsed) => parsed,
        Err(error) => return error_page(Some(&session), &error),
    };
    let outcome = match api::run_action(&state, &session.admin, None, action, &selector).await {
        Ok((outcome, _)) => outcome,
        Err(error) => return error_page(Some(&session), &error),
    };
    let (verb, meaning) = verb(action);
    let key = uuid::Uuid::new_v4().to_string();
    let content = html! {
        div.selection { "Selected: " (selector_words(&selector, outcome.created_at)) }
        @if outcome.matched == 0 {
            p role="status" { "No event matches this selection now: nothing to do." }
        } @else {
            p role="status" { strong { (at_least(&outcome)) " event(s)" } " match. They will be " (meaning) "." }
            @if outcome.matched_capped { p { "Counting stopped at " (outcome.matched) "; the retry takes every one that matches, in one statement: if it takes longer than the database's statement timeout, nothing changes (narrow the selection by creation time)." } }
            form method="post" action="/console/act" {
                input type="hidden" name="csrf" value=(session.csrf);
                input type="hidden" name="key" value=(key);
                (hidden_selector(action, &selector))
                button type="submit" { (verb) " " (at_least(&outcome)) " event(s)" }
                " "
                a href="/console" { "Cancel" }
            }
        }
    };
    html_response(
        StatusCode::OK,
        page(&format!("{verb} events?"), Some(&session), content),
    )
}

/// Runs a confirmed action, once per form (its key): a form sent twice shows the first answer.
pub(super) async fn act(
    request: HttpRequest,
    payload: web::Payload,
    state: SharedAdmin,
) -> Result<HttpResponse, ApiError> {
    let fields = form(&state, &request, payload).await?;
    let session = posting_session(&state, &request, &fields)?;
    let key = field(&fields, "key").ok_or(ApiError::MissingIdempotencyKey)?;
    let key = crate::idempotency::IdempotencyKey::parse(key.as_bytes())
        .map_err(ApiError::InvalidIdempotencyKey)?;
    let (action, selector) = selector_of(&fields)?;
    let (outcome, replayed) =
        match api::run_action(&state, &session.admin, Some(&key), action, &selector).await {
            Ok(done) => done,
            Err(error) => return Ok(error_page(Some(&session), &error)),
        };
    Ok(html_response(
        StatusCode::OK,
        page("Done", Some(&session), outcome_view(&outcome, replayed)),
    ))
}

/// How many events an action matched, in words: "at least" when the count stopped at its cap.
fn at_least(outcome: &ActionOutcome) -> String {
    counted(outcome.matched, outcome.matched_capped)
}

fn outcome_view(outcome: &ActionOutcome, replayed: bool) -> Markup {
    let (verb, meaning) = verb(outcome.action);
    html! {
        p role="status" {
            (verb) ": " strong { (outcome.changed) " of " (at_least(outcome)) " event(s)" } " " (meaning) "."
            @if let Some(id) = outcome.action_id { " Recorded as action " (id) " in the action log." }
        }
        @if replayed { p { "This form had already been sent: this is what it did then; nothing was done again." } }
        @if outcome.changed < outcome.matched { p { "The others changed meanwhile (sent, or being published): look at them again." } }
        div.selection { "Selected: " (selector_words(&outcome.selector, outcome.created_at)) }
        p { a href="/console" { "Back to the overview" } " · " a href="/console/actions" { "The action log" } }
    }
}
