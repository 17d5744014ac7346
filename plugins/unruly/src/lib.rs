//! Test plugin whose answers are chosen by the payload, so tests can hand the host
//! every kind of output the rules must refuse (`src/rules.rs`). The payload is JSON:
//!
//! ```json
//! {"key": "k-1", "key_bytes": 65536, "dedup": "d-1", "dedup_bytes": 65536,
//!  "event_type": "unruly", "method": "POST", "path": "/events",
//!  "headers": [["x-a", "1"]], "next": {"method": "POST", "path": "/../x", "headers": []}}
//! ```
//!
//! Every field is optional. `ignore` makes `decode` answer "ignore" with that reason
//! (padded to `ignore_bytes`). `key` (default `k`) is the correlation key and `dedup`
//! the dedup key (none when absent); `key_bytes` / `dedup_bytes` pad them to that
//! many bytes with letters that do not compress (a fixed pseudo-random sequence, so
//! a database cannot squeeze a long key into an index row). `render` sends `method` (default `POST`) to `path` (default `/events`)
//! with `headers` and the payload as body. `classify` answers 2xx with `next`'s
//! request as a second step when there is one (and `done` after it), 5xx and
//! transport errors with `retry`, anything else with `park`. A payload that is not
//! such JSON is a decode error.

wit_bindgen::generate!({ path: "../../wit", world: "router" });

use exports::inlet::plugin::handler::{DecodeError, Decoded, Disposition, Event, Exchange, Message, Outcome, Request};
use inlet::plugin::types::NextStep;
use serde::Deserialize;

#[derive(Deserialize)]
struct Orders {
    #[serde(default = "default_key")]
    key: String,
    #[serde(default)]
    key_bytes: usize,
    dedup: Option<String>,
    #[serde(default)]
    dedup_bytes: usize,
    #[serde(default = "default_event_type")]
    event_type: String,
    ignore: Option<String>,
    #[serde(default)]
    ignore_bytes: usize,
    #[serde(flatten)]
    request: Shape,
    next: Option<Shape>,
}

/// How a request looks.
#[derive(Deserialize)]
struct Shape {
    #[serde(default = "default_method")]
    method: String,
    #[serde(default = "default_path")]
    path: String,
    #[serde(default)]
    headers: Vec<(String, String)>,
}

fn default_key() -> String {
    "k".into()
}

/// `text` padded to `bytes` with pseudo-random letters (xorshift, fixed seed).
fn padded(mut text: String, bytes: usize) -> String {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    while text.len() < bytes {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        text.push(char::from(b'a' + (state % 26) as u8));
    }
    text
}

fn default_event_type() -> String {
    "unruly".into()
}

fn default_method() -> String {
    "POST".into()
}

fn default_path() -> String {
    "/events".into()
}

fn orders(data: &[u8]) -> Result<Orders, String> {
    serde_json::from_slice(data).map_err(|e| format!("not unruly orders: {e}"))
}

fn request(shape: Shape, body: Vec<u8>) -> Request {
    Request { method: shape.method, path: shape.path, headers: shape.headers, body }
}

struct Plugin;

impl exports::inlet::plugin::handler::Guest for Plugin {
    fn decode(msg: Message) -> Result<Decoded, DecodeError> {
        let o = orders(&msg.data).map_err(|message| DecodeError { message })?;
        if let Some(reason) = o.ignore {
            return Ok(Decoded::Ignore(padded(reason, o.ignore_bytes)));
        }
        Ok(Decoded::Event(Event {
            event_type: o.event_type,
            correlation_key: padded(o.key, o.key_bytes),
            dedup_key: o.dedup.map(|d| padded(d, o.dedup_bytes)),
            body: msg.data,
            schema_version: None,
        }))
    }

    fn render(ev: Event) -> Result<Request, String> {
        let o = orders(&ev.body)?;
        Ok(request(o.request, ev.body))
    }

    fn classify(ev: Event, exchange: Exchange, outcome: Outcome) -> Disposition {
        let status = match outcome {
            Outcome::TransportError(_) => return Disposition::Retry(None),
            Outcome::Response(r) => r.status,
        };
        match status {
            200..=299 => match orders(&ev.body).ok().and_then(|o| o.next) {
                Some(next) if exchange.step == 1 => {
                    Disposition::Next(NextStep { request: request(next, ev.body), state: Vec::new() })
                }
                _ => Disposition::Done,
            },
            500..=599 => Disposition::Retry(None),
            status => Disposition::Park(format!("target answered {status}")),
        }
    }
}

export!(Plugin);
