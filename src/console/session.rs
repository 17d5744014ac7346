//! Who is using the console: sign-in sessions, their cookie, and the CSRF check.
//!
//! Signing in takes an admin token (the same `[[admin.token]]` the API takes). The
//! browser gets a random session id in an `HttpOnly; SameSite=Strict` cookie scoped to
//! `/console`; the token itself stays in this process. Every request looks the token
//! up again among the tokens configured *now* ([`crate::admin::access::find_token`]),
//! so a token removed or changed by a reload ends its sessions, and role and routes
//! are always the current ones. Sessions live in memory: a restart signs everyone out,
//! and behind a load balancer a session belongs to the instance that made it.
//!
//! Sessions are capped per token ([`MAX_SESSIONS_PER_TOKEN`]): a token's sign-in beyond
//! ends that token's oldest session and no other, so one token holder cannot sign
//! anyone else out. The cap on all sessions ([`MAX_SESSIONS`]) refuses a new sign-in
//! (503) rather than end someone's session.
//!
//! Every POST goes through [`Posted`]: it refuses requests a browser marks as coming
//! from another site (`Sec-Fetch-Site`, `Origin`), needs the session's cookie, and
//! needs the session's CSRF token in the form's `csrf` field (compared in constant
//! time). Only then does a handler run, and the handler still asks the API's own role
//! and route checks.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Form;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::Console;
use crate::admin::access::{Caller, find_token};

/// The session cookie's name.
pub const COOKIE: &str = "inlet_console";
/// A session ends this long after sign-in.
const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most; a sign-in beyond is refused (no one else is signed out).
pub const MAX_SESSIONS: usize = 10_000;
/// Sessions of one token kept at most; its sign-in beyond ends its own oldest session.
pub const MAX_SESSIONS_PER_TOKEN: usize = 64;

struct Session {
    /// The admin token it signed in with, looked up again at every request.
    token: String,
    /// [`digest`] of the token: its entry in `Table::by_token`.
    token_key: [u8; 32],
    csrf: String,
    started: Instant,
    /// A message for the next page (what the last action did).
    flash: Option<String>,
}

impl Session {
    fn live(&self) -> bool {
        self.started.elapsed() < LIFETIME
    }
}

/// The console's sessions, by the SHA-256 of their id (the id itself is only in the
/// browser's cookie), and each token's sessions, oldest first.
pub struct Sessions {
    table: Mutex<Table>,
    max: usize,
    max_per_token: usize,
}

#[derive(Default)]
struct Table {
    by_id: HashMap<[u8; 32], Session>,
    by_token: HashMap<[u8; 32], VecDeque<[u8; 32]>>,
}

impl Table {
    fn remove(&mut self, key: &[u8; 32]) {
        let Some(session) = self.by_id.remove(key) else { return };
        if let Some(list) = self.by_token.get_mut(&session.token_key) {
            list.retain(|k| k != key);
            if list.is_empty() {
                self.by_token.remove(&session.token_key);
            }
        }
    }

    /// Drops every session past its lifetime.
    fn sweep(&mut self) {
        let by_id = &mut self.by_id;
        by_id.retain(|_, s| s.live());
        self.by_token.retain(|_, list| {
            list.retain(|k| by_id.contains_key(k));
            !list.is_empty()
        });
    }
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions::with_caps(MAX_SESSIONS, MAX_SESSIONS_PER_TOKEN)
    }
}

/// A sign-in refused: [`MAX_SESSIONS`] sessions are live.
#[derive(Debug)]
pub struct TooManySessions;

fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    pub fn with_caps(max: usize, max_per_token: usize) -> Sessions {
        Sessions { table: Mutex::default(), max, max_per_token: max_per_token.max(1) }
    }

    /// A new session for `token`; returns its id (for the cookie). The token's own
    /// oldest session makes room for it; another token's never does.
    pub fn start(&self, token: &str) -> Result<String, TooManySessions> {
        let token_key = digest(token);
        let mut table = self.table.lock().expect("sessions lock");
        let Table { by_id, by_token } = &mut *table;
        if let Some(list) = by_token.get_mut(&token_key) {
            // Its ended sessions go first, then its oldest while it is at its cap.
            list.retain(|k| {
                let live = by_id.get(k).is_some_and(Session::live);
                if !live {
                    by_id.remove(k);
                }
                live
            });
            while list.len() >= self.max_per_token {
                if let Some(oldest) = list.pop_front() {
                    by_id.remove(&oldest);
                }
            }
        }
        if table.by_id.len() >= self.max {
            table.sweep();
            if table.by_id.len() >= self.max {
                return Err(TooManySessions);
            }
        }
        let id = random_hex();
        let key = digest(&id);
        let session =
            Session { token: token.to_string(), token_key, csrf: random_hex(), started: Instant::now(), flash: None };
        table.by_id.insert(key, session);
        table.by_token.entry(token_key).or_default().push_back(key);
        Ok(id)
    }

    pub fn end(&self, id: &str) {
        self.table.lock().expect("sessions lock").remove(&digest(id));
    }

    /// Leaves a message for the session's next page.
    pub fn flash(&self, id: &str, message: String) {
        if let Some(s) = self.table.lock().expect("sessions lock").by_id.get_mut(&digest(id)) {
            s.flash = Some(message);
        }
    }

    /// The session's token, CSRF token and pending message (taken), if it is live.
    fn get(&self, id: &str) -> Option<(String, String, Option<String>)> {
        let mut table = self.table.lock().expect("sessions lock");
        let key = digest(id);
        if !table.by_id.get(&key).is_some_and(Session::live) {
            table.remove(&key);
            return None;
        }
        let s = table.by_id.get_mut(&key)?;
        Some((s.token.clone(), s.csrf.clone(), s.flash.take()))
    }
}

/// The session id in the request's cookies.
fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The `Set-Cookie` value that signs the browser in.
pub fn cookie(id: &str) -> String {
    format!("{COOKIE}={id}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}", LIFETIME.as_secs())
}

