//! The interleavings that could put two entries of one key in flight at once, forced
//! deterministically with explicit transactions held open between steps:
//!
//! (a) an insert of a key still uncommitted while a later insert of the key has
//!     committed (ids are drawn at insert, not at commit; for a key seen before: a
//!     new key's first inserts wait for each other);
//! (b) a parked entry requeued (`parked = "pass"`) while a claim of a later entry of
//!     its key is in flight;
//! (c) an entry parked before decoding, requeued, claimed and re-decoded into a key
//!     while a claim of a later entry of that key is in flight.
//!
//! And on PostgreSQL, claims that change from a route's heads to its window mid-drain
//! (how many entries wait per key decides where a claim starts) keep every key's order.
//!
//! On PostgreSQL a claim holds a lock per (route, key) from before its snapshot until
//! it commits, and inserts hold the key's lock shared (src/inbox/postgres.rs): the
//! second claimer must skip the key. On SQLite every writer is serialized: the second
//! step waits for the first transaction instead of slipping past it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use inlet::clock::Millis;
use inlet::inbox::{self, ClaimRequest, Claimed, Decoded, NewEntry, Settlement, Status, Store};
use inlet_testkit::pg::TestPg;
use sqlx::Connection;

const T0: Millis = 1_800_000_000_000;
const LEASE: i64 = 30_000;

fn entry(key: Option<&str>, dedup: &str) -> NewEntry {
    NewEntry {
        route: "r".into(),
        dedup_key: dedup.into(),
        decoded: key.map(|k| Decoded {
            event_type: "test".into(),
            correlation_key: k.into(),
            schema_version: None,
            body: dedup.as_bytes().to_vec(),
        }),
        raw_data: dedup.as_bytes().to_vec(),
        attributes: vec![],
        message_id: format!("msg-{dedup}"),
        publish_time: None,
        delivery_attempt: Some(1),
        status: if key.is_some() { Status::Open } else { Status::Parked },
        last_error: key.is_none().then(|| "decode failed: garbage".to_string()),
    }
}

fn req(owner: &str, parked_blocks: bool) -> ClaimRequest<'_> {
    ClaimRequest { route: "r", owner, limit: 10, now: T0, lease_ms: LEASE, ordered: true, parked_blocks, share: None }
}

fn ids(claimed: &[Claimed]) -> Vec<i64> {
    claimed.iter().map(|c| c.entry.id).collect()
}

async fn insert(store: &Arc<dyn Store>, e: NewEntry) -> i64 {
    store.insert(&e, T0).await.expect("insert").id()
}

/// Binds an entry to the backend's insert statement, as the store does.
macro_rules! insert_by_hand {
    ($sql:expr, $e:expr, $conn:expr) => {{
        let e: &NewEntry = $e;
        let d = e.decoded.as_ref();
        let id: i64 = sqlx::query_scalar($sql)
            .bind(&e.route)
            .bind(&e.dedup_key)
            .bind(d.map(|d| d.correlation_key.as_str()))
            .bind(d.map(|d| d.event_type.as_str()))
            .bind(None::<String>)
            .bind(d.map(|d| d.body.as_slice()))
            .bind(e.raw_data.as_slice())
            .bind("[]")
            .bind(&e.message_id)
            .bind(None::<String>)
            .bind(e.delivery_attempt)
            .bind(e.payload_digest())
            .bind(None::<i64>)
            .bind(e.status.as_str())
            .bind(T0)
            .bind(e.last_error.as_deref())
            .bind(None::<i64>)
            .bind(e.last_error.as_deref().map(inlet::inbox::failures::fingerprint))
            .fetch_one($conn)
            .await
            .expect("insert by hand");
        id
    }};
}

/// Binds a claim request to one of the claim statements, as the stores do: `$1`–`$5`
/// for the candidates, then `$6` owner and `$7` lease.
macro_rules! claim_by_hand {
    ($query:expr, $r:expr) => {{
        let r: &ClaimRequest<'_> = $r;
        $query
            .bind(r.route)
            .bind(r.now)
            .bind(r.ordered)
            .bind(r.parked_blocks)
            .bind(i64::from(r.limit))
            .bind(r.owner)
            .bind(r.lease_ms)
    }};
}

// ------------------------------------------------------------------------------------
// PostgreSQL: two claimers
// ------------------------------------------------------------------------------------

