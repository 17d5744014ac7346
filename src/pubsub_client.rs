//! Google Pub/Sub clients for the pull source, the publish target and
//! `inlet pubsub setup` and `seek`: where to connect and with which credentials.
//!
//! The `google-cloud-pubsub` crate does not read `PUBSUB_EMULATOR_HOST`, so Inlet
//! does: with it set, every client goes to `http://HOST` (the crate needs the
//! scheme) with anonymous credentials — without them the crate looks for the GCE
//! metadata server and each call fails only after a minute of retries. Without it,
//! clients go to Google with Application Default Credentials.

use std::time::{Duration, SystemTime};

use google_cloud_auth::credentials::Credentials;
use google_cloud_auth::credentials::anonymous::Builder as Anonymous;
use google_cloud_gax::error::rpc::Code;
use google_cloud_gax::options::RequestOptionsBuilder as _;
use google_cloud_gax::retry_policy::NeverRetry;
use google_cloud_pubsub::client::{Publisher, Subscriber, SubscriptionAdmin, TopicAdmin};
use google_cloud_pubsub::model::push_config::{NoWrapper, OidcToken};
use google_cloud_pubsub::model::{DeadLetterPolicy, PushConfig, RetryPolicy as SubscriptionRetry, Subscription};
use google_cloud_wkt::FieldMask;

use crate::config::{Config, Ordering, RouteConfig, SourceConfig, SubscriptionSetup, TargetConfig};

pub use google_cloud_pubsub::Error;

/// Where Pub/Sub clients connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// `http://HOST:PORT` of an emulator; `None` for Google with ADC.
    emulator: Option<String>,
}

impl Connection {
    /// The emulator named by `PUBSUB_EMULATOR_HOST`, or Google.
    pub fn from_env() -> Connection {
        match std::env::var("PUBSUB_EMULATOR_HOST") {
            Ok(host) if !host.trim().is_empty() => Connection::emulator(host.trim()),
            _ => Connection::google(),
        }
    }

    /// An emulator at `HOST:PORT` (a scheme, if given, is kept).
    pub fn emulator(host: &str) -> Connection {
        install_crypto_provider();
        let endpoint = if host.contains("://") { host.to_string() } else { format!("http://{host}") };
        Connection { emulator: Some(endpoint) }
    }

    /// Google's service with Application Default Credentials.
    pub fn google() -> Connection {
        install_crypto_provider();
        Connection { emulator: None }
    }

    /// A short description for logs: the emulator's address or `google`.
    pub fn describe(&self) -> &str {
        self.emulator.as_deref().unwrap_or("google")
    }

    fn anonymous(&self) -> Option<Credentials> {
        self.emulator.as_ref().map(|_| Anonymous::new().build())
    }

    pub async fn subscriber(&self) -> Result<Subscriber, String> {
        let mut b = Subscriber::builder();
        if let (Some(ep), Some(creds)) = (&self.emulator, self.anonymous()) {
            b = b.with_endpoint(ep).with_credentials(creds);
        }
        b.build().await.map_err(|e| format!("cannot build the Pub/Sub subscriber client: {e}"))
    }

    pub async fn subscription_admin(&self) -> Result<SubscriptionAdmin, String> {
        let mut b = SubscriptionAdmin::builder();
        if let (Some(ep), Some(creds)) = (&self.emulator, self.anonymous()) {
            b = b.with_endpoint(ep).with_credentials(creds);
        }
        b.build().await.map_err(|e| format!("cannot build the Pub/Sub subscription admin client: {e}"))
    }

    pub async fn topic_admin(&self) -> Result<TopicAdmin, String> {
        let mut b = TopicAdmin::builder();
        if let (Some(ep), Some(creds)) = (&self.emulator, self.anonymous()) {
            b = b.with_endpoint(ep).with_credentials(creds);
        }
        b.build().await.map_err(|e| format!("cannot build the Pub/Sub topic admin client: {e}"))
    }

