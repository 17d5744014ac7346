//! Pub/Sub push: `POST /push/<route>` with the push envelope. A 2xx answer is the
//! ack, so it is sent only after the row is committed; 503 when the inbox is
//! unreachable (Pub/Sub redelivers); 503 too for a route that is refused (its plugin or
//! settings do not load), so its messages wait in Pub/Sub until it is fixed; 404 for a
//! route no routing file names; 400 for a body that is not a push envelope.
//!
//! [`limit`] stands in front of the handler and protects the process: at most
//! `max_concurrent_pushes` requests at once (one more is shed with 503 and
//! `Retry-After` before its body is read), bodies up to `max_body_mib` (413), and one
//! deadline for the whole request (408 while the body is still arriving, 503 after).
//! None of these answers is an ack, so Pub/Sub redelivers and nothing is lost.
//!
//! 404 for a route that is not a push route (a pull route takes no pushes). A
//! route with push auth checks the OIDC token first ([`super::push_auth`]): no
//! row is written for a refused request.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::app::Shared;
use crate::config::{PushAuth, ServerConfig, SourceConfig};
use crate::inbox::InsertOutcome;
use crate::ingest::{Accepted, Incoming, IngestError, Stored};
use crate::telemetry::RouteReason;

/// Seconds a shed or timed-out push is told to wait (`Retry-After`). Pub/Sub applies
/// its own backoff; other senders get a hint that the pressure is brief.
const RETRY_AFTER_SECS: &str = "1";

/// The push envelope. Google sends camelCase; the emulator sends both camelCase and
/// snake_case twins and omits `deliveryAttempt`, so both spellings are accepted.
#[derive(Debug, Deserialize)]
pub struct PushEnvelope {
    pub message: PushMessage,
    #[serde(default)]
    pub subscription: Option<String>,
    #[serde(default, rename = "deliveryAttempt")]
    pub delivery_attempt: Option<u32>,
    #[serde(default, rename = "delivery_attempt")]
    pub delivery_attempt_snake: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub struct PushMessage {
    /// Base64; absent for an empty payload.
    #[serde(default)]
    pub data: Option<String>,
    #[serde(default)]
    pub attributes: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "messageId")]
    pub message_id_camel: Option<String>,
    #[serde(default)]
    pub message_id: Option<String>,
    #[serde(default, rename = "publishTime")]
    pub publish_time_camel: Option<String>,
    #[serde(default)]
    pub publish_time: Option<String>,
}

impl PushEnvelope {
    /// The message in Inlet's terms, or why the envelope is unusable.
    pub fn into_incoming(self) -> Result<Incoming, String> {
        let m = self.message;
        let message_id = m
            .message_id_camel
            .or(m.message_id)
            .filter(|id| !id.is_empty())
            .ok_or("push envelope has no message.messageId")?;
        let data = match m.data.as_deref() {
            None | Some("") => Vec::new(),
            Some(b64) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| format!("message.data is not base64: {e}"))?,
        };
        Ok(Incoming {
            data,
            attributes: m.attributes.unwrap_or_default().into_iter().collect(),
            message_id,
            publish_time: m.publish_time_camel.or(m.publish_time),
            delivery_attempt: self.delivery_attempt.or(self.delivery_attempt_snake),
        })
    }
}

/// The answer to an accepted push (200): the entry that holds the message and what
/// became of it; `conflict_of` names the entry whose dedup key a conflicting payload
/// reused.
#[derive(Debug, serde::Serialize)]
pub struct PushAnswer {
    pub entry: i64,
    pub outcome: Stored,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conflict_of: Option<i64>,
}

impl From<Accepted> for PushAnswer {
    fn from(a: Accepted) -> PushAnswer {
        let conflict_of = match a.outcome {
            InsertOutcome::Conflict { existing, .. } => Some(existing),
            _ => None,
        };
        PushAnswer { entry: a.outcome.id(), outcome: a.stored, conflict_of }
    }
}

/// A push that was not acked: `{"error": "…", "reason": "…"}`, the reason one of a
/// fixed set (API.md lists them; the listener's and push auth's are also the labels
/// of their metrics). Pub/Sub redelivers every one of them.
#[derive(Debug)]
pub struct PushError {
    pub status: StatusCode,
    pub reason: &'static str,
    pub error: String,
}

impl PushError {
    fn new(status: StatusCode, reason: &'static str, error: impl Into<String>) -> PushError {
        PushError { status, reason, error: error.into() }
    }
}

impl IntoResponse for PushError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.error, "reason": self.reason }))).into_response()
    }
}

