//! Bearer-token authentication of clients.

use std::sync::Arc;

use actix_web::http::header;
use actix_web::HttpRequest;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{AuthSettings, ANONYMOUS_CLIENT};
use crate::http::problem::ApiError;

/// Resolves the client a request comes from.
pub struct Authenticator {
    /// (client id, SHA-256 of its token). Empty: every request is the anonymous client, which
    /// configuration allows only on a loopback listen address.
    clients: Vec<(Arc<str>, [u8; 32])>,
    anonymous: Arc<str>,
}

impl Authenticator {
    pub fn new(settings: &AuthSettings) -> Self {
        let clients = settings
            .clients
            .iter()
            .map(|client| {
                let mut digest = [0u8; 32];
                // Validated as 64 hex digits when the configuration was loaded.
                hex::decode_to_slice(&client.token_sha256, &mut digest)
                    .expect("token_sha256 is validated as 64 hex digits");
                (Arc::from(client.id.as_str()), digest)
            })
            .collect();
        Self {
            clients,
            anonymous: Arc::from(ANONYMOUS_CLIENT),
        }
    }

    /// Whether every request is the anonymous client (no clients configured).
    pub fn is_anonymous(&self) -> bool {
        self.clients.is_empty()
    }

    pub fn authenticate(&self, request: &HttpRequest) -> Result<Arc<str>, ApiError> {
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
