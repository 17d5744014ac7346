//! The {{name}} plugin for Inlet (contract {{contract}}).
//!
//! It reads `{"id": "...", "key": "...", ...}`, delivers the payload as JSON to
//! `POST /events` on the route's target, and classifies the answer: 2xx done; 408, 429
//! and 5xx retry (after `Retry-After` when given); any other answer parks the entry
//! for a person. Replace each function's body with what your event and target need,
//! then add a sample under `samples/` and run `./test.sh --update` to record it.

wit_bindgen::generate!({ path: "wit", world: "router" });

use exports::inlet::plugin::handler::{
    DecodeError, Decoded, Disposition, Event, Exchange, Guest, Message, Outcome, Request,
};
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

impl Guest for Plugin {
    /// Runs before the broker is acked: read the payload and pick the keys. An error
    /// parks the message with its raw bytes for a person.
    fn decode(msg: Message) -> Result<Decoded, DecodeError> {
        let envelope: Envelope = serde_json::from_slice(&msg.data)
            .map_err(|e| DecodeError { message: format!("cannot read the event: {e}") })?;
        if envelope.key.is_empty() {
            return Err(DecodeError { message: "the event has an empty key".into() });
        }
        Ok(Decoded::Event(Event {
            event_type: "{{name}}".into(),
            correlation_key: envelope.key,
            dedup_key: Some(envelope.id),
            // What `render` gets later: the payload as it came.
            body: msg.data,
            schema_version: None,
        }))
    }

    /// Shapes the request. The host adds the target's base URL, its configured headers,
    /// the `Idempotency-Key` (the dedup key) and the timeout.
    fn render(ev: Event) -> Result<Request, String> {
        Ok(Request {
            method: "POST".into(),
            path: "/events".into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: ev.body,
        })
    }

    /// Says what the answer means. Technical trouble: retry. A refusal that retrying
    /// cannot fix: park.
    fn classify(_ev: Event, _exchange: Exchange, outcome: Outcome) -> Disposition {
        match outcome {
            Outcome::TransportError(_) => Disposition::Retry(None),
            Outcome::Response(r) => match r.status {
                200..=299 => Disposition::Done,
                408 | 429 | 500..=599 => Disposition::Retry(retry_after_ms(&r.headers)),
                status => Disposition::Park(format!(
                    "target answered {status}: {}",
                    String::from_utf8_lossy(&r.body[..r.body.len().min(300)])
                )),
            },
        }
    }
}

/// A `Retry-After` header in whole seconds, as milliseconds.
fn retry_after_ms(headers: &[(String, String)]) -> Option<u64> {
    let (_, value) = headers.iter().find(|(name, _)| name.eq_ignore_ascii_case("retry-after"))?;
    let secs: u64 = value.trim().parse().ok()?;
    Some(secs.saturating_mul(1000))
}

export!(Plugin);
