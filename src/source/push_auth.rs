//! Verified push: the OIDC token a Pub/Sub push subscription sends as
//! `Authorization: Bearer <JWT>`, checked before the message is looked at.
//!
//! The token must be RS256, signed by a key of the configured JWKS (Google's by
//! default), issued by `accounts.google.com`, for the configured audience, unexpired
//! (10 s skew), not issued in the future (`iat`, same skew), and name the configured
//! service account as a verified `email`.
//! Parsing and signature checks are `jsonwebtoken`'s; this module only fetches and
//! caches the keys and says why a token failed.
//!
//! Why not google-cloud-auth's `idtoken::Verifier` (also built on `jsonwebtoken`):
//! its key cache is taken with `try_write`, so a request arriving while another holds
//! the cache fails instead of waiting; it refetches the JWKS for every unknown `kid`
//! (a stranger could make Inlet hammer Google); and its error does not say which
//! check failed, which the metric needs.
//!
//! Keys are cached per JWKS URL for an hour. A token naming a `kid` the cache does
//! not know triggers a refetch — that is how a key rotation is picked up — but at
//! most one per [`MIN_REFETCH`] per URL. When the JWKS cannot be fetched, keys
//! already known keep working, and a token that needs a new key is answered 503
//! (Pub/Sub retries): the fault is Inlet's, not the sender's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode, header};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::config::OidcPush;

/// Issuers of Google-signed ID tokens.
const ISSUERS: [&str; 2] = ["https://accounts.google.com", "accounts.google.com"];
/// Clock difference tolerated on `exp` / `nbf` / `iat`.
const SKEW: Duration = Duration::from_secs(10);
/// Keys are fetched again after this even when every `kid` is known.
const KEY_TTL: Duration = Duration::from_secs(3600);
/// Fewest seconds between two fetches of one JWKS, whatever tokens arrive.
pub const MIN_REFETCH: Duration = Duration::from_secs(5);
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest JWKS read (Google's is about 2 KiB).
const MAX_JWKS_BYTES: usize = 1024 * 1024;

/// Why a push request was refused; the label of `inlet_push_auth_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No `Authorization: Bearer` header.
    Missing,
    /// Not a JWT, or a claim of the wrong shape.
    Malformed,
    /// Not RS256.
    Algorithm,
    /// No key with the token's `kid`, even after a refetch.
    UnknownKey,
    Signature,
    Expired,
    /// `nbf` / `iat` in the future.
    NotYetValid,
    Issuer,
    Audience,
    /// `email` is not the configured service account.
    Email,
    /// `email_verified` is not `true`.
    EmailUnverified,
    /// The JWKS could not be fetched and the key is not cached: Inlet's fault.
    KeysUnavailable,
}

impl Refused {
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Missing => "missing",
            Refused::Malformed => "malformed",
            Refused::Algorithm => "algorithm",
            Refused::UnknownKey => "unknown_key",
            Refused::Signature => "signature",
            Refused::Expired => "expired",
            Refused::NotYetValid => "not_yet_valid",
            Refused::Issuer => "issuer",
            Refused::Audience => "audience",
            Refused::Email => "email",
            Refused::EmailUnverified => "email_unverified",
            Refused::KeysUnavailable => "keys_unavailable",
        }
    }

    /// 401 for no or no valid token, 403 for a valid token of the wrong sender,
    /// 503 when Inlet could not get the keys (Pub/Sub retries).
    pub fn status(self) -> StatusCode {
        match self {
            Refused::Email | Refused::EmailUnverified => StatusCode::FORBIDDEN,
            Refused::KeysUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::UNAUTHORIZED,
        }
    }
}

/// The claims checked beyond what `jsonwebtoken` validates.
#[derive(Debug, Deserialize)]
struct Claims {
    email: Option<String>,
    email_verified: Option<bool>,
    /// Issued at, seconds since the epoch; `jsonwebtoken` does not check it.
    iat: Option<serde_json::Value>,
}

