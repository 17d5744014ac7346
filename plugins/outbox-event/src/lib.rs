//! Outbox plugin: an application's outbox row, published as it is. For a route whose
//! source is an outbox table (`source = { kind = "outbox", … }`) and whose target is a
//! Pub/Sub topic with `ordering_key = true`.
//!
//! The host hands each row over as a message: the payload as data, and the
//! attributes `outbox_id`, `event_type`, `created_at` and `ordering_key` (the
//! aggregate). The host makes the aggregate the correlation key and the row id the
//! dedup key, so this plugin leaves both empty; a team that reshapes its events
//! starts from this file.
//!
//! The published message is the payload, with the event type as attribute
//! `event_type` (the host adds `outbox_id` and `idempotency_key`, and the aggregate
//! as ordering key). Pub/Sub's refusal of a message (400: the topic's schema does
//! not take it, say) parks the row with the reason; a route with
//! `parked = "block-key"` (the default) then holds back that aggregate's later rows
//! until someone requeues it, while other aggregates go on.

wit_bindgen::generate!({ path: "../../wit", world: "router" });

use exports::inlet::plugin::handler::{DecodeError, Decoded, Disposition, Event, Exchange, Message, Outcome, Request};

struct Plugin;

fn attribute<'a>(msg: &'a Message, name: &str) -> Option<&'a str> {
    msg.attributes.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

impl exports::inlet::plugin::handler::Guest for Plugin {
    fn decode(msg: Message) -> Result<Decoded, DecodeError> {
        if attribute(&msg, "outbox_id").is_none() {
            return Err(DecodeError { message: "not an outbox row: no outbox_id attribute".into() });
        }
        let event_type = attribute(&msg, "event_type").filter(|t| !t.is_empty()).unwrap_or("outbox-event");
        Ok(Decoded::Event(Event {
            event_type: event_type.to_string(),
            correlation_key: String::new(),
            dedup_key: None,
            body: msg.data,
            schema_version: None,
        }))
    }

    fn render(ev: Event) -> Result<Request, String> {
        Ok(Request {
            method: "POST".into(),
            path: String::new(),
            headers: vec![("event_type".into(), ev.event_type)],
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
            status => Disposition::Park(format!("pub/sub refused the event ({status}): {}", text())),
        }
    }
}

export!(Plugin);
