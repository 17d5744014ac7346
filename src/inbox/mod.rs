//! The transactional inbox: every message Inlet accepted, and what became of it.
//!
//! One [`Store`] trait, two implementations with the same behaviour (proven by one
//! conformance suite in `tests/conformance.rs`): [`sqlite`] for one embedded
//! instance, [`postgres`] for production and many instances. Both are generated from
//! one body (`store_impl!` in [`sqlstore`]) over mostly shared SQL in `sql/`; only the
//! schema and the claim differ.
//!
//! Times are milliseconds since the Unix epoch (`BIGINT`), taken from the caller's
//! [`crate::clock::Clock`], which follows the database's clock.

pub mod backup;
mod db_clock;
pub mod failures;
pub mod group;
pub mod repair;

/// The candidates of a claim: `$1` route, `$2` now, `$3` ordered, `$4` parked blocks
/// the key, `$5` how many; OPEN and due, oldest first, each the head of its key
/// (`sql/claim_eligible.sql`) when the route is ordered.
macro_rules! claim_where {
    () => {
        concat!(
            "    SELECT e.id FROM inbox_entry e\n",
            "    WHERE e.route = $1 AND e.status = 'OPEN' AND e.next_attempt_at <= $2\n",
            include_str!("sql/claim_eligible.sql"),
            "    ORDER BY e.id\n",
            "    LIMIT $5\n"
        )
    };
}

/// Binds the parameters of `sql/insert.sql` (`$1`–`$18`, in its order) for the entry
/// `$e` stored under `$dedup_key` with `$status`: the one insert and each row of
/// SQLite's multi-row insert bind through this, so the two cannot drift apart.
macro_rules! bind_entry {
    ($query:expr, $e:expr, $dedup_key:expr, $digest:expr, $conflict_of:expr, $status:expr, $last_error:expr, $now:expr) => {{
        let e: &$crate::inbox::NewEntry = $e;
        let d = e.decoded.as_ref();
        let status: $crate::inbox::Status = $status;
        let last_error: Option<&str> = $last_error;
        let now: $crate::clock::Millis = $now;
        let finished = matches!(status, $crate::inbox::Status::Done | $crate::inbox::Status::Ignored).then_some(now);
        $query
            .bind(&e.route)
            .bind($dedup_key)
            .bind(d.map(|d| d.correlation_key.as_str()))
            .bind(d.map(|d| d.event_type.as_str()))
            .bind(d.and_then(|d| d.schema_version.as_deref()))
            .bind(d.map(|d| d.body.as_slice()))
            .bind(e.raw_data.as_slice())
            .bind(serde_json::to_string(&e.attributes).expect("string pairs serialize"))
            .bind(&e.message_id)
            .bind(e.publish_time.as_deref())
            .bind(e.delivery_attempt)
            .bind($digest)
            .bind($conflict_of)
            .bind(status.as_str())
            .bind(now)
            .bind(last_error)
            .bind(finished)
            .bind(last_error.map($crate::inbox::failures::fingerprint))
    }};
}

#[cfg(test)]
mod lint;
mod sql_text;
mod sqlstore;
mod warm;

pub mod postgres;
pub mod schema;
pub mod sqlite;

pub use db_clock::DbClock;
pub use schema::{MigrateMode, SchemaError};
pub use sqlite::InstanceLock;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use crate::clock::Millis;

/// One settle of a batch ([`Store::settle_batch`]).
#[derive(Debug, Clone)]
pub struct SettleRequest {
    pub id: i64,
    pub lease: Lease,
    pub now: Millis,
    pub settlement: Settlement,
    pub attempt: Option<failures::Attempt>,
    /// With a settle that resolves an entry of a per-key route: claim the key's next
    /// entry in the same transaction, if it is due and free ([`Store::settle_batch`]).
    pub next: Option<NextOfKey>,
}

/// The claim a settle may make for the slot it frees: the next entry of the settled
/// entry's key, under a lease of the same owner. Only a per-key route asks: its key's
/// next entry cannot be claimed by anyone while the settled one is in flight, so the
/// settle that ends it is where that entry becomes claimable, and handing it on there
/// saves the key a claim of its own (a transaction of four statements) and the wait
/// for the relay's next one.
#[derive(Debug, Clone)]
pub struct NextOfKey {
    pub route: String,
    pub key: String,
    pub lease_ms: i64,
    /// Whether a PARKED entry holds back later entries of its key.
    pub parked_blocks: bool,
}

/// Where an entry is in its life. Enforced by the `inbox_entry_status` CHECK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    /// Waiting for delivery (possibly for `next_attempt_at`).
    Open,
    /// Claimed by a worker holding an unexpired lease.
    InProgress,
    /// Delivered and acknowledged by the target.
    Done,
    /// Needs a person: decode failure, permanent refusal, attempts or deadline spent.
    Parked,
    /// Finished on purpose without delivery; the reason is in `last_error`.
    Ignored,
}

impl Status {
    pub const ALL: [Status; 5] = [Status::Open, Status::InProgress, Status::Done, Status::Parked, Status::Ignored];

