//! Operator actions: what a person does to the inbox by hand — requeue, park or
//! ignore an entry, pause or resume a route, purge finished entries, start a repair
//! job — each with its rules (the states it applies to, what a refusal says) and its
//! audit record, written once here.
//!
//! The admin API (and the console, which calls the API's handlers) and the command
//! line are transports over these: they parse the input, check access (roles and
//! routes are the API's business; the command line is whoever can read the inbox),
//! call the action and render its [outcome](Repaired) or [`Refusal`]. An action
//! takes an [`Operator`]: the store, the clock, how to reach the relays and the actor
//! the audit names, not the running application.
//!
//! Every action that reaches the store is audited, whether it was done, refused by
//! the entry's or the route's state (`conflict`) or failed; refusals of the input
//! (an empty reason, a rate out of range) change nothing and are not.

pub mod audit;
pub mod jobs;

use std::time::Duration;

use serde::Serialize;

use crate::clock::{Clock, Millis, rfc3339_millis};
use crate::config::edit::Step;
pub use crate::inbox::repair::RepairAction;
use crate::inbox::repair::{RepairFilter, RepairJob};
use crate::inbox::{
    AuditAction, AuditOutcome, NewAudit, NewReplayWindow, Pause, ReplayWindow, Status, Store, StoreError,
};
use crate::rollout::{RolloutError, Stepped};
use jobs::Matches;

/// Finished entries deleted per statement by a purge by hand.
const PURGE_BATCH: u32 = 10_000;

/// Wakes a route's relays in a running instance: its own relay at once, the other
/// instances through the inbox's announcements (`shared::Shared`).
pub trait Wake: Send + Sync {
    fn wake(&self, route: &str);
    /// Every route of the instance (a repair job whose filter names none).
    fn wake_all(&self);
}

/// How the relays hear that a route has entries to claim now.
#[derive(Clone, Copy)]
pub enum Relays<'a> {
    /// Acting inside a running instance.
    Here(&'a dyn Wake),
    /// Acting from outside any instance (the command line): announced through the
    /// inbox (`Store::announce`), best effort; a failure only costs the instances
    /// their poll interval.
    Elsewhere,
}

/// Who acts, and on what: everything an operator action needs.
pub struct Operator<'a> {
    store: &'a dyn Store,
    clock: &'a dyn Clock,
    relays: Relays<'a>,
    /// The name the audit log records: a token name, `loopback`, or `cli:<user>`.
    actor: String,
}

/// Whether a repair gives the relays something to claim: a requeued entry is due, an
/// ignored head no longer holds back its key.
fn frees_entries(action: RepairAction) -> bool {
    matches!(action, RepairAction::Requeue | RepairAction::Ignore)
}

/// Park and ignore say why, for whoever looks at the entry next.
fn needs_reason(action: RepairAction) -> bool {
    matches!(action, RepairAction::Park | RepairAction::Ignore)
}

/// The reason as the entry keeps it (`last_error`): `parked by hand: …`, so a reader
/// tells a person's verdict from the relay's.
fn entry_reason(action: RepairAction, reason: &str) -> String {
    format!("{} by hand: {reason}", action.past())
}

/// How a transport names its inputs, so a refusal of one points at what the caller
/// typed: the API's JSON fields or the command line's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inputs {
    Json,
    Flags,
}

/// Why someone acts: trimmed, never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason(String);

