//! The relay: per route, claim due entries under a lease, deliver them through the
//! plugin and the target, and settle each by its disposition.
//!
//! Per-key order comes from the claim itself (an entry is claimable only when its
//! key has no older unresolved entry and nothing in flight), so any number of
//! workers and instances can run. The relay never acks: it only reads the inbox.

pub mod policy;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

use crate::clock::{Clock, Millis};
use crate::config::{Ordering, ParkedPolicy};
use crate::inbox::failures::{Attempt, RequestRecord};
use crate::inbox::group::{Committed, Expected, Group, Grouped, Settles};
use crate::inbox::{
    ClaimRequest, Claimed, Decoded, Lease, NextOfKey, Presence, SettleRequest, Settlement, Share, Status, Store,
    StoreError,
};
use crate::plugin::wit;
use crate::routing::Route;
use crate::rules;
use crate::telemetry::Metrics;
use policy::{Decision, Disposition};

/// How the relay of one route runs.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// This instance's name in leases.
    pub owner: String,
    /// How often to look for due entries when nothing wakes the relay.
    pub poll: Duration,
    /// Fault injection for tests: an attempt at an entry of this correlation key
    /// panics, as a bug in the host would. Never set in production.
    #[doc(hidden)]
    pub panic_on_key: Option<String>,
}

/// What a relay last read about its route's pause, and when.
#[derive(Debug, Default)]
struct PauseWatch {
    checked: Option<Instant>,
    paused: bool,
}

/// How many entries in a row a delivery slot takes from its settles (of one key)
/// before it goes back to the relay's claims, which take the oldest due entries of
/// the route (entries without a key, keys new since the last count), when the relay
/// has no free slot for them. While it has one, nothing waits for this slot, and it
/// goes on: its key needs no claim of the relay's (a claim reads every key of the
/// route's part, or a window of its oldest entries).
const HAND_ON_LIMIT: usize = 64;

/// [`HAND_ON_LIMIT`] on a route with more keys than delivery slots, where a key that
/// keeps its slot keeps keys that are not in flight waiting, older entries among them:
/// after this many entries in a row (while the relay has no free slot) the slot goes
/// back to the relay, whose claims take the oldest due heads. So a waiting key waits
/// for at most this many turns of any one slot, and a claim (which reads every key of
/// the route's part) serves this many deliveries per slot instead of one.
const HAND_ON_SHARED_LIMIT: usize = 16;

/// How many attempts past their delivery, each waiting for its settle's commit, a
/// relay keeps beside its `concurrency` deliveries, as a multiple of it. A delivery
/// slot is given back when the target has answered, not when the settle has
/// committed: the settle's commit (a group's batch, behind the batch out before it)
/// took half of a slot's time per delivery at route concurrency 16, time in which
/// the slot delivered nothing. The key stays in flight until its settle commits, so
/// the slot's next delivery is another key's (or the key's next entry, handed on by
/// the settle once it committed). Bounded, so a database that commits slowly holds
/// back the claims instead of gathering attempts without end.
const SETTLING_PER_SLOT: usize = 1;

/// How often a relay looks for expired leases to take back.
const RELEASE_EVERY: Duration = Duration::from_secs(1);

/// How often the relay of a per-key route tells the other instances it relays the
/// route and reads its part of the keys ([`Store::share`]).
const MEMBER_EVERY: Duration = Duration::from_secs(1);

/// How long after its last word an instance counts as gone: its part of the keys then
/// goes to the others. A pause longer than this (a stalled disk, a lost network) only
/// makes instances look at the same keys for a while, which the claims' key locks
/// make safe.
const MEMBER_TTL: Duration = Duration::from_secs(5);

pub struct Relay {
    pub route: Arc<Route>,
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    pub options: RelayOptions,
    /// When expired leases were last looked for.
    pub last_release: std::sync::Mutex<Option<Instant>>,
    /// This instance's part of the route's keys, as last read ([`Store::share`]);
    /// `None`: every key.
    pub share: std::sync::Mutex<Option<Share>>,
    /// The route's delivery slots (`concurrency` permits): an attempt holds one from
    /// its claim (or the hand-on that brought its entry) until the target has
    /// answered, not through its settle's commit ([`SETTLING_PER_SLOT`]).
    slots: Arc<Semaphore>,
    /// Told when an attempt gives its slot back before it ends (its settle still to
    /// commit), so a relay whose last claim filled every slot claims again.
    slot_freed: Notify,
    /// Slots the relay's claim out holds for what it finds: free slots still, as far
    /// as a key's run of entries handed on is concerned ([`Relay::slot_free`]).
    claiming: std::sync::atomic::AtomicUsize,
    /// Settles of attempts that end together are committed together (shared by the
    /// relays of a process); `None`: each settle commits alone.
    pub settles: Option<Arc<Group<Settles>>>,
}

impl Relay {
    /// The relay of `route`, its slots free, nothing read of its keys yet.
    pub fn new(
        route: Arc<Route>,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        options: RelayOptions,
        settles: Option<Arc<Group<Settles>>>,
    ) -> Relay {
        let slots = Arc::new(Semaphore::new(route.config.concurrency));
        Relay {
            route,
            store,
            clock,
            metrics,
            options,
            last_release: std::sync::Mutex::default(),
            share: std::sync::Mutex::default(),
            slots,
            slot_freed: Notify::new(),
            claiming: std::sync::atomic::AtomicUsize::new(0),
            settles,
        }
    }