    /// OPEN, IN_PROGRESS or PARKED: not finished, someone (the relay or a person)
    /// still has to act.
    pub fn is_unresolved(self) -> bool {
        matches!(self, Status::Open | Status::InProgress | Status::Parked)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Open => "OPEN",
            Status::InProgress => "IN_PROGRESS",
            Status::Done => "DONE",
            Status::Parked => "PARKED",
            Status::Ignored => "IGNORED",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Status::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s) || st.as_str().replace('_', "-").eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown status `{s}` (expected open, in-progress, done, parked or ignored)"))
    }
}

/// The decoded facts of an event, as the plugin produced them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub event_type: String,
    pub correlation_key: String,
    pub schema_version: Option<String>,
    pub body: Vec<u8>,
}

/// A message ready to be stored. `decoded` is `None` when decoding failed (the entry
/// is then stored PARKED) or was not attempted.
#[derive(Debug, Clone)]
pub struct NewEntry {
    pub route: String,
    pub dedup_key: String,
    pub decoded: Option<Decoded>,
    pub raw_data: Vec<u8>,
    pub attributes: Vec<(String, String)>,
    pub message_id: String,
    pub publish_time: Option<String>,
    pub delivery_attempt: Option<i32>,
    /// OPEN, PARKED or IGNORED.
    pub status: Status,
    /// The decode error (PARKED) or the ignore reason (IGNORED).
    pub last_error: Option<String>,
}

impl NewEntry {
    /// Hex SHA-256 of the payload: how a redelivery is told from a different message
    /// that reuses a dedup key.
    pub fn payload_digest(&self) -> String {
        digest_hex(&self.raw_data)
    }
}

pub fn digest_hex(data: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(64);
    for b in Sha256::digest(data) {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
    out
}

/// What storing a message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertOutcome {
    /// A new entry.
    Inserted { id: i64 },
    /// The same payload under a known dedup key: a redelivery, nothing stored.
    /// `replay_open`: whether a replay window of the route was open when the store
    /// answered (the insert's own statement looks, so a redelivery costs no question
    /// of its own where no window is open); only then may ingest store it again.
    Duplicate { id: i64, replay_open: bool },
    /// A different payload under a known dedup key: stored PARKED as its own entry
    /// (`entry`) that points at the `existing` one, for a person to judge. `first` is
    /// false when this conflicting payload was already stored (a redelivery of it),
    /// so a conflict is logged and counted once, not at every redelivery.
    Conflict { existing: i64, entry: i64, first: bool },
}

impl InsertOutcome {
    pub fn id(self) -> i64 {
        match self {
            InsertOutcome::Inserted { id } | InsertOutcome::Duplicate { id, .. } => id,
            InsertOutcome::Conflict { entry, .. } => entry,
        }
    }
}

/// One stored entry.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Entry {
    pub id: i64,
    pub route: String,
    pub dedup_key: String,
    pub correlation_key: Option<String>,
    pub event_type: Option<String>,
    pub schema_version: Option<String>,
    #[serde(skip)]
    pub body: Option<Vec<u8>>,
    #[serde(skip)]
    pub raw_data: Vec<u8>,
    pub attributes: Vec<(String, String)>,
    pub message_id: String,
    pub publish_time: Option<String>,
    pub delivery_attempt: Option<i32>,
    pub payload_digest: String,
    pub conflict_of: Option<i64>,
    pub status: Status,
    pub attempts: i32,
    pub next_attempt_at: Millis,
    pub lease_owner: Option<String>,
    pub lease_token: i64,
    pub lease_expires_at: Option<Millis>,
    pub last_error: Option<String>,
    pub received_at: Millis,
    /// When the current run's first NOT-YET answer came; `None` before one, and
    /// again after a requeue. The not-yet deadline counts from here.
    pub not_yet_since: Option<Millis>,
    pub updated_at: Millis,
    pub finished_at: Option<Millis>,
    /// What of the stored row could not be read, when something could not (its
    /// attributes, then shown as none): such an entry can still be listed, shown and
    /// repaired by hand, but the claim that meets it parks it instead of delivering it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

impl Entry {
    /// The decoded event, unless the entry was parked before it could be decoded.
    pub fn decoded(&self) -> Option<Decoded> {
        Some(Decoded {
            event_type: self.event_type.clone()?,
            correlation_key: self.correlation_key.clone()?,
            schema_version: self.schema_version.clone(),
            body: self.body.clone()?,
        })
    }
}

/// Proof of a claim: only the holder of the current token may settle the entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub owner: String,
    pub token: i64,
    pub expires_at: Millis,
}

#[derive(Debug, Clone)]
pub struct Claimed {
    pub entry: Entry,
    pub lease: Lease,
}

#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    pub route: &'a str,
    pub owner: &'a str,
    pub limit: u32,
    pub now: Millis,
    pub lease_ms: i64,
    /// Per-key ordering: skip entries whose key has an older unresolved entry or an
    /// entry in flight.
    pub ordered: bool,
    /// Whether a PARKED entry holds back later entries of its key.
    pub parked_blocks: bool,
    /// On an ordered route, only the keys of this part (entries without a key are
    /// everyone's); `None`: every key. See [`Store::share`].
    pub share: Option<Share>,
}

/// An instance's part of a route's keys: those whose hash, modulo `count`, is `index`
/// ([`Store::share`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub index: u32,
    pub count: u32,
}

/// What an instance tells the others about a route it relays ([`Store::share`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// It relays the route; it counts as gone once `ttl` passes without saying so again.
    Here { ttl: std::time::Duration },
    /// It stops relaying the route: its part goes to the others at their next look.
    Leaving,
}