    /// A publisher for one topic. It batches for at most a few milliseconds: the
    /// relay awaits each publish, so a long batching delay is added to every delivery.
    /// Its retries end with `timeout` (the client's own policy would keep trying in
    /// the background for minutes, so a publish the relay gave up on — and retried,
    /// or followed by the key's next entry — could still land after it).
    pub async fn publisher(&self, topic: &str, timeout: Duration) -> Result<Publisher, String> {
        use google_cloud_gax::retry_policy::RetryPolicyExt as _;
        let retries = google_cloud_pubsub::retry_policy::RetryableErrors.with_time_limit(timeout);
        let mut b = Publisher::builder(topic).set_delay_threshold(Duration::from_millis(2)).with_retry_policy(retries);
        if let (Some(ep), Some(creds)) = (&self.emulator, self.anonymous()) {
            b = b.with_endpoint(ep).with_credentials(creds);
        }
        b.build().await.map_err(|e| format!("cannot build the Pub/Sub publisher for {topic}: {e}"))
    }
}

/// The crate's HTTP clients use rustls without a built-in crypto provider (the
/// default one, aws-lc, is a long C build), and panic when building a client with
/// none installed — even for a plain `http://` emulator. Installing twice is harmless.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// What a quick look at a subscription found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// The service answered (anything but "not found", even "permission denied").
    Reachable,
    /// The subscription does not exist.
    NotFound,
    /// No answer: connection refused, reset, or no reply in time.
    Unreachable(String),
}

/// Asks for the subscription once, without the client's retries (which would take
/// a minute against a dead server) and within `within`.
pub async fn probe(admin: &SubscriptionAdmin, subscription: &str, within: Duration) -> Probe {
    let call = admin.get_subscription().set_subscription(subscription).with_retry_policy(NeverRetry).send();
    match tokio::time::timeout(within, call).await {
        Err(_) => Probe::Unreachable(format!("no answer within {within:?}")),
        Ok(Ok(_)) => Probe::Reachable,
        Ok(Err(e)) if is_code(&e, Code::NotFound) => Probe::NotFound,
        Ok(Err(e)) if e.status().is_none() => Probe::Unreachable(e.to_string()),
        Ok(Err(_)) => Probe::Reachable,
    }
}

pub fn is_code(e: &Error, code: Code) -> bool {
    e.status().is_some_and(|s| s.code == code)
}

/// How long a subscription keeps messages: its `retain_acked_messages` and
/// `message_retention_duration` (`None`: not set, Pub/Sub's default of 7 days).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub retain_acked: bool,
    pub duration: Option<Duration>,
}

impl Retention {
    /// What a route's `retain_acked` asks for.
    pub fn acked_for(duration: Duration) -> Retention {
        Retention { retain_acked: true, duration: Some(duration) }
    }

    fn of(subscription: &Subscription) -> Retention {
        Retention {
            retain_acked: subscription.retain_acked_messages,
            duration: subscription.message_retention_duration.and_then(|d| Duration::try_from(d).ok()),
        }
    }

    /// The changes from `self` to `to`, field by field, as Pub/Sub names them.
    fn changes(&self, to: &Retention) -> Vec<String> {
        let mut changes = Vec::new();
        if self.retain_acked != to.retain_acked {
            changes.push(format!("retain_acked_messages {} → {}", self.retain_acked, to.retain_acked));
        }
        if self.duration != to.duration {
            let show = |d: Option<Duration>| d.map_or_else(|| "unset (7d)".to_string(), short_duration);
            changes.push(format!("message_retention_duration {} → {}", show(self.duration), show(to.duration)));
        }
        changes
    }
}

/// `7d`, `2h`, `90m`, `45s`: the largest whole unit, as a routing file writes it.
pub fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// One line of what `inlet pubsub setup` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupStep {
    Created {
        kind: &'static str,
        name: String,
    },
    Exists {
        kind: &'static str,
        name: String,
    },
    /// A subscription created keeping acked messages for `retain_acked`.
    CreatedRetaining {
        name: String,
        retain_acked: Duration,
    },
    /// An existing subscription's retention changed to what the routing file asks;
    /// `changes` says field by field what it was and what it is.
    Updated {
        name: String,
        changes: Vec<String>,
    },
    /// An existing subscription keeps acked messages though its route does not ask
    /// for it: left as it is, said so because it costs.
    RetainsUnasked {
        name: String,
        duration: Option<Duration>,
    },
    /// An existing subscription differs from what its route asks in settings setup
    /// does not change on a subscription it did not create (its topic and ordering
    /// cannot be changed at all; its dead-letter policy is a team's decision): each
    /// difference, what it is and what the routing file says.
    Drift {
        name: String,
        differences: Vec<String>,
    },
    /// A subscription whose dead-letter policy, with its redelivery backoff, gives up
    /// on a message after less than [`RIDE_OUT`] of nacks: an inbox outage that long
    /// sends messages Inlet never looked at to the dead-letter topic.
    DeadLettersSoon {
        name: String,
        attempts: u32,
        backoff: (Duration, Duration),
        after: Duration,
    },
}