pub async fn handle(
    State(shared): State<Arc<Shared>>,
    Path(route): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<PushAnswer>, PushError> {
    let routes = shared.routes();
    let Some(found) = routes.get(&route) else {
        // A refused route answers 503, so Pub/Sub redelivers once it is fixed.
        if let Some(p) = routes.refusal(&route) {
            let error = format!("route `{route}` is refused: {}", p.error);
            return Err(PushError::new(StatusCode::SERVICE_UNAVAILABLE, "route_refused", error));
        }
        return Err(PushError::new(StatusCode::NOT_FOUND, "no_route", format!("no route named `{route}`")));
    };
    // A pull route takes no pushes.
    let Some(route) = Some(found).filter(|r| matches!(r.config.source, SourceConfig::Push)) else {
        return Err(PushError::new(StatusCode::NOT_FOUND, "no_route", format!("no push route named `{route}`")));
    };
    if let Some(PushAuth::Oidc(rule)) = &route.config.push_auth
        && let Err(refused) = shared.push_verifier.verify(&headers, rule).await
    {
        let label = RouteReason { route: route.name().to_string(), reason: refused.as_str() };
        shared.metrics.push_auth_refused.get_or_create(&label).inc();
        tracing::warn!(route = route.name(), reason = refused.as_str(), "push request refused by push auth");
        let error = format!("push auth: {}", refused.as_str());
        return Err(PushError::new(refused.status(), refused.as_str(), error));
    }
    let incoming = match serde_json::from_slice::<PushEnvelope>(&body)
        .map_err(|e| format!("body is not a push envelope: {e}"))
        .and_then(PushEnvelope::into_incoming)
    {
        Ok(i) => i,
        Err(error) => {
            tracing::warn!(route = route.name(), %error, "rejected a push request");
            return Err(PushError::new(StatusCode::BAD_REQUEST, "bad_envelope", error));
        }
    };
    match shared.ingest.accept(route, incoming).await {
        Ok(accepted) => Ok(Json(accepted.into())),
        Err(error) => {
            let reason = match error {
                IngestError::Store(_) => "store_unavailable",
                IngestError::PluginBusy(_) => "plugin_busy",
            };
            Err(PushError::new(StatusCode::SERVICE_UNAVAILABLE, reason, error.to_string()))
        }
    }
}

/// The listener's limits for `/push`, shared by every push request (the state of
/// [`limit`]).
#[derive(Clone)]
pub struct Limits {
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    max_in_flight: usize,
    max_body: usize,
    timeout: Duration,
}

impl Limits {
    pub fn new(shared: Arc<Shared>, server: &ServerConfig) -> Limits {
        Limits {
            shared,
            permits: Arc::new(Semaphore::new(server.max_concurrent_pushes)),
            max_in_flight: server.max_concurrent_pushes,
            max_body: server.max_body_bytes,
            timeout: server.request_timeout,
        }
    }

    /// Counts a refused request and builds its answer.
    fn reject(&self, route: &str, reason: Rejection) -> Response {
        // Only names of configured routes become labels: the path is the sender's.
        let known = self.shared.routes().get(route).is_some();
        let label = RouteReason { route: if known { route } else { "-" }.to_string(), reason: reason.label() };
        self.shared.metrics.push_rejected.get_or_create(&label).inc();
        tracing::warn!(route, reason = reason.label(), "refused a push request: {}", reason.message(self));
        let mut response = PushError::new(reason.status(), reason.label(), reason.message(self)).into_response();
        if reason.status() == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECS));
        }
        if matches!(reason, Rejection::TooLarge | Rejection::BodyTimeout) {
            // The rest of the body is not read: the connection cannot carry another request.
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// Why [`limit`] refused a push request.
#[derive(Debug, Clone, Copy)]
enum Rejection {
    Shed,
    TooLarge,
    BodyTimeout,
    Timeout,
}

impl Rejection {
    fn label(self) -> &'static str {
        match self {
            Rejection::Shed => "shed",
            Rejection::TooLarge => "too_large",
            Rejection::BodyTimeout => "body_timeout",
            Rejection::Timeout => "timeout",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            Rejection::Shed | Rejection::Timeout => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
        }
    }

    fn message(self, limits: &Limits) -> String {
        match self {
            Rejection::Shed => format!(
                "too many push requests in flight (max_concurrent_pushes = {}); retry later",
                limits.max_in_flight
            ),
            Rejection::TooLarge => format!("the body is larger than max_body_mib ({} bytes)", limits.max_body),
            Rejection::BodyTimeout => {
                format!(
                    "the body did not arrive within request_timeout ({})",
                    humantime::format_duration(limits.timeout)
                )
            }
            Rejection::Timeout => format!(
                "the request did not finish within request_timeout ({}); nothing was acked",
                humantime::format_duration(limits.timeout)
            ),
        }
    }
}

/// Holds one of `max_concurrent_pushes` permits and shows it in `inlet_push_in_flight`.
struct InFlight<'a> {
    gauge: &'a prometheus_client::metrics::gauge::Gauge,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// Middleware in front of [`handle`]: sheds, bounds the body and the time (see the
/// module doc). The body is read here, so the handler gets it whole.
pub async fn limit(State(limits): State<Limits>, Path(route): Path<String>, request: Request, next: Next) -> Response {
    let Ok(permit) = Arc::clone(&limits.permits).try_acquire_owned() else {
        return limits.reject(&route, Rejection::Shed);
    };
    limits.shared.metrics.push_in_flight.inc();
    let _in_flight = InFlight { gauge: &limits.shared.metrics.push_in_flight, _permit: permit };
    let deadline = Instant::now() + limits.timeout;

    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body as u64) {
        return limits.reject(&route, Rejection::TooLarge);
    }
    let (parts, body) = request.into_parts();
    let bytes = match tokio::time::timeout_at(deadline, Limited::new(body, limits.max_body).collect()).await {
        Err(_) => return limits.reject(&route, Rejection::BodyTimeout),
        Ok(Err(e)) if e.is::<LengthLimitError>() => return limits.reject(&route, Rejection::TooLarge),
        Ok(Err(e)) => {
            tracing::warn!(route, error = %e, "a push request's body broke off");
            let error = format!("cannot read the body: {e}");
            return PushError::new(StatusCode::BAD_REQUEST, "unreadable_body", error).into_response();
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    let request = Request::from_parts(parts, Body::from(bytes));
    match tokio::time::timeout_at(deadline, next.run(request)).await {
        Ok(response) => response,
        Err(_) => limits.reject(&route, Rejection::Timeout),
    }
}
