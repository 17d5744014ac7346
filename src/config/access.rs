//! Who may do what: admin tokens and roles, and how push requests prove they come
//! from the subscription. Loaded from the `[admin]` and `[push]` sections and a
//! route's `source.auth`; see SECURITY.md for the model.

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;

/// Google's signing keys for OIDC tokens, the default JWKS of push verification.
pub const GOOGLE_JWKS_URL: &str = "https://www.googleapis.com/oauth2/v3/certs";

/// A secret read from the environment or a file. Its `Debug` and `Display` never
/// show the value, so a configuration can be logged whole.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Secret(value)
    }

    /// The value itself, for the one place that compares it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// The admin API's access rules (`[admin]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    pub auth: AdminAuth,
    /// A listener of its own for the admin API and metrics; `None` serves them on
    /// `[server] listen` beside the push endpoints.
    pub listen: Option<SocketAddr>,
    /// Whether `/metrics` needs a token (any role) like the API.
    pub metrics_need_token: bool,
    pub tokens: Vec<AdminToken>,
}

impl Default for AdminConfig {
    /// No `[admin]` section: tokens required, none defined, so the API refuses
    /// everyone until the operator defines tokens or opts into loopback mode.
    fn default() -> Self {
        AdminConfig { auth: AdminAuth::Token, listen: None, metrics_need_token: false, tokens: Vec::new() }
    }
}

/// How admin requests are authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdminAuth {
    /// A bearer token from `[[admin.token]]` on every request (the default).
    Token,
    /// For a laptop: requests from loopback peers act as an unrestricted admin
    /// without a token, unless they carry browser cross-site markers; any other
    /// peer is refused. Tokens, if defined, still work.
    NoneLoopback,
}

/// What a token's holder is allowed to do; each role includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Read entries and counts; payloads only with `payloads = true`.
    Viewer,
    /// Also repair entries (requeue, park, ignore) and pause or resume routes.
    Operator,
    /// Also reload the routing file, purge, and read the audit log.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

/// One `[[admin.token]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminToken {
    /// Who this is, as the audit log and the logs name it.
    pub name: String,
    pub role: Role,
    pub secret: Secret,
    /// The routes it may see and act on; `None` means every route.
    pub routes: Option<BTreeSet<String>>,
    /// Whether it may read payloads (always true for operator and admin).
    pub payloads: bool,
}

/// How a push route checks that a request comes from its subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushAuth {
    /// Accept any request (written out as `auth = "none"`).
    None,
    /// Require Pub/Sub's OIDC token (`Authorization: Bearer <JWT>`, RS256).
    Oidc(OidcPush),
}

/// The OIDC token a push subscription must send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcPush {
    /// The `aud` claim the subscription was configured with.
    pub audience: String,
    /// The subscription's service account: the `email` claim, which must be verified.
    pub service_account: String,
    /// Where the signing keys are published.
    pub jwks_url: String,
}

impl super::Config {
    /// Access settings that work but deserve a second look: printed by
    /// `inlet check` and logged at start.
    pub fn access_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let admin_addr = self.admin.listen.unwrap_or(self.server.listen);
        match self.admin.auth {
            AdminAuth::NoneLoopback => out.push(format!(
                "admin API without tokens for loopback peers (auth = \"none-loopback\"); other peers of {admin_addr} are refused"
            )),
            AdminAuth::Token if self.admin.tokens.is_empty() => out.push(
                "no [[admin.token]] defined: the admin API refuses every request (define tokens, or set [admin] auth = \"none-loopback\" for local use)"
                    .to_string(),
            ),
            AdminAuth::Token => {}
        }
        // One audience for several routes: a token the subscription of one holds is good
        // for all of them. Routes are named, not the audience (it may be expanded).
        let mut by_audience: std::collections::BTreeMap<(&str, &str), Vec<&str>> = Default::default();
        for r in &self.routes {
            if let Some(PushAuth::Oidc(o)) = &r.push_auth {
                by_audience.entry((&o.audience, &o.jwks_url)).or_default().push(r.name.as_str());
            }
        }
        for names in by_audience.values().filter(|n| n.len() > 1) {
            out.push(format!(
                "push routes {} accept tokens for one audience: a sender allowed to push to one can push to all of them; give each its own (`audience = \"…/{{route}}\"` in [push] auth)",
                names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
            ));
        }
        let is_dir = self.path.is_dir();
        if !is_dir && !self.grants.is_empty() {
            out.push("[[grant]] has no effect in a single routing file: it is all the platform's".to_string());
        }
        if is_dir {
            let present: Vec<String> = super::routing_files(&self.path)
                .unwrap_or_default()
                .iter()
                .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            for file in self.grants.keys().filter(|f| !present.contains(f)) {
                out.push(format!("[[grant]] file = \"{file}\" names no routing file of {}", self.path.display()));
            }
        }
        if !self.server.listen.ip().is_loopback() {
            for r in &self.routes {
                let push = matches!(r.source, super::SourceConfig::Push(_));
                let how = match &r.push_auth {
                    Some(PushAuth::Oidc(_)) => continue,
                    Some(PushAuth::None) => "auth = \"none\"",
                    None => "no auth",
                };
                if push {
                    out.push(format!(
                        "route `{}` accepts unauthenticated pushes ({how}) on {}, which is not a loopback address; set source.auth = {{ audience = \"…\", service_account = \"…\" }}",
                        r.name, self.server.listen
                    ));
                }
            }
        }
        out
    }
}
