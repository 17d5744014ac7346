//! A recording, idempotent HTTP target: [`RecordingTarget`], the engine of the chaos
//! test, which shows whether each idempotency key took effect once and in which order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::per_key::{HasKeysInFlight, InFlight, KeysInFlight, correlation_key};

/// One request received by [`RecordingTarget`].
#[derive(Clone, Debug)]
pub struct TargetRequest {
    /// The correlation key of the body (as [`Delivery::key`](crate::camunda::Delivery::key)).
    pub key: String,
    /// The request's path, as the plugin rendered it.
    pub path: String,
    /// The `Idempotency-Key` header (empty if there was none).
    pub idempotency_key: String,
    pub arrived: Instant,
    /// What it was answered: 204 took effect, 200 a replay of an effect already taken,
    /// 422 a scripted refusal.
    pub status: u16,
}

#[derive(Default)]
struct TargetState {
    requests: Vec<TargetRequest>,
    /// Idempotency keys whose effect was taken, per correlation key, in effect order.
    effects: HashMap<String, Vec<String>>,
    taken: std::collections::HashSet<String>,
    /// Idempotency key → refusals (422) still to answer before it may take effect.
    refusals: HashMap<String, usize>,
    keys: KeysInFlight,
    /// Response delay: uniform in [min, max] ms, after the effect is taken.
    delay_ms: (u64, u64),
}

/// A real HTTP server on 127.0.0.1 that plays an idempotent engine for the chaos test:
/// every `POST` (any path) with a JSON body naming a correlation key (Camunda's
/// `correlationKeys` shape, as the work-order plugin renders it) is recorded; the first
/// request of an `Idempotency-Key` takes effect (204) and later ones are replays (200,
/// no effect), so *each key took effect once* is what the recording shows, and the
/// effect order per correlation key is the order the engine acted in. Keys given to
/// [`refuse`](Self::refuse) are answered 422 (a permanent refusal: the plugin parks)
/// that many times first. Watches per-key concurrency like [`FakeCamunda`](crate::camunda::FakeCamunda). It can be
/// made slow ([`set_delay`](Self::set_delay)); to make it unreachable, put a
/// [`TcpProxy`](crate::proxy::TcpProxy) in front.
pub struct RecordingTarget {
    addr: std::net::SocketAddr,
    state: Arc<Mutex<TargetState>>,
    server: tokio::task::JoinHandle<()>,
}

impl RecordingTarget {
    pub async fn start() -> RecordingTarget {
        let state: Arc<Mutex<TargetState>> = Arc::default();
        let app = axum::Router::new().fallback(axum::routing::post(record)).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the recording target");
        let addr = listener.local_addr().expect("recording target address");
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("recording target server");
        });
        RecordingTarget { addr, state, server }
    }

    /// `127.0.0.1:PORT`
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Answer `idempotency_key` with 422 the next `times` times it arrives.
    pub fn refuse(&self, idempotency_key: &str, times: usize) {
        self.lock().refusals.insert(idempotency_key.to_owned(), times);
    }

    /// Delays every answer by a uniform random time in `[min, max]` from now on
    /// (`ZERO, ZERO` for none).
    pub fn set_delay(&self, min: Duration, max: Duration) {
        self.lock().delay_ms = (min.as_millis() as u64, max.as_millis().max(min.as_millis()) as u64);
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<TargetRequest> {
        self.lock().requests.clone()
    }

    /// Idempotency keys that took effect, per correlation key, in effect order.
    pub fn effects(&self) -> HashMap<String, Vec<String>> {
        self.lock().effects.clone()
    }

    /// The most requests ever in flight at once for one correlation key.
    pub fn max_in_flight_per_key(&self) -> usize {
        self.lock().keys.max
    }

    /// Correlation keys that had a second request arrive while one was in flight.
    pub fn overlaps(&self) -> Vec<String> {
        self.lock().keys.overlaps.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TargetState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for RecordingTarget {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl HasKeysInFlight for TargetState {
    fn keys(&mut self) -> &mut KeysInFlight {
        &mut self.keys
    }
}

async fn record(
    State(state): State<Arc<Mutex<TargetState>>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    let key = correlation_key(&body);
    let idempotency_key =
        headers.get("idempotency-key").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()).unwrap_or_default();
    let (status, delay, _guard) = {
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        let guard = InFlight::enter(&state, &mut st, &key);
        let refused = st.refusals.get_mut(&idempotency_key).is_some_and(|left| {
            let refuse = *left > 0;
            *left = left.saturating_sub(1);
            refuse
        });
        let status = if refused {
            422
        } else if st.taken.contains(&idempotency_key) {
            200
        } else {
            st.taken.insert(idempotency_key.clone());
            st.effects.entry(key.clone()).or_default().push(idempotency_key.clone());
            204
        };
        let path = uri.path().to_string();
        st.requests.push(TargetRequest { key, path, idempotency_key, arrived: Instant::now(), status });
        let (min, max) = st.delay_ms;
        let delay = if max > 0 { Duration::from_millis(fastrand::u64(min..=max)) } else { Duration::ZERO };
        (status, delay, guard)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    match status {
        422 => (
            StatusCode::UNPROCESSABLE_ENTITY,
            [(header::CONTENT_TYPE, "application/json")],
            r#"{"type":"RestException","message":"recording target: refused on purpose (chaos scenario)"}"#,
        )
            .into_response(),
        code => StatusCode::from_u16(code).expect("valid status").into_response(),
    }
}