/// The inbox outage a subscription with a dead-letter policy should ride out before
/// Pub/Sub gives up on messages: while Inlet cannot store, it nacks every message, and
/// each nack is a delivery attempt.
pub const RIDE_OUT: Duration = Duration::from_secs(3600);

/// About how long Pub/Sub keeps redelivering a message that is nacked at once every
/// time before its dead-letter policy gives up: the waits between `attempts` deliveries
/// under an exponential `backoff` (least, doubling up to most). Pub/Sub adds jitter
/// and Inlet's own time per try; this is the floor an operator plans with.
pub fn dead_letter_after(backoff: (Duration, Duration), attempts: u32) -> Duration {
    let (least, most) = backoff;
    let mut wait = least;
    let mut total = Duration::ZERO;
    for _ in 1..attempts {
        total = total.saturating_add(wait.min(most));
        wait = wait.saturating_mul(2);
    }
    total
}

impl SetupStep {
    /// The step for `inlet --json pubsub setup`: what happened (`step`), to what, the
    /// step's own fields (durations in seconds), and the line people read (`text`).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let text = self.to_string();
        match self {
            SetupStep::Created { kind, name } => json!({ "step": "created", "kind": kind, "name": name, "text": text }),
            SetupStep::Exists { kind, name } => json!({ "step": "exists", "kind": kind, "name": name, "text": text }),
            SetupStep::CreatedRetaining { name, retain_acked } => json!({
                "step": "created", "kind": "subscription", "name": name,
                "retain_acked_seconds": retain_acked.as_secs(), "text": text
            }),
            SetupStep::Updated { name, changes } => {
                json!({ "step": "updated", "kind": "subscription", "name": name, "changes": changes, "text": text })
            }
            SetupStep::RetainsUnasked { name, duration } => json!({
                "step": "retains_unasked", "kind": "subscription", "name": name,
                "retain_acked_seconds": duration.map(|d| d.as_secs()), "text": text
            }),
            SetupStep::Drift { name, differences } => json!({
                "step": "drift", "kind": "subscription", "name": name, "differences": differences, "text": text
            }),
            SetupStep::DeadLettersSoon { name, attempts, backoff, after } => json!({
                "step": "dead_letters_soon", "kind": "subscription", "name": name, "max_delivery_attempts": attempts,
                "redelivery_backoff_seconds": [backoff.0.as_secs_f64(), backoff.1.as_secs_f64()],
                "dead_letters_after_seconds": after.as_secs(), "text": text
            }),
        }
    }
}

impl std::fmt::Display for SetupStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupStep::Created { kind, name } => write!(f, "created {kind} {name}"),
            SetupStep::Exists { kind, name } => write!(f, "{kind} {name} exists"),
            SetupStep::CreatedRetaining { name, retain_acked } => {
                write!(f, "created subscription {name}, keeping acked messages for {}", short_duration(*retain_acked))
            }
            SetupStep::Updated { name, changes } => write!(f, "updated subscription {name}: {}", changes.join(", ")),
            SetupStep::Drift { name, differences } => write!(
                f,
                "subscription {name} differs from its route, left as it is: {} (recreate it, or change the routing file, \
                 to make them agree)",
                differences.join("; ")
            ),
            SetupStep::DeadLettersSoon { name, attempts, backoff, after } => write!(
                f,
                "warning: subscription {name} dead-letters a message after {attempts} delivery attempts, which with a \
                 redelivery backoff of {} to {} is about {} of nacks: an inbox outage that long sends messages Inlet \
                 never stored to the dead-letter topic (raise max_delivery_attempts or redelivery_backoff to ride out \
                 {}; docs/pubsub.md, \"Dead-letter policy\")",
                short_duration(backoff.0),
                short_duration(backoff.1),
                short_duration(*after),
                short_duration(RIDE_OUT)
            ),
            SetupStep::RetainsUnasked { name, duration } => write!(
                f,
                "subscription {name} exists and keeps acked messages for {}, which its route does not set \
                 (`retain_acked`): left as it is",
                duration.map_or_else(|| "7d".to_string(), short_duration)
            ),
        }
    }
}

