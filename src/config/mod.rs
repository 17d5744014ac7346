//! Routing files: TOML that declares the store, the listener and the routes.
//!
//! Loading runs in two phases. Phase one is serde (`raw`): syntax, unknown fields,
//! types, durations. Phase two (`validate`) expands `${NAME}` environment
//! references, applies defaults and checks what serde cannot: duplicate names,
//! plugin files that exist, fields that belong to another kind, cross-field rules.
//! Every error carries the file, line, column and field; phase two reports all of
//! its errors at once.

mod access;
pub mod edit;
mod error;
mod files;
mod raw;
mod validate;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use access::{AdminAuth, AdminConfig, AdminToken, GOOGLE_JWKS_URL, OidcPush, PushAuth, Role, Secret};
pub use error::{ConfigError, ConfigErrorKind, ConfigErrors};
pub use files::{load_store, read_version, route_names, routing_files};

/// A loaded routing configuration: one file, or a directory of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file or directory this configuration was read from.
    pub path: PathBuf,
    pub store: StoreConfig,
    pub server: ServerConfig,
    pub plugins: PluginsConfig,
    /// The routes that validated.
    pub routes: Vec<RouteConfig>,
    /// Routes (or whole files) that did not validate. Empty from [`Config::load`];
    /// [`Config::load_partial`] keeps them here so the other routes can run.
    pub refused: Vec<RefusedRoute>,
    /// Who may use the admin API (`[admin]`).
    pub admin: AdminConfig,
    /// `[[grant]]` of the shared file: each team file's name and the environment
    /// variables it may read. Empty for a single routing file (all the platform's).
    pub grants: BTreeMap<String, BTreeSet<String>>,
}

/// A route, or a whole routing file, kept out because of its errors.
#[derive(Debug, Clone, PartialEq)]
pub struct RefusedRoute {
    /// The file that declares it.
    pub file: PathBuf,
    /// `None` for a file that could not be parsed far enough to name its routes.
    pub name: Option<RouteName>,
    pub errors: ConfigErrors,
    /// The push authentication a request to this route must pass before it is told
    /// that the route is refused: the route's own `source.auth` if that is valid,
    /// else `[push] auth` (for a file that did not parse, too); `None` without either.
    pub push_auth: Option<PushAuth>,
}

/// `[plugins]`: what every plugin of the process shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginsConfig {
    /// Memory all plugin instances may hold together, in bytes.
    pub memory_budget_bytes: usize,
    /// Memory all shadow candidates may hold together, in bytes.
    pub shadow_memory_budget_bytes: usize,
    /// CPU all shadow candidates may use together, in percent of one core.
    pub shadow_cpu_percent: u32,
    /// Memory all shadow candidates may take plus give back, in MiB per second.
    pub shadow_memory_churn_mib_per_s: u32,
}

/// `[plugins] shadow_memory_churn_mib_per_s` when not set: an ordinary candidate
/// stays warm and churns almost nothing; one that takes fresh memory at every call is
/// held to a few calls a second.
pub const DEFAULT_SHADOW_MEMORY_CHURN_MIB_PER_S: u32 = 32;

impl Default for PluginsConfig {
    fn default() -> Self {
        PluginsConfig {
            memory_budget_bytes: 2048 << 20,
            shadow_memory_budget_bytes: 256 << 20,
            shadow_cpu_percent: 10,
            shadow_memory_churn_mib_per_s: DEFAULT_SHADOW_MEMORY_CHURN_MIB_PER_S,
        }
    }
}

