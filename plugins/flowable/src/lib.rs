//! Flowable plugin: `work-order-completed` events delivered to a Flowable process
//! waiting in a message catch event, through Flowable's REST API.
//!
//! Flowable needs two calls, and the plugin does no I/O, so it describes them and the
//! host performs them as one exchange:
//! 1. `POST /flowable-rest/service/query/executions` — executions subscribed to the
//!    message whose process has `workOrderId` = the key.
//! 2. `PUT /flowable-rest/service/runtime/executions/{id}` with
//!    `action = messageEventReceived` — only when exactly one was found.
//!
//! None waiting → not-yet; more than one → park (retrying can never pick one); the
//! execution gone between query and trigger → park.

wit_bindgen::generate!({ path: "../../wit", world: "router" });

use exports::inlet::plugin::handler::{DecodeError, Decoded, Disposition, Event, Exchange, Message, Outcome, Request};
use inlet::plugin::types::{NextStep, Response};
use serde::Deserialize;
use serde_json::json;

const MESSAGE_NAME: &str = "WorkOrderCompleted";
const BASE: &str = "/flowable-rest/service";


#[derive(Deserialize)]
struct ExecutionPage {
    data: Vec<Execution>,
}

#[derive(Deserialize)]
struct Execution {
    id: String,
}

struct Plugin;

fn json_request(method: &str, path: String, body: serde_json::Value) -> Request {
    Request {
        method: method.into(),
        path,
        headers: vec![("content-type".into(), "application/json".into())],
        body: serde_json::to_vec(&body).expect("json serializes"),
    }
}

fn order(ev: &Event) -> Result<work_order_event::WorkOrderCompleted, String> {
    work_order_event::from_body(&ev.body)
}

/// Flowable errors come as `{"message": "...", "exception": "..."}`.
fn error_text(r: &Response) -> String {
    #[derive(Deserialize)]
    struct FlowableError {
        #[serde(default)]
        message: String,
        #[serde(default)]
        exception: String,
    }
    match serde_json::from_slice::<FlowableError>(&r.body) {
        Ok(e) if !e.exception.is_empty() => e.exception,
        Ok(e) => e.message,
        Err(_) => String::from_utf8_lossy(&r.body[..r.body.len().min(300)]).into_owned(),
    }
}

impl exports::inlet::plugin::handler::Guest for Plugin {
    fn decode(msg: Message) -> Result<Decoded, DecodeError> {
        work_order_event::decode!(msg)
    }

    fn render(ev: Event) -> Result<Request, String> {
        let order = order(&ev)?;
        Ok(json_request(
            "POST",
            format!("{BASE}/query/executions"),
            json!({
                "messageEventSubscriptionName": MESSAGE_NAME,
                "processInstanceVariables": [
                    { "name": "workOrderId", "value": order.work_order_id, "operation": "equals", "type": "string" }
                ]
            }),
        ))
    }

    fn classify(ev: Event, exchange: Exchange, outcome: Outcome) -> Disposition {
        let response = match outcome {
            Outcome::Response(r) => r,
            Outcome::TransportError(_) => return Disposition::Retry(None),
        };
        if response.status >= 500 && exchange.step == 2 && error_text(&response).contains("does not have a subscription") {
            return Disposition::Park(format!("the execution no longer waits for {MESSAGE_NAME}: {}", error_text(&response)));
        }
        match response.status {
            500..=599 | 429 => return Disposition::Retry(None),
            200..=299 => {}
            404 if exchange.step == 2 => {
                return Disposition::Park("the execution found by the query is gone (moved on or deleted)".into());
            }
            status => return Disposition::Park(format!("flowable answered {status}: {}", error_text(&response))),
        }
        if exchange.step >= 2 {
            return Disposition::Done;
        }
        let page: ExecutionPage = match serde_json::from_slice(&response.body) {
            Ok(p) => p,
            // A 2xx that is not an execution page (a proxy's page, say): try again later.
            Err(_) => return Disposition::Retry(None),
        };
        let key = &ev.correlation_key;
        match page.data.as_slice() {
            [] => Disposition::NotYet(format!("no execution waits for {MESSAGE_NAME} with workOrderId={key}")),
            [one] => {
                let order = match order(&ev) {
                    Ok(o) => o,
                    Err(e) => return Disposition::Park(e),
                };
                let trigger = json_request(
                    "PUT",
                    format!("{BASE}/runtime/executions/{}", one.id),
                    json!({
                        "action": "messageEventReceived",
                        "messageName": MESSAGE_NAME,
                        "variables": [
                            { "name": "completedItems", "value": order.completed_items, "type": "integer" },
                            { "name": "completionTimestamp", "value": order.completion_timestamp, "type": "string" }
                        ]
                    }),
                );
                Disposition::Next(NextStep { request: trigger, state: one.id.clone().into_bytes() })
            }
            many => Disposition::Park(format!(
                "{} executions wait for {MESSAGE_NAME} with workOrderId={key}; retrying cannot pick one",
                many.len()
            )),
        }
    }
}

export!(Plugin);