/// How an attempt ended, as the store records it.
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    Done,
    Ignored {
        reason: String,
    },
    /// Back to OPEN until `at`; `error` is kept as the last error. `not_yet_since`
    /// (a NOT-YET answer) starts the not-yet clock if it is not running yet.
    Retry {
        at: Millis,
        error: String,
        not_yet_since: Option<Millis>,
    },
    Parked {
        error: String,
    },
    /// A requeued entry that had never been decoded was decoded now: store the event
    /// and make it OPEN again, so ordering applies before it is delivered. The entry
    /// takes the plugin's `dedup_key` when it gave one (it was stored under its message
    /// id); if another entry of the route holds that key the settle fails with
    /// [`StoreError::holds_dedup_key`] and nothing changes, so one event is never
    /// stored, and delivered, twice under two keys.
    Decoded {
        decoded: Decoded,
        dedup_key: Option<String>,
    },
}

/// The columns a settle writes, as both settle statements (one entry, or a batch)
/// bind them; `None` keeps what the row holds.
pub(crate) struct SettleColumns<'a> {
    pub status: Status,
    pub next_attempt_at: Option<Millis>,
    pub error: Option<&'a str>,
    pub finished_at: Option<Millis>,
    pub decoded: Option<&'a Decoded>,
    /// Attempts start over (a requeued entry decoded again).
    pub reset: bool,
    pub not_yet_since: Option<Millis>,
    pub dedup_key: Option<&'a str>,
}

impl Settlement {
    pub(crate) fn columns(&self, now: Millis) -> SettleColumns<'_> {
        let mut c = SettleColumns {
            status: Status::Open,
            next_attempt_at: None,
            error: None,
            finished_at: None,
            decoded: None,
            reset: false,
            not_yet_since: None,
            dedup_key: None,
        };
        match self {
            Settlement::Done => (c.status, c.finished_at) = (Status::Done, Some(now)),
            Settlement::Ignored { reason } => {
                (c.status, c.error, c.finished_at) = (Status::Ignored, Some(reason.as_str()), Some(now))
            }
            Settlement::Retry { at, error, not_yet_since } => {
                (c.next_attempt_at, c.error, c.not_yet_since) = (Some(*at), Some(error.as_str()), *not_yet_since)
            }
            Settlement::Parked { error } => (c.status, c.error) = (Status::Parked, Some(error.as_str())),
            Settlement::Decoded { decoded, dedup_key } => {
                (c.next_attempt_at, c.decoded, c.reset, c.dedup_key) =
                    (Some(now), Some(decoded), true, dedup_key.as_deref())
            }
        }
        c
    }
}

#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub route: Option<String>,
    pub status: Option<Status>,
    pub correlation_key: Option<String>,
    /// Exactly this error fingerprint (a failure group).
    pub fingerprint: Option<String>,
    /// The last error contains this text.
    pub error_text: Option<String>,
    /// Entries with an id greater than this (for paging).
    pub after_id: Option<i64>,
    pub limit: u32,
    /// Newest (highest id) first instead of oldest first.
    pub newest_first: bool,
}

/// Counts for metrics and `inbox stats`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RouteStatusCount {
    pub route: String,
    pub status: Status,
    pub count: i64,
    /// `received_at` of the oldest entry in this state.
    pub oldest_received_at: Option<Millis>,
}

/// Keys of a route that are held up: the head (oldest unresolved entry) of the key is
/// PARKED and the route blocks on parked entries, or an entry of the key waits behind
/// an older unresolved one. A busy key shows here for a moment between deliveries; a
/// stuck key stays, and its head gets older.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct BlockedKeys {
    pub keys: i64,
    /// `received_at` of the oldest head among them.
    pub oldest_head_received_at: Option<Millis>,
}

/// Entries of a route finished DONE in one bucket of time (`GET /console`'s
/// throughput sparkline).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Throughput {
    pub route: String,
    /// Which bucket: 0 for `[since, since + bucket)`, 1 for the next, …
    pub bucket: i64,
    pub done: i64,
}

/// `text` as a LIKE pattern that finds it anywhere (`%`, `_` and `\` in it taken
/// literally, `\` the escape).
pub fn contains_pattern(text: &str) -> String {
    let escaped: String =
        text.chars().flat_map(|c| if matches!(c, '%' | '_' | '\\') { vec!['\\', c] } else { vec![c] }).collect();
    format!("%{escaped}%")
}

/// A paused route: no instance claims its entries until it is resumed; ingest goes on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Pause {
    pub route: String,
    /// When it was paused.
    pub paused_at: Millis,
    /// Who paused it: a token name, `loopback`, or `cli:<user>`.
    pub paused_by: String,
    pub reason: String,
}

/// A replay window to open ([`Store::open_replay_window`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewReplayWindow {
    pub route: String,
    /// Publish times taken: from (inclusive) to (exclusive).
    pub published_from: Millis,
    pub published_to: Millis,
    pub opened_at: Millis,
    pub closes_at: Millis,
    /// A token name, `loopback`, or `cli:<user>`.
    pub opened_by: String,
    pub reason: String,
}

