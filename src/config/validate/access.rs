//! Phase two for the access rules: `[admin]`, `[push]` and a route's `source.auth`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;

use toml::Spanned;

use super::Checker;
use crate::config::access::{AdminAuth, AdminConfig, AdminToken, GOOGLE_JWKS_URL, OidcPush, PushAuth, Role, Secret};
use crate::config::error::ConfigErrorKind;
use crate::config::raw::{RawAdmin, RawPushAuth, RawToken};

/// Shortest token accepted: guessing one must be hopeless.
const MIN_TOKEN_LEN: usize = 16;

pub(super) fn admin(c: &mut Checker<'_>, base: &Path, raw: Option<&RawAdmin>) -> AdminConfig {
    let Some(raw) = raw else { return AdminConfig::default() };
    let listen = raw.listen.as_ref().and_then(|l| {
        let text = c.expand(l, "admin.listen")?;
        match text.parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => c.error(
                l.span(),
                "admin.listen",
                ConfigErrorKind::Invalid(format!("`{}` is not a HOST:PORT socket address", l.get_ref())),
            ),
        }
    });
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    let mut tokens: Vec<AdminToken> = Vec::new();
    for (i, t) in raw.tokens.iter().enumerate() {
        let name = t.name.get_ref().trim().to_string();
        if name.is_empty() {
            c.error::<()>(
                t.name.span(),
                format!("admin.token[{i}].name"),
                ConfigErrorKind::Invalid("must not be empty".into()),
            );
        } else if let Some(first) = names.insert(name.clone(), i) {
            c.error::<()>(
                t.name.span(),
                format!("admin.token[{i}].name"),
                ConfigErrorKind::Invalid(format!("token name `{name}` is already used by admin.token[{first}]")),
            );
        }
        if let Some(token) = token(c, base, i, t, name) {
            // One secret for two tokens: whoever holds it would act as whichever the
            // lookup finds, so the names in the audit log would mean nothing.
            if let Some(first) = tokens.iter().find(|other| other.secret == token.secret) {
                let at = t.secret.as_ref().or(t.secret_file.as_ref()).map_or(t.name.span(), |s| s.span());
                let field = if t.secret.is_some() { "secret" } else { "secret_file" };
                c.error::<()>(
                    at,
                    format!("admin.token[{i}].{field}"),
                    ConfigErrorKind::Invalid(format!(
                        "tokens `{}` and `{}` have the same secret (value not shown): give each token its own",
                        first.name, token.name
                    )),
                );
                continue;
            }
            tokens.push(token);
        }
    }
    AdminConfig {
        auth: raw.auth.as_ref().map_or(AdminAuth::Token, |a| *a.get_ref()),
        listen,
        metrics_need_token: raw.metrics_need_token.unwrap_or(false),
        tokens,
    }
}

fn token(c: &mut Checker<'_>, base: &Path, i: usize, t: &RawToken, name: String) -> Option<AdminToken> {
    let at = |f: &str| format!("admin.token[{i}].{f}");
    let secret = match (&t.secret, &t.secret_file) {
        (Some(s), None) => env_reference(c, s, &at("secret")),
        (None, Some(f)) => secret_file(c, base, f, &at("secret_file")),
        (Some(s), Some(_)) => c.error(
            s.span(),
            at("secret"),
            ConfigErrorKind::Invalid("give either `secret` or `secret_file`, not both".into()),
        ),
        (None, None) => c.error(
            t.name.span(),
            format!("admin.token[{i}]"),
            ConfigErrorKind::Invalid("a token needs `secret = \"${NAME}\"` or `secret_file = \"PATH\"`".into()),
        ),
    }?;
    let role = *t.role.get_ref();
    let payloads = t.payloads.as_ref().map_or(role > Role::Viewer, |p| *p.get_ref());
    let routes = t.routes.as_ref().map(|rs| rs.iter().map(|r| r.get_ref().clone()).collect::<BTreeSet<_>>());
    Some(AdminToken { name, role, secret: Secret::new(secret), routes, payloads })
}

