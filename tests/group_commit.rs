//! Group commit of single inserts (`inlet::inbox::group`), on both stores: inserts
//! that queue up while a commit is in flight go out together in one transaction, each
//! answered only once its row is committed; a failed batch hands every insert back
//! to be tried alone, so one bad row cannot fail its neighbours. With other instances
//! on the database, or with the database near, a second writer commits beside the
//! first only a full batch.
//!
//! The batches are made deterministic by holding the database's write lock from
//! another connection: the writers block on it, and the test waits (by state, not by
//! time) until every later insert is queued before letting go.

use std::sync::Arc;
use std::time::Duration;

use inlet::clock::Millis;
use inlet::inbox::group::{Fleet, GroupCommit, GroupReport, Grouped, Inserts, MAX_BATCH};
use inlet::inbox::{self, Decoded, InsertOutcome, NewEntry, Status, Store};
use inlet_testkit::pg::TestPg;
use inlet_testkit::proxy::TcpProxy;
use inlet_testkit::wait::wait_until;
use sqlx::Connection;

const T0: Millis = 1_800_000_000_000;
/// Inserts queued behind the two the writers are blocked on.
const QUEUED: usize = 30;

fn entry(n: usize, key: &str) -> NewEntry {
    NewEntry {
        route: "r".into(),
        dedup_key: format!("d-{n}"),
        decoded: Some(Decoded {
            event_type: "test".into(),
            correlation_key: key.into(),
            schema_version: None,
            body: format!("body {n}").into_bytes(),
        }),
        raw_data: format!("raw {n}").into_bytes(),
        attributes: vec![],
        message_id: format!("m-{n}"),
        publish_time: None,
        delivery_attempt: Some(1),
        status: Status::Open,
        last_error: None,
    }
}

/// A report of a group's batches that the test reads back.
fn report() -> GroupReport {
    use prometheus_client::metrics::histogram::Histogram;
    GroupReport {
        batch_size: Histogram::new([1.0, 2.0, 4.0]),
        write_seconds: Histogram::new([0.001, 0.01, 0.1]),
        expected: Default::default(),
        lingered_out: Default::default(),
    }
}

/// The count and sum of `histogram`, as a scrape shows them.
fn observed(histogram: &prometheus_client::metrics::histogram::Histogram) -> (u64, f64) {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register("h", "read back", histogram.clone());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let value = |name: &str| {
        let line =
            text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name} in {text}"));
        line.rsplit(' ').next().unwrap().parse::<f64>().unwrap()
    };
    (value("h_count") as u64, value("h_sum"))
}

/// An inserts' group on a fresh database, one writer lingering `linger`, and the report
/// it tells its batches to (the database lasts as long as the `TestPg`).
async fn lingering_group(linger: Duration) -> (TestPg, GroupCommit, GroupReport) {
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 4).await.expect("open postgres");
    let group = GroupCommit::start_lingering(inserts(&store), 1, Arc::new(Fleet::default()), linger);
    let told = report();
    group.report_to(told.clone());
    (pg, group, told)
}

fn inserts(store: &Arc<dyn Store>) -> Inserts {
    Inserts { store: Arc::clone(store), clock: inlet::clock::ManualClock::new(T0) }
}

/// Spawns an insert through the group committer.
fn spawn_insert(
    group: &Arc<GroupCommit>,
    e: NewEntry,
) -> tokio::task::JoinHandle<Result<inbox::group::Committed<NewEntry, InsertOutcome>, inbox::StoreError>> {
    let group = Arc::clone(group);
    tokio::spawn(async move { group.submit(e).await })
}

async fn until_queued(group: &GroupCommit, n: usize) {
    wait_until(&format!("{n} inserts queued"), Duration::from_secs(8), || async { group.queued() == n }).await;
}

/// Waits until a writer has taken `n` inserts. (Not `queued() == 0`: that also holds
/// before a spawned insert has been submitted, and a writer that then finds it and
/// the ones behind it queued takes them all into one batch.)
async fn until_taken(group: &GroupCommit, n: u64) {
    wait_until(&format!("{n} inserts taken by a writer"), Duration::from_secs(8), || async { group.taken() == n })
        .await;
}