/// Claimer A: the store's ordered claim, by hand, in a transaction left open.
async fn pg_claim_held_open(conn: &mut sqlx::PgConnection, owner: &str, parked_blocks: bool) -> Vec<i64> {
    use inlet::inbox::postgres::{CLAIM_HELD_SQL, CLAIM_KEYS_SQL};
    let r = req(owner, parked_blocks);
    sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
    let candidates: Vec<(i64, Option<String>)> = sqlx::query_as(CLAIM_KEYS_SQL)
        .bind(r.route)
        .bind(r.now)
        .bind(r.ordered)
        .bind(r.parked_blocks)
        .bind(i64::from(r.limit))
        .bind(4_096i64) // the window: every entry here
        .bind(None::<i64>) // every key: no part
        .bind(None::<i64>)
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    let (ids, keys): (Vec<i64>, Vec<Option<String>>) = candidates.into_iter().unzip();
    let held: Vec<String> = keys.into_iter().flatten().collect();
    let claim = CLAIM_HELD_SQL.replace("SELECT claimed.* FROM claimed", "SELECT claimed.id FROM claimed");
    assert_ne!(claim, CLAIM_HELD_SQL, "the claim's last line changed: change it here too");
    claim_by_hand!(sqlx::query_scalar(&claim), &r).bind(&ids).bind(&held).fetch_all(&mut *conn).await.unwrap()
}