impl Reason {
    pub fn new(given: &str, inputs: Inputs) -> Result<Reason, Refusal> {
        let reason = given.trim();
        if reason.is_empty() {
            return Err(Refusal::EmptyReason { inputs });
        }
        Ok(Reason(reason.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One entry's repair by hand, with what it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryRepair {
    Requeue,
    Park(Reason),
    Ignore(Reason),
}

impl EntryRepair {
    pub fn action(&self) -> RepairAction {
        match self {
            EntryRepair::Requeue => RepairAction::Requeue,
            EntryRepair::Park(_) => RepairAction::Park,
            EntryRepair::Ignore(_) => RepairAction::Ignore,
        }
    }

    fn reason(&self) -> Option<&Reason> {
        match self {
            EntryRepair::Requeue => None,
            EntryRepair::Park(r) | EntryRepair::Ignore(r) => Some(r),
        }
    }
}

/// A repair of one entry that was done: the entry, the action, and the state the
/// entry is in now (`POST /api/entries/{id}/…`, `inlet inbox … --json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Repaired {
    pub entry: i64,
    pub action: RepairAction,
    pub status: Status,
}

/// A purge that was done (`POST /api/purge`).
#[derive(Debug, Serialize)]
pub struct Purged {
    /// Entries deleted.
    pub purged: u64,
    pub older_than: String,
}

/// A route's pause: since when, by whom, why.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PauseView {
    pub since: Millis,
    pub by: String,
    pub reason: String,
}

impl From<Pause> for PauseView {
    fn from(p: Pause) -> PauseView {
        PauseView { since: p.paused_at, by: p.paused_by, reason: p.reason }
    }
}

impl PauseView {
    /// The pause as a sentence: `by ops at 2026-08-01T10:00:00Z: reason`.
    pub fn sentence(&self) -> String {
        let at = std::time::UNIX_EPOCH + Duration::from_millis(self.since.max(0) as u64);
        format!("by {} at {}: {}", self.by, humantime::format_rfc3339_seconds(at), self.reason)
    }
}

/// A route paused or resumed: the route and its pause now (`null` once resumed).
#[derive(Debug, Serialize)]
pub struct RoutePaused {
    pub route: String,
    pub paused: Option<PauseView>,
}

/// A repair job as asked, checked: a rate a job may run at, and the reason park and
/// ignore need (as the entries will keep it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPlan {
    pub action: RepairAction,
    /// Entries per second.
    pub rate: u32,
    reason: Option<String>,
}

impl JobPlan {
    pub fn new(action: RepairAction, reason: Option<&str>, rate: u32, inputs: Inputs) -> Result<JobPlan, Refusal> {
        if rate == 0 || rate > jobs::MAX_RATE {
            return Err(Refusal::Rate { inputs });
        }
        let reason = match reason.map(str::trim).filter(|r| !r.is_empty()) {
            Some(r) if needs_reason(action) => Some(entry_reason(action, r)),
            None if needs_reason(action) => return Err(Refusal::NeedsReason { action, inputs }),
            // A requeue keeps no reason in its entries; the job keeps it for people.
            _ => reason.map(str::to_string),
        };
        Ok(JobPlan { action, rate, reason })
    }
}

/// The longest a replay window stays open: long enough for a seek of a week's
/// retention to be delivered, short enough that a forgotten window does not turn an
/// ordinary redelivery of next month into a new entry.
pub const MAX_REPLAY_OPEN: Duration = Duration::from_secs(7 * 86_400);

/// A replay window with the entries it made, each with the entry it was made from
/// (`GET /api/replays/{id}`, `inlet route replays --window ID`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayEntries {
    pub window: ReplayWindow,
    pub entries: Vec<ReplayMade>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayMade {
    pub entry: i64,
    pub original: i64,
}

impl ReplayEntries {
    /// `window` with the entries it has made so far.
    pub async fn of(store: &dyn Store, window: ReplayWindow) -> Result<ReplayEntries, StoreError> {
        let entries = store.replay_entries(window.id).await?;
        let entries = entries.into_iter().map(|(entry, original)| ReplayMade { entry, original }).collect();
        Ok(ReplayEntries { window, entries })
    }
}

