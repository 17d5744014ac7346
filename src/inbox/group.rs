//! Group commit: single writes (a push's insert, an attempt's settle) that arrive
//! while others are being committed are committed together, in one transaction, and
//! each caller is answered after that commit. A lone write goes out at once (a batch
//! is whatever queued up while the previous one was committing), so batching costs no
//! latency; under load, one commit (one fsync) serves many writes. The one wait: writes
//! the group was told to expect ([`Group::expect`], the settles of attempts in flight)
//! are waited for up to [`LINGER`] when they would all fit in the batch, so the settles
//! of a few keys commit together instead of in halves that take turns.
//!
//! Two writers let one batch gather while another commits. That pays while a commit's
//! time is mostly waiting: on the wire to a database across a network. It does not
//! when the commit's time is the database's own work, on the cores this process
//! shares: then a second commit only splits the batch, and a small batch costs the
//! database more per row. So a second writer commits beside the first only a full
//! batch ([`MAX_BATCH`]), and a smaller one waits for the commit out to end, growing
//! meanwhile, in two cases the [`Fleet`] tells:
//! - other instances relay beside this one (their relays tell it): every process's
//!   second commit adds to the database's work (with four instances each one's settles
//!   went out in batches of ~48 rows, and PostgreSQL spent 157 µs per delivery where
//!   one instance spends 110);
//! - the database is near ([`NEAR`], from the clock's calibrations): on loopback, one
//!   commit at a time drained ten keys at the same rate for a quarter less of the
//!   database's CPU per delivery, and took 7 % more pushes for a quarter less per push.
//!   Across a network it stays off: ten keys lost 14 % with it.
//!
//! (docs/measurements.md, "Group commit writers".)
//!
//! The batch is an optimisation only. When a batch fails for any reason, nobody is
//! answered from it: every caller gets its write back and does it alone, on the path
//! it would have taken without group commit (where a row the database refuses is
//! told from an outage). So a bad row cannot fail its neighbours, and an outage
//! fails each of them the same way a lone write would.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{Mutex, Notify, mpsc, oneshot};

use super::{Claimed, InsertOutcome, NewEntry, SettleRequest, Store, StoreError};
use crate::clock::Clock;

/// Writes one batch may hold at most.
pub const MAX_BATCH: usize = 256;

/// How long a batch short of full, with no commit out to wait for, waits for the
/// writes its group expects ([`Group::expect`]: attempts in flight whose settle is
/// not in yet), when they all fit in it. Ten keys' settles otherwise split into two
/// batches that take turns, each key waiting for the other half's commit: with it,
/// 3,519 → 4,706 deliveries/s on loopback and 1,384 → 2,055 with the database 250 µs
/// away; a millisecond gave the same (docs/measurements.md, "Waiting for the settles
/// in flight"). Tokio's timer counts whole milliseconds, so a wait that runs out lasts
/// up to about one.
pub const LINGER: Duration = Duration::from_micros(500);

/// A database whose fastest round trip takes less than this is near: on the same host
/// or beside it, where a commit's time is the database's work, not waiting on the wire.
pub const NEAR: Duration = Duration::from_micros(150);

/// Calibrations whose round trips decide whether the database is near: the fastest of
/// them counts, so a busy minute (which slows every round trip) does not move it.
const ROUND_TRIPS_KEPT: usize = 5;

/// What paces the writers: whether other instances share this process's database, as
/// its relays see them (members of their routes), and how far the database is, as the
/// clock's calibrations measure it; shared by the process's groups.
#[derive(Default)]
pub struct Fleet {
    /// Routes on which another instance is seen.
    crowded_routes: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Whether `crowded_routes` has any, for the writers to read without the lock.
    crowded: AtomicBool,
    /// The last calibrations' fastest round trips, newest last.
    round_trips: std::sync::Mutex<std::collections::VecDeque<Duration>>,
    /// Whether the fastest of `round_trips` is under [`NEAR`]; false until measured.
    near: AtomicBool,
}