    /// Runs until `shutdown` turns true, then lets in-flight attempts finish.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let route = self.route.name().to_string();
        let concurrency = self.route.config.concurrency;
        let most_attempts = concurrency * (1 + SETTLING_PER_SLOT);
        // Whether the last claim found as many entries as it had slots for: then more
        // may wait, and a slot given back is worth a claim.
        let mut more_waiting = false;
        let mut in_flight: JoinSet<()> = JoinSet::new();
        let mut store_down_since: Option<Instant> = None;
        let mut pause = PauseWatch::default();
        tracing::info!(route, concurrency, owner = %self.options.owner, "relay started");
        // Every route's relay says it is here: a per-key route's claims read their
        // part of the keys from the members, and every route's settles are paced by
        // how many instances share the database ([`crate::inbox::group::Fleet`]).
        let membership = {
            let relay = Arc::clone(&self);
            tokio::spawn(async move { relay.keep_membership().await })
        };
        while !*shutdown.borrow() {
            // Slots free, within the bound on attempts whose settles are still out.
            let room = most_attempts.saturating_sub(in_flight.len());
            let free = self.slots.available_permits().min(room);
            // Taken before the claim, so each entry it brings has its slot; an attempt
            // waiting for a slot (an entry its settle handed on) was given one first.
            let slots = (free > 0).then(|| Arc::clone(&self.slots).try_acquire_many_owned(free as u32).ok()).flatten();
            let mut full_batch = false;
            if let Some(mut slots) = slots {
                self.claiming.store(free, std::sync::atomic::Ordering::Relaxed);
                let claimed = self.claim_unless_paused(free as u32, &mut pause).await;
                self.claiming.store(0, std::sync::atomic::Ordering::Relaxed);
                match claimed {
                    Ok(claimed) => {
                        if let Some(since) = store_down_since.take() {
                            tracing::info!(route, down_for = ?since.elapsed(), "inbox reachable again; relay resumes");
                        }
                        full_batch = claimed.len() == free;
                        more_waiting = full_batch;
                        for c in claimed {
                            let relay = Arc::clone(&self);
                            let stop = shutdown.clone();
                            let permit = slots.split(1).expect("a slot taken for every entry claimed");
                            let slot = SlotInUse::with(&relay, permit);
                            in_flight.spawn(async move { relay.attempt_contained(c, stop, slot).await });
                        }
                    }
                    Err(error) => {
                        more_waiting = false;
                        if store_down_since.is_none() {
                            tracing::error!(route, %error, "relay cannot claim entries; retrying");
                            store_down_since = Some(Instant::now());
                        }
                    }
                }
                // The slots no entry came for are free again (dropped here).
            }
            // A full batch may have more behind it: claim again at once if there is room.
            if full_batch && self.slots.available_permits() > 0 && in_flight.len() < most_attempts {
                continue;
            }
            tokio::select! {
                _ = self.route.stored.notified() => {}
                Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
                // A slot given back before its attempt ended: worth a claim only while
                // the last one found as many entries as it had slots.
                _ = self.slot_freed.notified(), if more_waiting => {}
                _ = tokio::time::sleep(self.options.poll) => {}
                _ = shutdown.changed() => {}
            }
            // Collect every attempt that has finished meanwhile, so one claim fills all
            // the free slots instead of one claim (one commit) per finished attempt.
            while in_flight.try_join_next().is_some() {}
        }
        tracing::info!(route, in_flight = in_flight.len(), "relay stopping; letting in-flight attempts finish");
        membership.abort();
        if let Some(settles) = &self.settles {
            settles.fleet().left(&route);
        }
        // Its keys go to the others now, not when its word runs out.
        if let Err(error) = self.store.share(&route, &self.options.owner, Presence::Leaving).await {
            tracing::warn!(route, %error, "could not tell the other instances this one stops relaying the route");
        }
        while in_flight.join_next().await.is_some() {}
    }

    /// Tells the other instances, every [`MEMBER_EVERY`], that this one relays the
    /// route, and keeps the part of the keys that leaves it (which only a per-key
    /// route's claims read); logs when the count or the part changes. A failure keeps
    /// the last part (the claims fail too while the inbox is away, and say so).
    async fn keep_membership(&self) {
        let route = self.route.name();
        let mut ticks = tokio::time::interval(MEMBER_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match self.store.share(route, &self.options.owner, Presence::Here { ttl: MEMBER_TTL }).await {
                Ok(share) => {
                    let before = std::mem::replace(&mut *self.share.lock().expect("share lock"), share);
                    if before != share
                        && let Some(Share { index, count }) = share
                    {
                        if self.route.config.ordering == Ordering::PerKey {
                            tracing::info!(route, instances = count, part = index, "the route's keys are divided anew");
                        } else {
                            tracing::info!(route, instances = count, "instances relaying the route changed");
                        }
                    }
                    let count = share.map_or(1, |s| s.count);
                    self.metrics.route_instances.get_or_create(&Metrics::route(route)).set(i64::from(count));
                    if let Some(settles) = &self.settles {
                        settles.fleet().seen(route, count);
                    }
                }
                Err(error) => tracing::debug!(route, %error, "cannot say this instance relays the route; trying again"),
            }
        }
    }

    /// Claims up to `limit` entries, unless the route is paused. Whether it is paused
    /// is read at most once per poll interval (the claim itself refuses a paused route
    /// in between, so this read only tells the relay to skip, and lets it say so: a
    /// log line when the state changes, `inlet_route_paused`).
    async fn claim_unless_paused(&self, limit: u32, watch: &mut PauseWatch) -> Result<Vec<Claimed>, StoreError> {
        let route = self.route.name();
        if watch.checked.is_none_or(|t| t.elapsed() >= self.options.poll) {
            let pause = self.store.paused_routes(Some(route)).await?.pop();
            watch.checked = Some(Instant::now());
            self.metrics.route_paused.get_or_create(&Metrics::route(route)).set(i64::from(pause.is_some()));
            match (&pause, watch.paused) {
                (Some(p), false) => tracing::info!(
                    route,
                    paused_by = %p.paused_by,
                    reason = %p.reason,
                    "route paused: not claiming until it is resumed (attempts in flight finish)"
                ),
                (None, true) => tracing::info!(route, "route resumed: claiming again"),
                _ => {}
            }
            watch.paused = pause.is_some();
        }
        if watch.paused {
            tracing::debug!(route, "route paused; not claiming");
            return Ok(Vec::new());
        }
        self.claim(limit).await
    }

    async fn claim(&self, limit: u32) -> Result<Vec<Claimed>, StoreError> {
        let cfg = &self.route.config;
        let now = self.clock.now();
        // Expired leases are rare and a second late is harmless next to a lease of
        // seconds: look for them at most once a second, not before every claim.
        let due = {
            let mut last = self.last_release.lock().expect("release lock");
            let due = last.is_none_or(|t| t.elapsed() >= RELEASE_EVERY);
            if due {
                *last = Some(Instant::now());
            }
            due
        };
        if due {
            let released = self.store.release_expired(self.route.name(), now).await?;
            if released > 0 {
                tracing::warn!(route = self.route.name(), released, "took back entries whose lease expired");
            }
        }
        let ordered = cfg.ordering == Ordering::PerKey;
        // The part of the keys is for ordered claims; an unordered route's entries are
        // anyone's.
        let share = if ordered { *self.share.lock().expect("share lock") } else { None };
        let started = Instant::now();
        let claimed = self
            .store
            .claim(&ClaimRequest {
                route: self.route.name(),
                owner: &self.options.owner,
                limit,
                now,
                lease_ms: cfg.lease.as_millis() as Millis,
                ordered,
                parked_blocks: cfg.parked == ParkedPolicy::BlockKey,
                share,
            })
            .await;
        self.metrics
            .claim_seconds
            .get_or_create(&Metrics::route(self.route.name()))
            .observe(started.elapsed().as_secs_f64());
        claimed
    }

    /// [`Relay::attempt`], with a panic in it (a bug in the host) caught: logged,
    /// counted in `inlet_attempt_panics_total`, and settled like a failed attempt —
    /// retried with backoff and parked at `max_attempts` — instead of leaving the
    /// entry to its lease and a crash loop nobody sees.
    ///
    /// The attempt runs in an `attempt` span carrying the route, the entry id, its key
    /// and the attempt number, so every line it logs says which entry it is about.
    ///
    /// When its settle hands on the key's next entry (see [`Relay::next_of_key`]),
    /// the task attempts that one next, in the first slot free (slots go to such
    /// entries before the relay's claims) — beyond [`HAND_ON_LIMIT`] entries in a row
    /// only while the relay has a free slot, and not once `stop` turns true; then the
    /// task ends and its key goes back to the relay's claims.
    async fn attempt_contained(self: Arc<Self>, c: Claimed, stop: watch::Receiver<bool>, slot: SlotInUse) {
        let mut c = Some(c);
        let mut slot = Some(slot);
        let mut handed = 0;
        while let Some(claimed) = c.take() {
            let slot = match slot.take() {
                Some(slot) => slot,
                None => match self.slot_within_lease(&claimed).await {
                    Some(slot) => slot,
                    None => {
                        self.hand_back(claimed).await;
                        break;
                    }
                },
            };
            let span = tracing::info_span!(
                "attempt",
                route = self.route.name(),
                entry = claimed.entry.id,
                key = claimed.entry.correlation_key.as_deref().unwrap_or(""),
                attempt = claimed.entry.attempts,
            );
            let hand_on = (handed < self.hand_on_limit() || self.slot_free()) && !*stop.borrow();
            c = tracing::Instrument::instrument(Arc::clone(&self).attempt_caught(claimed, hand_on, slot), span).await;
            handed += 1;
        }
    }

    /// A slot for an entry a settle handed on (its lease running since): one free
    /// now, as a claimed entry gets, or one that comes free while the lease still
    /// covers a whole exchange with the target and a second besides (what the
    /// routing file's check asks of a lease). So an entry that waited for a slot is
    /// never delivered past its lease, when another instance could take its key.
    async fn slot_within_lease(self: &Arc<Self>, c: &Claimed) -> Option<SlotInUse> {
        if let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() {
            return Some(SlotInUse::with(self, permit));
        }
        let cfg = &self.route.config;
        let exchange = cfg.target.timeout() * cfg.max_steps.max(1) + Duration::from_secs(1);
        let left = Duration::from_millis((c.lease.expires_at - self.clock.now()).max(0) as u64);
        let wait = left.checked_sub(exchange)?;
        tokio::time::timeout(wait, SlotInUse::wait(self)).await.ok()
    }

    /// Hands an entry back undelivered (OPEN at once, its key's next claim takes it):
    /// its lease ran too short waiting for a slot ([`Relay::slot_within_lease`]).
    async fn hand_back(&self, c: Claimed) {
        let (route, id) = (self.route.name(), c.entry.id);
        tracing::warn!(route, id, "no delivery slot came free within the lease of an entry handed on; handing it back");
        let settlement = Settlement::Retry {
            at: self.clock.now(),
            error: "handed on by its key's last settle, it waited for a delivery slot until its lease could not \
                    cover a delivery; handed back undelivered"
                .into(),
            not_yet_since: None,
        };
        let key = c.entry.correlation_key.as_deref();
        self.finish(id, key, c.entry.received_at, &c.lease, settlement, None, false).await;
    }

    async fn attempt_caught(self: Arc<Self>, c: Claimed, hand_on: bool, slot: SlotInUse) -> Option<Claimed> {
        let (id, key, lease) = (c.entry.id, c.entry.correlation_key.clone(), c.lease.clone());
        let received_at = c.entry.received_at;
        let (attempts, not_yet_since) = (c.entry.attempts, c.entry.not_yet_since);
        let started = (self.clock.now(), Instant::now());
        let this = Arc::clone(&self);
        // A panic gives the slot back ([`SlotInUse`]'s drop, with the attempt's future).
        let panic = match CatchUnwind(Box::pin(async move { this.attempt(c, hand_on, slot).await })).await {
            Ok(next) => return next,
            Err(panic) => panic,
        };
        let route = self.route.name();
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        tracing::error!(route, id, panic = %message, "a delivery attempt panicked; counting it as a failed attempt");
        self.metrics.attempt_panics.get_or_create(&Metrics::route(route)).inc();
        let error = format!("the delivery attempt panicked (a bug in Inlet): {message}");
        let disposition = Disposition::Retry { error, hint: None };
        let settlement = self.decision(attempts, not_yet_since).settle(disposition, &mut fastrand::Rng::new());
        // What it sent before the panic is lost with it.
        let record = self.record(attempts, started, "panic", Vec::new());
        self.finish(id, key.as_deref(), received_at, &lease, settlement, Some(record), false).await
    }

    /// The policy's view of an entry whose attempt just ended, as of now.
    fn decision(&self, attempts: i32, not_yet_since: Option<Millis>) -> Decision<'_> {
        Decision {
            retry: &self.route.config.retry,
            not_yet: &self.route.config.not_yet,
            attempts: attempts.max(1) as u32,
            not_yet_since,
            now: self.clock.now(),
        }
    }

    /// One attempt at one claimed entry, ending in exactly one settle; with
    /// `hand_on`, the key's next entry if the settle claimed it. The slot is given
    /// back once the attempt has its outcome, before the settle.
    async fn attempt(&self, c: Claimed, hand_on: bool, mut slot: SlotInUse) -> Option<Claimed> {
        if self.options.panic_on_key.is_some() && c.entry.correlation_key == self.options.panic_on_key {
            panic!("fault injection: panic_on_key {:?}", c.entry.correlation_key);
        }
        let route = self.route.name();
        let id = c.entry.id;
        let started = (self.clock.now(), Instant::now());
        let mut requests = Vec::new();
        let (settlement, answer) = match c.entry.decoded() {
            None => match self.redecode(&c).await {
                Ok(settlement) => (settlement, "decoded"),
                // The plugin could not answer in time: an attempt like any other.
                Err(transient) => {
                    let label = transient.label();
                    let decision = self.decision(c.entry.attempts, c.entry.not_yet_since);
                    (decision.settle(transient, &mut fastrand::Rng::new()), label)
                }
            },
            Some(decoded) => {
                let disposition = self.deliver(&c, decoded, &mut requests).await;
                let label = disposition.label();
                self.metrics.attempts.get_or_create(&Metrics::outcome(route, label)).inc();
                let decision = self.decision(c.entry.attempts, c.entry.not_yet_since);
                (decision.settle(disposition, &mut fastrand::Rng::new()), label)
            }
        };
        slot.give_back();
        let record = self.record(c.entry.attempts, started, answer, requests);
        let key = c.entry.correlation_key.as_deref();
        self.finish(id, key, c.entry.received_at, &c.lease, settlement, Some(record), hand_on).await
    }

    /// The history record of an attempt that began at `started` (clock, monotonic);
    /// its status and reason are filled in by the settle that ends it.
    fn record(&self, attempt: i32, started: (Millis, Instant), answer: &str, requests: Vec<RequestRecord>) -> Attempt {
        Attempt {
            attempt,
            owner: self.options.owner.clone(),
            started_at: started.0,
            duration_ms: started.1.elapsed().as_millis() as i64,
            answer: answer.to_string(),
            // Until the settle that ends the attempt says otherwise.
            status: Status::InProgress,
            reason: None,
            requests,
            plugin: Some(self.route.plugin().digest().to_string()),
        }
    }

    /// Stores how an attempt ended (its text made storable), parking instead when the
    /// inbox refuses the outcome itself; logs and counts parks and lost leases, and
    /// the queue time of a delivered entry (received at `received_at`). With
    /// `hand_on`, a settle that resolves the entry asks for its key's next entry and
    /// returns it if it was claimed.
    #[allow(clippy::too_many_arguments)]
    async fn finish(
        &self,
        id: i64,
        key: Option<&str>,
        received_at: Millis,
        lease: &Lease,
        settlement: Settlement,
        record: Option<Attempt>,
        hand_on: bool,
    ) -> Option<Claimed> {
        let route = self.route.name();
        let settlement = self.storable(settlement);
        let mut delivered = matches!(settlement, Settlement::Done);
        if let Settlement::Parked { error } = &settlement {
            tracing::warn!(route, id, key = key.unwrap_or(""), error, "entry parked");
            self.metrics.parked.get_or_create(&Metrics::route(route)).inc();
        }
        let resolves = matches!(settlement, Settlement::Done | Settlement::Ignored { .. });
        let next = if hand_on && resolves { self.next_of_key(key) } else { None };
        let mut result = self.settle(id, lease, &settlement, &record, next).await;
        if let Err(error) = &result
            && error.refuses_row()
        {
            // What the attempt produced cannot be stored (say, a re-decoded key too
            // long for the index): retrying would fail the same way, so park instead.
            let code = error.code().unwrap_or_else(|| "unknown".into());
            let reason = format!("the inbox refused the outcome of the attempt (code {code}): {error}");
            tracing::warn!(route, id, %error, "the inbox refused an outcome; parking the entry");
            self.metrics.parked.get_or_create(&Metrics::route(route)).inc();
            let parked = self.storable(Settlement::Parked { error: reason });
            delivered = false;
            result = self.settle(id, lease, &parked, &record, None).await;
        }
        if let Err(error) = &result
            && error.holds_dedup_key()
            && let Settlement::Decoded { dedup_key: Some(dedup_key), .. } = &settlement
        {
            let instead = self.storable(self.dedup_key_taken(id, dedup_key).await);
            tracing::warn!(route, id, dedup_key, settlement = ?instead, "a re-decoded entry's dedup key is held by another entry");
            result = self.settle(id, lease, &instead, &record, None).await;
        }
        match result {
            Ok(next) => {
                if delivered {
                    let waited = (self.clock.now() - received_at).max(0) as f64 / 1000.0;
                    self.metrics.queue_seconds.get_or_create(&Metrics::route(route)).observe(waited);
                }
                tracing::debug!(route, id, ?settlement, handed_on = next.as_ref().map(|c| c.entry.id), "entry settled");
                if next.is_some() {
                    self.metrics.claims_handed_on.get_or_create(&Metrics::route(route)).inc();
                }
                return next;
            }
            Err(StoreError::LeaseLost { .. }) => {
                tracing::warn!(
                    route,
                    id,
                    "lease lost before the attempt was settled; another worker owns the entry now"
                );
                self.metrics.lease_lost.get_or_create(&Metrics::route(route)).inc();
            }
            Err(error) => {
                tracing::error!(route, id, %error, "could not settle the attempt; the entry is retried when its lease expires");
            }
        }
        None
    }

    /// What a settle of an entry of `key` asks for its slot: the key's next entry, on
    /// a per-key route whose settles commit in groups and whose keys its claims have
    /// counted. Then the key's next delivery does not wait for a claim of the relay's:
    /// with few keys that wait was most of a key's turn, and with many keys and few
    /// slots the claims (each reading every key of the route's part) were most of
    /// the database's work per delivery. How long a key may keep its slot:
    /// [`Relay::hand_on_limit`].
    fn next_of_key(&self, key: Option<&str>) -> Option<NextOfKey> {
        let cfg = &self.route.config;
        if cfg.ordering != Ordering::PerKey || self.settles.is_none() {
            return None;
        }
        // Only a store whose claims count the keys hands on (SQLite's count none).
        self.store.keys_met(self.route.name())?;
        Some(NextOfKey {
            route: self.route.name().to_string(),
            key: key?.to_string(),
            lease_ms: cfg.lease.as_millis() as Millis,
            parked_blocks: cfg.parked == ParkedPolicy::BlockKey,
        })
    }

    /// Whether the relay has a slot free (or held by its claim out, for whatever that
    /// finds): then no entry waits for the slot of a key's run of entries handed on.
    fn slot_free(&self) -> bool {
        self.slots.available_permits() + self.claiming.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// How many entries in a row a slot may take from its settles while the relay has
    /// no free slot: [`HAND_ON_LIMIT`] when the route's keys (of this instance's part,
    /// as its claims last counted them) all fit in its slots, so no key waits for a
    /// slot; else [`HAND_ON_SHARED_LIMIT`].
    fn hand_on_limit(&self) -> usize {
        let keys = self.store.keys_met(self.route.name()).unwrap_or(i64::MAX);
        if keys <= self.route.config.concurrency as i64 { HAND_ON_LIMIT } else { HAND_ON_SHARED_LIMIT }
    }

    /// One settle, with the attempt's record saying how it ended as stored.
    /// The key's next entry comes back if `next` asked for it and the group's
    /// transaction claimed it (alone, a settle claims nothing).
    async fn settle(
        &self,
        id: i64,
        lease: &Lease,
        s: &Settlement,
        record: &Option<Attempt>,
        next: Option<NextOfKey>,
    ) -> Result<Option<Claimed>, StoreError> {
        let record = record.clone().map(|r| settled_record(r, s));
        let Some(settles) = &self.settles else {
            return self.store.settle_recorded(id, lease, self.clock.now(), s, record.as_ref()).await.map(|()| None);
        };
        let now = self.clock.now();
        let request = SettleRequest { id, lease: lease.clone(), now, settlement: s.clone(), attempt: record, next };
        match settles.submit(request).await? {
            Committed { outcome: Grouped::Stored(result), .. } => result,
            Committed { outcome: Grouped::Failed(error), .. } => Err(error),
            // Its batch failed (another settle's row, say): alone, it gets its own
            // error (a refused row, a held dedup key) for `finish` to act on.
            Committed { item: r, outcome: Grouped::Alone } => self
                .store
                .settle_recorded(r.id, &r.lease, r.now, &r.settlement, r.attempt.as_ref())
                .await
                .map(|()| None),
        }
    }

    /// A re-decoded entry whose plugin dedup key another entry of the route already
    /// holds: the same event was stored twice, once under this entry's message id
    /// (when it could not be decoded) and once under its dedup key. The same payload
    /// is a duplicate, ignored with a record; a different payload is parked for a
    /// person, as a conflict at ingest would be.
    async fn dedup_key_taken(&self, id: i64, dedup_key: &str) -> Settlement {
        let route = self.route.name();
        let holder = self.store.find_by_dedup_key(route, dedup_key).await;
        let mine = self.store.get(id).await;
        let shown = rules::storable(dedup_key, 200);
        match (holder, mine) {
            (Ok(Some(holder)), Ok(Some(mine))) if holder.payload_digest == mine.payload_digest => Settlement::Ignored {
                reason: format!(
                    "duplicate of entry {}: re-decoded, the plugin gave dedup key `{shown}`, which entry {} holds with the same payload; not delivered twice",
                    holder.id, holder.id
                ),
            },
            (Ok(Some(holder)), Ok(Some(_))) => {
                self.metrics.dedup_conflicts.get_or_create(&Metrics::route(route)).inc();
                Settlement::Parked {
                    error: format!(
                        "re-decoded, the plugin gave dedup key `{shown}`, which entry {} holds with a different payload; ignore one of them, or requeue this one after that one is purged",
                        holder.id
                    ),
                }
            }
            // The holder went away meanwhile (purged), or a read failed: try again later.
            _ => Settlement::Retry {
                at: self.clock.now() + 1_000,
                error: format!(
                    "re-decoded, the plugin gave dedup key `{shown}`, held by another entry that could not be read"
                ),
                not_yet_since: None,
            },
        }
    }

    /// The settlement with its text made storable and cut at the route's
    /// `max_reason_bytes`: a reason from the plugin or a target's answer may hold
    /// anything.
    fn storable(&self, settlement: Settlement) -> Settlement {
        let max = self.route.config.limits.max_reason_bytes;
        let bound = |text: String| rules::storable(&text, max).into_owned();
        match settlement {
            Settlement::Ignored { reason } => Settlement::Ignored { reason: bound(reason) },
            Settlement::Retry { at, error, not_yet_since } => {
                Settlement::Retry { at, error: bound(error), not_yet_since }
            }
            Settlement::Parked { error } => Settlement::Parked { error: bound(error) },
            other @ (Settlement::Done | Settlement::Decoded { .. }) => other,
        }
    }

    /// A rendered request (from `render` or a `next` step) that breaks an output rule:
    /// counted, and the reason the entry is parked with.
    fn refuse_request(&self, call: &'static str, step: u32, req: &wit::Request) -> Option<Disposition> {
        let violation = rules::check_request(&self.route.config.target, req).err()?;
        self.metrics.count_refused(self.route.name(), call, violation.rule);
        let what = if step > 1 { format!("{call} output for step {step}") } else { format!("{call} output") };
        Some(Disposition::Park { reason: format!("{what} refused, the request was not sent: {violation}") })
    }

    /// Render, send, classify; then hands what the plugin saw and answered to the
    /// route's shadow, if it has one.
    async fn deliver(&self, c: &Claimed, decoded: Decoded, requests: &mut Vec<RequestRecord>) -> Disposition {
        let event = wit::Event {
            event_type: decoded.event_type,
            correlation_key: decoded.correlation_key,
            dedup_key: Some(c.entry.dedup_key.clone()),
            body: decoded.body,
            schema_version: decoded.schema_version,
        };
        let mut seen = self.route.shadow().map(|_| Seen { render: None, steps: Vec::new() });
        let disposition = self.exchange(c, &event, requests, &mut seen).await;
        if let (Some(shadow), Some(Seen { render: Some(render), steps })) = (self.route.shadow(), seen) {
            shadow.offer(crate::shadow::Job::Deliver { entry: c.entry.id, event, render, steps });
        }
        disposition
    }

    /// The exchange of one attempt: render, then send and classify up to `max_steps`
    /// times. `seen` (when the route has a shadow) gets the plugin's answers and the
    /// inputs it had.
    async fn exchange(
        &self,
        c: &Claimed,
        event: &wit::Event,
        requests: &mut Vec<RequestRecord>,
        seen: &mut Option<Seen>,
    ) -> Disposition {
        let route = self.route.name();
        // One version for the whole exchange, even if a reload lands meanwhile.
        let plugin = self.route.plugin();
        let render_started = Instant::now();
        let rendered = plugin.render(event.clone()).await;
        self.metrics.plugin_call(route, "render", render_started);
        if let Some(seen) = seen.as_mut() {
            seen.render = Some(crate::shadow::RenderSide::of(&rendered));
        }
        let request = match rendered {
            Ok(Ok(r)) => match self.refuse_request("render", 1, &r) {
                Some(refused) => return refused,
                None => r,
            },
            Ok(Err(reason)) => {
                return Disposition::Park { reason: format!("plugin could not render the request: {reason}") };
            }
            Err(fault) => {
                self.metrics.count_plugin_fault(route, "render", fault.kind());
                return Disposition::Retry { error: format!("plugin fault during render: {fault}"), hint: None };
            }
        };
        let max_steps = self.route.config.max_steps;
        let mut request = request;
        let mut exchange = wit::Exchange { step: 1, state: Vec::new() };
        loop {
            // The lease must outlive the request; if it cannot, do not send.
            let remaining = c.lease.expires_at - self.clock.now();
            if remaining < self.route.config.target.timeout().as_millis() as Millis {
                return Disposition::Retry {
                    error: format!("lease too short to send step {} within the target timeout", exchange.step),
                    hint: Some(Duration::ZERO),
                };
            }
            let started = Instant::now();
            let delivery = crate::delivery::Delivery {
                idempotency_key: &c.entry.dedup_key,
                correlation_key: &event.correlation_key,
            };
            let outcome = self.route.target.deliver(&request, &delivery).await;
            requests.push(request_record(exchange.step, &request, &outcome));
            self.metrics
                .delivery_seconds
                .get_or_create(&Metrics::route(route))
                .observe(started.elapsed().as_secs_f64());
            let described = crate::delivery::describe(&outcome);
            let described = if exchange.step > 1 { format!("step {}: {described}", exchange.step) } else { described };
            let classify_started = Instant::now();
            let shadow_copy = seen.as_ref().map(|_| (exchange.clone(), outcome.clone()));
            let classified = plugin.classify(event.clone(), exchange.clone(), outcome).await;
            self.metrics.plugin_call(route, "classify", classify_started);
            if let (Some(seen), Some((exchange, outcome))) = (seen.as_mut(), shadow_copy) {
                let serving = crate::shadow::ClassifySide::of(&classified);
                seen.steps.push(crate::shadow::StepSeen { exchange, outcome, serving });
            }
            return match classified {
                Ok(wit::Disposition::Next(next)) => {
                    if exchange.step >= max_steps {
                        return Disposition::Retry {
                            error: format!(
                                "plugin asked for more than {max_steps} steps in one exchange ({described})"
                            ),
                            hint: None,
                        };
                    }
                    if let Some(refused) = self.refuse_request("classify", exchange.step + 1, &next.request) {
                        return refused;
                    }
                    request = next.request;
                    exchange = wit::Exchange { step: exchange.step + 1, state: next.state };
                    continue;
                }
                Ok(wit::Disposition::Done) => Disposition::Done,
                Ok(wit::Disposition::Retry(hint)) => {
                    Disposition::Retry { error: described, hint: hint.map(Duration::from_millis) }
                }
                Ok(wit::Disposition::NotYet(reason)) => {
                    Disposition::NotYet { reason: format!("{reason} ({described})") }
                }
                Ok(wit::Disposition::Park(reason)) => Disposition::Park { reason: format!("{reason} ({described})") },
                Ok(wit::Disposition::Ignore(reason)) => Disposition::Ignore { reason },
                Err(fault) => {
                    self.metrics.count_plugin_fault(route, "classify", fault.kind());
                    Disposition::Retry {
                        error: format!("plugin fault during classify: {fault} (after {described})"),
                        hint: None,
                    }
                }
            };
        }
    }

    /// A requeued entry that was parked before it could be decoded: decode it now with
    /// the plugin as it is today. On success it goes back to OPEN, so ordering applies.
    /// A transient plugin fault comes back as a retry for the policy to settle.
    async fn redecode(&self, c: &Claimed) -> Result<Settlement, Disposition> {
        let mut msg = wit::Message {
            data: c.entry.raw_data.clone(),
            attributes: c.entry.attributes.clone(),
            message_id: c.entry.message_id.clone(),
            publish_time: c.entry.publish_time.clone(),
            delivery_attempt: c.entry.delivery_attempt.map(|a| a.max(0) as u32),
        };
        // A message that refers to its payload is decoded from the payload, fetched
        // again (its digest makes it the same bytes).
        if let Some(fetcher) = self.route.fetcher()
            && let Some(fetched) = fetcher.fetch(&c.entry.attributes).await
        {
            match fetched {
                Ok(bytes) => msg.data = bytes,
                Err(e) => {
                    let reason = crate::telemetry::RouteReason { route: self.route.name().to_string(), reason: e.kind };
                    self.metrics.fetch_failures.get_or_create(&reason).inc();
                    if e.transient {
                        return Err(Disposition::Retry { error: e.to_string(), hint: None });
                    }
                    return Ok(Settlement::Parked { error: e.to_string() });
                }
            }
        }
        let started = Instant::now();
        let decoded = self.route.plugin().decode(msg).await;
        self.metrics.plugin_call(self.route.name(), "decode", started);
        Ok(match decoded {
            Ok(Ok(wit::Decoded::Event(ev))) => match rules::accept_event(&self.route.config, ev, &c.entry.attributes) {
                Err(violation) => {
                    self.metrics.count_refused(self.route.name(), "decode", violation.rule);
                    Settlement::Parked { error: format!("decode output refused: {violation}") }
                }
                Ok(ev) => Settlement::Decoded {
                    // Only a key that differs from the one the entry has is written.
                    dedup_key: ev.dedup_key.filter(|k| !k.is_empty() && *k != c.entry.dedup_key),
                    decoded: Decoded {
                        event_type: ev.event_type,
                        correlation_key: ev.correlation_key,
                        schema_version: ev.schema_version,
                        body: ev.body,
                    },
                },
            },
            Ok(Ok(wit::Decoded::Ignore(reason))) => {
                Settlement::Ignored { reason: format!("ignored by the plugin: {reason}") }
            }
            Ok(Err(e)) => Settlement::Parked { error: format!("decode failed: {}", e.message) },
            Err(fault) => {
                self.metrics.count_plugin_fault(self.route.name(), "decode", fault.kind());
                let error = format!("plugin fault during decode: {fault}");
                if fault.is_transient() {
                    return Err(Disposition::Retry { error, hint: None });
                }
                Settlement::Parked { error }
            }
        })
    }
}

