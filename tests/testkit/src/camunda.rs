//! A fake Camunda 7: [`FakeCamunda`], a real HTTP server playing the message
//! correlation endpoint, answering as a test scripts it and recording every request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::per_key::{HasKeysInFlight, InFlight, KeysInFlight, correlation_key};

/// What [`FakeCamunda`] answers to one `POST /engine-rest/message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// 204 No Content: correlated.
    Ok,
    /// 400: no process definition or execution matches (not there yet, or finished).
    NoMatch,
    /// 400: more than one execution matches the correlation keys.
    SeveralMatch,
    /// Any status with a small JSON error body (e.g. 500, 503).
    Status(u16),
}

impl Reply {
    /// The HTTP status this reply is sent with.
    pub fn status(&self) -> u16 {
        match self {
            Reply::Ok => 204,
            Reply::NoMatch | Reply::SeveralMatch => 400,
            Reply::Status(code) => *code,
        }
    }

    fn into_response(self, message_name: &str) -> Response {
        let json = |status: u16, body: serde_json::Value| {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
        };
        match self {
            Reply::Ok => StatusCode::NO_CONTENT.into_response(),
            Reply::NoMatch => json(
                400,
                serde_json::json!({
                    "type": "RestException",
                    "message": format!(
                        "Cannot correlate message '{message_name}': No process definition or execution matches the parameters"
                    ),
                }),
            ),
            Reply::SeveralMatch => json(
                400,
                serde_json::json!({
                    "type": "RestException",
                    "message": format!(
                        "Cannot correlate a message with name '{message_name}' to a single execution. 2 executions match the correlation keys: CorrelationSet [businessKey=null, processInstanceId=null, processDefinitionId=null, correlationKeys=null, localCorrelationKeys=null, tenantId=null, isTenantIdSet=false, isExecutionsOnly=false]"
                    ),
                }),
            ),
            Reply::Status(code) => json(
                code,
                serde_json::json!({
                    "type": "ProcessEngineException",
                    "message": format!("fake camunda: scripted failure with status {code}"),
                }),
            ),
        }
    }
}

/// Decides the reply from the correlation key and the 1-based attempt number for that key.
pub type Behaviour = Arc<dyn Fn(&str, usize) -> Reply + Send + Sync>;

/// One request received by [`FakeCamunda`].
#[derive(Clone, Debug)]
pub struct Delivery {
    /// The correlation key: the value of the single entry of `correlationKeys` (strings
    /// as-is, other JSON values printed); several entries are joined as sorted
    /// `name=value` pairs with `&`; empty if there is none.
    pub key: String,
    /// `processVariables.completedItems.value`, or -1 if absent.
    pub seq: i64,
    /// The `Idempotency-Key` header.
    pub idempotency_key: Option<String>,
    /// When the request arrived.
    pub at: Instant,
    /// The request body (`Value::String` of the raw text if it was not JSON).
    pub body: serde_json::Value,
    /// 1-based attempt number for this key (what the behaviour was called with).
    pub attempt: usize,
    /// The status code it was answered with (0 for the instant while the behaviour is
    /// still deciding).
    pub status: u16,
    /// Request headers, names lowercased.
    pub headers: HashMap<String, String>,
}

struct CamundaState {
    behaviour: Behaviour,
    delay: Option<Duration>,
    deliveries: Vec<Delivery>,
    attempts: HashMap<String, usize>,
    keys: KeysInFlight,
}

impl HasKeysInFlight for CamundaState {
    fn keys(&mut self) -> &mut KeysInFlight {
        &mut self.keys
    }
}

type Shared = Arc<Mutex<CamundaState>>;

/// A real HTTP server on 127.0.0.1 playing Camunda 7's `POST /engine-rest/message`.
///
/// Records every request in arrival order, answers as scripted by a [`Behaviour`], and
/// watches per-key concurrency: two requests for one key in flight at once is recorded
/// (see [`FakeCamunda::max_in_flight_per_key`]). The server stops when this is dropped.
pub struct FakeCamunda {
    addr: std::net::SocketAddr,
    state: Shared,
    server: tokio::task::JoinHandle<()>,
}

impl FakeCamunda {
    /// Starts a fake that correlates everything (`Reply::Ok`).
    pub async fn start() -> FakeCamunda {
        Self::with_behaviour(|_, _| Reply::Ok).await
    }

