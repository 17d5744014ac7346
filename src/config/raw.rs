//! Phase one: the routing file as serde sees it. Every field is documented here
//! because these types are the user's reference for the file format.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::error::{ConfigError, ConfigErrorKind, ConfigErrors};
use super::{Ordering, ParkedPolicy, RouteName};

pub(super) fn parse(path: &Path, text: &str) -> Result<RawConfig, ConfigErrors> {
    toml::from_str::<RawConfig>(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        let message = e.message().trim_end().to_string();
        let field = error_field(&e, text, span.start, &message);
        ConfigErrors::single(ConfigError::at(path, text, span, field, ConfigErrorKind::Parse(message)))
    })
}

/// The dotted path of what a serde error points at, e.g. `route[1].target.timeout`.
///
/// toml names the key path (`route.target.timeout`) but not the index in an array
/// of tables, so the route is found from the error's position instead. An unknown
/// field is reported at the unknown key itself, so its name ends the path.
fn error_field(e: &toml::de::Error, text: &str, offset: usize, message: &str) -> String {
    // The error names the key path only when rendered without the input.
    let mut bare = e.clone();
    bare.set_input(None);
    let rendered = bare.to_string();
    let mut keys: Vec<String> = rendered
        .lines()
        .find_map(|l| l.strip_prefix("in `").and_then(|l| l.strip_suffix('`')))
        .map(|p| p.split('.').map(str::to_string).collect())
        .unwrap_or_default();
    if let Some(unknown) = message.strip_prefix("unknown field `").and_then(|m| m.split('`').next()) {
        keys.push(unknown.to_string());
    }
    if keys.first().is_some_and(|k| k == "route")
        && let Some(i) = route_index(text, offset)
    {
        keys[0] = format!("route[{i}]");
    }
    keys.join(".")
}