/// A delivery slot of the relay in use ([`Relay::slots`]): taken for an entry when
/// the relay claims it or when a settle hands it on, given back when the attempt has
/// its outcome ([`SlotInUse::give_back`]) or, however the attempt ends, when dropped.
/// From the slot's taking until the attempt's settle is in (the attempt holds this
/// past giving the slot back), the settles' group expects that settle
/// ([`Group::expect`]).
struct SlotInUse {
    relay: Arc<Relay>,
    permit: Option<OwnedSemaphorePermit>,
    _settle: Option<Expected>,
}

impl SlotInUse {
    fn with(relay: &Arc<Relay>, permit: OwnedSemaphorePermit) -> SlotInUse {
        let _settle = relay.settles.as_ref().map(|g| g.expect());
        SlotInUse { relay: Arc::clone(relay), permit: Some(permit), _settle }
    }

    /// The first slot free, before any claim of the relay's takes it.
    async fn wait(relay: &Arc<Relay>) -> SlotInUse {
        let permit = Arc::clone(&relay.slots).acquire_owned().await.expect("the relay's slots are never closed");
        SlotInUse::with(relay, permit)
    }

    /// Gives the slot back: the attempt has its outcome, its settle is still to come.
    fn give_back(&mut self) {
        if self.permit.take().is_some() {
            self.relay.slot_freed.notify_one();
        }
    }
}