    /// Starts a fake answering as `behaviour(key, attempt)` says.
    pub async fn with_behaviour<F>(behaviour: F) -> FakeCamunda
    where
        F: Fn(&str, usize) -> Reply + Send + Sync + 'static,
    {
        let state: Shared = Arc::new(Mutex::new(CamundaState {
            behaviour: Arc::new(behaviour),
            delay: None,
            deliveries: Vec::new(),
            attempts: HashMap::new(),
            keys: KeysInFlight::default(),
        }));
        let app =
            axum::Router::new().route("/engine-rest/message", axum::routing::post(correlate)).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind fake camunda");
        let addr = listener.local_addr().expect("fake camunda address");
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("fake camunda server");
        });
        FakeCamunda { addr, state, server }
    }

    /// Delays every response by `delay` (after recording), to make overlaps likely.
    pub fn with_delay(self, delay: Duration) -> FakeCamunda {
        self.set_delay(Some(delay));
        self
    }

    /// Changes the response delay from now on.
    pub fn set_delay(&self, delay: Option<Duration>) {
        self.lock().delay = delay;
    }

    /// Replaces the behaviour from now on (attempt counters are kept).
    pub fn set_behaviour<F>(&self, behaviour: F)
    where
        F: Fn(&str, usize) -> Reply + Send + Sync + 'static,
    {
        self.lock().behaviour = Arc::new(behaviour);
    }

    /// Base URL, e.g. `http://127.0.0.1:PORT` (Camunda's REST API is under `/engine-rest`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Full URL of the message endpoint.
    pub fn message_url(&self) -> String {
        format!("{}/engine-rest/message", self.url())
    }

    /// Every request so far, in arrival order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.lock().deliveries.clone()
    }

    /// The requests for one correlation key, in arrival order.
    pub fn deliveries_for(&self, key: &str) -> Vec<Delivery> {
        self.lock().deliveries.iter().filter(|d| d.key == key).cloned().collect()
    }

    /// Number of requests so far.
    pub fn count(&self) -> usize {
        self.lock().deliveries.len()
    }

    /// The `seq` (completedItems) of the requests for `key` that were answered 2xx, in
    /// arrival order.
    pub fn correlated_seqs(&self, key: &str) -> Vec<i64> {
        self.lock()
            .deliveries
            .iter()
            .filter(|d| d.key == key && (200..300).contains(&d.status))
            .map(|d| d.seq)
            .collect()
    }

    /// The most requests ever in flight at once for one key (1 means per-key order held;
    /// 0 means no request yet).
    pub fn max_in_flight_per_key(&self) -> usize {
        self.lock().keys.max
    }

    /// The most requests ever in flight at once, across keys (a route's concurrency
    /// bounds it).
    pub fn max_in_flight(&self) -> usize {
        self.lock().keys.all_max
    }

    /// Keys that had a second request arrive while one was in flight (one per overlap).
    pub fn overlaps(&self) -> Vec<String> {
        self.lock().keys.overlaps.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CamundaState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for FakeCamunda {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn correlate(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let at = Instant::now();
    let body: serde_json::Value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&body).into_owned()));
    let key = correlation_key(&body);
    let seq = body
        .pointer("/processVariables/completedItems/value")
        .and_then(|v| v.as_i64().or_else(|| v.as_str().and_then(|s| s.parse().ok())))
        .unwrap_or(-1);
    let message_name = body.get("messageName").and_then(|v| v.as_str()).unwrap_or("").to_owned();
    let header_map: HashMap<String, String> = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let idempotency_key = header_map.get("idempotency-key").cloned();
    let json_content = header_map
        .get("content-type")
        .is_some_and(|ct| ct.trim_start().to_ascii_lowercase().starts_with("application/json"));

    let (reply, delay, index, _guard) = {
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        let guard = InFlight::enter(&state, &mut st, &key);

        let attempt = {
            let n = st.attempts.entry(key.clone()).or_insert(0);
            *n += 1;
            *n
        };
        // Camunda rejects anything but JSON (415) and bodies without a message name (400)
        // before correlating; those do not reach the behaviour.
        let reply = if !json_content {
            Err((415, "fake camunda: Content-Type must be application/json"))
        } else if message_name.is_empty() {
            Err((400, "fake camunda: body is not a JSON object with a messageName"))
        } else {
            Ok((st.behaviour.clone(), attempt))
        };
        let status = match &reply {
            Err((code, _)) => *code,
            Ok(_) => 0, // filled in below, outside the lock
        };
        let index = st.deliveries.len();
        st.deliveries.push(Delivery {
            key: key.clone(),
            seq,
            idempotency_key,
            at,
            body: body.clone(),
            attempt,
            status,
            headers: header_map,
        });
        (reply, st.delay, index, guard)
    };

    let response = match reply {
        Err((code, message)) => {
            let status = StatusCode::from_u16(code).expect("valid status");
            let body = serde_json::json!({ "type": "InvalidRequestException", "message": message });
            (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
        }
        Ok((behaviour, attempt)) => {
            // Call the behaviour outside the lock: it may itself inspect the fake.
            let reply = behaviour(&key, attempt);
            {
                let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                st.deliveries[index].status = reply.status();
            }
            reply.into_response(&message_name)
        }
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    response
}
