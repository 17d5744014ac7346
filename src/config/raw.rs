//! Phase one: the routing file as serde sees it. Every field is documented here
//! because these types are the user's reference for the file format.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::error::{ConfigError, ConfigErrorKind, ConfigErrors};
use super::{AfterPublish, KeySource, Ordering, ParkedPolicy, RouteName};

pub(super) fn parse(path: &Path, text: &str) -> Result<RawConfig, ConfigErrors> {
    toml::from_str::<RawConfig>(text).map_err(|e| serde_error(path, text, &e))
}

fn serde_error(path: &Path, text: &str, e: &toml::de::Error) -> ConfigErrors {
    let span = e.span().unwrap_or(0..0);
    let message = e.message().trim_end().to_string();
    let field = error_field(e, text, span.start, &message);
    ConfigErrors::single(ConfigError::at(path, text, span, field, ConfigErrorKind::Parse(message)))
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
        keys.push(key_in_path(unknown));
    }
    if keys.first().is_some_and(|k| k == "route")
        && let Some(i) = route_index(text, offset)
    {
        keys[0] = format!("route[{i}]");
    }
    keys.join(".")
}

/// A key as TOML would write it in a dotted path: bare when it can be, else quoted
/// (so an empty key `[""]` still names a field).
fn key_in_path(key: &str) -> String {
    let bare = !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare { key.to_string() } else { format!("{key:?}") }
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

/// One routing file. `inlet run`, `check` and `inbox` take either one such file or a
/// directory of them (`*.toml`, read in name order, e.g. one per team). In a directory,
/// exactly one file holds the shared `[store]` (and `[server]`, if any); the others
/// hold only `[[route]]` tables. Relative paths in a file are relative to that file.
///
/// Who writes what: the platform team writes the shared file (the one with `[store]`)
/// and owns Inlet's environment; each product team writes its own file. `${NAME}`
/// reads an environment variable: the shared file (and a single routing file, which
/// is all the platform's) may read any; a team file only those the shared file grants
/// to it with `[[grant]]`. A team file that reads any other is refused whole (its
/// routes are kept out, every other file keeps serving), with an error naming the
/// file, line, field and variable, never its value. Team files name no other files
/// than their plugins (`secret_file` exists only in `[admin]`, which only the shared
/// file holds), so variables are the only secrets there is to grant.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    /// Where the inbox lives. Defaults to `sqlite://inlet.db` beside a single routing
    /// file; a directory of routing files must declare it in one of them.
    pub store: Option<Spanned<RawStore>>,
    /// The HTTP listener. Defaults to `127.0.0.1:8080`. Only in the file with `[store]`.
    pub server: Option<Spanned<RawServer>>,
    /// Settings every plugin of the process shares. Only in the file with `[store]`.
    pub plugins: Option<Spanned<RawPlugins>>,
    /// The routes, one `[[route]]` table each. Route names are unique across all files.
    #[serde(default, rename = "route")]
    pub routes: Vec<RawRoute>,
    /// Who may use the admin API. Without this section the API needs a token and
    /// none is defined, so it refuses every request (`/healthz`, `/readyz` and
    /// `/metrics` stay open).
    pub admin: Option<RawAdmin>,
    /// Defaults for every push route.
    pub push: Option<RawPush>,
    /// Which environment variables each team file may read with `${NAME}`, one
    /// `[[grant]]` table per file (several for one file add up). Only in the shared
    /// file of a directory; without a grant a team file may read none.
    #[serde(default, rename = "grant")]
    pub grants: Vec<RawGrant>,
}

