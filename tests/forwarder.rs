//! Message translation as a route: legacy events pulled from one topic of the real
//! Pub/Sub emulator are normalized by the forwarder plugin and published to another
//! through the `pubsub` target. A subscriber on the out topic receives each event
//! once per inbox entry, with the correlation key as ordering key when the route
//! asks for it, and without one when it does not.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use inlet::inbox::{ListFilter, Status};
use inlet_testkit::emulator::PubSubEmulator;
use inlet_testkit::in_process::start_on_sqlite;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::proxy::TcpProxy;
use inlet_testkit::py_pubsub::assert_drained;
use inlet_testkit::wait::{wait_for, wait_until};
use serde_json::{Value, json};

const PROJECT: &str = "inlet-test";

fn route(name: &str, subscription: &str, topic: &str, ordering_key: bool) -> String {
    format!(
        r#"[[route]]
name = "{name}"
plugin = "{plugin}"
source = {{ kind = "pubsub", subscription = "projects/{PROJECT}/subscriptions/{subscription}", lease_extension = "10s" }}
target = {{ kind = "pubsub", topic = "projects/{PROJECT}/topics/{topic}", ordering_key = {ordering_key}, attributes = {{ origin = "inlet-test" }} }}
"#,
        plugin = plugin_path("forwarder").display()
    )
}

/// Publishes through the emulator's REST API (test input; the subject here is
/// what Inlet publishes).
async fn publish(emulator: &PubSubEmulator, topic: &str, payloads: &[String]) {
    let messages: Vec<Value> =
        payloads.iter().map(|p| json!({ "data": base64::engine::general_purpose::STANDARD.encode(p) })).collect();
    let r = reqwest::Client::new()
        .post(format!("{}/topics/{topic}:publish", emulator.url()))
        .header("content-type", "application/json")
        .body(json!({ "messages": messages }).to_string())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "publish: {}", r.text().await.unwrap());
}