/// What a route asks of its subscription, pull or push: the settings setup creates it
/// with and checks an existing one against.
struct Wanted<'a> {
    route: &'a RouteConfig,
    name: &'a str,
    setup: &'a SubscriptionSetup,
    exactly_once: bool,
    ack_deadline: Duration,
    /// A push route's: where Pub/Sub sends, with which token, in which format.
    push: Option<PushWanted<'a>>,
}

/// The push half of [`Wanted`].
struct PushWanted<'a> {
    endpoint: &'a str,
    /// The service account and audience of the route's OIDC token check.
    oidc: Option<(&'a str, &'a str)>,
    /// `--push-no-wrapper` (with `write_metadata`: Inlet takes the id, publish time and
    /// ordering key from its headers).
    unwrapped: bool,
}

/// How long Pub/Sub waits for a push request's answer: Inlet answers once the row is
/// committed, well within it.
const PUSH_ACK_DEADLINE: Duration = Duration::from_secs(60);

impl<'a> Wanted<'a> {
    /// The subscription `route` asks for, if it names one.
    fn of(route: &'a RouteConfig) -> Option<Wanted<'a>> {
        match &route.source {
            SourceConfig::Pubsub(s) => Some(Wanted {
                route,
                name: &s.subscription,
                setup: &s.setup,
                exactly_once: s.exactly_once,
                ack_deadline: s.lease_extension,
                push: None,
            }),
            SourceConfig::Outbox(_) => None,
            SourceConfig::Push(p) => {
                let sub = p.subscription.as_ref()?;
                let oidc = match &route.push_auth {
                    Some(crate::config::PushAuth::Oidc(o)) => Some((o.service_account.as_str(), o.audience.as_str())),
                    _ => None,
                };
                Some(Wanted {
                    route,
                    name: &sub.name,
                    setup: &sub.setup,
                    exactly_once: false,
                    ack_deadline: PUSH_ACK_DEADLINE,
                    push: Some(PushWanted { endpoint: &sub.endpoint, oidc, unwrapped: p.unwrapped.is_some() }),
                })
            }
        }
    }

    fn push_config(&self) -> Option<PushConfig> {
        let push = self.push.as_ref()?;
        let mut config = PushConfig::new().set_push_endpoint(push.endpoint);
        if let Some((account, audience)) = push.oidc {
            config = config.set_oidc_token(OidcToken::new().set_service_account_email(account).set_audience(audience));
        }
        if push.unwrapped {
            config = config.set_no_wrapper(NoWrapper::new().set_write_metadata(true));
        }
        Some(config)
    }
}

/// Creates the topics and subscriptions a routing file names, where missing:
/// every pubsub target's topic; for every route's subscription (a pull source's, and a
/// push source's where it names one) its topic, dead-letter topic and subscription with
/// every setting the route asks for: ordering, filter, exactly-once (pull), redelivery
/// backoff, dead-letter policy, acked-message retention, and for push the endpoint,
/// OIDC token and wrapper. An existing subscription is left as it is, except its
/// retention: set to the route's `retain_acked` where it differs (only those two
/// fields, reported as `updated`), reported where the route sets none and the
/// subscription keeps acked messages anyway; every other setting that differs from the
/// route is reported as `Drift` and left as it is. A dead-letter policy that gives up
/// within [`RIDE_OUT`] of nacks is warned about.
pub async fn setup(config: &Config, connection: &Connection) -> Result<Vec<SetupStep>, String> {
    let topics = connection.topic_admin().await?;
    let subscriptions = connection.subscription_admin().await?;
    let mut steps = Vec::new();
    let ensure_topic = async |name: &str, steps: &mut Vec<SetupStep>| -> Result<(), String> {
        match topics.create_topic().set_name(name).send().await {
            Ok(_) => steps.push(SetupStep::Created { kind: "topic", name: name.to_string() }),
            Err(e) if is_code(&e, Code::AlreadyExists) => {
                steps.push(SetupStep::Exists { kind: "topic", name: name.to_string() })
            }
            Err(e) => return Err(format!("cannot create topic {name}: {e}")),
        }
        Ok(())
    };
    // Pull routes that share a subscription (content routing) give it the same
    // settings: it is set up once. (A push and a pull route naming one subscription
    // are each checked against it: one of them is wrong about it.)
    let mut pulled: Vec<&str> = Vec::new();
    for route in &config.routes {
        if let TargetConfig::Pubsub(t) = &route.target {
            ensure_topic(&t.topic, &mut steps).await?;
        }
        let Some(w) = Wanted::of(route) else { continue };
        if w.push.is_none() {
            if pulled.contains(&w.name) {
                continue;
            }
            pulled.push(w.name);
        }
        let s = w.setup;
        let retention = s.retain_acked.map(Retention::acked_for);
        let Some(topic) = &s.topic else {
            // Without a topic the subscription cannot be created; it must exist.
            steps.extend(reconcile(&subscriptions, &w, retention, false).await?);
            steps.extend(dead_letters_soon(&w));
            continue;
        };
        ensure_topic(topic, &mut steps).await?;
        let mut create = subscriptions
            .create_subscription()
            .set_name(w.name)
            .set_topic(topic)
            .set_ack_deadline_seconds(w.ack_deadline.as_secs().clamp(10, 600) as i32)
            .set_enable_message_ordering(route.ordering == Ordering::PerKey)
            .set_enable_exactly_once_delivery(w.exactly_once)
            .set_retry_policy(
                SubscriptionRetry::new()
                    .set_minimum_backoff(wkt_duration(s.redelivery_backoff.0))
                    .set_maximum_backoff(wkt_duration(s.redelivery_backoff.1)),
            );
        if let Some(filter) = &s.filter {
            create = create.set_filter(filter);
        }
        if let Some(push) = w.push_config() {
            create = create.set_push_config(push);
        }
        if let Some(retain) = s.retain_acked {
            create = create.set_retain_acked_messages(true).set_message_retention_duration(wkt_duration(retain));
        }
        if let Some(dlq) = &s.dead_letter_topic {
            ensure_topic(dlq, &mut steps).await?;
            create = create.set_dead_letter_policy(
                DeadLetterPolicy::new()
                    .set_dead_letter_topic(dlq)
                    .set_max_delivery_attempts(s.max_delivery_attempts as i32),
            );
        }
        match (create.send().await, s.retain_acked) {
            (Ok(_), None) => steps.push(SetupStep::Created { kind: "subscription", name: w.name.to_string() }),
            (Ok(_), Some(retain_acked)) => {
                steps.push(SetupStep::CreatedRetaining { name: w.name.to_string(), retain_acked })
            }
            (Err(e), _) if is_code(&e, Code::AlreadyExists) => {
                steps.extend(reconcile(&subscriptions, &w, retention, true).await?)
            }
            (Err(e), _) => return Err(format!("cannot create subscription {}: {e}", w.name)),
        }
        steps.extend(dead_letters_soon(&w));
    }
    Ok(steps)
}

/// An existing subscription of a route: its retention set to `wanted` where it
/// differs (an UpdateSubscription of just those two fields), else reported as it is;
/// and what else differs from the route, reported ([`drift`]).
async fn reconcile(
    admin: &SubscriptionAdmin,
    w: &Wanted<'_>,
    wanted: Option<Retention>,
    has_topic: bool,
) -> Result<Vec<SetupStep>, String> {
    let (route, name) = (w.route.name.as_str(), w.name);
    let exists = SetupStep::Exists { kind: "subscription", name: name.to_string() };
    let call = admin.get_subscription().set_subscription(name).with_retry_policy(NeverRetry).send();
    let current = match tokio::time::timeout(Duration::from_secs(30), call).await {
        Err(_) => return Err("Pub/Sub is unreachable: no answer within 30s".to_string()),
        Ok(Ok(current)) => current,
        Ok(Err(e)) if is_code(&e, Code::NotFound) && !has_topic => {
            return Err(format!(
                "route {route}: subscription {name} does not exist and source.topic is not set, so it cannot be created"
            ));
        }
        Ok(Err(e)) if e.status().is_none() => return Err(format!("Pub/Sub is unreachable: {e}")),
        // It exists (creating it said so, or the service answered); with nothing to
        // change, not being allowed to read it is no reason to fail.
        Ok(Err(_)) if wanted.is_none() => return Ok(vec![exists]),
        Ok(Err(e)) => return Err(format!("cannot read subscription {name}: {e}")),
    };
    let differences = drift(&current, w);
    let drifted = (!differences.is_empty()).then(|| SetupStep::Drift { name: name.to_string(), differences });
    let has = Retention::of(&current);
    let Some(wanted) = wanted else {
        let step = if has.retain_acked {
            SetupStep::RetainsUnasked { name: name.to_string(), duration: has.duration }
        } else {
            exists
        };
        return Ok(std::iter::once(step).chain(drifted).collect());
    };
    let changes = has.changes(&wanted);
    if changes.is_empty() {
        return Ok(std::iter::once(exists).chain(drifted).collect());
    }
    let mut update = Subscription::new().set_name(name).set_retain_acked_messages(wanted.retain_acked);
    if let Some(d) = wanted.duration {
        update = update.set_message_retention_duration(wkt_duration(d));
    }
    admin
        .update_subscription()
        .set_subscription(update)
        .set_update_mask(FieldMask::default().set_paths(["retain_acked_messages", "message_retention_duration"]))
        .send()
        .await
        .map_err(|e| format!("cannot update subscription {name}: {e}"))?;
    Ok(std::iter::once(SetupStep::Updated { name: name.to_string(), changes }).chain(drifted).collect())
}

/// The warning for a route whose dead-letter policy gives up within [`RIDE_OUT`].
fn dead_letters_soon(w: &Wanted<'_>) -> Option<SetupStep> {
    let s = w.setup;
    s.dead_letter_topic.as_ref()?;
    let after = dead_letter_after(s.redelivery_backoff, s.max_delivery_attempts);
    (after < RIDE_OUT).then(|| SetupStep::DeadLettersSoon {
        name: w.name.to_string(),
        attempts: s.max_delivery_attempts,
        backoff: s.redelivery_backoff,
        after,
    })
}

/// What an existing subscription has that its route asks otherwise, among the
/// settings setup gives a subscription it creates: its topic, message ordering,
/// dead-letter policy, filter, exactly-once delivery, redelivery backoff, and how it
/// delivers (pull, or push to which endpoint, with which token, in which format). Each
/// as `field is X, the routing file wants Y`.
fn drift(current: &Subscription, w: &Wanted<'_>) -> Vec<String> {
    let (route, source) = (w.route, w.setup);
    let mut differences = Vec::new();
    if let Some(topic) = source.topic.as_deref().filter(|t| *t != current.topic) {
        differences.push(format!("its topic is {}, the routing file's source.topic is {topic}", current.topic));
    }
    let ordered = route.ordering == Ordering::PerKey;
    if current.enable_message_ordering != ordered {
        differences.push(format!(
            "message ordering is {}, the route's ordering is \"{}\"{}",
            if current.enable_message_ordering { "on" } else { "off" },
            if ordered { "per-key" } else { "none" },
            if ordered {
                " (Inlet still delivers in inbox order; Pub/Sub may hand it a key's messages out of order)"
            } else {
                ""
            }
        ));
    }
    let has = current.dead_letter_policy.as_ref().filter(|p| !p.dead_letter_topic.is_empty());
    match (has, source.dead_letter_topic.as_deref()) {
        (None, Some(topic)) => differences
            .push(format!("it has no dead-letter policy, the routing file's source.dead_letter_topic is {topic}")),
        (Some(p), None) => differences.push(format!(
            "it sends to dead-letter topic {} after {} attempts, which the routing file does not set",
            p.dead_letter_topic, p.max_delivery_attempts
        )),
        (Some(p), Some(topic))
            if p.dead_letter_topic != topic || p.max_delivery_attempts != source.max_delivery_attempts as i32 =>
        {
            differences.push(format!(
                "it sends to dead-letter topic {} after {} attempts, the routing file says {topic} after {}",
                p.dead_letter_topic, p.max_delivery_attempts, source.max_delivery_attempts
            ))
        }
        _ => {}
    }
    if let Some(filter) = source.filter.as_deref().filter(|f| *f != current.filter) {
        let has = if current.filter.is_empty() {
            "it has no filter".to_string()
        } else {
            format!("its filter is {}", current.filter)
        };
        differences.push(format!("{has}, the routing file's source.filter is {filter}"));
    } else if source.filter.is_none() && !current.filter.is_empty() {
        differences.push(format!(
            "its filter is {}, which the routing file does not set (messages it does not match never reach Inlet)",
            current.filter
        ));
    }
    if current.enable_exactly_once_delivery != w.exactly_once {
        differences.push(format!(
            "exactly-once delivery is {}, the routing file's source.exactly_once is {}",
            if current.enable_exactly_once_delivery { "on" } else { "off" },
            w.exactly_once
        ));
    }
    let backoff = current.retry_policy.as_ref().map(|p| {
        let get = |d: Option<&google_cloud_wkt::Duration>, default: Duration| {
            d.and_then(|d| Duration::try_from(*d).ok()).unwrap_or(default)
        };
        // Pub/Sub's defaults for a policy that leaves one out: 10s and 600s.
        (
            get(p.minimum_backoff.as_ref(), Duration::from_secs(10)),
            get(p.maximum_backoff.as_ref(), Duration::from_secs(600)),
        )
    });
    let wanted = source.redelivery_backoff;
    match backoff {
        None => differences.push(format!(
            "it has no retry policy (Pub/Sub redelivers a nacked message at once), the routing file's \
             source.redelivery_backoff is {} to {}",
            short_duration(wanted.0),
            short_duration(wanted.1)
        )),
        Some(has) if has != wanted => differences.push(format!(
            "its redelivery backoff is {} to {}, the routing file's source.redelivery_backoff is {} to {}",
            short_duration(has.0),
            short_duration(has.1),
            short_duration(wanted.0),
            short_duration(wanted.1)
        )),
        Some(_) => {}
    }
    differences.extend(push_drift(current.push_config.as_ref(), w.push.as_ref()));
    differences
}

/// How an existing subscription delivers, against how its route takes messages: pull
/// or push, and for push the endpoint, the OIDC token and the wrapper.
fn push_drift(current: Option<&PushConfig>, wanted: Option<&PushWanted<'_>>) -> Vec<String> {
    let current = current.filter(|c| !c.push_endpoint.is_empty());
    let Some(wanted) = wanted else {
        return current
            .map(|c| format!("it pushes to {}, the route pulls (a pull source)", c.push_endpoint))
            .into_iter()
            .collect();
    };
    let Some(current) = current else {
        return vec![format!("it is a pull subscription, the route's source.endpoint is {}", wanted.endpoint)];
    };
    let mut differences = Vec::new();
    if current.push_endpoint != wanted.endpoint {
        differences.push(format!(
            "it pushes to {}, the routing file's source.endpoint is {}",
            current.push_endpoint, wanted.endpoint
        ));
    }
    let token = current.oidc_token().map(|t| (t.service_account_email.as_str(), t.audience.as_str()));
    let show = |t: Option<(&str, &str)>| match t {
        Some((account, audience)) => format!("an OIDC token of {account} for audience {audience}"),
        None => "no token".to_string(),
    };
    if token != wanted.oidc {
        differences.push(format!("it sends {}, the route's auth expects {}", show(token), show(wanted.oidc)));
    }
    let format = |unwrapped: bool, metadata: bool| match (unwrapped, metadata) {
        (false, _) => "the JSON envelope (wrapped)",
        (true, true) => "the data unwrapped, with metadata headers",
        (true, false) => "the data unwrapped, without metadata headers",
    };
    let has = current.no_wrapper().map(|n| n.write_metadata);
    if (has.is_some(), has.unwrap_or(false)) != (wanted.unwrapped, wanted.unwrapped) {
        differences.push(format!(
            "it sends {}, the route takes {}",
            format(has.is_some(), has.unwrap_or(false)),
            format(wanted.unwrapped, wanted.unwrapped)
        ));
    }
    differences
}

fn wkt_duration(d: Duration) -> google_cloud_wkt::Duration {
    google_cloud_wkt::Duration::clamp(d.as_secs() as i64, d.subsec_nanos() as i32)
}

/// What `inlet pubsub seek` did to one subscription.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Seeked {
    pub subscription: String,
    /// The time sought, as RFC 3339 with milliseconds.
    pub to: String,
    /// Part of the way back is older than the subscription keeps messages: what was
    /// published before this time is gone from Pub/Sub.
    pub retained_since: Option<String>,
}