/// Index of the `[[route]]` entry containing byte `offset`: the last one that starts
/// at or before it. `None` when `route` is not an array of tables.
fn route_index(text: &str, offset: usize) -> Option<usize> {
    #[derive(Deserialize)]
    struct Routes {
        #[serde(default)]
        route: Vec<Spanned<serde::de::IgnoredAny>>,
    }
    // A `[[route]]` entry's span covers its header; an inline table's, the whole table.
    let routes = toml::from_str::<Routes>(text).ok()?;
    routes.route.iter().rposition(|r| r.span().start <= offset)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    /// Where the inbox lives. Defaults to `sqlite://inlet.db` beside the routing file.
    pub store: Option<RawStore>,
    /// The HTTP listener. Defaults to `127.0.0.1:8080`.
    pub server: Option<RawServer>,
    /// The routes, one `[[route]]` table each.
    #[serde(default, rename = "route")]
    pub routes: Vec<RawRoute>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    /// `sqlite://PATH` (relative to the routing file; created if missing) or
    /// `postgres://USER@HOST:PORT/DB`. `${NAME}` reads an environment variable.
    pub url: Spanned<String>,
    /// Upper bound on pooled database connections (default 8).
    pub max_connections: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    /// `HOST:PORT` to listen on for push messages, the admin API, metrics and health
    /// (default `127.0.0.1:8080`).
    pub listen: Option<Spanned<String>>,
    /// Largest push request body, in MiB, 1 to 64 (default 16: a 10 MB Pub/Sub message
    /// is about 13.4 MB as base64 in the push envelope). A larger body is answered 413
    /// and counted in `inlet_push_rejected_total{reason="too_large"}`. Only `/push`
    /// takes bodies this large; the admin API keeps a 2 MiB limit.
    pub max_body_mib: Option<Spanned<u32>>,
    /// Time a client has to send a request line and its headers, up to `5m` (default
    /// `10s`); the connection is then closed, so a client that never finishes its
    /// headers cannot hold a connection. It is also how long an idle keep-alive
    /// connection is kept.
    pub header_read_timeout: Option<Spanned<HumanDuration>>,
    /// Time a push request has from its headers to its answer — reading the body,
    /// decode and the commit — up to `10m` (default `60s`). A body not received in time
    /// is answered 408, a request not finished in time 503; neither is an ack, and a
    /// row committed just before the cut makes the redelivery a duplicate.
    pub request_timeout: Option<Spanned<HumanDuration>>,
    /// Push requests handled at once, 1 to 100000 (default 128). One more is answered
    /// 503 with `Retry-After` at once, before its body is read, and counted in
    /// `inlet_push_rejected_total{reason="shed"}`. It bounds the push bodies held in
    /// memory: this many times `max_body_mib` (2 GiB with the defaults), about twice
    /// that while envelopes are decoded.
    pub max_concurrent_pushes: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    /// Unique name: lowercase letters, digits and `-`. Used in `/push/<name>`.
    pub name: Spanned<RouteName>,
    /// Path of the plugin component (`.wasm`), relative to the routing file.
    pub plugin: Spanned<String>,
    /// Where messages come from: `{ kind = "push" }` or
    /// `{ kind = "pubsub", subscription = "projects/P/subscriptions/S" }`.
    pub source: Spanned<RawSource>,
    /// Where entries are delivered: `{ kind = "http", url = "…" }`,
    /// `{ kind = "pubsub", topic = "projects/P/topics/T" }` or `{ kind = "log" }`.
    pub target: Spanned<RawTarget>,
    /// `"per-key"` (default): one entry per correlation key in flight, in inbox
    /// order. `"none"`: no ordering.
    pub ordering: Option<Ordering>,
    /// What a parked entry does to later entries of its key: `"block-key"`
    /// (default) or `"pass"`.
    pub parked: Option<ParkedPolicy>,
    /// Deliveries in flight at once for this route per instance (default 8).
    pub concurrency: Option<Spanned<u32>>,
    /// Requests one delivery attempt may send, for plugins whose target needs an
    /// exchange (query, then trigger) — 1 to 10, default 3.
    pub max_steps: Option<Spanned<u32>>,
    /// How long a claimed entry belongs to an instance (default: `max_steps` × the
    /// target timeout + 5s). Must exceed `max_steps` × the target timeout.
    pub lease: Option<Spanned<HumanDuration>>,
    /// Backoff for technical failures.
    pub retry: Option<RawRetry>,
    /// Patience with a target that is not ready for the event yet.
    pub not_yet: Option<RawNotYet>,
    /// Sandbox limits for each plugin call.
    pub limits: Option<RawLimits>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSource {
    /// `"push"`: Pub/Sub push subscriptions POST to `/push/<route>`.
    /// `"pubsub"`: Inlet pulls from a subscription (streaming pull).
    pub kind: Spanned<SourceKind>,
    /// pubsub: `projects/P/subscriptions/S`.
    pub subscription: Option<Spanned<String>>,
    /// pubsub: the topic the subscription listens to, `projects/P/topics/T`. Only
    /// `inlet pubsub setup` uses it, to create the subscription where missing.
    pub topic: Option<Spanned<String>>,
    /// pubsub: messages received but not yet stored and acked, at most (default 1000).
    pub max_outstanding_messages: Option<Spanned<u32>>,
    /// pubsub: bytes of such messages, at most, in MiB (default 100).
    pub max_outstanding_mib: Option<Spanned<u32>>,
    /// pubsub: messages stored in one transaction, at most (default 500).
    pub batch_size: Option<Spanned<u32>>,
    /// pubsub: how long a batch waits for more messages after the first (default `5ms`).
    pub batch_wait: Option<Spanned<HumanDuration>>,
    /// pubsub: the ack deadline the client keeps extending while a message is
    /// being stored, 10s to 600s (default `60s`).
    pub lease_extension: Option<Spanned<HumanDuration>>,
    /// pubsub (setup): topic for messages the broker gave up on.
    pub dead_letter_topic: Option<Spanned<String>>,
    /// pubsub (setup): deliveries before a message goes to the dead-letter topic,
    /// 5 to 100 (default 10).
    pub max_delivery_attempts: Option<Spanned<u32>>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub(super) enum SourceKind {
    Push,
    Pubsub,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTarget {
    /// `"http"`, `"pubsub"` or `"log"`.
    pub kind: Spanned<TargetKind>,
    /// http: base URL of the target; the plugin's path is appended.
    pub url: Option<Spanned<String>>,
    /// http, pubsub: time allowed for one request or publish (default `10s`).
    pub timeout: Option<Spanned<HumanDuration>>,
    /// http: headers added to every request, e.g. `{ authorization = "Bearer ${TOKEN}" }`.
    pub headers: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
    /// pubsub: `projects/P/topics/T`.
    pub topic: Option<Spanned<String>>,
    /// pubsub: publish with the entry's correlation key as ordering key (default false).
    pub ordering_key: Option<Spanned<bool>>,
    /// pubsub: attributes added to every message.
    pub attributes: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub(super) enum TargetKind {
    Http,
    Log,
    Pubsub,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetry {
    /// First delay (default `1s`).
    pub initial: Option<Spanned<HumanDuration>>,
    /// Largest delay (default `10m`).
    pub max: Option<Spanned<HumanDuration>>,
    /// Growth factor per attempt, at least 1.0 (default 2.0).
    pub multiplier: Option<Spanned<f64>>,
    /// Random spread as a fraction of the delay, 0.0 to 1.0 (default 0.2).
    pub jitter: Option<Spanned<f64>>,
    /// Attempts before the entry is parked, at least 1 (default 20).
    pub max_attempts: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNotYet {
    /// Time since receipt after which a not-yet entry is parked (default `30m`).
    pub deadline: Option<Spanned<HumanDuration>>,
    /// Largest delay between not-yet attempts (default `1m`).
    pub max_interval: Option<Spanned<HumanDuration>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    /// CPU time one plugin call may take (default `500ms`).
    pub call_timeout: Option<Spanned<HumanDuration>>,
    /// Memory one plugin instance may use, in MiB (default 64).
    pub memory_mib: Option<Spanned<u32>>,
    /// Instructions one call may execute (wasmtime fuel): a deterministic limit,
    /// independent of the machine's load. Off by default; `call_timeout` still applies.
    pub fuel: Option<Spanned<u64>>,
    /// Largest event body or request one call may return, in MiB (default 16: a 10 MB
    /// Pub/Sub message passed through whole fits).
    pub max_output_mib: Option<Spanned<u32>>,
}

/// A duration written for people: `"250ms"`, `"10s"`, `"30m"`, `"1h 30m"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s)
            .map(HumanDuration)
            .map_err(|e| serde::de::Error::custom(format!("invalid duration `{s}`: {e}")))
    }
}

impl<'de> Deserialize<'de> for RouteName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        RouteName::try_from(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}
