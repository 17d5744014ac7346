//! A plugin that misbehaves on request, to prove the host survives its guests.
//!
//! `decode` reads the payload as a command; `render` and `classify` obey the event
//! body (the payload) the same way. A bare command applies to decode and render; a
//! command prefixed `decode:`, `render:` or `classify:` applies to that call only.
//!
//! - `panic`, `loop` (until the fuel runs out), `alloc` (1 GiB), `big` (a 100 MB
//!   event), `big9` (a 9 MiB event);
//! - `sleep` (an hour, in a WASI poll: uses no fuel);
//! - `spin:N` (N rounds of busy work, about 10 fuel each, then an ordinary event);
//! - `keep:N` (grow to N MiB and keep it between calls);
//! - `chatty` (1 KiB to stderr at every call), `chatty-panic:ID` (its ID to stderr,
//!   then a panic);
//! - `entropy` (an event whose body is what the plugin read of clocks and randomness);
//! - anything else decodes to an event keyed by the text before its first `:`.

wit_bindgen::generate!({ path: "../../wit", world: "router" });

use std::cell::RefCell;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant, SystemTime};

use exports::inlet::plugin::handler::{DecodeError, Decoded, Disposition, Event, Exchange, Message, Outcome, Request};

struct Plugin;

thread_local! {
    /// Memory `keep:N` holds between calls.
    static KEPT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The command in `payload` for `call`, if it is meant for that call.
fn command<'a>(call: &str, payload: &'a [u8]) -> Option<&'a str> {
    let text = std::str::from_utf8(payload).ok()?;
    match text.split_once(':') {
        Some((c, rest)) if ["decode", "render", "classify"].contains(&c) => (c == call).then_some(rest),
        _ if call == "classify" => None,
        _ => Some(text),
    }
}

fn misbehave(call: &str, payload: &[u8]) {
    let Some(cmd) = command(call, payload) else { return };
    let (verb, arg) = cmd.split_once(':').unwrap_or((cmd, ""));
    match verb {
        "panic" => panic!("hostile plugin panics as asked"),
        "loop" => {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        "alloc" => {
            let v = std::hint::black_box(vec![1u8; 1 << 30]);
            std::hint::black_box(&v);
        }
        "sleep" => std::thread::sleep(Duration::from_secs(3600)),
        "spin" => {
            let rounds: u64 = arg.parse().unwrap_or(0);
            let mut n: u64 = 0;
            for i in 0..rounds {
                n = std::hint::black_box(n.wrapping_mul(31).wrapping_add(i));
            }
        }
        "keep" => {
            let mib: usize = arg.parse().unwrap_or(0);
            KEPT.with(|k| {
                let mut k = k.borrow_mut();
                if k.len() < mib << 20 {
                    // Touch every page so the memory is really there.
                    k.resize(mib << 20, 1);
                }
            });
        }
        "chatty" => eprintln!("{}", "c".repeat(1023)),
        "chatty-panic" => {
            eprintln!("chatty-panic {arg} says goodbye");
            panic!("hostile plugin {arg} panics after writing to stderr");
        }
        _ => {}
    }
}

/// What the plugin can observe of time and randomness.
fn entropy() -> Vec<u8> {
    let wall = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let started = Instant::now();
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u8(1);
    format!("wall={wall} elapsed={:?} hash={}", started.elapsed(), h.finish()).into_bytes()
}

impl exports::inlet::plugin::handler::Guest for Plugin {
    fn decode(msg: Message) -> Result<Decoded, DecodeError> {
        misbehave("decode", &msg.data);
        let text = String::from_utf8_lossy(&msg.data).into_owned();
        let body = match msg.data.as_slice() {
            b"big" => vec![b'x'; 100 << 20],
            b"big9" => vec![b'x'; 9 << 20],
            b"entropy" => entropy(),
            _ => msg.data.clone(),
        };
        Ok(Decoded::Event(Event {
            event_type: "hostile".into(),
            correlation_key: text.split(':').next().unwrap_or_default().to_string(),
            dedup_key: None,
            body,
            schema_version: None,
        }))
    }

    fn render(ev: Event) -> Result<Request, String> {
        misbehave("render", &ev.body);
        Ok(Request { method: "POST".into(), path: "/hostile".into(), headers: vec![], body: ev.body })
    }

    fn classify(ev: Event, _exchange: Exchange, outcome: Outcome) -> Disposition {
        misbehave("classify", &ev.body);
        match outcome {
            Outcome::Response(r) if r.status < 300 => Disposition::Done,
            _ => Disposition::Retry(None),
        }
    }
}

export!(Plugin);
