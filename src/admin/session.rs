//! The console's logins: an admin's token exchanged for a session cookie (HttpOnly,
//! SameSite=Strict), and the CSRF token every console form carries.
//!
//! Sessions live in the daemon's memory: a restart logs every admin out, which costs a login.
//! They are bounded in number ([`MAX_SESSIONS`]); past it, the session closest to its end goes.
//! The cookie's value is a random 256-bit secret; only its SHA-256 is kept, so that the table
//! in memory holds nothing a reader could log in with.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::cookie::{Cookie, SameSite};
use actix_web::HttpRequest;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The session cookie's name.
pub const COOKIE: &str = "retrysafe_admin_session";

/// Sessions kept at most: a login past it ends the session closest to its end.
pub const MAX_SESSIONS: usize = 1024;

/// One login.
#[derive(Debug, Clone)]
pub struct Session {
    pub admin: Arc<str>,
    /// What every console form must send back (`csrf`).
    pub csrf: String,
    expires: Instant,
}

impl Session {
    /// Whether `sent` is this session's CSRF token (in constant time).
    pub fn csrf_matches(&self, sent: &str) -> bool {
        self.csrf.len() == sent.len() && bool::from(self.csrf.as_bytes().ct_eq(sent.as_bytes()))
    }
}

/// The logins of the console.
pub struct Sessions {
    by_secret: Mutex<HashMap<[u8; 32], Session>>,
    timeout: Duration,
    /// Whether the cookie is marked `Secure` (the admin listener speaks HTTPS).
    secure: bool,
}

impl Sessions {
    pub fn new(timeout: Duration, secure: bool) -> Self {
        Self {
            by_secret: Mutex::new(HashMap::new()),
            timeout,
            secure,
        }
    }

    /// Starts a session for `admin`; returns the cookie that carries it.
    pub fn start(&self, admin: Arc<str>) -> Cookie<'static> {
        let secret = random_hex();
        let now = Instant::now();
        let session = Session {
            admin,
            csrf: random_hex(),
            expires: now + self.timeout,
        };
        let mut sessions = self.by_secret.lock().expect("sessions lock");
        sessions.retain(|_, session| session.expires > now);
        if sessions.len() >= MAX_SESSIONS {
            let closest = sessions
                .iter()
                .min_by_key(|(_, session)| session.expires)
                .map(|(digest, _)| *digest);
            if let Some(digest) = closest {
                sessions.remove(&digest);
            }
        }
        sessions.insert(digest(&secret), session);
        drop(sessions);
        Cookie::build(COOKIE, secret)
            .path("/")
            .http_only(true)
            .same_site(SameSite::Strict)
            .secure(self.secure)
            .max_age(actix_web::cookie::time::Duration::seconds(
                self.timeout.as_secs() as i64,
            ))
            .finish()
    }

    /// The live session of the request's cookie, if any.
    pub fn of_request(&self, request: &HttpRequest) -> Option<Session> {
        let cookie = request.cookie(COOKIE)?;
        let digest = digest(cookie.value());
        let mut sessions = self.by_secret.lock().expect("sessions lock");
        match sessions.get(&digest) {
            Some(session) if session.expires > Instant::now() => Some(session.clone()),
            Some(_) => {
                sessions.remove(&digest);
                None
            }
            None => None,
        }
    }

    /// Ends the request's session; returns the cookie that clears it in the browser.
    pub fn end(&self, request: &HttpRequest) -> Cookie<'static> {
        if let Some(cookie) = request.cookie(COOKIE) {
            let digest = digest(cookie.value());
            self.by_secret
                .lock()
                .expect("sessions lock")
                .remove(&digest);
        }
        let mut cleared = Cookie::build(COOKIE, "")
            .path("/")
            .http_only(true)
            .same_site(SameSite::Strict)
            .secure(self.secure)
            .finish();
        cleared.make_removal();
        cleared
    }

    /// Sessions alive or not yet pruned.
    pub fn len(&self) -> usize {
        self.by_secret.lock().expect("sessions lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// 256 random bits, in hex.
fn random_hex() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn a_session_is_found_by_its_cookie_and_ended() {
        let sessions = Sessions::new(Duration::from_secs(60), true);
        let cookie = sessions.start(Arc::from("alice"));
        assert!(cookie.http_only().unwrap());
        assert_eq!(cookie.same_site(), Some(SameSite::Strict));
        assert!(cookie.secure().unwrap());
        let request = TestRequest::default()
            .cookie(cookie.clone())
            .to_http_request();
        let session = sessions.of_request(&request).expect("a live session");
        assert_eq!(&*session.admin, "alice");
        assert!(session.csrf_matches(&session.csrf.clone()));
        assert!(!session.csrf_matches("0"));
        let forged = TestRequest::default()
            .cookie(Cookie::new(COOKIE, "0".repeat(64)))
            .to_http_request();
        assert!(sessions.of_request(&forged).is_none());
        sessions.end(&request);
        assert!(sessions.of_request(&request).is_none());
    }

    #[test]
    fn sessions_expire_and_are_bounded() {
        let sessions = Sessions::new(Duration::from_millis(1), false);
        let cookie = sessions.start(Arc::from("alice"));
        std::thread::sleep(Duration::from_millis(5));
        let request = TestRequest::default().cookie(cookie).to_http_request();
        assert!(sessions.of_request(&request).is_none());
        let sessions = Sessions::new(Duration::from_secs(60), false);
        for _ in 0..MAX_SESSIONS + 10 {
            sessions.start(Arc::from("bob"));
        }
        assert_eq!(sessions.len(), MAX_SESSIONS);
    }
}
