//! The console (`/console` on the admin listener): server-rendered HTML, templates compiled
//! into the binary (maud, escaped by default), no script, no request to anywhere but the
//! daemon. An admin logs in with their token, which is exchanged for a session cookie
//! ([`super::session`]); every form that changes something carries the session's CSRF token,
//! and a POST from another origin is refused. Pages work with the keyboard alone (links, forms,
//! labelled fields) and say everything in words, so that they read without colour.

use actix_web::http::header;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, HttpResponseBuilder};
use maud::{html, Markup, DOCTYPE};

use crate::admin::api::{self, Parameters};
use crate::admin::charts;
use crate::admin::history::Range;
use crate::admin::session::Session;
use crate::admin::store::{Action, ActionOutcome, EventState, Selector};
use crate::admin::SharedAdmin;
use crate::http::entries::read_body_within;
use crate::http::listing::query_pairs;
use crate::http::problem::ApiError;
use crate::http::Methods;

/// Largest console form.
const MAX_FORM_BYTES: usize = 64 * 1024;

pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(Methods::on("/console").get(overview).finish())
        .service(
            Methods::on("/console/login")
                .get(login_page)
                .post(login)
                .finish(),
        )
        .service(Methods::on("/console/logout").post(logout).finish())
        .service(Methods::on("/console/events").get(events).finish())
        .service(Methods::on("/console/confirm").get(confirm).finish())
        .service(Methods::on("/console/act").post(act).finish())
        .service(Methods::on("/console/keys").get(keys).finish())
        .service(Methods::on("/console/actions").get(actions).finish())
        .service(Methods::on("/console/style.css").get(style).finish());
}

/// The console's stylesheet, served by the daemon (`/console/style.css`, allowed by the pages'
/// `style-src 'self'`): the system's fonts, a readable width, tables that scroll inside their
/// box rather than the page, numbers aligned, states in colours that also say their word.
const STYLE: &str = "
:root { color-scheme: light; --ink: #1b1f24; --muted: #59636e; --line: #d0d7de; --band: #f6f8fa;
  --ok: #1a7f37; --warn: #9a6700; --bad: #cf222e; --accent: #0969da; }
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif;
  color: var(--ink); margin: 0 auto; max-width: 72rem; padding: 0 1rem 2rem; line-height: 1.45; font-size: 1rem; }
