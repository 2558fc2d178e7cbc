//! Logging in and out, and what every console POST must carry: the session's CSRF token, and
//! the console's own origin.

use actix_web::http::header;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use maud::{html, Markup};

use crate::admin::session::Session;
use crate::admin::SharedAdmin;
use crate::http::entries::read_body_within;
use crate::http::listing::query_pairs;
use crate::http::problem::ApiError;

use super::{html_response, page, see_other, session_of};

/// Largest console form.
const MAX_FORM_BYTES: usize = 64 * 1024;

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

pub(super) async fn login_page(request: HttpRequest, state: SharedAdmin) -> HttpResponse {
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
pub(super) async fn form(
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

pub(super) fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(given, _)| given == name)
        .map(|(_, value)| value.as_str())
        .filter(|value| !value.is_empty())
}

/// The session of a console POST whose CSRF token is the session's; refused otherwise.
pub(super) fn posting_session(
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

pub(super) async fn login(
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

pub(super) async fn logout(
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
