//! Self-test of the shared test support (`tests/testkit`, the `inlet-testkit` crate): the
//! tools that prove Inlet's invariants must themselves be proven.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use inlet_testkit::camunda::{FakeCamunda, Reply};
use inlet_testkit::in_process::Instance;
use inlet_testkit::paths::{inlet_bin, plugin_path};
use inlet_testkit::pg::{TestPg, pg_admin_url};
use inlet_testkit::pg_cluster::PgCluster;
use inlet_testkit::ports::{ephemeral_low, free_port};
use inlet_testkit::push::push_envelope;
use inlet_testkit::recording_target::RecordingTarget;
use inlet_testkit::wait::{wait_for, wait_until};
use sqlx::Connection as _;

const WAIT: Duration = Duration::from_secs(10);

// ----- TestPg ---------------------------------------------------------------------------

async fn database_exists(name: &str) -> bool {
    let mut admin = sqlx::PgConnection::connect(&pg_admin_url()).await.expect("admin connection");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = $1")
        .bind(name)
        .fetch_one(&mut admin)
        .await
        .expect("query pg_database");
    n == 1
}

#[tokio::test]
async fn test_pg_creates_a_fresh_database_and_drops_it() {
    let a = TestPg::new().await;
    let b = TestPg::new().await;
    assert_ne!(a.name(), b.name(), "every TestPg is its own database");
    assert!(a.name().starts_with(&format!("inlet_t_{}_", std::process::id())), "{}", a.name());
    assert!(a.url.ends_with(&format!("/{}", a.name())), "{}", a.url);

    let mut conn = a.connect().await;
    let current: String = sqlx::query_scalar("SELECT current_database()").fetch_one(&mut conn).await.unwrap();
    assert_eq!(current, a.name());
    sqlx::query("CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT NOT NULL)").execute(&mut conn).await.unwrap();
    sqlx::query("INSERT INTO t VALUES ($1, $2)").bind(1_i64).bind("x").execute(&mut conn).await.unwrap();
    let v: String = sqlx::query_scalar("SELECT v FROM t WHERE id = 1").fetch_one(&mut conn).await.unwrap();
    assert_eq!(v, "x");

    // The other database is untouched by what happened in the first.
    let mut other = b.connect().await;
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert_eq!(tables, 0);

    // Dropping works even with a connection still open (WITH (FORCE)).
    let name = a.name().to_owned();
    assert!(database_exists(&name).await);
    drop(a);
    assert!(!database_exists(&name).await, "database {name} should be gone after drop");
    assert!(conn.ping().await.is_err(), "the open connection was terminated by the forced drop");
    drop(other);
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_pg_works_with_a_pool_from_a_multi_threaded_runtime() {
    let pg = TestPg::new().await;
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(2).connect(&pg.url).await.unwrap();
    let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&pool).await.unwrap();
    assert_eq!(one, 1);
    // Drop with the pool still open: the forced drop ends its connections.
    let name = pg.name().to_owned();
    drop(pg);
    assert!(!database_exists(&name).await);
    pool.close().await;
}

#[tokio::test]
#[should_panic(expected = "PostgreSQL is NOT reachable")]
async fn test_pg_fails_loudly_when_postgres_is_unreachable() {
    let port = free_port();
    TestPg::with_admin_url(&format!("postgres://postgres@127.0.0.1:{port}/postgres")).await;
}

// ----- small helpers --------------------------------------------------------------------

#[test]
#[should_panic(expected = "plugin no_such_plugin not built: run scripts/build-plugins")]
fn plugin_path_panics_for_a_missing_plugin() {
    plugin_path("no_such_plugin");
}

