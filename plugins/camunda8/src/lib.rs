//! Camunda 8 plugin: `work-order-completed` events published as Zeebe messages through
//! the Orchestration Cluster REST API (`POST /v2/messages/publication`).
//!
//! Unlike Camunda 7, Zeebe buffers a published message for its time-to-live and
//! correlates it when a process reaches the catch event, so there is no "not yet":
//! the engine does the waiting. The dedup key travels as `messageId`, which Zeebe
//! uses to refuse a second publication within the time-to-live — a redelivery after a
//! lost answer is therefore answered 409 and counts as done.

wit_bindgen::generate!({ path: "../../wit", world: "router" });

use exports::inlet::plugin::handler::{DecodeError, Decoded, Disposition, Event, Exchange, Message, Outcome, Request};
use serde::Deserialize;
use serde_json::json;

const MESSAGE_NAME: &str = "WorkOrderCompleted";
/// How long Zeebe keeps the message for a process that has not reached the catch event.
const TIME_TO_LIVE_MS: u64 = 60 * 60 * 1000;

struct Plugin;

/// Zeebe REST errors are RFC 9457 problem documents.
#[derive(Deserialize, Default)]
struct Problem {
    #[serde(default)]
    title: String,
    #[serde(default)]
    detail: String,
}

impl exports::inlet::plugin::handler::Guest for Plugin {
    fn decode(msg: Message) -> Result<Decoded, DecodeError> {
        work_order_event::decode!(msg)
    }

    fn render(ev: Event) -> Result<Request, String> {
        let order = work_order_event::from_body(&ev.body)?;
        let message_id = ev.dedup_key.clone().ok_or("the host always passes the dedup key to render")?;
        let body = json!({
            "name": MESSAGE_NAME,
            "correlationKey": order.work_order_id,
            "timeToLive": TIME_TO_LIVE_MS,
            "messageId": message_id,
            "variables": {
                "completedItems": order.completed_items,
                "completionTimestamp": order.completion_timestamp
            }
        });
        Ok(Request {
            method: "POST".into(),
            path: "/v2/messages/publication".into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: serde_json::to_vec(&body).expect("json serializes"),
        })
    }

    fn classify(_ev: Event, _exchange: Exchange, outcome: Outcome) -> Disposition {
        let response = match outcome {
            Outcome::Response(r) => r,
            Outcome::TransportError(_) => return Disposition::Retry(None),
        };
        let problem: Problem = serde_json::from_slice(&response.body).unwrap_or_default();
        let text = format!("{} {}", problem.title, problem.detail).trim().to_string();
        match response.status {
            200..=299 => Disposition::Done,
            // Published before (same messageId within the time-to-live): a redelivery.
            409 => Disposition::Done,
            429 | 500..=599 => Disposition::Retry(None),
            status => Disposition::Park(format!("camunda 8 refused the message ({status}): {text}")),
        }
    }
}

export!(Plugin);
