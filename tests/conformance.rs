//! One conformance suite for every inbox store: each test runs against SQLite (a
//! fresh file) and PostgreSQL (a fresh database), and both must behave the same.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use inlet::clock::Millis;
use inlet::inbox::{
    self, ClaimRequest, Claimed, Decoded, InsertOutcome, ListFilter, NewEntry, SettleRequest, Settlement, Status,
    Store, StoreError,
};
use inlet_testkit::pg::{TestPg, TestRole};
use inlet_testkit::wait::{wait_for, wait_until};
use sqlx::Connection as _;

const T0: Millis = 1_800_000_000_000;
const LEASE: i64 = 30_000;

enum Guard {
    Sqlite(#[allow(dead_code)] tempfile::TempDir),
    Pg(#[allow(dead_code)] TestPg),
    /// The role goes before its database (fields drop in order).
    PgRole(#[allow(dead_code)] TestRole, #[allow(dead_code)] TestPg),
}

async fn sqlite() -> (Arc<dyn Store>, Guard) {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
    (inbox::open(&url, 4).await.expect("open sqlite"), Guard::Sqlite(dir))
}

async fn postgres() -> (Arc<dyn Store>, Guard) {
    let pg = TestPg::new().await;
    (inbox::open(&pg.url, 8).await.expect("open postgres"), Guard::Pg(pg))
}

/// The store on PostgreSQL as a role that may not create temporary objects: no
/// functions in its sessions, so its ordered claims and its settle batches run in
/// their transactions ([`postgres`]'s run as one call each where they can).
async fn postgres_without_temp() -> (Arc<dyn Store>, Guard) {
    let pg = TestPg::new().await;
    drop(inbox::open(&pg.url, 1).await.expect("migrate as the owner"));
    let role = role_without_temp(&pg).await;
    let url = role.url(&pg.url);
    let store = inbox::open_as(&url, 8, inbox::MigrateMode::Check, inbox::schema::DEFAULT_LOCK_TIMEOUT)
        .await
        .expect("open as the role");
    (store, Guard::PgRole(role, pg))
}

/// A role of `pg`'s database that may use the inbox's tables but not create
/// temporary objects (`TEMP` revoked on the database).
async fn role_without_temp(pg: &TestPg) -> TestRole {
    let role = TestRole { name: format!("{}_notemp", pg.name()), db_url: pg.url.clone() };
    sqlx::raw_sql(&format!(
        "CREATE ROLE \"{r}\" LOGIN;
         REVOKE TEMPORARY ON DATABASE \"{d}\" FROM PUBLIC;
         GRANT CONNECT ON DATABASE \"{d}\" TO \"{r}\";
         GRANT USAGE ON SCHEMA public TO \"{r}\";
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO \"{r}\";
         GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO \"{r}\"",
        r = role.name,
        d = pg.name()
    ))
    .execute(&mut pg.connect().await)
    .await
    .unwrap();
    role
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let (store, _guard) = super::sqlite().await;
                    super::$name(store).await;
                }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let (store, _guard) = super::postgres().await;
                    super::$name(store).await;
                }
            )*
        }
        mod on_postgres_without_temp {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let (store, _guard) = super::postgres_without_temp().await;
                    super::$name(store).await;
                }
            )*
        }
    };
}

conformance!(
    insert_is_idempotent_and_conflicts_are_kept,
    claim_takes_one_entry_per_key_in_order,
    parked_entry_blocks_its_key_unless_the_route_lets_it_pass,
    unordered_route_claims_every_due_entry,
    retry_waits_until_due,
    expired_lease_is_taken_over_and_the_old_owner_is_fenced,
    an_owner_hands_back_what_it_holds_and_is_fenced,
    requeue_only_touches_parked_or_open_entries,
    entry_parked_before_decoding_is_decoded_on_requeue,
    purge_removes_finished_entries_but_never_parked_ones,
    purge_clears_a_backlog_larger_than_one_batch,
    concurrent_claimers_never_hold_one_key_twice,
    counts_report_unresolved_entries,
    audit_log_keeps_lines_in_order_and_pages,
    ignore_discards_a_parked_entry_with_a_record_and_frees_its_key,
    list_newest_first_and_count,
    a_paused_route_is_not_claimed_until_resumed,
    blocked_keys_are_parked_heads_and_entries_waiting_behind_older_ones,
    list_filters_by_error_and_throughput_counts_deliveries_per_minute,
    a_settle_batch_commits_each_settle_and_fences_a_lost_lease_alone,
    a_batch_insert_answers_and_orders_as_one_by_one,
    a_settle_batch_writes_what_settles_one_by_one_write,
    heads_behind_a_long_backlog_of_one_key_are_claimed,
    a_route_of_few_keys_gives_each_claim_every_free_head_and_the_entries_without_a_key,
    replay_windows_record_what_they_stored_and_are_listed_open_or_all,
    an_entrys_attempts_come_back_oldest_first_however_each_was_settled,
);

fn entry(route: &str, key: &str, dedup: &str, payload: &str) -> NewEntry {
    NewEntry {
        route: route.into(),
        dedup_key: dedup.into(),
        decoded: Some(Decoded {
            event_type: "test".into(),
            correlation_key: key.into(),
            schema_version: None,
            body: payload.as_bytes().to_vec(),
        }),
        raw_data: payload.as_bytes().to_vec(),
        attributes: vec![("a".into(), "1".into())],
        message_id: format!("msg-{dedup}"),
        publish_time: None,
        delivery_attempt: Some(1),
        status: Status::Open,
        last_error: None,
    }
}

fn undecodable(route: &str, dedup: &str, payload: &[u8]) -> NewEntry {
    NewEntry {
        decoded: None,
        raw_data: payload.to_vec(),
        status: Status::Parked,
        last_error: Some("decode failed: garbage".into()),
        ..entry(route, "", dedup, "")
    }
}

fn req<'a>(route: &'a str, owner: &'a str, now: Millis, limit: u32) -> ClaimRequest<'a> {
    ClaimRequest { route, owner, limit, now, lease_ms: LEASE, ordered: true, parked_blocks: true, share: None }
}

fn ids(claimed: &[Claimed]) -> Vec<i64> {
    claimed.iter().map(|c| c.entry.id).collect()
}

async fn insert(store: &Arc<dyn Store>, e: NewEntry) -> i64 {
    match store.insert(&e, T0).await.expect("insert") {
        InsertOutcome::Inserted { id } => id,
        other => panic!("expected a new entry, got {other:?}"),
    }
}

async fn insert_is_idempotent_and_conflicts_are_kept(store: Arc<dyn Store>) {
    let first = store.insert(&entry("r", "k", "evt-1", "payload"), T0).await.unwrap();
    let InsertOutcome::Inserted { id } = first else { panic!("first insert: {first:?}") };

    let again = store.insert(&entry("r", "k", "evt-1", "payload"), T0 + 1).await.unwrap();
    assert_eq!(again, InsertOutcome::Duplicate { id, replay_open: false }, "the same payload again is a redelivery");

    let other_route = store.insert(&entry("r2", "k", "evt-1", "payload"), T0).await.unwrap();
    assert!(matches!(other_route, InsertOutcome::Inserted { .. }), "dedup keys are per route");

    let conflict = store.insert(&entry("r", "k", "evt-1", "a different payload"), T0 + 2).await.unwrap();
    let InsertOutcome::Conflict { existing, entry: cid, first: true } = conflict else {
        panic!("a first conflict expected: {conflict:?}")
    };
    assert_eq!(existing, id);
    let c = store.get(cid).await.unwrap().expect("conflict entry stored");
    assert_eq!(c.status, Status::Parked);
    assert_eq!(c.conflict_of, Some(id));
    assert_eq!(c.raw_data, b"a different payload");
    assert!(c.last_error.as_deref().unwrap().contains("different payload"), "{:?}", c.last_error);

    // The conflicting message redelivered is not a second conflict.
    let again = store.insert(&entry("r", "k", "evt-1", "a different payload"), T0 + 3).await.unwrap();
    assert_eq!(again, InsertOutcome::Conflict { existing: id, entry: cid, first: false }, "known, not counted again");
    let all = store.list(&ListFilter { route: Some("r".into()), limit: 100, ..Default::default() }).await.unwrap();
    assert_eq!(all.len(), 2);

    let stored = store.get(id).await.unwrap().unwrap();
    assert_eq!(stored.attributes, vec![("a".to_string(), "1".to_string())]);
    assert_eq!(stored.payload_digest, inbox::digest_hex(b"payload"));
    assert_eq!((stored.received_at, stored.next_attempt_at, stored.attempts), (T0, T0, 0));

    // A batch commits together and reports each message.
    let batch =
        store.insert_batch(&[entry("r", "k2", "evt-2", "x"), entry("r", "k", "evt-1", "payload")], T0).await.unwrap();
    assert!(matches!(batch[0], InsertOutcome::Inserted { .. }));
    assert_eq!(batch[1], InsertOutcome::Duplicate { id, replay_open: false });
}

/// A batch mixing new rows, redeliveries (of an older row and of a row earlier in the
/// batch), dedup-key conflicts and rows parked or ignored at decode: each outcome is
/// what inserting the rows one by one gives, and the rows' ids follow the batch's
/// order (PostgreSQL inserts the new rows in one statement, then the rest; a conflict
/// with new rows behind it makes it redo the batch one by one).
async fn a_batch_insert_answers_and_orders_as_one_by_one(store: Arc<dyn Store>) {
    let old = insert(&store, entry("r", "k", "old", "old payload")).await;
    let ignored =
        NewEntry { status: Status::Ignored, last_error: Some("not for us".into()), ..entry("r", "k", "i1", "i") };
    let batch = [
        entry("r", "k", "a1", "a1"),
        entry("r", "k", "old", "old payload"),
        entry("r", "j", "a2", "a2"),
        entry("r", "k", "a1", "a1"),
        undecodable("r", "bad", b"\xff garbage"),
        ignored,
        entry("r", "j", "a3", "a3"),
    ];
    let out = store.insert_batch(&batch, T0).await.unwrap();
    let new_id = |i: usize| match out[i] {
        InsertOutcome::Inserted { id } => id,
        other => panic!("entry {i}: {other:?}"),
    };
    assert_eq!(out[1], InsertOutcome::Duplicate { id: old, replay_open: false }, "a redelivery of an older row");
    assert_eq!(
        out[3],
        InsertOutcome::Duplicate { id: new_id(0), replay_open: false },
        "a redelivery of a row earlier in the batch"
    );
    let ids: Vec<i64> = [0, 2, 4, 5, 6].iter().map(|&i| new_id(i)).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids follow the batch's order: {ids:?}");
    assert!(ids[0] > old);
    let bad = store.get(new_id(4)).await.unwrap().unwrap();
    assert_eq!((bad.status, bad.correlation_key, bad.raw_data), (Status::Parked, None, b"\xff garbage".to_vec()));
    assert_eq!(bad.last_error.as_deref(), Some("decode failed: garbage"));
    let ign = store.get(new_id(5)).await.unwrap().unwrap();
    assert_eq!((ign.status, ign.finished_at), (Status::Ignored, Some(T0)));
    let a2 = store.get(new_id(2)).await.unwrap().unwrap();
    assert_eq!((a2.correlation_key.as_deref(), a2.body.as_deref(), a2.received_at), (Some("j"), Some(&b"a2"[..]), T0));
    assert_eq!(a2.attributes, vec![("a".to_string(), "1".to_string())]);

    // A conflict (a known dedup key, another payload) with new rows behind it: its
    // parked row takes its place in the order.
    let batch = [
        entry("r", "k", "b1", "b1"),
        entry("r", "k", "old", "another payload"),
        entry("r", "k", "b2", "b2"),
        entry("r", "k", "b1", "b1 again, changed"),
    ];
    let out = store.insert_batch(&batch, T0 + 1).await.unwrap();
    let InsertOutcome::Inserted { id: b1 } = out[0] else { panic!("b1: {:?}", out[0]) };
    let InsertOutcome::Conflict { existing, entry: c_old, first: true } = out[1] else {
        panic!("conflict: {:?}", out[1])
    };
    assert_eq!(existing, old);
    let InsertOutcome::Inserted { id: b2 } = out[2] else { panic!("b2: {:?}", out[2]) };
    let InsertOutcome::Conflict { existing, entry: c_b1, first: true } = out[3] else {
        panic!("conflict: {:?}", out[3])
    };
    assert_eq!(existing, b1, "a conflict with a row earlier in the batch");
    assert!(b1 < c_old && c_old < b2 && b2 < c_b1, "ids in the batch's order: {b1} {c_old} {b2} {c_b1}");
    assert_eq!(store.get(c_old).await.unwrap().unwrap().status, Status::Parked);

    // Nothing but redeliveries: no row is added.
    let before = store.count(&ListFilter { route: Some("r".into()), ..Default::default() }).await.unwrap();
    let again = store.insert_batch(&[entry("r", "k", "a1", "a1"), entry("r", "j", "a2", "a2")], T0 + 2).await.unwrap();
    assert_eq!(
        again,
        vec![
            InsertOutcome::Duplicate { id: ids[0], replay_open: false },
            InsertOutcome::Duplicate { id: ids[1], replay_open: false }
        ]
    );
    let after = store.count(&ListFilter { route: Some("r".into()), ..Default::default() }).await.unwrap();
    assert_eq!(before, after);

    // A dedup key is known per route: the same key and payload on another route is new.
    let mixed = store.insert_batch(&[entry("r", "k", "a1", "a1"), entry("r2", "k", "a1", "a1")], T0 + 3).await.unwrap();
    assert_eq!(mixed[0], InsertOutcome::Duplicate { id: ids[0], replay_open: false });
    assert!(matches!(mixed[1], InsertOutcome::Inserted { id } if id > ids[4]), "{mixed:?}");
}

