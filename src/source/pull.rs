//! Pub/Sub streaming pull: the production source.
//!
//! One puller per route runs sessions. A session is one streaming-pull stream and
//! two tasks joined by a bounded channel:
//!
//! - the reader takes messages from the stream while fewer than
//!   `max_outstanding_messages` (and `max_outstanding_bytes`) are held — Inlet's
//!   own flow control, because the emulator ignores the broker-side one;
//! - the writer groups what has arrived into batches (up to `batch_size`, waiting at
//!   most `batch_wait` after the first message), stores each batch in ONE inbox
//!   transaction through [`Ingest::accept_batch`], and only then acks the batch. If
//!   the store fails it nacks the batch and ends the session, so nothing received
//!   after a failed batch can be committed ahead of it (per-key order survives).
//!
//! The client extends the lease of every held message by itself. A session ends on
//! a store failure, a stream error, or when the broker is unreachable: the stream
//! itself just hangs while the server is down, so when no message has come for a
//! probe period the subscription is looked up, and two unanswered probes in a row
//! end the session; the puller then waits
//! with a growing, jittered backoff — for a store failure, until the store answers —
//! and opens a new session. Messages held by a dying session are nacked (a dropped
//! handler nacks too), so the broker redelivers them; rows already committed
//! absorb the redelivery through the dedup key.
//!
//! Shutdown: stop reading, let the writer finish the batch it is storing and ack
//! it, nack everything else, then wait (bounded) for the client to flush acks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use google_cloud_pubsub::client::{Subscriber, SubscriptionAdmin};
use google_cloud_pubsub::error::AckError;
use google_cloud_pubsub::model::Message;
use google_cloud_pubsub::subscriber::ShutdownBehavior;
use google_cloud_pubsub::subscriber::handler::Handler;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

use super::ack_journal::AckJournal;
use crate::config::PubsubSource;
use crate::ingest::{Incoming, Ingest, IngestError};
use crate::pubsub_client::{Connection, Probe, probe};
use crate::routing::Route;
use crate::telemetry::{Metrics, RouteReason};

/// How often the broker is probed while a session runs.
const PROBE_EVERY: Duration = Duration::from_secs(3);
/// How long a probe may take before it counts as unanswered.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Unanswered probes in a row (with no message meanwhile) that end a session.
const PROBES_BEFORE_UNREACHABLE: u32 = 2;
/// Longest wait between sessions.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long shutdown waits for the client to flush acks and nacks.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Puller {
    /// The routes that read the subscription: one, or several that each `select`
    /// their messages.
    pub routes: Arc<RouteSet>,
    /// The first route's source: every route of the subscription has the same
    /// settings (the routing file's check), all but `select`.
    pub config: PubsubSource,
    pub connection: Connection,
    pub ingest: Arc<Ingest>,
    pub metrics: Arc<Metrics>,
    /// Where acks are recorded, when asked for (see [`super::ack_journal`]).
    pub ack_journal: Option<Arc<AckJournal>>,
}

/// The routes one subscription feeds, by route name. A reload that changes them but
/// not the subscription's settings puts the new ones here, and the next batch is split
/// among them: the stream stays open (reopening it would hand every message it holds
/// back to the broker).
pub struct RouteSet {
    /// The route that names the source in logs and metrics: the subscription's first
    /// route by name when the puller started.
    name: String,
    routes: std::sync::RwLock<Vec<Arc<Route>>>,
}

impl RouteSet {
    /// The set of `routes`, named after the first.
    pub fn new(routes: Vec<Arc<Route>>) -> Arc<RouteSet> {
        let name = routes.first().map(|r| r.name().to_string()).unwrap_or_default();
        Arc::new(RouteSet { name, routes: std::sync::RwLock::new(routes) })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The routes as they are now.
    pub fn now(&self) -> Vec<Arc<Route>> {
        self.routes.read().expect("route set lock").clone()
    }

    pub fn set(&self, routes: Vec<Arc<Route>>) {
        *self.routes.write().expect("route set lock") = routes;
    }
}

/// Why a session ended.
enum End {
    /// Shutdown was asked for.
    Stopped,
    /// A batch could not be stored: the inbox refused it, or a plugin could not
    /// decode one of its messages in time.
    Store(IngestError),
    /// The writer task died (a bug: it panicked).
    Writer(String),
    /// The stream reported a permanent error or ended.
    Stream(String),
    /// The broker did not answer a probe.
    Unreachable(String),
    /// The subscription is gone.
    NotFound,
    /// A client could not be built.
    Client(String),
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::Stopped => f.write_str("stopped"),
            End::Store(e) => write!(f, "a batch could not be stored: {e}"),
            End::Writer(e) => write!(f, "the writer task failed: {e}"),
            End::Stream(e) => write!(f, "stream error: {e}"),
            End::Unreachable(e) => write!(f, "Pub/Sub unreachable: {e}"),
            End::NotFound => f.write_str("subscription not found"),
            End::Client(e) => f.write_str(e),
        }
    }
}

