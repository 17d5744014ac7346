//! Output rules: what a plugin's answers must look like before the host stores or
//! sends them. A plugin's output is input from a stranger, so it is checked here, in
//! one place, the same way whichever store is behind the route: a decode answer that
//! breaks a rule parks the message (raw payload kept, the keys never stored); a
//! request that breaks one parks the entry before the target sees it. Every refusal
//! is a [`Violation`] that names its rule (`correlation-key.max-bytes`,
//! `request.header-reserved`, …), so the parked entry says what to fix.
//!
//! Reasons (ignore and park reasons, errors, a target's answer) are not refused: they
//! are made storable by [`storable`] (control characters escaped, cut at
//! `max_reason_bytes`), because refusing a reason would lose the decision it carries.
//!
//! PLUGINS.md lists the rules for plugin authors.

use std::borrow::Cow;
use std::fmt::Write as _;

use axum::http::{HeaderName, HeaderValue};

use crate::config::{KeySource, Ordering, PluginLimits, RouteConfig, TargetConfig};
use crate::plugin::wit;

/// A plugin answer that breaks an output rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rule {rule}: {detail}")]
pub struct Violation {
    /// The rule's name, e.g. `correlation-key.max-bytes`; also the metric label.
    pub rule: &'static str,
    /// What was found, without echoing more of the offending value than needed.
    pub detail: String,
}

impl Violation {
    fn new(rule: &'static str, detail: impl Into<String>) -> Violation {
        Violation { rule, detail: detail.into() }
    }
}

/// Methods a rendered request may use: the standard ones that carry an event.
/// `CONNECT` and `TRACE` (and anything else) are refused; methods are case-sensitive.
pub const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// Headers only the host sets: framing, the connection, the target's host and the
/// idempotency key. The route's configured headers are reserved as well.
pub const RESERVED_HEADERS: [&str; 12] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "upgrade",
    "te",
    "trailer",
    "expect",
    "idempotency-key",
];

/// The attribute the `pubsub` target sets from the dedup key.
const RESERVED_ATTRIBUTE: &str = "idempotency_key";

/// A string field of a decoded event, by the names of its rules.
struct Field {
    max_bytes: &'static str,
    control_char: &'static str,
}

const CORRELATION_KEY: Field =
    Field { max_bytes: "correlation-key.max-bytes", control_char: "correlation-key.control-char" };
const DEDUP_KEY: Field = Field { max_bytes: "dedup-key.max-bytes", control_char: "dedup-key.control-char" };
const EVENT_TYPE: Field = Field { max_bytes: "event-type.max-bytes", control_char: "event-type.control-char" };
const SCHEMA_VERSION: Field =
    Field { max_bytes: "schema-version.max-bytes", control_char: "schema-version.control-char" };

/// A decoded event as the route takes it: its correlation key from where the route
/// says (`correlation_key = "ordering-key"`: the message's ordering key, kept by the
/// sources as the attribute `ordering_key`), then checked by [`check_event`].
pub fn accept_event(
    route: &RouteConfig,
    mut ev: wit::Event,
    attributes: &[(String, String)],
) -> Result<wit::Event, Violation> {
    if route.key_source == KeySource::OrderingKey {
        // The last one: a source appends it after the message's own attributes.
        let ordering_key = attributes.iter().rev().find(|(k, _)| k == "ordering_key").map(|(_, v)| v.as_str());
        match ordering_key {
            Some(key) if ev.correlation_key.is_empty() => ev.correlation_key = key.to_string(),
            Some(key) if ev.correlation_key != key => {
                return Err(Violation::new(
                    "correlation-key.not-ordering-key",
                    format!(
                        "the plugin's correlation key `{}` is not the message's ordering key `{}` \
                         (correlation_key = \"ordering-key\")",
                        storable(&ev.correlation_key, 200),
                        storable(key, 200)
                    ),
                ));
            }
            _ => {}
        }
    }
    if let crate::config::SourceConfig::Outbox(_) = route.source {
        // The row id names the entry: the outbox marks the row by finding its entry
        // under it, so a plugin's own dedup key could hide a row from its marking.
        let row = attributes.iter().find(|(k, _)| k == "outbox_id").map(|(_, v)| v.as_str());
        if let (Some(key), Some(row)) = (ev.dedup_key.as_deref().filter(|k| !k.is_empty()), row)
            && key != row
        {
            return Err(Violation::new(
                "dedup-key.not-outbox-id",
                format!(
                    "the plugin's dedup key `{}` is not the outbox row's id `{row}`: an outbox route's entries are \
                     named by their row (leave the dedup key empty)",
                    storable(key, 200)
                ),
            ));
        }
    }
    check_event(route, &ev)?;
    Ok(ev)
}