async fn claim_takes_one_entry_per_key_in_order(store: Arc<dyn Store>) {
    let a1 = insert(&store, entry("r", "a", "1", "a1")).await;
    let a2 = insert(&store, entry("r", "a", "2", "a2")).await;
    let b1 = insert(&store, entry("r", "b", "3", "b1")).await;
    let a3 = insert(&store, entry("r", "a", "4", "a3")).await;

    let first = store.claim(&req("r", "w1", T0, 10)).await.unwrap();
    assert_eq!(ids(&first), vec![a1, b1], "only the oldest entry of each key");
    assert!(first.iter().all(|c| c.entry.status == Status::InProgress && c.entry.attempts == 1));
    assert_eq!(first[0].lease.expires_at, T0 + LEASE);

    assert!(store.claim(&req("r", "w2", T0, 10)).await.unwrap().is_empty(), "keys in flight are blocked");

    store.settle(a1, &first[0].lease, T0 + 5, &Settlement::Done).await.unwrap();
    let second = store.claim(&req("r", "w2", T0 + 5, 10)).await.unwrap();
    assert_eq!(ids(&second), vec![a2]);
    store.settle(a2, &second[0].lease, T0 + 6, &Settlement::Done).await.unwrap();
    let third = store.claim(&req("r", "w2", T0 + 6, 10)).await.unwrap();
    assert_eq!(ids(&third), vec![a3]);

    let done = store.get(a1).await.unwrap().unwrap();
    assert_eq!(done.status, Status::Done);
    assert_eq!(done.finished_at, Some(T0 + 5));
    assert_eq!(done.lease_owner, None);
    assert!(store.claim(&req("other-route", "w1", T0 + 6, 10)).await.unwrap().is_empty());
}

async fn parked_entry_blocks_its_key_unless_the_route_lets_it_pass(store: Arc<dyn Store>) {
    let a1 = insert(&store, entry("r", "a", "1", "a1")).await;
    let a2 = insert(&store, entry("r", "a", "2", "a2")).await;
    let c = store.claim(&req("r", "w", T0, 10)).await.unwrap();
    store.settle(a1, &c[0].lease, T0, &Settlement::Parked { error: "two executions match".into() }).await.unwrap();

    assert!(store.claim(&req("r", "w", T0, 10)).await.unwrap().is_empty(), "parked blocks its key by default");
    let pass = ClaimRequest { parked_blocks: false, ..req("r", "w", T0, 10) };
    let c = store.claim(&pass).await.unwrap();
    assert_eq!(ids(&c), vec![a2], "with `parked = pass` later entries go on");
    // Requeueing the parked one while a later one is in flight must not put two in flight.
    assert!(store.requeue(a1, T0).await.unwrap());
    assert!(store.claim(&pass).await.unwrap().is_empty(), "a key with an entry in flight is blocked");
    store.settle(a2, &c[0].lease, T0, &Settlement::Done).await.unwrap();
    assert_eq!(ids(&store.claim(&pass).await.unwrap()), vec![a1]);
    let parked = store.get(a1).await.unwrap().unwrap();
    assert_eq!(parked.last_error.as_deref(), Some("two executions match"), "the last error is kept");
}

/// A key whose head sits behind thousands of entries of another key is claimed as
/// soon as it is free, however far back its head is (PostgreSQL's claim reads only a
/// window of the oldest entries and finds the heads beyond it key by key); a head that
/// is PARKED where parked blocks, in flight, or not yet due is not claimed there either.
async fn heads_behind_a_long_backlog_of_one_key_are_claimed(store: Arc<dyn Store>) {
    const AHEAD: usize = 5_000; // more than the window of a claim of 10
    let ahead: Vec<NewEntry> = (0..AHEAD).map(|i| entry("r", "a", &format!("a{i}"), "a")).collect();
    let mut a = Vec::with_capacity(AHEAD);
    for chunk in ahead.chunks(256) {
        a.extend(store.insert_batch(chunk, T0).await.expect("insert a batch").iter().map(|o| o.id()));
    }
    let b1 = insert(&store, entry("r", "b", "b1", "b1")).await;
    let parked = NewEntry { status: Status::Parked, last_error: Some("stuck".into()), ..entry("r", "c", "c1", "c1") };
    let c1 = insert(&store, parked).await;
    let c2 = insert(&store, entry("r", "c", "c2", "c2")).await;
    let d1 = insert(&store, entry("r", "d", "d1", "d1")).await;

    let first = store.claim(&req("r", "w", T0, 10)).await.unwrap();
    assert_eq!(ids(&first), vec![a[0], b1, d1], "one head per free key; c is held back by its parked head {c1}");
    let d = &first[2];
    let retry = Settlement::Retry { at: T0 + 1_000, error: "503".into(), not_yet_since: None };
    store.settle(d1, &d.lease, T0, &retry).await.unwrap();
    let pass = |now| ClaimRequest { parked_blocks: false, ..req("r", "w", now, 10) };
    assert_eq!(ids(&store.claim(&pass(T0 + 1)).await.unwrap()), vec![c2], "a and b in flight, d not due yet");
    assert_eq!(ids(&store.claim(&pass(T0 + 1_000)).await.unwrap()), vec![d1], "d due again");
    store.settle(a[0], &first[0].lease, T0, &Settlement::Done).await.unwrap();
    assert_eq!(ids(&store.claim(&pass(T0 + 1_000)).await.unwrap()), vec![a[1]], "a's next, in order");
}

/// Round after round on a route of few keys (on PostgreSQL the first claim finds
/// them few and the later ones start from the heads): each claim takes the next entry
/// of every key and every entry without a key that waits, entries without a key added
/// between claims included.
async fn a_route_of_few_keys_gives_each_claim_every_free_head_and_the_entries_without_a_key(store: Arc<dyn Store>) {
    let unkeyed = |dedup: &str| NewEntry { decoded: None, ..entry("r", "", dedup, "raw") };
    let mut by_round: Vec<Vec<i64>> = vec![Vec::new(); 4];
    for (round, ids) in by_round.iter_mut().enumerate() {
        for key in ["a", "b", "c"] {
            ids.push(insert(&store, entry("r", key, &format!("{key}{round}"), key)).await);
        }
    }
    let mut loose = vec![insert(&store, unkeyed("u0")).await, insert(&store, unkeyed("u1")).await];
    for (round, want) in by_round.iter().enumerate() {
        let now = T0 + round as i64;
        let claimed = store.claim(&req("r", "w", now, 100)).await.unwrap();
        let mut got = ids(&claimed);
        got.sort_unstable();
        let mut expected = want.clone();
        expected.append(&mut loose);
        expected.sort_unstable();
        assert_eq!(got, expected, "round {round}: the next entry of each key, and those without a key");
        for c in &claimed {
            store.settle(c.entry.id, &c.lease, now, &Settlement::Done).await.unwrap();
        }
        loose.push(insert(&store, unkeyed(&format!("u{}", round + 2))).await);
    }
}

async fn unordered_route_claims_every_due_entry(store: Arc<dyn Store>) {
    let a1 = insert(&store, entry("r", "a", "1", "a1")).await;
    let a2 = insert(&store, entry("r", "a", "2", "a2")).await;
    let c = store.claim(&ClaimRequest { ordered: false, ..req("r", "w", T0, 10) }).await.unwrap();
    assert_eq!(ids(&c), vec![a1, a2]);
}

async fn retry_waits_until_due(store: Arc<dyn Store>) {
    let a1 = insert(&store, entry("r", "a", "1", "a1")).await;
    let c = store.claim(&req("r", "w", T0, 10)).await.unwrap();
    store
        .settle(
            a1,
            &c[0].lease,
            T0 + 10,
            &Settlement::Retry { at: T0 + 1_000, error: "503".into(), not_yet_since: None },
        )
        .await
        .unwrap();
    let e = store.get(a1).await.unwrap().unwrap();
    assert_eq!((e.status, e.next_attempt_at, e.last_error.as_deref()), (Status::Open, T0 + 1_000, Some("503")));
    assert!(store.claim(&req("r", "w", T0 + 999, 10)).await.unwrap().is_empty(), "not due yet");
    let c = store.claim(&req("r", "w", T0 + 1_000, 10)).await.unwrap();
    assert_eq!(ids(&c), vec![a1]);
    assert_eq!(c[0].entry.attempts, 2);
}