/// The `Set-Cookie` value that signs it out.
pub fn clearing_cookie() -> String {
    format!("{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// A signed-in user: the caller as the API sees it, and the session.
pub struct Signed {
    pub caller: Caller,
    pub session: String,
    pub csrf: String,
    /// The message the last action left, shown once.
    pub flash: Option<String>,
}

/// Why a request is not let into the console.
pub enum NotSignedIn {
    /// A page: go and sign in.
    Page,
    /// An action: refused.
    Action(StatusCode, &'static str),
}

impl IntoResponse for NotSignedIn {
    fn into_response(self) -> Response {
        match self {
            NotSignedIn::Page => {
                let mut r = Redirect::to("/console/login").into_response();
                if let Ok(v) = clearing_cookie().parse() {
                    r.headers_mut().insert(header::SET_COOKIE, v);
                }
                r
            }
            NotSignedIn::Action(code, why) => {
                (code, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], why).into_response()
            }
        }
    }
}

impl FromRequestParts<Arc<Console>> for Signed {
    type Rejection = NotSignedIn;

    async fn from_request_parts(parts: &mut Parts, console: &Arc<Console>) -> Result<Self, Self::Rejection> {
        let refuse = || {
            if parts.method == Method::GET || parts.method == Method::HEAD {
                NotSignedIn::Page
            } else {
                NotSignedIn::Action(StatusCode::UNAUTHORIZED, "not signed in to the console")
            }
        };
        let Some(id) = session_id(&parts.headers) else { return Err(refuse()) };
        let Some((token, csrf, flash)) = console.sessions.get(&id) else { return Err(refuse()) };
        let admin = console.shared.config.lock().expect("config lock").admin.clone();
        let Some(caller) = find_token(&admin, &token) else {
            // The token is no longer configured: its sessions end with it.
            console.sessions.end(&id);
            tracing::warn!(path = parts.uri.path(), "console session refused: its token is no longer configured");
            return Err(refuse());
        };
        Ok(Signed { caller, session: id, csrf, flash })
    }
}

/// Whether a browser says the request comes from another site: `Sec-Fetch-Site`
/// `cross-site` or `same-site`, or an `Origin` whose host is not the request's `Host`.
pub fn cross_site(headers: &HeaderMap) -> bool {
    let text = |h: header::HeaderName| headers.get(h).and_then(|v| v.to_str().ok()).map(str::to_string);
    if headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|s| matches!(s, "cross-site" | "same-site"))
    {
        return true;
    }
    match (text(header::ORIGIN), text(header::HOST)) {
        (None, _) => false,
        (Some(origin), Some(host)) => origin.split_once("://").map(|(_, h)| h) != Some(host.as_str()),
        (Some(_), None) => true,
    }
}

/// A console POST that passed the checks: same site, signed in, the session's CSRF
/// token in the form. `fields` is the rest of the form.
pub struct Posted {
    pub signed: Signed,
    pub fields: HashMap<String, String>,
}

impl Posted {
    /// A form field, trimmed; `None` when absent or empty.
    pub fn field(&self, name: &str) -> Option<String> {
        self.fields.get(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
    }
}

impl FromRequest<Arc<Console>> for Posted {
    type Rejection = Response;

    async fn from_request(req: Request, console: &Arc<Console>) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        if cross_site(&parts.headers) {
            tracing::warn!(path = parts.uri.path(), "console request refused: it comes from another site");
            return Err(NotSignedIn::Action(StatusCode::FORBIDDEN, "refused: the request comes from another site")
                .into_response());
        }
        let signed = Signed::from_request_parts(&mut parts, console).await.map_err(IntoResponse::into_response)?;
        let req = Request::from_parts(parts, body);
        let Form(pairs) = Form::<Vec<(String, String)>>::from_request(req, console)
            .await
            .map_err(|r| (r.status(), r.body_text()).into_response())?;
        let fields: HashMap<String, String> = pairs.into_iter().collect();
        let presented = fields.get("csrf").map(String::as_str).unwrap_or("");
        if !bool::from(presented.as_bytes().ct_eq(signed.csrf.as_bytes())) {
            tracing::warn!(caller = %signed.caller.name, "console request refused: missing or wrong CSRF token");
            return Err(
                NotSignedIn::Action(StatusCode::FORBIDDEN, "refused: missing or wrong CSRF token").into_response()
            );
        }
        Ok(Posted { signed, fields })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        let id = "ab".repeat(32);
        h.insert(header::COOKIE, format!("x=1; {COOKIE}={id}; y=2").parse().unwrap());
        assert_eq!(session_id(&h), Some(id));
        h.insert(header::COOKIE, format!("{COOKIE}=short").parse().unwrap());
        assert_eq!(session_id(&h), None);
    }

    #[test]
    fn a_tokens_sign_ins_end_only_its_own_oldest_sessions() {
        let sessions = Sessions::default();
        let other = sessions.start("other-token").unwrap();
        let first = sessions.start("busy-token").unwrap();
        let mut last = String::new();
        for _ in 0..10_001 {
            last = sessions.start("busy-token").unwrap();
        }
        assert!(sessions.get(&other).is_some(), "another token's session survives");
        assert!(sessions.get(&first).is_none(), "the busy token's oldest session made room");
        assert!(sessions.get(&last).is_some());
        let table = sessions.table.lock().unwrap();
        assert_eq!(table.by_id.len(), MAX_SESSIONS_PER_TOKEN + 1);
        assert_eq!(table.by_token[&digest("busy-token")].len(), MAX_SESSIONS_PER_TOKEN);
    }

    #[test]
    fn at_the_cap_on_all_sessions_a_new_sign_in_is_refused_and_no_one_is_signed_out() {
        let sessions = Sessions::with_caps(3, 2);
        let a1 = sessions.start("a").unwrap();
        let a2 = sessions.start("a").unwrap();
        let b1 = sessions.start("b").unwrap();
        assert!(sessions.start("c").is_err(), "full: refused");
        let a3 = sessions.start("a").unwrap();
        assert!(sessions.get(&a1).is_none(), "a's own oldest made room for a");
        for id in [&a2, &a3, &b1] {
            assert!(sessions.get(id).is_some());
        }
        sessions.end(&b1);
        let c1 = sessions.start("c").unwrap();
        assert!(sessions.get(&c1).is_some(), "room again once a session ended");
    }

    #[test]
    fn requests_from_other_sites_are_recognised() {
        let headers = |pairs: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(header::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
            }
            h
        };
        assert!(!cross_site(&headers(&[("host", "127.0.0.1:9")])));
        assert!(!cross_site(&headers(&[("host", "127.0.0.1:9"), ("origin", "http://127.0.0.1:9")])));
        assert!(!cross_site(&headers(&[("sec-fetch-site", "same-origin")])));
        assert!(cross_site(&headers(&[("host", "127.0.0.1:9"), ("origin", "http://evil.example")])));
        assert!(cross_site(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(cross_site(&headers(&[("origin", "null")])));
    }
}
