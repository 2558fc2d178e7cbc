//! `GET /openapi.json`: the OpenAPI 3.1 description, generated from the handlers' annotations,
//! and each route's problem responses from the problems it answers ([`ROUTE_PROBLEMS`]) and the
//! problem table ([`crate::http::problem`]).

use std::collections::BTreeMap;

use actix_web::HttpResponse;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::HttpMethod;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr};
use utoipa::{Modify, OpenApi};

use crate::entry::{EntryView, FieldError, NewEntryRequest};
use crate::http::problem::{
    Problem, ProblemType, IDEMPOTENCY_KEY_REUSED, INTERNAL_ERROR, INVALID_IDEMPOTENCY_KEY,
    INVALID_REQUEST, MALFORMED_JSON, METHOD_NOT_ALLOWED, MISDIRECTED_REQUEST,
    MISSING_IDEMPOTENCY_KEY, NOT_FOUND, PAYLOAD_TOO_LARGE, RATE_LIMITED, REQUEST_IN_PROGRESS,
    REQUEST_TIMEOUT, STORAGE_UNAVAILABLE, UNAUTHORIZED, UNSUPPORTED_MEDIA_TYPE,
};
use crate::http::{entries, health, keys, listing, observe, SharedState};
use crate::idempotency::key::{KEY_PATTERN, MAX_KEY_LEN};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "retrysafe",
        description = "Makes retried writes safe: a write sent with an Idempotency-Key happens once, every retry gets the same answer, and its events reach RabbitMQ at least once.",
    ),
    paths(
        entries::create_entry,
        listing::list_entries,
        entries::get_entry,
        keys::get_key,
        health::healthz,
        health::readyz,
        observe::metrics,
        openapi_json,
    ),
    components(schemas(NewEntryRequest, EntryView, FieldError, Problem, listing::EntryPage, listing::ListedEntry, keys::KeyView, keys::EventView, health::Readiness)),
    modifiers(&BearerAuth, &ProblemResponses, &MethodsAndKeys),
    tags(
        (name = "entries", description = "Idempotent writes and their results"),
        (name = "operations", description = "Probes, metrics and this description"),
    ),
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A client's token; configured as [[auth.clients]] with its SHA-256. Not required when no clients are configured (loopback only).",
                    ))
                    .build(),
            ),
        );
    }
}

/// The problems one operation answers with.
pub struct RouteProblems {
    pub method: HttpMethod,
    pub path: &'static str,
    pub problems: &'static [&'static ProblemType],
    /// What some of them mean on this route, said in place of the table's description.
    pub here: &'static [(&'static ProblemType, &'static str)],
}

/// The problem types each API operation answers with, from which [`ProblemResponses`] makes its
/// responses; the handlers' annotations give only their successes. `method-not-allowed`, which
/// every path answers, and `misdirected-request`, which every operation answers in anonymous
/// mode, are added to every operation apart ([`MethodsAndKeys`], [`openapi_json`]). The probes,
/// `/metrics` and this description answer no other problem.
pub const ROUTE_PROBLEMS: [RouteProblems; 4] = [
    RouteProblems {
        method: HttpMethod::Post,
        path: entries::ENTRIES_PATH,
        problems: &[
            &UNAUTHORIZED,
            &RATE_LIMITED,
            &MISSING_IDEMPOTENCY_KEY,
            &INVALID_IDEMPOTENCY_KEY,
            &UNSUPPORTED_MEDIA_TYPE,
            &REQUEST_TIMEOUT,
            &PAYLOAD_TOO_LARGE,
            &MALFORMED_JSON,
            &INVALID_REQUEST,
            &IDEMPOTENCY_KEY_REUSED,
            &REQUEST_IN_PROGRESS,
            &STORAGE_UNAVAILABLE,
            &INTERNAL_ERROR,
        ],
        here: &[(
            &INVALID_REQUEST,
            "the body is not an entry (`errors` names each offending field); nothing was written",
        )],
    },
    RouteProblems {
        method: HttpMethod::Get,
        path: entries::ENTRIES_PATH,
        problems: &[
            &UNAUTHORIZED,
            &RATE_LIMITED,
            &INVALID_REQUEST,
            &STORAGE_UNAVAILABLE,
            &INTERNAL_ERROR,
        ],
        here: &[(
            &INVALID_REQUEST,
            "a query parameter is unknown, repeated or invalid, or the cursor was altered or belongs to another query; the detail names the parameter",
        )],
    },
    RouteProblems {
        method: HttpMethod::Get,
        path: "/v1/entries/{id}",
        problems: &[
            &UNAUTHORIZED,
            &RATE_LIMITED,
            &NOT_FOUND,
            &STORAGE_UNAVAILABLE,
            &INTERNAL_ERROR,
        ],
        here: &[],
    },
    RouteProblems {
        method: HttpMethod::Get,
        path: "/v1/idempotency-keys/{key}",
        problems: &[
            &UNAUTHORIZED,
            &RATE_LIMITED,
            &INVALID_IDEMPOTENCY_KEY,
            &NOT_FOUND,
            &STORAGE_UNAVAILABLE,
            &INTERNAL_ERROR,
        ],
        here: &[],
    },
];

