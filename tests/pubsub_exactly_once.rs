//! An exactly-once subscription on the real emulator: Inlet pulls from it with
//! confirmed acks, stores each message once and leaves the subscription drained; and
//! when it acks too late (the process stalled past the ack deadline, so the emulator
//! handed the messages out again under new ack ids), the emulator refuses the stale
//! acks, Inlet counts them by reason, and the messages, come again, end as one row
//! each. (The counting of every reason the client can give is tested with the client
//! library's own error values in `src/source/pull.rs`.)

use std::time::Duration;

use inlet::config::Config;
use inlet::inbox::{ListFilter, Status};
use inlet::pubsub_client::Connection;
use inlet_testkit::emulator::PubSubEmulator;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::wait::{wait_for, wait_until};
use serde_json::json;

const PROJECT: &str = "exactly-once";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_subscription_is_stored_once_per_message_and_drained() {
    const N: usize = 50;
    let emulator = PubSubEmulator::start(PROJECT).await;
    emulator.create_topic("orders").await;
    let body =
        json!({ "topic": emulator.topic_path("orders"), "ackDeadlineSeconds": 10, "enableExactlyOnceDelivery": true });
    let created = emulator.put_subscription("orders-eo", &body).await;
    assert_eq!(created["enableExactlyOnceDelivery"], true, "the emulator keeps exactly-once: {created}");

    let dir = tempfile::tempdir().expect("a folder");
    let config = dir.path().join("inlet.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"sqlite://inbox.db\"\n\n[[route]]\nname = \"orders\"\nplugin = \"{}\"\n\
             source = {{ kind = \"pubsub\", subscription = \"projects/{PROJECT}/subscriptions/orders-eo\" }}\n\
             target = {{ kind = \"log\" }}\n",
            plugin_path("work_order").display()
        ),
    )
    .expect("write the routing file");
    let options = inlet::app::Options {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        poll: Duration::from_millis(20),
        pubsub: Connection::emulator(&emulator.host),
        ..inlet::app::Options::default()
    };
    let running = inlet::app::start(&Config::load(&config).expect("routing file"), options).await.expect("starts");

    publish_work_orders(&emulator, N, 5).await;

    let store = &running.shared.store;
    let filter = ListFilter { route: Some("orders".into()), limit: 1000, ..Default::default() };
    let entries = wait_for(&format!("{N} entries"), Duration::from_secs(60), || async {
        let found = store.list(&filter).await.expect("list");
        (found.len() >= N).then_some(found)
    })
    .await;
    let mut ids: Vec<_> = entries.iter().map(|e| e.message_id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), N, "one entry per message");
    assert!(entries.iter().all(|e| e.status != Status::Parked), "all decoded");
    // Every ack was confirmed: nothing comes again, and nothing was refused.
    let acked = wait_for("every message acked", Duration::from_secs(30), || async {
        let text = running.shared.metrics.render();
        let acked: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(r#"inlet_pubsub_messages_total{route="orders",outcome="acked"} "#))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        (acked >= N as f64).then_some(text)
    })
    .await;
    assert!(!acked.contains("inlet_pubsub_acks_refused_total{"), "no ack refused:\n{acked}");
    running.stop().await;
    let left = emulator.pull("orders-eo").await;
    assert!(left.is_empty(), "the subscription is drained, {} left", left.len());
}

/// Publishes `n` work orders to topic `orders`, the i-th for work order `wo-{i % keys}`.
async fn publish_work_orders(emulator: &PubSubEmulator, n: usize, keys: usize) {
    let data = |i: usize| {
        let order = format!(
            r#"{{"workOrderId":"wo-{}","completedItems":{i},"completionTimestamp":"2026-08-01T10:00:00Z"}}"#,
            i % keys
        );
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, order)
    };
    let messages: Vec<_> = (0..n).map(|i| json!({ "data": data(i) })).collect();
    let r = reqwest::Client::new()
        .post(format!("{}/topics/orders:publish", emulator.url()))
        .header("content-type", "application/json")
        .body(json!({ "messages": messages }).to_string())
        .send()
        .await
        .expect("publish");
    assert!(r.status().is_success(), "publish: {}", r.text().await.unwrap());
}