impl Fleet {
    /// A calibration of the clock found `round_trip` the fastest to the database.
    pub fn round_trip(&self, round_trip: Duration) {
        let mut kept = self.round_trips.lock().expect("fleet lock");
        if kept.len() == ROUND_TRIPS_KEPT {
            kept.pop_front();
        }
        kept.push_back(round_trip);
        let fastest = kept.iter().min().copied().unwrap_or(round_trip);
        let near = fastest < NEAR;
        let first = kept.len() == 1;
        if self.near.swap(near, Ordering::SeqCst) != near || first {
            if near {
                tracing::info!(
                    ?fastest,
                    "the database is near: a second commit goes beside one out only with a full batch"
                );
            } else {
                tracing::info!(?fastest, "the database is far: two commits go out at once, whatever their batches");
            }
        }
    }

    /// Whether the database is near (see [`NEAR`]).
    pub fn near(&self) -> bool {
        self.near.load(Ordering::SeqCst)
    }

    /// `instances` relay `route` now, this one among them.
    pub fn seen(&self, route: &str, instances: u32) {
        let mut routes = self.crowded_routes.lock().expect("fleet lock");
        if instances <= 1 {
            routes.remove(route);
        } else if !routes.contains(route) {
            routes.insert(route.to_string());
        }
        self.crowded.store(!routes.is_empty(), Ordering::SeqCst);
    }

    /// This instance no longer relays `route`.
    pub fn left(&self, route: &str) {
        self.seen(route, 1);
    }

    /// Whether another instance relays any of this one's routes.
    pub fn crowded(&self) -> bool {
        self.crowded.load(Ordering::SeqCst)
    }
}

/// A kind of write that can be done many at a time in one transaction.
#[async_trait]
pub trait BatchWrite: Send + Sync + 'static {
    type Item: Send + 'static;
    type Output: Send + 'static;
    /// Does every write of `items` in one transaction: an output for each, in order,
    /// or an error and nothing committed.
    async fn write(&self, items: &[Self::Item]) -> Result<Vec<Self::Output>, StoreError>;
}

/// What a caller gets back: its write, and what became of it.
pub struct Committed<I, O> {
    pub item: I,
    pub outcome: Grouped<O>,
}

pub enum Grouped<O> {
    /// Committed with its batch.
    Stored(O),
    /// Its batch failed: do the write alone.
    Alone,
    /// It was alone in its batch, and the store failed for a reason that is not
    /// about the row (an outage): doing it alone again would fail the same way.
    Failed(StoreError),
}

struct Pending<I, O> {
    item: I,
    answer: oneshot::Sender<Committed<I, O>>,
}

/// A queue of writes and the writers that commit them in batches.
pub struct Group<W: BatchWrite> {
    tx: mpsc::UnboundedSender<Pending<W::Item, W::Output>>,
    counters: Arc<Counters>,
    fleet: Arc<Fleet>,
}

/// A write the group expects, until dropped: see [`Group::expect`].
pub struct Expected {
    counters: Arc<Counters>,
    /// The reported gauge this expectation was counted in, if the group reported then.
    reported: Option<Gauge>,
}

impl Drop for Expected {
    fn drop(&mut self) {
        self.counters.expected.fetch_sub(1, Ordering::SeqCst);
        if let Some(gauge) = &self.reported {
            gauge.dec();
        }
    }
}

/// Where a group tells how its batches go (the process's metrics, under the group's
/// name): what an operator reads to see whether writes are committed together, and
/// what the linger costs.
#[derive(Clone, Debug)]
pub struct GroupReport {
    /// Writes per batch taken (committed or not).
    pub batch_size: Histogram,
    /// How long each batch's write took, from taking it to the database's answer.
    pub write_seconds: Histogram,
    /// Writes expected now ([`Group::expect`]): the settles' group counts the delivery
    /// slots in use.
    pub expected: Gauge,
    /// Batches that waited out the linger for an expected write that did not come.
    pub lingered_out: Counter,
}