/// Adds [`ROUTE_PROBLEMS`] to the operations: one response per status, describing each problem
/// type answered with it. Runs before [`MethodsAndKeys`], which copies each `GET` to its `HEAD`.
struct ProblemResponses;

impl Modify for ProblemResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        add_problem_responses(openapi, &ROUTE_PROBLEMS);
    }
}

/// Adds the problem responses of each route in `table` to its operation in `openapi`: one
/// response per status, describing each problem type answered with it. The API's
/// ([`ROUTE_PROBLEMS`]) and the admin listener's descriptions are made so.
pub fn add_problem_responses(openapi: &mut utoipa::openapi::OpenApi, table: &[RouteProblems]) {
    for route in table {
        let item = openapi.paths.paths.get_mut(route.path);
        let operation = item.and_then(|item| match route.method {
            HttpMethod::Get => item.get.as_mut(),
            HttpMethod::Post => item.post.as_mut(),
            _ => None,
        });
        // A route not in `paths(...)` has no operation to describe; the tests hold the two
        // lists to each other.
        let Some(operation) = operation else {
            continue;
        };
        let mut by_status: BTreeMap<u16, Vec<&ProblemType>> = BTreeMap::new();
        for problem in route.problems {
            for status in problem.statuses() {
                by_status.entry(status.as_u16()).or_default().push(problem);
            }
        }
        for (status, problems) in by_status {
            let response = problem_response(&problems, route.here);
            operation
                .responses
                .responses
                .insert(status.to_string(), RefOr::T(response));
        }
    }
}

/// The response of one status that answers `problems`: each one's slug, title and description
/// (the table's, or the route's own in `here`), a `Problem` body, and the header fields they
/// carry.
fn problem_response(problems: &[&ProblemType], here: &[(&ProblemType, &'static str)]) -> Response {
    let described: Vec<String> = problems
        .iter()
        .map(|problem| {
            let description = here
                .iter()
                .find(|(described, _)| described == problem)
                .map_or(problem.description, |(_, description)| description);
            format!("{} (`{}`): {description}", problem.title, problem.slug)
        })
        .collect();
    let description = match described.as_slice() {
        [one] => one.clone(),
        several => several
            .iter()
            .map(|line| format!("- {line}"))
            .collect::<Vec<_>>()
            .join("\n"),
    };
    let mut response = ResponseBuilder::new().description(description).content(
        "application/problem+json",
        Content::new(Some(Ref::from_schema_name("Problem"))),
    );
    let waits: Vec<&str> = problems
        .iter()
        .filter(|problem| problem.retry_after)
        .map(|problem| problem.slug)
        .collect();
    if !waits.is_empty() {
        let mut description = "Seconds to wait before retrying".to_owned();
        // At a status shared with problems that carry no Retry-After, say whose it is.
        if waits.len() < problems.len() {
            description = format!("{description} (`{}`)", waits.join("`, `"));
        }
        let seconds = ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int32)))
            .minimum(Some(0));
        response = response.header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(seconds)
                .description(Some(description))
                .build(),
        );
    }
    for (name, description) in problems.iter().flat_map(|problem| problem.headers) {
        response = response.header(
            *name,
            HeaderBuilder::new()
                .schema(ObjectBuilder::new().schema_type(Type::String))
                .description(Some(*description))
                .build(),
        );
    }
    response.build()
}

