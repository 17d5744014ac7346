//! The Flowable plugin's two-step exchange (query the waiting execution, trigger the
//! one found) run by the real host against a real HTTP server answering like
//! Flowable's REST API.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{post, put};
use inlet::clock::{Clock, ManualClock};
use inlet::inbox::{Entry, ListFilter, Status};
use inlet_testkit::in_process::start_on_sqlite;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::push::push_envelope;
use inlet_testkit::wait::wait_for;
use serde_json::{Value, json};

#[derive(Default)]
struct Flowable {
    /// Executions waiting for the message, by workOrderId.
    waiting: HashMap<String, Vec<String>>,
    /// Ids a query reports but that are already gone (moved on in between).
    vanished: HashMap<String, String>,
    queries: Vec<String>,
    triggers: Vec<(String, Value)>,
    next_id: u32,
}

type Shared = Arc<Mutex<Flowable>>;

async fn query(State(s): State<Shared>, Json(body): Json<Value>) -> Json<Value> {
    let mut f = s.lock().unwrap();
    assert_eq!(body["messageEventSubscriptionName"], "WorkOrderCompleted");
    let key = body["processInstanceVariables"][0]["value"].as_str().unwrap().to_string();
    f.queries.push(key.clone());
    let mut ids = f.waiting.get(&key).cloned().unwrap_or_default();
    ids.extend(f.vanished.get(&key).cloned());
    let data: Vec<Value> = ids
        .iter()
        .map(|id| json!({ "id": id, "processInstanceId": format!("p{id}"), "activityId": "waitForWorkOrder" }))
        .collect();
    Json(
        json!({ "data": data, "total": ids.len(), "start": 0, "sort": "processInstanceId", "order": "asc", "size": ids.len() }),
    )
}

async fn trigger(
    State(s): State<Shared>,
    Path(id): Path<String>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let mut f = s.lock().unwrap();
    let owner = f.waiting.iter().find(|(_, ids)| ids.contains(&id)).map(|(k, _)| k.clone());
    match owner {
        Some(key) if body["action"] == "messageEventReceived" => {
            f.waiting.get_mut(&key).unwrap().retain(|i| *i != id);
            f.triggers.push((id.clone(), body));
            (StatusCode::OK, Json(json!({ "id": id, "activityId": "afterWorkOrder" })))
        }
        _ => (
            StatusCode::NOT_FOUND,
            Json(
                json!({ "message": "Not found", "exception": format!("Could not find an execution with id '{id}'.") }),
            ),
        ),
    }
}

impl Flowable {
    fn add_waiting(&mut self, key: &str) {
        self.next_id += 1;
        let id = format!("{}", 2500 + self.next_id);
        self.waiting.entry(key.into()).or_default().push(id);
    }
}

async fn entry_for(store: &Arc<dyn inlet::inbox::Store>, key: &str, settled_after: i32) -> Entry {
    wait_for(&format!("{key} attempt {} settled", settled_after + 1), Duration::from_secs(30), || async {
        let all = store
            .list(&ListFilter { correlation_key: Some(key.into()), limit: 10, ..Default::default() })
            .await
            .unwrap();
        all.into_iter().next().filter(|e| e.attempts > settled_after && e.status != Status::InProgress)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_executions_is_not_yet_one_is_triggered_two_are_parked() {
    let state: Shared = Arc::default();
    {
        let mut f = state.lock().unwrap();
        f.add_waiting("one");
        f.add_waiting("two");
        f.add_waiting("two");
        f.vanished.insert("gone".into(), "9999".into());
    }
    let app = axum::Router::new()
        .route("/flowable-rest/service/query/executions", post(query))
        .route("/flowable-rest/service/runtime/executions/{id}", put(trigger))
        .with_state(Arc::clone(&state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let routes = format!(
        "[[route]]\nname = \"flowable\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"http\", url = \"{url}\", timeout = \"2s\" }}\nmax_steps = 2\n",
        plugin_path("flowable").display()
    );
    let clock = ManualClock::new(1_800_000_000_000);
    let inlet = start_on_sqlite(&routes, |o| o.clock = Some(Arc::clone(&clock) as Arc<dyn Clock>)).await;
    let running = &inlet.running;
    let http = reqwest::Client::new();
    for key in ["zero", "one", "two", "gone"] {
        let data =
            format!(r#"{{"workOrderId":"{key}","completedItems":7,"completionTimestamp":"2026-08-01T10:00:00Z"}}"#);
        let res = http
            .post(format!("http://{}/push/flowable", running.addr))
            .header("content-type", "application/json")
            .body(push_envelope(data.as_bytes(), &[], &format!("m-{key}")).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 200);
    }
    let store = Arc::clone(&running.shared.store);

    let one = entry_for(&store, "one", 0).await;
    assert_eq!((one.status, one.attempts), (Status::Done, 1), "one execution: triggered in one attempt");
    let two = entry_for(&store, "two", 0).await;
    assert_eq!(two.status, Status::Parked, "two executions: parked at once");
    assert!(two.last_error.as_deref().unwrap().contains("2 executions wait"), "{:?}", two.last_error);
    let gone = entry_for(&store, "gone", 0).await;
    assert_eq!(gone.status, Status::Parked, "execution gone between query and trigger");
    assert!(gone.last_error.as_deref().unwrap().contains("step 2: target answered 404"), "{:?}", gone.last_error);
    let zero = entry_for(&store, "zero", 0).await;
    assert_eq!(zero.status, Status::Open, "zero executions: not yet");
    assert!(zero.last_error.as_deref().unwrap().starts_with("not yet: no execution waits"), "{:?}", zero.last_error);

    {
        let f = state.lock().unwrap();
        assert_eq!(f.triggers.len(), 1, "only the single match was triggered");
        let (id, body) = &f.triggers[0];
        assert_eq!(id, "2501");
        assert_eq!(body["messageName"], "WorkOrderCompleted");
        assert_eq!(body["variables"][0], json!({ "name": "completedItems", "value": 7, "type": "integer" }));
    }

    // The process reaches its catch event; the next attempt finds it and triggers it.
    state.lock().unwrap().add_waiting("zero");
    clock.set(zero.next_attempt_at);
    let zero = entry_for(&store, "zero", 1).await;
    assert_eq!((zero.status, zero.attempts), (Status::Done, 2));
    assert_eq!(state.lock().unwrap().triggers.len(), 2);
    assert_eq!(state.lock().unwrap().queries.iter().filter(|k| *k == "zero").count(), 2);

    inlet.running.stop().await;
    server.abort();
}