impl Config {
    /// Reads and validates a routing file or a directory of routing files; every
    /// error of every file, or a configuration in which every route is valid.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        Self::load_partial(path)?.complete()
    }

    /// Like [`Config::load`], but a route with errors (or a team's file that does not
    /// parse) is kept in [`Config::refused`] instead of failing the whole load. Errors
    /// in the shared settings (`[store]`, `[server]`, the file holding them) still fail it.
    pub fn load_partial(path: &Path) -> Result<Config, ConfigErrors> {
        Self::load_partial_with(path, &|name| std::env::var(name).ok())
    }

    /// [`Config::load_partial`] with environment references looked up with `env`.
    pub fn load_partial_with(path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
        files::load(path, env)
    }

    /// Validates routing-file text as if read from `path`, looking environment
    /// references up with `env`; every error, or a configuration without refusals.
    pub fn from_str(path: &Path, text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
        files::from_text(path, text, env)?.complete()
    }

    /// This configuration if no route was refused, else every refused route's errors.
    pub fn complete(self) -> Result<Config, ConfigErrors> {
        if self.refused.is_empty() {
            return Ok(self);
        }
        // A file refused whole refuses each route it names with the same errors.
        let mut errors: Vec<ConfigError> = Vec::new();
        for e in self.refused.into_iter().flat_map(|r| r.errors.0) {
            if !errors.contains(&e) {
                errors.push(e);
            }
        }
        Err(ConfigErrors(errors))
    }

    pub fn route(&self, name: &str) -> Option<&RouteConfig> {
        self.routes.iter().find(|r| r.name.as_str() == name)
    }
}

#[derive(Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// `sqlite://PATH` (relative to the routing file) or `postgres://…`.
    pub url: String,
    /// Upper bound on pooled database connections.
    pub max_connections: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Address of the HTTP listener: push endpoints, admin API, metrics, health.
    pub listen: SocketAddr,
    /// Largest push request body; a larger one is answered 413.
    pub max_body_bytes: usize,
    /// Time a client has to send a request line and headers (and how long an idle
    /// keep-alive connection is kept); the connection is closed after it.
    pub header_read_timeout: Duration,
    /// Time a push request has from its headers to its answer: body, decode, commit.
    pub request_timeout: Duration,
    /// Push requests handled at once; one more is shed with 503 and `Retry-After`.
    pub max_concurrent_pushes: usize,
    /// Host names (lowercase, no port) the listeners answer to besides `localhost` and
    /// IP addresses (`crate::admin::access::own_host`).
    pub public_hosts: Vec<String>,
    /// Connections open at once per listener.
    pub max_connections: usize,
    /// Connections open at once per peer address (IPv6 by /64) per listener.
    pub max_connections_per_peer: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            // A 10 MB Pub/Sub message is about 13.4 MB as base64 in the push envelope.
            max_body_bytes: 16 << 20,
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            max_concurrent_pushes: 128,
            public_hosts: Vec::new(),
            // Google's push comes from many addresses; one address (a test, a proxy)
            // may still open a few hundred.
            max_connections: 1024,
            max_connections_per_peer: 256,
        }
    }
}

/// A route name: lowercase ASCII letters, digits and `-`, starting with a letter,
/// at most 63 characters. It appears in URLs, metrics labels and the inbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteName(String);

impl RouteName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RouteName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for RouteName {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        let ok_start = s.chars().next().is_some_and(|c| c.is_ascii_lowercase());
        let ok_chars = s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !ok_start || !ok_chars || s.len() > 63 {
            return Err(format!(
                "invalid route name `{s}`: use lowercase letters, digits and `-`, starting with a letter, at most 63 characters"
            ));
        }
        Ok(RouteName(s))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    pub name: RouteName,
    /// The routing file that declares this route.
    pub file: PathBuf,
    /// The plugin component, resolved against the routing file's folder.
    pub plugin: PathBuf,
    /// The same path as the file spells it (`${NAME}` not expanded): what messages,
    /// logs and the API show, since an expanded value may be a secret.
    pub plugin_shown: PathBuf,
    /// The SHA-256 (lowercase hex) the plugin file must have, when the route pins one
    /// (`plugin = { path = "…", sha256 = "…" }`): a file with another digest is refused.
    pub plugin_sha256: Option<String>,
    /// A new version run in shadow beside the plugin (`candidate = …`): its answers
    /// are compared, never sent.
    pub candidate: Option<PluginFile>,
    /// The version that served before the last promotion (`previous = …`).
    pub previous: Option<PluginFile>,
    pub source: SourceConfig,
    pub target: TargetConfig,
    pub ordering: Ordering,
    /// Where the correlation key comes from (`correlation_key = …`).
    pub key_source: KeySource,
    pub parked: ParkedPolicy,
    /// Deliveries in flight at once for this route, across keys, per instance.
    pub concurrency: usize,
    /// How long a claimed entry belongs to this instance. Always longer than the
    /// target timeout, so a slow target cannot cause two deliveries of one key.
    pub lease: Duration,
    /// Requests one attempt may send (a multi-step exchange), at least 1.
    pub max_steps: u32,
    pub retry: RetryPolicy,
    pub not_yet: NotYetPolicy,
    pub limits: PluginLimits,
    /// Push routes: the route's `source.auth`, else `[push] auth`; `None` when
    /// neither is written (or the source is not push).
    pub push_auth: Option<PushAuth>,
    /// Claim check: the store a message's payload is fetched from when the message
    /// names an object.
    pub fetch: Option<FetchConfig>,
}