#[test]
fn push_envelope_has_the_google_shape() {
    let env = push_envelope(b"{\"a\":1}", &[("eventType", "done"), ("v", "2")], "m-1");
    let msg = &env["message"];
    let data = base64::engine::general_purpose::STANDARD.decode(msg["data"].as_str().unwrap()).unwrap();
    assert_eq!(data, b"{\"a\":1}");
    assert_eq!(msg["attributes"]["eventType"], "done");
    assert_eq!(msg["attributes"]["v"], "2");
    assert_eq!(msg["messageId"], "m-1");
    assert_eq!(msg["message_id"], "m-1");
    let t = msg["publishTime"].as_str().unwrap();
    assert_eq!(msg["publish_time"], t);
    assert!(t.len() == 24 && t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
    assert!(t[..4].parse::<i32>().unwrap() >= 2024, "{t}");
    assert_eq!(env["subscription"], "projects/test/subscriptions/test");
}

#[test]
fn free_port_gives_a_bindable_port() {
    let port = free_port();
    assert_ne!(port, 0);
    std::net::TcpListener::bind(("127.0.0.1", port)).expect("port is free");
}

#[tokio::test]
async fn wait_until_returns_once_the_condition_holds() {
    let polls = Arc::new(AtomicUsize::new(0));
    let p = polls.clone();
    wait_until("the third poll", WAIT, move || {
        let p = p.clone();
        async move { p.fetch_add(1, Ordering::SeqCst) + 1 >= 3 }
    })
    .await;
    assert_eq!(polls.load(Ordering::SeqCst), 3);
    let v = wait_for("a value", WAIT, || async { Some(7) }).await;
    assert_eq!(v, 7);
}

#[tokio::test]
#[should_panic(expected = "waiting for the impossible")]
async fn wait_until_panics_naming_what_on_timeout() {
    wait_until("the impossible", Duration::from_millis(100), || async { false }).await;
}

// ----- FakeCamunda ----------------------------------------------------------------------

fn correlate_body(key: &str, completed_items: i64) -> String {
    serde_json::json!({
        "messageName": "WorkOrderCompleted",
        "correlationKeys": { "workOrderId": { "value": key, "type": "String" } },
        "processVariables": {
            "completedItems": { "value": completed_items, "type": "Integer" },
            "note": { "value": "hi", "type": "String" },
        },
    })
    .to_string()
}

async fn post(client: &reqwest::Client, fake: &FakeCamunda, key: &str, seq: i64, idem: &str) -> (u16, String) {
    let resp = client
        .post(format!("{}/engine-rest/message", fake.url()))
        .header("content-type", "application/json")
        .header("idempotency-key", idem)
        .body(correlate_body(key, seq))
        .send()
        .await
        .expect("request to fake camunda");
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

#[tokio::test]
async fn fake_camunda_records_requests_and_replies_as_scripted() {
    // Key "4711": no match, several match, 500, then ok. Any other key: ok at once.
    let fake = FakeCamunda::with_behaviour(|key, attempt| match (key, attempt) {
        ("4711", 1) => Reply::NoMatch,
        ("4711", 2) => Reply::SeveralMatch,
        ("4711", 3) => Reply::Status(500),
        _ => Reply::Ok,
    })
    .await;
    assert!(fake.url().starts_with("http://127.0.0.1:"));
    assert_eq!(fake.message_url(), format!("{}/engine-rest/message", fake.url()));
    let client = reqwest::Client::new();

    let (s, body) = post(&client, &fake, "4711", 1, "idem-1").await;
    assert_eq!(s, 400);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["type"], "RestException");
    assert_eq!(
        body["message"],
        "Cannot correlate message 'WorkOrderCompleted': No process definition or execution matches the parameters"
    );

    let (s, body) = post(&client, &fake, "4711", 1, "idem-1").await;
    assert_eq!(s, 400);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["type"], "RestException");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "Cannot correlate a message with name 'WorkOrderCompleted' to a single execution. 2 executions match the correlation keys: CorrelationSet ["
        ),
        "{message}"
    );

    let (s, body) = post(&client, &fake, "4711", 1, "idem-1").await;
    assert_eq!(s, 500);
    assert!(serde_json::from_str::<serde_json::Value>(&body).unwrap()["message"].is_string());

    let (s, body) = post(&client, &fake, "4711", 1, "idem-1").await;
    assert_eq!((s, body.as_str()), (204, ""));

    let (s, _) = post(&client, &fake, "42", 9, "idem-2").await;
    assert_eq!(s, 204);

    assert_eq!(fake.count(), 5);
    let all = fake.deliveries();
    assert_eq!(all.iter().map(|d| d.key.as_str()).collect::<Vec<_>>(), ["4711", "4711", "4711", "4711", "42"]);
    assert_eq!(all.iter().map(|d| d.status).collect::<Vec<_>>(), [400, 400, 500, 204, 204]);
    assert!(all.windows(2).all(|w| w[0].at <= w[1].at), "arrival order");
    let k = fake.deliveries_for("4711");
    assert_eq!(k.iter().map(|d| d.attempt).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert!(k.iter().all(|d| d.seq == 1 && d.idempotency_key.as_deref() == Some("idem-1")));
    assert_eq!(k[0].body["processVariables"]["note"]["value"], "hi");
    assert_eq!(k[0].headers.get("content-type").map(String::as_str), Some("application/json"));
    let other = fake.deliveries_for("42");
    assert_eq!((other[0].seq, other[0].idempotency_key.as_deref()), (9, Some("idem-2")));
    assert_eq!(fake.correlated_seqs("4711"), [1]);
    assert_eq!(fake.max_in_flight_per_key(), 1, "sequential requests never overlap");

    // The behaviour can be replaced; attempt counters carry on.
    fake.set_behaviour(|_, attempt| if attempt == 2 { Reply::Status(503) } else { Reply::Ok });
    let (s, _) = post(&client, &fake, "42", 10, "idem-3").await;
    assert_eq!(s, 503);
    assert_eq!(fake.deliveries_for("42")[1].attempt, 2);
}