/// Checks a decoded event against the route's rules: both keys and both labels.
///
/// An empty correlation key is refused on a route ordered per key (it would put
/// every such event of the route in one queue, a plugin bug far more often than a
/// wish); on an unordered route it is accepted. An empty dedup key (`some("")`)
/// means "none": the host uses the broker message id, as for `none`.
pub fn check_event(route: &RouteConfig, ev: &wit::Event) -> Result<(), Violation> {
    let limits = &route.limits;
    if ev.correlation_key.is_empty() && route.ordering == Ordering::PerKey {
        return Err(Violation::new(
            "correlation-key.empty",
            "an empty correlation key on a route ordered per key (ordering = \"per-key\")",
        ));
    }
    check_text(&CORRELATION_KEY, &ev.correlation_key, limits.max_key_bytes)?;
    if let Some(key) = &ev.dedup_key {
        check_text(&DEDUP_KEY, key, limits.max_key_bytes)?;
    }
    check_text(&EVENT_TYPE, &ev.event_type, limits.max_label_bytes)?;
    if let Some(version) = &ev.schema_version {
        check_text(&SCHEMA_VERSION, version, limits.max_label_bytes)?;
    }
    Ok(())
}

/// A key or label: at most `max` bytes, no control characters (tab, CR, LF and NUL
/// included).
fn check_text(field: &Field, text: &str, max: usize) -> Result<(), Violation> {
    if text.len() > max {
        return Err(Violation::new(field.max_bytes, format!("{} bytes, limit {max}", text.len())));
    }
    if let Some((at, c)) = text.char_indices().find(|(_, c)| c.is_control()) {
        return Err(Violation::new(field.control_char, format!("U+{:04X} at byte {at}", c as u32)));
    }
    Ok(())
}

/// Longest broker message id used as a dedup key as it is, whatever the route allows:
/// the fallback key must be storable by every store.
const MESSAGE_ID_KEY_MAX: usize = 1024;

/// The dedup key of a message whose plugin gave none (or whose answer was refused):
/// the broker message id when it is itself a valid key, else a digest of it, so a
/// message id no store can index (a push sender may send anything) still dedups.
pub fn message_id_key(message_id: &str, limits: &PluginLimits) -> String {
    let max = limits.max_key_bytes.min(MESSAGE_ID_KEY_MAX);
    let valid = !message_id.is_empty() && check_text(&DEDUP_KEY, message_id, max).is_ok();
    if valid {
        message_id.to_string()
    } else {
        format!("message-id-sha256:{}", crate::inbox::digest_hex(message_id.as_bytes()))
    }
}

/// Checks a rendered request (from `render`, or the `next` request of `classify`)
/// against what the route's target allows. For an `http` (or `log`) target: the
/// method, the headers (valid HTTP, none reserved) and the path (it stays under the
/// target's base URL). For a `pubsub` target, where method and path are ignored and
/// headers become attributes: attribute names that are not reserved.
pub fn check_request(target: &TargetConfig, req: &wit::Request) -> Result<(), Violation> {
    match target {
        TargetConfig::Http(h) => check_http(req, |name| h.headers.contains_key(name)),
        TargetConfig::Log => check_http(req, |_| false),
        TargetConfig::Pubsub(p) => {
            check_attributes(req, |name| p.attributes.contains_key(name) || p.id_attribute.as_deref() == Some(name))
        }
    }
}