/// Invariant 6: a worker whose lease expired cannot overwrite the outcome recorded by
/// the worker that took the entry over.
async fn expired_lease_is_taken_over_and_the_old_owner_is_fenced(store: Arc<dyn Store>) {
    let a1 = insert(&store, entry("r", "a", "1", "a1")).await;
    let old = store.claim(&req("r", "slow", T0, 10)).await.unwrap().remove(0);

    assert_eq!(store.release_expired("r", T0 + LEASE - 1).await.unwrap(), 0, "lease still valid");
    assert_eq!(store.release_expired("r", T0 + LEASE).await.unwrap(), 1);
    let new = store.claim(&req("r", "fast", T0 + LEASE, 10)).await.unwrap().remove(0);
    assert_eq!(new.entry.id, a1);
    assert!(new.lease.token > old.lease.token);
    assert_eq!(new.entry.attempts, 2);

    store.settle(a1, &new.lease, T0 + LEASE + 1, &Settlement::Done).await.unwrap();
    let late = store.settle(a1, &old.lease, T0 + LEASE + 2, &Settlement::Parked { error: "late".into() }).await;
    assert!(matches!(late, Err(StoreError::LeaseLost { id }) if id == a1), "{late:?}");
    let e = store.get(a1).await.unwrap().unwrap();
    assert_eq!(e.status, Status::Done, "the new owner's outcome stands");

    // Same fencing while the new owner is still working: the old owner cannot settle.
    let b1 = insert(&store, entry("r", "b", "2", "b1")).await;
    let old = store.claim(&req("r", "slow", T0, 10)).await.unwrap().remove(0);
    store.release_expired("r", T0 + LEASE).await.unwrap();
    let new = store.claim(&req("r", "fast", T0 + LEASE, 10)).await.unwrap().remove(0);
    assert!(matches!(
        store.settle(b1, &old.lease, T0 + LEASE, &Settlement::Done).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert_eq!(store.get(b1).await.unwrap().unwrap().status, Status::InProgress);
    store.settle(b1, &new.lease, T0 + LEASE, &Settlement::Done).await.unwrap();
}

/// What a stopping instance abandons (`release_owned`) is OPEN at once, before its
/// leases expire: claimable by another instance, the abandoned attempt's settle fenced.
/// Nothing another owner holds moves.
async fn an_owner_hands_back_what_it_holds_and_is_fenced(store: Arc<dyn Store>) {
    let a1 = insert(&store, entry("r", "a", "1", "a1")).await;
    let b1 = insert(&store, entry("s", "b", "2", "b1")).await;
    let c1 = insert(&store, entry("r", "c", "3", "c1")).await;
    let stopping = store.claim(&req("r", "stopping", T0, 1)).await.unwrap().remove(0);
    let other = store.claim(&req("r", "other", T0, 10)).await.unwrap().remove(0);
    let stopping_s = store.claim(&req("s", "stopping", T0, 10)).await.unwrap().remove(0);
    assert_eq!((stopping.entry.id, other.entry.id, stopping_s.entry.id), (a1, c1, b1));

    let mut routes = store.release_owned("stopping", T0 + 1).await.unwrap();
    routes.sort();
    assert_eq!(routes, ["r", "s"], "the route of each entry handed back");
    for id in [a1, b1] {
        let e = store.get(id).await.unwrap().unwrap();
        assert_eq!((e.status, e.lease_owner, e.lease_expires_at), (Status::Open, None, None), "entry {id}");
        assert!(e.last_error.as_deref().is_some_and(|t| t.contains("stopping")), "{:?}", e.last_error);
    }
    assert_eq!(store.get(c1).await.unwrap().unwrap().status, Status::InProgress, "another owner's entry stays");
    assert!(store.release_owned("stopping", T0 + 2).await.unwrap().is_empty(), "nothing left to hand back");

    // Long before the lease would expire, another instance takes it; the abandoned
    // attempt cannot settle any more.
    let taken = store.claim(&req("r", "next", T0 + 2, 10)).await.unwrap();
    assert_eq!(ids(&taken), [a1]);
    let late = store.settle(a1, &stopping.lease, T0 + 3, &Settlement::Done).await;
    assert!(matches!(late, Err(StoreError::LeaseLost { id }) if id == a1), "{late:?}");
    store.settle(a1, &taken[0].lease, T0 + 3, &Settlement::Done).await.unwrap();
    assert_eq!(store.get(a1).await.unwrap().unwrap().status, Status::Done);
}

async fn requeue_only_touches_parked_or_open_entries(store: Arc<dyn Store>) {
    let a1 = insert(&store, entry("r", "a", "1", "a1")).await;
    let c = store.claim(&req("r", "w", T0, 10)).await.unwrap().remove(0);
    assert!(!store.requeue(a1, T0).await.unwrap(), "an entry in flight is not requeued");
    store.settle(a1, &c.lease, T0, &Settlement::Parked { error: "x".into() }).await.unwrap();
    assert!(store.requeue(a1, T0 + 50).await.unwrap());
    let e = store.get(a1).await.unwrap().unwrap();
    let due = T0 + 50 - inlet::inbox::REQUEUED_DUE_EARLY;
    assert_eq!((e.status, e.attempts, e.next_attempt_at, e.updated_at), (Status::Open, 0, due, T0 + 50));
    // An instance whose clock reads behind the requeuer's (each measures its offset to
    // the database within a round trip) finds the entry due when it hears of it.
    let behind = store.claim(&req("r", "w", T0 + 45, 10)).await.unwrap();
    assert_eq!(ids(&behind), [a1], "a requeued entry is due for a clock a little behind the requeuer's");
    let retry = Settlement::Retry { at: T0 + 50, error: "503".into(), not_yet_since: None };
    store.settle(a1, &behind[0].lease, T0 + 46, &retry).await.unwrap();

    assert!(store.park(a1, "by hand", T0 + 60).await.unwrap());
    assert_eq!(store.get(a1).await.unwrap().unwrap().status, Status::Parked);
    assert!(store.requeue(a1, T0 + 70).await.unwrap());
    let c = store.claim(&req("r", "w", T0 + 70, 10)).await.unwrap().remove(0);
    store.settle(a1, &c.lease, T0 + 71, &Settlement::Done).await.unwrap();
    assert!(!store.requeue(a1, T0 + 80).await.unwrap(), "DONE entries are not requeued");
    assert!(!store.requeue(9_999_999, T0).await.unwrap());
}

async fn entry_parked_before_decoding_is_decoded_on_requeue(store: Arc<dyn Store>) {
    let raw = b"\x00\xffnot json";
    let id = insert(&store, undecodable("r", "m-1", raw)).await;
    let e = store.get(id).await.unwrap().unwrap();
    assert_eq!((e.status, e.correlation_key.as_deref(), e.raw_data.as_slice()), (Status::Parked, None, &raw[..]));
    assert!(e.decoded().is_none());

    assert!(store.requeue(id, T0).await.unwrap());
    let c = store.claim(&req("r", "w", T0, 10)).await.unwrap().remove(0);
    let decoded = Decoded {
        event_type: "t".into(),
        correlation_key: "k".into(),
        schema_version: Some("2".into()),
        body: b"{}".to_vec(),
    };
    store
        .settle(id, &c.lease, T0 + 1, &Settlement::Decoded { decoded: decoded.clone(), dedup_key: None })
        .await
        .unwrap();
    let e = store.get(id).await.unwrap().unwrap();
    assert_eq!((e.status, e.attempts, e.decoded()), (Status::Open, 0, Some(decoded)));
    assert_eq!(e.raw_data, raw, "the raw payload stays as it arrived");
}

async fn purge_removes_finished_entries_but_never_parked_ones(store: Arc<dyn Store>) {
    let done = insert(&store, entry("r", "a", "1", "a1")).await;
    let parked = insert(&store, entry("r", "b", "2", "b1")).await;
    let ignored = insert(
        &store,
        NewEntry { status: Status::Ignored, last_error: Some("not ours".into()), ..entry("r", "c", "3", "c1") },
    )
    .await;
    for c in store.claim(&req("r", "w", T0, 10)).await.unwrap() {
        let s = if c.entry.id == done { Settlement::Done } else { Settlement::Parked { error: "p".into() } };
        store.settle(c.entry.id, &c.lease, T0 + 10, &s).await.unwrap();
    }
    assert_eq!(
        store.purge_finished(T0 + 10, 100).await.unwrap(),
        1,
        "only what finished before the cut-off… the ignored one"
    );
    assert!(store.get(ignored).await.unwrap().is_none());
    assert_eq!(store.purge_finished(T0 + 1_000_000, 100).await.unwrap(), 1);
    assert!(store.get(done).await.unwrap().is_none());
    assert_eq!(store.get(parked).await.unwrap().unwrap().status, Status::Parked, "parked entries stay");
}

/// Invariant 4 under contention: several workers claiming at once never hold two
/// entries of one key, and each key is delivered in inbox order.
async fn concurrent_claimers_never_hold_one_key_twice(store: Arc<dyn Store>) {
    const KEYS: usize = 12;
    const PER_KEY: usize = 15;
    let mut expected: HashMap<String, Vec<i64>> = HashMap::new();
    for n in 0..PER_KEY {
        for k in 0..KEYS {
            let key = format!("k{k}");
            let id = insert(&store, entry("r", &key, &format!("{k}-{n}"), "x")).await;
            expected.entry(key).or_default().push(id);
        }
    }
    let held: Arc<Mutex<HashSet<String>>> = Arc::default();
    let delivered: Arc<Mutex<HashMap<String, Vec<i64>>>> = Arc::default();
    let mut workers = Vec::new();
    for w in 0..4 {
        let (store, held, delivered) = (Arc::clone(&store), Arc::clone(&held), Arc::clone(&delivered));
        workers.push(tokio::spawn(async move {
            let owner = format!("w{w}");
            let mut idle_rounds = 0;
            while idle_rounds < 50 {
                let claimed = store.claim(&req("r", &owner, T0, 3)).await.unwrap();
                if claimed.is_empty() {
                    idle_rounds += 1;
                    tokio::task::yield_now().await;
                    continue;
                }
                idle_rounds = 0;
                for c in claimed {
                    let key = c.entry.correlation_key.clone().unwrap();
                    assert!(held.lock().unwrap().insert(key.clone()), "two workers hold key {key}");
                    tokio::task::yield_now().await;
                    delivered.lock().unwrap().entry(key.clone()).or_default().push(c.entry.id);
                    held.lock().unwrap().remove(&key);
                    store.settle(c.entry.id, &c.lease, T0, &Settlement::Done).await.unwrap();
                }
            }
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    assert_eq!(*delivered.lock().unwrap(), expected);
}

async fn counts_report_unresolved_entries(store: Arc<dyn Store>) {
    insert(&store, entry("r", "a", "1", "a1")).await;
    insert(&store, entry("r", "a", "2", "a2")).await;
    insert(&store, undecodable("r", "3", b"zz")).await;
    let mut counts = store.counts().await.unwrap();
    counts.sort_by_key(|c| c.status.as_str());
    let summary: Vec<_> = counts.iter().map(|c| (c.route.as_str(), c.status, c.count, c.oldest_received_at)).collect();
    assert_eq!(summary, vec![("r", Status::Open, 2, Some(T0)), ("r", Status::Parked, 1, Some(T0))]);
    let now = store.db_now().await.unwrap();
    let host = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    assert!((now - host).abs() < 5_000, "database clock {now} vs host {host}");
}

async fn purge_clears_a_backlog_larger_than_one_batch(store: Arc<dyn Store>) {
    let done =
        |n: usize| NewEntry { status: Status::Done, ..entry("r", &format!("k{}", n % 7), &format!("d-{n}"), "x") };
    let batch: Vec<NewEntry> = (0..2_500).map(done).collect();
    for chunk in batch.chunks(500) {
        store.insert_batch(chunk, T0).await.unwrap();
    }
    let parked = insert(&store, NewEntry { status: Status::Parked, ..entry("r", "k", "p-1", "x") }).await;
    let purged = inbox::purge_all(store.as_ref(), T0 + 1, 1_000, std::time::Duration::from_millis(1)).await.unwrap();
    assert_eq!(purged, 2_500, "three batches, one call");
    let left = store.list(&ListFilter { route: Some("r".into()), limit: 100, ..Default::default() }).await.unwrap();
    assert_eq!(ids_of(&left), vec![parked], "only the parked entry is left");
}

fn ids_of(entries: &[inbox::Entry]) -> Vec<i64> {
    entries.iter().map(|e| e.id).collect()
}

async fn audit_log_keeps_lines_in_order_and_pages(store: Arc<dyn Store>) {
    use inlet::inbox::{AuditAction, AuditOutcome};
    let line = |actor: &str, action: AuditAction, route: Option<&str>| inlet::inbox::NewAudit {
        actor: actor.into(),
        action,
        route: route.map(Into::into),
        subject: "entry 7".into(),
        outcome: AuditOutcome::Ok,
        detail: None,
    };
    let first = store.record_audit(&line("ops-a", AuditAction::Requeue, Some("a")), T0).await.unwrap();
    let second = store.record_audit(&line("cli:me", AuditAction::Purge, None), T0 + 5).await.unwrap();
    assert!(second > first);
    let all = store.list_audit(None, 10).await.unwrap();
    let seen: Vec<_> =
        all.iter().map(|a| (a.id, a.at, a.actor.as_str(), a.action.as_str(), a.route.as_deref())).collect();
    assert_eq!(seen, vec![(first, T0, "ops-a", "requeue", Some("a")), (second, T0 + 5, "cli:me", "purge", None)]);
    let page = store.list_audit(Some(first), 10).await.unwrap();
    assert_eq!(page.iter().map(|a| a.id).collect::<Vec<_>>(), vec![second]);
    assert_eq!(store.list_audit(None, 1).await.unwrap().len(), 1);
}

async fn ignore_discards_a_parked_entry_with_a_record_and_frees_its_key(store: Arc<dyn Store>) {
    let a1 = insert(&store, entry("r", "a", "1", "a1")).await;
    let a2 = insert(&store, entry("r", "a", "2", "a2")).await;
    let c = store.claim(&req("r", "w", T0, 10)).await.unwrap();
    store.settle(a1, &c[0].lease, T0, &Settlement::Parked { error: "two executions match".into() }).await.unwrap();
    assert!(store.claim(&req("r", "w", T0, 10)).await.unwrap().is_empty(), "the parked entry holds its key");

    assert!(!store.ignore(a2, "ignored by hand: no", T0 + 1).await.unwrap(), "an OPEN entry is not ignored");
    assert!(!store.ignore(999_999, "ignored by hand: no", T0 + 1).await.unwrap(), "nor a missing one");
    assert!(store.ignore(a1, "ignored by hand: a duplicate order", T0 + 10).await.unwrap());
    let ignored = store.get(a1).await.unwrap().unwrap();
    assert_eq!(ignored.status, Status::Ignored);
    assert_eq!(
        ignored.last_error.as_deref(),
        Some("ignored by hand: a duplicate order (it was parked: two executions match)"),
        "the reason first, the parking error kept"
    );
    assert_eq!((ignored.finished_at, ignored.updated_at), (Some(T0 + 10), T0 + 10));
    assert!(!store.ignore(a1, "ignored by hand: again", T0 + 11).await.unwrap(), "once is enough");
    assert_eq!(ids(&store.claim(&req("r", "w", T0 + 11, 10)).await.unwrap()), vec![a2], "the key is free again");

    // A conflicting payload is kept PARKED; ignored, retention deletes it like any
    // finished entry (what its note promises).
    let conflict = store.insert(&entry("r", "b", "1", "another payload"), T0).await.unwrap();
    let InsertOutcome::Conflict { entry: cid, .. } = conflict else { panic!("a conflict expected: {conflict:?}") };
    let note = store.get(cid).await.unwrap().unwrap().last_error.unwrap();
    assert!(note.contains("ignore discards it, and retention then deletes it"), "{note}");
    assert_eq!(store.purge_finished(T0 + 100, 100).await.unwrap(), 1, "only the ignored one: PARKED stays");
    assert!(store.ignore(cid, "ignored by hand: the second half of a split order", T0 + 20).await.unwrap());
    assert_eq!(store.purge_finished(T0 + 21, 100).await.unwrap(), 1);
    assert!(store.get(cid).await.unwrap().is_none());
}

async fn list_newest_first_and_count(store: Arc<dyn Store>) {
    let a1 = insert(&store, entry("r", "a", "1", "a1")).await;
    let b1 = insert(&store, entry("r", "b", "2", "b1")).await;
    let a2 = insert(&store, entry("r", "a", "3", "a2")).await;
    let other = insert(&store, entry("r2", "a", "4", "x")).await;
    let listed = |f: ListFilter| {
        let store = Arc::clone(&store);
        async move { store.list(&f).await.unwrap().iter().map(|e| e.id).collect::<Vec<_>>() }
    };
    let newest = ListFilter { limit: 10, newest_first: true, ..Default::default() };
    assert_eq!(listed(newest.clone()).await, vec![other, a2, b1, a1]);
    let of_a = ListFilter { route: Some("r".into()), correlation_key: Some("a".into()), ..newest.clone() };
    assert_eq!(listed(ListFilter { limit: 1, ..of_a.clone() }).await, vec![a2]);
    assert_eq!(store.count(&ListFilter { limit: 1, ..of_a.clone() }).await.unwrap(), 2, "the limit does not count");
    assert_eq!(store.count(&ListFilter { after_id: Some(a1), ..of_a }).await.unwrap(), 1);
    assert_eq!(store.count(&ListFilter { status: Some(Status::Parked), ..newest }).await.unwrap(), 0);
}

async fn a_paused_route_is_not_claimed_until_resumed(store: Arc<dyn Store>) {
    let a1 = insert(&store, entry("r", "a", "1", "a1")).await;
    let b1 = insert(&store, entry("r", "b", "2", "b1")).await;
    let other = insert(&store, entry("r2", "a", "3", "x")).await;
    let pause =
        inbox::Pause { route: "r".into(), paused_at: T0, paused_by: "ops".into(), reason: "maintenance".into() };
    assert!(store.pause_route(&pause).await.unwrap());
    let again = inbox::Pause { paused_by: "someone else".into(), ..pause.clone() };
    assert!(!store.pause_route(&again).await.unwrap(), "paused already: the first pause stands");
    assert_eq!(store.paused_routes(None).await.unwrap(), vec![pause.clone()]);
    assert_eq!(store.paused_routes(Some("r")).await.unwrap(), vec![pause]);
    assert_eq!(store.paused_routes(Some("r2")).await.unwrap(), vec![]);

    for ordered in [true, false] {
        let claim = ClaimRequest { ordered, ..req("r", "w", T0, 10) };
        assert!(store.claim(&claim).await.unwrap().is_empty(), "a paused route is not claimed (ordered: {ordered})");
    }
    assert_eq!(ids(&store.claim(&req("r2", "w", T0, 10)).await.unwrap()), vec![other], "other routes go on");
    let later = insert(&store, entry("r", "c", "4", "c1")).await;
    assert_eq!(store.get(later).await.unwrap().unwrap().status, Status::Open, "a paused route still takes entries");

    assert!(!store.resume_route("r2").await.unwrap(), "r2 was not paused");
    assert!(store.resume_route("r").await.unwrap());
    assert!(!store.resume_route("r").await.unwrap(), "resumed already");
    assert_eq!(store.paused_routes(None).await.unwrap(), vec![]);
    assert_eq!(ids(&store.claim(&req("r", "w", T0, 10)).await.unwrap()), vec![a1, b1, later]);
}

async fn insert_at(store: &Arc<dyn Store>, e: NewEntry, at: Millis) -> i64 {
    match store.insert(&e, at).await.expect("insert") {
        InsertOutcome::Inserted { id } => id,
        other => panic!("expected a new entry, got {other:?}"),
    }
}

async fn blocked_keys_are_parked_heads_and_entries_waiting_behind_older_ones(store: Arc<dyn Store>) {
    // Heads: a (retrying), b (retrying, alone), c (parked, alone), d (parked), e (done).
    let a1 = insert_at(&store, entry("r", "a", "a1", "a1"), T0 + 1).await;
    let b1 = insert_at(&store, entry("r", "b", "b1", "b1"), T0 + 2).await;
    let c1 = insert_at(&store, entry("r", "c", "c1", "c1"), T0 + 3).await;
    let d1 = insert_at(&store, entry("r", "d", "d1", "d1"), T0 + 4).await;
    let e1 = insert_at(&store, entry("r", "e", "e1", "e1"), T0 + 5).await;
    let claimed = store.claim(&req("r", "w", T0 + 10, 10)).await.unwrap();
    assert_eq!(ids(&claimed), vec![a1, b1, c1, d1, e1]);
    let later = T0 + 3_600_000;
    for c in &claimed {
        let settlement = match c.entry.id {
            id if id == c1 || id == d1 => Settlement::Parked { error: "refused".into() },
            id if id == e1 => Settlement::Done,
            _ => Settlement::Retry { at: later, error: "503".into(), not_yet_since: None },
        };
        store.settle(c.entry.id, &c.lease, T0 + 10, &settlement).await.unwrap();
    }
    // Entries behind a, d and e; another route's key `a` and an undecodable entry
    // (no key) count for nothing.
    insert_at(&store, entry("r", "a", "a2", "a2"), T0 + 20).await;
    insert_at(&store, entry("r", "d", "d2", "d2"), T0 + 21).await;
    insert_at(&store, entry("r", "e", "e2", "e2"), T0 + 22).await;
    insert_at(&store, entry("s", "a", "s1", "s1"), T0).await;
    insert_at(&store, entry("s", "a", "s2", "s2"), T0).await;
    insert_at(&store, undecodable("r", "x1", b"zz"), T0).await;

    let blocked = |keys, oldest| inbox::BlockedKeys { keys, oldest_head_received_at: oldest };
    // Under block-key: a (a2 waits), c and d (parked heads).
    assert_eq!(store.blocked_keys("r", true).await.unwrap(), blocked(3, Some(T0 + 1)));
    // Parked entries let later ones pass: only a.
    assert_eq!(store.blocked_keys("r", false).await.unwrap(), blocked(1, Some(T0 + 1)));
    assert_eq!(store.blocked_keys("s", true).await.unwrap(), blocked(1, Some(T0)));
    assert_eq!(store.blocked_keys("none", true).await.unwrap(), blocked(0, None));

    // a's head delivered at last: a2 is a head alone, so only the parked heads remain.
    let a = store.claim(&req("r", "w", later, 10)).await.unwrap();
    let a1_claim = a.iter().find(|c| c.entry.id == a1).expect("a1 is due again");
    store.settle(a1, &a1_claim.lease, later, &Settlement::Done).await.unwrap();
    for c in a.iter().filter(|c| c.entry.id != a1) {
        store
            .settle(
                c.entry.id,
                &c.lease,
                later,
                &Settlement::Retry { at: later * 2, error: "503".into(), not_yet_since: None },
            )
            .await
            .unwrap();
    }
    assert_eq!(store.blocked_keys("r", true).await.unwrap(), blocked(2, Some(T0 + 3)));
    assert_eq!(store.blocked_keys("r", false).await.unwrap(), blocked(0, None));
}

/// Two instances on one inbox: on PostgreSQL one holds the gauge lease, the other
/// does not until the holder goes away; on SQLite (one instance per file) every
/// store holds it.
mod gauge_lease {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_postgres_one_instance_holds_it_until_it_goes_away() {
        let pg = TestPg::new().await;
        let first = inbox::open(&pg.url, 2).await.expect("open postgres");
        let second = inbox::open(&pg.url, 2).await.expect("open postgres");
        assert!(first.gauge_lease().await.unwrap(), "the first to ask takes the lease");
        assert!(!second.gauge_lease().await.unwrap(), "the second does not while the first holds it");
        assert!(first.gauge_lease().await.unwrap(), "asking again keeps it");
        assert!(!second.gauge_lease().await.unwrap());
        drop(first);
        wait_until("the second store to take the gauge lease", std::time::Duration::from_secs(30), || {
            let second = Arc::clone(&second);
            async move { second.gauge_lease().await.unwrap() }
        })
        .await;
        assert!(second.gauge_lease().await.unwrap(), "and keeps it");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_sqlite_every_store_holds_it() {
        let (first, guard) = super::sqlite().await;
        let Guard::Sqlite(dir) = &guard else { unreachable!() };
        let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
        let second = inbox::open(&url, 2).await.expect("open sqlite");
        assert!(first.gauge_lease().await.unwrap());
        assert!(second.gauge_lease().await.unwrap());
    }
}

async fn list_filters_by_error_and_throughput_counts_deliveries_per_minute(store: Arc<dyn Store>) {
    let parked = |dedup: &str, error: &str| NewEntry {
        status: Status::Parked,
        last_error: Some(error.into()),
        ..entry("r", dedup, dedup, "x")
    };
    let busy1 = insert(&store, parked("1", "target answered 503: node 7 busy")).await;
    let busy2 = insert(&store, parked("2", "target answered 503: node 12 busy")).await;
    let odd = insert(&store, parked("3", "wildcards 100% literal_ here")).await;
    insert(&store, entry("r", "k", "4", "open, no error")).await;
    let fingerprint = inlet::inbox::failures::fingerprint("target answered 503: node 7 busy");
    let listed = |f: ListFilter| {
        let store = Arc::clone(&store);
        async move { store.list(&f).await.unwrap().iter().map(|e| e.id).collect::<Vec<_>>() }
    };
    let group = ListFilter { fingerprint: Some(fingerprint), limit: 10, ..Default::default() };
    assert_eq!(listed(group.clone()).await, vec![busy1, busy2], "one failure group");
    assert_eq!(store.count(&group).await.unwrap(), 2);
    assert_eq!(listed(ListFilter { newest_first: true, ..group.clone() }).await, vec![busy2, busy1]);
    let text = |t: &str| ListFilter { error_text: Some(t.into()), limit: 10, ..Default::default() };
    assert_eq!(listed(text("node 12")).await, vec![busy2]);
    assert_eq!(store.count(&text("busy")).await.unwrap(), 2);
    assert_eq!(listed(text("100% literal_")).await, vec![odd], "wildcards in the text are taken literally");
    assert_eq!(listed(text("1_0")).await, Vec::<i64>::new(), "`_` is not a wildcard");
    assert_eq!(listed(text("0%")).await, vec![odd]);

    // Entries finished DONE per route and minute since T0; IGNORED and older ones do not count.
    let done = |route: &str, dedup: &str| NewEntry { status: Status::Done, ..entry(route, "k", dedup, "d") };
    let finished = [
        ("r", "d1", T0),
        ("r", "d2", T0 + 30_000),
        ("r", "d3", T0 + 90_000),
        ("r2", "d4", T0 + 59_999),
        ("r", "old", T0 - 1),
    ];
    for (route, dedup, at) in finished {
        store.insert(&done(route, dedup), at).await.unwrap();
    }
    let ignored = NewEntry { status: Status::Ignored, last_error: Some("no".into()), ..entry("r", "k", "i1", "i") };
    store.insert(&ignored, T0).await.unwrap();
    let buckets: Vec<(String, i64, i64)> =
        store.throughput(T0, 60_000).await.unwrap().into_iter().map(|t| (t.route, t.bucket, t.done)).collect();
    assert_eq!(buckets, vec![("r".into(), 0, 2), ("r".into(), 1, 1), ("r2".into(), 0, 1)]);
}

fn attempt_record(status: &str) -> inbox::failures::Attempt {
    inbox::failures::Attempt {
        attempt: 1,
        owner: "w".into(),
        started_at: T0,
        duration_ms: 5,
        answer: "done".into(),
        status: status.parse().expect("a status"),
        reason: None,
        requests: vec![],
        plugin: None,
    }
}

/// Three attempts of one entry, settled one by one, in a batch and one by one again
/// (the first is kept in the entry's row, the later ones as records of their own),
/// come back as given, oldest first; a neighbour's history stays its own.
async fn an_entrys_attempts_come_back_oldest_first_however_each_was_settled(store: Arc<dyn Store>) {
    let id = insert(&store, entry("h", "a", "h1", "p")).await;
    let other = insert(&store, entry("h", "b", "h2", "p")).await;
    let record = |n: i32, at: Millis, answer: &str, status: &str| inbox::failures::Attempt {
        attempt: n,
        owner: format!("w{n}"),
        started_at: at,
        duration_ms: i64::from(n),
        answer: answer.into(),
        status: status.parse().expect("a status"),
        reason: (status == "OPEN").then(|| format!("answered 503 at attempt {n}")),
        requests: vec![inbox::failures::RequestRecord {
            step: 1,
            method: "POST".into(),
            path: format!("/try/{n}"),
            status: Some(if status == "OPEN" { 503 } else { 204 }),
            error: None,
        }],
        plugin: Some(format!("sha256:{n}")),
    };
    let retry = |at| Settlement::Retry { at, error: "503".into(), not_yet_since: None };
    let first = record(1, T0, "retry", "OPEN");
    let second = record(2, T0 + 1_000, "retry", "OPEN");
    let third = record(3, T0 + 2_000, "done", "DONE");

    let c = store.claim(&req("h", "w", T0, 1)).await.unwrap();
    assert_eq!(ids(&c), vec![id]);
    store.settle_recorded(id, &c[0].lease, T0 + 1, &retry(T0 + 1_000), Some(&first)).await.unwrap();
    // The second in a batch beside the neighbour's first (PostgreSQL's one statement).
    let c = store.claim(&req("h", "w", T0 + 1_000, 2)).await.unwrap();
    assert_eq!(ids(&c), vec![id, other]);
    let batch: Vec<SettleRequest> = vec![
        SettleRequest {
            id,
            lease: c[0].lease.clone(),
            now: T0 + 1_001,
            settlement: retry(T0 + 2_000),
            attempt: Some(second.clone()),
            next: None,
        },
        SettleRequest {
            id: other,
            lease: c[1].lease.clone(),
            now: T0 + 1_001,
            settlement: Settlement::Done,
            attempt: Some(record(1, T0 + 1_000, "done", "DONE")),
            next: None,
        },
    ];
    assert!(store.settle_batch(&batch).await.unwrap().iter().all(Result::is_ok));
    let c = store.claim(&req("h", "w", T0 + 2_000, 1)).await.unwrap();
    assert_eq!(ids(&c), vec![id]);
    store.settle_recorded(id, &c[0].lease, T0 + 2_001, &Settlement::Done, Some(&third)).await.unwrap();

    assert_eq!(store.attempts(id).await.unwrap(), vec![first, second, third]);
    assert_eq!(store.attempts(other).await.unwrap(), vec![record(1, T0 + 1_000, "done", "DONE")]);
}

/// PostgreSQL: an entry delivered at its first attempt adds no `inbox_attempt` row
/// (its record is in its own row), a retried one adds a row per later attempt; and a
/// history written before the entry's row kept records (schema 10: every attempt a
/// row) still reads in order with what comes after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_a_first_attempt_in_the_entry_row_and_later_ones_as_rows() {
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 4).await.expect("open postgres");
    let mut conn = pg.connect().await;
    let at = |started_at: Millis, status: &str| inbox::failures::Attempt { started_at, ..attempt_record(status) };
    let entries: Vec<i64> = {
        let mut v = Vec::new();
        for i in 0..3 {
            v.push(insert(&store, entry("f", &format!("k{i}"), &format!("f{i}"), "p")).await);
        }
        v
    };
    // An older binary's record of an earlier attempt of the third entry.
    sqlx::query(
        "INSERT INTO inbox_attempt (entry_id, attempt, owner, started_at, duration_ms, answer, status, requests)
         VALUES ($1, 1, 'old', $2, 7, 'retry', 'OPEN', '[]')",
    )
    .bind(entries[2])
    .bind(T0 - 5_000)
    .execute(&mut conn)
    .await
    .unwrap();
    let c = store.claim(&req("f", "w", T0, 3)).await.unwrap();
    let settles: Vec<SettleRequest> = c
        .iter()
        .map(|c| SettleRequest {
            id: c.entry.id,
            lease: c.lease.clone(),
            now: T0 + 1,
            settlement: Settlement::Done,
            attempt: Some(at(T0, "DONE")),
            next: None,
        })
        .collect();
    assert!(store.settle_batch(&settles).await.unwrap().iter().all(Result::is_ok));
    assert_eq!(attempt_rows(&mut conn).await, 1, "three first attempts, done: no row of their own");
    let third = store.attempts(entries[2]).await.unwrap();
    assert_eq!(third.iter().map(|a| a.owner.as_str()).collect::<Vec<_>>(), vec!["old", "w"], "oldest first");
    assert_eq!(store.attempts(entries[0]).await.unwrap(), vec![at(T0, "DONE")]);

    // A retried entry: its second attempt is a row (one by one and in a batch alike).
    let retried = insert(&store, entry("f", "k9", "f9", "p")).await;
    let c = store.claim(&req("f", "w", T0, 1)).await.unwrap();
    let retry = Settlement::Retry { at: T0 + 1_000, error: "503".into(), not_yet_since: None };
    store.settle_recorded(retried, &c[0].lease, T0 + 1, &retry, Some(&at(T0, "OPEN"))).await.unwrap();
    assert_eq!(attempt_rows(&mut conn).await, 1);
    let c = store.claim(&req("f", "w", T0 + 1_000, 1)).await.unwrap();
    store
        .settle_recorded(retried, &c[0].lease, T0 + 1_001, &Settlement::Done, Some(&at(T0 + 1_000, "DONE")))
        .await
        .unwrap();
    assert_eq!(attempt_rows(&mut conn).await, 2);
    assert_eq!(store.attempts(retried).await.unwrap(), vec![at(T0, "OPEN"), at(T0 + 1_000, "DONE")]);
}

/// Every key with an unresolved entry has a floor row, at or below its oldest
/// unresolved entry (the rule of sql/postgres_0012_key_floor.sql); the floors, by key.
async fn floors_hold(conn: &mut sqlx::PgConnection) -> HashMap<String, i64> {
    let broken: Vec<(String, Option<i64>, i64)> = sqlx::query_as(
        "SELECT e.correlation_key, f.floor, min(e.id) FROM inbox_entry e
         LEFT JOIN inbox_key_floor f ON f.route = e.route AND f.correlation_key = e.correlation_key
         WHERE e.status IN ('OPEN', 'IN_PROGRESS', 'PARKED') AND e.correlation_key IS NOT NULL
         GROUP BY e.correlation_key, f.floor HAVING f.floor IS NULL OR f.floor > min(e.id)",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert!(broken.is_empty(), "keys without a floor at or below their oldest unresolved entry: {broken:?}");
    let floors: Vec<(String, i64)> =
        sqlx::query_as("SELECT correlation_key, floor FROM inbox_key_floor").fetch_all(&mut *conn).await.unwrap();
    floors.into_iter().collect()
}

/// PostgreSQL: inserts give each key a floor row at 0; a claim raises its key's floor
/// to the head it takes (or to an older entry parked where parked lets the key pass);
/// and the inbox's maintenance deletes the rows of keys with nothing left, adds the
/// rows missing and lowers a floor found above an unresolved entry (what an older
/// binary could leave during a rolling upgrade).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_key_floors_follow_the_heads_and_are_kept_whole() {
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 4).await.expect("open postgres");
    let mut conn = pg.connect().await;
    let a: Vec<i64> = {
        let mut v = Vec::new();
        for i in 0..3 {
            v.push(insert(&store, entry("r", "A", &format!("a{i}"), "p")).await);
        }
        v
    };
    let b0 = insert(&store, entry("r", "B", "b0", "p")).await;
    let b1 = insert(&store, entry("r", "B", "b1", "p")).await;
    insert(&store, undecodable("r", "u0", b"?")).await; // parked, without a key: no row
    assert_eq!(floors_hold(&mut conn).await, HashMap::from([("A".into(), 0), ("B".into(), 0)]));

    let pass = |now| ClaimRequest { parked_blocks: false, ..req("r", "w", now, 10) };
    let c = store.claim(&pass(T0)).await.unwrap();
    let claimed: HashSet<i64> = ids(&c).into_iter().collect();
    assert!(claimed.contains(&a[0]) && claimed.contains(&b0), "the heads: {claimed:?}");
    assert_eq!(floors_hold(&mut conn).await, HashMap::from([("A".into(), a[0]), ("B".into(), b0)]));

    // A's head done, B's parked (the route lets a parked entry pass): the next claim
    // raises A's floor to its new head and keeps B's at the parked entry, which is
    // still unresolved.
    for c in &c {
        let s = match c.entry.id {
            id if id == b0 => Settlement::Parked { error: "refused".into() },
            _ => Settlement::Done,
        };
        store.settle(c.entry.id, &c.lease, T0 + 1, &s).await.unwrap();
    }
    let c = store.claim(&pass(T0 + 2)).await.unwrap();
    assert_eq!(ids(&c), vec![a[1], b1]);
    assert_eq!(floors_hold(&mut conn).await, HashMap::from([("A".into(), a[1]), ("B".into(), b0)]));

    // Everything finished: maintenance deletes both rows.
    for c in &c {
        store.settle(c.entry.id, &c.lease, T0 + 3, &Settlement::Done).await.unwrap();
    }
    assert!(store.ignore(b0, "operator", T0 + 3).await.unwrap());
    let c = store.claim(&pass(T0 + 4)).await.unwrap();
    assert_eq!(ids(&c), vec![a[2]]);
    store.settle(a[2], &c[0].lease, T0 + 5, &Settlement::Done).await.unwrap();
    let done = store.maintain().await.unwrap().unwrap_or_default();
    assert!(done.contains("2 rows of finished keys deleted"), "maintenance said: {done}");
    assert!(floors_hold(&mut conn).await.is_empty());

    // What an older binary could leave: a key without a row, a floor above its key's
    // oldest unresolved entry. A new instance's first maintenance mends both.
    let c0 = insert(&store, entry("r", "C", "c0", "p")).await;
    let d0 = insert(&store, entry("r", "D", "d0", "p")).await;
    sqlx::query("DELETE FROM inbox_key_floor WHERE correlation_key = 'C'").execute(&mut conn).await.unwrap();
    sqlx::query("UPDATE inbox_key_floor SET floor = $1 WHERE correlation_key = 'D'")
        .bind(d0 + 100)
        .execute(&mut conn)
        .await
        .unwrap();
    let fresh = inbox::open(&pg.url, 2).await.expect("open postgres again");
    let done = fresh.maintain().await.unwrap().unwrap_or_default();
    assert!(done.contains("1 added, 1 lowered"), "maintenance said: {done}");
    assert_eq!(floors_hold(&mut conn).await, HashMap::from([("C".into(), 0), ("D".into(), d0)]));
    let c = fresh.claim(&req("r", "w", T0 + 6, 10)).await.unwrap();
    assert!(ids(&c).contains(&c0) && ids(&c).contains(&d0), "both keys' heads are claimed: {:?}", ids(&c));
}

async fn attempt_rows(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM inbox_attempt").fetch_one(conn).await.unwrap()
}

/// PostgreSQL: claims leave dead row versions; once enough have died, `maintain`
/// vacuums and analyzes the inbox table, and then has nothing to do. (Autovacuum is
/// off for this table here, so that it cannot clean up first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_vacuums_the_inbox_once_enough_rows_died() {
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 4).await.expect("open postgres");
    let mut conn = pg.connect().await;
    sqlx::raw_sql("ALTER TABLE inbox_entry SET (autovacuum_enabled = false)").execute(&mut conn).await.unwrap();
    assert_eq!(store.maintain().await.unwrap(), None, "a fresh inbox needs nothing");
    let rows: Vec<NewEntry> = (0..12_000).map(|i| entry("m", &format!("k{i}"), &format!("d{i}"), "p")).collect();
    for chunk in rows.chunks(256) {
        store.insert_batch(chunk, T0).await.unwrap();
    }
    let mut claimed = 0;
    while claimed < rows.len() {
        let batch = store.claim(&ClaimRequest { ordered: false, ..req("m", "w", T0, 2_000) }).await.unwrap();
        assert!(!batch.is_empty(), "only {claimed} of {} claimed", rows.len());
        claimed += batch.len();
    }
    // The server's statistics arrive a moment after the transactions that changed the
    // rows (and the 12,000 inserts alone may first make it analyze).
    let done = wait_for("maintenance to vacuum the inbox", std::time::Duration::from_secs(30), || {
        let store = Arc::clone(&store);
        async move { store.maintain().await.unwrap().filter(|d| d.starts_with("vacuumed")) }
    })
    .await;
    assert!(done.contains("dead rows"), "{done}");
    let vacuumed: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(vacuum_count AS BIGINT) FROM pg_stat_user_tables WHERE relid = 'inbox_entry'::regclass",
    )
    .fetch_optional(&mut conn)
    .await
    .unwrap();
    assert_eq!(vacuumed, Some(1), "one manual vacuum: {done}");
    // Statistics of the last updates may reach the server after the vacuum decided not
    // to analyze (seen under a loaded machine): then one ANALYZE is still due, never a
    // second vacuum.
    let done = done.as_str();
    let settled = wait_for("maintenance to have nothing left", std::time::Duration::from_secs(30), || {
        let store = Arc::clone(&store);
        async move {
            match store.maintain().await.unwrap() {
                None => Some(()),
                Some(again) if again.starts_with("analyzed") => None,
                Some(again) => panic!("a second vacuum after {done}: {again}"),
            }
        }
    });
    settled.await;
}

/// An entry whose stored row cannot be read (here: attributes that are not a list of
/// pairs) is parked by the claim that meets it, with the reason, and the claim goes on
/// with the others, instead of failing every claim of its route. Listing and showing
/// it still work, and say what could not be read, so a person can find and repair it.
async fn an_unreadable_entry_is_parked_by_the_claim(
    store: Arc<dyn Store>,
    corrupt: impl std::future::Future<Output = ()>,
) {
    let good = insert(&store, entry("u", "a", "u1", "fine")).await;
    let bad = insert(&store, entry("u", "b", "u2", "broken")).await;
    corrupt.await;
    let route = ListFilter { route: Some("u".into()), ..Default::default() };
    let listed = store.list(&route).await.expect("the list reads past the broken row");
    assert_eq!(listed.iter().map(|e| e.id).collect::<Vec<_>>(), vec![good, bad]);
    assert_eq!(listed[0].unreadable, None);
    let what = listed[1].unreadable.as_deref().unwrap_or_default();
    assert!(what.starts_with("attributes: "), "the list says what is unreadable: {:?}", listed[1]);
    assert!(listed[1].attributes.is_empty());
    let claimed = store.claim(&req("u", "w", T0, 10)).await.expect("the claim goes on");
    assert_eq!(ids(&claimed), vec![good]);
    let parked = store.get(bad).await.expect("the broken row can be shown").expect("still stored");
    assert_eq!(parked.status, Status::Parked);
    assert_eq!(parked.unreadable.as_deref(), Some(what));
    let why = parked.last_error.as_deref().unwrap_or_default();
    assert!(why.contains("cannot be read") && why.contains(what), "parked with the reason: {why}");
    let filter = ListFilter { route: Some("u".into()), status: Some(Status::Parked), ..Default::default() };
    assert_eq!(store.count(&filter).await.unwrap(), 1);
    assert!(store.claim(&req("u", "w", T0 + 1, 10)).await.unwrap().is_empty(), "parked, not claimed again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_entry_is_parked_by_the_claim_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
    let store = inbox::open(&url, 4).await.expect("open sqlite");
    let corrupt = async {
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::query("UPDATE inbox_entry SET attributes = '{}' WHERE dedup_key = 'u2'").execute(&pool).await.unwrap();
        pool.close().await;
    };
    an_unreadable_entry_is_parked_by_the_claim(store, corrupt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_entry_is_parked_by_the_claim_on_postgres() {
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 4).await.expect("open postgres");
    let corrupt = async {
        let mut conn = pg.connect().await;
        sqlx::query("UPDATE inbox_entry SET attributes = '{}' WHERE dedup_key = 'u2'")
            .execute(&mut conn)
            .await
            .unwrap();
    };
    an_unreadable_entry_is_parked_by_the_claim(store, corrupt).await;
}

#[tokio::test]
async fn maintenance_has_nothing_to_do_on_sqlite() {
    let (store, _guard) = sqlite().await;
    let rows: Vec<NewEntry> = (0..300).map(|i| entry("m", &format!("k{i}"), &format!("d{i}"), "p")).collect();
    store.insert_batch(&rows, T0).await.unwrap();
    assert_eq!(store.maintain().await.unwrap(), None);
}

/// Every kind of settlement, with and without an attempt record, settled one by one
/// on some entries and in one batch on others: the rows and the records come out the
/// same (PostgreSQL settles a batch in one statement).
async fn a_settle_batch_writes_what_settles_one_by_one_write(store: Arc<dyn Store>) {
    let decoded = Decoded {
        event_type: "redecoded".into(),
        correlation_key: "new-key".into(),
        schema_version: Some("2".into()),
        body: b"new body".to_vec(),
    };
    let settlements = [
        Settlement::Done,
        Settlement::Ignored { reason: "not for this engine".into() },
        Settlement::Retry { at: T0 + 5_000, error: "answered 503 after 12 ms".into(), not_yet_since: None },
        Settlement::Retry { at: T0 + 9_000, error: "not yet: no instance waits".into(), not_yet_since: Some(T0 + 7) },
        Settlement::Parked { error: "answered 400".into() },
        Settlement::Decoded { decoded, dedup_key: Some("batch-dedup".into()) },
    ];
    let record = |i: usize| {
        i.is_multiple_of(2).then(|| inbox::failures::Attempt {
            attempt: i as i32 + 1,
            owner: "w".into(),
            started_at: T0 + i as i64,
            duration_ms: 3 + i as i64,
            answer: format!("answer-{i}"),
            status: inbox::Status::Open,
            reason: (i == 2).then(|| "answered 503".to_string()),
            requests: vec![],
            plugin: Some(format!("digest-{i}")),
        })
    };
    let mut rows = Vec::new();
    for (round, by_batch) in [(0, false), (1, true)] {
        let mut inserted = Vec::new();
        for i in 0..settlements.len() {
            inserted.push(insert(&store, entry("s", &format!("k{round}-{i}"), &format!("d{round}-{i}"), "p")).await);
        }
        let claimed = store.claim(&req("s", "w", T0, 100)).await.unwrap();
        assert_eq!(ids(&claimed), inserted);
        let requests: Vec<SettleRequest> = claimed
            .iter()
            .zip(&settlements)
            .enumerate()
            .map(|(i, (c, s))| {
                let settlement = match s {
                    Settlement::Decoded { decoded, .. } => {
                        Settlement::Decoded { decoded: decoded.clone(), dedup_key: Some(format!("redecoded-{round}")) }
                    }
                    other => other.clone(),
                };
                SettleRequest {
                    id: c.entry.id,
                    lease: c.lease.clone(),
                    now: T0 + 10,
                    settlement,
                    attempt: record(i),
                    next: None,
                }
            })
            .collect();
        if by_batch {
            let results = store.settle_batch(&requests).await.unwrap();
            assert!(results.iter().all(Result::is_ok), "{results:?}");
        } else {
            for r in &requests {
                store.settle_recorded(r.id, &r.lease, r.now, &r.settlement, r.attempt.as_ref()).await.unwrap();
            }
        }
        let mut these = Vec::new();
        for id in inserted {
            let e = store.get(id).await.unwrap().unwrap();
            let dedup =
                e.dedup_key.replace(&format!("d{round}-"), "d-").replace(&format!("redecoded-{round}"), "redecoded");
            let key = e.correlation_key.clone().map(|k| k.replace(&format!("k{round}-"), "k-"));
            let attempts = store.attempts(id).await.unwrap();
            these.push(format!(
                "{:?} {} {:?} {:?} {:?} {:?} {:?} {:?} {} {:?} {dedup} {key:?} {:?} {:?}",
                e.status,
                e.next_attempt_at,
                e.last_error,
                e.finished_at,
                e.event_type,
                e.schema_version,
                e.body,
                e.not_yet_since,
                e.attempts,
                e.lease_owner,
                e.updated_at,
                attempts
            ));
        }
        rows.push(these);
    }
    for (one, batch) in rows[0].iter().zip(&rows[1]) {
        assert_eq!(one, batch, "one by one, then in a batch");
    }
}

async fn a_settle_batch_commits_each_settle_and_fences_a_lost_lease_alone(store: Arc<dyn Store>) {
    let a = insert(&store, entry("r", "a", "1", "a1")).await;
    let b = insert(&store, entry("r", "b", "2", "b1")).await;
    let c = insert(&store, entry("r", "c", "3", "c1")).await;
    let claimed = store.claim(&req("r", "w", T0, 10)).await.unwrap();
    assert_eq!(ids(&claimed), vec![a, b, c]);
    let lease = |i: usize| claimed[i].lease.clone();
    let mut stale = lease(1);
    stale.token -= 1;
    let request = |id, lease, settlement, status: &str| SettleRequest {
        id,
        lease,
        now: T0 + 10,
        settlement,
        attempt: Some(attempt_record(status)),
        next: None,
    };
    let retry = Settlement::Retry { at: T0 + 1_000, error: "answered 503".into(), not_yet_since: None };
    let results = store
        .settle_batch(&[
            request(a, lease(0), Settlement::Done, "DONE"),
            request(b, stale, Settlement::Parked { error: "late".into() }, "PARKED"),
            request(c, lease(2), retry, "OPEN"),
        ])
        .await
        .expect("the batch commits");
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    assert!(matches!(results[1], Err(StoreError::LeaseLost { id }) if id == b), "{results:?}");

    assert_eq!(store.get(a).await.unwrap().unwrap().status, Status::Done);
    let e = store.get(c).await.unwrap().unwrap();
    assert_eq!((e.status, e.next_attempt_at), (Status::Open, T0 + 1_000));
    assert_eq!(store.get(b).await.unwrap().unwrap().status, Status::InProgress, "a stale settle changes nothing");
    assert_eq!(store.attempts(a).await.unwrap().len(), 1);
    assert_eq!(store.attempts(c).await.unwrap().len(), 1);
    assert!(store.attempts(b).await.unwrap().is_empty(), "no record of a settle whose lease was lost");
}

/// A replay window's record: listed with the entries it stored, among the open ones
/// until it ends or is closed; its entry is an ordinary new entry (a second insert of
/// it is a duplicate, and records nothing twice); what it made goes with the entry
/// when retention purges it.
async fn replay_windows_record_what_they_stored_and_are_listed_open_or_all(store: Arc<dyn Store>) {
    let window = |route: &str, closes_at: Millis| inbox::NewReplayWindow {
        route: route.into(),
        published_from: T0 - 60_000,
        published_to: T0,
        opened_at: T0,
        closes_at,
        opened_by: "cli:ops".into(),
        reason: "redo".into(),
    };
    let first = store.open_replay_window(&window("r", T0 + 3_600_000)).await.unwrap();
    let other = store.open_replay_window(&window("s", T0 + 1_000)).await.unwrap();
    assert_ne!(first, other);
    let original = insert(&store, entry("r", "k", "evt-1", "p")).await;
    let again = NewEntry { dedup_key: inbox::replay_dedup_key("evt-1", first), ..entry("r", "k", "evt-1", "p") };
    assert_eq!(again.dedup_key, format!("evt-1#replay-{first}"));
    let made = match store.insert_replay(&again, first, original, T0 + 10).await.unwrap() {
        InsertOutcome::Inserted { id } => id,
        other => panic!("a replay is a new entry, got {other:?}"),
    };
    assert!(made > original);
    assert_eq!(store.get(made).await.unwrap().unwrap().status, Status::Open);
    assert_eq!(
        store.insert_replay(&again, first, original, T0 + 20).await.unwrap(),
        InsertOutcome::Duplicate { id: made, replay_open: true },
        "the window's second redelivery is a duplicate (and its window is open)"
    );
    assert_eq!(store.replay_entries(first).await.unwrap(), [(made, original)]);
    assert!(store.replay_entries(other).await.unwrap().is_empty());

    let listed = store.replay_windows(Some("r"), None).await.unwrap();
    assert_eq!(listed.len(), 1);
    let w = &listed[0];
    assert_eq!((w.id, w.route.as_str(), w.taken, w.closed_at), (first, "r", 1, None));
    assert_eq!((w.published_from, w.published_to, w.opened_by.as_str()), (T0 - 60_000, T0, "cli:ops"));
    assert!(w.is_open(T0 + 10) && w.covers(T0 - 1) && !w.covers(T0));
    let open_later: Vec<i64> =
        store.replay_windows(None, Some(T0 + 2_000)).await.unwrap().iter().map(|w| w.id).collect();
    assert_eq!(open_later, [first], "the other window has ended by then");
    assert_eq!(store.replay_windows(None, None).await.unwrap().len(), 2);
    // A route's windows open at a time: what ingest asks for every duplicate.
    let open_of = |route: &'static str, at: Millis| {
        let store = Arc::clone(&store);
        async move {
            let open = store.replay_windows(Some(route), Some(at)).await.unwrap();
            open.iter().map(|w| (w.id, w.route.clone(), w.taken)).collect::<Vec<_>>()
        }
    };
    assert_eq!(open_of("r", T0 + 10).await, [(first, "r".to_string(), 1)]);
    assert_eq!(open_of("s", T0 + 10).await, [(other, "s".to_string(), 0)]);
    assert!(open_of("s", T0 + 1_000).await.is_empty(), "a window is open until its end, not at it");
    assert!(open_of("t", T0 + 10).await.is_empty(), "no window of another route");
    // A redelivery's insert says whether a window of its route is open, alone and in a
    // batch, so that ingest asks for the windows only then: it agrees with the list.
    for route in ["s", "t"] {
        insert(&store, entry(route, "k", "evt-1", "p")).await;
    }
    let redelivery_sees = |route: &'static str, at: Millis| {
        let store = Arc::clone(&store);
        async move {
            let e = entry(route, "k", "evt-1", "p");
            let alone = store.insert(&e, at).await.unwrap();
            let batch = store.insert_batch(&[e.clone(), e.clone()], at).await.unwrap();
            let seen: Vec<bool> = std::iter::once(alone)
                .chain(batch)
                .map(|o| match o {
                    InsertOutcome::Duplicate { replay_open, .. } => replay_open,
                    other => panic!("{route}: a redelivery, got {other:?}"),
                })
                .collect();
            assert!(seen.iter().all(|s| *s == seen[0]), "{route} at {at}: alone and batched disagree: {seen:?}");
            seen[0]
        }
    };
    assert!(redelivery_sees("r", T0 + 10).await);
    assert!(redelivery_sees("s", T0 + 10).await);
    assert!(!redelivery_sees("s", T0 + 1_000).await, "a window is open until its end, not at it");
    assert!(!redelivery_sees("t", T0 + 10).await, "no window of another route");

    assert!(!store.close_replay_window(other, T0 + 2_000).await.unwrap(), "an ended window cannot be closed");
    assert!(store.close_replay_window(first, T0 + 2_000).await.unwrap());
    assert!(!store.close_replay_window(first, T0 + 3_000).await.unwrap(), "closed once");
    assert!(store.replay_windows(None, Some(T0 + 2_500)).await.unwrap().is_empty());
    assert!(open_of("r", T0 + 2_500).await.is_empty(), "a closed window is not open");
    assert!(!redelivery_sees("r", T0 + 2_500).await, "a closed window is not open");
    assert_eq!(store.replay_windows(Some("r"), None).await.unwrap()[0].closed_at, Some(T0 + 2_000));

    // Retention: the entry the window made goes, and its record with it.
    for c in store.claim(&req("r", "w", T0 + 10, 10)).await.unwrap() {
        store.settle(c.entry.id, &c.lease, T0 + 20, &Settlement::Done).await.unwrap();
    }
    for c in store.claim(&req("r", "w", T0 + 30, 10)).await.unwrap() {
        store.settle(c.entry.id, &c.lease, T0 + 40, &Settlement::Done).await.unwrap();
    }
    assert_eq!(store.purge_finished(T0 + 1_000, 100).await.unwrap(), 2);
    assert!(store.replay_entries(first).await.unwrap().is_empty());
    assert_eq!(store.replay_windows(Some("r"), None).await.unwrap()[0].taken, 0);
}

/// A settle's ask for its key's next entry ([`inbox::NextOfKey`]).
fn next_of(route: &str, key: &str, parked_blocks: bool) -> Option<inbox::NextOfKey> {
    Some(inbox::NextOfKey { route: route.into(), key: key.into(), lease_ms: LEASE, parked_blocks })
}

/// A settle of `c` ending in `settlement`, asking for `next`.
fn settle_of(c: &Claimed, now: Millis, settlement: Settlement, next: Option<inbox::NextOfKey>) -> SettleRequest {
    SettleRequest { id: c.entry.id, lease: c.lease.clone(), now, settlement, attempt: None, next }
}

/// PostgreSQL: a settle that asks for its key's next entry gets it, claimed in the
/// settle's transaction under a lease of the same owner and with the key's floor
/// raised, exactly when an ordinary claim would take it: not behind an older entry
/// still OPEN (a retry) or PARKED where parked blocks, not on a paused route, not
/// while another transaction holds the key, not for a settle whose lease was lost.
///
/// Both ways a batch settles: in a transaction (a pool under 8, whose writers'
/// connections are not all kept), and as one call of the session's settle function
/// that commits alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_settle_hands_its_key_the_next_entry_when_a_claim_would_take_it() {
    settle_hands_on_when_a_claim_would(4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_settle_batch_in_one_call_hands_on_as_a_claim_would() {
    settle_hands_on_when_a_claim_would(8).await;
}

async fn settle_hands_on_when_a_claim_would(pool: u32) {
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, pool).await.expect("open postgres");
    let mut conn = pg.connect().await;
    let ins = async |key: &str, n: usize| {
        let mut v = Vec::new();
        for i in 0..n {
            v.push(insert(&store, entry("h", key, &format!("{key}{i}"), "p")).await);
        }
        v
    };
    let a = ins("A", 4).await;
    let b = ins("B", 2).await;
    let p = ins("P", 3).await;
    let l = ins("L", 2).await;
    let claimed = store.claim(&req("h", "w", T0, 10)).await.unwrap();
    assert_eq!(ids(&claimed), vec![a[0], b[0], p[0], l[0]]);
    let of = |id: i64| claimed.iter().find(|c| c.entry.id == id).expect("claimed");
    let retry = Settlement::Retry { at: T0 + 1_000, error: "503".into(), not_yet_since: None };
    let parked = Settlement::Parked { error: "bad".into() };
    let mut stale = settle_of(of(l[0]), T0 + 1, Settlement::Done, next_of("h", "L", true));
    stale.lease.token -= 1;
    let results = store
        .settle_batch(&[
            settle_of(of(a[0]), T0 + 1, Settlement::Done, next_of("h", "A", true)),
            // A retry leaves its entry the head: the entry after it is not claimed.
            settle_of(of(b[0]), T0 + 1, retry, next_of("h", "B", true)),
            // Without an ask, nothing is claimed.
            settle_of(of(p[0]), T0 + 1, parked, None),
            stale,
        ])
        .await
        .unwrap();
    // Which way it went: the writer's backend's last statement.
    let calls: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
           AND query LIKE '%pg_temp.inlet_settle_batch(%' AND pid <> pg_backend_pid()",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(calls, i64::from(pool >= 8), "the settle function ran with a pool of {pool}");
    let handed = results[0].as_ref().unwrap().as_ref().expect("A's next entry handed on");
    assert_eq!(handed.entry.id, a[1]);
    assert_eq!((handed.entry.status, handed.lease.owner.as_str()), (Status::InProgress, "w"));
    assert_eq!(handed.lease.expires_at, T0 + 1 + LEASE);
    assert!(matches!(results[1], Ok(None)), "{:?}", results[1].as_ref().map(|n| n.as_ref().map(|c| c.entry.id)));
    assert!(matches!(results[2], Ok(None)));
    assert!(matches!(results[3], Err(StoreError::LeaseLost { id }) if id == l[0]));
    assert_eq!(store.get(l[1]).await.unwrap().unwrap().status, Status::Open, "nothing claimed for a lost lease");
    assert_eq!(store.get(b[1]).await.unwrap().unwrap().status, Status::Open);
    assert_eq!(floors_hold(&mut conn).await["A"], a[1], "the key's floor follows the entry handed on");
    // The lease handed on is an ordinary one: its settle is fenced by it.
    let mut gone = handed.lease.clone();
    gone.token -= 1;
    assert!(matches!(store.settle(a[1], &gone, T0 + 2, &Settlement::Done).await, Err(StoreError::LeaseLost { .. })));

    // Parked P0: where parked blocks the key, P1 is not handed on; where it lets
    // the key pass, an ordinary claim takes P1 and its settle hands on P2.
    let pass = ClaimRequest { parked_blocks: false, ..req("h", "w", T0 + 2, 10) };
    let c = store.claim(&pass).await.unwrap();
    assert_eq!(ids(&c), vec![p[1]], "B1 waits behind B0's retry, L1 behind L0 in flight");
    let p1 = &c[0];
    let blocked =
        store.settle_batch(&[settle_of(p1, T0 + 3, Settlement::Done, next_of("h", "P", true))]).await.unwrap();
    assert!(matches!(blocked[0], Ok(None)), "P0 is parked ahead of P2 and blocks the key");
    let c = store.claim(&pass).await.unwrap();
    assert_eq!(ids(&c), vec![p[2]], "P2 is left OPEN for a claim, which takes it where parked passes");

    // Another transaction holding the key (as a claim of it would): not handed on.
    let mut holder = pg.connect().await;
    let lock = "SELECT pg_advisory_lock(hashtextextended('h' || ':' || 'A', 0))";
    sqlx::query(lock).execute(&mut holder).await.unwrap();
    let held =
        store.settle_batch(&[settle_of(handed, T0 + 4, Settlement::Done, next_of("h", "A", true))]).await.unwrap();
    assert!(matches!(held[0], Ok(None)), "the key is held elsewhere: its next entry waits for a claim");
    assert_eq!(store.get(a[1]).await.unwrap().unwrap().status, Status::Done, "the settle itself commits");
    assert_eq!(store.get(a[2]).await.unwrap().unwrap().status, Status::Open);
    sqlx::query("SELECT pg_advisory_unlock_all()").execute(&mut holder).await.unwrap();

    // A paused route: not handed on.
    let c = store.claim(&req("h", "w", T0 + 5, 10)).await.unwrap();
    assert_eq!(ids(&c), vec![a[2]]);
    let pause = inbox::Pause { route: "h".into(), paused_at: T0, paused_by: "ops".into(), reason: "r".into() };
    assert!(store.pause_route(&pause).await.unwrap());
    let paused =
        store.settle_batch(&[settle_of(&c[0], T0 + 6, Settlement::Done, next_of("h", "A", true))]).await.unwrap();
    assert!(matches!(paused[0], Ok(None)), "a paused route hands nothing on");
    assert_eq!(store.get(a[3]).await.unwrap().unwrap().status, Status::Open);
    floors_hold(&mut conn).await;
}

/// A role that may not create temporary objects (`TEMP` revoked on the database) gets
/// no functions in its sessions: settle batches, hand-ons included, and ordered claims
/// keep their transactions, and nothing else changes. (The whole conformance suite
/// also runs as such a role: `on_postgres_without_temp`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_without_temp_a_settle_batch_keeps_its_transaction() {
    let pg = TestPg::new().await;
    drop(inbox::open(&pg.url, 1).await.expect("migrate as the owner"));
    let role = role_without_temp(&pg).await;
    let url = role.url(&pg.url);
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let temp = sqlx::raw_sql("CREATE TEMP TABLE t (i int)").execute(&mut conn).await;
    assert!(temp.is_err(), "the role may not create temporary tables");

    let store = inbox::open_as(&url, 8, inbox::MigrateMode::Check, inbox::schema::DEFAULT_LOCK_TIMEOUT)
        .await
        .expect("open as the role");
    let (a0, a1, results) = settle_a0_asking_for_the_next(&store).await;
    let handed = results[0].as_ref().unwrap().as_ref().expect("A's next entry handed on");
    assert_eq!((handed.entry.id, handed.entry.status), (a1, Status::InProgress));
    assert_eq!(store.get(a0).await.unwrap().unwrap().status, Status::Done);
    let settled = store.settle_batch(&[settle_of(handed, T0 + 2, Settlement::Done, None)]).await.unwrap();
    assert!(matches!(settled[0], Ok(None)));
    assert_eq!(store.get(a1).await.unwrap().unwrap().status, Status::Done);
    let functions: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_proc WHERE proname IN ('inlet_settle_batch', 'inlet_claim')")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(functions, 0, "no session made a function");
    drop(store);
    conn.close().await.unwrap();
}

