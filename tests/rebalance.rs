//! Per-key promises while instances come and go: four real `inlet` processes on one
//! PostgreSQL database relay 100 keys; one is SIGKILLed and another added while the
//! keys drain. Never two requests in flight for one key, per key the target sees the
//! entries in order (an entry the killed instance held may arrive again, right after
//! itself), every entry ends DONE, the killed instance's keys go on elsewhere and the
//! newcomer takes part. The instances divide the keys among themselves (each claims
//! only its part) and divide them again when one goes and another comes.
//!
//! Needs the plugins built (`scripts/build-plugins`) and PostgreSQL running
//! (`scripts/ensure-postgres`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use inlet_testkit::camunda::FakeCamunda;
use inlet_testkit::metrics::route_instances;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::pg::TestPg;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::{post_push, push_envelope};
use inlet_testkit::wait::wait_until;

const KEYS: usize = 100;
const PER_KEY: i64 = 30;
const TOTAL: usize = KEYS * PER_KEY as usize;
const ROUTE: &str = "work-order-completed";

fn key(k: usize) -> String {
    format!("WO-{k:03}")
}

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// The database's clock, ms.
async fn db_now(pg: &TestPg) -> i64 {
    let mut conn = pg.connect().await;
    sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT")
        .fetch_one(&mut conn)
        .await
        .expect("read the database clock")
}

/// Per key, the owners of its attempts that started in `[from, until)` (database
/// clock, ms), in attempt order.
async fn owners_by_key(pg: &TestPg, from: i64, until: i64) -> BTreeMap<String, Vec<String>> {
    let mut conn = pg.connect().await;
    let rows: Vec<(String, String)> = sqlx::query_as(
        // An entry's first attempt is recorded in its own row, later ones in inbox_attempt.
        "SELECT key, owner FROM (
             SELECT e.correlation_key AS key, a.owner, a.started_at, a.entry_id
             FROM inbox_attempt a JOIN inbox_entry e ON e.id = a.entry_id
             UNION ALL
             SELECT e.correlation_key, e.first_attempt::json->>'owner', (e.first_attempt::json->>'started_at')::bigint, e.id
             FROM inbox_entry e WHERE e.first_attempt IS NOT NULL) a
         WHERE a.started_at >= $1 AND a.started_at < $2 ORDER BY a.started_at, a.entry_id",
    )
    .bind(from)
    .bind(until)
    .fetch_all(&mut conn)
    .await
    .expect("read the attempt history");
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, owner) in rows {
        by_key.entry(k).or_default().push(owner);
    }
    by_key
}