/// The signing keys of every JWKS URL in use, shared by all routes.
pub struct Verifier {
    http: reqwest::Client,
    sets: Mutex<HashMap<String, Arc<KeySet>>>,
}

/// One JWKS: its keys by `kid`, and when they were last fetched. Lookups of known
/// keys never wait; `fetching` makes concurrent requests for an unknown key wait
/// for one fetch instead of each making their own.
struct KeySet {
    url: String,
    cached: std::sync::RwLock<Cached>,
    fetching: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Cached {
    keys: HashMap<String, DecodingKey>,
    fetched: Option<Instant>,
    /// The last attempt, successful or not, for the refetch limit.
    attempted: Option<Instant>,
}

impl KeySet {
    fn fresh_key(&self, kid: &str) -> Option<DecodingKey> {
        let cached = self.cached.read().expect("key cache lock");
        let fresh = cached.fetched.is_some_and(|t| t.elapsed() < KEY_TTL);
        if fresh { cached.keys.get(kid).cloned() } else { None }
    }

    fn any_key(&self, kid: &str) -> Option<DecodingKey> {
        self.cached.read().expect("key cache lock").keys.get(kid).cloned()
    }
}

impl Default for Verifier {
    fn default() -> Self {
        Self::new()
    }
}

impl Verifier {
    pub fn new() -> Verifier {
        // rustls has no built-in provider in this build (see src/pubsub_client.rs).
        let _ = rustls::crypto::ring::default_provider().install_default();
        // A 3xx from the JWKS URL is a failed fetch, not a pointer to the keys: the
        // keys come from where the routing file says, nowhere else.
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("the HTTP client builds");
        Verifier { http, sets: Mutex::default() }
    }