/// Claim check (docs/claim-check.md): a message that carries only a reference (an
/// object name and its SHA-256, as attributes) has its payload fetched before
/// `decode`, which gets the object's bytes as the message's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchConfig {
    pub store: FetchStore,
    pub token: Option<Secret>,
    pub object_attribute: String,
    pub sha256_attribute: String,
    pub max_bytes: u64,
    pub timeout: Duration,
    /// Delete an entry's object when retention purges the entry.
    pub delete_on_purge: bool,
}

/// Where objects are fetched from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchStore {
    /// Cloud Storage's JSON API: `GET {endpoint}/storage/v1/b/{bucket}/o/{object}?alt=media`.
    Gcs { endpoint: String, bucket: String },
    /// An S3-compatible store, path-style: `GET {endpoint}/{bucket}/{object}`, signed
    /// with AWS Signature Version 4.
    S3 { endpoint: String, bucket: String, region: String, access_key_id: Secret, secret_access_key: Secret },
    /// `GET {prefix}{object}`.
    Http { prefix: String },
}

/// A plugin file a route names besides its serving one (`candidate`, `previous`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginFile {
    /// Resolved against the routing file's folder, variables expanded.
    pub path: PathBuf,
    /// As the file spells it: what messages and the API show.
    pub shown: PathBuf,
    /// The SHA-256 the file must have, when pinned.
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceConfig {
    /// `POST /push/<route>` accepts Pub/Sub pushes.
    Push(PushSource),
    /// Streaming pull from a subscription.
    Pubsub(PubsubSource),
    /// An application's outbox table, read in order and published (docs/outbox.md).
    Outbox(OutboxSource),
}

impl SourceConfig {
    /// The messages a pull route takes of its subscription (`source.select`); `None`
    /// for one that takes every message, and for a push route.
    pub fn select(&self) -> Option<&Select> {
        match self {
            SourceConfig::Pubsub(p) => p.select.as_ref(),
            SourceConfig::Push(_) | SourceConfig::Outbox(_) => None,
        }
    }

    /// The source's kind as the routing file names it.
    pub fn kind(&self) -> &'static str {
        match self {
            SourceConfig::Push(_) => "push",
            SourceConfig::Pubsub(_) => "pubsub",
            SourceConfig::Outbox(_) => "outbox",
        }
    }
}

/// An application's outbox table in PostgreSQL: rows the application inserts in
/// the transactions that change its data, which Inlet reads in id order, hands to
/// the route's plugin as messages (the aggregate as correlation key, the row id as
/// dedup key), publishes, and marks or deletes once published.
#[derive(Clone, PartialEq, Eq)]
pub struct OutboxSource {
    /// `postgres://…`, from the environment variable the file names (`url_shown`).
    pub url: Secret,
    /// `${NAME}` as the file spells it: what logs and the API show.
    pub url_shown: String,
    /// The table, `name` or `schema.name`, checked to be plain identifiers.
    pub table: String,
    pub columns: OutboxColumns,
    pub after_publish: AfterPublish,
    /// How often the table is read when no notification came.
    pub poll: Duration,
    /// Rows read (and stored in the inbox) in one transaction, at most.
    pub batch_size: usize,
    /// The `LISTEN` channel that wakes the reader.
    pub channel: String,
}

