//! Stopping a real `inlet run` as Kubernetes does: SIGTERM while pushes still arrive
//! and deliveries to a slow target are in flight. For the drain delay `/readyz`
//! answers 503 `draining` while pushes are still taken (200, stored) and admin
//! requests answered; then the process exits 0 within drain delay + grace, with every
//! attempt in flight at the signal finished (DONE). A second signal cuts the delay
//! short, and attempts still running when the grace ends are handed back (OPEN, no
//! lease), so the next instance delivers them at once instead of after their leases.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inlet_testkit::paths::plugin_path;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::{push_envelope, send_push};
use inlet_testkit::recording_target::RecordingTarget;
use inlet_testkit::wait::{wait_for, wait_until};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// A routing file in `dir`: one push route, `orders`, through the work-order plugin
/// to `target`, `concurrency` deliveries at once, each allowed `timeout`.
fn routing_file(dir: &Path, target: &RecordingTarget, concurrency: u32, timeout: &str) -> PathBuf {
    let config = dir.join("inlet.toml");
    let text = format!(
        "[store]\nurl = \"sqlite://{}\"\n\n[admin]\nauth = \"none-loopback\"\n\n[[route]]\nname = \"orders\"\nplugin = \"{}\"\n\
         source = {{ kind = \"push\" }}\nconcurrency = {concurrency}\n\
         target = {{ kind = \"http\", url = \"http://{}\", timeout = \"{timeout}\" }}\n",
        dir.join("inbox.db").display(),
        plugin_path("work_order").display(),
        target.addr()
    );
    std::fs::write(&config, text).expect("write the routing file");
    config
}

fn spawn(config: &Path, extra: &[&str]) -> InletProcess {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["--listen", listen.as_str(), "--poll", "50ms"];
    args.extend_from_slice(extra);
    InletProcess::spawn_with_args(config, &args, &[])
}

/// The inbox file, read beside the running process.
async fn rows(dir: &Path) -> sqlx::SqlitePool {
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(dir.join("inbox.db")).read_only(true);
    sqlx::SqlitePool::connect_with(options).await.expect("open the inbox file")
}

/// Each entry's status and lease owner, by id.
async fn states(pool: &sqlx::SqlitePool) -> BTreeMap<i64, (String, Option<String>)> {
    sqlx::query_as::<_, (i64, String, Option<String>)>("SELECT id, status, lease_owner FROM inbox_entry")
        .fetch_all(pool)
        .await
        .expect("read the inbox")
        .into_iter()
        .map(|(id, status, owner)| (id, (status, owner)))
        .collect()
}

async fn in_progress(pool: &sqlx::SqlitePool) -> Vec<i64> {
    states(pool).await.into_iter().filter(|(_, (s, _))| s == "IN_PROGRESS").map(|(id, _)| id).collect()
}

