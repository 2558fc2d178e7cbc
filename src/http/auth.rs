//! Bearer-token authentication of clients, and their limits ([`crate::http::limits`]).

use std::sync::Arc;

use actix_web::http::header;
use actix_web::HttpRequest;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{AuthSettings, ANONYMOUS_CLIENT};
use crate::http::limits::ClientLimiter;
use crate::http::problem::ApiError;

/// A client as a request is admitted for it: who, and its limits.
#[derive(Debug)]
pub struct Client {
    pub id: Arc<str>,
    pub limits: ClientLimiter,
}

/// Resolves the client a request comes from.
pub struct Authenticator {
    /// Each client with the SHA-256 of its token. Empty: every request is the anonymous client,
    /// which configuration allows only on a loopback listen address.
    clients: Vec<(Arc<Client>, [u8; 32])>,
    anonymous: Arc<Client>,
}

impl Authenticator {
    pub fn new(settings: &AuthSettings) -> Self {
        let client = |id: &str, limits| {
            let id: Arc<str> = Arc::from(id);
            Arc::new(Client {
                limits: ClientLimiter::new(id.clone(), limits),
                id,
            })
        };
        let clients = settings
            .clients
            .iter()
            .map(|configured| {
                let mut digest = [0u8; 32];
                // Validated as 64 hex digits when the configuration was loaded.
                hex::decode_to_slice(&configured.token_sha256, &mut digest)
                    .expect("token_sha256 is validated as 64 hex digits");
                let limits = settings.limits_of(Some(configured));
                (client(&configured.id, limits), digest)
            })
            .collect();
        Self {
            clients,
            anonymous: client(ANONYMOUS_CLIENT, settings.limits_of(None)),
        }
    }

    /// Whether every request is the anonymous client (no clients configured).
    pub fn is_anonymous(&self) -> bool {
        self.clients.is_empty()
    }

    /// The client of `request`, once its rate allows one more request
    /// (`max_requests_per_second`): 401 without valid credentials, 429 past the rate.
    pub async fn admit(&self, request: &HttpRequest) -> Result<Arc<Client>, ApiError> {
        let client = self.authenticate(request)?;
        client.limits.admit_request().await?;
        Ok(client)
    }

    fn authenticate(&self, request: &HttpRequest) -> Result<Arc<Client>, ApiError> {
        if self.clients.is_empty() {
            return Ok(self.anonymous.clone());
        }
        let token = bearer_token(request).ok_or(ApiError::Unauthorized)?;
        let digest: [u8; 32] = Sha256::digest(token).into();
        // Compare against every client, in constant time, so timing tells nothing about which
        // token (or how much of one) matched.
        let mut found = None;
        for (id, expected) in &self.clients {
            if bool::from(expected.ct_eq(&digest)) {
                found = Some(id.clone());
            }
        }
        found.ok_or(ApiError::Unauthorized)
    }
}

/// The bearer token of the request's one `Authorization` header. Two headers are refused: each
/// party in front of the daemon may pick a different one.
fn bearer_token(request: &HttpRequest) -> Option<&[u8]> {
    let mut values = request.headers().get_all(header::AUTHORIZATION);
    let value = values.next()?.as_bytes();
    if values.next().is_some() {
        return None;
    }
    let (scheme, token) = value.split_at(value.iter().position(|b| *b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = token.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// A fresh random token and the SHA-256 the configuration stores for it.
pub fn new_token() -> (String, String) {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let token = format!("rs_{}", hex::encode(bytes));
    let digest = hex::encode(Sha256::digest(token.as_bytes()));
    (token, digest)
}