#[derive(Default)]
struct Counters {
    /// Writes queued and not yet taken into a batch.
    queued: AtomicUsize,
    /// Writes taken into a batch so far.
    taken: AtomicU64,
    /// Batches committed.
    commits: AtomicU64,
    /// Batches that failed, their writes handed back.
    failed: AtomicU64,
    /// Writers with a batch out (taken and not yet answered).
    committing: AtomicUsize,
    /// Told each time a writer's batch is answered.
    ended: Notify,
    /// Writes expected ([`Group::expect`]), whether submitted yet or not.
    expected: AtomicUsize,
    /// Writes in the batches out.
    in_commit: AtomicUsize,
    /// Where the batches are told, once the group is told where ([`Group::report_to`]).
    report: std::sync::OnceLock<GroupReport>,
}

impl<W: BatchWrite> Group<W> {
    /// Starts `writers` tasks committing batches of `write` (more than one lets a
    /// batch gather while another commits), paced by `fleet`. The tasks end when the
    /// `Group` is dropped and the queue is empty.
    pub fn start(write: W, writers: usize, fleet: Arc<Fleet>) -> Group<W> {
        Group::start_lingering(write, writers, fleet, LINGER)
    }

    /// [`Group::start`], with `linger` instead of [`LINGER`].
    pub fn start_lingering(write: W, writers: usize, fleet: Arc<Fleet>, linger: Duration) -> Group<W> {
        // Unbounded, because what can queue is bounded upstream: a caller waits for its
        // answer, and callers are bounded by the listener's push limit and the routes'
        // concurrency.
        let (tx, rx) = mpsc::unbounded_channel();
        let rx = Arc::new(Mutex::new(rx));
        let write = Arc::new(write);
        let counters = Arc::new(Counters::default());
        for _ in 0..writers.max(1) {
            let (write, rx, counters, fleet) =
                (Arc::clone(&write), Arc::clone(&rx), Arc::clone(&counters), Arc::clone(&fleet));
            tokio::spawn(run(write, rx, counters, fleet, linger));
        }
        Group { tx, counters, fleet }
    }

    /// Says a write will come: a delivery slot whose attempt is in flight expects its
    /// settle. While some expected write is not in, a batch short of full with no
    /// commit to wait for waits up to the linger for it, so the settles of attempts
    /// that end at about the same time commit together. Dropping the guard takes the
    /// expectation back (the slot ends, whether it settled through the group or not).
    pub fn expect(&self) -> Expected {
        self.counters.expected.fetch_add(1, Ordering::SeqCst);
        let reported = self.counters.report.get().map(|r| r.expected.clone());
        if let Some(gauge) = &reported {
            gauge.inc();
        }
        Expected { counters: Arc::clone(&self.counters), reported }
    }

    /// From now on, tells `report` of each batch, the writes expected and the lingers
    /// waited out. Only the first report a group is given counts.
    pub fn report_to(&self, report: GroupReport) {
        let _ = self.counters.report.set(report);
    }

    /// What paces the writers: the relays tell it which instances they see.
    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    /// Queues `item` with the others beside it. If the writers are gone, the item
    /// comes back to be written alone; if one died holding it (a bug), the answer is
    /// that the store is unavailable.
    pub async fn submit(&self, item: W::Item) -> Result<Committed<W::Item, W::Output>, StoreError> {
        let (answer, answered) = oneshot::channel();
        self.counters.queued.fetch_add(1, Ordering::SeqCst);
        if let Err(mpsc::error::SendError(p)) = self.tx.send(Pending { item, answer }) {
            self.counters.queued.fetch_sub(1, Ordering::SeqCst);
            return Ok(Committed { item: p.item, outcome: Grouped::Alone });
        }
        answered.await.map_err(|_| StoreError::Unavailable(sqlx::Error::WorkerCrashed))
    }