fn check_http(req: &wit::Request, configured: impl Fn(&str) -> bool) -> Result<(), Violation> {
    if !METHODS.contains(&req.method.as_str()) {
        return Err(Violation::new(
            "request.method",
            format!("`{}` is not one of {}", shown(&req.method), METHODS.join(", ")),
        ));
    }
    for (name, value) in &req.headers {
        let parsed = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            Violation::new("request.header-name", format!("`{}` is not a valid header name", shown(name)))
        })?;
        let lower = parsed.as_str();
        if RESERVED_HEADERS.contains(&lower) {
            return Err(Violation::new("request.header-reserved", format!("`{lower}` is set by the host")));
        }
        if configured(lower) {
            return Err(Violation::new(
                "request.header-reserved",
                format!("`{lower}` is configured on the route's target"),
            ));
        }
        if HeaderValue::from_str(value).is_err() {
            return Err(Violation::new(
                "request.header-value",
                format!("the value of `{lower}` holds a byte not allowed in a header (CR, LF, NUL or another control)"),
            ));
        }
    }
    check_path(&req.path)
}

/// The path is appended to the target's base URL, so it must not be able to leave
/// it: it starts with `/` (or `?`, or is empty), holds only visible ASCII (percent-
/// encode the rest), no backslash, no `//` at the start (another host), no `.` or
/// `..` segment, and no `;` before the query. All of these also percent-encoded,
/// even twice (`%2e%2e`, `%252e`, `%3b`, `%5c`): what the target decodes is checked.
///
/// `;` starts a path parameter, which Tomcat, Jetty and Spring (the servers Camunda
/// runs on) cut from a segment before resolving dot segments, so `/b/..;/admin`
/// leaves `/b` there while it is no dot segment to a URL parser. Every `;` in the
/// path is refused, `/x;` and `/x;jsessionid=1` too: a target API that needs path
/// parameters is rare enough not to be worth a rule that tells them apart.
fn check_path(path: &str) -> Result<(), Violation> {
    if path.is_empty() {
        return Ok(());
    }
    if let Some((at, b)) = path.bytes().enumerate().find(|(_, b)| !(0x21..=0x7e).contains(b)) {
        return Err(Violation::new(
            "request.path.bytes",
            format!("byte 0x{b:02x} at {at}: only visible ASCII is allowed, percent-encode the rest"),
        ));
    }
    if path.contains('\\') {
        return Err(Violation::new("request.path.backslash", "a backslash in the path"));
    }
    if !(path.starts_with('/') || path.starts_with('?')) {
        return Err(Violation::new(
            "request.path.relative",
            format!("`{}` does not start with `/`: the path is relative to the target's URL", shown(path)),
        ));
    }
    if path.starts_with("//") {
        return Err(Violation::new("request.path.authority", "`//` at the start names another host"));
    }
    let before_query = path.split(['?', '#']).next().unwrap_or_default();
    for segment in before_query.split('/') {
        let decoded = percent_decoded(segment);
        // `..;x` is `..` to the servers that drop path parameters.
        let dot = |s: &str| matches!(s.split(';').next(), Some("." | ".."));
        if decoded.split(['/', '\\']).any(dot) {
            return Err(Violation::new(
                "request.path.dot-segment",
                format!("segment `{}` would leave the target's base path", shown(segment)),
            ));
        }
        if decoded.contains(';') {
            return Err(Violation::new(
                "request.path.parameter",
                format!("segment `{}` holds `;`, a path parameter the target may cut away", shown(segment)),
            ));
        }
        if decoded.contains('\\') {
            return Err(Violation::new("request.path.backslash", "an encoded backslash in the path"));
        }
    }
    Ok(())
}

/// `s` percent-decoded until nothing changes (so `%252e` is a dot too), lossily.
fn percent_decoded(s: &str) -> String {
    let mut current = s.to_string();
    // Each round shortens the text; a handful of rounds is plenty for any real path.
    for _ in 0..4 {
        let bytes = current.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
                (b'%', Some(hi), Some(lo)) => {
                    out.push((hi * 16 + lo) as u8);
                    i += 3;
                }
                (b, _, _) => {
                    out.push(b);
                    i += 1;
                }
            }
        }
        let next = String::from_utf8_lossy(&out).into_owned();
        if next == current {
            break;
        }
        current = next;
    }
    current
}

