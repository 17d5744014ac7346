//! A plugin to copy. It reads `{"id": "...", "key": "...", ...}`, delivers the payload
//! as JSON to `POST /events` on the route's target, and classifies HTTP answers the
//! usual way. Replace each function's body with what your event and target need;
//! PLUGINS.md explains the contract and the dispositions.
//!
//! Build: add the folder to `plugins/Cargo.toml`, run `scripts/build-plugins`.
//! Try:   `inlet plugin test plugins/dist/template.wasm --message sample.json --response answer.json`

wit_bindgen::generate!({ path: "../../wit", world: "router" });

use exports::inlet::plugin::handler::{DecodeError, Decoded, Disposition, Event, Exchange, Message, Outcome, Request};
use serde::Deserialize;

/// The fields the plugin needs; everything else in the payload is passed through.
#[derive(Deserialize)]
struct Envelope {
    /// The business id of the event: a redelivery carries the same one.
    id: String,
    /// What orders delivery: events with the same key go one at a time, in order.
    key: String,
}

struct Plugin;

impl exports::inlet::plugin::handler::Guest for Plugin {
    /// Runs before the broker is acked: read the payload and pick the keys. An error
    /// parks the message with its raw bytes for a person.
    fn decode(msg: Message) -> Result<Decoded, DecodeError> {
        let envelope: Envelope =
            serde_json::from_slice(&msg.data).map_err(|e| DecodeError { message: format!("not an event: {e}") })?;
        Ok(Decoded::Event(Event {
            event_type: "example".into(),
            correlation_key: envelope.key,
            dedup_key: Some(envelope.id),
            // What `render` gets later. Store the payload, or a normalized form of it.
            body: msg.data,
            schema_version: None,
        }))
    }

    /// Shapes the request. The host adds the base URL, the configured headers, the
    /// `Idempotency-Key` (the dedup key) and the timeout.
    fn render(ev: Event) -> Result<Request, String> {
        Ok(Request {
            method: "POST".into(),
            path: "/events".into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: ev.body,
        })
    }

    /// Says what the answer means. Technical trouble: retry. A refusal that retrying
    /// cannot fix: park. A target that is not ready for this event yet: not-yet.
    fn classify(_ev: Event, _exchange: Exchange, outcome: Outcome) -> Disposition {
        match outcome {
            Outcome::TransportError(_) => Disposition::Retry(None),
            Outcome::Response(r) => match r.status {
                200..=299 => Disposition::Done,
                408 | 429 | 500..=599 => Disposition::Retry(None),
                status => Disposition::Park(format!(
                    "target answered {status}: {}",
                    String::from_utf8_lossy(&r.body[..r.body.len().min(300)])
                )),
            },
        }
    }
}

export!(Plugin);