/// Where the role may make it, an ordered claim runs as one call of a function its
/// connection's session makes at its first claim (`on_postgres_without_temp` runs the
/// suite the other way, in the claim's transaction). A pool of one connection: every
/// claim on the same session, which makes the function once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_ordered_claim_runs_as_one_call() {
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 1).await.expect("open postgres");
    let mut conn = pg.connect().await;
    let a0 = insert(&store, entry("h", "A", "a0", "p")).await;
    let a1 = insert(&store, entry("h", "A", "a1", "p")).await;
    let b0 = insert(&store, entry("h", "B", "b0", "p")).await;
    let calls_and_functions = async |conn: &mut sqlx::PgConnection| -> (i64, i64) {
        sqlx::query_as(
            "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                       AND query LIKE '%pg_temp.inlet_claim(%' AND pid <> pg_backend_pid()),
                    (SELECT count(*) FROM pg_proc WHERE proname = 'inlet_claim')",
        )
        .fetch_one(conn)
        .await
        .unwrap()
    };
    let c = store.claim(&req("h", "w", T0, 10)).await.unwrap();
    assert_eq!(ids(&c), vec![a0, b0]);
    assert_eq!(calls_and_functions(&mut conn).await, (1, 1), "the claim ran as a call of the session's function");
    assert_eq!(store.keys_met("h"), Some(2), "the call walked the heads and said how many keys it met");
    assert_eq!((c[0].entry.status, c[0].lease.owner.as_str()), (Status::InProgress, "w"));
    assert_eq!(c[0].lease.expires_at, T0 + LEASE);
    store.settle(a0, &c[0].lease, T0 + 1, &Settlement::Done).await.unwrap();
    let c = store.claim(&req("h", "w", T0 + 2, 10)).await.unwrap();
    assert_eq!(ids(&c), vec![a1], "B0 is in flight");
    assert_eq!(calls_and_functions(&mut conn).await, (1, 1), "made once per session");
    floors_hold(&mut conn).await;
}