h1 { font-size: 1.5rem; margin: 0.75rem 0; }
h2 { font-size: 1.2rem; margin: 1.75rem 0 0.5rem; }
header { border-bottom: 1px solid var(--line); }
nav ul { list-style: none; padding: 0; margin: 0.5rem 0; display: flex; gap: 0.5rem 1.25rem; flex-wrap: wrap; align-items: center; }
nav form { margin: 0; }
a { color: var(--accent); }
p, li { max-width: 70ch; }
.scroll { overflow-x: auto; max-width: 100%; margin: 0.5rem 0 1.5rem; }
table { border-collapse: collapse; min-width: 50%; }
caption { text-align: left; font-weight: 600; padding: 0.25rem 0; }
th, td { border-bottom: 1px solid var(--line); padding: 0.35rem 0.6rem; text-align: left; vertical-align: top; }
thead th { background: var(--band); font-weight: 600; white-space: nowrap; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td { overflow-wrap: break-word; }
code { overflow-wrap: anywhere; }
time { white-space: nowrap; text-decoration: underline dotted var(--muted); }
pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 0.25rem 0 0; font-size: 0.85rem; }
details.error summary { cursor: pointer; overflow-wrap: anywhere; }
.verdict { font-size: 1.15rem; font-weight: 600; border-left: 0.4rem solid; padding: 0.6rem 0.8rem; background: var(--band); max-width: none; }
.verdict.ok { border-color: var(--ok); }
.verdict.attention { border-color: var(--bad); }
.state { font-weight: 600; white-space: nowrap; }
.state::before { content: '\\25CF\\00A0'; }
.state.sent, .state.healthy { color: var(--ok); }
.state.unsent { color: var(--warn); }
.state.parked, .state.skipped { color: var(--bad); }
.figures { display: flex; flex-wrap: wrap; gap: 0.5rem 2rem; padding: 0; list-style: none; }
.figures strong { font-variant-numeric: tabular-nums; font-size: 1.2rem; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(100%, 30rem), 1fr)); gap: 1rem 1.5rem; }
figure.chart { margin: 0; min-width: 0; }
figure.chart svg { width: 100%; height: auto; display: block; border: 1px solid var(--line); background: #fff; }
figure.chart figcaption { font-size: 0.9rem; color: var(--muted); }
.chart .line { fill: none; stroke: var(--accent); stroke-width: 2; }
.chart circle.line { fill: var(--accent); }
.chart .grid { stroke: var(--line); stroke-width: 1; }
.chart .axis { font-size: 11px; fill: var(--muted); font-family: inherit; }
.choices { display: flex; flex-wrap: wrap; gap: 0.25rem 1rem; }
form.filters { display: flex; flex-wrap: wrap; gap: 0.5rem 1rem; align-items: end; }
form.filters label { display: flex; flex-direction: column; }
input, select, button { font: inherit; max-width: 100%; }
@media (max-width: 40rem) {
  table.cards, table.cards caption, table.cards tbody, table.cards tr, table.cards td { display: block; }
  table.cards thead { display: none; }
  table.cards tr { border-bottom: 1px solid var(--line); padding: 0.4rem 0; }
  table.cards td { border: 0; padding: 0.1rem 0; }
  table.cards td.n { text-align: left; }
  table.cards td[data-label]::before { content: attr(data-label) ': '; font-weight: 600; }
}
a:focus, button:focus, input:focus, select:focus, summary:focus { outline: 3px solid var(--accent); outline-offset: 2px; }
";

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

fn login_form(message: Option<&str>) -> Markup {
    page(
        "Log in",
        None,
        html! {
            @if let Some(message) = message { p role="alert" { (message) } }
            form method="post" action="/console/login" {
                p {
                    label for="token" { "Admin token" }
                    br;
                    input id="token" name="token" type="password" autocomplete="off" required size="70";
                }
                button type="submit" { "Log in" }
            }
            p { "The token is the one " code { "retrysafe token new --admin NAME" } " printed; its SHA-256 is in " code { "[[auth.admins]]" } "." }
        },
    )
}

async fn login_page(request: HttpRequest, state: SharedAdmin) -> HttpResponse {
    if session_of(&state, &request).is_some() {
        return see_other("/console");
    }
    html_response(StatusCode::OK, login_form(None))
}

/// Refuses a POST that a page of another origin made the browser send: its `Origin` (sent by
/// browsers with every POST) must be this listener's, and `Sec-Fetch-Site`, where sent,
/// same-origin.
fn same_origin(request: &HttpRequest) -> Result<(), ApiError> {
    if let Some(site) = request.headers().get("sec-fetch-site") {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return Err(ApiError::Forbidden(format!(
                "this form was sent from another site (Sec-Fetch-Site: {}); nothing was done",
                site.to_str().unwrap_or("?")
            )));
        }
    }
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let info = request.connection_info();
        let own = format!("{}://{}", info.scheme(), info.host());
        if origin.as_bytes() != own.as_bytes() {
            return Err(ApiError::Forbidden(format!(
                "this form was sent from {:?}, not from the console ({own}); nothing was done",
                origin.to_str().unwrap_or("?")
            )));
        }
    }
    Ok(())
}

