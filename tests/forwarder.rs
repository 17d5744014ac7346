//! Message translation as a route: legacy events are normalized by the forwarder
//! plugin and published to a topic of the real Pub/Sub emulator through its REST API;
//! a subscriber on that topic receives each event once, with the ordering key.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine as _;
use common::{PubSubEmulator, push_envelope};
use inlet::inbox::{ListFilter, Status};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_events_are_normalized_and_published_once_with_the_ordering_key() {
    let emulator = PubSubEmulator::start("inlet-test").await;
    emulator.create_topic("work-orders").await;
    emulator.create_subscription("work-orders", "audit", true).await;

    let routes = format!(
        "[[route]]\nname = \"normalize\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"http\", url = \"{}/topics/work-orders:publish\" }}\n",
        common::plugin_path("forwarder").display(),
        emulator.url()
    );
    let inlet = common::start_on_sqlite(&routes, |_| {}).await;
    let running = &inlet.running;
    let http = reqwest::Client::new();
    for n in 1..=10 {
        let wo = if n % 2 == 0 { "WO-2" } else { "WO-1" };
        let legacy =
            format!(r#"{{"wo":" {wo} ","items":"{n}","closedAt":"2026-08-01T10:00:0{}Z","eventId":"e-{n}"}}"#, n % 10);
        let envelope = push_envelope(legacy.as_bytes(), &[], &format!("m-{n}"));
        let r = http
            .post(format!("http://{}/push/normalize", running.addr))
            .body(envelope.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    }
    // Garbage is parked here, never forwarded.
    let r = http
        .post(format!("http://{}/push/normalize", running.addr))
        .body(
            push_envelope(br#"{"wo":"WO-3","items":"three","closedAt":"2026-08-01T10:00:00Z"}"#, &[], "m-bad")
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    common::wait_until("10 forwarded messages", Duration::from_secs(60), || {
        let (emulator, received) = (&emulator, std::sync::Arc::clone(&received));
        async move {
            let pulled = emulator.pull("audit").await;
            let mut all = received.lock().unwrap();
            all.extend(pulled);
            all.len() >= 10
        }
    })
    .await;
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 10, "each event once");
    let mut by_key: HashMap<String, Vec<u32>> = HashMap::new();
    for m in &received {
        let data = base64::engine::general_purpose::STANDARD.decode(m["data"].as_str().unwrap()).unwrap();
        let event: Value = serde_json::from_slice(&data).unwrap();
        let key = m["orderingKey"].as_str().unwrap().to_string();
        assert_eq!(event["workOrderId"], key.as_str(), "normalized and trimmed: {event}");
        assert_eq!(m["attributes"]["eventType"], "work-order-completed");
        assert_eq!(m["attributes"]["eventId"], format!("e-{}", event["completedItems"]));
        by_key.entry(key).or_default().push(event["completedItems"].as_u64().unwrap() as u32);
    }
    assert_eq!(by_key["WO-1"], vec![1, 3, 5, 7, 9], "in order per ordering key");
    assert_eq!(by_key["WO-2"], vec![2, 4, 6, 8, 10]);

    let entries = running
        .shared
        .store
        .list(&ListFilter { route: Some("normalize".into()), limit: 100, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(entries.iter().filter(|e| e.status == Status::Done).count(), 10);
    let bad = entries.iter().find(|e| e.message_id == "m-bad").unwrap();
    assert_eq!(bad.status, Status::Parked);
    assert!(bad.last_error.as_deref().unwrap().contains("items `three`"), "{:?}", bad.last_error);
    inlet.running.stop().await;
}
