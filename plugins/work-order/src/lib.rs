//! Work-order plugin: `work-order-completed` events from the maintenance system,
//! correlated into a Camunda 7 process waiting in a message catch event.
//!
//! Payload: `{"workOrderId":"4711","completedItems":3,"completionTimestamp":"2026-08-01T10:00:00Z"}`
//! (optionally with `"eventId"`, or an `eventId` attribute, as the business dedup key).

wit_bindgen::generate!({ path: "../../wit", world: "router" });

use exports::inlet::plugin::handler::{DecodeError, Decoded, Disposition, Event, Exchange, Message, Outcome, Request};
use inlet::plugin::types::TransportErrorKind;
use serde::Deserialize;
use serde_json::json;

const MESSAGE_NAME: &str = "WorkOrderCompleted";


struct Plugin;

impl exports::inlet::plugin::handler::Guest for Plugin {
    fn decode(msg: Message) -> Result<Decoded, DecodeError> {
        work_order_event::decode!(msg)
    }

    fn render(ev: Event) -> Result<Request, String> {
        let order = work_order_event::from_body(&ev.body)?;
        let body = json!({
            "messageName": MESSAGE_NAME,
            "correlationKeys": {
                "workOrderId": { "value": order.work_order_id, "type": "String" }
            },
            "processVariables": {
                "completedItems": { "value": order.completed_items, "type": "Integer" },
                "completionTimestamp": { "value": order.completion_timestamp, "type": "String" }
            },
            "resultEnabled": false
        });
        Ok(Request {
            method: "POST".into(),
            path: "/engine-rest/message".into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: serde_json::to_vec(&body).expect("json serializes"),
        })
    }

    fn classify(_ev: Event, _exchange: Exchange, outcome: Outcome) -> Disposition {
        let response = match outcome {
            Outcome::Response(r) => r,
            Outcome::TransportError(e) => {
                return match e.kind {
                    TransportErrorKind::Timeout | TransportErrorKind::Connect | TransportErrorKind::Other => {
                        Disposition::Retry(None)
                    }
                };
            }
        };
        match response.status {
            200..=299 => Disposition::Done,
            400 => {
                let message = rest_exception_message(&response.body);
                if message.contains("No process definition or execution matches") {
                    // The process has not reached the catch event yet, or already left it.
                    Disposition::NotYet(message)
                } else if message.contains("executions match") || message.contains("to a single execution") {
                    // More than one waiting instance: retrying can never pick one.
                    Disposition::Park(message)
                } else {
                    Disposition::Park(format!("camunda refused the message: {message}"))
                }
            }
            429 => Disposition::Retry(retry_after_ms(&response.headers)),
            401..=499 => Disposition::Park(format!(
                "camunda answered {}: {}",
                response.status,
                rest_exception_message(&response.body)
            )),
            _ => Disposition::Retry(retry_after_ms(&response.headers)),
        }
    }
}

/// Camunda 7 answers errors as `{"type":"RestException","message":"..."}`.
fn rest_exception_message(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct RestException {
        message: String,
    }
    match serde_json::from_slice::<RestException>(body) {
        Ok(e) => e.message,
        Err(_) => String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
    }
}

fn retry_after_ms(headers: &[(String, String)]) -> Option<u64> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("retry-after"))
        .and_then(|(_, v)| v.trim().parse::<u64>().ok())
        .map(|secs| secs.saturating_mul(1000))
}

export!(Plugin);
