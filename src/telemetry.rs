//! Metrics (every name in one place, labels bounded: route, status, outcome, call,
//! kind — never an id) and the `tracing` subscriber (text or JSON lines).
//!
//! **Gauges computed from the shared inbox** (`inlet_inbox_*`) are published by one
//! instance only: the holder of the inbox's gauge lease (a PostgreSQL session advisory
//! lock; always the only instance on SQLite), which says so in
//! `inlet_inbox_gauges_publisher 1`. Every other instance exports no series of them,
//! so `sum()` and `max()` over replicas give the inbox's figure once; `max by (…)` stays
//! right even in the seconds of a hand-over, when two instances may both still show one.
//! Everything else (counters, histograms, `inlet_store_up`, `inlet_route_paused`, the
//! Pub/Sub gauges) is each instance's own: sum counters, take `min`/`max` of gauges.

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub route: String,
}

/// The stages of an outbox source that can fail (`inlet_outbox_errors_total`).
pub const OUTBOX_STAGES: [&str; 5] = ["connect", "table", "read", "store", "mark"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteOutcome {
    pub route: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteStatus {
    pub route: String,
    pub status: &'static str,
}

/// A route and the stage of its outbox source that failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteStage {
    pub route: String,
    pub stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteReason {
    pub route: String,
    pub reason: &'static str,
}

/// A group commit: `inserts` (push inserts) or `settles` (attempts' settles).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabel {
    pub group: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    /// `server` (`[server] listen`) or `admin` (`[admin] listen`).
    pub listener: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerReason {
    pub listener: &'static str,
    /// One of [`LISTENER_REFUSALS`].
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignInLabels {
    /// `console` (`POST /console/login`) or `api` (a bearer token).
    pub via: &'static str,
    /// One of [`SIGN_IN_REFUSALS`].
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteCall {
    pub route: String,
    /// `decode`, `render` or `classify`.
    pub call: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginFaultLabels {
    pub route: String,
    pub call: &'static str,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutputRuleLabels {
    pub route: String,
    pub call: &'static str,
    /// The rule's name (`crate::rules::Violation::rule`): a fixed set.
    pub rule: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShadowPart {
    pub route: String,
    pub call: &'static str,
    /// What differed (`crate::shadow`): `path`, `body`, `disposition`, … (a fixed set).
    pub part: &'static str,
}

/// The end of the help text of every gauge computed from the shared inbox.
macro_rules! publisher_note {
    () => {
        "; published by one instance only (inlet_inbox_gauges_publisher 1), absent on the others: aggregate with max"
    };
}

/// Dispositions of a delivery attempt (`relay::policy::Disposition::label`).
pub const ATTEMPT_OUTCOMES: [&str; 5] = ["done", "retry", "not_yet", "park", "ignore"];
/// Outcomes of a message taken in (`ingest::Stored::as_str`).
pub const INGEST_OUTCOMES: [&str; 5] = ["inserted", "duplicate", "conflict", "parked", "ignored"];
/// The plugin calls.
pub const PLUGIN_CALLS: [&str; 3] = ["decode", "render", "classify"];
/// Kinds of plugin fault (`plugin::PluginFault::kind`).
pub const FAULT_KINDS: [&str; 8] =
    ["timeout", "fuel", "out_of_memory", "trap", "oversized_output", "instantiate", "busy", "host_memory"];
/// Why the listener refuses a push (`source::push::Rejection`'s labels).
pub const PUSH_REJECTIONS: [&str; 4] = ["shed", "too_large", "body_timeout", "timeout"];
/// Why a listener refused a connection or a request before any handler saw it
/// (`crate::server`, `crate::admin::access::gate`).
pub const LISTENER_REFUSALS: [&str; 6] =
    ["max_connections", "max_connections_per_peer", "foreign_host", "origin", "body_timeout", "too_large"];
/// Why a token was refused (`crate::guesses::Guesses`): not configured, the
/// peer's failures are being waited out, or no room for another console session.
pub const SIGN_IN_REFUSALS: [&str; 3] = ["unknown_token", "rate_limited", "too_many_sessions"];
/// Unresolved states, as the `status` label spells them.
pub const UNRESOLVED: [crate::inbox::Status; 3] =
    [crate::inbox::Status::Open, crate::inbox::Status::InProgress, crate::inbox::Status::Parked];

pub struct Metrics {
    registry: Registry,
    /// Messages taken in, by outcome: inserted, duplicate, conflict, parked, ignored.
    pub ingested: Family<RouteOutcome, Counter>,
    /// Messages refused (nacked) because the inbox could not store them.
    pub ingest_failures: Family<RouteLabel, Counter>,
    /// A different payload under a known dedup key.
    pub dedup_conflicts: Family<RouteLabel, Counter>,
    /// Delivery attempts by disposition: done, retry, not_yet, park, ignore.
    pub attempts: Family<RouteOutcome, Counter>,
    /// Entries that ended PARKED during relay (alarm on this).
    pub parked: Family<RouteLabel, Counter>,
    pub plugin_faults: Family<PluginFaultLabels, Counter>,
    /// Plugin answers refused by an output rule (`crate::rules`); the entry is parked.
    pub output_refused: Family<OutputRuleLabels, Counter>,
    /// Messages the inbox refused for what they hold, stored PARKED without their keys.
    pub store_refused: Family<RouteLabel, Counter>,
    /// Routing files applied (`ok`) or refused (`refused`) while running.
    pub config_reloads: Family<OutcomeLabel, Counter>,
    /// Plugin versions swapped in (`ok`) or refused (`refused`).
    pub plugin_reloads: Family<RouteOutcome, Counter>,
    /// 1 while a route runs, 0 while it is refused (its plugin or settings do not load).
    pub route_up: Family<RouteLabel, Gauge>,
    /// 1 while a route is paused (its relay on this instance claims nothing), else 0;
    /// each instance reports what its relay last read (aggregate with `max`).
    pub route_paused: Family<RouteLabel, Gauge>,
    /// How many instances divide a per-key route's keys, as this instance last read
    /// its members (1 alone, and on SQLite).
    pub route_instances: Family<RouteLabel, Gauge>,
    /// Routes refused at start or reload, once per distinct cause.
    pub route_load_failures: Family<RouteLabel, Counter>,
    /// Plugin files refused because they are not the build their route pins, once per
    /// distinct file version (at start, and while the pinned version keeps serving).
    pub plugin_digest_mismatch: Family<RouteLabel, Counter>,
    /// Routing files refused whole (they do not parse far enough to name their routes).
    pub routing_files_refused: Gauge,
    /// Outcomes discarded because the worker's lease was gone.
    pub lease_lost: Family<RouteLabel, Counter>,
    /// Entries claimed by the settle of the entry before them of their key (handed on
    /// to the slot that delivered it), not by a claim of the relay's.
    pub claims_handed_on: Family<RouteLabel, Counter>,
    /// Delivery attempts that panicked (a bug in Inlet): alert on any.
    pub attempt_panics: Family<RouteLabel, Counter>,
    /// Time from sending a request to the target to its answer.
    pub delivery_seconds: Family<RouteLabel, Histogram>,
    /// Time from an entry's receipt to the attempt that delivered it (DONE).
    pub queue_seconds: Family<RouteLabel, Histogram>,
    /// Time one claim statement (with its lease) takes.
    pub claim_seconds: Family<RouteLabel, Histogram>,
    /// Time one plugin call takes, by call (decode, render, classify).
    pub plugin_call_seconds: Family<RouteCall, Histogram>,
    /// 1 while this instance's last inbox query (every housekeeping tick) answered.
    pub store_up: Gauge,
    /// 1 on the one instance that publishes the `inlet_inbox_*` gauges, else 0.
    pub gauges_publisher: Gauge,
    /// Retention rounds by outcome (`ok`, `failed`).
    pub retention_runs: Family<OutcomeLabel, Counter>,
    /// Unresolved entries by state, refreshed periodically from the inbox (one publisher).
    pub entries: Family<RouteStatus, Gauge>,
    /// Age of the oldest OPEN entry (one publisher).
    pub oldest_open_age_seconds: Family<RouteLabel, Gauge<f64, AtomicU64>>,
    /// Age of the oldest unresolved entry by state (one publisher).
    pub oldest_age_seconds: Family<RouteStatus, Gauge<f64, AtomicU64>>,
    /// Keys held up: their head is PARKED under `block-key`, or an entry waits behind
    /// an older one of its key (one publisher).
    pub blocked_keys: Family<RouteLabel, Gauge>,
    /// Age of the head (oldest unresolved entry) of the oldest blocked key (one publisher).
    pub oldest_blocked_key_age_seconds: Family<RouteLabel, Gauge<f64, AtomicU64>>,
    /// Pub/Sub messages taken from the stream, per route (redeliveries included).
    pub pubsub_received: Family<RouteLabel, Counter>,
    /// Pub/Sub messages acked (stored) and nacked (not stored), per route.
    pub pubsub_acks: Family<RouteOutcome, Counter>,
    /// Acks an exactly-once subscription refused, by reason (`lease_expired`, `rpc`,
    /// `shutdown_before_ack`, `shutdown`, `other`): those messages come again.
    pub pubsub_acks_refused: Family<RouteReason, Counter>,
    /// Messages that arrived having used at least half of the delivery attempts their
    /// subscription's dead-letter policy allows: Pub/Sub dead-letters them if Inlet
    /// keeps failing to store them.
    pub pubsub_near_dead_letter: Family<RouteLabel, Counter>,
    /// Deliveries of messages that no route of the subscription selects: nacked,
    /// they come again (and go to the dead-letter topic where there is one). By the
    /// subscription's first route by name.
    pub pubsub_unrouted: Family<RouteLabel, Counter>,
    /// Claim-check fetches that failed, by kind (`crate::claim_check::FAILURE_KINDS`).
    pub fetch_failures: Family<RouteReason, Counter>,
    /// Claim-check objects deleted with their purged entries (`deleted`), or left in
    /// the store because the delete failed (`failed`).
    pub fetch_deletes: Family<RouteOutcome, Counter>,
    /// 1 while this instance is the one reading a route's outbox table (at most one
    /// instance reads an outbox at a time; the others stand by).
    pub outbox_reading: Family<RouteLabel, Gauge>,
    /// Outbox rows not yet published (or not yet deleted), as the reading instance
    /// last counted them.
    pub outbox_rows_waiting: Family<RouteLabel, Gauge>,
    /// Age of the oldest such row, by its `created_at` (the reading instance).
    pub outbox_oldest_seconds: Family<RouteLabel, Gauge<f64, AtomicU64>>,
    /// Outbox rows read and stored in the inbox as new entries.
    pub outbox_read: Family<RouteLabel, Counter>,
    /// Outbox rows marked published (or deleted) after their entry was finished.
    pub outbox_marked: Family<RouteLabel, Counter>,
    /// From a row's `created_at` to its marking: how long the outbox took to publish it.
    pub outbox_lag_seconds: Family<RouteLabel, Histogram>,
    /// Outbox reads, markings and connections that failed, by stage (`connect`,
    /// `table`, `read`, `store`, `mark`).
    pub outbox_errors: Family<RouteStage, Counter>,
    /// Pub/Sub streams given up and opened again, by reason.
    pub pubsub_reconnects: Family<RouteOutcome, Counter>,
    /// 1 while a route's subscription stream is open and the broker answers.
    pub pubsub_connected: Family<RouteLabel, Gauge>,
    /// Messages received from Pub/Sub and not yet acked or nacked.
    pub pubsub_outstanding: Family<RouteLabel, Gauge>,
    /// Messages per inbox transaction of the Pub/Sub source.
    pub pubsub_batch_size: Family<RouteLabel, Histogram>,
    /// Writes per batch of a group commit (`crate::inbox::group`), by group.
    pub group_commit_batch_size: Family<GroupLabel, Histogram>,
    /// How long a group commit's batch took to write, by group.
    pub group_commit_seconds: Family<GroupLabel, Histogram>,
    /// Writes a group commit expects now: for `settles`, the delivery slots in use.
    pub group_commit_expected: Family<GroupLabel, Gauge>,
    /// Batches that waited the whole linger for an expected write that did not come.
    pub group_commit_lingered_out: Family<GroupLabel, Counter>,
    /// Bytes all plugin instances of the process hold (the `[plugins]` budget's use).
    pub plugin_memory_bytes: Gauge,
    /// Push requests the listener refused before the route saw them, by reason:
    /// `shed` (too many in flight), `too_large`, `body_timeout`, `timeout`. The
    /// route is `-` when the path names no route.
    pub push_rejected: Family<RouteReason, Counter>,
    /// Push requests being handled now (what `max_concurrent_pushes` caps).
    pub push_in_flight: Gauge,
    /// Push requests refused by push auth, by reason (missing, expired, audience, …).
    pub push_auth_refused: Family<RouteReason, Counter>,
    /// Connections and requests a listener refused before any handler saw them.
    pub listener_refused: Family<ListenerReason, Counter>,
    /// Connections open now, per listener (what `max_connections` caps).
    pub listener_connections: Family<ListenerLabel, Gauge>,
    /// Tokens refused at sign-in or by the API, and sign-ins refused, by reason.
    pub sign_in_refused: Family<SignInLabels, Counter>,
    /// Answers of a shadow candidate compared with the serving plugin's, by call.
    pub shadow_compared: Family<RouteCall, Counter>,
    /// Differences a shadow candidate's answers showed, by call and part.
    pub shadow_differences: Family<ShadowPart, Counter>,
    /// Shadow candidate calls that faulted (not compared), by call and kind.
    pub shadow_faults: Family<PluginFaultLabels, Counter>,
    /// Shadow work dropped because the candidate was behind.
    pub shadow_dropped: Family<RouteLabel, Counter>,
    /// Bytes shadow candidates' instances hold (their own budget).
    pub shadow_memory_bytes: Gauge,
}

/// `inlet_build_info`: what `inlet --version` says, as labels of a constant 1.
fn build_info() -> prometheus_client::metrics::info::Info<Vec<(String, String)>> {
    use crate::build_info::{COMMIT, VERSION, contracts, schemas};
    let mut labels = vec![
        ("version".to_string(), VERSION.to_string()),
        ("commit".to_string(), COMMIT.to_string()),
        ("contracts".to_string(), contracts()),
    ];
    for (store, newest) in schemas() {
        labels.push((format!("schema_{store}"), newest.to_string()));
    }
    prometheus_client::metrics::info::Info::new(labels)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Counts a plugin answer refused by output rule `rule` (ingest and relay alike).
    pub fn count_refused(&self, route: &str, call: &'static str, rule: &'static str) {
        self.output_refused.get_or_create(&OutputRuleLabels { route: route.to_string(), call, rule }).inc();
    }

    /// Counts a plugin call that faulted (`kind`: trap, timeout, …) on the serving path.
    pub fn count_plugin_fault(&self, route: &str, call: &'static str, kind: &'static str) {
        self.plugin_faults.get_or_create(&PluginFaultLabels { route: route.to_string(), call, kind }).inc();
    }

    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("inlet");
        let m = Metrics {
            ingested: Family::default(),
            ingest_failures: Family::default(),
            dedup_conflicts: Family::default(),
            attempts: Family::default(),
            parked: Family::default(),
            plugin_faults: Family::default(),
            output_refused: Family::default(),
            store_refused: Family::default(),
            lease_lost: Family::default(),
            claims_handed_on: Family::default(),
            attempt_panics: Family::default(),
            plugin_reloads: Family::default(),
            config_reloads: Family::default(),
            route_up: Family::default(),
            route_paused: Family::default(),
            route_instances: Family::default(),
            route_load_failures: Family::default(),
            plugin_digest_mismatch: Family::default(),
            routing_files_refused: Gauge::default(),
            delivery_seconds: Family::new_with_constructor(|| {
                Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
            }),
            queue_seconds: Family::new_with_constructor(|| {
                Histogram::new([0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0])
            }),
            claim_seconds: Family::new_with_constructor(|| {
                Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5])
            }),
            plugin_call_seconds: Family::new_with_constructor(|| {
                Histogram::new([0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0])
            }),
            store_up: Gauge::default(),
            gauges_publisher: Gauge::default(),
            retention_runs: Family::default(),
            entries: Family::default(),
            oldest_open_age_seconds: Family::default(),
            oldest_age_seconds: Family::default(),
            blocked_keys: Family::default(),
            oldest_blocked_key_age_seconds: Family::default(),
            pubsub_received: Family::default(),
            pubsub_acks: Family::default(),
            pubsub_acks_refused: Family::default(),
            pubsub_near_dead_letter: Family::default(),
            pubsub_unrouted: Family::default(),
            fetch_failures: Family::default(),
            fetch_deletes: Family::default(),
            outbox_reading: Family::default(),
            outbox_rows_waiting: Family::default(),
            outbox_oldest_seconds: Family::default(),
            outbox_read: Family::default(),
            outbox_marked: Family::default(),
            outbox_lag_seconds: Family::new_with_constructor(|| {
                Histogram::new([0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0])
            }),
            outbox_errors: Family::default(),
            pubsub_reconnects: Family::default(),
            pubsub_connected: Family::default(),
            pubsub_outstanding: Family::default(),
            pubsub_batch_size: Family::new_with_constructor(|| {
                Histogram::new([1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0])
            }),
            group_commit_batch_size: Family::new_with_constructor(|| {
                Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0])
            }),
            group_commit_seconds: Family::new_with_constructor(|| {
                Histogram::new([0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0])
            }),
            group_commit_expected: Family::default(),
            group_commit_lingered_out: Family::default(),
            plugin_memory_bytes: Gauge::default(),
            push_rejected: Family::default(),
            push_in_flight: Gauge::default(),
            push_auth_refused: Family::default(),
            listener_refused: Family::default(),
            listener_connections: Family::default(),
            sign_in_refused: Family::default(),
            shadow_compared: Family::default(),
            shadow_differences: Family::default(),
            shadow_faults: Family::default(),
            shadow_dropped: Family::default(),
            shadow_memory_bytes: Gauge::default(),
            registry: Registry::default(),
        };
        for via in ["console", "api"] {
            for reason in SIGN_IN_REFUSALS {
                let _ = m.sign_in_refused.get_or_create(&SignInLabels { via, reason });
            }
        }
        for outcome in ["ok", "refused"] {
            let _ = m.config_reloads.get_or_create(&OutcomeLabel { outcome });
        }
        registry.register(
            "build",
            "What this binary is: version, commit, plugin contracts, newest inbox schema per store",
            build_info(),
        );
        registry.register("ingested", "Messages taken in, by outcome", m.ingested.clone());
        registry.register(
            "plugin_memory_bytes",
            "Memory held by plugin instances, live and warm, in bytes",
            m.plugin_memory_bytes.clone(),
        );
        registry.register(
            "ingest_failures",
            "Messages nacked because the inbox could not store them",
            m.ingest_failures.clone(),
        );
        registry.register(
            "dedup_conflicts",
            "Different payloads arriving under a known dedup key",
            m.dedup_conflicts.clone(),
        );
        registry.register("delivery_attempts", "Delivery attempts by disposition", m.attempts.clone());
        registry.register(
            "attempt_panics",
            "Delivery attempts that panicked (a bug in Inlet), each counted as a failed attempt",
            m.attempt_panics.clone(),
        );
        registry.register("parked", "Entries parked by the relay", m.parked.clone());
        registry.register("plugin_faults", "Plugin calls that trapped or broke a limit", m.plugin_faults.clone());
        registry.register(
            "plugin_output_refused",
            "Plugin answers refused by an output rule, by call and rule",
            m.output_refused.clone(),
        );
        registry.register(
            "store_refused",
            "Messages the inbox refused for what they hold, stored PARKED without their keys",
            m.store_refused.clone(),
        );
        registry.register("config_reloads", "Routing files applied or refused while running", m.config_reloads.clone());
        registry.register("plugin_reloads", "Plugin versions swapped in or refused", m.plugin_reloads.clone());
        registry.register("route_up", "1 while a route runs, 0 while it is refused", m.route_up.clone());
        registry.register(
            "route_paused",
            "1 while a route is paused (nothing claimed, ingest goes on), as this instance's relay last read it",
            m.route_paused.clone(),
        );
        registry.register(
            "route_instances",
            "Instances relaying the route (dividing its keys, if per-key), as this instance last read the route's members",
            m.route_instances.clone(),
        );
        registry.register(
            "route_load_failures",
            "Routes refused at start or reload, once per distinct cause",
            m.route_load_failures.clone(),
        );
        registry.register(
            "plugin_digest_mismatch",
            "Plugin files refused because their SHA-256 is not the one their route pins, once per file version",
            m.plugin_digest_mismatch.clone(),
        );
        registry.register(
            "routing_files_refused",
            "Routing files refused whole, naming no route",
            m.routing_files_refused.clone(),
        );
        registry.register("lease_lost", "Attempt outcomes discarded because the lease was lost", m.lease_lost.clone());
        registry.register(
            "claims_handed_on",
            "Entries claimed by the settle of the entry before them of their key, for the same delivery slot",
            m.claims_handed_on.clone(),
        );
        registry.register("delivery_duration_seconds", "Target response time", m.delivery_seconds.clone());
        registry.register(
            "queue_time_seconds",
            "Time from an entry's receipt to the attempt that delivered it",
            m.queue_seconds.clone(),
        );
        registry.register("claim_duration_seconds", "Time one claim of due entries takes", m.claim_seconds.clone());
        registry.register(
            "plugin_call_duration_seconds",
            "Time one plugin call takes, by call",
            m.plugin_call_seconds.clone(),
        );
        registry.register(
            "store_up",
            "1 while this instance's last inbox query answered, 0 while the inbox is unreachable",
            m.store_up.clone(),
        );
        registry.register(
            "inbox_gauges_publisher",
            "1 on the one instance that publishes the inlet_inbox_* gauges (the others export none of them)",
            m.gauges_publisher.clone(),
        );
        registry.register("retention_runs", "Retention rounds by outcome (ok, failed)", m.retention_runs.clone());
        registry.register(
            "inbox_entries",
            concat!("Unresolved inbox entries by status", publisher_note!()),
            m.entries.clone(),
        );
        registry.register(
            "inbox_oldest_open_age_seconds",
            concat!("Age of the oldest open entry", publisher_note!()),
            m.oldest_open_age_seconds.clone(),
        );
        registry.register(
            "inbox_oldest_age_seconds",
            concat!("Age of the oldest unresolved entry by status", publisher_note!()),
            m.oldest_age_seconds.clone(),
        );
        registry.register(
            "inbox_blocked_keys",
            concat!(
                "Keys held up: head PARKED under block-key, or an entry waiting behind an older one of its key",
                publisher_note!()
            ),
            m.blocked_keys.clone(),
        );
        registry.register(
            "inbox_oldest_blocked_key_age_seconds",
            concat!("Age of the oldest blocked key's head entry", publisher_note!()),
            m.oldest_blocked_key_age_seconds.clone(),
        );
        registry.register("pubsub_received", "Pub/Sub messages taken from the stream", m.pubsub_received.clone());
        registry.register("pubsub_messages", "Pub/Sub messages acked or nacked", m.pubsub_acks.clone());
        registry.register(
            "pubsub_acks_refused",
            "Acks an exactly-once subscription refused, by reason; those messages come again",
            m.pubsub_acks_refused.clone(),
        );
        registry.register(
            "pubsub_near_dead_letter",
            "Messages that arrived with half or more of their dead-letter policy's delivery attempts used",
            m.pubsub_near_dead_letter.clone(),
        );
        registry.register(
            "pubsub_unrouted",
            "Deliveries of messages no route of the subscription selects, nacked (by its first route by name)",
            m.pubsub_unrouted.clone(),
        );
        registry.register(
            "fetch_deletes",
            "Claim-check objects deleted with their purged entries, or left because the delete failed",
            m.fetch_deletes.clone(),
        );
        registry.register(
            "fetch_failures",
            "Claim-check fetches that failed, by kind (temporary ones are retried)",
            m.fetch_failures.clone(),
        );
        registry.register(
            "outbox_reading",
            "1 while this instance reads the route's outbox table",
            m.outbox_reading.clone(),
        );
        registry.register(
            "outbox_rows_waiting",
            "Outbox rows not yet published, as the reading instance last counted them",
            m.outbox_rows_waiting.clone(),
        );
        registry.register(
            "outbox_oldest_seconds",
            "Age of the oldest outbox row not yet published",
            m.outbox_oldest_seconds.clone(),
        );
        registry.register("outbox_read", "Outbox rows stored in the inbox as new entries", m.outbox_read.clone());
        registry.register("outbox_marked", "Outbox rows marked published or deleted", m.outbox_marked.clone());
        registry.register(
            "outbox_lag_seconds",
            "From an outbox row's created_at to its marking",
            m.outbox_lag_seconds.clone(),
        );
        registry.register("outbox_errors", "Outbox reads and markings that failed, by stage", m.outbox_errors.clone());
        registry.register("pubsub_reconnects", "Pub/Sub streams reopened, by reason", m.pubsub_reconnects.clone());
        registry.register("pubsub_connected", "1 while the subscription stream is up", m.pubsub_connected.clone());
        registry.register(
            "pubsub_outstanding_messages",
            "Pub/Sub messages held, not yet acked or nacked",
            m.pubsub_outstanding.clone(),
        );
        registry.register(
            "pubsub_batch_size",
            "Messages per inbox transaction of the Pub/Sub source",
            m.pubsub_batch_size.clone(),
        );
        registry.register(
            "group_commit_batch_size",
            "Writes per batch of a group commit, by group (inserts: push inserts; settles: attempts' settles)",
            m.group_commit_batch_size.clone(),
        );
        registry.register(
            "group_commit_seconds",
            "Time a group commit's batch took to write, by group",
            m.group_commit_seconds.clone(),
        );
        registry.register(
            "group_commit_expected_writes",
            "Writes a group commit expects now (settles: delivery slots in use), by group",
            m.group_commit_expected.clone(),
        );
        registry.register(
            "group_commit_lingered_out",
            "Batches that waited the whole linger for an expected write that did not come, by group",
            m.group_commit_lingered_out.clone(),
        );
        registry.register(
            "push_rejected",
            "Push requests answered with an error and nothing stored, by route and reason: the listener's limits (shed, too_large, body_timeout, timeout), the request (no_route, not_json, bad_envelope, route_refused) or what it needs (store_unavailable, plugin_busy)",
            m.push_rejected.clone(),
        );
        registry.register("push_in_flight", "Push requests being handled", m.push_in_flight.clone());
        registry.register(
            "push_auth_refused",
            "Push requests refused by push auth, by reason",
            m.push_auth_refused.clone(),
        );
        registry.register(
            "listener_refused",
            "Connections and requests a listener refused before any handler saw them, by listener and reason: max_connections, max_connections_per_peer (the connection is answered 503 and closed), foreign_host, origin (403), body_timeout (408), too_large (413)",
            m.listener_refused.clone(),
        );
        registry.register("listener_connections", "Connections open now, by listener", m.listener_connections.clone());
        registry.register(
            "sign_in_refused",
            "Tokens refused, by where they were presented (console, api) and reason: unknown_token, rate_limited (429, the peer's failures are waited out), too_many_sessions (console)",
            m.sign_in_refused.clone(),
        );
        registry.register(
            "shadow_compared",
            "Answers of a shadow candidate compared with the serving plugin's, by route and call",
            m.shadow_compared.clone(),
        );
        registry.register(
            "shadow_differences",
            "Differences between a shadow candidate's answers and the serving plugin's, by route, call and part",
            m.shadow_differences.clone(),
        );
        registry.register(
            "shadow_faults",
            "Shadow candidate calls that faulted (not compared), by route, call and kind",
            m.shadow_faults.clone(),
        );
        registry.register(
            "shadow_dropped",
            "Shadow work dropped because the candidate was behind (never queued in front of deliveries)",
            m.shadow_dropped.clone(),
        );
        registry.register(
            "shadow_memory_bytes",
            "Memory held by shadow candidates' instances (a budget apart from the serving plugins'), in bytes",
            m.shadow_memory_bytes.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Creates a shadowed route's series at 0 (when its candidate starts).
    pub fn register_shadow(&self, route: &str) {
        let _ = self.shadow_dropped.get_or_create(&Metrics::route(route));
        for call in PLUGIN_CALLS {
            let _ = self.shadow_compared.get_or_create(&RouteCall { route: route.to_string(), call });
        }
    }

    /// Creates a listener's series at 0 (called when it starts serving).
    pub fn register_listener(&self, listener: &'static str) {
        let _ = self.listener_connections.get_or_create(&ListenerLabel { listener });
        for reason in LISTENER_REFUSALS {
            let _ = self.listener_refused.get_or_create(&ListenerReason { listener, reason });
        }
    }

    /// Counts a refusal of `listener` in `inlet_listener_refused_total`.
    pub fn listener_refused(&self, listener: &'static str, reason: &'static str) {
        self.listener_refused.get_or_create(&ListenerReason { listener, reason }).inc();
    }

    /// Where group commit `group` (`inserts`, `settles`) reports its batches; its
    /// series show from now on, at zero.
    pub fn group_report(&self, group: &'static str) -> crate::inbox::group::GroupReport {
        let label = GroupLabel { group };
        crate::inbox::group::GroupReport {
            batch_size: self.group_commit_batch_size.get_or_create_owned(&label),
            write_seconds: self.group_commit_seconds.get_or_create_owned(&label),
            expected: self.group_commit_expected.get_or_create_owned(&label),
            lingered_out: self.group_commit_lingered_out.get_or_create_owned(&label),
        }
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        self.plugin_memory_bytes.set(crate::plugin::sandbox::BUDGET.used() as i64);
        self.shadow_memory_bytes.set(crate::plugin::sandbox::SHADOW_BUDGET.used() as i64);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    pub fn route(route: &str) -> RouteLabel {
        RouteLabel { route: route.to_string() }
    }

    pub fn outcome(route: &str, outcome: &'static str) -> RouteOutcome {
        RouteOutcome { route: route.to_string(), outcome }
    }

    /// Creates a configured route's counters at 0 and its histograms empty, so a rule
    /// over `increase()` sees the first event, and a dashboard lists the route before
    /// any traffic. `pull` adds the Pub/Sub source's series.
    /// An outbox route's series, so they show (at zero) before anything happens.
    pub fn register_outbox(&self, route: &str) {
        let label = Metrics::route(route);
        let _ = self.outbox_reading.get_or_create(&label);
        let _ = self.outbox_read.get_or_create(&label);
        let _ = self.outbox_marked.get_or_create(&label);
        let _ = self.outbox_lag_seconds.get_or_create(&label);
        for stage in crate::telemetry::OUTBOX_STAGES {
            let _ = self.outbox_errors.get_or_create(&RouteStage { route: route.to_string(), stage });
        }
    }

    pub fn register_route(&self, route: &str, pull: bool) {
        let label = Metrics::route(route);
        for outcome in INGEST_OUTCOMES {
            let _ = self.ingested.get_or_create(&Metrics::outcome(route, outcome));
        }
        for outcome in ATTEMPT_OUTCOMES {
            let _ = self.attempts.get_or_create(&Metrics::outcome(route, outcome));
        }
        for call in PLUGIN_CALLS {
            let _ = self.plugin_call_seconds.get_or_create(&RouteCall { route: route.to_string(), call });
            for kind in FAULT_KINDS {
                let _ = self.plugin_faults.get_or_create(&PluginFaultLabels { route: route.to_string(), call, kind });
            }
        }
        for family in [
            &self.ingest_failures,
            &self.dedup_conflicts,
            &self.parked,
            &self.store_refused,
            &self.lease_lost,
            &self.claims_handed_on,
            &self.attempt_panics,
            &self.route_load_failures,
            &self.plugin_digest_mismatch,
        ] {
            let _ = family.get_or_create(&label);
        }
        for family in [&self.delivery_seconds, &self.queue_seconds, &self.claim_seconds] {
            let _ = family.get_or_create(&label);
        }
        let _ = self.route_paused.get_or_create(&label);
        for reason in crate::claim_check::FAILURE_KINDS {
            let _ = self.fetch_failures.get_or_create(&RouteReason { route: route.to_string(), reason });
        }
        if pull {
            let _ = self.pubsub_received.get_or_create(&label);
            let _ = self.pubsub_connected.get_or_create(&label);
            let _ = self.pubsub_outstanding.get_or_create(&label);
            let _ = self.pubsub_batch_size.get_or_create(&label);
            let _ = self.pubsub_unrouted.get_or_create(&label);
            // From the start, not from the first session: a scrape before the stream
            // is up (Pub/Sub unreachable) still shows the series the alerts read.
            let _ = self.pubsub_near_dead_letter.get_or_create(&label);
            for outcome in ["acked", "nacked"] {
                let _ = self.pubsub_acks.get_or_create(&Metrics::outcome(route, outcome));
            }
        } else {
            for reason in PUSH_REJECTIONS {
                let _ = self.push_rejected.get_or_create(&RouteReason { route: route.to_string(), reason });
            }
        }
    }

    /// Records how long a plugin call that began at `started` took.
    pub fn plugin_call(&self, route: &str, call: &'static str, started: Instant) {
        self.plugin_call_seconds
            .get_or_create(&RouteCall { route: route.to_string(), call })
            .observe(started.elapsed().as_secs_f64());
    }

    /// Drops every series of the gauges computed from the shared inbox: this instance
    /// does not (or no longer) publish them.
    pub fn clear_inbox_gauges(&self) {
        self.entries.clear();
        self.oldest_open_age_seconds.clear();
        self.oldest_age_seconds.clear();
        self.blocked_keys.clear();
        self.oldest_blocked_key_age_seconds.clear();
    }
}

/// The text exposition with the series of routes `keep` refuses dropped: a sample
/// whose `route` label names such a route goes; series without a `route` label
/// (process-wide ones) and comment lines stay. A sample line that does not parse is
/// dropped too, so nothing of a refused route passes by a quirk of escaping. What a
/// token limited to some routes reads at `/metrics` (`admin::metrics`).
pub fn only_routes(exposition: &str, keep: impl Fn(&str) -> bool) -> String {
    let mut out = String::with_capacity(exposition.len());
    for line in exposition.split_inclusive('\n') {
        let shown = line.starts_with('#') || route_label(line).is_ok_and(|r| r.is_none_or(|r| keep(&r)));
        if shown {
            out.push_str(line);
        }
    }
    out
}

/// The `route` label of a sample line (`name{a="x",route="y"} 1`): `Ok(None)` when it
/// has none, `Err` when its labels do not parse.
fn route_label(line: &str) -> Result<Option<String>, ()> {
    let Some(open) = line.find('{') else { return Ok(None) };
    if line[..open].contains(' ') {
        // `{` after the value: an exemplar, not the sample's labels.
        return Ok(None);
    }
    let mut chars = line[open + 1..].chars();
    let mut route = None;
    loop {
        let mut name = String::new();
        let mut next = chars.next().ok_or(())?;
        if next == '}' && name.is_empty() {
            return Ok(route);
        }
        while next != '=' {
            name.push(next);
            next = chars.next().ok_or(())?;
        }
        if chars.next() != Some('"') {
            return Err(());
        }
        let mut value = String::new();
        loop {
            match chars.next().ok_or(())? {
                '"' => break,
                '\\' => match chars.next().ok_or(())? {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                c => value.push(c),
            }
        }
        if name.trim() == "route" {
            route = Some(value);
        }
        match chars.next().ok_or(())? {
            ',' => {}
            '}' => return Ok(route),
            _ => return Err(()),
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line: timestamp, level, target, the event's fields, the
    /// innermost span (`span`) and every span it runs in (`spans`) with their fields.
    Json,
}

/// Installs the log subscriber: `RUST_LOG` filters (default `info`), text lines on
/// stderr.
pub fn init_logging() {
    init_logging_at("info", LogFormat::Text);
}

/// [`init_logging`] with another default level when `RUST_LOG` is unset (the
/// command-line tools other than `inlet run` log only warnings and errors, so their
/// own output is not mixed with progress lines) and a format. Colour codes only when
/// stderr is a terminal and `NO_COLOR` is unset, in either format.
pub fn init_logging_at(default: &str, format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).with_span_list(true).try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_routes_kept_remain() {
        let text = "# HELP inlet_entries Entries.\n# TYPE inlet_entries gauge\n\
                    inlet_entries{route=\"a\",status=\"OPEN\"} 1\n\
                    inlet_entries{status=\"OPEN\",route=\"b\"} 2\n\
                    inlet_push{route=\"a\\\"b\"} 3\n\
                    inlet_store_up 1\n\
                    inlet_runs{outcome=\"ok\"} 4\n\
                    inlet_broken{route=\"a 5\n\
                    # EOF\n";
        let kept = only_routes(text, |r| r == "a");
        assert_eq!(
            kept,
            "# HELP inlet_entries Entries.\n# TYPE inlet_entries gauge\n\
             inlet_entries{route=\"a\",status=\"OPEN\"} 1\n\
             inlet_store_up 1\n\
             inlet_runs{outcome=\"ok\"} 4\n\
             # EOF\n"
        );
        assert!(only_routes(text, |r| r == "a\"b").contains("inlet_push{route=\"a\\\"b\"} 3"));
    }

    #[test]
    fn the_real_exposition_filters_by_route() {
        let m = Metrics::new();
        m.register_route("mine", false);
        m.register_route("theirs", false);
        let all = m.render();
        assert!(all.contains("route=\"theirs\"") && all.contains("route=\"mine\""), "{all}");
        let kept = only_routes(&all, |r| r == "mine");
        assert!(!kept.contains("theirs"), "{kept}");
        assert!(kept.contains("route=\"mine\""), "{kept}");
        assert!(kept.ends_with("# EOF\n"), "{kept}");
    }
}