    /// Writes queued and not yet in a batch (for tests and metrics).
    pub fn queued(&self) -> usize {
        self.counters.queued.load(Ordering::SeqCst)
    }

    /// Writes taken into a batch so far, committed or not (for tests: a write is in a
    /// writer's hands once this counts it, which `queued` cannot tell from a write not
    /// submitted yet).
    pub fn taken(&self) -> u64 {
        self.counters.taken.load(Ordering::SeqCst)
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

type Queue<I, O> = Arc<Mutex<mpsc::UnboundedReceiver<Pending<I, O>>>>;

async fn run<W: BatchWrite>(
    write: Arc<W>,
    rx: Queue<W::Item, W::Output>,
    counters: Arc<Counters>,
    fleet: Arc<Fleet>,
    linger: Duration,
) {
    loop {
        // Take what has queued up, holding the queue only while taking it, so another
        // writer gathers the next batch while this one commits.
        let (batch, committing) = {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else { return };
            let batch = gather(first, &mut rx, &counters, &fleet, linger).await;
            counters.queued.fetch_sub(batch.len(), Ordering::SeqCst);
            counters.taken.fetch_add(batch.len() as u64, Ordering::SeqCst);
            // Counted before the queue is let go, so the next writer sees it.
            let committing = Committing::start(&counters, batch.len());
            (batch, committing)
        };
        let (items, answers): (Vec<W::Item>, Vec<_>) = batch.into_iter().map(|p| (p.item, p.answer)).unzip();
        let started = std::time::Instant::now();
        let written = write.write(&items).await;
        drop(committing);
        if let Some(report) = counters.report.get() {
            report.batch_size.observe(items.len() as f64);
            report.write_seconds.observe(started.elapsed().as_secs_f64());
        }
        match written {
            Ok(outputs) => {
                counters.commits.fetch_add(1, Ordering::SeqCst);
                for ((answer, item), output) in answers.into_iter().zip(items).zip(outputs) {
                    let _ = answer.send(Committed { item, outcome: Grouped::Stored(output) });
                }
            }
            Err(error) if items.len() == 1 && !error.refuses_row() => {
                counters.failed.fetch_add(1, Ordering::SeqCst);
                if let (Some(answer), Some(item)) = (answers.into_iter().next(), items.into_iter().next()) {
                    let _ = answer.send(Committed { item, outcome: Grouped::Failed(error) });
                }
            }
            Err(error) => {
                counters.failed.fetch_add(1, Ordering::SeqCst);
                tracing::debug!(%error, writes = items.len(), "a group commit failed; each write is retried alone");
                for (answer, item) in answers.into_iter().zip(items) {
                    let _ = answer.send(Committed { item, outcome: Grouped::Alone });
                }
            }
        }
    }
}

/// A writer's batch out of `writes` writes, counted in `Counters::committing` and
/// `Counters::in_commit` until dropped (also by a panicking write, so the other writer
/// never waits on a commit that is gone, nor counts its writes as in hand).
struct Committing<'a> {
    counters: &'a Counters,
    writes: usize,
}

impl<'a> Committing<'a> {
    fn start(counters: &'a Counters, writes: usize) -> Committing<'a> {
        counters.committing.fetch_add(1, Ordering::SeqCst);
        counters.in_commit.fetch_add(writes, Ordering::SeqCst);
        Committing { counters, writes }
    }
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        self.counters.in_commit.fetch_sub(self.writes, Ordering::SeqCst);
        self.counters.committing.fetch_sub(1, Ordering::SeqCst);
        self.counters.ended.notify_waiters();
    }
}

/// The batch that starts with `first`: everything queued behind it, up to
/// [`MAX_BATCH`]. While other instances share the database, or the database is near,
/// and another writer's commit is out, a batch short of full waits (taking what
/// arrives) until it is full or that commit has ended. Then, short of full, it waits
/// up to `linger` for the writes still expected.
async fn gather<I, O>(
    first: Pending<I, O>,
    rx: &mut mpsc::UnboundedReceiver<Pending<I, O>>,
    counters: &Counters,
    fleet: &Fleet,
    linger: Duration,
) -> Vec<Pending<I, O>> {
    let mut batch = vec![first];
    loop {
        take_queued(&mut batch, rx);
        if batch.len() >= MAX_BATCH {
            return batch;
        }
        if !(fleet.crowded() || fleet.near()) {
            return wait_for_expected(batch, rx, counters, linger).await;
        }
        // Listening before looking, so an end told in between is not missed.
        let ended = counters.ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if counters.committing.load(Ordering::SeqCst) == 0 {
            return wait_for_expected(batch, rx, counters, linger).await;
        }
        tokio::select! {
            next = rx.recv() => match next {
                Some(p) => batch.push(p),
                // The group is gone: what was taken is still written.
                None => return batch,
            },
            () = &mut ended => {}
        }
    }
}

/// Moves what is queued into `batch`, up to [`MAX_BATCH`].
fn take_queued<I, O>(batch: &mut Vec<Pending<I, O>>, rx: &mut mpsc::UnboundedReceiver<Pending<I, O>>) {
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(p) => batch.push(p),
            Err(_) => break,
        }
    }
}