impl std::fmt::Display for Seeked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seeked subscription {} to {}: what was published from then on is delivered again, anything earlier counts as acked",
            self.subscription, self.to
        )?;
        if let Some(since) = &self.retained_since {
            write!(f, " (it keeps messages only since {since}: what was published before that is not coming back)")?;
        }
        Ok(())
    }
}

/// Seeks `subscription` back to `to` (Pub/Sub's Seek to a time): the retained
/// messages published from `to` on are marked unacked, so they are delivered again,
/// and every message published before it is marked acked. Refused for a time in the
/// future (it would ack everything pending) and for a subscription that does not
/// retain acked messages (a seek back there only acks, it brings nothing back).
pub async fn seek(admin: &SubscriptionAdmin, subscription: &str, to: SystemTime) -> Result<Seeked, String> {
    let now = SystemTime::now();
    if to > now {
        return Err(format!(
            "{} is in the future: a seek there would mark every pending message of {subscription} acked",
            rfc3339(to)
        ));
    }
    let current = admin
        .get_subscription()
        .set_subscription(subscription)
        .send()
        .await
        .map_err(|e| format!("cannot read subscription {subscription}: {e}"))?;
    let has = Retention::of(&current);
    if !has.retain_acked {
        return Err(format!(
            "subscription {subscription} does not retain acked messages, so a seek back brings nothing back (and \
             acks what was published before {}): set `retain_acked` on its route and run `inlet pubsub setup`",
            rfc3339(to)
        ));
    }
    let kept = has.duration.unwrap_or(Duration::from_secs(7 * 86_400));
    let retained_since = (now.duration_since(to).unwrap_or_default() > kept).then(|| rfc3339(now - kept));
    let time = google_cloud_wkt::Timestamp::try_from(to).map_err(|e| format!("cannot seek to {}: {e}", rfc3339(to)))?;
    admin
        .seek()
        .set_subscription(subscription)
        .set_time(time)
        .send()
        .await
        .map_err(|e| format!("cannot seek subscription {subscription}: {e}"))?;
    Ok(Seeked { subscription: subscription.to_string(), to: rfc3339(to), retained_since })
}