/// Two entries of key A on route h; A0 claimed, then settled DONE asking for its key's
/// next entry: both ids and what the settle answered.
async fn settle_a0_asking_for_the_next(store: &Arc<dyn Store>) -> (i64, i64, Vec<Result<Option<Claimed>, StoreError>>) {
    let a0 = insert(store, entry("h", "A", "a0", "p")).await;
    let a1 = insert(store, entry("h", "A", "a1", "p")).await;
    let c = store.claim(&req("h", "w", T0, 10)).await.unwrap();
    assert_eq!(ids(&c), vec![a0]);
    let results =
        store.settle_batch(&[settle_of(&c[0], T0 + 1, Settlement::Done, next_of("h", "A", true))]).await.unwrap();
    (a0, a1, results)
}

/// SQLite hands nothing on: the ask is answered `None` and the entry stays for a claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_settle_hands_nothing_on() {
    let (store, _guard) = sqlite().await;
    let (_, a1, results) = settle_a0_asking_for_the_next(&store).await;
    assert!(matches!(results[0], Ok(None)));
    assert_eq!(ids(&store.claim(&req("h", "w", T0 + 2, 10)).await.unwrap()), vec![a1]);
}

/// PostgreSQL: the instances that relay a route divide its keys. Each says so with
/// `share` and gets its part among those heard from within the ttl, in the order of
/// their names; one that leaves, or falls silent past the ttl, no longer counts; each
/// route has its own members. SQLite divides nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_instances_that_relay_a_route_each_get_a_part_of_its_keys() {
    use inbox::{Presence, Share};
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 4).await.expect("open postgres");
    let here = Presence::Here { ttl: std::time::Duration::from_secs(5) };
    let share = async |route: &str, owner: &str| store.share(route, owner, here).await.unwrap();
    assert_eq!(share("k", "b").await, Some(Share { index: 0, count: 1 }));
    assert_eq!(share("k", "a").await, Some(Share { index: 0, count: 2 }), "a sorts before b");
    assert_eq!(share("k", "b").await, Some(Share { index: 1, count: 2 }));
    assert_eq!(share("k", "c").await, Some(Share { index: 2, count: 3 }));
    assert_eq!(share("other", "c").await, Some(Share { index: 0, count: 1 }), "another route's members are its own");
    assert_eq!(store.share("k", "a", Presence::Leaving).await.unwrap(), None);
    assert_eq!(share("k", "b").await, Some(Share { index: 0, count: 2 }), "a left");
    // c falls silent: ten seconds since it last said so, past the ttl of five.
    let mut conn = pg.connect().await;
    sqlx::query("UPDATE inbox_route_member SET seen_at = seen_at - interval '10 seconds' WHERE owner = 'c'")
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(share("k", "b").await, Some(Share { index: 0, count: 1 }), "c is silent past its ttl");
    assert_eq!(share("k", "c").await, Some(Share { index: 1, count: 2 }), "c speaks again");

    let (sqlite, _guard) = sqlite().await;
    assert_eq!(sqlite.share("k", "a", here).await.unwrap(), None, "SQLite divides nothing");
}

