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
//! carry browser cross-site markers or a `Host` that is not the listener's own name
//! (DNS rebinding).
//!
//! In front of everything a listener serves, [`gate`] answers only the listener's own
//! names ([`own_host`]) where no credential binds the request to Inlet: pushes to
//! routes without OIDC push auth, the probes, `/metrics` without a token, and every
//! request in `none-loopback` mode but verified pushes; and it refuses any request
//! with `Origin` there and on every push (a browser page; Inlet serves pages only
//! under `/console`, which checks `Origin` itself).
//!
//! Wrong tokens are guesses: [`crate::guesses`] counts them per peer and makes a peer
//! that guesses wait (429 and `Retry-After`) before a token of its is looked at again.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::answer::ApiError;
use crate::config::{AdminAuth, AdminConfig, PushAuth, Role};
use crate::guesses::Checked;
use crate::shared::Shared;

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
    /// Open or close a replay window.
    Replay,
    Promote,
    Rollback,
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
            Action::Replay => "replay",
            Action::Promote => "promote",
            Action::Rollback => "rollback",
            Action::Reload => "reload",
            Action::Purge => "purge",
            Action::ReadAudit => "read-audit",
        }
    }

    fn role(self) -> Role {
        match self {
            Action::Read => Role::Viewer,
            Action::Requeue
            | Action::Park
            | Action::Ignore
            | Action::Pause
            | Action::Resume
            | Action::Replay
            | Action::Promote
            | Action::Rollback => Role::Operator,
            Action::Reload | Action::Purge | Action::ReadAudit => Role::Admin,
        }
    }

    /// Acts on every route at once, so a token limited to some routes may not.
    fn global(self) -> bool {
        matches!(self, Action::Reload | Action::Purge | Action::ReadAudit)
    }
}

/// A repair, of one entry or by a job, takes the role of its action.
impl From<crate::inbox::repair::RepairAction> for Action {
    fn from(action: crate::inbox::repair::RepairAction) -> Action {
        match action {
            crate::inbox::repair::RepairAction::Requeue => Action::Requeue,
            crate::inbox::repair::RepairAction::Park => Action::Park,
            crate::inbox::repair::RepairAction::Ignore => Action::Ignore,
        }
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
    let (admin, public) = {
        let config = shared.config.lock().expect("config lock");
        (config.admin.clone(), config.server.public_hosts.clone())
    };
    match caller(&shared, &admin, &public, req.headers(), peer) {
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
    /// Seconds to wait (429).
    retry_after: Option<u64>,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut r = ApiError::new(self.status, self.why).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"inlet\""));
        }
        if let Some(secs) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        r
    }
}

fn caller(
    shared: &Shared,
    admin: &AdminConfig,
    public: &[String],
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
) -> Result<Caller, Refusal> {
    let unauthorized = |why| Refusal { status: StatusCode::UNAUTHORIZED, why, retry_after: None };
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let presented = value
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .ok_or_else(|| unauthorized("the Authorization header must be `Bearer <token>`"))?;
        return match shared.guesses.check(&shared.metrics, "api", peer, || find_token(admin, presented)) {
            Checked::Found(caller) => Ok(caller),
            Checked::Unknown => Err(unauthorized("unknown token")),
            Checked::Wait(wait) => Err(Refusal {
                status: StatusCode::TOO_MANY_REQUESTS,
                why: "too many unknown tokens from this address; wait (Retry-After) before the next",
                retry_after: Some(wait),
            }),
        };
    }
    if admin.auth != AdminAuth::NoneLoopback {
        return Err(unauthorized("a token is required: `Authorization: Bearer <token>`"));
    }
    if !peer.is_some_and(|p| p.ip().is_loopback()) {
        return Err(unauthorized("without a token, only loopback peers are let in"));
    }
    if cross_site(headers, public) {
        return Err(Refusal {
            status: StatusCode::FORBIDDEN,
            why: "a browser request from another site needs a token; none-loopback mode does not serve web pages",
            retry_after: None,
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
/// other than `none` / `same-origin`, and a `Host` that is not the listener's own
/// (a DNS-rebinding page talks to 127.0.0.1 under its own name).
fn cross_site(headers: &HeaderMap, public: &[String]) -> bool {
    let text = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
    if headers.contains_key(header::ORIGIN) {
        return true;
    }
    if text("sec-fetch-site").is_some_and(|s| !matches!(s, "none" | "same-origin")) {
        return true;
    }
    foreign_host(headers, public)
}

/// Whether the request's `Host` is not one of the listener's own names (a request
/// without `Host` is not a browser's).
fn foreign_host(headers: &HeaderMap, public: &[String]) -> bool {
    let mut hosts = headers.get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (None, _) => false,
        (Some(host), None) => !host.to_str().is_ok_and(|h| own_host(h, public)),
        (Some(_), Some(_)) => true,
    }
}

/// Whether `host` (a `Host` value, with or without port) is a name of the listener's
/// own: `localhost`, an IP address, or one of `public` (`[server] public_hosts`,
/// lowercase). A DNS-rebinding page reaches Inlet under a name its author controls and
/// its browser sends that name, never an IP address (an address has no DNS to
/// rebind); a page that names Inlet's address in its URL is another origin, and its
/// browser adds `Origin`.
pub fn own_host(host: &str, public: &[String]) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        let Some((ip, tail)) = rest.split_once(']') else { return false };
        if !(tail.is_empty() || tail.strip_prefix(':').is_some_and(is_port)) {
            return false;
        }
        return ip.parse::<std::net::Ipv6Addr>().is_ok();
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return false,
            None => host,
        }
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<std::net::Ipv4Addr>().is_ok()
        || public.iter().any(|p| p.eq_ignore_ascii_case(name))
}