impl End {
    fn reason(&self) -> &'static str {
        match self {
            End::Stopped => "stopped",
            End::Store(_) => "store",
            End::Writer(_) => "writer",
            End::Stream(_) => "stream",
            End::Unreachable(_) => "unreachable",
            End::NotFound => "not_found",
            End::Client(_) => "client",
        }
    }
}

/// A message received and not yet acked or nacked; the permits are its share of
/// the flow-control budget, given back when it is dropped.
struct Held {
    incoming: Incoming,
    handler: Handler,
    permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

impl Puller {
    fn name(&self) -> &str {
        self.routes.name()
    }

    /// Runs sessions until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let route = self.name().to_string();
        let connected = self.metrics.pubsub_connected.get_or_create(&Metrics::route(&route)).clone();
        let mut failures: u32 = 0;
        let mut admin: Option<SubscriptionAdmin> = None;
        tracing::info!(route, subscription = %self.config.subscription, pubsub = self.connection.describe(), "pubsub source starting");
        loop {
            if *stop.borrow() {
                break;
            }
            let started = Instant::now();
            let end = match admin.as_ref() {
                Some(a) => self.session(a, &mut stop).await,
                None => match self.connection.subscription_admin().await {
                    Ok(a) => self.session(admin.insert(a), &mut stop).await,
                    Err(e) => End::Client(e),
                },
            };
            connected.set(0);
            if matches!(end, End::Stopped) {
                break;
            }
            // A session that ran a while was healthy: start the backoff over.
            if started.elapsed() > Duration::from_secs(60) {
                failures = 0;
            }
            failures += 1;
            self.metrics.pubsub_reconnects.get_or_create(&Metrics::outcome(&route, end.reason())).inc();
            let delay = backoff(failures);
            match &end {
                End::Store(error) => {
                    tracing::error!(route, %error, retry_in = ?delay, "pubsub source paused: a batch could not be stored (nacked)")
                }
                End::NotFound => tracing::error!(
                    route,
                    subscription = %self.config.subscription,
                    retry_in = ?delay,
                    "pubsub subscription not found; create it (inlet pubsub setup) — retrying"
                ),
                other => tracing::warn!(route, error = %other, retry_in = ?delay, "pubsub stream lost; reconnecting"),
            }
            if !pause(delay, &mut stop).await {
                break;
            }
            if matches!(end, End::Store(_)) && !self.wait_for_store(&mut stop).await {
                break;
            }
        }
        connected.set(0);
        tracing::info!(route, "pubsub source stopped");
    }

    /// After a store failure, probes the store until it answers (so the broker is
    /// not asked for messages that would only be nacked again). False on shutdown.
    async fn wait_for_store(&self, stop: &mut watch::Receiver<bool>) -> bool {
        let mut attempt = 0;
        loop {
            match self.ingest.store.db_now().await {
                Ok(_) => return true,
                Err(error) => {
                    attempt += 1;
                    tracing::debug!(route = self.name(), %error, "inbox still unreachable");
                    if !pause(backoff(attempt), stop).await {
                        return false;
                    }
                }
            }
        }
    }

