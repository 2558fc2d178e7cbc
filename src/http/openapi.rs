//! `GET /openapi.json`: the OpenAPI 3.1 description, generated from the handlers' annotations.

use actix_web::HttpResponse;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr};
use utoipa::{Modify, OpenApi};

use crate::entry::{EntryView, FieldError, NewEntryRequest};
use crate::http::problem::Problem;
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
    modifiers(&BearerAuth, &MethodsAndKeys),
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

fn method_not_allowed(allow: &str) -> Response {
    ResponseBuilder::new()
        .description(format!(
            "The method is not one of this path's (`method-not-allowed`); `Allow` lists them: {allow}"
        ))
        .header(
            "Allow",
            HeaderBuilder::new()
                .schema(ObjectBuilder::new().schema_type(Type::String))
                .description(Some(format!("`{allow}`")))
                .build(),
        )
        .content(
            "application/problem+json",
            Content::new(Some(Ref::from_schema_name("Problem"))),
        )
        .build()
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
        let misdirected = ResponseBuilder::new()
            .description("The `Host` header, or the request target, names a host other than localhost, 127.0.0.0/8 or [::1]: without clients configured the daemon answers only requests to a loopback host (`misdirected-request`)")
            .content(
                "application/problem+json",
                Content::new(Some(Ref::from_schema_name("Problem"))),
            )
            .build();
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