/// Two inserts taken by the two writers (each blocked on the lock), then `QUEUED` more
/// behind them; `release` lets the database go. Every insert must be stored, in
/// exactly three commits, and each answered row readable by another connection.
async fn batches_what_queued_up(store: Arc<dyn Store>, release: impl AsyncFnOnce()) {
    let group = Arc::new(GroupCommit::start(inserts(&store), 2, Arc::new(Fleet::default())));
    let mut inserts = Vec::new();
    for n in 0..2 {
        inserts.push(spawn_insert(&group, entry(n, "K")));
        until_taken(&group, n as u64 + 1).await;
    }
    for n in 2..2 + QUEUED {
        inserts.push(spawn_insert(&group, entry(n, &format!("K{}", n % 5))));
    }
    until_queued(&group, QUEUED).await;
    assert_eq!(group.commits(), 0, "nothing commits while the database is locked");
    release().await;

    let mut ids = Vec::new();
    for insert in inserts {
        let committed = insert.await.unwrap().expect("the group committer answers");
        let Grouped::Stored(InsertOutcome::Inserted { id }) = committed.outcome else {
            panic!("entry {} was not stored with its batch", committed.item.dedup_key)
        };
        // Answered after the commit: the row is there for everyone.
        let row = store.get(id).await.unwrap().expect("an answered insert's row is committed");
        assert_eq!(row.dedup_key, committed.item.dedup_key);
        ids.push(id);
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 2 + QUEUED, "one row per insert");
    assert_eq!(group.commits(), 3, "the two blocked inserts, then everything that queued behind them in one");
    assert_eq!(group.failed(), 0);

    // A redelivery through the committer is absorbed like any duplicate insert.
    let again = group.submit(entry(7, "K2")).await.unwrap();
    assert!(
        matches!(again.outcome, Grouped::Stored(InsertOutcome::Duplicate { .. })),
        "a redelivered message is a duplicate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_inserts_that_queue_up_commit_together() {
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 4).await.expect("open postgres");
    let mut locker = pg.connect().await;
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    // Blocks every insert (ROW EXCLUSIVE) but not reads.
    sqlx::query("LOCK TABLE inbox_entry IN EXCLUSIVE MODE").execute(&mut locker).await.unwrap();
    batches_what_queued_up(store, async || {
        sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_inserts_that_queue_up_commit_together() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
    let store = inbox::open(&url, 4).await.expect("open sqlite");
    let options = inlet::inbox::sqlite::connect_options(&url).unwrap();
    let mut locker = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
    // The store's own busy timeout (10 s) is how long the writers wait for it.
    sqlx::query("BEGIN EXCLUSIVE").execute(&mut locker).await.unwrap();
    batches_what_queued_up(store, async || {
        sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
    })
    .await;
}

/// Why a second writer holds back a batch short of full.
#[derive(Clone, Copy)]
enum Pacing {
    /// Another instance relays one of the process's routes.
    OtherInstances,
    /// The database is near: a commit's time is its work, not the wire's.
    NearDatabase,
}

/// With other instances on the database, or with the database near: one insert taken
/// by a writer (blocked on the lock), then `behind` more queued behind it. Short of a
/// full batch, the second writer holds them until the first commit has ended, so none
/// is taken before the release; a full batch it takes while the first commit is still
/// blocked. Either way every insert is stored, in exactly two commits.
async fn paced_batches(pacing: Pacing, behind: usize) {
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 4).await.expect("open postgres");
    let mut locker = pg.connect().await;
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE inbox_entry IN EXCLUSIVE MODE").execute(&mut locker).await.unwrap();
    let fleet = Arc::new(Fleet::default());
    match pacing {
        Pacing::OtherInstances => {
            fleet.seen("r", 2);
            assert!(fleet.crowded());
        }
        Pacing::NearDatabase => {
            fleet.round_trip(Duration::from_micros(60));
            assert!(fleet.near() && !fleet.crowded());
        }
    }
    let group = Arc::new(GroupCommit::start(inserts(&store), 2, Arc::clone(&fleet)));
    let mut inserts = vec![spawn_insert(&group, entry(0, "K"))];
    until_taken(&group, 1).await;
    for n in 1..1 + behind {
        inserts.push(spawn_insert(&group, entry(n, &format!("K{}", n % 5))));
    }
    if behind < MAX_BATCH {
        until_queued(&group, behind).await;
        assert_eq!(group.taken(), 1, "a batch short of full is not taken while another commit is out");
    } else {
        until_taken(&group, 1 + behind as u64).await;
    }
    assert_eq!(group.commits(), 0, "nothing commits while the database is locked");
    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();

    let mut stored = 0;
    for insert in inserts {
        let committed = insert.await.unwrap().expect("the group committer answers");
        assert!(
            matches!(committed.outcome, Grouped::Stored(InsertOutcome::Inserted { .. })),
            "entry {} was not stored with its batch",
            committed.item.dedup_key
        );
        stored += 1;
    }
    assert_eq!(stored, 1 + behind);
    assert_eq!(group.commits(), 2, "the blocked insert, then everything that queued behind it in one");

    // The other instances gone, a lone write is not held back by anything; nor is it
    // with the database near and no commit out.
    fleet.left("r");
    assert!(!fleet.crowded());
    let alone = group.submit(entry(1 + behind, "K")).await.unwrap();
    assert!(matches!(alone.outcome, Grouped::Stored(InsertOutcome::Inserted { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_other_instances_a_batch_short_of_full_waits_for_the_commit_out() {
    paced_batches(Pacing::OtherInstances, QUEUED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_other_instances_a_full_batch_commits_beside_the_commit_out() {
    paced_batches(Pacing::OtherInstances, MAX_BATCH).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_database_near_a_batch_short_of_full_waits_for_the_commit_out() {
    paced_batches(Pacing::NearDatabase, QUEUED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_database_near_a_full_batch_commits_beside_the_commit_out() {
    paced_batches(Pacing::NearDatabase, MAX_BATCH).await;
}

/// Whether the database is near is read off the fastest round trip of the last five
/// calibrations: one busy minute does not make it far, five in a row do, and one
/// fast round trip makes it near again.
#[test]
fn the_database_is_near_while_one_of_the_last_five_round_trips_was_fast() {
    let fleet = Fleet::default();
    assert!(!fleet.near(), "far until measured: two free writers, as across a network");
    fleet.round_trip(Duration::from_micros(60));
    assert!(fleet.near());
    for slow in 1..=4 {
        fleet.round_trip(Duration::from_millis(3));
        assert!(fleet.near(), "{slow} slow calibrations after a fast one");
    }
    fleet.round_trip(Duration::from_millis(3));
    assert!(!fleet.near(), "five slow calibrations in a row");
    fleet.round_trip(inbox::group::NEAR);
    assert!(!fleet.near(), "near is faster than NEAR");
    fleet.round_trip(inbox::group::NEAR - Duration::from_micros(1));
    assert!(fleet.near());
}

/// A batch with a row PostgreSQL refuses (a NUL in text) fails whole; every insert
/// comes back to be tried alone, and the good ones then store as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_row_hands_its_whole_batch_back_to_be_inserted_alone() {
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 4).await.expect("open postgres");
    let mut locker = pg.connect().await;
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE inbox_entry IN EXCLUSIVE MODE").execute(&mut locker).await.unwrap();

    let group = Arc::new(GroupCommit::start(inserts(&store), 1, Arc::new(Fleet::default())));
    let first = spawn_insert(&group, entry(0, "K"));
    until_taken(&group, 1).await;
    let mut poison = entry(1, "K");
    poison.decoded.as_mut().unwrap().correlation_key = "bad\0key".into();
    let batch =
        [spawn_insert(&group, entry(2, "K")), spawn_insert(&group, poison), spawn_insert(&group, entry(3, "K"))];
    until_queued(&group, 3).await;
    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();

    let first = first.await.unwrap().unwrap();
    assert!(matches!(first.outcome, Grouped::Stored(InsertOutcome::Inserted { .. })));
    for insert in batch {
        let back = insert.await.unwrap().unwrap();
        assert!(matches!(back.outcome, Grouped::Alone), "{}: handed back to be inserted alone", back.item.dedup_key);
        if back.item.dedup_key != "d-1" {
            let outcome = store.insert(&back.item, T0).await.expect("a good row inserts alone");
            assert!(matches!(outcome, InsertOutcome::Inserted { .. }));
        } else {
            let error = store.insert(&back.item, T0).await.expect_err("the NUL row is refused alone too");
            assert!(error.refuses_row(), "told from an outage: {error}");
        }
    }
    assert_eq!((group.commits(), group.failed()), (1, 1));
}

/// Alone in its batch and failing for a reason that is not about the row (the
/// database is gone), an insert is answered with that error at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_fails_a_lone_insert_with_the_stores_error() {
    let pg = TestPg::new().await;
    let proxy = TcpProxy::start("127.0.0.1:5432").await;
    let url = pg.url.replace("127.0.0.1:5432", &proxy.addr);
    assert_ne!(url, pg.url, "the store must go through the proxy");
    let store = inbox::open(&url, 2).await.expect("open postgres through the proxy");
    let group = GroupCommit::start(inserts(&store), 1, Arc::new(Fleet::default()));
    let ok = group.submit(entry(0, "K")).await.unwrap();
    assert!(matches!(ok.outcome, Grouped::Stored(InsertOutcome::Inserted { .. })));
    proxy.set_up(false);
    let failed = group.submit(entry(1, "K")).await.unwrap();
    let Grouped::Failed(error) = failed.outcome else {
        panic!("a lone insert in an outage fails with the store's error")
    };
    assert!(error.is_transient(), "an outage is transient: {error}");
}

/// A pooled connection that died while it sat idle (the server restarted, a
/// middlebox dropped it) is replaced before a statement meets it: the pool pings a
/// connection idle for a second or more before handing it out (and only such a one:
/// the hot path's connections are back within milliseconds and pay no round trip).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_while_idle_is_replaced_before_an_insert_meets_it() {
    let pg = TestPg::new().await;
    let proxy = TcpProxy::start("127.0.0.1:5432").await;
    let url = pg.url.replace("127.0.0.1:5432", &proxy.addr);
    // One connection, so the insert after the cut gets the one that was cut.
    let store = inbox::open(&url, 1).await.expect("open postgres through the proxy");
    assert!(matches!(store.insert(&entry(0, "K"), T0).await.unwrap(), InsertOutcome::Inserted { .. }));
    // The connection goes back to the pool after a ping of sqlx's own, in a task of
    // its own; cut during that ping it would be closed then, and this would not test
    // the idle connection. (Either way the insert below must succeed.)
    tokio::time::sleep(Duration::from_millis(200)).await; // lets sqlx's return ping end first (above)
    // Every open connection cut, and new ones let through again at once.
    proxy.set_up(false);
    proxy.set_up(true);
    // Idle past the pool's ping threshold (`PING_IF_IDLE_FOR`, one second): time is
    // what this is about.
    tokio::time::sleep(Duration::from_millis(1_500)).await; // idleness is what is under test
    let outcome = store.insert(&entry(1, "K"), T0).await;
    assert!(matches!(outcome, Ok(InsertOutcome::Inserted { .. })), "the first insert after the cut: {outcome:?}");
    let mut direct = sqlx::PgConnection::connect(&pg.url).await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_entry").fetch_one(&mut direct).await.unwrap();
    assert_eq!(rows, 2);
}

/// The pool opened with `n` connections, each now idle: `n` reads held by a lock on
/// the table until all `n` wait, then let go.
async fn open_connections(pg: &TestPg, store: &Arc<dyn Store>, n: usize) {
    let mut locker = pg.connect().await;
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE inbox_entry IN ACCESS EXCLUSIVE MODE").execute(&mut locker).await.unwrap();
    let reads: Vec<_> = (0..n)
        .map(|_| {
            let store = Arc::clone(store);
            tokio::spawn(async move { store.get(1).await })
        })
        .collect();
    let waiting =
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
    wait_until(&format!("{n} reads waiting on the lock"), Duration::from_secs(10), || async move {
        let mut direct = pg.connect().await;
        sqlx::query_scalar::<_, i64>(waiting).fetch_one(&mut direct).await.unwrap() == n as i64
    })
    .await;
    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
    for read in reads {
        read.await.unwrap().expect("a read");
    }
}

/// The server processes of this database (other than the asking one) whose last
/// statement ended a batch: a `COMMIT`, or the batch insert that commits alone (it
/// runs without a transaction around it on PostgreSQL).
async fn backends_that_committed(pg: &TestPg) -> i64 {
    let mut direct = pg.connect().await;
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND (query = 'COMMIT' OR query LIKE 'WITH new AS (%')",
    )
    .fetch_one(&mut direct)
    .await
    .unwrap()
}

/// Batches one after another go out on the connection the last one used, not on each
/// of the pool's idle connections in turn (sqlx hands out the one idle longest): a
/// writer's transactions keep to one server process, whose caches are warm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_one_after_another_keep_to_one_connection() {
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 8).await.expect("open postgres");
    open_connections(&pg, &store, 8).await;
    // Connections closed before (the migration's, the lock holder's) leave
    // pg_stat_activity only when their server processes have exited, which is not
    // when the close returns: one whose last statement was a COMMIT counted here as
    // a batch on a loaded machine. None may stay, though: a batch before this point
    // would.
    wait_until(
        "no batch yet (no server process of this database whose last statement was a commit)",
        Duration::from_secs(10),
        || {
            let pg = &pg;
            async move { backends_that_committed(pg).await == 0 }
        },
    )
    .await;
    for b in 0..40 {
        let batch = [entry(2 * b, "B"), entry(2 * b + 1, "B")];
        let outcomes = store.insert_batch(&batch, T0).await.unwrap();
        assert!(outcomes.iter().all(|o| matches!(o, InsertOutcome::Inserted { .. })), "{outcomes:?}");
    }
    assert_eq!(backends_that_committed(&pg).await, 1, "forty batches on one server process");
}

/// A writer's kept connection that died while it sat idle is replaced before a batch
/// meets it, as the pool's own are: pinged when taken after a second or more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_connection_cut_while_idle_is_replaced_before_a_batch_meets_it() {
    let pg = TestPg::new().await;
    let proxy = TcpProxy::start("127.0.0.1:5432").await;
    let url = pg.url.replace("127.0.0.1:5432", &proxy.addr);
    // Two connections: one kept for the writers, one for the rest.
    let store = inbox::open(&url, 2).await.expect("open postgres through the proxy");
    let first = store.insert_batch(&[entry(0, "K"), entry(1, "K")], T0).await.unwrap();
    assert!(first.iter().all(|o| matches!(o, InsertOutcome::Inserted { .. })), "{first:?}");
    // Every open connection cut, the kept one among them, and new ones let through.
    proxy.set_up(false);
    proxy.set_up(true);
    // Idle past the ping threshold (`PING_IF_IDLE_FOR`, one second): time is what this
    // is about.
    tokio::time::sleep(Duration::from_millis(1_500)).await; // idleness is what is under test
    let second = store.insert_batch(&[entry(2, "K"), entry(3, "K")], T0).await;
    assert!(
        second.as_ref().is_ok_and(|o| o.iter().all(|o| matches!(o, InsertOutcome::Inserted { .. }))),
        "the first batch after the cut: {second:?}"
    );
    let mut direct = sqlx::PgConnection::connect(&pg.url).await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_entry").fetch_one(&mut direct).await.unwrap();
    assert_eq!(rows, 4);
}

/// The database clock's calibration measures the round trip the writers are paced by,
/// and reads its offset from the fastest of its samples: the clock then agrees with
/// the database's to within that round trip (and the milliseconds' rounding).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clocks_calibration_measures_the_round_trip_to_the_database() {
    use inlet::clock::Clock;
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 2).await.expect("open postgres");
    let clock = inbox::DbClock::new(store.as_ref()).await.expect("calibrate");
    let calibrated = clock.round_trip();
    assert!(calibrated > Duration::ZERO && calibrated < Duration::from_secs(5), "round trip {calibrated:?}");
    let started = std::time::Instant::now();
    let before = clock.now();
    let db = store.db_now().await.unwrap();
    let after = clock.now();
    let slack = (calibrated + started.elapsed()).as_millis() as Millis + 2;
    assert!(before - slack <= db && db <= after + slack, "database {db}, clock {before}..{after}, slack {slack} ms");
}

/// Writes the group expects (a relay's slots, each with an attempt in flight) that
/// come in while a batch lingers commit with it: one commit for both, answered as soon
/// as the last expected one is in, not after the linger. A write with nothing else
/// expected goes out at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expected_writes_that_come_in_while_a_batch_lingers_commit_with_it() {
    const LONG: Duration = Duration::from_secs(20);
    let (_pg, group, told) = lingering_group(LONG).await;
    let group = Arc::new(group);
    let (a, b) = (group.expect(), group.expect());
    assert_eq!(told.expected.get(), 2, "the writes expected are shown");
    let started = std::time::Instant::now();
    let first = spawn_insert(&group, entry(0, "A"));
    until_queued(&group, 1).await;
    assert_eq!(group.commits(), 0, "the first write waits for the second one expected");
    let second = spawn_insert(&group, entry(1, "B"));
    for insert in [first, second] {
        let committed = insert.await.unwrap().expect("answered");
        assert!(matches!(committed.outcome, Grouped::Stored(InsertOutcome::Inserted { .. })));
    }
    assert!(started.elapsed() < LONG, "answered when the last expected write came in, not after the linger");
    assert_eq!(group.commits(), 1, "both expected writes in one commit");
    assert_eq!(observed(&told.batch_size), (1, 2.0), "one batch of two is shown");
    assert_eq!(told.lingered_out.get(), 0, "the batch did not wait out its linger");

    drop(b);
    assert_eq!(told.expected.get(), 1, "a dropped expectation is taken back");
    let started = std::time::Instant::now();
    let lone = group.submit(entry(2, "A")).await.unwrap();
    assert!(matches!(lone.outcome, Grouped::Stored(InsertOutcome::Inserted { .. })));
    assert!(started.elapsed() < LONG, "the one expected write is in: nothing to wait for");
    assert_eq!(group.commits(), 2);
    assert_eq!(observed(&told.batch_size), (2, 3.0));
    assert_eq!(observed(&told.write_seconds).0, 2, "each batch's write is timed");
    drop(a);
    assert_eq!(told.expected.get(), 0);
}