#[tokio::test]
async fn fake_camunda_rejects_non_json_and_missing_message_name() {
    let fake = FakeCamunda::start().await;
    let client = reqwest::Client::new();
    let resp = client.post(fake.message_url()).body(correlate_body("1", 1)).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 415);
    let resp =
        client.post(fake.message_url()).header("content-type", "application/json").body("{}").send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let statuses: Vec<u16> = fake.deliveries().iter().map(|d| d.status).collect();
    assert_eq!(statuses, [415, 400]);
    assert_eq!(fake.deliveries()[1].seq, -1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_camunda_detects_two_requests_for_one_key_in_flight() {
    let fake = FakeCamunda::start().await.with_delay(Duration::from_millis(300));
    let client = reqwest::Client::new();

    // Different keys at once: parallel across keys is allowed and not an overlap.
    let (a, b) = tokio::join!(post(&client, &fake, "A", 1, "a1"), post(&client, &fake, "B", 1, "b1"));
    assert_eq!((a.0, b.0), (204, 204));
    assert_eq!(fake.max_in_flight_per_key(), 1);
    assert!(fake.overlaps().is_empty());

    // The same key twice at once: a violation of per-key order, and it is seen.
    let (a, b) = tokio::join!(post(&client, &fake, "A", 2, "a2"), post(&client, &fake, "A", 3, "a3"));
    assert_eq!((a.0, b.0), (204, 204));
    assert_eq!(fake.max_in_flight_per_key(), 2);
    assert_eq!(fake.overlaps(), ["A"]);
    assert_eq!(fake.count(), 4);
}

#[tokio::test]
async fn fake_camunda_stops_when_dropped() {
    let fake = FakeCamunda::start().await;
    let addr = fake.url().trim_start_matches("http://").to_owned();
    tokio::net::TcpStream::connect(&addr).await.expect("server is up");
    drop(fake);
    wait_until("the fake camunda port to close", WAIT, || {
        let addr = addr.clone();
        async move { tokio::net::TcpStream::connect(&addr).await.is_err() }
    })
    .await;
}

// ----- PgCluster ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_cluster_keeps_committed_rows_through_a_crash_and_comes_back_on_its_port() {
    let cluster = tokio::task::block_in_place(PgCluster::init);
    cluster.create_database("h").await;
    let url = cluster.url("h");
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect to the private cluster");
    sqlx::raw_sql("CREATE TABLE t (v INT); INSERT INTO t VALUES (1), (2)").execute(&mut conn).await.unwrap();

    tokio::task::block_in_place(|| cluster.crash());
    let broken = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM t").fetch_one(&mut conn).await;
    assert!(broken.is_err(), "a connection does not survive the crash: {broken:?}");
    assert!(sqlx::PgConnection::connect(&url).await.is_err(), "nothing listens while it is down");

    tokio::task::block_in_place(|| cluster.start());
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect after the restart, same port");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t").fetch_one(&mut conn).await.unwrap();
    assert_eq!(n, 2, "committed rows survive the crash (crash recovery ran)");
    let log = std::fs::read_to_string(cluster.log_path()).unwrap();
    assert!(log.contains("not properly shut down"), "the restart recovered from a crash:\n{log}");
}

