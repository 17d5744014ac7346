//! Group commit: single inserts that arrive while others are being committed are
//! committed together, in one transaction, and each caller is answered after that
//! commit. A lone insert goes out at once (no timer: a batch is whatever queued up
//! while the previous one was committing), so batching costs no latency; under load,
//! one commit (one fsync) serves many pushes.
//!
//! The batch is an optimisation only. When a batch fails for any reason, nobody is
//! answered from it: every caller gets its entry back and inserts it alone, on the
//! path it would have taken without group commit (where a row the database refuses
//! is told from an outage). So a bad row cannot fail its neighbours, and an outage
//! fails each of them the same way a lone insert would.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::{Mutex, mpsc, oneshot};

use super::{InsertOutcome, NewEntry, Store, StoreError};
use crate::clock::Millis;

/// Inserts one batch may hold at most.
pub const MAX_BATCH: usize = 256;

/// What a caller gets back: its entry, and what became of it.
pub struct Committed {
    pub entry: NewEntry,
    pub outcome: Grouped,
}

pub enum Grouped {
    /// Committed with its batch.
    Stored(InsertOutcome),
    /// Its batch failed: insert the entry alone.
    Alone,
    /// It was alone in its batch, and the store failed for a reason that is not
    /// about the row (an outage): inserting it alone again would fail the same way.
    Failed(StoreError),
}

struct Pending {
    entry: NewEntry,
    now: Millis,
    answer: oneshot::Sender<Committed>,
}

/// A queue of inserts and the writers that commit them in batches.
pub struct GroupCommit {
    tx: mpsc::UnboundedSender<Pending>,
    counters: Arc<Counters>,
}

#[derive(Default)]
struct Counters {
    /// Inserts queued and not yet taken into a batch.
    queued: AtomicUsize,
    /// Batches committed.
    commits: AtomicU64,
    /// Batches that failed, their inserts handed back.
    failed: AtomicU64,
}

impl GroupCommit {
    /// Starts `writers` tasks committing batches into `store` (more than one lets a
    /// batch gather while another commits). The tasks end when the `GroupCommit` is
    /// dropped and the queue is empty.
    pub fn start(store: Arc<dyn Store>, writers: usize) -> GroupCommit {
        let (tx, rx) = mpsc::unbounded_channel();
        let rx = Arc::new(Mutex::new(rx));
        let counters = Arc::new(Counters::default());
        for _ in 0..writers.max(1) {
            tokio::spawn(write(Arc::clone(&store), Arc::clone(&rx), Arc::clone(&counters)));
        }
        GroupCommit { tx, counters }
    }

    /// Inserts `entry` with the others queued beside it. If the writers are gone,
    /// the entry comes back to be inserted alone; if one died holding it (a bug),
    /// the answer is that the store is unavailable, so the message is redelivered.
    pub async fn insert(&self, entry: NewEntry, now: Millis) -> Result<Committed, StoreError> {
        let (answer, answered) = oneshot::channel();
        self.counters.queued.fetch_add(1, Ordering::SeqCst);
        if let Err(mpsc::error::SendError(p)) = self.tx.send(Pending { entry, now, answer }) {
            self.counters.queued.fetch_sub(1, Ordering::SeqCst);
            return Ok(Committed { entry: p.entry, outcome: Grouped::Alone });
        }
        answered.await.map_err(|_| StoreError::Unavailable(sqlx::Error::WorkerCrashed))
    }

    /// Inserts queued and not yet in a batch (for tests and metrics).
    pub fn queued(&self) -> usize {
        self.counters.queued.load(Ordering::SeqCst)
    }

    /// Batches committed so far.
    pub fn commits(&self) -> u64 {
        self.counters.commits.load(Ordering::SeqCst)
    }

    /// Batches that failed and were handed back so far.
    pub fn failed(&self) -> u64 {
        self.counters.failed.load(Ordering::SeqCst)
    }
}

async fn write(
    store: Arc<dyn Store>,
    rx: Arc<Mutex<mpsc::UnboundedReceiver<Pending>>>,
    counters: Arc<Counters>,
) {
    loop {
        // Take what has queued up, holding the queue only while taking it, so another
        // writer gathers the next batch while this one commits.
        let batch = {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else { return };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(p) => batch.push(p),
                    Err(_) => break,
                }
            }
            counters.queued.fetch_sub(batch.len(), Ordering::SeqCst);
            batch
        };
        // One clock reading for the batch: the latest of its callers'.
        let now = batch.iter().map(|p| p.now).max().unwrap_or_default();
        let (entries, answers): (Vec<NewEntry>, Vec<_>) = batch.into_iter().map(|p| (p.entry, p.answer)).unzip();
        match store.insert_batch(&entries, now).await {
            Ok(outcomes) => {
                counters.commits.fetch_add(1, Ordering::SeqCst);
                for ((answer, entry), outcome) in answers.into_iter().zip(entries).zip(outcomes) {
                    let _ = answer.send(Committed { entry, outcome: Grouped::Stored(outcome) });
                }
            }
            Err(error) if entries.len() == 1 && !error.refuses_row() => {
                counters.failed.fetch_add(1, Ordering::SeqCst);
                if let (Some(answer), Some(entry)) = (answers.into_iter().next(), entries.into_iter().next()) {
                    let _ = answer.send(Committed { entry, outcome: Grouped::Failed(error) });
                }
            }
            Err(error) => {
                counters.failed.fetch_add(1, Ordering::SeqCst);
                tracing::debug!(%error, inserts = entries.len(), "a group commit failed; each insert is retried alone");
                for (answer, entry) in answers.into_iter().zip(entries) {
                    let _ = answer.send(Committed { entry, outcome: Grouped::Alone });
                }
            }
        }
    }
}
