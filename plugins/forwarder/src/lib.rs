//! Forwarder plugin: message translation as a route. Legacy work-order events
//! (`{"wo": "4711", "items": "3", "closedAt": "2026-08-01T10:00:00Z", "eventId": "…"}`,
//! numbers as strings, short names) are normalized into the canonical
//! `work-order-completed` event and published to a Pub/Sub topic through its REST API
//! (`POST …/topics/T:publish`), with the work order as ordering key.
//!
//! The route's target URL is the topic's publish URL, e.g.
//! `https://pubsub.googleapis.com/v1/projects/P/topics/T:publish`; the plugin renders
//! an empty path so the host sends to it as is.

wit_bindgen::generate!({ path: "../../wit", world: "router" });

use exports::inlet::plugin::handler::{DecodeError, Decoded, Disposition, Event, Exchange, Message, Outcome, Request};
use serde::Deserialize;
use serde_json::json;
use work_order_event::WorkOrderCompleted;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Legacy {
    wo: String,
    items: String,
    closed_at: String,
    #[serde(default)]
    event_id: Option<String>,
}

struct Plugin;

impl exports::inlet::plugin::handler::Guest for Plugin {
    fn decode(msg: Message) -> Result<Decoded, DecodeError> {
        let bad = |message: String| DecodeError { message };
        let legacy: Legacy =
            serde_json::from_slice(&msg.data).map_err(|e| bad(format!("payload is not a legacy work-order event: {e}")))?;
        let completed_items = legacy.items.trim().parse::<u32>().map_err(|e| bad(format!("items `{}`: {e}", legacy.items)))?;
        let canonical = WorkOrderCompleted {
            work_order_id: legacy.wo.trim().to_string(),
            completed_items,
            completion_timestamp: legacy.closed_at,
            event_id: legacy.event_id.clone(),
        };
        if canonical.work_order_id.is_empty() {
            return Err(bad("wo is empty".into()));
        }
        Ok(Decoded::Event(Event {
            event_type: work_order_event::EVENT_TYPE.into(),
            correlation_key: canonical.work_order_id.clone(),
            dedup_key: legacy.event_id,
            body: serde_json::to_vec(&canonical).expect("the canonical event serializes"),
            schema_version: Some("1".into()),
        }))
    }

    fn render(ev: Event) -> Result<Request, String> {
        let body = json!({
            "messages": [{
                "data": base64(&ev.body),
                "attributes": {
                    "eventType": ev.event_type,
                    "eventId": ev.dedup_key.clone().unwrap_or_default(),
                    "schemaVersion": ev.schema_version.clone().unwrap_or_default()
                },
                "orderingKey": ev.correlation_key
            }]
        });
        Ok(Request {
            method: "POST".into(),
            path: String::new(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: serde_json::to_vec(&body).expect("json serializes"),
        })
    }

    fn classify(_ev: Event, _exchange: Exchange, outcome: Outcome) -> Disposition {
        let r = match outcome {
            Outcome::TransportError(_) => return Disposition::Retry(None),
            Outcome::Response(r) => r,
        };
        let text = || String::from_utf8_lossy(&r.body[..r.body.len().min(300)]).into_owned();
        match r.status {
            200..=299 => Disposition::Done,
            404 => Disposition::Park(format!("the topic does not exist: {}", text())),
            408 | 429 | 500..=599 => Disposition::Retry(None),
            status => Disposition::Park(format!("pub/sub refused the publish ({status}): {}", text())),
        }
    }
}

/// Standard base64 with padding, as Pub/Sub's JSON API wants `data`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16) | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8) | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

export!(Plugin);