/// Why an operator action did not happen (or did not finish).
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("no entry {0}")]
    NoEntry(i64),
    /// The entry is in a state the repair does not apply to.
    #[error("entry {entry} is {now}; {action} applies to {} entries", .action.applies_to())]
    NotApplicable { entry: i64, action: RepairAction, now: Status },
    /// The repair left the entry as it was, and the entry cannot be read to say why.
    #[error("entry {entry} was left as it is, and cannot be read now: {error}")]
    Unexplained { entry: i64, error: StoreError },
    /// The refusals of input name it as the caller typed it: a JSON field or a flag.
    #[error("{} must not be empty", match .inputs { Inputs::Json => "`reason`", Inputs::Flags => "--reason" })]
    EmptyReason { inputs: Inputs },
    #[error("{action} needs {}", match .inputs { Inputs::Json => "a `reason`", Inputs::Flags => "--reason" })]
    NeedsReason { action: RepairAction, inputs: Inputs },
    #[error("{}", match .inputs {
        Inputs::Json => format!("rate must be between 1 and {} entries per second", jobs::MAX_RATE),
        Inputs::Flags => format!("--rate must be between 1 and {}", jobs::MAX_RATE),
    })]
    Rate { inputs: Inputs },
    #[error("route `{route}` is already paused{}", .since.as_ref().map(|p| format!(" ({})", p.sentence())).unwrap_or_default())]
    AlreadyPaused { route: String, since: Option<PauseView> },
    #[error("route `{0}` is not paused")]
    NotPaused(String),
    /// A replay window's publish times: `from` must come before `to`.
    #[error("a replay window's start ({from}) must come before its end ({to})")]
    EmptyReplay { from: String, to: String },
    #[error("a replay window must stay open for at least a second and at most {} days", MAX_REPLAY_OPEN.as_secs() / 86_400)]
    ReplayOpenFor,
    /// Two open windows of one route may not share publish times: which one a
    /// redelivery belongs to would depend on the order they were opened in.
    #[error(
        "route `{route}` already has replay window {window} open over part of those publish times (close it first: `inlet route replay-close {window}`)"
    )]
    ReplayOverlaps { route: String, window: i64 },
    #[error("no open replay window {0}")]
    NoOpenReplay(i64),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A store answer `true` for done, `false` for refused by the state it found.
fn outcome_of(result: &Result<bool, StoreError>) -> AuditOutcome {
    match result {
        Ok(true) => AuditOutcome::Ok,
        Ok(false) => AuditOutcome::Conflict,
        Err(_) => AuditOutcome::Failed,
    }
}

impl<'a> Operator<'a> {
    pub fn new(store: &'a dyn Store, clock: &'a dyn Clock, relays: Relays<'a>, actor: impl Into<String>) -> Self {
        Operator { store, clock, relays, actor: actor.into() }
    }

    /// Repairs entry `id` by hand. Audited with the route the entry is on, read after
    /// the repair; a refusal says what the entry is now (it may have moved since the
    /// caller last saw it).
    pub async fn repair(&self, id: i64, repair: &EntryRepair) -> Result<Repaired, Refusal> {
        let action = repair.action();
        let now = self.clock.now();
        let result = match repair {
            EntryRepair::Requeue => self.store.requeue(id, now).await,
            EntryRepair::Park(r) => self.store.park(id, &entry_reason(action, r.as_str()), now).await,
            EntryRepair::Ignore(r) => self.store.ignore(id, &entry_reason(action, r.as_str()), now).await,
        };
        let outcome = outcome_of(&result);
        let (route, answer) = match result {
            Ok(true) => {
                let route = self.store.get(id).await.ok().flatten().map(|e| e.route);
                if let Some(route) = route.as_deref().filter(|_| frees_entries(action)) {
                    self.wake(route).await;
                }
                (route, Ok(Repaired { entry: id, action, status: action.becomes() }))
            }
            Ok(false) => match self.store.get(id).await {
                Ok(Some(e)) => (Some(e.route), Err(Refusal::NotApplicable { entry: id, action, now: e.status })),
                Ok(None) => (None, Err(Refusal::NoEntry(id))),
                Err(error) => (None, Err(Refusal::Unexplained { entry: id, error })),
            },
            Err(e) => (None, Err(Refusal::Store(e))),
        };
        let detail = repair.reason().map(|r| r.as_str().to_string());
        self.audit(action.into(), route, format!("entry {id}"), outcome, detail).await;
        answer
    }

    /// Pauses `route` for every instance: from the commit on no claim takes its
    /// entries; attempts in flight finish; pushes and pulls go on filling the inbox.
    /// The first pause stands: a second is refused, naming it.
    pub async fn pause(&self, route: &str, reason: Reason) -> Result<RoutePaused, Refusal> {
        let pause = Pause {
            route: route.to_string(),
            paused_at: self.clock.now(),
            paused_by: self.actor.clone(),
            reason: reason.0,
        };
        let result = self.store.pause_route(&pause).await;
        self.audit_route(AuditAction::Pause, route, outcome_of(&result), Some(pause.reason.clone())).await;
        if !result? {
            let since = self.store.paused_routes(Some(route)).await?.pop().map(PauseView::from);
            return Err(Refusal::AlreadyPaused { route: route.to_string(), since });
        }
        Ok(RoutePaused { route: route.to_string(), paused: Some(pause.into()) })
    }