/// The fields of a form (`application/x-www-form-urlencoded`), in order.
async fn form(
    state: &SharedAdmin,
    request: &HttpRequest,
    payload: web::Payload,
) -> Result<Vec<(String, String)>, ApiError> {
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    if !essence.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        return Err(ApiError::UnsupportedMediaType(format!(
            "Content-Type {essence:?} is not a form; console forms are application/x-www-form-urlencoded"
        )));
    }
    let body = read_body_within(state.body_timeout, request, payload, MAX_FORM_BYTES).await?;
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::MalformedJson("the form is not UTF-8".into()))?;
    query_pairs(text)
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(given, _)| given == name)
        .map(|(_, value)| value.as_str())
        .filter(|value| !value.is_empty())
}

/// The session of a console POST whose CSRF token is the session's; refused otherwise.
fn posting_session(
    state: &SharedAdmin,
    request: &HttpRequest,
    fields: &[(String, String)],
) -> Result<Session, ApiError> {
    same_origin(request)?;
    let session = session_of(state, request).ok_or(ApiError::Unauthorized)?;
    match field(fields, "csrf") {
        Some(sent) if session.csrf_matches(sent) => Ok(session),
        Some(_) => Err(ApiError::Forbidden(
            "the form's CSRF token is not this session's (the page may be from an earlier login: reload it); nothing was done".into(),
        )),
        None => Err(ApiError::Forbidden(
            "the form carries no CSRF token; nothing was done".into(),
        )),
    }
}

async fn login(
    request: HttpRequest,
    payload: web::Payload,
    state: SharedAdmin,
) -> Result<HttpResponse, ApiError> {
    same_origin(&request)?;
    let fields = form(&state, &request, payload).await?;
    let token = field(&fields, "token").unwrap_or_default().trim();
    let Some(admin) = state.admins.find(token.as_bytes()) else {
        tracing::warn!(peer = ?request.peer_addr(), "console login refused: not an admin's token");
        return Ok(html_response(
            StatusCode::UNAUTHORIZED,
            login_form(Some("That token is not an admin's. Nothing was changed.")),
        ));
    };
    tracing::info!(admin = %admin, "console login");
    let cookie = state.sessions.start(admin);
    let mut response = see_other("/console");
    response
        .add_cookie(&cookie)
        .map_err(|error| ApiError::Internal(anyhow::anyhow!("the session cookie: {error}")))?;
    Ok(response)
}

async fn logout(
    request: HttpRequest,
    payload: web::Payload,
    state: SharedAdmin,
) -> Result<HttpResponse, ApiError> {
    let fields = form(&state, &request, payload).await?;
    posting_session(&state, &request, &fields)?;
    let cleared = state.sessions.end(&request);
    let mut response = see_other("/console/login");
    response
        .add_cookie(&cleared)
        .map_err(|error| ApiError::Internal(anyhow::anyhow!("the session cookie: {error}")))?;
    Ok(response)
}

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
    let range_words = match range {
        Range::Hour => "last hour",
        Range::Day => "last day",
    };
    html! {
        h2 { "Trends over the " (range_words) }
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
            @for measure in &charts::MEASURES { (charts::chart(measure, &series, range_words)) }
        }
        p {
            "Sampled by this daemon every " (series.step_seconds) " s since it started (kept in memory, a restart starts afresh), from the database: "
            "the whole outbox's figures, the same on every daemon that shares it; the rates count every relay's events, a sample interval late."
            " The same series as JSON: " code { "GET /admin/v1/outbox/history" } "."
        }
    }
}