/// What the routes share and the handlers' annotations do not say, added to every path: `HEAD`
/// wherever `GET` is (the same answer without its body), the 405 problem with its `Allow`
/// header on every operation, and the `Idempotency-Key` rule on the header and the `{key}` path
/// parameter.
struct MethodsAndKeys;

impl Modify for MethodsAndKeys {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            if let Some(get) = &item.get {
                let mut head = get.clone();
                head.operation_id = head.operation_id.map(|id| format!("{id}_head"));
                head.summary = head
                    .summary
                    .map(|summary| format!("{summary} (headers only)"));
                for response in head.responses.responses.values_mut() {
                    if let RefOr::T(response) = response {
                        response.content.clear();
                    }
                }
                item.head = Some(head);
            }
            let methods = [
                ("GET", item.get.is_some()),
                ("HEAD", item.head.is_some()),
                ("POST", item.post.is_some()),
            ];
            let allow: Vec<&str> = methods
                .iter()
                .filter(|(_, present)| *present)
                .map(|(method, _)| *method)
                .collect();
            let not_allowed = method_not_allowed(&allow.join(", "));
            for operation in [&mut item.get, &mut item.head, &mut item.post]
                .into_iter()
                .flatten()
            {
                operation
                    .responses
                    .responses
                    .insert("405".into(), RefOr::T(not_allowed.clone()));
                for parameter in operation.parameters.iter_mut().flatten() {
                    if parameter.name == "Idempotency-Key" || parameter.name == "key" {
                        parameter.schema = Some(idempotency_key_schema());
                    }
                }
            }
        }
    }
}

/// The 405 of a path that answers `allow`: the table's, with the path's own methods.
fn method_not_allowed(allow: &str) -> Response {
    let mut response = problem_response(&[&METHOD_NOT_ALLOWED], &[]);
    if let Some(header) = response.headers.get_mut("Allow") {
        header.description = Some(format!("`{allow}`"));
    }
    response
}

fn idempotency_key_schema() -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(MAX_KEY_LEN))
        .pattern(Some(KEY_PATTERN))
        .description(Some(
            "1 to 255 visible ASCII characters (0x21 to 0x7E). In the header, a structured-field string (\"abc\") is unquoted first; parameters after it (\"abc\";p=1) are refused.",
        ))
        .into()
}

/// The OpenAPI 3.1 description of every route. When no clients are configured (every request
/// is then the anonymous client), bearer authentication is marked optional, and every operation
/// may answer 421 `misdirected-request` (a `Host` that is not loopback, see
/// [`crate::http::host`]).
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    responses((status = 200, description = "This description", content_type = "application/json", body = Object)),
)]
pub async fn openapi_json(state: SharedState) -> HttpResponse {
    let mut openapi = ApiDoc::openapi();
    if state.auth.is_anonymous() {
        let misdirected = problem_response(&[&MISDIRECTED_REQUEST], &[]);
        for item in openapi.paths.paths.values_mut() {
            for operation in [&mut item.get, &mut item.head, &mut item.post]
                .into_iter()
                .flatten()
            {
                if let Some(security) = operation.security.as_mut() {
                    security.push(SecurityRequirement::default());
                }
                operation
                    .responses
                    .responses
                    .insert("421".into(), RefOr::T(misdirected.clone()));
            }
        }
    }
    HttpResponse::Ok().json(openapi)
}
