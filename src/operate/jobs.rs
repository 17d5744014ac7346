//! Repair by filter: requeue or park every entry matching a filter — a failure group,
//! a route's parked entries after an outage, a key — as a **job** the server carries
//! out at a bounded rate, not as one statement that floods the target.
//!
//! A job is a row of the inbox (`repair_job`): its filter, action, rate and a cursor
//! (the last entry id it handled). Every instance runs [`run`]; one takes a job by
//! lease, handles the matching entries in id order one tick (a second) at a time —
//! `rate` entries per tick — and moves the cursor with its progress in the same
//! statement that renews its lease. An instance that dies leaves the lease to expire;
//! another (or the same, restarted) takes the job from the cursor. Handling an entry
//! twice is harmless: a requeue or park only changes an entry still in the filter's
//! status, so nothing is requeued twice and nothing is delivered twice by the job.
//!
//! Per-key order is kept: entries are requeued oldest first, and the ordered claim
//! delivers a key's entries by id whatever the order they became due in.
//!
//! A dry run counts the matches and names some of their keys, and moves nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;

use crate::clock::Clock;
use crate::inbox::repair::{RepairAction, RepairFilter, RepairJob};
use crate::inbox::{Store, StoreError};
use crate::operate::{Operator, Relays, Wake};

/// How long a job's lease lasts without renewal; renewed every tick.
pub const JOB_LEASE: Duration = Duration::from_secs(10);
/// One tick of a job: `rate` entries are handled per tick.
const TICK: Duration = Duration::from_secs(1);
/// How often an idle instance looks for a job to take.
const IDLE_POLL: Duration = Duration::from_secs(1);
/// Rate when the request names none (entries per second).
pub const DEFAULT_RATE: u32 = 100;
pub const MAX_RATE: u32 = 10_000;
/// Keys a dry run names at most.
const DRY_RUN_KEYS: usize = 50;

/// What a dry run (or a job's start) found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Matches {
    pub count: i64,
    /// Up to 50 of their correlation keys, sorted.
    pub keys: Vec<String>,
    /// How many distinct keys there are in all.
    pub distinct_keys: usize,
}

/// Counts what `filter` matches for `action`, moving nothing.
pub async fn dry_run(
    store: &dyn crate::inbox::Store,
    action: RepairAction,
    filter: &RepairFilter,
) -> Result<Matches, StoreError> {
    let mut after = 0;
    let mut count = 0;
    let mut keys = BTreeSet::new();
    loop {
        let page = store.repair_candidates(action, filter, after, 1_000).await?;
        let Some(last) = page.last() else { break };
        after = last.0;
        count += page.len() as i64;
        keys.extend(page.into_iter().filter_map(|(_, k)| k));
    }
    let distinct_keys = keys.len();
    Ok(Matches { count, keys: keys.into_iter().take(DRY_RUN_KEYS).collect(), distinct_keys })
}

/// Every instance's job runner: takes a job whose lease is free, works it tick by
/// tick until it is done, its lease is lost, or shutdown. `relays` hears of the
/// entries a tick freed.
pub async fn run(
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    relays: Arc<dyn Wake>,
    owner: String,
    mut shutdown: watch::Receiver<bool>,
) {
    let runner = Runner { store, clock, relays, owner };
    loop {
        let job =
            match runner.store.take_repair_job(&runner.owner, runner.clock.now(), JOB_LEASE.as_millis() as i64).await {
                Ok(job) => job,
                Err(error) => {
                    tracing::warn!(%error, "could not look for repair jobs; will try again");
                    None
                }
            };
        if let Some(job) = job {
            tracing::info!(job = job.id, action = job.action.as_str(), filter = %job.filter.describe(), cursor = job.cursor, "repair job taken");
            runner.work(job, &mut shutdown).await;
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(IDLE_POLL) => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

/// What a job runner works with: the inbox, its clock, the relays it wakes, and the
/// name its leases carry.
struct Runner {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    relays: Arc<dyn Wake>,
    owner: String,
}

impl Runner {
    async fn work(&self, mut job: RepairJob, shutdown: &mut watch::Receiver<bool>) {
        let store = self.store.as_ref();
        let lease_ms = JOB_LEASE.as_millis() as i64;
        let mut ticks = tokio::time::interval(TICK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = shutdown.changed() => return,
            }
            let batch = match store.repair_candidates(job.action, &job.filter, job.cursor, job.rate).await {
                Ok(b) => b,
                Err(error) => {
                    tracing::warn!(job = job.id, %error, "repair job could not read its entries; will try again");
                    continue;
                }
            };
            let now = self.clock.now();
            let mut moved = 0;
            let mut cursor = job.cursor;
            for (id, _) in &batch {
                let changed = match job.action {
                    RepairAction::Requeue => store.requeue(*id, now).await,
                    RepairAction::Park => {
                        let reason = job.reason.clone().unwrap_or_else(|| format!("parked by repair job {}", job.id));
                        store.park(*id, &reason, now).await
                    }
                    RepairAction::Ignore => {
                        let reason = job.reason.clone().unwrap_or_else(|| format!("ignored by repair job {}", job.id));
                        store.ignore(*id, &reason, now).await
                    }
                };
                match changed {
                    Ok(true) => moved += 1,
                    Ok(false) => {}
                    Err(error) => {
                        tracing::warn!(job = job.id, id, %error, "repair job could not change an entry; will try again");
                        break;
                    }
                }
                cursor = *id;
            }
            let finished = batch.is_empty();
            match store.advance_repair_job(job.id, &self.owner, cursor, moved, finished, now, lease_ms).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(job = job.id, "repair job lease lost; another instance has it");
                    return;
                }
                Err(error) => {
                    tracing::warn!(job = job.id, %error, "repair job could not record its progress; will try again");
                    continue;
                }
            }
            if moved > 0 {
                // Wake the relay of the route at once rather than at its next poll.
                match job.filter.route.as_deref() {
                    Some(route) => self.relays.wake(route),
                    None => self.relays.wake_all(),
                }
            }
            job.cursor = cursor;
            job.moved += moved;
            if finished {
                tracing::info!(job = job.id, moved = job.moved, "repair job done");
                let operator = Operator::new(
                    store,
                    self.clock.as_ref(),
                    Relays::Here(self.relays.as_ref()),
                    format!("job:{}", job.id),
                );
                operator.job_done(&job).await;
                return;
            }
        }
    }
}
