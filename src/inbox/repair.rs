//! Repairs as the inbox stores them: what a repair does to an entry
//! ([`RepairAction`]), which entries a repair job acts on ([`RepairFilter`]) and a
//! job's row ([`RepairJob`]). The rules of repairing (who may, what is audited, how a
//! job is worked) are `crate::operate`'s.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::clock::Millis;
use crate::inbox::Status;

/// What a repair does to an entry, by hand or through a repair job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RepairAction {
    /// Due now with a fresh attempt count (PARKED entries, and OPEN ones waiting for
    /// a retry; a job takes the OPEN ones only with `now`).
    Requeue,
    /// Parked by hand, with a reason (OPEN entries).
    Park,
    /// Discarded with a reason (PARKED entries): IGNORED, no longer holding back
    /// their key.
    Ignore,
}

impl RepairAction {
    pub fn as_str(self) -> &'static str {
        match self {
            RepairAction::Requeue => "requeue",
            RepairAction::Park => "park",
            RepairAction::Ignore => "ignore",
        }
    }

    /// The action as stored (`repair_job.action`).
    pub fn parse(stored: &str) -> Option<RepairAction> {
        match stored {
            "requeue" => Some(RepairAction::Requeue),
            "park" => Some(RepairAction::Park),
            "ignore" => Some(RepairAction::Ignore),
            _ => None,
        }
    }

    /// `requeued`, `parked`, `ignored`.
    pub fn past(self) -> &'static str {
        match self {
            RepairAction::Requeue => "requeued",
            RepairAction::Park => "parked",
            RepairAction::Ignore => "ignored",
        }
    }

    /// The states a repair of one entry applies to, as a refusal names them (the
    /// store's statements enforce them).
    pub fn applies_to(self) -> &'static str {
        match self {
            RepairAction::Requeue => "PARKED or OPEN",
            RepairAction::Park => "OPEN",
            RepairAction::Ignore => "PARKED",
        }
    }

    /// The state a repair that was done leaves the entry in.
    pub fn becomes(self) -> Status {
        match self {
            RepairAction::Requeue => Status::Open,
            RepairAction::Park => Status::Parked,
            RepairAction::Ignore => Status::Ignored,
        }
    }
}

impl fmt::Display for RepairAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a repair job is: worked by some instance, finished, or given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Running,
    Done,
    Failed,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
        }
    }

    /// The state as stored (`repair_job.state`).
    pub fn parse(stored: &str) -> Option<JobState> {
        match stored {
            "running" => Some(JobState::Running),
            "done" => Some(JobState::Done),
            "failed" => Some(JobState::Failed),
            _ => None,
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which entries a job acts on. Every field narrows it; `route` is required for a
/// token limited to some routes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// Exactly this correlation key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Exactly this error fingerprint (a failure group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// The last error contains this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Received at or after / before these times (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_after: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_before: Option<Millis>,
    /// Requeue also OPEN entries waiting for a retry (they would be retried anyway).
    #[serde(default)]
    pub now: bool,
}

impl RepairFilter {
    /// The states an entry must be in for `action` to change it.
    pub fn statuses(&self, action: RepairAction) -> (Status, Status) {
        match action {
            RepairAction::Requeue if self.now => (Status::Parked, Status::Open),
            RepairAction::Requeue => (Status::Parked, Status::Parked),
            RepairAction::Park => (Status::Open, Status::Open),
            RepairAction::Ignore => (Status::Parked, Status::Parked),
        }
    }

    /// `text` as a LIKE pattern (wildcards in it taken literally, `\` the escape).
    pub fn text_pattern(&self) -> Option<String> {
        self.text.as_deref().map(super::contains_pattern)
    }

    /// For people: `route=orders fingerprint="…"`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        let mut add = |name: &str, v: &Option<String>| {
            if let Some(v) = v {
                parts.push(format!("{name}={v:?}"));
            }
        };
        add("route", &self.route);
        add("key", &self.key);
        add("fingerprint", &self.fingerprint);
        add("text", &self.text);
        add("received_after", &self.received_after.map(|t| t.to_string()));
        add("received_before", &self.received_before.map(|t| t.to_string()));
        if self.now {
            parts.push("now".into());
        }
        if parts.is_empty() { "every entry".into() } else { parts.join(" ") }
    }
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairJob {
    pub id: i64,
    pub action: RepairAction,
    pub filter: RepairFilter,
    pub reason: Option<String>,
    /// Entries per second.
    pub rate: u32,
    pub actor: String,
    pub state: JobState,
    /// Entries that matched when the job was created.
    pub total: i64,
    /// Entries changed so far.
    pub moved: i64,
    /// The last entry id handled.
    pub cursor: i64,
    pub owner: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub finished_at: Option<Millis>,
    pub error: Option<String>,
}