impl std::fmt::Debug for OutboxSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxSource")
            .field("url", &self.url_shown)
            .field("table", &self.table)
            .field("columns", &self.columns)
            .field("after_publish", &self.after_publish)
            .field("poll", &self.poll)
            .field("batch_size", &self.batch_size)
            .field("channel", &self.channel)
            .finish()
    }
}

/// The outbox table's columns, each a plain identifier (they are written into SQL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxColumns {
    /// An increasing integer (`bigserial`, identity): the insert order and the row's
    /// name everywhere downstream.
    pub id: String,
    /// The aggregate: the ordering key, one queue per value.
    pub aggregate: String,
    pub event_type: String,
    /// `jsonb`, `json`, `text` or `bytea`: the message data.
    pub payload: String,
    pub created: String,
    /// Set when the row's event is published (`after_publish = "mark"`); read as
    /// "not yet published" while `NULL`.
    pub published: String,
}

impl Default for OutboxColumns {
    fn default() -> Self {
        OutboxColumns {
            id: "id".into(),
            aggregate: "aggregate_id".into(),
            event_type: "event_type".into(),
            payload: "payload".into(),
            created: "created_at".into(),
            published: "published_at".into(),
        }
    }
}

/// What becomes of an outbox row once its event is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AfterPublish {
    /// `published_at = now()`: the row stays, for the application's own history.
    Mark,
    /// The row is deleted.
    Delete,
}

/// How a push subscription sends its messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushSource {
    /// `None`: the JSON push envelope. `Some`: the message's data as the body
    /// (`--push-no-wrapper`), with these headers taken as its attributes.
    pub unwrapped: Option<Unwrapped>,
    /// For `inlet pubsub setup`: the push subscription that sends here, when the
    /// route names it.
    pub subscription: Option<PushSubscription>,
}

/// A push route's subscription, as `inlet pubsub setup` creates and checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushSubscription {
    /// `projects/P/subscriptions/S`.
    pub name: String,
    /// Where Pub/Sub sends the requests: this route's `/push/<route>` as the world
    /// reaches it.
    pub endpoint: String,
    pub setup: SubscriptionSetup,
}

/// What `inlet pubsub setup` gives a route's subscription, pull or push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionSetup {
    /// `projects/P/topics/T`: the subscription's topic, needed to create it.
    pub topic: Option<String>,
    /// The dead-letter topic and the deliveries before a message goes there.
    pub dead_letter_topic: Option<String>,
    pub max_delivery_attempts: u32,
    /// How long the subscription keeps acked messages (`message_retention_duration`,
    /// with `retain_acked_messages`); `None` leaves its retention alone.
    pub retain_acked: Option<Duration>,
    /// Pub/Sub's filter on attributes, set when setup creates the subscription.
    pub filter: Option<String>,
    /// Pub/Sub's redelivery backoff after a nack, least and most.
    pub redelivery_backoff: (Duration, Duration),
}

impl SubscriptionSetup {
    /// The redelivery backoff a route gets when it sets none.
    pub const DEFAULT_REDELIVERY_BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));
}

/// An unwrapped push route's attribute headers, as the routing file names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unwrapped {
    pub attributes: Vec<String>,
}

/// A Pub/Sub subscription Inlet pulls from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubsubSource {
    /// `projects/P/subscriptions/S`.
    pub subscription: String,
    /// Messages held (received, not yet stored and acked) at once, at most. The
    /// emulator ignores the broker-side flow control, so Inlet enforces it itself.
    pub max_outstanding_messages: usize,
    /// Bytes of message data held at once, at most.
    pub max_outstanding_bytes: usize,
    /// Messages stored in one transaction, at most.
    pub batch_size: usize,
    /// How long a batch waits for more messages once it has one.
    pub batch_wait: Duration,
    /// The ack deadline the client keeps extending while Inlet holds a message.
    pub lease_extension: Duration,
    /// For `inlet pubsub setup`: the subscription's settings.
    pub setup: SubscriptionSetup,
    /// For `inlet pubsub setup`: exactly-once delivery (pull only).
    pub exactly_once: bool,
    /// The messages this route takes, when it shares its subscription or takes only
    /// some of it; `None` takes every message.
    pub select: Option<Select>,
}