/// Waits until every instance of `running` reads `n` instances dividing the keys.
async fn wait_for_members(http: &reqwest::Client, running: &[(String, InletProcess)], n: i64) {
    let bases: Vec<String> = running.iter().map(|(_, p)| p.base.clone()).collect();
    wait_until(&format!("every instance to see {n} dividing the keys"), Duration::from_secs(30), || {
        let (http, bases) = (http.clone(), bases.clone());
        async move {
            for base in &bases {
                if route_instances(&http, base, ROUTE).await != Some(n) {
                    return false;
                }
            }
            true
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_keep_per_key_order_while_one_is_killed_and_one_added() {
    let started = Instant::now();
    let pg = TestPg::new().await;
    let camunda = FakeCamunda::start().await.with_delay(Duration::from_millis(5));
    let plugin = plugin_path("work_order");

    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("routes.toml");
    std::fs::write(
        &config,
        format!(
            r#"[store]
url = {store}

[[route]]
name        = "{ROUTE}"
plugin      = {plugin}
source      = {{ kind = "push" }}
target      = {{ kind = "http", url = {target}, timeout = "1s" }}
ordering    = "per-key"
concurrency = 4
lease       = "5s"
"#,
            store = toml_str(&pg.url),
            plugin = toml_str(&plugin.display().to_string()),
            target = toml_str(&camunda.url()),
        ),
    )
    .expect("write the routing file");
    let spawn = |name: &str| {
        let listen = format!("127.0.0.1:{}", free_port());
        InletProcess::spawn_with_args(&config, &["--listen", &listen, "--poll", "50ms"], &[("INLET_INSTANCE", name)])
    };
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("http client");

    let mut running: Vec<(String, InletProcess)> =
        ["a", "b", "c", "d"].iter().map(|n| (n.to_string(), spawn(n))).collect();
    for (_, p) in &mut running {
        p.wait_healthy(Duration::from_secs(60)).await;
    }
    let bases: Vec<String> = running.iter().map(|(_, p)| p.base.clone()).collect();
    eprintln!("four instances healthy after {:?}", started.elapsed());
    // Each relays a part of the keys (inbox_route_member): all four see all four.
    wait_for_members(&http, &running, 4).await;

    // Push every key's entries in order (each answered before the next), the keys
    // concurrently, spread over the instances.
    let mut pushers = tokio::task::JoinSet::new();
    for k in 0..KEYS {
        let (http, bases) = (http.clone(), bases.clone());
        pushers.spawn(async move {
            for seq in 1..=PER_KEY {
                let data = format!(
                    r#"{{"workOrderId":"{}","completedItems":{seq},"completionTimestamp":"2026-08-01T10:00:00Z"}}"#,
                    key(k)
                );
                let event = format!("evt-{}-{seq:02}", key(k));
                let envelope = push_envelope(data.as_bytes(), &[("eventId", &event)], &format!("msg-{event}"));
                let status = post_push(&http, &bases[(k + seq as usize) % bases.len()], ROUTE, &envelope).await;
                assert_eq!(status, 200, "push {event}");
            }
        });
    }
    while let Some(joined) = pushers.join_next().await {
        if let Err(e) = joined {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    eprintln!("pushed {TOTAL} after {:?}; {} delivered so far", started.elapsed(), camunda.count());

    // A quarter delivered: slow the target so the drain stands almost still, kill c
    // with attempts in flight and add e; the target speeds up again once e is
    // running. So e finds work whatever the machine's speed.
    wait_until("a quarter of the entries delivered", Duration::from_secs(120), || {
        let n = camunda.count();
        async move { n >= TOTAL / 4 }
    })
    .await;
    camunda.set_delay(Some(Duration::from_millis(400)));
    let killed_from = db_now(&pg).await;
    let (_, mut c) = running.remove(2);
    c.sigkill();
    let killed_to = db_now(&pg).await;
    eprintln!("SIGKILLed c with {} delivered", camunda.count());
    let mut e = spawn("e");
    e.wait_healthy(Duration::from_secs(60)).await;
    running.push(("e".to_string(), e));
    eprintln!("e healthy after {:?}; {} delivered", started.elapsed(), camunda.count());
    camunda.set_delay(Some(Duration::from_millis(5)));

    let ok_for_all =
        |camunda: &FakeCamunda| (0..KEYS).all(|k| camunda.correlated_seqs(&key(k)).last().copied() == Some(PER_KEY));
    wait_until("every key delivered to its last entry", Duration::from_secs(180), || {
        for (_, p) in &mut running {
            p.assert_running();
        }
        let done = ok_for_all(&camunda);
        async move { done }
    })
    .await;
    let pg_ref = &pg;
    wait_until(&format!("all {TOTAL} entries DONE"), Duration::from_secs(30), move || async move {
        let mut conn = pg_ref.connect().await;
        let done: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_entry WHERE status = 'DONE'")
            .fetch_one(&mut conn)
            .await
            .expect("count DONE");
        done == TOTAL as i64
    })
    .await;
    eprintln!("drained after {:?}", started.elapsed());
    // c fell silent and e joined: the four left divide the keys.
    wait_for_members(&http, &running, 4).await;

    // --- Per-key promises at the target -------------------------------------------------
    assert_eq!(camunda.max_in_flight_per_key(), 1, "two requests in flight for one key: {:?}", camunda.overlaps());
    assert!(camunda.overlaps().is_empty(), "overlaps: {:?}", camunda.overlaps());
    let mut repeated = 0;
    for k in 0..KEYS {
        let seqs = camunda.correlated_seqs(&key(k));
        assert!(seqs.windows(2).all(|w| w[0] <= w[1]), "key {}: deliveries out of order: {seqs:?}", key(k));
        let distinct: BTreeSet<i64> = seqs.iter().copied().collect();
        assert_eq!(distinct, (1..=PER_KEY).collect(), "key {}: entries missing: {seqs:?}", key(k));
        repeated += seqs.len() - distinct.len();
    }
    eprintln!("entries delivered again after the SIGKILL (held by c): {repeated}");
    assert!(repeated <= 4, "more entries delivered twice ({repeated}) than c had in flight (4)");

    // --- Who relayed what ---------------------------------------------------------------
    let before = owners_by_key(&pg, 0, killed_from).await;
    let after = owners_by_key(&pg, killed_to, i64::MAX).await;
    let of = |owner: &str| after.values().filter(|o| o.iter().any(|x| x == owner)).count();
    let c_keys: Vec<&String> = before.iter().filter(|(_, o)| o.iter().any(|x| x == "c")).map(|(k, _)| k).collect();
    let handed_over = c_keys.iter().filter(|k| after.contains_key(**k)).count();
    eprintln!(
        "keys relayed after the kill by a {} b {} d {} e {}; of the {} keys c relayed, {handed_over} went on elsewhere",
        of("a"),
        of("b"),
        of("d"),
        of("e"),
        c_keys.len()
    );
    assert_eq!(of("c"), 0, "c relayed after it was killed");
    assert!(!c_keys.is_empty(), "c relayed no key before it was killed");
    // Every entry is DONE with c dead, so whatever c left went on elsewhere; that it
    // left some (keys it had relayed, not finished at a quarter of the drain) is what
    // makes this a hand-over.
    assert!(handed_over > 0, "none of c's keys had entries left when it was killed");
    let per_owner: HashMap<&str, usize> = ["a", "b", "d", "e"].iter().map(|o| (*o, of(o))).collect();
    assert!(per_owner.values().all(|n| *n > 0), "an instance relayed nothing after the kill: {per_owner:?}");

    // Stopped together (each drains for its drain delay), then each waited for.
    for (_, p) in &mut running {
        p.signal("TERM");
    }
    for (name, mut p) in running {
        let status = p.wait_exit(Duration::from_secs(30));
        assert!(status.success(), "inlet {name} exited with {status}\n{}", p.log());
    }
    drop(c);
}
