//! Forwarder plugin: message translation as a route. Legacy work-order events
//! (`{"wo": "4711", "items": "3", "closedAt": "2026-08-01T10:00:00Z", "eventId": "…"}`,
//! numbers as strings, short names) are normalized into the canonical
//! `work-order-completed` event, for a route whose target is a Pub/Sub topic
//! (`target = { kind = "pubsub", topic = "projects/P/topics/T", ordering_key = true }`).
//!
//! The rendered body is the canonical event (the message data); the rendered headers
//! become message attributes; the host adds the work order (the correlation key) as
//! ordering key when the route asks for it. The Pub/Sub target answers like HTTP:
//! 200 with the message id, or the HTTP status of the service's error code.

wit_bindgen::generate!({ path: "../../wit", world: "router" });

use exports::inlet::plugin::handler::{DecodeError, Decoded, Disposition, Event, Exchange, Message, Outcome, Request};
use serde::Deserialize;
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
        let legacy: Legacy = serde_json::from_slice(&msg.data)
            .map_err(|e| bad(format!("payload is not a legacy work-order event: {e}")))?;
        let completed_items =
            legacy.items.trim().parse::<u32>().map_err(|e| bad(format!("items `{}`: {e}", legacy.items)))?;
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
        Ok(Request {
            method: "POST".into(),
            path: String::new(),
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("eventType".into(), ev.event_type),
                ("eventId".into(), ev.dedup_key.unwrap_or_default()),
                ("schemaVersion".into(), ev.schema_version.unwrap_or_default()),
            ],
            body: ev.body,
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

export!(Plugin);