/// A replay window: while it is open, a redelivery of a message published inside it,
/// whose entry arrived before the window opened, is stored once more as a new entry
/// (dedup key [`replay_dedup_key`]); every other redelivery stays a duplicate.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReplayWindow {
    pub id: i64,
    pub route: String,
    pub published_from: Millis,
    pub published_to: Millis,
    pub opened_at: Millis,
    pub closes_at: Millis,
    /// When it was closed by hand, before `closes_at`.
    pub closed_at: Option<Millis>,
    pub opened_by: String,
    pub reason: String,
    /// The entries it has stored so far.
    pub taken: i64,
}

impl ReplayWindow {
    /// Whether redeliveries are still taken at `now`.
    pub fn is_open(&self, now: Millis) -> bool {
        self.closed_at.is_none() && now < self.closes_at
    }

    /// Whether a message published at `published` (milliseconds) is inside.
    pub fn covers(&self, published: Millis) -> bool {
        (self.published_from..self.published_to).contains(&published)
    }
}

/// The dedup key a replay window stores a message again under: one entry per message
/// and window, so a second redelivery inside the window is a duplicate of the first.
pub fn replay_dedup_key(dedup_key: &str, window: i64) -> String {
    format!("{dedup_key}#replay-{window}")
}

/// A repair action as the audit log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAudit {
    /// A token name, `loopback`, `cli:<user>` or `job:<id>`.
    pub actor: String,
    pub action: AuditAction,
    /// The route acted on, when the action concerns one.
    pub route: Option<String>,
    /// The entries or the filter acted on, e.g. `entry 42`, `finished before 1700000000000`.
    pub subject: String,
    pub outcome: AuditOutcome,
    pub detail: Option<String>,
}

/// What an audited operator action was. Stored by name (`inbox_audit.action`); records
/// are read back as text, so a name once written must keep its meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditAction {
    Requeue,
    Park,
    Ignore,
    Pause,
    Resume,
    Purge,
    /// A repair job: created (`started`) and finished (`done`).
    Repair(repair::RepairAction),
    Promote,
    Rollback,
    Reload,
    ReplayOpen,
    ReplayClose,
}

impl AuditAction {
    pub fn as_str(self) -> &'static str {
        use repair::RepairAction as R;
        match self {
            AuditAction::Requeue => "requeue",
            AuditAction::Park => "park",
            AuditAction::Ignore => "ignore",
            AuditAction::Pause => "pause",
            AuditAction::Resume => "resume",
            AuditAction::Purge => "purge",
            AuditAction::Repair(R::Requeue) => "repair-requeue",
            AuditAction::Repair(R::Park) => "repair-park",
            AuditAction::Repair(R::Ignore) => "repair-ignore",
            AuditAction::Promote => "promote",
            AuditAction::Rollback => "rollback",
            AuditAction::Reload => "reload",
            AuditAction::ReplayOpen => "replay-open",
            AuditAction::ReplayClose => "replay-close",
        }
    }
}

impl From<repair::RepairAction> for AuditAction {
    /// A repair of one entry by hand.
    fn from(action: repair::RepairAction) -> AuditAction {
        match action {
            repair::RepairAction::Requeue => AuditAction::Requeue,
            repair::RepairAction::Park => AuditAction::Park,
            repair::RepairAction::Ignore => AuditAction::Ignore,
        }
    }
}

/// How an audited action ended. Stored by name (`inbox_audit.outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditOutcome {
    Ok,
    /// Refused by the state of what it acts on (the API's 409).
    Conflict,
    /// Refused for what it was asked to apply (a reload's or rollout's files).
    Refused,
    Failed,
    /// A repair job was created; the job records `done` when it is.
    Started,
    /// A repair job finished.
    Done,
}

impl AuditOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditOutcome::Ok => "ok",
            AuditOutcome::Conflict => "conflict",
            AuditOutcome::Refused => "refused",
            AuditOutcome::Failed => "failed",
            AuditOutcome::Started => "started",
            AuditOutcome::Done => "done",
        }
    }
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditRecord {
    pub id: i64,
    pub at: Millis,
    pub actor: String,
    pub action: String,
    pub route: Option<String>,
    pub subject: String,
    pub outcome: String,
    pub detail: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached or did not answer in time: the host's
    /// fault, and transient. Callers nack (ingest) or retry later (relay).
    #[error("inbox database unavailable: {0}")]
    Unavailable(sqlx::Error),
    #[error("inbox database error: {0}")]
    Database(sqlx::Error),
    /// The caller's lease is gone: the entry expired and was claimed again, or a
    /// person changed it. The caller's outcome is discarded.
    #[error("lease on entry {id} was lost; the outcome of this attempt is discarded")]
    LeaseLost { id: i64 },
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// A command that does not create the inbox met none.
    #[error("no inbox at {}: the SQLite file does not exist, and only `inlet migrate` or `inlet run` creates it", .0.display())]
    NoInbox(std::path::PathBuf),
    /// Another process holds the SQLite inbox's instance lock.
    #[error(
        "another Inlet is running on the SQLite inbox {} ({holder} holds {}): SQLite allows one instance per file; \
         stop it first, or use PostgreSQL to run several",
        db.display(),
        lock.display()
    )]
    InstanceRunning { db: std::path::PathBuf, lock: std::path::PathBuf, holder: String },
    #[error("cannot take the instance lock {} of the SQLite inbox: {error}", lock.display())]
    InstanceLock { lock: std::path::PathBuf, error: std::io::Error },
    #[error("unsupported store url `{0}`: use sqlite://PATH or postgres://…")]
    UnsupportedUrl(String),
    #[error("stored entry {id} is unreadable: {reason}")]
    Corrupt { id: i64, reason: String },
}