/// The sum of the samples of metric `name` whose line contains `labels`.
fn sample_sum(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A real refused ack: a process that stalls (SIGSTOP) while it holds messages —
/// received, their insert waiting for the SQLite lock the test holds — cannot extend
/// their leases, so the emulator's 10 s ack deadline runs out and it hands them out
/// again under new ack ids. Resumed, Inlet stores the batch and acks it with the old
/// ids: the emulator refuses those acks (a stale ack id is INVALID_ARGUMENT on an
/// exactly-once subscription, seen here), Inlet counts them by reason, and the copies
/// that came again are duplicates. Every message ends as one row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_refused_after_a_stall_are_counted_and_the_messages_end_as_one_row_each() {
    const N: usize = 20;
    let emulator = PubSubEmulator::start(PROJECT).await;
    emulator.create_topic("orders").await;
    let body =
        json!({ "topic": emulator.topic_path("orders"), "ackDeadlineSeconds": 10, "enableExactlyOnceDelivery": true });
    emulator.put_subscription("orders-eo", &body).await;
    let dir = tempfile::tempdir().expect("a folder");
    let db = dir.path().join("inbox.db");
    let config = dir.path().join("inlet.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"sqlite://{}\"\n\n[[route]]\nname = \"orders\"\nplugin = \"{}\"\n\
             source = {{ kind = \"pubsub\", subscription = \"projects/{PROJECT}/subscriptions/orders-eo\", batch_wait = \"100ms\", lease_extension = \"10s\" }}\n\
             target = {{ kind = \"log\" }}\n",
            db.display(),
            plugin_path("work_order").display()
        ),
    )
    .expect("write the routing file");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut inlet =
        InletProcess::spawn_with_args(&config, &["--listen", &listen], &[("PUBSUB_EMULATOR_HOST", &emulator.host)]);
    inlet.wait_healthy(Duration::from_secs(60)).await;
    let metrics =
        || async move { reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.unwrap().text().await.unwrap() };

    // The inbox locked, the messages published: Inlet receives them and waits.
    let mut locker = {
        use sqlx::Connection as _;
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&db);
        let mut locker = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
        sqlx::query("BEGIN EXCLUSIVE").execute(&mut locker).await.unwrap();
        locker
    };
    publish_work_orders(&emulator, N, N).await;
    wait_until("Inlet holds every message", Duration::from_secs(30), || async {
        sample_sum(&metrics().await, "inlet_pubsub_received_total", "orders") >= N as f64
    })
    .await;

    // The stall: past the ack deadline, with the lock gone by the time it resumes.
    inlet.signal("STOP");
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    drop(locker);
    tokio::time::sleep(Duration::from_secs(15)).await; // the emulator's 10 s ack deadline runs out inside it: nothing to wait on from here
    inlet.signal("CONT");

    let text = wait_for("the stale acks refused and the messages taken again", Duration::from_secs(60), || async {
        let text = metrics().await;
        let refused = sample_sum(&text, "inlet_pubsub_acks_refused_total", "orders");
        let duplicates = sample_sum(&text, "inlet_ingested_total", "outcome=\"duplicate\"");
        (refused >= 1.0 && duplicates >= refused).then_some(text)
    })
    .await;
    let refused: Vec<&str> = text.lines().filter(|l| l.starts_with("inlet_pubsub_acks_refused_total{")).collect();
    println!("refused acks by reason: {refused:?}");
    let rows = {
        use sqlx::Connection as _;
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&db).read_only(true);
        let mut conn = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
        let counts: (i64, i64) = sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT message_id) FROM inbox_entry")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        counts
    };
    assert_eq!(rows, (N as i64, N as i64), "one row per message, after the refused acks and the redeliveries");
    assert!(inlet.sigterm_and_wait(Duration::from_secs(30)).success());
    let left = emulator.pull("orders-eo").await;
    assert!(left.is_empty(), "the copies that came again were acked: {} left", left.len());
}
