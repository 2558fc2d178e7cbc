//! The admin listener (`admin.listen`, started when `[[auth.admins]]` are configured): the
//! admin API (`/admin/v1/...`, [`api`]), its OpenAPI description (`/openapi.json`), and the
//! console (`/console`, [`console`]), server-rendered HTML for an operator's browser.
//!
//! Admins see every client's data; clients never reach this listener (their tokens are not
//! admins'), and admins never reach the API. Everything here reads and acts through the read
//! pool with small, bounded queries ([`store`]): the write path is not touched.

pub mod api;
pub mod console;
pub mod openapi;
pub mod session;
pub mod store;

use std::sync::Arc;

use actix_web::web;

use crate::config::Config;
use crate::http::auth::Principals;
use crate::http::Methods;

/// The admins and the console's sessions.
pub struct AdminState {
    pub admins: Principals<Arc<str>>,
    pub sessions: session::Sessions,
}

impl AdminState {
    pub fn new(config: &Config) -> Self {
        Self {
            admins: Principals::new(
                config
                    .auth
                    .admins
                    .iter()
                    .map(|admin| (Arc::from(admin.id.as_str()), admin.token_sha256)),
            ),
            sessions: session::Sessions::new(
                config.admin.session_timeout,
                config.admin.tls_files().is_some(),
            ),
        }
    }
}

/// Every route of the admin listener.
pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(Methods::on("/admin/v1/outbox").get(api::outbox).finish())
        .service(Methods::on("/admin/v1/events").get(api::events).finish())
        .service(
            Methods::on("/admin/v1/events/retry")
                .post(api::retry)
                .finish(),
        )
        .service(
            Methods::on("/admin/v1/events/skip")
                .post(api::skip)
                .finish(),
        )
        .service(
            Methods::on("/admin/v1/keys/{client}/{key}")
                .get(api::key)
                .finish(),
        )
        .service(Methods::on("/admin/v1/actions").get(api::actions).finish())
        .service(
            Methods::on("/openapi.json")
                .get(openapi::admin_openapi_json)
                .finish(),
        );
    console::routes(config);
}
