//! The console (`/console` on the admin listener): server-rendered HTML, templates compiled
//! into the binary (maud, escaped by default), no script, no request to anywhere but the
//! daemon. An admin logs in with their token, which is exchanged for a session cookie
//! ([`super::session`]); every form that changes something carries the session's CSRF token,
//! and a POST from another origin is refused. Pages work with the keyboard alone (links, forms,
//! labelled fields) and say everything in words, so that they read without colour.
//!
//! - this module: the routes, the page around every page, the answers' security headers and
//!   the stylesheet ([`style.css`](STYLE));
//! - [`login`]: logging in and out, and what every POST must carry (the session's CSRF token,
//!   the console's own origin);
//! - [`overview`]: the verdict, the figures now and their trends;
//! - [`pages`]: the events, the key lookup and the action log;
//! - [`event`]: one event's page;
//! - [`actions`]: a retry or a skip, from its confirmation to its outcome.

mod actions;
mod event;
mod login;
mod overview;
mod pages;

use actix_web::http::header;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, HttpResponseBuilder};
use maud::{html, Markup, DOCTYPE};

use crate::admin::session::Session;
use crate::admin::SharedAdmin;
use crate::http::problem::ApiError;
use crate::http::Methods;

pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(Methods::on("/console").get(overview::overview).finish())
        .service(
            Methods::on("/console/login")
                .get(login::login_page)
                .post(login::login)
                .finish(),
        )
        .service(Methods::on("/console/logout").post(login::logout).finish())
        .service(Methods::on("/console/events").get(pages::events).finish())
        .service(
            Methods::on("/console/events/{event_id}")
                .get(event::event)
                .finish(),
        )
        .service(
            Methods::on("/console/confirm")
                .get(actions::confirm)
                .finish(),
        )
        .service(Methods::on("/console/act").post(actions::act).finish())
        .service(Methods::on("/console/keys").get(pages::keys).finish())
        .service(Methods::on("/console/actions").get(pages::actions).finish())
        .service(Methods::on("/console/style.css").get(style).finish());
}

/// The console's stylesheet, served by the daemon (`/console/style.css`, allowed by the pages'
/// `style-src 'self'`).
const STYLE: &str = include_str!("style.css");

/// Headers of every console answer: never cached, never framed, no resource from elsewhere, no
/// script at all.
fn html_response(status: StatusCode, markup: Markup) -> HttpResponse {
    let mut builder = HttpResponseBuilder::new(status);
    secure_headers(&mut builder);
    builder
        .content_type("text/html; charset=utf-8")
        .body(markup.into_string())
}

fn secure_headers(builder: &mut HttpResponseBuilder) {
    builder
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .insert_header((
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        // Not no-referrer: under it browsers send `Origin: null` with the console's own forms,
        // which the origin check ([`same_origin`]) could not tell from a foreign page's.
        .insert_header((header::REFERRER_POLICY, "same-origin"))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"));
}

fn see_other(location: &str) -> HttpResponse {
    let mut builder = HttpResponse::SeeOther();
    secure_headers(&mut builder);
    builder
        .insert_header((header::LOCATION, location.to_owned()))
        .finish()
}

/// A page: the navigation (with the logout form when logged in), a heading, the content.
fn page(title: &str, session: Option<&Session>, content: Markup) -> Markup {
    refreshing_page(title, session, None, content)
}

/// [`page`], reloaded by the browser every `refresh` seconds when set: a meta refresh, which
/// loads the page's own address again (a GET: it never sends a form).
fn refreshing_page(
    title: &str,
    session: Option<&Session>,
    refresh: Option<u32>,
    content: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(seconds) = refresh { meta http-equiv="refresh" content=(seconds); }
                title { (title) " · retrysafe console" }
                link rel="stylesheet" href="/console/style.css";
            }
            body {
                header {
                    nav aria-label="Console" {
                        ul {
                            li { strong { "retrysafe console" } }
                            @if let Some(session) = session {
                                li { a href="/console" { "Overview" } }
                                li { a href="/console/events" { "Events" } }
                                li { a href="/console/keys" { "Key lookup" } }
                                li { a href="/console/actions" { "Action log" } }
                                li {
                                    form method="post" action="/console/logout" {
                                        input type="hidden" name="csrf" value=(session.csrf);
                                        button type="submit" { "Log out " (session.admin) }
                                    }
                                }
                            }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (content)
                }
            }
        }
    }
}

/// The request's session; None sends the browser to the login page.
fn session_of(state: &SharedAdmin, request: &HttpRequest) -> Option<Session> {
    state.sessions.of_request(request)
}

fn to_login() -> HttpResponse {
    see_other("/console/login")
}

/// A link with its query, each value percent-encoded.
fn link(path: &str, pairs: &[(&str, &str)]) -> String {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        if !value.is_empty() {
            query.append_pair(name, value);
        }
    }
    let query = query.finish();
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query}")
    }
}

/// A count as the console says it: "at least" when it stopped at its cap.
fn counted(count: i64, capped: bool) -> String {
    if capped {
        format!("at least {count}")
    } else {
        count.to_string()
    }
}

/// An event's id as lists show it, short (its last 8 hex digits: event ids begin with their
/// time, so that events written together share their first ones), with the whole id in its
/// title, linked to the event's page.
fn event_link(event_id: uuid::Uuid) -> Markup {
    let id = event_id.to_string();
    html! {
        a.event-id href=(format!("/console/events/{id}")) title=(id) {
            code { "…" (&id[id.len() - 8..]) }
        }
    }
}

/// A time the console shows as the API gives it (RFC 3339 text), as [`crate::admin::charts::time`]
/// shows it; the text itself if it is not one.
fn time_text(text: &str, now: chrono::DateTime<chrono::Utc>) -> Markup {
    match chrono::DateTime::parse_from_rfc3339(text) {
        Ok(time) => crate::admin::charts::time(time.with_timezone(&chrono::Utc), now),
        Err(_) => html! { (text) },
    }
}

/// An error shown as a page (the console's answer to a bad filter, or a database that does not
/// answer), with the status the API would give.
fn error_page(session: Option<&Session>, error: &ApiError) -> HttpResponse {
    use actix_web::ResponseError;
    let status = error.status_code();
    html_response(
        status,
        page(
            "Something went wrong",
            session,
            html! { p role="alert" { (error.to_string()) } p { a href="/console" { "Back to the overview" } } },
        ),
    )
}

async fn style() -> HttpResponse {
    let mut builder = HttpResponse::Ok();
    secure_headers(&mut builder);
    builder
        .insert_header((header::CACHE_CONTROL, "max-age=3600"))
        .content_type("text/css; charset=utf-8")
        .body(STYLE)
}