fn is_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

// ---------------------------------------------------------------------------------------
// The listener's gate: own names only, no browser pages
// ---------------------------------------------------------------------------------------

/// The state of [`gate`].
#[derive(Clone)]
pub struct Gate {
    pub shared: Arc<Shared>,
    /// `server` or `admin`, for `inlet_listener_refused_total`.
    pub listener: &'static str,
}

/// Middleware in front of everything a listener serves (see the module doc): 403 with
/// reason `foreign_host` or `origin`, counted in `inlet_listener_refused_total`,
/// before any handler runs or any body is read.
pub async fn gate(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    let (loopback, metrics_need_token, public) = {
        let config = gate.shared.config.lock().expect("config lock");
        (
            config.admin.auth == AdminAuth::NoneLoopback,
            config.admin.metrics_need_token,
            config.server.public_hosts.clone(),
        )
    };
    let path = req.uri().path();
    let push = req.method() == Method::POST && path.starts_with("/push/");
    // A verified push's token names its audience: the Host does not matter there.
    let verified = push
        && gate
            .shared
            .routes()
            .get(&path["/push/".len()..])
            .is_some_and(|r| matches!(r.config.push_auth, Some(PushAuth::Oidc(_))));
    let open = matches!(path, "/healthz" | "/readyz") || (path == "/metrics" && !metrics_need_token);
    // In none-loopback mode nothing else binds a request to Inlet, but a verified push
    // (say, through a developer's tunnel) still carries its token.
    let host_rule = (loopback && !verified) || open || (push && !verified);
    // The console is a browser's: it checks `Origin` against `Host` itself.
    let origin_rule = push || open || (loopback && !(path == "/console" || path.starts_with("/console/")));
    let refusal = if origin_rule && req.headers().contains_key(header::ORIGIN) {
        Some(("origin", "refused: a request from a browser page (it carries `Origin`)"))
    } else if host_rule && foreign_host(req.headers(), &public) {
        Some((
            "foreign_host",
            "refused: `Host` is not a name of this listener (localhost, an IP address, or [server] public_hosts)",
        ))
    } else {
        None
    };
    let Some((reason, error)) = refusal else { return next.run(req).await };
    gate.shared.metrics.listener_refused(gate.listener, reason);
    let host = req.headers().get(header::HOST).map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned());
    tracing::warn!(
        listener = gate.listener,
        method = %req.method(),
        path,
        host = ?host,
        reason,
        "refused a request that is not for this listener's own names (DNS rebinding, a browser page)"
    );
    (StatusCode::FORBIDDEN, axum::Json(serde_json::json!({ "error": error, "reason": reason }))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_hosts() {
        let public = vec!["inlet.example.com".to_string()];
        for h in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:1",
            "localhost.:80",
            "[::1]:8080",
            "[::1]",
            "127.0.0.2",
            "10.0.0.1",
            "[2001:db8::1]:80",
            "inlet.example.com",
            "Inlet.Example.Com:443",
        ] {
            assert!(own_host(h, &public), "{h}");
        }
        for h in [
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "inlet.example.com.evil.example",
            "sub.inlet.example.com",
            "127.0.0.1:80:80",
            "127.0.0.1:http",
            "[::1]x",
            "[::1",
            "2130706433",
            "",
        ] {
            assert!(!own_host(h, &public), "{h}");
        }
        assert!(!own_host("inlet.example.com", &[]), "a public name only once configured");
    }
}
