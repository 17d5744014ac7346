//! Unwrapped push (`--push-no-wrapper`): the real Pub/Sub emulator pushes a message's
//! data as the request body, with its metadata and attributes as headers when the
//! subscription writes metadata; a route with `wrapper = false` stores what it sends,
//! and names a message without metadata by its body.

use std::time::Duration;

use base64::Engine as _;
use inlet::inbox::{Entry, ListFilter};
use inlet_testkit::emulator::PubSubEmulator;
use inlet_testkit::in_process::{Instance, start_on_sqlite};
use inlet_testkit::paths::plugin_path;
use inlet_testkit::wait::wait_for;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

fn routes() -> String {
    let plugin = plugin_path("work_order");
    format!(
        r#"
[[route]]
name = "meta"
plugin = "{plugin}"
source = {{ kind = "push", wrapper = false, attributes = ["eventType", "Tenant"] }}
target = {{ kind = "log" }}

[[route]]
name = "bare"
plugin = "{plugin}"
source = {{ kind = "push", wrapper = false }}
target = {{ kind = "log" }}

[[route]]
name = "wrapped"
plugin = "{plugin}"
source = {{ kind = "push" }}
target = {{ kind = "log" }}
"#,
        plugin = plugin.display()
    )
}

fn work_order(key: &str) -> Vec<u8> {
    format!(r#"{{"workOrderId":"{key}","completedItems":3,"completionTimestamp":"2026-08-01T10:00:00Z"}}"#).into_bytes()
}

async fn entries(inlet: &Instance, route: &str) -> Vec<Entry> {
    let filter = ListFilter { route: Some(route.into()), limit: 100, ..Default::default() };
    inlet.running.shared.store.list(&filter).await.expect("list entries")
}

/// Waits until `route` holds `n` entries; returns them, oldest first.
async fn wait_entries(inlet: &Instance, route: &str, n: usize) -> Vec<Entry> {
    wait_for(&format!("{n} entries on route {route}"), WAIT, || async {
        let found = entries(inlet, route).await;
        (found.len() == n).then_some(found)
    })
    .await
}

/// The value of one series of the exposition, 0 when it is not there.
fn counter(text: &str, series: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok())).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_pushes_unwrapped_messages_with_and_without_metadata() {
    let emulator = PubSubEmulator::start("unwrapped").await;
    let inlet = start_on_sqlite(&routes(), |_| {}).await;
    let http = reqwest::Client::new();
    emulator.create_topic("orders").await;
    for (subscription, route, wrapper) in
        [("sub-meta", "meta", Some(true)), ("sub-bare", "bare", Some(false)), ("sub-wrapped", "wrapped", None)]
    {
        let mut push_config = json!({ "pushEndpoint": format!("{}/push/{route}", inlet.base()) });
        if let Some(write_metadata) = wrapper {
            push_config["noWrapper"] = json!({ "writeMetadata": write_metadata });
        }
        let body = json!({
            "topic": emulator.topic_path("orders"),
            "ackDeadlineSeconds": 10,
            "pushConfig": push_config,
        });
        emulator.put_subscription(subscription, &body).await;
    }

    // The same data published twice, as two messages.
    let data = work_order("wo-1");
    let mut ids = Vec::new();
    for _ in 0..2 {
        let message = json!({
            "data": base64::engine::general_purpose::STANDARD.encode(&data),
            "attributes": { "eventType": "wo.done", "Tenant": "acme", "origin": "billing" },
            "orderingKey": "wo-1",
        });
        let r = http
            .post(format!("{}/topics/orders:publish", emulator.url()))
            .header("content-type", "application/json")
            .body(json!({ "messages": [message] }).to_string())
            .send()
            .await
            .expect("publish");
        let answer: serde_json::Value = serde_json::from_str(&r.text().await.expect("a publish answer")).unwrap();
        ids.push(answer["messageIds"][0].as_str().expect("a message id").to_string());
    }

    // With metadata: two messages, two entries, each with its id, publish time, the
    // listed attributes under the names the route writes and the ordering key — what
    // the wrapped subscription of the same topic stores of the same messages.
    let meta = wait_entries(&inlet, "meta", 2).await;
    let wrapped = wait_entries(&inlet, "wrapped", 2).await;
    let sorted = |e: &Entry| {
        let mut a = e.attributes.clone();
        a.sort();
        a
    };
    for e in &meta {
        let twin = wrapped.iter().find(|w| w.message_id == e.message_id).expect("the wrapped twin of a message");
        assert_eq!(e.raw_data, twin.raw_data, "same data as the wrapped form");
        assert_eq!(e.publish_time, twin.publish_time, "same publish time as the wrapped form");
        let mut listed = sorted(twin);
        listed.retain(|(k, _)| k != "origin");
        // The emulator's wrapped envelope leaves `orderingKey` out (Google's carries it);
        // its unwrapped form sends it as `x-goog-ordering-key`.
        let mut unwrapped = sorted(e);
        unwrapped.retain(|(k, _)| k != "ordering_key");
        assert_eq!(unwrapped, listed, "the listed attributes, as the wrapped form has them");
    }
    let mut stored_ids: Vec<_> = meta.iter().map(|e| e.message_id.clone()).collect();
    stored_ids.sort();
    let mut sent_ids = ids.clone();
    sent_ids.sort();
    assert_eq!(stored_ids, sent_ids, "each entry carries the id the emulator gave its message");
    for e in &meta {
        assert_eq!(e.raw_data, data, "the body is the message's data");
        let attributes: Vec<(&str, &str)> = e.attributes.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            attributes,
            vec![("eventType", "wo.done"), ("Tenant", "acme"), ("ordering_key", "wo-1")],
            "an attribute the route does not list (`origin`) is not stored"
        );
        assert!(e.publish_time.as_deref().is_some_and(|t| t.starts_with("20")), "publish time: {:?}", e.publish_time);
        assert_eq!(e.correlation_key.as_deref(), Some("wo-1"), "the plugin decoded the raw body");
    }

    // Without metadata: named by the body, so the second message is a duplicate.
    let bare = wait_entries(&inlet, "bare", 1).await;
    let expected = format!("body-sha256:{}", inlet::inbox::digest_hex(&data));
    assert_eq!(bare[0].message_id, expected);
    assert!(bare[0].attributes.is_empty(), "no metadata, no attributes: {:?}", bare[0].attributes);
    let metrics = &inlet.running.shared.metrics;
    wait_for("the second bare push counted as a duplicate", WAIT, || async {
        let text = metrics.render();
        (counter(&text, r#"inlet_ingested_total{route="bare",outcome="duplicate"}"#) >= 1.0).then_some(())
    })
    .await;
    assert_eq!(entries(&inlet, "bare").await.len(), 1, "the duplicate made no entry");
    inlet.running.stop().await;
}

#[tokio::test]
async fn an_unwrapped_route_takes_any_body_and_refuses_a_header_sent_twice() {
    let inlet = start_on_sqlite(&routes(), |_| {}).await;
    let http = reqwest::Client::new();
    let push = |route: &str, headers: &[(&str, &str)]| {
        let mut request = http
            .post(format!("{}/push/{route}", inlet.base()))
            .header("content-type", "application/octet-stream")
            .body(work_order("wo-2"));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send()
    };

    let r = push("wrapped", &[]).await.expect("push");
    assert_eq!(r.status(), 415, "a wrapped route still wants the JSON envelope");

    let r = push("meta", &[("x-goog-pubsub-message-id", "m-7"), ("tenant", "acme")]).await.expect("push");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let stored = wait_entries(&inlet, "meta", 1).await;
    assert_eq!(stored[0].message_id, "m-7");
    assert_eq!(stored[0].attributes, vec![("Tenant".to_string(), "acme".to_string())], "case as the route writes it");

    let r = push("meta", &[("x-goog-pubsub-message-id", "m-8"), ("tenant", "a"), ("tenant", "b")]).await.unwrap();
    assert_eq!(r.status(), 400);
    let answer: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(answer["reason"], "bad_envelope");
    assert!(answer["error"].as_str().unwrap().contains("header tenant` appears twice"), "{answer}");

    let latin1 = reqwest::header::HeaderValue::from_bytes(b"caf\xe9").expect("obs-text is a legal header value");
    let r = http
        .post(format!("{}/push/meta", inlet.base()))
        .header("x-goog-pubsub-message-id", "m-9")
        .header("tenant", latin1)
        .body(work_order("wo-3"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "an attribute header that is not UTF-8 is refused, not mangled");
    let answer: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert!(answer["error"].as_str().unwrap().contains("header tenant` is not UTF-8"), "{answer}");

    let r = push("meta", &[("x-goog-pubsub-message-id", " ")]).await.unwrap();
    assert_eq!(r.status(), 400, "an empty message id is refused, not stored");
    assert_eq!(entries(&inlet, "meta").await.len(), 1, "nothing stored for the refused pushes");
    inlet.running.stop().await;
}

#[tokio::test]
async fn a_route_keyed_by_the_ordering_key_stores_it_as_the_correlation_key() {
    let routes = format!(
        r#"
[[route]]
name = "keyed"
plugin = "{plugin}"
correlation_key = "ordering-key"
source = {{ kind = "push", wrapper = false }}
target = {{ kind = "log" }}
"#,
        plugin = plugin_path("hostile").display()
    );
    let inlet = start_on_sqlite(&routes, |_| {}).await;
    let http = reqwest::Client::new();
    // The hostile plugin answers the text before the first `:` as the correlation key.
    for (id, body) in [("m-1", ":no key of its own"), ("m-2", "k1:the same key"), ("m-3", "k2:another key")] {
        let r = http
            .post(format!("{}/push/keyed", inlet.base()))
            .header("x-goog-pubsub-message-id", id)
            .header("x-goog-ordering-key", "k1")
            .body(body)
            .send()
            .await
            .expect("push");
        assert_eq!(r.status(), 200, "{id}: {}", r.text().await.unwrap());
    }
    let stored = wait_entries(&inlet, "keyed", 3).await;
    let seen: Vec<(&str, Option<&str>, inlet::inbox::Status)> =
        stored.iter().map(|e| (e.message_id.as_str(), e.correlation_key.as_deref(), e.status)).collect();
    use inlet::inbox::Status::Parked;
    // The first two are delivered to the log target by now or soon; the third waits for a person.
    assert!(matches!(seen[0], ("m-1", Some("k1"), _)), "an empty key takes the ordering key: {seen:?}");
    assert!(matches!(seen[1], ("m-2", Some("k1"), _)), "the ordering key itself passes: {seen:?}");
    assert_eq!(seen[2].2, Parked, "another key is refused: {seen:?}");
    assert!(stored[2].last_error.as_deref().is_some_and(|e| e.contains("correlation-key.not-ordering-key")));
    assert!(seen[..2].iter().all(|s| s.2 != Parked), "{seen:?}");
    inlet.running.stop().await;
}