// ----- RecordingTarget ------------------------------------------------------------------

async fn post_recording(client: &reqwest::Client, target: &RecordingTarget, key: &str, idem: &str) -> u16 {
    client
        .post(format!("http://{}/engine-rest/message", target.addr()))
        .header("content-type", "application/json")
        .header("idempotency-key", idem)
        .body(correlate_body(key, 1))
        .send()
        .await
        .expect("request to the recording target")
        .status()
        .as_u16()
}

#[tokio::test]
async fn recording_target_takes_each_idempotency_key_once_after_its_refusals() {
    let target = RecordingTarget::start().await;
    let client = reqwest::Client::new();
    target.refuse("e2", 2);
    let statuses = [
        post_recording(&client, &target, "k1", "e1").await,
        post_recording(&client, &target, "k1", "e1").await,
        post_recording(&client, &target, "k1", "e2").await,
        post_recording(&client, &target, "k1", "e2").await,
        post_recording(&client, &target, "k1", "e2").await,
        post_recording(&client, &target, "k2", "e3").await,
    ];
    assert_eq!(statuses, [204, 200, 422, 422, 204, 204], "effect, replay, two refusals, effect, effect");
    let effects = target.effects();
    assert_eq!(effects["k1"], ["e1", "e2"], "k1's effects in order, once each");
    assert_eq!(effects["k2"], ["e3"]);
    let requests = target.requests();
    assert_eq!(requests.len(), 6, "every request recorded");
    assert!(requests.iter().all(|r| r.key.starts_with('k')), "{requests:?}");
    assert_eq!(target.max_in_flight_per_key(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recording_target_detects_two_requests_for_one_key_in_flight() {
    let target = Arc::new(RecordingTarget::start().await);
    // Answers that take far longer than the test: both requests are surely in flight
    // once both are recorded; the clients then go away (the handlers are dropped).
    target.set_delay(Duration::from_secs(60), Duration::from_secs(60));
    let client = reqwest::Client::new();
    let mut calls = Vec::new();
    for (n, idem) in ["e1", "e2"].into_iter().enumerate() {
        let (client, target2) = (client.clone(), Arc::clone(&target));
        calls.push(tokio::spawn(async move { post_recording(&client, &target2, "k", idem).await }));
        wait_until("the request recorded", WAIT, || async { target.requests().len() > n }).await;
    }
    assert_eq!(target.max_in_flight_per_key(), 2, "both were in flight at once");
    assert_eq!(target.overlaps(), ["k"]);
    for call in calls {
        call.abort();
    }
}

#[test]
fn free_ports_bind_lie_below_the_ephemeral_range_and_are_never_handed_out_twice() {
    let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
    let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "a port was handed out twice: {ports:?}");
    // Only where the range leaves room below it (it does on Linux's default, 32768);
    // elsewhere the helper falls back to any free port.
    let low = ephemeral_low().expect("/proc/sys/net/ipv4/ip_local_port_range");
    if low > 12_000 {
        assert!(ports.iter().all(|p| *p < low), "a port in the ephemeral range (from {low}): {ports:?}");
    }
    for port in &ports[..10] {
        std::net::TcpListener::bind(("127.0.0.1", *port)).expect("the port binds");
    }
}

// ----- The testkit itself ---------------------------------------------------------------

#[test]
fn inlet_bin_is_the_binary_cargo_built_for_this_test() {
    assert_eq!(inlet_bin(), std::path::Path::new(env!("CARGO_BIN_EXE_inlet")));
}

#[test]
fn the_testkit_links_the_same_inlet_library_as_this_test() {
    // Compiling is the check: were the testkit built against another copy of the crate,
    // the `Running` it holds would not be this test's `inlet::app::Running`.
    fn running(instance: &Instance) -> &inlet::app::Running {
        &instance.running
    }
    let _ = running;
}