/// ```toml
/// [[grant]]
/// file = "orders.toml"                 # a team file of this directory, by name
/// env  = ["ORDERS_API_KEY", "ORDERS_ENGINE_URL"]
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGrant {
    /// The team file's name in the routing directory (no folder), e.g. `"orders.toml"`.
    pub file: Spanned<String>,
    /// The variables that file may read with `${NAME}`.
    pub env: Vec<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    /// `"token"` (default): every request carries `Authorization: Bearer <token>`
    /// of a `[[admin.token]]`. `"none-loopback"`: for local use, requests from
    /// 127.0.0.1 / ::1 need no token (and act as admin); other peers are refused.
    pub auth: Option<Spanned<super::AdminAuth>>,
    /// `HOST:PORT` of a listener of its own for the admin API and `/metrics`, so
    /// the push port can face Google while admin stays internal. Default: the
    /// admin API shares `[server] listen`.
    pub listen: Option<Spanned<String>>,
    /// `true`: `/metrics` needs a token of any role, like the API (default false).
    pub metrics_need_token: Option<bool>,
    /// The tokens, one `[[admin.token]]` table each.
    #[serde(default, rename = "token")]
    pub tokens: Vec<RawToken>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawToken {
    /// Who holds it; the audit log records actions under this name.
    pub name: Spanned<String>,
    /// `"viewer"` (read), `"operator"` (also requeue, park) or `"admin"` (also
    /// reload, purge, audit log).
    pub role: Spanned<super::Role>,
    /// The token by reference, exactly `"${NAME}"` (an environment variable). A
    /// literal secret is refused: the routing file is not a secret store.
    pub secret: Option<Spanned<String>>,
    /// Or a file holding the token (trailing newline ignored), relative to the
    /// routing file. Tokens must be at least 16 characters.
    pub secret_file: Option<Spanned<String>>,
    /// The routes this token may see and act on (default: all). Entries of other
    /// routes answer 404, as if they did not exist.
    pub routes: Option<Vec<Spanned<String>>>,
    /// Whether payloads (`raw_data`, `body`) are shown (default: false for a
    /// viewer, true for operator and admin).
    pub payloads: Option<Spanned<bool>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPush {
    /// Default `auth` of every push route that does not set its own; see
    /// `source.auth`. `{route}` in its `audience` stands for each route's name
    /// (`audience = "https://inlet.example.com/push/{route}"`), so that one service
    /// account's token for one route is no good for another.
    pub auth: Option<Spanned<RawPushAuth>>,
}

/// `"none"`, or `{ audience = "…", service_account = "…", jwks_url = "…" }`.
#[derive(Debug)]
pub(super) enum RawPushAuth {
    Mode(String),
    Oidc(RawOidc),
}

/// By hand rather than `untagged`: an untagged enum buffers its input, which loses
/// the spans of the table's fields (and names no field in its error).
impl<'de> Deserialize<'de> for RawPushAuth {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RawPushAuth;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"none\" or a table { audience = \"…\", service_account = \"…\" }")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawPushAuth, E> {
                Ok(RawPushAuth::Mode(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<RawPushAuth, A::Error> {
                RawOidc::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(RawPushAuth::Oidc)
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOidc {
    /// The audience the push subscription puts in its token (`aud`). Required:
    /// a token minted for another service must not be accepted here. `{route}`
    /// stands for the route's name.
    pub audience: Spanned<String>,
    /// The subscription's service account; the token's `email` must equal it and
    /// be verified.
    pub service_account: Spanned<String>,
    /// Where the signing keys are (default Google's,
    /// `https://www.googleapis.com/oauth2/v3/certs`).
    pub jwks_url: Option<Spanned<String>>,
}

/// What a file declares, read without judging the rest: whether it holds the shared
/// settings and the names of its routes. Lets a file with a mistake still be named
/// (its routes refused by name) and lets `inlet inbox` find the store alone.
#[derive(Debug, Deserialize)]
pub(super) struct Outline {
    pub store: Option<Spanned<toml::Value>>,
    pub server: Option<Spanned<toml::Value>>,
    pub plugins: Option<Spanned<toml::Value>>,
    pub admin: Option<Spanned<toml::Value>>,
    pub push: Option<Spanned<toml::Value>>,
    pub grant: Option<Spanned<toml::Value>>,
    #[serde(default)]
    pub route: Vec<OutlineRoute>,
}

/// Only the grants of a file, everything else ignored: read from the shared file
/// before the team files are checked against them.
#[derive(Debug, Deserialize)]
pub(super) struct GrantsOnly {
    #[serde(default)]
    pub grant: Vec<RawGrant>,
}

/// The grants of a file, or none when they do not parse (the shared file's own check
/// then reports why, and nothing runs).
pub(super) fn grants(text: &str) -> Vec<RawGrant> {
    toml::from_str::<GrantsOnly>(text).map(|g| g.grant).unwrap_or_default()
}

#[derive(Debug, Deserialize)]
pub(super) struct OutlineRoute {
    pub name: Option<String>,
}

/// The outline of a file, or `None` when it is not TOML with `[[route]]` tables.
pub(super) fn outline(text: &str) -> Option<Outline> {
    toml::from_str(text).ok()
}

/// Only the store section of a file, everything else ignored.
#[derive(Debug, Deserialize)]
pub(super) struct StoreOnly {
    pub store: Option<Spanned<RawStore>>,
}

pub(super) fn parse_store(path: &Path, text: &str) -> Result<StoreOnly, ConfigErrors> {
    toml::from_str::<StoreOnly>(text).map_err(|e| serde_error(path, text, &e))
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
    /// Host names this listener answers to besides `localhost` and IP addresses, e.g.
    /// `["inlet.example.com"]` (no port: any port matches). A push to a route without
    /// push auth, `/healthz`, `/readyz`, `/metrics` (unless `metrics_need_token`) and,
    /// in `none-loopback` mode, every request must name one of them in `Host`: a page
    /// that rebinds its own name to Inlet's address sends that name (DNS rebinding).
    pub public_hosts: Option<Vec<Spanned<String>>>,
    /// Connections open at once on each listener, 1 to 1000000 (default 1024). One
    /// more is answered 503 and closed at once, counted in
    /// `inlet_listener_refused_total{reason="max_connections"}`.
    pub max_connections: Option<Spanned<u32>>,
    /// Connections open at once from one peer address (an IPv6 peer by its /64), 1 to
    /// 1000000 (default 256), counted as `reason="max_connections_per_peer"`. Behind a
    /// proxy every client is the proxy: raise it to `max_connections` there.
    pub max_connections_per_peer: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlugins {
    /// Memory all plugin instances of the process may hold together, in MiB
    /// (default 2048). A call that needs more waits as if the host were busy (a
    /// temporary failure), instead of being blamed on the plugin.
    pub memory_budget_mib: Option<Spanned<u32>>,
    /// Memory all shadow candidates (a route's `candidate`) may hold together, in
    /// MiB (default 256), apart from `memory_budget_mib`: a candidate that hoards
    /// memory faults in the shadow, never takes memory from a serving plugin. Idle
    /// memory regions kept for candidates' next instances hold at most as much again.
    pub shadow_memory_budget_mib: Option<Spanned<u32>>,
    /// CPU all shadow candidates may use together, in percent of one core (default
    /// 10, at most 100): past it their work waits and new work is dropped (counted),
    /// so however much a candidate computes or maps, the serving path keeps the rest.
    pub shadow_cpu_percent: Option<Spanned<u32>>,
    /// Memory all shadow candidates may take and give back together, in MiB per
    /// second (default 32, 1 to 65536): an instance's growth and what a dropped
    /// instance frees both count. Mapping and unmapping memory slows every thread of
    /// the process, the serving ones too, so past this rate the candidates' work
    /// waits and new work is dropped (counted), as past `shadow_cpu_percent`. A
    /// candidate kept warm churns almost nothing.
    pub shadow_memory_churn_mib_per_s: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    /// Unique name: lowercase letters, digits and `-`. Used in `/push/<name>`.
    pub name: Spanned<RouteName>,
    /// Path of the plugin component (`.wasm`), relative to the routing file:
    /// `plugin = "plugins/orders.wasm"`. Or pinned to one build by its SHA-256
    /// (`inlet plugin digest FILE` prints it):
    /// `plugin = { path = "plugins/orders.wasm", sha256 = "<64 hex digits>" }`. A file
    /// whose digest differs is refused: the route keeps serving the pinned build it
    /// runs (or, at start, stays out) until the file or the pin is changed to match.
    pub plugin: Spanned<RawPlugin>,
    /// A new version of the plugin to try on live traffic in shadow, written like
    /// `plugin`: for each message it decodes too, and at each delivery it renders and
    /// classifies the real answer too, in its own sandbox and budget, off the serving
    /// path. Nothing it renders is sent; its answers are compared with the serving
    /// plugin's and the differences counted (`/api/routes/<name>/shadow`,
    /// `inlet plugin shadow`). `inlet plugin promote` makes it the plugin. A candidate
    /// that does not load never stops the route: the shadow says why.
    pub candidate: Option<Spanned<RawPlugin>>,
    /// The version that served before the last promotion, written like `plugin`:
    /// `inlet plugin promote` writes it, `inlet plugin rollback` puts it back.
    pub previous: Option<Spanned<RawPlugin>>,
    /// Where messages come from: `{ kind = "push" }` or
    /// `{ kind = "pubsub", subscription = "projects/P/subscriptions/S" }`.
    pub source: Spanned<RawSource>,
    /// Where entries are delivered: `{ kind = "http", url = "…" }`,
    /// `{ kind = "pubsub", topic = "projects/P/topics/T" }` or `{ kind = "log" }`.
    pub target: Spanned<RawTarget>,
    /// `"per-key"` (default): one entry per correlation key in flight, in inbox
    /// order. `"none"`: no ordering.
    pub ordering: Option<Ordering>,
    /// Where an entry's correlation key comes from: `"plugin"` (default), what
    /// `decode` answers; or `"ordering-key"`, the message's Pub/Sub ordering key, so
    /// that the broker's order and Inlet's are one: `decode` may leave the key empty
    /// (the ordering key is taken) or answer the ordering key itself; any other key
    /// parks the entry, naming both.
    pub correlation_key: Option<KeySource>,
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
    /// Claim check (docs/claim-check.md): where a message that carries only a
    /// reference to its payload has the payload fetched from, before `decode`.
    pub fetch: Option<Spanned<RawFetch>>,
}

/// `fetch`: the object store a route's messages refer to.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFetch {
    /// `"gcs"`: Google Cloud Storage's JSON API; `"s3"`: an S3-compatible store
    /// (path-style requests signed with AWS Signature Version 4); `"http"`: a plain
    /// HTTP(S) prefix.
    pub kind: Spanned<FetchKind>,
    /// gcs, s3: the bucket.
    pub bucket: Option<Spanned<String>>,
    /// gcs: the API's address (default `https://storage.googleapis.com`; a local
    /// server's for tests). s3: the store's address (required), e.g.
    /// `https://s3.eu-west-1.amazonaws.com` or a MinIO's.
    pub endpoint: Option<Spanned<String>>,
    /// s3: the region requests are signed for (default `us-east-1`).
    pub region: Option<Spanned<String>>,
    /// s3: the access key id, by reference only: exactly `"${NAME}"`.
    pub access_key_id: Option<Spanned<String>>,
    /// s3: the secret access key, by reference only: exactly `"${NAME}"`.
    pub secret_access_key: Option<Spanned<String>>,
    /// http: the URL the object's name is appended to, e.g. `https://blobs.example.com/payloads/`.
    pub prefix: Option<Spanned<String>>,
    /// A bearer token sent with each fetch, by reference only: exactly `"${NAME}"`.
    pub token: Option<Spanned<String>>,
    /// The message attribute naming the object (default `objectId`, as Cloud
    /// Storage's own notifications name it). A message without it is decoded as it is.
    pub object_attribute: Option<Spanned<String>>,
    /// The message attribute holding the object's SHA-256, lowercase hex (default
    /// `sha256`). Required: a message naming an object without it is parked.
    pub sha256_attribute: Option<Spanned<String>>,
    /// Largest object fetched, in MiB (default 64). A larger one is parked.
    pub max_mib: Option<Spanned<u32>>,
    /// Time allowed for one fetch (default `30s`). A fetch that takes longer is a
    /// temporary failure: the message is redelivered, and parked after
    /// `limits.timeout_tries` of them.
    pub timeout: Option<Spanned<HumanDuration>>,
    /// Delete an entry's object from the store when retention purges the entry
    /// (default `false`): the payload lives as long as the inbox keeps its message.
    pub delete_on_purge: Option<Spanned<bool>>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub(super) enum FetchKind {
    Gcs,
    S3,
    Http,
}

/// `"path.wasm"`, or `{ path = "path.wasm", sha256 = "…" }`.
#[derive(Debug)]
pub(super) enum RawPlugin {
    Path(String),
    Pinned(RawPinnedPlugin),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPinnedPlugin {
    /// Path of the plugin component, relative to the routing file.
    pub path: Spanned<String>,
    /// The SHA-256 of the one build this route runs: 64 hexadecimal digits (either
    /// case). `${NAME}` reads an environment variable, e.g. one a deployment sets.
    pub sha256: Spanned<String>,
}

/// By hand rather than `untagged`, like [`RawPushAuth`]: the table's fields keep
/// their spans and its errors name the field.
impl<'de> Deserialize<'de> for RawPlugin {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RawPlugin;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a path \"plugin.wasm\" or a table { path = \"plugin.wasm\", sha256 = \"…\" }")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawPlugin, E> {
                Ok(RawPlugin::Path(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<RawPlugin, A::Error> {
                RawPinnedPlugin::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(RawPlugin::Pinned)
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl RawPlugin {
    /// The path as written, where it is written (`span`: the whole value's).
    pub(super) fn path(&self, span: std::ops::Range<usize>) -> Spanned<String> {
        match self {
            RawPlugin::Path(p) => Spanned::new(span, p.clone()),
            RawPlugin::Pinned(p) => p.path.clone(),
        }
    }

    /// The pinned digest as written, if there is one.
    pub(super) fn sha256(&self) -> Option<&Spanned<String>> {
        match self {
            RawPlugin::Path(_) => None,
            RawPlugin::Pinned(p) => Some(&p.sha256),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSource {
    /// `"push"`: Pub/Sub push subscriptions POST to `/push/<route>`.
    /// `"pubsub"`: Inlet pulls from a subscription (streaming pull).
    /// `"outbox"`: Inlet reads an application's outbox table in PostgreSQL
    /// (docs/outbox.md).
    pub kind: Spanned<SourceKind>,
    /// outbox: the application's database, by reference only: exactly `"${NAME}"`,
    /// an environment variable holding `postgres://…` (it holds a password).
    pub url: Option<Spanned<String>>,
    /// outbox: the table, `outbox` or `schema.outbox` (default `outbox`).
    pub table: Option<Spanned<String>>,
    /// outbox: the table's column names where they differ from the default shape
    /// (`id`, `aggregate_id`, `event_type`, `payload`, `created_at`, `published_at`).
    pub columns: Option<Spanned<RawOutboxColumns>>,
    /// outbox: what becomes of a row once its event is published: `"mark"` sets its
    /// `published_at` (default), `"delete"` deletes it.
    pub after_publish: Option<Spanned<AfterPublish>>,
    /// outbox: how often the table is read when no `NOTIFY` woke Inlet (default `1s`).
    pub poll: Option<Spanned<HumanDuration>>,
    /// outbox: the `LISTEN` channel an application may `NOTIFY` after committing
    /// rows, to have them read at once (default `inlet_outbox`).
    pub channel: Option<Spanned<String>>,
    /// push: `false` for a push subscription that sends the message's data as the
    /// body (`--push-no-wrapper`) instead of the JSON envelope (default `true`). With
    /// `--push-no-wrapper-write-metadata` the message id, publish time and ordering key
    /// arrive as `x-goog-…` headers; without it the message is named by its body's
    /// SHA-256, so two messages with the same data are one entry (docs/pubsub.md).
    pub wrapper: Option<Spanned<bool>>,
    /// push, `wrapper = false`: the request headers that are the message's attributes
    /// (Pub/Sub writes each attribute as a header of its own name); others are not
    /// stored. HTTP header names are case-insensitive: an attribute is stored under
    /// the name as written here.
    pub attributes: Option<Spanned<Vec<Spanned<String>>>>,
    /// pubsub: `projects/P/subscriptions/S`. push (setup): the push subscription that
    /// sends here, which `inlet pubsub setup` creates and checks (with `endpoint`).
    pub subscription: Option<Spanned<String>>,
    /// push (setup): the URL Pub/Sub sends to — this route's `/push/<route>` as the
    /// world reaches it, e.g. `https://inlet.example.com/push/orders`. With the
    /// route's `auth`, setup gives the subscription its OIDC token (service account
    /// and audience), and with `wrapper = false` the no-wrapper format with metadata.
    pub endpoint: Option<Spanned<String>>,
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
    /// pubsub (setup): keep acknowledged messages in the subscription this long,
    /// `10m` to `31d` (e.g. `"7d"`), so that after an inbox restore
    /// `inlet pubsub seek` can bring back what was acked since the backup
    /// (RUNBOOK.md, "Backups and restore"). `inlet pubsub setup` sets the
    /// subscription's `retain_acked_messages` and `message_retention_duration` to it,
    /// on a subscription it creates and on one that exists. The duration is also how
    /// long unacked messages are kept (Pub/Sub's default: 7 days), so less than `7d`
    /// shortens how long a backlog survives an outage. Retained messages are billed
    /// as storage. Not set: setup leaves the subscription's retention as it is.
    pub retain_acked: Option<Spanned<HumanDuration>>,
    /// pubsub (setup): Pub/Sub's filter on the messages' attributes, e.g.
    /// `'attributes.type = "order"'` (at most 256 bytes): the subscription gets only the
    /// messages that match, and Pub/Sub acks the others itself, so they never reach
    /// Inlet. Routing by content at the broker instead of every route decoding and
    /// ignoring most of a topic. Set when setup creates the subscription; Pub/Sub
    /// cannot change it afterwards (setup reports a difference).
    pub filter: Option<Spanned<String>>,
    /// pubsub: the messages of the subscription this route takes, by one attribute:
    /// `{ attribute = "type", equals = "order" }` or `{ attribute = "type", in = ["a", "b"] }`.
    /// Several routes of one routing file may then read one subscription, each selecting
    /// other values of the same attribute: each message goes to the route that selects
    /// it, and one that no route takes is nacked and counted
    /// (`inlet_pubsub_unrouted_total`), never acked unseen (docs/pubsub.md, "Several
    /// routes on one subscription").
    pub select: Option<Spanned<RawSelect>>,
    /// pubsub (setup): exactly-once delivery (default `false`): Pub/Sub redelivers
    /// nothing Inlet acked in time, and says which acks it refused (docs/pubsub.md).
    pub exactly_once: Option<Spanned<bool>>,
    /// pubsub (setup): how long Pub/Sub waits before redelivering a message Inlet
    /// nacked (it could not store it): `["least", "most"]`, growing exponentially from
    /// one to the other, each `0s` to `600s` (default `["1s", "60s"]`). With a
    /// dead-letter topic it also decides how long an inbox outage Inlet rides out before
    /// Pub/Sub dead-letters messages (`inlet pubsub setup` says how long).
    pub redelivery_backoff: Option<Spanned<Vec<Spanned<HumanDuration>>>>,
    /// push: how a request proves it comes from the subscription.
    /// `{ audience = "…", service_account = "…" }` requires Pub/Sub's OIDC token
    /// (`Authorization: Bearer`, RS256, checked against Google's keys or
    /// `jwks_url`); `"none"` accepts any request. Default: `[push] auth`, else
    /// none (and `inlet check` warns when the listener is not loopback).
    pub auth: Option<Spanned<RawPushAuth>>,
}

/// `source.columns` of an outbox source: each a plain column name.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOutboxColumns {
    pub id: Option<Spanned<String>>,
    pub aggregate: Option<Spanned<String>>,
    #[serde(rename = "type")]
    pub event_type: Option<Spanned<String>>,
    pub payload: Option<Spanned<String>>,
    pub created: Option<Spanned<String>>,
    pub published: Option<Spanned<String>>,
}

/// `source.select`: one attribute and the values that take a message.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSelect {
    /// The attribute's name, e.g. `type`.
    pub attribute: Spanned<String>,
    /// The one value that takes a message.
    pub equals: Option<Spanned<String>>,
    /// The values that take a message (any of them).
    #[serde(rename = "in")]
    pub one_of: Option<Spanned<Vec<Spanned<String>>>>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub(super) enum SourceKind {
    Push,
    Pubsub,
    Outbox,
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
    /// How long a target may keep answering "not yet" before the entry is parked
    /// (default `30m`), counted from the first not-yet answer of the current run: time
    /// spent waiting behind older entries of the key does not count, and a requeue
    /// starts a new run with the whole deadline.
    pub deadline: Option<Spanned<HumanDuration>>,
    /// Largest delay between not-yet attempts (default `1m`).
    pub max_interval: Option<Spanned<HumanDuration>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    /// Wall-clock backstop of one call (default `5s`). A call that has not finished
    /// by then — a plugin that sleeps, or a host too busy to run it — is abandoned.
    /// Because that may be the host's fault, a decode that hits it is answered as a
    /// temporary failure (push 503, pull nack) `timeout_tries` times before the
    /// message is parked; render and classify count it as a failed attempt.
    pub call_timeout: Option<Spanned<HumanDuration>>,
    /// Memory one plugin instance may use over all its memories and tables, in MiB
    /// (default 64).
    pub memory_mib: Option<Spanned<u32>>,
    /// Instructions one call may execute (wasmtime fuel, default 200,000,000 — a few
    /// hundred milliseconds of work): the deterministic verdict on a plugin that is
    /// too slow, the same on a quiet and on a loaded machine.
    pub fuel: Option<Spanned<u64>>,
    /// Largest event body or request one call may return, in MiB (default 16, room
    /// for a 10 MB Pub/Sub message).
    pub max_output_mib: Option<Spanned<u32>>,
    /// Calls of this route's plugin running at once, at most, per instance of Inlet
    /// (default 16). More wait for a slot, within `call_timeout`.
    pub max_concurrent_calls: Option<Spanned<u32>>,
    /// An instance that grew past this many MiB is dropped after its call instead of
    /// being kept warm for the next one (default 16).
    pub keep_warm_mib: Option<Spanned<u32>>,
    /// Times a decode may hit `call_timeout` for one message before the message is
    /// parked (default 3).
    pub timeout_tries: Option<Spanned<u32>>,
    /// Longest correlation key or dedup key `decode` may return, in bytes, 1 to
    /// 1048576 (default 1024). A longer key parks the message (rule
    /// `correlation-key.max-bytes` / `dedup-key.max-bytes`). PostgreSQL cannot index a
    /// key of more than about 2,400 bytes: above that the database refuses the row and
    /// the message is parked with the database's error instead.
    pub max_key_bytes: Option<Spanned<u32>>,
    /// Longest event type or schema version `decode` may return, in bytes, 1 to 65536
    /// (default 256). A longer one parks the message (rule `event-type.max-bytes` /
    /// `schema-version.max-bytes`).
    pub max_label_bytes: Option<Spanned<u32>>,
    /// Longest reason kept in an entry's last error (an ignore or park reason, a decode
    /// or render error, a target's answer), in bytes, 256 to 1048576 (default 4096).
    /// A longer reason is cut at this size and marked `… [cut: N bytes in all]`; the
    /// entry is stored or settled as the plugin asked.
    pub max_reason_bytes: Option<Spanned<u32>>,
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