    async fn session(&self, admin: &SubscriptionAdmin, stop: &mut watch::Receiver<bool>) -> End {
        let subscriber: Subscriber = match self.connection.subscriber().await {
            Ok(s) => s,
            Err(e) => return End::Client(e),
        };
        let cfg = &self.config;
        let mut stream = subscriber
            .subscribe(&cfg.subscription)
            .set_max_lease_extension(cfg.lease_extension)
            .set_max_outstanding_messages(cfg.max_outstanding_messages as i64)
            .set_max_outstanding_bytes(cfg.max_outstanding_bytes as i64)
            // Acks of the batch being stored are still taken after shutdown starts.
            .set_shutdown_behavior(ShutdownBehavior::WaitForProcessing)
            .build();
        let token = stream.shutdown_token();

        let messages = Arc::new(Semaphore::new(cfg.max_outstanding_messages));
        let bytes = Arc::new(Semaphore::new(cfg.max_outstanding_bytes));
        let (tx, rx) = mpsc::channel::<Held>(cfg.max_outstanding_messages);
        let stopping = Arc::new(AtomicBool::new(false));
        let mut writer = tokio::spawn(write(
            Arc::clone(&self.routes),
            Arc::clone(&self.ingest),
            Arc::clone(&self.metrics),
            cfg.clone(),
            rx,
            Arc::clone(&stopping),
            self.ack_journal.clone(),
        ));
        let route = self.name();
        let connected = self.metrics.pubsub_connected.get_or_create(&Metrics::route(route)).clone();
        let outstanding = self.metrics.pubsub_outstanding.get_or_create(&Metrics::route(route)).clone();
        let received = self.metrics.pubsub_received.get_or_create(&Metrics::route(route)).clone();
        // With a dead-letter policy, the attempt from which a message counts as near it.
        let near_dead_letter = self.metrics.pubsub_near_dead_letter.get_or_create(&Metrics::route(route)).clone();
        let near_from =
            cfg.setup.dead_letter_topic.as_ref().map(|_| cfg.setup.max_delivery_attempts.div_ceil(2) as i32);
        let mut probe_tick = tokio::time::interval(PROBE_EVERY);
        probe_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut writer_joined = false;
        let mut delivered_since_tick = false;
        let mut unanswered = 0;

        let end = 'session: loop {
            outstanding.set((cfg.max_outstanding_messages - messages.available_permits()) as i64);
            // Flow control first: no message is asked for while the budget is spent.
            let message_permit = tokio::select! {
                biased;
                _ = stopped(stop) => break 'session End::Stopped,
                r = &mut writer => { writer_joined = true; break 'session writer_end(r) }
                p = Arc::clone(&messages).acquire_owned() => p.expect("semaphore never closed"),
            };
            let item = tokio::select! {
                biased;
                _ = stopped(stop) => break 'session End::Stopped,
                r = &mut writer => { writer_joined = true; break 'session writer_end(r) }
                _ = probe_tick.tick() => {
                    // Messages since the last tick prove the stream works: no probe.
                    if std::mem::take(&mut delivered_since_tick) {
                        unanswered = 0;
                        continue 'session;
                    }
                    match probe(admin, &cfg.subscription, PROBE_TIMEOUT).await {
                        Probe::Reachable => { unanswered = 0; connected.set(1); continue 'session }
                        Probe::NotFound => break 'session End::NotFound,
                        // One slow answer on a busy machine is no reason to drop a
                        // stream and every message it holds: wait for a second.
                        Probe::Unreachable(e) => {
                            unanswered += 1;
                            if unanswered >= PROBES_BEFORE_UNREACHABLE {
                                break 'session End::Unreachable(e);
                            }
                            tracing::debug!(route, error = %e, "pubsub probe got no answer");
                            continue 'session;
                        }
                    }
                }
                item = stream.next() => item,
            };
            let (message, handler) = match item {
                Some(Ok(pair)) => pair,
                Some(Err(e)) if crate::pubsub_client::is_code(&e, google_cloud_gax::error::rpc::Code::NotFound) => {
                    break 'session End::NotFound;
                }
                Some(Err(e)) => break 'session End::Stream(e.to_string()),
                None => break 'session End::Stream("the stream ended".into()),
            };
            connected.set(1);
            received.inc();
            if near_from.is_some_and(|from| handler.delivery_attempt().is_some_and(|a| a >= from)) {
                near_dead_letter.inc();
            }
            delivered_since_tick = true;
            // A message larger than the whole byte budget takes all of it.
            let size = message.data.len().clamp(1, cfg.max_outstanding_bytes.min(u32::MAX as usize)) as u32;
            let bytes_permit = tokio::select! {
                biased;
                _ = stopped(stop) => { drop(handler); break 'session End::Stopped }
                p = Arc::clone(&bytes).acquire_many_owned(size) => p.expect("semaphore never closed"),
            };
            let held = Held {
                incoming: incoming(message, handler.delivery_attempt()),
                handler,
                permits: (message_permit, bytes_permit),
            };
            if tx.send(held).await.is_err() {
                // The writer is gone; its result says why.
                writer_joined = true;
                break 'session writer_end((&mut writer).await);
            }
        };

        // Whatever ended the session: close the stream first, so the broker stops
        // sending while the rest is settled. The client keeps taking acks and nacks
        // for the handlers Inlet holds until the token's shutdown completes.
        drop(stream);
        // The writer stores the batch it holds and acks it, nacks what is queued, ends.
        stopping.store(true, AtomicOrdering::SeqCst);
        drop(tx);
        if !writer_joined && let Err(e) = writer.await {
            tracing::error!(route, error = %e, "pubsub writer task failed");
        }
        outstanding.set(0);
        // Let the client send the acks and nacks it holds.
        if tokio::time::timeout(FLUSH_TIMEOUT, token.shutdown()).await.is_err() {
            tracing::warn!(
                route,
                "pubsub client did not flush acks within {FLUSH_TIMEOUT:?}; unflushed messages will be redelivered"
            );
        }
        end
    }
}

fn writer_end(r: Result<Result<(), IngestError>, tokio::task::JoinError>) -> End {
    match r {
        Ok(Err(e)) => End::Store(e),
        Ok(Ok(())) => End::Writer("the writer ended early".into()),
        Err(e) => End::Writer(e.to_string()),
    }
}

/// The writer: batches, stores, then acks; on a store failure nacks and returns it.
/// A batch is split among the subscription's routes by their `select`; each route's
/// share is stored in one transaction, and the batch is acked once every share is
/// stored. A message no route selects is nacked at once.
async fn write(
    routes: Arc<RouteSet>,
    ingest: Arc<Ingest>,
    metrics: Arc<Metrics>,
    cfg: PubsubSource,
    mut rx: mpsc::Receiver<Held>,
    stopping: Arc<AtomicBool>,
    journal: Option<Arc<AckJournal>>,
) -> Result<(), IngestError> {
    let name = routes.name().to_string();
    let acked = metrics.pubsub_acks.get_or_create(&Metrics::outcome(&name, "acked")).clone();
    let nacked = metrics.pubsub_acks.get_or_create(&Metrics::outcome(&name, "nacked")).clone();
    let unrouted = metrics.pubsub_unrouted.get_or_create(&Metrics::route(&name)).clone();
    let batch_sizes = metrics.pubsub_batch_size.get_or_create(&Metrics::route(&name)).clone();
    let mut unrouted_log = Throttle::new(UNROUTED_LOG_EVERY);
    loop {
        let Some(first) = rx.recv().await else { return Ok(()) };
        if stopping.load(AtomicOrdering::SeqCst) {
            // Shutting down: what was not being stored yet goes back to the broker.
            let mut n = 1;
            first.handler.nack();
            while let Ok(h) = rx.try_recv() {
                h.handler.nack();
                n += 1;
            }
            nacked.inc_by(n);
            tracing::info!(route = name, nacked = n, "pubsub source stopping; nacked messages not yet stored");
            continue;
        }
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + cfg.batch_wait;
        while batch.len() < cfg.batch_size {
            match rx.try_recv() {
                Ok(h) => batch.push(h),
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(h)) => batch.push(h),
                    Ok(None) | Err(_) => break,
                },
            }
        }
        batch_sizes.observe(batch.len() as f64);
        // Each route's share, in arrival order; what no route takes goes back.
        let now = routes.now();
        let mut shares: Vec<Vec<Incoming>> = vec![Vec::new(); now.len()];
        let mut handlers = Vec::with_capacity(batch.len());
        for h in batch {
            match pick(&now, &h.incoming.attributes) {
                Some(i) => {
                    shares[i].push(h.incoming);
                    // The permits stay with the handlers until the ack or nack.
                    handlers.push((h.handler, h.permits));
                }
                None => {
                    unrouted.inc();
                    nacked.inc();
                    // One line per UNROUTED_LOG_EVERY at most, however many come: a
                    // busy topic with a new type would otherwise flood the log.
                    if let Some(also) = unrouted_log.due(Instant::now()) {
                        tracing::warn!(
                            route = name,
                            subscription = %cfg.subscription,
                            message_id = %crate::rules::storable(&h.incoming.message_id, 200),
                            selected_by = %selected_by(&now, &h.incoming.attributes),
                            also_unrouted_since_last_line = also,
                            "no route of the subscription selects this message; nacked (it comes again)"
                        );
                    }
                    h.handler.nack();
                }
            }
        }
        if handlers.is_empty() {
            continue;
        }
        let ids: Vec<String> = match &journal {
            Some(_) => shares.iter().flatten().map(|m| m.message_id.clone()).collect(),
            None => Vec::new(),
        };
        let mut stored = Ok(());
        for (route, share) in now.iter().zip(shares) {
            if share.is_empty() {
                continue;
            }
            if let Err(error) = ingest.accept_batch(route, share).await {
                stored = Err(error);
                break;
            }
        }
        match stored {
            Ok(()) => {
                // Strictly after the commit.
                if let Some(journal) = &journal
                    && let Err(e) = journal.record(&name, ids.iter().map(String::as_str))
                {
                    // Not acked what could not be recorded: the rows are there, the
                    // redelivery is absorbed as a duplicate.
                    tracing::error!(route = name, journal = %journal.path().display(), error = %e, "cannot write the ack journal; nacking the batch");
                    nacked.inc_by(handlers.len() as u64);
                    for (h, _permits) in handlers {
                        h.nack();
                    }
                    continue;
                }
                acked.inc_by(handlers.len() as u64);
                for (h, permits) in handlers {
                    match h {
                        // An exactly-once subscription answers each ack, and may refuse
                        // it (a lease that expired, an ack id that a redelivery replaced):
                        // the message then comes again, and the inbox takes it as the
                        // duplicate it is. The flow-control permits wait for the answer.
                        Handler::ExactlyOnce(h) => {
                            let (metrics, name) = (Arc::clone(&metrics), name.clone());
                            tokio::spawn(async move {
                                let answer = h.confirmed_ack().await;
                                drop(permits);
                                if let Err(error) = answer {
                                    count_refused_ack(&metrics, &name, &error);
                                }
                            });
                        }
                        other => other.ack(),
                    }
                }
            }
            Err(error) => {
                // Shares already stored come again and are taken as duplicates.
                nacked.inc_by(handlers.len() as u64);
                for (h, _permits) in handlers {
                    h.nack();
                }
                // Everything queued behind the failed batch is nacked too (dropping
                // the receiver drops their handlers), so nothing overtakes it.
                let mut rest = 0;
                while let Ok(h) = rx.try_recv() {
                    h.handler.nack();
                    rest += 1;
                }
                nacked.inc_by(rest);
                return Err(error);
            }
        }
    }
}

/// How often an unrouted message is logged, at most (each is counted).
const UNROUTED_LOG_EVERY: Duration = Duration::from_secs(10);

/// At most one event per period; says how many were passed over since the last.
struct Throttle {
    every: Duration,
    last: Option<Instant>,
    skipped: u64,
}

impl Throttle {
    fn new(every: Duration) -> Throttle {
        Throttle { every, last: None, skipped: 0 }
    }