    /// Checks the request's bearer token against `rule`.
    pub async fn verify(&self, headers: &HeaderMap, rule: &OidcPush) -> Result<(), Refused> {
        let token = bearer(headers).ok_or(Refused::Missing)?;
        let head = jsonwebtoken::decode_header(token).map_err(|_| Refused::Malformed)?;
        if head.alg != Algorithm::RS256 {
            return Err(Refused::Algorithm);
        }
        let kid = head.kid.ok_or(Refused::Malformed)?;
        let key = self.key(&rule.jwks_url, &kid).await?;
        let mut validation = Validation::new(Algorithm::RS256);
        validation.leeway = SKEW.as_secs();
        validation.validate_nbf = true;
        validation.set_issuer(&ISSUERS);
        validation.set_audience(&[rule.audience.as_str()]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data = jsonwebtoken::decode::<Claims>(token, &key, &validation).map_err(|e| classify(e.kind()))?;
        check_issued_at(data.claims.iat.as_ref(), jsonwebtoken::get_current_timestamp())?;
        if data.claims.email.as_deref() != Some(rule.service_account.as_str()) {
            return Err(Refused::Email);
        }
        if data.claims.email_verified != Some(true) {
            return Err(Refused::EmailUnverified);
        }
        Ok(())
    }

    fn set(&self, url: &str) -> Arc<KeySet> {
        let mut sets = self.sets.lock().expect("key sets lock");
        let set = sets.entry(url.to_string()).or_insert_with(|| {
            Arc::new(KeySet { url: url.to_string(), cached: Default::default(), fetching: Default::default() })
        });
        Arc::clone(set)
    }

    /// The key named `kid`: from the cache while fresh, else after a (rate-limited)
    /// fetch; a stale key still serves when the fetch fails.
    async fn key(&self, url: &str, kid: &str) -> Result<DecodingKey, Refused> {
        let set = self.set(url);
        if let Some(k) = set.fresh_key(kid) {
            return Ok(k);
        }
        let _one_fetch = set.fetching.lock().await;
        // Another request may have fetched while this one waited.
        if let Some(k) = set.fresh_key(kid) {
            return Ok(k);
        }
        {
            let mut cached = set.cached.write().expect("key cache lock");
            if cached.attempted.is_some_and(|t| t.elapsed() < MIN_REFETCH) {
                return cached.keys.get(kid).cloned().ok_or(Refused::UnknownKey);
            }
            cached.attempted = Some(Instant::now());
        }
        match self.fetch(&set.url).await {
            Ok(keys) => {
                tracing::info!(url = %set.url, keys = keys.len(), "push auth: signing keys fetched");
                let mut cached = set.cached.write().expect("key cache lock");
                cached.keys = keys;
                cached.fetched = Some(Instant::now());
                cached.keys.get(kid).cloned().ok_or(Refused::UnknownKey)
            }
            Err(error) => {
                tracing::warn!(url = %set.url, %error, "push auth: cannot fetch the signing keys");
                set.any_key(kid).ok_or(Refused::KeysUnavailable)
            }
        }
    }

    async fn fetch(&self, url: &str) -> Result<HashMap<String, DecodingKey>, String> {
        let response = self.http.get(url).send().await.map_err(|e| e.without_url().to_string())?;
        if !response.status().is_success() {
            return Err(format!("answered {}", response.status()));
        }
        let mut response = response;
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| e.without_url().to_string())? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(format!("answered more than {MAX_JWKS_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        // Where the text went wrong, not what it says: serde quotes the values it
        // refuses, and the URL may answer something other than keys.
        let set: JwkSet = serde_json::from_slice(&body)
            .map_err(|e| format!("not a JWKS (line {}, column {})", e.line(), e.column()))?;
        Ok(set
            .keys
            .iter()
            .filter_map(|jwk| Some((jwk.common.key_id.clone()?, DecodingKey::from_jwk(jwk).ok()?)))
            .collect())
    }
}

/// A token issued in the future (beyond the skew) is refused as not yet valid: a
/// clock that far off, or a token minted to outlive its key's rotation, is not one to
/// trust. Google's tokens always carry `iat`; one without it is left to `exp`.
fn check_issued_at(iat: Option<&serde_json::Value>, now: u64) -> Result<(), Refused> {
    let Some(iat) = iat else { return Ok(()) };
    let iat = iat.as_f64().ok_or(Refused::Malformed)?;
    if iat > (now + SKEW.as_secs()) as f64 {
        return Err(Refused::NotYetValid);
    }
    Ok(())
}

/// The token of `Authorization: Bearer <token>`.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let (scheme, token) = headers.get(header::AUTHORIZATION)?.to_str().ok()?.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token.trim()).filter(|t| !t.is_empty())
}

fn classify(kind: &ErrorKind) -> Refused {
    match kind {
        ErrorKind::InvalidSignature => Refused::Signature,
        ErrorKind::ExpiredSignature => Refused::Expired,
        ErrorKind::ImmatureSignature => Refused::NotYetValid,
        ErrorKind::InvalidIssuer => Refused::Issuer,
        ErrorKind::InvalidAudience => Refused::Audience,
        ErrorKind::InvalidAlgorithm => Refused::Algorithm,
        _ => Refused::Malformed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_issued_in_the_future_is_not_yet_valid() {
        let now = 1_800_000_000;
        let iat = |v: serde_json::Value| check_issued_at(Some(&v), now);
        assert_eq!(check_issued_at(None, now), Ok(()));
        assert_eq!(iat(serde_json::json!(now - 3600)), Ok(()));
        assert_eq!(iat(serde_json::json!(now + SKEW.as_secs())), Ok(()), "within the skew");
        assert_eq!(iat(serde_json::json!(now + SKEW.as_secs() + 1)), Err(Refused::NotYetValid));
        assert_eq!(iat(serde_json::json!(now + 86_400)), Err(Refused::NotYetValid));
        assert_eq!(iat(serde_json::json!((now + 86_400) as f64 + 0.5)), Err(Refused::NotYetValid));
        assert_eq!(iat(serde_json::json!("yesterday")), Err(Refused::Malformed));
    }
}