/// A time as `inlet pubsub seek --to` takes it: RFC 3339 with any offset, e.g.
/// `2026-08-01T10:00:00.412Z` (what `inlet inbox backup` prints).
pub fn parse_time(s: &str) -> Result<SystemTime, String> {
    let ts = google_cloud_wkt::Timestamp::try_from(s)
        .map_err(|_| format!("`{s}` is not an RFC 3339 time such as 2026-08-01T10:00:00.412Z"))?;
    SystemTime::try_from(ts).map_err(|e| format!("`{s}`: {e}"))
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_shown_in_their_largest_whole_unit() {
        let shown: Vec<String> =
            [600, 5400, 3600, 7 * 86_400, 90_061].map(|s| short_duration(Duration::from_secs(s))).into();
        assert_eq!(shown, ["10m", "90m", "1h", "7d", "90061s"]);
    }

    #[test]
    fn a_retention_change_names_only_the_fields_that_change() {
        let none = Retention { retain_acked: false, duration: None };
        let hour = Retention::acked_for(Duration::from_secs(3600));
        assert_eq!(
            none.changes(&hour),
            ["retain_acked_messages false → true", "message_retention_duration unset (7d) → 1h"]
        );
        let week = Retention { retain_acked: false, duration: Some(Duration::from_secs(7 * 86_400)) };
        assert_eq!(
            week.changes(&Retention::acked_for(Duration::from_secs(7 * 86_400))),
            ["retain_acked_messages false → true"]
        );
        assert!(hour.changes(&hour).is_empty());
    }

    /// The figures docs/pubsub.md quotes for the outage a dead-letter policy rides out.
    #[test]
    fn a_dead_letter_policy_gives_up_after_the_waits_between_its_attempts() {
        let s = Duration::from_secs;
        assert_eq!(dead_letter_after((s(1), s(60)), 5), s(15), "1 + 2 + 4 + 8");
        assert_eq!(dead_letter_after((s(1), s(60)), 10), s(243), "1 + … + 32 + 3 × 60");
        assert_eq!(dead_letter_after((s(10), s(600)), 20), s(8_430), "10 + … + 320 + 13 × 600");
        assert_eq!(dead_letter_after((s(10), s(600)), 100), s(56_430));
        assert_eq!(dead_letter_after((s(0), s(600)), 100), s(0), "no backoff: redelivered at once");
        assert_eq!(dead_letter_after((s(600), s(600)), 1), s(0), "one attempt: no wait");
    }

    #[test]
    fn seek_times_are_rfc3339_with_any_offset() {
        let utc = parse_time("2026-08-01T10:00:00.412Z").unwrap();
        assert_eq!(parse_time("2026-08-01T12:00:00.412+02:00").unwrap(), utc);
        assert_eq!(rfc3339(utc), "2026-08-01T10:00:00.412Z");
        assert!(parse_time("2026-08-01 10:00").unwrap_err().contains("RFC 3339"));
    }
}