impl StoreError {
    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }

    /// Whether the database refused a row for what it holds (a value too long for an
    /// index, a character the encoding cannot hold, a constraint other than the dedup
    /// key): the same row fails again on every try, so the caller must store something
    /// else (the message PARKED without its keys), not nack it forever. Never true for
    /// an outage.
    pub fn refuses_row(&self) -> bool {
        matches!(self, StoreError::Database(e) if refuses_row(e))
    }

    /// Whether the row was refused because another entry of the route holds its
    /// dedup key (the unique index `inbox_entry_dedup`).
    pub fn holds_dedup_key(&self) -> bool {
        let StoreError::Database(sqlx::Error::Database(db)) = self else { return false };
        db.constraint() == Some(DEDUP_CONSTRAINT)
            || (db.kind() == sqlx::error::ErrorKind::UniqueViolation
                && db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some())
    }

    /// The SQLSTATE (PostgreSQL) or extended result code (SQLite) of a database error.
    pub fn code(&self) -> Option<String> {
        match self {
            StoreError::Unavailable(sqlx::Error::Database(db)) | StoreError::Database(sqlx::Error::Database(db)) => {
                db.code().map(|c| c.into_owned())
            }
            _ => None,
        }
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if is_unavailable(&e) { StoreError::Unavailable(e) } else { StoreError::Database(e) }
    }
}

/// Classifies by error kind and SQLSTATE / SQLite result code, never by message text.
fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => match db.code() {
            // SQLite: BUSY (5), LOCKED (6), IOERR (10), and their extended codes (low
            // byte). Only for SQLite's errors: many SQLSTATEs are numbers too (22021,
            // a NUL in text, has 5 as its low byte).
            Some(code) if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() => {
                code.parse::<i32>().is_ok_and(|n| matches!(n & 0xff, 5 | 6 | 10))
            }
            Some(code) => {
                let code = code.as_ref();
                // PostgreSQL: connection exceptions (08), admin shutdown / cannot
                // connect now (57P0x), serialization failure and deadlock (40001, 40P01),
                // insufficient resources (53).
                code.starts_with("08")
                    || code.starts_with("57P0")
                    || code == "40001"
                    || code == "40P01"
                    || code.starts_with("53")
            }
            None => false,
        },
        _ => false,
    }
}

/// The dedup key's unique constraint: a violation of it is a race another insert won,
/// not a bad row (and `ON CONFLICT` normally absorbs it).
const DEDUP_CONSTRAINT: &str = "inbox_entry_dedup";

/// Classifies by SQLSTATE class / SQLite primary result code, never by message text.
fn refuses_row(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else { return false };
    let Some(code) = db.code() else { return false };
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // TOOBIG (18), CONSTRAINT (19) but not CONSTRAINT_UNIQUE (2067, the dedup key:
        // the only unique index besides the row id), MISMATCH (20), RANGE (25).
        let Ok(n) = code.parse::<i32>() else { return false };
        return n != 2067 && matches!(n & 0xff, 18 | 19 | 20 | 25);
    }
    if db.constraint() == Some(DEDUP_CONSTRAINT) {
        return false;
    }
    // PostgreSQL: data exception (22, e.g. 22021 a NUL in text, 22001 too long),
    // integrity constraint violation (23), program limit exceeded (54, e.g. an index
    // row larger than a btree page allows).
    ["22", "23", "54"].iter().any(|class| code.starts_with(class))
}