/// A token given as exactly `${NAME}`: anything else would put the secret itself in
/// the routing file, which is read by many and often committed.
fn env_reference(c: &mut Checker<'_>, s: &Spanned<String>, field: &str) -> Option<String> {
    if !super::is_reference(s.get_ref()) {
        return c.error(
            s.span(),
            field,
            ConfigErrorKind::Invalid(
                "a token secret must be a reference, `${NAME}` or `secret_file`; the routing file must not hold the secret itself"
                    .into(),
            ),
        );
    }
    let value = c.expand(s, field)?;
    long_enough(c, s, field, value)
}

fn secret_file(c: &mut Checker<'_>, base: &Path, f: &Spanned<String>, field: &str) -> Option<String> {
    let path = base.join(c.expand(f, field)?);
    match std::fs::read_to_string(&path) {
        Ok(text) => long_enough(c, f, field, text.trim_end_matches(['\n', '\r']).to_string()),
        Err(e) => c.error(
            f.span(),
            field,
            ConfigErrorKind::Invalid(format!("cannot read token file `{}`: {e}", base.join(f.get_ref()).display())),
        ),
    }
}

fn long_enough(c: &mut Checker<'_>, at: &Spanned<String>, field: &str, value: String) -> Option<String> {
    if value.chars().count() < MIN_TOKEN_LEN || value.chars().any(char::is_whitespace) {
        return c.error(
            at.span(),
            field,
            ConfigErrorKind::Invalid(format!(
                "the token must be at least {MIN_TOKEN_LEN} characters without spaces (value not shown)"
            )),
        );
    }
    Some(value)
}

/// `auth = "none"` or `auth = { audience, service_account, jwks_url }`.
pub(super) fn push_auth(c: &mut Checker<'_>, raw: &Spanned<RawPushAuth>, field: &str) -> Option<PushAuth> {
    match raw.get_ref() {
        RawPushAuth::Mode(m) if m == "none" => Some(PushAuth::None),
        RawPushAuth::Mode(m) => c.error(
            raw.span(),
            field,
            ConfigErrorKind::Invalid(format!(
                "`{m}` is not a push auth: use \"none\" or {{ audience = \"…\", service_account = \"…\" }}"
            )),
        ),
        RawPushAuth::Oidc(o) => {
            let audience = non_empty(c, &o.audience, &format!("{field}.audience"));
            let service_account = non_empty(c, &o.service_account, &format!("{field}.service_account"));
            let jwks_url = match &o.jwks_url {
                None => Some(GOOGLE_JWKS_URL.to_string()),
                Some(u) => c.expand(u, &format!("{field}.jwks_url")).and_then(|url| match jwks_url_problem(&url) {
                    None => Some(url),
                    Some(problem) => c.error(
                        u.span(),
                        format!("{field}.jwks_url"),
                        ConfigErrorKind::Invalid(format!("`{}` {problem}", crate::redact::url(u.get_ref()))),
                    ),
                }),
            };
            Some(PushAuth::Oidc(OidcPush {
                audience: audience?,
                service_account: service_account?,
                jwks_url: jwks_url?,
            }))
        }
    }
}

/// Why a JWKS URL is refused, if it is: the keys decide who may push, so they come
/// over `https`, or over plain `http` only from this host (a local JWKS, tests), where
/// nobody on the network can swap them.
fn jwks_url_problem(url: &str) -> Option<&'static str> {
    let Ok(parsed) = reqwest::Url::parse(url) else { return Some("is not an http:// or https:// URL") };
    match parsed.scheme() {
        "https" => None,
        "http" => {
            // The parser has normalised the host: `127.1` is `127.0.0.1`, IPv6 in brackets.
            let host = parsed.host_str().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
            let loopback = host.eq_ignore_ascii_case("localhost")
                || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
            (!loopback).then_some(
                "is plain http to a host other than this one: use https (http only for 127.0.0.0/8, ::1 or localhost)",
            )
        }
        _ => Some("is not an http:// or https:// URL"),
    }
}

fn non_empty(c: &mut Checker<'_>, v: &Spanned<String>, field: &str) -> Option<String> {
    let s = c.expand(v, field)?;
    if s.trim().is_empty() {
        return c.error(v.span(), field, ConfigErrorKind::Invalid("must not be empty".into()));
    }
    Some(s)
}