/// PostgreSQL: a claim with a part of the keys takes only the heads of its part's keys
/// (their hash, as the statement computes it) and the entries without a key; the two
/// parts of two take every head between them, from the window of oldest entries and,
/// once the route is claimed from its heads (few keys), from the heads. A walk of the
/// heads counts the keys of its part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_claim_with_a_part_of_the_keys_takes_only_that_part() {
    use inbox::Share;
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 4).await.expect("open postgres");
    let keys: Vec<String> = (0..40).map(|k| format!("K{k}")).collect();
    let mut heads: HashMap<String, Vec<i64>> = HashMap::new();
    for round in 0..2 {
        for key in &keys {
            heads
                .entry(key.clone())
                .or_default()
                .push(insert(&store, entry("p", key, &format!("{key}-{round}"), "x")).await);
        }
    }
    let loose = insert(&store, NewEntry { decoded: None, ..entry("p", "", "u0", "raw") }).await;
    let mut conn = pg.connect().await;
    let part_of: HashMap<String, i64> =
        sqlx::query_as("SELECT k, (hashtextextended(k, 0) & 9223372036854775807) % 2 FROM unnest($1::text[]) AS k")
            .bind(&keys)
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert!((1..39).contains(&part_of.values().filter(|p| **p == 0).count()), "both parts have keys: {part_of:?}");
    for round in 0..2 {
        let now = T0 + round;
        let mut taken = Vec::new();
        for index in 0..2u32 {
            let owner = format!("w{index}");
            let claim = ClaimRequest { share: Some(Share { index, count: 2 }), ..req("p", &owner, now, 100) };
            let claimed = store.claim(&claim).await.unwrap();
            for c in &claimed {
                match c.entry.correlation_key.as_deref() {
                    None => assert_eq!((round, c.entry.id), (0, loose), "the entry without a key, to the first claim"),
                    Some(key) => {
                        assert_eq!(part_of[key], i64::from(index), "round {round}: {key} claimed by part {index}")
                    }
                }
            }
            taken.extend(claimed);
        }
        let mut got: Vec<i64> = ids(&taken).into_iter().filter(|id| *id != loose).collect();
        got.sort();
        let mut want: Vec<i64> = heads.values().map(|h| h[round as usize]).collect();
        want.sort();
        assert_eq!(got, want, "round {round}: the two parts took every key's head");
        for c in &taken {
            store.settle(c.entry.id, &c.lease, now, &Settlement::Done).await.unwrap();
        }
    }
    // The keys were counted (by a walk of the heads, or a count where the claims read
    // their window) within a part: one part's keys, not all of them. Which part's
    // depends on which claim was due to count them.
    let in_part = |index: i64| part_of.values().filter(|p| **p == index).count() as i64;
    let met = store.keys_met("p");
    assert!(
        met == Some(in_part(0)) || met == Some(in_part(1)),
        "a part's keys counted ({} or {} of {}): {met:?}",
        in_part(0),
        in_part(1),
        keys.len()
    );
}

