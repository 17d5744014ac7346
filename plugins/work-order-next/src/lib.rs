//! The next version of the work-order plugin, for shadow-rollout tests and the plugin
//! benchmark: a route names it as its `candidate` beside `work-order`, and the shadow
//! compares their answers. It is `work-order` (the same decode, render body and
//! headers, and classify, copied here because guests are separate components) except
//! by work order id, the correlation key:
//!
//! - an id ending in `7` renders to `/engine-rest/v2/message`: with ids 0..N one
//!   message in ten differs, a known rate for the shadow to count;
//! - `sleep-…`: every call sleeps an hour, in a WASI poll that uses no fuel, so only
//!   the candidate's deadline can stop it;
//! - `trap-…`: every call panics;
//! - `hoard-…`: every call keeps 8 MiB more memory than the last, then answers as
//!   usual, so a candidate's memory can be seen held to its own budget.

wit_bindgen::generate!({ path: "../../wit", world: "router" });

use std::cell::RefCell;
use std::time::Duration;

use exports::inlet::plugin::handler::{DecodeError, Decoded, Disposition, Event, Exchange, Message, Outcome, Request};
use inlet::plugin::types::TransportErrorKind;
use serde::Deserialize;
use serde_json::json;

const MESSAGE_NAME: &str = "WorkOrderCompleted";

/// What each `hoard-` call adds to the memory kept.
const HOARD_STEP: usize = 8 << 20;

thread_local! {
    /// Memory `hoard-` ids keep between calls.
    static HOARD: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

struct Plugin;

impl exports::inlet::plugin::handler::Guest for Plugin {
    fn decode(msg: Message) -> Result<Decoded, DecodeError> {
        // The id is not decoded yet: read it from the payload. One that does not read
        // is left to decode, which says why.
        if let Some(id) = payload_id(&msg.data) {
            misbehave(&id);
        }
        work_order_event::decode!(msg)
    }

    fn render(ev: Event) -> Result<Request, String> {
        misbehave(&ev.correlation_key);
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
            path: message_path(&ev.correlation_key).into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: serde_json::to_vec(&body).expect("json serializes"),
        })
    }

    fn classify(ev: Event, _exchange: Exchange, outcome: Outcome) -> Disposition {
        misbehave(&ev.correlation_key);
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
                    Disposition::NotYet(message)
                } else if message.contains("executions match") || message.contains("to a single execution") {
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

/// The one difference in what this version sends: ids ending in `7` go to a new path.
fn message_path(id: &str) -> &'static str {
    if id.ends_with('7') { "/engine-rest/v2/message" } else { "/engine-rest/message" }
}

/// What the id asks of every call, before the call does its work.
fn misbehave(id: &str) {
    if id.starts_with("sleep-") {
        std::thread::sleep(Duration::from_secs(3600));
    } else if id.starts_with("trap-") {
        panic!("work-order-next traps on work order {id}, as its id asks");
    } else if id.starts_with("hoard-") {
        hoard();
    }
}

/// Grows the kept memory by one step, writing every byte so every page is really
/// taken (memory reserved but never touched would cost the host nothing).
fn hoard() {
    HOARD.with(|kept| {
        let mut kept = kept.borrow_mut();
        let grown = kept.len() + HOARD_STEP;
        kept.reserve_exact(HOARD_STEP);
        kept.resize(grown, 1);
    });
}

/// The work order id in a raw payload, when it has one.
fn payload_id(data: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Id {
        #[serde(rename = "workOrderId")]
        work_order_id: String,
    }
    serde_json::from_slice::<Id>(data).ok().map(|id| id.work_order_id)
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