impl Drop for SlotInUse {
    /// An attempt that ends without giving its slot back (a panic) gives it back here,
    /// waking the relay as [`SlotInUse::give_back`] does.
    fn drop(&mut self) {
        self.give_back();
    }
}

/// What the serving plugin saw and answered in one delivery, for the shadow.
struct Seen {
    render: Option<crate::shadow::RenderSide>,
    steps: Vec<crate::shadow::StepSeen>,
}

/// An attempt's record as the settlement `s` ends it.
fn settled_record(mut record: Attempt, s: &Settlement) -> Attempt {
    let (status, reason) = match s {
        Settlement::Done => (Status::Done, None),
        Settlement::Ignored { reason } => (Status::Ignored, Some(reason)),
        Settlement::Retry { error, .. } => (Status::Open, Some(error)),
        Settlement::Parked { error } => (Status::Parked, Some(error)),
        Settlement::Decoded { .. } => (Status::Open, None),
    };
    record.status = status;
    record.reason = reason.cloned();
    record
}

/// One request of an exchange for the history: method and path (never headers or
/// body, which may hold secrets), and the status or why none came.
fn request_record(step: u32, request: &wit::Request, outcome: &wit::Outcome) -> RequestRecord {
    let (status, error) = match outcome {
        wit::Outcome::Response(r) => (Some(r.status), None),
        wit::Outcome::TransportError(_) => (None, Some(crate::delivery::describe(outcome))),
    };
    RequestRecord {
        step,
        method: rules::storable(&request.method, 16).into_owned(),
        path: crate::redact::path(&rules::storable(&request.path, 512)),
        status,
        error: error.map(|e| crate::redact::text(&rules::storable(&e, 512))),
    }
}

/// Polls a future and turns a panic inside it into an `Err` with the panic's payload.
struct CatchUnwind<F>(std::pin::Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn std::any::Any + Send>>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let fut = self.0.as_mut();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(poll) => poll.map(Ok),
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    }
}
