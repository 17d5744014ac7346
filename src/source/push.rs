//! Pub/Sub push: `POST /push/<route>` with the push envelope. A 2xx answer is the
//! ack, so it is sent only after the row is committed; 503 when the inbox is
//! unreachable (Pub/Sub redelivers); 400 for a body that is not a push envelope.
//! 404 for a route that is not a push route (a pull route takes no pushes). A
//! route with push auth checks the OIDC token first ([`super::push_auth`]): no
//! row is written for a refused request.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;

use crate::app::Shared;
use crate::config::{PushAuth, SourceConfig};
use crate::ingest::Incoming;
use crate::telemetry::RouteReason;

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

pub async fn handle(
    State(shared): State<Arc<Shared>>,
    Path(route): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Json<serde_json::Value>) {
    let routes = shared.routes();
    let Some(route) = routes.get(&route).filter(|r| matches!(r.config.source, SourceConfig::Push)) else {
        return (StatusCode::NOT_FOUND, Json(json!({ "error": format!("no push route named `{route}`") })));
    };
    if let Some(PushAuth::Oidc(rule)) = &route.config.push_auth
        && let Err(refused) = shared.push_verifier.verify(&headers, rule).await
    {
        let label = RouteReason { route: route.name().to_string(), reason: refused.as_str() };
        shared.metrics.push_auth_refused.get_or_create(&label).inc();
        tracing::warn!(route = route.name(), reason = refused.as_str(), "push request refused by push auth");
        let error = format!("push auth: {}", refused.as_str());
        return (refused.status(), Json(json!({ "error": error })));
    }
    let incoming = match serde_json::from_slice::<PushEnvelope>(&body)
        .map_err(|e| format!("body is not a push envelope: {e}"))
        .and_then(PushEnvelope::into_incoming)
    {
        Ok(i) => i,
        Err(error) => {
            tracing::warn!(route = route.name(), %error, "rejected a push request");
            return (StatusCode::BAD_REQUEST, Json(json!({ "error": error })));
        }
    };
    match shared.ingest.accept(route, incoming).await {
        Ok(outcome) => (StatusCode::OK, Json(json!({ "entry": outcome.id(), "outcome": format!("{outcome:?}") }))),
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": error.to_string() }))),
    }
}