    /// `Some(passed over since the last one)` when an event at `now` is due.
    fn due(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|last| now.duration_since(last) < self.every) {
            self.skipped += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.skipped))
    }
}

/// The attributes the routes select by, as the message has them (`type="x"`), or
/// `none`: what a log line about an unrouted message shows.
fn selected_by(routes: &[Arc<Route>], attributes: &[(String, String)]) -> String {
    let names: Vec<&str> = routes.iter().filter_map(|r| Some(r.config.source.select()?.attribute.as_str())).collect();
    let shown: Vec<String> = attributes
        .iter()
        .filter(|(k, _)| names.contains(&k.as_str()))
        .map(|(k, v)| format!("{}={:?}", crate::rules::storable(k, 100), crate::rules::storable(v, 100)))
        .collect();
    if shown.is_empty() { "none".to_string() } else { shown.join(" ") }
}

/// The route that takes a message with these attributes: the one whose `select`
/// matches (routes of one subscription select other values of one attribute), or the
/// only route, when it selects nothing.
fn pick(routes: &[Arc<Route>], attributes: &[(String, String)]) -> Option<usize> {
    // Every route of a set pulls (`shared.rs` groups pull routes only).
    routes.iter().position(|r| r.config.source.select().is_none_or(|sel| sel.takes(attributes)))
}