/// The inbox as the host uses it.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// `sqlite` or `postgres`.
    fn backend(&self) -> &'static str;

    /// The schema migrations this binary embeds for this backend, oldest first.
    fn migrations(&self) -> &'static [schema::Migration];

    /// What `inlet_schema` records about the migrations applied, read without
    /// changing anything.
    async fn schema_record(&self) -> Result<schema::SchemaRecord, StoreError>;

    /// Applies the pending migrations in one transaction, recording each with this
    /// binary and its checksum (and completes `inlet_schema` if an earlier Inlet made
    /// it); the migrations applied. Refuses a schema newer than this binary's or
    /// migrated with other SQL. PostgreSQL waits at most `lock_timeout` for each lock.
    async fn migrate(&self, lock_timeout: std::time::Duration) -> Result<Vec<schema::Migration>, StoreError>;

    /// Tells every instance on this inbox that these routes have entries to claim
    /// now (PostgreSQL: `NOTIFY`), so they need not wait for their poll interval.
    /// Where only one instance can run (SQLite) there is nobody to tell.
    async fn announce(&self, routes: &[String]) -> Result<(), StoreError>;

    /// The routes any instance announced, as they come (PostgreSQL: `LISTEN`, on a
    /// connection of its own, reconnected after a loss; announcements made while it
    /// was away are missed, the poll interval covers them). `None` where there are
    /// none (SQLite).
    fn announcements(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>>;

    /// Stores a message exactly once per `(route, dedup_key)`; see [`InsertOutcome`].
    async fn insert(&self, entry: &NewEntry, now: Millis) -> Result<InsertOutcome, StoreError>;

    /// Stores many messages in one transaction; the outcome of each, in order.
    async fn insert_batch(&self, entries: &[NewEntry], now: Millis) -> Result<Vec<InsertOutcome>, StoreError>;

    /// Takes up to `limit` due entries of a route under a lease, oldest first.
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<Claimed>, StoreError>;

    /// Returns entries whose lease expired to OPEN, so any instance can claim them.
    async fn release_expired(&self, route: &str, now: Millis) -> Result<u64, StoreError>;

    /// Returns every entry `owner` holds to OPEN at once, whatever its lease: for an
    /// instance that stops with attempts it abandoned, so another instance claims
    /// them now instead of when their leases expire. A settle of such an attempt still
    /// in flight is fenced off (`LeaseLost`). The route of each entry handed back.
    async fn release_owned(&self, owner: &str, now: Millis) -> Result<Vec<String>, StoreError>;

    /// Records the outcome of an attempt, fenced by the lease.
    async fn settle(&self, id: i64, lease: &Lease, now: Millis, s: &Settlement) -> Result<(), StoreError> {
        self.settle_recorded(id, lease, now, s, None).await
    }

    /// [`Store::settle`], and the attempt's record in the entry's history, in one
    /// transaction: both or neither.
    async fn settle_recorded(
        &self,
        id: i64,
        lease: &Lease,
        now: Millis,
        s: &Settlement,
        attempt: Option<&failures::Attempt>,
    ) -> Result<(), StoreError>;

    /// Many settles ([`Store::settle_recorded`]) in one transaction. `Ok`: committed,
    /// a result for each request in order — `Err(LeaseLost)` for one whose lease was
    /// gone (nothing of it was written). `Err`: nothing was committed; settle them
    /// one by one.
    ///
    /// A settled request that asks for its key's next entry (`next`) gets it back,
    /// claimed in the same transaction, where the store can (PostgreSQL) and the
    /// entry is claimable as an ordinary claim would judge it: OPEN, due, the head of
    /// its key, nothing of the key in flight, the route not paused, the key free to
    /// lock. Otherwise `None`, and the entry waits for an ordinary claim.
    async fn settle_batch(
        &self,
        items: &[SettleRequest],
    ) -> Result<Vec<Result<Option<Claimed>, StoreError>>, StoreError>;

    /// Says that `owner` relays `route` (or stops, [`Presence::Leaving`]) and returns its
    /// part of the route's keys among the instances that said so within their `ttl`
    /// (their names in order: the `index`th of `count`). `None` where keys are not
    /// divided (SQLite: one instance), and for `Leaving`.
    ///
    /// The parts say where an instance's claims look, never what keeps a key's order:
    /// the key locks and the in-flight check of every claim do that. While two instances
    /// see different members (one just came or went), some keys are looked at by both,
    /// as when keys were not divided, or by neither until the next look.
    async fn share(&self, route: &str, owner: &str, presence: Presence) -> Result<Option<Share>, StoreError>;

    /// How many keys a route had when its claims last counted them (PostgreSQL: each
    /// walk of the heads, or every 10 s on a route claimed from its window), in the
    /// claims' part of the keys ([`ClaimRequest::share`]); `None` if unknown: whether
    /// every key this instance claims can have a delivery slot of its own.
    fn keys_met(&self, _route: &str) -> Option<i64> {
        None
    }

    /// The recorded attempts of an entry, oldest first.
    async fn attempts(&self, entry_id: i64) -> Result<Vec<failures::Attempt>, StoreError>;

    /// Parked and retrying entries grouped by route and error fingerprint, largest
    /// group first.
    async fn failure_groups(&self, route: Option<&str>, limit: u32) -> Result<Vec<failures::FailureGroup>, StoreError>;

    /// Entries `action` would change under `filter`, with an id above `after`, oldest
    /// first, as (id, correlation key).
    async fn repair_candidates(
        &self,
        action: crate::inbox::repair::RepairAction,
        filter: &crate::inbox::repair::RepairFilter,
        after: i64,
        limit: u32,
    ) -> Result<Vec<(i64, Option<String>)>, StoreError>;

    /// A new running repair job; returns its id.
    #[allow(clippy::too_many_arguments)]
    async fn create_repair_job(
        &self,
        action: crate::inbox::repair::RepairAction,
        filter: &crate::inbox::repair::RepairFilter,
        reason: Option<&str>,
        rate: u32,
        actor: &str,
        total: i64,
        now: Millis,
    ) -> Result<i64, StoreError>;

    /// The oldest running job nobody holds (or whose holder's lease expired), now
    /// leased to `owner`.
    async fn take_repair_job(
        &self,
        owner: &str,
        now: Millis,
        lease_ms: i64,
    ) -> Result<Option<crate::inbox::repair::RepairJob>, StoreError>;

    /// Records a tick of `owner`'s job: the cursor, `moved` more entries changed, the
    /// lease renewed; `finished` ends it. False when the lease was lost.
    #[allow(clippy::too_many_arguments)]
    async fn advance_repair_job(
        &self,
        id: i64,
        owner: &str,
        cursor: i64,
        moved: i64,
        finished: bool,
        now: Millis,
        lease_ms: i64,
    ) -> Result<bool, StoreError>;

    /// Repair jobs, newest first.
    async fn list_repair_jobs(&self, limit: u32) -> Result<Vec<crate::inbox::repair::RepairJob>, StoreError>;

    async fn get(&self, id: i64) -> Result<Option<Entry>, StoreError>;

    /// The entry of `route` stored under `dedup_key`, if any.
    async fn find_by_dedup_key(&self, route: &str, dedup_key: &str) -> Result<Option<Entry>, StoreError>;

    /// The status of each entry of `route` stored under one of `dedup_keys` (at most
    /// [`DEDUP_LOOKUP_MAX`] of them), as `(dedup key, status)`; a key with no entry is
    /// left out. The outbox source asks this of the rows it read.
    async fn dedup_statuses(&self, route: &str, dedup_keys: &[String]) -> Result<Vec<(String, Status)>, StoreError>;

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Entry>, StoreError>;

    /// How many entries `filter` matches, whatever its limit.
    async fn count(&self, filter: &ListFilter) -> Result<u64, StoreError>;

    /// Makes a PARKED (or waiting OPEN) entry due now with a fresh attempt count: due
    /// [`REQUEUED_DUE_EARLY`] before `now`. Returns false when the entry is missing or
    /// in another state.
    async fn requeue(&self, id: i64, now: Millis) -> Result<bool, StoreError>;

    /// Parks an OPEN entry by hand. Returns false when missing or in another state.
    async fn park(&self, id: i64, reason: &str, now: Millis) -> Result<bool, StoreError>;

    /// Discards a PARKED entry by hand: it becomes IGNORED (finished now, so retention
    /// deletes it in time), `reason` first in `last_error` and the error it was parked
    /// with kept after it. It no longer holds back its key. Returns false when missing
    /// or in another state.
    async fn ignore(&self, id: i64, reason: &str, now: Millis) -> Result<bool, StoreError>;

    /// Pauses a route for every instance: from the commit on, no claim takes its
    /// entries. Returns false when it was paused already (the first pause stands).
    async fn pause_route(&self, pause: &Pause) -> Result<bool, StoreError>;

    /// Resumes a paused route. Returns false when it was not paused.
    async fn resume_route(&self, route: &str) -> Result<bool, StoreError>;

    /// The pause of `route`, or of every paused route (`None`), by route name.
    async fn paused_routes(&self, route: Option<&str>) -> Result<Vec<Pause>, StoreError>;

    /// Deletes DONE and IGNORED entries finished before `before`; never PARKED ones.
    async fn purge_finished(&self, before: Millis, limit: u32) -> Result<u64, StoreError>;

    /// The finished entries of `route` that [`Store::purge_finished`] with `before`
    /// would delete, after entry `after_id`, at most `limit`, as `(id, attributes)`:
    /// what the claim check's objects are found by before their entries go.
    async fn purgeable(
        &self,
        route: &str,
        before: Millis,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<(i64, Vec<(String, String)>)>, StoreError>;

    /// Opens a replay window; returns its id.
    async fn open_replay_window(&self, window: &NewReplayWindow) -> Result<i64, StoreError>;

    /// Closes replay window `id` at `now`. Returns false when it is not open.
    async fn close_replay_window(&self, id: i64, now: Millis) -> Result<bool, StoreError>;

    /// The replay windows of `route` (or of every route), oldest first; with `open_at`,
    /// only those open then.
    async fn replay_windows(
        &self,
        route: Option<&str>,
        open_at: Option<Millis>,
    ) -> Result<Vec<ReplayWindow>, StoreError>;

    /// Replay window `id`, if there is one.
    async fn replay_window(&self, id: i64) -> Result<Option<ReplayWindow>, StoreError>;

    /// Stores `entry` (its dedup key already [`replay_dedup_key`]) as what replay
    /// window `window` made of entry `original`, in one transaction: the entry and
    /// the record of where it came from.
    async fn insert_replay(
        &self,
        entry: &NewEntry,
        window: i64,
        original: i64,
        now: Millis,
    ) -> Result<InsertOutcome, StoreError>;

    /// The entries replay window `window` made, each with the entry it was made
    /// from: `(entry, original)`, in entry order.
    async fn replay_entries(&self, window: i64) -> Result<Vec<(i64, i64)>, StoreError>;

    async fn counts(&self) -> Result<Vec<RouteStatusCount>, StoreError>;

    /// The keys of `route` that are held up (see [`BlockedKeys`]); `parked_blocks`: the
    /// route's parked entries hold back later entries of their key (`block-key`).
    async fn blocked_keys(&self, route: &str, parked_blocks: bool) -> Result<BlockedKeys, StoreError>;

    /// Whether this store holds the inbox's gauge lease: the one instance that
    /// publishes the gauges computed from the shared inbox (`inlet_inbox_*`), so they
    /// are not multiplied by the number of replicas. SQLite: always (one instance).
    /// PostgreSQL: a session advisory lock on a connection of its own, kept while that
    /// connection lives; an instance that dies or loses the connection loses it, and
    /// the next caller elsewhere takes it. Called again to keep it (every few seconds).
    async fn gauge_lease(&self) -> Result<bool, StoreError>;
    /// Entries finished DONE at or after `since`, per route, counted in buckets of
    /// `bucket_ms` (buckets with none are left out).
    async fn throughput(&self, since: Millis, bucket_ms: i64) -> Result<Vec<Throughput>, StoreError>;

    /// The database's clock.
    async fn db_now(&self) -> Result<Millis, StoreError>;

    /// The database's clock read `n` times in a row on one connection, after a read
    /// that is not timed (it wakes the connection's server process and prepares the
    /// statement there; taking the connection from the pool may check it first): each
    /// `(round trip, host clock before it, host clock after it, database clock)`. What
    /// [`DbClock`] calibrates from.
    async fn db_now_timed(&self, n: usize) -> Result<Vec<(std::time::Duration, Millis, Millis, Millis)>, StoreError>;

    /// Keeps the inbox table quick to claim from under a stream of settles: where the
    /// backend needs it (PostgreSQL), vacuums and analyzes `inbox_entry` once enough
    /// rows died or changed since the last time. What it did, if anything. Called every
    /// few seconds by the instance that publishes the inbox gauges.
    async fn maintain(&self) -> Result<Option<String>, StoreError>;

    /// Appends a line to the audit log; returns its id.
    async fn record_audit(&self, a: &NewAudit, now: Millis) -> Result<i64, StoreError>;

    /// Audit lines with an id above `after_id`, oldest first.
    async fn list_audit(&self, after_id: Option<i64>, limit: u32) -> Result<Vec<AuditRecord>, StoreError>;
}

/// Deletes finished entries that ended before `before`, `batch` rows per statement,
/// until none is left; waits `pause` between batches so claims and settles get the
/// database in between. Returns how many were deleted. A backlog of any size is
/// cleared in one call, so retention keeps up with any sustained rate.
pub async fn purge_all(
    store: &dyn Store,
    before: Millis,
    batch: u32,
    pause: std::time::Duration,
) -> Result<u64, StoreError> {
    let mut total = 0;
    purge_counting(store, before, batch, pause, &mut total).await?;
    Ok(total)
}

/// [`purge_all`], adding to `deleted` batch by batch, so a caller whose purge fails
/// half way still knows what went (the audit of a purge by hand says it).
pub async fn purge_counting(
    store: &dyn Store,
    before: Millis,
    batch: u32,
    pause: std::time::Duration,
    deleted: &mut u64,
) -> Result<(), StoreError> {
    loop {
        let n = store.purge_finished(before, batch).await?;
        *deleted += n;
        if n < u64::from(batch) {
            return Ok(());
        }
        tokio::time::sleep(pause).await;
    }
}

/// Opens the store a URL names and migrates it: what tests and benchmarks use.
/// `inlet run` opens through [`open_as`] with its `--migrate` mode.
pub async fn open(url: &str, max_connections: u32) -> Result<Arc<dyn Store>, StoreError> {
    open_as(url, max_connections, MigrateMode::Auto, schema::DEFAULT_LOCK_TIMEOUT).await
}

/// Opens the store a URL names and treats its schema as `mode` says
/// ([`schema::prepare`]). Only [`MigrateMode::Auto`] creates a SQLite file that is not
/// there; otherwise a missing one is [`StoreError::NoInbox`], and nothing is created.
/// The commands besides `inlet run` and `inlet migrate` open with
/// [`MigrateMode::Check`]: they never change the schema.
pub async fn open_as(
    url: &str,
    max_connections: u32,
    mode: MigrateMode,
    lock_timeout: std::time::Duration,
) -> Result<Arc<dyn Store>, StoreError> {
    let store = connect(url, max_connections, mode == MigrateMode::Auto).await?;
    schema::prepare(store.as_ref(), mode, lock_timeout).await?;
    Ok(store)
}

/// Connects to the store a URL names without looking at its schema; `create`: a SQLite
/// file that is not there is created (else: [`StoreError::NoInbox`]).
pub async fn connect(url: &str, max_connections: u32, create: bool) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(sqlite::SqliteStore::connect(url, max_connections, create).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(postgres::PgStore::connect(url, max_connections).await?))
    } else {
        Err(StoreError::UnsupportedUrl(crate::redact::url(url)))
    }
}

/// The dedup key under which a conflicting message is kept.
/// The most dedup keys one [`Store::dedup_statuses`] takes (one bind parameter
/// each, well under SQLite's limit).
pub const DEDUP_LOOKUP_MAX: usize = 500;

/// How long before its requeue a requeued entry is due. The requeue is timed by the
/// clock of whoever asks (the command line, another instance), the claims that its
/// announcement wakes by their own, and each process measures its offset to the
/// database only within a round trip. Due at the asker's `now`, the entry could be
/// a few milliseconds in the future for the instance that hears of it first, which
/// then finds nothing and waits for its poll. A second early is far more than the
/// clocks disagree by, and nothing is due earlier than the person meant: at once.
pub const REQUEUED_DUE_EARLY: Millis = 1_000;

pub(crate) fn conflict_dedup_key(dedup_key: &str, digest: &str) -> String {
    format!("{dedup_key}#conflict-{}", &digest[..16])
}

#[cfg(test)]
mod tests {
    /// Digests are stored (payload digests, dedup keys of `message-id-sha256`, plugin
    /// cache names): their spelling must never change. FIPS 180-2's vector for "abc".
    #[test]
    fn digest_hex_is_lowercase_sha256() {
        assert_eq!(super::digest_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
