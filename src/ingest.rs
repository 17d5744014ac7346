//! The receiver's half: decode a broker message with the route's plugin and store it.
//! Whatever the plugin makes of the message — an event, an "ignore", a decode error,
//! a trap, an answer that breaks an output rule (`crate::rules`) — ends as a committed
//! row; only a store failure is returned, and that means nack. This is the one place
//! every source goes through (invariants 1–3, 9).
//!
//! A row the database refuses for what it holds ([`StoreError::refuses_row`]: a key
//! too long for an index, a NUL in text) is not an outage: that message is stored
//! PARKED without its keys and with the database's error, and its neighbours in a
//! batch are stored as usual (the batch is split until the bad rows are found).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::clock::{Clock, Millis};
use crate::inbox::group::{Committed, Fleet, GroupCommit, Grouped, Inserts};
use crate::inbox::{Decoded, InsertOutcome, NewEntry, ReplayWindow, Status, Store, StoreError};
use crate::plugin::{PluginFault, wit};
use crate::routing::Route;
use crate::rules;
use crate::telemetry::Metrics;

/// A message as a source received it.
#[derive(Debug, Clone)]
pub struct Incoming {
    pub data: Vec<u8>,
    pub attributes: Vec<(String, String)>,
    pub message_id: String,
    pub publish_time: Option<String>,
    pub delivery_attempt: Option<u32>,
}

/// Why a message was not stored. Either way the source must not ack it: push
/// answers 503, the pull source nacks, and the broker redelivers.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The plugin could not decode the message now for a reason that may be the
    /// host's (see [`PluginFault::is_transient`]); after `limits.timeout_tries` such
    /// answers for one message it is parked instead.
    #[error("{0}; the message will be redelivered")]
    PluginBusy(PluginFault),
    /// The route's claim-check store did not give the payload the message refers to,
    /// for a reason that may pass; after `limits.timeout_tries` such failures for one
    /// message it is parked instead.
    #[error("{0}; the message will be redelivered")]
    FetchBusy(crate::claim_check::FetchError),
}

/// What became of a message that was accepted: the `outcome` of the push answer and
/// the label of `inlet_ingested_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stored {
    /// A new OPEN entry, to be delivered.
    Inserted,
    /// A new PARKED entry: the plugin could not decode it, broke a rule or faulted,
    /// or the database refused the row; it waits for a person.
    Parked,
    /// A new IGNORED entry: the plugin chose not to deliver it (the reason is kept).
    Ignored,
    /// Already stored (the same payload under a known dedup key): nothing new.
    Duplicate,
    /// A different payload under a known dedup key: stored PARKED as its own entry.
    Conflict,
    /// A redelivery that a replay window took: stored again as a new entry.
    Replayed,
}

impl Stored {
    /// How `outcome` is reported for a row stored with `status`; a conflicting payload
    /// seen again is a duplicate of its conflict entry (counted once).
    pub fn of(outcome: InsertOutcome, status: Status) -> Stored {
        match outcome {
            InsertOutcome::Inserted { .. } => match status {
                Status::Parked => Stored::Parked,
                Status::Ignored => Stored::Ignored,
                _ => Stored::Inserted,
            },
            InsertOutcome::Duplicate { .. } | InsertOutcome::Conflict { first: false, .. } => Stored::Duplicate,
            InsertOutcome::Conflict { first: true, .. } => Stored::Conflict,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Stored::Inserted => "inserted",
            Stored::Parked => "parked",
            Stored::Ignored => "ignored",
            Stored::Duplicate => "duplicate",
            Stored::Conflict => "conflict",
            Stored::Replayed => "replayed",
        }
    }
}

/// A message [`Ingest::accept`] stored (or found stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    pub outcome: InsertOutcome,
    pub stored: Stored,
}

pub struct Ingest {
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    /// Transient decode faults per (route, message id) not yet settled.
    transient: Mutex<HashMap<(String, String), u32>>,
    group: Option<GroupCommit>,
    /// Routes to announce to the other instances, coalesced by one task.
    announcer: Option<tokio::sync::mpsc::UnboundedSender<String>>,
}

/// The least time between two announcements of one instance: a wake-up this much
/// later still comes far sooner than the next poll.
pub const ANNOUNCE_SPACING: std::time::Duration = std::time::Duration::from_millis(10);