/// Counts and logs an ack an exactly-once subscription refused, by reason.
fn count_refused_ack(metrics: &Metrics, route: &str, error: &AckError) {
    let reason = ack_refusal_reason(error);
    metrics.pubsub_acks_refused.get_or_create(&RouteReason { route: route.to_string(), reason }).inc();
    tracing::warn!(route, reason, %error, "the subscription refused an ack; the message will come again and be taken as a duplicate");
}

/// The label of a refused ack (`inlet_pubsub_acks_refused_total{reason}`).
fn ack_refusal_reason(error: &AckError) -> &'static str {
    match error {
        AckError::LeaseExpired => "lease_expired",
        AckError::Rpc { .. } => "rpc",
        AckError::ShutdownBeforeAck => "shutdown_before_ack",
        AckError::Shutdown(_) => "shutdown",
        _ => "other",
    }
}

/// The message in Inlet's terms.
fn incoming(m: Message, delivery_attempt: Option<i32>) -> Incoming {
    let publish_time =
        m.publish_time.as_ref().and_then(|t| serde_json::to_value(t).ok()).and_then(|v| v.as_str().map(str::to_string));
    let mut attributes: Vec<(String, String)> = m.attributes.into_iter().collect();
    attributes.sort();
    if !m.ordering_key.is_empty() {
        attributes.push(("ordering_key".into(), m.ordering_key));
    }
    Incoming {
        data: m.data.to_vec(),
        attributes,
        message_id: m.message_id,
        publish_time,
        delivery_attempt: delivery_attempt.and_then(|a| u32::try_from(a).ok()),
    }
}