/// `GET base/path`: the status, the `Connection` header and the body as JSON (`Null`
/// if it is not).
async fn get(http: &reqwest::Client, base: &str, path: &str) -> (u16, Option<String>, Value) {
    let r = http.get(format!("{base}{path}")).send().await.unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = r.status().as_u16();
    let connection = r.headers().get("connection").map(|v| v.to_str().unwrap_or_default().to_owned());
    let body = r.text().await.unwrap_or_default();
    (status, connection, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Pushes work order `key`; the entry id and the answer's `Connection` header.
async fn push(http: &reqwest::Client, base: &str, key: &str) -> (i64, Option<String>) {
    let data = format!(r#"{{"workOrderId":"{key}","completedItems":1,"completionTimestamp":"t"}}"#);
    let envelope = push_envelope(data.as_bytes(), &[], &format!("orders-{key}"));
    let r = send_push(http, base, "orders", &envelope).await;
    let status = r.status().as_u16();
    let connection = r.headers().get("connection").map(|v| v.to_str().unwrap_or_default().to_owned());
    let body = r.text().await.unwrap();
    assert_eq!(status, 200, "push {key}: {body}");
    let answer: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("push {key}: not JSON ({e}): {body}"));
    (answer["entry"].as_i64().unwrap_or_else(|| panic!("push {key}: no entry id in {answer}")), connection)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_pushes_then_finishes_the_attempts_in_flight() {
    const DRAIN: Duration = Duration::from_secs(6);
    const GRACE: Duration = Duration::from_secs(10);
    // Pushes during the drain stop this long before it ends: what is proven is
    // that the listener takes them, not a race with its closing.
    const MARGIN: Duration = Duration::from_secs(2);
    let dir = tempfile::tempdir().unwrap();
    let target = RecordingTarget::start().await;
    // Slow enough that attempts are in flight at the signal, quick enough that they
    // finish within the grace.
    target.set_delay(Duration::from_millis(1500), Duration::from_millis(2500));
    let config = routing_file(dir.path(), &target, 4, "10s");
    let mut inlet = spawn(&config, &["--drain-delay", "6s", "--grace", "10s"]);
    inlet.wait_healthy(WAIT).await;
    let http = reqwest::Client::new();
    let base = inlet.base.clone();
    let (status, _, ready) = get(&http, &base, "/readyz").await;
    assert_eq!((status, &ready), (200, &serde_json::json!({ "status": "ready" })));

    for i in 0..12 {
        push(&http, &base, &format!("before-{i}")).await;
    }
    let pool = rows(dir.path()).await;
    let in_flight = wait_for("attempts in flight at the slow target", WAIT, || async {
        let ids = in_progress(&pool).await;
        (ids.len() == 4).then_some(ids)
    })
    .await;

    let signalled = Instant::now();
    inlet.signal("TERM");
    wait_until("/readyz to answer 503 draining", DRAIN, || async {
        let (status, _, body) = get(&http, &base, "/readyz").await;
        status == 503 && body == serde_json::json!({ "status": "draining" })
    })
    .await;

    // The window: pushes are stored and answered 200 (each answer closing its
    // connection), admin requests answered, and the instance stays unready.
    let mut drained = Vec::new();
    while signalled.elapsed() < DRAIN - MARGIN {
        let (id, connection) = push(&http, &base, &format!("during-{}", drained.len())).await;
        assert_eq!(connection.as_deref(), Some("close"), "a push answered while draining closes its connection");
        drained.push(id);
        let (status, _, body) = get(&http, &base, "/readyz").await;
        assert_eq!((status, &body["status"]), (503, &Value::from("draining")), "/readyz during the drain");
        let (status, _, routes) = get(&http, &base, "/api/routes").await;
        assert_eq!(status, 200, "an admin request during the drain: {routes}");
        tokio::time::sleep(Duration::from_millis(100)).await; // paces pushes through the drain window under test
    }
    assert!(drained.len() >= 3, "only {} pushes fitted in the drain window", drained.len());

    let status = inlet.wait_exit(DRAIN + GRACE + Duration::from_secs(5));
    let took = signalled.elapsed();
    assert!(status.success(), "inlet exits 0 after a drain: {status}\n{}", inlet.log());
    assert!(took >= DRAIN, "the listener stayed up for the drain delay only {took:?}");
    assert!(took < DRAIN + GRACE, "stopping took {took:?}, past drain delay + grace");

    let after = states(&pool).await;
    for id in &in_flight {
        assert_eq!(after[id], ("DONE".to_string(), None), "entry {id}, in flight at SIGTERM");
    }
    assert!(after.values().all(|(s, _)| s != "IN_PROGRESS"), "nothing is left in flight: {after:?}");
    for id in &drained {
        assert!(after.contains_key(id), "entry {id}, pushed (200) during the drain, is stored");
    }
    let log = inlet.log();
    for phase in [
        "draining: /readyz answers 503",
        "drain delay over",
        "listener closed",
        "sources and relays stopped; the attempts in flight finished",
        "stopped",
    ] {
        assert!(log.contains(phase), "the log says `{phase}`:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_ends_the_delay_and_attempts_past_the_grace_are_handed_back() {
    let dir = tempfile::tempdir().unwrap();
    let target = RecordingTarget::start().await;
    // Answers that come long after the grace (and well within the 95 s lease).
    target.set_delay(Duration::from_secs(80), Duration::from_secs(80));
    let config = routing_file(dir.path(), &target, 2, "90s");
    let mut inlet = spawn(&config, &["--drain-delay", "10m", "--grace", "1s"]);
    inlet.wait_healthy(WAIT).await;
    let http = reqwest::Client::new();
    let base = inlet.base.clone();
    let a = push(&http, &base, "a").await.0;
    let b = push(&http, &base, "b").await.0;
    let pool = rows(dir.path()).await;
    wait_until("both attempts at the target", WAIT, || async {
        in_progress(&pool).await.len() == 2 && target.requests().len() == 2
    })
    .await;

    inlet.signal("INT");
    wait_until("/readyz to answer 503 draining", WAIT, || async { get(&http, &base, "/readyz").await.0 == 503 }).await;
    // The second signal ends the 10 minute delay: the stop takes the 1 s grace.
    inlet.signal("TERM");
    let status = inlet.wait_exit(Duration::from_secs(15));
    assert!(status.success(), "inlet exits 0: {status}\n{}", inlet.log());

    let after = states(&pool).await;
    for id in [a, b] {
        assert_eq!(after[&id], ("OPEN".to_string(), None), "entry {id}, abandoned at the grace's end, is handed back");
    }
    let log = inlet.log();
    assert!(log.contains("second signal; drain delay cut short"), "{log}");
    assert!(log.contains("handed their entries back"), "{log}");

    // The next instance delivers them at once, not after their leases (95 s).
    target.set_delay(Duration::ZERO, Duration::ZERO);
    let mut next = spawn(&config, &[]);
    next.wait_healthy(WAIT).await;
    wait_until("both entries DONE", Duration::from_secs(30), || async {
        let after = states(&pool).await;
        after[&a].0 == "DONE" && after[&b].0 == "DONE"
    })
    .await;
    assert!(next.sigterm_and_wait(WAIT).success());
}

/// A stop that comes while Inlet starts, or the moment it first answers, is a clean
/// exit: the signal handlers are in place before anything is served (a CI run once
/// saw an `inlet` that had just answered healthy die by SIGTERM, the handlers not yet
/// installed). Starting is held deterministically by the PostgreSQL migration lock,
/// taken here first: the process waits for it, and the stop ends that wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_starting_or_at_the_first_healthy_answer_is_a_clean_exit() {
    use sqlx::Connection as _;
    let dir = tempfile::tempdir().unwrap();
    let target = RecordingTarget::start().await;
    let pg = inlet_testkit::pg::TestPg::new().await;
    let mut holder = pg.connect().await;
    // `MIGRATION_LOCK` in src/inbox/postgres.rs.
    sqlx::query("SELECT pg_advisory_lock(452824163700)").execute(&mut holder).await.expect("take the migration lock");
    let config = routing_file(dir.path(), &target, 2, "5s");
    let sqlite = std::fs::read_to_string(&config).unwrap();
    let on_pg = dir.path().join("pg.toml");
    let store_line = sqlite.lines().find(|l| l.starts_with("url = ")).expect("the store's url").to_owned();
    std::fs::write(&on_pg, sqlite.replace(&store_line, &format!("url = \"{}\"", pg.url))).unwrap();
    let mut inlet = spawn(&on_pg, &["--drain-delay", "0s"]);
    wait_until("inlet to wait for the migration lock", WAIT, || {
        inlet.assert_running();
        let waiting = inlet.log().contains("another instance is migrating the inbox schema; waiting for it");
        async move { waiting }
    })
    .await;
    let status = inlet.sigterm_and_wait(WAIT);
    assert!(status.success(), "a stop while starting exits 0: {status}\n{}", inlet.log());
    assert!(inlet.log().contains("stopped while starting; nothing was served"), "{}", inlet.log());
    holder.close().await.expect("release the migration lock");
    // At the first healthy answer, a few times over (the handlers come before the
    // listeners, so there is no moment without them).
    for _ in 0..3 {
        let mut inlet = spawn(&config, &["--drain-delay", "0s"]);
        inlet.wait_healthy(WAIT).await;
        let status = inlet.sigterm_and_wait(WAIT);
        assert!(status.success(), "a stop at the first healthy answer exits 0: {status}\n{}", inlet.log());
    }
}