impl PubsubSource {
    /// Whether two routes may read one subscription together: every setting but
    /// their `select` is the same.
    pub fn same_subscription_settings(&self, other: &PubsubSource) -> bool {
        PubsubSource { select: None, ..self.clone() } == PubsubSource { select: None, ..other.clone() }
    }
}

/// `source.select`: a message is taken when its attribute `attribute` has one of
/// `values`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Select {
    pub attribute: String,
    pub values: Vec<String>,
}

impl Select {
    /// Whether a message with these attributes is taken.
    pub fn takes(&self, attributes: &[(String, String)]) -> bool {
        attributes.iter().any(|(k, v)| *k == self.attribute && self.values.contains(v))
    }

    /// A value both selects take, if any (they select by the same attribute): two
    /// routes of one subscription would both want the message.
    pub fn overlap<'a>(&'a self, other: &Select) -> Option<&'a str> {
        self.values.iter().find(|v| other.values.contains(v)).map(String::as_str)
    }
}

impl std::fmt::Display for Select {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.values.as_slice() {
            [one] => write!(f, "{} = {one:?}", self.attribute),
            many => write!(f, "{} in {many:?}", self.attribute),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetConfig {
    Http(HttpTarget),
    /// Publishes the rendered body to a Pub/Sub topic.
    Pubsub(PubsubTarget),
    /// Logs each rendered request and answers it as `204 No Content`. For dry runs.
    Log,
}

impl TargetConfig {
    pub fn timeout(&self) -> Duration {
        match self {
            TargetConfig::Http(h) => h.timeout,
            TargetConfig::Pubsub(p) => p.timeout,
            TargetConfig::Log => Duration::from_secs(1),
        }
    }
}

/// A Pub/Sub topic entries are published to: the rendered body is the message data,
/// the rendered headers and the configured attributes its attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubsubTarget {
    /// `projects/P/topics/T`.
    pub topic: String,
    /// Publish with the entry's correlation key as ordering key.
    pub ordering_key: bool,
    /// Time allowed for one publish, retries included.
    pub timeout: Duration,
    /// Attributes added to every message.
    pub attributes: BTreeMap<String, String>,
    /// An attribute that carries the entry's dedup key besides `idempotency_key`:
    /// `outbox_id` on an outbox route, so consumers find the row id by its name.
    pub id_attribute: Option<String>,
}

#[derive(Clone, PartialEq, Eq)]
pub struct HttpTarget {
    /// Base URL; the plugin's request path is appended to it.
    pub url: String,
    /// Time allowed for one request, connect to last byte.
    pub timeout: Duration,
    /// Headers added to every request (e.g. authorization).
    pub headers: BTreeMap<String, String>,
}

/// Whether entries of one correlation key are delivered one at a time, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ordering {
    /// At most one entry per key in flight, in inbox order (the default).
    PerKey,
    /// No ordering: any entry may be delivered at any time.
    None,
}

/// Where an entry's correlation key comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeySource {
    /// The plugin's `decode` answer (the default).
    #[default]
    Plugin,
    /// The message's Pub/Sub ordering key; the plugin may answer it or nothing.
    OrderingKey,
}

/// What a parked entry does to later entries of its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ParkedPolicy {
    /// Later entries of the key wait until the parked one is requeued or resolved
    /// (the default: order matters more than progress).
    BlockKey,
    /// Later entries of the key go on without it.
    Pass,
}

/// Backoff for technical failures: `initial * multiplier^(n-1)`, capped at `max`,
/// spread by ± `jitter` (a fraction), at most `max_attempts` attempts in all.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max: Duration,
    pub multiplier: f64,
    pub jitter: f64,
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(600),
            multiplier: 2.0,
            jitter: 0.2,
            max_attempts: 20,
        }
    }
}