/// Messages whose transient decode faults are remembered at once; past this the
/// memory is cleared (a message then gets a few more tries, never fewer).
const TRANSIENT_MEMORY: usize = 10_000;

impl Ingest {
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, metrics: Arc<Metrics>) -> Ingest {
        Ingest { store, clock, metrics, transient: Mutex::new(HashMap::new()), group: None, announcer: None }
    }

    /// Single messages ([`Ingest::accept`], the push path) that arrive while others
    /// are committing are committed with them ([`GroupCommit`]), by `writers` tasks
    /// paced by `fleet`.
    pub fn with_group_commit(mut self, writers: usize, fleet: Arc<Fleet>) -> Ingest {
        let inserts = Inserts { store: Arc::clone(&self.store), clock: Arc::clone(&self.clock) };
        let group = GroupCommit::start(inserts, writers, fleet);
        group.report_to(self.metrics.group_report("inserts"));
        self.group = Some(group);
        self
    }

    /// Announces routes with new entries to the other instances on the inbox
    /// ([`Store::announce`]): names that queue up while one announcement goes out, or
    /// within [`ANNOUNCE_SPACING`] of its start, are sent together in the next, once
    /// each. A lone insert is announced at once; a stream of them costs the database
    /// one announcement (on PostgreSQL a `NOTIFY`, a transaction of its own that waits
    /// for the disk, and a claim woken in every instance) per spacing, not one per
    /// round trip.
    pub fn with_announcements(mut self) -> Ingest {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let store = Arc::clone(&self.store);
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let started = tokio::time::Instant::now();
                let mut routes = std::collections::BTreeSet::from([first]);
                while let Ok(route) = rx.try_recv() {
                    routes.insert(route);
                }
                let routes: Vec<String> = routes.into_iter().collect();
                if let Err(error) = store.announce(&routes).await {
                    // The others find the entries at their next poll.
                    tracing::debug!(%error, "could not announce new entries to the other instances");
                }
                tokio::time::sleep_until(started + ANNOUNCE_SPACING).await;
            }
        });
        self.announcer = Some(tx);
        self
    }

    /// Tells the other instances that `route` has entries to claim now.
    pub fn announce(&self, route: &str) {
        if let Some(tx) = &self.announcer {
            let _ = tx.send(route.to_string());
        }
    }

    /// The group committer, if there is one (tests and metrics read its counters).
    pub fn group_commit(&self) -> Option<&GroupCommit> {
        self.group.as_ref()
    }

    /// Decodes and stores one message. `Ok` means the row is committed (or was
    /// already there) and the broker may be acked; `Err` means nack.
    /// Runs in an `ingest` span carrying the route and the message id.
    pub async fn accept(&self, route: &Route, msg: Incoming) -> Result<Accepted, IngestError> {
        let span = ingest_span(route, &msg.message_id);
        tracing::Instrument::instrument(self.accept_one(route, msg), span).await
    }

    async fn accept_one(&self, route: &Route, msg: Incoming) -> Result<Accepted, IngestError> {
        let entry = self.decode(route, msg).await?;
        let (entry, result) = match &self.group {
            None => self.insert_alone(route, entry, self.clock.now()).await,
            Some(group) => match group.submit(entry).await {
                Ok(Committed { item, outcome: Grouped::Stored(outcome) }) => (item, Ok(outcome)),
                Ok(Committed { item, outcome: Grouped::Alone }) => {
                    self.insert_alone(route, item, self.clock.now()).await
                }
                Ok(Committed { item, outcome: Grouped::Failed(error) }) => (item, Err(error)),
                Err(error) => {
                    tracing::error!(route = route.name(), %error, "could not store the message; it will be redelivered");
                    self.metrics.ingest_failures.get_or_create(&Metrics::route(route.name())).inc();
                    return Err(error.into());
                }
            },
        };
        if let Ok(InsertOutcome::Duplicate { id, replay_open: true }) = result {
            let replayed = self.replays(route, &[(&entry, id)]).await;
            if let Some(replayed) = replayed?.pop().flatten() {
                return Ok(Accepted { outcome: replayed, stored: Stored::Replayed });
            }
        }
        self.record(route, &entry, &result);
        if matches!(result, Ok(InsertOutcome::Inserted { .. })) && entry.status == Status::Open {
            route.stored.notify_one();
            self.announce(route.name());
        }
        let outcome = result?;
        Ok(Accepted { outcome, stored: Stored::of(outcome, entry.status) })
    }

    /// Decodes and stores many messages in one transaction, in the order given (the
    /// inbox order, and so the delivery order within a key). `Ok` means every row is
    /// committed and every message may be acked; `Err` means nack them all (rows that
    /// were committed before the failure absorb the redelivery as duplicates).
    /// Each decode runs in an `ingest` span (route, message id), the insert in an
    /// `ingest_batch` span (route, number of messages).
    pub async fn accept_batch(&self, route: &Route, msgs: Vec<Incoming>) -> Result<Vec<InsertOutcome>, IngestError> {
        let mut entries = Vec::with_capacity(msgs.len());
        for msg in msgs {
            let span = ingest_span(route, &msg.message_id);
            entries.push(tracing::Instrument::instrument(self.decode(route, msg), span).await?);
        }
        let span = tracing::info_span!("ingest_batch", route = route.name(), messages = entries.len());
        tracing::Instrument::instrument(self.store_batch(route, entries), span).await
    }

    async fn store_batch(&self, route: &Route, mut entries: Vec<NewEntry>) -> Result<Vec<InsertOutcome>, IngestError> {
        let mut result = self.insert_isolating(route, &mut entries, self.clock.now()).await;
        // Which outcomes a replay window turned from duplicates into new entries
        // (counted by `replays`).
        let mut replayed = vec![false; entries.len()];
        if let Ok(outcomes) = &mut result {
            let duplicates: Vec<(usize, (&NewEntry, i64))> = entries
                .iter()
                .zip(outcomes.iter())
                .enumerate()
                .filter_map(|(i, (entry, outcome))| match outcome {
                    InsertOutcome::Duplicate { id, replay_open: true } => Some((i, (entry, *id))),
                    _ => None,
                })
                .collect();
            if !duplicates.is_empty() {
                let (at, found): (Vec<usize>, Vec<(&NewEntry, i64)>) = duplicates.into_iter().unzip();
                for (i, taken) in at.into_iter().zip(self.replays(route, &found).await?) {
                    if let Some(taken) = taken {
                        outcomes[i] = taken;
                        replayed[i] = true;
                    }
                }
            }
        }
        match &result {
            Ok(outcomes) => {
                for ((entry, outcome), _) in entries.iter().zip(outcomes).zip(&replayed).filter(|(_, r)| !**r) {
                    self.record(route, entry, &Ok(*outcome));
                }
                let opened = entries.iter().zip(outcomes).zip(&replayed).any(|((entry, outcome), replayed)| {
                    !replayed && matches!(outcome, InsertOutcome::Inserted { .. }) && entry.status == Status::Open
                });
                if opened {
                    route.stored.notify_one();
                    self.announce(route.name());
                }
            }
            Err(error) => {
                tracing::error!(route = route.name(), messages = entries.len(), %error, "could not store a batch of messages; they will be redelivered");
                self.metrics.ingest_failures.get_or_create(&Metrics::route(route.name())).inc_by(entries.len() as u64);
            }
        }
        Ok(result?)
    }

    /// Redeliveries a replay window takes as new deliveries: for each duplicate
    /// `(entry, id of the entry it duplicates)`, the new entry stored for it, or
    /// `None` where it stays a duplicate. A window takes a message published inside
    /// it whose first entry arrived before the window opened (so a message first seen
    /// while the window is open is not stored twice), once: stored again under
    /// [`crate::inbox::replay_dedup_key`], a later redelivery is a duplicate of that.
    /// Asked only for the duplicates whose insert saw a window of the route open
    /// (`InsertOutcome::Duplicate::replay_open`), so a redelivery where none is open costs
    /// no question of its own; the windows are read again here, and a window closed
    /// in between takes nothing. An error means nack,
    /// as for any insert (what was stored absorbs the redelivery).
    async fn replays(
        &self,
        route: &Route,
        found: &[(&NewEntry, i64)],
    ) -> Result<Vec<Option<InsertOutcome>>, StoreError> {
        let now = self.clock.now();
        let windows = self.store.replay_windows(Some(route.name()), Some(now)).await?;
        let mut taken = Vec::with_capacity(found.len());
        for (entry, original) in found {
            taken.push(match replay_window(&windows, entry) {
                Some(window) => self.replay(route, window, entry, *original, now).await?,
                None => None,
            });
        }
        if taken.iter().flatten().next().is_some() {
            route.stored.notify_one();
            self.announce(route.name());
        }
        Ok(taken)
    }

    /// Stores `entry` again for `window`, unless entry `original` arrived after the
    /// window opened or the window already stored it.
    async fn replay(
        &self,
        route: &Route,
        window: &ReplayWindow,
        entry: &NewEntry,
        original: i64,
        now: Millis,
    ) -> Result<Option<InsertOutcome>, StoreError> {
        let Some(first) = self.store.get(original).await? else { return Ok(None) };
        if first.received_at >= window.opened_at {
            return Ok(None);
        }
        let again =
            NewEntry { dedup_key: crate::inbox::replay_dedup_key(&entry.dedup_key, window.id), ..entry.clone() };
        let outcome = self.store.insert_replay(&again, window.id, original, now).await?;
        if !matches!(outcome, InsertOutcome::Inserted { .. }) {
            return Ok(None);
        }
        tracing::info!(route = route.name(), message_id = %rules::storable(&entry.message_id, 200), window = window.id, original, entry = outcome.id(), "a redelivery inside a replay window was stored as a new entry");
        self.metrics.ingested.get_or_create(&Metrics::outcome(route.name(), Stored::Replayed.as_str())).inc();
        Ok(Some(outcome))
    }

    async fn insert_alone(
        &self,
        route: &Route,
        mut entry: NewEntry,
        now: Millis,
    ) -> (NewEntry, Result<InsertOutcome, StoreError>) {
        let result = self.insert_one(route, &mut entry, now).await;
        (entry, result)
    }

    /// Inserts one row; if the database refuses it for what it holds, stores the
    /// message PARKED without its keys instead (`entry` becomes that row).
    async fn insert_one(&self, route: &Route, entry: &mut NewEntry, now: Millis) -> Result<InsertOutcome, StoreError> {
        match self.store.insert(entry, now).await {
            Err(error) if error.refuses_row() => {
                *entry = self.refused(route, entry, &error);
                self.store.insert(entry, now).await
            }
            result => result,
        }
    }

    /// Inserts `entries` in order, in one transaction when the database takes them
    /// all. When it refuses one for what it holds, the batch is split in halves (left
    /// first, so the inbox order holds) until each refused row is alone; that one is
    /// stored PARKED without its keys, the rest as they are. Any other error stops at
    /// once: everything from the failed part on is not committed.
    async fn insert_isolating(
        &self,
        route: &Route,
        entries: &mut [NewEntry],
        now: Millis,
    ) -> Result<Vec<InsertOutcome>, StoreError> {
        let mut outcomes = vec![None; entries.len()];
        // A stack of parts still to insert; the leftmost is on top.
        let mut parts: Vec<Range<usize>> = Vec::new();
        parts.push(0..entries.len());
        while let Some(part) = parts.pop() {
            match self.store.insert_batch(&entries[part.clone()], now).await {
                Ok(done) => {
                    for (slot, outcome) in outcomes[part].iter_mut().zip(done) {
                        *slot = Some(outcome);
                    }
                }
                Err(error) if error.refuses_row() && part.len() > 1 => {
                    let middle = part.start + part.len() / 2;
                    parts.push(middle..part.end);
                    parts.push(part.start..middle);
                }
                Err(error) if error.refuses_row() => {
                    let entry = &mut entries[part.start];
                    *entry = self.refused(route, entry, &error);
                    outcomes[part.start] = Some(self.store.insert(entry, now).await?);
                }
                Err(error) => return Err(error),
            }
        }
        Ok(outcomes.into_iter().map(|o| o.expect("every part was inserted")).collect())
    }

    /// The row for a message the database refused: PARKED, with the raw payload, the
    /// attributes and the database's error, but no decoded event, a dedup key made
    /// from the message id, and its own text fields made storable.
    fn refused(&self, route: &Route, entry: &NewEntry, error: &StoreError) -> NewEntry {
        let limits = &route.config.limits;
        let code = error.code().unwrap_or_else(|| "unknown".into());
        tracing::warn!(route = route.name(), message_id = %rules::storable(&entry.message_id, 200), code, %error, "the inbox refused the message for what it holds; parking it without its keys");
        self.metrics.store_refused.get_or_create(&Metrics::route(route.name())).inc();
        let reason = format!(
            "the inbox refused the message (code {code}): {error}; stored without its decoded event{}",
            entry.last_error.as_deref().map(|e| format!(" (before: {e})")).unwrap_or_default()
        );
        NewEntry {
            dedup_key: rules::message_id_key(&entry.message_id, limits),
            decoded: None,
            message_id: rules::storable(&entry.message_id, limits.max_reason_bytes).into_owned(),
            publish_time: entry.publish_time.as_deref().map(|t| rules::storable(t, 64).into_owned()),
            status: Status::Parked,
            last_error: Some(rules::storable(&reason, limits.max_reason_bytes).into_owned()),
            ..entry.clone()
        }
    }

    /// Runs the plugin's `decode` and turns its answer into the row to store, or
    /// into [`IngestError::PluginBusy`] while a transient fault has tries left.
    pub async fn decode(&self, route: &Route, msg: Incoming) -> Result<NewEntry, IngestError> {
        let mut wit_msg = wit::Message {
            data: msg.data.clone(),
            attributes: msg.attributes.clone(),
            message_id: msg.message_id.clone(),
            publish_time: msg.publish_time.clone(),
            delivery_attempt: msg.delivery_attempt,
        };
        let limits = &route.config.limits;
        let mut entry = NewEntry {
            route: route.name().to_string(),
            dedup_key: rules::message_id_key(&msg.message_id, limits),
            decoded: None,
            raw_data: msg.data,
            attributes: msg.attributes,
            message_id: msg.message_id,
            publish_time: msg.publish_time,
            delivery_attempt: msg.delivery_attempt.map(|a| a.min(i32::MAX as u32) as i32),
            status: Status::Parked,
            last_error: None,
        };
        if let Some(fetcher) = route.fetcher()
            && let Some(fetched) = fetcher.fetch(&entry.attributes).await
        {
            match fetched {
                Ok(bytes) => wit_msg.data = bytes,
                Err(error) => return self.fetch_failed(route, entry, error),
            }
        }
        let plugin = route.plugin();
        let started = std::time::Instant::now();
        // The shadow's copy is taken only when there is a candidate to hand it to.
        let shadow_copy = route.shadow().map(|_| wit_msg.clone());
        let answer = plugin.decode(wit_msg).await;
        self.metrics.plugin_call(route.name(), "decode", started);
        if let (Some(shadow), Some(message)) = (route.shadow(), shadow_copy) {
            shadow.offer(crate::shadow::Job::Decode { message, serving: crate::shadow::DecodeSide::of(&answer) });
        }
        let transient = answer.as_ref().err().is_some_and(PluginFault::is_transient);
        let tries = self.count_transient(route.name(), &entry.message_id, transient);
        match answer {
            Err(fault) if fault.is_transient() && tries < plugin.limits().timeout_tries => {
                tracing::warn!(route = route.name(), message_id = %entry.message_id, %fault, tries, "plugin could not decode the message in time; it will be redelivered");
                self.metrics.count_plugin_fault(route.name(), "decode", fault.kind());
                return Err(IngestError::PluginBusy(fault));
            }
            Ok(Ok(wit::Decoded::Event(ev))) => match rules::accept_event(&route.config, ev, &entry.attributes) {
                Err(violation) => {
                    tracing::warn!(route = route.name(), message_id = %entry.message_id, %violation, "decode answer broke an output rule; parking the message");
                    self.count_refused(route, "decode", &violation);
                    entry.last_error = Some(format!("decode output refused: {violation}"));
                }
                Ok(ev) => {
                    if let Some(key) = ev.dedup_key.filter(|k| !k.is_empty()) {
                        entry.dedup_key = key;
                    }
                    entry.decoded = Some(Decoded {
                        event_type: ev.event_type,
                        correlation_key: ev.correlation_key,
                        schema_version: ev.schema_version,
                        body: ev.body,
                    });
                    entry.status = Status::Open;
                }
            },
            Ok(Ok(wit::Decoded::Ignore(reason))) => {
                entry.status = Status::Ignored;
                entry.last_error = Some(format!("ignored by the plugin: {reason}"));
            }
            Ok(Err(e)) => {
                tracing::warn!(route = route.name(), message_id = %entry.message_id, error = %e.message, "message could not be decoded; parking it");
                entry.last_error = Some(format!("decode failed: {}", e.message));
            }
            Err(fault) => {
                tracing::error!(route = route.name(), message_id = %entry.message_id, %fault, "plugin failed during decode; parking the message");
                self.metrics.count_plugin_fault(route.name(), "decode", fault.kind());
                let tried = if fault.is_transient() { format!(" ({tries} times)") } else { String::new() };
                entry.last_error = Some(format!("plugin fault during decode: {fault}{tried}"));
            }
        }
        entry.last_error = entry.last_error.map(|e| rules::storable(&e, limits.max_reason_bytes).into_owned());
        Ok(entry)
    }

    /// A claim-check fetch that failed: a temporary failure is a nack while the
    /// message has tries left, else (and for a definitive one) the message is stored
    /// PARKED with the reason.
    fn fetch_failed(
        &self,
        route: &Route,
        mut entry: NewEntry,
        error: crate::claim_check::FetchError,
    ) -> Result<NewEntry, IngestError> {
        let reason = crate::telemetry::RouteReason { route: route.name().to_string(), reason: error.kind };
        self.metrics.fetch_failures.get_or_create(&reason).inc();
        let tries = self.count_transient(route.name(), &entry.message_id, error.transient);
        if error.transient && tries < route.config.limits.timeout_tries {
            tracing::warn!(route = route.name(), message_id = %entry.message_id, %error, tries, "could not fetch the message's payload; it will be redelivered");
            return Err(IngestError::FetchBusy(error));
        }
        tracing::warn!(route = route.name(), message_id = %entry.message_id, %error, "could not fetch the message's payload; parking the message");
        let tried = if error.transient { format!(" ({tries} times)") } else { String::new() };
        let limits = &route.config.limits;
        entry.last_error = Some(rules::storable(&format!("{error}{tried}"), limits.max_reason_bytes).into_owned());
        Ok(entry)
    }

    /// Counts a transient failure (a plugin fault, a fetch) for this message and
    /// returns how many it has had; any other answer forgets the message.
    fn count_transient(&self, route: &str, message_id: &str, transient: bool) -> u32 {
        let mut seen = self.transient.lock().expect("transient faults lock");
        let key = (route.to_string(), message_id.to_string());
        if !transient {
            seen.remove(&key);
            return 0;
        }
        if seen.len() >= TRANSIENT_MEMORY && !seen.contains_key(&key) {
            seen.clear();
        }
        let tries = seen.entry(key).or_insert(0);
        *tries += 1;
        *tries
    }

    /// Counts a plugin answer refused by an output rule.
    pub fn count_refused(&self, route: &Route, call: &'static str, violation: &rules::Violation) {
        self.metrics.count_refused(route.name(), call, violation.rule);
    }

    fn record(&self, route: &Route, entry: &NewEntry, result: &Result<InsertOutcome, StoreError>) {
        let outcome = match result {
            Ok(outcome) => *outcome,
            Err(error) => {
                tracing::error!(route = route.name(), message_id = %entry.message_id, %error, "could not store the message; it will be redelivered");
                self.metrics.ingest_failures.get_or_create(&Metrics::route(route.name())).inc();
                return;
            }
        };
        if let InsertOutcome::Conflict { existing, entry: conflict, first: true } = outcome {
            tracing::warn!(
                route = route.name(),
                dedup_key = %entry.dedup_key,
                existing,
                conflict_entry = conflict,
                "a different payload arrived under a known dedup key; parked it as its own entry"
            );
            self.metrics.dedup_conflicts.get_or_create(&Metrics::route(route.name())).inc();
        }
        let label = Stored::of(outcome, entry.status).as_str();
        self.metrics.ingested.get_or_create(&Metrics::outcome(route.name(), label)).inc();
    }
}

/// The open window, of `windows`, that a redelivery of `entry` falls in: by its publish
/// time (a message without one is never replayed), the oldest window first.
fn replay_window<'w>(windows: &'w [ReplayWindow], entry: &NewEntry) -> Option<&'w ReplayWindow> {
    let published = crate::pubsub_client::parse_time(entry.publish_time.as_deref()?).ok()?;
    let millis = crate::clock::millis_of(published);
    windows.iter().find(|w| w.covers(millis))
}

/// The span a message's decode and insert run in.
fn ingest_span(route: &Route, message_id: &str) -> tracing::Span {
    tracing::info_span!("ingest", route = route.name(), message_id = %rules::storable(message_id, 200))
}