/// `batch`, grown by what arrives within `linger` while some expected write is neither
/// queued nor in a batch out; at once when none is (a lone write goes out at once), and
/// at once when more are still to come than the batch has room for: those cannot all
/// join it, so waiting would only fill it up (with many keys in flight, or other
/// instances pacing the writers, nearly every batch waited out the linger for nothing).
async fn wait_for_expected<I, O>(
    mut batch: Vec<Pending<I, O>>,
    rx: &mut mpsc::UnboundedReceiver<Pending<I, O>>,
    counters: &Counters,
    linger: Duration,
) -> Vec<Pending<I, O>> {
    let deadline = tokio::time::Instant::now() + linger;
    loop {
        take_queued(&mut batch, rx);
        // `queued` counts this batch too: it is let go of when the batch is taken.
        let in_hand = counters.queued.load(Ordering::SeqCst) + counters.in_commit.load(Ordering::SeqCst);
        let to_come = counters.expected.load(Ordering::SeqCst).saturating_sub(in_hand);
        if batch.len() >= MAX_BATCH || to_come == 0 || to_come > MAX_BATCH - batch.len() {
            return batch;
        }
        tokio::select! {
            next = rx.recv() => match next {
                Some(p) => batch.push(p),
                None => return batch,
            },
            () = tokio::time::sleep_until(deadline) => {
                if let Some(report) = counters.report.get() {
                    report.lingered_out.inc();
                }
                return batch;
            }
        }
    }
}

/// Inserts of new entries ([`Store::insert_batch`]), received at the clock's time
/// when their batch is written.
pub struct Inserts {
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
}

#[async_trait]
impl BatchWrite for Inserts {
    type Item = NewEntry;
    type Output = InsertOutcome;

    async fn write(&self, entries: &[NewEntry]) -> Result<Vec<InsertOutcome>, StoreError> {
        self.store.insert_batch(entries, self.clock.now()).await
    }
}

/// Settles of attempts ([`Store::settle_batch`]); a lost lease is one item's
/// outcome, not the batch's failure.
pub struct Settles(pub Arc<dyn Store>);

#[async_trait]
impl BatchWrite for Settles {
    type Item = SettleRequest;
    type Output = Result<Option<Claimed>, StoreError>;

    async fn write(&self, items: &[SettleRequest]) -> Result<Vec<Result<Option<Claimed>, StoreError>>, StoreError> {
        self.0.settle_batch(items).await
    }
}

/// Group commit of push inserts.
pub type GroupCommit = Group<Inserts>;