/// More writes still to come than a batch has room for (many keys in flight) cannot all
/// join it: the batch goes at once instead of lingering to fill up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expected_writes_that_cannot_all_join_a_batch_are_not_waited_for() {
    const LONG: Duration = Duration::from_secs(20);
    let (_pg, group, told) = lingering_group(LONG).await;
    // This write and MAX_BATCH more: one more than the batch's room.
    let expected: Vec<_> = (0..=MAX_BATCH).map(|_| group.expect()).collect();
    let started = std::time::Instant::now();
    let alone = group.submit(entry(0, "A")).await.unwrap();
    assert!(matches!(alone.outcome, Grouped::Stored(InsertOutcome::Inserted { .. })));
    assert!(
        started.elapsed() < LONG,
        "answered after {:?}: it waited for writes that could not fit",
        started.elapsed()
    );
    assert_eq!((group.commits(), told.lingered_out.get()), (1, 0));
    drop(expected);
}

/// An expected write that does not come (a slow target, an attempt that ends without
/// settling through the group) holds a batch for the linger and no longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expected_write_that_does_not_come_holds_a_batch_for_the_linger_only() {
    const LINGER: Duration = Duration::from_millis(300);
    let (_pg, group, told) = lingering_group(LINGER).await;
    let (_a, _never) = (group.expect(), group.expect());
    let started = std::time::Instant::now();
    let alone = group.submit(entry(0, "A")).await.unwrap();
    let took = started.elapsed();
    assert!(matches!(alone.outcome, Grouped::Stored(InsertOutcome::Inserted { .. })));
    assert!(took >= LINGER, "answered after {took:?}, before the linger ended");
    assert!(took < Duration::from_secs(10), "answered after {took:?}: held past the linger");
    assert_eq!(group.commits(), 1);
    assert_eq!(told.lingered_out.get(), 1, "the linger waited out is counted");
}
