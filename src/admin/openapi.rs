//! `GET /openapi.json` on the admin listener: the admin API's OpenAPI 3.1 description.

use actix_web::HttpResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::admin::{api, store};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "retrysafe admin",
        description = "The admin listener of retrysafe: the outbox at a glance, events by filter, retry and skip by selector (idempotent with an Idempotency-Key), any client's key, and the log of admin actions. Takes an admin's bearer token ([[auth.admins]]).",
    ),
    paths(api::outbox, api::outbox_history, api::events, api::retry, api::skip, api::key, api::actions),
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
        store::EventState,
        store::Selector,
        store::Action,
        store::ActionOutcome,
        store::LoggedAction,
        crate::http::keys::KeyView,
        crate::http::keys::EventView,
        crate::http::problem::Problem,
    )),
    modifiers(&AdminAuth),
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

pub async fn admin_openapi_json() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(AdminApiDoc::openapi().to_pretty_json().unwrap_or_default())
}
