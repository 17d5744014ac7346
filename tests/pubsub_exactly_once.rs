//! An exactly-once subscription on the real emulator: Inlet pulls from it with
//! confirmed acks, stores each message once and leaves the subscription drained.
//! (The emulator accepts `enableExactlyOnceDelivery`; it gives no way to make an ack
//! fail on purpose, so the refused-ack path is tested with the client library's own
//! error values in `src/source/pull.rs`.)

use std::time::Duration;

use inlet::config::Config;
use inlet::inbox::{ListFilter, Status};
use inlet::pubsub_client::Connection;
use inlet_testkit::emulator::PubSubEmulator;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::wait::wait_for;
use serde_json::json;

const PROJECT: &str = "exactly-once";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_subscription_is_stored_once_per_message_and_drained() {
    const N: usize = 50;
    let emulator = PubSubEmulator::start(PROJECT).await;
    emulator.create_topic("orders").await;
    let http = reqwest::Client::new();
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

    let data = |i: usize| {
        let order = format!(
            r#"{{"workOrderId":"wo-{}","completedItems":{i},"completionTimestamp":"2026-08-01T10:00:00Z"}}"#,
            i % 5
        );
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, order)
    };
    let messages: Vec<_> = (0..N).map(|i| json!({ "data": data(i) })).collect();
    let r = http
        .post(format!("{}/topics/orders:publish", emulator.url()))
        .header("content-type", "application/json")
        .body(json!({ "messages": messages }).to_string())
        .send()
        .await
        .expect("publish");
    assert!(r.status().is_success(), "publish: {}", r.text().await.unwrap());

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
