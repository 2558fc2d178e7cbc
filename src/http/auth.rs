//! Bearer-token authentication of clients, and their limits ([`crate::http::limits`]).

use std::sync::Arc;

use actix_web::http::header;
use actix_web::HttpRequest;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{AuthConfig, TokenDigest, ANONYMOUS_CLIENT};
use crate::http::limits::ClientLimiter;
use crate::http::problem::ApiError;

/// A client as a request is admitted for it: who, and its limits.
#[derive(Debug)]
pub struct Client {
    pub id: Arc<str>,
    pub limits: ClientLimiter,
}

/// Principals (clients, or admins) by the SHA-256 of their tokens.
pub struct Principals<T> {
    known: Vec<(T, [u8; 32])>,
}

impl<T: Clone> Principals<T> {
    /// From each principal and its token's SHA-256, as configured.
    pub fn new(configured: impl IntoIterator<Item = (T, TokenDigest)>) -> Self {
        let known = configured
            .into_iter()
            .map(|(principal, token_sha256)| (principal, *token_sha256.as_bytes()))
            .collect();
        Self { known }
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// The principal whose token is `token`. Compared against every one, in constant time, so
    /// that timing tells nothing about which token (or how much of one) matched.
    pub fn find(&self, token: &[u8]) -> Option<T> {
        let digest: [u8; 32] = Sha256::digest(token).into();
        let mut found = None;
        for (principal, expected) in &self.known {
            if bool::from(expected.ct_eq(&digest)) {
                found = Some(principal.clone());
            }
        }
        found
    }

    /// The principal of the request's bearer token.
    pub fn of_request(&self, request: &HttpRequest) -> Option<T> {
        self.find(bearer_token(request)?)
    }
}

/// Resolves the client a request comes from.
pub struct Authenticator {
    /// Each client by the SHA-256 of its token. Empty: every request is the anonymous client,
    /// which configuration allows only on a loopback listen address.
    clients: Principals<Arc<Client>>,
    anonymous: Arc<Client>,
}

impl Authenticator {
    pub fn new(auth: &AuthConfig) -> Self {
        let client = |id: &str, limits| {
            let id: Arc<str> = Arc::from(id);
            Arc::new(Client {
                limits: ClientLimiter::new(id.clone(), limits),
                id,
            })
        };
        let clients = Principals::new(auth.clients.iter().map(|configured| {
            (
                client(&configured.id, configured.limits),
                configured.token_sha256,
            )
        }));
        Self {
            clients,
            anonymous: client(ANONYMOUS_CLIENT, auth.anonymous_limits),
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
        self.clients
            .of_request(request)
            .ok_or(ApiError::Unauthorized)
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