/// How long an entry may wait for a target that is "not ready yet".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotYetPolicy {
    /// Measured from when the entry was received; after it the entry is parked.
    pub deadline: Duration,
    /// Delay between not-yet attempts (backoff from the retry policy's shape, capped here).
    pub max_interval: Duration,
}

impl Default for NotYetPolicy {
    fn default() -> Self {
        NotYetPolicy { deadline: Duration::from_secs(30 * 60), max_interval: Duration::from_secs(60) }
    }
}

/// Sandbox limits for each plugin call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginLimits {
    /// Wall-clock backstop of one call: the host abandons the call then.
    pub call_timeout: Duration,
    /// Memory an instance may grow to over all its memories and tables, in bytes.
    pub memory_bytes: usize,
    /// Instructions (wasmtime fuel) one call may use: the deterministic limit.
    pub fuel: u64,
    /// Largest event body or request (body, path and headers) a call may return.
    pub max_output_bytes: usize,
    /// Calls of the plugin running at once, per process.
    pub max_concurrent_calls: usize,
    /// Instances larger than this are dropped after their call, not kept warm.
    pub keep_warm_bytes: usize,
    /// Decodes of one message that may hit the backstop before it is parked.
    pub timeout_tries: u32,
    /// Longest correlation or dedup key `decode` may return (output rules, `crate::rules`).
    pub max_key_bytes: usize,
    /// Longest event type or schema version `decode` may return.
    pub max_label_bytes: usize,
    /// Longest reason stored as an entry's last error; longer ones are cut.
    pub max_reason_bytes: usize,
}

impl Default for PluginLimits {
    fn default() -> Self {
        PluginLimits {
            call_timeout: Duration::from_secs(5),
            memory_bytes: 64 << 20,
            fuel: 200_000_000,
            max_output_bytes: 16 << 20,
            max_concurrent_calls: 16,
            keep_warm_bytes: 16 << 20,
            timeout_tries: 3,
            max_key_bytes: 1024,
            max_label_bytes: 256,
            max_reason_bytes: 4096,
        }
    }
}

impl PluginLimits {
    /// The most memory one route's plugin can hold in one process: every call slot
    /// busy with an instance at the cap, plus a full warm pool of `pool` instances
    /// just under `keep_warm_bytes`. The process budget bounds all routes together.
    pub fn worst_case_bytes(&self, pool: usize) -> usize {
        self.max_concurrent_calls * self.memory_bytes + pool * self.keep_warm_bytes
    }
}

/// Without the password: configurations are logged and printed whole.
impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("url", &crate::redact::url(&self.url))
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

/// Header values (credentials, typically) and the URL's secrets masked.
impl std::fmt::Debug for HttpTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: BTreeMap<&str, &str> = self.headers.keys().map(|k| (k.as_str(), crate::redact::MASK)).collect();
        f.debug_struct("HttpTarget")
            .field("url", &crate::redact::url(&self.url))
            .field("timeout", &self.timeout)
            .field("headers", &headers)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::Select;

    fn attrs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_select_takes_a_message_by_the_exact_value_of_its_attribute() {
        let select = Select { attribute: "type".into(), values: vec!["invoice".into(), "credit-note".into()] };
        assert!(select.takes(&attrs(&[("key", "k"), ("type", "credit-note")])));
        assert!(!select.takes(&attrs(&[("type", "Invoice")])), "values are compared exactly");
        assert!(!select.takes(&attrs(&[("kind", "invoice")])), "another attribute of that value");
        assert!(!select.takes(&attrs(&[])), "a message without the attribute");
        assert_eq!(select.to_string(), r#"type in ["invoice", "credit-note"]"#);
        let refunds = Select { attribute: "type".into(), values: vec!["refund".into(), "credit-note".into()] };
        assert_eq!(select.overlap(&refunds), Some("credit-note"));
        let orders = Select { attribute: "type".into(), values: vec!["order".into()] };
        assert_eq!(select.overlap(&orders), None);
        assert_eq!(orders.to_string(), r#"type = "order""#);
    }
}