async fn pg() -> (Arc<dyn Store>, TestPg) {
    let pg = TestPg::new().await;
    (inbox::open(&pg.url, 8).await.expect("open postgres"), pg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_claim_never_passes_an_older_insert_still_in_flight() {
    let (store, pg) = pg().await;
    // K exists already (its row in inbox_key_floor): the inserts below do not wait for
    // each other (see the next test for a new key's).
    let earlier = insert(&store, entry(Some("K"), "e-0")).await;
    let c = store.claim(&req("a", true)).await.unwrap();
    assert_eq!(ids(&c), vec![earlier]);
    store.settle(earlier, &c[0].lease, T0, &Settlement::Done).await.unwrap();

    let mut ingest = pg.connect().await;
    sqlx::query("BEGIN").execute(&mut ingest).await.unwrap();
    let older = insert_by_hand!(inlet::inbox::postgres::INSERT_SQL, &entry(Some("K"), "e-1"), &mut ingest);
    let newer = insert(&store, entry(Some("K"), "e-2")).await;
    assert!(older < newer, "ids are drawn in insert order");

    let while_in_flight = store.claim(&req("b", true)).await.unwrap();
    assert_eq!(ids(&while_in_flight), Vec::<i64>::new(), "the key is held by the uncommitted insert of {older}");

    sqlx::query("COMMIT").execute(&mut ingest).await.unwrap();
    let first = store.claim(&req("b", true)).await.unwrap();
    assert_eq!(ids(&first), vec![older], "the older entry goes first");
    assert!(store.claim(&req("c", true)).await.unwrap().is_empty(), "one entry of the key in flight");
}

/// A route of few keys with many entries waiting per key is claimed from its heads;
/// drained to a few per key, from its window again (src/inbox/postgres.rs,
/// `HEADS_FIRST_WAITING_PER_KEY`, `WAITING_RECOUNT`). Either way a claim takes one entry
/// per key at most, each key's entries in their order, and nothing while every key is
/// in flight, though entries wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_claims_from_the_heads_and_from_the_window_keep_each_keys_order() {
    let (store, _pg) = pg().await;
    let keys = ["A", "B", "C"];
    let mut expected: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    // 100 per key: heads first after the first count of the keys (more than 64 per key).
    for i in 0..100 {
        for k in keys {
            let id = insert(&store, entry(Some(k), &format!("{k}-{i}"))).await;
            expected.entry(k.to_string()).or_default().push(id);
        }
    }
    let mut delivered: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut rested = false;
    loop {
        let claimed = store.claim(&req("a", true)).await.unwrap();
        if claimed.is_empty() {
            break;
        }
        let mut in_claim = std::collections::HashSet::new();
        for c in &claimed {
            let key = c.entry.correlation_key.clone().expect("every entry has a key");
            assert!(in_claim.insert(key.clone()), "two entries of {key} in one claim: {:?}", ids(&claimed));
        }
        if in_claim.len() == keys.len() {
            assert!(store.claim(&req("b", true)).await.unwrap().is_empty(), "every key is in flight");
        }
        for c in claimed {
            let key = c.entry.correlation_key.clone().expect("every entry has a key");
            delivered.entry(key).or_default().push(c.entry.id);
            store.settle(c.entry.id, &c.lease, T0, &Settlement::Done).await.unwrap();
        }
        let done: usize = delivered.values().map(Vec::len).sum();
        if !rested && done >= 150 {
            // Half drained (50 per key): the count of waiting entries that sends the
            // route back to its window is due a second after the last.
            tokio::time::sleep(Duration::from_millis(1_100)).await; // WAITING_RECOUNT is what is waited out
            rested = true;
        }
    }
    assert!(rested, "the drain went past half way");
    assert_eq!(delivered, expected, "every entry once, each key's in order");
}

/// The first inserts of a key not seen before wait for each other (each adds the key's
/// row to `inbox_key_floor`), so the order they commit in is their ids' order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_first_inserts_of_a_new_key_commit_in_id_order() {
    let (store, pg) = pg().await;
    let mut ingest = pg.connect().await;
    sqlx::query("BEGIN").execute(&mut ingest).await.unwrap();
    let older = insert_by_hand!(inlet::inbox::postgres::INSERT_SQL, &entry(Some("J"), "j-1"), &mut ingest);
    let newer = {
        let store = Arc::clone(&store);
        tokio::spawn(async move { insert(&store, entry(Some("J"), "j-2")).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await; // time for the second insert to reach J's row
    assert!(!newer.is_finished(), "the second insert of a new key waits for the first to commit");
    sqlx::query("COMMIT").execute(&mut ingest).await.unwrap();
    let newer = newer.await.unwrap();
    assert!(older < newer, "ids are drawn in insert order");
    let first = store.claim(&req("b", true)).await.unwrap();
    assert_eq!(ids(&first), vec![older], "the older entry goes first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_requeue_during_a_claim_does_not_put_the_key_in_flight_twice() {
    let (store, pg) = pg().await;
    let parked = insert(&store, entry(Some("K"), "e-1")).await;
    assert!(store.park(parked, "the target refused it", T0).await.unwrap());
    let later = insert(&store, entry(Some("K"), "e-2")).await;

    let mut a = pg.connect().await;
    assert_eq!(pg_claim_held_open(&mut a, "a", false).await, vec![later], "parked = pass: the later one goes");
    assert!(store.requeue(parked, T0).await.unwrap(), "requeued while A's claim is uncommitted");

    let b = store.claim(&req("b", false)).await.unwrap();
    assert_eq!(ids(&b), Vec::<i64>::new(), "B must not take {parked} while {later} is being claimed");
    sqlx::query("COMMIT").execute(&mut a).await.unwrap();
    assert!(store.claim(&req("b", false)).await.unwrap().is_empty(), "{later} in flight holds the key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_key_found_by_re_decoding_during_a_claim_is_not_in_flight_twice() {
    let (store, pg) = pg().await;
    let undecoded = insert(&store, entry(None, "e-1")).await;
    let later = insert(&store, entry(Some("K"), "e-2")).await;
    assert!(store.requeue(undecoded, T0).await.unwrap());
    let one = ClaimRequest { limit: 1, ..req("x", true) };
    let redecoding = store.claim(&one).await.unwrap();
    assert_eq!(ids(&redecoding), vec![undecoded], "the keyless entry is claimed to be decoded again");

    let mut a = pg.connect().await;
    assert_eq!(pg_claim_held_open(&mut a, "a", true).await, vec![later]);
    let decoded =
        Decoded { event_type: "test".into(), correlation_key: "K".into(), schema_version: None, body: vec![] };
    // The re-decode joins key K as an insert would: under K's lock, shared, so it waits
    // for A's claim of K to commit.
    let settling = {
        let (store, lease) = (Arc::clone(&store), redecoding[0].lease.clone());
        tokio::spawn(async move {
            store.settle(undecoded, &lease, T0, &Settlement::Decoded { decoded, dedup_key: None }).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await; // time for the settle to reach K's lock
    assert!(!settling.is_finished(), "the re-decode into K cannot settle while A's claim of K is uncommitted");

    let b = store.claim(&req("b", true)).await.unwrap();
    assert_eq!(ids(&b), Vec::<i64>::new(), "B must not take {undecoded} (now of key K) while {later} is being claimed");
    sqlx::query("COMMIT").execute(&mut a).await.unwrap();
    settling.await.unwrap().unwrap();
    assert!(store.claim(&req("b", true)).await.unwrap().is_empty(), "{later} in flight holds the key");
    // The re-decoded entry is older than K's floor (A raised it to {later}): the floor
    // came down to it, so K's order still counts it.
    let floor: i64 =
        sqlx::query_scalar("SELECT floor FROM inbox_key_floor WHERE route = 'r' AND correlation_key = 'K'")
            .fetch_one(&mut a)
            .await
            .unwrap();
    assert_eq!(floor, undecoded, "K's floor after the re-decode");
}

// ------------------------------------------------------------------------------------
// SQLite: one writer, so the second step waits for the first
// ------------------------------------------------------------------------------------

async fn sqlite() -> (Arc<dyn Store>, sqlx::SqliteConnection, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
    let store = inbox::open(&url, 4).await.expect("open sqlite");
    let options = inlet::inbox::sqlite::connect_options(&url).unwrap().busy_timeout(Duration::from_secs(30));
    let conn = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
    (store, conn, dir)
}

/// Runs `claim` while `conn` holds the write lock, shows it cannot finish before
/// `release` commits, and returns what it claimed after.
async fn claim_waits_for(
    store: &Arc<dyn Store>,
    conn: &mut sqlx::SqliteConnection,
    owner: &'static str,
    parked_blocks: bool,
) -> Vec<i64> {
    let store2 = Arc::clone(store);
    let claim = tokio::spawn(async move { ids(&store2.claim(&req(owner, parked_blocks)).await.unwrap()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!claim.is_finished(), "a claim cannot run while another writer's transaction is open");
    sqlx::query("COMMIT").execute(&mut *conn).await.unwrap();
    claim.await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_claim_waits_for_an_older_insert_in_flight() {
    let (store, mut ingest, _dir) = sqlite().await;
    sqlx::query("BEGIN IMMEDIATE").execute(&mut ingest).await.unwrap();
    let older = insert_by_hand!(inlet::inbox::sqlite::INSERT_SQL, &entry(Some("K"), "e-1"), &mut ingest);
    let store2 = Arc::clone(&store);
    let newer = tokio::spawn(async move { insert(&store2, entry(Some("K"), "e-2")).await });
    let claimed = claim_waits_for(&store, &mut ingest, "b", true).await;
    let newer = newer.await.unwrap();
    assert!(older < newer);
    // Whichever of the later insert and the claim ran first, the older entry is the
    // only one of the key the claim could take.
    assert!(claimed == vec![older] || claimed.is_empty(), "claimed {claimed:?}");
    let all: Vec<i64> = [claimed, ids(&store.claim(&req("c", true)).await.unwrap())].concat();
    assert_eq!(all, vec![older], "only the older entry in flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_requeue_or_re_decode_waits_for_a_claim_in_flight() {
    let (store, mut a, _dir) = sqlite().await;
    let parked = insert(&store, entry(Some("K"), "e-1")).await;
    assert!(store.park(parked, "the target refused it", T0).await.unwrap());
    let later = insert(&store, entry(Some("K"), "e-2")).await;

    // Claimer A's statement inside a transaction left open.
    sqlx::query("BEGIN IMMEDIATE").execute(&mut a).await.unwrap();
    let r = req("a", false);
    let claim = inlet::inbox::sqlite::CLAIM_SQL.replace("RETURNING *", "RETURNING id");
    let taken: Vec<i64> = claim_by_hand!(sqlx::query_scalar(&claim), &r).fetch_all(&mut a).await.unwrap();
    assert_eq!(taken, vec![later]);
    let store2 = Arc::clone(&store);
    let requeue = tokio::spawn(async move { store2.requeue(parked, T0).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!requeue.is_finished(), "the requeue waits for A's claim to commit");
    sqlx::query("COMMIT").execute(&mut a).await.unwrap();
    assert!(requeue.await.unwrap());
    assert!(store.claim(&req("b", false)).await.unwrap().is_empty(), "{later} in flight holds the key");
}
