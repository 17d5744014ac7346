//! The Camunda 8 plugin against a real HTTP server answering like the Orchestration
//! Cluster REST API: a publication whose answer was lost is retried, Zeebe refuses
//! the second one by `messageId` (409), and the entry ends DONE with one message
//! published.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use inlet::inbox::{ListFilter, Status};
use inlet_testkit::in_process::start_on_sqlite;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::push::push_envelope;
use inlet_testkit::wait::wait_for;
use serde_json::{Value, json};

#[derive(Default)]
struct Zeebe {
    /// Published messages by messageId.
    published: HashMap<String, Value>,
    requests: usize,
}

type Shared = Arc<Mutex<Zeebe>>;

async fn publish(State(s): State<Shared>, Json(body): Json<Value>) -> (StatusCode, Json<Value>) {
    let mut z = s.lock().unwrap();
    z.requests += 1;
    let id = body["messageId"].as_str().unwrap_or_default().to_string();
    if body["name"].as_str().unwrap_or_default().is_empty() {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({ "title": "INVALID_ARGUMENT", "status": 400, "detail": "No name provided." })),
        );
    }
    if z.published.contains_key(&id) {
        let detail = format!(
            "Expected to publish a new message with id '{id}', but a message with that id was already published"
        );
        return (StatusCode::CONFLICT, Json(json!({ "title": "ALREADY_EXISTS", "status": 409, "detail": detail })));
    }
    z.published.insert(id, body);
    if z.requests == 1 {
        // Published, but the answer never makes it back (a gateway timeout, say).
        return (StatusCode::GATEWAY_TIMEOUT, Json(json!({ "title": "DEADLINE_EXCEEDED", "status": 504 })));
    }
    (StatusCode::OK, Json(json!({ "messageKey": "2251799813685249", "tenantId": "<default>" })))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_retried_and_zeebe_deduplicates_by_message_id() {
    let state: Shared = Arc::default();
    let app = axum::Router::new().route("/v2/messages/publication", post(publish)).with_state(Arc::clone(&state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let routes = format!(
        "[[route]]\nname = \"zeebe\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"http\", url = \"{url}\", timeout = \"2s\" }}\nretry = {{ initial = \"20ms\", max = \"50ms\" }}\n",
        plugin_path("camunda8").display()
    );
    let inlet = start_on_sqlite(&routes, |_| {}).await;
    let running = &inlet.running;
    let data = br#"{"workOrderId":"4711","completedItems":3,"completionTimestamp":"2026-08-01T10:00:00Z"}"#;
    let res = reqwest::Client::new()
        .post(format!("http://{}/push/zeebe", running.addr))
        .header("content-type", "application/json")
        .body(push_envelope(data, &[("eventId", "evt-42")], "m-1").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);

    let store = Arc::clone(&running.shared.store);
    let entry = wait_for("the entry to finish", Duration::from_secs(30), || async {
        let all =
            store.list(&ListFilter { route: Some("zeebe".into()), limit: 10, ..Default::default() }).await.unwrap();
        all.into_iter().next().filter(|e| e.status == Status::Done)
    })
    .await;
    assert_eq!(entry.attempts, 2, "the lost answer cost one retry");
    {
        let z = state.lock().unwrap();
        assert_eq!(z.requests, 2);
        assert_eq!(z.published.len(), 1, "published once");
        let message = &z.published["evt-42"];
        assert_eq!(message["correlationKey"], "4711");
        assert_eq!(message["name"], "WorkOrderCompleted");
        assert_eq!(message["timeToLive"], 3_600_000);
        assert_eq!(message["variables"]["completedItems"], 3);
    }
    inlet.running.stop().await;
    server.abort();
}