fn check_attributes(req: &wit::Request, configured: impl Fn(&str) -> bool) -> Result<(), Violation> {
    for (name, value) in &req.headers {
        if name.is_empty() || name.chars().any(char::is_control) || value.chars().any(|c| c.is_control()) {
            return Err(Violation::new(
                "request.attribute",
                format!("attribute `{}` has an empty name or a control character", shown(name)),
            ));
        }
        if name == RESERVED_ATTRIBUTE || name.to_ascii_lowercase().starts_with("goog") || configured(name) {
            return Err(Violation::new(
                "request.attribute-reserved",
                format!("attribute `{}` is set by the host, the route or Pub/Sub", shown(name)),
            ));
        }
    }
    Ok(())
}

/// A plugin string quoted in a violation: control characters escaped, at most 64
/// characters.
fn shown(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == 64 {
            out.push('…');
            break;
        }
        push_escaped(&mut out, c);
    }
    out
}

fn push_escaped(out: &mut String, c: char) {
    if c.is_control() && c != '\n' && c != '\t' {
        let _ = write!(out, "\\u{{{:x}}}", c as u32);
    } else {
        out.push(c);
    }
}

/// Text made storable (a reason, or a message's own fields when the store refused
/// them): control characters other than tab and newline escaped
/// (`\u{0}`), and cut at `max` bytes (on a character boundary) with a marker that
/// gives the full size. Both stores then hold the same text.
pub fn storable(text: &str, max: usize) -> Cow<'_, str> {
    let clean = !text.chars().any(|c| c.is_control() && c != '\n' && c != '\t');
    if clean && text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len().min(max) + 32);
    for c in text.chars() {
        push_escaped(&mut out, c);
        if out.len() > max {
            break;
        }
    }
    if out.len() > max {
        let mut cut = max;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        let _ = write!(out, "… [cut: {} bytes in all]", text.len());
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(key: &str, dedup: Option<&str>) -> wit::Event {
        wit::Event {
            event_type: "t".into(),
            correlation_key: key.into(),
            dedup_key: dedup.map(str::to_string),
            body: vec![],
            schema_version: None,
        }
    }

    fn route(ordering: Ordering) -> RouteConfig {
        let text = "[[route]]\nname = \"r\"\nplugin = \"Cargo.toml\"\nsource = { kind = \"push\" }\ntarget = { kind = \"log\" }\n";
        let mut config = crate::config::Config::from_str(std::path::Path::new("x.toml"), text, &|_| None)
            .expect("valid")
            .routes
            .remove(0);
        config.ordering = ordering;
        config
    }

    fn rule(r: Result<(), Violation>) -> &'static str {
        r.err().map_or("ok", |v| v.rule)
    }

    #[test]
    fn a_route_keyed_by_the_ordering_key_takes_it_and_refuses_another() {
        let mut keyed = route(Ordering::PerKey);
        keyed.key_source = KeySource::OrderingKey;
        let ordered = vec![("tenant".to_string(), "a".to_string()), ("ordering_key".to_string(), "k1".to_string())];
        let key = |r: Result<wit::Event, Violation>| r.map(|ev| ev.correlation_key).map_err(|v| v.rule);
        assert_eq!(key(accept_event(&keyed, event("", None), &ordered)), Ok("k1".into()), "an empty key is filled");
        assert_eq!(key(accept_event(&keyed, event("k1", None), &ordered)), Ok("k1".into()), "the same key passes");
        assert_eq!(key(accept_event(&keyed, event("k2", None), &ordered)), Err("correlation-key.not-ordering-key"));
        // Without an ordering key the plugin's answer stands, and an empty one is refused as always.
        assert_eq!(key(accept_event(&keyed, event("k2", None), &[])), Ok("k2".into()));
        assert_eq!(key(accept_event(&keyed, event("", None), &[])), Err("correlation-key.empty"));
        // The one a source appended (last) is the ordering key, not a publisher's attribute of that name.
        let both =
            vec![("ordering_key".to_string(), "spoof".to_string()), ("ordering_key".to_string(), "k1".to_string())];
        assert_eq!(key(accept_event(&keyed, event("", None), &both)), Ok("k1".into()));
        // A route keyed by its plugin ignores the ordering key.
        let plain = route(Ordering::PerKey);
        assert_eq!(key(accept_event(&plain, event("k2", None), &ordered)), Ok("k2".into()));
        let refused = accept_event(&keyed, event("k2", None), &ordered).unwrap_err().to_string();
        assert!(refused.contains("`k2` is not the message's ordering key `k1`"), "{refused}");
    }

    #[test]
    fn keys_are_bounded_and_printable() {
        let per_key = route(Ordering::PerKey);
        assert_eq!(rule(check_event(&per_key, &event("k", Some("d")))), "ok");
        assert_eq!(rule(check_event(&per_key, &event(&"k".repeat(1025), None))), "correlation-key.max-bytes");
        assert_eq!(rule(check_event(&per_key, &event("k", Some(&"d".repeat(1025))))), "dedup-key.max-bytes");
        assert_eq!(rule(check_event(&per_key, &event("a\0b", None))), "correlation-key.control-char");
        assert_eq!(rule(check_event(&per_key, &event("k", Some("a\tb")))), "dedup-key.control-char");
        assert_eq!(rule(check_event(&per_key, &event("", None))), "correlation-key.empty");
        assert_eq!(rule(check_event(&route(Ordering::None), &event("", None))), "ok");
        let v = check_event(&per_key, &event(&"k".repeat(65536), None)).unwrap_err();
        assert_eq!(v.to_string(), "rule correlation-key.max-bytes: 65536 bytes, limit 1024");
    }

    #[test]
    fn a_message_id_that_is_no_valid_key_is_digested() {
        let limits = PluginLimits::default();
        assert_eq!(message_id_key("12345", &limits), "12345");
        assert!(message_id_key("a\0b", &limits).starts_with("message-id-sha256:"));
        assert!(message_id_key(&"x".repeat(5000), &limits).starts_with("message-id-sha256:"));
    }

    fn request(method: &str, path: &str, headers: &[(&str, &str)]) -> wit::Request {
        wit::Request {
            method: method.into(),
            path: path.into(),
            headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            body: vec![],
        }
    }

    #[test]
    fn paths_stay_under_the_base() {
        let log = TargetConfig::Log;
        let check = |path: &str| rule(check_request(&log, &request("POST", path, &[])));
        for ok in ["", "/", "/events", "/a/b?x=1&y=..", "?q=1", "/a%2Fb", "/a..b", "/.well-known"] {
            assert_eq!(check(ok), "ok", "{ok}");
        }
        assert_eq!(check("/../x"), "request.path.dot-segment");
        assert_eq!(check("/a/%2e%2e/x"), "request.path.dot-segment");
        assert_eq!(check("/a/%2E./x"), "request.path.dot-segment");
        assert_eq!(check("/a/%252e%252e/x"), "request.path.dot-segment");
        assert_eq!(check("/a/%2e%2e%2fx"), "request.path.dot-segment");
        assert_eq!(check("/a/./x"), "request.path.dot-segment");
        // Path parameters: Tomcat and Spring drop `;…` before resolving dot segments,
        // so `..;` is `..` to them.
        for dot in [
            "/..;/x",
            "/b/..;/admin/x",
            "/b/..;jsessionid=1/admin",
            "/b/%2e%2e;/x",
            "/b/%2E%2e;/x",
            "/b/%2e%2e%3b/x",
            "/b/.%2e/x",
            "/b/%2e./x",
            "/b/%252e%252e/x",
            "/b/%252e%252e%253b/x",
            "/b/.;/x",
            "/b/./",
            "/b/..",
            "/b/%2e",
            "/b/..%2f",
        ] {
            assert_eq!(check(dot), "request.path.dot-segment", "{dot}");
        }
        for parameter in ["/x;", "/b/x;jsessionid=1", "/b;/x", "/b/x%3b", "/b/x%253B", "/b/...;/x"] {
            assert_eq!(check(parameter), "request.path.parameter", "{parameter}");
        }
        assert_eq!(check("/a/%5c../x"), "request.path.dot-segment");
        assert_eq!(check("/a/b%5cc"), "request.path.backslash");
        assert_eq!(check("/a/b%255cc"), "request.path.backslash");
        // What stays ordinary: dots inside names, `;` and dots in the query.
        for ok in ["/engine-rest/message", "/a.b/c", "/a/.../b", "/a/...", "/v1/x.json?a=..;b", "/a/%2e%2ex"] {
            assert_eq!(check(ok), "ok", "{ok}");
        }
        assert_eq!(check("/a\\..\\x"), "request.path.backslash");
        assert_eq!(check("//evil.example/x"), "request.path.authority");
        assert_eq!(check("http://evil.example/x"), "request.path.relative");
        assert_eq!(check("x"), "request.path.relative");
        assert_eq!(check("/a b"), "request.path.bytes");
        assert_eq!(check("/a\r\nHost: x"), "request.path.bytes");
    }

    #[test]
    fn methods_and_headers() {
        let mut headers = std::collections::BTreeMap::new();
        headers.insert("authorization".to_string(), "Bearer s".to_string());
        let http = TargetConfig::Http(crate::config::HttpTarget {
            url: "http://t".into(),
            timeout: std::time::Duration::from_secs(1),
            headers,
        });
        let check = |method: &str, headers: &[(&str, &str)]| rule(check_request(&http, &request(method, "/", headers)));
        assert_eq!(check("POST", &[("content-type", "application/json"), ("X-Trace", "a\tb")]), "ok");
        for m in ["post", "CONNECT", "TRACE", "PO ST", ""] {
            assert_eq!(check(m, &[]), "request.method", "{m}");
        }
        assert_eq!(check("POST", &[("x-a", "1\r\nx-b: 2")]), "request.header-value");
        assert_eq!(check("POST", &[("x-a", "1\0")]), "request.header-value");
        assert_eq!(check("POST", &[("x a", "1")]), "request.header-name");
        assert_eq!(check("POST", &[("x-a\r\n", "1")]), "request.header-name");
        for h in ["Host", "IDEMPOTENCY-KEY", "Content-Length", "transfer-encoding", "Authorization"] {
            assert_eq!(check("POST", &[(h, "x")]), "request.header-reserved", "{h}");
        }
    }

    #[test]
    fn pubsub_attributes() {
        let mut attributes = std::collections::BTreeMap::new();
        attributes.insert("source".to_string(), "inlet".to_string());
        let pubsub = TargetConfig::Pubsub(crate::config::PubsubTarget {
            topic: "projects/p/topics/t".into(),
            ordering_key: false,
            timeout: std::time::Duration::from_secs(1),
            attributes,
            id_attribute: Some("outbox_id".into()),
        });
        let check = |name: &str| rule(check_request(&pubsub, &request("ANY", "ignored", &[(name, "v")])));
        assert_eq!(check("eventType"), "ok");
        assert_eq!(check("idempotency_key"), "request.attribute-reserved");
        assert_eq!(check("outbox_id"), "request.attribute-reserved");
        assert_eq!(check("source"), "request.attribute-reserved");
        assert_eq!(check("googFoo"), "request.attribute-reserved");
        assert_eq!(check(""), "request.attribute");
    }

    #[test]
    fn reasons_are_escaped_and_cut() {
        assert_eq!(storable("plain\nline\ttab", 100), "plain\nline\ttab");
        assert_eq!(storable("a\0b", 100), "a\\u{0}b");
        let long = "é".repeat(300);
        let cut = storable(&long, 256);
        assert!(cut.starts_with(&"é".repeat(128)), "{cut}");
        assert!(cut.ends_with("… [cut: 600 bytes in all]"), "{cut}");
        assert!(cut.len() <= 256 + 32);
    }
}