    /// Resumes a paused route: its entries are claimed again (by an instance this
    /// runs in at once, by the others within their poll interval).
    pub async fn resume(&self, route: &str) -> Result<RoutePaused, Refusal> {
        let result = self.store.resume_route(route).await;
        self.audit_route(AuditAction::Resume, route, outcome_of(&result), None).await;
        if !result? {
            return Err(Refusal::NotPaused(route.to_string()));
        }
        self.wake(route).await;
        Ok(RoutePaused { route: route.to_string(), paused: None })
    }

    /// Opens a replay window on `route` over the publish times `published` (from
    /// inclusive, to exclusive), for `open_for`: until then, a redelivery of a
    /// message published inside it whose entry arrived before now is stored once more
    /// as a new entry (see [`crate::inbox::ReplayWindow`]). The seek that brings the
    /// messages back is the caller's next step (`inlet pubsub seek`).
    pub async fn open_replay(
        &self,
        route: &str,
        published: std::ops::Range<Millis>,
        open_for: Duration,
        reason: Reason,
    ) -> Result<ReplayWindow, Refusal> {
        if published.is_empty() {
            return Err(Refusal::EmptyReplay {
                from: rfc3339_millis(published.start),
                to: rfc3339_millis(published.end),
            });
        }
        if open_for < Duration::from_secs(1) || open_for > MAX_REPLAY_OPEN {
            return Err(Refusal::ReplayOpenFor);
        }
        let now = self.clock.now();
        let open = self.store.replay_windows(Some(route), Some(now)).await?;
        let subject = format!(
            "route {route}, published from {} to {}",
            rfc3339_millis(published.start),
            rfc3339_millis(published.end)
        );
        if let Some(other) = open.iter().find(|w| w.published_from < published.end && published.start < w.published_to)
        {
            let refusal = Refusal::ReplayOverlaps { route: route.to_string(), window: other.id };
            self.audit(
                AuditAction::ReplayOpen,
                Some(route.into()),
                subject,
                AuditOutcome::Conflict,
                Some(refusal.to_string()),
            )
            .await;
            return Err(refusal);
        }
        let window = NewReplayWindow {
            route: route.to_string(),
            published_from: published.start,
            published_to: published.end,
            opened_at: now,
            closes_at: now.saturating_add(i64::try_from(open_for.as_millis()).unwrap_or(i64::MAX)),
            opened_by: self.actor.clone(),
            reason: reason.0,
        };
        let opened = self.store.open_replay_window(&window).await;
        let (outcome, detail) = match &opened {
            Ok(id) => (
                AuditOutcome::Ok,
                format!("window {id}, open until {}: {}", rfc3339_millis(window.closes_at), window.reason),
            ),
            Err(_) => (AuditOutcome::Failed, window.reason.clone()),
        };
        self.audit(AuditAction::ReplayOpen, Some(route.into()), subject, outcome, Some(detail)).await;
        let NewReplayWindow { route, published_from, published_to, opened_at, closes_at, opened_by, reason } = window;
        Ok(ReplayWindow {
            id: opened?,
            route,
            published_from,
            published_to,
            opened_at,
            closes_at,
            closed_at: None,
            opened_by,
            reason,
            taken: 0,
        })
    }

    /// Closes replay window `id` before its time: redeliveries are duplicates again.
    /// What it stored stays.
    pub async fn close_replay(&self, id: i64) -> Result<ReplayWindow, Refusal> {
        let window = self.store.replay_window(id).await?;
        let result = self.store.close_replay_window(id, self.clock.now()).await;
        let route = window.as_ref().map(|w| w.route.clone());
        self.audit(AuditAction::ReplayClose, route, format!("replay window {id}"), outcome_of(&result), None).await;
        match (result?, window) {
            (true, Some(window)) => Ok(self.store.replay_window(id).await?.unwrap_or(window)),
            _ => Err(Refusal::NoOpenReplay(id)),
        }
    }

