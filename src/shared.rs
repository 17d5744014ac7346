//! What the running instance's request handlers and background tasks share: the
//! routes serving now and the tasks that serve them (a relay per route, a puller per
//! pulled subscription), the inbox, the receiving half, the routing files as applied. Built by
//! `app::start`; handlers that need less take a part of it (`FromRef`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::FromRef;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::config::{Config, PubsubSource, SourceConfig};
use crate::guesses::Guesses;
use crate::inbox::Store;
use crate::inbox::group::{Group, Settles};
use crate::ingest::Ingest;
use crate::operate::Wake;
use crate::pubsub_client::Connection;
use crate::relay::{Relay, RelayOptions};
use crate::routing::{RouteTable, Routes};
use crate::source::ack_journal::AckJournal;
use crate::source::pull::{Puller, RouteSet};
use crate::source::push::PushState;
use crate::source::push_auth::Verifier;
use crate::telemetry::Metrics;

/// What request handlers and background tasks share.
pub struct Shared {
    pub(crate) routes: Arc<RouteTable>,
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    pub ingest: Arc<Ingest>,
    /// Where Pub/Sub sources pull from.
    pub pubsub: Connection,
    /// Where Pub/Sub sources record their acks, when asked for.
    pub(crate) ack_journal: Option<Arc<AckJournal>>,
    /// Signing keys for push routes that require an OIDC token.
    pub push_verifier: Arc<Verifier>,
    /// Unknown admin tokens by peer (sign-in and API), for the backoff.
    pub guesses: Guesses,
    /// The routing file as last applied, and where it lives.
    pub(crate) config: Mutex<Config>,
    pub(crate) config_seen: Mutex<Seen>,
    pub(crate) relays: Mutex<Relays>,
    pub(crate) relay_options: RelayOptions,
    /// Settles of every relay of this process, committed in groups.
    pub(crate) settles: Arc<Group<Settles>>,
    /// Set once the process is told to stop: `/readyz` answers 503, answers close
    /// their connections.
    pub drain: crate::server::Drain,
}

/// Operator actions in this instance wake the relays as a stored entry does.
impl Wake for Shared {
    fn wake(&self, route: &str) {
        Shared::wake(self, route);
    }

    fn wake_all(&self) {
        self.routes().iter().for_each(|r| Shared::wake(self, r.name()));
    }
}

/// One relay task per route and one puller per pulled subscription, each with its
/// own stop signal, so a reload can stop and start single routes.
#[derive(Default)]
pub(crate) struct Relays {
    running: HashMap<String, (watch::Sender<bool>, JoinHandle<()>)>,
    /// By subscription: its puller.
    pulling: HashMap<String, Pulling>,
    /// By route: its outbox reader.
    outboxes: HashMap<String, Outboxing>,
    /// Relays and pullers told to stop that may still be finishing their work.
    stopping: Vec<JoinHandle<()>>,
}