async fn overview(request: HttpRequest, state: SharedAdmin) -> HttpResponse {
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
    let cap = crate::outbox::store::GAUGE_COUNT_CAP;
    let count = |n: i64| {
        if n >= cap {
            format!("at least {n}")
        } else {
            n.to_string()
        }
    };
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
    if let Some(age) = totals.oldest_unsent_age_seconds.filter(|age| *age >= 60.0) {
        concerns.push(format!("the oldest unsent event is {age:.0} s old"));
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
            li { "Oldest unsent event: " strong { (totals.oldest_unsent_age_seconds.map(|age| format!("{age:.1} s old")).unwrap_or_else(|| "none".into())) } }
            li { "Broker: "
                @if overview.broker.connected { span.state.healthy { "connected" } } @else { span.state.parked { "not connected" } }
                @if let Some(reason) = &overview.broker.blocked { ", " span.state.parked { "blocked by RabbitMQ" } ": " (reason) }
            }
        }
        (trends(&state, range, refresh))
        h2 { "Backlog by type" }
        @if figures.by_type.is_empty() {
            p { "No unsent event." }
        } @else {
            div.scroll { table {
                caption { "Unsent events by type" }
                thead { tr { th scope="col" { "Event type" } th.n scope="col" { "Unsent (not parked)" } th.n scope="col" { "Parked" } } }
                tbody {
                    @for row in &figures.by_type {
                        tr { td { (row.event_type) } td.n { (row.unsent) } td.n { (row.parked) } }
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
                            td {
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
            div.scroll { table {
                caption { "Parked events that hold the most back" }
                thead { tr { th scope="col" { "Event" } th scope="col" { "Client" } th scope="col" { "Ordering key" } th.n scope="col" { "Sequence" } th.n scope="col" { "Held back" } th scope="col" { "Last error" } th scope="col" { "Act" } } }
                tbody {
                    @for event in &figures.blocking {
                        @let id = event.event_id.to_string();
                        tr {
                            td { code { (id) } } td { (event.client_id) } td { (event.ordering_key) } td.n { (event.sequence) } td.n { (event.blocked) } td { (charts::folded(&event.last_error)) }
                            td {
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
            div.scroll { table {
                caption { "The newest replays" }
                thead { tr { th scope="col" { "Id" } th scope="col" { "Status" } th scope="col" { "Target" } th scope="col" { "By" } th scope="col" { "Started" } th.n scope="col" { "Sent" } th.n scope="col" { "Of" } } }
                tbody {
                    @for replay in &overview.replays {
                        tr { td { (replay.id) } td { (replay.status) } td { (replay.target) } td { (replay.requested_by) } td { (charts::time(replay.started_at, now)) } td.n { (replay.events_sent) } td.n { (replay.events_total) } }
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

async fn events(request: HttpRequest, state: SharedAdmin) -> HttpResponse {
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

/// The selector in words.
fn describe(selector: &Selector) -> Markup {
    html! {
        ul {
            @if !selector.event_ids.is_empty() {
                li { "Events: " @for (index, id) in selector.event_ids.iter().enumerate() { @if index > 0 { ", " } code { (id.to_string()) } } }
            }
            @if let Some(event_type) = &selector.event_type { li { "Parked events of type " code { (event_type) } } }
            @if let Some(client) = &selector.client { li { "of client " code { (client) } } }
            @if let Some(error) = &selector.error { li { "whose last error is " pre { (error) } } }
            @if let Some(after) = selector.created_after { li { "created after " (crate::entry::format_time(after)) } }
            @if let Some(before) = selector.created_before { li { "created before " (crate::entry::format_time(before)) } }
            @if selector.all { li { "every parked event" } }
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
async fn confirm(request: HttpRequest, state: SharedAdmin) -> HttpResponse {
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
        p { "Selected:" }
        (describe(&selector))
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
async fn act(
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
    if outcome.matched_capped {
        format!("at least {}", outcome.matched)
    } else {
        outcome.matched.to_string()
    }
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
        (describe(&outcome.selector))
        p { a href="/console" { "Back to the overview" } " · " a href="/console/actions" { "The action log" } }
    }
}

async fn keys(request: HttpRequest, state: SharedAdmin) -> HttpResponse {
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

async fn actions(request: HttpRequest, state: SharedAdmin) -> HttpResponse {
    let Some(session) = session_of(&state, &request) else {
        return to_login();
    };
    let parsed =
        Parameters::parse(request.query_string(), &["limit", "cursor"]).and_then(|parameters| {
            let mut problems = Vec::new();
            let page = api::page_of(&parameters, &mut problems);
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