    /// Deletes DONE and IGNORED entries finished more than `older_than` ago (never
    /// PARKED ones); `asked` is the age as the caller wrote it, which the answer and
    /// the audit repeat.
    pub async fn purge(&self, older_than: Duration, asked: &str) -> Result<Purged, Refusal> {
        let before = crate::clock::ago(self.clock.now(), older_than);
        let mut deleted = 0;
        let result = crate::inbox::purge_counting(self.store, before, PURGE_BATCH, Duration::ZERO, &mut deleted).await;
        let subject = format!("DONE and IGNORED entries finished more than {asked} ago");
        let outcome = if result.is_ok() { AuditOutcome::Ok } else { AuditOutcome::Failed };
        self.audit(AuditAction::Purge, None, subject, outcome, Some(format!("{deleted} deleted"))).await;
        result?;
        Ok(Purged { purged: deleted, older_than: asked.to_string() })
    }

    /// Creates the repair job `plan` describes over `filter`, which `matches` (its
    /// dry run) found; a running Inlet carries it out ([`jobs::run`]). Returns
    /// the job's id.
    pub async fn start_job(&self, plan: &JobPlan, filter: &RepairFilter, matches: &Matches) -> Result<i64, Refusal> {
        let now = self.clock.now();
        let (action, rate) = (plan.action, plan.rate);
        let created = self
            .store
            .create_repair_job(action, filter, plan.reason.as_deref(), rate, &self.actor, matches.count, now)
            .await;
        let (outcome, detail) = match &created {
            Ok(job) => (AuditOutcome::Started, format!("job {job}: {} matching, at {rate}/s", matches.count)),
            Err(_) => (AuditOutcome::Failed, format!("{} matching, at {rate}/s", matches.count)),
        };
        self.audit(AuditAction::Repair(action), filter.route.clone(), filter.describe(), outcome, Some(detail)).await;
        Ok(created?)
    }

    /// Records a rollout step (`crate::rollout::step`) on `route` as it ended: the
    /// transports carry the step out (it blocks) and call this with its result.
    pub async fn record_rollout(&self, step: Step, route: &str, result: &Result<Stepped, RolloutError>) {
        let action = match step {
            Step::Promote => AuditAction::Promote,
            Step::Rollback => AuditAction::Rollback,
        };
        let (outcome, detail) = match result {
            Ok(done) => (AuditOutcome::Ok, done.detail()),
            Err(e) if e.is_conflict() => (AuditOutcome::Refused, e.to_string()),
            Err(e) => (AuditOutcome::Failed, e.to_string()),
        };
        self.audit_route(action, route, outcome, Some(detail)).await;
    }

    /// Records a reload by hand (`POST /api/reload`) with its report; `refused` when
    /// the routing files or a plugin were refused.
    pub async fn record_reload(&self, refused: bool, report: String) {
        let outcome = if refused { AuditOutcome::Refused } else { AuditOutcome::Ok };
        self.audit(AuditAction::Reload, None, "routing file and plugins".into(), outcome, Some(report)).await;
    }

    /// Records that repair job `job` finished (the operator is the job itself).
    pub async fn job_done(&self, job: &RepairJob) {
        let detail = Some(format!("{} entries changed", job.moved));
        self.audit(
            AuditAction::Repair(job.action),
            job.filter.route.clone(),
            job.filter.describe(),
            AuditOutcome::Done,
            detail,
        )
        .await;
    }

    /// Tells the relays of `route` it has entries to claim now.
    async fn wake(&self, route: &str) {
        match self.relays {
            Relays::Here(relays) => relays.wake(route),
            Relays::Elsewhere => {
                if let Err(error) = self.store.announce(&[route.to_string()]).await {
                    tracing::debug!(%error, "could not announce the repair to running instances");
                }
            }
        }
    }

    async fn audit_route(&self, action: AuditAction, route: &str, outcome: AuditOutcome, detail: Option<String>) {
        self.audit(action, Some(route.to_string()), format!("route {route}"), outcome, detail).await;
    }

    async fn audit(
        &self,
        action: AuditAction,
        route: Option<String>,
        subject: String,
        outcome: AuditOutcome,
        detail: Option<String>,
    ) {
        let audit = NewAudit { actor: self.actor.clone(), action, route, subject, outcome, detail };
        audit::record(self.store, audit, self.clock.now()).await;
    }
}
