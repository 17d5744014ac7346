//! Who is calling the admin API, and whether they may do what they ask.
//!
//! One middleware ([`authenticate`]) sits in front of every admin route, so a new
//! handler cannot forget it: it turns the `Authorization: Bearer` header into a
//! [`Caller`] or answers 401. Handlers then ask the caller per action
//! ([`Caller::require`]) and per route ([`Caller::may_see`]).
//!
//! Credentials come only from the `Authorization` header: never cookies, never the
//! query string, so a page in a browser cannot borrow them (a cross-site form can
//! send cookies but cannot set that header without a CORS preflight, which Inlet
//! never grants). The loopback mode, which needs no token, refuses requests that
//! carry browser cross-site markers or a non-loopback `Host` (DNS rebinding).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::answer::ApiError;
use crate::app::Shared;
use crate::config::{AdminAuth, AdminConfig, Role};

/// An authenticated caller of the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's name (`loopback` in the unauthenticated local mode); the audit
    /// log records actions under it.
    pub name: String,
    pub role: Role,
    /// The routes it may see and act on; `None` means all.
    pub routes: Option<BTreeSet<String>>,
    pub payloads: bool,
}

/// Something the admin API can be asked to do, and the role it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Read,
    Requeue,
    Park,
    Ignore,
    Pause,
    Resume,
    Reload,
    Purge,
    ReadAudit,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Read => "read",
            Action::Requeue => "requeue",
            Action::Park => "park",
            Action::Ignore => "ignore",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Reload => "reload",
            Action::Purge => "purge",
            Action::ReadAudit => "read-audit",
        }
    }

    fn role(self) -> Role {
        match self {
            Action::Read => Role::Viewer,
            Action::Requeue | Action::Park | Action::Ignore | Action::Pause | Action::Resume => Role::Operator,
            Action::Reload | Action::Purge | Action::ReadAudit => Role::Admin,
        }
    }

    /// Acts on every route at once, so a token limited to some routes may not.
    fn global(self) -> bool {
        matches!(self, Action::Reload | Action::Purge | Action::ReadAudit)
    }
}

impl Caller {
    /// The caller in `none-loopback` mode: a person at the machine itself.
    fn loopback() -> Caller {
        Caller { name: "loopback".into(), role: Role::Admin, routes: None, payloads: true }
    }

    pub fn may_see(&self, route: &str) -> bool {
        self.routes.as_ref().is_none_or(|r| r.contains(route))
    }

    /// Whether the caller's token covers every route (no `routes` list).
    pub fn may_see_all(&self) -> bool {
        self.routes.is_none()
    }

    /// Whether the caller's role (and routes) allow `action`: what the web console asks
    /// to decide which buttons to show. The check itself is [`Caller::require`].
    pub fn may(&self, action: Action) -> bool {
        self.refusal(action).is_none()
    }

    /// Ok when the caller's role allows `action`; otherwise the 403 answer, logged
    /// (refusals are not stored: they change nothing).
    pub fn require(&self, action: Action) -> Result<(), Forbidden> {
        let Some(why) = self.refusal(action) else { return Ok(()) };
        tracing::warn!(caller = %self.name, action = action.as_str(), %why, "admin request refused");
        Err(Forbidden(why))
    }

    /// Why the caller may not do `action`, or `None` when it may.
    fn refusal(&self, action: Action) -> Option<String> {
        if self.role < action.role() {
            Some(format!(
                "`{}` needs the {} role; token `{}` is {}",
                action.as_str(),
                action.role().as_str(),
                self.name,
                self.role.as_str()
            ))
        } else if action.global() && self.routes.is_some() {
            Some(format!("`{}` acts on every route; token `{}` is limited to some routes", action.as_str(), self.name))
        } else {
            None
        }
    }
}

/// A 403 answer and why.
#[derive(Debug)]
pub struct Forbidden(String);

impl From<Forbidden> for ApiError {
    fn from(f: Forbidden) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, f.0)
    }
}

impl IntoResponse for Forbidden {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

/// The middleware in front of the admin API: a [`Caller`] in the request's
/// extensions, or 401 / 403.
pub async fn authenticate(State(shared): State<Arc<Shared>>, mut req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
    let admin = shared.config.lock().expect("config lock").admin.clone();
    match caller(&admin, req.headers(), peer) {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(refusal) => {
            tracing::warn!(
                peer = ?peer,
                method = %req.method(),
                path = req.uri().path(),
                why = refusal.why,
                "admin request refused"
            );
            refusal.into_response()
        }
    }
}

/// The same gate for `/metrics` when `metrics_need_token` is set (any role will do).
pub async fn metrics_gate(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let need = shared.config.lock().expect("config lock").admin.metrics_need_token;
    if need { authenticate(State(shared), req, next).await } else { next.run(req).await }
}

/// Why a request was not let in.
struct Refusal {
    status: StatusCode,
    why: &'static str,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut r = ApiError::new(self.status, self.why).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer realm=\"inlet\""));
        }
        r
    }
}

fn caller(admin: &AdminConfig, headers: &HeaderMap, peer: Option<SocketAddr>) -> Result<Caller, Refusal> {
    let unauthorized = |why| Refusal { status: StatusCode::UNAUTHORIZED, why };
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let presented = value
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .ok_or_else(|| unauthorized("the Authorization header must be `Bearer <token>`"))?;
        return find_token(admin, presented).ok_or_else(|| unauthorized("unknown token"));
    }
    if admin.auth != AdminAuth::NoneLoopback {
        return Err(unauthorized("a token is required: `Authorization: Bearer <token>`"));
    }
    if !peer.is_some_and(|p| p.ip().is_loopback()) {
        return Err(unauthorized("without a token, only loopback peers are let in"));
    }
    if cross_site(headers) {
        return Err(Refusal {
            status: StatusCode::FORBIDDEN,
            why: "a browser request from another site needs a token; none-loopback mode does not serve web pages",
        });
    }
    Ok(Caller::loopback())
}

/// Compares the presented token with every configured one in constant time (over
/// SHA-256 digests, so lengths do not leak either) and without stopping at a match.
/// The web console signs its sessions in with it too (`crate::console`).
pub(crate) fn find_token(admin: &AdminConfig, presented: &str) -> Option<Caller> {
    let presented = Sha256::digest(presented.as_bytes());
    let mut found = None;
    for t in &admin.tokens {
        let known = Sha256::digest(t.secret.expose().as_bytes());
        if bool::from(known.ct_eq(&presented)) {
            found = Some(Caller { name: t.name.clone(), role: t.role, routes: t.routes.clone(), payloads: t.payloads });
        }
    }
    found
}

/// Markers a browser adds to a request a page on another site made: `Origin`
/// (any: Inlet serves no pages, so no legitimate caller sends one), `Sec-Fetch-Site`
/// other than `none` / `same-origin`, and a `Host` that is not a loopback name
/// (a DNS-rebinding page talks to 127.0.0.1 under its own name).
fn cross_site(headers: &HeaderMap) -> bool {
    let text = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
    if headers.contains_key(header::ORIGIN) {
        return true;
    }
    if text("sec-fetch-site").is_some_and(|s| !matches!(s, "none" | "same-origin")) {
        return true;
    }
    match text("host") {
        None => false,
        Some(host) => !is_loopback_host(host),
    }
}

fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(n, _)| n)
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for h in ["127.0.0.1:8080", "localhost", "LOCALHOST:1", "[::1]:8080", "127.0.0.2"] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in ["evil.example:8080", "10.0.0.1", "[2001:db8::1]:80", "127.0.0.1.evil.example"] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }
}
