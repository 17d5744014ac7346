//! Google Pub/Sub clients for the pull source, the publish target and
//! `inlet pubsub setup`: where to connect and with which credentials.
//!
//! The `google-cloud-pubsub` crate does not read `PUBSUB_EMULATOR_HOST`, so Inlet
//! does: with it set, every client goes to `http://HOST` (the crate needs the
//! scheme) with anonymous credentials — without them the crate looks for the GCE
//! metadata server and each call fails only after a minute of retries. Without it,
//! clients go to Google with Application Default Credentials.

use std::time::Duration;

use google_cloud_auth::credentials::Credentials;
use google_cloud_auth::credentials::anonymous::Builder as Anonymous;
use google_cloud_gax::error::rpc::Code;
use google_cloud_gax::options::RequestOptionsBuilder as _;
use google_cloud_gax::retry_policy::NeverRetry;
use google_cloud_pubsub::client::{Publisher, Subscriber, SubscriptionAdmin, TopicAdmin};
use google_cloud_pubsub::model::{DeadLetterPolicy, RetryPolicy as SubscriptionRetry};

use crate::config::{Config, Ordering, SourceConfig, TargetConfig};

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

/// One line of what `inlet pubsub setup` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupStep {
    Created { kind: &'static str, name: String },
    Exists { kind: &'static str, name: String },
}

impl std::fmt::Display for SetupStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupStep::Created { kind, name } => write!(f, "created {kind} {name}"),
            SetupStep::Exists { kind, name } => write!(f, "{kind} {name} exists"),
        }
    }
}

/// Creates the topics and subscriptions a routing file names, where missing:
/// every pubsub target's topic; for every pubsub source its topic, dead-letter
/// topic and subscription (ordered when the route is, with a retry policy and the
/// dead-letter policy when one is configured). Existing ones are left as they are.
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
    for route in &config.routes {
        if let TargetConfig::Pubsub(t) = &route.target {
            ensure_topic(&t.topic, &mut steps).await?;
        }
        let SourceConfig::Pubsub(s) = &route.source else { continue };
        let Some(topic) = &s.topic else {
            // Without a topic the subscription cannot be created; it must exist.
            let probe = probe(&subscriptions, &s.subscription, Duration::from_secs(30)).await;
            match probe {
                Probe::Reachable => {
                    steps.push(SetupStep::Exists { kind: "subscription", name: s.subscription.clone() })
                }
                Probe::NotFound => {
                    return Err(format!(
                        "route {}: subscription {} does not exist and source.topic is not set, so it cannot be created",
                        route.name, s.subscription
                    ));
                }
                Probe::Unreachable(e) => return Err(format!("Pub/Sub is unreachable: {e}")),
            }
            continue;
        };
        ensure_topic(topic, &mut steps).await?;
        let mut create = subscriptions
            .create_subscription()
            .set_name(&s.subscription)
            .set_topic(topic)
            .set_ack_deadline_seconds(s.lease_extension.as_secs().clamp(10, 600) as i32)
            .set_enable_message_ordering(route.ordering == Ordering::PerKey)
            .set_retry_policy(
                SubscriptionRetry::new()
                    .set_minimum_backoff(google_cloud_wkt::Duration::clamp(1, 0))
                    .set_maximum_backoff(google_cloud_wkt::Duration::clamp(60, 0)),
            );
        if let Some(dlq) = &s.dead_letter_topic {
            ensure_topic(dlq, &mut steps).await?;
            create = create.set_dead_letter_policy(
                DeadLetterPolicy::new()
                    .set_dead_letter_topic(dlq)
                    .set_max_delivery_attempts(s.max_delivery_attempts as i32),
            );
        }
        match create.send().await {
            Ok(_) => steps.push(SetupStep::Created { kind: "subscription", name: s.subscription.clone() }),
            Err(e) if is_code(&e, Code::AlreadyExists) => {
                steps.push(SetupStep::Exists { kind: "subscription", name: s.subscription.clone() })
            }
            Err(e) => return Err(format!("cannot create subscription {}: {e}", s.subscription)),
        }
    }
    Ok(steps)
}