/// 1 s, 2 s, 4 s … capped at [`MAX_BACKOFF`], spread ±20 %.
fn backoff(failures: u32) -> Duration {
    let base = Duration::from_secs(1).saturating_mul(1 << failures.saturating_sub(1).min(10)).min(MAX_BACKOFF);
    base.mul_f64(0.8 + 0.4 * fastrand::f64())
}

/// Resolves when shutdown is asked for (or its sender is gone). Returns nothing,
/// so no borrow of the channel lives on across a `select!`.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Sleeps `d` unless shutdown comes first; false if it did.
async fn pause(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = stopped(stop) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_ack_is_counted_by_its_reason() {
        let metrics = Metrics::new();
        let shutdown = AckError::Shutdown(Box::new(std::io::Error::other("the stream closed")));
        for error in [AckError::LeaseExpired, AckError::LeaseExpired, AckError::ShutdownBeforeAck, shutdown] {
            count_refused_ack(&metrics, "orders", &error);
        }
        let count =
            |reason| metrics.pubsub_acks_refused.get_or_create(&RouteReason { route: "orders".into(), reason }).get();
        assert_eq!(count("lease_expired"), 2);
        assert_eq!(count("shutdown_before_ack"), 1);
        assert_eq!(count("shutdown"), 1);
        assert_eq!(count("rpc"), 0);
        let text = metrics.render();
        assert!(text.contains(r#"inlet_pubsub_acks_refused_total{route="orders",reason="lease_expired"} 2"#), "{text}");
    }

    #[test]
    fn a_throttle_lets_one_event_a_period_through_and_counts_the_rest() {
        let mut t = Throttle::new(Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(t.due(start), Some(0));
        assert_eq!(t.due(start + Duration::from_secs(1)), None);
        assert_eq!(t.due(start + Duration::from_secs(9)), None);
        assert_eq!(t.due(start + Duration::from_secs(10)), Some(2));
        assert_eq!(t.due(start + Duration::from_secs(11)), None);
        assert_eq!(t.due(start + Duration::from_secs(25)), Some(1));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        for n in 1..20 {
            let d = backoff(n);
            let base = Duration::from_secs(1 << (n - 1).min(10)).min(MAX_BACKOFF);
            assert!(d >= base.mul_f64(0.8) && d <= base.mul_f64(1.2), "failure {n}: {d:?} vs {base:?}");
        }
    }

    #[test]
    fn a_message_keeps_its_attributes_ordering_key_and_attempt() {
        let m = Message::new()
            .set_data("payload")
            .set_message_id("42")
            .set_ordering_key("order-7")
            .set_attributes([("b", "2"), ("a", "1")]);
        let i = incoming(m, Some(3));
        assert_eq!(i.data, b"payload");
        assert_eq!(i.message_id, "42");
        assert_eq!(i.delivery_attempt, Some(3));
        assert_eq!(
            i.attributes,
            vec![("a".into(), "1".into()), ("b".into(), "2".into()), ("ordering_key".into(), "order-7".into())]
        );
    }
}