/// PostgreSQL inserts a batch as one statement that commits alone, and that statement
/// refuses (leaving none of its rows) where a row has no answer in it: a dedup-key
/// conflict, which must park a row of its own in the batch's order, or a row whose
/// dedup key another insert committed after the statement's snapshot. The batch then
/// goes through a transaction, and its answers are those of one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_batch_insert_commits_alone_or_leaves_nothing() {
    let pg = TestPg::new().await;
    // A pool of 8: with fewer, the writers' connections are not all kept, and batches
    // keep their transaction.
    let store = inbox::open(&pg.url, 8).await.expect("open postgres");
    let mut conn = pg.connect().await;
    let rows_of = async |conn: &mut sqlx::PgConnection, dedup: &str| -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM inbox_entry WHERE dedup_key = $1")
            .bind(dedup)
            .fetch_one(&mut *conn)
            .await
            .unwrap()
    };
    // A refused statement is a transaction rolled back (a function's error is not
    // counted as a call): the database's count of those shows the batches went the
    // statement's way first.
    let rolled_back = async || -> i64 {
        sqlx::query_scalar("SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()")
            .fetch_one(&mut pg.connect().await)
            .await
            .unwrap()
    };
    let old = insert(&store, entry("r", "k", "old", "old payload")).await;
    // Stats reach the view at the latest a second after a backend goes idle.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await; // so the base below has every earlier one
    let base = rolled_back().await;
    let rollbacks = async |n: i64| {
        wait_until(&format!("{n} rollbacks counted"), std::time::Duration::from_secs(10), || async {
            rolled_back().await - base == n
        })
        .await
    };

    // A conflict between two new rows: had the refused statement kept n1 and n2, the
    // transaction after it would call them duplicates and park the conflict after n2.
    let out = store
        .insert_batch(
            &[entry("r", "k", "n1", "n1"), entry("r", "k", "old", "another payload"), entry("r", "k", "n2", "n2")],
            T0,
        )
        .await
        .unwrap();
    let InsertOutcome::Inserted { id: n1 } = out[0] else { panic!("n1: {:?}", out[0]) };
    let InsertOutcome::Conflict { existing, entry: parked, first: true } = out[1] else {
        panic!("the conflict: {:?}", out[1])
    };
    let InsertOutcome::Inserted { id: n2 } = out[2] else { panic!("n2: {:?}", out[2]) };
    assert_eq!(existing, old);
    assert!(old < n1 && n1 < parked && parked < n2, "ids in the batch's order: {old} {n1} {parked} {n2}");
    for dedup in ["n1", "n2"] {
        assert_eq!(rows_of(&mut conn, dedup).await, 1, "{dedup} stored once");
    }
    // The refusal, and the transaction's first try, which met the conflict with rows
    // inserted behind it and began again one by one.
    rollbacks(2).await;

    // Another insert of r1 holds its row uncommitted when the batch starts: the batch's
    // statement waits for it, finds r1 taken by a row its snapshot cannot see, and
    // refuses; r2 is then inserted once and called new, r1 a redelivery of that row.
    let mut other = pg.connect().await;
    sqlx::query("BEGIN").execute(&mut other).await.unwrap();
    let r1 = entry("r", "j", "r1", "r1");
    let held: i64 = sqlx::query_scalar(
        "INSERT INTO inbox_entry (route, dedup_key, correlation_key, event_type, raw_data, attributes, message_id,
            payload_digest, status, next_attempt_at, received_at, updated_at)
         VALUES ('r', 'r1', 'j', 'test', $1, '[]', 'msg-r1', $2, 'OPEN', $3, $3, $3) RETURNING id",
    )
    .bind(r1.raw_data.clone())
    .bind(r1.payload_digest())
    .bind(T0)
    .fetch_one(&mut other)
    .await
    .unwrap();
    let batch = {
        let store = Arc::clone(&store);
        tokio::spawn(async move { store.insert_batch(&[entry("r", "j", "r2", "r2"), r1], T0 + 1).await })
    };
    wait_until("the batch waits for the other insert's row", std::time::Duration::from_secs(10), || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut pg.connect().await)
        .await
        .unwrap();
        waiting > 0
    })
    .await;
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    let out = batch.await.unwrap().unwrap();
    assert!(matches!(out[0], InsertOutcome::Inserted { id } if id > n2), "r2 is new: {out:?}");
    assert_eq!(out[1], InsertOutcome::Duplicate { id: held, replay_open: false }, "r1 is the other insert's row");
    assert_eq!(rows_of(&mut conn, "r2").await, 1, "r2 stored once");
    assert_eq!(rows_of(&mut conn, "r1").await, 1, "r1 stored once");
    rollbacks(3).await;

    // New rows and redeliveries only: answered by the statement alone.
    let out = store.insert_batch(&[entry("r", "j", "r3", "r3"), entry("r", "j", "r2", "r2")], T0 + 2).await.unwrap();
    assert!(matches!(out[0], InsertOutcome::Inserted { .. }) && matches!(out[1], InsertOutcome::Duplicate { .. }));
    // Stats reach the view at the latest a second after a backend goes idle.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await; // past that second, so a refusal would show
    rollbacks(3).await;
}