/// A subscription's puller: what it was started with, the routes it feeds now, and
/// its stop signal.
pub(crate) struct Pulling {
    config: PubsubSource,
    routes: Arc<RouteSet>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// An outbox route's reader: the route and source it was started with, and its
/// stop signal.
pub(crate) struct Outboxing {
    route: Arc<crate::routing::Route>,
    config: crate::config::OutboxSource,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Shared {
    /// The routes as they are now.
    pub fn routes(&self) -> Arc<Routes> {
        self.routes.get()
    }

    /// `route` has entries to claim now: wakes its relay here and announces it to
    /// the other instances on the inbox, so none waits for its poll interval.
    pub fn wake(&self, route: &str) {
        if let Some(r) = self.routes().get(route) {
            r.stored.notify_one();
        }
        self.ingest.announce(route);
    }

    /// Puts a new set of routes in place: relays of routes that are gone or changed
    /// stop claiming (their in-flight attempts finish), relays of `fresh` routes start.
    /// A subscription's puller goes on with the routes it feeds as they are now, and is
    /// started again only when the subscription's settings change (the old one stores
    /// the batch it holds and nacks the rest).
    pub(crate) fn replace_routes(&self, routes: Arc<Routes>, fresh: &[String]) {
        let mut relays = self.relays.lock().expect("relays lock");
        relays.stopping.retain(|h| !h.is_finished());
        let names: Vec<String> = relays.running.keys().cloned().collect();
        for name in names {
            if routes.get(&name).is_none() || fresh.contains(&name) {
                let (stop, handle) = relays.running.remove(&name).expect("listed");
                let _ = stop.send(true);
                relays.stopping.push(handle);
            }
        }
        // The pulled subscriptions and the routes each feeds, by route name.
        let mut feeds: Vec<(String, Vec<Arc<crate::routing::Route>>)> = Vec::new();
        for route in routes.iter() {
            if let SourceConfig::Pubsub(config) = &route.config.source {
                match feeds.iter_mut().find(|(s, _)| *s == config.subscription) {
                    Some((_, members)) => members.push(Arc::clone(route)),
                    None => feeds.push((config.subscription.clone(), vec![Arc::clone(route)])),
                }
            }
        }
        for (subscription, members) in &mut feeds {
            admissible(subscription, members);
        }
        // A puller goes on with the routes of its subscription as they are now, unless
        // its subscription is gone, its settings changed or the route that names it in
        // logs and metrics no longer reads it: then it stops and a new one starts below.
        let subscriptions: Vec<String> = relays.pulling.keys().cloned().collect();
        for subscription in subscriptions {
            let pulling = &relays.pulling[&subscription];
            let now = feeds.iter().find(|(s, _)| *s == subscription).map(|(_, m)| m);
            let goes_on = now.filter(|now| {
                let SourceConfig::Pubsub(config) = &now[0].config.source else { return false };
                now.iter().any(|r| r.name() == pulling.routes.name())
                    && config.same_subscription_settings(&pulling.config)
            });
            match goes_on {
                Some(now) => pulling.routes.set(now.clone()),
                None => {
                    let pulling = relays.pulling.remove(&subscription).expect("listed");
                    let _ = pulling.stop.send(true);
                    relays.stopping.push(pulling.task);
                }
            }
        }
        // An outbox reader goes on while its route is the same; any change starts
        // it again (its lock is let go and taken anew, which costs a poll at most).
        let readers: Vec<String> = relays.outboxes.keys().cloned().collect();
        for name in readers {
            let reader = &relays.outboxes[&name];
            let goes_on = routes.get(&name).is_some_and(|now| {
                Arc::ptr_eq(now, &reader.route)
                    && !fresh.contains(&name)
                    && matches!(&now.config.source, SourceConfig::Outbox(c) if *c == reader.config)
            });
            if !goes_on {
                let reader = relays.outboxes.remove(&name).expect("listed");
                let _ = reader.stop.send(true);
                relays.stopping.push(reader.task);
            }
        }
        self.routes.set(Arc::clone(&routes));
        for route in routes.iter() {
            let pull = matches!(route.config.source, SourceConfig::Pubsub(_));
            self.metrics.register_route(route.name(), pull);
            if !relays.running.contains_key(route.name()) {
                let (stop, stop_rx) = watch::channel(false);
                let relay = Arc::new(Relay::new(
                    Arc::clone(route),
                    Arc::clone(&self.store),
                    Arc::clone(&self.clock),
                    Arc::clone(&self.metrics),
                    self.relay_options.clone(),
                    Some(Arc::clone(&self.settles)),
                ));
                let task = tokio::spawn(async move { relay.run(stop_rx).await });
                relays.running.insert(route.name().to_string(), (stop, task));
            }
        }
        for route in routes.iter() {
            let SourceConfig::Outbox(config) = &route.config.source else { continue };
            if relays.outboxes.contains_key(route.name()) {
                continue;
            }
            self.metrics.register_outbox(route.name());
            let reader = crate::source::outbox::OutboxReader {
                config: config.clone(),
                route: Arc::clone(route),
                ingest: Arc::clone(&self.ingest),
                metrics: Arc::clone(&self.metrics),
            };
            let (stop, stop_rx) = watch::channel(false);
            let task = tokio::spawn(reader.run(stop_rx));
            let started = Outboxing { route: Arc::clone(route), config: config.clone(), stop, task };
            relays.outboxes.insert(route.name().to_string(), started);
        }
        for (subscription, members) in feeds {
            if relays.pulling.contains_key(&subscription) {
                continue;
            }
            let SourceConfig::Pubsub(config) = members[0].config.source.clone() else { unreachable!("a pulled route") };
            let routes = RouteSet::new(members);
            let puller = Puller {
                config: config.clone(),
                routes: Arc::clone(&routes),
                connection: self.pubsub.clone(),
                ingest: Arc::clone(&self.ingest),
                metrics: Arc::clone(&self.metrics),
                ack_journal: self.ack_journal.clone(),
            };
            let (stop, stop_rx) = watch::channel(false);
            let task = tokio::spawn(puller.run(stop_rx));
            relays.pulling.insert(subscription, Pulling { config, routes, stop, task });
        }
    }

    /// Stops every route (pullers finish the batch they store and nack the rest;
    /// relays let in-flight attempts finish) and waits for them until `deadline`:
    /// attempts still running then are abandoned, and their entries handed back to
    /// the inbox (OPEN, no lease), so any instance claims them at once rather than when
    /// their leases expire.
    pub(crate) async fn stop_routes(&self, deadline: tokio::time::Instant) {
        let handles: Vec<JoinHandle<()>> = {
            let mut relays = self.relays.lock().expect("relays lock");
            let mut handles: Vec<_> = relays.stopping.drain(..).collect();
            for (_, (stop, handle)) in relays.running.drain() {
                let _ = stop.send(true);
                handles.push(handle);
            }
            for (_, pulling) in relays.pulling.drain() {
                let _ = pulling.stop.send(true);
                handles.push(pulling.task);
            }
            for (_, reader) in relays.outboxes.drain() {
                let _ = reader.stop.send(true);
                handles.push(reader.task);
            }
            handles
        };
        let mut abandoned = false;
        for mut h in handles {
            if tokio::time::timeout_at(deadline, &mut h).await.is_err() {
                abandoned = true;
                h.abort();
                // Dropped: its attempts' futures are gone, none settles after this.
                let _ = h.await;
            }
        }
        if !abandoned {
            tracing::info!("sources and relays stopped; the attempts in flight finished");
            return;
        }
        let owner = &self.relay_options.owner;
        match self.store.release_owned(owner, self.clock.now()).await {
            Ok(routes) => {
                tracing::warn!(
                    handed_back = routes.len(),
                    "grace period over; abandoned the attempts still in flight and handed their entries back to the inbox (OPEN, to be delivered again)"
                );
                let mut announced = routes.clone();
                announced.sort();
                announced.dedup();
                if let Err(error) = self.store.announce(&announced).await {
                    tracing::debug!(%error, "could not announce the entries handed back");
                }
            }
            Err(error) => {
                tracing::warn!(
                    %error,
                    "grace period over; abandoned the attempts still in flight, and could not hand their entries back: they are retried once their leases expire"
                );
            }
        }
    }
}

/// Keeps, of the routes that read one subscription, those `inlet check` would let
/// share it: the routing file's check passed them together, except where one of them
/// is the last good version of a route whose new version was refused (it keeps
/// serving) and another file's route, or one without `select`, was accepted beside
/// it. Then the subscription stays with the first route's file, and only with the
/// first route when one of them selects nothing; the others get none of its messages,
/// and the log says so.
fn admissible(subscription: &str, members: &mut Vec<Arc<crate::routing::Route>>) {
    let Some(first) = members.first().cloned() else { return };
    let before: Vec<String> = members.iter().map(|r| r.name().to_string()).collect();
    if members.len() > 1 && !members.iter().all(|r| r.config.source.select().is_some()) {
        members.truncate(1);
    }
    members.retain(|r| r.config.file == first.config.file);
    if members.len() < before.len() {
        let left_out: Vec<&String> =
            before.iter().filter(|n| !members.iter().any(|r| r.name() == n.as_str())).collect();
        tracing::error!(
            %subscription,
            kept = ?members.iter().map(|r| r.name()).collect::<Vec<_>>(),
            ?left_out,
            "routes share a subscription that inlet check would not let them share (one of them is a refused route's \
             last good version); the routes left out get none of its messages until the routing files agree"
        );
    }
}

/// Digests of the routing file: the one applied and the last one refused.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) applied: Option<String>,
    pub(crate) refused: Option<String>,
}

/// A push request takes only what it reaches.
impl FromRef<Arc<Shared>> for PushState {
    fn from_ref(shared: &Arc<Shared>) -> PushState {
        PushState {
            routes: Arc::clone(&shared.routes),
            ingest: Arc::clone(&shared.ingest),
            verifier: Arc::clone(&shared.push_verifier),
            metrics: Arc::clone(&shared.metrics),
        }
    }
}