/// Pulls from `subscription` until `n` messages arrived, then a little longer to
/// catch any extra copy.
async fn receive(emulator: &PubSubEmulator, subscription: &str, n: usize) -> Vec<Value> {
    let received = Arc::new(Mutex::new(Vec::<Value>::new()));
    wait_until(&format!("{n} messages on {subscription}"), Duration::from_secs(90), || {
        let received = Arc::clone(&received);
        async move {
            let pulled = emulator.pull(subscription).await;
            let mut all = received.lock().unwrap();
            all.extend(pulled);
            all.len() >= n
        }
    })
    .await;
    assert_drained(emulator, subscription, Duration::from_secs(12)).await;
    received.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_events_are_normalized_and_published_once_per_entry_with_the_ordering_key() {
    let emulator = PubSubEmulator::start(PROJECT).await;
    emulator.create_topic("legacy").await;
    emulator.create_subscription("legacy", "to-ordered", true).await;
    emulator.create_subscription("legacy", "to-plain", true).await;
    emulator.create_topic("work-orders").await;
    emulator.create_subscription("work-orders", "audit", true).await;
    emulator.create_topic("work-orders-plain").await;
    emulator.create_subscription("work-orders-plain", "audit-plain", false).await;

    let routes = format!(
        "{}\n{}",
        route("normalize", "to-ordered", "work-orders", true),
        route("normalize-plain", "to-plain", "work-orders-plain", false)
    );
    let inlet =
        start_on_sqlite(&routes, |o| o.pubsub = inlet::pubsub_client::Connection::emulator(&emulator.host)).await;

    let mut payloads: Vec<String> = (1..=10)
        .map(|n| {
            let wo = if n % 2 == 0 { "WO-2" } else { "WO-1" };
            format!(r#"{{"wo":" {wo} ","items":"{n}","closedAt":"2026-08-01T10:00:0{}Z","eventId":"e-{n}"}}"#, n % 10)
        })
        .collect();
    // Garbage is parked, never forwarded.
    payloads.push(r#"{"wo":"WO-3","items":"three","closedAt":"2026-08-01T10:00:00Z"}"#.into());
    publish(&emulator, "legacy", &payloads).await;

    let ordered = receive(&emulator, "audit", 10).await;
    assert_eq!(ordered.len(), 10, "each event once");
    let mut by_key: HashMap<String, Vec<u32>> = HashMap::new();
    for m in &ordered {
        let data = base64::engine::general_purpose::STANDARD.decode(m["data"].as_str().unwrap()).unwrap();
        let event: Value = serde_json::from_slice(&data).unwrap();
        let key = m["orderingKey"].as_str().unwrap_or_default().to_string();
        assert_eq!(event["workOrderId"], key.as_str(), "normalized, trimmed, ordering key = correlation key: {m}");
        assert_eq!(m["attributes"]["eventType"], "work-order-completed");
        assert_eq!(m["attributes"]["eventId"], format!("e-{}", event["completedItems"]));
        assert_eq!(m["attributes"]["origin"], "inlet-test", "configured attributes are added");
        assert_eq!(m["attributes"]["idempotency_key"], format!("e-{}", event["completedItems"]));
        by_key.entry(key).or_default().push(event["completedItems"].as_u64().unwrap() as u32);
    }
    assert_eq!(by_key["WO-1"], vec![1, 3, 5, 7, 9], "in order per ordering key");
    assert_eq!(by_key["WO-2"], vec![2, 4, 6, 8, 10]);

    let plain = receive(&emulator, "audit-plain", 10).await;
    assert_eq!(plain.len(), 10, "each event once");
    for m in &plain {
        assert!(
            m.get("orderingKey").and_then(Value::as_str).unwrap_or_default().is_empty(),
            "no ordering key unless the route asks for one: {m}"
        );
    }

    let store = &inlet.running.shared.store;
    for route in ["normalize", "normalize-plain"] {
        let entries =
            store.list(&ListFilter { route: Some(route.into()), limit: 100, ..Default::default() }).await.unwrap();
        assert_eq!(entries.len(), 11, "{route}: one entry per message");
        assert_eq!(entries.iter().filter(|e| e.status == Status::Done).count(), 10, "{route}");
        let bad = entries.iter().find(|e| e.status == Status::Parked).expect("the garbage entry");
        assert!(bad.last_error.as_deref().unwrap().contains("items `three`"), "{:?}", bad.last_error);
    }
    inlet.running.stop().await;
}

/// A topic that does not exist is the service's NOT_FOUND, which the target answers
/// as 404; the forwarder plugin parks such an entry with the reason (a retry cannot help).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_to_a_missing_topic_parks_the_entry_with_the_reason() {
    let emulator = PubSubEmulator::start(PROJECT).await;
    emulator.create_topic("legacy").await;
    emulator.create_subscription("legacy", "to-nowhere", false).await;
    let routes = route("normalize", "to-nowhere", "no-such-topic", true);
    let inlet =
        start_on_sqlite(&routes, |o| o.pubsub = inlet::pubsub_client::Connection::emulator(&emulator.host)).await;
    publish(
        &emulator,
        "legacy",
        &[r#"{"wo":"WO-9","items":"1","closedAt":"2026-08-01T10:00:00Z","eventId":"e-9"}"#.into()],
    )
    .await;
    let store = &inlet.running.shared.store;
    let entry = wait_for("the entry to be parked", Duration::from_secs(60), || async {
        let entries = store.list(&ListFilter { route: Some("normalize".into()), ..Default::default() }).await.unwrap();
        entries.into_iter().find(|e| e.status == Status::Parked)
    })
    .await;
    let error = entry.last_error.unwrap_or_default();
    assert!(error.contains("the topic does not exist") && error.contains("404"), "{error}");
    inlet.running.stop().await;
}

/// A publish the target gave up on stays given up: with the emulator unreachable for
/// longer than the target's timeout, the publish fails within the timeout, and once
/// the emulator is back nothing of it arrives later (the client's own retries are
/// bounded by the same timeout). A publish after that goes through, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_that_timed_out_is_not_published_later() {
    use inlet::delivery::{Clients, Delivery, Target};
    use inlet::plugin::wit;

    let emulator = PubSubEmulator::start(PROJECT).await;
    emulator.create_topic("out").await;
    emulator.create_subscription("out", "out-sub", false).await;
    let proxy = TcpProxy::start(&emulator.host).await;
    let config = inlet::config::TargetConfig::Pubsub(inlet::config::PubsubTarget {
        topic: format!("projects/{PROJECT}/topics/out"),
        ordering_key: false,
        timeout: Duration::from_secs(2),
        attributes: Default::default(),
        id_attribute: None,
    });
    let target = Target::new("out", &config, &Clients::new(inlet::pubsub_client::Connection::emulator(&proxy.addr)));
    let request = |body: &str| wit::Request {
        method: "POST".into(),
        path: String::new(),
        headers: vec![],
        body: body.as_bytes().to_vec(),
    };
    let delivery = Delivery { idempotency_key: "e-1", correlation_key: "k" };

    proxy.set_up(false);
    let started = std::time::Instant::now();
    let outcome = target.deliver(&request("lost"), &delivery).await;
    let took = started.elapsed();
    assert!(matches!(outcome, wit::Outcome::TransportError(_)), "{outcome:?}");
    assert!(took < Duration::from_secs(10), "the publish gave up within its timeout (took {took:?})");
    proxy.set_up(true);
    // Long enough for a client that kept retrying in the background to get through:
    // this waits for something that must not happen, so there is no condition to poll.
    tokio::time::sleep(Duration::from_secs(10)).await; // waiting for what must not arrive
    let late = emulator.pull("out-sub").await;
    assert!(late.is_empty(), "a publish the target gave up on arrived later: {late:?}");

    let outcome = target.deliver(&request("kept"), &delivery).await;
    assert!(matches!(&outcome, wit::Outcome::Response(r) if r.status == 200), "{outcome:?}");
    let arrived = wait_for("the second publish", Duration::from_secs(30), || async {
        let m = emulator.pull("out-sub").await;
        (!m.is_empty()).then_some(m)
    })
    .await;
    let data: Vec<String> = arrived
        .iter()
        .map(|m| {
            let b64 = m["data"].as_str().unwrap_or_default();
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).unwrap()).unwrap()
        })
        .collect();
    assert_eq!(data, vec!["kept".to_string()]);
}
