//! `GET /openapi.json` on the admin listener: the admin API's OpenAPI 3.1 description.

use actix_web::HttpResponse;
use utoipa::openapi::path::HttpMethod;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::admin::{api, store};
use crate::http::openapi::{add_problem_responses, RouteProblems};
use crate::http::problem::{
    ProblemType, IDEMPOTENCY_KEY_REUSED, INTERNAL_ERROR, INVALID_IDEMPOTENCY_KEY, INVALID_REQUEST,
    MALFORMED_JSON, MISSING_IDEMPOTENCY_KEY, NOT_FOUND, PAYLOAD_TOO_LARGE, REQUEST_TIMEOUT,
    STORAGE_UNAVAILABLE, UNAUTHORIZED, UNSUPPORTED_MEDIA_TYPE,
};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "retrysafe admin",
        description = "The admin listener of retrysafe: the outbox at a glance, events by filter, retry and skip by selector (idempotent with an Idempotency-Key), any client's key, and the log of admin actions. Takes an admin's bearer token ([[auth.admins]]).",
    ),
    paths(
        api::outbox,
        api::outbox_history,
        api::events,
        api::event,
        api::retry,
        api::skip,
        api::key,
        api::actions,
    ),
    components(schemas(
        api::OutboxOverview,
        api::BlockedOverview,
        api::BrokerState,
        api::OutboxHistoryView,
        crate::admin::history::HistorySeries,
        crate::admin::history::HistoryPoint,
        api::EventPage,
        api::ActionRequest,
        api::ActionPage,
        store::TypeBacklog,
        store::ListedEvent,
        store::WaitsFor,
        store::EventDetail,
        store::SkipRecord,
        store::EventReplay,
        store::EventState,
        store::Selector,
        store::Action,
        store::ActionOutcome,
        store::LoggedAction,
        crate::http::keys::KeyView,
        crate::http::keys::EventView,
        crate::http::problem::Problem,
    )),
    modifiers(&AdminAuth, &AdminProblemResponses),
    tags((name = "admin", description = "The outbox, its events and the admins' actions")),
)]
pub struct AdminApiDoc;

struct AdminAuth;

impl Modify for AdminAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An admin's token; configured as [[auth.admins]] with its SHA-256 (retrysafe token new --admin NAME).",
                    ))
                    .build(),
            ),
        );
    }
}

/// What the problems mean on the admin listener, where the table's words are the API's.
const NO_ADMIN: (&ProblemType, &str) = (
    &UNAUTHORIZED,
    "no admin token, or one that is not an admin's (a client's token is refused here)",
);
const BUSY: (&ProblemType, &str) = (
    &STORAGE_UNAVAILABLE,
    "the database did not answer in time, or the admin listener's share of the read pool stayed taken; retry after the time in `Retry-After`",
);
const BAD_QUERY: (&ProblemType, &str) = (
    &INVALID_REQUEST,
    "a query parameter is unknown, repeated or invalid; the detail names it",
);
/// What a page of events or of the action log answers.
const PAGE_PROBLEMS: &[&ProblemType] = &[
    &UNAUTHORIZED,
    &INVALID_REQUEST,
    &STORAGE_UNAVAILABLE,
    &INTERNAL_ERROR,
];
/// What a retry or a skip answers.
const ACTION_PROBLEMS: &[&ProblemType] = &[
    &UNAUTHORIZED,
    &MISSING_IDEMPOTENCY_KEY,
    &INVALID_IDEMPOTENCY_KEY,
    &UNSUPPORTED_MEDIA_TYPE,
    &REQUEST_TIMEOUT,
    &PAYLOAD_TOO_LARGE,
    &MALFORMED_JSON,
    &INVALID_REQUEST,
    &IDEMPOTENCY_KEY_REUSED,
    &STORAGE_UNAVAILABLE,
    &INTERNAL_ERROR,
];

/// The problem types each admin operation answers with, from which the description's problem
/// responses are made, as the API's are from [`crate::http::openapi::ROUTE_PROBLEMS`]; the
/// handlers' annotations give only their successes.
pub const ADMIN_ROUTE_PROBLEMS: [RouteProblems; 8] = [
    RouteProblems {
        method: HttpMethod::Get,
        path: "/admin/v1/outbox",
        problems: &[&UNAUTHORIZED, &STORAGE_UNAVAILABLE, &INTERNAL_ERROR],
        here: &[NO_ADMIN, BUSY],
    },
    RouteProblems {
        method: HttpMethod::Get,
        path: "/admin/v1/outbox/history",
        problems: &[&UNAUTHORIZED],
        here: &[NO_ADMIN],
    },
    RouteProblems {
        method: HttpMethod::Get,
        path: "/admin/v1/events",
        problems: PAGE_PROBLEMS,
        here: &[NO_ADMIN, BAD_QUERY, BUSY],
    },
    RouteProblems {
        method: HttpMethod::Get,
        path: "/admin/v1/events/{event_id}",
        problems: &[
            &UNAUTHORIZED,
            &INVALID_REQUEST,
            &NOT_FOUND,
            &STORAGE_UNAVAILABLE,
            &INTERNAL_ERROR,
        ],
        here: &[
            NO_ADMIN,
            BUSY,
            (&INVALID_REQUEST, "the event id is not a UUID"),
            (
                &NOT_FOUND,
                "no such event (never written, or deleted by the janitor once sent and past retention)",
            ),
        ],
    },
    RouteProblems {
        method: HttpMethod::Post,
        path: "/admin/v1/events/retry",
        problems: ACTION_PROBLEMS,
        here: &[
            NO_ADMIN,
            BUSY,
            (
                &INVALID_REQUEST,
                "a selector that is invalid, or that would match every parked event without `all: true`; nothing changed",
            ),
        ],
    },
    RouteProblems {
        method: HttpMethod::Post,
        path: "/admin/v1/events/skip",
        problems: ACTION_PROBLEMS,
        here: &[
            NO_ADMIN,
            BUSY,
            (
                &INVALID_REQUEST,
                "a selector that is invalid, that would match every parked event without `all: true`, or that matches more than 100 events; nothing changed",
            ),
        ],
    },
    RouteProblems {
        method: HttpMethod::Get,
        path: "/admin/v1/keys/{client}/{key}",
        problems: &[
            &UNAUTHORIZED,
            &INVALID_REQUEST,
            &INVALID_IDEMPOTENCY_KEY,
            &NOT_FOUND,
            &STORAGE_UNAVAILABLE,
            &INTERNAL_ERROR,
        ],
        here: &[
            NO_ADMIN,
            BUSY,
            (&INVALID_REQUEST, "the client id is not one (1 to 64 of a-z A-Z 0-9 . _ -)"),
            (&NOT_FOUND, "no live record for the key"),
        ],
    },
    RouteProblems {
        method: HttpMethod::Get,
        path: "/admin/v1/actions",
        problems: PAGE_PROBLEMS,
        here: &[NO_ADMIN, BAD_QUERY, BUSY],
    },
];

struct AdminProblemResponses;

impl Modify for AdminProblemResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        add_problem_responses(openapi, &ADMIN_ROUTE_PROBLEMS);
    }
}

pub async fn admin_openapi_json() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(AdminApiDoc::openapi().to_pretty_json().unwrap_or_default())
}
